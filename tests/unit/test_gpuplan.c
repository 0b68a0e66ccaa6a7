/* test_gpuplan.c - the CUDA backend's host-side planning (lib/plan/gpuplan.h):
 * key splits cover every key once, launch shapes fit CUDA's limits and the
 * kernels' assumptions, tables flatten with their padding, and the graph
 * ladder pads every batch to a captured size. */
#include "gpuplan.h"
#include "unit.h"

/* Either plan: every key 0..pos in exactly one split, splits in order, each
 * starting on a block boundary, no more than the cap and than
 * kvp_gpuplan_max_splits plans for a step of that context, and none past
 * kvp_gpuplan_splits. */
static void test_split_coverage(void)
{
    static const uint32_t bss[] = {1, 7, 16, 32, 100, 512, 1000};
    static const int32_t poss[] = {0, 1, 15, 16, 31, 32, 511, 512, 513, 1023, 1024, 4095, 8191, 32767, 32768, 100000};
    static uint8_t seen[100001];
    for (int pl = 0; pl < 2; pl++) {
        uint32_t want = pl ? KVP_GPU_ATT_SPLIT_MIN : KVP_GPU_ATT_SPLIT_KEYS, cap = pl ? KVP_GPU_ATT_MAX_SPLITS : UINT32_MAX;
        for (size_t i = 0; i < sizeof bss / sizeof bss[0]; i++) {
            uint32_t bs = bss[i], sk = kvp_gpuplan_split_keys(bs, pl);
            CHECK_MSG(sk % bs == 0 && sk >= want && sk < want + bs, "plan %d, block %u: split unit of %u keys", pl, bs,
                      sk);
            for (size_t j = 0; j < sizeof poss / sizeof poss[0]; j++) {
                int32_t pos = poss[j];
                uint32_t n = kvp_gpuplan_splits(sk, cap, pos), k0, k1, next = 0;
                uint64_t len = kvp_gpuplan_split_len(sk, cap, pos);
                int ok = n >= 1 && n <= cap && n <= kvp_gpuplan_max_splits(sk, cap, (uint32_t)pos + 1) && len % sk == 0;
                memset(seen, 0, sizeof seen);
                for (uint32_t s = 0; s < n + 2; s++) { /* two past the end must be empty */
                    int has = kvp_gpuplan_split_range(sk, cap, pos, s, &k0, &k1);
                    if (s >= n) {
                        ok &= !has;
                        continue;
                    }
                    ok &= has && k0 == next && k0 % bs == 0 && k1 - k0 <= len;
                    for (uint32_t k = k0; k < k1; k++)
                        seen[k]++;
                    next = k1;
                }
                for (int32_t k = 0; k <= pos; k++)
                    ok &= seen[k] == 1;
                ok &= next == (uint32_t)pos + 1;
                CHECK_MSG(ok, "plan %d, block %u, pos %d: %u splits of %llu keys do not cover 0..pos once", pl, bs,
                          pos, n, (unsigned long long)len);
            }
        }
        /* a step planned for max_ctx has a grid row for every split of
         * every shorter context, and the plan grows with max_ctx (reserve
         * sizes the scratch for the largest step) */
        uint32_t unit = kvp_gpuplan_split_keys(16, pl);
        int ok = 1;
        for (uint32_t ctx = 1; ctx <= 5000; ctx++) {
            uint32_t m = kvp_gpuplan_max_splits(unit, cap, ctx);
            ok &= kvp_gpuplan_splits(unit, cap, (int32_t)ctx - 1) <= m && m >= kvp_gpuplan_max_splits(unit, cap, ctx - 1);
        }
        CHECK_MSG(ok, "plan %d: max_splits below a shorter context's splits, or shrinking", pl);
    }
    /* the verified plan: splits of 512 keys, as many as it takes */
    const uint32_t none = UINT32_MAX, M = KVP_GPU_ATT_MAX_SPLITS;
    CHECK_EQ_U64(kvp_gpuplan_splits(512, none, -1), 0);
    CHECK_EQ_U64(kvp_gpuplan_splits(512, none, 0), 1);
    CHECK_EQ_U64(kvp_gpuplan_splits(512, none, 511), 1);
    CHECK_EQ_U64(kvp_gpuplan_splits(512, none, 512), 2);
    CHECK_EQ_U64(kvp_gpuplan_splits(512, none, 100000), 196);
    /* the pipelined plan: units of 32, at most 32 splits */
    CHECK_EQ_U64(kvp_gpuplan_splits(32, M, -1), 0);
    CHECK_EQ_U64(kvp_gpuplan_splits(32, M, 0), 1);
    CHECK_EQ_U64(kvp_gpuplan_splits(32, M, 31), 1);
    CHECK_EQ_U64(kvp_gpuplan_splits(32, M, 32), 2);
    CHECK_EQ_U64(kvp_gpuplan_splits(32, M, 511), 16);     /* a decode at 512 keys: 16 splits of 32 */
    CHECK_EQ_U64(kvp_gpuplan_splits(32, M, 1023), 32);
    CHECK_EQ_U64(kvp_gpuplan_split_len(32, M, 1024), 64); /* 1025 keys: 17 splits of 64 */
    CHECK_EQ_U64(kvp_gpuplan_splits(32, M, 1024), 17);
    CHECK_EQ_U64(kvp_gpuplan_split_len(32, M, 8191), 256);
    CHECK_EQ_U64(kvp_gpuplan_max_splits(32, M, 0), 0);
    CHECK_EQ_U64(kvp_gpuplan_max_splits(32, M, 100), 4);
    CHECK_EQ_U64(kvp_gpuplan_max_splits(32, M, 1u << 30), M);
    /* the largest position: no wrap in the range arithmetic */
    uint32_t k0, k1;
    CHECK(kvp_gpuplan_split_range(512, none, INT32_MAX, (uint32_t)(((uint64_t)INT32_MAX + 1) / 512 - 1), &k0, &k1));
    CHECK_EQ_U64(k1, (uint64_t)INT32_MAX + 1);
    CHECK_EQ_U64(kvp_gpuplan_splits(32, M, INT32_MAX), M);
    CHECK(kvp_gpuplan_split_range(32, M, INT32_MAX, M - 1, &k0, &k1));
    CHECK_EQ_U64(k1, (uint64_t)INT32_MAX + 1);
    CHECK(!kvp_gpuplan_split_range(32, M, INT32_MAX, M, &k0, &k1));
}

