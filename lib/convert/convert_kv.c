/* convert_kv.c - convert the KV blocks of a KVP stream to another dtype and
 * pass every other record through (quantize --kv). */
#include "convert.h"
#include "quant_kv.h"

#include <stdlib.h>
#include <string.h>

typedef struct kv_bufs {
    uint32_t *tokens;
    size_t tok_cap;    /* elements */
    uint8_t *out;      /* data then scales */
    size_t out_cap;    /* bytes */
} kv_bufs;

static int kv_grow(void **p, size_t *cap, size_t want, size_t elem)
{
    if (want <= *cap)
        return 0;
    if (want > SIZE_MAX / elem)
        return KVP_ENOMEM;
    void *n = realloc(*p, want * elem);
    if (!n)
        return KVP_ENOMEM;
    *p = n;
    *cap = want;
    return 0;
}

static int convert_block(const kvp_record *rec, uint32_t dtype, kvp_writer *w, kv_bufs *b, kvp_convert_kv_stats *st,
                         kvp_err *err)
{
    kvp_kvblock_rec src, dst;
    const uint8_t *tok_le, *data, *scales;
    int rc = kvp_kvblock_decode(rec, &src, &tok_le, &data, &scales, err);
    if (rc < 0)
        return rc;
    st->n_blocks++;
    st->bytes_in += src.data_bytes + src.scales_bytes;
    if (src.dtype == dtype) { /* already there: untouched */
        st->bytes_out += src.data_bytes + src.scales_bytes;
        kvp_piece piece = {rec->data, rec->data_size};
        return kvp_writer_record(w, rec->kind, rec->meta, rec->meta_size, &piece, 1, 0, err);
    }
    if ((rc = kvp_quant_kv_plan(&src, dtype, &dst, err)) < 0)
        return rc;
    uint64_t d = kvp_align_up(dst.data_bytes, KVP_ALIGN), total = d + dst.scales_bytes;
    if (total > SIZE_MAX || kv_grow((void **)&b->tokens, &b->tok_cap, src.n_tokens ? src.n_tokens : 1, 4) < 0 ||
        kv_grow((void **)&b->out, &b->out_cap, (size_t)total, 1) < 0)
        return kvp_err_set(err, KVP_ENOMEM, "record %llu: out of memory for a KV block of %llu bytes",
                           (unsigned long long)rec->index, (unsigned long long)total);
    for (uint32_t i = 0; i < src.n_tokens; i++)
        b->tokens[i] = kvp_le32(tok_le + 4 * (size_t)i);
    uint8_t *dscales = dst.scales_bytes ? b->out + d : NULL;
    if ((rc = kvp_quant_kv_convert(&src, data, src.scales_bytes ? scales : NULL, &dst, b->out, dscales, &st->stats,
                                   err)) < 0)
        return rc;
    st->n_converted++;
    st->bytes_out += dst.data_bytes + dst.scales_bytes;
    return kvp_write_kvblock(w, &dst, b->tokens, b->out, dscales, err);
}

/* Decode a record of a known kind (so a malformed one stops us), then copy
 * its meta and data unchanged. */
static int pass_through(const kvp_record *rec, kvp_writer *w, kvp_err *err)
{
    int rc = 0;
    switch (rec->kind) {
    case KVP_KIND_CONFIG:
    case KVP_KIND_TOKENIZER: {
        kvp_meta m;
        rc = kvp_meta_record_decode(rec, &m, err);
        if (rc == 0)
            kvp_meta_free(&m);
        break;
    }
    case KVP_KIND_TENSOR: {
        kvp_tensor_rec t;
        const uint8_t *d, *s, *z;
        rc = kvp_tensor_decode(rec, &t, &d, &s, &z, err);
        break;
    }
    case KVP_KIND_SEQUENCE: {
        kvp_seq_rec sq;
        const uint32_t *tok;
        rc = kvp_seq_decode(rec, &sq, &tok, err);
        break;
    }
    case KVP_KIND_BLOCK_REF: {
        kvp_blockref_rec br;
        rc = kvp_blockref_decode(rec, &br, err);
        break;
    }
    case KVP_KIND_STOP: { /* kept: the converted stream is as cut short as its input */
        kvp_stop_rec st;
        rc = kvp_stop_decode(rec, &st, err);
        break;
    }
    default:
        break;
    }
    if (rc < 0)
        return rc;
    kvp_piece piece = {rec->data, rec->data_size};
    return kvp_writer_record(w, rec->kind, rec->meta, rec->meta_size, &piece, rec->data_size ? 1 : 0, 0, err);
}

int kvp_convert_kv_stream(kvp_in *in, kvp_out *out, uint32_t dtype, int zstd_level, const char *producer,
                          kvp_convert_kv_stats *st, kvp_err *err)
{
    kvp_convert_kv_stats local;
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    if (dtype != KVP_DTYPE_F32 && dtype != KVP_DTYPE_F16 && dtype != KVP_DTYPE_BF16 && dtype != KVP_DTYPE_FP8_E4M3 &&
        dtype != KVP_DTYPE_I8)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "KV blocks convert to f32, f16, bf16, fp8 or int8, not %s",
                           kvp_dtype_name(dtype));
    kvp_reader *r = NULL;
    kvp_writer *w = NULL;
    kv_bufs b;
    memset(&b, 0, sizeof b);
    int rc = kvp_reader_open(&r, in, err);
    if (rc < 0)
        return rc;
    kvp_writer_opts wo;
    memset(&wo, 0, sizeof wo);
    wo.zstd_level = zstd_level;
    wo.producer = producer;
    memcpy(wo.fingerprint, kvp_reader_info(r)->fingerprint, KVP_FINGERPRINT_SIZE);
    if ((rc = kvp_writer_open(&w, out, &wo, err)) < 0)
        goto out;
    kvp_record rec;
    while ((rc = kvp_reader_next(r, &rec, err)) == 1) {
        if (rec.kind == KVP_KIND_END) /* the reader checked its counts; the writer makes ours */
            continue;
        st->n_records++;
        rc = rec.kind == KVP_KIND_KV_BLOCK ? convert_block(&rec, dtype, w, &b, st, err) : pass_through(&rec, w, err);
        if (rc < 0) {
            /* a record the reader passed but whose contents are wrong: say
             * whose (the reader names its input in its own messages; the
             * writer's failures name the output) */
            if (err->code != KVP_EIO && err->code != KVP_ENOMEM && err->code != KVP_ECOMPRESS &&
                err->code != KVP_EPIPE && err->code != KVP_EINTR)
                kvp_err_prefix(err, "%s", in->name);
            break;
        }
    }
    if (rc == 0)
        rc = kvp_writer_finish(w, err);
out:
    kvp_writer_free(w);
    kvp_reader_free(r);
    free(b.tokens);
    free(b.out);
    return rc < 0 ? rc : 0;
}
