/* model.c - load a Llama-family model (GGUF, KVP model file or HF folder)
 * into weight descriptors over the mapping (model.h). */
#include "model.h"
#include "chat.h"
#include "fingerprint.h"
#include "tensor.h"
#include "wire.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#define KVP_UNREADABLE 0xffffffffu /* tensor dtype we have no kvp_dtype for */

/* ---- owned memory ---- */

/* 64-byte aligned, zeroed memory freed with the model; NULL when out of it. */
static void *own(kvp_model *m, uint64_t bytes) { return kvp_owned_alloc(&m->owned, bytes); }

void *kvp_model_own(kvp_model *m, uint64_t bytes) { return own(m, bytes); }

/* The model's file as a read-only mapping (GGUF, or KVP read from a file),
 * or NULL: bytes read from a pipe, and HF shards, are not given back. */
static const kvp_in *file_map(const kvp_model *m)
{
    if (m->base)
        return file_map(m->base);
    const kvp_in *in = m->open_gguf && !m->gguf.owned ? &m->gguf.in : !m->open_gguf && m->open_in ? &m->in : NULL;
    return in && in->map && in->own_map && in->size ? in : NULL;
}

void kvp_model_give_back(const kvp_model *m)
{
    const kvp_in *in = file_map(m);
    if (in)
        madvise((void *)(uintptr_t)in->map, (size_t)in->size, MADV_DONTNEED);
}

int kvp_model_file_backed(const kvp_model *m, const void *p, uint64_t n)
{
    const kvp_in *in = file_map(m);
    const uint8_t *b = p;
    return in && b >= in->map && n <= in->size && (uint64_t)(b - in->map) <= in->size - n;
}

/* p copied into owned memory (NULL stays NULL). */
static int own_copy(kvp_model *m, const void **p, uint64_t n)
{
    if (!*p || !n)
        return 0;
    void *c = own(m, n);
    if (!c)
        return KVP_ENOMEM;
    memcpy(c, *p, (size_t)n);
    *p = c;
    m->copied_bytes += n;
    return 0;
}

static kvp_model_tensor *add_tensor(kvp_model *m, size_t *cap)
{
    if (m->n_tensors == *cap) {
        size_t c = *cap ? 2 * *cap : 64;
        kvp_model_tensor *t = realloc(m->tensors, c * sizeof *t);
        if (!t)
            return NULL;
        m->tensors = t;
        *cap = c;
    }
    kvp_model_tensor *t = &m->tensors[m->n_tensors++];
    memset(t, 0, sizeof *t);
    t->rec.global_scale = 1.0f;
    return t;
}

static int set_name(kvp_model *m, kvp_model_tensor *t, const char *name, kvp_err *err)
{
    size_t n = strlen(name);
    if (n > KVP_NAME_MAX)
        return kvp_err_set(err, KVP_ELIMIT, "%s: tensor name of %zu bytes (at most %d)", m->path, n, KVP_NAME_MAX);
    memcpy(t->rec.name, name, n + 1);
    return 0;
}

/* ---- the three sources, each into the tensor table ---- */

static int open_gguf(kvp_model *m, kvp_in *in, kvp_err *err)
{
    int rc = kvp_gguf_open_in(&m->gguf, in, err);
    if (rc < 0)
        return rc;
    m->open_gguf = 1;
    kvp_config_init(&m->cfg);
    if ((rc = kvp_config_from_meta(&m->cfg, &m->gguf.meta, m->path, err)) < 0)
        return rc;
    size_t cap = 0;
    for (uint64_t i = 0; i < m->gguf.n_tensors; i++) {
        const kvp_gguf_tensor *g = &m->gguf.tensors[i];
        kvp_model_tensor *t = add_tensor(m, &cap);
        if (!t)
            return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", m->path);
        if ((rc = set_name(m, t, g->name, err)) < 0)
            return rc;
        t->rec.dtype = g->dtype < 0 ? KVP_UNREADABLE : (uint32_t)g->dtype;
        t->src_type = g->dtype < 0 ? kvp_gguf_type_name(g->ggml_type) : NULL;
        t->rec.n_dim = g->n_dims;
        for (uint32_t d = 0; d < g->n_dims && d < KVP_MAX_DIMS; d++)
            t->rec.shape[d] = g->ne[g->n_dims - 1 - d]; /* outermost first */
        t->rec.data_bytes = g->nbytes;
        t->data = kvp_gguf_tensor_data(&m->gguf, g);
    }
    return 0;
}

/* One TENSOR record: in place when the stream is mapped and the record is
 * stored raw, else copied (the reader's buffer is reused for the next one). */
