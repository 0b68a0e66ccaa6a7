/* threadpool.h - one pool of worker threads for the CPU backend (--threads).
 *
 * The only primitive is a parallel for: kvp_threadpool_run(pool, fn, ctx, n)
 * calls fn(ctx, i, thread) for every i in [0, n), spread over the workers and
 * the calling thread, and returns when all are done.  A forward pass issues a
 * few hundred of these per token, so workers spin briefly before sleeping:
 * waking a sleeping thread costs tens of microseconds.
 */
#ifndef KVP_THREADPOOL_H
#define KVP_THREADPOOL_H

#include "error.h"

typedef struct kvp_threadpool kvp_threadpool;

/* fn(ctx, task index, thread index in [0, n_threads)). */
typedef void (*kvp_task_fn)(void *ctx, int task, int thread);

/* A pool of n_threads threads in all, the caller's included (so 1 starts no
 * thread).  n_threads <= 0 means the machine's online cores.  0 or a code. */
int kvp_threadpool_create(kvp_threadpool **pool, int n_threads, kvp_err *err);
void kvp_threadpool_free(kvp_threadpool *pool);
int kvp_threadpool_size(const kvp_threadpool *pool);
/* Run fn for tasks [0, n_tasks); tasks are handed out in order, one at a
 * time, so a task should be worth a few microseconds.  pool may be NULL
 * (runs inline).  Not reentrant: fn must not call run on the same pool. */
void kvp_threadpool_run(kvp_threadpool *pool, kvp_task_fn fn, void *ctx, int n_tasks);
/* Online cores of this machine (at least 1). */
int kvp_threadpool_ncpu(void);

#endif
