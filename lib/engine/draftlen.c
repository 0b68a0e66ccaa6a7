/* draftlen.c - a cheap drafter's draft length (see draftlen.h). */
#include "draftlen.h"

#include <math.h>

void kvp_draftlen_time(kvp_draftlen *c, uint32_t n, double s)
{
    if (n == 0 || n > KVP_DRAFTLEN_T || !(s > 0))
        return;
    double *t = &c->t[n];
    *t = *t > 0 ? fmin(s, 0.8 * *t + 0.2 * s) : s;
}

/* t(n): timed, else between the timed sizes around it, else past the
 * largest timed one below at a tenth of its cost a token: an optimistic
 * guess, so a size is tried before it is judged; 0 when no size up to n
 * was timed. */
static double t_at(const kvp_draftlen *c, uint32_t n)
{
    if (c->t[n] > 0)
        return c->t[n];
    uint32_t lo = n, hi = n;
    while (lo > 1 && !(c->t[lo] > 0))
        lo--;
    if (!(c->t[lo] > 0))
        return 0;
    while (hi < KVP_DRAFTLEN_T && !(c->t[hi] > 0))
        hi++;
    if (c->t[hi] > 0 && c->t[hi] >= c->t[lo])
        return c->t[lo] + (c->t[hi] - c->t[lo]) * (double)(n - lo) / (double)(hi - lo);
    return c->t[lo] * (1.0 + 0.1 * (double)(n - lo));
}

uint32_t kvp_draftlen_choose(const kvp_draftlen *c, uint32_t tokens, uint32_t yield, float a, uint32_t most)
{
    if (tokens == 0 || most == 0)
        return 0;
    if (tokens > KVP_DRAFTLEN_T)
        return most;
    if (most > KVP_DRAFTLEN_T - tokens)
        most = KVP_DRAFTLEN_T - tokens; /* sizes past the table are not priced */
    double t0 = t_at(c, tokens);
    if (!(t0 > 0))
        return 0;
    double best = (double)yield / t0, gain = 0, p = 1;
    uint32_t k_best = 0;
    for (uint32_t k = 1; k <= most; k++) {
        p *= a;
        gain += p;
        double v = ((double)yield + gain) / t_at(c, tokens + k);
        if (v > best)
            best = v, k_best = k;
    }
    return k_best;
}

/* Each verify step is evidence of about its guesses' worth: m kept of nd
 * is m successes and, unless all were kept, one failure; all kept says
 * nothing of the next, so it counts as the estimate itself. */
float kvp_draftlen_accept(float a, uint32_t kept, uint32_t drafted)
{
    if (drafted == 0)
        return a;
    float obs = kept < drafted ? (float)kept / (float)(kept + 1) : ((float)kept + a) / (float)(kept + 1);
    return 0.5f * a + 0.5f * obs;
}

float kvp_draftlen_idle(float a)
{
    return 0.9f * a + 0.1f * KVP_DRAFTLEN_PRIOR;
}
