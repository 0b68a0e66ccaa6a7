/* test_convert.c - model conversion (GGUF, safetensors, KVP -> KVP) and KV
 * stream conversion (lib/convert.h).
 *
 * `test_convert --write-kv-sample FILE [DTYPE]` writes a small KV stream (the
 * CLI tests' input for quantize --kv): config, sequence 7, its three KV
 * blocks (DTYPE, default f16), sequence 8 (7's first 16 tokens) and its
 * block as a reference, a record of an unknown kind, END.
 * `test_convert --write-gguf FILE [FAULT]` writes the small GGUF of these
 * tests (a whole one-layer llama: q8_0 embedding, q4_1, f32 and f16 weights,
 * and one IQ2_XXS tensor besides), or with a fault the model loader refuses
 * (write_gguf). */
#define _POSIX_C_SOURCE 200809L
#include "convert.h"
#include "fingerprint.h"
#include "gguf.h"
#include "io.h"
#include "json.h"
#include "meta.h"
#include "model.h"
#include "quant.h"
#include "quant_kv.h"
#include "safetensors.h"
#include "stream.h"
#include "tensor.h"
#include "unit.h"
#include "wire.h"

#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[] = "/tmp/kvp-test-convert.XXXXXX";
static char golden[1024];

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float rndf(void) { return (float)((double)(rnd() >> 11) / 9007199254740992.0 * 2.0 - 1.0); }

static const char *tmp_path(const char *name)
{
    static char buf[4][300];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    return buf[k];
}

/* ---- a small GGUF written by hand (FACTS.md "GGUF v3") ---- */

static void g_str(kvp_buf *b, const char *s)
{
    kvp_buf_u64(b, strlen(s));
    kvp_buf_put(b, s, strlen(s));
}
static void g_kv_str(kvp_buf *b, const char *k, const char *v)
{
    g_str(b, k);
    kvp_buf_u32(b, 8);
    g_str(b, v);
}
static void g_kv_u32(kvp_buf *b, const char *k, uint32_t v)
{
    g_str(b, k);
    kvp_buf_u32(b, 4);
    kvp_buf_u32(b, v);
}

typedef struct gtensor {
    const char *name;
    uint32_t type, n_dims;
    uint64_t ne[2];
    uint8_t *data;
    size_t nbytes;
    float *ref; /* dequantized values */
} gtensor;

#define NT 12
static gtensor gt[NT];

/* A whole llama layer as the loader binds it (d 64, 2 heads of 4, ffn 48,
 * vocabulary 4, tied embeddings), in GGUF order (ne0 innermost):
 * token_embd q8_0 [64, 4], attn_q q4_1 [64, 8], attn_norm f32 [64],
 * ffn_down f16 [48, 64] (rows of 48: no q8_0 blocks), the other weights f32;
 * last, weird IQ2_XXS [256] (a type we cannot read; NT - 1 leaves it out). */
static void make_tensors(void)
{
    static const struct {
        const char *name;
        uint32_t type, n_dims;
        uint64_t ne0, ne1;
    } spec[NT] = {
        {"token_embd.weight", 8, 2, 64, 4},
        {"blk.0.attn_q.weight", 3, 2, 64, 8},
        {"blk.0.attn_norm.weight", 0, 1, 64, 1},
        {"blk.0.ffn_down.weight", 1, 2, 48, 64},
        {"blk.0.attn_k.weight", 0, 2, 64, 8},
        {"blk.0.attn_v.weight", 0, 2, 64, 8},
        {"blk.0.attn_output.weight", 0, 2, 8, 64},
        {"blk.0.ffn_norm.weight", 0, 1, 64, 1},
        {"blk.0.ffn_gate.weight", 0, 2, 64, 48},
        {"blk.0.ffn_up.weight", 0, 2, 64, 48},
        {"output_norm.weight", 0, 1, 64, 1},
        {"blk.0.weird.weight", 16, 1, 256, 1},
    };
    for (int i = 0; i < NT; i++) {
        gtensor *t = &gt[i];
        t->name = spec[i].name;
        t->type = spec[i].type;
        t->n_dims = spec[i].n_dims;
        t->ne[0] = spec[i].ne0;
        t->ne[1] = spec[i].ne1;
        size_t n = (size_t)(t->ne[0] * t->ne[1]);
        float *x = malloc(n * sizeof *x);
        t->ref = malloc(n * sizeof *x);
        for (size_t j = 0; j < n; j++)
            x[j] = rndf() * (1.0f + (float)(j % 7));
        switch (t->type) {
        case 0:
            t->nbytes = n * 4;
            t->data = malloc(t->nbytes);
            memcpy(t->data, x, t->nbytes);
            break;
        case 1:
            t->nbytes = n * 2;
            t->data = malloc(t->nbytes);
            for (size_t j = 0; j < n; j++)
                kvp_put16(t->data + 2 * j, kvp_f32_to_f16(x[j]));
            break;
        case 3:
            t->nbytes = n / 32 * 20;
            t->data = malloc(t->nbytes);
            kvp_quantize_row_q4_1(x, t->data, (int64_t)n);
            break;
        case 8:
            t->nbytes = n / 32 * 34;
            t->data = malloc(t->nbytes);
            kvp_quantize_row_q8_0(x, t->data, (int64_t)n);
            break;
        default: /* IQ2_XXS: 66 bytes a 256-element block; never read */
            t->nbytes = n / 256 * 66;
            t->data = malloc(t->nbytes);
            for (size_t j = 0; j < t->nbytes; j++)
                t->data[j] = (uint8_t)rnd();
            break;
        }
        const kvp_dtype_traits *tr = kvp_dtype_get((uint32_t)kvp_gguf_type_to_dtype(t->type));
        if (tr)
            tr->to_f32(t->data, t->ref, (int64_t)n);
        free(x);
    }
}

/* The tiny GGUF, well formed; or a variant: one with a fault the model
 * loader refuses (kvp_model_check): "bos" a BOS id past the 4-token
 * vocabulary, "layers" 2^31 layers, "token-type" a token_type array of 1 for
 * the 4 tokens, "layers2" 2 layers declared and 1 present, "vocab" a
 * vocabulary of 5 and an embedding of 4 rows; or "gemma2", well formed but
 * an architecture decode does not run; or well formed with a context
 * length: "window" 64 with a sliding window of 6, "ctx" 16 alone. */
