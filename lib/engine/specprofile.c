/* specprofile.c - specdec --profile (see specprofile.h). */
#include "specprofile.h"

#include "batch.h"
#include "cli.h"
#include "draftmodel.h"
#include "hash.h"
#include "jobsrc.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    TIMING_REPS = 9,     /* timings of each cost a run; the median counts */
    METHODS_MAX = 4,     /* ngram, draft, layerskip, and room for one more */
};
#define MIN_GAIN 1.05    /* a predicted speedup below this is not worth a drafter */

uint32_t kvp_spec_profile_parse_lens(const char *arg, uint32_t ks[KVP_DRAFT_MAX], uint32_t *n)
{
    *n = 0;
    for (const char *s = arg;;) {
        size_t len = strcspn(s, ",");
        char one[24];
        if (len == 0 || len >= sizeof one)
            kvp_cli_usage_error("--draft-len: '%s' is not K or a list K,K,... (1..%d each)", arg, KVP_DRAFT_MAX);
        if (*n == KVP_DRAFT_MAX)
            kvp_cli_usage_error("--draft-len: more than %d lengths in '%s'", KVP_DRAFT_MAX, arg);
        memcpy(one, s, len);
        one[len] = 0;
        ks[(*n)++] = (uint32_t)kvp_cli_opt_i64("--draft-len", one, 1, KVP_DRAFT_MAX);
        if (!s[len])
            break;
        s += len + 1;
    }
    return ks[*n - 1];
}

/* ---- timing ---- */

int kvp_spec_time_drafter(const kvp_spec_method *m, const uint32_t *tokens, uint32_t n_prompt, uint32_t n, uint32_t k,
                          uint32_t reps, kvp_spec_costs *t, kvp_err *err)
{
    const kvp_drafter *d = &m->drafter;
    uint32_t out[KVP_DRAFT_MAX];
    double v[TIMING_REPS];
    void *state = NULL;
    if (reps > TIMING_REPS)
        reps = TIMING_REPS;
    /* a request's first call: a model drafter feeds it the prompt */
    double t0 = kvp_gen_now();
    d->draft(d->ctx, &state, tokens, n_prompt, k, out);
    double first = kvp_gen_now() - t0;
    if (n > n_prompt) /* on to the context asked for, untimed */
        d->draft(d->ctx, &state, tokens, n, k, out);
    /* then a token further each call, as after a step: one token to feed,
     * k to draft */
    for (uint32_t i = 0; i < reps; i++) {
        t0 = kvp_gen_now();
        d->draft(d->ctx, &state, tokens, n + 1 + i, k, out);
        v[i] = kvp_gen_now() - t0;
    }
    if (state && d->release)
        d->release(d->ctx, state);
    t->call = kvp_spec_median(v, reps);
    t->prime = first > t->call ? first - t->call : 0;
    (void)err;
    return 0;
}

/* step[j], j = 1..max_j: the median time of an engine step of j tokens on
 * one sequence of ctx tokens (tokens[ctx + max_j]), asking for what decode
 * (j = 1: the last row) and a verify step (every row) ask.  Sizes take
 * turns, so a change in the machine's load falls on all of them. */
