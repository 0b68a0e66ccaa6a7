/* backend_cuda.cu - the CUDA backend's host side: backend.h's operations
 * table over one GPU (see backend_cuda.h; the kernels are in cuda_*.cu).
 *
 * Everything runs in order on one non-blocking stream.  Ops only queue work
 * and check that it was queued; a kernel's own failure (and bad input a
 * kernel finds: cuda_impl.cuh's fault record) surfaces at the next
 * synchronize or to_host, as backend.h allows.  Device memory is plain
 * cudaMalloc (never managed memory), zeroed as alloc promises.  Weights are
 * uploaded once by prepare_weight; scratch (the split-K partial results) is
 * sized by reserve, so ops never allocate device memory.  Tensor
 * parallelism goes through the host: the vector is copied down, reduced or
 * gathered by lib/comm (MPI), and copied back; correct, not fast.
 *
 * Every CUDA call is checked; a failure becomes a kvp_err with the CUDA
 * error string and the op (and tensor) it happened in.
 */
#include "cuda_impl.cuh"
#include "cuda_prof.cuh"

#ifndef KVP_CUDA_ARCHS
#define KVP_CUDA_ARCHS "sm_90" /* the Makefile passes NVCC_GENCODE's */
#endif

extern "C" {
#include "backend_cuda.h"
#include "comm.h"
}

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cu_impl {
    int device;
    char dev_name[256];         /* cudaDeviceProp.name */
    cudaStream_t st;
    cu_faults *faults;         /* mapped host memory the kernels write (cuda_impl.cuh) */
    cu_faults *faults_dev;     /* the same, as the device addresses it */
    const char *embed_name;    /* the table of the last embed, for a bad token's message */
    float *parts;              /* attention's split results (reserve) */
    uint64_t parts_floats;
    void *host;                /* all_reduce / all_gather staging (host memory) */
    size_t host_size;
    int pipelined;             /* KVP_CUDA_PIPELINE (default 1): the pipelined GEMV and attention (kernels/README.md) */
    int mma;                   /* KVP_CUDA_MMA (default 1): the tensor-core GEMM */
    uint32_t *ids;             /* argmax_rows' device ids (reserve: max_tok of them) */
    uint32_t fill;             /* a split GEMM's CTAs: 2 x the SMs (mma only, not KVP_CUDA_SPLITK=0; else 0: none splits) */
    cu_splitk sk;              /* its workspace and tile counters (kvp_gpuplan_matmul) */
    uint32_t mma_kb;           /* the GEMM's k step: 64 (mma), or 32 (KVP_CUDA_MMA_K64=0, or the f32 GEMM's) */
    uint32_t ids_cap;
    cu_prof *prof;             /* KVP_CUDA_PROFILE=1: each op timed (cuda_prof.cuh), else NULL */
    kvp_backend_ops prof_ops;  /* then the ops table, each op through its timer */
} cu_impl;

/* What prepare_weight leaves in w->dev: the weight's view for the kernels
 * and its one device allocation. */
typedef struct cu_weight {
    cu_wview v;
    int dtype;
    uint32_t n_out;
    const float *f32;          /* a 1-D weight as f32 (norms, biases, RoPE frequencies), else NULL */
    void *mem;
} cu_weight;

static cu_impl *impl_of(const kvp_backend *b) { return (cu_impl *)b->impl; }

static const char *wname(const kvp_weight *w) { return w && w->name ? w->name : "weight"; }

/* The kvp_err code of a CUDA error: out of memory, no usable device, or any
 * other failure of the device or the driver (reported as an I/O error). */
static int cu_code(cudaError_t e)
{
    switch (e) {
    case cudaErrorMemoryAllocation: return KVP_ENOMEM;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidDevice: return KVP_EUNSUPPORTED;
    case cudaErrorInvalidValue: return KVP_EINVAL;
    default: return KVP_EIO;
    }
}

/* Record CUDA error e as "cuda: <what>: <CUDA's message>" and clear it from
 * the runtime's last-error slot (a non-sticky error would otherwise be
 * reported again by the next launch check). */
static int cu_fail(kvp_err *err, cudaError_t e, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    (void)cudaGetLastError();
    return kvp_err_set(err, cu_code(e), "cuda: %s: %s", what, cudaGetErrorString(e));
}

#define CU_CHECK(call, err, ...)                                                  \
    do {                                                                          \
        cudaError_t e_ = (call);                                                  \
        if (e_ != cudaSuccess)                                                    \
            return cu_fail((err), e_, __VA_ARGS__);                               \
    } while (0)

/* The first fault a kernel recorded since the last look, as an error. */
static int cu_take_fault(cu_impl *im, kvp_err *err)
{
    volatile cu_faults *f = im->faults;
    int kind = f->kind;
    if (kind == CU_FAULT_NONE)
        return 0;
    long long v = (long long)f->value;
    f->value = 0;
    f->kind = CU_FAULT_NONE;
    switch (kind) {
    case CU_FAULT_TOKEN:
        return kvp_err_set(err, KVP_EINVAL, "cuda embed: %s: token id %lld is outside the table",
                           im->embed_name ? im->embed_name : "embedding", v);
    case CU_FAULT_SLOT:
        return kvp_err_set(err, KVP_EINVAL, "cuda kv_store: slot %lld is outside the KV pool", v);
    case CU_FAULT_BLOCK:
        return kvp_err_set(err, KVP_EINVAL, "cuda attention: a block table holds block %lld, outside the KV pool", v);
    case CU_FAULT_CTX:
        return kvp_err_set(err, KVP_EINVAL, "cuda attention: a query at position %lld is past the step's max_ctx", v);
    case CU_FAULT_TREE:
        return kvp_err_set(err, KVP_EINVAL, "cuda attention: a draft tree's key is in slot %lld, past its block table", v);
    default:
        return kvp_err_set(err, KVP_EIO, "cuda: kernel fault %d (%lld)", kind, v);
    }
}

