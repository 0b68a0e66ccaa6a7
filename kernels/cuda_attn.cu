/* cuda_attn.cu - the paged KV cache on the device: storing a step's K and V
 * rows, and attention over block tables (split-K with a log-sum-exp merge;
 * lib/plan/gpuplan.h plans the launch).
 */
#include "cuda_impl.cuh"

#include <math.h>

int cu_kv_dtype_ok(int dtype)
{
    return dtype == KVP_DTYPE_F32 || dtype == KVP_DTYPE_F16 || dtype == KVP_DTYPE_BF16 ||
           dtype == KVP_DTYPE_FP8_E4M3 || dtype == KVP_DTYPE_I8;
}

/* ---- kv_store: one CTA a (token, KV head, K or V) row ----
 *
 * The bits of the CPU's kv_store: f16/bf16 rounded to nearest even, and a
 * scaled row (fp8 e4m3, int8) with its own scale exactly as
 * kvp_kvscale_row computes it (the largest finite |x|; int8 amax / 127;
 * fp8 the power of two at or above amax / 448), each element encoded as
 * x * (1 / scale). */

#define STORE_THREADS 128

__global__ void __launch_bounds__(STORE_THREADS)
    cu_kv_store_k(kvp_kv_pool kv, uint32_t layer, const float *__restrict__ k, const float *__restrict__ v,
                  const uint32_t *__restrict__ slot, cu_faults *faults)
{
    __shared__ float wmax[STORE_THREADS / 32];
    uint32_t t = blockIdx.x, h = blockIdx.y, which = blockIdx.z, hd = kv.head_dim;
    uint32_t sl = slot[t];
    if (sl == KVP_GPU_SLOT_NONE) /* a graph's padding token */
        return;
    if ((uint64_t)sl >= (uint64_t)kv.n_blocks * kv.block_size) {
        if (threadIdx.x == 0)
            cu_fault(faults, CU_FAULT_SLOT, sl);
        return;
    }
    uint32_t blk = sl / kv.block_size, s = sl % kv.block_size;
    const float *src = (which ? v : k) + ((uint64_t)t * kv.n_head_kv + h) * hd;
    uint8_t *base = (uint8_t *)kv.base + (uint64_t)blk * kv.block_bytes;
    uint8_t *dst = base + cu_kv_row(kv, layer, which, h, s);
    if (kv.dtype == KVP_DTYPE_F32 || kv.dtype == KVP_DTYPE_F16 || kv.dtype == KVP_DTYPE_BF16) {
        for (uint32_t i = threadIdx.x; i < hd; i += STORE_THREADS) {
            if (kv.dtype == KVP_DTYPE_F32)
                ((float *)dst)[i] = src[i];
            else
                ((uint16_t *)dst)[i] = kv.dtype == KVP_DTYPE_F16 ? cu_to_f16(src[i]) : cu_to_bf16(src[i]);
        }
        return;
    }
    float m = 0.0f;
    for (uint32_t i = threadIdx.x; i < hd; i += STORE_THREADS) {
        float a = fabsf(src[i]);
        m = a > m && isfinite(src[i]) ? a : m;
    }
    for (int o = 16; o > 0; o /= 2)
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (threadIdx.x % 32 == 0)
        wmax[threadIdx.x / 32] = m;
    __syncthreads();
    m = 0.0f;
    for (int i = 0; i < STORE_THREADS / 32; i++)
        m = fmaxf(m, wmax[i]);
    float scale = cu_kv_row_scale(kv.dtype, m), inv = 1.0f / scale;
    for (uint32_t i = threadIdx.x; i < hd; i += STORE_THREADS)
        dst[i] = cu_kv_encode(kv.dtype, src[i], scale, inv);
    if (threadIdx.x == 0)
        ((float *)(base + kv.scales_off))[cu_kv_scale(kv, layer, which, h, s)] = scale;
}

cudaError_t cu_kv_store(cudaStream_t st, const kvp_kv_pool &kv, uint32_t layer, const float *k, const float *v,
                        uint32_t n_tok, const uint32_t *slot, cu_faults *faults)
{
    if (n_tok == 0)
        return cudaSuccess;
    cu_kv_store_k<<<dim3(n_tok, kv.n_head_kv, 2), STORE_THREADS, 0, st>>>(kv, layer, k, v, slot, faults);
    return cudaGetLastError();
}

