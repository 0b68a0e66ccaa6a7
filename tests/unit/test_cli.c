/* test_cli.c - the option number parsers of lib/base/cli.c: what every
 * program's whole-number, real and size options accept, and the typos they
 * refuse that strtoll/strtod alone would read as values; and the JSON
 * strings the programs write (kvp_cli_json_str), and the escapes of a
 * string inside a one-line message (kvp_unicode_escape, kvp_cli_c_escaped). */
#include "unit.h"
#include "cli.h"
#include "unicode.h"

#include <float.h>

static int i64_ok(const char *s, int64_t want)
{
    int64_t v = 12345;
    return kvp_cli_parse_i64(s, INT64_MIN, INT64_MAX, &v) == 0 && v == want;
}

static int i64_bad(const char *s)
{
    int64_t v = 12345;
    return kvp_cli_parse_i64(s, INT64_MIN, INT64_MAX, &v) == -1 && v == 12345;
}

static int f64_ok(const char *s, double want)
{
    double v = 0.125;
    return kvp_cli_parse_f64(s, -DBL_MAX, DBL_MAX, &v) == 0 && v == want;
}

static int f64_bad(const char *s)
{
    double v = 0.125;
    return kvp_cli_parse_f64(s, -DBL_MAX, DBL_MAX, &v) == -1 && v == 0.125;
}

static void test_i64(void)
{
    CHECK(i64_ok("0", 0));
    CHECK(i64_ok("42", 42));
    CHECK(i64_ok("-7", -7));
    CHECK(i64_ok("007", 7));
    CHECK(i64_ok("9223372036854775807", INT64_MAX));
    CHECK(i64_ok("-9223372036854775808", INT64_MIN));
    CHECK(i64_bad(""));
    CHECK(i64_bad(NULL));
    CHECK(i64_bad(" 5"));  /* strtoll skips the space */
    CHECK(i64_bad("+5"));  /* and takes the sign */
    CHECK(i64_bad("5 "));
    CHECK(i64_bad("-"));
    CHECK(i64_bad("--5"));
    CHECK(i64_bad("- 5"));
    CHECK(i64_bad("0x10")); /* base 10: "0" then junk */
    CHECK(i64_bad("1.5"));
    CHECK(i64_bad("1e3"));
    CHECK(i64_bad("9223372036854775808"));
    int64_t v;
    CHECK(kvp_cli_parse_i64("3", 4, 10, &v) == -1);
    CHECK(kvp_cli_parse_i64("11", 4, 10, &v) == -1);
    CHECK(kvp_cli_parse_i64("10", 4, 10, &v) == 0 && v == 10);
}

static void test_f64(void)
{
    CHECK(f64_ok("0", 0));
    CHECK(f64_ok("0.5", 0.5));
    CHECK(f64_ok(".5", 0.5));
    CHECK(f64_ok("-.25", -0.25));
    CHECK(f64_ok("5.", 5));
    CHECK(f64_ok("1e-3", 1e-3));
    CHECK(f64_ok("2E2", 200));
    CHECK(f64_bad(""));
    CHECK(f64_bad(NULL));
    CHECK(f64_bad(" 0.5"));
    CHECK(f64_bad("+0.5"));
    CHECK(f64_bad("0x1p3")); /* strtod reads hex floats: 8 */
    CHECK(f64_bad("0x10"));
    CHECK(f64_bad("inf"));
    CHECK(f64_bad("-inf"));
    CHECK(f64_bad("nan"));
    CHECK(f64_bad("infinity"));
    CHECK(f64_bad("."));
    CHECK(f64_bad("-"));
    CHECK(f64_bad("1e"));
    CHECK(f64_bad("1e999")); /* overflows to inf */
    CHECK(f64_ok("1e-400", 0)); /* underflows: rounded to 0, not an error */
    CHECK(f64_ok("-1e-400", 0));
    CHECK(f64_ok("1e-310", 1e-310)); /* subnormal */
    CHECK(f64_bad("0.5x"));
    double v;
    CHECK(kvp_cli_parse_f64("1.5", 0, 1, &v) == -1);
    CHECK(kvp_cli_parse_f64("1", 0, 1, &v) == 0 && v == 1);
    CHECK(kvp_cli_parse_f64("1e-400", 0.001, 1, &v) == -1); /* 0, below the range */
}

