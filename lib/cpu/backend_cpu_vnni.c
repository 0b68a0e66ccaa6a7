/* backend_cpu_vnni.c - the x86 kernels (backend_cpu_x86.inc) with
 * AVX512-VNNI's dpbusd doing the u8 x i8 dot products in one instruction
 * (its rows of 16 and its attention on 512-bit registers, its float tiles
 * on AVX512VL's 32 256-bit ones).  Chosen at run time when the CPU has it. */
#include "backend_cpu_kern.h"
#include "quant.h"
#include "tensor.h"

#if defined(__x86_64__) && defined(__GNUC__) && (__GNUC__ >= 9 || defined(__clang__))

#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

/* avx512bw: IQ4's table lookup (vpshufb on 512 bits); every CPU with
 * AVX512-VNNI has it */
#define KVP_AVX2 __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")))
#define KVP_X86_TABLE kernels_vnni
#define KVP_X86_ISA "avx2+fma+f16c+avx512vnni"
#define KVP_X86_VNNI 1
/* AVX512VL's 32 registers hold a tile of 2 rows by 8 tokens (16 accumulators) */
#define KVP_X86_T 8
#define KVP_X86_FT 8 /* tokens a 2-row float run takes: 16 sums of 32 registers */
/* and float prompt runs of 4 rows by 4 tokens (backend_cpu_x86.inc mm_f) */
#define KVP_X86_FROWS 4
#include "backend_cpu_x86.inc"

void kvp_cpu_vnni_wide_floats(kvp_cpu_kernels *k)
{
    k->mm_f32 = mm_f32_wide, k->mm_f16 = mm_f16_wide, k->mm_bf16 = mm_bf16_wide;
    k->float_tile = 1;
    k->float_groups = 1;
}

/* Intel's cores with AVX512-VNNI (Xeons from Cascade Lake on) retire two
 * 512-bit FMAs a cycle, so float prompts run on 512 bits there, AMX or not
 * (an Emerald Rapids guest without AMX: SmolLM2 f16 pp512 1.04x llama.cpp
 * on 256 bits); Zen 4 splits a 512-bit FMA in two and ran them 0-3% slower
 * (doc/performance.md), so it keeps the 256-bit floats.  The same bits. */
static kvp_cpu_kernels kernels_vnni_intel;

static void vnni_intel_init(void)
{
    kernels_vnni_intel = kernels_vnni;
    kvp_cpu_vnni_wide_floats(&kernels_vnni_intel);
}

const kvp_cpu_kernels *kvp_cpu_kernels_vnni(void)
{
    __builtin_cpu_init();
    if (!kvp_have_avx2() /* avx2, fma, f16c */ ||
        !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vnni"))
        return NULL;
    if (!__builtin_cpu_is("intel"))
        return &kernels_vnni;
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, vnni_intel_init);
    return &kernels_vnni_intel;
}

#else

const kvp_cpu_kernels *kvp_cpu_kernels_vnni(void) { return NULL; }
void kvp_cpu_vnni_wide_floats(kvp_cpu_kernels *k) { (void)k; }

#endif
