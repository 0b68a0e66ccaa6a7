/* tensor.c - dtype traits and the sizes a tensor description implies (see
 * tensor.h). */
#include "tensor.h"
#include "cpufeat.h"
#include "ggml_quants.h"
#include "intcast.h"
#include "minifloat.h"
#include "wire.h"

#include <string.h>
#include <strings.h>

static void f32_to_f32(const void *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }
static void f32_from_f32(const float *src, void *dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }

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
 * because the format depends on them.  The K-quants and IQ4 are read-only. */
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
    [KVP_DTYPE_Q5_K] = {"q5_k", 256, 176, 1, kvp_dequantize_row_q5_k, NULL},
    [KVP_DTYPE_Q2_K] = {"q2_k", 256, 84, 1, kvp_dequantize_row_q2_k, NULL},
    [KVP_DTYPE_Q3_K] = {"q3_k", 256, 110, 1, kvp_dequantize_row_q3_k, NULL},
    [KVP_DTYPE_IQ4_NL] = {"iq4_nl", 32, 18, 1, kvp_dequantize_row_iq4_nl, NULL},
    [KVP_DTYPE_IQ4_XS] = {"iq4_xs", 256, 136, 1, kvp_dequantize_row_iq4_xs, NULL},
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

/* ---- sizes implied by tensor descriptions ---- */

uint64_t kvp_tensor_numel(const kvp_tensor_rec *t)
{
    uint64_t n = 1;
    for (uint32_t i = 0; i < t->n_dim && i < KVP_MAX_DIMS; i++) {
        if (t->shape[i] && n > UINT64_MAX / t->shape[i])
            return 0; /* overflow: callers treat 0 elements as invalid */
        n *= t->shape[i];
    }
    return n;
}

int64_t kvp_tensor_data_bytes(const kvp_tensor_rec *t)
{
    if (t->n_dim < 1 || t->n_dim > KVP_MAX_DIMS)
        return -1;
    uint64_t numel = kvp_tensor_numel(t), inner = t->shape[t->n_dim - 1];
    if (numel == 0 || inner == 0 || inner > INT64_MAX)
        return -1;
    int64_t row = kvp_dtype_row_bytes(t->dtype, (int64_t)inner);
    uint64_t rows = numel / inner;
    if (row < 0 || (row && rows > (uint64_t)INT64_MAX / (uint64_t)row))
        return -1;
    return (int64_t)(rows * (uint64_t)row);
}

int64_t kvp_tensor_scale_count(const kvp_tensor_rec *t)
{
    uint64_t numel = kvp_tensor_numel(t);
    if (t->n_dim < 1 || t->n_dim > KVP_MAX_DIMS || numel == 0 || numel > INT64_MAX)
        return -1;
    switch (t->scheme) {
    case KVP_SCHEME_NONE: return 0;
    case KVP_SCHEME_TENSOR: return 1;
    case KVP_SCHEME_CHANNEL: return (int64_t)(numel / t->shape[t->n_dim - 1]); /* one per row */
    case KVP_SCHEME_GROUP:
        if (t->group == 0 || t->shape[t->n_dim - 1] % t->group)
            return -1;
        return (int64_t)(numel / t->group);
    default: return -1;
    }
}

/* First i < n whose bits (16-bit words) all have mask set, or n. */
static uint64_t first_all16(const uint8_t *b, uint64_t n, uint16_t mask)
{
    for (uint64_t i = 0; i < n; i++)
        if ((kvp_le16(b + 2 * i) & mask) == mask)
            return i;
    return n;
}

uint64_t kvp_kv_first_non_finite(uint32_t dtype, const void *p, uint64_t n)
{
    const uint8_t *b = p;
    switch (dtype) {
    case KVP_DTYPE_F16: return first_all16(b, n, 0x7c00u);
    case KVP_DTYPE_BF16: return first_all16(b, n, 0x7f80u);
    case KVP_DTYPE_F32:
        for (uint64_t i = 0; i < n; i++)
            if ((kvp_le32(b + 4 * i) & 0x7f800000u) == 0x7f800000u)
                return i;
        return n;
    case KVP_DTYPE_FP8_E4M3: /* NaN codes; E4M3 has no infinity */
        for (uint64_t i = 0; i < n; i++)
            if ((b[i] & 0x7f) == 0x7f)
                return i;
        return n;
    default: return n; /* i8: every code is finite */
    }
}
