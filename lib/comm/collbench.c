/* collbench.c - the sweep: sizes, buffers, timing through a backend, and
 * the exact count of wrong elements.
 *
 * Each row is timed the way nccl-tests times it: warmup calls, then `iters`
 * calls back to back and one wait, the mean per call averaged over ranks.
 * The check is a separate call on freshly filled buffers, so the timing
 * loop never pays for filling or comparing.
 */
#include "collbench.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void kvp_cb_opts_init(kvp_cb_opts *o)
{
    memset(o, 0, sizeof *o);
    o->op = KVP_CB_OP_ALL_REDUCE;
    o->dtype = KVP_CB_DTYPE_FLOAT;
    o->redop = KVP_CB_REDOP_SUM;
    o->min_bytes = 8;
    o->max_bytes = 8u << 20;
    o->step_factor = 2;
    o->iters = 20;
    o->warmup = 5;
    o->check = 1;
}

/* The op's smallest size over n ranks, in bytes: sizes are whole ones. */
static uint64_t size_unit(int op, int n, int dtype)
{
    return (uint64_t)kvp_cb_count_unit(op, n) * kvp_cb_dtype_size(dtype);
}

/* bytes rounded down to whole units of the op (0: less than one). */
static uint64_t round_size(int op, int n, int dtype, uint64_t bytes)
{
    uint64_t unit = size_unit(op, n, dtype);
    return bytes / unit * unit;
}

uint64_t kvp_cb_backend_max_count(const char *name)
{
    return strcmp(name, "nccl") == 0 ? KVP_CB_NCCL_MAX_COUNT : INT_MAX;
}

int kvp_cb_sizes(const kvp_cb_opts *o, int n, uint64_t *sizes, int max, kvp_err *err)
{
    if (o->step_bytes == 0 && !(o->step_factor > 1.0))
        return kvp_err_set(err, KVP_EINVAL, "step factor %g never grows the size (use -f > 1 or -i)",
                           o->step_factor);
    size_t es = kvp_cb_dtype_size(o->dtype);
    uint64_t lim = o->max_count ? o->max_count : INT_MAX;
    int k = 0;
    /* From 1 byte at least: 0 x a factor would never grow.  b grows every
     * turn until the loop ends or a size passes lim elements (returns; lim
     * is at most 2^40), so it stays far below 2^53, where b + step would
     * stop growing. */
    for (double b = o->min_bytes ? (double)o->min_bytes : 1.0; b <= (double)o->max_bytes;
         b = o->step_bytes ? b + (double)o->step_bytes : b * o->step_factor) {
        /* UINT64_MAX: past 2^62, where the cast could overflow, and far past lim elements */
        uint64_t s = b < 0x1p62 ? round_size(o->op, n, o->dtype, (uint64_t)b) : UINT64_MAX;
        if (s / es > lim)
            return kvp_err_set(err, KVP_ELIMIT, "%.0f bytes is over %llu %s elements (%s): sizes go up to %llu bytes",
                               b, (unsigned long long)lim, kvp_cb_dtype_name(o->dtype),
                               lim == INT_MAX ? "MPI counts are int" : "one call's limit",
                               (unsigned long long)(lim * es));
        /* rounded down below -b (or to nothing): not a size asked for */
        if (s == 0 || s < o->min_bytes || (k > 0 && sizes[k - 1] == s))
            continue;
        if (k == max)
            return kvp_err_set(err, KVP_ELIMIT, "more than %d sizes from %llu to %llu bytes: use a larger step",
                               max, (unsigned long long)o->min_bytes, (unsigned long long)o->max_bytes);
        sizes[k++] = s;
    }
    if (k == 0)
        return kvp_err_set(err, KVP_EINVAL,
                           "no size from %llu to %llu bytes: %s of %s over %d rank%s takes whole %llu-byte units",
                           (unsigned long long)o->min_bytes, (unsigned long long)o->max_bytes,
                           kvp_cb_op_name(o->op), kvp_cb_dtype_name(o->dtype), n, n == 1 ? "" : "s",
                           (unsigned long long)size_unit(o->op, n, o->dtype));
    return k;
}

int kvp_cb_sizes_check(const kvp_cb_opts *o, int n, kvp_err *err)
{
    uint64_t *sizes = malloc(KVP_CB_MAX_SIZES * sizeof *sizes);
    if (!sizes)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    int k = kvp_cb_sizes(o, n, sizes, KVP_CB_MAX_SIZES, err);
    free(sizes);
    return k;
}

