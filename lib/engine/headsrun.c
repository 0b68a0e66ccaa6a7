/* headsrun.c - specdec --train-heads (see headsrun.h). */
#include "headsrun.h"

#include "batch.h"
#include "generate.h"
#include "jobsrc.h"
#include "sample.h"
#include "version.h"

#include <stdlib.h>
#include <string.h>

void kvp_heads_samples_free(kvp_heads_samples *s)
{
    free(s->hidden);
    free(s->label);
    s->hidden = NULL;
    s->label = NULL;
    s->n = s->cap = 0;
}

static int samples_reserve(kvp_heads_samples *s, uint32_t more, kvp_err *err)
{
    if (s->n + more <= s->cap)
        return 0;
    uint32_t cap = s->cap ? s->cap * 2 : 1024;
    while (cap < s->n + more)
        cap *= 2;
    float *h = realloc(s->hidden, (size_t)cap * s->n_embd * sizeof *h);
    if (h)
        s->hidden = h;
    uint32_t *l = h ? realloc(s->label, (size_t)cap * s->n_heads * sizeof *l) : NULL;
    if (!l)
        return kvp_err_set(err, KVP_ENOMEM, "heads training: out of memory for %u samples", cap);
    s->label = l;
    s->cap = cap;
    return 0;
}

int kvp_heads_collect(kvp_engine *e, kvp_kvcache *kc, const uint32_t *tokens, uint32_t n, uint32_t n_prompt,
                      uint32_t chunk, kvp_heads_samples *out, kvp_err *err)
{
    if (n_prompt == 0 || n < n_prompt + 2)
        return 0; /* no position with a label for head 1 */
    uint32_t first = n_prompt - 1, last = n - 3, ns = last - first + 1; /* positions sampled: [first, last] */
    uint32_t C = chunk ? chunk : 128, V = kvp_engine_n_vocab(e), d = out->n_embd;
    float *logits = malloc((size_t)C * V * sizeof *logits);
    float *hid = malloc((size_t)C * d * sizeof *hid);
    uint32_t *teach = malloc((size_t)n * sizeof *teach); /* the model's argmax after each position */
    int seq = logits && hid && teach ? kvp_kvcache_seq_new(kc, err)
                                     : kvp_err_set(err, KVP_ENOMEM, "heads training: out of memory for steps of %u", C);
    int rc = seq < 0 ? seq : samples_reserve(out, ns, err);
    float *dst = rc == 0 ? out->hidden + (size_t)out->n * d : NULL;
    for (uint32_t p0 = 0; rc == 0 && p0 + 1 < n; p0 += C) {
        uint32_t m = n - p0 < C ? n - p0 : C;
        int want = p0 + m > first ? KVP_LOGITS_ALL : KVP_LOGITS_NONE; /* rows only where labels are */
        kvp_step_seq s = {.seq = seq, .tokens = tokens + p0, .n_tokens = m, .want = want};
        if ((rc = kvp_engine_step(e, &s, 1, want ? logits : NULL, err)) < 0 || !want ||
            (rc = kvp_engine_hidden(e, hid, m, err)) < 0)
            continue;
        for (uint32_t p = p0 > first ? p0 : first; p < p0 + m; p++) {
            teach[p] = kvp_sample_argmax(logits + (size_t)(p - p0) * V, V);
            if (p <= last)
                memcpy(dst + (size_t)(p - first) * d, hid + (size_t)(p - p0) * d, d * sizeof *hid);
        }
    }
    /* Head k at p guesses the token after p + 1 + k: what the model's own
     * argmax there is.  On a greedy answer that is the answer's next token;
     * on a sampled one it is what greedy decoding would keep after that
     * prefix, which is what drafts are checked against. */
    for (uint32_t p = first; rc == 0 && p <= last; p++) {
        uint32_t *lab = out->label + (size_t)(out->n + p - first) * out->n_heads;
        for (uint32_t k = 0; k < out->n_heads; k++)
            lab[k] = p + 1 + k <= n - 2 ? teach[p + 1 + k] : KVP_HEADS_NO_LABEL;
    }
    if (rc == 0)
        out->n += ns;
    if (seq >= 0)
        kvp_kvcache_seq_free(kc, seq);
    free(logits);
    free(hid);
    free(teach);
    return rc < 0 ? rc : 0;
}

