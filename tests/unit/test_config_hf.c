/* test_config_hf.c - kvp_config_from_hf_json (config.json already parsed):
 * the same config as the path form, and the inputs the fuzzer found that
 * were accepted but did not survive the trip through a KVP CONFIG record. */
#include "config.h"
#include "json.h"
#include "unit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int from_text(kvp_config *c, const char *text, kvp_err *err)
{
    kvp_json *j;
    int rc = kvp_json_parse(&j, text, strlen(text), "t.json", err);
    if (rc)
        return rc;
    rc = kvp_config_from_hf_json(c, j, "t.json", err);
    kvp_json_free(j);
    return rc;
}

/* to_meta then from_meta gives back the fields the engine uses. */
static int round_trips(const kvp_config *c)
{
    kvp_meta m;
    kvp_meta_init(&m);
    kvp_config b;
    kvp_err err = {0};
    int ok = kvp_config_to_meta(c, &m) == 0 && kvp_config_from_meta(&b, &m, "rt", &err) == 0 &&
             b.n_layer == c->n_layer && b.head_dim == c->head_dim && b.rope_dim == c->rope_dim &&
             b.n_head_kv == c->n_head_kv && b.kv_lora_rank == c->kv_lora_rank && b.rope_type == c->rope_type;
    kvp_meta_free(&m);
    return ok;
}

static void test_same_as_path(void)
{
    const char *dir = getenv("KVP_TESTS");
    char path[1024];
    snprintf(path, sizeof path, "%s/golden/tiny-st/config.json", dir ? dir : "tests");
    kvp_config a, b;
    kvp_err err = {0};
    kvp_json *j;
    CHECK(kvp_config_from_hf(&a, path, &err) == 0);
    CHECK(kvp_json_parse_file(&j, path, 1 << 20, &err) == 0);
    CHECK(kvp_config_from_hf_json(&b, j, path, &err) == 0);
    kvp_json_free(j);
    CHECK(memcmp(&a, &b, sizeof a) == 0);
    CHECK_EQ_U64(b.n_embd, 8);
    CHECK(round_trips(&b));
}

static void test_not_object(void)
{
    kvp_config c;
    kvp_err err = {0};
    CHECK(from_text(&c, "[1, 2]", &err) == KVP_EFORMAT);
    CHECK(strstr(err.msg, "t.json: expected a JSON object") != NULL);
    CHECK(kvp_config_from_hf_json(&c, NULL, NULL, &err) == KVP_EFORMAT);
}

/* Found by fuzz_hfconfig: an MLA config with qk_rope_head_dim 0 was
 * accepted with rope_dim 0, which a KVP CONFIG record reads back as "all of
 * head_dim"; likewise a partial_rotary_factor that rotates no dimension. */
static void test_fuzz_regressions(void)
{
    kvp_config c;
    kvp_err err = {0};
    const char *mla = "{\"model_type\": \"deepseek_v3\", \"hidden_size\": 64, \"num_hidden_layers\": 2, "
                      "\"num_attention_heads\": 4, \"kv_lora_rank\": 32, \"qk_rope_head_dim\": 0, "
                      "\"qk_nope_head_dim\": 16}";
    CHECK(from_text(&c, mla, &err) == KVP_EFORMAT);
    CHECK_MSG(strstr(err.msg, "qk_rope_head_dim") != NULL, "%s", err.msg);
    const char *phi = "{\"model_type\": \"phi\", \"hidden_size\": 64, \"num_hidden_layers\": 2, "
                      "\"num_attention_heads\": 4, \"partial_rotary_factor\": 0.001}";
    CHECK(from_text(&c, phi, &err) == KVP_EFORMAT);
    CHECK_MSG(strstr(err.msg, "partial_rotary_factor") != NULL, "%s", err.msg);
    /* the valid neighbours still load and round-trip */
    const char *mla_ok = "{\"model_type\": \"deepseek_v3\", \"hidden_size\": 64, \"num_hidden_layers\": 2, "
                         "\"num_attention_heads\": 4, \"kv_lora_rank\": 32, \"qk_rope_head_dim\": 8, "
                         "\"qk_nope_head_dim\": 16}";
    CHECK(from_text(&c, mla_ok, &err) == 0);
    CHECK_EQ_U64(c.rope_dim, 8);
    CHECK(round_trips(&c));
    const char *phi_ok = "{\"model_type\": \"phi\", \"hidden_size\": 64, \"num_hidden_layers\": 2, "
                         "\"num_attention_heads\": 4, \"partial_rotary_factor\": 0.5}";
    CHECK(from_text(&c, phi_ok, &err) == 0);
    CHECK_EQ_U64(c.rope_dim, 8);
    CHECK(round_trips(&c));
}

/* transformers 5's "rope_parameters" (flat, or one object per layer type)
 * gives the same config as the 4.x rope_theta and rope_scaling keys. */
