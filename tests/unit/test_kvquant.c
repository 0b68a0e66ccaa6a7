/* test_kvquant.c - the scaled KV cache (fp8 e4m3 and int8 with one scale
 * per head per block): the slab numerics (lib/num/kvscale.c), the CPU
 * backend's stores and attention over such a pool, a round trip through a
 * KVP stream, and on SmolLM2 how far its logits move from an f16 cache's. */
#include "backend_cpu.h"
#include "kvscale.h"
#include "minifloat.h"
#include "quant_kv.h"
#include "rig.h"
#include "seqio.h"
#include "stream.h"
#include "tensor.h"
#include "unit.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static float frand(void) { return unit_frand(&rng_state); } /* uniform in [-1, 1) */

static const int scaled[2] = {KVP_DTYPE_FP8_E4M3, KVP_DTYPE_I8};

/* A row of tiny values (amax 2^-120 to 2^-132) gets a scale below 2^-128
 * whose reciprocal is infinite: its zeros must still read back 0 (not NaN)
 * and its values within a step, not all at +-max. */
static void test_tiny_row(int dtype)
{
    enum { N = 16 };
    float x[N], back[N];
    uint8_t q[N];
    for (int lg = -120; lg >= -132; lg -= 3) { /* below, the scale keeps too few bits */
        for (int i = 0; i < N; i++)
            x[i] = i % 4 == 0 ? 0.0f : ldexpf((float)(i % 3) - 1.0f, lg) * (float)(i % 5 + 1) / 5.0f;
        float scale = kvp_kvscale_row(dtype, x, N, q);
        kvp_kvscale_decode(dtype, q, scale, back, N);
        int bad = 0;
        for (int i = 0; i < N; i++)
            bad += !(fabsf(back[i] - x[i]) <= scale * (dtype == KVP_DTYPE_I8 ? 0.5f : 32.0f));
        CHECK_MSG(bad == 0, "%s amax 2^%d (scale %g): %d elements read back wrong (x[0] %g -> %g)",
                  kvp_dtype_name((uint32_t)dtype), lg, scale, bad, x[0], back[0]);
    }
}

/* One token's head rows with their own scales: int8's is amax / 127, fp8's
 * the power of two with amax in its top octave; every element reads back
 * within half a step (int8) or half an ulp (fp8, 3 mantissa bits; steps of
 * scale * 2^-9 below its normal range), the largest exactly at the top
 * (int8); an all-zero row gets scale 1, never 0. */
static void test_row(int dtype)
{
    enum { N = 72 };
    float x[N], back[N];
    uint8_t q[N];
    for (int round = 0; round < 50; round++) {
        float mag = round < 25 ? 1.0f : 1000.0f / (float)round, amax = 0;
        for (int i = 0; i < N; i++) {
            x[i] = mag * frand() * (i == round ? 7.0f : 1.0f);
            amax = fmaxf(amax, fabsf(x[i]));
        }
        float scale = kvp_kvscale_row(dtype, x, N, q);
        kvp_kvscale_decode(dtype, q, scale, back, N);
        float top = scale * kvp_kvscale_max(dtype);
        int e;
        if (dtype == KVP_DTYPE_I8)
            CHECK_MSG(fabsf(top - amax) <= amax * 1e-6f, "i8: scale %g for amax %g", scale, amax);
        else
            CHECK_MSG(top >= amax && top < 2 * amax && frexpf(scale, &e) == 0.5f, "fp8: scale %g for amax %g", scale,
                      amax);
        double worst = 0;
        for (int i = 0; i < N; i++) {
            double tol = dtype == KVP_DTYPE_I8 ? scale * 0.50001 : fabs(x[i]) / 16 * 1.0001 + scale * 0x1p-10;
            double d = fabs(back[i] - x[i]) - tol;
            worst = d > worst ? d : worst;
        }
        CHECK_MSG(worst <= 0, "%s round %d: an element reads back %g past its tolerance",
                  kvp_dtype_name((uint32_t)dtype), round, worst);
    }
    memset(x, 0, sizeof x);
    CHECK_NEAR(kvp_kvscale_row(dtype, x, N, q), 1.0f, 0);
    test_tiny_row(dtype);
}

