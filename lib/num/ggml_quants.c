/* ggml_quants.c - GGUF block types and the FP4 block formats (see ggml_quants.h).
 *
 * Dequantization follows gguf-py's numpy code operation for operation (f32
 * products, then the offset added), so the results are bit-identical to
 * gguf.quants.dequantize; the quantizers follow ggml's reference quantizers
 * (quantize_row_*_ref).  Blocks are read bytewise (no struct casts) so any
 * alignment works.
 */
#include "ggml_quants.h"
#include "minifloat.h"
#include "num_impl.h"

#include <math.h>
#include <string.h>

#define QK 32    /* elements per Q4_0..Q8_0 and MXFP4 block */
#define QK_K 256 /* elements per K-quant super-block */

static inline float f16le(const uint8_t *p) { return kvp_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

static inline void put_f16le(uint8_t *p, float f)
{
    uint16_t h = kvp_f32_to_f16(f);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* ---- dequantization ---- */

/* block_q4_0 (18 bytes): f16 d; 16 bytes, element j low nibble, j+16 high. */
void kvp_dequantize_row_q4_0(const void *src, float *y, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / QK; i++, b += 18, y += QK) {
        float d = f16le(b);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((b[2 + j] & 15) - 8);
            y[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
        }
    }
}

/* block_q4_1 (20 bytes): f16 d, f16 m, 16 bytes of nibbles; y = d q + m. */
void kvp_dequantize_row_q4_1(const void *src, float *y, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / QK; i++, b += 20, y += QK) {
        float d = f16le(b), m = f16le(b + 2);
        for (int j = 0; j < 16; j++) {
            float p0 = d * (float)(b[4 + j] & 15), p1 = d * (float)(b[4 + j] >> 4);
            y[j] = p0 + m;
            y[j + 16] = p1 + m;
        }
    }
}

/* block_q5_0 (22 bytes): f16 d, u32 qh (bit j = 5th bit of element j),
 * 16 bytes of low nibbles; y = d (q - 16). */
void kvp_dequantize_row_q5_0(const void *src, float *y, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / QK; i++, b += 22, y += QK) {
        float d = f16le(b);
        uint8_t q[QK];
        kvp_q5_codes(b + 2, b + 6, q);
        for (int j = 0; j < QK; j++)
            y[j] = d * (float)(q[j] - 16);
    }
}

/* block_q5_1 (24 bytes): f16 d, f16 m, u32 qh, 16 bytes; y = d q + m. */
void kvp_dequantize_row_q5_1(const void *src, float *y, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / QK; i++, b += 24, y += QK) {
        float d = f16le(b), m = f16le(b + 2);
        uint8_t q[QK];
        kvp_q5_codes(b + 4, b + 8, q);
        for (int j = 0; j < QK; j++) {
            float p = d * (float)q[j];
            y[j] = p + m;
        }
    }
}

/* block_q8_0 (34 bytes): f16 d, 32 x i8; y = q d. */
void kvp_dequantize_row_q8_0(const void *src, float *y, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / QK; i++, b += 34, y += QK) {
        float d = f16le(b);
        for (int j = 0; j < QK; j++)
            y[j] = (float)(int8_t)b[2 + j] * d;
    }
}

/* block_q4_K (144 bytes): f16 d, f16 dmin, 12 bytes scales, 128 bytes of
 * nibbles: 64-element chunks, element l of chunk c in the low nibble of byte
 * 32c+l (sub-block 2c) or its high nibble (l-32, sub-block 2c+1).
 * y = (d sc) q - (dmin m). */
void kvp_dequantize_row_q4_k(const void *src, float *y, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b += 144, y += QK_K) {
        float d = f16le(b), dmin = f16le(b + 2);
        const uint8_t *sc = b + 4, *q = b + 16;
        for (int j = 0; j < 8; j++) {
            int s, m;
            kvp_q4k_scale_min(sc, j, &s, &m);
            float dl = d * (float)s, ml = dmin * (float)m;
            const uint8_t *qq = q + 32 * (j / 2);
            int shift = 4 * (j & 1);
            for (int l = 0; l < 32; l++) {
                float p = dl * (float)((qq[l] >> shift) & 15);
                y[32 * j + l] = p - ml;
            }
        }
    }
}

