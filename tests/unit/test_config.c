/* test_config.c - model configs from GGUF-style metadata, back to metadata
 * (round trip), from HF config.json files, and from the real SmolLM2 GGUF
 * when the cache holds it. */
#include "config.h"
#include "gguf.h"
#include "model.h"
#include "unit.h"

#include <math.h>
#include <stdlib.h>
#include <unistd.h>

static void smollm_meta(kvp_meta *m)
{
    kvp_meta_init(m);
    kvp_meta_set_str(m, "general.architecture", "llama", 5);
    kvp_meta_set_str(m, "general.name", "SmolLM2 135M", 12);
    kvp_meta_set_u64(m, "llama.block_count", 30);
    kvp_meta_set_u64(m, "llama.embedding_length", 576);
    kvp_meta_set_u64(m, "llama.feed_forward_length", 1536);
    kvp_meta_set_u64(m, "llama.attention.head_count", 9);
    kvp_meta_set_u64(m, "llama.attention.head_count_kv", 3);
    kvp_meta_set_u64(m, "llama.rope.dimension_count", 64);
    kvp_meta_set_u64(m, "llama.context_length", 8192);
    kvp_meta_set_f64(m, "llama.rope.freq_base", 100000.0);
    kvp_meta_set_f64(m, "llama.attention.layer_norm_rms_epsilon", 1e-5);
    const char *toks[4] = {"a", "b", "c", "d"};
    size_t lens[4] = {1, 1, 1, 1};
    kvp_meta_set_strarr(m, "tokenizer.ggml.tokens", toks, lens, 4);
}

static void check_smollm(const kvp_config *c, uint32_t vocab)
{
    CHECK_STR(c->arch, "llama");
    CHECK_EQ_U64(c->n_layer, 30);
    CHECK_EQ_U64(c->n_embd, 576);
    CHECK_EQ_U64(c->n_ff, 1536);
    CHECK_EQ_U64(c->n_head, 9);
    CHECK_EQ_U64(c->n_head_kv, 3);
    CHECK_EQ_U64(c->head_dim, 64);
    CHECK_EQ_U64(c->rope_dim, 64);
    CHECK_EQ_U64(c->n_vocab, vocab);
    CHECK_EQ_U64(c->n_ctx, 8192);
    CHECK_NEAR(c->rope_theta, 100000.0, 0);
    CHECK_NEAR(c->rms_eps, 1e-5, 1e-12);
    CHECK_EQ_U64(c->rope_type, KVP_ROPE_NORM);
    CHECK_EQ_U64(kvp_config_kv_elems_per_token_layer(c), 384);
}

