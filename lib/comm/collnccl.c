/* collnccl.c - the NCCL backend of the collective benchmark: one GPU a rank
 * (the rank's index among the ranks of its host, modulo the host's GPUs),
 * the ncclUniqueId broadcast over MPI, device buffers, CUDA events for
 * timing, and the job's deadline on every wait (a rank that died leaves
 * NCCL spinning forever: we poll the event and abort the job instead).
 *
 * Built when the Makefile finds nccl.h and libnccl.so under CUDA_HOME
 * (KVP_HAVE_NCCL) and MPI; only tpbench links it.  The CUDA runtime's C API
 * is called from C: no nvcc.  Without a GPU, opening fails with "no CUDA
 * device" and says what CUDA answered.
 */
#include "collbench.h"
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(KVP_HAVE_NCCL) && defined(KVP_HAVE_MPI)
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <time.h>

typedef struct nccl_state {
    kvp_comm *c;
    int rank, n, dev;
    ncclComm_t nc;
    cudaStream_t stream;
    cudaEvent_t start, stop;
} nccl_state;

static int cuda_fail(kvp_err *err, cudaError_t e, const char *what)
{
    return kvp_err_set(err, KVP_EIO, "%s: %s", what, cudaGetErrorString(e));
}

static int nccl_fail(kvp_err *err, ncclResult_t r, const char *what)
{
    return kvp_err_set(err, KVP_EIO, "%s: %s", what, ncclGetErrorString(r));
}

static int dev_alloc(void *st, size_t bytes, void **buf, kvp_err *err)
{
    (void)st;
    cudaError_t e = cudaMalloc(buf, bytes ? bytes : 1);
    return e == cudaSuccess ? 0 : cuda_fail(err, e, "cudaMalloc");
}

static void dev_release(void *st, void *buf)
{
    (void)st;
    cudaFree(buf);
}

/* Copies go on the collectives' stream and are waited for: a plain
 * cudaMemcpy runs on the legacy stream, which a non-blocking stream does not
 * wait for, and may return before a pageable upload has landed. */
static int dev_copy(nccl_state *s, void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, kvp_err *err)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, s->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(s->stream);
    return e == cudaSuccess ? 0 : cuda_fail(err, e, kind == cudaMemcpyHostToDevice ? "copy to the device"
                                                                                   : "copy from the device");
}

static int dev_put(void *st, void *dst, const void *host, size_t bytes, kvp_err *err)
{
    return dev_copy(st, dst, host, bytes, cudaMemcpyHostToDevice, err);
}

static int dev_get(void *st, void *host, const void *src, size_t bytes, kvp_err *err)
{
    return dev_copy(st, host, src, bytes, cudaMemcpyDeviceToHost, err);
}

static ncclDataType_t nccl_type(int dtype)
{
    return dtype == KVP_CB_DTYPE_FLOAT ? ncclFloat32 : dtype == KVP_CB_DTYPE_HALF ? ncclFloat16 : ncclBfloat16;
}

static ncclRedOp_t nccl_op(int redop)
{
    static const ncclRedOp_t ops[KVP_CB_REDOP_COUNT] = {ncclSum, ncclProd, ncclMax, ncclMin};
    return ops[redop];
}

/* Enqueue call c once on the stream.  In place follows NCCL's convention:
 * all_gather's input is this rank's block of the output, reduce_scatter's
 * output is this rank's block of the input. */
