/* batch.c - the batch engine's loop (see batch.h).
 *
 * Each iteration: read requests while the waiting queue is short, let the
 * scheduler plan a step, run it as one engine step, then for every request
 * whose step reached its last token sample the next one, accept it as text
 * (end of generation, stop strings, budget) and hand finished requests out.
 */
#include "batch.h"
#include "argmax.h"
#include "draftlen.h"
#include "sample.h"
#include "specverify.h"
#include "unicode.h"

#include <stddef.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>


kvp_request *kvp_request_of(kvp_gen_seq *s) { return (kvp_request *)(void *)((char *)s - offsetof(kvp_request, g)); }

kvp_request *kvp_request_new(const kvp_tokenizer *tok, uint64_t id, const char *label, const uint32_t *prompt,
                             uint32_t n, const kvp_sampling *s)
{
    kvp_request *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->cap_tokens = n + 16;
    r->tokens = malloc((size_t)r->cap_tokens * sizeof *r->tokens);
    if (!r->tokens) {
        free(r);
        return NULL;
    }
    memcpy(r->tokens, prompt, (size_t)n * sizeof *prompt);
    r->n_prompt = n;
    r->sr.n_tokens = n;
    r->sr.user = r;
    kvp_gen_seq_init(&r->g, tok);
    r->g.handle = -1;
    r->holder = -1;
    r->g.rec.id = id;
    snprintf(r->g.rec.label, sizeof r->g.rec.label, "%s", label ? label : "");
    r->g.rec.sampling = *s;
    r->g.rec.n_prompt = n;
    r->g.rec.next_token = -1;
    r->g.rec.state = KVP_SEQ_RUNNING;
    return r;
}

void kvp_request_free(kvp_request *r)
{
    if (!r)
        return;
    kvp_gen_seq_free(&r->g);
    if (r->stop_owned) {
        for (size_t k = 0; k < r->opts.n_stop; k++)
            free(r->stop_owned[k]);
        free(r->stop_owned);
    }
    free(r->tokens);
    free(r->q);
    free(r->hidden);
    free(r->itl);
    free(r);
}

/* One more gap between two of r's tokens, kept until it finishes. */
static int request_push_itl(kvp_request *r, double gap)
{
    if (r->n_itl == r->cap_itl) {
        uint32_t cap = r->cap_itl ? r->cap_itl * 2 : 64;
        float *v = realloc(r->itl, (size_t)cap * sizeof *v);
        if (!v)
            return -1;
        r->itl = v;
        r->cap_itl = cap;
    }
    r->itl[r->n_itl++] = (float)gap;
    return 0;
}

static int request_push(kvp_request *r, uint32_t t)
{
    if (r->sr.n_tokens == r->cap_tokens) {
        uint32_t cap = r->cap_tokens * 2;
        uint32_t *v = realloc(r->tokens, (size_t)cap * sizeof *v);
        if (!v)
            return KVP_ENOMEM;
        r->tokens = v;
        r->cap_tokens = cap;
    }
    r->tokens[r->sr.n_tokens++] = t;
    return 0;
}

int kvp_request_feed(kvp_request *r, int show, kvp_err *err)
{
    r->g.rec.state = KVP_SEQ_RUNNING;
    r->g.rec.finish_reason = KVP_FINISH_NONE;
    if (show) {
        int rc = kvp_gen_accept(&r->g, r->g.dt.t, &r->opts, NULL, NULL, err);
        if (rc < 0)
            return rc;
        if (rc) {
            r->g.rec.state = KVP_SEQ_FINISHED;
            return 0;
        }
    }
    if (request_push(r, (uint32_t)r->g.rec.next_token) < 0)
        return kvp_err_set(err, KVP_ENOMEM, "request %llu: out of memory for its tokens",
                           (unsigned long long)r->g.rec.id);
    return 0;
}

void kvp_request_end(kvp_request *r) { r->g.rec.state = KVP_SEQ_FINISHED; }

/* ---- the KV cache as the scheduler sees it ---- */

/* draft_together's arguments for a step's requests ([max_num_seqs] each;
 * out KVP_DRAFT_MAX a request). */
typedef struct batch_drafts {
    kvp_request **req;
    void ***state;
    const uint32_t **tokens;
    uint32_t *n_tokens, *k, *out, *got;
    kvp_sampling **s;
    float **q;
} batch_drafts;

static int batch_drafts_alloc(batch_drafts *q, uint32_t n)
{
    q->req = malloc(n * sizeof *q->req), q->state = malloc(n * sizeof *q->state);
    q->tokens = malloc(n * sizeof *q->tokens), q->n_tokens = malloc(n * sizeof *q->n_tokens);
    q->k = malloc(n * sizeof *q->k), q->got = malloc(n * sizeof *q->got);
    q->out = malloc((size_t)n * KVP_DRAFT_MAX * sizeof *q->out);
    q->s = malloc(n * sizeof *q->s), q->q = malloc(n * sizeof *q->q);
    return q->req && q->state && q->tokens && q->n_tokens && q->k && q->got && q->out && q->s && q->q ? 0 : -1;
}

static void batch_drafts_free(batch_drafts *q)
{
    free(q->req), free(q->state), free(q->tokens), free(q->n_tokens), free(q->k), free(q->got), free(q->out);
    free(q->s), free(q->q);
}

typedef struct batch {
    int keep;            /* keep_finished */
    int no_prefix;       /* no_prefix_cache */
    kvp_metrics *metrics;
    kvp_engine *e;
    kvp_kvcache *kc;
    const kvp_tokenizer *tok;
    kvp_gen_emit_fn emit;
    void *ctx;
    kvp_batch_stats *st;
    const kvp_batch_opts *o;
    float *p;            /* speculative sampling: the target's distributions [KVP_DRAFT_MAX + 1][n_vocab] */
    uint32_t backoff;    /* --draft-len auto: the backoff the last verify step left its request with,
                          * where a new request starts (the drafter's record on this job) */
    uint32_t draft_k;    /* and its draft length, where a costly drafter's new request starts */
    /* --draft-len auto's clock, from decode steps (no prompt in them):
     * t_plain[R] the seconds of a plain step of R requests (a moving
     * average; 0: none yet), spec_gain the tokens speculative steps gave
     * over what plain steps of as many requests would give in their time
     * (a moving average), step_tokens what this step's requests gave */
    double *t_plain, spec_gain;
    uint32_t max_req;     /* t_plain's last index */
    uint32_t step_tokens;
    int probe;            /* this step runs plain (KVP_PLAIN_PROBE) */
    uint32_t since_plain; /* speculative steps since the last plain one (KVP_PLAIN_PROBE) */
    uint32_t n_timed;     /* speculative steps spec_gain has taken in */
    int one_tree;         /* draft trees go in one sequence (kvp_engine_takes_trees), not forks */
    float *path_rows;     /* a branch's logits rows gathered from a tree's ([KVP_DRAFT_MAX + 1][n_vocab]) */
    float *path_hid;      /* and its hidden rows ([KVP_DRAFT_MAX + 1][n_embd]) */
    uint32_t n_started;   /* requests that started drafting (adapt_start) */
    uint32_t n_retries;   /* tries after a pause while the drafter was losing (draft_room) */
    uint32_t step_room;   /* tokens the step may still take for drafts (--max-batched-tokens) */
    uint32_t n_explored;  /* requests that started drafting before the clock judged (adapt_start) */
    float *hid;          /* a drafter from hidden states: the last step's, a row per logits row */
    size_t cap_hid;      /* floats hid holds */
    /* draft_hidden's arguments for a step's requests ([max_num_seqs] each,
     * times KVP_DRAFT_BRANCHES, times KVP_DRAFT_MAX) */
    kvp_request **tree_req;
    const float **tree_hid;
    uint32_t *tree_k, *tree_out, *tree_len, *tree_nb;
    batch_drafts together; /* draft_together's, with a drafter of a step's requests at once */
    /* --draft-len auto with a cheap drafter: the steps' measured cost by
     * their tokens, and the step being drafted for: its tokens so far and
     * the tokens it yields without guesses (draft_len) */
    kvp_draftlen dl;
    uint32_t len_tokens, len_yield;
} batch;

