/* decodemain.c - the decode and specdec programs (see decodemain.h).
 * Generate tokens over a paged KV cache, for every sequence of a batch
 * together: from a KVP stream that prefill wrote (stdin or FILE), or from
 * prompts it prefills itself; specdec speculates. */
#include "decodemain.h"

#include "batch.h"
#include "cli.h"
#include "draft.h"
#include "draftmodel.h"
#include "heads.h"
#include "headsrun.h"
#include "hash.h"
#include "io.h"
#include "jobsrc.h"
#include "launchrank.h"
#include "kvout.h"
#include "progress.h"
#include "promptsonce.h"
#include "prompts.h"
#include "results.h"
#include "runopts.h"
#include "sample.h"
#include "specprofile.h"
#include "specselftest.h"
#include "stopsig.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <inttypes.h>
#include <sys/stat.h>
#include <unistd.h>

static void usage(FILE *f, int spec)
{
    if (spec)
        fprintf(f,
                "Usage: specdec -m MODEL [--method ngram] [--draft-len K|auto] [options] [KV.kvp]\n"
                "       specdec -m MODEL -p TEXT | -f FILE | --tokens IDS [--method ngram] [options]\n"
                "Generate as decode does, with speculative decoding: a drafter guesses the next tokens\n"
                "and one batched step of the model checks them.  The output is decode's, token for\n"
                "token, greedy or sampled (sampled with a draft model: decode's distribution).\n\n"
                "      --method M          ngram (prompt lookup: the last tokens found earlier in the\n"
                "                          sequence, and what followed them; default), draft, layerskip or heads\n"
                "      --draft MODEL       the draft model of --method draft: same vocabulary, smaller or\n"
                "                          more quantized; greedy requests get its greedy drafts, sampled ones\n"
                "                          drafts drawn from it, kept by speculative sampling (the target's\n"
                "                          distribution, not decode's very draws)\n"
                "      --greedy-drafts     draft greedily when sampling too: decode's very tokens for the same\n"
                "                          seed, fewer drafts kept\n"
                "      --draft-len K|auto  draft tokens a step, 1..%d (default auto: up to 8, adapted to each\n"
                "                          sequence's acceptance); with --profile a list K,K,... (default 1,2,4,8)\n"
                "      --ngram-min N, --ngram-max N  lengths of the n-grams looked up (default 2 and 3)\n"
                "      --method heads      Medusa heads (--heads FILE) guess from the model's own last hidden\n"
                "                          state: one residual block a head over the model's output head\n"
                "      --heads FILE        heads made by --train-heads for this very model (its fingerprint)\n"
                "      --branches B        heads: verify a tree of the B likeliest guesses (1..%d; default 1,\n"
                "                          a chain) in one step, with tree attention\n"
                "      --draft-layers L    layerskip: the model's first L layers draft (default half)\n"
                "      --train-heads PROMPTS -o FILE  train Medusa heads on the model's greedy answers to\n"
                "                          PROMPTS (-n tokens each), write them to FILE and exit;\n"
                "                          --n-heads N (default 4), --epochs E (2), --lr LR (0.001),\n"
                "                          --train-samples S answers a prompt, greedy then sampled (1)\n"
                "      --compare           run the requests with decode first (its output not printed),\n"
                "                          then report both speeds on stderr and check the outputs are\n"
                "                          the same (exit 1 when not)\n"
                "      --profile FILE      the prompts of FILE (as -f) through decode and each method (ngram,\n"
                "                          layerskip, draft with --draft, heads with --heads) at each draft length:\n"
                "                          drafts kept, a draft's and a verify step's cost, the predicted and\n"
                "                          measured speedups, and which to use (--profile-reps N: N runs each)\n"
                "      --selftest          check by counting (chi-square) that speculative sampling keeps\n"
                "                          the target's distribution, and that a wrong rule is caught; no model\n\n"
                "Every decode option applies:\n",
                KVP_DRAFT_MAX, KVP_DRAFT_BRANCHES);
    else
        fprintf(f,
                "Usage: decode -m MODEL [options] [KV.kvp]     continue what prefill began (stdin when no file)\n"
                "       decode -m MODEL -p TEXT | -f FILE | --tokens IDS [options]\n"
                "Generate text for every sequence together, one batched step per token.\n\n");
    fprintf(f,
            "%s"
            "      --stop STRING       stop a sequence at STRING (repeatable)\n"
            "      --ignore-eos        do not stop at end-of-generation tokens\n"
            "      --json              JSON Lines output (default when there are several sequences)\n"
            "      --kv-out FILE       write the final KV state as a KVP stream (resume with decode < FILE)\n"
            "      --slo-ttft MS, --slo-tpot MS  service-level bounds; --stats reports goodput (requests within both)\n"
            "      --min-goodput FRAC  exit 3 when fewer than FRAC of the requests met the SLOs\n"
            "      --resume OUT        append results to OUT, skipping the ids it already has (a killed job\n"
            "                          resumed gives the same lines as one run)\n"
            "      --shard K/N         only every N-th request, starting at K (0 <= K < N)\n"
            KVP_PROGRESS_HELP
            "      --rate R            release requests at R a second (Poisson; --seed), not all at once\n"
            "      --burstiness B      gamma-distributed gaps of shape B (1: Poisson; < 1 burstier)\n"
            "      --no-prefix-cache   compute every prompt in full, even where cached blocks hold its start\n"
            "      --cache-salt S      share cached KV blocks only with requests of the same salt (a tenant)\n"
            "      --max-model-len N   tokens a sequence may hold, prompt and output (default: the model's\n"
            "                          trained context; a longer prompt is refused, generation ends there)\n"
            "  -h, --help, --version\n\n"
            "Exit status: 0 success, 1 runtime error (bad model, stream or prompts file, a sequence\n"
            "that does not fit in the KV cache alone), 2 usage error, 3 goodput below --min-goodput,\n"
            "130/143 stopped by SIGINT/SIGTERM (what had finished is written).\n",
            kvp_runopts_help);
}

/* --selftest: the table of specselftest.h's checks; exit 0 when all pass. */
static int selftest(void)
{
    kvp_spec_check c[KVP_SPEC_SELFTEST_MAX];
    uint32_t n = 0;
    kvp_err err = {0};
    int failed = kvp_spec_selftest(c, &n, &err);
    if (failed < 0) {
        fprintf(stderr, "%s: selftest: %s\n", kvp_cli_prog(), err.msg);
        return 1;
    }
    printf("%-62s %8s %5s %9s %9s  %s\n", "check", "draws", "cells", "chi2", "p", "result");
    for (uint32_t i = 0; i < n; i++)
        printf("%-62s %8llu %5u %9.2f %9.3g  %s\n", c[i].what, (unsigned long long)c[i].draws, c[i].cells,
               c[i].chi2, c[i].pvalue, c[i].pass ? (c[i].expect_caught ? "caught" : "ok") : "FAIL");
    printf("%s: %u of %u checks passed\n", failed ? "FAILED" : "selftest", n - (uint32_t)failed, n);
    int rc = kvp_cli_close_stdout();
    return failed ? 1 : rc;
}

/* --compare: decode's own run of the same requests first, each output kept
 * as a hash by request id, so specdec's run can be checked against it. */
typedef struct ref_out {
    uint64_t id, hash;
} ref_out;

typedef struct compare_ctx {
    ref_out *v;
    size_t n, cap;
    uint64_t same, differ;
    uint64_t unchecked;    /* sampled with sampled drafts: decode's distribution, not its draws */
    int sampled_drafts;    /* the drafter samples its guesses (draft, layerskip without --greedy-drafts) */
    kvp_batch_stats st;    /* decode's run */
} compare_ctx;

static uint64_t out_hash(const kvp_gen_seq *s)
{
    return kvp_xxh64(s->text.data, s->text.len, s->rec.finish_reason * 0x9e3779b97f4a7c15ull + s->n_gen);
}

/* The emit callback of decode's run: nothing printed, a hash kept. */
static void compare_collect(void *cp, kvp_gen_seq *s, const char *bytes, size_t n)
{
    (void)bytes;
    compare_ctx *c = cp;
    if (n)
        return;
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 64;
        ref_out *v = realloc(c->v, cap * sizeof *v);
        if (!v)
            kvp_cli_die("out of memory");
        c->v = v;
        c->cap = cap;
    }
    c->v[c->n++] = (ref_out){s->rec.id, out_hash(s)};
}

static int ref_cmp(const void *a, const void *b)
{
    uint64_t x = ((const ref_out *)a)->id, y = ((const ref_out *)b)->id;
    return (x > y) - (x < y);
}

static void compare_check(compare_ctx *c, const kvp_gen_seq *s)
{
    /* A sampled draft changes which uniforms the target's draws use: the
     * text follows decode's distribution (specdec --selftest checks that),
     * not decode's very draws, so there is nothing to compare token by
     * token. */
    if (c->sampled_drafts && s->rec.sampling.temperature > 0) {
        c->unchecked++;
        return;
    }
    ref_out key = {s->rec.id, 0};
    const ref_out *hit = bsearch(&key, c->v, c->n, sizeof *c->v, ref_cmp);
    if (hit && hit->hash == out_hash(s)) {
        c->same++;
        return;
    }
    char idb[KVP_REQUEST_ID_SIZE];
    c->differ++;
    kvp_cli_warn("--compare: sequence %s: not what decode wrote", kvp_request_id((kvp_gen_seq *)s, idb));
}

typedef struct out_ctx {
    int spec;              /* specdec: the lines carry drafted and accepted counts */
    compare_ctx *cmp;      /* --compare: check each output against decode's */
    int form;              /* FORM_*: how results are written */
    kvp_buf held_text;     /* FORM_UNKNOWN: the first request's text so far, */
    kvp_buf held_line;     /* and its JSON line once it has finished */
    int held_done;         /* it has finished */
    int mid_line;          /* FORM_TEXT: text written since the last newline */
    int resume;            /* --resume: OUT holds what is done (a kv_memory failure is not) */
    int fd;                /* JSON lines go here, one write() a line (stdout, or --resume's file) */
    const char *out_name;
    kvp_kvout *ko;         /* --kv-out: finished requests, with their KV, until written */
    uint64_t n_written;
    uint64_t n_kv_memory;  /* sequences that did not fit in the cache alone */
    kvp_kvcache_stats kv;  /* the cache's size, for that message */
} out_ctx;

/* The output's form: one request's text streamed as plain text, or a JSON
 * line a request.  Without --json, --resume or --shard it is the input's to
 * tell: plain text when the input ends after one request, JSON when a
 * second comes (or the run ends before the input does).  Until then the
 * first request runs and its output is held, so no read waits for a second
 * request before the first starts (on a pipe it may be long coming). */
