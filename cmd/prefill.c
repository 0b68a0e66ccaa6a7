/* prefill - run prompts through the model and write their KV cache, first
 * sampled token and sampling state as a KVP stream for decode. */
#include "cli.h"
#include "comm.h"
#include "io.h"
#include "launchrank.h"
#include "perplexity.h"
#include "progress.h"
#include "prompts.h"
#include "runopts.h"
#include "sample.h"
#include "stopsig.h"
#include "unicode.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { OPT_RESUME = 0x2000, OPT_PROGRESS, OPT_TOKENIZE, OPT_PPL, OPT_CTX, OPT_CHUNKS, OPT_SAVE, OPT_SAVE_TOP, OPT_FULL, OPT_KLD };

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: prefill -m MODEL [-p TEXT | -f FILE | --tokens IDS] [options] > kv.kvp\n"
            "       prefill -m MODEL --resume KV.kvp -p TEXT | --tokens IDS [options] > kv2.kvp\n"
            "       prefill --tokenize -m MODEL [-p TEXT | -f FILE | --tokens IDS] [--chat] [--no-special] [--json]\n"
            "       prefill --perplexity TEXT -m MODEL [--ctx N] [--chunks N] [--save-logits BASE.kvp [--save-top K | --full]]\n"
            "               [--kld BASE.kvp] [--kv-dtype TYPE] [--json]\n"
            "Run every prompt through the model in chunks, sample its first token and write a KVP\n"
            "stream: model fingerprint, one sequence record per prompt, its KV blocks (a block\n"
            "shared by several prompts is written once and referenced after) and the end record.\n\n"
            "%s"
            "  -o, --output FILE       write the stream to FILE (default stdout)\n"
            "      --stop STRING       a stop string each sequence record carries for decode (repeatable)\n"
            "      --json              --stats, --tokenize and --perplexity as JSON\n"
            "      --resume FILE       extend every sequence of a saved KV stream (decode --kv-out)\n"
            "                          by one more turn: -p TEXT (with --chat, a user turn) or --tokens\n"
            KVP_PROGRESS_HELP
            "      --tokenize          print each prompt's token ids and pieces instead (standard\n"
            "                          input when no prompt is given; --json: {\"ids\",\"pieces\"})\n"
            "      --perplexity TEXT   score TEXT (a file, - for stdin) in windows instead, as llama.cpp's\n"
            "                          perplexity tool does, and print PPL (first half of each window is\n"
            "                          context only)\n"
            "      --ctx N             tokens a window (default 512, or the model's context where shorter)\n"
            "      --chunks N          score at most N windows (default: all)\n"
            "      --save-logits FILE  save the model's next-token distributions as a BASE for --kld\n"
            "      --save-top K        save the top K log-probs and the rest's mass (default 32)\n"
            "      --full              save whole rows instead (n_vocab floats a position)\n"
            "      --kld BASE          compare with a saved BASE: KL divergence, top-token agreement,\n"
            "                          delta-p and PPL ratio, as llama.cpp prints them\n"
            "  -h, --help, --version\n\n"
            "Sampling options and --stop are stored in the stream and used by decode.\n"
            "Exit status: 0 success, 1 runtime error (bad model or prompts file, KV memory\n"
            "exhausted), 2 usage error, 130/143 stopped by SIGINT/SIGTERM (the prompts that\n"
            "had finished are written, the stream ended with its END record).\n",
            kvp_runopts_help_one);
}

/* A prompts file's prompt p, read from its line, as token ids *t[*n]; an
 * empty or too long one is refused.  0 or a code, the error naming the
 * file, line and id. */
static int file_prompt_ids(const kvp_run *r, const kvp_prompt *p, const char *file, uint64_t line, int32_t **t,
                           size_t *n, kvp_err *err)
{
    char id[KVP_UNICODE_ESCAPED_SIZE(KVP_NAME_MAX)];
    kvp_unicode_escape(id, sizeof id, p->label, 0);
    if (kvp_prompt_encode(p, r->tok, t, n, err) < 0)
        return kvp_err_prefix(err, "%s:%llu%s%s", file, (unsigned long long)line, id[0] ? ": prompt " : "", id);
    if (*n == 0 || *n > UINT32_MAX) {
        free(*t);
        *t = NULL;
        /* named by its line (and id), not by a count that reads like its index */
        return kvp_err_set(err, KVP_EINVAL, "%s:%llu: %s%s is %s", file, (unsigned long long)line,
                           id[0] ? "prompt " : "the prompt", id, *n ? "too long" : "empty");
    }
    return 0;
}

/* --tokenize: prompt i's tokens ids[n], one line per token, "id -> 'piece'"
 * as llama.cpp's tokenize tool prints it (escaped), or one JSON object;
 * named by its label (else its index) when the job has several prompts
 * (several), or in JSON when it has a label. */
