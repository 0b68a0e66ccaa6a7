/* minifloat.h - casts between f32 and the narrow float types: f16, bf16,
 * FP8 E4M3fn, FP8 E5M2, FP4 E2M1 and E8M0.
 *
 * Bit exact with ml_dtypes (float8_e4m3fn, float8_e5m2, float4_e2m1fn,
 * float8_e8m0fnu) for every f32 that is not an f32 subnormal.  Round to
 * nearest even.  The plain casts overflow the way ml_dtypes does (E4M3fn to
 * NaN, E5M2 to inf, E2M1 saturates); the _sat casts clamp to the largest
 * finite value (what scaled quantization wants).  Row casts use AVX2/F16C
 * when the CPU has it, with results identical to the portable code.
 * Packed 4-bit rows hold (n+1)/2 bytes, element 2k in the low nibble.
 */
#ifndef KVP_MINIFLOAT_H
#define KVP_MINIFLOAT_H

#include "cpufeat.h"

#include <stdint.h>
#include <string.h>

/* Scalar f16/bf16, round to nearest even, NaN kept as NaN. */
float kvp_f16_to_f32(uint16_t h);
uint16_t kvp_f32_to_f16(float f);
float kvp_bf16_to_f32(uint16_t h);
uint16_t kvp_f32_to_bf16(float f);

/* f16 rows with the code path chosen (KVP_IMPL_*: F16C or portable). */
void kvp_f16_row_to_f32(int impl, const void *src, float *dst, int64_t n);
void kvp_f16_row_from_f32(int impl, const float *src, void *dst, int64_t n);

/* Scalar narrow floats. */
uint8_t kvp_f32_to_e4m3(float f);     /* NaN 0x7f/0xff; |x| > 464 and inf -> NaN */
uint8_t kvp_f32_to_e4m3_sat(float f); /* overflow and inf -> +-448 */
static inline float kvp_e4m3_to_f32(uint8_t b);
uint8_t kvp_f32_to_e5m2(float f);     /* overflow -> inf, NaN 0x7e/0xfe */
uint8_t kvp_f32_to_e5m2_sat(float f); /* overflow and inf -> +-57344 */
float kvp_e5m2_to_f32(uint8_t b);
uint8_t kvp_f32_to_e2m1(float f);     /* 4-bit code; saturates at +-6 (the format has no inf/NaN) */
float kvp_e2m1_to_f32(uint8_t code);  /* low nibble used */
uint8_t kvp_f32_to_e8m0(float f);     /* nearest power of two, ties up; <= 0, inf, NaN -> 0xff */
static inline float kvp_e8m0_to_f32(uint8_t b); /* 2^(b-127); 0xff is NaN */
/* The f16 whose value is an e4m3 code's / 256, exactly (subnormals too):
 * the sign to bit 15, the other seven bits to bits 13..7.  NaN codes
 * (0x7f, 0xff) come out as +-1.875 (480 / 256): for finite codes only. */
static inline uint16_t kvp_e4m3_f16_bits(uint8_t b)
{
    return (uint16_t)(((b & 0x80u) << 8) | ((b & 0x7fu) << 7));
}

/* Rows of n elements: the dtype traits' to_f32/from_f32. */
void kvp_quantize_row_e4m3(const float *x, void *dst, int64_t n);
void kvp_quantize_row_e4m3_sat(const float *x, void *dst, int64_t n);
void kvp_dequantize_row_e4m3(const void *src, float *y, int64_t n);
/* The fp8 row casts with the code path chosen: e5m2 0/1, sat 0/1. */
void kvp_fp8_row_impl(int impl, int e5m2, int sat, const float *x, uint8_t *dst, int64_t n);
void kvp_quantize_row_e5m2(const float *x, void *dst, int64_t n);
void kvp_quantize_row_e5m2_sat(const float *x, void *dst, int64_t n);
void kvp_dequantize_row_e5m2(const void *src, float *y, int64_t n);
void kvp_quantize_row_e2m1(const float *x, void *dst, int64_t n);
void kvp_dequantize_row_e2m1(const void *src, float *y, int64_t n);
void kvp_quantize_row_e8m0(const float *x, void *dst, int64_t n);
void kvp_dequantize_row_e8m0(const void *src, float *y, int64_t n);

/* The two scale decoders inline: the row kernels of MXFP4 and NVFP4
 * (backend_cpu_x86_rows.inc) call them once a block, and a call there
 * spilled the vector registers around it (perf: a third of the row time). */
static inline float kvp_minifloat_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float kvp_e4m3_to_f32(uint8_t b)
{
    uint32_t s = (uint32_t)(b & 0x80) << 24, e = (b >> 3) & 15, m = b & 7, sub;
    if ((b & 0x7f) == 0x7f)
        return kvp_minifloat_bits_f32(s | 0x7fc00000u);
    if (e == 0) {
        float v = (float)m * 0x1p-9f;
        memcpy(&sub, &v, sizeof sub);
        return kvp_minifloat_bits_f32(s | sub);
    }
    return kvp_minifloat_bits_f32(s | (e + 120) << 23 | m << 20);
}

static inline float kvp_e8m0_to_f32(uint8_t b)
{
    if (b == 0xff)
        return kvp_minifloat_bits_f32(0x7fc00000u);
    if (b == 0)
        return kvp_minifloat_bits_f32(0x00400000u); /* 2^-127, an f32 subnormal */
    return kvp_minifloat_bits_f32((uint32_t)b << 23);
}

#endif
