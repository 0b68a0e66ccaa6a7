/* comm_mpi.c - kvp_comm over MPI (built when the Makefile finds MPI).
 *
 * Every collective is the non-blocking MPI call followed by kvp_comm_wait,
 * which polls with a deadline: MPI itself would wait forever for a peer that
 * hangs.  Polling spins briefly (a step's all-reduce on one host takes
 * microseconds) and then sleeps in growing steps, so ranks oversubscribed on
 * few cores give their core back to the peer they wait for.
 */
#ifdef KVP_HAVE_MPI
#include "comm.h"
#include "cli.h"
#include "io.h"
#include "stopsig.h"

#include <mpi.h>

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct kvp_comm {
    MPI_Comm mc;
    int rank, size;
    int owned;             /* MPI_Comm_free on kvp_comm_free */
};

static kvp_comm *world;
static double timeout_s = 300.0;

int kvp_comm_have_mpi(void) { return 1; }

void kvp_comm_set_timeout(double seconds) { timeout_s = seconds > 0 ? seconds : 300.0; }
double kvp_comm_timeout(void) { return timeout_s; }

int kvp_comm_mpi_error(kvp_err *err, int rc, const char *what)
{
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(rc, s, &n) != MPI_SUCCESS)
        snprintf(s, sizeof s, "MPI error %d", rc);
    return kvp_err_set(err, KVP_EIO, "%s: %s", what, s);
}

int kvp_comm_world(kvp_comm **out, kvp_err *err)
{
    *out = NULL;
    if (world) {
        *out = world;
        return 0;
    }
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (!inited && kvp_comm_launched_size() <= 1) {
        /* Started alone: a world of one that never starts MPI (a singleton
         * MPI_Init forks a daemon and leaves its environment behind). */
        kvp_comm *one = calloc(1, sizeof *one);
        if (!one)
            return kvp_err_set(err, KVP_ENOMEM, "comm: out of memory");
        one->mc = MPI_COMM_NULL;
        one->size = 1;
        world = *out = one;
        return 0;
    }
    /* Only the calling thread talks to MPI; the engine's pool never does. */
    if (!inited && MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return kvp_err_set(err, KVP_EIO, "MPI_Init failed (is this job started by mpirun or srun?)");
    kvp_comm *c = calloc(1, sizeof *c);
    if (!c)
        return kvp_err_set(err, KVP_ENOMEM, "comm: out of memory");
    /* Errors come back as codes (and become messages), not MPI's abort. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    c->mc = MPI_COMM_WORLD;
    MPI_Comm_rank(c->mc, &c->rank);
    MPI_Comm_size(c->mc, &c->size);
    world = *out = c;
    return 0;
}

void kvp_comm_finalize(void)
{
    if (world && world->mc == MPI_COMM_NULL) {
        free(world);
        world = NULL;
        return;
    }
    int inited = 0, done = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&done);
    if (inited && !done)
        MPI_Finalize();
    free(world);
    world = NULL;
}

int kvp_comm_rank(const kvp_comm *c) { return c->rank; }
int kvp_comm_size(const kvp_comm *c) { return c->size; }
void *kvp_comm_handle(kvp_comm *c) { return c->mc == MPI_COMM_NULL ? NULL : &c->mc; }

int kvp_comm_split(kvp_comm *c, int color, int key, kvp_comm **out, kvp_err *err)
{
    *out = NULL;
    if (c->mc == MPI_COMM_NULL) {
        *out = c; /* the world of one (kvp_comm_free ignores it) */
        return 0;
    }
    kvp_comm *s = calloc(1, sizeof *s);
    if (!s)
        return kvp_err_set(err, KVP_ENOMEM, "comm: out of memory");
    int rc = MPI_Comm_split(c->mc, color, key, &s->mc);
    if (rc != MPI_SUCCESS) {
        free(s);
        return kvp_comm_mpi_error(err, rc, "MPI_Comm_split");
    }
    MPI_Comm_set_errhandler(s->mc, MPI_ERRORS_RETURN);
    MPI_Comm_rank(s->mc, &s->rank);
    MPI_Comm_size(s->mc, &s->size);
    s->owned = 1;
    *out = s;
    return 0;
}