static void test_from_meta(void)
{
    kvp_meta m;
    smollm_meta(&m);
    kvp_config c;
    kvp_err err = {0};
    int rc = kvp_config_from_meta(&c, &m, "x.gguf", &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    check_smollm(&c, 4);
    CHECK_STR(c.name, "SmolLM2 135M");
    CHECK_EQ_U64(c.n_expert, 0);
    CHECK_EQ_U64(c.rope_scaling, KVP_ROPE_SCALING_NONE);

    /* Round trip through a KVP CONFIG-style meta, including the encoding. */
    c.tied_embeddings = 1;
    c.rope_scaling = KVP_ROPE_SCALING_LLAMA3;
    c.rope_factor = 8;
    c.rope_low_freq_factor = 1;
    c.rope_high_freq_factor = 4;
    c.rope_orig_ctx = 8192;
    c.sliding_window = 4096;
    c.sliding_period = 2;
    c.n_params = 134515008;
    kvp_meta out;
    kvp_meta_init(&out);
    CHECK(kvp_config_to_meta(&c, &out) == 0);
    kvp_buf b;
    kvp_buf_init(&b);
    CHECK(kvp_meta_encode(&out, &b) == 0);
    kvp_meta back;
    CHECK(kvp_meta_decode(&back, b.data, b.len, &err) == 0);
    kvp_config d;
    rc = kvp_config_from_meta(&d, &back, "rec", &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    CHECK_MSG(memcmp(&c, &d, sizeof c) == 0, "config differs after the round trip");
    kvp_meta_free(&back);
    kvp_meta_free(&out);
    kvp_buf_free(&b);

    /* An MoE + MLA config round-trips too. */
    kvp_config_init(&c);
    strcpy(c.arch, "deepseek2");
    c.n_layer = 61, c.n_embd = 7168, c.n_ff = 18432, c.n_head = 128, c.n_head_kv = 128, c.head_dim = 192;
    c.n_vocab = 129280, c.n_ctx = 163840, c.rope_dim = 64, c.rope_head_dim_mla = 64, c.kv_lora_rank = 512;
    c.n_expert = 256, c.n_expert_used = 8, c.n_ff_expert = 2048, c.n_expert_shared = 1, c.n_layer_dense = 3;
    kvp_meta_init(&out);
    CHECK(kvp_config_to_meta(&c, &out) == 0);
    rc = kvp_config_from_meta(&d, &out, "rec", &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    CHECK_MSG(memcmp(&c, &d, sizeof c) == 0, "MLA config differs after the round trip");
    CHECK_EQ_U64(kvp_config_kv_elems_per_token_layer(&d), 576);
    kvp_meta_free(&out);

    /* vocab_size wins over the token count; qwen2 is NeoX with biases. */
    kvp_meta_set_u64(&m, "llama.vocab_size", 49152);
    CHECK(kvp_config_from_meta(&c, &m, "x.gguf", &err) == 0 && c.n_vocab == 49152);
    kvp_meta q;
    kvp_meta_init(&q);
    kvp_meta_set_str(&q, "general.architecture", "qwen2", 5);
    kvp_meta_set_u64(&q, "qwen2.block_count", 28);
    kvp_meta_set_u64(&q, "qwen2.embedding_length", 3584);
    kvp_meta_set_u64(&q, "qwen2.attention.head_count", 28);
    kvp_meta_set_u64(&q, "qwen2.attention.head_count_kv", 4);
    kvp_meta_set_u64(&q, "qwen2.vocab_size", 152064);
    CHECK(kvp_config_from_meta(&c, &q, "q.gguf", &err) == 0);
    CHECK(c.rope_type == KVP_ROPE_NEOX && c.attn_bias == 1 && c.head_dim == 128 && c.rope_dim == 128);
    CHECK(c.n_head_kv == 4 && c.rope_theta == 10000.0);
    kvp_meta_free(&q);

    /* Errors name the key. */
    kvp_meta_set_u64(&m, "llama.attention.head_count_kv", 4);
    CHECK(kvp_config_from_meta(&c, &m, "x.gguf", &err) == KVP_EFORMAT);
    CHECK_MSG(strstr(err.msg, "x.gguf: metadata llama.attention.head_count_kv") != NULL, "%s", err.msg);
    kvp_meta_set_u64(&m, "llama.attention.head_count_kv", 3);
    kvp_meta_set_str(&m, "llama.block_count", "30", 2);
    CHECK(kvp_config_from_meta(&c, &m, "x.gguf", &err) == KVP_EFORMAT);
    CHECK(strstr(err.msg, "llama.block_count") != NULL);
    kvp_meta_set_i64(&m, "llama.block_count", -1);
    CHECK(kvp_config_from_meta(&c, &m, "x.gguf", &err) == KVP_EFORMAT);
    kvp_meta_free(&m);
    kvp_meta_init(&m);
    kvp_meta_set_str(&m, "general.architecture", "llama", 5);
    CHECK(kvp_config_from_meta(&c, &m, "x.gguf", &err) == KVP_ENOTFOUND);
    CHECK(strstr(err.msg, "llama.block_count") != NULL);
    kvp_meta_free(&m);
    kvp_meta_init(&m);
    CHECK(kvp_config_from_meta(&c, &m, "x.gguf", &err) == KVP_ENOTFOUND);
    CHECK(strstr(err.msg, "general.architecture") != NULL);
    kvp_meta_free(&m);
}

static int hf(const char *json, kvp_config *c, kvp_err *err)
{
    char dir[] = "/tmp/kvp_test_config_XXXXXX";
    if (!mkdtemp(dir))
        return -100;
    char path[128];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    fputs(json, f);
    fclose(f);
    int rc = kvp_config_from_hf(c, dir, err); /* the folder form */
    kvp_config c2;
    kvp_err e2;
    int rc2 = kvp_config_from_hf(&c2, path, &e2); /* the file form */
    if (rc != rc2 || (rc == 0 && memcmp(c, &c2, sizeof c2) != 0))
        rc = -101;
    unlink(path);
    rmdir(dir);
    return rc;
}

static void test_from_hf(void)
{
    kvp_config c;
    kvp_err err = {0};
    int rc = hf("{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"hidden_size\":4096,"
                "\"intermediate_size\":14336,\"num_attention_heads\":32,\"num_hidden_layers\":32,"
                "\"num_key_value_heads\":8,\"vocab_size\":128256,\"max_position_embeddings\":131072,"
                "\"rope_theta\":500000.0,\"rms_norm_eps\":1e-05,\"tie_word_embeddings\":false,"
                "\"rope_scaling\":{\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                "\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"},\"torch_dtype\":\"bfloat16\"}",
                &c, &err);
    CHECK_MSG(rc == 0, "%d %s", rc, err.msg);
    CHECK_STR(c.arch, "llama");
    CHECK(c.n_layer == 32 && c.n_embd == 4096 && c.n_ff == 14336 && c.n_head == 32 && c.n_head_kv == 8);
    CHECK(c.head_dim == 128 && c.rope_dim == 128 && c.n_vocab == 128256 && c.n_ctx == 131072);
    CHECK(c.rope_theta == 500000.0 && c.rms_eps == 1e-5 && c.rope_type == KVP_ROPE_NEOX);
    CHECK(c.rope_scaling == KVP_ROPE_SCALING_LLAMA3 && c.rope_factor == 8 && c.rope_low_freq_factor == 1);
    CHECK(c.rope_high_freq_factor == 4 && c.rope_orig_ctx == 8192 && c.tied_embeddings == 0);
    CHECK_EQ_U64(kvp_config_kv_elems_per_token_layer(&c), 2048);

    rc = hf("{\"model_type\":\"mixtral\",\"hidden_size\":4096,\"intermediate_size\":14336,\"num_attention_heads\":32,"
            "\"num_hidden_layers\":32,\"num_key_value_heads\":8,\"vocab_size\":32000,\"num_local_experts\":8,"
            "\"num_experts_per_tok\":2,\"sliding_window\":null,\"rope_theta\":1e6}",
            &c, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    CHECK(c.n_expert == 8 && c.n_expert_used == 2 && c.sliding_window == 0 && c.rms_eps == 1e-6);

    rc = hf("{\"model_type\":\"qwen2\",\"hidden_size\":3584,\"intermediate_size\":18944,\"num_attention_heads\":28,"
            "\"num_hidden_layers\":28,\"num_key_value_heads\":4,\"vocab_size\":152064,\"sliding_window\":131072,"
            "\"use_sliding_window\":false,\"tie_word_embeddings\":false}",
            &c, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    CHECK(c.sliding_window == 0 && c.attn_bias == 1 && c.head_dim == 128);

    rc = hf("{\"model_type\":\"gemma2\",\"hidden_size\":3584,\"intermediate_size\":14336,\"num_attention_heads\":16,"
            "\"num_hidden_layers\":42,\"num_key_value_heads\":8,\"head_dim\":256,\"vocab_size\":256000,"
            "\"sliding_window\":4096}",
            &c, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    CHECK(c.head_dim == 256 && c.sliding_window == 4096 && c.sliding_period == 2 && c.tied_embeddings == 1);

    rc = hf("{\"model_type\":\"deepseek_v3\",\"hidden_size\":7168,\"intermediate_size\":18432,"
            "\"num_attention_heads\":128,\"num_hidden_layers\":61,\"num_key_value_heads\":128,\"vocab_size\":129280,"
            "\"kv_lora_rank\":512,\"qk_rope_head_dim\":64,\"qk_nope_head_dim\":128,\"v_head_dim\":128,"
            "\"n_routed_experts\":256,\"num_experts_per_tok\":8,\"n_shared_experts\":1,\"moe_intermediate_size\":2048,"
            "\"first_k_dense_replace\":3,\"rope_scaling\":{\"type\":\"yarn\",\"factor\":40}}",
            &c, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    CHECK_STR(c.arch, "deepseek2");
    CHECK(c.kv_lora_rank == 512 && c.rope_head_dim_mla == 64 && c.head_dim == 192 && c.n_expert == 256);
    CHECK(c.n_expert_used == 8 && c.n_expert_shared == 1 && c.n_ff_expert == 2048 && c.n_layer_dense == 3);
    CHECK_EQ_U64(kvp_config_kv_elems_per_token_layer(&c), 576);

    /* Errors name the file and key. */
    rc = hf("{\"model_type\":\"llama\",\"hidden_size\":4096,\"num_attention_heads\":32}", &c, &err);
    CHECK(rc == KVP_ENOTFOUND && strstr(err.msg, "num_hidden_layers") && strstr(err.msg, "config.json"));
    rc = hf("{\"model_type\":\"llama\",\"hidden_size\":-4,\"num_attention_heads\":32,\"num_hidden_layers\":2}", &c,
            &err);
    CHECK(rc == KVP_EFORMAT && strstr(err.msg, "hidden_size"));
    rc = hf("{\"model_type\":\"llama\",\"hidden_size\":64,\"num_attention_heads\":6,\"num_key_value_heads\":4,"
            "\"num_hidden_layers\":2}", &c, &err);
    CHECK(rc == KVP_EFORMAT && strstr(err.msg, "num_key_value_heads"));
    rc = hf("{\"model_type\":\"llama\",", &c, &err);
    CHECK(rc == KVP_EFORMAT && strstr(err.msg, "config.json:1:"));
    rc = hf("[]", &c, &err);
    CHECK(rc == KVP_EFORMAT);
    rc = kvp_config_from_hf(&c, "/nonexistent/dir", &err);
    CHECK(rc < 0 && strstr(err.msg, "/nonexistent/dir"));
}

static void test_real_model(void)
{
    const char *path = unit_model_path();
    if (access(path, R_OK) != 0) {
        printf("note: %s absent, real-model checks skipped (scripts/fetch-model makes it present)\n", path);
        return;
    }
    kvp_gguf g;
    kvp_err err = {0};
    int rc = kvp_gguf_open(&g, path, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc)
        return;
    kvp_config c;
    rc = kvp_config_from_meta(&c, &g.meta, path, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    check_smollm(&c, 49152);
    kvp_gguf_close(&g);
}

/* kvp_config_check: what every model passes, each refusal naming the field. */
static void test_check(void)
{
    kvp_meta m;
    smollm_meta(&m);
    kvp_config c, d;
    kvp_err err = {0};
    CHECK(kvp_config_from_meta(&c, &m, "x.gguf", &err) == 0);
    CHECK_MSG(kvp_config_check(&c, "x.gguf", &err) == 0, "%s", err.msg);
    d = c, d.n_layer = 1u << 31;
    CHECK(kvp_config_check(&d, "x.gguf", &err) == KVP_ELIMIT);
    CHECK_STR(err.msg, "x.gguf: config: 2147483648 layers (want 1..4096)");
    d = c, d.n_layer = 4096;
    CHECK(kvp_config_check(&d, "x.gguf", &err) == 0);
    d = c, d.n_ff = 0;
    CHECK(kvp_config_check(&d, "x.gguf", &err) == KVP_EFORMAT);
    CHECK_STR(err.msg, "x.gguf: config: 0 feed-forward width (want 1..4194304)");
    d.n_expert = 8, d.n_expert_used = 2, d.n_ff_expert = 1024; /* experts only: their width counts */
    CHECK_MSG(kvp_config_check(&d, "x.gguf", &err) == 0, "%s", err.msg);
    d = c, d.n_expert = 8, d.n_ff_expert = 1u << 23;
    CHECK(kvp_config_check(&d, "x.gguf", &err) == KVP_ELIMIT && strstr(err.msg, "expert feed-forward width"));
    d = c, d.n_vocab = 0;
    CHECK(kvp_config_check(&d, "x.gguf", &err) == KVP_EFORMAT && strstr(err.msg, "0 vocabulary"));
    d = c, d.n_vocab = (1u << 24) + 1;
    CHECK(kvp_config_check(&d, "x.gguf", &err) == KVP_ELIMIT && strstr(err.msg, "vocabulary"));
    d = c, d.head_dim = 2048, d.rope_dim = 64;
    CHECK(kvp_config_check(&d, "x.gguf", &err) == KVP_ELIMIT && strstr(err.msg, "2048 head dim"));
    d = c, d.n_head_kv = 2;
    CHECK(kvp_config_check(&d, "x.gguf", &err) == KVP_EFORMAT);
    CHECK_STR(err.msg, "x.gguf: config: 9 heads are not a multiple of 2 KV heads");
    d = c, d.rope_dim = 63;
    CHECK(kvp_config_check(&d, "x.gguf", &err) == KVP_EFORMAT && strstr(err.msg, "rope dimension 63"));
    d = c, d.rope_dim = 128;
    CHECK(kvp_config_check(&d, "x.gguf", &err) == KVP_EFORMAT);
    d.kv_lora_rank = 512; /* MLA's decoupled RoPE key may be wider than a head */
    CHECK(kvp_config_check(&d, "x.gguf", &err) == 0);
    /* MLA's sizes have the planner's ceilings (kvcalc refused what loaded) */
    d.kv_lora_rank = KVP_CONFIG_MAX_LORA_RANK;
    CHECK_MSG(kvp_config_check(&d, "x.gguf", &err) == 0, "%s", err.msg);
    d.kv_lora_rank = KVP_CONFIG_MAX_LORA_RANK + 1;
    CHECK(kvp_config_check(&d, "x.gguf", &err) == KVP_ELIMIT);
    CHECK_STR(err.msg, "x.gguf: config: 65537 MLA latent rank (kv_lora_rank; want 0..65536)");
    d.kv_lora_rank = 512, d.rope_dim = d.rope_head_dim_mla = KVP_CONFIG_MAX_ROPE_DIM_MLA + 2;
    CHECK(kvp_config_check(&d, "x.gguf", &err) == KVP_ELIMIT);
    CHECK_STR(err.msg, "x.gguf: config: 65538 MLA RoPE key dims (rope dimension; want 0..65536)");
    d = c, d.n_expert = 8, d.n_expert_used = 9, d.n_ff_expert = 1024;
    CHECK(kvp_config_check(&d, "x.gguf", &err) == KVP_EFORMAT);
    CHECK_STR(err.msg, "x.gguf: config: 9 experts used a token, more than the 8 experts");
    d.n_expert_used = 0; /* experts that no token goes to */
    CHECK(kvp_config_check(&d, "x.gguf", &err) == KVP_EFORMAT);
    CHECK_STR(err.msg, "x.gguf: config: 8 experts, but none used a token");
    d.n_expert = 0; /* dense: no experts, none used */
    CHECK(kvp_config_check(&d, "x.gguf", &err) == 0);
    /* the expert count has a ceiling like every dimension (kvcalc's --experts
     * range is the same); it was unbounded, and kvcalc called such a file's
     * count a usage error */
    d = c, d.n_expert = KVP_CONFIG_MAX_EXPERT, d.n_expert_used = 2, d.n_ff_expert = 1024;
    CHECK_MSG(kvp_config_check(&d, "x.gguf", &err) == 0, "%s", err.msg);
    d.n_expert = KVP_CONFIG_MAX_EXPERT + 1;
    CHECK(kvp_config_check(&d, "x.gguf", &err) == KVP_ELIMIT);
    CHECK_STR(err.msg, "x.gguf: config: 65537 experts (want 0..65536)");
    kvp_meta_free(&m);
}

/* kvp_config_check_shape alone, as kvcalc applies it to a shape built from
 * options: a dimension left 0 is not known and relates to nothing. */
static void test_check_shape(void)
{
    kvp_config c;
    kvp_err err = {0};
    kvp_config_init(&c);
    c.n_layer = 2, c.n_embd = 64, c.n_head = 4, c.n_head_kv = 4; /* no FFN, vocabulary or head dim */
    CHECK_MSG(kvp_config_check_shape(&c, "opts", &err) == 0, "%s", err.msg);
    c.n_head_kv = 3;
    CHECK(kvp_config_check_shape(&c, "opts", &err) == KVP_EFORMAT);
    CHECK_STR(err.msg, "opts: config: 4 heads are not a multiple of 3 KV heads");
    c.n_head_kv = 0; /* MLA: no KV heads */
    CHECK(kvp_config_check_shape(&c, "opts", &err) == 0);
    c.n_head_kv = 1, c.n_head = 3;
    CHECK(kvp_config_check_shape(&c, "opts", &err) == KVP_EFORMAT);
    CHECK_STR(err.msg, "opts: config: hidden size 64 is not a multiple of 3 heads (and no head dim is given)");
    c.head_dim = 16; /* a head dim given: the heads need not divide the hidden size */
    CHECK_MSG(kvp_config_check_shape(&c, "opts", &err) == 0, "%s", err.msg);
    c.rope_dim = 32;
    CHECK(kvp_config_check_shape(&c, "opts", &err) == KVP_EFORMAT && strstr(err.msg, "rope dimension 32"));
    c.rope_dim = 0, c.n_expert_used = 2;
    CHECK(kvp_config_check_shape(&c, "opts", &err) == KVP_EFORMAT && strstr(err.msg, "more than the 0 experts"));
    /* no head dim given: the hidden size's share of a head is held to the
     * head dim's ceiling, as a file's is (it states it, or the reader
     * computes it) */
    c.n_expert_used = 0, c.head_dim = 0, c.n_embd = 65536, c.n_head = c.n_head_kv = 64;
    CHECK_MSG(kvp_config_check_shape(&c, "opts", &err) == 0, "%s", err.msg);
    c.n_head = c.n_head_kv = 2;
    CHECK(kvp_config_check_shape(&c, "opts", &err) == KVP_ELIMIT);
    CHECK_STR(err.msg, "opts: config: hidden size 65536 over 2 heads is a head dim of 32768 (want 1..1024)");
}

/* The RMS-norm epsilon and the RoPE base: a NaN or infinite value, an
 * epsilon outside (0, 1) or a base not above 1 is refused naming the file
 * and the key, from GGUF/KVP metadata and from a config.json alike. */
static void test_reals(void)
{
    static const struct {
        const char *key;
        double v;
        const char *want;
    } bad[] = {
        {"llama.attention.layer_norm_rms_epsilon", NAN,
         "metadata llama.attention.layer_norm_rms_epsilon: nan is not a finite number"},
        {"llama.attention.layer_norm_rms_epsilon", 0,
         "metadata llama.attention.layer_norm_rms_epsilon: 0 is out of range (want a finite number in (0, 1))"},
        {"llama.attention.layer_norm_rms_epsilon", -1e-5, "layer_norm_rms_epsilon: -1e-05 is out of range"},
        {"llama.rope.freq_base", -1,
         "metadata llama.rope.freq_base: -1 is out of range (want a finite number above 1)"},
        {"llama.rope.freq_base", INFINITY, "metadata llama.rope.freq_base: inf is not a finite number"},
        {"llama.rope.freq_base", 0.5, "llama.rope.freq_base: 0.5 is out of range"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        kvp_meta m;
        smollm_meta(&m);
        kvp_meta_set_f64(&m, bad[k].key, bad[k].v);
        kvp_config c;
        kvp_err err = {0};
        CHECK_MSG(kvp_config_from_meta(&c, &m, "x.gguf", &err) == KVP_EFORMAT, "case %zu", k);
        CHECK_MSG(strncmp(err.msg, "x.gguf: ", 8) == 0 && strstr(err.msg, bad[k].want), "%s", err.msg);
        kvp_meta_free(&m);
    }
    static const char *const hf_bad[][2] = {
        {"\"rms_norm_eps\":-1e-5", "config.json: rms_norm_eps: -1e-05 is out of range"},
        {"\"rms_norm_eps\":2", "config.json: rms_norm_eps: 2 is out of range"},
        {"\"rope_theta\":-1", "config.json: rope_theta: -1 is out of range (want a finite number above 1)"},
    };
    for (size_t k = 0; k < sizeof hf_bad / sizeof *hf_bad; k++) {
        char json[512];
        snprintf(json, sizeof json,
                 "{\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":128,"
                 "\"num_attention_heads\":4,"
                 "\"num_hidden_layers\":2,\"vocab_size\":100,%s}", hf_bad[k][0]);
        kvp_config c;
        kvp_err err = {0};
        CHECK_MSG(hf(json, &c, &err) == KVP_EFORMAT, "%s", hf_bad[k][0]);
        CHECK_MSG(strstr(err.msg, hf_bad[k][1]) != NULL, "%s", err.msg);
    }
}

/* The engine attends over every position: a sliding window below the
 * context holds sequences to it (Mistral-7B-v0.1: 4,096 of 32,768, where
 * full attention past the window gave other tokens than HF's). */
static void test_ctx_limit(void)
{
    kvp_config c = {0};
    CHECK_EQ_U64(kvp_config_ctx_limit(&c), 0); /* neither known */
    c.n_ctx = 32768;
    CHECK_EQ_U64(kvp_config_ctx_limit(&c), 32768);
    c.sliding_window = 4096;
    CHECK_EQ_U64(kvp_config_ctx_limit(&c), 4096);
    c.sliding_window = 65536; /* a window past the context changes nothing */
    CHECK_EQ_U64(kvp_config_ctx_limit(&c), 32768);
    c.n_ctx = 0; /* no context stated: the window */
    CHECK_EQ_U64(kvp_config_ctx_limit(&c), 65536);
}

/* kvp_model_check, which quantize runs, refuses a tokenizer of more tokens
 * than the vocabulary as the loader does (quantize wrote such a model and
 * decode refused it). */
static void test_check_vocab(void)
{
    kvp_meta m;
    kvp_config c;
    kvp_err err = {0};
    smollm_meta(&m);
    kvp_meta_set_str(&m, "tokenizer.ggml.model", "llama", 5);
    CHECK_MSG(kvp_config_from_meta(&c, &m, "m.gguf", &err) == 0, "%s", err.msg);
    CHECK_MSG(kvp_model_check(&c, &m, "m.gguf", &err) == 0, "%s", err.msg);
    c.n_vocab = 3;
    int rc = kvp_model_check(&c, &m, "m.gguf", &err);
    CHECK_MSG(rc == KVP_EFORMAT && strstr(err.msg, "m.gguf: the tokenizer has 4 tokens, the model's vocabulary 3"), "%s",
              rc ? err.msg : "accepted");
    c.n_vocab = 5; /* a padded embedding is a model's own */
    CHECK_MSG(kvp_model_check(&c, &m, "m.gguf", &err) == 0, "%s", err.msg);
    kvp_meta_free(&m);
}

int main(void)
{
    test_ctx_limit();
    test_check_vocab();
    test_reals();
    test_from_meta();
    test_check();
    test_check_shape();
    test_from_hf();
    test_real_model();
    return unit_done();
}
