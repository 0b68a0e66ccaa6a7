/* collbench.h - tpbench's collective benchmark, the nccl-tests way: a sweep
 * of message sizes, each timed out of place and in place, its bandwidth
 * turned into nccl-tests' algbw and busbw, and its result checked element by
 * element against values every rank can compute alone.
 *
 * Sizes and counts mean what they mean in nccl-tests, so the columns compare
 * directly: `bytes` is the larger of one rank's input and output (all_gather:
 * the gathered output; reduce_scatter: the whole input; alltoall: one rank's
 * whole send buffer), `count` = bytes / element size.
 *
 * The backends (MPI on host memory, NCCL on a GPU) sit behind one table of
 * operations (kvp_cb_backend); everything else here is backend-blind.
 */
#ifndef KVP_COLLBENCH_H
#define KVP_COLLBENCH_H

#include "comm.h"
#include "error.h"

#include <stddef.h>
#include <stdint.h>

enum kvp_cb_op {
    KVP_CB_OP_ALL_REDUCE,
    KVP_CB_OP_ALL_GATHER,
    KVP_CB_OP_REDUCE_SCATTER,
    KVP_CB_OP_BROADCAST,
    KVP_CB_OP_REDUCE,
    KVP_CB_OP_ALLTOALL,
    KVP_CB_OP_SENDRECV, /* a ring: rank r sends to r+1 and receives from r-1 */
    KVP_CB_OP_COUNT
};

enum kvp_cb_dtype { KVP_CB_DTYPE_FLOAT, KVP_CB_DTYPE_HALF, KVP_CB_DTYPE_BFLOAT16, KVP_CB_DTYPE_COUNT };

enum kvp_cb_redop { KVP_CB_REDOP_SUM, KVP_CB_REDOP_PROD, KVP_CB_REDOP_MAX, KVP_CB_REDOP_MIN, KVP_CB_REDOP_COUNT };

/* Names as nccl-tests prints them ("all_reduce", "float", "sum"); parse
 * returns the enum value or -1. */
const char *kvp_cb_op_name(int op);
const char *kvp_cb_dtype_name(int dtype);
const char *kvp_cb_redop_name(int redop);
int kvp_cb_op_parse(const char *s);
int kvp_cb_dtype_parse(const char *s); /* also "f32", "fp16", "f16", "bf16" */
int kvp_cb_redop_parse(const char *s);
size_t kvp_cb_dtype_size(int dtype);

int kvp_cb_op_reduces(int op);  /* takes a reduction operator */
int kvp_cb_op_rooted(int op);   /* broadcast, reduce: takes a root */
int kvp_cb_op_in_place(int op); /* has an in-place form (all but sendrecv) */

/* busbw / algbw for op over n ranks (nccl-tests, README "busbw"):
 * all_reduce 2(n-1)/n; all_gather, reduce_scatter, alltoall (n-1)/n;
 * broadcast, reduce, sendrecv 1. */
double kvp_cb_busbw_factor(int op, int n);

/* Elements per rank: what one rank sends and receives for a row of `count`
 * (count already a multiple of kvp_cb_count_unit). */
void kvp_cb_counts(int op, int n, size_t count, size_t *send, size_t *recv);
/* count must be a multiple of this (n for the ops that cut the buffer into
 * one piece per rank, else 1). */
size_t kvp_cb_count_unit(int op, int n);
/* The element count MPI is given for a row of `count` over n ranks: the
 * row's count, or one rank's block (count / n) for the ops that cut the
 * buffer (all_gather, reduce_scatter, alltoall).  MPI's counts are int, and
 * one call, timed as one, cannot be split: 0 with *mpi_count set, or
 * KVP_ELIMIT naming the collective, its count and the limit.  (NCCL's
 * counts are size_t.) */
int kvp_cb_mpi_count(int op, int dtype, int n, size_t count, int *mpi_count, kvp_err *err);

/* ---- check values ---- */

