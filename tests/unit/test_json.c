/* test_json.c - the strict JSON parser: values, escapes, UTF-8, limits,
 * error positions, lookups, and hostile inputs (truncation at every offset,
 * bit flips) that must fail with a message and never crash; a line parsed
 * for one member checked as strictly as a whole one. */
#include "json.h"
#include "unit.h"

#include <stdlib.h>

static int parse(const char *s, kvp_json **out, kvp_err *err)
{
    err->msg[0] = '\0';
    return kvp_json_parse(out, s, strlen(s), "t.json", err);
}

/* Expect failure with code and a substring of the message. */
static void bad(const char *s, int code, const char *want)
{
    kvp_json *j = NULL;
    kvp_err err;
    int rc = parse(s, &j, &err);
    CHECK_MSG(rc == code && j == NULL, "\"%s\": rc %d (want %d) %s", s, rc, code, err.msg);
    CHECK_MSG(strstr(err.msg, want) != NULL, "\"%s\": message \"%s\" lacks \"%s\"", s, err.msg, want);
    kvp_json_free(j);
}

static void good(const char *s)
{
    kvp_json *j = NULL;
    kvp_err err;
    int rc = parse(s, &j, &err);
    CHECK_MSG(rc == 0, "\"%s\": %s", s, err.msg);
    kvp_json_free(j);
}

