/* engine.h - one forward step of a model over a set of sequences.
 *
 * Each sequence in a step contributes one or more tokens: a prompt chunk, a
 * decode token, or the draft tokens a speculative verifier checks.  Their
 * K/V go into the paged cache (lib/kvcache.h) at the sequence's next
 * positions and every token attends to its own sequence only, so continuous
 * batching is "put every active sequence in the next step".  The engine
 * computes only through the backend's operations table (lib/backend.h).
 */
#ifndef KVP_ENGINE_H
#define KVP_ENGINE_H

#include "backend.h"
#include "error.h"
#include "kvcache.h"
#include "model.h"

#include <signal.h>
#include <stdint.h>

enum kvp_logits_want {
    KVP_LOGITS_NONE = 0, /* prompt chunk that is not the last */
    KVP_LOGITS_LAST = 1, /* the last token's row (sampling the next token) */
    KVP_LOGITS_ALL = 2,  /* every token's row (verification, scoring) */
    KVP_LOGITS_ARGMAX = 3, /* only the last token's argmax, into *argmax (greedy: no row of logits) */
    KVP_LOGITS_ARGMAX_ALL = 4, /* every token's argmax, into argmax[n_tokens] (greedy verification) */
};

typedef struct kvp_step_seq {
    int seq;                 /* kvcache sequence handle */
    const uint32_t *tokens;  /* [n_tokens], placed at positions len .. len+n_tokens-1 */
    uint32_t n_tokens;
    int want;                /* kvp_logits_want */
    /* NULL, or a draft tree: token j follows token parent[j] (< j) of this
     * entry, or the sequence's tokens when -1, so it sits at its parent's
     * position + 1 (len for -1) and sees only its own path (backend.h,
     * kvp_attn_args).  Its rows are the cache's slots len .. len+n_tokens-1
     * in order, registered for reuse only by kvp_kvcache_seq_keep_path once
     * the path that stays is known.  At most KVP_TREE_STEP_MAX tokens. */
    const int32_t *parent;
    /* KVP_LOGITS_ARGMAX: where the last token's argmax goes (the index of
     * its largest logit, kvp_argmax_f32's rule); KVP_LOGITS_ARGMAX_ALL:
     * every token's, in order.  The backend picks them where it can
     * (argmax_rows), so a greedy step need not copy whole rows of logits
     * back from a GPU. */
    uint32_t *argmax;
} kvp_step_seq;

#define KVP_TREE_STEP_MAX 256

typedef struct kvp_engine kvp_engine;

/* The engine keeps pointers to m, be and kc (the caller frees them after). */
int kvp_engine_create(kvp_engine **e, const kvp_model *m, kvp_backend *be, kvp_kvcache *kc, kvp_err *err);
/* An engine of a model's first layers (kvp_model_first_layers) over the
 * whole model's cache kc: its steps write layers 0..n_layer-1 of the
 * sequences' K/V and leave the rest of the slots as they were.
 * Self-speculation drafts so in the target's own cache: those layers' K/V
 * are the target's, and its verify step writes every layer again. */
int kvp_engine_create_first(kvp_engine **e, const kvp_model *m, kvp_backend *be, kvp_kvcache *kc, kvp_err *err);
void kvp_engine_free(kvp_engine *e);

/* Run one step.  logits (host memory) receives, sequence by sequence in
 * order, 0, 1 or n_tokens rows of n_vocab floats as each asked (an
 * ARGMAX sequence none: its id goes to its argmax); it may be NULL when
 * none asks for rows.  Returns the number of rows written, or a negative
 * code; on failure no sequence has grown (KV out of blocks: KVP_ELIMIT). */
int kvp_engine_step(kvp_engine *e, const kvp_step_seq *seqs, uint32_t n_seqs, float *logits, kvp_err *err);

/* Whether steps may carry draft trees (kvp_step_seq.parent): a backend
 * that takes them, in one process. */
int kvp_engine_takes_trees(const kvp_engine *e);

/* The model's vocabulary size (rows of logits are this long) and width
 * (hidden states are this long). */
