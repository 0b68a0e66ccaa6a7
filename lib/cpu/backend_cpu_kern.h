/* backend_cpu_kern.h - the CPU backend's inner kernels (private to
 * backend_cpu*.c): one table per instruction set, picked at run time.
 *
 * Quantized weights are multiplied without dequantizing them: activations are
 * first quantized to 8-bit blocks of 32 (kvp_q8blk), then each weight block
 * meets one activation block in integer arithmetic, as llama.cpp does.
 *   Q8_0:  dw*dx * sum(qw*qx)
 *   Q4_1:  dw*dx * sum(qw*qx) + mw * s,      s = dx * sum(qx)
 *   Q4_0:  dw*dx * sum(qw*qx) - 8*dw * s     (stored q in 0..15, y = (q-8) dw)
 * Scaled i8 and i4 rows (group g a multiple of 32) are the same with the
 * group's scale for dw and -z * scale for mw (z the zero point; i4 is stored
 * offset: q = (nibble ^ 8) - 8, element 2k low nibble, 2k+1 high); fp8 e4m3
 * rows meet f32 activations.  Every table gives the same results within
 * float rounding (summation order), and each table the same bits for a
 * token in any batch (kvp_mm_blk).
 */
#ifndef KVP_BACKEND_CPU_KERN_H
#define KVP_BACKEND_CPU_KERN_H

#include "backend.h"
#include "tensor.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define KVP_QK 32      /* elements per quantization block */
#define KVP_MM_TILE 8  /* most tokens a group holds (tile_tok) */
#define KVP_Q8_SCALES 24 /* 4-byte slots per block in a tile's scale table */

/* An activation block: 32 int8 with scale d, their sum, and s = d * sum. */
typedef struct kvp_q8blk {
    float d, s;
    int32_t sum;
    int8_t q[KVP_QK];
} kvp_q8blk;

/* An activation block holding a NaN or an infinity: all-zero quants under
 * a NaN scale, so every product with it is NaN (a max drops a NaN, and the
 * step's non-finite check then never saw the NaN a weight had put there).
 * Every kernel set's quant_q8 writes these bytes. */
static inline void kvp_q8_nan_block(kvp_q8blk *y)
{
    memset(y->q, 0, sizeof y->q);
    y->d = NAN, y->sum = 0, y->s = NAN;
}

/* Stored weight blocks (GGUF layouts; FACTS.md). */
typedef struct kvp_blk_q4_0 {
    uint16_t d;            /* f16 */
    uint8_t qs[16];        /* byte j: element j (low nibble), element j+16 (high) */
} kvp_blk_q4_0;
typedef struct kvp_blk_q4_1 {
    uint16_t d, m;         /* f16 scale and minimum */
    uint8_t qs[16];
} kvp_blk_q4_1;
typedef struct kvp_blk_q8_0 {
    uint16_t d;
    int8_t qs[32];
} kvp_blk_q8_0;
_Static_assert(sizeof(kvp_blk_q4_0) == 18, "q4_0 block is 18 bytes");
_Static_assert(sizeof(kvp_blk_q4_1) == 20, "q4_1 block is 20 bytes");
_Static_assert(sizeof(kvp_blk_q8_0) == 34, "q8_0 block is 34 bytes");

