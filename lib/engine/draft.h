/* draft.h - drafters for speculative decoding: cheap guesses of the tokens
 * that follow a sequence, which the batch engine verifies in one step of
 * the target model (lib/engine/batch.h).
 *
 * A drafter here is deterministic: its guess is a function of the tokens
 * alone.  The verifier draws each token from the target's own distribution
 * with the request's own generator and keeps a draft token only when the
 * draw equals it, so what comes out is exactly what decoding without
 * drafts gives (greedy or sampled); a drafter changes the speed, never the
 * text.
 */
#ifndef KVP_DRAFT_H
#define KVP_DRAFT_H

#include "stream.h"

#include <stdint.h>

#define KVP_DRAFT_MAX 16     /* draft tokens a step at most */
#define KVP_DRAFT_BRANCHES 8 /* branches of a draft tree at most */

typedef struct kvp_drafter {
    void *ctx;
    /* Up to k (<= KVP_DRAFT_MAX) tokens to follow tokens[n] into out;
     * returns how many (0: no guess).  *state is the request's own (NULL
     * at first), for a drafter that keeps something per request. */
    uint32_t (*draft)(void *ctx, void **state, const uint32_t *tokens, uint32_t n, uint32_t k, uint32_t *out);
    /* A stochastic drafter (NULL: none), used when the request samples
     * (temperature > 0): like draft, but each token drawn with s's warping
     * (the target's, penalties counting the draft so far) from the
     * distribution it writes into q[j][n_vocab], with s's generator.  The
     * verifier then keeps tokens by speculative sampling (specverify.h). */
    uint32_t (*draft_sampled)(void *ctx, void **state, const uint32_t *tokens, uint32_t n, uint32_t k, uint32_t *out,
                              kvp_sampling *s, float *q);
    /* A drafter that guesses from the target model's hidden state (NULL:
     * none; draft is then unused), for the n requests of a step at once
     * (so they share one pass over whatever weights it reads).  Request
     * i's hidden[i][n_embd] is the final-normed state behind the logits
     * that chose its last token (kvp_engine_hidden), as the batch engine
     * keeps it; k[i] its most guesses.  It may guess a tree: n_branch[i]
     * (<= max_b <= KVP_DRAFT_BRANCHES; 0: no guess) different branches,
     * branch b's len[i * KVP_DRAFT_BRANCHES + b] (<= k[i]) tokens at
     * out[(i * KVP_DRAFT_BRANCHES + b) * KVP_DRAFT_MAX], its most likely
     * first.  Deterministic, so verified like draft's guesses; the branch
     * whose guesses the sampler keeps longest wins.  Medusa heads
     * (heads.h). */
    void (*draft_hidden)(void *ctx, uint32_t n, const float *const *hidden, const uint32_t *k, uint32_t max_b,
                         uint32_t *out, uint32_t *len, uint32_t *n_branch);
    /* The draft and draft_sampled of the n requests of a step at once
     * (NULL: none; they are called a request at a time), so a drafting
     * model steps once a draft position for them all.  Request i's state,
     * tokens[i][n_tokens[i]] and most guesses k[i] (>= 1) as draft takes
     * them; s[i] NULL for chosen drafts, or its sampling (draft_sampled,
     * q[i] its distributions); its guesses at out[i * KVP_DRAFT_MAX], got[i]
     * of them. */
    void (*draft_batch)(void *ctx, uint32_t n, void **const *state, const uint32_t *const *tokens,
                        const uint32_t *n_tokens, const uint32_t *k, kvp_sampling *const *s, float *const *q,
                        uint32_t *out, uint32_t *got);
    /* Guessing costs next to nothing (prompt lookup): under --draft-len
     * auto its length is chosen each step from the steps' measured cost
     * (draftlen.h), where a costly drafter's climbs and backs off. */
    int cheap;
    /* The drafter works in the target's own KV cache (layerskip): before
     * each draft call *state is set to the request's sequence there (its
     * handle + 1), which holds every token but the last computed; the
     * drafter leaves it so (draftmodel.h). */
    int on_target_cache;
    /* The request is gone: let its state go (NULL: nothing to let go). */
    void (*release)(void *ctx, void *state);
} kvp_drafter;

/* Prompt lookup: the last N tokens (N from max_n down to min_n, the
 * longest that occurs) are looked for earlier in the sequence (prompt and
 * output); of the occurrences, the one whose match runs furthest back (up
 * to 16 tokens), the latest of those; the tokens that followed it are the
 * draft. */
typedef struct kvp_ngram_drafter {
    uint32_t min_n, max_n;
} kvp_ngram_drafter;

uint32_t kvp_ngram_draft(void *ngram_drafter, void **state, const uint32_t *tokens, uint32_t n, uint32_t k,
                         uint32_t *out);

#endif