uint32_t kvp_engine_n_vocab(const kvp_engine *e);
uint32_t kvp_engine_n_embd(const kvp_engine *e);

/* The final-normed hidden states behind the last step's logits rows: its
 * first R rows ([R][n_embd], host), in the order of the logits.  What a
 * Medusa head drafts from (lib/engine/heads.h).  KVP_EINVAL when R is more
 * than the last step gave, or another call has run since; not under
 * tensor or pipeline parallelism.  0 or a code. */
int kvp_engine_hidden(kvp_engine *e, float *out, uint32_t R, kvp_err *err);

/* logits[R][n_vocab] = the model's output head applied to h[R][n_embd]
 * (host rows, final-normed: what kvp_engine_hidden gives, or a head's
 * transform of it).  The model's own prepared weight, no extra copy.  Not
 * under tensor or pipeline parallelism.  0 or a code. */
int kvp_engine_project(kvp_engine *e, const float *h, uint32_t R, float *logits, kvp_err *err);

/* Feed a whole prompt to one sequence in chunks of at most chunk tokens
 * (0: 512), reusing cached prefix blocks first; last_logits (n_vocab floats,
 * may be NULL) gets the last token's row.  0 or a code. */
int kvp_engine_prefill(kvp_engine *e, int seq, const uint32_t *tokens, uint32_t n, uint32_t chunk, float *last_logits,
                       kvp_err *err);
/* While *flag is nonzero, kvp_engine_prefill stops before its next chunk
 * with KVP_EINTR (the sequence holds the chunks done; the caller drops
 * it): a stop signal (stopsig.h) ends a long prompt within a chunk, not
 * at its end.  NULL: never.  One process only (no --tp / --pp: the
 * workers would be left mid-prompt); ignored there. */
void kvp_engine_set_cancel(kvp_engine *e, const volatile sig_atomic_t *flag);

/* ---- tensor and pipeline parallelism (lib/engine/tp.c) ----
 * The ranks of a job (world) are pp pipeline stages of tp ranks each:
 * world rank = stage * tp + tp rank.  Each holds its shard of the model
 * (shard.h: its stage's layers, split tp ways) and those layers' KV heads.
 * Rank 0, the driver, runs the program and its KV cache, and broadcasts
 * each step's layout (tpmsg.h) to the others.  In a step, each stage's
 * ranks all-reduce their row-parallel products within the stage; stage s
 * passes its hidden state to stage s + 1 (rank by rank); the last stage
 * projects the vocabulary and its first rank sends the logits to rank 0.
 * Greedy output equals one process's but for near-ties: the all-reduces
 * sum partial products in another order. */
struct kvp_comm;
typedef struct kvp_parallel {
    struct kvp_comm *world;  /* every rank of the job */
    struct kvp_comm *tp;     /* this stage's ranks (size tp) */
    uint32_t tp_size, pp_size, stage;
} kvp_parallel;
/* The driver: make engine e (its model a shard, no step run yet) rank 0 of
 * d and send the other ranks its pool's shape.  kvp_engine_free tells them
 * it is gone.  0 or a code. */
int kvp_engine_tp_start(kvp_engine *e, const kvp_parallel *d, kvp_err *err);
/* Any other rank: follow the driver's engines on shard and be until
 * kvp_engine_tp_end.  0, or a code (a bad message, out of memory; the
 * caller names the rank); a driver that never comes is waited for. */
int kvp_engine_tp_serve(const kvp_model *shard, kvp_backend *be, const kvp_parallel *d, kvp_err *err);
/* The driver, after kvp_engine_tp_start on a cache that was read whole
 * from a KV stream and given its rank's pool (kvp_kvcache_repool): every
 * block in use, from the old whole pool, to the ranks.  0 or a code. */
int kvp_engine_tp_adopt(kvp_engine *e, const kvp_kv_pool *old, kvp_err *err);
/* The driver: the job is over (after the last engine is freed). */
int kvp_engine_tp_end(const kvp_parallel *d, kvp_err *err);

#endif