static int write_gguf(const char *path, int n_tensors, const char *variant)
{
    const char *f = variant ? variant : "";
    const char *arch = strcmp(f, "gemma2") == 0 ? "gemma2" : "llama";
    char key[64];
    kvp_buf kv;
    kvp_buf_init(&kv);
    uint64_t n_kv = 0;
#define KV(call) (call, n_kv++)
#define ARCH(suffix) (snprintf(key, sizeof key, "%s.%s", arch, suffix), key)
    KV(g_kv_str(&kv, "general.architecture", arch));
    KV(g_kv_str(&kv, "general.name", "tiny"));
    KV(g_kv_u32(&kv, "general.file_type", 3));
    KV(g_kv_u32(&kv, ARCH("block_count"), strcmp(f, "layers") == 0 ? 1u << 31 : strcmp(f, "layers2") == 0 ? 2 : 1));
    KV(g_kv_u32(&kv, ARCH("embedding_length"), 64));
    KV(g_kv_u32(&kv, ARCH("feed_forward_length"), 48));
    KV(g_kv_u32(&kv, ARCH("attention.head_count"), 2));
    KV(g_kv_u32(&kv, ARCH("attention.key_length"), 4));
    KV(g_kv_str(&kv, "tokenizer.ggml.model", "gpt2"));
    KV(g_str(&kv, "tokenizer.ggml.tokens"));
    kvp_buf_u32(&kv, 9); /* array of */
    kvp_buf_u32(&kv, 8); /* strings */
    int n_tok = strcmp(f, "vocab") == 0 ? 5 : 4;
    kvp_buf_u64(&kv, (uint64_t)n_tok);
    for (int i = 0; i < n_tok; i++)
        g_str(&kv, (const char *[]){"a", "b", "c", "d", "e"}[i]);
    KV(g_str(&kv, "tokenizer.ggml.merges"));
    kvp_buf_u32(&kv, 9);
    kvp_buf_u32(&kv, 8);
    kvp_buf_u64(&kv, 1);
    g_str(&kv, "a b");
    if (strcmp(f, "bos") == 0)
        KV(g_kv_u32(&kv, "tokenizer.ggml.bos_token_id", 4));
    if (strcmp(f, "window") == 0) { /* Mistral's kind: every layer slides, window shorter than the context */
        KV(g_kv_u32(&kv, ARCH("context_length"), 64));
        KV(g_kv_u32(&kv, ARCH("attention.sliding_window"), 6));
    }
    if (strcmp(f, "ctx") == 0) /* a context shorter than a default window of 512 */
        KV(g_kv_u32(&kv, ARCH("context_length"), 16));
    if (strcmp(f, "token-type") == 0) {
        KV(g_str(&kv, "tokenizer.ggml.token_type"));
        kvp_buf_u32(&kv, 9);
        kvp_buf_u32(&kv, 5); /* int32 */
        kvp_buf_u64(&kv, 1);
        kvp_buf_u32(&kv, 1);
    }
#undef KV
#undef ARCH
    kvp_buf b;
    kvp_buf_init(&b);
    kvp_buf_put(&b, "GGUF", 4);
    kvp_buf_u32(&b, 3);
    kvp_buf_u64(&b, (uint64_t)n_tensors);
    kvp_buf_u64(&b, n_kv);
    kvp_buf_put(&b, kv.data, kv.len);
    kvp_buf_free(&kv);
    uint64_t off = 0;
    for (int i = 0; i < n_tensors; i++) {
        g_str(&b, gt[i].name);
        kvp_buf_u32(&b, gt[i].n_dims);
        for (uint32_t d = 0; d < gt[i].n_dims; d++)
            kvp_buf_u64(&b, gt[i].ne[d]);
        kvp_buf_u32(&b, gt[i].type);
        kvp_buf_u64(&b, off);
        off = kvp_align_up(off + gt[i].nbytes, 32);
    }
    kvp_buf_align(&b, 32);
    for (int i = 0; i < n_tensors; i++) {
        kvp_buf_put(&b, gt[i].data, gt[i].nbytes);
        kvp_buf_align(&b, 32);
    }
    FILE *fp = fopen(path, "wb");
    int ok = fp && fwrite(b.data, 1, b.len, fp) == b.len;
    if (fp && fclose(fp) != 0)
        ok = 0;
    kvp_buf_free(&b);
    return ok ? 0 : -1;
}

/* ---- reading an output back ---- */

typedef struct found {
    kvp_tensor_rec t;
    uint8_t *raw;    /* data bytes copy */
    float *y;        /* dequantized */
    int n_tensors;
    kvp_meta config, tok;
    int has_config, has_tok;
    uint8_t fingerprint[16];
    char producer[KVP_PRODUCER_MAX + 1];
} found;

static void found_free(found *f)
{
    free(f->raw);
    free(f->y);
    kvp_meta_free(&f->config);
    if (f->has_tok)
        kvp_meta_free(&f->tok);
    memset(f, 0, sizeof *f);
}

/* Read path whole; keep tensor `name` (dequantized). 0 when valid. */
static int read_back(const char *path, const char *name, found *f)
{
    memset(f, 0, sizeof *f);
    kvp_meta_init(&f->config);
    kvp_err err = {0};
    kvp_in in;
    kvp_reader *r = NULL;
    int rc = kvp_in_open(&in, path, &err);
    if (rc)
        return rc;
    if ((rc = kvp_reader_open(&r, &in, &err)) == 0) {
        memcpy(f->fingerprint, kvp_reader_info(r)->fingerprint, 16);
        memcpy(f->producer, kvp_reader_info(r)->producer, sizeof f->producer);
        kvp_record rec;
        while ((rc = kvp_reader_next(r, &rec, &err)) == 1) {
            if (rec.kind == KVP_KIND_CONFIG) {
                kvp_meta_free(&f->config);
                rc = kvp_meta_record_decode(&rec, &f->config, &err);
                f->has_config = rc == 0;
            } else if (rec.kind == KVP_KIND_TOKENIZER) {
                rc = kvp_meta_record_decode(&rec, &f->tok, &err);
                f->has_tok = rc == 0;
            } else if (rec.kind == KVP_KIND_TENSOR) {
                kvp_tensor_rec t;
                const uint8_t *d, *s, *z;
                rc = kvp_tensor_decode(&rec, &t, &d, &s, &z, &err);
                f->n_tensors++;
                if (rc == 0 && name && strcmp(t.name, name) == 0) {
                    f->t = t;
                    f->raw = malloc(t.data_bytes);
                    memcpy(f->raw, d, t.data_bytes);
                    f->y = malloc(kvp_tensor_numel(&t) * sizeof(float));
                    rc = kvp_dequant_tensor(&t, d, s, z, f->y, NULL, &err);
                }
            }
            if (rc < 0)
                break;
        }
    }
    if (rc < 0)
        printf("read_back %s: %s\n", path, err.msg);
    kvp_reader_free(r);
    kvp_in_close(&in);
    return rc;
}

static uint64_t file_size(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
}

/* Plan and write input to output; returns the code. */
static int convert(const char *input, const char *output, const kvp_convert_opts *o, int zstd, kvp_convert **keep,
                   kvp_err *err)
{
    kvp_convert *cv;
    int rc = kvp_convert_open(&cv, input, err);
    if (rc < 0)
        return rc;
    if ((rc = kvp_convert_plan(cv, o, err)) == 0) {
        kvp_out out;
        if ((rc = kvp_out_open(&out, output, err)) == 0) {
            rc = kvp_convert_write(cv, &out, zstd, "test_convert", NULL, NULL, NULL, err);
            if (rc == 0)
                rc = kvp_out_commit(&out, err);
            else
                kvp_out_abort(&out);
        }
    }
    if (keep && rc == 0)
        *keep = cv;
    else
        kvp_convert_free(cv);
    return rc;
}

static const kvp_convert_item *item_named(const kvp_convert *cv, const char *name)
{
    for (size_t i = 0; i < kvp_convert_count(cv); i++)
        if (strcmp(kvp_convert_item_at(cv, i)->src.name, name) == 0)
            return kvp_convert_item_at(cv, i);
    return NULL;
}

/* ---- tests ---- */

static void test_names(void)
{
    CHECK_EQ_I64(kvp_convert_dtype_from_name("fp8"), KVP_DTYPE_FP8_E4M3);
    CHECK_EQ_I64(kvp_convert_dtype_from_name("FP8-E5M2"), KVP_DTYPE_FP8_E5M2);
    CHECK_EQ_I64(kvp_convert_dtype_from_name("int4"), KVP_DTYPE_I4);
    CHECK_EQ_I64(kvp_convert_dtype_from_name("nvfp4"), KVP_DTYPE_NVFP4);
    CHECK_EQ_I64(kvp_convert_dtype_from_name("keep"), KVP_CONVERT_KEEP);
    CHECK_EQ_I64(kvp_convert_dtype_from_name("q4_k"), -2); /* readable, not writable */
    CHECK_EQ_I64(kvp_convert_dtype_from_name("int3"), -2);
    uint32_t s, g;
    kvp_convert_default_scheme(KVP_DTYPE_I8, &s, &g);
    CHECK(s == KVP_SCHEME_CHANNEL && g == 0);
    kvp_convert_default_scheme(KVP_DTYPE_I4, &s, &g);
    CHECK(s == KVP_SCHEME_GROUP && g == 128);
    kvp_convert_default_scheme(KVP_DTYPE_FP8_E4M3, &s, &g);
    CHECK(s == KVP_SCHEME_TENSOR);
    kvp_convert_default_scheme(KVP_DTYPE_Q8_0, &s, &g);
    CHECK(s == KVP_SCHEME_NONE);
    kvp_err err = {0};
    CHECK(kvp_convert_check_regex("^blk\\.[0-9]+\\.", &err) == 0);
    CHECK(kvp_convert_check_regex("(unclosed", &err) == KVP_EINVAL && strstr(err.msg, "(unclosed"));
}