static void print_tokens(const kvp_run *r, const kvp_runopts *o, const kvp_prompt *pr, size_t i, int several,
                         const uint32_t *ids, uint32_t n)
{
    const char *label = pr->label;
    if (o->json) {
        fputs("{", stdout);
        if (several || label[0]) {
            fputs("\"id\":", stdout);
            kvp_run_id_json(stdout, label, pr->label_int, i);
            fputs(",", stdout);
        }
        fputs("\"ids\":[", stdout);
        for (uint32_t k = 0; k < n; k++)
            printf("%s%u", k ? "," : "", ids[k]);
        fputs("],\"pieces\":[", stdout);
    } else if (several) {
        if (label[0]) { /* an id may hold any string: one line, escaped as the pieces are */
            fputs("# ", stdout);
            kvp_cli_c_escaped(stdout, label, strlen(label), 0);
            fputs("\n", stdout);
        } else
            printf("# %zu\n", i);
    }
    for (uint32_t k = 0; k < n; k++) {
        size_t len;
        const char *p = kvp_tokenizer_piece(r->tok, (int32_t)ids[k], &len);
        if (!p)
            kvp_cli_die("%s: token id %u is outside the vocabulary of %zu", o->model, ids[k],
                        kvp_tokenizer_n_vocab(r->tok));
        if (o->json) {
            if (k)
                fputs(",", stdout);
            kvp_cli_json_str(stdout, p, len);
        } else {
            printf("%6u -> ", ids[k]);
            kvp_cli_c_str(stdout, p, len);
            fputs("\n", stdout);
        }
    }
    if (o->json)
        fputs("]}\n", stdout);
}

/* --tokenize -f FILE: a prompt at a time, one read ahead (whether there
 * are several decides the names), so a file of any length takes the
 * memory of two prompts; a bad line fails the job after the prompts
 * before it are printed, as prefill -f does. */
static void list_file_tokens(kvp_run *r, const kvp_runopts *o)
{
    kvp_err err = {0};
    kvp_prompts set;
    kvp_prompts_reader *rd = NULL;
    kvp_run_prompt_settings(r, o, &set);
    if (kvp_prompts_reader_open(&rd, o->file, &set, &err) < 0)
        kvp_cli_die_err(&err);
    kvp_prompt cur, next;
    int have = kvp_prompts_reader_next(rd, &cur, &err), several = -1;
    if (have == 0)
        kvp_cli_warn("note: %s: no prompt in the file: no tokens to list", o->file);
    for (size_t i = 0; have > 0; i++) {
        uint64_t line = kvp_prompts_reader_line(rd);
        int more = kvp_prompts_reader_next(rd, &next, &err);
        kvp_err bad = err;
        if (several < 0)
            several = more != 0;
        int32_t *t = NULL;
        size_t n = 0;
        if (file_prompt_ids(r, &cur, o->file, line, &t, &n, &err) < 0)
            kvp_cli_die_err(&err);
        print_tokens(r, o, &cur, i, several, (const uint32_t *)t, (uint32_t)n);
        fflush(stdout); /* a reader on a pipe gets each prompt as it is done */
        free(t);
        kvp_prompt_free(&cur);
        if (more < 0) {
            fflush(stdout);
            kvp_cli_die_err(&bad);
        }
        cur = next;
        have = more;
    }
    if (have < 0)
        kvp_cli_die_err(&err);
    kvp_prompts_reader_free(rd);
}

/* --tokenize: each prompt's tokens (print_tokens). */
static void list_tokens(const kvp_runopts *o)
{
    kvp_run r;
    kvp_err err = {0};
    if (kvp_run_open_tokenizer(&r, o, &err) < 0)
        kvp_cli_die_err(&err);
    if (o->file) {
        list_file_tokens(&r, o);
        kvp_run_close(&r);
        return;
    }
    kvp_prompts ps;
    uint32_t **ids = NULL, *lens = NULL;
    kvp_prompts_init(&ps);
    if (kvp_run_prompts(&r, o, &ps, &ids, &lens, &err) < 0)
        kvp_cli_die_err(&err);
    for (size_t i = 0; i < ps.n; i++) {
        print_tokens(&r, o, &ps.p[i], i, ps.n > 1, ids[i], lens[i]);
        free(ids[i]);
    }
    free(ids);
    free(lens);
    kvp_prompts_free(&ps);
    kvp_run_close(&r);
}

