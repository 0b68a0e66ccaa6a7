/* test_tree.c - a draft tree verified in one step (kvp_step_seq.parent):
 * each of its tokens gets the logits a plain step of its own path gives,
 * to the bit, on every KV dtype; the path that stays moves down into
 * place (kvp_kvcache_seq_keep_path), after which the sequence goes on as
 * if it had been stepped along that path, and its full blocks are
 * registered under that path's hashes; bad trees are refused. */
#include "backend_cpu.h"
#include "engine.h"
#include "kvcache.h"
#include "model.h"
#include "rig.h"
#include "tiny.h"
#include "unit.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

enum { P = 6, NT = 7, V = 96 };

/* The tree: the last prompt token's successor x0, then two branches,
 * x0 a1 a2 and x0 b1 b2 b3, laid out breadth-first as a drafter would. */
static const uint32_t tree_tok[NT] = {11, 20, 30, 21, 31, 22, 40};
static const int32_t tree_par[NT] = {-1, 0, 0, 1, 2, 4, 5}; /* x0 a1 b1 a2 b2 b3 b4 */
/* the two paths as plain sequences, and their rows in the tree */
static const uint32_t path_a[] = {11, 20, 21}, rows_a[] = {0, 1, 3};
static const uint32_t path_b[] = {11, 30, 31, 22, 40}, rows_b[] = {0, 2, 4, 5, 6};

/* A sequence holding prompt[0..n), or -1. */
static int seq_with(rig *r, const uint32_t *prompt, uint32_t n, kvp_err *err)
{
    int s = kvp_kvcache_seq_new(r->kc, err);
    if (s >= 0 && kvp_engine_prefill(r->e, s, prompt, n, 0, NULL, err) < 0)
        return -1;
    return s;
}

/* Logits of a plain step of path[0..n) after the prompt: lg[n][V]. */
static int plain_rows(rig *r, const uint32_t *prompt, const uint32_t *path, uint32_t n, float *lg, kvp_err *err)
{
    int s = seq_with(r, prompt, P, err);
    kvp_step_seq st = {.seq = s, .tokens = path, .n_tokens = n, .want = KVP_LOGITS_ALL};
    if (s < 0 || kvp_engine_step(r->e, &st, 1, lg, err) != (int)n)
        return -1;
    kvp_kvcache_seq_free(r->kc, s);
    return 0;
}

static int same_rows(const float *tree, const uint32_t *rows, const float *plain, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (memcmp(tree + (size_t)rows[i] * V, plain + (size_t)i * V, V * sizeof(float)) != 0)
            return 0;
    return 1;
}

