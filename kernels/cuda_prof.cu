/* cuda_prof.cu - see cuda_prof.cuh. */
#include "cuda_prof.cuh"

#include <stdlib.h>
#include <time.h>

enum { PENDING = 4096 }; /* event pairs between two waits (a step of a 30-layer model: ~400) */

struct cu_prof {
    cudaEvent_t ev[2 * PENDING];
    uint8_t kind[PENDING];
    uint32_t n;                   /* pending pairs */
    uint64_t calls[CU_P_KINDS];
    double host_s[CU_P_KINDS], gpu_ms[CU_P_KINDS];
    double t_first, t_last;       /* the first op's start, the last collection */
    uint64_t forced;              /* waits the profiler itself added (PENDING ran out) */
};

static const char *const names[CU_P_KINDS] = {
    "matmul <= 8 tokens", "matmul > 8 tokens", "embed", "rmsnorm", "rope", "add_bias", "add", "silu_mul",
    "gather_rows", "argmax_rows", "kv_store", "attention", "kv_copy_block", "to_host (and its wait)", "from_host",
    "synchronize"};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

cu_prof *cu_prof_new(void)
{
    cu_prof *p = (cu_prof *)calloc(1, sizeof *p);
    if (!p)
        return NULL;
    for (int i = 0; i < 2 * PENDING; i++)
        if (cudaEventCreate(&p->ev[i]) != cudaSuccess) {
            (void)cudaGetLastError();
            fprintf(stderr, "cuda profile: could not make its events; KVP_CUDA_PROFILE ignored\n");
            for (int j = 0; j < i; j++)
                cudaEventDestroy(p->ev[j]);
            free(p);
            return NULL;
        }
    return p;
}

void cu_prof_collect(cu_prof *p)
{
    for (uint32_t i = 0; i < p->n; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, p->ev[2 * i], p->ev[2 * i + 1]) == cudaSuccess)
            p->gpu_ms[p->kind[i]] += ms;
        else
            (void)cudaGetLastError();
    }
    p->n = 0;
    p->t_last = now();
}

int cu_prof_begin(cu_prof *p, cudaStream_t st, int kind)
{
    double t = now();
    if (p->t_first == 0)
        p->t_first = t;
    p->host_s[kind] -= t;
    if (kind >= CU_P_HOST_FIRST)
        return -1;
    if (p->n == PENDING) { /* a long run without a wait: wait here, and say so */
        cudaStreamSynchronize(st);
        cu_prof_collect(p);
        p->forced++;
    }
    int slot = (int)p->n++;
    p->kind[slot] = (uint8_t)kind;
    cudaEventRecord(p->ev[2 * slot], st);
    return slot;
}

void cu_prof_end(cu_prof *p, cudaStream_t st, int kind, int slot)
{
    if (slot >= 0)
        cudaEventRecord(p->ev[2 * slot + 1], st);
    p->calls[kind]++;
    p->host_s[kind] += now();
}

void cu_prof_report(cu_prof *p, FILE *f, const char *device)
{
    double wall = p->t_last > p->t_first ? p->t_last - p->t_first : 0, busy = 0;
    for (int k = 0; k < CU_P_HOST_FIRST; k++)
        busy += p->gpu_ms[k] / 1e3;
    fprintf(f, "cuda profile (KVP_CUDA_PROFILE=1, %s): %.3f s from the first op to the last wait; the GPU busy in "
               "ops %.3f s (%.0f%%)%s\n",
            device, wall, busy, wall > 0 ? 100 * busy / wall : 0.0,
            p->forced ? "; the profiler waited for the stream itself, which this timing includes" : "");
    fprintf(f, "%-24s %10s %10s %12s %14s\n", "op", "calls", "GPU ms", "GPU us/call", "host us/call");
    for (int k = 0; k < CU_P_KINDS; k++) {
        if (!p->calls[k])
            continue;
        double c = (double)p->calls[k];
        if (k < CU_P_HOST_FIRST)
            fprintf(f, "%-24s %10llu %10.2f %12.2f %14.2f\n", names[k], (unsigned long long)p->calls[k],
                    p->gpu_ms[k], 1e3 * p->gpu_ms[k] / c, 1e6 * p->host_s[k] / c);
        else
            fprintf(f, "%-24s %10llu %10s %12s %14.2f\n", names[k], (unsigned long long)p->calls[k], "-", "-",
                    1e6 * p->host_s[k] / c);
    }
}

void cu_prof_free(cu_prof *p)
{
    if (!p)
        return;
    for (int i = 0; i < 2 * PENDING; i++)
        cudaEventDestroy(p->ev[i]);
    (void)cudaGetLastError();
    free(p);
}
