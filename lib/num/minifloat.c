/* minifloat.c - FP8 E4M3fn, FP8 E5M2, FP4 E2M1 and E8M0 casts, and f16/bf16 (see minifloat.h).
 *
 * Encoding works on the f32 bit pattern so rounding is exact: in the target's
 * normal range, adding half an ulp minus one plus the kept lsb and shifting
 * rounds to nearest even, and a mantissa carry moves into the exponent by
 * itself; below it, the value is rounded in units of the smallest subnormal.
 * The AVX2 path does the same integer steps (and rounds subnormals with an
 * exact float multiply plus round-to-nearest-even), so it gives identical
 * bytes; tests/unit/test_quant.c checks that over every f16 value.
 */
#include "minifloat.h"
#include "num_impl.h"

#include <math.h>
#include <string.h>

#if KVP_X86_SIMD
#include <immintrin.h>
#endif

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- f16 and bf16 ---- */

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

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MINI_F16C 1
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
#define MINI_F16C 0
#endif

void kvp_f16_row_to_f32(int impl, const void *src, float *dst, int64_t n)
{
    const uint8_t *s = src;
#if MINI_F16C
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
#if MINI_F16C
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

/* ---- FP8, FP4, E8M0 ---- */

/* Magnitude code of finite |x| (bits ax) in a format with mbits mantissa
 * bits and exponent bias `bias`; may exceed the largest code (overflow), the
 * caller decides what that means. */
static inline uint32_t mini_mag(uint32_t ax, int mbits, int bias)
{
    int e = (int)(ax >> 23) - 127;
    int emin = 1 - bias;
    if (e >= emin) {
        int sh = 23 - mbits;
        uint32_t r = ax + ((1u << (sh - 1)) - 1) + ((ax >> sh) & 1);
        return (r >> sh) - ((uint32_t)(127 - bias) << mbits);
    }
    if (e < emin - mbits - 1) /* at most half the smallest subnormal: 0 (ties to even) */
        return 0;
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    int sh = 23 - mbits + (emin - e); /* 1..24 */
    uint32_t q = m >> sh, rem = m & ((1u << sh) - 1), half = 1u << (sh - 1);
    if (rem > half || (rem == half && (q & 1)))
        q++;
    return q; /* q == 1 << mbits is the smallest normal: the encoding agrees */
}

/* Encode f in a 1-sign minifloat with mbits mantissa bits and exponent bias:
 * NaN becomes `nan`; a magnitude code above `max` (the largest finite)
 * becomes `over` (NaN or inf, or `max` itself when saturating). */
static uint8_t mini_encode(float f, int mbits, int bias, uint32_t nan, uint32_t max, uint32_t over)
{
    uint32_t x = f32_bits(f), ax = x & 0x7fffffffu, s = (x >> 24) & 0x80;
    if (ax > 0x7f800000u)
        return (uint8_t)(s | nan);
    uint32_t c = mini_mag(ax, mbits, bias);
    return (uint8_t)(s | (c > max ? over : c));
}

/* E4M3fn: no infinities; 0x7f is NaN, so overflow is NaN unless saturating. */
uint8_t kvp_f32_to_e4m3(float f) { return mini_encode(f, 3, 7, 0x7f, 0x7e, 0x7f); }
uint8_t kvp_f32_to_e4m3_sat(float f) { return mini_encode(f, 3, 7, 0x7f, 0x7e, 0x7e); }

/* E5M2: IEEE-like; overflow is inf (0x7c) unless saturating. */
uint8_t kvp_f32_to_e5m2(float f) { return mini_encode(f, 2, 15, 0x7e, 0x7b, 0x7c); }
uint8_t kvp_f32_to_e5m2_sat(float f) { return mini_encode(f, 2, 15, 0x7e, 0x7b, 0x7b); }

float kvp_e5m2_to_f32(uint8_t b)
{
    uint32_t s = (uint32_t)(b & 0x80) << 24, e = (b >> 2) & 31, m = b & 3;
    if (e == 31)
        return bits_f32(s | (m ? 0x7fc00000u : 0x7f800000u));
    if (e == 0)
        return bits_f32(s | f32_bits((float)m * 0x1p-16f));
    return bits_f32(s | (e + 112) << 23 | m << 21);
}

uint8_t kvp_f32_to_e2m1(float f)
{
    uint32_t x = f32_bits(f), ax = x & 0x7fffffffu, s = (x >> 28) & 0x8;
    if (ax > 0x7f800000u) /* no NaN in the format; ml_dtypes gives the other-signed zero */
        return (uint8_t)(s ^ 0x8);
    uint32_t c = mini_mag(ax, 1, 1);
    return (uint8_t)(s | (c > 7 ? 7 : c));
}

float kvp_e2m1_to_f32(uint8_t code)
{
    uint32_t s = (uint32_t)(code & 8) << 28, e = (code >> 1) & 3, m = code & 1;
    if (e == 0)
        return bits_f32(s | (m ? 0x3f000000u : 0));
    return bits_f32(s | (e + 126) << 23 | m << 22);
}

uint8_t kvp_f32_to_e8m0(float f)
{
    uint32_t x = f32_bits(f);
    if (x >= 0x7f800000u || (x & 0x7fffffffu) == 0) /* negative, inf, NaN, zero */
        return 0xff;
    uint32_t e = x >> 23;
    if (e == 0) /* f32 subnormal: 2^-127 unless it rounds (half up) to 2^-126 */
        return (uint8_t)((x & 0x7fffffu) >= 0x300000u ? 1 : 0);
    e += (x >> 22) & 1; /* mantissa >= 1.5: ties go up, as in ml_dtypes */
    return (uint8_t)(e > 254 ? 0xff : e);
}

/* ---- rows: portable ---- */

static void e4m3_row_c(const float *x, uint8_t *d, int64_t n, int sat)
{
    for (int64_t i = 0; i < n; i++)
        d[i] = sat ? kvp_f32_to_e4m3_sat(x[i]) : kvp_f32_to_e4m3(x[i]);
}

static void e5m2_row_c(const float *x, uint8_t *d, int64_t n, int sat)
{
    for (int64_t i = 0; i < n; i++)
        d[i] = sat ? kvp_f32_to_e5m2_sat(x[i]) : kvp_f32_to_e5m2(x[i]);
}

/* ---- rows: AVX2 ---- */
#if KVP_X86_SIMD
/* 8 lanes of mini_mag plus the special cases: ovf is the magnitude code for
 * overflow, nan the one for NaN, maxc the largest finite code. */
KVP_AVX2 static inline __m256i mini_enc8(__m256 v, int mbits, int bias, int maxc, int ovf, int nan, int sbit)
{
    const int sh = 23 - mbits;
    __m256i x = _mm256_castps_si256(v);
    __m256i ax = _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff));
    __m256i sign = _mm256_slli_epi32(_mm256_srli_epi32(x, 31), sbit);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(ax, sh), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(ax, _mm256_set1_epi32((1 << (sh - 1)) - 1)), lsb);
    __m256i cn = _mm256_sub_epi32(_mm256_srli_epi32(r, sh), _mm256_set1_epi32((127 - bias) << mbits));
    /* below the smallest normal: |x| * 2^(mbits + bias - 1) rounded to even */
    __m256 scaled = _mm256_mul_ps(_mm256_castsi256_ps(ax), _mm256_set1_ps(ldexpf(1.0f, mbits + bias - 1)));
    __m256i cs = _mm256_cvtps_epi32(_mm256_round_ps(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    __m256i is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32((128 - bias) << 23), ax);
    __m256i c = _mm256_blendv_epi8(cn, cs, is_sub);
    c = _mm256_blendv_epi8(c, _mm256_set1_epi32(ovf), _mm256_cmpgt_epi32(c, _mm256_set1_epi32(maxc)));
    c = _mm256_blendv_epi8(c, _mm256_set1_epi32(nan), _mm256_cmpgt_epi32(ax, _mm256_set1_epi32(0x7f800000)));
    return _mm256_or_si256(c, sign);
}