/* A scaled pool as kvcache.c lays it out. */
static kvp_kv_pool scaled_pool(kvp_backend *be, int dtype, uint32_t nb, uint32_t bs, uint32_t nl, uint32_t nkv,
                               uint32_t hd)
{
    kvp_kv_pool kv = {.dtype = dtype, .n_blocks = nb, .block_size = bs, .n_layer = nl, .n_head_kv = nkv,
                      .head_dim = hd};
    kv.scales_off = (uint64_t)nl * 2 * nkv * bs * hd;
    kv.block_bytes = kv.scales_off + (uint64_t)nl * 2 * nkv * bs * 4;
    kv.base = be->ops->alloc(be, (size_t)nb * kv.block_bytes);
    return kv;
}

/* Element i of position p's K (which 0) or V row of head g, layer l, as the
 * pool holds it. */
static float pool_at(const kvp_kv_pool *kv, const uint32_t *table, uint32_t l, uint32_t which, uint32_t g,
                     uint32_t p, uint32_t i)
{
    uint32_t blk = table[p / kv->block_size];
    const uint8_t *b = (const uint8_t *)kv->base + (size_t)blk * kv->block_bytes;
    size_t slab = ((size_t)l * 2 + which) * kv->n_head_kv + g;
    float scale, y;
    memcpy(&scale, b + kv->scales_off + 4 * (slab * kv->block_size + p % kv->block_size), 4);
    kvp_kvscale_decode(kv->dtype, b + (slab * kv->block_size + p % kv->block_size) * kv->head_dim + i, scale, &y, 1);
    return y;
}

/* Storing a prompt's tokens in one call or in chunks of 3 leaves the same
 * bytes: each row is its token's alone, never the batch's. */
static void test_store_chunks(int dtype, unsigned flags)
{
    enum { HD = 40, BS = 8, NB = 4, NKV = 2, NT = 29 };
    kvp_backend *be = rig_backend(flags);
    if (!be)
        return;
    kvp_kv_pool a = scaled_pool(be, dtype, NB, BS, 1, NKV, HD), b = scaled_pool(be, dtype, NB, BS, 1, NKV, HD);
    float *k = malloc(sizeof(float) * NT * NKV * HD), *v = malloc(sizeof(float) * NT * NKV * HD);
    uint32_t slot[NT];
    CHECK(a.base && b.base && k && v);
    if (a.base && b.base && k && v) {
        for (int i = 0; i < NT * NKV * HD; i++) {
            k[i] = frand() * (i % 97 == 0 ? 30.0f : 1.0f);
            v[i] = frand() * (i % 89 == 0 ? 30.0f : 1.0f);
        }
        for (uint32_t t = 0; t < NT; t++)
            slot[t] = (3 - t / BS) * BS + t % BS; /* blocks 3, 2, 1, 0 */
        kvp_err err = {0};
        CHECK(be->ops->kv_store(be, &a, 0, k, v, NT, slot, &err) == 0);
        for (uint32_t t = 0; t < NT; t += 3) {
            uint32_t n = NT - t < 3 ? NT - t : 3;
            CHECK(be->ops->kv_store(be, &b, 0, k + t * NKV * HD, v + t * NKV * HD, n, slot + t, &err) == 0);
        }
        CHECK_MSG(memcmp(a.base, b.base, (size_t)NB * a.block_bytes) == 0, "%s: chunked stores differ",
                  kvp_dtype_name((uint32_t)dtype));
    }
    if (a.base)
        be->ops->release(be, a.base);
    if (b.base)
        be->ops->release(be, b.base);
    free(k);
    free(v);
    be->ops->destroy(be);
}

/* Attention over a scaled pool against a softmax in double over the values
 * the pool holds (decoded here), so only summation order separates them:
 * a prompt chunk with history, and decode tokens over a context long
 * enough to be split into chunks. */