static double snr_db(const float *x, const float *y, size_t n)
{
    double s = 0, e = 0;
    for (size_t i = 0; i < n; i++) {
        s += (double)x[i] * x[i];
        e += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
    }
    return e == 0 ? INFINITY : 10 * log10(s / e);
}

static void test_gguf_int8(void)
{
    const char *in = tmp_path("tiny.gguf"), *out = tmp_path("tiny-int8.kvp");
    CHECK(write_gguf(in, NT, NULL) == 0);
    kvp_err err = {0};
    kvp_convert_opts o;
    kvp_convert_opts_init(&o);
    o.to = KVP_DTYPE_I8;

    /* The IQ2_XXS tensor stops the plan, naming the tensor and its type ... */
    kvp_convert *cv;
    CHECK(kvp_convert_open(&cv, in, &err) == 0);
    int rc = kvp_convert_plan(cv, &o, &err);
    CHECK(rc == KVP_EUNSUPPORTED && strstr(err.msg, "blk.0.weird.weight") && strstr(err.msg, "unsupported type"));
    kvp_convert_free(cv);
    CHECK(access(out, F_OK) != 0);

    /* ... unless dropped. */
    static const char *const weird[] = {"weird"};
    o.drop = weird, o.n_drop = 1;
    rc = convert(in, out, &o, 0, &cv, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc)
        return;
    CHECK_EQ_U64(kvp_convert_count(cv), NT);
    const kvp_convert_item *q = item_named(cv, "blk.0.attn_q.weight");
    const kvp_convert_item *e = item_named(cv, "token_embd.weight");
    const kvp_convert_item *nrm = item_named(cv, "blk.0.attn_norm.weight");
    const kvp_convert_item *dn = item_named(cv, "blk.0.ffn_down.weight");
    const kvp_convert_item *w = item_named(cv, "blk.0.weird.weight");
    CHECK(q && q->action == KVP_CONVERT_QUANT && q->out.dtype == KVP_DTYPE_I8 && q->out.scheme == KVP_SCHEME_CHANNEL);
    CHECK(q && q->out.n_dim == 2 && q->out.shape[0] == 8 && q->out.shape[1] == 64); /* ne reversed */
    CHECK(e && e->action == KVP_CONVERT_COPY && e->out.dtype == KVP_DTYPE_Q8_0); /* --embed keep */
    CHECK(nrm && nrm->out.dtype == KVP_DTYPE_F32 && nrm->action == KVP_CONVERT_COPY);
    CHECK(dn && dn->out.dtype == KVP_DTYPE_I8 && dn->out.shape[0] == 64 && dn->out.shape[1] == 48);
    CHECK(w && w->action == KVP_CONVERT_DROP);
    uint8_t fp[16], zero[16] = {0};
    kvp_convert_fingerprint(cv, fp);
    CHECK(memcmp(fp, zero, 16) != 0);
    kvp_convert_totals t;
    kvp_convert_totals_get(cv, &t);
    CHECK_EQ_U64(t.n_read, NT);
    CHECK_EQ_U64(t.n_tensors, NT - 1);
    CHECK_EQ_U64(t.n_quantized, 7); /* the 2-D weights but the kept embedding */
    CHECK_EQ_U64(t.n_dropped, 1);
    uint64_t bytes_in = 0;
    for (size_t i = 0; i < kvp_convert_count(cv); i++) /* the rows add up to the total, dropped ones too */
        bytes_in += kvp_convert_item_at(cv, i)->src.data_bytes;
    CHECK_EQ_U64(t.bytes_in, bytes_in);
    CHECK_EQ_U64(t.file_bytes, file_size(out)); /* the dry-run estimate is exact */

    found f;
    CHECK(read_back(out, "blk.0.attn_q.weight", &f) == 0);
    CHECK_EQ_I64(f.n_tensors, NT - 1);
    CHECK(memcmp(f.fingerprint, fp, 16) == 0);
    CHECK_STR(f.producer, "test_convert");
    CHECK_STR(kvp_meta_get_str(&f.config, "general.architecture"), "llama");
    CHECK_STR(kvp_meta_get_str(&f.config, "kvpipe.quantize.to"), "int8");
    CHECK(kvp_meta_find(&f.config, "general.file_type") == NULL);
    CHECK(kvp_meta_find(&f.config, "tokenizer.ggml.model") == NULL);
    CHECK(f.has_tok && kvp_meta_get_str(&f.tok, "tokenizer.ggml.model") != NULL);
    CHECK(f.has_tok && kvp_meta_find(&f.tok, "tokenizer.ggml.tokens") && kvp_meta_find(&f.tok, "tokenizer.ggml.tokens")->n == 4);
    if (f.y) {
        /* error measured against the dequantized q4_1 source, as the item says */
        double s = snr_db(gt[1].ref, f.y, 512);
        kvp_quant_report rep;
        kvp_quant_stats_report(&q->stats, &rep);
        CHECK_MSG(s > 35, "int8 channel SNR %.2f dB", s);
        CHECK_NEAR(rep.snr_db, s, 0.01);
        CHECK_EQ_U64(q->stats.n, 512);
    }
    found_free(&f);
    CHECK(read_back(out, "token_embd.weight", &f) == 0);
    CHECK(f.raw && memcmp(f.raw, gt[0].data, gt[0].nbytes) == 0); /* copied byte for byte */
    found_free(&f);
    kvp_convert_free(cv);
}

/* quantize refuses what the model loader refuses, with its message: the
 * one validation (kvp_model_check) runs in both. */
