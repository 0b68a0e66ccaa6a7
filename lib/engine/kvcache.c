/* kvcache.c - block pool, block tables, refcounts, copy-on-write, prefix hashes.
 *
 * Invariants (checked by KVP_ASSERT and, in debug builds, by a walk of the
 * whole cache after every change, kvcache_check):
 *   - a block is free (on the free list, refs 0, no hash), cached (on the
 *     LRU list, refs 0, a hash: its content is still the full block the
 *     hash names) or held (refs = the number of block-table entries naming
 *     it, over all sequences);
 *   - a sequence of n tokens holds ceil(n / block_size) blocks;
 *   - a block with a hash is the first block registered under it: a find
 *     by that hash returns it, and its content is the full block the hash
 *     names, so nothing writes into it (a holder that must write copies it
 *     first, or unregisters it when it holds it alone).
 */
#include "kvcache.h"
#include "debug.h"
#include "kvscale.h"
#include "stream.h"
#include "tensor.h"

#include <stdlib.h>
#include <string.h>

#define NONE UINT32_MAX

typedef struct kvseq {
    int used;
    uint64_t salt;         /* the hash chain's start (0: unsalted) */
    uint32_t *blocks, n_blocks, cap_blocks;
    uint32_t *tokens, n_tokens, cap_tokens;
} kvseq;

struct kvp_kvcache {
    kvp_kv_pool pool;
    kvp_backend *be;
    uint32_t *refs;        /* [n_blocks] */
    uint64_t *hash;        /* [n_blocks] chained hash of a registered full block, else 0 */
    uint32_t *next;        /* [n_blocks] hash-bucket chain */
    uint32_t *bucket;      /* [n_bucket] first block of each chain */
    uint32_t n_bucket;     /* power of two */
    uint32_t *free_list, n_free;
    /* freed full blocks kept findable, least recently freed at the head */
    uint32_t *lru_prev, *lru_next, lru_head, lru_tail, n_cached;
    int no_cache;
    /* what each registered block's hash names, to check a hit: its tokens
     * [n_blocks][block_size] and its parent's hash */
    uint32_t *btok;
    uint64_t *bparent;
    kvseq *seqs;
    uint32_t n_seqs;
    kvp_kvcache_stats st;
    kvp_kvcache_copy_hook on_copy;
    void *on_copy_ctx;
    kvp_kv_pool whole;     /* the job's whole blocks (kvp_kvcache_set_whole), when read_whole is set */
    kvp_kvcache_read_hook read_whole;
    kvp_kvcache_write_hook write_whole;
    void *read_whole_ctx;
};

/* Copy a block in the pool, and tell the hook (tensor-parallel ranks copy theirs). */
static int copy_block(kvp_kvcache *kc, uint32_t dst, uint32_t src, kvp_err *err)
{
    int rc = kc->be->ops->kv_copy_block(kc->be, &kc->pool, dst, src, err);
    if (rc == 0 && kc->on_copy)
        kc->on_copy(kc->on_copy_ctx, dst, src);
    return rc;
}

void kvp_kvcache_set_copy_hook(kvp_kvcache *kc, kvp_kvcache_copy_hook fn, void *ctx)
{
    kc->on_copy = fn;
    kc->on_copy_ctx = ctx;
}

#if KVP_DEBUG
static void kvcache_check(const kvp_kvcache *kc);
#define KVCACHE_CHECK(kc) kvcache_check(kc)
#else
#define KVCACHE_CHECK(kc) ((void)0)
#endif

void kvp_kvcache_opts_init(kvp_kvcache_opts *o)
{
    memset(o, 0, sizeof *o);
    o->block_size = 16;
    o->dtype = KVP_DTYPE_F16;
}

/* Element bytes of a KV dtype the cache holds, 0 for others. */
static uint64_t kv_elem_bytes(int dtype)
{
    if (dtype == KVP_DTYPE_F32)
        return 4;
    if (dtype == KVP_DTYPE_F16 || dtype == KVP_DTYPE_BF16)
        return 2;
    return kvp_kvscale_dtype(dtype) ? 1 : 0;
}

/* Bytes of a block's data; its scales (a scaled dtype) follow. */
static uint64_t block_data_bytes(const kvp_config *c, uint32_t block_size, int dtype)
{
    return (uint64_t)c->n_layer * 2 * c->n_head_kv * block_size * c->head_dim * kv_elem_bytes(dtype);
}

uint64_t kvp_kvcache_block_bytes(const kvp_config *c, uint32_t block_size, int dtype)
{
    uint64_t scales = kvp_kvscale_dtype(dtype) ? (uint64_t)c->n_layer * 2 * c->n_head_kv * block_size * 4 : 0;
    return block_data_bytes(c, block_size, dtype) + scales;
}

void kvp_kvcache_free(kvp_kvcache *kc)
{
    if (!kc)
        return;
    if (kc->pool.base)
        kc->be->ops->release(kc->be, kc->pool.base);
    for (uint32_t i = 0; i < kc->n_seqs; i++) {
        free(kc->seqs[i].blocks);
        free(kc->seqs[i].tokens);
    }
    free(kc->seqs);
    free(kc->refs);
    free(kc->hash);
    free(kc->next);
    free(kc->bucket);
    free(kc->free_list);
    free(kc->lru_prev);
    free(kc->lru_next);
    free(kc->btok);
    free(kc->bparent);
    free(kc);
}

