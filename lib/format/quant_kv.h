/* quant_kv.h - converting KV block payloads (KVP KV_BLOCK records) between
 * element dtypes: what `quantize --kv` does to a stream.  The numerics are
 * lib/quant.h's; this module knows the record layout, so it sits in the
 * format layer above them.
 */
#ifndef KVP_QUANT_KV_H
#define KVP_QUANT_KV_H

#include "error.h"
#include "quant.h"
#include "stream.h"

/* A KV block payload is, for each layer in [layer_begin, layer_end), K then V,
 * each n_head_kv x block_size x head_dim elements of b->dtype; only the first
 * n_tokens slots of each head are meaningful (the rest are written as 0).
 * fp8_e4m3 and i8 blocks carry one f32 scale per (layer, K/V, head), in that
 * order: scale = amax / 448 (fp8) or amax / 127 (i8) over the head's filled
 * slots; f32, f16, bf16 blocks carry none (scale_dtype 0, or scales of 1). */

/* Set dst to src converted to dtype: dtype, scale_dtype, data_bytes and
 * scales_bytes; the rest copied.  KVP_EUNSUPPORTED for other dtypes. */
int kvp_quant_kv_plan(const kvp_kvblock_rec *src, uint32_t dtype, kvp_kvblock_rec *dst, kvp_err *err);
/* Convert a payload planned with kvp_quant_kv_plan.  src_scales may be NULL
 * when src has none; dst_scales may be NULL when dst has none.  st (may be
 * NULL) gets the error over the filled slots. */
int kvp_quant_kv_convert(const kvp_kvblock_rec *src, const void *src_data, const void *src_scales,
                         const kvp_kvblock_rec *dst, void *dst_data, void *dst_scales, kvp_quant_stats *st,
                         kvp_err *err);

#endif
