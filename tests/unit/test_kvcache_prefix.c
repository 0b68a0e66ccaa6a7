/* test_kvcache_prefix.c - prefix sharing that must never hand out wrong K/V:
 * a partial block that still carries the hash of its old full contents is
 * not found by a new prompt after being written in place; and
 * kvp_kvcache_seq_blocks_needed agrees with what seq_append takes. */
#include "backend_cpu.h"
#include "kvcache.h"
#include "stream.h"
#include "tensor.h"
#include "unit.h"

enum { BS = 4 };

static kvp_kvcache *make(kvp_backend *be, uint32_t n_blocks)
{
    kvp_config c;
    kvp_config_init(&c);
    c.n_layer = 1;
    c.n_head_kv = 1;
    c.head_dim = 4;
    c.n_ctx = 64;
    kvp_kvcache_opts o;
    kvp_kvcache_opts_init(&o);
    o.block_size = BS;
    o.n_blocks = n_blocks;
    kvp_kvcache *kc = NULL;
    kvp_err err = {0};
    CHECK(kvp_kvcache_create(&kc, &c, &o, be, &err) == 0);
    return kc;
}

/* fork so block X (tokens 4..7) is held twice; truncate the first inside X
 * (X keeps its hash: it is shared); free the fork (X held once, still
 * registered); append another token to the first: X is written in place
 * and is still partial.  A
 * new prompt with X's old tokens must not be given X. */
static void test_truncate_then_append(kvp_backend *be)
{
    kvp_kvcache *kc = make(be, 8);
    kvp_err err = {0};
    uint32_t toks[9] = {10, 11, 12, 13, 14, 15, 16, 17, 18}, other[3] = {90, 91, 92}, slots[9];
    int a = kvp_kvcache_seq_new(kc, &err);
    CHECK(kvp_kvcache_seq_append(kc, a, toks, 8, slots, &err) == 0);
    uint32_t x = kvp_kvcache_seq_blocks(kc, a)[1];
    uint64_t hx = kvp_kvcache_block_hash(kc, x);
    CHECK(hx != 0);
    int b = kvp_kvcache_seq_fork(kc, a, &err);
    CHECK(b >= 0);
    CHECK_EQ_U64(kvp_kvcache_block_refs(kc, x), 2);
    CHECK(kvp_kvcache_seq_truncate(kc, a, 5, &err) == 0);
    CHECK_EQ_U64(kvp_kvcache_block_hash(kc, x), hx); /* still whole in b */
    kvp_kvcache_seq_free(kc, b);
    CHECK_EQ_U64(kvp_kvcache_block_refs(kc, x), 1);
    CHECK(kvp_kvcache_seq_append(kc, a, other, 1, slots, &err) == 0); /* X: 14 90, partial */
    /* whatever a's block now is, X's old tokens must not find it */
    int64_t found = kvp_kvcache_find_hash(kc, hx);
    CHECK_MSG(found < 0 || (uint32_t)found != kvp_kvcache_seq_blocks(kc, a)[1],
              "block %lld, rewritten, is still registered under its old tokens", (long long)found);
    int c = kvp_kvcache_seq_new(kc, &err);
    int got = kvp_kvcache_seq_share_prefix(kc, c, toks, 9, &err);
    CHECK_MSG(got == BS, "a new prompt reused %d tokens (only the first block is still right)", got);
    kvp_kvcache_free(kc);
}

/* blocks_needed is what append takes: new blocks, plus a copy of a shared
 * partial last block. */
