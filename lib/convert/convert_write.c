/* convert_write.c - the writing pass of a model conversion: one tensor at a
 * time from the mapped input, through one f32 buffer, into the KVP writer. */
#include "convert_impl.h"

#include "fingerprint.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Buffers reused from tensor to tensor: they grow to the largest one. */
typedef struct wbuf {
    float *x;          /* dequantized source, numel f32 */
    size_t x_cap;      /* elements */
    uint8_t *q;        /* output data | scales | zeros */
    size_t q_cap;      /* bytes */
    uint8_t *a;        /* an aligned copy of a misaligned source */
    size_t a_cap;
} wbuf;

static int grow(void **p, size_t *cap, size_t want, size_t elem)
{
    if (want <= *cap)
        return 0;
    if (want > SIZE_MAX / elem)
        return KVP_ENOMEM;
    void *n = malloc(want * elem); /* no realloc: the old contents are not needed */
    if (!n)
        return KVP_ENOMEM;
    free(*p);
    *p = n;
    *cap = want;
    return 0;
}

/* The source sections of one tensor. */
typedef struct src_view {
    const uint8_t *data, *scales, *zeros;
} src_view;

/* A source tensor's data, aligned for the row converters (safetensors data
 * offsets need not be). */
static int aligned_src(wbuf *b, const void *p, uint64_t n, const uint8_t **out)
{
    if (((uintptr_t)p & 15) == 0) {
        *out = p;
        return 0;
    }
    if (n > SIZE_MAX || grow((void **)&b->a, &b->a_cap, (size_t)n, 1) < 0)
        return KVP_ENOMEM;
    memcpy(b->a, p, (size_t)n);
    *out = b->a;
    return 0;
}

/* Element i's coordinates in t (outermost first), as "1, 30". */
static void coords(const kvp_tensor_rec *t, uint64_t i, char *at, size_t n)
{
    size_t used = 0;
    uint64_t rest = i, stride = kvp_tensor_numel(t);
    at[0] = '\0';
    for (uint32_t d = 0; d < t->n_dim && used < n; d++) {
        stride /= t->shape[d];
        used += (size_t)snprintf(at + used, n - used, "%s%llu", d ? ", " : "", (unsigned long long)(rest / stride));
        rest %= stride;
    }
}

/* Refuse a tensor holding a NaN or an infinity, naming the first one by its
 * index in storage order and its coordinates (outermost first): quantized,
 * such a value becomes a code of 0, a clipped maximum or a NaN scale that no
 * error figure can measure, and a model that computes garbage. */
static int check_finite(const char *path, const kvp_tensor_rec *t, const float *x, uint64_t numel, kvp_err *err)
{
    uint64_t i = 0;
    while (i < numel && isfinite(x[i]))
        i++;
    if (i == numel)
        return 0;
    char at[160];
    coords(t, i, at, sizeof at);
    return kvp_err_set(err, KVP_EFORMAT, "%s: tensor %s: element %llu [%s] is %s (weights must be finite numbers)",
                       path, t->name, (unsigned long long)i, at, isnan(x[i]) ? "NaN" : x[i] > 0 ? "+inf" : "-inf");
}

/* Refuse a quantized tensor whose reconstruction came back infinite or
 * NaN: finite values the output cannot hold (f16 past 65504, a q4_0 block
 * whose scale passes f16's).  The element named is the largest of the
 * first bad element's block (the dtype's block: the element itself for
 * plain and scaled types), the value that overflowed rather than a 0 its
 * block's infinite scale made NaN; without the memory to find it, the
 * tensor alone. */
