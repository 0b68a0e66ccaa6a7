/* backend_cpu_amx.c - prompt matmuls of the quantized kinds (Q4_0, Q4_1,
 * Q8_0, i8, i4) on AMX's tile unit, where the CPU has AMX-INT8 and the
 * kernel grants this process the tile state.
 *
 * One tdpbssd multiplies 16 weight rows (a 32-element block of each, the A
 * tile) by the same block of 16 tokens (the B tile: the activations
 * interleaved by 4-byte groups, kvp_cpu_q8_tile_put) into the 256 exact i32
 * block dot products.  What follows is the VNNI kernels' float arithmetic
 * term for term (backend_cpu_x86_vnni.inc): for each row and token, over the
 * blocks in order, acc = fma(float(dot), dx * dw, acc); the minimum terms
 * (Q4_1's m, the scaled kinds' -z * scale) in a chain of their own,
 * fma(m, s, ma); then acc + ma.  So this table gives the VNNI table's bits,
 * and a token's outputs are the same whether a prompt's tile or a decode
 * step's few-token kernel computed them (batch invariance).
 *
 * Every quantized kind comes in rows of 16 (amx_r16), as the VNNI table
 * takes it too: a model takes no more memory with AMX than without.  As
 * stored (KVP_CPU_AS_STORED, or scales in groups the rows of 16 do not
 * take), Q8_0 and i8 rows are read by the tile load straight from the
 * weight (a block's 32 quants at a fixed stride from row to row) and the
 * nibble kinds are unpacked to signed bytes first (Q4_0 and i4 as q - 8,
 * Q4_1 as 0..15), 16 rows a block, into a buffer the tile load reads.
 */
#include "backend_cpu_kern.h"
#include "tensor.h"

#if defined(__x86_64__) && defined(__GNUC__) && (__GNUC__ >= 11 || (defined(__clang__) && __clang_major__ >= 12))

#include <immintrin.h>
#include <pthread.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define KVP_AMX __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

/* Tiles, two sets so one block's multiply runs while the block before is
 * stored and scaled: 0 and 3 the sums (16 rows of 16 i32), 1 and 4 the
 * weight rows (16 rows of 32 bytes), 2 and 5 the tokens (8 rows of 16
 * tokens' 4-byte groups). */
typedef struct amx_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;
_Static_assert(sizeof(amx_cfg) == 64, "the tile configuration is 64 bytes");

/* The tile loads, stores and configuration as asm that tells the compiler
 * they touch memory: GCC's intrinsics pass only the address (and
 * ldtilecfg's first 8 bytes), so it could drop the stores a tile load reads
 * or read a buffer before tilestored writes it. */
#define AMX_LOADD(t, base, stride) \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(base), "r"((long)(stride)) : "memory")
#define AMX_STORED(t, base, stride) \
    __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(base), "r"((long)(stride)) : "memory")
#define AMX_ZERO(t) __asm__ volatile("tilezero %%tmm" #t ::)
#define AMX_DPBSSD(c, a, b) __asm__ volatile("tdpbssd %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)

enum { AMX_ROWS = 16, AMX_T = KVP_AMX_TOK, AMX_S = AMX_T /* kvp_q8_slots(AMX_T) */ };
_Static_assert(AMX_T == 16, "a B tile row is 16 tokens of 4 bytes");

/* Each thread configures its tiles once and keeps them: every matmul here
 * uses the one layout, and ldtilecfg (with the tilerelease that undid it)
 * took 1-2% of a batched decode step when done at every call.  A thread's
 * live tile state is saved with its other registers on a context switch
 * (the kernel granted it, ARCH_REQ_XCOMP_PERM) and dropped when it exits. */
static _Thread_local int amx_configured;

KVP_AMX static void amx_config(void)
{
    if (amx_configured)
        return;
    amx_configured = 1;
    amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int s = 0; s < 6; s += 3) {
        c.rows[s] = AMX_ROWS, c.colsb[s] = AMX_T * 4;
        c.rows[s + 1] = AMX_ROWS, c.colsb[s + 1] = KVP_QK;
        c.rows[s + 2] = KVP_QK / 4, c.colsb[s + 2] = AMX_T * 4;
    }
    __asm__ volatile("ldtilecfg %0" ::"m"(c));
}

