/* fuzz_nfc.c - libFuzzer harness: kvp_unicode_nfc on arbitrary bytes (a
 * tokenizer with an NFC normalizer runs it on every prompt).  Beyond no
 * crash, leak or undefined behaviour it checks what unicode.h promises:
 * valid UTF-8 in gives valid UTF-8 out; each byte that is not valid UTF-8
 * is kept (as many bad bytes out as in); NFC of the output is the output
 * itself (idempotence, for valid and invalid input alike); and the output
 * is at most three times the input's length (UAX #15's bound for NFC in
 * UTF-8). */
#include "unicode.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Bytes of s[0..n) that are not valid UTF-8, by kvp_unicode_decode. */
static size_t bad_bytes(const char *s, size_t n)
{
    size_t bad = 0;
    uint32_t cp;
    for (size_t i = 0; i < n;) {
        i += kvp_unicode_decode(s + i, n - i, &cp);
        bad += cp == KVP_UNICODE_BAD;
    }
    return bad;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *s = (const char *)data;
    kvp_err err = {0};
    char *once = NULL, *twice = NULL;
    size_t n1, n2;
    if (kvp_unicode_nfc(s, size, &once, &n1, &err) != 0)
        abort(); /* only out of memory or a size no one can allocate */
    if (once[n1] != '\0' || n1 > 3 * size)
        abort();
    size_t bad = bad_bytes(s, size);
    if (bad_bytes(once, n1) != bad)
        abort();
    if (bad == 0 && kvp_unicode_valid_prefix(once, n1) != n1)
        abort();
    if (kvp_unicode_nfc(once, n1, &twice, &n2, &err) != 0)
        abort();
    if (n2 != n1 || memcmp(once, twice, n1) != 0)
        abort();
    free(once);
    free(twice);
    return 0;
}
