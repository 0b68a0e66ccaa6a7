/* stream.c - KVP stream writer and reader (see stream.h and kvp(5)). */
#include "stream.h"
#include "strmap.h"
#include "u64map.h"

#include "hash.h"
#include "kvscale.h"
#include "tensor.h"
#include "unicode.h"
#include "wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kvpipe uses KVP payloads in place and needs a little-endian host"
#endif

/* Fuzzing builds accept bad checksums so the fuzzer reaches the decoders
 * behind them (the convention libFuzzer and OSS-Fuzz use). */
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
#define CRC_BAD(a, b) 0
#else
#define CRC_BAD(a, b) ((a) != (b))
#endif

static const uint8_t stream_magic[8] = {0x89, 'K', 'V', 'P', '\r', '\n', 0x1a, '\n'};
static const uint8_t record_magic[4] = {'K', 'V', 'P', 'R'};

/* Offsets inside the record header (kvp(5)). */
enum {
    RH_MAGIC = 0, RH_KIND = 4, RH_FLAGS = 6, RH_INDEX = 8, RH_STORED = 16, RH_RAW = 24,
    RH_META = 32, RH_PCRC = 36, RH_HCRC = 60
};

#define KVP_DEFAULT_RECORD_LIMIT (1ull << 40)

const char *kvp_kind_name(uint32_t kind)
{
    switch (kind) {
    case KVP_KIND_HEADER: return "header";
    case KVP_KIND_CONFIG: return "config";
    case KVP_KIND_TOKENIZER: return "tokenizer";
    case KVP_KIND_TENSOR: return "tensor";
    case KVP_KIND_SEQUENCE: return "sequence";
    case KVP_KIND_KV_BLOCK: return "kv_block";
    case KVP_KIND_BLOCK_REF: return "block_ref";
    case KVP_KIND_SCORES: return "scores";
    case KVP_KIND_LOGPROBS: return "logprobs";
    case KVP_KIND_STOP: return "stop";
    case KVP_KIND_END: return "end";
    default: return "unknown";
    }
}

int kvp_kind_known(uint32_t kind)
{
    return kind != KVP_KIND_HEADER && strcmp(kvp_kind_name(kind), "unknown") != 0;
}

/* Hash the little-endian bytes so the value is the same on every host;
 * streamed, so no block size needs a buffer. */
static uint64_t kvblock_hash_le(uint64_t parent_hash, const uint8_t *tokens_le, uint32_t n)
{
    uint8_t parent[8];
    kvp_put64(parent, parent_hash);
    kvp_xxh64_state st;
    kvp_xxh64_init(&st, 0);
    kvp_xxh64_update(&st, parent, sizeof parent);
    kvp_xxh64_update(&st, tokens_le, 4 * (size_t)n);
    return kvp_xxh64_digest(&st);
}

uint64_t kvp_kvblock_hash(uint64_t parent_hash, const uint32_t *tokens, uint32_t n)
{
    /* The host is little-endian (checked at the top), so the ids are their bytes. */
    return kvblock_hash_le(parent_hash, (const uint8_t *)tokens, n);
}

static int64_t scale_bytes(uint32_t scale_dtype, int64_t count)
{
    if (count == 0)
        return 0;
    return kvp_dtype_row_bytes(scale_dtype, count);
}

/* ======================================================================
 * writer
 * ====================================================================== */

struct kvp_writer {
    kvp_out *out;
    int zstd_level;
    ZSTD_CCtx *cctx;
    uint64_t index;
    uint64_t raw_bytes;
    uint64_t count[KVP_KIND_COUNT];
    int finished;
    kvp_buf scratch; /* compressed payloads */
};

static int write_zeros(kvp_writer *w, uint64_t n, kvp_err *err)
{
    static const uint8_t zeros[KVP_ALIGN];
    while (n) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        int rc = kvp_out_write(w->out, zeros, k, err);
        if (rc)
            return rc;
        n -= k;
    }
    return 0;
}

int kvp_writer_open(kvp_writer **wp, kvp_out *out, const kvp_writer_opts *opts, kvp_err *err)
{
    *wp = NULL;
    kvp_writer *w = calloc(1, sizeof *w);
    if (!w)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", kvp_out_name(out));
    w->out = out;
    kvp_buf_init(&w->scratch);
    uint8_t h[KVP_HEADER_SIZE] = {0};
    memcpy(h, stream_magic, 8);
    kvp_put16(h + 8, KVP_VERSION_MAJOR);
    kvp_put16(h + 10, KVP_VERSION_MINOR);
    kvp_put32(h + 12, KVP_HEADER_SIZE);
    if (opts) {
        if (opts->zstd_level < 0 || opts->zstd_level > ZSTD_maxCLevel()) {
            free(w);
            return kvp_err_set(err, KVP_EINVAL, "zstd level %d is outside 1..%d", opts->zstd_level,
                               ZSTD_maxCLevel());
        }
        w->zstd_level = opts->zstd_level;
        memcpy(h + 24, opts->fingerprint, KVP_FINGERPRINT_SIZE);
        if (opts->producer) {
            size_t n = strlen(opts->producer);
            memcpy(h + 40, opts->producer, n < KVP_PRODUCER_MAX ? n : KVP_PRODUCER_MAX);
        }
    }
    kvp_put32(h + 60, kvp_crc32c(0, h, 60));
    int rc = kvp_out_write(out, h, sizeof h, err);
    if (rc) {
        free(w);
        return rc;
    }
    *wp = w;
    return 0;
}

uint64_t kvp_writer_bytes(const kvp_writer *w) { return w->out->pos; }

void kvp_writer_free(kvp_writer *w)
{
    if (!w)
        return;
    ZSTD_freeCCtx(w->cctx);
    kvp_buf_free(&w->scratch);
    free(w);
}

/* The raw payload is: meta, pad to 64, then each piece (padded to 64 before
 * the next when aligned).  Walk it as (pointer, length) segments where a
 * NULL pointer means that many zero bytes. */
typedef struct seg_walk {
    const void *meta;
    uint32_t meta_len;
    const kvp_piece *pieces;
    int n_pieces, align_pieces;
} seg_walk;

typedef int (*seg_fn)(void *ctx, const void *p, uint64_t n, kvp_err *err);

static int walk_segments(const seg_walk *s, seg_fn fn, void *ctx, kvp_err *err)
{
    int rc;
    uint64_t pos = s->meta_len;
    if (s->meta_len && (rc = fn(ctx, s->meta, s->meta_len, err)))
        return rc;
    if (s->n_pieces > 0) {
        uint64_t pad = kvp_align_up(pos, KVP_ALIGN) - pos;
        if (pad && (rc = fn(ctx, NULL, pad, err)))
            return rc;
        pos += pad;
    }
    for (int i = 0; i < s->n_pieces; i++) {
        if (i > 0 && s->align_pieces) {
            uint64_t pad = kvp_align_up(pos, KVP_ALIGN) - pos;
            if (pad && (rc = fn(ctx, NULL, pad, err)))
                return rc;
            pos += pad;
        }
        if (s->pieces[i].n && (rc = fn(ctx, s->pieces[i].p, s->pieces[i].n, err)))
            return rc;
        pos += s->pieces[i].n;
    }
    return 0;
}

static int seg_size(void *ctx, const void *p, uint64_t n, kvp_err *err)
{
    (void)p;
    (void)err;
    *(uint64_t *)ctx += n;
    return 0;
}

static int seg_crc(void *ctx, const void *p, uint64_t n, kvp_err *err)
{
    (void)err;
    static const uint8_t zeros[KVP_ALIGN];
    uint32_t *crc = ctx;
    if (p) {
        *crc = kvp_crc32c(*crc, p, (size_t)n);
    } else {
        while (n) {
            size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
            *crc = kvp_crc32c(*crc, zeros, k);
            n -= k;
        }
    }
    return 0;
}

static int seg_write(void *ctx, const void *p, uint64_t n, kvp_err *err)
{
    kvp_writer *w = ctx;
    return p ? kvp_out_write(w->out, p, (size_t)n, err) : write_zeros(w, n, err);
}

typedef struct zctx {
    kvp_writer *w;
} zctx;

static int seg_compress(void *ctx, const void *p, uint64_t n, kvp_err *err)
{
    kvp_writer *w = ((zctx *)ctx)->w;
    static const uint8_t zeros[KVP_ALIGN];
    while (n) {
        ZSTD_inBuffer in;
        size_t k = p ? (size_t)n : (n < sizeof zeros ? (size_t)n : sizeof zeros);
        in.src = p ? p : zeros;
        in.size = k;
        in.pos = 0;
        while (in.pos < in.size) {
            if (kvp_buf_reserve(&w->scratch, ZSTD_CStreamOutSize()))
                return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory compressing a record", kvp_out_name(w->out));
            ZSTD_outBuffer out = {w->scratch.data + w->scratch.len, w->scratch.cap - w->scratch.len, 0};
            size_t r = ZSTD_compressStream2(w->cctx, &out, &in, ZSTD_e_continue);
            if (ZSTD_isError(r))
                return kvp_err_set(err, KVP_ECOMPRESS, "zstd: %s", ZSTD_getErrorName(r));
            w->scratch.len += out.pos;
        }
        n -= k;
        if (p)
            p = (const uint8_t *)p + k;
    }
    return 0;
}

