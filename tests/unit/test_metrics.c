/* test_metrics.c - the serving metrics' goodput rule: a failed request is
 * never good, whatever its times; a value a request does not have (TPOT
 * under 2 output tokens, TTFT with none) meets its bound; a value over its
 * bound does not; TPOT's definition; and a value no request gave reads
 * "-" in the text summary's rows and null in the JSON, never "nan"; and
 * percentiles as numpy's percentile gives them (vLLM's benchmark), for the
 * requests' exact values and the ITL histogram. */
#define _POSIX_C_SOURCE 200809L /* open_memstream */
#include "metrics.h"
#include "unit.h"

#include <math.h>

/* arrival 0, first token at 0.1 s, last at 0.1 + 0.01 (n - 1) s: TTFT 100 ms,
 * TPOT 10 ms */
static void add(kvp_metrics *m, uint32_t n_out, int failed)
{
    kvp_err err = {0};
    double t_first = n_out ? 0.1 : 0, t_last = n_out ? 0.1 + 0.01 * (n_out - 1) : 0;
    CHECK_EQ_I64(kvp_metrics_add_request(m, 0, t_first, t_last, n_out, failed, &err), 0);
}

static void test_failed_never_good(void)
{
    kvp_metrics m;
    kvp_metrics_init(&m, 100.0, 100.0); /* bounds nobody misses */
    add(&m, 5, 0);
    add(&m, 5, 1);
    add(&m, 0, 1);
    CHECK_EQ_U64(m.n, 3);
    CHECK_EQ_U64(m.good, 1);
    double gp = -1;
    CHECK(kvp_metrics_goodput(&m, &gp) == 1);
    CHECK_NEAR(gp, 1.0 / 3, 1e-12);
    kvp_metrics_free(&m);
    kvp_metrics_init(&m, 100.0, 100.0); /* no request: no share to give */
    gp = -1;
    CHECK(kvp_metrics_goodput(&m, &gp) == 0);
    CHECK(gp == -1);
    kvp_metrics_free(&m);
    kvp_metrics_init(&m, 0, 0); /* no bounds: still not good */
    add(&m, 5, 1);
    CHECK_EQ_U64(m.good, 0);
    kvp_metrics_free(&m);
}

static void test_undefined_meets(void)
{
    kvp_metrics m;
    kvp_metrics_init(&m, 0, 0.001); /* TPOT 1 ms: a 10 ms TPOT misses it */
    add(&m, 0, 0);                 /* max_tokens 0: no TTFT, no TPOT */
    add(&m, 1, 0);                 /* one token: no TPOT */
    add(&m, 3, 0);                 /* TPOT 10 ms: over */
    CHECK_EQ_U64(m.good, 2);
    kvp_dist d;
    kvp_metrics_tpot(&m, &d);
    CHECK_EQ_U64(d.n, 1);
    CHECK_NEAR(d.mean, 0.01, 1e-12);
    kvp_metrics_free(&m);
    kvp_metrics_init(&m, 0.05, 0); /* TTFT 50 ms: 100 ms misses it, none meets it */
    add(&m, 0, 0);
    add(&m, 2, 0);
    CHECK_EQ_U64(m.good, 1);
    kvp_metrics_free(&m);
}

/* kvp_dist_text's row for d, into buf. */
static void row(const kvp_dist *d, char *buf, size_t size)
{
    char *p = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&p, &n);
    CHECK(f != NULL);
    if (!f)
        return;
    kvp_dist_text(f, "TTFT", d);
    fclose(f);
    snprintf(buf, size, "%s", p);
    free(p);
}

static void test_no_value_text(void)
{
    kvp_metrics m;
    kvp_metrics_init(&m, 0, 0);
    kvp_dist d;
    char got[128];
    kvp_metrics_ttft(&m, &d); /* no request */
    row(&d, got, sizeof got);
    CHECK_STR(got, "TTFT         -        -        -        -\n");
    kvp_metrics_itl(&m, &d);
    row(&d, got, sizeof got);
    CHECK_STR(got, "TTFT         -        -        -        -\n");
    char *p = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&p, &n);
    CHECK(f != NULL);
    if (f) {
        kvp_dist_json(f, "ttft_ms", &d);
        fclose(f);
        CHECK_STR(p, "\"ttft_ms\":{\"n\":0,\"mean\":null,\"p50\":null,\"p90\":null,\"p99\":null,\"max\":null}");
        free(p);
    }
    add(&m, 1, 0); /* one token: a TTFT of 100 ms, no TPOT */
    kvp_metrics_ttft(&m, &d);
    row(&d, got, sizeof got);
    CHECK_STR(got, "TTFT    100.00   100.00   100.00   100.00\n");
    kvp_metrics_tpot(&m, &d);
    row(&d, got, sizeof got);
    CHECK_STR(got, "TTFT         -        -        -        -\n");
    kvp_metrics_free(&m);
}

/* numpy.percentile(range(1, 21), [50, 90, 99]) = 10.5, 18.1, 19.81; of
 * one value, that value; and the ITL histogram's, within its 1% buckets. */
static void test_percentiles_as_numpy(void)
{
    double v[20];
    for (int i = 0; i < 20; i++)
        v[i] = i + 1;
    CHECK_NEAR(kvp_percentile(v, 20, 50), 10.5, 1e-12);
    CHECK_NEAR(kvp_percentile(v, 20, 90), 18.1, 1e-12);
    CHECK_NEAR(kvp_percentile(v, 20, 99), 19.81, 1e-12);
    CHECK_NEAR(kvp_percentile(v, 20, 100), 20, 0);
    CHECK_NEAR(kvp_percentile(v, 20, 0), 1, 0);
    CHECK_NEAR(kvp_percentile(v, 1, 99), 1, 0);
    CHECK(isnan(kvp_percentile(v, 0, 50)));
    /* numpy.percentile([10] * 50 + [20] * 50, [50, 99]) = 15, 20; 30 and
     * 40 alone, 30 */
    kvp_metrics m;
    kvp_metrics_init(&m, 0, 0);
    for (int i = 0; i < 100; i++)
        kvp_metrics_add_itl(&m, i < 50 ? 0.010 : 0.020);
    kvp_dist d;
    kvp_metrics_itl(&m, &d);
    CHECK_NEAR(d.p50, 0.015, 0.015 * 0.01);
    CHECK_NEAR(d.p99, 0.020, 0.020 * 0.01);
    CHECK_NEAR(d.max, 0.020, 0.020 * 0.01);
    kvp_metrics_free(&m);
    kvp_metrics_init(&m, 0, 0);
    kvp_metrics_add_itl(&m, 0.030);
    kvp_metrics_add_itl(&m, 0.040);
    kvp_metrics_itl(&m, &d);
    CHECK_NEAR(d.p50, 0.035, 0.035 * 0.01);
    kvp_metrics_free(&m);
}

int main(void)
{
    test_percentiles_as_numpy();
    test_failed_never_good();
    test_undefined_meets();
    test_no_value_text();
    printf("%d passed, %d failed\n", unit_passed, unit_failed);
    return unit_failed != 0;
}
