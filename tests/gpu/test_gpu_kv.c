/* test_gpu_kv.c - the KV pool's ops of the backend table on the "cuda"
 * backend against the "cpu" backend: kv_store, attention and kv_copy_block,
 * for pools of f32, f16, bf16, fp8 e4m3 and i8, head_dim 128 (GQA 4), 64
 * (GQA 3) and 36 (GQA 2), blocks of 16 (test_gpu_ops.c says how cases run; README.md beside
 * this file why the tolerances are these):
 *
 *   kv_store   into pools filled with 0xff: f32/f16/bf16 the same bytes;
 *              fp8/i8 each row's scale equal, its codes within one step,
 *              under 1% of rows differing at all
 *   attention  on the same pool bytes on both sides, per sequence, over that
 *              sequence's largest |out|: f32 pool 1e-4, other pools 2e-3;
 *              a draft tree (backend.h: kvp_attn_args.parent) the same way
 *   kv_copy_block  exact
 *
 * Skips with one line when this build or machine has no CUDA backend. */
#include "gpu_util.h"
#include "kvscale.h"
#include "tensor.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { CPU = 0, GPU = 1 };
static kvp_backend *be[2];
static uint64_t rng = 0x9fb21c651e98df25ull;
static float frand(void) { return unit_frand(&rng); } /* uniform in [-1, 1) */

static size_t kv_elt_bytes(int dtype) { return dtype == KVP_DTYPE_F32 ? 4 : dtype == KVP_DTYPE_F16 || dtype == KVP_DTYPE_BF16 ? 2 : 1; }

/* A pool description as kvcache.c makes one (backend.h's layout). */
static kvp_kv_pool pool_desc(int dtype, uint32_t n_blocks, uint32_t bs, uint32_t n_layer, uint32_t n_kv, uint32_t hd)
{
    kvp_kv_pool p = {.dtype = dtype, .n_blocks = n_blocks, .block_size = bs, .n_layer = n_layer, .n_head_kv = n_kv,
                     .head_dim = hd};
    uint64_t rows = (uint64_t)n_layer * 2 * n_kv * bs;
    p.block_bytes = rows * hd * kv_elt_bytes(dtype);
    if (kvp_kvscale_dtype(dtype)) {
        p.scales_off = p.block_bytes;
        p.block_bytes += rows * 4;
    }
    return p;
}

/* got against ref, two images of pool p: f32/f16/bf16 the same bytes; a
 * scaled cache row by row, each row's scale the same (to 1e-6) and its
 * values within one step of that scale (fp8: an eighth of the value), with
 * under 1% of rows differing at all. */
static void expect_pool(const char *what, const kvp_kv_pool *p, const uint8_t *got, const uint8_t *ref)
{
    size_t total = (size_t)p->n_blocks * p->block_bytes;
    if (!kvp_kvscale_dtype(p->dtype)) {
        size_t diff = 0, first = 0;
        for (size_t i = 0; i < total; i++)
            if (got[i] != ref[i] && !diff++)
                first = i;
        CHECK_MSG(diff == 0, "%s: %zu of %zu bytes differ, first at %zu", what, diff, total, first);
        if (!diff)
            printf("ok %s: the same %zu bytes\n", what, total);
        return;
    }
    uint32_t hd = p->head_dim;
    uint64_t rows = (uint64_t)p->n_layer * 2 * p->n_head_kv * p->block_size;
    size_t n_rows = 0, n_diff = 0, n_far = 0;
    float a[1024], b[1024];
    for (uint32_t blk = 0; blk < p->n_blocks && hd <= 1024; blk++) {
        const uint8_t *g0 = got + (size_t)blk * p->block_bytes, *r0 = ref + (size_t)blk * p->block_bytes;
        for (uint64_t r = 0; r < rows; r++, n_rows++) {
            const uint8_t *gq = g0 + r * hd, *rq = r0 + r * hd;
            float gs, rs;
            memcpy(&gs, g0 + p->scales_off + r * 4, 4);
            memcpy(&rs, r0 + p->scales_off + r * 4, 4);
            if (memcmp(gq, rq, hd) == 0 && memcmp(&gs, &rs, 4) == 0)
                continue;
            n_diff++;
            if (!(fabsf(gs - rs) <= 1e-6f * fabsf(rs))) {
                n_far++;
                continue;
            }
            kvp_kvscale_decode(p->dtype, gq, gs, a, hd);
            kvp_kvscale_decode(p->dtype, rq, rs, b, hd);
            for (uint32_t i = 0; i < hd; i++) {
                float step = p->dtype == KVP_DTYPE_I8 ? rs * 1.0001f : fmaxf(fabsf(a[i]), fabsf(b[i])) / 8 + rs / 256;
                if (!(fabsf(a[i] - b[i]) <= step)) {
                    n_far++;
                    break;
                }
            }
        }
    }
    CHECK_MSG(n_far == 0 && n_diff * 100 <= n_rows,
              "%s: %zu of %zu rows differ, %zu of them by more than one step or in their scale", what, n_diff, n_rows,
              n_far);
    if (n_far == 0 && n_diff * 100 <= n_rows)
        printf("ok %s: %zu of %zu rows differ, each by one step at most\n", what, n_diff, n_rows);
}

