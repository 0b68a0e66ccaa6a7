/* test_invariant.c - batch invariance of the CPU backend: a sequence's
 * last-token logits are the same bits (memcmp) computed alone, in one step
 * with other sequences of various lengths before and after it (prompts,
 * prompt chunks, decodes, one with its very tokens), with its prompt cut
 * into chunks of 1, 3, 5, 7 and 64 tokens, and with 1, 2 and 3 threads.  For
 * each kernel set this CPU has (portable, AVX2, AVX512-VNNI: they differ
 * from each other; AMX, whose prompts' tiles and VNNI's decode kernels
 * must agree), on tiny random models (Q4_1, Q8_0, Q4_0 and f16
 * weights; head and FFN sizes with SIMD tails; f16 and f32 caches; a
 * 600-token context, so decode splits its keys over chunks while the
 * prompt's tiles take them in turn) and on SmolLM2-135M when it is cached. */
#include "rig.h"
#include "tiny.h"
#include "unit.h"
#include "backend.h"
#include "backend_cpu.h"
#include "engine.h"
#include "ggml_quants.h"
#include "kvcache.h"
#include "minifloat.h"
#include "model.h"
#include "tensor.h"
#include "wire.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* eight sequences of up to 700 tokens */
#define INV_BLOCKS(bs) (8 * (700 / (bs) + 2))

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static float frand(void) { return unit_frand(&rng_state); } /* uniform in [-1, 1) */

/* ---- the engine ---- */

/* Another sequence of the step: n_pre of its tokens computed before, in a
 * step of their own, then n_step more in the step that ends the prompt
 * under test. */
typedef struct side {
    const uint32_t *tok;
    uint32_t n_pre, n_step;
} side;

/* How the prompt p[n] under test is computed: its first `pre` tokens alone
 * in steps of `chunk` (0: one step), the rest in one step with the sides
 * before[] ahead of it and after[] behind it, every sequence asking for
 * its last logits. */
typedef struct plan {
    uint32_t pre, chunk;
    const side *before;
    int n_before;
    const side *after;
    int n_after;
} plan;

/* The prompt's last logits under plan pl, into out[n_vocab].  0 or -1. */
static int last_logits(rig *r, const uint32_t *p, uint32_t n, const plan *pl, float *out)
{
    kvp_err err = {0};
    uint32_t V = r->m->cfg.n_vocab;
    int n_side = pl->n_before + pl->n_after, ids[8], rc = 0;
    kvp_step_seq st[9];
    float *lg = malloc(sizeof(float) * V * 9);
    int s = kvp_kvcache_seq_new(r->kc, &err);
    for (int i = 0; i < n_side; i++) {
        const side *sd = i < pl->n_before ? &pl->before[i] : &pl->after[i - pl->n_before];
        ids[i] = kvp_kvcache_seq_new(r->kc, &err);
        kvp_step_seq one = {.seq = ids[i], .tokens = sd->tok, .n_tokens = sd->n_pre, .want = KVP_LOGITS_NONE};
        if (sd->n_pre && kvp_engine_step(r->e, &one, 1, NULL, &err) < 0)
            rc = -1;
    }
    for (uint32_t done = 0; done < pl->pre && rc == 0;) {
        uint32_t k = pl->chunk && pl->pre - done > pl->chunk ? pl->chunk : pl->pre - done;
        kvp_step_seq one = {.seq = s, .tokens = p + done, .n_tokens = k, .want = KVP_LOGITS_NONE};
        rc = kvp_engine_step(r->e, &one, 1, NULL, &err) < 0 ? -1 : 0;
        done += k;
    }
    int n_st = 0, row = 0;
    for (int i = 0; i < n_side + 1; i++) {
        if (i == pl->n_before) {
            row = n_st;
            st[n_st++] = (kvp_step_seq){.seq = s, .tokens = p + pl->pre, .n_tokens = n - pl->pre,
                                        .want = KVP_LOGITS_LAST};
        }
        if (i < n_side) {
            const side *sd = i < pl->n_before ? &pl->before[i] : &pl->after[i - pl->n_before];
            st[n_st++] = (kvp_step_seq){.seq = ids[i], .tokens = sd->tok + sd->n_pre, .n_tokens = sd->n_step,
                                        .want = KVP_LOGITS_LAST};
        }
    }
    if (rc == 0 && kvp_engine_step(r->e, st, (uint32_t)n_st, lg, &err) != n_st)
        rc = -1;
    CHECK_MSG(rc == 0, "step: %s", err.msg);
    memcpy(out, lg + (size_t)row * V, sizeof(float) * V);
    for (int i = 0; i < n_side; i++)
        kvp_kvcache_seq_free(r->kc, ids[i]);
    kvp_kvcache_seq_free(r->kc, s);
    free(lg);
    return rc;
}

