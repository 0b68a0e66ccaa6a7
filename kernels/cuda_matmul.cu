/* cuda_matmul.cu - y = x . w^T on weights in their stored format, and the
 * embedding lookup.
 *
 * Decode (up to KVP_GPU_GEMV_MAX_TOK tokens): a warp a weight row, each lane
 * decoding 8 consecutive elements at a time (cu_wdec8) and multiplying them
 * with every token's activations, so the row is read from memory once for
 * all tokens; the lanes' sums meet in a shuffle reduction.  Prompts: a
 * plain tiled f32 GEMM (64 tokens x 64 rows a CTA, steps of 32 elements)
 * that decodes its weight tile into shared memory.  Neither uses tensor
 * cores: correct first (kernels/README.md says what comes next).
 */
#include "cuda_impl.cuh"

/* ---- GEMV ---- */

/* Weight chunks (8 elements each) a lane decodes before it multiplies any
 * of them, so that many loads are in flight at once: a memory-bound GEMV
 * needs several kilobytes in flight a warp to approach the H200's
 * bandwidth, where one 16-byte load a lane at a time reached 17% of it.
 * Formats of a byte or less an element take more chunks a step; a scaled
 * kind's element-by-element decoder (not grouped in 8s) takes fewer, since
 * its registers would spill.  f16 and bf16 keep one chunk a step: on an
 * H200 (2026-12-04, gpu_bench's "GEMV alone") that kernel read bf16 at
 * 51-67% of the copy bandwidth and 4 chunks a step at 32-56%, its fewer
 * CTAs an SM costing more than the loads in flight gain; the 16-byte
 * chunk is already a whole vector load. */
template <int DT, int GRP>
__host__ __device__ constexpr int cu_gemv_unroll()
{
    if (DT == KVP_DTYPE_F16 || DT == KVP_DTYPE_BF16)
        return 1;
    if (DT == KVP_DTYPE_F32)
        return 4;
    if ((DT == KVP_DTYPE_FP8_E4M3 || DT == KVP_DTYPE_I8 || DT == KVP_DTYPE_I4) && !GRP)
        return 2;
    return 8;
}

/* U chunks a step: 1 is the first kernel (KVP_CUDA_PIPELINE=0; at least 8
 * CTAs an SM, at most 64 registers: without it ptxas spills 4 bytes in the
 * Q8_0 instance); more (the default) at least 4 CTAs an SM, 128 registers,
 * room for the chunks in flight.  NT is the most tokens the instance takes:
 * KVP_GPU_GEMV_MAX_TOK, or 1 for a pipelined batch-1 step, whose code then
 * holds one token's sums and none of the others' bounds checks (the
 * 8-token instance unrolls all eight behind a branch each, ~6,000
 * instructions for fp8), the same operations for that token. */
template <int DT, int GRP, int U, int NT>
__global__ void __launch_bounds__(KVP_GPU_GEMV_THREADS, U == 1 ? 8 : 4)
    cu_gemv_k(cu_wview w, uint32_t n_out, const float *__restrict__ x, float *__restrict__ y, uint32_t n_tok)
{
    constexpr uint32_t STEP = 32 * 8; /* elements a warp covers a chunk */
    uint32_t lane = threadIdx.x % 32, r = blockIdx.x * KVP_GPU_GEMV_ROWS + threadIdx.x / 32;
    if (r >= n_out)
        return;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++)
        acc[t] = 0.0f;
    /* x rows are 16-byte aligned when the buffer is and n_in is a multiple of 4 */
    int vec = ((uintptr_t)x & 15) == 0 && w.n_in % 4 == 0;
