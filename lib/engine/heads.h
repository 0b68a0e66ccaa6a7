/* heads.h - Medusa-1 heads: small extra heads that guess the tokens two,
 * three, ... places ahead from the target model's own last hidden state
 * (Cai et al., "Medusa", 2024), as a drafter for speculative decoding
 * (draft.h; specdec --method heads).
 *
 * Head k (k = 1..n_heads) maps h, the final-normed hidden state of the
 * position whose logits chose token t+1, to a guess of token t+1+k:
 *     z_k = h + SiLU(W1_k h + b1_k)    a residual block, W1_k and b1_k zero at first
 *     logits_k = output(z_k)           the target's own output head
 * so an untrained head repeats the model's next-token guess.  Medusa-1
 * gives each head its own vocabulary projection, initialized from the
 * output head; these share the target's, frozen: on SmolLM2-135M the
 * projection is 28M of the model's 135M weights, and four copies of it
 * would cost a draft step more than the model's whole step.  The residual
 * block alone learns the shift (headstrain.h trains it).
 *
 * A heads file is a KVP stream (kvp(5), "Medusa heads") bound to the model
 * it was trained on: its header carries that model's fingerprint; a CONFIG
 * record holds medusa.* keys (the shape, and how it was trained); then two
 * f32 tensors a head, medusa.K.w1 [n_embd][n_embd] (row o makes output o)
 * and medusa.K.b1 [n_embd], K from 1, in order.
 */
#ifndef KVP_HEADS_H
#define KVP_HEADS_H

#include "draft.h"
#include "engine.h"
#include "error.h"
#include "io.h"
#include "meta.h"
#include "stream.h"

#include <stdint.h>

#define KVP_HEADS_MAX 16  /* heads a file may hold (a draft is at most KVP_DRAFT_MAX long) */
#define KVP_HEADS_ARCH "medusa1-shared-output"

typedef struct kvp_heads {
    uint32_t n_heads, n_embd;
    float *w1;          /* [n_heads][n_embd][n_embd] */
    float *b1;          /* [n_heads][n_embd] */
    uint8_t fingerprint[KVP_FINGERPRINT_SIZE]; /* the model they belong to */
    kvp_meta info;      /* medusa.* keys as read or to be written (training facts) */
} kvp_heads;

/* n_heads zeroed heads for a model of n_embd and fingerprint fp.  0, or
 * KVP_EINVAL / KVP_ENOMEM; kvp_heads_free after either way. */
int kvp_heads_init(kvp_heads *h, uint32_t n_heads, uint32_t n_embd, const uint8_t fp[KVP_FINGERPRINT_SIZE],
                   kvp_err *err);
void kvp_heads_free(kvp_heads *h);

/* Head k's (0-based) residual block on x[n_embd]: z = x + SiLU(W1 x + b1).
 * a[n_embd] (may be NULL) receives W1 x + b1. */
void kvp_heads_apply(const kvp_heads *h, uint32_t k, const float *x, float *z, float *a);

/* Write h to path (a temporary file renamed into place: all or nothing);
 * producer names the program.  0 or a code naming path. */
int kvp_heads_write(const kvp_heads *h, const char *path, const char *producer, kvp_err *err);
/* Read heads from in (name for messages), checking every record: kinds,
 * order, names, shapes, dtypes, finite values.  0 or a code naming the
 * file and the record; h is then empty. */
int kvp_heads_load(kvp_heads *h, kvp_in *in, const char *name, kvp_err *err);
/* kvp_heads_load on the file at path. */
int kvp_heads_read(kvp_heads *h, const char *path, kvp_err *err);
/* Whether h fits model m: same fingerprint and width; else KVP_EMISMATCH with
 * a message naming path and both fingerprints. */
int kvp_heads_check_model(const kvp_heads *h, const char *path, const uint8_t fp[KVP_FINGERPRINT_SIZE],
                          uint32_t n_embd, kvp_err *err);

/* ---- the drafter (draft.h's draft_hidden) ----
 * Head k's guess is draft token k, each head projected by the target's
 * engine (kvp_engine_project), every head of every request of the step in
 * one product, so the output head is read once a step.  A tree of max_b branches is the max_b likeliest paths (beam
 * search over the heads' log-probabilities, summed): the first is every
 * head's argmax, the chain. */
typedef struct kvp_heads_drafter {
    const kvp_heads *h;
    kvp_engine *e;        /* the target's engine: its output head */
    float *z;             /* [cap_rows][n_embd]: every request's heads' rows */
    float *logits;        /* [cap_rows][n_vocab] */
    uint32_t cap_rows;
    uint32_t n_vocab;
    int failed;           /* a projection failed (its message in err); drafting stopped */
    kvp_err err;
    uint64_t calls;       /* drafts made */
} kvp_heads_drafter;

int kvp_heads_drafter_init(kvp_heads_drafter *d, const kvp_heads *h, kvp_engine *e, kvp_err *err);
void kvp_heads_drafter_free(kvp_heads_drafter *d);
void kvp_heads_draft(void *ctx, uint32_t n, const float *const *hidden, const uint32_t *k, uint32_t max_b,
                     uint32_t *out, uint32_t *len, uint32_t *n_branch);

#endif
