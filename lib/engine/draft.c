/* draft.c - prompt-lookup (n-gram) drafting. */
#include "draft.h"

#include <string.h>

/* How far back a match is followed to rank occurrences of the same
 * n-gram (KVP_NGRAM_RANK tokens at most, the n-gram included). */
#define KVP_NGRAM_RANK 16

/* Tokens before position `end` of the occurrence ending there that equal
 * those before n (the sequence's end), up to `most`. */
static uint32_t match_back(const uint32_t *t, uint32_t end, uint32_t n, uint32_t most)
{
    uint32_t L = 0;
    while (L < most && L < end && t[end - 1 - L] == t[n - 1 - L])
        L++;
    return L;
}

/* Of the earlier occurrences of the last g tokens, the one whose match
 * runs furthest back (the latest of those): a quote or an edited line of
 * code repeats its prompt's text word for word, and the occurrence that
 * shares more context with where the text stands is the one it is
 * copying, where the latest occurrence of a short n-gram ("the", a
 * bracket) is often some other place.  The position after it, or 0. */
static uint32_t best_occurrence(const uint32_t *t, uint32_t n, uint32_t g)
{
    const uint32_t *key = t + n - g;
    uint32_t best = 0, best_len = 0;
    for (uint32_t i = n - g; i-- > 0;) {
        if (t[i] != key[0] || memcmp(t + i, key, g * sizeof *t) != 0)
            continue;
        uint32_t L = match_back(t, i + g, n, KVP_NGRAM_RANK);
        if (L > best_len)
            best = i + g, best_len = L;
        if (best_len == KVP_NGRAM_RANK)
            break; /* nothing earlier can match further */
    }
    return best;
}

uint32_t kvp_ngram_draft(void *ctx, void **state, const uint32_t *t, uint32_t n, uint32_t k, uint32_t *out)
{
    (void)state; /* a function of the tokens alone */
    const kvp_ngram_drafter *d = ctx;
    if (k > KVP_DRAFT_MAX)
        k = KVP_DRAFT_MAX;
    for (uint32_t g = d->max_n; g >= d->min_n && g >= 1; g--) {
        if (g >= n)
            continue;
        uint32_t from = best_occurrence(t, n, g);
        if (!from)
            continue;
        uint32_t m = n - from < k ? n - from : k;
        memcpy(out, t + from, m * sizeof *t);
        return m;
    }
    return 0;
}