#pragma unroll 1
    for (uint32_t i0 = lane * 8; i0 < w.n_in; i0 += STEP * U) {
        float wv[U][8];
#pragma unroll
        for (int u = 0; u < U; u++) {
            uint32_t i = i0 + u * STEP;
            if (i < w.n_in) {
                if (GRP) /* a scaled kind in groups of 8 (cu_wgrouped) */
                    cu_wdec8_grp<DT>(w, r, i, wv[u]);
                else
                    cu_wdec8<DT>(w, r, i, wv[u]);
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++)
                    wv[u][j] = 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            uint32_t i = i0 + u * STEP;
            if (i >= w.n_in)
                break;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if ((uint32_t)t >= n_tok)
                    break;
                const float *xp = x + (uint64_t)t * w.n_in + i;
                float s = 0.0f;
                if (vec && i + 8 <= w.n_in) {
                    float4 a = ((const float4 *)xp)[0], b = ((const float4 *)xp)[1];
                    s = wv[u][0] * a.x + wv[u][1] * a.y + wv[u][2] * a.z + wv[u][3] * a.w + wv[u][4] * b.x +
                        wv[u][5] * b.y + wv[u][6] * b.z + wv[u][7] * b.w;
                } else {
#pragma unroll
                    for (int j = 0; j < 8; j++)
                        s += i + j < w.n_in ? wv[u][j] * xp[j] : 0.0f;
                }
                acc[t] += s;
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if ((uint32_t)t >= n_tok)
            break;
        float s = acc[t];
        for (int o = 16; o > 0; o /= 2)
            s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0)
            y[(uint64_t)t * n_out + r] = s;
    }
}

/* ---- GEMM ---- */

/* A GEMM tile's 8 weights: cu_wdec8's, or zeros past the rows or the row. */
template <int DT>
__device__ static inline void cu_wdec8_tile(const cu_wview &w, uint32_t r, uint32_t i0, uint32_t n_out, float out[8])
{
    if (r < n_out && i0 < w.n_in) {
        cu_wdec8<DT>(w, r, i0, out);
        return;
    }
#pragma unroll
    for (int j = 0; j < 8; j++)
        out[j] = 0.0f;
}

#define BM KVP_GPU_GEMM_BM
#define BN KVP_GPU_GEMM_BN
#define BK KVP_GPU_GEMM_BK

