/* kvcache.h - the paged KV cache: a pool of fixed-size blocks, a block table
 * per sequence, reference counts with copy-on-write, and prefix sharing.
 *
 * A block holds block_size token slots of K and V for every layer (layout in
 * lib/backend.h).  A sequence's position p lives in its block p / block_size,
 * slot p % block_size.  Full blocks are immutable; each is named by a hash
 * chained from its parent's (kvp_kvblock_hash, lib/stream.h), so two
 * sequences whose prompts start alike reach the same hashes, and
 * kvp_kvcache_seq_share_prefix lets the second reuse the first one's blocks
 * instead of computing them again.  A block that several sequences hold
 * (after a fork, or a shared prefix) is copied before one of them writes
 * into it.
 *
 * Hashes are registered when a block's tokens are appended, before the
 * forward step writes its K/V; the engine writes every token's K/V of a layer
 * before any attention of that layer reads, so a sequence may share blocks
 * that are being computed in the same step.  A step that fails truncates its
 * sequences back, and blocks a truncation drops leave the table.
 *
 * A prefix cache across requests: a full block whose last holder lets go
 * (kvp_kvcache_seq_free) keeps its hash and waits, least recently freed
 * first, until its memory is needed, so a later prompt with the same start
 * (a system prompt, a conversation's history) reuses it.  A hit is trusted
 * only when the block's own tokens and parent hash equal the prompt's (each
 * block keeps them), so a crafted hash collision cannot hand a request
 * another's K/V; and a sequence's salt (kvp_kvcache_seq_set_salt) starts
 * its hash chain, so requests of different salts (tenants) share nothing.
 */
#ifndef KVP_KVCACHE_H
#define KVP_KVCACHE_H

#include "backend.h"
#include "config.h"
#include "error.h"

#include <stdint.h>

typedef struct kvp_kvcache_opts {
    uint32_t block_size;   /* tokens per block; 0: 16 */
    uint64_t n_blocks;     /* pool size in blocks; 0: from mem_bytes */
    uint64_t mem_bytes;    /* pool size in bytes when n_blocks is 0; both 0: n_ctx tokens */
    int dtype;             /* KVP_DTYPE_F16 (kvp_kvcache_opts_init), BF16, F32, or scaled FP8_E4M3 or I8 */
    int no_cache;          /* free full blocks right away instead of keeping them findable */
    int dtype_from_stream; /* a cache made for a KVP stream (seqio) takes the dtype of its first KV block */
} kvp_kvcache_opts;

typedef struct kvp_kvcache_stats {
    uint32_t n_blocks, n_free;   /* n_free: blocks that can be taken, cached ones included */
    uint32_t n_cached;           /* of those, freed full blocks still findable by their hash */
    uint64_t block_bytes;
    uint64_t prefix_blocks;  /* blocks attached through share_prefix (not computed) */
    uint64_t prefix_tokens;
    uint64_t cow_copies;     /* blocks copied before a write */
} kvp_kvcache_stats;

typedef struct kvp_kvcache kvp_kvcache;

void kvp_kvcache_opts_init(kvp_kvcache_opts *o);
/* Bytes of one block for this config, block size and dtype (0 if unknown dtype). */
uint64_t kvp_kvcache_block_bytes(const kvp_config *c, uint32_t block_size, int dtype);
/* The pool kvp_kvcache_create would make, not made: s->n_blocks (all
 * free), s->block_bytes and *block_size; the rest of *s 0.  0 or create's
 * code for a bad option or a pool too large (not the backend's say). */
int kvp_kvcache_size(const kvp_config *c, const kvp_kvcache_opts *o, kvp_kvcache_stats *s, uint32_t *block_size,
                     kvp_err *err);
/* Allocate the pool on backend be.  0 or a code (KVP_EINVAL for a bad
 * option, KVP_ELIMIT past 2^30 blocks or KVP_KV_MAX_SLOTS = 2^32 token slots,
 * KVP_ENOMEM naming the bytes asked). */
int kvp_kvcache_create(kvp_kvcache **kc, const kvp_config *c, const kvp_kvcache_opts *o, kvp_backend *be,
                       kvp_err *err);
void kvp_kvcache_free(kvp_kvcache *kc);

/* The pool as kernels see it (valid until kvp_kvcache_free). */
const kvp_kv_pool *kvp_kvcache_pool(const kvp_kvcache *kc);
void kvp_kvcache_get_stats(const kvp_kvcache *kc, kvp_kvcache_stats *s);

/* A new empty sequence: its handle (>= 0) or a negative code. */
int kvp_kvcache_seq_new(kvp_kvcache *kc, kvp_err *err);
/* Salt an empty sequence's hash chain (0: none), before its first tokens:
 * it only ever shares blocks with sequences of the same salt.  0 or
 * KVP_EINVAL. */
int kvp_kvcache_seq_set_salt(kvp_kvcache *kc, int seq, uint64_t salt, kvp_err *err);
/* Drop a sequence and its references to blocks (bad handles are ignored). */
void kvp_kvcache_seq_free(kvp_kvcache *kc, int seq);
/* A new sequence holding the same blocks and tokens as src (no copy until
 * one of them writes into a shared partial block).  Handle or a code. */
int kvp_kvcache_seq_fork(kvp_kvcache *kc, int src, kvp_err *err);
/* For an empty sequence about to take the prompt tokens[n]: attach the
 * cached full blocks whose hash chain matches the prompt's start, leaving at
 * least one token to compute (its logits are needed).  Returns the number of
 * tokens now cached (a multiple of block_size), or a negative code. */