static void test_rope_parameters(void)
{
    kvp_config a, b;
    kvp_err err = {0};
    const char *base = "{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 2, "
                       "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, ";
    char v4[1024], v5[1024], nested[1024];
    snprintf(v4, sizeof v4, "%s\"rope_theta\": 500000.0, \"rope_scaling\": {\"rope_type\": \"llama3\", "
             "\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
             "\"original_max_position_embeddings\": 8192}}", base);
    snprintf(v5, sizeof v5, "%s\"rope_parameters\": {\"rope_type\": \"llama3\", \"factor\": 8.0, "
             "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192, "
             "\"rope_theta\": 500000.0}}", base);
    CHECK(from_text(&a, v4, &err) == 0);
    CHECK(from_text(&b, v5, &err) == 0);
    CHECK_MSG(memcmp(&a, &b, sizeof a) == 0, "rope_parameters and rope_scaling configs differ");
    CHECK(b.rope_theta == 500000.0 && b.rope_scaling == KVP_ROPE_SCALING_LLAMA3 && b.rope_factor == 8.0);
    CHECK_EQ_U64(b.rope_orig_ctx, 8192);
    /* the default type carries only the base; a per-layer-type object gives
     * the full-attention one, partial rotation included */
    snprintf(v5, sizeof v5, "%s\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1e6}}", base);
    CHECK(from_text(&b, v5, &err) == 0);
    CHECK(b.rope_theta == 1e6 && b.rope_scaling == KVP_ROPE_SCALING_NONE);
    snprintf(nested, sizeof nested, "%s\"rope_parameters\": {\"sliding_attention\": {\"rope_type\": \"default\", "
             "\"rope_theta\": 10000.0}, \"full_attention\": {\"rope_type\": \"default\", \"rope_theta\": 1e6, "
             "\"partial_rotary_factor\": 0.5}}}", base);
    CHECK(from_text(&b, nested, &err) == 0);
    CHECK(b.rope_theta == 1e6);
    CHECK_EQ_U64(b.rope_dim, 8);
    CHECK(round_trips(&b));
    /* malformed: named */
    snprintf(v5, sizeof v5, "%s\"rope_parameters\": 7}", base);
    CHECK(from_text(&b, v5, &err) == KVP_EFORMAT);
    CHECK_MSG(strstr(err.msg, "t.json: rope_parameters: expected an object") != NULL, "%s", err.msg);
    snprintf(v5, sizeof v5, "%s\"rope_parameters\": {\"sliding_attention\": {}}}", base);
    CHECK(from_text(&b, v5, &err) == KVP_EFORMAT);
    CHECK_MSG(strstr(err.msg, "full_attention") != NULL, "%s", err.msg);
    snprintf(v5, sizeof v5, "%s\"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": -2}}", base);
    CHECK(from_text(&b, v5, &err) == KVP_EFORMAT);
    CHECK_MSG(strstr(err.msg, "rope_parameters.factor: must be positive") != NULL, "%s", err.msg);
}

static void put(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0);
}

/* An HF folder's chat template: chat_template.jinja (transformers saves
 * it there now; a folder had its --chat without the template's default
 * system message, and its KVP file with it), else tokenizer_config.json's
 * string or named "default"; none in a folder with neither. */
static void test_chat_template(void)
{
    char dir[] = "/tmp/kvp-test-hf-tpl.XXXXXX", path[600];
    if (!mkdtemp(dir)) {
        CHECK(0);
        return;
    }
    kvp_err err = {0};
    char *t = NULL;
    CHECK(kvp_hf_chat_template(dir, &t, &err) == 0 && t == NULL);
    put(dir, "tokenizer_config.json", "{\"chat_template\":[{\"name\":\"tool_use\",\"template\":\"T\"},"
                                      "{\"name\":\"default\",\"template\":\"D\"}]}");
    CHECK(kvp_hf_chat_template(dir, &t, &err) == 0 && t && strcmp(t, "D") == 0);
    free(t);
    put(dir, "tokenizer_config.json", "{\"chat_template\":\"S\"}");
    CHECK(kvp_hf_chat_template(dir, &t, &err) == 0 && t && strcmp(t, "S") == 0);
    free(t);
    /* a broken one is said (1, naming it), not read as no template */
    put(dir, "tokenizer_config.json", "{\"chat_template\":\"S\"");
    t = NULL;
    CHECK(kvp_hf_chat_template(dir, &t, &err) == 1 && t == NULL);
    CHECK(strstr(err.msg, "tokenizer_config.json") != NULL);
    put(dir, "tokenizer_config.json", "{\"chat_template\":\"S\"}");
    put(dir, "chat_template.jinja", "{{ '<|im_start|>system\\nJ<|im_end|>' }}");
    CHECK(kvp_hf_chat_template(dir, &t, &err) == 0 && t && strcmp(t, "{{ '<|im_start|>system\\nJ<|im_end|>' }}") == 0);
    free(t);
    const char *names[] = {"chat_template.jinja", "tokenizer_config.json"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}

int main(void)
{
    test_chat_template();
    test_same_as_path();
    test_not_object();
    test_fuzz_regressions();
    test_rope_parameters();
    return unit_done();
}