int kvp_kvcache_size(const kvp_config *c, const kvp_kvcache_opts *o, kvp_kvcache_stats *s, uint32_t *block_size,
                     kvp_err *err)
{
    memset(s, 0, sizeof *s);
    *block_size = 0;
    uint32_t bs = o->block_size ? o->block_size : 16;
    if (bs > 4096)
        return kvp_err_set(err, KVP_EINVAL, "block size %u: more than 4096 tokens", bs);
    if (!kv_elem_bytes(o->dtype))
        return kvp_err_set(err, KVP_EINVAL, "KV dtype %s: use f16, bf16, f32, fp8 or int8",
                           kvp_dtype_name((uint32_t)o->dtype));
    uint64_t bb = kvp_kvcache_block_bytes(c, bs, o->dtype);
    if (bb == 0)
        return kvp_err_set(err, KVP_EINVAL, "KV block of zero bytes (config has no layers or heads)");
    uint64_t nb = o->n_blocks;
    if (!nb && o->mem_bytes)
        nb = o->mem_bytes / bb;
    if (!nb && !o->mem_bytes)
        nb = ((uint64_t)(c->n_ctx ? c->n_ctx : 4096) + bs - 1) / bs;
    if (nb == 0)
        return kvp_err_set(err, KVP_EINVAL, "KV memory %llu bytes holds no block of %llu bytes (%u tokens)",
                           (unsigned long long)o->mem_bytes, (unsigned long long)bb, bs);
    if (nb > (1u << 30) || nb * bb / bb != nb)
        return kvp_err_set(err, KVP_ELIMIT, "KV pool of %llu blocks is too large (at most 2^30)",
                           (unsigned long long)nb);
    /* A token's slot id, block * block_size + offset, is 32 bits in the
     * backend interface (kv_store's slots, the block tables): the pool holds
     * at most 2^32 token slots.  That is ~90 TiB of f16 KV even for
     * SmolLM2-135M (23,040 bytes a token), so the bound costs nothing real,
     * and the slot arrays stay half the size of 64-bit ones. */
    if (nb * bs > KVP_KV_MAX_SLOTS)
        return kvp_err_set(err, KVP_ELIMIT,
                           "KV pool of %llu blocks x %u tokens = %llu token slots: more than 2^32 (a slot id is 32 "
                           "bits); use fewer or smaller blocks", (unsigned long long)nb, bs,
                           (unsigned long long)(nb * bs));
    s->n_blocks = s->n_free = (uint32_t)nb;
    s->block_bytes = bb;
    *block_size = bs;
    return 0;
}

int kvp_kvcache_create(kvp_kvcache **out, const kvp_config *c, const kvp_kvcache_opts *o, kvp_backend *be,
                       kvp_err *err)
{
    *out = NULL;
    kvp_kvcache_stats size;
    uint32_t bs;
    int rc = kvp_kvcache_size(c, o, &size, &bs, err);
    if (rc < 0)
        return rc;
    uint64_t nb = size.n_blocks, bb = size.block_bytes;
    if (!be->ops->supports(be, KVP_USE_KV, o->dtype, kvp_kvscale_dtype(o->dtype)))
        return kvp_err_set(err, KVP_EUNSUPPORTED, "KV cache: the %s backend has no %s cache", be->ops->name,
                           kvp_dtype_name((uint32_t)o->dtype));
    kvp_kvcache *kc = calloc(1, sizeof *kc);
    if (!kc)
        return kvp_err_set(err, KVP_ENOMEM, "KV cache: out of memory");
    kc->be = be;
    kc->pool = (kvp_kv_pool){.dtype = o->dtype, .n_blocks = (uint32_t)nb, .block_size = bs, .n_layer = c->n_layer,
                             .n_head_kv = c->n_head_kv, .head_dim = c->head_dim, .block_bytes = bb,
                             .scales_off = kvp_kvscale_dtype(o->dtype) ? block_data_bytes(c, bs, o->dtype) : 0};
    kc->n_bucket = 16;
    while (kc->n_bucket < nb * 2)
        kc->n_bucket *= 2;
    kc->refs = calloc(nb, sizeof *kc->refs);
    kc->hash = calloc(nb, sizeof *kc->hash);
    kc->next = malloc(nb * sizeof *kc->next);
    kc->free_list = malloc(nb * sizeof *kc->free_list);
    kc->bucket = malloc(kc->n_bucket * sizeof *kc->bucket);
    kc->lru_prev = malloc(nb * sizeof *kc->lru_prev);
    kc->lru_next = malloc(nb * sizeof *kc->lru_next);
    kc->btok = malloc(nb * bs * sizeof *kc->btok);
    kc->bparent = malloc(nb * sizeof *kc->bparent);
    kc->lru_head = kc->lru_tail = NONE;
    kc->no_cache = o->no_cache;
    if (kc->refs && kc->hash && kc->next && kc->free_list && kc->bucket && kc->lru_prev && kc->lru_next && kc->btok &&
        kc->bparent)
        kc->pool.base = be->ops->alloc(be, (size_t)(nb * bb));
    if (!kc->pool.base) {
        kvp_kvcache_free(kc);
        return kvp_err_set(err, KVP_ENOMEM, "KV cache: cannot allocate %llu blocks x %llu bytes = %.1f MiB",
                           (unsigned long long)nb, (unsigned long long)bb, (double)(nb * bb) / (1 << 20));
    }
    memset(kc->bucket, 0xff, kc->n_bucket * sizeof *kc->bucket);
    /* Hand blocks out lowest id first (pop from the end). */
    for (uint32_t i = 0; i < nb; i++)
        kc->free_list[i] = (uint32_t)nb - 1 - i;
    kc->n_free = (uint32_t)nb;
    kc->st.n_blocks = (uint32_t)nb;
    kc->st.block_bytes = bb;
    KVCACHE_CHECK(kc);
    *out = kc;
    return 0;
}

