/* hfquant_import.c - a quantized checkpoint's linear layers as kvp scaled
 * tensors (hfquant.h): one "<module>.weight" out of each module's parts.
 *
 * Integer layouts other than naive int8 go through one intermediate: the
 * signed codes q - 2^(bits-1) as int8 [n_out][n_in], f32 scales and zero
 * points [n_out][n_groups] (zero points likewise offset), and the group of
 * each input column; emit_codes() then packs them as i4 / i8 rows, or
 * dequantizes to f32 when the columns of a group are not contiguous. */
#include "hfquant.h"
#include "minifloat.h"
#include "wire.h"

#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME_MAX_HFQ 320

typedef struct ictx {
    const kvp_hfq *q;
    const kvp_safetensors *st;
    const char *path;
    kvp_err *err;
    kvp_hfq_set *s;
} ictx;

/* ---- memory ---- */

static void *own(ictx *x, uint64_t bytes) { return kvp_owned_alloc(&x->s->owned, bytes); }

static int oom(ictx *x, const char *what, uint64_t n)
{
    return kvp_err_set(x->err, KVP_ENOMEM, "%s: %s: out of memory for %llu bytes", x->path, what,
                       (unsigned long long)n);
}

/* ---- the parts of a module ---- */

/* Tensor mod + "." + suffix, marked as a part; NULL when absent (an error
 * when required). */
static int part(ictx *x, const char *mod, const char *suffix, int required, const kvp_safetensors_tensor **out)
{
    char name[2 * NAME_MAX_HFQ];
    snprintf(name, sizeof name, "%s.%s", mod, suffix);
    *out = kvp_safetensors_find(x->st, name);
    if (!*out)
        return required ? kvp_err_set(x->err, KVP_ENOTFOUND, "%s: tensor %s is missing (quantization_config needs it)",
                                      x->path, name)
                        : 0;
    x->s->role[*out - x->st->tensors] = KVP_HFQ_PART;
    return 0;
}

static int want_dtype(ictx *x, const kvp_safetensors_tensor *t, const char *a, const char *b, const char *c)
{
    const char *d = t->dtype_name;
    if (strcmp(d, a) == 0 || (b && strcmp(d, b) == 0) || (c && strcmp(d, c) == 0))
        return 0;
    return kvp_err_set(x->err, KVP_EFORMAT, "%s: tensor %s: dtype %s, expected %s%s%s%s%s", x->path, t->name, d, a,
                       b ? " or " : "", b ? b : "", c ? " or " : "", c ? c : "");
}

/* Shape [d0, d1] (d1 0: [d0] or [d0, 1] both fine). */
static int want_shape(ictx *x, const kvp_safetensors_tensor *t, uint64_t d0, uint64_t d1)
{
    int ok = d1 ? t->n_dims == 2 && t->shape[0] == d0 && t->shape[1] == d1
                : (t->n_dims == 1 && t->shape[0] == d0) || (t->n_dims == 2 && t->shape[0] == d0 && t->shape[1] == 1);
    if (ok)
        return 0;
    return kvp_err_set(x->err, KVP_EFORMAT, "%s: tensor %s: shape [%llu, %llu] (%u dims), expected [%llu, %llu]",
                       x->path, t->name, (unsigned long long)t->shape[0],
                       (unsigned long long)(t->n_dims > 1 ? t->shape[1] : 1), t->n_dims, (unsigned long long)d0,
                       (unsigned long long)(d1 ? d1 : 1));
}

