/* specprofile.c - specdec --profile (see specprofile.h). */
#include "specprofile.h"

#include "batch.h"
#include "cli.h"
#include "draftmodel.h"
#include "hash.h"
#include "heads.h"
#include "io.h"
#include "jobsrc.h"
#include "promptsonce.h"
#include "shard.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum {
    TIMING_REPS = 9,     /* timings of each cost a run; the median counts */
    METHODS_MAX = 4,     /* ngram, draft, layerskip, heads */
};
#define MIN_GAIN 1.05    /* a predicted speedup below this is not worth a drafter */
/* A prompts file past this is refused: it is held whole (below), and each
 * of its requests runs 1 + methods x lengths times, so a profile wants a
 * sample of them, not a day's traffic. */
#define PROMPTS_MAX ((uint64_t)64 << 20)

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
        uint32_t k = (uint32_t)kvp_cli_opt_i64("--draft-len", one, 1, KVP_DRAFT_MAX);
        for (uint32_t i = 0; i < *n; i++) /* a length twice would be profiled twice, a row each */
            if (ks[i] == k)
                kvp_cli_usage_error("--draft-len: %u twice in '%s' (each length is profiled once)", k, arg);
        ks[(*n)++] = k;
        if (!s[len])
            break;
        s += len + 1;
    }
    return ks[*n - 1];
}

/* ---- the prompts, read once (promptsonce.h) ---- */

typedef struct prompts_copy {
    kvp_prompts_once once;
    kvp_runopts o;            /* the caller's options reading the copy instead of the file */
} prompts_copy;

static void prompts_copy_open(prompts_copy *pc, const kvp_runopts *o)
{
    /* a profile installs no stop handler (kvp_in_interrupt_on is off):
     * nothing stops the read but a signal's default action */
    if (kvp_prompts_once_open(&pc->once, o->file, 1, PROMPTS_MAX,
                              "a profile runs each request many times over; give it a sample") < 0)
        kvp_cli_die("%s: reading stopped by a signal", o->file);
    pc->o = *o;
    pc->o.file = kvp_prompts_once_path(&pc->once);
}

static void prompts_copy_close(prompts_copy *pc) { kvp_prompts_once_close(&pc->once); }

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

static void counted_draft_hidden(void *ctx, uint32_t n, const float *const *hidden, const uint32_t *k, uint32_t max_b,
                                 uint32_t *out, uint32_t *len, uint32_t *n_branch)
{
    counted *c = ctx;
    double t0 = kvp_gen_now();
    c->inner->draft_hidden(c->inner->ctx, n, hidden, k, max_b, out, len, n_branch);
    c->seconds += kvp_gen_now() - t0;
    c->calls += n;
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
    uint32_t *longest;       /* [n_longest]: its prompt and output */
    uint32_t n_longest;
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
    kvp_spec_counts c;          /* summed over the requests */
    kvp_spec_costs t;           /* each the least of the times round */
    double *gen, *wall;         /* [n_req] each request's fastest run: first token to last, and whole */
    double gen_seconds, seconds; /* their sums */
    uint64_t gen_tokens, generated;
    double call_seconds;        /* in the drafter, as the runs timed it */
    uint64_t same, differ;      /* requests whose text is plain decoding's */
    double predicted, measured, e2e;
} row;

typedef struct profile {
    const kvp_runopts *o;
    const prompts_copy *pc;     /* the runs read the prompts from here (pc->o) */
    kvp_run *r;
    row *rows;                  /* [n_rows]: plain decoding first */
    uint32_t n_rows;
    run_out ref;                /* plain decoding of all the requests: their texts, the longest */
    uint32_t n_req;
    uint32_t ctx, prompt;       /* the decode steps' mean context and the mean prompt, tokens */
    uint32_t *probe;            /* [ctx + KVP_DRAFT_MAX + 1 + TIMING_REPS] real tokens, cycled */
} profile;