/* Every way of computing p[n] against the prompt alone in one step on one
 * thread, on the kernel set flags picks (quick: with shorter others, and
 * only among others, as a decode, in chunks of 3 and on 2 threads); what
 * names the model. */
static void check_model(const char *what, const char *path, unsigned flags, int kv_dtype, uint32_t bs,
                        const uint32_t *p, uint32_t n, const uint32_t *other, int quick)
{
    rig r1;
    if (rig_open(&r1, path, 1, flags, kv_dtype, INV_BLOCKS(bs), bs) < 0) {
        CHECK_MSG(0, "%s: the model, backend or cache did not open", what);
        return;
    }
    uint32_t V = r1.m->cfg.n_vocab;
    float *want = malloc(sizeof(float) * V), *got = malloc(sizeof(float) * V);
    const char *isa = kvp_backend_cpu_isa(r1.be);
    plan alone = {0};
    if (last_logits(&r1, p, n, &alone, want) < 0)
        goto done;
    /* other sequences: prompts of 5 and 33 tokens, the start of this very
     * prompt, a prompt's second chunk, decodes over 20 and 70 tokens (quick:
     * shorter) */
    const side full[] = {{other, 0, 5}, {other + 40, 20, 1}, {p, 0, n < 9 ? n : 9},
                         {other + 7, 0, 33}, {other + 3, 10, 13}, {other + 90, 70, 1}};
    const side brief[] = {{other, 0, 5}, {other + 40, 6, 1}, {p, 0, n < 9 ? n : 9},
                          {other + 7, 0, 11}, {other + 3, 4, 5}, {other + 90, 10, 1}};
    const side *sides = quick ? brief : full, *b1 = sides, *a1 = sides + 3;
    const struct {
        const char *how;
        plan pl;
    } ways[] = {
        {"whole, between prompts and decodes", {0, 0, b1, 3, a1, 3}},
        {"whole, first of four", {0, 0, NULL, 0, sides + 1, 3}},
        {"whole, last of four", {0, 0, sides + 2, 3, NULL, 0}},
        {"last token as a decode between others", {n - 1, 0, b1, 2, a1, 2}},
        {"last two tokens beside a decode", {n - 2, 0, sides + 5, 1, NULL, 0}},
        {"chunks of 1", {n - 1, 1, NULL, 0, NULL, 0}},
        {"chunks of 3", {n - (n - 1) % 3 - 1, 3, NULL, 0, NULL, 0}},
        {"chunks of 5 (the few-token rows, no tile)", {n - (n - 1) % 5 - 1, 5, NULL, 0, NULL, 0}},
        {"chunks of 7", {n - (n - 1) % 7 - 1, 7, NULL, 0, NULL, 0}},
        {"chunks of 7, the last among others", {n - (n - 1) % 7 - 1, 7, b1, 3, a1, 2}},
        {"chunks of 64", {n - (n - 1) % 64 - 1, 64, NULL, 0, NULL, 0}},
    };
    for (size_t i = 0; i < sizeof ways / sizeof ways[0]; i++) {
        if (quick && i != 0 && i != 3 && i != 6)
            continue;
        if (last_logits(&r1, p, n, &ways[i].pl, got) == 0)
            CHECK_MSG(memcmp(want, got, sizeof(float) * V) == 0, "%s, %s: %s: logits differ from alone", what, isa,
                      ways[i].how);
    }
    for (int th = 2; th <= (quick ? 2 : 3); th++) {
        rig rt;
        if (rig_open(&rt, path, th, flags, kv_dtype, INV_BLOCKS(bs), bs) < 0) {
            CHECK_MSG(0, "%s: %d threads: the model, backend or cache did not open", what, th);
            continue;
        }
        if (last_logits(&rt, p, n, &alone, got) == 0)
            CHECK_MSG(memcmp(want, got, sizeof(float) * V) == 0, "%s, %s: %d threads: logits differ from one", what,
                      isa, th);
        if (th == 3 && last_logits(&rt, p, n, &ways[0].pl, got) == 0)
            CHECK_MSG(memcmp(want, got, sizeof(float) * V) == 0, "%s, %s: 3 threads, %s: logits differ", what, isa,
                      ways[0].how);
        rig_close(&rt);
    }
done:
    free(want), free(got);
    rig_close(&r1);
}

