/* hfquant.c - config.json's quantization_config into a kvp_hfq (hfquant.h).
 *
 * Field names follow what the packages write: compressed-tensors'
 * QuantizationConfig (quant_method, format, config_groups{targets, weights,
 * input_activations, format}, ignore), AutoGPTQ/GPTQModel's (bits,
 * group_size, desc_act, sym, checkpoint_format) and AutoAWQ's (bits or w_bit,
 * group_size or q_group_size, version, zero_point). */
#include "hfquant.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

typedef struct qctx {
    const char *path;
    kvp_err *err;
} qctx;

/* An optional integer member: 0 found, 1 absent or null, <0 an error naming it. */
static int q_int(const qctx *x, const kvp_json *o, const char *where, const char *key, int64_t *out)
{
    const kvp_json *v = kvp_json_get(o, key);
    if (!v || v->type == KVP_JSON_NULL)
        return 1;
    if (kvp_json_to_i64(v, out) != 0)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: %s.%s: expected an integer", x->path, where, key);
    return 0;
}

static int q_bool(const qctx *x, const kvp_json *o, const char *where, const char *key, int *out)
{
    const kvp_json *v = kvp_json_get(o, key);
    if (!v || v->type == KVP_JSON_NULL)
        return 1;
    if (v->type != KVP_JSON_BOOL)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: %s.%s: expected true or false", x->path, where, key);
    *out = v->b;
    return 0;
}

/* An optional string member: NULL when absent or null, an error when another type. */
static int q_str(const qctx *x, const kvp_json *o, const char *where, const char *key, const char **out)
{
    const kvp_json *v = kvp_json_get(o, key);
    *out = NULL;
    if (!v || v->type == KVP_JSON_NULL)
        return 0;
    if (v->type != KVP_JSON_STRING)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: %s.%s: expected a string", x->path, where, key);
    *out = v->str;
    return 0;
}

static int check_bits(const qctx *x, const char *where, int64_t bits, uint32_t *out)
{
    if (bits != 4 && bits != 8)
        return kvp_err_set(x->err, KVP_EUNSUPPORTED, "%s: %s: %lld bits (4 or 8 are supported)", x->path, where,
                           (long long)bits);
    *out = (uint32_t)bits;
    return 0;
}

/* A group size: -1 (or 0) means one group a row (CHANNEL). */
static int set_group(const qctx *x, const char *where, int64_t g, kvp_hfq_scheme *s)
{
    if (g <= 0) {
        if (g != -1 && g != 0)
            return kvp_err_set(x->err, KVP_EFORMAT, "%s: %s: group size %lld", x->path, where, (long long)g);
        s->strategy = KVP_SCHEME_CHANNEL;
        return 0;
    }
    if (g > (1 << 20) || g % 2)
        return kvp_err_set(x->err, KVP_EUNSUPPORTED, "%s: %s: group size %lld (an even number up to 2^20)", x->path,
                           where, (long long)g);
    s->strategy = KVP_SCHEME_GROUP;
    s->group = (uint32_t)g;
    return 0;
}

/* ---- GPTQ and AWQ ---- */

