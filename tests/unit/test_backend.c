/* test_backend.c - the backend contract (lib/backend/backend.h) as the CPU
 * backend and the engine keep it:
 *   - the engine never reads or writes device memory itself: a "fence"
 *     backend wraps the CPU one and keeps every allocation PROT_NONE except
 *     inside its own ops, so a memcpy by the engine faults; a model run
 *     through it gives the plain CPU backend's logits bit for bit;
 *   - ops never allocate: past what reserve() sized they fail (KVP_ELIMIT);
 *   - prepare_weight refuses a weight the backend cannot use, naming it;
 *   - matmul_n gives each weight matmul's bits;
 *   - two descriptors of one tensor share what prepare_weight made;
 *   - supports(), gather_rows, and the registry (backends.h).
 */
#include "backend.h"
#include "backend_cpu.h"
#include "backend_cpu_kern.h"
#include "backends.h"
#include "minifloat.h"
#include "rig.h"
#include "tensor.h"
#include "tiny.h"
#include "unit.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- the fence backend ---- */

#define FENCE_MAX 256

typedef struct fence {
    kvp_backend *cpu;
    struct { uint8_t *p; size_t n; } a[FENCE_MAX];
    int n;
    long ops;              /* op calls seen */
} fence;

static fence *fence_of(kvp_backend *b) { return b->impl; }

static void fence_set(fence *f, int prot)
{
    for (int i = 0; i < f->n; i++)
        if (mprotect(f->a[i].p, f->a[i].n, prot) != 0)
            abort(); /* a test harness fault, not a finding */
}
static void fence_open(kvp_backend *b) { fence_set(fence_of(b), PROT_READ | PROT_WRITE); }
static void fence_shut(kvp_backend *b)
{
    fence_of(b)->ops++;
    fence_set(fence_of(b), PROT_NONE);
}

static void *fence_alloc(kvp_backend *b, size_t bytes)
{
    fence *f = fence_of(b);
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), n = (bytes + pg - 1) / pg * pg;
    if (f->n == FENCE_MAX)
        return NULL;
    void *p = mmap(NULL, n ? n : pg, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    f->a[f->n].p = p, f->a[f->n].n = n ? n : pg;
    f->n++;
    return p;
}

static void fence_release(kvp_backend *b, void *p)
{
    fence *f = fence_of(b);
    for (int i = 0; i < f->n; i++)
        if (f->a[i].p == p) {
            munmap(p, f->a[i].n);
            f->a[i] = f->a[--f->n];
            return;
        }
    abort(); /* released what it never allocated */
}

static void fence_destroy(kvp_backend *b)
{
    fence *f = fence_of(b);
    while (f->n)
        fence_release(b, f->a[0].p);
    kvp_backend_free(f->cpu);
    free(f);
    free(b);
}

/* Each op: the fence opens, the CPU backend's op runs, the fence shuts. */
#define CPU(b) (fence_of(b)->cpu)
#define FORWARD(call)                                                                                               \
    do {                                                                                                            \
        fence_open(b);                                                                                              \
        int rc_ = CPU(b)->ops->call;                                                                                \
        fence_shut(b);                                                                                              \
        return rc_;                                                                                                 \
    } while (0)