enum { FORM_UNKNOWN, FORM_TEXT, FORM_JSON };

/* A result line into *buf (malloc'd). */
static void format_line(const out_ctx *c, const kvp_gen_seq *s, char **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    FILE *f = open_memstream(buf, len);
    if (!f)
        kvp_cli_die("out of memory");
    fputs("{\"id\":", f);
    kvp_run_id_json(f, s->rec.label, (s->rec.flags & KVP_SEQ_LABEL_INT) != 0, s->rec.id);
    fputs(",\"text\":", f);
    kvp_cli_json_str(f, (const char *)s->text.data, s->text.len);
    fprintf(f, ",\"tokens\":%u,\"finish_reason\":\"%s\",\"ttft_ms\":", s->n_gen,
            kvp_gen_finish_name(s->rec.finish_reason));
    /* null where there is none (no token shown; one token has no TPOT), as
     * in --stats: a 0 would read as a measurement */
    if (s->t_first)
        fprintf(f, "%.2f", (s->t_first - s->t_start) * 1e3);
    else
        fputs("null", f);
    fputs(",\"tpot_ms\":", f);
    if (s->n_gen > 1)
        fprintf(f, "%.3f", (s->t_last - s->t_first) * 1e3 / (s->n_gen - 1));
    else
        fputs("null", f);
    if (c->spec) {
        const kvp_request *r = kvp_request_of((kvp_gen_seq *)s);
        fprintf(f, ",\"drafted\":%u,\"accepted\":%u,\"verify_steps\":%u", r->n_drafted, r->n_accepted,
                r->n_verify);
    }
    fputs("}\n", f);
    if (fclose(f) != 0)
        kvp_cli_die("out of memory");
}

/* Where a line that fails part-written is cut back to: the --resume
 * file's end (the job holds its lock: no other writer), or a regular file
 * standard output was opened on by `>` (appended to, it may be shared:
 * left as it is); -1 where nothing is cut. */
static off_t line_start(const out_ctx *c)
{
    if (c->resume)
        return lseek(c->fd, 0, SEEK_END);
    struct stat st;
    int fl = fcntl(c->fd, F_GETFL);
    if (fl < 0 || (fl & O_APPEND) || fstat(c->fd, &st) != 0 || !S_ISREG(st.st_mode))
        return -1;
    return lseek(c->fd, 0, SEEK_CUR);
}

/* One result line.  Written with one write() so a job killed at any moment
 * leaves whole lines and at most one cut-off last line (--resume drops it);
 * a write that fails (a full disk) takes its part back, so the file ends
 * in whole lines. */
static void put_line(out_ctx *c, const char *buf, size_t len)
{
    off_t start = line_start(c);
    for (size_t off = 0; off < len;) {
        ssize_t w = write(c->fd, buf + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) {
            int e = errno;
            if (e == EPIPE)
                exit(KVP_EXIT_OK); /* the reader went away: a quiet end, like head */
            if (off && start >= 0 && ftruncate(c->fd, start) != 0)
                kvp_cli_warn("%s: cannot cut off the part-written line: %s", c->out_name, strerror(errno));
            kvp_cli_die("%s: %s", c->out_name, strerror(e));
        }
        off += (size_t)w;
    }
    c->n_written++;
}

static void write_line(out_ctx *c, const kvp_gen_seq *s)
{
    char *buf;
    size_t len;
    format_line(c, s, &buf, &len);
    put_line(c, buf, len);
    free(buf);
}

/* FORM_TEXT: n bytes of text, or (n 0) the end of the sequence's line. */
static void put_text(out_ctx *c, const void *bytes, size_t n)
{
    if (n)
        fwrite(bytes, 1, n, stdout);
    else
        fputc('\n', stdout);
    c->mid_line = n != 0;
    fflush(stdout);
}

/* FORM_UNKNOWN: the first request's output kept for the form to come. */
static void hold_output(out_ctx *c, const kvp_gen_seq *s, const char *bytes, size_t n)
{
    if (n) {
        kvp_buf_put(&c->held_text, bytes, n);
    } else {
        char *buf;
        size_t len;
        format_line(c, s, &buf, &len);
        kvp_buf_put(&c->held_line, buf, len);
        free(buf);
        c->held_done = 1;
    }
    if (c->held_text.oom || c->held_line.oom)
        kvp_cli_die("out of memory");
}

/* The form is known: what was held is written in it. */
static void settle_form(out_ctx *c, int form)
{
    if (c->form != FORM_UNKNOWN)
        return;
    c->form = form;
    if (form == FORM_TEXT && c->held_text.len)
        put_text(c, c->held_text.data, c->held_text.len);
    if (form == FORM_TEXT && c->held_done)
        put_text(c, NULL, 0);
    if (form == FORM_JSON && c->held_done)
        put_line(c, (const char *)c->held_line.data, c->held_line.len);
    kvp_buf_free(&c->held_text);
    kvp_buf_free(&c->held_line);
}

/* What the input has shown so far settles the form: a second request, or
 * its end. */
static void settle_from_input(out_ctx *c, const kvp_jobsrc *js)
{
    uint64_t n = kvp_jobsrc_total(js);
    if (n >= 2)
        settle_form(c, FORM_JSON);
    else if (kvp_jobsrc_read_all(js))
        settle_form(c, n == 1 ? FORM_TEXT : FORM_JSON);
}

/* The job source as the run sees it, the form settled after each read. */
typedef struct settling_src {
    kvp_batch_source inner;
    out_ctx *oc;
    const kvp_jobsrc *js;
} settling_src;

static int settling_next(void *ctx, int block, kvp_request **out, kvp_err *err)
{
    settling_src *f = ctx;
    int rc = f->inner.next(f->inner.ctx, block, out, err);
    settle_from_input(f->oc, f->js);
    return rc;
}

static void emit(void *cp, kvp_gen_seq *s, const char *bytes, size_t n)
{
    out_ctx *c = cp;
    if (n == 0 && s->rec.finish_reason == KVP_FINISH_KV_MEMORY) {
        char idb[KVP_REQUEST_ID_SIZE];
        c->n_kv_memory++;
        kvp_cli_warn("sequence %s: KV cache out of blocks: it needs more than all %u blocks of %llu bytes; "
                     "raise --kv-mem or --kv-blocks%s", kvp_request_id(s, idb), c->kv.n_blocks,
                     (unsigned long long)c->kv.block_bytes,
                     c->resume ? " (it is not written to the --resume file: a run with more memory retries it)" : "");
    }
    if (n == 0 && c->cmp)
        compare_check(c->cmp, s);
    if (c->form == FORM_UNKNOWN) {
        hold_output(c, s, bytes, n);
    } else if (c->form == FORM_TEXT) {
        put_text(c, bytes, n);
    } else if (n == 0 && !(c->resume && s->rec.finish_reason == KVP_FINISH_KV_MEMORY)) {
        /* under --resume, a sequence that did not fit stays out of OUT (its
         * message says so): the run again with a larger cache retries it */
        write_line(c, s);
    }
    if (n == 0 && c->ko)
        kvp_kvout_hold(c->ko, kvp_request_of(s));
}

/* The batch's on_step: --kv-out's finished requests written (the step that
 * finished them is over), then --progress's line. */
typedef struct step_hooks {
    kvp_kvout *ko;
    kvp_progress *pg;
} step_hooks;

static void on_step(void *ctx, const kvp_batch_stats *st, uint32_t running, uint32_t waiting)
{
    step_hooks *h = ctx;
    if (h->ko)
        kvp_kvout_flush(h->ko);
    if (h->pg)
        kvp_progress_step(h->pg, st, running, waiting);
}

/* What kvcalc --check needs besides the counts: the model and the KV pool
 * as this run made them (kvcalc(1) CHECKING A RUN). */
typedef struct run_info {
    const char *model;           /* -m as given */
    char fingerprint[33];
    const char *input;           /* "prompts" (-p, -f, --tokens) or "kvp" (a KV stream) */
    kvp_kvcache_stats kv;        /* n_blocks, block_bytes */
    uint32_t block_size;         /* the pool's (a stream's own block size wins over --block-size) */
    int kv_dtype;                /* the pool's (a stream's own KV dtype wins over --kv-dtype) */
} run_info;

/* How the pool was sized: kvp_kvcache_create takes --kv-blocks, else
 * --kv-mem, else the model's context. */
static const char *pool_sized_by(const kvp_runopts *o)
{
    return o->kv.n_blocks ? "kv-blocks" : o->kv.mem_bytes ? "kv-mem" : "context";
}

/* The run's summary: counts, throughput, the latency distributions and
 * goodput against the SLOs, as one JSON object. */
/* specdec's part of the summary: the drafter, and how its drafts fared. */
typedef struct spec_info {
    const char *method;  /* NULL: no speculation */
    uint32_t draft_len;
    int adaptive;
    const compare_ctx *cmp; /* --compare */
} spec_info;

static double tokens_per_s(const kvp_batch_stats *st)
{
    return st->seconds > 0 ? (double)st->generated / st->seconds : 0;
}

/* A rate of n over d as JSON: null where d is 0 (nothing to rate), not 0. */
static void json_rate(FILE *f, const char *key, unsigned long long n, unsigned long long d, int digits)
{
    if (d)
        fprintf(f, ",\"%s\":%.*f", key, digits, (double)n / (double)d);
    else
        fprintf(f, ",\"%s\":null", key);
}

/* Whether the run timed work to give rates over: a step ran.  Without
 * one (no request, or each over before its first step: max_tokens 0, a
 * stream's ended sequence) its seconds are reading and bookkeeping, and n
 * over them (2 requests in 80 us: 25000 a second) would be no rate the
 * engine reached. */
static int has_rates(const kvp_batch_stats *st) { return st->steps > 0 && st->seconds > 0; }

/* n a second of the run as JSON, key first (no comma): null without
 * work timed (has_rates). */
static void json_per_s(FILE *f, const char *key, const kvp_batch_stats *st, double n, int digits)
{
    if (has_rates(st))
        fprintf(f, "\"%s\":%.*f", key, digits, n / st->seconds);
    else
        fprintf(f, "\"%s\":null", key);
}

/* The tokens a request got a step past its first token (1 + the drafts
 * it kept; 1: speculation gained nothing), over all requests: specdec
 * --profile's tokens_per_step, (steps + accepted) / steps; 0 (no such
 * step) when none had one. */
static unsigned long long decode_tokens(const kvp_batch_stats *st)
{
    return (unsigned long long)(st->decode_steps + st->accepted);
}