static int time_steps(kvp_engine *e, kvp_kvcache *kc, const uint32_t *tokens, uint32_t ctx, uint32_t max_j,
                      double *step, kvp_err *err)
{
    float *logits = malloc((size_t)max_j * kvp_engine_n_vocab(e) * sizeof *logits);
    double *v = malloc((size_t)(max_j + 1) * TIMING_REPS * sizeof *v);
    int seq = -1, rc = !logits || !v ? kvp_err_set(err, KVP_ENOMEM, "profile: out of memory") : 0;
    if (rc == 0)
        rc = seq = kvp_kvcache_seq_new(kc, err);
    if (rc >= 0)
        rc = kvp_engine_prefill(e, seq, tokens, ctx, 0, NULL, err);
    /* a first round untimed: caches and pages warm */
    for (int rep = -1; rc == 0 && rep < TIMING_REPS; rep++)
        for (uint32_t j = 1; rc == 0 && j <= max_j; j++) {
            kvp_step_seq s = {.seq = seq, .tokens = tokens + ctx, .n_tokens = j,
                              .want = j == 1 ? KVP_LOGITS_LAST : KVP_LOGITS_ALL};
            double t0 = kvp_gen_now();
            int got = kvp_engine_step(e, &s, 1, logits, err);
            if (rep >= 0)
                v[(size_t)j * TIMING_REPS + (size_t)rep] = kvp_gen_now() - t0;
            rc = got < 0 ? got : kvp_kvcache_seq_truncate(kc, seq, ctx, err);
        }
    for (uint32_t j = 1; rc == 0 && j <= max_j; j++)
        step[j] = kvp_spec_median(v + (size_t)j * TIMING_REPS, TIMING_REPS);
    if (seq >= 0)
        kvp_kvcache_seq_free(kc, seq);
    free(logits);
    free(v);
    return rc < 0 ? rc : 0;
}

/* ---- one run of the prompts ---- */

/* A drafter wrapped to count the calls the batch engine makes (a step
 * whose drafter finds nothing still pays for asking) and time them. */
typedef struct counted {
    const kvp_drafter *inner;
    uint64_t calls;
    double seconds;
} counted;

static uint32_t counted_draft(void *ctx, void **state, const uint32_t *tokens, uint32_t n, uint32_t k, uint32_t *out)
{
    counted *c = ctx;
    double t0 = kvp_gen_now();
    uint32_t m = c->inner->draft(c->inner->ctx, state, tokens, n, k, out);
    c->seconds += kvp_gen_now() - t0;
    c->calls++;
    return m;
}

static void counted_release(void *ctx, void *state)
{
    const kvp_drafter *d = ((counted *)ctx)->inner;
    if (d->release)
        d->release(d->ctx, state);
}

/* What a run gave, request by request as they finished (one at a time: in
 * the input's order). */
typedef struct run_out {
    uint64_t *hash;          /* [n] each request's text and token count */
    double *gen;             /* [n] each request's time from first token to last */
    uint64_t n, cap;
    uint64_t gen_tokens;     /* tokens after each request's first */
    double ctx_sum;          /* context length summed over those tokens' steps */
    uint64_t prompt_sum;
    int keep;                /* keep the longest request's tokens (the plain run) */
    uint32_t *longest;       /* [n_longest]: its prompt and output, n_longest_prompt of prompt */
    uint32_t n_longest, n_longest_prompt;
} run_out;

static void keep_tokens(run_out *o, const kvp_request *r)
{
    uint32_t n = r->sr.n_tokens;
    if (n <= o->n_longest)
        return;
    uint32_t *t = realloc(o->longest, (size_t)n * sizeof *t);
    if (!t)
        kvp_cli_die("out of memory");
    memcpy(t, r->tokens, (size_t)n * sizeof *t);
    o->longest = t;
    o->n_longest = n;
    o->n_longest_prompt = r->n_prompt;
}

static void run_emit(void *ctx, kvp_gen_seq *s, const char *bytes, size_t n)
{
    (void)bytes;
    run_out *o = ctx;
    if (n)
        return;
    if (o->n == o->cap) {
        uint64_t cap = o->cap ? 2 * o->cap : 64;
        uint64_t *h = realloc(o->hash, cap * sizeof *h);
        double *g = h ? realloc(o->gen, cap * sizeof *g) : NULL;
        if (h)
            o->hash = h;
        if (!g)
            kvp_cli_die("out of memory");
        o->gen = g;
        o->cap = cap;
    }
    o->hash[o->n] = kvp_xxh64(s->text.data, s->text.len, s->n_gen);
    o->gen[o->n++] = s->n_gen > 1 ? s->t_last - s->t_first : 0;
    const kvp_request *r = kvp_request_of(s);
    if (s->n_gen > 1) {
        /* the i-th decode step (i = 1..n_gen-1) sees n_prompt + i - 1 tokens */
        o->gen_tokens += s->n_gen - 1;
        o->ctx_sum += (double)(s->n_gen - 1) * (r->n_prompt + (s->n_gen - 2) / 2.0);
    }
    o->prompt_sum += r->n_prompt;
    if (o->keep)
        keep_tokens(o, r);
}

