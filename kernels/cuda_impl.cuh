/* cuda_impl.cuh - what the CUDA backend's files share (private to kernels/):
 * the library's C headers, a weight as kernels read it, the element
 * decoders every kernel uses, the device-side error record, and the launch
 * functions each kernel file gives backend_cuda.cu.
 *
 * Numerics follow the CPU backend (lib/cpu, the oracle): the same block
 * layouts and dequantization, and for everything the KV cache stores, the
 * same bits (f16/bf16 rounding, fp8/int8 row scales of lib/num/kvscale.c),
 * so a KV block written here reads the same on the CPU and the reverse.
 * Sums run in another order than on the CPU, and quantized weights meet f32
 * activations here (the CPU first rounds activations to 8-bit blocks), so
 * matmul and attention agree with the CPU to float rounding, not bits.
 */
#ifndef KVP_CUDA_IMPL_CUH
#define KVP_CUDA_IMPL_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

extern "C" {
#include "backend.h"
#include "gpuplan.h"
#include "tensor.h"
}

/* ---- a weight on the device ----
 *
 * What prepare_weight uploads, and the view kernels take by value: rows as
 * stored (row r at data + r * row_bytes), a scaled scheme's scales and zero
 * points (row r's at sc + r * scale_stride, one per group elements), and for
 * a 1-D weight (norms, biases, RoPE frequencies) its values as f32. */
struct cu_wview {
    const uint8_t *data;
    const float *sc, *zp;
    uint64_t row_bytes;
    uint32_t n_in, group, scale_stride;
};

/* ---- the device error record ----
 *
 * Kernels that find bad input (a token id outside the table, a slot or block
 * id outside the pool) cannot return it: they record the first one here, in
 * mapped host memory, and the host reports it at the next synchronize or
 * to_host (backend.h: asynchronous failures surface later). */
enum cu_fault {
    CU_FAULT_NONE = 0,
    CU_FAULT_TOKEN = 1,    /* embed: value = the token id */
    CU_FAULT_SLOT = 2,     /* kv_store: value = the slot */
    CU_FAULT_BLOCK = 3,    /* attention: value = the block id a table holds */
    CU_FAULT_CTX = 4,      /* attention: value = a position past the max_ctx the grid was planned for */
    CU_FAULT_TREE = 5,     /* attention: value = a tree's key slot past its sequence's block table */
};
struct cu_faults {
    int kind;              /* cu_fault: the first one since the host last cleared it */
    int64_t value;
};

__device__ static inline void cu_fault(cu_faults *f, int kind, int64_t value)
{
    if (atomicCAS(&f->kind, 0, kind) == 0) {
        f->value = value;
        __threadfence_system();
    }
}

/* ---- element decoders (the device side of lib/num/minifloat.c) ----
 *
 * Host and device both (CU_HD): tests/unit/test_cudanum.cu runs them on the
 * CPU against lib/num and lib/cpu, value for value. */
#define CU_HD __host__ __device__ static inline
#ifdef __CUDA_ARCH__
#define CU_UNROLL _Pragma("unroll")
#else
#define CU_UNROLL /* the host compiler has no #pragma unroll */
#endif

/* A float's bits and back (memcpy: one move on either side). */
template <typename To, typename From>
CU_HD To cu_bitcast(From f)
{
    static_assert(sizeof(To) == sizeof(From), "same size");
    To t;
    memcpy(&t, &f, sizeof t);
    return t;
}
CU_HD uint32_t cu_fbits(float f) { return cu_bitcast<uint32_t>(f); }
CU_HD float cu_bitsf(uint32_t u) { return cu_bitcast<float>(u); }

CU_HD float cu_f16(uint16_t h) { return __half2float(__ushort_as_half(h)); }

CU_HD float cu_bf16(uint16_t h) { return cu_bitsf((uint32_t)h << 16); }

