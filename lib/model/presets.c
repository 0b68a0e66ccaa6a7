/* presets.c - the model and GPU tables behind kvcalc --model / --gpu.
 *
 * Model numbers are the published config.json values (FACTS.md "Presets");
 * each row's parameter count, computed by kvp_cap_param_count, is checked
 * against the published figure in tests/unit/test_capacity.c.
 */
#include "presets.h"

#include <ctype.h>
#include <string.h>

#define MIB(x) ((uint64_t)(x) * 1024u * 1024u)

/* The fields every row sets; rms_eps and rope_dim follow per row. */
#define LLAMA_LIKE(arch_, layers, embd, ff, heads, kv, hd, vocab, ctx, theta)                     \
    .arch = arch_, .n_layer = (layers), .n_embd = (embd), .n_ff = (ff), .n_head = (heads),        \
    .n_head_kv = (kv), .head_dim = (hd), .n_vocab = (vocab), .n_ctx = (ctx), .rope_theta = (theta)

static const kvp_model_preset models[] = {
    {"smollm2-135m", "SmolLM2-135M(-Instruct): 30 layers, GQA 9/3, tied embeddings",
     {LLAMA_LIKE("llama", 30, 576, 1536, 9, 3, 64, 49152, 8192, 100000.0), .rope_dim = 64, .rms_eps = 1e-5, .name = "SmolLM2-135M",
      .tied_embeddings = 1},
     0},
    {"llama-2-7b", "Llama-2-7B: 32 layers, MHA 32/32 (no GQA)",
     {LLAMA_LIKE("llama", 32, 4096, 11008, 32, 32, 128, 32000, 4096, 10000.0), .rope_dim = 128, .rms_eps = 1e-5, .name = "Llama-2-7B"},
     0},
    {"llama-3-8b", "Llama-3-8B: 32 layers, GQA 32/8, 8k context",
     {LLAMA_LIKE("llama", 32, 4096, 14336, 32, 8, 128, 128256, 8192, 500000.0), .rope_dim = 128, .rms_eps = 1e-5, .name = "Llama-3-8B"},
     0},
    {"llama-3-70b", "Llama-3-70B: 80 layers, GQA 64/8, 8k context",
     {LLAMA_LIKE("llama", 80, 8192, 28672, 64, 8, 128, 128256, 8192, 500000.0), .rope_dim = 128, .rms_eps = 1e-5, .name = "Llama-3-70B"},
     0},
    {"llama-3.1-8b", "Llama-3.1-8B: as Llama-3-8B with 128k context (llama3 RoPE scaling)",
     {LLAMA_LIKE("llama", 32, 4096, 14336, 32, 8, 128, 128256, 131072, 500000.0), .rope_dim = 128, .rms_eps = 1e-5, .name = "Llama-3.1-8B",
      .rope_scaling = KVP_ROPE_SCALING_LLAMA3, .rope_factor = 8, .rope_low_freq_factor = 1,
      .rope_high_freq_factor = 4, .rope_orig_ctx = 8192},
     0},
    {"llama-3.1-70b", "Llama-3.1-70B: as Llama-3-70B with 128k context",
     {LLAMA_LIKE("llama", 80, 8192, 28672, 64, 8, 128, 128256, 131072, 500000.0), .rope_dim = 128, .rms_eps = 1e-5, .name = "Llama-3.1-70B",
      .rope_scaling = KVP_ROPE_SCALING_LLAMA3, .rope_factor = 8, .rope_low_freq_factor = 1,
      .rope_high_freq_factor = 4, .rope_orig_ctx = 8192},
     0},
    {"llama-3.1-405b", "Llama-3.1-405B: 126 layers, GQA 128/8, 128k context",
     {LLAMA_LIKE("llama", 126, 16384, 53248, 128, 8, 128, 128256, 131072, 500000.0),
      .name = "Llama-3.1-405B", .rope_dim = 128, .rms_eps = 1e-5, .rope_scaling = KVP_ROPE_SCALING_LLAMA3, .rope_factor = 8,
      .rope_low_freq_factor = 1, .rope_high_freq_factor = 4, .rope_orig_ctx = 8192},
     0},
    {"mistral-7b", "Mistral-7B v0.1: 32 layers, GQA 32/8, sliding window 4096 on every layer",
     {LLAMA_LIKE("llama", 32, 4096, 14336, 32, 8, 128, 32000, 32768, 10000.0), .rope_dim = 128, .rms_eps = 1e-5, .name = "Mistral-7B-v0.1",
      .sliding_window = 4096},
     0},
    {"mixtral-8x7b", "Mixtral-8x7B: 32 layers, GQA 32/8, 8 experts top-2",
     {LLAMA_LIKE("llama", 32, 4096, 14336, 32, 8, 128, 32000, 32768, 1000000.0), .rope_dim = 128, .rms_eps = 1e-5, .name = "Mixtral-8x7B",
      .n_expert = 8, .n_expert_used = 2, .n_ff_expert = 14336},
     0},
    {"qwen2.5-7b", "Qwen2.5-7B: 28 layers, GQA 28/4, QKV bias",
     {LLAMA_LIKE("qwen2", 28, 3584, 18944, 28, 4, 128, 152064, 32768, 1000000.0), .rope_dim = 128, .name = "Qwen2.5-7B",
      .rms_eps = 1e-6, .rope_type = KVP_ROPE_NEOX, .attn_bias = 1},
     0},
    {"qwen2.5-72b", "Qwen2.5-72B: 80 layers, GQA 64/8, QKV bias",
     {LLAMA_LIKE("qwen2", 80, 8192, 29568, 64, 8, 128, 152064, 32768, 1000000.0), .rope_dim = 128, .name = "Qwen2.5-72B",
      .rms_eps = 1e-6, .rope_type = KVP_ROPE_NEOX, .attn_bias = 1},
     0},
    {"gemma-2-9b", "Gemma-2-9B: 42 layers, GQA 16/8, head 256, every 2nd layer a 4096 window",
     {LLAMA_LIKE("gemma2", 42, 3584, 14336, 16, 8, 256, 256000, 8192, 10000.0), .rope_dim = 256, .name = "Gemma-2-9B",
      .rms_eps = 1e-6, .rope_type = KVP_ROPE_NEOX, .sliding_window = 4096, .sliding_period = 2,
      .tied_embeddings = 1},
     0},
    {"deepseek-v3", "DeepSeek-V3: 61 layers, MLA (latent 512 + rope 64), 256 experts top-8 + 1 shared",
     {LLAMA_LIKE("deepseek2", 61, 7168, 18432, 128, 128, 192, 129280, 163840, 10000.0),
      .name = "DeepSeek-V3", .rms_eps = 1e-6, .rope_dim = 64, .n_expert = 256, .n_expert_used = 8,
      .n_ff_expert = 2048, .n_expert_shared = 1, .n_layer_dense = 3, .kv_lora_rank = 512,
      .rope_head_dim_mla = 64},
     1536},
};