static void test_values(void)
{
    const char *doc = "{\n"
                      "  \"a\": 1, \"b\": -2.5e3, \"c\": \"x\\n\\u00e9\\ud83d\\ude00\\/\",\n"
                      "  \"d\": [true, false, null, [], {}], \"e\": {\"k\": 18446744073709551615},\n"
                      "  \"big\": 9223372036854775807, \"neg\": -9223372036854775808, \"f\": 4096.0,\n"
                      "  \"nul\": \"a\\u0000b\", \"utf\": \"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"\n"
                      "}";
    kvp_json *j;
    kvp_err err;
    CHECK(parse(doc, &j, &err) == 0);
    if (!j)
        return;
    CHECK(j->type == KVP_JSON_OBJECT && j->n == 10);
    uint64_t u = 0;
    int64_t i = 0;
    double f = 0;
    CHECK(kvp_json_get_u64(j, "a", &u) == 0 && u == 1);
    CHECK(kvp_json_get_f64(j, "b", &f) == 0 && f == -2500.0);
    CHECK(kvp_json_get_i64(j, "b", &i) == 0 && i == -2500); /* exact integral value */
    CHECK(kvp_json_get_u64(j, "b", &u) == KVP_EFORMAT);
    CHECK(kvp_json_get_u64(j, "f", &u) == 0 && u == 4096);
    CHECK(kvp_json_get_i64(j, "big", &i) == 0 && i == INT64_MAX);
    CHECK(kvp_json_get_i64(j, "neg", &i) == 0 && i == INT64_MIN);
    CHECK_STR(kvp_json_get_str(j, "c"), "x\n\xc3\xa9\xf0\x9f\x98\x80/");
    const kvp_json *v = kvp_json_get(j, "nul");
    CHECK(v && v->len == 3 && memcmp(v->str, "a\0b", 3) == 0);
    CHECK_STR(kvp_json_get_str(j, "utf"), "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
    const kvp_json *d = kvp_json_get(j, "d");
    CHECK(d && d->type == KVP_JSON_ARRAY && d->n == 5);
    CHECK(kvp_json_at(d, 0)->b == 1 && kvp_json_at(d, 1)->type == KVP_JSON_BOOL && kvp_json_at(d, 1)->b == 0);
    CHECK(kvp_json_at(d, 2)->type == KVP_JSON_NULL);
    CHECK(kvp_json_at(d, 3)->type == KVP_JSON_ARRAY && kvp_json_at(d, 3)->n == 0);
    CHECK(kvp_json_at(d, 4)->type == KVP_JSON_OBJECT && kvp_json_at(d, 4)->n == 0);
    CHECK(kvp_json_at(d, 5) == NULL);
    /* 2^64-1 does not fit int64: a number, but not an integer we hand out. */
    const kvp_json *e = kvp_json_get(j, "e");
    CHECK(kvp_json_get_u64(e, "k", &u) == KVP_EFORMAT);
    CHECK(kvp_json_get(j, "zz") == NULL && kvp_json_get_str(j, "a") == NULL);
    CHECK(kvp_json_get_u64(j, "zz", &u) == KVP_ENOTFOUND);
    CHECK(kvp_json_get(NULL, "a") == NULL && kvp_json_get(d, "a") == NULL);
    int line, col;
    kvp_json_linecol(doc, strlen(doc), kvp_json_get(j, "d")->pos, &line, &col);
    CHECK(line == 3 && col == 8);
    kvp_json_free(j);

    good("0");
    good(" \t\r\n\"s\" \n");
    good("-0.0e+0");
    good("1E-2");
    good("\xef\xbb\xbf{}");
    good("[1,[2,[3,{\"a\":[]}]]]");
}

static void test_errors(void)
{
    bad("", KVP_EFORMAT, "t.json:1:1:");
    bad("   ", KVP_EFORMAT, "expected a value");
    bad("{\"a\":1,}", KVP_EFORMAT, "t.json:1:8: expected a string key");
    bad("[1,]", KVP_EFORMAT, "t.json:1:4:");
    bad("[1 2]", KVP_EFORMAT, "expected ',' or ']'");
    bad("{\"a\" 1}", KVP_EFORMAT, "expected ':'");
    bad("{\"a\":1}\n x", KVP_EFORMAT, "t.json:2:2: trailing");
    bad("{\"a\":1} {}", KVP_EFORMAT, "trailing");
    bad("{\"a\":1,\n\"a\":2}", KVP_EFORMAT, "t.json:2:5: duplicate key \"a\"");
    bad("01", KVP_EFORMAT, "leading zero");
    bad("1.", KVP_EFORMAT, "digits after");
    bad(".5", KVP_EFORMAT, "unexpected character");
    bad("1e", KVP_EFORMAT, "exponent");
    bad("-", KVP_EFORMAT, "invalid number");
    bad("+1", KVP_EFORMAT, "unexpected character");
    bad("1e999", KVP_EFORMAT, "out of range");
    bad("NaN", KVP_EFORMAT, "unexpected character");
    bad("tru", KVP_EFORMAT, "expected true");
    bad("nul", KVP_EFORMAT, "expected null");
    bad("\"abc", KVP_EFORMAT, "unterminated string");
    bad("\"a\\", KVP_EFORMAT, "unterminated string");
    bad("\"a\tb\"", KVP_EFORMAT, "control character");
    bad("\"\\x\"", KVP_EFORMAT, "invalid escape");
    bad("\"\\u12\"", KVP_EFORMAT, "hex digits");
    bad("\"\\u12G4\"", KVP_EFORMAT, "hex digits");
    bad("\"\\ud800\"", KVP_EFORMAT, "lone high surrogate");
    bad("\"\\ud800\\u0041\"", KVP_EFORMAT, "not followed by a low");
    bad("\"\\udc00\"", KVP_EFORMAT, "lone low surrogate");
    bad("\"\xff\"", KVP_EFORMAT, "invalid UTF-8");
    bad("\"\xc0\xaf\"", KVP_EFORMAT, "invalid UTF-8");         /* overlong '/' */
    bad("\"\xed\xa0\x80\"", KVP_EFORMAT, "invalid UTF-8");     /* encoded surrogate */
    bad("\"\xf4\x90\x80\x80\"", KVP_EFORMAT, "invalid UTF-8"); /* above U+10FFFF */
    bad("\"\xe2\x82\"", KVP_EFORMAT, "invalid UTF-8");         /* truncated sequence */
    bad("[1", KVP_EFORMAT, "unterminated array");
    bad("{\"a\":1", KVP_EFORMAT, "unterminated object");
    bad("{", KVP_EFORMAT, "unterminated object");
    bad("{1:2}", KVP_EFORMAT, "string key");
    /* a message shows the file's bytes escaped, on one line: keys with
     * control characters (a terminal escape), a duplicate one, a byte
     * that is no character, a long key cut between characters */
    bad("{\"x\\ny\\u001b[31m\":\"a\x01\"}", KVP_EFORMAT, "t.json:1:21: \"x\\u000ay\\u001b[31m\": raw control character 0x01");
    bad("{\"x\\ny\":1,\"x\\ny\":2}", KVP_EFORMAT, "duplicate key \"x\\u000ay\"");
    bad("\x89KVP", KVP_EFORMAT, "t.json:1:1: unexpected byte 0x89, expected a value");
    bad("[\"\\\x01\"]", KVP_EFORMAT, "invalid escape: a backslash before byte 0x01");
    char lk[160] = "{\"";
    for (int i = 0; i < 30; i++)
        strcat(lk, "\xe6\x97\xa5"); /* U+65E5 */
    strcat(lk, "\":[}");
    kvp_json *j = NULL;
    kvp_err err;
    CHECK(parse(lk, &j, &err) == KVP_EFORMAT);
    const char *q = strchr(err.msg, '"'), *e = q ? strstr(q, "...\"") : NULL;
    CHECK_MSG(q && e && (e - q - 1) % 3 == 0 && e - q - 1 >= 30, "%s", err.msg); /* whole characters */
    kvp_json_free(j);
    char shown[16];
    kvp_json_show(shown, sizeof shown, "a\"b", 3);
    CHECK_STR(shown, "\"a\\\"b\"");
    kvp_json_show(shown, sizeof shown, "\xe6\x97\xa5\xe6\x97\xa5\xe6\x97\xa5\xe6\x97\xa5", 12);
    CHECK_STR(shown, "\"\xe6\x97\xa5\xe6\x97\xa5\xe6\x97\xa5...\""); /* 15 bytes and the NUL */

    /* Depth: 128 levels parse, 129 do not. */
    char deep[300];
    memset(deep, '[', 128);
    memset(deep + 128, ']', 128);
    deep[256] = '\0';
    good(deep);
    memset(deep, '[', 129);
    memset(deep + 129, ']', 129);
    deep[258] = '\0';
    bad(deep, KVP_ELIMIT, "nesting deeper than 128");
    /* Deep input that never closes must not recurse without bound. */
    char *huge = malloc(100001);
    memset(huge, '[', 100000);
    huge[100000] = '\0';
    bad(huge, KVP_ELIMIT, "nesting");
    free(huge);
}

static void test_many_keys(void)
{
    /* 20000 members: lookups by binary search, duplicates caught. */
    size_t cap = 20000 * 24 + 16, n = 0;
    char *s = malloc(cap);
    s[n++] = '{';
    for (int k = 0; k < 20000; k++)
        n += (size_t)snprintf(s + n, cap - n, "%s\"key%d\":%d", k ? "," : "", k, k);
    s[n++] = '}';
    s[n] = '\0';
    kvp_json *j;
    kvp_err err;
    CHECK(parse(s, &j, &err) == 0);
    int all = 1;
    for (int k = 0; k < 20000 && j; k += 7) {
        char key[32];
        snprintf(key, sizeof key, "key%d", k);
        int64_t v = -1;
        if (kvp_json_get_i64(j, key, &v) != 0 || v != k)
            all = 0;
    }
    CHECK(all);
    CHECK(kvp_json_get(j, "key20000") == NULL);
    kvp_json_free(j);
    /* The same members plus a repeat of key0 at the end. */
    n--;
    n += (size_t)snprintf(s + n, cap - n, ",\"key0\":1}");
    CHECK(parse(s, &j, &err) == KVP_EFORMAT);
    CHECK_MSG(strstr(err.msg, "duplicate key \"key0\"") != NULL, "%s", err.msg);
    free(s);
}

static void test_hostile(void)
{
    const char *doc = "{\"model_type\":\"llama\",\"n\":[1,2.5,-3e2,true,null],\"s\":\"\\u00e9\\ud83d\\ude00x\","
                      "\"o\":{\"k\":{}}}";
    size_t len = strlen(doc);
    kvp_err err;
    int ok = 1;
    for (size_t cut = 0; cut < len; cut++) {
        char *copy = malloc(cut ? cut : 1); /* exact size: ASan sees any overrun */
        memcpy(copy, doc, cut);
        kvp_json *j = NULL;
        err.msg[0] = '\0';
        int rc = kvp_json_parse(&j, copy, cut, "t.json", &err);
        /* Only a few prefixes are themselves valid JSON (none here: the doc is one object). */
        if (rc == 0 || strncmp(err.msg, "t.json:", 7) != 0)
            ok = 0;
        kvp_json_free(j);
        free(copy);
    }
    CHECK(ok);
    ok = 1;
    char *copy = malloc(len);
    for (size_t i = 0; i < len; i++) {
        for (int bit = 0; bit < 8; bit++) {
            memcpy(copy, doc, len);
            copy[i] = (char)(copy[i] ^ (1 << bit));
            kvp_json *j = NULL;
            err.msg[0] = '\0';
            int rc = kvp_json_parse(&j, copy, len, "t.json", &err);
            if (rc != 0 && strncmp(err.msg, "t.json:", 7) != 0)
                ok = 0;
            kvp_json_free(j);
        }
    }
    free(copy);
    CHECK(ok);
}

/* Random mutations (fixed seed): overwrite, insert or delete a few bytes of
 * a valid document; whatever comes out must parse or fail with a position. */
static void test_mutations(void)
{
    const char *doc = "{\"a\":[1,-2.5e+3,\"x\\u00e9\\n\",{\"b\":null,\"c\":[true,false]}],\"d\":\"\xc3\xa9\"}";
    const char alphabet[] = "{}[]:,\"\\u0123456789eE+-.tfnrl \n\x80\xc3\xff";
    size_t len = strlen(doc);
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    char buf[256];
    int ok = 1, parsed = 0;
    for (int iter = 0; iter < 20000; iter++) {
        memcpy(buf, doc, len);
        size_t n = len;
        int edits = 1 + (int)(iter % 3);
        for (int e = 0; e < edits; e++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            size_t at = (size_t)(seed >> 33) % n;
            char ch = alphabet[(seed >> 20) % (sizeof alphabet - 1)];
            switch ((seed >> 10) % 3) {
            case 0: buf[at] = ch; break;
            case 1:
                if (n + 1 < sizeof buf) {
                    memmove(buf + at + 1, buf + at, n - at);
                    buf[at] = ch;
                    n++;
                }
                break;
            default:
                if (n > 1) {
                    memmove(buf + at, buf + at + 1, n - at - 1);
                    n--;
                }
                break;
            }
        }
        char *copy = malloc(n);
        memcpy(copy, buf, n);
        kvp_json *j = NULL;
        kvp_err err;
        err.msg[0] = '\0';
        int rc = kvp_json_parse(&j, copy, n, "m.json", &err);
        if (rc == 0)
            parsed++;
        else if (strncmp(err.msg, "m.json:", 7) != 0)
            ok = 0;
        kvp_json_free(j);
        free(copy);
    }
    CHECK(ok);
    CHECK(parsed > 0);
}

/* One line of a JSON Lines file: the file's line and the column in it,
 * once ("f.jsonl:7:6:", not "f.jsonl:7:1:6:"). */
static void test_parse_line(void)
{
    kvp_json *j = NULL;
    kvp_err err = {0};
    static const char t[] = "{\"a\":1e400}";
    CHECK_EQ_I64(kvp_json_parse_line(&j, t, sizeof t - 1, "f.jsonl", 7, &err), KVP_EFORMAT);
    CHECK_MSG(strcmp(err.msg, "f.jsonl:7:6: \"a\": number out of range") == 0, "%s", err.msg);
    /* the field of the fault, the innermost; none after a value */
    static const char nested[] = "{\"m\":[{\"role\":tru}]}", after[] = "{\"a\":1 \"b\":2}";
    CHECK_EQ_I64(kvp_json_parse_line(&j, nested, sizeof nested - 1, "f.jsonl", 2, &err), KVP_EFORMAT);
    CHECK_MSG(strstr(err.msg, "f.jsonl:2:") && strstr(err.msg, ": \"role\": invalid literal"), "%s", err.msg);
    CHECK_EQ_I64(kvp_json_parse_line(&j, after, sizeof after - 1, "f.jsonl", 2, &err), KVP_EFORMAT);
    CHECK_MSG(strstr(err.msg, "expected ',' or '}'") && !strstr(err.msg, "\"a\":"), "%s", err.msg);
    static const char ok[] = " {\"a\":1}";
    CHECK_MSG(kvp_json_parse_line(&j, ok, sizeof ok - 1, "f.jsonl", 7, &err) == 0 && j && j->n == 1, "%s", err.msg);
    kvp_json_free(j);
}

/* Strings are taken eight plain bytes at a time: a control byte, quote,
 * backslash or UTF-8 sequence at any offset of a long run is still seen
 * where it is (its column), and text decodes the same. */
static void test_string_runs(void)
{
    for (size_t at = 0; at < 27; at++) {
        char doc[80], want[32];
        kvp_json *j = NULL;
        kvp_err err = {0};
        memset(want, 'a', 26);
        want[26] = 0;
        snprintf(doc, sizeof doc, "\"%s\"", want);
        doc[1 + at] = 0x1f; /* at 26: in place of the closing quote */
        char col[32];
        snprintf(col, sizeof col, "t.json:1:%zu: raw control", at + 2);
        CHECK_MSG(parse(doc, &j, &err) == KVP_EFORMAT && strstr(err.msg, at < 26 ? col : "unterminated"), "%zu: %s",
                  at, err.msg);
        kvp_json_free(j);
        /* the text ends in a backslash after the run: its escape would be
         * past the end (read there once, under ASan a fault) */
        char cut[40];
        snprintf(cut, sizeof cut, "\"%.*s\\", (int)at, want);
        CHECK_MSG(kvp_json_parse(&j, cut, strlen(cut), "t.json", &err) == KVP_EFORMAT && strstr(err.msg, "unterminated"),
                  "%zu: %s", at, err.msg);
        kvp_json_free(j);
        if (at >= 25)
            continue;
        memcpy(doc + 1 + at, "\\n", 2); /* an escape */
        want[at] = '\n';
        memmove(want + at + 1, want + at + 2, 26 - at - 1);
        CHECK_MSG(parse(doc, &j, &err) == 0 && j->len == 25 && memcmp(j->str, want, 25) == 0, "%zu: %s", at,
                  err.msg);
        kvp_json_free(j);
        memcpy(doc + 1 + at, "\xc3\xa9", 2); /* a character past ASCII */
        CHECK_MSG(parse(doc, &j, &err) == 0 && j->len == 26 && memcmp(j->str + at, "\xc3\xa9", 2) == 0, "%zu: %s",
                  at, err.msg);
        kvp_json_free(j);
        doc[1 + at] = '\xff'; /* not UTF-8 */
        snprintf(col, sizeof col, "t.json:1:%zu: invalid UTF-8", at + 2);
        CHECK_MSG(parse(doc, &j, &err) == KVP_EFORMAT && strstr(err.msg, col), "%zu: %s", at, err.msg);
        kvp_json_free(j);
    }
}

/* kvp_json_parse_line_member: the line as strictly checked as by
 * kvp_json_parse_line (every fault, with the same message), only the one
 * root member kept; the others null, their keys still there. */
static void same_as_parse_line(const char *text, size_t n, int *same, int *parsed)
{
    kvp_json *a = NULL, *b = NULL;
    kvp_err ea = {0}, eb = {0};
    int ra = kvp_json_parse_line(&a, text, n, "r.jsonl", 3, &ea);
    int rb = kvp_json_parse_line_member(&b, text, n, "r.jsonl", 3, "id", &eb);
    if (ra != rb || (ra < 0 && strcmp(ea.msg, eb.msg) != 0) || (ra == 0) != (b != NULL))
        *same = 0;
    if (ra == 0 && b) {
        *parsed += 1;
        const kvp_json *ia = kvp_json_get(a, "id"), *ib = kvp_json_get(b, "id");
        if ((ia == NULL) != (ib == NULL) || (ia && (ia->type != ib->type || ia->num != ib->num ||
                                                    ia->len != ib->len || (ia->str && memcmp(ia->str, ib->str, ia->len)))))
            *same = 0;
        for (size_t k = 0; b->type == KVP_JSON_OBJECT && k < b->n; k++)
            if (strcmp(b->keys[k], "id") != 0 && (b->items[k].type != KVP_JSON_NULL || b->items[k].str))
                *same = 0;
        if (a->type != b->type || a->n != b->n)
            *same = 0;
    }
    kvp_json_free(a);
    kvp_json_free(b);
}

static void test_parse_line_member(void)
{
    kvp_json *j = NULL;
    kvp_err err = {0};
    static const char line[] = "{\"text\":\"Once upon a time, \\\"x\\\" \xc3\xa9\",\"id\":\"r7\",\"n\":[1,{\"a\":2}]}";
    CHECK_MSG(kvp_json_parse_line_member(&j, line, sizeof line - 1, "r.jsonl", 1, "id", &err) == 0, "%s", err.msg);
    if (j) {
        CHECK_STR(kvp_json_get_str(j, "id"), "r7");
        CHECK(kvp_json_get(j, "text") && kvp_json_get(j, "text")->type == KVP_JSON_NULL);
        CHECK(kvp_json_get(j, "n") && kvp_json_get(j, "n")->type == KVP_JSON_NULL);
    }
    kvp_json_free(j);
    /* faults in the members dropped are faults still, said alike */
    static const char *const faults[] = {
        "{\"id\":1,\"text\":\"a\",\"text\":\"b\"}",          /* a duplicate key dropped */
        "{\"id\":1,\"text\":\"ab\xff\"}",                    /* not UTF-8 */
        "{\"id\":1,\"text\":\"a\x01\"}",                     /* a control byte */
        "{\"id\":1,\"text\":\"\\ud800\"}",                   /* a lone surrogate */
        "{\"id\":1,\"m\":{\"a\":1,\"a\":2}}",                /* a duplicate inside */
        "{\"id\":1,\"text\":\"a\",\"id\":2}",                /* the kept key twice */
        "{\"id\":1,\"text\":\"a\"} x",                       /* trailing bytes */
        "{\"id\":1,\"text\":\"a",                            /* cut off */
        "{\"id\":1,\"t\":1e999}",                            /* a number out of range */
    };
    int same = 1, parsed = 0;
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) {
        int before = same;
        same_as_parse_line(faults[i], strlen(faults[i]), &same, &parsed);
        CHECK_MSG(same == before, "fault %zu said otherwise", i);
    }
    CHECK_EQ_I64(parsed, 0);
    /* and every mutation of a result line: the same verdict, message, id */
    const char *doc = "{\"id\":\"q12\",\"text\":\"The river number 1 is \\u00e9 \xc3\xa9 a \\\"long\\\" one\","
                      "\"tokens\":16,\"finish_reason\":\"length\",\"m\":{\"a\":[1,2]},\"ttft_ms\":1.5}";
    const char alphabet[] = "{}[]:,\"\\u0123456789eE+-.tfnrl \n\x80\xc3\xff\x01id";
    size_t len = strlen(doc);
    uint64_t seed = 0x2545f4914f6cdd1dull;
    char buf[256];
    for (int iter = 0; iter < 20000; iter++) {
        memcpy(buf, doc, len);
        size_t n = len;
        for (int e = 0; e < 1 + iter % 3; e++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            size_t at = (size_t)(seed >> 33) % n;
            char ch = alphabet[(seed >> 20) % (sizeof alphabet - 1)];
            if ((seed >> 10) % 2)
                buf[at] = ch;
            else if (n > 1)
                memmove(buf + at, buf + at + 1, n - at - 1), n--;
        }
        same_as_parse_line(buf, n, &same, &parsed);
    }
    CHECK(same);
    CHECK(parsed > 0);
}

int main(void)
{
    test_parse_line();
    test_string_runs();
    test_parse_line_member();
    test_values();
    test_errors();
    test_many_keys();
    test_hostile();
    test_mutations();
    return unit_done();
}