/* E4M3fn: 0x7f / 0xff NaN, exponent 0 subnormal in units of 2^-9.
 *
 * Without a branch: the code's seven exponent and mantissa bits go under
 * f32's (bits 26..20), which reads 2^(e-127)·1.m, or m·2^-129 as an f32
 * subnormal where e is 0: each exactly 2^-120 times the E4M3 magnitude,
 * which one multiply by 2^120 restores (nvcc keeps subnormal inputs unless
 * built with --ftz or fast math, which this build never is); the NaN codes
 * are a select, the sign an OR.  The branching form took ~20 instructions a
 * code, two branches and a convergence barrier among them, in the GEMV's
 * SASS.  (The sign ORed last, not first: that order kept the f32 GEMM's
 * fp8 instance from spilling under its register bound.) */
CU_HD float cu_e4m3(uint8_t b)
{
    uint32_t m = b & 0x7fu, a = m == 0x7f ? 0x7fc00000u : cu_fbits(cu_bitsf(m << 20) * 0x1p120f);
    return cu_bitsf((uint32_t)(b & 0x80) << 24 | a);
}

/* A small integer as f32 without an int-to-float conversion (a quarter-rate
 * instruction on the GPU): u, at most 2^23 - 1, under the exponent of 2^23
 * reads 2^23 + u exactly, and subtracting 2^23 + bias leaves u - bias,
 * exactly, +0 for 0 as (float) gives. */
CU_HD float cu_small_int(uint32_t u, uint32_t bias)
{
    return cu_bitsf(0x4b000000u | u) - (8388608.0f + (float)bias);
}

/* A two's complement nibble (an int4 weight) and byte (int8, Q8_0): the
 * sign bit flipped makes them offset by 8 and 128. */
CU_HD float cu_i4(uint32_t nibble) { return cu_small_int((nibble & 15) ^ 8, 8); }
CU_HD float cu_i8(uint32_t byte) { return cu_small_int((byte & 0xff) ^ 0x80, 128); }

/* kvp_f32_to_f16: round to nearest even, NaN quiet with its top payload. */
CU_HD uint16_t cu_to_f16(float f)
{
    uint32_t x = cu_fbits(f), ax = x & 0x7fffffffu;
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    if (ax > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00 | ((ax >> 13) & 0x3ff));
    if (ax >= 0x477ff000u)
        return (uint16_t)(sign | 0x7c00);
    if (ax < 0x38800000u) {
        if (ax < 0x33000000u)
            return sign;
        uint32_t e = ax >> 23, man = (ax & 0x7fffff) | 0x800000;
        int shift = (int)(126 - e);
        uint32_t q = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1)))
            q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = ax + 0xfffu + ((ax >> 13) & 1);
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

