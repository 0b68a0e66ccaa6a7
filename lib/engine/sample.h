/* sample.h - choosing the next token from logits.
 *
 * The parameters and the generator state live in kvp_sampling (lib/stream.h),
 * so a sequence's sampling travels in its KVP record and a resumed run draws
 * the same numbers it would have drawn.  Order, as llama.cpp's default chain:
 * repetition penalty, then top-k, top-p, min-p on the unscaled distribution,
 * then temperature, then a draw.  temperature 0 is greedy (argmax after the
 * penalty; the lowest id wins a tie).
 */
#ifndef KVP_SAMPLE_H
#define KVP_SAMPLE_H

#include "error.h"
#include "stream.h"

#include <stdint.h>

/* Recent tokens the repetition penalty sees (decode, batches, drafters). */
#define KVP_SAMPLE_WINDOW 64

/* Defaults: greedy, no filters, penalty 1, max_tokens 128, seed 0. */
void kvp_sample_defaults(kvp_sampling *s);
/* Seed s->rng from s->seed and a sequence id, so sequences of one batch draw
 * independent streams that do not depend on batch composition. */
void kvp_sample_seed(kvp_sampling *s, uint64_t seq_id);
/* Check the parameters: 0 or KVP_EINVAL naming the bad one
 * (kvp_sampling_check, the rule a sequence record passes too). */
int kvp_sample_check(const kvp_sampling *s, kvp_err *err);
/* The next token from logits[n_vocab] (changed in place).  recent[n_recent]
 * are the tokens the repetition penalty looks at.  Advances s->rng when it
 * draws.  Returns the token id or a negative code. */
int kvp_sample_next(kvp_sampling *s, float *logits, uint32_t n_vocab, const uint32_t *recent, uint32_t n_recent,
                    kvp_err *err);
/* The index of the largest of x[n] (the lowest one on a tie; NaN never):
 * greedy, kvp_argmax_f32's rule. */
uint32_t kvp_sample_argmax(const float *x, uint32_t n);
/* The distribution kvp_sample_next draws from, as an array: p[n_vocab] (0
 * outside the tokens the filters keep), after the same penalty (logits
 * changed in place), top-k, top-p, min-p and temperature, in the same
 * order, in double rounded to f32.  Temperature 0: all the mass on the
 * argmax.  Top-k by partial selection; a sort only when top-p needs the
 * order.  0 or a code. */
int kvp_sample_probs(const kvp_sampling *s, float *logits, uint32_t n_vocab, const uint32_t *recent,
                     uint32_t n_recent, float *p, kvp_err *err);
/* A token drawn from the weights p[n] (>= 0, any sum) with the uniform u in
 * [0, 1): the first i whose running sum passes u * sum. */
uint32_t kvp_sample_from(const float *p, uint32_t n, double u);
/* A uniform double in [0, 1) from s->rng (xoroshiro128+), advancing it. */
double kvp_sample_uniform(kvp_sampling *s);

#endif