void kvp_comm_free(kvp_comm *c)
{
    if (!c || c == world)
        return;
    int done = 0;
    MPI_Finalized(&done);
    if (c->owned && !done)
        MPI_Comm_free(&c->mc);
    free(c);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Seconds a rank past 0 that has SIGINT or SIGTERM (kvp_stopsig_defer)
 * waits for rank 0 to end the job: a scheduler's stop gives every rank the
 * signal and rank 0 ends it in order within a step; one given this rank
 * alone (kill of one task) would otherwise be dropped while the job ran
 * to its end and exited 0. */
#define KVP_FOLLOWER_STOP_S 30.0

/* A rank past 0 that has had a stop signal rank 0 has not acted on for
 * KVP_FOLLOWER_STOP_S: it says so and aborts the job. */
static void follower_stop_check(int world_rank)
{
    static double seen;
    int sig = world_rank != 0 ? kvp_stopsig_caught() : 0;
    if (!sig)
        return;
    double now = now_s();
    if (!seen)
        seen = now;
    if (now - seen < KVP_FOLLOWER_STOP_S)
        return;
    fprintf(stderr, "%s: rank %d: stopped by %s, which rank 0 has not had for %.0f s: aborting the job (a signal to "
            "mpirun or to rank 0 ends it in order)\n", kvp_cli_prog(), world_rank, strsignal(sig), now - seen);
    fflush(stderr);
    kvp_tmp_remove_all();
    MPI_Abort(MPI_COMM_WORLD, 128 + sig);
    exit(128 + sig);
}

/* The longest wait on its peers this process has seen complete: a stop's
 * grace (kvp_comm_stop_grace) grows with it.  A peer that died or hangs
 * never answers: mpirun, which signals every rank when one dies, kills
 * them one second later (odls_base_sigkill_timeout), and a stop given to
 * rank 0 alone would wait out --timeout. */
static double longest_wait_s;

void kvp_comm_setup_done(void) { longest_wait_s = 0; }

/* Rank 0 with a stop signal, in a wait that has gone on for the stop's
 * grace since the later of its start and the signal (*since: when this
 * wait first saw it): it removes its temporary outputs, says so and
 * aborts the job, before the launcher's kill leaves them behind. */
static void driver_stop_check(int world_rank, double *since, const char *what)
{
    int sig = world_rank == 0 ? kvp_stopsig_caught() : 0;
    if (!sig)
        return;
    double now = now_s();
    if (!*since)
        *since = now;
    if (now - *since < kvp_comm_stop_grace(longest_wait_s))
        return;
    fprintf(stderr, "%s: rank 0: stopped by %s while waiting %.1f s for its peers (%s): a rank died or hangs, so "
            "the job cannot stop in order: temporary outputs removed, aborting it\n", kvp_cli_prog(), strsignal(sig),
            now - *since, what);
    fflush(stderr);
    kvp_tmp_remove_all();
    MPI_Abort(MPI_COMM_WORLD, 128 + sig);
    exit(128 + sig);
}

/* Poll until done; past the deadline (forever: no deadline) abort the job.
 * World rank 0 waits --timeout, the others half as long again: when a peer
 * hangs every rank waiting on it would say so, and the job's one message
 * comes from rank 0 (it aborts the others first) unless rank 0 is the one
 * that hangs. */
static int wait_until(kvp_comm *c, MPI_Request *req, const char *what, int forever, int step, kvp_err *err)
{
    int world_rank = world ? world->rank : c->rank;
    double t0 = now_s(), deadline = t0 + timeout_s * (world_rank == 0 ? 1.0 : 1.5), stop_since = 0;
    long nap_ns = 1000;
    follower_stop_check(world_rank);
    for (unsigned spin = 0;; spin++) {
        int done = 0, rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            return kvp_comm_mpi_error(err, rc, what);
        if (done && spin < 2000)
            return 0;
        if (done) { /* a wait long enough to be timed: a step's sets the grace */
            double took = now_s() - t0;
            if (step && took > longest_wait_s)
                longest_wait_s = took;
            return 0;
        }
        if (spin < 2000)
            continue;
        driver_stop_check(world_rank, &stop_since, what); /* a flag read until a signal came */
        if (spin % 4096 == 0)
            follower_stop_check(world_rank);
        if (!forever && now_s() > deadline) {
            fprintf(stderr, "%s: rank %d: %s waited %.0f s for its peers (a rank died or hangs; --timeout); "
                    "aborting the job\n", kvp_cli_prog(), world_rank, what, now_s() - t0);
            fflush(stderr);
            kvp_tmp_remove_all(); /* MPI_Abort runs no atexit: the outputs' temporary files go now */
            MPI_Abort(MPI_COMM_WORLD, 1);
            exit(1); /* MPI_Abort does not return; if it did, still never hang */
        }
        struct timespec ts = {0, nap_ns};
        nanosleep(&ts, NULL);
        if (nap_ns < 200000)
            nap_ns *= 2;
    }
}

int kvp_comm_wait(kvp_comm *c, void *request, const char *what, kvp_err *err)
{
    return wait_until(c, request, what, 0, 0, err);
}

/* A wait inside a model step (a layer's all_reduce, a pipeline stage's
 * activations): the longest one sets a stop's grace, where one at the
 * start (peers still loading the model) or an idle one would not say how
 * long a live step takes. */
static int wait_step(kvp_comm *c, MPI_Request *req, const char *what, kvp_err *err)
{
    return wait_until(c, req, what, 0, 1, err);
}

/* MPI counts are int: larger buffers go in pieces of at most 1 GiB. */
#define PIECE ((size_t)1 << 30)

int kvp_comm_allreduce_f32(kvp_comm *c, float *x, size_t n, kvp_err *err)
{
    if (c->size == 1)
        return 0;
    for (size_t at = 0; at < n;) {
        size_t k = n - at < PIECE / sizeof(float) ? n - at : PIECE / sizeof(float);
        MPI_Request r;
        int rc = MPI_Iallreduce(MPI_IN_PLACE, x + at, (int)k, MPI_FLOAT, MPI_SUM, c->mc, &r);
        if (rc != MPI_SUCCESS)
            return kvp_comm_mpi_error(err, rc, "all_reduce");
        char what[64];
        snprintf(what, sizeof what, "all_reduce of %zu floats", k);
        if ((rc = wait_step(c, &r, what, err)) < 0)
            return rc;
        at += k;
    }
    return 0;
}

int kvp_comm_allgather(kvp_comm *c, const void *send, void *recv, size_t bytes, kvp_err *err)
{
    if (c->size == 1) {
        if (send != recv)
            memmove(recv, send, bytes);
        return 0;
    }
    if (bytes > INT_MAX)
        return kvp_err_set(err, KVP_ELIMIT, "all_gather of %zu bytes a rank (at most %d)", bytes, INT_MAX);
    MPI_Request r;
    int rc = MPI_Iallgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, c->mc, &r);
    if (rc != MPI_SUCCESS)
        return kvp_comm_mpi_error(err, rc, "all_gather");
    return kvp_comm_wait(c, &r, "all_gather", err);
}