/* Ops may be called from another thread than the one that created the
 * backend: make its device current there. */
static int cu_enter(cu_impl *im, kvp_err *err, const char *op)
{
    CU_CHECK(cudaSetDevice(im->device), err, "%s: device %d", op, im->device);
    return 0;
}

/* ---- memory ---- */

static void *cu_alloc(kvp_backend *b, size_t bytes)
{
    cu_impl *im = impl_of(b);
    void *p = NULL;
    if (cudaSetDevice(im->device) != cudaSuccess || cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    if (cudaMemsetAsync(p, 0, bytes, im->st) != cudaSuccess) {
        (void)cudaGetLastError();
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cu_release(kvp_backend *b, void *p)
{
    if (p) {
        cudaSetDevice(impl_of(b)->device);
        cudaStreamSynchronize(impl_of(b)->st); /* ops queued before may still read it */
        cudaFree(p);
        (void)cudaGetLastError(); /* nowhere to report; not to be blamed on the next op */
    }
}

static int cu_to_host(kvp_backend *b, void *host, const void *dev, size_t bytes, kvp_err *err)
{
    cu_impl *im = impl_of(b);
    int rc = cu_enter(im, err, "to_host");
    if (rc < 0)
        return rc;
    if (bytes)
        CU_CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, im->st), err, "to_host of %zu bytes",
                 bytes);
    CU_CHECK(cudaStreamSynchronize(im->st), err, "to_host of %zu bytes (or an op before it)", bytes);
    return cu_take_fault(im, err);
}

/* The host bytes may be reused at once: CUDA stages pageable memory before
 * the call returns. */
static int cu_from_host(kvp_backend *b, void *dev, const void *host, size_t bytes, kvp_err *err)
{
    cu_impl *im = impl_of(b);
    if (!bytes)
        return 0;
    int rc = cu_enter(im, err, "from_host");
    if (rc < 0)
        return rc;
    CU_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, im->st), err, "from_host of %zu bytes", bytes);
    return 0;
}

static int cu_synchronize(kvp_backend *b, kvp_err *err)
{
    cu_impl *im = impl_of(b);
    int rc = cu_enter(im, err, "synchronize");
    if (rc < 0)
        return rc;
    CU_CHECK(cudaStreamSynchronize(im->st), err, "synchronize (an op issued before)");
    return cu_take_fault(im, err);
}

/* argmax_rows' device ids for up to n rows (a step's tokens bound its rows) */
static int reserve_ids(cu_impl *im, uint32_t n, kvp_err *err)
{
    if (n <= im->ids_cap)
        return 0;
    int rc = cu_enter(im, err, "reserve");
    if (rc < 0)
        return rc;
    CU_CHECK(cudaStreamSynchronize(im->st), err, "reserve: waiting for the ops before it");
    cudaFree(im->ids);
    im->ids = NULL, im->ids_cap = 0;
    CU_CHECK(cudaMalloc((void **)&im->ids, (size_t)n * sizeof *im->ids), err, "reserve: %u argmax ids", n);
    im->ids_cap = n;
    return 0;
}

static int cu_reserve(kvp_backend *b, const kvp_backend_reserve *r, kvp_err *err)
{
    cu_impl *im = impl_of(b);
    int rc0 = reserve_ids(im, r->max_tok, err);
    if (rc0 < 0 || !r->kv)
        return rc0;
    kvp_gpu_attn_shape s;
    const kvp_kv_pool *kv = r->kv;
    int rc = kvp_gpuplan_attn(&s, r->max_tok, r->n_head, kv->n_head_kv, kv->head_dim, kv->block_size, r->max_ctx,
                              im->pipelined, err);
    if (rc < 0)
        return rc;
    if (!cu_kv_dtype_ok(kv->dtype))
        return kvp_err_set(err, KVP_EUNSUPPORTED, "cuda: a KV cache of %s is not supported",
                           kvp_dtype_name((uint32_t)kv->dtype));
    if (s.part_floats <= im->parts_floats)
        return 0;
    if ((rc = cu_enter(im, err, "reserve")) < 0)
        return rc;
    CU_CHECK(cudaStreamSynchronize(im->st), err, "reserve: waiting for the ops before it");
    cudaFree(im->parts);
    im->parts = NULL, im->parts_floats = 0;
    CU_CHECK(cudaMalloc((void **)&im->parts, s.part_floats * sizeof(float)), err,
             "reserve: %llu floats of attention scratch (%u tokens, contexts of %u)",
             (unsigned long long)s.part_floats, r->max_tok, r->max_ctx);
    im->parts_floats = s.part_floats;
    return 0;
}

/* ---- weights ---- */

/* GGUF block types the kernels do not read: prepare_weight uploads them
 * dequantized to f32 (lib/num's rows, the CPU's own row path), so a file
 * mixing in a few of them (Q4_K_M's Q6_K output) still runs, at 4 bytes a
 * weight for those tensors. */