static void test_attention(int dtype, unsigned flags, uint32_t n_rep, uint32_t ctx, uint32_t n_q)
{
    enum { HD = 64, BS = 16, NKV = 2, NL = 2 };
    uint32_t nb = (ctx + BS - 1) / BS, nh = NKV * n_rep, row = NKV * HD;
    kvp_backend *be = rig_backend(flags);
    if (!be)
        return;
    kvp_kv_pool kv = scaled_pool(be, dtype, nb, BS, NL, NKV, HD);
    uint32_t *table = malloc(nb * sizeof *table), *slot = malloc(ctx * sizeof *slot), *tseq = calloc(n_q, 4);
    float *k = malloc(sizeof(float) * row), *v = malloc(sizeof(float) * row);
    float *q = malloc(sizeof(float) * n_q * nh * HD), *out = malloc(sizeof(float) * n_q * nh * HD);
    int32_t *pos = malloc(n_q * sizeof *pos);
    double *sc = malloc(ctx * sizeof *sc);
    kvp_err err = {0};
    CHECK(kv.base && table && slot && tseq && k && v && q && out && pos && sc);
    if (!kv.base || !table || !slot || !tseq || !k || !v || !q || !out || !pos || !sc)
        goto done;
    for (uint32_t i = 0; i < nb; i++)
        table[i] = (i * 7 + 3) % nb; /* scattered; nb is never a multiple of 7 here */
    for (uint32_t p = 0; p < ctx; p++) {
        for (uint32_t i = 0; i < row; i++) {
            k[i] = frand() * (p % 37 == 5 ? 8.0f : 1.0f);
            v[i] = frand();
        }
        uint32_t s = table[p / BS] * BS + p % BS;
        CHECK(be->ops->kv_store(be, &kv, 1, k, v, 1, &s, &err) == 0);
    }
    for (uint32_t t = 0; t < n_q; t++)
        pos[t] = (int32_t)(ctx - n_q + t);
    for (size_t i = 0; i < (size_t)n_q * nh * HD; i++)
        q[i] = 2 * frand();
    rig_reserve(be, n_q, 0, nh, ctx, &kv);
    kvp_attn_args a = rig_attn_args(q, out, n_q, nh, 1, 1.0f / sqrtf((float)HD), pos, tseq, table, 1, nb, &kv);
    CHECK_MSG(be->ops->attention(be, &a, &err) == 0, "%s", err.msg);
    double worst = 0;
    for (uint32_t t = 0; t < n_q; t++)
        for (uint32_t h = 0; h < nh; h++) {
            const float *qh = q + ((size_t)t * nh + h) * HD;
            uint32_t g = h / n_rep, np = (uint32_t)pos[t] + 1;
            double mx = -1e300, sum = 0;
            for (uint32_t p = 0; p < np; p++) {
                double d = 0;
                for (uint32_t i = 0; i < HD; i++)
                    d += (double)qh[i] * pool_at(&kv, table, 1, 0, g, p, i);
                sc[p] = d * a.scale;
                mx = sc[p] > mx ? sc[p] : mx;
            }
            for (uint32_t p = 0; p < np; p++)
                sum += sc[p] = exp(sc[p] - mx);
            for (uint32_t i = 0; i < HD; i++) {
                double ref = 0;
                for (uint32_t p = 0; p < np; p++)
                    ref += sc[p] / sum * pool_at(&kv, table, 1, 1, g, p, i);
                double e = fabs(out[((size_t)t * nh + h) * HD + i] - ref);
                worst = e > worst ? e : worst;
            }
        }
    CHECK_MSG(worst < 2e-5, "attention over %s, rep %u, ctx %u, %u queries, flags %u: worst error %g",
              kvp_dtype_name((uint32_t)dtype), n_rep, ctx, n_q, flags, worst);
done:
    if (kv.base)
        be->ops->release(be, kv.base);
    free(table);
    free(slot);
    free(tseq);
    free(k);
    free(v);
    free(q);
    free(out);
    free(pos);
    free(sc);
    be->ops->destroy(be);
}

/* The golden prompt of tests/golden/engine_smollm2.txt and the model, or 0
 * with a note when either is absent. */
static int golden_prompt(uint32_t *ids, int max, const char **mpath)
{
    const char *tests = getenv("KVP_TESTS") ? getenv("KVP_TESTS") : "tests";
    char path[1024], key[32];
    snprintf(path, sizeof path, "%s/golden/engine_smollm2.txt", tests);
    *mpath = unit_model_path();
    FILE *f = fopen(path, "r");
    if (!f || access(*mpath, R_OK) != 0) {
        printf("note: skipping SmolLM2 with a scaled KV cache (%s or %s absent; run scripts/fetch-model)\n", *mpath,
               path);
        if (f)
            fclose(f);
        return 0;
    }
    char line[256];
    unsigned n = 0;
    CHECK(fgets(line, sizeof line, f) != NULL); /* model line */
    CHECK(fscanf(f, "%31s %u", key, &n) == 2 && strcmp(key, "prompt") == 0 && n <= (unsigned)max);
    for (unsigned i = 0; i < n && i < (unsigned)max; i++)
        CHECK(fscanf(f, "%u", &ids[i]) == 1);
    fclose(f);
    return (int)n;
}

