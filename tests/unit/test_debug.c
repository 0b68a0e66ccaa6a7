/* test_debug.c - KVP_ASSERT: in test builds (-DKVP_DEBUG=1: make check,
 * asan, tsan) a false condition prints file, line and the condition on
 * stderr and aborts; with KVP_DEBUG 0 (make) the condition is not even
 * evaluated. */
#include "unit.h"
#include "debug.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static const int debug_build = KVP_DEBUG;

/* The assertion as this build compiles it. */
static void assert_as_built(int cond) { KVP_ASSERT(cond); }
static const int assert_line = __LINE__ - 1;

/* The release definition, included again after the build's one. */
#undef KVP_DEBUG_H
#undef KVP_ASSERT
#undef KVP_DEBUG
#define KVP_DEBUG 0
#include "debug.h"

static int calls;
/* referenced only inside the released assertion, which never evaluates it */
__attribute__((unused)) static int counted(void) { return ++calls; }
static void assert_released(void) { KVP_ASSERT(counted() < 0); }

/* Run assert_as_built(0) in a child: its stderr and how it ended. */
static void failing_child(char *msg, size_t cap, int *signo)
{
    int fd[2];
    *signo = 0;
    msg[0] = 0;
    if (pipe(fd) != 0)
        return;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        assert_as_built(0);
        _exit(0);
    }
    close(fd[1]);
    size_t n = 0;
    ssize_t got;
    while (n + 1 < cap && (got = read(fd[0], msg + n, cap - 1 - n)) > 0)
        n += (size_t)got;
    msg[n] = 0;
    close(fd[0]);
    int st;
    if (pid > 0 && waitpid(pid, &st, 0) == pid && WIFSIGNALED(st))
        *signo = WTERMSIG(st);
}

int main(void)
{
    CHECK_MSG(debug_build, "the tests are built without -DKVP_DEBUG=1 (use make check)");
    assert_as_built(1); /* a true condition passes */
    if (debug_build) {
        char msg[512], want[64];
        int signo;
        failing_child(msg, sizeof msg, &signo);
        CHECK_EQ_I64(signo, SIGABRT);
        snprintf(want, sizeof want, "test_debug.c:%d: assertion failed: cond\n", assert_line);
        CHECK_MSG(strstr(msg, want) != NULL, "stderr: %s", msg);
    }
    assert_released();
    CHECK_EQ_I64(calls, 0);
    return unit_done();
}
