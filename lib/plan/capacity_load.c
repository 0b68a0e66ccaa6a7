/* capacity_load.c - a model's shape for kvcalc from whatever file holds it:
 * GGUF (header and tensor table), KVP (its CONFIG record and tensor headers)
 * or HF config.json.
 */
#include "capacity.h"

#include "gguf.h"
#include "hfquant.h"
#include "io.h"
#include "json.h"
#include "stream.h"
#include "wire.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- what a file's tensors say: GGUF and KVP alike ---- */

/* The tensors of a file as they go by: their exact bytes, the bytes of the
 * matrices by storage format (norms and biases, 1-D, do not vote on the
 * format; the layers' matrices outvote the embeddings and head, which
 * quantize keeps in 16 bits by default and which can outweigh them in a
 * small model), the embeddings' format, and whether an lm_head is among
 * them. */
typedef struct tensor_tally {
    uint64_t bytes;
    uint64_t cls[KVP_CAP_W_CLASSES]; /* bytes by where they go (weight_class) */
    int has_output;
    kvp_col_units col_units;
    char embd_fmt[16];
    size_t n;
    struct {
        char fmt[16];
        uint64_t bytes, layer_bytes;
    } by[32];
} tensor_tally;

/* Where a tensor goes (KVP_CAP_W_*), by its GGUF or HF name and shape: a
 * vector (norms, biases), a layer's matrix (blk.N., model.layers.N.), the
 * token embeddings, the output head, or the rest. */
static int weight_class(const char *name, int is_matrix)
{
    if (!is_matrix)
        return KVP_CAP_W_VECTORS;
    if (!strncmp(name, "blk.", 4) || !strncmp(name, "model.layers.", 13) || !strncmp(name, "layers.", 7))
        return KVP_CAP_W_LAYERS;
    if (!strcmp(name, "token_embd.weight") || !strcmp(name, "model.embed_tokens.weight"))
        return KVP_CAP_W_EMBD;
    if (!strcmp(name, "output.weight") || !strcmp(name, "lm_head.weight"))
        return KVP_CAP_W_OUT;
    return KVP_CAP_W_REST;
}

/* Where a column-cut tensor's unit is kept: the attention output's or the
 * FFN down projections' (GGUF's names, HF's); NULL for another tensor. */
static uint32_t *cut_by_columns(kvp_col_units *u, const char *name)
{
    static const char *const ends[] = {"attn_output.weight", "o_proj.weight", "ffn_down.weight", "down_proj.weight"};
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof ends / sizeof *ends; i++) {
        size_t e = strlen(ends[i]);
        if (n >= e && strcmp(name + n - e, ends[i]) == 0)
            return i < 2 ? &u->attn : &u->ffn;
    }
    return NULL;
}

/* unit: the columns a slice of the tensor must be a multiple of (its
 * block, its scale group), 0 when not known. */
static void tally_add(tensor_tally *t, const char *name, const char *fmt, uint64_t bytes, int is_matrix,
                      uint32_t unit)
{
    int cls = weight_class(name, is_matrix);
    t->bytes += bytes;
    t->cls[cls] += bytes;
    if (cls == KVP_CAP_W_EMBD)
        snprintf(t->embd_fmt, sizeof t->embd_fmt, "%s", fmt);
    uint32_t *cut = cut_by_columns(&t->col_units, name);
    if (cut && unit > *cut)
        *cut = unit;
    /* GGUF's name, and HF's (a KVP file converted from safetensors keeps it) */
    if (strcmp(name, "output.weight") == 0 || strcmp(name, "lm_head.weight") == 0)
        t->has_output = 1;
    if (!is_matrix)
        return;
    size_t i = 0;
    while (i < t->n && strcmp(t->by[i].fmt, fmt) != 0)
        i++;
    if (i == t->n) {
        if (t->n == sizeof t->by / sizeof t->by[0])
            return; /* more formats than any real file has: the rest do not vote */
        snprintf(t->by[t->n++].fmt, sizeof t->by[0].fmt, "%s", fmt);
    }
    t->by[i].bytes += bytes;
    if (cls == KVP_CAP_W_LAYERS)
        t->by[i].layer_bytes += bytes;
}

/* The weights as the file stores them, and tying as decode's loader decides
 * it (model.c): tied exactly when no lm_head tensor is there, whatever a
 * kvpipe.tied_embeddings key says (quantize does not write one). */
