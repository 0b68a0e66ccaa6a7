/* bench_mm.c - the CPU backend's matmul time against the tokens in a step,
 * for scripts/bench-mm (which compiles it against libkvpipe.a).  Not a
 * test: it prints timings, it asserts nothing.
 *
 * Usage: bench_mm DTYPE N_OUT N_IN THREADS MAX_TOK
 * DTYPE is q4_0, q4_1, q8_0 or f16; the weight holds random bytes of that
 * type (scales kept small and finite).  Pick N_OUT x N_IN larger than the
 * last-level cache to see a generation step as it runs on a real model:
 * every call then reads the weight from memory.  Prints one TSV line per
 * token count 1..MAX_TOK: tokens, ms a call (best of 7 rounds of several
 * calls), the weight's GB/s, and the call's cost over a one-token call.
 * KVP_BENCH_NO_AMX=1 keeps AMX out (backend_cpu.h). */
#include "bench.h"
#include "backend_cpu.h"
#include "tensor.h"
#include "minifloat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bytes a row of n elements takes in dtype, and the offset of each 32-block's
 * f16 scales (the rest random quants); 0 for an unknown name. */
static int pick(const char *name, int *dtype, size_t *blk, size_t *n_scales)
{
    if (!strcmp(name, "q4_0"))
        *dtype = KVP_DTYPE_Q4_0, *blk = 18, *n_scales = 1;
    else if (!strcmp(name, "q4_1"))
        *dtype = KVP_DTYPE_Q4_1, *blk = 20, *n_scales = 2;
    else if (!strcmp(name, "q8_0"))
        *dtype = KVP_DTYPE_Q8_0, *blk = 34, *n_scales = 1;
    else if (!strcmp(name, "f16"))
        *dtype = KVP_DTYPE_F16, *blk = 64, *n_scales = 0;
    else
        return 0;
    return 1;
}

/* The weight's bytes: random, each block's scales (or every f16 element)
 * a small finite half. */
static void fill(uint8_t *d, size_t bytes, size_t blk, size_t n_scales, int dtype)
{
    uint64_t s = 42;
    for (size_t i = 0; i < bytes; i++)
        d[i] = (uint8_t)bench_next(&s);
    for (size_t o = 0; o + blk <= bytes; o += blk)
        if (dtype == KVP_DTYPE_F16)
            for (size_t e = 0; e < blk; e += 2) {
                uint16_t h = kvp_f32_to_f16(bench_frand(&s));
                memcpy(d + o + e, &h, 2);
            }
        else
            for (size_t k = 0; k < n_scales; k++) {
                uint16_t h = kvp_f32_to_f16(0.001f * (float)(1 + bench_next(&s) % 16));
                memcpy(d + o + 2 * k, &h, 2);
            }
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: bench_mm DTYPE N_OUT N_IN THREADS MAX_TOK\n");
        return 2;
    }
    int dtype, threads = atoi(argv[4]);
    size_t blk, n_scales;
    uint32_t n_out = (uint32_t)atol(argv[2]), n_in = (uint32_t)atol(argv[3]), max_tok = (uint32_t)atol(argv[5]);
    if (!pick(argv[1], &dtype, &blk, &n_scales) || !n_out || !n_in || n_in % 32 || threads < 1 || !max_tok ||
        max_tok > 512) {
        fprintf(stderr, "bench_mm: DTYPE is q4_0, q4_1, q8_0 or f16; N_IN a multiple of 32; MAX_TOK 1..512\n");
        return 2;
    }
    size_t row = dtype == KVP_DTYPE_F16 ? (size_t)n_in * 2 : (size_t)n_in / 32 * blk, bytes = row * n_out;
    uint8_t *data = malloc(bytes);
    float *x = malloc((size_t)max_tok * n_in * sizeof(float)), *y = malloc((size_t)max_tok * n_out * sizeof(float));
    kvp_backend *be = NULL;
    kvp_err err = {0};
    if (!data || !x || !y) {
        fprintf(stderr, "bench_mm: out of memory\n");
        return 1;
    }
    fill(data, bytes, blk, n_scales, dtype);
    uint64_t s = 7;
    for (size_t i = 0; i < (size_t)max_tok * n_in; i++)
        x[i] = bench_frand(&s);
    kvp_weight w = {.name = "bench", .dtype = dtype, .n_in = n_in, .n_out = n_out, .row_bytes = row, .data = data};
    kvp_backend_reserve r = {.max_tok = max_tok, .max_n_in = n_in};
    /* KVP_BENCH_NO_AMX=1: the VNNI kernels where AMX would take the call */
    const char *no_amx = getenv("KVP_BENCH_NO_AMX");
    unsigned flags = no_amx && !strcmp(no_amx, "1") ? KVP_CPU_NO_AMX : 0;
    /* KVP_BENCH_AS_STORED=1: Q8_0, Q4_0, Q4_1 multiplied as stored, not in rows of 16 (same bits) */
    const char *stored = getenv("KVP_BENCH_AS_STORED");
    flags |= stored && !strcmp(stored, "1") ? KVP_CPU_AS_STORED : 0;
    if (kvp_backend_cpu_create(&be, threads, flags, &err) < 0 || be->ops->prepare_weight(be, &w, &err) < 0 ||
        be->ops->reserve(be, &r, &err) < 0) {
        fprintf(stderr, "bench_mm: %s\n", err.msg);
        return 1;
    }
    /* calls a round: about 50 MB of weight read, at least 3 */
    int calls = (int)(50e6 / (double)bytes) + 3;
    double one = 0;
    printf("tokens\tms\tGB/s\tvs_1\n");
    for (uint32_t nt = 1; nt <= max_tok; nt++) {
        double best = 1e30;
        for (int round = 0; round < 7; round++) {
            double t0 = bench_now();
            for (int c = 0; c < calls; c++)
                if (be->ops->matmul(be, &w, x, y, nt, &err) < 0) {
                    fprintf(stderr, "bench_mm: %s\n", err.msg);
                    return 1;
                }
            double t = (bench_now() - t0) / calls;
            best = t < best ? t : best;
        }
        if (nt == 1)
            one = best;
        printf("%u\t%.3f\t%.1f\t%.2f\n", nt, best * 1e3, (double)bytes / best / 1e9, best / one);
    }
    be->ops->release_weight(be, &w);
    be->ops->destroy(be);
    free(data), free(x), free(y);
    return 0;
}
