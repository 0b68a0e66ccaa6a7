/* meta.h - typed key/value lists: model configs and tokenizer data.
 *
 * The same shape as GGUF metadata (so a GGUF header converts losslessly) and
 * the payload of KVP CONFIG and TOKENIZER records (kvp(5) gives the bytes).
 * Keys are unique; setting a key again replaces its value.
 */
#ifndef KVP_META_H
#define KVP_META_H

#include "error.h"
#include "wire.h"

#include <stddef.h>
#include <stdint.h>

typedef enum kvp_meta_type {
    KVP_META_U64 = 1,
    KVP_META_I64 = 2,
    KVP_META_F64 = 3,
    KVP_META_BOOL = 4,
    KVP_META_STR = 5,
    KVP_META_ARR_U8 = 16,
    KVP_META_ARR_I32 = 17,
    KVP_META_ARR_F32 = 18,
    KVP_META_ARR_STR = 19,
    KVP_META_ARR_I64 = 20,
    KVP_META_ARR_F64 = 21,
} kvp_meta_type;

typedef struct kvp_meta_entry {
    char *key;
    kvp_meta_type type;
    uint64_t n;        /* elements for arrays; string length for STR; 1 otherwise */
    union {
        uint64_t u;    /* U64, BOOL */
        int64_t i;     /* I64 */
        double f;      /* F64 */
    } v;
    char *str;         /* STR: NUL-terminated (may hold NULs; n is the length) */
    void *arr;         /* numeric arrays: n elements, host order */
    uint64_t *off;     /* ARR_STR: n+1 offsets into chars; string i is chars+off[i], */
    char *chars;       /*   length off[i+1]-off[i]-1, NUL-terminated */
} kvp_meta_entry;

typedef struct kvp_meta {
    kvp_meta_entry *e;
    size_t n, cap;
} kvp_meta;

/* Limits enforced when decoding untrusted input. */
#define KVP_META_MAX_ENTRIES 65536u
#define KVP_META_MAX_KEY 256u

void kvp_meta_init(kvp_meta *m);
void kvp_meta_free(kvp_meta *m);

/* Setters copy their arguments; 0 or KVP_ENOMEM. */
int kvp_meta_set_u64(kvp_meta *m, const char *key, uint64_t v);
int kvp_meta_set_i64(kvp_meta *m, const char *key, int64_t v);
int kvp_meta_set_f64(kvp_meta *m, const char *key, double v);
int kvp_meta_set_bool(kvp_meta *m, const char *key, int v);
int kvp_meta_set_str(kvp_meta *m, const char *key, const char *s, size_t len);
/* Numeric arrays: elem_type is one of the KVP_META_ARR_* numeric types. */
int kvp_meta_set_arr(kvp_meta *m, const char *key, kvp_meta_type type, const void *data, uint64_t n);
/* String array from n pointers and lengths. */
int kvp_meta_set_strarr(kvp_meta *m, const char *key, const char *const *s, const size_t *lens, uint64_t n);

const kvp_meta_entry *kvp_meta_find(const kvp_meta *m, const char *key);
/* Typed getters: 0, KVP_ENOTFOUND, or KVP_EFORMAT when the type does not
 * convert (get_u64 accepts U64, BOOL and non-negative I64; get_f64 any
 * number).  They set no message; callers name the key in theirs. */
int kvp_meta_get_u64(const kvp_meta *m, const char *key, uint64_t *out);
int kvp_meta_get_f64(const kvp_meta *m, const char *key, double *out);
const char *kvp_meta_get_str(const kvp_meta *m, const char *key);
/* Name of a type ("u64", "arr[str]"). */
const char *kvp_meta_type_name(kvp_meta_type t);

/* Serialize (kvp(5) "metadata list") and parse back.  Decoding checks every
 * count against the bytes that remain before allocating. */
int kvp_meta_encode(const kvp_meta *m, kvp_buf *out);
int kvp_meta_decode(kvp_meta *m, const void *p, size_t n, kvp_err *err);

/* ---- additions for bulk loaders (GGUF, decode) ---- */

/* Notes on kvp_meta_decode: it initializes m itself (m's previous content, if
 * any, is not freed) and leaves m empty on failure.  Strict: a duplicate key,
 * an unknown type, a scalar with n != 1, a bool other than 0/1, or bytes left
 * over after the last entry are errors (messages name the entry and key). */

/* Append e, taking ownership of its allocations (key, str, arr, off, chars),
 * without checking that the key is new: loaders of many entries call
 * kvp_meta_find_duplicate once afterwards instead (O(n log n)).  On failure
 * (KVP_ENOMEM) e's allocations are freed. */
int kvp_meta_push(kvp_meta *m, kvp_meta_entry *e);
/* The first key (in sorted order) present twice, or NULL. */
const char *kvp_meta_find_duplicate(const kvp_meta *m);
/* String i of an ARR_STR entry and its length; NULL when out of range or e
 * is not ARR_STR. */
const char *kvp_meta_str_at(const kvp_meta_entry *e, uint64_t i, size_t *len);
/* Free the allocations of one entry (for loaders that fail mid-way). */
void kvp_meta_entry_free(kvp_meta_entry *e);
/* Signed getter: I64, U64 up to INT64_MAX, BOOL; codes as kvp_meta_get_u64. */
int kvp_meta_get_i64(const kvp_meta *m, const char *key, int64_t *out);
/* Bytes per element of a numeric array type (1, 4 or 8), 0 otherwise. */
size_t kvp_meta_elem_size(kvp_meta_type t);

#endif
