/* specmodel.h - the cost model of speculative decoding that specdec
 * --profile checks against the clock (specprofile.h): from what a run of
 * one request at a time did (its decode steps, the drafts of each and how
 * many were kept) and the measured cost of each kind of step on this
 * machine, the time that run should take, and the speedup over decoding
 * the same tokens one step each.
 *
 * The model, per request after its first token (prompt processing is the
 * same with or without speculation and is left out):
 *
 *   every decode step asks the drafter for k tokens     t_call
 *   ... the first one of a request feeds it the prompt  + t_prime
 *   a step that got d drafts (0..k) runs 1 + d tokens    t_step[1 + d]
 *   and yields 1 + the drafts kept (0..d)
 *
 *   T_spec  = calls t_call + primed t_prime + sum over steps of t_step[1 + d]
 *   T_plain = tokens t_step[1]      (tokens = steps + drafts kept)
 *   speedup = T_plain / T_spec
 *
 * With d = k on every step and i.i.d. acceptance this is Leviathan et
 * al.'s S = E / (k c + v(k)), E the expected tokens a step, c = t_call /
 * (k t_step[1]), v(k) = t_step[k + 1] / t_step[1]; here E, the steps
 * that got fewer drafts than asked (prompt lookup finds no match, or a
 * shorter one) and those that got none are counted, not assumed; so are
 * the requests that called the drafter at all (primed): one that never
 * did (its budget ended at its first decode step) fed it no prompt.
 *
 * Pure functions, no clock: unit-tested in tests/unit/test_specmodel.c.
 */
#ifndef KVP_SPECMODEL_H
#define KVP_SPECMODEL_H

#include "draft.h"

#include <stdint.h>

/* What a speculative run did, over its decode steps (all requests). */
typedef struct kvp_spec_counts {
    uint32_t k;                          /* draft length asked (1..KVP_DRAFT_MAX) */
    uint64_t primed;                     /* requests that called the drafter at least once (each paid
                                            a prime: its first call fed the prompt) */
    uint64_t steps;                      /* decode steps: 1 + drafts kept tokens each */
    uint64_t calls;                      /* of which asked the drafter (not at the token budget's end) */
    uint64_t verify_steps;               /* of which got at least one draft */
    uint64_t accepted;                   /* drafts kept, all steps */
    uint64_t drafted_at[KVP_DRAFT_MAX];  /* verify steps that got more than j drafts */
    uint64_t accepted_at[KVP_DRAFT_MAX]; /* verify steps that kept draft j (a kept prefix) */
} kvp_spec_counts;

/* Measured costs on this machine, seconds. */
typedef struct kvp_spec_costs {
    double step[KVP_DRAFT_MAX + 2]; /* step[j]: one engine step of j tokens on one sequence, j = 1..k+1
                                       (step[1]: a plain decode step; step[0] unused) */
    double call;                    /* one call of the drafter for k tokens */
    double prime;                   /* what a request's first call costs beyond call (>= 0) */
} kvp_spec_costs;

/* hist[m], m = 0..c->k: the verify steps that kept exactly m drafts.  The
 * kept drafts are a prefix, so a step kept m when it kept draft m - 1 and
 * not draft m; the counts sum to c->verify_steps. */
void kvp_spec_histogram(const kvp_spec_counts *c, uint64_t hist[KVP_DRAFT_MAX + 1]);

/* Tokens a decode step yields on average (1 + drafts kept a step; 1 for a
 * run of no steps). */
double kvp_spec_tokens_per_step(const kvp_spec_counts *c);

/* The model's time for the run's decode steps with speculation (T_spec),
 * and without it (T_plain: the same tokens, a plain step each). */
double kvp_spec_seconds(const kvp_spec_counts *c, const kvp_spec_costs *t);
double kvp_spec_plain_seconds(const kvp_spec_counts *c, const kvp_spec_costs *t);

/* T_plain / T_spec: above 1 when speculation pays; 0 when there is
 * nothing to predict from (no steps, or costs not measured). */
double kvp_spec_predict_speedup(const kvp_spec_counts *c, const kvp_spec_costs *t);

/* The row to recommend among speedup[n]: the highest, if it is above
 * min_gain (a speedup below that is within the noise of the clock and not
 * worth a drafter), else -1 (plain decoding).  Ties go to the first row. */
int kvp_spec_recommend(const double *speedup, uint32_t n, double min_gain);

/* The median of v[n] (sorted in place); 0 for n 0. */
double kvp_spec_median(double *v, uint32_t n);

#endif