/* ---- filling and checking (host memory) ---- */

/* The input this rank holds for call c, written into host[] laid out as the
 * backend buffer will be: in place, the one buffer of count elements. */
static void fill_input(const kvp_cb_call *c, int rank, int n, void *host)
{
    int t = c->dtype, red = kvp_cb_op_reduces(c->op) ? c->redop : -1;
    size_t per = c->count / kvp_cb_count_unit(c->op, n); /* block of one rank */
    if (c->op == KVP_CB_OP_ALL_GATHER) {
        /* own block only; in place it sits at rank x per of the output */
        size_t at = c->in_place ? (size_t)rank * per : 0;
        for (size_t j = 0; j < c->send_count; j++)
            kvp_cb_store(t, host, at + j, kvp_cb_value(red, rank, (size_t)rank * per + j));
        return;
    }
    int who = c->op == KVP_CB_OP_BROADCAST ? c->root : rank;
    for (size_t i = 0; i < c->send_count; i++)
        kvp_cb_store(t, host, i, kvp_cb_value(red, who, i));
}

/* The exact output element i of this rank. */
static double expected(const kvp_cb_call *c, int rank, int n, size_t i)
{
    size_t per = c->count / kvp_cb_count_unit(c->op, n);
    switch (c->op) {
    case KVP_CB_OP_ALL_REDUCE:
    case KVP_CB_OP_REDUCE: return kvp_cb_reduced(c->redop, n, i);
    case KVP_CB_OP_REDUCE_SCATTER: return kvp_cb_reduced(c->redop, n, (size_t)rank * per + i);
    case KVP_CB_OP_ALL_GATHER: return kvp_cb_value(-1, (int)(i / per), i);
    case KVP_CB_OP_BROADCAST: return kvp_cb_value(-1, c->root, i);
    case KVP_CB_OP_ALLTOALL: return kvp_cb_value(-1, (int)(i / per), (size_t)rank * per + i % per);
    default: return kvp_cb_value(-1, (rank + n - 1) % n, i); /* sendrecv: from the previous rank */
    }
}

static double tol_at(const kvp_cb_call *c, int rank, int n, size_t i)
{
    if (!kvp_cb_op_reduces(c->op))
        return 0;
    size_t at = c->op == KVP_CB_OP_REDUCE_SCATTER ? (size_t)rank * (c->count / (size_t)n) + i : i;
    return kvp_cb_tolerance(c->dtype, c->redop, n, at);
}

static int64_t count_wrong(const kvp_cb_call *c, int rank, int n, const void *out)
{
    if (c->op == KVP_CB_OP_REDUCE && rank != c->root)
        return 0; /* only the root receives */
    int64_t wrong = 0;
    for (size_t i = 0; i < c->recv_count; i++) {
        double got = kvp_cb_load(c->dtype, out, i), want = expected(c, rank, n, i);
        /* !(<=) so that a NaN counts as wrong */
        wrong += !(fabs(got - want) <= tol_at(c, rank, n, i));
    }
    return wrong;
}

/* ---- one row ---- */

typedef struct bufs {
    void *a, *b;     /* backend memory: send and receive (in place: b alone) */
    void *host;      /* staging for fill and check */
    size_t bytes;    /* each */
} bufs;

static int bufs_alloc(kvp_cb_backend *be, size_t bytes, bufs *m, kvp_err *err)
{
    memset(m, 0, sizeof *m);
    m->bytes = bytes;
    int rc;
    if ((rc = be->alloc(be->state, bytes, &m->a, err)) < 0 || (rc = be->alloc(be->state, bytes, &m->b, err)) < 0)
        return rc;
    if (!(m->host = malloc(bytes)))
        return kvp_err_set(err, KVP_ENOMEM, "out of memory for a %zu-byte host buffer", bytes);
    return 0;
}

static void bufs_free(kvp_cb_backend *be, bufs *m)
{
    if (m->a)
        be->release(be->state, m->a);
    if (m->b)
        be->release(be->state, m->b);
    free(m->host);
}

/* Fill the call's input in backend memory; the output region is first set
 * to NaN so that an element the collective never wrote counts as wrong. */
static int load_input(kvp_cb_backend *be, kvp_cb_call *c, int rank, int n, bufs *m, kvp_err *err)
{
    size_t es = kvp_cb_dtype_size(c->dtype), bytes = c->count * es;
    for (size_t i = 0; i < c->count; i++)
        kvp_cb_store(c->dtype, m->host, i, NAN);
    int rc;
    if (!c->in_place && (rc = be->put(be->state, c->recv, m->host, bytes, err)) < 0)
        return rc;
    fill_input(c, rank, n, m->host);
    return be->put(be->state, c->send, m->host, bytes, err);
}