static int refuse_overflow(const char *path, const kvp_tensor_rec *t, const float *x, const uint8_t *data,
                           const uint8_t *scales, const uint8_t *zeros, kvp_threadpool *pool, kvp_err *err)
{
    const kvp_dtype_traits *tr = kvp_dtype_get(t->dtype);
    uint64_t numel = kvp_tensor_numel(t), i = 0;
    float *y = numel <= SIZE_MAX / sizeof *y ? malloc((size_t)numel * sizeof *y) : NULL;
    kvp_err e2 = {0};
    if (y && kvp_dequant_tensor(t, data, scales, zeros, y, pool, &e2) == 0)
        while (i < numel && isfinite(y[i]))
            i++;
    else
        i = numel;
    free(y);
    if (i == numel)
        return kvp_err_set(err, KVP_EUNSUPPORTED,
                           "%s: tensor %s: values beyond the range of %s (they would be written as infinities): "
                           "keep it in a wider type (--exclude '%s', or --to f32 or bf16)",
                           path, t->name, kvp_dtype_name(t->dtype), t->name);
    uint64_t blk = tr && tr->is_quantized ? (uint64_t)tr->block_size : 1, a = i / blk * blk;
    for (uint64_t j = a; j < a + blk && j < numel; j++)
        i = fabsf(x[j]) > fabsf(x[i]) ? j : i;
    char at[160];
    coords(t, i, at, sizeof at);
    return kvp_err_set(err, KVP_EUNSUPPORTED,
                       "%s: tensor %s: element %llu [%s] (%g) is beyond the range of %s (it would be written as an "
                       "infinity or NaN): keep it in a wider type (--exclude '%s', or --to f32 or bf16)",
                       path, t->name, (unsigned long long)i, at, (double)x[i], kvp_dtype_name(t->dtype), t->name);
}

/* The source's values as f32 in b->x, checked finite. */
static int dequant_checked(const char *path, const kvp_convert_item *it, const src_view *sv, wbuf *b,
                           kvp_threadpool *pool, kvp_err *err)
{
    uint64_t numel = kvp_tensor_numel(&it->src);
    if (numel > SIZE_MAX / sizeof(float) || grow((void **)&b->x, &b->x_cap, numel, 4) < 0)
        return kvp_err_set(err, KVP_ENOMEM, "tensor %s: out of memory for %llu elements", it->src.name,
                           (unsigned long long)numel);
    int rc = kvp_dequant_tensor(&it->src, sv->data, sv->scales, sv->zeros, b->x, pool, err);
    return rc < 0 ? rc : check_finite(path, &it->src, b->x, numel, err);
}

static int quant_one(const char *path, kvp_convert_item *it, const src_view *sv, wbuf *b, kvp_writer *w,
                     kvp_threadpool *pool, kvp_err *err)
{
    uint64_t d = kvp_align_up(it->out.data_bytes, KVP_ALIGN), s = kvp_align_up(it->out.scales_bytes, KVP_ALIGN);
    uint64_t total = d + s + it->out.zeros_bytes;
    if (total > SIZE_MAX || grow((void **)&b->q, &b->q_cap, total ? total : 1, 1) < 0)
        return kvp_err_set(err, KVP_ENOMEM, "tensor %s: out of memory for %llu bytes", it->src.name,
                           (unsigned long long)total);
    int rc = dequant_checked(path, it, sv, b, pool, err);
    if (rc < 0)
        return rc;
    uint8_t *scales = it->out.scales_bytes ? b->q + d : NULL, *zeros = it->out.zeros_bytes ? b->q + d + s : NULL;
    memset(&it->stats, 0, sizeof it->stats);
    if ((rc = kvp_quant_tensor(&it->out, b->x, b->q, scales, zeros, &it->stats, pool, err)) < 0)
        return rc;
    /* finite values the output cannot hold (f16 past 65504, a block scale
     * past its f16) come back infinite: refused, as a source's infinity
     * is, rather than written (the stats measure the reconstruction) */
    if (!isfinite(it->stats.max_abs_err) || !isfinite(it->stats.sum_sq_err))
        return refuse_overflow(path, &it->out, b->x, b->q, scales, zeros, pool, err);
    return kvp_write_tensor(w, &it->out, b->q, scales, zeros, err);
}

/* One planned tensor into w.  A copied one is read as f32 too, when its
 * type can be, so that no tensor written carries a NaN or an infinity. */
