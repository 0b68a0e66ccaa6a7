/* cpufeat.h - which code paths this CPU can run.
 *
 * The SIMD kernels are compiled into every x86-64 build and chosen at run
 * time, so one binary runs on any x86-64; this is where the choice is asked.
 */
#ifndef KVP_CPUFEAT_H
#define KVP_CPUFEAT_H

/* Which code path a row or tensor function takes: AUTO uses AVX2/F16C when
 * the CPU has it; PORTABLE forces plain C (tests check that both give
 * identical bytes); SIMD means the caller already asked the CPU. */
enum { KVP_IMPL_AUTO = 0, KVP_IMPL_PORTABLE = 1, KVP_IMPL_SIMD = 2 };

/* 1 when this CPU and build can run the AVX2/FMA/F16C paths. */
int kvp_have_avx2(void);

#endif
