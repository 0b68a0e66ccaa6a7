/* test_specverify.c - the sampler's distribution as an array
 * (kvp_sample_probs), speculative sampling's rule (specverify.h), the
 * chi-square tail and the self-test (specselftest.h). */
#include "unit.h"
#include "sample.h"
#include "specselftest.h"
#include "specverify.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NV 300

static uint64_t rng = 0x51ec;

/* Logits with ties (rounded to quarters), so the tie order matters. */
static void random_logits(float *l, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        l[i] = roundf(unit_frand(&rng) * 16) / 4;
}

typedef struct ref_cand { float l; uint32_t id; } ref_cand;
static int ref_cmp(const void *a, const void *b)
{
    const ref_cand *x = a, *y = b;
    return x->l != y->l ? (x->l > y->l ? -1 : 1) : (x->id > y->id) - (x->id < y->id);
}

/* The kept set by the plain rule: a full sort, top-k, then min-p and top-p
 * over the sorted candidates (as kvp_sample_next). */
static uint32_t ref_kept(const kvp_sampling *s, const float *l, uint32_t n, uint8_t *kept)
{
    ref_cand *c = malloc(n * sizeof *c);
    for (uint32_t i = 0; i < n; i++)
        c[i] = (ref_cand){l[i], i};
    qsort(c, n, sizeof *c, ref_cmp);
    uint32_t m = s->top_k > 0 && (uint32_t)s->top_k < n ? (uint32_t)s->top_k : n;
    double sum = 0, cum = 0, mx = c[0].l;
    for (uint32_t i = 0; i < m; i++)
        sum += exp(c[i].l - mx);
    uint32_t keep = m;
    for (uint32_t i = 0; i < m; i++) {
        if (s->min_p > 0 && i > 0 && exp(c[i].l - mx) < s->min_p) {
            keep = i;
            break;
        }
        cum += exp(c[i].l - mx) / sum;
        if (s->top_p < 1 && cum >= s->top_p) {
            keep = i + 1;
            break;
        }
    }
    memset(kept, 0, n);
    for (uint32_t i = 0; i < keep; i++)
        kept[c[i].id] = 1;
    free(c);
    return keep;
}

/* kvp_sample_probs keeps exactly the reference's tokens, with softmax
 * weights at the temperature, summing to 1. */
static void test_probs_sets(void)
{
    static const struct { float t, top_p, min_p; int top_k; } cases[] = {
        {1, 1, 0, 0}, {0.7f, 1, 0, 10}, {1.3f, 0.8f, 0, 0}, {1, 1, 0.1f, 0},
        {0.9f, 0.9f, 0.05f, 40}, {2, 1, 0, 299}, {1, 0.5f, 0, 1}, {1, 1, 0, 300},
    };
    float l[NV], tmp[NV], p[NV];
    uint8_t kept[NV];
    kvp_err err = {0};
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++)
        for (int rep = 0; rep < 20; rep++) {
            kvp_sampling s;
            kvp_sample_defaults(&s);
            s.temperature = cases[ci].t, s.top_k = cases[ci].top_k, s.top_p = cases[ci].top_p;
            s.min_p = cases[ci].min_p;
            random_logits(l, NV);
            memcpy(tmp, l, sizeof l);
            CHECK(kvp_sample_probs(&s, tmp, NV, NULL, 0, p, &err) == 0);
            uint32_t nk = ref_kept(&s, l, NV, kept);
            double sum = 0, mx = -1e30, z = 0;
            int same_set = 1;
            for (uint32_t i = 0; i < NV; i++) {
                same_set &= (p[i] > 0) == (kept[i] != 0);
                sum += p[i];
                if (kept[i])
                    mx = l[i] > mx ? l[i] : mx;
            }
            for (uint32_t i = 0; i < NV; i++)
                z += kept[i] ? exp((l[i] - mx) / s.temperature) : 0;
            double worst = 0;
            for (uint32_t i = 0; i < NV; i++)
                if (kept[i])
                    worst = fmax(worst, fabs(p[i] - exp((l[i] - mx) / s.temperature) / z));
            CHECK_MSG(same_set, "case %zu: kept set differs from the sorted rule's (%u tokens)", ci, nk);
            CHECK_MSG(fabs(sum - 1) < 1e-5, "case %zu: sums to %.9f", ci, sum);
            CHECK_MSG(worst < 1e-6, "case %zu: a probability is off by %g", ci, worst);
        }
    /* temperature 0: all the mass on the argmax (lowest id on a tie) */
    kvp_sampling g;
    kvp_sample_defaults(&g);
    float t6[6] = {1, 3, 2, 3, -1, 0};
    CHECK(kvp_sample_probs(&g, t6, 6, NULL, 0, p, &err) == 0);
    CHECK(p[1] == 1 && p[3] == 0 && p[0] == 0);
    /* the penalty applies first, as kvp_sample_next's */
    g.repeat_penalty = 4, g.temperature = 1;
    float t2[2] = {2, 1};
    const uint32_t rec[1] = {0};
    CHECK(kvp_sample_probs(&g, t2, 2, rec, 1, p, &err) == 0);
    CHECK_NEAR(p[0], 1 / (1 + exp(0.5)), 1e-6);
}

