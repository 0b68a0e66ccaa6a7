/* quant_kv.c - converting KV block payloads between element dtypes (see
 * quant_kv.h).  A payload is a list of "slabs", one per (layer, K/V, head), each
 * block_size x head_dim elements of which the first n_tokens x head_dim are
 * filled; fp8 and int8 slabs each carry one f32 scale. */
#include "quant_kv.h"
#include "kvscale.h"
#include "wire.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define KV_MAX_BYTES (UINT64_C(1) << 40) /* sanity ceiling for one block's payload */

static int kv_scaled(uint32_t dtype) { return kvp_kvscale_dtype((int)dtype); }

static int kv_dtype_ok(uint32_t dtype)
{
    return dtype == KVP_DTYPE_F32 || dtype == KVP_DTYPE_F16 || dtype == KVP_DTYPE_BF16 || kv_scaled(dtype);
}

/* Slab count and elements per slab of b, or a negative code. */
static int kv_shape(const kvp_kvblock_rec *b, uint64_t *slabs, uint64_t *slab_len, kvp_err *err)
{
    if (b->layer_end <= b->layer_begin)
        return kvp_err_set(err, KVP_EFORMAT, "kv block %u of sequence %llu: layers [%u, %u) empty", b->block_index,
                           (unsigned long long)b->seq_id, b->layer_begin, b->layer_end);
    if (b->n_tokens > b->block_size || b->n_head_kv == 0 || b->head_dim == 0 || b->block_size == 0)
        return kvp_err_set(err, KVP_EFORMAT,
                           "kv block %u of sequence %llu: n_tokens %u, block_size %u, n_head_kv %u, head_dim %u "
                           "out of range",
                           b->block_index, (unsigned long long)b->seq_id, b->n_tokens, b->block_size, b->n_head_kv,
                           b->head_dim);
    *slabs = (uint64_t)(b->layer_end - b->layer_begin) * 2 * b->n_head_kv;
    *slab_len = (uint64_t)b->block_size * b->head_dim;
    if (*slabs * *slab_len > KV_MAX_BYTES / 4)
        return kvp_err_set(err, KVP_ELIMIT, "kv block %u of sequence %llu: payload too large", b->block_index,
                           (unsigned long long)b->seq_id);
    return 0;
}

int kvp_quant_kv_plan(const kvp_kvblock_rec *src, uint32_t dtype, kvp_kvblock_rec *dst, kvp_err *err)
{
    uint64_t slabs, len;
    int rc = kv_shape(src, &slabs, &len, err);
    if (rc < 0)
        return rc;
    if (!kv_dtype_ok(dtype) || !kv_dtype_ok(src->dtype))
        return kvp_err_set(err, KVP_EUNSUPPORTED, "kv block %u of sequence %llu: cannot convert %s to %s",
                           src->block_index, (unsigned long long)src->seq_id, kvp_dtype_name(src->dtype),
                           kvp_dtype_name(dtype));
    *dst = *src;
    dst->dtype = dtype;
    dst->scale_dtype = kv_scaled(dtype) ? KVP_DTYPE_F32 : 0;
    dst->data_bytes = slabs * (uint64_t)kvp_dtype_row_bytes(dtype, (int64_t)len);
    dst->scales_bytes = kv_scaled(dtype) ? slabs * 4 : 0;
    return 0;
}