const kvp_kv_pool *kvp_kvcache_pool(const kvp_kvcache *kc) { return &kc->pool; }

/* Blocks that can be taken: free, or cached (the least recently freed is
 * given up first). */
static uint32_t blocks_avail(const kvp_kvcache *kc) { return kc->n_free + kc->n_cached; }

void kvp_kvcache_get_stats(const kvp_kvcache *kc, kvp_kvcache_stats *s)
{
    *s = kc->st;
    s->n_free = blocks_avail(kc);
    s->n_cached = kc->n_cached;
}

/* ---- hash table of full blocks ---- */

static uint32_t bucket_of(const kvp_kvcache *kc, uint64_t h) { return (uint32_t)(h ^ (h >> 32)) & (kc->n_bucket - 1); }

int64_t kvp_kvcache_find_hash(const kvp_kvcache *kc, uint64_t h)
{
    if (!h)
        return -1;
    for (uint32_t b = kc->bucket[bucket_of(kc, h)]; b != NONE; b = kc->next[b])
        if (kc->hash[b] == h)
            return b;
    return -1;
}

/* Register block b under h unless another block already holds h (the first
 * stays canonical; b is then simply an unshared duplicate). */
/* Register full block b under h, remembering what h names. */
static void hash_add(kvp_kvcache *kc, uint32_t b, uint64_t h, uint64_t parent, const uint32_t *tokens)
{
    if (!h || kvp_kvcache_find_hash(kc, h) >= 0)
        return;
    uint32_t bs = kc->pool.block_size;
    memcpy(kc->btok + (size_t)b * bs, tokens, (size_t)bs * sizeof *tokens);
    kc->bparent[b] = parent;
    KVP_ASSERT(kc->refs[b] > 0 && kc->hash[b] == 0);
    uint32_t k = bucket_of(kc, h);
    kc->hash[b] = h;
    kc->next[b] = kc->bucket[k];
    kc->bucket[k] = b;
}

static void hash_remove(kvp_kvcache *kc, uint32_t b)
{
    uint64_t h = kc->hash[b];
    if (!h)
        return;
    uint32_t *pp = &kc->bucket[bucket_of(kc, h)];
    while (*pp != NONE && *pp != b)
        pp = &kc->next[*pp];
    KVP_ASSERT(*pp == b); /* a block with a hash is in its bucket's chain */
    if (*pp == b)
        *pp = kc->next[b];
    kc->hash[b] = 0;
}

/* ---- blocks ---- */

static void lru_push(kvp_kvcache *kc, uint32_t b)
{
    kc->lru_prev[b] = kc->lru_tail;
    kc->lru_next[b] = NONE;
    if (kc->lru_tail != NONE)
        kc->lru_next[kc->lru_tail] = b;
    else
        kc->lru_head = b;
    kc->lru_tail = b;
    kc->n_cached++;
}

static void lru_remove(kvp_kvcache *kc, uint32_t b)
{
    uint32_t p = kc->lru_prev[b], n = kc->lru_next[b];
    if (p != NONE)
        kc->lru_next[p] = n;
    else
        kc->lru_head = n;
    if (n != NONE)
        kc->lru_prev[n] = p;
    else
        kc->lru_tail = p;
    KVP_ASSERT(kc->n_cached > 0);
    kc->n_cached--;
}

static uint32_t block_take(kvp_kvcache *kc)
{
    KVP_ASSERT(blocks_avail(kc) > 0); /* callers count the blocks they need first */
    uint32_t b;
    if (kc->n_free) {
        b = kc->free_list[--kc->n_free];
    } else { /* give up the least recently freed cached block */
        b = kc->lru_head;
        lru_remove(kc, b);
        hash_remove(kc, b);
    }
    KVP_ASSERT(b < kc->pool.n_blocks && kc->refs[b] == 0 && kc->hash[b] == 0);
    kc->refs[b] = 1;
    return b;
}

/* Hold block b once more; a cached block leaves the LRU list. */
static void block_ref(kvp_kvcache *kc, uint32_t b)
{
    if (kc->refs[b] == 0) {
        KVP_ASSERT(kc->hash[b] != 0); /* only a cached block is taken back this way */
        lru_remove(kc, b);
    }
    kc->refs[b]++;
}

/* Let go of block b: at its last holder a full registered block stays
 * findable (cached) unless caching is off; anything else is free. */
static void block_unref(kvp_kvcache *kc, uint32_t b)
{
    KVP_ASSERT(b < kc->pool.n_blocks && kc->refs[b] > 0);
    if (kc->refs[b] && --kc->refs[b] == 0) {
        if (kc->hash[b] && !kc->no_cache) {
            lru_push(kc, b);
        } else {
            hash_remove(kc, b);
            kc->free_list[kc->n_free++] = b;
        }
    }
}