static void spec_json(FILE *f, const kvp_batch_stats *st, const spec_info *sp)
{
    fprintf(f, ",\"spec\":{\"method\":\"%s\",\"draft_len\":%u,\"adaptive\":%s,\"verify_steps\":%llu,"
            "\"drafted\":%llu,\"accepted\":%llu",
            sp->method, sp->draft_len, sp->adaptive ? "true" : "false", (unsigned long long)st->verify_steps,
            (unsigned long long)st->drafted, (unsigned long long)st->accepted);
    /* a run that drafted nothing (auto backed off at once, or every
     * request ended at its first token) has no acceptance to report */
    json_rate(f, "acceptance", st->accepted, st->drafted, 4);
    json_rate(f, "mean_accepted", st->accepted, st->verify_steps, 3);
    /* a request's own steps, not the batch's: 8 requests in a step of
     * plain decoding gain 1 token each, not 8 */
    fprintf(f, ",\"decode_steps\":%llu", (unsigned long long)st->decode_steps);
    json_rate(f, "tokens_per_step", decode_tokens(st), st->decode_steps, 3);
    fputs(",\"acceptance_at\":[", f);
    /* a position never drafted has no rate: null, not a rate of 0 */
    for (uint32_t j = 0; j < sp->draft_len && j < KVP_DRAFT_MAX; j++)
        if (st->drafted_at[j])
            fprintf(f, "%s%.4f", j ? "," : "", (double)st->accepted_at[j] / (double)st->drafted_at[j]);
        else
            fprintf(f, "%snull", j ? "," : "");
    fputs("]", f);
    if (strcmp(sp->method, "heads") == 0) /* 0 for a chain (--branches 1), there all the same */
        fprintf(f, ",\"branch_rows\":%llu,\"tree_steps\":%llu", (unsigned long long)st->branch_rows,
                (unsigned long long)st->tree_steps);
    if (sp->cmp) {
        double a = tokens_per_s(&sp->cmp->st), b = tokens_per_s(st);
        fprintf(f, ",\"compare\":{\"decode_output_throughput\":%.2f,\"decode_seconds\":%.3f,\"speedup\":", a,
                sp->cmp->st.seconds);
        if (a > 0)
            fprintf(f, "%.3f", b / a);
        else
            fputs("null", f); /* no token generated: no speedup, not 0 */
        fprintf(f, ",\"same\":%llu,\"differ\":%llu,\"unchecked\":%llu}", (unsigned long long)sp->cmp->same,
                (unsigned long long)sp->cmp->differ, (unsigned long long)sp->cmp->unchecked);
    }
    fputs("}", f);
}

/* seconds as milliseconds, or null where not given (0) */
static void json_ms_or_null(FILE *f, double s)
{
    if (s > 0)
        fprintf(f, "%.3f", s * 1e3);
    else
        fputs("null", f);
}

static void summary_json(FILE *f, const kvp_batch_stats *st, kvp_metrics *m, const kvp_runopts *o,
                         const run_info *ri, const spec_info *sp)
{
    kvp_dist d;
    fprintf(f, "{\"requests\":%llu,\"kv_memory\":%llu,\"seconds\":%.3f,", (unsigned long long)st->requests,
            (unsigned long long)st->kv_memory, st->seconds);
    json_per_s(f, "request_throughput", st, (double)st->requests, 3);
    fprintf(f, ",\"output_tokens\":%llu,", (unsigned long long)st->generated);
    json_per_s(f, "output_throughput", st, (double)st->generated, 2);
    fprintf(f, ",\"prompt_tokens\":%llu,\"cached_prompt_tokens\":%llu", (unsigned long long)st->prompt_tokens,
            (unsigned long long)st->cached_tokens);
    json_rate(f, "prefix_hit_rate", st->cached_tokens, st->prompt_tokens, 4);
    fputc(',', f);
    /* the prompts of the requests that ran: one over before its first step
     * had none computed */
    json_per_s(f, "total_token_throughput", st, (double)(st->generated + st->ran_prompt_tokens), 2);
    fprintf(f, ",\"steps\":%llu,\"preemptions\":%llu,\"peak_kv_blocks\":%u,\"kv_blocks\":%u,\"block_size\":%u,"
            "\"max_num_seqs\":%u,\"max_batched_tokens\":%u,\"static\":%s,",
            (unsigned long long)st->steps, (unsigned long long)st->preemptions, st->peak_blocks, st->total_blocks,
            ri->block_size, o->sched.max_num_seqs, o->sched.max_batched_tokens,
            o->sched.static_batch ? "true" : "false");
    /* the plan kvcalc --check reproduces, and what the run measured against it */
    fputs("\"model\":", f);
    kvp_cli_json_str(f, ri->model, strlen(ri->model));
    fprintf(f, ",\"model_fingerprint\":\"%s\",\"input\":\"%s\",\"kv_dtype\":\"%s\",\"kv_block_bytes\":%llu,"
            "\"kv_pool_bytes\":%llu,\"kv_pool_sized_by\":\"%s\",\"kv_mem\":",
            ri->fingerprint, ri->input, kvp_dtype_name((uint32_t)ri->kv_dtype),
            (unsigned long long)ri->kv.block_bytes, (unsigned long long)ri->kv.n_blocks * ri->kv.block_bytes,
            pool_sized_by(o));
    if (!o->kv.n_blocks && o->kv.mem_bytes)
        fprintf(f, "%llu", (unsigned long long)o->kv.mem_bytes);
    else
        fputs("null", f);
    /* the pool above is rank 0's (stage 0's layers, its share of the heads):
     * kvcalc --check plans that rank from these */
    fprintf(f, ",\"tp\":%u,\"pp\":%u", o->tp > 1 ? o->tp : 1, o->pp > 1 ? o->pp : 1);
    fprintf(f, ",\"forward_seconds\":%.3f,\"sample_seconds\":%.3f", st->forward_seconds, st->sample_seconds);
    fprintf(f, ",\"kv_out\":%s,\"stopped\":%s,\"peak_running\":%u", o->kv_out ? "true" : "false",
            st->stopped ? "true" : "false", st->peak_running);
    json_rate(f, "mean_prompt_tokens", st->prompt_tokens, st->requests, 2); /* no request: no mean */
    json_rate(f, "mean_output_tokens", st->generated, st->requests, 2);
    fprintf(f, ",\"max_seq_len\":%llu,", (unsigned long long)st->max_seq_len);
    kvp_metrics_ttft(m, &d);
    kvp_dist_json(f, "ttft_ms", &d);
    fputc(',', f);
    kvp_metrics_tpot(m, &d);
    kvp_dist_json(f, "tpot_ms", &d);
    fputc(',', f);
    kvp_metrics_itl(m, &d);
    kvp_dist_json(f, "itl_ms", &d);
    fputc(',', f);
    kvp_metrics_e2e(m, &d);
    kvp_dist_json(f, "e2e_ms", &d);
    /* an objective not given is null, not a 0 ms one no request could meet */
    fputs(",\"slo_ttft_ms\":", f);
    json_ms_or_null(f, m->slo_ttft);
    fputs(",\"slo_tpot_ms\":", f);
    json_ms_or_null(f, m->slo_tpot);
    fprintf(f, ",\"good_requests\":%llu,\"goodput\":", (unsigned long long)m->good);
    double gp;
    if (kvp_metrics_goodput(m, &gp))
        fprintf(f, "%.4f", gp);
    else
        fputs("null", f); /* no request: a share of nothing */
    fputc(',', f);
    json_per_s(f, "goodput_rps", st, (double)m->good, 3);
    if (sp->method)
        spec_json(f, st, sp);
    fputs("}\n", f);
}

/* --compare's line: both speeds and how many outputs were decode's. */
static void compare_line(FILE *f, const char *prog, const kvp_batch_stats *st, const compare_ctx *cmp)
{
    double a = tokens_per_s(&cmp->st), b = tokens_per_s(st);
    if (a > 0)
        fprintf(f, "%s: compare: decode %.2f tokens/s, %s %.2f tokens/s: %.2fx", prog, a, prog, b, b / a);
    else /* a shard of no request, or none with a token to make: a speedup of nothing is none */
        fprintf(f, "%s: compare: no token generated (no request here, or none with a token to make): no speeds "
                "to compare", prog);
    fprintf(f, "; the same output for %llu of %llu sequences", (unsigned long long)cmp->same,
            (unsigned long long)(cmp->same + cmp->differ));
    if (cmp->unchecked)
        fprintf(f, " (%llu sampled with sampled drafts not compared: they follow decode's distribution, not its "
                "draws)", (unsigned long long)cmp->unchecked);
    fputc('\n', f);
}

/* n / d with digits decimals into buf, or "-" where d is 0. */
static void text_ratio(char *buf, size_t size, int digits, double n, double d)
{
    if (d > 0)
        snprintf(buf, size, "%.*f", digits, n / d);
    else
        snprintf(buf, size, "-");
}