static void test_validation(void)
{
    static const struct {
        const char *variant, *msg;
    } cases[] = {
        {"bos", "tokenizer.ggml.bos_token_id: 4 is outside the vocabulary of 4"},
        {"layers", "config: 2147483648 layers (want 1..4096)"},
        {"token-type", "tokenizer.ggml.token_type: want arr[i32] of 4, got arr[i32] of 1"},
        {"layers2", "tensor blk.1.attn_norm.weight is missing"},
        {"vocab", "tensor token_embd.weight: shape [64, 4] (2 dims), expected [64, 5]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *in = tmp_path("bad.gguf");
        CHECK(write_gguf(in, NT - 1, cases[i].variant) == 0);
        kvp_convert *cv = NULL;
        kvp_model *m = NULL;
        kvp_err e1 = {0}, e2 = {0};
        kvp_convert_opts o;
        kvp_convert_opts_init(&o);
        /* config and tokenizer at open, tensors at plan: either way before anything is written */
        if (kvp_convert_open(&cv, in, &e1) == 0) {
            CHECK_MSG(kvp_convert_plan(cv, &o, &e1) < 0, "%s: planned", cases[i].variant);
            kvp_convert_free(cv);
            cv = NULL;
        }
        CHECK(e1.code < 0 && cv == NULL);
        CHECK(kvp_model_load(&m, in, &e2) < 0 && m == NULL);
        CHECK_MSG(e1.code == e2.code && strcmp(e1.msg, e2.msg) == 0, "quantize \"%s\", loader \"%s\"", e1.msg,
                  e2.msg);
        CHECK_MSG(strstr(e1.msg, in) && strstr(e1.msg, cases[i].msg), "%s: \"%s\" lacks \"%s\"",
                  cases[i].variant, e1.msg, cases[i].msg);
    }
    /* well formed, but not a model decode runs: converted all the same */
    const char *in = tmp_path("gemma2.gguf"), *out = tmp_path("gemma2.kvp");
    CHECK(write_gguf(in, NT - 1, "gemma2") == 0);
    kvp_convert_opts o;
    kvp_convert_opts_init(&o);
    kvp_err err = {0};
    kvp_model *m = NULL;
    CHECK_MSG(convert(in, out, &o, 0, NULL, &err) == 0, "%s", err.msg);
    CHECK(kvp_model_load(&m, out, &err) == KVP_EUNSUPPORTED && strstr(err.msg, "architecture 'gemma2'"));
    /* the check itself: no config is no config to check; tokenizer keys only when present */
    kvp_meta tok;
    kvp_meta_init(&tok);
    CHECK(kvp_model_check(NULL, NULL, "t", &err) == 0);
    kvp_meta_set_str(&tok, "tokenizer.chat_template", "x", 1);
    CHECK(kvp_model_check(NULL, &tok, "t", &err) == 0);
    kvp_meta_set_u64(&tok, "tokenizer.ggml.eos_token_id", 0);
    CHECK(kvp_model_check(NULL, &tok, "t", &err) == KVP_ENOTFOUND && strstr(err.msg, "t: tokenizer.ggml.model"));
    kvp_meta_free(&tok);
}

/* tiny.gguf opened for conversion, *o the defaults with its odd tensor
 * dropped; NULL (a failed check) when it does not open. */
static kvp_convert *open_tiny(kvp_convert_opts *o)
{
    static const char *const weird[] = {"weird"};
    kvp_err err = {0};
    kvp_convert *cv = NULL;
    CHECK(kvp_convert_open(&cv, tmp_path("tiny.gguf"), &err) == 0);
    kvp_convert_opts_init(o);
    o->drop = weird, o->n_drop = 1;
    return cv;
}

/* A plan that fails leaves none: writing then is refused, not done with
 * the plan before it (its items half replanned, its pattern counts gone). */
static void test_failed_replan(void)
{
    kvp_err err = {0};
    kvp_convert_opts o;
    kvp_convert *cv = open_tiny(&o);
    if (!cv)
        return;
    o.to = KVP_DTYPE_Q8_0;
    CHECK(kvp_convert_plan(cv, &o, &err) == 0);
    static const char *const bad[] = {"(["};
    o.include = bad, o.n_include = 1;
    CHECK(kvp_convert_plan(cv, &o, &err) == KVP_EINVAL);
    kvp_out out;
    const char *p = tmp_path("replan.kvp");
    CHECK(kvp_out_open(&out, p, &err) == 0);
    int rc = kvp_convert_write(cv, &out, 0, "test_convert", NULL, NULL, NULL, &err);
    CHECK_MSG(rc == KVP_EINVAL && strstr(err.msg, "no plan"), "rc %d: %s", rc, err.msg);
    kvp_out_abort(&out);
    o.include = NULL, o.n_include = 0; /* a good plan again: writes */
    CHECK(kvp_convert_plan(cv, &o, &err) == 0);
    CHECK(kvp_out_open(&out, p, &err) == 0);
    CHECK_MSG(kvp_convert_write(cv, &out, 0, "test_convert", NULL, NULL, NULL, &err) == 0, "%s", err.msg);
    CHECK(kvp_out_commit(&out, &err) == 0);
    kvp_convert_free(cv);
}

static void test_fallbacks(void)
{
    kvp_err err = {0};
    kvp_convert_opts o;
    kvp_convert *cv = open_tiny(&o);
    if (!cv)
        return;
    o.to = KVP_DTYPE_I4; /* group 128 on rows of 64 and 48 */
    CHECK(kvp_convert_plan(cv, &o, &err) == 0);
    const kvp_convert_item *q = item_named(cv, "blk.0.attn_q.weight"), *dn = item_named(cv, "blk.0.ffn_down.weight");
    CHECK(q->out.scheme == KVP_SCHEME_GROUP && q->out.group == 64 && strstr(q->note, "group 128"));
    CHECK(dn->out.scheme == KVP_SCHEME_GROUP && dn->out.group == 16); /* 48 = 3 x 16 */
    o.to = KVP_DTYPE_Q8_0; /* rows of 48 hold no whole q8_0 block: f16, which the source already is */
    CHECK(kvp_convert_plan(cv, &o, &err) == 0);
    CHECK(dn->out.dtype == KVP_DTYPE_F16 && dn->action == KVP_CONVERT_COPY && strncmp(dn->note, "f16:", 4) == 0);
    CHECK(q->out.dtype == KVP_DTYPE_Q8_0 && q->note[0] == 0);
    o.to = KVP_DTYPE_FP8_E4M3;
    static const char *const attn_q[] = {"attn_q"}, *const ffn[] = {"ffn"}, *const bad[] = {"(["};
    o.exclude = attn_q, o.n_exclude = 1;
    o.embed = KVP_DTYPE_F16;
    CHECK(kvp_convert_plan(cv, &o, &err) == 0);
    CHECK(q->action == KVP_CONVERT_COPY && q->out.dtype == KVP_DTYPE_Q4_1);
    CHECK(item_named(cv, "token_embd.weight")->out.dtype == KVP_DTYPE_F16);
    CHECK(dn->out.dtype == KVP_DTYPE_FP8_E4M3 && dn->out.scheme == KVP_SCHEME_TENSOR);
    o.exclude = NULL, o.n_exclude = 0;
    o.include = ffn, o.n_include = 1;
    CHECK(kvp_convert_plan(cv, &o, &err) == 0);
    CHECK(q->action == KVP_CONVERT_COPY && dn->action == KVP_CONVERT_QUANT);
    o.include = bad;
    CHECK(kvp_convert_plan(cv, &o, &err) == KVP_EINVAL);
    kvp_convert_free(cv);
}

/* A name kvp(5) refuses (a control character, bytes that are not UTF-8) is
 * refused by the plan, as the writer would refuse it, naming the file and
 * the tensor escaped on one line; --drop leaves it out.  The IQ2_XXS
 * tensor stands in: its name is checked before its type. */
static void test_bad_names(void)
{
    static const struct {
        const char *name, *shown, *drop; /* drop: a pattern that matches it */
    } cases[] = {
        {"blk.0.we\tird\n.weight", "tensor \"blk.0.we\\tird\\n.weight\": the name holds a control character", "ird"},
        {"blk.0.\x1b[31mweird", "tensor \"blk.0.\\x1b[31mweird\": the name holds a control character", "weird"},
        {"blk.0.w\xff" "eird", "tensor \"blk.0.w\\xffeird\": the name is not UTF-8", "eird$"},
    };
    const char *saved = gt[NT - 1].name, *path = tmp_path("badname.gguf");
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        gt[NT - 1].name = cases[k].name;
        CHECK(write_gguf(path, NT, NULL) == 0);
        kvp_err err = {0};
        kvp_convert_opts o;
        kvp_convert_opts_init(&o);
        o.to = KVP_DTYPE_I8;
        kvp_convert *cv;
        CHECK_MSG(kvp_convert_open(&cv, path, &err) == 0, "%s", err.msg);
        if (!cv)
            continue;
        int rc = kvp_convert_plan(cv, &o, &err);
        CHECK_MSG(rc == KVP_EUNSUPPORTED && strncmp(err.msg, path, strlen(path)) == 0 &&
                  strstr(err.msg, cases[k].shown) && strstr(err.msg, "--drop leaves it out") &&
                  !strpbrk(err.msg, "\t\n\x1b"), "%d: %s", rc, err.msg);
        o.drop = &cases[k].drop, o.n_drop = 1;
        CHECK_MSG(kvp_convert_plan(cv, &o, &err) == 0, "%s", err.msg);
        /* dropped, it is still a row of the plan and the report: one line
         * of 8 TSV cells, a JSON line that is JSON (a byte that is not
         * UTF-8 as U+FFFD) */
        const kvp_convert_item *it = item_named(cv, cases[k].name);
        kvp_buf b;
        kvp_buf_init(&b);
        kvp_convert_plan_row(&b, it, 0);
        size_t tabs = 0, lines = 0;
        for (size_t j = 0; j < b.len; j++)
            tabs += b.data[j] == '\t', lines += b.data[j] == '\n';
        CHECK_MSG(tabs == 7 && lines == 1, "%.*s", (int)b.len, (const char *)b.data);
        for (int json = 0; json < 2; json++) {
            b.len = 0;
            if (json)
                kvp_convert_plan_row(&b, it, 1);
            else
                kvp_convert_report_row(&b, it, 1);
            kvp_json *v = NULL;
            CHECK_MSG(b.len && kvp_json_parse(&v, (const char *)b.data, b.len - 1, "row", &err) == 0, "%s", err.msg);
            CHECK(kvp_json_get_str(v, "name") != NULL);
            kvp_json_free(v);
        }
        kvp_buf_free(&b);
        kvp_convert_free(cv);
    }
    gt[NT - 1].name = saved;
}

