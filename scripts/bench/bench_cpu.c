/* bench_cpu.c - prompt processing (ppN) and generation (tgN) tokens/s of the
 * kvpipe CPU engine, plus the memory-copy bandwidth measured in the same run.
 * Built and run by scripts/bench-cpu; prints one TSV line per figure:
 *   kvpipe  pp512  <tokens/s>
 *   kvpipe  tg128  <tokens/s>
 *   memcpy  GB/s   <GB/s>
 * Usage: bench_cpu MODEL THREADS PP TG REPS */
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: bench_cpu MODEL THREADS PP TG REPS\n");
        return 2;
    }
    int threads = atoi(argv[2]), pp = atoi(argv[3]), tg = atoi(argv[4]), reps = atoi(argv[5]);
    kvp_err err = {0};
    kvp_model *m;
    kvp_backend *be;
    kvp_kvcache *kc;
    kvp_engine *e;
    if (kvp_model_load(&m, argv[1], &err) < 0 || kvp_backend_cpu_create(&be, threads, 0, &err) < 0)
        die(&err);
    kvp_kvcache_opts o;
    kvp_kvcache_opts_init(&o);
    o.n_blocks = (uint64_t)(pp + tg + 64) / 16 + 4;
    if (kvp_kvcache_create(&kc, &m->cfg, &o, be, &err) < 0 || kvp_engine_create(&e, m, be, kc, &err) < 0)
        die(&err);
    uint32_t V = m->cfg.n_vocab, *toks = malloc(sizeof(uint32_t) * (size_t)pp);
    float *lg = malloc(sizeof(float) * V);
    for (int i = 0; i < pp; i++)
        toks[i] = (uint32_t)(i * 7919 + 13) % V;
    double best_pp = 0, best_tg = 0;
    for (int r = 0; r < reps; r++) {
        int s = kvp_kvcache_seq_new(kc, &err);
        kvp_step_seq st = {.seq = s, .tokens = toks, .n_tokens = (uint32_t)pp, .want = KVP_LOGITS_LAST};
        double t0 = now();
        if (kvp_engine_step(e, &st, 1, lg, &err) < 0)
            die(&err);
        double t1 = now();
        kvp_kvcache_seq_free(kc, s);
        best_pp = pp / (t1 - t0) > best_pp ? pp / (t1 - t0) : best_pp;
        /* tg: one token at a time after a 1-token prompt, like llama-bench */
        s = kvp_kvcache_seq_new(kc, &err);
        uint32_t tok = 1;
        t0 = now();
        for (int i = 0; i < tg; i++) {
            kvp_step_seq one = {.seq = s, .tokens = &tok, .n_tokens = 1, .want = KVP_LOGITS_LAST};
            if (kvp_engine_step(e, &one, 1, lg, &err) < 0)
                die(&err);
            uint32_t b = 0;
            for (uint32_t j = 1; j < V; j++)
                b = lg[j] > lg[b] ? j : b;
            tok = b;
        }
        t1 = now();
        kvp_kvcache_seq_free(kc, s);
        best_tg = tg / (t1 - t0) > best_tg ? tg / (t1 - t0) : best_tg;
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
    printf("kvpipe\ttg%d\t%.2f\n", tg, best_tg);
    printf("memcpy\tGB/s\t%.2f\n", bw);
    printf("kvpipe\tisa\t%s\n", kvp_backend_cpu_isa(be));
    free(a), free(b), free(toks), free(lg);
    kvp_engine_free(e);
    kvp_kvcache_free(kc);
    kvp_backend_free(be);
    kvp_model_free(m);
    return 0;
}
