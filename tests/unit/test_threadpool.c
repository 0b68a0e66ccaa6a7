/* test_threadpool.c - every task runs exactly once per run, across many
 * back-to-back runs (late workers must not claim tasks of a later run); a
 * task that runs its own pool again trips the pool's assertion (test
 * builds have KVP_DEBUG). */
#include "unit.h"
#include "threadpool.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct ctx {
    atomic_int *hits;
    atomic_int threads_seen[8];
} ctx;

static void task(void *cp, int i, int thread)
{
    ctx *c = cp;
    atomic_fetch_add(&c->hits[i], 1);
    if (thread >= 0 && thread < 8)
        atomic_fetch_add(&c->threads_seen[thread], 1);
}

#if KVP_DEBUG
static kvp_threadpool *reentered;
static void noop(void *c, int i, int thread) { (void)c, (void)i, (void)thread; }
static void reenter(void *c, int i, int thread)
{
    (void)c, (void)thread;
    if (i == 0)
        kvp_threadpool_run(reentered, noop, NULL, 4);
}

/* In a child (forked before this process starts any thread): a reentrant
 * run must abort, not corrupt the run in progress or hang. */
static void test_reentry_asserts(void)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        kvp_err err;
        alarm(20);
        if (!freopen("/dev/null", "w", stderr) || kvp_threadpool_create(&reentered, 2, &err) < 0)
            _exit(3);
        kvp_threadpool_run(reentered, reenter, NULL, 4);
        _exit(0);
    }
    int st = 0;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
    CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "child status 0x%x", st);
}
#else
static void test_reentry_asserts(void) {}
#endif

int main(void)
{
    test_reentry_asserts();
    kvp_err err = {0};
    kvp_threadpool *p;
    int nt = unit_threads(4);
    CHECK(kvp_threadpool_create(&p, nt, &err) == 0);
    CHECK_EQ_I64(kvp_threadpool_size(p), nt);
    CHECK(kvp_threadpool_ncpu() >= 1);
    enum { N = 300 };
    ctx c = {0};
    c.hits = calloc(N, sizeof *c.hits);
    int bad = 0;
    for (int r = 0; r < 3000; r++) {
        int n = 1 + r % N;
        for (int i = 0; i < n; i++)
            atomic_store(&c.hits[i], 0);
        kvp_threadpool_run(p, task, &c, n);
        for (int i = 0; i < n; i++)
            bad += atomic_load(&c.hits[i]) != 1;
    }
    CHECK_EQ_I64(bad, 0);
    int used = 0;
    for (int t = 0; t < 8; t++)
        used += atomic_load(&c.threads_seen[t]) > 0;
    CHECK(used >= 1);
    kvp_threadpool_run(p, task, &c, 0); /* nothing */
    kvp_threadpool_run(NULL, task, &c, 3); /* inline */
    CHECK_EQ_I64(atomic_load(&c.hits[2]), 2);
    kvp_threadpool_free(p);
    CHECK(kvp_threadpool_create(&p, 2000, &err) == KVP_EINVAL);
    CHECK(kvp_threadpool_create(&p, 1, &err) == 0);
    kvp_threadpool_run(p, task, &c, 5);
    CHECK_EQ_I64(atomic_load(&c.hits[4]), 2);
    kvp_threadpool_free(p);
    free(c.hits);
    return unit_done();
}