static void test_size(void)
{
    uint64_t v;
    CHECK(kvp_cli_parse_size("512", &v) == 0 && v == 512);
    CHECK(kvp_cli_parse_size("4K", &v) == 0 && v == 4000);
    CHECK(kvp_cli_parse_size("4KiB", &v) == 0 && v == 4096);
    CHECK(kvp_cli_parse_size("1.5G", &v) == 0 && v == 1500000000ull);
    CHECK(kvp_cli_parse_size("2m", &v) == 0 && v == 2000000);
    CHECK(kvp_cli_parse_size("1PiB", &v) == 0 && v == 1125899906842624ull);
    CHECK(kvp_cli_parse_size(" 5", &v) == -1);
    CHECK(kvp_cli_parse_size("+5", &v) == -1);
    CHECK(kvp_cli_parse_size("-5", &v) == -1);
    CHECK(kvp_cli_parse_size("0x50G", &v) == -1);
    CHECK(kvp_cli_parse_size("1e3", &v) == -1);
    CHECK(kvp_cli_parse_size("1.5", &v) == -1); /* not a whole number of bytes */
    CHECK(kvp_cli_parse_size("5X", &v) == -1);
    CHECK(kvp_cli_parse_size("20000P", &v) == -1); /* past 2^64 */
    /* the suffix in any case: "80gb" and "80gib" as "80gB" and "80giB" */
    CHECK(kvp_cli_parse_size("80gb", &v) == 0 && v == 80000000000ull);
    CHECK(kvp_cli_parse_size("80gib", &v) == 0 && v == 80ull << 30);
    CHECK(kvp_cli_parse_size("80GIB", &v) == 0 && v == 80ull << 30);
    CHECK(kvp_cli_parse_size("80Gbb", &v) == -1);
    CHECK(kvp_cli_parse_size("80ib", &v) == -1); /* no prefix, no i */
    /* decimal fractions exactly: strtod's 16.4 * 1e9 was 16399999999.999998,
     * refused as a fraction of a byte, as 37 of 0.1G .. 99.9G were */
    char buf[32];
    int bad = 0;
    for (unsigned t = 1; t < 1000; t++) {
        snprintf(buf, sizeof buf, "%u.%uG", t / 10, t % 10);
        if (kvp_cli_parse_size(buf, &v) != 0 || v != (uint64_t)t * 100000000ull)
            bad++;
    }
    CHECK(bad == 0);
    CHECK(kvp_cli_parse_size("16.4GB", &v) == 0 && v == 16400000000ull);
    CHECK(kvp_cli_parse_size("2.039T", &v) == 0 && v == 2039000000000ull);
    CHECK(kvp_cli_parse_size("4.1M", &v) == 0 && v == 4100000);
    /* a fraction of a byte in a unit rounds to the nearest: 79.65 * 2^30 is
     * 85523536281.6; 0.5 KiB is 512 exactly; 1.0005K is 1000.5, up */
    CHECK(kvp_cli_parse_size("79.65GiB", &v) == 0 && v == 85523536282ull);
    CHECK(kvp_cli_parse_size("0.5KiB", &v) == 0 && v == 512);
    CHECK(kvp_cli_parse_size("1.0005K", &v) == 0 && v == 1001);
    CHECK(kvp_cli_parse_size("0.0001K", &v) == 0 && v == 0);
    CHECK(kvp_cli_parse_size("1.500", &v) == -1);
    CHECK(kvp_cli_parse_size("1.000", &v) == 0 && v == 1); /* a whole number of bytes */
    CHECK(kvp_cli_parse_size("1.", &v) == -1);
    CHECK(kvp_cli_parse_size(".5G", &v) == -1);
    CHECK(kvp_cli_parse_size("18446744073709551615", &v) == -1 || v == UINT64_MAX);
    CHECK(kvp_cli_parse_size("16383.999PiB", &v) == 0 && v == 18446742947809644773ull);
    CHECK(kvp_cli_parse_size("16384PiB", &v) == -1); /* 2^64 */
}

