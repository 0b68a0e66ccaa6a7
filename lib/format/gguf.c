/* gguf.c - a validating GGUF v2/v3 reader (see gguf.h, ../shared/FACTS.md).
 *
 * File layout (little-endian, packed):
 *   "GGUF" u32 version, u64 n_tensors, u64 n_kv
 *   n_kv x (string key, u32 type, value)          string = u64 length + bytes
 *   n_tensors x (string name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset)
 *   padding to general.alignment, then the data section (offsets relative to it)
 *
 * Everything is parsed through a kvp_cur over the whole mapping, so no read
 * can pass the end; every count is checked against the bytes left before
 * anything is allocated for it.
 */
#include "gguf.h"

#include "tensor.h"
#include "wire.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* GGUF metadata value types. */
enum {
    GG_U8 = 0, GG_I8 = 1, GG_U16 = 2, GG_I16 = 3, GG_U32 = 4, GG_I32 = 5, GG_F32 = 6, GG_BOOL = 7,
    GG_STR = 8, GG_ARR = 9, GG_U64 = 10, GG_I64 = 11, GG_F64 = 12,
};

/* ---- the ggml type table: name, elements per block, bytes per block ---- */

typedef struct gg_type {
    const char *name;
    uint32_t blck, bytes;
    int dtype; /* kvp_dtype or -1 */
} gg_type;

static const gg_type gg_types[] = {
    [0] = {"f32", 1, 4, KVP_DTYPE_F32},
    [1] = {"f16", 1, 2, KVP_DTYPE_F16},
    [2] = {"q4_0", 32, 18, KVP_DTYPE_Q4_0},
    [3] = {"q4_1", 32, 20, KVP_DTYPE_Q4_1},
    [6] = {"q5_0", 32, 22, KVP_DTYPE_Q5_0},
    [7] = {"q5_1", 32, 24, KVP_DTYPE_Q5_1},
    [8] = {"q8_0", 32, 34, KVP_DTYPE_Q8_0},
    [9] = {"q8_1", 32, 36, -1},
    [10] = {"q2_k", 256, 84, KVP_DTYPE_Q2_K},
    [11] = {"q3_k", 256, 110, KVP_DTYPE_Q3_K},
    [12] = {"q4_k", 256, 144, KVP_DTYPE_Q4_K},
    [13] = {"q5_k", 256, 176, KVP_DTYPE_Q5_K},
    [14] = {"q6_k", 256, 210, KVP_DTYPE_Q6_K},
    [15] = {"q8_k", 256, 292, -1},
    [16] = {"iq2_xxs", 256, 66, -1},
    [17] = {"iq2_xs", 256, 74, -1},
    [18] = {"iq3_xxs", 256, 98, -1},
    [19] = {"iq1_s", 256, 50, -1},
    [20] = {"iq4_nl", 32, 18, KVP_DTYPE_IQ4_NL},
    [21] = {"iq3_s", 256, 110, -1},
    [22] = {"iq2_s", 256, 82, -1},
    [23] = {"iq4_xs", 256, 136, KVP_DTYPE_IQ4_XS},
    [24] = {"i8", 1, 1, KVP_DTYPE_I8},
    [25] = {"i16", 1, 2, -1},
    [26] = {"i32", 1, 4, KVP_DTYPE_I32},
    [27] = {"i64", 1, 8, -1},
    [28] = {"f64", 1, 8, KVP_DTYPE_F64},
    [29] = {"iq1_m", 256, 56, -1},
    [30] = {"bf16", 1, 2, KVP_DTYPE_BF16},
    [34] = {"tq1_0", 256, 54, -1},
    [35] = {"tq2_0", 256, 66, -1},
    [39] = {"mxfp4", 32, 17, KVP_DTYPE_MXFP4}, /* block_mxfp4: kvp(5)'s mxfp4 byte for byte */
};
#define GG_NTYPES (sizeof gg_types / sizeof gg_types[0])

static const gg_type *gg_type_get(uint32_t t)
{
    return t < GG_NTYPES && gg_types[t].name ? &gg_types[t] : NULL;
}

const char *kvp_gguf_type_name(uint32_t ggml_type)
{
    const gg_type *g = gg_type_get(ggml_type);
    return g ? g->name : "?";
}

