/* cpufeat.c - what this CPU can run (see cpufeat.h). */
#include "cpufeat.h"

#include <stdatomic.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
/* F16C from CPUID leaf 1 (ECX bit 29): clang before 15 does not know
 * __builtin_cpu_supports("f16c"), and the fuzz build uses clang. */
static int cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

int kvp_have_avx2(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    /* Asked once: CPUID traps to the hypervisor in a VM (microseconds), and
     * row casts ask on every call (once a token, layer and head for the KV
     * cache: it halved prompt speed).  Threads racing here store the same
     * value. */
    static _Atomic int have = -1;
    int h = atomic_load_explicit(&have, memory_order_relaxed);
    if (h < 0) {
        h = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
        atomic_store_explicit(&have, h, memory_order_relaxed);
    }
    return h;
#else
    return 0;
#endif
}
