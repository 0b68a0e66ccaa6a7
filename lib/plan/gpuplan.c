/* gpuplan.c - the CUDA backend's host-side planning (see gpuplan.h). */
#include "gpuplan.h"

#include <string.h>

/* CUDA's grid limits: x up to 2^31 - 1, y and z up to 65535. */
#define GRID_X_MAX 0x7fffffffu
#define GRID_YZ_MAX 65535u

uint32_t kvp_gpuplan_split_keys(uint32_t block_size, int pipelined)
{
    uint32_t want = pipelined ? KVP_GPU_ATT_SPLIT_MIN : KVP_GPU_ATT_SPLIT_KEYS;
    if (block_size == 0)
        return want;
    uint64_t k = ((uint64_t)want + block_size - 1) / block_size * block_size;
    return k > UINT32_MAX / 2 ? block_size : (uint32_t)k;
}

int kvp_gpuplan_attn(kvp_gpu_attn_shape *s, uint32_t n_tok, uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim,
                     uint32_t block_size, uint32_t max_ctx, int pipelined, kvp_err *err)
{
    memset(s, 0, sizeof *s);
    if (head_dim == 0 || head_dim > KVP_GPU_ATT_MAX_HEAD_DIM)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "cuda attention: head_dim %u (the kernel takes 1..%u)", head_dim,
                           KVP_GPU_ATT_MAX_HEAD_DIM);
    if (n_head_kv == 0 || n_head % n_head_kv || block_size == 0)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "cuda attention: %u query heads over %u KV heads, blocks of %u",
                           n_head, n_head_kv, block_size);
    s->split_keys = kvp_gpuplan_split_keys(block_size, pipelined);
    s->split_cap = pipelined ? KVP_GPU_ATT_MAX_SPLITS : UINT32_MAX;
    s->max_splits = max_ctx ? kvp_gpuplan_max_splits(s->split_keys, s->split_cap, max_ctx) : 1;
    s->n_rep = n_head / n_head_kv;
    s->head_groups = (s->n_rep + KVP_GPU_ATT_QROWS - 1) / KVP_GPU_ATT_QROWS;
    uint64_t z = (uint64_t)n_head_kv * s->head_groups;
    if (n_tok > GRID_X_MAX || s->max_splits > GRID_YZ_MAX || z > GRID_YZ_MAX || n_head > GRID_YZ_MAX)
        return kvp_err_set(err, KVP_ELIMIT, "cuda attention: %u tokens, %u splits, %llu head groups exceed the grid",
                           n_tok, s->max_splits, (unsigned long long)z);
    s->grid[0] = n_tok, s->grid[1] = s->max_splits, s->grid[2] = (uint32_t)z;
    s->threads = KVP_GPU_ATT_THREADS;
    /* q[QROWS][hd], k[KTILE][hd + 1] (the pad puts a tile's 16 keys in 16
     * banks for the score loop), v[KTILE][hd], p[QROWS][KTILE] */
    s->smem = ((size_t)KVP_GPU_ATT_QROWS * head_dim + (size_t)KVP_GPU_ATT_KTILE * (head_dim + 1) +
               (size_t)KVP_GPU_ATT_KTILE * head_dim + KVP_GPU_ATT_QROWS * KVP_GPU_ATT_KTILE) * sizeof(float);
    if (s->max_splits > 1) {
        s->part_floats = (uint64_t)n_tok * n_head * s->max_splits * (head_dim + 2);
        s->merge_grid[0] = n_tok, s->merge_grid[1] = n_head;
    }
    return 0;
}

