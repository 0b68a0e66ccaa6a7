/* backend.h - the operations table the engine computes through.
 *
 * engine.c calls only what this table offers and never looks at how it is
 * done: the CPU backend (lib/backend_cpu.c) implements it over host memory
 * with a thread pool; a CUDA backend (kernels/) implements the same table over
 * device memory.  Activation buffers come from the backend's alloc, so they
 * live wherever the backend computes.  All activations are f32, row-major:
 * "[n_tok][n]" means n_tok rows of n contiguous floats.
 *
 * Weights are used in their stored format (kvp_weight.dtype): the matmul op
 * handles F32, F16, BF16, Q4_0, Q4_1, Q8_0 and the scaled FP8_E4M3, I8 and
 * I4 rows directly and fails with KVP_EUNSUPPORTED (naming the tensor) for
 * anything else.
 *
 * The paged KV cache is a pool of equal blocks (kvp_kv_pool); one block holds
 * block_size token slots for every layer, laid out as
 *   [layer][K=0,V=1][n_head_kv][block_size][head_dim]
 * (the order of a KVP KV_BLOCK record's data, kvp(5)), so a block is written
 * to a stream as it is.  A scaled cache (fp8_e4m3 or i8 elements,
 * lib/num/kvscale.h) follows the data with one f32 scale per
 * [layer][K/V][head][slot] (a KV_BLOCK record's scales, one a slot), at
 * scales_off: an element's value is its decoded q times its row's scale.  A token's slot is block_id * block_size + offset,
 * a uint32: a pool holds at most KVP_KV_MAX_SLOTS token slots (kvcache.c
 * refuses a larger one), so slot arithmetic in uint32 never wraps.
 */
#ifndef KVP_BACKEND_H
#define KVP_BACKEND_H

#include "error.h"

#include <stddef.h>
#include <stdint.h>

/* A weight matrix as stored: n_out rows of n_in elements (GGUF ne[0] = n_in),
 * row r at data + r * row_bytes.  1-D tensors (norm weights) have n_out 1.
 *
 * Scaled schemes (KVP tensor records, lib/quant.h: fp8_e4m3, i8, i4 with one
 * scale per tensor, per row or per group): element i of row r is
 *   y = (q - z) * scales[r * scale_stride + i / group]
 * with z = zeros[...same index] when zeros is set (asymmetric), else 0.
 * TENSOR: group = n_in, scale_stride 0; CHANNEL: group = n_in, stride 1;
 * GROUP: stride n_in / group.  Block types and plain floats have scales NULL. */
typedef struct kvp_weight {
    const char *name;      /* tensor name, for messages */
    int dtype;             /* kvp_dtype of the stored data; -1 when absent */
    uint32_t n_in;         /* contiguous dimension */
    uint32_t n_out;        /* rows */
    uint64_t row_bytes;
    const void *data;      /* host bytes (inside the mapped model file) */
    void *dev;             /* the backend's own copy when it keeps one, else NULL */
    const float *scales;   /* f32 scales of a scaled scheme, else NULL */
    const float *zeros;    /* f32 zero points (integer values), or NULL */
    uint32_t group;        /* elements per scale along a row */
    uint32_t scale_stride; /* scales per row: 0 (one for the tensor), 1, or n_in / group */
    float global;          /* NVFP4: the tensor scale (0 means 1) */
} kvp_weight;

/* Token slots a pool may hold (n_blocks * block_size): slot ids are 32 bits. */
#define KVP_KV_MAX_SLOTS ((uint64_t)1 << 32)

/* The KV pool as kernels see it. */
typedef struct kvp_kv_pool {
    void *base;            /* n_blocks * block_bytes, from the backend's alloc */
    int dtype;             /* KVP_DTYPE_F16, BF16, F32, or scaled FP8_E4M3 or I8 */
    uint32_t n_blocks;
    uint32_t block_size;   /* token slots per block */
    uint32_t n_layer, n_head_kv, head_dim;
    uint64_t block_bytes;  /* n_layer * 2 * n_head_kv * block_size * head_dim * element size,
                            * plus n_layer * 2 * n_head_kv * block_size * 4 for a scaled cache's scales */
    uint64_t scales_off;   /* a scaled cache: where a block's scales start (its data bytes); else 0 */
} kvp_kv_pool;

/* One attention call: every query token of the step, each attending to the
 * keys at positions 0..pos[t] of its own sequence (causal), read through that
 * sequence's block table.  Query head h uses KV head h / (n_head / n_head_kv). */