/* Element i of a float tensor (F32, F16, BF16) as f32; the bytes may be unaligned. */
static float float_at(const kvp_safetensors_tensor *t, uint64_t i)
{
    const uint8_t *p = t->data;
    if (t->dtype == KVP_DTYPE_F32) {
        uint32_t u = kvp_le32(p + 4 * i);
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    uint16_t h = kvp_le16(p + 2 * i);
    return t->dtype == KVP_DTYPE_F16 ? kvp_f16_to_f32(h) : kvp_bf16_to_f32(h);
}

static uint32_t word_at(const kvp_safetensors_tensor *t, uint64_t i) { return kvp_le32((const uint8_t *)t->data + 4 * i); }

/* ---- the output tensor ---- */

static kvp_hfq_tensor *new_tensor(ictx *x, const char *mod, const kvp_safetensors_tensor *primary, uint64_t n_out,
                                  uint64_t n_in)
{
    kvp_hfq_tensor *t = &x->s->t[x->s->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->rec.name, sizeof t->rec.name, "%s.weight", mod);
    t->rec.n_dim = 2;
    t->rec.shape[0] = n_out;
    t->rec.shape[1] = n_in;
    t->rec.global_scale = 1.0f;
    x->s->role[primary - x->st->tensors] = (int32_t)(t - x->s->t);
    return t;
}

/* Scales (and zero points, NULL when all zero) already f32: the record's scheme. */
static void set_scaled(kvp_hfq_tensor *t, uint32_t dtype, uint32_t strategy, uint32_t group, const float *scales,
                       const float *zeros)
{
    t->rec.dtype = dtype;
    t->rec.scheme = strategy;
    t->rec.group = strategy == KVP_SCHEME_GROUP ? group : 0;
    t->rec.scale_dtype = KVP_DTYPE_F32;
    t->rec.flags = zeros ? KVP_TENSOR_ASYM : 0;
    t->rec.data_bytes = (uint64_t)kvp_tensor_data_bytes(&t->rec);
    t->rec.scales_bytes = (uint64_t)kvp_tensor_scale_count(&t->rec) * 4;
    t->rec.zeros_bytes = zeros ? t->rec.scales_bytes : 0;
    t->scales = scales;
    t->zeros = zeros;
}

/* Scales per row for a strategy: 1 (tensor: for all rows), 1, or n_in / group. */
static uint64_t n_groups(uint32_t strategy, uint32_t group, uint64_t n_in)
{
    return strategy == KVP_SCHEME_GROUP ? (n_in + group - 1) / group : 1;
}

/* The decoded intermediate of an integer weight. */
typedef struct codes {
    int8_t *q;          /* [n_out][n_in], q - 2^(bits-1) */
    float *s, *z;       /* [n_out][ng] (one value for a TENSOR scheme); z NULL: none */
    uint64_t n_out, n_in, ng;
    uint32_t bits, strategy, group;
    const kvp_safetensors_tensor *g_idx; /* I32 [n_in], or NULL: column i is in group i / group */
} codes;

/* The codes, and (own_sz: GPTQ/AWQ, which decode them here) scales and zero
 * points; compressed-tensors brings its own (ct_scales, ct_zeros). */
static int alloc_codes(ictx *x, codes *c, const char *mod, int own_sz)
{
    uint64_t ns = c->strategy == KVP_SCHEME_TENSOR ? 1 : c->n_out * c->ng;
    if (c->n_out && c->n_in > UINT64_MAX / c->n_out)
        return oom(x, mod, UINT64_MAX);
    c->q = own(x, c->n_out * c->n_in);
    if (own_sz) {
        c->s = own(x, ns * 4);
        c->z = own(x, ns * 4);
    }
    if (!c->q || (own_sz && (!c->s || !c->z)))
        return oom(x, mod, c->n_out * c->n_in);
    return 0;
}

/* Zero points that are all 0 are no zero points (a symmetric scheme). */
static void drop_zero_zeros(codes *c)
{
    uint64_t ns = c->strategy == KVP_SCHEME_TENSOR ? 1 : c->n_out * c->ng;
    for (uint64_t i = 0; c->z && i < ns; i++)
        if (c->z[i] != 0)
            return;
    c->z = NULL;
}

/* g_idx: every value a group, each group holding the columns a contiguous
 * split would give it (a permutation of i / group).  Sets *plain when it is
 * exactly i / group. */
static int check_g_idx(ictx *x, const codes *c, int *plain)
{
    const kvp_safetensors_tensor *g = c->g_idx;
    *plain = 1;
    if (!g)
        return 0;
    int rc = want_dtype(x, g, "I32", NULL, NULL);
    if (rc == 0)
        rc = want_shape(x, g, c->n_in, 0);
    if (rc < 0)
        return rc;
    uint64_t width = c->strategy == KVP_SCHEME_GROUP ? c->group : c->n_in;
    uint64_t *count = calloc(c->ng, sizeof *count);
    if (!count)
        return oom(x, g->name, c->ng * 8);
    for (uint64_t i = 0; i < c->n_in && rc == 0; i++) {
        uint32_t v = word_at(g, i);
        if (v >= c->ng)
            rc = kvp_err_set(x->err, KVP_EFORMAT, "%s: tensor %s: element %llu is group %d, outside 0..%llu",
                             x->path, g->name, (unsigned long long)i, (int32_t)v, (unsigned long long)c->ng - 1);
        else
            count[v]++, *plain &= v == i / width;
    }
    for (uint64_t k = 0; k < c->ng && rc == 0; k++) {
        uint64_t want = c->n_in - k * width < width ? c->n_in - k * width : width;
        if (count[k] != want)
            rc = kvp_err_set(x->err, KVP_EFORMAT, "%s: tensor %s: group %llu has %llu columns, expected %llu (not a "
                             "permutation of the groups)", x->path, g->name, (unsigned long long)k,
                             (unsigned long long)count[k], (unsigned long long)want);
    }
    free(count);
    return rc;
}

/* The decoded codes as the tensor's data: i4 / i8 rows with their scheme,
 * or f32 values when g_idx scatters a group's columns. */
static int emit_codes(ictx *x, kvp_hfq_tensor *t, codes *c)
{
    int plain, rc = check_g_idx(x, c, &plain);
    if (rc < 0)
        return rc;
    drop_zero_zeros(c);
    if (!plain || (c->strategy == KVP_SCHEME_GROUP && c->n_in % c->group)) {
        float *y = own(x, c->n_out * c->n_in * 4);
        if (!y)
            return oom(x, t->rec.name, c->n_out * c->n_in * 4);
        uint64_t width = c->strategy == KVP_SCHEME_GROUP ? c->group : c->n_in;
        for (uint64_t o = 0; o < c->n_out; o++)
            for (uint64_t i = 0; i < c->n_in; i++) {
                uint64_t g = c->g_idx ? word_at(c->g_idx, i) : i / width;
                uint64_t k = c->strategy == KVP_SCHEME_TENSOR ? 0 : o * c->ng + g;
                y[o * c->n_in + i] = ((float)c->q[o * c->n_in + i] - (c->z ? c->z[k] : 0.0f)) * c->s[k];
            }
        t->rec.dtype = KVP_DTYPE_F32;
        t->rec.data_bytes = c->n_out * c->n_in * 4;
        t->data = y;
        t->dequantized = 1;
        x->s->n_dequantized++;
        return 0;
    }
    if (c->bits == 8) {
        t->data = c->q;
    } else {
        if (c->n_in % 2)
            return kvp_err_set(x->err, KVP_EUNSUPPORTED, "%s: tensor %s: 4-bit rows of odd length %llu", x->path,
                               t->rec.name, (unsigned long long)c->n_in);
        uint8_t *d = own(x, c->n_out * c->n_in / 2);
        if (!d)
            return oom(x, t->rec.name, c->n_out * c->n_in / 2);
        for (uint64_t k = 0; k < c->n_out * c->n_in / 2; k++)
            d[k] = (uint8_t)((c->q[2 * k] & 15) | (c->q[2 * k + 1] & 15) << 4);
        t->data = d;
    }
    set_scaled(t, c->bits == 8 ? KVP_DTYPE_I8 : KVP_DTYPE_I4, c->strategy, c->group, c->s, c->z);
    t->converted = 1;
    x->s->n_converted++;
    return 0;
}

/* ---- compressed-tensors ---- */

/* Does target (a class name, "re:" + Python regex matched at the start, or a
 * module name or suffix) name mod?  "Linear" names every quantized module. */
static int ct_target_match(const char *target, const char *mod)
{
    if (strncmp(target, "re:", 3) == 0) {
        char pat[NAME_MAX_HFQ + 8];
        regex_t re;
        snprintf(pat, sizeof pat, "^(%s)", target + 3);
        if (regcomp(&re, pat, REG_EXTENDED | REG_NOSUB) != 0)
            return 0;
        int m = regexec(&re, mod, 0, NULL, 0) == 0;
        regfree(&re);
        return m;
    }
    size_t lt = strlen(target), lm = strlen(mod);
    return strcmp(target, mod) == 0 || (lm > lt && mod[lm - lt - 1] == '.' && strcmp(mod + lm - lt, target) == 0);
}

static const kvp_hfq_scheme *ct_scheme(const kvp_hfq *q, const char *mod)
{
    const kvp_hfq_scheme *linear = NULL;
    for (uint32_t i = 0; i < q->n_schemes; i++)
        for (size_t k = 0; k < q->schemes[i].targets->n; k++) {
            const kvp_json *tg = &q->schemes[i].targets->items[k];
            if (tg->type != KVP_JSON_STRING)
                continue;
            if (strcmp(tg->str, "Linear") == 0 && !linear)
                linear = &q->schemes[i];
            else if (ct_target_match(tg->str, mod))
                return &q->schemes[i];
        }
    return linear;
}

/* Scales of a compressed-tensors weight [n_out, n_in], row-major as kvp keeps them. */
static int ct_scales(ictx *x, const char *mod, const kvp_hfq_scheme *sc, uint64_t n_out, uint64_t n_in, float **out)
{
    const kvp_safetensors_tensor *t;
    int rc = part(x, mod, "weight_scale", 1, &t);
    if (rc == 0)
        rc = want_dtype(x, t, "F32", "F16", "BF16");
    if (rc < 0)
        return rc;
    uint64_t n = kvp_safetensors_nelems(t);
    if (sc->strategy == KVP_SCHEME_TENSOR && n != 1)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: tensor %s: %llu scales, expected 1 (strategy tensor)", x->path,
                           t->name, (unsigned long long)n);
    if (sc->strategy == KVP_SCHEME_CHANNEL && (rc = want_shape(x, t, n_out, 0)) < 0)
        return rc;
    if (sc->strategy == KVP_SCHEME_GROUP) {
        if (n_in % sc->group)
            return kvp_err_set(x->err, KVP_EFORMAT, "%s: tensor %s.weight: group %u does not divide a row of %llu",
                               x->path, mod, sc->group, (unsigned long long)n_in);
        if ((rc = want_shape(x, t, n_out, n_in / sc->group)) < 0)
            return rc;
    }
    float *s = own(x, n * 4);
    if (!s)
        return oom(x, t->name, n * 4);
    for (uint64_t i = 0; i < n; i++)
        s[i] = float_at(t, i);
    *out = s;
    return 0;
}

