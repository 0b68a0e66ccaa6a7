/* model.c - load a Llama-family GGUF into weight descriptors over the mapping. */
#include "model.h"
#include "fingerprint.h"
#include "tensor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bind w to tensor `name`, checking its type is usable and its dims are
 * [n_in, n_out] (n_out 0 for a 1-D tensor).  optional: absent is fine. */
static int bind(kvp_model *m, kvp_weight *w, const char *name, uint64_t n_in, uint64_t n_out, int optional,
                kvp_err *err)
{
    memset(w, 0, sizeof *w);
    w->dtype = -1;
    const kvp_gguf_tensor *t = kvp_gguf_find(&m->gguf, name);
    if (!t) {
        if (optional)
            return 0;
        return kvp_err_set(err, KVP_ENOTFOUND, "%s: tensor %s is missing", m->path, name);
    }
    uint64_t want_dims = n_out ? 2 : 1;
    if (t->n_dims != want_dims || t->ne[0] != n_in || (n_out && t->ne[1] != n_out))
        return kvp_err_set(err, KVP_EFORMAT, "%s: tensor %s: shape [%llu, %llu] (%u dims), expected [%llu, %llu]",
                           m->path, name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], t->n_dims,
                           (unsigned long long)n_in, (unsigned long long)(n_out ? n_out : 1));
    if (t->dtype < 0 || kvp_dtype_row_bytes((uint32_t)t->dtype, (int64_t)n_in) < 0)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: tensor %s: type %s is not supported", m->path, name,
                           kvp_gguf_type_name(t->ggml_type));
    switch (t->dtype) {
    case KVP_DTYPE_F32: case KVP_DTYPE_F16: case KVP_DTYPE_BF16:
    case KVP_DTYPE_Q4_0: case KVP_DTYPE_Q4_1: case KVP_DTYPE_Q8_0:
        break;
    default:
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: tensor %s: type %s has no kernel (use f32, f16, bf16, "
                           "q4_0, q4_1 or q8_0)", m->path, name, kvp_gguf_type_name(t->ggml_type));
    }
    w->name = t->name;
    w->dtype = t->dtype;
    w->n_in = (uint32_t)n_in;
    w->n_out = n_out ? (uint32_t)n_out : 1;
    w->row_bytes = (uint64_t)kvp_dtype_row_bytes((uint32_t)t->dtype, (int64_t)n_in);
    w->data = kvp_gguf_tensor_data(&m->gguf, t);
    return 0;
}

/* 1-D weights the engine reads as plain floats (norms, biases) must be f32. */
static int need_f32(const kvp_model *m, const kvp_weight *w, kvp_err *err)
{
    if (w->dtype >= 0 && w->dtype != KVP_DTYPE_F32)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: tensor %s: type %s, expected f32", m->path, w->name,
                           kvp_dtype_name((uint32_t)w->dtype));
    return 0;
}

static int bind_layer(kvp_model *m, uint32_t i, kvp_err *err)
{
    const kvp_config *c = &m->cfg;
    kvp_layer *L = &m->layers[i];
    uint64_t d = c->n_embd, q = (uint64_t)c->n_head * c->head_dim, kv = (uint64_t)c->n_head_kv * c->head_dim;
    char name[96];
    int rc = 0;
#define B(field, suffix, n_in, n_out, opt)                                                                            \
    do {                                                                                                           \
        snprintf(name, sizeof name, "blk.%u.%s", i, suffix);                                                       \
        if ((rc = bind(m, &L->field, name, n_in, n_out, opt, err)) < 0)                                            \
            return rc;                                                                                             \
    } while (0)
    B(attn_norm, "attn_norm.weight", d, 0, 0);
    B(wq, "attn_q.weight", d, q, 0);
    B(wk, "attn_k.weight", d, kv, 0);
    B(wv, "attn_v.weight", d, kv, 0);
    B(bq, "attn_q.bias", q, 0, 1);
    B(bk, "attn_k.bias", kv, 0, 1);
    B(bv, "attn_v.bias", kv, 0, 1);
    B(wo, "attn_output.weight", q, d, 0);
    B(ffn_norm, "ffn_norm.weight", d, 0, 0);
    B(w_gate, "ffn_gate.weight", d, c->n_ff, 0);
    B(w_up, "ffn_up.weight", d, c->n_ff, 0);
    B(w_down, "ffn_down.weight", c->n_ff, d, 0);
#undef B
    if ((rc = need_f32(m, &L->attn_norm, err)) < 0 || (rc = need_f32(m, &L->ffn_norm, err)) < 0 ||
        (rc = need_f32(m, &L->bq, err)) < 0 || (rc = need_f32(m, &L->bk, err)) < 0 ||
        (rc = need_f32(m, &L->bv, err)) < 0)
        return rc;
    return 0;
}

/* RoPE inverse frequencies, with llama3 or linear scaling, or the per-pair
 * divisors of a rope_freqs.weight tensor when the file carries one. */
static int make_inv_freq(kvp_model *m, kvp_err *err)
{
    const kvp_config *c = &m->cfg;
    uint32_t half = c->rope_dim / 2;
    m->inv_freq = calloc(half ? half : 1, sizeof(float));
    if (!m->inv_freq)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", m->path);
    kvp_weight rf;
    int rc = bind(m, &rf, "rope_freqs.weight", half, 0, 1, err);
    if (rc < 0 || (rc = need_f32(m, &rf, err)) < 0)
        return rc;
    for (uint32_t i = 0; i < half; i++) {
        double f = pow(c->rope_theta, -2.0 * i / c->rope_dim);
        if (rf.dtype >= 0) {
            f /= ((const float *)rf.data)[i];
        } else if (c->rope_scaling == KVP_ROPE_SCALING_LLAMA3 && c->rope_factor > 0) {
            double L = c->rope_orig_ctx ? c->rope_orig_ctx : 8192, wl = 2 * M_PI / f;
            double lo = c->rope_low_freq_factor > 0 ? c->rope_low_freq_factor : 1;
            double hi = c->rope_high_freq_factor > 0 ? c->rope_high_freq_factor : 4;
            if (wl > L / lo) {
                f /= c->rope_factor;
            } else if (wl >= L / hi) {
                double s = (L / wl - lo) / (hi - lo);
                f = (1 - s) * f / c->rope_factor + s * f;
            }
        } else if (c->rope_scaling == KVP_ROPE_SCALING_LINEAR && c->rope_factor > 0) {
            f /= c->rope_factor;
        }
        m->inv_freq[i] = (float)f;
    }
    return 0;
}

