/* gpuplan.h - the CUDA backend's host-side planning, in plain C so that it
 * builds and is unit tested on machines without CUDA (tests/unit/test_gpuplan.c).
 *
 * kernels/ launches what this file decides: how a paged decode attention is
 * cut into key splits (split-K, merged by log-sum-exp), the grid and block
 * of every kernel, how ragged block tables become the one [n_seq][stride]
 * device array backend.h asks for, and which padded batch sizes a CUDA
 * graph is captured at.  The few functions a kernel must agree with bit for
 * bit (which keys a split covers) are static inline and marked KVP_GPU_FN,
 * so the device code calls the same arithmetic the tests check.
 */
#ifndef KVP_GPUPLAN_H
#define KVP_GPUPLAN_H

#include "error.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define KVP_GPU_FN __host__ __device__ static inline
#else
#define KVP_GPU_FN static inline
#endif

/* ---- paged decode attention ----
 *
 * One CTA computes one (query token, key split, KV head, group of up to
 * KVP_GPU_ATT_QROWS of that head's query heads): the query heads that share
 * a KV head read each K and V row once.  A query at position pos has keys
 * 0..pos; they are cut by absolute position into splits of L keys (0 ..
 * L-1, L .. 2L-1, ...), L = kvp_gpuplan_split_len, a multiple of a unit
 * rounded up to whole blocks.  Two plans:
 *   - first (KVP_CUDA_PIPELINE=0): L is the unit,
 *     KVP_GPU_ATT_SPLIT_KEYS, however many splits that makes;
 *   - pipelined (the default, since its H200 run): the unit is
 *     KVP_GPU_ATT_SPLIT_MIN and L the smallest multiple of it that makes at
 *     most KVP_GPU_ATT_MAX_SPLITS splits, so a single decode token at
 *     context 512 spreads over 16 CTAs a KV head instead of one CTA that
 *     walks its 512 keys alone.
 * Which keys a split covers, and the order the merge folds them in, depend
 * only on the token's position: a token's output is the same bits in any
 * batch.  A token whose keys fit in one split has its output written by
 * that CTA; longer ones leave per-split partial results (unnormalized o,
 * max m, sum l) that a second kernel folds.  The grid's split dimension is
 * sized for the most splits a query of the step can have (max_ctx), and
 * CTAs past their own token's splits exit at once, so a grid planned for a
 * maximum can be captured in a graph and replayed for shorter contexts. */
/* the first plan (KVP_CUDA_PIPELINE=0): keys a split covers (rounded up to whole blocks) */
#define KVP_GPU_ATT_SPLIT_KEYS 512
#define KVP_GPU_ATT_SPLIT_MIN 32   /* pipelined plan: the unit of a split's keys (rounded up likewise) */
#define KVP_GPU_ATT_MAX_SPLITS 32  /* pipelined plan: the most splits one query's keys are cut into */
#define KVP_GPU_ATT_QROWS 8        /* query heads one CTA holds */
#define KVP_GPU_ATT_KTILE 16       /* keys a CTA holds in shared memory at a time */
#define KVP_GPU_ATT_THREADS 128    /* QROWS x KTILE: one thread a (query, key) score */
#define KVP_GPU_ATT_MAX_HEAD_DIM 256 /* each thread keeps head_dim / KTILE output dims in registers */
#define KVP_GPU_MERGE_THREADS 128

typedef struct kvp_gpu_attn_shape {
    uint32_t split_keys;   /* the split unit, in whole blocks (kvp_gpuplan_split_keys) */
    uint32_t split_cap;    /* the most splits a query's keys are cut into (UINT32_MAX: no cap) */
    uint32_t max_splits;   /* the most splits a query of the step has: the grid's y */
    uint32_t n_rep;        /* query heads per KV head */
    uint32_t head_groups;  /* CTAs per KV head: ceil(n_rep / QROWS) */
    uint32_t grid[3];      /* n_tok, max_splits, n_head_kv * head_groups */
    uint32_t threads;
    size_t smem;           /* dynamic shared memory bytes */
    uint64_t part_floats;  /* partial results when max_splits > 1 (0 else):
                            * [n_tok][n_head][max_splits][head_dim + 2] */
    uint32_t merge_grid[2]; /* n_tok, n_head; unused when max_splits is 1 */
} kvp_gpu_attn_shape;

/* Keys each split of a query at pos covers (keys 0..pos): the smallest
 * multiple of unit that cuts them into at most cap splits. */
