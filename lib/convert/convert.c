/* convert.c - model conversion: open the input, list its tensors, plan each
 * tensor's output (see convert.h for the rules).  Writing is convert_write.c. */
#include "convert_impl.h"

#include "fingerprint.h"
#include "json.h"
#include "tokenizer.h"
#include "unicode.h"

#include <errno.h>
#include <regex.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#define TOKENIZER_JSON_MAX (UINT64_C(256) << 20) /* bytes of tokenizer.json we read */


/* ---- names and defaults ---- */

static const struct {
    const char *name;
    int dtype;
} target_names[] = {
    {"keep", KVP_CONVERT_KEEP},
    {"f32", KVP_DTYPE_F32},
    {"f16", KVP_DTYPE_F16},
    {"bf16", KVP_DTYPE_BF16},
    {"fp8", KVP_DTYPE_FP8_E4M3},
    {"fp8-e4m3", KVP_DTYPE_FP8_E4M3},
    {"fp8_e4m3", KVP_DTYPE_FP8_E4M3},
    {"e4m3", KVP_DTYPE_FP8_E4M3},
    {"fp8-e5m2", KVP_DTYPE_FP8_E5M2},
    {"fp8_e5m2", KVP_DTYPE_FP8_E5M2},
    {"e5m2", KVP_DTYPE_FP8_E5M2},
    {"int8", KVP_DTYPE_I8},
    {"i8", KVP_DTYPE_I8},
    {"int4", KVP_DTYPE_I4},
    {"i4", KVP_DTYPE_I4},
    {"fp4", KVP_DTYPE_FP4_E2M1},
    {"fp4_e2m1", KVP_DTYPE_FP4_E2M1},
    {"nvfp4", KVP_DTYPE_NVFP4},
    {"mxfp4", KVP_DTYPE_MXFP4},
    {"q8_0", KVP_DTYPE_Q8_0},
    {"q4_0", KVP_DTYPE_Q4_0},
    {"q4_1", KVP_DTYPE_Q4_1},
    {"q5_0", KVP_DTYPE_Q5_0},
    {"q5_1", KVP_DTYPE_Q5_1},
};

int kvp_convert_dtype_from_name(const char *name)
{
    for (size_t i = 0; i < sizeof target_names / sizeof target_names[0]; i++)
        if (strcasecmp(name, target_names[i].name) == 0)
            return target_names[i].dtype;
    return -2;
}

int kvp_convert_dtype_scaled(int dtype)
{
    return dtype == KVP_DTYPE_I8 || dtype == KVP_DTYPE_I4 || dtype == KVP_DTYPE_FP8_E4M3 ||
           dtype == KVP_DTYPE_FP8_E5M2 || dtype == KVP_DTYPE_FP4_E2M1;
}

void kvp_convert_default_scheme(int dtype, uint32_t *scheme, uint32_t *group)
{
    *scheme = KVP_SCHEME_NONE;
    *group = 0;
    switch (dtype) {
    case KVP_DTYPE_I8:
        *scheme = KVP_SCHEME_CHANNEL;
        break;
    case KVP_DTYPE_I4:
        *scheme = KVP_SCHEME_GROUP;
        *group = 128;
        break;
    case KVP_DTYPE_FP4_E2M1:
        *scheme = KVP_SCHEME_GROUP;
        *group = 32;
        break;
    case KVP_DTYPE_FP8_E4M3:
    case KVP_DTYPE_FP8_E5M2:
        *scheme = KVP_SCHEME_TENSOR;
        break;
    default:
        break;
    }
}

void kvp_convert_opts_init(kvp_convert_opts *o)
{
    memset(o, 0, sizeof *o);
    o->to = KVP_CONVERT_KEEP;
    o->embed = KVP_CONVERT_EMBED_AUTO;
}

int kvp_convert_check_regex(const char *re, kvp_err *err)
{
    regex_t rx;
    int rc = regcomp(&rx, re, REG_EXTENDED | REG_NOSUB);
    if (rc) {
        char msg[160];
        regerror(rc, &rx, msg, sizeof msg);
        return kvp_err_set(err, KVP_EINVAL, "regular expression '%s': %s", re, msg);
    }
    regfree(&rx);
    return 0;
}

/* ---- small helpers ---- */

