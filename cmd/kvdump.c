/* kvdump - print, check and extract the records of a KVP stream.
 *
 * The format's debugger (like ncdump or `zstd -l`): every record with its
 * offset, sizes, checksum status and per-kind fields; or only errors
 * (--check), totals (--summary), one tensor's bytes (--extract).
 */
#include "cli.h"
#include "io.h"
#include "logprobs.h"
#include "meta.h"
#include "seqcheck.h"
#include "stream.h"
#include "tensor.h"
#include "wire.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A sequence's token ids in the listing: the first SEQ_HEAD and the last
 * SEQ_TAIL (--json has them all). */
enum { SEQ_HEAD = 8, SEQ_TAIL = 4 };

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: kvdump [-c | -s | -x NAME] [-j] [FILE|-]\n"
            "Print the records of a KVP stream (a file, or standard input when FILE is - or absent).\n"
            "\n"
            "  -c, --check          verify the whole stream; print nothing but errors\n"
            "  -s, --summary        print totals: records by kind, bytes, compression ratio\n"
            "  -x, --extract NAME   write tensor NAME's raw data bytes to standard output\n"
            "  -j, --json           JSON Lines: one object per record (or the summary); a sequence's\n"
            "                       token ids all (\"token_ids\"), where the listing shows the first\n"
            "                       8 and the last 4\n"
            "  -h, --help           show this help and exit\n"
            "  -V, --version        show the version and exit\n"
            "\n"
            "Exit status: 0 valid stream, 1 corrupt/truncated input or I/O error, 2 usage error.\n"
            "See kvdump(1) and kvp(5).\n");
}

typedef struct totals {
    uint64_t count[KVP_KIND_COUNT], unknown;
    uint64_t stored, raw, records, tensor_bytes, tokens, compressed, positions;
    uint64_t file_bytes;
} totals;

typedef struct dumper {
    const char *name;
    int json, check, summary;
    const char *extract;
    int extracted;
    uint8_t *extract_data;    /* the tensor's bytes, held until the stream has checked out */
    size_t extract_len;
    kvp_seqcheck *sc;         /* --check: the sequences and their blocks, in order (seqcheck.h) */
    int have_scores;          /* saved distributions: the SCORES record seen */
    kvp_scores_rec scores;
    uint32_t next_window;     /* the window the next LOGPROBS must carry */
    totals t;
} dumper;

static void hex(char *out, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", p[i]);
}

static void print_shape(FILE *f, const kvp_tensor_rec *t, int json)
{
    fputc('[', f);
    for (uint32_t i = 0; i < t->n_dim; i++)
        fprintf(f, "%s%" PRIu64, i ? (json ? "," : ", ") : "", t->shape[i]);
    fputc(']', f);
}

static const char *scheme_name(uint32_t s)
{
    static const char *names[] = {"none", "tensor", "channel", "group"};
    return s < 4 ? names[s] : "?";
}

static void print_header(dumper *d, const kvp_stream_info *info)
{
    char fp[2 * KVP_FINGERPRINT_SIZE + 1];
    hex(fp, info->fingerprint, KVP_FINGERPRINT_SIZE);
    if (d->json) {
        printf("{\"kind\":\"header\",\"offset\":0,\"size\":%d,\"version\":\"%u.%u\",\"producer\":", KVP_HEADER_SIZE,
               info->major, info->minor);
        kvp_cli_json_str(stdout, info->producer, strlen(info->producer));
        printf(",\"fingerprint\":\"%s\",\"checksum\":\"ok\"}\n", fp);
    } else {
        printf("%10s  %-10s %10s %10s  %-8s %s\n", "OFFSET", "KIND", "STORED", "RAW", "CHECKSUM", "DETAILS");
        printf("%10d  %-10s %10d %10d  %-8s version %u.%u, producer \"%s\", fingerprint %s\n", 0, "header",
               KVP_HEADER_SIZE, KVP_HEADER_SIZE, "ok", info->major, info->minor, info->producer, fp);
    }
}

/* A sequence's request fields in JSON, when it has them: "cache_salt"
 * (hex) and "stop" (its strings). */
