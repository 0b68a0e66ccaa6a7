/* argmax.h - the index of a row's largest value: greedy decoding's choice,
 * made the same way wherever it is made (the sampler, a backend's
 * argmax_rows, a GPU kernel's copy of this rule). */
#ifndef KVP_ARGMAX_H
#define KVP_ARGMAX_H

#include <stddef.h>
#include <stdint.h>

/* The first index of the largest value of x[n]: NaN never counts, ties go
 * to the lowest index, and 0 when no value compares at least -inf (all NaN,
 * or n 0). */
uint32_t kvp_argmax_f32(const float *x, uint32_t n);

/* The first index of x[n] that is NaN or infinite, or n when all are
 * finite: logits that are not hold no choice (a model's or a KV stream's
 * NaN spreads through a step). */
size_t kvp_first_nonfinite_f32(const float *x, size_t n);

#endif
