/* backend_cpu.h - the CPU backend: lib/backend.h's operations over host
 * memory, with one thread pool and kernels chosen at run time (AMX-INT8 for
 * prompts beside AVX512-VNNI, AVX512-VNNI, AVX2/FMA/F16C, or portable C).
 */
#ifndef KVP_BACKEND_CPU_H
#define KVP_BACKEND_CPU_H

#include "backend.h"
#include "error.h"

/* CPU backend flags. */
#define KVP_CPU_PORTABLE 0x1u /* never use the SIMD kernels (tests compare both) */
#define KVP_CPU_NO_VNNI 0x2u  /* AVX2 kernels even where AVX512-VNNI is present */
#define KVP_CPU_NO_AMX 0x4u   /* no AMX tiles for prompts (the VNNI kernels' same bits) */
/* Q8_0, Q4_0 and Q4_1 weights multiplied as stored, not rewritten in rows
 * of 16 where the kernels take them so (the same bits; for comparisons) */
#define KVP_CPU_AS_STORED 0x8u

/* The CPU backend with n_threads threads (<= 0: all cores). */
int kvp_backend_cpu_create(kvp_backend **b, int n_threads, unsigned flags, kvp_err *err);
/* "avx2+fma+f16c+avx512vnni+amx-int8", "avx2+fma+f16c+avx512vnni",
 * "avx2+fma+f16c" or "portable": the kernels a
 * CPU backend runs. */
const char *kvp_backend_cpu_isa(const kvp_backend *b);
int kvp_backend_cpu_threads(const kvp_backend *b);

#endif