static void run_out_free(run_out *o)
{
    free(o->hash);
    free(o->gen);
    free(o->longest);
    memset(o, 0, sizeof *o);
}

/* ---- the profile ---- */

typedef struct row {
    const kvp_spec_method *m;   /* NULL: plain decoding */
    uint32_t k;
    kvp_spec_counts c;
    kvp_spec_costs t;           /* each the least of the runs' medians */
    double *gen;                /* [n_req] each request's fastest generation, first token to last */
    uint64_t n_req;
    double gen_seconds;         /* their sum */
    double seconds;             /* the fastest whole run */
    uint64_t gen_tokens, generated;
    double call_in_run;         /* the drafter's calls as the run timed them, mean */
    uint64_t same, differ;      /* requests whose text is plain decoding's */
    double predicted, measured, e2e;
} row;

typedef struct profile {
    const kvp_runopts *o;
    kvp_run *r;
    row *rows;                  /* [n_rows]: plain decoding first */
    uint32_t n_rows;
    run_out ref;                /* plain decoding's first run: the texts and the probe tokens */
    uint32_t ctx, prompt;       /* the decode steps' mean context and the mean prompt, tokens */
    uint32_t *probe;            /* [ctx + KVP_DRAFT_MAX + 1 + TIMING_REPS] real tokens, cycled */
} profile;

static void least(double *have, double got, int first) { *have = first || got < *have ? got : *have; }

/* The mean context and prompt of the plain run, and the tokens the costs
 * are timed on: the longest request's, repeated to the length needed. */
static void set_probe(profile *p)
{
    const run_out *o = &p->ref;
    if (!o->gen_tokens || !o->n_longest)
        kvp_cli_die("%s: no request generated more than one token: nothing to profile (raise -n)", p->o->file);
    p->ctx = (uint32_t)lround(o->ctx_sum / (double)o->gen_tokens);
    p->prompt = (uint32_t)lround((double)o->prompt_sum / (double)o->n);
    if (p->prompt < 1)
        p->prompt = 1;
    if (p->ctx < p->prompt)
        p->ctx = p->prompt;
    size_t len = (size_t)p->ctx + KVP_DRAFT_MAX + 1 + TIMING_REPS;
    p->probe = malloc(len * sizeof *p->probe);
    if (!p->probe)
        kvp_cli_die("out of memory");
    for (size_t i = 0; i < len; i++)
        p->probe[i] = o->longest[i % o->n_longest];
}

/* Each request's fastest generation over the runs so far: a busy moment
 * of the machine slows a few requests of one run, not the same ones in
 * every run.  One at a time, requests finish in the input's order. */
static void keep_fastest(row *w, const run_out *out, int first)
{
    if (first) {
        w->gen = malloc((out->n ? out->n : 1) * sizeof *w->gen);
        if (!w->gen)
            kvp_cli_die("out of memory");
        memcpy(w->gen, out->gen, out->n * sizeof *w->gen);
        w->n_req = out->n;
        w->gen_tokens = out->gen_tokens;
    }
    w->gen_seconds = 0;
    for (uint64_t i = 0; i < w->n_req; i++) {
        if (i < out->n && out->gen[i] < w->gen[i])
            w->gen[i] = out->gen[i];
        w->gen_seconds += w->gen[i];
    }
}

/* One run of every prompt with row w's drafter (none for plain decoding),
 * on a fresh cache and engine; then its costs, timed on that engine. */