int kvp_gpuplan_matmul(kvp_gpu_mm_shape *s, uint32_t n_out, uint32_t n_in, uint32_t n_tok, uint32_t fill,
                       uint32_t kb, kvp_err *err)
{
    memset(s, 0, sizeof *s);
    if (kb == 0)
        kb = KVP_GPU_GEMM_BK;
    if (kb != KVP_GPU_GEMM_BK && kb != KVP_GPU_MMA_BK64)
        return kvp_err_set(err, KVP_EINVAL, "cuda matmul: a k step of %u (%u or %u)", kb, KVP_GPU_GEMM_BK,
                           KVP_GPU_MMA_BK64);
    if (n_tok <= KVP_GPU_GEMV_MAX_TOK) {
        s->kind = KVP_GPU_MM_GEMV;
        s->grid[0] = (n_out + KVP_GPU_GEMV_ROWS - 1) / KVP_GPU_GEMV_ROWS;
        s->grid[1] = s->grid[2] = 1;
        s->threads = KVP_GPU_GEMV_THREADS;
        return 0;
    }
    uint64_t gy = ((uint64_t)n_tok + KVP_GPU_GEMM_BM - 1) / KVP_GPU_GEMM_BM;
    if (gy > GRID_YZ_MAX)
        return kvp_err_set(err, KVP_ELIMIT, "cuda matmul: %u tokens in one call (at most %u)", n_tok,
                           GRID_YZ_MAX * KVP_GPU_GEMM_BM);
    s->kind = KVP_GPU_MM_GEMM;
    s->grid[0] = (n_out + KVP_GPU_GEMM_BN - 1) / KVP_GPU_GEMM_BN;
    s->grid[1] = (uint32_t)gy;
    s->threads = KVP_GPU_GEMM_THREADS;
    s->kb = kb;
    uint32_t ksteps = (n_in + kb - 1) / kb;
    uint64_t tiles = (uint64_t)s->grid[0] * gy, parts = 1;
    if (tiles < fill) {
        parts = (fill + tiles - 1) / tiles;
        if (parts > (uint64_t)ksteps * kb / KVP_GPU_GEMM_MIN_K)
            parts = (uint64_t)ksteps * kb / KVP_GPU_GEMM_MIN_K;
        if (parts > KVP_GPU_GEMM_MAX_SPLITS)
            parts = KVP_GPU_GEMM_MAX_SPLITS;
        if (parts < 1)
            parts = 1;
    }
    /* parts of kper steps each, none empty: the count again from kper */
    s->kper = ksteps ? (uint32_t)((ksteps + parts - 1) / parts) : 1;
    s->grid[2] = ksteps ? (ksteps + s->kper - 1) / s->kper : 1;
    return 0;
}

uint64_t kvp_gpuplan_splitk_floats(uint32_t fill)
{
    return 2 * (uint64_t)fill * KVP_GPU_GEMM_BM * KVP_GPU_GEMM_BN;
}

uint32_t kvp_gpuplan_splitk_tiles(uint32_t fill)
{
    return fill;
}

uint32_t kvp_gpuplan_blocks(uint64_t n, uint32_t threads, uint32_t max_blocks)
{
    uint64_t b = threads ? (n + threads - 1) / threads : 0;
    if (b > max_blocks)
        b = max_blocks;
    return b ? (uint32_t)b : 1;
}

uint32_t kvp_gpuplan_table_stride(uint32_t max_ctx, uint32_t block_size)
{
    uint64_t n = block_size ? ((uint64_t)max_ctx + block_size - 1) / block_size : 0;
    n = (n + 3) & ~(uint64_t)3;
    return n ? (uint32_t)n : 4;
}

int kvp_gpuplan_tables(uint32_t *dst, uint32_t n_rows, uint32_t stride, const uint32_t *const *tables,
                       const uint32_t *n_blocks, uint32_t n_seq, uint32_t fill, kvp_err *err)
{
    if (n_rows < n_seq)
        return kvp_err_set(err, KVP_EINVAL, "block tables: %u sequences in %u rows", n_seq, n_rows);
    for (uint32_t s = 0; s < n_seq; s++)
        if (n_blocks[s] > stride)
            return kvp_err_set(err, KVP_ELIMIT, "block tables: sequence %u has %u blocks, rows hold %u", s,
                               n_blocks[s], stride);
    for (uint32_t s = 0; s < n_rows; s++) {
        uint32_t *row = dst + (size_t)s * stride, n = s < n_seq ? n_blocks[s] : 0;
        if (n)
            memcpy(row, tables[s], (size_t)n * sizeof *row);
        for (uint32_t i = n; i < stride; i++)
            row[i] = fill;
    }
    return 0;
}

/* The ladder's next size at or above n (no cap). */
static uint32_t ladder(uint32_t n)
{
    if (n <= 4)
        return n <= 1 ? 1 : n <= 2 ? 2 : 4;
    uint32_t step = n <= 256 ? 8 : 16;
    return (uint32_t)(((uint64_t)n + step - 1) / step * step);
}

uint32_t kvp_gpuplan_graph_batch(uint32_t n, uint32_t max)
{
    if (n == 0 || n > max)
        return 0;
    uint32_t p = ladder(n);
    return p < max ? p : max;
}

uint32_t kvp_gpuplan_graph_sizes(uint32_t max, uint32_t *out, uint32_t cap)
{
    uint32_t k = 0;
    for (uint32_t n = 1; n <= max && n;) {
        uint32_t p = kvp_gpuplan_graph_batch(n, max);
        if (k < cap)
            out[k] = p;
        k++;
        if (p == max)
            break;
        n = p + 1;
    }
    return k;
}