static int fence_supports(const kvp_backend *b, int use, int dtype, int scaled)
{
    const fence *f = b->impl;
    return f->cpu->ops->supports(f->cpu, use, dtype, scaled);
}
static int fence_to_host(kvp_backend *b, void *host, const void *dev, size_t n, kvp_err *err)
{
    FORWARD(to_host(CPU(b), host, dev, n, err));
}
static int fence_from_host(kvp_backend *b, void *dev, const void *host, size_t n, kvp_err *err)
{
    FORWARD(from_host(CPU(b), dev, host, n, err));
}
static int fence_sync(kvp_backend *b, kvp_err *err) { FORWARD(synchronize(CPU(b), err)); }
static int fence_reserve(kvp_backend *b, const kvp_backend_reserve *r, kvp_err *err)
{
    return CPU(b)->ops->reserve(CPU(b), r, err);
}
static int fence_prepare(kvp_backend *b, kvp_weight *w, kvp_err *err)
{
    return CPU(b)->ops->prepare_weight(CPU(b), w, err);
}
static void fence_release_weight(kvp_backend *b, kvp_weight *w) { CPU(b)->ops->release_weight(CPU(b), w); }
static int fence_matmul(kvp_backend *b, const kvp_weight *w, const float *x, float *y, uint32_t n, kvp_err *err)
{
    FORWARD(matmul(CPU(b), w, x, y, n, err));
}
static int fence_matmul_n(kvp_backend *b, const kvp_weight *const *w, uint32_t nw, const float *x, float *const *y,
                          uint32_t n, kvp_err *err)
{
    FORWARD(matmul_n(CPU(b), w, nw, x, y, n, err));
}
static int fence_embed(kvp_backend *b, const kvp_weight *w, const int32_t *tok, uint32_t n, float *out, kvp_err *err)
{
    FORWARD(embed(CPU(b), w, tok, n, out, err));
}
static int fence_rmsnorm(kvp_backend *b, const float *x, const kvp_weight *w, float *y, uint32_t nt, uint32_t n,
                         float eps, kvp_err *err)
{
    FORWARD(rmsnorm(CPU(b), x, w, y, nt, n, eps, err));
}
static int fence_rope(kvp_backend *b, float *x, uint32_t nt, uint32_t nh, uint32_t hd, uint32_t rd, const int32_t *pos,
                      const kvp_weight *f, int kind, kvp_err *err)
{
    FORWARD(rope(CPU(b), x, nt, nh, hd, rd, pos, f, kind, err));
}
static int fence_add_bias(kvp_backend *b, float *x, const kvp_weight *w, uint32_t nt, uint32_t n, kvp_err *err)
{
    FORWARD(add_bias(CPU(b), x, w, nt, n, err));
}
static int fence_add(kvp_backend *b, float *x, const float *y, size_t n, kvp_err *err)
{
    FORWARD(add(CPU(b), x, y, n, err));
}
static int fence_silu_mul(kvp_backend *b, float *g, const float *u, size_t n, kvp_err *err)
{
    FORWARD(silu_mul(CPU(b), g, u, n, err));
}
static int fence_gather(kvp_backend *b, float *dst, const float *src, const uint32_t *rows, uint32_t nr, uint32_t n,
                        kvp_err *err)
{
    FORWARD(gather_rows(CPU(b), dst, src, rows, nr, n, err));
}
static int fence_kv_store(kvp_backend *b, const kvp_kv_pool *kv, uint32_t l, const float *k, const float *v,
                          uint32_t nt, const uint32_t *slot, kvp_err *err)
{
    FORWARD(kv_store(CPU(b), kv, l, k, v, nt, slot, err));
}
/* The host copies of the step's metadata are the engine's own: readable
 * with the fence shut, which is the point of having them. */
static int fence_attention(kvp_backend *b, const kvp_attn_args *a, kvp_err *err)
{
    uint32_t ctx = 0;
    for (uint32_t t = 0; t < a->n_tok; t++) /* the planning data, read before the fence opens */
        ctx = (uint32_t)a->host_pos[t] + 1 > ctx ? (uint32_t)a->host_pos[t] + 1 : ctx;
    if (ctx != a->max_ctx)
        return kvp_err_set(err, KVP_EINVAL, "fence: max_ctx %u, the host positions say %u", a->max_ctx, ctx);
    FORWARD(attention(CPU(b), a, err));
}
static int fence_kv_copy(kvp_backend *b, const kvp_kv_pool *kv, uint32_t dst, uint32_t src, kvp_err *err)
{
    FORWARD(kv_copy_block(CPU(b), kv, dst, src, err));
}
static int fence_all_reduce(kvp_backend *b, struct kvp_comm *c, float *x, size_t n, kvp_err *err)
{
    FORWARD(all_reduce(CPU(b), c, x, n, err));
}
static int fence_all_gather(kvp_backend *b, struct kvp_comm *c, const float *s, float *r, size_t n, kvp_err *err)
{
    FORWARD(all_gather(CPU(b), c, s, r, n, err));
}

static const kvp_backend_ops fence_ops = {
    .name = "fence", .destroy = fence_destroy, .supports = fence_supports, .alloc = fence_alloc,
    .release = fence_release, .to_host = fence_to_host, .from_host = fence_from_host, .synchronize = fence_sync,
    .reserve = fence_reserve, .prepare_weight = fence_prepare, .release_weight = fence_release_weight,
    .matmul = fence_matmul, .matmul_n = fence_matmul_n, .embed = fence_embed, .rmsnorm = fence_rmsnorm,
    .rope = fence_rope, .add_bias = fence_add_bias, .add = fence_add, .silu_mul = fence_silu_mul,
    .gather_rows = fence_gather,
    .kv_store = fence_kv_store, .attention = fence_attention, .kv_copy_block = fence_kv_copy,
    .all_reduce = fence_all_reduce, .all_gather = fence_all_gather,
};

static kvp_backend *fence_create(void)
{
    kvp_backend *b = calloc(1, sizeof *b);
    fence *f = calloc(1, sizeof *f);
    kvp_err err = {0};
    if (!b || !f || kvp_backend_cpu_create(&f->cpu, unit_threads(2), 0, &err) < 0) {
        free(b), free(f);
        return NULL;
    }
    b->ops = &fence_ops, b->impl = f;
    return b;
}