static void run_row(profile *p, row *w, int first, int check)
{
    kvp_err err = {0};
    kvp_run *r = p->r;
    kvp_jobsrc *js = NULL;
    run_out out = {.keep = check == 0 && first};
    counted cd = {.inner = w->m ? &w->m->drafter : NULL};
    kvp_drafter d = {.ctx = &cd, .draft = counted_draft, .release = counted_release};
    kvp_batch_opts bo = {.sched = p->o->sched, .drafter = w->m ? &d : NULL, .draft_len = w->k};
    bo.sched.max_num_seqs = 1; /* the cost model is one sequence's steps */
    kvp_batch_stats st;
    if (kvp_jobsrc_open(&js, r, p->o, "-", &err) < 0)
        kvp_cli_die_err(&err);
    kvp_batch_source src = kvp_jobsrc_source(js);
    if (kvp_batch_run(r->engine, r->kc, r->tok, &bo, &src, run_emit, &out, &st, &err) < 0)
        kvp_cli_die_err(&err);
    if (!st.requests)
        kvp_cli_die("%s: no prompts", p->o->file);
    if (!check) {
        p->ref = out; /* plain decoding's texts, the others' reference */
        set_probe(p);
    }
    /* a run's counts are the same every time (greedy); its clock is not */
    if (w->m) {
        w->c = (kvp_spec_counts){.k = w->k, .requests = st.requests, .calls = cd.calls,
                                 .verify_steps = st.verify_steps, .accepted = st.accepted};
        /* each decode step gave 1 + its kept drafts (but a run that stops
         * inside kept drafts: counted kept, not generated) */
        w->c.steps = out.gen_tokens > st.accepted ? out.gen_tokens - st.accepted : 0;
        if (w->c.steps < st.verify_steps)
            w->c.steps = st.verify_steps;
        memcpy(w->c.drafted_at, st.drafted_at, sizeof st.drafted_at);
        memcpy(w->c.accepted_at, st.accepted_at, sizeof st.accepted_at);
        w->call_in_run = cd.calls ? cd.seconds / (double)cd.calls : 0;
    }
    keep_fastest(w, &out, first);
    if (first || st.seconds < w->seconds) {
        w->seconds = st.seconds;
        w->generated = st.generated;
    }
    if (check && first)
        for (uint64_t i = 0; i < out.n; i++)
            *(i < p->ref.n && out.hash[i] == p->ref.hash[i] ? &w->same : &w->differ) += 1;
    /* the costs, on this run's engine */
    kvp_spec_costs t = {0};
    uint32_t max_j = w->m ? w->k + 1 : 1;
    if (time_steps(r->engine, r->kc, p->probe, p->ctx, max_j, t.step, &err) < 0)
        kvp_cli_die_err(&err);
    if (w->m) {
        kvp_spec_time_fn *time_draft = w->m->time_draft ? w->m->time_draft : kvp_spec_time_drafter;
        if (time_draft(w->m, p->probe, p->prompt, p->ctx, w->k, TIMING_REPS, &t, &err) < 0)
            kvp_cli_die_err(&err);
    }
    for (uint32_t j = 1; j <= max_j; j++)
        least(&w->t.step[j], t.step[j], first);
    least(&w->t.call, t.call, first);
    least(&w->t.prime, t.prime, first);
    if (check)
        run_out_free(&out);
    kvp_jobsrc_free(js);
    kvp_engine_free(r->engine);
    kvp_kvcache_free(r->kc);
    r->engine = NULL;
    r->kc = NULL;
}

/* The speedups of each row against plain decoding (rows[0]). */
static void compare_rows(profile *p)
{
    const row *base = &p->rows[0];
    for (uint32_t i = 1; i < p->n_rows; i++) {
        row *w = &p->rows[i];
        w->predicted = kvp_spec_predict_speedup(&w->c, &w->t);
        /* tokens a second: the same tokens when the texts are the same */
        double a = base->gen_seconds > 0 ? (double)base->gen_tokens / base->gen_seconds : 0;
        double b = w->gen_seconds > 0 ? (double)w->gen_tokens / w->gen_seconds : 0;
        w->measured = a > 0 ? b / a : 0;
        a = base->seconds > 0 ? (double)base->generated / base->seconds : 0;
        b = w->seconds > 0 ? (double)w->generated / w->seconds : 0;
        w->e2e = a > 0 ? b / a : 0;
    }
}

