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
            "  -h, --help, --version\n\n"
            "Exit status: 0 success, 1 runtime error (bad model, stream or prompts file, KV memory\n"
            "exhausted), 2 usage error.\n",
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

static void stats(const kvp_runopts *o, const kvp_batch_stats *st)
{
    double dt = st->seconds;
    if (o->json)
        fprintf(stderr, "{\"sequences\":%llu,\"generated\":%llu,\"seconds\":%.3f,\"tokens_per_s\":%.2f,"
                "\"steps\":%llu,\"preemptions\":%llu,\"peak_blocks\":%u,\"blocks\":%u,\"prompt_tokens\":%llu,"
                "\"cached_tokens\":%llu,\"kv_memory\":%llu}\n",
                (unsigned long long)st->requests, (unsigned long long)st->generated, dt,
                dt > 0 ? (double)st->generated / dt : 0, (unsigned long long)st->steps,
                (unsigned long long)st->preemptions, st->peak_blocks, st->total_blocks,
                (unsigned long long)st->prompt_tokens, (unsigned long long)st->cached_tokens,
                (unsigned long long)st->kv_memory);
    else
        fprintf(stderr, "decode: %llu sequences, %llu tokens in %.3f s (%.2f tokens/s); %llu steps, %llu "
                "preemptions, peak %u of %u KV blocks\n", (unsigned long long)st->requests,
                (unsigned long long)st->generated, dt, dt > 0 ? (double)st->generated / dt : 0,
                (unsigned long long)st->steps, (unsigned long long)st->preemptions, st->peak_blocks,
                st->total_blocks);
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

int main(int argc, char **argv)
{
    kvp_cli_init(argv[0]);
    kvp_runopts o;
    kvp_runopts_init(&o);
    int c;
    while ((c = getopt_long(argc, argv, KVP_RUNOPTS_SHORT "h", kvp_runopts_long, NULL)) != -1) {
        if (kvp_runopts_parse(&o, c, optarg))
            continue;
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
    kvp_batch_opts bo = {.sched = o.sched, .keep_finished = o.kv_out != NULL};
    kvp_batch_stats st;
    if (kvp_batch_run(r.engine, r.kc, r.tok, &bo, &src, emit, &oc, &st, &err) < 0)
        kvp_cli_die_err(&err);
    if (o.stats)
        stats(&o, &st);
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
    if (oc.n_kv_memory) {
        kvp_cli_warn("%llu of %u sequences did not fit in the KV cache; the others completed",
                     (unsigned long long)oc.n_kv_memory, n);
        return KVP_EXIT_FAIL;
    }
    return rc;
}