/* s[0..n) as kvp_cli_json_str writes it equals want. */
static int json_str_is(const char *s, size_t n, const char *want)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return 0;
    kvp_cli_json_str(f, s, n);
    fclose(f);
    int ok = len == strlen(want) && memcmp(buf, want, len) == 0;
    if (!ok)
        printf("# json_str: got %.*s want %s\n", (int)len, buf, want);
    free(buf);
    return ok;
}

/* Invalid UTF-8 (a byte token's piece of a character, cut by the end of
 * generation) becomes U+FFFD once per maximal ill-formed subpart, as
 * Python's and HF's decode(errors="replace") give it (the expected
 * strings are theirs, non-ASCII kept raw). */
static void test_json_str(void)
{
    CHECK(json_str_is("a\"\\\n\x01", 5, "\"a\\\"\\\\\\n\\u0001\""));
    CHECK(json_str_is("Sac\xe5\xba", 5, "\"Sac\\ufffd\""));
    CHECK(json_str_is("\xe5\xba" "A", 3, "\"\\ufffdA\""));
    CHECK(json_str_is("\xf0\x9f\x98", 3, "\"\\ufffd\""));
    CHECK(json_str_is("\xc0\xaf", 2, "\"\\ufffd\\ufffd\""));
    CHECK(json_str_is("\xed\xa0\x80", 3, "\"\\ufffd\\ufffd\\ufffd\""));
    CHECK(json_str_is("\xe0\x80\x80", 3, "\"\\ufffd\\ufffd\\ufffd\""));
    CHECK(json_str_is("\xf4\x90\x80\x80", 4, "\"\\ufffd\\ufffd\\ufffd\\ufffd\""));
    CHECK(json_str_is("\xf0\x90\x80" "A\x80", 5, "\"\\ufffdA\\ufffd\""));
    CHECK(json_str_is("\xff\xfe", 2, "\"\\ufffd\\ufffd\""));
    CHECK(json_str_is("a\xe2\x82\xac" "b\xe2\x82", 7, "\"a\xe2\x82\xac" "b\\ufffd\""));
}

/* s escaped into a buffer of size bytes (kvp_unicode_escape), quote the
 * message's, is want; and kvp_cli_c_escaped writes whole (s escaped, not
 * cut: NULL when it is want). */
static int escape_is_cut(const char *s, size_t size, int quote, const char *want, const char *whole)
{
    char buf[80], *f = NULL; /* size <= 64: what is past it stays untouched */
    size_t n = 0;
    memset(buf, '#', sizeof buf);
    const char *got = kvp_unicode_escape(buf, size, s, quote);
    int ok = got == buf && strcmp(buf, want) == 0 && buf[size] == '#';
    FILE *m = open_memstream(&f, &n);
    if (m) {
        kvp_cli_c_escaped(m, s, strlen(s), quote);
        fclose(m);
    }
    ok &= f != NULL && strcmp(f, whole ? whole : want) == 0;
    if (!ok)
        printf("# escape: got %s (file: %s) want %s\n", buf, f ? f : "(null)", want);
    free(f);
    return ok;
}

static int escape_is(const char *s, size_t size, int quote, const char *want)
{
    return escape_is_cut(s, size, quote, want, NULL);
}

/* A request id in a message (one line whatever the id holds): the
 * newline that would forge a second message line, a terminal's escape,
 * a backslash, invalid UTF-8 as \xNN a byte; valid UTF-8 as it is. */