static int kvp_tensor(kvp_model *m, const kvp_record *rec, size_t *cap, kvp_err *err)
{
    kvp_model_tensor *t = add_tensor(m, cap);
    if (!t)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", m->path);
    const uint8_t *d, *s, *z;
    int rc = kvp_tensor_decode(rec, &t->rec, &d, &s, &z, err);
    if (rc < 0)
        return kvp_err_prefix(err, "%s", m->path), rc;
    t->data = d, t->scales = s, t->zeros = z;
    if ((rec->flags & KVP_RECORD_ZSTD) || !m->in.map) {
        if (own_copy(m, &t->data, t->rec.data_bytes) < 0 || own_copy(m, &t->scales, t->rec.scales_bytes) < 0 ||
            own_copy(m, &t->zeros, t->rec.zeros_bytes) < 0)
            return kvp_err_set(err, KVP_ENOMEM, "%s: tensor %s: out of memory for %llu bytes", m->path, t->rec.name,
                               (unsigned long long)t->rec.data_bytes);
    }
    return 0;
}

static int open_kvp(kvp_model *m, kvp_in *in, kvp_err *err)
{
    m->in = *in;
    m->open_in = 1;
    int rc;
    kvp_reader *r = NULL;
    kvp_meta cfg;
    int have_cfg = 0;
    size_t cap = 0;
    kvp_meta_init(&cfg);
    if ((rc = kvp_reader_open(&r, &m->in, err)) < 0)
        goto out;
    kvp_record rec;
    while ((rc = kvp_reader_next(r, &rec, err)) == 1) {
        if (rec.kind == KVP_KIND_CONFIG && !have_cfg) {
            if ((rc = kvp_meta_record_decode(&rec, &cfg, err)) < 0)
                break;
            have_cfg = 1;
        } else if (rec.kind == KVP_KIND_TOKENIZER && !m->has_tok_meta) {
            if ((rc = kvp_meta_record_decode(&rec, &m->tok_meta, err)) < 0)
                break;
            m->has_tok_meta = 1;
        } else if (rec.kind == KVP_KIND_TENSOR) {
            if ((rc = kvp_tensor(m, &rec, &cap, err)) < 0)
                break;
        } else if (rec.kind == KVP_KIND_SEQUENCE || rec.kind == KVP_KIND_KV_BLOCK) {
            rc = kvp_err_set(err, KVP_EFORMAT, "%s: a KV stream, not a model file (record %llu is a %s)", m->path,
                             (unsigned long long)rec.index, kvp_kind_name(rec.kind));
            break;
        }
    }
    if (rc < 0)
        goto out;
    if (!have_cfg) {
        rc = kvp_err_set(err, KVP_EFORMAT, "%s: no CONFIG record (not a KVP model file?)", m->path);
        goto out;
    }
    kvp_config_init(&m->cfg);
    rc = kvp_config_from_meta(&m->cfg, &cfg, m->path, err);
out:
    /* the reader names the file (standard input as <stdin>, where the
     * model's path is "-"): once is enough */
    if (rc < 0 && r && !strstr(err->msg, m->path) && !(m->in.name && strstr(err->msg, m->in.name)))
        kvp_err_prefix(err, "%s", m->path);
    kvp_reader_free(r);
    kvp_meta_free(&cfg);
    return rc < 0 ? rc : 0;
}

/* A folder, or a file with neither magic: safetensors. */
static int open_hf(kvp_model *m, kvp_in *in, kvp_err *err)
{
    int rc = kvp_safetensors_release_peeked(in, m->path, err);
    if (rc < 0)
        return rc;
    rc = kvp_safetensors_open(&m->st, m->path, err);
    if (rc < 0)
        return rc;
    m->open_st = 1;
    if ((rc = kvp_config_from_hf(&m->cfg, m->st.dir, err)) < 0)
        return rc;
    /* the keys a model to run needs, named as config.json spells them
     * (kvp_model_check would say "config: 0 vocabulary"; kvcalc's reading
     * of a config.json may leave them out) */
    if (!m->cfg.n_vocab || (!m->cfg.n_ff && !m->cfg.n_expert))
        return kvp_err_set(err, KVP_ENOTFOUND, "%s/config.json: %s: required key missing (or 0)", m->st.dir,
                           !m->cfg.n_vocab ? "vocab_size" : "intermediate_size");
    /* its chat template, for --chat's default system message (the
     * tokenizer itself comes from tokenizer.json) */
    char *tpl = NULL;
    if ((rc = kvp_hf_chat_template(m->st.dir, &tpl, err)) < 0)
        return rc;
    if (rc == 1) /* unreadable: a conversation needing its default system message says why */
        rc = kvp_meta_set_str(&m->tok_meta, KVP_CHAT_TEMPLATE_ERROR, err->msg, strlen(err->msg));
    else
        rc = tpl ? kvp_meta_set_str(&m->tok_meta, "tokenizer.chat_template", tpl, strlen(tpl)) : 0;
    free(tpl);
    if (rc < 0)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", m->path);
    size_t n = strlen(m->st.dir) + sizeof "/config.json";
    char *cfg_path = malloc(n);
    if (!cfg_path)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", m->path);
    snprintf(cfg_path, n, "%s/config.json", m->st.dir);
    rc = kvp_hfq_open(&m->hfq, &m->st, cfg_path, m->quant_note, sizeof m->quant_note, err);
    free(cfg_path);
    if (rc < 0)
        return rc;
    size_t cap = 0;
    for (uint64_t i = 0; i < m->st.n_tensors; i++) {
        const kvp_safetensors_tensor *s = &m->st.tensors[i];
        int32_t role = m->hfq.role ? m->hfq.role[i] : KVP_HFQ_PLAIN;
        if (role == KVP_HFQ_PART)
            continue; /* folded into its weight */
        kvp_model_tensor *t = add_tensor(m, &cap);
        if (!t)
            return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", m->path);
        if (role >= 0) { /* a quantized layer's weight, as hfquant.h describes it */
            const kvp_hfq_tensor *q = &m->hfq.t[role];
            t->rec = q->rec;
            t->data = q->data, t->scales = q->scales, t->zeros = q->zeros;
            continue;
        }
        if ((rc = set_name(m, t, s->name, err)) < 0)
            return rc;
        t->rec.dtype = s->dtype < 0 ? KVP_UNREADABLE : (uint32_t)s->dtype;
        t->rec.n_dim = s->n_dims < KVP_MAX_DIMS ? s->n_dims : KVP_MAX_DIMS;
        for (uint32_t d = 0; d < t->rec.n_dim; d++)
            t->rec.shape[d] = s->shape[d];
        t->rec.data_bytes = s->nbytes;
        t->data = s->data;
        /* the kernels read whole elements: move data not aligned for them */
        if (((uintptr_t)t->data & 3) && own_copy(m, &t->data, s->nbytes) < 0)
            return kvp_err_set(err, KVP_ENOMEM, "%s: tensor %s: out of memory", m->path, s->name);
    }
    return 0;
}