static int add_note(kvp_convert *cv, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int add_note(kvp_convert *cv, const char *fmt, ...)
{
    char msg[KVP_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char **n = realloc(cv->notes, (cv->n_notes + 1) * sizeof *n);
    if (!n)
        return KVP_ENOMEM;
    cv->notes = n;
    if (!(n[cv->n_notes] = strdup(msg)))
        return KVP_ENOMEM;
    cv->n_notes++;
    return 0;
}

/* Deep copy of one metadata entry into m. */
static int meta_copy_entry(kvp_meta *m, const kvp_meta_entry *e)
{
    switch (e->type) {
    case KVP_META_U64:
        return kvp_meta_set_u64(m, e->key, e->v.u);
    case KVP_META_I64:
        return kvp_meta_set_i64(m, e->key, e->v.i);
    case KVP_META_F64:
        return kvp_meta_set_f64(m, e->key, e->v.f);
    case KVP_META_BOOL:
        return kvp_meta_set_bool(m, e->key, e->v.u != 0);
    case KVP_META_STR:
        return kvp_meta_set_str(m, e->key, e->str, e->n);
    case KVP_META_ARR_STR: {
        const char **s = malloc((e->n ? e->n : 1) * sizeof *s);
        size_t *len = malloc((e->n ? e->n : 1) * sizeof *len);
        int rc = s && len ? 0 : KVP_ENOMEM;
        for (uint64_t i = 0; !rc && i < e->n; i++)
            s[i] = kvp_meta_str_at(e, i, &len[i]);
        if (!rc)
            rc = kvp_meta_set_strarr(m, e->key, s, len, e->n);
        free(s);
        free(len);
        return rc;
    }
    default:
        return kvp_meta_set_arr(m, e->key, e->type, e->arr, e->n);
    }
}

static int starts_with(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

static int grow_items(kvp_convert *cv, uint64_t n, kvp_err *err)
{
    cv->items = calloc(n ? n : 1, sizeof *cv->items);
    cv->src_index = calloc(n ? n : 1, sizeof *cv->src_index);
    cv->src_ndim = calloc(n ? n : 1, sizeof *cv->src_ndim);
    if (!cv->items || !cv->src_index || !cv->src_ndim)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory for %llu tensors", cv->path, (unsigned long long)n);
    return 0;
}

/* "[1, 1, 2, 32]" into buf. */
static void shape_text(const uint64_t *shape, uint32_t n_dims, char *buf, size_t n)
{
    size_t used = (size_t)snprintf(buf, n, "[");
    for (uint32_t d = 0; d < n_dims && used < n; d++)
        used += (size_t)snprintf(buf + used, n - used, "%s%llu", d ? ", " : "", (unsigned long long)shape[d]);
    if (used < n)
        snprintf(buf + used, n - used, "]");
}

/* The note for a tensor of more than 4 dimensions stored with its leading
 * 1s left out: whoever reads the output back gets the shorter shape. */
static int note_squeezed(kvp_convert *cv, const char *name, uint32_t n_dims, const uint64_t *shape, uint32_t skip)
{
    char from[160], to[120];
    shape_text(shape, n_dims, from, sizeof from);
    shape_text(shape + skip, n_dims - skip, to, sizeof to);
    return add_note(cv, "%s: tensor %s: shape %s stored as %s (KVP holds at most %d dimensions; the leading 1s are "
                    "left out, the bytes are the same)", cv->path, name, from, to, KVP_MAX_DIMS);
}

/* name for a message, C-escaped between quotes (\t \n \r \" \\, \xNN for
 * another control byte or one that is not UTF-8) so that the message stays
 * one line; cut with "..." where out (at least 16 bytes) is full. */
static void show_name(char *out, size_t cap, const char *name)
{
    size_t o = 0, n = strlen(name);
    out[o++] = '"';
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = kvp_unicode_decode(name + i, n - i, &cp);
        char esc[8] = "";
        unsigned char c = (unsigned char)name[i];
        if (c == '\t' || c == '\n' || c == '\r')
            snprintf(esc, sizeof esc, "\\%c", c == '\t' ? 't' : c == '\n' ? 'n' : 'r');
        else if (c == '"' || c == '\\')
            snprintf(esc, sizeof esc, "\\%c", c);
        else if (cp == KVP_UNICODE_BAD || c < 0x20 || c == 0x7f)
            snprintf(esc, sizeof esc, "\\x%02x", c);
        size_t len = esc[0] ? strlen(esc) : k;
        if (o + len + 5 > cap) { /* then "...", the quote and the NUL */
            snprintf(out + o, cap - o, "...\"");
            return;
        }
        memcpy(out + o, esc[0] ? esc : name + i, len);
        o += len;
        i += esc[0] ? 1 : k;
    }
    snprintf(out + o, cap - o, "\"");
}

/* Fill item i's name and source record from a shape given outermost first. */
static int set_src(kvp_convert *cv, size_t i, const char *name, int dtype, const char *type_name, uint32_t n_dims,
                   const uint64_t *shape, uint64_t nbytes, kvp_err *err)
{
    kvp_convert_item *it = &cv->items[i];
    size_t len = strlen(name);
    if (len == 0 || len > KVP_NAME_MAX) {
        char shown[80];
        show_name(shown, sizeof shown, name);
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: tensor %s: name of %zu bytes (KVP allows 1..%d)", cv->path,
                           shown, len, KVP_NAME_MAX);
    }
    memcpy(it->src.name, name, len + 1);
    snprintf(it->src_type, sizeof it->src_type, "%s", type_name);
    cv->src_ndim[i] = n_dims;
    /* KVP holds 4 dimensions: leading dimensions of 1 go first (the bytes
     * are the same, the shape is not: say so), then a scalar becomes [1]. */
    uint32_t skip = 0;
    while (n_dims - skip > KVP_MAX_DIMS && shape[skip] == 1)
        skip++;
    if (skip && n_dims - skip <= KVP_MAX_DIMS && note_squeezed(cv, name, n_dims, shape, skip) < 0)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    it->src.n_dim = n_dims - skip;
    if (it->src.n_dim == 0)
        it->src.n_dim = 1, it->src.shape[0] = 1;
    else if (it->src.n_dim <= KVP_MAX_DIMS)
        memcpy(it->src.shape, shape + skip, it->src.n_dim * sizeof *shape);
    it->src.dtype = dtype < 0 ? UINT32_MAX : (uint32_t)dtype;
    it->src.global_scale = 1.0f;
    it->src.data_bytes = nbytes;
    it->src_ok = dtype >= 0 && it->src.n_dim <= KVP_MAX_DIMS && kvp_tensor_data_bytes(&it->src) == (int64_t)nbytes;
    return 0;
}

/* GGUF files often leave the vocabulary size to the token list, which goes
 * to the TOKENIZER record: state it in the config so that stands alone. */
static int put_vocab_size(kvp_convert *cv, kvp_err *err)
{
    char key[64];
    snprintf(key, sizeof key, "%s.vocab_size", cv->cfg.arch);
    if (kvp_meta_find(&cv->config_meta, key) || cv->cfg.n_vocab == 0)
        return 0;
    int rc = kvp_meta_set_u64(&cv->config_meta, key, cv->cfg.n_vocab);
    return rc < 0 ? kvp_err_set(err, rc, "%s: out of memory", cv->path) : 0;
}

/* The config of a KVP model; like a GGUF's, it may need the token list of the
 * TOKENIZER record for the vocabulary size. */
static int kvp_input_config(kvp_convert *cv, kvp_err *err)
{
    const kvp_meta_entry *tokens = kvp_meta_find(&cv->tok_meta, "tokenizer.ggml.tokens");
    if (!tokens)
        return kvp_config_from_meta(&cv->cfg, &cv->config_meta, cv->path, err);
    kvp_meta m;
    kvp_meta_init(&m);
    int rc = 0;
    for (size_t i = 0; !rc && i < cv->config_meta.n; i++)
        rc = meta_copy_entry(&m, &cv->config_meta.e[i]);
    if (!rc && !kvp_meta_find(&m, tokens->key))
        rc = meta_copy_entry(&m, tokens);
    if (rc < 0)
        rc = kvp_err_set(err, rc, "%s: out of memory", cv->path);
    else
        rc = kvp_config_from_meta(&cv->cfg, &m, cv->path, err);
    kvp_meta_free(&m);
    return rc;
}

/* ---- GGUF ---- */

static int open_gguf(kvp_convert *cv, kvp_in *in, kvp_err *err)
{
    int rc = kvp_gguf_open_in(&cv->gguf, in, err);
    if (rc < 0)
        return rc;
    cv->gguf_open = 1;
    const kvp_gguf *g = &cv->gguf;
    if ((rc = kvp_config_from_meta(&cv->cfg, &g->meta, cv->path, err)) < 0)
        return rc;
    for (size_t i = 0; i < g->meta.n; i++) {
        const kvp_meta_entry *e = &g->meta.e[i];
        /* GGUF-only layout keys and llama.cpp's file type do not describe the output. */
        if (strcmp(e->key, "general.alignment") == 0 || strcmp(e->key, "general.file_type") == 0)
            continue;
        kvp_meta *dst = starts_with(e->key, "tokenizer.") ? &cv->tok_meta : &cv->config_meta;
        if ((rc = meta_copy_entry(dst, e)) < 0)
            return kvp_err_set(err, rc, "%s: out of memory copying key %s", cv->path, e->key);
    }
    if ((rc = kvp_model_check(&cv->cfg, &cv->tok_meta, cv->path, err)) < 0 || (rc = put_vocab_size(cv, err)) < 0 ||
        (rc = grow_items(cv, g->n_tensors, err)) < 0)
        return rc;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const kvp_gguf_tensor *t = &g->tensors[i];
        uint64_t shape[4];
        for (uint32_t d = 0; d < t->n_dims; d++)
            shape[d] = t->ne[t->n_dims - 1 - d];
        if ((rc = set_src(cv, i, t->name, t->dtype, kvp_gguf_type_name(t->ggml_type), t->n_dims, shape, t->nbytes,
                          err)) < 0)
            return rc;
        cv->src_index[i] = i;
    }
    cv->n_items = g->n_tensors;
    return 0;
}