/* Zero points beside scales of count n: int8 values as they are, or int32
 * words packed along the output dimension ([ceil(n_out * bits / 32), ng],
 * offset by 2^(bits-1)).  NULL for a symmetric scheme. */
static int ct_zeros(ictx *x, const char *mod, const kvp_hfq_scheme *sc, uint64_t n_out, uint64_t ng, float **out)
{
    const kvp_safetensors_tensor *t;
    *out = NULL;
    int rc = part(x, mod, "weight_zero_point", !sc->symmetric, &t);
    if (rc < 0 || !t || sc->symmetric)
        return rc;
    uint64_t n = sc->strategy == KVP_SCHEME_TENSOR ? 1 : n_out * ng;
    float *z = own(x, n * 4);
    if (!z)
        return oom(x, t->name, n * 4);
    if (strcmp(t->dtype_name, "I8") == 0) {
        if (kvp_safetensors_nelems(t) != n)
            return kvp_err_set(x->err, KVP_EFORMAT, "%s: tensor %s: %llu zero points, expected %llu", x->path,
                               t->name, (unsigned long long)kvp_safetensors_nelems(t), (unsigned long long)n);
        for (uint64_t i = 0; i < n; i++)
            z[i] = (float)((const int8_t *)t->data)[i];
    } else {
        uint64_t per = 32 / sc->bits;
        if ((rc = want_dtype(x, t, "I32", NULL, NULL)) < 0 ||
            (rc = want_shape(x, t, (n_out + per - 1) / per, sc->strategy == KVP_SCHEME_TENSOR ? 1 : ng)) < 0)
            return rc;
        uint32_t mask = (1u << sc->bits) - 1, off = 1u << (sc->bits - 1);
        for (uint64_t r = 0; r < n_out && (r == 0 || sc->strategy != KVP_SCHEME_TENSOR); r++)
            for (uint64_t g = 0; g < ng; g++) {
                uint32_t w = word_at(t, (r / per) * ng + g);
                z[r * ng + g] = (float)(int32_t)(((w >> (r % per * sc->bits)) & mask) - off);
            }
    }
    *out = z;
    return 0;
}

