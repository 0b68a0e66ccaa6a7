/* meta.c - typed key/value lists (see meta.h) and their byte encoding.
 *
 * Encoding (kvp(5) "metadata list"), little-endian:
 *   u32 entry count
 *   per entry: u32 key length, key bytes, u32 type, u64 n, value:
 *     U64/I64/F64/BOOL  8 bytes (n = 1)
 *     STR               n bytes
 *     ARR_U8/I32/F32/I64/F64  n elements of 1/4/4/8/8 bytes
 *     ARR_STR           n x (u32 length + bytes)
 */
#include "meta.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

void kvp_meta_init(kvp_meta *m)
{
    m->e = NULL;
    m->n = m->cap = 0;
}

void kvp_meta_entry_free(kvp_meta_entry *e)
{
    free(e->key);
    free(e->str);
    free(e->arr);
    free(e->off);
    free(e->chars);
    memset(e, 0, sizeof *e);
}

void kvp_meta_free(kvp_meta *m)
{
    for (size_t i = 0; i < m->n; i++)
        kvp_meta_entry_free(&m->e[i]);
    free(m->e);
    kvp_meta_init(m);
}

size_t kvp_meta_elem_size(kvp_meta_type t)
{
    switch (t) {
    case KVP_META_ARR_U8: return 1;
    case KVP_META_ARR_I32:
    case KVP_META_ARR_F32: return 4;
    case KVP_META_ARR_I64:
    case KVP_META_ARR_F64: return 8;
    default: return 0;
    }
}

const char *kvp_meta_type_name(kvp_meta_type t)
{
    switch (t) {
    case KVP_META_U64: return "u64";
    case KVP_META_I64: return "i64";
    case KVP_META_F64: return "f64";
    case KVP_META_BOOL: return "bool";
    case KVP_META_STR: return "str";
    case KVP_META_ARR_U8: return "arr[u8]";
    case KVP_META_ARR_I32: return "arr[i32]";
    case KVP_META_ARR_F32: return "arr[f32]";
    case KVP_META_ARR_STR: return "arr[str]";
    case KVP_META_ARR_I64: return "arr[i64]";
    case KVP_META_ARR_F64: return "arr[f64]";
    }
    return "?";
}

static int type_known(uint32_t t)
{
    return (t >= KVP_META_U64 && t <= KVP_META_STR) || (t >= KVP_META_ARR_U8 && t <= KVP_META_ARR_F64);
}

int kvp_meta_push(kvp_meta *m, kvp_meta_entry *e)
{
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 16;
        kvp_meta_entry *ne = cap < SIZE_MAX / sizeof *ne ? realloc(m->e, cap * sizeof *ne) : NULL;
        if (!ne) {
            kvp_meta_entry_free(e);
            return KVP_ENOMEM;
        }
        m->e = ne;
        m->cap = cap;
    }
    m->e[m->n++] = *e;
    memset(e, 0, sizeof *e);
    return 0;
}

const kvp_meta_entry *kvp_meta_find(const kvp_meta *m, const char *key)
{
    for (size_t i = 0; i < m->n; i++)
        if (strcmp(m->e[i].key, key) == 0)
            return &m->e[i];
    return NULL;
}

/* Put e in m, replacing the entry with the same key; takes e's allocations. */
static int meta_put(kvp_meta *m, kvp_meta_entry *e)
{
    for (size_t i = 0; i < m->n; i++) {
        if (strcmp(m->e[i].key, e->key) == 0) {
            kvp_meta_entry_free(&m->e[i]);
            m->e[i] = *e;
            memset(e, 0, sizeof *e);
            return 0;
        }
    }
    return kvp_meta_push(m, e);
}

static int entry_start(kvp_meta_entry *e, const char *key, kvp_meta_type t, uint64_t n)
{
    memset(e, 0, sizeof *e);
    e->key = strdup(key);
    e->type = t;
    e->n = n;
    return e->key ? 0 : KVP_ENOMEM;
}

static int set_scalar(kvp_meta *m, const char *key, kvp_meta_type t, uint64_t bits)
{
    kvp_meta_entry e;
    if (entry_start(&e, key, t, 1))
        return KVP_ENOMEM;
    e.v.u = bits;
    return meta_put(m, &e);
}

