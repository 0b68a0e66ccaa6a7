/* unit.h - the unit-test helper: assertions that report file, line and the
 * expression, and a closing "N passed, N failed" line that tests/run sums. */
#ifndef KVP_UNIT_H
#define KVP_UNIT_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int unit_passed, unit_failed;

#define CHECK(expr)                                                                                \
    do {                                                                                           \
        if (expr) {                                                                                \
            unit_passed++;                                                                         \
        } else {                                                                                   \
            unit_failed++;                                                                         \
            printf("%s:%d: FAIL: %s\n", __FILE__, __LINE__, #expr);                                \
        }                                                                                          \
    } while (0)

#define CHECK_MSG(expr, ...)                                                                       \
    do {                                                                                           \
        if (expr) {                                                                                \
            unit_passed++;                                                                         \
        } else {                                                                                   \
            unit_failed++;                                                                         \
            printf("%s:%d: FAIL: %s: ", __FILE__, __LINE__, #expr);                                \
            printf(__VA_ARGS__);                                                                   \
            putchar('\n');                                                                         \
        }                                                                                          \
    } while (0)

#define CHECK_EQ_U64(a, b)                                                                         \
    do {                                                                                           \
        uint64_t a_ = (uint64_t)(a), b_ = (uint64_t)(b);                                           \
        CHECK_MSG(a_ == b_, "%" PRIu64 " != %" PRIu64 " (0x%" PRIx64 " vs 0x%" PRIx64 ")", a_, b_, \
                  a_, b_);                                                                         \
    } while (0)

#define CHECK_EQ_I64(a, b)                                                                         \
    do {                                                                                           \
        int64_t a_ = (int64_t)(a), b_ = (int64_t)(b);                                              \
        CHECK_MSG(a_ == b_, "%" PRId64 " != %" PRId64, a_, b_);                                    \
    } while (0)

#define CHECK_STR(a, b)                                                                            \
    do {                                                                                           \
        const char *a_ = (a), *b_ = (b);                                                           \
        CHECK_MSG(a_ && b_ && strcmp(a_, b_) == 0, "\"%s\" != \"%s\"", a_ ? a_ : "(null)",         \
                  b_ ? b_ : "(null)");                                                             \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                                      \
    do {                                                                                           \
        double a_ = (double)(a), b_ = (double)(b);                                                 \
        CHECK_MSG(a_ - b_ <= (tol) && b_ - a_ <= (tol), "%.9g != %.9g (tol %g)", a_, b_,          \
                  (double)(tol));                                                                  \
    } while (0)

/* The real test model, SmolLM2-135M-Instruct Q4_1.  tests/run exports
 * KVP_MODEL (where scripts/fetch-model puts it); run by hand, the same rule:
 * $KVPIPE_MODELS, else ~/.cache/kvpipe.  Tests that need it skip when absent. */
static inline const char *unit_model_path(void)
{
    static char buf[4096];
    const char *p = getenv("KVP_MODEL"), *dir = getenv("KVPIPE_MODELS"), *home = getenv("HOME");
    if (p && *p)
        return p;
    if (dir && *dir)
        snprintf(buf, sizeof buf, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", dir);
    else
        snprintf(buf, sizeof buf, "%s/.cache/kvpipe/SmolLM2-135M-Instruct.Q4_1.gguf", home ? home : ".");
    return buf;
}

/* Threads for a test's pool: $KVP_TEST_THREADS when set (make tsan runs
 * the tests at 2 and at 4), else dflt (0: every core). */
static inline int unit_threads(int dflt)
{
    const char *s = getenv("KVP_TEST_THREADS");
    int n = s && *s ? atoi(s) : dflt;
    return n > 0 && n <= 1024 ? n : dflt;
}

/* Index of the largest of x[0..n) (the first on ties): greedy decoding. */
static inline uint32_t unit_argmax(const float *x, uint32_t n)
{
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        b = x[i] > x[b] ? i : b;
    return b;
}

/* xorshift64 step of *state: uniform in [-1, 1).  Each test keeps its own
 * state, so its random data does not depend on the other tests. */
static inline float unit_frand(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (float)((*state >> 40) * (2.0 / (1ull << 24)) - 1.0);
}

/* An environment assignment for the ranks a test starts under mpirun
 * (make asan): full stacks for every allocation, so LeakSanitizer's
 * suppressions (tests/lsan.supp, which the Makefile passes) reach OpenMPI's
 * libraries behind the components it unloads before the report.  The rest
 * of ASAN_OPTIONS stays.  Empty when ASAN_OPTIONS is not set. */
static inline const char *unit_mpi_asan(void)
{
    static char buf[1024];
    const char *a = getenv("ASAN_OPTIONS");
    if (!a || !*a)
        return "";
    snprintf(buf, sizeof buf, "ASAN_OPTIONS='%s:fast_unwind_on_malloc=0'", a);
    return buf;
}

/* Run this test binary again as n ranks under mpirun with args (quoted by
 * the caller), as root on few cores if need be; every line a rank prints
 * that is not "rank ok" is shown with tag.  Checks that mpirun exits 0 and
 * that all n ranks said "rank ok". */
static inline void unit_mpirun(const char *self, int n, const char *args, const char *tag)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
             "OMPI_MCA_rmaps_base_oversubscribe=1 %s mpirun -np %d '%s' %s 2>&1", unit_mpi_asan(), n, self, args);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    if (!p)
        return;
    char line[1024];
    int ok = 0;
    while (fgets(line, sizeof line, p)) {
        if (strcmp(line, "rank ok\n") == 0)
            ok++;
        else
            printf("  %s: %s", tag, line);
    }
    int rc = pclose(p);
    CHECK_MSG(rc == 0 && ok == n, "mpirun -np %d: exit %d, %d of %d ranks passed", n, rc, ok, n);
}

/* Closing line; the exit status tells make whether anything failed. */
static inline int unit_done(void)
{
    printf("%d passed, %d failed\n", unit_passed, unit_failed);
    return unit_failed ? 1 : 0;
}

#endif
