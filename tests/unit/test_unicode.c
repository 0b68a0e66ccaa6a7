/* test_unicode.c - UTF-8 decoding, the held-back tail rule and the generated
 * character classes. */
#include "unicode.h"
#include "unit.h"

static void test_roundtrip_all(void)
{
    int bad = 0;
    for (uint32_t cp = 0; cp <= 0x10FFFF; cp++) {
        char b[4];
        uint32_t back;
        size_t n = kvp_unicode_encode(cp, b);
        if (cp >= 0xD800 && cp <= 0xDFFF) {
            bad += n != 0;
            continue;
        }
        if (n == 0 || kvp_unicode_decode(b, n, &back) != n || back != cp ||
            kvp_unicode_complete_prefix(b, n) != n || (n > 1 && kvp_unicode_complete_prefix(b, n - 1) != 0))
            bad++;
    }
    CHECK_EQ_U64(bad, 0);
    char b[4];
    CHECK_EQ_U64(kvp_unicode_encode(0x110000, b), 0);
}

static void check_bad(const char *s, size_t n)
{
    uint32_t cp = 0;
    CHECK_EQ_U64(kvp_unicode_decode(s, n, &cp), 1);
    CHECK_EQ_U64(cp, KVP_UNICODE_BAD);
}

static void test_invalid(void)
{
    check_bad("\x80", 1);          /* lone continuation */
    check_bad("\xC0\x80", 2);      /* overlong NUL */
    check_bad("\xC1\xBF", 2);      /* overlong */
    check_bad("\xE0\x80\x80", 3);  /* overlong */
    check_bad("\xED\xA0\x80", 3);  /* surrogate */
    check_bad("\xF4\x90\x80\x80", 4); /* past U+10FFFF */
    check_bad("\xF5\x80\x80\x80", 4);
    check_bad("\xFF", 1);
    check_bad("\xE4\xBD", 2);      /* truncated */
    check_bad("\xE4\x41\x41", 3);  /* bad continuation */
    uint32_t cp;
    CHECK_EQ_U64(kvp_unicode_decode("\xE4\xBD\xA0", 3, &cp), 3);
    CHECK_EQ_U64(cp, 0x4F60);
}

static void test_complete_prefix(void)
{
    CHECK_EQ_U64(kvp_unicode_complete_prefix("", 0), 0);
    CHECK_EQ_U64(kvp_unicode_complete_prefix("ab", 2), 2);
    CHECK_EQ_U64(kvp_unicode_complete_prefix("ab\xE4", 3), 2);
    CHECK_EQ_U64(kvp_unicode_complete_prefix("ab\xE4\xBD", 4), 2);
    CHECK_EQ_U64(kvp_unicode_complete_prefix("ab\xE4\xBD\xA0", 5), 5);
    CHECK_EQ_U64(kvp_unicode_complete_prefix("\xF0\x9F\x98", 3), 0);
    /* Bytes no continuation can rescue are not held back. */
    CHECK_EQ_U64(kvp_unicode_complete_prefix("a\x80", 2), 2);
    CHECK_EQ_U64(kvp_unicode_complete_prefix("a\xFF", 2), 2);
    CHECK_EQ_U64(kvp_unicode_complete_prefix("a\xED\xA0", 3), 3); /* would be a surrogate */
    CHECK_EQ_U64(kvp_unicode_complete_prefix("a\xE4\x41", 3), 3);
    CHECK_EQ_U64(kvp_unicode_complete_prefix("a\xC0", 2), 2);
}

/* Where text that must be UTF-8 goes wrong: the first byte of a bad,
 * overlong, surrogate or cut-off sequence. */