int kvp_meta_set_u64(kvp_meta *m, const char *key, uint64_t v)
{
    return set_scalar(m, key, KVP_META_U64, v);
}

int kvp_meta_set_i64(kvp_meta *m, const char *key, int64_t v)
{
    kvp_meta_entry e;
    if (entry_start(&e, key, KVP_META_I64, 1))
        return KVP_ENOMEM;
    e.v.i = v;
    return meta_put(m, &e);
}

int kvp_meta_set_f64(kvp_meta *m, const char *key, double v)
{
    kvp_meta_entry e;
    if (entry_start(&e, key, KVP_META_F64, 1))
        return KVP_ENOMEM;
    e.v.f = v;
    return meta_put(m, &e);
}

int kvp_meta_set_bool(kvp_meta *m, const char *key, int v)
{
    return set_scalar(m, key, KVP_META_BOOL, v ? 1 : 0);
}

int kvp_meta_set_str(kvp_meta *m, const char *key, const char *s, size_t len)
{
    kvp_meta_entry e;
    if (entry_start(&e, key, KVP_META_STR, len))
        return KVP_ENOMEM;
    e.str = len < SIZE_MAX ? malloc(len + 1) : NULL;
    if (!e.str) {
        kvp_meta_entry_free(&e);
        return KVP_ENOMEM;
    }
    if (len)
        memcpy(e.str, s, len);
    e.str[len] = '\0';
    return meta_put(m, &e);
}

int kvp_meta_set_arr(kvp_meta *m, const char *key, kvp_meta_type type, const void *data, uint64_t n)
{
    size_t w = kvp_meta_elem_size(type);
    if (w == 0)
        return KVP_EINVAL;
    if (n > SIZE_MAX / w)
        return KVP_ENOMEM;
    kvp_meta_entry e;
    if (entry_start(&e, key, type, n))
        return KVP_ENOMEM;
    e.arr = malloc(n ? (size_t)n * w : 1);
    if (!e.arr) {
        kvp_meta_entry_free(&e);
        return KVP_ENOMEM;
    }
    if (n)
        memcpy(e.arr, data, (size_t)n * w);
    return meta_put(m, &e);
}

int kvp_meta_set_strarr(kvp_meta *m, const char *key, const char *const *s, const size_t *lens, uint64_t n)
{
    if (n >= SIZE_MAX / sizeof(uint64_t))
        return KVP_ENOMEM;
    size_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (lens[i] >= SIZE_MAX - total)
            return KVP_ENOMEM;
        total += lens[i] + 1;
    }
    kvp_meta_entry e;
    if (entry_start(&e, key, KVP_META_ARR_STR, n))
        return KVP_ENOMEM;
    e.off = malloc(((size_t)n + 1) * sizeof *e.off);
    e.chars = malloc(total ? total : 1);
    if (!e.off || !e.chars) {
        kvp_meta_entry_free(&e);
        return KVP_ENOMEM;
    }
    size_t at = 0;
    for (uint64_t i = 0; i < n; i++) {
        e.off[i] = at;
        if (lens[i])
            memcpy(e.chars + at, s[i], lens[i]);
        at += lens[i];
        e.chars[at++] = '\0';
    }
    e.off[n] = at;
    return meta_put(m, &e);
}

const char *kvp_meta_str_at(const kvp_meta_entry *e, uint64_t i, size_t *len)
{
    if (!e || e->type != KVP_META_ARR_STR || i >= e->n)
        return NULL;
    if (len)
        *len = (size_t)(e->off[i + 1] - e->off[i] - 1);
    return e->chars + e->off[i];
}

int kvp_meta_get_u64(const kvp_meta *m, const char *key, uint64_t *out)
{
    const kvp_meta_entry *e = kvp_meta_find(m, key);
    if (!e)
        return KVP_ENOTFOUND;
    switch (e->type) {
    case KVP_META_U64:
    case KVP_META_BOOL: *out = e->v.u; return 0;
    case KVP_META_I64:
        if (e->v.i < 0)
            return KVP_EFORMAT;
        *out = (uint64_t)e->v.i;
        return 0;
    default: return KVP_EFORMAT;
    }
}

