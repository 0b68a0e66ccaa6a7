/* unicode.c - UTF-8 decoding, character classes and NFC (see unicode.h). */
#include "unicode.h"

#include <stdlib.h>
#include <string.h>

size_t kvp_unicode_decode(const char *s, size_t n, uint32_t *cp)
{
    const uint8_t *b = (const uint8_t *)s;
    uint32_t c = b[0];
    size_t len;
    uint32_t min;
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2, min = 0x80, c &= 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3, min = 0x800, c &= 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4, min = 0x10000, c &= 0x07;
    } else {
        *cp = KVP_UNICODE_BAD;
        return 1;
    }
    if (n < len) {
        *cp = KVP_UNICODE_BAD;
        return 1;
    }
    for (size_t i = 1; i < len; i++) {
        if ((b[i] & 0xC0) != 0x80) {
            *cp = KVP_UNICODE_BAD;
            return 1;
        }
        c = c << 6 | (b[i] & 0x3F);
    }
    /* Overlong forms, surrogates and values past U+10FFFF are not characters. */
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) {
        *cp = KVP_UNICODE_BAD;
        return 1;
    }
    *cp = c;
    return len;
}

size_t kvp_unicode_valid_prefix(const char *s, size_t n)
{
    size_t i = 0;
    uint32_t cp;
    while (i < n) {
        size_t k = kvp_unicode_decode(s + i, n - i, &cp);
        if (cp == KVP_UNICODE_BAD)
            return i;
        i += k;
    }
    return n;
}

size_t kvp_unicode_encode(uint32_t cp, char out[4])
{
    uint8_t *o = (uint8_t *)out;
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | cp >> 6);
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp >= 0xD800 && cp <= 0xDFFF)
        return 0;
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | cp >> 12);
        o[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    if (cp <= 0x10FFFF) {
        o[0] = (uint8_t)(0xF0 | cp >> 18);
        o[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        o[3] = (uint8_t)(0x80 | (cp & 0x3F));
        return 4;
    }
    return 0;
}

/* Could the k bytes at b (k < their declared length) still become a valid
 * sequence?  Checks the lead byte and the second byte's narrowed range. */
static int unicode_valid_start(const uint8_t *b, size_t k, size_t *need)
{
    uint8_t c = b[0];
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        *need = 2;
    else if (c >= 0xE0 && c <= 0xEF)
        *need = 3;
    else if (c >= 0xF0 && c <= 0xF4)
        *need = 4;
    else
        return 0;
    if (c == 0xE0)
        lo = 0xA0;
    else if (c == 0xED)
        hi = 0x9F;
    else if (c == 0xF0)
        lo = 0x90;
    else if (c == 0xF4)
        hi = 0x8F;
    if (k >= 2 && (b[1] < lo || b[1] > hi))
        return 0;
    for (size_t i = 2; i < k; i++)
        if ((b[i] & 0xC0) != 0x80)
            return 0;
    return k < *need;
}

size_t kvp_unicode_complete_prefix(const char *s, size_t n)
{
    const uint8_t *b = (const uint8_t *)s;
    /* Only the last 3 bytes can hold the start of an unfinished character. */
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        size_t i = n - back, need;
        if ((b[i] & 0xC0) == 0x80)
            continue;
        if (b[i] >= 0xC0 && unicode_valid_start(b + i, back, &need))
            return i;
        return n;
    }
    return n;
}

static int unicode_in(const kvp_unicode_range *r, size_t n, uint32_t cp)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < r[mid].lo)
            hi = mid;
        else if (cp > r[mid].hi)
            lo = mid + 1;
        else
            return 1;
    }
    return 0;
}

