/* cuda_prof.cuh - where a CUDA run's time goes, without a profiler tool
 * (KVP_CUDA_PROFILE=1; the device machine has no Nsight Systems): each op
 * between two CUDA events on the backend's stream, its GPU time read back
 * once the stream has been waited for, and the host's time in the op (the
 * launch, or the wait in to_host).  A table on standard error when the
 * backend closes.  Not yet run on a GPU. */
#ifndef KVP_CUDA_PROF_CUH
#define KVP_CUDA_PROF_CUH

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

/* What is timed: the GPU's ops, then the host-only ones (no events). */
enum cu_prof_kind {
    CU_P_GEMV, CU_P_GEMM, CU_P_EMBED, CU_P_RMSNORM, CU_P_ROPE, CU_P_ADD_BIAS, CU_P_ADD, CU_P_SILU_MUL,
    CU_P_GATHER, CU_P_ARGMAX, CU_P_KV_STORE, CU_P_ATTENTION, CU_P_KV_COPY,
    CU_P_HOST_FIRST,
    CU_P_TO_HOST = CU_P_HOST_FIRST, CU_P_FROM_HOST, CU_P_SYNC,
    CU_P_KINDS
};

typedef struct cu_prof cu_prof;

/* NULL (and a message on stderr) when the events cannot be made. */
cu_prof *cu_prof_new(void);
/* Around one op on stream st: begin returns the op's slot (or -1: a
 * host-only kind); end takes it back. */
int cu_prof_begin(cu_prof *p, cudaStream_t st, int kind);
void cu_prof_end(cu_prof *p, cudaStream_t st, int kind, int slot);
/* After the stream has been waited for: every pending op's GPU time. */
void cu_prof_collect(cu_prof *p);
/* The table (cu_prof_collect first, once the stream is idle), then free. */
void cu_prof_report(cu_prof *p, FILE *f, const char *device);
void cu_prof_free(cu_prof *p);

#endif