/* Every op of a table is there (a NULL one would crash the engine). */
static void test_table_whole(const kvp_backend_ops *o)
{
    const void *ops[] = {(const void *)o->destroy, (const void *)o->supports, (const void *)o->alloc,
                         (const void *)o->release, (const void *)o->to_host, (const void *)o->from_host,
                         (const void *)o->synchronize, (const void *)o->reserve, (const void *)o->prepare_weight,
                         (const void *)o->release_weight, (const void *)o->matmul, (const void *)o->embed,
                         (const void *)o->rmsnorm, (const void *)o->rope, (const void *)o->add_bias,
                         (const void *)o->add, (const void *)o->silu_mul, (const void *)o->gather_rows,
                         (const void *)o->kv_store, (const void *)o->attention, (const void *)o->kv_copy_block,
                         (const void *)o->all_reduce, (const void *)o->all_gather};
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++)
        CHECK_MSG(ops[i] != NULL, "%s: op %zu of the table is missing", o->name, i);
}

/* The same steps on the CPU backend and through the fence: a prompt in two
 * chunks for one sequence, a fork that copies a partial block, then decode
 * steps of both; the logits must be the same bits. */
static void test_engine_fenced(const char *path)
{
    rig a;
    kvp_err err = {0};
    if (rig_open(&a, path, unit_threads(2), 0, KVP_DTYPE_F16, 64, 4) < 0) {
        CHECK(0);
        return;
    }
    kvp_backend *fb = fence_create();
    kvp_kvcache_opts o;
    kvp_kvcache_opts_init(&o);
    o.dtype = KVP_DTYPE_F16, o.n_blocks = 64, o.block_size = 4;
    kvp_kvcache *kc = NULL;
    kvp_engine *e = NULL;
    CHECK(fb != NULL);
    if (!fb || kvp_kvcache_create(&kc, &a.m->cfg, &o, fb, &err) < 0 ||
        kvp_engine_create(&e, a.m, fb, kc, &err) < 0) {
        CHECK_MSG(0, "fenced engine: %s", err.msg);
        goto out;
    }
    uint32_t nv = kvp_engine_n_vocab(a.e), prompt[23];
    float *la = malloc(sizeof(float) * 10 * nv), *lb = malloc(sizeof(float) * 10 * nv);
    for (uint32_t i = 0; i < 23; i++)
        prompt[i] = (i * 7 + 3) % nv;
    int sa = kvp_kvcache_seq_new(a.kc, &err), sb = kvp_kvcache_seq_new(kc, &err);
    kvp_step_seq s1 = {.seq = sa, .tokens = prompt, .n_tokens = 10, .want = KVP_LOGITS_ALL};
    kvp_step_seq s2 = {.seq = sa, .tokens = prompt + 10, .n_tokens = 13, .want = KVP_LOGITS_LAST};
    int same = la && lb;
    for (int pass = 0; pass < 2 && same; pass++) {
        kvp_engine *en = pass ? e : a.e;
        float *l = pass ? lb : la;
        s1.seq = s2.seq = pass ? sb : sa;
        CHECK_MSG(kvp_engine_step(en, &s1, 1, l, &err) == 10, "%s", err.msg);
    }
    same = same && memcmp(la, lb, sizeof(float) * 10 * nv) == 0;
    for (int pass = 0; pass < 2; pass++) {
        kvp_engine *en = pass ? e : a.e;
        s2.seq = pass ? sb : sa;
        CHECK_MSG(kvp_engine_step(en, &s2, 1, pass ? lb : la, &err) == 1, "%s", err.msg);
    }
    same = same && memcmp(la, lb, sizeof(float) * nv) == 0;
    int fa = kvp_kvcache_seq_fork(a.kc, sa, &err), fbk = kvp_kvcache_seq_fork(kc, sb, &err);
    CHECK(fa >= 0 && fbk >= 0);
    for (uint32_t step = 0; step < 3 && fa >= 0 && fbk >= 0; step++) {
        uint32_t t0 = (step * 5 + 1) % nv, t1 = (step * 11 + 2) % nv;
        kvp_step_seq d[2] = {{.seq = sa, .tokens = &t0, .n_tokens = 1, .want = KVP_LOGITS_LAST},
                             {.seq = fa, .tokens = &t1, .n_tokens = 1, .want = KVP_LOGITS_LAST}};
        CHECK_MSG(kvp_engine_step(a.e, d, 2, la, &err) == 2, "%s", err.msg);
        d[0].seq = sb, d[1].seq = fbk;
        CHECK_MSG(kvp_engine_step(e, d, 2, lb, &err) == 2, "%s", err.msg);
        same = same && memcmp(la, lb, sizeof(float) * 2 * nv) == 0;
    }
    CHECK_MSG(same, "the fenced backend's logits differ from the CPU backend's");
    CHECK_MSG(fence_of(fb)->ops > 100, "the fence saw only %ld op calls", fence_of(fb)->ops);
    free(la), free(lb);
out:
    kvp_engine_free(e);
    kvp_kvcache_free(kc);
    kvp_backend_free(fb);
    rig_close(&a);
}

/* Ops never allocate: past what reserve() sized they refuse, and after a
 * larger reserve they run. */
