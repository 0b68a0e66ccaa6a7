/* jobsrc.c - a batch job's requests (see jobsrc.h). */
#include "jobsrc.h"
#include "sample.h"
#include "seqio.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct kvp_jobsrc {
    const kvp_runopts *o;
    const kvp_tokenizer *tok;
    /* prompts: tokenized by kvp_run_prompts */
    int from_prompts;
    kvp_prompts ps;
    uint32_t **ids, *lens;
    /* a stream: its sequences loaded into the cache */
    kvp_kvcache *kc;
    kvp_seqio_seq *ss;
    uint64_t n, next;
    /* arrivals (rate 0: all at once) */
    double rate, shape;
    uint64_t rng[2];
    double next_arrival;     /* monotonic seconds; 0 until the first request */
    /* the filter */
    uint32_t shard_k, shard_n;
    const kvp_idset *done;
    uint64_t skipped;
};

const char *kvp_request_id(const kvp_gen_seq *s, char buf[32])
{
    if (s->rec.label[0])
        return s->rec.label;
    snprintf(buf, 32, "%" PRIu64, s->rec.id);
    return buf;
}

/* Whether request i (label, or its index) passes the filter. */
static int keep(kvp_jobsrc *js, uint64_t i, const char *label)
{
    if (js->shard_n > 1 && i % js->shard_n != js->shard_k)
        return 0;
    if (js->done) {
        char buf[32];
        const char *id = label && label[0] ? label : (snprintf(buf, sizeof buf, "%" PRIu64, i), buf);
        if (kvp_idset_has(js->done, id, strlen(id))) {
            js->skipped++;
            return 0;
        }
    }
    return 1;
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

/* 1 when the next request has arrived (its arrival time in *t), else 0;
 * with block, waits for it first. */
static int arrived(kvp_jobsrc *js, int block, double *t)
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
    *t = js->next_arrival;
    js->next_arrival += gamma_draw(js->rng, js->shape) / (js->rate * js->shape);
    return 1;
}

/* The command line's sampling with what the request line set; a request's
 * own seed alone seeds it (the same seed, the same draws), else the
 * command line's seed and the request's index. */
static int request_sampling(const kvp_runopts *o, const kvp_prompt_params *pp, uint64_t i, kvp_sampling *smp,
                            kvp_err *err)
{
    *smp = o->sampling;
    if (pp->set & KVP_PARAM_MAX_TOKENS)
        smp->max_tokens = pp->max_tokens;
    if (pp->set & KVP_PARAM_TEMPERATURE)
        smp->temperature = pp->temperature;
    if (pp->set & KVP_PARAM_TOP_P)
        smp->top_p = pp->top_p;
    if (pp->set & KVP_PARAM_TOP_K)
        smp->top_k = pp->top_k;
    if (pp->set & KVP_PARAM_MIN_P)
        smp->min_p = pp->min_p;
    if (pp->set & KVP_PARAM_SEED)
        smp->seed = pp->seed;
    kvp_sample_seed(smp, pp->set & KVP_PARAM_SEED ? 0 : i);
    return kvp_sample_check(smp, err);
}

static kvp_gen_opts gen_opts(const kvp_runopts *o)
{
    return (kvp_gen_opts){.stop = o->stop, .n_stop = o->n_stop, .ignore_eos = o->ignore_eos};
}

static int prompt_next(kvp_jobsrc *js, int block, kvp_request **out, kvp_err *err)
{
    for (; js->next < js->n; js->next++) {
        uint64_t i = js->next;
        if (!keep(js, i, js->ps.p[i].label)) {
            free(js->ids[i]);
            js->ids[i] = NULL;
            continue;
        }
        double t_arrival;
        if (!arrived(js, block, &t_arrival))
            return 0;
        if (t_arrival == 0)
            t_arrival = kvp_gen_now();
        js->next++;
        const kvp_prompt_params *pp = &js->ps.p[i].params;
        kvp_sampling smp;
        int rc = request_sampling(js->o, pp, i, &smp, err);
        kvp_request *r = rc < 0 ? NULL : kvp_request_new(js->tok, i, js->ps.p[i].label, js->ids[i], js->lens[i], &smp);
        free(js->ids[i]);
        js->ids[i] = NULL;
        if (rc < 0)
            return kvp_err_prefix(err, "request %s", js->ps.p[i].label[0] ? js->ps.p[i].label : "");
        if (!r)
            return kvp_err_set(err, KVP_ENOMEM, "out of memory");
        r->opts = gen_opts(js->o);
        if (pp->set & KVP_PARAM_STOP) {
            r->opts.stop = (const char *const *)pp->stop;
            r->opts.n_stop = pp->n_stop;
        }
        r->g.t_start = t_arrival;
        *out = r;
        return 1;
    }
    return KVP_BATCH_END;
}