/* ---- the job ---- */

/* The target's answers, as each finishes: prompt and answer tokens. */
typedef struct answers {
    uint32_t **tok, *n, *n_prompt;
    uint64_t *id;         /* the request's: its prompt's line */
    uint32_t count, cap;
    int oom;
} answers;

static void answers_free(answers *a)
{
    for (uint32_t i = 0; i < a->count; i++)
        free(a->tok[i]);
    free(a->tok), free(a->n), free(a->n_prompt), free(a->id);
    memset(a, 0, sizeof *a);
}

static int answers_grow(answers *a)
{
    uint32_t cap = a->cap ? 2 * a->cap : 64;
    uint32_t **t = realloc(a->tok, cap * sizeof *t);
    if (t)
        a->tok = t;
    uint32_t *n = t ? realloc(a->n, cap * sizeof *n) : NULL;
    if (n)
        a->n = n;
    uint32_t *np = n ? realloc(a->n_prompt, cap * sizeof *np) : NULL;
    if (np)
        a->n_prompt = np;
    uint64_t *id = np ? realloc(a->id, cap * sizeof *id) : NULL;
    if (!id)
        return -1;
    a->id = id;
    a->cap = cap;
    return 0;
}

/* emit: a finished request's tokens, its last sampled one included (a
 * finishing token is accepted but never queued to be computed). */
static void take_answer(void *ctx, kvp_gen_seq *g, const char *bytes, size_t nb)
{
    (void)bytes;
    answers *a = ctx;
    if (nb || a->oom)
        return;
    kvp_request *r = kvp_request_of(g);
    uint32_t n = r->sr.n_tokens, last = g->rec.next_token >= 0 && g->n_gen > n - r->n_prompt;
    uint32_t *t = (a->count < a->cap || answers_grow(a) == 0) ? malloc((n + 1) * sizeof *t) : NULL;
    if (!t) {
        a->oom = 1;
        return;
    }
    memcpy(t, r->tokens, n * sizeof *t);
    if (last)
        t[n++] = (uint32_t)g->rec.next_token;
    a->tok[a->count] = t, a->n[a->count] = n, a->n_prompt[a->count] = r->n_prompt, a->id[a->count++] = g->rec.id;
}

/* One pass over the prompts with o's sampling. */
static int answer_pass(kvp_run *r, kvp_runopts *o, answers *a, kvp_err *err)
{
    kvp_jobsrc *js = NULL;
    int rc = kvp_jobsrc_open(&js, r, o, "-", 0, err);
    if (rc < 0)
        return rc;
    kvp_batch_opts bo = {.sched = o->sched};
    kvp_batch_source src = kvp_jobsrc_source(js);
    kvp_batch_stats st;
    rc = kvp_batch_run(r->engine, r->kc, r->tok, &bo, &src, take_answer, a, &st, err);
    /* heads learn from answers: no prompt gives nothing to train, and
     * writing untrained heads would pass for a result */
    if (rc == 0 && kvp_jobsrc_read_all(js) && kvp_jobsrc_total(js) == 0)
        rc = kvp_err_set(err, KVP_EFORMAT, "%s: no prompt in the file: nothing to train the heads on", o->file);
    kvp_jobsrc_free(js);
    if (rc == 0 && a->oom)
        rc = kvp_err_set(err, KVP_ENOMEM, "heads training: out of memory for the answers");
    return rc;
}

/* Answer every prompt: greedily, then samples - 1 times more at
 * temperature 0.8 (seeds 1, 2, ...), for more contexts to learn from. */
