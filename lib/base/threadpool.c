/* threadpool.c - spin-then-sleep worker pool.
 *
 * A run is published as one 64-bit ticket: generation (24 bits), task count
 * (20 bits) and next task index (20 bits).  Threads claim tasks by
 * compare-and-swap on the ticket, so a worker that wakes late (descheduled on
 * a busy machine) can never claim a task of a later run, and the caller
 * waits only for the tasks to be done, not for every worker to check in.
 */
#include "threadpool.h"
#include "debug.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

/* How many polls a worker makes before it sleeps on the condition variable:
 * long enough to cover the gap between two ops of one forward pass. */
#define KVP_POOL_SPIN 20000
#define TASK_BITS 20
#define TASK_MASK ((1u << TASK_BITS) - 1)
#define MAX_TASKS TASK_MASK

struct kvp_threadpool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    atomic_uint gen;            /* run generation (low 24 bits used) */
    _Atomic uint64_t ticket;    /* gen << 40 | n_tasks << 20 | next index */
    atomic_int done;            /* tasks finished in the current run */
    atomic_int stop;
    atomic_int running;         /* a run is in progress (run is not reentrant) */
    kvp_task_fn fn;             /* valid while the run's tasks are unclaimed */
    void *ctx;
};

typedef struct worker_arg {
    kvp_threadpool *pool;
    int index;
} worker_arg;

static uint64_t make_ticket(unsigned gen, unsigned n) { return (uint64_t)(gen & 0xffffffu) << 40 | (uint64_t)n << TASK_BITS; }

/* Claim and run tasks of generation gen until none is left. */
static void drain(kvp_threadpool *p, unsigned gen, int thread)
{
    uint64_t t = atomic_load_explicit(&p->ticket, memory_order_acquire);
    for (;;) {
        if ((unsigned)(t >> 40) != (gen & 0xffffffu))
            return;
        unsigned n = (unsigned)(t >> TASK_BITS) & TASK_MASK, i = (unsigned)t & TASK_MASK;
        if (i >= n)
            return;
        if (atomic_compare_exchange_weak_explicit(&p->ticket, &t, t + 1, memory_order_acq_rel,
                                                  memory_order_acquire)) {
            /* Task i of gen is unfinished, so fn and ctx are still this run's. */
            p->fn(p->ctx, (int)i, thread);
            int done = atomic_fetch_add_explicit(&p->done, 1, memory_order_release) + 1;
            KVP_ASSERT(done <= (int)n); /* each task of the run claimed once */
            t = atomic_load_explicit(&p->ticket, memory_order_acquire);
        }
    }
}

static void *worker_main(void *argp)
{
    worker_arg *a = argp;
    kvp_threadpool *p = a->pool;
    int index = a->index;
    free(a);
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen && !atomic_load(&p->stop)) {
            if (++spins < KVP_POOL_SPIN) {
#if defined(__x86_64__) || defined(__i386__)
                __builtin_ia32_pause();
#endif
                continue;
            }
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->wake, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop))
            return NULL;
        seen = g;
        drain(p, g, index);
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
    p->n_threads = 1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    atomic_init(&p->gen, 0);
    atomic_init(&p->ticket, make_ticket(0, 0));
    atomic_init(&p->done, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->running, 0);
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
                kvp_threadpool_free(p); /* joins the p->n_threads - 1 started so far */
                return kvp_err_set(err, KVP_ENOMEM, "threads: cannot start thread %d of %d", i, n_threads);
            }
            p->n_threads = i + 1;
        }
    }
    *pool = p;
    return 0;
}

void kvp_threadpool_free(kvp_threadpool *p)
{
    if (!p)
        return;
    KVP_ASSERT(!atomic_load(&p->running)); /* not freed from inside a task */
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

static void run_inline(kvp_task_fn fn, void *ctx, int n_tasks)
{
    for (int i = 0; i < n_tasks; i++)
        fn(ctx, i, 0);
}

void kvp_threadpool_run(kvp_threadpool *p, kvp_task_fn fn, void *ctx, int n_tasks)
{
    if (n_tasks <= 0)
        return;
    if (!p || p->n_threads == 1 || n_tasks == 1) {
        run_inline(fn, ctx, n_tasks);
        return;
    }
    int was_running = atomic_exchange(&p->running, 1);
    KVP_ASSERT(!was_running); /* fn called run on its own pool, or two threads share one */
    /* Larger runs go out in slices that fit the ticket's task field. */
    for (int base = 0; base < n_tasks; base += MAX_TASKS) {
        int n = n_tasks - base < (int)MAX_TASKS ? n_tasks - base : (int)MAX_TASKS;
        if (base) { /* rare: a slice runs inline rather than remap indices */
            for (int i = 0; i < n; i++)
                fn(ctx, base + i, 0);
            continue;
        }
        unsigned g = atomic_load_explicit(&p->gen, memory_order_relaxed) + 1;
        p->fn = fn;
        p->ctx = ctx;
        atomic_store_explicit(&p->done, 0, memory_order_relaxed);
        atomic_store_explicit(&p->ticket, make_ticket(g, (unsigned)n), memory_order_release);
        /* The lock orders the bump against a worker deciding to sleep. */
        pthread_mutex_lock(&p->mu);
        atomic_store_explicit(&p->gen, g, memory_order_release);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
        drain(p, g, 0);
        int spins = 0;
        while (atomic_load_explicit(&p->done, memory_order_acquire) != n) {
            if (++spins > 1000)
                sched_yield();
#if defined(__x86_64__) || defined(__i386__)
            else
                __builtin_ia32_pause();
#endif
        }
    }
    atomic_store(&p->running, 0);
}
