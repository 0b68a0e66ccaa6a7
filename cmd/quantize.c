/* quantize - convert a model (GGUF, safetensors, KVP) into a KVP model file
 * with its tensors in another dtype, and report the error introduced; or
 * convert the KV blocks of a KVP stream (--kv).
 *
 * The work is lib/convert.h; this file parses options and prints.
 */
#include "cli.h"
#include "convert.h"
#include "io.h"
#include "perplexity.h"
#include "threadpool.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PRODUCER "quantize " KVP_VERSION

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: quantize [options] INPUT -o OUTPUT\n"
            "       quantize --kv TYPE [-o OUTPUT] [INPUT|-]\n"
            "Convert a model (.gguf, .safetensors file or folder, .kvp) into a KVP model file,\n"
            "quantizing its weights (safetensors without config.json: its tensors alone);\n"
            "or convert the KV blocks of a KVP stream (--kv).\n"
            "\n"
            "  -t, --to TYPE         weights: f32 f16 bf16 fp8 fp8-e5m2 int8 int4 fp4 nvfp4 mxfp4\n"
            "                        q8_0 q4_0 q4_1 q5_0 q5_1, or keep (default: keep)\n"
            "  -s, --scheme SCHEME   tensor, channel or group scales (fp8, int8, int4, fp4);\n"
            "                        default: fp8 tensor, int8 channel, int4 group 128, fp4 group 32\n"
            "  -g, --group N         elements per scale along a row (implies --scheme group)\n"
            "      --asym            int8/int4 with zero points\n"
            "  -e, --embed TYPE      token embeddings (default: keep, but quantized ones\n"
            "                        widen to an f32/f16/bf16 --to; keep keeps them always)\n"
            "  -i, --include REGEX   convert only tensors whose name matches (others are kept)\n"
            "  -x, --exclude REGEX   keep tensors whose name matches as they are\n"
            "      --drop REGEX      leave tensors whose name matches out of the output\n"
            "                        -i, -x and --drop are repeatable: each adds a pattern, and\n"
            "                        any one matching applies the option; a pattern that matches\n"
            "                        no tensor is noted on standard error\n"
            "  -o, --output FILE     the KVP file to write (- for standard output)\n"
            "  -f, --force           overwrite OUTPUT if it exists\n"
            "  -n, --dry-run         print the plan and sizes; write nothing\n"
            "  -r, --report FILE     per-tensor error report (- for standard output)\n"
            "      --json            report (and dry-run plan) as JSON Lines instead of TSV\n"
            "  -z, --zstd[=LEVEL]    compress records with zstd (default level 3)\n"
            "      --threads N       worker threads (default: all cores)\n"
            "      --eval TEXT       then score TEXT with the input and the output model: PPL of each,\n"
            "                        KL divergence and top-token agreement (in windows of 512, or\n"
            "                        the model's context where shorter, as prefill --perplexity),\n"
            "                        printed and added to the report\n"
            "      --eval-chunks N   score at most N windows of TEXT\n"
            "      --kv TYPE         convert KV blocks to f32, f16, bf16, fp8 or int8\n"
            "  -h, --help            show this help and exit\n"
            "  -V, --version         show the version and exit\n"
            "\n"
            "Norms and 1-D tensors are always stored as f32.\n"
            "Exit status: 0 success, 1 bad input or I/O error, 2 usage error.  See quantize(1).\n");
}

typedef struct options {
    kvp_convert_opts co;
    /* every -i, -x and --drop in order (argv's strings), co.include,
     * co.exclude and co.drop: argc slots each, in one allocation that
     * include starts and main frees */
    const char **include, **exclude, **drop;
    const char *output, *report;
    int force, dry_run, json, zstd, threads, kv;
    int scheme_set;
    const char *eval;      /* --eval TEXT */
    uint32_t eval_chunks;
} options;

static uint32_t parse_scheme(const char *s)
{
    if (strcmp(s, "tensor") == 0)
        return KVP_SCHEME_TENSOR;
    if (strcmp(s, "channel") == 0)
        return KVP_SCHEME_CHANNEL;
    if (strcmp(s, "group") == 0)
        return KVP_SCHEME_GROUP;
    kvp_cli_usage_error("--scheme: '%s' is not tensor, channel or group", s);
}

static int parse_type(const char *opt, const char *s)
{
    int d = kvp_convert_dtype_from_name(s);
    if (d == -2)
        kvp_cli_usage_error("%s: unknown type '%s' (see --help)", opt, s);
    return d;
}

static void check_regex(const char *opt, const char *re)
{
    kvp_err err = {0};
    if (kvp_convert_check_regex(re, &err) < 0)
        kvp_cli_usage_error("%s: %s", opt, err.msg);
}

