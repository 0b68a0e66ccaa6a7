/* kvscale.h - the numerics of a scaled KV cache: fp8 (E4M3) and int8 K/V
 * with one f32 scale per "slab", the block_size x head_dim elements of one
 * (layer, K/V, head) of a block (kvp(5) KV_BLOCK).  Element x is stored as
 * q = encode(x * (1 / scale)) (round to nearest even, saturating) and read
 * back as decode(q) * scale; a slab's scale is amax / 448 (fp8) or
 * amax / 127 (int8) over its filled slots.
 *
 * `quantize --kv` converts whole blocks (format/quant_kv.c); a running cache
 * fills a block a token at a time (kvp_kvscale_append), so its scale grows
 * with the largest value seen so far: the first token of a block sets it,
 * and a later one that does not fit raises it and re-encodes the slots
 * before it at the new scale.  What a slab holds thus depends only on the
 * tokens written into it, in order, never on how they were batched.
 */
#ifndef KVP_KVSCALE_H
#define KVP_KVSCALE_H

#include <stdint.h>

/* Whether dtype (a kvp_dtype) is a scaled KV element type (fp8_e4m3, i8). */
int kvp_kvscale_dtype(int dtype);
/* The largest magnitude an element holds after scaling: 448 or 127. */
float kvp_kvscale_max(int dtype);
/* The scale of a slab whose largest |x| is amax: amax / max, or 1 when amax
 * is 0 or not finite (all-zero slab). */
float kvp_kvscale_of(int dtype, float amax);
/* Largest finite |x[i]| (0 for none). */
float kvp_kvscale_amax(const float *x, int64_t n);
/* dst[i] = encode(x[i] * (1 / scale)), n elements of dtype. */
void kvp_kvscale_encode(int dtype, const float *x, float scale, void *dst, int64_t n);
/* y[i] = decode(src[i]) * scale. */
void kvp_kvscale_decode(int dtype, const void *src, float scale, float *y, int64_t n);
/* Write one token's row x[n] into slot s of a slab (rows of n elements;
 * rows 0..s-1 filled) whose scale is *scale.  Slot 0 sets the scale from x
 * alone (a block taken from the free pool starts afresh); a later slot
 * whose largest |x| exceeds what the scale holds raises the scale to fit it
 * and re-encodes rows 0..s-1 at the new one. */
void kvp_kvscale_append(int dtype, uint8_t *slab, float *scale, uint32_t s, const float *x, uint32_t n);

#endif