static int parse_gptq(const qctx *x, const kvp_json *qc, kvp_hfq *q)
{
    kvp_hfq_scheme *s = &q->schemes[0];
    q->n_schemes = 1;
    snprintf(s->name, sizeof s->name, "gptq");
    s->format = KVP_HFQ_FMT_PACK;
    s->symmetric = 0; /* GPTQ stores zero points whatever "sym" says */
    snprintf(s->act, sizeof s->act, "none");
    int64_t bits = 0, group = -1;
    int rc;
    if ((rc = q_int(x, qc, "quantization_config", "bits", &bits)) < 0)
        return rc;
    if (rc == 1)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: quantization_config.bits: missing", x->path);
    if ((rc = check_bits(x, "quantization_config.bits", bits, &s->bits)) < 0 ||
        (rc = q_int(x, qc, "quantization_config", "group_size", &group)) < 0 ||
        (rc = set_group(x, "quantization_config.group_size", group, s)) < 0 ||
        (rc = q_bool(x, qc, "quantization_config", "desc_act", &s->act_order)) < 0)
        return rc;
    const char *fmt;
    if ((rc = q_str(x, qc, "quantization_config", "checkpoint_format", &fmt)) < 0)
        return rc;
    q->gptq_v1 = !fmt || strcmp(fmt, "gptq") == 0;
    if (fmt && strcmp(fmt, "gptq") != 0 && strcmp(fmt, "gptq_v2") != 0)
        return kvp_err_set(x->err, KVP_EUNSUPPORTED, "%s: quantization_config.checkpoint_format: '%.40s' is not "
                           "supported (gptq, gptq_v2)", x->path, fmt);
    return 0;
}

static int parse_awq(const qctx *x, const kvp_json *qc, kvp_hfq *q)
{
    kvp_hfq_scheme *s = &q->schemes[0];
    q->n_schemes = 1;
    snprintf(s->name, sizeof s->name, "awq");
    s->format = KVP_HFQ_FMT_PACK;
    snprintf(s->act, sizeof s->act, "none");
    int64_t bits = 0, group = -1;
    int rc, zp = 1;
    if ((rc = q_int(x, qc, "quantization_config", "bits", &bits)) == 1)
        rc = q_int(x, qc, "quantization_config", "w_bit", &bits);
    if (rc < 0)
        return rc;
    if (rc == 1)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: quantization_config.bits: missing", x->path);
    if (bits != 4)
        return kvp_err_set(x->err, KVP_EUNSUPPORTED, "%s: quantization_config.bits: %lld bits (AWQ's GEMM layout "
                           "is 4-bit)", x->path, (long long)bits);
    s->bits = 4;
    if ((rc = q_int(x, qc, "quantization_config", "group_size", &group)) == 1)
        rc = q_int(x, qc, "quantization_config", "q_group_size", &group);
    if (rc < 0 || (rc = set_group(x, "quantization_config.group_size", group, s)) < 0 ||
        (rc = q_bool(x, qc, "quantization_config", "zero_point", &zp)) < 0)
        return rc;
    s->symmetric = 0; /* the GEMM layout stores qzeros either way */
    const char *ver;
    if ((rc = q_str(x, qc, "quantization_config", "version", &ver)) < 0)
        return rc;
    if (ver && strcasecmp(ver, "gemm") != 0)
        return kvp_err_set(x->err, KVP_EUNSUPPORTED, "%s: quantization_config.version: '%.40s' is not supported "
                           "(gemm)", x->path, ver);
    return 0;
}

/* ---- compressed-tensors ---- */

static int ct_format(const qctx *x, const char *where, const char *f, int *out)
{
    static const struct { const char *name; int fmt; } map[] = {
        {"pack-quantized", KVP_HFQ_FMT_PACK}, {"naive-quantized", KVP_HFQ_FMT_NAIVE},
        {"int-quantized", KVP_HFQ_FMT_NAIVE}, {"float-quantized", KVP_HFQ_FMT_FLOAT},
        {"nvfp4-pack-quantized", KVP_HFQ_FMT_NVFP4}, {"dense", KVP_HFQ_FMT_DENSE},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(f, map[i].name) == 0) {
            *out = map[i].fmt;
            return 0;
        }
    return kvp_err_set(x->err, KVP_EUNSUPPORTED, "%s: %s: '%.40s' is not supported (pack-quantized, "
                       "naive-quantized, int-quantized, float-quantized, nvfp4-pack-quantized, dense)", x->path,
                       where, f);
}