/* -i, -x, --drop: each one given adds re to its list */
static void add_pattern(const char *opt, const char *re, const char **list, size_t *n)
{
    check_regex(opt, re);
    list[(*n)++] = re;
}

static void parse(int argc, char **argv, options *o)
{
    enum { OPT_ASYM = 256, OPT_DROP, OPT_JSON, OPT_THREADS, OPT_KV, OPT_EVAL, OPT_EVAL_CHUNKS };
    static const struct option lopts[] = {
        {"to", required_argument, NULL, 't'},      {"scheme", required_argument, NULL, 's'},
        {"group", required_argument, NULL, 'g'},   {"asym", no_argument, NULL, OPT_ASYM},
        {"embed", required_argument, NULL, 'e'},   {"include", required_argument, NULL, 'i'},
        {"exclude", required_argument, NULL, 'x'}, {"drop", required_argument, NULL, OPT_DROP},
        {"output", required_argument, NULL, 'o'},  {"force", no_argument, NULL, 'f'},
        {"dry-run", no_argument, NULL, 'n'},       {"report", required_argument, NULL, 'r'},
        {"json", no_argument, NULL, OPT_JSON},     {"zstd", optional_argument, NULL, 'z'},
        {"threads", required_argument, NULL, OPT_THREADS}, {"kv", required_argument, NULL, OPT_KV},
        {"eval", required_argument, NULL, OPT_EVAL}, {"eval-chunks", required_argument, NULL, OPT_EVAL_CHUNKS},
        {"help", no_argument, NULL, 'h'},          {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    memset(o, 0, sizeof *o);
    kvp_convert_opts_init(&o->co);
    o->kv = -1;
    o->include = malloc(3 * (size_t)argc * sizeof *o->include); /* no more of each than arguments */
    if (!o->include)
        kvp_cli_die("out of memory");
    o->exclude = o->include + argc;
    o->drop = o->exclude + argc;
    o->co.include = o->include, o->co.exclude = o->exclude, o->co.drop = o->drop;
    int c, to_set = 0, embed_set = 0;
    kvp_cli_note_optional_values(argc, argv, lopts);
    while ((c = getopt_long(argc, argv, "t:s:g:e:i:x:o:fnr:z::hV", lopts, NULL)) != -1) {
        switch (c) {
        case 't': o->co.to = parse_type("--to", optarg); to_set = 1; break;
        case 's': o->co.scheme = parse_scheme(optarg); o->scheme_set = 1; break;
        case 'g': o->co.group = (uint32_t)kvp_cli_opt_i64("--group", optarg, 2, 65536); break;
        case OPT_ASYM: o->co.asym = 1; break;
        case 'e': o->co.embed = parse_type("--embed", optarg); embed_set = 1; break;
        case 'i': add_pattern("--include", optarg, o->include, &o->co.n_include); break;
        case 'x': add_pattern("--exclude", optarg, o->exclude, &o->co.n_exclude); break;
        case OPT_DROP: add_pattern("--drop", optarg, o->drop, &o->co.n_drop); break;
        case 'o': o->output = optarg; break;
        case 'f': o->force = 1; break;
        case 'n': o->dry_run = 1; break;
        case 'r': o->report = optarg; break;
        case OPT_JSON: o->json = 1; break;
        case 'z': o->zstd = optarg ? (int)kvp_cli_opt_i64("--zstd", optarg, 1, 19) : 3; break;
        case OPT_THREADS: o->threads = (int)kvp_cli_opt_i64("--threads", optarg, 1, 1024); break;
        case OPT_KV:
            /* keep (-1) would read as no --kv at all: a model conversion */
            if ((o->kv = parse_type("--kv", optarg)) == -1)
                kvp_cli_usage_error("--kv: KV blocks convert to f32, f16, bf16, fp8 or int8 (not keep)");
            break;
        case OPT_EVAL:
            if (!*optarg)
                kvp_cli_usage_error("--eval: an empty file name");
            o->eval = optarg;
            break;
        case OPT_EVAL_CHUNKS:
            o->eval_chunks = (uint32_t)kvp_cli_opt_i64("--eval-chunks", optarg, 1, UINT32_MAX);
            break;
        case 'h':
            usage(stdout);
            exit(kvp_cli_close_stdout());
        case 'V': kvp_cli_version();
        default: kvp_cli_bad_option(argv, "t:s:g:e:i:x:o:fnr:z::hV", lopts);
        }
    }
    if (o->eval_chunks && !o->eval)
        kvp_cli_usage_error("--eval-chunks goes with --eval TEXT");
    if (o->eval && (o->kv != -1 || o->dry_run))
        kvp_cli_usage_error("--eval scores a converted model: not with --kv or --dry-run");
    if (o->report && o->dry_run) /* it wrote nothing there, exit 0 */
        kvp_cli_usage_error("--report with --dry-run: a dry run reads no values, so it has no error to report "
                            "(its plan is on standard output)");
    if (o->kv != -1) {
        if (to_set || embed_set || o->scheme_set || o->co.group || o->co.asym || o->co.n_include ||
            o->co.n_exclude || o->co.n_drop || o->dry_run)
            kvp_cli_usage_error("--kv converts KV blocks only: it takes no --to, --embed, --scheme, --group, "
                                "--asym, --include, --exclude, --drop or --dry-run");
        int d = o->kv;
        if (d != KVP_DTYPE_F32 && d != KVP_DTYPE_F16 && d != KVP_DTYPE_BF16 && d != KVP_DTYPE_FP8_E4M3 &&
            d != KVP_DTYPE_I8)
            kvp_cli_usage_error("--kv: KV blocks convert to f32, f16, bf16, fp8 or int8");
        return;
    }
    int scaled = kvp_convert_dtype_scaled(o->co.to);
    if ((o->scheme_set || o->co.group) && !scaled)
        kvp_cli_usage_error("--scheme and --group apply to fp8, fp8-e5m2, int8, int4 and fp4, not --to %s",
                            to_set && o->co.to >= 0 ? kvp_dtype_name((uint32_t)o->co.to) : "keep");
    if (o->co.group) {
        if (o->scheme_set && o->co.scheme != KVP_SCHEME_GROUP)
            kvp_cli_usage_error("--group goes with --scheme group");
        if (o->co.group % 2)
            kvp_cli_usage_error("--group: %u is odd (a group is an even number of elements for every type: 4-bit "
                                "ones pack two a byte)", o->co.group);
        o->co.scheme = KVP_SCHEME_GROUP;
    }
    if (o->co.asym && o->co.to != KVP_DTYPE_I8 && o->co.to != KVP_DTYPE_I4)
        kvp_cli_usage_error("--asym applies to int8 and int4");
}

/* ---- report and progress ---- */

/* The --report file is written like the model: under a temporary name,
 * renamed into place only when the conversion succeeded, so a failed run
 * leaves no half report (and an earlier report where it was).  A report
 * to standard output (-r -) is held until then too: a reader of the pipe
 * gets the whole report or none of it.
 *
 * The order at the end of a run (commit_with_report): the report's last
 * line, the report file synced and closed, the output synced and closed,
 * the held lines printed, then both renamed back to back with a signal
 * held off (kvp_out_commit_all).  A report or output that cannot be
 * written (a full disk, a quota) so fails the run before either is
 * renamed into place; what is left after that (two renames in folders
 * they were created in) fails only when something else changes a folder
 * meanwhile, and then says which file is in place.  Standard output
 * cannot be taken back: a report there is out before the renames. */
typedef struct reporter {
    kvp_out out;         /* the --report target, when on */
    int on;
    int hold;            /* standard output: the lines kept in held until the commit */
    kvp_buf held;
    int json;
    int tty;             /* stderr is a terminal: progress and a short table */
    size_t done, total;
    kvp_buf line;
} reporter;

static void report_open(reporter *r, const char *path)
{
    kvp_err err = {0};
    r->on = path != NULL;
    r->hold = r->on && !strcmp(path, "-");
    kvp_buf_init(&r->held);
    if (r->on && kvp_out_open(&r->out, path, &err) < 0)
        kvp_cli_die_err(&err);
}

/* Write r->line to the report. */
static int report_put(reporter *r, kvp_err *err)
{
    if (!r->on)
        return 0;
    if (!r->hold)
        return kvp_out_write(&r->out, r->line.data, r->line.len, err);
    kvp_buf_put(&r->held, r->line.data, r->line.len);
    return r->held.oom ? kvp_err_set(err, KVP_ENOMEM, "the report: out of memory") : 0;
}

/* A report file's data on disk and closed (a full disk or a quota said
 * here, where it can still fail the whole run), only its rename left. */
static int report_seal(reporter *r, kvp_err *err) { return r->on && !r->hold ? kvp_out_seal(&r->out, err) : 0; }

/* The held lines of a report to standard output, written once the output
 * is sealed too: what is left to fail after them is the renames. */
static int report_flush_held(reporter *r, kvp_err *err)
{
    if (!r->on || !r->hold)
        return 0;
    int rc = kvp_out_write(&r->out, r->held.data, r->held.len, err);
    kvp_buf_free(&r->held);
    r->hold = 0;
    return rc;
}

/* The end of a run that succeeded so far: the report sealed, the output
 * sealed, a held report printed, then the output and the report renamed
 * together (kvp_out_commit_all: a signal waits for both renames). */
static int commit_with_report(reporter *r, kvp_out *out, kvp_err *err)
{
    int rc = report_seal(r, err);
    if (rc == 0 && (rc = kvp_out_seal(out, err)) == 0)
        rc = report_flush_held(r, err);
    if (rc < 0) {
        kvp_out_abort(out);
        return rc;
    }
    kvp_out *both[2] = {out, &r->out};
    rc = kvp_out_commit_all(both, r->on ? 2 : 1, err);
    kvp_buf_free(&r->held);
    r->on = 0;
    return rc;
}

static void report_abort(reporter *r)
{
    if (r->on)
        kvp_out_abort(&r->out);
    kvp_buf_free(&r->held);
    r->on = 0;
}

static int on_tensor(void *ctx, const kvp_convert_item *it, kvp_err *err)
{
    reporter *r = ctx;
    r->done++;
    r->line.len = 0;
    kvp_convert_report_row(&r->line, it, r->json);
    int rc = report_put(r, err);
    if (rc < 0)
        return rc;
    if (r->tty)
        fprintf(stderr, "\r%s: [%zu/%zu] %-48.48s", kvp_cli_prog(), r->done, r->total, it->src.name);
    return 0;
}

/* What the report's "to" column says of a tensor: its output dtype, or
 * "dropped". */
static const char *to_name(const kvp_convert_item *it)
{
    return it->action == KVP_CONVERT_DROP ? "dropped" : kvp_dtype_name(it->out.dtype);
}

/* The short table on a terminal: one line per (from, to, scheme), dropped
 * tensors on lines of their own, so the columns add up to the total line. */
static void print_table(const kvp_convert *cv, const kvp_convert_totals *t)
{
    size_t n = kvp_convert_count(cv);
    char *done = calloc(n ? n : 1, 1);
    if (!done)
        return;
    fprintf(stderr, "\r%-72s\r%-10s %-10s %-12s %7s %14s %14s %9s\n", "", "from", "to", "scheme", "tensors", "bytes in",
            "bytes out", "SNR dB");
    for (size_t i = 0; i < n; i++) {
        const kvp_convert_item *a = kvp_convert_item_at(cv, i);
        if (done[i])
            continue;
        char sa[32], sb[32];
        kvp_convert_scheme_str(&a->out, sa, sizeof sa);
        kvp_quant_stats st;
        memset(&st, 0, sizeof st);
        uint64_t k = 0, in = 0, out = 0;
        for (size_t j = i; j < n; j++) {
            const kvp_convert_item *b = kvp_convert_item_at(cv, j);
            kvp_convert_scheme_str(&b->out, sb, sizeof sb);
            if (done[j] || strcmp(a->src_type, b->src_type) || strcmp(to_name(a), to_name(b)) || strcmp(sa, sb))
                continue;
            done[j] = 1;
            k++;
            in += b->src.data_bytes + b->src.scales_bytes + b->src.zeros_bytes;
            if (b->action != KVP_CONVERT_DROP)
                out += b->out.data_bytes + b->out.scales_bytes + b->out.zeros_bytes;
            if (b->action == KVP_CONVERT_QUANT)
                kvp_quant_stats_merge(&st, &b->stats);
        }
        kvp_quant_report rep;
        kvp_quant_stats_report(&st, &rep);
        fprintf(stderr, "%-10s %-10s %-12s %7" PRIu64 " %14" PRIu64 " %14" PRIu64 " %9.2f\n", a->src_type,
                to_name(a), sa, k, in, out, rep.snr_db);
    }
    kvp_quant_report rep;
    kvp_quant_stats_report(&t->stats, &rep);
    fprintf(stderr, "%-10s %-10s %-12s %7" PRIu64 " %14" PRIu64 " %14" PRIu64 " %9.2f\n", "total", "", "",
            t->n_read, t->bytes_in, t->bytes_out, rep.snr_db);
    free(done);
}

/* ---- the plan (--dry-run) ---- */

/* The plan on standard output: a header (TSV), one line a tensor, the
 * total (whose byte columns are the sums of the rows, dropped ones too). */
static void print_plan(const kvp_convert *cv, int json)
{
    kvp_buf b;
    kvp_buf_init(&b);
    if (!json)
        kvp_convert_plan_header(&b);
    for (size_t i = 0; i < kvp_convert_count(cv); i++)
        kvp_convert_plan_row(&b, kvp_convert_item_at(cv, i), json);
    kvp_convert_totals t;
    kvp_convert_totals_get(cv, &t);
    kvp_convert_plan_summary(&b, &t, json);
    if (b.oom)
        kvp_cli_die("the plan: out of memory");
    fwrite(b.data, 1, b.len, stdout);
    kvp_buf_free(&b);
}

/* ---- the two modes ---- */

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* path is an existing file the conversion reads beside the input: any file
 * of an input folder (a safetensors model folder: shards, config,
 * tokenizer), or, for a safetensors file or index given by name, a
 * .safetensors or .json file of its folder (the other shards, config.json,
 * tokenizer.json, which it reads too). */
static int inside_folder(const char *path, const char *input)
{
    struct stat si, sp, sd;
    if (!input || stat(input, &si) != 0 || stat(path, &sp) != 0)
        return 0;
    int is_dir = S_ISDIR(si.st_mode);
    if (!is_dir && !ends_with(input, ".safetensors") && !ends_with(input, ".json"))
        return 0; /* GGUF, KVP: the file alone */
    if (!is_dir && !ends_with(path, ".safetensors") && !ends_with(path, ".json"))
        return 0;
    char *dir = kvp_path_dir(path), *idir = is_dir ? NULL : kvp_path_dir(input);
    int in = dir && (is_dir || idir) && stat(dir, &sd) == 0 && (is_dir || stat(idir, &si) == 0) &&
             sd.st_dev == si.st_dev && sd.st_ino == si.st_ino;
    free(dir);
    free(idir);
    return in;
}

/* The checks of one file quantize writes (what: "-o" or "--report"):
 * never the input (input "-": the file standard input reads, named as
 * /dev/stdin, /proc/self/fd/0 or its own name) or a file of the input
 * folder, never a directory, an existing file only under --force. */
static void check_target(const char *path, const char *what, const char *input, int force)
{
    if (!*path)
        kvp_cli_usage_error("%s: an empty file name", what);
    if (strcmp(path, "-") == 0)
        return;
    int from_stdin = strcmp(input, "-") == 0;
    int same = from_stdin ? kvp_cli_same_file(path, input) : kvp_cli_same_path(path, input);
    if (same || (!from_stdin && inside_folder(path, input)))
        kvp_cli_usage_error("%s %s: the %s would replace %s", what, path, strcmp(what, "--report") ? "output" : "report",
                            !same ? "a file of the input folder"
                            : from_stdin ? "the input (standard input)" : "the input");
    struct stat so;
    if (stat(path, &so) != 0)
        return;
    if (S_ISDIR(so.st_mode))
        kvp_cli_die("%s: is a directory", path);
    /* a device or FIFO (-o /dev/null) is written in place, not replaced */
    if (S_ISREG(so.st_mode) && !force)
        kvp_cli_die("%s: exists (--force overwrites it)", path);
}

/* Whether path can be read a second time from its start: a file or a
 * folder (standard input when it is redirected from a file); one that
 * does not exist passes, for the reader's own message. */
static int rereadable(const char *path)
{
    struct stat st;
    if (strcmp(path, "-") == 0)
        return fstat(STDIN_FILENO, &st) == 0 && S_ISREG(st.st_mode);
    return stat(path, &st) != 0 || S_ISREG(st.st_mode) || S_ISDIR(st.st_mode);
}

/* --eval scores the text with the input model, then with the output: both
 * are read twice, which a pipe cannot give (it failed after the whole
 * conversion, the second read finding the pipe empty). */
static void check_eval_inputs(const options *o, const char *input)
{
    /* by any name: /dev/stdin or /proc/self/fd/0 is standard input too */
    int in_stdin = strcmp(input, "-") == 0 || kvp_cli_same_file(input, "-");
    int eval_stdin = strcmp(o->eval, "-") == 0 || kvp_cli_same_file(o->eval, "-");
    if (in_stdin && eval_stdin)
        kvp_cli_usage_error("INPUT %s and --eval %s both read standard input: give one of them as a file", input,
                            o->eval);
    if (!rereadable(input))
        kvp_cli_usage_error("--eval reads INPUT %s again to score the text with it: give a file, not a pipe",
                            input);
    if (!rereadable(o->eval))
        kvp_cli_usage_error("--eval %s is read twice (scored by the input and by the output model): give a file, "
                            "not a pipe", o->eval);
}

static void check_output(const options *o, const char *input)
{
    if (strcmp(o->output, "-") == 0 && isatty(1))
        kvp_cli_usage_error("the output is binary; redirect standard output to a file or pipe");
    if (o->report && kvp_cli_is_stdout(o->report) && kvp_cli_is_stdout(o->output))
        kvp_cli_usage_error("--report %s and -o %s would both write to standard output", o->report, o->output);
    if (o->report && strcmp(o->report, "-") != 0 && kvp_cli_same_path(o->report, o->output))
        kvp_cli_usage_error("--report %s: the report would replace the output", o->report);
    /* the text --eval scores is an input too: -o or --report renamed over
     * it when the job ends would destroy it */
    kvp_cli_refuse_same("-o ", o->output, o->eval, "text scored");
    kvp_cli_refuse_same("--report ", o->report, o->eval, "text scored");
    check_target(o->output, "-o", input, o->force);
    if (o->report) /* a report replaces an earlier one: it is a log, not a model */
        check_target(o->report, "--report", input, 1);
}

/* int8/int4 groups the CPU's int kernels cannot take (their activations
 * come in blocks of 32): such a model runs, its rows turned into f32 as
 * they are used, about ten times slower, which nothing else would say. */
static void note_slow_groups(const kvp_convert *cv)
{
    uint64_t n = 0;
    const kvp_convert_item *first = NULL;
    for (size_t i = 0; i < kvp_convert_count(cv); i++) {
        const kvp_convert_item *it = kvp_convert_item_at(cv, i);
        const kvp_tensor_rec *r = &it->out;
        if (it->action == KVP_CONVERT_DROP || (r->dtype != KVP_DTYPE_I8 && r->dtype != KVP_DTYPE_I4) ||
            r->scheme != KVP_SCHEME_GROUP || r->group % 32 == 0)
            continue;
        first = first ? first : it;
        n++;
    }
    if (n)
        kvp_cli_warn("note: %" PRIu64 " int tensor%s in groups that are not a multiple of 32 (first: %s, group %u): "
                     "the CPU engine has no int kernel for them and turns their rows into f32 as it uses them, "
                     "several times slower than groups of 32, 64 or 128",
                     n, n == 1 ? "" : "s", first->out.name, first->out.group);
}

static void note_fallbacks(const kvp_convert *cv, const kvp_convert_totals *t)
{
    const char *const *notes;
    size_t nn = kvp_convert_notes(cv, &notes);
    for (size_t i = 0; i < nn; i++)
        kvp_cli_warn("note: %s", notes[i]);
    note_slow_groups(cv);
    if (!t->n_fallback)
        return;
    for (size_t i = 0; i < kvp_convert_count(cv); i++) {
        const kvp_convert_item *it = kvp_convert_item_at(cv, i);
        if (it->note[0] && it->action != KVP_CONVERT_DROP) {
            kvp_cli_warn("note: %" PRIu64 " tensor%s took a fallback (first: %s: %s)", t->n_fallback,
                         t->n_fallback == 1 ? "" : "s", it->src.name, it->note);
            return;
        }
    }
}

/* ---- --eval ---- */

/* Score the text with the source model, saving its top 32 as the base (in
 * a temporary folder; kvp_ppl_run saves whole rows of a vocabulary of 32
 * or fewer), then the written output (at path output, its temporary name)
 * against it; one report line. */
static int eval_models(const options *o, const char *input, const char *output, kvp_buf *line, kvp_err *err)
{
    char dir[4096], base[4200];
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/quantize-eval.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir))
        return kvp_err_set(err, KVP_EIO, "%s: cannot make a temporary folder: %s", dir, strerror(errno));
    snprintf(base, sizeof base, "%s/base.kvp", dir);
    /* a signal or an error exit mid-eval leaves neither behind */
    int h_dir = kvp_tmp_remember(dir), h_base = kvp_tmp_remember(base);
    kvp_runopts ro;
    kvp_runopts_init(&ro);
    ro.model = input;
    ro.threads = o->threads;
    kvp_ppl_opts po = {.max_windows = o->eval_chunks, .save_k = 32, .bos = -1, .save_path = base,
                       .producer = PRODUCER};
    kvp_ppl_result src, out;
    int rc = kvp_perplexity_run(&ro, o->eval, &po, &src, err);
    if (rc == 0) {
        ro.model = output;
        po.save_path = NULL;
        po.base_path = base;
        rc = kvp_perplexity_run(&ro, o->eval, &po, &out, err);
    }
    unlink(base);
    rmdir(dir);
    kvp_tmp_forget(h_base, base);
    kvp_tmp_forget(h_dir, dir);
    kvp_runopts_free(&ro);
    if (rc < 0)
        return kvp_err_prefix(err, "--eval"), rc;
    const kvp_kld_summary *k = &out.kld;
    /* the text's path is a TSV cell as a tensor's name is (a tab or a
     * newline in it would add a column or cut the row), and one line on
     * standard error */
    kvp_buf text;
    kvp_buf_init(&text);
    kvp_convert_tsv_cell(&text, o->eval);
    kvp_buf_u8(&text, 0);
    char *mem = NULL;
    size_t len = 0;
    FILE *f = text.oom ? NULL : open_memstream(&mem, &len);
    if (!f) {
        kvp_buf_free(&text);
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    }
    if (o->json) {
        fputs("{\"eval\":true,\"text\":", f);
        kvp_cli_json_str(f, o->eval, strlen(o->eval));
        fprintf(f, ",\"tokens\":%" PRIu64 ",\"ctx\":%u,\"windows\":%u,\"scored\":%" PRIu64
                ",\"source_ppl\":%.6f,\"source_ppl_err\":%.6f,\"ppl\":%.6f,\"ppl_err\":%.6f,"
                "\"ppl_ratio\":%.6f,\"ppl_ratio_err\":%.6f,\"kld\":%.6g,\"kld_err\":%.6g,\"kld_p99\":%.6g,"
                "\"kld_max\":%.6g,\"same_top\":%.6f,\"dp_rms\":%.6g}\n",
                out.n_tokens, out.ctx, out.n_windows, out.sum.n, src.ppl, src.ppl_err, out.ppl, out.ppl_err,
                k->ratio, k->ratio_err, k->kld_mean, k->kld_err, k->kld_pct[1], k->kld_max, k->same_top, k->dp_rms);
    } else {
        /* the JSON object's fields in its order, each in a column */
        fprintf(f, "eval\ttokens\tctx\twindows\tscored\tsource_ppl\tsource_ppl_err\tppl\tppl_err\tppl_ratio\t"
                "ppl_ratio_err\tkld\tkld_err\tkld_p99\tkld_max\tsame_top\tdp_rms\n"
                "%s\t%" PRIu64 "\t%u\t%u\t%" PRIu64 "\t%.6f\t%.6f\t%.6f\t%.6f\t%.6f\t%.6f\t%.6g\t%.6g\t%.6g\t"
                "%.6g\t%.6f\t%.6g\n",
                (const char *)text.data, out.n_tokens, out.ctx, out.n_windows, out.sum.n, src.ppl,
                src.ppl_err, out.ppl, out.ppl_err, k->ratio, k->ratio_err, k->kld_mean, k->kld_err, k->kld_pct[1],
                k->kld_max, k->same_top, k->dp_rms);
    }
    fclose(f);
    kvp_buf_put(line, mem, len);
    free(mem);
    fprintf(stderr, "%s: %s: PPL %.4f -> %.4f (x%.4f), mean KLD %.6f, 99%% KLD %.6f, same top token %.2f%%\n",
            kvp_cli_prog(), (const char *)text.data, src.ppl, out.ppl, k->ratio, k->kld_mean, k->kld_pct[1], 100 * k->same_top);
    kvp_buf_free(&text);
    return 0;
}