static void test_reserve_bounds(void)
{
    enum { NI = 64, NO = 16 };
    kvp_backend *be = rig_backend(0);
    kvp_err err = {0};
    if (!be)
        return;
    float *wd = calloc(NI * NO, sizeof(float)), x[8 * NI] = {0}, y[8 * NO];
    kvp_weight w = {.name = "w.bound", .dtype = KVP_DTYPE_F32, .n_in = NI, .n_out = NO, .row_bytes = NI * 4,
                    .data = wd};
    CHECK(wd && be->ops->prepare_weight(be, &w, &err) == 0);
    CHECK_EQ_I64(be->ops->matmul(be, &w, x, y, 1, &err), KVP_ELIMIT); /* nothing reserved yet */
    CHECK_MSG(strstr(err.msg, "w.bound") != NULL, "the refusal does not name the weight: %s", err.msg);
    rig_reserve(be, 4, NI, 0, 0, NULL);
    CHECK_EQ_I64(be->ops->matmul(be, &w, x, y, 4, &err), 0);
    CHECK_EQ_I64(be->ops->matmul(be, &w, x, y, 5, &err), KVP_ELIMIT);
    rig_reserve(be, 8, NI, 0, 0, NULL);
    CHECK_EQ_I64(be->ops->matmul(be, &w, x, y, 8, &err), 0);
    /* attention with no pool reserved */
    kvp_kv_pool kv = {.dtype = KVP_DTYPE_F32, .n_blocks = 2, .block_size = 4, .n_layer = 1, .n_head_kv = 1,
                      .head_dim = 8, .block_bytes = 2 * 4 * 8 * 4};
    kv.base = be->ops->alloc(be, 2 * kv.block_bytes);
    int32_t pos[1] = {0};
    uint32_t seq[1] = {0}, table[2] = {1, 0};
    float q[8] = {1}, out[8];
    kvp_attn_args a = rig_attn_args(q, out, 1, 1, 0, 1.0f, pos, seq, table, 1, 2, &kv);
    CHECK_EQ_I64(be->ops->attention(be, &a, &err), KVP_ELIMIT);
    rig_reserve(be, 8, NI, 1, 8, &kv);
    CHECK_MSG(be->ops->attention(be, &a, &err) == 0, "%s", err.msg);
    be->ops->release(be, kv.base);
    be->ops->release_weight(be, &w);
    free(wd);
    kvp_backend_free(be);
}

/* A weight of n_out rows of NI_N elements of dtype with random contents
 * (sane f16 scales and values), prepared on be; data to free. */
enum { NI_N = 1024 };
static kvp_weight rand_weight(kvp_backend *be, int dtype, uint32_t n_out, uint64_t *rng)
{
    size_t bb = dtype == KVP_DTYPE_Q8_0 ? 34 : dtype == KVP_DTYPE_Q4_1 ? 20 : 22; /* Q5_0: 22 */
    int blocks = dtype != KVP_DTYPE_F16 && dtype != KVP_DTYPE_F32;
    size_t rb = blocks ? NI_N / 32 * bb : dtype == KVP_DTYPE_F16 ? NI_N * 2 : NI_N * 4;
    uint8_t *d = malloc(rb * n_out);
    kvp_weight w = {.name = "w.fused", .dtype = dtype, .n_in = NI_N, .n_out = n_out, .row_bytes = rb, .data = d};
    for (size_t i = 0; d && i < rb * n_out; i++)
        d[i] = (uint8_t)((unit_frand(rng) + 1.0f) * 127.0f);
    for (uint32_t r = 0; d && r < n_out; r++) {
        uint8_t *row = d + r * rb;
        for (uint32_t i = 0; i < NI_N; i++) {
            if (dtype == KVP_DTYPE_F16)
                ((uint16_t *)row)[i] = kvp_f32_to_f16(unit_frand(rng));
            else if (dtype == KVP_DTYPE_F32)
                ((float *)row)[i] = unit_frand(rng);
        }
        for (uint32_t b = 0; blocks && b < NI_N / 32; b++) {
            uint8_t *blk = row + b * bb;
            uint16_t sc = kvp_f32_to_f16(0.01f + 0.005f * unit_frand(rng));
            memcpy(blk, &sc, 2);
            if (dtype == KVP_DTYPE_Q4_1) {
                uint16_t m = kvp_f32_to_f16(0.05f * unit_frand(rng));
                memcpy(blk + 2, &m, 2);
            }
        }
    }
    kvp_err err = {0};
    CHECK_MSG(d && be->ops->prepare_weight(be, &w, &err) == 0, "%s", err.msg);
    return w;
}

/* matmul_n gives each weight the bits matmul gives it: one fused pass (one
 * dtype: Q8_0 with its flipped tiles, Q4_1, f16, f32, and Q5_0 on the row
 * path, whose f32 rows each thread keeps in its own slot whatever the
 * weight's rows a task), and the plain calls where the kinds differ, at 1,
 * 3, 9, 16 and 70 tokens (tiles; past KVP_CPU_MM_FUSE_TOK, two token
 * tasks one matmul after another); flags pick the kernels. */
