/* kvscale.c - scaled fp8 / int8 KV slabs (see kvscale.h). */
#include "kvscale.h"
#include "intcast.h"
#include "minifloat.h"
#include "tensor.h"

#include <math.h>

int kvp_kvscale_dtype(int dtype) { return dtype == KVP_DTYPE_FP8_E4M3 || dtype == KVP_DTYPE_I8; }

float kvp_kvscale_max(int dtype) { return dtype == KVP_DTYPE_I8 ? 127.0f : 448.0f; }

float kvp_kvscale_of(int dtype, float amax)
{
    float s = amax / kvp_kvscale_max(dtype);
    return s > 0.0f && isfinite(s) ? s : 1.0f;
}

float kvp_kvscale_amax(const float *x, int64_t n)
{
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++)
        m = fabsf(x[i]) > m && isfinite(x[i]) ? fabsf(x[i]) : m;
    return m;
}

void kvp_kvscale_encode(int dtype, const float *x, float scale, void *dst, int64_t n)
{
    float inv = 1.0f / scale;
    uint8_t *d = dst;
    if (dtype == KVP_DTYPE_I8)
        for (int64_t i = 0; i < n; i++)
            d[i] = (uint8_t)kvp_f32_to_i8(x[i] * inv);
    else
        for (int64_t i = 0; i < n; i++)
            d[i] = kvp_f32_to_e4m3_sat(x[i] * inv);
}

void kvp_kvscale_decode(int dtype, const void *src, float scale, float *y, int64_t n)
{
    const uint8_t *s = src;
    if (dtype == KVP_DTYPE_I8)
        for (int64_t i = 0; i < n; i++)
            y[i] = (float)(int8_t)s[i] * scale;
    else
        for (int64_t i = 0; i < n; i++)
            y[i] = kvp_e4m3_to_f32(s[i]) * scale;
}

/* Re-encode rows 0..s-1 (n elements each) from scale `from` to scale `to`. */
static void rescale(int dtype, uint8_t *slab, uint32_t s, uint32_t n, float from, float to)
{
    float row[256];
    for (uint64_t i = 0, all = (uint64_t)s * n; i < all; i += 256) {
        int64_t k = all - i < 256 ? (int64_t)(all - i) : 256;
        kvp_kvscale_decode(dtype, slab + i, from, row, k);
        kvp_kvscale_encode(dtype, row, to, slab + i, k);
    }
}

/* The scale a running slab takes for amax.  fp8: the power of two just
 * above amax / 448, so growing it rescales stored values by a power of two,
 * which moves only their exponent: exact (short of the subnormal range),
 * and the slab ends as if its final scale had been known from the start;
 * a floating format loses no precision to the headroom.  int8: amax / 127
 * (a power of two would waste up to a bit of its 8), its growths rounding
 * the earlier values again. */
static float running_scale(int dtype, float amax)
{
    float s = kvp_kvscale_of(dtype, amax);
    if (dtype != KVP_DTYPE_FP8_E4M3)
        return s;
    int e;
    float m = frexpf(s, &e); /* s = m * 2^e, m in [0.5, 1) */
    return m == 0.5f ? s : ldexpf(1.0f, e);
}

void kvp_kvscale_append(int dtype, uint8_t *slab, float *scale, uint32_t s, const float *x, uint32_t n)
{
    float amax = kvp_kvscale_amax(x, n);
    if (s == 0) {
        *scale = running_scale(dtype, amax);
    } else if (amax > *scale * kvp_kvscale_max(dtype)) {
        float grown = running_scale(dtype, amax);
        rescale(dtype, slab, s, n, *scale, grown);
        *scale = grown;
    }
    kvp_kvscale_encode(dtype, x, *scale, slab + (size_t)s * n, n);
}