/* ---- binding weights ---- */

static const kvp_model_tensor *find(const kvp_model *m, const char *name)
{
    for (size_t i = 0; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i].rec.name, name) == 0)
            return &m->tensors[i];
    return NULL;
}

static int is_scaled(uint32_t dtype)
{
    return dtype == KVP_DTYPE_I8 || dtype == KVP_DTYPE_I4 || dtype == KVP_DTYPE_FP8_E4M3 ||
           dtype == KVP_DTYPE_FP8_E5M2 || dtype == KVP_DTYPE_FP4_E2M1;
}

/* n values of a scale dtype (f32, f16, bf16) widened to owned f32; scales
 * (not zero points) take the record's global scale. */
static int widen(kvp_model *m, const kvp_model_tensor *t, const void *src, uint64_t n, int is_scale,
                 const float **out, kvp_err *err)
{
    uint32_t sd = t->rec.scale_dtype ? t->rec.scale_dtype : KVP_DTYPE_F32;
    if (sd != KVP_DTYPE_F32 && sd != KVP_DTYPE_F16 && sd != KVP_DTYPE_BF16)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: tensor %s: scales of type %s are not supported (f32, f16, bf16)",
                           m->path, t->rec.name, kvp_dtype_name(sd));
    if (m->check_only) /* records only: the layout is all there is to check */
        return *out = NULL, 0;
    float *f = own(m, n * sizeof(float));
    if (!f)
        return kvp_err_set(err, KVP_ENOMEM, "%s: tensor %s: out of memory for %llu scales", m->path, t->rec.name,
                           (unsigned long long)n);
    const uint8_t *p = src;
    float g = is_scale && t->rec.global_scale != 0 && isfinite(t->rec.global_scale) ? t->rec.global_scale : 1.0f;
    for (uint64_t i = 0; i < n; i++) {
        if (sd == KVP_DTYPE_F32) {
            uint32_t u = kvp_le32(p + 4 * i);
            memcpy(&f[i], &u, 4);
        } else if (sd == KVP_DTYPE_F16) {
            f[i] = kvp_f16_to_f32(kvp_le16(p + 2 * i));
        } else {
            f[i] = kvp_bf16_to_f32(kvp_le16(p + 2 * i));
        }
        f[i] *= g;
    }
    *out = f;
    return 0;
}

