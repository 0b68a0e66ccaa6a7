/* ppl.c - windows of a text through the engine, scored, saved or compared. */
#include "ppl.h"
#include "argmax.h"

#include "generate.h"
#include "hash.h"
#include "logdist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SCORED_ROWS_MAX 256u /* logits rows a step: 256 x n_vocab floats */

uint64_t kvp_ppl_tokens_hash(const uint32_t *tokens, uint64_t n)
{
    return kvp_xxh64(tokens, (size_t)n * sizeof *tokens, 0); /* little-endian hosts only (README) */
}

/* What one run carries between windows. */
typedef struct ppl_state {
    const kvp_ppl_opts *o;
    uint32_t n_vocab, n_pos, k; /* k: saved top k, 0 full */
    kvp_scores_rec binding;     /* this run's */
    float *logits;              /* [SCORED_ROWS_MAX or chunk][n_vocab] */
    uint8_t *mark;              /* logdist scratch */
    kvp_lpfile_writer *save;
    float *s_lp_tok, *s_lp_rest, *s_lp; /* the window being saved */
    uint32_t *s_ids;
    kvp_lpfile *base;
    kvp_logprobs_view bv;       /* the base's current window */
    kvp_kldstats stats;
    kvp_pplsum sum;
} ppl_state;

static void state_free(ppl_state *st)
{
    free(st->logits);
    free(st->mark);
    free(st->s_lp_tok);
    free(st->s_lp_rest);
    free(st->s_lp);
    free(st->s_ids);
    kvp_lpfile_abort(st->save);
    kvp_lpfile_close(st->base);
    kvp_kldstats_free(&st->stats);
}

/* The base must have been made from the same tokens, windows and
 * vocabulary; it may hold more windows than this run scores. */
static int check_base(const kvp_scores_rec *b, const kvp_scores_rec *r, const char *path, kvp_err *err)
{
    if (b->tokens_hash != r->tokens_hash || b->n_tokens != r->n_tokens)
        return kvp_err_set(err, KVP_EINVAL,
                           "%s: made from other tokens (%llu tokens, hash %016llx, text '%s'); this text has %llu "
                           "tokens, hash %016llx", path, (unsigned long long)b->n_tokens,
                           (unsigned long long)b->tokens_hash, b->text, (unsigned long long)r->n_tokens,
                           (unsigned long long)r->tokens_hash);
    if (b->n_vocab != r->n_vocab)
        return kvp_err_set(err, KVP_EINVAL, "%s: made with a vocabulary of %u tokens; this model has %u", path,
                           b->n_vocab, r->n_vocab);
    if (b->ctx != r->ctx || b->first != r->first)
        return kvp_err_set(err, KVP_EINVAL, "%s: made with windows of %u tokens (scored from %u); this run uses "
                           "--ctx %u", path, b->ctx, b->first, r->ctx);
    if (b->bos != r->bos)
        return kvp_err_set(err, KVP_EINVAL, "%s: made with BOS %d at each window's start; this model's is %d", path,
                           (int32_t)b->bos, (int32_t)r->bos);
    if (b->n_windows < r->n_windows)
        return kvp_err_set(err, KVP_EINVAL, "%s: holds %u windows; this run scores %u", path, b->n_windows,
                           r->n_windows);
    return 0;
}

static int state_open(ppl_state *st, uint32_t rows, kvp_err *err)
{
    uint32_t nv = st->n_vocab, np = st->n_pos;
    st->logits = malloc((size_t)rows * nv * sizeof *st->logits);
    st->mark = calloc((nv + 7) / 8, 1);
    if (!st->logits || !st->mark)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory for %u rows of %u logits", rows, nv);
    const kvp_ppl_opts *o = st->o;
    if (o->base_path) {
        kvp_scores_rec b;
        int rc = kvp_lpfile_open(&st->base, o->base_path, &b, err);
        if (rc < 0 || (rc = check_base(&b, &st->binding, o->base_path, err)) < 0)
            return rc;
        st->binding = b; /* reported back: the base's own name for its text */
    }
    if (o->save_path) {
        uint32_t k = st->k;
        st->s_lp_tok = malloc(np * sizeof(float));
        st->s_lp = malloc((size_t)np * (k ? k : nv) * sizeof(float));
        if (k) { /* full rows have neither */
            st->s_lp_rest = malloc(np * sizeof(float));
            st->s_ids = malloc((size_t)np * k * sizeof(uint32_t));
        }
        if (!st->s_lp_tok || !st->s_lp || (k && (!st->s_lp_rest || !st->s_ids)))
            return kvp_err_set(err, KVP_ENOMEM, "out of memory for a window of %u saved rows", np);
        uint8_t zero[KVP_FINGERPRINT_SIZE] = {0};
        return kvp_lpfile_create(&st->save, o->save_path, o->fingerprint ? o->fingerprint : zero,
                                 o->producer ? o->producer : "kvpipe", &st->binding, err);
    }
    return 0;
}