static int compress_payload(kvp_writer *w, const seg_walk *s, kvp_err *err)
{
    if (!w->cctx && !(w->cctx = ZSTD_createCCtx()))
        return kvp_err_set(err, KVP_ENOMEM, "zstd: cannot create a compression context");
    ZSTD_CCtx_reset(w->cctx, ZSTD_reset_session_only);
    ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_compressionLevel, w->zstd_level);
    ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_checksumFlag, 0);
    w->scratch.len = 0;
    zctx z = {w};
    int rc = walk_segments(s, seg_compress, &z, err);
    if (rc)
        return rc;
    for (;;) {
        if (kvp_buf_reserve(&w->scratch, ZSTD_CStreamOutSize()))
            return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory compressing a record", kvp_out_name(w->out));
        ZSTD_inBuffer in = {NULL, 0, 0};
        ZSTD_outBuffer out = {w->scratch.data + w->scratch.len, w->scratch.cap - w->scratch.len, 0};
        size_t r = ZSTD_compressStream2(w->cctx, &out, &in, ZSTD_e_end);
        if (ZSTD_isError(r))
            return kvp_err_set(err, KVP_ECOMPRESS, "zstd: %s", ZSTD_getErrorName(r));
        w->scratch.len += out.pos;
        if (r == 0)
            return 0;
    }
}

int kvp_writer_record(kvp_writer *w, uint32_t kind, const void *meta, uint32_t meta_len,
                      const kvp_piece *pieces, int n_pieces, int align_pieces, kvp_err *err)
{
    if (w->finished)
        return kvp_err_set(err, KVP_EINVAL, "%s: record written after the end record", kvp_out_name(w->out));
    if (kind == KVP_KIND_HEADER || kind > KVP_KIND_MAX)
        return kvp_err_set(err, KVP_EINVAL, "record kind %u out of range (1..%u; 0 is the stream header's)", kind,
                           KVP_KIND_MAX);
    seg_walk s = {meta, meta_len, pieces, n_pieces, align_pieces};
    uint64_t raw = 0;
    walk_segments(&s, seg_size, &raw, err);

    uint16_t flags = 0;
    uint64_t stored = raw;
    uint32_t pcrc = 0;
    if (w->zstd_level > 0 && raw > 0) {
        int rc = compress_payload(w, &s, err);
        if (rc)
            return rc;
        if (w->scratch.len < raw) { /* keep it only if it saves space */
            flags |= KVP_RECORD_ZSTD;
            stored = w->scratch.len;
            pcrc = kvp_crc32c(0, w->scratch.data, w->scratch.len);
        }
    }
    if (!(flags & KVP_RECORD_ZSTD))
        walk_segments(&s, seg_crc, &pcrc, err);

    uint8_t h[KVP_RECORD_HEADER_SIZE] = {0};
    memcpy(h + RH_MAGIC, record_magic, 4);
    kvp_put16(h + RH_KIND, (uint16_t)kind);
    kvp_put16(h + RH_FLAGS, flags);
    kvp_put64(h + RH_INDEX, w->index);
    kvp_put64(h + RH_STORED, stored);
    kvp_put64(h + RH_RAW, raw);
    kvp_put32(h + RH_META, meta_len);
    kvp_put32(h + RH_PCRC, pcrc);
    kvp_put32(h + RH_HCRC, kvp_crc32c(0, h, RH_HCRC));

    int rc = kvp_out_write(w->out, h, sizeof h, err);
    if (!rc)
        rc = (flags & KVP_RECORD_ZSTD) ? kvp_out_write(w->out, w->scratch.data, w->scratch.len, err)
                                       : walk_segments(&s, seg_write, w, err);
    if (!rc)
        rc = write_zeros(w, kvp_align_up(stored, KVP_ALIGN) - stored, err);
    if (rc)
        return rc;
    w->index++;
    w->raw_bytes += raw;
    if (kind < KVP_KIND_COUNT)
        w->count[kind]++;
    return 0;
}

int kvp_write_meta(kvp_writer *w, uint32_t kind, const kvp_meta *m, kvp_err *err)
{
    kvp_buf b;
    kvp_buf_init(&b);
    int rc = kvp_meta_encode(m, &b);
    if (rc || b.oom || b.len > UINT32_MAX)
        rc = kvp_err_set(err, KVP_ENOMEM, "%s: %s record too large or out of memory", kvp_out_name(w->out),
                         kvp_kind_name(kind));
    else
        rc = kvp_writer_record(w, kind, b.data, (uint32_t)b.len, NULL, 0, 0, err);
    kvp_buf_free(&b);
    return rc;
}

static int finish_meta(kvp_writer *w, kvp_buf *b, uint32_t kind, const kvp_piece *pieces, int n, kvp_err *err)
{
    int rc;
    if (b->oom)
        rc = kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", kvp_out_name(w->out));
    else
        rc = kvp_writer_record(w, kind, b->data, (uint32_t)b->len, pieces, n, 1, err);
    kvp_buf_free(b);
    return rc;
}

/* What is wrong with a tensor name kvp(5) takes (UTF-8, no control
 * character: a listing's line, a JSON string, an --include pattern's
 * subject), or NULL. */
static const char *name_fault(const char *s, size_t n)
{
    if (kvp_unicode_valid_prefix(s, n) != n)
        return "is not UTF-8";
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return "holds a control character";
    return NULL;
}

int kvp_write_tensor(kvp_writer *w, const kvp_tensor_rec *t, const void *data, const void *scales,
                     const void *zeros, kvp_err *err)
{
    size_t name_len = strnlen(t->name, sizeof t->name);
    int64_t want = kvp_tensor_data_bytes(t), nsc = kvp_tensor_scale_count(t);
    if (name_len == 0 || name_len > KVP_NAME_MAX)
        return kvp_err_set(err, KVP_EINVAL, "tensor name empty or longer than %d bytes", KVP_NAME_MAX);
    const char *nf = name_fault(t->name, name_len);
    if (nf)
        return kvp_err_set(err, KVP_EINVAL, "tensor name %s", nf);
    if (want < 0 || (uint64_t)want != t->data_bytes)
        return kvp_err_set(err, KVP_EINVAL, "tensor %s: data_bytes %llu does not match dtype %s and shape",
                           t->name, (unsigned long long)t->data_bytes, kvp_dtype_name(t->dtype));
    if (nsc < 0 || scale_bytes(t->scale_dtype, nsc) != (int64_t)t->scales_bytes)
        return kvp_err_set(err, KVP_EINVAL, "tensor %s: scales_bytes %llu does not match its scheme", t->name,
                           (unsigned long long)t->scales_bytes);
    if ((t->flags & KVP_TENSOR_ASYM) ? t->zeros_bytes != t->scales_bytes : t->zeros_bytes != 0)
        return kvp_err_set(err, KVP_EINVAL, "tensor %s: zeros_bytes must equal scales_bytes when asymmetric, else 0",
                           t->name);
    if ((t->flags & KVP_TENSOR_ASYM) && t->dtype != KVP_DTYPE_I8 && t->dtype != KVP_DTYPE_I4)
        return kvp_err_set(err, KVP_EINVAL, "tensor %s: asymmetric %s (only i8 and i4 take zero points)", t->name,
                           kvp_dtype_name(t->dtype));
    kvp_buf b;
    kvp_buf_init(&b);
    kvp_buf_str32(&b, t->name, name_len);
    kvp_buf_u32(&b, t->dtype);
    kvp_buf_u32(&b, t->n_dim);
    for (uint32_t i = 0; i < t->n_dim; i++)
        kvp_buf_u64(&b, t->shape[i]);
    kvp_buf_u32(&b, t->scheme);
    kvp_buf_u32(&b, t->group);
    kvp_buf_u32(&b, t->scale_dtype);
    kvp_buf_u32(&b, t->flags);
    kvp_buf_f32(&b, t->global_scale);
    kvp_buf_u64(&b, t->data_bytes);
    kvp_buf_u64(&b, t->scales_bytes);
    kvp_buf_u64(&b, t->zeros_bytes);
    kvp_piece pieces[3] = {{data, t->data_bytes}, {scales, t->scales_bytes}, {zeros, t->zeros_bytes}};
    int n = t->zeros_bytes ? 3 : t->scales_bytes ? 2 : 1;
    return finish_meta(w, &b, KVP_KIND_TENSOR, pieces, n, err);
}

int kvp_sampling_check(const kvp_sampling *s, kvp_err *err)
{
    if (!(s->temperature >= 0) || s->temperature > 100)
        return kvp_err_set(err, KVP_EINVAL, "temperature %g: use 0 (greedy) .. 100", (double)s->temperature);
    if (s->top_k < 0)
        return kvp_err_set(err, KVP_EINVAL, "top-k %d: use 0 (off) or more", s->top_k);
    if (!(s->top_p > 0 && s->top_p <= 1))
        return kvp_err_set(err, KVP_EINVAL, "top-p %g: use a value in (0, 1]", (double)s->top_p);
    if (!(s->min_p >= 0 && s->min_p <= 1))
        return kvp_err_set(err, KVP_EINVAL, "min-p %g: use a value in [0, 1]", (double)s->min_p);
    if (!(s->repeat_penalty > 0) || s->repeat_penalty > 100)
        return kvp_err_set(err, KVP_EINVAL, "repeat penalty %g: use a value in (0, 100]", (double)s->repeat_penalty);
    return 0;
}

/* The fields a reader acts on, against what kvp(5) defines: a stream is
 * untrusted, and decode would run an undefined state as some other one.
 * NULL when they are good, else what is wrong, in what[n]; the writer
 * refuses what a reader would. */
