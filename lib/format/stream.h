/* stream.h - the KVP stream format: writer and reader.
 *
 * kvp(5) is the authoritative description; in short: a 64-byte stream header,
 * then records, each a 64-byte record header (kind, sizes, CRC32C of header
 * and payload) followed by its payload padded to 64 bytes, and last an END
 * record with counts.  A payload is a kind-specific "meta" part, zero padding
 * to 64, then a "data" part (tensor bytes, token ids); zstd may compress the
 * whole payload.  Uncompressed data sits 64-byte aligned in the file, so a
 * mapped file is used in place.
 *
 * The reader works on pipes and files alike, verifies every checksum, the
 * record order and the END counts, and never allocates more than the input
 * has actually delivered.
 */
#ifndef KVP_STREAM_H
#define KVP_STREAM_H

#include "error.h"
#include "io.h"
#include "meta.h"
#include "tensor.h"

#include <stdint.h>

#define KVP_VERSION_MAJOR 1
#define KVP_VERSION_MINOR 0
#define KVP_ALIGN 64
#define KVP_HEADER_SIZE 64
#define KVP_RECORD_HEADER_SIZE 64
#define KVP_FINGERPRINT_SIZE 16
#define KVP_PRODUCER_MAX 20

typedef enum kvp_kind {
    KVP_KIND_HEADER = 0,     /* the stream header (no record's kind: refused; kvdump shows the header by it) */
    KVP_KIND_CONFIG = 1,     /* model configuration: metadata list */
    KVP_KIND_TOKENIZER = 2,  /* tokenizer vocabulary, merges, special ids: metadata list */
    KVP_KIND_TENSOR = 3,
    KVP_KIND_SEQUENCE = 4,
    KVP_KIND_KV_BLOCK = 5,
    KVP_KIND_BLOCK_REF = 6,
    KVP_KIND_SCORES = 7,     /* saved distributions: the binding (logprobs.h) */
    KVP_KIND_LOGPROBS = 8,   /* saved distributions: one window (logprobs.h) */
    KVP_KIND_STOP = 9,       /* the producer was stopped before its input was done (kvp_stop_rec) */
    KVP_KIND_END = 15,
    KVP_KIND_MAX = 0xffff
} kvp_kind;
#define KVP_KIND_COUNT 16 /* END counts kinds 0..15 */

/* Record header flags. */
#define KVP_RECORD_ZSTD 0x1u

/* Name of a kind ("tensor"); "unknown" for ids we do not know. */
const char *kvp_kind_name(uint32_t kind);
/* Whether this version defines a record kind (1..9, 15): kvp(5) has readers
 * skip any other but 0 (the stream header's number, no record's), which
 * kvp_reader_next refuses. */
int kvp_kind_known(uint32_t kind);

/* ---- typed records ---- */



typedef struct kvp_sampling {
    float temperature;         /* 0 = greedy */
    int32_t top_k;             /* 0 = off */
    float top_p;               /* 1 = off */
    float min_p;               /* 0 = off */
    float repeat_penalty;      /* 1 = off */
    uint32_t max_tokens;
    uint64_t seed;
    uint64_t rng[2];           /* generator state, so a resumed run continues it */
} kvp_sampling;

/* Check the parameters: 0, or KVP_EINVAL naming the bad one.  One rule for
 * the command line's options and a stream's sequence records alike. */
int kvp_sampling_check(const kvp_sampling *s, kvp_err *err);

/* Sequence state. */
enum { KVP_SEQ_PREFILLED = 1, KVP_SEQ_RUNNING = 2, KVP_SEQ_FINISHED = 3 };
/* The last finish reason kvp(5) defines (generate.h names them, 0..4). */
#define KVP_SEQ_FINISH_MAX 4u

