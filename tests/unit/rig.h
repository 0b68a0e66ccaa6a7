/* rig.h - a model, a CPU backend, a KV cache and an engine opened
 * together for the engine tests (test_engine.c, test_invariant.c,
 * test_kvquant.c). */
#ifndef KVP_TEST_RIG_H
#define KVP_TEST_RIG_H

#include "backend_cpu.h"
#include "engine.h"
#include "kvcache.h"
#include "model.h"
#include "unit.h"

#include <stdio.h>
#include <string.h>

typedef struct rig {
    kvp_model *m;
    kvp_backend *be;
    kvp_kvcache *kc;
    kvp_engine *e;
} rig;

/* threads and flags for the backend; a cache of n_blocks blocks of bs
 * tokens in kv_dtype.  0, or -1 after printing why. */
static inline int rig_open(rig *r, const char *path, int threads, unsigned flags, int kv_dtype, uint32_t n_blocks,
                           uint32_t bs)
{
    kvp_err err = {0};
    memset(r, 0, sizeof *r);
    kvp_kvcache_opts o;
    kvp_kvcache_opts_init(&o);
    o.dtype = kv_dtype;
    o.n_blocks = n_blocks;
    o.block_size = bs;
    if (kvp_model_load(&r->m, path, &err) < 0 || kvp_backend_cpu_create(&r->be, threads, flags, &err) < 0 ||
        kvp_kvcache_create(&r->kc, &r->m->cfg, &o, r->be, &err) < 0 ||
        kvp_engine_create(&r->e, r->m, r->be, r->kc, &err) < 0) {
        printf("rig: %s\n", err.msg);
        return -1;
    }
    return 0;
}

/* A CPU backend of two threads ($KVP_TEST_THREADS) with flags, or NULL
 * after a failed check. */
static inline kvp_backend *rig_backend(unsigned flags)
{
    kvp_err err = {0};
    kvp_backend *be;
    if (kvp_backend_cpu_create(&be, unit_threads(2), flags, &err) < 0) {
        CHECK_MSG(0, "backend: %s", err.msg);
        return NULL;
    }
    return be;
}

static inline void rig_close(rig *r)
{
    kvp_engine_free(r->e);
    kvp_kvcache_free(r->kc);
    kvp_backend_free(r->be);
    kvp_model_free(r->m);
}

#endif
