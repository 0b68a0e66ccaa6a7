/* gpu_meminfo.c - kvcalc's memory model against the device: free memory
 * (cudaMemGetInfo) read around each thing the CUDA backend takes, beside
 * what lib/plan/capacity.h (kvcalc's model) says it should take.  Run by
 * scripts/device-check; built by make check.
 *
 *   gpu_meminfo [-m MODEL] [--blocks N] [--chunk T]
 *
 * Readings, in order: the CUDA context (total - free once the runtime is
 * up), opening the backend (handles, workspaces), the KV pool of N blocks of
 * 16 tokens (f16), the engine (weights prepared, its step buffers and
 * reserved scratch), a prompt of 2T tokens in chunks of T, then 32 decode
 * steps.  kvcalc's side: its overhead allowance (context and workspaces),
 * the model's exact tensor bytes, N blocks, and its activation allowance
 * for T batched tokens. */
#include "gpu_util.h"
#include "capacity.h"
#include "engine.h"
#include "kvcache.h"
#include "model.h"

#ifdef KVP_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef KVP_HAVE_CUDA
static size_t free_now(void)
{
    size_t f = 0, t = 0;
    cudaDeviceSynchronize();
    if (cudaMemGetInfo(&f, &t) != cudaSuccess)
        return 0;
    return f;
}

static double mib(double b) { return b / (1024.0 * 1024.0); }

static void row(const char *what, double measured, const char *est_what, double est)
{
    if (est_what)
        printf("%-34s %12.1f   %-28s %12.1f\n", what, mib(measured), est_what, mib(est));
    else
        printf("%-34s %12.1f\n", what, mib(measured));
}
#endif