/* ---- safetensors ---- */

/* tokenizer.json next to the checkpoint: the derived tokenizer.ggml.* keys
 * and the whole text.  A well-formed tokenizer we cannot translate (another
 * algorithm, an unknown pre-tokenizer) is kept as text, as other models the
 * engine cannot run are converted; a malformed one (not JSON, a vocabulary
 * or merges of the wrong shape) is refused, since no reader could use it. */
static int load_hf_tokenizer(kvp_convert *cv, const char *dir, kvp_err *err)
{
    char path[4096];
    struct stat sb;
    if ((size_t)snprintf(path, sizeof path, "%s/tokenizer.json", dir) >= sizeof path || stat(path, &sb) != 0)
        return add_note(cv, "%s: no tokenizer.json: the output has no tokenizer", dir) < 0
                   ? kvp_err_set(err, KVP_ENOMEM, "out of memory")
                   : 0;
    uint8_t *text;
    size_t len;
    int rc = kvp_read_file(path, TOKENIZER_JSON_MAX, &text, &len, err);
    if (rc < 0)
        return rc;
    kvp_json *root = NULL;
    kvp_err e2 = {0};
    rc = kvp_json_parse(&root, (const char *)text, len, path, &e2);
    if (rc == 0)
        rc = kvp_tokenizer_meta_from_json(&cv->tok_meta, root, path, &e2);
    kvp_json_free(root);
    if (rc < 0 && rc != KVP_EUNSUPPORTED) {
        free(text);
        return kvp_err_set(err, rc, "%s", e2.msg);
    }
    if (rc < 0) {
        kvp_meta_free(&cv->tok_meta);
        kvp_meta_init(&cv->tok_meta);
        if (add_note(cv, "%s (kept as text only)", e2.msg) < 0) {
            free(text);
            return kvp_err_set(err, KVP_ENOMEM, "out of memory");
        }
    }
    rc = kvp_meta_set_str(&cv->tok_meta, "tokenizer.huggingface.json", (const char *)text, len);
    free(text);
    if (rc < 0)
        return kvp_err_set(err, rc, "%s: out of memory", path);
    /* The chat template: chat_template.jinja or tokenizer_config.json's; optional. */
    char *tpl = NULL;
    if ((rc = kvp_hf_chat_template(dir, &tpl, err)) < 0)
        return rc;
    if (rc == 1) /* the output has no template: said, as a missing tokenizer.json is */
        return add_note(cv, "%s (the output has no chat template)", err->msg) < 0
                   ? kvp_err_set(err, KVP_ENOMEM, "out of memory")
                   : 0;
    rc = tpl ? kvp_meta_set_str(&cv->tok_meta, "tokenizer.chat_template", tpl, strlen(tpl)) : 0;
    free(tpl);
    return rc < 0 ? kvp_err_set(err, rc, "%s: out of memory", dir) : 0;
}

/* A quantized checkpoint's layers (quantization_config in config.json):
 * each imported weight becomes one item; the note says what was done. */
static int open_hfq(kvp_convert *cv, kvp_err *err)
{
    char path[4096], note[640];
    cv->src_hfq = calloc(cv->st.n_tensors ? cv->st.n_tensors : 1, sizeof *cv->src_hfq);
    if (!cv->src_hfq)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", cv->path);
    snprintf(path, sizeof path, "%s/config.json", cv->st.dir);
    int rc = kvp_hfq_open(&cv->hfq, &cv->st, path, note, sizeof note, err);
    if (rc == 0 && note[0] && add_note(cv, "%s", note) < 0)
        rc = kvp_err_set(err, KVP_ENOMEM, "out of memory");
    return rc;
}

