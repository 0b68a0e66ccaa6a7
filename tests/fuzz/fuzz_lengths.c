/* fuzz_lengths.c - libFuzzer harness: kvcalc --lengths SPEC
 * (kvp_cap_lengths_parse).  An input whose first byte is 'D' is the rest as
 * a distribution spec ("uniform:A:B", "normal:MEAN:SD", "lognormal:MU:SIGMA";
 * anything else there would be a path, so it is skipped); any other input is
 * a lengths file (whitespace-separated positive integers, '#' comments),
 * written to one scratch file.  A refusal must be a negative code with a
 * message and no list; an acceptance must hold the ranges the parser
 * promises, and lengths drawn from it must lie in 1..max_len (a file's in
 * its order, cyclically). */
#define _POSIX_C_SOURCE 200809L
#include "capacity.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "scratch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_accepted(const kvp_cap_lengths *d, const uint8_t *data, size_t size)
{
    switch (d->kind) {
    case KVP_CAP_DIST_LIST:
        if (!d->list || d->n_list == 0 || d->n_list > KVP_CAP_LENGTHS_MAX || d->n_list > size)
            abort();
        for (size_t i = 0; i < d->n_list; i++)
            if (d->list[i] == 0)
                abort();
        break;
    case KVP_CAP_DIST_UNIFORM:
        if (!(d->a >= 1 && d->a <= d->b && d->b <= 4294967295.0))
            abort();
        break;
    case KVP_CAP_DIST_NORMAL:
    case KVP_CAP_DIST_LOGNORMAL:
        if (!isfinite(d->a) || !isfinite(d->b) || d->b < 0)
            abort();
        break;
    default:
        abort();
    }
    /* a max_len from the input's own bytes, so small and large ones both come */
    uint64_t max_len = 1 + (size ? data[size - 1] : 0) * (size > 1 ? (uint64_t)data[size - 2] << 16 : 1);
    kvp_cap_rng r;
    kvp_cap_rng_seed(&r, size);
    for (uint64_t i = 0; i < 64; i++) {
        uint64_t v = kvp_cap_lengths_draw(d, &r, i, max_len);
        if (v < 1 || v > max_len)
            abort();
        if (d->kind == KVP_CAP_DIST_LIST) {
            uint64_t want = d->list[i % d->n_list];
            if (v != (want < max_len ? want : max_len))
                abort();
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const dists[] = {"uniform:", "normal:", "lognormal:"};
    kvp_cap_lengths d;
    kvp_err err = {0};
    int rc;
    if (size && data[0] == 'D') {
        char *spec = malloc(size);
        if (!spec)
            abort();
        memcpy(spec, data + 1, size - 1);
        spec[size - 1] = 0;
        int known = 0;
        for (size_t i = 0; i < sizeof dists / sizeof dists[0]; i++)
            known |= strncmp(spec, dists[i], strlen(dists[i])) == 0;
        if (!known) { /* a path: not the fuzzer's to pick */
            free(spec);
            return 0;
        }
        rc = kvp_cap_lengths_parse(&d, spec, &err);
        free(spec);
    } else {
        rc = kvp_cap_lengths_parse(&d, fuzz_scratch_write(data, size, "lengths"), &err);
    }
    if (rc > 0)
        abort();
    if (rc < 0) {
        if (!err.msg[0] || d.list)
            abort();
        return 0;
    }
    check_accepted(&d, data, size);
    kvp_cap_lengths_free(&d);
    return 0;
}