int kvp_gguf_type_to_dtype(uint32_t ggml_type)
{
    const gg_type *g = gg_type_get(ggml_type);
    return g ? g->dtype : -1;
}

int kvp_gguf_type_size(uint32_t ggml_type, uint32_t *block_elems, uint32_t *block_bytes)
{
    const gg_type *g = gg_type_get(ggml_type);
    *block_elems = g ? g->blck : 0;
    *block_bytes = g ? g->bytes : 0;
    return g ? 0 : KVP_EUNSUPPORTED;
}

/* ---- parsing context ---- */

typedef struct gg_ctx {
    kvp_cur c;
    const char *name; /* file name for messages */
    kvp_err *err;
    size_t ti_at;     /* where the tensor info a message is about starts */
} gg_ctx;

/* A GGUF string (u64 length + bytes).  NULL when it overruns or exceeds max;
 * *code tells which (ETRUNC or ELIMIT). */
static const char *gg_str(gg_ctx *x, uint64_t *len, uint64_t max, int *code)
{
    uint64_t n = kvp_cur_u64(&x->c);
    *len = 0;
    if (x->c.bad) {
        *code = KVP_ETRUNC;
        return NULL;
    }
    if (n > max) {
        *code = KVP_ELIMIT;
        return NULL;
    }
    if (n > x->c.left) {
        *code = KVP_ETRUNC;
        x->c.bad = 1;
        return NULL;
    }
    *len = n;
    return kvp_cur_take(&x->c, (size_t)n);
}

static char *dup_bytes(const char *s, uint64_t n)
{
    char *d = malloc((size_t)n + 1);
    if (d) {
        if (n)
            memcpy(d, s, (size_t)n);
        d[n] = '\0';
    }
    return d;
}