/* One piece of a matmul, the only way the backend reaches the dot kernels:
 * rows r < nr (<= KVP_MM_ROWS) of a weight by the tokens t < nt (<= the
 * table's tile_tok) of one token group, y[t * ldy + r] = dot(row r, token t).
 *
 * Batch invariance: every kernel set fixes one order of float operations
 * for each (row, token) and keeps it whatever nr, nt, the token's place in
 * the group and the row's place in the piece are, so a token's outputs are
 * the same bits in any batch (its prompt chunked any way, any thread
 * count).  The kernel sets differ from each other in that order:
 *   portable:  blocks (elements) in order into one float.
 *   AVX2:      8 float lanes, each block's products (each 8 elements) added
 *              in order by FMA, then one horizontal sum; Q4 minimums and
 *              zero points in a chain of FMAs of their own, added last.
 *   VNNI:      quantized kinds: each block's exact i32 dot product, then
 *              one scalar chain of FMAs over the blocks, the minimum terms
 *              in a second chain, added last; floats as AVX2.
 *
 * Quantized kinds (Q4_0, Q4_1, Q8_0, i8, i4) read the tokens' blocks xq or
 * the group's tile xt/dxs (kvp_cpu_q8_tile_put), which the backend builds
 * when nt > few_tok; wsum is set with the tile for Q8_0 and i8 under
 * tile_flip.  Scaled kinds: row r's scales at sc + r * sc_stride (zero
 * points zp likewise, or NULL), one per g elements.  Float kinds (f32, f16,
 * bf16, and fp8 e4m3 with its scales) read the rows xf. */
#define KVP_MM_ROWS 8
#define KVP_MM_FEW_ROWS 16 /* few_rows at most */
/* Rows of a piece of f16 or bf16 weights by full token groups on a
 * float_groups table: runs of 6 rows (backend_cpu_x86_wide.inc) */
#define KVP_WIDE_ROWS 24
typedef struct kvp_mm_blk {
    const uint8_t *w;          /* row 0; row r at w + r * w_stride */
    size_t w_stride;
    const float *sc, *zp;      /* scaled kinds: row 0's scales and zero points */
    size_t sc_stride;
    uint32_t g;
    const int32_t *wsum;       /* row 0's block sums (nb a row), see above */
    const int8_t *xt;          /* the tile, or NULL when nt <= few_tok */
    const float *dxs;
    const kvp_q8blk *const *xq; /* [nt]: each token's n / 32 blocks */
    const float *const *xf;    /* [nt]: each token's n floats */
    uint32_t n;                /* elements a row */
    uint32_t nr, nt;
    float *y;
    size_t ldy;
    /* float_groups kernels: ng (> 1) full groups of tile_tok tokens, group
     * g's tile at xt + g * xt_stride bytes, its rows and outputs the next
     * tokens' (0 or 1: the one group above) */
    uint32_t ng;
    size_t xt_stride;
    /* the call's rows are read once (one task's tokens are the matmul's
     * all): AMX prefetches the next rows, which only memory holds */
    int once;
    /* rows of 16: the f16 scales and (Q4_1) minimums of the piece's first
     * group of 16 rows, 16 a block (kvp_r16_plane) */
    const uint16_t *d16, *m16;
} kvp_mm_blk;
typedef void (*kvp_mm_fn)(const kvp_mm_blk *b);

/* One token's activation blocks x[0..nb) into slot t of a tile of T (<= 8,
 * or KVP_AMX_TOK) tokens, the layout the tile kernels read.  xt (32-byte
 * aligned): each block's T * 32 quants, in groups of unit bytes (32: whole
 * blocks; 4: four elements; no other), group c of slot t at (c * T + t) *
 * unit, each quant xor 0x80 (x + 128 as u8) when flip.  dxs: 3 * S slots a
 * block (S = kvp_q8_slots(T): KVP_Q8_SCALES floats up to 8 tokens), the
 * tokens' d (f32) at t, s (f32) at S + t, sum(q) (i32) at 2S + t; slots
 * T..S-1 of each zero. */
void kvp_cpu_q8_tile_put(const kvp_q8blk *x, uint32_t t, uint32_t T, uint32_t nb, uint32_t unit, int flip,
                         int8_t *xt, float *dxs);
/* A float tile: token t's elements i < n & ~7 of a group of T tokens at
 * xt[(i / 8) * 8T + 8t + i % 8], 8-element steps of the T tokens side by
 * side (a run's activations a step from one pointer); tokens past the
 * group's last zero. */