/* --perplexity: score a text (no KV stream is written). */
static int perplexity_mode(kvp_runopts *o, const char *text, kvp_ppl_opts *po, int full, int save_top_set,
                           int output_given, int argc, char **argv)
{
    if (!text)
        kvp_cli_usage_error("--save-logits, --save-top, --full and --kld go with --perplexity TEXT");
    if (output_given)
        kvp_cli_usage_error("--perplexity prints its report on standard output: -o goes with a prefill job "
                            "(--save-logits FILE writes a base)");
    if (o->stats)
        kvp_cli_usage_error("--stats goes with a prefill job, not --perplexity");
    if (po->save_path && (!*po->save_path || !strcmp(po->save_path, "-")))
        kvp_cli_usage_error("--save-logits: give a file (standard output carries the report)");
    kvp_cli_refuse_same("--save-logits ", po->save_path, text, "text scored");
    kvp_cli_refuse_same("--save-logits ", po->save_path, o->model, "model");
    if (o->prompt || o->file || o->tokens || o->chat || o->system)
        kvp_cli_usage_error("--perplexity scores a text file; it takes no prompts (-p, -f, --tokens, --chat, "
                            "--system)");
    if (po->base_path && !strcmp(text, "-") && !strcmp(po->base_path, "-"))
        kvp_cli_usage_error("--perplexity - and --kld -: standard input can carry one of them");
    if (o->n_stop) /* nothing is generated: it would be ignored */
        kvp_cli_usage_error("--stop goes with a prefill job (its stream carries it), not --perplexity");
    if ((full || save_top_set) && !po->save_path)
        kvp_cli_usage_error("--save-top and --full choose what --save-logits saves");
    if (full && save_top_set)
        kvp_cli_usage_error("--save-top K or --full, not both");
    if (po->save_path && po->base_path)
        kvp_cli_usage_error("--save-logits makes a base and --kld compares with one: separate runs");
    if (optind < argc)
        kvp_cli_usage_error("unexpected argument '%s'%s", argv[optind], kvp_cli_operand_hint(argc, argv, optind));
    if (full)
        po->save_k = 0;
    po->chunk = o->chunk;
    /* the base renamed into place once the report is out: one lost to a
     * full disk or a closed standard output leaves no base either */
    kvp_lpfile_writer *saved = NULL;
    po->saved = &saved;
    kvp_ppl_result res;
    kvp_err err = {0};
    if (kvp_perplexity_run(o, text, po, &res, &err) < 0)
        kvp_cli_die_err(&err);
    kvp_perplexity_print(stdout, &res, strcmp(text, "-") ? text : "<stdin>", o->json);
    kvp_cli_check_stdout();
    if (saved && kvp_lpfile_commit(saved, &err) < 0)
        kvp_cli_die_err(&err);
    kvp_runopts_free(o);
    return kvp_cli_close_stdout();
}

/* prefill's run across its prompts: the stream being written, the
 * options, and the totals --stats prints. */
typedef struct pf_job {
    kvp_run *r;
    const kvp_runopts *o;
    kvp_run_saver sv;
    float *logits;
    kvp_gen_opts go;
    uint64_t total, n;
    uint64_t computed;       /* prompt tokens computed (not found in the prefix cache) */
    double t_all;
    kvp_progress *pg;        /* --progress, or NULL */
    /* a stop signal (stopsig.h) ended the job early: what it left */
    int stopped;
    uint64_t left;           /* prompts read (or sequences of --resume's stream) not run */
    int read_all;            /* the input was read to its end */
    kvp_stop_rec in_stop;    /* --resume: the saved stream's STOP record (signal 0: none), its producer
                              * stopped before all it was asked for */
} pf_job;

/* Whether err is a read or open that a stop signal cut short (KVP_EINTR):
 * the job stops there, as it does between prompts, rather than failing. */
static int stopped_by(const kvp_err *err) { return err->code == KVP_EINTR && kvp_stopsig_caught(); }

/* Between prompts: 1 when a stop signal came, the job noted as stopped.
 * (Inside a prompt the engine stops at its next chunk: prefill_one.) */
static int stop_now(pf_job *j)
{
    if (kvp_stopsig_caught())
        j->stopped = 1;
    return j->stopped;
}

static void open_stream(pf_job *j, const char *output)
{
    kvp_err err = {0};
    if (kvp_run_save_open(&j->sv, j->r, output, "prefill " KVP_VERSION, &err) < 0)
        kvp_cli_die_err(&err);
}

/* Fail the job: the stream is abandoned (a file output never appears; a
 * pipe's reader sees it cut short), and where names the prompt. */
static void fail(pf_job *j, kvp_err *err, const char *where)
{
    kvp_run_save_abort(&j->sv);
    if (where && where[0])
        kvp_err_prefix(err, "%s", where);
    kvp_cli_die_err(err);
}

/* "prompt LABEL" (escaped: the message stays one line) in where, or ""
 * when the prompt has no label. */
static const char *label_where(char *where, size_t size, const char *label)
{
    char id[KVP_UNICODE_ESCAPED_SIZE(KVP_NAME_MAX)];
    snprintf(where, size, "%s%s", label[0] ? "prompt " : "", kvp_unicode_escape(id, sizeof id, label, 0));
    return where;
}

/* Run s's prompt ids[0..len), write s to the stream with the stop strings
 * stop[n_stop] in its record, and give its blocks back.  pp, when not
 * NULL, is its prompts line's parameters: its cache salt salts s's blocks
 * and goes into s's record.  where names the prompt in an error.  Each
 * sequence goes out as soon as it is computed: decode at the other end of
 * a pipe starts on it while the rest are computed. */