static uint32_t kv_n_free(void *ctx)
{
    kvp_kvcache_stats s;
    kvp_kvcache_get_stats(((batch *)ctx)->kc, &s);
    return s.n_free;
}

static uint32_t kv_needed(void *ctx, const kvp_sched_req *sr, uint32_t n)
{
    const kvp_request *r = sr->user;
    uint64_t k = kvp_kvcache_seq_blocks_needed(((batch *)ctx)->kc, r->g.handle, n);
    return k > UINT32_MAX ? UINT32_MAX : (uint32_t)k;
}

/* A stream's request runs in the cache sequence it came with (its holder):
 * every block prefill sent is its own, the partial last one included (that
 * one is registered under no hash, so no other request shares it), and only
 * the tokens the stream lacks are computed.  At least the last token is left
 * to compute, since its logits give the next one.  Returns the tokens kept. */
static uint32_t kv_adopt(batch *b, kvp_request *r, uint32_t n, kvp_err *err)
{
    int h = r->holder;
    uint32_t len = kvp_kvcache_seq_len(b->kc, h), keep = 0;
    const uint32_t *t = kvp_kvcache_seq_tokens(b->kc, h);
    while (keep < len && keep + 1 < n && t[keep] == r->tokens[keep])
        keep++;
    if (keep < len)
        kvp_kvcache_seq_truncate(b->kc, h, keep, err); /* keep <= len: cannot fail */
    r->g.handle = h; /* holder stays set until the scheduler admits r (kv_release) */
    return keep;
}

/* A cache sequence for r, with the cached blocks of its tokens' prefix. */
static int kv_start(void *ctx, kvp_sched_req *sr, kvp_err *err)
{
    batch *b = ctx;
    kvp_request *r = sr->user;
    if (r->holder >= 0) {
        uint32_t got = kv_adopt(b, r, sr->n_tokens, err);
        if (sr->n_preempted == 0)
            r->n_cached = got;
        return (int)got;
    }
    int h = kvp_kvcache_seq_new(b->kc, err);
    if (h < 0)
        return h;
    r->g.handle = h;
    int got = kvp_kvcache_seq_set_salt(b->kc, h, r->salt, err);
    if (got == 0 && !b->no_prefix)
        got = kvp_kvcache_seq_share_prefix(b->kc, h, r->tokens, sr->n_tokens, err);
    if (got < 0) {
        kvp_kvcache_seq_free(b->kc, h);
        r->g.handle = -1;
        return got;
    }
    if (sr->n_preempted == 0)
        r->n_cached = (uint32_t)got;
    return got;
}

/* Whole blocks of waiting w's prompt that running q is computing now and
 * w could then take from the prefix cache: their common prefix (same salt;
 * w's last token always computed) past what w was given, where q has not
 * computed it yet. */
static uint32_t kv_ahead(void *ctx, const kvp_sched_req *ws, const kvp_sched_req *qs)
{
    const batch *b = ctx;
    const kvp_request *w = ws->user, *q = qs->user;
    if (b->no_prefix || w->holder >= 0 || w->salt != q->salt || ws->n_tokens == 0)
        return 0;
    uint32_t n = ws->n_tokens - 1 < qs->n_tokens ? ws->n_tokens - 1 : qs->n_tokens, c = 0;
    while (c < n && w->tokens[c] == q->tokens[c])
        c++;
    c -= c % kvp_kvcache_pool(b->kc)->block_size;
    return c > ws->n_computed && qs->n_computed < c ? c - ws->n_computed : 0;
}

/* A waiting stream request's own sequence freed (its full blocks stay in
 * the prefix cache while room allows): it starts as a prompt does. */
static int kv_drop_held(void *ctx, kvp_sched_req *sr)
{
    batch *b = ctx;
    kvp_request *r = sr->user;
    if (r->holder < 0)
        return 0;
    kvp_kvcache_seq_free(b->kc, r->holder);
    r->holder = -1;
    r->g.handle = -1;
    return 1;
}

static void kv_release(void *ctx, kvp_sched_req *sr)
{
    batch *b = ctx;
    kvp_request *r = sr->user;
    uint32_t why = r->g.rec.finish_reason;
    if (r->holder >= 0 && sr->state == KVP_SCHED_WAITING) {
        r->g.handle = -1; /* not admitted after all: the stream's KV waits with it */
        return;
    }
    r->holder = -1; /* the sequence it came with ran: it goes as any other */
    if (b->keep && why != KVP_FINISH_NONE && why != KVP_FINISH_KV_MEMORY)
        return; /* finished: its KV stays for the caller to save */
    kvp_kvcache_seq_free(b->kc, r->g.handle);
    r->g.handle = -1;
}

/* ---- sampling and finishing ---- */

static int sample_next(kvp_request *r, float *logits, uint32_t n_vocab, kvp_err *err)
{
    uint32_t len = r->sr.n_tokens, w = len < KVP_SAMPLE_WINDOW ? len : KVP_SAMPLE_WINDOW;
    int t = kvp_sample_next(&r->g.rec.sampling, logits, n_vocab, r->tokens + (len - w), w, err);
    if (t < 0)
        return t;
    r->g.rec.next_token = t;
    return 0;
}

/* The drafter's state for r goes with r. */
static void drop_draft_state(const kvp_batch_opts *o, kvp_request *r)
{
    if (r->draft_state && o->drafter && o->drafter->release)
        o->drafter->release(o->drafter->ctx, r->draft_state);
    r->draft_state = NULL;
}

static int finish(batch *b, kvp_request *r, kvp_err *err)
{
    drop_draft_state(b->o, r);
    r->t_end = kvp_gen_now();
    r->g.rec.state = KVP_SEQ_FINISHED;
    int failed = r->g.rec.finish_reason == KVP_FINISH_KV_MEMORY; /* the only way a finished request fails */
    if (r->holder >= 0) { /* never ran: the stream's sequence is its KV (kept as kv_release keeps) */
        /* its prompt came from the stream's blocks, as an admitted one's
         * does (kv_start): the hit rate counts it alike */
        r->n_cached = r->n_prompt;
        if (b->keep && r->g.handle < 0 && !failed)
            r->g.handle = r->holder;
        else
            kvp_kvcache_seq_free(b->kc, r->holder);
        r->holder = -1;
    }
    /* a kept state ends where its tokens do (a verify step's kept drafts
     * past the one it finished at are dropped), and where the shown text
     * does: the next turn (prefill --resume) must not see the stop string,
     * in the cache or pending */
    if (b->keep && r->g.handle >= 0) {
        uint32_t len = kvp_kvcache_seq_len(b->kc, r->g.handle), want = len - (r->kv_ahead < len ? r->kv_ahead : len);
        int stop = r->g.rec.finish_reason == KVP_FINISH_STOP_STRING;
        if (stop && r->g.n_hidden <= want)
            want -= r->g.n_hidden;
        int rc = want < len ? kvp_kvcache_seq_truncate(b->kc, r->g.handle, want, err) : 0;
        if (rc < 0)
            return rc;
        if (stop)
            r->g.rec.next_token = -1;
    }
    r->kv_ahead = 0;
    kvp_batch_stats *st = b->st;
    st->requests++;
    st->kv_memory += failed;
    st->prompt_tokens += r->n_prompt;
    st->ran_prompt_tokens += r->ran ? r->n_prompt : 0;
    st->cached_tokens += r->n_cached;
    st->generated += r->g.n_gen;
    if ((uint64_t)r->n_prompt + r->g.n_gen > st->max_seq_len)
        st->max_seq_len = (uint64_t)r->n_prompt + r->g.n_gen;
    if (b->emit && r->g.text.len > r->g.emitted) /* text accepted before it ran */
        b->emit(b->ctx, &r->g, (const char *)r->g.text.data + r->g.emitted, r->g.text.len - r->g.emitted);
    r->g.emitted = r->g.text.len;
    if (b->emit)
        b->emit(b->ctx, &r->g, NULL, 0);
    /* E2E is arrival to the end, whether or not a token came: its last
     * token, else when it was ended (max_tokens 0, or kv_memory before its
     * first token: a client waited that long for its answer of none) */
    double t_end = r->g.t_last > 0 ? r->g.t_last : kvp_gen_now();
    int rc = b->metrics ? kvp_metrics_add_request(b->metrics, r->g.t_start, r->g.t_first, t_end, r->g.n_gen, failed, err)
                        : 0;
    for (uint32_t i = 0; b->metrics && i < r->n_itl; i++)
        kvp_metrics_add_itl(b->metrics, r->itl[i]);
    free(r->itl);
    r->itl = NULL;
    r->n_itl = r->cap_itl = 0;
    if (!b->keep)
        kvp_request_free(r);
    return rc;
}