void kvp_cpu_f32_tile_put(const float *x, uint32_t t, uint32_t T, uint32_t n, float *xt);
static inline size_t kvp_f32_tile_bytes(uint32_t T, uint32_t n) { return (size_t)(n & ~7u) * T * sizeof(float); }

/* Slots a tile's scale table gives each of d, s and sum(q) a block. */
static inline uint32_t kvp_q8_slots(uint32_t T) { return T > 8 ? T : 8; }
/* Bytes of a tile of T tokens over nb blocks: its quants, then its scales. */
static inline size_t kvp_q8_tile_bytes(uint32_t T, uint32_t nb)
{
    return (size_t)nb * (T * KVP_QK + 3 * kvp_q8_slots(T) * sizeof(float));
}

/* Rows of 16 (kvp_cpu_as_r16): Q8_0, Q4_0 and Q4_1 in a form private to
 * this backend, for the tables that have mm_r16: a block of 16 rows is one
 * 64-byte line per group of 4 elements, lane r of line j holding elements
 * 4j..4j+3 of row r, so the VNNI rows kernel has its lanes without a
 * transposition and AMX reads it as the B operand.  Q8_0: 8 lines a block.
 * Q4_0 and Q4_1: 4 lines, lane r of line k being bytes 4k..4k+3 of the
 * row's 16 (GGUF: byte j holds element j low, j + 16 high), so its low
 * nibbles are group k and its high ones group k + 4.  The rows are taken
 * 16 at a time (n_out padded with the last row repeated); group G's block
 * b has its quants at data + (G nb + b) qbytes (row_bytes is qbytes / 16 a
 * block: 16 rows are a group's quants), then the planes of f16 scales, 16
 * a block, at the same place in each: d, then Q4_1's minimums m.  int8
 * and int4 (scaled, groups of g, a multiple of 32) likewise, int4's
 * nibbles rearranged to Q4_0's order (stored as q + 8, as i4 is), their
 * f32 scales and zero points in planes of their own (the weight's scales
 * and zeros: row r's group u at r * (n_in / g) + u * 16 for r a multiple
 * of 16, so scale_stride stays n_in / g).  The values and the products are
 * the stored kind's, bit for bit.
 *
 * GGUF's Q6_K (no kernel as stored) is taken in rows of 16 too: its codes
 * q (0..63, y = d sc (q - 32)) as Q4_0's nibble lines for their low 4
 * bits and two lines for the high 2 (lane r's byte p of line 4 + k / 4
 * holding in bits 2 (k % 4) those of element 4k + p), plane 0
 * its super-block's f16 d for each of the 8 blocks of 32 in it, plane 1
 * the block's two 16-element sub-block scales, sc_lo | sc_hi << 8 (int8
 * each).  Its product is llama.cpp's for K-quants: per block of 32 the
 * exact integer sc_lo sum(lo (q - 32) x) + sc_hi sum(hi (q - 32) x), then
 * times d dx in f32 (test_engine's q6k_ref_dot is the reference).
 *
 * GGUF's Q4_K likewise (y = d sc q - dmin m a sub-block of 32): its codes
 * as Q4_0's nibbles, plane 0 each block's 6-bit sc | m << 8, and plane 1
 * a super-block's f16 d for the 16 rows, then its f16 dmin (32 a
 * super-block: 18.5 bytes a block against Q4_K's 18, where int4 with f32
 * scales and zero points took 24).  Its product: per block the exact
 * integer sum(q x) times (d sc) dx, and dmin m times -s in a second chain
 * (d sc and dmin m are exact in f32; q4k_ref_dot in test_engine).  Q5_K
 * (y = d sc q - dmin m, q 0..31) the same with a fifth line a block after
 * the nibbles: lane r's byte p holds in bit k the fifth bit of element 4k +
 * p (22.5 bytes a block against Q5_K's 22).  GGUF's Q5_0 and Q5_1 are
 * Q4_0 and Q4_1 in rows of 16 with that fifth line: nibbles (q + 16 as
 * Q4_0's q + 8: the kernel takes 16 sum(x) off) and planes as theirs, 22
 * and 24 bytes a block as stored, where Q5_0 as Q8_0 took 34.  Q2_K (y =
 * d s c - dmin m a sub-block of 16, c 0..3, s and m 4 bits) has Q4_K's
 * planes with plane 0 the block's two stored bytes s | m << 4, and its
 * codes in two lines of 2-bit fields (lane r's byte p of line k / 4
 * holding in bits 2 (k % 4) element 4k + p's: 10.5 bytes a block, as
 * stored); Q3_K (y = d s (c - 4), c 0..7, s a signed 6-bit scale) Q6_K's
 * planes, its codes' low two bits so and their third in a line as Q5_K's
 * fifth (16 bytes against 13.75).  Their
 * products: per 16-element half the exact integer sums, weighted by the
 * integer scales (Q2_K: and the minimums by the half's sum(x)), then
 * times d dx (dmin dx) in f32, as llama.cpp's.
 *
 * GGUF's IQ4_NL (y = d v[q], v llama.cpp's 16 int8 values, q a 4-bit
 * index) is Q4_0 in rows of 16, its indices as Q4_0's nibbles and d its
 * plane (18 bytes a block, as stored); IQ4_XS (y = d (ls - 32) v[q] a
 * sub-block of 32, ls 6 bits) has Q4_K's planes, plane 0 a block's ls and
 * plane 1 its super-block's d (18.5 bytes against 17).  The kernel looks
 * each index up as v + 128 (u8: one vpshufb a line) and takes 128 sum(x)
 * off, so a block's sum is the exact sum(v[q] x), times d dx (IQ4_XS:
 * (d (ls - 32)) dx, exact in f32): the bits of Q8_0 (int8 with an f32
 * scale a group) holding the same values. */
