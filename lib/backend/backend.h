/* backend.h - the operations table the engine computes through.
 *
 * engine.c calls only what this table offers and never looks at how it is
 * done: the CPU backend (lib/cpu) implements it over host memory with a
 * thread pool; the CUDA backend (lib/cuda with kernels/) implements the same
 * table over device memory.  lib/engine/backends.h opens one by name.
 *
 * Memory.  Every pointer an op takes is "device" memory from the backend's
 * alloc (the CPU's device memory is host memory, but nothing may rely on
 * that), except where a field says "host".  The engine never reads or writes
 * device memory itself: it moves bytes with to_host/from_host and rearranges
 * rows with gather_rows.  All activations are f32, row-major: "[n_tok][n]"
 * means n_tok rows of n contiguous floats.
 *
 * Errors and ordering.  Every op returns 0 or a negative kvp_err code with a
 * message in err.  A backend may run ops asynchronously, in the order they
 * were called: a failure may then surface at a later op, at to_host, or at
 * synchronize, which waits for everything issued so far.  to_host returns
 * once the host bytes are there.  After a failed op the contents of any
 * buffer written since the last successful synchronize are undefined.
 *
 * Scratch.  Ops never allocate: reserve() sizes the backend's scratch for the
 * largest step the engine will run (tokens, context), and an op asked for
 * more than was reserved fails with KVP_ELIMIT.  The engine reserves before
 * the first step and again, outside any step, when a step outgrows it; so a
 * sequence of ops between two reserves can be captured and replayed (CUDA
 * graphs).
 *
 * Weights.  The engine calls prepare_weight once for every weight it will
 * pass to an op (matrices, norm weights, biases, the RoPE frequencies) and
 * release_weight when done.  prepare_weight is where a backend uploads the
 * bytes, builds any per-weight derived data (block sums, repacked layouts),
 * and refuses a weight it cannot use (KVP_EUNSUPPORTED, naming the tensor),
 * so an unsupported dtype fails when the engine is created, not at its first
 * step.  Ops read w->dev when the backend set it, else w->data.
 *
 * Weights are used in their stored format (kvp_weight.dtype): the CPU matmul
 * handles F32, F16, BF16, Q4_0, Q4_1, Q8_0 and the scaled FP8_E4M3, I8 and
 * I4 rows directly, and other readable types through f32 rows; supports()
 * answers for any backend.
 *
 * The paged KV cache is a pool of equal blocks (kvp_kv_pool); one block holds
 * block_size token slots for every layer, laid out as
 *   [layer][K=0,V=1][n_head_kv][block_size][head_dim]
 * (the order of a KVP KV_BLOCK record's data, kvp(5)), so a block is written
 * to a stream as it is.  A scaled cache (fp8_e4m3 or i8 elements,
 * lib/num/kvscale.h) follows the data with one f32 scale per
 * [layer][K/V][head][slot] (a KV_BLOCK record's scales, one a slot), at
 * scales_off: an element's value is its decoded q times its row's scale.  A
 * token's slot is block_id * block_size + offset, a uint32: a pool holds at
 * most KVP_KV_MAX_SLOTS token slots (kvcache.c refuses a larger one), so
 * slot arithmetic in uint32 never wraps.
 */
#ifndef KVP_BACKEND_H
#define KVP_BACKEND_H

#include "error.h"
#include "tensor.h"

#include <stddef.h>
#include <stdint.h>

/* A weight as stored: n_out rows of n_in elements (GGUF ne[0] = n_in), row r
 * at data + r * row_bytes.  1-D tensors (norm weights, biases, the RoPE
 * frequencies) have n_out 1.
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
    void *dev;             /* prepare_weight: the backend's own copy or derived data, else NULL */
    const float *scales;   /* host f32 scales of a scaled scheme, else NULL */
    const float *zeros;    /* host f32 zero points (integer values), or NULL */
    uint32_t group;        /* elements per scale along a row */
    uint32_t scale_stride; /* scales per row: 0 (one for the tensor), 1, or n_in / group */
    float global;          /* NVFP4: the tensor scale (0 means 1) */
    int lookup;            /* the engine only gathers its rows (an untied embedding), never
                            * multiplies by it: a backend need not make a product's form of it */
} kvp_weight;

/* Token slots a pool may hold (n_blocks * block_size): slot ids are 32 bits. */
#define KVP_KV_MAX_SLOTS ((uint64_t)1 << 32)

