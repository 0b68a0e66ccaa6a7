/* decode - generate tokens over a paged KV cache, for every sequence of a
 * batch together: from a KVP stream that prefill wrote (stdin or FILE), or
 * from prompts it prefills itself. */
#include "cli.h"
#include "runopts.h"
#include "sample.h"
#include "batch.h"
#include "seqio.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: decode -m MODEL [options] [KV.kvp]     continue what prefill began (stdin when no file)\n"
            "       decode -m MODEL -p TEXT | -f FILE | --tokens IDS [options]\n"
            "Generate text for every sequence together, one batched step per token.\n\n"
            "%s"
            "      --stop STRING       stop a sequence at STRING (repeatable)\n"
            "      --ignore-eos        do not stop at end-of-generation tokens\n"
            "      --json              JSON Lines output (default when there are several sequences)\n"
            "      --kv-out FILE       write the final KV state as a KVP stream (resume with decode < FILE)\n"
            "      --slo-ttft MS, --slo-tpot MS  service-level bounds; --stats reports goodput (requests within both)\n"
            "      --min-goodput FRAC  exit 3 when fewer than FRAC of the requests met the SLOs\n"
            "  -h, --help, --version\n\n"
            "Exit status: 0 success, 1 runtime error (bad model, stream or prompts file, a sequence\n"
            "that does not fit in the KV cache alone), 2 usage error, 3 goodput below --min-goodput.\n",
            kvp_runopts_help);
}

typedef struct out_ctx {
    int stream_text;       /* one sequence, plain text streamed */
    const kvp_runopts *o;
    kvp_request **kept;    /* --kv-out: finished requests, kept with their KV */
    uint32_t n_kept;
    uint64_t n_kv_memory;  /* sequences that did not fit in the cache alone */
    kvp_kvcache_stats kv;  /* the cache's size, for that message */
} out_ctx;

static void print_line(const kvp_gen_seq *s)
{
    double ttft = s->t_first ? (s->t_first - s->t_start) * 1e3 : 0;
    double tpot = s->n_gen > 1 ? (s->t_last - s->t_first) * 1e3 / (s->n_gen - 1) : 0;
    fputs("{\"id\":", stdout);
    if (s->rec.label[0])
        kvp_cli_json_str(stdout, s->rec.label, strlen(s->rec.label));
    else
        printf("%llu", (unsigned long long)s->rec.id);
    fputs(",\"text\":", stdout);
    kvp_cli_json_str(stdout, (const char *)s->text.data, s->text.len);
    printf(",\"tokens\":%u,\"finish_reason\":\"%s\",\"ttft_ms\":%.2f,\"tpot_ms\":%.3f}\n", s->n_gen,
           kvp_gen_finish_name(s->rec.finish_reason), ttft, tpot);
}

static void emit(void *cp, kvp_gen_seq *s, const char *bytes, size_t n)
{
    out_ctx *c = cp;
    if (n == 0 && s->rec.finish_reason == KVP_FINISH_KV_MEMORY) {
        c->n_kv_memory++;
        if (s->rec.label[0])
            kvp_cli_warn("sequence %s: KV cache out of blocks: it needs more than all %u blocks of %llu bytes; "
                         "raise --kv-mem or --kv-blocks", s->rec.label, c->kv.n_blocks,
                         (unsigned long long)c->kv.block_bytes);
        else
            kvp_cli_warn("sequence %llu: KV cache out of blocks: it needs more than all %u blocks of %llu bytes; "
                         "raise --kv-mem or --kv-blocks", (unsigned long long)s->rec.id, c->kv.n_blocks,
                         (unsigned long long)c->kv.block_bytes);
    }
    if (c->stream_text) {
        fwrite(bytes, 1, n, stdout);
        if (n == 0)
            fputc('\n', stdout);
    } else if (n == 0) {
        print_line(s);
    }
    fflush(stdout);
    if (n == 0 && c->kept)
        c->kept[c->n_kept++] = kvp_request_of(s);
}

/* The run's summary: counts, throughput, the latency distributions and
 * goodput against the SLOs, as one JSON object. */
