/* intcast.c - plain integer casts (see intcast.h). */
#include "intcast.h"
#include "num_impl.h"

static inline int clamp_rne(float v, int lo, int hi)
{
    if (!(v == v))
        return 0;
    v = kvp_rne(v);
    return v < (float)lo ? lo : v > (float)hi ? hi : (int)v;
}

void kvp_quantize_row_i8(const float *x, void *dst, int64_t n)
{
    int8_t *d = dst;
    for (int64_t i = 0; i < n; i++)
        d[i] = kvp_f32_to_i8(x[i]);
}

void kvp_dequantize_row_i8(const void *src, float *y, int64_t n)
{
    const int8_t *s = src;
    for (int64_t i = 0; i < n; i++)
        y[i] = (float)s[i];
}

void kvp_quantize_row_u8(const float *x, void *dst, int64_t n)
{
    uint8_t *d = dst;
    for (int64_t i = 0; i < n; i++)
        d[i] = (uint8_t)clamp_rne(x[i], 0, 255);
}

void kvp_dequantize_row_u8(const void *src, float *y, int64_t n)
{
    const uint8_t *s = src;
    for (int64_t i = 0; i < n; i++)
        y[i] = (float)s[i];
}

static void nibbles_put(uint8_t *d, int64_t i, int q)
{
    if (i & 1)
        d[i / 2] = (uint8_t)((d[i / 2] & 0x0f) | (q & 15) << 4);
    else
        d[i / 2] = (uint8_t)(q & 15); /* the low nibble comes first: clears the high one */
}

void kvp_quantize_row_i4(const float *x, void *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        nibbles_put(dst, i, clamp_rne(x[i], -8, 7));
}

void kvp_dequantize_row_i4(const void *src, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = (float)kvp_i4_at(src, i);
}

void kvp_quantize_row_u4(const float *x, void *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        nibbles_put(dst, i, clamp_rne(x[i], 0, 15));
}

void kvp_dequantize_row_u4(const void *src, float *y, int64_t n)
{
    const uint8_t *s = src;
    for (int64_t i = 0; i < n; i++)
        y[i] = (float)((s[i / 2] >> (4 * (i & 1))) & 15);
}