static void test_attn_shape(void)
{
    kvp_gpu_attn_shape s;
    kvp_err err = {0};
    /* Llama-3-8B decode, 8 tokens at up to 4000 keys, blocks of 16: the verified plan */
    CHECK_EQ_I64(kvp_gpuplan_attn(&s, 8, 32, 8, 128, 16, 4000, 0, &err), 0);
    CHECK_EQ_U64(s.split_keys, 512);
    CHECK_EQ_U64(s.split_cap, UINT32_MAX);
    CHECK_EQ_U64(s.max_splits, 8);
    CHECK_EQ_U64(s.n_rep, 4);
    CHECK_EQ_U64(s.head_groups, 1);
    CHECK(s.grid[0] == 8 && s.grid[1] == 8 && s.grid[2] == 8);
    CHECK_EQ_U64(s.threads, KVP_GPU_ATT_QROWS * KVP_GPU_ATT_KTILE);
    CHECK_EQ_U64(s.part_floats, 8ull * 32 * 8 * 130);
    CHECK(s.merge_grid[0] == 8 && s.merge_grid[1] == 32);
    /* the same step in the pipelined plan: 32 splits of 128 keys */
    CHECK_EQ_I64(kvp_gpuplan_attn(&s, 8, 32, 8, 128, 16, 4000, 1, &err), 0);
    CHECK(s.split_keys == 32 && s.split_cap == KVP_GPU_ATT_MAX_SPLITS && s.max_splits == 32);
    CHECK(s.grid[0] == 8 && s.grid[1] == 32 && s.grid[2] == 8);
    CHECK_EQ_U64(s.part_floats, 8ull * 32 * 32 * 130);
    /* the largest head fits the 48 KiB a kernel gets without opting in */
    CHECK_EQ_I64(kvp_gpuplan_attn(&s, 1, 64, 8, KVP_GPU_ATT_MAX_HEAD_DIM, 16, 100, 0, &err), 0);
    CHECK_MSG(s.smem <= 48 * 1024, "%zu bytes of shared memory", s.smem);
    CHECK_EQ_U64(s.max_splits, 1);
    CHECK_EQ_U64(s.part_floats, 0); /* one split: written in place, no merge */
    CHECK_EQ_I64(kvp_gpuplan_attn(&s, 1, 64, 8, KVP_GPU_ATT_MAX_HEAD_DIM, 16, 100, 1, &err), 0);
    CHECK(s.max_splits == 4 && s.part_floats == 64ull * 4 * (KVP_GPU_ATT_MAX_HEAD_DIM + 2));
    /* SmolLM2: 9 heads over 3, head_dim 64 */
    CHECK_EQ_I64(kvp_gpuplan_attn(&s, 3, 9, 3, 64, 16, 513, 0, &err), 0);
    CHECK(s.n_rep == 3 && s.head_groups == 1 && s.max_splits == 2 && s.grid[2] == 3);
    CHECK_EQ_I64(kvp_gpuplan_attn(&s, 3, 9, 3, 64, 16, 513, 1, &err), 0);
    CHECK(s.max_splits == 17 && s.grid[1] == 17);
    /* a GQA group over QROWS takes more than one CTA */
    CHECK_EQ_I64(kvp_gpuplan_attn(&s, 1, 40, 2, 64, 16, 10, 0, &err), 0);
    CHECK(s.n_rep == 20 && s.head_groups == 3 && s.grid[2] == 6);
    /* refused */
    CHECK_EQ_I64(kvp_gpuplan_attn(&s, 1, 32, 8, 512, 16, 10, 0, &err), KVP_EUNSUPPORTED);
    CHECK(strstr(err.msg, "head_dim 512") != NULL);
    CHECK_EQ_I64(kvp_gpuplan_attn(&s, 1, 10, 4, 64, 16, 10, 0, &err), KVP_EUNSUPPORTED);
    CHECK_EQ_I64(kvp_gpuplan_attn(&s, 1, 32, 8, 128, 1, 65536u * 512u, 0, &err), KVP_ELIMIT); /* 65536 splits */
    CHECK_EQ_I64(kvp_gpuplan_attn(&s, 1, 131072, 1, 128, 16, 10, 1, &err), KVP_ELIMIT);      /* 131072 heads */
}

