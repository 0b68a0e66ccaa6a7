/* test_capacity.c - the memory model against hand-computed values.
 *
 * Every expected number below is worked out in the comment beside it from the
 * model's published shape, so a failure says which rule broke. */
#include "capacity.h"
#include "presets.h"
#include "shard.h"
#include "stream.h"
#include "tensor.h"
#include "tiny.h"
#include "unit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static kvp_cap_params preset(const char *name)
{
    kvp_cap_params p;
    kvp_cap_params_init(&p);
    const kvp_model_preset *m = kvp_preset_model_find(name);
    CHECK_MSG(m != NULL, "no preset %s", name);
    if (m) {
        p.cfg = m->cfg;
        p.q_lora_rank = m->q_lora_rank;
    }
    p.gpu_mem_bytes = 80ull << 30;
    return p;
}

static kvp_cap_result compute(const kvp_cap_params *p)
{
    kvp_cap_result r;
    kvp_err err = {0};
    int rc = kvp_cap_compute(p, &r, &err);
    CHECK_MSG(rc == 0, "compute: %s", err.msg);
    return r;
}

static void test_presets(void)
{
    CHECK(kvp_preset_model_find("Llama-3-70B") != NULL);
    CHECK(kvp_preset_model_find("llama3_70b") == kvp_preset_model_find("llama-3-70b"));
    CHECK(kvp_preset_model_find("llama-3-7b") == NULL);
    CHECK(kvp_preset_gpu_find("H200") != NULL);
    CHECK(kvp_preset_gpu_find("h200-sxm") == kvp_preset_gpu_find("h200"));
    CHECK(kvp_preset_gpu_find("4090") == kvp_preset_gpu_find("rtx-4090"));
    CHECK(kvp_preset_gpu_find("a100-40") != kvp_preset_gpu_find("a100-80"));
    CHECK(kvp_preset_gpu_find("tpu") == NULL);
    /* every FACTS.md model is present */
    const char *need[] = {"smollm2-135m", "llama-3-8b", "llama-3-70b", "llama-3.1-405b", "mistral-7b",
                          "mixtral-8x7b", "qwen2.5-7b", "qwen2.5-72b", "gemma-2-9b", "deepseek-v3"};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        CHECK_MSG(kvp_preset_model_find(need[i]) != NULL, "%s", need[i]);
    const char *gpus[] = {"h100-sxm", "h100-pcie", "h200", "a100-40", "a100-80", "l40s", "rtx-4090", "b200"};
    for (size_t i = 0; i < sizeof gpus / sizeof gpus[0]; i++)
        CHECK_MSG(kvp_preset_gpu_find(gpus[i]) != NULL, "%s", gpus[i]);
}

/* Parameter counts from the shapes, against the published totals. */
static void test_params(void)
{
    static const struct { const char *name; uint64_t total, active; } want[] = {
        /* embd 49152x576 (tied) + 30 x (q,o 576^2 + k,v 576x192 + 3x576x1536 + 2 norms) + norm */
        {"smollm2-135m", 134515008, 0},
        {"llama-3-8b", 8030261248ull, 0},
        {"llama-3-70b", 70553706496ull, 0},
        {"llama-3.1-405b", 405853388800ull, 0},
        {"mistral-7b", 7241732096ull, 0},
        /* 32 x (8 experts x 3 x 4096 x 14336 + router 4096x8 + attention + norms) + 2 x 32000x4096 */
        {"mixtral-8x7b", 46702792704ull, 12879925248ull},
        {"qwen2.5-7b", 7615616512ull, 0},
        {"qwen2.5-72b", 72706203648ull, 0},
        {"gemma-2-9b", 9241705984ull, 0},
        /* 61 MLA layers 187,107,328 + norms, 3 dense FFN 396,361,728, 58 MoE layers of 257 experts
         * x 44,040,192 + router 1,835,008, untied 129280x7168 embeddings: 671.0B (37.6B active) */
        {"deepseek-v3", 671026404352ull, 37552282624ull},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const kvp_model_preset *m = kvp_preset_model_find(want[i].name);
        uint64_t total = 0, active = 0;
        kvp_cap_param_count(&m->cfg, m->q_lora_rank, &total, &active);
        CHECK_MSG(total == want[i].total, "%s: %" PRIu64 " != %" PRIu64, want[i].name, total, want[i].total);
        if (want[i].active)
            CHECK_MSG(active == want[i].active, "%s active: %" PRIu64 " != %" PRIu64, want[i].name, active,
                      want[i].active);
    }
}

/* The done-when figures: Llama-3-70B, 4096 tokens, fp16. */
static void test_llama70b(void)
{
    kvp_cap_params p = preset("llama-3-70b");
    p.seq_len = 4096;
    kvp_cap_result r = compute(&p);
    CHECK_EQ_U64(r.kv_bytes_per_token, 327680); /* 2 x 8 x 128 x 2 x 80 */
    CHECK_EQ_U64(r.kv_bytes, 1342177280ull);
    CHECK_EQ_U64(r.kv_alloc_bytes, 1342177280ull); /* 4096 is 256 whole blocks */
    /* the all-heads mistake: 64 KV heads are 8x the bytes over 80 layers */
    p.cfg.n_head_kv = 64;
    r = compute(&p);
    CHECK_EQ_U64(r.kv_bytes, 10737418240ull);
    /* the widely quoted 4,294,967,296 (2^32) is 64 heads over 32 layers:
     * 2 x 64 x 128 x 2 x 32 x 4096; reproduced only when asked for */
    p.cfg.n_layer = 32;
    r = compute(&p);
    CHECK_EQ_U64(r.kv_bytes, 4294967296ull);
    p.batch = 128;
    r = compute(&p);
    CHECK_EQ_U64(r.kv_bytes, 549755813888ull);
}

static void test_kv_per_token(void)
{
    static const struct { const char *name; uint64_t bytes; } want[] = {
        {"smollm2-135m", 23040},  {"llama-3-8b", 131072},  {"llama-3-70b", 327680}, {"llama-3.1-405b", 516096},
        {"mistral-7b", 131072},   {"mixtral-8x7b", 131072}, {"qwen2.5-7b", 57344},  {"qwen2.5-72b", 327680},
        {"deepseek-v3", 70272}, /* MLA: (512 + 64) x 61 x 2 */
        {"gemma-2-9b", 344064}, /* 2 x 8 x 256 x 2 x 42, before windows */
        {"llama-2-7b", 524288}, /* MHA: 2 x 32 x 128 x 2 x 32 */
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        kvp_cap_params p = preset(want[i].name);
        kvp_cap_result r = compute(&p);
        CHECK_MSG(r.kv_bytes_per_token == want[i].bytes, "%s: %" PRIu64 " != %" PRIu64, want[i].name,
                  r.kv_bytes_per_token, want[i].bytes);
    }
    /* MQA: one KV head */
    kvp_cap_params p = preset("llama-3-8b");
    p.cfg.n_head_kv = 1;
    CHECK_EQ_U64(compute(&p).kv_bytes_per_token, 2 * 1 * 128 * 2 * 32);
}

static void test_kv_dtypes(void)
{
    kvp_err err = {0};
    kvp_cap_params p = preset("llama-3-8b");
    p.seq_len = 4096;
    CHECK(kvp_cap_kv_fmt("fp8", &p.kv_fmt, &err) == 0);
    kvp_cap_result r = compute(&p);
    /* fp8 (E4M3) as decode's cache holds it: an f32 scale per head (16
     * vectors) per layer per token */
    CHECK_EQ_U64(r.kv_bytes_per_token, 65536 + 16 * 4 * 32);
    CHECK_EQ_U64(r.kv_alloc_bytes_per_seq, (65536ull + 16 * 4 * 32) * 4096);
    /* fp8-e5m2: one scale per layer, not counted */
    CHECK(kvp_cap_kv_fmt("fp8-e5m2", &p.kv_fmt, &err) == 0);
    CHECK_EQ_U64(compute(&p).kv_alloc_bytes_per_seq, 65536ull * 4096);
    /* int8: data halves, plus an f32 scale per head per layer per token */
    CHECK(kvp_cap_kv_fmt("int8", &p.kv_fmt, &err) == 0);
    r = compute(&p);
    CHECK_EQ_U64(r.kv_bytes_per_token, 65536 + 16 * 4 * 32);
    CHECK_EQ_U64(r.kv_bytes_per_seq, (65536ull + 16 * 4 * 32) * 4096);
    /* int4: an f32 scale per head (16 vectors) per layer per block */
    CHECK(kvp_cap_kv_fmt("int4", &p.kv_fmt, &err) == 0);
    r = compute(&p);
    CHECK_EQ_U64(r.kv_bytes_per_token, 32768);
    CHECK_EQ_U64(r.kv_alloc_bytes_per_seq, 32768ull * 4096 + 256ull * 32 * 16 * 4);
    /* fp4: NVFP4 blocks of 16 values in 9 bytes: 128 -> 72 bytes a vector */
    CHECK(kvp_cap_kv_fmt("fp4", &p.kv_fmt, &err) == 0);
    CHECK_EQ_U64(compute(&p).kv_bytes_per_token, 16 * 72 * 32);
    CHECK(kvp_cap_kv_fmt("bf16", &p.kv_fmt, &err) == 0);
    CHECK_EQ_U64(compute(&p).kv_bytes_per_token, 131072);
    CHECK(kvp_cap_kv_fmt("q4_0", &p.kv_fmt, &err) == KVP_EINVAL);
}

