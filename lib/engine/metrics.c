/* metrics.c - serving metrics (see metrics.h). */
#include "metrics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ITL_MIN 1e-6   /* seconds at the bottom of bucket 0 */
#define ITL_GROWTH 1.01

void kvp_metrics_init(kvp_metrics *m, double slo_ttft, double slo_tpot)
{
    memset(m, 0, sizeof *m);
    m->slo_ttft = slo_ttft;
    m->slo_tpot = slo_tpot;
}

void kvp_metrics_free(kvp_metrics *m)
{
    free(m->ttft);
    free(m->tpot);
    free(m->e2e);
    m->ttft = m->tpot = m->e2e = NULL;
    m->n = m->cap = 0;
}

static uint32_t itl_bucket(double s)
{
    if (!(s > ITL_MIN))
        return 0;
    double b = floor(log(s / ITL_MIN) / log(ITL_GROWTH)) + 1;
    return b >= KVP_METRICS_ITL_BUCKETS - 1 ? KVP_METRICS_ITL_BUCKETS - 1 : (uint32_t)b;
}

/* The geometric middle of bucket b: within 0.5% of any value in it. */
static double itl_value(uint32_t b)
{
    if (b == 0)
        return ITL_MIN;
    return ITL_MIN * pow(ITL_GROWTH, (double)b - 0.5);
}

void kvp_metrics_add_itl(kvp_metrics *m, double s)
{
    m->itl_count[itl_bucket(s)]++;
    m->n_itl++;
    m->itl_sum += s;
}

/* Whether value v (NaN: the request has none) meets bound slo (0: none). */
static int within(double v, double slo) { return slo <= 0 || v != v || v <= slo; }

