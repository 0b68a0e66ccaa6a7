/* test_model_hf.c - HF folders (safetensors + config.json) through the
 * engine against HF transformers' logits (tests/golden/engine_hf/, made by
 * scripts/ref/gen_engine_hf.py): unpermuted weights with NEOX RoPE, GQA
 * ratios 1/2/3, head dims 32/64/80, tied and untied embeddings, llama3 RoPE
 * scaling and qwen2 q/k/v biases; and the same models as KVP model files
 * with HF tensor names. */
#include "unit.h"
#include "backend.h"
#include "backend_cpu.h"
#include "convert.h"
#include "engine.h"
#include "wire.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char golden[1024];

typedef struct ref_logits {
    uint32_t n_tok, n_vocab;
    uint32_t *ids;
    float *logits; /* [n_tok][n_vocab] */
} ref_logits;

static int read_ref(const char *path, ref_logits *r)
{
    uint8_t *d;
    size_t n;
    kvp_err err = {0};
    memset(r, 0, sizeof *r);
    if (kvp_read_file(path, 1u << 24, &d, &n, &err) < 0)
        return -1;
    int ok = n >= 12 && memcmp(d, "KVPL", 4) == 0;
    if (ok) {
        r->n_tok = kvp_le32(d + 4), r->n_vocab = kvp_le32(d + 8);
        ok = r->n_tok <= 4096 && r->n_vocab <= 65536 && n == 12 + 4ull * r->n_tok + 4ull * r->n_tok * r->n_vocab;
    }
    if (ok) {
        r->ids = malloc(4ull * r->n_tok);
        r->logits = malloc(4ull * r->n_tok * r->n_vocab);
        for (uint32_t i = 0; i < r->n_tok; i++)
            r->ids[i] = kvp_le32(d + 12 + 4 * i);
        for (uint64_t i = 0; i < (uint64_t)r->n_tok * r->n_vocab; i++) {
            uint32_t u = kvp_le32(d + 12 + 4ull * r->n_tok + 4 * i);
            memcpy(&r->logits[i], &u, 4);
        }
    }
    free(d);
    return ok ? 0 : -1;
}

/* Every position's logits, the prompt in one step (mode 0) or one token a
 * step through the KV cache (mode 1).  0 or -1. */
static int run(const kvp_model *m, const uint32_t *ids, uint32_t n, int mode, float *out)
{
    kvp_err err = {0};
    kvp_backend *be = NULL;
    kvp_kvcache *kc = NULL;
    kvp_engine *e = NULL;
    kvp_kvcache_opts o;
    kvp_kvcache_opts_init(&o);
    o.dtype = KVP_DTYPE_F32;
    o.n_blocks = 16;
    o.block_size = 4;
    int rc = -1;
    if (kvp_backend_cpu_create(&be, unit_threads(2), 0, &err) < 0 || kvp_kvcache_create(&kc, &m->cfg, &o, be, &err) < 0 ||
        kvp_engine_create(&e, m, be, kc, &err) < 0) {
        printf("engine: %s\n", err.msg);
        goto out;
    }
    int s = kvp_kvcache_seq_new(kc, &err);
    if (mode == 0) {
        kvp_step_seq ss = {.seq = s, .tokens = ids, .n_tokens = n, .want = KVP_LOGITS_ALL};
        rc = kvp_engine_step(e, &ss, 1, out, &err) == (int)n ? 0 : -1;
    } else {
        rc = 0;
        for (uint32_t t = 0; t < n && rc == 0; t++) {
            kvp_step_seq ss = {.seq = s, .tokens = ids + t, .n_tokens = 1, .want = KVP_LOGITS_LAST};
            rc = kvp_engine_step(e, &ss, 1, out + (size_t)t * m->cfg.n_vocab, &err) == 1 ? 0 : -1;
        }
    }
    if (rc)
        printf("step: %s\n", err.msg);
out:
    kvp_engine_free(e);
    kvp_kvcache_free(kc);
    kvp_backend_free(be);
    return rc;
}

/* max |a - b| / max |a| and the count of positions whose top-1 differs. */
static double compare(const ref_logits *r, const float *got, uint32_t *top1_diff)
{
    double mx = 0, md = 0;
    *top1_diff = 0;
    for (uint32_t t = 0; t < r->n_tok; t++) {
        const float *a = r->logits + (size_t)t * r->n_vocab, *b = got + (size_t)t * r->n_vocab;
        for (uint32_t i = 0; i < r->n_vocab; i++) {
            mx = fabs(a[i]) > mx ? fabs(a[i]) : mx;
            md = fabs(a[i] - b[i]) > md ? fabs(a[i] - b[i]) : md;
        }
        *top1_diff += unit_argmax(a, r->n_vocab) != unit_argmax(b, r->n_vocab);
    }
    return md / (mx > 0 ? mx : 1);
}