static int via_f32(int dtype)
{
    return dtype == KVP_DTYPE_Q5_0 || dtype == KVP_DTYPE_Q5_1 || dtype == KVP_DTYPE_Q2_K || dtype == KVP_DTYPE_Q3_K ||
           dtype == KVP_DTYPE_Q4_K || dtype == KVP_DTYPE_Q5_K || dtype == KVP_DTYPE_Q6_K || dtype == KVP_DTYPE_IQ4_NL ||
           dtype == KVP_DTYPE_IQ4_XS || dtype == KVP_DTYPE_MXFP4;
}

static int cu_supports(const kvp_backend *b, int use, int dtype, int scaled)
{
    (void)b;
    switch (use) {
    case KVP_USE_MATMUL:
    case KVP_USE_EMBED:
        switch (dtype) {
        case KVP_DTYPE_F32: case KVP_DTYPE_F16: case KVP_DTYPE_BF16:
        case KVP_DTYPE_Q4_0: case KVP_DTYPE_Q4_1: case KVP_DTYPE_Q8_0:
            return !scaled;
        case KVP_DTYPE_Q5_0: case KVP_DTYPE_Q5_1: case KVP_DTYPE_Q2_K: case KVP_DTYPE_Q3_K: case KVP_DTYPE_Q4_K:
        case KVP_DTYPE_Q5_K: case KVP_DTYPE_Q6_K: case KVP_DTYPE_IQ4_NL: case KVP_DTYPE_IQ4_XS: case KVP_DTYPE_MXFP4:
            return !scaled;
        case KVP_DTYPE_FP8_E4M3: case KVP_DTYPE_I8: case KVP_DTYPE_I4:
            return scaled != 0;
        default:
            return 0;
        }
    case KVP_USE_KV:
        return cu_kv_dtype_ok(dtype);
    case KVP_USE_TREE:
        return 1;
    default:
        return 0;
    }
}

static size_t round256(size_t n) { return (n + 255) & ~(size_t)255; }

/* Whether w's shape and scales are ones the kernels take; 0 or a code. */
static int weight_ok(const kvp_weight *w, kvp_err *err)
{
    const char *name = wname(w);
    int scaled = w->scales != NULL;
    if (!cu_supports(NULL, KVP_USE_MATMUL, w->dtype, scaled))
        return kvp_err_set(err, KVP_EUNSUPPORTED,
                           "%s: weight type %s%s is not supported by the CUDA backend (f32, f16, bf16, q4_0, q4_1, "
                           "q8_0, q5_0, q5_1, q4_k, q6_k, mxfp4, and fp8_e4m3, i8, i4 with scales)",
                           name, kvp_dtype_name((uint32_t)w->dtype), scaled ? " with scales" : "");
    if (w->zeros && w->dtype == KVP_DTYPE_FP8_E4M3)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: fp8_e4m3 with zero points is not supported", name);
    int64_t need = kvp_dtype_row_bytes((uint32_t)w->dtype, w->n_in);
    if (need < 0 || (uint64_t)need > w->row_bytes || !w->data)
        return kvp_err_set(err, KVP_EFORMAT, "%s: rows of %u %s elements do not fit %llu bytes", name, w->n_in,
                           kvp_dtype_name((uint32_t)w->dtype), (unsigned long long)w->row_bytes);
    /* the kernels index scale r * scale_stride + i / group: stride 0 (one
     * scale) needs group n_in, else stride n_in / group */
    if (scaled && (!w->group || w->n_in % w->group ||
                   (w->scale_stride ? w->scale_stride != w->n_in / w->group : w->group != w->n_in)))
        return kvp_err_set(err, KVP_EFORMAT, "%s: group %u and %u scales a row do not fit a row of %u", name,
                           w->group, w->scale_stride, w->n_in);
    return 0;
}

/* A via_f32 weight: rows dequantized on the host a few MiB at a time and
 * uploaded as an f32 matrix. */
static int prepare_as_f32(cu_impl *im, kvp_weight *w, kvp_err *err)
{
    const char *name = wname(w);
    size_t row = (size_t)w->n_in * sizeof(float), per = row >= ((size_t)4 << 20) ? 1 : ((size_t)4 << 20) / row;
    kvp_to_f32_fn to_f32 = kvp_dtype_get((uint32_t)w->dtype)->to_f32;
    cu_weight *cw = (cu_weight *)calloc(1, sizeof *cw);
    float *buf = (float *)malloc(per * row);
    uint8_t *mem = NULL;
    if (!cw || !buf) {
        free(cw);
        free(buf);
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of host memory", name);
    }
    cudaError_t e = cudaMalloc((void **)&mem, (size_t)w->n_out * row);
    for (uint32_t r0 = 0; e == cudaSuccess && r0 < w->n_out; r0 += (uint32_t)per) {
        uint32_t n = w->n_out - r0 < per ? w->n_out - r0 : (uint32_t)per;
        for (uint32_t r = 0; r < n; r++)
            to_f32((const uint8_t *)w->data + (uint64_t)(r0 + r) * w->row_bytes, buf + (size_t)r * w->n_in, w->n_in);
        e = cudaMemcpyAsync(mem + (size_t)r0 * row, buf, n * row, cudaMemcpyHostToDevice, im->st);
        if (e == cudaSuccess) /* buf is refilled next */
            e = cudaStreamSynchronize(im->st);
    }
    free(buf);
    if (e != cudaSuccess) {
        cudaFree(mem);
        free(cw);
        return cu_fail(err, e, "prepare_weight %s (%s as f32, %u x %u)", name, kvp_dtype_name((uint32_t)w->dtype),
                       w->n_out, w->n_in);
    }
    cw->mem = mem;
    cw->dtype = KVP_DTYPE_F32;
    cw->n_out = w->n_out;
    cw->v.data = mem;
    cw->v.row_bytes = row;
    cw->v.n_in = w->n_in;
    cw->f32 = w->n_out == 1 ? (const float *)mem : NULL;
    w->dev = cw;
    return 0;
}

