/* draftmodel.c - drafting with a second model (see draftmodel.h). */
#include "draftmodel.h"

#include "sample.h"


#include <stdint.h>
#include <stdlib.h>

int kvp_draft_model_init(kvp_draft_model *d, kvp_engine *e, kvp_kvcache *kc, kvp_err *err)
{
    *d = (kvp_draft_model){.e = e, .kc = kc};
    d->logits = malloc((size_t)kvp_engine_n_vocab(e) * sizeof *d->logits);
    return d->logits ? 0 : kvp_err_set(err, KVP_ENOMEM, "draft model: out of memory");
}

void kvp_draft_model_free(kvp_draft_model *d)
{
    free(d->logits);
    d->logits = NULL;
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

/* The request's sequence in the draft cache brought in line with t[n] and
 * fed, its last logits in d->logits: the sequence, or -1 (no guess). */
static int draft_sync(kvp_draft_model *d, void **state, const uint32_t *t, uint32_t n)
{
    kvp_err err = {0};
    int seq = draft_seq(d, state);
    if (seq < 0 || n == 0)
        return -1;
    /* In line with the request: keep the common prefix (at most n - 1
     * tokens, so the last token is fed and gives the logits to draft from). */
    uint32_t len = kvp_kvcache_seq_len(d->kc, seq), common = 0;
    const uint32_t *have = kvp_kvcache_seq_tokens(d->kc, seq);
    while (common < len && common + 1 < n && have[common] == t[common])
        common++;
    if (common < len && kvp_kvcache_seq_truncate(d->kc, seq, common, &err) < 0)
        return -1;
    if (kvp_engine_prefill(d->e, seq, t + common, n - common, d->chunk, d->logits, &err) < 0)
        return -1; /* the draft cache is full: no guess this step */
    d->steps++;
    return seq;
}

/* on_target: the request's sequence in the target's cache (*state), holding
 * t[0..n-1) computed, fed t[n-1]; its last logits in d->logits: the
 * sequence, or -1 (no guess). */
static int draft_sync_target(kvp_draft_model *d, void *const *state, const uint32_t *t, uint32_t n)
{
    kvp_err err = {0};
    int seq = *state ? (int)((intptr_t)*state - 1) : -1;
    if (seq < 0 || n == 0 || kvp_kvcache_seq_len(d->kc, seq) != n - 1)
        return -1;
    kvp_step_seq s = {.seq = seq, .tokens = t + n - 1, .n_tokens = 1, .want = KVP_LOGITS_LAST};
    if (kvp_engine_step(d->e, &s, 1, d->logits, &err) < 0)
        return -1; /* a failed step leaves the sequence as it was */
    d->steps++;
    return seq;
}

/* k draft tokens into out, each chosen from d->logits by pick (which may
 * change them) and fed to get the next logits.  Returns how many. */
static uint32_t draft_steps(kvp_draft_model *d, int seq, uint32_t k, uint32_t *out,
                            int (*pick)(void *pctx, uint32_t m, float *logits), void *pctx)
{
    kvp_err err = {0};
    uint32_t m = 0;
    for (; m < k; m++) {
        int t = pick(pctx, m, d->logits);
        if (t < 0)
            return m;
        out[m] = (uint32_t)t;
        if (m + 1 == k)
            break;
        kvp_step_seq s = {.seq = seq, .tokens = out + m, .n_tokens = 1, .want = KVP_LOGITS_LAST};
        if (kvp_engine_step(d->e, &s, 1, d->logits, &err) < 0)
            return m + 1;
        d->steps++;
    }
    return k;
}

static int pick_argmax(void *pctx, uint32_t m, float *logits)
{
    (void)m;
    return (int)kvp_sample_argmax(logits, kvp_engine_n_vocab(((kvp_draft_model *)pctx)->e));
}

/* The request's sequence made ready to draft from (fed up to t[n-1]): its
 * handle, or -1. */
static int draft_begin(kvp_draft_model *d, void **state, const uint32_t *t, uint32_t n)
{
    return d->on_target ? draft_sync_target(d, state, t, n) : draft_sync(d, state, t, n);
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

uint32_t kvp_draft_model_draft(void *ctx, void **state, const uint32_t *t, uint32_t n, uint32_t k, uint32_t *out)
{
    kvp_draft_model *d = ctx;
    int seq = draft_begin(d, state, t, n);
    return seq < 0 ? 0 : draft_end(d, seq, n, draft_steps(d, seq, k, out, pick_argmax, d));
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

uint32_t kvp_draft_model_draft_sampled(void *ctx, void **state, const uint32_t *t, uint32_t n, uint32_t k,
                                       uint32_t *out, kvp_sampling *s, float *q)
{
    kvp_draft_model *d = ctx;
    int seq = draft_begin(d, state, t, n);
    sampled_pick c = {.d = d, .t = t, .n = n, .out = out, .s = s, .q = q};
    return seq < 0 ? 0 : draft_end(d, seq, n, draft_steps(d, seq, k, out, pick_sampled, &c));
}

void kvp_draft_model_release(void *ctx, void *state)
{
    kvp_draft_model *d = ctx;
    if (state && !d->on_target) /* on_target: the state names the target's own sequence */
        kvp_kvcache_seq_free(d->kc, (int)((intptr_t)state - 1));
}
