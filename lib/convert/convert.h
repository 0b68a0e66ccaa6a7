/* convert.h - turn a model file into a KVP model file, quantizing its
 * tensors as asked, and convert the KV blocks of a KVP stream to another
 * dtype.  quantize(1) is a thin shell over this module.
 *
 * Model conversion is two passes over the input, which stays mapped:
 *   kvp_convert_open   detect the format (GGUF, safetensors file, index or
 *                      folder, KVP model or tensor file), read config and
 *                      tokenizer, list the tensors (nothing is dequantized
 *                      yet);
 *   kvp_convert_plan   choose each tensor's output dtype and scheme, with
 *                      byte counts (enough for a dry run);
 *   kvp_convert_write  write CONFIG, TOKENIZER and one TENSOR record per
 *                      planned tensor, one tensor at a time: memory is the
 *                      mapping plus one f32 buffer and one output buffer of
 *                      the largest tensor, never the whole model twice.
 *
 * Which dtype a tensor gets (first rule that applies):
 *   1. a name matching any of opts.drop is left out;
 *   2. 1-D tensors and norms (name contains "norm") become f32;
 *   3. names matching none of opts.include (when any is given) or any of
 *      opts.exclude are kept as they are (bytes copied, source dtype);
 *   4. token embeddings (token_embd.weight, *embed_tokens.weight, wte.weight,
 *      word_embeddings.weight) get opts.embed (default: kept, but quantized
 *      ones widen to a float opts.to: see KVP_CONVERT_EMBED_AUTO);
 *   5. everything else gets opts.to (default: kept).
 * Fallbacks, each recorded in the item's note: a GROUP scheme whose group
 * does not divide a row takes the largest group/2^k (>= 16) that does, or
 * CHANNEL when the row is shorter than 16 or has no such divisor; a tensor
 * whose rows do not fit the target's blocks (q8_0 with a row of 8) becomes
 * f16.
 *
 * Tensor names: GGUF names stay GGUF names ("blk.0.attn_q.weight"),
 * safetensors names stay HF names ("model.layers.0.self_attn.q_proj.weight").
 * Shapes are KVP order (outermost first): a GGUF tensor's ne[] reversed, with
 * the same bytes.  The CONFIG record is the GGUF metadata minus the
 * tokenizer.* keys and general.file_type (or kvp_config_to_meta of config.json
 * for safetensors, or the KVP input's record), plus "kvpipe.quantize.to" (and
 * "<arch>.vocab_size" when a GGUF left it to the token list); the
 * TOKENIZER record holds GGUF's tokenizer.* keys, or for safetensors the keys
 * derived from tokenizer.json (kvp_tokenizer_meta_from_json) plus its whole
 * text as "tokenizer.huggingface.json" (and "tokenizer.chat_template" from
 * tokenizer_config.json when present).
 *
 * Bare tensor files: safetensors with no config.json beside them (a LoRA
 * adapter, a single tensor, a research dump), or a KVP stream of tensors
 * with no CONFIG record (what such a conversion writes), convert too: the
 * output holds the TENSOR records only, no CONFIG and no TOKENIZER, and its
 * stream header's fingerprint is zero, kvp(5)'s "belongs to no model" (the
 * fingerprint hashes a model's config, which there is none of).  Every
 * option applies, since the rules above go by tensor names and shapes.  A
 * note says so; kvp_convert_config returns NULL.
 */
#ifndef KVP_CONVERT_H
#define KVP_CONVERT_H

#include "config.h"
#include "error.h"
#include "io.h"
#include "quant.h"
#include "stream.h"
#include "threadpool.h"
#include "wire.h"

#include <stddef.h>
#include <stdint.h>

#define KVP_CONVERT_KEEP (-1) /* dtype: keep the source's type and bytes */
/* opts.embed's default: kept as they are, except that embeddings of a
 * quantized dtype (q8_0, int8, fp8 ...) take opts.to when that is f32, f16
 * or bf16.  Widening loses nothing, and a model that ties its output head to
 * its embeddings (SmolLM2) would otherwise compute every logit with the
 * quantized head on 8-bit activations, so an f32 or f16 "reference" would
 * not be one. */
#define KVP_CONVERT_EMBED_AUTO (-3)