/* weight_shape: [n_out, n_in] as I64 or I32. */
static int ct_shape(ictx *x, const char *mod, uint64_t *n_out, uint64_t *n_in)
{
    const kvp_safetensors_tensor *t;
    int rc = part(x, mod, "weight_shape", 1, &t);
    if (rc == 0)
        rc = want_dtype(x, t, "I64", "I32", NULL);
    if (rc == 0 && kvp_safetensors_nelems(t) != 2)
        rc = kvp_err_set(x->err, KVP_EFORMAT, "%s: tensor %s: %llu elements, expected 2", x->path, t->name,
                         (unsigned long long)kvp_safetensors_nelems(t));
    if (rc < 0)
        return rc;
    int wide = t->dtype_name[1] == '6';
    const uint8_t *p = t->data;
    int64_t a = wide ? (int64_t)kvp_le64(p) : (int32_t)kvp_le32(p);
    int64_t b = wide ? (int64_t)kvp_le64(p + 8) : (int32_t)kvp_le32(p + 4);
    if (a <= 0 || b <= 0 || a > (1 << 24) || b > (1 << 24))
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: tensor %s: [%lld, %lld] is not a weight shape", x->path,
                           t->name, (long long)a, (long long)b);
    *n_out = (uint64_t)a, *n_in = (uint64_t)b;
    return 0;
}

