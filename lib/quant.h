/* quant.h - low-precision number formats, scaled quantization and the error
 * it introduces.
 *
 * Three layers:
 *  1. Casts (minifloat.c): f32 <-> FP8 E4M3fn, FP8 E5M2, FP4 E2M1, E8M0, bit
 *     exact with ml_dtypes (float8_e4m3fn, float8_e5m2, float4_e2m1fn,
 *     float8_e8m0fnu) for every f32 that is not an f32 subnormal.  Round to
 *     nearest even.  The plain casts overflow the way ml_dtypes does (E4M3fn
 *     to NaN, E5M2 to inf, E2M1 saturates); the _sat casts clamp to the
 *     largest finite value (what scaled quantization wants).
 *  2. Block types (ggml_quants.c): GGUF's Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K,
 *     Q6_K dequantized bit-exactly like gguf-py; Q8_0, Q4_0, Q4_1, Q5_0, Q5_1
 *     quantized like ggml's reference quantizers; NVFP4 and MXFP4 blocks.
 *  3. Scaled quantization of a tensor (quant.c): int8/int4 (symmetric or
 *     asymmetric), fp8, fp4 with one f32 scale per tensor, per channel or per
 *     group, and the self-scaled block types, producing exactly the data,
 *     scales and zeros parts of a KVP tensor record (kvp_tensor_rec).
 *
 * Layouts (the bytes of a KVP tensor record's data part):
 *  - i8: one two's complement byte per element.
 *  - i4, fp4_e2m1: two per byte, element 2k in the low nibble of byte k, 2k+1
 *    in the high nibble (an odd count leaves the last high nibble 0).  i4 is
 *    two's complement [-8, 7].
 *  - mxfp4 (32 elements, 17 bytes; ggml's block_mxfp4): byte 0 the E8M0
 *    scale, bytes 1..16 the E2M1 codes, element j (j < 16) in the low nibble
 *    of byte 1+j and element j+16 in its high nibble.
 *    y = e2m1(q) * 2^(e - 127).
 *  - nvfp4 (16 elements, 9 bytes; one sub-block of ggml's block_nvfp4): byte 0
 *    the E4M3fn block scale (positive), bytes 1..8 the E2M1 codes, element j
 *    (j < 8) in the low nibble of byte 1+j, element j+8 in its high nibble.
 *    y = e2m1(q) * e4m3(s) * global_scale (the record's f32 tensor scale).
 *  - Scales of the TENSOR/CHANNEL/GROUP schemes: one value per "scale unit",
 *    a contiguous run of elements in storage order: the whole tensor
 *    (TENSOR), numel/shape[0] elements (CHANNEL: one per output row of a
 *    [out, in] weight), or `group` elements along the last dimension (GROUP;
 *    group divides shape[n_dim-1]).  Scales are f32 (or f16/bf16 when
 *    scale_dtype says so), little-endian, in unit order.
 *  - Zero points (flag KVP_TENSOR_ASYM, integer dtypes only): the same count
 *    and dtype as the scales, each an integer value within the q range, so
 *    y = (q - z) * s and x = 0 is represented exactly.
 */
#ifndef KVP_QUANT_H
#define KVP_QUANT_H

#include "error.h"
#include "stream.h"
#include "tensor.h"
#include "threadpool.h"

#include <stdint.h>

/* Which code path: AUTO uses AVX2/F16C when the CPU has it; PORTABLE forces
 * plain C (tests check that both give identical bytes). */
enum { KVP_IMPL_AUTO = 0, KVP_IMPL_PORTABLE = 1, KVP_IMPL_SIMD = 2 /* already checked: the CPU has it */ };

/* 1 when this CPU and build can run the AVX2/FMA/F16C paths. */
int kvp_have_avx2(void);

/* f16 rows with the code path chosen (F16C or portable; tensor.c). */
void kvp_f16_row_to_f32(int impl, const void *src, float *dst, int64_t n);
void kvp_f16_row_from_f32(int impl, const float *src, void *dst, int64_t n);

/* ---- scalar casts (minifloat.c) ---- */