/* Scales of a scaled weight [n_out rows of n_in]: layout checked, widened. */
static int bind_scales(kvp_model *m, kvp_weight *w, const kvp_model_tensor *t, kvp_err *err)
{
    const kvp_tensor_rec *r = &t->rec;
    if (!is_scaled(r->dtype)) {
        if (r->scheme != KVP_SCHEME_NONE)
            return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: tensor %s: type %s with a scale scheme is not supported",
                               m->path, r->name, kvp_dtype_name(r->dtype));
        return 0;
    }
    uint64_t per_row;
    switch (r->scheme) {
    case KVP_SCHEME_TENSOR: w->group = w->n_in, w->scale_stride = 0, per_row = 0; break;
    case KVP_SCHEME_CHANNEL: w->group = w->n_in, w->scale_stride = 1, per_row = 1; break;
    case KVP_SCHEME_GROUP:
        if (!r->group || w->n_in % r->group)
            return kvp_err_set(err, KVP_EFORMAT, "%s: tensor %s: group %u does not divide a row of %u", m->path,
                               r->name, r->group, w->n_in);
        w->group = r->group, w->scale_stride = w->n_in / r->group, per_row = w->scale_stride;
        break;
    default:
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: tensor %s: type %s needs a tensor, channel or group scale",
                           m->path, r->name, kvp_dtype_name(r->dtype));
    }
    if (r->flags & KVP_TENSOR_ASYM && r->dtype != KVP_DTYPE_I8 && r->dtype != KVP_DTYPE_I4)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: tensor %s: %s with zero points", m->path, r->name,
                           kvp_dtype_name(r->dtype));
    uint64_t n = per_row ? per_row * w->n_out : 1;
    if (kvp_tensor_scale_count(r) != (int64_t)n || !(m->check_only ? r->scales_bytes : t->scales != NULL))
        return kvp_err_set(err, KVP_EFORMAT, "%s: tensor %s: %lld scales, expected %llu", m->path, r->name,
                           (long long)kvp_tensor_scale_count(r), (unsigned long long)n);
    int rc = widen(m, t, t->scales, n, 1, &w->scales, err);
    if (rc == 0 && (r->flags & KVP_TENSOR_ASYM))
        rc = (m->check_only ? r->zeros_bytes : t->zeros != NULL) ? widen(m, t, t->zeros, n, 0, &w->zeros, err)
                      : kvp_err_set(err, KVP_EFORMAT, "%s: tensor %s: zero points missing", m->path, r->name);
    return rc;
}

/* Bind w to the tensor called gname (GGUF) or hname (HF), checking its type
 * is usable and its shape is [n_out, n_in] outermost first ([n_in] when
 * n_out is 0).  optional: absent is fine. */
static int bind(kvp_model *m, kvp_weight *w, const char *gname, const char *hname, uint64_t n_in, uint64_t n_out,
                int optional, kvp_err *err)
{
    memset(w, 0, sizeof *w);
    w->dtype = -1;
    const kvp_model_tensor *t = find(m, gname);
    if (!t && hname)
        t = find(m, hname);
    if (!t) {
        if (optional)
            return 0;
        return kvp_err_set(err, KVP_ENOTFOUND, "%s: tensor %s is missing", m->path,
                           m->format == KVP_MODEL_HF && hname ? hname : gname);
    }
    const kvp_tensor_rec *r = &t->rec;
    uint32_t want_dims = n_out ? 2 : 1;
    if (r->n_dim != want_dims || r->shape[want_dims - 1] != n_in || (n_out && r->shape[0] != n_out))
        return kvp_err_set(err, KVP_EFORMAT, "%s: tensor %s: shape [%llu, %llu] (%u dims), expected [%llu, %llu]",
                           m->path, r->name, (unsigned long long)r->shape[r->n_dim > 1 ? 1 : 0],
                           (unsigned long long)(r->n_dim > 1 ? r->shape[0] : 1), r->n_dim, (unsigned long long)n_in,
                           (unsigned long long)(n_out ? n_out : 1));
    int64_t rb = r->dtype == KVP_UNREADABLE ? -1 : kvp_dtype_row_bytes(r->dtype, (int64_t)n_in);
    switch (rb < 0 ? KVP_UNREADABLE : r->dtype) {
    case KVP_DTYPE_F32: case KVP_DTYPE_F16: case KVP_DTYPE_BF16:
    case KVP_DTYPE_Q4_0: case KVP_DTYPE_Q4_1: case KVP_DTYPE_Q8_0:
    case KVP_DTYPE_I8: case KVP_DTYPE_I4: case KVP_DTYPE_FP8_E4M3:
    /* no dot kernel: the CPU matmul turns a few rows at a time into f32 */
    case KVP_DTYPE_Q5_0: case KVP_DTYPE_Q5_1: case KVP_DTYPE_Q2_K: case KVP_DTYPE_Q3_K: case KVP_DTYPE_Q4_K:
    case KVP_DTYPE_Q5_K: case KVP_DTYPE_Q6_K: case KVP_DTYPE_IQ4_NL: case KVP_DTYPE_IQ4_XS:
    case KVP_DTYPE_MXFP4: case KVP_DTYPE_NVFP4: case KVP_DTYPE_FP8_E5M2: case KVP_DTYPE_FP4_E2M1:
        break;
    default:
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: tensor %s: type %s is not supported for inference", m->path,
                           r->name, r->dtype != KVP_UNREADABLE ? kvp_dtype_name(r->dtype)
                                    : t->src_type && strcmp(t->src_type, "?") ? t->src_type : "unknown");
    }
    if ((r->dtype == KVP_DTYPE_I4 || r->dtype == KVP_DTYPE_FP4_E2M1) && n_in % 2)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: tensor %s: %s rows of odd length", m->path, r->name,
                           kvp_dtype_name(r->dtype));
    w->name = r->name;
    w->dtype = (int)r->dtype;
    w->n_in = (uint32_t)n_in;
    w->n_out = n_out ? (uint32_t)n_out : 1;
    w->row_bytes = (uint64_t)rb;
    w->data = t->data;
    w->global = r->dtype == KVP_DTYPE_NVFP4 && r->global_scale != 0 && isfinite(r->global_scale) ? r->global_scale
                                                                                                  : 1.0f;
    return bind_scales(m, w, t, err);
}