int kvp_unicode_class_of(uint32_t cp)
{
    if (cp < 0x80) {
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z')
            return KVP_UNICODE_LETTER;
        if (cp >= '0' && cp <= '9')
            return KVP_UNICODE_NUMBER;
        if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D))
            return KVP_UNICODE_SPACE;
        /* the printable rest, less the symbols $ + < = > ^ ` | ~ */
        if (cp > ' ' && cp < 0x7F && !strchr("$+<=>^`|~", (int)cp))
            return KVP_UNICODE_PUNCT;
        return 0;
    }
    if (cp > 0x10FFFF)
        return 0;
    if (unicode_in(kvp_unicode_letter, kvp_unicode_letter_count, cp))
        return KVP_UNICODE_LETTER;
    if (unicode_in(kvp_unicode_number, kvp_unicode_number_count, cp))
        return KVP_UNICODE_NUMBER;
    if (unicode_in(kvp_unicode_space, kvp_unicode_space_count, cp))
        return KVP_UNICODE_SPACE;
    if (unicode_in(kvp_unicode_punct, kvp_unicode_punct_count, cp))
        return KVP_UNICODE_PUNCT;
    return 0;
}

/* ---- NFC ---- */

/* Hangul syllables (The Unicode Standard, 3.12): S = SBASE + (L * VCOUNT + V)
 * * TCOUNT + T, with T 0 for a syllable of two jamo. */
enum {
    UNICODE_SBASE = 0xAC00,
    UNICODE_LBASE = 0x1100,
    UNICODE_VBASE = 0x1161,
    UNICODE_TBASE = 0x11A7, /* T 0 is "no trailing consonant": jamo start at TBASE + 1 */
    UNICODE_LCOUNT = 19,
    UNICODE_VCOUNT = 21,
    UNICODE_TCOUNT = 28,
    UNICODE_SCOUNT = UNICODE_LCOUNT * UNICODE_VCOUNT * UNICODE_TCOUNT,
};

/* In the code point buffer, a byte that is not valid UTF-8: above every
 * code point, so no table holds it, and written back as the byte. */
#define UNICODE_RAW 0x80000000u

int kvp_unicode_ccc(uint32_t cp)
{
    size_t lo = 0, hi = kvp_unicode_ccc_range_count;
    if (cp < 0x300) /* the first mark */
        return 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < kvp_unicode_ccc_ranges[mid].lo)
            hi = mid;
        else if (cp > kvp_unicode_ccc_ranges[mid].hi)
            lo = mid + 1;
        else
            return kvp_unicode_ccc_ranges[mid].ccc;
    }
    return 0;
}

static const kvp_unicode_decomp *unicode_find_decomp(uint32_t cp)
{
    size_t lo = 0, hi = kvp_unicode_decomp_count;
    if (cp < 0xC0) /* the first decomposable character, U+00C0 */
        return NULL;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < kvp_unicode_decomps[mid].cp)
            hi = mid;
        else if (cp > kvp_unicode_decomps[mid].cp)
            lo = mid + 1;
        else
            return &kvp_unicode_decomps[mid];
    }
    return NULL;
}

/* Full canonical decomposition of cp into out (room for
 * KVP_UNICODE_DECOMP_MAX); returns how many code points. */
static size_t unicode_decompose(uint32_t cp, uint32_t *out)
{
    if (cp - UNICODE_SBASE < UNICODE_SCOUNT) {
        uint32_t i = cp - UNICODE_SBASE, t = i % UNICODE_TCOUNT;
        out[0] = UNICODE_LBASE + i / (UNICODE_VCOUNT * UNICODE_TCOUNT);
        out[1] = UNICODE_VBASE + i % (UNICODE_VCOUNT * UNICODE_TCOUNT) / UNICODE_TCOUNT;
        if (!t)
            return 2;
        out[2] = UNICODE_TBASE + t;
        return 3;
    }
    const kvp_unicode_decomp *d = unicode_find_decomp(cp);
    if (!d) {
        out[0] = cp;
        return 1;
    }
    /* The first part may decompose again (U+1E08 -> U+00C7 U+0301 ->
     * C U+0327 U+0301); the second is a mark or, for a few starter pairs,
     * a character that may too. */
    size_t k = unicode_decompose(d->first, out);
    if (d->second)
        k += unicode_decompose(d->second, out + k);
    return k;
}