static int check_call(kvp_cb_backend *be, kvp_cb_call *c, int rank, int n, bufs *m, int64_t *wrong,
                      kvp_err *err)
{
    double s;
    int rc;
    if ((rc = load_input(be, c, rank, n, m, err)) < 0 || (rc = be->time(be->state, c, 1, &s, err)) < 0)
        return rc;
    if ((rc = be->get(be->state, m->host, c->out, c->recv_count * kvp_cb_dtype_size(c->dtype), err)) < 0)
        return rc;
    *wrong = count_wrong(c, rank, n, m->host);
    return 0;
}

static int run_mode(kvp_comm *cm, kvp_cb_backend *be, const kvp_cb_opts *o, kvp_cb_call *c, bufs *m,
                    double *seconds, int64_t *wrong, kvp_err *err)
{
    int rank = kvp_comm_rank(cm), n = kvp_comm_size(cm), rc;
    double s = 0;
    if ((rc = load_input(be, c, rank, n, m, err)) < 0)
        return rc;
    if (o->warmup > 0 && (rc = be->time(be->state, c, o->warmup, &s, err)) < 0)
        return rc;
    if ((rc = be->time(be->state, c, o->iters, &s, err)) < 0)
        return rc;
    *seconds = s / o->iters;
    *wrong = -1;
    return o->check ? check_call(be, c, rank, n, m, wrong, err) : 0;
}

static void call_init(kvp_cb_call *c, int op, int dtype, int redop, int root, int n, size_t count)
{
    memset(c, 0, sizeof *c);
    c->op = op;
    c->dtype = dtype;
    c->redop = redop;
    c->root = root;
    c->count = count;
    kvp_cb_counts(op, n, count, &c->send_count, &c->recv_count);
}

static int run_row(kvp_comm *cm, kvp_cb_backend *be, const kvp_cb_opts *o, uint64_t bytes, bufs *m,
                   kvp_cb_row *row, kvp_err *err)
{
    int n = kvp_comm_size(cm), rc;
    kvp_cb_call c;
    call_init(&c, o->op, o->dtype, o->redop, o->root, n, (size_t)(bytes / kvp_cb_dtype_size(o->dtype)));
    memset(row, 0, sizeof *row);
    row->bytes = bytes;
    row->count = c.count;
    /* sums over ranks: time out of place, in place, then the wrong counts */
    double v[4] = {-1, -1, 0, 0};
    int64_t wrong = -1;
    for (int mode = 0; mode < 2; mode++) {
        if ((mode == 0 && o->in_place_only) ||
            (mode == 1 && (!kvp_cb_op_in_place(o->op) || (be->no_in_place >> o->op & 1))))
            continue;
        c.in_place = mode;
        c.send = mode ? m->b : m->a;
        c.recv = m->b;
        if ((rc = run_mode(cm, be, o, &c, m, &v[mode], &wrong, err)) < 0)
            return kvp_err_prefix(err, "%s of %llu bytes%s", kvp_cb_op_name(o->op), (unsigned long long)bytes,
                                  mode ? " in place" : "");
        v[2 + mode] = wrong > 0 ? (double)wrong : 0;
    }
    if ((rc = kvp_cb_sum_doubles(cm, v, 4, err)) < 0)
        return rc;
    double f = kvp_cb_busbw_factor(o->op, n);
    for (int mode = 0; mode < 2; mode++) {
        int ran = v[mode] >= 0;
        row->time_us[mode] = ran ? v[mode] / n * 1e6 : -1;
        row->algbw[mode] = ran && v[mode] > 0 ? (double)bytes / (v[mode] / n) / 1e9 : 0;
        row->busbw[mode] = row->algbw[mode] * f;
        row->wrong[mode] = ran && o->check ? (int64_t)llround(v[2 + mode]) : -1;
    }
    return 0;
}

