/* ggml_quants.h - GGUF's block types and the FP4 block formats.
 *
 * GGUF's Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, IQ4_NL, IQ4_XS dequantized bit-exactly like
 * gguf-py; Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 quantized like ggml's reference
 * quantizers; NVFP4 and MXFP4 blocks (layouts in quant.h).
 */
#ifndef KVP_GGML_QUANTS_H
#define KVP_GGML_QUANTS_H

#include <stdint.h>

/* n is a multiple of the block size. */
void kvp_dequantize_row_q4_0(const void *src, float *y, int64_t n);
void kvp_dequantize_row_q4_1(const void *src, float *y, int64_t n);
void kvp_dequantize_row_q5_0(const void *src, float *y, int64_t n);
void kvp_dequantize_row_q5_1(const void *src, float *y, int64_t n);
void kvp_dequantize_row_q8_0(const void *src, float *y, int64_t n);
void kvp_dequantize_row_q4_k(const void *src, float *y, int64_t n);
void kvp_dequantize_row_q2_k(const void *src, float *y, int64_t n);
void kvp_dequantize_row_q3_k(const void *src, float *y, int64_t n);
void kvp_dequantize_row_q5_k(const void *src, float *y, int64_t n);
void kvp_dequantize_row_q6_k(const void *src, float *y, int64_t n);
/* A Q5_0/Q5_1 block's 32 codes (0..31): element j's low 4 bits are nibble
 * j % 16 of qs (low for j < 16, high after), its fifth bit is bit j of the
 * little-endian u32 at qh.  The dequantizers and the CPU backend's Q5_0 to
 * Q8_0 rewrite read blocks through it. */
static inline void kvp_q5_codes(const uint8_t *qh, const uint8_t *qs, uint8_t q[32])
{
    uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
    for (int j = 0; j < 16; j++) {
        q[j] = (uint8_t)((qs[j] & 15) | ((h >> j) & 1) << 4);
        q[j + 16] = (uint8_t)((qs[j] >> 4) | ((h >> (j + 16)) & 1) << 4);
    }
}
/* Q4_K's 12 bytes s of packed 6-bit scales and mins: sub-block j's (< 8).
 * Inline: the CPU backend's row decoder calls it every 32 elements. */
static inline void kvp_q4k_scale_min(const uint8_t *s, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}
/* A Q6_K super-block's (210 bytes: 128 ql, 64 qh, 16 int8 scales, f16 d)
 * 256 codes q (0..63, y = d scale[e / 16] (q - 32)) in element order:
 * element l (< 32) of quarter k of half h has the nibble k / 2 of ql[64h
 * + l + 32 (k & 1)] and bits 2k of qh[32h + l].  The dequantizer and the
 * CPU backend's rows of 16 read super-blocks through it. */
void kvp_q6k_codes(const uint8_t *b, uint8_t q[256]);
/* A Q5_K super-block's (176 bytes: f16 d, f16 dmin, Q4_K's 12 bytes of
 * 6-bit scales and minimums, 32 bytes qh, 128 qs) 256 codes q (0..31, y =
 * (d sc) q - dmin m for sub-block e / 32) in element order: element l of
 * sub-block j has the nibble j % 2 of qs[32 (j / 2) + l] and bit j of
 * qh[l]. */
void kvp_q5k_codes(const uint8_t *b, uint8_t q[256]);
/* A Q2_K super-block's (84 bytes: 16 bytes of 4-bit scale | 4-bit minimum
 * << 4 a sub-block of 16, 64 bytes qs, f16 d, f16 dmin) 256 codes (0..3,
 * y = (d sc) q - (dmin m)): element l (< 32) of quarter k of half h is
 * bits 2k of qs[32h + l]. */
void kvp_q2k_codes(const uint8_t *b, uint8_t q[256]);
/* A Q3_K super-block's (110 bytes: 32 bytes hmask, 64 qs, 12 bytes of
 * packed 6-bit scales, f16 d) 256 codes c (0..7, y = (d (s - 32)) (c - 4)):
 * the low two bits as Q2_K's from qs, the third bit j of hmask[l] for
 * element 32j + l; and its 16 scales s - 32 (sub-blocks of 16). */
void kvp_q3k_codes(const uint8_t *b, uint8_t q[256]);
void kvp_q3k_scales(const uint8_t *b, int8_t sc[16]);
/* IQ4_NL and IQ4_XS: 4-bit indices into llama.cpp's kvalues_iq4nl
 * (kvp_iq4nl_values), a block of 32's 16 bytes holding element j in the
 * low nibble of byte j and element j + 16 in its high one.  IQ4_NL (18
 * bytes): f16 d, the 16 bytes; y = d v[q].  IQ4_XS (136 bytes a
 * super-block of 256): f16 d, u16 scales_h, 4 bytes scales_l, 8 x 16
 * bytes of indices; sub-block j's 6-bit ls is nibble j % 2 of scales_l[j /
 * 2] with bits 2j of scales_h above it, y = (d (ls - 32)) v[q]. */
extern const int8_t kvp_iq4nl_values[16];
void kvp_dequantize_row_iq4_nl(const void *src, float *y, int64_t n);
void kvp_dequantize_row_iq4_xs(const void *src, float *y, int64_t n);
/* A block's 32 values v[q] from its 16 bytes of indices. */
void kvp_iq4_codes(const uint8_t *qs, int8_t c[32]);
/* IQ4_XS super-block b's sub-block j (< 8) scale, ls - 32 (-32..31). */
int kvp_iq4xs_scale(const uint8_t *b, int j);
void kvp_dequantize_row_mxfp4(const void *src, float *y, int64_t n);
void kvp_dequantize_row_nvfp4(const void *src, float *y, int64_t n); /* global scale 1 */
void kvp_quantize_row_q4_0(const float *x, void *dst, int64_t n);
void kvp_quantize_row_q4_1(const float *x, void *dst, int64_t n);
void kvp_quantize_row_q5_0(const float *x, void *dst, int64_t n);
void kvp_quantize_row_q5_1(const float *x, void *dst, int64_t n);
void kvp_quantize_row_q8_0(const float *x, void *dst, int64_t n);
/* MXFP4 (OCP MX v1.0) as ggml's quantize_row_mxfp4_ref writes it, byte for
 * byte: shared exponent floor(log2f(amax)) - 2 (E2M1's emax), each element
 * the nearest E2M1 value, a tie to the smaller magnitude (ggml keeps the
 * first of two equally close codes; not round-to-nearest-even), clamped to
 * +-6.  An all-zero block gets exponent 0 (y = 0), as does an amax below
 * 2^-125 (where ggml's exponent is undefined); a block with inf/NaN gets the
 * NaN scale 0xff.  Returns the count of elements clamped (|x| beyond 7
 * times the scale). */
int64_t kvp_quantize_row_mxfp4(const float *x, void *dst, int64_t n);
/* NVFP4: block scale e4m3_sat(amax / (6 * global)), elements
 * e2m1(x / (scale * global)).  global > 0 (1 for the trait).  Returns the
 * count of elements clamped. */
int64_t kvp_quantize_row_nvfp4(const float *x, void *dst, int64_t n, float global);
void kvp_dequantize_row_nvfp4_g(const void *src, float *y, int64_t n, float global);

#endif
