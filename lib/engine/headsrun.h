/* headsrun.h - `specdec --train-heads`: Medusa heads (heads.h) trained on
 * the target's own greedy answers to a prompts file (self-distillation).
 *
 *  1. Every prompt is answered greedily by the batch engine (decode's
 *     options: -n, --max-num-seqs, chat templates...), and samples - 1
 *     times more at temperature 0.8, for more contexts.
 *  2. Each prompt + answer is run through the model once more, one step a
 *     chunk, and the final-normed hidden state of every answer position
 *     becomes a sample, labelled with the model's own argmax 2, 3, ...
 *     places on (kvp_heads_collect).
 *  3. Every tenth prompt's answers (when there are ten prompts) are held out; the
 *     heads train on the rest (headstrain.h) and are measured on both
 *     before and after: top-1 accuracy a head, which is what drafting
 *     needs.
 *  4. The heads are written, bound to the model's fingerprint.
 */
#ifndef KVP_HEADSRUN_H
#define KVP_HEADSRUN_H

#include "engine.h"
#include "headstrain.h"
#include "kvcache.h"
#include "runopts.h"

#include <stdio.h>

/* Samples as they are gathered (kvp_heads_set's layout). */
typedef struct kvp_heads_samples {
    float *hidden;        /* [n][n_embd] */
    uint32_t *label;      /* [n][n_heads] */
    uint32_t n, cap, n_heads, n_embd;
} kvp_heads_samples;

void kvp_heads_samples_free(kvp_heads_samples *s);
/* Append the samples of tokens[n], whose first n_prompt are the prompt:
 * the hidden state of each position p from n_prompt - 1 on that has a
 * label for head 1; head k's (1-based) label is the model's argmax after
 * position p + k (on a greedy answer, tokens[p + 1 + k]), while that
 * position is before n - 1, else none.  A scratch sequence of kc, freed
 * after; steps of at most chunk tokens (0: 128).  0 or a code. */
int kvp_heads_collect(kvp_engine *e, kvp_kvcache *kc, const uint32_t *tokens, uint32_t n, uint32_t n_prompt,
                      uint32_t chunk, kvp_heads_samples *out, kvp_err *err);

typedef struct kvp_heads_job {
    const char *prompts;  /* the prompts file */
    const char *out;      /* the heads file to write */
    uint32_t n_heads;     /* 0: 4 */
    uint32_t samples;     /* answers a prompt: greedy, then sampled (0: 1) */
    kvp_heads_train_opts train;
} kvp_heads_job;

/* The whole job on the target r (opened; its cache and engine are made
 * here from o, whose file and sampling are set for the job).  Progress
 * and the report go to report.  0 or a code. */
int kvp_heads_train_run(kvp_run *r, kvp_runopts *o, const kvp_heads_job *job, FILE *report, kvp_err *err);

#endif