static void test_matmul_shape(void)
{
    kvp_gpu_mm_shape s;
    kvp_err err = {0};
    CHECK_EQ_I64(kvp_gpuplan_matmul(&s, 4096, 4096, 1, 264, 0, &err), 0);
    CHECK(s.kind == KVP_GPU_MM_GEMV && s.grid[0] == 4096 / KVP_GPU_GEMV_ROWS && s.threads == 32 * KVP_GPU_GEMV_ROWS);
    CHECK(s.grid[1] == 1 && s.grid[2] == 1);
    CHECK_EQ_I64(kvp_gpuplan_matmul(&s, 4097, 4096, KVP_GPU_GEMV_MAX_TOK, 264, 0, &err), 0);
    CHECK(s.kind == KVP_GPU_MM_GEMV && s.grid[0] == 4096 / KVP_GPU_GEMV_ROWS + 1);
    CHECK_EQ_I64(kvp_gpuplan_matmul(&s, 4097, 4096, KVP_GPU_GEMV_MAX_TOK + 1, 0, 0, &err), 0);
    CHECK(s.kind == KVP_GPU_MM_GEMM && s.grid[0] == 65 && s.grid[1] == 1 && s.threads == KVP_GPU_GEMM_THREADS);
    CHECK(s.grid[2] == 1 && s.kper == 4096 / KVP_GPU_GEMM_BK);
    CHECK_EQ_I64(kvp_gpuplan_matmul(&s, 64, 4096, 129, 0, 0, &err), 0);
    CHECK(s.grid[0] == 1 && s.grid[1] == 3 && s.grid[2] == 1);
    /* the GEMM's 4 x 4 outputs a thread cover its tile exactly */
    CHECK_EQ_U64(KVP_GPU_GEMM_THREADS * 16, KVP_GPU_GEMM_BM * KVP_GPU_GEMM_BN);
    /* and its weight tile is one 8-element decode a thread */
    CHECK_EQ_U64(KVP_GPU_GEMM_THREADS * 8, KVP_GPU_GEMM_BN * KVP_GPU_GEMM_BK);
    CHECK_EQ_I64(kvp_gpuplan_matmul(&s, 64, 4096, UINT32_MAX, 264, 0, &err), KVP_ELIMIT);
    CHECK_EQ_U64(kvp_gpuplan_blocks(0, 256, 1024), 1);
    CHECK_EQ_U64(kvp_gpuplan_blocks(257, 256, 1024), 2);
    CHECK_EQ_U64(kvp_gpuplan_blocks((uint64_t)1 << 40, 256, 1024), 1024);
}

/* Split-K: SmolLM2's down projection (576 x 1536) for 64 decode tokens is
 * 9 tiles: 16 parts (the most) of 3 steps of 32 on an H200 (fill 264), or
 * 12 parts of 2 steps of 64; its q projection (576 x 576) 9 parts of 2
 * steps of 32 or of 1 of 64, as a part takes 64 elements at least; a
 * prompt of 2048 tokens (288 tiles) fills the GPU unsplit.  For every
 * shape and k step: the parts cover the k steps with none empty, and the
 * workspace and counters suffice. */
