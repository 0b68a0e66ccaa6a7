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
#include "quant.h"
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

/* Every scaled weight of m's layers replaced by its f32 values (the
 * kvp_dequant_tensor of its record): the weights alone, without the integer
 * kernels' 8-bit activations.  The buffers go into *owned (free each). */
static int layers_as_f32(kvp_model *m, float ***owned, size_t *n_owned)
{
    *owned = calloc(m->n_tensors, sizeof **owned);
    *n_owned = 0;
    for (uint32_t l = 0; *owned && l < m->cfg.n_layer; l++) {
        kvp_layer *L = &m->layers[l];
        kvp_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t k = 0; k < sizeof ws / sizeof ws[0]; k++) {
            kvp_weight *w = ws[k];
            const kvp_model_tensor *t = NULL;
            for (size_t i = 0; i < m->n_tensors && !t; i++)
                t = m->tensors[i].rec.name == w->name ? &m->tensors[i] : NULL;
            if (!t || w->dtype == KVP_DTYPE_F32)
                continue;
            float *y = malloc(sizeof(float) * w->n_in * w->n_out);
            kvp_err err = {0};
            if (!y || kvp_dequant_tensor(&t->rec, t->data, t->scales, t->zeros, y, NULL, &err) < 0) {
                free(y);
                return -1;
            }
            (*owned)[(*n_owned)++] = y;
            w->data = y, w->dtype = KVP_DTYPE_F32, w->row_bytes = 4ull * w->n_in;
            w->scales = w->zeros = NULL, w->scale_stride = 0, w->group = w->n_in;
        }
    }
    return *owned ? 0 : -1;
}

/* A quantized checkpoint (tests/golden/engine_hfquant/, made by
 * scripts/ref/gen_engine_hfquant.py) against transformers running it through
 * compressed-tensors: its linear layers load as the kvp dtype they map to
 * (f32 for a desc_act g_idx order) and run in the engine's own kernels. */