KVP_GPU_FN uint64_t kvp_gpuplan_split_len(uint32_t unit, uint32_t cap, int32_t pos)
{
    uint64_t n = pos < 0 ? 0 : (uint64_t)pos + 1, per = (uint64_t)unit * cap;
    return n ? (n + per - 1) / per * unit : unit;
}

/* How many splits the keys of a query at pos are cut into (0 for pos < 0). */
KVP_GPU_FN uint32_t kvp_gpuplan_splits(uint32_t unit, uint32_t cap, int32_t pos)
{
    uint64_t len = kvp_gpuplan_split_len(unit, cap, pos);
    return pos < 0 ? 0 : (uint32_t)(((uint64_t)pos + len) / len);
}

/* [*k0, *k1) of split s of a query at pos; 0 when s has no keys. */
KVP_GPU_FN int kvp_gpuplan_split_range(uint32_t unit, uint32_t cap, int32_t pos, uint32_t s, uint32_t *k0,
                                       uint32_t *k1)
{
    uint64_t n = pos < 0 ? 0 : (uint64_t)pos + 1, len = kvp_gpuplan_split_len(unit, cap, pos), a = s * len,
             b = a + len;
    *k0 = (uint32_t)(a < n ? a : n);
    *k1 = (uint32_t)(b < n ? b : n);
    return *k1 > *k0;
}

/* The most splits any query of a step whose contexts are at most max_ctx
 * keys has (with a cap the count is not monotonic in pos: 1024 keys of
 * unit 32 make 32 splits, 1025 make 17). */
KVP_GPU_FN uint32_t kvp_gpuplan_max_splits(uint32_t unit, uint32_t cap, uint32_t max_ctx)
{
    uint64_t n = ((uint64_t)max_ctx + unit - 1) / unit;
    return (uint32_t)(n < cap ? n : cap);
}

/* The split unit for a pool of block_size (KVP_GPU_ATT_SPLIT_MIN for the
 * pipelined plan, KVP_GPU_ATT_SPLIT_KEYS for the first one) rounded up
 * to whole blocks, so a split never starts inside a block. */
uint32_t kvp_gpuplan_split_keys(uint32_t block_size, int pipelined);

/* The launch of one attention call.  0, or KVP_EUNSUPPORTED (head_dim over
 * KVP_GPU_ATT_MAX_HEAD_DIM, n_head not a multiple of n_head_kv) or
 * KVP_ELIMIT (a grid dimension too large) with a message. */
int kvp_gpuplan_attn(kvp_gpu_attn_shape *s, uint32_t n_tok, uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim,
                     uint32_t block_size, uint32_t max_ctx, int pipelined, kvp_err *err);

/* ---- matmul ----
 *
 * Up to KVP_GPU_GEMV_MAX_TOK tokens (decode) go through a GEMV that reads
 * each weight row once for all of them: a warp a row, KVP_GPU_GEMV_ROWS rows
 * a CTA, each lane decoding 8 consecutive elements at a time in the stored
 * format.  More tokens go through a tiled GEMM that decodes a
 * KVP_GPU_GEMM_BN x KVP_GPU_GEMM_BK tile of weights to f32 in shared memory
 * and multiplies it with a KVP_GPU_GEMM_BM x BK tile of activations. */
#define KVP_GPU_GEMV_MAX_TOK 8
#define KVP_GPU_GEMV_ROWS 4
#define KVP_GPU_GEMV_THREADS (32 * KVP_GPU_GEMV_ROWS)
#define KVP_GPU_GEMM_BM 64     /* tokens a CTA */
#define KVP_GPU_GEMM_BN 64     /* weight rows a CTA */
#define KVP_GPU_GEMM_BK 32     /* elements of a row a step */
#define KVP_GPU_GEMM_THREADS 256 /* each a 4 x 4 block of outputs */

/* Split-K: a GEMM of few tiles (a decode batch of 9 to a few hundred
 * tokens on a small model's 576-row matrices makes 9 CTAs on a 132-SM GPU;
 * on an H200 split-K took SmolLM2's 64-token matmuls from 35 to 22 us a
 * call with parts of 4 steps or more)
 * splits each tile's k range into grid[2] parts of kper BK steps, so about
 * `fill` CTAs run (the backend passes 2 x its SMs); each part writes its
 * tile's partial sums to a workspace, and the last part of a tile to finish
 * adds them up in part order (deterministic, no float atomics) and writes
 * y.  A part takes at least KVP_GPU_GEMM_MIN_K elements of k (a CTA's
 * steps run one after another, each waiting on its loads: short chains on
 * many CTAs hide that latency better than long ones on few), a tile at
 * most KVP_GPU_GEMM_MAX_SPLITS parts; only grids of fewer than `fill`
 * tiles split, so splits x tiles < 2 fill. */