void kvp_q6k_codes(const uint8_t *b, uint8_t q[256])
{
    const uint8_t *ql = b, *qh = b + 128;
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 4; k++) {
            const uint8_t *lo = ql + 64 * h + 32 * (k & 1), *hi = qh + 32 * h;
            int ls = 4 * (k >> 1), hs = 2 * k;
            for (int l = 0; l < 32; l++)
                q[128 * h + 32 * k + l] = (uint8_t)(((lo[l] >> ls) & 15) | ((hi[l] >> hs) & 3) << 4);
        }
}

void kvp_q5k_codes(const uint8_t *b, uint8_t q[256])
{
    const uint8_t *qh = b + 16, *qs = b + 48;
    for (int j = 0; j < 8; j++) {
        const uint8_t *qq = qs + 32 * (j / 2);
        int shift = 4 * (j & 1);
        for (int l = 0; l < 32; l++)
            q[32 * j + l] = (uint8_t)(((qq[l] >> shift) & 15) | ((qh[l] >> j) & 1) << 4);
    }
}

/* block_q5_K (kvp_q5k_codes): y = (d sc) q - (dmin m), Q4_K's arithmetic. */
void kvp_dequantize_row_q5_k(const void *src, float *y, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b += 176, y += QK_K) {
        float d = f16le(b), dmin = f16le(b + 2);
        uint8_t q[QK_K];
        kvp_q5k_codes(b, q);
        for (int j = 0; j < 8; j++) {
            int s, m;
            kvp_q4k_scale_min(b + 4, j, &s, &m);
            float dl = d * (float)s, ml = dmin * (float)m;
            for (int l = 0; l < 32; l++) {
                float p = dl * (float)q[32 * j + l];
                y[32 * j + l] = p - ml;
            }
        }
    }
}

void kvp_q2k_codes(const uint8_t *b, uint8_t q[256])
{
    const uint8_t *qs = b + 16;
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < 32; l++)
                q[128 * h + 32 * k + l] = (uint8_t)((qs[32 * h + l] >> (2 * k)) & 3);
}

/* block_q2_K (kvp_q2k_codes): y = (d sc) q - (dmin m) a sub-block of 16. */
void kvp_dequantize_row_q2_k(const void *src, float *y, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b += 84, y += QK_K) {
        float d = f16le(b + 80), dmin = f16le(b + 82);
        uint8_t q[QK_K];
        kvp_q2k_codes(b, q);
        for (int s = 0; s < 16; s++) {
            float dl = d * (float)(b[s] & 15), ml = dmin * (float)(b[s] >> 4);
            for (int l = 0; l < 16; l++) {
                float p = dl * (float)q[16 * s + l];
                y[16 * s + l] = p - ml;
            }
        }
    }
}

void kvp_q3k_codes(const uint8_t *b, uint8_t q[256])
{
    const uint8_t *hm = b, *qs = b + 32;
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < 32; l++) {
                int e = 128 * h + 32 * k + l;
                q[e] = (uint8_t)(((qs[32 * h + l] >> (2 * k)) & 3) | ((hm[l] >> (e / 32)) & 1) << 2);
            }
}

/* Scale i's low 4 bits are nibble i / 8 of byte i % 8, its high 2 bits
 * bits 2 (i / 4) of byte 8 + i % 4 (gguf-py's unpacking). */
void kvp_q3k_scales(const uint8_t *b, int8_t sc[16])
{
    const uint8_t *s = b + 96;
    for (int i = 0; i < 16; i++) {
        int lo = (s[i % 8] >> (4 * (i / 8))) & 15, hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        sc[i] = (int8_t)((lo | hi << 4) - 32);
    }
}

