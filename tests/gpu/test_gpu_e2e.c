/* test_gpu_e2e.c - SmolLM2-135M-Instruct (Q4_1) through the whole engine on
 * the "cuda" backend against the "cpu" backend: the same prompt, prefilled
 * in chunks of 16 (prompt attention over history), then 64 greedy tokens.
 *
 * The GPU is fed the CPU's tokens (teacher forcing), so all 64 steps
 * compare the same history.  Its argmax must equal the CPU's, or be a
 * near-tie: on the CPU side, the logit of the CPU's token minus the logit
 * of the GPU's token at most twice the largest logit difference between
 * the backends at that step, and at most 1.  Every step's logits must
 * agree within a tolerance (||gpu - cpu|| / ||cpu||) made in the same run
 * from the CPU's own two kernel sets (main says how).
 *
 * The model: $KVP_TEST_MODEL, else where scripts/fetch-model puts it
 * (unit.h).  scripts/device-check runs it on a model cut to its first layers
 * (tests/gpu/README.md says why).  Skips with one line when there is no CUDA
 * backend or no model. */
#include "gpu_util.h"
#include "engine.h"
#include "kvcache.h"
#include "model.h"
#include "tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { N_GEN = 64, CHUNK = 16 };

static const char prompt[] =
    "The three primary colors of light are red, green and blue. Mixing all three gives white light, "
    "and mixing red with green gives";

/* One backend's run: its argmax at each step in tokens[N_GEN] and each
 * step's logits [N_GEN][n_vocab] (step 0: after the prompt).  Fed its own
 * argmax, or force[i] when force is not NULL: the GPU follows the CPU's
 * tokens, so every step compares the same history even after a near-tie.
 * 0 or -1 after a failed check. */
static int generate(const kvp_model *m, kvp_backend *be, const uint32_t *ids, uint32_t n_ids, uint32_t *tokens,
                    const uint32_t *force, float *logits, uint32_t n_vocab)
{
    kvp_err err = {0};
    kvp_kvcache_opts o;
    kvp_kvcache *kc = NULL;
    kvp_engine *e = NULL;
    float *row = malloc(sizeof(float) * n_vocab);
    int rc = -1, seq;
    kvp_kvcache_opts_init(&o);
    o.n_blocks = 64;
    o.block_size = 16;
    if (!row || kvp_kvcache_create(&kc, &m->cfg, &o, be, &err) < 0 || kvp_engine_create(&e, m, be, kc, &err) < 0 ||
        (seq = kvp_kvcache_seq_new(kc, &err)) < 0 || kvp_engine_prefill(e, seq, ids, n_ids, CHUNK, row, &err) < 0) {
        CHECK_MSG(0, "%s: %s", be->ops->name, err.msg);
        goto out;
    }
    for (uint32_t i = 0; i < N_GEN; i++) {
        memcpy(logits + (size_t)i * n_vocab, row, sizeof(float) * n_vocab);
        tokens[i] = unit_argmax(row, n_vocab);
        uint32_t next = force ? force[i] : tokens[i];
        kvp_step_seq s = {.seq = seq, .tokens = &next, .n_tokens = 1, .want = KVP_LOGITS_LAST};
        if (i + 1 < N_GEN && kvp_engine_step(e, &s, 1, row, &err) < 0) {
            CHECK_MSG(0, "%s: step %u: %s", be->ops->name, i, err.msg);
            goto out;
        }
    }
    rc = 0;
out:
    kvp_engine_free(e);
    kvp_kvcache_free(kc);
    free(row);
    return rc;
}

