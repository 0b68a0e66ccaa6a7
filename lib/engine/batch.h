/* batch.h - the batch engine: requests come in, are scheduled step by step
 * over the paged KV cache (lib/engine/sched.h: continuous batching, chunked
 * prefill, preemption by recompute) and leave as soon as they finish.
 *
 * A request holds everything that must survive preemption: its tokens
 * (prompt, then every token sampled), its sampling state and generator, its
 * text and timings.  The KV cache holds only what can be computed again.
 * Requests are pulled from a source as the waiting queue drains (at most
 * `lookahead` wait), and each finished request is handed to emit and freed,
 * so a job of any length runs in bounded memory.
 *
 * Greedy output does not depend on the batch: each request's tokens are
 * computed by the same engine whatever else shares its steps.
 */
#ifndef KVP_BATCH_H
#define KVP_BATCH_H

#include "draft.h"
#include "engine.h"
#include "error.h"
#include "generate.h"
#include "kvcache.h"
#include "metrics.h"
#include "sched.h"
#include "tokenizer.h"

#include <signal.h>
#include <stdint.h>

typedef struct kvp_request {
    kvp_gen_seq g;           /* id, label, sampling, text, timings (t_start = arrival) */
    kvp_gen_opts opts;       /* its own budget and stop strings (stop the caller's, or stop_owned) */
    char **stop_owned;       /* [opts.n_stop] freed with the request (a prompts line's own), or NULL */
    uint32_t *tokens;        /* [n_tokens]: prompt, then the sampled tokens */
    uint32_t cap_tokens;
    uint32_t n_prompt;
    kvp_sched_req sr;        /* n_tokens / n_computed as the scheduler counts them */
    uint32_t n_cached;       /* prompt tokens reused from the prefix cache (first admission) */
    uint64_t salt;           /* the KV cache salt of its blocks (0: none) */
    uint32_t draft[KVP_DRAFT_MAX]; /* this step's draft tokens (speculation) */
    void *draft_state;       /* the drafter's own for this request */
    uint32_t n_draft;
    int greedy_id;           /* this step asked for ids, not rows (KVP_LOGITS_ARGMAX, _ALL), into argmax */
    uint32_t argmax[KVP_DRAFT_MAX + 1];
    int sampled;             /* this step's drafts were drawn from q (draft_sampled), not chosen */
    float *q;                /* [cap_q / n_vocab][n_vocab]: their distributions */
    size_t cap_q;
    uint32_t draft_k;        /* its draft length now (adapted to its acceptance) */
    float accept;            /* adaptive, a cheap drafter: its guesses' recent acceptance (draftlen.h) */
    int draft_started;       /* adaptive: its draft length was set at its first draft (batch.c adapt_start) */
    int no_draft;            /* adaptive: it decodes plainly throughout (a costly drafter that loses: adapt_start) */
    uint32_t pause, backoff; /* adaptive: plain steps left before it guesses again, and the
                                last pause (doubling while its guesses keep failing) */
    float *hidden;           /* [n_embd]: the hidden state behind its last token's logits
                                (a drafter's draft_hidden), valid when has_hidden */
    int has_hidden;
    /* A draft tree (draft_hidden): branch 0 is draft[n_draft] on the
     * request's own sequence; each other branch b runs on a fork of it for
     * the step (branch_seq[b]): its last token, then branch_len[b] guesses */
    uint32_t n_branch;
    uint32_t branch_len[KVP_DRAFT_BRANCHES];
    uint32_t branch[KVP_DRAFT_BRANCHES][KVP_DRAFT_MAX + 1];
    int branch_seq[KVP_DRAFT_BRANCHES];
    /* ... or, where the engine takes trees, the branches merged into one
     * tree on the request's own sequence (n_nodes > 0): node 0 its last
     * token, shared guesses once; branch b's nodes node_of[b][0..len] */
    uint32_t n_nodes;
    uint32_t node_tok[1 + KVP_DRAFT_BRANCHES * KVP_DRAFT_MAX];
    int32_t node_par[1 + KVP_DRAFT_BRANCHES * KVP_DRAFT_MAX];
    uint32_t node_of[KVP_DRAFT_BRANCHES][KVP_DRAFT_MAX + 1];
    uint32_t n_drafted, n_accepted, n_verify; /* draft tokens proposed, accepted; verify steps */
    int ran;                 /* it was in a step: its prompt was computed (or its stream's KV used) */
    uint32_t kv_ahead;       /* K/V in its cache past the token being taken: the kept drafts after
                              * it, while a verify step's tokens are taken (finish drops them) */
    int holder;              /* the cache sequence (read from a stream) holding its KV, or -1: its start
                              * runs it in that sequence (g.handle), and a start the scheduler takes
                              * back (not admitted) leaves it the holder; -1 once it has run */
    double t_end;
    double itl_max;          /* longest gap between two tokens, seconds */
    float *itl;              /* [n_itl] its gaps so far, seconds: the statistics take them when it
                              * finishes, as its TTFT and E2E (a stopped job's unfinished requests
                              * count in none) */
    uint32_t n_itl, cap_itl;
    struct kvp_request *held_next; /* finished and kept (keep_finished): the caller's list link */
    int unshown;             /* ended with a budget of 0 before its stream's pending token (prefill's
                              * first) was shown: saved as prefilled, so a continuation shows it */
    void *user;
} kvp_request;

/* Where requests come from.  next: 1 with *r set (a request made with
 * kvp_request_new), 0 when none is ready now but more may come (block
 * says whether the caller would rather wait: nothing else to do), or
 * KVP_BATCH_END when there are no more; or a negative code (bad input:
 * no more is asked for, the requests taken before it run to their end,
 * and kvp_batch_run then returns that code). */