/* Logits at every position of prompt[n], with a KV cache of dtype. */
static float *prompt_logits(const char *mpath, int dtype, const uint32_t *prompt, int n, uint32_t *V)
{
    rig r;
    if (rig_open(&r, mpath, unit_threads(0), 0, dtype, 64, 16) < 0) {
        CHECK(0);
        return NULL;
    }
    *V = r.m->cfg.n_vocab;
    float *lg = malloc(sizeof(float) * (size_t)n * *V);
    kvp_err err = {0};
    int s = kvp_kvcache_seq_new(r.kc, &err);
    kvp_step_seq ss = {.seq = s, .tokens = prompt, .n_tokens = (uint32_t)n, .want = KVP_LOGITS_ALL};
    CHECK_EQ_I64(kvp_engine_step(r.e, &ss, 1, lg, &err), n);
    rig_close(&r);
    return lg;
}

typedef struct agreement {
    int agree, ties;  /* top-1 equal; unequal but within 2 logits of each other in the reference */
    double rms, max;  /* change in every logit */
} agreement;

static agreement compare(const float *ref, const float *lg, int n, uint32_t V)
{
    agreement c = {0};
    double sq = 0;
    for (int p = 0; p < n; p++) {
        const float *a = ref + (size_t)p * V, *b = lg + (size_t)p * V;
        uint32_t ta = unit_argmax(a, V), tb = unit_argmax(b, V);
        c.agree += ta == tb;
        c.ties += ta != tb && a[ta] - a[tb] < 2.0f;
        for (uint32_t i = 0; i < V; i++) {
            double e = fabs((double)a[i] - b[i]);
            sq += e * e;
            c.max = e > c.max ? e : c.max;
        }
    }
    c.rms = sqrt(sq / ((double)n * V));
    return c;
}

/* SmolLM2 on the golden prompt: the scaled caches against the f16 one, top-1
 * agreement and the RMS of the change in every logit, beside what an f32
 * cache changes (the engine's own sensitivity: 8-bit activation rounding
 * turns small KV differences into flips wherever two tokens are near a
 * tie).  Measured: f32, fp8 and int8 156 of 162 (96.3%; RMS 0.27, 0.50
 * and 0.31); the flips are between tokens within 0.26 logits of each other
 * in f16 but one of fp8's (1.57).  The 97% is above
 * what even f32 reaches on this text with 8-bit activations; on f32
 * weights, where only the cache rounds, tests/cli/perplexity.sh holds int8
 * at 97%.  The f32 cache's own agreement moves
 * with the host's kernels (their sums' order): 156 on AMD Zen 4 (AVX-512),
 * 160 on AMD Zen 3 (AVX2), where fp8 stays at 156; so a scaled cache may
 * trail it by 5 (3%), and every flip must still be a near tie. */
static void test_smollm2(void)
{
    uint32_t prompt[1024], V = 0;
    const char *mpath;
    int n = golden_prompt(prompt, 1024, &mpath);
    if (n <= 0)
        return;
    float *ref = prompt_logits(mpath, KVP_DTYPE_F16, prompt, n, &V);
    float *f32 = ref ? prompt_logits(mpath, KVP_DTYPE_F32, prompt, n, &V) : NULL;
    if (!f32) {
        free(ref);
        return;
    }
    agreement base = compare(ref, f32, n, V);
    printf("smollm2 f32 KV vs f16 KV: top-1 agreement %d/%d (%.1f%%; %d of the others near ties), logit rms err "
           "%.4f, max %.4f\n", base.agree, n, 100.0 * base.agree / n, base.ties, base.rms, base.max);
    for (int d = 0; d < 2; d++) {
        float *lg = prompt_logits(mpath, scaled[d], prompt, n, &V);
        if (!lg)
            continue;
        agreement c = compare(ref, lg, n, V);
        const char *name = kvp_dtype_name((uint32_t)scaled[d]);
        printf("smollm2 %s KV vs f16 KV: top-1 agreement %d/%d (%.1f%%; %d of the others near ties), logit rms err "
               "%.4f, max %.4f\n", name, c.agree, n, 100.0 * c.agree / n, c.ties, c.rms, c.max);
        CHECK_MSG(c.agree + c.ties == n, "%s: %d top-1 flips that are not near ties", name, n - c.agree - c.ties);
        CHECK_MSG(c.agree + 5 >= base.agree, "%s: top-1 agreement %d of %d, an f32 cache's %d", name, c.agree, n,
                  base.agree);
        CHECK_MSG(c.rms < 2.5 * base.rms, "%s: logit rms error %g, an f32 cache's %g", name, c.rms, base.rms);
        free(lg);
    }
    free(ref);
    free(f32);
}