static void test_valid_prefix(void)
{
    CHECK_EQ_U64(kvp_unicode_valid_prefix("", 0), 0);
    CHECK_EQ_U64(kvp_unicode_valid_prefix("h\xC3\xA9llo \xE2\x9C\x93", 10), 10);
    CHECK_EQ_U64(kvp_unicode_valid_prefix("bad \xFF utf8", 10), 4);
    CHECK_EQ_U64(kvp_unicode_valid_prefix("a\xC0\x80", 3), 1);     /* overlong NUL */
    CHECK_EQ_U64(kvp_unicode_valid_prefix("ab\xED\xA0\x80", 5), 2); /* a surrogate */
    CHECK_EQ_U64(kvp_unicode_valid_prefix("ab\xE4\xBD", 4), 2);     /* cut off */
    CHECK_EQ_U64(kvp_unicode_valid_prefix("\xF4\x90\x80\x80", 4), 0); /* past U+10FFFF */
}

static void test_classes(void)
{
    CHECK(kvp_unicode_is_letter('a'));
    CHECK(kvp_unicode_is_letter('Z'));
    CHECK(kvp_unicode_is_letter(0xE9));    /* é */
    CHECK(kvp_unicode_is_letter(0x4E2D));  /* 中 */
    CHECK(kvp_unicode_is_letter(0x05D0));  /* א */
    CHECK(!kvp_unicode_is_letter(0x0301)); /* combining acute is Mn */
    CHECK(kvp_unicode_is_number('7'));
    CHECK(kvp_unicode_is_number(0x0663));  /* Arabic-Indic three */
    CHECK(kvp_unicode_is_number(0xBD));    /* ½ (No) */
    CHECK(kvp_unicode_is_number(0x216B));  /* Ⅻ (Nl) */
    CHECK(kvp_unicode_is_number(0xB2));    /* ² */
    CHECK(kvp_unicode_is_space(' '));
    CHECK(kvp_unicode_is_space('\n'));
    CHECK(kvp_unicode_is_space(0x0B));
    CHECK(kvp_unicode_is_space(0x85));
    CHECK(kvp_unicode_is_space(0xA0));
    CHECK(kvp_unicode_is_space(0x3000));
    CHECK(kvp_unicode_is_space(0x2028));
    CHECK(!kvp_unicode_is_space(0x1C));    /* isspace() in Python, not White_Space */
    CHECK(!kvp_unicode_is_space(0x200B));  /* zero width space is Cf */
    /* Unicode 15.0 and 15.1, as llama.cpp's tables (Python 3.11's 14.0 had
     * them unassigned, so punctuation to the pre-tokenizer). */
    CHECK(kvp_unicode_is_letter(0x31350));  /* CJK Ext-H (15.0) */
    CHECK(kvp_unicode_is_letter(0x323AF));
    CHECK(kvp_unicode_is_letter(0x2EBF0));  /* CJK Ext-I (15.1) */
    CHECK(kvp_unicode_is_letter(0x11F04));  /* Kawi letter A */
    CHECK(kvp_unicode_is_number(0x11F50));  /* Kawi digit zero */
    CHECK(kvp_unicode_is_number(0x1D2C0));  /* Kaktovik numeral zero (No) */
    CHECK(kvp_unicode_is_letter(0x1E4D0));  /* Nag Mundari */
    CHECK(kvp_unicode_is_number(0x1E4F0));
    CHECK(kvp_unicode_is_letter(0x1E030));  /* Cyrillic Ext-D (Lm) */
    CHECK(kvp_unicode_is_letter(0x1DF25));  /* Latin Ext-G, 15.0's additions */
    CHECK_EQ_U64(kvp_unicode_class_of(0x323B0), 0); /* past Ext-H: unassigned */
    CHECK_EQ_U64(kvp_unicode_class_of('$'), 0);     /* Sc */
    CHECK_EQ_U64(kvp_unicode_class_of(0x1F600), 0); /* emoji */
    CHECK_EQ_U64(kvp_unicode_class_of(0x0301), 0);  /* Mn */
    CHECK_EQ_U64(kvp_unicode_class_of(KVP_UNICODE_BAD), 0);
    /* \p{P}: the seven P categories, not the symbols beside them */
    CHECK_EQ_U64(kvp_unicode_class_of('!'), KVP_UNICODE_PUNCT);
    CHECK(kvp_unicode_is_punct('_'));      /* Pc */
    CHECK(kvp_unicode_is_punct('-'));      /* Pd */
    CHECK(kvp_unicode_is_punct('('));      /* Ps */
    CHECK(kvp_unicode_is_punct('}'));      /* Pe */
    CHECK(kvp_unicode_is_punct(0xAB));     /* « Pi */
    CHECK(kvp_unicode_is_punct(0x2019));   /* ’ Pf */
    CHECK(kvp_unicode_is_punct(0x3002));   /* 。 Po */
    CHECK(kvp_unicode_is_punct(0xFF01));   /* fullwidth ! */
    CHECK(kvp_unicode_is_punct(0x2E5D));   /* the last of Unicode 14.0's */
    for (const char *c = "$+<=>^`|~"; *c; c++)
        CHECK_MSG(!kvp_unicode_is_punct((uint32_t)*c), "'%c' is a symbol", *c);
    CHECK(!kvp_unicode_is_punct(0x2212));  /* minus sign: Sm */
    CHECK(!kvp_unicode_is_punct(0xA9));    /* © So */
    CHECK(!kvp_unicode_is_punct(0x00));
    CHECK(!kvp_unicode_is_punct(0x7F));
    /* added in 15.0: Devanagari Extended-A's and Kawi's punctuation
     * (llama.cpp's tables have them) */
    CHECK(kvp_unicode_is_punct(0x11B00));
    CHECK(kvp_unicode_is_punct(0x11B09));
    CHECK(kvp_unicode_is_punct(0x11F43));
    CHECK(kvp_unicode_is_punct(0x11F4F));
    CHECK(!kvp_unicode_is_punct(0x11F50)); /* Kawi digit zero */
    /* ASCII fast path agrees with the tables. */
    int bad = 0;
    for (uint32_t c = 0; c < 0x80; c++) {
        int want = 0;
        for (size_t i = 0; i < kvp_unicode_letter_count; i++)
            want |= c >= kvp_unicode_letter[i].lo && c <= kvp_unicode_letter[i].hi ? KVP_UNICODE_LETTER : 0;
        for (size_t i = 0; i < kvp_unicode_number_count; i++)
            want |= c >= kvp_unicode_number[i].lo && c <= kvp_unicode_number[i].hi ? KVP_UNICODE_NUMBER : 0;
        for (size_t i = 0; i < kvp_unicode_space_count; i++)
            want |= c >= kvp_unicode_space[i].lo && c <= kvp_unicode_space[i].hi ? KVP_UNICODE_SPACE : 0;
        for (size_t i = 0; i < kvp_unicode_punct_count; i++)
            want |= c >= kvp_unicode_punct[i].lo && c <= kvp_unicode_punct[i].hi ? KVP_UNICODE_PUNCT : 0;
        bad += want != kvp_unicode_class_of(c);
    }
    CHECK_EQ_U64(bad, 0);
}

static void check_sorted(const kvp_unicode_range *r, size_t n)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += r[i].lo > r[i].hi || r[i].hi > 0x10FFFF || (i && r[i].lo <= r[i - 1].hi);
    CHECK_EQ_U64(bad, 0);
}

static uint64_t count_points(const kvp_unicode_range *r, size_t n)
{
    uint64_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += r[i].hi - r[i].lo + 1;
    return k;
}

int main(void)
{
    test_roundtrip_all();
    test_invalid();
    test_complete_prefix();
    test_valid_prefix();
    test_classes();
    check_sorted(kvp_unicode_letter, kvp_unicode_letter_count);
    check_sorted(kvp_unicode_number, kvp_unicode_number_count);
    check_sorted(kvp_unicode_space, kvp_unicode_space_count);
    check_sorted(kvp_unicode_punct, kvp_unicode_punct_count);
    /* Unicode 15.1.0 has 842 characters in P (unicodedata2 15.1.0; 819 in 14.0) */
    CHECK_EQ_U64(count_points(kvp_unicode_punct, kvp_unicode_punct_count), 842);
    return unit_done();
}
