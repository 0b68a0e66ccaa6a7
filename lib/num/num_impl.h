/* num_impl.h - private to the numeric layer (minifloat.c, intcast.c,
 * ggml_quants.c, quant.c): SIMD build switches and shared helpers. */
#ifndef KVP_NUM_IMPL_H
#define KVP_NUM_IMPL_H

#include "cpufeat.h"

#include <math.h>
#include <stdint.h>

/* The AVX2 paths are compiled on x86-64 with GCC/Clang and chosen at run
 * time (kvp_have_avx2), so the same binary runs on any x86-64. */
#if defined(__x86_64__) && defined(__GNUC__)
#define KVP_X86_SIMD 1
#define KVP_AVX2 __attribute__((target("avx2,fma,f16c")))
#else
#define KVP_X86_SIMD 0
#define KVP_AVX2
#endif

/* Whether to take the AVX2 path for impl (0 auto, 1 portable, 2 simd: the
 * caller already asked the CPU once). */
static inline int kvp_use_simd(int impl)
{
    return KVP_X86_SIMD && (impl == KVP_IMPL_SIMD || (impl == KVP_IMPL_AUTO && kvp_have_avx2()));
}

/* Round to nearest, ties to even (the default FP environment), as
 * _mm256_round_ps(_MM_FROUND_TO_NEAREST_INT) does. */
static inline float kvp_rne(float x) { return rintf(x); }

#endif