/* The KV pool as kernels see it. */
typedef struct kvp_kv_pool {
    void *base;            /* device: n_blocks * block_bytes, from the backend's alloc */
    int dtype;             /* KVP_DTYPE_F16, BF16, F32, or scaled FP8_E4M3 or I8 */
    uint32_t n_blocks;
    uint32_t block_size;   /* token slots per block */
    uint32_t n_layer, n_head_kv, head_dim;
    uint64_t block_bytes;  /* n_layer * 2 * n_head_kv * block_size * head_dim * element size,
                            * plus n_layer * 2 * n_head_kv * block_size * 4 for a scaled cache's scales */
    uint64_t scales_off;   /* a scaled cache: where a block's scales start (its data bytes); else 0 */
} kvp_kv_pool;

/* Bytes of one K or V element of a pool of dtype (f32 4, f16 and bf16 2,
 * fp8 and i8 1). */
static inline uint32_t kvp_kv_esize(int dtype)
{
    return dtype == KVP_DTYPE_F32 ? 4 : dtype == KVP_DTYPE_FP8_E4M3 || dtype == KVP_DTYPE_I8 ? 1 : 2;
}

/* Where (layer, K 0 or V 1, head, slot) lives inside a block: the byte
 * offset of its head_dim elements, and for a scaled pool of its scale
 * (one f32 a row).  A block is [layer][K, V][head][slot][head_dim], then
 * the scales in the same order. */
static inline uint64_t kvp_kv_row_off(const kvp_kv_pool *kv, uint32_t layer, uint32_t which, uint32_t head,
                                      uint32_t slot)
{
    return ((((uint64_t)layer * 2 + which) * kv->n_head_kv + head) * kv->block_size + slot) * kv->head_dim *
           kvp_kv_esize(kv->dtype);
}
static inline uint64_t kvp_kv_scale_off(const kvp_kv_pool *kv, uint32_t layer, uint32_t which, uint32_t head,
                                        uint32_t slot)
{
    return kv->scales_off + ((((uint64_t)layer * 2 + which) * kv->n_head_kv + head) * kv->block_size + slot) * 4;
}

/* One attention call: every query token of the step, each attending to the
 * keys at positions 0..pos[t] of its own sequence (causal), read through that
 * sequence's block table.  Query head h uses KV head h / (n_head / n_head_kv).
 * The step's tokens of one sequence are consecutive.  The host copies of pos
 * and tok_seq (the same values) let a backend plan the work (how to split
 * long contexts, launch shapes) without reading device memory.
 *
 * A draft tree (parent set; only where supports(KVP_USE_TREE)): the step
 * holds candidate continuations that share a prefix, so two tokens may sit
 * at one position.  Token t's K/V are in the slot of position kv_pos[t] of
 * its sequence (its row of the tree); pos[t] stays its RoPE position and
 * causal limit.  The keys t sees are, by position: its own at pos[t]; its
 * parent's (the step's token parent[t] < t, one position before) at
 * kv_pos[parent[t]], and so on up its ancestors; below the first of them
 * whose parent is -1, position p's key is in p's own slot.  The keys are
 * taken in position order, as if the path were a plain sequence, so a
 * token's output is the one a step of its path alone gives, to the bit.
 * A path holds at most KVP_TREE_MAX_DEPTH of the step's tokens.  Without
 * a tree, parent and kv_pos are NULL (kv_pos[t] = pos[t]). */
#define KVP_TREE_MAX_DEPTH 64
typedef struct kvp_attn_args {
    const float *q;        /* [n_tok][n_head * head_dim], RoPE applied */
    float *out;            /* [n_tok][n_head * head_dim] */
    uint32_t n_tok, n_head;
    uint32_t layer;
    float scale;           /* 1/sqrt(head_dim) */
    const int32_t *pos;    /* [n_tok] */
    const uint32_t *tok_seq; /* [n_tok]: the token's sequence, a row of tables */
    const uint32_t *tables;  /* [n_seq][table_stride]: sequence s's position p is in block
                              * tables[s * table_stride + p / block_size] */
    uint32_t n_seq, table_stride;
    const int32_t *host_pos;      /* host [n_tok] */
    const uint32_t *host_tok_seq; /* host [n_tok] */
    uint32_t max_ctx;      /* host: the most keys any query sees (max pos + 1) */
    const kvp_kv_pool *kv; /* host struct; kv->base is device memory */
    const int32_t *parent, *kv_pos;           /* a draft tree: [n_tok] each, or NULL */
    const int32_t *host_parent, *host_kv_pos; /* their host copies */
} kvp_attn_args;

