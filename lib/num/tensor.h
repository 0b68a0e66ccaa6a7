/* tensor.h - element types (dtypes), their traits table, and the
 * description of a (possibly quantized) tensor.
 *
 * One table indexed by kvp_dtype gives each type's name, block size, bytes per
 * block and its conversions to and from f32, so every reader, writer and
 * kernel agrees on sizes.  The numeric ids are part of the KVP format
 * (kvp(5)): never renumber, only append.
 *
 * kvp_tensor_rec describes a tensor's element type, shape and scale layout:
 * what a KVP TENSOR record carries in its header (lib/stream.h serializes
 * it) and what quantization (lib/quant.h) produces, so the numerics never
 * need the stream format.
 */
#ifndef KVP_TENSOR_H
#define KVP_TENSOR_H

#include "minifloat.h"

#include <stddef.h>
#include <stdint.h>

#define KVP_NAME_MAX 255 /* tensor, sequence label and key names */
#define KVP_MAX_DIMS 4

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
    KVP_DTYPE_Q5_K = 23,
    KVP_DTYPE_NVFP4 = 24,    /* 16 x E2M1 + E4M3 block scale (tensor scale separate) */
    KVP_DTYPE_MXFP4 = 25,    /* 32 x E2M1 + E8M0 block scale */
    KVP_DTYPE_Q2_K = 26,     /* GGUF's 2- and 3-bit K-quants, 256 a super-block */
    KVP_DTYPE_Q3_K = 27,
    KVP_DTYPE_IQ4_NL = 28,   /* GGUF's 4-bit indices into a fixed table: 32 a block */
    KVP_DTYPE_IQ4_XS = 29,   /* 256 a super-block, 6-bit scales a sub-block of 32 */
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
/* Index of the first NaN or infinity among n elements of a KV cache dtype
 * (f32, f16, bf16, fp8_e4m3: its NaN codes; i8 has none) at p, or n.
 * For checking a stream's KV blocks without converting them. */
uint64_t kvp_kv_first_non_finite(uint32_t dtype, const void *p, uint64_t n);

/* ---- tensor descriptions ---- */

typedef enum kvp_scheme {
    KVP_SCHEME_NONE = 0,    /* plain dtype, or block-quantized with internal scales */
    KVP_SCHEME_TENSOR = 1,  /* one scale for the tensor */
    KVP_SCHEME_CHANNEL = 2, /* one scale per row of the last dim: numel / shape[n_dim-1] */
    KVP_SCHEME_GROUP = 3,   /* one scale per `group` elements along the last dim */
} kvp_scheme;

/* Tensor flags. */
#define KVP_TENSOR_ASYM 0x1u /* zero points present: y = (q - z) * s */

typedef struct kvp_tensor_rec {
    char name[KVP_NAME_MAX + 1];
    uint32_t dtype;            /* kvp_dtype of the data */
    uint32_t n_dim;            /* 1..4 */
    uint64_t shape[KVP_MAX_DIMS]; /* outermost first; shape[n_dim-1] is contiguous */
    uint32_t scheme;           /* kvp_scheme */
    uint32_t group;            /* elements per scale for GROUP (else 0) */
    uint32_t scale_dtype;      /* dtype of scales (f32, f16, fp8_e4m3, e8m0) */
    uint32_t flags;            /* KVP_TENSOR_* */
    float global_scale;        /* multiplies every value (NVFP4 tensor scale); 1 otherwise */
    uint64_t data_bytes;       /* must equal what dtype and shape imply */
    uint64_t scales_bytes;     /* must equal what scheme, shape and scale_dtype imply */
    uint64_t zeros_bytes;      /* zero points (same count and dtype as scales) when ASYM */
} kvp_tensor_rec;

/* Bytes implied by a tensor's dtype and shape, and by its scheme's scales;
 * -1 when inconsistent (not a whole number of blocks, group not dividing). */
int64_t kvp_tensor_data_bytes(const kvp_tensor_rec *t);
int64_t kvp_tensor_scale_count(const kvp_tensor_rec *t);
uint64_t kvp_tensor_numel(const kvp_tensor_rec *t);

#endif