static int write_one(const char *path, kvp_convert_item *it, const src_view *sv, wbuf *b, kvp_writer *w,
                     kvp_threadpool *pool, kvp_err *err)
{
    if (it->action == KVP_CONVERT_DROP)
        return 0;
    if (it->action == KVP_CONVERT_QUANT)
        return quant_one(path, it, sv, b, w, pool, err);
    const kvp_dtype_traits *tr = kvp_dtype_get(it->src.dtype);
    int rc = tr && tr->to_f32 ? dequant_checked(path, it, sv, b, pool, err) : 0;
    return rc < 0 ? rc : kvp_write_tensor(w, &it->out, sv->data, sv->scales, sv->zeros, err);
}

/* GGUF and safetensors: tensors are used in place in the mapping. */
static int write_mapped(kvp_convert *cv, kvp_writer *w, wbuf *b, kvp_threadpool *pool, kvp_convert_fn fn, void *ctx,
                        kvp_err *err)
{
    for (size_t i = 0; i < cv->n_items; i++) {
        kvp_convert_item *it = &cv->items[i];
        const void *p;
        src_view sv = {NULL, NULL, NULL};
        if (cv->format == KVP_CONVERT_GGUF) {
            p = kvp_gguf_tensor_data(&cv->gguf, &cv->gguf.tensors[cv->src_index[i]]);
        } else if (cv->src_hfq && cv->src_hfq[i] >= 0) { /* a quantized layer's weight (hfquant.h) */
            const kvp_hfq_tensor *q = &cv->hfq.t[cv->src_hfq[i]];
            p = q->data, sv.scales = q->scales, sv.zeros = q->zeros;
        } else {
            p = cv->st.tensors[cv->src_index[i]].data;
        }
        int rc = 0;
        if (it->action != KVP_CONVERT_DROP && aligned_src(b, p, it->src.data_bytes, &sv.data) < 0)
            rc = kvp_err_set(err, KVP_ENOMEM, "tensor %s: out of memory", it->src.name);
        if (!rc)
            rc = write_one(cv->path, it, &sv, b, w, pool, err);
        if (!rc && fn)
            rc = fn(ctx, it, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* KVP input: read the stream again; its tensors come in plan order. */
static int write_from_kvp(kvp_convert *cv, kvp_writer *w, wbuf *b, kvp_threadpool *pool, kvp_convert_fn fn,
                          void *ctx, kvp_err *err)
{
    kvp_in in;
    int rc = kvp_in_open(&in, cv->path, err);
    if (rc < 0)
        return rc;
    kvp_reader *r = NULL;
    size_t i = 0;
    if ((rc = kvp_reader_open(&r, &in, err)) < 0)
        goto out;
    kvp_record rec;
    while ((rc = kvp_reader_next(r, &rec, err)) == 1) {
        if (rec.kind != KVP_KIND_TENSOR)
            continue;
        kvp_tensor_rec t;
        src_view sv;
        if ((rc = kvp_tensor_decode(&rec, &t, &sv.data, &sv.scales, &sv.zeros, err)) < 0)
            break;
        if (i >= cv->n_items || strcmp(t.name, cv->items[i].src.name) != 0) {
            rc = kvp_err_set(err, KVP_EMISMATCH, "%s: record %llu: tensor %s changed since it was planned", cv->path,
                             (unsigned long long)rec.index, t.name);
            break;
        }
        kvp_convert_item *it = &cv->items[i++];
        if ((rc = write_one(cv->path, it, &sv, b, w, pool, err)) < 0 || (fn && (rc = fn(ctx, it, err)) < 0))
            break;
    }
    if (rc == 0 && i != cv->n_items)
        rc = kvp_err_set(err, KVP_EMISMATCH, "%s: %zu tensors read, %zu planned", cv->path, i, cv->n_items);
out:
    kvp_reader_free(r);
    kvp_in_close(&in);
    return rc < 0 ? kvp_convert_name_file(cv->path, err) : 0;
}

int kvp_convert_write(kvp_convert *cv, kvp_out *out, int zstd_level, const char *producer, kvp_threadpool *pool,
                      kvp_convert_fn fn, void *ctx, kvp_err *err)
{
    if (!cv->planned)
        return kvp_err_set(err, KVP_EINVAL, "%s: kvp_convert_write with no plan (none made, or the last one failed)",
                           cv->path);
    kvp_writer_opts wo;
    memset(&wo, 0, sizeof wo);
    wo.zstd_level = zstd_level;
    wo.producer = producer;
    kvp_convert_fingerprint(cv, wo.fingerprint);
    kvp_writer *w = NULL;
    wbuf b;
    memset(&b, 0, sizeof b);
    int rc = kvp_writer_open(&w, out, &wo, err);
    if (!rc && !cv->bare)
        rc = kvp_write_meta(w, KVP_KIND_CONFIG, &cv->config_meta, err);
    if (!rc && cv->tok_meta.n)
        rc = kvp_write_meta(w, KVP_KIND_TOKENIZER, &cv->tok_meta, err);
    if (!rc)
        rc = cv->format == KVP_CONVERT_KVP ? write_from_kvp(cv, w, &b, pool, fn, ctx, err)
                                           : write_mapped(cv, w, &b, pool, fn, ctx, err);
    if (!rc)
        rc = kvp_writer_finish(w, err);
    kvp_writer_free(w);
    free(b.x);
    free(b.q);
    free(b.a);
    return rc;
}

/* ---- totals ---- */

/* Bytes of a record in the stream: header, meta padded, data sections each
 * padded (kvp(5)). */
static uint64_t record_bytes(uint64_t meta_len, const uint64_t *sections, int n)
{
    uint64_t b = KVP_RECORD_HEADER_SIZE + kvp_align_up(meta_len, KVP_ALIGN);
    for (int i = 0; i < n; i++)
        b += kvp_align_up(sections[i], KVP_ALIGN);
    return b;
}

static uint64_t meta_record_bytes(const kvp_meta *m)
{
    kvp_buf b;
    kvp_buf_init(&b);
    kvp_meta_encode(m, &b);
    uint64_t n = record_bytes(b.len, NULL, 0);
    kvp_buf_free(&b);
    return n;
}

static uint64_t tensor_record_bytes(const kvp_tensor_rec *t)
{
    /* name, dtype, n_dim, shape, scheme, group, scale dtype, flags, global scale, three sizes */
    uint64_t meta = 4 + strlen(t->name) + 4 + 4 + 8ull * t->n_dim + 4 * 4 + 4 + 3 * 8;
    uint64_t sec[3] = {t->data_bytes, t->scales_bytes, t->zeros_bytes};
    return record_bytes(meta, sec, 3);
}

void kvp_convert_totals_get(const kvp_convert *cv, kvp_convert_totals *t)
{
    memset(t, 0, sizeof *t);
    t->file_bytes = KVP_HEADER_SIZE + (cv->bare ? 0 : meta_record_bytes(&cv->config_meta));
    if (cv->tok_meta.n)
        t->file_bytes += meta_record_bytes(&cv->tok_meta);
    for (size_t i = 0; i < cv->n_items; i++) {
        const kvp_convert_item *it = &cv->items[i];
        t->n_read++;
        t->bytes_in += kvp_convert_rec_bytes(&it->src);
        if (it->action == KVP_CONVERT_DROP) {
            t->n_dropped++;
            continue;
        }
        t->n_tensors++;
        t->n_fallback += it->note[0] != '\0';
        t->bytes_out += kvp_convert_rec_bytes(&it->out);
        t->file_bytes += tensor_record_bytes(&it->out);
        if (it->action == KVP_CONVERT_QUANT) {
            t->n_quantized++;
            kvp_quant_stats_merge(&t->stats, &it->stats);
        }
    }
    /* END: n_records, raw bytes, kind count, counts by kind */
    t->file_bytes += record_bytes(8 + 8 + 4 + 8 * KVP_KIND_COUNT, NULL, 0);
}