/* Item i from an imported quantized weight: its record, with what was done. */
static void set_src_hfq(kvp_convert *cv, size_t i, const kvp_hfq_tensor *t)
{
    kvp_convert_item *it = &cv->items[i];
    it->src = t->rec;
    it->src_ok = 1;
    snprintf(it->src_type, sizeof it->src_type, "%s", kvp_dtype_name(t->rec.dtype));
    cv->src_ndim[i] = 2;
}

/* A folder, or a file with neither magic: safetensors. */
static int open_safetensors(kvp_convert *cv, kvp_in *in, kvp_err *err)
{
    int rc = kvp_safetensors_release_peeked(in, cv->path, err);
    if (rc < 0)
        return rc;
    rc = kvp_safetensors_open(&cv->st, cv->path, err);
    if (rc < 0)
        return rc;
    cv->st_open = 1;
    const kvp_safetensors *st = &cv->st;
    char path[4096];
    struct stat sb;
    if ((size_t)snprintf(path, sizeof path, "%s/config.json", st->dir) < sizeof path && stat(path, &sb) != 0 &&
        errno == ENOENT) {
        /* A bare tensor file (an adapter, a dump): its tensors, nothing else. */
        cv->bare = 1;
        memset(&cv->cfg, 0, sizeof cv->cfg);
        if (add_note(cv, "%s: no config.json in %s: tensors only, without config or tokenizer (not a model decode "
                     "can run)", cv->path, st->dir) < 0)
            return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    } else {
        if ((rc = kvp_config_from_hf(&cv->cfg, st->dir, err)) < 0)
            return rc;
        if ((rc = kvp_config_to_meta(&cv->cfg, &cv->config_meta)) < 0)
            return kvp_err_set(err, rc, "%s: config has no architecture", st->dir);
        if ((rc = load_hf_tokenizer(cv, st->dir, err)) < 0 ||
            (rc = kvp_model_check(&cv->cfg, &cv->tok_meta, cv->path, err)) < 0)
            return rc;
    }
    if ((rc = grow_items(cv, st->n_tensors, err)) < 0 || (!cv->bare && (rc = open_hfq(cv, err)) < 0))
        return rc;
    size_t n = 0;
    for (uint64_t i = 0; i < st->n_tensors; i++) {
        const kvp_safetensors_tensor *t = &st->tensors[i];
        int32_t role = cv->hfq.role ? cv->hfq.role[i] : KVP_HFQ_PLAIN;
        if (cv->src_hfq)
            cv->src_hfq[n] = role;
        cv->src_index[n] = i;
        if (role == KVP_HFQ_PART)
            continue; /* folded into its layer's weight */
        if (role >= 0)
            set_src_hfq(cv, n, &cv->hfq.t[role]);
        else if ((rc = set_src(cv, n, t->name, t->dtype, t->dtype_name, t->n_dims, t->shape, t->nbytes, err)) < 0)
            return rc;
        n++;
    }
    cv->n_items = n;
    return 0;
}

/* ---- KVP ---- */

int kvp_convert_name_file(const char *path, kvp_err *err)
{
    size_t n = strlen(path);
    if (strncmp(err->msg, path, n) == 0 && err->msg[n] == ':')
        return err->code;
    return kvp_err_prefix(err, "%s", path);
}

/* The plan pass; write_from_kvp reads the stream again by name, so a pipe,
 * which cannot be read twice, is refused. */
static int open_kvp(kvp_convert *cv, kvp_in *inp, kvp_err *err)
{
    kvp_in in = *inp;
    int rc = 0;
    if (!kvp_in_reopenable(&in)) {
        kvp_in_close(&in);
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: not a regular file: a KVP model is read twice to convert it "
                           "(once to plan, once to write), so it cannot come through a pipe", cv->path);
    }
    kvp_reader *r = NULL;
    size_t cap = 0;
    int have_config = 0;
    if ((rc = kvp_reader_open(&r, &in, err)) < 0)
        goto out;
    kvp_record rec;
    while ((rc = kvp_reader_next(r, &rec, err)) == 1) {
        if (rec.kind == KVP_KIND_END)
            continue;
        if (rec.kind == KVP_KIND_CONFIG || rec.kind == KVP_KIND_TOKENIZER) {
            kvp_meta *m = rec.kind == KVP_KIND_CONFIG ? &cv->config_meta : &cv->tok_meta;
            kvp_meta_free(m);
            if ((rc = kvp_meta_record_decode(&rec, m, err)) < 0)
                break;
            have_config |= rec.kind == KVP_KIND_CONFIG;
        } else if (rec.kind == KVP_KIND_TENSOR) {
            kvp_tensor_rec t;
            const uint8_t *d, *s, *z;
            if ((rc = kvp_tensor_decode(&rec, &t, &d, &s, &z, err)) < 0)
                break;
            if (cv->n_items == cap) {
                size_t nc = cap ? 2 * cap : 256;
                kvp_convert_item *ni = realloc(cv->items, nc * sizeof *ni);
                if (ni)
                    cv->items = ni;
                uint32_t *nd = realloc(cv->src_ndim, nc * sizeof *nd);
                if (nd)
                    cv->src_ndim = nd;
                if (!ni || !nd) {
                    rc = kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", cv->path);
                    break;
                }
                cap = nc;
            }
            kvp_convert_item *it = &cv->items[cv->n_items];
            memset(it, 0, sizeof *it);
            it->src = t;
            const kvp_dtype_traits *tr = kvp_dtype_get(t.dtype);
            it->src_ok = tr != NULL;
            snprintf(it->src_type, sizeof it->src_type, "%s", kvp_dtype_name(t.dtype));
            cv->src_ndim[cv->n_items++] = t.n_dim;
        } else if (rec.kind == KVP_KIND_SEQUENCE || rec.kind == KVP_KIND_KV_BLOCK ||
                   rec.kind == KVP_KIND_BLOCK_REF) {
            rc = kvp_err_set(err, KVP_EUNSUPPORTED, "%s: record %llu is a %s: a KV stream, not a model (use --kv)",
                             cv->path, (unsigned long long)rec.index, kvp_kind_name(rec.kind));
            break;
        } else if (add_note(cv, "%s: record %llu of unknown kind %u left out", cv->path,
                            (unsigned long long)rec.index, rec.kind) < 0) {
            rc = kvp_err_set(err, KVP_ENOMEM, "out of memory");
            break;
        }
    }
    if (rc == 0 && have_config) {
        rc = kvp_input_config(cv, err);
    } else if (rc == 0 && cv->n_items == 0) {
        rc = kvp_err_set(err, KVP_EFORMAT, "%s: no config record and no tensors: nothing to convert", cv->path);
    } else if (rc == 0) { /* tensors only, as quantize writes them from a bare safetensors file */
        cv->bare = 1;
        memset(&cv->cfg, 0, sizeof cv->cfg);
        if (add_note(cv, "%s: no config record: tensors only", cv->path) < 0)
            rc = kvp_err_set(err, KVP_ENOMEM, "out of memory");
    }
    if (rc == 0)
        rc = kvp_model_check(cv->bare ? NULL : &cv->cfg, &cv->tok_meta, cv->path, err);