/* Kind numbers as in amx_mm: Q4_0 0, Q4_1 1, Q8_0 2, i8 3, i4 4. */
#define AMX_BB(kind) ((kind) == 0 ? sizeof(kvp_blk_q4_0) : (kind) == 1 ? sizeof(kvp_blk_q4_1) \
                      : (kind) == 2 ? sizeof(kvp_blk_q8_0) : (kind) == 3 ? 32u : 16u)
#define AMX_QOFF(kind) ((kind) == 1 ? 4u : (kind) <= 2 ? 2u : 0u)

/* Two rows' nibble blocks p0, p1 as 64 signed bytes, row p0's 32 first:
 * Q4_0/Q4_1 byte j holds element j (low nibble) and j + 16 (high); i4 byte
 * k holds elements 2k (low) and 2k + 1 (high), stored xor 8.  Q4_0 and i4
 * become q - 8, Q4_1 stays 0..15. */
KVP_AMX static inline __m512i unpack2(int kind, const uint8_t *p0, const uint8_t *p1)
{
    const __m128i a = _mm_loadu_si128((const __m128i *)p0), b = _mm_loadu_si128((const __m128i *)p1);
    const __m512i m4 = _mm512_set1_epi8(15);
    /* 128-bit lanes: a, a, b, b */
    const __m512i raw = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(a, a)), _mm256_set_m128i(b, b), 1);
    __m512i v;
    if (kind == 4) { /* low nibbles and high nibbles interleaved */
        __m512i lo = _mm512_and_si512(raw, m4), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
        /* lane 0: elements 0..15 (bytes 0..7), lane 1: 16..31 (bytes 8..15) */
        __m512i l = _mm512_unpacklo_epi8(lo, hi), h = _mm512_unpackhi_epi8(lo, hi);
        v = _mm512_mask_blend_epi64(0xcc, l, h); /* lanes 1 and 3 from the high unpack */
        return _mm512_sub_epi8(_mm512_xor_si512(v, _mm512_set1_epi8(8)), _mm512_set1_epi8(8));
    }
    v = _mm512_and_si512(_mm512_srlv_epi32(raw, _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 0, 0, 0, 0, 4, 4, 4, 4)),
                         m4);
    return kind == 0 ? _mm512_sub_epi8(v, _mm512_set1_epi8(8)) : v;
}

/* Row m's scale dw and minimum term mw for block blk (mw 0 where the kind
 * has none); offs: the rows' byte offsets from wr[0]. */
KVP_AMX static inline void block_scales(int kind, const kvp_mm_blk *b, const uint8_t *const *wr, const uint32_t *ri,
                                        __m512i offs, uint32_t blk, float *dw, float *mw)
{
    if (kind >= 3) {
        uint32_t g = blk / (b->g / KVP_QK);
        for (int m = 0; m < AMX_ROWS; m++) {
            float d = b->sc[(size_t)ri[m] * b->sc_stride + g];
            dw[m] = d;
            if (mw)
                mw[m] = b->zp ? -b->zp[(size_t)ri[m] * b->sc_stride + g] * d : 0.0f;
        }
        return;
    }
    /* each row's block header (f16 d, then Q4_1's f16 m) in one gather */
    __m512i h = _mm512_i32gather_epi32(offs, wr[0] + (size_t)blk * AMX_BB(kind), 1);
    _mm512_store_ps(dw, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h)));
    if (mw)
        _mm512_store_ps(mw, kind == 1 ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16)))
                                      : _mm512_setzero_ps());
}

/* Block blk's A operand into tile A: straight from the weight for the
 * signed kinds when all 16 rows are there, else through abuf (nibbles
 * unpacked; a short piece's rows repeat its last). */
#define AMX_LOAD_A(A, kind, direct, wr, o, stride, abuf)                                                          \
    do {                                                                                                           \
        if (direct) {                                                                                              \
            AMX_LOADD(A, (wr)[0] + (o), (long)(stride));                                                         \
        } else {                                                                                                   \
            fill_a(kind, wr, o, abuf);                                                                             \
            AMX_LOADD(A, abuf, KVP_QK);                                                                          \
        }                                                                                                          \
    } while (0)

