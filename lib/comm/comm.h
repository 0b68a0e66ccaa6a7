/* comm.h - collectives between the processes of one job (MPI), for tensor
 * and pipeline parallelism and for tpbench.
 *
 * No home-made transport: a kvp_comm is an MPI communicator.  A build
 * without MPI (the Makefile finds it through pkg-config or mpicc; KVP_HAVE_MPI)
 * still has this interface: the world is one process, every collective over
 * one rank is the identity, and asking for more ranks fails with a message
 * that says what to install.
 *
 * Every blocking operation waits with a deadline (the job's timeout,
 * kvp_comm_set_timeout): a rank that died or hangs makes the others fail
 * with "rank 1: all_reduce of 2304 floats waited 120 s for its peers" and
 * abort the whole job (MPI_Abort) instead of hanging a cron job forever.
 * Operations return 0 or a negative KVP_E* code with a message; a timeout
 * aborts and does not return, and so does a wait of world rank 0 that goes
 * on half a second after a stop signal (stopsig.h): the job cannot stop in
 * order, and its temporary outputs are removed before the launcher's kill.
 *
 * Threads: only the thread that called kvp_comm_world may call these.
 */
#ifndef KVP_COMM_H
#define KVP_COMM_H

#include "error.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kvp_comm kvp_comm;

/* Whether this build has MPI (1) or only the one-process stand-in (0). */
int kvp_comm_have_mpi(void);

/* Whether this process was started by a launcher with more than one rank
 * (mpirun, mpiexec, srun: their environment variables), so a program can
 * tell "run alone" from "one of N" before initializing MPI. */
int kvp_comm_launched_size(void);
/* The same from an MPI launcher's own variables alone (mpirun, mpiexec:
 * OMPI_COMM_WORLD_SIZE, PMI_SIZE), not Slurm's, whose job-wide task count
 * a batch script's own commands see too; 1 when none is set. */
int kvp_comm_mpi_launched_size(void);
/* Whether an MPI launcher (mpirun, mpiexec) started this process, with
 * any number of ranks: OpenMPI's connects a rank's standard output to a
 * pseudo-terminal whatever mpirun's own is, so isatty says nothing of
 * where the output goes. */
int kvp_comm_mpi_launched(void);

/* Initialize MPI once (later calls return the same world) and return the
 * world communicator.  A process started without a launcher, or a build
 * without MPI, gets a world of one and MPI is never started.  0 or a code. */
int kvp_comm_world(kvp_comm **world, kvp_err *err);

/* Finalize MPI after the last collective (frees every communicator). */
void kvp_comm_finalize(void);

/* Seconds any blocking operation waits for its peers (default 300). */
void kvp_comm_set_timeout(double seconds);
double kvp_comm_timeout(void);

int kvp_comm_rank(const kvp_comm *c);
int kvp_comm_size(const kvp_comm *c);

/* A sub-communicator: ranks with the same color, ordered by key (MPI_Comm_split).
 * Every rank of c must call it.  0 or a code. */
int kvp_comm_split(kvp_comm *c, int color, int key, kvp_comm **out, kvp_err *err);
void kvp_comm_free(kvp_comm *c);

/* x[n] = sum over ranks of x[n], in place (f32).  0 or a code. */
int kvp_comm_allreduce_f32(kvp_comm *c, float *x, size_t n, kvp_err *err);
/* recv[rank * bytes ..] = each rank's send[bytes]; recv holds size * bytes. */
int kvp_comm_allgather(kvp_comm *c, const void *send, void *recv, size_t bytes, kvp_err *err);
/* Rank root's buf[bytes] to every rank. */
int kvp_comm_bcast(kvp_comm *c, void *buf, size_t bytes, int root, kvp_err *err);
/* The same, waiting with no deadline: a rank waiting for its next order
 * while rank root waits on its own input (a pipe that is slow to fill). */
int kvp_comm_bcast_idle(kvp_comm *c, void *buf, size_t bytes, int root, kvp_err *err);
/* Point to point, matched by tag.  bytes must equal on both sides. */
int kvp_comm_send(kvp_comm *c, const void *buf, size_t bytes, int dst, int tag, kvp_err *err);
int kvp_comm_recv(kvp_comm *c, void *buf, size_t bytes, int src, int tag, kvp_err *err);
int kvp_comm_barrier(kvp_comm *c, kvp_err *err);

/* End the whole job now with this exit status (after printing why). */
void kvp_comm_abort(kvp_comm *c, int status);

/* The MPI communicator handle (MPI_Comm) for code that calls MPI itself
 * (tpbench's collectives), or NULL without MPI. */
void *kvp_comm_handle(kvp_comm *c);

/* KVP_EIO with "what: MPI's text for error code rc" (for code calling MPI
 * itself).  Returns KVP_EIO. */
int kvp_comm_mpi_error(kvp_err *err, int rc, const char *what);

/* Wait for an MPI request (MPI_Request *) with the job's deadline: 0 when
 * complete; on timeout prints "rank R: WHAT waited S s for its peers" and
 * aborts the job.  Only with MPI. */
int kvp_comm_wait(kvp_comm *c, void *request, const char *what, kvp_err *err);

/* Seconds rank 0, asked to stop (SIGINT, SIGTERM), waits in one collective
 * before it takes a peer for dead and aborts the job: half a second (a
 * live job answers within a layer's share of a step; mpirun kills every
 * rank one second after one dies), or twice the longest wait on its peers
 * it has seen complete (longest_s: a pipeline's later stages taking their
 * share of a long step), whichever is more. */
double kvp_comm_stop_grace(double longest_s);
/* The job's setup is over (its ranks agreed on the model after loading
 * it): the waits timed so far, a slower rank's model load, say nothing of
 * a step and are forgotten. */
void kvp_comm_setup_done(void);

#endif