/* An -i, -x or --drop pattern that matched no tensor is likely a typo (an
 * --include one converts nothing): said before the (long) conversion
 * starts, the exit status unchanged. */
static void note_unmatched_patterns(const kvp_convert *cv, const kvp_convert_opts *co)
{
    const struct {
        const char *opt;
        const char *const *re;
        size_t n;
    } lists[KVP_CONVERT_PATTERNS_COUNT] = {
        [KVP_CONVERT_PATTERNS_INCLUDE] = {"--include", co->include, co->n_include},
        [KVP_CONVERT_PATTERNS_EXCLUDE] = {"--exclude", co->exclude, co->n_exclude},
        [KVP_CONVERT_PATTERNS_DROP] = {"--drop", co->drop, co->n_drop},
    };
    for (int l = 0; l < KVP_CONVERT_PATTERNS_COUNT; l++)
        for (size_t k = 0; k < lists[l].n; k++)
            if (kvp_convert_pattern_matches(cv, l, k) == 0)
                kvp_cli_warn("note: %s '%s' matched no tensor", lists[l].opt, lists[l].re[k]);
}

static int run_model(const options *o, const char *input)
{
    kvp_err err = {0};
    kvp_convert *cv;
    if (kvp_convert_open(&cv, input, &err) < 0)
        kvp_cli_die_err(&err);
    if (kvp_convert_plan(cv, &o->co, &err) < 0)
        kvp_cli_die_err(&err);
    note_unmatched_patterns(cv, &o->co);
    kvp_convert_totals t;
    kvp_convert_totals_get(cv, &t);
    if (o->dry_run) {
        note_fallbacks(cv, &t);
        print_plan(cv, o->json);
        kvp_convert_free(cv);
        return kvp_cli_close_stdout();
    }
    kvp_threadpool *pool = NULL;
    if (kvp_threadpool_create(&pool, o->threads, &err) < 0)
        kvp_cli_die_err(&err);
    reporter r = {.json = o->json, .tty = kvp_cli_progress_enabled(), .total = t.n_tensors + t.n_dropped};
    kvp_buf_init(&r.line);
    report_open(&r, o->report);
    if (!o->json)
        kvp_convert_report_header(&r.line);
    kvp_out out;
    int rc = report_put(&r, &err);
    if (rc == 0 && (rc = kvp_out_open(&out, o->output, &err)) == 0) {
        rc = kvp_convert_write(cv, &out, o->zstd, PRODUCER, pool, on_tensor, &r, &err);
        kvp_convert_totals_get(cv, &t);
        r.line.len = 0;
        kvp_convert_report_summary(&r.line, &t, o->json);
        /* --eval reads the written model back before it is renamed into
         * place: a text it cannot score fails the run with no output */
        if (rc == 0 && o->eval)
            rc = eval_models(o, input, out.direct ? o->output : out.tmp_path, &r.line, &err);
        /* the whole report before the output's rename: a report that
         * cannot be written leaves the output as it was */
        if (rc == 0 && (rc = report_put(&r, &err)) == 0)
            rc = commit_with_report(&r, &out, &err);
        else
            kvp_out_abort(&out);
    }
    kvp_threadpool_free(pool);
    if (rc < 0) {
        report_abort(&r);
        if (r.tty)
            fputc('\n', stderr);
        kvp_cli_die_err(&err);
    }
    if (r.tty)
        print_table(cv, &t);
    note_fallbacks(cv, &t);
    kvp_buf_free(&r.line);
    kvp_convert_free(cv);
    return kvp_cli_close_stdout();
}