static int seq_request_json(FILE *f, const kvp_record *rec, const kvp_seq_rec *s, kvp_err *err)
{
    if (s->cache_salt)
        fprintf(f, ",\"cache_salt\":\"%016" PRIx64 "\"", s->cache_salt);
    if (!s->n_stop)
        return 0;
    char **stop;
    size_t n;
    int rc = kvp_seq_stops(rec, &stop, &n, err);
    if (rc < 0)
        return rc;
    fputs(",\"stop\":[", f);
    for (size_t k = 0; k < n; k++) {
        if (k)
            fputc(',', f);
        kvp_cli_json_str(f, stop[k], strlen(stop[k]));
    }
    fputc(']', f);
    kvp_seq_stops_free(stop, n);
    return 0;
}

/* Per-kind details: human text into a buffer, or JSON fields to stdout. */
static int describe(dumper *d, const kvp_record *rec, kvp_err *err)
{
    FILE *f = stdout;
    int show = !d->check && !d->summary && !d->extract;
    switch (rec->kind) {
    case KVP_KIND_CONFIG:
    case KVP_KIND_TOKENIZER: {
        kvp_meta m;
        kvp_meta_init(&m);
        int rc = kvp_meta_record_decode(rec, &m, err);
        if (!rc && show) {
            const char *arch = kvp_meta_get_str(&m, "general.architecture");
            if (d->json) {
                printf(",\"entries\":%zu", m.n);
                if (arch) {
                    printf(",\"architecture\":");
                    kvp_cli_json_str(f, arch, strlen(arch));
                }
            } else {
                printf("%zu entries", m.n);
                if (arch)
                    printf(", architecture %s", arch);
            }
        }
        kvp_meta_free(&m);
        return rc;
    }
    case KVP_KIND_TENSOR: {
        kvp_tensor_rec t;
        const uint8_t *data;
        int rc = kvp_tensor_decode(rec, &t, &data, NULL, NULL, err);
        if (rc)
            return rc;
        d->t.tensor_bytes += t.data_bytes + t.scales_bytes + t.zeros_bytes;
        if (d->extract && strcmp(d->extract, t.name) == 0 && !d->extracted) {
            /* Held, not written: damage later in the stream must leave the
             * output empty, never a tensor from a stream that fails. */
            if (t.data_bytes && !(d->extract_data = malloc((size_t)t.data_bytes)))
                return kvp_err_set(err, KVP_ENOMEM, "tensor '%s': out of memory for %" PRIu64 " bytes", t.name,
                                   t.data_bytes);
            if (t.data_bytes)
                memcpy(d->extract_data, data, (size_t)t.data_bytes);
            d->extract_len = (size_t)t.data_bytes;
            d->extracted = 1;
        }
        if (!show)
            return 0;
        if (d->json) {
            printf(",\"name\":");
            kvp_cli_json_str(f, t.name, strlen(t.name));
            printf(",\"dtype\":\"%s\",\"shape\":", kvp_dtype_name(t.dtype));
            print_shape(f, &t, 1);
            printf(",\"scheme\":\"%s\",\"group\":%u,\"data_bytes\":%" PRIu64 ",\"scales_bytes\":%" PRIu64, scheme_name(t.scheme),
                   t.group, t.data_bytes, t.scales_bytes);
            if (t.scales_bytes)
                printf(",\"scale_dtype\":\"%s\"", kvp_dtype_name(t.scale_dtype));
            if (t.flags & KVP_TENSOR_ASYM)
                printf(",\"asymmetric\":true");
            if (t.dtype == KVP_DTYPE_NVFP4) /* every value's factor: the data cannot be read without it */
                printf(",\"global_scale\":%.9g", t.global_scale);
        } else {
            printf("%s %s ", t.name, kvp_dtype_name(t.dtype));
            print_shape(f, &t, 0);
            if (t.scheme != KVP_SCHEME_NONE) {
                printf(" scale %s/%s", scheme_name(t.scheme), kvp_dtype_name(t.scale_dtype));
                if (t.scheme == KVP_SCHEME_GROUP)
                    printf(" group %u", t.group);
            }
            if (t.flags & KVP_TENSOR_ASYM)
                printf(" asym");
            if (t.dtype == KVP_DTYPE_NVFP4)
                printf(" global scale %.9g", t.global_scale);
        }
        return 0;
    }
    case KVP_KIND_SEQUENCE: {
        kvp_seq_rec s;
        const uint32_t *ids;
        int rc = kvp_seq_decode(rec, &s, &ids, err);
        if (rc)
            return rc;
        d->t.tokens += s.n_tokens;
        if (!show)
            return 0;
        if (d->json) {
            printf(",\"seq_id\":%" PRIu64 ",\"label\":", s.id);
            if (s.flags & KVP_SEQ_LABEL_INT) /* an integer id, as decode prints it */
                fputs(s.label, f);
            else
                kvp_cli_json_str(f, s.label, strlen(s.label));
            /* flags as stored: which of the request's values are its own (kvp(5)) */
            printf(",\"tokens\":%u,\"prompt_tokens\":%u,\"next_token\":%d,\"state\":%u,\"arrival_ns\":%" PRIu64
                   ",\"first_token_ns\":%" PRIu64 ",\"max_tokens\":%u,\"flags\":%u", s.n_tokens, s.n_prompt,
                   s.next_token, s.state, s.arrival_ns, s.first_ns, s.sampling.max_tokens, s.flags);
            if ((rc = seq_request_json(f, rec, &s, err)) < 0)
                return rc;
            printf(",\"token_ids\":[");
            for (uint32_t i = 0; i < s.n_tokens; i++)
                printf("%s%u", i ? "," : "", ids[i]);
            putchar(']');
        } else {
            /* quoted, an integer id too: "seq 0 -5 tokens" would read as
             * numbers; escaped as in JSON, so a newline or a terminal's
             * escape sequence in a label stays on the record's line */
            printf("seq %" PRIu64, s.id);
            if (s.label[0]) {
                putchar(' ');
                kvp_cli_json_str(stdout, s.label, strlen(s.label));
            }
            printf(" tokens %u (prompt %u) next %d", s.n_tokens, s.n_prompt, s.next_token);
            if (s.cache_salt)
                printf(" salt %016" PRIx64, s.cache_salt);
            if (s.n_stop)
                printf(" stops %u", s.n_stop);
            printf(" ids [");
            for (uint32_t i = 0; i < s.n_tokens; i++) {
                if (s.n_tokens > SEQ_HEAD + SEQ_TAIL && i == SEQ_HEAD) {
                    printf(" ...");
                    i = s.n_tokens - SEQ_TAIL;
                }
                printf("%s%u", i ? " " : "", ids[i]);
            }
            putchar(']');
        }
        return 0;
    }
    case KVP_KIND_KV_BLOCK: {
        kvp_kvblock_rec b;
        int rc = kvp_kvblock_decode(rec, &b, NULL, NULL, NULL, err);
        if (rc)
            return rc;
        if (!show)
            return 0;
        if (d->json)
            printf(",\"seq_id\":%" PRIu64 ",\"block\":%u,\"tokens\":%u,\"block_size\":%u,\"layers\":[%u,%u],"
                   "\"kv_heads\":%u,\"head_dim\":%u,\"dtype\":\"%s\",\"hash\":\"%016" PRIx64 "\",\"parent\":\"%016" PRIx64
                   "\"",
                   b.seq_id, b.block_index, b.n_tokens, b.block_size, b.layer_begin, b.layer_end, b.n_head_kv,
                   b.head_dim, kvp_dtype_name(b.dtype), b.hash, b.parent_hash);
        else
            printf("seq %" PRIu64 " block %u tokens %u/%u layers %u-%u %ux%u %s hash %016" PRIx64, b.seq_id,
                   b.block_index, b.n_tokens, b.block_size, b.layer_begin, b.layer_end - 1, b.n_head_kv, b.head_dim,
                   kvp_dtype_name(b.dtype), b.hash);
        return 0;
    }
    case KVP_KIND_BLOCK_REF: {
        kvp_blockref_rec r;
        int rc = kvp_blockref_decode(rec, &r, err);
        if (rc)
            return rc;
        if (!show)
            return 0;
        if (d->json)
            printf(",\"seq_id\":%" PRIu64 ",\"block\":%u,\"tokens\":%u,\"hash\":\"%016" PRIx64 "\"", r.seq_id,
                   r.block_index, r.n_tokens, r.hash);
        else
            printf("seq %" PRIu64 " block %u tokens %u -> %016" PRIx64, r.seq_id, r.block_index, r.n_tokens, r.hash);
        return 0;
    }
    case KVP_KIND_SCORES: {
        kvp_scores_rec *s = &d->scores;
        if (d->have_scores)
            return kvp_err_set(err, KVP_EFORMAT, "record %" PRIu64 " (scores) at offset %" PRIu64 ": a second scores record",
                               rec->index, rec->offset);
        int rc = kvp_scores_decode(rec, s, err);
        if (rc)
            return rc;
        d->have_scores = 1;
        if (!show)
            return 0;
        if (d->json) {
            printf(",\"tokens_hash\":\"%016" PRIx64 "\",\"n_tokens\":%" PRIu64 ",\"ctx\":%u,\"first\":%u,\"windows\":%u,"
                   "\"n_vocab\":%u,\"top_k\":%u,\"bos\":",
                   s->tokens_hash, s->n_tokens, s->ctx, s->first, s->n_windows, s->n_vocab, s->top_k);
            if (s->bos == KVP_SCORES_NO_BOS)
                printf("null");
            else
                printf("%u", s->bos);
            printf(",\"text\":");
            kvp_cli_json_str(f, s->text, strlen(s->text));
        } else {
            printf("tokens %" PRIu64 " hash %016" PRIx64 " ctx %u first %u windows %u vocab %u k ", s->n_tokens,
                   s->tokens_hash, s->ctx, s->first, s->n_windows, s->n_vocab);
            printf(s->top_k ? "%u" : "full", s->top_k);
            printf(s->bos == KVP_SCORES_NO_BOS ? " bos none" : " bos %u", s->bos);
            printf(" text \"%s\"", s->text);
        }
        return 0;
    }
    case KVP_KIND_LOGPROBS: {
        kvp_logprobs_view v;
        int rc = kvp_logprobs_decode(rec, &v, err);
        if (rc)
            return rc;
        /* The windows of a saved-distributions file, checked as prefill --kld reads them. */
        const kvp_scores_rec *s = &d->scores;
        if (!d->have_scores)
            return kvp_err_set(err, KVP_EFORMAT, "record %" PRIu64 " (logprobs) at offset %" PRIu64
                               ": a window before any scores record", rec->index, rec->offset);
        if (v.window != d->next_window || v.window >= s->n_windows)
            return kvp_err_set(err, KVP_EFORMAT,
                               "record %" PRIu64 " (logprobs) at offset %" PRIu64 ": window %u where %s%u",
                               rec->index, rec->offset, v.window,
                               d->next_window < s->n_windows ? "window " : "the scores record announces ",
                               d->next_window < s->n_windows ? d->next_window : s->n_windows);
        if (v.n_pos != kvp_scores_n_pos(s) || v.top_k != s->top_k || v.n_vocab != s->n_vocab)
            return kvp_err_set(err, KVP_EFORMAT,
                               "record %" PRIu64 " (logprobs) at offset %" PRIu64 ": window %u has n_pos %u, top_k %u, "
                               "n_vocab %u; the scores record says %u, %u, %u",
                               rec->index, rec->offset, v.window, v.n_pos, v.top_k, v.n_vocab, kvp_scores_n_pos(s),
                               s->top_k, s->n_vocab);
        d->next_window++;
        d->t.positions += v.n_pos;
        if (!show)
            return 0;
        double sum = 0;
        for (uint32_t i = 0; i < v.n_pos; i++)
            sum += v.lp_tok[i];
        double mean = sum / v.n_pos; /* -inf when a text token had probability 0 */
        if (d->json) {
            printf(",\"window\":%u,\"positions\":%u,\"top_k\":%u,\"n_vocab\":%u,\"mean_lp_tok\":", v.window, v.n_pos,
                   v.top_k, v.n_vocab);
            if (isfinite(mean))
                printf("%.6f", mean);
            else
                printf("null");
        } else {
            printf("window %u positions %u k ", v.window, v.n_pos);
            printf(v.top_k ? "%u" : "full", v.top_k);
            printf(" mean lp_tok %.4f", mean);
            if (isfinite(exp(-mean)))
                printf(" (ppl %.4f)", exp(-mean));
        }
        return 0;
    }
    case KVP_KIND_STOP: {
        kvp_stop_rec st;
        int rc = kvp_stop_decode(rec, &st, err);
        if (rc || !show)
            return rc;
        const char *what = strsignal((int)st.signal);
        if (d->json) {
            printf(",\"signal\":%u,\"signal_text\":", st.signal);
            kvp_cli_json_str(stdout, what, strlen(what));
            printf(",\"written\":%" PRIu64 ",\"left\":%" PRIu64 ",\"input_left\":%s", st.written, st.left,
                   st.flags & KVP_STOP_INPUT_LEFT ? "true" : "false");
        } else
            printf("producer stopped by %s: %" PRIu64 " sequences written, %" PRIu64 " read and not finished%s",
                   what, st.written, st.left,
                   st.flags & KVP_STOP_INPUT_LEFT ? ", its input not read to the end" : "");
        return 0;
    }
    case KVP_KIND_END: {
        kvp_end_rec e;
        int rc = kvp_end_decode(rec, &e, err);
        if (!rc && d->have_scores && d->next_window != d->scores.n_windows)
            rc = kvp_err_set(err, KVP_EFORMAT,
                             "record %" PRIu64 " (end) at offset %" PRIu64
                             ": the scores record announces %u windows, %u came",
                             rec->index, rec->offset, d->scores.n_windows, d->next_window);
        if (rc || !show)
            return rc;
        if (d->json)
            printf(",\"records\":%" PRIu64 ",\"payload_bytes\":%" PRIu64, e.n_records, e.raw_bytes);
        else
            printf("%" PRIu64 " records, %" PRIu64 " payload bytes", e.n_records, e.raw_bytes);
        return 0;
    }
    default:
        if (show && !d->json)
            printf("kind %u skipped", rec->kind);
        return 0;
    }
}