static void test_weight_formats(void)
{
    kvp_err err = {0};
    kvp_cap_fmt f;
    /* GGUF types: exact block bytes, 4096 x 4096 */
    CHECK(kvp_cap_weight_fmt("q4_1", &f, &err) == 0);
    CHECK_EQ_U64(kvp_cap_fmt_bytes(&f, 4096, 4096), 4096ull * 128 * 20);
    CHECK(kvp_cap_weight_fmt("Q8_0", &f, &err) == 0);
    CHECK_EQ_U64(kvp_cap_fmt_bytes(&f, 4096, 4096), 4096ull * 128 * 34);
    CHECK(kvp_cap_weight_fmt("q4_k", &f, &err) == 0);
    CHECK_EQ_U64(kvp_cap_fmt_bytes(&f, 4096, 4096), 4096ull * 16 * 144);
    CHECK(kvp_cap_weight_fmt("q5_k", &f, &err) == 0);
    CHECK_EQ_U64(kvp_cap_fmt_bytes(&f, 4096, 4096), 4096ull * 16 * 176);
    const kvp_dtype_traits *tr = kvp_dtype_get(KVP_DTYPE_Q6_K);
    CHECK(kvp_cap_weight_fmt("q6_k", &f, &err) == 0);
    CHECK(tr && f.block_bytes == (uint32_t)tr->block_bytes && f.block_elems == (uint32_t)tr->block_size);
    /* int4 group 128: half a byte each plus an f16 scale per 128 */
    CHECK(kvp_cap_weight_fmt("int4", &f, &err) == 0);
    CHECK_EQ_U64(kvp_cap_fmt_bytes(&f, 4096, 4096), 4096ull * 2048 + 4096ull * 32 * 2);
    CHECK(kvp_cap_weight_fmt("int4-g32", &f, &err) == 0);
    CHECK_EQ_U64(kvp_cap_fmt_bytes(&f, 4096, 4096), 4096ull * 2048 + 4096ull * 128 * 2);
    /* int8 per channel: one f32 per row */
    CHECK(kvp_cap_weight_fmt("int8", &f, &err) == 0);
    CHECK_EQ_U64(kvp_cap_fmt_bytes(&f, 4096, 4096), 4096ull * 4096 + 4096 * 4);
    /* fp8: one f32 per tensor */
    CHECK(kvp_cap_weight_fmt("fp8", &f, &err) == 0);
    CHECK_EQ_U64(kvp_cap_fmt_bytes(&f, 4096, 4096), 4096ull * 4096 + 4);
    CHECK(kvp_cap_weight_fmt("nvfp4", &f, &err) == 0);
    CHECK_EQ_U64(kvp_cap_fmt_bytes(&f, 4096, 4096), 4096ull * 256 * 9 + 4);
    CHECK(kvp_cap_weight_fmt("mxfp4", &f, &err) == 0);
    CHECK_EQ_U64(kvp_cap_fmt_bytes(&f, 4096, 4096), 4096ull * 128 * 17);
    CHECK(kvp_cap_weight_fmt("bf16", &f, &err) == 0 && kvp_cap_fmt_is_float(&f));
    CHECK(kvp_cap_weight_fmt("int3", &f, &err) == KVP_EINVAL);
    /* names in any case, each (INT4-G64 was refused beside Q4_K); a group
     * in digits only */
    static const char *const upper[][2] = {{"F16", "f16"}, {"BF16", "bf16"}, {"FP8", "fp8"}, {"FP8-E5M2", "fp8-e5m2"},
                                           {"INT8", "int8"}, {"INT4", "int4-g128"}, {"INT4-G64", "int4-g64"},
                                           {"Fp4-G32", "fp4-g32"}, {"NVFP4", "nvfp4"}, {"MXFP4", "mxfp4"},
                                           {"Q4_1", "q4_1"}, {"Q6_K", "q6_k"}};
    for (size_t i = 0; i < sizeof upper / sizeof upper[0]; i++) {
        int rc = kvp_cap_weight_fmt(upper[i][0], &f, &err);
        CHECK_MSG(rc == 0 && strcmp(f.name, upper[i][1]) == 0, "%s: %d %s", upper[i][0], rc, rc ? err.msg : f.name);
    }
    CHECK(kvp_cap_weight_fmt("int4-g+64", &f, &err) == KVP_EINVAL);
    CHECK(kvp_cap_weight_fmt("int4-g 64", &f, &err) == KVP_EINVAL);
    CHECK(kvp_cap_weight_fmt("int4-g64x", &f, &err) == KVP_EINVAL);
    CHECK(kvp_cap_weight_fmt("int4-g", &f, &err) == KVP_EINVAL);
    static const char *const kv_upper[][2] = {{"F16", "f16"}, {"FP8", "fp8"}, {"FP8-E5M2", "fp8-e5m2"},
                                              {"INT8", "int8"}, {"INT4", "int4"}, {"FP4", "fp4"}};
    for (size_t i = 0; i < sizeof kv_upper / sizeof kv_upper[0]; i++) {
        int rc = kvp_cap_kv_fmt(kv_upper[i][0], &f, &err);
        CHECK_MSG(rc == 0 && strcmp(f.name, kv_upper[i][1]) == 0, "%s: %d", kv_upper[i][0], rc);
    }

    /* SmolLM2 in Q4_1 matrices, Q8_0 embeddings, f32 norms: the real GGUF's
     * layout; 30 x (2 x 576^2 + 2 x 576 x 192 + 3 x 576 x 1536) Q4_1 weights */
    kvp_cap_params p = preset("smollm2-135m");
    CHECK(kvp_cap_weight_fmt("q4_1", &p.weight_fmt, &err) == 0);
    CHECK(kvp_cap_weight_fmt("q8_0", &p.embed_fmt, &err) == 0);
    kvp_cap_result r = compute(&p);
    uint64_t lin = 30ull * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536) / 32 * 20;
    uint64_t emb = 49152ull * 576 / 32 * 34;
    uint64_t norms = 61ull * 576 / 32 * 34; /* norms in the embedding format here */
    CHECK_EQ_U64(r.weight_bytes, lin + emb + norms);
}

/* Sliding windows: Mistral (every layer) and Gemma-2 (every other layer). */
static void test_sliding(void)
{
    kvp_cap_params p = preset("mistral-7b");
    p.seq_len = 8192;
    kvp_cap_result r = compute(&p);
    CHECK_EQ_U64(r.kv_bytes_per_seq, 131072ull * 4096); /* stops at the 4096 window */
    /* tokens 4096..8191 span blocks 256..511: exactly 256 blocks */
    CHECK_EQ_U64(r.kv_alloc_bytes_per_seq, 131072ull * 4096);
    p.seq_len = 8200; /* window [4104, 8200): blocks 256 (4096..4111) .. 512: 257 blocks */
    r = compute(&p);
    CHECK_EQ_U64(r.kv_bytes_per_seq, 131072ull * 4096);
    CHECK_EQ_U64(r.kv_alloc_bytes_per_seq, 131072ull * 16 * 257);
    CHECK(r.max_context == -1); /* memory stops growing */
    CHECK_EQ_U64(kvp_cap_layer_blocks(100, 16, 0), 7);
    CHECK_EQ_U64(kvp_cap_layer_blocks(100, 16, 200), 7);
    CHECK_EQ_U64(kvp_cap_layer_blocks(100, 16, 32), 3);  /* tokens 68..99: blocks 4..6 */
    CHECK_EQ_U64(kvp_cap_layer_blocks(100, 16, 36), 3);  /* tokens 64..99: blocks 4..6 */
    CHECK_EQ_U64(kvp_cap_layer_blocks(100, 16, 37), 4);  /* tokens 63..99: blocks 3..6 */

    p = preset("gemma-2-9b");
    CHECK(kvp_cap_layer_is_sliding(&p.cfg, 0) && !kvp_cap_layer_is_sliding(&p.cfg, 1));
    p.seq_len = 8192;
    r = compute(&p);
    uint64_t per_layer_tok = 2 * 8 * 256 * 2; /* 8192 bytes */
    CHECK_EQ_U64(r.kv_bytes_per_seq, 21 * per_layer_tok * 8192 + 21 * per_layer_tok * 4096);
    p.seq_len = 2048; /* inside the window every layer holds everything */
    CHECK_EQ_U64(compute(&p).kv_bytes_per_seq, 42 * per_layer_tok * 2048);
}