#define KVP_CPU_DTYPE_Q8_0_R16 (KVP_DTYPE_COUNT + 1)
#define KVP_CPU_DTYPE_Q4_0_R16 (KVP_DTYPE_COUNT + 2)
#define KVP_CPU_DTYPE_Q4_1_R16 (KVP_DTYPE_COUNT + 3)
#define KVP_CPU_DTYPE_I8_R16 (KVP_DTYPE_COUNT + 4)
#define KVP_CPU_DTYPE_I4_R16 (KVP_DTYPE_COUNT + 5)
#define KVP_CPU_DTYPE_Q6_K_R16 (KVP_DTYPE_COUNT + 6)
#define KVP_CPU_DTYPE_Q4_K_R16 (KVP_DTYPE_COUNT + 7)
#define KVP_CPU_DTYPE_Q5_K_R16 (KVP_DTYPE_COUNT + 8)
#define KVP_CPU_DTYPE_Q5_0_R16 (KVP_DTYPE_COUNT + 9)
#define KVP_CPU_DTYPE_Q5_1_R16 (KVP_DTYPE_COUNT + 10)
#define KVP_CPU_DTYPE_Q2_K_R16 (KVP_DTYPE_COUNT + 11)
#define KVP_CPU_DTYPE_Q3_K_R16 (KVP_DTYPE_COUNT + 12)
#define KVP_CPU_DTYPE_IQ4_NL_R16 (KVP_DTYPE_COUNT + 13)
#define KVP_CPU_DTYPE_IQ4_XS_R16 (KVP_DTYPE_COUNT + 14)
#define KVP_R16_KINDS 14
#define KVP_R16_ROWS 16
static inline int kvp_r16_kind(int dtype) { return dtype >= KVP_CPU_DTYPE_Q8_0_R16 && dtype <= KVP_CPU_DTYPE_IQ4_XS_R16; }
/* Whether a kind in rows of 16 has a plane 1 (Q4_1's and Q5_1's
 * minimums, the K-quants' second planes). */