/* 1-D weights the engine reads as plain floats (norms, biases): f32, or
 * f16/bf16 (as HF checkpoints store them) widened into owned memory. */
static int need_f32(kvp_model *m, kvp_weight *w, kvp_err *err)
{
    if (w->dtype < 0 || w->dtype == KVP_DTYPE_F32)
        return 0;
    if ((w->dtype != KVP_DTYPE_F16 && w->dtype != KVP_DTYPE_BF16) || w->n_out != 1)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: tensor %s: type %s, expected f32", m->path, w->name,
                           kvp_dtype_name((uint32_t)w->dtype));
    if (m->check_only)
        return 0;
    float *f = own(m, (uint64_t)w->n_in * sizeof(float));
    if (!f)
        return kvp_err_set(err, KVP_ENOMEM, "%s: tensor %s: out of memory", m->path, w->name);
    const uint8_t *p = w->data;
    for (uint32_t i = 0; i < w->n_in; i++)
        f[i] = w->dtype == KVP_DTYPE_F16 ? kvp_f16_to_f32(kvp_le16(p + 2 * i)) : kvp_bf16_to_f32(kvp_le16(p + 2 * i));
    m->copied_bytes += (uint64_t)w->n_in * sizeof(float);
    w->data = f;
    w->dtype = KVP_DTYPE_F32;
    w->row_bytes = (uint64_t)w->n_in * sizeof(float);
    return 0;
}

static int bind_layer(kvp_model *m, uint32_t i, kvp_err *err)
{
    const kvp_config *c = &m->cfg;
    kvp_layer *L = &m->layers[i];
    uint64_t d = c->n_embd, q = (uint64_t)c->n_head * c->head_dim, kv = (uint64_t)c->n_head_kv * c->head_dim;
    char gname[96], hname[96];
    int rc = 0;
#define B(field, gsuffix, hsuffix, n_in, n_out, opt)                                                                 \
    do {                                                                                                           \
        snprintf(gname, sizeof gname, "blk.%u.%s", i, gsuffix);                                                    \
        snprintf(hname, sizeof hname, "model.layers.%u.%s", i, hsuffix);                                           \
        if ((rc = bind(m, &L->field, gname, hname, n_in, n_out, opt, err)) < 0)                                    \
            return rc;                                                                                             \
    } while (0)
    B(attn_norm, "attn_norm.weight", "input_layernorm.weight", d, 0, 0);
    B(wq, "attn_q.weight", "self_attn.q_proj.weight", d, q, 0);
    B(wk, "attn_k.weight", "self_attn.k_proj.weight", d, kv, 0);
    B(wv, "attn_v.weight", "self_attn.v_proj.weight", d, kv, 0);
    B(bq, "attn_q.bias", "self_attn.q_proj.bias", q, 0, 1);
    B(bk, "attn_k.bias", "self_attn.k_proj.bias", kv, 0, 1);
    B(bv, "attn_v.bias", "self_attn.v_proj.bias", kv, 0, 1);
    B(wo, "attn_output.weight", "self_attn.o_proj.weight", q, d, 0);
    B(ffn_norm, "ffn_norm.weight", "post_attention_layernorm.weight", d, 0, 0);
    B(w_gate, "ffn_gate.weight", "mlp.gate_proj.weight", d, c->n_ff, 0);
    B(w_up, "ffn_up.weight", "mlp.up_proj.weight", d, c->n_ff, 0);
    B(w_down, "ffn_down.weight", "mlp.down_proj.weight", c->n_ff, d, 0);
#undef B
    if ((rc = need_f32(m, &L->attn_norm, err)) < 0 || (rc = need_f32(m, &L->ffn_norm, err)) < 0 ||
        (rc = need_f32(m, &L->bq, err)) < 0 || (rc = need_f32(m, &L->bk, err)) < 0 ||
        (rc = need_f32(m, &L->bv, err)) < 0)
        return rc;
    if ((L->bq.dtype >= 0) != (L->bk.dtype >= 0) || (L->bq.dtype >= 0) != (L->bv.dtype >= 0))
        return kvp_err_set(err, KVP_EFORMAT, "%s: layer %u has some of the q/k/v biases but not all", m->path, i);
    return 0;
}

/* RoPE inverse frequencies, with llama3 or linear scaling, or the per-pair
 * divisors of a rope_freqs.weight tensor when the file carries one. */
static int bind_rope_freqs(kvp_model *m, kvp_weight *rf, kvp_err *err)
{
    int rc = bind(m, rf, "rope_freqs.weight", NULL, m->cfg.rope_dim / 2, 0, 1, err);
    return rc < 0 ? rc : need_f32(m, rf, err);
}