/* ---- attention ----
 *
 * CTA (token t, split sp, KV head g and its head group): query rows qi <
 * nq (heads h0 + qi, all sharing KV head g) against the keys [k0, k1) of the
 * split, KTILE keys at a time through shared memory.  Thread (qi, kj) =
 * (tid / KTILE, tid % KTILE) scores key kj of the tile for query qi; the 16
 * threads of a query (half a warp) then share the tile's max and sum by
 * shuffles and update the query's running max m, sum l and output o (an
 * online softmax), each thread owning dims kj, kj + 16, ... of o. */

#define QR KVP_GPU_ATT_QROWS
#define KT KVP_GPU_ATT_KTILE
#define DPT (KVP_GPU_ATT_MAX_HEAD_DIM / KT) /* output dims a thread owns */

struct cu_attn_params {
    const float *q;
    float *out, *parts;
    const int32_t *pos;
    const int32_t *parent, *kv_pos; /* a draft tree (backend.h), or NULL */
    const uint32_t *tok_seq, *tables;
    uint32_t table_stride, n_head, n_rep, head_groups, max_splits, split_keys, split_cap, layer;
    int vec; /* K/V chunks may be read with one aligned vector load each */
    float scale;
    kvp_kv_pool kv;
};

/* ---- a tile's K and V rows, on their way to shared memory ----
 *
 * The tile is cut in chunks of CH consecutive elements of one row: chunk c
 * is (K or V, key j, chunk dc of the row), dc fastest, so a warp's loads walk
 * along rows.  A thread first loads every chunk it owns (one 8-32 byte
 * vector load each where aligned) and only then decodes them into shared
 * memory, and the kernel loads the next tile while it scores this one: a
 * CTA waits for memory about once a tile, where the first kernels'
 * loader (cu_kv_tile_elems) waits about once an element (~9 us a 16-key
 * tile, measured on an H200).  The default; KVP_CUDA_PIPELINE=0 selects the
 * first. */
#define CH CU_KV_CH
#define MAX_CPT (2 * KT * (KVP_GPU_ATT_MAX_HEAD_DIM / CH) / KVP_GPU_ATT_THREADS) /* chunks a thread: 8 */

template <int DT>
struct cu_kv_tile {
    uint32_t w[MAX_CPT][cu_kv_fmt<DT>::W]; /* each chunk's raw bits (cu_kv_chunk_load) */
    float sc[MAX_CPT];                     /* fp8/int8: the row's scale */
};

/* Where key `key` of a query at pos is (its draft-tree path in path_at):
 * its block's bytes, and its slot there in *slot; NULL when the path's
 * slot is past the block table or the table names a block outside the pool,
 * the fault recorded when report (one thread a key reports). */
__device__ static inline const uint8_t *cu_kv_key_at(const cu_attn_params &p, const uint32_t *table,
                                                     const int32_t *path_at, uint32_t path_n, int32_t pos,
                                                     uint32_t key, int report, uint32_t *slot, cu_faults *faults)
{
    const kvp_kv_pool &kv = p.kv;
    uint32_t at = (uint32_t)kvp_attn_tree_slot_pos(path_at, path_n, pos, (int32_t)key);
    if (at / kv.block_size >= p.table_stride) {
        if (report)
            cu_fault(faults, CU_FAULT_TREE, at);
        return NULL;
    }
    uint32_t blk = table[at / kv.block_size];
    if (blk >= kv.n_blocks) {
        if (report)
            cu_fault(faults, CU_FAULT_BLOCK, blk);
        return NULL;
    }
    *slot = at % kv.block_size;
    return (const uint8_t *)kv.base + (uint64_t)blk * kv.block_bytes;
}

template <int DT>
__device__ static inline void cu_kv_tile_load(const cu_attn_params &p, const uint32_t *table, const int32_t *path_at,
                                              uint32_t path_n, int32_t pos, uint32_t g, uint32_t kt, uint32_t k1,
                                              cu_kv_tile<DT> &r, cu_faults *faults)
{
    const kvp_kv_pool &kv = p.kv;
    const uint32_t hd = kv.head_dim, nch = (hd + CH - 1) / CH, total = 2 * KT * nch;
#pragma unroll
    for (int e = 0; e < MAX_CPT; e++) {
#pragma unroll
        for (int k = 0; k < cu_kv_fmt<DT>::W; k++)
            r.w[e][k] = 0;
        r.sc[e] = 1.0f;
        uint32_t c = threadIdx.x + e * KVP_GPU_ATT_THREADS, which, j, dc;
        if (c >= total)
            continue;
        cu_kv_chunk_at(c, nch, KT, which, j, dc);
        uint32_t key = kt + j, s;
        const uint8_t *b = key < k1 ? cu_kv_key_at(p, table, path_at, path_n, pos, key, dc == 0, &s, faults) : NULL;
        if (!b)
            continue;
        if (DT == KVP_DTYPE_FP8_E4M3 || DT == KVP_DTYPE_I8)
            r.sc[e] = ((const float *)(b + kv.scales_off))[cu_kv_scale(kv, p.layer, which, g, s)];
        /* p.vec: head_dim a multiple of CH, blocks 16-byte aligned, so every chunk is aligned to its size */
        cu_kv_chunk_load<DT>(b + cu_kv_row(kv, p.layer, which, g, s), dc, hd, p.vec, r.w[e]);
    }
}