/* The primary composite of first and second, 0 when there is none. */
static uint32_t unicode_compose(uint32_t first, uint32_t second)
{
    if (first - UNICODE_LBASE < UNICODE_LCOUNT && second - UNICODE_VBASE < UNICODE_VCOUNT)
        return UNICODE_SBASE + ((first - UNICODE_LBASE) * UNICODE_VCOUNT + (second - UNICODE_VBASE)) * UNICODE_TCOUNT;
    if (first - UNICODE_SBASE < UNICODE_SCOUNT && (first - UNICODE_SBASE) % UNICODE_TCOUNT == 0 &&
        second - (UNICODE_TBASE + 1) < UNICODE_TCOUNT - 1)
        return first + (second - UNICODE_TBASE);
    size_t lo = 0, hi = kvp_unicode_pair_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const kvp_unicode_pair *p = &kvp_unicode_pairs[mid];
        if (first < p->first || (first == p->first && second < p->second))
            hi = mid;
        else if (first > p->first || second > p->second)
            lo = mid + 1;
        else
            return p->composite;
    }
    return 0;
}

/* Decode and decompose s[0..n) into cp (NULL: only count); returns the
 * number of code points. */
static size_t unicode_nfd_fill(const char *s, size_t n, uint32_t *cp)
{
    size_t m = 0;
    uint32_t c, part[KVP_UNICODE_DECOMP_MAX];
    for (size_t i = 0; i < n;) {
        size_t len = kvp_unicode_decode(s + i, n - i, &c), k = 1;
        if (c == KVP_UNICODE_BAD)
            part[0] = UNICODE_RAW | (uint8_t)s[i];
        else
            k = unicode_decompose(c, part);
        i += len;
        if (cp)
            memcpy(cp + m, part, k * sizeof *part);
        m += k;
    }
    return m;
}

/* Stable sort of cp[0..n) by cc (a run of non-starters): insertion for the
 * short runs of real text, counting through tmp for long ones so that a run
 * of a million marks costs no more than its length. */
static void unicode_sort_run(uint32_t *cp, uint8_t *cc, size_t n, uint32_t *tmp)
{
    if (n <= 32) {
        for (size_t i = 1; i < n; i++) {
            uint32_t c = cp[i];
            uint8_t k = cc[i];
            size_t j = i;
            for (; j > 0 && cc[j - 1] > k; j--) {
                cp[j] = cp[j - 1];
                cc[j] = cc[j - 1];
            }
            cp[j] = c;
            cc[j] = k;
        }
        return;
    }
    size_t count[256] = {0}, at[256];
    for (size_t i = 0; i < n; i++)
        count[cc[i]]++;
    at[0] = 0;
    for (size_t k = 1; k < 256; k++)
        at[k] = at[k - 1] + count[k - 1];
    for (size_t i = 0; i < n; i++)
        tmp[at[cc[i]]++] = cp[i];
    memcpy(cp, tmp, n * sizeof *cp);
    for (size_t k = 0, i = 0; k < 256; k++)
        for (size_t c = 0; c < count[k]; c++)
            cc[i++] = (uint8_t)k;
}

/* Canonical composition of cp[0..n) in place (canonically ordered, cc their
 * classes); returns the new length.  A character joins the last starter
 * when nothing between them blocks it: nothing at all, or only marks of a
 * lower class than its own. */
static size_t unicode_compose_all(uint32_t *cp, uint8_t *cc, size_t n)
{
    size_t w = 0, starter = SIZE_MAX;
    uint8_t last = 0; /* the class of cp[w - 1] */
    for (size_t r = 0; r < n; r++) {
        uint32_t c = cp[r];
        uint8_t k = cc[r];
        if (starter != SIZE_MAX && (w - 1 == starter || (last != 0 && last < k))) {
            uint32_t comp = unicode_compose(cp[starter], c);
            if (comp) { /* a composite of a starter is a starter: cc[starter] stays 0 */
                cp[starter] = comp;
                continue;
            }
        }
        if (k == 0)
            starter = w;
        cp[w] = c;
        cc[w] = k;
        w++;
        last = k;
    }
    return w;
}