static int run_kv(const options *o, const char *input)
{
    kvp_err err = {0};
    kvp_in in;
    kvp_out out;
    kvp_convert_kv_stats st;
    int kind;
    /* KV blocks come from a model's prefill or decode, in a KVP stream; a
     * GGUF or safetensors file holds tensors, converted without --kv. */
    if (kvp_in_open(&in, input, &err) < 0 || kvp_in_kind(&in, &kind, &err) < 0)
        kvp_cli_die_err(&err);
    if (kind == KVP_FILE_GGUF || (kind == KVP_FILE_SAFETENSORS && ends_with(input, ".safetensors")))
        kvp_cli_die("%s: a %s file, not a KVP stream: --kv converts the KV blocks a model computed, which need the "
                    "model's config (convert its tensors without --kv)", input,
                    kind == KVP_FILE_GGUF ? "GGUF" : "safetensors");
    /* the report is created before any work, as in a model conversion (a
     * folder that is not there fails now), and finished before the
     * output's commit: see reporter */
    reporter r = {.json = o->json};
    kvp_buf_init(&r.line);
    report_open(&r, o->report);
    int rc = kvp_out_open(&out, o->output, &err);
    if (rc == 0) {
        rc = kvp_convert_kv_stream(&in, &out, (uint32_t)o->kv, o->zstd, PRODUCER, &st, &err);
        if (rc == 0 && r.on) {
            kvp_convert_report_kv(&r.line, (uint32_t)o->kv, &st, o->json);
            rc = report_put(&r, &err);
        }
        if (rc == 0)
            rc = commit_with_report(&r, &out, &err);
        else
            kvp_out_abort(&out);
    }
    kvp_in_close(&in);
    if (rc < 0) {
        report_abort(&r);
        kvp_cli_die_err(&err);
    }
    kvp_buf_free(&r.line);
    return kvp_cli_close_stdout();
}