typedef struct kvp_seq_rec {
    uint64_t id;
    char label[KVP_NAME_MAX + 1]; /* the user's id from a prompts file, may be empty */
    uint32_t state;
    uint32_t finish_reason;    /* 0 none, 1 length, 2 stop token, 3 stop string, 4 KV memory */
    uint32_t n_prompt;         /* the first n_prompt tokens are the prompt */
    uint32_t n_tokens;         /* tokens whose KV is in the stream */
    int32_t next_token;        /* sampled but not yet in the KV cache; -1 if none */
    uint32_t block_size;       /* tokens per KV block */
    kvp_sampling sampling;
    uint64_t arrival_ns;       /* request arrival, ns since the Unix epoch; 0 unknown */
    uint64_t first_ns;         /* first token sampled, likewise; 0 none */
    uint64_t cache_salt;       /* the request's own KV cache salt (a prompts line's cache_salt); 0 none */
    uint32_t n_stop;           /* the request's stop strings in the record (kvp_seq_stops) */
    uint32_t flags;            /* KVP_SEQ_* below */
    /* data: n_tokens x u32 token ids */
} kvp_seq_rec;

/* Sequence flags (kvp_seq_rec.flags).  LABEL_INT: the label is an integer
 * id's canonical decimal digits (a prompts line's "id":7 is "7"), printed
 * back as the integer; without it a label is a string id. */
#define KVP_SEQ_LABEL_INT 0x1u
/* OWN_*: the request set that value itself (a prompts line's own field),
 * so it wins over the reading program's option, as a line's field wins in
 * decode -f; a value without its bit is a default, which the option
 * replaces.  OWN_STOP: the record's stop strings (none, when n_stop is 0). */
#define KVP_SEQ_OWN_MAX_TOKENS 0x2u
#define KVP_SEQ_OWN_TEMPERATURE 0x4u
#define KVP_SEQ_OWN_TOP_P 0x8u
#define KVP_SEQ_OWN_TOP_K 0x10u
#define KVP_SEQ_OWN_MIN_P 0x20u
#define KVP_SEQ_OWN_SEED 0x40u
#define KVP_SEQ_OWN_STOP 0x80u
#define KVP_SEQ_OWN_ALL 0xfeu
#define KVP_SEQ_FLAGS_KNOWN (KVP_SEQ_LABEL_INT | KVP_SEQ_OWN_ALL)

/* A sequence record carries at most this many stop strings, each at most
 * KVP_STOP_MAX_LEN bytes (a prompts line's own, or decode's --stop). */
#define KVP_STOP_MAX_N 64
#define KVP_STOP_MAX_LEN 4096

typedef struct kvp_kvblock_rec {
    uint64_t seq_id;
    uint32_t block_index;      /* covers tokens [block_index*block_size, +n_tokens) */
    uint32_t block_size;
    uint32_t n_tokens;         /* filled slots, <= block_size */
    uint32_t layer_begin, layer_end; /* layers [begin, end) */
    uint32_t n_head_kv, head_dim;
    uint32_t dtype;            /* KV element dtype */
    uint32_t scale_dtype;      /* 0: f32, the scales' dtype (fp8_e4m3, i8), or none (f32, f16, bf16) */
    uint64_t parent_hash;      /* hash of the previous block of the sequence, 0 for the first */
    uint64_t hash;             /* kvp_kvblock_hash(parent_hash, tokens) */
    uint64_t data_bytes;       /* layers x 2 (K,V) x n_head_kv x block_size x head_dim elements */
    uint64_t scales_bytes;     /* fp8_e4m3, i8: layers x 2 x n_head_kv f32 scales (one a head), or that
                                * x block_size (one a slot: a running cache's); 0 for f32, f16, bf16 */
    /* meta also carries the block's n_tokens token ids (kvp_kvblock_decode gives them) */
} kvp_kvblock_rec;

typedef struct kvp_blockref_rec {
    uint64_t seq_id;
    uint32_t block_index;
    uint32_t n_tokens;
    uint64_t parent_hash;
    uint64_t hash;             /* names a KV_BLOCK earlier in the stream */
} kvp_blockref_rec;

/* A STOP record: the stream's producer (prefill on SIGINT or SIGTERM)
 * stopped before its input was done.  The stream is whole (every sequence
 * in it complete, then END), but it is not all that was asked for, which
 * a reader down a pipe could not otherwise tell.  Written just before END. */