uint8_t kvp_f32_to_e4m3(float f);     /* NaN 0x7f/0xff; |x| > 464 and inf -> NaN */
uint8_t kvp_f32_to_e4m3_sat(float f); /* overflow and inf -> +-448 */
float kvp_e4m3_to_f32(uint8_t b);
uint8_t kvp_f32_to_e5m2(float f);     /* overflow -> inf, NaN 0x7e/0xfe */
uint8_t kvp_f32_to_e5m2_sat(float f); /* overflow and inf -> +-57344 */
float kvp_e5m2_to_f32(uint8_t b);
uint8_t kvp_f32_to_e2m1(float f);     /* 4-bit code; saturates at +-6 (the format has no inf/NaN) */
float kvp_e2m1_to_f32(uint8_t code);  /* low nibble used */
uint8_t kvp_f32_to_e8m0(float f);     /* nearest power of two, ties up; <= 0, inf, NaN -> 0xff */
float kvp_e8m0_to_f32(uint8_t b);     /* 2^(b-127); 0xff is NaN */

/* Row conversions (n elements; packed 4-bit rows hold (n+1)/2 bytes).  These
 * are the dtype traits' to_f32/from_f32 and use AVX2/F16C when the CPU has
 * it, with results identical to the portable code. */
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
/* Plain integer casts: round to nearest even, saturating, NaN -> 0. */
void kvp_quantize_row_i8(const float *x, void *dst, int64_t n);
void kvp_dequantize_row_i8(const void *src, float *y, int64_t n);
void kvp_quantize_row_i4(const float *x, void *dst, int64_t n);
void kvp_dequantize_row_i4(const void *src, float *y, int64_t n);
void kvp_quantize_row_u8(const float *x, void *dst, int64_t n);
void kvp_dequantize_row_u8(const void *src, float *y, int64_t n);
void kvp_quantize_row_u4(const float *x, void *dst, int64_t n);
void kvp_dequantize_row_u4(const void *src, float *y, int64_t n);

/* ---- block types (ggml_quants.c); n is a multiple of the block size ---- */

void kvp_dequantize_row_q4_0(const void *src, float *y, int64_t n);
void kvp_dequantize_row_q4_1(const void *src, float *y, int64_t n);
void kvp_dequantize_row_q5_0(const void *src, float *y, int64_t n);
void kvp_dequantize_row_q5_1(const void *src, float *y, int64_t n);
void kvp_dequantize_row_q8_0(const void *src, float *y, int64_t n);
void kvp_dequantize_row_q4_k(const void *src, float *y, int64_t n);
void kvp_dequantize_row_q6_k(const void *src, float *y, int64_t n);
void kvp_dequantize_row_mxfp4(const void *src, float *y, int64_t n);
void kvp_dequantize_row_nvfp4(const void *src, float *y, int64_t n); /* global scale 1 */
void kvp_quantize_row_q4_0(const float *x, void *dst, int64_t n);
void kvp_quantize_row_q4_1(const float *x, void *dst, int64_t n);
void kvp_quantize_row_q5_0(const float *x, void *dst, int64_t n);
void kvp_quantize_row_q5_1(const float *x, void *dst, int64_t n);
void kvp_quantize_row_q8_0(const float *x, void *dst, int64_t n);
/* MXFP4 (OCP MX v1.0): shared exponent floor(log2(amax)) - 2 (E2M1's emax),
 * elements cast round-to-nearest-even and clamped to +-6.  An all-zero block
 * gets exponent 0 (y = 0); a block with inf/NaN gets the NaN scale 0xff.
 * Returns the count of elements clamped. */
int64_t kvp_quantize_row_mxfp4(const float *x, void *dst, int64_t n);
/* NVFP4: block scale e4m3_sat(amax / (6 * global)), elements
 * e2m1(x / (scale * global)).  global > 0 (1 for the trait).  Returns the
 * count of elements clamped. */
int64_t kvp_quantize_row_nvfp4(const float *x, void *dst, int64_t n, float global);
void kvp_dequantize_row_nvfp4_g(const void *src, float *y, int64_t n, float global);

/* ---- error statistics ---- */

typedef struct kvp_quant_stats {
    uint64_t n;            /* values compared */
    uint64_t n_clipped;    /* values beyond the format's range that saturated */
    uint64_t n_nonfinite;  /* non-finite originals (skipped in the sums) */
    double sum_sq_err;     /* sum (x - y)^2 */
    double sum_sq_ref;     /* sum x^2 */
    double max_abs_err;
} kvp_quant_stats;