static void summary_text(FILE *f, const kvp_batch_stats *st, kvp_metrics *m, const spec_info *sp)
{
    const char *prog = kvp_cli_prog();
    kvp_dist t, p, i, e;
    kvp_metrics_ttft(m, &t);
    kvp_metrics_tpot(m, &p);
    kvp_metrics_itl(m, &i);
    kvp_metrics_e2e(m, &e);
    char rates[80] = "no step ran: no rates"; /* as the JSON's nulls (has_rates) */
    if (has_rates(st))
        snprintf(rates, sizeof rates, "%.2f tokens/s, %.3f requests/s", (double)st->generated / st->seconds,
                 (double)st->requests / st->seconds);
    fprintf(f, "%s: %llu sequences, %llu tokens in %.3f s (%s); %llu steps, %llu "
            "preemptions, peak %u of %u KV blocks; prompt tokens from the prefix cache %llu of %llu\n",
            prog, (unsigned long long)st->requests, (unsigned long long)st->generated, st->seconds, rates,
            (unsigned long long)st->steps,
            (unsigned long long)st->preemptions, st->peak_blocks, st->total_blocks,
            (unsigned long long)st->cached_tokens, (unsigned long long)st->prompt_tokens);
    double rest = st->seconds - st->forward_seconds - st->sample_seconds;
    fprintf(f, "%s: time: forward steps %.3f s, sampling and output %.3f s, the rest %.3f s\n", prog,
            st->forward_seconds, st->sample_seconds, rest > 0 ? rest : 0.0);
    fprintf(f, "%s: ms       mean      p50      p90      p99\n", prog);
    const kvp_dist *ds[] = {&t, &p, &i, &e};
    const char *names[] = {"TTFT", "TPOT", "ITL", "E2E"};
    for (int k = 0; k < 4; k++) {
        fprintf(f, "%s: ", prog);
        kvp_dist_text(f, names[k], ds[k]);
    }
    double gp;
    char gps[32] = "-"; /* no request: a share of nothing, as the JSON's null */
    if (kvp_metrics_goodput(m, &gp))
        snprintf(gps, sizeof gps, "%.4f", gp);
    if (m->slo_ttft > 0 || m->slo_tpot > 0) { /* the objectives given, and only those */
        char slo[96];
        if (m->slo_ttft > 0 && m->slo_tpot > 0)
            snprintf(slo, sizeof slo, "TTFT %g ms and TPOT %g ms", m->slo_ttft * 1e3, m->slo_tpot * 1e3);
        else
            snprintf(slo, sizeof slo, "%s %g ms", m->slo_ttft > 0 ? "TTFT" : "TPOT",
                     (m->slo_ttft > 0 ? m->slo_ttft : m->slo_tpot) * 1e3);
        fprintf(f, "%s: goodput %s (%llu of %llu requests within %s)\n", prog, gps, (unsigned long long)m->good,
                (unsigned long long)m->n, slo);
    }
    if (sp->method) {
        /* a ratio of nothing is "-", as the JSON's null */
        char acc[16], kept[16], per[16];
        text_ratio(acc, sizeof acc, 1, 100.0 * (double)st->accepted, (double)st->drafted);
        text_ratio(kept, sizeof kept, 2, (double)st->accepted, (double)st->verify_steps);
        text_ratio(per, sizeof per, 2, (double)decode_tokens(st), (double)st->decode_steps);
        fprintf(f, "%s: %s drafts (%s%u): %llu verify steps, %llu of %llu draft tokens accepted (%s%s), %s "
                "accepted a verify step, %s tokens a request's step; accepted at each position:", prog, sp->method,
                sp->adaptive ? "auto, up to " : "", sp->draft_len, (unsigned long long)st->verify_steps,
                (unsigned long long)st->accepted, (unsigned long long)st->drafted, acc, st->drafted ? "%" : "", kept, per);
        for (uint32_t j = 0; j < sp->draft_len && j < KVP_DRAFT_MAX; j++)
            if (st->drafted_at[j])
                fprintf(f, " %.0f%%", 100.0 * (double)st->accepted_at[j] / (double)st->drafted_at[j]);
            else
                fputs(" -", f);
        fputc('\n', f);
    }
    if (sp->cmp)
        compare_line(f, prog, st, sp->cmp);
}

/* --stats=FILE's JSON in *buf[*len] (malloc'd). */
static void stats_json(const kvp_runopts *o, const kvp_batch_stats *st, kvp_metrics *m, const run_info *ri,
                       const spec_info *sp, char **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    FILE *f = open_memstream(buf, len);
    if (!f)
        kvp_cli_die("--stats=%s: out of memory", o->stats_file);
    summary_json(f, st, m, o, ri, sp);
    if (fclose(f) != 0)
        kvp_cli_die("--stats=%s: out of memory", o->stats_file);
}

/* --stats: on stderr (text, or JSON with --json), or JSON into FILE. */
static void write_stats(const kvp_runopts *o, const kvp_batch_stats *st, kvp_metrics *m, const run_info *ri,
                        const spec_info *sp)
{
    if (!o->stats_file) {
        if (o->json)
            summary_json(stderr, st, m, o, ri, sp);
        else
            summary_text(stderr, st, m, sp);
        return;
    }
    char *buf;
    size_t len;
    stats_json(o, st, m, ri, sp, &buf, &len);
    kvp_err err = {0};
    if (kvp_cli_write_atomic(o->stats_file, buf, len, &err) < 0)
        kvp_cli_die_err(&err);
    free(buf);
}

/* --stats=FILE written whole under a temporary name (kvp_cli_write_sealed),
 * for kvp_out_commit once the job's other outputs are ready too. */
static void seal_stats(const kvp_runopts *o, const kvp_batch_stats *st, kvp_metrics *m, const run_info *ri,
                       const spec_info *sp, kvp_out *out)
{
    char *buf;
    size_t len;
    stats_json(o, st, m, ri, sp, &buf, &len);
    kvp_err err = {0};
    if (kvp_cli_write_sealed(out, o->stats_file, buf, len, &err) < 0)
        kvp_cli_die_err(&err);
    free(buf);
}

enum {
    OPT_SLO_TTFT = 0x2000, OPT_SLO_TPOT, OPT_MIN_GOODPUT, OPT_RESUME, OPT_SHARD, OPT_PROGRESS, OPT_RATE, OPT_BURST,
    OPT_NO_PREFIX_CACHE, OPT_CACHE_SALT, OPT_MAX_MODEL_LEN, OPT_METHOD, OPT_DRAFT_LEN, OPT_NGRAM_MIN, OPT_NGRAM_MAX, OPT_DRAFT,
    OPT_COMPARE,
    OPT_SELFTEST,
    OPT_GREEDY_DRAFTS,
    OPT_DRAFT_LAYERS,
    OPT_PROFILE, OPT_PROFILE_REPS,
    OPT_HEADS, OPT_TRAIN_HEADS, OPT_N_HEADS, OPT_EPOCHS, OPT_LR, OPT_BRANCHES, OPT_TRAIN_SAMPLES,
};

/* specdec's Medusa heads: --method heads --heads FILE, or training them. */
typedef struct heads_cli {
    const char *path;       /* --heads */
    uint32_t branches;      /* --branches: the draft tree's (0: a chain) */
    kvp_heads_job job;      /* --train-heads FILE -o OUT [--n-heads --epochs --lr] */
    int tuned;              /* a training option was given */
} heads_cli;

/* One of the heads options: 1 when c was one. */
static int parse_heads_opt(heads_cli *h, int c, const char *arg)
{
    switch (c) {
    case OPT_HEADS: h->path = kvp_cli_opt_path("--heads", arg); return 1;
    case OPT_BRANCHES: h->branches = (uint32_t)kvp_cli_opt_i64("--branches", arg, 1, KVP_DRAFT_BRANCHES); return 1;
    case OPT_TRAIN_HEADS: h->job.prompts = kvp_cli_opt_path("--train-heads", arg); return 1;
    case 'o': h->job.out = arg; return 1;
    case OPT_N_HEADS: h->job.n_heads = (uint32_t)kvp_cli_opt_i64("--n-heads", arg, 1, KVP_HEADS_MAX); break;
    case OPT_EPOCHS: h->job.train.epochs = (uint32_t)kvp_cli_opt_i64("--epochs", arg, 1, 1000); break;
    case OPT_LR: h->job.train.lr = kvp_cli_opt_f64("--lr", arg, 1e-7, 1); break;
    case OPT_TRAIN_SAMPLES: h->job.samples = (uint32_t)kvp_cli_opt_i64("--train-samples", arg, 1, 64); break;
    default: return 0;
    }
    h->tuned = 1;
    return 1;
}

/* Standard input carries one of a job's inputs: a second "-" would read
 * what the first left of it (no prompts after a draft model; a model's
 * bytes where a KV stream was wanted), so naming it twice is a usage error
 * that names both.  names[i] says what paths[i] is; NULL: not given. */
static void stdin_once(const char *const *paths, const char *const *names, size_t n)
{
    const char *first = NULL;
    for (size_t i = 0; i < n; i++) {
        if (!paths[i] || strcmp(paths[i], "-"))
            continue;
        if (first)
            kvp_cli_usage_error("%s and %s both read standard input: give one of them as a file", first, names[i]);
        first = names[i];
    }
}

/* An option a job refuses: whether it was given, and its name. */
typedef struct given_opt {
    int given;
    const char *name;
} given_opt;

/* The name of the first of opts[n] given, or NULL. */
static const char *first_given(const given_opt *opts, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (opts[i].given)
            return opts[i].name;
    return NULL;
}

/* --train-heads: the whole job, then exit. */
static int train_heads(kvp_runopts *o, heads_cli *h)
{
    if (!h->job.out)
        kvp_cli_usage_error("--train-heads needs -o HEADS.kvp (the file to write)");
    if (!*h->job.out)
        kvp_cli_usage_error("-o: an empty file name");
    /* "-" is standard input here, which -o may name too (/dev/stdin, or
     * the file it was redirected from): an existing file is compared by
     * inode, standard input by fstat */
    kvp_cli_refuse_same("-o ", h->job.out, o->model, "model");
    kvp_cli_refuse_same("-o ", h->job.out, h->job.prompts, "prompts file");
    kvp_cli_refuse_stdout_input(h->job.prompts, "prompts file");
    kvp_cli_refuse_stdout_input(o->model, "model");
    if (o->prompt || o->file || o->tokens)
        kvp_cli_usage_error("--train-heads FILE is the prompts: no -p, -f or --tokens beside it");
    if (o->sampling.temperature > 0)
        kvp_cli_usage_error("--train-heads learns the model's greedy answers: no --temperature");
    o->file = h->job.prompts;
    kvp_run r;
    kvp_err err = {0};
    if (kvp_run_open(&r, o, &err) < 0 || kvp_heads_train_run(&r, o, &h->job, stderr, &err) < 0)
        kvp_cli_die_err(&err);
    kvp_run_close(&r);
    kvp_runopts_free(o);
    return kvp_cli_close_stdout();
}

/* --compare reads its prompts twice: a pipe's held in memory, its messages
 * naming the user's file (promptsonce.h).  Past this a job is refused: a
 * comparison wants a sample, not a day's traffic. */
#define COMPARE_PROMPTS_MAX ((uint64_t)64 << 20)

/* A failure of the job, its message naming the user's prompts file. */
static _Noreturn void die_job(kvp_err *err, const kvp_prompts_once *once)
{
    kvp_prompts_once_name(once, err);
    kvp_cli_die_err(err);
}

/* What a job whose input did not open still reports (open_failed). */
typedef struct job_open {
    const kvp_runopts *o;
    const kvp_run *r;
    kvp_metrics *metrics;        /* the run's: empty, with its SLOs */
    const spec_info *sp;
    const char *input;           /* run_info's */
    const kvp_prompts_once *once;
    const char *resume;
    double t0;                   /* when the open began: the wait counts as the run's seconds */
} job_open;

/* A stop signal before the job's first request (while the model loaded,
 * or while its input was awaited: a pipe, or a FIFO no writer has opened
 * yet) ends the job as a stop does later: its --stats (no request,
 * stopped, and the KV pool the options size, not made yet), the message,
 * 128 + the signal. */