#define KVP_GPU_GEMM_MIN_K 64
#define KVP_GPU_MMA_BK64 64    /* the tensor-core GEMM's other k step (kernels/README.md) */
#define KVP_GPU_GEMM_MAX_SPLITS 16

enum kvp_gpu_mm_kind { KVP_GPU_MM_GEMV = 0, KVP_GPU_MM_GEMM = 1 };

typedef struct kvp_gpu_mm_shape {
    int kind;              /* kvp_gpu_mm_kind */
    uint32_t grid[3];      /* GEMV: row groups, 1, 1; GEMM: row tiles, token tiles, k parts */
    uint32_t kb;           /* GEMM: elements of k a step (KVP_GPU_GEMM_BK or KVP_GPU_MMA_BK64) */
    uint32_t kper;         /* GEMM: steps a k part (all of them when grid[2] is 1) */
    uint32_t threads;
} kvp_gpu_mm_shape;

/* The launch of y[n_tok][n_out] = x[n_tok][n_in] . w^T; fill: the CTAs a
 * split GEMM aims at, 0 for none; kb: the GEMM's k step (0:
 * KVP_GPU_GEMM_BK).  0, or KVP_ELIMIT when a grid dimension would be too
 * large, KVP_EINVAL for a k step neither of those. */
int kvp_gpuplan_matmul(kvp_gpu_mm_shape *s, uint32_t n_out, uint32_t n_in, uint32_t n_tok, uint32_t fill,
                       uint32_t kb, kvp_err *err);

/* What split GEMMs planned with `fill` need: workspace floats (a BM x BN
 * tile per part) and tile counters (one per tile of a split grid). */
uint64_t kvp_gpuplan_splitk_floats(uint32_t fill);
uint32_t kvp_gpuplan_splitk_tiles(uint32_t fill);

/* Blocks of `threads` for a grid-stride loop over n elements, capped at
 * max_blocks (enough to fill the device; each thread then loops). */
uint32_t kvp_gpuplan_blocks(uint64_t n, uint32_t threads, uint32_t max_blocks);

/* ---- block tables ---- */

/* The row length of a [n_seq][stride] table for contexts up to max_ctx:
 * the blocks max_ctx needs, rounded up to a multiple of 4 (16-byte rows). */
uint32_t kvp_gpuplan_table_stride(uint32_t max_ctx, uint32_t block_size);

/* Ragged tables (tables[s] holds n_blocks[s] block ids) into dst
 * [n_rows][stride]: row s < n_seq gets its table then `fill`, rows n_seq ..
 * n_rows - 1 (graph padding) are all `fill`.  0, or KVP_ELIMIT naming the
 * sequence whose table is longer than stride, or KVP_EINVAL when n_rows <
 * n_seq. */
int kvp_gpuplan_tables(uint32_t *dst, uint32_t n_rows, uint32_t stride, const uint32_t *const *tables,
                       const uint32_t *n_blocks, uint32_t n_seq, uint32_t fill, kvp_err *err);

/* ---- CUDA graphs ----
 *
 * A decode step is captured once per padded batch size and replayed with
 * the step's inputs copied into the captured buffers: sizes 1, 2, 4, then
 * multiples of 8 up to 256, then multiples of 16, and max itself (vLLM's
 * ladder: under 8 padding tokens to 256, under 16 past it, and few graphs).  Padding tokens carry the slot
 * KVP_GPU_SLOT_NONE, which kv_store skips, and position 0 of a real row. */
#define KVP_GPU_SLOT_NONE UINT32_MAX

/* The padded batch for n tokens (n <= max), or 0 when n is 0 or over max. */
uint32_t kvp_gpuplan_graph_batch(uint32_t n, uint32_t max);
/* The sizes captured for batches up to max, ascending, into out[cap];
 * returns how many there are (which may exceed cap; only cap are written). */
uint32_t kvp_gpuplan_graph_sizes(uint32_t max, uint32_t *out, uint32_t cap);

#endif