enum kvp_convert_format {
    KVP_CONVERT_GGUF = 1,
    KVP_CONVERT_SAFETENSORS = 2,
    KVP_CONVERT_KVP = 3,
};

typedef enum kvp_convert_action {
    KVP_CONVERT_COPY = 0,  /* bytes (and scales) copied as they are */
    KVP_CONVERT_QUANT = 1, /* dequantized to f32, then cast or quantized */
    KVP_CONVERT_DROP = 2,  /* left out of the output */
} kvp_convert_action;

typedef struct kvp_convert_opts {
    int to;               /* dtype for weights, or KVP_CONVERT_KEEP (default) */
    uint32_t scheme;      /* kvp_scheme for fp8/int/fp4 targets; 0: the dtype's default */
    uint32_t group;       /* GROUP elements; 0: the dtype's default */
    int asym;             /* integer targets: zero points */
    int embed;            /* dtype for token embeddings, KVP_CONVERT_KEEP, or KVP_CONVERT_EMBED_AUTO (default) */
    /* Pattern lists, POSIX extended regexes on tensor names (n_* of each,
     * none when 0): a tensor is in a list when any of its patterns matches. */
    const char *const *include; /* when any: only tensors in it are converted, the others kept */
    size_t n_include;
    const char *const *exclude; /* tensors in it are kept as they are */
    size_t n_exclude;
    const char *const *drop;    /* tensors in it are left out */
    size_t n_drop;
} kvp_convert_opts;

/* The pattern lists of kvp_convert_opts, for kvp_convert_pattern_matches. */
typedef enum kvp_convert_patterns {
    KVP_CONVERT_PATTERNS_INCLUDE = 0, /* opts.include */
    KVP_CONVERT_PATTERNS_EXCLUDE = 1, /* opts.exclude */
    KVP_CONVERT_PATTERNS_DROP = 2,    /* opts.drop */
    KVP_CONVERT_PATTERNS_COUNT = 3,
} kvp_convert_patterns;

typedef struct kvp_convert_item {
    kvp_tensor_rec src;    /* the input tensor as a record (dtype, shape; scheme and scales for KVP input) */
    int src_ok;            /* src.dtype is a kvp_dtype we can read */
    char src_type[16];     /* the type as the input names it ("q4_1", "BF16", "i64") */
    kvp_tensor_rec out;    /* planned output: dtype, scheme, group, byte counts (global_scale after writing) */
    int action;            /* kvp_convert_action */
    char note[120];        /* the fallback taken, or "" */
    kvp_quant_stats stats; /* error of out against the dequantized source (QUANT, after writing) */
} kvp_convert_item;

/* Counts over the plan; the byte counts are the sums of the rows of the
 * dry run and the report, which list every tensor read, dropped ones too. */
typedef struct kvp_convert_totals {
    uint64_t n_read;       /* every input tensor: n_tensors + n_dropped */
    uint64_t n_tensors;    /* written */
    uint64_t n_quantized;  /* written ones QUANT to a different dtype or scheme */
    uint64_t n_fallback;   /* written ones with a note */
    uint64_t n_dropped;
    uint64_t bytes_in;     /* source bytes of every tensor read, dropped ones too (data + scales + zeros) */
    uint64_t bytes_out;    /* output bytes of the written tensors */
    uint64_t file_bytes;   /* size of the output file when written without zstd */
    kvp_quant_stats stats; /* merged over the quantized tensors (weighted SNR) */
} kvp_convert_totals;

typedef struct kvp_convert kvp_convert;

/* Defaults, then the rules above: to = KVP_CONVERT_KEEP, embed = KVP_CONVERT_EMBED_AUTO. */
void kvp_convert_opts_init(kvp_convert_opts *o);

/* The dtype named by a --to argument: f32, f16, bf16, fp8 (= fp8-e4m3, e4m3),
 * fp8-e5m2 (e5m2), int8 (i8), int4 (i4), fp4 (scaled E2M1), nvfp4, mxfp4,
 * q8_0, q4_0, q4_1, q5_0, q5_1, or "keep" (KVP_CONVERT_KEEP).  -2 when the
 * name is none of these. */
