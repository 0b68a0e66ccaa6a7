/* draftmodel.c - drafting with a second model (see draftmodel.h). */
#include "draftmodel.h"

#include "sample.h"


#include <stdint.h>
#include <stdlib.h>

static void free_batch(kvp_draft_model *d)
{
    free(d->rows), free(d->step), free(d->who), free(d->from), free(d->seq), free(d->row);
    d->rows = NULL, d->step = NULL, d->who = d->from = NULL, d->seq = NULL, d->row = NULL;
    d->cap = 0;
}

void kvp_draft_model_free(kvp_draft_model *d) { free_batch(d); }

/* draft_batch's scratch for n requests: 0, or -1 out of memory. */
static int grow_batch(kvp_draft_model *d, uint32_t n)
{
    if (n <= d->cap)
        return 0;
    free_batch(d);
    d->rows = malloc((size_t)n * kvp_engine_n_vocab(d->e) * sizeof *d->rows);
    d->step = malloc(n * sizeof *d->step), d->who = malloc(n * sizeof *d->who);
    d->from = malloc(n * sizeof *d->from), d->seq = malloc(n * sizeof *d->seq), d->row = malloc(n * sizeof *d->row);
    if (!d->rows || !d->step || !d->who || !d->from || !d->seq || !d->row) {
        free_batch(d);
        return -1;
    }
    d->cap = n;
    return 0;
}

int kvp_draft_model_init(kvp_draft_model *d, kvp_engine *e, kvp_kvcache *kc, kvp_err *err)
{
    *d = (kvp_draft_model){.e = e, .kc = kc};
    return grow_batch(d, 1) == 0 ? 0 : kvp_err_set(err, KVP_ENOMEM, "draft model: out of memory");
}

/* A request's sequence in the draft cache, stored in its state as seq + 1. */
static int draft_seq(kvp_draft_model *d, void **state)
{
    if (*state)
        return (int)((intptr_t)*state - 1);
    kvp_err ignored;
    int seq = kvp_kvcache_seq_new(d->kc, &ignored);
    if (seq >= 0)
        *state = (void *)(intptr_t)(seq + 1);
    return seq;
}

/* seq in the draft cache in line with the request's t[n] (n > 0): cut back
 * to their common prefix, at most n - 1 tokens, so the last token is fed
 * and gives the logits to draft from.  The prefix's length, or -1. */
static int64_t trim_common(kvp_draft_model *d, int seq, const uint32_t *t, uint32_t n)
{
    kvp_err err = {0};
    uint32_t len = kvp_kvcache_seq_len(d->kc, seq), common = 0;
    const uint32_t *have = kvp_kvcache_seq_tokens(d->kc, seq);
    while (common < len && common + 1 < n && have[common] == t[common])
        common++;
    if (common < len && kvp_kvcache_seq_truncate(d->kc, seq, common, &err) < 0)
        return -1;
    return common;
}

static int pick_argmax(void *pctx, uint32_t m, float *logits)
{
    (void)m;
    return (int)kvp_sample_argmax(logits, kvp_engine_n_vocab(((kvp_draft_model *)pctx)->e));
}

/* After drafting on the target's cache: the draft's slots go (the
 * truncation keeps a prefix, so it cannot fail). */
static uint32_t draft_end(kvp_draft_model *d, int seq, uint32_t n, uint32_t m)
{
    kvp_err ignored;
    if (d->on_target)
        kvp_kvcache_seq_truncate(d->kc, seq, n - 1, &ignored);
    return m;
}

/* Sampled drafting: the request's tokens and the drafts so far give the
 * penalty its window, as the target's rows will see them. */
typedef struct sampled_pick {
    kvp_draft_model *d;
    const uint32_t *t;     /* the request's tokens [n] */
    uint32_t n;
    const uint32_t *out;   /* the drafts so far */
    kvp_sampling *s;
    float *q;              /* [k][n_vocab] */
} sampled_pick;

static int pick_sampled(void *pctx, uint32_t m, float *logits)
{
    sampled_pick *c = pctx;
    uint32_t nv = kvp_engine_n_vocab(c->d->e), at = c->n + m, w = at < KVP_SAMPLE_WINDOW ? at : KVP_SAMPLE_WINDOW;
    uint32_t win[KVP_SAMPLE_WINDOW];
    for (uint32_t i = 0; i < w; i++) { /* the last w of t[0..n) then out[0..m) */
        uint32_t j = at - w + i;
        win[i] = j < c->n ? c->t[j] : c->out[j - c->n];
    }
    kvp_err err = {0};
    float *q = c->q + (size_t)m * nv;
    if (kvp_sample_probs(c->s, logits, nv, win, w, q, &err) < 0)
        return -1;
    return (int)kvp_sample_from(q, nv, kvp_sample_uniform(c->s));
}

/* The request's sequence, brought in line with t[n] but not fed: the
 * sequence (its first token to feed in *from), or -1 (no guess). */
static int batch_begin(kvp_draft_model *d, void **state, const uint32_t *t, uint32_t n, uint32_t *from)
{
    kvp_err err = {0};
    if (n == 0)
        return -1;
    if (d->on_target) { /* the target's sequence, every token but the last computed */
        int seq = *state ? (int)((intptr_t)*state - 1) : -1;
        *from = n - 1;
        return seq >= 0 && kvp_kvcache_seq_len(d->kc, seq) == n - 1 ? seq : -1;
    }
    int seq = draft_seq(d, state);
    int64_t common = seq < 0 ? -1 : trim_common(d, seq, t, n);
    if (common < 0)
        return -1;
    if (common == 0) { /* a new sequence: the draft cache's blocks of the same prompt */
        int got = kvp_kvcache_seq_share_prefix(d->kc, seq, t, n, &err);
        if (got < 0)
            return -1;
        common = got;
    }
    *from = (uint32_t)common;
    return seq;
}