static const char *seq_bad_fields(const kvp_seq_rec *s, char *what, size_t n)
{
    kvp_err why = {0};
    if (s->state < KVP_SEQ_PREFILLED || s->state > KVP_SEQ_FINISHED)
        snprintf(what, n, "state %u is not 1 (prefilled), 2 (running) or 3 (finished)", s->state);
    else if (s->finish_reason > KVP_SEQ_FINISH_MAX)
        snprintf(what, n, "finish reason %u is not 0..%u", s->finish_reason, KVP_SEQ_FINISH_MAX);
    else if (s->block_size == 0)
        snprintf(what, n, "block size 0");
    else if (s->next_token < -1)
        snprintf(what, n, "next token %d is neither -1 (none) nor a token id", (int)s->next_token);
    else if (kvp_sampling_check(&s->sampling, &why) < 0)
        snprintf(what, n, "%s", why.msg);
    else
        return NULL;
    return what;
}

/* Whether s[0..n) is an int64 written as "%" PRId64 writes it: an
 * optional '-', no '+', no leading zero, no "-0", no blank, in range. */
static int int64_digits(const char *s, size_t n)
{
    char buf[24], back[24];
    if (n == 0 || n >= sizeof buf)
        return 0;
    memcpy(buf, s, n);
    buf[n] = 0;
    /* out of range clamps to INT64_MIN/MAX, whose digits differ from s */
    long long v = strtoll(buf, NULL, 10);
    int len = snprintf(back, sizeof back, "%lld", v);
    return len == (int)n && memcmp(back, s, n) == 0;
}

int kvp_write_sequence(kvp_writer *w, const kvp_seq_rec *s, const uint32_t *tokens, const char *const *stop,
                       size_t n_stop, kvp_err *err)
{
    size_t label_len = strnlen(s->label, sizeof s->label);
    if (label_len > KVP_NAME_MAX || s->n_prompt > s->n_tokens)
        return kvp_err_set(err, KVP_EINVAL, "sequence %llu: label too long or n_prompt > n_tokens",
                           (unsigned long long)s->id);
    if (s->flags & ~KVP_SEQ_FLAGS_KNOWN)
        return kvp_err_set(err, KVP_EINVAL, "sequence %llu: unknown flags 0x%x", (unsigned long long)s->id,
                           s->flags & ~KVP_SEQ_FLAGS_KNOWN);
    if ((s->flags & KVP_SEQ_LABEL_INT) && !int64_digits(s->label, label_len))
        return kvp_err_set(err, KVP_EINVAL, "sequence %llu: an integer id whose label is not its digits",
                           (unsigned long long)s->id);
    char what[KVP_ERR_MSG_MAX];
    if (seq_bad_fields(s, what, sizeof what))
        return kvp_err_set(err, KVP_EINVAL, "sequence %llu: %s", (unsigned long long)s->id, what);
    if (n_stop > KVP_STOP_MAX_N)
        return kvp_err_set(err, KVP_EINVAL, "sequence %llu: %zu stop strings (a record carries at most %d)",
                           (unsigned long long)s->id, n_stop, KVP_STOP_MAX_N);
    for (size_t k = 0; k < n_stop; k++)
        if (strnlen(stop[k], KVP_STOP_MAX_LEN + 1) > KVP_STOP_MAX_LEN)
            return kvp_err_set(err, KVP_EINVAL, "sequence %llu: stop string %zu is longer than %d bytes",
                               (unsigned long long)s->id, k + 1, KVP_STOP_MAX_LEN);
    kvp_buf b;
    kvp_buf_init(&b);
    kvp_buf_u64(&b, s->id);
    kvp_buf_str32(&b, s->label, label_len);
    kvp_buf_u32(&b, s->state);
    kvp_buf_u32(&b, s->finish_reason);
    kvp_buf_u32(&b, s->n_prompt);
    kvp_buf_u32(&b, s->n_tokens);
    kvp_buf_u32(&b, (uint32_t)s->next_token);
    kvp_buf_u32(&b, s->block_size);
    const kvp_sampling *sp = &s->sampling;
    kvp_buf_f32(&b, sp->temperature);
    kvp_buf_u32(&b, (uint32_t)sp->top_k);
    kvp_buf_f32(&b, sp->top_p);
    kvp_buf_f32(&b, sp->min_p);
    kvp_buf_f32(&b, sp->repeat_penalty);
    kvp_buf_u32(&b, sp->max_tokens);
    kvp_buf_u64(&b, sp->seed);
    kvp_buf_u64(&b, sp->rng[0]);
    kvp_buf_u64(&b, sp->rng[1]);
    kvp_buf_u64(&b, s->arrival_ns);
    kvp_buf_u64(&b, s->first_ns);
    /* a request without salt, stop strings or flags writes the record as
     * before them; flags come after the stop strings, so they bring those */
    if (s->cache_salt || n_stop || s->flags) {
        kvp_buf_u64(&b, s->cache_salt);
        kvp_buf_u32(&b, (uint32_t)n_stop);
        for (size_t k = 0; k < n_stop; k++)
            kvp_buf_str32(&b, stop[k], strlen(stop[k]));
    }
    if (s->flags)
        kvp_buf_u32(&b, s->flags);
    kvp_piece p = {tokens, (uint64_t)s->n_tokens * 4};
    return finish_meta(w, &b, KVP_KIND_SEQUENCE, &p, s->n_tokens ? 1 : 0, err);
}

/* Bytes of K+V data a block implies; -1 on overflow or unknown dtype. */
static int64_t kvblock_data_bytes(const kvp_kvblock_rec *b)
{
    uint64_t layers = (uint64_t)b->layer_end - b->layer_begin;
    uint64_t per_head = (uint64_t)b->block_size * b->head_dim;
    if (b->layer_end <= b->layer_begin || per_head == 0 || per_head > (1ull << 40))
        return -1;
    int64_t row = kvp_dtype_row_bytes(b->dtype, (int64_t)per_head);
    if (row <= 0)
        return -1;
    uint64_t heads = layers * 2 * b->n_head_kv;
    if (heads == 0 || heads > (uint64_t)INT64_MAX / (uint64_t)row)
        return -1;
    return (int64_t)(heads * (uint64_t)row);
}

/* Scales of a head's slab: 1, or one a slot. */
static int64_t kvblock_scale_bytes(const kvp_kvblock_rec *b, int per_slot)
{
    uint64_t n = ((uint64_t)b->layer_end - b->layer_begin) * 2 * b->n_head_kv * (per_slot ? b->block_size : 1);
    return kvp_dtype_row_bytes(b->scale_dtype, (int64_t)n);
}

int kvp_kvblock_scales_per_slot(const kvp_kvblock_rec *b)
{
    if (b->scales_bytes == 0)
        return -1;
    if ((int64_t)b->scales_bytes == kvblock_scale_bytes(b, 0))
        return 0;
    return (int64_t)b->scales_bytes == kvblock_scale_bytes(b, 1) ? 1 : -1;
}

/* kvp(5): fp8_e4m3 and i8 elements are codes that mean nothing without
 * their f32 scales (one a head, or one a slot); f32, f16 and bf16 elements
 * are values and carry none (scale dtype 0).  What is wrong with b's scale
 * fields, in what[n], or NULL.  Read without them, a scaled block is its
 * codes taken as values (quantize --kv wrote such KV, exit 0). */
static const char *kvblock_scales_fault(const kvp_kvblock_rec *b, char *what, size_t n)
{
    int scaled = kvp_kvscale_dtype((int)b->dtype);
    uint64_t heads = ((uint64_t)b->layer_end - b->layer_begin) * 2 * b->n_head_kv;
    const char *dt = kvp_dtype_name(b->dtype);
    if (scaled && b->scale_dtype != KVP_DTYPE_F32)
        snprintf(what, n, "scale dtype %u (%s): the scales of %s elements are f32 (scale dtype %u)", b->scale_dtype,
                 kvp_dtype_name(b->scale_dtype), dt, KVP_DTYPE_F32);
    else if (!scaled && b->scale_dtype != 0)
        snprintf(what, n, "scale dtype %u (%s) on a %s block, which carries no scales (want 0)", b->scale_dtype,
                 kvp_dtype_name(b->scale_dtype), dt);
    else if (!scaled && b->scales_bytes)
        snprintf(what, n, "scales_bytes %llu on a %s block, which carries no scales (want 0)",
                 (unsigned long long)b->scales_bytes, dt);
    else if (scaled && kvp_kvblock_scales_per_slot(b) < 0)
        snprintf(what, n, "scales_bytes %llu: %s elements need their f32 scales, %llu bytes (one a head) or %llu "
                 "(one a slot)", (unsigned long long)b->scales_bytes, dt, (unsigned long long)(heads * 4),
                 (unsigned long long)(heads * 4 * b->block_size));
    else
        return NULL;
    return what;
}