/* block_q3_K (kvp_q3k_codes): y = (d (s - 32)) (c - 4) a sub-block of 16. */
void kvp_dequantize_row_q3_k(const void *src, float *y, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b += 110, y += QK_K) {
        float d = f16le(b + 108);
        uint8_t q[QK_K];
        int8_t sc[16];
        kvp_q3k_codes(b, q);
        kvp_q3k_scales(b, sc);
        for (int e = 0; e < QK_K; e++) {
            float dl = d * (float)sc[e / 16];
            y[e] = dl * (float)(q[e] - 4);
        }
    }
}

/* block_q6_K (kvp_q6k_codes): y = (d scale[element / 16]) (q - 32). */
void kvp_dequantize_row_q6_k(const void *src, float *y, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b += 210, y += QK_K) {
        const int8_t *sc = (const int8_t *)(b + 192);
        float d = f16le(b + 208);
        uint8_t q[QK_K];
        kvp_q6k_codes(b, q);
        for (int e = 0; e < QK_K; e++) {
            float ds = d * (float)sc[e / 16];
            y[e] = ds * (float)(q[e] - 32);
        }
    }
}

/* llama.cpp's kvalues_iq4nl: the 16 values a 4-bit IQ4 index selects. */
const int8_t kvp_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

void kvp_iq4_codes(const uint8_t *qs, int8_t c[32])
{
    for (int j = 0; j < 16; j++) {
        c[j] = kvp_iq4nl_values[qs[j] & 15];
        c[j + 16] = kvp_iq4nl_values[qs[j] >> 4];
    }
}

int kvp_iq4xs_scale(const uint8_t *b, int j)
{
    int lo = (b[4 + j / 2] >> (4 * (j % 2))) & 15, hi = ((b[2] | b[3] << 8) >> (2 * j)) & 3;
    return (lo | hi << 4) - 32;
}

/* block_iq4_nl (18 bytes): f16 d; 16 bytes of indices as Q4_0's nibbles;
 * y = d v[q]. */
void kvp_dequantize_row_iq4_nl(const void *src, float *y, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / QK; i++, b += 18, y += QK) {
        float d = f16le(b);
        int8_t c[QK];
        kvp_iq4_codes(b + 2, c);
        for (int j = 0; j < QK; j++)
            y[j] = d * (float)c[j];
    }
}

/* block_iq4_xs (136 bytes, kvp_iq4xs_scale): y = (d (ls - 32)) v[q] a
 * sub-block of 32 (gguf-py's dl, then the product). */
void kvp_dequantize_row_iq4_xs(const void *src, float *y, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b += 136) {
        float d = f16le(b);
        for (int j = 0; j < 8; j++, y += QK) {
            float dl = d * (float)kvp_iq4xs_scale(b, j);
            int8_t c[QK];
            kvp_iq4_codes(b + 8 + 16 * j, c);
            for (int e = 0; e < QK; e++)
                y[e] = dl * (float)c[e];
        }
    }
}

/* E2M1 code to f32 with -0 read as +0, as ggml's table of values does
 * (the gguf package's: test_quant's ggml_deq goldens, bit for bit). */
static const float fp4_values[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                     0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
static inline float fp4v(int q) { return fp4_values[q & 15]; }

/* block_mxfp4 (17 bytes): E8M0 e, 16 bytes of E2M1 codes (j low, j+16 high). */
void kvp_dequantize_row_mxfp4(const void *src, float *y, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / QK; i++, b += 17, y += QK) {
        float d = kvp_e8m0_to_f32(b[0]);
        for (int j = 0; j < 16; j++) {
            y[j] = fp4v(b[1 + j] & 15) * d;
            y[j + 16] = fp4v(b[1 + j] >> 4) * d;
        }
    }
}

/* nvfp4 (9 bytes): E4M3 scale, 8 bytes of E2M1 codes (j low, j+8 high). */
void kvp_dequantize_row_nvfp4_g(const void *src, float *y, int64_t n, float global)
{
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / 16; i++, b += 9, y += 16) {
        float d = kvp_e4m3_to_f32(b[0]);
        for (int j = 0; j < 8; j++) {
            float p0 = fp4v(b[1 + j] & 15) * d, p1 = fp4v(b[1 + j] >> 4) * d;
            y[j] = p0 * global;
            y[j + 8] = p1 * global;
        }
    }
}