int kvp_metrics_add_request(kvp_metrics *m, double t_arrival, double t_first, double t_last, uint32_t n_out,
                            int failed, kvp_err *err)
{
    if (m->n == m->cap) {
        uint64_t cap = m->cap ? m->cap * 2 : 256;
        double *a = realloc(m->ttft, cap * sizeof *a);
        if (a)
            m->ttft = a;
        double *b = realloc(m->tpot, cap * sizeof *b);
        if (b)
            m->tpot = b;
        double *c = realloc(m->e2e, cap * sizeof *c);
        if (c)
            m->e2e = c;
        if (!a || !b || !c)
            return kvp_err_set(err, KVP_ENOMEM, "metrics: out of memory for %llu requests",
                               (unsigned long long)cap);
        m->cap = cap;
    }
    double ttft = t_first > 0 ? t_first - t_arrival : NAN;
    double e2e = t_last > 0 ? t_last - t_arrival : NAN;
    double tpot = n_out > 1 ? (e2e - ttft) / (double)(n_out - 1) : NAN;
    m->ttft[m->n] = ttft;
    m->tpot[m->n] = tpot;
    m->e2e[m->n] = e2e;
    m->n++;
    m->good += !failed && within(ttft, m->slo_ttft) && within(tpot, m->slo_tpot);
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Where percentile q (0..100) of n values lies: between 0-based ranks
 * *lo and *lo + 1 (or n - 1), *frac of the way; numpy's "linear". */
static void rank_of(uint64_t n, double q, uint64_t *lo, double *frac)
{
    double pos = q / 100.0 * (double)(n - 1);
    *lo = (uint64_t)floor(pos);
    if (*lo >= n - 1) {
        *lo = n - 1;
        *frac = 0;
        return;
    }
    *frac = pos - (double)*lo;
}

double kvp_percentile(const double *v, uint64_t n, double q)
{
    if (n == 0)
        return NAN;
    uint64_t lo;
    double frac;
    rank_of(n, q, &lo, &frac);
    return frac > 0 ? v[lo] + (v[lo + 1] - v[lo]) * frac : v[lo];
}

/* Sort the defined values of v[n] to the front; the summary of those. */
static void dist_of(double *v, uint64_t n, kvp_dist *d)
{
    uint64_t k = 0;
    double sum = 0;
    for (uint64_t i = 0; i < n; i++)
        if (v[i] == v[i]) {
            v[k++] = v[i];
            sum += v[i];
        }
    qsort(v, (size_t)k, sizeof *v, cmp_double);
    d->n = k;
    d->mean = k ? sum / (double)k : NAN;
    d->p50 = kvp_percentile(v, k, 50);
    d->p90 = kvp_percentile(v, k, 90);
    d->p99 = kvp_percentile(v, k, 99);
    d->max = k ? v[k - 1] : NAN;
}

/* dist_of sorts and compacts: work on a copy so the arrays keep request order. */
static void dist_copy(const double *v, uint64_t n, kvp_dist *d)
{
    double *c = malloc((n ? n : 1) * sizeof *c);
    if (!c) {
        memset(d, 0, sizeof *d);
        d->mean = d->p50 = d->p90 = d->p99 = d->max = NAN;
        return;
    }
    if (n) /* v is NULL while no request has finished: memcpy's pointers must not be */
        memcpy(c, v, n * sizeof *c);
    dist_of(c, n, d);
    free(c);
}

void kvp_metrics_ttft(kvp_metrics *m, kvp_dist *d) { dist_copy(m->ttft, m->n, d); }
void kvp_metrics_tpot(kvp_metrics *m, kvp_dist *d) { dist_copy(m->tpot, m->n, d); }
void kvp_metrics_e2e(kvp_metrics *m, kvp_dist *d) { dist_copy(m->e2e, m->n, d); }

/* The ITL of 0-based rank i: its bucket's value. */
static double itl_at(const kvp_metrics *m, uint64_t i)
{
    uint64_t seen = 0;
    for (uint32_t b = 0; b < KVP_METRICS_ITL_BUCKETS; b++) {
        seen += m->itl_count[b];
        if (seen > i)
            return itl_value(b);
    }
    return itl_value(KVP_METRICS_ITL_BUCKETS - 1);
}

/* As kvp_percentile, over the histogram's bucket values. */
static double itl_percentile(const kvp_metrics *m, double q)
{
    if (m->n_itl == 0)
        return NAN;
    uint64_t lo;
    double frac;
    rank_of(m->n_itl, q, &lo, &frac);
    double a = itl_at(m, lo);
    return frac > 0 ? a + (itl_at(m, lo + 1) - a) * frac : a;
}

void kvp_metrics_itl(const kvp_metrics *m, kvp_dist *d)
{
    d->n = m->n_itl;
    d->mean = m->n_itl ? m->itl_sum / (double)m->n_itl : NAN;
    d->p50 = itl_percentile(m, 50);
    d->p90 = itl_percentile(m, 90);
    d->p99 = itl_percentile(m, 99);
    d->max = itl_percentile(m, 100);
}

int kvp_metrics_goodput(const kvp_metrics *m, double *out)
{
    if (!m->n)
        return 0;
    *out = (double)m->good / (double)m->n;
    return 1;
}

static void json_ms(FILE *f, const char *key, double s)
{
    if (s == s)
        fprintf(f, "\"%s\":%.3f", key, s * 1e3);
    else
        fprintf(f, "\"%s\":null", key);
}

void kvp_dist_json(FILE *f, const char *name, const kvp_dist *d)
{
    fprintf(f, "\"%s\":{\"n\":%llu,", name, (unsigned long long)d->n);
    json_ms(f, "mean", d->mean);
    fputc(',', f);
    json_ms(f, "p50", d->p50);
    fputc(',', f);
    json_ms(f, "p90", d->p90);
    fputc(',', f);
    json_ms(f, "p99", d->p99);
    fputc(',', f);
    json_ms(f, "max", d->max);
    fputc('}', f);
}

/* NaN: the value does not exist (kvp_dist's), not a number to print */
static void text_ms(FILE *f, int width, double s)
{
    if (s == s)
        fprintf(f, " %*.2f", width, s * 1e3);
    else
        fprintf(f, " %*s", width, "-");
}

void kvp_dist_text(FILE *f, const char *name, const kvp_dist *d)
{
    fprintf(f, "%-4s", name);
    text_ms(f, 9, d->mean);
    text_ms(f, 8, d->p50);
    text_ms(f, 8, d->p90);
    text_ms(f, 8, d->p99);
    fputc('\n', f);
}