int kvp_meta_get_i64(const kvp_meta *m, const char *key, int64_t *out)
{
    const kvp_meta_entry *e = kvp_meta_find(m, key);
    if (!e)
        return KVP_ENOTFOUND;
    switch (e->type) {
    case KVP_META_I64: *out = e->v.i; return 0;
    case KVP_META_U64:
    case KVP_META_BOOL:
        if (e->v.u > (uint64_t)INT64_MAX)
            return KVP_EFORMAT;
        *out = (int64_t)e->v.u;
        return 0;
    default: return KVP_EFORMAT;
    }
}

int kvp_meta_get_f64(const kvp_meta *m, const char *key, double *out)
{
    const kvp_meta_entry *e = kvp_meta_find(m, key);
    if (!e)
        return KVP_ENOTFOUND;
    switch (e->type) {
    case KVP_META_U64: *out = (double)e->v.u; return 0;
    case KVP_META_I64: *out = (double)e->v.i; return 0;
    case KVP_META_F64: *out = e->v.f; return 0;
    default: return KVP_EFORMAT;
    }
}

const char *kvp_meta_get_str(const kvp_meta *m, const char *key)
{
    const kvp_meta_entry *e = kvp_meta_find(m, key);
    return e && e->type == KVP_META_STR ? e->str : NULL;
}

static int key_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

const char *kvp_meta_find_duplicate(const kvp_meta *m)
{
    if (m->n < 2)
        return NULL;
    const char **keys = malloc(m->n * sizeof *keys);
    if (!keys) { /* fall back to the quadratic scan rather than fail */
        for (size_t i = 0; i < m->n; i++)
            for (size_t j = i + 1; j < m->n; j++)
                if (strcmp(m->e[i].key, m->e[j].key) == 0)
                    return m->e[i].key;
        return NULL;
    }
    for (size_t i = 0; i < m->n; i++)
        keys[i] = m->e[i].key;
    qsort(keys, m->n, sizeof *keys, key_cmp);
    const char *dup = NULL;
    for (size_t i = 1; i < m->n && !dup; i++)
        if (strcmp(keys[i - 1], keys[i]) == 0)
            dup = keys[i];
    free(keys);
    return dup;
}

/* ---- encoding ---- */

static void encode_array(const kvp_meta_entry *e, kvp_buf *out)
{
    for (uint64_t j = 0; j < e->n; j++) {
        switch (e->type) {
        case KVP_META_ARR_U8: kvp_buf_u8(out, ((const uint8_t *)e->arr)[j]); break;
        case KVP_META_ARR_I32: kvp_buf_u32(out, (uint32_t)((const int32_t *)e->arr)[j]); break;
        case KVP_META_ARR_F32: kvp_buf_f32(out, ((const float *)e->arr)[j]); break;
        case KVP_META_ARR_I64: kvp_buf_u64(out, (uint64_t)((const int64_t *)e->arr)[j]); break;
        case KVP_META_ARR_F64: kvp_buf_f64(out, ((const double *)e->arr)[j]); break;
        default: break;
        }
    }
}

int kvp_meta_encode(const kvp_meta *m, kvp_buf *out)
{
    if (m->n > UINT32_MAX)
        return KVP_ELIMIT;
    kvp_buf_u32(out, (uint32_t)m->n);
    for (size_t i = 0; i < m->n; i++) {
        const kvp_meta_entry *e = &m->e[i];
        size_t klen = strlen(e->key);
        kvp_buf_str32(out, e->key, klen);
        kvp_buf_u32(out, (uint32_t)e->type);
        kvp_buf_u64(out, e->n);
        switch (e->type) {
        case KVP_META_U64:
        case KVP_META_BOOL: kvp_buf_u64(out, e->v.u); break;
        case KVP_META_I64: kvp_buf_u64(out, (uint64_t)e->v.i); break;
        case KVP_META_F64: kvp_buf_f64(out, e->v.f); break;
        case KVP_META_STR: kvp_buf_put(out, e->str, (size_t)e->n); break;
        case KVP_META_ARR_STR:
            for (uint64_t j = 0; j < e->n; j++) {
                size_t len;
                const char *s = kvp_meta_str_at(e, j, &len);
                if (len > UINT32_MAX)
                    return KVP_ELIMIT;
                kvp_buf_str32(out, s, len);
            }
            break;
        default: encode_array(e, out); break;
        }
    }
    return out->oom ? KVP_ENOMEM : 0;
}