/* The chunks loaded above as f32 (scaled kinds: times their row's scale)
 * into ks [KT][hd + 1] and vs [KT][hd]; chunks past the keys are zeros. */
template <int DT>
__device__ static inline void cu_kv_tile_store(const cu_kv_tile<DT> &r, uint32_t hd, float *ks, float *vs)
{
    const uint32_t nch = (hd + CH - 1) / CH, total = 2 * KT * nch;
#pragma unroll
    for (int e = 0; e < MAX_CPT; e++) {
        uint32_t c = threadIdx.x + e * KVP_GPU_ATT_THREADS, which, j, dc;
        if (c >= total)
            continue;
        cu_kv_chunk_at(c, nch, KT, which, j, dc);
        float *dst = which ? vs + j * hd : ks + j * (hd + 1);
#pragma unroll
        for (int k = 0; k < CH; k++) {
            uint32_t d = dc * CH + k;
            if (d >= hd)
                break;
            float v = cu_kv_chunk_elem<DT>(r.w[e], k);
            dst[d] = DT == KVP_DTYPE_FP8_E4M3 || DT == KVP_DTYPE_I8 ? v * r.sc[e] : v;
        }
    }
}

/* The first kernels' loader (KVP_CUDA_PIPELINE=0): K and V element by element, straight into
 * ks [KT][hd + 1] and vs [KT][hd]. */
template <int DT>
__device__ static inline void cu_kv_tile_elems(const cu_attn_params &p, const uint32_t *table, const int32_t *path_at,
                                               uint32_t path_n, int32_t pos, uint32_t g, uint32_t kt, uint32_t k1,
                                               float *ks, float *vs, cu_faults *faults)
{
    const kvp_kv_pool &kv = p.kv;
    const uint32_t hd = kv.head_dim, tid = threadIdx.x;
    const int scaled = DT == KVP_DTYPE_FP8_E4M3 || DT == KVP_DTYPE_I8;
    /* K and V rows of keys kt .. kt + KT - 1 as f32 (scaled: times their row's scale) */
    for (uint32_t i = tid; i < KT * hd; i += KVP_GPU_ATT_THREADS) {
        uint32_t j = i / hd, d = i % hd, key = kt + j, s;
        float kvv = 0.0f, vvv = 0.0f;
        const uint8_t *b = key < k1 ? cu_kv_key_at(p, table, path_at, path_n, pos, key, d == 0, &s, faults) : NULL;
        if (b) {
            kvv = cu_kv_elem<DT>(b + cu_kv_row(kv, p.layer, 0, g, s), d);
            vvv = cu_kv_elem<DT>(b + cu_kv_row(kv, p.layer, 1, g, s), d);
            if (scaled) {
                const float *sc = (const float *)(b + kv.scales_off);
                kvv *= sc[cu_kv_scale(kv, p.layer, 0, g, s)];
                vvv *= sc[cu_kv_scale(kv, p.layer, 1, g, s)];
            }
        }
        ks[j * (hd + 1) + d] = kvv;
        vs[j * hd + d] = vvv;
    }
}