/* Host and device code (kernels/) both walk a tree query's path, with the
 * same arithmetic. */
#ifdef __CUDACC__
#define KVP_TREE_FN __host__ __device__ static inline
#else
#define KVP_TREE_FN static inline
#endif

/* Token t of a draft tree (kvp_attn_args): at[i] is the position whose slot
 * holds the key at position pos[t] - i, for i below the returned length n
 * (t itself, its parent, ... up to the first token whose parent is -1);
 * positions below pos[t] - n + 1 are in their own slots.  At most
 * KVP_TREE_MAX_DEPTH (the engine refuses deeper paths). */
KVP_TREE_FN uint32_t kvp_attn_tree_path(const int32_t *parent, const int32_t *kv_pos, uint32_t t, int32_t *at)
{
    int32_t u = (int32_t)t;
    uint32_t n = 0;
    while (u >= 0 && n < KVP_TREE_MAX_DEPTH) {
        at[n++] = kv_pos[u];
        u = parent[u];
    }
    return n;
}

/* The position whose slot holds the key at position p, for a query at hi
 * whose path kvp_attn_tree_path gave as at[0 .. n). */
KVP_TREE_FN int32_t kvp_attn_tree_slot_pos(const int32_t *at, uint32_t n, int32_t hi, int32_t p)
{
    return p <= hi && hi - p < (int32_t)n ? at[hi - p] : p;
}

/* What reserve() sizes scratch for: the largest step to come. */
typedef struct kvp_backend_reserve {
    uint32_t max_tok;      /* tokens in one step (matmul rows, attention queries) */
    uint32_t max_ctx;      /* keys one query may see */
    uint32_t max_n_in;     /* the widest weight row a matmul will take */
    uint32_t n_head;       /* attention: query heads */
    const kvp_kv_pool *kv; /* attention's pool (its head_dim, block_size, heads); NULL: no attention */
} kvp_backend_reserve;

/* What supports() is asked about. */
enum kvp_backend_use {
    KVP_USE_MATMUL = 1,    /* weights of this dtype in matmul (scaled: with scales) */
    KVP_USE_EMBED = 2,     /* embedding tables of this dtype */
    KVP_USE_KV = 3,        /* a KV pool of this dtype (fp8 and i8 pools always carry scales; scaled ignored) */
    KVP_USE_TREE = 4,      /* attention over a draft tree (kvp_attn_args.parent; dtype, scaled ignored) */
};

enum kvp_rope_kind { KVP_ROPE_KIND_NORM = 0, KVP_ROPE_KIND_NEOX = 1 }; /* == kvp_rope_type (config.h) */

typedef struct kvp_backend kvp_backend;
struct kvp_comm; /* lib/comm/comm.h: the ranks of a tensor-parallel group */