KVP_AMX static inline void fill_a(int kind, const uint8_t *const *wr, size_t o, int8_t *abuf)
{
    for (int m = 0; m < AMX_ROWS; m += 2) {
        __m512i v;
        if (kind == 2 || kind == 3) /* a short piece's signed rows */
            v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(wr[m] + o))),
                                   _mm256_loadu_si256((const __m256i *)(wr[m + 1] + o)), 1);
        else
            v = unpack2(kind, wr[m] + o, wr[m + 1] + o);
        _mm512_store_si512((__m512i *)(abuf + m * KVP_QK), v);
    }
}

/* The float step of block blk: each row's exact dots (cbuf, tokens in
 * lanes) into its sum, acc = fma(dot, dx * dw, acc), as VNNI does. */
KVP_AMX __attribute__((always_inline)) static inline void amx_scale(const int32_t *cbuf, __m512 dx, const float *dw,
                                                                    __m512 *acc)
{
    _Pragma("GCC unroll 16") for (int m = 0; m < AMX_ROWS; m++) {
        __m512 dot = _mm512_cvtepi32_ps(_mm512_load_si512((const __m512i *)(cbuf + m * AMX_T)));
        acc[m] = _mm512_fmadd_ps(dot, _mm512_mul_ps(dx, _mm512_set1_ps(dw[m])), acc[m]);
    }
}

/* The share of the next rows' bytes (pf, pf_step a pair of blocks; 0 where
 * the rows are read again from cache) asked for at the pair from block
 * blk. */
KVP_AMX static inline void amx_prefetch_pair(const uint8_t *pf, size_t pf_step, uint32_t blk)
{
    for (size_t f = pf_step * (blk / 2); f < pf_step * (blk / 2 + 1); f += 64)
        _mm_prefetch((const char *)(pf + f), _MM_HINT_T0);
}

/* The blocks of a group in a pipeline over the two tile sets (0: tiles
 * 0-2, 1: tiles 3-5), block blk's step: ISSUE(set, blk + 1) loads block
 * blk + 1's operands and issues its multiply, block blk's sums (the tile
 * of the set) are stored into cbuf[set], and SCALE(set, blk - 1) scales
 * the sums block blk - 1 stored a step before.  So every tile store has a
 * multiply queued behind it, and the vector loads of the sums never wait
 * for the tile store just issued.  Pairs, each block's sums stored right
 * after its own multiply and read right after their store, took
 * 0.230-0.245 ms where this takes 0.191-0.211 (bench_mm q8_0 1536 x 576,
 * rows of 16, 64 tokens, one thread); 64 SmolLM2 sequences decoding
 * together: Q4_1 1120-1123 against 1152-1164 tok/s, q8_0 1142-1172 against
 * 1237-1244; Q4_1 pp512 +10%; q8_0 prompts the same.  The vector work,
 * three operations a sum and a block, is the larger share either way.  The
 * blocks are scaled in order, so the sums are the same.  Uses nb, cbuf
 * (two buffers of 16 x 16 sums, a row 64 bytes: AMX_ROWS or AMX_T i32)
 * and the prefetch's pf and pf_step (amx_prefetch_pair). */
#define AMX_PIPELINE(ISSUE, SCALE)                                                                                 \
    do {                                                                                                           \
        amx_prefetch_pair(pf, pf_step, 0);                                                                         \
        ISSUE(0, 0);                                                                                               \
        for (uint32_t blk = 0; blk < nb; blk += 2) {                                                               \
            if (blk + 1 < nb)                                                                                      \
                ISSUE(1, blk + 1);                                                                                 \
            AMX_STORED(0, cbuf[0], 64);                                                                            \
            if (blk > 0)                                                                                           \
                SCALE(1, blk - 1);                                                                                 \
            if (blk + 1 < nb) {                                                                                    \
                if (blk + 2 < nb) {                                                                                \
                    amx_prefetch_pair(pf, pf_step, blk + 2);                                                       \
                    ISSUE(0, blk + 2);                                                                             \
                }                                                                                                  \
                AMX_STORED(3, cbuf[1], 64);                                                                        \
                SCALE(0, blk);                                                                                     \
            }                                                                                                      \
        }                                                                                                          \
        SCALE((nb - 1) & 1, nb - 1);                                                                               \
    } while (0)

