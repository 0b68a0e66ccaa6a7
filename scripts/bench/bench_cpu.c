/* bench_cpu.c - prompt processing (ppN) and generation (tgN) tokens/s of the
 * kvpipe CPU engine, plus the memory-copy bandwidth measured in the same run.
 * Built and run by scripts/bench-cpu; prints one TSV line per figure:
 *   kvpipe  pp512  <tokens/s>
 *   kvpipe  tg128  <tokens/s>
 *   memcpy  GB/s   <GB/s>   (bytes read + written by one memcpy)
 *   read    GB/s   <GB/s>   (bytes read by THREADS threads)
 *   fma     GFLOP/s <GFLOP/s> (f32 multiply-adds THREADS threads retire)
 *   flops   ppN    <FLOPs>  (the arithmetic of one ppN prompt)
 * and with DEPTH, generation continuing a DEPTH-token prompt:
 *   kvpipe  tg128@2048  <tokens/s>
 * TG 0 measures prompts alone; KVP_BENCH_NO_AMX=1 keeps AMX out (the VNNI
 * kernels take prompts: the same bits), for ppN with and without it.
 * Usage: bench_cpu MODEL THREADS PP TG REPS [DEPTH [KV_DTYPE]] */
#include "backend_cpu.h"
#include "engine.h"
#include "threadpool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void die(const kvp_err *e)
{
    fprintf(stderr, "bench_cpu: %s\n", e->msg);
    exit(1);
}

/* Read bandwidth: tasks each summing their slice of a buffer, as a
 * generation step reads its weights (nothing written back). */
typedef struct read_ctx {
    const uint64_t *p;
    size_t per;            /* words a task */
    uint64_t sums[64];
} read_ctx;

static void read_task(void *ctxp, int task, int thread)
{
    (void)thread;
    read_ctx *c = ctxp;
    const uint64_t *p = c->p + (size_t)task * c->per;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= c->per; i += 4)
        s0 += p[i], s1 += p[i + 1], s2 += p[i + 2], s3 += p[i + 3];
    c->sums[task] = s0 + s1 + s2 + s3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* giga units of work over the seconds of one run of fn's tasks on pool:
 * the median of 5 runs (a best-of once gave twice the others on a shared
 * host). */
static double median_rate(kvp_threadpool *pool, kvp_task_fn fn, void *ctx, int tasks, double giga)
{
    double g[5];
    for (int r = 0; r < 5; r++) {
        double t0 = now();
        kvp_threadpool_run(pool, fn, ctx, tasks);
        g[r] = giga / (now() - t0);
    }
    qsort(g, 5, sizeof g[0], cmp_double);
    return g[2];
}

/* GB/s read from a 256 MiB buffer by n_threads threads. */

static double read_bandwidth(int n_threads)
{
    size_t n = (size_t)256 << 20;
    uint64_t *buf = malloc(n);
    kvp_threadpool *pool = NULL;
    kvp_err err = {0};
    if (!buf || (n_threads > 1 && kvp_threadpool_create(&pool, n_threads, &err) < 0)) {
        free(buf);
        return 0;
    }
    memset(buf, 1, n);
    int tasks = n_threads * 4 <= 64 ? n_threads * 4 : 64;
    read_ctx c = {.p = buf, .per = n / 8 / (size_t)tasks};
    double bw = median_rate(pool, read_task, &c, tasks, (double)c.per * 8 * (double)tasks / 1e9);
    buf[0] += c.sums[0]; /* the sums are used */
    kvp_threadpool_free(pool);
    free(buf);
    return bw;
}

/* The f32 FMA ceiling: each task runs 16 independent chains of
 * multiply-adds in registers (no loads), the most a core's FMA units can
 * retire.  A float prompt's matmuls cannot run faster than this, as
 * generation cannot read faster than read_bandwidth: the two ceilings
 * bench-cpu sets each engine's figures against.  Both widths are measured
 * (Zen 4 runs a 512-bit FMA as two 256-bit halves, Xeons have two 512-bit
 * units); the larger counts. */
#define FMA_STEPS 4000000L
#if defined(__x86_64__) && defined(__GNUC__)
/* chains from 16 different values, or the compiler folds them into one;
 * their sum in s, so none is optimized away */