static ncclResult_t issue(nccl_state *s, kvp_cb_call *c)
{
    ncclDataType_t t = nccl_type(c->dtype);
    ncclRedOp_t o = nccl_op(c->redop);
    size_t es = kvp_cb_dtype_size(c->dtype), per = c->count / (size_t)s->n;
    char *send = c->send, *recv = c->recv;
    c->out = recv;
    switch (c->op) {
    case KVP_CB_OP_ALL_REDUCE: return ncclAllReduce(send, recv, c->count, t, o, s->nc, s->stream);
    case KVP_CB_OP_ALL_GATHER:
        if (c->in_place)
            send = recv + (size_t)s->rank * per * es;
        return ncclAllGather(send, recv, per, t, s->nc, s->stream);
    case KVP_CB_OP_REDUCE_SCATTER:
        if (c->in_place)
            c->out = recv = send + (size_t)s->rank * per * es;
        return ncclReduceScatter(send, recv, per, t, o, s->nc, s->stream);
    case KVP_CB_OP_BROADCAST: return ncclBroadcast(send, recv, c->count, t, c->root, s->nc, s->stream);
    case KVP_CB_OP_REDUCE: return ncclReduce(send, recv, c->count, t, o, c->root, s->nc, s->stream);
    case KVP_CB_OP_ALLTOALL: {
        ncclResult_t r = ncclGroupStart();
        for (int p = 0; r == ncclSuccess && p < s->n; p++) {
            r = ncclSend(send + (size_t)p * per * es, per, t, p, s->nc, s->stream);
            if (r == ncclSuccess)
                r = ncclRecv(recv + (size_t)p * per * es, per, t, p, s->nc, s->stream);
        }
        ncclResult_t e = ncclGroupEnd();
        return r != ncclSuccess ? r : e;
    }
    default: { /* sendrecv: the ring */
        int next = (s->rank + 1) % s->n, prev = (s->rank + s->n - 1) % s->n;
        ncclResult_t r = ncclGroupStart();
        if (r == ncclSuccess)
            r = ncclSend(send, c->count, t, next, s->nc, s->stream);
        if (r == ncclSuccess)
            r = ncclRecv(recv, c->count, t, prev, s->nc, s->stream);
        ncclResult_t e = ncclGroupEnd();
        return r != ncclSuccess ? r : e;
    }
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Wait for the stop event with the job's deadline; on timeout abort NCCL
 * and the job, as kvp_comm_wait does for MPI. */
static int wait_event(nccl_state *s, const char *what, kvp_err *err)
{
    double deadline = now_s() + kvp_comm_timeout();
    for (;;) {
        cudaError_t e = cudaEventQuery(s->stop);
        if (e == cudaSuccess)
            return 0;
        if (e != cudaErrorNotReady)
            return cuda_fail(err, e, what);
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(s->nc, &async);
        if (async != ncclSuccess)
            return nccl_fail(err, async, what);
        if (now_s() > deadline) {
            fprintf(stderr, "%s: rank %d: %s waited %g s for its peers (a rank died or hangs; --timeout); "
                    "aborting the job\n", kvp_cli_prog(), s->rank, what, kvp_comm_timeout());
            ncclCommAbort(s->nc);
            kvp_comm_abort(s->c, 1);
        }
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
}

static int nccl_time(void *st, kvp_cb_call *c, int iters, double *seconds, kvp_err *err)
{
    nccl_state *s = st;
    char what[96];
    snprintf(what, sizeof what, "%s of %zu %s", kvp_cb_op_name(c->op), c->count, kvp_cb_dtype_name(c->dtype));
    cudaError_t e = cudaEventRecord(s->start, s->stream);
    for (int it = 0; e == cudaSuccess && it < iters; it++) {
        ncclResult_t r = issue(s, c);
        if (r != ncclSuccess)
            return nccl_fail(err, r, what);
    }
    if (e == cudaSuccess)
        e = cudaEventRecord(s->stop, s->stream);
    if (e != cudaSuccess)
        return cuda_fail(err, e, "cudaEventRecord");
    int rc = wait_event(s, what, err);
    if (rc < 0)
        return rc;
    float ms = 0;
    if ((e = cudaEventElapsedTime(&ms, s->start, s->stop)) != cudaSuccess)
        return cuda_fail(err, e, "cudaEventElapsedTime");
    *seconds = ms * 1e-3;
    return 0;
}

static void nccl_close(void *st)
{
    nccl_state *s = st;
    if (s->nc)
        ncclCommDestroy(s->nc);
    if (s->start)
        cudaEventDestroy(s->start);
    if (s->stop)
        cudaEventDestroy(s->stop);
    if (s->stream)
        cudaStreamDestroy(s->stream);
    free(s);
}

/* This rank's index among the ranks on its host: its GPU. */
static int local_rank(kvp_comm *c)
{
    MPI_Comm *mc = kvp_comm_handle(c), node;
    int r = 0;
    if (!mc || MPI_Comm_split_type(*mc, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS)
        return 0;
    MPI_Comm_rank(node, &r);
    MPI_Comm_free(&node);
    return r;
}

static int open_device(nccl_state *s, kvp_err *err)
{
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "no CUDA device (cudaGetDeviceCount: %s): the NCCL backend "
                           "needs one GPU a rank; --backend mpi runs on CPUs",
                           e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    s->dev = local_rank(s->c) % ndev;
    if ((e = cudaSetDevice(s->dev)) != cudaSuccess)
        return cuda_fail(err, e, "cudaSetDevice");
    if ((e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaEventCreate(&s->start)) != cudaSuccess || (e = cudaEventCreate(&s->stop)) != cudaSuccess)
        return cuda_fail(err, e, "creating a stream and events");
    return 0;
}

int kvp_cb_nccl_open(kvp_comm *c, kvp_cb_backend *b, kvp_err *err)
{
    nccl_state *s = calloc(1, sizeof *s);
    if (!s)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    s->c = c;
    s->rank = kvp_comm_rank(c);
    s->n = kvp_comm_size(c);
    /* The ranks agree whether every GPU opened before any waits on the id
     * (a rank that failed would never join ncclCommInitRank). */
    int rc = open_device(s, err);
    double bad = rc < 0;
    kvp_err aerr = {0};
    int arc = kvp_cb_sum_doubles(c, &bad, 1, &aerr);
    if (rc == 0 && arc < 0) {
        *err = aerr;
        rc = arc;
    }
    if (rc == 0 && bad > 0)
        rc = kvp_err_set(err, KVP_EUNSUPPORTED, "%.0f of %d ranks could not open a GPU", bad, s->n);
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclResult_t r = ncclSuccess;
    if (s->rank == 0 && rc == 0 && (r = ncclGetUniqueId(&id)) != ncclSuccess)
        rc = nccl_fail(err, r, "ncclGetUniqueId");
    if (rc == 0)
        rc = kvp_comm_bcast(c, &id, sizeof id, 0, err);
    if (rc == 0 && (r = ncclCommInitRank(&s->nc, s->n, id, s->rank)) != ncclSuccess)
        rc = nccl_fail(err, r, "ncclCommInitRank");
    if (rc < 0) {
        nccl_close(s);
        return rc;
    }
    /* sending and receiving one buffer at once would race: no in-place alltoall */
    *b = (kvp_cb_backend){.name = "nccl", .state = s, .alloc = dev_alloc, .release = dev_release, .put = dev_put,
                          .get = dev_get, .time = nccl_time, .close = nccl_close,
                          .no_in_place = 1u << KVP_CB_OP_ALLTOALL, .max_count = kvp_cb_backend_max_count("nccl")};
    return 0;
}

#else

int kvp_cb_nccl_open(kvp_comm *c, kvp_cb_backend *b, kvp_err *err)
{
    (void)c, (void)b;
    return kvp_err_set(err, KVP_EUNSUPPORTED,
                       "this tpbench was built without NCCL (it needs nccl.h and libnccl.so under CUDA_HOME, "
                       "and MPI); --backend mpi runs on CPUs");
}

#endif