/* Rows r0 .. r0+15 of the piece (those past nr repeat its last) by its
 * tokens: out[m][t], the blocks through AMX_PIPELINE. */
KVP_AMX __attribute__((always_inline)) static inline void amx_rows(int kind, const kvp_mm_blk *b, uint32_t r0,
                                                                   float (*out)[AMX_T])
{
    const size_t bb = AMX_BB(kind), qoff = AMX_QOFF(kind);
    const uint32_t nb = b->n / KVP_QK, nr = b->nr - r0 < AMX_ROWS ? b->nr - r0 : AMX_ROWS;
    const int has_m = kind == 1 || (kind >= 3 && b->zp);
    const int direct = (kind == 2 || kind == 3) && nr == AMX_ROWS;
    const uint8_t *wr[AMX_ROWS];
    uint32_t ri[AMX_ROWS];
    _Alignas(64) int32_t off[AMX_ROWS];
    for (uint32_t m = 0; m < AMX_ROWS; m++) {
        ri[m] = r0 + (m < nr ? m : nr - 1);
        wr[m] = b->w + (size_t)ri[m] * b->w_stride;
        off[m] = (int32_t)((ri[m] - r0) * b->w_stride); /* < 2^31: mm_setup's bound */
    }
    const __m512i offs = _mm512_load_si512((const __m512i *)off);
    _Alignas(64) int8_t abuf[2][AMX_ROWS * KVP_QK];
    _Alignas(64) int32_t cbuf[2][AMX_ROWS * AMX_T];
    _Alignas(64) float dw[AMX_ROWS];
    const int8_t *xt = b->xt;
    const float *dxs = b->dxs;
    __m512 acc[AMX_ROWS];
    _Pragma("GCC unroll 16") for (int m = 0; m < AMX_ROWS; m++)
        acc[m] = _mm512_setzero_ps();
    /* the next 16 rows (contiguous after these), a share of them a pair of
     * blocks, where the rows are read once (a batched decode step: from
     * memory, sixteen streams, more than the hardware prefetchers follow;
     * a long prompt reads them again from L2).  Batched generation of 64
     * SmolLM2 Q4_1 sequences +2.5%, pp512 -1% when it prefetched too. */
    const uint8_t *pf = wr[0] + (size_t)AMX_ROWS * b->w_stride;
    const size_t pf_step = b->once ? ((size_t)AMX_ROWS * b->w_stride * 2 / nb + 63) & ~(size_t)63 : 0;
    /* the blocks in a pipeline over the two tile sets (AMX_PIPELINE) */
#define ROWS_ISSUE(set, blk)                                                                                       \
    do {                                                                                                           \
        const uint32_t bk_ = (blk);                                                                                \
        const size_t o_ = (size_t)bk_ * bb + qoff;                                                                 \
        if ((set) == 0) {                                                                                          \
            AMX_LOAD_A(1, kind, direct, wr, o_, b->w_stride, abuf[0]);                                             \
            AMX_LOADD(2, xt + (size_t)bk_ * AMX_T * KVP_QK, AMX_T * 4);                                            \
            AMX_ZERO(0);                                                                                           \
            AMX_DPBSSD(0, 1, 2);                                                                                   \
        } else {                                                                                                   \
            AMX_LOAD_A(4, kind, direct, wr, o_, b->w_stride, abuf[1]);                                             \
            AMX_LOADD(5, xt + (size_t)bk_ * AMX_T * KVP_QK, AMX_T * 4);                                            \
            AMX_ZERO(3);                                                                                           \
            AMX_DPBSSD(3, 4, 5);                                                                                   \
        }                                                                                                          \
    } while (0)
#define ROWS_SCALE(set, blk)                                                                                       \
    do {                                                                                                           \
        block_scales(kind, b, wr, ri, offs, (blk), dw, NULL);                                                      \
        amx_scale(cbuf[set], _mm512_loadu_ps(dxs + (size_t)(blk) * 3 * AMX_S), dw, acc);                          \
    } while (0)
    AMX_PIPELINE(ROWS_ISSUE, ROWS_SCALE);
#undef ROWS_ISSUE
#undef ROWS_SCALE
    /* the minimum terms' chain (zero without one: acc + 0 as VNNI adds it) */
    __m512 ma[AMX_ROWS];
    _Pragma("GCC unroll 16") for (int m = 0; m < AMX_ROWS; m++)
        ma[m] = _mm512_setzero_ps();
    if (has_m) {
        _Alignas(64) float mw[AMX_ROWS];
        for (uint32_t blk = 0; blk < nb; blk++) {
            block_scales(kind, b, wr, ri, offs, blk, dw, mw);
            const __m512 sx = _mm512_loadu_ps(dxs + (size_t)blk * 3 * AMX_S + AMX_S);
            _Pragma("GCC unroll 16") for (int m = 0; m < AMX_ROWS; m++)
                ma[m] = _mm512_fmadd_ps(_mm512_set1_ps(mw[m]), sx, ma[m]);
        }
    }
    _Pragma("GCC unroll 16") for (int m = 0; m < AMX_ROWS; m++)
        _mm512_store_ps(out[m], _mm512_add_ps(acc[m], ma[m]));
}

