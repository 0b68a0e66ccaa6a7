/* convert_report.c - the conversion report as text (TSV or JSON Lines),
 * built into a buffer for the program to print. */
#include "convert_impl.h"
#include "unicode.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static void putf(kvp_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(kvp_buf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        kvp_buf_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* A JSON string literal; names are bytes from a file, so escape everything
 * below 0x20 and the two specials, and write a byte that is not UTF-8 (a
 * dropped tensor's name may hold one) as U+FFFD, as kvp_cli_json_str does:
 * the line stays JSON. */
static void put_json_str(kvp_buf *b, const char *s)
{
    size_t n = strlen(s);
    kvp_buf_u8(b, '"');
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        uint32_t cp;
        size_t k = kvp_unicode_decode(s + i, n - i, &cp);
        if (c == '"' || c == '\\')
            putf(b, "\\%c", c);
        else if (c < 0x20)
            putf(b, "\\u%04x", c);
        else if (cp == KVP_UNICODE_BAD)
            putf(b, "\\ufffd");
        else
            kvp_buf_put(b, s + i, k);
        i += cp == KVP_UNICODE_BAD ? 1 : k;
    }
    kvp_buf_u8(b, '"');
}

void kvp_convert_tsv_cell(kvp_buf *b, const char *s)
{
    for (; *s; s++)
        kvp_buf_u8(b, (*s == '\t' || *s == '\n' || *s == '\r') ? ' ' : (uint8_t)*s);
}

/* A double for a report: "inf" / "nan" in TSV, null in JSON (which has
 * neither), %.6g otherwise. */
static void put_num(kvp_buf *b, double v, int json)
{
    if (isinf(v) || isnan(v))
        putf(b, "%s", json ? "null" : isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
    else
        putf(b, "%.6g", v);
}

void kvp_convert_shape_str(const kvp_tensor_rec *t, char *buf, size_t n)
{
    size_t used = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i < t->n_dim && i < KVP_MAX_DIMS && used < n; i++) {
        int k = snprintf(buf + used, n - used, "%s%" PRIu64, i ? "x" : "", t->shape[i]);
        if (k < 0)
            break;
        used += (size_t)k;
    }
}

void kvp_convert_scheme_str(const kvp_tensor_rec *t, char *buf, size_t n)
{
    const char *asym = (t->flags & KVP_TENSOR_ASYM) ? "-asym" : "";
    switch (t->scheme) {
    case KVP_SCHEME_TENSOR:
        snprintf(buf, n, "tensor%s", asym);
        break;
    case KVP_SCHEME_CHANNEL:
        snprintf(buf, n, "channel%s", asym);
        break;
    case KVP_SCHEME_GROUP:
        snprintf(buf, n, "group%u%s", t->group, asym);
        break;
    default:
        snprintf(buf, n, "-");
        break;
    }
}

void kvp_convert_report_header(kvp_buf *b)
{
    putf(b, "name\tshape\tfrom\tto\tscheme\tbytes_in\tbytes_out\trmse\trel_err\tsnr_db\tmax_abs_err\tclipped\n");
}

static void put_errors(kvp_buf *b, const kvp_quant_stats *st, int json)
{
    kvp_quant_report r;
    kvp_quant_stats_report(st, &r); /* nothing compared: SNR inf (copied, the values are the source's) */
    const char *sep = json ? "," : "\t";
    if (json)
        putf(b, ",\"rmse\":");
    put_num(b, r.rmse, json);
    putf(b, "%s%s", sep, json ? "\"rel_err\":" : "");
    put_num(b, r.rel_err, json);
    putf(b, "%s%s", sep, json ? "\"snr_db\":" : "");
    put_num(b, r.snr_db, json);
    putf(b, "%s%s", sep, json ? "\"max_abs_err\":" : "");
    put_num(b, r.max_abs_err, json);
    putf(b, "%s%s", sep, json ? "\"clipped\":" : "");
    put_num(b, r.clipped, json);
}

/* kvdump --json's names of a record's scheme, which JSON shares with it
 * (TSV's "group64" or "-" of kvp_convert_scheme_str is one cell for a
 * table; JSON gives the group as a number of its own). */
static const char *scheme_json_name(uint32_t scheme)
{
    static const char *const names[] = {"none", "tensor", "channel", "group"};
    return scheme < sizeof names / sizeof names[0] ? names[scheme] : "?";
}

/* The columns a plan row and a report row share, name to bytes_out: TSV
 * cells (no tab after the last), or JSON members after an opening brace. */
