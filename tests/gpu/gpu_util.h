/* gpu_util.h - what the GPU tests and benchmarks share: opening the "cuda"
 * backend beside the "cpu" one (or saying in one line why not), moving
 * buffers through the op table only (alloc, from_host, to_host: the tests
 * know nothing of CUDA), and comparing a GPU result with the CPU's by
 * normalized error.
 *
 * The CPU backend is the oracle (STYLE.md, from ggml): every comparison is
 * "cuda against cpu on the same inputs", never against constants. */
#ifndef KVP_GPU_UTIL_H
#define KVP_GPU_UTIL_H

#include "backend.h"
#include "backend_cpu.h"
#include "backends.h"
#include "unit.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Whether a missing CUDA backend is a failure rather than a skip:
 * scripts/device-check sets KVP_GPU_REQUIRED=1, so a machine that should
 * have run the tests cannot pass them by skipping. */
static inline int gpu_required(void)
{
    const char *s = getenv("KVP_GPU_REQUIRED");
    return s && *s == '1';
}

/* The backend under test: "cuda", or $KVP_GPU_BACKEND.  KVP_GPU_BACKEND=cpu
 * runs every GPU test against a second CPU backend on its portable kernels
 * (the reference keeps its SIMD ones): a self-test of the tests themselves,
 * on any machine. */
static inline const char *gpu_backend_name(void)
{
    const char *s = getenv("KVP_GPU_BACKEND");
    return s && *s ? s : "cuda";
}

/* Open the backend under test into *gpu (and "cpu" into *cpu when cpu is
 * not NULL).  1 when both are open; 0 after printing "PROG: skipped: REASON"
 * (REASON is kvp_backend_open's message: not built, no device); -1 after a
 * failed check (the CPU backend would not open, or KVP_GPU_REQUIRED=1). */
static inline int gpu_open(const char *prog, kvp_backend **cpu, kvp_backend **gpu)
{
    kvp_err err = {0};
    kvp_backend_config cfg = {.n_threads = unit_threads(0), .cpu_flags = 0, .device = 0};
    const char *dev = getenv("KVP_GPU_DEVICE"), *name = gpu_backend_name();
    cfg.device = dev && *dev ? atoi(dev) : 0;
    *gpu = NULL;
    if (cpu) {
        *cpu = NULL;
        if (kvp_backend_open(cpu, "cpu", &cfg, &err) < 0) {
            CHECK_MSG(0, "cpu backend: %s", err.msg);
            return -1;
        }
    }
    if (strcmp(name, "cpu") == 0)
        cfg.cpu_flags = KVP_CPU_PORTABLE;
    int rc = kvp_backend_open(gpu, name, &cfg, &err);
    if (rc == 0)
        return 1;
    if (cpu) {
        kvp_backend_free(*cpu);
        *cpu = NULL;
    }
    *gpu = NULL;
    if (gpu_required()) {
        CHECK_MSG(0, "%s: KVP_GPU_REQUIRED=1 but the %s backend did not open: %s", prog, name, err.msg);
        return -1;
    }
    printf("%s: skipped: %s\n", prog, err.msg[0] ? err.msg : kvp_strerror(rc));
    return 0;
}

/* ---- device buffers through the op table ---- */

/* bytes of device memory holding host's bytes; NULL after a failed check. */
static inline void *gpu_put(kvp_backend *b, const void *host, size_t bytes)
{
    kvp_err err = {0};
    void *d = b->ops->alloc(b, bytes ? bytes : 1);
    if (!d) {
        CHECK_MSG(0, "%s: alloc of %zu bytes failed", b->ops->name, bytes);
        return NULL;
    }
    if (bytes && b->ops->from_host(b, d, host, bytes, &err) < 0) {
        CHECK_MSG(0, "%s: from_host of %zu bytes: %s", b->ops->name, bytes, err.msg);
        b->ops->release(b, d);
        return NULL;
    }
    return d;
}

/* n floats of device memory, every one NaN, so an op that leaves an
 * element unwritten shows there (a zeroed buffer would hide it). */
