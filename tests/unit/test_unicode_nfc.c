/* test_unicode_nfc.c - kvp_unicode_nfc against unicodedata2 15.1.0's NFC
 * (tests/golden/nfc.txt, scripts/ref/gen_nfc.py): every code point that NFC
 * changes, and through it every other code point as its own NFC, the NFD
 * of every decomposable one, 2,000 random strings; then cases by hand for
 * each step (decomposition, reordering, composition, exclusions, Hangul),
 * invalid UTF-8 and a run of marks long enough for the counting sort. */
#include "unicode.h"
#include "unit.h"

#include <stdlib.h>
#include <string.h>

static const char *golden_path(char *buf, size_t cap)
{
    const char *t = getenv("KVP_TESTS");
    snprintf(buf, cap, "%s/golden/nfc.txt", t && *t ? t : "tests");
    return buf;
}

static void print_hex(const char *what, const char *s, size_t n)
{
    printf("  %s:", what);
    for (size_t i = 0; i < n; i++)
        printf(" %02x", (unsigned char)s[i]);
    putchar('\n');
}

/* Is NFC(s) want?  Prints both when not. */
static int nfc_is(const char *s, size_t n, const char *want, size_t wn)
{
    char *out = NULL;
    size_t on = 0;
    kvp_err err;
    int rc = kvp_unicode_nfc(s, n, &out, &on, &err);
    int ok = rc == 0 && on == wn && memcmp(out, want, wn) == 0 && out[on] == '\0';
    if (!ok) {
        print_hex("text", s, n);
        print_hex("want", want, wn);
        print_hex("got ", out ? out : "", rc == 0 ? on : 0);
    }
    free(out);
    return ok;
}

#define NFC_IS(in, want) CHECK_MSG(nfc_is(in, sizeof(in) - 1, want, sizeof(want) - 1), "NFC of %s", #in)

static int unhex(const char *h, size_t hn, char *out)
{
    for (size_t i = 0; i + 1 < hn; i += 2) {
        unsigned v;
        if (sscanf(h + i, "%2x", &v) != 1)
            return -1;
        out[i / 2] = (char)v;
    }
    return hn % 2 ? -1 : 0;
}

static void test_golden(void)
{
    char path[1024], line[4096], in[2048], want[2048];
    FILE *f = fopen(golden_path(path, sizeof path), "r");
    CHECK_MSG(f != NULL, "%s: cannot open (a committed golden)", path);
    if (!f)
        return;
    uint8_t *changed = calloc(0x110000, 1); /* code points the golden lists alone */
    size_t cases = 0, bad = 0, lineno = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        if (line[0] == '#')
            continue;
        char *tab = strchr(line, '\t');
        size_t len = strlen(line);
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if (!tab || unhex(line, (size_t)(tab - line), in) < 0 || unhex(tab + 1, strlen(tab + 1), want) < 0) {
            CHECK_MSG(0, "%s:%zu: not HEX TAB HEX", path, lineno);
            continue;
        }
        size_t n = (size_t)(tab - line) / 2, wn = strlen(tab + 1) / 2;
        uint32_t cp;
        if (n && kvp_unicode_decode(in, n, &cp) == n && cp != KVP_UNICODE_BAD)
            changed[cp] = 1;
        cases++;
        /* NFC is the golden's; the golden's NFC is its own NFC */
        if (!nfc_is(in, n, want, wn) || !nfc_is(want, wn, want, wn)) {
            bad++;
            printf("  (%s:%zu)\n", path, lineno);
        }
        if (bad >= 10)
            break;
    }
    fclose(f);
    CHECK_MSG(bad == 0, "%zu of %zu golden cases differ", bad, cases);
    CHECK(cases >= 5000);
    /* Every code point the golden does not list is its own NFC. */
    size_t same = 0, notsame = 0;
    for (uint32_t c = 0; c <= 0x10FFFF; c++) {
        char b[4];
        size_t k = kvp_unicode_encode(c, b);
        if (k == 0 || changed[c])
            continue;
        if (nfc_is(b, k, b, k))
            same++;
        else if (++notsame >= 10)
            break;
    }
    CHECK_MSG(notsame == 0, "%zu code points changed by NFC that unicodedata2 keeps", notsame);
    CHECK(same > 0x10F000 - 0x800);
    printf("ok nfc: %zu golden cases, %zu code points kept\n", cases, same);
    free(changed);
}

static void test_by_hand(void)
{
    NFC_IS("", "");
    NFC_IS("plain ASCII stays", "plain ASCII stays");
    NFC_IS("cafe\u0301", "caf\u00E9");
    NFC_IS("e\u0301e\u0301", "\u00E9\u00E9");
    NFC_IS("caf\u00E9", "caf\u00E9");                 /* already NFC */
    NFC_IS("\u1100\u1161", "\uAC00");                 /* L V -> LV */
    NFC_IS("\u1100\u1161\u11A8", "\uAC01");           /* L V T -> LVT */
    NFC_IS("\uAC00\u11A8", "\uAC01");                 /* LV T -> LVT */
    NFC_IS("\uAC01\u11A8", "\uAC01\u11A8");           /* LVT takes no second T */
    NFC_IS("\u1100\u1176", "\u1100\u1176");           /* an archaic vowel: no syllable */
    NFC_IS("\u212B", "\u00C5");                       /* ANGSTROM SIGN: a singleton */
    NFC_IS("\u2126", "\u03A9");                       /* OHM SIGN */
    NFC_IS("\u0958", "\u0915\u093C");                 /* a composition exclusion */
    NFC_IS("\u0915\u093C", "\u0915\u093C");
    NFC_IS("\u0344", "\u0308\u0301");                 /* a non-starter decomposition */
    /* reordering: below (220) before above (230), whatever the input order */
    NFC_IS("q\u0307\u0323", "q\u0323\u0307");
    NFC_IS("a\u0302\u0323", "\u1EAD");                /* a + dot below first, then circumflex */
    NFC_IS("a\u0323\u0302", "\u1EAD");
    NFC_IS("\u1E0B\u0323", "\u1E0D\u0307");           /* decomposed, reordered, composed anew */
    NFC_IS("a\u0301\u0301", "\u00E1\u0301");          /* the second acute is blocked by the first */
    NFC_IS("\u1F82", "\u1F82");                       /* four code points deep, back again */
    NFC_IS("\u03B1\u0313\u0300\u0345", "\u1F82");
    NFC_IS("\u0CC6\u0CC2\u0CD5", "\u0CCB");           /* a starter composing with starters */
    NFC_IS("\u304B\u3099", "\u304C");                 /* kana voicing mark */
}