static int ct_pack(ictx *x, const char *mod, const kvp_hfq_scheme *sc, const kvp_safetensors_tensor *w)
{
    uint64_t n_out = 0, n_in = 0;
    int rc = ct_shape(x, mod, &n_out, &n_in);
    if (rc < 0)
        return rc;
    uint64_t per = 32 / sc->bits;
    if ((rc = want_dtype(x, w, "I32", NULL, NULL)) < 0 || (rc = want_shape(x, w, n_out, (n_in + per - 1) / per)) < 0)
        return rc;
    codes c = {.n_out = n_out, .n_in = n_in, .bits = sc->bits, .strategy = sc->strategy, .group = sc->group};
    c.ng = n_groups(sc->strategy, sc->group, n_in);
    if ((rc = alloc_codes(x, &c, mod, 0)) < 0 || (rc = ct_scales(x, mod, sc, n_out, n_in, &c.s)) < 0 ||
        (rc = ct_zeros(x, mod, sc, n_out, c.ng, &c.z)) < 0 ||
        (rc = part(x, mod, "weight_g_idx", 0, &c.g_idx)) < 0)
        return rc;
    uint32_t mask = (1u << sc->bits) - 1, off = 1u << (sc->bits - 1);
    uint64_t row_words = (n_in + per - 1) / per;
    for (uint64_t r = 0; r < n_out; r++)
        for (uint64_t i = 0; i < n_in; i++) {
            uint32_t v = word_at(w, r * row_words + i / per);
            c.q[r * n_in + i] = (int8_t)(int32_t)(((v >> (i % per * sc->bits)) & mask) - off);
        }
    return emit_codes(x, new_tensor(x, mod, w, n_out, n_in), &c);
}

/* naive-quantized and float-quantized: "<mod>.weight" holds the codes. */
static int ct_stored(ictx *x, const char *mod, const kvp_hfq_scheme *sc, const kvp_safetensors_tensor *w)
{
    int rc = sc->is_float ? want_dtype(x, w, "F8_E4M3", NULL, NULL) : want_dtype(x, w, "I8", NULL, NULL);
    if (rc < 0)
        return rc;
    if (w->n_dims != 2)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: tensor %s: %u dims, expected 2", x->path, w->name, w->n_dims);
    uint64_t n_out = w->shape[0], n_in = w->shape[1];
    if (sc->is_float && !sc->symmetric)
        return kvp_err_set(x->err, KVP_EUNSUPPORTED, "%s: tensor %s: fp8 weights with zero points", x->path, w->name);
    codes c = {.n_out = n_out, .n_in = n_in, .bits = sc->bits, .strategy = sc->strategy, .group = sc->group};
    c.ng = n_groups(sc->strategy, sc->group, n_in);
    const kvp_safetensors_tensor *gi, *in_scale;
    if ((rc = ct_scales(x, mod, sc, n_out, n_in, &c.s)) < 0 || (rc = ct_zeros(x, mod, sc, n_out, c.ng, &c.z)) < 0 ||
        (rc = part(x, mod, "weight_g_idx", 0, &gi)) < 0 || (rc = part(x, mod, "input_scale", 0, &in_scale)) < 0)
        return rc;
    kvp_hfq_tensor *t = new_tensor(x, mod, w, n_out, n_in);
    if (sc->bits == 8 && !gi) { /* the codes are ours already: used in place */
        t->data = w->data;
        if (((uintptr_t)w->data & 3) != 0) { /* the kernels read aligned words */
            void *d = own(x, w->nbytes);
            if (!d)
                return oom(x, w->name, w->nbytes);
            t->data = memcpy(d, w->data, w->nbytes);
        }
        set_scaled(t, sc->is_float ? KVP_DTYPE_FP8_E4M3 : KVP_DTYPE_I8, sc->strategy, sc->group, c.s, c.z);
        x->s->n_in_place++;
        return 0;
    }
    if (sc->is_float)
        return kvp_err_set(x->err, KVP_EUNSUPPORTED, "%s: tensor %s: fp8 weights with a g_idx order", x->path,
                           gi->name);
    c.g_idx = gi;
    if ((rc = alloc_codes(x, &c, mod, 0)) < 0)
        return rc;
    int8_t lo = (int8_t)-(1 << (sc->bits - 1)), hi = (int8_t)((1 << (sc->bits - 1)) - 1);
    for (uint64_t k = 0; k < n_out * n_in; k++) {
        int8_t v = ((const int8_t *)w->data)[k];
        if (v < lo || v > hi)
            return kvp_err_set(x->err, KVP_EFORMAT, "%s: tensor %s: element %llu is %d, outside a %u-bit range",
                               x->path, w->name, (unsigned long long)k, v, sc->bits);
        c.q[k] = v;
    }
    return emit_codes(x, t, &c);
}

