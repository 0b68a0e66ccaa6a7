/* specverify.c - speculative sampling's acceptance rule (specverify.h). */
#include "specverify.h"
#include "sample.h"

uint32_t kvp_spec_accept(const float *p, const float *q, uint32_t V, uint32_t x, double u_keep, double u_draw,
                         int *kept)
{
    /* keep with min(1, p/q): u * q < p avoids the division (q(x) > 0: x was drawn from q) */
    if (x < V && u_keep * q[x] < p[x]) {
        *kept = 1;
        return x;
    }
    *kept = 0;
    /* the residual max(0, p - q), drawn without building it: kvp_sample_from's walk */
    double sum = 0, acc = 0;
    uint32_t last = x < V ? x : 0;
    for (uint32_t i = 0; i < V; i++)
        if (p[i] > q[i])
            sum += (double)p[i] - q[i], last = i;
    if (!(sum > 0)) /* p == q to rounding: any refusal was rounding; p itself is right */
        return kvp_sample_from(p, V, u_draw);
    double r = u_draw * sum;
    for (uint32_t i = 0; i < V; i++)
        if (p[i] > q[i] && r < (acc += (double)p[i] - q[i]))
            return i;
    return last;
}

uint32_t kvp_spec_verify(const float *p, const float *q, uint32_t V, const uint32_t *draft, uint32_t nd,
                         kvp_sampling *gen, uint32_t *out)
{
    for (uint32_t j = 0; j < nd; j++) {
        int kept;
        double u_keep = kvp_sample_uniform(gen), u_draw = kvp_sample_uniform(gen);
        out[j] = kvp_spec_accept(p + (size_t)j * V, q + (size_t)j * V, V, draft[j], u_keep, u_draw, &kept);
        if (!kept)
            return j;
    }
    out[nd] = kvp_sample_from(p + (size_t)nd * V, V, kvp_sample_uniform(gen));
    return nd;
}

uint32_t kvp_spec_accept_wrong(const float *p, const float *q, uint32_t V, uint32_t x, double u_keep,
                               double u_draw, int *kept)
{
    *kept = x < V && u_keep * q[x] < p[x];
    return *kept ? x : kvp_sample_from(p, V, u_draw);
}