/* "fp8 dynamic token" style text of an input_activations object. */
static int ct_act(const qctx *x, const kvp_json *a, const char *where, char *buf, size_t n)
{
    if (!a || a->type == KVP_JSON_NULL) {
        snprintf(buf, n, "none");
        return 0;
    }
    if (a->type != KVP_JSON_OBJECT)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: %s: expected an object or null", x->path, where);
    int64_t bits = 0;
    int dyn = 0, rc;
    const char *type, *strat;
    if ((rc = q_int(x, a, where, "num_bits", &bits)) < 0 || (rc = q_bool(x, a, where, "dynamic", &dyn)) < 0 ||
        (rc = q_str(x, a, where, "type", &type)) < 0 || (rc = q_str(x, a, where, "strategy", &strat)) < 0)
        return rc;
    snprintf(buf, n, "%s%lld %s %.16s", type && strcmp(type, "float") == 0 ? "fp" : "int", (long long)bits,
             dyn ? "dynamic" : "static", strat ? strat : "tensor");
    return 0;
}

static int ct_weights(const qctx *x, const kvp_json *w, const char *where, kvp_hfq_scheme *s)
{
    if (!w || w->type != KVP_JSON_OBJECT)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: %s: missing or not an object", x->path, where);
    int64_t bits = 0, group = 0;
    int rc;
    const char *type, *strat, *order = NULL;
    if ((rc = q_int(x, w, where, "num_bits", &bits)) < 0)
        return rc;
    if (rc == 1)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: %s.num_bits: missing", x->path, where);
    s->symmetric = 1; /* QuantizationArgs' default */
    if ((rc = q_str(x, w, where, "type", &type)) < 0 || (rc = q_str(x, w, where, "strategy", &strat)) < 0 ||
        (rc = q_bool(x, w, where, "symmetric", &s->symmetric)) < 0)
        return rc;
    const kvp_json *ao = kvp_json_get(w, "actorder");
    if (ao && ao->type == KVP_JSON_STRING)
        order = ao->str;
    else if (ao && ao->type == KVP_JSON_BOOL && ao->b)
        order = "group";
    s->act_order = order && strcmp(order, "group") == 0; /* "weight" keeps contiguous groups */
    s->is_float = type && strcmp(type, "float") == 0;
    if (type && !s->is_float && strcmp(type, "int") != 0)
        return kvp_err_set(x->err, KVP_EUNSUPPORTED, "%s: %s.type: '%.20s' (int or float)", x->path, where, type);
    if ((rc = check_bits(x, where, bits, &s->bits)) < 0)
        return rc;
    if (s->is_float && bits == 4) { /* NVFP4: E4M3 scales per 16 under an f32 tensor scale */
        if ((rc = q_int(x, w, where, "group_size", &group)) < 0)
            return rc;
        if (!strat || strcmp(strat, "tensor_group") != 0 || group != 16 || !s->symmetric)
            return kvp_err_set(x->err, KVP_EUNSUPPORTED, "%s: %s: 4-bit float weights other than NVFP4 (strategy "
                               "tensor_group, group_size 16, symmetric)", x->path, where);
        s->strategy = KVP_SCHEME_GROUP, s->group = 16;
        return 0;
    }
    if (!strat || strcmp(strat, "tensor") == 0) {
        s->strategy = KVP_SCHEME_TENSOR;
    } else if (strcmp(strat, "channel") == 0) {
        s->strategy = KVP_SCHEME_CHANNEL;
    } else if (strcmp(strat, "group") == 0) {
        if ((rc = q_int(x, w, where, "group_size", &group)) < 0)
            return rc;
        if (rc == 1 || group <= 0)
            return kvp_err_set(x->err, KVP_EFORMAT, "%s: %s.group_size: a positive size is needed by strategy "
                               "group", x->path, where);
        if ((rc = set_group(x, where, group, s)) < 0)
            return rc;
    } else {
        return kvp_err_set(x->err, KVP_EUNSUPPORTED, "%s: %s.strategy: '%.20s' is not supported (tensor, channel, "
                           "group)", x->path, where, strat);
    }
    return 0;
}