/* The longest context is the largest L such that every length 1..L fits:
 * a windowed layer's blocks are not monotone in the length, so a longer
 * sequence can fit where a shorter one does not, and the answer is not
 * merely a length that fits. */
static int64_t brute_context(kvp_cap_params p, uint64_t upto)
{
    for (uint64_t len = 1; len <= upto; len++) {
        p.seq_len = len;
        if (compute(&p).max_seqs < p.batch)
            return (int64_t)len - 1;
    }
    return -2; /* all fit */
}

static void test_max_context(void)
{
    /* Gemma-2 (alternate layers windowed) with small windows, and memory
     * for 47 blocks a pair of layers after the weights and allowance of
     * the stage that has the most (at window 50, block 16: 672 tokens fit,
     * 673 do not, 680 do): every length checked, on one stage and on two
     * (each its own layers and free memory) */
    const uint32_t windows[] = {50, 48, 1, 17, 33, 65, 100};
    const uint32_t sizes[] = {16, 8, 1, 32, 16, 64, 4};
    for (size_t i = 0; i < sizeof windows / sizeof windows[0]; i++) {
        for (uint32_t pp = 1; pp <= 2; pp++) {
            kvp_cap_params p = preset("gemma-2-9b");
            p.cfg.sliding_window = windows[i];
            p.block_size = sizes[i];
            p.pp = p.gpus = pp;
            p.gpu_util = 1.0;
            p.gpu_mem_bytes = 0;
            kvp_cap_result r = compute(&p);
            uint64_t fixed = 0;
            for (uint32_t s = 0; s < pp; s++) {
                uint64_t f = r.stage[s].weight_bytes + p.overhead_bytes + r.stage[s].activation_bytes;
                fixed = f > fixed ? f : fixed;
            }
            uint64_t layer_block = r.stage[0].block_bytes / (42 / pp);
            p.gpu_mem_bytes = fixed + 21 / pp * 47 * layer_block;
            for (p.batch = 1; p.batch <= 3; p.batch++) {
                int64_t want = brute_context(p, 4000);
                r = compute(&p);
                CHECK_MSG(want >= 0 && r.max_context == want,
                          "window %u block %u pp %u batch %" PRIu64 ": %lld, every length to %lld fits", windows[i],
                          sizes[i], pp, p.batch, (long long)r.max_context, (long long)want);
            }
        }
    }
    /* every layer windowed (Mistral, window 50, block 16): memory for 4
     * blocks a layer holds every length to 64; at 65 the window (tokens
     * 15..64) spans 5 blocks; with 5 blocks every length fits */
    {
        kvp_cap_params p = preset("mistral-7b");
        p.cfg.sliding_window = 50;
        p.gpu_util = 1.0;
        p.gpu_mem_bytes = 0;
        kvp_cap_result r = compute(&p);
        uint64_t fixed = r.stage[0].weight_bytes + p.overhead_bytes + r.stage[0].activation_bytes;
        p.gpu_mem_bytes = fixed + 4 * r.stage[0].block_bytes;
        CHECK_EQ_I64(compute(&p).max_context, 64);
        CHECK_EQ_I64(brute_context(p, 4000), 64);
        p.gpu_mem_bytes = fixed + 5 * r.stage[0].block_bytes;
        CHECK_EQ_I64(compute(&p).max_context, -1);
        CHECK_EQ_I64(brute_context(p, 4000), -2);
    }
    /* the review's Gemma-2-9B on an H100: 323,888 tokens fit, 323,889 to
     * 323,903 do not (their windowed layers hold one block more), 323,904
     * does; the answer was 323,904 */
    kvp_cap_params p = preset("gemma-2-9b");
    p.gpu_mem_bytes = kvp_preset_gpu_find("h100")->mem_bytes;
    const uint64_t lens[] = {323888, 323889, 323903, 323904};
    const uint64_t seqs[] = {1, 0, 0, 1};
    for (size_t i = 0; i < 4; i++) {
        p.seq_len = lens[i];
        kvp_cap_result r = compute(&p);
        CHECK_EQ_U64(r.max_seqs, seqs[i]);
        CHECK_EQ_I64(r.max_context, 323888);
    }
    /* Mistral-7B (every layer windowed), 113 sequences: at 4097 tokens
     * they do not fit, so memory that stops growing is no unbounded
     * context (it said "unbounded" above "a batch of 113 does not fit") */
    p = preset("mistral-7b");
    p.gpu_mem_bytes = kvp_preset_gpu_find("h100")->mem_bytes;
    p.seq_len = 4097;
    p.batch = 113;
    kvp_cap_result r = compute(&p);
    CHECK(!r.batch_fits);
    CHECK_EQ_I64(r.max_context, 4096);
    p.batch = 1;
    CHECK_EQ_I64(compute(&p).max_context, -1); /* one sequence fits at every length */
    /* memory for more than 2^32 tokens of a model with no windows: every
     * length planned fits, which is not unbounded */
    p = preset("smollm2-135m");
    p.gpu_mem_bytes = 200000000000000ull;
    CHECK_EQ_I64(compute(&p).max_context, (int64_t)KVP_CAP_MAX_SEQ_LEN);
}

static void test_mla_moe(void)
{
    kvp_cap_params p = preset("deepseek-v3");
    p.seq_len = 1000;
    kvp_cap_result r = compute(&p);
    CHECK_EQ_U64(r.kv_vector_elems, 576);
    CHECK_EQ_U64(r.kv_bytes_per_seq, 70272ull * 1000);
    CHECK_EQ_U64(r.kv_alloc_bytes_per_seq, 70272ull * 1008); /* 63 blocks of 16 */
    /* MLA latent is replicated under TP: per-GPU KV does not shrink */
    p.tp = p.gpus = 8;
    r = compute(&p);
    CHECK_EQ_U64(r.stage[0].kv_bytes_per_token, 70272);
    /* MoE: KV of attention only, same as a dense model of that attention */
    kvp_cap_params m = preset("mixtral-8x7b");
    kvp_cap_params d = preset("mistral-7b");
    d.cfg.sliding_window = 0;
    CHECK_EQ_U64(compute(&m).kv_bytes_per_token, compute(&d).kv_bytes_per_token);
    /* experts' weights all count: Mixtral f16 = 2 bytes x params */
    CHECK_EQ_U64(compute(&m).weight_bytes, 2 * 46702792704ull);
}