/* ---- decoding (untrusted bytes) ---- */

static int decode_fail(kvp_err *err, int code, const kvp_cur *c, uint32_t i, const char *key, const char *what)
{
    return kvp_err_set(err, code, "metadata entry %u (key \"%.80s\") at offset %zu: %s", i, key ? key : "?",
                       kvp_cur_pos(c), what);
}

static int decode_strarr(kvp_meta_entry *e, kvp_cur *c, kvp_err *err, uint32_t i)
{
    /* Each string needs at least its 4-byte length: bound n before allocating. */
    if (e->n > c->left / 4)
        return decode_fail(err, KVP_ETRUNC, c, i, e->key, "array count exceeds the bytes left");
    kvp_cur scan = *c;
    uint64_t total = 0;
    for (uint64_t j = 0; j < e->n; j++) {
        uint32_t len;
        if (!kvp_cur_str32(&scan, &len, UINT32_MAX))
            return decode_fail(err, KVP_ETRUNC, c, i, e->key, "string element runs past the end");
        total += (uint64_t)len + 1;
    }
    e->off = malloc(((size_t)e->n + 1) * sizeof *e->off);
    e->chars = malloc(total ? (size_t)total : 1);
    if (!e->off || !e->chars)
        return decode_fail(err, KVP_ENOMEM, c, i, e->key, "out of memory");
    uint64_t at = 0;
    for (uint64_t j = 0; j < e->n; j++) {
        uint32_t len;
        const char *s = kvp_cur_str32(c, &len, UINT32_MAX);
        e->off[j] = at;
        if (len)
            memcpy(e->chars + at, s, len);
        at += len;
        e->chars[at++] = '\0';
    }
    e->off[e->n] = at;
    return 0;
}

static int decode_numarr(kvp_meta_entry *e, kvp_cur *c, kvp_err *err, uint32_t i)
{
    size_t w = kvp_meta_elem_size(e->type);
    if (e->n > c->left / w)
        return decode_fail(err, KVP_ETRUNC, c, i, e->key, "array count exceeds the bytes left");
    e->arr = malloc(e->n ? (size_t)e->n * w : 1);
    if (!e->arr)
        return decode_fail(err, KVP_ENOMEM, c, i, e->key, "out of memory");
    for (uint64_t j = 0; j < e->n; j++) {
        switch (e->type) {
        case KVP_META_ARR_U8: ((uint8_t *)e->arr)[j] = kvp_cur_u8(c); break;
        case KVP_META_ARR_I32: ((int32_t *)e->arr)[j] = (int32_t)kvp_cur_u32(c); break;
        case KVP_META_ARR_F32: ((float *)e->arr)[j] = kvp_cur_f32(c); break;
        case KVP_META_ARR_I64: ((int64_t *)e->arr)[j] = (int64_t)kvp_cur_u64(c); break;
        default: ((double *)e->arr)[j] = kvp_cur_f64(c); break;
        }
    }
    return 0;
}