static void least(double *have, double got, int first) { *have = first || got < *have ? got : *have; }

static double sum(const double *v, uint32_t n)
{
    double s = 0;
    for (uint32_t i = 0; i < n; i++)
        s += v[i];
    return s;
}

static _Noreturn void die_named(const profile *p, kvp_err *err)
{
    kvp_prompts_once_name(&p->pc->once, err);
    kvp_cli_die_err(err);
}

/* The prompts (request `only` alone, or every one when only is n_req)
 * with drafter d (NULL: none), on a fresh cache and engine, left open for
 * timing (close_engine). */
static void run_prompts(profile *p, const kvp_spec_method *m, const kvp_drafter *d, uint32_t k, uint32_t only,
                        run_out *out, kvp_batch_stats *st)
{
    kvp_err err = {0};
    kvp_jobsrc *js = NULL;
    kvp_batch_opts bo = {.sched = p->o->sched, .drafter = d, .draft_len = k};
    bo.sched.max_num_seqs = 1; /* the cost model is one sequence's steps */
    if (kvp_jobsrc_open(&js, p->r, &p->pc->o, "-", 0, &err) < 0 ||
        (m && m->bind && m->bind(m, p->r->engine, p->r->kc, &err) < 0))
        die_named(p, &err);
    if (only < p->n_req)
        kvp_jobsrc_filter(js, only, p->n_req, NULL);
    kvp_batch_source src = kvp_jobsrc_source(js);
    if (kvp_batch_run(p->r->engine, p->r->kc, p->r->tok, &bo, &src, run_emit, out, st, &err) < 0)
        die_named(p, &err);
    kvp_jobsrc_free(js);
}

static void close_engine(profile *p)
{
    kvp_engine_free(p->r->engine);
    kvp_kvcache_free(p->r->kc);
    p->r->engine = NULL;
    p->r->kc = NULL;
}

/* Plain decoding of every request: the texts each run is checked against,
 * and the context the costs are timed at: the decode steps' mean, on the
 * longest request's tokens, repeated to the length needed. */