/* A byte that is not UTF-8 is kept and composes with nothing. */
static void test_invalid(void)
{
    NFC_IS("e\xCC\x81\xFF", "\xC3\xA9\xFF");
    NFC_IS("\xFF" "e\xCC\x81", "\xFF\xC3\xA9");
    NFC_IS("e\xFF\xCC\x81", "e\xFF\xCC\x81");        /* the byte blocks the mark */
    NFC_IS("e\xCC", "e\xCC");                         /* cut off */
    NFC_IS("\xED\xA0\x80\xCC\x81", "\xED\xA0\x80\xCC\x81"); /* a surrogate's bytes */
}

/* Runs of marks past the insertion sort's length go through the counting
 * sort: a followed by 50 pairs (acute 230, dot below 220) gives a-dot-below
 * (U+1EA1), the other 49 dots, then the 50 acutes (unicodedata2's answer). */
static void test_long_run(void)
{
    char in[1 + 50 * 4], want[3 + 49 * 2 + 50 * 2];
    size_t n = 0, wn = 0;
    in[n++] = 'a';
    for (int i = 0; i < 50; i++) {
        memcpy(in + n, "\xCC\x81\xCC\xA3", 4);
        n += 4;
    }
    memcpy(want, "\xE1\xBA\xA1", 3);
    wn = 3;
    for (int i = 0; i < 49; i++, wn += 2)
        memcpy(want + wn, "\xCC\xA3", 2);
    for (int i = 0; i < 50; i++, wn += 2)
        memcpy(want + wn, "\xCC\x81", 2);
    CHECK(nfc_is(in, n, want, wn));
    /* 800 rounds of five marks of four classes: sorted by class, and the
     * two of class 230 (acute, grave) kept in their input order */
    size_t m = 800, e = 1;
    char *big = malloc(1 + 10 * m), *exp = malloc(1 + 10 * m);
    big[0] = exp[0] = 'x';
    for (size_t i = 0; i < m; i++) /* 230 220 240 216 230 */
        memcpy(big + 1 + 10 * i, "\xCC\x81\xCC\xA3\xCD\x85\xCC\x9B\xCC\x80", 10);
    for (size_t i = 0; i < m; i++, e += 2)
        memcpy(exp + e, "\xCC\x9B", 2); /* horn, 216 */
    for (size_t i = 0; i < m; i++, e += 2)
        memcpy(exp + e, "\xCC\xA3", 2); /* dot below, 220 */
    for (size_t i = 0; i < m; i++, e += 4)
        memcpy(exp + e, "\xCC\x81\xCC\x80", 4);
    for (size_t i = 0; i < m; i++, e += 2)
        memcpy(exp + e, "\xCD\x85", 2); /* ypogegrammeni, 240 */
    CHECK(nfc_is(big, 1 + 10 * m, exp, e));
    free(big);
    free(exp);
}

static void check_tables(void)
{
    int bad = 0;
    for (size_t i = 0; i < kvp_unicode_ccc_range_count; i++) {
        const kvp_unicode_ccc_range *r = &kvp_unicode_ccc_ranges[i];
        bad += r->lo > r->hi || r->ccc == 0 || (i && r->lo <= kvp_unicode_ccc_ranges[i - 1].hi);
    }
    for (size_t i = 1; i < kvp_unicode_decomp_count; i++)
        bad += kvp_unicode_decomps[i].cp <= kvp_unicode_decomps[i - 1].cp;
    for (size_t i = 1; i < kvp_unicode_pair_count; i++) {
        const kvp_unicode_pair *a = &kvp_unicode_pairs[i - 1], *b = &kvp_unicode_pairs[i];
        bad += a->first > b->first || (a->first == b->first && a->second >= b->second);
    }
    CHECK_EQ_U64(bad, 0);
    /* unicode.c looks nothing up below these */
    CHECK(kvp_unicode_ccc_ranges[0].lo >= 0x300);
    CHECK(kvp_unicode_decomps[0].cp >= 0xC0);
    CHECK_EQ_U64(kvp_unicode_ccc('a'), 0);
    CHECK_EQ_U64(kvp_unicode_ccc(0x301), 230);
    CHECK_EQ_U64(kvp_unicode_ccc(0x323), 220);
    CHECK_EQ_U64(kvp_unicode_ccc(0x345), 240);
    CHECK_EQ_U64(kvp_unicode_ccc(KVP_UNICODE_BAD), 0);
}

int main(void)
{
    check_tables();
    test_by_hand();
    test_invalid();
    test_long_run();
    test_golden();
    return unit_done();
}