/* kv_store of the given slots of one layer on b (k, v host [n][n_kv * hd]). */
static int run_kv_store(kvp_backend *b, const kvp_kv_pool *p, uint32_t layer, const float *k, const float *v,
                        const uint32_t *slots, uint32_t n)
{
    kvp_err err = {0};
    size_t row = (size_t)p->n_head_kv * p->head_dim;
    float *dk = gpu_put(b, k, sizeof(float) * n * row), *dv = gpu_put(b, v, sizeof(float) * n * row);
    uint32_t *ds = gpu_put(b, slots, sizeof(uint32_t) * n);
    int rc = dk && dv && ds ? gpu_op(b, "kv_store", b->ops->kv_store(b, p, layer, dk, dv, n, ds, &err), &err) : -1;
    gpu_free(b, dk), gpu_free(b, dv), gpu_free(b, ds);
    return rc;
}

/* One attention call's inputs (host). */
typedef struct att_in {
    uint32_t n_tok, n_head, n_seq, stride, max_ctx;
    const float *q;
    const int32_t *pos;
    const uint32_t *seq, *tables;
    const int32_t *parent, *kv_pos; /* a draft tree, or NULL */
} att_in;

static int run_attention(kvp_backend *b, const kvp_kv_pool *p, const att_in *in, float *out)
{
    kvp_err err = {0};
    size_t n = (size_t)in->n_tok * in->n_head * p->head_dim;
    float *dq = gpu_put(b, in->q, sizeof(float) * n), *dout = gpu_nan(b, n);
    int32_t *dp = gpu_put(b, in->pos, sizeof(int32_t) * in->n_tok);
    uint32_t *ds = gpu_put(b, in->seq, sizeof(uint32_t) * in->n_tok);
    uint32_t *dt = gpu_put(b, in->tables, sizeof(uint32_t) * in->n_seq * in->stride);
    int32_t *dpa = in->parent ? gpu_put(b, in->parent, sizeof(int32_t) * in->n_tok) : NULL;
    int32_t *dkp = in->parent ? gpu_put(b, in->kv_pos, sizeof(int32_t) * in->n_tok) : NULL;
    int rc = -1;
    if (dq && dout && dp && ds && dt && (!in->parent || (dpa && dkp))) {
        kvp_attn_args a = {.q = dq, .out = dout, .n_tok = in->n_tok, .n_head = in->n_head, .layer = 1,
                           .scale = 1.0f / sqrtf((float)p->head_dim), .pos = dp, .tok_seq = ds, .tables = dt,
                           .n_seq = in->n_seq, .table_stride = in->stride, .host_pos = in->pos,
                           .host_tok_seq = in->seq, .max_ctx = in->max_ctx, .kv = p, .parent = dpa,
                           .kv_pos = dkp, .host_parent = in->parent, .host_kv_pos = in->kv_pos};
        rc = gpu_op(b, "attention", b->ops->attention(b, &a, &err), &err);
    }
    if (rc == 0)
        rc = gpu_get(b, out, dout, sizeof(float) * n, "attention");
    gpu_free(b, dq), gpu_free(b, dout), gpu_free(b, dp), gpu_free(b, ds), gpu_free(b, dt);
    gpu_free(b, dpa), gpu_free(b, dkp);
    return rc;
}

/* Each sequence's rows of out compared alone: a long context's output is
 * an average of many values, far smaller than a one-key sequence's. */