/* Save row p of the window: its top k (with the rest's mass) or all of it. */
static void save_row(ppl_state *st, const float *l, uint32_t p, uint32_t tok)
{
    uint32_t nv = st->n_vocab, k = st->k;
    double lse;
    if (k) {
        uint32_t *ids = st->s_ids + (size_t)p * k;
        double rest;
        kvp_logdist_topk(l, nv, k, ids);
        lse = kvp_logdist_lse_rest(l, nv, ids, k, st->mark, &rest);
        for (uint32_t j = 0; j < k; j++)
            st->s_lp[(size_t)p * k + j] = kvp_logdist_lp(l[ids[j]], lse);
        st->s_lp_rest[p] = (float)rest;
    } else {
        lse = kvp_logdist_lse(l, nv);
        for (uint32_t i = 0; i < nv; i++)
            st->s_lp[(size_t)p * nv + i] = kvp_logdist_lp(l[i], lse);
    }
    st->s_lp_tok[p] = kvp_logdist_lp(l[tok], lse);
    kvp_pplsum_add(&st->sum, -(double)st->s_lp_tok[p]);
}

/* One scored row: position p of the window's scored ones, text token tok. */
static int score_row(ppl_state *st, const float *l, uint32_t p, uint32_t tok, kvp_err *err)
{
    /* a NaN in the weights spreads through every row: a score of nan is no score */
    if (kvp_first_nonfinite_f32(l, st->n_vocab) < st->n_vocab)
        return kvp_err_set(err, KVP_EFORMAT, "the logits of scored position %u hold NaN or infinity: the model's "
                           "weights hold non-finite values", p);
    if (st->save) {
        save_row(st, l, p, tok);
        return 0;
    }
    if (!st->base) {
        kvp_pplsum_add(&st->sum, -(double)kvp_logdist_lp(l[tok], kvp_logdist_lse(l, st->n_vocab)));
        return 0;
    }
    const kvp_logprobs_view *b = &st->bv;
    kvp_logdist_cmp c;
    if (b->top_k)
        kvp_logdist_cmp_topk(l, st->n_vocab, tok, b->ids + (size_t)p * b->top_k, b->lp + (size_t)p * b->top_k,
                             b->top_k, b->lp_rest[p], b->lp_tok[p], st->mark, &c);
    else
        kvp_logdist_cmp_full(l, st->n_vocab, tok, b->lp + (size_t)p * st->n_vocab, &c);
    kvp_pplsum_add(&st->sum, c.nll);
    return kvp_kldstats_add(&st->stats, &c, -(double)b->lp_tok[p], err);
}

/* Window w: its tokens (BOS first when asked) run as a fresh sequence. */
static int run_window(ppl_state *st, kvp_engine *e, kvp_kvcache *kc, const uint32_t *text, uint32_t w, uint32_t chunk,
                      uint32_t rows, kvp_err *err)
{
    const kvp_scores_rec *b = &st->binding;
    uint32_t ctx = b->ctx, first = b->first;
    uint32_t *t = malloc(ctx * sizeof *t);
    if (!t)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    memcpy(t, text + (uint64_t)w * ctx, ctx * sizeof *t);
    if (b->bos != KVP_SCORES_NO_BOS)
        t[0] = b->bos;
    int rc = 0, seq = kvp_kvcache_seq_new(kc, err);
    if (seq < 0) {
        free(t);
        return seq;
    }
    if (st->base && (rc = kvp_lpfile_next(st->base, &st->bv, err)) <= 0) {
        if (rc == 0)
            rc = kvp_err_set(err, KVP_EINVAL, "%s: ends before window %u", st->o->base_path, w);
        goto out;
    }
    /* Context (no logits), then the scored positions with every row; the
     * last token of the window predicts nothing scored and is never run. */
    for (uint32_t done = 0; done < ctx - 1;) {
        int scored = done >= first;
        uint32_t end = done + (scored ? rows : chunk);
        if (!scored && end > first)
            end = first;
        if (end > ctx - 1)
            end = ctx - 1;
        kvp_step_seq s = {.seq = seq, .tokens = t + done, .n_tokens = end - done,
                          .want = scored ? KVP_LOGITS_ALL : KVP_LOGITS_NONE};
        if ((rc = kvp_engine_step(e, &s, 1, scored ? st->logits : NULL, err)) < 0)
            goto out;
        for (uint32_t j = done; scored && j < end; j++)
            if ((rc = score_row(st, st->logits + (size_t)(j - done) * st->n_vocab, j - first, t[j + 1], err)) < 0)
                goto out;
        done = end;
    }
    rc = 0;
    if (st->save) {
        kvp_logprobs_view v = {.window = w, .n_pos = st->n_pos, .top_k = st->k, .n_vocab = st->n_vocab,
                               .lp_tok = st->s_lp_tok, .lp_rest = st->s_lp_rest, .ids = st->s_ids,
                               .lp = st->s_lp};
        rc = kvp_lpfile_put(st->save, &v, err);
    }
out:
    kvp_kvcache_seq_free(kc, seq);
    free(t);
    return rc < 0 ? rc : 0;
}