typedef struct kvp_attn_args {
    const float *q;        /* [n_tok][n_head * head_dim], RoPE applied */
    float *out;            /* [n_tok][n_head * head_dim] */
    uint32_t n_tok, n_head;
    uint32_t layer;
    float scale;           /* 1/sqrt(head_dim) */
    const int32_t *pos;    /* [n_tok] */
    const uint32_t *tok_seq;             /* [n_tok]: index into tables */
    const uint32_t *const *tables;       /* [n_seq]: block ids, position p in block tables[s][p / block_size] */
    const kvp_kv_pool *kv;
} kvp_attn_args;

enum kvp_rope_kind { KVP_ROPE_KIND_NORM = 0, KVP_ROPE_KIND_NEOX = 1 }; /* == kvp_rope_type (config.h) */

typedef struct kvp_backend kvp_backend;
struct kvp_comm; /* lib/comm/comm.h: the ranks of a tensor-parallel group */

typedef struct kvp_backend_ops {
    const char *name;      /* "cpu", "cuda" */
    void (*destroy)(kvp_backend *b);
    /* Device memory for activations and the KV pool (64-byte aligned, zeroed). */
    void *(*alloc)(kvp_backend *b, size_t bytes);
    void (*release)(kvp_backend *b, void *p);
    /* Copy between host and device memory (plain memcpy on the CPU). */
    void (*to_host)(kvp_backend *b, void *host, const void *dev, size_t bytes);
    void (*from_host)(kvp_backend *b, void *dev, const void *host, size_t bytes);
    /* Make w usable by this backend (upload; CPU: nothing). 0 or a code. */
    int (*prepare_weight)(kvp_backend *b, kvp_weight *w, kvp_err *err);

    /* y[n_tok][w.n_out] = x[n_tok][w.n_in] . w^T.  0 or KVP_EUNSUPPORTED. */
    int (*matmul)(kvp_backend *b, const kvp_weight *w, const float *x, float *y, uint32_t n_tok, kvp_err *err);
    /* out[t] = tokens' rows of the embedding table, as f32: [n_tok][w.n_in]. */
    int (*embed)(kvp_backend *b, const kvp_weight *w, const int32_t *tokens, uint32_t n_tok, float *out,
                 kvp_err *err);
    /* y = x / sqrt(mean(x^2) + eps) * weight, per row of n. y may be x. */
    void (*rmsnorm)(kvp_backend *b, const float *x, const float *weight, float *y, uint32_t n_tok, uint32_t n,
                    float eps);
    /* Rotate each head of x[n_tok][n_head * head_dim] in place by its
     * position: pairs (2i, 2i+1) for NORM, (i, i + rot_dim/2) for NEOX, angle
     * pos * inv_freq[i], i < rot_dim / 2 (dims past rot_dim are left alone). */
    void (*rope)(kvp_backend *b, float *x, uint32_t n_tok, uint32_t n_head, uint32_t head_dim, uint32_t rot_dim,
                 const int32_t *pos, const float *inv_freq, int kind);
    /* x[t] += bias, per row of n (QKV bias). */
    void (*add_bias)(kvp_backend *b, float *x, const float *bias, uint32_t n_tok, uint32_t n);
    /* x += y over n elements. */
    void (*add)(kvp_backend *b, float *x, const float *y, size_t n);
    /* g = silu(g) * u over n elements (SwiGLU). */
    void (*silu_mul)(kvp_backend *b, float *g, const float *u, size_t n);
    /* Store k, v [n_tok][n_head_kv * head_dim] of one layer into the slots
     * (a scaled cache: each row with its own scale, kvp_kvscale_row). */
    void (*kv_store)(kvp_backend *b, const kvp_kv_pool *kv, uint32_t layer, const float *k, const float *v,
                     uint32_t n_tok, const uint32_t *slot);
    /* 0 or KVP_ENOMEM (its scratch grows with the longest context). */
    int (*attention)(kvp_backend *b, const kvp_attn_args *a, kvp_err *err);
    /* Copy block src to block dst, every layer (copy-on-write). */
    void (*kv_copy_block)(kvp_backend *b, const kvp_kv_pool *kv, uint32_t dst, uint32_t src);
    /* Tensor parallelism (lib/engine/engine.h): x[n] = its sum over the
     * ranks of comm, in place, after a row-parallel matmul (MPI on the CPU;
     * a GPU backend uses its collective library on device memory).  0 or a
     * code; a peer that never comes aborts the job (comm.h). */
    int (*all_reduce)(kvp_backend *b, struct kvp_comm *comm, float *x, size_t n, kvp_err *err);
    /* recv[rank][n] = send[n] of every rank of comm (the vocabulary slices). */
    int (*all_gather)(kvp_backend *b, struct kvp_comm *comm, const float *send, float *recv, size_t n, kvp_err *err);
} kvp_backend_ops;

struct kvp_backend {
    const kvp_backend_ops *ops;
    void *impl;            /* the backend's private state */
};

/* Destroy any backend (NULL is fine). */
void kvp_backend_free(kvp_backend *b);

#endif