static void test_quantized(const char *name, int dtype, double tol, double tol_f32, uint32_t top1, const char *tmpdir)
{
    char dir[1200], path[1300];
    snprintf(dir, sizeof dir, "%s/../engine_hfquant/%s", golden, name);
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
    float *got = malloc(sizeof(float) * r.n_tok * r.n_vocab), *got2 = malloc(sizeof(float) * r.n_tok * r.n_vocab);
    for (int mode = 0; rc == 0 && mode < 2; mode++) {
        CHECK_EQ_U64(m->layers[1].w_down.dtype, dtype);
        CHECK(m->quant_note[0] != 0);
        if (run(m, r.ids, r.n_tok, mode, got) < 0) {
            CHECK(0);
            continue;
        }
        uint32_t diff;
        double e = compare(&r, got, &diff);
        printf("%s (%s): max rel err %.3g vs transformers + compressed-tensors, top-1 differs at %u of %u\n", name,
               mode ? "token by token" : "one step", e, diff, r.n_tok);
        CHECK_MSG(e < tol, "%s: max rel err %g", name, e);
        CHECK_MSG(diff <= top1, "%s: top-1 differs at %u", name, diff);
    }
    /* the weights themselves, through f32 rows: transformers' f32 result */
    float **owned = NULL;
    size_t n_owned = 0;
    kvp_model *f = NULL;
    if (rc == 0 && kvp_model_load(&f, dir, &err) == 0 && layers_as_f32(f, &owned, &n_owned) == 0 &&
        run(f, r.ids, r.n_tok, 0, got) == 0) {
        uint32_t diff;
        double e = compare(&r, got, &diff);
        printf("%s (weights as f32): max rel err %.3g, top-1 differs at %u of %u\n", name, e, diff, r.n_tok);
        CHECK_MSG(e < tol_f32, "%s: max rel err %g", name, e);
        CHECK_EQ_U64(diff, 0);
    } else {
        CHECK_MSG(0, "%s: %s", name, err.msg);
    }
    for (size_t i = 0; i < n_owned; i++)
        free(owned[i]);
    free(owned);
    kvp_model_free(f);
    /* quantize keeps the imported tensors: the same logits from its KVP file */
    snprintf(path, sizeof path, "%s/%s.kvp", tmpdir, name);
    uint8_t fp[16];
    kvp_model *k = NULL;
    if (rc == 0 && (rc = convert_keep(dir, path, fp, &err)) == 0 && (rc = kvp_model_load(&k, path, &err)) == 0) {
        CHECK_EQ_U64(k->layers[1].w_down.dtype, dtype);
        CHECK(memcmp(k->fingerprint, fp, 16) == 0);
        CHECK(run(m, r.ids, r.n_tok, 0, got) == 0 && run(k, r.ids, r.n_tok, 0, got2) == 0);
        CHECK(memcmp(got, got2, sizeof(float) * r.n_tok * r.n_vocab) == 0);
    } else {
        CHECK_MSG(0, "%s", err.msg);
    }
    kvp_model_free(k);
    unlink(path);
    free(got), free(got2);
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

/* The golden folder name copied to tmpdir/out, the first `from` of its
 * file `edit` replaced by `to` (of the same length in the safetensors, whose
 * header offsets stay). */
static int copy_edited(const char *name, const char *out, const char *edit, const char *from, const char *to,
                       const char *tmpdir, char *dst, size_t cap)
{
    static const char *const files[] = {"config.json", "model.safetensors"};
    snprintf(dst, cap, "%s/%s", tmpdir, out);
    if (mkdir(dst, 0700) != 0)
        return -1;
    for (size_t i = 0; i < 2; i++) {
        char path[1400];
        snprintf(path, sizeof path, "%s/%s/%s", golden, name, files[i]);
        FILE *f = fopen(path, "rb");
        if (!f)
            return -1;
        static char buf[1 << 22];
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        if (strcmp(files[i], edit) == 0) {
            char *at = memmem(buf, n, from, strlen(from));
            size_t lf = strlen(from), lt = strlen(to);
            if (!at || n - lf + lt > sizeof buf)
                return -1;
            memmove(at + lt, at + lf, n - (size_t)(at - buf) - lf);
            memcpy(at, to, lt);
            n = n - lf + lt;
        }
        snprintf(path, sizeof path, "%s/%s", dst, files[i]);
        if (!(f = fopen(path, "wb")) || fwrite(buf, 1, n, f) != n || fclose(f) != 0)
            return -1;
    }
    return 0;
}

static void remove_copy(const char *dir)
{
    char path[1400];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
}

/* What the engine does not compute is refused, not left out: another
 * activation than SiLU, a bias other than q/k/v's (HF's attention_bias on
 * o_proj, mlp_bias), which had run as if absent. */
static void test_unsupported(const char *tmpdir)
{
    char dir[1200];
    kvp_err err = {0};
    kvp_model *m = NULL;
    CHECK(copy_edited("qwen2_bias_tied", "gelu", "config.json", "\"silu\"", "\"gelu\"", tmpdir, dir, sizeof dir) == 0);
    int rc = kvp_model_load(&m, dir, &err);
    CHECK_MSG(rc == KVP_EUNSUPPORTED && strstr(err.msg, "the activation (hidden_act) \"gelu\" is not supported"), "%s",
              rc ? err.msg : "loaded");
    kvp_model_free(m);
    remove_copy(dir);
    m = NULL;
    CHECK(copy_edited("qwen2_bias_tied", "obias", "model.safetensors", "model.layers.0.self_attn.v_proj.bias",
                      "model.layers.0.self_attn.o_proj.bias", tmpdir, dir, sizeof dir) == 0);
    rc = kvp_model_load(&m, dir, &err);
    CHECK_MSG(rc == KVP_EUNSUPPORTED && strstr(err.msg, "tensor model.layers.0.self_attn.o_proj.bias: a bias this engine "
                                                        "does not apply"), "%s", rc ? err.msg : "loaded");
    kvp_model_free(m);
    remove_copy(dir);
    /* a key the model needs, missing: named as config.json spells it */
    m = NULL;
    CHECK(copy_edited("qwen2_bias_tied", "novocab", "config.json", "\"vocab_size\"", "\"vocab_sizX\"", tmpdir, dir,
                      sizeof dir) == 0);
    rc = kvp_model_load(&m, dir, &err);
    CHECK_MSG(rc == KVP_ENOTFOUND && strstr(err.msg, "config.json: vocab_size: required key missing"), "%s",
              rc ? err.msg : "loaded");
    kvp_model_free(m);
    remove_copy(dir);
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
    test_unsupported(tmp);
    /* i4 and i8 kernels round activations to 8 bits (as for Q4_0/Q8_0):
     * their bound is that rounding's; fp8 and f32 rows compute in f32 */
    test_quantized("ct_w4a16_g32", KVP_DTYPE_I4, 5e-2, 1e-5, 1, tmp);
    test_quantized("ct_w8a8_int8", KVP_DTYPE_I8, 5e-2, 1e-5, 3, tmp);
    test_quantized("ct_fp8_channel", KVP_DTYPE_FP8_E4M3, 1e-5, 1e-5, 0, tmp);
    test_quantized("gptq_desc_act", KVP_DTYPE_F32, 1e-5, 1e-5, 0, tmp);
    test_quantized("awq_g32", KVP_DTYPE_I4, 5e-2, 1e-5, 1, tmp);
    /* the reference runs on the bf16 values its decompression returns, we
     * on their f32 products e2m1 * (s / global) (fp4 has no kernel: f32
     * rows either way): transformers itself moves by 1.40e-2 from the one
     * to the other on this model, as we do */
    test_quantized("ct_nvfp4", KVP_DTYPE_FP4_E2M1, 2e-2, 2e-2, 0, tmp);
    rmdir(tmp);
    return unit_done();
}