int kvp_ppl_run(kvp_engine *e, kvp_kvcache *kc, const uint32_t *tokens, uint64_t n, const kvp_ppl_opts *o,
                kvp_ppl_result *r, kvp_err *err)
{
    uint32_t ctx = o->ctx, chunk = o->chunk ? o->chunk : 512;
    uint32_t nv = kvp_engine_n_vocab(e);
    if (ctx < 4)
        return kvp_err_set(err, KVP_EINVAL, "--ctx %u: a window needs at least 4 tokens", ctx);
    if (n < ctx)
        return kvp_err_set(err, KVP_EINVAL, "%s: %llu tokens, fewer than one window of %u tokens",
                           o->text_name ? o->text_name : "text", (unsigned long long)n, ctx);
    if (o->save_path && o->base_path)
        return kvp_err_set(err, KVP_EINVAL, "saving a base and comparing with one are separate runs");
    if (o->save_path && o->save_k > KVP_LOGPROBS_MAX_K)
        return kvp_err_set(err, KVP_EINVAL, "top %u: at most %u (or full rows)", o->save_k, KVP_LOGPROBS_MAX_K);
    /* the top k of a vocabulary of k tokens or fewer is all of it (and the
     * rest's mass nothing): full rows say the same, exactly, in no more room;
     * a caller's default k (quantize --eval's 32) then fits any model */
    uint32_t save_k = o->save_k < nv ? o->save_k : 0;
    uint64_t nw = n / ctx;
    if (o->max_windows && nw > o->max_windows)
        nw = o->max_windows;
    if (nw > UINT32_MAX)
        nw = UINT32_MAX;
    /* a window scores its second half but the last token; one position in
     * all has no spread, so no uncertainty, and a base of it no --kld */
    uint64_t scored = nw * (uint64_t)(ctx - 1 - ctx / 2);
    if (scored < 2)
        return kvp_err_set(err, KVP_EINVAL, "%s: %llu window of %u tokens scores %llu position: the uncertainty (and "
                           "--kld) need at least 2 (more windows, or a larger --ctx)",
                           o->text_name ? o->text_name : "text", (unsigned long long)nw, ctx,
                           (unsigned long long)scored);
    ppl_state st = {.o = o, .n_vocab = nv, .k = save_k};
    st.binding = (kvp_scores_rec){.tokens_hash = kvp_ppl_tokens_hash(tokens, n), .n_tokens = n, .ctx = ctx,
                                  .first = ctx / 2, .n_windows = (uint32_t)nw, .n_vocab = nv, .top_k = save_k,
                                  .bos = o->bos >= 0 ? (uint32_t)o->bos : KVP_SCORES_NO_BOS};
    snprintf(st.binding.text, sizeof st.binding.text, "%s", o->text_name ? o->text_name : "");
    st.n_pos = kvp_scores_n_pos(&st.binding);
    kvp_kldstats_init(&st.stats);
    uint32_t rows = chunk < SCORED_ROWS_MAX ? chunk : SCORED_ROWS_MAX;
    double t0 = kvp_gen_now();
    int rc = state_open(&st, rows, err);
    for (uint32_t w = 0; rc >= 0 && w < nw; w++) {
        if ((rc = run_window(&st, e, kc, tokens, w, chunk, rows, err)) < 0)
            break;
        if (o->progress) {
            double perr;
            o->progress(o->progress_ctx, w, (uint32_t)nw, kvp_pplsum_ppl(&st.sum, &perr));
        }
    }
    kvp_lpfile_writer *sealed = NULL;
    if (rc >= 0 && st.save) {
        rc = o->saved ? kvp_lpfile_seal(st.save, err) : kvp_lpfile_finish(st.save, err);
        if (rc >= 0 && o->saved)
            sealed = st.save;
        st.save = NULL;
    }
    /* the base's windows past this run's read to its END record: a base
     * damaged or cut anywhere is refused (kvp(5)), not only in the windows
     * compared */
    for (kvp_logprobs_view v; rc >= 0 && st.base && (rc = kvp_lpfile_next(st.base, &v, err)) > 0;)
        ;
    if (rc >= 0) {
        *r = (kvp_ppl_result){.n_tokens = n, .tokens_hash = st.binding.tokens_hash, .ctx = ctx, .first = ctx / 2,
                              .n_windows = (uint32_t)nw, .n_eval = nw * (ctx - 1), .sum = st.sum};
        r->ppl = kvp_pplsum_ppl(&st.sum, &r->ppl_err);
        r->seconds = kvp_gen_now() - t0;
        if (st.base) {
            r->has_kld = 1;
            r->base = st.binding;
            rc = kvp_kldstats_summary(&st.stats, &r->kld, err);
        }
    }
    state_free(&st);
    if (rc < 0) {
        kvp_lpfile_abort(sealed);
        return rc;
    }
    if (sealed)
        *o->saved = sealed;
    return 0;
}