void kvp_dequantize_row_nvfp4(const void *src, float *y, int64_t n) { kvp_dequantize_row_nvfp4_g(src, y, n, 1.0f); }

/* ---- quantization (ggml's reference rules) ---- */

void kvp_quantize_row_q8_0(const float *x, void *dst, int64_t n)
{
    uint8_t *b = dst;
    for (int64_t i = 0; i < n / QK; i++, b += 34, x += QK) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        put_f16le(b, d);
        for (int j = 0; j < QK; j++)
        {
            float v = roundf(x[j] * id); /* in [-127, 127]; NaN -> 0 */
            b[2 + j] = (uint8_t)(int8_t)(v == v ? (int)v : 0);
        }
    }
}

/* The signed value of largest magnitude (first one on ties), as ggml keeps it. */
static float signed_absmax(const float *x, int n)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    return max;
}

static void minmax(const float *x, int n, float *mn, float *mx)
{
    float lo = INFINITY, hi = -INFINITY;
    for (int j = 0; j < n; j++) {
        lo = x[j] < lo ? x[j] : lo;
        hi = x[j] > hi ? x[j] : hi;
    }
    *mn = lo;
    *mx = hi;
}

/* ggml truncates v (>= 0 for finite input) through int8_t and caps it at hi;
 * NaN (which ggml leaves undefined) gives 0 here. */
static inline int trunc_clamp(float v, int hi)
{
    if (!(v >= 0.0f))
        return 0;
    return v >= (float)hi ? hi : (int)v;
}