static int answer_all(kvp_run *r, kvp_runopts *o, uint32_t samples, answers *a, kvp_err *err)
{
    int rc = 0;
    kvp_sampling keep = o->sampling;
    for (uint32_t i = 0; rc == 0 && i < (samples ? samples : 1); i++) {
        o->sampling.temperature = i ? 0.8f : 0;
        o->sampling.seed = keep.seed + i;
        rc = answer_pass(r, o, a, err);
    }
    o->sampling = keep;
    return rc;
}

/* ctx: the report's FILE, or NULL */
static void show_epoch(void *ctx, uint32_t epoch, double loss, double seconds)
{
    if (ctx)
        fprintf(ctx, "  epoch %u: loss %.4f (%.1f s)\n", epoch, loss, seconds);
}

/* A row of the accuracy table: a head with no sample labelled for it has
 * no accuracy, "-" (as --stats shows a position never drafted), not 0%.
 * 1 when a head had none. */
static int report_eval(FILE *f, const char *what, const kvp_heads_eval *ev, uint32_t K)
{
    int unlabelled = 0;
    fprintf(f, "  %-26s", what);
    for (uint32_t k = 0; k < K; k++) {
        if (ev->n[k])
            fprintf(f, " %5.1f%%", 100 * ev->acc[k]);
        else
            fprintf(f, " %6s", "-");
        unlabelled |= !ev->n[k];
    }
    fprintf(f, "   loss %.4f\n", ev->weighted);
    return unlabelled;
}

/* The accuracy table: held out (when any) before and after training, and
 * the training samples. */
static void report_accuracy(FILE *f, const kvp_heads_eval *before, const kvp_heads_eval *after,
                            const kvp_heads_eval *fit, uint32_t K)
{
    fprintf(f, "  top-1 accuracy, head      ");
    for (uint32_t k = 0; k < K; k++)
        fprintf(f, " %6u", k + 1);
    fprintf(f, "\n");
    int unlabelled = 0;
    if (before) {
        unlabelled |= report_eval(f, "held out, untrained", before, K);
        unlabelled |= report_eval(f, "held out, trained", after, K);
    }
    unlabelled |= report_eval(f, "training samples", fit, K);
    /* head k at an answer position guesses the token k + 1 places on, so
     * only an answer of k + 1 tokens or more labels it (kvp_heads_collect) */
    if (unlabelled)
        fprintf(f, "  -: no sample for that head (an answer labels head k when it has k + 1 tokens or more): "
                   "raise -n\n");
}

/* What the file says of its training. */
static int record_info(kvp_heads *h, const kvp_heads_job *job, uint32_t n_answers, uint32_t n_train,
                       const kvp_heads_eval *after, double seconds)
{
    char key[64];
    int rc = kvp_meta_set_u64(&h->info, "medusa.train.answers", n_answers);
    rc = rc ? rc : kvp_meta_set_u64(&h->info, "medusa.train.samples", n_train);
    rc = rc ? rc : kvp_meta_set_u64(&h->info, "medusa.train.epochs", job->train.epochs);
    rc = rc ? rc : kvp_meta_set_f64(&h->info, "medusa.train.lr", job->train.lr);
    rc = rc ? rc : kvp_meta_set_f64(&h->info, "medusa.train.seconds", seconds);
    for (uint32_t k = 0; rc == 0 && after && k < h->n_heads; k++) {
        if (!after->n[k])
            continue; /* no held-out sample for head k: no accuracy, not 0 */
        snprintf(key, sizeof key, "medusa.%u.heldout_top1", k + 1);
        rc = kvp_meta_set_f64(&h->info, key, after->acc[k]);
    }
    return rc;
}