static void tally_apply(const tensor_tally *t, kvp_cap_model_file *out)
{
    out->weight_bytes = t->bytes;
    memcpy(out->weight_class_bytes, t->cls, sizeof t->cls);
    out->col_units = t->col_units;
    out->cfg.tied_embeddings = !t->has_output;
    size_t best = 0;
    int layers = t->cls[KVP_CAP_W_LAYERS] > 0; /* else (names of no layer) every matrix votes */
    for (size_t i = 1; i < t->n; i++)
        if (layers ? t->by[i].layer_bytes > t->by[best].layer_bytes : t->by[i].bytes > t->by[best].bytes)
            best = i;
    if (t->n)
        snprintf(out->weight_type, sizeof out->weight_type, "%s", t->by[best].fmt);
    snprintf(out->embed_type, sizeof out->embed_type, "%s", t->embd_fmt);
}

/* MLA's query low rank, which kvp_config does not carry, in the loader's
 * range as kv_lora_rank is (a file kvcalc would refuse to plan names the
 * field, as the loader does for the others). */
static int q_lora_rank(kvp_cap_model_file *out, uint64_t q, const char *file, const char *field, kvp_err *err)
{
    if (q > KVP_CONFIG_MAX_LORA_RANK)
        return kvp_err_set(err, KVP_EINVAL, "%s: config: %" PRIu64 " MLA query rank (%s; want 0..%u)", file, q, field,
                           KVP_CONFIG_MAX_LORA_RANK);
    out->q_lora_rank = (uint32_t)q;
    return 0;
}

static int load_gguf(const char *path, kvp_in *in, kvp_cap_model_file *out, kvp_err *err)
{
    kvp_gguf g;
    int rc = kvp_gguf_open_in(&g, in, err);
    if (rc)
        return rc;
    kvp_config_init(&out->cfg);
    rc = kvp_config_from_meta(&out->cfg, &g.meta, path, err);
    if (!rc) {
        tensor_tally t = {0};
        for (uint64_t i = 0; i < g.n_tensors; i++) {
            const kvp_gguf_tensor *gt = &g.tensors[i];
            const kvp_dtype_traits *tr = gt->dtype >= 0 ? kvp_dtype_get((uint32_t)gt->dtype) : NULL;
            tally_add(&t, gt->name, kvp_gguf_type_name(gt->ggml_type), gt->nbytes, gt->n_dims >= 2,
                      tr ? (uint32_t)tr->block_size : 0);
        }
        tally_apply(&t, out);
        snprintf(out->kind, sizeof out->kind, "gguf");
        char key[64];
        uint64_t q;
        snprintf(key, sizeof key, "%s.attention.q_lora_rank", out->cfg.arch);
        if (kvp_meta_get_u64(&g.meta, key, &q) == 0)
            rc = q_lora_rank(out, q, path, key, err);
    }
    kvp_gguf_close(&g);
    return rc;
}

/* A KVP tensor's storage in kvp_cap_weight_fmt's names: the scheme says
 * what the dtype alone does not (int8 scaled by row, int4 by group). */
static void kvp_tensor_fmt(const kvp_tensor_rec *t, char *buf, size_t n)
{
    switch (t->dtype) {
    case KVP_DTYPE_FP8_E4M3: snprintf(buf, n, "fp8"); break;
    case KVP_DTYPE_FP8_E5M2: snprintf(buf, n, "fp8-e5m2"); break;
    case KVP_DTYPE_I8: snprintf(buf, n, "int8"); break;
    case KVP_DTYPE_I4:
    case KVP_DTYPE_U4:
        if (t->scheme == KVP_SCHEME_GROUP)
            snprintf(buf, n, "int4-g%u", t->group);
        else
            snprintf(buf, n, "int4");
        break;
    case KVP_DTYPE_FP4_E2M1: /* quantize --to fp4: E2M1 with an f32 scale a group */
        if (t->scheme == KVP_SCHEME_GROUP)
            snprintf(buf, n, "fp4-g%u", t->group);
        else
            snprintf(buf, n, "fp4_e2m1");
        break;
    default: snprintf(buf, n, "%s", kvp_dtype_name(t->dtype)); break;
    }
}

/* A skimmed TENSOR record's meta, read in place from the mapping (an
 * uncompressed record's payload starts right after its 64-byte header,
 * kvp(5)).  The reader checked the header, its checksum and the sizes, not
 * the payload's checksum, which covers the data kvcalc does not read; the
 * decoder still makes dtype, shape and byte counts agree with the header's
 * sizes, so a damaged meta is refused rather than counted, its name aside. */
