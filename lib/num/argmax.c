/* argmax.c - see argmax.h. */
#include "argmax.h"

#include <math.h>
#include <string.h>

/* The exponent bits all set: NaN or an infinity.  One OR over 16 lanes
 * the compiler vectorizes, then the index only when one is there. */
size_t kvp_first_nonfinite_f32(const float *x, size_t n)
{
    size_t i = 0;
    uint32_t any = 0;
    for (; i + 16 <= n; i += 16) {
        uint32_t u[16];
        memcpy(u, x + i, sizeof u);
        for (int k = 0; k < 16; k++)
            any |= (uint32_t)((u[k] & 0x7f800000u) == 0x7f800000u);
    }
    for (size_t j = i; j < n; j++)
        any |= !isfinite(x[j]);
    if (!any)
        return n;
    for (i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return i;
    return n;
}

/* Two passes, the first over 16 independent lanes the compiler turns into
 * vector max instructions (a 49,152-entry row a sequence, every step). */
uint32_t kvp_argmax_f32(const float *x, uint32_t n)
{
    float lane[16];
    for (int k = 0; k < 16; k++)
        lane[k] = -INFINITY;
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; k++)
            lane[k] = x[i + k] > lane[k] ? x[i + k] : lane[k];
    float best = -INFINITY;
    for (int k = 0; k < 16; k++)
        best = lane[k] > best ? lane[k] : best;
    for (; i < n; i++)
        best = x[i] > best ? x[i] : best;
    for (i = 0; i < n; i++)
        if (x[i] == best)
            return i;
    return 0;
}