int kvp_write_kvblock(kvp_writer *w, const kvp_kvblock_rec *bl, const uint32_t *tokens, const void *data,
                      const void *scales, kvp_err *err)
{
    int64_t want = kvblock_data_bytes(bl);
    if (want < 0 || (uint64_t)want != bl->data_bytes || bl->n_tokens == 0 || bl->n_tokens > bl->block_size)
        return kvp_err_set(err, KVP_EINVAL, "KV block %u of sequence %llu: sizes do not match its shape",
                           bl->block_index, (unsigned long long)bl->seq_id);
    char what[KVP_ERR_MSG_MAX];
    if (kvblock_scales_fault(bl, what, sizeof what))
        return kvp_err_set(err, KVP_EINVAL, "KV block %u of sequence %llu: %s", bl->block_index,
                           (unsigned long long)bl->seq_id, what);
    kvp_buf b;
    kvp_buf_init(&b);
    kvp_buf_u64(&b, bl->seq_id);
    kvp_buf_u32(&b, bl->block_index);
    kvp_buf_u32(&b, bl->block_size);
    kvp_buf_u32(&b, bl->n_tokens);
    kvp_buf_u32(&b, bl->layer_begin);
    kvp_buf_u32(&b, bl->layer_end);
    kvp_buf_u32(&b, bl->n_head_kv);
    kvp_buf_u32(&b, bl->head_dim);
    kvp_buf_u32(&b, bl->dtype);
    kvp_buf_u32(&b, bl->scale_dtype);
    kvp_buf_u64(&b, bl->parent_hash);
    kvp_buf_u64(&b, bl->hash);
    kvp_buf_u64(&b, bl->data_bytes);
    kvp_buf_u64(&b, bl->scales_bytes);
    for (uint32_t i = 0; i < bl->n_tokens; i++)
        kvp_buf_u32(&b, tokens[i]);
    kvp_piece pieces[2] = {{data, bl->data_bytes}, {scales, bl->scales_bytes}};
    return finish_meta(w, &b, KVP_KIND_KV_BLOCK, pieces, bl->scales_bytes ? 2 : 1, err);
}

int kvp_write_blockref(kvp_writer *w, const kvp_blockref_rec *r, kvp_err *err)
{
    kvp_buf b;
    kvp_buf_init(&b);
    kvp_buf_u64(&b, r->seq_id);
    kvp_buf_u32(&b, r->block_index);
    kvp_buf_u32(&b, r->n_tokens);
    kvp_buf_u64(&b, r->parent_hash);
    kvp_buf_u64(&b, r->hash);
    return finish_meta(w, &b, KVP_KIND_BLOCK_REF, NULL, 0, err);
}

/* What is wrong with a STOP record's fields (writer and reader alike), or
 * NULL: signals are 1..64 on Linux (SIGRTMAX), one flag is defined. */
static const char *stop_fields_bad(const kvp_stop_rec *s)
{
    if (s->signal < 1 || s->signal > 64)
        return "stop record names no signal (1 to 64)";
    if (s->flags & ~KVP_STOP_INPUT_LEFT)
        return "stop record has unknown flags";
    return NULL;
}

int kvp_write_stop(kvp_writer *w, const kvp_stop_rec *s, kvp_err *err)
{
    const char *bad = stop_fields_bad(s);
    if (bad)
        return kvp_err_set(err, KVP_EINVAL, "%s (signal %u, flags 0x%x)", bad, s->signal, s->flags);
    kvp_buf b;
    kvp_buf_init(&b);
    kvp_buf_u32(&b, s->signal);
    kvp_buf_u32(&b, s->flags);
    kvp_buf_u64(&b, s->written);
    kvp_buf_u64(&b, s->left);
    return finish_meta(w, &b, KVP_KIND_STOP, NULL, 0, err);
}

int kvp_writer_finish(kvp_writer *w, kvp_err *err)
{
    kvp_buf b;
    kvp_buf_init(&b);
    kvp_buf_u64(&b, w->index);
    kvp_buf_u64(&b, w->raw_bytes);
    kvp_buf_u32(&b, KVP_KIND_COUNT);
    for (int i = 0; i < KVP_KIND_COUNT; i++)
        kvp_buf_u64(&b, w->count[i]);
    int rc = finish_meta(w, &b, KVP_KIND_END, NULL, 0, err);
    if (!rc)
        w->finished = 1;
    return rc;
}

/* ======================================================================
 * reader
 * ====================================================================== */

struct kvp_reader {
    kvp_in *in;
    kvp_stream_info info;
    uint64_t limit;
    uint64_t index;           /* next expected record index */
    uint64_t raw_bytes;
    uint64_t count[KVP_KIND_COUNT];
    kvp_u64map more;          /* records of each kind past KVP_KIND_COUNT, by kind */
    int ended;                /* END seen */
    int at_eof;               /* clean end reported */
    uint32_t skim;            /* kinds whose payload is skipped on mapped input (bit per kind) */
    uint8_t *buf;             /* stored payload (pipe reads) */
    size_t buf_cap;
    uint8_t *raw;             /* decompressed payload */
    size_t raw_cap;
    ZSTD_DCtx *dctx;
    kvp_strmap names;         /* the tensor names met, each with the index of its record */
    uint64_t first_meta[2];   /* 1 + the index of the config, the tokenizer record met; 0: none yet */
};

/* 64-byte aligned growth that keeps the first `keep` bytes. */
static int grow_keep(uint8_t **p, size_t *cap, size_t want, size_t keep)
{
    if (want <= *cap)
        return 0;
    size_t n = *cap ? *cap : 4096;
    while (n < want)
        n = n > SIZE_MAX / 2 ? want : n * 2;
    void *q = NULL;
    if (posix_memalign(&q, KVP_ALIGN, n))
        return KVP_ENOMEM;
    if (keep)
        memcpy(q, *p, keep);
    free(*p);
    *p = q;
    *cap = n;
    return 0;
}

int kvp_reader_open(kvp_reader **rp, kvp_in *in, kvp_err *err)
{
    *rp = NULL;
    uint8_t h[KVP_HEADER_SIZE];
    int64_t got = kvp_in_read(in, h, sizeof h, err);
    if (got < 0)
        return (int)got;
    if (got == 0)
        return kvp_err_set(err, KVP_ETRUNC, "%s: empty input, not a KVP stream", in->name);
    if (memcmp(h, stream_magic, (size_t)(got < 8 ? got : 8)) != 0)
        return kvp_err_set(err, KVP_EFORMAT, "%s: not a KVP stream (bad magic at offset 0)", in->name);
    if (got < (int64_t)sizeof h)
        return kvp_err_set(err, KVP_ETRUNC, "%s: stream header cut short at offset %lld (needs %d bytes)", in->name,
                           (long long)got, KVP_HEADER_SIZE);
    uint16_t major = kvp_le16(h + 8), minor = kvp_le16(h + 10);
    if (major > KVP_VERSION_MAJOR)
        return kvp_err_set(err, KVP_EVERSION,
                           "%s: KVP format version %u.%u is newer than this reader (%d.x); upgrade kvpipe", in->name,
                           major, minor, KVP_VERSION_MAJOR);
    uint32_t crc = kvp_crc32c(0, h, 60), stored = kvp_le32(h + 60);
    if (CRC_BAD(crc, stored))
        return kvp_err_set(err, KVP_ECHECKSUM,
                           "%s: stream header at offset 0: checksum mismatch (stored 0x%08x, computed 0x%08x)",
                           in->name, stored, crc);
    if (major == 0 || kvp_le32(h + 12) != KVP_HEADER_SIZE)
        return kvp_err_set(err, KVP_EFORMAT, "%s: stream header: version %u.%u or header size %u is invalid",
                           in->name, major, minor, kvp_le32(h + 12));
    kvp_reader *r = calloc(1, sizeof *r);
    if (!r)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", in->name);
    r->in = in;
    r->limit = KVP_DEFAULT_RECORD_LIMIT;
    r->info.major = major;
    r->info.minor = minor;
    r->info.flags = kvp_le32(h + 16);
    memcpy(r->info.fingerprint, h + 24, KVP_FINGERPRINT_SIZE);
    memcpy(r->info.producer, h + 40, KVP_PRODUCER_MAX);
    r->info.producer[KVP_PRODUCER_MAX] = '\0';
    *rp = r;
    return 0;
}

const kvp_stream_info *kvp_reader_info(const kvp_reader *r) { return &r->info; }
void kvp_reader_set_limit(kvp_reader *r, uint64_t max) { r->limit = max; }
void kvp_reader_skim(kvp_reader *r, uint32_t kinds) { r->skim = kinds; }

void kvp_reader_free(kvp_reader *r)
{
    if (!r)
        return;
    free(r->buf);
    free(r->raw);
    ZSTD_freeDCtx(r->dctx);
    kvp_strmap_free(&r->names);
    kvp_u64map_free(&r->more);
    free(r);
}

/* Read exactly n stored bytes into r->buf, growing it only as data arrives,
 * so a lying size on a pipe costs at most twice what was really sent. */
static int read_payload(kvp_reader *r, uint64_t n, uint64_t rec_off, const char *kname, kvp_err *err)
{
    size_t have = 0;
    while (have < n) {
        size_t want = (size_t)(n - have);
        size_t step = have < (1u << 20) ? (1u << 20) : have;
        if (want > step)
            want = step;
        if (grow_keep(&r->buf, &r->buf_cap, have + want, have))
            return kvp_err_set(err, KVP_ENOMEM, "%s: record %llu at offset %llu: out of memory for %llu payload bytes",
                               r->in->name, (unsigned long long)r->index, (unsigned long long)rec_off,
                               (unsigned long long)n);
        int64_t got = kvp_in_read(r->in, r->buf + have, want, err);
        if (got < 0)
            return (int)got;
        have += (size_t)got;
        if ((size_t)got < want)
            return kvp_err_set(err, KVP_ETRUNC,
                               "%s: record %llu (%s) at offset %llu: payload cut short at offset %llu (%llu of %llu bytes)",
                               r->in->name, (unsigned long long)r->index, kname, (unsigned long long)rec_off,
                               (unsigned long long)r->in->pos, (unsigned long long)have, (unsigned long long)n);
    }
    return 0;
}

