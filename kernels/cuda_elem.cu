/* cuda_elem.cu - the row and element kernels: RMSNorm, RoPE, bias, add,
 * SwiGLU, row gather.  Each is the CPU backend's loop with one thread an
 * element (or a CTA a row); the math functions are the precise ones (expf;
 * RoPE's sin and cos through double), no --use_fast_math, as on the CPU.
 */
#include "cuda_impl.cuh"

#define ELEM_THREADS 256
#define ELEM_MAX_BLOCKS 8192 /* beyond this a grid-stride loop: 132 SMs x 2048 threads many times over */

/* ---- RMSNorm: one CTA a row; the sum of squares in double, like the CPU ---- */

#define NORM_THREADS 256

__global__ void __launch_bounds__(NORM_THREADS)
    cu_rmsnorm_k(const float *x, const float *__restrict__ w, float *y, uint32_t n, float eps)
{
    __shared__ double part[NORM_THREADS / 32];
    const float *xr = x + (uint64_t)blockIdx.x * n;
    float *yr = y + (uint64_t)blockIdx.x * n;
    double ss = 0;
    for (uint32_t i = threadIdx.x; i < n; i += NORM_THREADS)
        ss += (double)xr[i] * xr[i];
    for (int o = 16; o > 0; o /= 2)
        ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (threadIdx.x % 32 == 0)
        part[threadIdx.x / 32] = ss;
    __syncthreads(); /* also: every read of x is done before y (which may be x) is written */
    ss = 0;
    for (int i = 0; i < NORM_THREADS / 32; i++)
        ss += part[i];
    float scale = (float)(1.0 / sqrt(ss / n + eps));
    for (uint32_t i = threadIdx.x; i < n; i += NORM_THREADS)
        yr[i] = xr[i] * scale * w[i];
}

cudaError_t cu_rmsnorm(cudaStream_t st, const float *x, const float *w, float *y, uint32_t n_tok, uint32_t n,
                       float eps)
{
    if (n_tok == 0)
        return cudaSuccess;
    cu_rmsnorm_k<<<n_tok, NORM_THREADS, 0, st>>>(x, w, y, n, eps);
    return cudaGetLastError();
}

/* ---- RoPE: one thread a (token, head, pair) ---- */

__global__ void __launch_bounds__(ELEM_THREADS)
    cu_rope_k(float *x, uint64_t n_pairs, uint32_t n_head, uint32_t head_dim, uint32_t half,
              const int32_t *__restrict__ pos, const float *__restrict__ inv_freq, int neox)
{
    for (uint64_t k = (uint64_t)blockIdx.x * ELEM_THREADS + threadIdx.x; k < n_pairs;
         k += (uint64_t)gridDim.x * ELEM_THREADS) {
        uint32_t i = (uint32_t)(k % half);
        uint64_t th = k / half; /* token * n_head + head */
        float *v = x + th * head_dim;
        float a = (float)pos[th / n_head] * inv_freq[i]; /* the CPU's angle, in float */
        /* sin and cos of a: a / pi in double, brought into [-1, 1] exactly,
         * then sincospi, whose reduction needs no table (sinf/cosf reduce
         * angles past 105615 through a table in local memory) */
        double hp = (double)a * 0.318309886183790671538, sd, cd;
        sincospi(hp - 2.0 * rint(hp * 0.5), &sd, &cd);
        float c = (float)cd, s = (float)sd;
        uint32_t e0 = neox ? i : 2 * i, e1 = neox ? i + half : 2 * i + 1;
        float p = v[e0], q = v[e1];
        v[e0] = p * c - q * s;
        v[e1] = p * s + q * c;
    }
}

cudaError_t cu_rope(cudaStream_t st, float *x, uint32_t n_tok, uint32_t n_head, uint32_t head_dim, uint32_t rot_dim,
                    const int32_t *pos, const float *inv_freq, int neox)
{
    uint32_t half = rot_dim / 2;
    uint64_t n = (uint64_t)n_tok * n_head * half;
    if (n == 0)
        return cudaSuccess;
    cu_rope_k<<<kvp_gpuplan_blocks(n, ELEM_THREADS, ELEM_MAX_BLOCKS), ELEM_THREADS, 0, st>>>(
        x, n, n_head, head_dim, half, pos, inv_freq, neox);
    return cudaGetLastError();
}

/* ---- element-wise ---- */

__global__ void __launch_bounds__(ELEM_THREADS)
    cu_add_bias_k(float *__restrict__ x, const float *__restrict__ bias, uint64_t total, uint32_t n)
{
    for (uint64_t i = (uint64_t)blockIdx.x * ELEM_THREADS + threadIdx.x; i < total; i += (uint64_t)gridDim.x * ELEM_THREADS)
        x[i] += bias[i % n];
}

__global__ void __launch_bounds__(ELEM_THREADS) cu_add_k(float *__restrict__ x, const float *__restrict__ y, uint64_t n)
{
    for (uint64_t i = (uint64_t)blockIdx.x * ELEM_THREADS + threadIdx.x; i < n; i += (uint64_t)gridDim.x * ELEM_THREADS)
        x[i] += y[i];
}

