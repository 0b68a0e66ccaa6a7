/* test_kvcache.c - block pool accounting, prefix hashes, fork + copy-on-write,
 * truncation, the out-of-blocks error and the pool's size limits.  Built
 * with KVP_DEBUG (make check), every change also walks the whole cache
 * (kvcache_check). */
#include "backend_cpu.h"
#include "unit.h"
#include "kvcache.h"
#include "stream.h"
#include "tensor.h"

#include <stdlib.h>
#include <string.h>

static kvp_config small_config(void)
{
    kvp_config c;
    kvp_config_init(&c);
    c.n_layer = 2;
    c.n_head_kv = 2;
    c.head_dim = 8;
    c.n_ctx = 64;
    return c;
}

/* A block registered while shared, made partial by a truncate, then left
 * to one holder by the others: that holder's next append writes into it,
 * so its hash must go, or a later prompt with the old prefix would attach
 * K/V that no longer belongs to it. */
static void test_truncate_then_unshare(kvp_backend *be)
{
    kvp_err err = {0};
    kvp_config c = small_config();
    kvp_kvcache_opts o;
    kvp_kvcache_opts_init(&o);
    o.block_size = 4;
    o.n_blocks = 10;
    kvp_kvcache *kc;
    CHECK(kvp_kvcache_create(&kc, &c, &o, be, &err) == 0);
    uint32_t toks[9], slots[9], other = 999;
    for (int i = 0; i < 9; i++)
        toks[i] = (uint32_t)(200 + i);
    uint64_t h0 = kvp_kvblock_hash(0, toks, 4), h1 = kvp_kvblock_hash(h0, toks + 4, 4);
    int a = kvp_kvcache_seq_new(kc, &err);
    CHECK(kvp_kvcache_seq_append(kc, a, toks, 8, slots, &err) == 0);
    uint32_t blk1 = kvp_kvcache_seq_blocks(kc, a)[1];
    int b = kvp_kvcache_seq_fork(kc, a, &err);
    CHECK(kvp_kvcache_seq_truncate(kc, a, 5, &err) == 0);
    CHECK_EQ_I64(kvp_kvcache_find_hash(kc, h1), blk1); /* b still holds it whole */
    kvp_kvcache_seq_free(kc, b);
    CHECK_EQ_U64(kvp_kvcache_block_refs(kc, blk1), 1);
    CHECK(kvp_kvcache_seq_append(kc, a, &other, 1, slots, &err) == 0);
    CHECK_EQ_U64(slots[0], blk1 * 4 + 1); /* written in place: no copy was needed */
    CHECK_EQ_I64(kvp_kvcache_find_hash(kc, h1), -1);
    CHECK_EQ_U64(kvp_kvcache_block_hash(kc, blk1), 0);
    int d = kvp_kvcache_seq_new(kc, &err);
    CHECK_EQ_I64(kvp_kvcache_seq_share_prefix(kc, d, toks, 9, &err), 4); /* block 0 only */
    kvp_kvcache_free(kc);
}

/* A backend whose memory is never touched: pools of 2^20 blocks of 4096
 * tokens without 16 GiB behind them. */
static void *stub_alloc(kvp_backend *b, size_t bytes)
{
    static char none[64];
    (void)b, (void)bytes;
    return none;
}
static void stub_release(kvp_backend *b, void *p) { (void)b, (void)p; }
static int stub_supports(const kvp_backend *b, int use, int dtype, int scaled)
{
    (void)b, (void)scaled;
    return use == KVP_USE_KV && dtype == KVP_DTYPE_F16;
}
static const kvp_backend_ops stub_ops = {.name = "stub", .supports = stub_supports, .alloc = stub_alloc,
                                         .release = stub_release};

/* Slot ids are block * block_size + offset in 32 bits: a pool of exactly
 * 2^32 token slots is accepted, one block more is refused, by count or by
 * bytes, with the numbers. */
