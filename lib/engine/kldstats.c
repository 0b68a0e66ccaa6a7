/* kldstats.c - perplexity and KL-divergence statistics over positions. */
#include "kldstats.h"

#include <math.h>
#include <stdlib.h>

const double kvp_kld_pct[KVP_KLD_NPCT] = {99.9, 99, 95, 90, 50, 10, 5, 1, 0.1};
const double kvp_dp_pct[KVP_DP_NPCT] = {99.9, 99, 95, 90, 75, 50, 25, 10, 5, 1, 0.1};

/* Mean of x[n] and the standard error of that mean. */
static double mean_err(const double *x, size_t n, double *err)
{
    double s = 0, s2 = 0;
    for (size_t i = 0; i < n; i++) {
        s += x[i];
        s2 += x[i] * x[i];
    }
    double m = s / (double)n, var = s2 / (double)n - m * m;
    *err = n > 1 && var > 0 ? sqrt(var / (double)(n - 1)) : 0;
    return m;
}

double kvp_pplsum_ppl(const kvp_pplsum *p, double *err)
{
    double m = p->n ? p->nll / (double)p->n : 0, var = p->n ? p->nll2 / (double)p->n - m * m : 0;
    double ppl = exp(m);
    *err = p->n > 1 && var > 0 ? ppl * sqrt(var / (double)(p->n - 1)) : 0;
    return ppl;
}

void kvp_kldstats_init(kvp_kldstats *s)
{
    *s = (kvp_kldstats){0};
}

void kvp_kldstats_free(kvp_kldstats *s)
{
    free(s->nll_q);
    free(s->nll_b);
    free(s->kld);
    free(s->p_diff);
    free(s->top_diff);
    kvp_kldstats_init(s);
}

static int grow(double **a, size_t cap)
{
    double *p = realloc(*a, cap * sizeof *p);
    if (!p)
        return -1;
    *a = p;
    return 0;
}

int kvp_kldstats_add(kvp_kldstats *s, const kvp_logdist_cmp *c, double nll_base, kvp_err *err)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 1024;
        if (grow(&s->nll_q, cap) || grow(&s->nll_b, cap) || grow(&s->kld, cap) || grow(&s->p_diff, cap) ||
            grow(&s->top_diff, cap))
            return kvp_err_set(err, KVP_ENOMEM, "out of memory for %zu positions' statistics", cap);
        s->cap = cap;
    }
    s->nll_q[s->n] = c->nll;
    s->nll_b[s->n] = nll_base;
    s->kld[s->n] = c->kld;
    s->p_diff[s->n] = c->p_diff;
    s->top_diff[s->n] = c->top_diff;
    s->same_top += c->same_top != 0;
    s->n++;
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The p-th percentile (0..100) of sorted x[n]: linear between ranks. */
static double percentile(const double *x, size_t n, double p)
{
    double r = p / 100 * (double)(n - 1);
    size_t i = (size_t)r;
    if (i + 1 >= n)
        return x[n - 1];
    return x[i] + (r - (double)i) * (x[i + 1] - x[i]);
}

/* PPL(Q) vs PPL(base): both perplexities, their correlation, ratio and
 * difference, with first-order uncertainties from the covariance. */
static void ppl_pair(const kvp_kldstats *s, kvp_kld_summary *o)
{
    size_t n = s->n;
    double eq, eb, mq = mean_err(s->nll_q, n, &eq), mb = mean_err(s->nll_b, n, &eb);
    double cov = 0, dsum = 0, dsum2 = 0;
    for (size_t i = 0; i < n; i++) {
        double d = s->nll_q[i] - s->nll_b[i];
        cov += (s->nll_q[i] - mq) * (s->nll_b[i] - mb);
        dsum += d;
        dsum2 += d * d;
    }
    cov /= (double)n;
    /* eq, eb are sd/sqrt(n-1); the covariance of the two means likewise */
    double cov_m = cov / (double)(n - 1), sdq = eq * sqrt((double)(n - 1)), sdb = eb * sqrt((double)(n - 1));
    o->cor = sdq > 0 && sdb > 0 ? cov / (sdq * sdb) : 1;
    o->ppl_q = exp(mq);
    o->ppl_q_err = o->ppl_q * eq;
    o->ppl_b = exp(mb);
    o->ppl_b_err = o->ppl_b * eb;
    double dm = dsum / (double)n, dvar = dsum2 / (double)n - dm * dm;
    o->ln_ratio = dm;
    o->ln_ratio_err = dvar > 0 ? sqrt(dvar / (double)(n - 1)) : 0;
    o->ratio = exp(dm);
    o->ratio_err = o->ratio * o->ln_ratio_err;
    o->diff = o->ppl_q - o->ppl_b;
    double v = o->ppl_q * o->ppl_q * eq * eq + o->ppl_b * o->ppl_b * eb * eb - 2 * o->ppl_q * o->ppl_b * cov_m;
    o->diff_err = v > 0 ? sqrt(v) : 0;
}

int kvp_kldstats_summary(kvp_kldstats *s, kvp_kld_summary *o, kvp_err *err)
{
    size_t n = s->n;
    if (n < 2)
        return kvp_err_set(err, KVP_EINVAL, "%zu scored positions: statistics need at least 2", n);
    *o = (kvp_kld_summary){.n = n};
    ppl_pair(s, o);
    o->kld_mean = mean_err(s->kld, n, &o->kld_err);
    o->dp_mean = mean_err(s->p_diff, n, &o->dp_err);
    /* RMS of p_diff: the mean of its squares and that mean's error, through
     * the square root */
    double sq = 0, sq2 = 0, tsq = 0, tmax = 0;
    for (size_t i = 0; i < n; i++) {
        double d2 = s->p_diff[i] * s->p_diff[i];
        sq += d2;
        sq2 += d2 * d2;
        tsq += s->top_diff[i] * s->top_diff[i];
        tmax = fabs(s->top_diff[i]) > tmax ? fabs(s->top_diff[i]) : tmax;
    }
    double m2 = sq / (double)n, v2 = sq2 / (double)n - m2 * m2;
    o->dp_rms = sqrt(m2);
    o->dp_rms_err = o->dp_rms > 0 && v2 > 0 ? sqrt(v2 / (double)(n - 1)) / (2 * o->dp_rms) : 0;
    o->top_rms = sqrt(tsq / (double)n);
    o->top_max = tmax;
    double f = (double)s->same_top / (double)n;
    o->same_top = f;
    o->same_top_err = sqrt(f * (1 - f) / (double)(n - 1));
    qsort(s->kld, n, sizeof *s->kld, cmp_double);
    qsort(s->p_diff, n, sizeof *s->p_diff, cmp_double);
    o->kld_min = s->kld[0];
    o->kld_max = s->kld[n - 1];
    for (int i = 0; i < KVP_KLD_NPCT; i++)
        o->kld_pct[i] = percentile(s->kld, n, kvp_kld_pct[i]);
    o->dp_min = s->p_diff[0];
    o->dp_max = s->p_diff[n - 1];
    for (int i = 0; i < KVP_DP_NPCT; i++)
        o->dp_pct[i] = percentile(s->p_diff, n, kvp_dp_pct[i]);
    return 0;
}