static void test_escape(void)
{
    CHECK(escape_is("a\nprefill: sequence 9 forged", 64, 0, "a\\nprefill: sequence 9 forged"));
    CHECK(escape_is("a\tb\rc\\d", 64, 0, "a\\tb\\rc\\\\d"));
    CHECK(escape_is("\x1b[31mred\x7f", 64, 0, "\\x1b[31mred\\x7f"));
    CHECK(escape_is("caf\xc3\xa9 \xe5\xba", 64, 0, "caf\xc3\xa9 \\xe5\\xba"));
    CHECK(escape_is("say \"hi\"", 64, '"', "say \\\"hi\\\""));
    CHECK(escape_is("say \"hi\"", 64, 0, "say \"hi\""));
    CHECK(escape_is("", 1, 0, ""));
    /* cut at a whole escape: never half of \n, nor past the buffer; "..."
     * says so where there is room for it */
    CHECK(escape_is_cut("ab\ncd", 4, 0, "ab", "ab\\ncd"));
    CHECK(escape_is_cut("ab\ncd", 5, 0, "a...", "ab\\ncd"));
    CHECK(escape_is_cut("ab\ncd", 7, 0, "ab\\ncd", NULL));
    CHECK(escape_is_cut("abc\nd", 7, 0, "abc\\nd", NULL));
    CHECK(escape_is_cut("abcd\nef", 8, 0, "abcd...", "abcd\\nef"));
    CHECK(escape_is_cut("\xc3\xa9\xc3\xa9", 4, 0, "\xc3\xa9", "\xc3\xa9\xc3\xa9"));
    /* a long id leaves the message its reason: KVP_UNICODE_SHOWN_MAX at most */
    char id[256], big[KVP_UNICODE_ESCAPED_SIZE(255)], whole[KVP_UNICODE_ESCAPED_SIZE(255)];
    memset(id, '\n', 255);
    id[255] = 0;
    kvp_unicode_escape(big, sizeof big, id, 0);
    CHECK(strlen(big) <= KVP_UNICODE_SHOWN_MAX && strlen(big) >= KVP_UNICODE_SHOWN_MAX - 4);
    CHECK(strcmp(big + strlen(big) - 3, "...") == 0 && strncmp(big, "\\n\\n", 4) == 0);
    for (size_t i = 0; i < 255; i++)
        memcpy(whole + 2 * i, "\\n", 2);
    whole[510] = 0;
    CHECK(escape_is_cut(id, 64, 0, "\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n\\n...", whole));
}

/* s quoted for a shell is want. */
static int sh_quote_is(const char *s, const char *want)
{
    char *q = kvp_cli_sh_quote(s);
    int ok = q && strcmp(q, want) == 0;
    if (!ok)
        printf("# sh_quote: got %s want %s\n", q ? q : "(null)", want);
    free(q);
    return ok;
}

static void test_sh_quote(void)
{
    CHECK(sh_quote_is("q4_0.kvp", "q4_0.kvp"));
    CHECK(sh_quote_is("/models/draft-1,b@x=%+:.kvp", "/models/draft-1,b@x=%+:.kvp"));
    CHECK(sh_quote_is("my draft.kvp", "'my draft.kvp'"));
    CHECK(sh_quote_is("it's", "'it'\\''s'"));
    CHECK(sh_quote_is("''", "''\\'''\\'''"));
    CHECK(sh_quote_is("", "''"));
    CHECK(sh_quote_is("$HOME/*.kvp;rm", "'$HOME/*.kvp;rm'"));
    CHECK(sh_quote_is("a\nb\\c\"d", "'a\nb\\c\"d'"));
    CHECK(sh_quote_is("caf\xc3\xa9", "'caf\xc3\xa9'"));
}

int main(void)
{
    test_json_str();
    test_escape();
    test_sh_quote();
    test_i64();
    test_f64();
    test_size();
    return unit_done();
}