/* NVFP4: weight_packed U8 [n_out, n_in / 2] (element 2k in the low nibble,
 * kvp's fp4_e2m1 layout), weight_scale F8_E4M3 [n_out, n_in / 16],
 * weight_global_scale F32 [1].  The package computes e2m1 * (s / global) in
 * f32: each kvp scale is that quotient, so the codes run in place. */
static int ct_nvfp4(ictx *x, const char *mod, const kvp_safetensors_tensor *w)
{
    const kvp_safetensors_tensor *sc_t, *gs_t, *in_gs;
    int rc = want_dtype(x, w, "U8", NULL, NULL);
    if (rc == 0 && w->n_dims != 2)
        rc = kvp_err_set(x->err, KVP_EFORMAT, "%s: tensor %s: %u dims, expected 2", x->path, w->name, w->n_dims);
    if (rc == 0)
        rc = part(x, mod, "weight_scale", 1, &sc_t);
    if (rc == 0)
        rc = part(x, mod, "weight_global_scale", 1, &gs_t);
    if (rc == 0)
        rc = part(x, mod, "input_global_scale", 0, &in_gs);
    if (rc < 0)
        return rc;
    uint64_t n_out = w->shape[0], n_in = 2 * w->shape[1];
    if (n_in % 16)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: tensor %s: rows of %llu, not a multiple of 16", x->path,
                           w->name, (unsigned long long)n_in);
    if ((rc = want_dtype(x, sc_t, "F8_E4M3", NULL, NULL)) < 0 || (rc = want_shape(x, sc_t, n_out, n_in / 16)) < 0 ||
        (rc = want_dtype(x, gs_t, "F32", NULL, NULL)) < 0)
        return rc;
    if (kvp_safetensors_nelems(gs_t) != 1)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: tensor %s: %llu values, expected 1", x->path, gs_t->name,
                           (unsigned long long)kvp_safetensors_nelems(gs_t));
    float g = float_at(gs_t, 0);
    if (!(g > 0) || !isfinite(g))
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: tensor %s: global scale %g", x->path, gs_t->name, g);
    uint64_t ns = n_out * n_in / 16;
    float *s = own(x, ns * 4);
    if (!s)
        return oom(x, sc_t->name, ns * 4);
    for (uint64_t k = 0; k < ns; k++)
        s[k] = kvp_e4m3_to_f32(((const uint8_t *)sc_t->data)[k]) / g;
    kvp_hfq_tensor *t = new_tensor(x, mod, w, n_out, n_in);
    t->data = w->data;
    set_scaled(t, KVP_DTYPE_FP4_E2M1, KVP_SCHEME_GROUP, 16, s, NULL);
    x->s->n_in_place++;
    return 0;
}

