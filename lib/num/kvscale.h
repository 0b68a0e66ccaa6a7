/* kvscale.h - the numerics of a scaled KV cache: fp8 (E4M3) and int8 K/V
 * with f32 scales.  Element x is stored as q = encode(x * (1 / scale))
 * (round to nearest even, saturating) and read back as decode(q) * scale.
 *
 * Two granularities (kvp(5) KV_BLOCK): `quantize --kv` gives each "slab",
 * the block_size x head_dim elements of one (layer, K/V, head) of a block,
 * one scale, amax / 448 (fp8) or amax / 127 (int8) over its filled slots.
 * A running cache (decode and prefill with --kv-dtype fp8|int8) gives each
 * token's row of a head its own scale instead (kvp_kvscale_row), as
 * llama.cpp's q8_0 cache does per 32 elements: a block shared by tokens
 * written at different times then never rescales, so what a token's
 * attention reads depends only on the tokens at or before it — not on the
 * tokens after it in the same chunk, the chunking, the batch or a rejected
 * speculative draft — and the cache stays batch invariant.
 */
#ifndef KVP_KVSCALE_H
#define KVP_KVSCALE_H

#include <stdint.h>

/* Whether dtype (a kvp_dtype) is a scaled KV element type (fp8_e4m3, i8). */
int kvp_kvscale_dtype(int dtype);
/* The largest magnitude an element holds after scaling: 448 or 127. */
float kvp_kvscale_max(int dtype);
/* The scale of elements whose largest |x| is amax: amax / max, or 1 when
 * amax is 0 or not finite (all zero). */
float kvp_kvscale_of(int dtype, float amax);
/* Largest finite |x[i]| (0 for none). */
float kvp_kvscale_amax(const float *x, int64_t n);
/* dst[i] = encode(x[i] * (1 / scale)), n elements of dtype. */
void kvp_kvscale_encode(int dtype, const float *x, float scale, void *dst, int64_t n);
/* y[i] = decode(src[i]) * scale. */
void kvp_kvscale_decode(int dtype, const void *src, float scale, float *y, int64_t n);
/* One token's row x[n] of one head into dst with its own scale, returned:
 * int8 amax / 127; fp8 the power of two at or above amax / 448 (a floating
 * format loses no precision to the headroom, and scales that are powers of
 * two multiply exactly). */
float kvp_kvscale_row(int dtype, const float *x, uint32_t n, uint8_t *dst);

#endif