static int parse_ct(const qctx *x, const kvp_json *qc, kvp_hfq *q)
{
    const char *gfmt, *status;
    int rc, fmt = KVP_HFQ_FMT_DENSE;
    if ((rc = q_str(x, qc, "quantization_config", "format", &gfmt)) < 0 ||
        (rc = q_str(x, qc, "quantization_config", "quantization_status", &status)) < 0 ||
        (gfmt && (rc = ct_format(x, "quantization_config.format", gfmt, &fmt)) < 0))
        return rc;
    if (status && strcmp(status, "compressed") != 0)
        fmt = KVP_HFQ_FMT_DENSE; /* "frozen": the weights are stored as floats */
    q->ignore = kvp_json_get(qc, "ignore");
    if (q->ignore && q->ignore->type != KVP_JSON_ARRAY && q->ignore->type != KVP_JSON_NULL)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: quantization_config.ignore: expected an array", x->path);
    const kvp_json *groups = kvp_json_get(qc, "config_groups");
    if (!groups || groups->type != KVP_JSON_OBJECT || groups->n == 0)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: quantization_config.config_groups: missing or empty", x->path);
    if (groups->n > KVP_HFQ_MAX_SCHEMES)
        return kvp_err_set(x->err, KVP_ELIMIT, "%s: quantization_config.config_groups: %zu groups (at most %d)",
                           x->path, groups->n, KVP_HFQ_MAX_SCHEMES);
    for (size_t i = 0; i < groups->n; i++) {
        const kvp_json *g = &groups->items[i];
        kvp_hfq_scheme *s = &q->schemes[q->n_schemes++];
        char where[128];
        snprintf(s->name, sizeof s->name, "%.47s", groups->keys[i]);
        snprintf(where, sizeof where, "quantization_config.config_groups.%.40s", groups->keys[i]);
        if (g->type != KVP_JSON_OBJECT)
            return kvp_err_set(x->err, KVP_EFORMAT, "%s: %s: expected an object", x->path, where);
        s->targets = kvp_json_get(g, "targets");
        if (!s->targets || s->targets->type != KVP_JSON_ARRAY)
            return kvp_err_set(x->err, KVP_EFORMAT, "%s: %s.targets: missing or not an array", x->path, where);
        const char *f;
        char sub[160];
        s->format = fmt;
        snprintf(sub, sizeof sub, "%s.format", where);
        if ((rc = q_str(x, g, where, "format", &f)) < 0 || (f && status && strcmp(status, "compressed") == 0 &&
                                                            (rc = ct_format(x, sub, f, &s->format)) < 0))
            return rc;
        snprintf(sub, sizeof sub, "%s.weights", where);
        if ((rc = ct_weights(x, kvp_json_get(g, "weights"), sub, s)) < 0)
            return rc;
        snprintf(sub, sizeof sub, "%s.input_activations", where);
        if ((rc = ct_act(x, kvp_json_get(g, "input_activations"), sub, s->act, sizeof s->act)) < 0)
            return rc;
        if ((s->format == KVP_HFQ_FMT_FLOAT && (!s->is_float || s->bits != 8)) ||
            (s->format == KVP_HFQ_FMT_NVFP4 && (!s->is_float || s->bits != 4)))
            return kvp_err_set(x->err, KVP_EFORMAT, "%s: %s.weights: %s needs %s float weights", x->path, where,
                               s->format == KVP_HFQ_FMT_NVFP4 ? "nvfp4-pack-quantized" : "float-quantized",
                               s->format == KVP_HFQ_FMT_NVFP4 ? "4-bit" : "8-bit");
        if ((s->format == KVP_HFQ_FMT_PACK || s->format == KVP_HFQ_FMT_NAIVE) && s->is_float)
            return kvp_err_set(x->err, KVP_EFORMAT, "%s: %s.weights.type: an integer format with float weights",
                               x->path, where);
    }
    return 0;
}