#define FMA_CHAINS(V, SET, FMA, ADD)                                                                                \
    V a0 = SET(seed), a1 = SET(seed + 1), a2 = SET(seed + 2), a3 = SET(seed + 3);                                   \
    V a4 = SET(seed + 4), a5 = SET(seed + 5), a6 = SET(seed + 6), a7 = SET(seed + 7);                               \
    V a8 = SET(seed + 8), a9 = SET(seed + 9), a10 = SET(seed + 10), a11 = SET(seed + 11);                           \
    V a12 = SET(seed + 12), a13 = SET(seed + 13), a14 = SET(seed + 14), a15 = SET(seed + 15);                       \
    for (long i = 0; i < FMA_STEPS; i++) {                                                                          \
        a0 = FMA(a0, m, c), a1 = FMA(a1, m, c), a2 = FMA(a2, m, c), a3 = FMA(a3, m, c);                             \
        a4 = FMA(a4, m, c), a5 = FMA(a5, m, c), a6 = FMA(a6, m, c), a7 = FMA(a7, m, c);                             \
        a8 = FMA(a8, m, c), a9 = FMA(a9, m, c), a10 = FMA(a10, m, c), a11 = FMA(a11, m, c);                         \
        a12 = FMA(a12, m, c), a13 = FMA(a13, m, c), a14 = FMA(a14, m, c), a15 = FMA(a15, m, c);                     \
    }                                                                                                               \
    V s = ADD(ADD(ADD(ADD(a0, a1), ADD(a2, a3)), ADD(ADD(a4, a5), ADD(a6, a7))),                                    \
              ADD(ADD(ADD(a8, a9), ADD(a10, a11)), ADD(ADD(a12, a13), ADD(a14, a15))));

__attribute__((target("avx512f"))) static float fma_chains512(float seed)
{
    const __m512 m = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-3f);
    FMA_CHAINS(__m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps)
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static float fma_chains256(float seed)
{
    const __m256 m = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-3f);
    FMA_CHAINS(__m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps)
    float v[8];
    _mm256_storeu_ps(v, s);
    return v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
}

typedef struct fma_ctx {
    int wide;        /* 512-bit chains, else 256-bit */
    float out[64];
} fma_ctx;

static void fma_task(void *ctxp, int task, int thread)
{
    (void)thread;
    fma_ctx *c = ctxp;
    c->out[task] = c->wide ? fma_chains512((float)task) : fma_chains256((float)task);
}

/* GFLOP/s of n_threads threads, one task each, the median of 5 a width
 * (median_rate). */
static double fma_ceiling(int n_threads)
{
    __builtin_cpu_init();
    kvp_threadpool *pool = NULL;
    kvp_err err = {0};
    int tasks = n_threads <= 64 ? n_threads : 64;
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") ||
        (tasks > 1 && kvp_threadpool_create(&pool, tasks, &err) < 0))
        return 0;
    double best = 0;
    for (int wide = 0; wide <= !!__builtin_cpu_supports("avx512f"); wide++) {
        fma_ctx c = {.wide = wide};
        double g = median_rate(pool, fma_task, &c, tasks, (double)FMA_STEPS * 16 * (wide ? 16 : 8) * 2 * tasks / 1e9);
        best = g > best ? g : best;
        if (c.out[0] == 12345.0f) /* the sums are used */
            best += 1e-9;
    }
    kvp_threadpool_free(pool);
    return best;
}
#else
static double fma_ceiling(int n_threads) { (void)n_threads; return 0; }
#endif

/* The multiply-adds of one prompt of n tokens, twice (a FLOP each):
 * every layer's projections, attention over the causal triangle (Q.K and
 * the weighted V), and the output head for the last token, whose logits
 * alone the prompt step computes.  Dense models only (bench-cpu's). */
static double prompt_flops(const kvp_config *c, double n)
{
    double d = c->n_embd, q = (double)c->n_head * c->head_dim, kv = (double)c->n_head_kv * c->head_dim;
    double proj = d * q + 2 * d * kv + q * d + 3 * d * c->n_ff;
    double att = 2.0 * q * n * (n + 1) / 2;
    return 2 * (c->n_layer * (proj * n + att) + d * c->n_vocab);
}

/* Seconds to generate n tokens greedily, one a step, after prefilling
 * prompt[0..depth) (untimed; none for depth 0, like llama-bench's tg). */
static double gen_after(kvp_engine *e, kvp_kvcache *kc, const uint32_t *prompt, uint32_t depth, uint32_t n,
                        float *lg, uint32_t V)
{
    kvp_err err = {0};
    int s = kvp_kvcache_seq_new(kc, &err);
    kvp_step_seq st = {.seq = s, .tokens = prompt, .n_tokens = depth, .want = KVP_LOGITS_LAST};
    if (depth > 0 && kvp_engine_step(e, &st, 1, lg, &err) < 0)
        die(&err);
    uint32_t tok = 1;
    double t0 = now();
    for (uint32_t i = 0; i < n; i++) {
        kvp_step_seq one = {.seq = s, .tokens = &tok, .n_tokens = 1, .want = KVP_LOGITS_LAST};
        if (kvp_engine_step(e, &one, 1, lg, &err) < 0)
            die(&err);
        uint32_t b = 0;
        for (uint32_t j = 1; j < V; j++)
            b = lg[j] > lg[b] ? j : b;
        tok = b;
    }
    double t = now() - t0;
    kvp_kvcache_seq_free(kc, s);
    return t;
}