/* Whether registered block b holds what a prompt's block i names: its
 * tokens and its parent's hash, not only the same 64-bit hash. */
static int block_is(const kvp_kvcache *kc, uint32_t b, uint64_t parent, const uint32_t *tokens)
{
    uint32_t bs = kc->pool.block_size;
    return kc->bparent[b] == parent && memcmp(kc->btok + (size_t)b * bs, tokens, (size_t)bs * sizeof *tokens) == 0;
}

uint64_t kvp_kvcache_block_hash(const kvp_kvcache *kc, uint32_t b) { return b < kc->pool.n_blocks ? kc->hash[b] : 0; }
uint32_t kvp_kvcache_block_refs(const kvp_kvcache *kc, uint32_t b) { return b < kc->pool.n_blocks ? kc->refs[b] : 0; }

int kvp_kvcache_block_read(kvp_kvcache *kc, uint32_t b, void *host, kvp_err *err)
{
    return kc->be->ops->to_host(kc->be, host, (uint8_t *)kc->pool.base + (size_t)b * kc->pool.block_bytes,
                                kc->pool.block_bytes, err);
}

void kvp_kvcache_set_whole(kvp_kvcache *kc, const kvp_kv_pool *whole, kvp_kvcache_read_hook rd,
                           kvp_kvcache_write_hook wr, void *ctx)
{
    if (whole)
        kc->whole = *whole;
    kc->read_whole = whole ? rd : NULL;
    kc->write_whole = whole ? wr : NULL;
    kc->read_whole_ctx = ctx;
}

int kvp_kvcache_block_write_whole(kvp_kvcache *kc, uint32_t b, const void *host, kvp_err *err)
{
    if (kc->write_whole)
        return kc->write_whole(kc->read_whole_ctx, b, host, err);
    return kvp_kvcache_block_write(kc, b, host, err);
}

int kvp_kvcache_repool(kvp_kvcache *kc, const kvp_config *c, kvp_kv_pool *old, kvp_err *err)
{
    kvp_kv_pool p = kc->pool;
    p.n_layer = c->n_layer;
    p.n_head_kv = c->n_head_kv;
    p.head_dim = c->head_dim;
    p.block_bytes = kvp_kvcache_block_bytes(c, p.block_size, p.dtype);
    p.scales_off = kvp_kvscale_dtype(p.dtype) ? block_data_bytes(c, p.block_size, p.dtype) : 0;
    if (!p.block_bytes || !(p.base = kc->be->ops->alloc(kc->be, (size_t)p.n_blocks * p.block_bytes)))
        return kvp_err_set(err, KVP_ENOMEM, "KV cache: cannot allocate %u blocks x %llu bytes", p.n_blocks,
                           (unsigned long long)p.block_bytes);
    *old = kc->pool;
    kc->pool = p;
    return 0;
}

const kvp_kv_pool *kvp_kvcache_whole(const kvp_kvcache *kc) { return kc->read_whole ? &kc->whole : &kc->pool; }

int kvp_kvcache_block_read_whole(kvp_kvcache *kc, uint32_t b, void *host, kvp_err *err)
{
    if (kc->read_whole)
        return kc->read_whole(kc->read_whole_ctx, b, host, err);
    return kvp_kvcache_block_read(kc, b, host, err);
}

int kvp_kvcache_block_write(kvp_kvcache *kc, uint32_t b, const void *host, kvp_err *err)
{
    return kc->be->ops->from_host(kc->be, (uint8_t *)kc->pool.base + (size_t)b * kc->pool.block_bytes, host,
                                  kc->pool.block_bytes, err);
}

/* ---- sequences ---- */

static kvseq *seq_get(const kvp_kvcache *kc, int seq)
{
    if (seq < 0 || (uint32_t)seq >= kc->n_seqs || !kc->seqs[seq].used)
        return NULL;
    return &kc->seqs[seq];
}

static int grow_u32(uint32_t **p, uint32_t *cap, uint64_t need)
{
    if (need <= *cap)
        return 0;
    if (need > (1u << 30))
        return -1;
    uint64_t n = *cap ? *cap : 16;
    while (n < need)
        n *= 2;
    uint32_t *q = realloc(*p, n * sizeof *q);
    if (!q)
        return -1;
    *p = q;
    *cap = (uint32_t)n;
    return 0;
}

int kvp_kvcache_seq_new(kvp_kvcache *kc, kvp_err *err)
{
    for (uint32_t i = 0; i < kc->n_seqs; i++) {
        if (!kc->seqs[i].used) {
            kc->seqs[i].used = 1;
            kc->seqs[i].n_blocks = kc->seqs[i].n_tokens = 0;
            kc->seqs[i].salt = 0;
            return (int)i;
        }
    }
    if (kc->n_seqs >= (1u << 24))
        return kvp_err_set(err, KVP_ELIMIT, "KV cache: more than %u sequences", 1u << 24);
    kvseq *s = realloc(kc->seqs, (kc->n_seqs + 1) * sizeof *s);
    if (!s)
        return kvp_err_set(err, KVP_ENOMEM, "KV cache: out of memory for a sequence");
    kc->seqs = s;
    memset(&s[kc->n_seqs], 0, sizeof *s);
    s[kc->n_seqs].used = 1;
    return (int)kc->n_seqs++;
}