/* A stream's sequence becomes a request whose tokens are the stream's; the
 * stream's own cache sequence holds the KV until the request reuses it. */
static int stream_next(kvp_jobsrc *js, int block, kvp_request **out, kvp_err *err)
{
    for (; js->next < js->n; js->next++) {
        kvp_seqio_seq *q = &js->ss[js->next];
        if (!keep(js, js->next, q->rec.label)) {
            kvp_kvcache_seq_free(js->kc, q->handle);
            continue;
        }
        double t_arrival;
        if (!arrived(js, block, &t_arrival))
            return 0;
        if (t_arrival == 0)
            t_arrival = kvp_gen_now();
        js->next++;
        uint32_t len = kvp_kvcache_seq_len(js->kc, q->handle);
        kvp_request *r = kvp_request_new(js->tok, q->rec.id, q->rec.label, kvp_kvcache_seq_tokens(js->kc, q->handle),
                                         len, &q->rec.sampling);
        if (!r)
            return kvp_err_set(err, KVP_ENOMEM, "out of memory");
        r->holder = q->handle;
        r->g.rec = q->rec;
        r->n_prompt = q->rec.n_prompt;
        r->g.t_start = t_arrival; /* before the prefill's token is shown: TTFT >= 0 */
        r->opts = gen_opts(js->o);
        kvp_runopts_apply_sampling(js->o, &r->g.rec.sampling);
        if (js->o->sampling_set & KVP_SET_SEED)
            kvp_sample_seed(&r->g.rec.sampling, r->g.rec.id);
        int rc = kvp_sample_check(&r->g.rec.sampling, err);
        /* a sequence cut by its budget continues; one that met a stop does not */
        int over = q->rec.next_token < 0 ||
                   (q->rec.state == KVP_SEQ_FINISHED && q->rec.finish_reason != KVP_FINISH_LENGTH);
        if (rc == 0 && !over)
            rc = kvp_request_feed(r, q->rec.state == KVP_SEQ_PREFILLED, err);
        else if (rc == 0)
            kvp_request_end(r);
        if (rc < 0) {
            kvp_request_free(r);
            return rc;
        }
        *out = r;
        return 1;
    }
    return KVP_BATCH_END;
}

static int next(void *ctx, int block, kvp_request **out, kvp_err *err)
{
    kvp_jobsrc *js = ctx;
    return js->from_prompts ? prompt_next(js, block, out, err) : stream_next(js, block, out, err);
}

int kvp_jobsrc_open(kvp_jobsrc **out, kvp_run *r, const kvp_runopts *o, const char *kv_in, kvp_err *err)
{
    *out = NULL;
    kvp_jobsrc *js = calloc(1, sizeof *js);
    if (!js)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    js->o = o;
    js->tok = r->tok;
    js->from_prompts = o->prompt || o->file || o->tokens;
    int rc;
    if (js->from_prompts) {
        if ((rc = kvp_run_prompts(r, o, &js->ps, &js->ids, &js->lens, err)) == 0)
            rc = kvp_run_start(r, o, NULL, err);
        js->n = js->ps.n;
    } else {
        kvp_in in;
        kvp_reader *rd = NULL;
        uint32_t n = 0;
        if ((rc = kvp_in_open(&in, kv_in, err)) < 0) {
            kvp_jobsrc_free(js);
            return rc;
        }
        if ((rc = kvp_reader_open(&rd, &in, err)) == 0 &&
            (rc = kvp_seqio_read(rd, in.name, r->model, r->be, &o->kv, &js->kc, &js->ss, &n, err)) == 0)
            rc = kvp_run_start(r, o, js->kc, err);
        kvp_reader_free(rd);
        kvp_in_close(&in);
        js->n = n;
    }
    if (rc < 0) {
        kvp_jobsrc_free(js);
        return rc;
    }
    *out = js;
    return 0;
}

void kvp_jobsrc_free(kvp_jobsrc *js)
{
    if (!js)
        return;
    if (js->ids)
        for (uint64_t i = 0; i < js->ps.n; i++)
            free(js->ids[i]);
    free(js->ids);
    free(js->lens);
    kvp_prompts_free(&js->ps);
    free(js->ss);
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