static void test_tp_pp(void)
{
    kvp_cap_params p = preset("llama-3-70b");
    p.seq_len = 4096;
    p.tp = p.gpus = 4;
    kvp_cap_result r = compute(&p);
    CHECK_EQ_U64(r.kv_heads_per_gpu, 2);
    CHECK_EQ_U64(r.stage[0].kv_bytes_per_token, 327680 / 4);
    /* tp 16 > 8 KV heads: each GPU keeps one head (replicated twice) */
    p.tp = p.gpus = 16;
    r = compute(&p);
    CHECK_EQ_U64(r.kv_heads_per_gpu, 1);
    CHECK_EQ_U64(r.stage[0].kv_bytes_per_token, 327680 / 8);
    /* weights at tp 2: every matrix halves; norms replicate.
     * per layer: 855,638,016 matrix params / 2 + 16384 norms; embed + lm_head halve; final norm whole */
    p.tp = p.gpus = 2;
    r = compute(&p);
    uint64_t want = 2 * (80ull * (855638016ull / 2 + 16384) + 2 * 1050673152ull / 2 + 8192);
    CHECK_EQ_U64(r.stage[0].weight_bytes, want);
    /* Qwen2.5-7B's biases at tp 2 split with their heads as decode's
     * shards cut them (lib/model/shard.c): q's 3584 by the 28 query heads,
     * k's and v's 512 by the 4 KV heads; norms whole.  Per layer
     * 3584^2 x 2 + 2 x 512 x 3584 + 3 x 18944 x 3584 matrix params halve;
     * embed and lm_head halve (untied); final norm whole.  bq whole on every
     * rank was 28 x 1792 x 2 = 100,352 B more. */
    kvp_cap_params q = preset("qwen2.5-7b");
    q.tp = q.gpus = 2;
    uint64_t mat = 2ull * 3584 * 3584 + 2ull * 512 * 3584 + 3ull * 18944 * 3584;
    CHECK_EQ_U64(compute(&q).stage[0].weight_bytes,
                 2 * (28 * (mat / 2 + 2 * 3584 + 3584 / 2 + 2 * 512 / 2) + 152064ull * 3584 + 3584));
    /* pp 2: 40 layers a stage; embeddings on stage 0, lm_head + norm on stage 1 */
    p.tp = 1;
    p.pp = p.gpus = 2;
    r = compute(&p);
    CHECK_EQ_U64(r.n_stages, 2);
    CHECK_EQ_U64(r.stage[0].layer_end, 40);
    CHECK_EQ_U64(r.stage[0].kv_bytes_per_token, 327680 / 2);
    CHECK_EQ_U64(r.stage[0].weight_bytes, 2 * (40ull * 855654400 + 1050673152));
    CHECK_EQ_U64(r.stage[1].weight_bytes, 2 * (40ull * 855654400 + 1050673152 + 8192));
    /* pp 3 over 80 layers: 27, 27, 26, the earlier stages one more, as
     * decode splits them (kvp_shard_first_layer) */
    p.pp = p.gpus = 3;
    r = compute(&p);
    CHECK_EQ_U64(r.stage[0].layer_end - r.stage[0].layer_begin, 27);
    CHECK_EQ_U64(r.stage[1].layer_end, 54);
    CHECK_EQ_U64(r.stage[2].layer_end - r.stage[2].layer_begin, 26);
    /* tied embeddings with pp: the last stage carries a copy */
    kvp_cap_params s = preset("smollm2-135m");
    s.pp = s.gpus = 2;
    r = compute(&s);
    /* 15 layers + the table each; the last also the output norm */
    CHECK_EQ_U64(r.stage[1].weight_bytes, r.stage[0].weight_bytes + 576 * 2);
    /* replicas */
    p.pp = 1;
    p.tp = 2;
    p.gpus = 8;
    r = compute(&p);
    CHECK_EQ_U64(r.replicas, 4);
    CHECK_EQ_U64(r.max_seqs_total, 4 * r.max_seqs);
}

static void test_blocks_capacity(void)
{
    kvp_cap_params p = preset("llama-3-8b");
    p.seq_len = 1000; /* 63 blocks of 16 = 1008 tokens */
    kvp_cap_result r = compute(&p);
    CHECK_EQ_U64(r.kv_bytes_per_seq, 131072ull * 1000);
    CHECK_EQ_U64(r.kv_alloc_bytes_per_seq, 131072ull * 1008);
    CHECK_EQ_U64(r.kv_waste_bytes_per_seq, 131072ull * 8);
    p.block_size = 256; /* 4 blocks = 1024 tokens */
    r = compute(&p);
    CHECK_EQ_U64(r.kv_alloc_bytes_per_seq, 131072ull * 1024);
    /* capacity: fix memory so the answer is exact.  Allowance: 1 GiB +
     * activations; give exactly room for 10 blocks of 16 tokens after them. */
    p.block_size = 16;
    p.gpu_util = 1.0;
    p.gpu_mem_bytes = 0;
    r = compute(&p);
    uint64_t fixed = r.stage[0].weight_bytes + p.overhead_bytes + r.stage[0].activation_bytes;
    p.gpu_mem_bytes = fixed + 10 * 16 * 131072ull + 5;
    r = compute(&p);
    CHECK_EQ_I64(r.stage[0].kv_free_bytes, 10 * 16 * 131072ll + 5);
    CHECK_EQ_U64(r.stage[0].n_blocks, 10);
    p.seq_len = 33; /* 3 blocks each: 3 sequences */
    r = compute(&p);
    CHECK_EQ_U64(r.max_seqs, 3);
    p.batch = 2;
    r = compute(&p);
    CHECK_EQ_I64(r.max_context, 80); /* 5 blocks each */
    CHECK(r.fits && r.batch_fits);
    p.batch = 4;
    r = compute(&p);
    CHECK(r.fits && !r.batch_fits);
    p.gpu_mem_bytes = fixed - 1;
    r = compute(&p);
    CHECK(!r.fits && r.max_seqs == 0 && r.stage[0].kv_free_bytes < 0);
}

static void test_roofline(void)
{
    kvp_cap_params p = preset("llama-3-8b");
    p.gpu_bw = 1e12;
    p.seq_len = 1024;
    p.batch = 1;
    kvp_cap_result r = compute(&p);
    uint64_t bytes = r.stage[0].weight_bytes + 131072ull * 1024;
    CHECK_EQ_U64(r.decode_bytes_per_step, bytes);
    CHECK_NEAR(r.decode_tokens_per_s, 1e12 / (double)bytes, 1e-6);
    p.gpu_bw = 0;
    CHECK(compute(&p).decode_tokens_per_s == 0);
}

static void test_errors(void)
{
    kvp_err err = {0};
    kvp_cap_result r;
    kvp_cap_params p = preset("llama-3-8b");
    p.block_size = 24;
    CHECK(kvp_cap_compute(&p, &r, &err) == KVP_EINVAL && strstr(err.msg, "block-size"));
    p = preset("llama-3-8b");
    p.gpu_util = 1.5;
    CHECK(kvp_cap_compute(&p, &r, &err) == KVP_EINVAL && strstr(err.msg, "gpu-util"));
    p = preset("llama-3-8b");
    p.tp = 4;
    p.gpus = 2;
    CHECK(kvp_cap_compute(&p, &r, &err) == KVP_EINVAL && strstr(err.msg, "gpus"));
    p = preset("llama-3-8b");
    p.pp = p.gpus = 33;
    CHECK(kvp_cap_compute(&p, &r, &err) == KVP_EINVAL && strstr(err.msg, "pp"));
    p = preset("llama-3-8b");
    p.cfg.n_layer = 0;
    CHECK(kvp_cap_compute(&p, &r, &err) == KVP_EINVAL && strstr(err.msg, "layers"));
    /* the loader's ceilings (config.h), not looser ones of its own: no plan
     * for a shape no model file can have */
    p.cfg.n_layer = KVP_CONFIG_MAX_LAYER;
    CHECK_MSG(kvp_cap_compute(&p, &r, &err) == 0, "%s", err.msg);
    p.cfg.n_layer = KVP_CONFIG_MAX_LAYER + 1;
    CHECK(kvp_cap_compute(&p, &r, &err) == KVP_EINVAL);
    CHECK_STR(err.msg, "layers: 4097 is out of range (1..4096)");
    /* one sequence's KV past 64 bits (4096 layers of 1024 KV heads of
     * 1024 f32 elements: 2^35 B a token, 2^32 tokens): refused, not wrapped
     * to a small size (which had kvcalc divide by zero) */
    p = preset("llama-3-8b");
    p.cfg.n_layer = KVP_CONFIG_MAX_LAYER, p.cfg.n_head = p.cfg.n_head_kv = 1024, p.cfg.head_dim = 1024;
    CHECK(kvp_cap_kv_fmt("f32", &p.kv_fmt, &err) == 0);
    p.seq_len = 1ull << 32;
    CHECK(kvp_cap_compute(&p, &r, &err) == KVP_EINVAL);
    CHECK_STR(err.msg, "seq-len: one sequence's KV bytes overflow 64 bits");
    /* at a length that fits, the longest context is what memory holds
     * (2^40 B a GPU: 32 tokens at 2^35 B), not one from a wrapped size */
    p.seq_len = 16, p.block_size = 16, p.gpu_mem_bytes = 1ull << 40, p.gpu_util = 1.0, p.weight_bytes_override = 1;
    CHECK_MSG(kvp_cap_compute(&p, &r, &err) == 0, "%s", err.msg);
    CHECK_MSG(r.max_context > 0 && (uint64_t)r.max_context < 32, "max_context %lld", (long long)r.max_context);
    p = preset("llama-3-8b");
    p.cfg.head_dim = KVP_CONFIG_MAX_HEAD_DIM + 1;
    CHECK(kvp_cap_compute(&p, &r, &err) == KVP_EINVAL);
    CHECK_STR(err.msg, "head-dim: 1025 is out of range (1..1024)");
    p = preset("llama-3-8b");
    p.cfg.n_ff = KVP_CONFIG_MAX_FF + 1;
    CHECK(kvp_cap_compute(&p, &r, &err) == KVP_EINVAL);
    CHECK_STR(err.msg, "ffn: too large (max 4194304)");
    p = preset("mixtral-8x7b");
    p.cfg.n_expert = KVP_CONFIG_MAX_EXPERT + 1;
    CHECK(kvp_cap_compute(&p, &r, &err) == KVP_EINVAL);
    CHECK_STR(err.msg, "experts: 65537 is out of range (0..65536)");
    /* only the TP splits decode runs (shard.h): 32 heads over 3 do not
     * split, 8 KV heads over 16 replicate, 9 heads over 2 do not split */
    p = preset("llama-3-8b");
    p.tp = p.gpus = 3;
    CHECK(kvp_cap_compute(&p, &r, &err) == KVP_EINVAL &&
          strstr(err.msg, "tp: tensor parallelism over 3 ranks: 32 query heads do not split evenly"));
    p.tp = p.gpus = 16;
    CHECK_MSG(kvp_cap_compute(&p, &r, &err) == 0, "%s", err.msg);
    p = preset("smollm2-135m");
    p.tp = p.gpus = 2;
    CHECK(kvp_cap_compute(&p, &r, &err) == KVP_EINVAL && strstr(err.msg, "rank counts that split this model: 1, 3"));
    /* experts and MLA split here (vLLM does), though decode does not run them */
    p = preset("mixtral-8x7b");
    p.tp = p.gpus = 8;
    CHECK_MSG(kvp_cap_compute(&p, &r, &err) == 0, "%s", err.msg);
}

