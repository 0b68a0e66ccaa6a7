/* backends.h - the backends this build has, opened by name.
 *
 * "cpu" is always there.  "cuda" is there when the library was built with
 * nvcc (make CUDA=1, or CUDA=auto finding it); opening it on a machine with
 * no usable GPU fails with a message saying why.  Programs take the name
 * from --backend (runopts.c).
 */
#ifndef KVP_BACKENDS_H
#define KVP_BACKENDS_H

#include "backend.h"
#include "error.h"

typedef struct kvp_backend_config {
    int n_threads;         /* cpu: worker threads, <= 0 for every core */
    unsigned cpu_flags;    /* cpu: KVP_CPU_* (backend_cpu.h) */
    int device;            /* cuda: the device ordinal */
} kvp_backend_config;

/* Open backend `name` ("cpu", "cuda").  KVP_EINVAL for a name this build
 * does not know (the message lists the ones it does), KVP_EUNSUPPORTED for
 * one it knows but cannot open here (no GPU, no driver). */
int kvp_backend_open(kvp_backend **out, const char *name, const kvp_backend_config *cfg, kvp_err *err);
/* "cpu" or "cpu, cuda": the names this build knows, for help and messages. */
const char *kvp_backend_names(void);

#endif