int kvp_convert_dtype_from_name(const char *name);
/* The scheme and group a target dtype gets by default: i8 CHANNEL, i4 GROUP
 * 128, fp4_e2m1 GROUP 32, fp8 TENSOR, others NONE (plain casts, block types). */
void kvp_convert_default_scheme(int dtype, uint32_t *scheme, uint32_t *group);
/* Whether dtype takes a scale scheme (fp8, int8, int4, fp4). */
int kvp_convert_dtype_scaled(int dtype);
/* 0 when re compiles as a POSIX extended regex, else KVP_EINVAL naming it. */
int kvp_convert_check_regex(const char *re, kvp_err *err);

/* Open path: a .gguf, a .safetensors file, a model.safetensors.index.json, a
 * folder of safetensors (config.json beside any of the three makes it a
 * model, else it is a bare tensor file), or a KVP model or tensor file (not
 * a pipe).  Format is detected from the first bytes.  A model then passes
 * kvp_model_check (lib/model.h), the loader's own validation, so a model the
 * loader would refuse is refused here with the loader's message.  Messages
 * name the file and field. */
int kvp_convert_open(kvp_convert **cv, const char *path, kvp_err *err);
void kvp_convert_free(kvp_convert *cv);
int kvp_convert_format(const kvp_convert *cv);
const char *kvp_convert_format_name(const kvp_convert *cv);
/* The model's config; NULL for a bare tensor file. */
const kvp_config *kvp_convert_config(const kvp_convert *cv);
/* Notes gathered while opening (tokenizer.json kept as text only, ...);
 * n_notes strings, owned by cv. */
size_t kvp_convert_notes(const kvp_convert *cv, const char *const **notes);

/* Plan every tensor (may be called again with other options; one that fails
 * leaves no plan, and kvp_convert_write refuses until one succeeds).  Fails with
 * KVP_EUNSUPPORTED naming the tensor for a source tensor we cannot read (its
 * type, no elements, more than 4 dimensions) or whose name kvp(5) does not
 * allow (a control character, not UTF-8: shown escaped) that is not
 * dropped, KVP_EINVAL
 * for a bad regex (or a NULL one in a pattern list) or impossible option
 * set, and with the loader's code and message when the planned tensors fail
 * kvp_model_check_tensors (lib/model.h: a weight missing, dropped, or of the
 * wrong shape for the config). */
int kvp_convert_plan(kvp_convert *cv, const kvp_convert_opts *o, kvp_err *err);
/* How many tensors pattern k of a pattern list (kvp_convert_patterns:
 * opts.include[k], exclude[k] or drop[k]) matched in the last
 * kvp_convert_plan.  Every pattern is tried on every tensor read, whichever
 * rule then decides its type, and counted on its own (a tensor two patterns
 * match counts for both; an exclude pattern counts the norms and dropped
 * tensors it matches too); 0 past the list's end, for another list value,
 * or after a plan that failed.  A pattern that matched none is likely a
 * typo: quantize notes it. */
uint64_t kvp_convert_pattern_matches(const kvp_convert *cv, int list, size_t k);
size_t kvp_convert_count(const kvp_convert *cv);
const kvp_convert_item *kvp_convert_item_at(const kvp_convert *cv, size_t i);
/* Totals of the plan (stats are filled as kvp_convert_write proceeds). */
void kvp_convert_totals_get(const kvp_convert *cv, kvp_convert_totals *t);
/* The fingerprint of the planned output (lib/fingerprint.h); zero for a
 * bare tensor file. */
void kvp_convert_fingerprint(const kvp_convert *cv, uint8_t out[KVP_FINGERPRINT_SIZE]);

/* Called after each tensor is written (dropped ones too, action DROP);
 * a negative return stops the conversion with that code. */
typedef int (*kvp_convert_fn)(void *ctx, const kvp_convert_item *it, kvp_err *err);

/* Write the planned model to out (opened by the caller, who commits it on
 * success and aborts it on failure).  zstd_level 0..19; producer as in
 * kvp_writer_opts.  pool may be NULL.  A tensor whose type reads as f32
 * (converted or copied) holding a NaN or an infinity fails with KVP_EFORMAT
 * naming the file, the tensor and the first such element. */
int kvp_convert_write(kvp_convert *cv, kvp_out *out, int zstd_level, const char *producer, kvp_threadpool *pool,
                      kvp_convert_fn fn, void *ctx, kvp_err *err);