static void prefill_one(pf_job *j, kvp_gen_seq *s, const uint32_t *ids, uint32_t len, const kvp_prompt_params *pp,
                        const char *const *stop, size_t n_stop, const char *where)
{
    kvp_run *r = j->r;
    kvp_err err = {0};
    double t0 = kvp_gen_now();
    uint64_t salt = pp && (pp->set & KVP_PARAM_CACHE_SALT) ? pp->cache_salt : 0;
    if (pp) /* a resumed sequence keeps its record's */
        s->rec.cache_salt = salt;
    /* past the trained context the positions were never learned: refuse,
     * as decode does, rather than write K/V nobody should use */
    uint32_t have = s->handle >= 0 ? kvp_kvcache_seq_len(r->kc, s->handle) : 0;
    const kvp_config *cfg = &kvp_run_loaded(r)->cfg;
    uint32_t n_ctx = kvp_config_ctx_limit(cfg); /* a sliding window, else the context */
    if (n_ctx && (uint64_t)have + len > n_ctx) {
        const char *limit = n_ctx != cfg->n_ctx ? "sliding window (which the engine does not apply)" : "context";
        if (have)
            kvp_err_set(&err, KVP_EINVAL, "%u tokens after the sequence's %u are more than the model's %s of %u", len,
                        have, limit, n_ctx);
        else
            kvp_err_set(&err, KVP_EINVAL, "%u tokens are more than the model's %s of %u", len, limit, n_ctx);
        fail(j, &err, where);
    }
    /* a stop signal ends the prompt at its next chunk: dropped, counted
     * as read and not finished, the sequences before it written whole */
    kvp_engine_set_cancel(r->engine, kvp_stopsig_flag());
    if ((s->handle < 0 && (s->handle = kvp_kvcache_seq_new(r->kc, &err)) < 0) ||
        (salt && kvp_kvcache_seq_set_salt(r->kc, s->handle, salt, &err) < 0) ||
        kvp_gen_prefill(r->engine, r->kc, s, ids, len, &j->go, j->logits, &err) < 0) {
        if (!stopped_by(&err))
            fail(j, &err, where);
        kvp_kvcache_seq_free(r->kc, s->handle);
        s->handle = -1;
        j->stopped = 1;
        j->left++;
        return;
    }
    s->rec.first_ns = kvp_gen_wall_ns();
    if (kvp_run_save_put(&j->sv, s, stop, n_stop, &err) < 0) {
        if (where && where[0])
            kvp_err_prefix(&err, "%s", where);
        kvp_cli_die_err(&err);
    }
    /* Written: its blocks go back to the pool, so any number of prompts
     * runs in the cache of one.  Its full blocks stay findable in the
     * prefix cache until their memory is needed, and the stream refers
     * to blocks it has already carried, so shared prefixes are still
     * computed and sent once. */
    kvp_kvcache_seq_free(r->kc, s->handle);
    s->handle = -1;
    double dt = kvp_gen_now() - t0;
    j->total += len;
    j->n++;
    j->computed += s->n_prefill;
    if (j->pg)
        kvp_progress_prompts(j->pg, j->n, j->computed, 0);
    if (!j->o->stats || j->o->stats_file) /* --stats=FILE: the job's summary alone, into FILE */
        return;
    if (j->pg) /* a line being redrawn ends before the statistics' */
        kvp_progress_break(j->pg);
    const char *label = s->rec.label;
    if (j->o->json) {
        fputs("{\"id\":", stderr);
        kvp_run_id_json(stderr, label, (s->rec.flags & KVP_SEQ_LABEL_INT) != 0, s->rec.id);
        fprintf(stderr, ",\"prompt_tokens\":%u,\"computed\":%u,\"ttft_ms\":%.2f,\"tokens_per_s\":%.2f}\n", len,
                s->n_prefill, dt * 1e3, dt > 0 ? s->n_prefill / dt : 0);
    } else {
        char id[KVP_UNICODE_ESCAPED_SIZE(KVP_NAME_MAX)]; /* a line a sequence: its id escaped */
        fprintf(stderr, "prefill: sequence %llu%s%s: %u prompt tokens (%u computed), first token after %.1f ms, "
                "%.1f tokens/s\n", (unsigned long long)s->rec.id, label[0] ? " " : "",
                kvp_unicode_escape(id, sizeof id, label, 0), len, s->n_prefill, dt * 1e3, dt > 0 ? s->n_prefill / dt : 0);
    }
}

/* A new sequence i for prompt p, with sampling smp. */
static void seq_start(kvp_gen_seq *s, const kvp_run *r, uint64_t i, const kvp_prompt *p, const kvp_sampling *smp,
                      uint64_t arrival)
{
    memset(s, 0, sizeof *s); /* the record's fields prefill does not set (flags, a -p prompt's salt) are 0 */
    kvp_gen_seq_init(s, r->tok);
    s->rec.id = i;
    snprintf(s->rec.label, sizeof s->rec.label, "%s", p->label);
    if (p->label_int) /* the record says so: decode prints it back as the integer */
        s->rec.flags = KVP_SEQ_LABEL_INT;
    /* and which values the line set itself: they win over decode's options,
     * as in decode -f */
    s->rec.flags |= kvp_runopts_own_flags(p->params.set);
    s->rec.sampling = *smp;
    s->rec.arrival_ns = arrival;
    s->handle = -1;
}

/* -f FILE: one line at a time, each prompt prefilled and written before the
 * next line is read, so a file or pipe of any length takes the memory of one
 * prompt, and decode at the end of a pipe starts on the first while later
 * lines are still being written.  A line's own parameters (max_tokens,
 * temperature, top_p, top_k, min_p, seed) go into its sequence record for
 * decode, with its stop strings and cache_salt (which keeps its blocks from
 * other salts' here too). */