/* --include and --exclude repeat as --drop does: a tensor any include
 * pattern matches is selected, one any exclude pattern matches is kept; every
 * pattern of every list is counted on every tensor read. */
static void test_pattern_lists(void)
{
    kvp_err err = {0};
    kvp_convert_opts o;
    kvp_convert *cv = open_tiny(&o);
    if (!cv)
        return;
    o.to = KVP_DTYPE_I8;
    const kvp_convert_item *q = item_named(cv, "blk.0.attn_q.weight"), *k = item_named(cv, "blk.0.attn_k.weight"),
                           *v = item_named(cv, "blk.0.attn_v.weight"), *ao = item_named(cv, "blk.0.attn_output.weight"),
                           *dn = item_named(cv, "blk.0.ffn_down.weight"), *g = item_named(cv, "blk.0.ffn_gate.weight"),
                           *up = item_named(cv, "blk.0.ffn_up.weight");
    kvp_convert_totals t;

    /* two includes, both orders: each selects its tensor, the rest are kept */
    static const char *const qd[] = {"attn_q", "ffn_down"}, *const dq[] = {"ffn_down", "attn_q"};
    for (int r = 0; r < 2; r++) {
        o.include = r ? dq : qd, o.n_include = 2;
        CHECK(kvp_convert_plan(cv, &o, &err) == 0);
        CHECK(q->action == KVP_CONVERT_QUANT && dn->action == KVP_CONVERT_QUANT);
        CHECK(k->action == KVP_CONVERT_COPY && g->action == KVP_CONVERT_COPY && ao->action == KVP_CONVERT_COPY);
        kvp_convert_totals_get(cv, &t);
        CHECK_EQ_U64(t.n_quantized, 2);
        CHECK_EQ_U64(kvp_convert_pattern_matches(cv, KVP_CONVERT_PATTERNS_INCLUDE, 0), 1);
        CHECK_EQ_U64(kvp_convert_pattern_matches(cv, KVP_CONVERT_PATTERNS_INCLUDE, 1), 1);
    }
    o.include = NULL, o.n_include = 0;

    /* two excludes: a tensor either matches is kept */
    static const char *const kgu[] = {"attn_k", "ffn_(gate|up)"};
    o.exclude = kgu, o.n_exclude = 2;
    CHECK(kvp_convert_plan(cv, &o, &err) == 0);
    CHECK(k->action == KVP_CONVERT_COPY && g->action == KVP_CONVERT_COPY && up->action == KVP_CONVERT_COPY);
    CHECK(v->action == KVP_CONVERT_QUANT && dn->action == KVP_CONVERT_QUANT && ao->action == KVP_CONVERT_QUANT);
    CHECK_EQ_U64(kvp_convert_pattern_matches(cv, KVP_CONVERT_PATTERNS_EXCLUDE, 0), 1);
    CHECK_EQ_U64(kvp_convert_pattern_matches(cv, KVP_CONVERT_PATTERNS_EXCLUDE, 1), 2);

    /* both lists: selected by an include and matched by no exclude.  The
     * counts take every tensor read: "attn" matches attn_norm, which rule 2
     * makes f32 before the lists apply; "weird" the dropped tensor, and
     * "output_norm" a norm */
    static const char *const inc[] = {"attn", "ffn_gate", "^nothing$"};
    static const char *const exc[] = {"attn_v", "attn_(q|k)", "weird", "output_norm"};
    o.include = inc, o.n_include = 3;
    o.exclude = exc, o.n_exclude = 4;
    CHECK(kvp_convert_plan(cv, &o, &err) == 0);
    CHECK(ao->action == KVP_CONVERT_QUANT && g->action == KVP_CONVERT_QUANT);
    CHECK(q->action == KVP_CONVERT_COPY && k->action == KVP_CONVERT_COPY && v->action == KVP_CONVERT_COPY);
    CHECK(dn->action == KVP_CONVERT_COPY && up->action == KVP_CONVERT_COPY);
    static const uint64_t want_inc[] = {5, 1, 0}, want_exc[] = {1, 2, 1, 1};
    for (size_t i = 0; i < 3; i++)
        CHECK_EQ_U64(kvp_convert_pattern_matches(cv, KVP_CONVERT_PATTERNS_INCLUDE, i), want_inc[i]);
    for (size_t i = 0; i < 4; i++)
        CHECK_EQ_U64(kvp_convert_pattern_matches(cv, KVP_CONVERT_PATTERNS_EXCLUDE, i), want_exc[i]);
    CHECK_EQ_U64(kvp_convert_pattern_matches(cv, KVP_CONVERT_PATTERNS_DROP, 0), 1);
    CHECK_EQ_U64(kvp_convert_pattern_matches(cv, KVP_CONVERT_PATTERNS_INCLUDE, 3), 0); /* past the list */
    CHECK_EQ_U64(kvp_convert_pattern_matches(cv, -1, 0), 0);
    CHECK_EQ_U64(kvp_convert_pattern_matches(cv, KVP_CONVERT_PATTERNS_COUNT, 0), 0);

    /* an include that matches nothing selects nothing: every tensor kept */
    o.include = inc + 2, o.n_include = 1;
    o.exclude = NULL, o.n_exclude = 0;
    CHECK(kvp_convert_plan(cv, &o, &err) == 0);
    kvp_convert_totals_get(cv, &t);
    CHECK_EQ_U64(t.n_quantized, 0);
    CHECK_EQ_U64(kvp_convert_pattern_matches(cv, KVP_CONVERT_PATTERNS_INCLUDE, 0), 0);

    /* a NULL pattern, or no array for a count, is refused; a bad regex in
     * second place too, and a failed plan counts nothing */
    static const char *const hole[] = {"attn", NULL}, *const bad2[] = {"attn", "(["};
    o.include = hole, o.n_include = 2;
    CHECK(kvp_convert_plan(cv, &o, &err) == KVP_EINVAL && strstr(err.msg, "include pattern 2 of 2: none given"));
    o.include = NULL, o.n_include = 0;
    o.exclude = NULL, o.n_exclude = 1;
    CHECK(kvp_convert_plan(cv, &o, &err) == KVP_EINVAL && strstr(err.msg, "exclude pattern 1 of 1: none given"));
    o.exclude = bad2, o.n_exclude = 2;
    CHECK(kvp_convert_plan(cv, &o, &err) == KVP_EINVAL && strstr(err.msg, "(["));
    CHECK_EQ_U64(kvp_convert_pattern_matches(cv, KVP_CONVERT_PATTERNS_EXCLUDE, 0), 0);
    CHECK_EQ_U64(kvp_convert_pattern_matches(cv, KVP_CONVERT_PATTERNS_DROP, 0), 0);
    kvp_convert_free(cv);
}