static int cu_prepare_weight(kvp_backend *b, kvp_weight *w, kvp_err *err)
{
    cu_impl *im = impl_of(b);
    const char *name = wname(w);
    int rc = weight_ok(w, err);
    if (rc < 0)
        return rc;
    if ((rc = cu_enter(im, err, "prepare_weight")) < 0)
        return rc;
    if (via_f32(w->dtype))
        return prepare_as_f32(im, w, err);
    size_t data = (size_t)w->n_out * w->row_bytes;
    size_t n_sc = !w->scales ? 0 : w->scale_stride ? (size_t)w->n_out * w->scale_stride : 1;
    /* a 1-D float weight is also kept as f32 for the ops that take [n] f32 */
    int want_f32 = w->n_out == 1 && !w->scales && (w->dtype == KVP_DTYPE_F16 || w->dtype == KVP_DTYPE_BF16);
    size_t off_sc = round256(data), off_zp = off_sc + round256(n_sc * 4);
    size_t off_f = off_zp + round256(w->zeros ? n_sc * 4 : 0), total = off_f + (want_f32 ? (size_t)w->n_in * 4 : 0);
    cu_weight *cw = (cu_weight *)calloc(1, sizeof *cw);
    float *tmp = want_f32 ? (float *)malloc((size_t)w->n_in * sizeof(float)) : NULL;
    if (!cw || (want_f32 && !tmp)) {
        free(cw);
        free(tmp);
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of host memory", name);
    }
    /* on the ops' stream (a plain cudaMemcpy is on the legacy stream, which
     * a non-blocking stream does not wait for), then waited for */
    uint8_t *mem = NULL;
    cudaError_t e = cudaMalloc((void **)&mem, total);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(mem, w->data, data, cudaMemcpyHostToDevice, im->st);
    if (e == cudaSuccess && n_sc)
        e = cudaMemcpyAsync(mem + off_sc, w->scales, n_sc * 4, cudaMemcpyHostToDevice, im->st);
    if (e == cudaSuccess && n_sc && w->zeros)
        e = cudaMemcpyAsync(mem + off_zp, w->zeros, n_sc * 4, cudaMemcpyHostToDevice, im->st);
    if (e == cudaSuccess && want_f32) {
        kvp_dtype_get((uint32_t)w->dtype)->to_f32(w->data, tmp, w->n_in);
        e = cudaMemcpyAsync(mem + off_f, tmp, (size_t)w->n_in * 4, cudaMemcpyHostToDevice, im->st);
    }
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(im->st);
    free(tmp);
    if (e != cudaSuccess) {
        cudaFree(mem);
        free(cw);
        return cu_fail(err, e, "prepare_weight %s (%s, %u x %u): %zu bytes", name, kvp_dtype_name((uint32_t)w->dtype),
                       w->n_out, w->n_in, total);
    }
    cw->mem = mem;
    cw->dtype = w->dtype;
    cw->n_out = w->n_out;
    cw->v.data = mem;
    cw->v.row_bytes = w->row_bytes;
    cw->v.n_in = w->n_in;
    cw->v.sc = n_sc ? (const float *)(mem + off_sc) : NULL;
    cw->v.zp = n_sc && w->zeros ? (const float *)(mem + off_zp) : NULL;
    cw->v.group = w->scales ? w->group : 0;
    cw->v.scale_stride = w->scales ? w->scale_stride : 0;
    cw->f32 = w->n_out == 1 && w->dtype == KVP_DTYPE_F32 ? (const float *)mem
              : want_f32                                 ? (const float *)(mem + off_f)
                                                         : NULL;
    w->dev = cw;
    return 0;
}

static void cu_release_weight(kvp_backend *b, kvp_weight *w)
{
    cu_weight *cw = (cu_weight *)w->dev;
    if (!cw)
        return;
    cudaSetDevice(impl_of(b)->device);
    cudaStreamSynchronize(impl_of(b)->st);
    cudaFree(cw->mem);
    (void)cudaGetLastError();
    free(cw);
    w->dev = NULL;
}

/* The prepared weight of an op, or NULL with the error set. */
static const cu_weight *prepared(const kvp_weight *w, const char *op, kvp_err *err)
{
    if (!w || !w->dev) {
        kvp_err_set(err, KVP_EINVAL, "cuda %s: %s was not prepared (prepare_weight)", op, wname(w));
        return NULL;
    }
    return (const cu_weight *)w->dev;
}

/* A prepared 1-D weight of n f32 values, or NULL with the error set. */
static const float *prepared_f32(const kvp_weight *w, uint32_t n, const char *op, kvp_err *err)
{
    const cu_weight *cw = prepared(w, op, err);
    if (!cw)
        return NULL;
    if (!cw->f32 || w->n_in < n) {
        kvp_err_set(err, KVP_EUNSUPPORTED, "cuda %s: %s must be a 1-D f32, f16 or bf16 tensor of at least %u (it is %s, %u x %u)",
                    op, wname(w), n, kvp_dtype_name((uint32_t)w->dtype), w->n_out, w->n_in);
        return NULL;
    }
    return cw->f32;
}

/* ---- ops ---- */