template <int DT>
__global__ void __launch_bounds__(KVP_GPU_GEMM_THREADS)
    cu_gemm_k(cu_wview w, uint32_t n_out, const float *__restrict__ x, float *__restrict__ y, uint32_t n_tok)
{
    /* [k][token] and [k][row]: the inner loop reads 4 consecutive tokens and
     * 4 consecutive rows of one k; +4 keeps rows 16-byte aligned */
    __shared__ __align__(16) float xs[BK][BM + 4];
    __shared__ __align__(16) float ws[BK][BN + 4];
    uint32_t tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    uint32_t tok0 = blockIdx.y * BM, row0 = blockIdx.x * BN;
    float acc[4][4] = {};
    for (uint32_t k0 = 0; k0 < w.n_in; k0 += BK) {
        /* activations: BM x BK floats, consecutive threads along k (coalesced) */
#pragma unroll
        for (int e = 0; e < BM * BK / KVP_GPU_GEMM_THREADS; e++) {
            uint32_t idx = tid + e * KVP_GPU_GEMM_THREADS, t = idx / BK, kk = idx % BK;
            uint32_t gt = tok0 + t, gk = k0 + kk;
            xs[kk][t] = gt < n_tok && gk < w.n_in ? x[(uint64_t)gt * w.n_in + gk] : 0.0f;
        }
        /* weights: BN rows x BK elements, one 8-element decode a thread */
        {
            uint32_t rr = tid / (BK / 8), part = tid % (BK / 8), r = row0 + rr, i0 = k0 + part * 8;
            float wv[8];
            cu_wdec8_tile<DT>(w, r, i0, n_out, wv);
#pragma unroll
            for (int j = 0; j < 8; j++)
                ws[part * 8 + j][rr] = wv[j];
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < BK; kk++) {
            float4 a = *(const float4 *)&xs[kk][ty * 4], b = *(const float4 *)&ws[kk][tx * 4];
            float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    acc[i][j] += av[i] * bv[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint32_t t = tok0 + ty * 4 + i;
        if (t >= n_tok)
            break;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            uint32_t r = row0 + tx * 4 + j;
            if (r < n_out)
                y[(uint64_t)t * n_out + r] = acc[i][j];
        }
    }
}

/* ---- GEMM on the tensor cores (the default; KVP_CUDA_MMA=0 the f32 one) ----
 *
 * The same 64-token x 64-row tiles and grid as cu_gemm_k, but the tiles go
 * to shared memory as bf16 (activations rounded to nearest even, weights
 * decoded by cu_wdec8 then rounded) and 8 warps multiply them with
 * mma.sync m16n8k16 (bf16 in, f32 accumulate): warp w takes tokens
 * 32 (w / 4) .. + 32 and rows 16 (w % 4) .. + 16, two m16 by two n8 tiles.
 * bf16 operands put the products within about 1e-3 of f32 ones, inside the
 * tolerances the op tests apply to every weight kind but f32 (f32 weights
 * stay on cu_gemm_k).  A step takes KB elements of k: KVP_GPU_GEMM_BK (32,
 * cu_gemm_k's) or KVP_GPU_MMA_BK64 (64: twice the loads in flight a step and
 * half the steps, for GEMMs whose CTAs are latency-bound, as a split
 * decode batch's are; KVP_CUDA_MMA_K64=0 for 32). */

/* 8 floats as 8 bf16 (round to nearest even), one 16-byte store */
__device__ static inline void cu_store_bf16x8(uint16_t *dst, const float v[8])
{
    uint32_t u[4];
#pragma unroll
    for (int j = 0; j < 4; j++)
        u[j] = (uint32_t)cu_to_bf16(v[2 * j]) | (uint32_t)cu_to_bf16(v[2 * j + 1]) << 16;
    *(uint4 *)dst = make_uint4(u[0], u[1], u[2], u[3]);
}

__device__ static inline void cu_mma_bf16(float c[4], const uint32_t a[4], const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* Where a thread's acc[mi][ni][e] (i = (mi * 2 + ni) * 4 + e) sits in a
 * BM x BN tile of sums, [token][row] */
__device__ static inline uint32_t cu_splitk_at(int i, uint32_t wm, uint32_t wn, uint32_t g, uint32_t t4)
{
    uint32_t mi = i / 8, ni = i / 4 % 2, e = i % 4;
    return (wm + mi * 16 + g + (e >= 2 ? 8 : 0)) * BN + wn + ni * 8 + 2 * t4 + (e & 1);
}

/* Split-K's meeting point (kvp_gpuplan_matmul): each part of a tile
 * writes its 16 sums a thread to the workspace, and the last part of the
 * tile to arrive (a counter per tile) reads every part's sums back in part
 * order and leaves their totals in acc: 1 for that CTA, which then writes
 * y, 0 for the others, which are done.  The order of the additions does
 * not depend on which part arrives last, so the result is deterministic.
 * The last part sets the counter back to 0 for the next launch. */
__device__ static int cu_splitk_gather(const cu_splitk &sk, float *acc, uint32_t wm, uint32_t wn, uint32_t g,
                                       uint32_t t4)
{
    __shared__ int last;
    const uint32_t tiles = gridDim.x * gridDim.y, tile = blockIdx.y * gridDim.x + blockIdx.x;
    float *mine = sk.ws + ((uint64_t)blockIdx.z * tiles + tile) * (BM * BN);
#pragma unroll
    for (int i = 0; i < 16; i++)
        mine[cu_splitk_at(i, wm, wn, g, t4)] = acc[i];
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
        last = atomicAdd(&sk.cnt[tile], 1u) == gridDim.z - 1;
    __syncthreads();
    if (!last)
        return 0;
    __threadfence();
    /* a part at a time, its 16 loads in flight together; each sum still
     * adds the parts in order 0, 1, .. (0 + the first part is exact) */
#pragma unroll
    for (int i = 0; i < 16; i++)
        acc[i] = 0.0f;
    for (uint32_t z = 0; z < gridDim.z; z++) {
        const float *part = sk.ws + ((uint64_t)z * tiles + tile) * (BM * BN);
#pragma unroll
        for (int i = 0; i < 16; i++)
            acc[i] += __ldcg(part + cu_splitk_at(i, wm, wn, g, t4)); /* past L1: other CTAs wrote it */
    }
    if (threadIdx.x == 0)
        sk.cnt[tile] = 0;
    return 1;
}

template <int DT, int KB>
__global__ void __launch_bounds__(KVP_GPU_GEMM_THREADS)
    cu_gemm_mma_k(cu_wview w, uint32_t n_out, const float *__restrict__ x, float *__restrict__ y, uint32_t n_tok,
                  uint32_t kper, cu_splitk sk)
{
    /* KB elements of k a step (KVP_GPU_GEMM_BK or KVP_GPU_MMA_BK64); a row
     * of the tiles is KB + 8 halves: at 32 or 64 a fragment's 8 rows x 4
     * words still fall in 32 different banks */
    constexpr int LD = KB + 8, CH = KB / 8, ROWS = KVP_GPU_GEMM_THREADS / CH, PASS = BM / ROWS;
    static_assert(KVP_GPU_GEMM_THREADS % CH == 0 && BM % ROWS == 0 && BM == BN, "tile loads");
    __shared__ __align__(16) uint16_t xs[BM][LD]; /* [token][k] */
    __shared__ __align__(16) uint16_t ws[BN][LD]; /* [row][k] */
    const uint32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t4 = lane % 4;
    const uint32_t tok0 = blockIdx.y * BM, row0 = blockIdx.x * BN, wm = (warp / 4) * 32, wn = (warp % 4) * 16;
    /* each thread loads 8 consecutive elements of PASS tokens' and PASS
     * rows' k range (rows lr, lr + ROWS, ..), every load issued before any
     * is converted so their latencies overlap */
    const uint32_t lr = tid / CH, part = (tid % CH) * 8;
    const int vec = ((uintptr_t)x & 15) == 0 && w.n_in % 4 == 0;
    float acc[2][2][4] = {};
    /* this CTA's part of the k range (all of it unless split, cuda_impl.cuh) */
    const uint32_t kbeg = blockIdx.z * kper * KB, kend = min(w.n_in, kbeg + kper * KB);
    for (uint32_t k0 = kbeg; k0 < kend; k0 += KB) {
        float vx[PASS][8], vw[PASS][8];
        const uint32_t gk = k0 + part;
#pragma unroll
        for (int p = 0; p < PASS; p++) {
            uint32_t gt = tok0 + lr + p * ROWS;
            const float *xp = x + (uint64_t)gt * w.n_in + gk;
            if (gt < n_tok && vec && gk + 8 <= kend) {
                float4 a = ((const float4 *)xp)[0], b = ((const float4 *)xp)[1];
                vx[p][0] = a.x, vx[p][1] = a.y, vx[p][2] = a.z, vx[p][3] = a.w;
                vx[p][4] = b.x, vx[p][5] = b.y, vx[p][6] = b.z, vx[p][7] = b.w;
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++)
                    vx[p][j] = gt < n_tok && gk + j < kend ? xp[j] : 0.0f;
            }
        }
#pragma unroll
        for (int p = 0; p < PASS; p++)
            cu_wdec8_tile<DT>(w, row0 + lr + p * ROWS, gk < kend ? gk : w.n_in, n_out, vw[p]);
#pragma unroll
        for (int p = 0; p < PASS; p++) {
            cu_store_bf16x8(&xs[lr + p * ROWS][part], vx[p]);
            cu_store_bf16x8(&ws[lr + p * ROWS][part], vw[p]);
        }
        __syncthreads();
#pragma unroll
        for (uint32_t kk = 0; kk < KB; kk += 16) {
            uint32_t a[2][4], b[2][2], c = kk + 2 * t4;
#pragma unroll
            for (int mi = 0; mi < 2; mi++) {
                uint32_t m = wm + mi * 16 + g;
                a[mi][0] = *(const uint32_t *)&xs[m][c];
                a[mi][1] = *(const uint32_t *)&xs[m + 8][c];
                a[mi][2] = *(const uint32_t *)&xs[m][c + 8];
                a[mi][3] = *(const uint32_t *)&xs[m + 8][c + 8];
            }
#pragma unroll
            for (int ni = 0; ni < 2; ni++) {
                uint32_t n = wn + ni * 8 + g;
                b[ni][0] = *(const uint32_t *)&ws[n][c];
                b[ni][1] = *(const uint32_t *)&ws[n][c + 8];
            }
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int ni = 0; ni < 2; ni++)
                    cu_mma_bf16(acc[mi][ni], a[mi], b[ni]);
        }
        __syncthreads();
    }
    /* c0, c1: token g, rows 2 t4 and 2 t4 + 1 of the n8 tile; c2, c3: token g + 8 */
    if (gridDim.z > 1 && !cu_splitk_gather(sk, &acc[0][0][0], wm, wn, g, t4))
        return;
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 2; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                uint32_t tk = tok0 + wm + mi * 16 + g + (e >= 2 ? 8 : 0), r = row0 + wn + ni * 8 + 2 * t4 + (e & 1);
                if (tk < n_tok && r < n_out)
                    y[(uint64_t)tk * n_out + r] = acc[mi][ni][e];
            }
}