static inline int kvp_r16_plane1(int dtype)
{
    return dtype == KVP_CPU_DTYPE_Q4_1_R16 || dtype == KVP_CPU_DTYPE_Q5_1_R16 ||
           (dtype >= KVP_CPU_DTYPE_Q6_K_R16 && dtype != KVP_CPU_DTYPE_Q5_0_R16 && dtype != KVP_CPU_DTYPE_IQ4_NL_R16);
}
/* Q4_K, Q5_K and Q2_K: planes of a block's scales and minimums and a
 * super-block's d and dmin (IQ4_XS: its scales, and d) */
static inline int kvp_r16_k45(int dtype)
{
    return dtype == KVP_CPU_DTYPE_Q4_K_R16 || dtype == KVP_CPU_DTYPE_Q5_K_R16 || dtype == KVP_CPU_DTYPE_Q2_K_R16 ||
           dtype == KVP_CPU_DTYPE_IQ4_XS_R16;
}
/* A block's quant bytes for 16 rows. */
static inline size_t kvp_r16_qbytes(int dtype)
{
    int bytes8 = dtype == KVP_CPU_DTYPE_Q8_0_R16 || dtype == KVP_CPU_DTYPE_I8_R16;
    if (dtype == KVP_CPU_DTYPE_Q6_K_R16) /* nibbles, then two lines of high bits */
        return KVP_R16_ROWS * (KVP_QK / 2 + KVP_QK / 4);
    if (dtype == KVP_CPU_DTYPE_Q2_K_R16 || dtype == KVP_CPU_DTYPE_Q3_K_R16) /* two lines of 2-bit fields (and one of bit 2) */
        return KVP_R16_ROWS * (KVP_QK / 4 + (dtype == KVP_CPU_DTYPE_Q3_K_R16 ? KVP_QK / 8 : 0));
    if (dtype == KVP_CPU_DTYPE_Q5_K_R16 || dtype == KVP_CPU_DTYPE_Q5_0_R16 || dtype == KVP_CPU_DTYPE_Q5_1_R16)
        /* nibbles, then a line of fifth bits */
        return KVP_R16_ROWS * (KVP_QK / 2 + KVP_QK / 8);
    return bytes8 ? KVP_R16_ROWS * KVP_QK : KVP_R16_ROWS * KVP_QK / 2;
}
static inline uint32_t kvp_r16_groups(uint32_t n_out) { return (n_out + KVP_R16_ROWS - 1) / KVP_R16_ROWS; }
/* Plane p (0 the scales d, 1 Q4_1's minimums m or Q6_K's sub-block scales) of the group holding row r
 * (a multiple of 16) of a weight in rows of 16. */
static inline const uint16_t *kvp_r16_plane(const void *data, int dtype, uint32_t n_out, uint32_t n_in, int p,
                                            uint32_t r)
{
    size_t nb = n_in / KVP_QK, blocks = (size_t)kvp_r16_groups(n_out) * nb;
    const uint16_t *planes = (const uint16_t *)((const uint8_t *)data + blocks * kvp_r16_qbytes(dtype));
    if (kvp_r16_k45(dtype) && p == 1) /* a super-block's d and dmin, 32 to 8 blocks */
        return planes + blocks * KVP_R16_ROWS + (size_t)(r / KVP_R16_ROWS) * nb * 4;
    return planes + (size_t)p * blocks * KVP_R16_ROWS + (size_t)(r / KVP_R16_ROWS) * nb * KVP_R16_ROWS;
}
/* Bytes of the planes of a weight in rows of 16 of `blocks` blocks (16
 * rows each) with `planes` planes of 16 a block (Q4_K: its own two). */
static inline size_t kvp_r16_plane_bytes(int dtype, size_t blocks, int planes)
{
    if (kvp_r16_k45(dtype))
        return blocks * (KVP_R16_ROWS + 4) * sizeof(uint16_t);
    return blocks * (size_t)planes * KVP_R16_ROWS * sizeof(uint16_t);
}

