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

/* Scratch for ops called directly (backend.h: ops never allocate): steps
 * of n_tok tokens, rows of n_in, queries of n_head heads seeing ctx keys
 * of kv (NULL: no attention). */
static inline void rig_reserve(kvp_backend *be, uint32_t n_tok, uint32_t n_in, uint32_t n_head, uint32_t ctx,
                               const kvp_kv_pool *kv)
{
    kvp_err err = {0};
    kvp_backend_reserve r = {.max_tok = n_tok, .max_ctx = ctx, .max_n_in = n_in, .n_head = n_head, .kv = kv};
    CHECK_MSG(be->ops->reserve(be, &r, &err) == 0, "reserve: %s", err.msg);
}

/* Attention's block tables as the engine lays them out: n_seq rows of
 * stride ids into flat (stride >= every n[s]), the rest 0. */
static inline void rig_flat_tables(const uint32_t *const *tables, const uint32_t *n, uint32_t n_seq, uint32_t stride,
                                   uint32_t *flat)
{
    for (uint32_t s = 0; s < n_seq; s++)
        for (uint32_t i = 0; i < stride; i++)
            flat[(size_t)s * stride + i] = i < n[s] ? tables[s][i] : 0;
}

/* The attention arguments every test fills the same way: host copies
 * equal to the device arrays (the CPU backend's memory is the host's). */
static inline kvp_attn_args rig_attn_args(const float *q, float *out, uint32_t n_tok, uint32_t n_head, uint32_t layer,
                                          float scale, const int32_t *pos, const uint32_t *tok_seq,
                                          const uint32_t *flat, uint32_t n_seq, uint32_t stride,
                                          const kvp_kv_pool *kv)
{
    uint32_t ctx = 0;
    for (uint32_t t = 0; t < n_tok; t++)
        ctx = (uint32_t)pos[t] + 1 > ctx ? (uint32_t)pos[t] + 1 : ctx;
    return (kvp_attn_args){.q = q, .out = out, .n_tok = n_tok, .n_head = n_head, .layer = layer, .scale = scale,
                           .pos = pos, .tok_seq = tok_seq, .tables = flat, .n_seq = n_seq, .table_stride = stride,
                           .host_pos = pos, .host_tok_seq = tok_seq, .max_ctx = ctx, .kv = kv};
}

static inline void rig_close(rig *r)
{
    kvp_engine_free(r->e);
    kvp_kvcache_free(r->kc);
    kvp_backend_free(r->be);
    kvp_model_free(r->m);
}

#endif