/* A KVP model as input: int8 -> f16 gives the int8 reconstruction back. */
static void test_kvp_input(void)
{
    const char *in = tmp_path("tiny-int8.kvp"), *out = tmp_path("tiny-f16.kvp");
    kvp_err err = {0};
    kvp_convert_opts o;
    kvp_convert_opts_init(&o);
    o.to = KVP_DTYPE_F16;
    kvp_convert *cv = NULL;
    int rc = convert(in, out, &o, 3, &cv, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc)
        return;
    CHECK_STR(kvp_convert_format_name(cv), "kvp");
    found a, b;
    CHECK(read_back(in, "blk.0.attn_q.weight", &a) == 0);
    CHECK(read_back(out, "blk.0.attn_q.weight", &b) == 0);
    CHECK(b.t.dtype == KVP_DTYPE_F16 && b.n_tensors == NT - 1);
    int same = a.y && b.y;
    for (int i = 0; same && i < 512; i++)
        same = kvp_f16_to_f32(kvp_f32_to_f16(a.y[i])) == b.y[i];
    CHECK(same);
    CHECK_STR(kvp_meta_get_str(&b.config, "kvpipe.quantize.to"), "f16");
    CHECK(b.has_tok);
    found_free(&a);
    found_free(&b);
    kvp_convert_free(cv);
}

static void test_safetensors(void)
{
    const char *out = tmp_path("tiny-st.kvp");
    kvp_err err = {0};
    kvp_convert_opts o;
    kvp_convert_opts_init(&o);
    o.to = KVP_DTYPE_F16;
    kvp_convert *cv;
    CHECK(kvp_convert_open(&cv, golden, &err) == 0);
    CHECK(kvp_convert_plan(cv, &o, &err) == KVP_EUNSUPPORTED && strstr(err.msg, "step") && strstr(err.msg, "I64"));
    kvp_convert_free(cv);
    static const char *const step[] = {"^step$"};
    o.drop = step, o.n_drop = 1;
    char sharded[1100];
    snprintf(sharded, sizeof sharded, "%s/sharded", golden);
    for (int k = 0; k < 2; k++) {
        cv = NULL;
        int rc = convert(k ? sharded : golden, out, &o, 0, &cv, &err);
        CHECK_MSG(rc == 0, "%s", err.msg);
        if (rc)
            return;
        CHECK_STR(kvp_convert_config(cv)->arch, "llama");
        found f;
        /* k_proj is bf16 in the file, element i ((i + 3) % 7 - 3) / 4: exact in f16 */
        CHECK(read_back(out, "model.layers.0.self_attn.k_proj.weight", &f) == 0);
        CHECK(f.t.dtype == KVP_DTYPE_F16 && f.t.n_dim == 2 && f.t.shape[0] == 4 && f.t.shape[1] == 8);
        int ok = f.y != NULL;
        for (int i = 0; ok && i < 32; i++)
            ok = f.y[i] == (float)((i + 3) % 7 - 3) / 4.0f;
        CHECK(ok);
        CHECK_EQ_U64(kvp_convert_count(cv), 12);
        CHECK_EQ_I64(f.n_tensors, 11);
        CHECK_STR(kvp_meta_get_str(&f.config, "kvpipe.rope_type"), "neox");
        found_free(&f);
        /* v_proj is float8_e4m3fn in the file, norms f32 */
        const kvp_convert_item *v = item_named(cv, "model.layers.0.self_attn.v_proj.weight");
        CHECK(v && v->src.dtype == KVP_DTYPE_FP8_E4M3 && v->out.dtype == KVP_DTYPE_F16 && v->stats.sum_sq_err == 0);
        kvp_convert_free(cv);
    }
}

/* Copy file from into path (the bare tests' inputs). */
static int copy_file(const char *from, const char *path)
{
    uint8_t *b;
    size_t n;
    kvp_err err = {0};
    if (kvp_read_file(from, 1u << 20, &b, &n, &err) < 0)
        return -1;
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(b, 1, n, f) == n;
    if (f && fclose(f) != 0)
        ok = 0;
    free(b);
    return ok ? 0 : -1;
}

/* A bare safetensors file (no config.json beside it) converts to a stream of
 * its tensors: no CONFIG, no TOKENIZER, zero fingerprint; every tensor comes
 * back byte-equal when its type is kept, within f16 rounding when cast. */
static void test_bare(void)
{
    char dir[400], src[500], cfg[500], golden_st[1100];
    snprintf(dir, sizeof dir, "%s", tmp_path("bare"));
    snprintf(src, sizeof src, "%s/model.safetensors", dir);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    snprintf(golden_st, sizeof golden_st, "%s/model.safetensors", golden);
    CHECK(mkdir(dir, 0700) == 0 && copy_file(golden_st, src) == 0);
    const char *out = tmp_path("bare.kvp"), *back = tmp_path("bare-back.kvp");
    kvp_err err = {0};
    kvp_convert_opts o;
    kvp_convert_opts_init(&o);
    o.to = KVP_DTYPE_F16;
    static const char *const step[] = {"^step$"};
    o.drop = step, o.n_drop = 1;
    kvp_convert *cv = NULL;
    int rc = convert(src, out, &o, 0, &cv, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc)
        return;
    CHECK(kvp_convert_config(cv) == NULL);
    const char *const *notes;
    CHECK(kvp_convert_notes(cv, &notes) == 1 && strstr(notes[0], "no config.json"));
    uint8_t fp[16], zero[16] = {0};
    kvp_convert_fingerprint(cv, fp);
    CHECK(memcmp(fp, zero, 16) == 0);
    kvp_convert_totals t;
    kvp_convert_totals_get(cv, &t);
    CHECK_EQ_U64(t.file_bytes, file_size(out)); /* the dry run's size holds without a CONFIG record */
    kvp_convert_free(cv);

    kvp_safetensors st;
    CHECK(kvp_safetensors_open(&st, src, &err) == 0);
    int n_checked = 0;
    for (uint64_t i = 0; i < st.n_tensors; i++) {
        const kvp_safetensors_tensor *s = &st.tensors[i];
        if (strcmp(s->name, "step") == 0)
            continue;
        found f;
        CHECK(read_back(out, s->name, &f) == 0);
        CHECK_EQ_I64(f.n_tensors, 11);
        CHECK(!f.has_config && !f.has_tok && memcmp(f.fingerprint, zero, 16) == 0);
        if (!f.raw) {
            CHECK_MSG(0, "%s missing from the output", s->name);
            found_free(&f);
            continue;
        }
        if ((int)f.t.dtype == s->dtype) { /* kept (f32 norms and embedding, f16 weights): the same bytes */
            CHECK_MSG(f.t.data_bytes == s->nbytes && memcmp(f.raw, s->data, s->nbytes) == 0, "%s differs", s->name);
        } else { /* bf16 and fp8 to f16: within f16's rounding */
            uint64_t n = kvp_safetensors_nelems(s);
            float *x = malloc(n * sizeof *x);
            kvp_dtype_get((uint32_t)s->dtype)->to_f32(s->data, x, (int64_t)n);
            int ok = f.t.dtype == KVP_DTYPE_F16;
            for (uint64_t j = 0; ok && j < n; j++)
                ok = fabsf(f.y[j] - x[j]) <= fabsf(x[j]) / 2048;
            CHECK_MSG(ok, "%s: %s to f16 beyond rounding", s->name, kvp_dtype_name((uint32_t)s->dtype));
            free(x);
        }
        n_checked++;
        found_free(&f);
    }
    CHECK_EQ_I64(n_checked, 11);
    kvp_safetensors_close(&st);

    /* the tensor stream converts again (back to f32), still bare */
    o.to = KVP_DTYPE_F32;
    o.drop = NULL, o.n_drop = 0;
    cv = NULL;
    CHECK_MSG((rc = convert(out, back, &o, 0, &cv, &err)) == 0, "%s", err.msg);
    if (rc == 0) {
        CHECK(kvp_convert_config(cv) == NULL && kvp_convert_notes(cv, &notes) == 1 && strstr(notes[0], "no config"));
        kvp_convert_free(cv);
        found a, b;
        CHECK(read_back(out, "model.layers.0.self_attn.v_proj.weight", &a) == 0);
        CHECK(read_back(back, "model.layers.0.self_attn.v_proj.weight", &b) == 0);
        CHECK(!b.has_config && b.n_tensors == 11 && b.t.dtype == KVP_DTYPE_F32 && a.y && b.y &&
              memcmp(a.y, b.y, 32 * sizeof(float)) == 0);
        found_free(&a);
        found_free(&b);
    }

    /* every --drop pattern drops what it matches, and counts it on its own:
     * a tensor two patterns match counts for both, a pattern that matches
     * nothing counts 0 (quantize notes it) */
    static const char *const pats[] = {"^step$", "norm", "^model\\.nothing$", "^step$|layernorm"};
    o.drop = pats, o.n_drop = 4;
    CHECK(kvp_convert_open(&cv, src, &err) == 0);
    CHECK_MSG((rc = kvp_convert_plan(cv, &o, &err)) == 0, "%s", err.msg);
    if (rc == 0) {
        kvp_convert_totals t2;
        kvp_convert_totals_get(cv, &t2);
        CHECK_EQ_U64(t2.n_dropped, 4); /* step, two layer norms, model.norm */
        CHECK(item_named(cv, "model.norm.weight")->action == KVP_CONVERT_DROP);
        CHECK(item_named(cv, "model.layers.0.mlp.up_proj.weight")->action != KVP_CONVERT_DROP);
        CHECK_EQ_U64(kvp_convert_pattern_matches(cv, KVP_CONVERT_PATTERNS_DROP, 0), 1);
        CHECK_EQ_U64(kvp_convert_pattern_matches(cv, KVP_CONVERT_PATTERNS_DROP, 1), 3);
        CHECK_EQ_U64(kvp_convert_pattern_matches(cv, KVP_CONVERT_PATTERNS_DROP, 2), 0);
        CHECK_EQ_U64(kvp_convert_pattern_matches(cv, KVP_CONVERT_PATTERNS_DROP, 3), 3);
        CHECK_EQ_U64(kvp_convert_pattern_matches(cv, KVP_CONVERT_PATTERNS_DROP, 4), 0); /* past n_drop */
        o.n_drop = 1; /* planned again: counts of this plan only */
        CHECK(kvp_convert_plan(cv, &o, &err) == 0);
        CHECK(kvp_convert_pattern_matches(cv, KVP_CONVERT_PATTERNS_DROP, 0) == 1 &&
              kvp_convert_pattern_matches(cv, KVP_CONVERT_PATTERNS_DROP, 1) == 0);
        kvp_convert_totals_get(cv, &t2);
        CHECK_EQ_U64(t2.n_dropped, 1);
        static const char *const holes[] = {"^step$", NULL};
        o.drop = holes, o.n_drop = 2;
        CHECK(kvp_convert_plan(cv, &o, &err) == KVP_EINVAL && strstr(err.msg, "drop pattern 2 of 2"));
        kvp_convert_free(cv);
    }

    /* config.json present makes it a model: a broken one is an error, not bare */
    FILE *f = fopen(cfg, "w");
    CHECK(f && fputs("{", f) >= 0 && fclose(f) == 0);
    CHECK(kvp_convert_open(&cv, src, &err) < 0 && strstr(err.msg, "config.json"));
    unlink(cfg);

    /* a KVP stream with neither config nor tensors has nothing to convert */
    kvp_out ko;
    kvp_writer *w = NULL;
    kvp_writer_opts wo;
    memset(&wo, 0, sizeof wo);
    const char *empty = tmp_path("empty.kvp");
    CHECK(kvp_out_open(&ko, empty, &err) == 0 && kvp_writer_open(&w, &ko, &wo, &err) == 0 &&
          kvp_writer_finish(w, &err) == 0 && kvp_out_commit(&ko, &err) == 0);
    kvp_writer_free(w);
    CHECK(kvp_convert_open(&cv, empty, &err) == KVP_EFORMAT && strstr(err.msg, "nothing to convert"));
}