static void summary_json(FILE *f, const kvp_batch_stats *st, kvp_metrics *m, const kvp_runopts *o)
{
    double dt = st->seconds > 0 ? st->seconds : 1e-9;
    kvp_dist d;
    fprintf(f, "{\"requests\":%llu,\"kv_memory\":%llu,\"seconds\":%.3f,\"request_throughput\":%.3f,"
            "\"output_tokens\":%llu,\"output_throughput\":%.2f,\"prompt_tokens\":%llu,\"cached_prompt_tokens\":%llu,"
            "\"prefix_hit_rate\":%.4f,\"total_token_throughput\":%.2f,\"steps\":%llu,\"preemptions\":%llu,"
            "\"peak_kv_blocks\":%u,\"kv_blocks\":%u,\"block_size\":%u,\"max_num_seqs\":%u,\"max_batched_tokens\":%u,"
            "\"static\":%s,",
            (unsigned long long)st->requests, (unsigned long long)st->kv_memory, st->seconds,
            (double)st->requests / dt, (unsigned long long)st->generated, (double)st->generated / dt,
            (unsigned long long)st->prompt_tokens, (unsigned long long)st->cached_tokens,
            st->prompt_tokens ? (double)st->cached_tokens / (double)st->prompt_tokens : 0.0,
            (double)(st->generated + st->prompt_tokens) / dt, (unsigned long long)st->steps,
            (unsigned long long)st->preemptions, st->peak_blocks, st->total_blocks, o->kv.block_size,
            o->sched.max_num_seqs, o->sched.max_batched_tokens, o->sched.static_batch ? "true" : "false");
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
    fprintf(f, ",\"slo_ttft_ms\":%.3f,\"slo_tpot_ms\":%.3f,\"good_requests\":%llu,\"goodput\":%.4f,"
            "\"goodput_rps\":%.3f}\n", m->slo_ttft * 1e3, m->slo_tpot * 1e3, (unsigned long long)m->good,
            kvp_metrics_goodput(m), (double)m->good / dt);
}

static void summary_text(FILE *f, const kvp_batch_stats *st, kvp_metrics *m)
{
    double dt = st->seconds > 0 ? st->seconds : 1e-9;
    kvp_dist t, p, i, e;
    kvp_metrics_ttft(m, &t);
    kvp_metrics_tpot(m, &p);
    kvp_metrics_itl(m, &i);
    kvp_metrics_e2e(m, &e);
    fprintf(f, "decode: %llu sequences, %llu tokens in %.3f s (%.2f tokens/s, %.3f requests/s); %llu steps, %llu "
            "preemptions, peak %u of %u KV blocks; prompt tokens from the prefix cache %llu of %llu\n",
            (unsigned long long)st->requests, (unsigned long long)st->generated, st->seconds,
            (double)st->generated / dt, (double)st->requests / dt, (unsigned long long)st->steps,
            (unsigned long long)st->preemptions, st->peak_blocks, st->total_blocks,
            (unsigned long long)st->cached_tokens, (unsigned long long)st->prompt_tokens);
    fprintf(f, "decode: ms       mean      p50      p90      p99\n");
    const kvp_dist *ds[] = {&t, &p, &i, &e};
    const char *names[] = {"TTFT", "TPOT", "ITL", "E2E"};
    for (int k = 0; k < 4; k++)
        fprintf(f, "decode: %-4s %9.2f %8.2f %8.2f %8.2f\n", names[k], ds[k]->mean * 1e3, ds[k]->p50 * 1e3,
                ds[k]->p90 * 1e3, ds[k]->p99 * 1e3);
    if (m->slo_ttft > 0 || m->slo_tpot > 0)
        fprintf(f, "decode: goodput %.4f (%llu of %llu requests within TTFT %.0f ms and TPOT %.0f ms)\n",
                kvp_metrics_goodput(m), (unsigned long long)m->good, (unsigned long long)m->n, m->slo_ttft * 1e3,
                m->slo_tpot * 1e3);
}