int kvp_cb_run(kvp_comm *cm, kvp_cb_backend *be, const kvp_cb_opts *o,
               void (*row)(void *arg, const kvp_cb_row *r), void *arg, kvp_err *err)
{
    int n = kvp_comm_size(cm);
    if (kvp_cb_op_rooted(o->op) && (o->root < 0 || o->root >= n))
        return kvp_err_set(err, KVP_EINVAL, "root %d is not a rank of %d", o->root, n);
    if (o->in_place_only && !kvp_cb_op_in_place(o->op))
        return kvp_err_set(err, KVP_EINVAL, "%s has no in-place form (-z)", kvp_cb_op_name(o->op));
    if (o->iters < 1)
        return kvp_err_set(err, KVP_EINVAL, "iterations must be at least 1");
    uint64_t *sizes = malloc(KVP_CB_MAX_SIZES * sizeof *sizes);
    if (!sizes)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    kvp_cb_opts ob = *o; /* the sizes this backend's counts reach */
    ob.max_count = be->max_count;
    int k = kvp_cb_sizes(&ob, n, sizes, KVP_CB_MAX_SIZES, err), rc = k < 0 ? k : 0;
    bufs m = {0};
    if (rc == 0 && k > 0)
        rc = bufs_alloc(be, (size_t)sizes[k - 1], &m, err);
    for (int i = 0; rc == 0 && i < k; i++) {
        kvp_cb_row r;
        if ((rc = run_row(cm, be, o, sizes[i], &m, &r, err)) == 0)
            row(arg, &r);
    }
    bufs_free(be, &m);
    free(sizes);
    return rc;
}

#define MAX_PHASES 8

int kvp_cb_phase_check(const kvp_cb_phase *ph, int n, uint64_t lim, size_t *count, kvp_err *err)
{
    size_t unit = kvp_cb_count_unit(ph->op, n);
    *count = (ph->count + unit - 1) / unit * unit;
    if (!lim)
        lim = INT_MAX;
    if (*count > lim)
        return kvp_err_set(err, KVP_ELIMIT, "%s of %zu elements: over %llu a call%s", kvp_cb_op_name(ph->op), *count,
                           (unsigned long long)lim, lim == INT_MAX ? " (MPI counts are int)" : "");
    return 0;
}

/* One pass over the phases; adds each phase's seconds to acc[]. */
static int step_once(kvp_cb_backend *be, kvp_cb_call *calls, const kvp_cb_phase *ph, int nph, double *acc,
                     kvp_err *err)
{
    for (int p = 0; p < nph; p++) {
        double s = 0;
        int rc = be->time(be->state, &calls[p], ph[p].repeat, &s, err);
        if (rc < 0)
            return rc;
        acc[p] += s;
    }
    return 0;
}

int kvp_cb_time_phases(kvp_comm *cm, kvp_cb_backend *be, int dtype, kvp_cb_phase *ph, int nph, int warmup,
                       int iters, double *step_seconds, kvp_err *err)
{
    int n = kvp_comm_size(cm), rank = kvp_comm_rank(cm), rc = 0;
    if (nph < 1 || nph > MAX_PHASES || iters < 1)
        return kvp_err_set(err, KVP_EINVAL, "%d phases, %d iterations", nph, iters);
    bufs m[MAX_PHASES] = {{0}};
    kvp_cb_call calls[MAX_PHASES];
    double acc[MAX_PHASES + 1] = {0}, junk[MAX_PHASES] = {0};
    for (int p = 0; rc == 0 && p < nph; p++) {
        size_t count;
        if ((rc = kvp_cb_phase_check(&ph[p], n, be->max_count, &count, err)) < 0)
            kvp_err_prefix(err, "the %s backend", be->name);
        else if ((rc = bufs_alloc(be, count * kvp_cb_dtype_size(dtype), &m[p], err)) == 0) {
            call_init(&calls[p], ph[p].op, dtype, KVP_CB_REDOP_SUM, 0, n, count);
            calls[p].send = m[p].a;
            calls[p].recv = m[p].b;
            rc = load_input(be, &calls[p], rank, n, &m[p], err);
        }
    }
    for (int it = 0; rc == 0 && it < warmup; it++)
        rc = step_once(be, calls, ph, nph, junk, err);
    for (int it = 0; rc == 0 && it < iters; it++)
        rc = step_once(be, calls, ph, nph, acc, err);
    for (int p = 0; rc == 0 && p < nph; p++)
        acc[nph] += acc[p];
    if (rc == 0 && (rc = kvp_cb_sum_doubles(cm, acc, nph + 1, err)) == 0) {
        for (int p = 0; p < nph; p++)
            ph[p].seconds = acc[p] / n / iters / ph[p].repeat;
        *step_seconds = acc[nph] / n / iters;
    }
    for (int p = 0; p < nph; p++)
        bufs_free(be, &m[p]);
    return rc;
}