void kvp_quantize_row_q4_0(const float *x, void *dst, int64_t n)
{
    uint8_t *b = dst;
    for (int64_t i = 0; i < n / QK; i++, b += 18, x += QK) {
        float d = signed_absmax(x, QK) / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        put_f16le(b, d);
        for (int j = 0; j < 16; j++) {
            int q0 = trunc_clamp(x[j] * id + 8.5f, 15), q1 = trunc_clamp(x[j + 16] * id + 8.5f, 15);
            b[2 + j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

void kvp_quantize_row_q4_1(const float *x, void *dst, int64_t n)
{
    uint8_t *b = dst;
    for (int64_t i = 0; i < n / QK; i++, b += 20, x += QK) {
        float mn, mx;
        minmax(x, QK, &mn, &mx);
        float d = (mx - mn) / 15.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        put_f16le(b, d);
        put_f16le(b + 2, mn);
        for (int j = 0; j < 16; j++) {
            int q0 = trunc_clamp((x[j] - mn) * id + 0.5f, 15), q1 = trunc_clamp((x[j + 16] - mn) * id + 0.5f, 15);
            b[4 + j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

static void put_q5(uint8_t *qh4, uint8_t *qs, const int *q)
{
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 15) | (q[j + 16] & 15) << 4);
        qh |= (uint32_t)((q[j] >> 4) & 1) << j | (uint32_t)((q[j + 16] >> 4) & 1) << (j + 16);
    }
    for (int k = 0; k < 4; k++)
        qh4[k] = (uint8_t)(qh >> (8 * k));
}

void kvp_quantize_row_q5_0(const float *x, void *dst, int64_t n)
{
    uint8_t *b = dst;
    int q[QK];
    for (int64_t i = 0; i < n / QK; i++, b += 22, x += QK) {
        float d = signed_absmax(x, QK) / -16.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        put_f16le(b, d);
        for (int j = 0; j < QK; j++)
            q[j] = trunc_clamp(x[j] * id + 16.5f, 31);
        put_q5(b + 2, b + 6, q);
    }
}

void kvp_quantize_row_q5_1(const float *x, void *dst, int64_t n)
{
    uint8_t *b = dst;
    int q[QK];
    for (int64_t i = 0; i < n / QK; i++, b += 24, x += QK) {
        float mn, mx;
        minmax(x, QK, &mn, &mx);
        float d = (mx - mn) / 31.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        put_f16le(b, d);
        put_f16le(b + 2, mn);
        for (int j = 0; j < QK; j++)
            q[j] = trunc_clamp((x[j] - mn) * id + 0.5f, 31);
        put_q5(b + 4, b + 8, q);
    }
}

/* E2M1's magnitudes doubled, as ggml's kvalues_mxfp4 holds them (its scale
 * is halved to match): whole numbers, so k * d below is exact. */
static const float mxfp4_mag2[8] = {0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 6.0f, 8.0f, 12.0f};

/* ggml's shared exponent floor(log2(amax)) - 2 + 127, with log2 rounded to
 * f32 before the floor: an amax a few ulps below a power of two takes the
 * exponent above (just below 8 gives 128, not 127).  log2 in double rounded
 * to f32 is the correctly rounded f32 log2, the integer glibc's log2f and
 * numpy's float32 log2 give on every float near a power of two.  Below
 * 2^-125 ggml's cast to uint8_t is undefined (gguf-py wraps to 0xff, a NaN
 * scale); we clamp to 0 there. */
static uint8_t mxfp4_exponent(float amax)
{
    int e = (int)floorf((float)log2((double)amax)) - 2 + 127;
    return (uint8_t)(e < 0 ? 0 : e);
}

/* ggml's best_index_mxfp4 over x's magnitude a: the first code of the
 * doubled table whose error |k d - a|, rounded to f32, is least, so a value
 * halfway between two codes takes the smaller magnitude (7 -> 6, 1.5 -> 1
 * at d = 1), not the even one.  ggml scans all 16 codes against x; a code
 * of the other sign is never closer (its exact error is no smaller, and
 * rounding keeps that order), and of the two zeros the first (+0) wins, so
 * the sign goes on afterwards. */
static uint8_t mxfp4_code(float x, float d)
{
    float a = fabsf(x), best_err = a;
    int best = 0;
    for (int k = 1; k < 8; k++) {
        float err = fabsf(mxfp4_mag2[k] * d - a);
        if (err < best_err) {
            best = k;
            best_err = err;
        }
    }
    return (uint8_t)(best && x < 0.0f ? best | 8 : best);
}

int64_t kvp_quantize_row_mxfp4(const float *x, void *dst, int64_t n)
{
    uint8_t *b = dst;
    int64_t clipped = 0;
    for (int64_t i = 0; i < n / QK; i++, b += 17, x += QK) {
        float amax = 0.0f;
        int finite = 1;
        for (int j = 0; j < QK; j++) {
            amax = fmaxf(amax, fabsf(x[j]));
            finite &= isfinite(x[j]) != 0;
        }
        memset(b, 0, 17);
        if (!finite) {
            b[0] = 0xff;
            continue;
        }
        if (amax == 0.0f)
            continue;
        b[0] = mxfp4_exponent(amax);
        float d = ldexpf(1.0f, b[0] - 128); /* 2^(e - 127) halved, for the doubled table; exact */
        for (int j = 0; j < QK; j++) {
            clipped += fabsf(x[j]) > 14.0f * d; /* nearer 8 than 6: beyond the table */
            uint8_t c = mxfp4_code(x[j], d);
            b[1 + j % 16] |= (uint8_t)(j < 16 ? c : c << 4);
        }
    }
    return clipped;
}

int64_t kvp_quantize_row_nvfp4(const float *x, void *dst, int64_t n, float global)
{
    uint8_t *b = dst;
    int64_t clipped = 0;
    for (int64_t i = 0; i < n / 16; i++, b += 9, x += 16) {
        float amax = 0.0f;
        for (int j = 0; j < 16; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        memset(b, 0, 9);
        uint8_t s = kvp_f32_to_e4m3_sat(amax / (6.0f * global));
        b[0] = s & 0x7f; /* a NaN amax keeps the NaN code */
        float d = kvp_e4m3_to_f32(b[0]) * global;
        float inv = d != 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < 16; j++) {
            float v = x[j] * inv;
            clipped += fabsf(v) >= 7.0f;
            uint8_t c = kvp_f32_to_e2m1(v) & 15;
            c = c == 8 ? 0 : c;
            b[1 + j % 8] |= (uint8_t)(j < 8 ? c : c << 4);
        }
    }
    return clipped;
}
