/* bench.h - what the benchmark programs of tests/bench share: a monotonic
 * clock and reproducible random numbers (splitmix64). */
#ifndef KVP_BENCH_H
#define KVP_BENCH_H

#include <stdint.h>
#include <time.h>

static inline double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline uint64_t bench_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [-1, 1], in steps of 1/1000 */
static inline float bench_frand(uint64_t *s) { return (float)((int)(bench_next(s) % 2001) - 1000) / 1000.0f; }

#endif