static int dump_record(dumper *d, const kvp_record *rec, kvp_err *err)
{
    int show = !d->check && !d->summary && !d->extract;
    const char *kind = kvp_kind_name(rec->kind);
    if (show) {
        if (d->json) {
            printf("{\"kind\":\"%s\"", kind);
            if (rec->kind >= KVP_KIND_COUNT || !strcmp(kind, "unknown"))
                printf(",\"kind_id\":%u", rec->kind);
            printf(",\"index\":%" PRIu64 ",\"offset\":%" PRIu64 ",\"stored_bytes\":%" PRIu64 ",\"raw_bytes\":%" PRIu64
                   ",\"zstd\":%s,\"checksum\":\"ok\"",
                   rec->index, rec->offset, rec->stored_size, rec->raw_size,
                   (rec->flags & KVP_RECORD_ZSTD) ? "true" : "false");
        } else {
            printf("%10" PRIu64 "  %-10s %10" PRIu64 " %10" PRIu64 "  %-8s ", rec->offset, kind, rec->stored_size,
                   rec->raw_size, (rec->flags & KVP_RECORD_ZSTD) ? "ok zstd" : "ok");
        }
    }
    int rc = describe(d, rec, err);
    if (!rc && d->check) /* a listing shows records as they are; --check verifies the stream */
        rc = kvp_seqcheck_record(d->sc, rec, err);
    if (show) {
        if (d->json)
            putchar('}');
        putchar('\n');
    }
    if (rc)
        return rc;
    d->t.records++;
    d->t.stored += rec->stored_size;
    d->t.raw += rec->raw_size;
    if (rec->flags & KVP_RECORD_ZSTD)
        d->t.compressed++;
    if (rec->kind < KVP_KIND_COUNT && strcmp(kind, "unknown"))
        d->t.count[rec->kind]++;
    else
        d->t.unknown++;
    return 0;
}