/* Every preset passes the loader's checks, so the shape kvcalc checks a
 * preset's options against starts from a valid one, and every tp kvcalc's
 * tests plan for it divides. */
static void test_presets_valid(void)
{
    for (size_t i = 0; i < kvp_preset_model_count(); i++) {
        const kvp_model_preset *m = kvp_preset_model_at(i);
        kvp_err err = {0};
        CHECK_MSG(kvp_config_check(&m->cfg, m->name, &err) == 0, "%s", err.msg);
    }
}

static int plain_num(const char *s, double *out)
{
    char *e;
    *out = strtod(s, &e);
    return e == s || *e ? -1 : 0;
}

static int whole_num(const char *s, double *out)
{
    return plain_num(s, out) || *out != floor(*out) ? -1 : 0;
}

static void test_sweep(void)
{
    kvp_err err = {0};
    double v[64];
    size_t n;
    CHECK(kvp_cap_sweep_parse("1024:4096:1024", plain_num, "a number", 0, v, 64, &n, &err) == 0);
    CHECK(n == 4 && v[0] == 1024 && v[3] == 4096);
    CHECK(kvp_cap_sweep_parse("1:64:x2", plain_num, "a number", 0, v, 64, &n, &err) == 0);
    CHECK(n == 7 && v[6] == 64);
    CHECK(kvp_cap_sweep_parse("0.5:0.9:0.1", plain_num, "a number", 0, v, 64, &n, &err) == 0);
    CHECK(n == 5 && fabs(v[4] - 0.9) < 1e-12);
    CHECK(kvp_cap_sweep_parse("7", plain_num, "a number", 0, v, 64, &n, &err) == 0 && n == 1 && v[0] == 7);
    CHECK(kvp_cap_sweep_parse("1:10:3", plain_num, "a number", 0, v, 64, &n, &err) == 0 && n == 4 && v[3] == 10);
    CHECK(kvp_cap_sweep_parse("4:1:1", plain_num, "a number", 0, v, 64, &n, &err) == KVP_EINVAL);
    CHECK(kvp_cap_sweep_parse("1:4:0", plain_num, "a number", 0, v, 64, &n, &err) == KVP_EINVAL);
    CHECK(kvp_cap_sweep_parse("1:4:x1", plain_num, "a number", 0, v, 64, &n, &err) == KVP_EINVAL);
    CHECK(kvp_cap_sweep_parse("1:4", plain_num, "a number", 0, v, 64, &n, &err) == KVP_EINVAL);
    CHECK(kvp_cap_sweep_parse("1:1000:1", plain_num, "a number", 0, v, 64, &n, &err) == KVP_ELIMIT);
    /* the message names the part that is bad and what it must be */
    CHECK(kvp_cap_sweep_parse("1:3:0.5", whole_num, "a whole number", 0, v, 64, &n, &err) == KVP_EINVAL);
    CHECK_MSG(strstr(err.msg, "STEP '0.5' is not a whole number") != NULL, "%s", err.msg);
    CHECK(kvp_cap_sweep_parse("x:3:1", whole_num, "a whole number", 0, v, 64, &n, &err) == KVP_EINVAL);
    CHECK_MSG(strstr(err.msg, "START 'x' is not a whole number") != NULL, "%s", err.msg);
    CHECK(kvp_cap_sweep_parse("1:3.5:1", whole_num, "a whole number", 0, v, 64, &n, &err) == KVP_EINVAL);
    CHECK_MSG(strstr(err.msg, "END '3.5' is not a whole number") != NULL, "%s", err.msg);
    CHECK(kvp_cap_sweep_parse("2.5", whole_num, "a whole number", 0, v, 64, &n, &err) == KVP_EINVAL);
    CHECK_MSG(strstr(err.msg, "'2.5' is not a whole number") != NULL, "%s", err.msg);
    /* a FACTOR is digits: no exponent, hex or space (strtod takes them) */
    CHECK(kvp_cap_sweep_parse("1:64:x1.5", plain_num, "a number", 0, v, 64, &n, &err) == 0 && n == 11);
    /* whole: rounded, repeats dropped before the limit counts them (1..64 by
     * x1.01: 418 steps, the last 63.4, so 63 counts) */
    CHECK(kvp_cap_sweep_parse("1:64:x1.01", plain_num, "a number", 0, v, 64, &n, &err) == KVP_ELIMIT);
    CHECK(kvp_cap_sweep_parse("1:64:x1.01", plain_num, "a number", 1, v, 64, &n, &err) == 0 && n == 63);
    CHECK(n == 63 && v[0] == 1 && v[1] == 2 && v[62] == 63);
    CHECK(kvp_cap_sweep_parse("1:3:x1.5", plain_num, "a number", 1, v, 64, &n, &err) == 0 && n == 2 && v[1] == 2);
    CHECK(kvp_cap_sweep_parse("1:64:x2e0", plain_num, "a number", 0, v, 64, &n, &err) == KVP_EINVAL);
    CHECK(kvp_cap_sweep_parse("1:64:x0x2", plain_num, "a number", 0, v, 64, &n, &err) == KVP_EINVAL);
    CHECK(kvp_cap_sweep_parse("1:64:x 2", plain_num, "a number", 0, v, 64, &n, &err) == KVP_EINVAL);
}

static void test_rng(void)
{
    kvp_cap_rng a, b;
    kvp_cap_rng_seed(&a, 42);
    kvp_cap_rng_seed(&b, 42);
    int same = 1;
    for (int i = 0; i < 100; i++)
        same &= kvp_cap_rng_next(&a) == kvp_cap_rng_next(&b);
    CHECK(same);
    kvp_cap_rng_seed(&b, 43);
    CHECK(kvp_cap_rng_next(&a) != kvp_cap_rng_next(&b));
    /* moments of the normal generator */
    double s = 0, s2 = 0;
    int n = 200000;
    for (int i = 0; i < n; i++) {
        double x = kvp_cap_rng_normal(&a);
        s += x;
        s2 += x * x;
    }
    CHECK_NEAR(s / n, 0, 0.01);
    CHECK_NEAR(s2 / n, 1, 0.02);
}

