/* jobsrc.c - a batch job's requests (see jobsrc.h). */
#include "jobsrc.h"
#include "debug.h"
#include "sample.h"
#include "seqio.h"

#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A prompt read and not yet taken: its ids when given (-p, --tokens),
 * else NULL until it is taken and tokenized. */
typedef struct pending {
    kvp_prompt p;
    uint32_t *ids;
    uint32_t n_ids;
    uint64_t line;             /* in the prompts file */
    double read_at;            /* when it was read (monotonic seconds) */
} pending;

struct kvp_jobsrc {
    const kvp_runopts *o;
    const kvp_tokenizer *tok;
    uint32_t n_ctx;            /* the model's trained context (0: not known) */
    const char *n_ctx_from;    /* what set n_ctx, for messages */
    /* prompts: -p and --tokens given, -f read as the queue drains */
    int from_prompts;
    kvp_prompts_reader *pr;
    pending pp[1];             /* the prompt read and not yet taken (it waits for its arrival) */
    uint32_t n_pp;
    int prompts_end;
    /* a stream: sequences read as they arrive */
    kvp_in in;
    int in_open;
    kvp_reader *rd;
    kvp_seqio_reader *sr;
    kvp_kvcache *kc;
    kvp_seqio_seq pend[1];     /* read and not yet taken: the first, at open (its block size makes
                                * the cache), or one not yet due (--rate) */
    uint32_t *pend_tok[1];
    uint32_t n_pend;
    int stream_end;
    uint64_t n, next;
    /* arrivals (rate 0: all at once) */
    double rate, shape;
    uint64_t rng[2];
    double next_arrival;     /* monotonic seconds; 0 until the first request */
    double pend_read_at;     /* when the held sequence (pend) was read */
    double t_open;           /* when the job started: without --rate, every request of a
                              * prompts file (or -p) arrived then, all at once */
    int all_at_open;
    uint64_t salt;           /* --cache-salt */
    /* the filter */
    uint32_t shard_k, shard_n;
    const kvp_idset *done;
    uint64_t skipped;
};

const char *kvp_request_id(const kvp_gen_seq *s, char buf[KVP_REQUEST_ID_SIZE])
{
    if (s->rec.label[0])
        return kvp_unicode_escape(buf, KVP_REQUEST_ID_SIZE, s->rec.label, 0);
    snprintf(buf, KVP_REQUEST_ID_SIZE, "%" PRIu64, s->rec.id);
    return buf;
}

/* Why request i (label, or its index) is left out: 1 another shard's, 2
 * done before (in done); 0 kept. */
static int left_out(uint64_t i, const char *label, uint32_t shard_k, uint32_t shard_n, const kvp_idset *done)
{
    if (shard_n > 1 && i % shard_n != shard_k)
        return 1;
    if (done) {
        char buf[32];
        const char *id = label && label[0] ? label : (snprintf(buf, sizeof buf, "%" PRIu64, i), buf);
        if (kvp_idset_has(done, id, strlen(id)))
            return 2;
    }
    return 0;
}

/* Whether request i passes the filter. */
static int keep(kvp_jobsrc *js, uint64_t i, const char *label)
{
    int why = left_out(i, label, js->shard_k, js->shard_n, js->done);
    js->skipped += why == 2;
    return why == 0;
}

int kvp_jobsrc_count_pending(const char *path, uint32_t shard_k, uint32_t shard_n, const kvp_idset *done,
                             uint64_t *n_kept)
{
    *n_kept = 0;
    kvp_prompts set;
    kvp_prompts_init(&set); /* ids only: no chat rendering needed */
    kvp_prompts_reader *rd = NULL;
    kvp_err err = {0};
    if (kvp_prompts_reader_open(&rd, path, &set, &err) < 0)
        return -1;
    int rc;
    kvp_prompt p;
    for (uint64_t i = 0; (rc = kvp_prompts_reader_next(rd, &p, &err)) > 0; i++) {
        *n_kept += left_out(i, p.label, shard_k, shard_n, done) == 0;
        kvp_prompt_free(&p);
    }
    kvp_prompts_reader_free(rd);
    kvp_prompts_free(&set);
    return rc < 0 ? -1 : 0;
}

