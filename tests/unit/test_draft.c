/* test_draft.c - prompt-lookup drafting (lib/engine/draft.c). */
#include "draft.h"
#include "unit.h"

#include <string.h>

static uint32_t draft(uint32_t min_n, uint32_t max_n, const uint32_t *t, uint32_t n, uint32_t k, uint32_t *out)
{
    kvp_ngram_drafter d = {.min_n = min_n, .max_n = max_n};
    return kvp_ngram_draft(&d, NULL, t, n, k, out);
}

int main(void)
{
    uint32_t out[KVP_DRAFT_MAX + 4];
    /* "a b c d e ... a b" -> the longest n-gram (a b) found: c d e follow */
    uint32_t t1[] = {1, 2, 3, 4, 5, 9, 9, 1, 2};
    uint32_t m = draft(1, 3, t1, 9, 3, out);
    CHECK(m == 3 && out[0] == 3 && out[1] == 4 && out[2] == 5);
    /* k bounds the draft, and so does the end of the sequence */
    CHECK(draft(1, 3, t1, 9, 1, out) == 1 && out[0] == 3);
    uint32_t t2[] = {7, 8, 7};
    CHECK(draft(1, 3, t2, 3, 5, out) == 2 && out[0] == 8 && out[1] == 7);
    /* the latest earlier occurrence wins */
    uint32_t t3[] = {5, 1, 5, 2, 5};
    CHECK(draft(1, 1, t3, 5, 1, out) == 1 && out[0] == 2);
    /* a longer n-gram is preferred to a later shorter one: "3 5" occurred
     * once (then 6), "5" alone last before 7 */
    uint32_t t4[] = {3, 5, 6, 5, 7, 3, 5};
    CHECK(draft(1, 2, t4, 7, 1, out) == 1 && out[0] == 6);
    /* with n-grams of 1 the same: "5" occurs twice, and the first
     * occurrence's context ("3 5") matches the end's further back */
    CHECK(draft(1, 1, t4, 7, 1, out) == 1 && out[0] == 6);
    /* of two occurrences of the n-gram "5 6", the earlier one shares more
     * context ("4 5 6") with the end, so its continuation (7) wins over the
     * latest's (8); with equal context the latest still wins */
    uint32_t t8[] = {4, 5, 6, 7, 1, 5, 6, 8, 4, 5, 6};
    CHECK(draft(1, 2, t8, 11, 1, out) == 1 && out[0] == 7);
    uint32_t t9[] = {1, 5, 6, 7, 1, 5, 6, 8, 4, 5, 6};
    CHECK(draft(1, 2, t9, 11, 1, out) == 1 && out[0] == 8);
    /* the context that ranks them runs past max_n (up to 16 tokens): the
     * earlier "20 21 22" follows ten tokens the end also has, the later
     * one four of them */
    uint32_t t10[] = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 1, 9, 9, 16, 17, 18, 19, 20, 21, 22, 2,
                      10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22};
    uint32_t n10 = sizeof t10 / sizeof *t10;
    CHECK(draft(1, 3, t10, n10, 2, out) == 2 && out[0] == 1 && out[1] == 9);
    /* nothing matches: no draft; n-grams shorter than min_n are not tried */
    uint32_t t5[] = {1, 2, 3, 4};
    CHECK(draft(1, 3, t5, 4, 4, out) == 0);
    uint32_t t6[] = {1, 2, 9, 2};
    CHECK(draft(1, 3, t6, 4, 2, out) == 2 && out[0] == 9 && out[1] == 2);
    CHECK(draft(2, 3, t6, 4, 2, out) == 0);
    /* too short to hold an n-gram and a match */
    CHECK(draft(1, 3, t6, 1, 2, out) == 0);
    CHECK(draft(1, 3, t6, 0, 2, out) == 0);
    /* k is capped at KVP_DRAFT_MAX */
    uint32_t t7[60];
    for (uint32_t i = 0; i < 60; i++)
        t7[i] = i % 25;
    m = draft(1, 3, t7, 60, 100, out);
    CHECK(m == KVP_DRAFT_MAX && out[0] == 10);
    return unit_done();
}