/* The kernel sets of this CPU: flags for each distinct one. */
static int kernel_sets(unsigned fl[4])
{
    const unsigned all[4] = {0, KVP_CPU_NO_AMX, KVP_CPU_NO_VNNI, KVP_CPU_PORTABLE};
    const char *seen[4];
    int n = 0;
    for (int i = 0; i < 4; i++) {
        kvp_err err = {0};
        kvp_backend *be;
        if (kvp_backend_cpu_create(&be, 1, all[i], &err) < 0)
            continue;
        const char *isa = kvp_backend_cpu_isa(be);
        int dup = 0;
        for (int j = 0; j < n; j++)
            dup |= strcmp(seen[j], isa) == 0;
        if (!dup)
            seen[n] = isa, fl[n++] = all[i];
        kvp_backend_free(be);
    }
    return n;
}

static void test_tiny(const char *dir, const unsigned *fl, int n_fl)
{
    const struct {
        tiny_cfg c;
        int kv_dtype;
        uint32_t bs, n;
    } models[] = {
        /* a 600-token prompt: keys in three chunks of 256 */
        {{2, 128, 352, 4, 2, 96, KVP_DTYPE_Q4_1, 0, 0}, KVP_DTYPE_F16, 16, 600},
        {{2, 128, 256, 4, 1, 80, KVP_DTYPE_Q8_0, 1, 0}, KVP_DTYPE_F16, 16, 45},
        {{1, 64, 96, 2, 2, 72, KVP_DTYPE_Q4_0, 1, 0}, KVP_DTYPE_F16, 16, 30},
        /* head dim 20 and 100 FFN rows: tails everywhere; chunks of 64 blocks of 4 */
        {{2, 80, 100, 4, 2, 64, KVP_DTYPE_F16, 0, 0}, KVP_DTYPE_F32, 4, 300},
    };
    uint32_t p[700], other[700];
    for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++) {
        char path[512], what[64];
        snprintf(path, sizeof path, "%s/tiny%zu.gguf", dir, mi);
        snprintf(what, sizeof what, "tiny %s", kvp_dtype_name((uint32_t)models[mi].c.wtype));
        CHECK(tiny_write(path, &models[mi].c, &rng_state) == 0);
        for (uint32_t i = 0; i < 700; i++) {
            p[i] = (uint32_t)((frand() + 1) * 0.5f * (float)models[mi].c.n_vocab) % models[mi].c.n_vocab;
            other[i] = (i * 37 + 11) % models[mi].c.n_vocab;
        }
        for (int f = 0; f < n_fl; f++)
            check_model(what, path, fl[f], models[mi].kv_dtype, models[mi].bs, p, models[mi].n, other, 0);
        unlink(path);
    }
}

static void test_smollm2(const unsigned *fl, int n_fl)
{
    const char *path = unit_model_path();
    if (access(path, R_OK) != 0) {
        printf("note: %s absent (scripts/fetch-model); SmolLM2 not checked\n", path);
        return;
    }
    enum { N = 70 };
    uint32_t p[N], other[200];
    for (uint32_t i = 0; i < N; i++)
        p[i] = 1000 + (i * 7919) % 30000;
    for (uint32_t i = 0; i < 200; i++)
        other[i] = 500 + (i * 104729) % 40000;
    for (int f = 0; f < n_fl; f++) { /* the portable kernels are slow: the tiny models cover the rest */
        int quick = fl[f] == KVP_CPU_PORTABLE;
        check_model("SmolLM2", path, fl[f], KVP_DTYPE_F16, 16, p, quick ? 20 : N, other, quick);
    }
}

int main(void)
{
    char dir[] = "/tmp/kvp-test-invariant.XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0);
        return unit_done();
    }
    unsigned fl[4];
    int n_fl = kernel_sets(fl);
    test_tiny(dir, fl, n_fl);
    test_smollm2(fl, n_fl);
    rmdir(dir);
    return unit_done();
}