static void run_reference(profile *p)
{
    run_out *o = &p->ref;
    kvp_batch_stats st;
    o->keep = 1;
    run_prompts(p, NULL, NULL, 0, UINT32_MAX, o, &st);
    close_engine(p);
    if (!o->n)
        kvp_cli_die("%s: no prompt in the file: nothing to profile", p->o->file);
    if (o->n > UINT32_MAX - 1)
        kvp_cli_die("%s: more than %u prompts", p->o->file, UINT32_MAX - 1);
    if (!o->gen_tokens)
        kvp_cli_die("%s: no request generated more than one token: nothing to profile (raise -n)", p->o->file);
    p->n_req = (uint32_t)o->n;
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

/* A run's counts into its row's (each step gave 1 + its kept drafts; but
 * a request that stops inside kept drafts: counted kept, not generated). */
static void add_counts(row *w, const kvp_batch_stats *st, const counted *cd, const run_out *out)
{
    kvp_spec_counts *c = &w->c;
    uint64_t steps = out->gen_tokens > st->accepted ? out->gen_tokens - st->accepted : 0;
    c->k = w->k;
    /* a run is one request (run_request): it paid the drafter's prime
     * when it called the drafter at all; one whose budget ended at its
     * first decode step never did, and never fed it its prompt */
    c->primed += cd->calls > 0;
    c->steps += steps > st->verify_steps ? steps : st->verify_steps;
    c->calls += cd->calls;
    c->verify_steps += st->verify_steps;
    c->accepted += st->accepted;
    for (uint32_t j = 0; j < KVP_DRAFT_MAX; j++) {
        c->drafted_at[j] += st->drafted_at[j];
        c->accepted_at[j] += st->accepted_at[j];
    }
    w->call_seconds += cd->seconds;
}

/* Request j alone with row w's drafter.  The first time round: its counts,
 * tokens, and whether its text is plain decoding's; every time: its
 * times, the fastest kept.  The engine stays open (close_engine). */
static void run_request(profile *p, row *w, uint32_t j, int first)
{
    const kvp_drafter *inner = w->m ? &w->m->drafter : NULL;
    counted cd = {.inner = inner};
    kvp_drafter d = {.ctx = &cd, .release = counted_release, .cheap = inner && inner->cheap,
                     .on_target_cache = inner && inner->on_target_cache};
    if (inner && inner->draft_hidden)
        d.draft_hidden = counted_draft_hidden;
    else
        d.draft = counted_draft;
    run_out out = {0};
    kvp_batch_stats st;
    run_prompts(p, w->m, w->m ? &d : NULL, w->k, j, &out, &st);
    if (out.n != 1)
        kvp_cli_die("%s: request %u ran %llu times alone, not once", p->o->file, j, (unsigned long long)out.n);
    if (first) {
        if (w->m)
            add_counts(w, &st, &cd, &out);
        w->gen_tokens += out.gen_tokens;
        w->generated += st.generated;
        *(out.hash[0] == p->ref.hash[j] ? &w->same : &w->differ) += 1;
    }
    least(&w->gen[j], out.gen[0], first);
    least(&w->wall[j], st.seconds, first);
    run_out_free(&out);
}

/* Row w's costs, on the engine of its last run: the least of the times
 * round. */
static void time_costs(profile *p, row *w, int first)
{
    kvp_err err = {0};
    kvp_spec_costs t = {0};
    uint32_t max_j = w->m ? w->k + 1 : 1;
    if (time_steps(p->r->engine, p->r->kc, p->probe, p->ctx, max_j, t.step, &err) < 0)
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
}

/* The speedups of each row against plain decoding (rows[0]). */
static void compare_rows(profile *p)
{
    for (uint32_t i = 0; i < p->n_rows; i++) {
        p->rows[i].gen_seconds = sum(p->rows[i].gen, p->n_req);
        p->rows[i].seconds = sum(p->rows[i].wall, p->n_req);
    }
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

/* ,"key":a/b as JSON, null where b is 0 (nothing drafted, nothing
 * verified: no rate, as --stats' JSON says it) */
static void json_ratio(const char *key, uint64_t a, uint64_t b)
{
    if (b)
        printf(",\"%s\":%.4f", key, (double)a / (double)b);
    else
        printf(",\"%s\":null", key);
}

/* The specdec options that run what row w profiled: its method's (a path
 * in them quoted for a shell) and its length, for pasting into a command
 * line, however long the path.  Malloc'd. */
static char *row_options(const row *w)
{
    char *s;
    if (asprintf(&s, "%s --draft-len %u", w->m->options, w->k) < 0)
        kvp_cli_die("out of memory");
    return s;
}

static void print_json_row(const profile *p, const row *w)
{
    if (!w->m) {
        printf("{\"method\":\"plain\",\"requests\":%llu,\"tokens\":%llu,\"context\":%u,\"prompt\":%u,"
               "\"t_decode_ms\":%.4f,\"gen_seconds\":%.4f,\"gen_tokens_per_s\":%.2f,\"output_tokens_per_s\":%.2f}\n",
               (unsigned long long)p->n_req, (unsigned long long)w->gen_tokens, p->ctx, p->prompt,
               w->t.step[1] * 1e3, w->gen_seconds, w->gen_seconds > 0 ? (double)w->gen_tokens / w->gen_seconds : 0,
               w->seconds > 0 ? (double)w->generated / w->seconds : 0);
        return;
    }
    const kvp_spec_counts *c = &w->c;
    uint64_t h[KVP_DRAFT_MAX + 1];
    kvp_spec_histogram(c, h);
    printf("{\"method\":\"%s\",\"draft_len\":%u,\"steps\":%llu,\"calls\":%llu,\"verify_steps\":%llu,\"drafted\":%llu,"
           "\"accepted\":%llu",
           w->m->name, w->k, (unsigned long long)c->steps, (unsigned long long)c->calls,
           (unsigned long long)c->verify_steps, (unsigned long long)drafted(c), (unsigned long long)c->accepted);
    json_ratio("acceptance", c->accepted, drafted(c));
    json_ratio("mean_accepted", c->accepted, c->verify_steps);
    printf(",\"tokens_per_step\":%.4f,\"histogram\":[", kvp_spec_tokens_per_step(c));
    for (uint32_t m = 0; m <= c->k; m++)
        printf("%s%llu", m ? "," : "", (unsigned long long)h[m]);
    printf("],\"t_step_ms\":[");
    for (uint32_t j = 1; j <= c->k + 1; j++)
        printf("%s%.4f", j > 1 ? "," : "", w->t.step[j] * 1e3);
    printf("],\"t_decode_ms\":%.4f,\"t_verify_ms\":%.4f,\"t_draft_ms\":%.4f,\"t_prime_ms\":%.4f,"
           "\"t_draft_in_run_ms\":%.4f,\"model_seconds\":%.4f,\"gen_seconds\":%.4f,\"predicted_speedup\":%.4f,"
           "\"measured_speedup\":%.4f,\"e2e_speedup\":%.4f,\"same\":%llu,\"differ\":%llu,\"options\":",
           w->t.step[1] * 1e3, w->t.step[c->k + 1] * 1e3, w->t.call * 1e3, w->t.prime * 1e3,
           c->calls ? w->call_seconds / (double)c->calls * 1e3 : 0,
           kvp_spec_seconds(c, &w->t), w->gen_seconds, w->predicted, w->measured, w->e2e, (unsigned long long)w->same,
           (unsigned long long)w->differ);
    /* any row runs from its options, not the recommended one alone */
    char *opts = row_options(w);
    kvp_cli_json_str(stdout, opts, strlen(opts));
    free(opts);
    printf("}\n");
}

static void print_text(const profile *p)
{
    const row *base = &p->rows[0];
    printf("profile: %s, %llu requests one at a time, %llu tokens after their first; decode steps see %u tokens of "
           "context on average (prompts %u)\n",
           p->o->file, (unsigned long long)p->n_req, (unsigned long long)base->gen_tokens, p->ctx, p->prompt);
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
    char *opts = row_options(w);
    if (json) {
        printf("{\"recommendation\":\"%s\",\"draft_len\":%u,\"predicted_speedup\":%.4f,\"measured_speedup\":%.4f,"
               "\"options\":", w->m->name, w->k, w->predicted, w->measured);
        kvp_cli_json_str(stdout, opts, strlen(opts));
        printf("}\n");
    } else {
        printf("recommendation: specdec %s (predicted %.2fx, measured %.2fx)\n", opts, w->predicted, w->measured);
    }
    free(opts);
}

/* ---- the methods ---- */

/* Medusa heads: they read the target's output head, so each run's engine
 * is theirs (bind). */
typedef struct heads_method {
    kvp_heads h;
    kvp_heads_drafter d;     /* made at the first bind (it needs an engine) */
    int ready;
} heads_method;

static int bind_heads(const kvp_spec_method *m, kvp_engine *target, kvp_kvcache *kc, kvp_err *err)
{
    (void)kc;
    heads_method *hm = m->time_ctx;
    if (hm->ready) {
        hm->d.e = target;
        return 0;
    }
    int rc = kvp_heads_drafter_init(&hm->d, &hm->h, target, err);
    hm->ready = rc == 0;
    return rc;
}

/* The heads' call for one request of k guesses, on a hidden state of
 * zeros (what it costs does not depend on the values); no request state,
 * so no prime. */
static int time_heads(const kvp_spec_method *m, const uint32_t *tokens, uint32_t n_prompt, uint32_t n, uint32_t k,
                      uint32_t reps, kvp_spec_costs *t, kvp_err *err)
{
    (void)tokens, (void)n_prompt, (void)n;
    heads_method *hm = m->time_ctx;
    float *hidden = calloc(hm->h.n_embd, sizeof *hidden);
    if (!hidden)
        return kvp_err_set(err, KVP_ENOMEM, "profile: out of memory");
    const float *const rows[1] = {hidden};
    uint32_t out[KVP_DRAFT_BRANCHES * KVP_DRAFT_MAX], len[KVP_DRAFT_BRANCHES], n_branch;
    double v[TIMING_REPS];
    if (reps > TIMING_REPS)
        reps = TIMING_REPS;
    for (uint32_t i = 0; i < reps; i++) {
        double t0 = kvp_gen_now();
        m->drafter.draft_hidden(m->drafter.ctx, 1, rows, &k, 1, out, len, &n_branch);
        v[i] = kvp_gen_now() - t0;
    }
    free(hidden);
    t->call = kvp_spec_median(v, reps);
    t->prime = 0;
    return hm->d.failed ? kvp_err_set(err, hm->d.err.code, "%s", hm->d.err.msg) : 0;
}

/* Self-speculation, as specdec runs it alone: the model's first layers
 * drafting in the target's own cache (draftmodel.h, on_target), so each
 * run's cache gets an engine of its own (bind). */
typedef struct skip_method {
    kvp_model *first;        /* the model's first layers */
    kvp_backend *be;         /* the target's */
    kvp_engine *target;      /* this run's, and its cache */
    kvp_kvcache *kc;
    kvp_draft_model dm;      /* dm.e: the first layers' engine over kc */
    uint32_t chunk;
} skip_method;

static int bind_skip(const kvp_spec_method *m, kvp_engine *target, kvp_kvcache *kc, kvp_err *err)
{
    skip_method *sm = m->time_ctx;
    kvp_engine *e;
    int rc = kvp_engine_create_first(&e, sm->first, sm->be, kc, err);
    if (rc == 0 && !sm->dm.rows && (rc = kvp_draft_model_init(&sm->dm, e, kc, err)) == 0)
        sm->dm.chunk = sm->chunk, sm->dm.on_target = 1;
    if (rc < 0) {
        kvp_engine_free(e);
        return rc;
    }
    if (sm->dm.e != e)
        kvp_engine_free(sm->dm.e);
    sm->dm.e = e, sm->dm.kc = kc, sm->target = target, sm->kc = kc;
    return 0;
}

/* A draft call on a sequence of the target's cache holding tokens[0..n-1)
 * (fed by the target, untimed), a token further each call: no prompt to
 * prime, nothing fed twice. */
static int time_skip(const kvp_spec_method *m, const uint32_t *tokens, uint32_t n_prompt, uint32_t n, uint32_t k,
                     uint32_t reps, kvp_spec_costs *t, kvp_err *err)
{
    (void)n_prompt;
    skip_method *sm = m->time_ctx;
    uint32_t out[KVP_DRAFT_MAX];
    double v[TIMING_REPS];
    if (reps > TIMING_REPS)
        reps = TIMING_REPS;
    int rc, seq = kvp_kvcache_seq_new(sm->kc, err);
    if (seq < 0)
        return seq;
    void *state = (void *)(intptr_t)(seq + 1);
    rc = n > 1 ? kvp_engine_prefill(sm->target, seq, tokens, n - 1, sm->chunk, NULL, err) : 0;
    for (uint32_t i = 0; i < reps && rc == 0; i++) {
        double t0 = kvp_gen_now();
        m->drafter.draft(m->drafter.ctx, &state, tokens, n + i, k, out);
        v[i] = kvp_gen_now() - t0;
        rc = kvp_engine_prefill(sm->target, seq, tokens + n - 1 + i, 1, sm->chunk, NULL, err);
    }
    kvp_kvcache_seq_free(sm->kc, seq);
    if (rc < 0)
        return rc;
    t->call = kvp_spec_median(v, reps);
    t->prime = 0;
    return 0;
}

typedef struct method_set {
    kvp_spec_method m[METHODS_MAX];
    uint32_t n;
    char *options[METHODS_MAX];      /* each one's, malloc'd */
    kvp_ngram_drafter ngram;
    kvp_run draft_run;               /* a draft model */
    kvp_draft_model draft_dm;
    heads_method heads;
    skip_method skip;
} method_set;

/* The next method, named, with the options that pick it (printf's fmt). */
__attribute__((format(printf, 3, 4))) static kvp_spec_method *add_method(method_set *ms, const char *name,
                                                                         const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = vasprintf(&ms->options[ms->n], fmt, ap);
    va_end(ap);
    if (rc < 0)
        kvp_cli_die("out of memory");
    kvp_spec_method *m = &ms->m[ms->n];
    *m = (kvp_spec_method){.name = name, .options = ms->options[ms->n++]};
    return m;
}

/* A path as one shell word (kvp_cli_sh_quote): the options name it so
 * they can be pasted into a command line whatever its characters. */
static char *sh_quote(const char *path)
{
    char *q = kvp_cli_sh_quote(path);
    if (!q)
        kvp_cli_die("out of memory");
    return q;
}

/* A model drafter on dr, as specdec's --method draft and layerskip make it. */
static void set_model_drafter(kvp_spec_method *m, kvp_run *dr, kvp_draft_model *dm, uint32_t chunk)
{
    kvp_err err = {0};
    if (kvp_draft_model_init(dm, dr->engine, dr->kc, &err) < 0)
        kvp_cli_die_err(&err);
    dm->chunk = chunk;
    m->drafter = (kvp_drafter){.ctx = dm, .draft = kvp_draft_model_draft, .release = kvp_draft_model_release};
}

/* ngram always; draft with --draft; layerskip.  The drafters' caches keep
 * no freed prefix: every run feeds them its prompts anew, as the first. */
static void open_methods(method_set *ms, const kvp_run *r, const kvp_runopts *o, const kvp_spec_profile_opts *po)
{
    kvp_err err = {0};
    kvp_runopts dro = *o;
    dro.kv.no_cache = 1;
    ms->ngram = po->ngram;
    add_method(ms, "ngram", "--method ngram --ngram-min %u --ngram-max %u", po->ngram.min_n, po->ngram.max_n)
        ->drafter = (kvp_drafter){.ctx = &ms->ngram, .draft = kvp_ngram_draft, .cheap = 1};
    if (po->draft) {
        if (kvp_run_open_draft(&ms->draft_run, r, &dro, po->draft, &err) < 0)
            kvp_cli_die_err(&err);
        char *path = sh_quote(po->draft);
        set_model_drafter(add_method(ms, "draft", "--method draft --draft %s", path), &ms->draft_run,
                          &ms->draft_dm, o->chunk);
        free(path);
    }
    uint32_t nl = kvp_run_loaded(r)->cfg.n_layer, keep = po->draft_layers ? po->draft_layers : (nl + 1) / 2;
    if (keep > nl)
        kvp_cli_die("--draft-layers %u: %s has %u layers", keep, o->model, nl);
    skip_method *sm = &ms->skip;
    if (kvp_model_first_layers(&sm->first, kvp_run_loaded(r), keep, &err) < 0)
        kvp_cli_die_err(&err);
    sm->be = r->be, sm->chunk = o->chunk;
    kvp_spec_method *sk = add_method(ms, "layerskip", "--method layerskip --draft-layers %u", keep);
    sk->drafter = (kvp_drafter){.ctx = &sm->dm, .draft = kvp_draft_model_draft, .on_target_cache = 1};
    sk->time_draft = time_skip;
    sk->time_ctx = sm;
    sk->bind = bind_skip;
    if (po->heads) {
        const kvp_model *tm = kvp_run_loaded(r);
        if (kvp_heads_read(&ms->heads.h, po->heads, &err) < 0 ||
            kvp_heads_check_model(&ms->heads.h, po->heads, tm->fingerprint, tm->cfg.n_embd, &err) < 0)
            kvp_cli_die_err(&err);
        char *path = sh_quote(po->heads);
        kvp_spec_method *m = add_method(ms, "heads", "--method heads --heads %s", path);
        free(path);
        m->drafter = (kvp_drafter){.ctx = &ms->heads.d, .draft_hidden = kvp_heads_draft};
        m->time_draft = time_heads;
        m->time_ctx = &ms->heads;
        m->bind = bind_heads;
    }
}

static void close_methods(method_set *ms)
{
    if (ms->draft_run.engine) {
        kvp_draft_model_free(&ms->draft_dm);
        kvp_run_close_draft(&ms->draft_run);
    }
    kvp_draft_model_free(&ms->skip.dm);
    kvp_engine_free(ms->skip.dm.e);
    kvp_model_free(ms->skip.first);
    for (uint32_t i = 0; i < ms->n; i++)
        free(ms->options[i]);
    kvp_heads_drafter_free(&ms->heads.d);
    kvp_heads_free(&ms->heads.h);
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
    prompts_copy pc;
    prompts_copy_open(&pc, o); /* first: a missing file fails before the model loads */
    kvp_run r;
    if (kvp_run_open(&r, o, &err) < 0)
        kvp_cli_die_err(&err);
    method_set ms = {0};
    open_methods(&ms, &r, o, po);
    profile p = {.o = o, .pc = &pc, .r = &r, .n_rows = 1 + ms.n * n_k};
    p.rows = calloc(p.n_rows, sizeof *p.rows);
    if (!p.rows)
        kvp_cli_die("out of memory");
    for (uint32_t i = 0; i < ms.n; i++)
        for (uint32_t j = 0; j < n_k; j++)
            p.rows[1 + i * n_k + j] = (row){.m = &ms.m[i], .k = ks[j]};
    run_reference(&p);
    for (uint32_t i = 0; i < p.n_rows; i++) {
        p.rows[i].gen = malloc(p.n_req * sizeof *p.rows[i].gen);
        p.rows[i].wall = malloc(p.n_req * sizeof *p.rows[i].wall);
        if (!p.rows[i].gen || !p.rows[i].wall)
            kvp_cli_die("out of memory");
    }
    /* Request by request, plain decoding then every row: each row's time
     * for a request is taken within seconds of plain decoding's, so the
     * machine's speed drifting over the profile (other work starting or
     * ending) does not skew a row against its reference.  Then again,
     * the fastest of each kept: a busy moment slows one run. */
    for (uint32_t rep = 0, done = 0; rep < reps; rep++)
        for (uint32_t j = 0; j < p.n_req; j++)
            for (uint32_t i = 0; i < p.n_rows; i++, done++) {
                progress(done, reps * p.n_req * p.n_rows, &p.rows[i]);
                run_request(&p, &p.rows[i], j, rep == 0);
                if (j + 1 == p.n_req)
                    time_costs(&p, &p.rows[i], rep == 0);
                close_engine(&p);
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
    for (uint32_t i = 0; i < p.n_rows; i++) {
        free(p.rows[i].gen);
        free(p.rows[i].wall);
    }
    free(p.rows);
    free(p.probe);
    run_out_free(&p.ref);
    close_methods(&ms);
    kvp_run_close(&r);
    prompts_copy_close(&pc);
    int rc = kvp_cli_close_stdout();
    if (differ) {
        kvp_cli_warn("%llu speculative outputs differ from plain decoding's: a bug, please report it",
                     (unsigned long long)differ);
        return KVP_EXIT_FAIL;
    }
    return rc;
}
