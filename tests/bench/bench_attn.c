/* bench_attn.c - the CPU backend's attention for decode steps, for
 * scripts/bench-attn (which compiles it against libkvpipe.a).  Not a test:
 * it prints timings, it asserts nothing.
 *
 * Usage: bench_attn [-v] CTX BATCH THREADS [LAYERS] [N_HEAD_KV N_REP HEAD_DIM]
 * BATCH sequences of CTX tokens each (an f16 cache of 16-token blocks,
 * LAYERS layers (default 1), random K/V), then one decode token per
 * sequence attending to all of its keys, one layer after another: the
 * attention of a decode step.  With -v, one sequence's last BATCH tokens
 * instead, each seeing the keys up to its own: a speculative verify step.  With one layer the K/V stay in the CPU's
 * caches from call to call; a model's layers (SmolLM2: 30) at a long
 * context do not, as in generation.  Defaults: SmolLM2's heads (3 KV
 * heads, 3 query heads each, 64 wide).  Prints ms a layer (the least of
 * many rounds: the host's noise only ever adds), the K/V bytes a layer
 * reads and that as GB/s. */
#include "bench.h"
#include "backend_cpu.h"
#include "minifloat.h"
#include "tensor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    int verify = argc > 1 && !strcmp(argv[1], "-v");
    argc -= verify, argv += verify;
    if (argc < 4 || argc > 8 || argc == 6) {
        fprintf(stderr, "usage: bench_attn [-v] CTX BATCH THREADS [LAYERS] [N_HEAD_KV N_REP HEAD_DIM]\n");
        return 2;
    }
    uint32_t ctx = (uint32_t)atol(argv[1]), B = (uint32_t)atol(argv[2]), nkv = 3, rep = 3, hd = 64, bs = 16;
    uint32_t layers = argc == 5 || argc == 8 ? (uint32_t)atol(argv[4]) : 1;
    int threads = atoi(argv[3]);
    if (argc >= 7)
        nkv = (uint32_t)atol(argv[argc - 3]), rep = (uint32_t)atol(argv[argc - 2]), hd = (uint32_t)atol(argv[argc - 1]);
    if (!ctx || !B || threads < 1 || !nkv || !rep || !hd || ctx > 65536 || B > 512 || !layers || layers > 128 ||
        (verify && B > ctx)) {
        fprintf(stderr, "bench_attn: CTX 1..65536, BATCH 1..512, LAYERS 1..128, THREADS, heads and width positive\n");
        return 2;
    }
    uint32_t nblk = (ctx + bs - 1) / bs, row = nkv * hd, nh = nkv * rep;
    kvp_err err = {0};
    kvp_backend *be = NULL;
    if (kvp_backend_cpu_create(&be, threads, 0, &err) < 0) {
        fprintf(stderr, "bench_attn: %s\n", err.msg);
        return 1;
    }
    kvp_kv_pool kv = {.dtype = KVP_DTYPE_F16, .n_blocks = nblk * B, .block_size = bs, .n_layer = layers,
                      .n_head_kv = nkv, .head_dim = hd};
    kv.block_bytes = (uint64_t)layers * 2 * nkv * bs * hd * 2;
    kv.base = be->ops->alloc(be, (size_t)kv.n_blocks * kv.block_bytes);
    float *k = malloc(sizeof(float) * row * bs), *v = malloc(sizeof(float) * row * bs);
    float *q = malloc(sizeof(float) * B * nh * hd), *out = malloc(sizeof(float) * B * nh * hd);
    uint32_t *flat = malloc(sizeof(uint32_t) * B * nblk), *seq = malloc(sizeof(uint32_t) * B), slots[16];
    int32_t *pos = malloc(sizeof(int32_t) * B);
    if (!kv.base || !k || !v || !q || !out || !flat || !seq || !pos) {
        fprintf(stderr, "bench_attn: out of memory\n");
        return 1;
    }
    uint64_t s = 11;
    for (uint32_t b = 0; b < kv.n_blocks; b++) { /* every block's slots, random K and V */
        for (uint32_t i = 0; i < row * bs; i++)
            k[i] = bench_frand(&s), v[i] = bench_frand(&s);
        for (uint32_t i = 0; i < bs; i++)
            slots[i] = b * bs + i;
        for (uint32_t l = 0; l < layers; l++)
            if (be->ops->kv_store(be, &kv, l, k, v, bs, slots, &err) < 0) {
                fprintf(stderr, "bench_attn: %s\n", err.msg);
                return 1;
            }
    }
    for (uint32_t t = 0; t < B; t++) { /* sequence t: blocks t, t + B, t + 2B ... (spread as a pool is) */
        for (uint32_t i = 0; i < nblk; i++)
            flat[(size_t)t * nblk + i] = t + i * B;
        seq[t] = t, pos[t] = (int32_t)ctx - 1;
    }
    uint32_t n_seq = verify ? 1 : B;
    if (verify) /* sequence 0's positions ctx - B .. ctx - 1 */
        for (uint32_t t = 0; t < B; t++)
            seq[t] = 0, pos[t] = (int32_t)(ctx - B + t);
    for (size_t i = 0; i < (size_t)B * nh * hd; i++)
        q[i] = 2 * bench_frand(&s);
    kvp_backend_reserve r = {.max_tok = B, .max_ctx = ctx, .max_n_in = row, .n_head = nh, .kv = &kv};
    if (be->ops->reserve(be, &r, &err) < 0) {
        fprintf(stderr, "bench_attn: %s\n", err.msg);
        return 1;
    }
    kvp_attn_args a = {.q = q, .out = out, .n_tok = B, .n_head = nh, .layer = 0, .scale = 1.0f / sqrtf((float)hd),
                       .pos = pos, .tok_seq = seq, .tables = flat, .n_seq = n_seq, .table_stride = nblk,
                       .host_pos = pos, .host_tok_seq = seq, .max_ctx = ctx, .kv = &kv};
    /* a call: every layer in turn; calls a round: about 20 ms of work;
     * rounds: 2 s in all */
    double t0 = bench_now();
    for (a.layer = 0; a.layer < layers; a.layer++)
        if (be->ops->attention(be, &a, &err) < 0) {
            fprintf(stderr, "bench_attn: %s\n", err.msg);
            return 1;
        }
    double one = bench_now() - t0, best = 1e30;
    int calls = one > 0.02 ? 1 : (int)(0.02 / (one > 1e-7 ? one : 1e-7)) + 1;
    for (double start = bench_now(); bench_now() - start < 2.0;) {
        t0 = bench_now();
        for (int c = 0; c < calls; c++)
            for (a.layer = 0; a.layer < layers; a.layer++)
                be->ops->attention(be, &a, &err);
        double t = (bench_now() - t0) / calls / layers;
        best = t < best ? t : best;
    }
    double bytes = (double)n_seq * ctx * row * 2 * 2;
    printf("ctx %u, %s %u, %u KV heads x %u, head %u, %u layers, threads %d: %.4f ms a layer, %.1f MB of K/V a "
           "layer, %.1f GB/s\n", ctx, verify ? "verify tokens" : "batch", B, nkv, rep, hd, layers, threads, best * 1e3,
           bytes / 1e6, bytes / best / 1e9);
    free(k), free(v), free(q), free(out), free(flat), free(seq), free(pos);
    be->ops->release(be, kv.base);
    be->ops->destroy(be);
    return 0;
}