typedef struct kvp_quant_report {
    double rmse;           /* sqrt(mean (x - y)^2) */
    double rel_err;        /* ||x - y|| / ||x|| (0 when x = 0) */
    double snr_db;         /* 10 log10(||x||^2 / ||x - y||^2); +inf when exact */
    double max_abs_err;
    double clipped;        /* share of values clipped, 0..1 */
} kvp_quant_report;

/* Add the differences between originals x and reconstructions y. */
void kvp_quant_stats_add(kvp_quant_stats *st, const float *x, const float *y, int64_t n);
void kvp_quant_stats_merge(kvp_quant_stats *into, const kvp_quant_stats *from);
void kvp_quant_stats_report(const kvp_quant_stats *st, kvp_quant_report *r);

/* ---- scaled quantization of tensors (quant.c) ---- */

typedef struct kvp_quant_spec {
    uint32_t dtype;        /* target kvp_dtype */
    uint32_t scheme;       /* kvp_scheme; NONE for plain casts and block types */
    uint32_t group;        /* GROUP: elements per scale (32, 64, 128, ...) */
    uint32_t scale_dtype;  /* f32 (0 means f32), f16 or bf16 */
    int asym;              /* integer targets: zero points (KVP_TENSOR_ASYM) */
} kvp_quant_spec;

/* Fill rec's dtype, scheme, group, scale_dtype, flags, global_scale 1 and the
 * three byte counts for quantizing a tensor of rec->n_dim/rec->shape (set by
 * the caller, like name) per spec.  0, or KVP_EINVAL / KVP_EUNSUPPORTED with a
 * message naming the tensor (group not dividing the row, a scheme the dtype
 * cannot take, asym on a float type). */
int kvp_quant_plan(kvp_tensor_rec *rec, const kvp_quant_spec *spec, kvp_err *err);

/* Quantize numel(rec) f32 values x (storage order) into data/scales/zeros of
 * the sizes rec gives (scales/zeros may be NULL when those sizes are 0).  Sets
 * rec->global_scale for NVFP4.  st (may be NULL) gets the error statistics of
 * the reconstruction.  pool may be NULL. */
int kvp_quant_tensor(kvp_tensor_rec *rec, const float *x, void *data, void *scales, void *zeros,
                     kvp_quant_stats *st, kvp_threadpool *pool, kvp_err *err);

/* The same with the code path chosen (KVP_IMPL_*), for tests. */
int kvp_quant_tensor_impl(int impl, kvp_tensor_rec *rec, const float *x, void *data, void *scales, void *zeros,
                          kvp_quant_stats *st, kvp_threadpool *pool, kvp_err *err);

/* Reconstruct f32 values of a tensor record: y holds numel(rec) values. */
int kvp_dequant_tensor(const kvp_tensor_rec *rec, const void *data, const void *scales, const void *zeros,
                       float *y, kvp_threadpool *pool, kvp_err *err);

/* Plain conversion of n elements of any dtype with a to_f32 to any dtype with
 * a from_f32 (f16 -> bf16, q4_1 -> f32, ...). */
int kvp_quant_convert(uint32_t from, const void *src, uint32_t to, void *dst, int64_t n, kvp_err *err);

/* ---- KV blocks (quant_kv.c) ----
 * A KV block payload is, for each layer in [layer_begin, layer_end), K then V,
 * each n_head_kv x block_size x head_dim elements of b->dtype; only the first
 * n_tokens slots of each head are meaningful (the rest are written as 0).
 * fp8_e4m3 and i8 blocks carry one f32 scale per (layer, K/V, head), in that
 * order: scale = amax / 448 (fp8) or amax / 127 (i8) over the head's filled
 * slots; f32, f16, bf16 blocks carry none (scale_dtype 0, or scales of 1). */

/* Set dst to src converted to dtype: dtype, scale_dtype, data_bytes and
 * scales_bytes; the rest copied.  KVP_EUNSUPPORTED for other dtypes. */
int kvp_quant_kv_plan(const kvp_kvblock_rec *src, uint32_t dtype, kvp_kvblock_rec *dst, kvp_err *err);
/* Convert a payload planned with kvp_quant_kv_plan.  src_scales may be NULL
 * when src has none; dst_scales may be NULL when dst has none.  st (may be
 * NULL) gets the error over the filled slots. */
int kvp_quant_kv_convert(const kvp_kvblock_rec *src, const void *src_data, const void *src_scales,
                         const kvp_kvblock_rec *dst, void *dst_data, void *dst_scales, kvp_quant_stats *st,
                         kvp_err *err);

#endif