/* "file: metadata entry i (key "k") at offset o: what" */
static int kv_fail(gg_ctx *x, int code, uint64_t i, const char *key, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;
static int kv_fail(gg_ctx *x, int code, uint64_t i, const char *key, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return kvp_err_set(x->err, code, "%s: metadata entry %" PRIu64 " (key \"%.100s\") at offset %zu: %s", x->name,
                       i, key ? key : "?", kvp_cur_pos(&x->c), what);
}

static size_t gg_scalar_size(uint32_t t)
{
    switch (t) {
    case GG_U8:
    case GG_I8:
    case GG_BOOL: return 1;
    case GG_U16:
    case GG_I16: return 2;
    case GG_U32:
    case GG_I32:
    case GG_F32: return 4;
    case GG_U64:
    case GG_I64:
    case GG_F64: return 8;
    default: return 0;
    }
}

/* Read one integer/float/bool scalar of GGUF type t into e (U64/I64/F64/BOOL). */
static void gg_read_scalar(kvp_cur *c, uint32_t t, kvp_meta_entry *e)
{
    e->n = 1;
    switch (t) {
    case GG_U8: e->type = KVP_META_U64; e->v.u = kvp_cur_u8(c); break;
    case GG_I8: e->type = KVP_META_I64; e->v.i = (int8_t)kvp_cur_u8(c); break;
    case GG_U16: e->type = KVP_META_U64; e->v.u = kvp_cur_u16(c); break;
    case GG_I16: e->type = KVP_META_I64; e->v.i = (int16_t)kvp_cur_u16(c); break;
    case GG_U32: e->type = KVP_META_U64; e->v.u = kvp_cur_u32(c); break;
    case GG_I32: e->type = KVP_META_I64; e->v.i = (int32_t)kvp_cur_u32(c); break;
    case GG_U64: e->type = KVP_META_U64; e->v.u = kvp_cur_u64(c); break;
    case GG_I64: e->type = KVP_META_I64; e->v.i = (int64_t)kvp_cur_u64(c); break;
    case GG_F32: e->type = KVP_META_F64; e->v.f = kvp_cur_f32(c); break;
    case GG_F64: e->type = KVP_META_F64; e->v.f = kvp_cur_f64(c); break;
    default: e->type = KVP_META_BOOL; e->v.u = kvp_cur_u8(c); break;
    }
}

static int gg_read_strarr(gg_ctx *x, kvp_meta_entry *e, uint64_t i)
{
    /* Each element needs at least its 8-byte length. */
    if (e->n > x->c.left / 8)
        return kv_fail(x, KVP_ETRUNC, i, e->key, "array of %" PRIu64 " strings exceeds the %zu bytes left", e->n,
                       x->c.left);
    e->type = KVP_META_ARR_STR;
    gg_ctx scan = *x;
    uint64_t total = 0;
    int code = 0;
    for (uint64_t j = 0; j < e->n; j++) {
        uint64_t len;
        if (!gg_str(&scan, &len, KVP_GGUF_MAX_STR, &code)) {
            x->c = scan.c;
            return kv_fail(x, code, i, e->key, "string element %" PRIu64 " %s", j,
                           code == KVP_ELIMIT ? "is longer than the limit" : "runs past the end");
        }
        total += len + 1;
    }
    e->off = malloc(((size_t)e->n + 1) * sizeof *e->off);
    e->chars = malloc(total ? (size_t)total : 1);
    if (!e->off || !e->chars)
        return kv_fail(x, KVP_ENOMEM, i, e->key, "out of memory for %" PRIu64 " strings", e->n);
    uint64_t at = 0;
    for (uint64_t j = 0; j < e->n; j++) {
        uint64_t len;
        const char *s = gg_str(x, &len, KVP_GGUF_MAX_STR, &code);
        e->off[j] = at;
        if (len)
            memcpy(e->chars + at, s, (size_t)len);
        at += len;
        e->chars[at++] = '\0';
    }
    e->off[e->n] = at;
    return 0;
}

/* Numeric arrays: ints up to 32 bits -> ARR_I32 (a u32 array with a value
 * above INT32_MAX -> ARR_I64 so nothing wraps), 64-bit ints -> ARR_I64,
 * f32 -> ARR_F32, f64 -> ARR_F64, bool -> ARR_U8. */
static int gg_read_numarr(gg_ctx *x, kvp_meta_entry *e, uint32_t et, uint64_t i)
{
    size_t w = gg_scalar_size(et);
    if (e->n > x->c.left / w)
        return kv_fail(x, KVP_ETRUNC, i, e->key, "array of %" PRIu64 " elements exceeds the %zu bytes left", e->n,
                       x->c.left);
    kvp_meta_type mt;
    switch (et) {
    case GG_F32: mt = KVP_META_ARR_F32; break;
    case GG_F64: mt = KVP_META_ARR_F64; break;
    case GG_BOOL: mt = KVP_META_ARR_U8; break;
    case GG_U64:
    case GG_I64: mt = KVP_META_ARR_I64; break;
    case GG_U32: {
        mt = KVP_META_ARR_I32;
        for (uint64_t j = 0; j < e->n; j++)
            if (kvp_le32(x->c.p + j * 4) > INT32_MAX)
                mt = KVP_META_ARR_I64;
        break;
    }
    default: mt = KVP_META_ARR_I32; break;
    }
    size_t ow = kvp_meta_elem_size(mt);
    e->type = mt;
    e->arr = malloc(e->n ? (size_t)e->n * ow : 1);
    if (!e->arr)
        return kv_fail(x, KVP_ENOMEM, i, e->key, "out of memory for %" PRIu64 " elements", e->n);
    for (uint64_t j = 0; j < e->n; j++) {
        kvp_meta_entry s;
        gg_read_scalar(&x->c, et, &s);
        switch (mt) {
        case KVP_META_ARR_F32: ((float *)e->arr)[j] = (float)s.v.f; break;
        case KVP_META_ARR_F64: ((double *)e->arr)[j] = s.v.f; break;
        case KVP_META_ARR_U8:
            if (s.v.u > 1)
                return kv_fail(x, KVP_EFORMAT, i, e->key, "bool element %" PRIu64 " is %" PRIu64 ", not 0 or 1",
                               j, s.v.u);
            ((uint8_t *)e->arr)[j] = (uint8_t)s.v.u;
            break;
        case KVP_META_ARR_I64: ((int64_t *)e->arr)[j] = s.v.i; break;
        default: ((int32_t *)e->arr)[j] = (int32_t)s.v.i; break;
        }
    }
    return 0;
}

static int gg_read_value(gg_ctx *x, kvp_meta_entry *e, uint32_t t, uint64_t i)
{
    int code = 0;
    if (t == GG_STR) {
        uint64_t len;
        const char *s = gg_str(x, &len, KVP_GGUF_MAX_STR, &code);
        if (!s)
            return kv_fail(x, code, i, e->key, "string value %s",
                           code == KVP_ELIMIT ? "is longer than the limit" : "runs past the end");
        e->type = KVP_META_STR;
        e->n = len;
        e->str = dup_bytes(s, len);
        return e->str ? 0 : kv_fail(x, KVP_ENOMEM, i, e->key, "out of memory for a string of %" PRIu64 " bytes",
                                    len);
    }
    if (t == GG_ARR) {
        uint32_t et = kvp_cur_u32(&x->c);
        e->n = kvp_cur_u64(&x->c);
        if (x->c.bad)
            return kv_fail(x, KVP_ETRUNC, i, e->key, "array type or count runs past the end");
        if (e->n > KVP_GGUF_MAX_ARR)
            return kv_fail(x, KVP_ELIMIT, i, e->key, "array count %" PRIu64 " exceeds the limit %llu", e->n,
                           (unsigned long long)KVP_GGUF_MAX_ARR);
        if (et == GG_STR)
            return gg_read_strarr(x, e, i);
        if (et == GG_ARR)
            return kv_fail(x, KVP_EUNSUPPORTED, i, e->key, "arrays of arrays are not supported");
        if (gg_scalar_size(et) == 0)
            return kv_fail(x, KVP_EFORMAT, i, e->key, "unknown array element type %" PRIu32, et);
        return gg_read_numarr(x, e, et, i);
    }
    if (gg_scalar_size(t) == 0)
        return kv_fail(x, KVP_EFORMAT, i, e->key, "unknown value type %" PRIu32, t);
    gg_read_scalar(&x->c, t, e);
    if (x->c.bad)
        return kv_fail(x, KVP_ETRUNC, i, e->key, "value runs past the end");
    if (e->type == KVP_META_BOOL && e->v.u > 1)
        return kv_fail(x, KVP_EFORMAT, i, e->key, "bool is %" PRIu64 ", not 0 or 1", e->v.u);
    return 0;
}

static int gg_read_kv(gg_ctx *x, kvp_gguf *g, uint64_t i)
{
    kvp_meta_entry e;
    memset(&e, 0, sizeof e);
    uint64_t klen;
    int code = 0;
    const char *k = gg_str(x, &klen, KVP_GGUF_MAX_NAME, &code);
    if (!k)
        return kv_fail(x, code, i, NULL, "key %s", code == KVP_ELIMIT ? "is longer than the limit" : "runs past the end");
    if (klen == 0 || memchr(k, '\0', (size_t)klen))
        return kv_fail(x, KVP_EFORMAT, i, NULL, "key is empty or holds a NUL byte");
    e.key = dup_bytes(k, klen);
    if (!e.key)
        return kv_fail(x, KVP_ENOMEM, i, NULL, "out of memory");
    uint32_t t = kvp_cur_u32(&x->c);
    int rc = x->c.bad ? kv_fail(x, KVP_ETRUNC, i, e.key, "value type runs past the end") : gg_read_value(x, &e, t, i);
    if (rc) {
        kvp_meta_entry_free(&e);
        return rc;
    }
    if (kvp_meta_push(&g->meta, &e))
        return kv_fail(x, KVP_ENOMEM, i, NULL, "out of memory");
    return 0;
}

/* ---- tensor infos ---- */

static int ti_fail(gg_ctx *x, int code, uint64_t i, const char *tname, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;
static int ti_fail(gg_ctx *x, int code, uint64_t i, const char *tname, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return kvp_err_set(x->err, code, "%s: tensor info %" PRIu64 " (\"%.100s\") at offset %zu: %s", x->name, i,
                       tname ? tname : "?", x->ti_at, what);
}

static int gg_read_tensor_info(gg_ctx *x, kvp_gguf_tensor *t, uint64_t i)
{
    x->ti_at = kvp_cur_pos(&x->c);
    t->info_offset = x->ti_at;
    uint64_t nlen;
    int code = 0;
    const char *s = gg_str(x, &nlen, KVP_GGUF_MAX_NAME, &code);
    if (!s)
        return ti_fail(x, code, i, NULL, "name %s", code == KVP_ELIMIT ? "is longer than the limit" : "runs past the end");
    if (nlen == 0 || memchr(s, '\0', (size_t)nlen))
        return ti_fail(x, KVP_EFORMAT, i, NULL, "name is empty or holds a NUL byte");
    t->name = dup_bytes(s, nlen);
    if (!t->name)
        return ti_fail(x, KVP_ENOMEM, i, NULL, "out of memory");
    t->n_dims = kvp_cur_u32(&x->c);
    if (x->c.bad)
        return ti_fail(x, KVP_ETRUNC, i, t->name, "n_dims runs past the end");
    if (t->n_dims < 1 || t->n_dims > 4)
        return ti_fail(x, KVP_EFORMAT, i, t->name, "n_dims is %" PRIu32 ", not 1..4", t->n_dims);
    for (int d = 0; d < 4; d++)
        t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++)
        t->ne[d] = kvp_cur_u64(&x->c);
    t->ggml_type = kvp_cur_u32(&x->c);
    t->offset = kvp_cur_u64(&x->c); /* relative until gg_check_tensor */
    if (x->c.bad)
        return ti_fail(x, KVP_ETRUNC, i, t->name, "dims, type or offset run past the end");
    return 0;
}

/* Element count and byte size with overflow checks; the offset against the
 * file.  t->offset becomes absolute. */
static int gg_check_tensor(gg_ctx *x, kvp_gguf *g, kvp_gguf_tensor *t, uint64_t i)
{
    x->ti_at = (size_t)t->info_offset; /* the infos are all read: the cursor is past them */
    const gg_type *ty = gg_type_get(t->ggml_type);
    if (!ty)
        return ti_fail(x, KVP_EUNSUPPORTED, i, t->name, "unknown ggml type %" PRIu32, t->ggml_type);
    t->dtype = ty->dtype;
    uint64_t nel = 1;
    for (int d = 0; d < 4; d++) {
        if (t->ne[d] > (uint64_t)INT64_MAX)
            return ti_fail(x, KVP_EFORMAT, i, t->name, "dim %d is %" PRIu64 ", too large", d, t->ne[d]);
        if (t->ne[d] && nel > (uint64_t)INT64_MAX / t->ne[d])
            return ti_fail(x, KVP_EFORMAT, i, t->name, "element count overflows (dims %" PRIu64 " x %" PRIu64
                           " x %" PRIu64 " x %" PRIu64 ")", t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
        nel *= t->ne[d];
    }
    if (t->ne[0] % ty->blck)
        return ti_fail(x, KVP_EFORMAT, i, t->name, "dim 0 (%" PRIu64 ") is not a multiple of the %s block size %" PRIu32,
                       t->ne[0], ty->name, ty->blck);
    uint64_t blocks = nel / ty->blck;
    if (blocks > UINT64_MAX / ty->bytes)
        return ti_fail(x, KVP_EFORMAT, i, t->name, "byte size overflows");
    t->nbytes = blocks * ty->bytes;
    if (t->offset % g->alignment)
        return ti_fail(x, KVP_EFORMAT, i, t->name, "offset %" PRIu64 " is not a multiple of the alignment %" PRIu32,
                       t->offset, g->alignment);
    uint64_t room = g->size - g->data_offset; /* data_offset <= size checked by the caller */
    if (t->offset > room || t->nbytes > room - t->offset)
        return ti_fail(x, KVP_ETRUNC, i, t->name, "data (offset %" PRIu64 ", %" PRIu64
                       " bytes) runs past the end of the file (%" PRIu64 " bytes of data)", t->offset, t->nbytes, room);
    t->offset += g->data_offset;
    return 0;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp((*(const kvp_gguf_tensor *const *)a)->name, (*(const kvp_gguf_tensor *const *)b)->name);
}

static int gg_check_unique(gg_ctx *x, kvp_gguf *g)
{
    if (g->n_tensors < 2)
        return 0;
    const kvp_gguf_tensor **v = malloc((size_t)g->n_tensors * sizeof *v);
    if (!v)
        return kvp_err_set(x->err, KVP_ENOMEM, "%s: out of memory sorting %" PRIu64 " tensors", x->name,
                           g->n_tensors);
    for (uint64_t i = 0; i < g->n_tensors; i++)
        v[i] = &g->tensors[i];
    qsort(v, (size_t)g->n_tensors, sizeof *v, name_cmp);
    int rc = 0;
    for (uint64_t i = 1; i < g->n_tensors && !rc; i++)
        if (strcmp(v[i - 1]->name, v[i]->name) == 0)
            rc = kvp_err_set(x->err, KVP_EFORMAT, "%s: tensor name \"%.100s\" appears twice", x->name, v[i]->name);
    free(v);
    return rc;
}

static int gg_read_alignment(gg_ctx *x, kvp_gguf *g)
{
    g->alignment = 32;
    const kvp_meta_entry *e = kvp_meta_find(&g->meta, "general.alignment");
    if (!e)
        return 0;
    if (e->type != KVP_META_U64 || e->v.u == 0 || e->v.u > (1u << 20) || (e->v.u & (e->v.u - 1)))
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: metadata general.alignment: must be a power of two up to 2^20 "
                           "(got type %s)", x->name, kvp_meta_type_name(e->type));
    g->alignment = (uint32_t)e->v.u;
    return 0;
}

static int gg_read_header(gg_ctx *x, kvp_gguf *g, uint64_t *n_kv)
{
    const uint8_t *magic = kvp_cur_take(&x->c, 4);
    if (!magic)
        return kvp_err_set(x->err, KVP_ETRUNC, "%s: header: file is %" PRIu64 " bytes, too short for the magic",
                           x->name, g->size);
    if (memcmp(magic, "GGUF", 4) != 0)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: header: bad magic (not a GGUF file)", x->name);
    g->version = kvp_cur_u32(&x->c);
    g->n_tensors = kvp_cur_u64(&x->c);
    *n_kv = kvp_cur_u64(&x->c);
    if (x->c.bad)
        return kvp_err_set(x->err, KVP_ETRUNC, "%s: header: truncated (version and counts need 24 bytes)", x->name);
    if (g->version < 2 || g->version > 3)
        return kvp_err_set(x->err, KVP_EVERSION, "%s: header: version %" PRIu32 " (we read GGUF 2 and 3)", x->name,
                           g->version);
    if (*n_kv > KVP_GGUF_MAX_KV)
        return kvp_err_set(x->err, KVP_ELIMIT, "%s: header: n_kv %" PRIu64 " exceeds the limit %u", x->name, *n_kv,
                           KVP_GGUF_MAX_KV);
    if (g->n_tensors > KVP_GGUF_MAX_TENSORS)
        return kvp_err_set(x->err, KVP_ELIMIT, "%s: header: n_tensors %" PRIu64 " exceeds the limit %u", x->name,
                           g->n_tensors, KVP_GGUF_MAX_TENSORS);
    /* A metadata entry needs at least 8 + 1 + 4 + 1 bytes, a tensor info 8 + 1 + 4 + 8 + 4 + 8. */
    if (*n_kv > x->c.left / 14 || g->n_tensors > x->c.left / 33)
        return kvp_err_set(x->err, KVP_ETRUNC, "%s: header: n_kv %" PRIu64 " and n_tensors %" PRIu64
                           " cannot fit in the %zu bytes left", x->name, *n_kv, g->n_tensors, x->c.left);
    return 0;
}

static int gg_parse(kvp_gguf *g, kvp_err *err)
{
    gg_ctx x = {kvp_cur_make(g->base, (size_t)g->size), g->in.name ? g->in.name : "?", err, 0};
    uint64_t n_kv = 0;
    int rc = gg_read_header(&x, g, &n_kv);
    for (uint64_t i = 0; i < n_kv && !rc; i++)
        rc = gg_read_kv(&x, g, i);
    if (rc)
        return rc;
    const char *dup = kvp_meta_find_duplicate(&g->meta);
    if (dup)
        return kvp_err_set(err, KVP_EFORMAT, "%s: metadata key \"%.100s\" appears twice", x.name, dup);
    if ((rc = gg_read_alignment(&x, g)))
        return rc;
    g->tensors = calloc(g->n_tensors ? (size_t)g->n_tensors : 1, sizeof *g->tensors);
    if (!g->tensors)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory for %" PRIu64 " tensor infos", x.name, g->n_tensors);
    for (uint64_t i = 0; i < g->n_tensors && !rc; i++)
        rc = gg_read_tensor_info(&x, &g->tensors[i], i);
    if (rc)
        return rc;
    g->data_offset = kvp_align_up(kvp_cur_pos(&x.c), g->alignment);
    if (g->data_offset > g->size) {
        if (g->n_tensors)
            return kvp_err_set(err, KVP_ETRUNC, "%s: data section: starts at %" PRIu64 ", past the end (%" PRIu64
                               " bytes)", x.name, g->data_offset, g->size);
        g->data_offset = g->size; /* no tensors: the padding may be left out */
    }
    for (uint64_t i = 0; i < g->n_tensors && !rc; i++)
        rc = gg_check_tensor(&x, g, &g->tensors[i], i);
    return rc ? rc : gg_check_unique(&x, g);
}

static void gg_zero(kvp_gguf *g)
{
    memset(g, 0, sizeof *g);
    g->in.fd = -1;
    kvp_meta_init(&g->meta);
}

int kvp_gguf_open_mem(kvp_gguf *g, const void *data, uint64_t size, const char *name, kvp_err *err)
{
    gg_zero(g);
    g->in.name_owned = strdup(name ? name : "<memory>");
    if (!g->in.name_owned)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", name ? name : "<memory>");
    g->in.name = g->in.name_owned;
    g->base = data;
    g->size = size;
    int rc = gg_parse(g, err);
    if (rc)
        kvp_gguf_close(g);
    return rc;
}

/* A pipe cannot be mapped: read it whole into memory. */
static int gg_slurp(kvp_gguf *g, kvp_err *err)
{
    size_t cap = 1 << 20, n = 0;
    uint8_t *buf = malloc(cap);
    for (;;) {
        if (!buf)
            return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory for %zu bytes reading the stream", g->in.name,
                               cap);
        g->owned = buf;
        if (n == cap) {
            buf = cap < SIZE_MAX / 2 ? realloc(buf, cap * 2) : NULL;
            if (!buf)
                return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory for %zu bytes reading the stream (%zu read)",
                                   g->in.name, cap < SIZE_MAX / 2 ? cap * 2 : SIZE_MAX, n);
            g->owned = buf;
            cap *= 2;
        }
        int64_t r = kvp_in_read(&g->in, buf + n, cap - n, err);
        if (r < 0)
            return (int)r;
        if (r == 0)
            break;
        n += (size_t)r;
    }
    g->base = g->owned;
    g->size = n;
    return 0;
}