static void test_matmul_n(unsigned flags)
{
    static const int sets[][3] = {{KVP_DTYPE_Q8_0, KVP_DTYPE_Q8_0, KVP_DTYPE_Q8_0},
                                  {KVP_DTYPE_Q4_1, KVP_DTYPE_Q4_1, KVP_DTYPE_Q4_1},
                                  {KVP_DTYPE_F16, KVP_DTYPE_F16, KVP_DTYPE_F16},
                                  {KVP_DTYPE_F32, KVP_DTYPE_F32, KVP_DTYPE_F32},
                                  {KVP_DTYPE_Q5_0, KVP_DTYPE_Q5_0, KVP_DTYPE_Q5_0},
                                  {KVP_DTYPE_Q8_0, KVP_DTYPE_F16, KVP_DTYPE_Q4_1}};
    static const uint32_t outs[3] = {200, 24, 24}, toks[] = {1, 3, 9, 16, 70};
    enum { MT = 70, MO = 200 }; /* Q's tasks take more rows than K's and V's */
    kvp_backend *be = rig_backend(flags);
    uint64_t rng = 0xf05ed;
    if (!be)
        return;
    rig_reserve(be, MT, NI_N, 0, 0, NULL);
    float *x = malloc(sizeof(float) * MT * NI_N), *y1 = malloc(sizeof(float) * MT * MO * 3),
          *y2 = malloc(sizeof(float) * MT * MO * 3);
    CHECK(x && y1 && y2);
    for (size_t i = 0; x && i < (size_t)MT * NI_N; i++)
        x[i] = 2.0f * unit_frand(&rng);
    for (size_t s = 0; x && y1 && y2 && s < sizeof sets / sizeof *sets; s++) {
        kvp_weight w[3];
        const kvp_weight *wp[3];
        float *yp[3];
        for (int j = 0; j < 3; j++)
            w[j] = rand_weight(be, sets[s][j], outs[j], &rng), wp[j] = &w[j], yp[j] = y2 + (size_t)j * MT * MO;
        for (size_t t = 0; t < sizeof toks / sizeof *toks; t++) {
            kvp_err err = {0};
            memset(y1, 0, sizeof(float) * MT * MO * 3);
            memset(y2, 0xff, sizeof(float) * MT * MO * 3);
            for (int j = 0; j < 3; j++)
                CHECK_MSG(be->ops->matmul(be, &w[j], x, y1 + (size_t)j * MT * MO, toks[t], &err) == 0, "%s",
                          err.msg);
            CHECK_MSG(be->ops->matmul_n(be, wp, 3, x, yp, toks[t], &err) == 0, "%s", err.msg);
            for (int j = 0; j < 3; j++)
                CHECK_MSG(memcmp(y1 + (size_t)j * MT * MO, yp[j], sizeof(float) * toks[t] * outs[j]) == 0,
                          "set %zu, weight %d, %u tokens: matmul_n differs from matmul", s, j, toks[t]);
        }
        for (int j = 0; j < 3; j++) {
            be->ops->release_weight(be, &w[j]);
            free((void *)w[j].data);
        }
    }
    free(x), free(y1), free(y2);
    kvp_backend_free(be);
}

/* prepare_weight refuses what the backend cannot multiply, naming it; 1-D
 * f32 weights (norms, biases) and absent ones pass. */
static void test_prepare_refuses(void)
{
    kvp_backend *be = rig_backend(0);
    kvp_err err = {0};
    if (!be)
        return;
    static const uint8_t bytes[64];
    kvp_weight w = {.name = "blk.0.attn_q.weight", .dtype = KVP_DTYPE_I4, .n_in = 64, .n_out = 1, .row_bytes = 32,
                    .data = bytes}; /* i4 with no scales: no values */
    CHECK_EQ_I64(be->ops->prepare_weight(be, &w, &err), KVP_EUNSUPPORTED);
    CHECK_MSG(strstr(err.msg, "blk.0.attn_q.weight") && strstr(err.msg, "i4"), "message: %s", err.msg);
    kvp_weight odd = {.name = "odd", .dtype = 250, .n_in = 64, .n_out = 2, .row_bytes = 64, .data = bytes};
    CHECK_EQ_I64(be->ops->prepare_weight(be, &odd, &err), KVP_EUNSUPPORTED);
    kvp_weight absent = {.name = "bias", .dtype = -1};
    CHECK_EQ_I64(kvp_backend_prepare(be, &absent, &err), 0);
    kvp_weight norm = {.name = "norm", .dtype = KVP_DTYPE_F32, .n_in = 16, .n_out = 1, .row_bytes = 64, .data = bytes};
    CHECK_EQ_I64(kvp_backend_prepare(be, &norm, &err), 0);
    /* a norm weight of the wrong type fails at its op, naming it */
    kvp_weight half = {.name = "norm.half", .dtype = KVP_DTYPE_F16, .n_in = 16, .n_out = 1, .row_bytes = 32,
                       .data = bytes};
    float x[16] = {1}, y[16];
    CHECK_EQ_I64(be->ops->rmsnorm(be, x, &half, y, 1, 16, 1e-5f, &err), KVP_EINVAL);
    CHECK_MSG(strstr(err.msg, "norm.half") != NULL, "message: %s", err.msg);
    kvp_backend_free(be);
}

