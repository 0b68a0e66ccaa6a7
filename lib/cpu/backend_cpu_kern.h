/* backend_cpu_kern.h - the CPU backend's inner kernels (private to
 * backend_cpu*.c): one table per instruction set, picked at run time.
 *
 * Quantized weights are multiplied without dequantizing them: activations are
 * first quantized to 8-bit blocks of 32 (kvp_q8blk), then each weight block
 * meets one activation block in integer arithmetic, as llama.cpp does.
 *   Q8_0:  dw*dx * sum(qw*qx)
 *   Q4_1:  dw*dx * sum(qw*qx) + mw * s,      s = dx * sum(qx)
 *   Q4_0:  dw*dx * sum(qw*qx) - 8*dw * s     (stored q in 0..15, y = (q-8) dw)
 * Every table gives the same results within float rounding (summation order).
 */
#ifndef KVP_BACKEND_CPU_KERN_H
#define KVP_BACKEND_CPU_KERN_H

#include <stddef.h>
#include <stdint.h>

#define KVP_QK 32      /* elements per quantization block */
#define KVP_MM_TOK 4   /* tokens one single-row dot kernel call handles */
#define KVP_MM_TILE 8  /* most tokens a two-row tile kernel takes (tile_tok) */
#define KVP_Q8_SCALES 24 /* 4-byte slots per block in a tile's scale table */

/* An activation block: 32 int8 with scale d, their sum, and s = d * sum. */
typedef struct kvp_q8blk {
    float d, s;
    int32_t sum;
    int8_t q[KVP_QK];
} kvp_q8blk;

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

/* out[t] = dot(weight row w, activation row x[t]) for t < ntok <= KVP_MM_TOK;
 * n elements (nb = n / 32 blocks for the quantized kinds). */
typedef void (*kvp_dotq_fn)(const void *w, const kvp_q8blk *const *x, uint32_t ntok, uint32_t nb, float *out);
typedef void (*kvp_dotf_fn)(const void *w, const float *const *x, uint32_t ntok, uint32_t n, float *out);

/* Scaled weights (backend.h): one row whose scales sc (and zero points zp,
 * or NULL) hold one value per g elements.
 *   i8, i4: g a multiple of 32; per activation block dx*sum(q*qx) - z*s, so
 *           zero points cost one multiply-add a block (i4 is stored offset:
 *           q = (nibble ^ 8) - 8, element 2k low nibble, 2k+1 high).
 *   e4m3:   f32 activations; any g dividing n. */
typedef void (*kvp_dots_fn)(const void *w, const float *sc, const float *zp, uint32_t g, const kvp_q8blk *const *x,
                            uint32_t ntok, uint32_t nb, float *out);
typedef void (*kvp_dotsf_fn)(const void *w, const float *sc, uint32_t g, const float *const *x, uint32_t ntok,
                             uint32_t n, float *out);

/* Two rows w0, w1 against tile_tok tokens at once: o0[t], o1[t]. */
typedef void (*kvp_dotf2_fn)(const void *w0, const void *w1, const float *const *x, uint32_t n, float *o0,
                             float *o1);

/* The quantized ones take the tile's activations interleaved (xt and dxs,
 * kvp_cpu_q8_tile_put) and, for Q8_0 and i8 in a table with tile_flip, the
 * rows' wsum (-128 * each block's sum of quants: row w0's nb entries, then
 * w1's); NULL otherwise. */
typedef void (*kvp_dotq2_fn)(const void *w0, const void *w1, const int8_t *xt, const float *dxs,
                             const int32_t *wsum, uint32_t nb, float *o0, float *o1);

/* Two scaled rows (scales sc0/sc1, zero points zp0/zp1 or NULL) by
 * tile_tok tokens. */
typedef void (*kvp_dots2_fn)(const void *w0, const void *w1, const float *sc0, const float *sc1, const float *zp0,
                             const float *zp1, uint32_t g, const int8_t *xt, const float *dxs, const int32_t *wsum,
                             uint32_t nb, float *o0, float *o1);

/* One token's activation blocks x[0..nb) into slot t of a tile of T (<= 8)
 * tokens, the layout the two-row kernels read.  xt (32-byte aligned): each
 * block's T * 32 quants, in groups of unit bytes (32: whole blocks; 4: four
 * elements; no other), group c of slot t at (c * T + t) * unit, each quant xor 0x80
 * (x + 128 as u8) when flip.  dxs: KVP_Q8_SCALES
 * slots a block, the tokens' d (f32) at t, s (f32) at 8 + t, sum(q) (i32)
 * at 16 + t; slots T..7 of each zero. */
