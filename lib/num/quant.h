/* quant.h - low-precision number formats, scaled quantization and the error
 * it introduces.
 *
 * The numeric layer builds up in three steps, each on the one before:
 *  1. Casts: minifloat.h (f16, bf16, FP8, FP4, E8M0) and intcast.h (int8/4).
 *  2. Block types: ggml_quants.h (GGUF's blocks, NVFP4, MXFP4).
 *  3. Scaled quantization of a tensor (quant.c, here): int8/int4 (symmetric or
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
 *    (TENSOR), a row of shape[n_dim-1] elements (CHANNEL: one per output row
 *    of an [out, in] weight, E x out of a stacked [E, out, in]), or `group`
 *    elements along the last dimension (GROUP; group divides shape[n_dim-1]).  Scales are f32 (or f16/bf16 when
 *    scale_dtype says so), little-endian, in unit order.
 *  - Zero points (flag KVP_TENSOR_ASYM, integer dtypes only): the same count
 *    and dtype as the scales, each an integer value within the q range, so
 *    y = (q - z) * s and x = 0 is represented exactly.
 */
#ifndef KVP_QUANT_H
#define KVP_QUANT_H

#include "cpufeat.h"
#include "error.h"
#include "ggml_quants.h"
#include "intcast.h"
#include "minifloat.h"
#include "tensor.h"
#include "threadpool.h"

#include <stdint.h>

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
                           /* (rmse, rel_err, snr_db, max_abs_err: NaN when an original was not finite or a
                            * reconstruction is NaN, never a figure that reads as exact) */
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

#endif
