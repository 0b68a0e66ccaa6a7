/* collcheck.c - what every collective benchmark row agrees on before any
 * byte moves: names, element counts, busbw factors, and the check values
 * with their exact expected results.
 */
#include "collbench.h"
#include "minifloat.h"

#include <limits.h>
#include <math.h>
#include <string.h>

static const char *const op_names[KVP_CB_OP_COUNT] = {
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "alltoall", "sendrecv",
};
static const char *const dtype_names[KVP_CB_DTYPE_COUNT] = {"float", "half", "bfloat16"};
static const char *const redop_names[KVP_CB_REDOP_COUNT] = {"sum", "prod", "max", "min"};

const char *kvp_cb_op_name(int op) { return op >= 0 && op < KVP_CB_OP_COUNT ? op_names[op] : "?"; }
const char *kvp_cb_dtype_name(int t) { return t >= 0 && t < KVP_CB_DTYPE_COUNT ? dtype_names[t] : "?"; }
const char *kvp_cb_redop_name(int r) { return r >= 0 && r < KVP_CB_REDOP_COUNT ? redop_names[r] : "none"; }

static int find(const char *const *names, int n, const char *s)
{
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], s) == 0)
            return i;
    return -1;
}

int kvp_cb_op_parse(const char *s)
{
    /* nccl-tests' binaries drop the underscore (all_reduce_perf, but
     * "allreduce" in most scripts): take both. */
    static const char *const alt[KVP_CB_OP_COUNT] = {
        "allreduce", "allgather", "reducescatter", "bcast", "reduce", "all_to_all", "send_recv",
    };
    int i = find(op_names, KVP_CB_OP_COUNT, s);
    return i >= 0 ? i : find(alt, KVP_CB_OP_COUNT, s);
}

int kvp_cb_dtype_parse(const char *s)
{
    static const char *const alt[KVP_CB_DTYPE_COUNT] = {"f32", "f16", "bf16"};
    static const char *const alt2[KVP_CB_DTYPE_COUNT] = {"float32", "fp16", "bfloat"};
    int i = find(dtype_names, KVP_CB_DTYPE_COUNT, s);
    if (i < 0)
        i = find(alt, KVP_CB_DTYPE_COUNT, s);
    return i >= 0 ? i : find(alt2, KVP_CB_DTYPE_COUNT, s);
}

int kvp_cb_redop_parse(const char *s) { return find(redop_names, KVP_CB_REDOP_COUNT, s); }

size_t kvp_cb_dtype_size(int dtype) { return dtype == KVP_CB_DTYPE_FLOAT ? 4 : 2; }

int kvp_cb_op_reduces(int op)
{
    return op == KVP_CB_OP_ALL_REDUCE || op == KVP_CB_OP_REDUCE_SCATTER || op == KVP_CB_OP_REDUCE;
}

int kvp_cb_op_rooted(int op) { return op == KVP_CB_OP_BROADCAST || op == KVP_CB_OP_REDUCE; }

/* MPI has no non-blocking sendrecv_replace, and sending from the buffer a
 * receive is landing in is a race: sendrecv runs out of place only. */
int kvp_cb_op_in_place(int op) { return op != KVP_CB_OP_SENDRECV; }

/* A ring all-reduce is a reduce-scatter then an all-gather: each rank sends
 * and receives 2(n-1)/n of the buffer over its link, so busbw = algbw x
 * 2(n-1)/n is the link speed the collective achieved, comparable across n.
 * Gathers, scatters and alltoall move (n-1)/n of the buffer through each
 * rank; a broadcast, a reduce and one ring step move it once. */
double kvp_cb_busbw_factor(int op, int n)
{
    if (n <= 1)
        return op == KVP_CB_OP_ALL_REDUCE || op == KVP_CB_OP_ALL_GATHER || op == KVP_CB_OP_REDUCE_SCATTER ||
                       op == KVP_CB_OP_ALLTOALL
                   ? 0.0
                   : 1.0;
    switch (op) {
    case KVP_CB_OP_ALL_REDUCE: return 2.0 * (n - 1) / n;
    case KVP_CB_OP_ALL_GATHER:
    case KVP_CB_OP_REDUCE_SCATTER:
    case KVP_CB_OP_ALLTOALL: return (double)(n - 1) / n;
    default: return 1.0;
    }
}

size_t kvp_cb_count_unit(int op, int n)
{
    return op == KVP_CB_OP_ALL_GATHER || op == KVP_CB_OP_REDUCE_SCATTER || op == KVP_CB_OP_ALLTOALL ? (size_t)n : 1;
}

int kvp_cb_mpi_count(int op, int dtype, int n, size_t count, int *mpi_count, kvp_err *err)
{
    size_t k = kvp_cb_count_unit(op, n) > 1 ? count / (size_t)n : count;
    if (k > INT_MAX)
        return kvp_err_set(err, KVP_ELIMIT, "%s of %zu %s elements over %d ranks: %zu elements in one MPI call, "
                           "over its limit of %d (MPI counts are int)", kvp_cb_op_name(op), count,
                           kvp_cb_dtype_name(dtype), n, k, INT_MAX);
    *mpi_count = (int)k;
    return 0;
}

void kvp_cb_counts(int op, int n, size_t count, size_t *send, size_t *recv)
{
    *send = *recv = count;
    if (op == KVP_CB_OP_ALL_GATHER)
        *send = count / (size_t)n;
    else if (op == KVP_CB_OP_REDUCE_SCATTER)
        *recv = count / (size_t)n;
}