static void put_item(kvp_buf *b, const kvp_convert_item *it, int json)
{
    const char *to = it->action == KVP_CONVERT_DROP ? "dropped" : kvp_dtype_name(it->out.dtype);
    uint64_t in = kvp_convert_rec_bytes(&it->src), out = it->action == KVP_CONVERT_DROP ? 0 : kvp_convert_rec_bytes(&it->out);
    if (json) {
        putf(b, "{\"name\":");
        put_json_str(b, it->src.name);
        putf(b, ",\"shape\":[");
        for (uint32_t i = 0; i < it->src.n_dim && i < KVP_MAX_DIMS; i++)
            putf(b, "%s%" PRIu64, i ? "," : "", it->src.shape[i]);
        putf(b, "],\"from\":");
        put_json_str(b, it->src_type);
        putf(b, ",\"to\":\"%s\",\"scheme\":\"%s\",\"group\":%u%s,\"bytes_in\":%" PRIu64 ",\"bytes_out\":%" PRIu64, to,
             scheme_json_name(it->out.scheme), it->out.group,
             (it->out.flags & KVP_TENSOR_ASYM) ? ",\"asymmetric\":true" : "", in, out);
        return;
    }
    char shape[96], scheme[32];
    kvp_convert_shape_str(&it->src, shape, sizeof shape);
    kvp_convert_scheme_str(&it->out, scheme, sizeof scheme);
    kvp_convert_tsv_cell(b, it->src.name);
    putf(b, "\t%s\t", shape);
    kvp_convert_tsv_cell(b, it->src_type);
    putf(b, "\t%s\t%s\t%" PRIu64 "\t%" PRIu64, to, scheme, in, out);
}

/* JSON: the fallback's note as a member, left out when there is none. */
static void put_note_json(kvp_buf *b, const kvp_convert_item *it)
{
    if (!it->note[0])
        return;
    putf(b, ",\"note\":");
    put_json_str(b, it->note);
}

void kvp_convert_report_row(kvp_buf *b, const kvp_convert_item *it, int json)
{
    kvp_quant_stats none;
    memset(&none, 0, sizeof none);
    const kvp_quant_stats *st = it->action == KVP_CONVERT_QUANT ? &it->stats : &none;
    put_item(b, it, json);
    if (!json)
        putf(b, "\t");
    put_errors(b, st, json);
    if (json)
        put_note_json(b, it);
    putf(b, json ? "}\n" : "\n");
}

/* The counts of a summary, shared by the plan and the report: JSON
 * members after an opening brace, or the TOTAL row's cells to bytes_out. */
static void put_totals(kvp_buf *b, const kvp_convert_totals *t, int json)
{
    if (json)
        putf(b,
             "{\"summary\":true,\"read\":%" PRIu64 ",\"tensors\":%" PRIu64 ",\"quantized\":%" PRIu64
             ",\"fallback\":%" PRIu64 ",\"dropped\":%" PRIu64 ",\"bytes_in\":%" PRIu64 ",\"bytes_out\":%" PRIu64
             ",\"file_bytes\":%" PRIu64,
             t->n_read, t->n_tensors, t->n_quantized, t->n_fallback, t->n_dropped, t->bytes_in, t->bytes_out,
             t->file_bytes);
    else
        putf(b, "TOTAL\t%" PRIu64 " tensors read: %" PRIu64 " written (%" PRIu64 " converted), %" PRIu64
             " dropped\t-\t-\t-\t%" PRIu64 "\t%" PRIu64,
             t->n_read, t->n_tensors, t->n_quantized, t->n_dropped, t->bytes_in, t->bytes_out);
}

void kvp_convert_report_summary(kvp_buf *b, const kvp_convert_totals *t, int json)
{
    put_totals(b, t, json);
    if (!json)
        putf(b, "\t");
    put_errors(b, &t->stats, json);
    putf(b, json ? "}\n" : "\n");
}

/* ---- the plan (a dry run): the report's rows without the errors ---- */

void kvp_convert_plan_header(kvp_buf *b) { putf(b, "name\tshape\tfrom\tto\tscheme\tbytes_in\tbytes_out\tnote\n"); }

void kvp_convert_plan_row(kvp_buf *b, const kvp_convert_item *it, int json)
{
    put_item(b, it, json);
    if (json) {
        put_note_json(b, it);
        putf(b, "}\n");
        return;
    }
    putf(b, "\t");
    kvp_convert_tsv_cell(b, it->note[0] ? it->note : "-");
    putf(b, "\n");
}

void kvp_convert_plan_summary(kvp_buf *b, const kvp_convert_totals *t, int json)
{
    put_totals(b, t, json);
    if (json)
        putf(b, "}\n");
    else /* the file's size is the TOTAL row's note */
        putf(b, "\tfile %" PRIu64 " bytes\n", t->file_bytes);
}

void kvp_convert_report_kv(kvp_buf *b, uint32_t dtype, const kvp_convert_kv_stats *st, int json)
{
    if (json)
        putf(b, "{\"summary\":true,\"kv\":\"%s\",\"records\":%" PRIu64 ",\"blocks\":%" PRIu64
             ",\"converted\":%" PRIu64 ",\"bytes_in\":%" PRIu64 ",\"bytes_out\":%" PRIu64,
             kvp_dtype_name(dtype), st->n_records, st->n_blocks, st->n_converted, st->bytes_in, st->bytes_out);
    else
        putf(b, "to\trecords\tblocks\tconverted\tbytes_in\tbytes_out\trmse\trel_err\tsnr_db\tmax_abs_err\tclipped\n"
             "%s\t%" PRIu64 "\t%" PRIu64 "\t%" PRIu64 "\t%" PRIu64 "\t%" PRIu64 "\t",
             kvp_dtype_name(dtype), st->n_records, st->n_blocks, st->n_converted, st->bytes_in, st->bytes_out);
    put_errors(b, &st->stats, json);
    putf(b, json ? "}\n" : "\n");
}