/* A piece: its rows 16 at a time, the outputs of its nt tokens kept. */
KVP_AMX __attribute__((always_inline)) static inline void amx_mm(int kind, const kvp_mm_blk *b)
{
    _Alignas(64) float out[AMX_ROWS][AMX_T];
    amx_config();
    const __m512i col = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(AMX_T));
    for (uint32_t r0 = 0; r0 < b->nr; r0 += AMX_ROWS) {
        amx_rows(kind, b, r0, out);
        if (b->nr - r0 >= AMX_ROWS) /* token t's 16 outputs: column t of out */
            for (uint32_t t = 0; t < b->nt; t++)
                _mm512_storeu_ps(b->y + (size_t)t * b->ldy + r0, _mm512_i32gather_ps(col, &out[0][t], 4));
        else
            for (uint32_t t = 0; t < b->nt; t++)
                for (uint32_t m = 0; r0 + m < b->nr; m++)
                    b->y[(size_t)t * b->ldy + r0 + m] = out[m][t];
    }
}

/* Rows of 16 (KVP_CPU_DTYPE_*_R16; kind 5 Q8_0, 6 Q4_0, 7 Q4_1, 8 i8, 9
 * i4): the weight is the B operand (a block of 16 rows: 8 lines of 16
 * rows' 4-byte groups; the byte kinds' as it lies, the nibble kinds'
 * unpacked into bbuf, Q4_0 and i4 as q - 8) and the tokens the A operand
 * (their blocks whole, a token a tile row: the tile of unit 32), so the
 * sums come out a token a row, 16 weight rows in its lanes: each token's
 * acc = fma(dot, dw * dx, acc) over the blocks (Q4_1's minimums and the
 * zero points' -z * scale in their own chain, fma(m, s, ma)) with the
 * rows' scales loaded as they lie, no gather, and its 16 outputs stored as
 * they are, only the group's tokens scaled.  The same float terms in the
 * same order as the rows kernel and amx_rows: the same bits.  out[t][m]. */
KVP_AMX static inline const uint8_t *r16_b(int kind, const uint8_t *q, int8_t *bbuf)
{
    if (kind == 5 || kind == 8)
        return q;
    const __m512i m4 = _mm512_set1_epi8(15), off = _mm512_set1_epi8(kind == 6 || kind == 9 ? 8 : 0);
    for (int k = 0; k < 4; k++) {
        __m512i v = _mm512_loadu_si512(q + 64 * k);
        _mm512_store_si512((__m512i *)(bbuf + 64 * k), _mm512_sub_epi8(_mm512_and_si512(v, m4), off));
        _mm512_store_si512((__m512i *)(bbuf + 64 * (k + 4)),
                           _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4), off));
    }
    return (const uint8_t *)bbuf;
}

/* Block blk's scales and minimum terms in a group's lanes: dw (f32 from
 * f16, or the scaled kinds' group scale) and mw (Q4_1's m, -z * scale, or
 * zero). */
