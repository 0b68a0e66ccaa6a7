/* draft.c - prompt-lookup (n-gram) drafting. */
#include "draft.h"

#include <string.h>

uint32_t kvp_ngram_draft(void *ctx, void **state, const uint32_t *t, uint32_t n, uint32_t k, uint32_t *out)
{
    (void)state; /* a function of the tokens alone */
    const kvp_ngram_drafter *d = ctx;
    if (k > KVP_DRAFT_MAX)
        k = KVP_DRAFT_MAX;
    for (uint32_t g = d->max_n; g >= d->min_n && g >= 1; g--) {
        if (g >= n)
            continue;
        const uint32_t *key = t + n - g;
        /* Latest earlier occurrence first: what the text did most recently
         * is the best guess of what it does now. */
        for (uint32_t i = n - g; i-- > 0;) {
            if (t[i] != key[0] || memcmp(t + i, key, g * sizeof *t) != 0)
                continue;
            uint32_t from = i + g, m = n - from < k ? n - from : k;
            memcpy(out, t + from, m * sizeof *t);
            return m;
        }
    }
    return 0;
}