static int skimmed_tensor(const kvp_in *in, const kvp_record *rec, kvp_tensor_rec *t, kvp_err *err)
{
    kvp_record v = *rec;
    v.meta = in->map + rec->offset + KVP_RECORD_HEADER_SIZE;
    uint64_t data_off = kvp_align_up(rec->meta_size, KVP_ALIGN);
    if (data_off < rec->raw_size) {
        v.data = v.meta + data_off;
        v.data_size = rec->raw_size - data_off;
    }
    const uint8_t *d, *s, *z;
    return kvp_tensor_decode(&v, t, &d, &s, &z, err);
}

/* One TENSOR record into the tally; 1 when it cannot be seen without
 * reading its payload (skimmed and compressed). */
static int tally_kvp_tensor(const kvp_in *in, const kvp_record *rec, tensor_tally *t, kvp_err *err)
{
    kvp_tensor_rec tr;
    int rc;
    if (rec->meta) {
        const uint8_t *d, *s, *z;
        rc = kvp_tensor_decode(rec, &tr, &d, &s, &z, err);
    } else if (in->map && !(rec->flags & KVP_RECORD_ZSTD)) {
        rc = skimmed_tensor(in, rec, &tr, err);
    } else {
        return 1;
    }
    if (rc)
        return rc;
    char fmt[24];
    kvp_tensor_fmt(&tr, fmt, sizeof fmt);
    const kvp_dtype_traits *dt = kvp_dtype_get(tr.dtype);
    uint32_t unit = dt ? (uint32_t)dt->block_size : 0;
    if (tr.scheme == KVP_SCHEME_GROUP && tr.group > unit)
        unit = tr.group;
    tally_add(t, tr.name, fmt, tr.data_bytes + tr.scales_bytes + tr.zeros_bytes, tr.n_dim >= 2, unit);
    return 0;
}

/* One pass over a KVP model file, to the end so a file cut short is
 * refused.  With skim the tensors' payloads, most of a model, are not read;
 * a compressed tensor's meta then cannot be seen, and the pass stops with
 * *again set, for a pass that reads everything. */
static int kvp_pass(const char *path, kvp_in *in, int skim, kvp_cap_model_file *out, tensor_tally *t, int *again,
                    kvp_err *err)
{
    kvp_reader *r = NULL;
    int rc = kvp_reader_open(&r, in, err);
    kvp_record rec;
    int found = 0;
    if (!rc && skim)
        kvp_reader_skim(r, 1u << KVP_KIND_TENSOR);
    while (!rc && !*again) {
        int n = kvp_reader_next(r, &rec, err);
        if (n <= 0) {
            rc = n;
            break;
        }
        if (rec.kind == KVP_KIND_TENSOR) {
            int k = tally_kvp_tensor(in, &rec, t, err);
            if (k < 0)
                rc = kvp_err_prefix(err, "%s", path);
            *again = k == 1;
        }
        if (rec.kind != KVP_KIND_CONFIG || found)
            continue;
        kvp_meta m;
        kvp_meta_init(&m);
        rc = kvp_meta_record_decode(&rec, &m, err);
        if (!rc) { /* a heads file's config is refused as such */
            kvp_config_init(&out->cfg);
            rc = kvp_config_from_meta(&out->cfg, &m, path, err);
        } else {
            kvp_err_prefix(err, "%s", path);
        }
        kvp_meta_free(&m);
        found = 1;
    }
    if (!rc && !found && !*again)
        rc = kvp_err_set(err, KVP_ENOTFOUND, "%s: no CONFIG record: not a model file", path);
    kvp_reader_free(r);
    return rc;
}

/* Takes *in.  A second pass opens path again, which a pipe cannot do: one
 * is read through at once, payloads and all. */
static int load_kvp(const char *path, kvp_in *in, kvp_cap_model_file *out, kvp_err *err)
{
    tensor_tally t = {0};
    int again = 0;
    int rc = kvp_pass(path, in, kvp_in_reopenable(in), out, &t, &again, err);
    kvp_in_close(in);
    if (!rc && again) { /* compressed tensors: read them through */
        memset(&t, 0, sizeof t);
        again = 0;
        kvp_in in2;
        if ((rc = kvp_in_open(&in2, path, err)) == 0) {
            rc = kvp_pass(path, &in2, 0, out, &t, &again, err);
            kvp_in_close(&in2);
        }
    }
    if (rc)
        return rc;
    tally_apply(&t, out);
    snprintf(out->kind, sizeof out->kind, "kvp");
    return 0;
}

