/* stopsig.h - SIGINT and SIGTERM as a request to stop, for the programs that
 * run a job of many requests (decode, specdec, prefill): the signal is
 * noted, the job stops admitting, finishes the step in progress, writes
 * what finished, says what was left (kvp_stopsig_say) and exits
 * kvp_stopsig_status().  A read waiting on a pipe or terminal returns at
 * once (kvp_in_interrupt_on), so a job waiting for input stops too.
 *
 * Program layer (like cli.h): it prints.  The flag is the one piece of
 * state a signal handler can reach; it lives here so that every program
 * stops the same way.
 */
#ifndef KVP_STOPSIG_H
#define KVP_STOPSIG_H

#include <signal.h>
#include <stdint.h>

/* While the model loads: SIGINT and SIGTERM are noted and the job stops
 * once the load is done, but the load is not cut short (SA_RESTART: its
 * opens and reads go on; kvp_in_interrupt_on is turned off, also where
 * kvp_stopsig_catch came first for a read before the load).  A load can
 * take long (a big model, a slow disk, a model path that is a FIFO), so a
 * second signal of the same kind ends the program at once by its default
 * action (SA_RESETHAND).  A signal ignored by whoever started us (nohup, a
 * background job's SIGINT) stays ignored. */
void kvp_stopsig_catch_loading(void);
/* From here on SIGINT and SIGTERM end the job after the step in progress,
 * and a wait for input at once: no SA_RESTART, and reads fail with
 * KVP_EINTR (kvp_in_interrupt_on), as does an open(2) that waits (a FIFO
 * no writer has opened).  Call it before any read that may wait. */
void kvp_stopsig_catch(void);
/* A rank that follows (--tp, --pp: every rank but 0): SIGINT and SIGTERM
 * are noted and nothing more (SA_RESTART, reads not cut short).  Rank 0
 * stops the job when it has the signal too, as a scheduler's stop (srun,
 * scancel, mpirun's forwarding) gives every rank: it finishes the step,
 * writes what finished and tells the ranks to end.  Dying of the signal,
 * a follower aborted the whole job and rank 0's outputs with it.  (One
 * that had the signal alone ends the job after a grace: comm_mpi.c's
 * follower_stop_check.) */
void kvp_stopsig_defer(void);
/* The flag the handlers set (the signal's number; 0 while none came), for
 * a loop that checks it between steps (kvp_batch_opts.stop). */
volatile sig_atomic_t *kvp_stopsig_flag(void);
/* The signal that asked the job to stop, or 0. */
int kvp_stopsig_caught(void);
/* The exit status of a stopped job: 128 + the signal (130 SIGINT, 143
 * SIGTERM), as a shell reports a process the signal ended. */
int kvp_stopsig_status(void);
/* "prog: stopped by SIGNAL: W sequences written, L read and not finished"
 * on stderr, then ", the rest of the input not read yet" unless read_all,
 * and "; run again with --resume RESUME" when resume is not NULL. */
void kvp_stopsig_say(uint64_t written, uint64_t left, int read_all, const char *resume);

#endif