/* r's sampled token (g.rec.next_token) as generated: accept it, and finish
 * or go on.  1 when r finished (and is freed unless kept), 0 when it goes
 * on, or a code. */
static int take_token(batch *b, kvp_sched *s, kvp_request *r, kvp_err *err)
{
    double before = r->g.t_last;
    uint32_t had = r->g.n_gen;
    int rc = kvp_gen_accept(&r->g, b->tok, &r->opts, b->emit, b->ctx, err);
    if (rc < 0)
        return rc;
    b->st->generated_live += r->g.n_gen - had;
    if (before > 0 && r->g.n_gen > had) { /* a token shown (an end token is not) */
        double gap = r->g.t_last - before;
        if (gap > r->itl_max)
            r->itl_max = gap;
        if (b->metrics && request_push_itl(r, gap) < 0)
            return kvp_err_set(err, KVP_ENOMEM, "request %llu: out of memory for its token gaps",
                               (unsigned long long)r->g.rec.id);
    }
    if (rc) {
        kvp_sched_finish(s, &r->sr);
        return (rc = finish(b, r, err)) < 0 ? rc : 1;
    }
    if (request_push(r, (uint32_t)r->g.rec.next_token) < 0)
        return kvp_err_set(err, KVP_ENOMEM, "request %llu: out of memory for its tokens",
                           (unsigned long long)r->g.rec.id);
    return 0;
}

/* r's next token comes from the logits row whose hidden state is h (a
 * row of b->hid; NULL when no drafter asks for them): r keeps it for its
 * next draft.  No room for it means no draft next time, nothing worse. */
static void keep_hidden(batch *b, kvp_request *r, const float *h)
{
    r->has_hidden = 0;
    if (!h)
        return;
    uint32_t d = kvp_engine_n_embd(b->e);
    if (!r->hidden && !(r->hidden = malloc((size_t)d * sizeof *r->hidden)))
        return;
    memcpy(r->hidden, h, (size_t)d * sizeof *r->hidden);
    r->has_hidden = 1;
}

/* r's step reached its last token: sample, accept, and finish or go on.
 * h: the hidden state of the row (NULL: not kept). */
static int advance(batch *b, kvp_sched *s, kvp_request *r, float *logits, const float *h, kvp_err *err)
{
    int rc = 0;
    if (r->greedy_id)
        r->g.rec.next_token = r->argmax[0]; /* the engine picked it: no row came back */
    else
        rc = sample_next(r, logits, kvp_engine_n_vocab(b->e), err);
    keep_hidden(b, r, h);
    return rc < 0 ? rc : take_token(b, s, r, err);
}

/* Whether r's tokens this step are its rows' argmax alone, so the engine
 * may give ids instead of rows (KVP_LOGITS_ARGMAX, _ALL): greedy with no
 * repetition penalty, and drafts (if any) chosen in one chain, from a
 * drafter that needs no hidden states (those rows follow the requests'
 * order). */
static int ids_suffice(const batch *b, const kvp_request *r)
{
    const kvp_sampling *sm = &r->g.rec.sampling;
    const kvp_drafter *d = b->o->drafter;
    return sm->temperature <= 0 && sm->repeat_penalty == 1 &&
           (!d || (!d->draft_hidden && !r->sampled && r->n_branch <= 1 && !r->n_nodes));
}

/* ---- speculation ---- */

/* A drafter from hidden states' tree for r, as draft_hidden gave it
 * (out, len: r's own part): branch 0 in r->draft and after r's tokens
 * (room made by draft_room), the others in r->branch (their forks are made
 * with the step).  Branch 0's length. */
static uint32_t take_tree(kvp_request *r, uint32_t k, uint32_t nb, const uint32_t *out, const uint32_t *len)
{
    uint32_t n = r->sr.n_tokens;
    r->n_branch = 0;
    for (uint32_t i = 0; i < nb && i < KVP_DRAFT_BRANCHES && len[i] > 0; i++) { /* an empty branch ends it */
        uint32_t m = len[i] < k ? len[i] : k;
        r->branch_len[i] = m;
        r->branch[i][0] = r->tokens[n - 1];
        memcpy(r->branch[i] + 1, out + (size_t)i * KVP_DRAFT_MAX, m * sizeof *out);
        r->branch_seq[i] = -1;
        r->n_branch++;
    }
    if (!r->n_branch)
        return 0;
    memcpy(r->draft, r->branch[0] + 1, r->branch_len[0] * sizeof *r->draft);
    memcpy(r->tokens + n, r->draft, r->branch_len[0] * sizeof *r->tokens);
    return r->branch_len[0];
}

/* r's branches merged into one tree (kvp_step_seq.parent) where the
 * engine takes them: a guess its branch shares with an earlier branch
 * (the same tokens from the root) is one node.  Sets n_nodes. */
static void merge_tree(kvp_request *r)
{
    r->n_nodes = 1;
    r->node_tok[0] = r->branch[0][0], r->node_par[0] = -1;
    for (uint32_t b = 0; b < r->n_branch; b++) {
        uint32_t at = 0;
        r->node_of[b][0] = 0;
        for (uint32_t j = 1; j <= r->branch_len[b]; j++) {
            uint32_t tok = r->branch[b][j], c = 0;
            while (c < r->n_nodes && !(r->node_par[c] == (int32_t)at && r->node_tok[c] == tok))
                c++;
            if (c == r->n_nodes) {
                r->node_tok[c] = tok, r->node_par[c] = (int32_t)at;
                r->n_nodes++;
            }
            r->node_of[b][j] = at = c;
        }
    }
}

/* The forks of r's draft tree (branches past the first) go. */
static void drop_forks(batch *b, kvp_request *r)
{
    for (uint32_t i = 1; i < r->n_branch; i++)
        if (r->branch_seq[i] >= 0) {
            kvp_kvcache_seq_free(b->kc, r->branch_seq[i]);
            r->branch_seq[i] = -1;
        }
}

/* The forks of r's draft tree's branches past the first, each a step entry
 * after r's; the rows they add.  A fork the cache cannot make ends the
 * tree there. */
static uint32_t add_forks(batch *b, kvp_request *r, kvp_step_seq *step, uint32_t *n_step)
{
    uint32_t rows = 0;
    for (uint32_t i = 1; i < r->n_branch; i++) {
        int f = kvp_kvcache_seq_fork(b->kc, r->g.handle, NULL);
        if (f < 0) {
            r->n_branch = i;
            break;
        }
        r->branch_seq[i] = f;
        step[(*n_step)++] = (kvp_step_seq){.seq = f, .tokens = r->branch[i], .n_tokens = 1 + r->branch_len[i],
                                           .want = KVP_LOGITS_ALL};
        rows += 1 + r->branch_len[i];
    }
    return rows;
}

/* A costly drafter whose steps have given fewer tokens than plain steps
 * would in their time (spec_gain, over at least KVP_GAIN_JUDGED of them)
 * drafts for one new request in KVP_GAIN_RETRY, and one backed-off
 * request in KVP_GAIN_RETRY tries again: a draft model pays a prefill of
 * each request's prompt before its first guess, and of the tokens it
 * missed before each try, which a request that then backs off never earns
 * back (in a batch they come all at once). */
