/* json.c - strict RFC 8259 parser (see json.h).  Recursive descent, the
 * depth bounded by KVP_JSON_MAX_DEPTH; containers collect their children in
 * arrays grown by doubling. */
#include "json.h"

#include "io.h"
#include "unicode.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct jp {
    const unsigned char *s;
    size_t n, i;
    int depth;
    const char *name;
    kvp_err *err;
    uint64_t line0;   /* > 0: the text is line line0 of the file name names (kvp_json_parse_line) */
    const char *key;  /* the object key whose value is being parsed: messages name the field */
    size_t key_len;
    const char *only; /* kvp_json_parse_line_member: the root member whose value is kept (NULL: all) */
    int skim;         /* > 0 inside a value that is checked and dropped: its strings are not copied */
} jp;

void kvp_json_linecol(const char *text, size_t len, size_t pos, int *line, int *col)
{
    int l = 1, c = 1;
    for (size_t k = 0; k < pos && k < len; k++) {
        if (text[k] == '\n') {
            l++;
            c = 1;
        } else {
            c++;
        }
    }
    *line = l;
    *col = c;
}

void kvp_json_show(char *out, size_t cap, const char *s, size_t len)
{
    size_t o = 0, i = 0;
    out[o++] = '"';
    while (i < len) {
        unsigned char c = (unsigned char)s[i];
        /* a character's bytes go whole or not at all */
        size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        n = i + n <= len ? n : 1;
        int esc = c == '"' || c == '\\' || c < 0x20 || c == 0x7f;
        if (o + (esc ? 6 : n) + 5 > cap) /* then "...", the quote and the NUL */
            break;
        if (c == '"' || c == '\\')
            o += (size_t)snprintf(out + o, cap - o, "\\%c", c);
        else if (esc)
            o += (size_t)snprintf(out + o, cap - o, "\\u%04x", c);
        else
            memcpy(out + o, s + i, n), o += n;
        i += esc ? 1 : n;
    }
    snprintf(out + o, cap - o, "%s\"", i < len ? "..." : "");
}