static void test_splitk(void)
{
    kvp_gpu_mm_shape s;
    kvp_err err = {0};
    CHECK_EQ_I64(kvp_gpuplan_matmul(&s, 576, 1536, 64, 264, 0, &err), 0);
    CHECK(s.grid[0] == 9 && s.grid[1] == 1 && s.grid[2] == 16 && s.kper == 3 && s.kb == KVP_GPU_GEMM_BK);
    CHECK_EQ_I64(kvp_gpuplan_matmul(&s, 576, 1536, 64, 264, KVP_GPU_MMA_BK64, &err), 0);
    CHECK(s.grid[0] == 9 && s.grid[2] == 12 && s.kper == 2 && s.kb == 64);
    CHECK_EQ_I64(kvp_gpuplan_matmul(&s, 576, 576, 64, 264, 0, &err), 0);
    CHECK(s.grid[0] == 9 && s.grid[2] == 9 && s.kper == 2);
    CHECK_EQ_I64(kvp_gpuplan_matmul(&s, 576, 576, 64, 264, KVP_GPU_MMA_BK64, &err), 0);
    CHECK(s.grid[2] == 9 && s.kper == 1);
    CHECK_EQ_I64(kvp_gpuplan_matmul(&s, 576, 576, 2048, 264, 0, &err), 0);
    CHECK(s.grid[0] == 9 && s.grid[1] == 32 && s.grid[2] == 1 && s.kper == 18);
    CHECK_EQ_I64(kvp_gpuplan_matmul(&s, 576, 576, 2048, 264, KVP_GPU_MMA_BK64, &err), 0);
    CHECK(s.grid[2] == 1 && s.kper == 9);
    CHECK_EQ_I64(kvp_gpuplan_matmul(&s, 192, 2048, 16, 264, 0, &err), 0);
    CHECK(s.grid[2] == KVP_GPU_GEMM_MAX_SPLITS && s.kper == 4);
    /* test_gpu_ops' ragged one: 68 steps of 32, 13 parts of 5 and one of 3;
     * 34 of 64, 11 parts of 3 and one of 1 */
    CHECK_EQ_I64(kvp_gpuplan_matmul(&s, 40, 2176, 16, 264, 0, &err), 0);
    CHECK(s.grid[2] == 14 && s.kper == 5);
    CHECK_EQ_I64(kvp_gpuplan_matmul(&s, 40, 2176, 16, 264, KVP_GPU_MMA_BK64, &err), 0);
    CHECK(s.grid[2] == 12 && s.kper == 3);
    CHECK_EQ_I64(kvp_gpuplan_matmul(&s, 576, 60, 64, 264, 0, &err), 0); /* under 64 elements: no split */
    CHECK(s.grid[2] == 1 && s.kper == 2);
    CHECK_EQ_I64(kvp_gpuplan_matmul(&s, 576, 60, 64, 264, 48, &err), KVP_EINVAL);
    static const uint32_t outs[] = {1, 40, 77, 576, 1536, 4096, 49152}, ins[] = {1, 8, 200, 512, 576, 1536, 4100},
                          toks[] = {9, 16, 64, 100, 256, 2048}, fills[] = {0, 16, 264, 1000},
                          kbs[] = {KVP_GPU_GEMM_BK, KVP_GPU_MMA_BK64};
    int bad = 0;
    for (size_t a = 0; a < sizeof outs / sizeof *outs; a++)
        for (size_t b = 0; b < sizeof ins / sizeof *ins; b++)
            for (size_t c = 0; c < sizeof toks / sizeof *toks; c++)
                for (size_t f = 0; f < sizeof fills / sizeof *fills; f++)
                    for (size_t k = 0; k < sizeof kbs / sizeof *kbs; k++) {
                        if (kvp_gpuplan_matmul(&s, outs[a], ins[b], toks[c], fills[f], kbs[k], &err) != 0) {
                            bad++;
                            continue;
                        }
                        uint64_t ksteps = (ins[b] + kbs[k] - 1) / kbs[k], tiles = (uint64_t)s.grid[0] * s.grid[1];
                        int covered =
                            (uint64_t)s.grid[2] * s.kper >= ksteps && (uint64_t)(s.grid[2] - 1) * s.kper < ksteps;
                        int fits = s.grid[2] == 1 || ((uint64_t)s.grid[2] * tiles * KVP_GPU_GEMM_BM * KVP_GPU_GEMM_BN <=
                                                          kvp_gpuplan_splitk_floats(fills[f]) &&
                                                      tiles <= kvp_gpuplan_splitk_tiles(fills[f]));
                        int sane = s.kb == kbs[k] && s.grid[2] <= KVP_GPU_GEMM_MAX_SPLITS &&
                                   (fills[f] || s.grid[2] == 1) &&
                                   (s.grid[2] == 1 || (uint64_t)s.kper * s.kb >= KVP_GPU_GEMM_MIN_K);
                        if (!covered || !fits || !sane) {
                            if (bad++ < 5)
                                printf("split-K %u x %u, %u tokens, fill %u, k step %u: %u parts of %u steps "
                                       "(covered %d fits %d)\n",
                                       outs[a], ins[b], toks[c], fills[f], kbs[k], s.grid[2], s.kper, covered, fits);
                        }
                    }
    CHECK_EQ_I64(bad, 0);
}