static int decompress(kvp_reader *r, const uint8_t *src, uint64_t n, uint64_t raw, uint64_t rec_off, kvp_err *err)
{
    if (!r->dctx && !(r->dctx = ZSTD_createDCtx()))
        return kvp_err_set(err, KVP_ENOMEM, "zstd: cannot create a decompression context");
    ZSTD_DCtx_reset(r->dctx, ZSTD_reset_session_only);
    ZSTD_inBuffer in = {src, (size_t)n, 0};
    size_t have = 0;
    for (;;) {
        /* Grow with the output actually produced, never straight to `raw`. */
        size_t room = have < (1u << 20) ? (1u << 20) : have;
        size_t want = have + room;
        if (want > raw + 1)
            want = (size_t)raw + 1; /* +1 so overlong output is seen */
        if (grow_keep(&r->raw, &r->raw_cap, want, have))
            return kvp_err_set(err, KVP_ENOMEM, "%s: record %llu at offset %llu: out of memory decompressing",
                               r->in->name, (unsigned long long)r->index, (unsigned long long)rec_off);
        ZSTD_outBuffer out = {r->raw, want, have};
        size_t rc = ZSTD_decompressStream(r->dctx, &out, &in);
        if (ZSTD_isError(rc))
            return kvp_err_set(err, KVP_ECOMPRESS, "%s: record %llu at offset %llu: zstd: %s", r->in->name,
                               (unsigned long long)r->index, (unsigned long long)rec_off, ZSTD_getErrorName(rc));
        have = out.pos;
        if (have > raw)
            break;
        if (rc == 0 && in.pos == in.size)
            break;
        if (in.pos == in.size && out.pos < out.size)
            return kvp_err_set(err, KVP_ECOMPRESS, "%s: record %llu at offset %llu: zstd frame incomplete",
                               r->in->name, (unsigned long long)r->index, (unsigned long long)rec_off);
    }
    if (have != raw || in.pos != in.size)
        return kvp_err_set(err, KVP_EFORMAT,
                           "%s: record %llu at offset %llu: decompressed to %s%llu bytes, header says %llu",
                           r->in->name, (unsigned long long)r->index, (unsigned long long)rec_off,
                           have > raw ? "more than " : "", (unsigned long long)(have > raw ? raw : have),
                           (unsigned long long)raw);
    return 0;
}

/* Records of kind k the stream had before END. */
static uint64_t kind_count(const kvp_reader *r, uint32_t k)
{
    if (k < KVP_KIND_COUNT)
        return r->count[k];
    int64_t v = kvp_u64map_get(&r->more, k);
    return v < 0 ? 0 : (uint64_t)v;
}

/* Every counter of the END record against what was read: its kinds 0..15
 * (0 and 15 are no record's before END: both 0), and any a later minor
 * version adds for its kinds, which this reader skipped but counted. */
static int check_end(kvp_reader *r, const kvp_record *rec, kvp_err *err)
{
    kvp_end_rec e;
    int rc = kvp_end_decode(rec, &e, err);
    if (rc)
        return kvp_err_prefix(err, "%s", r->in->name);
    if (e.n_records != r->index || e.raw_bytes != r->raw_bytes)
        return kvp_err_set(err, KVP_EFORMAT,
                           "%s: end record at offset %llu counts %llu records / %llu bytes, stream had %llu / %llu",
                           r->in->name, (unsigned long long)rec->offset, (unsigned long long)e.n_records,
                           (unsigned long long)e.raw_bytes, (unsigned long long)r->index,
                           (unsigned long long)r->raw_bytes);
    for (uint32_t k = 0; k < e.n_counts; k++) {
        uint64_t said = kvp_le64(e.counts_le + 8 * (size_t)k), had = kind_count(r, k);
        if (said != had)
            return kvp_err_set(err, KVP_EFORMAT,
                               "%s: end record at offset %llu counts %llu records of kind %u (%s)%s, the stream "
                               "had %llu",
                               r->in->name, (unsigned long long)rec->offset, (unsigned long long)said, k,
                               k == KVP_KIND_HEADER ? "header" : kvp_kind_name(k),
                               k == KVP_KIND_END ? " before it" : "", (unsigned long long)had);
    }
    return 0;
}

/* A record before END, read or skimmed, toward the END record's totals:
 * its bytes, and its kind's count, kinds past KVP_KIND_COUNT (unknown to
 * this version, skimmable up to 31) too, for an END that counts them. */
static int tally(kvp_reader *r, const kvp_record *rec, kvp_err *err)
{
    r->raw_bytes += rec->raw_size;
    if (rec->kind < KVP_KIND_COUNT) {
        r->count[rec->kind]++;
        return 0;
    }
    /* a later minor version's END may count this kind (kvp(5), End) */
    if (kvp_u64map_put(&r->more, rec->kind, (int64_t)kind_count(r, rec->kind) + 1) < 0)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", r->in->name);
    return 0;
}

/* A tensor record's name, from its meta part (in the mapping when the
 * record was skimmed and is not compressed); 0 when it cannot be seen, or
 * is malformed, which the tensor decoder reports. */
static int tensor_name(const kvp_reader *r, const kvp_record *rec, char name[KVP_NAME_MAX + 1])
{
    const uint8_t *meta = rec->meta;
    if (!meta && r->in->map && !(rec->flags & KVP_RECORD_ZSTD))
        meta = r->in->map + rec->offset + KVP_RECORD_HEADER_SIZE;
    if (!meta || rec->meta_size < 4)
        return 0;
    uint32_t len = kvp_le32(meta);
    if (len == 0 || len > KVP_NAME_MAX || len > rec->meta_size - 4 || memchr(meta + 4, 0, len))
        return 0;
    memcpy(name, meta + 4, len);
    name[len] = '\0';
    return 1;
}

/* kvp(5): a stream's tensor names are unique.  A second tensor of a name
 * is refused naming both records: a reader that looks a tensor up by name
 * would take one copy, one that counts them would count both. */
static int tensor_unique(kvp_reader *r, const kvp_record *rec, kvp_err *err)
{
    char name[KVP_NAME_MAX + 1];
    if (!tensor_name(r, rec, name))
        return 0;
    uint64_t first = 0;
    int rc = kvp_strmap_add(&r->names, name, strlen(name), rec->index, &first);
    if (rc < 0)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", r->in->name);
    if (rc == 0)
        return kvp_err_set(err, KVP_EFORMAT,
                           "%s: record %llu (tensor %s) at offset %llu: a second tensor of that name (the first is "
                           "record %llu)",
                           r->in->name, (unsigned long long)rec->index, name, (unsigned long long)rec->offset,
                           (unsigned long long)first);
    return 0;
}

/* kvp(5): a stream holds one config and one tokenizer record at most; a
 * second is refused naming both, as a second tensor of a name is (a reader
 * that keeps the first would take another model than one that keeps the
 * last). */
static int meta_once(kvp_reader *r, const kvp_record *rec, kvp_err *err)
{
    if (rec->kind != KVP_KIND_CONFIG && rec->kind != KVP_KIND_TOKENIZER)
        return 0;
    uint64_t *first = &r->first_meta[rec->kind == KVP_KIND_TOKENIZER];
    if (!*first) {
        *first = rec->index + 1;
        return 0;
    }
    const char *kname = kvp_kind_name(rec->kind);
    return kvp_err_set(err, KVP_EFORMAT, "%s: record %llu (%s) at offset %llu: a second %s record (the first is "
                       "record %llu; a stream holds one)",
                       r->in->name, (unsigned long long)rec->index, kname, (unsigned long long)rec->offset, kname,
                       (unsigned long long)(*first - 1));
}

/* The records a stream holds one of: a tensor a name, a config, a tokenizer. */
static int record_unique(kvp_reader *r, const kvp_record *rec, kvp_err *err)
{
    return rec->kind == KVP_KIND_TENSOR ? tensor_unique(r, rec, err) : meta_once(r, rec, err);
}

/* kvp(5)'s raw payload: the meta part, zero bytes to a multiple of 64, then
 * the data part, which may be empty (the padding too, then).  Sets
 * rec->data; 0, 1 when the payload ends inside the padding, or 2 + the
 * payload offset of a nonzero padding byte. */
static int64_t split_payload(kvp_record *rec, const uint8_t *raw)
{
    uint64_t data_off = kvp_align_up(rec->meta_size, KVP_ALIGN);
    if (rec->raw_size == rec->meta_size)
        return 0;
    if (rec->raw_size < data_off)
        return 1;
    for (uint64_t i = rec->meta_size; i < data_off; i++)
        if (raw[i])
            return 2 + (int64_t)i;
    if (data_off < rec->raw_size) {
        rec->data = raw + data_off;
        rec->data_size = rec->raw_size - data_off;
    }
    return 0;
}