/* Fragmentation with closed-form answers. */
static void test_sim(void)
{
    kvp_err err = {0};
    kvp_cap_lengths d;
    kvp_cap_sim_row rows[4];
    uint32_t bs[3] = {16, 64, 256};
    /* every length 1000: contiguous reservation of 4096 fits floor(M / 4096);
     * block B fits floor(floor(M / B) / ceil(1000 / B)) */
    CHECK(kvp_cap_lengths_parse(&d, "uniform:1000:1000", &err) == 0);
    kvp_cap_sim_opts o = {.kv_bytes = 1000000, .bytes_per_token = 10, .n_full = 1, .max_len = 4096, .seed = 1};
    CHECK(kvp_cap_simulate(&o, &d, bs, 3, rows, &err) == 0);
    CHECK_EQ_U64(rows[0].seqs, 100000 / 4096);             /* 24 */
    CHECK_EQ_U64(rows[0].waste_bytes, 24ull * 3096 * 10);
    CHECK_EQ_U64(rows[1].seqs, (1000000 / 160) / 63);      /* 6250 blocks / 63 = 99 */
    CHECK_EQ_U64(rows[1].waste_bytes, 99ull * 8 * 10);
    CHECK_EQ_U64(rows[2].seqs, (1000000 / 640) / 16);      /* 1562 / 16 = 97 */
    CHECK_EQ_U64(rows[3].seqs, (1000000 / 2560) / 4);      /* 390 / 4 = 97 */
    CHECK_EQ_U64(rows[3].waste_bytes, 97ull * 24 * 10);
    CHECK_EQ_U64(rows[1].seqs_shared, rows[1].seqs);       /* no prefix asked */

    /* shared prefix of 512 tokens: 32 blocks of 16 shared, 31 own each;
     * the first pays 63: 1 + floor((6250 - 63) / 31) = 200 */
    o.shared_prefix = 512;
    CHECK(kvp_cap_simulate(&o, &d, bs, 1, rows, &err) == 0);
    CHECK_EQ_U64(rows[1].seqs_shared, 1 + (6250 - 63) / 31);
    CHECK_EQ_U64(rows[1].saved_bytes, (rows[1].seqs_shared - 1) * 32 * 160);
    o.shared_prefix = 0;

    /* windows, charged as the plan charges them: one full layer and one of
     * a 100-token window, 1 B a token in each, 16,000 B.  Contiguous
     * reserves 4096 + 100 (a ring for the window): 3, each leaving 4196 -
     * (1000 + 100) slots empty.  Blocks of 16: 63 + the 7 the window's
     * tokens 900..999 span (blocks 56..62) = 70 of 1000: 14, 1120 - 1100
     * slots empty each (every token in every layer was 126: 7) */
    o = (kvp_cap_sim_opts){.kv_bytes = 16000, .bytes_per_token = 1, .n_full = 1, .n_sliding = 1, .window = 100,
                           .max_len = 4096, .seed = 1};
    CHECK(kvp_cap_simulate(&o, &d, bs, 1, rows, &err) == 0);
    CHECK_EQ_U64(rows[0].seqs, 3);
    CHECK_EQ_U64(rows[0].waste_bytes, 3 * 3096);
    CHECK_EQ_U64(rows[1].seqs, 14);
    CHECK_EQ_U64(rows[1].alloc_bytes, 14 * 70 * 16);
    CHECK_EQ_U64(rows[1].waste_bytes, 14 * 20);
    /* a shared prefix of 512 tokens (blocks 0..31): the full layer shares
     * all 32, the window (blocks 56..62) none: 1 + (1000 - 70) / 38 = 25 */
    o.shared_prefix = 512;
    CHECK(kvp_cap_simulate(&o, &d, bs, 1, rows, &err) == 0);
    CHECK_EQ_U64(rows[1].seqs_shared, 25);
    CHECK_EQ_U64(rows[1].saved_bytes, 24 * 32 * 16);
    /* a window of 600 (tokens 400..999, blocks 25..62: 38) keeps blocks
     * 25..31 of the prefix: 39 shared, 101 - 39 = 62 own: 1 + 899 / 62 = 15 */
    o.window = 600;
    CHECK(kvp_cap_simulate(&o, &d, bs, 1, rows, &err) == 0);
    CHECK_EQ_U64(rows[1].seqs, 1000 / 101);
    CHECK_EQ_U64(rows[1].seqs_shared, 15);
    CHECK_EQ_U64(rows[1].saved_bytes, 14 * 39 * 16);
    o.n_full = 0, o.n_sliding = 1, o.window = 0;
    CHECK(kvp_cap_simulate(&o, &d, bs, 1, rows, &err) == KVP_EINVAL);
    o.n_sliding = 0;
    CHECK(kvp_cap_simulate(&o, &d, bs, 1, rows, &err) == KVP_EINVAL);
    o = (kvp_cap_sim_opts){.kv_bytes = 1000000, .bytes_per_token = 10, .n_full = 1, .max_len = 4096, .seed = 1};

    /* uniform 1..1024 with block 16: waste per sequence is uniform over
     * 0..15 slots, mean 7.5 tokens; mean length 512.5 */
    CHECK(kvp_cap_lengths_parse(&d, "uniform:1:1024", &err) == 0);
    o.kv_bytes = 1000000000ull;
    o.bytes_per_token = 1;
    o.max_len = 1024;
    CHECK(kvp_cap_simulate(&o, &d, bs, 1, rows, &err) == 0);
    double mean_waste = (double)rows[1].waste_bytes / (double)rows[1].seqs;
    double mean_len = (double)rows[1].tokens / (double)rows[1].seqs;
    CHECK_MSG(rows[1].seqs > 1000000, "%" PRIu64, rows[1].seqs);
    CHECK_NEAR(mean_waste, 7.5, 0.05);
    CHECK_NEAR(mean_len, 512.5, 1.0);
    /* deterministic for a seed, different for another */
    kvp_cap_sim_row again[2];
    CHECK(kvp_cap_simulate(&o, &d, bs, 1, again, &err) == 0);
    CHECK(again[1].seqs == rows[1].seqs && again[1].waste_bytes == rows[1].waste_bytes);
    o.seed = 2;
    CHECK(kvp_cap_simulate(&o, &d, bs, 1, again, &err) == 0);
    CHECK(again[1].tokens != rows[1].tokens);
    kvp_cap_lengths_free(&d);

    /* a lengths file, used cyclically */
    char path[] = "/tmp/kvp-test-capacity-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "# two lengths\n16\n48\n");
    fclose(f);
    CHECK(kvp_cap_lengths_parse(&d, path, &err) == 0 && d.n_list == 2);
    o = (kvp_cap_sim_opts){.kv_bytes = 16 * 8, .bytes_per_token = 1, .n_full = 1, .max_len = 64, .seed = 1};
    CHECK(kvp_cap_simulate(&o, &d, bs, 1, rows, &err) == 0);
    CHECK_EQ_U64(rows[1].seqs, 4); /* 1 + 3 + 1 + 3 = all 8 blocks; the fifth finds none */
    CHECK_EQ_U64(rows[1].tokens, 128);
    CHECK_EQ_U64(rows[1].waste_bytes, 0);
    kvp_cap_lengths_free(&d);
    f = fopen(path, "w");
    fprintf(f, "16\n-3\n");
    fclose(f);
    CHECK(kvp_cap_lengths_parse(&d, path, &err) == KVP_EFORMAT && strstr(err.msg, "line 2"));
    kvp_cap_lengths_free(&d);
    unlink(path);
    CHECK(kvp_cap_lengths_parse(&d, "uniform:5:2", &err) == KVP_EINVAL);
    CHECK(kvp_cap_lengths_parse(&d, "normal:5", &err) == KVP_EINVAL);
    /* numbers are plain decimals: strtod would take each of these */
    CHECK(kvp_cap_lengths_parse(&d, "uniform: 1:5", &err) == KVP_EINVAL);
    CHECK(kvp_cap_lengths_parse(&d, "uniform:+1:5", &err) == KVP_EINVAL);
    CHECK(kvp_cap_lengths_parse(&d, "uniform:0x10:0x20", &err) == KVP_EINVAL);
    CHECK(kvp_cap_lengths_parse(&d, "normal:300:inf", &err) == KVP_EINVAL);
    CHECK(kvp_cap_lengths_parse(&d, "normal:300:5:7", &err) == KVP_EINVAL);
    CHECK_MSG(strstr(err.msg, "want normal:MEAN:SD") != NULL, "%s", err.msg);
    CHECK(kvp_cap_lengths_parse(&d, "uniform:1.5:10", &err) == KVP_EINVAL); /* lengths are whole */
    CHECK_MSG(strstr(err.msg, "whole numbers") != NULL, "%s", err.msg);
    CHECK(kvp_cap_lengths_parse(&d, "lognormal:-0.5:.25", &err) == 0 && d.a == -0.5 && d.b == 0.25);
    CHECK(kvp_cap_lengths_parse(&d, "normal:3e2:1e1", &err) == 0 && d.a == 300 && d.b == 10);
    CHECK(kvp_cap_lengths_parse(&d, "/nonexistent/lengths", &err) == KVP_EIO);
}