static void print_summary(const dumper *d)
{
    const totals *t = &d->t;
    double ratio = t->stored ? (double)t->raw / (double)t->stored : 1.0;
    static const uint32_t kinds[] = {KVP_KIND_CONFIG,   KVP_KIND_TOKENIZER, KVP_KIND_TENSOR, KVP_KIND_SEQUENCE,
                                     KVP_KIND_KV_BLOCK, KVP_KIND_BLOCK_REF, KVP_KIND_SCORES, KVP_KIND_LOGPROBS,
                                     KVP_KIND_STOP,     KVP_KIND_END};
    if (d->json) {
        printf("{\"file\":");
        kvp_cli_json_str(stdout, d->name, strlen(d->name));
        printf(",\"bytes\":%" PRIu64 ",\"records\":%" PRIu64, t->file_bytes, t->records);
        for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
            printf(",\"%s\":%" PRIu64, kvp_kind_name(kinds[i]), t->count[kinds[i]]);
        printf(",\"unknown\":%" PRIu64 ",\"stored_bytes\":%" PRIu64 ",\"raw_bytes\":%" PRIu64
               ",\"compressed_records\":%" PRIu64 ",\"compression_ratio\":%.4f,\"tensor_bytes\":%" PRIu64
               ",\"tokens\":%" PRIu64 ",\"positions\":%" PRIu64 "}\n",
               t->unknown, t->stored, t->raw, t->compressed, ratio, t->tensor_bytes, t->tokens, t->positions);
        return;
    }
    printf("%s: %" PRIu64 " bytes, %" PRIu64 " records\n", d->name, t->file_bytes, t->records);
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (t->count[kinds[i]])
            printf("  %-10s %" PRIu64 "\n", kvp_kind_name(kinds[i]), t->count[kinds[i]]);
    if (t->unknown)
        printf("  %-10s %" PRIu64 " (skipped)\n", "unknown", t->unknown);
    printf("payload: %" PRIu64 " bytes stored, %" PRIu64 " raw, ratio %.3f (%" PRIu64 " records compressed)\n",
           t->stored, t->raw, ratio, t->compressed);
    if (t->tensor_bytes)
        printf("tensors: %" PRIu64 " bytes\n", t->tensor_bytes);
    if (t->tokens)
        printf("tokens:  %" PRIu64 " in sequences\n", t->tokens);
    if (t->positions)
        printf("scored:  %" PRIu64 " positions in windows\n", t->positions);
}