/* The value rank r puts at element i of its input for a collective reducing
 * with redop (or moving data: redop -1).  Exactly representable in every
 * dtype, so only sums in half and bfloat16 ever round (multiples of 1/8 in
 * [-3.75, 3.75]; for prod, +-2^k with k in {-1, 0, 1}, cycling over ranks so
 * a product over any number of ranks stays in range). */
double kvp_cb_value(int redop, int rank, size_t i);
/* The exact result of reducing element i over ranks 0..n-1, in double. */
double kvp_cb_reduced(int redop, int n, size_t i);
/* Largest allowed |got - exact| for element i: 0 except for sums in half
 * and bfloat16, where n additions round each by at most one unit of the
 * dtype's precision: n * u * sum |x_r| (u = 2^-11 half, 2^-8 bfloat16). */
double kvp_cb_tolerance(int dtype, int redop, int n, size_t i);

/* x[n] as doubles from the dtype's storage, and back (round to nearest even). */
double kvp_cb_load(int dtype, const void *buf, size_t i);
void kvp_cb_store(int dtype, void *buf, size_t i, double v);

/* inout[k] = inout[k] OP in[k] for k < n, in a 16-bit dtype, correctly
 * rounded: the f32 result of one operation on two half or bfloat16 values
 * rounds again without a double-rounding error (f32 has more than 2p+1
 * bits, Figueroa 1995).  NaN in either gives NaN.  MPI's user operations
 * for half and bfloat16 call this. */
void kvp_cb_reduce16(int dtype, int redop, const void *in, void *inout, size_t n);

/* ---- the benchmark ---- */

/* One collective call: what a backend runs. */
typedef struct kvp_cb_call {
    int op, dtype, redop, root;
    size_t count;          /* the row's count (see above) */
    size_t send_count, recv_count; /* elements per rank (kvp_cb_counts) */
    int in_place;
    void *send, *recv;     /* backend memory; in place: send == recv == the one buffer */
    void *out;             /* set by the backend's run: where the output is (in place it
                            * depends on the backend: MPI's reduce_scatter leaves it first,
                            * NCCL's at rank x recv_count) */
} kvp_cb_call;

/* A backend.  Memory is the backend's (host for MPI, device for NCCL);
 * put/get copy between it and host memory. */
typedef struct kvp_cb_backend {
    const char *name;
    void *state;
    int (*alloc)(void *state, size_t bytes, void **buf, kvp_err *err);
    void (*release)(void *state, void *buf);
    int (*put)(void *state, void *dst, const void *host, size_t bytes, kvp_err *err);
    int (*get)(void *state, void *host, const void *src, size_t bytes, kvp_err *err);
    /* Run the call iters times back to back and wait for the last: *seconds
     * is the wall time this rank saw (host clock for MPI, CUDA events for NCCL). */
    int (*time)(void *state, kvp_cb_call *call, int iters, double *seconds, kvp_err *err);
    void (*close)(void *state);
    unsigned no_in_place; /* bit op: ops this backend cannot run in place (shown N/A) */
    uint64_t max_count;   /* elements one call may take: INT_MAX for MPI, KVP_CB_NCCL_MAX_COUNT for NCCL */
} kvp_cb_backend;

/* NCCL's counts are size_t: no limit of its own short of the GPU's memory,
 * which this (2^40 elements, 4 TiB of floats) is far past. */
#define KVP_CB_NCCL_MAX_COUNT ((uint64_t)1 << 40)
/* The elements one call of backend `name` ("mpi", "nccl") may take, known
 * before it opens (tpbench checks its sizes first): MPI's counts are int. */
uint64_t kvp_cb_backend_max_count(const char *name);

/* Open a backend over the ranks of c: "mpi" (also a world of one without
 * MPI) or "nccl" (one GPU a rank; fails with "no CUDA device" without one,
 * or "built without NCCL").  0 or a code.  In collbackend.c, apart, because
 * it pulls in NCCL: only a program linked with NCCL's libraries (tpbench)
 * may call it; the rest of this header links without them. */
int kvp_cb_backend_open(const char *name, kvp_comm *c, kvp_cb_backend *b, kvp_err *err);
void kvp_cb_backend_close(kvp_cb_backend *b);
int kvp_cb_mpi_open(kvp_comm *c, kvp_cb_backend *b, kvp_err *err);
int kvp_cb_nccl_open(kvp_comm *c, kvp_cb_backend *b, kvp_err *err);