static void test_blocks_needed(kvp_backend *be)
{
    kvp_kvcache *kc = make(be, 16);
    kvp_err err = {0};
    uint32_t toks[16], slots[16];
    for (int i = 0; i < 16; i++)
        toks[i] = (uint32_t)(i + 1);
    int a = kvp_kvcache_seq_new(kc, &err);
    CHECK_EQ_U64(kvp_kvcache_seq_blocks_needed(kc, a, 0), 0);
    CHECK_EQ_U64(kvp_kvcache_seq_blocks_needed(kc, a, 1), 1);
    CHECK_EQ_U64(kvp_kvcache_seq_blocks_needed(kc, a, 4), 1);
    CHECK_EQ_U64(kvp_kvcache_seq_blocks_needed(kc, a, 5), 2);
    CHECK(kvp_kvcache_seq_append(kc, a, toks, 6, slots, &err) == 0);
    CHECK_EQ_U64(kvp_kvcache_seq_blocks_needed(kc, a, 2), 0);
    CHECK_EQ_U64(kvp_kvcache_seq_blocks_needed(kc, a, 3), 1);
    int b = kvp_kvcache_seq_fork(kc, a, &err);
    /* the shared partial block must be copied before either writes */
    CHECK_EQ_U64(kvp_kvcache_seq_blocks_needed(kc, a, 1), 1);
    CHECK_EQ_U64(kvp_kvcache_seq_blocks_needed(kc, b, 3), 2);
    for (uint32_t n = 1; n <= 7; n++) {
        kvp_kvcache_stats s0, s1;
        int f = kvp_kvcache_seq_fork(kc, a, &err);
        uint64_t need = kvp_kvcache_seq_blocks_needed(kc, f, n);
        kvp_kvcache_get_stats(kc, &s0);
        CHECK(kvp_kvcache_seq_append(kc, f, toks, n, slots, &err) == 0);
        kvp_kvcache_get_stats(kc, &s1);
        CHECK_MSG(s0.n_free - s1.n_free == need, "%u tokens: predicted %llu, took %u", n, (unsigned long long)need,
                  s0.n_free - s1.n_free);
        kvp_kvcache_seq_free(kc, f);
    }
    CHECK_EQ_U64(kvp_kvcache_seq_blocks_needed(kc, 1234, 5), 0); /* a bad handle */
    kvp_kvcache_free(kc);
}

/* Freed full blocks stay findable (cached) until their memory is needed,
 * least recently freed first; truncated blocks do not; salts keep sharing
 * apart; a block that does not hold the tokens asked for is not shared. */
