/* collmpi.c - the MPI backend of the collective benchmark: host buffers,
 * MPI's non-blocking collectives, each waited for with the job's deadline
 * (kvp_comm_wait), timed with the host's monotonic clock.
 *
 * half and bfloat16 travel as a 2-byte MPI datatype of our own with user
 * reduction operators (MPI has no 16-bit floats); float uses MPI_FLOAT and
 * MPI's built-in operators.  A world of one (started without mpirun, or a
 * build without MPI) runs every collective as the copy it is over one rank.
 */
#include "collbench.h"
#include "comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef KVP_HAVE_MPI
#include <mpi.h>
#endif

typedef struct mpi_state {
    kvp_comm *c;
    int rank, n;
#ifdef KVP_HAVE_MPI
    MPI_Comm mc;                 /* MPI_COMM_NULL in a world of one */
    MPI_Datatype t16[2];         /* half, bfloat16 */
    MPI_Op op16[2][KVP_CB_REDOP_COUNT]; /* user operators for t16 */
#endif
} mpi_state;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int host_alloc(void *st, size_t bytes, void **buf, kvp_err *err)
{
    (void)st;
    /* 64-byte aligned, like a device allocation; at least one line */
    *buf = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    if (!*buf)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory for a %zu-byte buffer", bytes);
    return 0;
}

static void host_release(void *st, void *buf)
{
    (void)st;
    free(buf);
}

static int host_copy(void *st, void *dst, const void *src, size_t bytes, kvp_err *err)
{
    (void)st, (void)err;
    memcpy(dst, src, bytes);
    return 0;
}

/* One collective over one rank: out of place the output is the input. */
static void run_alone(kvp_cb_call *c)
{
    size_t es = kvp_cb_dtype_size(c->dtype);
    c->out = c->recv;
    if (!c->in_place)
        memcpy(c->recv, c->send, c->send_count * es);
}

#ifdef KVP_HAVE_MPI

/* MPI's user functions, one per dtype and operator (a user function is
 * told the datatype, not which of our two 2-byte types it is). */
#define USER_OP(name, dtype, redop)                                                                \
    static void name(void *in, void *inout, int *len, MPI_Datatype *t)                             \
    {                                                                                              \
        (void)t;                                                                                   \
        kvp_cb_reduce16(dtype, redop, in, inout, (size_t)*len);                                    \
    }
USER_OP(sum_half, KVP_CB_DTYPE_HALF, KVP_CB_REDOP_SUM)
USER_OP(prod_half, KVP_CB_DTYPE_HALF, KVP_CB_REDOP_PROD)
USER_OP(max_half, KVP_CB_DTYPE_HALF, KVP_CB_REDOP_MAX)
USER_OP(min_half, KVP_CB_DTYPE_HALF, KVP_CB_REDOP_MIN)
USER_OP(sum_bf16, KVP_CB_DTYPE_BFLOAT16, KVP_CB_REDOP_SUM)
USER_OP(prod_bf16, KVP_CB_DTYPE_BFLOAT16, KVP_CB_REDOP_PROD)
USER_OP(max_bf16, KVP_CB_DTYPE_BFLOAT16, KVP_CB_REDOP_MAX)
USER_OP(min_bf16, KVP_CB_DTYPE_BFLOAT16, KVP_CB_REDOP_MIN)

static MPI_Datatype mpi_type(const mpi_state *s, int dtype)
{
    return dtype == KVP_CB_DTYPE_FLOAT ? MPI_FLOAT : s->t16[dtype == KVP_CB_DTYPE_HALF ? 0 : 1];
}

static MPI_Op mpi_op(const mpi_state *s, int dtype, int redop)
{
    if (dtype != KVP_CB_DTYPE_FLOAT)
        return s->op16[dtype == KVP_CB_DTYPE_HALF ? 0 : 1][redop];
    switch (redop) {
    case KVP_CB_REDOP_SUM: return MPI_SUM;
    case KVP_CB_REDOP_PROD: return MPI_PROD;
    case KVP_CB_REDOP_MAX: return MPI_MAX;
    default: return MPI_MIN;
    }
}

/* Issue call c once (non-blocking) into req[0..*nreq); k is its MPI count
 * (kvp_cb_mpi_count: the row's count, or one rank's block). */
static int issue(mpi_state *s, kvp_cb_call *c, int k, MPI_Request *req, int *nreq)
{
    MPI_Datatype t = mpi_type(s, c->dtype);
    MPI_Op o = mpi_op(s, c->dtype, c->redop);
    const void *in = c->in_place ? MPI_IN_PLACE : c->send;
    size_t es = kvp_cb_dtype_size(c->dtype);
    c->out = c->recv;
    *nreq = 1;
    switch (c->op) {
    case KVP_CB_OP_ALL_REDUCE: return MPI_Iallreduce(in, c->recv, k, t, o, s->mc, req);
    case KVP_CB_OP_ALL_GATHER: return MPI_Iallgather(in, k, t, c->recv, k, t, s->mc, req);
    case KVP_CB_OP_REDUCE_SCATTER: /* in place, MPI leaves this rank's block first */
        return MPI_Ireduce_scatter_block(in, c->recv, k, t, o, s->mc, req);
    case KVP_CB_OP_BROADCAST:
        /* MPI_Bcast has one buffer: out of place, the root copies first */
        if (!c->in_place && s->rank == c->root)
            memcpy(c->recv, c->send, c->count * es);
        return MPI_Ibcast(c->recv, k, t, c->root, s->mc, req);
    case KVP_CB_OP_REDUCE:
        /* MPI_IN_PLACE is the root's alone; the others send their buffer */
        return MPI_Ireduce(c->in_place && s->rank != c->root ? c->send : in, c->recv, k, t, o, c->root,
                           s->mc, req);
    case KVP_CB_OP_ALLTOALL: return MPI_Ialltoall(in, k, t, c->recv, k, t, s->mc, req);
    default: { /* sendrecv: the ring */
        int next = (s->rank + 1) % s->n, prev = (s->rank + s->n - 1) % s->n, rc;
        *nreq = 2;
        if ((rc = MPI_Irecv(c->recv, k, t, prev, 77, s->mc, &req[0])) != MPI_SUCCESS)
            return rc;
        return MPI_Isend(c->send, k, t, next, 77, s->mc, &req[1]);
    }
    }
}

