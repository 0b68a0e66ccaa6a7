/* fuzz_heads.c - libFuzzer harness: Medusa heads files (heads.h), read
 * from memory.  Errors are the expected outcome; a crash, a leak, a
 * refusal without a message, or heads accepted that break the loader's
 * promises (shape in range, every value finite, each head usable by
 * kvp_heads_apply, a round trip through the writer giving the same
 * values) is a bug. */
#define _POSIX_C_SOURCE 200809L
#include "heads.h"
#include "io.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "scratch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Accepted heads: in range, finite, and a forward pass reads every weight. */
static void check_heads(const kvp_heads *h)
{
    if (h->n_heads < 1 || h->n_heads > KVP_HEADS_MAX || h->n_embd < 1 || !h->w1 || !h->b1)
        __builtin_trap();
    size_t d = h->n_embd;
    for (size_t i = 0; i < h->n_heads * d * d; i++)
        if (!isfinite(h->w1[i]))
            __builtin_trap();
    float *x = calloc(d, sizeof *x), *z = malloc(d * sizeof *z);
    if (!x || !z)
        abort();
    for (uint32_t k = 0; k < h->n_heads; k++)
        kvp_heads_apply(h, k, x, z, NULL);
    free(x);
    free(z);
}

/* What was accepted is written and read back the same. */
static void round_trip(const kvp_heads *h)
{
    const char *path = fuzz_scratch_write((const uint8_t *)"", 0, "heads");
    kvp_err err = {0};
    kvp_heads back;
    if (kvp_heads_write(h, path, "fuzz", &err) || kvp_heads_read(&back, path, &err))
        __builtin_trap();
    size_t d = h->n_embd;
    if (back.n_heads != h->n_heads || back.n_embd != h->n_embd ||
        memcmp(back.w1, h->w1, h->n_heads * d * d * sizeof(float)) ||
        memcmp(back.b1, h->b1, h->n_heads * d * sizeof(float)) ||
        memcmp(back.fingerprint, h->fingerprint, sizeof h->fingerprint))
        __builtin_trap();
    kvp_heads_free(&back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvp_in in;
    kvp_in_from_memory(&in, data, size, "<fuzz>");
    kvp_err err = {0};
    kvp_heads h;
    int rc = kvp_heads_load(&h, &in, "<fuzz>", &err);
    if (rc) {
        if (rc > 0 || !err.msg[0] || h.w1 || h.b1)
            __builtin_trap();
        return 0;
    }
    check_heads(&h);
    if (h.n_heads * (size_t)h.n_embd * h.n_embd <= (1u << 16)) /* small ones: the writer too */
        round_trip(&h);
    kvp_heads_free(&h);
    return 0;
}
