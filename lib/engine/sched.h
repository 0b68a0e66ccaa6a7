/* sched.h - iteration-level scheduling: which requests run in the next
 * forward step, and how many of their tokens (continuous batching with
 * chunked prefill and preemption by recompute, as vLLM and TensorRT-LLM's
 * in-flight batching do it).
 *
 * A request is two numbers: n_tokens, the tokens its KV cache must hold
 * (prompt, then each generated token once it is sampled), and n_computed,
 * those whose K/V are in the cache.  A step computes tokens n_computed ..
 * n_computed + k - 1 of each scheduled request; a request whose step reaches
 * n_tokens has its logits read and its next token sampled, which makes
 * n_tokens one more.  A prompt is so a run of steps of up to the token
 * budget each, a decode is one token a step, and a preempted request, whose
 * blocks were given back (n_computed 0), is simply computed again: its
 * prompt and generated tokens are all still known.
 *
 * Each step (kvp_sched_step):
 *   1. Running requests first, oldest first, each as many tokens as it has
 *      left and the budget (--max-batched-tokens) allows.  When the KV cache
 *      cannot hold them, the newest running request is preempted (its blocks
 *      given back, itself put first in the waiting queue) until it can.  A
 *      request that cannot fit even alone ends with KVP_SCHED_KV_MEMORY.
 *   2. Then, when nothing was preempted, waiting requests in order while
 *      --max-num-seqs and the budget allow and the cache has the blocks for
 *      their first chunk plus a watermark (so admitting does not cause the
 *      next step's preemption).
 * With static batching (the old way, for comparison) a new batch of up to
 * max_num_seqs requests is admitted only when the last batch has ended.
 *
 * The scheduler never touches the KV cache itself: it asks and acts through
 * kvp_sched_kv, so its decisions are unit-tested on scripted arrivals with
 * a pretend cache (tests/unit/test_sched.c).
 */
#ifndef KVP_SCHED_H
#define KVP_SCHED_H

#include "error.h"

#include <stddef.h>
#include <stdint.h>

enum kvp_sched_state {
    KVP_SCHED_WAITING = 0,
    KVP_SCHED_RUNNING = 1,
    KVP_SCHED_DONE = 2,         /* finished by the caller (kvp_sched_finish) */
    KVP_SCHED_KV_MEMORY = 3,    /* ended by the scheduler: cannot fit in the cache alone */
};

typedef struct kvp_sched_req {
    uint32_t n_tokens;     /* tokens the cache must hold (prompt + sampled) */
    uint32_t n_computed;   /* of which computed (in the cache) */
    int state;             /* kvp_sched_state */
    uint32_t n_preempted;  /* times it gave its blocks back */
    uint64_t order;        /* admission order (newest preempted first) */
    void *user;            /* the caller's request */
} kvp_sched_req;

/* The KV cache as the scheduler sees it. */
typedef struct kvp_sched_kv {
    void *ctx;
    /* Blocks that can be taken now. */
    uint32_t (*n_free)(void *ctx);
    /* Blocks r needs to hold n more tokens beyond its n_computed. */
    uint32_t (*blocks_needed)(void *ctx, const kvp_sched_req *r, uint32_t n);
    /* Make a cache sequence for waiting r, reusing cached prefix blocks:
     * returns the tokens reused (r->n_computed becomes that), or a negative
     * code. */
    int (*start)(void *ctx, kvp_sched_req *r, kvp_err *err);
    /* Give back r's sequence and blocks (preemption, the end, or an
     * admission that did not fit). */
    void (*release)(void *ctx, kvp_sched_req *r);
    /* Optional (NULL: never): tokens of waiting w's prompt, past the
     * n_computed its start just gave it, that running r is about to put in
     * the prefix cache (their common prefix in whole blocks, not computed
     * by r yet).  Above 0: w waits a step rather than compute them again
     * beside r (a shared system prompt admitted in one step many times). */
    uint32_t (*ahead)(void *ctx, const kvp_sched_req *w, const kvp_sched_req *r);
    /* Optional (NULL: none hold any): give back the blocks waiting w holds
     * before its start (a KV stream's sequence arrives with its blocks);
     * whether it held any.  Called before a request is ended for lack of
     * memory: w then computes its prompt when admitted, as a preempted
     * request does. */
    int (*drop_held)(void *ctx, kvp_sched_req *w);
} kvp_sched_kv;

typedef struct kvp_sched_opts {
    uint32_t max_num_seqs;        /* running requests at most (0: 256) */
    uint32_t max_batched_tokens;  /* tokens a step at most (0: 2048) */
    uint32_t watermark_blocks;    /* kept free when admitting */
    int static_batch;             /* admit a new batch only when the last one ended */
    uint32_t lookahead;           /* budget each decode step keeps beyond its token (vLLM's
                                     lookahead slots: a fixed draft length's guesses), so prompt
                                     chunks do not take it; as far as the budget goes, every
                                     decode step's own token first */
} kvp_sched_opts;

/* One scheduled request of a step: compute n tokens from r->n_computed. */
typedef struct kvp_sched_item {
    kvp_sched_req *r;
    uint32_t n;
} kvp_sched_item;

typedef struct kvp_sched_plan {
    kvp_sched_item *items;   /* [n_items], running order */
    uint32_t n_items;
    uint32_t n_tokens;       /* sum of the items' n */
    kvp_sched_req **ended;   /* [n_ended]: ended this step (KVP_SCHED_KV_MEMORY) */
    uint32_t n_ended;
    uint32_t n_preempted;    /* requests preempted this step */
} kvp_sched_plan;

typedef struct kvp_sched kvp_sched;

int kvp_sched_create(kvp_sched **s, const kvp_sched_opts *o, const kvp_sched_kv *kv, kvp_err *err);
void kvp_sched_free(kvp_sched *s);
/* Queue r (n_tokens set, n_computed 0) at the back of the waiting queue. */
int kvp_sched_add(kvp_sched *s, kvp_sched_req *r, kvp_err *err);
/* Plan the next step into *plan (valid until the next call).  0, or a
 * negative code from kv->start.  An empty plan with nothing running and
 * nothing waiting means all is done. */
int kvp_sched_step(kvp_sched *s, kvp_sched_plan *plan, kvp_err *err);
/* After the step ran: each item's request has n more tokens computed.  The
 * caller then samples, and grows n_tokens, where a request reached its end. */
void kvp_sched_commit(kvp_sched *s, const kvp_sched_plan *plan);
/* A running request has finished: its blocks go back (kv->release). */
void kvp_sched_finish(kvp_sched *s, kvp_sched_req *r);
/* Take out any request still running (its blocks given back) or waiting,
 * or NULL when none is left: for cleaning up after a failure. */
kvp_sched_req *kvp_sched_drain(kvp_sched *s);
uint32_t kvp_sched_n_running(const kvp_sched *s);
uint32_t kvp_sched_n_waiting(const kvp_sched *s);
/* Preemptions so far. */
uint64_t kvp_sched_n_preemptions(const kvp_sched *s);

#endif
