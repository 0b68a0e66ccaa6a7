/* intcast.h - plain casts between f32 and int8, uint8, int4, uint4 rows.
 *
 * Round to nearest even, saturating, NaN -> 0.  i4 and u4 pack two per byte,
 * element 2k in the low nibble of byte k (an odd count leaves the last high
 * nibble 0); i4 is two's complement [-8, 7].
 */
#ifndef KVP_INTCAST_H
#define KVP_INTCAST_H

#include <math.h>
#include <stdint.h>

/* One f32 to int8: round to nearest even (the default rounding mode),
 * saturating, NaN -> 0. */
static inline int8_t kvp_f32_to_i8(float v)
{
    if (!(v == v))
        return 0;
    v = rintf(v);
    return (int8_t)(v < -128.0f ? -128 : v > 127.0f ? 127 : (int)v);
}

void kvp_quantize_row_i8(const float *x, void *dst, int64_t n);
void kvp_dequantize_row_i8(const void *src, float *y, int64_t n);
void kvp_quantize_row_i4(const float *x, void *dst, int64_t n);
void kvp_dequantize_row_i4(const void *src, float *y, int64_t n);
void kvp_quantize_row_u8(const float *x, void *dst, int64_t n);
void kvp_dequantize_row_u8(const void *src, float *y, int64_t n);
void kvp_quantize_row_u4(const float *x, void *dst, int64_t n);
void kvp_dequantize_row_u4(const void *src, float *y, int64_t n);

/* Element i of a packed i4 row. */
static inline int kvp_i4_at(const uint8_t *s, int64_t i)
{
    int q = (s[i / 2] >> (4 * (i & 1))) & 15;
    return q >= 8 ? q - 16 : q;
}

#endif
