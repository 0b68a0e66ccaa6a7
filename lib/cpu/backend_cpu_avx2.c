/* backend_cpu_avx2.c - AVX2 + FMA + F16C kernels, compiled with per-function
 * target attributes so the build needs no -mavx2 and the program still runs
 * (on the portable kernels) where the CPU lacks them.  The kernels are in
 * backend_cpu_x86.inc, shared with the VNNI build of them. */
#include "backend_cpu_kern.h"
#include "quant.h"
#include "tensor.h"

#if defined(__x86_64__) && defined(__GNUC__)

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define KVP_AVX2 __attribute__((target("avx2,fma,f16c")))
#define KVP_X86_TABLE kernels_avx2
#define KVP_X86_ISA "avx2+fma+f16c"
#define KVP_X86_T 8  /* tokens a group (and a quantized tile) holds */
#define KVP_X86_FT 4 /* tokens a 2-row float run takes: 8 sums of 16 registers */
#include "backend_cpu_x86.inc"

const kvp_cpu_kernels *kvp_cpu_kernels_avx2(void)
{
    __builtin_cpu_init();
    if (kvp_have_avx2() /* avx2, fma, f16c */)
        return &kernels_avx2;
    return NULL;
}

#else

const kvp_cpu_kernels *kvp_cpu_kernels_avx2(void) { return NULL; }

#endif