static int mpi_time(void *st, kvp_cb_call *c, int iters, double *seconds, kvp_err *err)
{
    mpi_state *s = st;
    char what[96];
    snprintf(what, sizeof what, "%s of %zu %s", kvp_cb_op_name(c->op), c->count, kvp_cb_dtype_name(c->dtype));
    int mk, rc = kvp_cb_mpi_count(c->op, c->dtype, s->n, c->count, &mk, err);
    if (rc < 0) /* an int count cast from it would be a silently smaller call */
        return rc;
    double t0 = now_s();
    for (int it = 0; it < iters; it++) {
        if (s->mc == MPI_COMM_NULL) {
            run_alone(c);
            continue;
        }
        MPI_Request req[2];
        int nreq = 0;
        rc = issue(s, c, mk, req, &nreq);
        if (rc != MPI_SUCCESS)
            return kvp_comm_mpi_error(err, rc, what);
        for (int k = 0; k < nreq; k++)
            if ((rc = kvp_comm_wait(s->c, &req[k], what, err)) < 0)
                return rc;
    }
    *seconds = now_s() - t0;
    return 0;
}

static void mpi_close(void *st)
{
    mpi_state *s = st;
    int done = 0;
    MPI_Finalized(&done);
    if (s->mc != MPI_COMM_NULL && !done) {
        for (int k = 0; k < 2; k++)
            MPI_Type_free(&s->t16[k]);
        for (int k = 0; k < 2; k++)
            for (int r = 0; r < KVP_CB_REDOP_COUNT; r++)
                MPI_Op_free(&s->op16[k][r]);
    }
    free(s);
}

static int setup_types(mpi_state *s, kvp_err *err)
{
    static MPI_User_function *const fn[2][KVP_CB_REDOP_COUNT] = {
        {sum_half, prod_half, max_half, min_half},
        {sum_bf16, prod_bf16, max_bf16, min_bf16},
    };
    int rc;
    for (int k = 0; k < 2; k++) {
        if ((rc = MPI_Type_contiguous(2, MPI_BYTE, &s->t16[k])) != MPI_SUCCESS ||
            (rc = MPI_Type_commit(&s->t16[k])) != MPI_SUCCESS)
            return kvp_comm_mpi_error(err, rc, "MPI_Type_contiguous");
    }
    for (int k = 0; k < 2; k++)
        for (int r = 0; r < KVP_CB_REDOP_COUNT; r++)
            if ((rc = MPI_Op_create(fn[k][r], 1, &s->op16[k][r])) != MPI_SUCCESS)
                return kvp_comm_mpi_error(err, rc, "MPI_Op_create");
    return 0;
}

int kvp_cb_sum_doubles(kvp_comm *c, double *v, int n, kvp_err *err)
{
    MPI_Comm *mc = kvp_comm_handle(c);
    if (!mc || kvp_comm_size(c) == 1)
        return 0;
    MPI_Request r;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_SUM, *mc, &r);
    if (rc != MPI_SUCCESS)
        return kvp_comm_mpi_error(err, rc, "summing results over ranks");
    return kvp_comm_wait(c, &r, "summing results over ranks", err);
}

#else /* no MPI: a world of one */

static int mpi_time(void *st, kvp_cb_call *c, int iters, double *seconds, kvp_err *err)
{
    (void)st, (void)err;
    double t0 = now_s();
    for (int it = 0; it < iters; it++)
        run_alone(c);
    *seconds = now_s() - t0;
    return 0;
}

static void mpi_close(void *st) { free(st); }

int kvp_cb_sum_doubles(kvp_comm *c, double *v, int n, kvp_err *err)
{
    (void)c, (void)v, (void)n, (void)err;
    return 0;
}

#endif

int kvp_cb_mpi_open(kvp_comm *c, kvp_cb_backend *b, kvp_err *err)
{
    mpi_state *s = calloc(1, sizeof *s);
    if (!s)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    s->c = c;
    s->rank = kvp_comm_rank(c);
    s->n = kvp_comm_size(c);
#ifdef KVP_HAVE_MPI
    MPI_Comm *mc = kvp_comm_handle(c);
    s->mc = mc ? *mc : MPI_COMM_NULL;
    int rc;
    if (s->mc != MPI_COMM_NULL && (rc = setup_types(s, err)) < 0) {
        free(s);
        return rc;
    }
#endif
    *b = (kvp_cb_backend){.name = "mpi", .state = s, .alloc = host_alloc, .release = host_release,
                          .put = host_copy, .get = host_copy, .time = mpi_time, .close = mpi_close,
                          .max_count = kvp_cb_backend_max_count("mpi")};
    return 0;
}