int kvp_heads_train_run(kvp_run *r, kvp_runopts *o, const kvp_heads_job *job, FILE *rep, kvp_err *err)
{
    const kvp_model *m = kvp_run_loaded(r);
    uint32_t K = job->n_heads ? job->n_heads : 4, d = m->cfg.n_embd;
    double t0 = kvp_gen_now();
    answers a = {0};
    kvp_heads h = {0};
    kvp_heads_vocab v = {0};
    kvp_heads_samples tr = {.n_heads = K, .n_embd = d}, ho = {.n_heads = K, .n_embd = d};
    kvp_heads_job jb = *job;
    jb.train.epochs = jb.train.epochs ? jb.train.epochs : 2;
    jb.train.lr = jb.train.lr > 0 ? jb.train.lr : 1e-3;
    int rc = kvp_heads_init(&h, K, d, m->fingerprint, err);
    kvp_out probe; /* an output that cannot be written is said before the minutes of work, not after */
    if (rc == 0 && (rc = kvp_out_open(&probe, job->out, err)) == 0)
        kvp_out_abort(&probe);
    if (rc == 0 && (rc = answer_all(r, o, job->samples, &a, err)) == 0 && rep)
        fprintf(rep, "specdec: %u answers from %s in %.1f s\n", a.count, job->prompts, kvp_gen_now() - t0);
    /* every tenth prompt's answers held out, when there are ten prompts */
    uint64_t n_prompts = 0;
    for (uint32_t i = 0; i < a.count; i++)
        n_prompts = a.id[i] + 1 > n_prompts ? a.id[i] + 1 : n_prompts;
    for (uint32_t i = 0; rc == 0 && i < a.count; i++)
        rc = kvp_heads_collect(r->engine, r->kc, a.tok[i], a.n[i], a.n_prompt[i], 0,
                               n_prompts >= 10 && a.id[i] % 10 == 9 ? &ho : &tr, err);
    if (rc == 0 && tr.n == 0)
        rc = kvp_err_set(err, KVP_EINVAL, "%s: the answers give no training sample (each needs 2 tokens or more: "
                         "raise -n)", job->prompts);
    if (rc == 0)
        rc = kvp_heads_vocab_init(&v, r->be, &m->output, err);
    kvp_heads_set st = {.hidden = tr.hidden, .label = tr.label, .n = tr.n, .n_heads = K};
    kvp_heads_set sh = {.hidden = ho.hidden, .label = ho.label, .n = ho.n, .n_heads = K};
    kvp_heads_eval before = {0}, after = {0}, fit = {0};
    if (rc == 0 && sh.n)
        rc = kvp_heads_evaluate(&h, &v, &sh, jb.train.batch, &before, err);
    jb.train.progress = show_epoch, jb.train.ctx = rep;
    if (rc == 0 && rep)
        fprintf(rep, "specdec: training %u heads on %u samples (%u held out), %u epochs\n", K, tr.n, ho.n,
                jb.train.epochs);
    if (rc == 0)
        rc = kvp_heads_train(&h, &v, &st, &jb.train, err);
    if (rc == 0 && sh.n)
        rc = kvp_heads_evaluate(&h, &v, &sh, jb.train.batch, &after, err);
    if (rc == 0)
        rc = kvp_heads_evaluate(&h, &v, &st, jb.train.batch, &fit, err);
    if (rc == 0 && rep)
        report_accuracy(rep, sh.n ? &before : NULL, &after, &fit, K);
    if (rc == 0 && record_info(&h, &jb, a.count, tr.n, sh.n ? &after : NULL, kvp_gen_now() - t0) < 0)
        rc = kvp_err_set(err, KVP_ENOMEM, "heads training: out of memory");
    if (rc == 0)
        rc = kvp_heads_write(&h, job->out, "specdec " KVP_VERSION, err);
    if (rc == 0 && rep)
        fprintf(rep, "specdec: wrote %s (%u heads) in %.1f s\n", job->out, K, kvp_gen_now() - t0);
    kvp_heads_vocab_free(&v);
    kvp_heads_samples_free(&tr);
    kvp_heads_samples_free(&ho);
    kvp_heads_free(&h);
    answers_free(&a);
    return rc;
}