int main(int argc, char **argv)
{
    kvp_cli_init(argv[0]);
    options o;
    parse(argc, argv, &o);
    if (argc - optind > 1)
        kvp_cli_usage_error("one input at a time (got %d)%s", argc - optind, kvp_cli_operand_hint(argc, argv, optind));
    if (optind < argc && !*argv[optind]) /* quantize(1): a usage error, as -o '' is */
        kvp_cli_usage_error("INPUT: an empty file name");
    if (o.kv != -1) {
        const char *input = optind < argc ? argv[optind] : "-";
        kvp_cli_refuse_stdout_input(input, "input");
        if (!o.output)
            o.output = "-";
        check_output(&o, input);
        free(o.include); /* --kv takes no -i, -x or --drop */
        return run_kv(&o, input);
    }
    if (optind >= argc)
        kvp_cli_usage_error("no INPUT model given");
    const char *input = argv[optind]; /* "-": standard input (a GGUF; kvp_convert_open refuses the others) */
    kvp_cli_refuse_stdout_input(input, "input");
    if (!o.dry_run) {
        if (!o.output)
            kvp_cli_usage_error("no output: give -o OUTPUT (or --dry-run)");
        struct stat so;
        if (o.eval && (strcmp(o.output, "-") == 0 || (stat(o.output, &so) == 0 && !S_ISREG(so.st_mode) &&
                                                      !S_ISDIR(so.st_mode))))
            kvp_cli_usage_error("--eval reads the output model back: give -o a file, not standard output, a "
                                "device or a pipe");
        check_output(&o, input);
    }
    if (o.eval)
        check_eval_inputs(&o, input);
    int rc = run_model(&o, input);
    free(o.include);
    return rc;
}