static int cu_matmul_op(kvp_backend *b, const kvp_weight *w, const float *x, float *y, uint32_t n_tok, kvp_err *err)
{
    cu_impl *im = impl_of(b);
    const cu_weight *cw = prepared(w, "matmul", err);
    if (!cw)
        return err ? err->code : KVP_EINVAL;
    kvp_gpu_mm_shape s;
    int f32 = cw->dtype == KVP_DTYPE_F32; /* f32 weights stay on cu_gemm_k: unsplit, 32 a step */
    int rc = kvp_gpuplan_matmul(&s, cw->n_out, cw->v.n_in, n_tok, f32 ? 0 : im->fill,
                                f32 ? KVP_GPU_GEMM_BK : im->mma_kb, err);
    if (rc < 0 || n_tok == 0 || cw->n_out == 0)
        return rc;
    CU_CHECK(cu_matmul(im->st, cw->dtype, cw->v, cw->n_out, x, y, n_tok, s, im->sk, im->pipelined, im->mma), err,
             "matmul %s (%s, %u x %u, %u tokens)", wname(w), kvp_dtype_name((uint32_t)cw->dtype), cw->n_out, cw->v.n_in,
             n_tok);
    return 0;
}

static int cu_embed_op(kvp_backend *b, const kvp_weight *w, const int32_t *tokens, uint32_t n_tok, float *out,
                       kvp_err *err)
{
    cu_impl *im = impl_of(b);
    const cu_weight *cw = prepared(w, "embed", err);
    if (!cw)
        return err ? err->code : KVP_EINVAL;
    im->embed_name = w->name;
    CU_CHECK(cu_embed(im->st, cw->dtype, cw->v, cw->n_out, tokens, n_tok, out, im->faults_dev), err,
             "embed %s (%u tokens)", wname(w), n_tok);
    return 0;
}

static int cu_rmsnorm_op(kvp_backend *b, const float *x, const kvp_weight *w, float *y, uint32_t n_tok, uint32_t n,
                         float eps, kvp_err *err)
{
    const float *wf = prepared_f32(w, n, "rmsnorm", err);
    if (!wf)
        return err ? err->code : KVP_EINVAL;
    CU_CHECK(cu_rmsnorm(impl_of(b)->st, x, wf, y, n_tok, n, eps), err, "rmsnorm %s (%u x %u)", wname(w), n_tok, n);
    return 0;
}

static int cu_rope_op(kvp_backend *b, float *x, uint32_t n_tok, uint32_t n_head, uint32_t head_dim, uint32_t rot_dim,
                      const int32_t *pos, const kvp_weight *inv_freq, int kind, kvp_err *err)
{
    if (rot_dim > head_dim || rot_dim % 2)
        return kvp_err_set(err, KVP_EINVAL, "cuda rope: rot_dim %u of a head of %u", rot_dim, head_dim);
    const float *f = prepared_f32(inv_freq, rot_dim / 2, "rope", err);
    if (!f)
        return err ? err->code : KVP_EINVAL;
    CU_CHECK(cu_rope(impl_of(b)->st, x, n_tok, n_head, head_dim, rot_dim, pos, f, kind == KVP_ROPE_KIND_NEOX), err,
             "rope (%u tokens x %u heads)", n_tok, n_head);
    return 0;
}

static int cu_add_bias_op(kvp_backend *b, float *x, const kvp_weight *bias, uint32_t n_tok, uint32_t n, kvp_err *err)
{
    const float *f = prepared_f32(bias, n, "add_bias", err);
    if (!f)
        return err ? err->code : KVP_EINVAL;
    CU_CHECK(cu_add_bias(impl_of(b)->st, x, f, n_tok, n), err, "add_bias %s", wname(bias));
    return 0;
}

static int cu_add_op(kvp_backend *b, float *x, const float *y, size_t n, kvp_err *err)
{
    CU_CHECK(cu_add(impl_of(b)->st, x, y, n), err, "add (%zu floats)", n);
    return 0;
}

static int cu_silu_mul_op(kvp_backend *b, float *g, const float *u, size_t n, kvp_err *err)
{
    CU_CHECK(cu_silu_mul(impl_of(b)->st, g, u, n), err, "silu_mul (%zu floats)", n);
    return 0;
}

static int cu_gather_rows_op(kvp_backend *b, float *dst, const float *src, const uint32_t *rows, uint32_t n_rows,
                             uint32_t n, kvp_err *err)
{
    CU_CHECK(cu_gather_rows(impl_of(b)->st, dst, src, rows, n_rows, n), err, "gather_rows (%u rows of %u)", n_rows, n);
    return 0;
}

/* Each row's argmax on the device, n_rows ids copied back instead of the
 * rows themselves (a step of 64 greedy sequences: 256 bytes, not 12.6 MB). */
static int cu_argmax_rows_op(kvp_backend *b, const float *x, uint32_t n_rows, uint32_t n, uint32_t *ids,
                             kvp_err *err)
{
    cu_impl *im = impl_of(b);
    if (n_rows == 0)
        return 0;
    if (n_rows > im->ids_cap)
        return kvp_err_set(err, KVP_ELIMIT, "cuda argmax_rows: %u rows, scratch reserved for %u", n_rows,
                           im->ids_cap);
    int rc = cu_enter(im, err, "argmax_rows");
    if (rc < 0)
        return rc;
    CU_CHECK(cu_argmax_rows(im->st, x, n_rows, n, im->ids), err, "argmax_rows (%u rows of %u)", n_rows, n);
    return cu_to_host(b, ids, im->ids, (size_t)n_rows * sizeof *ids, err);
}

