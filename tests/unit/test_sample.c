/* test_sample.c - greedy, penalties, filters, reproducible seeded draws. */
#include "unit.h"
#include "sample.h"

#include <math.h>
#include <string.h>

int main(void)
{
    kvp_err err = {0};
    kvp_sampling s;
    kvp_sample_defaults(&s);
    CHECK(kvp_sample_check(&s, &err) == 0);
    float lg[6] = {1, 3, 2, 3, -1, 0};
    float tmp[6];
    /* greedy: argmax, the lowest id on a tie */
    memcpy(tmp, lg, sizeof lg);
    CHECK_EQ_I64(kvp_sample_next(&s, tmp, 6, NULL, 0, &err), 1);
    /* repetition penalty divides positive logits, multiplies negative ones */
    s.repeat_penalty = 2;
    uint32_t recent[] = {1, 1, 4};
    memcpy(tmp, lg, sizeof lg);
    CHECK_EQ_I64(kvp_sample_next(&s, tmp, 6, recent, 3, &err), 3);
    CHECK_NEAR(tmp[1], 1.5, 1e-6); /* once, though it appears twice */
    CHECK_NEAR(tmp[4], -2, 1e-6);

    /* top-k 1 is greedy whatever the temperature */
    kvp_sample_defaults(&s);
    s.temperature = 5;
    s.top_k = 1;
    kvp_sample_seed(&s, 0);
    for (int i = 0; i < 20; i++) {
        memcpy(tmp, lg, sizeof lg);
        CHECK_EQ_I64(kvp_sample_next(&s, tmp, 6, NULL, 0, &err), 1);
    }
    /* top-p: only tokens inside the nucleus are ever drawn */
    float peaked[4] = {10, 9.5f, 0, -5};
    kvp_sample_defaults(&s);
    s.temperature = 1;
    s.top_p = 0.5f;
    kvp_sample_seed(&s, 1);
    int seen[4] = {0};
    for (int i = 0; i < 200; i++) {
        memcpy(tmp, peaked, sizeof peaked);
        int t = kvp_sample_next(&s, tmp, 4, NULL, 0, &err);
        CHECK(t >= 0 && t < 4);
        if (t >= 0 && t < 4)
            seen[t]++;
    }
    CHECK_EQ_I64(seen[0], 200); /* p(0) = 0.62 >= 0.5 */
    /* min-p 0.1 keeps 0 and 1 (p1/p0 = 0.61), never 2 or 3 */
    s.top_p = 1;
    s.min_p = 0.1f;
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < 400; i++) {
        memcpy(tmp, peaked, sizeof peaked);
        int t = kvp_sample_next(&s, tmp, 4, NULL, 0, &err);
        if (t >= 0 && t < 4)
            seen[t]++;
    }
    CHECK(seen[0] > 150 && seen[1] > 100 && seen[2] == 0 && seen[3] == 0);
    /* plain temperature 1 draws match the softmax frequencies */
    kvp_sample_defaults(&s);
    s.temperature = 1;
    s.seed = 42;
    kvp_sample_seed(&s, 7);
    float two[2] = {0, (float)log(3.0)}; /* p = 1/4, 3/4 */
    int ones = 0;
    for (int i = 0; i < 4000; i++) {
        memcpy(tmp, two, sizeof two);
        ones += kvp_sample_next(&s, tmp, 2, NULL, 0, &err) == 1;
    }
    CHECK_MSG(ones > 2850 && ones < 3150, "%d of 4000", ones);
    /* same seed and sequence id: the same stream; another id: another */
    kvp_sampling a, b, c;
    kvp_sample_defaults(&a);
    a.seed = 5;
    b = a, c = a;
    kvp_sample_seed(&a, 3);
    kvp_sample_seed(&b, 3);
    kvp_sample_seed(&c, 4);
    CHECK(kvp_sample_uniform(&a) == kvp_sample_uniform(&b));
    CHECK(kvp_sample_uniform(&a) != kvp_sample_uniform(&c));
    /* the state alone continues the stream (what a KVP record carries) */
    kvp_sampling d = a;
    double x = kvp_sample_uniform(&a);
    CHECK(kvp_sample_uniform(&d) == x);
    for (int i = 0; i < 1000; i++) {
        double u = kvp_sample_uniform(&a);
        CHECK(u >= 0 && u < 1);
    }
    /* bad parameters */
    kvp_sample_defaults(&s);
    s.top_p = 0;
    CHECK_EQ_I64(kvp_sample_check(&s, &err), KVP_EINVAL);
    CHECK(strstr(err.msg, "top-p") != NULL);
    s.top_p = 1;
    s.temperature = -1;
    CHECK_EQ_I64(kvp_sample_check(&s, &err), KVP_EINVAL);
    return unit_done();
}