/* ---- KV streams ---- */

#define KV_BLOCKS 3

static int write_kv_sample(const char *path, uint32_t dtype)
{
    kvp_err err = {0};
    kvp_out out;
    int rc = kvp_out_open(&out, path, &err);
    if (rc)
        return rc;
    kvp_writer_opts wo = {.zstd_level = 0, .producer = "test_convert"};
    memset(wo.fingerprint, 0x5a, sizeof wo.fingerprint);
    kvp_writer *w = NULL;
    kvp_meta m;
    kvp_meta_init(&m);
    kvp_meta_set_str(&m, "general.architecture", "llama", 5);
    uint32_t tokens[40];
    for (int i = 0; i < 40; i++)
        tokens[i] = (uint32_t)(rnd() % 49152);
    kvp_seq_rec s;
    memset(&s, 0, sizeof s);
    s.id = 7;
    s.state = KVP_SEQ_PREFILLED;
    s.n_prompt = s.n_tokens = 40;
    s.next_token = 5;
    s.block_size = 16;
    s.sampling.top_p = 1;
    s.sampling.repeat_penalty = 1;
    if ((rc = kvp_writer_open(&w, &out, &wo, &err)) == 0) {
        rc = kvp_write_meta(w, KVP_KIND_CONFIG, &m, &err);
        if (!rc)
            rc = kvp_write_sequence(w, &s, tokens, NULL, 0, &err);
        uint64_t parent = 0;
        for (uint32_t k = 0; !rc && k < KV_BLOCKS; k++) {
            kvp_kvblock_rec src;
            memset(&src, 0, sizeof src);
            src.seq_id = 7;
            src.block_index = k;
            src.block_size = 16;
            src.n_tokens = k < 2 ? 16 : 8;
            src.layer_begin = 0;
            src.layer_end = 2;
            src.n_head_kv = 3;
            src.head_dim = 8;
            src.dtype = KVP_DTYPE_F32;
            src.parent_hash = parent;
            src.hash = parent = kvp_kvblock_hash(parent, tokens + 16 * k, src.n_tokens);
            size_t n = 2 * 2 * 3 * 16 * 8;
            src.data_bytes = n * 4;
            float *x = calloc(n, sizeof *x);
            for (size_t i = 0; i < n; i++)
                if ((i / 8) % 16 < src.n_tokens) /* only filled slots */
                    x[i] = rndf() * (float)(1 + (i / 128) % 5);
            kvp_kvblock_rec dst;
            rc = kvp_quant_kv_plan(&src, dtype, &dst, &err);
            uint8_t *d = malloc(dst.data_bytes ? dst.data_bytes : 1);
            float sc[12];
            if (!rc)
                rc = kvp_quant_kv_convert(&src, x, NULL, &dst, d, dst.scales_bytes ? sc : NULL, NULL, &err);
            if (!rc)
                rc = kvp_write_kvblock(w, &dst, tokens + 16 * k, d, dst.scales_bytes ? sc : NULL, &err);
            free(x);
            free(d);
        }
        /* sequence 8: sequence 7's first 16 tokens, its block a reference */
        kvp_blockref_rec ref = {8, 0, 16, 0, 0};
        ref.hash = kvp_kvblock_hash(0, tokens, 16);
        uint8_t unknown_meta[3] = {9, 8, 7};
        kvp_piece unknown_piece = {"later", 5};
        s.id = 8, s.n_prompt = s.n_tokens = 16;
        if (!rc)
            rc = kvp_write_sequence(w, &s, tokens, NULL, 0, &err);
        if (!rc)
            rc = kvp_write_blockref(w, &ref, &err);
        if (!rc)
            rc = kvp_writer_record(w, 77, unknown_meta, 3, &unknown_piece, 1, 0, &err);
        if (!rc)
            rc = kvp_writer_finish(w, &err);
        kvp_writer_free(w);
    }
    kvp_meta_free(&m);
    if (!rc)
        rc = kvp_out_commit(&out, &err);
    else
        kvp_out_abort(&out);
    if (rc)
        printf("write_kv_sample: %s\n", err.msg);
    return rc;
}

/* All records of a stream, for comparing two: kind, meta bytes, and the KV
 * blocks dequantized. */
typedef struct kvrec {
    uint32_t kind;
    uint8_t *meta;
    uint32_t meta_size;
    kvp_kvblock_rec b;
    float *y; /* KV block values (filled slots; others 0) */
} kvrec;