static int kv_ok(const kvp_kv_pool *kv, uint32_t layer, const char *op, kvp_err *err)
{
    if (!cu_kv_dtype_ok(kv->dtype))
        return kvp_err_set(err, KVP_EUNSUPPORTED, "cuda %s: a KV cache of %s is not supported", op,
                           kvp_dtype_name((uint32_t)kv->dtype));
    if (layer >= kv->n_layer)
        return kvp_err_set(err, KVP_EINVAL, "cuda %s: layer %u of a cache of %u", op, layer, kv->n_layer);
    return 0;
}

static int cu_kv_store_op(kvp_backend *b, const kvp_kv_pool *kv, uint32_t layer, const float *k, const float *v,
                          uint32_t n_tok, const uint32_t *slot, kvp_err *err)
{
    cu_impl *im = impl_of(b);
    int rc = kv_ok(kv, layer, "kv_store", err);
    if (rc < 0)
        return rc;
    if (kv->n_head_kv > 65535)
        return kvp_err_set(err, KVP_ELIMIT, "cuda kv_store: %u KV heads (the grid takes 65535)", kv->n_head_kv);
    CU_CHECK(cu_kv_store(im->st, *kv, layer, k, v, n_tok, slot, im->faults_dev), err, "kv_store (layer %u, %u tokens)",
             layer, n_tok);
    return 0;
}

static int cu_attention_op(kvp_backend *b, const kvp_attn_args *a, kvp_err *err)
{
    cu_impl *im = impl_of(b);
    const kvp_kv_pool *kv = a->kv;
    if (a->parent && (!a->kv_pos || !a->host_parent))
        return kvp_err_set(err, KVP_EINVAL, "cuda attention: a draft tree without its slots or host parents");
    int rc = kv_ok(kv, a->layer, "attention", err);
    if (rc < 0)
        return rc;
    uint32_t max_ctx = a->max_ctx;
    for (uint32_t t = 0; !max_ctx && a->host_pos && t < a->n_tok; t++) /* plan from the host positions */
        max_ctx = (uint32_t)a->host_pos[t] + 1 > max_ctx ? (uint32_t)a->host_pos[t] + 1 : max_ctx;
    if (!max_ctx && a->n_tok)
        return kvp_err_set(err, KVP_EINVAL, "cuda attention: neither max_ctx nor host positions given");
    kvp_gpu_attn_shape s;
    if ((rc = kvp_gpuplan_attn(&s, a->n_tok, a->n_head, kv->n_head_kv, kv->head_dim, kv->block_size, max_ctx,
                               im->pipelined, err)) < 0)
        return rc;
    if (s.part_floats > im->parts_floats)
        return kvp_err_set(err, KVP_ELIMIT,
                           "cuda attention: %u tokens over contexts of %u need %llu floats of split scratch; "
                           "reserve() sized %llu",
                           a->n_tok, max_ctx, (unsigned long long)s.part_floats,
                           (unsigned long long)im->parts_floats);
    CU_CHECK(cu_attention(im->st, *a, s, im->parts, im->faults_dev, im->pipelined), err,
             "attention (layer %u, %u tokens, %u heads, contexts up to %u)", a->layer, a->n_tok, a->n_head, max_ctx);
    return 0;
}

static int cu_kv_copy_block_op(kvp_backend *b, const kvp_kv_pool *kv, uint32_t dst, uint32_t src, kvp_err *err)
{
    cu_impl *im = impl_of(b);
    if (dst >= kv->n_blocks || src >= kv->n_blocks)
        return kvp_err_set(err, KVP_EINVAL, "cuda kv_copy_block: block %u to %u in a pool of %u", src, dst,
                           kv->n_blocks);
    uint8_t *base = (uint8_t *)kv->base;
    CU_CHECK(cudaMemcpyAsync(base + (uint64_t)dst * kv->block_bytes, base + (uint64_t)src * kv->block_bytes,
                             kv->block_bytes, cudaMemcpyDeviceToDevice, im->st),
             err, "kv_copy_block %u to %u", src, dst);
    return 0;
}

/* ---- tensor parallelism, through the host ---- */

static void *host_buf(cu_impl *im, size_t bytes)
{
    if (bytes > im->host_size) {
        free(im->host);
        im->host = malloc(bytes);
        im->host_size = im->host ? bytes : 0;
    }
    return im->host;
}

static int cu_all_reduce(kvp_backend *b, struct kvp_comm *comm, float *x, size_t n, kvp_err *err)
{
    cu_impl *im = impl_of(b);
    float *h = (float *)host_buf(im, n * sizeof(float));
    if (!h && n)
        return kvp_err_set(err, KVP_ENOMEM, "cuda all_reduce: out of host memory for %zu floats", n);
    int rc = cu_to_host(b, h, x, n * sizeof(float), err);
    if (rc < 0 || (rc = kvp_comm_allreduce_f32(comm, h, n, err)) < 0)
        return rc;
    return cu_from_host(b, x, h, n * sizeof(float), err);
}

static int cu_all_gather(kvp_backend *b, struct kvp_comm *comm, const float *send, float *recv, size_t n,
                         kvp_err *err)
{
    cu_impl *im = impl_of(b);
    size_t ranks = (size_t)kvp_comm_size(comm), bytes = n * sizeof(float);
    uint8_t *h = (uint8_t *)host_buf(im, bytes * (ranks + 1));
    if (!h && n)
        return kvp_err_set(err, KVP_ENOMEM, "cuda all_gather: out of host memory for %zu x %zu floats", ranks, n);
    int rc = cu_to_host(b, h, send, bytes, err);
    if (rc < 0 || (rc = kvp_comm_allgather(comm, h, h + bytes, bytes, err)) < 0)
        return rc;
    return cu_from_host(b, recv, h + bytes, bytes * ranks, err);
}