static void test_sample_from(void)
{
    const float p[5] = {0, 0.25f, 0, 0.5f, 0.25f};
    CHECK_EQ_U64(kvp_sample_from(p, 5, 0.0), 1);
    CHECK_EQ_U64(kvp_sample_from(p, 5, 0.2499), 1);
    CHECK_EQ_U64(kvp_sample_from(p, 5, 0.25), 3);
    CHECK_EQ_U64(kvp_sample_from(p, 5, 0.7499), 3);
    CHECK_EQ_U64(kvp_sample_from(p, 5, 0.75), 4);
    CHECK_EQ_U64(kvp_sample_from(p, 5, 0.999999999), 4);
    const float w[3] = {2, 0, 6}; /* weights need not sum to 1 */
    CHECK_EQ_U64(kvp_sample_from(w, 3, 0.24), 0);
    CHECK_EQ_U64(kvp_sample_from(w, 3, 0.26), 2);
}

static void test_accept_rule(void)
{
    const float p[4] = {0.5f, 0.3f, 0.2f, 0}, same[4] = {0.5f, 0.3f, 0.2f, 0};
    const float q[4] = {0.1f, 0.6f, 0.1f, 0.2f};
    int kept;
    /* q == p: every draft is kept, whatever the uniform */
    for (uint32_t x = 0; x < 3; x++) {
        CHECK_EQ_U64(kvp_spec_accept(p, same, 4, x, 0.999999, 0.5, &kept), x);
        CHECK(kept == 1);
    }
    /* p(x) >= q(x): always kept */
    CHECK_EQ_U64(kvp_spec_accept(p, q, 4, 0, 0.99, 0.5, &kept), 0);
    CHECK(kept);
    /* p(1)/q(1) = 0.5: kept below, refused above */
    CHECK_EQ_U64(kvp_spec_accept(p, q, 4, 1, 0.49, 0.5, &kept), 1);
    CHECK(kept);
    uint32_t y = kvp_spec_accept(p, q, 4, 1, 0.51, 0.0, &kept);
    CHECK(!kept);
    /* the residual max(0, p - q) = {0.4, 0, 0.1, 0}: token 0 for u < 0.8, else 2 */
    CHECK_EQ_U64(y, 0);
    CHECK_EQ_U64(kvp_spec_accept(p, q, 4, 1, 0.51, 0.79, &kept), 0);
    CHECK_EQ_U64(kvp_spec_accept(p, q, 4, 1, 0.51, 0.81, &kept), 2);
    /* p(x) = 0: never kept, and never drawn */
    for (int i = 0; i < 50; i++) {
        y = kvp_spec_accept(p, q, 4, 3, unit_frand(&rng) * 0.5 + 0.5, unit_frand(&rng) * 0.5 + 0.5, &kept);
        CHECK(!kept && y != 3 && y != 1);
    }
    /* the wrong rule draws refusals from p: token 1 can come back */
    y = kvp_spec_accept_wrong(p, q, 4, 1, 0.51, 0.6, &kept);
    CHECK(!kept && y == 1);
}

/* A whole draft: all kept gives the extra token from the last row; a
 * refusal stops there. */
static void test_verify_chain(void)
{
    enum { V = 3 };
    const float p[4 * V] = {1, 0, 0, 0, 1, 0, 0, 0, 1, 0.5f, 0.5f, 0};
    const float q[3 * V] = {1, 0, 0, 0, 1, 0, 0, 0, 1};
    const uint32_t draft[3] = {0, 1, 2};
    uint32_t out[4];
    kvp_sampling g;
    kvp_sample_defaults(&g);
    kvp_sample_seed(&g, 7);
    CHECK_EQ_U64(kvp_spec_verify(p, q, V, draft, 3, &g, out), 3);
    CHECK(out[0] == 0 && out[1] == 1 && out[2] == 2 && out[3] < 2);
    const float q2[3 * V] = {1, 0, 0, 0, 0, 1, 0, 0, 1}; /* drafts token 2 where p is certain of 1 */
    const uint32_t draft2[3] = {0, 2, 2};
    CHECK_EQ_U64(kvp_spec_verify(p, q2, V, draft2, 3, &g, out), 1);
    CHECK(out[0] == 0 && out[1] == 1);
}

static void test_chi2(void)
{
    /* the 5% and 1% points of the chi-square table */
    CHECK_NEAR(kvp_chi2_pvalue(3.841, 1), 0.05, 2e-4);
    CHECK_NEAR(kvp_chi2_pvalue(18.307, 10), 0.05, 2e-4);
    CHECK_NEAR(kvp_chi2_pvalue(13.277, 4), 0.01, 1e-4);
    CHECK_NEAR(kvp_chi2_pvalue(124.342, 100), 0.05, 2e-4);
    CHECK_NEAR(kvp_chi2_pvalue(0.0, 3), 1.0, 0);
    CHECK(kvp_chi2_pvalue(1e4, 4) < 1e-100);
}

static void test_selftest(void)
{
    kvp_spec_check c[KVP_SPEC_SELFTEST_MAX];
    uint32_t n = 0;
    kvp_err err = {0};
    int failed = kvp_spec_selftest(c, &n, &err);
    CHECK_MSG(failed == 0, "%d self-test checks failed: %s", failed, err.msg);
    int caught = 0;
    for (uint32_t i = 0; i < n; i++)
        caught += c[i].expect_caught && c[i].pass;
    CHECK_MSG(caught == 1 && n >= 10, "the wrong rule was not caught (%u checks)", n);
}

int main(void)
{
    test_probs_sets();
    test_sample_from();
    test_accept_rule();
    test_verify_chain();
    test_chi2();
    test_selftest();
    return unit_done();
}
