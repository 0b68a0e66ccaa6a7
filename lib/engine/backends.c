/* backends.c - the backends this build has, by name (backends.h). */
#include "backends.h"
#include "backend_cpu.h"
#ifdef KVP_HAVE_CUDA
#include "backend_cuda.h"
#endif

#include <string.h>

#ifdef KVP_HAVE_CUDA
#define KVP_BACKEND_NAMES "cpu, cuda"
#else
#define KVP_BACKEND_NAMES "cpu"
#endif

const char *kvp_backend_names(void) { return KVP_BACKEND_NAMES; }

int kvp_backend_open(kvp_backend **out, const char *name, const kvp_backend_config *cfg, kvp_err *err)
{
    static const kvp_backend_config none = {0};
    *out = NULL;
    if (!cfg)
        cfg = &none;
    if (!name || !strcmp(name, "cpu"))
        return kvp_backend_cpu_create(out, cfg->n_threads, cfg->cpu_flags, err);
    if (!strcmp(name, "cuda")) {
#ifdef KVP_HAVE_CUDA
        return kvp_backend_cuda_create(out, cfg->device, err);
#else
        return kvp_err_set(err, KVP_EUNSUPPORTED, "backend cuda: this build has no CUDA backend (build with make "
                           "CUDA=1 where nvcc is installed)");
#endif
    }
    return kvp_err_set(err, KVP_EINVAL, "unknown backend '%s' (this build has: %s)", name, KVP_BACKEND_NAMES);
}