int main(void)
{
    kvp_backend *cpu, *gpu, *portable = NULL;
    int open = gpu_open("test_gpu_e2e", &cpu, &gpu);
    if (open <= 0)
        return unit_done();
    const char *path = getenv("KVP_TEST_MODEL");
    if (!path || !*path)
        path = unit_model_path();
    kvp_err err = {0};
    kvp_model *m = NULL;
    kvp_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    float *lc = NULL, *lg = NULL, *lp = NULL;
    if (access(path, R_OK) != 0) {
        if (gpu_required())
            CHECK_MSG(0, "KVP_GPU_REQUIRED=1 but the model %s is absent", path);
        else
            printf("test_gpu_e2e: skipped: %s absent (scripts/fetch-model, or set KVP_TEST_MODEL)\n", path);
        goto out;
    }
    if (kvp_model_load(&m, path, &err) < 0 || kvp_model_load_tokenizer(m, &tok, &err) < 0 ||
        kvp_tokenizer_encode(tok, prompt, strlen(prompt), 0, -1, &ids, &n_ids, &err) < 0) {
        CHECK_MSG(0, "%s: %s", path, err.msg);
        goto out;
    }
    uint32_t n_vocab = m->cfg.n_vocab, tc[N_GEN], tg[N_GEN], tp[N_GEN];
    lc = malloc(sizeof(float) * N_GEN * n_vocab);
    lg = malloc(sizeof(float) * N_GEN * n_vocab);
    lp = malloc(sizeof(float) * N_GEN * n_vocab);
    kvp_backend_config pcfg = {.n_threads = unit_threads(0), .cpu_flags = KVP_CPU_PORTABLE};
    if (!lc || !lg || !lp || kvp_backend_open(&portable, "cpu", &pcfg, &err) < 0) {
        CHECK_MSG(0, "%s", err.msg);
        goto out;
    }
    printf("model %s: %u layers, prompt of %zu tokens, %d greedy tokens\n", path, m->cfg.n_layer, n_ids, N_GEN);
    if (generate(m, cpu, (const uint32_t *)ids, (uint32_t)n_ids, tc, NULL, lc, n_vocab) < 0 ||
        generate(m, gpu, (const uint32_t *)ids, (uint32_t)n_ids, tg, tc, lg, n_vocab) < 0 ||
        generate(m, portable, (const uint32_t *)ids, (uint32_t)n_ids, tp, tc, lp, n_vocab) < 0)
        goto out;
    /* The tolerance, calibrated on this model and prompt in this run: the
     * CPU's portable kernels against its fastest (they round and sum
     * activations differently: 1.4% apart on the 8-layer slice, 8.5% on
     * the 30 layers, where a small model's error grows layer by layer).
     * The GPU, which keeps activations in f32 or bf16 where the CPU rounds
     * them to int8, may be twice as far from the CPU, and never over 5%
     * where the CPU's spread is small. */
    double spread = 0;
    for (uint32_t i = 0; i < N_GEN; i++) {
        gpu_diff d;
        gpu_diff_f32(&d, lp + (size_t)i * n_vocab, lc + (size_t)i * n_vocab, n_vocab);
        spread = fmax(spread, gpu_diff_rms(&d));
    }
    double tol = fmax(0.05, 2 * spread);
    printf("cpu portable kernels against the cpu's fastest: logits within %.3g of their norm; tolerance %.3g\n",
           spread, tol);
    double worst = 0;
    uint32_t agree = 0, first = N_GEN;
    /* each step's difference on one line: where it grows says more than
     * the worst alone (the prompt's KV, or the decode steps) */
    printf("logits' difference by step (of their norm):");
    for (uint32_t i = 0; i < N_GEN; i++) {
        const float *a = lc + (size_t)i * n_vocab, *b = lg + (size_t)i * n_vocab;
        gpu_diff d;
        gpu_diff_f32(&d, b, a, n_vocab);
        worst = fmax(worst, gpu_diff_rms(&d));
        printf(" %.3f", gpu_diff_rms(&d));
    }
    printf("\n");
    for (uint32_t i = 0; i < N_GEN; i++) {
        const float *a = lc + (size_t)i * n_vocab, *b = lg + (size_t)i * n_vocab;
        gpu_diff d;
        gpu_diff_f32(&d, b, a, n_vocab);
        CHECK_MSG(d.bad == 0 && gpu_diff_rms(&d) <= tol,
                  "step %u: logits differ by %.3g of their norm (tolerance %.3g; %zu not finite)", i, gpu_diff_rms(&d),
                  tol, d.bad);
        if (tc[i] == tg[i]) {
            agree++;
            continue;
        }
        /* the CPU's view of the two tokens, and how far the backends are apart here */
        uint32_t second = tc[i] == 0 ? 1 : 0;
        for (uint32_t v = 0; v < n_vocab; v++)
            if (v != tc[i] && a[v] > a[second])
                second = v;
        double gap = (double)a[tc[i]] - a[tg[i]], top2 = (double)a[tc[i]] - a[second];
        if (first == N_GEN)
            first = i;
        printf("difference at token %u: cpu %u, cuda %u; cpu logits: %u %.4f, %u %.4f (top-2 gap %.4f, "
               "gap to cuda's token %.4f); largest logit difference between the backends here %.4f\n",
               i, tc[i], tg[i], tc[i], a[tc[i]], tg[i], a[tg[i]], top2, gap, d.max_err);
        CHECK_MSG(gap <= 2 * d.max_err && gap <= 1.0,
                  "token %u: cuda chose %u, %.4f below the cpu's %u on the cpu: not a near-tie (backends differ by %.4f)",
                  i, tg[i], gap, tc[i], d.max_err);
    }
    if (agree == N_GEN)
        printf("ok all %d greedy tokens equal; logits within %.3g of their norm\n", N_GEN, worst);
    else
        printf("ok %u of %d greedy tokens equal (the first difference at token %u), the rest near-ties, on the "
               "cpu's tokens; logits within %.3g of their norm\n", agree, N_GEN, first, worst);
out:
    free(lc), free(lg), free(lp), free(ids);
    kvp_backend_free(portable);
    kvp_tokenizer_free(tok);
    kvp_model_free(m);
    kvp_backend_free(gpu);
    kvp_backend_free(cpu);
    return unit_done();
}