/* ffn_down's GGUF type Q4_0 -> Q4_K in the file at path: 8 blocks of 18
 * bytes are 144, one super-block's size, so the file stays whole. */
static void ffn_down_q4k(const char *path)
{
    FILE *f = fopen(path, "r+b");
    static uint8_t buf[1 << 16];
    size_t len = f ? fread(buf, 1, sizeof buf, f) : 0;
    static const char name[] = "blk.0.ffn_down.weight";
    uint8_t *at = NULL;
    for (size_t i = 8; i + sizeof name < len && !at; i++) /* u64 length, name, u32 dims, u64 x dims, u32 type */
        if (!memcmp(buf + i, name, sizeof name - 1) && buf[i - 8] == sizeof name - 1)
            at = buf + i + sizeof name - 1;
    CHECK(f && at);
    if (f && at) {
        uint8_t *ty = at + 4 + 8 * at[0];
        CHECK_EQ_I64(ty[0], 2);
        ty[0] = 12;
        CHECK(fseek(f, 0, SEEK_SET) == 0 && fwrite(buf, 1, len, f) == len);
    }
    if (f)
        CHECK(fclose(f) == 0);
}

/* The tiny GGUF of c (weights from seed), edited by edit (NULL: none),
 * through kvp_cap_load_model into *mf: 0, or -1 having said why. */
static int load_tiny(const tiny_cfg *c, uint64_t seed, void (*edit)(const char *path), kvp_cap_model_file *mf)
{
    char path[] = "/tmp/kvp-test-capacity-gguf-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0)
        return -1;
    close(fd);
    kvp_err err = {0};
    int rc = tiny_write(path, c, &seed);
    CHECK(rc == 0);
    if (rc == 0 && edit)
        edit(path);
    if (rc == 0 && (rc = kvp_cap_load_model(path, mf, &err)) != 0)
        CHECK_MSG(0, "%s", err.msg);
    unlink(path);
    return rc ? -1 : 0;
}

/* A GGUF's column-cut weights (attention output, FFN down) give the unit a
 * tensor-parallel slice must be a multiple of: Q8_0's block of 32. */
static void test_load_gguf_cols(void)
{
    tiny_cfg c = {.n_layer = 1, .n_embd = 64, .n_ff = 128, .n_head = 2, .n_head_kv = 1, .n_vocab = 64,
                  .wtype = KVP_DTYPE_Q8_0, .tied = 1};
    kvp_cap_model_file mf;
    if (load_tiny(&c, 7, NULL, &mf) < 0)
        return;
    CHECK_EQ_U64(mf.col_units.attn, 32);
    CHECK_EQ_U64(mf.col_units.ffn, 32);
}

/* A file's exact bytes per pipeline stage: each stage its own layers'
 * tensors, the first the token embeddings, the last the final norm and
 * the output head (kvcalc spread the file's total over the stages by
 * parameter count: a Q2_K file's Q6_K head put 16 MB too few on its last
 * stage); tensor parallelism splits matrices, not vectors. */
static void test_load_gguf_stage_bytes(void)
{
    tiny_cfg c = {.n_layer = 2, .n_embd = 64, .n_ff = 128, .n_head = 2, .n_head_kv = 2, .n_vocab = 64,
                  .wtype = KVP_DTYPE_Q8_0, .tied = 0};
    kvp_cap_model_file mf;
    kvp_err err = {0};
    if (load_tiny(&c, 5, NULL, &mf) < 0)
        return;
    uint64_t q = (uint64_t)kvp_dtype_row_bytes(KVP_DTYPE_Q8_0, 64), q128 = (uint64_t)kvp_dtype_row_bytes(KVP_DTYPE_Q8_0, 128);
    uint64_t layer = q * (64 + 64 + 64 + 64 + 128 + 128) + q128 * 64, vec = 64 * 4, table = q * 64;
    CHECK_EQ_U64(mf.weight_class_bytes[KVP_CAP_W_LAYERS], 2 * layer);
    CHECK_EQ_U64(mf.weight_class_bytes[KVP_CAP_W_EMBD], table);
    CHECK_EQ_U64(mf.weight_class_bytes[KVP_CAP_W_OUT], table);
    CHECK_EQ_U64(mf.weight_class_bytes[KVP_CAP_W_VECTORS], 5 * vec); /* 2 a layer, the output norm */
    CHECK_EQ_U64(mf.weight_class_bytes[KVP_CAP_W_REST], 0);
    CHECK_EQ_U64(mf.weight_bytes, 2 * layer + 2 * table + 5 * vec);
    kvp_cap_params p;
    kvp_cap_params_init(&p);
    p.cfg = mf.cfg;
    p.gpu_mem_bytes = 80ull << 30;
    p.weight_bytes_override = mf.weight_bytes;
    memcpy(p.weight_class_bytes, mf.weight_class_bytes, sizeof p.weight_class_bytes);
    CHECK(kvp_cap_weight_fmt("q8_0", &p.weight_fmt, &err) == 0 && kvp_cap_weight_fmt("q8_0", &p.embed_fmt, &err) == 0);
    p.pp = 2, p.gpus = 2;
    kvp_cap_result r = compute(&p);
    CHECK_EQ_U64(r.stage[0].weight_bytes, table + layer + 2 * vec);
    CHECK_EQ_U64(r.stage[1].weight_bytes, layer + 2 * vec + vec + table);
    p.pp = 1, p.tp = 2; /* matrices halved (KV heads too: 2 over 2 ranks), every vector whole */
    r = compute(&p);
    CHECK_EQ_U64(r.stage[0].weight_bytes, 2 * (layer / 2) + 2 * (table / 2) + 5 * vec); /* both layers, both tables */
}

/* A file whose attention output and FFN down projections have blocks of
 * their own sizes (llama.cpp's Q4_K_M of a 576-wide model: Q5_0's 32 and
 * Q6_K's 256) keeps one unit each: one rank plans (kvcalc refused even
 * --tp 1 of SmolLM2's Q4_K_M, taking 256 for the 576-wide attention
 * output), two are refused by the FFN's 256. */
static void test_load_gguf_mixed_cols(void)
{
    tiny_cfg c = {.n_layer = 1, .n_embd = 64, .n_ff = 256, .n_head = 2, .n_head_kv = 1, .n_vocab = 64,
                  .wtype = KVP_DTYPE_Q4_0, .tied = 1};
    kvp_cap_model_file mf;
    kvp_err err = {0};
    if (load_tiny(&c, 9, ffn_down_q4k, &mf) < 0)
        return;
    CHECK_EQ_U64(mf.col_units.attn, 32);
    CHECK_EQ_U64(mf.col_units.ffn, 256);
    CHECK_MSG(kvp_shard_check_split_cols(&mf.cfg, mf.col_units, 1, &err) == 0, "%s", err.msg);
    CHECK(kvp_shard_check_split_cols(&mf.cfg, mf.col_units, 2, &err) == KVP_EUNSUPPORTED);
    CHECK_MSG(strstr(err.msg, "FFN down projection's slices of 128 columns are not whole blocks of 256") &&
                  strstr(err.msg, "(rank counts that split this model: 1)"),
              "%s", err.msg);
}