typedef struct kvp_backend_ops {
    const char *name;      /* "cpu", "cuda" */
    void (*destroy)(kvp_backend *b);
    /* 1 when this backend can do `use` with dtype (scaled: a scaled scheme), else 0. */
    int (*supports)(const kvp_backend *b, int use, int dtype, int scaled);

    /* Device memory for activations and the KV pool (64-byte aligned,
     * zeroed); NULL when there is none. */
    void *(*alloc)(kvp_backend *b, size_t bytes);
    void (*release)(kvp_backend *b, void *p);
    /* Copy between host and device memory.  to_host waits for the bytes. */
    int (*to_host)(kvp_backend *b, void *host, const void *dev, size_t bytes, kvp_err *err);
    int (*from_host)(kvp_backend *b, void *dev, const void *host, size_t bytes, kvp_err *err);
    /* Wait for every op issued so far; their first failure, if any. */
    int (*synchronize)(kvp_backend *b, kvp_err *err);
    /* Size scratch for steps up to r (grows only; never during a step). */
    int (*reserve)(kvp_backend *b, const kvp_backend_reserve *r, kvp_err *err);
    /* Make w usable by the ops (upload, derived data; sets w->dev).  0,
     * KVP_EUNSUPPORTED naming the tensor, or KVP_ENOMEM. */
    int (*prepare_weight)(kvp_backend *b, kvp_weight *w, kvp_err *err);
    /* Give back what prepare_weight made (w->dev NULL after; NULL dev is fine). */
    void (*release_weight)(kvp_backend *b, kvp_weight *w);

    /* y[n_tok][w.n_out] = x[n_tok][w.n_in] . w^T. */
    int (*matmul)(kvp_backend *b, const kvp_weight *w, const float *x, float *y, uint32_t n_tok, kvp_err *err);
    /* y[j] = x . w[j]^T, j < n_w: matmuls of one input (a layer's Q, K and
     * V; gate and up) that the backend may run as one (NULL: the engine
     * calls matmul for each).  Each y[j] the bits matmul gives. */
    int (*matmul_n)(kvp_backend *b, const kvp_weight *const *w, uint32_t n_w, const float *x, float *const *y,
                    uint32_t n_tok, kvp_err *err);
    /* out[t] = tokens' rows of the embedding table, as f32: [n_tok][w.n_in].
     * tokens: device [n_tok]; an id outside the table is KVP_EINVAL (a
     * backend that finds out asynchronously reports it at a later op). */
    int (*embed)(kvp_backend *b, const kvp_weight *w, const int32_t *tokens, uint32_t n_tok, float *out,
                 kvp_err *err);
    /* y = x / sqrt(mean(x^2) + eps) * w, per row of n (w: [n] f32).  y may be x. */
    int (*rmsnorm)(kvp_backend *b, const float *x, const kvp_weight *w, float *y, uint32_t n_tok, uint32_t n,
                   float eps, kvp_err *err);
    /* Rotate each head of x[n_tok][n_head * head_dim] in place by its
     * position pos[t] (device): pairs (2i, 2i+1) for NORM, (i, i + rot_dim/2)
     * for NEOX, angle pos * inv_freq[i], i < rot_dim / 2 (inv_freq: f32
     * [rot_dim / 2]; dims past rot_dim are left alone). */
    int (*rope)(kvp_backend *b, float *x, uint32_t n_tok, uint32_t n_head, uint32_t head_dim, uint32_t rot_dim,
                const int32_t *pos, const kvp_weight *inv_freq, int kind, kvp_err *err);
    /* x[t] += bias, per row of n (bias: [n] f32; the QKV biases). */
    int (*add_bias)(kvp_backend *b, float *x, const kvp_weight *bias, uint32_t n_tok, uint32_t n, kvp_err *err);
    /* x += y over n elements. */
    int (*add)(kvp_backend *b, float *x, const float *y, size_t n, kvp_err *err);
    /* g = silu(g) * u over n elements (SwiGLU). */
    int (*silu_mul)(kvp_backend *b, float *g, const float *u, size_t n, kvp_err *err);
    /* dst[i] = src[rows[i]], i < n_rows, rows of n floats (rows: device
     * [n_rows]); dst and src do not overlap. */
    int (*gather_rows)(kvp_backend *b, float *dst, const float *src, const uint32_t *rows, uint32_t n_rows,
                       uint32_t n, kvp_err *err);
    /* ids (host) [n_rows] = each row of x[n_rows][n]'s argmax by
     * kvp_argmax_f32's rule (lib/num/argmax.h: the first of equal values,
     * NaN never, 0 when none counts), waiting for them as to_host does:
     * greedy decoding without copying whole rows of logits back.  NULL: the
     * engine copies the rows and picks on the host. */
    int (*argmax_rows)(kvp_backend *b, const float *x, uint32_t n_rows, uint32_t n, uint32_t *ids, kvp_err *err);
    /* Store k, v [n_tok][n_head_kv * head_dim] of one layer into the slots
     * (device [n_tok]; a scaled cache: each row with its own scale,
     * kvp_kvscale_row). */
    int (*kv_store)(kvp_backend *b, const kvp_kv_pool *kv, uint32_t layer, const float *k, const float *v,
                    uint32_t n_tok, const uint32_t *slot, kvp_err *err);
    int (*attention)(kvp_backend *b, const kvp_attn_args *a, kvp_err *err);
    /* Copy block src to block dst, every layer (copy-on-write). */
    int (*kv_copy_block)(kvp_backend *b, const kvp_kv_pool *kv, uint32_t dst, uint32_t src, kvp_err *err);
    /* Tensor parallelism (lib/engine/engine.h): x[n] = its sum over the
     * ranks of comm, in place, after a row-parallel matmul (MPI on the CPU;
     * a GPU backend uses its collective library on device memory, or the
     * host).  A peer that never comes aborts the job (comm.h). */
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

/* Prepare a weight when it is present (dtype >= 0); absent ones stay as they are. */
int kvp_backend_prepare(kvp_backend *b, kvp_weight *w, kvp_err *err);

#endif