/* Sequence ss of r's cache as a KVP stream at path; its KV blocks written
 * (0 after a failed check). */
static uint64_t write_seq(rig *r, const kvp_seqio_seq *ss, const char *path)
{
    kvp_err err = {0};
    kvp_out out;
    kvp_writer *w = NULL;
    kvp_writer_opts wo = {.producer = "test_kvquant"};
    memcpy(wo.fingerprint, r->m->fingerprint, KVP_FINGERPRINT_SIZE);
    uint64_t nb = 0, nr = 0;
    CHECK_MSG(kvp_out_open(&out, path, &err) == 0 && kvp_writer_open(&w, &out, &wo, &err) == 0 &&
                  kvp_seqio_write(w, r->kc, ss, 1, &nb, &nr, &err) == 0 && kvp_writer_finish(w, &err) == 0 &&
                  kvp_out_commit(&out, &err) == 0,
              "%s", err.msg);
    kvp_writer_free(w);
    return nb;
}

/* The stream at path read into a new cache (o) for r's model: what
 * kvp_seqio_read returns, with *kc, *got and *ng as it leaves them. */
static int read_seqs(rig *r, const char *path, const kvp_kvcache_opts *o, kvp_kvcache **kc, kvp_seqio_seq **got,
                     uint32_t *ng, kvp_err *err)
{
    kvp_in in;
    kvp_reader *rd = NULL;
    int rc = kvp_in_open(&in, path, err);
    if (rc < 0)
        return rc;
    if ((rc = kvp_reader_open(&rd, &in, err)) == 0)
        rc = kvp_seqio_read(rd, path, r->m, r->be, o, kc, got, ng, NULL, err);
    kvp_reader_free(rd);
    kvp_in_close(&in);
    return rc;
}

/* A scaled cache written to a KVP stream and read back (its dtype taken
 * from the stream) holds the same bytes and gives the same next logits. */