template <int DT, int CHUNKED>
__global__ void __launch_bounds__(KVP_GPU_ATT_THREADS) cu_attn_k(cu_attn_params p, cu_faults *faults)
{
    extern __shared__ float sm[];
    const kvp_kv_pool &kv = p.kv;
    const uint32_t hd = kv.head_dim, tid = threadIdx.x, qi = tid / KT, kj = tid % KT;
    const uint32_t t = blockIdx.x, sp = blockIdx.y, g = blockIdx.z / p.head_groups;
    const uint32_t hq0 = (blockIdx.z % p.head_groups) * QR, nq = min(QR, p.n_rep - hq0), h0 = g * p.n_rep + hq0;
    const int32_t pos = p.pos[t];
    uint32_t k0, k1;
    if (!kvp_gpuplan_split_range(p.split_keys, p.split_cap, pos, sp, &k0, &k1))
        return; /* past this token's splits (the grid is sized for the step's most) */
    const uint32_t n_split = kvp_gpuplan_splits(p.split_keys, p.split_cap, pos);
    if (n_split > p.max_splits && sp == 0 && tid == 0) /* its last keys have no CTA */
        cu_fault(faults, CU_FAULT_CTX, pos);
    float *qs = sm, *ks = qs + QR * hd, *vs = ks + KT * (hd + 1), *ps = vs + KT * hd;
    const uint32_t *table = p.tables + (uint64_t)p.tok_seq[t] * p.table_stride;
    /* a draft tree's token: the keys of its path are in its ancestors'
     * slots (the same walk as the CPU backend's) */
    __shared__ int32_t path_at[KVP_TREE_MAX_DEPTH];
    __shared__ uint32_t path_n;
    if (tid == 0)
        path_n = p.parent ? kvp_attn_tree_path(p.parent, p.kv_pos, t, path_at) : 0;
    __syncthreads();

    cu_kv_tile<DT> tile; /* CHUNKED: the tile's loads in flight */
    if (CHUNKED)
        cu_kv_tile_load<DT>(p, table, path_at, path_n, pos, g, k0, k1, tile, faults);
    for (uint32_t i = tid; i < QR * hd; i += KVP_GPU_ATT_THREADS) {
        uint32_t r = i / hd;
        qs[i] = r < nq ? p.q[((uint64_t)t * p.n_head + h0 + r) * hd + i % hd] * p.scale : 0.0f;
    }
    float m = -INFINITY, l = 0.0f, o[DPT];
#pragma unroll
    for (int c = 0; c < DPT; c++)
        o[c] = 0.0f;

    for (uint32_t kt = k0; kt < k1; kt += KT) {
        if (CHUNKED)
            cu_kv_tile_store<DT>(tile, hd, ks, vs);
        else
            cu_kv_tile_elems<DT>(p, table, path_at, path_n, pos, g, kt, k1, ks, vs, faults);
        __syncthreads();
        if (CHUNKED && kt + KT < k1) /* the next tile's loads are in flight while this one is scored */
            cu_kv_tile_load<DT>(p, table, path_at, path_n, pos, g, kt + KT, k1, tile, faults);
        float s = -INFINITY;
        if (qi < nq && kt + kj < k1 && !CHUNKED) {
            s = 0.0f;
            for (uint32_t d = 0; d < hd; d++)
                s += qs[qi * hd + d] * ks[kj * (hd + 1) + d];
        } else if (qi < nq && kt + kj < k1) { /* four chains: FMA latency, not one long sum */
            const float *qr = qs + qi * hd, *kr = ks + kj * (hd + 1);
            float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
            uint32_t d = 0;
            for (; d + 4 <= hd; d += 4) {
                s0 += qr[d] * kr[d];
                s1 += qr[d + 1] * kr[d + 1];
                s2 += qr[d + 2] * kr[d + 2];
                s3 += qr[d + 3] * kr[d + 3];
            }
            for (; d < hd; d++)
                s0 += qr[d] * kr[d];
            s = (s0 + s1) + (s2 + s3);
        }
        float tmax = s;
        for (int off = KT / 2; off > 0; off /= 2)
            tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off, KT));
        float mnew = fmaxf(m, tmax);
        /* -inf - -inf is NaN: a query with no key yet keeps 0 weights */
        float pr = s == -INFINITY ? 0.0f : expf(s - mnew), alpha = m == -INFINITY ? 0.0f : expf(m - mnew);
        float psum = pr;
        for (int off = KT / 2; off > 0; off /= 2)
            psum += __shfl_xor_sync(0xffffffffu, psum, off, KT);
        l = l * alpha + psum;
        m = mnew;
        ps[qi * KT + kj] = pr;
        __syncwarp(); /* a query's 16 weights come from its own half warp */
#pragma unroll
        for (int c = 0; c < DPT; c++) {
            uint32_t d = kj + c * KT;
            if (d < hd) {
                float acc = o[c] * alpha;
                for (int j = 0; j < KT; j++)
                    acc += ps[qi * KT + j] * vs[j * hd + d];
                o[c] = acc;
            }
        }
        __syncthreads(); /* before the next tile overwrites ks, vs, ps */
    }
    if (qi >= nq)
        return;
    uint32_t h = h0 + qi;
    if (n_split == 1) { /* the whole context: the output itself */
        float inv = 1.0f / l, *dst = p.out + ((uint64_t)t * p.n_head + h) * hd;
#pragma unroll
        for (int c = 0; c < DPT; c++)
            if (kj + c * KT < hd)
                dst[kj + c * KT] = o[c] * inv;
        return;
    }
    float *part = p.parts + (((uint64_t)t * p.n_head + h) * p.max_splits + sp) * (hd + 2);