out:
    kvp_reader_free(r);
    kvp_in_close(&in);
    return rc < 0 ? kvp_convert_name_file(cv->path, err) : 0;
}

/* ---- open ---- */

/* GGUF, KVP or safetensors from the first bytes (a folder is safetensors),
 * opened once: the source's reader takes in and the bytes peeked in it. */
static int open_source(kvp_convert *cv, kvp_err *err)
{
    kvp_in in;
    int kind, rc = kvp_in_open_kind(&in, cv->path, &kind, err);
    if (rc < 0)
        return rc;
    cv->format = kind == KVP_FILE_GGUF ? KVP_CONVERT_GGUF : kind == KVP_FILE_KVP ? KVP_CONVERT_KVP : KVP_CONVERT_SAFETENSORS;
    if (cv->format == KVP_CONVERT_GGUF)
        return open_gguf(cv, &in, err);
    return cv->format == KVP_CONVERT_KVP ? open_kvp(cv, &in, err) : open_safetensors(cv, &in, err);
}

int kvp_convert_open(kvp_convert **out, const char *path, kvp_err *err)
{
    *out = NULL;
    kvp_convert *cv = calloc(1, sizeof *cv);
    if (!cv || !(cv->path = strdup(path))) {
        free(cv);
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", path);
    }
    kvp_meta_init(&cv->config_meta);
    kvp_meta_init(&cv->tok_meta);
    kvp_config_init(&cv->cfg);
    int rc = open_source(cv, err);
    if (rc < 0) {
        kvp_convert_free(cv);
        return rc;
    }
    *out = cv;
    return 0;
}

void kvp_convert_free(kvp_convert *cv)
{
    if (!cv)
        return;
    if (cv->gguf_open)
        kvp_gguf_close(&cv->gguf);
    if (cv->st_open)
        kvp_safetensors_close(&cv->st);
    kvp_hfq_set_free(&cv->hfq);
    free(cv->src_hfq);
    kvp_meta_free(&cv->config_meta);
    kvp_meta_free(&cv->tok_meta);
    for (size_t i = 0; i < cv->n_notes; i++)
        free(cv->notes[i]);
    free(cv->notes);
    for (int l = 0; l < KVP_CONVERT_PATTERNS_COUNT; l++)
        free(cv->pattern_hits[l]);
    free(cv->items);
    free(cv->src_index);
    free(cv->src_ndim);
    free(cv->path);
    free(cv);
}

int kvp_convert_format(const kvp_convert *cv) { return cv->format; }

const char *kvp_convert_format_name(const kvp_convert *cv)
{
    return cv->format == KVP_CONVERT_GGUF ? "gguf" : cv->format == KVP_CONVERT_KVP ? "kvp" : "safetensors";
}

const kvp_config *kvp_convert_config(const kvp_convert *cv) { return cv->bare ? NULL : &cv->cfg; }

size_t kvp_convert_notes(const kvp_convert *cv, const char *const **notes)
{
    *notes = (const char *const *)cv->notes;
    return cv->n_notes;
}

size_t kvp_convert_count(const kvp_convert *cv) { return cv->n_items; }

uint64_t kvp_convert_pattern_matches(const kvp_convert *cv, int list, size_t k)
{
    if (list < 0 || list >= KVP_CONVERT_PATTERNS_COUNT || k >= cv->n_pattern_hits[list])
        return 0;
    return cv->pattern_hits[list][k];
}

const kvp_convert_item *kvp_convert_item_at(const kvp_convert *cv, size_t i)
{
    return i < cv->n_items ? &cv->items[i] : NULL;
}

/* ---- plan ---- */

/* One pattern list of the options (--include, --exclude, --drop), compiled:
 * a name is in it when any of its patterns matches. */
typedef struct pattern_list {
    regex_t *rx;     /* n compiled */
    size_t n;
    uint64_t *hits;  /* cv->pattern_hits[list]: the tensors each pattern matched */
} pattern_list;

typedef struct plan_ctx {
    const kvp_convert_opts *o;
    pattern_list list[KVP_CONVERT_PATTERNS_COUNT];
} plan_ctx;

/* The patterns of one list of o (kvp_convert_patterns), n of them. */
static const char *const *opts_patterns(const kvp_convert_opts *o, int list, size_t *n)
{
    switch (list) {
    case KVP_CONVERT_PATTERNS_INCLUDE: *n = o->n_include; return o->include;
    case KVP_CONVERT_PATTERNS_EXCLUDE: *n = o->n_exclude; return o->exclude;
    default: *n = o->n_drop; return o->drop;
    }
}

static const char *const pattern_list_names[KVP_CONVERT_PATTERNS_COUNT] = {"include", "exclude", "drop"};

/* Whether any pattern of l matches name.  Every pattern is tried, so that
 * each one's count is whole. */
static int list_match(const pattern_list *l, const char *name)
{
    int any = 0;
    for (size_t k = 0; k < l->n; k++)
        if (regexec(&l->rx[k], name, 0, NULL, 0) == 0) {
            l->hits[k]++;
            any = 1;
        }
    return any;
}

