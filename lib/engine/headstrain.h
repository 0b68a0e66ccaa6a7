/* headstrain.h - training Medusa heads (heads.h) by self-distillation.
 *
 * A sample is the target's final-normed hidden state h_t at a position of
 * its own greedy output and, for each head k, the token the target chose
 * k + 1 places later (x_{t+1+k}).  Loss: sum over heads of decay^(k-1)
 * times head k's cross-entropy (Medusa-1: 0.8^k), averaged over the
 * samples that have a label for that head.  Only the residual blocks
 * (W1_k, b1_k) learn; the output head stays the target's.  Adam, with
 * mini-batches drawn in a seeded order, so a run is reproducible.
 *
 * Every product goes through the backend's matmul: the output head as f32
 * [V][d] for the logits and its transpose [d][V] for their gradient; the
 * heads' W1 (prepared again after each update) for the forward pass.
 */
#ifndef KVP_HEADSTRAIN_H
#define KVP_HEADSTRAIN_H

#include "backend.h"
#include "error.h"
#include "heads.h"

#include <stdint.h>

#define KVP_HEADS_NO_LABEL UINT32_MAX

/* The frozen output head as the trainer uses it. */
typedef struct kvp_heads_vocab {
    kvp_backend *be;
    kvp_weight w, wt;     /* f32 [n_vocab][n_embd] and its transpose, prepared on be */
    float *wdata, *wtdata;
    uint32_t n_vocab, n_embd;
} kvp_heads_vocab;

/* From a model's output head (any type kvp_cpu_dequant_weight_row reads). */
int kvp_heads_vocab_init(kvp_heads_vocab *v, kvp_backend *be, const kvp_weight *out, kvp_err *err);
/* From f32 rows w[n_vocab][n_embd] (copied). */
int kvp_heads_vocab_from_f32(kvp_heads_vocab *v, kvp_backend *be, const float *w, uint32_t n_vocab,
                             uint32_t n_embd, kvp_err *err);
void kvp_heads_vocab_free(kvp_heads_vocab *v);

/* Samples: hidden[n][n_embd]; label[n][n_heads], head k's target for
 * sample i at label[i * n_heads + k], or KVP_HEADS_NO_LABEL. */
typedef struct kvp_heads_set {
    const float *hidden;
    const uint32_t *label;
    uint32_t n, n_heads;
} kvp_heads_set;

/* Each head's mean cross-entropy and top-1 accuracy over the samples
 * labelled for it; weighted: the training loss. */
typedef struct kvp_heads_eval {
    double loss[KVP_HEADS_MAX], acc[KVP_HEADS_MAX];
    uint64_t n[KVP_HEADS_MAX];
    double weighted;
} kvp_heads_eval;

typedef struct kvp_heads_train_opts {
    uint32_t epochs;      /* passes over the samples (0: 2) */
    uint32_t batch;       /* samples a step (0: 32) */
    double lr;            /* Adam's step size (0: 1e-3) */
    double decay;         /* head k's loss weight is decay^(k-1) (0: 0.8) */
    uint64_t seed;        /* the sample order */
    /* after each epoch (NULL: none): the running mean of the loss over it */
    void (*progress)(void *ctx, uint32_t epoch, double loss, double seconds);
    void *ctx;
} kvp_heads_train_opts;

/* Losses and accuracies of h on s.  0 or a code. */
int kvp_heads_evaluate(const kvp_heads *h, kvp_heads_vocab *v, const kvp_heads_set *s, uint32_t batch,
                       kvp_heads_eval *out, kvp_err *err);
/* Train h (its n_heads == s->n_heads) on s.  0 or a code. */
int kvp_heads_train(kvp_heads *h, kvp_heads_vocab *v, const kvp_heads_set *s, const kvp_heads_train_opts *o,
                    kvp_err *err);

#endif