int kvp_reader_next(kvp_reader *r, kvp_record *rec, kvp_err *err)
{
    kvp_in *in = r->in;
    const char *name = in->name;
    memset(rec, 0, sizeof *rec);
    if (r->at_eof)
        return 0;
    if (r->ended) {
        uint8_t extra;
        uint64_t off = in->pos;
        int64_t got = kvp_in_read(in, &extra, 1, err);
        if (got < 0)
            return (int)got;
        if (got > 0)
            return kvp_err_set(err, KVP_EFORMAT, "%s: unexpected data after the end record at offset %llu", name,
                               (unsigned long long)off);
        r->at_eof = 1;
        return 0;
    }
    uint64_t off = in->pos;
    uint8_t h[KVP_RECORD_HEADER_SIZE];
    int64_t got = kvp_in_read(in, h, sizeof h, err);
    if (got < 0)
        return (int)got;
    if (got == 0)
        return kvp_err_set(err, KVP_ETRUNC,
                           "%s: stream ends at offset %llu after %llu records without an end record (truncated)", name,
                           (unsigned long long)off, (unsigned long long)r->index);
    if (got < (int64_t)sizeof h)
        return kvp_err_set(err, KVP_ETRUNC, "%s: record %llu header at offset %llu cut short (%lld of %d bytes)", name,
                           (unsigned long long)r->index, (unsigned long long)off, (long long)got,
                           KVP_RECORD_HEADER_SIZE);
    if (memcmp(h, record_magic, 4) != 0)
        return kvp_err_set(err, KVP_EFORMAT, "%s: record %llu at offset %llu: bad record magic", name,
                           (unsigned long long)r->index, (unsigned long long)off);
    uint32_t hcrc = kvp_crc32c(0, h, RH_HCRC), hstored = kvp_le32(h + RH_HCRC);
    if (CRC_BAD(hcrc, hstored))
        return kvp_err_set(err, KVP_ECHECKSUM,
                           "%s: record %llu at offset %llu: header checksum mismatch (stored 0x%08x, computed 0x%08x)",
                           name, (unsigned long long)r->index, (unsigned long long)off, hstored, hcrc);
    rec->kind = kvp_le16(h + RH_KIND);
    rec->flags = kvp_le16(h + RH_FLAGS);
    rec->index = kvp_le64(h + RH_INDEX);
    rec->offset = off;
    rec->stored_size = kvp_le64(h + RH_STORED);
    rec->raw_size = kvp_le64(h + RH_RAW);
    rec->meta_size = kvp_le32(h + RH_META);
    const char *kname = kvp_kind_name(rec->kind);
    if (rec->index != r->index)
        return kvp_err_set(err, KVP_EFORMAT,
                           "%s: record at offset %llu has index %llu, expected %llu (records lost or reordered)", name,
                           (unsigned long long)off, (unsigned long long)rec->index, (unsigned long long)r->index);
    /* kvp(5): 0 names the stream header, no record; a reader that skipped
     * it as an unknown kind would list a second "header" mid-stream */
    if (rec->kind == KVP_KIND_HEADER)
        return kvp_err_set(err, KVP_EFORMAT, "%s: record %llu at offset %llu: kind 0 is the stream header's number, "
                           "no record's", name, (unsigned long long)r->index, (unsigned long long)off);
    if (rec->flags & ~(uint32_t)KVP_RECORD_ZSTD)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: record %llu (%s) at offset %llu: unknown flags 0x%x", name,
                           (unsigned long long)r->index, kname, (unsigned long long)off, rec->flags);
    if (rec->stored_size > r->limit || rec->raw_size > r->limit)
        return kvp_err_set(err, KVP_ELIMIT,
                           "%s: record %llu (%s) at offset %llu: payload of %llu bytes exceeds the limit of %llu", name,
                           (unsigned long long)r->index, kname, (unsigned long long)off,
                           (unsigned long long)(rec->raw_size > rec->stored_size ? rec->raw_size : rec->stored_size),
                           (unsigned long long)r->limit);
    uint64_t padded = kvp_align_up(rec->stored_size, KVP_ALIGN);
    if (padded > kvp_in_left(in))
        return kvp_err_set(err, KVP_ETRUNC,
                           "%s: record %llu (%s) at offset %llu declares %llu payload bytes (%llu with padding) "
                           "but only %llu remain (truncated)",
                           name, (unsigned long long)r->index, kname, (unsigned long long)off,
                           (unsigned long long)rec->stored_size, (unsigned long long)padded,
                           (unsigned long long)kvp_in_left(in));
    if (rec->meta_size > rec->raw_size || (!(rec->flags & KVP_RECORD_ZSTD) && rec->stored_size != rec->raw_size))
        return kvp_err_set(err, KVP_EFORMAT, "%s: record %llu (%s) at offset %llu: inconsistent sizes", name,
                           (unsigned long long)r->index, kname, (unsigned long long)off);

    /* A skimmed record (mapped input): header, sizes and padding checked,
     * the payload neither read nor checksummed. */
    int skim = in->map && rec->kind < 32 && (r->skim >> rec->kind & 1) && rec->kind != KVP_KIND_END;
    /* The stored payload: in place when mapped, else read into our buffer. */
    const uint8_t *stored;
    if (in->map) {
        stored = in->map + in->pos;
        in->pos += rec->stored_size;
    } else {
        int rc = read_payload(r, rec->stored_size, off, kname, err);
        if (rc)
            return rc;
        stored = r->buf;
    }
    /* Padding must be zero, so every byte of the stream is checked. */
    uint8_t pad[KVP_ALIGN];
    size_t npad = (size_t)(padded - rec->stored_size);
    if (npad) {
        int64_t g = kvp_in_read(in, pad, npad, err);
        if (g < 0)
            return (int)g;
        if ((size_t)g < npad)
            return kvp_err_set(err, KVP_ETRUNC, "%s: record %llu (%s) at offset %llu: padding cut short at offset %llu",
                               name, (unsigned long long)r->index, kname, (unsigned long long)off,
                               (unsigned long long)in->pos);
        for (size_t i = 0; i < npad; i++)
            if (pad[i])
                return kvp_err_set(err, KVP_EFORMAT, "%s: record %llu (%s) at offset %llu: nonzero padding at offset %llu",
                                   name, (unsigned long long)r->index, kname, (unsigned long long)off,
                                   (unsigned long long)(in->pos - npad + i));
    }
    if (skim) {
        int rc = record_unique(r, rec, err);
        if (rc)
            return rc;
        r->index++;
        return (rc = tally(r, rec, err)) < 0 ? rc : 1;
    }
    uint32_t pcrc = kvp_crc32c(0, stored, (size_t)rec->stored_size), pstored = kvp_le32(h + RH_PCRC);
    if (CRC_BAD(pcrc, pstored))
        return kvp_err_set(err, KVP_ECHECKSUM,
                           "%s: record %llu (%s) at offset %llu: payload checksum mismatch (stored 0x%08x, computed "
                           "0x%08x)",
                           name, (unsigned long long)r->index, kname, (unsigned long long)off, pstored, pcrc);
    const uint8_t *raw = stored;
    if (rec->flags & KVP_RECORD_ZSTD) {
        int rc = decompress(r, stored, rec->stored_size, rec->raw_size, off, err);
        if (rc)
            return rc;
        raw = r->raw;
    }
    rec->meta = raw;
    int64_t bad = split_payload(rec, raw);
    if (bad)
        return kvp_err_set(err, KVP_EFORMAT, "%s: record %llu (%s) at offset %llu: %s at payload offset %llu", name,
                           (unsigned long long)r->index, kname, (unsigned long long)off,
                           bad == 1 ? "the payload ends inside the meta part's padding" : "nonzero meta padding",
                           (unsigned long long)(bad == 1 ? rec->raw_size : (uint64_t)(bad - 2)));
    int uniq = record_unique(r, rec, err);
    if (uniq)
        return uniq;
    if (rec->kind == KVP_KIND_END) {
        int rc = check_end(r, rec, err);
        if (rc)
            return rc;
        r->ended = 1;
    }
    r->index++;
    if (rec->kind != KVP_KIND_END && (uniq = tally(r, rec, err)) < 0)
        return uniq;
    return 1;
}

/* ---- typed decoders ---- */

static int bad_field(const kvp_record *rec, kvp_err *err, const char *what)
{
    return kvp_err_set(err, KVP_EFORMAT, "record %llu (%s) at offset %llu: %s", (unsigned long long)rec->index,
                       kvp_kind_name(rec->kind), (unsigned long long)rec->offset, what);
}

static int expect_kind(const kvp_record *rec, uint32_t kind, kvp_err *err)
{
    if (rec->kind != kind)
        return kvp_err_set(err, KVP_EINVAL, "record %llu is a %s record, not %s", (unsigned long long)rec->index,
                           kvp_kind_name(rec->kind), kvp_kind_name(kind));
    return 0;
}

int kvp_meta_record_decode(const kvp_record *rec, kvp_meta *m, kvp_err *err)
{
    if (rec->kind != KVP_KIND_CONFIG && rec->kind != KVP_KIND_TOKENIZER)
        return expect_kind(rec, KVP_KIND_CONFIG, err);
    if (rec->data_size) { /* kvp(5): the metadata list is all of it */
        char what[96];
        snprintf(what, sizeof what, "a data part of %llu bytes (a %s record's is empty)",
                 (unsigned long long)rec->data_size, kvp_kind_name(rec->kind));
        kvp_meta_init(m);
        return bad_field(rec, err, what);
    }
    int rc = kvp_meta_decode(m, rec->meta, rec->meta_size, err);
    if (rc)
        kvp_err_prefix(err, "record %llu (%s) at offset %llu", (unsigned long long)rec->index,
                       kvp_kind_name(rec->kind), (unsigned long long)rec->offset);
    return rc;
}

/* Locate a 64-aligned section [off, off+n) of the data part; NULL if outside. */
static const uint8_t *section(const kvp_record *rec, uint64_t off, uint64_t n)
{
    if (n == 0)
        return NULL;
    if (off > rec->data_size || n > rec->data_size - off)
        return NULL;
    return rec->data + off;
}