static void test_pool_limits(void)
{
    kvp_backend stub = {&stub_ops, NULL};
    kvp_err err = {0};
    kvp_config c = small_config();
    c.n_layer = 1, c.n_head_kv = 1, c.head_dim = 1;
    kvp_kvcache_opts o;
    kvp_kvcache_opts_init(&o);
    o.block_size = 4096;
    o.n_blocks = 1u << 20;
    kvp_kvcache *kc = NULL;
    CHECK(kvp_kvcache_create(&kc, &c, &o, &stub, &err) == 0);
    if (kc) {
        const kvp_kv_pool *pool = kvp_kvcache_pool(kc);
        CHECK_EQ_U64((uint64_t)pool->n_blocks * pool->block_size, KVP_KV_MAX_SLOTS);
        uint32_t t[3] = {1, 2, 3}, slots[3];
        int a = kvp_kvcache_seq_new(kc, &err);
        CHECK(kvp_kvcache_seq_append(kc, a, t, 3, slots, &err) == 0);
        CHECK_EQ_U64(slots[2], 2);
        kvp_kvcache_free(kc);
    }
    o.dtype = KVP_DTYPE_BF16; /* one the stub backend lacks: refused before any allocation */
    CHECK_EQ_I64(kvp_kvcache_create(&kc, &c, &o, &stub, &err), KVP_EUNSUPPORTED);
    CHECK_MSG(strstr(err.msg, "stub") && strstr(err.msg, "bf16"), "message: %s", err.msg);
    o.dtype = KVP_DTYPE_F16;
    o.n_blocks = (1u << 20) + 1;
    CHECK_EQ_I64(kvp_kvcache_create(&kc, &c, &o, &stub, &err), KVP_ELIMIT);
    CHECK_MSG(strstr(err.msg, "1048577 blocks x 4096 tokens = 4294971392 token slots") != NULL, "%s", err.msg);
    o.n_blocks = 0;
    o.mem_bytes = kvp_kvcache_block_bytes(&c, 4096, KVP_DTYPE_F16) * ((1u << 20) + 1);
    CHECK_EQ_I64(kvp_kvcache_create(&kc, &c, &o, &stub, &err), KVP_ELIMIT);
    CHECK(strstr(err.msg, "more than 2^32") != NULL);
    /* and 2^30 blocks at most, whatever their size */
    o.mem_bytes = 0;
    o.block_size = 1;
    o.n_blocks = (1u << 30) + 1;
    CHECK_EQ_I64(kvp_kvcache_create(&kc, &c, &o, &stub, &err), KVP_ELIMIT);
    CHECK(strstr(err.msg, "at most 2^30") != NULL);
}

