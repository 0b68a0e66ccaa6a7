/* specselftest.h - `specdec --selftest`: speculative sampling keeps the
 * target's distribution, shown by counting.
 *
 * On small random vocabularies (and a random bigram model for whole
 * drafts), at several temperatures and filters, many tokens are drawn
 * three ways: by plain sampling (kvp_sample_next), by one position of the
 * acceptance rule, and by whole drafts through kvp_spec_verify, the code
 * the batch engine runs.  A chi-square test compares each count with the
 * exact distribution (kvp_sample_probs, or its chain for two tokens); a
 * check passes at p > 0.01.  A deliberately wrong rule
 * (kvp_spec_accept_wrong) is run the same way and must be caught (p <
 * 0.001): a test that cannot fail proves nothing.  The seeds are fixed, so
 * a run is reproducible.
 */
#ifndef KVP_SPECSELFTEST_H
#define KVP_SPECSELFTEST_H

#include "error.h"

#include <stdint.h>

typedef struct kvp_spec_check {
    char what[96];         /* "temp 0.7 top-k 5: one draft position", ... */
    uint64_t draws;
    uint32_t cells;        /* chi-square cells (after pooling small ones) */
    double chi2, pvalue;
    int expect_caught;     /* the wrong rule: passes when pvalue < 0.001 */
    int pass;
} kvp_spec_check;

#define KVP_SPEC_SELFTEST_MAX 32

/* Run every check into out[KVP_SPEC_SELFTEST_MAX]; *n_out gets the count.
 * Returns the number that failed (0: all passed) or a negative code. */
int kvp_spec_selftest(kvp_spec_check *out, uint32_t *n_out, kvp_err *err);

/* P(X >= chi2) for a chi-square with dof degrees of freedom. */
double kvp_chi2_pvalue(double chi2, double dof);

#endif