/* Memory totals are what nvidia-smi / cudaMemGetInfo report (the physical
 * size less what the driver reserves), since that is what gpu-util
 * multiplies in vLLM.  Rows marked (check) are from the datasheet, not from a
 * device we measured. */
static const kvp_gpu_preset gpus[] = {
    {"h100-sxm", "h100 h100-80 h100-sxm5", "H100 SXM 80GB HBM3", MIB(81559), 3.35e12, 989, 1979, 900e9},
    {"h100-pcie", "h100-pcie-80", "H100 PCIe 80GB HBM2e", MIB(81559), 2.0e12, 756, 1513, 128e9},
    {"h100-nvl", "", "H100 NVL 94GB HBM3 (check)", MIB(95830), 3.9e12, 835, 1671, 600e9},
    {"h200", "h200-sxm h200-141", "H200 SXM 141GB HBM3e", MIB(143771), 4.8e12, 989, 1979, 900e9},
    {"a100-80", "a100 a100-sxm a100-80gb", "A100 SXM 80GB HBM2e", MIB(81920), 2.039e12, 312, 0, 600e9},
    {"a100-40", "a100-40gb", "A100 SXM 40GB HBM2", MIB(40960), 1.555e12, 312, 0, 600e9},
    {"l40s", "", "L40S 48GB GDDR6", MIB(46068), 0.864e12, 362, 733, 64e9},
    {"l4", "", "L4 24GB GDDR6", MIB(23034), 0.3e12, 121, 242, 64e9},
    {"rtx-4090", "4090 rtx4090", "GeForce RTX 4090 24GB GDDR6X", MIB(24564), 1.008e12, 165, 330, 64e9},
    {"b200", "b200-sxm", "B200 180GB HBM3e (check)", MIB(183359), 8.0e12, 2250, 4500, 1800e9},
    {"mi300x", "", "AMD MI300X 192GB HBM3 (check)", MIB(196608), 5.3e12, 1307, 2615, 896e9},
};

static int skip_char(int c) { return c == '-' || c == '_' || c == '.' || c == ' '; }

int kvp_preset_name_eq(const char *a, const char *b)
{
    for (;;) {
        while (*a && skip_char((unsigned char)*a))
            a++;
        while (*b && skip_char((unsigned char)*b))
            b++;
        if (!*a || !*b)
            return !*a && !*b;
        if (tolower((unsigned char)*a) != tolower((unsigned char)*b))
            return 0;
        a++;
        b++;
    }
}

size_t kvp_preset_model_count(void) { return sizeof models / sizeof models[0]; }

const kvp_model_preset *kvp_preset_model_at(size_t i)
{
    return i < kvp_preset_model_count() ? &models[i] : NULL;
}

const kvp_model_preset *kvp_preset_model_find(const char *name)
{
    for (size_t i = 0; i < kvp_preset_model_count(); i++)
        if (kvp_preset_name_eq(models[i].name, name))
            return &models[i];
    return NULL;
}

size_t kvp_preset_gpu_count(void) { return sizeof gpus / sizeof gpus[0]; }

const kvp_gpu_preset *kvp_preset_gpu_at(size_t i)
{
    return i < kvp_preset_gpu_count() ? &gpus[i] : NULL;
}

/* Does the space-separated list hold name? */
static int alias_match(const char *list, const char *name)
{
    char word[64];
    while (*list) {
        while (*list == ' ')
            list++;
        size_t n = strcspn(list, " ");
        if (n && n < sizeof word) {
            memcpy(word, list, n);
            word[n] = '\0';
            if (kvp_preset_name_eq(word, name))
                return 1;
        }
        list += n;
    }
    return 0;
}

const kvp_gpu_preset *kvp_preset_gpu_find(const char *name)
{
    for (size_t i = 0; i < kvp_preset_gpu_count(); i++)
        if (kvp_preset_name_eq(gpus[i].name, name) || alias_match(gpus[i].aliases, name))
            return &gpus[i];
    return NULL;
}