static void test_supports(void)
{
    kvp_backend *be = rig_backend(0);
    if (!be)
        return;
    const kvp_backend_ops *o = be->ops;
    CHECK(o->supports(be, KVP_USE_MATMUL, KVP_DTYPE_Q4_1, 0));
    CHECK(o->supports(be, KVP_USE_MATMUL, KVP_DTYPE_Q6_K, 0)); /* through f32 rows */
    CHECK(o->supports(be, KVP_USE_MATMUL, KVP_DTYPE_I4, 1));
    CHECK(!o->supports(be, KVP_USE_MATMUL, KVP_DTYPE_I4, 0));
    CHECK(!o->supports(be, KVP_USE_MATMUL, 250, 0));
    CHECK(o->supports(be, KVP_USE_KV, KVP_DTYPE_FP8_E4M3, 1));
    CHECK(o->supports(be, KVP_USE_KV, KVP_DTYPE_BF16, 0));
    CHECK(!o->supports(be, KVP_USE_KV, KVP_DTYPE_Q4_0, 0));
    CHECK(!o->supports(be, 99, KVP_DTYPE_F32, 0));
    kvp_backend_free(be);
}

static void test_gather_rows(void)
{
    kvp_backend *be = rig_backend(0);
    kvp_err err = {0};
    if (!be)
        return;
    float src[5 * 3], dst[3 * 3];
    for (int i = 0; i < 15; i++)
        src[i] = (float)i;
    const uint32_t rows[3] = {4, 0, 2};
    CHECK(be->ops->gather_rows(be, dst, src, rows, 3, 3, &err) == 0);
    const float want[9] = {12, 13, 14, 0, 1, 2, 6, 7, 8};
    CHECK(memcmp(dst, want, sizeof want) == 0);
    kvp_backend_free(be);
}

static void test_registry(void)
{
    kvp_backend *be = NULL;
    kvp_err err = {0};
    kvp_backend_config cfg = {.n_threads = 1};
    CHECK(kvp_backend_open(&be, "cpu", &cfg, &err) == 0 && be && !strcmp(be->ops->name, "cpu"));
    if (be)
        test_table_whole(be->ops);
    kvp_backend_free(be);
    be = NULL;
    CHECK_EQ_I64(kvp_backend_open(&be, "tpu", &cfg, &err), KVP_EINVAL);
    CHECK_MSG(strstr(err.msg, "tpu") && strstr(err.msg, kvp_backend_names()), "message: %s", err.msg);
    CHECK(be == NULL);
    int rc = kvp_backend_open(&be, "cuda", &cfg, &err);
    if (rc == 0) {
        printf("cuda backend opened: a GPU is here\n");
        test_table_whole(be->ops);
    } else {
        CHECK_EQ_I64(rc, KVP_EUNSUPPORTED);
        CHECK_MSG(strstr(err.msg, "cuda") != NULL, "message: %s", err.msg);
        printf("cuda: %s\n", err.msg);
    }
    kvp_backend_free(be);
    CHECK(strstr(kvp_backend_names(), "cpu") == kvp_backend_names());
}

/* The elementwise ops of a step of many tokens split over the threads
 * (RMSNorm and RoPE by tokens, add and SiLU-mul by elements): two threads
 * give the bits one gives, for every token, at sizes past the split's
 * threshold and with lengths that leave SIMD tails; and the norm is the
 * formula's (so a piece skipped or done twice would show). */