static void test_tree_dtype(const char *dir, int kv_dtype)
{
    tiny_cfg c = {.n_layer = 2, .n_embd = 128, .n_ff = 320, .n_head = 4, .n_head_kv = 2, .n_vocab = V,
                  .wtype = KVP_DTYPE_Q8_0, .tied = 1};
    char path[512];
    snprintf(path, sizeof path, "%s/tiny-tree.gguf", dir);
    rig r;
    if (tiny_write(path, &c, &rng_state) < 0 || rig_open(&r, path, unit_threads(2), 0, kv_dtype, 64, 4) < 0) {
        CHECK_MSG(0, "tiny model for kv %s", kvp_dtype_name((uint32_t)kv_dtype));
        return;
    }
    kvp_err err = {0};
    uint32_t prompt[P] = {3, 14, 15, 92, 65, 35};
    float *tl = malloc(sizeof(float) * NT * V), *pa = malloc(sizeof(float) * 3 * V), *pb = malloc(sizeof(float) * 5 * V);
    float *after = malloc(sizeof(float) * V), *want = malloc(sizeof(float) * V);
    int s = seq_with(&r, prompt, P, &err);
    kvp_step_seq st = {.seq = s, .tokens = tree_tok, .n_tokens = NT, .want = KVP_LOGITS_ALL, .parent = tree_par};
    CHECK_MSG(s >= 0 && kvp_engine_step(r.e, &st, 1, tl, &err) == NT, "tree step: %s", err.msg);
    /* rows of the tree were never registered for reuse: a prompt equal to
     * the tree's rows in order finds none of its last blocks */
    CHECK_EQ_U64(kvp_kvcache_seq_len(r.kc, s), P + NT);
    CHECK_EQ_U64(kvp_kvcache_block_hash(r.kc, kvp_kvcache_seq_blocks(r.kc, s)[2]), 0);

    /* b's first four stay (rows 0 2 4 5 cross the block boundary at 8) */
    CHECK_MSG(kvp_kvcache_seq_keep_path(r.kc, s, P, rows_b, 4, &err) == 0, "keep_path: %s", err.msg);
    CHECK_EQ_U64(kvp_kvcache_seq_len(r.kc, s), P + 4);
    CHECK(memcmp(kvp_kvcache_seq_tokens(r.kc, s) + P, path_b, 4 * sizeof(uint32_t)) == 0);
    /* then the next token: the logits of b's fifth row, as a plain run gives */
    kvp_step_seq nx = {.seq = s, .tokens = path_b + 4, .n_tokens = 1, .want = KVP_LOGITS_LAST};
    CHECK(kvp_engine_step(r.e, &nx, 1, after, &err) == 1);
    /* its full blocks are registered under the path's tokens: a prompt of
     * the same tokens shares them (block 1 was filled by the tree; no
     * plain run has registered it before) */
    uint32_t full[P + 5];
    memcpy(full, prompt, sizeof prompt);
    memcpy(full + P, path_b, sizeof path_b);
    CHECK(kvp_kvcache_block_hash(r.kc, kvp_kvcache_seq_blocks(r.kc, s)[1]) != 0);
    int s2 = kvp_kvcache_seq_new(r.kc, &err);
    CHECK(s2 >= 0 && kvp_kvcache_seq_share_prefix(r.kc, s2, full, P + 5, &err) == 8);
    CHECK(s2 >= 0 && kvp_kvcache_seq_blocks(r.kc, s2)[1] == kvp_kvcache_seq_blocks(r.kc, s)[1]);
    kvp_kvcache_seq_free(r.kc, s2);

    /* the tree's rows against plain steps of each path, and the step after
     * keep_path against the plain step's row for that token */
    CHECK(plain_rows(&r, prompt, path_a, 3, pa, &err) == 0 && plain_rows(&r, prompt, path_b, 5, pb, &err) == 0);
    CHECK_MSG(same_rows(tl, rows_a, pa, 3), "kv %s: branch a's rows differ from its plain step",
              kvp_dtype_name((uint32_t)kv_dtype));
    CHECK_MSG(same_rows(tl, rows_b, pb, 5), "kv %s: branch b's rows differ from its plain step",
              kvp_dtype_name((uint32_t)kv_dtype));
    CHECK_MSG(memcmp(after, pb + 4 * V, V * sizeof(float)) == 0, "kv %s: the step after keep_path differs",
              kvp_dtype_name((uint32_t)kv_dtype));

    /* bad trees: a parent not before its token, or past the entry */
    static const int32_t bad1[3] = {-1, 1, 0}, bad2[3] = {-1, 0, -2};
    uint32_t len = kvp_kvcache_seq_len(r.kc, s);
    kvp_step_seq b1 = {.seq = s, .tokens = tree_tok, .n_tokens = 3, .want = KVP_LOGITS_ALL, .parent = bad1};
    kvp_step_seq b2 = b1;
    b2.parent = bad2;
    CHECK_EQ_I64(kvp_engine_step(r.e, &b1, 1, tl, &err), KVP_EINVAL);
    CHECK(strstr(err.msg, "parent 1") != NULL);
    CHECK_EQ_I64(kvp_engine_step(r.e, &b2, 1, tl, &err), KVP_EINVAL);
    CHECK_EQ_U64(kvp_kvcache_seq_len(r.kc, s), len); /* nothing appended */
    /* a path longer than KVP_TREE_MAX_DEPTH, and a tree past KVP_TREE_STEP_MAX */
    enum { LONG = KVP_TREE_STEP_MAX + 1 };
    static uint32_t many[LONG];
    static int32_t chain[LONG], flat[LONG];
    for (int i = 0; i < LONG; i++)
        many[i] = (uint32_t)i % V, chain[i] = i - 1, flat[i] = -1;
    kvp_step_seq deep = {.seq = s, .tokens = many, .n_tokens = KVP_TREE_MAX_DEPTH + 1, .parent = chain};
    CHECK_EQ_I64(kvp_engine_step(r.e, &deep, 1, NULL, &err), KVP_ELIMIT);
    CHECK(strstr(err.msg, "path of more than") != NULL);
    deep.n_tokens = KVP_TREE_MAX_DEPTH;
    CHECK_EQ_I64(kvp_engine_step(r.e, &deep, 1, NULL, &err), 0); /* the longest path: fine */
    CHECK(kvp_kvcache_seq_truncate(r.kc, s, len, &err) == 0);
    kvp_step_seq wide = {.seq = s, .tokens = many, .n_tokens = LONG, .parent = flat};
    CHECK_EQ_I64(kvp_engine_step(r.e, &wide, 1, NULL, &err), KVP_ELIMIT);
    CHECK_EQ_U64(kvp_kvcache_seq_len(r.kc, s), len);
    /* keep_path refuses rows that do not rise or that fall below their place */
    static const uint32_t fall[2] = {0, 0}, past[1] = {9};
    CHECK_EQ_I64(kvp_kvcache_seq_keep_path(r.kc, s, P, fall, 2, &err), KVP_EINVAL);
    CHECK_EQ_I64(kvp_kvcache_seq_keep_path(r.kc, s, P, past, 1, &err), KVP_EINVAL);

    free(tl), free(pa), free(pb), free(after), free(want);
    rig_close(&r);
    unlink(path);
}

int main(void)
{
    char dir[] = "/tmp/kvp-test-tree.XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0);
        return unit_done();
    }
    const int dtypes[] = {KVP_DTYPE_F16, KVP_DTYPE_F32, KVP_DTYPE_BF16, KVP_DTYPE_FP8_E4M3, KVP_DTYPE_I8};
    for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
        test_tree_dtype(dir, dtypes[i]);
    rmdir(dir);
    return unit_done();
}