static uint64_t drafted(const kvp_spec_counts *c)
{
    uint64_t n = 0;
    for (uint32_t j = 0; j < c->k; j++)
        n += c->drafted_at[j];
    return n;
}

static double ratio(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0; }

static void print_json_row(const profile *p, const row *w)
{
    if (!w->m) {
        printf("{\"method\":\"plain\",\"requests\":%llu,\"tokens\":%llu,\"context\":%u,\"prompt\":%u,"
               "\"t_decode_ms\":%.4f,\"gen_seconds\":%.4f,\"gen_tokens_per_s\":%.2f,\"output_tokens_per_s\":%.2f}\n",
               (unsigned long long)p->ref.n, (unsigned long long)w->gen_tokens, p->ctx, p->prompt,
               w->t.step[1] * 1e3, w->gen_seconds, w->gen_seconds > 0 ? (double)w->gen_tokens / w->gen_seconds : 0,
               w->seconds > 0 ? (double)w->generated / w->seconds : 0);
        return;
    }
    const kvp_spec_counts *c = &w->c;
    uint64_t h[KVP_DRAFT_MAX + 1];
    kvp_spec_histogram(c, h);
    printf("{\"method\":\"%s\",\"draft_len\":%u,\"steps\":%llu,\"calls\":%llu,\"verify_steps\":%llu,\"drafted\":%llu,"
           "\"accepted\":%llu,\"acceptance\":%.4f,\"mean_accepted\":%.4f,\"tokens_per_step\":%.4f,\"histogram\":[",
           w->m->name, w->k, (unsigned long long)c->steps, (unsigned long long)c->calls,
           (unsigned long long)c->verify_steps, (unsigned long long)drafted(c), (unsigned long long)c->accepted,
           ratio(c->accepted, drafted(c)), ratio(c->accepted, c->verify_steps), kvp_spec_tokens_per_step(c));
    for (uint32_t m = 0; m <= c->k; m++)
        printf("%s%llu", m ? "," : "", (unsigned long long)h[m]);
    printf("],\"t_step_ms\":[");
    for (uint32_t j = 1; j <= c->k + 1; j++)
        printf("%s%.4f", j > 1 ? "," : "", w->t.step[j] * 1e3);
    printf("],\"t_decode_ms\":%.4f,\"t_verify_ms\":%.4f,\"t_draft_ms\":%.4f,\"t_prime_ms\":%.4f,"
           "\"t_draft_in_run_ms\":%.4f,\"model_seconds\":%.4f,\"gen_seconds\":%.4f,\"predicted_speedup\":%.4f,"
           "\"measured_speedup\":%.4f,\"e2e_speedup\":%.4f,\"same\":%llu,\"differ\":%llu}\n",
           w->t.step[1] * 1e3, w->t.step[c->k + 1] * 1e3, w->t.call * 1e3, w->t.prime * 1e3, w->call_in_run * 1e3,
           kvp_spec_seconds(c, &w->t), w->gen_seconds, w->predicted, w->measured, w->e2e, (unsigned long long)w->same,
           (unsigned long long)w->differ);
}

