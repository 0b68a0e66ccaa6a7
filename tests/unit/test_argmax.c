/* test_argmax.c - greedy's choice (lib/num/argmax.h) and the CPU backend's
 * argmax_rows, which must pick the same index on every row. */
#include "argmax.h"
#include "backend.h"
#include "backend_cpu.h"
#include "unit.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

/* The rule, written plainly: the lowest index holding the largest value
 * that is not NaN; 0 when every value is NaN. */
static uint32_t naive(const float *x, uint32_t n)
{
    uint32_t best = UINT32_MAX;
    for (uint32_t i = 0; i < n; i++)
        if (!isnan(x[i]) && (best == UINT32_MAX || x[i] > x[best]))
            best = i;
    return best == UINT32_MAX ? 0 : best;
}

static void test_rule(void)
{
    const float nan = NAN, inf = INFINITY;
    float ties[6] = {1, 3, 2, 3, -1, 0};
    CHECK_EQ_I64(kvp_argmax_f32(ties, 6), 1);
    float nans[5] = {nan, 2, nan, 5, nan};
    CHECK_EQ_I64(kvp_argmax_f32(nans, 5), 3);
    float all_nan[3] = {nan, nan, nan};
    CHECK_EQ_I64(kvp_argmax_f32(all_nan, 3), 0);
    float minus_inf[4] = {nan, -inf, -inf, nan};
    CHECK_EQ_I64(kvp_argmax_f32(minus_inf, 4), 1);
    float zeros[3] = {-1, -0.0f, 0.0f}; /* -0 and +0 are equal: the first */
    CHECK_EQ_I64(kvp_argmax_f32(zeros, 3), 1);
    float plus_inf[40];
    for (int i = 0; i < 40; i++)
        plus_inf[i] = (float)i;
    plus_inf[33] = inf, plus_inf[37] = inf; /* past the 16 lanes: the tail pass */
    CHECK_EQ_I64(kvp_argmax_f32(plus_inf, 40), 33);
    CHECK_EQ_I64(kvp_argmax_f32(plus_inf, 0), 0);
    /* random rows with repeated values, NaN and infinities against the
     * plain rule, at every length up to 70 (the 16-lane body and its tail) */
    uint64_t st = 7;
    float x[70];
    int bad = 0;
    for (int rep = 0; rep < 2000; rep++) {
        uint32_t n = 1 + (uint32_t)rep % 70;
        for (uint32_t i = 0; i < n; i++) {
            float r = (unit_frand(&st) + 1) / 2;
            x[i] = r < 0.05f ? nan : r < 0.08f ? -inf : r < 0.09f ? inf : (float)(int)(r * 8);
        }
        bad += kvp_argmax_f32(x, n) != naive(x, n);
    }
    CHECK_MSG(bad == 0, "%d random rows differ from the plain rule", bad);
}

/* The CPU backend's argmax_rows, its rows spread over threads, against the
 * rule row by row. */
static void test_rows(void)
{
    kvp_backend *be = NULL;
    kvp_err err = {0};
    if (kvp_backend_cpu_create(&be, unit_threads(2), 0, &err) < 0) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    enum { ROWS = 67, N = 1000 };
    float *x = malloc(sizeof(float) * ROWS * N);
    uint32_t ids[ROWS];
    uint64_t st = 11;
    for (size_t i = 0; i < (size_t)ROWS * N; i++)
        x[i] = (float)(int)(unit_frand(&st) * 1000) / 7; /* ties common */
    for (uint32_t r = 0; r < ROWS; r += 5)
        x[(size_t)r * N + r] = NAN;
    CHECK(be->ops->argmax_rows != NULL);
    CHECK(be->ops->argmax_rows(be, x, ROWS, N, ids, &err) == 0);
    int bad = 0;
    for (uint32_t r = 0; r < ROWS; r++)
        bad += ids[r] != naive(x + (size_t)r * N, N);
    CHECK_MSG(bad == 0, "%d of %d rows differ", bad, ROWS);
    CHECK(be->ops->argmax_rows(be, x, 0, N, ids, &err) == 0); /* no rows: nothing */
    free(x);
    kvp_backend_free(be);
}

/* The first non-finite value of a row: NaN, +inf or -inf at each place of
 * the 16-lane body and the tail, n when all are finite (the largest finite
 * values too). */
static void test_nonfinite(void)
{
    float x[70];
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    int wrong = 0;
    for (uint32_t n = 1; n <= 70; n++) {
        for (uint32_t i = 0; i < n; i++)
            x[i] = i % 2 ? FLT_MAX : -FLT_MAX;
        wrong += kvp_first_nonfinite_f32(x, n) != n;
        for (uint32_t at = 0; at < n; at++)
            for (int b = 0; b < 3; b++) {
                float keep = x[at];
                x[at] = bad[b];
                if (at + 1 < n)
                    x[n - 1] = bad[(b + 1) % 3]; /* a later one too: the first is named */
                wrong += kvp_first_nonfinite_f32(x, n) != at;
                x[at] = keep;
                x[n - 1] = (n - 1) % 2 ? FLT_MAX : -FLT_MAX;
            }
    }
    CHECK_MSG(wrong == 0, "%d rows gave the wrong first non-finite index", wrong);
    CHECK_EQ_U64(kvp_first_nonfinite_f32(x, 0), 0);
}

int main(void)
{
    test_nonfinite();
    test_rule();
    test_rows();
    return unit_done();
}
