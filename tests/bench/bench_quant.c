/* bench_quant.c - conversion throughput of the quant module, for
 * scripts/bench-quant (which compiles it against libkvpipe.a and puts numpy /
 * ml_dtypes beside it).  Not a test: it prints timings, it asserts nothing.
 *
 * Usage: bench_quant ROWS COLS THREADS
 * Prints one TSV line per case: name, seconds (best of 5), GB/s of f16 input.
 * Cases start from f16 data (a [ROWS, COLS] weight) and include the f16 -> f32
 * widening the quantize program does before scaling. */
#include "quant.h"
#include "threadpool.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct widen_ctx {
    const uint8_t *h;
    float *x;
    int64_t n;
} widen_ctx;

static void widen_task(void *ctx, int task, int thread)
{
    (void)thread;
    widen_ctx *c = ctx;
    int64_t a = (int64_t)task * 65536, b = a + 65536 < c->n ? a + 65536 : c->n;
    kvp_f16_row_to_f32(KVP_IMPL_AUTO, c->h + 2 * a, c->x + a, b - a);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: bench_quant ROWS COLS THREADS\n");
        return 2;
    }
    int64_t rows = atoll(argv[1]), cols = atoll(argv[2]), n = rows * cols;
    int threads = atoi(argv[3]);
    kvp_err err = {0};
    kvp_threadpool *pool = NULL;
    if (threads > 1 && kvp_threadpool_create(&pool, threads, &err) < 0) {
        fprintf(stderr, "bench_quant: %s\n", err.msg);
        return 1;
    }
    uint8_t *h = malloc((size_t)n * 2), *out = malloc((size_t)n * 2 + 64), *sc = malloc((size_t)n / 8 + 64);
    float *x = malloc((size_t)n * sizeof *x);
    uint64_t s = 12345;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = ((float)((s >> 40) & 0xffffff) / 16777216.0f - 0.5f) * 0.1f;
    }
    kvp_quant_convert(KVP_DTYPE_F32, x, KVP_DTYPE_F16, h, n, &err);
    static const struct { const char *name; uint32_t dtype, scheme, group; } cases[] = {
        {"f16->fp8_e4m3 (cast)", KVP_DTYPE_FP8_E4M3, KVP_SCHEME_NONE, 0},
        {"f16->fp8_e4m3 (tensor scale)", KVP_DTYPE_FP8_E4M3, KVP_SCHEME_TENSOR, 0},
        {"f16->int8 (channel)", KVP_DTYPE_I8, KVP_SCHEME_CHANNEL, 0},
        {"f16->int4 (group 32)", KVP_DTYPE_I4, KVP_SCHEME_GROUP, 32},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        double best = 1e30;
        for (int rep = 0; rep < 5; rep++) {
            kvp_tensor_rec rec = {.n_dim = 2, .shape = {(uint64_t)rows, (uint64_t)cols}};
            snprintf(rec.name, sizeof rec.name, "bench");
            kvp_quant_spec spec = {cases[k].dtype, cases[k].scheme, cases[k].group, 0, 0};
            double t0 = now();
            widen_ctx wc = {h, x, n};
            kvp_threadpool_run(pool, widen_task, &wc, (int)((n + 65535) / 65536));
            if (kvp_quant_plan(&rec, &spec, &err) < 0 ||
                kvp_quant_tensor(&rec, x, out, sc, NULL, NULL, pool, &err) < 0) {
                fprintf(stderr, "bench_quant: %s\n", err.msg);
                return 1;
            }
            double t = now() - t0;
            best = t < best ? t : best;
        }
        printf("%s\t%.6f\t%.3f\n", cases[k].name, best, (double)n * 2 / best / 1e9);
    }
    kvp_threadpool_free(pool);
    free(h);
    free(out);
    free(sc);
    free(x);
    return 0;
}