#define KVP_BATCH_END 2
typedef struct kvp_batch_source {
    void *ctx;
    int (*next)(void *ctx, int block, kvp_request **r, kvp_err *err);
} kvp_batch_source;

typedef struct kvp_batch_stats kvp_batch_stats; /* below */

typedef struct kvp_batch_opts {
    kvp_sched_opts sched;
    uint32_t lookahead;      /* waiting requests read ahead (0: 2 x max_num_seqs) */
    int keep_finished;       /* finished requests keep their KV sequence and are the
                                emit callback's to free (for saving the state) */
    int no_prefix_cache;     /* never start a request on cached blocks (for comparison) */
    kvp_metrics *metrics;    /* per-request and per-token timings, or NULL */
    volatile sig_atomic_t *stop; /* when set non-zero (a signal), the run ends after
                                    the step in progress; unfinished requests are dropped */
    /* Speculative decoding: with a drafter, a request's decode step also
     * carries up to draft_len guessed tokens, verified in the same engine
     * step (one logits row each); the request keeps the longest prefix its
     * own sampler draws, plus the sampler's next token, and the KV cache
     * forgets the rest.  draft_adaptive: each request's draft length
     * follows its acceptance (one more after a step that took them all,
     * one past what was taken after one that did not, plain steps for a
     * while, doubling, after one that took none).  A step whose
     * drafts do not fit in the KV cache runs without them. */
    const kvp_drafter *drafter;
    uint32_t draft_len;
    int draft_adaptive;
    /* A drafter of trees (draft_hidden): branches a request's draft may
     * have (0 or 1: a chain).  Each branch past the first is a fork of the
     * request's sequence in the same step (its K/V blocks shared, the
     * partial one copied); the longest kept branch becomes the sequence. */
    uint32_t draft_branches;
    /* Called after each step with the run's totals so far and the requests
     * running and waiting (NULL: none): decode's --progress. */
    void (*on_step)(void *ctx, const kvp_batch_stats *st, uint32_t running, uint32_t waiting);
    void *on_step_ctx;
} kvp_batch_opts;

/* Summary of a run (kvp_batch_run fills it). */
struct kvp_batch_stats {
    uint64_t requests, kv_memory;      /* finished; of which ended for lack of KV memory */
    uint64_t prompt_tokens, cached_tokens, generated;
    /* of prompt_tokens: those of the requests that were in a step (one
     * over before its first, max_tokens 0 or a stream's ended sequence,
     * had nothing computed) */
    uint64_t ran_prompt_tokens;
    uint64_t steps, preemptions;
    /* as the run goes (--progress): tokens generated, the unfinished
     * requests' too; prompt tokens computed, a preempted request's again */
    uint64_t generated_live, computed_prompt;
    uint32_t peak_blocks;              /* most blocks in use at once */
    uint32_t peak_running;             /* most requests running at once (in one step's plan) */
    uint64_t max_seq_len;              /* longest finished request: prompt + generated tokens */
    uint64_t dropped;                  /* unfinished when *stop was seen */
    int stopped;                       /* the run ended on *stop */
    uint32_t total_blocks;
    double seconds;
    /* of seconds: in the engine's forward steps (kvp_engine_step: the
     * model, and on a GPU the wait for it and the logits copied back), and
     * in turning their logits into tokens and output (sampling,
     * acceptance, detokenizing, stop strings, writing): what is left is
     * scheduling, drafting, reading input */
    double forward_seconds, sample_seconds;
    /* speculation: verify steps (a request's step that carried drafts),
     * draft tokens proposed and accepted, and both by position in the draft */
    uint64_t verify_steps, drafted, accepted;
    /* steps a request took a token after its first in (verify steps among
     * them), summed over requests: each gave it 1 + the drafts it kept */
    uint64_t decode_steps;
    uint64_t branch_rows;              /* rows of draft-tree branches past the first */
    uint64_t tree_steps;               /* verify steps of a tree in one sequence (kvp_step_seq.parent) */
    uint64_t drafted_at[KVP_DRAFT_MAX], accepted_at[KVP_DRAFT_MAX];
};

/* A request for prompt[n] (copied) with sampling s; id and label for its
 * output.  NULL when out of memory. */
kvp_request *kvp_request_new(const kvp_tokenizer *tok, uint64_t id, const char *label, const uint32_t *prompt,
                             uint32_t n, const kvp_sampling *s);
void kvp_request_free(kvp_request *r);
/* A request made from a saved sequence whose g.rec.next_token was sampled
 * but is not in the cache: show it first as generated text (a fresh
 * prefill's token) when show is set, then queue it to be computed.  0 or a
 * code; the request may finish right here (an end-of-generation token). */
int kvp_request_feed(kvp_request *r, int show, kvp_err *err);
/* A request made from a saved sequence that had ended: it finishes as it
 * comes in, with its record's finish reason. */
void kvp_request_end(kvp_request *r);

/* Run every request of src to its end.  emit gets text as it becomes final
 * and (n 0) each request when it has finished; the request is freed right
 * after that call (unless keep_finished).  0 or a negative code (a request that cannot fit in the
 * cache alone is not an error: it finishes with KVP_FINISH_KV_MEMORY).  A
 * source's failure ends the run after the requests already taken have
 * finished (each emitted), so a bad record in a long input loses nothing
 * read before it; any other failure ends it at once. */
int kvp_batch_run(kvp_engine *e, kvp_kvcache *kc, const kvp_tokenizer *tok, const kvp_batch_opts *o,
                  const kvp_batch_source *src, kvp_gen_emit_fn emit, void *ctx, kvp_batch_stats *st, kvp_err *err);

/* The request a kvp_gen_seq handed to emit belongs to. */
kvp_request *kvp_request_of(kvp_gen_seq *s);

#endif