static void test_prefix_cache(kvp_backend *be)
{
    kvp_kvcache *kc = make(be, 6);
    kvp_err err = {0};
    kvp_kvcache_stats st;
    uint32_t t[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, u[10] = {21, 22, 23, 24, 25, 26, 27, 28, 29, 30}, slots[10];
    int a = kvp_kvcache_seq_new(kc, &err);
    CHECK(kvp_kvcache_seq_append(kc, a, t, 9, slots, &err) == 0); /* 2 full blocks + 1 token */
    kvp_kvcache_seq_free(kc, a);
    kvp_kvcache_get_stats(kc, &st);
    CHECK_EQ_U64(st.n_cached, 2);
    CHECK_EQ_U64(st.n_free, 6); /* cached blocks can still be taken */
    int b = kvp_kvcache_seq_new(kc, &err);
    CHECK_EQ_I64(kvp_kvcache_seq_share_prefix(kc, b, t, 10, &err), 8); /* a later request reuses both */
    kvp_kvcache_get_stats(kc, &st);
    CHECK_EQ_U64(st.n_cached, 0);
    CHECK_EQ_U64(st.n_free, 4);
    kvp_kvcache_seq_free(kc, b);

    /* a salted request shares nothing with unsalted blocks, and the other way */
    int c = kvp_kvcache_seq_new(kc, &err);
    CHECK(kvp_kvcache_seq_set_salt(kc, c, 0x5a17, &err) == 0);
    CHECK_EQ_I64(kvp_kvcache_seq_share_prefix(kc, c, t, 10, &err), 0);
    CHECK(kvp_kvcache_seq_append(kc, c, t, 9, slots, &err) == 0);
    CHECK(kvp_kvcache_seq_set_salt(kc, c, 1, &err) < 0); /* only while empty */
    kvp_kvcache_seq_free(kc, c);
    int d = kvp_kvcache_seq_new(kc, &err);
    CHECK(kvp_kvcache_seq_set_salt(kc, d, 0x5a17, &err) == 0);
    CHECK_EQ_I64(kvp_kvcache_seq_share_prefix(kc, d, t, 10, &err), 8); /* same salt: shared */
    kvp_kvcache_seq_free(kc, d);

    /* memory is needed: the least recently freed cached blocks go first */
    int e = kvp_kvcache_seq_new(kc, &err);
    CHECK(kvp_kvcache_seq_append(kc, e, u, 10, slots, &err) == 0); /* 3 blocks of the 6 */
    kvp_kvcache_get_stats(kc, &st);
    CHECK_EQ_U64(st.n_free, 3);
    int f = kvp_kvcache_seq_new(kc, &err);
    CHECK(kvp_kvcache_seq_append(kc, f, u, 10, slots, &err) == 0); /* takes the rest: cached ones given up */
    kvp_kvcache_get_stats(kc, &st);
    CHECK_EQ_U64(st.n_free, 0);
    CHECK_EQ_U64(st.n_cached, 0);
    kvp_kvcache_seq_free(kc, f);
    int g = kvp_kvcache_seq_new(kc, &err);
    CHECK_EQ_I64(kvp_kvcache_seq_share_prefix(kc, g, t, 10, &err), 0); /* gone */
    kvp_kvcache_seq_free(kc, g);

    /* blocks a truncation drops (a rolled-back step) are not cached */
    int h = kvp_kvcache_seq_new(kc, &err);
    CHECK(kvp_kvcache_seq_append(kc, h, t, 8, slots, &err) == 0);
    CHECK(kvp_kvcache_seq_truncate(kc, h, 0, &err) == 0);
    kvp_kvcache_seq_free(kc, h);
    int i = kvp_kvcache_seq_new(kc, &err);
    CHECK_EQ_I64(kvp_kvcache_seq_share_prefix(kc, i, t, 10, &err), 0);

    /* a block named for sharing must hold those tokens */
    uint32_t held = kvp_kvcache_seq_blocks(kc, e)[0];
    CHECK_EQ_I64(kvp_kvcache_seq_push_block(kc, i, t, BS, held, NULL, &err), KVP_ENOTFOUND);
    CHECK_EQ_I64(kvp_kvcache_seq_push_block(kc, i, u, BS, held, NULL, &err), (int64_t)held);
    kvp_kvcache_free(kc);

    /* caching off: freed blocks are free at once */
    kvp_config cfg;
    kvp_config_init(&cfg);
    cfg.n_layer = 1, cfg.n_head_kv = 1, cfg.head_dim = 4, cfg.n_ctx = 64;
    kvp_kvcache_opts o;
    kvp_kvcache_opts_init(&o);
    o.block_size = BS, o.n_blocks = 4, o.no_cache = 1;
    CHECK(kvp_kvcache_create(&kc, &cfg, &o, be, &err) == 0);
    a = kvp_kvcache_seq_new(kc, &err);
    CHECK(kvp_kvcache_seq_append(kc, a, t, 8, slots, &err) == 0);
    kvp_kvcache_seq_free(kc, a);
    kvp_kvcache_get_stats(kc, &st);
    CHECK_EQ_U64(st.n_cached, 0);
    b = kvp_kvcache_seq_new(kc, &err);
    CHECK_EQ_I64(kvp_kvcache_seq_share_prefix(kc, b, t, 10, &err), 0);
    kvp_kvcache_free(kc);
}

int main(void)
{
    kvp_err err = {0};
    kvp_backend *be = NULL;
    CHECK(kvp_backend_cpu_create(&be, 1, 0, &err) == 0);
    test_truncate_then_append(be);
    test_blocks_needed(be);
    test_prefix_cache(be);
    kvp_backend_free(be);
    printf("%d passed, %d failed\n", unit_passed, unit_failed);
    return unit_failed != 0;
}