/* AMX (backend_cpu_amx.c): a tile multiply takes 16 weight rows (one block
 * each) by KVP_AMX_TOK tokens, their activations a tile of that many tokens
 * in groups of 4 bytes, unflipped: the B operand of tdpbssd as it stands. */
#define KVP_AMX_TOK 16

/* Bytes of one K/V element of a cache dtype (f32, f16, bf16, fp8, i8). */
static inline size_t kvp_cpu_kv_esize(int dtype) { return kvp_kv_esize(dtype); }

struct kvp_weight;

typedef struct kvp_cpu_kernels {
    const char *isa;
    uint32_t tile_tok;     /* tokens a group (and a tile) holds, <= KVP_MM_TILE */
    uint32_t few_tok;      /* groups of up to this many tokens need no tile */
    /* rows a piece of a quantized kind takes in groups of up to few_tok
     * tokens, a multiple of KVP_MM_ROWS up to KVP_MM_FEW_ROWS (0: KVP_MM_ROWS) */
    uint32_t few_rows;
    uint32_t tile_unit;    /* the xt grouping the tiles use (kvp_cpu_q8_tile_put) */
    int tile_flip;         /* Q8_0 and i8 tiles: xt flipped, and a wsum table */
    /* out[b] = -128 * sum of the 32 int8 at q + b * stride, b < nb (NULL
     * without tile_flip). */
    void (*wsum)(const uint8_t *q, size_t stride, uint32_t nb, int32_t *out);
    void (*quant_q8)(const float *x, kvp_q8blk *y, uint32_t n); /* n multiple of 32 */
    kvp_mm_fn mm_q4_0, mm_q4_1, mm_q8_0, mm_i8, mm_i4; /* i8, i4: g a multiple of 32 */
    /* Q8_0, Q4_0, Q4_1, i8, i4, Q6_K, Q4_K, Q5_K, Q5_0, Q5_1, Q2_K and Q3_K in rows of 16
     * (KVP_CPU_DTYPE_*_R16, in that order): pieces of rows from a multiple
     * of 16 by up to tile_tok tokens read from their blocks (no tile), the
     * stored kind's bits (the K-quants: the products above).  NULL where
     * the table multiplies them as stored (the K-quants but Q4_K and Q5_1
     * by the row path, Q4_K as int4, Q5_0 as Q8_0); where set, the backend rewrites
     * those weights so. */
    kvp_mm_fn mm_r16[KVP_R16_KINDS];
    kvp_mm_fn mm_f32, mm_f16, mm_bf16, mm_e4m3;       /* e4m3: any g dividing n */
    /* Attention (backend_cpu.c): scores s[p * ldq + j] of key p for query
     * lane j, ldq a multiple of 8.  Like the matmul, each (query, key) score
     * and each output element has one order of operations whatever the
     * other lanes hold. */
    /* n K/V elements of dtype f16/bf16/f32 as f32, or of a scaled dtype
     * as their codes' values, unscaled: i8 as they are, fp8_e4m3 / 256.
     * An e4m3 code's bits moved into an f16 (the sign to bit 15, the
     * other seven to bits 13..7) make that f16 exactly the code's value /
     * 256, subnormals included, so an fp8 cache can be read as f16 at the
     * price of three integer operations a 16 elements, and the 256 goes
     * into its row scales (a power of two: the products and sums are the
     * same numbers / 256, the scaled results the same bits, unless a
     * product or partial sum lands under 2^-118, where the / 256 one
     * leaves f32's normal range: a query element under 2^-109 times the
     * least code, or a cancellation to within 3e-36). */
    void (*kv_f32)(int dtype, const void *src, float *dst, uint32_t n);
    /* n fp8 e4m3 codes as those f16 bits (kvp_e4m3_f16_bits). */
    void (*kv_f16_e4m3)(const uint8_t *src, uint16_t *dst, uint32_t n);
    /* Queries as rows q[nq][hd] (nq <= ldq) against np keys k[np][hd] read
     * in their stored dtype (f32/f16/bf16, or fp8/i8 codes as kv_f32 has them): s[p * ldq + j] = q[j] . k[p]
     * for j < nq, lanes nq .. ldq-1 of each key set to 0. */
    void (*att_scores)(const float *q, uint32_t nq, int dtype, const void *k, uint32_t np, uint32_t hd, float *s,
                       uint32_t ldq);
    /* Per lane j, over the keys p < lim[j] of s[np][ldq]: s = e^(s - max),
     * 0 for the keys it may not see; mx[j] the max (-inf when lim[j] is 0),
     * sum[j] the sum. */
    void (*att_softmax)(float *s, uint32_t ldq, uint32_t np, const int32_t *lim, float *mx, float *sum);
    /* o[j * hd + i] += sum_p s[p * ldq + j] * v[p * hd + i], j < nq, p < np,
     * the values read in their stored dtype as att_scores reads keys. */
    void (*att_values)(const float *s, uint32_t ldq, uint32_t nq, int dtype, const void *v, uint32_t np,
                       uint32_t hd, float *o);
    /* g = silu(g) * u = g / (1 + e^-g) * u */
    void (*silu_mul)(float *g, const float *u, size_t n);
    /* RMSNorm of one row (y may be x): y[i] = x[i] * s * w[i], s = (float)
     * (1 / sqrt(ss / n + eps)), ss the squares summed in double in eight
     * lanes (lane j the elements i = j mod 8 of the first n / 8 * 8, the
     * lanes added ((0 + 4) + (1 + 5)) + ((2 + 6) + (3 + 7)), then the
     * tail's in order): the same bits in every table. */
    void (*rms_row)(const float *x, const float *w, float *y, uint32_t n, float eps);
    /* Row r of w as f32, the row path's input: kvp_cpu_dequant_weight_row's
     * bits, faster for the kinds a table decodes itself.  0 or -1. */
    int (*weight_row)(const struct kvp_weight *w, uint32_t r, float *dst);
    /* AMX's prompt matmuls of the quantized kinds (NULL elsewhere), by kind
     * (Q4_0, Q4_1, Q8_0, i8, i4, then the same in rows of 16: Q8_0, Q4_0,
     * Q4_1, i8, i4): pieces of any nr by
     * nt <= KVP_AMX_TOK tokens reading a KVP_AMX_TOK tile (xt, dxs; for
     * rows of 16 the tile of whole blocks, unit 32), with the bits of this
     * table's own quantized kernels.  Steps of fewer than amx_min_tok
     * tokens (amx_min_tok_q8 for Q8_0 and i8, amx_min_tok_q4r for Q4_0 and
     * Q4_1 in rows of 16) leave them to those. */
    kvp_mm_fn amx_mm[10];
    uint32_t amx_min_tok, amx_min_tok_q8;
    uint32_t amx_min_tok_q4r; /* Q4_0, Q4_1 and i4 in rows of 16 */
    /* Float matmuls (f32, f16, bf16) of more than 2 tokens read a float
     * tile (kvp_cpu_f32_tile_put) as xt, beside xf (the wide runs). */
    int float_tile;
    /* mm_f16 and mm_bf16 take a task's full groups at once (kvp_mm_blk.ng),
     * in pieces of KVP_WIDE_ROWS rows */
    int float_groups;
} kvp_cpu_kernels;

