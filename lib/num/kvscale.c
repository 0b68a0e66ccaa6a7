/* kvscale.c - scaled fp8 / int8 KV elements (see kvscale.h). */
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

/* x / scale as the encoders compute it: times 1 / scale, except for a
 * scale below 2^-128 whose reciprocal is infinite (a row of tiny values),
 * where 0 * inf would be NaN and every other element +-max; the CUDA store
 * (cu_kv_encode) does the same so both write the same bytes. */
static float unscale(float x, float scale, float inv) { return isfinite(inv) ? x * inv : x / scale; }

void kvp_kvscale_encode(int dtype, const float *x, float scale, void *dst, int64_t n)
{
    float inv = 1.0f / scale;
    uint8_t *d = dst;
    if (dtype == KVP_DTYPE_I8)
        for (int64_t i = 0; i < n; i++)
            d[i] = (uint8_t)kvp_f32_to_i8(unscale(x[i], scale, inv));
    else
        for (int64_t i = 0; i < n; i++)
            d[i] = kvp_f32_to_e4m3_sat(unscale(x[i], scale, inv));
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

/* A row's scale: see kvp_kvscale_row. */
static float row_scale(int dtype, float amax)
{
    float s = kvp_kvscale_of(dtype, amax);
    if (dtype != KVP_DTYPE_FP8_E4M3)
        return s;
    int e;
    float m = frexpf(s, &e); /* s = m * 2^e, m in [0.5, 1) */
    return m == 0.5f ? s : ldexpf(1.0f, e);
}

float kvp_kvscale_row(int dtype, const float *x, uint32_t n, uint8_t *dst)
{
    float scale = row_scale(dtype, kvp_kvscale_amax(x, n));
    kvp_kvscale_encode(dtype, x, scale, dst, n);
    return scale;
}
