/* json.h - a small strict JSON (RFC 8259) parser into a tree, for HF
 * config.json, safetensors headers and their index files, tokenizer.json.
 *
 * Strict: one value, optional surrounding whitespace (a leading UTF-8 BOM is
 * skipped), nothing after it; strings must be valid UTF-8 with no raw control
 * characters, escapes per the RFC, no lone surrogates; numbers per the RFC
 * grammar and finite; duplicate keys in an object are an error; nesting
 * deeper than KVP_JSON_MAX_DEPTH is an error.  Errors read
 * "name:LINE:COL: what" (1-based; the column counts bytes).
 */
#ifndef KVP_JSON_H
#define KVP_JSON_H

#include "error.h"

#include <stddef.h>
#include <stdint.h>

#define KVP_JSON_MAX_DEPTH 128
#define KVP_JSON_MAX_SIZE (1ull << 30) /* bytes of text accepted */

typedef enum kvp_json_type {
    KVP_JSON_NULL = 0,
    KVP_JSON_BOOL = 1,
    KVP_JSON_NUMBER = 2,
    KVP_JSON_STRING = 3,
    KVP_JSON_ARRAY = 4,
    KVP_JSON_OBJECT = 5,
} kvp_json_type;

typedef struct kvp_json kvp_json;
struct kvp_json {
    kvp_json_type type;
    int b;            /* BOOL: 0 or 1 */
    int is_int;       /* NUMBER written without fraction/exponent and fits int64 */
    int64_t i;        /* NUMBER: the integer when is_int */
    double num;       /* NUMBER: the value (always set) */
    char *str;        /* STRING: decoded UTF-8, NUL-terminated (may hold NUL: use len) */
    size_t len;       /* STRING: bytes */
    size_t n;         /* ARRAY / OBJECT: element count */
    kvp_json *items;  /* ARRAY / OBJECT: n values, in document order */
    char **keys;      /* OBJECT: n keys (NUL-terminated), keys[k] names items[k] */
    size_t *key_lens; /* OBJECT: their lengths */
    size_t *sorted;   /* OBJECT: indices ordered by key, for lookups (NULL when n < 2) */
    size_t pos;       /* byte offset of the value in the text (kvp_json_linecol) */
};

/* Parse len bytes of text.  *out gets the root (free with kvp_json_free).
 * name is used in messages.  0 or a negative code (KVP_EFORMAT for bad
 * syntax, KVP_ELIMIT for depth/size, KVP_ENOMEM). */
int kvp_json_parse(kvp_json **out, const char *text, size_t len, const char *name, kvp_err *err);
/* The same for line `line` of a JSON Lines file at path: messages say
 * "path:LINE:COL: what", the file's line and the column in it. */
int kvp_json_parse_line(kvp_json **out, const char *text, size_t len, const char *path, uint64_t line, kvp_err *err);
/* The same, the line checked as strictly (the same codes and messages),
 * but the tree keeps the value of the root object's member key alone: the
 * other members' values are checked, not copied, and left null (their keys
 * stay, so a duplicate is still an error).  For a JSON Lines file read for
 * one field of each line (decode --resume reads its results for their
 * ids): a line of long strings costs no copy of them. */
int kvp_json_parse_line_member(kvp_json **out, const char *text, size_t len, const char *path, uint64_t line,
                               const char *key, kvp_err *err);
/* Read path ("-" for stdin, at most max bytes) and parse it. */
int kvp_json_parse_file(kvp_json **out, const char *path, uint64_t max, kvp_err *err);
void kvp_json_free(kvp_json *v);

/* 1-based line and column of byte offset pos in text. */
void kvp_json_linecol(const char *text, size_t len, size_t pos, int *line, int *col);
/* s[0..len) as a quoted JSON string into out (cap bytes, at least 16),
 * for messages: quotes, backslashes and control bytes escaped so the
 * message stays one line and sends no terminal sequence; cut with "..."
 * where out is full, never inside a UTF-8 character. */
void kvp_json_show(char *out, size_t cap, const char *s, size_t len);
/* "null", "bool", "number", "string", "array", "object". */
const char *kvp_json_type_name(kvp_json_type t);

/* ---- lookups (NULL-safe: a NULL or mistyped v gives NULL / KVP_ENOTFOUND) ---- */

/* Member key of an object (O(log n)), or NULL. */
const kvp_json *kvp_json_get(const kvp_json *obj, const char *key);
/* Element i of an array, or NULL. */
const kvp_json *kvp_json_at(const kvp_json *arr, size_t i);
/* Typed member getters: 0, KVP_ENOTFOUND (absent or obj not an object), or
 * KVP_EFORMAT (wrong type; for integers also non-integral, negative for u64,
 * or out of range).  No message is set: the caller names the key. */
int kvp_json_get_u64(const kvp_json *obj, const char *key, uint64_t *out);
int kvp_json_get_i64(const kvp_json *obj, const char *key, int64_t *out);
int kvp_json_get_f64(const kvp_json *obj, const char *key, double *out);
int kvp_json_get_bool(const kvp_json *obj, const char *key, int *out);
/* The member's string, or NULL when absent or not a string. */
const char *kvp_json_get_str(const kvp_json *obj, const char *key);
/* Value conversions with the same codes. */
int kvp_json_to_u64(const kvp_json *v, uint64_t *out);
int kvp_json_to_i64(const kvp_json *v, int64_t *out);

#endif