/* A KVP model file: its CONFIG record gives the shape. */
static void test_load_kvp(void)
{
    kvp_err err = {0};
    char path[] = "/tmp/kvp-test-capacity-kvp-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    const kvp_model_preset *m = kvp_preset_model_find("llama-3-8b");
    kvp_meta meta;
    kvp_meta_init(&meta);
    CHECK(kvp_config_to_meta(&m->cfg, &meta) == 0);
    kvp_out out;
    kvp_writer *w = NULL;
    kvp_writer_opts opts = {0};
    opts.producer = "test_capacity";
    int rc = kvp_out_open(&out, path, &err);
    rc = rc ? rc : kvp_writer_open(&w, &out, &opts, &err);
    rc = rc ? rc : kvp_write_meta(w, KVP_KIND_CONFIG, &meta, &err);
    rc = rc ? rc : kvp_writer_finish(w, &err);
    rc = rc ? rc : kvp_out_commit(&out, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    kvp_writer_free(w);
    kvp_meta_free(&meta);
    kvp_cap_model_file mf;
    rc = kvp_cap_load_model(path, &mf, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    CHECK_STR(mf.kind, "kvp");
    CHECK_EQ_U64(mf.cfg.n_layer, 32);
    CHECK_EQ_U64(mf.cfg.n_head_kv, 8);
    CHECK_EQ_U64(mf.cfg.head_dim, 128);
    /* a stream with no CONFIG is not a model */
    rc = kvp_out_open(&out, path, &err);
    rc = rc ? rc : kvp_writer_open(&w, &out, &opts, &err);
    rc = rc ? rc : kvp_writer_finish(w, &err);
    rc = rc ? rc : kvp_out_commit(&out, &err);
    kvp_writer_free(w);
    CHECK(kvp_cap_load_model(path, &mf, &err) == KVP_ENOTFOUND && strstr(err.msg, "CONFIG"));
    unlink(path);
    CHECK(kvp_cap_load_model("/nonexistent/model.gguf", &mf, &err) == KVP_EIO);
}

/* One tensor record of dtype t over rows x cols (rows 0: 1-D), int8 with
 * an f32 scale per row; the payload is zeros (kvcalc reads none of it). */
static int put_tensor(kvp_writer *w, const char *name, uint32_t t, uint64_t rows, uint64_t cols, kvp_err *err)
{
    static uint8_t zeros[1 << 16];
    kvp_tensor_rec r;
    memset(&r, 0, sizeof r);
    snprintf(r.name, sizeof r.name, "%s", name);
    r.dtype = t;
    r.n_dim = rows ? 2 : 1;
    r.shape[0] = rows ? rows : cols;
    r.shape[1] = cols;
    r.global_scale = 1;
    if (t == KVP_DTYPE_I8) {
        r.scheme = KVP_SCHEME_CHANNEL;
        r.scale_dtype = KVP_DTYPE_F32;
        r.scales_bytes = 4 * rows;
    }
    r.data_bytes = (uint64_t)kvp_tensor_data_bytes(&r);
    return kvp_write_tensor(w, &r, zeros, r.scales_bytes ? zeros : NULL, NULL, err);
}

/* A KVP model file at path: llama-3-8b's CONFIG saying tied (or not), and
 * a few tensors, with an lm_head or without, compressed or not. */
static void write_model(const char *path, int cfg_tied, int lm_head, int zstd)
{
    kvp_err err = {0};
    kvp_config c = kvp_preset_model_find("llama-3-8b")->cfg;
    c.tied_embeddings = cfg_tied;
    kvp_meta meta;
    kvp_meta_init(&meta);
    CHECK(kvp_config_to_meta(&c, &meta) == 0);
    kvp_out out;
    kvp_writer *w = NULL;
    kvp_writer_opts opts = {0};
    opts.producer = "test_capacity";
    opts.zstd_level = zstd ? 3 : 0;
    int rc = kvp_out_open(&out, path, &err);
    rc = rc ? rc : kvp_writer_open(&w, &out, &opts, &err);
    rc = rc ? rc : kvp_write_meta(w, KVP_KIND_CONFIG, &meta, &err);
    rc = rc ? rc : put_tensor(w, "token_embd.weight", KVP_DTYPE_F16, 4, 64, &err);   /* 512 B */
    rc = rc ? rc : put_tensor(w, "blk.0.attn_q.weight", KVP_DTYPE_I8, 64, 64, &err); /* 4096 + 256 B */
    rc = rc ? rc : put_tensor(w, "blk.0.attn_k.weight", KVP_DTYPE_I8, 64, 64, &err); /* 4096 + 256 B */
    rc = rc ? rc : put_tensor(w, "output_norm.weight", KVP_DTYPE_F32, 0, 64, &err);  /* 256 B, 1-D */
    if (lm_head)
        rc = rc ? rc : put_tensor(w, "output.weight", KVP_DTYPE_F16, 4, 64, &err);   /* 512 B */
    rc = rc ? rc : kvp_writer_finish(w, &err);
    rc = rc ? rc : kvp_out_commit(&out, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    kvp_writer_free(w);
    kvp_meta_free(&meta);
}

/* A KVP model file's tensors, as a GGUF's: exact bytes (scales included),
 * the format of most matrix bytes, and tying from the lm_head tensor alone
 * (decode's loader ignores kvpipe.tied_embeddings; quantize writes none). */
static void test_load_kvp_tensors(void)
{
    kvp_err err = {0};
    char path[] = "/tmp/kvp-test-capacity-kvpt-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    for (int zstd = 0; zstd <= 1; zstd++) {
        for (int lm_head = 0; lm_head <= 1; lm_head++) {
            write_model(path, lm_head, lm_head, zstd); /* the key says the opposite of the tensors */
            kvp_cap_model_file mf;
            int rc = kvp_cap_load_model(path, &mf, &err);
            CHECK_MSG(rc == 0, "%s", err.msg);
            CHECK_MSG(mf.cfg.tied_embeddings == !lm_head, "zstd %d lm_head %d: tied %d", zstd, lm_head,
                      mf.cfg.tied_embeddings);
            CHECK_EQ_U64(mf.weight_bytes, 512 + 2 * (4096 + 256) + 256 + (lm_head ? 512 : 0));
            CHECK_STR(mf.weight_type, "int8");
            CHECK_STR(mf.kind, "kvp");
        }
    }
    /* A skimmed tensor's meta is not covered by a checksum kvcalc checks:
     * a dtype damaged in place is still refused, naming the file. */
    write_model(path, 0, 0, 0);
    FILE *f = fopen(path, "r+b");
    static uint8_t file[1 << 16];
    size_t n = f ? fread(file, 1, sizeof file, f) : 0;
    const char *name = "token_embd.weight";
    uint8_t *at = NULL;
    for (size_t i = 0; i + strlen(name) + 4 <= n && !at; i++)
        if (memcmp(file + i, name, strlen(name)) == 0)
            at = file + i + strlen(name); /* the dtype (u32) follows the name */
    CHECK(at != NULL && at[0] == KVP_DTYPE_F16);
    if (f && at) {
        at[0] = 99;
        fseek(f, (long)(at - file), SEEK_SET);
        fwrite(at, 1, 1, f);
    }
    if (f)
        fclose(f);
    kvp_cap_model_file mf;
    CHECK(kvp_cap_load_model(path, &mf, &err) == KVP_EFORMAT);
    CHECK_MSG(strstr(err.msg, path) && strstr(err.msg, "unknown dtype"), "%s", err.msg);
    /* kvcalc's count then agrees with the file: the lm_head counted only when there */
    kvp_cap_params p = preset("llama-3-8b");
    kvp_cap_result tied, untied;
    p.cfg.tied_embeddings = 1;
    tied = compute(&p);
    p.cfg.tied_embeddings = 0;
    untied = compute(&p);
    CHECK_EQ_U64(untied.n_params - tied.n_params, 128256ull * 4096); /* vocab x hidden */
    unlink(path);
}

static void test_lengths_max(void)
{
    kvp_err err = {0};
    kvp_cap_lengths d;
    CHECK(kvp_cap_lengths_parse(&d, "uniform:1:100", &err) == 0);
    CHECK_EQ_U64(kvp_cap_lengths_max(&d, 4096), 100);
    CHECK_EQ_U64(kvp_cap_lengths_max(&d, 64), 64); /* clamped to the sequence length */
    CHECK(kvp_cap_lengths_parse(&d, "lognormal:6:1", &err) == 0);
    CHECK_EQ_U64(kvp_cap_lengths_max(&d, 4096), 4096);
    CHECK(kvp_cap_lengths_parse(&d, "normal:300:0", &err) == 0);
    CHECK_EQ_U64(kvp_cap_lengths_max(&d, 4096), 300);
    char path[] = "/tmp/kvp-test-capacity-len-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    FILE *f = fopen(path, "w");
    fprintf(f, "100 700\n# a comment\n300\n");
    fclose(f);
    CHECK(kvp_cap_lengths_parse(&d, path, &err) == 0);
    CHECK_EQ_U64(kvp_cap_lengths_max(&d, 4096), 700);
    kvp_cap_lengths_free(&d);
    unlink(path);
}

int main(void)
{
    test_presets();
    test_params();
    test_llama70b();
    test_kv_per_token();
    test_kv_dtypes();
    test_weight_formats();
    test_sliding();
    test_max_context();
    test_mla_moe();
    test_tp_pp();
    test_blocks_capacity();
    test_roofline();
    test_errors();
    test_presets_valid();
    test_sweep();
    test_rng();
    test_sim();
    test_load_kvp();
    test_load_gguf_cols();
    test_load_gguf_mixed_cols();
    test_load_gguf_stage_bytes();
    test_load_kvp_tensors();
    test_lengths_max();
    return unit_done();
}