int kvp_gguf_open_in(kvp_gguf *g, kvp_in *in, kvp_err *err)
{
    gg_zero(g);
    g->in = *in;
    memset(in, 0, sizeof *in);
    in->fd = -1;
    int rc = 0;
    if (g->in.map || (g->in.size_known && g->in.size == 0)) {
        g->base = g->in.map;
        g->size = g->in.size;
    } else {
        rc = gg_slurp(g, err);
    }
    if (rc == 0)
        rc = gg_parse(g, err);
    if (rc)
        kvp_gguf_close(g);
    return rc;
}

int kvp_gguf_open(kvp_gguf *g, const char *path, kvp_err *err)
{
    kvp_in in;
    int rc = kvp_in_open(&in, path, err);
    if (rc) {
        gg_zero(g);
        return rc;
    }
    return kvp_gguf_open_in(g, &in, err);
}

void kvp_gguf_close(kvp_gguf *g)
{
    for (uint64_t i = 0; g->tensors && i < g->n_tensors; i++)
        free(g->tensors[i].name);
    free(g->tensors);
    kvp_meta_free(&g->meta);
    free(g->owned);
    if (g->in.fd >= 0 || g->in.map || g->in.name_owned)
        kvp_in_close(&g->in);
    gg_zero(g);
}

const kvp_gguf_tensor *kvp_gguf_find(const kvp_gguf *g, const char *name)
{
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (strcmp(g->tensors[i].name, name) == 0)
            return &g->tensors[i];
    return NULL;
}

const void *kvp_gguf_tensor_data(const kvp_gguf *g, const kvp_gguf_tensor *t)
{
    return g->base + t->offset;
}

uint64_t kvp_gguf_tensor_nelems(const kvp_gguf_tensor *t)
{
    return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
}