static float get_f32(const uint8_t *p)
{
    uint32_t u = kvp_le32(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Index of x's first NaN or infinity, or n. */
static uint64_t first_non_finite(const float *x, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return i;
    return n;
}

int kvp_quant_kv_convert(const kvp_kvblock_rec *src, const void *src_data, const void *src_scales,
                         const kvp_kvblock_rec *dst, void *dst_data, void *dst_scales, kvp_quant_stats *st,
                         kvp_err *err)
{
    uint64_t slabs, len;
    int rc = kv_shape(src, &slabs, &len, err);
    if (rc < 0)
        return rc;
    kvp_kvblock_rec want;
    if ((rc = kvp_quant_kv_plan(src, dst->dtype, &want, err)) < 0)
        return rc;
    uint64_t sin = (uint64_t)kvp_dtype_row_bytes(src->dtype, (int64_t)len);
    uint64_t sout = (uint64_t)kvp_dtype_row_bytes(dst->dtype, (int64_t)len);
    if (src->data_bytes != slabs * sin || want.data_bytes != dst->data_bytes ||
        want.scales_bytes != dst->scales_bytes)
        return kvp_err_set(err, KVP_EFORMAT, "kv block %u of sequence %llu: data_bytes %llu does not match its shape",
                           src->block_index, (unsigned long long)src->seq_id, (unsigned long long)src->data_bytes);
    /* a slab's scale, or (a running cache's stream) one for each slot's row */
    uint64_t per = kvp_kvblock_scales_per_slot(src) == 1 ? src->block_size : 1;
    int src_has_scales = src->scale_dtype == KVP_DTYPE_F32 && src->scales_bytes == slabs * per * 4 && src_scales;
    if (src->scale_dtype && !src_has_scales)
        return kvp_err_set(err, KVP_EFORMAT, "kv block %u of sequence %llu: scales_bytes %llu, want %llu or %llu f32",
                           src->block_index, (unsigned long long)src->seq_id, (unsigned long long)src->scales_bytes,
                           (unsigned long long)slabs, (unsigned long long)(slabs * src->block_size));
    const kvp_dtype_traits *ti = kvp_dtype_get(src->dtype), *to = kvp_dtype_get(dst->dtype);
    uint64_t n = (uint64_t)src->n_tokens * src->head_dim; /* filled elements of a slab */
    float *x = malloc((n ? n : 1) * sizeof *x), *y = malloc((n ? n : 1) * sizeof *y);
    if (!x || !y) {
        free(x);
        free(y);
        return kvp_err_set(err, KVP_ENOMEM, "kv block %u: out of memory", src->block_index);
    }
    const uint8_t *in = src_data;
    uint8_t *out = dst_data;
    for (uint64_t k = 0; k < slabs; k++, in += sin, out += sout) {
        ti->to_f32(in, x, (int64_t)n);
        for (uint64_t i = 0; src_has_scales && i < n; i++)
            x[i] *= get_f32((const uint8_t *)src_scales + 4 * (k * per + (per > 1 ? i / src->head_dim : 0)));
        /* a NaN or infinity would come out finite (an int8 or fp8 scale's
         * max drops it), a broken cache made to look whole: refused, as
         * quantize refuses non-finite weights */
        uint64_t bad = first_non_finite(x, n);
        if (bad < n) {
            rc = kvp_err_set(err, KVP_EFORMAT, "kv block %u of sequence %llu: %s value %s at token %llu of layer "
                             "%u, KV head %llu: the KV cache holds non-finite values",
                             src->block_index, (unsigned long long)src->seq_id,
                             k / src->n_head_kv % 2 ? "V" : "K", isnan(x[bad]) ? "NaN" : "infinite",
                             (unsigned long long)(bad / src->head_dim),
                             src->layer_begin + (uint32_t)(k / (2 * (uint64_t)src->n_head_kv)),
                             (unsigned long long)(k % src->n_head_kv));
            break;
        }
        memset(out, 0, sout);
        if (kv_scaled(dst->dtype)) {
            float s = kvp_kvscale_of((int)dst->dtype, kvp_kvscale_amax(x, (int64_t)n));
            uint32_t u;
            memcpy(&u, &s, 4);
            kvp_put32((uint8_t *)dst_scales + 4 * k, u);
            kvp_kvscale_encode((int)dst->dtype, x, s, out, (int64_t)n);
            kvp_kvscale_decode((int)dst->dtype, out, s, y, (int64_t)n);
        } else {
            to->from_f32(x, out, (int64_t)n);
            to->to_f32(out, y, (int64_t)n);
        }
        if (st)
            kvp_quant_stats_add(st, x, y, (int64_t)n);
    }
    free(x);
    free(y);
    return rc;
}