#define KVP_GAIN_JUDGED 8
#define KVP_GAIN_RETRY 8
#define KVP_GAIN_LOSING 0.9

static int drafter_losing(const batch *b)
{
    return !b->o->drafter->cheap && b->n_timed >= KVP_GAIN_JUDGED && b->spec_gain < KVP_GAIN_LOSING;
}

/* Where a request's adaptive drafting starts, at its first draft: where
 * the job's last verify step left its request.  A drafter that has been
 * failing on this job starts paused with one guess, not with a full draft
 * a request, so short requests do not each pay the climb down.  A costly
 * drafter's first requests start at one guess and climb (b->draft_k): a
 * batch's first step, every request drafting at once, would otherwise pay
 * a full draft and its verify for each before the clock has a word; and
 * until the clock has judged it, only the first KVP_EXPLORERS requests
 * draft (the others wait, decoding plainly): a draft model's first guess
 * for a request costs a prefill of its prompt, which every request of a
 * batch would pay before the job knows whether drafting pays.  A drafter
 * that wins is judged within a few steps (each of its steps is timed); one
 * that loses backs off, and the job runs as decode would.  0: r waits. */
#define KVP_EXPLORERS 2
static int adapt_start(batch *b, kvp_request *r)
{
    int costly = !b->o->drafter->cheap, judged = b->n_timed >= KVP_GAIN_JUDGED;
    if (costly && !judged && b->n_explored >= KVP_EXPLORERS)
        return 0; /* plain steps until the clock has judged */
    r->draft_started = 1;
    b->n_explored += costly && !judged;
    if (drafter_losing(b))
        r->no_draft = b->n_started % KVP_GAIN_RETRY != 0;
    b->n_started++;
    if (costly)
        r->draft_k = b->draft_k;
    if (b->backoff)
        r->backoff = r->pause = b->backoff, r->draft_k = 1;
    return 1;
}

/* Whether item i of plan p is a decode step: one token, its request's last
 * (not a prompt chunk). */
static int decode_step(const kvp_sched_plan *p, uint32_t i)
{
    const kvp_request *r = p->items[i].r->user;
    return p->items[i].n == 1 && r->sr.n_computed + 1 == r->sr.n_tokens;
}

/* Whether plan p is decode steps alone (no prompt chunk, whose cost would
 * blur the clock's). */
static int decode_only(const kvp_sched_plan *p)
{
    for (uint32_t i = 0; i < p->n_items; i++)
        if (!decode_step(p, i))
            return 0;
    return p->n_items > 0;
}

/* --draft-len auto with a drafter that guesses for free (prompt lookup):
 * its length chosen a step at a time from the steps' measured cost
 * (draftlen.h), not climbed and backed off as a costly drafter's is. */
static int cheap_auto(const batch *b)
{
    return b->o->draft_adaptive && b->o->drafter->cheap;
}

/* r's guesses this step, most at most (cheap_auto): what the step's
 * measured cost and r's acceptance make worth it, counted into the step. */
static uint32_t draft_len(batch *b, kvp_request *r, uint32_t most)
{
    uint32_t k = kvp_draftlen_choose(&b->dl, b->len_tokens, b->len_yield, r->accept, most);
    if (!k)
        r->accept = kvp_draftlen_idle(r->accept);
    b->len_tokens += k;
    return k;
}

/* A costly drafter under --draft-len auto: one step in this many goes
 * plain, so adapt's clock knows what a plain step costs even while every
 * guess is kept (and knows it at once, from a job's first step). */
#define KVP_PLAIN_PROBE 16

/* How many guesses r's next step may carry (its draft length, within its
 * token budget), with room for them after its tokens; 0 for none. */
static uint32_t draft_room(batch *b, kvp_request *r)
{
    if (b->o->draft_adaptive && !r->draft_started && !adapt_start(b, r))
        return 0;
    if (b->o->draft_adaptive && r->no_draft)
        return 0;
    if (b->probe)
        return 0;
    uint32_t k = b->o->draft_adaptive ? r->draft_k : b->o->draft_len;
    if (b->o->draft_adaptive && r->pause) { /* its guesses failed: plain steps first */
        r->pause--;
        return 0;
    }
    if (b->o->draft_adaptive && r->backoff && drafter_losing(b) && (r->no_draft = b->n_retries++ % KVP_GAIN_RETRY != 0))
        return 0; /* a try after a pause, of a losing drafter */
    if (!k)
        return 0;
    uint32_t n = r->sr.n_tokens;
    if (r->cap_tokens - n < k) {
        uint32_t cap = r->cap_tokens * 2 + k;
        uint32_t *v = realloc(r->tokens, (size_t)cap * sizeof *v);
        if (!v)
            return 0; /* no room to guess: decode plainly */
        r->tokens = v;
        r->cap_tokens = cap;
    }
    /* the step draws one token besides the kept drafts: a draft past the
     * budget's last token could never be kept */
    uint32_t budget = kvp_gen_budget(&r->g, &r->opts);
    uint32_t room = budget > r->g.n_gen + 1 ? budget - r->g.n_gen - 1 : 0;
    k = k < room ? k : room;
    /* the drafts count against the step's token budget like any token: a
     * tree of B branches takes up to B of them a depth */
    uint32_t width = b->o->draft_branches > 1 ? b->o->draft_branches : 1;
    k = k < b->step_room / width ? k : b->step_room / width;
    if (cheap_auto(b))
        k = draft_len(b, r, k);
    b->step_room -= k * width;
    return k;
}

/* r made ready to draft for its decode step: the most guesses it may take
 * (0: none), with r->sampled, room for its distributions and, for a
 * drafter in the target's cache, its state set. */
static uint32_t draft_setup(batch *b, kvp_request *r)
{
    uint32_t k = draft_room(b, r), V = kvp_engine_n_vocab(b->e);
    const kvp_drafter *d = b->o->drafter;
    r->sampled = d->draft_sampled && r->g.rec.sampling.temperature > 0;
    if (k && r->sampled && r->cap_q < (size_t)k * V) {
        float *q = realloc(r->q, (size_t)k * V * sizeof *q);
        if (!q)
            return 0; /* no room for the distributions: decode plainly */
        r->q = q;
        r->cap_q = (size_t)k * V;
    }
    if (d->on_target_cache)
        r->draft_state = (void *)(intptr_t)(r->g.handle + 1);
    return k;
}

/* m guesses for r (in r->draft) written after its tokens, where the step
 * reads them; m. */
static uint32_t draft_took(kvp_request *r, uint32_t m)
{
    memcpy(r->tokens + r->sr.n_tokens, r->draft, m * sizeof *r->tokens);
    return m;
}

/* Drafts for r's decode step, a request at a time; the count, 0 for none. */
static uint32_t draft_for(batch *b, kvp_request *r)
{
    uint32_t k = draft_setup(b, r), n = r->sr.n_tokens, m = 0;
    const kvp_drafter *d = b->o->drafter;
    if (k)
        m = r->sampled ? d->draft_sampled(d->ctx, &r->draft_state, r->tokens, n, k, r->draft, &r->g.rec.sampling, r->q)
                       : d->draft(d->ctx, &r->draft_state, r->tokens, n, k, r->draft);
    return draft_took(r, m);
}

/* A drafter of a step's requests at once (draft_batch): the drafts of
 * every request of plan p whose step is a decode step, in one call; the
 * others get none.  Sets each one's n_draft. */
