/* draftmodel.h - a second, smaller or more quantized model with the same
 * vocabulary as the drafter (speculative decoding, lib/engine/draft.h).
 *
 * Each request gets a sequence in the draft model's own KV cache.  Before
 * drafting, that sequence is brought in line with the request's tokens:
 * whatever follows their common prefix (rejected drafts, or tokens the
 * target chose instead) is truncated and the new tokens are fed in one
 * step; then the draft model takes k steps.  Greedy requests get greedy
 * drafts, a function of the tokens, so the verifier's rule keeps the output
 * exact.  Sampling requests get drafts drawn from the draft model's own
 * warped distribution q (draft_sampled), kept by speculative sampling
 * (specverify.h): the output is distributed as the target's.
 * When the draft cache is full the request gets no draft that step.
 *
 * Self-speculation (layerskip) drafts in the target's own cache instead
 * (on_target): the request's sequence there already holds the first
 * layers' K/V of every computed token, so only its last token is fed, and
 * the draft's slots are given back at once (the verify step computes them
 * again through every layer).  A pause in drafting then costs nothing.
 */
#ifndef KVP_DRAFTMODEL_H
#define KVP_DRAFTMODEL_H

#include "draft.h"
#include "engine.h"
#include "kvcache.h"

typedef struct kvp_draft_model {
    kvp_engine *e;   /* the draft model's engine over its own cache kc */
    kvp_kvcache *kc;
    int on_target;   /* kc is the target's (layerskip, kvp_engine_create_first): a
                      * request's sequence is its own, given as *state (seq + 1;
                      * kvp_drafter.on_target_cache); drafts are appended to it
                      * and truncated away before the call returns */
    uint32_t chunk;  /* tokens a feeding step (0: 512) */
    uint64_t steps;  /* draft-model steps taken (feeding and drafting) */
    /* the drafts' scratch (a request alone is a batch of one), for cap
     * requests: their rows [cap][n_vocab],
     * steps, and per request its sequence, next token to feed and row */
    float *rows;
    kvp_step_seq *step;
    uint32_t *who, *from;
    int *seq;
    float **row;
    uint32_t cap;
} kvp_draft_model;

/* 0 or KVP_ENOMEM; kvp_draft_model_free after. */
int kvp_draft_model_init(kvp_draft_model *d, kvp_engine *e, kvp_kvcache *kc, kvp_err *err);
void kvp_draft_model_free(kvp_draft_model *d);
/* The kvp_drafter callbacks (ctx: a kvp_draft_model). */
uint32_t kvp_draft_model_draft(void *ctx, void **state, const uint32_t *tokens, uint32_t n, uint32_t k,
                               uint32_t *out);
uint32_t kvp_draft_model_draft_sampled(void *ctx, void **state, const uint32_t *tokens, uint32_t n, uint32_t k,
                                       uint32_t *out, kvp_sampling *s, float *q);
/* kvp_drafter.draft_batch: the n requests' sequences brought in line in
 * shared feeding steps, then their drafts in one step a draft position,
 * so the draft model reads its weights once a position for them all.  The
 * drafts are the ones draft and draft_sampled would give each request
 * alone (the engine gives a token the same bits in any batch). */
void kvp_draft_model_draft_batch(void *ctx, uint32_t n, void **const *state, const uint32_t *const *tokens,
                                 const uint32_t *n_tokens, const uint32_t *k, kvp_sampling *const *s,
                                 float *const *q, uint32_t *out, uint32_t *got);
void kvp_draft_model_release(void *ctx, void *state);

#endif