#define KVP_STOP_INPUT_LEFT 0x1u /* the producer had not read all its input */
typedef struct kvp_stop_rec {
    uint32_t signal;  /* the signal that stopped it (2 SIGINT, 15 SIGTERM); 1..64 */
    uint32_t flags;   /* KVP_STOP_INPUT_LEFT */
    uint64_t written; /* sequences the stream holds */
    uint64_t left;    /* sequences read and not finished */
} kvp_stop_rec;

/* Kind counters an END record holds at most: one a kind (kinds are u16). */
#define KVP_END_COUNTS_MAX 65536u

typedef struct kvp_end_rec {
    uint64_t n_records;                 /* records before END */
    uint64_t count[KVP_KIND_COUNT];     /* by kind, 0..15 */
    uint64_t raw_bytes;                 /* sum of raw payload sizes before END */
    uint32_t n_counts;                  /* the counters it holds: 16 (this version's writer), or more from a later
                                         * minor version, counter k the records of kind k; a record of a kind at or
                                         * past n_counts is counted in n_records and raw_bytes only */
    const uint8_t *counts_le;           /* all n_counts counters, u64 LE, in the record (valid as rec->meta) */
} kvp_end_rec;

/* Whether a KV block's scales are one a slot (1) or one a head (0); -1 when
 * it has none or scales_bytes matches neither. */
int kvp_kvblock_scales_per_slot(const kvp_kvblock_rec *b);

/* Content hash of a KV block: XXH64 over parent_hash (8 bytes LE) followed by
 * the token ids (4 bytes LE each), seed 0.  Equal prefixes give equal chains. */
uint64_t kvp_kvblock_hash(uint64_t parent_hash, const uint32_t *tokens, uint32_t n);


/* ---- writer ---- */

typedef struct kvp_writer kvp_writer;

typedef struct kvp_writer_opts {
    int zstd_level;            /* 0: no compression; 1..19 */
    const char *producer;      /* up to 20 chars, e.g. "quantize 0.1.0" */
    uint8_t fingerprint[KVP_FINGERPRINT_SIZE]; /* model fingerprint, zeros if none */
} kvp_writer_opts;

/* A piece of payload data, so large tensors are written without copying. */
typedef struct kvp_piece {
    const void *p;
    uint64_t n;
} kvp_piece;

/* Start a stream on out (kept open; the caller commits or aborts it). */
int kvp_writer_open(kvp_writer **w, kvp_out *out, const kvp_writer_opts *opts, kvp_err *err);
/* Any record: meta bytes, then zero padding to 64, then the data pieces
 * (each piece starts 64-aligned within data when align_pieces is set). */
int kvp_writer_record(kvp_writer *w, uint32_t kind, const void *meta, uint32_t meta_len,
                      const kvp_piece *pieces, int n_pieces, int align_pieces, kvp_err *err);
int kvp_write_meta(kvp_writer *w, uint32_t kind, const kvp_meta *m, kvp_err *err);
int kvp_write_tensor(kvp_writer *w, const kvp_tensor_rec *t, const void *data, const void *scales,
                     const void *zeros, kvp_err *err);
/* s with its stop strings stop[n_stop] (s->n_stop is ignored): more than
 * KVP_STOP_MAX_N, one longer than KVP_STOP_MAX_LEN or one with a NUL byte
 * is KVP_EINVAL, as are a flag outside KVP_SEQ_FLAGS_KNOWN and
 * KVP_SEQ_LABEL_INT on a label that is not an int64's canonical digits. */
int kvp_write_sequence(kvp_writer *w, const kvp_seq_rec *s, const uint32_t *tokens, const char *const *stop,
                       size_t n_stop, kvp_err *err);
int kvp_write_kvblock(kvp_writer *w, const kvp_kvblock_rec *b, const uint32_t *tokens, const void *data,
                      const void *scales, kvp_err *err);
int kvp_write_blockref(kvp_writer *w, const kvp_blockref_rec *r, kvp_err *err);
/* A signal outside 1..64 or an unknown flag is KVP_EINVAL. */
int kvp_write_stop(kvp_writer *w, const kvp_stop_rec *s, kvp_err *err);
/* Write the END record.  The stream is complete only after this. */
int kvp_writer_finish(kvp_writer *w, kvp_err *err);
/* Bytes written so far, compressed-payload totals (for --summary-like reports). */
uint64_t kvp_writer_bytes(const kvp_writer *w);
void kvp_writer_free(kvp_writer *w);