static int is_embedding(const char *name)
{
    static const char *const ends[] = {"token_embd.weight", "embed_tokens.weight", "wte.weight",
                                       "word_embeddings.weight"};
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++) {
        size_t k = strlen(ends[i]);
        if (n >= k && strcmp(name + n - k, ends[i]) == 0 && (n == k || name[n - k - 1] == '.'))
            return 1;
    }
    return 0;
}

/* f32, f16 or bf16: what widening to loses nothing of a quantized tensor. */
static int is_float_dtype(int d)
{
    return d == KVP_DTYPE_F32 || d == KVP_DTYPE_F16 || d == KVP_DTYPE_BF16;
}

/* The target dtype by the rules of convert.h (KVP_CONVERT_KEEP, or a dtype);
 * keep: rule 3, the include and exclude lists, applies. */
static int choose_dtype(const plan_ctx *p, const kvp_convert_item *it, int keep)
{
    const char *name = it->src.name;
    if (it->src.n_dim == 1 || strstr(name, "norm"))
        return KVP_DTYPE_F32;
    if (keep)
        return KVP_CONVERT_KEEP;
    if (!is_embedding(name))
        return p->o->to;
    if (p->o->embed != KVP_CONVERT_EMBED_AUTO)
        return p->o->embed;
    return is_float_dtype(p->o->to) && !is_float_dtype((int)it->src.dtype) ? p->o->to : KVP_CONVERT_KEEP;
}

/* A group that divides row: the group asked for, else its even halves down
 * to 16 (halving a group the user chose below 16 would make scales
 * outweigh the codes), else 0 (use CHANNEL). */
static uint32_t fit_group(uint32_t group, uint64_t row)
{
    for (uint32_t g = group; g >= 2 && g % 2 == 0 && (g == group || g >= 16); g /= 2)
        if (row % g == 0)
            return g;
    return 0;
}

/* The group of the group scheme when no --group was given and the type has
 * no default group (fp8, int8): 128 elements, a common choice for FP8 and
 * INT8 weights (DeepSeek-V3's FP8 blocks are 128 wide). */
enum { KVP_CONVERT_GROUP_DEFAULT = 128 };

static int same_layout(const kvp_tensor_rec *a, const kvp_tensor_rec *b)
{
    uint32_t sa = a->scale_dtype ? a->scale_dtype : KVP_DTYPE_F32, sb = b->scale_dtype ? b->scale_dtype : KVP_DTYPE_F32;
    return a->dtype == b->dtype && a->scheme == b->scheme && a->group == b->group && a->flags == b->flags &&
           (a->scheme == KVP_SCHEME_NONE || sa == sb);
}

static void plan_quant(kvp_convert_item *it, const kvp_convert_opts *o, int dtype)
{
    kvp_quant_spec spec = {(uint32_t)dtype, KVP_SCHEME_NONE, 0, 0, 0};
    if (kvp_convert_dtype_scaled(dtype)) {
        kvp_convert_default_scheme(dtype, &spec.scheme, &spec.group);
        if (dtype == o->to) { /* the user's options apply to --to's dtype */
            if (o->scheme)
                spec.scheme = o->scheme;
            if (o->group)
                spec.group = o->group;
            spec.asym = o->asym;
        }
        if (spec.scheme == KVP_SCHEME_GROUP) {
            if (!spec.group)
                spec.group = KVP_CONVERT_GROUP_DEFAULT;
            uint64_t row = it->src.shape[it->src.n_dim - 1];
            uint32_t g = fit_group(spec.group, row);
            if (g != spec.group)
                snprintf(it->note, sizeof it->note, "%s: row of %llu is not a multiple of group %u",
                         g ? "smaller group" : "per channel", (unsigned long long)row, spec.group);
            if (g)
                spec.group = g;
            else
                spec.scheme = KVP_SCHEME_CHANNEL;
        }
    }
    kvp_tensor_rec out = it->src;
    kvp_err e = {0};
    if (kvp_quant_plan(&out, &spec, &e) < 0) {
        kvp_quant_spec f16 = {KVP_DTYPE_F16, KVP_SCHEME_NONE, 0, 0, 0};
        out = it->src;
        const char *why = e.msg; /* drop the "tensor NAME: " the note's row already shows */
        size_t nl = strlen(it->src.name);
        if (strncmp(why, "tensor ", 7) == 0 && strncmp(why + 7, it->src.name, nl) == 0 && why[7 + nl] == ':')
            why += 9 + nl;
        snprintf(it->note, sizeof it->note, "f16: %.100s", why);
        kvp_quant_plan(&out, &f16, &e); /* any shape fits f16 */
    }
    it->out = out;
    it->action = same_layout(&it->src, &out) ? KVP_CONVERT_COPY : KVP_CONVERT_QUANT;
    if (it->action == KVP_CONVERT_COPY) {
        it->out = it->src;
        /* already what was asked (a file quantize wrote, its group fitted
         * to the rows then): copied, so no fallback was taken now */
        if (it->src.dtype == (uint32_t)dtype)
            it->note[0] = '\0';
    }
}

/* Why item i cannot be read, as an error: too many dimensions, no elements
 * (KVP has no empty tensors), a type we have no reader for, or bytes that do
 * not match its type and shape. */
static int src_refused(const kvp_convert *cv, size_t i, kvp_err *err)
{
    const kvp_convert_item *it = &cv->items[i];
    char shape[96];
    if (cv->src_ndim[i] > KVP_MAX_DIMS && it->src.n_dim > KVP_MAX_DIMS)
        return kvp_err_set(err, KVP_EUNSUPPORTED,
                           "%s: tensor %s: %u dimensions (KVP holds at most %d; --drop leaves it out)", cv->path,
                           it->src.name, cv->src_ndim[i], KVP_MAX_DIMS);
    if (it->src.dtype == UINT32_MAX || !kvp_dtype_get(it->src.dtype))
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: tensor %s: unsupported type %s (--drop leaves it out)",
                           cv->path, it->src.name, it->src_type);
    shape_text(it->src.shape, it->src.n_dim, shape, sizeof shape);
    if (kvp_tensor_numel(&it->src) == 0)
        return kvp_err_set(err, KVP_EUNSUPPORTED,
                           "%s: tensor %s: shape %s has no elements (a KVP tensor holds at least one; --drop leaves "
                           "it out)", cv->path, it->src.name, shape);
    return kvp_err_set(err, KVP_EFORMAT, "%s: tensor %s: %llu bytes do not hold %s %s (--drop leaves it out)",
                       cv->path, it->src.name, (unsigned long long)it->src.data_bytes, it->src_type, shape);
}