int kvp_unicode_nfc(const char *s, size_t n, char **out, size_t *out_n, kvp_err *err)
{
    *out = NULL;
    *out_n = 0;
    size_t ascii = 0;
    while (ascii < n && (uint8_t)s[ascii] < 0x80)
        ascii++;
    if (ascii == n) { /* ASCII is its own NFC */
        char *o = malloc(n + 1);
        if (!o)
            return kvp_err_set(err, KVP_ENOMEM, "NFC of %zu bytes: out of memory", n);
        memcpy(o, s, n);
        o[n] = '\0';
        *out = o;
        *out_n = n;
        return 0;
    }
    /* A byte decodes to at most KVP_UNICODE_DECOMP_MAX code points; the
     * largest buffer holds 8 bytes for each (the code point and the sort's
     * scratch). */
    if (n > SIZE_MAX / (KVP_UNICODE_DECOMP_MAX * 8))
        return kvp_err_set(err, KVP_ELIMIT, "NFC of %zu bytes: too long", n);
    size_t m = unicode_nfd_fill(s, n, NULL);
    uint32_t *cp = malloc(2 * m * sizeof *cp);
    uint8_t *cc = malloc(m);
    char *o = malloc(4 * m + 1);
    if (!cp || !cc || !o) {
        free(cp);
        free(cc);
        free(o);
        return kvp_err_set(err, KVP_ENOMEM, "NFC of %zu bytes: out of memory", n);
    }
    unicode_nfd_fill(s, n, cp);
    for (size_t i = 0; i < m; i++)
        cc[i] = (uint8_t)kvp_unicode_ccc(cp[i]);
    for (size_t i = 0; i < m;) {
        size_t j = i;
        while (j < m && cc[j])
            j++;
        unicode_sort_run(cp + i, cc + i, j - i, cp + m);
        i = j + 1;
    }
    m = unicode_compose_all(cp, cc, m);
    size_t len = 0;
    for (size_t i = 0; i < m; i++) {
        if (cp[i] & UNICODE_RAW)
            o[len++] = (char)(cp[i] & 0xFF);
        else
            len += kvp_unicode_encode(cp[i], o + len);
    }
    o[len] = '\0';
    free(cp);
    free(cc);
    *out = o;
    *out_n = len;
    return 0;
}

size_t kvp_unicode_escape_char(const char *s, size_t n, int quote, char out[KVP_UNICODE_ESCAPE_MAX], size_t *out_len)
{
    unsigned c = (unsigned char)s[0];
    uint32_t cp;
    size_t len = kvp_unicode_decode(s, n, &cp);
    if (cp == KVP_UNICODE_BAD || c < 0x20 || c == 0x7f) {
        static const char hex[] = "0123456789abcdef";
        const char *named = c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r" : NULL;
        if (named) {
            memcpy(out, named, 2);
            *out_len = 2;
        } else {
            out[0] = '\\', out[1] = 'x', out[2] = hex[c >> 4], out[3] = hex[c & 15];
            *out_len = 4;
        }
        return 1;
    }
    if (c == '\\' || (quote && c == (unsigned)quote)) {
        out[0] = '\\', out[1] = (char)c;
        *out_len = 2;
        return 1;
    }
    memcpy(out, s, len); /* a character of 1 to 4 bytes */
    *out_len = len;
    return len;
}

const char *kvp_unicode_escape(char *buf, size_t size, const char *s, int quote)
{
    /* a message's room is KVP_ERR_MSG_MAX: an id of 255 newlines (1,020
     * bytes escaped) would push out what the message is there to say */
    size_t n = strlen(s), o = 0, room = size - 1 < KVP_UNICODE_SHOWN_MAX ? size - 1 : KVP_UNICODE_SHOWN_MAX;
    size_t cut = room >= 4 ? room - 3 : room; /* where "..." goes when it does not all fit */
    size_t at_cut = 0, i = 0;
    while (i < n) {
        char e[KVP_UNICODE_ESCAPE_MAX];
        size_t el;
        size_t took = kvp_unicode_escape_char(s + i, n - i, quote, e, &el);
        if (o + el > room)
            break;
        memcpy(buf + o, e, el);
        o += el;
        i += took;
        if (o <= cut)
            at_cut = o;
    }
    if (i < n && room >= 4) { /* cut short: said, at a whole escape */
        memcpy(buf + at_cut, "...", 3);
        o = at_cut + 3;
    } else if (i < n) {
        o = at_cut;
    }
    buf[o] = 0;
    return buf;
}