static void draft_together(batch *b, const kvp_sched_plan *p)
{
    const kvp_drafter *d = b->o->drafter;
    batch_drafts *q = &b->together;
    uint32_t n = 0;
    for (uint32_t i = 0; i < p->n_items; i++) {
        kvp_request *r = p->items[i].r->user;
        r->n_draft = r->n_branch = r->n_nodes = 0;
        r->sampled = 0;
        if (!decode_step(p, i))
            continue;
        uint32_t k = draft_setup(b, r);
        if (!k)
            continue;
        q->req[n] = r, q->state[n] = &r->draft_state, q->tokens[n] = r->tokens, q->n_tokens[n] = r->sr.n_tokens;
        q->k[n] = k, q->s[n] = r->sampled ? &r->g.rec.sampling : NULL, q->q[n] = r->sampled ? r->q : NULL;
        n++;
    }
    if (!n)
        return;
    d->draft_batch(d->ctx, n, q->state, q->tokens, q->n_tokens, q->k, q->s, q->q, q->out, q->got);
    for (uint32_t i = 0; i < n; i++) {
        kvp_request *r = q->req[i];
        memcpy(r->draft, q->out + (size_t)i * KVP_DRAFT_MAX, q->got[i] * sizeof *r->draft);
        r->n_draft = draft_took(r, q->got[i]);
    }
}

/* A drafter from hidden states: the trees of every request of plan p whose
 * step is a decode step and that has its hidden state, in one call; the
 * others get none.  Sets each one's n_draft and n_branch. */
static void draft_trees(batch *b, const kvp_sched_plan *p)
{
    const kvp_drafter *d = b->o->drafter;
    uint32_t n = 0, max_b = b->o->draft_branches > 1 ? b->o->draft_branches : 1;
    max_b = max_b < KVP_DRAFT_BRANCHES ? max_b : KVP_DRAFT_BRANCHES;
    for (uint32_t i = 0; i < p->n_items; i++) {
        kvp_request *r = p->items[i].r->user;
        r->n_draft = r->n_branch = r->n_nodes = 0;
        r->sampled = 0;
        if (!decode_step(p, i) || !r->has_hidden)
            continue;
        uint32_t k = draft_room(b, r);
        if (k) {
            b->tree_req[n] = r, b->tree_k[n] = k, b->tree_hid[n] = r->hidden;
            n++;
        }
    }
    if (!n)
        return;
    d->draft_hidden(d->ctx, n, b->tree_hid, b->tree_k, max_b, b->tree_out, b->tree_len, b->tree_nb);
    for (uint32_t i = 0; i < n; i++) {
        size_t at = (size_t)i * KVP_DRAFT_BRANCHES;
        kvp_request *r = b->tree_req[i];
        r->n_draft = take_tree(r, b->tree_k[i], b->tree_nb[i], b->tree_out + at * KVP_DRAFT_MAX, b->tree_len + at);
        if (r->n_branch > 1 && b->one_tree)
            merge_tree(r);
    }
}

/* Drafts drawn from q: the target's distributions p after each (the same
 * warping, penalties counting the drafts before), then speculative
 * sampling (specverify.h) with r's generator.  drawn[0..m], m returned;
 * after[] the generator after the last draw. */
static int verify_sampled(batch *b, kvp_request *r, float *rows, uint32_t *drawn, kvp_sampling *after,
                          kvp_err *err)
{
    uint32_t V = kvp_engine_n_vocab(b->e), nd = r->n_draft, len = r->sr.n_tokens;
    for (uint32_t j = 0; j <= nd; j++) {
        uint32_t at = len + j, w = at < KVP_SAMPLE_WINDOW ? at : KVP_SAMPLE_WINDOW;
        int rc = kvp_sample_probs(&r->g.rec.sampling, rows + (size_t)j * V, V, r->tokens + (at - w), w,
                                  b->p + (size_t)j * V, err);
        if (rc < 0)
            return rc;
    }
    uint32_t m = kvp_spec_verify(b->p, r->q, V, r->draft, nd, &r->g.rec.sampling, drawn);
    for (uint32_t j = 0; j <= m; j++)
        after[j] = r->g.rec.sampling;
    return (int)m;
}

/* --draft-len auto after a verify step that kept m of nd guesses.  A
 * cheap drafter (prompt lookup) only updates r's acceptance: draft_len
 * picks each step's length from it.  A costly one: one more guess after a
 * step that kept them all, one past what was kept otherwise; none kept,
 * and r decodes plainly for a while, 1, 2, 4 ... up to
 * KVP_DRAFT_BACKOFF_MAX steps as its guesses keep failing, then tries one
 * guess again, so a drafter that costs a step's fraction (a draft model,
 * layerskip, heads) costs next to nothing where it cannot guess and
 * specdec is never much slower than decode: a failed try costs about one
 * step (a draft and a two-token verify), one in 32.  It is also timed
 * (clock_step): while the tokens its steps give fall below what plain
 * steps would give in the same time, its kept guesses count as a failure,
 * so a drafter that is right but slow backs off too.  A new request starts
 * where this one was left (adapt_start). */
#define KVP_DRAFT_BACKOFF_MAX 32
static void adapt(batch *b, kvp_request *r, uint32_t m, uint32_t nd)
{
    if (cheap_auto(b)) {
        r->accept = kvp_draftlen_accept(r->accept, m, nd);
        return;
    }
    uint32_t max = b->o->draft_len;
    if (b->spec_gain < 1.0)
        m = 0;
    if (m == 0) {
        r->backoff = r->backoff ? (r->backoff < KVP_DRAFT_BACKOFF_MAX ? r->backoff * 2 : KVP_DRAFT_BACKOFF_MAX) : 1;
        r->pause = r->backoff;
        r->draft_k = 1;
    } else {
        r->backoff = 0;
        r->draft_k = m == nd ? (r->draft_k < max ? r->draft_k + 1 : r->draft_k) : m + 1;
    }
    b->backoff = r->backoff, b->draft_k = r->draft_k;
}

/* The seconds of a plain decode step of R requests: of R's own, else of
 * the nearest count within a quarter of R (a batch's size drifts as its
 * requests end); 0 when none is known. */
static double t_plain_near(const batch *b, uint32_t R)
{
    uint32_t span = R / 4;
    for (uint32_t d = 0; d <= span; d++) {
        if (R >= d && b->t_plain[R - d] > 0)
            return b->t_plain[R - d];
        if (R + d <= b->max_req && b->t_plain[R + d] > 0)
            return b->t_plain[R + d];
    }
    return 0;
}

/* --draft-len auto's clock, after a decode step of R requests (every one
 * a single token, its drafts aside) that took t seconds, its drafting
 * included: a plain step (none drafted) refreshes t_plain[R], taking a
 * faster one at once (a busy host only adds); a speculative one adds its
 * tokens over what a plain step of R gives in that time to spec_gain.  A
 * drafter that guesses well but costs more than its guesses save (a draft
 * model nearly the target's size on a CPU; a batch, where a CPU step costs
 * what its tokens cost) loses however often it is right: adapt then
 * backs its requests off as after a failure.  Judged steps lag by one: a
 * step's requests adapt before its tokens are counted. */
static void clock_step(batch *b, uint32_t R, int drafted, double t)
{
    if (!R || R > b->max_req)
        return;
    if (!drafted) {
        double *tp = &b->t_plain[R];
        *tp = *tp > 0 ? fmin(t, 0.8 * *tp + 0.2 * t) : t;
        return;
    }
    double tp = t_plain_near(b, R);
    b->since_plain++;
    if (tp <= 0 || t <= 0)
        return;
    double g = b->step_tokens * tp / ((double)R * t);
    b->n_timed++;
    b->spec_gain = 0.75 * b->spec_gain + 0.25 * g;
}


/* Chosen drafts (ngram, greedy, heads): rows[1 + nd] after the guesses
 * draft[nd], which stand after r's tokens (changed by the sampler).  Each row is sampled in turn
 * with r's own generator (the state plain decoding would have at that
 * token); a guess is kept while the draw equals it.  drawn[0..m], after[]
 * the generator after each draw; m returned, or a code. */