/* ---- reports (convert_report.c): text into b, for the program to print ---- */

/* TSV header line: name shape from to scheme bytes_in bytes_out rmse rel_err
 * snr_db max_abs_err clipped. */
void kvp_convert_report_header(kvp_buf *b);
/* One tensor: a TSV line, or a JSON object line (json != 0): the columns as
 * members, "shape" an array, "scheme" spelled as kvdump --json does ("none",
 * "tensor", "channel", "group") beside "group" and "asymmetric":true when
 * asymmetric, "note" only when there is one.  Copied tensors
 * show zero error; an exact conversion's SNR is "inf" (TSV) or null (JSON).
 * Errors that cannot be measured (a non-finite value) are "nan" / null,
 * never figures that read as exact. */
void kvp_convert_report_row(kvp_buf *b, const kvp_convert_item *it, int json);
/* The closing line: name "TOTAL" (TSV: "N tensors read: W written (C
 * converted), D dropped") or {"summary":true,...} (JSON: "read", "tensors"
 * written, "quantized" converted, "fallback" written with a note,
 * "dropped", "file_bytes"), the byte columns' sums, and the
 * error merged over the converted tensors (the SNR weighted by each
 * tensor's energy). */
void kvp_convert_report_summary(kvp_buf *b, const kvp_convert_totals *t, int json);
/* s as a TSV cell: each tab, CR and LF a space, so that a name or path
 * read from a file keeps its row one line of the header's columns. */
void kvp_convert_tsv_cell(kvp_buf *b, const char *s);

/* ---- the plan (quantize --dry-run), text into b as the report ---- */

/* TSV header line: name shape from to scheme bytes_in bytes_out note. */
void kvp_convert_plan_header(kvp_buf *b);
/* One tensor of the plan: the report row's first seven columns and the
 * fallback note ("-" when none) in TSV, or a JSON object line: the report
 * row's without the errors. */
void kvp_convert_plan_row(kvp_buf *b, const kvp_convert_item *it, int json);
/* The plan's closing line: TSV, a TOTAL row in the header's columns (the
 * report's TOTAL row to bytes_out, then "file N bytes", the size of the
 * output written without zstd, as its note); JSON, the report's summary
 * without the errors. */
void kvp_convert_plan_summary(kvp_buf *b, const kvp_convert_totals *t, int json);

/* "4x8" style shape text (outermost first) into buf. */
void kvp_convert_shape_str(const kvp_tensor_rec *t, char *buf, size_t n);
/* "group64", "channel", "tensor", "-" for a record's scheme. */
void kvp_convert_scheme_str(const kvp_tensor_rec *t, char *buf, size_t n);

/* ---- KV streams (convert_kv.c) ---- */

typedef struct kvp_convert_kv_stats {
    uint64_t n_records;    /* records read, END excluded */
    uint64_t n_blocks;     /* KV_BLOCK records */
    uint64_t n_converted;  /* KV blocks whose dtype changed */
    uint64_t bytes_in;     /* KV block data + scales bytes read */
    uint64_t bytes_out;    /* ... written */
    kvp_quant_stats stats; /* error over the filled slots of converted blocks */
} kvp_convert_kv_stats;

/* Copy the KVP stream in to out, converting every KV_BLOCK to dtype (f32,
 * f16, bf16, fp8_e4m3, i8; per-block-per-head scales, kvp_quant_kv_convert)
 * and passing every other record through with its meta and data unchanged
 * (known kinds are decoded first, so a malformed one is an error).  The
 * stream header's fingerprint is kept; producer and zstd_level as in
 * kvp_writer_opts.  st may be NULL. */
int kvp_convert_kv_stream(kvp_in *in, kvp_out *out, uint32_t dtype, int zstd_level, const char *producer,
                          kvp_convert_kv_stats *st, kvp_err *err);
/* quantize --kv's report (convert_report.c): a header and one row (TSV),
 * or one JSON object with "summary":true, over the whole stream converted
 * to dtype; errors as in kvp_convert_report_row. */
void kvp_convert_report_kv(kvp_buf *b, uint32_t dtype, const kvp_convert_kv_stats *st, int json);

#endif
