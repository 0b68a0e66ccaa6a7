/* argmax.c - see argmax.h. */
#include "argmax.h"

#include <math.h>

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