int kvp_kvcache_seq_share_prefix(kvp_kvcache *kc, int seq, const uint32_t *tokens, uint32_t n, kvp_err *err);
/* Reserve slots for n more tokens at positions len .. len+n-1, copying a
 * shared last block first and taking new blocks as needed; slots[i] gets
 * block * block_size + offset for position len+i.  On failure (KVP_ELIMIT
 * when the pool runs out, with the numbers) nothing changes. */
int kvp_kvcache_seq_append(kvp_kvcache *kc, int seq, const uint32_t *tokens, uint32_t n, uint32_t *slots,
                           kvp_err *err);
/* New blocks seq_append would take for n more tokens (a copy of a shared
 * partial last block included): what a scheduler asks before it plans. */
/* kvp_kvcache_seq_append for a draft tree's rows (kvp_step_seq.parent):
 * the blocks it fills are not registered for reuse, since their rows are
 * not the sequence's tokens in order. */
int kvp_kvcache_seq_append_draft(kvp_kvcache *kc, int seq, const uint32_t *tokens, uint32_t n, uint32_t *slots,
                                 kvp_err *err);
/* After a draft tree's step from length base: the path that stays, its
 * rows rows[0..n) (rising, rows[i] >= i, counted from base), moves down to
 * positions base .. base+n-1 (K/V of every layer, and the tokens), the
 * sequence is cut to base + n, and the blocks it fills are registered. */
int kvp_kvcache_seq_keep_path(kvp_kvcache *kc, int seq, uint32_t base, const uint32_t *rows, uint32_t n, kvp_err *err);
uint64_t kvp_kvcache_seq_blocks_needed(const kvp_kvcache *kc, int seq, uint32_t n);
/* Add one whole block to a sequence whose length is a multiple of
 * block_size, for loading a saved stream: tokens[n] (n <= block_size) are its
 * tokens.  from >= 0 names a block already in the pool with the same content:
 * a full one is shared (no copy), a partial one is copied.  from < 0 takes a
 * new block filled from host[block_bytes].  Returns the block id used, or a
 * negative code (KVP_ELIMIT when the pool is full). */
int64_t kvp_kvcache_seq_push_block(kvp_kvcache *kc, int seq, const uint32_t *tokens, uint32_t n, int64_t from,
                                   const void *host, kvp_err *err);
/* Forget positions >= n (speculative decoding rolls back). n <= len. */
int kvp_kvcache_seq_truncate(kvp_kvcache *kc, int seq, uint32_t n, kvp_err *err);

/* A sequence's state (NULL / 0 for a bad handle). */
uint32_t kvp_kvcache_seq_len(const kvp_kvcache *kc, int seq);
const uint32_t *kvp_kvcache_seq_tokens(const kvp_kvcache *kc, int seq);
const uint32_t *kvp_kvcache_seq_blocks(const kvp_kvcache *kc, int seq);
uint32_t kvp_kvcache_seq_n_blocks(const kvp_kvcache *kc, int seq);

/* A block's chained hash (0 while it is not full) and reference count. */
uint64_t kvp_kvcache_block_hash(const kvp_kvcache *kc, uint32_t block);
uint32_t kvp_kvcache_block_refs(const kvp_kvcache *kc, uint32_t block);
/* The full block registered under hash, or -1. */
int64_t kvp_kvcache_find_hash(const kvp_kvcache *kc, uint64_t hash);
/* Called after every block copy the cache makes (copy-on-write, a partial
 * block pushed from another): tensor parallelism replays them on the other
 * ranks' pools (engine.h).  NULL: none. */
typedef void (*kvp_kvcache_copy_hook)(void *ctx, uint32_t dst, uint32_t src);
void kvp_kvcache_set_copy_hook(kvp_kvcache *kc, kvp_kvcache_copy_hook fn, void *ctx);
/* Under tensor or pipeline parallelism a rank's pool holds some layers
 * and heads of each block; what the job's cache holds is whole blocks, as a
 * KV stream writes them.  The driver sets that shape and a reader of whole
 * blocks (engine.h's gather); kvp_kvcache_whole and
 * kvp_kvcache_block_read_whole give them, or the pool and its own bytes
 * when none is set.  The reader returns 0 or a code. */
typedef int (*kvp_kvcache_read_hook)(void *ctx, uint32_t block, void *host, kvp_err *err);
typedef int (*kvp_kvcache_write_hook)(void *ctx, uint32_t block, const void *host, kvp_err *err);
void kvp_kvcache_set_whole(kvp_kvcache *kc, const kvp_kv_pool *whole, kvp_kvcache_read_hook rd,
                           kvp_kvcache_write_hook wr, void *ctx);
const kvp_kv_pool *kvp_kvcache_whole(const kvp_kvcache *kc);
int kvp_kvcache_block_read_whole(kvp_kvcache *kc, uint32_t block, void *host, kvp_err *err);
/* Write a whole block (kvp_kvcache_seq_push_block's host bytes go here). */
int kvp_kvcache_block_write_whole(kvp_kvcache *kc, uint32_t block, const void *host, kvp_err *err);
/* Give the cache a new pool shaped for config c (same blocks, block size
 * and dtype; its blocks' bytes are not carried over): a stream read whole
 * into one process's cache becomes a rank's.  The old pool's memory is the
 * caller's (release it with the backend).  0 or a code (nothing changed). */
int kvp_kvcache_repool(kvp_kvcache *kc, const kvp_config *c, kvp_kv_pool *old, kvp_err *err);
/* Copy a block's bytes to host memory (block_bytes) / from host memory. */
int kvp_kvcache_block_read(kvp_kvcache *kc, uint32_t block, void *host, kvp_err *err);
int kvp_kvcache_block_write(kvp_kvcache *kc, uint32_t block, const void *host, kvp_err *err);

#endif