static void prefill_file(pf_job *j, const char *output)
{
    const kvp_runopts *o = j->o;
    kvp_err err = {0};
    kvp_prompts set;
    kvp_prompts_reader *rd = NULL;
    kvp_run_prompt_settings(j->r, o, &set);
    if (kvp_run_start(j->r, o, NULL, &err) < 0)
        kvp_cli_die_err(&err);
    /* a FIFO no writer has opened yet waits here: a stop then writes a
     * stream of no sequences */
    int opened = kvp_prompts_reader_open(&rd, o->file, &set, &err);
    if (opened < 0 && !stopped_by(&err))
        kvp_cli_die_err(&err);
    open_stream(j, output);
    if (opened < 0) {
        j->stopped = 1;
        return;
    }
    kvp_prompt p = {0};
    for (uint64_t i = 0; !stop_now(j); i++) {
        int got = kvp_prompts_reader_next(rd, &p, &err);
        if (got < 0 && stopped_by(&err)) { /* waiting for the next line */
            j->stopped = 1;
            break;
        }
        if (got < 0)
            fail(j, &err, NULL);
        if (got == 0) {
            j->read_all = 1;
            if (i == 0) /* a stream of no sequences, as a job of no request gives (decode reads it so) */
                kvp_cli_warn("note: %s: no prompt in the file: a stream of no sequences", o->file);
            break;
        }
        uint64_t arrival = kvp_gen_wall_ns();
        char where[4096 + KVP_UNICODE_ESCAPED_SIZE(KVP_NAME_MAX) + 64], id[KVP_UNICODE_ESCAPED_SIZE(KVP_NAME_MAX)];
        snprintf(where, sizeof where, "%s:%llu%s%s", o->file, (unsigned long long)kvp_prompts_reader_line(rd),
                 p.label[0] ? ": prompt " : "", kvp_unicode_escape(id, sizeof id, p.label, 0));
        int32_t *t = NULL;
        size_t n = 0;
        kvp_sampling smp;
        if (file_prompt_ids(j->r, &p, o->file, kvp_prompts_reader_line(rd), &t, &n, &err) < 0)
            fail(j, &err, NULL);
        if (kvp_runopts_request_sampling(o, &p.params, i, &smp, &err) < 0)
            fail(j, &err, where);
        kvp_gen_seq s;
        seq_start(&s, j->r, i, &p, &smp, arrival);
        /* the line's own stop strings (its record says so), else --stop's
         * as a default that decode's --stop replaces */
        int own = (p.params.set & KVP_PARAM_STOP) != 0;
        prefill_one(j, &s, (const uint32_t *)t, (uint32_t)n, &p.params,
                    own ? (const char *const *)p.params.stop : o->stop, own ? p.params.n_stop : o->n_stop, where);
        kvp_gen_seq_free(&s);
        free(t);
        kvp_prompt_free(&p);
    }
    kvp_prompts_reader_free(rd);
}

/* -p TEXT or --tokens IDS: one prompt, with --stop's stop strings. */
static void prefill_given(pf_job *j, const char *output)
{
    kvp_err err = {0};
    kvp_prompts ps;
    uint32_t **ids = NULL, *lens = NULL;
    if (kvp_run_prompts(j->r, j->o, &ps, &ids, &lens, &err) < 0 || kvp_run_start(j->r, j->o, NULL, &err) < 0)
        kvp_cli_die_err(&err);
    open_stream(j, output);
    j->read_all = 1;
    uint64_t arrival = kvp_gen_wall_ns();
    for (size_t i = 0; i < ps.n; i++) {
        if (stop_now(j)) {
            j->left++;
            free(ids[i]);
            continue;
        }
        kvp_sampling smp = j->o->sampling;
        kvp_sample_seed(&smp, i);
        kvp_gen_seq s;
        seq_start(&s, j->r, i, &ps.p[i], &smp, arrival);
        char where[KVP_UNICODE_ESCAPED_SIZE(KVP_NAME_MAX) + 16];
        prefill_one(j, &s, ids[i], lens[i], NULL, j->o->stop, j->o->n_stop,
                    label_where(where, sizeof where, ps.p[i].label));
        kvp_gen_seq_free(&s);
        free(ids[i]);
    }
    free(ids);
    free(lens);
    kvp_prompts_free(&ps);
}

/* --resume: every saved sequence gets the next turn (-p or --tokens), its
 * record keeping its cache salt, and its stop strings unless --stop
 * replaces them. */
static void prefill_resumed(pf_job *j, const char *resume, const char *output)
{
    kvp_err err = {0};
    kvp_gen_seq *seqs = NULL;
    kvp_seqio_seq *saved = NULL;
    uint32_t n = 0;
    if (kvp_run_resume(j->r, j->o, resume, &seqs, &saved, &n, &j->in_stop, &err) < 0) {
        /* stopped while the stream was read (a pipe): a stream of no
         * sequences, on a cache the options size (the writer needs one) */
        if (!stopped_by(&err) || (!j->r->kc && kvp_run_start(j->r, j->o, NULL, &err) < 0))
            kvp_cli_die_err(&err);
        j->stopped = 1;
    }
    j->read_all = !j->stopped;
    if (j->pg)
        j->pg->total = n;
    /* every sequence's turn first: one that cannot take it (--chat on a
     * sequence with no open assistant turn) fails the job before any of
     * the stream is out, standard output included */
    uint32_t **ids = calloc(n ? n : 1, sizeof *ids), *lens = calloc(n ? n : 1, sizeof *lens);
    if (!ids || !lens)
        kvp_cli_die("out of memory");
    for (uint32_t i = 0; i < n; i++)
        if (kvp_run_turn_ids(j->r, j->o, &seqs[i], &ids[i], &lens[i], &err) < 0)
            fail(j, &err, resume);
    open_stream(j, output);
    uint64_t arrival = kvp_gen_wall_ns();
    for (uint32_t i = 0; i < n; i++) {
        if (stop_now(j)) { /* its saved blocks are freed with the cache */
            j->left++;
            free(ids[i]);
            kvp_gen_seq_free(&seqs[i]);
            continue;
        }
        seqs[i].rec.arrival_ns = arrival;
        /* --stop replaces the record's stop strings but those its request
         * set itself, as the sampling options replace its other values */
        int keep = (seqs[i].rec.flags & KVP_SEQ_OWN_STOP) || !j->o->n_stop;
        char where[KVP_UNICODE_ESCAPED_SIZE(KVP_NAME_MAX) + 16];
        prefill_one(j, &seqs[i], ids[i], lens[i], NULL, keep ? saved[i].stop : j->o->stop,
                    keep ? saved[i].n_stop : j->o->n_stop, label_where(where, sizeof where, seqs[i].rec.label));
        free(ids[i]);
        kvp_gen_seq_free(&seqs[i]);
    }
    free(ids);
    free(lens);
    kvp_seqio_seqs_free(saved, n);
    free(seqs);
}