int kvp_tensor_decode(const kvp_record *rec, kvp_tensor_rec *t, const uint8_t **data, const uint8_t **scales,
                      const uint8_t **zeros, kvp_err *err)
{
    int rc = expect_kind(rec, KVP_KIND_TENSOR, err);
    if (rc)
        return rc;
    memset(t, 0, sizeof *t);
    kvp_cur c = kvp_cur_make(rec->meta, rec->meta_size);
    uint32_t name_len;
    const char *name = kvp_cur_str32(&c, &name_len, KVP_NAME_MAX);
    if (!name || name_len == 0)
        return bad_field(rec, err, "tensor name missing, empty or longer than 255 bytes");
    const char *nf = name_fault(name, name_len);
    if (nf)
        return kvp_err_set(err, KVP_EFORMAT, "record %llu (tensor) at offset %llu: its name %s", (unsigned long long)rec->index,
                           (unsigned long long)rec->offset, nf);
    memcpy(t->name, name, name_len);
    t->dtype = kvp_cur_u32(&c);
    t->n_dim = kvp_cur_u32(&c);
    if (c.bad || t->n_dim < 1 || t->n_dim > KVP_MAX_DIMS)
        return kvp_err_set(err, KVP_EFORMAT, "record %llu (tensor %s) at offset %llu: n_dim %u is not 1..4",
                           (unsigned long long)rec->index, t->name, (unsigned long long)rec->offset, t->n_dim);
    for (uint32_t i = 0; i < t->n_dim; i++)
        t->shape[i] = kvp_cur_u64(&c);
    t->scheme = kvp_cur_u32(&c);
    t->group = kvp_cur_u32(&c);
    t->scale_dtype = kvp_cur_u32(&c);
    t->flags = kvp_cur_u32(&c);
    t->global_scale = kvp_cur_f32(&c);
    t->data_bytes = kvp_cur_u64(&c);
    t->scales_bytes = kvp_cur_u64(&c);
    t->zeros_bytes = kvp_cur_u64(&c);
    const char *why = NULL;
    int64_t want = kvp_tensor_data_bytes(t), nsc = kvp_tensor_scale_count(t);
    char left[64];
    if (c.bad)
        why = "meta cut short";
    else if (c.left) /* kvp(5) defines no field after the sizes */
        why = (snprintf(left, sizeof left, "%zu bytes after the meta part's last field", c.left), left);
    else if (!kvp_dtype_get(t->dtype))
        why = "unknown dtype";
    else if (want < 0)
        why = "shape is empty, overflows or does not fit whole blocks of its dtype";
    else if ((uint64_t)want != t->data_bytes)
        why = "data_bytes does not match dtype and shape";
    else if (nsc < 0)
        why = "unknown scheme or group does not divide the last dimension";
    else if (nsc > 0 && !kvp_dtype_get(t->scale_dtype))
        why = "unknown scale dtype";
    else if (scale_bytes(t->scale_dtype, nsc) != (int64_t)t->scales_bytes)
        why = "scales_bytes does not match the scheme";
    else if ((t->flags & KVP_TENSOR_ASYM) ? t->zeros_bytes != t->scales_bytes : t->zeros_bytes != 0)
        why = "zeros_bytes inconsistent with the asymmetric flag";
    else if (t->flags & ~(uint32_t)KVP_TENSOR_ASYM)
        why = "unknown flags";
    else if ((t->flags & KVP_TENSOR_ASYM) && t->dtype != KVP_DTYPE_I8 && t->dtype != KVP_DTYPE_I4)
        why = "the asymmetric flag on a dtype other than i8 and i4 (kvp(5): only they have zero points)";
    else if (!(t->global_scale > 0.0f && t->global_scale <= 3.4028235e38f))
        why = "global scale is not a positive finite number";
    else if (t->dtype != KVP_DTYPE_NVFP4 && t->global_scale != 1.0f)
        why = "global scale is not 1.0 (only nvfp4 has one)";
    if (why)
        return kvp_err_set(err, KVP_EFORMAT, "record %llu (tensor %s) at offset %llu: %s", (unsigned long long)rec->index,
                           t->name, (unsigned long long)rec->offset, why);
    uint64_t soff = kvp_align_up(t->data_bytes, KVP_ALIGN), zoff = soff + kvp_align_up(t->scales_bytes, KVP_ALIGN);
    const uint8_t *d = section(rec, 0, t->data_bytes);
    const uint8_t *s = section(rec, soff, t->scales_bytes);
    const uint8_t *z = section(rec, zoff, t->zeros_bytes);
    uint64_t end = t->zeros_bytes ? zoff + t->zeros_bytes : t->scales_bytes ? soff + t->scales_bytes : t->data_bytes;
    if (!d || (t->scales_bytes && !s) || (t->zeros_bytes && !z) || end != rec->data_size)
        return kvp_err_set(err, KVP_EFORMAT,
                           "record %llu (tensor %s) at offset %llu: payload holds %llu data bytes, tensor needs %llu",
                           (unsigned long long)rec->index, t->name, (unsigned long long)rec->offset,
                           (unsigned long long)rec->data_size, (unsigned long long)end);
    if (data)
        *data = d;
    if (scales)
        *scales = s;
    if (zeros)
        *zeros = z;
    return 0;
}

/* The stop strings at c (the record's last field): each checked, and
 * copied into *stop when stop is not NULL. */
static int seq_stops_parse(const kvp_record *rec, kvp_cur *c, uint32_t n, char ***stop, kvp_err *err)
{
    if (n > KVP_STOP_MAX_N)
        return bad_field(rec, err, "more stop strings than a record carries (64)");
    char **v = NULL;
    if (stop && n && !(v = calloc(n, sizeof *v)))
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    for (uint32_t k = 0; k < n; k++) {
        uint32_t len;
        const char *str = kvp_cur_str32(c, &len, KVP_STOP_MAX_LEN);
        int rc = 0;
        if (!str)
            rc = bad_field(rec, err, "stop string cut short or longer than 4096 bytes");
        else if (memchr(str, 0, len))
            rc = bad_field(rec, err, "stop string with a NUL byte");
        else if (v && !(v[k] = strndup(str, len)))
            rc = kvp_err_set(err, KVP_ENOMEM, "out of memory");
        if (rc) {
            kvp_seq_stops_free(v, n);
            return rc;
        }
    }
    if (stop)
        *stop = v;
    return 0;
}

void kvp_seq_stops_free(char **stop, size_t n)
{
    for (size_t k = 0; stop && k < n; k++)
        free(stop[k]);
    free(stop);
}

/* A sequence record's fields into *s, and its stop strings into *stop
 * when stop is not NULL. */
static int seq_parse(const kvp_record *rec, kvp_seq_rec *s, const uint32_t **tokens, char ***stop, kvp_err *err)
{
    int rc = expect_kind(rec, KVP_KIND_SEQUENCE, err);
    if (rc)
        return rc;
    memset(s, 0, sizeof *s);
    kvp_cur c = kvp_cur_make(rec->meta, rec->meta_size);
    s->id = kvp_cur_u64(&c);
    uint32_t label_len;
    const char *label = kvp_cur_str32(&c, &label_len, KVP_NAME_MAX);
    if (label)
        memcpy(s->label, label, label_len);
    s->state = kvp_cur_u32(&c);
    s->finish_reason = kvp_cur_u32(&c);
    s->n_prompt = kvp_cur_u32(&c);
    s->n_tokens = kvp_cur_u32(&c);
    s->next_token = (int32_t)kvp_cur_u32(&c);
    s->block_size = kvp_cur_u32(&c);
    kvp_sampling *sp = &s->sampling;
    sp->temperature = kvp_cur_f32(&c);
    sp->top_k = (int32_t)kvp_cur_u32(&c);
    sp->top_p = kvp_cur_f32(&c);
    sp->min_p = kvp_cur_f32(&c);
    sp->repeat_penalty = kvp_cur_f32(&c);
    sp->max_tokens = kvp_cur_u32(&c);
    sp->seed = kvp_cur_u64(&c);
    sp->rng[0] = kvp_cur_u64(&c);
    sp->rng[1] = kvp_cur_u64(&c);
    if (c.bad)
        return bad_field(rec, err, "sequence meta cut short or label longer than 255 bytes");
    /* kvp(5): the fields that came later come whole or not at all (a
     * record that ends inside one was cut, and what it held is lost) */
    char what[KVP_ERR_MSG_MAX];
    if (c.left && c.left < 16) {
        snprintf(what, sizeof what, "sequence meta ends %zu bytes into its times (arrival, first token: 16 bytes)",
                 c.left);
        return bad_field(rec, err, what);
    }
    if (c.left >= 16) { /* the times came later: older streams end before them */
        s->arrival_ns = kvp_cur_u64(&c);
        s->first_ns = kvp_cur_u64(&c);
    }
    if (seq_bad_fields(s, what, sizeof what))
        return bad_field(rec, err, what);
    if (s->n_prompt > s->n_tokens)
        return bad_field(rec, err, "n_prompt exceeds n_tokens");
    if (rec->data_size != (uint64_t)s->n_tokens * 4)
        return bad_field(rec, err, "token data does not match n_tokens");
    if (c.left && c.left < 12) {
        snprintf(what, sizeof what, "sequence meta ends %zu bytes into its cache salt and stop count (12 bytes)",
                 c.left);
        return bad_field(rec, err, what);
    }
    if (c.left >= 12) { /* then the request's salt and stop strings */
        s->cache_salt = kvp_cur_u64(&c);
        s->n_stop = kvp_cur_u32(&c);
        if ((rc = seq_stops_parse(rec, &c, s->n_stop, stop, err)) < 0)
            return rc;
        if (c.left >= 4) /* then the flags, which bring the salt and stops part with them */
            s->flags = kvp_cur_u32(&c);
        else if (c.left) {
            snprintf(what, sizeof what, "sequence meta ends %zu bytes into its flags (4 bytes)", c.left);
            rc = bad_field(rec, err, what);
        }
        /* bytes after the flags are a later version's fields: ignored */
    }
    /* a stream is untrusted: an integer id is printed bare, so its label
     * must be digits, and a flag we do not know is not ours to ignore */
    if (s->flags & ~KVP_SEQ_FLAGS_KNOWN) {
        snprintf(what, sizeof what, "unknown sequence flags 0x%x", s->flags & ~KVP_SEQ_FLAGS_KNOWN);
        rc = bad_field(rec, err, what);
    } else if ((s->flags & KVP_SEQ_LABEL_INT) && !int64_digits(s->label, label_len)) {
        rc = bad_field(rec, err, "an integer id (flag LABEL_INT) whose label is not an int64's digits");
    }
    if (rc < 0) {
        if (stop) {
            kvp_seq_stops_free(*stop, s->n_stop);
            *stop = NULL;
        }
        return rc;
    }
    if (tokens)
        *tokens = s->n_tokens ? (const uint32_t *)(const void *)rec->data : NULL;
    return 0;
}

