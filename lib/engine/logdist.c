/* logdist.c - log-softmax facts of a logits row, and a row against a base. */
#include "logdist.h"

#include "sample.h"

#include <math.h>
#include <string.h>

static float row_max(const float *l, uint32_t n)
{
    float m = l[0];
    for (uint32_t i = 1; i < n; i++)
        m = l[i] > m ? l[i] : m;
    return m;
}

double kvp_logdist_lse(const float *l, uint32_t n)
{
    double rest;
    return kvp_logdist_lse_rest(l, n, NULL, 0, NULL, &rest);
}

double kvp_logdist_lse_rest(const float *l, uint32_t n, const uint32_t *ids, uint32_t k, uint8_t *mark,
                            double *lrest)
{
    for (uint32_t j = 0; j < k; j++)
        mark[ids[j] >> 3] |= (uint8_t)(1u << (ids[j] & 7));
    float m = row_max(l, n);
    double s = 0, rest = 0;
    for (uint32_t i = 0; i < n; i++) {
        float e = expf(l[i] - m);
        s += e; /* the same additions in the same order with or without a set */
        if (!k || !(mark[i >> 3] >> (i & 7) & 1))
            rest += e;
    }
    for (uint32_t j = 0; j < k; j++)
        mark[ids[j] >> 3] = 0;
    *lrest = rest > 0 ? log(rest) - log(s) : -INFINITY;
    return (double)m + log(s);
}

/* "a ranks above b": larger value, or equal value and lower id. */
static int above(const float *l, uint32_t a, uint32_t b)
{
    return l[a] > l[b] || (l[a] == l[b] && a < b);
}

void kvp_logdist_topk(const float *l, uint32_t n, uint32_t k, uint32_t *ids)
{
    if (k > n)
        k = n;
    /* ids[0..k) kept sorted, best first; a candidate enters by insertion.
     * Most of a vocabulary never beats the k-th, so this is one compare a
     * token. */
    uint32_t have = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (have == k && !above(l, i, ids[k - 1]))
            continue;
        uint32_t j = have < k ? have++ : k - 1;
        while (j > 0 && above(l, i, ids[j - 1])) {
            ids[j] = ids[j - 1];
            j--;
        }
        ids[j] = i;
    }
}

/* p (log lp) times (lp - lq); 0 where p is 0, whatever q is. */
static double kl_term(double lp, double lq)
{
    return lp == -INFINITY ? 0 : exp(lp) * (lp - lq);
}

void kvp_logdist_cmp_topk(const float *l, uint32_t n, uint32_t tok, const uint32_t *ids, const float *lp,
                          uint32_t k, float lp_rest, float lp_tok, uint8_t *mark, kvp_logdist_cmp *out)
{
    double lq_rest, lse = kvp_logdist_lse_rest(l, n, ids, k, mark, &lq_rest);
    double kld = 0;
    for (uint32_t j = 0; j < k; j++)
        kld += kl_term(lp[j], kvp_logdist_lp(l[ids[j]], lse));
    /* the rest as one outcome, its q made as the base's p was */
    kld += kl_term(lp_rest, (float)lq_rest);
    float lq_tok = kvp_logdist_lp(l[tok], lse);
    out->nll = -(double)lq_tok;
    out->kld = kld;
    out->p_diff = exp(lq_tok) - exp(lp_tok);
    out->top_diff = exp(kvp_logdist_lp(l[ids[0]], lse)) - exp(lp[0]);
    out->same_top = kvp_sample_argmax(l, n) == ids[0];
}

void kvp_logdist_cmp_full(const float *l, uint32_t n, uint32_t tok, const float *lp_base, kvp_logdist_cmp *out)
{
    double lse = kvp_logdist_lse(l, n), kld = 0;
    for (uint32_t i = 0; i < n; i++)
        kld += kl_term(lp_base[i], kvp_logdist_lp(l[i], lse));
    uint32_t top = kvp_sample_argmax(lp_base, n);
    float lq_tok = kvp_logdist_lp(l[tok], lse);
    out->nll = -(double)lq_tok;
    out->kld = kld;
    out->p_diff = exp(lq_tok) - exp(lp_base[tok]);
    out->top_diff = exp(kvp_logdist_lp(l[top], lse)) - exp(lp_base[top]);
    out->same_top = kvp_sample_argmax(l, n) == top;
}