int main(int argc, char **argv)
{
    kvp_cli_init(argv[0]);
    static const struct option opts[] = {
        {"check", no_argument, NULL, 'c'},   {"summary", no_argument, NULL, 's'},
        {"extract", required_argument, NULL, 'x'}, {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},    {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    dumper d = {0};
    int c;
    while ((c = getopt_long(argc, argv, "csx:jhV", opts, NULL)) != -1) {
        switch (c) {
        case 'c': d.check = 1; break;
        case 's': d.summary = 1; break;
        case 'x': /* the raw bytes of one tensor: two would run together on stdout */
            if (d.extract && strcmp(d.extract, optarg) != 0)
                kvp_cli_usage_error("--extract: one tensor at a time (got '%s' and '%s')", d.extract, optarg);
            d.extract = optarg;
            break;
        case 'j': d.json = 1; break;
        case 'h':
            usage(stdout);
            return kvp_cli_close_stdout();
        case 'V': kvp_cli_version();
        default: kvp_cli_bad_option(argv, "csx:jhV", opts);
        }
    }
    if (d.check + d.summary + (d.extract != NULL) > 1)
        kvp_cli_usage_error("--check, --summary and --extract are exclusive");
    if (argc - optind > 1)
        kvp_cli_usage_error("one input at a time (got %d)", argc - optind);
    if (optind < argc && !*argv[optind]) /* no file has it: a usage error, not "No such file" */
        kvp_cli_usage_error("INPUT: an empty file name");
    const char *path = optind < argc ? argv[optind] : "-";
    kvp_cli_refuse_stdout_input(path, "input");
    if (d.extract && isatty(1))
        kvp_cli_usage_error("--extract writes binary data; redirect standard output to a file or pipe");

    kvp_err err = {0};
    kvp_in in;
    kvp_reader *r = NULL;
    if (kvp_in_open(&in, path, &err))
        kvp_cli_die_err(&err);
    d.name = strcmp(path, "-") ? path : "<stdin>"; /* in.name dies with in */
    int rc = d.check ? kvp_seqcheck_new(&d.sc, &err) : 0; /* only --check verifies the sequences */
    if (!rc)
        rc = kvp_reader_open(&r, &in, &err);
    if (!rc) {
        if (!d.check && !d.summary && !d.extract)
            print_header(&d, kvp_reader_info(r));
        kvp_record rec;
        while ((rc = kvp_reader_next(r, &rec, &err)) == 1) {
            if ((rc = dump_record(&d, &rec, &err)) != 0) {
                kvp_err_prefix(&err, "%s", in.name);
                break;
            }
        }
        if (rc == 0 && d.check && (rc = kvp_seqcheck_end(d.sc, &err)) < 0)
            kvp_err_prefix(&err, "%s", in.name);
    }
    d.t.file_bytes = in.pos;
    kvp_reader_free(r);
    kvp_seqcheck_free(d.sc);
    kvp_in_close(&in);
    if (rc < 0) {
        free(d.extract_data);
        fflush(stdout);
        kvp_cli_die_err(&err);
    }
    if (d.extract && !d.extracted)
        kvp_cli_die("%s: no tensor named '%s'", d.name, d.extract);
    if (d.extracted) {
        size_t w = d.extract_len ? fwrite(d.extract_data, 1, d.extract_len, stdout) : 0;
        free(d.extract_data);
        if (w != d.extract_len)
            kvp_cli_die("<stdout>: write error: %s", strerror(errno));
    }
    if (d.summary)
        print_summary(&d);
    return kvp_cli_close_stdout();
}