int main(int argc, char **argv)
{
    const char *path = getenv("KVP_TEST_MODEL");
    uint32_t n_blocks = 4096, chunk = 256;
    static const struct option opts[] = {{"model", required_argument, 0, 'm'}, {"blocks", required_argument, 0, 'B'},
                                         {"chunk", required_argument, 0, 'T'}, {0, 0, 0, 0}};
    for (int c; (c = getopt_long(argc, argv, "m:", opts, NULL)) != -1;) {
        if (c == 'm')
            path = optarg;
        else if (c == 'B')
            n_blocks = (uint32_t)atoi(optarg);
        else if (c == 'T')
            chunk = (uint32_t)atoi(optarg);
        else {
            fprintf(stderr, "usage: gpu_meminfo [-m MODEL] [--blocks N] [--chunk T]\n");
            return 2;
        }
    }
    if (!path || !*path)
        path = unit_model_path();
    if (n_blocks < 1 || chunk < 1 || chunk > 8192) {
        fprintf(stderr, "gpu_meminfo: --blocks >= 1, --chunk 1..8192\n");
        return 2;
    }
#ifndef KVP_HAVE_CUDA
    printf("gpu_meminfo: skipped: built without CUDA (it reads cudaMemGetInfo)\n");
    return gpu_required();
#else
    size_t total = 0, f0 = 0;
    if (cudaFree(0) != cudaSuccess || cudaMemGetInfo(&f0, &total) != cudaSuccess) {
        printf("gpu_meminfo: skipped: no CUDA device (%s)\n", cudaGetErrorString(cudaGetLastError()));
        return gpu_required();
    }
    kvp_backend *gpu = NULL;
    kvp_model *m = NULL;
    kvp_kvcache *kc = NULL;
    kvp_engine *e = NULL;
    kvp_err err = {0};
    int rc = 1;
    if (gpu_open("gpu_meminfo", NULL, &gpu) <= 0)
        return gpu_required();
    size_t f1 = free_now();
    kvp_kvcache_opts o;
    kvp_kvcache_opts_init(&o);
    o.n_blocks = n_blocks;
    o.block_size = 16;
    o.dtype = KVP_DTYPE_F16;
    if (kvp_model_load(&m, path, &err) < 0 || kvp_kvcache_create(&kc, &m->cfg, &o, gpu, &err) < 0) {
        fprintf(stderr, "gpu_meminfo: %s\n", err.msg);
        goto out;
    }
    size_t f2 = free_now();
    if (kvp_engine_create(&e, m, gpu, kc, &err) < 0) {
        fprintf(stderr, "gpu_meminfo: %s\n", err.msg);
        goto out;
    }
    size_t f3 = free_now();
    uint32_t n_prompt = 2 * chunk, *ids = malloc(sizeof(uint32_t) * n_prompt);
    float *logits = malloc(sizeof(float) * m->cfg.n_vocab);
    int seq = -1;
    if (!ids || !logits) {
        free(ids), free(logits);
        goto out;
    }
    for (uint32_t i = 0; i < n_prompt; i++)
        ids[i] = (i * 7919u + 13u) % (m->cfg.n_vocab < 1000 ? m->cfg.n_vocab : 1000);
    if ((seq = kvp_kvcache_seq_new(kc, &err)) < 0 || kvp_engine_prefill(e, seq, ids, n_prompt, chunk, logits, &err) < 0) {
        fprintf(stderr, "gpu_meminfo: prefill: %s\n", err.msg);
        free(ids), free(logits);
        goto out;
    }
    size_t f4 = free_now();
    for (int i = 0; i < 32; i++) {
        uint32_t t = unit_argmax(logits, m->cfg.n_vocab);
        kvp_step_seq s = {.seq = seq, .tokens = &t, .n_tokens = 1, .want = KVP_LOGITS_LAST};
        if (kvp_engine_step(e, &s, 1, logits, &err) < 0) {
            fprintf(stderr, "gpu_meminfo: decode: %s\n", err.msg);
            free(ids), free(logits);
            goto out;
        }
    }
    size_t f5 = free_now();
    free(ids), free(logits);

    /* kvcalc's model of the same run */
    kvp_cap_model_file mf;
    kvp_cap_params p;
    static kvp_cap_result r;
    kvp_cap_params_init(&p);
    if (kvp_cap_load_model(path, &mf, &err) < 0 || kvp_cap_kv_fmt("f16", &p.kv_fmt, &err) < 0) {
        fprintf(stderr, "gpu_meminfo: kvcalc: %s\n", err.msg);
        goto out;
    }
    p.cfg = mf.cfg;
    p.weight_bytes_override = mf.weight_bytes;
    p.gpu_mem_bytes = total;
    p.block_size = 16;
    p.max_batched_tokens = chunk;
    p.seq_len = (uint64_t)n_blocks * 16;
    if (kvp_cap_compute(&p, &r, &err) < 0) {
        fprintf(stderr, "gpu_meminfo: kvcalc: %s\n", err.msg);
        goto out;
    }
    const kvp_cap_stage *st = &r.stage[0];
    const kvp_kv_pool *pool = kvp_kvcache_pool(kc);
    printf("model %s: %u layers, %.1f MiB of tensors; device memory %.1f MiB\n", path, m->cfg.n_layer,
           mib((double)mf.weight_bytes), mib((double)total));
    printf("%-34s %12s   %-28s %12s\n", "device memory taken by", "MiB", "kvcalc's estimate", "MiB");
    row("CUDA context (runtime up)", (double)(total - f0), "overhead allowance (all)", (double)p.overhead_bytes);
    row("opening the backend", (double)f0 - (double)f1, NULL, 0);
    row("KV pool", (double)f1 - (double)f2, "KV blocks x block bytes", (double)n_blocks * (double)st->block_bytes);
    row("engine (weights, buffers)", (double)f2 - (double)f3, "weights", (double)st->weight_bytes);
    row("prefill (first steps' growth)", (double)f3 - (double)f4, "activation allowance", (double)st->activation_bytes);
    row("32 decode steps", (double)f4 - (double)f5, NULL, 0);
    /* everything but the weights and the KV pool: what kvcalc's overhead
     * and activation allowances stand for */
    double rest = (double)(total - f5) - (double)st->weight_bytes - ((double)f1 - (double)f2);
    row("all but weights and KV pool", rest, "overhead + activations", (double)p.overhead_bytes + (double)st->activation_bytes);
    printf("pool as the cache made it: %u blocks of %llu bytes\n", pool->n_blocks,
           (unsigned long long)pool->block_bytes);
    printf("kvcalc -m %s -g h200 --kv-dtype f16 --block-size 16 --seq-len %llu --max-batched-tokens %u\n", path,
           (unsigned long long)p.seq_len, chunk);
    rc = 0;
out:
    kvp_engine_free(e);
    kvp_kvcache_free(kc);
    kvp_model_free(m);
    kvp_backend_free(gpu);
    return rc;
#endif
}