static int import_ct(ictx *x)
{
    for (uint64_t i = 0; i < x->st->n_tensors; i++) {
        const kvp_safetensors_tensor *w = &x->st->tensors[i];
        char mod[NAME_MAX_HFQ];
        size_t n = strlen(w->name);
        const char *suffix = ".weight_packed";
        int packed = n > 14 && strcmp(w->name + n - 14, suffix) == 0;
        if (!packed) {
            char sname[NAME_MAX_HFQ];
            if (!(n > 7 && strcmp(w->name + n - 7, ".weight") == 0) || n >= sizeof sname - 8)
                continue;
            snprintf(sname, sizeof sname, "%s_scale", w->name);
            if (!kvp_safetensors_find(x->st, sname))
                continue;
            suffix = ".weight";
        }
        size_t ls = strlen(suffix);
        if (n - ls >= sizeof mod)
            return kvp_err_set(x->err, KVP_ELIMIT, "%s: tensor %.64s...: name too long", x->path, w->name);
        memcpy(mod, w->name, n - ls);
        mod[n - ls] = 0;
        const kvp_hfq_scheme *sc = ct_scheme(x->q, mod);
        if (!sc)
            return kvp_err_set(x->err, KVP_EFORMAT, "%s: tensor %s: no quantization_config.config_groups entry "
                               "targets module %s", x->path, w->name, mod);
        if (sc->format == KVP_HFQ_FMT_DENSE)
            continue; /* floats: the scales beside them are not needed */
        int wants_packed = sc->format == KVP_HFQ_FMT_PACK || sc->format == KVP_HFQ_FMT_NVFP4;
        if (packed != wants_packed)
            return kvp_err_set(x->err, KVP_EFORMAT, "%s: tensor %s: config group %s says %s", x->path, w->name,
                               sc->name, packed ? "not pack-quantized" : "packed (weight_packed)");
        int rc = !packed ? ct_stored(x, mod, sc, w) : sc->format == KVP_HFQ_FMT_NVFP4 ? ct_nvfp4(x, mod, w)
                                                                                     : ct_pack(x, mod, sc, w);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* ---- GPTQ and AWQ: [n_in, n_out] int32 words ---- */

/* Nibble of output column o within its word: AWQ interleaves 0 2 4 6 1 3 5 7. */
static uint32_t awq_slot(uint64_t o)
{
    static const uint8_t inv[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    return inv[o % 8];
}

static int import_gptq_awq(ictx *x, const char *mod, const kvp_safetensors_tensor *qw)
{
    const kvp_hfq_scheme *sc = &x->q->schemes[0];
    int awq = x->q->method == KVP_HFQ_AWQ;
    const kvp_safetensors_tensor *qz, *sc_t, *gi = NULL;
    int rc = want_dtype(x, qw, "I32", NULL, NULL);
    if (rc == 0 && qw->n_dims != 2)
        rc = kvp_err_set(x->err, KVP_EFORMAT, "%s: tensor %s: %u dims, expected 2", x->path, qw->name, qw->n_dims);
    if (rc == 0)
        rc = part(x, mod, "scales", 1, &sc_t);
    if (rc == 0)
        rc = part(x, mod, "qzeros", 1, &qz);
    if (rc == 0 && !awq)
        rc = part(x, mod, "g_idx", 0, &gi);
    if (rc < 0)
        return rc;
    uint64_t per = 32 / sc->bits;
    /* GPTQ packs along n_in (rows of words), AWQ along n_out. */
    uint64_t n_in = awq ? qw->shape[0] : qw->shape[0] * per, n_out = awq ? qw->shape[1] * per : qw->shape[1];
    if (n_out % per || n_in == 0 || n_out == 0 || n_in > (1 << 24) || n_out > (1 << 24))
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: tensor %s: %llu outputs of %llu inputs cannot pack %u-bit "
                           "zero points in int32 words", x->path, qw->name, (unsigned long long)n_out,
                           (unsigned long long)n_in, sc->bits);
    codes c = {.n_out = n_out, .n_in = n_in, .bits = sc->bits, .strategy = sc->strategy, .group = sc->group};
    c.ng = n_groups(sc->strategy, sc->group, n_in);
    if ((rc = want_dtype(x, sc_t, "F16", "BF16", "F32")) < 0 || (rc = want_shape(x, sc_t, c.ng, n_out)) < 0 ||
        (rc = want_dtype(x, qz, "I32", NULL, NULL)) < 0 || (rc = want_shape(x, qz, c.ng, n_out / per)) < 0 ||
        (rc = alloc_codes(x, &c, mod, 1)) < 0)
        return rc;
    c.g_idx = gi;
    uint32_t mask = (1u << sc->bits) - 1, off = 1u << (sc->bits - 1);
    for (uint64_t i = 0; i < n_in; i++)
        for (uint64_t o = 0; o < n_out; o++) {
            uint32_t v = awq ? word_at(qw, i * (n_out / per) + o / per) >> (4 * awq_slot(o))
                             : word_at(qw, (i / per) * n_out + o) >> (i % per * sc->bits);
            c.q[o * n_in + i] = (int8_t)(int32_t)((v & mask) - off);
        }
    for (uint64_t g = 0; g < c.ng; g++)
        for (uint64_t o = 0; o < n_out; o++) {
            uint32_t w = word_at(qz, g * (n_out / per) + o / per);
            uint32_t z = (w >> (awq ? 4 * awq_slot(o) : o % per * sc->bits)) & mask;
            if (x->q->gptq_v1 && !awq)
                z = (z + 1) & mask; /* v1 stores z - 1; AutoGPTQ adds it back within the bit width */
            c.z[o * c.ng + g] = (float)(int32_t)(z - off);
            c.s[o * c.ng + g] = float_at(sc_t, g * n_out + o);
        }
    return emit_codes(x, new_tensor(x, mod, qw, n_out, n_in), &c);
}

static int import_packed_cols(ictx *x)
{
    for (uint64_t i = 0; i < x->st->n_tensors; i++) {
        const kvp_safetensors_tensor *w = &x->st->tensors[i];
        size_t n = strlen(w->name);
        if (n <= 8 || strcmp(w->name + n - 8, ".qweight") != 0)
            continue;
        char mod[NAME_MAX_HFQ];
        if (n - 8 >= sizeof mod)
            return kvp_err_set(x->err, KVP_ELIMIT, "%s: tensor %.64s...: name too long", x->path, w->name);
        memcpy(mod, w->name, n - 8);
        mod[n - 8] = 0;
        int rc = import_gptq_awq(x, mod, w);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int kvp_hfq_import(kvp_hfq_set *s, const kvp_hfq *q, const kvp_safetensors *st, const char *path, kvp_err *err)
{
    memset(s, 0, sizeof *s);
    ictx x = {q, st, path, err, s};
    s->t = calloc(st->n_tensors ? st->n_tensors : 1, sizeof *s->t);
    s->role = malloc((st->n_tensors ? st->n_tensors : 1) * sizeof *s->role);
    if (!s->t || !s->role) {
        kvp_hfq_set_free(s);
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", path);
    }
    for (uint64_t i = 0; i < st->n_tensors; i++)
        s->role[i] = KVP_HFQ_PLAIN;
    int rc = q->method == KVP_HFQ_CT ? import_ct(&x) : q->method == KVP_HFQ_NONE ? 0 : import_packed_cols(&x);
    if (rc < 0)
        kvp_hfq_set_free(s);
    return rc;
}

void kvp_hfq_set_free(kvp_hfq_set *s)
{
    kvp_owned_free(&s->owned);
    free(s->t);
    free(s->role);
    memset(s, 0, sizeof *s);
}

void kvp_hfq_set_describe(const kvp_hfq_set *s, char *buf, size_t n)
{
    snprintf(buf, n, "%llu weights used in place, %llu rewritten as i4/i8 rows (exact), %llu dequantized to f32 "
             "(g_idx order; exact)", (unsigned long long)s->n_in_place, (unsigned long long)s->n_converted,
             (unsigned long long)s->n_dequantized);
}

int kvp_hfq_open(kvp_hfq_set *s, const kvp_safetensors *st, const char *config_path, char *note, size_t note_n,
                 kvp_err *err)
{
    memset(s, 0, sizeof *s);
    if (note && note_n)
        note[0] = 0;
    kvp_json *j;
    int rc = kvp_json_parse_file(&j, config_path, 16u << 20, err);
    if (rc < 0)
        return rc;
    kvp_hfq q;
    if ((rc = kvp_hfq_parse(&q, j, config_path, err)) == 0 && q.method != KVP_HFQ_NONE &&
        (rc = kvp_hfq_import(s, &q, st, config_path, err)) == 0 && note && note_n) {
        char a[400], b[200];
        kvp_hfq_describe(&q, a, sizeof a);
        kvp_hfq_set_describe(s, b, sizeof b);
        snprintf(note, note_n, "%s: %s: %s", config_path, a, b);
    }
    kvp_json_free(j);
    return rc;
}