void kvp_kvcache_seq_free(kvp_kvcache *kc, int seq)
{
    kvseq *s = seq_get(kc, seq);
    if (!s)
        return;
    for (uint32_t i = 0; i < s->n_blocks; i++)
        block_unref(kc, s->blocks[i]);
    s->n_blocks = s->n_tokens = 0;
    s->salt = 0; /* the handle's next sequence starts unsalted */
    s->used = 0;
    KVCACHE_CHECK(kc);
}

int kvp_kvcache_seq_set_salt(kvp_kvcache *kc, int seq, uint64_t salt, kvp_err *err)
{
    kvseq *s = seq_get(kc, seq);
    if (!s || s->n_tokens)
        return kvp_err_set(err, KVP_EINVAL, "KV cache: salt for sequence %d, which is unknown or not empty", seq);
    s->salt = salt;
    return 0;
}

int kvp_kvcache_seq_fork(kvp_kvcache *kc, int src, kvp_err *err)
{
    if (!seq_get(kc, src))
        return kvp_err_set(err, KVP_EINVAL, "KV cache: fork of unknown sequence %d", src);
    int id = kvp_kvcache_seq_new(kc, err);
    if (id < 0)
        return id;
    kvseq *s = &kc->seqs[src], *d = &kc->seqs[id]; /* after seq_new: it may move seqs */
    if (grow_u32(&d->blocks, &d->cap_blocks, s->n_blocks) < 0 || grow_u32(&d->tokens, &d->cap_tokens, s->n_tokens) < 0) {
        kvp_kvcache_seq_free(kc, id);
        return kvp_err_set(err, KVP_ENOMEM, "KV cache: out of memory forking sequence %d", src);
    }
    memcpy(d->blocks, s->blocks, s->n_blocks * sizeof *d->blocks);
    memcpy(d->tokens, s->tokens, s->n_tokens * sizeof *d->tokens);
    d->n_blocks = s->n_blocks;
    d->n_tokens = s->n_tokens;
    d->salt = s->salt;
    for (uint32_t i = 0; i < d->n_blocks; i++) {
        KVP_ASSERT(kc->refs[d->blocks[i]] > 0);
        kc->refs[d->blocks[i]]++;
    }
    KVCACHE_CHECK(kc);
    return id;
}

/* Hash of the full block i of s (chained through the blocks before it). */
static uint64_t chain_hash(const kvp_kvcache *kc, const uint32_t *tokens, uint32_t i, uint64_t parent)
{
    uint32_t bs = kc->pool.block_size;
    return kvp_kvblock_hash(parent, tokens + (size_t)i * bs, bs);
}

int kvp_kvcache_seq_share_prefix(kvp_kvcache *kc, int seq, const uint32_t *tokens, uint32_t n, kvp_err *err)
{
    kvseq *s = seq_get(kc, seq);
    if (!s)
        return kvp_err_set(err, KVP_EINVAL, "KV cache: unknown sequence %d", seq);
    if (s->n_tokens || n == 0)
        return 0;
    uint32_t bs = kc->pool.block_size, max_blocks = (n - 1) / bs, got = 0;
    uint64_t h = s->salt;
    int64_t found[64];
    int miss = 0;
    while (got < max_blocks && !miss) {
        /* Attach in batches so a long prompt needs no big scratch array. */
        uint32_t k = 0;
        while (k < 64 && got + k < max_blocks) {
            uint64_t parent = h;
            h = chain_hash(kc, tokens, got + k, h);
            found[k] = kvp_kvcache_find_hash(kc, h);
            if (found[k] < 0 || !block_is(kc, (uint32_t)found[k], parent, tokens + (size_t)(got + k) * bs)) {
                miss = 1;
                break;
            }
            k++;
        }
        if (k == 0)
            break;
        if (grow_u32(&s->blocks, &s->cap_blocks, (uint64_t)got + k) < 0 ||
            grow_u32(&s->tokens, &s->cap_tokens, (uint64_t)(got + k) * bs) < 0)
            return kvp_err_set(err, KVP_ENOMEM, "KV cache: out of memory sharing a prefix");
        for (uint32_t i = 0; i < k; i++) {
            s->blocks[got + i] = (uint32_t)found[i];
            block_ref(kc, (uint32_t)found[i]);
        }
        memcpy(s->tokens + (size_t)got * bs, tokens + (size_t)got * bs, (size_t)k * bs * sizeof *tokens);
        got += k;
        s->n_blocks = got;
        s->n_tokens = got * bs;
    }
    kc->st.prefix_blocks += got;
    kc->st.prefix_tokens += (uint64_t)got * bs;
    KVCACHE_CHECK(kc);
    return (int)(got * bs);
}

/* New blocks s needs to hold n more tokens: the ones past its last block,
 * plus a copy of its last block when that is partial and shared. */
static uint64_t blocks_needed(const kvp_kvcache *kc, const kvseq *s, uint32_t n)
{
    uint32_t bs = kc->pool.block_size, len = s->n_tokens;
    if (n == 0)
        return 0;
    uint64_t want_blocks = ((uint64_t)len + n + bs - 1) / bs;
    int cow = len % bs && kc->refs[s->blocks[s->n_blocks - 1]] > 1;
    return want_blocks - s->n_blocks + (uint64_t)cow;
}

uint64_t kvp_kvcache_seq_blocks_needed(const kvp_kvcache *kc, int seq, uint32_t n)
{
    const kvseq *s = seq_get(kc, seq);
    return s ? blocks_needed(kc, s, n) : 0;
}

