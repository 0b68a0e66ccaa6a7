/* tensor.h - element types (dtypes) and their traits table.
 *
 * One table indexed by kvp_dtype gives each type's name, block size, bytes per
 * block and its conversions to and from f32, so every reader, writer and
 * kernel agrees on sizes.  The numeric ids are part of the KVP format
 * (kvp(5)): never renumber, only append.
 */
#ifndef KVP_TENSOR_H
#define KVP_TENSOR_H

#include <stddef.h>
#include <stdint.h>

typedef enum kvp_dtype {
    KVP_DTYPE_F32 = 0,
    KVP_DTYPE_F16 = 1,
    KVP_DTYPE_BF16 = 2,
    KVP_DTYPE_F64 = 3,
    KVP_DTYPE_FP8_E4M3 = 4,  /* "fn": no inf, max 448 */
    KVP_DTYPE_FP8_E5M2 = 5,
    KVP_DTYPE_FP4_E2M1 = 6,  /* two per byte, low nibble first */
    KVP_DTYPE_I8 = 7,
    KVP_DTYPE_I4 = 8,        /* two per byte, low nibble first, two's complement */
    KVP_DTYPE_U8 = 9,
    KVP_DTYPE_U4 = 10,
    KVP_DTYPE_I32 = 11,
    KVP_DTYPE_U32 = 12,
    KVP_DTYPE_E8M0 = 13,     /* power-of-two scale, MX formats */
    KVP_DTYPE_Q4_0 = 16,     /* GGUF block types: 32 elements a block */
    KVP_DTYPE_Q4_1 = 17,
    KVP_DTYPE_Q5_0 = 18,
    KVP_DTYPE_Q5_1 = 19,
    KVP_DTYPE_Q8_0 = 20,
    KVP_DTYPE_Q4_K = 21,     /* 256 elements a super-block */
    KVP_DTYPE_Q6_K = 22,
    KVP_DTYPE_NVFP4 = 24,    /* 16 x E2M1 + E4M3 block scale (tensor scale separate) */
    KVP_DTYPE_MXFP4 = 25,    /* 32 x E2M1 + E8M0 block scale */
    KVP_DTYPE_COUNT = 32
} kvp_dtype;

typedef void (*kvp_to_f32_fn)(const void *src, float *dst, int64_t n);
typedef void (*kvp_from_f32_fn)(const float *src, void *dst, int64_t n);

typedef struct kvp_dtype_traits {
    const char *name;        /* "f16", "q4_1"; NULL for an unassigned id */
    int block_size;          /* elements per block (1 for scalar types) */
    int block_bytes;         /* bytes per block; for 4-bit scalars 1 byte holds 2 */
    int is_quantized;        /* has block-internal scales */
    kvp_to_f32_fn to_f32;    /* n is a multiple of block_size; NULL if none */
    kvp_from_f32_fn from_f32;
} kvp_dtype_traits;

/* Traits of dtype t, or NULL when t is not a known dtype. */
const kvp_dtype_traits *kvp_dtype_get(uint32_t t);
/* Name of t ("?" when unknown). */
const char *kvp_dtype_name(uint32_t t);
/* Look up by name (case-insensitive, also accepts "float16", "fp16", "bfloat16");
 * returns the dtype or -1. */
int kvp_dtype_from_name(const char *name);
/* Bytes needed for n elements of t, or -1 when n is not a whole number of
 * blocks or t is unknown.  4-bit scalar types round up to whole bytes. */
int64_t kvp_dtype_row_bytes(uint32_t t, int64_t n);

/* Scalar conversions, round to nearest even, NaN kept as NaN. */
float kvp_f16_to_f32(uint16_t h);
uint16_t kvp_f32_to_f16(float f);
float kvp_bf16_to_f32(uint16_t h);
uint16_t kvp_f32_to_bf16(float f);

#endif
