/* kldstats.h - perplexity and the comparison of a model with a base over
 * the scored positions of a text: the statistics llama.cpp's perplexity
 * tool prints (--kl-divergence), with the same uncertainties, so the two
 * can be read side by side.
 *
 * Uncertainties are standard errors of a mean over positions (sd /
 * sqrt(n - 1)), carried through exp and ratios to first order, as
 * llama.cpp does; they assume positions are independent, which neighbouring
 * tokens are not quite.  Percentiles interpolate linearly between the two
 * nearest ranks.
 */
#ifndef KVP_KLDSTATS_H
#define KVP_KLDSTATS_H

#include "error.h"
#include "logdist.h"

#include <stddef.h>
#include <stdint.h>

/* Perplexity alone: sums over positions of the negative log-likelihood. */
typedef struct kvp_pplsum {
    uint64_t n;
    double nll, nll2;
} kvp_pplsum;

static inline void kvp_pplsum_add(kvp_pplsum *p, double nll)
{
    p->n++;
    p->nll += nll;
    p->nll2 += nll * nll;
}
/* exp(mean nll); *err its standard error (0 below two positions). */
double kvp_pplsum_ppl(const kvp_pplsum *p, double *err);

#define KVP_KLD_NPCT 9 /* 99.9 99 95 90 50 10 5 1 0.1 */
#define KVP_DP_NPCT 11 /* 99.9 99 95 90 75 50 25 10 5 1 0.1 */
extern const double kvp_kld_pct[KVP_KLD_NPCT];
extern const double kvp_dp_pct[KVP_DP_NPCT];

/* Every position kept (percentiles need them all): 40 bytes a position. */
typedef struct kvp_kldstats {
    size_t n, cap;
    double *nll_q, *nll_b, *kld, *p_diff, *top_diff;
    uint64_t same_top;
} kvp_kldstats;

typedef struct kvp_kld_summary {
    uint64_t n;
    double ppl_q, ppl_q_err, ppl_b, ppl_b_err;
    double cor;                    /* of the positions' -log q and -log p */
    double ln_ratio, ln_ratio_err; /* mean ln(PPL(Q)/PPL(base)) */
    double ratio, ratio_err, diff, diff_err;
    double kld_mean, kld_err, kld_max, kld_min, kld_pct[KVP_KLD_NPCT];
    double dp_mean, dp_err, dp_rms, dp_rms_err, dp_max, dp_min, dp_pct[KVP_DP_NPCT]; /* p_diff */
    double same_top, same_top_err; /* fractions */
    double top_rms, top_max;       /* top_diff: RMS, largest magnitude */
} kvp_kld_summary;

void kvp_kldstats_init(kvp_kldstats *s);
void kvp_kldstats_free(kvp_kldstats *s);
/* One position: the row's comparison and the base's -log p(text token). */
int kvp_kldstats_add(kvp_kldstats *s, const kvp_logdist_cmp *c, double nll_base, kvp_err *err);
/* The summary (sorts the kept values; KVP_EINVAL below two positions). */
int kvp_kldstats_summary(kvp_kldstats *s, kvp_kld_summary *out, kvp_err *err);

#endif
