/* config.h - a model's architecture hyperparameters, whatever file they came
 * from: GGUF metadata, a KVP CONFIG record (which uses the same GGUF-style keys,
 * "general.architecture", "<arch>.block_count", ...), or an HF config.json.
 * kvcalc, quantize and the engine all read this one struct.
 */
#ifndef KVP_CONFIG_H
#define KVP_CONFIG_H

#include "error.h"
#include "meta.h"

#include <stdint.h>

enum kvp_rope_type {
    KVP_ROPE_NORM = 0, /* rotate adjacent pairs (2i, 2i+1): GGUF llama (permuted weights) */
    KVP_ROPE_NEOX = 1, /* rotate (i, i + d/2): HF safetensors, qwen2 */
};

enum kvp_rope_scaling {
    KVP_ROPE_SCALING_NONE = 0,
    KVP_ROPE_SCALING_LLAMA3 = 1, /* factor, low/high freq factor, original context */
    KVP_ROPE_SCALING_LINEAR = 2, /* positions divided by factor */
    KVP_ROPE_SCALING_OTHER = 3,  /* an HF config's yarn, dynamic, longrope, ...: kvcalc plans it; the engine
                                  * and a KVP model file refuse it */
};

typedef struct kvp_config {
    char arch[32];            /* "llama", "qwen2", "mistral", "gemma2", "deepseek2" */
    char name[128];           /* general.name, informational */
    uint32_t n_layer;
    uint32_t n_embd;          /* hidden size */
    uint32_t n_ff;            /* dense FFN width */
    uint32_t n_head;          /* query heads */
    uint32_t n_head_kv;       /* KV heads (GQA/MQA); == n_head for MHA */
    uint32_t head_dim;        /* per-head size (n_embd / n_head unless stated) */
    uint32_t n_vocab;
    uint32_t n_ctx;           /* trained context length */
    double rope_theta;
    double rms_eps;
    uint32_t rope_type;       /* kvp_rope_type */
    uint32_t rope_dim;        /* rotated dims per head (== head_dim normally) */
    uint32_t rope_scaling;    /* kvp_rope_scaling */
    double rope_factor;
    double rope_low_freq_factor, rope_high_freq_factor;
    uint32_t rope_orig_ctx;
    char rope_scaling_name[16]; /* KVP_ROPE_SCALING_OTHER: the config's rope_type, for messages */
    char hidden_act[16];      /* an HF config's hidden_act, when it names one other than silu ("gelu"); else "" */
    uint32_t sliding_window;  /* 0: none; else window for sliding layers */
    uint32_t sliding_period;  /* 0: every layer slides (Mistral); 2: every 2nd layer is global (Gemma-2) */
    uint32_t n_expert;        /* MoE: experts per layer, 0 for dense */
    uint32_t n_expert_used;   /* top-k */
    uint32_t n_ff_expert;     /* expert FFN width (0: n_ff) */
    uint32_t n_expert_shared; /* always-on shared experts */
    uint32_t n_layer_dense;   /* leading dense layers in a MoE model */
    uint32_t kv_lora_rank;    /* MLA latent size (DeepSeek: 512), 0 if not MLA */
    uint32_t rope_head_dim_mla; /* MLA decoupled rope key dims (DeepSeek: 64) */
    int tied_embeddings;      /* logits use token_embd */
    int attn_bias;            /* q/k/v projections carry biases (qwen2) */
    double n_params;          /* total parameters when known, else 0 */
} kvp_config;

/* The columns a rank's slice of the column-cut weights must be a multiple
 * of: their quantization blocks or scale groups, the largest of each kind
 * (a llama.cpp Q4_K_M file of a 576-wide model: its attention output in
 * Q5_0's 32, its FFN down projections in Q6_K's 256); 0 or 1: none. */
typedef struct kvp_col_units {
    uint32_t attn;         /* the attention output's (attn_output, o_proj) */
    uint32_t ffn;          /* the FFN down projections' (ffn_down, down_proj) */
} kvp_col_units;

void kvp_config_init(kvp_config *c);
/* From GGUF-style metadata (GGUF header or KVP CONFIG record).  source names
 * the file for messages; a missing required key is an error naming it. */