/* --stats: on stderr (text, or JSON with --json), or JSON into FILE. */
static void write_stats(const kvp_runopts *o, const kvp_batch_stats *st, kvp_metrics *m)
{
    if (!o->stats_file) {
        if (o->json)
            summary_json(stderr, st, m, o);
        else
            summary_text(stderr, st, m);
        return;
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        kvp_cli_die("--stats=%s: out of memory", o->stats_file);
    summary_json(f, st, m, o);
    fclose(f);
    kvp_err err = {0};
    if (kvp_cli_write_atomic(o->stats_file, buf, len, &err) < 0)
        kvp_cli_die_err(&err);
    free(buf);
}

/* ---- request sources ---- */

/* Prompts from -p, -f or --tokens, tokenized. */
typedef struct prompt_src {
    const kvp_runopts *o;
    const kvp_tokenizer *tok;
    kvp_prompts ps;
    uint32_t **ids, *lens;
    uint32_t next;
} prompt_src;

static int prompt_next(void *ctx, int block, kvp_request **out, kvp_err *err)
{
    (void)block;
    prompt_src *p = ctx;
    if (p->next >= p->ps.n)
        return KVP_BATCH_END;
    uint32_t i = p->next++;
    kvp_sampling smp = p->o->sampling;
    kvp_sample_seed(&smp, i);
    kvp_request *r = kvp_request_new(p->tok, i, p->ps.p[i].label, p->ids[i], p->lens[i], &smp);
    free(p->ids[i]);
    p->ids[i] = NULL;
    if (!r)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    r->opts = (kvp_gen_opts){.stop = p->o->stop, .n_stop = p->o->n_stop, .ignore_eos = p->o->ignore_eos};
    *out = r;
    return 1;
}

/* Sequences of a KVP stream (prefill's output, or a saved --kv-out): each
 * becomes a request whose tokens are the stream's, its KV held by the
 * stream's sequence until the request reuses the blocks. */
typedef struct stream_src {
    const kvp_runopts *o;
    const kvp_tokenizer *tok;
    kvp_kvcache *kc;
    kvp_seqio_seq *ss;
    uint32_t n, next;
} stream_src;

static int stream_next(void *ctx, int block, kvp_request **out, kvp_err *err)
{
    (void)block;
    stream_src *p = ctx;
    if (p->next >= p->n)
        return KVP_BATCH_END;
    kvp_seqio_seq *q = &p->ss[p->next++];
    uint32_t len = kvp_kvcache_seq_len(p->kc, q->handle);
    kvp_request *r = kvp_request_new(p->tok, q->rec.id, q->rec.label, kvp_kvcache_seq_tokens(p->kc, q->handle), len,
                                     &q->rec.sampling);
    if (!r)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    r->holder = q->handle; /* its blocks serve the request's start, then go */
    r->g.rec = q->rec;
    r->n_prompt = q->rec.n_prompt;
    r->opts = (kvp_gen_opts){.stop = p->o->stop, .n_stop = p->o->n_stop, .ignore_eos = p->o->ignore_eos};
    kvp_runopts_apply_sampling(p->o, &r->g.rec.sampling);
    if (p->o->sampling_set & KVP_SET_SEED)
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

enum { OPT_SLO_TTFT = 0x2000, OPT_SLO_TPOT, OPT_MIN_GOODPUT };

int main(int argc, char **argv)
{
    kvp_cli_init(argv[0]);
    kvp_runopts o;
    kvp_runopts_init(&o);
    struct option longopts[64];
    size_t k = 0;
    for (; kvp_runopts_long[k].name; k++)
        longopts[k] = kvp_runopts_long[k];
    longopts[k++] = (struct option){"slo-ttft", required_argument, NULL, OPT_SLO_TTFT};
    longopts[k++] = (struct option){"slo-tpot", required_argument, NULL, OPT_SLO_TPOT};
    longopts[k++] = (struct option){"min-goodput", required_argument, NULL, OPT_MIN_GOODPUT};
    longopts[k] = (struct option){NULL, 0, NULL, 0};
    double slo_ttft = 0, slo_tpot = 0, min_goodput = -1;
    int c;
    while ((c = getopt_long(argc, argv, KVP_RUNOPTS_SHORT "h", longopts, NULL)) != -1) {
        if (kvp_runopts_parse(&o, c, optarg))
            continue;
        if (c == OPT_SLO_TTFT || c == OPT_SLO_TPOT) {
            double ms = kvp_cli_opt_f64(c == OPT_SLO_TTFT ? "--slo-ttft" : "--slo-tpot", optarg, 0, 1e9);
            *(c == OPT_SLO_TTFT ? &slo_ttft : &slo_tpot) = ms / 1e3;
            continue;
        }
        if (c == OPT_MIN_GOODPUT) {
            min_goodput = kvp_cli_opt_f64("--min-goodput", optarg, 0, 1);
            continue;
        }
        if (c == 'h' || c == KVP_OPT_HELP) {
            usage(stdout);
            return kvp_cli_close_stdout();
        }
        if (c == KVP_OPT_VERSION)
            kvp_cli_version();
        kvp_cli_bad_option(argv, KVP_RUNOPTS_SHORT "h");
    }
    if (!o.model)
        kvp_cli_usage_error("no model (-m MODEL)");
    int from_prompts = o.prompt || o.file || o.tokens;
    if ((o.prompt != NULL) + (o.file != NULL) + (o.tokens != NULL) > 1)
        kvp_cli_usage_error("give one of -p, -f and --tokens");
    if (from_prompts && optind < argc)
        kvp_cli_usage_error("a KV stream and prompts at once");
    if (optind + 1 < argc)
        kvp_cli_usage_error("more than one KV stream");
    const char *kv_in = optind < argc ? argv[optind] : "-";
    kvp_err err = {0};
    if (kvp_sample_check(&o.sampling, &err) < 0)
        kvp_cli_usage_error("%s", err.msg);

    kvp_run r;
    if (kvp_run_open(&r, &o, &err) < 0)
        kvp_cli_die_err(&err);
    prompt_src ps = {.o = &o, .tok = r.tok};
    stream_src ss = {.o = &o, .tok = r.tok};
    kvp_batch_source src;
    uint32_t n = 0;
    if (from_prompts) {
        if (kvp_run_prompts(&r, &o, &ps.ps, &ps.ids, &ps.lens, &err) < 0 || kvp_run_start(&r, &o, NULL, &err) < 0)
            kvp_cli_die_err(&err);
        n = (uint32_t)ps.ps.n;
        src = (kvp_batch_source){.ctx = &ps, .next = prompt_next};
    } else {
        kvp_in in;
        kvp_reader *rd = NULL;
        if (kvp_in_open(&in, kv_in, &err) < 0 || kvp_reader_open(&rd, &in, &err) < 0 ||
            kvp_seqio_read(rd, in.name, r.model, r.be, &o.kv, &ss.kc, &ss.ss, &ss.n, &err) < 0 ||
            kvp_run_start(&r, &o, ss.kc, &err) < 0)
            kvp_cli_die_err(&err);
        kvp_reader_free(rd);
        kvp_in_close(&in);
        n = ss.n;
        src = (kvp_batch_source){.ctx = &ss, .next = stream_next};
    }
    out_ctx oc = {.stream_text = n == 1 && !o.json, .o = &o};
    if (o.kv_out && !(oc.kept = calloc(n ? n : 1, sizeof *oc.kept)))
        kvp_cli_die("out of memory");
    kvp_kvcache_get_stats(r.kc, &oc.kv);
    kvp_metrics metrics;
    kvp_metrics_init(&metrics, slo_ttft, slo_tpot);
    kvp_batch_opts bo = {.sched = o.sched, .keep_finished = o.kv_out != NULL, .metrics = &metrics};
    kvp_batch_stats st;
    if (kvp_batch_run(r.engine, r.kc, r.tok, &bo, &src, emit, &oc, &st, &err) < 0)
        kvp_cli_die_err(&err);
    if (o.stats)
        write_stats(&o, &st, &metrics);
    double goodput = kvp_metrics_goodput(&metrics);
    kvp_metrics_free(&metrics);
    if (o.kv_out) {
        kvp_gen_seq *seqs = calloc(oc.n_kept ? oc.n_kept : 1, sizeof *seqs);
        if (!seqs)
            kvp_cli_die("out of memory");
        for (uint32_t i = 0; i < oc.n_kept; i++)
            seqs[i] = oc.kept[i]->g; /* saving reads the record and the cache handle */
        if (kvp_run_save(&r, o.kv_out, "decode " KVP_VERSION, seqs, oc.n_kept, NULL, NULL, &err) < 0)
            kvp_cli_die_err(&err);
        free(seqs);
        for (uint32_t i = 0; i < oc.n_kept; i++)
            kvp_request_free(oc.kept[i]);
        free(oc.kept);
    }
    free(ps.ids);
    free(ps.lens);
    kvp_prompts_free(&ps.ps);
    free(ss.ss);
    kvp_run_close(&r);
    kvp_runopts_free(&o);
    int rc = kvp_cli_close_stdout();
    if (min_goodput >= 0 && goodput < min_goodput) {
        kvp_cli_warn("goodput %.4f is below --min-goodput %.4f", goodput, min_goodput);
        return 3;
    }
    if (oc.n_kv_memory) {
        kvp_cli_warn("%llu of %u sequences did not fit in the KV cache; the others completed",
                     (unsigned long long)oc.n_kv_memory, n);
        return KVP_EXIT_FAIL;
    }
    return rc;
}