/* kvp(5)'s rule for a name written (UTF-8, no control character: one line
 * of a listing, a JSON string, an --include pattern's subject), which the
 * stream writer applies too: checked in the plan, so that a dry run refuses
 * what the conversion would, before any work, naming the file and the
 * tensor.  A dropped tensor's name is never written. */
static int check_name(const kvp_convert *cv, const kvp_convert_item *it, kvp_err *err)
{
    const char *name = it->src.name, *why = NULL;
    size_t n = strlen(name);
    if (kvp_unicode_valid_prefix(name, n) != n)
        why = "is not UTF-8";
    for (size_t i = 0; !why && i < n; i++)
        if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f)
            why = "holds a control character";
    if (!why)
        return 0;
    char shown[160];
    show_name(shown, sizeof shown, name);
    return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: tensor %s: the name %s (KVP names are printable UTF-8; --drop "
                       "leaves it out)", cv->path, shown, why);
}

static int plan_one(kvp_convert *cv, const plan_ctx *p, size_t i, kvp_err *err)
{
    kvp_convert_item *it = &cv->items[i];
    it->note[0] = '\0';
    memset(&it->stats, 0, sizeof it->stats);
    /* every list on every tensor, whichever rule decides: a pattern's count
     * then says whether it matched any name */
    int included = list_match(&p->list[KVP_CONVERT_PATTERNS_INCLUDE], it->src.name);
    int excluded = list_match(&p->list[KVP_CONVERT_PATTERNS_EXCLUDE], it->src.name);
    if (list_match(&p->list[KVP_CONVERT_PATTERNS_DROP], it->src.name)) {
        it->action = KVP_CONVERT_DROP;
        it->out = it->src;
        return 0;
    }
    int rc = check_name(cv, it, err);
    if (rc < 0)
        return rc;
    if (!it->src_ok)
        return src_refused(cv, i, err);
    int dtype = choose_dtype(p, it, (p->list[KVP_CONVERT_PATTERNS_INCLUDE].n && !included) || excluded);
    const kvp_dtype_traits *tr = kvp_dtype_get(it->src.dtype);
    if (dtype != KVP_CONVERT_KEEP && !tr->to_f32) {
        snprintf(it->note, sizeof it->note, "kept: no conversion from %s", tr->name);
        dtype = KVP_CONVERT_KEEP;
    }
    if (dtype == KVP_CONVERT_KEEP) {
        it->action = KVP_CONVERT_COPY;
        it->out = it->src;
        return 0;
    }
    plan_quant(it, p->o, dtype);
    return 0;
}

/* Compile list l of o into pl, its counts zeroed in cv (kept there for
 * kvp_convert_pattern_matches); list_free undoes it, on failure too.  The
 * patterns passed check_opts: none is NULL. */
static int list_compile(kvp_convert *cv, const kvp_convert_opts *o, int l, pattern_list *pl, kvp_err *err)
{
    size_t n;
    const char *const *re = opts_patterns(o, l, &n);
    if (!n)
        return 0;
    uint64_t *hits = realloc(cv->pattern_hits[l], n * sizeof *hits);
    if (!hits)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", cv->path);
    cv->pattern_hits[l] = pl->hits = hits;
    memset(hits, 0, n * sizeof *hits);
    if (!(pl->rx = malloc(n * sizeof *pl->rx)))
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", cv->path);
    for (; pl->n < n; pl->n++) {
        int rc = kvp_convert_check_regex(re[pl->n], err);
        if (rc < 0)
            return rc;
        if (regcomp(&pl->rx[pl->n], re[pl->n], REG_EXTENDED | REG_NOSUB) != 0)
            return kvp_err_set(err, KVP_ENOMEM, "regular expression '%s': out of memory", re[pl->n]);
    }
    return 0;
}

static void list_free(pattern_list *pl)
{
    for (size_t k = 0; k < pl->n; k++)
        regfree(&pl->rx[k]);
    free(pl->rx);
}

static int check_opts(const kvp_convert_opts *o, kvp_err *err)
{
    for (int k = 0; k < 2; k++) {
        int d = k ? o->embed : o->to;
        const kvp_dtype_traits *tr = kvp_dtype_get((uint32_t)d);
        if (d != KVP_CONVERT_KEEP && d != KVP_CONVERT_EMBED_AUTO && (!tr || !tr->from_f32))
            return kvp_err_set(err, KVP_EINVAL, "cannot write dtype %s", kvp_dtype_name((uint32_t)d));
    }
    if (o->scheme > KVP_SCHEME_GROUP || (o->scheme && !kvp_convert_dtype_scaled(o->to)))
        return kvp_err_set(err, KVP_EINVAL, "a scale scheme applies to fp8, int8, int4 and fp4 only");
    if (o->asym && o->to != KVP_DTYPE_I8 && o->to != KVP_DTYPE_I4)
        return kvp_err_set(err, KVP_EINVAL, "asymmetric quantization applies to int8 and int4 only");
    if (o->group && (o->group < 2 || o->group % 2))
        return kvp_err_set(err, KVP_EINVAL, "group %u: must be an even number", o->group);
    for (int l = 0; l < KVP_CONVERT_PATTERNS_COUNT; l++) {
        size_t n;
        const char *const *re = opts_patterns(o, l, &n);
        for (size_t k = 0; k < n; k++)
            if (!re || !re[k])
                return kvp_err_set(err, KVP_EINVAL, "%s pattern %zu of %zu: none given", pattern_list_names[l],
                                   k + 1, n);
    }
    return 0;
}

