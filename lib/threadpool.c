/* threadpool.c - spin-then-sleep worker pool with an atomic task counter. */
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

/* How many polls a worker makes before it sleeps on the condition variable:
 * long enough to cover the gap between two ops of one forward pass. */
#define KVP_POOL_SPIN 20000

struct kvp_threadpool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    atomic_uint_fast64_t generation; /* bumped for each run; workers wait for a change */
    atomic_int next_task;
    atomic_int pending;              /* workers still inside the current run */
    atomic_int stop;
    kvp_task_fn fn;
    void *ctx;
    int n_tasks;
};

typedef struct worker_arg {
    kvp_threadpool *pool;
    int index;
} worker_arg;

static void drain(kvp_threadpool *p, int thread)
{
    for (;;) {
        int i = atomic_fetch_add_explicit(&p->next_task, 1, memory_order_relaxed);
        if (i >= p->n_tasks)
            break;
        p->fn(p->ctx, i, thread);
    }
}

static void *worker_main(void *argp)
{
    worker_arg *a = argp;
    kvp_threadpool *p = a->pool;
    int index = a->index;
    free(a);
    uint_fast64_t seen = 0;
    for (;;) {
        uint_fast64_t g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen &&
               !atomic_load(&p->stop)) {
            if (++spins < KVP_POOL_SPIN) {
#if defined(__x86_64__) || defined(__i386__)
                __builtin_ia32_pause();
#endif
                continue;
            }
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->wake, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop))
            return NULL;
        seen = g;
        drain(p, index);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel);
    }
}

int kvp_threadpool_ncpu(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int kvp_threadpool_create(kvp_threadpool **pool, int n_threads, kvp_err *err)
{
    *pool = NULL;
    if (n_threads <= 0)
        n_threads = kvp_threadpool_ncpu();
    if (n_threads > 1024)
        return kvp_err_set(err, KVP_EINVAL, "threads: %d is more than 1024", n_threads);
    kvp_threadpool *p = calloc(1, sizeof *p);
    if (!p)
        return kvp_err_set(err, KVP_ENOMEM, "threads: out of memory");
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    atomic_init(&p->generation, 0);
    atomic_init(&p->next_task, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->stop, 0);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        if (!p->threads) {
            kvp_threadpool_free(p);
            return kvp_err_set(err, KVP_ENOMEM, "threads: out of memory");
        }
        for (int i = 1; i < n_threads; i++) {
            worker_arg *a = malloc(sizeof *a);
            if (a) {
                a->pool = p;
                a->index = i;
            }
            if (!a || pthread_create(&p->threads[i - 1], NULL, worker_main, a) != 0) {
                free(a);
                p->n_threads = i; /* only i-1 workers exist: free joins those */
                kvp_threadpool_free(p);
                return kvp_err_set(err, KVP_ENOMEM, "threads: cannot start thread %d of %d", i, n_threads);
            }
        }
    }
    *pool = p;
    return 0;
}

void kvp_threadpool_free(kvp_threadpool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++)
        pthread_join(p->threads[i - 1], NULL);
    free(p->threads);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    free(p);
}

int kvp_threadpool_size(const kvp_threadpool *p) { return p ? p->n_threads : 1; }

void kvp_threadpool_run(kvp_threadpool *p, kvp_task_fn fn, void *ctx, int n_tasks)
{
    if (n_tasks <= 0)
        return;
    if (!p || p->n_threads == 1 || n_tasks == 1) {
        for (int i = 0; i < n_tasks; i++)
            fn(ctx, i, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->next_task, 0, memory_order_relaxed);
    atomic_store_explicit(&p->pending, p->n_threads - 1, memory_order_relaxed);
    /* The lock orders the bump against a worker deciding to sleep. */
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    drain(p, 0);
    int spins = 0;
    while (atomic_load_explicit(&p->pending, memory_order_acquire) != 0) {
        if (++spins > 1000)
            sched_yield();
#if defined(__x86_64__) || defined(__i386__)
        else
            __builtin_ia32_pause();
#endif
    }
}