/* ---- arrivals ---- */

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* Uniform in (0, 1) from xoroshiro128+. */
static double uniform(uint64_t s[2])
{
    uint64_t a = s[0], b = s[1], r = a + b;
    b ^= a;
    s[0] = rotl(a, 24) ^ b ^ (b << 16);
    s[1] = rotl(b, 37);
    return ((double)(r >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static double normal(uint64_t s[2])
{
    return sqrt(-2.0 * log(uniform(s))) * cos(6.283185307179586 * uniform(s));
}

/* Gamma(shape k, scale 1) by Marsaglia and Tsang; k < 1 boosted by U^(1/k). */
static double gamma_draw(uint64_t s[2], double k)
{
    if (k < 1)
        return gamma_draw(s, k + 1) * pow(uniform(s), 1.0 / k);
    double d = k - 1.0 / 3, c = 1.0 / sqrt(9 * d);
    for (;;) {
        double x = normal(s), v = 1 + c * x;
        if (v <= 0)
            continue;
        v = v * v * v;
        double u = uniform(s);
        if (log(u) < 0.5 * x * x + d - d * v + d * log(v))
            return d * v;
    }
}

void kvp_jobsrc_arrivals(kvp_jobsrc *js, double rate, double burstiness, uint64_t seed)
{
    js->rate = rate;
    js->shape = burstiness > 0 ? burstiness : 1;
    js->rng[0] = seed * 0x9e3779b97f4a7c15ULL + 0x243f6a8885a308d3ULL;
    js->rng[1] = (seed ^ 0x13198a2e03707344ULL) * 0xbf58476d1ce4e5b9ULL | 1;
}

static void sleep_until(double t)
{
    double now = kvp_gen_now();
    if (t <= now)
        return;
    double d = t - now;
    struct timespec ts = {.tv_sec = (time_t)d, .tv_nsec = (long)((d - floor(d)) * 1e9)};
    nanosleep(&ts, NULL); /* a signal cuts it short: the caller looks again */
}

/* 1 when the next request, read at read_at, has arrived, else 0; with
 * block, waits for it first.  Under --rate *t is its arrival: the later of
 * its time in the schedule and the time it was read (a line a pipe gave
 * late did not exist at its scheduled time: TTFT counts from when it could
 * have been served); the schedule itself never moves.  Else *t is 0. */
static int arrived(kvp_jobsrc *js, int block, double read_at, double *t)
{
    *t = 0;
    if (js->rate <= 0)
        return 1;
    if (js->next_arrival == 0)
        js->next_arrival = kvp_gen_now();
    if (block)
        sleep_until(js->next_arrival);
    if (kvp_gen_now() < js->next_arrival)
        return 0;
    *t = js->next_arrival > read_at ? js->next_arrival : read_at;
    js->next_arrival += gamma_draw(js->rng, js->shape) / (js->rate * js->shape);
    return 1;
}

static kvp_gen_opts gen_opts(const kvp_runopts *o)
{
    return (kvp_gen_opts){.stop = o->stop, .n_stop = o->n_stop, .ignore_eos = o->ignore_eos};
}

/* The model's trained context bounds a sequence of n_have tokens: its
 * generation ends there (finish_reason length), as vLLM's max_model_len
 * does; positions past it were never trained. */
static void cap_to_context(const kvp_jobsrc *js, kvp_request *r, uint32_t n_have)
{
    uint32_t room = js->n_ctx > n_have ? js->n_ctx - n_have : 0;
    if (js->n_ctx && r->g.rec.sampling.max_tokens > room)
        r->g.rec.sampling.max_tokens = room;
}

/* A prompt of n tokens that no sequence may hold (the model's context, or
 * --max-model-len) is refused, whichever way it came (what: "prompt", or
 * "sequence" of a stream), as vLLM refuses one over max_model_len: 1 with
 * the message set (the caller says where), else 0. */
static int too_long(const kvp_jobsrc *js, const char *what, uint64_t i, const char *label, uint32_t n,
                    kvp_err *err)
{
    if (!js->n_ctx || n <= js->n_ctx)
        return 0;
    /* a prompts file's error is prefixed with its line, which says where:
     * there the id alone (a count beside it would read as the id); a
     * stream's sequence by its number in the stream and its id quoted, as
     * kvdump lists it (seq 1 "b") and the stream reader names it; -p or
     * --tokens, one prompt, as "the prompt" (its id, 0, is no count) */
    char which[48] = "", id[KVP_UNICODE_ESCAPED_SIZE(KVP_NAME_MAX)];
    int seq = strcmp(what, "sequence") == 0;
    if (seq)
        snprintf(which, sizeof which, " %" PRIu64, i);
    kvp_err_set(err, KVP_EINVAL, "%s%s%s%s%s%s%s is %u tokens, more than a sequence may hold (%u: %s)",
                !seq && !js->o->file ? "the " : "", what, which, label[0] ? " " : "", seq && label[0] ? "\"" : "",
                kvp_unicode_escape(id, sizeof id, label, seq ? '"' : 0), seq && label[0] ? "\"" : "", n, js->n_ctx,
                js->n_ctx_from);
    return 1;
}

/* Read one more prompt of the file into the read-ahead (empty): 1, 0 at its end,
 * or a code naming the file and line. */
static int read_prompt(kvp_jobsrc *js, kvp_err *err)
{
    pending *q = &js->pp[js->n_pp];
    memset(q, 0, sizeof *q);
    int got = js->prompts_end ? 0 : kvp_prompts_reader_next(js->pr, &q->p, err);
    if (got <= 0) {
        js->prompts_end = got == 0;
        return got;
    }
    q->line = kvp_prompts_reader_line(js->pr);
    q->read_at = kvp_gen_now();
    js->n_pp++;
    js->n++;
    return 1;
}

/* Drop the prompt read ahead. */
static void pop_prompt(kvp_jobsrc *js)
{
    kvp_prompt_free(&js->pp[0].p);
    free(js->pp[0].ids);
    js->n_pp = 0;
}

/* Request i of prompt q, tokenized now if it is not yet. */
static int prompt_request(kvp_jobsrc *js, pending *q, uint64_t i, kvp_request **out, kvp_err *err)
{
    const char *label = q->p.label;
    char id[KVP_UNICODE_ESCAPED_SIZE(KVP_NAME_MAX)]; /* label as a message shows it */
    kvp_unicode_escape(id, sizeof id, label, 0);
    if (!q->ids) {
        int32_t *t;
        size_t n;
        int rc = kvp_prompt_encode(&q->p, js->tok, &t, &n, err);
        if (rc < 0)
            return kvp_err_prefix(err, "%s:%" PRIu64, js->o->file, q->line);
        q->ids = (uint32_t *)t; /* ids are < n_vocab: same bits */
        if (n == 0 || n > UINT32_MAX)
            /* the line says where; the id, not a count, says which (as prefill's) */
            return kvp_err_set(err, KVP_EINVAL, "%s:%" PRIu64 ": %s%s is %s", js->o->file, q->line,
                               label[0] ? "prompt " : "the prompt", id, n ? "too long" : "empty");
        q->n_ids = (uint32_t)n;
    }
    if (too_long(js, "prompt", i, label, q->n_ids, err))
        return js->o->file ? kvp_err_prefix(err, "%s:%" PRIu64, js->o->file, q->line) : KVP_EINVAL;
    const kvp_prompt_params *pp = &q->p.params;
    kvp_sampling smp;
    if (kvp_runopts_request_sampling(js->o, pp, i, &smp, err) < 0)
        return kvp_err_prefix(err, "request %s", id);
    kvp_request *r = kvp_request_new(js->tok, i, label, q->ids, q->n_ids, &smp);
    if (!r)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    if (q->p.label_int) /* printed back as the integer, and --kv-out keeps it so */
        r->g.rec.flags |= KVP_SEQ_LABEL_INT;
    r->g.rec.flags |= kvp_runopts_own_flags(pp->set); /* --kv-out's record says what the line set */
    cap_to_context(js, r, q->n_ids);
    r->opts = gen_opts(js->o);
    r->salt = pp->set & KVP_PARAM_CACHE_SALT ? pp->cache_salt : js->salt;
    if (pp->set & KVP_PARAM_CACHE_SALT) /* the request's own: --kv-out carries it */
        r->g.rec.cache_salt = pp->cache_salt;
    if (pp->set & KVP_PARAM_STOP) { /* the request takes the line's stop strings */
        r->opts.stop = (const char *const *)pp->stop;
        r->opts.n_stop = pp->n_stop;
        r->stop_owned = q->p.params.stop;
        q->p.params.stop = NULL;
        q->p.params.n_stop = 0;
    }
    *out = r;
    return 1;
}

static int prompt_next(kvp_jobsrc *js, int block, kvp_request **out, kvp_err *err)
{
    for (;;) {
        if (js->n_pp == 0) {
            if (js->prompts_end || (!block && !kvp_prompts_reader_ready(js->pr)))
                return js->prompts_end ? KVP_BATCH_END : 0;
            int got = read_prompt(js, err);
            if (got <= 0)
                return got < 0 ? got : KVP_BATCH_END;
        }
        uint64_t i = js->next;
        if (!keep(js, i, js->pp[0].p.label)) {
            pop_prompt(js);
            js->next++;
            continue;
        }
        double t_arrival;
        if (!arrived(js, block, js->pp[0].read_at, &t_arrival))
            return 0;
        if (t_arrival == 0) /* a pipe's line arrives as it is read */
            t_arrival = js->all_at_open ? js->t_open : kvp_gen_now();
        js->next++;
        int rc = prompt_request(js, &js->pp[0], i, out, err);
        pop_prompt(js);
        if (rc == 1)
            (*out)->g.t_start = t_arrival;
        return rc;
    }
}

/* Whether reading the stream now would wait: a pipe with nothing in it.
 * (Bytes the reader has buffered are not seen: the next wait reads them.) */
static int would_block(const kvp_jobsrc *js)
{
    if (js->in.map || js->n_pend)
        return 0;
    struct pollfd p = {.fd = js->in.fd, .events = POLLIN};
    return poll(&p, 1, 0) == 0;
}

static int read_one(kvp_jobsrc *js, kvp_seqio_seq *q, uint32_t **tok, kvp_err *err);

/* The next sequence of the stream: the one read and not taken, else read
 * now.  1 with *q and *tok (malloc'd copy of its tokens), 0 at the end. */
static int stream_read(kvp_jobsrc *js, kvp_seqio_seq *q, uint32_t **tok, kvp_err *err)
{
    if (js->n_pend) {
        *q = js->pend[0];
        *tok = js->pend_tok[0];
        js->n_pend = 0;
        return 1;
    }
    int got = read_one(js, q, tok, err);
    js->pend_read_at = kvp_gen_now(); /* q's, kept with it if it is held */
    return got;
}

/* A stream sequence's stop strings (the reader hands them over) are the
 * job source's until a request takes them (stop_owned) or the sequence is
 * dropped. */
static void drop_stops(kvp_seqio_seq *q)
{
    kvp_seq_stops_free((char **)q->stop, q->n_stop);
    q->stop = NULL;
    q->n_stop = 0;
}

/* Would a token drawn with b differ in law from one drawn with a (the
 * warping and the generator's seed; max_tokens is not a draw's). */
static int draws_differ(const kvp_sampling *a, const kvp_sampling *b)
{
    return a->temperature != b->temperature || a->top_k != b->top_k || a->top_p != b->top_p ||
           a->min_p != b->min_p || a->repeat_penalty != b->repeat_penalty || a->seed != b->seed;
}

/* A prefilled sequence whose first token prefill drew with other sampling
 * options than decode's for it (decode's --temperature, --seed, ... over
 * values the request left to the defaults): that token is dropped and drawn
 * again, as decode -f would draw it, from the generator seeded afresh and
 * the last prompt token's logits (its K/V recomputed: the request starts
 * as a prompt whose other tokens the stream holds, kv_adopt). */
static void redraw_first(kvp_request *r)
{
    kvp_sample_seed(&r->g.rec.sampling, (r->g.rec.flags & KVP_SEQ_OWN_SEED) ? 0 : r->g.rec.id);
    r->g.rec.state = KVP_SEQ_RUNNING;
    r->g.rec.next_token = -1;
}

/* One sequence from the stream itself. */
static int read_one(kvp_jobsrc *js, kvp_seqio_seq *q, uint32_t **tok, kvp_err *err)
{
    if (js->stream_end)
        return 0;
    const uint32_t *t;
    int got = kvp_seqio_reader_next(js->sr, q, &t, err);
    if (got <= 0) {
        js->stream_end = got == 0;
        return got;
    }
    js->n++;
    *tok = malloc(((size_t)q->rec.n_tokens + 1) * sizeof **tok);
    if (!*tok) {
        drop_stops(q);
        return kvp_err_set(err, KVP_ENOMEM, "out of memory for %u tokens", q->rec.n_tokens);
    }
    memcpy(*tok, t, (size_t)q->rec.n_tokens * sizeof **tok);
    return 1;
}

/* A stream's sequence becomes a request whose tokens are the stream's; the
 * blocks the stream carried sit in a cache sequence (its holder) until the
 * request starts and shares them.  Through a pipe, its arrival, when the
 * stream tells it, is the request's (so TTFT counts prefill too). */
static int stream_next(kvp_jobsrc *js, int block, kvp_request **out, kvp_err *err)
{
    for (;;) {
        if (!block && would_block(js))
            return 0;
        kvp_seqio_seq q;
        uint32_t *tok = NULL;
        int got = stream_read(js, &q, &tok, err);
        if (got < 0)
            return got;
        if (got == 0)
            return KVP_BATCH_END;
        uint64_t idx = js->next++;
        if (!keep(js, idx, q.rec.label)) {
            kvp_kvcache_seq_free(js->kc, q.handle);
            free(tok);
            drop_stops(&q);
            continue;
        }
        if (too_long(js, "sequence", q.rec.id, q.rec.label, q.rec.n_prompt, err)) {
            kvp_kvcache_seq_free(js->kc, q.handle);
            free(tok);
            drop_stops(&q);
            return kvp_err_prefix(err, "%s", js->in.name);
        }
        double t_arrival;
        if (!arrived(js, block, js->pend_read_at, &t_arrival)) {
            /* not yet due: kept until it is (stream_read just took the one held) */
            js->pend[0] = q;
            js->pend_tok[0] = tok;
            js->n_pend = 1;
            js->next--;
            return 0;
        }
        /* through a pipe, the request arrived when prefill took it (TTFT
         * counts the prefill, as disaggregated serving does); a stored
         * file's requests arrive when the job starts, as a prompts file's
         * (a file prefilled last night is not a request waiting since) */
        if (t_arrival == 0)
            t_arrival = js->in.size_known    ? js->t_open
                        : q.rec.arrival_ns ? kvp_gen_mono_of_wall(q.rec.arrival_ns)
                                           : kvp_gen_now();
        kvp_request *r = kvp_request_new(js->tok, q.rec.id, q.rec.label, tok, q.rec.n_tokens, &q.rec.sampling);
        free(tok);
        if (!r) {
            kvp_kvcache_seq_free(js->kc, q.handle);
            drop_stops(&q);
            return kvp_err_set(err, KVP_ENOMEM, "out of memory");
        }
        r->holder = q.handle;
        r->salt = q.rec.cache_salt ? q.rec.cache_salt : js->salt; /* the request's own, as a prompts line's */
        r->g.rec = q.rec;
        r->n_prompt = q.rec.n_prompt;
        /* the text its earlier run showed (its tokens past the prompt, and
         * a running sequence's next token) may end inside a character,
         * held back there: its continuation writes it whole */
        uint32_t n_shown = q.rec.n_tokens > q.rec.n_prompt ? q.rec.n_tokens - q.rec.n_prompt : 0;
        int rc_text = kvp_detok_resume(&r->g.dt, r->tokens + q.rec.n_tokens - n_shown, n_shown, err);
        if (rc_text == 0 && q.rec.state != KVP_SEQ_PREFILLED && q.rec.next_token >= 0) {
            uint32_t nt = (uint32_t)q.rec.next_token;
            rc_text = kvp_detok_resume(&r->g.dt, &nt, 1, err);
        }
        if (rc_text < 0) {
            kvp_kvcache_seq_free(js->kc, q.handle);
            drop_stops(&q);
            kvp_request_free(r);
            return rc_text;
        }
        r->g.t_start = t_arrival; /* before the prefill's token is shown: TTFT >= 0 */
        r->opts = gen_opts(js->o);
        /* the record's stop strings when the request set them (none, too)
         * or --stop gives none; else decode's */
        if ((q.rec.flags & KVP_SEQ_OWN_STOP) || !js->o->n_stop) {
            r->opts.stop = q.n_stop ? q.stop : NULL;
            r->opts.n_stop = q.n_stop;
            r->stop_owned = (char **)q.stop;
        } else {
            drop_stops(&q);
        }
        /* a saved sequence continued takes -n over its request's own
         * max_tokens (a new request); --kv-out saves it without the bit */
        int prefilled = q.rec.state == KVP_SEQ_PREFILLED;
        kvp_sampling was = r->g.rec.sampling;
        kvp_runopts_apply_record(js->o, &r->g.rec);
        cap_to_context(js, r, q.rec.n_tokens);
        int rc = kvp_sample_check(&r->g.rec.sampling, err);
        /* a sequence cut by its budget continues; one that met a stop does not */
        int over = q.rec.next_token < 0 ||
                   (q.rec.state == KVP_SEQ_FINISHED && q.rec.finish_reason != KVP_FINISH_LENGTH);
        /* a budget of 0 (max_tokens 0, or no room left in the context)
         * shows none of it: prefill's pending token stays pending, as
         * decode -f gives no token for such a request */
        int none = !over && prefilled && kvp_gen_budget(&r->g, &r->opts) == 0;
        if (rc == 0 && !over && !none && prefilled && draws_differ(&was, &r->g.rec.sampling))
            redraw_first(r);
        else if (rc == 0 && !over && !none)
            rc = kvp_request_feed(r, prefilled, err);
        else if (rc == 0 && none)
            r->g.rec.finish_reason = KVP_FINISH_LENGTH, r->unshown = 1, kvp_request_end(r);
        else if (rc == 0)
            kvp_request_end(r);
        if (rc < 0) {
            kvp_request_free(r);
            return rc;
        }
        *out = r;
        return 1;
    }
}

static int next(void *ctx, int block, kvp_request **out, kvp_err *err)
{
    kvp_jobsrc *js = ctx;
    return js->from_prompts ? prompt_next(js, block, out, err) : stream_next(js, block, out, err);
}

/* -f: the reader, nothing read yet (on a pipe the first line may be a
 * while coming, and the run starts on it as soon as it is whole); -p,
 * --tokens: the one prompt, tokenized. */
static int open_prompts(kvp_jobsrc *js, kvp_run *r, const kvp_runopts *o, kvp_err *err)
{
    int rc = 0;
    if (o->file && !o->prompt && !o->tokens) {
        kvp_prompts set;
        kvp_run_prompt_settings(r, o, &set);
        return kvp_prompts_reader_open(&js->pr, o->file, &set, err);
    }
    kvp_prompts ps;
    uint32_t **ids, *lens;
    rc = kvp_run_prompts(r, o, &ps, &ids, &lens, err);
    KVP_ASSERT(rc < 0 || ps.n == 1);
    for (size_t i = 0; i < ps.n; i++) {
        if (rc == 0 && js->n_pp < 1) {
            js->pp[js->n_pp++] = (pending){.p = ps.p[i], .ids = ids[i], .n_ids = lens[i]};
            js->n++;
            memset(&ps.p[i], 0, sizeof ps.p[i]); /* moved */
        } else if (ids) {
            free(ids[i]);
        }
    }
    js->prompts_end = 1;
    free(ids);
    free(lens);
    kvp_prompts_free(&ps);
    return rc;
}

int kvp_jobsrc_open(kvp_jobsrc **out, kvp_run *r, const kvp_runopts *o, const char *kv_in, uint64_t salt,
                    kvp_err *err)
{
    *out = NULL;
    kvp_jobsrc *js = calloc(1, sizeof *js);
    if (!js)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    js->o = o;
    js->tok = r->tok;
    const kvp_config *cfg = &kvp_run_loaded(r)->cfg;
    js->n_ctx = kvp_config_ctx_limit(cfg);
    if (o->max_model_len && js->n_ctx && o->max_model_len > js->n_ctx) {
        uint32_t n_ctx = js->n_ctx;
        free(js);
        if (n_ctx != cfg->n_ctx)
            return kvp_err_set(err, KVP_EINVAL, "--max-model-len %u is above %s's sliding window of %u tokens, "
                               "which the engine does not apply (it attends over every position)",
                               o->max_model_len, o->model, n_ctx);
        return kvp_err_set(err, KVP_EINVAL, "--max-model-len %u is above %s's trained context of %u tokens",
                           o->max_model_len, o->model, n_ctx);
    }
    js->n_ctx_from = js->n_ctx != cfg->n_ctx ? "the model's sliding window, which the engine does not apply"
                                             : "the model's trained context";
    if (o->max_model_len)
        js->n_ctx = o->max_model_len, js->n_ctx_from = "--max-model-len";
    js->salt = salt;
    js->from_prompts = o->prompt || o->file || o->tokens;
    int rc;
    if (js->from_prompts) {
        if ((rc = open_prompts(js, r, o, err)) == 0)
            rc = kvp_run_start(r, o, NULL, err);
    } else if ((rc = kvp_in_open(&js->in, kv_in, err)) == 0) {
        js->in_open = 1;
        if ((rc = kvp_reader_open(&js->rd, &js->in, err)) == 0)
            /* the whole model's shape: under --tp/--pp blocks arrive whole */
            rc = kvp_seqio_reader_open(&js->sr, js->rd, js->in.name, kvp_run_loaded(r), r->be, &o->kv, err);
        if (rc == 0) /* the stream's blocks cached under the salt their requests will have */
            kvp_seqio_reader_set_salt(js->sr, salt);
        /* The first sequence read now: it makes the cache (its block size).
         * No more: on a pipe the next may be a while coming. */
        if (rc == 0) {
            int got = read_one(js, &js->pend[0], &js->pend_tok[0], err);
            js->pend_read_at = kvp_gen_now();
            if (got < 0)
                rc = got;
            js->n_pend = got > 0;
        }
        js->kc = js->sr ? kvp_seqio_reader_take_cache(js->sr) : NULL;
        if (rc == 0 && !js->kc)
            rc = kvp_kvcache_create(&js->kc, &kvp_run_loaded(r)->cfg, &o->kv, r->be, err);
        if (rc == 0)
            rc = kvp_run_start(r, o, js->kc, err);
        else if (!r->kc)
            kvp_kvcache_free(js->kc);
    }
    if (rc < 0) {
        kvp_jobsrc_free(js);
        return rc;
    }
    js->t_open = kvp_gen_now();
    js->all_at_open = js->from_prompts && (!js->pr || kvp_prompts_reader_is_file(js->pr));
    *out = js;
    return 0;
}

void kvp_jobsrc_free(kvp_jobsrc *js)
{
    if (!js)
        return;
    while (js->n_pp)
        pop_prompt(js);
    kvp_prompts_reader_free(js->pr);
    for (uint32_t i = 0; i < js->n_pend; i++) {
        free(js->pend_tok[i]);
        drop_stops(&js->pend[i]);
    }
    kvp_seqio_reader_free(js->sr);
    kvp_reader_free(js->rd);
    if (js->in_open)
        kvp_in_close(&js->in);
    free(js);
}

void kvp_jobsrc_filter(kvp_jobsrc *js, uint32_t k, uint32_t n, const kvp_idset *done)
{
    js->shard_k = k;
    js->shard_n = n;
    js->done = done;
}

kvp_batch_source kvp_jobsrc_source(kvp_jobsrc *js) { return (kvp_batch_source){.ctx = js, .next = next}; }
uint64_t kvp_jobsrc_total(const kvp_jobsrc *js) { return js->n; }
uint64_t kvp_jobsrc_skipped(const kvp_jobsrc *js) { return js->skipped; }
int kvp_jobsrc_read_all(const kvp_jobsrc *js) { return js->from_prompts ? js->prompts_end : js->stream_end; }

int kvp_jobsrc_input_stopped(const kvp_jobsrc *js, kvp_stop_rec *s)
{
    return js->sr && kvp_seqio_reader_stopped(js->sr, s);
}
