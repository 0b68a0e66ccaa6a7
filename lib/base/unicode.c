/* unicode.c - UTF-8 decoding and character classes (see unicode.h). */
#include "unicode.h"

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
    return 0;
}