/* Register the blocks of s that filled up from its token len on (to its
 * end), chaining from the block before. */
static void register_filled(kvp_kvcache *kc, kvseq *s, uint32_t len)
{
    uint32_t bs = kc->pool.block_size, first_full = len / bs, n_full = s->n_tokens / bs;
    uint64_t h = first_full ? kc->hash[s->blocks[first_full - 1]] : s->salt;
    if (first_full && !h) { /* parent is an unregistered duplicate: recompute its chain */
        h = s->salt;
        for (uint32_t i = 0; i < first_full; i++)
            h = chain_hash(kc, s->tokens, i, h);
    }
    for (uint32_t i = first_full; i < n_full; i++) {
        uint64_t parent = h;
        h = chain_hash(kc, s->tokens, i, h);
        hash_add(kc, s->blocks[i], h, parent, s->tokens + (size_t)i * bs);
    }
}

static int seq_append(kvp_kvcache *kc, int seq, const uint32_t *tokens, uint32_t n, uint32_t *slots, int reg,
                      kvp_err *err)
{
    kvseq *s = seq_get(kc, seq);
    if (!s)
        return kvp_err_set(err, KVP_EINVAL, "KV cache: unknown sequence %d", seq);
    if (n == 0)
        return 0;
    uint32_t bs = kc->pool.block_size, len = s->n_tokens;
    uint64_t end = (uint64_t)len + n, want_blocks = (end + bs - 1) / bs;
    if (end > (1u << 30))
        return kvp_err_set(err, KVP_ELIMIT, "KV cache: sequence %d would hold %llu tokens", seq,
                           (unsigned long long)end);
    int cow = len % bs && kc->refs[s->blocks[s->n_blocks - 1]] > 1;
    uint64_t need = blocks_needed(kc, s, n);
    if (need > blocks_avail(kc))
        return kvp_err_set(err, KVP_ELIMIT,
                           "KV cache out of blocks: sequence %d needs %llu more (of %u tokens each) for %u new tokens, "
                           "%u of %u blocks are free (%.1f MiB pool); raise --kv-mem or --kv-blocks",
                           seq, (unsigned long long)need, bs, n, blocks_avail(kc), kc->pool.n_blocks,
                           (double)kc->pool.n_blocks * (double)kc->pool.block_bytes / (1 << 20));
    if (grow_u32(&s->blocks, &s->cap_blocks, want_blocks) < 0 || grow_u32(&s->tokens, &s->cap_tokens, end) < 0)
        return kvp_err_set(err, KVP_ENOMEM, "KV cache: out of memory for sequence %d", seq);
    if (cow) {
        uint32_t old = s->blocks[s->n_blocks - 1], b = block_take(kc);
        int rc = copy_block(kc, b, old, err);
        if (rc < 0) {
            block_unref(kc, b);
            return rc;
        }
        block_unref(kc, old);
        s->blocks[s->n_blocks - 1] = b;
        kc->st.cow_copies++;
    } else if (len % bs) {
        /* A partial last block held once may still carry the hash of the
         * full contents it had before a truncation (kept while it was shared):
         * it is about to be written in place, so it leaves the table. */
        hash_remove(kc, s->blocks[s->n_blocks - 1]);
    }
    while (s->n_blocks < want_blocks)
        s->blocks[s->n_blocks++] = block_take(kc);
    memcpy(s->tokens + len, tokens, (size_t)n * sizeof *tokens);
    s->n_tokens = (uint32_t)end;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t p = len + i;
        KVP_ASSERT((uint64_t)s->blocks[p / bs] * bs + p % bs < (uint64_t)kc->pool.n_blocks * bs);
        slots[i] = s->blocks[p / bs] * bs + p % bs;
    }
    if (reg) /* the blocks this append filled */
        register_filled(kc, s, len);
    KVCACHE_CHECK(kc);
    return 0;
}

int kvp_kvcache_seq_append(kvp_kvcache *kc, int seq, const uint32_t *tokens, uint32_t n, uint32_t *slots,
                           kvp_err *err)
{
    return seq_append(kc, seq, tokens, n, slots, 1, err);
}

int kvp_kvcache_seq_append_draft(kvp_kvcache *kc, int seq, const uint32_t *tokens, uint32_t n, uint32_t *slots,
                                 kvp_err *err)
{
    return seq_append(kc, seq, tokens, n, slots, 0, err);
}

/* Position src's K/V (every layer, K and V, every head, and a scaled
 * pool's scales) copied to position dst of s, through host copies of
 * their blocks (buf: two blocks; ids[0..1] the blocks they hold, -1 none;
 * the second is written back by the caller). */