extern const kvp_cpu_kernels kvp_cpu_kernels_portable;
/* NULL when this CPU lacks AVX2, FMA or F16C (or the compiler is not x86). */
const kvp_cpu_kernels *kvp_cpu_kernels_avx2(void);
/* NULL unless the CPU also has AVX512-VNNI and AVX512VL.  Its attention,
 * softmax, SiLU and activation quantization are the 512-bit ones
 * (backend_cpu_x86_wide_att.inc), the same bits as the AVX2 table's; on an
 * Intel CPU its float matmuls are too (kvp_cpu_vnni_wide_floats). */
const kvp_cpu_kernels *kvp_cpu_kernels_vnni(void);
/* Into a copy of the VNNI table: its float matmuls with prompts on 512-bit
 * FMAs, the same bits (backend_cpu_x86_wide.inc); for CPUs with two
 * 512-bit FMA units (Zen 4's split ones gain nothing). */
void kvp_cpu_vnni_wide_floats(kvp_cpu_kernels *k);
/* The VNNI table with AMX-INT8 for prompts (and wide float prompts): NULL unless the CPU has
 * AMX-TILE and AMX-INT8 and the kernel grants this process the tile state
 * (arch_prctl ARCH_REQ_XCOMP_PERM). */
const kvp_cpu_kernels *kvp_cpu_kernels_amx(void);

