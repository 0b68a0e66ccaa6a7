/* test_logdist.c - a logits row as a distribution (lib/engine/logdist.c)
 * and the statistics over positions (lib/engine/kldstats.c), against
 * direct double-precision sums. */
#include "kldstats.h"
#include "logdist.h"
#include "unit.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) { return unit_frand(&rng_state); } /* uniform in [-1, 1) */

#define NV 1000

static void fill(float *l, uint32_t n, float spread)
{
    for (uint32_t i = 0; i < n; i++)
        l[i] = spread * frand();
}

/* log-sum-exp in long double, the slow way */
static double lse_ref(const float *l, uint32_t n)
{
    long double s = 0;
    for (uint32_t i = 0; i < n; i++)
        s += expl((long double)l[i]);
    return (double)logl(s);
}

static void test_lse(void)
{
    float l[NV];
    uint8_t mark[(NV + 7) / 8] = {0};
    for (int t = 0; t < 5; t++) {
        fill(l, NV, 2.0f + 8.0f * (float)t); /* up to logits of +-34: exp overflows float without the max */
        double lse = kvp_logdist_lse(l, NV);
        CHECK_NEAR(lse, lse_ref(l, NV), 1e-9 * fabs(lse) + 1e-12);
        uint32_t ids[7] = {3, 999, 0, 500, 17, 18, 250};
        double rest, lse2 = kvp_logdist_lse_rest(l, NV, ids, 7, mark, &rest);
        CHECK(lse2 == lse); /* the same bits with or without a set */
        double in = 0;
        for (int j = 0; j < 7; j++)
            in += exp((double)l[ids[j]] - lse);
        CHECK_NEAR(exp(rest) + in, 1.0, 1e-6); /* exp in float, summed in double */
        int clean = 1;
        for (size_t i = 0; i < sizeof mark; i++)
            clean &= mark[i] == 0;
        CHECK_MSG(clean, "the scratch marks are cleared");
    }
    /* a set holding every token leaves no mass */
    uint32_t all[4] = {0, 1, 2, 3};
    float four[4] = {1, 2, 3, 4};
    double rest;
    kvp_logdist_lse_rest(four, 4, all, 4, mark, &rest);
    CHECK(rest == -INFINITY);
}

static void test_topk(void)
{
    float l[NV];
    fill(l, NV, 5);
    /* ties: 40 and 41 equal the best, and 7 equals the 5th */
    l[40] = l[41] = 6;
    l[90] = 5.5f;
    l[7] = l[91] = 5.25f;
    l[92] = 5.4f;
    uint32_t ids[6];
    kvp_logdist_topk(l, NV, 6, ids);
    uint32_t want[6] = {40, 41, 90, 92, 7, 91};
    int same = 1;
    for (int j = 0; j < 6; j++)
        same &= ids[j] == want[j];
    CHECK_MSG(same, "top 6 by value, ties to the lower id: %u %u %u %u %u %u", ids[0], ids[1], ids[2], ids[3],
              ids[4], ids[5]);
    /* against a full selection on random rows */
    for (int t = 0; t < 20; t++) {
        fill(l, NV, 3);
        uint32_t k = 1 + (uint32_t)t * 7, top[200];
        kvp_logdist_topk(l, NV, k, top);
        int ok = 1;
        for (uint32_t j = 0; j < k; j++) {
            uint32_t above = 0; /* entries ranked above top[j] */
            for (uint32_t i = 0; i < NV; i++)
                above += l[i] > l[top[j]] || (l[i] == l[top[j]] && i < top[j]);
            ok &= above == j;
        }
        CHECK_MSG(ok, "top %u is the k best in order", k);
    }
}

/* KL(p || q) of two logits rows, in double, the slow way */
static double kld_ref(const float *lp, const float *lq, uint32_t n)
{
    double a = lse_ref(lp, n), b = lse_ref(lq, n), s = 0;
    for (uint32_t i = 0; i < n; i++)
        s += exp(lp[i] - a) * ((lp[i] - a) - (lq[i] - b));
    return s;
}

/* base's saved row from logits: top k with the rest, or all of it */
static void save(const float *l, uint32_t k, uint32_t *ids, float *lp, float *lp_rest, float *full, uint8_t *mark)
{
    double rest, lse;
    kvp_logdist_topk(l, NV, k, ids);
    lse = kvp_logdist_lse_rest(l, NV, ids, k, mark, &rest);
    for (uint32_t j = 0; j < k; j++)
        lp[j] = kvp_logdist_lp(l[ids[j]], lse);
    *lp_rest = (float)rest;
    for (uint32_t i = 0; i < NV; i++)
        full[i] = kvp_logdist_lp(l[i], lse);
}