#pragma unroll
    for (int c = 0; c < DPT; c++)
        if (kj + c * KT < hd)
            part[kj + c * KT] = o[c];
    if (kj == 0)
        part[hd] = m, part[hd + 1] = l;
}

/* One CTA a (token, head) with more than one split: every split has a key,
 * so a finite max m_i and a sum l_i > 0; out = sum_i e^(m_i - M) o_i / sum_i
 * e^(m_i - M) l_i, M the largest m_i, the splits in order. */
__global__ void __launch_bounds__(KVP_GPU_MERGE_THREADS) cu_attn_merge_k(cu_attn_params p)
{
    uint32_t t = blockIdx.x, h = blockIdx.y, hd = p.kv.head_dim;
    uint32_t n = kvp_gpuplan_splits(p.split_keys, p.split_cap, p.pos[t]);
    if (n <= 1)
        return;
    n = min(n, p.max_splits); /* more: attention recorded a fault; read no further than the scratch */
    const float *part = p.parts + ((uint64_t)t * p.n_head + h) * p.max_splits * (hd + 2);
    float M = -INFINITY, L = 0.0f;
    for (uint32_t i = 0; i < n; i++)
        M = fmaxf(M, part[i * (hd + 2) + hd]);
    for (uint32_t i = 0; i < n; i++)
        L += expf(part[i * (hd + 2) + hd] - M) * part[i * (hd + 2) + hd + 1];
    float inv = 1.0f / L, *dst = p.out + ((uint64_t)t * p.n_head + h) * hd;
    for (uint32_t d = threadIdx.x; d < hd; d += KVP_GPU_MERGE_THREADS) {
        float acc = 0.0f;
        for (uint32_t i = 0; i < n; i++)
            acc += expf(part[i * (hd + 2) + hd] - M) * part[i * (hd + 2) + d];
        dst[d] = acc * inv;
    }
}

cudaError_t cu_attention(cudaStream_t st, const kvp_attn_args &a, const kvp_gpu_attn_shape &s, float *parts,
                         cu_faults *faults, int pipelined)
{
    if (a.n_tok == 0)
        return cudaSuccess;
    cu_attn_params p;
    p.q = a.q, p.out = a.out, p.parts = parts, p.pos = a.pos, p.tok_seq = a.tok_seq, p.tables = a.tables;
    p.parent = a.parent, p.kv_pos = a.parent ? a.kv_pos : NULL;
    p.table_stride = a.table_stride, p.n_head = a.n_head, p.n_rep = s.n_rep, p.head_groups = s.head_groups;
    p.max_splits = s.max_splits, p.split_keys = s.split_keys, p.split_cap = s.split_cap, p.layer = a.layer;
    p.scale = a.scale, p.kv = *a.kv;
    p.vec = a.kv->head_dim % CH == 0 && a.kv->block_bytes % 16 == 0 && ((uintptr_t)a.kv->base & 15) == 0;
    dim3 grid(s.grid[0], s.grid[1], s.grid[2]);
    switch (a.kv->dtype) {
#define CU_ATTN_CASE(DT)                                                        \
    case DT:                                                                    \
        if (pipelined)                                                          \
            cu_attn_k<DT, 1><<<grid, s.threads, s.smem, st>>>(p, faults);       \
        else                                                                    \
            cu_attn_k<DT, 0><<<grid, s.threads, s.smem, st>>>(p, faults);       \
        break;
        CU_ATTN_CASE(KVP_DTYPE_F32)
        CU_ATTN_CASE(KVP_DTYPE_F16)
        CU_ATTN_CASE(KVP_DTYPE_BF16)
        CU_ATTN_CASE(KVP_DTYPE_FP8_E4M3)
        CU_ATTN_CASE(KVP_DTYPE_I8)
#undef CU_ATTN_CASE
    default:
        return cudaErrorInvalidValue;
    }
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || s.max_splits <= 1)
        return e;
    cu_attn_merge_k<<<dim3(s.merge_grid[0], s.merge_grid[1]), KVP_GPU_MERGE_THREADS, 0, st>>>(p);
    return cudaGetLastError();
}