int kvp_config_from_meta(kvp_config *c, const kvp_meta *m, const char *source, kvp_err *err);
/* The inverse, for writing a KVP CONFIG record. */
int kvp_config_to_meta(const kvp_config *c, kvp_meta *m);
/* From an HF config.json (a file path, or a folder holding config.json). */
int kvp_config_from_hf(kvp_config *c, const char *path, kvp_err *err);
/* An HF folder's chat template, allocated into *out (NULL when it has
 * none): chat_template.jinja, where transformers saves it now, else
 * tokenizer_config.json's "chat_template" (a string, or a list of
 * {"name", "template"} whose "default" one).  0; 1 when
 * tokenizer_config.json is there but does not parse (err says why, *out
 * NULL: the caller says so where the template is needed); or KVP_ENOMEM /
 * KVP_EIO. */
int kvp_hf_chat_template(const char *dir, char **out, kvp_err *err);
/* The same from a config.json already parsed (lib/json.h); name is used in
 * messages.  Lets callers (and the fuzz harness) work from memory. */
struct kvp_json;
int kvp_config_from_hf_json(kvp_config *c, const struct kvp_json *j, const char *name, kvp_err *err);
/* The ceilings on what we load: far beyond any released model, low enough
 * that products of two of them fit in 64 bits with room to spare.  The one
 * definition: kvp_config_check applies them to every model file, kvcalc's
 * shape options and lib/plan take their ranges from them. */
#define KVP_CONFIG_MAX_LAYER 4096u          /* n_layer */
#define KVP_CONFIG_MAX_EMBD (1u << 20)      /* n_embd */
#define KVP_CONFIG_MAX_FF (1u << 22)        /* n_ff, n_ff_expert */
#define KVP_CONFIG_MAX_HEAD 65536u          /* n_head, n_head_kv */
#define KVP_CONFIG_MAX_HEAD_DIM 1024u       /* head_dim, given or n_embd / n_head */
#define KVP_CONFIG_MAX_VOCAB (1u << 24)     /* n_vocab */
#define KVP_CONFIG_MAX_EXPERT 65536u        /* n_expert (0: dense), so n_expert_used too */
#define KVP_CONFIG_MAX_LORA_RANK 65536u     /* MLA: kv_lora_rank (0: not MLA), q_lora_rank (0: none) */
#define KVP_CONFIG_MAX_ROPE_DIM_MLA 65536u  /* MLA: rope_head_dim_mla, the decoupled RoPE key */

/* What every model config must satisfy, whoever reads it (the loader and
 * quantize both call this through kvp_model_check): no zero dimension (a
 * dense model needs its feed-forward width, a MoE one that or the experts'),
 * every dimension under its KVP_CONFIG_MAX_* ceiling (so sizes computed from
 * them stay far from overflow), then kvp_config_check_shape's relations
 * between them.  0, or
 * KVP_EFORMAT / KVP_ELIMIT with "SOURCE: config: ..." naming the field:
 * "m.gguf: config: 2147483648 layers (want 1..4096)". */
int kvp_config_check(const kvp_config *c, const char *source, kvp_err *err);
/* The relations between dimensions that kvp_config_check enforces after
 * its ranges: query heads a multiple of KV heads, no more experts used a
 * token than there are, a hidden size that the heads divide when no head dim
 * is given and whose share of a head is within KVP_CONFIG_MAX_HEAD_DIM,
 * RoPE dims even and within the head (MLA's decoupled key aside).
 * A dimension left 0 is one not given and is not related to the others, so
 * kvcalc applies the same rules to a shape its options build or change.
 * 0, or KVP_EFORMAT / KVP_ELIMIT with "SOURCE: config: ...". */
int kvp_config_check_shape(const kvp_config *c, const char *source, kvp_err *err);

/* The two real numbers every layer uses: the RMS-norm epsilon, finite in
 * (0, 1), and the RoPE base, finite above 1 (a NaN epsilon or a negative
 * base makes every activation NaN, and decode would print garbage and exit
 * 0).  eps_key and base_key name them as the source spells them.  0, or
 * KVP_EFORMAT: "m.gguf: metadata llama.rope.freq_base: -1 is out of range
 * (want a finite number above 1)". */
int kvp_config_check_reals(const kvp_config *c, const char *source, const char *eps_key, const char *base_key,
                           kvp_err *err);
/* The longest sequence the engine runs as the model was trained to: its
 * context, or a sliding window below it (Mistral-7B-v0.1's 4,096 of
 * 32,768; the engine attends over every position, which is the window's
 * attention only while a sequence fits in it); 0 when neither is known. */
uint32_t kvp_config_ctx_limit(const kvp_config *c);
/* KV elements per token per layer for full attention (2 x n_head_kv x head_dim,
 * or kv_lora_rank + rope_head_dim_mla for MLA). */
uint64_t kvp_config_kv_elems_per_token_layer(const kvp_config *c);

#endif