/* ---- check values ---- */

double kvp_cb_value(int redop, int rank, size_t i)
{
    if (redop == KVP_CB_REDOP_PROD) {
        /* exponents cycle -1, 0, 1 over ranks: any product stays within
         * 2^-1 .. 2^1 of 1, in range for half at any rank count */
        int k = (int)(((size_t)rank + i) % 3) - 1;
        double sign = ((size_t)rank * 3 + i) % 5 == 0 ? -1.0 : 1.0;
        return sign * ldexp(1.0, k);
    }
    /* multiples of 1/8 in [-3.75, 3.75]: 5 significant bits, exact in
     * bfloat16's 8; 131 and 17 are prime to 61 so ranks and neighbours differ */
    long v = (long)(((size_t)rank * 131 + i * 17) % 61) - 30;
    return (double)v / 8.0;
}

double kvp_cb_reduced(int redop, int n, size_t i)
{
    double acc = kvp_cb_value(redop, 0, i);
    for (int r = 1; r < n; r++) {
        double x = kvp_cb_value(redop, r, i);
        switch (redop) {
        case KVP_CB_REDOP_SUM: acc += x; break;
        case KVP_CB_REDOP_PROD: acc *= x; break;
        case KVP_CB_REDOP_MAX: acc = x > acc ? x : acc; break;
        default: acc = x < acc ? x : acc; break;
        }
    }
    return acc;
}

double kvp_cb_tolerance(int dtype, int redop, int n, size_t i)
{
    if (redop != KVP_CB_REDOP_SUM || dtype == KVP_CB_DTYPE_FLOAT)
        return 0.0; /* float sums of these values are exact in any order */
    double u = dtype == KVP_CB_DTYPE_HALF ? ldexp(1.0, -11) : ldexp(1.0, -8);
    double mag = 0;
    for (int r = 0; r < n; r++)
        mag += fabs(kvp_cb_value(redop, r, i));
    return n * u * mag;
}

double kvp_cb_load(int dtype, const void *buf, size_t i)
{
    if (dtype == KVP_CB_DTYPE_FLOAT)
        return ((const float *)buf)[i];
    uint16_t h = ((const uint16_t *)buf)[i];
    return dtype == KVP_CB_DTYPE_HALF ? kvp_f16_to_f32(h) : kvp_bf16_to_f32(h);
}

void kvp_cb_store(int dtype, void *buf, size_t i, double v)
{
    if (dtype == KVP_CB_DTYPE_FLOAT)
        ((float *)buf)[i] = (float)v;
    else
        ((uint16_t *)buf)[i] = dtype == KVP_CB_DTYPE_HALF ? kvp_f32_to_f16((float)v) : kvp_f32_to_bf16((float)v);
}

/* b[k] = a[k] OP b[k] on floats; NaN propagates, as in MPI's float ops. */
static void op_row(int redop, const float *a, float *b, size_t n)
{
    switch (redop) {
    case KVP_CB_REDOP_SUM:
        for (size_t k = 0; k < n; k++)
            b[k] = a[k] + b[k];
        break;
    case KVP_CB_REDOP_PROD:
        for (size_t k = 0; k < n; k++)
            b[k] = a[k] * b[k];
        break;
    case KVP_CB_REDOP_MAX:
        for (size_t k = 0; k < n; k++)
            b[k] = isnan(a[k]) || a[k] > b[k] ? a[k] : b[k];
        break;
    default:
        for (size_t k = 0; k < n; k++)
            b[k] = isnan(a[k]) || a[k] < b[k] ? a[k] : b[k];
        break;
    }
}

static void bf16_row_to_f32(const uint16_t *h, float *f, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        uint32_t bits = (uint32_t)h[k] << 16;
        memcpy(&f[k], &bits, sizeof bits);
    }
}

/* kvp_f32_to_bf16 inline (round to nearest even, NaN stays NaN), so the
 * loop vectorizes. */
static void bf16_row_from_f32(const float *f, uint16_t *h, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        uint32_t x;
        memcpy(&x, &f[k], sizeof x);
        uint32_t r = (x + 0x7fffu + ((x >> 16) & 1)) >> 16, q = (x >> 16) | 0x40;
        h[k] = (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? q : r);
    }
}

/* In blocks through f32 rows: MPI calls this on every piece of every
 * message, and a scalar call per element made bfloat16 all-reduces several
 * times slower than float ones. */
void kvp_cb_reduce16(int dtype, int redop, const void *in, void *inout, size_t n)
{
    enum { BLOCK = 256 };
    float fa[BLOCK], fb[BLOCK];
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (size_t at = 0; at < n; at += BLOCK) {
        size_t m = n - at < BLOCK ? n - at : BLOCK;
        if (dtype == KVP_CB_DTYPE_HALF) {
            kvp_f16_row_to_f32(KVP_IMPL_AUTO, a + at, fa, (int64_t)m);
            kvp_f16_row_to_f32(KVP_IMPL_AUTO, b + at, fb, (int64_t)m);
        } else {
            bf16_row_to_f32(a + at, fa, m);
            bf16_row_to_f32(b + at, fb, m);
        }
        op_row(redop, fa, fb, m);
        if (dtype == KVP_CB_DTYPE_HALF)
            kvp_f16_row_from_f32(KVP_IMPL_AUTO, fb, b + at, (int64_t)m);
        else
            bf16_row_from_f32(fb, b + at, m);
    }
}