/* ---- embedding: one CTA a token, the row decoded 8 elements a thread ---- */

#define EMBED_THREADS 128

template <int DT>
__global__ void __launch_bounds__(EMBED_THREADS)
    cu_embed_k(cu_wview w, uint32_t n_out, const int32_t *__restrict__ tokens, float *__restrict__ out,
               cu_faults *faults)
{
    uint32_t t = blockIdx.x;
    int32_t id = tokens[t];
    float *o = out + (uint64_t)t * w.n_in;
    if (id < 0 || (uint32_t)id >= n_out) {
        if (threadIdx.x == 0)
            cu_fault(faults, CU_FAULT_TOKEN, id);
        for (uint32_t i = threadIdx.x; i < w.n_in; i += EMBED_THREADS)
            o[i] = 0.0f;
        return;
    }
    for (uint32_t i0 = threadIdx.x * 8; i0 < w.n_in; i0 += EMBED_THREADS * 8) {
        float v[8];
        cu_wdec8<DT>(w, (uint32_t)id, i0, v);
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (i0 + j < w.n_in)
                o[i0 + j] = v[j];
    }
}

/* The GEMV instance for w: the first one (KVP_CUDA_PIPELINE=0), or (pipelined) several chunks
 * in flight and the grouped decoder where a scaled weight allows it. */