void kvp_cpu_q8_tile_put(const kvp_q8blk *x, uint32_t t, uint32_t T, uint32_t nb, uint32_t unit, int flip,
                         int8_t *xt, float *dxs);

typedef struct kvp_cpu_kernels {
    const char *isa;
    uint32_t tile_tok;     /* tokens the two-row (dot2_*) kernels take, <= KVP_MM_TILE */
    uint32_t tile_unit;    /* the xt grouping they read (kvp_cpu_q8_tile_put) */
    int tile_flip;         /* Q8_0 and i8 tiles: xt flipped, and a wsum table */
    /* out[b] = -128 * sum of the 32 int8 at q + b * stride, b < nb (NULL
     * without tile_flip). */
    void (*wsum)(const uint8_t *q, size_t stride, uint32_t nb, int32_t *out);
    void (*quant_q8)(const float *x, kvp_q8blk *y, uint32_t n); /* n multiple of 32 */
    kvp_dotq_fn dot_q4_0, dot_q4_1, dot_q8_0;
    kvp_dotf_fn dot_f32, dot_f16, dot_bf16;
    kvp_dotq2_fn dot2_q4_0, dot2_q4_1, dot2_q8_0; /* NULL: use the one-row kernels */
    kvp_dotf2_fn dot2_f32, dot2_f16, dot2_bf16;
    kvp_dots2_fn dot2_i8, dot2_i4;
    kvp_dots_fn dot_i8, dot_i4;
    kvp_dotsf_fn dot_e4m3;
    /* Attention (backend_cpu.c): the queries of one KV head sit in lanes,
     * qt[d * ldq + j] is element d of query j, ldq a multiple of 8. */
    /* n K/V elements of dtype f16/bf16/f32 as f32. */
    void (*kv_f32)(int dtype, const void *src, float *dst, uint32_t n);
    /* s[p * ldq + j] = sum_d qt[d * ldq + j] * k[p * hd + d], p < np. */
    void (*att_scores)(const float *qt, uint32_t ldq, const float *k, uint32_t np, uint32_t hd, float *s);
    /* Decode's few queries (nq <= 4, rows q[nq][hd]) against np keys read in
     * their stored dtype (f32/f16/bf16): s[p * ldq + j] for j < nq, lanes
     * nq .. ldq-1 of each key set to 0 (ldq 8). */
    void (*att_scores_rows)(const float *q, uint32_t nq, int dtype, const void *k, uint32_t np, uint32_t hd,
                            float *s, uint32_t ldq);
    /* Per lane j, over the keys p < lim[j] (>= 1) of s[np][ldq]: s = e^(s -
     * max), 0 for the keys it may not see; mx[j] the max, sum[j] the sum. */
    void (*att_softmax)(float *s, uint32_t ldq, uint32_t np, const int32_t *lim, float *mx, float *sum);
    /* o[j * hd + i] += sum_p s[p * ldq + j] * v[p * hd + i], j < nq, p < np. */
    void (*att_values)(const float *s, uint32_t ldq, uint32_t nq, const float *v, uint32_t np, uint32_t hd,
                       float *o);
    /* g = silu(g) * u = g / (1 + e^-g) * u */
    void (*silu_mul)(float *g, const float *u, size_t n);
} kvp_cpu_kernels;

extern const kvp_cpu_kernels kvp_cpu_kernels_portable;
/* NULL when this CPU lacks AVX2, FMA or F16C (or the compiler is not x86). */
const kvp_cpu_kernels *kvp_cpu_kernels_avx2(void);
/* NULL unless the CPU also has AVX512-VNNI and AVX512VL. */
const kvp_cpu_kernels *kvp_cpu_kernels_vnni(void);

/* Row dequantization for the embedding lookup (any supported dtype). 0 or -1. */
int kvp_cpu_dequant_row(int dtype, const void *src, float *dst, uint32_t n);

struct kvp_weight;
/* Row r of w as f32 (dst[w->n_in]), scaled schemes included.  0 or -1. */
int kvp_cpu_dequant_weight_row(const struct kvp_weight *w, uint32_t r, float *dst);
/* Whether kvp_cpu_dequant_weight_row decodes w's type and scales. */
int kvp_cpu_dequant_weight_row_ok(const struct kvp_weight *w);

#endif