static void test_stream(int dtype)
{
    uint32_t prompt[1024], V;
    const char *mpath;
    int n = golden_prompt(prompt, 1024, &mpath);
    if (n <= 40)
        return;
    rig r;
    if (rig_open(&r, mpath, unit_threads(2), 0, dtype, 32, 16) < 0) {
        CHECK(0);
        return;
    }
    V = r.m->cfg.n_vocab;
    kvp_err err = {0};
    char path[] = "/tmp/test_kvquant_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd >= 0)
        close(fd);
    /* a record a reader takes: a defined state, sampling a run accepts (kvp(5)) */
    kvp_seqio_seq ss = {.rec = {.id = 3, .state = KVP_SEQ_PREFILLED, .sampling = {.top_p = 1, .repeat_penalty = 1}}};
    ss.handle = kvp_kvcache_seq_new(r.kc, &err);
    float *l0 = malloc(sizeof(float) * V), *l1 = malloc(sizeof(float) * V);
    CHECK(kvp_engine_prefill(r.e, ss.handle, prompt, 40, 0, l0, &err) == 0);
    CHECK_EQ_U64(write_seq(&r, &ss, path), 3);
    kvp_kvcache *kc = NULL;
    kvp_seqio_seq *got = NULL;
    uint32_t ng = 0;
    kvp_kvcache_opts o;
    kvp_kvcache_opts_init(&o); /* f16, unless the stream says otherwise: */
    o.dtype_from_stream = 1;
    o.n_blocks = 8;
    CHECK_MSG(read_seqs(&r, path, &o, &kc, &got, &ng, &err) == 0, "%s", err.msg);
    CHECK_EQ_U64(ng, 1);
    if (ng == 1 && kc) {
        const kvp_kv_pool *a = kvp_kvcache_pool(r.kc), *b = kvp_kvcache_pool(kc);
        CHECK_EQ_I64(b->dtype, dtype);
        CHECK_EQ_U64(b->block_bytes, a->block_bytes);
        uint8_t *x = malloc(a->block_bytes), *y = malloc(b->block_bytes);
        for (uint32_t i = 0; i < 3 && x && y; i++) {
            CHECK(kvp_kvcache_block_read(r.kc, kvp_kvcache_seq_blocks(r.kc, ss.handle)[i], x, &err) == 0 &&
                  kvp_kvcache_block_read(kc, kvp_kvcache_seq_blocks(kc, got[0].handle)[i], y, &err) == 0);
            CHECK_MSG(memcmp(x, y, a->block_bytes) == 0, "%s block %u differs after the stream",
                      kvp_dtype_name((uint32_t)dtype), i);
        }
        free(x);
        free(y);
        uint32_t nx = prompt[40];
        kvp_step_seq st = {.seq = ss.handle, .tokens = &nx, .n_tokens = 1, .want = KVP_LOGITS_LAST};
        CHECK_EQ_I64(kvp_engine_step(r.e, &st, 1, l0, &err), 1);
        kvp_engine *e2;
        CHECK(kvp_engine_create(&e2, r.m, r.be, kc, &err) == 0);
        kvp_step_seq st2 = {.seq = got[0].handle, .tokens = &nx, .n_tokens = 1, .want = KVP_LOGITS_LAST};
        CHECK_EQ_I64(kvp_engine_step(e2, &st2, 1, l1, &err), 1);
        CHECK_MSG(memcmp(l0, l1, sizeof(float) * V) == 0, "%s: reloaded KV gives other logits",
                  kvp_dtype_name((uint32_t)dtype));
        kvp_engine_free(e2);
    }
    kvp_seqio_seqs_free(got, ng);
    /* an f16 run named on the command line refuses the stream, naming both */
    o.dtype_from_stream = 0;
    kvp_kvcache *kc2 = NULL;
    kvp_seqio_seq *got2 = NULL;
    CHECK_EQ_I64(read_seqs(&r, path, &o, &kc2, &got2, &ng, &err), KVP_EMISMATCH);
    CHECK(strstr(err.msg, kvp_dtype_name((uint32_t)dtype)) && strstr(err.msg, "f16"));
    kvp_kvcache_free(kc);
    free(l0);
    free(l1);
    unlink(path);
    rig_close(&r);
}

/* A NaN or infinity in a KV block: quantize --kv refused nothing and wrote
 * it as a finite code (a scale's max drops a NaN), and decode's reading
 * of it ended later at a hidden-state check naming no file or record.
 * Both name the block, K or V, token, layer and head now; the finiteness
 * scan itself on each cache dtype's NaN and infinity bits. */
static void test_non_finite(void)
{
    static const uint16_t h[4] = {0x3c00, 0xfc00, 0x7e00, 0x0000}; /* f16 1, -inf, NaN, 0 */
    CHECK_EQ_U64(kvp_kv_first_non_finite(KVP_DTYPE_F16, h, 4), 1);
    CHECK_EQ_U64(kvp_kv_first_non_finite(KVP_DTYPE_F16, h, 1), 1);
    static const uint16_t bf[3] = {0x3f80, 0x7f7f, 0x7fc0}; /* bf16 1, max, NaN */
    CHECK_EQ_U64(kvp_kv_first_non_finite(KVP_DTYPE_BF16, bf, 3), 2);
    static const uint8_t e4[3] = {0x7e, 0xfe, 0xff}; /* 448, -448, NaN */
    CHECK_EQ_U64(kvp_kv_first_non_finite(KVP_DTYPE_FP8_E4M3, e4, 3), 2);
    float f[2] = {1e38f, INFINITY};
    CHECK_EQ_U64(kvp_kv_first_non_finite(KVP_DTYPE_F32, f, 2), 1);
    CHECK_EQ_U64(kvp_kv_first_non_finite(KVP_DTYPE_I8, e4, 3), 3);

    /* one layer, 2 KV heads of 4, blocks of 2 slots, 1 filled: a NaN in
     * V of head 1 */
    kvp_kvblock_rec src = {.seq_id = 7, .block_index = 2, .block_size = 2, .n_tokens = 1, .layer_begin = 3,
                           .layer_end = 4, .n_head_kv = 2, .head_dim = 4, .dtype = KVP_DTYPE_F16,
                           .data_bytes = 4 * 2 * 4 * 2};
    uint16_t data[4 * 2 * 4] = {0};
    data[3 * 8 + 2] = 0x7e00; /* slab 3 (V, head 1), token 0, element 2 */
    for (int d = 0; d < 2; d++) {
        kvp_kvblock_rec dst;
        kvp_err err = {0};
        CHECK(kvp_quant_kv_plan(&src, (uint32_t)scaled[d], &dst, &err) == 0);
        uint8_t out[64];
        float sc[8];
        CHECK_EQ_I64(kvp_quant_kv_convert(&src, data, NULL, &dst, out, sc, NULL, &err), KVP_EFORMAT);
        CHECK_MSG(strstr(err.msg, "kv block 2 of sequence 7: V value NaN at token 0 of layer 3, KV head 1"), "%s",
                  err.msg);
    }
    data[3 * 8 + 2] = 0;
    data[3 * 8 + 4] = 0x7e00; /* token 1: past the filled slot, not read */
    kvp_kvblock_rec dst;
    kvp_err err = {0};
    uint8_t out[64];
    float sc[8];
    CHECK(kvp_quant_kv_plan(&src, KVP_DTYPE_I8, &dst, &err) == 0);
    CHECK_MSG(kvp_quant_kv_convert(&src, data, NULL, &dst, out, sc, NULL, &err) == 0, "%s", err.msg);
}