static int make_inv_freq(kvp_model *m, kvp_err *err)
{
    const kvp_config *c = &m->cfg;
    uint32_t half = c->rope_dim / 2;
    m->inv_freq = calloc(half ? half : 1, sizeof(float));
    if (!m->inv_freq)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", m->path);
    kvp_weight rf;
    int rc = bind_rope_freqs(m, &rf, err);
    if (rc < 0)
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
 * the config, then each tensor as a KVP tensor record describes it. */
static int fingerprint(kvp_model *m, kvp_err *err)
{
    size_t n = m->n_tensors;
    kvp_tensor_rec *r = calloc(n ? n : 1, sizeof *r);
    if (!r)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", m->path);
    for (size_t i = 0; i < n; i++)
        r[i] = m->tensors[i].rec;
    kvp_fingerprint(&m->cfg, r, n, m->fingerprint);
    free(r);
    return 0;
}

static int has_tokenizer_keys(const kvp_meta *m)
{
    for (size_t i = 0; m && i < m->n; i++)
        if (strncmp(m->e[i].key, "tokenizer.ggml.", 15) == 0)
            return 1;
    return 0;
}

/* A tokenizer of more tokens than the vocabulary: ids past it have no
 * embedding row (the loader's rule and quantize's, one message). */
static int vocab_too_small(const char *source, uint64_t n_tok, uint32_t n_vocab, kvp_err *err)
{
    return kvp_err_set(err, KVP_EFORMAT, "%s: the tokenizer has %llu tokens, the model's vocabulary %u (ids past it "
                       "have no embedding row)", source, (unsigned long long)n_tok, n_vocab);
}

int kvp_model_check(const kvp_config *c, const kvp_meta *tok, const char *source, kvp_err *err)
{
    int rc = c ? kvp_config_check(c, source, err) : 0;
    if (rc == 0 && has_tokenizer_keys(tok))
        rc = kvp_tokenizer_check_meta(tok, source, err);
    /* kvp_model_load_tokenizer's rule, so quantize writes no model the
     * loader then refuses (a tokenizer.json of 128,256 tokens beside a
     * vocabulary of 49,152) */
    const kvp_meta_entry *toks = rc == 0 && c && tok && c->n_vocab ? kvp_meta_find(tok, "tokenizer.ggml.tokens") : NULL;
    if (toks && toks->n > c->n_vocab)
        rc = vocab_too_small(source, toks->n, c->n_vocab, err);
    return rc;
}

/* What the engine runs, beyond what every model satisfies. */
static int check_supported(const kvp_model *m, kvp_err *err)
{
    const kvp_config *c = &m->cfg;
    if (strcmp(c->arch, "llama") != 0 && strcmp(c->arch, "mistral") != 0 && strcmp(c->arch, "qwen2") != 0)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: architecture '%s' is not supported (llama, mistral, qwen2)",
                           m->path, c->arch);
    if (!c->n_ff)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: a mixture of experts is not supported (no dense feed-forward "
                           "width)", m->path);
    if (c->kv_lora_rank) /* (the one case kvp_config_check lets RoPE be wider than a head) */
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: multi-head latent attention is not supported", m->path);
    if (c->rope_scaling == KVP_ROPE_SCALING_OTHER)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: RoPE scaling \"%s\" is not supported (none, linear, llama3)",
                           m->path, c->rope_scaling_name);
    if (c->hidden_act[0]) /* run as SiLU, it would be another model */
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: the activation (hidden_act) \"%s\" is not supported (silu)", m->path,
                           c->hidden_act);
    return 0;
}

/* GGUF, KVP or HF, from the first bytes (a folder is HF), opened once:
 * the source's reader takes *in and the bytes peeked in it. */
static int open_source(kvp_model *m, kvp_err *err)
{
    kvp_in in;
    int kind, rc = kvp_in_open_kind(&in, m->path, &kind, err);
    if (rc < 0)
        return rc;
    m->format = kind == KVP_FILE_GGUF ? KVP_MODEL_GGUF : kind == KVP_FILE_KVP ? KVP_MODEL_KVP : KVP_MODEL_HF;
    return m->format == KVP_MODEL_GGUF ? open_gguf(m, &in, err) : m->format == KVP_MODEL_KVP ? open_kvp(m, &in, err)
                                                                                             : open_hf(m, &in, err);
}

/* A bias the engine applies: the q, k and v projections' (Qwen2's); an
 * output projection's or a feed-forward's (HF's attention_bias and
 * mlp_bias) would be left out, the result another model's. */
static int applied_bias(const char *name)
{
    static const char *const ends[] = {".attn_q.bias", ".attn_k.bias", ".attn_v.bias", ".q_proj.bias", ".k_proj.bias",
                                       ".v_proj.bias"};
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++) {
        size_t k = strlen(ends[i]);
        if (n >= k && strcmp(name + n - k, ends[i]) == 0)
            return 1;
    }
    return 0;
}