static int verify_chosen(batch *b, kvp_request *r, float *rows, const uint32_t *draft, uint32_t nd,
                         uint32_t *drawn, kvp_sampling *after, kvp_err *err)
{
    uint32_t V = kvp_engine_n_vocab(b->e), len = r->sr.n_tokens, m = 0;
    for (;; m++) {
        uint32_t at = len + m, w = at < KVP_SAMPLE_WINDOW ? at : KVP_SAMPLE_WINDOW;
        int t = kvp_sample_next(&r->g.rec.sampling, rows + (size_t)m * V, V, r->tokens + (at - w), w, err);
        if (t < 0)
            return t;
        drawn[m] = (uint32_t)t;
        after[m] = r->g.rec.sampling;
        if (m == nd || drawn[m] != draft[m])
            return (int)m;
    }
}

/* Greedy guesses against the ids the engine picked for their rows
 * (KVP_LOGITS_ARGMAX_ALL): what verify_chosen draws from the rows when
 * sampling is their argmax alone (no draw: the generator stays). */
static int verify_ids(kvp_request *r, uint32_t *drawn, kvp_sampling *after)
{
    for (uint32_t m = 0;; m++) {
        drawn[m] = r->argmax[m];
        after[m] = r->g.rec.sampling;
        if (m == r->n_draft || drawn[m] != r->draft[m])
            return (int)m;
    }
}

/* A draft tree: every branch verified from the same generator state; the
 * one that keeps the most wins (the first on a tie).  Its guesses are put
 * in r->draft and after r's tokens, and *hid moved to its hidden rows.
 * Forks (n_nodes 0): branch i's rows follow branch 0's in order, and the
 * winner's fork becomes r's sequence.  A tree in r's own sequence
 * (n_nodes): a branch's rows are gathered from its nodes' (b->path_rows),
 * and the kept path moves into place in the cache
 * (kvp_kvcache_seq_keep_path).  m returned, or a code. */
static int verify_tree(batch *b, kvp_request *r, float *rows, const float **hid, uint32_t *drawn,
                       kvp_sampling *after, kvp_err *err)
{
    uint32_t V = kvp_engine_n_vocab(b->e), d = kvp_engine_n_embd(b->e), len = r->sr.n_tokens;
    kvp_sampling start = r->g.rec.sampling, best_after[KVP_DRAFT_MAX + 1];
    uint32_t best = 0, best_m = 0, best_drawn[KVP_DRAFT_MAX + 1];
    size_t off = 0, best_off = 0;
    for (uint32_t i = 0; i < r->n_branch; i++) {
        uint32_t nd = r->branch_len[i];
        float *br = rows + off * V;
        if (r->n_nodes) {
            br = b->path_rows;
            for (uint32_t j = 0; j <= nd; j++)
                memcpy(br + (size_t)j * V, rows + (size_t)r->node_of[i][j] * V, V * sizeof(float));
        }
        memcpy(r->tokens + len, r->branch[i] + 1, nd * sizeof *r->tokens); /* the penalties' window */
        r->g.rec.sampling = start;
        int m = verify_chosen(b, r, br, r->branch[i] + 1, nd, drawn, after, err);
        if (m < 0) {
            drop_forks(b, r);
            return m;
        }
        if (i == 0 || (uint32_t)m > best_m) {
            best = i, best_m = (uint32_t)m, best_off = off;
            memcpy(best_drawn, drawn, ((size_t)m + 1) * sizeof *drawn);
            memcpy(best_after, after, ((size_t)m + 1) * sizeof *after);
        }
        off += 1 + nd;
    }
    memcpy(drawn, best_drawn, ((size_t)best_m + 1) * sizeof *drawn);
    memcpy(after, best_after, ((size_t)best_m + 1) * sizeof *after);
    r->n_draft = r->branch_len[best];
    memcpy(r->draft, r->branch[best] + 1, r->n_draft * sizeof *r->draft);
    memcpy(r->tokens + len, r->draft, r->n_draft * sizeof *r->tokens);
    if (r->n_nodes) {
        /* the step's rows start at the sequence's last token (len - 1) */
        int rc = kvp_kvcache_seq_keep_path(b->kc, r->g.handle, len - 1, r->node_of[best], best_m + 1, err);
        if (rc < 0)
            return rc;
        if (*hid) {
            for (uint32_t j = 0; j <= best_m; j++)
                memcpy(b->path_hid + (size_t)j * d, *hid + (size_t)r->node_of[best][j] * d, d * sizeof(float));
            *hid = b->path_hid;
        }
        b->st->branch_rows += r->n_nodes - (1 + r->branch_len[0]);
        b->st->tree_steps++;
        return (int)best_m;
    }
    if (best) { /* the fork has the kept K/V: it becomes r's sequence */
        kvp_kvcache_seq_free(b->kc, r->g.handle);
        r->g.handle = r->branch_seq[best];
        r->branch_seq[best] = -1;
    }
    drop_forks(b, r);
    b->st->branch_rows += off - (1 + r->branch_len[0]);
    if (*hid)
        *hid += best_off * d;
    return (int)best_m;
}

/* r's verify step: rows[1 + n_draft] of logits, row j after draft token
 * j - 1 (then the rows of the other branches of a tree); hid their hidden
 * states, or NULL.  Drafts drawn from q go through speculative sampling
 * (verify_sampled), chosen ones through verify_chosen, a tree through
 * verify_tree.  The KV cache forgets the drafts past the last kept one;
 * then the drawn tokens are taken as generated, in order. */
static int advance_spec(batch *b, kvp_sched *s, kvp_request *r, float *rows, const float *hid, kvp_err *err)
{
    uint32_t drawn[KVP_DRAFT_MAX + 1];
    kvp_sampling after[KVP_DRAFT_MAX + 1]; /* the generator after each draw */
    int got = r->sampled           ? verify_sampled(b, r, rows, drawn, after, err)
              : r->n_branch > 1    ? verify_tree(b, r, rows, &hid, drawn, after, err)
              : r->greedy_id       ? verify_ids(r, drawn, after)
                                   : verify_chosen(b, r, rows, r->draft, r->n_draft, drawn, after, err);
    if (got < 0)
        return got;
    uint32_t m = (uint32_t)got, nd = r->n_draft;
    b->step_tokens += m + 1;
    keep_hidden(b, r, hid ? hid + (size_t)m * kvp_engine_n_embd(b->e) : NULL); /* row m chose the last token */
    kvp_batch_stats *st = b->st;
    st->verify_steps++;
    st->drafted += nd;
    st->accepted += m;
    for (uint32_t j = 0; j < nd; j++) {
        st->drafted_at[j]++;
        st->accepted_at[j] += j < m;
    }
    r->n_verify++;
    r->n_drafted += nd;
    r->n_accepted += m;
    if (b->o->draft_adaptive)
        adapt(b, r, m, nd);
    int handle = r->g.handle;
    uint32_t valid = r->sr.n_computed + m; /* the last token, then m kept drafts */
    int rc = kvp_kvcache_seq_truncate(b->kc, handle, valid, err);
    for (uint32_t j = 0; rc == 0 && j <= m; j++) {
        r->g.rec.next_token = (int32_t)drawn[j];
        r->g.rec.sampling = after[j];
        /* finishing at a kept draft, a kept request's cache must end where
         * its tokens do (finish drops the m - j drafts after it, then a
         * stop string's tokens; a freed one's blocks are right for their
         * tokens, whatever they were) */
        r->kv_ahead = m - j;
        if ((rc = take_token(b, s, r, err)) == 1)
            return 1;
        if (rc == 0 && j < m)
            r->sr.n_computed++; /* the draft token's K/V, computed in the step, stands */
    }
    r->kv_ahead = 0;
    return rc;
}

/* The step's hidden states, a row per logits row, into b->hid. */
static int step_hidden(batch *b, uint32_t n_rows, kvp_err *err)
{
    size_t need = (size_t)n_rows * kvp_engine_n_embd(b->e);
    if (need > b->cap_hid) {
        float *h = realloc(b->hid, need * sizeof *h);
        if (!h)
            return kvp_err_set(err, KVP_ENOMEM, "batch: out of memory for %u hidden states", n_rows);
        b->hid = h;
        b->cap_hid = need;
    }
    return kvp_engine_hidden(b->e, b->hid, n_rows, err);
}