/* Low byte of each of 8 lanes to 8 consecutive bytes. */
KVP_AVX2 static inline void store8_bytes(uint8_t *d, __m256i c)
{
    const __m256i shuf = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8,
                                          12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    __m256i b = _mm256_shuffle_epi8(c, shuf);
    b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1));
    _mm_storel_epi64((__m128i *)(void *)d, _mm256_castsi256_si128(b));
}

KVP_AVX2 static void e4m3_row_avx2(const float *x, uint8_t *d, int64_t n, int sat)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        store8_bytes(d + i, mini_enc8(_mm256_loadu_ps(x + i), 3, 7, 0x7e, sat ? 0x7e : 0x7f, 0x7f, 7));
    e4m3_row_c(x + i, d + i, n - i, sat);
}

KVP_AVX2 static void e5m2_row_avx2(const float *x, uint8_t *d, int64_t n, int sat)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        store8_bytes(d + i, mini_enc8(_mm256_loadu_ps(x + i), 2, 15, 0x7b, sat ? 0x7b : 0x7c, 0x7e, 7));
    e5m2_row_c(x + i, d + i, n - i, sat);
}
#endif

void kvp_fp8_row_impl(int impl, int e5m2, int sat, const float *x, uint8_t *d, int64_t n)
{
#if KVP_X86_SIMD
    if (kvp_use_simd(impl)) {
        if (e5m2)
            e5m2_row_avx2(x, d, n, sat);
        else
            e4m3_row_avx2(x, d, n, sat);
        return;
    }
#endif
    (void)impl;
    if (e5m2)
        e5m2_row_c(x, d, n, sat);
    else
        e4m3_row_c(x, d, n, sat);
}

