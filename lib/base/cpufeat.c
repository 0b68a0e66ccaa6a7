/* cpufeat.c - what this CPU can run (see cpufeat.h). */
#include "cpufeat.h"

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
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
#else
    return 0;
#endif
}