/* ---- create / destroy ---- */

static void cu_destroy(kvp_backend *b)
{
    cu_impl *im = impl_of(b);
    if (im) {
        cudaSetDevice(im->device);
        if (im->st)
            cudaStreamSynchronize(im->st);
        cudaFree(im->parts);
        cudaFree(im->ids);
        cudaFree(im->sk.ws);
        cudaFree(im->sk.cnt);
        if (im->faults)
            cudaFreeHost(im->faults);
        if (im->st)
            cudaStreamDestroy(im->st);
        (void)cudaGetLastError();
        free(im->host);
        free(im);
    }
    free(b);
}

static const kvp_backend_ops cu_ops = {
    .name = "cuda",
    .destroy = cu_destroy,
    .supports = cu_supports,
    .alloc = cu_alloc,
    .release = cu_release,
    .to_host = cu_to_host,
    .from_host = cu_from_host,
    .synchronize = cu_synchronize,
    .reserve = cu_reserve,
    .prepare_weight = cu_prepare_weight,
    .release_weight = cu_release_weight,
    .matmul = cu_matmul_op,
    .matmul_n = NULL, /* the engine calls matmul for each weight */
    .embed = cu_embed_op,
    .rmsnorm = cu_rmsnorm_op,
    .rope = cu_rope_op,
    .add_bias = cu_add_bias_op,
    .add = cu_add_op,
    .silu_mul = cu_silu_mul_op,
    .gather_rows = cu_gather_rows_op,
    .argmax_rows = cu_argmax_rows_op,
    .kv_store = cu_kv_store_op,
    .attention = cu_attention_op,
    .kv_copy_block = cu_kv_copy_block_op,
    .all_reduce = cu_all_reduce,
    .all_gather = cu_all_gather,
};

/* cu_ops without the device's argmax_rows (KVP_CUDA_ARGMAX=0): the engine
 * then copies the greedy rows back and picks on the host, for comparison. */
static kvp_backend_ops without_argmax(kvp_backend_ops o)
{
    o.argmax_rows = NULL;
    return o;
}
static const kvp_backend_ops cu_ops_host_argmax = without_argmax(cu_ops);

/* ---- KVP_CUDA_PROFILE=1: every op between two events (cuda_prof.cuh) ---- */

template <int K, auto F> struct prof_op;
template <int K, typename... A, int (*F)(kvp_backend *, A...)> struct prof_op<K, F> {
    static int call(kvp_backend *b, A... a)
    {
        cu_impl *im = impl_of(b);
        int slot = cu_prof_begin(im->prof, im->st, K);
        int rc = F(b, a...);
        cu_prof_end(im->prof, im->st, K, slot);
        return rc;
    }
};

/* An op after which the stream is idle: its events can be read. */
template <int K, auto F> struct prof_wait;
template <int K, typename... A, int (*F)(kvp_backend *, A...)> struct prof_wait<K, F> {
    static int call(kvp_backend *b, A... a)
    {
        int rc = prof_op<K, F>::call(b, a...);
        cu_prof_collect(impl_of(b)->prof);
        return rc;
    }
};

static int prof_matmul(kvp_backend *b, const kvp_weight *w, const float *x, float *y, uint32_t n_tok, kvp_err *err)
{
    cu_impl *im = impl_of(b);
    int kind = n_tok <= KVP_GPU_GEMV_MAX_TOK ? CU_P_GEMV : CU_P_GEMM;
    int slot = cu_prof_begin(im->prof, im->st, kind);
    int rc = cu_matmul_op(b, w, x, y, n_tok, err);
    cu_prof_end(im->prof, im->st, kind, slot);
    return rc;
}

static void prof_destroy(kvp_backend *b)
{
    cu_impl *im = impl_of(b);
    if (im && im->prof) {
        cudaStreamSynchronize(im->st);
        cu_prof_collect(im->prof);
        cu_prof_report(im->prof, stderr, im->dev_name);
        cu_prof_free(im->prof);
        im->prof = NULL;
    }
    cu_destroy(b);
}

/* o with each op through its timer */
static kvp_backend_ops profiled(const kvp_backend_ops *o)
{
    kvp_backend_ops p = *o;
    p.destroy = prof_destroy;
    p.to_host = prof_wait<CU_P_TO_HOST, cu_to_host>::call;
    p.from_host = prof_op<CU_P_FROM_HOST, cu_from_host>::call;
    p.synchronize = prof_wait<CU_P_SYNC, cu_synchronize>::call;
    p.matmul = prof_matmul;
    p.embed = prof_op<CU_P_EMBED, cu_embed_op>::call;
    p.rmsnorm = prof_op<CU_P_RMSNORM, cu_rmsnorm_op>::call;
    p.rope = prof_op<CU_P_ROPE, cu_rope_op>::call;
    p.add_bias = prof_op<CU_P_ADD_BIAS, cu_add_bias_op>::call;
    p.add = prof_op<CU_P_ADD, cu_add_op>::call;
    p.silu_mul = prof_op<CU_P_SILU_MUL, cu_silu_mul_op>::call;
    p.gather_rows = prof_op<CU_P_GATHER, cu_gather_rows_op>::call;
    if (o->argmax_rows)
        p.argmax_rows = prof_wait<CU_P_ARGMAX, cu_argmax_rows_op>::call;
    p.kv_store = prof_op<CU_P_KV_STORE, cu_kv_store_op>::call;
    p.attention = prof_op<CU_P_ATTENTION, cu_attention_op>::call;
    p.kv_copy_block = prof_op<CU_P_KV_COPY, cu_kv_copy_block_op>::call;
    return p;
}