int main(void)
{
    kvp_err err = {0};
    kvp_backend *be;
    CHECK(kvp_backend_cpu_create(&be, 1, 0, &err) == 0);
    kvp_config c = small_config();
    kvp_kvcache_opts o;
    kvp_kvcache_opts_init(&o);
    CHECK_EQ_U64(o.block_size, 16);
    CHECK_EQ_U64(o.dtype, KVP_DTYPE_F16);
    /* SmolLM2: 23,040 bytes per token in f16 (FACTS.md) */
    kvp_config smol = c;
    smol.n_layer = 30, smol.n_head_kv = 3, smol.head_dim = 64;
    CHECK_EQ_U64(kvp_kvcache_block_bytes(&smol, 1, KVP_DTYPE_F16), 23040);
    CHECK_EQ_U64(kvp_kvcache_block_bytes(&smol, 16, KVP_DTYPE_F32), 23040 * 32);

    /* sizing by bytes */
    kvp_kvcache *kc;
    o.block_size = 4;
    uint64_t bb = kvp_kvcache_block_bytes(&c, 4, KVP_DTYPE_F16);
    o.mem_bytes = bb * 10 + bb / 2;
    CHECK(kvp_kvcache_create(&kc, &c, &o, be, &err) == 0);
    kvp_kvcache_stats st;
    kvp_kvcache_get_stats(kc, &st);
    CHECK_EQ_U64(st.n_blocks, 10);
    CHECK_EQ_U64(st.n_free, 10);

    uint32_t toks[20], slots[20];
    for (int i = 0; i < 20; i++)
        toks[i] = (uint32_t)(100 + i);
    int a = kvp_kvcache_seq_new(kc, &err);
    CHECK(a >= 0);
    CHECK(kvp_kvcache_seq_append(kc, a, toks, 6, slots, &err) == 0);
    CHECK_EQ_U64(kvp_kvcache_seq_len(kc, a), 6);
    CHECK_EQ_U64(kvp_kvcache_seq_n_blocks(kc, a), 2);
    const uint32_t *bl = kvp_kvcache_seq_blocks(kc, a);
    CHECK_EQ_U64(slots[0], bl[0] * 4);
    CHECK_EQ_U64(slots[5], bl[1] * 4 + 1);
    /* block 0 is full: registered under its chained hash; block 1 is not */
    uint64_t h0 = kvp_kvblock_hash(0, toks, 4);
    CHECK_EQ_U64(kvp_kvcache_block_hash(kc, bl[0]), h0);
    CHECK_EQ_U64(kvp_kvcache_block_hash(kc, bl[1]), 0);
    CHECK_EQ_I64(kvp_kvcache_find_hash(kc, h0), bl[0]);
    CHECK(kvp_kvcache_seq_append(kc, a, toks + 6, 2, slots, &err) == 0);
    uint64_t h1 = kvp_kvblock_hash(h0, toks + 4, 4);
    CHECK_EQ_U64(kvp_kvcache_block_hash(kc, bl[1]), h1);

    /* a second sequence with the same first 9 tokens shares 2 blocks */
    int b = kvp_kvcache_seq_new(kc, &err);
    CHECK_EQ_I64(kvp_kvcache_seq_share_prefix(kc, b, toks, 9, &err), 8);
    CHECK_EQ_U64(kvp_kvcache_block_refs(kc, bl[0]), 2);
    /* ...but never the whole prompt: at least one token is computed */
    int b2 = kvp_kvcache_seq_new(kc, &err);
    CHECK_EQ_I64(kvp_kvcache_seq_share_prefix(kc, b2, toks, 8, &err), 4);
    kvp_kvcache_seq_free(kc, b2);
    /* a different first token shares nothing */
    uint32_t other[9];
    memcpy(other, toks, sizeof other);
    other[0] = 7;
    int d = kvp_kvcache_seq_new(kc, &err);
    CHECK_EQ_I64(kvp_kvcache_seq_share_prefix(kc, d, other, 9, &err), 0);
    kvp_kvcache_get_stats(kc, &st);
    CHECK_EQ_U64(st.prefix_blocks, 3);
    CHECK_EQ_U64(st.n_free, 8);

    /* fork, then both write into the shared partial block: one copy */
    CHECK(kvp_kvcache_seq_append(kc, a, toks + 8, 1, slots, &err) == 0); /* a: 9 tokens, block 2 partial */
    int f = kvp_kvcache_seq_fork(kc, a, &err);
    CHECK(f >= 0);
    uint32_t part = kvp_kvcache_seq_blocks(kc, a)[2];
    CHECK_EQ_U64(kvp_kvcache_block_refs(kc, part), 2);
    /* put a recognizable value into the partial block, check the copy has it */
    const kvp_kv_pool *pool = kvp_kvcache_pool(kc);
    uint8_t *blk = malloc(pool->block_bytes), *blk2 = malloc(pool->block_bytes);
    memset(blk, 0x5a, pool->block_bytes);
    CHECK(kvp_kvcache_block_write(kc, part, blk, &err) == 0);
    CHECK(kvp_kvcache_seq_append(kc, f, toks + 9, 1, slots, &err) == 0);
    uint32_t fpart = kvp_kvcache_seq_blocks(kc, f)[2];
    CHECK(fpart != part);
    CHECK_EQ_U64(kvp_kvcache_block_refs(kc, part), 1);
    CHECK(kvp_kvcache_block_read(kc, fpart, blk2, &err) == 0);
    CHECK(memcmp(blk, blk2, pool->block_bytes) == 0);
    kvp_kvcache_get_stats(kc, &st);
    CHECK_EQ_U64(st.cow_copies, 1);
    free(blk);
    free(blk2);

    /* truncate drops whole blocks and un-registers a block made partial */
    uint32_t fb1 = kvp_kvcache_seq_blocks(kc, f)[1];
    CHECK_EQ_U64(kvp_kvcache_block_refs(kc, fb1), 3); /* a, b and f */
    CHECK(kvp_kvcache_seq_truncate(kc, f, 6, &err) == 0);
    CHECK_EQ_U64(kvp_kvcache_seq_n_blocks(kc, f), 2);
    CHECK_EQ_U64(kvp_kvcache_block_hash(kc, fb1), h1); /* still shared: stays registered */
    CHECK(kvp_kvcache_seq_truncate(kc, f, 20, &err) == KVP_EINVAL);

    /* out of blocks: a clear error with the numbers, and nothing changes */
    kvp_kvcache_get_stats(kc, &st);
    uint32_t free_before = st.n_free, len_before = kvp_kvcache_seq_len(kc, d);
    uint32_t big[64] = {0}, bslots[64];
    CHECK_EQ_I64(kvp_kvcache_seq_append(kc, d, big, 64, bslots, &err), KVP_ELIMIT);
    CHECK(strstr(err.msg, "out of blocks") && strstr(err.msg, "needs 16 more") && strstr(err.msg, "of 10 blocks"));
    kvp_kvcache_get_stats(kc, &st);
    CHECK_EQ_U64(st.n_free, free_before);
    CHECK_EQ_U64(kvp_kvcache_seq_len(kc, d), len_before);

    /* freeing every sequence returns every block */
    kvp_kvcache_seq_free(kc, a);
    kvp_kvcache_seq_free(kc, b);
    kvp_kvcache_seq_free(kc, d);
    kvp_kvcache_seq_free(kc, f);
    kvp_kvcache_seq_free(kc, 99); /* unknown: ignored */
    kvp_kvcache_get_stats(kc, &st);
    CHECK_EQ_U64(st.n_free, 10);
    /* full blocks stay findable for later requests until their memory is
     * needed (the prefix cache, test_kvcache_prefix.c) */
    CHECK(st.n_cached > 0);
    CHECK(kvp_kvcache_find_hash(kc, h0) >= 0);
    /* handles are reused */
    CHECK_EQ_I64(kvp_kvcache_seq_new(kc, &err), 0);
    kvp_kvcache_free(kc);

    /* bad options */
    o.mem_bytes = 10;
    CHECK_EQ_I64(kvp_kvcache_create(&kc, &c, &o, be, &err), KVP_EINVAL);
    CHECK(strstr(err.msg, "holds no block") != NULL);
    o.mem_bytes = 0;
    o.dtype = KVP_DTYPE_Q4_1;
    CHECK_EQ_I64(kvp_kvcache_create(&kc, &c, &o, be, &err), KVP_EINVAL);
    test_truncate_then_unshare(be);
    test_pool_limits();
    kvp_backend_free(be);
    return unit_done();
}