static int bcast(kvp_comm *c, void *buf, size_t bytes, int root, int forever, kvp_err *err)
{
    if (c->size == 1)
        return 0;
    for (size_t at = 0; at < bytes;) {
        size_t k = bytes - at < PIECE ? bytes - at : PIECE;
        MPI_Request r;
        int rc = MPI_Ibcast((char *)buf + at, (int)k, MPI_BYTE, root, c->mc, &r);
        if (rc != MPI_SUCCESS)
            return kvp_comm_mpi_error(err, rc, "broadcast");
        if ((rc = wait_until(c, &r, "broadcast", forever, 0, err)) < 0)
            return rc;
        at += k;
    }
    return 0;
}

int kvp_comm_bcast(kvp_comm *c, void *buf, size_t bytes, int root, kvp_err *err)
{
    return bcast(c, buf, bytes, root, 0, err);
}

int kvp_comm_bcast_idle(kvp_comm *c, void *buf, size_t bytes, int root, kvp_err *err)
{
    return bcast(c, buf, bytes, root, 1, err);
}

/* A send (to >= 0: the peer) or receive of bytes in pieces; an empty
 * message is still one message, so the peer's matching call completes. */
static int p2p(kvp_comm *c, void *buf, size_t bytes, int peer, int tag, int sending, kvp_err *err)
{
    const char *verb = sending ? "send" : "receive";
    if (peer < 0 || peer >= c->size || peer == c->rank)
        return kvp_err_set(err, KVP_EINVAL, "%s between rank %d and rank %d of %d", verb, c->rank, peer, c->size);
    char what[64];
    snprintf(what, sizeof what, "%s %s rank %d", verb, sending ? "to" : "from", peer);
    size_t at = 0;
    do {
        size_t k = bytes - at < PIECE ? bytes - at : PIECE;
        MPI_Request r;
        int rc = sending ? MPI_Isend((char *)buf + at, (int)k, MPI_BYTE, peer, tag, c->mc, &r)
                         : MPI_Irecv((char *)buf + at, (int)k, MPI_BYTE, peer, tag, c->mc, &r);
        if (rc != MPI_SUCCESS)
            return kvp_comm_mpi_error(err, rc, verb);
        if ((rc = wait_step(c, &r, what, err)) < 0)
            return rc;
        at += k;
    } while (at < bytes);
    return 0;
}

int kvp_comm_send(kvp_comm *c, const void *buf, size_t bytes, int dst, int tag, kvp_err *err)
{
    return p2p(c, (void *)(uintptr_t)buf, bytes, dst, tag, 1, err);
}

int kvp_comm_recv(kvp_comm *c, void *buf, size_t bytes, int src, int tag, kvp_err *err)
{
    return p2p(c, buf, bytes, src, tag, 0, err);
}

int kvp_comm_barrier(kvp_comm *c, kvp_err *err)
{
    if (c->size == 1)
        return 0;
    MPI_Request r;
    int rc = MPI_Ibarrier(c->mc, &r);
    if (rc != MPI_SUCCESS)
        return kvp_comm_mpi_error(err, rc, "barrier");
    return kvp_comm_wait(c, &r, "barrier", err);
}

void kvp_comm_abort(kvp_comm *c, int status)
{
    fflush(stdout);
    fflush(stderr);
    if (c && c->mc == MPI_COMM_NULL)
        exit(status);
    kvp_tmp_remove_all(); /* MPI_Abort runs no atexit */
    MPI_Abort(c ? c->mc : MPI_COMM_WORLD, status);
    exit(status);
}
#else
typedef int kvp_comm_mpi_absent; /* ISO C: a translation unit is never empty */
#endif
