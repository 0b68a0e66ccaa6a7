/* bench_step.c - the whole engine's step of K tokens of one sequence at a
 * given context, for scripts/bench-step (which compiles it against
 * libkvpipe.a).  Not a test: it prints timings, it asserts nothing.
 *
 * Usage: bench_step MODEL THREADS CTX KMAX [STEPS [ROUNDS]]
 * A CTX-token prompt is run once (untimed); then, for K = 1 .. KMAX, STEPS
 * steps of K tokens each asking every token's argmax (greedy
 * verification, KVP_LOGITS_ARGMAX_ALL), each truncated back to CTX tokens
 * after it, so the context stays put: what a speculative verify
 * step of K - 1 drafted tokens costs (K = 1 is a plain decode step).
 * Prints per K the ms of a step (the least over ROUNDS rounds of STEPS
 * steps: the host's noise only ever adds) and its cost over K = 1's. */
#include "bench.h"
#include "backend_cpu.h"
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const kvp_err *e)
{
    fprintf(stderr, "bench_step: %s\n", e->msg);
    exit(1);
}

int main(int argc, char **argv)
{
    if (argc < 5 || argc > 7) {
        fprintf(stderr, "usage: bench_step MODEL THREADS CTX KMAX [STEPS [ROUNDS]]\n");
        return 2;
    }
    int threads = atoi(argv[2]), ctx = atoi(argv[3]), kmax = atoi(argv[4]);
    int steps = argc > 5 ? atoi(argv[5]) : 60, rounds = argc > 6 ? atoi(argv[6]) : 3;
    if (threads < 1 || ctx < 1 || kmax < 1 || kmax > 64 || steps < 1 || rounds < 1) {
        fprintf(stderr, "bench_step: THREADS, CTX, STEPS and ROUNDS must be positive, KMAX 1..64\n");
        return 2;
    }
    kvp_err err = {0};
    kvp_model *m;
    kvp_backend *be;
    kvp_kvcache *kc;
    kvp_engine *e;
    if (kvp_model_load(&m, argv[1], &err) < 0 || kvp_backend_cpu_create(&be, threads, 0, &err) < 0)
        die(&err);
    kvp_kvcache_opts o;
    kvp_kvcache_opts_init(&o);
    o.n_blocks = (uint64_t)(ctx + kmax + 64) / 16 + 4;
    if (kvp_kvcache_create(&kc, &m->cfg, &o, be, &err) < 0 || kvp_engine_create(&e, m, be, kc, &err) < 0)
        die(&err);
    uint32_t V = m->cfg.n_vocab, *toks = malloc(sizeof(uint32_t) * (size_t)(ctx + kmax)), am[64];
    if (!toks)
        return 1;
    for (int i = 0; i < ctx + kmax; i++)
        toks[i] = (uint32_t)(i * 7919 + 13) % V;
    int s = kvp_kvcache_seq_new(kc, &err);
    kvp_step_seq st = {.seq = s, .tokens = toks, .n_tokens = (uint32_t)ctx, .want = KVP_LOGITS_ARGMAX, .argmax = am};
    if (s < 0 || kvp_engine_step(e, &st, 1, NULL, &err) < 0)
        die(&err);
    printf("K\tms\tvs_1\n");
    double one = 0;
    for (int k = 1; k <= kmax; k++) {
        double best = 0;
        for (int r = 0; r < rounds; r++) {
            double t0 = bench_now();
            for (int i = 0; i < steps; i++) {
                kvp_step_seq v = {.seq = s, .tokens = toks + ctx, .n_tokens = (uint32_t)k,
                                  .want = KVP_LOGITS_ARGMAX_ALL, .argmax = am};
                if (kvp_engine_step(e, &v, 1, NULL, &err) < 0 ||
                    kvp_kvcache_seq_truncate(kc, s, (uint32_t)ctx, &err) < 0)
                    die(&err);
            }
            double t = (bench_now() - t0) / steps;
            best = r == 0 || t < best ? t : best;
        }
        one = k == 1 ? best : one;
        printf("%d\t%.3f\t%.2f\n", k, best * 1e3, best / one);
    }
    free(toks);
    kvp_engine_free(e);
    kvp_kvcache_free(kc);
    kvp_backend_free(be);
    kvp_model_free(m);
    return 0;
}