/* A kernel switch from the environment: unset or empty is dflt, 0 and 1
 * are themselves, anything else an error naming it and its values
 * (`values`, e.g. "1 (the default) or 0 (the first kernels)"). */
static int env_switch(const char *name, int dflt, const char *values, kvp_err *err)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    if (!strcmp(v, "0") || !strcmp(v, "1"))
        return v[0] == '1';
    kvp_err_set(err, KVP_EINVAL, "cuda: %s=%s: %s", name, v, values);
    return -1;
}

extern "C" int kvp_backend_cuda_create(kvp_backend **out, int device, kvp_err *err)
{
    *out = NULL;
    /* the pipelined kernels, the tensor-core GEMM and greedy ids picked on
     * the device unless switched off (all checked on an H200, 2026-12-04;
     * kernels/README.md) */
    static const char first[] = "1 (the default) or 0 (the first kernels, for comparison)";
    int pipelined, mma, splitk, k64, argmax, prof;
    if ((pipelined = env_switch("KVP_CUDA_PIPELINE", 1, first, err)) < 0 ||
        (mma = env_switch("KVP_CUDA_MMA", 1, first, err)) < 0 ||
        (splitk = env_switch("KVP_CUDA_SPLITK", 1, "1 (the default) or 0 (every GEMM unsplit)", err)) < 0 ||
        (k64 = env_switch("KVP_CUDA_MMA_K64", 1, "1 (the default) or 0 (the GEMM's k in steps of 32)", err)) < 0 ||
        (argmax = env_switch("KVP_CUDA_ARGMAX", 1, "1 (the default) or 0 (greedy rows copied back, picked on the host)",
                             err)) < 0 ||
        (prof = env_switch("KVP_CUDA_PROFILE", 0, "0 (the default) or 1 (time every op)", err)) < 0)
        return KVP_EINVAL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return kvp_err_set(err, KVP_EUNSUPPORTED, "cuda: no CUDA driver/device: %s", cudaGetErrorString(e));
    }
    if (device < 0 || device >= n)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "cuda: no device %d (this machine has %d)", device, n);
    cudaDeviceProp prop;
    CU_CHECK(cudaSetDevice(device), err, "device %d", device);
    CU_CHECK(cudaGetDeviceProperties(&prop, device), err, "device %d", device);
    cudaFuncAttributes fa;
    e = cu_probe(&fa);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return kvp_err_set(err, KVP_EUNSUPPORTED,
                           "cuda: device %d (%s, sm_%d%d) has no kernels in this build (built for " KVP_CUDA_ARCHS
                           "; rebuild with NVCC_GENCODE for it): %s",
                           device, prop.name, prop.major, prop.minor, cudaGetErrorString(e));
    }
    kvp_backend *b = (kvp_backend *)calloc(1, sizeof *b);
    cu_impl *im = (cu_impl *)calloc(1, sizeof *im);
    if (!b || !im) {
        free(b);
        free(im);
        return kvp_err_set(err, KVP_ENOMEM, "cuda backend: out of memory");
    }
    b->ops = argmax ? &cu_ops : &cu_ops_host_argmax;
    b->impl = im;
    im->device = device;
    im->pipelined = pipelined, im->mma = mma;
    im->mma_kb = mma && k64 ? KVP_GPU_MMA_BK64 : KVP_GPU_GEMM_BK;
    snprintf(im->dev_name, sizeof im->dev_name, "%s", prop.name);
    e = cudaStreamCreateWithFlags(&im->st, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaHostAlloc((void **)&im->faults, sizeof *im->faults, cudaHostAllocMapped);
    if (e == cudaSuccess)
        e = cudaHostGetDevicePointer((void **)&im->faults_dev, im->faults, 0);
    /* split-K's workspace (8.6 MiB on an H200) and counters, zeroed once
     * on the stream the kernels run on (a non-blocking stream does not
     * wait for the legacy default stream's work) */
    im->fill = mma && splitk ? 2 * (uint32_t)prop.multiProcessorCount : 0;
    if (e == cudaSuccess && im->fill)
        e = cudaMalloc((void **)&im->sk.ws, kvp_gpuplan_splitk_floats(im->fill) * sizeof(float));
    if (e == cudaSuccess && im->fill)
        e = cudaMalloc((void **)&im->sk.cnt, kvp_gpuplan_splitk_tiles(im->fill) * sizeof(uint32_t));
    if (e == cudaSuccess && im->fill)
        e = cudaMemsetAsync(im->sk.cnt, 0, kvp_gpuplan_splitk_tiles(im->fill) * sizeof(uint32_t), im->st);
    if (e != cudaSuccess) {
        int rc = cu_fail(err, e, "device %d (%s): creating the stream and split-K's workspace", device, prop.name);
        cu_destroy(b);
        return rc;
    }
    memset(im->faults, 0, sizeof *im->faults);
    if (prof && (im->prof = cu_prof_new()) != NULL) {
        im->prof_ops = profiled(b->ops);
        b->ops = &im->prof_ops;
    }
    *out = b;
    return 0;
}

extern "C" const char *kvp_backend_cuda_device(const kvp_backend *b)
{
    return b && (b->ops->destroy == cu_destroy || b->ops->destroy == prof_destroy) ? impl_of(b)->dev_name : NULL;
}
