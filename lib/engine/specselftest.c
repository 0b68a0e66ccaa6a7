/* specselftest.c - speculative sampling against exact distributions
 * (specselftest.h). */
#include "specselftest.h"
#include "sample.h"
#include "specverify.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the chi-square tail: Q(a, x), the regularized upper incomplete gamma ---- */

static double gamma_p_series(double a, double x)
{
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 1000 && fabs(term) > fabs(sum) * 1e-15; n++) {
        term *= x / (a + n);
        sum += term;
    }
    return sum * exp(-x + a * log(x) - lgamma(a));
}

/* Lentz's continued fraction for Q(a, x), x >= a + 1. */
static double gamma_q_fraction(double a, double x)
{
    const double tiny = 1e-300;
    double b = x + 1 - a, c = 1 / tiny, d = 1 / b, h = d;
    for (int i = 1; i < 1000; i++) {
        double an = -i * (i - a);
        b += 2;
        d = an * d + b;
        d = fabs(d) < tiny ? tiny : d;
        c = b + an / c;
        c = fabs(c) < tiny ? tiny : c;
        d = 1 / d;
        double delta = d * c;
        h *= delta;
        if (fabs(delta - 1) < 1e-15)
            break;
    }
    return exp(-x + a * log(x) - lgamma(a)) * h;
}

double kvp_chi2_pvalue(double chi2, double dof)
{
    double a = dof / 2, x = chi2 / 2;
    if (!(x > 0))
        return 1;
    return x < a + 1 ? 1 - gamma_p_series(a, x) : gamma_q_fraction(a, x);
}

/* Pearson's statistic of counts[n] against expected probabilities e[n],
 * cells expecting fewer than 5 draws pooled into one. */
static void chi2_of(const uint64_t *counts, const double *e, uint32_t n, uint64_t draws, kvp_spec_check *c)
{
    double chi2 = 0, pool_e = 0, pool_o = 0;
    uint32_t cells = 0;
    for (uint32_t i = 0; i < n; i++) {
        double ex = e[i] * (double)draws;
        if (ex < 5) {
            pool_e += ex, pool_o += (double)counts[i];
            continue;
        }
        chi2 += ((double)counts[i] - ex) * ((double)counts[i] - ex) / ex;
        cells++;
    }
    if (pool_e >= 5 || (pool_e > 0 && pool_o > 0)) {
        double ex = pool_e > 1e-300 ? pool_e : 1e-300;
        chi2 += (pool_o - ex) * (pool_o - ex) / ex;
        cells++;
    }
    c->draws = draws, c->cells = cells, c->chi2 = chi2;
    c->pvalue = cells > 1 ? kvp_chi2_pvalue(chi2, cells - 1) : 1;
    c->pass = c->expect_caught ? c->pvalue < 0.001 : c->pvalue > 0.01;
}

/* ---- the cases ---- */

#define V 10          /* one-position vocabulary */
#define VB 6          /* the bigram model's vocabulary */
#define KB 3          /* draft length of the chain checks */

typedef struct warp {
    const char *name;
    float temperature, top_p, min_p, penalty;
    int top_k;
} warp;

static const warp warps[] = {
    {"temp 0.7", 0.7f, 1, 0, 1, 0},
    {"temp 1.0", 1.0f, 1, 0, 1, 0},
    {"temp 1.5 top-k 5", 1.5f, 1, 0, 1, 5},
    {"temp 1.0 top-p 0.9", 1.0f, 0.9f, 0, 1, 0},
    {"temp 1.2 min-p 0.05", 1.2f, 1, 0.05f, 1, 0},
    {"temp 0.8 penalty 1.3", 0.8f, 1, 0, 1.3f, 0},
};

static kvp_sampling params_of(const warp *w)
{
    kvp_sampling s;
    kvp_sample_defaults(&s);
    s.temperature = w->temperature, s.top_k = w->top_k, s.top_p = w->top_p, s.min_p = w->min_p;
    s.repeat_penalty = w->penalty;
    return s;
}

/* A normal deviate (Box-Muller) from g. */
static float normal(kvp_sampling *g)
{
    double u = kvp_sample_uniform(g), v = kvp_sample_uniform(g);
    return (float)(sqrt(-2 * log(1 - u)) * cos(6.283185307179586 * v));
}

/* p of logits under s with recent[n_recent] (logits copied: the penalty
 * changes them). */
static int probs(const kvp_sampling *s, const float *logits, uint32_t n, const uint32_t *recent, uint32_t n_recent,
                 float *p, kvp_err *err)
{
    float l[V > VB ? V : VB];
    memcpy(l, logits, n * sizeof *l);
    return kvp_sample_probs(s, l, n, recent, n_recent, p, err);
}

typedef uint32_t (*accept_fn)(const float *, const float *, uint32_t, uint32_t, double, double, int *);

/* One position: draws by plain sampling (fn NULL) or through an
 * acceptance rule from q's drafts, against p. */