/* The planned output through the loader's tensor checks (lib/model.h), so
 * that a model decode would refuse (31 layers declared, 30 present; an
 * embedding of another vocabulary) is refused here with decode's message and
 * nothing is written.  Missing because --drop left it out: said so. */
static int check_output_tensors(kvp_convert *cv, kvp_err *err)
{
    if (cv->bare)
        return 0;
    kvp_tensor_rec *recs = malloc((cv->n_items ? cv->n_items : 1) * sizeof *recs);
    if (!recs)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", cv->path);
    size_t n = 0;
    for (size_t i = 0; i < cv->n_items; i++)
        if (cv->items[i].action != KVP_CONVERT_DROP)
            recs[n++] = cv->items[i].out;
    int format = cv->format == KVP_CONVERT_GGUF ? KVP_MODEL_GGUF
                 : cv->format == KVP_CONVERT_KVP ? KVP_MODEL_KVP : KVP_MODEL_HF;
    int rc = kvp_model_check_tensors(&cv->cfg, recs, n, format, cv->path, err);
    free(recs);
    for (size_t i = 0; rc == KVP_ENOTFOUND && i < cv->n_items; i++) {
        char missing[KVP_NAME_MAX + 32];
        snprintf(missing, sizeof missing, "tensor %s is missing", cv->items[i].src.name);
        size_t len = strlen(err->msg);
        if (cv->items[i].action == KVP_CONVERT_DROP && strstr(err->msg, missing)) {
            snprintf(err->msg + len, sizeof err->msg - len, " (--drop left it out)");
            break;
        }
    }
    return rc;
}

/* kvp(5): a tensor's name is unique in its stream.  Two source tensors
 * planned under one name (a GPTQ folder that also keeps the layer's plain
 * weight, whose qweight/scales become the same module.weight) would make a
 * file every reader refuses: refused here, naming both. */
static int item_name_cmp(const void *a, const void *b)
{
    const kvp_convert_item *x = *(const kvp_convert_item *const *)a, *y = *(const kvp_convert_item *const *)b;
    int c = strcmp(x->out.name, y->out.name);
    return c ? c : (x > y) - (x < y); /* the source's order among equals */
}

static int check_unique_names(const kvp_convert *cv, kvp_err *err)
{
    const kvp_convert_item **ix = malloc((cv->n_items ? cv->n_items : 1) * sizeof *ix);
    size_t n = 0;
    if (!ix)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", cv->path);
    for (size_t i = 0; i < cv->n_items; i++)
        if (cv->items[i].action != KVP_CONVERT_DROP)
            ix[n++] = &cv->items[i];
    qsort(ix, n, sizeof *ix, item_name_cmp);
    int rc = 0;
    for (size_t k = 1; k < n && rc == 0; k++) {
        const kvp_convert_item *a = ix[k - 1], *b = ix[k];
        if (strcmp(a->out.name, b->out.name) == 0 && strcmp(a->src.name, b->src.name) != 0)
            rc = kvp_err_set(err, KVP_EFORMAT, "%s: tensors %s and %s would both be written as %s (a name is "
                             "unique in a KVP file): --drop one of them", cv->path, a->src.name, b->src.name,
                             a->out.name);
        else if (strcmp(a->out.name, b->out.name) == 0)
            rc = kvp_err_set(err, KVP_EFORMAT, "%s: two tensors of the source are both %s (a quantized layer's "
                             "weight beside a plain one of the same name?): a name is unique in a KVP file",
                             cv->path, a->out.name);
    }
    free(ix);
    return rc;
}

int kvp_convert_plan(kvp_convert *cv, const kvp_convert_opts *o, kvp_err *err)
{
    plan_ctx p;
    memset(&p, 0, sizeof p);
    p.o = o;
    /* the items are replanned in place: one that fails leaves no whole plan,
     * the earlier one included, for kvp_convert_write to use */
    cv->planned = 0;
    int rc = check_opts(o, err);
    for (int l = 0; l < KVP_CONVERT_PATTERNS_COUNT; l++) {
        cv->n_pattern_hits[l] = 0;
        if (!rc)
            rc = list_compile(cv, o, l, &p.list[l], err);
    }
    for (size_t i = 0; !rc && i < cv->n_items; i++)
        rc = plan_one(cv, &p, i, err);
    for (int l = 0; l < KVP_CONVERT_PATTERNS_COUNT; l++)
        list_free(&p.list[l]);
    if (rc < 0 || (rc = check_unique_names(cv, err)) < 0 || (rc = check_output_tensors(cv, err)) < 0)
        return rc;
    for (int l = 0; l < KVP_CONVERT_PATTERNS_COUNT; l++) /* this plan's counts are whole */
        opts_patterns(o, l, &cv->n_pattern_hits[l]);
    const char *to = "keep";
    for (size_t i = 0; i < sizeof target_names / sizeof target_names[0]; i++)
        if (target_names[i].dtype == o->to) {
            to = target_names[i].name;
            break;
        }
    if (!cv->bare && (rc = kvp_meta_set_str(&cv->config_meta, "kvpipe.quantize.to", to, strlen(to))) < 0)
        return kvp_err_set(err, rc, "out of memory");
    cv->planned = 1;
    return 0;
}

void kvp_convert_fingerprint(const kvp_convert *cv, uint8_t out[KVP_FINGERPRINT_SIZE])
{
    if (cv->bare) { /* kvp(5): zeros, the stream belongs to no model */
        memset(out, 0, KVP_FINGERPRINT_SIZE);
        return;
    }
    kvp_tensor_rec *recs = malloc((cv->n_items ? cv->n_items : 1) * sizeof *recs);
    size_t n = 0;
    for (size_t i = 0; recs && i < cv->n_items; i++)
        if (cv->items[i].action != KVP_CONVERT_DROP)
            recs[n++] = cv->items[i].out;
    kvp_fingerprint(&cv->cfg, recs ? recs : NULL, recs ? n : 0, out);
    free(recs);
}