static int read_kv(const char *path, kvrec *recs, int max, uint8_t fp[16])
{
    kvp_err err = {0};
    kvp_in in;
    kvp_reader *r = NULL;
    int n = 0, rc = kvp_in_open(&in, path, &err);
    if (rc)
        return rc;
    if ((rc = kvp_reader_open(&r, &in, &err)) == 0) {
        memcpy(fp, kvp_reader_info(r)->fingerprint, 16);
        kvp_record rec;
        while (n < max && (rc = kvp_reader_next(r, &rec, &err)) == 1) {
            kvrec *k = &recs[n++];
            memset(k, 0, sizeof *k);
            k->kind = rec.kind;
            k->meta_size = rec.meta_size;
            k->meta = malloc(rec.meta_size + 1);
            memcpy(k->meta, rec.meta, rec.meta_size);
            if (rec.kind == KVP_KIND_KV_BLOCK) {
                const uint8_t *tok, *d, *s;
                if ((rc = kvp_kvblock_decode(&rec, &k->b, &tok, &d, &s, &err)) < 0)
                    break;
                kvp_kvblock_rec f32;
                size_t nel = 2 * 2 * 3 * 16 * 8;
                k->y = malloc(nel * sizeof(float));
                if ((rc = kvp_quant_kv_plan(&k->b, KVP_DTYPE_F32, &f32, &err)) < 0 ||
                    (rc = kvp_quant_kv_convert(&k->b, d, k->b.scales_bytes ? s : NULL, &f32, k->y, NULL, NULL,
                                               &err)) < 0)
                    break;
            }
        }
    }
    if (rc < 0)
        printf("read_kv %s: %s\n", path, err.msg);
    kvp_reader_free(r);
    kvp_in_close(&in);
    return rc < 0 ? rc : n;
}

static void free_kv(kvrec *recs, int n)
{
    for (int i = 0; i < n; i++) {
        free(recs[i].meta);
        free(recs[i].y);
    }
}

static void test_kv(uint32_t dtype, double min_snr)
{
    const char *in = tmp_path("kv-f16.kvp"), *out = tmp_path("kv-out.kvp");
    CHECK(write_kv_sample(in, KVP_DTYPE_F16) == 0);
    kvp_err err = {0};
    kvp_in i;
    kvp_out o;
    kvp_convert_kv_stats st;
    CHECK(kvp_in_open(&i, in, &err) == 0);
    kvp_in_unmap(&i); /* as from a pipe */
    CHECK(kvp_out_open(&o, out, &err) == 0);
    int rc = kvp_convert_kv_stream(&i, &o, dtype, dtype == KVP_DTYPE_I8 ? 3 : 0, "quantize", &st, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc == 0)
        CHECK(kvp_out_commit(&o, &err) == 0);
    else
        kvp_out_abort(&o);
    kvp_in_close(&i);
    CHECK_EQ_U64(st.n_blocks, KV_BLOCKS);
    CHECK_EQ_U64(st.n_converted, dtype == KVP_DTYPE_F16 ? 0 : KV_BLOCKS);
    CHECK_EQ_U64(st.n_records, 1 + 1 + KV_BLOCKS + 1 + 1 + 1); /* config, sequence, blocks, sequence, ref, 77 */

    kvrec a[16], b[16];
    uint8_t fa[16], fb[16];
    int na = read_kv(in, a, 16, fa), nb = read_kv(out, b, 16, fb);
    CHECK(na == nb && na == 9);
    CHECK(memcmp(fa, fb, 16) == 0);
    for (int k = 0; k < na && k < nb; k++) {
        CHECK_EQ_U64(a[k].kind, b[k].kind);
        if (a[k].kind == KVP_KIND_END) /* counts bytes: differs */
            continue;
        if (a[k].kind != KVP_KIND_KV_BLOCK) {
            CHECK(a[k].meta_size == b[k].meta_size && memcmp(a[k].meta, b[k].meta, a[k].meta_size) == 0);
            continue;
        }
        CHECK_EQ_U64(b[k].b.dtype, dtype);
        CHECK(b[k].b.hash == a[k].b.hash && b[k].b.n_tokens == a[k].b.n_tokens);
        double s = snr_db(a[k].y, b[k].y, 2 * 2 * 3 * 16 * 8);
        CHECK_MSG(s >= min_snr, "block %d to %s: SNR %.2f dB", k, kvp_dtype_name(dtype), s);
    }
    if (dtype != KVP_DTYPE_F16) {
        kvp_quant_report rep;
        kvp_quant_stats_report(&st.stats, &rep);
        CHECK_MSG(rep.snr_db >= min_snr, "stream SNR %.2f", rep.snr_db);
    }
    free_kv(a, na > 0 ? na : 0);
    free_kv(b, nb > 0 ? nb : 0);
}

static void test_kv_errors(void)
{
    kvp_err err = {0};
    kvp_in i;
    kvp_out o;
    const char *out = tmp_path("kv-bad.kvp");
    /* a model file has no KV blocks: passes through; a truncated stream fails and leaves nothing */
    const char *in = tmp_path("kv-f16.kvp");
    uint64_t n = file_size(in);
    const char *cut = tmp_path("kv-cut.kvp");
    FILE *f = fopen(in, "rb"), *g = fopen(cut, "wb");
    char *buf = malloc(n);
    if (f && g && fread(buf, 1, n, f) == n)
        fwrite(buf, 1, n - 100, g);
    if (f)
        fclose(f);
    if (g)
        fclose(g);
    free(buf);
    CHECK(kvp_in_open(&i, cut, &err) == 0);
    CHECK(kvp_out_open(&o, out, &err) == 0);
    int rc = kvp_convert_kv_stream(&i, &o, KVP_DTYPE_FP8_E4M3, 0, "quantize", NULL, &err);
    CHECK(rc < 0 && strstr(err.msg, "kv-cut.kvp"));
    kvp_out_abort(&o);
    kvp_in_close(&i);
    CHECK(access(out, F_OK) != 0);
    CHECK(kvp_in_open(&i, in, &err) == 0);
    CHECK(kvp_out_open(&o, out, &err) == 0);
    CHECK(kvp_convert_kv_stream(&i, &o, KVP_DTYPE_Q4_0, 0, "quantize", NULL, &err) == KVP_EUNSUPPORTED);
    kvp_out_abort(&o);
    kvp_in_close(&i);
    /* a KV stream is not a model */
    kvp_convert *cv;
    CHECK(kvp_convert_open(&cv, in, &err) == KVP_EUNSUPPORTED && strstr(err.msg, "--kv"));
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--write-kv-sample") == 0) {
        int d = argc > 3 ? kvp_dtype_from_name(argv[3]) : KVP_DTYPE_F16;
        return d >= 0 && write_kv_sample(argv[2], (uint32_t)d) == 0 ? 0 : 1;
    }
    if (argc >= 3 && strcmp(argv[1], "--write-gguf") == 0) {
        make_tensors();
        return write_gguf(argv[2], NT, argc > 3 ? argv[3] : NULL) == 0 ? 0 : 1;
    }
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    const char *t = getenv("KVP_TESTS");
    snprintf(golden, sizeof golden, "%s/golden/tiny-st", t ? t : "tests");
    make_tensors();
    test_names();
    test_gguf_int8();
    test_validation();
    test_fallbacks();
    test_failed_replan();
    test_pattern_lists();
    test_bad_names();
    test_kvp_input();
    test_safetensors();
    test_bare();
    test_kv(KVP_DTYPE_FP8_E4M3, 25);
    test_kv(KVP_DTYPE_I8, 35);
    test_kv(KVP_DTYPE_BF16, 40);
    test_kv(KVP_DTYPE_F16, 1e9); /* same dtype: untouched, exact */
    test_kv(KVP_DTYPE_F32, 1e9);
    test_kv_errors();
    for (int i = 0; i < NT; i++) {
        free(gt[i].data);
        free(gt[i].ref);
    }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        printf("could not remove %s\n", tmpdir);
    return unit_done();
}