static void test_elementwise_split(void)
{
    enum { T = 67, N = 576, H = 9, HD = 64, F = 1536 * 64 + 37 };
    kvp_err err = {0};
    kvp_backend *be[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++)
        if (kvp_backend_cpu_create(&be[k], k + 1, 0, &err) < 0) {
            CHECK_MSG(0, "backend: %s", err.msg);
            kvp_backend_free(be[0]);
            return;
        }
    float *x = malloc(sizeof(float) * F), *u = malloc(sizeof(float) * F), *out[2], *g[2];
    float nw[N], freq[HD / 2];
    int32_t pos[T];
    out[0] = malloc(sizeof(float) * T * H * HD), out[1] = malloc(sizeof(float) * T * H * HD);
    g[0] = malloc(sizeof(float) * F), g[1] = malloc(sizeof(float) * F);
    if (!x || !u || !out[0] || !out[1] || !g[0] || !g[1]) {
        CHECK(0);
        goto out;
    }
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < F; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((int64_t)(r >> 40) - (1 << 23)) / (float)(1 << 21);
        u[i] = x[i] * 0.5f - 0.25f;
    }
    for (int i = 0; i < N; i++)
        nw[i] = 0.5f + (float)i / N;
    for (int i = 0; i < HD / 2; i++)
        freq[i] = powf(10000.0f, -2.0f * (float)i / HD);
    for (int t = 0; t < T; t++)
        pos[t] = t * 37 + 5;
    kvp_weight wn = {.name = "norm", .dtype = KVP_DTYPE_F32, .n_in = N, .n_out = 1, .row_bytes = N * 4, .data = nw};
    kvp_weight wf = {.name = "freq", .dtype = KVP_DTYPE_F32, .n_in = HD / 2, .n_out = 1, .row_bytes = HD * 2,
                     .data = freq};
    for (int k = 0; k < 2; k++) {
        CHECK(be[k]->ops->rmsnorm(be[k], x, &wn, out[k], T, N, 1e-5f, &err) == 0);
        CHECK(be[k]->ops->rope(be[k], out[k], T, N / HD, HD, HD, pos, &wf, KVP_ROPE_KIND_NEOX, &err) == 0);
        memcpy(g[k], x, sizeof(float) * F);
        CHECK(be[k]->ops->silu_mul(be[k], g[k], u, F, &err) == 0);
        CHECK(be[k]->ops->add(be[k], g[k], u, F, &err) == 0);
    }
    CHECK_MSG(memcmp(out[0], out[1], sizeof(float) * T * N) == 0, "RMSNorm and RoPE: 2 threads differ from 1");
    CHECK_MSG(memcmp(g[0], g[1], sizeof(float) * F) == 0, "SiLU-mul and add: 2 threads differ from 1");
    /* the last token's norm before RoPE, against the formula */
    CHECK(be[1]->ops->rmsnorm(be[1], x, &wn, out[1], T, N, 1e-5f, &err) == 0);
    double ss = 0;
    const float *xl = x + (size_t)(T - 1) * N;
    for (int i = 0; i < N; i++)
        ss += (double)xl[i] * xl[i];
    float sc = (float)(1.0 / sqrt(ss / N + 1e-5));
    int near = 1;
    for (int i = 0; i < N; i++)
        near &= fabsf(out[1][(size_t)(T - 1) * N + i] - xl[i] * sc * nw[i]) <= 1e-5f * (1.0f + fabsf(xl[i]));
    CHECK_MSG(near, "RMSNorm of the last token is not the formula's");
    /* the last element went through SiLU-mul and the add */
    float e = x[F - 1] / (1.0f + expf(-x[F - 1])) * u[F - 1] + u[F - 1];
    CHECK_MSG(fabsf(g[1][F - 1] - e) <= 1e-5f * (1.0f + fabsf(e)), "last element %g, want %g", g[1][F - 1], e);
out:
    free(x), free(u), free(out[0]), free(out[1]), free(g[0]), free(g[1]);
    kvp_backend_free(be[0]), kvp_backend_free(be[1]);
}

/* Two descriptors of one stored tensor (two engines over one model, or
 * layerskip's over its first layers) share what prepare_weight made for
 * it: one rewrite (rows of 16, Q4_K as int4) whoever multiplies first, the
 * same bits through either, still there for the one left when the other
 * is released (ASan sees a use after free otherwise); another tensor gets
 * its own. */
static void test_shared_prepare(void)
{
    kvp_backend *be = rig_backend(0);
    uint64_t rng = 0x5a4ed;
    if (!be)
        return;
    rig_reserve(be, 8, NI_N, 0, 0, NULL);
    float x[3 * NI_N], y1[3 * 40], y2[3 * 40];
    for (size_t i = 0; i < sizeof x / sizeof *x; i++)
        x[i] = unit_frand(&rng);
    static const int kinds[] = {KVP_DTYPE_Q8_0, KVP_DTYPE_Q4_1, KVP_DTYPE_Q5_0};
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        kvp_err err = {0};
        kvp_weight a = rand_weight(be, kinds[k], 40, &rng), b = a, c = rand_weight(be, kinds[k], 40, &rng);
        b.dev = NULL;
        CHECK_MSG(be->ops->prepare_weight(be, &b, &err) == 0, "%s", err.msg);
        /* rewritten (rows of 16 with AVX512-VNNI; Q5_0 as Q8_0 on any table): made once */
        int shares = a.dev != NULL && (kinds[k] == KVP_DTYPE_Q5_0 || kvp_cpu_kernels_vnni());
        CHECK_MSG(!shares || (b.dev == a.dev && c.dev != a.dev), "%s: the second descriptor got %s",
                  kvp_dtype_name((uint32_t)kinds[k]), b.dev == a.dev ? "the first's (the other tensor too)" : "its own");
        CHECK(be->ops->matmul(be, &b, x, y1, 3, &err) == 0);
        CHECK(be->ops->matmul(be, &a, x, y2, 3, &err) == 0);
        CHECK(memcmp(y1, y2, sizeof y1) == 0);
        be->ops->release_weight(be, &a);
        CHECK(a.dev == NULL);
        memset(y2, 0xff, sizeof y2);
        CHECK(be->ops->matmul(be, &b, x, y2, 3, &err) == 0);
        CHECK_MSG(memcmp(y1, y2, sizeof y1) == 0, "%s: the descriptor left gives other bits",
                  kvp_dtype_name((uint32_t)kinds[k]));
        be->ops->release_weight(be, &b);
        be->ops->release_weight(be, &c);
        free((void *)a.data), free((void *)c.data);
    }
    kvp_backend_free(be);
}