KVP_AMX __attribute__((always_inline)) static inline void r16_scales(int kind, const kvp_mm_blk *b, uint32_t r0,
                                                                     const uint16_t *gd, const uint16_t *gm,
                                                                     uint32_t blk, __m512 *dw, __m512 *mw)
{
    const int scaled = kind == 8 || kind == 9;
    *mw = _mm512_setzero_ps();
    if (scaled) {
        size_t at = (size_t)r0 * b->sc_stride + (size_t)(blk / (b->g / KVP_QK)) * AMX_ROWS;
        *dw = _mm512_loadu_ps(b->sc + at);
        if (b->zp) { /* -z, by its sign bit, times the scale */
            __m512i z = _mm512_castps_si512(_mm512_loadu_ps(b->zp + at));
            *mw = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_xor_si512(z, _mm512_set1_epi32((int32_t)0x80000000))), *dw);
        }
        return;
    }
    const size_t bo = (size_t)blk * AMX_ROWS;
    *dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(gd + bo)));
    if (kind == 7)
        *mw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(gm + bo)));
}

/* The float step of one block: the first nt tokens' exact dots (cbuf, a
 * token a row) into their sums, acc = fma(dot, dw * dx, acc), and the
 * minimum terms ma = fma(mw, s, ma) where the kind has them.  nt is a
 * constant 16 for full groups, so a full group's loop has no test. */
KVP_AMX __attribute__((always_inline)) static inline void r16_scale(const int32_t *cbuf, const float *dx, __m512 dw,
                                                                    __m512 mw, int has_m, uint32_t nt, __m512 *acc,
                                                                    __m512 *ma)
{
    _Pragma("GCC unroll 16") for (int t = 0; t < AMX_T; t++) {
        if ((uint32_t)t >= nt) /* a short group's empty rows: nothing to scale */
            break;
        __m512 dot = _mm512_cvtepi32_ps(_mm512_load_si512((const __m512i *)(cbuf + t * AMX_ROWS)));
        acc[t] = _mm512_fmadd_ps(dot, _mm512_mul_ps(dw, _mm512_set1_ps(dx[t])), acc[t]);
        if (has_m)
            ma[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(dx[AMX_S + t]), ma[t]);
    }
}

/* Block blk of the group on tile set 0 (tiles 0-2) or 1 (3-5): its tokens
 * (A) and weight rows (B) loaded, the sums zeroed, the multiply issued. */
#define R16_ISSUE(set, blk)                                                                                        \
    do {                                                                                                           \
        const uint32_t bk_ = (blk);                                                                                \
        if ((set) == 0) {                                                                                          \
            AMX_LOADD(1, xt + (size_t)bk_ * AMX_T * KVP_QK, KVP_QK);                                              \
            AMX_LOADD(2, r16_b(kind, gq + (size_t)bk_ * qb, bbuf[0]), 64);                                        \
            AMX_ZERO(0);                                                                                           \
            AMX_DPBSSD(0, 1, 2);                                                                                   \
        } else {                                                                                                   \
            AMX_LOADD(4, xt + (size_t)bk_ * AMX_T * KVP_QK, KVP_QK);                                              \
            AMX_LOADD(5, r16_b(kind, gq + (size_t)bk_ * qb, bbuf[1]), 64);                                        \
            AMX_ZERO(3);                                                                                           \
            AMX_DPBSSD(3, 4, 5);                                                                                   \
        }                                                                                                          \
    } while (0)

/* Block blk's sums, stored into cbuf[set] earlier, scaled into acc (ma). */
#define R16_SCALE(set, blk, NT)                                                                                    \
    do {                                                                                                           \
        __m512 dw_, mw_;                                                                                           \
        r16_scales(kind, b, r0, gd, gm, (blk), &dw_, &mw_);                                                        \
        r16_scale(cbuf[set], dxs + (size_t)(blk) * 3 * AMX_S, dw_, mw_, has_m, (NT), acc, ma);                    \
    } while (0)

/* A full group's scaling (a constant 16 tokens: no test a token) and a
 * short one's. */
