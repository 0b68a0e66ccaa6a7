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

uint32_t kvp_draft_model_draft(void *ctx, void **state, const uint32_t *t, uint32_t n, uint32_t k, uint32_t *out)
{
    kvp_draft_model *d = ctx;
    kvp_err err = {0};
    int seq = draft_seq(d, state);
    if (seq < 0 || n == 0)
        return 0;
    /* In line with the request: keep the common prefix (at most n - 1
     * tokens, so the last token is fed and gives the logits to draft from). */
    uint32_t len = kvp_kvcache_seq_len(d->kc, seq), common = 0;
    const uint32_t *have = kvp_kvcache_seq_tokens(d->kc, seq);
    while (common < len && common + 1 < n && have[common] == t[common])
        common++;
    if (common < len && kvp_kvcache_seq_truncate(d->kc, seq, common, &err) < 0)
        return 0;
    uint32_t nv = kvp_engine_n_vocab(d->e);
    if (kvp_engine_prefill(d->e, seq, t + common, n - common, d->chunk, d->logits, &err) < 0)
        return 0; /* the draft cache is full: no guess this step */
    d->steps++;
    uint32_t m = 0;
    for (; m < k; m++) {
        out[m] = kvp_sample_argmax(d->logits, nv);
        if (m + 1 == k)
            break;
        kvp_step_seq s = {.seq = seq, .tokens = out + m, .n_tokens = 1, .want = KVP_LOGITS_LAST};
        if (kvp_engine_step(d->e, &s, 1, d->logits, &err) < 0)
            return m + 1;
        d->steps++;
    }
    return k;
}

void kvp_draft_model_release(void *ctx, void *state)
{
    kvp_draft_model *d = ctx;
    if (state)
        kvp_kvcache_seq_free(d->kc, (int)((intptr_t)state - 1));
}
