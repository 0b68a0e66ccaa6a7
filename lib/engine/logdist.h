/* logdist.h - one row of logits as a probability distribution: its
 * log-normalizer, top-k, the mass outside a set of tokens, and how far it
 * is from a saved base distribution (KL divergence and the statistics
 * llama.cpp's perplexity tool prints).
 *
 * Every log-probability is (float)(logit - lse) with lse in double, both
 * when a base is saved and when a row is compared with it, so a model
 * compared with itself gives a KL divergence of exactly 0.
 */
#ifndef KVP_LOGDIST_H
#define KVP_LOGDIST_H

#include <stdint.h>

/* log(sum_i exp(l[i])): exp(l[i] - max) in float, summed in double. */
double kvp_logdist_lse(const float *l, uint32_t n);
/* The same lse (bit for bit), and in *lrest the log of the probability
 * mass outside ids[k] (distinct, < n), summed directly over the others in
 * the same pass (no 1 - sum cancellation); -inf when it is 0.  mark:
 * scratch of (n + 7) / 8 zero bytes, zero again on return. */
double kvp_logdist_lse_rest(const float *l, uint32_t n, const uint32_t *ids, uint32_t k, uint8_t *mark,
                            double *lrest);

/* The log-probability of a logit given the row's lse. */
static inline float kvp_logdist_lp(float logit, double lse)
{
    return (float)((double)logit - lse);
}

/* The k (<= n) largest entries' ids, largest first; equal values by lower
 * id first. */
void kvp_logdist_topk(const float *l, uint32_t n, uint32_t k, uint32_t *ids);

/* A row compared with the base's distribution at the same position. */
typedef struct kvp_logdist_cmp {
    double nll;        /* -log q(text token) */
    double kld;        /* KL(base || row), nats */
    double p_diff;     /* q(text token) - p(text token), as llama.cpp's delta-p */
    double top_diff;   /* q(base's top token) - p(base's top token) */
    int same_top;      /* the row's argmax is the base's */
} kvp_logdist_cmp;

/* Against a top-k base row: ids[k] with log-probs lp[k], lp_rest (log of the
 * mass outside them) and lp_tok (the text token's).  The KL divergence
 * lumps the tokens outside the top k into one outcome, so it is a lower
 * bound of the full one (the log-sum inequality) and equals it when the
 * rows agree outside the top k up to a factor. */
void kvp_logdist_cmp_topk(const float *l, uint32_t n, uint32_t tok, const uint32_t *ids, const float *lp,
                          uint32_t k, float lp_rest, float lp_tok, uint8_t *mark, kvp_logdist_cmp *out);
/* Against a full base row of n log-probs. */
void kvp_logdist_cmp_full(const float *l, uint32_t n, uint32_t tok, const float *lp_base,
                          kvp_logdist_cmp *out);

#endif