/* ---- reader ---- */

typedef struct kvp_reader kvp_reader;

typedef struct kvp_stream_info {
    uint16_t major, minor;
    uint32_t flags;
    uint8_t fingerprint[KVP_FINGERPRINT_SIZE];
    char producer[KVP_PRODUCER_MAX + 1];
} kvp_stream_info;

typedef struct kvp_record {
    uint32_t kind;
    uint32_t flags;            /* KVP_RECORD_* */
    uint64_t index;            /* 0-based position among records */
    uint64_t offset;           /* byte offset of the record header in the stream */
    uint64_t stored_size;      /* payload bytes in the stream */
    uint64_t raw_size;         /* payload bytes after decompression */
    uint32_t meta_size;
    const uint8_t *meta;       /* valid until the next kvp_reader_next */
    const uint8_t *data;       /* 64-byte aligned */
    uint64_t data_size;
} kvp_record;

/* Reads and checks the stream header from in (caller-owned, kept open). */
int kvp_reader_open(kvp_reader **r, kvp_in *in, kvp_err *err);
const kvp_stream_info *kvp_reader_info(const kvp_reader *r);
/* Next record: 1 (rec filled, END included), 0 at the clean end after END,
 * or a negative code with a message naming the stream, offset and record. */
int kvp_reader_next(kvp_reader *r, kvp_record *rec, kvp_err *err);
/* Largest raw payload the reader will accept (default 1 TiB). */
void kvp_reader_set_limit(kvp_reader *r, uint64_t max_record_bytes);
/* Skim records of the kinds in the mask (bit 1 << kind; END never) when the
 * input is mapped: their headers, sizes, order and padding are checked and
 * counted toward END as usual, but the payload is neither read nor
 * checksummed, and rec->meta and rec->data are NULL.  For a reader that
 * needs one small record of a large file (kvcalc's CONFIG) yet must notice
 * a file cut short.  Streamed input reads everything as before. */
void kvp_reader_skim(kvp_reader *r, uint32_t kinds);
void kvp_reader_free(kvp_reader *r);

/* Decoders for the typed records.  Each validates every field against the
 * record's sizes and fails with a message naming the field. */
int kvp_tensor_decode(const kvp_record *rec, kvp_tensor_rec *t, const uint8_t **data, const uint8_t **scales,
                      const uint8_t **zeros, kvp_err *err);
/* A record without flags (written before them, or with none) reads flags
 * 0; an unknown flag, or LABEL_INT on a label that is not an int64's
 * canonical digits, is KVP_EFORMAT; so is a state or finish reason kvp(5)
 * does not define, a next token below -1, or sampling parameters
 * kvp_sampling_check refuses. */
int kvp_seq_decode(const kvp_record *rec, kvp_seq_rec *s, const uint32_t **tokens, kvp_err *err);
/* A sequence record's stop strings, copied: *stop[*n] NUL-terminated (NULL
 * and 0 when it has none), freed with kvp_seq_stops_free. */
int kvp_seq_stops(const kvp_record *rec, char ***stop, size_t *n, kvp_err *err);
void kvp_seq_stops_free(char **stop, size_t n);
/* tokens points into the record (unaligned u32 LE; use kvp_le32) */
int kvp_kvblock_decode(const kvp_record *rec, kvp_kvblock_rec *b, const uint8_t **tokens_le, const uint8_t **data,
                       const uint8_t **scales, kvp_err *err);
int kvp_blockref_decode(const kvp_record *rec, kvp_blockref_rec *r, kvp_err *err);
int kvp_stop_decode(const kvp_record *rec, kvp_stop_rec *s, kvp_err *err);
/* Fewer than KVP_KIND_COUNT counters (or more than KVP_END_COUNTS_MAX), or
 * a size other than they make, is KVP_EFORMAT; the reader compares the
 * counts with the stream (kvp_reader_next). */
int kvp_end_decode(const kvp_record *rec, kvp_end_rec *e, kvp_err *err);
int kvp_meta_record_decode(const kvp_record *rec, kvp_meta *m, kvp_err *err);

#endif