static int decode_value(kvp_meta_entry *e, kvp_cur *c, kvp_err *err, uint32_t i)
{
    switch (e->type) {
    case KVP_META_U64:
    case KVP_META_I64:
    case KVP_META_F64:
    case KVP_META_BOOL:
        if (e->n != 1)
            return decode_fail(err, KVP_EFORMAT, c, i, e->key, "scalar with n != 1");
        e->v.u = kvp_cur_u64(c);
        if (c->bad)
            return decode_fail(err, KVP_ETRUNC, c, i, e->key, "value runs past the end");
        if (e->type == KVP_META_BOOL && e->v.u > 1)
            return decode_fail(err, KVP_EFORMAT, c, i, e->key, "bool is neither 0 nor 1");
        return 0;
    case KVP_META_STR: {
        if (e->n > c->left)
            return decode_fail(err, KVP_ETRUNC, c, i, e->key, "string length exceeds the bytes left");
        const char *s = kvp_cur_take(c, (size_t)e->n);
        e->str = malloc((size_t)e->n + 1);
        if (!e->str)
            return decode_fail(err, KVP_ENOMEM, c, i, e->key, "out of memory");
        if (e->n)
            memcpy(e->str, s, (size_t)e->n);
        e->str[e->n] = '\0';
        return 0;
    }
    case KVP_META_ARR_STR: return decode_strarr(e, c, err, i);
    default: return decode_numarr(e, c, err, i);
    }
}

static int decode_entry(kvp_meta *m, kvp_cur *c, kvp_err *err, uint32_t i)
{
    kvp_meta_entry e;
    memset(&e, 0, sizeof e);
    uint32_t klen = c->left >= 4 ? kvp_le32(c->p) : 0;
    if (klen > KVP_META_MAX_KEY)
        return decode_fail(err, KVP_ELIMIT, c, i, NULL, "key length exceeds the limit");
    const char *k = kvp_cur_str32(c, &klen, KVP_META_MAX_KEY);
    if (!k)
        return decode_fail(err, KVP_ETRUNC, c, i, NULL, "key runs past the end");
    if (klen == 0 || memchr(k, '\0', klen))
        return decode_fail(err, KVP_EFORMAT, c, i, NULL, "key is empty or holds a NUL byte");
    e.key = malloc((size_t)klen + 1);
    if (!e.key)
        return decode_fail(err, KVP_ENOMEM, c, i, NULL, "out of memory");
    memcpy(e.key, k, klen);
    e.key[klen] = '\0';
    uint32_t type = kvp_cur_u32(c);
    e.n = kvp_cur_u64(c);
    int rc;
    if (c->bad)
        rc = decode_fail(err, KVP_ETRUNC, c, i, e.key, "type or count runs past the end");
    else if (!type_known(type))
        rc = decode_fail(err, KVP_EFORMAT, c, i, e.key, "unknown value type");
    else {
        e.type = (kvp_meta_type)type;
        rc = decode_value(&e, c, err, i);
    }
    if (rc) {
        kvp_meta_entry_free(&e);
        return rc;
    }
    if (kvp_meta_push(m, &e))
        return decode_fail(err, KVP_ENOMEM, c, i, NULL, "out of memory");
    return 0;
}

int kvp_meta_decode(kvp_meta *m, const void *p, size_t n, kvp_err *err)
{
    kvp_meta_init(m);
    kvp_cur c = kvp_cur_make(p, n);
    uint32_t count = kvp_cur_u32(&c);
    if (c.bad)
        return kvp_err_set(err, KVP_ETRUNC, "metadata list: entry count truncated (%zu bytes)", n);
    if (count > KVP_META_MAX_ENTRIES)
        return kvp_err_set(err, KVP_ELIMIT, "metadata list: entry count %" PRIu32 " exceeds the limit %u", count,
                           KVP_META_MAX_ENTRIES);
    /* An entry takes at least 4 + 1 + 4 + 8 bytes. */
    if (count > c.left / 17)
        return kvp_err_set(err, KVP_ETRUNC, "metadata list: entry count %" PRIu32 " exceeds the %zu bytes left",
                           count, c.left);
    for (uint32_t i = 0; i < count; i++) {
        int rc = decode_entry(m, &c, err, i);
        if (rc) {
            kvp_meta_free(m);
            return rc;
        }
    }
    const char *dup = kvp_meta_find_duplicate(m);
    if (dup) {
        int rc = kvp_err_set(err, KVP_EFORMAT, "metadata list: key \"%.80s\" appears twice", dup);
        kvp_meta_free(m);
        return rc;
    }
    if (c.left) {
        int rc = kvp_err_set(err, KVP_EFORMAT, "metadata list: %zu bytes of trailing garbage after %u entries",
                             c.left, count);
        kvp_meta_free(m);
        return rc;
    }
    return 0;
}