template <int DT>
static void cu_gemv_launch(cudaStream_t st, const cu_wview &w, uint32_t n_out, const float *x, float *y,
                           uint32_t n_tok, dim3 grid, uint32_t threads, int pipelined)
{
    constexpr int MT = KVP_GPU_GEMV_MAX_TOK;
    if (!pipelined) {
        cu_gemv_k<DT, 0, 1, MT><<<grid, threads, 0, st>>>(w, n_out, x, y, n_tok);
        return;
    }
    if constexpr (DT == KVP_DTYPE_FP8_E4M3 || DT == KVP_DTYPE_I8 || DT == KVP_DTYPE_I4) {
        if (cu_wgrouped(w, DT)) {
            constexpr int U = cu_gemv_unroll<DT, 1>();
            if (n_tok == 1)
                cu_gemv_k<DT, 1, U, 1><<<grid, threads, 0, st>>>(w, n_out, x, y, n_tok);
            else
                cu_gemv_k<DT, 1, U, MT><<<grid, threads, 0, st>>>(w, n_out, x, y, n_tok);
            return;
        }
    }
    constexpr int U = cu_gemv_unroll<DT, 0>();
    if (n_tok == 1)
        cu_gemv_k<DT, 0, U, 1><<<grid, threads, 0, st>>>(w, n_out, x, y, n_tok);
    else
        cu_gemv_k<DT, 0, U, MT><<<grid, threads, 0, st>>>(w, n_out, x, y, n_tok);
}