static int copy_position(kvp_kvcache *kc, const kvseq *s, uint32_t src, uint32_t dst, uint8_t *buf, int64_t *ids,
                         kvp_err *err)
{
    const kvp_kv_pool *kv = &kc->pool;
    uint32_t bs = kv->block_size, bsrc = s->blocks[src / bs], bdst = s->blocks[dst / bs];
    uint8_t *hs = buf, *hd = buf + kv->block_bytes;
    int rc;
    if (ids[1] != (int64_t)bdst) {
        if (ids[1] >= 0 && (rc = kvp_kvcache_block_write(kc, (uint32_t)ids[1], hd, err)) < 0)
            return rc;
        if ((rc = kvp_kvcache_block_read(kc, bdst, hd, err)) < 0)
            return rc;
        ids[1] = bdst;
    }
    if (bsrc == bdst) {
        hs = hd;
    } else if (ids[0] != (int64_t)bsrc) {
        if ((rc = kvp_kvcache_block_read(kc, bsrc, hs, err)) < 0)
            return rc;
        ids[0] = bsrc;
    }
    size_t row = (size_t)kv->head_dim * kvp_kv_esize(kv->dtype);
    for (uint32_t l = 0; l < kv->n_layer; l++)
        for (uint32_t w = 0; w < 2; w++)
            for (uint32_t h = 0; h < kv->n_head_kv; h++) {
                memmove(hd + kvp_kv_row_off(kv, l, w, h, dst % bs), hs + kvp_kv_row_off(kv, l, w, h, src % bs), row);
                if (kvp_kvscale_dtype(kv->dtype))
                    memmove(hd + kvp_kv_scale_off(kv, l, w, h, dst % bs), hs + kvp_kv_scale_off(kv, l, w, h, src % bs),
                            4);
            }
    return 0;
}

int kvp_kvcache_seq_keep_path(kvp_kvcache *kc, int seq, uint32_t base, const uint32_t *rows, uint32_t n, kvp_err *err)
{
    kvseq *s = seq_get(kc, seq);
    if (!s)
        return kvp_err_set(err, KVP_EINVAL, "KV cache: unknown sequence %d", seq);
    if (base > s->n_tokens || n > s->n_tokens - base)
        return kvp_err_set(err, KVP_EINVAL, "KV cache: sequence %d: a path of %u from %u of %u tokens", seq, n, base,
                           s->n_tokens);
    for (uint32_t i = 0; i < n; i++)
        if (rows[i] < i || rows[i] >= s->n_tokens - base || (i && rows[i] <= rows[i - 1]))
            return kvp_err_set(err, KVP_EINVAL, "KV cache: sequence %d: path row %u is %u (rows rise, each at "
                               "least its place, below %u)", seq, i, rows[i], s->n_tokens - base);
    /* In order: a row moves down to its place, and the places written are
     * below every row still to move (rows rise, each >= its place). */
    uint8_t *buf = NULL;
    int64_t ids[2] = {-1, -1};
    int rc = 0;
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        if (rows[i] == i)
            continue;
        if (!buf && !(buf = malloc(2 * (size_t)kc->pool.block_bytes)))
            return kvp_err_set(err, KVP_ENOMEM, "KV cache: out of memory for two blocks");
        rc = copy_position(kc, s, base + rows[i], base + i, buf, ids, err);
        s->tokens[base + i] = s->tokens[base + rows[i]];
    }
    if (rc == 0 && ids[1] >= 0)
        rc = kvp_kvcache_block_write(kc, (uint32_t)ids[1], buf + kc->pool.block_bytes, err);
    free(buf);
    if (rc < 0)
        return rc;
    if ((rc = kvp_kvcache_seq_truncate(kc, seq, base + n, err)) < 0)
        return rc;
    register_filled(kc, s, base);
    KVCACHE_CHECK(kc);
    return 0;
}

int64_t kvp_kvcache_seq_push_block(kvp_kvcache *kc, int seq, const uint32_t *tokens, uint32_t n, int64_t from,
                                   const void *host, kvp_err *err)
{
    kvseq *s = seq_get(kc, seq);
    uint32_t bs = kc->pool.block_size;
    if (!s)
        return kvp_err_set(err, KVP_EINVAL, "KV cache: unknown sequence %d", seq);
    if (s->n_tokens % bs || n == 0 || n > bs || (from >= 0 && (uint64_t)from >= kc->pool.n_blocks) ||
        (from < 0 && !host))
        return kvp_err_set(err, KVP_EINVAL, "KV cache: sequence %d: block of %u tokens cannot follow %u tokens "
                           "(block size %u)", seq, n, s->n_tokens, bs);
    uint64_t parent = s->n_blocks ? kc->hash[s->blocks[s->n_blocks - 1]] : s->salt;
    if (s->n_blocks && !parent) {
        parent = s->salt;
        for (uint32_t i = 0; i < s->n_blocks; i++)
            parent = chain_hash(kc, s->tokens, i, parent);
    }
    /* A full block that is held or cached is shared, if it holds what these
     * tokens name; a partial one is copied. */
    int share = from >= 0 && n == bs && (kc->refs[from] > 0 || kc->hash[from]) &&
                block_is(kc, (uint32_t)from, parent, tokens);
    if (from >= 0 && n == bs && !share && !host)
        return kvp_err_set(err, KVP_ENOTFOUND, "KV cache: sequence %d: block %lld does not hold the tokens asked for",
                           seq, (long long)from);
    if (!share && blocks_avail(kc) == 0)
        return kvp_err_set(err, KVP_ELIMIT, "KV cache out of blocks: sequence %d needs 1 more (of %u tokens each), "
                           "0 of %u blocks are free (%.1f MiB pool); raise --kv-mem or --kv-blocks",
                           seq, bs, kc->pool.n_blocks,
                           (double)kc->pool.n_blocks * (double)kc->pool.block_bytes / (1 << 20));
    if (grow_u32(&s->blocks, &s->cap_blocks, (uint64_t)s->n_blocks + 1) < 0 ||
        grow_u32(&s->tokens, &s->cap_tokens, (uint64_t)s->n_tokens + n) < 0)
        return kvp_err_set(err, KVP_ENOMEM, "KV cache: out of memory for sequence %d", seq);
    uint32_t b;
    int rc;
    if (share) {
        b = (uint32_t)from;
        block_ref(kc, b);
    } else {
        b = block_take(kc);
        rc = from >= 0 && !(n == bs && host) ? copy_block(kc, b, (uint32_t)from, err)
                                              : kvp_kvcache_block_write_whole(kc, b, host, err);
        if (rc < 0) {
            block_unref(kc, b);
            return rc;
        }
    }
    s->blocks[s->n_blocks++] = b;
    memcpy(s->tokens + s->n_tokens, tokens, (size_t)n * sizeof *tokens);
    s->n_tokens += n;
    if (n == bs && !share)
        hash_add(kc, b, kvp_kvblock_hash(parent, tokens, n), parent, tokens);
    KVCACHE_CHECK(kc);
    return b;
}