static void test_compare(void)
{
    float base[NV], row[NV], full[NV], lp[64], lp_rest;
    uint32_t ids[64];
    uint8_t mark[(NV + 7) / 8] = {0};
    kvp_logdist_cmp c;
    fill(base, NV, 4);
    save(base, 32, ids, lp, &lp_rest, full, mark);
    uint32_t tok = 123;
    /* a row against itself: exactly 0, whatever the path */
    kvp_logdist_cmp_topk(base, NV, tok, ids, lp, 32, lp_rest, full[tok], mark, &c);
    CHECK(c.kld == 0 && c.p_diff == 0 && c.top_diff == 0 && c.same_top == 1);
    CHECK_NEAR(c.nll, -(double)full[tok], 0);
    kvp_logdist_cmp_full(base, NV, tok, full, &c);
    CHECK(c.kld == 0 && c.p_diff == 0 && c.same_top == 1);
    /* a perturbed row: full = the direct sum, to what f32 log-probs keep
     * (about 1e-7 an element: 1e-6 absolute on the sum); top-k a lower
     * bound */
    for (int t = 0; t < 5; t++) {
        memcpy(row, base, sizeof row);
        for (uint32_t i = 0; i < NV; i++)
            row[i] += 0.3f * frand();
        double ref = kld_ref(base, row, NV);
        kvp_logdist_cmp_full(row, NV, tok, full, &c);
        CHECK_NEAR(c.kld, ref, 2e-6);
        double p_tok = exp(full[tok]), q_tok = exp(row[tok] - lse_ref(row, NV));
        CHECK_NEAR(c.p_diff, q_tok - p_tok, 1e-7);
        kvp_logdist_cmp topk;
        kvp_logdist_cmp_topk(row, NV, tok, ids, lp, 32, lp_rest, full[tok], mark, &topk);
        CHECK_MSG(topk.kld <= c.kld + 1e-9 && topk.kld > 0, "top-k KLD %g is a lower bound of %g", topk.kld, c.kld);
        CHECK_NEAR(topk.nll, c.nll, 1e-6);
        CHECK_NEAR(topk.p_diff, c.p_diff, 1e-7);
        CHECK(topk.same_top == c.same_top);
    }
    /* a row whose best token differs from the base's */
    memcpy(row, base, sizeof row);
    row[ids[1]] = base[ids[0]] + 1;
    kvp_logdist_cmp_topk(row, NV, tok, ids, lp, 32, lp_rest, full[tok], mark, &c);
    CHECK(c.same_top == 0 && c.top_diff < 0);
}

static void test_stats(void)
{
    kvp_kldstats s;
    kvp_kldstats_init(&s);
    kvp_err err = {0};
    /* identical models: ratio 1 exactly, correlation 1, KLD 0 */
    for (int i = 0; i < 101; i++) {
        kvp_logdist_cmp c = {.nll = 1 + 0.01 * i, .kld = 0, .p_diff = 0, .top_diff = 0, .same_top = 1};
        CHECK(kvp_kldstats_add(&s, &c, c.nll, &err) == 0);
    }
    kvp_kld_summary o;
    CHECK(kvp_kldstats_summary(&s, &o, &err) == 0);
    CHECK(o.ratio == 1 && o.ln_ratio == 0 && o.ln_ratio_err == 0 && o.diff == 0);
    CHECK_NEAR(o.cor, 1, 1e-12);
    CHECK(o.kld_mean == 0 && o.kld_max == 0 && o.same_top == 1 && o.same_top_err == 0);
    CHECK_NEAR(o.ppl_q, exp(1.5), 1e-12);
    kvp_kldstats_free(&s);

    /* known values: kld = i/100 for i = 0..100; percentiles interpolate */
    kvp_kldstats_init(&s);
    double sum = 0, sum2 = 0;
    for (int i = 100; i >= 0; i--) {
        kvp_logdist_cmp c = {.nll = 2, .kld = i / 100.0, .p_diff = (i - 50) / 100.0, .top_diff = i % 2 ? 0.1 : -0.3,
                             .same_top = i % 4 != 0};
        sum += c.kld;
        sum2 += c.kld * c.kld;
        kvp_kldstats_add(&s, &c, 1.5, &err);
    }
    CHECK(kvp_kldstats_summary(&s, &o, &err) == 0);
    CHECK_NEAR(o.kld_mean, sum / 101, 1e-12);
    CHECK_NEAR(o.kld_mean, 0.5, 1e-12);
    double var = sum2 / 101 - 0.25;
    CHECK_NEAR(o.kld_err, sqrt(var / 100), 1e-12);
    CHECK_NEAR(o.kld_pct[0], 0.999, 1e-12); /* 99.9th of 0..1 in steps of 0.01 */
    CHECK_NEAR(o.kld_pct[4], 0.5, 1e-12);   /* median */
    CHECK_NEAR(o.kld_pct[8], 0.001, 1e-12);
    CHECK(o.kld_max == 1 && o.kld_min == 0);
    CHECK_NEAR(o.dp_max, 0.5, 1e-12);
    CHECK_NEAR(o.dp_pct[4], 0.25, 1e-12); /* the 75th percentile is dp_pct[4] */
    CHECK_NEAR(o.same_top, 75.0 / 101, 1e-12);
    CHECK_NEAR(o.top_max, 0.3, 1e-12);
    CHECK_NEAR(o.ratio, exp(0.5), 1e-12);
    CHECK_NEAR(o.ppl_b, exp(1.5), 1e-12);
    kvp_kldstats_free(&s);

    /* one position is not enough */
    kvp_kldstats_init(&s);
    kvp_logdist_cmp c = {.nll = 1};
    kvp_kldstats_add(&s, &c, 1, &err);
    CHECK(kvp_kldstats_summary(&s, &o, &err) == KVP_EINVAL);
    kvp_kldstats_free(&s);

    /* perplexity alone: exp of the mean and llama.cpp's error */
    kvp_pplsum p = {0};
    double nll[4] = {1, 2, 3, 4}, e;
    for (int i = 0; i < 4; i++)
        kvp_pplsum_add(&p, nll[i]);
    CHECK_NEAR(kvp_pplsum_ppl(&p, &e), exp(2.5), 1e-12);
    CHECK_NEAR(e, exp(2.5) * sqrt((7.5 - 6.25) / 3), 1e-12);
}

int main(void)
{
    test_lse();
    test_topk();
    test_compare();
    test_stats();
    return unit_done();
}