static inline float *gpu_nan(kvp_backend *b, size_t n)
{
    float *h = malloc((n ? n : 1) * sizeof(float));
    if (!h) {
        CHECK(0);
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        h[i] = NAN;
    float *d = gpu_put(b, h, n * sizeof(float));
    free(h);
    return d;
}

/* to_host; 0, or -1 after a failed check naming what. */
static inline int gpu_get(kvp_backend *b, void *host, const void *dev, size_t bytes, const char *what)
{
    kvp_err err = {0};
    if (b->ops->to_host(b, host, dev, bytes, &err) < 0) {
        CHECK_MSG(0, "%s: %s: to_host: %s", b->ops->name, what, err.msg);
        return -1;
    }
    return 0;
}

static inline void gpu_free(kvp_backend *b, void *d)
{
    if (b && d)
        b->ops->release(b, d);
}

/* An op's return code rc: 0, or -1 after a failed check naming the op
 * (err is read after the op ran: gpu_op(b, "add", b->ops->add(..., &err), &err)). */
static inline int gpu_op(const kvp_backend *b, const char *what, int rc, const kvp_err *err)
{
    if (rc >= 0)
        return 0;
    CHECK_MSG(0, "%s: %s: %s (%s)", b->ops->name, what, err->msg, kvp_strerror(rc));
    return -1;
}

/* ---- comparison ---- */

/* got (the GPU's) against ref (the CPU's): largest and RMS differences,
 * each over the reference's own largest and RMS magnitudes.  bad counts
 * elements where got is not finite but ref is, or ref is not finite but
 * got is finite (so a poisoned, unwritten element is always bad). */
typedef struct gpu_diff {
    double max_err, max_ref, sq_err, sq_ref;
    size_t n, bad, first_bad;
} gpu_diff;

static inline void gpu_diff_f32(gpu_diff *d, const float *got, const float *ref, size_t n)
{
    memset(d, 0, sizeof *d);
    d->n = n;
    d->first_bad = (size_t)-1;
    for (size_t i = 0; i < n; i++) {
        int fg = isfinite(got[i]), fr = isfinite(ref[i]);
        if (fg != fr) {
            if (!d->bad++)
                d->first_bad = i;
            continue;
        }
        if (!fr)
            continue;
        double e = fabs((double)got[i] - ref[i]), r = fabs((double)ref[i]);
        d->max_err = e > d->max_err ? e : d->max_err;
        d->max_ref = r > d->max_ref ? r : d->max_ref;
        d->sq_err += e * e;
        d->sq_ref += r * r;
    }
}

/* max |got - ref| / max |ref| (0 when both are 0). */
static inline double gpu_diff_max(const gpu_diff *d)
{
    return d->max_err == 0 ? 0 : d->max_err / (d->max_ref > 0 ? d->max_ref : 1e-30);
}

/* ||got - ref|| / ||ref||. */
static inline double gpu_diff_rms(const gpu_diff *d)
{
    return d->sq_err == 0 ? 0 : sqrt(d->sq_err / (d->sq_ref > 0 ? d->sq_ref : 1e-60));
}

/* One check: no bad element and both normalized errors within tol (tol 0:
 * the same values exactly).  Prints an "ok" line with the errors either way,
 * so a device log shows how far each op is from its tolerance. */
static inline void gpu_expect(const char *what, const gpu_diff *d, double tol)
{
    double mx = gpu_diff_max(d), rms = gpu_diff_rms(d);
    int within_tolerance = d->bad == 0 && mx <= tol && rms <= tol;
    if (within_tolerance)
        printf("ok %s: max %.3g rms %.3g (tol %.3g)\n", what, mx, rms, tol);
    char first[48] = "";
    if (d->bad)
        snprintf(first, sizeof first, ", the first at %zu", d->first_bad);
    CHECK_MSG(within_tolerance, "%s: max %.3g rms %.3g of the reference (tol %.3g), %zu of %zu elements unwritten or not finite%s",
              what, mx, rms, tol, d->bad, d->n, first);
}

/* ---- time ---- */

static inline double gpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

#endif