int kvp_seq_decode(const kvp_record *rec, kvp_seq_rec *s, const uint32_t **tokens, kvp_err *err)
{
    return seq_parse(rec, s, tokens, NULL, err);
}

int kvp_seq_stops(const kvp_record *rec, char ***stop, size_t *n, kvp_err *err)
{
    kvp_seq_rec s;
    *stop = NULL;
    *n = 0;
    int rc = seq_parse(rec, &s, NULL, stop, err);
    if (rc == 0)
        *n = s.n_stop;
    return rc;
}

/* kvp(5): every f32 scale of a filled slot (all of them, one a head) is a
 * positive finite number; a slot past n_tokens is unspecified.  The first
 * other one is named by its index in the record's scale order. */
static int kvblock_check_scales(const kvp_record *rec, const kvp_kvblock_rec *b, const uint8_t *sc, kvp_err *err)
{
    if (b->scale_dtype != KVP_DTYPE_F32)
        return 0;
    int per_slot = kvp_kvblock_scales_per_slot(b) == 1;
    uint64_t n = b->scales_bytes / 4;
    for (uint64_t i = 0; i < n; i++) {
        if (per_slot && i % b->block_size >= b->n_tokens)
            continue;
        float f;
        memcpy(&f, sc + 4 * i, 4);
        if (!(f > 0.0f && f <= 3.4028235e38f)) {
            char what[96];
            snprintf(what, sizeof what, "scale %llu is %g (not a positive finite number)", (unsigned long long)i,
                     (double)f);
            return bad_field(rec, err, what);
        }
    }
    return 0;
}

int kvp_kvblock_decode(const kvp_record *rec, kvp_kvblock_rec *b, const uint8_t **tokens_le, const uint8_t **data,
                       const uint8_t **scales, kvp_err *err)
{
    int rc = expect_kind(rec, KVP_KIND_KV_BLOCK, err);
    if (rc)
        return rc;
    memset(b, 0, sizeof *b);
    kvp_cur c = kvp_cur_make(rec->meta, rec->meta_size);
    b->seq_id = kvp_cur_u64(&c);
    b->block_index = kvp_cur_u32(&c);
    b->block_size = kvp_cur_u32(&c);
    b->n_tokens = kvp_cur_u32(&c);
    b->layer_begin = kvp_cur_u32(&c);
    b->layer_end = kvp_cur_u32(&c);
    b->n_head_kv = kvp_cur_u32(&c);
    b->head_dim = kvp_cur_u32(&c);
    b->dtype = kvp_cur_u32(&c);
    b->scale_dtype = kvp_cur_u32(&c);
    b->parent_hash = kvp_cur_u64(&c);
    b->hash = kvp_cur_u64(&c);
    b->data_bytes = kvp_cur_u64(&c);
    b->scales_bytes = kvp_cur_u64(&c);
    if (c.bad)
        return bad_field(rec, err, "KV block meta cut short");
    if (b->n_tokens == 0 || b->n_tokens > b->block_size)
        return bad_field(rec, err, "n_tokens is 0 or exceeds block_size");
    const uint8_t *tok = kvp_cur_take(&c, (size_t)b->n_tokens * 4);
    if (!tok || c.left)
        return bad_field(rec, err, "token ids do not match n_tokens");
    /* kvp(5): a cache holds f32, f16, bf16, fp8 (e4m3) or i8 elements */
    if (b->dtype != KVP_DTYPE_F32 && b->dtype != KVP_DTYPE_F16 && b->dtype != KVP_DTYPE_BF16 &&
        b->dtype != KVP_DTYPE_FP8_E4M3 && b->dtype != KVP_DTYPE_I8) {
        char what[128];
        if (kvp_dtype_get(b->dtype))
            snprintf(what, sizeof what, "dtype %s is not a KV dtype (f32, f16, bf16, fp8_e4m3, i8)",
                     kvp_dtype_name(b->dtype));
        else
            snprintf(what, sizeof what, "dtype %u is unknown (a KV block holds f32, f16, bf16, fp8_e4m3 or i8)",
                     b->dtype);
        return bad_field(rec, err, what);
    }
    int64_t want = kvblock_data_bytes(b);
    if (want < 0 || (uint64_t)want != b->data_bytes)
        return bad_field(rec, err, "data_bytes does not match layers, heads, block size and dtype");
    char what[KVP_ERR_MSG_MAX];
    if (kvblock_scales_fault(b, what, sizeof what))
        return bad_field(rec, err, what);
    uint64_t soff = kvp_align_up(b->data_bytes, KVP_ALIGN);
    uint64_t end = b->scales_bytes ? soff + b->scales_bytes : b->data_bytes;
    if (end != rec->data_size)
        return bad_field(rec, err, "payload size does not match data_bytes and scales_bytes");
    /* The content hash is recomputed from the tokens it names. */
    uint64_t h = kvblock_hash_le(b->parent_hash, tok, b->n_tokens);
    if (CRC_BAD(h, b->hash))
        return kvp_err_set(err, KVP_ECHECKSUM,
                           "record %llu (kv_block) at offset %llu: block hash %016llx does not match its tokens "
                           "(%016llx)",
                           (unsigned long long)rec->index, (unsigned long long)rec->offset, (unsigned long long)b->hash,
                           (unsigned long long)h);
    if (b->scales_bytes && rec->data && (rc = kvblock_check_scales(rec, b, rec->data + soff, err)) < 0)
        return rc;
    if (tokens_le)
        *tokens_le = tok;
    if (data)
        *data = rec->data;
    if (scales)
        *scales = b->scales_bytes ? rec->data + soff : NULL;
    return 0;
}

int kvp_blockref_decode(const kvp_record *rec, kvp_blockref_rec *r, kvp_err *err)
{
    int rc = expect_kind(rec, KVP_KIND_BLOCK_REF, err);
    if (rc)
        return rc;
    kvp_cur c = kvp_cur_make(rec->meta, rec->meta_size);
    r->seq_id = kvp_cur_u64(&c);
    r->block_index = kvp_cur_u32(&c);
    r->n_tokens = kvp_cur_u32(&c);
    r->parent_hash = kvp_cur_u64(&c);
    r->hash = kvp_cur_u64(&c);
    if (c.bad || c.left || rec->data_size)
        return bad_field(rec, err, "block reference has the wrong size");
    return 0;
}

int kvp_stop_decode(const kvp_record *rec, kvp_stop_rec *s, kvp_err *err)
{
    int rc = expect_kind(rec, KVP_KIND_STOP, err);
    if (rc)
        return rc;
    kvp_cur c = kvp_cur_make(rec->meta, rec->meta_size);
    s->signal = kvp_cur_u32(&c);
    s->flags = kvp_cur_u32(&c);
    s->written = kvp_cur_u64(&c);
    s->left = kvp_cur_u64(&c);
    if (c.bad || c.left || rec->data_size)
        return bad_field(rec, err, "stop record has the wrong size");
    const char *bad = stop_fields_bad(s);
    return bad ? bad_field(rec, err, bad) : 0;
}

int kvp_end_decode(const kvp_record *rec, kvp_end_rec *e, kvp_err *err)
{
    int rc = expect_kind(rec, KVP_KIND_END, err);
    if (rc)
        return rc;
    memset(e, 0, sizeof *e);
    kvp_cur c = kvp_cur_make(rec->meta, rec->meta_size);
    e->n_records = kvp_cur_u64(&c);
    e->raw_bytes = kvp_cur_u64(&c);
    uint32_t nk = kvp_cur_u32(&c);
    char what[160];
    if (c.bad)
        return bad_field(rec, err, "end record cut short before its counter count");
    /* kvp(5): one counter a kind, 16 in this version; a later minor
     * version may add its kinds' (a reader checks those it is given), but
     * no stream leaves out one of kinds 0..15 */
    if (nk < KVP_KIND_COUNT || nk > KVP_END_COUNTS_MAX) {
        snprintf(what, sizeof what, "%u kind counters (kvp(5): 16, one for each of kinds 0..15, or more from a "
                 "later version, at most %u)", nk, KVP_END_COUNTS_MAX);
        return bad_field(rec, err, what);
    }
    e->n_counts = nk;
    e->counts_le = rec->meta + 20;
    for (uint32_t k = 0; k < nk; k++) {
        uint64_t v = kvp_cur_u64(&c);
        if (k < KVP_KIND_COUNT)
            e->count[k] = v;
    }
    if (c.bad || c.left || rec->data_size) {
        snprintf(what, sizeof what, "end record has the wrong size (meta %u bytes, data %llu; %u counters make "
                 "meta %llu, data 0)", rec->meta_size, (unsigned long long)rec->data_size, nk,
                 20 + 8 * (unsigned long long)nk);
        return bad_field(rec, err, what);
    }
    return 0;
}