#define R16_SCALE_FULL(set, blk) R16_SCALE(set, blk, AMX_T)
#define R16_SCALE_SHORT(set, blk) R16_SCALE(set, blk, b->nt)

KVP_AMX __attribute__((always_inline)) static inline void amx_r16_group(int kind, const kvp_mm_blk *b, uint32_t r0,
                                                                        float (*out)[AMX_ROWS])
{
    const uint32_t nb = b->n / KVP_QK;
    const size_t qb = (size_t)AMX_ROWS * b->w_stride / nb;
    const uint8_t *gq = b->w + (size_t)r0 * b->w_stride;
    const int scaled = kind == 8 || kind == 9, has_m = kind == 7 || (scaled && b->zp);
    const uint16_t *gd = scaled ? NULL : b->d16 + (size_t)(r0 / AMX_ROWS) * nb * AMX_ROWS;
    const uint16_t *gm = kind == 7 ? b->m16 + (size_t)(r0 / AMX_ROWS) * nb * AMX_ROWS : NULL;
    _Alignas(64) int32_t cbuf[2][AMX_T * AMX_ROWS];
    _Alignas(64) int8_t bbuf[2][8 * 64];
    const int8_t *xt = b->xt;
    const float *dxs = b->dxs;
    __m512 acc[AMX_T], ma[AMX_T];
    _Pragma("GCC unroll 16") for (int t = 0; t < AMX_T; t++)
        acc[t] = ma[t] = _mm512_setzero_ps();
    /* the next group's quants, a share of them a pair of blocks, where the
     * rows are read once (as amx_rows) */
    const uint8_t *pf = gq + (size_t)nb * qb;
    const size_t pf_step = b->once ? (qb * 2 + 63) & ~(size_t)63 : 0;
    if (b->nt == AMX_T)
        AMX_PIPELINE(R16_ISSUE, R16_SCALE_FULL);
    else
        AMX_PIPELINE(R16_ISSUE, R16_SCALE_SHORT);
    /* + ma: the minimum terms' chain (zero without minimums or zero points, as the others add it) */
    _Pragma("GCC unroll 16") for (int t = 0; t < AMX_T; t++)
        _mm512_store_ps(out[t], _mm512_add_ps(acc[t], ma[t]));
}

KVP_AMX __attribute__((always_inline)) static inline void amx_r16(int kind, const kvp_mm_blk *b)
{
    _Alignas(64) float out[AMX_T][AMX_ROWS];
    amx_config();
    for (uint32_t r0 = 0; r0 < b->nr; r0 += AMX_ROWS) {
        amx_r16_group(kind, b, r0, out);
        uint32_t nr = b->nr - r0 < AMX_ROWS ? b->nr - r0 : AMX_ROWS;
        for (uint32_t t = 0; t < b->nt; t++)
            if (nr == AMX_ROWS)
                _mm512_storeu_ps(b->y + (size_t)t * b->ldy + r0, _mm512_load_ps(out[t]));
            else
                memcpy(b->y + (size_t)t * b->ldy + r0, out[t], nr * sizeof(float));
    }
}

KVP_AMX static void amx_r16_q8_0(const kvp_mm_blk *b) { amx_r16(5, b); }
KVP_AMX static void amx_r16_q4_0(const kvp_mm_blk *b) { amx_r16(6, b); }
KVP_AMX static void amx_r16_q4_1(const kvp_mm_blk *b) { amx_r16(7, b); }
KVP_AMX static void amx_r16_i8(const kvp_mm_blk *b) { amx_r16(8, b); }
KVP_AMX static void amx_r16_i4(const kvp_mm_blk *b) { amx_r16(9, b); }

KVP_AMX static void amx_q4_0(const kvp_mm_blk *b) { amx_mm(0, b); }
KVP_AMX static void amx_q4_1(const kvp_mm_blk *b) { amx_mm(1, b); }
KVP_AMX static void amx_q8_0(const kvp_mm_blk *b) { amx_mm(2, b); }
KVP_AMX static void amx_i8(const kvp_mm_blk *b) { amx_mm(3, b); }
KVP_AMX static void amx_i4(const kvp_mm_blk *b) { amx_mm(4, b); }