static int convert_keep(const char *in, const char *out, uint8_t fp[16], kvp_err *err)
{
    kvp_convert *cv;
    kvp_convert_opts o;
    kvp_convert_opts_init(&o);
    int rc = kvp_convert_open(&cv, in, err);
    if (rc < 0)
        return rc;
    if ((rc = kvp_convert_plan(cv, &o, err)) == 0) {
        kvp_out ko;
        if ((rc = kvp_out_open(&ko, out, err)) == 0) {
            rc = kvp_convert_write(cv, &ko, 0, "test_model_hf", NULL, NULL, NULL, err);
            rc = rc ? (kvp_out_abort(&ko), rc) : kvp_out_commit(&ko, err);
        }
        kvp_convert_fingerprint(cv, fp);
    }
    kvp_convert_free(cv);
    return rc;
}

static void test_one(const char *name, int tied, int bias, int llama3, const char *tmpdir)
{
    char dir[1100], path[1200];
    snprintf(dir, sizeof dir, "%s/%s", golden, name);
    snprintf(path, sizeof path, "%s/logits.bin", dir);
    ref_logits r;
    if (read_ref(path, &r) < 0) {
        CHECK_MSG(0, "%s: cannot read", path);
        return;
    }
    kvp_err err = {0};
    kvp_model *m = NULL;
    int rc = kvp_model_load(&m, dir, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc < 0)
        goto out;
    CHECK_EQ_U64(m->format, KVP_MODEL_HF);
    CHECK_EQ_U64(m->cfg.rope_type, KVP_ROPE_NEOX);
    CHECK_EQ_U64(m->cfg.tied_embeddings, tied);
    CHECK_EQ_U64(m->cfg.attn_bias, bias);
    CHECK_EQ_U64(m->cfg.rope_scaling == KVP_ROPE_SCALING_LLAMA3, llama3);
    CHECK_EQ_U64(m->cfg.n_vocab, r.n_vocab);
    float *got = malloc(sizeof(float) * r.n_tok * r.n_vocab), *got2 = malloc(sizeof(float) * r.n_tok * r.n_vocab);
    for (int mode = 0; mode < 2; mode++) {
        if (run(m, r.ids, r.n_tok, mode, got) < 0) {
            CHECK(0);
            continue;
        }
        uint32_t diff;
        double e = compare(&r, got, &diff);
        printf("%s (%s): max rel err %.3g vs transformers, top-1 differs at %u of %u\n", name,
               mode ? "token by token" : "one step", e, diff, r.n_tok);
        CHECK_MSG(e < 1e-4, "%s: max rel err %g", name, e);
        CHECK_EQ_U64(diff, 0);
    }
    /* the same model as a KVP model file keeps its HF names and gives the
     * same logits bit for bit; its fingerprint is quantize's */
    snprintf(path, sizeof path, "%s/%s.kvp", tmpdir, name);
    uint8_t fp[16];
    kvp_model *k = NULL;
    rc = convert_keep(dir, path, fp, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc == 0 && (rc = kvp_model_load(&k, path, &err)) == 0) {
        CHECK_EQ_U64(k->format, KVP_MODEL_KVP);
        CHECK(memcmp(k->fingerprint, fp, 16) == 0);
        CHECK(run(m, r.ids, r.n_tok, 0, got) == 0 && run(k, r.ids, r.n_tok, 0, got2) == 0);
        CHECK(memcmp(got, got2, sizeof(float) * r.n_tok * r.n_vocab) == 0);
    } else {
        CHECK_MSG(0, "%s", err.msg);
    }
    kvp_model_free(k);
    unlink(path);
    free(got), free(got2);
out:
    kvp_model_free(m);
    free(r.ids), free(r.logits);
}

/* The .safetensors file itself names the same model; a folder without
 * config.json is refused naming it. */
static void test_paths(const char *tmpdir)
{
    char path[1200];
    kvp_err err = {0};
    kvp_model *m = NULL;
    snprintf(path, sizeof path, "%s/gqa1_hd32_tied/model.safetensors", golden);
    CHECK_MSG(kvp_model_load(&m, path, &err) == 0, "%s", err.msg);
    kvp_model *d = NULL;
    snprintf(path, sizeof path, "%s/gqa1_hd32_tied", golden);
    CHECK(kvp_model_load(&d, path, &err) == 0);
    CHECK(m && d && memcmp(m->fingerprint, d->fingerprint, 16) == 0);
    kvp_model_free(m);
    kvp_model_free(d);
    CHECK(kvp_model_load(&m, tmpdir, &err) < 0 && m == NULL);
    CHECK_MSG(strstr(err.msg, tmpdir) != NULL, "%s", err.msg);
}

int main(void)
{
    const char *t = getenv("KVP_TESTS");
    snprintf(golden, sizeof golden, "%s/golden/engine_hf", t ? t : "tests");
    struct stat sb;
    if (stat(golden, &sb) != 0) {
        printf("%s: missing (run scripts/ref/gen_engine_hf.py)\n", golden);
        CHECK(0);
        return unit_done();
    }
    char tmp[] = "/tmp/kvp-test-model-hf.XXXXXX";
    if (!mkdtemp(tmp)) {
        CHECK(0);
        return unit_done();
    }
    test_one("gqa1_hd32_tied", 1, 0, 0, tmp);
    test_one("gqa2_hd64_untied", 0, 0, 0, tmp);
    test_one("gqa3_hd80_llama3", 0, 0, 1, tmp);
    test_one("qwen2_bias_tied", 1, 1, 0, tmp);
    test_paths(tmp);
    rmdir(tmp);
    return unit_done();
}