/* Fingerprint (lib/fingerprint.h, shared with quantize's KVP model files):
 * the config, then each tensor as a KVP tensor record would describe it. */
static int fingerprint(kvp_model *m, kvp_err *err)
{
    size_t n = (size_t)m->gguf.n_tensors;
    kvp_tensor_rec *r = calloc(n ? n : 1, sizeof *r);
    if (!r)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", m->path);
    for (size_t i = 0; i < n; i++) {
        const kvp_gguf_tensor *t = &m->gguf.tensors[i];
        snprintf(r[i].name, sizeof r[i].name, "%s", t->name);
        r[i].dtype = (uint32_t)t->dtype; /* unsupported types hash as 0xffffffff */
        r[i].n_dim = t->n_dims;
        for (uint32_t d = 0; d < t->n_dims && d < KVP_MAX_DIMS; d++)
            r[i].shape[d] = t->ne[t->n_dims - 1 - d]; /* outermost first */
    }
    kvp_fingerprint(&m->cfg, r, n, m->fingerprint);
    free(r);
    return 0;
}

static int check_config(const kvp_model *m, kvp_err *err)
{
    const kvp_config *c = &m->cfg;
    if (strcmp(c->arch, "llama") != 0 && strcmp(c->arch, "mistral") != 0 && strcmp(c->arch, "qwen2") != 0)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: architecture '%s' is not supported (llama, mistral, qwen2)",
                           m->path, c->arch);
    if (!c->n_layer || !c->n_embd || !c->n_ff || !c->n_head || !c->n_head_kv || !c->head_dim || !c->n_vocab)
        return kvp_err_set(err, KVP_EFORMAT, "%s: config has a zero dimension", m->path);
    if (c->n_head % c->n_head_kv)
        return kvp_err_set(err, KVP_EFORMAT, "%s: %u heads are not a multiple of %u KV heads", m->path, c->n_head,
                           c->n_head_kv);
    if (c->rope_dim > c->head_dim || c->rope_dim % 2 || c->head_dim > 1024)
        return kvp_err_set(err, KVP_EFORMAT, "%s: rope dimension %u with head dim %u", m->path, c->rope_dim,
                           c->head_dim);
    if (c->n_layer > 4096 || c->n_embd > (1u << 20) || c->n_ff > (1u << 22) || c->n_vocab > (1u << 24))
        return kvp_err_set(err, KVP_ELIMIT, "%s: config dimensions beyond what we load", m->path);
    return 0;
}

int kvp_model_load(kvp_model **out, const char *path, kvp_err *err)
{
    *out = NULL;
    kvp_model *m = calloc(1, sizeof *m);
    if (!m || !(m->path = strdup(path))) {
        free(m);
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", path);
    }
    int rc = kvp_gguf_open(&m->gguf, path, err);
    if (rc < 0)
        goto fail;
    kvp_config_init(&m->cfg);
    if ((rc = kvp_config_from_meta(&m->cfg, &m->gguf.meta, path, err)) < 0)
        goto fail;
    if (m->cfg.rope_dim == 0)
        m->cfg.rope_dim = m->cfg.head_dim;
    if ((rc = check_config(m, err)) < 0)
        goto fail;
    const kvp_config *c = &m->cfg;
    if ((rc = bind(m, &m->tok_embd, "token_embd.weight", c->n_embd, c->n_vocab, 0, err)) < 0 ||
        (rc = bind(m, &m->output_norm, "output_norm.weight", c->n_embd, 0, 0, err)) < 0 ||
        (rc = need_f32(m, &m->output_norm, err)) < 0 ||
        (rc = bind(m, &m->output, "output.weight", c->n_embd, c->n_vocab, 1, err)) < 0)
        goto fail;
    m->cfg.tied_embeddings = m->output.dtype < 0;
    if (m->cfg.tied_embeddings)
        m->output = m->tok_embd;
    m->layers = calloc(c->n_layer, sizeof *m->layers);
    if (!m->layers) {
        rc = kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    for (uint32_t i = 0; i < c->n_layer; i++)
        if ((rc = bind_layer(m, i, err)) < 0)
            goto fail;
    m->cfg.attn_bias = m->layers[0].bq.dtype >= 0;
    if ((rc = make_inv_freq(m, err)) < 0)
        goto fail;
    for (uint64_t i = 0; i < m->gguf.n_tensors; i++)
        m->weight_bytes += m->gguf.tensors[i].nbytes;
    if ((rc = fingerprint(m, err)) < 0)
        goto fail;
    *out = m;
    return 0;
fail:
    kvp_model_free(m);
    return rc;
}

void kvp_model_free(kvp_model *m)
{
    if (!m)
        return;
    kvp_gguf_close(&m->gguf);
    free(m->layers);
    free(m->inv_freq);
    free(m->path);
    free(m);
}

void kvp_model_fingerprint_hex(const kvp_model *m, char buf[33]) { kvp_fingerprint_hex(m->fingerprint, buf); }
