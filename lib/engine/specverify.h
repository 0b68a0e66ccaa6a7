/* specverify.h - exact acceptance of a stochastic drafter's tokens
 * (speculative sampling: Leviathan et al. 2023, Chen et al. 2023).
 *
 * The drafter drew draft[j] from q_j, the target's distribution there is
 * p_j (both after the same warping: lib/engine/sample.h kvp_sample_probs).
 * draft[j] is kept with probability min(1, p_j(x) / q_j(x)); at the first
 * refusal the token is drawn from norm(max(0, p_j - q_j)) instead and the
 * rest of the draft is dropped; when all are kept, one more token is drawn
 * from p_nd.  Each output token is then distributed exactly as p given the
 * tokens before it, whatever q is: the drafter changes the speed, never
 * the distribution.  `specdec --selftest` (specselftest.h) checks that.
 *
 * Deterministic drafters (prompt lookup, greedy drafts) do not need this:
 * the verifier draws the target's own token and keeps drafts while they
 * are equal (batch.c), which gives the very tokens plain decoding gives.
 */
#ifndef KVP_SPECVERIFY_H
#define KVP_SPECVERIFY_H

#include "stream.h"

#include <stdint.h>

/* One position: draft x (drawn from q) against p, both [V]; u_keep and
 * u_draw uniforms in [0, 1).  Returns x when kept (*kept = 1), else a token
 * from norm(max(0, p - q)) (*kept = 0). */
uint32_t kvp_spec_accept(const float *p, const float *q, uint32_t V, uint32_t x, double u_keep, double u_draw,
                         int *kept);

/* A whole draft: p[nd + 1][V], q[nd][V], draft[nd]; uniforms from gen
 * (advanced).  out[0..m] gets the m kept drafts and the token after them;
 * returns m. */
uint32_t kvp_spec_verify(const float *p, const float *q, uint32_t V, const uint32_t *draft, uint32_t nd,
                         kvp_sampling *gen, uint32_t *out);

/* A deliberately wrong rule for the self-test to catch: on a refusal it
 * draws from p, not from the residual (a common mistake). */
uint32_t kvp_spec_accept_wrong(const float *p, const float *q, uint32_t V, uint32_t x, double u_keep,
                               double u_draw, int *kept);

#endif