int main(int argc, char **argv)
{
    if (argc < 6 || argc > 8) {
        fprintf(stderr, "usage: bench_cpu MODEL THREADS PP TG REPS [DEPTH [KV_DTYPE]]\n");
        return 2;
    }
    int threads = atoi(argv[2]), pp = atoi(argv[3]), tg = atoi(argv[4]), reps = atoi(argv[5]);
    int depth = argc >= 7 ? atoi(argv[6]) : 0;
    kvp_err err = {0};
    kvp_model *m;
    kvp_backend *be;
    kvp_kvcache *kc;
    kvp_engine *e;
    /* KVP_BENCH_NO_AMX=1: the VNNI kernels where AMX would take prompts (same bits, for pp with and without) */
    const char *no_amx = getenv("KVP_BENCH_NO_AMX");
    unsigned flags = no_amx && !strcmp(no_amx, "1") ? KVP_CPU_NO_AMX : 0;
    /* KVP_BENCH_AS_STORED=1: Q8_0, Q4_0, Q4_1 multiplied as stored, not in rows of 16 (same bits) */
    const char *stored = getenv("KVP_BENCH_AS_STORED");
    flags |= stored && !strcmp(stored, "1") ? KVP_CPU_AS_STORED : 0;
    if (kvp_model_load(&m, argv[1], &err) < 0 || kvp_backend_cpu_create(&be, threads, flags, &err) < 0)
        die(&err);
    kvp_kvcache_opts o;
    kvp_kvcache_opts_init(&o);
    if (argc == 8 && (o.dtype = kvp_dtype_from_name(argv[7])) < 0) {
        fprintf(stderr, "bench_cpu: %s: not a KV dtype\n", argv[7]);
        return 2;
    }
    o.n_blocks = (uint64_t)((pp > depth ? pp : depth) + tg + 64) / 16 + 4;
    if (kvp_kvcache_create(&kc, &m->cfg, &o, be, &err) < 0 || kvp_engine_create(&e, m, be, kc, &err) < 0)
        die(&err);
    int n_toks = pp > depth ? pp : depth;
    uint32_t V = m->cfg.n_vocab, *toks = malloc(sizeof(uint32_t) * (size_t)n_toks);
    float *lg = malloc(sizeof(float) * V);
    for (int i = 0; i < n_toks; i++)
        toks[i] = (uint32_t)(i * 7919 + 13) % V;
    double best_pp = 0, best_tg = 0, best_deep = 0;
    for (int r = 0; r < reps; r++) {
        int s = kvp_kvcache_seq_new(kc, &err);
        kvp_step_seq st = {.seq = s, .tokens = toks, .n_tokens = (uint32_t)pp, .want = KVP_LOGITS_LAST};
        double t0 = now();
        if (kvp_engine_step(e, &st, 1, lg, &err) < 0)
            die(&err);
        double t1 = now();
        kvp_kvcache_seq_free(kc, s);
        best_pp = pp / (t1 - t0) > best_pp ? pp / (t1 - t0) : best_pp;
        if (tg == 0) /* prompts only */
            continue;
        double t = gen_after(e, kc, toks, 0, (uint32_t)tg, lg, V);
        best_tg = tg / t > best_tg ? tg / t : best_tg;
        if (depth > 0) { /* tg continuing a DEPTH-token prompt */
            t = gen_after(e, kc, toks, (uint32_t)depth, (uint32_t)tg, lg, V);
            best_deep = tg / t > best_deep ? tg / t : best_deep;
        }
    }
    /* memory bandwidth: bytes read + written by memcpy of 256 MiB */
    size_t n = (size_t)256 << 20;
    char *a = malloc(n), *b = malloc(n);
    memset(a, 1, n);
    memset(b, 2, n);
    double bw = 0;
    for (int r = 0; r < 3; r++) {
        double t0 = now();
        memcpy(b, a, n);
        double t1 = now();
        bw = 2.0 * (double)n / (t1 - t0) / 1e9 > bw ? 2.0 * (double)n / (t1 - t0) / 1e9 : bw;
        a[r] = b[n - 1 - (size_t)r];
    }
    printf("kvpipe\tpp%d\t%.2f\n", pp, best_pp);
    if (tg > 0)
        printf("kvpipe\ttg%d\t%.2f\n", tg, best_tg);
    if (depth > 0)
        printf("kvpipe\ttg%d@%d\t%.2f\n", tg, depth, best_deep);
    printf("memcpy\tGB/s\t%.2f\n", bw);
    printf("read\tGB/s\t%.2f\n", read_bandwidth(threads));
    double fma = fma_ceiling(threads);
    if (fma > 0)
        printf("fma\tGFLOP/s\t%.1f\n", fma);
    printf("flops\tpp%d\t%.6g\n", pp, prompt_flops(&m->cfg, pp));
    printf("kvpipe\tisa\t%s\n", kvp_backend_cpu_isa(be));
    free(a), free(b), free(toks), free(lg);
    kvp_engine_free(e);
    kvp_kvcache_free(kc);
    kvp_backend_free(be);
    kvp_model_free(m);
    return 0;
}