/* decode reading a stream whose block holds a NaN names file, record and
 * place (SmolLM2 from the cache, f16). */
static void test_stream_nan(void)
{
    static uint32_t prompt[1024];
    const char *mpath;
    if (golden_prompt(prompt, 1024, &mpath) < 20)
        return;
    rig r;
    if (rig_open(&r, mpath, unit_threads(2), 0, KVP_DTYPE_F16, 8, 16) < 0) {
        CHECK(0);
        return;
    }
    kvp_err err = {0};
    char path[] = "/tmp/test_kvquant_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0)
        close(fd);
    kvp_seqio_seq ss = {.rec = {.id = 5, .state = KVP_SEQ_PREFILLED, .sampling = {.top_p = 1, .repeat_penalty = 1}}};
    ss.handle = kvp_kvcache_seq_new(r.kc, &err);
    CHECK(kvp_engine_prefill(r.e, ss.handle, prompt, 20, 0, NULL, &err) == 0);
    /* the second block's first bytes: layer 0's K, head 0, token 0 (16) */
    uint32_t b1 = kvp_kvcache_seq_blocks(r.kc, ss.handle)[1];
    const kvp_kv_pool *pool = kvp_kvcache_pool(r.kc);
    uint8_t *blk = malloc(pool->block_bytes);
    CHECK(blk && kvp_kvcache_block_read(r.kc, b1, blk, &err) == 0);
    if (blk) {
        blk[0] = 0x00, blk[1] = 0x7e;
        CHECK(kvp_kvcache_block_write(r.kc, b1, blk, &err) == 0);
    }
    free(blk);
    write_seq(&r, &ss, path);
    kvp_kvcache *kc = NULL;
    kvp_seqio_seq *got = NULL;
    uint32_t ng = 0;
    kvp_kvcache_opts o;
    kvp_kvcache_opts_init(&o);
    o.n_blocks = 8;
    CHECK_EQ_I64(read_seqs(&r, path, &o, &kc, &got, &ng, &err), KVP_EFORMAT);
    CHECK_MSG(strstr(err.msg, "record 2: KV block 1 of sequence 5: the K value at token 0 of layer 0, KV head 0 "
                              "is NaN or infinity") && strstr(err.msg, path),
              "%s", err.msg);
    kvp_seqio_seqs_free(got, ng);
    kvp_kvcache_free(kc);
    unlink(path);
    rig_close(&r);
}

int main(void)
{
    test_non_finite();
    test_stream_nan();
    for (int d = 0; d < 2; d++) {
        test_row(scaled[d]);
        for (unsigned fl = 0; fl < 2; fl++) {
            test_store_chunks(scaled[d], fl);
            test_attention(scaled[d], fl, 3, 37, 11);  /* a prompt chunk over history */
            test_attention(scaled[d], fl, 1, 20, 20);  /* a whole prompt, one head a group */
            test_attention(scaled[d], fl, 3, 900, 1);  /* decode, split into chunks */
        }
        test_stream(scaled[d]);
    }
    test_smollm2();
    return unit_done();
}