static _Noreturn void stop_before_input(const job_open *jo)
{
    if (jo->o->stats) {
        run_info ri = {.model = jo->o->model, .input = jo->input, .kv_dtype = jo->o->kv.dtype};
        kvp_model_fingerprint_hex(jo->r->model, ri.fingerprint);
        if (jo->r->kc) {
            kvp_kvcache_get_stats(jo->r->kc, &ri.kv);
            ri.block_size = kvp_kvcache_pool(jo->r->kc)->block_size;
            ri.kv_dtype = kvp_kvcache_pool(jo->r->kc)->dtype;
        } else {
            /* as kvp_run_start would make it (a stream's own block size
             * or dtype, not read yet, may differ); options it would refuse
             * leave the pool 0 */
            kvp_err e = {0};
            kvp_kvcache_size(&jo->r->model->cfg, &jo->o->kv, &ri.kv, &ri.block_size, &e);
        }
        kvp_batch_stats st = {.stopped = 1, .total_blocks = ri.kv.n_blocks, .seconds = kvp_gen_now() - jo->t0};
        write_stats(jo->o, &st, jo->metrics, &ri, jo->sp);
    }
    kvp_stopsig_say(0, 0, 0, jo->resume);
    exit(kvp_stopsig_status());
}

/* --compare's prompts, read once (a pipe's into memory) before the model
 * loads.  The read may wait (a pipe, a FIFO no writer has opened), so the
 * stop handlers are in place first: a signal there stops the job as it
 * does while the input is awaited later.  Without --stats it ends here;
 * with it, the model loads first (the statistics name it and the pool its
 * options size) and the caller stops once it has loaded. */
static void read_compare_prompts(kvp_prompts_once *once, kvp_runopts *o, const job_open *jo)
{
    kvp_stopsig_catch();
    if (kvp_prompts_once_open(once, o->file, 0, COMPARE_PROMPTS_MAX,
                              "--compare runs each request twice; give it a sample, or a regular file") == 0)
        o->file = kvp_prompts_once_path(once);
    else if (!o->stats)
        stop_before_input(jo); /* no model to load for it */
}

/* The job's input did not open: a stop (stop_before_input), else a
 * failure. */
static void open_failed(kvp_err *err, const job_open *jo)
{
    if (!kvp_stopsig_caught())
        die_job(err, jo->once);
    stop_before_input(jo);
}

/* --resume OUT: OUT opened for appending and locked (two jobs resuming
 * one file would each run every request and interleave their lines), the
 * ids it already has, and it cut back to its whole lines. */
static int open_resume(const char *path, kvp_idset *done)
{
    kvp_err err = {0};
    uint64_t whole = 0;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0)
        kvp_cli_die("%s: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0)
        kvp_cli_die("%s: %s", path,
                    errno == EWOULDBLOCK ? "another decode is resuming into it (--resume): wait for it to end"
                                         : strerror(errno));
    if (kvp_results_scan(path, done, &whole, &err) < 0)
        kvp_cli_die_err(&err);
    struct stat st;
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size > whole) /* a killed run's last line, or not results at all */
        fprintf(stderr, "%s: note: %s: its unfinished last line (%" PRIu64 " bytes) is cut off\n", kvp_cli_prog(),
                path, (uint64_t)st.st_size - whole);
    if (ftruncate(fd, (off_t)whole) != 0)
        kvp_cli_die("%s: cannot cut off the unfinished last line: %s", path, strerror(errno));
    return fd;
}

/* A count of --shard: digits only (no sign, space or hex), below 2^32. */
static uint32_t shard_count(const char *s, size_t n, const char *arg)
{
    uint64_t v = 0;
    if (n == 0 || n > 10)
        kvp_cli_usage_error("--shard: '%s' is not K/N with 0 <= K < N", arg);
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            kvp_cli_usage_error("--shard: '%s' is not K/N with 0 <= K < N (digits only)", arg);
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v > UINT32_MAX)
        kvp_cli_usage_error("--shard: '%s': N is at most %u", arg, UINT32_MAX);
    return (uint32_t)v;
}

/* --shard K/N */
static void parse_shard(const char *arg, uint32_t *k, uint32_t *n)
{
    const char *slash = strchr(arg, '/');
    if (!slash)
        kvp_cli_usage_error("--shard: '%s' is not K/N with 0 <= K < N", arg);
    *k = shard_count(arg, (size_t)(slash - arg), arg);
    *n = shard_count(slash + 1, strlen(slash + 1), arg);
    if (*n == 0 || *k >= *n)
        kvp_cli_usage_error("--shard: '%s' is not K/N with 0 <= K < N", arg);
}

/* --progress: the clock started and the job's total, where the input says
 * it up front (a prompts file, or one prompt; a stream or standard input
 * is counted as it comes). */
static uint64_t resumed_skips(const void *js) { return kvp_jobsrc_skipped(js); }

static void start_progress(kvp_progress *pg, const kvp_runopts *o, const kvp_jobsrc *js, uint32_t shard_k,
                           uint32_t shard_n, const kvp_idset *done, double interval)
{
    kvp_err err = {0};
    uint64_t n = 1;
    int known = o->prompt || o->tokens, live_skips = 0;
    if (o->file) {
        if (kvp_prompts_count_file(o->file, &n, &err) < 0)
            kvp_cli_die_err(&err);
        known = n > 0; /* 0: standard input or a pipe (an empty file fails as the job starts) */
        n = kvp_progress_shard_count(n, shard_k, shard_n);
        /* --resume: the ids read through once, so the total is right from
         * the start; a file that does not read whole gets them subtracted
         * as the job reaches them */
        uint64_t pending;
        if (known && done) {
            if (kvp_jobsrc_count_pending(o->file, shard_k, shard_n, done, &pending) == 0)
                n = pending;
            else
                live_skips = 1;
        }
    }
    kvp_progress_init(pg, stderr, kvp_cli_prog(), interval, n, known);
    if (live_skips)
        pg->skipped = resumed_skips, pg->skipped_ctx = js;
}