int kvp_kvcache_seq_truncate(kvp_kvcache *kc, int seq, uint32_t n, kvp_err *err)
{
    kvseq *s = seq_get(kc, seq);
    if (!s)
        return kvp_err_set(err, KVP_EINVAL, "KV cache: unknown sequence %d", seq);
    if (n > s->n_tokens)
        return kvp_err_set(err, KVP_EINVAL, "KV cache: truncate sequence %d to %u of %u tokens", seq, n, s->n_tokens);
    uint32_t bs = kc->pool.block_size, keep = (n + bs - 1) / bs;
    /* Dropped blocks may hold K/V never computed (a failed step rolled back)
     * or rejected draft tokens: they are not kept as cache. */
    while (s->n_blocks > keep) {
        uint32_t b = s->blocks[--s->n_blocks];
        if (kc->refs[b] == 1)
            hash_remove(kc, b);
        block_unref(kc, b);
    }
    /* A registered block that becomes partial may be rewritten: unless others
     * hold it (then the next append copies it), it leaves the table. */
    if (n % bs && keep && kc->refs[s->blocks[keep - 1]] == 1)
        hash_remove(kc, s->blocks[keep - 1]);
    s->n_tokens = n;
    KVCACHE_CHECK(kc);
    return 0;
}

uint32_t kvp_kvcache_seq_len(const kvp_kvcache *kc, int seq)
{
    kvseq *s = seq_get(kc, seq);
    return s ? s->n_tokens : 0;
}
const uint32_t *kvp_kvcache_seq_tokens(const kvp_kvcache *kc, int seq)
{
    kvseq *s = seq_get(kc, seq);
    return s ? s->tokens : NULL;
}
const uint32_t *kvp_kvcache_seq_blocks(const kvp_kvcache *kc, int seq)
{
    kvseq *s = seq_get(kc, seq);
    return s ? s->blocks : NULL;
}
uint32_t kvp_kvcache_seq_n_blocks(const kvp_kvcache *kc, int seq)
{
    kvseq *s = seq_get(kc, seq);
    return s ? s->n_blocks : 0;
}

#if KVP_DEBUG
/* The invariants at the top of this file, over the whole cache: O(blocks +
 * block-table entries), after every change in debug builds. */
static void kvcache_check(const kvp_kvcache *kc)
{
    uint32_t nb = kc->pool.n_blocks, bs = kc->pool.block_size;
    uint32_t *held = calloc(nb, sizeof *held);
    if (!held)
        return;
    KVP_ASSERT(kc->n_free <= nb);
    for (uint32_t i = 0; i < kc->n_free; i++) {
        uint32_t b = kc->free_list[i];
        KVP_ASSERT(b < nb && kc->refs[b] == 0 && kc->hash[b] == 0);
        KVP_ASSERT(held[b] == 0); /* on the free list once */
        held[b] = 1;
    }
    memset(held, 0, nb * sizeof *held);
    for (uint32_t q = 0; q < kc->n_seqs; q++) {
        const kvseq *s = &kc->seqs[q];
        if (!s->used)
            continue;
        KVP_ASSERT(s->n_blocks == (uint32_t)(((uint64_t)s->n_tokens + bs - 1) / bs));
        KVP_ASSERT(s->n_blocks <= s->cap_blocks && s->n_tokens <= s->cap_tokens);
        for (uint32_t i = 0; i < s->n_blocks; i++) {
            KVP_ASSERT(s->blocks[i] < nb);
            held[s->blocks[i]]++;
        }
    }
    uint32_t n_zero = 0, n_lru = 0;
    for (uint32_t b = kc->lru_head; b != NONE; b = kc->lru_next[b]) {
        KVP_ASSERT(b < nb && kc->refs[b] == 0 && kc->hash[b] != 0); /* cached: findable, held by none */
        KVP_ASSERT(++n_lru <= nb);
    }
    KVP_ASSERT(n_lru == kc->n_cached);
    for (uint32_t b = 0; b < nb; b++) {
        KVP_ASSERT(kc->refs[b] == held[b]);
        n_zero += kc->refs[b] == 0;
        if (kc->hash[b])
            KVP_ASSERT(kvp_kvcache_find_hash(kc, kc->hash[b]) == (int64_t)b);
    }
    KVP_ASSERT(n_zero == kc->n_free + kc->n_cached);
    free(held);
}
#endif