/* A request from the source: one that is already over (no budget, or a
 * resumed stream's sequence that had ended) finishes at once. */
static int take(batch *b, kvp_sched *s, kvp_request *r, kvp_err *err)
{
    if (r->g.t_start <= 0)
        r->g.t_start = kvp_gen_now();
    if (r->g.rec.state == KVP_SEQ_FINISHED)
        return finish(b, r, err);
    if (kvp_gen_budget(&r->g, &r->opts) <= r->g.n_gen) {
        r->g.rec.finish_reason = KVP_FINISH_LENGTH;
        return finish(b, r, err);
    }
    r->draft_k = b->o->draft_len;
    r->accept = KVP_DRAFTLEN_PRIOR;
    int rc = kvp_sched_add(s, &r->sr, err);
    if (rc < 0)
        kvp_request_free(r);
    return rc;
}

int kvp_batch_run(kvp_engine *e, kvp_kvcache *kc, const kvp_tokenizer *tok, const kvp_batch_opts *o,
                  const kvp_batch_source *src, kvp_gen_emit_fn emit, void *ctx, kvp_batch_stats *st, kvp_err *err)
{
    kvp_batch_stats local;
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    batch b = {.keep = o->keep_finished, .no_prefix = o->no_prefix_cache, .metrics = o->metrics, .e = e, .kc = kc,
               .tok = tok, .emit = emit, .ctx = ctx, .st = st, .o = o};
    kvp_sched_kv kv = {.ctx = &b, .n_free = kv_n_free, .blocks_needed = kv_needed, .start = kv_start,
                       .release = kv_release, .ahead = kv_ahead, .drop_held = kv_drop_held};
    kvp_kvcache_stats ks;
    kvp_kvcache_get_stats(kc, &ks);
    kvp_sched_opts so = o->sched;
    if (!so.watermark_blocks)
        so.watermark_blocks = ks.n_blocks / 100; /* vLLM's 1% */
    /* a fixed draft length's guesses are kept in the step's budget before
     * prompt chunks take it: a request's drafts, and so its sampled draws,
     * do not depend on what else the batch holds */
    if (o->drafter && !o->draft_adaptive)
        so.lookahead = o->draft_len * (o->draft_branches > 1 ? o->draft_branches : 1);
    kvp_sched *s = NULL;
    int rc = kvp_sched_create(&s, &so, &kv, err);
    if (rc < 0)
        return rc;
    uint32_t max_seqs = so.max_num_seqs ? so.max_num_seqs : 256;
    uint32_t lookahead = o->lookahead ? o->lookahead : 2 * max_seqs;
    uint32_t V = kvp_engine_n_vocab(e);
    float *logits = NULL; /* rows for the requests that sample, grown as needed */
    uint32_t cap_rows = 0;
    uint32_t max_branches = o->draft_branches > 1 ? o->draft_branches : 1;
    kvp_step_seq *step = malloc((size_t)max_seqs * max_branches * sizeof *step);
    kvp_request **rows = malloc((size_t)max_seqs * sizeof *rows);
    st->total_blocks = ks.n_blocks;
    b.spec_gain = 1.0, b.since_plain = KVP_PLAIN_PROBE;
    b.max_req = max_seqs;
    b.draft_k = 1;
    b.t_plain = calloc((size_t)max_seqs + 1, sizeof *b.t_plain);
    double t0 = kvp_gen_now();
    int src_done = 0, src_rc = 0; /* src_rc: the source's failure, reported once the rest has run */
    kvp_err src_err = {0};
    if (o->drafter && o->drafter->draft_sampled)
        b.p = malloc((size_t)(KVP_DRAFT_MAX + 1) * V * sizeof *b.p);
    int trees = o->drafter && o->drafter->draft_hidden;
    if (trees) {
        size_t nb = (size_t)max_seqs * KVP_DRAFT_BRANCHES;
        b.tree_req = malloc(max_seqs * sizeof *b.tree_req), b.tree_hid = malloc(max_seqs * sizeof *b.tree_hid);
        b.tree_k = malloc(max_seqs * sizeof *b.tree_k), b.tree_nb = malloc(max_seqs * sizeof *b.tree_nb);
        b.tree_len = malloc(nb * sizeof *b.tree_len), b.tree_out = malloc(nb * KVP_DRAFT_MAX * sizeof *b.tree_out);
        /* a tree of branches in one sequence, where the engine takes it:
         * guesses the branches share are computed once, and no fork */
        b.one_tree = max_branches > 1 && kvp_engine_takes_trees(e);
        if (b.one_tree) {
            b.path_rows = malloc((size_t)(KVP_DRAFT_MAX + 1) * V * sizeof *b.path_rows);
            b.path_hid = malloc((size_t)(KVP_DRAFT_MAX + 1) * kvp_engine_n_embd(e) * sizeof *b.path_hid);
        }
    }
    int together = o->drafter && o->drafter->draft_batch && !trees;
    if (together && batch_drafts_alloc(&b.together, max_seqs) < 0) {
        rc = kvp_err_set(err, KVP_ENOMEM, "batch: out of memory for %u sequences", max_seqs);
        goto out;
    }
    if (!step || !rows || !b.t_plain || (o->drafter && o->drafter->draft_sampled && !b.p) ||
        (trees && (!b.tree_req || !b.tree_hid || !b.tree_k || !b.tree_nb || !b.tree_len || !b.tree_out)) ||
        (b.one_tree && (!b.path_rows || !b.path_hid))) {
        rc = kvp_err_set(err, KVP_ENOMEM, "batch: out of memory for %u sequences", max_seqs);
        goto out;
    }
    for (;;) {
        if (o->stop && *o->stop) {
            st->stopped = 1;
            break;
        }
        /* Read ahead; wait for the source only when there is nothing to run. */
        while (!src_done && kvp_sched_n_waiting(s) < lookahead) {
            int idle = kvp_sched_n_running(s) == 0 && kvp_sched_n_waiting(s) == 0;
            kvp_request *r = NULL;
            rc = src->next(src->ctx, idle, &r, &src_err);
            if (rc < 0 && o->stop && *o->stop) { /* a stop signal ended the wait (KVP_EINTR) */
                src_done = 1;
                break;
            }
            if (rc < 0) {
                src_rc = rc;
                src_done = 1;
                break;
            }
            if (rc == KVP_BATCH_END) {
                src_done = 1;
                break;
            }
            if (rc == 0)
                break;
            if ((rc = take(&b, s, r, err)) < 0)
                goto out;
        }
        rc = 0;
        if (o->stop && *o->stop) { /* it came while reading */
            st->stopped = 1;
            break;
        }
        if (src_done && !kvp_sched_n_running(s) && !kvp_sched_n_waiting(s))
            break;
        kvp_sched_plan p;
        if ((rc = kvp_sched_step(s, &p, err)) < 0)
            goto out;
        if (kvp_sched_n_running(s) > st->peak_running)
            st->peak_running = kvp_sched_n_running(s);
        for (uint32_t i = 0; i < p.n_ended; i++) {
            kvp_request *r = p.ended[i]->user;
            r->g.rec.finish_reason = KVP_FINISH_KV_MEMORY;
            if ((rc = finish(&b, r, err)) < 0)
                goto out;
        }
        if (p.n_items == 0)
            continue; /* only admissions that ended, or a source with nothing yet */
        /* One engine step over the plan; a request that reaches its last
         * token asks for its logits, a decode step with drafts for a row
         * after each of them too. */
        int drafting = o->drafter != NULL;
        int timed = drafting && o->draft_adaptive && !o->drafter->cheap && decode_only(&p); /* clock_step */
        int timed_len = drafting && cheap_auto(&b) && decode_only(&p); /* the cost table draft_len reads */
        double t_begin = timed || timed_len ? kvp_gen_now() : 0;
        b.len_tokens = p.n_tokens, b.len_yield = p.n_items;
        b.probe = timed && b.since_plain >= KVP_PLAIN_PROBE;
        if (b.probe)
            b.since_plain = 0;
        uint32_t mbt = o->sched.max_batched_tokens;
        b.step_room = !mbt ? UINT32_MAX : mbt > p.n_tokens ? mbt - p.n_tokens : 0;
        if (trees)
            draft_trees(&b, &p);
        else if (together)
            draft_together(&b, &p);
    again:;
        uint32_t n_rows = 0, n_req = 0, n_step = 0, n_guess = 0; /* n_guess: draft tokens in the step */
        for (uint32_t i = 0; i < p.n_items; i++) {
            kvp_request *r = p.items[i].r->user;
            uint32_t from = r->sr.n_computed, n = p.items[i].n;
            int last = from + n == r->sr.n_tokens;
            if (!drafting || !(trees || together)) /* drafted before, unless they did not fit */
                r->n_branch = r->n_nodes = 0, r->n_draft = drafting && last && n == 1 ? draft_for(&b, r) : 0;
            r->greedy_id = last && ids_suffice(&b, r); /* ids, not rows (a tree never: ids_suffice) */
            if (r->n_nodes) /* a tree in its own sequence: a decode step (draft_trees) */
                step[n_step++] = (kvp_step_seq){.seq = r->g.handle, .tokens = r->node_tok, .n_tokens = r->n_nodes,
                                                .want = KVP_LOGITS_ALL, .parent = r->node_par};
            else
                step[n_step++] = (kvp_step_seq){.seq = r->g.handle, .tokens = r->tokens + from,
                                                .n_tokens = n + r->n_draft,
                                                .want = !last        ? KVP_LOGITS_NONE
                                                        : r->n_draft ? (r->greedy_id ? KVP_LOGITS_ARGMAX_ALL
                                                                                     : KVP_LOGITS_ALL)
                                                        : r->greedy_id ? KVP_LOGITS_ARGMAX
                                                                       : KVP_LOGITS_LAST,
                                                .argmax = r->argmax};
            n_guess += r->n_nodes ? r->n_nodes - 1 : r->n_draft;
            if (last) {
                rows[n_req++] = r;
                n_rows += r->n_nodes ? r->n_nodes : r->greedy_id ? 0 : 1 + r->n_draft;
            }
            if (!r->n_nodes) { /* a branch's rows are guesses too */
                uint32_t fork_rows = add_forks(&b, r, step, &n_step);
                n_rows += fork_rows, n_guess += fork_rows;
            }
        }
        if (n_rows > cap_rows) {
            float *l = realloc(logits, (size_t)V * n_rows * sizeof *l);
            if (!l) {
                rc = kvp_err_set(err, KVP_ENOMEM, "batch: out of memory for %u rows of logits", n_rows);
                goto out;
            }
            logits = l;
            cap_rows = n_rows;
        }
        double t_fwd = kvp_gen_now();
        rc = kvp_engine_step(e, step, n_step, logits, err);
        st->forward_seconds += kvp_gen_now() - t_fwd;
        if (rc < 0) {
            for (uint32_t i = 0; i < n_req; i++)
                drop_forks(&b, rows[i]);
            if (rc == KVP_ELIMIT && drafting && n_guess) {
                drafting = timed = 0; /* the drafts did not fit: the plan as scheduled */
                goto again;
            }
            goto out;
        }
        rc = 0;
        st->steps++;
        for (uint32_t i = 0; i < p.n_items; i++) { /* prompt work done: all but the decode tokens */
            kvp_request *r = p.items[i].r->user;
            uint32_t from = r->sr.n_computed, n = p.items[i].n;
            r->ran = 1;
            st->computed_prompt += n == 1 && from + 1 == r->sr.n_tokens && from >= r->n_prompt ? 0 : n;
        }
        double t_took = timed || timed_len ? kvp_gen_now() - t_begin : 0;
        if (timed_len) {
            uint32_t n_tok = 0;
            for (uint32_t i = 0; i < n_step; i++)
                n_tok += step[i].n_tokens;
            kvp_draftlen_time(&b.dl, n_tok, t_took);
        }
        int drafted = 0;
        for (uint32_t i = 0; i < n_req; i++)
            drafted |= rows[i]->n_draft > 0;
        b.step_tokens = 0;
        kvp_kvcache_get_stats(kc, &ks);
        if (ks.n_blocks - ks.n_free > st->peak_blocks)
            st->peak_blocks = ks.n_blocks - ks.n_free;
        kvp_sched_commit(s, &p);
        const float *hid = NULL; /* for a drafter from hidden states */
        if (o->drafter && o->drafter->draft_hidden) {
            if ((rc = step_hidden(&b, n_rows, err)) < 0)
                goto out;
            hid = b.hid;
        }
        size_t d = kvp_engine_n_embd(e);
        double t_sample = kvp_gen_now();
        for (uint32_t i = 0, row = 0; i < n_req; i++) {
            kvp_request *r = rows[i];
            /* its rows, every branch's (none when the engine gave its argmax) */
            uint32_t nd = r->n_draft, used = r->n_nodes ? r->n_nodes : r->greedy_id ? 0 : 1 + nd;
            for (uint32_t j = 1; !r->n_nodes && j < r->n_branch; j++)
                used += 1 + r->branch_len[j];
            const float *h = hid ? hid + row * d : NULL;
            b.step_tokens += !nd;
            float *lr = used ? logits + (size_t)row * V : NULL;
            /* a NaN in the weights or in a KV stream's blocks reaches every
             * logit of the rows it touches: no token is chosen from them */
            if (lr && kvp_first_nonfinite_f32(lr, (size_t)used * V) < (size_t)used * V) {
                char who[KVP_UNICODE_ESCAPED_SIZE(KVP_NAME_MAX) + 2], id[KVP_UNICODE_ESCAPED_SIZE(KVP_NAME_MAX)];
                if (r->g.rec.label[0])
                    snprintf(who, sizeof who, "\"%s\"", kvp_unicode_escape(id, sizeof id, r->g.rec.label, '"'));
                else
                    snprintf(who, sizeof who, "%llu", (unsigned long long)r->g.rec.id);
                rc = kvp_err_set(err, KVP_EFORMAT, "request %s: its logits hold NaN or infinity after %u tokens: "
                                 "the model's weights or the KV blocks it continues from hold non-finite values", who,
                                 r->sr.n_tokens);
                goto out;
            }
            st->decode_steps += r->g.n_gen > 0; /* a token after its first (its first is its prompt's) */
            rc = nd ? advance_spec(&b, s, r, lr, h, err) : advance(&b, s, r, lr, h, err);
            if (rc < 0)
                goto out;
            rc = 0;
            row += used;
        }
        st->sample_seconds += kvp_gen_now() - t_sample;
        if (timed)
            clock_step(&b, n_req, drafted, t_took);
        if (o->on_step)
            o->on_step(o->on_step_ctx, st, kvp_sched_n_running(s), kvp_sched_n_waiting(s));
    }
    if (src_rc < 0) {
        rc = src_rc;
        if (err)
            *err = src_err;
    }
out:
    /* after a failure or a stop, whatever is still queued or running goes */
    for (kvp_sched_req *left; s && (left = kvp_sched_drain(s)) != NULL;) {
        drop_draft_state(o, left->user);
        kvp_request_free(left->user);
        st->dropped++;
    }
    st->preemptions = s ? kvp_sched_n_preemptions(s) : 0;
    st->seconds = kvp_gen_now() - t0;
    free(logits);
    free(step);
    free(rows);
    free(b.p);
    free(b.hid);
    free(b.tree_req), free(b.tree_hid), free(b.tree_k), free(b.tree_nb), free(b.tree_len), free(b.tree_out);
    free(b.path_rows), free(b.path_hid);
    free(b.t_plain);
    batch_drafts_free(&b.together);
    kvp_sched_free(s);
    return rc;
}