static int jp_fail(jp *p, int code, size_t at, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
static int jp_fail(jp *p, int code, size_t at, const char *fmt, ...)
{
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    int line, col;
    kvp_json_linecol((const char *)p->s, p->n, at, &line, &col);
    char field[80] = "", shown[72];
    if (p->key) { /* "temperature": number out of range */
        kvp_json_show(shown, sizeof shown, p->key, p->key_len);
        snprintf(field, sizeof field, "%s: ", shown);
    }
    if (p->line0)
        return kvp_err_set(p->err, code, "%s:%llu:%d: %s%s", p->name,
                           (unsigned long long)(p->line0 + (uint64_t)line - 1), col, field, what);
    return kvp_err_set(p->err, code, "%s:%d:%d: %s%s", p->name, line, col, field, what);
}

const char *kvp_json_type_name(kvp_json_type t)
{
    switch (t) {
    case KVP_JSON_NULL: return "null";
    case KVP_JSON_BOOL: return "bool";
    case KVP_JSON_NUMBER: return "number";
    case KVP_JSON_STRING: return "string";
    case KVP_JSON_ARRAY: return "array";
    case KVP_JSON_OBJECT: return "object";
    }
    return "?";
}

static void json_clear(kvp_json *v)
{
    free(v->str);
    for (size_t k = 0; k < v->n; k++) {
        if (v->items)
            json_clear(&v->items[k]);
        if (v->keys)
            free(v->keys[k]);
    }
    free(v->items);
    free(v->keys);
    free(v->key_lens);
    free(v->sorted);
    memset(v, 0, sizeof *v);
}

void kvp_json_free(kvp_json *v)
{
    if (!v)
        return;
    json_clear(v);
    free(v);
}

static void skip_ws(jp *p)
{
    while (p->i < p->n) {
        unsigned char c = p->s[p->i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        p->i++;
    }
}

/* ---- strings ---- */

static int hex4(jp *p, size_t at, uint32_t *out)
{
    if (p->n - at < 4)
        return jp_fail(p, KVP_EFORMAT, at, "\\u escape needs 4 hex digits");
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        unsigned char c = p->s[at + (size_t)k];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return jp_fail(p, KVP_EFORMAT, at + (size_t)k, "\\u escape needs 4 hex digits");
        v = v << 4 | (uint32_t)d;
    }
    *out = v;
    return 0;
}

/* One escape after the backslash at p->i - 1; appends to o. */
static int parse_escape(jp *p, char *o, size_t *olen)
{
    size_t at = p->i - 1;
    if (p->i >= p->n)
        return jp_fail(p, KVP_EFORMAT, at, "unterminated string");
    unsigned char c = p->s[p->i++];
    const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
    const char *k = c ? strchr(from, c) : NULL;
    if (k) {
        o[(*olen)++] = to[k - from];
        return 0;
    }
    if (c != 'u')
        return c >= 0x20 && c < 0x7f ? jp_fail(p, KVP_EFORMAT, at, "invalid escape \\%c", c)
                                     : jp_fail(p, KVP_EFORMAT, at, "invalid escape: a backslash before byte 0x%02x", c);
    uint32_t cp;
    int rc = hex4(p, p->i, &cp);
    if (rc)
        return rc;
    p->i += 4;
    if (cp >= 0xdc00 && cp <= 0xdfff)
        return jp_fail(p, KVP_EFORMAT, at, "lone low surrogate \\u%04X", (unsigned)cp);
    if (cp >= 0xd800 && cp <= 0xdbff) {
        uint32_t lo;
        if (p->n - p->i < 2 || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u')
            return jp_fail(p, KVP_EFORMAT, at, "lone high surrogate \\u%04X", (unsigned)cp);
        if ((rc = hex4(p, p->i + 2, &lo)))
            return rc;
        if (lo < 0xdc00 || lo > 0xdfff)
            return jp_fail(p, KVP_EFORMAT, at, "high surrogate \\u%04X not followed by a low one", (unsigned)cp);
        p->i += 6;
        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
    }
    *olen += kvp_unicode_encode(cp, o + *olen); /* cp is valid: surrogates were paired above */
    return 0;
}

/* How many of s[0..n) from the start are ASCII that a string holds as it
 * is (no control byte, quote or backslash): eight at a time, since a
 * result line is mostly such text. */
static size_t plain_ascii(const unsigned char *s, size_t n)
{
    const uint64_t ones = 0x0101010101010101u, highs = 0x8080808080808080u;
    size_t k = 0;
    for (; k + 8 <= n; k += 8) {
        uint64_t w, q, b;
        memcpy(&w, s + k, 8);
        q = w ^ (ones * '"');
        b = w ^ (ones * '\\');
        /* a byte with its high bit set, below 0x20, or zero after the xor */
        if ((w | ((w - ones * 0x20) & ~w) | ((q - ones) & ~q) | ((b - ones) & ~b)) & highs)
            break;
    }
    while (k < n && s[k] >= 0x20 && s[k] < 0x80 && s[k] != '"' && s[k] != '\\')
        k++;
    return k;
}

/* A string starting at the quote p->s[p->i]. The decoded text is never
 * longer than the source, so one allocation of the source span suffices.
 * Skimming (p->skim) checks it alike and copies nothing: *out NULL. */
static int parse_string(jp *p, char **out, size_t *outlen)
{
    size_t start = p->i++;
    size_t end = p->i;
    while (end < p->n) { /* find the closing quote, skipping escapes */
        end += plain_ascii(p->s + end, p->n - end);
        if (end >= p->n || p->s[end] == '"')
            break;
        end += p->s[end] == '\\' ? 2 : 1; /* an escape's byte is no quote (and may be past the end) */
    }
    if (end >= p->n)
        return jp_fail(p, KVP_EFORMAT, start, "unterminated string");
    char scratch[8]; /* skimming: one character at a time, dropped */
    char *o = p->skim ? scratch : malloc(end - start);
    if (!o)
        return jp_fail(p, KVP_ENOMEM, start, "out of memory for a string of %zu bytes", end - start);
    size_t olen = 0;
    while (p->i < end) {
        unsigned char c = p->s[p->i];
        int rc = 0;
        if (p->skim)
            olen = 0;
        size_t run = plain_ascii(p->s + p->i, end - p->i); /* valid as it is */
        if (run) {
            if (!p->skim)
                memcpy(o + olen, p->s + p->i, run), olen += run;
            p->i += run;
        } else if (c == '\\') {
            p->i++;
            rc = parse_escape(p, o, &olen);
        } else if (c < 0x20) {
            rc = jp_fail(p, KVP_EFORMAT, p->i, "raw control character 0x%02x in a string", c);
        } else {
            uint32_t cp; /* by the rules plain-text prompts are checked by too */
            size_t k = kvp_unicode_decode((const char *)p->s + p->i, end - p->i, &cp);
            if (cp == KVP_UNICODE_BAD) {
                rc = jp_fail(p, KVP_EFORMAT, p->i, "invalid UTF-8 in a string");
            } else {
                memcpy(o + olen, p->s + p->i, k);
                olen += k;
                p->i += k;
            }
        }
        if (rc) {
            if (!p->skim)
                free(o);
            return rc;
        }
    }
    p->i = end + 1;
    if (p->skim) {
        *out = NULL;
        *outlen = 0;
        return 0;
    }
    o[olen] = '\0';
    *out = o;
    *outlen = olen;
    return 0;
}

/* ---- numbers ---- */

static size_t digits(const jp *p, size_t i)
{
    while (i < p->n && p->s[i] >= '0' && p->s[i] <= '9')
        i++;
    return i;
}

static int parse_number(jp *p, kvp_json *v)
{
    size_t start = p->i, i = p->i;
    if (i < p->n && p->s[i] == '-')
        i++;
    if (i >= p->n || p->s[i] < '0' || p->s[i] > '9')
        return jp_fail(p, KVP_EFORMAT, start, "invalid number");
    size_t d0 = i;
    i = digits(p, i);
    if (p->s[d0] == '0' && i - d0 > 1)
        return jp_fail(p, KVP_EFORMAT, start, "number with a leading zero");
    int integral = 1;
    if (i < p->n && p->s[i] == '.') {
        size_t f = digits(p, i + 1);
        if (f == i + 1)
            return jp_fail(p, KVP_EFORMAT, i, "number needs digits after '.'");
        i = f;
        integral = 0;
    }
    if (i < p->n && (p->s[i] == 'e' || p->s[i] == 'E')) {
        size_t e = i + 1;
        if (e < p->n && (p->s[e] == '+' || p->s[e] == '-'))
            e++;
        size_t f = digits(p, e);
        if (f == e)
            return jp_fail(p, KVP_EFORMAT, i, "number needs digits in its exponent");
        i = f;
        integral = 0;
    }
    char buf[64], *heap = NULL, *text = buf;
    size_t len = i - start;
    if (len >= sizeof buf) {
        if (!(heap = malloc(len + 1)))
            return jp_fail(p, KVP_ENOMEM, start, "out of memory");
        text = heap;
    }
    memcpy(text, p->s + start, len);
    text[len] = '\0';
    v->type = KVP_JSON_NUMBER;
    v->num = strtod(text, NULL);
    if (integral) {
        errno = 0;
        long long ll = strtoll(text, NULL, 10);
        if (errno == 0) {
            v->is_int = 1;
            v->i = ll;
        }
    }
    free(heap);
    if (!isfinite(v->num))
        return jp_fail(p, KVP_EFORMAT, start, "number out of range");
    p->i = i;
    return 0;
}

/* ---- values and containers ---- */

static int parse_value(jp *p, kvp_json *v);

static int grow(void **arr, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap * 2 : 8;
    if (c > SIZE_MAX / size)
        return KVP_ENOMEM;
    void *a = realloc(*arr, c * size);
    if (!a)
        return KVP_ENOMEM;
    *arr = a;
    *cap = c;
    return 0;
}

static int parse_array(jp *p, kvp_json *v)
{
    size_t start = p->i++, cap = 0;
    v->type = KVP_JSON_ARRAY;
    skip_ws(p);
    if (p->i < p->n && p->s[p->i] == ']') {
        p->i++;
        return 0;
    }
    for (;;) {
        if (grow((void **)&v->items, &cap, v->n + 1, sizeof *v->items))
            return jp_fail(p, KVP_ENOMEM, start, "out of memory for an array");
        kvp_json *child = &v->items[v->n];
        memset(child, 0, sizeof *child);
        skip_ws(p);
        int rc = parse_value(p, child);
        v->n++; /* counted even on failure so json_clear frees it */
        if (rc)
            return rc;
        skip_ws(p);
        if (p->i >= p->n)
            return jp_fail(p, KVP_EFORMAT, start, "unterminated array");
        unsigned char c = p->s[p->i++];
        if (c == ']')
            return 0;
        if (c != ',')
            return jp_fail(p, KVP_EFORMAT, p->i - 1, "expected ',' or ']' in an array");
    }
}

typedef struct key_ref {
    const char *key;
    size_t len, idx;
} key_ref;

static int key_ref_cmp(const void *a, const void *b)
{
    const key_ref *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->key, y->key, n);
    if (c)
        return c;
    return x->len < y->len ? -1 : x->len > y->len;
}

/* Sort member indices by key; refuse duplicates. */
static int index_object(jp *p, kvp_json *v, size_t start)
{
    if (v->n < 2)
        return 0;
    key_ref *r = malloc(v->n * sizeof *r);
    v->sorted = malloc(v->n * sizeof *v->sorted);
    if (!r || !v->sorted) {
        free(r);
        return jp_fail(p, KVP_ENOMEM, start, "out of memory for an object");
    }
    for (size_t k = 0; k < v->n; k++)
        r[k] = (key_ref){v->keys[k], v->key_lens[k], k};
    qsort(r, v->n, sizeof *r, key_ref_cmp);
    int rc = 0;
    for (size_t k = 0; k < v->n; k++) {
        v->sorted[k] = r[k].idx;
        if (!rc && k && key_ref_cmp(&r[k - 1], &r[k]) == 0) {
            char shown[96];
            kvp_json_show(shown, sizeof shown, r[k].key, r[k].len);
            rc = jp_fail(p, KVP_EFORMAT, v->items[r[k].idx > r[k - 1].idx ? r[k].idx : r[k - 1].idx].pos,
                         "duplicate key %s", shown);
        }
    }
    free(r);
    return rc;
}

static int parse_object(jp *p, kvp_json *v)
{
    size_t start = p->i++, cap = 0, kcap = 0, lcap = 0;
    v->type = KVP_JSON_OBJECT;
    skip_ws(p);
    if (p->i < p->n && p->s[p->i] == '}') {
        p->i++;
        return 0;
    }
    for (;;) {
        skip_ws(p);
        if (p->i >= p->n)
            return jp_fail(p, KVP_EFORMAT, start, "unterminated object");
        if (p->s[p->i] != '"')
            return jp_fail(p, KVP_EFORMAT, p->i, "expected a string key in an object");
        if (grow((void **)&v->items, &cap, v->n + 1, sizeof *v->items) ||
            grow((void **)&v->keys, &kcap, v->n + 1, sizeof *v->keys) ||
            grow((void **)&v->key_lens, &lcap, v->n + 1, sizeof *v->key_lens))
            return jp_fail(p, KVP_ENOMEM, start, "out of memory for an object");
        kvp_json *child = &v->items[v->n];
        memset(child, 0, sizeof *child);
        v->keys[v->n] = NULL;
        int skim = p->skim;
        p->skim = 0; /* keys are kept even in a value skimmed: a duplicate is an error there too */
        int rc = parse_string(p, &v->keys[v->n], &v->key_lens[v->n]);
        p->skim = skim;
        if (rc)
            return rc;
        skip_ws(p);
        if (p->i >= p->n || p->s[p->i] != ':') {
            v->n++;
            return jp_fail(p, KVP_EFORMAT, p->i, "expected ':' after an object key");
        }
        p->i++;
        skip_ws(p);
        p->key = v->keys[v->n], p->key_len = v->key_lens[v->n];
        /* kvp_json_parse_line_member: a root member but the one asked for
         * is checked, then dropped (null, where it was: its key stays) */
        int drop = p->only && p->depth == 1 &&
                   (strlen(p->only) != p->key_len || memcmp(p->only, p->key, p->key_len) != 0);
        p->skim += drop;
        rc = parse_value(p, child);
        p->skim -= drop;
        if (drop) {
            size_t pos = child->pos; /* a duplicate key's message points at it */
            json_clear(child);
            child->pos = pos;
        }
        v->n++;
        if (rc)
            return rc;
        p->key = NULL; /* a fault after the value is no longer the field's */
        skip_ws(p);
        if (p->i >= p->n)
            return jp_fail(p, KVP_EFORMAT, start, "unterminated object");
        unsigned char c = p->s[p->i++];
        if (c == '}')
            return index_object(p, v, start);
        if (c != ',')
            return jp_fail(p, KVP_EFORMAT, p->i - 1, "expected ',' or '}' in an object");
    }
}

static int literal(jp *p, const char *word)
{
    size_t n = strlen(word);
    if (p->n - p->i < n || memcmp(p->s + p->i, word, n) != 0)
        return jp_fail(p, KVP_EFORMAT, p->i, "invalid literal (expected %s)", word);
    p->i += n;
    return 0;
}

static int parse_value(jp *p, kvp_json *v)
{
    v->pos = p->i;
    if (p->i >= p->n)
        return jp_fail(p, KVP_EFORMAT, p->i, "unexpected end of input, expected a value");
    unsigned char c = p->s[p->i];
    int rc;
    switch (c) {
    case '{':
    case '[':
        if (++p->depth > KVP_JSON_MAX_DEPTH)
            return jp_fail(p, KVP_ELIMIT, p->i, "nesting deeper than %d", KVP_JSON_MAX_DEPTH);
        rc = c == '{' ? parse_object(p, v) : parse_array(p, v);
        p->depth--;
        return rc;
    case '"':
        v->type = KVP_JSON_STRING;
        return parse_string(p, &v->str, &v->len);
    case 't':
        v->type = KVP_JSON_BOOL;
        v->b = 1;
        return literal(p, "true");
    case 'f':
        v->type = KVP_JSON_BOOL;
        return literal(p, "false");
    case 'n':
        v->type = KVP_JSON_NULL;
        return literal(p, "null");
    default:
        if (c == '-' || (c >= '0' && c <= '9'))
            return parse_number(p, v);
        if (c >= 0x20 && c < 0x7f)
            return jp_fail(p, KVP_EFORMAT, p->i, "unexpected character '%c', expected a value", c);
        return jp_fail(p, KVP_EFORMAT, p->i, "unexpected byte 0x%02x, expected a value", c); /* binary, a NUL */
    }
}

static int parse_text(kvp_json **out, const char *text, size_t len, const char *name, uint64_t line0,
                      const char *only, kvp_err *err)
{
    *out = NULL;
    jp p = {(const unsigned char *)text, len, 0, 0, name ? name : "<json>", err, line0, NULL, 0, only, 0};
    if (len > KVP_JSON_MAX_SIZE)
        return kvp_err_set(err, KVP_ELIMIT, "%s: %zu bytes of JSON exceed the limit %llu", p.name, len,
                           (unsigned long long)KVP_JSON_MAX_SIZE);
    if (len >= 3 && memcmp(text, "\xef\xbb\xbf", 3) == 0)
        p.i = 3;
    kvp_json *root = calloc(1, sizeof *root);
    if (!root)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", p.name);
    skip_ws(&p);
    int rc = parse_value(&p, root);
    if (!rc) {
        skip_ws(&p);
        if (p.i < p.n)
            rc = jp_fail(&p, KVP_EFORMAT, p.i, "trailing characters after the JSON value");
    }
    if (rc) {
        kvp_json_free(root);
        return rc;
    }
    *out = root;
    return 0;
}

int kvp_json_parse(kvp_json **out, const char *text, size_t len, const char *name, kvp_err *err)
{
    return parse_text(out, text, len, name, 0, NULL, err);
}

int kvp_json_parse_line(kvp_json **out, const char *text, size_t len, const char *path, uint64_t line, kvp_err *err)
{
    return parse_text(out, text, len, path, line ? line : 1, NULL, err);
}

int kvp_json_parse_line_member(kvp_json **out, const char *text, size_t len, const char *path, uint64_t line,
                               const char *key, kvp_err *err)
{
    return parse_text(out, text, len, path, line ? line : 1, key, err);
}

int kvp_json_parse_file(kvp_json **out, const char *path, uint64_t max, kvp_err *err)
{
    uint8_t *data;
    size_t len;
    *out = NULL;
    if (max > KVP_JSON_MAX_SIZE)
        max = KVP_JSON_MAX_SIZE;
    int rc = kvp_read_file(path, max, &data, &len, err);
    if (rc)
        return rc;
    rc = kvp_json_parse(out, (const char *)data, len, path, err);
    free(data);
    return rc;
}

/* ---- lookups ---- */

const kvp_json *kvp_json_get(const kvp_json *obj, const char *key)
{
    if (!obj || obj->type != KVP_JSON_OBJECT || !key)
        return NULL;
    key_ref want = {key, strlen(key), 0};
    if (!obj->sorted) {
        for (size_t k = 0; k < obj->n; k++)
            if (key_ref_cmp(&want, &(key_ref){obj->keys[k], obj->key_lens[k], k}) == 0)
                return &obj->items[k];
        return NULL;
    }
    size_t lo = 0, hi = obj->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2, k = obj->sorted[mid];
        int c = key_ref_cmp(&want, &(key_ref){obj->keys[k], obj->key_lens[k], k});
        if (c == 0)
            return &obj->items[k];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

const kvp_json *kvp_json_at(const kvp_json *arr, size_t i)
{
    return arr && arr->type == KVP_JSON_ARRAY && i < arr->n ? &arr->items[i] : NULL;
}

int kvp_json_to_i64(const kvp_json *v, int64_t *out)
{
    if (!v)
        return KVP_ENOTFOUND;
    if (v->type != KVP_JSON_NUMBER)
        return KVP_EFORMAT;
    if (v->is_int) {
        *out = v->i;
        return 0;
    }
    /* 1e3 or 4096.0 are integers too when exact and in range. */
    if (v->num != floor(v->num) || v->num < -9.2e18 || v->num > 9.2e18)
        return KVP_EFORMAT;
    *out = (int64_t)v->num;
    return 0;
}

int kvp_json_to_u64(const kvp_json *v, uint64_t *out)
{
    int64_t i;
    int rc = kvp_json_to_i64(v, &i);
    if (rc)
        return rc;
    if (i < 0)
        return KVP_EFORMAT;
    *out = (uint64_t)i;
    return 0;
}

int kvp_json_get_u64(const kvp_json *obj, const char *key, uint64_t *out)
{
    return kvp_json_to_u64(kvp_json_get(obj, key), out);
}

int kvp_json_get_i64(const kvp_json *obj, const char *key, int64_t *out)
{
    return kvp_json_to_i64(kvp_json_get(obj, key), out);
}

int kvp_json_get_f64(const kvp_json *obj, const char *key, double *out)
{
    const kvp_json *v = kvp_json_get(obj, key);
    if (!v)
        return KVP_ENOTFOUND;
    if (v->type != KVP_JSON_NUMBER)
        return KVP_EFORMAT;
    *out = v->num;
    return 0;
}

int kvp_json_get_bool(const kvp_json *obj, const char *key, int *out)
{
    const kvp_json *v = kvp_json_get(obj, key);
    if (!v)
        return KVP_ENOTFOUND;
    if (v->type != KVP_JSON_BOOL)
        return KVP_EFORMAT;
    *out = v->b;
    return 0;
}

const char *kvp_json_get_str(const kvp_json *obj, const char *key)
{
    const kvp_json *v = kvp_json_get(obj, key);
    return v && v->type == KVP_JSON_STRING ? v->str : NULL;
}