/* Feeds the live requests (d->seq[i] >= 0) their tokens t[i][d->from[i]
 * .. n[i]) in steps of at most d->chunk tokens, a request's tail and the
 * next ones' in one step; each request's last row at d->row[i].  A
 * request in a step that fails drops out (d->seq[i] = -1); the engine
 * leaves its sequence as it was, and the next call trims it again. */
static void batch_feed(kvp_draft_model *d, uint32_t n_req, const uint32_t *const *t, const uint32_t *n)
{
    uint32_t V = kvp_engine_n_vocab(d->e), chunk = d->chunk ? d->chunk : 512, rows = 0;
    for (uint32_t i = 0; i < n_req;) {
        uint32_t ns = 0, room = chunk;
        while (i < n_req && room) {
            if (d->seq[i] < 0) {
                i++;
                continue;
            }
            uint32_t take = n[i] - d->from[i] < room ? n[i] - d->from[i] : room;
            int last = d->from[i] + take == n[i];
            d->step[ns] = (kvp_step_seq){.seq = d->seq[i], .tokens = t[i] + d->from[i], .n_tokens = take,
                                         .want = last ? KVP_LOGITS_LAST : KVP_LOGITS_NONE};
            d->who[ns++] = i;
            d->from[i] += take, room -= take;
            i += last;
        }
        kvp_err err = {0};
        if (!ns)
            break;
        if (kvp_engine_step(d->e, d->step, ns, d->rows + (size_t)rows * V, &err) < 0) {
            for (uint32_t j = 0; j < ns; j++)
                d->seq[d->who[j]] = -1;
            continue;
        }
        d->steps++;
        for (uint32_t j = 0; j < ns; j++)
            if (d->step[j].want == KVP_LOGITS_LAST)
                d->row[d->who[j]] = d->rows + (size_t)rows++ * V;
    }
}

void kvp_draft_model_draft_batch(void *ctx, uint32_t n_req, void **const *state, const uint32_t *const *t,
                                 const uint32_t *n, const uint32_t *k, kvp_sampling *const *s, float *const *q,
                                 uint32_t *out, uint32_t *got)
{
    kvp_draft_model *d = ctx;
    for (uint32_t i = 0; i < n_req; i++)
        got[i] = 0;
    if (grow_batch(d, n_req) < 0)
        return; /* no room to batch: no guess this step */
    for (uint32_t i = 0; i < n_req; i++)
        d->seq[i] = batch_begin(d, state[i], t[i], n[i], &d->from[i]);
    batch_feed(d, n_req, t, n);
    uint32_t V = kvp_engine_n_vocab(d->e);
    /* Position m: every live request picks its guess from its row (all
     * before the step, which writes the rows again), then those with more
     * to guess take one step together. */
    for (uint32_t m = 0;; m++) {
        uint32_t ns = 0;
        for (uint32_t i = 0; i < n_req; i++) {
            if (d->seq[i] < 0 || m >= k[i] || got[i] < m)
                continue;
            uint32_t *o = out + (size_t)i * KVP_DRAFT_MAX;
            sampled_pick c = {.d = d, .t = t[i], .n = n[i], .out = o, .s = s[i], .q = q[i]};
            int tok = s[i] ? pick_sampled(&c, m, d->row[i]) : pick_argmax(d, m, d->row[i]);
            if (tok < 0)
                continue;
            o[m] = (uint32_t)tok;
            got[i] = m + 1;
            if (m + 1 < k[i]) {
                d->step[ns] = (kvp_step_seq){.seq = d->seq[i], .tokens = o + m, .n_tokens = 1,
                                             .want = KVP_LOGITS_LAST};
                d->who[ns++] = i;
            }
        }
        if (!ns)
            break;
        kvp_err err = {0};
        if (kvp_engine_step(d->e, d->step, ns, d->rows, &err) < 0)
            break; /* the draft cache is full: the guesses so far stand */
        d->steps++;
        for (uint32_t j = 0; j < ns; j++)
            d->row[d->who[j]] = d->rows + (size_t)j * V;
    }
    for (uint32_t i = 0; i < n_req; i++)
        if (d->seq[i] >= 0)
            draft_end(d, d->seq[i], n[i], got[i]);
}

/* A request alone: a batch of one. */
uint32_t kvp_draft_model_draft(void *ctx, void **state, const uint32_t *t, uint32_t n, uint32_t k, uint32_t *out)
{
    return kvp_draft_model_draft_sampled(ctx, state, t, n, k, out, NULL, NULL);
}

uint32_t kvp_draft_model_draft_sampled(void *ctx, void **state, const uint32_t *t, uint32_t n, uint32_t k,
                                       uint32_t *out, kvp_sampling *s, float *q)
{
    void **const st[1] = {state};
    const uint32_t *const ts[1] = {t};
    kvp_sampling *const ss[1] = {s};
    float *const qs[1] = {q};
    uint32_t got = 0;
    kvp_draft_model_draft_batch(ctx, 1, st, ts, &n, &k, ss, qs, out, &got);
    return got;
}

void kvp_draft_model_release(void *ctx, void *state)
{
    kvp_draft_model *d = ctx;
    if (state && !d->on_target) /* on_target: the state names the target's own sequence */
        kvp_kvcache_seq_free(d->kc, (int)((intptr_t)state - 1));
}