static int one_position(const warp *w, accept_fn fn, uint64_t draws, kvp_spec_check *c, kvp_err *err)
{
    kvp_sampling s = params_of(w), g = s;
    kvp_sample_seed(&g, 0x5e1f7e57 + (uint64_t)(w - warps));
    float lt[V], ld[V], p[V], q[V];
    const uint32_t recent[2] = {1, 4};
    for (uint32_t i = 0; i < V; i++)
        lt[i] = 1.5f * normal(&g), ld[i] = lt[i] + 1.2f * normal(&g); /* related, not equal */
    int rc;
    if ((rc = probs(&s, lt, V, recent, 2, p, err)) < 0 || (rc = probs(&s, ld, V, recent, 2, q, err)) < 0)
        return rc;
    uint64_t counts[V] = {0};
    double e[V];
    for (uint64_t i = 0; i < draws; i++) {
        uint32_t y;
        if (!fn) {
            float l[V];
            memcpy(l, lt, sizeof l);
            if ((rc = kvp_sample_next(&g, l, V, recent, 2, err)) < 0)
                return rc;
            y = (uint32_t)rc;
        } else {
            int kept;
            uint32_t x = kvp_sample_from(q, V, kvp_sample_uniform(&g));
            double u1 = kvp_sample_uniform(&g), u2 = kvp_sample_uniform(&g);
            y = fn(p, q, V, x, u1, u2, &kept);
        }
        counts[y]++;
    }
    for (uint32_t i = 0; i < V; i++)
        e[i] = p[i];
    chi2_of(counts, e, V, draws, c);
    return 0;
}

/* Whole drafts of KB tokens from a bigram draft model against a bigram
 * target, through kvp_spec_verify: the first two tokens after token 0,
 * against p(a | 0) p(b | a).  Rounds continue from what came out until two
 * tokens are out.  The penalty window is every token so far, drafts
 * included, as the batch engine's. */
static int chain(const warp *w, uint64_t draws, kvp_spec_check *c, kvp_err *err)
{
    kvp_sampling s = params_of(w), g = s;
    kvp_sample_seed(&g, 0xc4a1 + (uint64_t)(w - warps));
    float lt[VB][VB], ld[VB][VB], p[(KB + 1) * VB], q[KB * VB];
    for (uint32_t a = 0; a < VB; a++)
        for (uint32_t b = 0; b < VB; b++)
            lt[a][b] = 1.5f * normal(&g), ld[a][b] = lt[a][b] + 1.0f * normal(&g);
    uint64_t *counts = calloc(VB * VB, sizeof *counts);
    double e[VB * VB];
    int rc = 0;
    if (!counts)
        return kvp_err_set(err, KVP_ENOMEM, "selftest: out of memory");
    for (uint64_t i = 0; i < draws && rc == 0; i++) {
        uint32_t seq[2 + 2 * (KB + 1)] = {0}, n = 1; /* token 0, then what comes out */
        while (n < 3 && rc == 0) {
            uint32_t draft[KB], ctx[2 + 2 * (KB + 1) + KB], out[KB + 1];
            memcpy(ctx, seq, n * sizeof *ctx);
            for (uint32_t j = 0; j <= KB && rc == 0; j++) {
                uint32_t last = ctx[n + j - 1];
                if ((rc = probs(&s, lt[last], VB, ctx, n + j, p + j * VB, err)) < 0 || j == KB)
                    break;
                if ((rc = probs(&s, ld[last], VB, ctx, n + j, q + j * VB, err)) < 0)
                    break;
                ctx[n + j] = draft[j] = kvp_sample_from(q + j * VB, VB, kvp_sample_uniform(&g));
            }
            if (rc < 0)
                break;
            uint32_t m = kvp_spec_verify(p, q, VB, draft, KB, &g, out);
            memcpy(seq + n, out, (m + 1) * sizeof *out);
            n += m + 1;
        }
        counts[seq[1] * VB + seq[2]]++;
    }
    /* the exact joint, under the same warping */
    float pa[VB], pb[VB];
    const uint32_t zero = 0;
    for (uint32_t a = 0; a < VB && rc == 0; a++) {
        uint32_t hist[2] = {0, a};
        if ((rc = probs(&s, lt[0], VB, &zero, 1, pa, err)) < 0 || (rc = probs(&s, lt[a], VB, hist, 2, pb, err)) < 0)
            break;
        for (uint32_t b = 0; b < VB; b++)
            e[a * VB + b] = (double)pa[a] * pb[b];
    }
    if (rc == 0)
        chi2_of(counts, e, VB * VB, draws, c);
    free(counts);
    return rc;
}

int kvp_spec_selftest(kvp_spec_check *out, uint32_t *n_out, kvp_err *err)
{
    uint32_t n = 0;
    int failed = 0, rc = 0;
    for (size_t i = 0; i < sizeof warps / sizeof *warps && rc == 0; i++) {
        const warp *w = &warps[i];
        kvp_spec_check *c = &out[n++];
        memset(c, 0, sizeof *c);
        snprintf(c->what, sizeof c->what, "%s: plain sampling", w->name);
        if ((rc = one_position(w, NULL, 100000, c, err)) < 0)
            break;
        c = &out[n++];
        memset(c, 0, sizeof *c);
        snprintf(c->what, sizeof c->what, "%s: one draft position", w->name);
        if ((rc = one_position(w, kvp_spec_accept, 100000, c, err)) < 0)
            break;
        c = &out[n++];
        memset(c, 0, sizeof *c);
        snprintf(c->what, sizeof c->what, "%s: drafts of %d, two tokens", w->name, KB);
        if ((rc = chain(w, 60000, c, err)) < 0)
            break;
    }
    if (rc == 0) { /* the wrong rule, where p and q differ most (temperature 1.5) */
        kvp_spec_check *c = &out[n++];
        memset(c, 0, sizeof *c);
        c->expect_caught = 1;
        snprintf(c->what, sizeof c->what, "%s: WRONG rule (refusals drawn from p), must be caught", warps[2].name);
        rc = one_position(&warps[2], kvp_spec_accept_wrong, 100000, c, err);
    }
    *n_out = n;
    if (rc < 0)
        return rc;
    for (uint32_t i = 0; i < n; i++)
        failed += !out[i].pass;
    return failed;
}