void kvp_quantize_row_e4m3(const float *x, void *dst, int64_t n) { kvp_fp8_row_impl(KVP_IMPL_AUTO, 0, 0, x, dst, n); }
void kvp_quantize_row_e4m3_sat(const float *x, void *dst, int64_t n) { kvp_fp8_row_impl(KVP_IMPL_AUTO, 0, 1, x, dst, n); }
void kvp_quantize_row_e5m2(const float *x, void *dst, int64_t n) { kvp_fp8_row_impl(KVP_IMPL_AUTO, 1, 0, x, dst, n); }
void kvp_quantize_row_e5m2_sat(const float *x, void *dst, int64_t n) { kvp_fp8_row_impl(KVP_IMPL_AUTO, 1, 1, x, dst, n); }

/* Table decoding: 256 entries built per call when the row is long enough to
 * pay for it (no global tables to initialize). */
static void dequant_bytes(const uint8_t *s, float *y, int64_t n, float (*dec)(uint8_t))
{
    if (n < 512) {
        for (int64_t i = 0; i < n; i++)
            y[i] = dec(s[i]);
        return;
    }
    float t[256];
    for (int i = 0; i < 256; i++)
        t[i] = dec((uint8_t)i);
    for (int64_t i = 0; i < n; i++)
        y[i] = t[s[i]];
}

void kvp_dequantize_row_e4m3(const void *src, float *y, int64_t n) { dequant_bytes(src, y, n, kvp_e4m3_to_f32); }
void kvp_dequantize_row_e5m2(const void *src, float *y, int64_t n) { dequant_bytes(src, y, n, kvp_e5m2_to_f32); }
void kvp_dequantize_row_e8m0(const void *src, float *y, int64_t n) { dequant_bytes(src, y, n, kvp_e8m0_to_f32); }

void kvp_quantize_row_e8m0(const float *x, void *dst, int64_t n)
{
    uint8_t *d = dst;
    for (int64_t i = 0; i < n; i++)
        d[i] = kvp_f32_to_e8m0(x[i]);
}

void kvp_quantize_row_e2m1(const float *x, void *dst, int64_t n)
{
    uint8_t *d = dst;
    for (int64_t i = 0; i + 1 < n; i += 2)
        d[i / 2] = (uint8_t)(kvp_f32_to_e2m1(x[i]) | kvp_f32_to_e2m1(x[i + 1]) << 4);
    if (n & 1)
        d[n / 2] = kvp_f32_to_e2m1(x[n - 1]);
}

void kvp_dequantize_row_e2m1(const void *src, float *y, int64_t n)
{
    const uint8_t *s = src;
    for (int64_t i = 0; i < n; i++)
        y[i] = kvp_e2m1_to_f32((uint8_t)(s[i / 2] >> (4 * (i & 1))));
}
