/* specmodel.c - the cost model of speculative decoding (see specmodel.h). */
#include "specmodel.h"

#include "debug.h"

/* Steps that kept more than j drafts (j = -1: every verify step). */
static uint64_t kept_more_than(const kvp_spec_counts *c, int j)
{
    if (j < 0)
        return c->verify_steps;
    return (uint32_t)j < c->k ? c->accepted_at[j] : 0;
}

void kvp_spec_histogram(const kvp_spec_counts *c, uint64_t hist[KVP_DRAFT_MAX + 1])
{
    KVP_ASSERT(c->k >= 1 && c->k <= KVP_DRAFT_MAX);
    for (uint32_t m = 0; m <= c->k; m++)
        hist[m] = kept_more_than(c, (int)m - 1) - kept_more_than(c, (int)m);
}

double kvp_spec_tokens_per_step(const kvp_spec_counts *c)
{
    return c->steps ? (double)(c->steps + c->accepted) / (double)c->steps : 1.0;
}

/* Verify steps that got exactly d drafts (1..k): they got draft d - 1 and
 * not draft d. */
static uint64_t steps_with_drafts(const kvp_spec_counts *c, uint32_t d)
{
    return c->drafted_at[d - 1] - (d < c->k ? c->drafted_at[d] : 0);
}

double kvp_spec_seconds(const kvp_spec_counts *c, const kvp_spec_costs *t)
{
    KVP_ASSERT(c->k >= 1 && c->k <= KVP_DRAFT_MAX && c->steps >= c->verify_steps);
    double s = (double)c->calls * t->call + (double)c->primed * t->prime;
    s += (double)(c->steps - c->verify_steps) * t->step[1];
    for (uint32_t d = 1; d <= c->k; d++)
        s += (double)steps_with_drafts(c, d) * t->step[d + 1];
    return s;
}

double kvp_spec_plain_seconds(const kvp_spec_counts *c, const kvp_spec_costs *t)
{
    return (double)(c->steps + c->accepted) * t->step[1];
}

double kvp_spec_predict_speedup(const kvp_spec_counts *c, const kvp_spec_costs *t)
{
    if (!c->steps || !(t->step[1] > 0))
        return 0;
    double spec = kvp_spec_seconds(c, t);
    return spec > 0 ? kvp_spec_plain_seconds(c, t) / spec : 0;
}

int kvp_spec_recommend(const double *speedup, uint32_t n, double min_gain)
{
    int best = -1;
    for (uint32_t i = 0; i < n; i++)
        if (speedup[i] > min_gain && (best < 0 || speedup[i] > speedup[best]))
            best = (int)i;
    return best;
}

double kvp_spec_median(double *v, uint32_t n)
{
    if (!n)
        return 0;
    for (uint32_t i = 1; i < n; i++) /* insertion sort: a handful of timings */
        for (uint32_t j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double x = v[j];
            v[j] = v[j - 1];
            v[j - 1] = x;
        }
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