static void test_tables(void)
{
    kvp_err err = {0};
    CHECK_EQ_U64(kvp_gpuplan_table_stride(1, 16), 4);
    CHECK_EQ_U64(kvp_gpuplan_table_stride(4096, 16), 256);
    CHECK_EQ_U64(kvp_gpuplan_table_stride(4097, 16), 260);
    CHECK_EQ_U64(kvp_gpuplan_table_stride(0, 16), 4);
    const uint32_t t0[] = {5, 9, 2}, t1[] = {7}, t2[] = {0};
    const uint32_t *tabs[] = {t0, t1, t2};
    const uint32_t nb[] = {3, 1, 0};
    uint32_t dst[4 * 4];
    memset(dst, 0xab, sizeof dst);
    CHECK_EQ_I64(kvp_gpuplan_tables(dst, 4, 4, tabs, nb, 3, 0xffffffffu, &err), 0);
    const uint32_t F = 0xffffffffu;
    const uint32_t want[16] = {5, 9, 2, F, 7, F, F, F, F, F, F, F, F, F, F, F};
    CHECK(memcmp(dst, want, sizeof want) == 0);
    const uint32_t nb_long[] = {5, 1, 0};
    CHECK_EQ_I64(kvp_gpuplan_tables(dst, 4, 4, tabs, nb_long, 3, 0, &err), KVP_ELIMIT);
    CHECK(strstr(err.msg, "sequence 0 has 5 blocks") != NULL);
    CHECK_EQ_I64(kvp_gpuplan_tables(dst, 2, 4, tabs, nb, 3, 0, &err), KVP_EINVAL);
}

static void test_graph_ladder(void)
{
    CHECK_EQ_U64(kvp_gpuplan_graph_batch(0, 512), 0);
    CHECK_EQ_U64(kvp_gpuplan_graph_batch(1, 512), 1);
    CHECK_EQ_U64(kvp_gpuplan_graph_batch(3, 512), 4);
    CHECK_EQ_U64(kvp_gpuplan_graph_batch(5, 512), 8);
    CHECK_EQ_U64(kvp_gpuplan_graph_batch(9, 512), 16);
    CHECK_EQ_U64(kvp_gpuplan_graph_batch(256, 512), 256);
    CHECK_EQ_U64(kvp_gpuplan_graph_batch(257, 512), 272);
    CHECK_EQ_U64(kvp_gpuplan_graph_batch(513, 512), 0);
    CHECK_EQ_U64(kvp_gpuplan_graph_batch(97, 100), 100); /* max itself is a size */
    /* every batch up to max pads to a listed size: under 8 tokens of padding to 256, under 16 past */
    uint32_t sizes[128];
    for (uint32_t max = 1; max <= 600; max += 37) {
        uint32_t k = kvp_gpuplan_graph_sizes(max, sizes, 128), ok = k <= 128 && sizes[k - 1] == max;
        for (uint32_t i = 1; ok && i < k; i++)
            ok &= sizes[i] > sizes[i - 1];
        for (uint32_t n = 1; ok && n <= max; n++) {
            uint32_t p = kvp_gpuplan_graph_batch(n, max), listed = 0;
            for (uint32_t i = 0; i < k; i++)
                listed |= sizes[i] == p;
            ok &= listed && p >= n && p - n < (n <= 256 ? 8u : 16u);
        }
        CHECK_MSG(ok, "graph sizes for batches up to %u", max);
    }
    CHECK_EQ_U64(kvp_gpuplan_graph_sizes(512, sizes, 128), 3 + 32 + 16);
    CHECK_EQ_U64(kvp_gpuplan_graph_sizes(512, sizes, 2), 3 + 32 + 16); /* counted past cap */
}

int main(void)
{
    test_split_coverage();
    test_attn_shape();
    test_matmul_shape();
    test_splitk();
    test_tables();
    test_graph_ladder();
    return unit_done();
}
