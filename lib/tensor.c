/* tensor.c - dtype traits and the f16/bf16 conversions (see tensor.h). */
#include "tensor.h"
#include "quant.h"

#include <string.h>
#include <strings.h>

float kvp_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) { /* inf, or NaN made quiet with its payload kept (as F16C does) */
        bits = sign | 0x7f800000u | man << 13 | (man ? 0x400000u : 0);
    } else if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalize */
            int e = -1;
            do {
                man <<= 1;
                e++;
            } while (!(man & 0x400));
            bits = sign | (uint32_t)(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
        }
    } else {
        bits = sign | (exp + 112) << 23 | man << 13;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

uint16_t kvp_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) /* NaN: keep quiet, keep top payload bits */
        return (uint16_t)(sign | 0x7e00 | ((ax >> 13) & 0x3ff));
    if (ax >= 0x477ff000u) /* rounds to >= 65520: inf */
        return (uint16_t)(sign | 0x7c00);
    if (ax < 0x38800000u) { /* below f16's smallest normal 2^-14: subnormal */
        if (ax < 0x33000000u) /* < 2^-25: rounds to zero (ties-to-even at 2^-25 -> 0) */
            return sign;
        uint32_t e = ax >> 23, man = (ax & 0x7fffff) | 0x800000;
        int shift = (int)(126 - e); /* value = man * 2^(e-150); unit = 2^-24 */
        uint32_t q = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1)))
            q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = ax + 0xfffu + ((ax >> 13) & 1); /* round to nearest even on bit 13 */
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

float kvp_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

uint16_t kvp_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

static void f32_to_f32(const void *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }
static void f32_from_f32(const float *src, void *dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TENSOR_F16C 1
/* F16C converts 8 at a time with the same rounding (nearest even) and NaN
 * quieting as the scalar code; tests/unit/test_quant.c checks every value. */
__attribute__((target("avx2,fma,f16c"))) static void f16_to_f32_f16c(const uint8_t *s, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(s + 2 * i))));
    for (; i < n; i++)
        dst[i] = kvp_f16_to_f32((uint16_t)(s[2 * i] | s[2 * i + 1] << 8));
}

__attribute__((target("avx2,fma,f16c"))) static void f16_from_f32_f16c(const float *src, uint8_t *d, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(d + 2 * i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) {
        uint16_t h = kvp_f32_to_f16(src[i]);
        d[2 * i] = (uint8_t)h;
        d[2 * i + 1] = (uint8_t)(h >> 8);
    }
}
#else
#define TENSOR_F16C 0
#endif

void kvp_f16_row_to_f32(int impl, const void *src, float *dst, int64_t n)
{
    const uint8_t *s = src;
#if TENSOR_F16C
    if (impl != KVP_IMPL_PORTABLE && kvp_have_avx2()) {
        f16_to_f32_f16c(s, dst, n);
        return;
    }
#endif
    (void)impl;
    for (int64_t i = 0; i < n; i++)
        dst[i] = kvp_f16_to_f32((uint16_t)(s[2 * i] | s[2 * i + 1] << 8));
}

void kvp_f16_row_from_f32(int impl, const float *src, void *dst, int64_t n)
{
    uint8_t *d = dst;
#if TENSOR_F16C
    if (impl != KVP_IMPL_PORTABLE && kvp_have_avx2()) {
        f16_from_f32_f16c(src, d, n);
        return;
    }
#endif
    (void)impl;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h = kvp_f32_to_f16(src[i]);
        d[2 * i] = (uint8_t)h;
        d[2 * i + 1] = (uint8_t)(h >> 8);
    }
}

static void f16_to_f32(const void *src, float *dst, int64_t n) { kvp_f16_row_to_f32(KVP_IMPL_AUTO, src, dst, n); }
static void f16_from_f32(const float *src, void *dst, int64_t n) { kvp_f16_row_from_f32(KVP_IMPL_AUTO, src, dst, n); }
static void bf16_to_f32(const void *src, float *dst, int64_t n)
{
    const uint8_t *s = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = kvp_bf16_to_f32((uint16_t)(s[2 * i] | s[2 * i + 1] << 8));
}
static void bf16_from_f32(const float *src, void *dst, int64_t n)
{
    uint8_t *d = dst;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h = kvp_f32_to_bf16(src[i]);
        d[2 * i] = (uint8_t)h;
        d[2 * i + 1] = (uint8_t)(h >> 8);
    }
}

static void nvfp4_from_f32(const float *src, void *dst, int64_t n) { kvp_quantize_row_nvfp4(src, dst, n, 1.0f); }
static void mxfp4_from_f32(const float *src, void *dst, int64_t n) { kvp_quantize_row_mxfp4(src, dst, n); }

/* The table.  Conversions of the 8/4-bit and block types live in the quant
 * module (minifloat.c, ggml_quants.c, quant.c); the sizes are fixed here
 * because the format depends on them.  Q4_K and Q6_K are read-only. */