static void print_text(const profile *p)
{
    const row *base = &p->rows[0];
    printf("profile: %s, %llu requests one at a time, %llu tokens after their first; decode steps see %u tokens of "
           "context on average (prompts %u)\n",
           p->o->file, (unsigned long long)p->ref.n, (unsigned long long)base->gen_tokens, p->ctx, p->prompt);
    printf("plain decode: %.3f ms a step, %.1f tokens/s generating, %.1f with the prompts\n", base->t.step[1] * 1e3,
           base->gen_seconds > 0 ? (double)base->gen_tokens / base->gen_seconds : 0,
           base->seconds > 0 ? (double)base->generated / base->seconds : 0);
    printf("%-10s %2s %6s %6s %6s %9s %9s %9s %9s %8s %9s %5s  %s\n", "method", "K", "steps", "verify", "accept",
           "kept/step", "predicted", "measured", "e2e", "draft_ms", "verify_ms", "same", "kept 0..K (verify steps)");
    for (uint32_t i = 1; i < p->n_rows; i++) {
        const row *w = &p->rows[i];
        const kvp_spec_counts *c = &w->c;
        uint64_t h[KVP_DRAFT_MAX + 1];
        kvp_spec_histogram(c, h);
        printf("%-10s %2u %6llu %6llu %6.3f %9.3f %8.2fx %8.2fx %8.2fx %8.3f %9.3f %2llu/%-2llu ", w->m->name, w->k,
               (unsigned long long)c->steps, (unsigned long long)c->verify_steps, ratio(c->accepted, drafted(c)),
               ratio(c->accepted, c->verify_steps), w->predicted, w->measured, w->e2e, w->t.call * 1e3,
               w->t.step[w->k + 1] * 1e3, (unsigned long long)w->same, (unsigned long long)(w->same + w->differ));
        for (uint32_t m = 0; m <= c->k; m++)
            printf(" %llu", (unsigned long long)h[m]);
        putchar('\n');
    }
}

static void print_recommendation(const profile *p, int json)
{
    double *s = malloc((size_t)p->n_rows * sizeof *s);
    if (!s)
        kvp_cli_die("out of memory");
    for (uint32_t i = 0; i < p->n_rows; i++)
        s[i] = i ? p->rows[i].predicted : 0; /* plain decoding is the fallback, not a candidate */
    int best = kvp_spec_recommend(s, p->n_rows, MIN_GAIN);
    free(s);
    if (best < 0) {
        if (json)
            printf("{\"recommendation\":\"plain\",\"min_gain\":%.2f}\n", MIN_GAIN);
        else
            printf("recommendation: plain decode (no method is predicted to gain %.0f%%)\n", (MIN_GAIN - 1) * 100);
        return;
    }
    const row *w = &p->rows[best];
    if (json)
        printf("{\"recommendation\":\"%s\",\"draft_len\":%u,\"predicted_speedup\":%.4f,\"measured_speedup\":%.4f}\n",
               w->m->name, w->k, w->predicted, w->measured);
    else
        printf("recommendation: specdec --method %s --draft-len %u (predicted %.2fx, measured %.2fx)\n", w->m->name,
               w->k, w->predicted, w->measured);
}

/* ---- the methods ---- */

typedef struct method_set {
    kvp_spec_method m[METHODS_MAX];
    uint32_t n;
    kvp_ngram_drafter ngram;
    kvp_run draft_run, skip_run;     /* a draft model; the model's first layers */
    kvp_draft_model draft_dm, skip_dm;
} method_set;

/* A model drafter on dr, as specdec's --method draft and layerskip make it. */
static void add_model_method(method_set *ms, const char *name, kvp_run *dr, kvp_draft_model *dm, uint32_t chunk)
{
    kvp_err err = {0};
    if (kvp_draft_model_init(dm, dr->engine, dr->kc, &err) < 0)
        kvp_cli_die_err(&err);
    dm->chunk = chunk;
    ms->m[ms->n++] = (kvp_spec_method){
        .name = name,
        .drafter = {.ctx = dm, .draft = kvp_draft_model_draft, .release = kvp_draft_model_release}};
}

/* ngram always; draft with --draft; layerskip.  The drafters' caches keep
 * no freed prefix: every run feeds them its prompts anew, as the first. */