static void expect_attention(const char *what, const att_in *in, uint32_t hd, const float *got, const float *ref,
                             double tol)
{
    size_t row = (size_t)in->n_head * hd;
    for (uint32_t t0 = 0; t0 < in->n_tok;) {
        uint32_t t1 = t0;
        while (t1 < in->n_tok && in->seq[t1] == in->seq[t0])
            t1++;
        gpu_diff d;
        char w[192];
        gpu_diff_f32(&d, got + t0 * row, ref + t0 * row, (t1 - t0) * row);
        snprintf(w, sizeof w, "%s: sequence %u, %u token%s at %d..%d", what, in->seq[t0], t1 - t0, t1 - t0 > 1 ? "s" : "",
                 in->pos[t0], in->pos[t1 - 1]);
        gpu_expect(w, &d, tol);
        t0 = t1;
    }
}

/* One pool dtype and head shape: kv_store into poisoned pools, then the
 * same pool bytes on both sides for attention (mixed prompt chunk and
 * decode tokens, then decode only) and kv_copy_block. */
static void test_pool(int dtype, uint32_t hd, uint32_t n_kv, uint32_t rep)
{
    enum { BS = 16, NB = 400, NL = 2, CHUNK = 96 };
    kvp_kv_pool p[2];
    uint8_t *img[2] = {NULL, NULL};
    char what[128];
    const char *dn = kvp_dtype_name((uint32_t)dtype);
    uint32_t n_head = n_kv * rep, row = n_kv * hd;
    kvp_err err = {0};
    if (!be[GPU]->ops->supports(be[GPU], KVP_USE_KV, dtype, kvp_kvscale_dtype(dtype))) {
        CHECK_MSG(dtype != KVP_DTYPE_F16 && dtype != KVP_DTYPE_BF16, "the cuda backend does not support a %s KV pool", dn);
        printf("note: the cuda backend does not support a %s KV pool; not compared\n", dn);
        return;
    }
    for (int k = 0; k < 2; k++) {
        p[k] = pool_desc(dtype, NB, BS, NL, n_kv, hd);
        kvp_backend_reserve r = {.max_tok = 128, .max_ctx = 8192, .max_n_in = 4096, .n_head = n_head, .kv = &p[k]};
        if (gpu_op(be[k], "reserve", be[k]->ops->reserve(be[k], &r, &err), &err) < 0)
            return;
    }
    size_t bytes = (size_t)NB * p[0].block_bytes, nslot = (size_t)NB * BS;
    float *kv = malloc(sizeof(float) * 2 * CHUNK * row);
    uint32_t *slots = malloc(sizeof(uint32_t) * nslot);
    img[0] = malloc(bytes), img[1] = malloc(bytes);
    p[0].base = be[0]->ops->alloc(be[0], bytes);
    p[1].base = be[1]->ops->alloc(be[1], bytes);
    if (!kv || !slots || !img[0] || !img[1] || !p[0].base || !p[1].base) {
        CHECK_MSG(0, "%s pool of %zu bytes: out of memory", dn, bytes);
        goto out;
    }
    /* kv_store: 37 scattered slots of layer 1, 5 of layer 0, into pools
     * filled with 0xff (NaN in every float type) */
    memset(img[0], 0xff, bytes);
    for (size_t i = 0; i < nslot; i++)
        slots[i] = (uint32_t)i;
    for (size_t i = nslot - 1; i > 0; i--) { /* a random permutation of the slots */
        size_t j = (size_t)((frand() + 1) / 2 * (double)(i + 1)) % (i + 1);
        uint32_t s = slots[i];
        slots[i] = slots[j], slots[j] = s;
    }
    for (size_t i = 0; i < 2 * CHUNK * row; i++)
        kv[i] = frand() * (i % 5 == 0 ? 3 : 1);
    int rc = 0;
    for (int k = 0; k < 2 && rc == 0; k++) {
        rc = gpu_op(be[k], "from_host", be[k]->ops->from_host(be[k], p[k].base, img[0], bytes, &err), &err);
        if (rc == 0)
            rc = run_kv_store(be[k], &p[k], 1, kv, kv + CHUNK * row, slots, 37);
        if (rc == 0)
            rc = run_kv_store(be[k], &p[k], 0, kv + 37 * row, kv + (CHUNK + 37) * row, slots + 37, 5);
        if (rc == 0)
            rc = gpu_get(be[k], img[k], p[k].base, bytes, "kv pool");
    }
    snprintf(what, sizeof what, "kv_store %s head_dim %u kv heads %u", dn, hd, n_kv);
    if (rc == 0)
        expect_pool(what, &p[0], img[GPU], img[CPU]);
    /* every slot of both layers through the CPU, then those bytes on both */
    for (uint32_t l = 0; l < NL && rc == 0; l++)
        for (size_t s = 0; s < nslot && rc == 0; s += CHUNK) {
            uint32_t n = (uint32_t)(nslot - s < CHUNK ? nslot - s : CHUNK);
            for (size_t i = 0; i < 2 * CHUNK * row; i++)
                kv[i] = frand();
            rc = run_kv_store(be[CPU], &p[CPU], l, kv, kv + CHUNK * row, slots + s, n);
        }
    if (rc == 0 && gpu_get(be[CPU], img[CPU], p[CPU].base, bytes, "kv pool") == 0)
        rc = gpu_op(be[GPU], "from_host", be[GPU]->ops->from_host(be[GPU], p[GPU].base, img[CPU], bytes, &err), &err);
    else
        rc = -1;
    /* attention: s0 one token at 4999 (split-K), s1 a chunk 24..63, s2 one
     * token at 0, s3 one token at 700; block tables from the shuffled slots */
    enum { NSEQ = 4, STRIDE = 313 };
    static const int32_t first[NSEQ] = {4999, 24, 0, 700}, last[NSEQ] = {4999, 63, 0, 700};
    /* distinct blocks in a shuffled order; unused entries 0 (a block
     * like any other: the decode call below reads s1's position 64 there) */
    uint32_t tables[NSEQ * STRIDE], used = 0;
    uint32_t *perm = malloc(sizeof(uint32_t) * NB);
    if (!perm) {
        CHECK(0);
        goto out;
    }
    for (uint32_t i = 0; i < NB; i++)
        perm[i] = i;
    for (uint32_t i = NB - 1; i > 0; i--) {
        uint32_t j = (uint32_t)((frand() + 1) / 2 * (i + 1)) % (i + 1), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    used = 0;
    for (int s = 0; s < NSEQ; s++)
        for (uint32_t i = 0; i < STRIDE; i++)
            tables[s * STRIDE + i] = i <= (uint32_t)last[s] / BS ? perm[used++] : 0;
    free(perm);
    int32_t pos[64];
    uint32_t seq[64], n_tok = 0, max_ctx = 0;
    for (uint32_t s = 0; s < NSEQ; s++)
        for (int32_t q = first[s]; q <= last[s]; q++) {
            pos[n_tok] = q, seq[n_tok++] = s;
            max_ctx = (uint32_t)q + 1 > max_ctx ? (uint32_t)q + 1 : max_ctx;
        }
    size_t qn = (size_t)n_tok * n_head * hd;
    float *q = malloc(sizeof(float) * qn), *out[2] = {malloc(sizeof(float) * qn), malloc(sizeof(float) * qn)};
    if (!q || !out[0] || !out[1]) {
        CHECK(0);
        rc = -1;
    }
    for (size_t i = 0; rc == 0 && i < qn; i++)
        q[i] = 3 * frand(); /* a sharper softmax than uniform */
    double tol = dtype == KVP_DTYPE_F32 ? 1e-4 : 2e-3;
    att_in mixed = {.n_tok = n_tok, .n_head = n_head, .n_seq = NSEQ, .stride = STRIDE, .max_ctx = max_ctx, .q = q,
                    .pos = pos, .seq = seq, .tables = tables};
    snprintf(what, sizeof what, "attention %s head_dim %u heads %u/%u", dn, hd, n_head, n_kv);
    if (rc == 0 && run_attention(be[CPU], &p[CPU], &mixed, out[CPU]) == 0 &&
        run_attention(be[GPU], &p[GPU], &mixed, out[GPU]) == 0)
        expect_attention(what, &mixed, hd, out[GPU], out[CPU], tol);
    /* decode only: s0, s1's next token, s3: one token each */
    int32_t dpos[3] = {4999, 64, 700};
    uint32_t dseq[3] = {0, 1, 3};
    att_in dec = {.n_tok = 3, .n_head = n_head, .n_seq = NSEQ, .stride = STRIDE, .max_ctx = 5000, .q = q,
                  .pos = dpos, .seq = dseq, .tables = tables};
    snprintf(what, sizeof what, "decode attention %s head_dim %u heads %u/%u", dn, hd, n_head, n_kv);
    if (rc == 0 && run_attention(be[CPU], &p[CPU], &dec, out[CPU]) == 0 &&
        run_attention(be[GPU], &p[GPU], &dec, out[GPU]) == 0)
        expect_attention(what, &dec, hd, out[GPU], out[CPU], tol);
    /* a draft tree on s1 after its 64 tokens: a root at 64, two children
     * at 65 (slots 65 and 66), a grandchild of the second at 66 (slot 67),
     * beside s0's and s3's plain tokens (parent -1, their own slots) */
    int32_t tpos[6] = {4999, 64, 65, 65, 66, 700}, tpar[6] = {-1, -1, 1, 1, 3, -1};
    int32_t tkv[6] = {4999, 64, 65, 66, 67, 700};
    uint32_t tseq[6] = {0, 1, 1, 1, 1, 3};
    att_in tree = {.n_tok = 6, .n_head = n_head, .n_seq = NSEQ, .stride = STRIDE, .max_ctx = 5000, .q = q,
                   .pos = tpos, .seq = tseq, .tables = tables, .parent = tpar, .kv_pos = tkv};
    snprintf(what, sizeof what, "tree attention %s head_dim %u heads %u/%u", dn, hd, n_head, n_kv);
    if (rc == 0 && !be[GPU]->ops->supports(be[GPU], KVP_USE_TREE, 0, 0))
        CHECK_MSG(0, "%s: the cuda backend does not support draft trees", what);
    else if (rc == 0 && run_attention(be[CPU], &p[CPU], &tree, out[CPU]) == 0 &&
             run_attention(be[GPU], &p[GPU], &tree, out[GPU]) == 0)
        expect_attention(what, &tree, hd, out[GPU], out[CPU], tol);
    /* kv_copy_block on the same bytes: exact */
    for (int k = 0; k < 2 && rc == 0; k++) {
        rc = gpu_op(be[k], "kv_copy_block", be[k]->ops->kv_copy_block(be[k], &p[k], 3, 200, &err), &err);
        if (rc == 0)
            rc = gpu_op(be[k], "kv_copy_block", be[k]->ops->kv_copy_block(be[k], &p[k], 399, 0, &err), &err);
        if (rc == 0)
            rc = gpu_get(be[k], img[k], p[k].base, bytes, "kv pool");
    }
    if (rc == 0) {
        size_t diff = 0;
        for (size_t i = 0; i < bytes; i++)
            diff += img[GPU][i] != img[CPU][i];
        CHECK_MSG(diff == 0, "kv_copy_block %s: %zu of %zu bytes differ", dn, diff, bytes);
        CHECK_MSG(memcmp(img[GPU] + 3 * p[0].block_bytes, img[GPU] + 200 * p[0].block_bytes, p[0].block_bytes) == 0,
                  "kv_copy_block %s: block 3 is not block 200's copy", dn);
        if (!diff)
            printf("ok kv_copy_block %s: the same %zu bytes\n", dn, bytes);
    }
    free(q), free(out[0]), free(out[1]);
out:
    for (int k = 0; k < 2; k++)
        gpu_free(be[k], p[k].base), free(img[k]);
    free(kv), free(slots);
}

int main(void)
{
    int open = gpu_open("test_gpu_kv", &be[CPU], &be[GPU]);
    if (open <= 0)
        return unit_done();
    kvp_err err = {0};
    static const int kv_dtypes[] = {KVP_DTYPE_F32, KVP_DTYPE_F16, KVP_DTYPE_BF16, KVP_DTYPE_FP8_E4M3, KVP_DTYPE_I8};
    for (size_t i = 0; i < sizeof kv_dtypes / sizeof kv_dtypes[0]; i++) {
        test_pool(kv_dtypes[i], 128, 2, 4); /* Llama-3's head shape, GQA 4 */
        test_pool(kv_dtypes[i], 64, 3, 3);  /* SmolLM2's head_dim, GQA 3 */
        test_pool(kv_dtypes[i], 36, 2, 2);  /* not a multiple of 8: the kernel's element-by-element loads */
    }
    CHECK(gpu_op(be[GPU], "synchronize", be[GPU]->ops->synchronize(be[GPU], &err), &err) == 0);
    kvp_backend_free(be[GPU]);
    kvp_backend_free(be[CPU]);
    return unit_done();
}