/* --stats=FILE: the job's summary as one JSON object, FILE written whole
 * (as decode's): sequences written, prompt tokens (those computed; the rest
 * came from shared blocks), seconds, KV blocks written and shared by
 * reference, and whether a signal stopped the job.  Sealed under a
 * temporary name in *out, for kvp_out_commit after the stream's. */
static void seal_stats_file(const char *path, const pf_job *j, uint64_t nb, uint64_t nr, kvp_out *out)
{
    char buf[512];
    int n = snprintf(buf, sizeof buf,
                     "{\"sequences\":%llu,\"prompt_tokens\":%llu,\"computed_tokens\":%llu,\"seconds\":%.3f,"
                     "\"kv_blocks_written\":%llu,\"kv_blocks_shared\":%llu,\"stopped\":%s}\n",
                     (unsigned long long)j->n, (unsigned long long)j->total, (unsigned long long)j->computed,
                     kvp_gen_now() - j->t_all, (unsigned long long)nb, (unsigned long long)nr,
                     j->stopped ? "true" : "false");
    kvp_err err = {0};
    if (kvp_cli_write_sealed(out, path, buf, (size_t)n, &err) < 0)
        kvp_cli_die_err(&err);
}

int main(int argc, char **argv)
{
    kvp_cli_init(argv[0]);
    kvp_cli_set_usage_quiet(kvp_comm_launched_rank() > 0); /* under mpirun: rank 0 says it once */
    kvp_runopts o;
    kvp_runopts_init(&o);
    const char *output = "-", *resume = NULL;
    int output_given = 0;
    int tokenize = 0;
    double progress = -1; /* --progress: seconds between lines (0: the default); -1 off */
    /* the shared options, ours, the zero entry: sized by the compiler */
    static const struct option own[] = {
        {"output", required_argument, NULL, 'o'},
        {"resume", required_argument, NULL, OPT_RESUME},
        {"progress", optional_argument, NULL, OPT_PROGRESS},
        {"tokenize", no_argument, NULL, OPT_TOKENIZE},
        {"perplexity", required_argument, NULL, OPT_PPL},
        {"ctx", required_argument, NULL, OPT_CTX},
        {"chunks", required_argument, NULL, OPT_CHUNKS},
        {"save-logits", required_argument, NULL, OPT_SAVE},
        {"save-top", required_argument, NULL, OPT_SAVE_TOP},
        {"full", no_argument, NULL, OPT_FULL},
        {"kld", required_argument, NULL, OPT_KLD},
    };
    const char *ppl_text = NULL;
    kvp_ppl_opts po = {.save_k = 32, .bos = -1, .producer = "prefill " KVP_VERSION};
    int windows_set = 0; /* --ctx or --chunks: --perplexity's windows */
    int save_top_set = 0, full = 0;
    struct option longopts[KVP_RUNOPTS_N_LONG + sizeof own / sizeof own[0] + 1];
    kvp_runopts_table(longopts, own, sizeof own / sizeof own[0]);
    int c;
    int li = 0;
    kvp_cli_note_optional_values(argc, argv, longopts);
    while ((c = getopt_long(argc, argv, KVP_RUNOPTS_SHORT "ho:", longopts, &li)) != -1) {
        if (kvp_runopts_is_sched(c)) /* accepted and ignored would mislead */
            kvp_cli_usage_error("--%s is decode's: prefill computes one prompt at a time (--chunk sets its "
                                "tokens a step)", longopts[li].name);
        if (c == KVP_OPT_KV_OUT) /* shared with decode's table, as the two below */
            kvp_cli_usage_error("--kv-out is decode's (a generated sequence's cache): prefill's KV stream is its "
                                "output, -o FILE or standard output");
        if (c == KVP_OPT_IGNORE_EOS)
            kvp_cli_usage_error("--ignore-eos is decode's: give it to the decode that continues the stream");
        if (kvp_runopts_parse(&o, c, optarg))
            continue;
        if (c == 'o') {
            output = optarg;
            output_given = 1;
            continue;
        }
        if (c == OPT_RESUME) {
            resume = optarg;
            continue;
        }
        if (c == OPT_TOKENIZE) {
            tokenize = 1;
            continue;
        }
        if (c == OPT_PROGRESS) {
            progress = kvp_progress_opt(optarg);
            continue;
        }
        switch (c) {
        case OPT_PPL: ppl_text = optarg; continue;
        case OPT_CTX:
            po.ctx = (uint32_t)kvp_cli_opt_i64("--ctx", optarg, 4, 1 << 20);
            windows_set = 1;
            continue;
        case OPT_CHUNKS:
            po.max_windows = (uint32_t)kvp_cli_opt_i64("--chunks", optarg, 1, UINT32_MAX);
            windows_set = 1;
            continue;
        case OPT_SAVE: po.save_path = optarg; continue;
        case OPT_SAVE_TOP:
            po.save_k = (uint32_t)kvp_cli_opt_i64("--save-top", optarg, 1, KVP_LOGPROBS_MAX_K);
            save_top_set = 1;
            continue;
        case OPT_FULL: full = 1; continue;
        case OPT_KLD: po.base_path = optarg; continue;
        default: break;
        }
        if (c == 'h' || c == KVP_OPT_HELP) {
            usage(stdout);
            return kvp_cli_close_stdout();
        }
        if (c == KVP_OPT_VERSION)
            kvp_cli_version();
        kvp_cli_bad_option(argv, KVP_RUNOPTS_SHORT "ho:", longopts);
    }
    kvp_progress_bare_check(progress == 0, argc, argv, optind);
    if (!o.model)
        kvp_cli_usage_error("no model (-m MODEL)");
    int follower = kvp_run_tp_follow(&o); /* --tp: ranks past 0 compute, rank 0 goes on */
    if (follower >= 0) {
        kvp_runopts_free(&o);
        return follower;
    }
    if (progress >= 0 && (tokenize || ppl_text || po.save_path || po.base_path || full || save_top_set))
        kvp_cli_usage_error("--progress goes with a prefill job, not --tokenize or --perplexity");
    /* --tokenize and --perplexity generate nothing: the sampling options
     * (a prefill job's stream carries them for decode) would be ignored */
    if ((tokenize || ppl_text) && o.sampling_set)
        kvp_cli_usage_error("-n, --temperature, --top-k, --top-p, --min-p, --repeat-penalty and --seed go with a "
                            "prefill job (its stream carries them), not %s", tokenize ? "--tokenize" : "--perplexity");
    if (ppl_text || po.save_path || po.base_path || full || save_top_set) {
        if (tokenize || resume) /* it runs no prompt: they would be passed over */
            kvp_cli_usage_error("--perplexity scores a text file: not with %s", tokenize ? "--tokenize" : "--resume");
        return perplexity_mode(&o, ppl_text, &po, full, save_top_set, output_given, argc, argv);
    }
    if (windows_set) /* a prefill job runs whole prompts: they would be ignored */
        kvp_cli_usage_error("--ctx and --chunks set --perplexity's windows, not a prefill job's");
    int n_in = (o.prompt != NULL) + (o.file != NULL) + (o.tokens != NULL);
    if (tokenize && resume)
        kvp_cli_usage_error("--tokenize takes prompts, not --resume");
    if (tokenize && o.n_stop) /* nothing is generated or written: it would be ignored */
        kvp_cli_usage_error("--stop goes with a prefill job (its stream carries it), not --tokenize");
    if (tokenize && (output_given || o.stats || o.stats_file)) /* likewise */
        kvp_cli_usage_error("--tokenize prints the ids on standard output: not -o or --stats (redirect it)");
    /* a job's stream is binary: --json would change nothing */
    if (!tokenize && o.json && !o.stats)
        kvp_cli_usage_error("--json gives --stats' lines (and --tokenize's ids) as JSON: give --stats too");
    if (tokenize && n_in == 0)
        o.file = "-";
    else if (n_in != 1 && resume)
        kvp_cli_usage_error("--resume continues with its next turn: give one of -p TEXT and --tokens IDS");
    else if (n_in != 1)
        kvp_cli_usage_error("give one of -p TEXT, -f FILE and --tokens IDS");
    if (resume && o.file)
        kvp_cli_usage_error("--resume takes the next turn as -p TEXT or --tokens IDS, not -f");
    if (resume && o.system) /* the conversation's system turn is its first turn's, already in the stream */
        kvp_cli_usage_error("--resume continues a conversation, whose system turn came with its first turn: "
                            "no --system");
    if (optind < argc)
        kvp_cli_usage_error("unexpected argument '%s'%s", argv[optind], kvp_cli_operand_hint(argc, argv, optind));
    if (!*output)
        kvp_cli_usage_error("-o: an empty file name (- for standard output)");
    /* as quantize and kvdump --extract: a KV stream is no text for a screen
     * (under mpirun a rank's standard output is a pseudo-terminal wherever
     * mpirun's goes: `mpirun ... prefill --tp 3 > kv.kvp` was refused) */
    if (!tokenize && strcmp(output, "-") == 0 && isatty(STDOUT_FILENO) && !kvp_comm_mpi_launched())
        kvp_cli_usage_error("the KV stream is binary: give -o FILE, or redirect standard output to a file or pipe");
    kvp_cli_refuse_stdout_input(o.file, "prompts file");
    kvp_cli_refuse_stdout_input(o.model, "model");
    kvp_cli_refuse_stdout_input(resume, "KV stream resumed");
    /* the stream would replace the prompts it is made from (a --resume
     * stream continued into itself is read whole first: no such loss) */
    if (!tokenize) {
        kvp_cli_refuse_same("-o ", output, o.file, "prompts file");
        kvp_cli_refuse_same("-o ", output, o.model, "model");
        kvp_cli_refuse_same("--stats=", o.stats_file, o.file, "prompts file");
        kvp_cli_refuse_same("--stats=", o.stats_file, o.model, "model");
        kvp_cli_refuse_same("--stats=", o.stats_file, resume, "KV stream resumed");
        if (o.stats_file && (kvp_cli_same_path(o.stats_file, output) ||
                             (kvp_cli_is_stdout(o.stats_file) && kvp_cli_is_stdout(output))))
            kvp_cli_usage_error("--stats=%s is the -o stream: write the statistics to another file", o.stats_file);
        kvp_cli_check_output("--stats=", o.stats_file); /* written when the job ends: a bad name fails now */
    }
    kvp_err err = {0};
    if (kvp_sample_check(&o.sampling, &err) < 0)
        kvp_cli_usage_error("%s", err.msg);
    kvp_runopts_check_prompt_args(&o);
    if (tokenize) {
        list_tokens(&o);
        kvp_runopts_free(&o);
        return kvp_cli_close_stdout();
    }

    /* SIGINT and SIGTERM stop the job as they stop decode (stopsig.h):
     * noted while the model loads, then ending a wait for input too */
    kvp_stopsig_catch_loading();
    kvp_run r;
    if (kvp_run_open(&r, &o, &err) < 0)
        kvp_cli_die_err(&err);
    kvp_stopsig_catch();
    pf_job j = {.r = &r, .o = &o, .go = {.chunk = o.chunk}, .t_all = kvp_gen_now()};
    if (!(j.logits = malloc(sizeof(float) * r.model->cfg.n_vocab)))
        kvp_cli_die("out of memory");
    kvp_progress pg;
    if (progress >= 0) {
        uint64_t n = o.file ? 0 : 1; /* --resume: its sequences, once they are read */
        if (o.file && kvp_prompts_count_file(o.file, &n, &err) < 0)
            kvp_cli_die_err(&err);
        kvp_progress_init(&pg, stderr, kvp_cli_prog(), progress, n, n > 0 || resume);
        j.pg = &pg;
    }
    if (resume)
        prefill_resumed(&j, resume, output);
    else if (o.file)
        prefill_file(&j, output);
    else
        prefill_given(&j, output);
    uint64_t nb = 0, nr = 0;
    /* a stopped job's stream says so, so a decode down the pipe (whose
     * input is otherwise a whole stream) can tell it was not all */
    kvp_stop_rec stop = {.signal = (uint32_t)kvp_stopsig_caught(), .flags = j.read_all ? 0 : KVP_STOP_INPUT_LEFT,
                         .written = j.n, .left = j.left};
    /* so does one continuing a stream that was cut short: the producer's
     * signal and what it left, this stream's count */
    int in_cut = !j.stopped && j.in_stop.signal;
    if (in_cut)
        stop = (kvp_stop_rec){.signal = j.in_stop.signal, .flags = j.in_stop.flags, .written = j.n,
                              .left = j.in_stop.left};
    if ((j.stopped || in_cut) && kvp_run_save_stopped(&j.sv, &stop, &err) < 0)
        kvp_cli_die_err(&err);
    /* Both outputs whole before either is renamed into place, the
     * statistics first (a stream on standard output then ends without its
     * END record when they fail, so its reader fails too), then the two
     * renames back to back: a --stats=FILE on a full disk had failed the
     * job after -o's stream was in place. */
    kvp_run_save_counts(&j.sv, &nb, &nr);
    kvp_out stats_out = {.fd = -1};
    if (o.stats_file)
        seal_stats_file(o.stats_file, &j, nb, nr, &stats_out);
    kvp_out *outs[2] = {&j.sv.out, &stats_out};
    if (kvp_run_save_seal(&j.sv, &err) < 0 || kvp_out_commit_all(outs, o.stats_file ? 2 : 1, &err) < 0 ||
        kvp_run_save_commit(&j.sv, &err) < 0)
        kvp_cli_die_err(&err);
    if (j.pg)
        kvp_progress_prompts(j.pg, j.n, j.computed, 1);
    if (o.stats && !o.stats_file && !o.json)
        fprintf(stderr, "prefill: %llu sequences, %llu prompt tokens in %.3f s; %llu KV blocks written, %llu shared "
                "by reference\n", (unsigned long long)j.n, (unsigned long long)j.total, kvp_gen_now() - j.t_all,
                (unsigned long long)nb, (unsigned long long)nr);
    if (j.stopped)
        kvp_stopsig_say(j.n, j.left, j.read_all, NULL);
    if (in_cut) /* as decode says of such a stream: each sequence extended, yet not all that was asked */
        kvp_run_say_input_cut(resume, &j.in_stop, "; the output says so too");
    free(j.logits);
    kvp_run_close(&r);
    kvp_runopts_free(&o);
    int rc = kvp_cli_close_stdout();
    return j.stopped ? kvp_stopsig_status() : in_cut ? KVP_EXIT_FAIL : rc;
}