/* A layer's tensor past the config's layer count (block_count 1 beside
 * blk.1.*): the file and its config disagree on the model, and running
 * the first layers alone would be silently another model (llama.cpp
 * refuses such a file too); a bias the engine does not apply likewise. */
static int no_stray_tensor(const kvp_model *m, kvp_err *err)
{
    for (size_t i = 0; i < m->n_tensors; i++) {
        const char *name = m->tensors[i].rec.name;
        size_t n = strlen(name);
        if (n > 5 && strcmp(name + n - 5, ".bias") == 0 && !applied_bias(name))
            return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: tensor %s: a bias this engine does not apply (only the "
                               "q, k and v projections' are)", m->path, name);
        unsigned long l;
        int at = 0;
        if (sscanf(name, "blk.%lu.%n", &l, &at) == 1 && at > 0 && l >= m->cfg.n_layer)
            ;
        else if (at = 0, sscanf(name, "model.layers.%lu.%n", &l, &at) == 1 && at > 0 && l >= m->cfg.n_layer)
            ;
        else
            continue;
        return kvp_err_set(err, KVP_EFORMAT, "%s: tensor %s belongs to layer %lu, but the model has %u layers (its "
                           "block_count or num_hidden_layers)", m->path, name, l, m->cfg.n_layer);
    }
    return 0;
}

static int bind_all(kvp_model *m, kvp_err *err)
{
    const kvp_config *c = &m->cfg;
    int rc;
    if ((rc = bind(m, &m->tok_embd, "token_embd.weight", "model.embed_tokens.weight", c->n_embd, c->n_vocab, 0,
                   err)) < 0 ||
        (rc = bind(m, &m->output_norm, "output_norm.weight", "model.norm.weight", c->n_embd, 0, 0, err)) < 0 ||
        (rc = need_f32(m, &m->output_norm, err)) < 0 ||
        (rc = bind(m, &m->output, "output.weight", "lm_head.weight", c->n_embd, c->n_vocab, 1, err)) < 0)
        return rc;
    /* an HF config says whether the head is tied (tie_word_embeddings, or
     * its architecture's default): an untied one missing is missing, not
     * the embeddings (GGUF's convention, where no flag says) */
    if (m->output.dtype < 0 && m->format == KVP_MODEL_HF && !c->tied_embeddings)
        return kvp_err_set(err, KVP_ENOTFOUND, "%s: tensor lm_head.weight is missing (config.json: "
                           "tie_word_embeddings is false)", m->path);
    m->cfg.tied_embeddings = m->output.dtype < 0;
    if (m->cfg.tied_embeddings)
        m->output = m->tok_embd;
    m->layers = calloc(c->n_layer, sizeof *m->layers);
    if (!m->layers)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", m->path);
    if ((rc = no_stray_tensor(m, err)) < 0) /* before a layer's own checks: the stray tensor is the cause */
        return rc;
    for (uint32_t i = 0; i < c->n_layer; i++)
        if ((rc = bind_layer(m, i, err)) < 0)
            return rc;
    m->cfg.attn_bias = m->layers[0].bq.dtype >= 0;
    return 0;
}

int kvp_model_check_tensors(const kvp_config *c, const kvp_tensor_rec *recs, size_t n, int format,
                            const char *source, kvp_err *err)
{
    kvp_model m;
    memset(&m, 0, sizeof m);
    m.cfg = *c;
    if (m.cfg.rope_dim == 0) /* as kvp_model_load defaults it */
        m.cfg.rope_dim = m.cfg.head_dim;
    m.format = format;
    m.path = (char *)(uintptr_t)source; /* only named in messages */
    m.check_only = 1;
    kvp_err ignored = {0};
    if (check_supported(&m, &ignored) < 0) /* its tensor names and shapes are not ours to know */
        return 0;
    m.tensors = calloc(n ? n : 1, sizeof *m.tensors);
    if (!m.tensors)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", source);
    for (size_t i = 0; i < n; i++)
        m.tensors[i].rec = recs[i];
    m.n_tensors = n;
    kvp_weight rf;
    int rc = bind_all(&m, err);
    if (rc == 0)
        rc = bind_rope_freqs(&m, &rf, err);
    free(m.layers);
    free(m.tensors);
    return rc;
}

/* A model of path with its file's metadata read (open_source), no tensor
 * bound yet: *out, or NULL and a negative code. */
