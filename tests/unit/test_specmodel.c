/* test_specmodel.c - speculative decoding's cost model (specmodel.h): the
 * histogram of drafts kept, the predicted time and speedup (against
 * Leviathan et al.'s closed form where the two must agree), the
 * recommendation and the median. */
#include "unit.h"
#include "specmodel.h"

#include <math.h>

/* k drafts on every one of n steps, draft j kept on accepted_at[j] of them. */
static kvp_spec_counts full_drafts(uint32_t k, uint64_t n, const uint64_t *accepted_at)
{
    kvp_spec_counts c = {.k = k, .primed = 1, .steps = n, .calls = n, .verify_steps = n};
    for (uint32_t j = 0; j < k; j++) {
        c.drafted_at[j] = n;
        c.accepted_at[j] = accepted_at[j];
        c.accepted += accepted_at[j];
    }
    return c;
}

static void test_histogram(void)
{
    uint64_t h[KVP_DRAFT_MAX + 1];
    kvp_spec_counts c = full_drafts(4, 10, (const uint64_t[]){7, 5, 2, 1});
    kvp_spec_histogram(&c, h);
    CHECK(h[0] == 3 && h[1] == 2 && h[2] == 3 && h[3] == 1 && h[4] == 1);
    uint64_t sum = 0, kept = 0;
    for (uint32_t m = 0; m <= 4; m++) {
        sum += h[m];
        kept += m * h[m];
    }
    CHECK_EQ_U64(sum, c.verify_steps);
    CHECK_EQ_U64(kept, c.accepted); /* the histogram's mean is the mean kept */
    /* every draft kept: all steps at k */
    c = full_drafts(3, 5, (const uint64_t[]){5, 5, 5});
    kvp_spec_histogram(&c, h);
    CHECK(h[0] == 0 && h[1] == 0 && h[2] == 0 && h[3] == 5);
    /* none kept */
    c = full_drafts(1, 6, (const uint64_t[]){0});
    kvp_spec_histogram(&c, h);
    CHECK(h[0] == 6 && h[1] == 0);
    /* the longest draft length */
    uint64_t all[KVP_DRAFT_MAX];
    for (uint32_t j = 0; j < KVP_DRAFT_MAX; j++)
        all[j] = KVP_DRAFT_MAX - j;
    c = full_drafts(KVP_DRAFT_MAX, KVP_DRAFT_MAX + 1, all);
    kvp_spec_histogram(&c, h);
    for (uint32_t m = 0; m <= KVP_DRAFT_MAX; m++)
        CHECK_EQ_U64(h[m], 1);
}

static void test_predict(void)
{
    /* Leviathan's worked example: alpha 0.8, k 4, c 0.05, a verify step as
     * dear as a plain one: E = (1 - a^5) / (1 - a) = 3.3616, S = E / (1 + 4c) */
    kvp_spec_counts c = full_drafts(4, 10000, (const uint64_t[]){8000, 6400, 5120, 4096});
    kvp_spec_costs t = {.call = 4 * 0.05};
    for (uint32_t j = 1; j <= 5; j++)
        t.step[j] = 1;
    CHECK_NEAR(kvp_spec_tokens_per_step(&c), 3.3616, 1e-12);
    CHECK_NEAR(kvp_spec_predict_speedup(&c, &t), 3.3616 / 1.2, 1e-12);
    /* on a CPU the verify step costs v(k) steps: S = E / (k c + v) */
    t.step[5] = 2.5;
    CHECK_NEAR(kvp_spec_predict_speedup(&c, &t), 3.3616 / (0.2 + 2.5), 1e-12);
    /* a request's first call feeds the prompt: once a request that drafted */
    c.primed = 4;
    t.prime = 10;
    CHECK_NEAR(kvp_spec_seconds(&c, &t), 10000 * 2.7 + 40, 1e-9);
    CHECK_NEAR(kvp_spec_plain_seconds(&c, &t), 33616, 1e-9);

    /* a drafter that never guesses: each step pays its call for nothing */
    kvp_spec_counts none = {.k = 4, .primed = 1, .steps = 50, .calls = 50};
    kvp_spec_costs u = {.step = {0, 0.010, 0.012, 0.013, 0.014, 0.015}, .call = 0.001};
    CHECK_NEAR(kvp_spec_predict_speedup(&none, &u), 0.010 / 0.011, 1e-12);
    /* prompt lookup: 10 steps got nothing, 6 got 4 drafts, 4 got 2; the
     * budget's last step asked for none */
    kvp_spec_counts pl = {.k = 4, .primed = 1, .steps = 21, .calls = 20, .verify_steps = 10,
                          .drafted_at = {10, 10, 6, 6}, .accepted_at = {8, 5, 2, 1}, .accepted = 16};
    double want = 20 * 0.001 + 11 * 0.010 + 4 * 0.013 + 6 * 0.015;
    CHECK_NEAR(kvp_spec_seconds(&pl, &u), want, 1e-12);
    CHECK_NEAR(kvp_spec_predict_speedup(&pl, &u), 37 * 0.010 / want, 1e-12);
    /* requests whose budget ended at their first decode step: the drafter
     * never called, no prompt fed, nothing paid but plain steps */
    kvp_spec_counts never = {.k = 2, .steps = 3};
    kvp_spec_costs dear = {.step = {0, 0.010, 0.012, 0.013}, .call = 0.004, .prime = 0.050};
    CHECK_NEAR(kvp_spec_seconds(&never, &dear), 3 * 0.010, 1e-12);
    CHECK_NEAR(kvp_spec_predict_speedup(&never, &dear), 1, 1e-12);
    /* nothing to predict from */
    kvp_spec_counts empty = {.k = 2};
    CHECK(kvp_spec_predict_speedup(&empty, &u) == 0);
    CHECK(kvp_spec_tokens_per_step(&empty) == 1);
    kvp_spec_costs unmeasured = {0};
    CHECK(kvp_spec_predict_speedup(&pl, &unmeasured) == 0);
}

static void test_recommend(void)
{
    CHECK(kvp_spec_recommend((const double[]){0.9, 1.3, 1.3, 1.1}, 4, 1.05) == 1);
    CHECK(kvp_spec_recommend((const double[]){0.9, 1.02, 1.05}, 3, 1.05) == -1);
    CHECK(kvp_spec_recommend((const double[]){1.2, 0, 1.4}, 3, 1.05) == 2);
    CHECK(kvp_spec_recommend(NULL, 0, 1.05) == -1);
    CHECK(kvp_spec_recommend((const double[]){NAN, 1.1}, 2, 1.0) == 1);
}

static void test_median(void)
{
    double a[] = {5, 1, 4, 2, 3};
    CHECK(kvp_spec_median(a, 5) == 3);
    CHECK(a[0] == 1 && a[4] == 5);
    double b[] = {8, 2, 6, 4};
    CHECK(kvp_spec_median(b, 4) == 5);
    double c[] = {7};
    CHECK(kvp_spec_median(c, 1) == 7);
    CHECK(kvp_spec_median(NULL, 0) == 0);
}

int main(void)
{
    test_histogram();
    test_predict();
    test_recommend();
    test_median();
    return unit_done();
}