/* GGUF weights rewritten for the kernels (backend_cpu_repack.c): Q4_K as
 * int4 codes with f32 group scales and zero points, Q5_0 and IQ4_NL as
 * Q8_0, IQ4_XS as int8 with an f32 scale a group of 32.  Each: 1
 * with *out set (its own memory: kvp_cpu_repacked_free), 0 when w is not
 * of its kind in whole blocks, or a negative code.  kvp_cpu_repack does
 * whichever w's kind takes; kvp_cpu_repackable says whether one does. */
int kvp_cpu_q4k_as_i4(const struct kvp_weight *w, struct kvp_weight *out, kvp_err *err);
int kvp_cpu_q5_0_as_q8_0(const struct kvp_weight *w, struct kvp_weight *out, kvp_err *err);
int kvp_cpu_iq4nl_as_q8_0(const struct kvp_weight *w, struct kvp_weight *out, kvp_err *err);
int kvp_cpu_iq4xs_as_i8(const struct kvp_weight *w, struct kvp_weight *out, kvp_err *err);
int kvp_cpu_repack(const struct kvp_weight *w, struct kvp_weight *out, kvp_err *err);
int kvp_cpu_repackable(const struct kvp_weight *w);
/* Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, the K-quants or IQ4 without scales, or i8
 * or i4 with scales in groups of a multiple of 32, in rows of 16, dtype
 * KVP_CPU_DTYPE_*_R16: 1 with *out set, 0 when w is not one of those in
 * whole blocks, or a negative code. */
int kvp_cpu_as_r16(const struct kvp_weight *w, struct kvp_weight *out, kvp_err *err);
/* The same in two steps, so threads can share the second: *out with its
 * memory (1; 0 when w is not one of those kinds, Q5_0 aside; or a
 * negative code), then groups [g0, g1) of 16 rows filled from w. */
int kvp_cpu_r16_alloc(const struct kvp_weight *w, struct kvp_weight *out, kvp_err *err);
/* Whether kvp_cpu_r16_alloc takes w; the kind it makes of it
 * (KVP_CPU_DTYPE_*_R16), or 0. */
int kvp_cpu_r16_takes(const struct kvp_weight *w);
int kvp_cpu_r16_dtype(const struct kvp_weight *w);
void kvp_cpu_r16_fill(const struct kvp_weight *w, struct kvp_weight *out, uint32_t g0, uint32_t g1);
/* Row r of a weight in rows of 16 as f32: the stored row's values, bit for
 * bit (an embedding looked up in a tied output head).  0 or -1. */
int kvp_cpu_r16_row(const struct kvp_weight *w, uint32_t r, float *dst);
void kvp_cpu_repacked_free(struct kvp_weight *w);

/* Row dequantization for the embedding lookup (any supported dtype). 0 or -1. */
int kvp_cpu_dequant_row(int dtype, const void *src, float *dst, uint32_t n);

/* Row r of w as f32 (dst[w->n_in]), scaled schemes included.  0 or -1. */
int kvp_cpu_dequant_weight_row(const struct kvp_weight *w, uint32_t r, float *dst);
/* Whether kvp_cpu_dequant_weight_row decodes w's type and scales. */
int kvp_cpu_dequant_weight_row_ok(const struct kvp_weight *w);

#endif