static int open_model(kvp_model **out, const char *path, kvp_err *err)
{
    *out = NULL;
    kvp_model *m = calloc(1, sizeof *m);
    if (!m || !(m->path = strdup(path))) {
        free(m);
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", path);
    }
    kvp_meta_init(&m->tok_meta);
    int rc = open_source(m, err);
    if (rc < 0) {
        kvp_model_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

int kvp_model_load(kvp_model **out, const char *path, kvp_err *err)
{
    kvp_model *m;
    int rc = open_model(&m, path, err);
    *out = NULL;
    if (rc < 0)
        return rc;
    if (m->cfg.rope_dim == 0)
        m->cfg.rope_dim = m->cfg.head_dim;
    if ((rc = kvp_model_check(&m->cfg, kvp_model_tok_meta(m), m->path, err)) < 0 || (rc = check_supported(m, err)) < 0 ||
        (rc = bind_all(m, err)) < 0 || (rc = make_inv_freq(m, err)) < 0)
        goto fail;
    for (size_t i = 0; i < m->n_tensors; i++)
        m->weight_bytes += m->tensors[i].rec.data_bytes + m->tensors[i].rec.scales_bytes +
                           m->tensors[i].rec.zeros_bytes;
    if ((rc = fingerprint(m, err)) < 0)
        goto fail;
    *out = m;
    return 0;
fail:
    kvp_model_free(m);
    return rc;
}

static int load_tokenizer_any(const kvp_model *m, kvp_tokenizer **t, kvp_err *err);

int kvp_model_load_vocab(kvp_model **out, kvp_tokenizer **tok, const char *path, kvp_err *err)
{
    *out = NULL;
    *tok = NULL;
    kvp_model *m;
    /* the metadata only: no tensor is bound (a vocabulary file has none) */
    int rc = open_model(&m, path, err);
    if (rc < 0)
        return rc;
    if ((rc = load_tokenizer_any(m, tok, err)) < 0) {
        kvp_model_free(m);
        return rc;
    }
    /* ids are checked against the vocabulary (--tokens): the tokenizer's
     * where no embedding says how many rows the model has */
    if (!m->cfg.n_vocab)
        m->cfg.n_vocab = (uint32_t)kvp_tokenizer_n_vocab(*tok);
    *out = m;
    return 0;
}

void kvp_model_free(kvp_model *m)
{
    if (!m)
        return;
    if (m->base) { /* a shard (shard.h): only its own copies and layers */
        kvp_owned_free(&m->owned);
        free(m->layers);
        free(m);
        return;
    }
    if (m->open_gguf)
        kvp_gguf_close(&m->gguf);
    if (m->open_in)
        kvp_in_close(&m->in);
    if (m->open_st)
        kvp_safetensors_close(&m->st);
    kvp_hfq_set_free(&m->hfq);
    kvp_meta_free(&m->tok_meta);
    kvp_owned_free(&m->owned);
    free(m->tensors);
    free(m->layers);
    free(m->inv_freq);
    free(m->path);
    free(m);
}

/* A tokenizer of more tokens than the model's vocabulary gives ids the
 * embedding has no row for: refused here, not at the first such token of
 * a job (the config's vocab_size, say, cut below tokenizer.json's). */
int kvp_model_load_tokenizer(const kvp_model *m, kvp_tokenizer **t, kvp_err *err)
{
    int rc = load_tokenizer_any(m, t, err);
    if (rc < 0 || kvp_tokenizer_n_vocab(*t) <= m->cfg.n_vocab)
        return rc;
    size_t n = kvp_tokenizer_n_vocab(*t);
    kvp_tokenizer_free(*t);
    *t = NULL;
    return vocab_too_small(m->path, n, m->cfg.n_vocab, err);
}

static int load_tokenizer_any(const kvp_model *m, kvp_tokenizer **t, kvp_err *err)
{
    *t = NULL;
    switch (m->format) {
    case KVP_MODEL_GGUF:
        return kvp_tokenizer_load_meta(t, &m->gguf.meta, m->path, err);
    case KVP_MODEL_KVP:
        if (!m->has_tok_meta)
            return kvp_err_set(err, KVP_ENOTFOUND, "%s: no TOKENIZER record: the programs that run a model need "
                               "its tokenizer (quantize copies it from a source that has one)", m->path);
        return kvp_tokenizer_load_meta(t, &m->tok_meta, m->path, err);
    default: {
        size_t n = strlen(m->st.dir) + sizeof "/tokenizer.json";
        char *p = malloc(n);
        if (!p)
            return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", m->path);
        snprintf(p, n, "%s/tokenizer.json", m->st.dir);
        int rc = kvp_tokenizer_load_json(t, p, err);
        free(p);
        return rc;
    }
    }
}

void kvp_model_fingerprint_hex(const kvp_model *m, char buf[33]) { kvp_fingerprint_hex(m->fingerprint, buf); }

const kvp_meta *kvp_model_tok_meta(const kvp_model *m)
{
    if (m->format == KVP_MODEL_HF) /* its chat template alone, when it has one */
        return m->tok_meta.n ? &m->tok_meta : NULL;
    return m->format == KVP_MODEL_GGUF ? &m->gguf.meta : m->has_tok_meta ? &m->tok_meta : NULL;
}

const char *kvp_model_format_name(const kvp_model *m)
{
    return m->format == KVP_MODEL_GGUF ? "gguf" : m->format == KVP_MODEL_KVP ? "kvp" : "hf";
}
