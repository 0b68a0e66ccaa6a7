/* test_sample.c - greedy, penalties, filters, reproducible seeded draws. */
#include "unit.h"
#include "sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const float *ref_logits;
static int ref_cmp(const void *a, const void *b) /* logit down, id up */
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    if (ref_logits[x] != ref_logits[y])
        return ref_logits[x] > ref_logits[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Top-p keeps the smallest prefix of the whole vocabulary sorted (logit
 * down, id up) whose share reaches p: the same set whether the sampler
 * sorts everything or selects and sorts the first 256, 1024, ... until
 * the sum reaches p.  Logits of few values (many ties), a flat row (the
 * prefix past the first rounds), one peak. */
static void test_top_p_prefix(void)
{
    enum { N = 5000 };
    static float lg[N], tmp[N], pr[N];
    static uint32_t idx[N];
    uint64_t rng = 7;
    const float ps[] = {0.01f, 0.3f, 0.9f, 0.999f, 0.9999999f};
    int wrong = 0;
    for (int shape = 0; shape < 3; shape++) {
        for (uint32_t i = 0; i < N; i++) {
            float u = unit_frand(&rng);
            lg[i] = shape == 0 ? floorf(u * 8) : shape == 1 ? u * 0.01f : (i == 17 ? 30.0f : u);
            idx[i] = i;
        }
        ref_logits = lg;
        qsort(idx, N, sizeof *idx, ref_cmp);
        float mx = lg[idx[0]];
        double mass = 0;
        for (uint32_t i = 0; i < N; i++)
            mass += exp((double)lg[i] - mx);
        for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) {
            uint32_t keep = N;
            double cum = 0;
            for (uint32_t i = 0; i < N; i++) {
                cum += exp((double)lg[idx[i]] - mx) / mass;
                if (cum >= ps[k]) {
                    keep = i + 1;
                    break;
                }
            }
            kvp_sampling s;
            kvp_err err = {0};
            kvp_sample_defaults(&s);
            s.temperature = 1;
            s.top_p = ps[k];
            memcpy(tmp, lg, sizeof lg);
            if (kvp_sample_probs(&s, tmp, N, NULL, 0, pr, &err) < 0) {
                wrong++;
                continue;
            }
            uint32_t nz = 0;
            for (uint32_t i = 0; i < N; i++)
                nz += pr[i] > 0;
            int same = nz == keep;
            for (uint32_t i = 0; same && i < keep; i++)
                same = pr[idx[i]] > 0;
            wrong += !same;
            CHECK_MSG(same, "shape %d, top-p %g: %u kept, the sorted prefix is %u", shape, ps[k], nz, keep);
        }
    }
    CHECK(wrong == 0);
}

int main(void)
{
    test_top_p_prefix();
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
    /* top-k at or past the vocabulary keeps everything: no filter, the
     * same draws as top-k 0 from the same seed (it had sorted the whole
     * vocabulary each token, walking it in another order) */
    for (int k = 6; k <= 7; k++) {
        kvp_sampling a, b;
        kvp_sample_defaults(&a);
        a.temperature = b.temperature = 1;
        kvp_sample_seed(&a, 3);
        b = a;
        b.top_k = k;
        int differ = 0;
        for (int i = 0; i < 50; i++) {
            memcpy(tmp, lg, sizeof lg);
            int x = kvp_sample_next(&a, tmp, 6, NULL, 0, &err);
            memcpy(tmp, lg, sizeof lg);
            differ += x != kvp_sample_next(&b, tmp, 6, NULL, 0, &err);
        }
        CHECK_MSG(differ == 0, "top-k %d: %d of 50 draws differ from top-k 0", k, differ);
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