/* prepare_weight makes the form a weight's products take (rows of 16, Q5_0
 * as Q8_0) there and then, so an engine's first step does not pay for it
 * (the first request's TTFT did: 1.7 s of a 1.1B Q4_K_M): after it the
 * stored bytes are not read by a product, here overwritten to show it.  A
 * weight only looked up (kvp_weight.lookup) is not rewritten: its rows are
 * read from the stored bytes. */
static void test_prepare_rewrites_now(void)
{
    kvp_backend *be = rig_backend(0);
    uint64_t rng = 0x9e3a;
    if (!be)
        return;
    rig_reserve(be, 8, NI_N, 0, 0, NULL);
    float x[2 * NI_N], y1[2 * 40], y2[2 * 40], e1[NI_N], e2[NI_N];
    for (size_t i = 0; i < sizeof x / sizeof *x; i++)
        x[i] = unit_frand(&rng);
    static const int kinds[] = {KVP_DTYPE_Q8_0, KVP_DTYPE_Q4_1, KVP_DTYPE_Q5_0};
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        if (kinds[k] != KVP_DTYPE_Q5_0 && !kvp_cpu_kernels_vnni())
            continue; /* multiplied as stored: nothing to rewrite */
        kvp_err err = {0};
        const char *name = kvp_dtype_name((uint32_t)kinds[k]);
        kvp_weight a = rand_weight(be, kinds[k], 40, &rng), ref = a, look = a; /* a: prepared */
        ref.dev = look.dev = NULL;
        size_t bytes = (size_t)a.row_bytes * a.n_out;
        void *orig = malloc(bytes), *seen = malloc(bytes);
        if (!orig || !seen || !a.data) {
            CHECK(0);
            free(orig), free(seen), free((void *)a.data);
            break;
        }
        memcpy(orig, a.data, bytes);
        ref.data = orig;
        look.data = seen;
        memcpy(seen, a.data, bytes);
        look.lookup = 1;
        CHECK_MSG(be->ops->prepare_weight(be, &look, &err) == 0, "%s", err.msg);
        /* the stored bytes changed after prepare: a product does not see it */
        memset((void *)a.data, 0x5b, bytes);
        memset(seen, 0x5b, bytes);
        CHECK(be->ops->matmul(be, &a, x, y1, 2, &err) == 0);
        CHECK_MSG(be->ops->prepare_weight(be, &ref, &err) == 0, "%s", err.msg);
        CHECK(be->ops->matmul(be, &ref, x, y2, 2, &err) == 0);
        CHECK_MSG(memcmp(y1, y2, sizeof y1) == 0, "%s: a product read the stored bytes after prepare_weight", name);
        /* the looked-up weight: rows as the bytes are now */
        int32_t tok = 7;
        kvp_weight now = look;
        now.dev = NULL, now.lookup = 0;
        CHECK(be->ops->embed(be, &look, &tok, 1, e1, &err) == 0);
        CHECK(be->ops->embed(be, &now, &tok, 1, e2, &err) == 0);
        CHECK_MSG(memcmp(e1, e2, sizeof e1) == 0, "%s: a looked-up weight was read from another form", name);
        be->ops->release_weight(be, &a);
        be->ops->release_weight(be, &look);
        be->ops->release_weight(be, &ref);
        free((void *)a.data), free(orig), free(seen);
    }
    kvp_backend_free(be);
}

int main(void)
{
    char dir[] = "/tmp/kvp_test_backend.XXXXXX", path[512];
    uint64_t rng = 0x5eed;
    test_registry();
    test_supports();
    test_gather_rows();
    test_elementwise_split();
    test_prepare_refuses();
    test_reserve_bounds();
    test_matmul_n(0);
    test_matmul_n(KVP_CPU_PORTABLE); /* slower tasks: the threads' overlap is longer */
    test_shared_prepare();
    test_prepare_rewrites_now();
    test_table_whole(&fence_ops);
    if (!mkdtemp(dir)) {
        CHECK(0);
        return unit_done();
    }
    /* q8_0: its block sums are prepared data (flipped tiles), f32 norms */
    tiny_cfg c = {.n_layer = 2, .n_embd = 64, .n_ff = 128, .n_head = 4, .n_head_kv = 2, .n_vocab = 50,
                  .wtype = KVP_DTYPE_Q8_0, .amp = 0.5f};
    snprintf(path, sizeof path, "%s/fence.gguf", dir);
    CHECK(tiny_write(path, &c, &rng) == 0);
    test_engine_fenced(path);
    unlink(path);
    rmdir(dir);
    return unit_done();
}