__global__ void __launch_bounds__(ELEM_THREADS)
    cu_silu_mul_k(float *__restrict__ g, const float *__restrict__ u, uint64_t n)
{
    for (uint64_t i = (uint64_t)blockIdx.x * ELEM_THREADS + threadIdx.x; i < n; i += (uint64_t)gridDim.x * ELEM_THREADS)
        g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

cudaError_t cu_add_bias(cudaStream_t st, float *x, const float *bias, uint32_t n_tok, uint32_t n)
{
    uint64_t total = (uint64_t)n_tok * n;
    if (total == 0)
        return cudaSuccess;
    cu_add_bias_k<<<kvp_gpuplan_blocks(total, ELEM_THREADS, ELEM_MAX_BLOCKS), ELEM_THREADS, 0, st>>>(x, bias, total, n);
    return cudaGetLastError();
}

cudaError_t cu_add(cudaStream_t st, float *x, const float *y, size_t n)
{
    if (n == 0)
        return cudaSuccess;
    cu_add_k<<<kvp_gpuplan_blocks(n, ELEM_THREADS, ELEM_MAX_BLOCKS), ELEM_THREADS, 0, st>>>(x, y, n);
    return cudaGetLastError();
}

cudaError_t cu_silu_mul(cudaStream_t st, float *g, const float *u, size_t n)
{
    if (n == 0)
        return cudaSuccess;
    cu_silu_mul_k<<<kvp_gpuplan_blocks(n, ELEM_THREADS, ELEM_MAX_BLOCKS), ELEM_THREADS, 0, st>>>(g, u, n);
    return cudaGetLastError();
}

/* ---- gather: one CTA a destination row ---- */

__global__ void __launch_bounds__(ELEM_THREADS)
    cu_gather_rows_k(float *__restrict__ dst, const float *__restrict__ src, const uint32_t *__restrict__ rows,
                     uint32_t n)
{
    const float *s = src + (uint64_t)rows[blockIdx.x] * n;
    float *d = dst + (uint64_t)blockIdx.x * n;
    for (uint32_t i = threadIdx.x; i < n; i += ELEM_THREADS)
        d[i] = s[i];
}

cudaError_t cu_gather_rows(cudaStream_t st, float *dst, const float *src, const uint32_t *rows, uint32_t n_rows,
                           uint32_t n)
{
    if (n_rows == 0 || n == 0)
        return cudaSuccess;
    cu_gather_rows_k<<<n_rows, ELEM_THREADS, 0, st>>>(dst, src, rows, n);
    return cudaGetLastError();
}

/* ---- argmax: one CTA a row ---- */

/* (bv, bi) = the better of itself and lane + off's, by cu_argmax_beats */
static __device__ void cu_argmax_shfl(float &bv, uint32_t &bi, int off)
{
    float ov = __shfl_down_sync(0xffffffffu, bv, off);
    uint32_t oi = __shfl_down_sync(0xffffffffu, bi, off);
    if (cu_argmax_beats(ov, oi, bv, bi))
        bv = ov, bi = oi;
}

__global__ void __launch_bounds__(ELEM_THREADS)
    cu_argmax_k(const float *__restrict__ x, uint32_t n, uint32_t *__restrict__ ids)
{
    __shared__ float wv[ELEM_THREADS / 32];
    __shared__ uint32_t wi[ELEM_THREADS / 32];
    const float *row = x + (uint64_t)blockIdx.x * n;
    float bv = -INFINITY;
    uint32_t bi = UINT32_MAX;
    for (uint32_t i = threadIdx.x; i < n; i += ELEM_THREADS)
        if (cu_argmax_beats(row[i], i, bv, bi))
            bv = row[i], bi = i;
    for (int off = 16; off > 0; off >>= 1)
        cu_argmax_shfl(bv, bi, off);
    uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0)
        wv[warp] = bv, wi[warp] = bi;
    __syncthreads();
    if (warp != 0)
        return;
    bv = lane < ELEM_THREADS / 32 ? wv[lane] : -INFINITY;
    bi = lane < ELEM_THREADS / 32 ? wi[lane] : UINT32_MAX;
    for (int off = 16; off > 0; off >>= 1)
        cu_argmax_shfl(bv, bi, off);
    if (lane == 0)
        ids[blockIdx.x] = bi == UINT32_MAX ? 0 : bi;
}

cudaError_t cu_argmax_rows(cudaStream_t st, const float *x, uint32_t n_rows, uint32_t n, uint32_t *ids)
{
    if (n_rows == 0)
        return cudaSuccess;
    cu_argmax_k<<<n_rows, ELEM_THREADS, 0, st>>>(x, n, ids);
    return cudaGetLastError();
}

cudaError_t cu_probe(cudaFuncAttributes *fa) { return cudaFuncGetAttributes(fa, cu_add_k); }