/* Sum v[n] over the ranks of c, in place, with the job's deadline (counts of
 * wrong elements, times).  0 or a code. */
int kvp_cb_sum_doubles(kvp_comm *c, double *v, int n, kvp_err *err);

typedef struct kvp_cb_opts {
    int op, dtype, redop, root;
    uint64_t min_bytes, max_bytes;
    uint64_t step_bytes;   /* > 0: add this (-i); else multiply by step_factor (-f) */
    double step_factor;
    int iters, warmup;
    int check;             /* count wrong elements (-c 1, the default) */
    int in_place_only;     /* -z */
    uint64_t max_count;    /* elements a size may hold: 0 is MPI's INT_MAX (its counts are int); the
                            * backend's own in kvp_cb_run (kvp_cb_backend.max_count) */
} kvp_cb_opts;

void kvp_cb_opts_init(kvp_cb_opts *o); /* all_reduce float sum root 0, 8 B..8 MiB x2, 20 iters, 5 warmup, check */

/* One row of the table.  Index 0 out of place, 1 in place; time < 0: not run. */
typedef struct kvp_cb_row {
    uint64_t bytes;
    size_t count;
    double time_us[2];     /* mean over iterations, averaged over ranks (as nccl-tests) */
    double algbw[2], busbw[2]; /* GB/s (1e9 bytes) */
    int64_t wrong[2];      /* summed over ranks; -1 when not checked */
} kvp_cb_row;

/* Run the sweep; for each size, every rank calls row(arg, &r) (rank 0
 * prints).  Returns 0 or a code (a wrong element is not an error: the
 * caller sums row.wrong). */
int kvp_cb_run(kvp_comm *c, kvp_cb_backend *b, const kvp_cb_opts *o,
               void (*row)(void *arg, const kvp_cb_row *r), void *arg, kvp_err *err);

/* The list of sizes a sweep visits: fills sizes[max], returns how many
 * (each rounded down to the op's count unit x element size, at least one
 * unit; repeats dropped; at least one), or a negative code: a step that
 * never grows (KVP_EINVAL), no size between min and max (KVP_EINVAL), a
 * size over INT_MAX elements or more than max sizes (KVP_ELIMIT). */
int kvp_cb_sizes(const kvp_cb_opts *o, int n, uint64_t *sizes, int max, kvp_err *err);

/* The most rows a sweep (kvp_cb_run) takes. */
#define KVP_CB_MAX_SIZES 4096
/* What kvp_cb_run would say of o's sizes over n ranks, before it runs
 * anything: the number of rows, or kvp_cb_sizes' code (or KVP_ENOMEM). */
int kvp_cb_sizes_check(const kvp_cb_opts *o, int n, kvp_err *err);

/* Model-shaped traffic (tpbench --model): a step is a list of phases, each
 * one collective repeated; the step runs warmup times, then iters times.
 * seconds: the mean of one call of the phase, averaged over ranks. */
typedef struct kvp_cb_phase {
    int op;          /* all_reduce (sum) or all_gather */
    size_t count;    /* the row's count, as in the table */
    int repeat;      /* calls per step */
    double seconds;  /* out */
} kvp_cb_phase;

/* The elements phase ph's buffers hold over n ranks (*count: its count
 * rounded up to whole elements a rank where the op cuts its buffer in
 * parts), and whether one call of a backend whose calls take lim elements
 * (0: MPI's INT_MAX) can take them: 0, or KVP_ELIMIT naming the operation,
 * its elements and the limit. */
int kvp_cb_phase_check(const kvp_cb_phase *ph, int n, uint64_t lim, size_t *count, kvp_err *err);

/* 0 or a code; *step_seconds: one whole step, averaged over ranks. */
int kvp_cb_time_phases(kvp_comm *c, kvp_cb_backend *b, int dtype, kvp_cb_phase *ph, int nph, int warmup,
                       int iters, double *step_seconds, kvp_err *err);

#endif