/* Steps of fewer tokens than this stay on the VNNI kernels' rows (up to
 * their few_tok, 7, no tile): inside a model (SmolLM2 Q4_1, a step of n
 * tokens, bench_cpu pp n, 2 threads, Intel Xeon with AMX, the two settings
 * in turns) the rows of 16 ran steps of 6 and 7 tokens 1.45x faster than
 * AMX (905 and 1010 tok/s against 615 and 700).  From 8 tokens AMX's tile
 * of 16 costs less than VNNI's tiles of 8. */
#define KVP_AMX_MIN_TOK 8

/* Q8_0 and i8 from 9 tokens: in the same runs on SmolLM2 q8_0 (as
 * stored), VNNI's tile took steps of 8 tokens at 846 tok/s against AMX's
 * 766-798, and AMX steps of 9 at 830-844 against 704-729 (a tile of 8 and
 * a row).  In rows of 16 the same holds: steps of 7 and 8 tokens on the
 * rows kernel 805-832 and 901-929 tok/s, on AMX 779-801 and 869-874; of 9
 * on AMX 941-957 against 862-904 on the rows (a group of 8 and one). */
#define KVP_AMX_MIN_TOK_Q8 9

/* Q4_0, Q4_1 and i4 in rows of 16 from 32 tokens: the rows kernel reads them
 * with 4 loads and 12 bit operations a block of 16 rows and keeps them
 * in L1 for every group of 8 tokens, where AMX unpacks them into a buffer
 * for its tile load at every group of 16.  Inside SmolLM2 Q4_1 (bench_cpu
 * pp n, 2 threads, in turns): rows against AMX 1392-1436 / 1165-1208
 * tok/s at 8 tokens, 1435-1450 / 1119-1140 at 17, 1601-1619 / 1422-1473
 * at 24; at 32 AMX 1759-1878 against 1671-1686, at 64 1925-1953 against
 * 1788-1847. */
#define KVP_AMX_MIN_TOK_Q4R 32

static kvp_cpu_kernels kernels_amx;
static int amx_ok;

/* CPUID leaf 7: EDX bit 24 AMX-TILE, bit 25 AMX-INT8; XCR0 bits 17 and 18
 * the tile state the OS saves; then the kernel's grant (Linux 5.16+): the
 * tile data is off until a process asks for it. */
static void amx_init(void)
{
    const kvp_cpu_kernels *v = kvp_cpu_kernels_vnni();
    unsigned a, b, c, d;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    if (!v || !(d >> 24 & 1) || !(d >> 25 & 1))
        return;
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo >> 17 & 3) != 3)
        return;
#ifdef SYS_arch_prctl
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) != 0)
        return;
#else
    return;
#endif
    kernels_amx = *v;
    kvp_cpu_vnni_wide_floats(&kernels_amx); /* v has them on Intel; whoever has AMX has two 512-bit FMA units */
    kernels_amx.isa = "avx2+fma+f16c+avx512vnni+amx-int8";
    kernels_amx.amx_mm[0] = amx_q4_0, kernels_amx.amx_mm[1] = amx_q4_1, kernels_amx.amx_mm[2] = amx_q8_0;
    kernels_amx.amx_mm[3] = amx_i8, kernels_amx.amx_mm[4] = amx_i4;
    kernels_amx.amx_mm[5] = amx_r16_q8_0, kernels_amx.amx_mm[6] = amx_r16_q4_0, kernels_amx.amx_mm[7] = amx_r16_q4_1;
    kernels_amx.amx_mm[8] = amx_r16_i8, kernels_amx.amx_mm[9] = amx_r16_i4;
    kernels_amx.amx_min_tok = KVP_AMX_MIN_TOK, kernels_amx.amx_min_tok_q8 = KVP_AMX_MIN_TOK_Q8;
    kernels_amx.amx_min_tok_q4r = KVP_AMX_MIN_TOK_Q4R;
    amx_ok = 1;
}

const kvp_cpu_kernels *kvp_cpu_kernels_amx(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, amx_init);
    return amx_ok ? &kernels_amx : NULL;
}

#else

const kvp_cpu_kernels *kvp_cpu_kernels_amx(void) { return NULL; }

#endif
