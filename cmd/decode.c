/* decode - generate tokens over a paged KV cache, for every sequence of a
 * batch together: from a KVP stream that prefill wrote (stdin or FILE), or
 * from prompts it prefills itself. */
#include "cli.h"
#include "runopts.h"
#include "sample.h"
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
    int stream_text;   /* one sequence, plain text streamed */
    const kvp_runopts *o;
} out_ctx;

static void emit(void *cp, kvp_gen_seq *s, const char *bytes, size_t n)
{
    out_ctx *c = cp;
    if (c->stream_text) {
        if (n) {
            fwrite(bytes, 1, n, stdout);
            fflush(stdout);
        } else {
            fputc('\n', stdout);
            fflush(stdout);
        }
        return;
    }
    if (n)
        return;
    /* finished: one JSON line */
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
    fflush(stdout);
}

static void stats(const kvp_runopts *o, const kvp_gen_seq *seqs, uint32_t n, double t0, double t1)
{
    uint64_t total = 0;
    for (uint32_t i = 0; i < n; i++)
        total += seqs[i].n_gen;
    double dt = t1 - t0;
    if (o->json)
        fprintf(stderr, "{\"sequences\":%u,\"generated\":%llu,\"seconds\":%.3f,\"tokens_per_s\":%.2f}\n", n,
                (unsigned long long)total, dt, dt > 0 ? (double)total / dt : 0);
    else
        fprintf(stderr, "decode: %u sequences, %llu tokens in %.3f s (%.2f tokens/s)\n", n, (unsigned long long)total,
                dt, dt > 0 ? (double)total / dt : 0);
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
    kvp_gen_seq *seqs = NULL;
    uint32_t n = 0;
    double t0 = kvp_gen_now();
    kvp_gen_opts go = {.stop = o.stop, .n_stop = o.n_stop, .ignore_eos = o.ignore_eos, .chunk = o.chunk};
    if (from_prompts) {
        kvp_prompts ps;
        uint32_t **ids, *lens;
        if (kvp_run_prompts(&r, &o, &ps, &ids, &lens, &err) < 0 || kvp_run_start(&r, &o, NULL, &err) < 0)
            kvp_cli_die_err(&err);
        n = (uint32_t)ps.n;
        seqs = calloc(n ? n : 1, sizeof *seqs);
        float *logits = malloc(sizeof(float) * r.model->cfg.n_vocab);
        if (!seqs || !logits)
            kvp_cli_die("out of memory");
        for (uint32_t i = 0; i < n; i++) {
            kvp_gen_seq *s = &seqs[i];
            kvp_gen_seq_init(s, r.tok);
            s->rec.id = i;
            snprintf(s->rec.label, sizeof s->rec.label, "%s", ps.p[i].label);
            s->rec.sampling = o.sampling;
            kvp_sample_seed(&s->rec.sampling, i);
            if ((s->handle = kvp_kvcache_seq_new(r.kc, &err)) < 0 ||
                kvp_gen_prefill(r.engine, r.kc, s, ids[i], lens[i], &go, logits, &err) < 0)
                kvp_cli_die_err(&err);
            free(ids[i]);
        }
        free(ids);
        free(lens);
        free(logits);
        kvp_prompts_free(&ps);
    } else {
        kvp_in in;
        kvp_reader *rd = NULL;
        kvp_kvcache *kc = NULL;
        kvp_seqio_seq *ss = NULL;
        if (kvp_in_open(&in, kv_in, &err) < 0 || kvp_reader_open(&rd, &in, &err) < 0 ||
            kvp_seqio_read(rd, in.name, r.model, r.be, &o.kv, &kc, &ss, &n, &err) < 0 ||
            kvp_run_start(&r, &o, kc, &err) < 0)
            kvp_cli_die_err(&err);
        kvp_reader_free(rd);
        kvp_in_close(&in);
        seqs = calloc(n ? n : 1, sizeof *seqs);
        if (!seqs)
            kvp_cli_die("out of memory");
        for (uint32_t i = 0; i < n; i++) {
            kvp_gen_seq_init(&seqs[i], r.tok);
            seqs[i].rec = ss[i].rec;
            seqs[i].handle = ss[i].handle;
            kvp_runopts_apply_sampling(&o, &seqs[i].rec.sampling);
            if (o.sampling_set & KVP_SET_SEED)
                kvp_sample_seed(&seqs[i].rec.sampling, seqs[i].rec.id);
            /* a sequence cut by its budget continues; one that met a stop does not */
            if (seqs[i].rec.state == KVP_SEQ_FINISHED && seqs[i].rec.finish_reason == KVP_FINISH_LENGTH &&
                seqs[i].rec.next_token >= 0)
                seqs[i].rec.state = KVP_SEQ_RUNNING;
        }
        free(ss);
        if (kvp_sample_check(&seqs[0].rec.sampling, &err) < 0 && n)
            kvp_cli_die_err(&err);
    }
    out_ctx oc = {.stream_text = n == 1 && !o.json, .o = &o};
    if (kvp_gen_run(r.engine, r.kc, r.tok, seqs, n, &go, emit, &oc, &err) < 0)
        kvp_cli_die_err(&err);
    double t1 = kvp_gen_now();
    if (o.stats)
        stats(&o, seqs, n, t0, t1);
    if (o.kv_out && kvp_run_save(&r, o.kv_out, "decode " KVP_VERSION, seqs, n, NULL, NULL, &err) < 0)
        kvp_cli_die_err(&err);
    for (uint32_t i = 0; i < n; i++)
        kvp_gen_seq_free(&seqs[i]);
    free(seqs);
    kvp_run_close(&r);
    kvp_runopts_free(&o);
    return kvp_cli_close_stdout();
}