static const kvp_dtype_traits traits[KVP_DTYPE_COUNT] = {
    [KVP_DTYPE_F32] = {"f32", 1, 4, 0, f32_to_f32, f32_from_f32},
    [KVP_DTYPE_F16] = {"f16", 1, 2, 0, f16_to_f32, f16_from_f32},
    [KVP_DTYPE_BF16] = {"bf16", 1, 2, 0, bf16_to_f32, bf16_from_f32},
    [KVP_DTYPE_F64] = {"f64", 1, 8, 0, NULL, NULL},
    [KVP_DTYPE_FP8_E4M3] = {"fp8_e4m3", 1, 1, 0, kvp_dequantize_row_e4m3, kvp_quantize_row_e4m3},
    [KVP_DTYPE_FP8_E5M2] = {"fp8_e5m2", 1, 1, 0, kvp_dequantize_row_e5m2, kvp_quantize_row_e5m2},
    [KVP_DTYPE_FP4_E2M1] = {"fp4_e2m1", 2, 1, 0, kvp_dequantize_row_e2m1, kvp_quantize_row_e2m1},
    [KVP_DTYPE_I8] = {"i8", 1, 1, 0, kvp_dequantize_row_i8, kvp_quantize_row_i8},
    [KVP_DTYPE_I4] = {"i4", 2, 1, 0, kvp_dequantize_row_i4, kvp_quantize_row_i4},
    [KVP_DTYPE_U8] = {"u8", 1, 1, 0, kvp_dequantize_row_u8, kvp_quantize_row_u8},
    [KVP_DTYPE_U4] = {"u4", 2, 1, 0, kvp_dequantize_row_u4, kvp_quantize_row_u4},
    [KVP_DTYPE_I32] = {"i32", 1, 4, 0, NULL, NULL},
    [KVP_DTYPE_U32] = {"u32", 1, 4, 0, NULL, NULL},
    [KVP_DTYPE_E8M0] = {"e8m0", 1, 1, 0, kvp_dequantize_row_e8m0, kvp_quantize_row_e8m0},
    [KVP_DTYPE_Q4_0] = {"q4_0", 32, 18, 1, kvp_dequantize_row_q4_0, kvp_quantize_row_q4_0},
    [KVP_DTYPE_Q4_1] = {"q4_1", 32, 20, 1, kvp_dequantize_row_q4_1, kvp_quantize_row_q4_1},
    [KVP_DTYPE_Q5_0] = {"q5_0", 32, 22, 1, kvp_dequantize_row_q5_0, kvp_quantize_row_q5_0},
    [KVP_DTYPE_Q5_1] = {"q5_1", 32, 24, 1, kvp_dequantize_row_q5_1, kvp_quantize_row_q5_1},
    [KVP_DTYPE_Q8_0] = {"q8_0", 32, 34, 1, kvp_dequantize_row_q8_0, kvp_quantize_row_q8_0},
    [KVP_DTYPE_Q4_K] = {"q4_k", 256, 144, 1, kvp_dequantize_row_q4_k, NULL},
    [KVP_DTYPE_Q6_K] = {"q6_k", 256, 210, 1, kvp_dequantize_row_q6_k, NULL},
    [KVP_DTYPE_NVFP4] = {"nvfp4", 16, 9, 1, kvp_dequantize_row_nvfp4, nvfp4_from_f32},
    [KVP_DTYPE_MXFP4] = {"mxfp4", 32, 17, 1, kvp_dequantize_row_mxfp4, mxfp4_from_f32},
};

const kvp_dtype_traits *kvp_dtype_get(uint32_t t)
{
    if (t >= KVP_DTYPE_COUNT || !traits[t].name)
        return NULL;
    return &traits[t];
}

const char *kvp_dtype_name(uint32_t t)
{
    const kvp_dtype_traits *tr = kvp_dtype_get(t);
    return tr ? tr->name : "?";
}

int kvp_dtype_from_name(const char *name)
{
    static const struct { const char *alias; kvp_dtype t; } aliases[] = {
        {"float32", KVP_DTYPE_F32}, {"fp32", KVP_DTYPE_F32}, {"float16", KVP_DTYPE_F16},
        {"fp16", KVP_DTYPE_F16},    {"half", KVP_DTYPE_F16}, {"bfloat16", KVP_DTYPE_BF16},
        {"fp8", KVP_DTYPE_FP8_E4M3}, {"e4m3", KVP_DTYPE_FP8_E4M3}, {"fp8-e4m3", KVP_DTYPE_FP8_E4M3},
        {"fp8-e5m2", KVP_DTYPE_FP8_E5M2}, {"e5m2", KVP_DTYPE_FP8_E5M2}, {"fp4", KVP_DTYPE_FP4_E2M1},
        {"int8", KVP_DTYPE_I8},     {"int4", KVP_DTYPE_I4},
    };
    for (int t = 0; t < KVP_DTYPE_COUNT; t++)
        if (traits[t].name && strcasecmp(traits[t].name, name) == 0)
            return t;
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (strcasecmp(aliases[i].alias, name) == 0)
            return (int)aliases[i].t;
    return -1;
}

int64_t kvp_dtype_row_bytes(uint32_t t, int64_t n)
{
    const kvp_dtype_traits *tr = kvp_dtype_get(t);
    if (!tr || n < 0)
        return -1;
    if (tr->block_size == 2 && !tr->is_quantized) /* packed 4-bit scalars */
        return n / 2 + (n & 1);
    if (n % tr->block_size)
        return -1;
    /* n may come from a file: refuse a byte count that does not fit. */
    if (n / tr->block_size > INT64_MAX / tr->block_bytes)
        return -1;
    return n / tr->block_size * tr->block_bytes;
}