/* kvp_f32_to_bf16: round to nearest even, NaN made quiet. */
CU_HD uint16_t cu_to_bf16(float f)
{
    uint32_t x = cu_fbits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fffu + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

/* kvp_f32_to_e4m3_sat: nearest even, subnormals in units of 2^-9,
 * overflow and inf to +-448, NaN to 0x7f. */
CU_HD uint8_t cu_to_e4m3_sat(float f)
{
    uint32_t x = cu_fbits(f), ax = x & 0x7fffffffu, s = (x >> 24) & 0x80, c;
    if (ax > 0x7f800000u)
        return (uint8_t)(s | 0x7f);
    int e = (int)(ax >> 23) - 127;
    if (e >= -6) {
        uint32_t r = ax + ((1u << 19) - 1) + ((ax >> 20) & 1);
        c = (r >> 20) - (120u << 3);
    } else if (e < -10) {
        c = 0;
    } else {
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        int sh = 20 + (-6 - e);
        uint32_t q = m >> sh, rem = m & ((1u << sh) - 1), half = 1u << (sh - 1);
        if (rem > half || (rem == half && (q & 1)))
            q++;
        c = q;
    }
    return (uint8_t)(s | (c > 0x7e ? 0x7e : c));
}

/* kvp_f32_to_i8: nearest even, saturating, NaN to 0. */
CU_HD int8_t cu_to_i8(float v)
{
    if (!(v == v))
        return 0;
    v = rintf(v);
    return (int8_t)(v < -128.0f ? -128 : v > 127.0f ? 127 : (int)v);
}

/* A scaled KV row's scale from its largest finite |x| (kvp_kvscale_row):
 * int8 amax / 127; fp8 the power of two at or above amax / 448; 1 for an
 * all-zero (or non-finite) row. */
CU_HD float cu_kv_row_scale(int dtype, float amax)
{
    int i8 = dtype == KVP_DTYPE_I8;
    float s = amax / (i8 ? 127.0f : 448.0f);
    s = s > 0.0f && isfinite(s) ? s : 1.0f;
    if (i8)
        return s;
    int e;
    float m = frexpf(s, &e);
    return m == 0.5f ? s : ldexpf(1.0f, e);
}

/* One element of a scaled KV row: encode(x / scale) computed as x * inv,
 * inv = 1 / scale, unless a scale below 2^-128 made inv infinite (0 * inf
 * is NaN): then x / scale, as kvp_kvscale_encode does on the CPU. */
CU_HD uint8_t cu_kv_encode(int dtype, float x, float scale, float inv)
{
    float u = isfinite(inv) ? x * inv : x / scale;
    return dtype == KVP_DTYPE_I8 ? (uint8_t)cu_to_i8(u) : cu_to_e4m3_sat(u);
}

/* ---- weights: 8 consecutive elements i0 .. i0 + 7 of row r as f32 ----
 *
 * i0 is a multiple of 8; elements at or past n_in read 0.  Block types have
 * whole blocks of 32 a row (prepare_weight checks), so 8 elements never
 * straddle a block.  Scaled kinds: (q - z) * scale[i / group]. */
template <int DT>
CU_HD void cu_wdec8(const cu_wview &w, uint32_t r, uint32_t i0, float out[8])
{
    const uint8_t *row = w.data + (uint64_t)r * w.row_bytes;
    if (DT == KVP_DTYPE_Q4_0 || DT == KVP_DTYPE_Q4_1 || DT == KVP_DTYPE_Q8_0) {
        /* Blocks of 18, 20 or 34 bytes in rows of whole blocks from a
         * 256-byte aligned base: every field is 2-byte aligned, so 16-bit
         * loads (a byte pair of quants at a time). */
        const uint32_t bb = DT == KVP_DTYPE_Q4_0 ? 18 : DT == KVP_DTYPE_Q4_1 ? 20 : 34;
        const uint16_t *blk = (const uint16_t *)(row + (uint64_t)(i0 / 32) * bb);
        uint32_t j0 = i0 % 32;
        float d = cu_f16(blk[0]);
        if (DT == KVP_DTYPE_Q8_0) {
            const uint16_t *q2 = blk + 1 + j0 / 2;
CU_UNROLL
            for (int j = 0; j < 4; j++) {
                uint16_t v = q2[j];
                out[2 * j] = cu_i8(v) * d;
                out[2 * j + 1] = cu_i8((uint32_t)v >> 8) * d;
            }
            return;
        }
        float m = DT == KVP_DTYPE_Q4_1 ? cu_f16(blk[1]) : 0.0f;
        const uint16_t *q2 = blk + (DT == KVP_DTYPE_Q4_1 ? 2 : 1) + (j0 & 15) / 2;
        uint32_t sh = j0 >= 16 ? 4 : 0; /* byte j holds element j low, j + 16 high */
CU_UNROLL
        for (int j = 0; j < 4; j++) {
            uint32_t v = (uint32_t)q2[j] >> sh;
            uint32_t qa = v & 15, qb = (v >> 8) & 15;
            out[2 * j] = DT == KVP_DTYPE_Q4_1 ? cu_small_int(qa, 0) * d + m : cu_small_int(qa, 8) * d;
            out[2 * j + 1] = DT == KVP_DTYPE_Q4_1 ? cu_small_int(qb, 0) * d + m : cu_small_int(qb, 8) * d;
        }
        return;
    }
    if (DT == KVP_DTYPE_F32 || DT == KVP_DTYPE_F16 || DT == KVP_DTYPE_BF16) {
        const uint32_t es = DT == KVP_DTYPE_F32 ? 4 : 2;
        const uint8_t *p = row + (uint64_t)i0 * es;
        if (i0 + 8 <= w.n_in && ((uintptr_t)p & 15) == 0) { /* 16-byte loads where aligned */
            if (DT == KVP_DTYPE_F32) {
                float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
                out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
                out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
            } else {
                uint4 v = *(const uint4 *)p;
                uint32_t u[4] = {v.x, v.y, v.z, v.w};
CU_UNROLL
                for (int j = 0; j < 4; j++) {
                    out[2 * j] = DT == KVP_DTYPE_F16 ? cu_f16((uint16_t)u[j]) : cu_bf16((uint16_t)u[j]);
                    out[2 * j + 1] = DT == KVP_DTYPE_F16 ? cu_f16((uint16_t)(u[j] >> 16)) : cu_bf16((uint16_t)(u[j] >> 16));
                }
            }
            return;
        }
CU_UNROLL
        for (int j = 0; j < 8; j++) {
            uint32_t i = i0 + j;
            if (i >= w.n_in)
                out[j] = 0.0f;
            else if (DT == KVP_DTYPE_F32)
                out[j] = ((const float *)row)[i];
            else
                out[j] = DT == KVP_DTYPE_F16 ? cu_f16(((const uint16_t *)row)[i]) : cu_bf16(((const uint16_t *)row)[i]);
        }
        return;
    }
    /* scaled: FP8_E4M3, I8, I4 */
    const float *sc = w.sc + (uint64_t)r * w.scale_stride;
    const float *zp = w.zp ? w.zp + (uint64_t)r * w.scale_stride : NULL;
CU_UNROLL
    for (int j = 0; j < 8; j++) {
        uint32_t i = i0 + j < w.n_in ? i0 + j : w.n_in - 1, g = i / w.group; /* past the row: read 0 below */
        float q;
        if (DT == KVP_DTYPE_FP8_E4M3)
            q = cu_e4m3(row[i]);
        else if (DT == KVP_DTYPE_I8)
            q = cu_i8(row[i]);
        else /* i4: element 2k the low nibble of byte k, two's complement */
            q = cu_i4((uint32_t)row[i / 2] >> (4 * (i & 1)));
        float v = (q - (zp ? zp[g] : 0.0f)) * sc[g];
        out[j] = i0 + j < w.n_in ? v : 0.0f;
    }
}

/* Element j's code value (unscaled) of 8 grouped elements in two words:
 * i4 bits 4j..4j+3 of u0 (two's complement), fp8 and i8 byte j of u0:u1. */
template <int DT>
CU_HD float cu_grp_code(uint32_t u0, uint32_t u1, int j)
{
    if (DT == KVP_DTYPE_I4)
        return cu_i4(u0 >> (4 * j));
    uint32_t b = (j < 4 ? u0 : u1) >> (8 * (j % 4));
    return DT == KVP_DTYPE_FP8_E4M3 ? cu_e4m3((uint8_t)b) : cu_i8(b);
}

/* Does any of the four E4M3 codes in u have all seven low bits set (NaN):
 * a byte's low bits plus one reach bit 7 only from 0x7f, and never carry. */
CU_HD int cu_e4m3_nan4(uint32_t u) { return (((u & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u) != 0; }

/* Is s times 2^120 exact and finite (|s| below 2^8; NaN is not). */
CU_HD int cu_e4m3_scale_folds(float s) { return fabsf(s) < 256.0f; }

/* ---- a scaled weight (fp8, i8, i4) whose rows cu_wgrouped accepts ----
 *
 * Groups of a multiple of 8 elements, rows of a multiple of 8 elements
 * aligned to the 8 elements' bytes: the 8 elements i0 .. i0 + 7 share one
 * scale (and zero point), and their bytes come in one aligned 8-byte (fp8,
 * i8) or 4-byte (i4) load, where cu_wdec8 reads byte by byte and a scale an
 * element.  The values are cu_wdec8's, bit for bit (test_cudanum). */
template <int DT>
CU_HD void cu_wdec8_grp(const cu_wview &w, uint32_t r, uint32_t i0, float out[8])
{
    const uint8_t *row = w.data + (uint64_t)r * w.row_bytes;
    uint32_t g = i0 / w.group, u0, u1; /* two words, not an array: no local memory */
    if (DT == KVP_DTYPE_I4) {
        u0 = *(const uint32_t *)(row + i0 / 2), u1 = 0;
    } else {
        uint2 v = *(const uint2 *)(row + i0);
        u0 = v.x, u1 = v.y;
    }
    uint64_t sg = (uint64_t)r * w.scale_stride + g;
    float s = w.sc[sg];
    if (!w.zp) { /* symmetric: q * s, as (q - 0) * s is for every q */
        if (DT == KVP_DTYPE_FP8_E4M3 && cu_e4m3_scale_folds(s) && !cu_e4m3_nan4(u0) && !cu_e4m3_nan4(u1)) {
            /* 2^120 moved into the scale: the code's bits under f32's
             * (cu_e4m3) are q 2^-120 exactly, and s 2^120 is exact below
             * 2^8, so the one rounded product is q * s's */
            float s120 = s * 0x1p120f;
CU_UNROLL
            for (int j = 0; j < 8; j++) {
                uint32_t b = (j < 4 ? u0 : u1) >> (8 * (j % 4));
                out[j] = cu_bitsf((b & 0x80) << 24 | (b & 0x7f) << 20) * s120;
            }
            return;
        }
CU_UNROLL
        for (int j = 0; j < 8; j++)
            out[j] = cu_grp_code<DT>(u0, u1, j) * s;
        return;
    }
    float z = w.zp[sg];
CU_UNROLL
    for (int j = 0; j < 8; j++)
        out[j] = (cu_grp_code<DT>(u0, u1, j) - z) * s;
}

/* Do all of w's rows meet cu_wdec8_grp's terms. */
__host__ __device__ static inline int cu_wgrouped(const cu_wview &w, int dtype)
{
    uint32_t nb = dtype == KVP_DTYPE_I4 ? 4 : 8;
    if (dtype != KVP_DTYPE_FP8_E4M3 && dtype != KVP_DTYPE_I8 && dtype != KVP_DTYPE_I4)
        return 0;
    return w.sc && w.group % 8 == 0 && w.n_in % 8 == 0 && w.row_bytes % nb == 0 && ((uintptr_t)w.data & (nb - 1)) == 0;
}

/* Calls F::template run<DT>() for a weight dtype the matmul and embed
 * kernels are built for; cudaErrorInvalidValue for any other. */
#define CU_WEIGHT_DTYPES(X) X(KVP_DTYPE_F32) X(KVP_DTYPE_F16) X(KVP_DTYPE_BF16) X(KVP_DTYPE_Q4_0) \
    X(KVP_DTYPE_Q4_1) X(KVP_DTYPE_Q8_0) X(KVP_DTYPE_FP8_E4M3) X(KVP_DTYPE_I8) X(KVP_DTYPE_I4)

/* ---- KV elements: a float kind's value, a scaled kind's code unscaled ---- */
template <int DT>
CU_HD float cu_kv_elem(const uint8_t *p, uint64_t i)
{
    if (DT == KVP_DTYPE_F32)
        return ((const float *)p)[i];
    if (DT == KVP_DTYPE_F16)
        return cu_f16(((const uint16_t *)p)[i]);
    if (DT == KVP_DTYPE_BF16)
        return cu_bf16(((const uint16_t *)p)[i]);
    if (DT == KVP_DTYPE_FP8_E4M3)
        return cu_e4m3(p[i]);
    return cu_i8(p[i]);
}

__host__ __device__ static inline uint32_t cu_kv_esize(int dtype)
{
    return dtype == KVP_DTYPE_F32 ? 4 : dtype == KVP_DTYPE_FP8_E4M3 || dtype == KVP_DTYPE_I8 ? 1 : 2;
}

/* ---- KV chunks: CU_KV_CH consecutive elements of one K or V row as raw
 * bits in 32-bit words, element k at byte k * ES (the pipelined attention's
 * loads: all of a tile's chunks are loaded before any is decoded) ---- */
#define CU_KV_CH 8

template <int DT>
struct cu_kv_fmt {
    static constexpr uint32_t ES = DT == KVP_DTYPE_F32 ? 4 : DT == KVP_DTYPE_F16 || DT == KVP_DTYPE_BF16 ? 2 : 1;
    static constexpr int W = CU_KV_CH * ES / 4; /* 32-bit words a chunk */
};

/* Chunk c of a tile of kt keys whose rows have nch chunks: K (which 0) or
 * V (1), key j, chunk dc of the row; dc fastest, so consecutive threads
 * walk along a row. */
CU_HD void cu_kv_chunk_at(uint32_t c, uint32_t nch, uint32_t kt, uint32_t &which, uint32_t &j, uint32_t &dc)
{
    dc = c % nch, j = c / nch % kt, which = c / (nch * kt);
}

/* Chunk dc of a row of hd elements into w: one aligned vector load when
 * vec (hd a multiple of CU_KV_CH and the row aligned to a chunk's bytes),
 * else element by element; elements past hd are 0. */
template <int DT>
CU_HD void cu_kv_chunk_load(const uint8_t *row, uint32_t dc, uint32_t hd, int vec, uint32_t *w)
{
    typedef cu_kv_fmt<DT> F;
    const uint8_t *src = row + (uint64_t)dc * CU_KV_CH * F::ES;
    if (vec) {
        if (F::W == 8) {
            uint4 x = ((const uint4 *)src)[0], y = ((const uint4 *)src)[1];
            w[0] = x.x, w[1] = x.y, w[2] = x.z, w[3] = x.w;
            w[F::W > 4 ? 4 : 0] = y.x, w[F::W > 5 ? 5 : 0] = y.y, w[F::W > 6 ? 6 : 0] = y.z, w[F::W > 7 ? 7 : 0] = y.w;
        } else if (F::W == 4) {
            uint4 x = *(const uint4 *)src;
            w[0] = x.x, w[F::W > 1 ? 1 : 0] = x.y, w[F::W > 2 ? 2 : 0] = x.z, w[F::W > 3 ? 3 : 0] = x.w;
        } else {
            uint2 x = *(const uint2 *)src;
            w[0] = x.x, w[F::W > 1 ? 1 : 0] = x.y;
        }
        return;
    }
CU_UNROLL
    for (int k = 0; k < F::W; k++)
        w[k] = 0;
CU_UNROLL
    for (int k = 0; k < CU_KV_CH; k++) {
        uint32_t d = dc * CU_KV_CH + k;
        if (d >= hd)
            break;
        uint32_t bits = F::ES == 4 ? ((const uint32_t *)row)[d] : F::ES == 2 ? ((const uint16_t *)row)[d] : row[d];
        w[k * F::ES / 4] |= bits << (8 * (k * F::ES % 4));
    }
}

/* Element k of a chunk as f32, unscaled: cu_kv_elem's value. */
template <int DT>
CU_HD float cu_kv_chunk_elem(const uint32_t *w, int k)
{
    typedef cu_kv_fmt<DT> F;
    uint32_t bits = w[k * F::ES / 4] >> (8 * (k * F::ES % 4));
    return DT == KVP_DTYPE_F32        ? cu_bitsf(bits)
           : DT == KVP_DTYPE_F16      ? cu_f16((uint16_t)bits)
           : DT == KVP_DTYPE_BF16     ? cu_bf16((uint16_t)bits)
           : DT == KVP_DTYPE_FP8_E4M3 ? cu_e4m3((uint8_t)bits)
                                      : cu_i8(bits);
}

/* Byte offset of row (layer, K/V, head, slot) inside a block: the
 * [layer][K/V][n_head_kv][block_size][head_dim] layout of backend.h. */
__host__ __device__ static inline uint64_t cu_kv_row(const kvp_kv_pool &kv, uint32_t layer, uint32_t which,
                                                     uint32_t head, uint32_t slot)
{
    return ((((uint64_t)layer * 2 + which) * kv.n_head_kv + head) * kv.block_size + slot) * kv.head_dim *
           cu_kv_esize(kv.dtype);
}

/* Index of that row's scale among a scaled block's scales (floats at scales_off). */
__host__ __device__ static inline uint64_t cu_kv_scale(const kvp_kv_pool &kv, uint32_t layer, uint32_t which,
                                                       uint32_t head, uint32_t slot)
{
    return (((uint64_t)layer * 2 + which) * kv.n_head_kv + head) * kv.block_size + slot;
}

/* ---- launches (each returns cudaGetLastError after queuing its kernels) ---- */

/* cuda_matmul.cu */
/* A split GEMM's workspace and tile counters (kvp_gpuplan_splitk_floats and
 * _tiles of the fill it was planned with; the counters start at 0 and each
 * split GEMM leaves them at 0) */
typedef struct cu_splitk {
    float *ws;
    uint32_t *cnt;
} cu_splitk;
/* pipelined: the pipelined GEMV (the default; KVP_CUDA_PIPELINE=0 the
 * first); mma: the tensor-core GEMM (the default; KVP_CUDA_MMA=0 the f32
 * one), the only one that splits k (kernels/README.md) */
cudaError_t cu_matmul(cudaStream_t st, int dtype, const cu_wview &w, uint32_t n_out, const float *x, float *y,
                      uint32_t n_tok, const kvp_gpu_mm_shape &shape, const cu_splitk &sk, int pipelined, int mma);
cudaError_t cu_embed(cudaStream_t st, int dtype, const cu_wview &w, uint32_t n_out, const int32_t *tokens,
                     uint32_t n_tok, float *out, cu_faults *faults);

/* argmax_rows' fold (kvp_argmax_f32's rule, lib/num/argmax.h): does value
 * v at index i beat the best so far (bv at bi; bi UINT32_MAX while none)?
 * Larger wins, an equal value the lower index; NaN never (both compares
 * are false).  A thread folds its elements, then the warp and the block
 * fold the threads' bests with the same rule, in any order. */
CU_HD int cu_argmax_beats(float v, uint32_t i, float bv, uint32_t bi) { return v > bv || (v == bv && i < bi); }

/* cuda_elem.cu; cu_probe: the attributes of one kernel, which fails
 * (cudaErrorNoKernelImageForDevice) on a device this build has no code for */
cudaError_t cu_probe(cudaFuncAttributes *fa);
cudaError_t cu_rmsnorm(cudaStream_t st, const float *x, const float *w, float *y, uint32_t n_tok, uint32_t n,
                       float eps);
cudaError_t cu_rope(cudaStream_t st, float *x, uint32_t n_tok, uint32_t n_head, uint32_t head_dim, uint32_t rot_dim,
                    const int32_t *pos, const float *inv_freq, int neox);
cudaError_t cu_add_bias(cudaStream_t st, float *x, const float *bias, uint32_t n_tok, uint32_t n);
cudaError_t cu_add(cudaStream_t st, float *x, const float *y, size_t n);
cudaError_t cu_silu_mul(cudaStream_t st, float *g, const float *u, size_t n);
cudaError_t cu_gather_rows(cudaStream_t st, float *dst, const float *src, const uint32_t *rows, uint32_t n_rows,
                           uint32_t n);
/* ids[r] (device) = row r of x[n_rows][n]'s argmax (cu_argmax_beats; 0 when none) */
cudaError_t cu_argmax_rows(cudaStream_t st, const float *x, uint32_t n_rows, uint32_t n, uint32_t *ids);

/* cuda_attn.cu */
cudaError_t cu_kv_store(cudaStream_t st, const kvp_kv_pool &kv, uint32_t layer, const float *k, const float *v,
                        uint32_t n_tok, const uint32_t *slot, cu_faults *faults);
/* parts: shape.part_floats floats of scratch when shape.max_splits > 1. */
cudaError_t cu_attention(cudaStream_t st, const kvp_attn_args &a, const kvp_gpu_attn_shape &shape, float *parts,
                         cu_faults *faults, int pipelined);
/* Is this KV dtype one the kernels are built for. */
int cu_kv_dtype_ok(int dtype);

#endif