int kvp_hfq_parse(kvp_hfq *q, const kvp_json *root, const char *path, kvp_err *err)
{
    memset(q, 0, sizeof *q);
    qctx x = {path ? path : "config.json", err};
    const kvp_json *qc = kvp_json_get(root, "quantization_config");
    if (!qc || qc->type == KVP_JSON_NULL)
        return 0;
    if (qc->type != KVP_JSON_OBJECT)
        return kvp_err_set(err, KVP_EFORMAT, "%s: quantization_config: expected an object", x.path);
    const char *m;
    int rc = q_str(&x, qc, "quantization_config", "quant_method", &m);
    if (rc < 0)
        return rc;
    if (!m)
        return kvp_err_set(err, KVP_EFORMAT, "%s: quantization_config.quant_method: missing", x.path);
    if (strcmp(m, "compressed-tensors") == 0)
        q->method = KVP_HFQ_CT, rc = parse_ct(&x, qc, q);
    else if (strcmp(m, "gptq") == 0)
        q->method = KVP_HFQ_GPTQ, rc = parse_gptq(&x, qc, q);
    else if (strcmp(m, "awq") == 0)
        q->method = KVP_HFQ_AWQ, rc = parse_awq(&x, qc, q);
    else
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: quantization_config.quant_method: '%.40s' is not supported "
                           "(compressed-tensors, gptq, awq)", x.path, m);
    if (rc < 0)
        memset(q, 0, sizeof *q);
    return rc;
}

static const char *method_name(int m)
{
    return m == KVP_HFQ_CT ? "compressed-tensors" : m == KVP_HFQ_GPTQ ? "gptq" : m == KVP_HFQ_AWQ ? "awq" : "none";
}

static const char *format_name(int f)
{
    return f == KVP_HFQ_FMT_PACK ? "pack-quantized" : f == KVP_HFQ_FMT_NAIVE ? "naive-quantized"
           : f == KVP_HFQ_FMT_FLOAT ? "float-quantized" : f == KVP_HFQ_FMT_NVFP4 ? "nvfp4-pack-quantized" : "dense";
}

void kvp_hfq_describe(const kvp_hfq *q, char *buf, size_t n)
{
    size_t at = (size_t)snprintf(buf, n, "%s", method_name(q->method));
    for (uint32_t i = 0; i < q->n_schemes && at < n; i++) {
        const kvp_hfq_scheme *s = &q->schemes[i];
        char strat[32];
        if (s->strategy == KVP_SCHEME_GROUP)
            snprintf(strat, sizeof strat, "group %u", s->group);
        else
            snprintf(strat, sizeof strat, "%s", s->strategy == KVP_SCHEME_CHANNEL ? "channel" : "tensor");
        at += (size_t)snprintf(buf + at, n - at, "%s %s%s%s%u %s%s%s (activations %s)", i ? ";" : "",
                               q->method == KVP_HFQ_CT ? format_name(s->format) : "", q->method == KVP_HFQ_CT ? " " : "",
                               s->is_float ? "fp" : "int",
                               s->bits, strat, s->symmetric ? " symmetric" : " with zero points",
                               s->act_order ? ", act order" : "", s->act);
    }
}

void kvp_hfq_cap_format(const kvp_hfq *q, char *buf, size_t n)
{
    buf[0] = 0;
    if (q->method == KVP_HFQ_NONE || !q->n_schemes || q->schemes[0].format == KVP_HFQ_FMT_DENSE)
        return;
    const kvp_hfq_scheme *s = &q->schemes[0];
    if (s->is_float)
        snprintf(buf, n, "%s", s->bits == 4 ? "nvfp4" : "fp8");
    else if (s->bits == 8)
        snprintf(buf, n, "int8");
    else if (s->strategy == KVP_SCHEME_GROUP)
        snprintf(buf, n, "int4-g%u", s->group);
    else
        snprintf(buf, n, "int4");
}