static void open_methods(method_set *ms, const kvp_run *r, const kvp_runopts *o, const kvp_spec_profile_opts *po)
{
    kvp_err err = {0};
    kvp_runopts dro = *o;
    dro.kv.no_cache = 1;
    ms->ngram = po->ngram;
    ms->m[ms->n++] = (kvp_spec_method){.name = "ngram", .drafter = {.ctx = &ms->ngram, .draft = kvp_ngram_draft}};
    if (po->draft) {
        if (kvp_run_open_draft(&ms->draft_run, r, &dro, po->draft, &err) < 0)
            kvp_cli_die_err(&err);
        add_model_method(ms, "draft", &ms->draft_run, &ms->draft_dm, o->chunk);
    }
    uint32_t nl = kvp_run_loaded(r)->cfg.n_layer, keep = po->draft_layers ? po->draft_layers : (nl + 1) / 2;
    if (keep > nl)
        kvp_cli_die("--draft-layers %u: %s has %u layers", keep, o->model, nl);
    if (kvp_run_open_layerskip(&ms->skip_run, r, &dro, keep, &err) < 0)
        kvp_cli_die_err(&err);
    add_model_method(ms, "layerskip", &ms->skip_run, &ms->skip_dm, o->chunk);
}

static void close_methods(method_set *ms)
{
    if (ms->draft_run.engine) {
        kvp_draft_model_free(&ms->draft_dm);
        kvp_run_close_draft(&ms->draft_run);
    }
    kvp_draft_model_free(&ms->skip_dm);
    kvp_run_close_draft(&ms->skip_run);
}

static void progress(uint32_t i, uint32_t n, const row *w)
{
    if (kvp_cli_progress_enabled())
        fprintf(stderr, "\rprofile: %u of %u: %s K %u   %s", i + 1, n, w->m ? w->m->name : "plain", w->k,
                i + 1 == n ? "\n" : "");
}

int kvp_spec_profile_main(const kvp_runopts *o, const kvp_spec_profile_opts *po)
{
    static const uint32_t ladder[] = {1, 2, 4, 8};
    const uint32_t *ks = po->n_k ? po->ks : ladder;
    uint32_t n_k = po->n_k ? po->n_k : sizeof ladder / sizeof ladder[0], reps = po->reps ? po->reps : 1;
    kvp_err err = {0};
    kvp_run r;
    if (kvp_run_open(&r, o, &err) < 0)
        kvp_cli_die_err(&err);
    method_set ms = {0};
    open_methods(&ms, &r, o, po);
    profile p = {.o = o, .r = &r, .n_rows = 1 + ms.n * n_k};
    p.rows = calloc(p.n_rows, sizeof *p.rows);
    if (!p.rows)
        kvp_cli_die("out of memory");
    for (uint32_t i = 0; i < ms.n; i++)
        for (uint32_t j = 0; j < n_k; j++)
            p.rows[1 + i * n_k + j] = (row){.m = &ms.m[i], .k = ks[j]};
    /* Every row once, then again: a slow moment of the machine falls on
     * one run of a row, and the fastest counts.  Plain decoding, every
     * row's reference, runs first and last each time round, so one slow
     * moment does not skew them all. */
    for (uint32_t rep = 0, done = 0; rep < reps; rep++)
        for (uint32_t i = 0; i <= p.n_rows; i++, done++) {
            uint32_t at = i < p.n_rows ? i : 0;
            progress(done, reps * (p.n_rows + 1), &p.rows[at]);
            run_row(&p, &p.rows[at], rep == 0 && i < p.n_rows, i > 0 || rep > 0);
        }
    compare_rows(&p);
    if (o->json)
        for (uint32_t i = 0; i < p.n_rows; i++)
            print_json_row(&p, &p.rows[i]);
    else
        print_text(&p);
    print_recommendation(&p, o->json);
    uint64_t differ = 0;
    for (uint32_t i = 1; i < p.n_rows; i++)
        differ += p.rows[i].differ;
    for (uint32_t i = 0; i < p.n_rows; i++)
        free(p.rows[i].gen);
    free(p.rows);
    free(p.probe);
    run_out_free(&p.ref);
    close_methods(&ms);
    kvp_run_close(&r);
    int rc = kvp_cli_close_stdout();
    if (differ) {
        kvp_cli_warn("%llu speculative outputs differ from plain decoding's: a bug, please report it",
                     (unsigned long long)differ);
        return KVP_EXIT_FAIL;
    }
    return rc;
}