/* The GEMM instance for w: the f32 one, or (mma) the tensor cores' for
 * every kind but f32. */
template <int DT>
static void cu_gemm_launch(cudaStream_t st, const cu_wview &w, uint32_t n_out, const float *x, float *y,
                           uint32_t n_tok, dim3 grid, uint32_t threads, uint32_t kper, uint32_t kb,
                           const cu_splitk &sk, int mma)
{
    if constexpr (DT != KVP_DTYPE_F32) {
        if (mma) {
            if (kb == KVP_GPU_MMA_BK64)
                cu_gemm_mma_k<DT, KVP_GPU_MMA_BK64><<<grid, threads, 0, st>>>(w, n_out, x, y, n_tok, kper, sk);
            else
                cu_gemm_mma_k<DT, KVP_GPU_GEMM_BK><<<grid, threads, 0, st>>>(w, n_out, x, y, n_tok, kper, sk);
            return;
        }
    }
    cu_gemm_k<DT><<<grid, threads, 0, st>>>(w, n_out, x, y, n_tok);
}

cudaError_t cu_matmul(cudaStream_t st, int dtype, const cu_wview &w, uint32_t n_out, const float *x, float *y,
                      uint32_t n_tok, const kvp_gpu_mm_shape &s, const cu_splitk &sk, int pipelined, int mma)
{
    if (s.kind == KVP_GPU_MM_GEMM && (s.grid[2] > 1 || s.kb != KVP_GPU_GEMM_BK) &&
        (!mma || dtype == KVP_DTYPE_F32 || (s.grid[2] > 1 && (!sk.ws || !sk.cnt))))
        return cudaErrorInvalidValue; /* only the tensor-core GEMM splits k or takes 64 a step */
    dim3 grid(s.grid[0], s.grid[1], s.grid[2]);
    int gemv = s.kind == KVP_GPU_MM_GEMV;
    switch (dtype) {
#define CU_MM_CASE(DT)                                                                 \
    case DT:                                                                           \
        if (gemv)                                                                      \
            cu_gemv_launch<DT>(st, w, n_out, x, y, n_tok, grid, s.threads, pipelined); \
        else                                                                           \
            cu_gemm_launch<DT>(st, w, n_out, x, y, n_tok, grid, s.threads, s.kper, s.kb, sk, mma); \
        break;
        CU_WEIGHT_DTYPES(CU_MM_CASE)
#undef CU_MM_CASE
    default:
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

cudaError_t cu_embed(cudaStream_t st, int dtype, const cu_wview &w, uint32_t n_out, const int32_t *tokens,
                     uint32_t n_tok, float *out, cu_faults *faults)
{
    if (n_tok == 0)
        return cudaSuccess;
    switch (dtype) {
#define CU_EMBED_CASE(DT)                                                              \
    case DT:                                                                           \
        cu_embed_k<DT><<<n_tok, EMBED_THREADS, 0, st>>>(w, n_out, tokens, out, faults); \
        break;
        CU_WEIGHT_DTYPES(CU_EMBED_CASE)
#undef CU_EMBED_CASE
    default:
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}