int kvp_decode_main(int argc, char **argv, int spec)
{
    kvp_cli_init(argv[0]);
    kvp_cli_set_usage_quiet(kvp_comm_launched_rank() > 0); /* under mpirun: rank 0 says it once */
    kvp_runopts o;
    kvp_runopts_init(&o);
    /* the shared options, ours, the zero entry: sized by the compiler */
    static const struct option own[] = {
        {"slo-ttft", required_argument, NULL, OPT_SLO_TTFT},
        {"slo-tpot", required_argument, NULL, OPT_SLO_TPOT},
        {"min-goodput", required_argument, NULL, OPT_MIN_GOODPUT},
        {"resume", required_argument, NULL, OPT_RESUME},
        {"shard", required_argument, NULL, OPT_SHARD},
        {"progress", optional_argument, NULL, OPT_PROGRESS},
        {"rate", required_argument, NULL, OPT_RATE},
        {"burstiness", required_argument, NULL, OPT_BURST},
        {"no-prefix-cache", no_argument, NULL, OPT_NO_PREFIX_CACHE},
        {"cache-salt", required_argument, NULL, OPT_CACHE_SALT},
        {"max-model-len", required_argument, NULL, OPT_MAX_MODEL_LEN},
        /* specdec's: the last entries, left out of decode's table */
        {"method", required_argument, NULL, OPT_METHOD},
        {"draft-len", required_argument, NULL, OPT_DRAFT_LEN},
        {"ngram-min", required_argument, NULL, OPT_NGRAM_MIN},
        {"ngram-max", required_argument, NULL, OPT_NGRAM_MAX},
        {"draft", required_argument, NULL, OPT_DRAFT},
        {"compare", no_argument, NULL, OPT_COMPARE},
        {"selftest", no_argument, NULL, OPT_SELFTEST},
        {"greedy-drafts", no_argument, NULL, OPT_GREEDY_DRAFTS},
        {"draft-layers", required_argument, NULL, OPT_DRAFT_LAYERS},
        {"profile", required_argument, NULL, OPT_PROFILE},
        {"profile-reps", required_argument, NULL, OPT_PROFILE_REPS},
        {"heads", required_argument, NULL, OPT_HEADS},
        {"train-heads", required_argument, NULL, OPT_TRAIN_HEADS},
        {"n-heads", required_argument, NULL, OPT_N_HEADS},
        {"epochs", required_argument, NULL, OPT_EPOCHS},
        {"lr", required_argument, NULL, OPT_LR},
        {"branches", required_argument, NULL, OPT_BRANCHES},
        {"train-samples", required_argument, NULL, OPT_TRAIN_SAMPLES},
    };
    enum { N_SPEC_OPTS = 18 };
    heads_cli hc = {0};
    int greedy_drafts = 0;
    uint32_t draft_layers = 0; /* layerskip: 0 for half the model's */
    const char *draft_path = NULL;
    int compare = 0;
    const char *profile = NULL;      /* --profile FILE */
    kvp_spec_profile_opts po = {0};
    size_t n_own = sizeof own / sizeof own[0] - (spec ? 0 : N_SPEC_OPTS);
    struct option longopts[KVP_RUNOPTS_N_LONG + sizeof own / sizeof own[0] + 1];
    kvp_runopts_table(longopts, own, n_own);
    spec_info sp = {.method = spec ? "ngram" : NULL, .draft_len = 8, .adaptive = 1};
    /* n-grams of 2 and 3: a single-token match was a guess that failed more
     * often than it paid (specdec --profile on scripts/spec-grounded.jsonl,
     * K 4, q8_0, Intel Xeon with AMX: verify steps 523 -> 367, none kept in
     * 228 -> 96 of them, generation 1.79x -> 1.84-1.86x; 3 alone 1.77x) */
    kvp_ngram_drafter ngram = {.min_n = 2, .max_n = 3};
    double slo_ttft = 0, slo_tpot = 0, min_goodput = -1;
    const char *resume = NULL;
    uint32_t shard_k = 0, shard_n = 0;
    double progress = -1; /* --progress: seconds between lines (0: the default); -1 off */
    double rate = 0, burstiness = 1;
    int burst_set = 0, method_set = 0, auto_given = 0; /* auto_given: --draft-len auto said (it is the default) */
    int ngram_set = 0;
    int no_prefix_cache = 0;
    uint64_t cache_salt = 0;
    int c;
    kvp_cli_note_optional_values(argc, argv, longopts);
    while ((c = getopt_long(argc, argv, spec ? KVP_RUNOPTS_SHORT "ho:" : KVP_RUNOPTS_SHORT "h", longopts, NULL)) !=
           -1) {
        if (kvp_runopts_parse(&o, c, optarg) || (spec && parse_heads_opt(&hc, c, optarg)))
            continue;
        if (c == OPT_SLO_TTFT || c == OPT_SLO_TPOT) {
            const char *name = c == OPT_SLO_TTFT ? "--slo-ttft" : "--slo-tpot";
            double ms = kvp_cli_opt_f64(name, optarg, 0, 1e9);
            /* 0 is no bound where the metrics keep it: a gate that passed every request */
            if (ms <= 0)
                kvp_cli_usage_error("%s: a bound in milliseconds above 0 (every TTFT and TPOT is above 0)", name);
            *(c == OPT_SLO_TTFT ? &slo_ttft : &slo_tpot) = ms / 1e3;
            continue;
        }
        if (c == OPT_MIN_GOODPUT) {
            min_goodput = kvp_cli_opt_f64("--min-goodput", optarg, 0, 1);
            continue;
        }
        if (c == OPT_NO_PREFIX_CACHE) {
            no_prefix_cache = 1;
            o.kv.no_cache = 1;
            continue;
        }
        if (c == OPT_CACHE_SALT) {
            if (!optarg[0])
                kvp_cli_usage_error("--cache-salt: empty");
            cache_salt = kvp_xxh64(optarg, strlen(optarg), 0) | 1;
            continue;
        }
        if (c == OPT_MAX_MODEL_LEN) {
            o.max_model_len = (uint32_t)kvp_cli_opt_i64("--max-model-len", optarg, 1, UINT32_MAX);
            continue;
        }
        if (c == OPT_RATE) {
            rate = kvp_cli_opt_f64("--rate", optarg, 1e-6, 1e9);
            continue;
        }
        if (c == OPT_BURST) {
            burstiness = kvp_cli_opt_f64("--burstiness", optarg, 1e-3, 1e3);
            burst_set = 1;
            continue;
        }
        if (c == OPT_RESUME) {
            resume = optarg;
            continue;
        }
        if (c == OPT_PROGRESS) {
            progress = kvp_progress_opt(optarg);
            continue;
        }
        if (c == OPT_METHOD) {
            method_set = 1;
            if (strcmp(optarg, "ngram") == 0)
                sp.method = "ngram";
            else if (strcmp(optarg, "draft") == 0)
                sp.method = "draft";
            else if (strcmp(optarg, "layerskip") == 0)
                sp.method = "layerskip";
            else if (strcmp(optarg, "heads") == 0)
                sp.method = "heads";
            else
                kvp_cli_usage_error("--method: '%s': use ngram, draft, layerskip or heads", optarg);
            continue;
        }
        if (c == OPT_DRAFT) {
            draft_path = kvp_cli_opt_path("--draft", optarg);
            continue;
        }
        if (c == OPT_COMPARE) {
            compare = 1;
            continue;
        }
        if (c == OPT_SELFTEST) {
            /* no model, no options: anything beside it would be ignored */
            if (argc != 2)
                kvp_cli_usage_error("--selftest runs alone: no other option or argument");
            return selftest();
        }
        if (c == OPT_GREEDY_DRAFTS) {
            greedy_drafts = 1;
            continue;
        }
        if (c == OPT_DRAFT_LAYERS) {
            draft_layers = (uint32_t)kvp_cli_opt_i64("--draft-layers", optarg, 1, 4096);
            continue;
        }
        if (c == OPT_DRAFT_LEN) {
            sp.adaptive = auto_given = strcmp(optarg, "auto") == 0;
            if (!sp.adaptive)
                sp.draft_len = kvp_spec_profile_parse_lens(optarg, po.ks, &po.n_k);
            continue;
        }
        if (c == OPT_PROFILE || c == OPT_PROFILE_REPS) {
            if (c == OPT_PROFILE)
                profile = optarg;
            else
                po.reps = (uint32_t)kvp_cli_opt_i64("--profile-reps", optarg, 1, 100);
            continue;
        }
        if (c == OPT_NGRAM_MIN || c == OPT_NGRAM_MAX) {
            uint32_t v = (uint32_t)kvp_cli_opt_i64(c == OPT_NGRAM_MIN ? "--ngram-min" : "--ngram-max", optarg, 1, 64);
            *(c == OPT_NGRAM_MIN ? &ngram.min_n : &ngram.max_n) = v;
            ngram_set = 1;
            continue;
        }
        if (c == OPT_SHARD) {
            parse_shard(optarg, &shard_k, &shard_n);
            continue;
        }
        if (c == 'h' || c == KVP_OPT_HELP) {
            usage(stdout, spec);
            return kvp_cli_close_stdout();
        }
        if (c == KVP_OPT_VERSION)
            kvp_cli_version();
        kvp_cli_bad_option(argv, spec ? KVP_RUNOPTS_SHORT "ho:" : KVP_RUNOPTS_SHORT "h", longopts);
    }
    kvp_progress_bare_check(progress == 0, argc, argv, optind);
    kvp_runopts_set_budget(&o);
    if (!o.model)
        kvp_cli_usage_error("no model (-m MODEL)");
    int use_heads = sp.method && strcmp(sp.method, "heads") == 0;
    if ((hc.job.prompts || use_heads) && (o.tp > 1 || o.pp > 1))
        kvp_cli_usage_error("Medusa heads run in one process: no --tp or --pp");
    if (po.reps && !profile)
        kvp_cli_usage_error("--profile-reps goes with --profile");
    if (hc.job.prompts) {
        if (optind < argc)
            kvp_cli_usage_error("--train-heads takes no KV stream");
        /* a generating run's options, which training would ignore (its
         * report is text on standard error: --json too) */
        const given_opt run_opts[] = {
            {method_set, "--method"}, {draft_path != NULL, "--draft"}, {hc.path != NULL, "--heads"},
            {compare, "--compare"}, {profile != NULL, "--profile"}, {o.kv_out != NULL, "--kv-out"},
            {resume != NULL, "--resume"}, {hc.branches != 0, "--branches"}, {po.n_k || auto_given, "--draft-len"},
            {ngram_set, "--ngram-min/--ngram-max"}, {rate > 0, "--rate"}, {burst_set, "--burstiness"},
            {shard_n != 0, "--shard"}, {greedy_drafts, "--greedy-drafts"}, {draft_layers != 0, "--draft-layers"},
            {o.stats, "--stats"}, {progress >= 0, "--progress"}, {slo_ttft > 0, "--slo-ttft"},
            {slo_tpot > 0, "--slo-tpot"}, {min_goodput >= 0, "--min-goodput"}, {o.json, "--json"}};
        const char *bad = first_given(run_opts, sizeof run_opts / sizeof run_opts[0]);
        if (bad)
            kvp_cli_usage_error("--train-heads trains and exits: %s is a generating run's option, which it would "
                                "ignore", bad);
        return train_heads(&o, &hc);
    }
    if (hc.job.out || hc.tuned)
        kvp_cli_usage_error("-o, --n-heads, --epochs, --lr and --train-samples go with --train-heads");
    if (hc.branches && profile) /* not --method heads, which --profile refuses */
        kvp_cli_usage_error("--profile runs --heads as a chain (a guess of one token a head): no --branches");
    if (hc.branches && !use_heads)
        kvp_cli_usage_error("--branches goes with --method heads");
    if (use_heads != (hc.path != NULL) && !profile)
        kvp_cli_usage_error(use_heads ? "--method heads needs --heads FILE (specdec --train-heads makes one)"
                                      : "--heads FILE goes with --method heads");
    if (ngram.min_n > ngram.max_n)
        kvp_cli_usage_error("--ngram-min %u is above --ngram-max %u", ngram.min_n, ngram.max_n);
    /* prompt lookup's lengths: another drafter would ignore them */
    if (ngram_set && sp.method && strcmp(sp.method, "ngram") && !profile)
        kvp_cli_usage_error("--ngram-min/--ngram-max goes with --method ngram or --profile (not --method %s)",
                            sp.method);
    int use_draft = sp.method && strcmp(sp.method, "draft") == 0;
    if (use_draft && !draft_path)
        kvp_cli_usage_error("--method draft needs --draft MODEL");
    if (draft_path && !use_draft && !profile)
        kvp_cli_usage_error("--draft MODEL goes with --method draft or --profile");
    int use_skip = sp.method && strcmp(sp.method, "layerskip") == 0;
    if (greedy_drafts && profile)
        kvp_cli_usage_error("--profile drafts greedily already (every run's text is plain decoding's): no "
                            "--greedy-drafts");
    if (greedy_drafts && !use_draft && !use_skip)
        kvp_cli_usage_error("--greedy-drafts goes with --method draft or layerskip");
    if (draft_layers && !use_skip && !profile)
        kvp_cli_usage_error("--draft-layers goes with --method layerskip or --profile");
    if (po.n_k > 1 && !profile)
        kvp_cli_usage_error("--draft-len: a list of lengths goes with --profile");
    int from_prompts = o.prompt || o.file || o.tokens;
    if (profile) {
        /* a job of its own: the prompts of FILE alone, one request at a
         * time as they come (no arrivals, no SLOs: no goodput to gate), in
         * one process, its table the report */
        const given_opt job_opts[] = {
            {o.prompt != NULL, "-p"}, {o.file != NULL, "-f"}, {o.tokens != NULL, "--tokens"},
            {optind < argc, "KV stream"}, {compare, "--compare"}, {resume != NULL, "--resume"},
            {o.kv_out != NULL, "--kv-out"}, {rate > 0, "--rate"}, {burst_set, "--burstiness"},
            {shard_n != 0, "--shard"}, {progress >= 0, "--progress"}, {o.stats, "--stats"},
            {slo_ttft > 0, "--slo-ttft"}, {slo_tpot > 0, "--slo-tpot"}, {min_goodput >= 0, "--min-goodput"},
            {o.tp > 1, "--tp"}, {o.pp > 1, "--pp"}, {cache_salt != 0, "--cache-salt"}};
        const char *bad = first_given(job_opts, sizeof job_opts / sizeof job_opts[0]);
        if (bad)
            kvp_cli_usage_error("--profile FILE runs the prompts of FILE alone, one request at a time, in one "
                                "process, its table the report: no %s", bad);
        /* it runs every method it can, each at fixed lengths */
        if (method_set)
            kvp_cli_usage_error("--profile runs every method it can (ngram, layerskip, and draft or heads when "
                                "--draft or --heads names them): no --method");
        if (auto_given)
            kvp_cli_usage_error("--profile times fixed draft lengths: --draft-len K or a list K,K,... (not auto)");
        const char *pin[] = {o.model, profile, draft_path, hc.path};
        const char *pname[] = {"the model (-m -)", "the prompts (--profile -)", "the draft model (--draft -)",
                               "the heads (--heads -)"};
        stdin_once(pin, pname, sizeof pin / sizeof pin[0]);
        o.file = profile;
        po.draft = draft_path;
        po.heads = hc.path;
        po.draft_layers = draft_layers;
        po.ngram = ngram;
        int rc = kvp_spec_profile_main(&o, &po);
        kvp_runopts_free(&o);
        return rc;
    }
    if ((o.prompt != NULL) + (o.file != NULL) + (o.tokens != NULL) > 1)
        kvp_cli_usage_error("give one of -p, -f and --tokens");
    kvp_runopts_check_prompt_args(&o);
    if (from_prompts && optind < argc)
        kvp_cli_usage_error("a KV stream and prompts at once%s", kvp_cli_operand_hint(argc, argv, optind));
    if (optind + 1 < argc)
        kvp_cli_usage_error("more than one KV stream%s", kvp_cli_operand_hint(argc, argv, optind));
    /* a KV stream's prompts were rendered and tokenized by prefill: an
     * option that renders or tokenizes prompts would be ignored */
    if (!from_prompts && (o.chat || o.system || o.no_special))
        kvp_cli_usage_error("%s renders prompts, and a KV stream's were rendered by prefill: give it there (prefill "
                            "--resume --chat for a conversation's next turn)",
                            o.chat ? "--chat" : o.system ? "--system" : "--no-special");
    /* "--stats FILE" (or --progress S) with a space: getopt takes the
     * value for the KV stream, which then fails on its first bytes, or as
     * missing, with no word of why; a stream written there is ambiguous
     * too, so it goes before the option or on standard input */
    if (optind < argc && *kvp_cli_operand_hint(argc, argv, optind))
        kvp_cli_usage_error("'%s' is taken for the KV stream%s; a stream of that name goes before the option, or "
                            "on standard input", argv[optind], kvp_cli_operand_hint(argc, argv, optind));
    const char *kv_in = optind < argc ? argv[optind] : "-";
    if (!from_prompts && !strcmp(o.model, "-") && !strcmp(kv_in, "-"))
        kvp_cli_usage_error("-m -: the model is read from standard input, so the KV stream cannot be (give it as a "
                            "file, or -p, -f or --tokens)");
    const char *in_paths[] = {o.model, o.file, from_prompts ? NULL : kv_in, draft_path, hc.path};
    const char *in_names[] = {"the model (-m -)", "the prompts (-f -)",
                              strcmp(kv_in, "-") || optind < argc ? "the KV stream (-)"
                                                                  : "the KV stream (standard input without -p, -f "
                                                                    "or --tokens)",
                              "the draft model (--draft -)", "the heads (--heads -)"};
    stdin_once(in_paths, in_names, sizeof in_paths / sizeof in_paths[0]);
    kvp_err err = {0};
    if (kvp_sample_check(&o.sampling, &err) < 0)
        kvp_cli_usage_error("%s", err.msg);

    if (resume && o.kv_out)
        kvp_cli_usage_error("--resume and --kv-out at once (a resumed job's KV state would be partial)");
    if (resume && !*resume)
        kvp_cli_usage_error("--resume: an empty file name");
    /* read back, cut to its whole lines and appended to: a file, not a
     * stream (a pipe's reader would wait on itself) */
    struct stat rst;
    if (resume && (!strcmp(resume, "-") || (stat(resume, &rst) == 0 && !S_ISREG(rst.st_mode))))
        kvp_cli_usage_error("--resume %s: not a regular file (the results are read back, cut to whole lines and "
                            "appended to)", resume);
    /* a regular file standard output writes to ("> out.jsonl", or ">>
     * log" with --resume /dev/stdout): the shell has emptied it, or it
     * holds what else the job prints */
    if (resume && kvp_cli_is_stdout(resume))
        kvp_cli_usage_error("--resume %s is standard output's file: give the results file by its name, with standard "
                            "output elsewhere", resume);
    /* the results go to standard output as they come, the KV stream's
     * records between them would be neither text nor a stream */
    if (o.kv_out && kvp_cli_is_stdout(o.kv_out))
        kvp_cli_usage_error("--kv-out %s: standard output carries the results; give --kv-out a file", o.kv_out);
    /* --stats=FILE is written at the end: into the results, not beside them */
    if (o.stats_file && !resume && kvp_cli_is_stdout(o.stats_file))
        kvp_cli_usage_error("--stats=%s: standard output carries the results (--stats alone writes to standard "
                            "error)", o.stats_file);
    if (o.kv_out && !*o.kv_out)
        kvp_cli_usage_error("--kv-out: an empty file name");
    /* two outputs in one file: the last written would replace the other */
    if (o.stats_file && resume && kvp_cli_same_path(o.stats_file, resume))
        kvp_cli_usage_error("--stats=%s is the --resume results file: write the statistics to another file",
                            o.stats_file);
    if (o.stats_file && o.kv_out && kvp_cli_same_path(o.stats_file, o.kv_out))
        kvp_cli_usage_error("--stats=%s is the --kv-out stream: write the statistics to another file", o.stats_file);
    const char *input = from_prompts ? o.file : kv_in; /* NULL: -p or --tokens */
    const char *what = from_prompts ? "prompts file" : "KV stream read";
    /* an output naming an input would destroy it: refused before anything
     * is read (a KV stream continued into itself, decode story.kvp --kv-out
     * story.kvp, is no such mistake: it is read whole before --kv-out
     * replaces it) */
    if (input) {
        kvp_cli_refuse_same("--resume ", resume, input, what);
        kvp_cli_refuse_same("--stats=", o.stats_file, input, what);
        if (from_prompts)
            kvp_cli_refuse_same("--kv-out ", o.kv_out, input, what);
    }
    kvp_cli_refuse_stdout_input(input, what);
    const char *ins[][2] = {{o.model, "model"}, {draft_path, "draft model"}, {hc.path, "heads file"}};
    for (size_t i = 0; i < sizeof ins / sizeof ins[0]; i++) {
        kvp_cli_refuse_stdout_input(ins[i][0], ins[i][1]);
        kvp_cli_refuse_same("--resume ", resume, ins[i][0], ins[i][1]);
        kvp_cli_refuse_same("--stats=", o.stats_file, ins[i][0], ins[i][1]);
        kvp_cli_refuse_same("--kv-out ", o.kv_out, ins[i][0], ins[i][1]);
    }
    if (burst_set && rate <= 0)
        kvp_cli_usage_error("--burstiness shapes --rate's arrivals: give --rate too");
    kvp_cli_check_output("--stats=", o.stats_file); /* written when the job ends: a bad name fails now */
    if (compare && (!from_prompts || resume || o.kv_out || rate > 0))
        kvp_cli_usage_error("--compare runs the requests twice: it takes prompts (-p, -f, --tokens), not a KV "
                            "stream, --resume, --kv-out or --rate");

    int follower = kvp_run_tp_follow(&o); /* --tp: ranks past 0 compute, rank 0 goes on */
    if (follower >= 0) {
        kvp_runopts_free(&o);
        return follower;
    }
    kvp_idset done;
    kvp_idset_init(&done);
    out_ctx oc = {.spec = spec, .fd = STDOUT_FILENO, .out_name = "standard output"};
    if (resume) {
        oc.fd = open_resume(resume, &done);
        oc.out_name = resume;
        oc.resume = 1;
    }
    kvp_run r;
    kvp_jobsrc *js = NULL;
    compare_ctx cmp = {0};
    kvp_prompts_once once = {.fd = -1};
    kvp_metrics metrics;
    kvp_metrics_init(&metrics, slo_ttft, slo_tpot);
    job_open jo = {.o = &o, .r = &r, .metrics = &metrics, .sp = &sp, .input = from_prompts ? "prompts" : "kvp",
                   .once = &once, .resume = resume, .t0 = kvp_gen_now()};
    if (compare && o.file) /* first: a missing file fails before the model loads */
        read_compare_prompts(&once, &o, &jo);
    kvp_stopsig_catch_loading();
    if (kvp_run_open(&r, &o, &err) < 0)
        kvp_cli_die_err(&err);
    /* before any read that may wait (a pipe's first request): a signal
     * there is a stop like any other */
    kvp_stopsig_catch();
    jo.t0 = kvp_gen_now(); /* a stop's seconds: the wait for input, not the load */
    if (kvp_stopsig_caught()) /* while the model loaded, or --compare read its prompts */
        stop_before_input(&jo);
    if (compare) {
        /* decode's run first, on a cache of its own (so neither run finds the
         * other's prompts cached) */
        kvp_metrics m0;
        kvp_metrics_init(&m0, 0, 0);
        kvp_batch_opts bo0 = {.sched = o.sched, .no_prefix_cache = no_prefix_cache, .metrics = &m0,
                              .stop = kvp_stopsig_flag()};
        if (kvp_jobsrc_open(&js, &r, &o, kv_in, cache_salt, &err) < 0)
            open_failed(&err, &jo);
        kvp_jobsrc_filter(js, shard_k, shard_n, NULL);
        kvp_batch_source src0 = kvp_jobsrc_source(js);
        if (kvp_batch_run(r.engine, r.kc, r.tok, &bo0, &src0, compare_collect, &cmp, &cmp.st, &err) < 0)
            die_job(&err, &once);
        /* a measurement of no request would print a speedup of nothing */
        if (o.file && kvp_jobsrc_read_all(js) && kvp_jobsrc_total(js) == 0)
            kvp_cli_die("%s: no prompt in the file: nothing to compare", once.fd >= 0 ? once.file : o.file);
        if (cmp.n) /* a shard of no request has no array: qsort wants one all the same */
            qsort(cmp.v, cmp.n, sizeof *cmp.v, ref_cmp);
        kvp_metrics_free(&m0);
        kvp_jobsrc_free(js);
        kvp_engine_free(r.engine);
        kvp_kvcache_free(r.kc);
        r.engine = NULL;
        r.kc = NULL;
        cmp.sampled_drafts = (use_draft || use_skip) && !greedy_drafts;
        oc.cmp = &cmp;
        sp.cmp = &cmp;
    }
    jo.t0 = kvp_gen_now(); /* after --compare's run: the wait alone */
    if (kvp_jobsrc_open(&js, &r, &o, kv_in, cache_salt, &err) < 0)
        open_failed(&err, &jo);
    kvp_jobsrc_filter(js, shard_k, shard_n, resume ? &done : NULL);
    kvp_jobsrc_arrivals(js, rate, burstiness, o.sampling.seed);
    if (o.json || resume || shard_n) /* --shard 0/1 too: shards merge by id */
        oc.form = FORM_JSON;
    settle_from_input(&oc, js); /* -p, --tokens: one request, known at open */
    kvp_kvcache_get_stats(r.kc, &oc.kv);
    kvp_drafter drafter = {.ctx = &ngram, .draft = kvp_ngram_draft, .cheap = 1};
    kvp_run dr = {0};
    kvp_draft_model dm = {0};
    if (use_draft || use_skip) {
        uint32_t nl = kvp_run_loaded(&r)->cfg.n_layer, keep = draft_layers ? draft_layers : (nl + 1) / 2;
        if (use_skip && keep > nl)
            kvp_cli_die("--draft-layers %u: %s has %u layers", keep, o.model, nl);
        if ((use_draft ? kvp_run_open_draft(&dr, &r, &o, draft_path, &err)
                       : kvp_run_open_layerskip(&dr, &r, &o, keep, &err)) < 0 ||
            kvp_draft_model_init(&dm, dr.engine, dr.kc, &err) < 0)
            kvp_cli_die_err(&err);
        dm.chunk = o.chunk;
        dm.on_target = dr.kc_borrowed;
        drafter = (kvp_drafter){.ctx = &dm, .draft = kvp_draft_model_draft,
                                .draft_sampled = greedy_drafts ? NULL : kvp_draft_model_draft_sampled,
                                .draft_batch = kvp_draft_model_draft_batch, .on_target_cache = dm.on_target,
                                .release = kvp_draft_model_release};
    }
    kvp_heads heads = {0};
    kvp_heads_drafter hd = {0};
    if (use_heads) {
        const kvp_model *tm = kvp_run_loaded(&r);
        if (kvp_heads_read(&heads, hc.path, &err) < 0 ||
            kvp_heads_check_model(&heads, hc.path, tm->fingerprint, tm->cfg.n_embd, &err) < 0 ||
            kvp_heads_drafter_init(&hd, &heads, r.engine, &err) < 0)
            kvp_cli_die_err(&err);
        drafter = (kvp_drafter){.ctx = &hd, .draft_hidden = kvp_heads_draft};
        /* a head guesses one position: past the file's heads no draft can
         * be made, so none is asked for, nor reported (--stats) */
        if (sp.draft_len > heads.n_heads)
            sp.draft_len = heads.n_heads;
    }
    kvp_batch_opts bo = {.sched = o.sched, .keep_finished = o.kv_out != NULL, .no_prefix_cache = no_prefix_cache,
                         .metrics = &metrics, .stop = kvp_stopsig_flag(), .drafter = spec ? &drafter : NULL,
                         .draft_len = sp.draft_len, .draft_adaptive = sp.adaptive, .draft_branches = hc.branches};
    settling_src settling = {.inner = kvp_jobsrc_source(js), .oc = &oc, .js = js};
    kvp_batch_source src = {.ctx = &settling, .next = settling_next};
    kvp_batch_stats st;
    kvp_progress pg;
    step_hooks hooks = {0};
    if (progress >= 0) {
        start_progress(&pg, &o, js, shard_k, shard_n, resume ? &done : NULL, progress);
        hooks.pg = &pg;
    }
    /* --kv-out opened before the run, so a path that cannot be written
     * fails before the work; each request goes into it as it finishes */
    kvp_kvout ko = {0};
    if (o.kv_out) {
        if (kvp_kvout_open(&ko, &r, o.kv_out, spec ? "specdec " KVP_VERSION : "decode " KVP_VERSION, &err) < 0)
            kvp_cli_die_err(&err);
        hooks.ko = oc.ko = &ko;
    }
    if (hooks.pg || hooks.ko)
        bo.on_step = on_step, bo.on_step_ctx = &hooks;
    fflush(stdout);
    int run_rc = kvp_batch_run(r.engine, r.kc, r.tok, &bo, &src, emit, &oc, &st, &err);
    settle_form(&oc, FORM_JSON); /* stopped or failed before the input told: not known to be one */
    if (progress >= 0) /* the last line, before any message: a terminal's line is ended */
        kvp_progress_end(&pg, &st);
    if (oc.ko && (run_rc < 0 || hd.failed || st.stopped)) { /* a stopped run's state would be partial */
        kvp_kvout_abort(oc.ko);
        oc.ko = NULL;
    }
    if (run_rc < 0)
        die_job(&err, &once);
    if (hd.failed) /* the run finished without drafts; what broke them is still a fault */
        kvp_cli_die_err(&hd.err);
    /* an empty prompts file or pipe is a job of no request (a cron night
     * with nothing to do), as a shard given none is: said, not failed */
    if (o.file && kvp_jobsrc_read_all(js) && kvp_jobsrc_total(js) == 0)
        kvp_cli_warn("note: %s: no prompt in the file: no request to run", once.fd >= 0 ? once.file : o.file);
    /* a KV stream whose producer (prefill) was stopped: whole, yet not all
     * that was asked for; said below, the status says the job is not done,
     * and --kv-out's stream says so too */
    kvp_stop_rec in_stop;
    int in_stopped = !st.stopped && kvp_jobsrc_input_stopped(js, &in_stop);
    if (st.stopped && oc.mid_line) /* the streamed text ends its line, as when it finishes */
        fputc('\n', stdout);
    /* Every output whole before any is renamed into place: --stats=FILE
     * and the --kv-out stream sealed under their temporary names, the
     * results printed (standard output flushed, --resume's lines on disk),
     * then the two renames back to back, so that a failure on the way (a
     * full disk under the statistics, a closed standard output) leaves
     * neither file, not a stream in place beside a failed job. */
    run_info ri = {.model = o.model, .input = jo.input, .kv = oc.kv};
    kvp_out stats_out = {.fd = -1};
    if (o.stats) {
        ri.block_size = kvp_kvcache_pool(r.kc)->block_size;
        ri.kv_dtype = kvp_kvcache_pool(r.kc)->dtype;
        kvp_model_fingerprint_hex(r.model, ri.fingerprint);
    }
    if (o.stats_file)
        seal_stats(&o, &st, &metrics, &ri, &sp, &stats_out);
    if (oc.ko && kvp_kvout_seal(oc.ko, in_stopped ? &in_stop : NULL, &err) < 0)
        kvp_cli_die_err(&err);
    if (oc.ko || o.stats_file)
        kvp_cli_check_stdout();
    /* The job's lines on disk before it says it is done: a cron job that
     * then moves on must not lose them to a crash (a line lost earlier is
     * only run again; --resume keeps the file's whole lines). */
    if (resume && kvp_fsync(oc.fd) != 0)
        kvp_cli_die("%s: cannot flush to disk: %s", resume, strerror(errno));
    if (resume && close(oc.fd) != 0)
        kvp_cli_die("%s: %s", resume, strerror(errno));
    kvp_out *outs[2];
    size_t n_outs = 0;
    if (oc.ko)
        outs[n_outs++] = &oc.ko->sv.out;
    if (o.stats_file)
        outs[n_outs++] = &stats_out;
    if (kvp_out_commit_all(outs, n_outs, &err) < 0 || (oc.ko && kvp_kvout_commit(oc.ko, &err) < 0))
        kvp_cli_die_err(&err);
    if (o.stats && !o.stats_file)
        write_stats(&o, &st, &metrics, &ri, &sp);
    else if (!o.stats && compare) /* --compare says what it found even without --stats */
        compare_line(stderr, kvp_cli_prog(), &st, &cmp);
    /* requests read so far: the whole input unless the run stopped early */
    uint64_t n_asked = kvp_jobsrc_total(js) - kvp_jobsrc_skipped(js);
    if (st.stopped)
        kvp_stopsig_say(st.requests, n_asked - st.requests, kvp_jobsrc_read_all(js), resume);
    kvp_idset_free(&done);
    kvp_jobsrc_free(js);
    if (use_draft || use_skip) {
        kvp_draft_model_free(&dm);
        kvp_run_close_draft(&dr);
    }
    kvp_heads_drafter_free(&hd);
    kvp_heads_free(&heads);
    double goodput = 0;
    int has_goodput = kvp_metrics_goodput(&metrics, &goodput);
    kvp_metrics_free(&metrics);
    kvp_run_close(&r);
    kvp_prompts_once_close(&once);
    kvp_runopts_free(&o);
    int rc = kvp_cli_close_stdout();
    if (st.stopped)
        return kvp_stopsig_status();
    /* every finding is said; the status is the gravest: a failure (1)
     * before a missed service level (3), so a cron job gating on 3 never
     * takes a failed job for a slow one */
    int missed = min_goodput >= 0 && has_goodput && goodput < min_goodput;
    /* no request ran: nothing to gate, said rather than passed as a perfect 1 */
    if (min_goodput >= 0 && !has_goodput)
        kvp_cli_warn("note: no requests, so no goodput: --min-goodput %.4f gates nothing", min_goodput);
    if (missed)
        kvp_cli_warn("goodput %.4f is below --min-goodput %.4f", goodput, min_goodput);
    free(cmp.v);
    if (cmp.differ) {
        kvp_cli_warn("--compare: %llu of %llu sequences differ from decode's output: a bug, please report it",
                     (unsigned long long)cmp.differ, (unsigned long long)(cmp.same + cmp.differ));
        rc = KVP_EXIT_FAIL;
    }
    if (oc.n_kv_memory) {
        kvp_cli_warn("%llu of %llu sequences did not fit in the KV cache%s", (unsigned long long)oc.n_kv_memory,
                     (unsigned long long)n_asked, oc.n_kv_memory < n_asked ? "; the others completed" : "");
        if (oc.ko && ko.left_out && ko.written)
            kvp_cli_warn("%s holds the other %llu (one with no KV has no state to keep)", o.kv_out,
                         (unsigned long long)ko.written);
        else if (oc.ko && ko.left_out)
            kvp_cli_warn("%s holds no sequence (one with no KV has no state to keep)", o.kv_out);
        rc = KVP_EXIT_FAIL;
    }
    /* a prompt that asked for no token ran no step: it has no KV, and its
     * absence from --kv-out would pass unseen */
    if (oc.ko && ko.left_out > oc.n_kv_memory)
        kvp_cli_warn("note: %s leaves out %llu request%s that asked for no token (max_tokens 0): %s no step, so "
                     "no KV to keep (prefill keeps a prompt's KV without generating)", o.kv_out,
                     (unsigned long long)(ko.left_out - oc.n_kv_memory), ko.left_out - oc.n_kv_memory == 1 ? "" : "s",
                     ko.left_out - oc.n_kv_memory == 1 ? "it ran" : "they ran");
    if (in_stopped) {
        kvp_run_say_input_cut(kv_in, &in_stop, "");
        rc = KVP_EXIT_FAIL;
    }
    return rc ? rc : missed ? 3 : 0;
}