/* HF: the shape from kvp_config_from_hf_json, plus MLA's q_lora_rank and
 * the weight format a quantization_config gives (hfquant.h; one it cannot
 * read is an error naming the field, as the loader's would be). */
static int load_hf_json(const kvp_json *j, const char *file, kvp_cap_model_file *out, kvp_err *err)
{
    int rc = kvp_config_from_hf_json(&out->cfg, j, file, err);
    if (rc)
        return rc;
    snprintf(out->kind, sizeof out->kind, "hf");
    uint64_t q;
    if (kvp_json_get_u64(j, "q_lora_rank", &q) == 0 && (rc = q_lora_rank(out, q, file, "q_lora_rank", err)) < 0)
        return rc;
    /* a quantized checkpoint: its linear layers' format (GPTQ, AWQ, compressed-tensors) */
    kvp_hfq hq;
    if ((rc = kvp_hfq_parse(&hq, j, file, err)) == 0)
        kvp_hfq_cap_format(&hq, out->weight_type, sizeof out->weight_type);
    return rc;
}

#define HF_CONFIG_MAX (16u << 20) /* bytes: real ones are a few KB */

/* A checkpoint folder: its config.json. */
static int load_hf_dir(const char *path, kvp_cap_model_file *out, kvp_err *err)
{
    char file[4096];
    if (snprintf(file, sizeof file, "%s/config.json", path) >= (int)sizeof file)
        return kvp_err_set(err, KVP_EINVAL, "%s: path too long", path);
    kvp_json *j = NULL;
    int rc = kvp_json_parse_file(&j, file, HF_CONFIG_MAX, err);
    if (rc == 0)
        rc = load_hf_json(j, file, out, err);
    kvp_json_free(j);
    return rc;
}

/* A config.json already open (its first bytes peeked): read from in, so a
 * pipe works too.  Takes *in. */
static int load_hf_file(const char *path, kvp_in *in, kvp_cap_model_file *out, kvp_err *err)
{
    uint8_t *text = NULL;
    size_t len = 0;
    kvp_json *j = NULL;
    int rc = kvp_in_read_all(in, HF_CONFIG_MAX, &text, &len, err);
    kvp_in_close(in);
    if (rc == 0)
        rc = kvp_json_parse(&j, (const char *)text, len, path, err);
    if (rc == 0)
        rc = load_hf_json(j, path, out, err);
    kvp_json_free(j);
    free(text);
    return rc;
}

/* Opened once, the kind told by the first bytes kept for its reader: a
 * pipe or FIFO opened again would lose them. */
static int load_any(const char *path, kvp_cap_model_file *out, kvp_err *err)
{
    memset(out, 0, sizeof *out);
    struct stat st;
    int is_stdin = strcmp(path, "-") == 0;
    if (!is_stdin && stat(path, &st) != 0)
        return kvp_err_set(err, KVP_EIO, "%s: %s", path, strerror(errno));
    if (!is_stdin && S_ISDIR(st.st_mode))
        return load_hf_dir(path, out, err);
    /* sniff the first bytes: GGUF, KVP, else JSON */
    kvp_in in;
    int rc = kvp_in_open(&in, path, err);
    if (rc)
        return rc;
    uint8_t head[8] = {0};
    int64_t got = kvp_in_peek(&in, head, sizeof head, err);
    size_t n = got > 0 ? (size_t)got : 0;
    if (got < 0) {
        kvp_in_close(&in);
        return (int)got;
    }
    if (n >= 4 && memcmp(head, "GGUF", 4) == 0)
        return load_gguf(path, &in, out, err);
    if (n >= 4 && memcmp(head + 1, "KVP", 3) == 0)
        return load_kvp(path, &in, out, err);
    size_t i = 0;
    while (i < n && (head[i] == ' ' || head[i] == '\n' || head[i] == '\r' || head[i] == '\t'))
        i++;
    if (i < n && head[i] == '{')
        return load_hf_file(path, &in, out, err);
    kvp_in_close(&in);
    return kvp_err_set(err, KVP_EFORMAT, "%s: not a model file (GGUF, KVP, or HF config.json)", path);
}

int kvp_cap_load_model(const char *path, kvp_cap_model_file *out, kvp_err *err)
{
    int rc = load_any(path, out, err);
    /* what decode's loader and quantize refuse in a file (a layer count of
     * 0, a vocabulary past the ceiling, heads that do not group) is the
     * file's fault, said the same way, whoever reads it */
    return rc ? rc : kvp_config_check(&out->cfg, path, err);
}
