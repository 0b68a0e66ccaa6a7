/* config_hf.c - kvp_config_from_hf: an HF config.json into a kvp_config.
 *
 * HF checkpoints keep Q/K rows unpermuted, so RoPE is NeoX-style (rotate
 * (i, i + d/2)) whatever the architecture; see FACTS.md "RoPE". */
#include "config.h"
#include "io.h"
#include "json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define HF_CONFIG_MAX (16u << 20) /* bytes: real ones are a few KB */

typedef struct hf_ctx {
    const kvp_json *j;
    const char *path;
    kvp_err *err;
} hf_ctx;

/* Optional unsigned member: 0 found, 1 absent or null, <0 error naming key. */
static int hf_uint(const hf_ctx *x, const char *key, uint32_t *out)
{
    const kvp_json *v = kvp_json_get(x->j, key);
    if (!v || v->type == KVP_JSON_NULL)
        return 1;
    uint64_t u;
    if (kvp_json_to_u64(v, &u) != 0 || u > UINT32_MAX)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: %s: expected a non-negative integer below 2^32", x->path, key);
    *out = (uint32_t)u;
    return 0;
}

static int hf_need(const hf_ctx *x, const char *key, uint32_t *out)
{
    int rc = hf_uint(x, key, out);
    if (rc == 1)
        return kvp_err_set(x->err, KVP_ENOTFOUND, "%s: %s: required key missing", x->path, key);
    return rc;
}

static int hf_num(const hf_ctx *x, const kvp_json *obj, const char *key, double *out)
{
    const kvp_json *v = kvp_json_get(obj, key);
    if (!v || v->type == KVP_JSON_NULL)
        return 1;
    if (v->type != KVP_JSON_NUMBER)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: %s: expected a number, found %s", x->path, key,
                           kvp_json_type_name(v->type));
    *out = v->num;
    return 0;
}

static int hf_bool(const hf_ctx *x, const char *key, int *out)
{
    const kvp_json *v = kvp_json_get(x->j, key);
    if (!v || v->type == KVP_JSON_NULL)
        return 1;
    if (v->type != KVP_JSON_BOOL)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: %s: expected true or false", x->path, key);
    *out = v->b;
    return 0;
}

/* HF model_type -> the GGUF architecture name llama.cpp uses. */
static const char *hf_arch(const char *model_type)
{
    static const char *const map[][2] = {
        {"qwen2_moe", "qwen2moe"}, {"qwen3_moe", "qwen3moe"}, {"deepseek_v2", "deepseek2"},
        {"deepseek_v3", "deepseek2"}, {"gpt_neox", "gptneox"}, {"phimoe", "phimoe"},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(model_type, map[i][0]) == 0)
            return map[i][1];
    return model_type;
}

/* transformers 5 writes the rotation as one object, "rope_parameters":
 * {"rope_type", "rope_theta", the scaling keys, maybe
 * "partial_rotary_factor"}, or one such object per layer type
 * ({"full_attention": {...}, "sliding_attention": {...}}: the full-attention
 * one is taken, as the KV sizes need only the head layout).  NULL when the
 * config has none (the 4.x keys rope_theta and rope_scaling then apply). */
static int hf_rope_parameters(const hf_ctx *x, const kvp_json **out)
{
    const kvp_json *rp = kvp_json_get(x->j, "rope_parameters");
    *out = NULL;
    if (!rp || rp->type == KVP_JSON_NULL)
        return 0;
    if (rp->type != KVP_JSON_OBJECT)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: rope_parameters: expected an object or null", x->path);
    if (!kvp_json_get(rp, "rope_type") && !kvp_json_get(rp, "rope_theta")) {
        const kvp_json *full = kvp_json_get(rp, "full_attention");
        if (!full || full->type != KVP_JSON_OBJECT)
            return kvp_err_set(x->err, KVP_EFORMAT, "%s: rope_parameters: neither rope_type nor rope_theta, and "
                               "no full_attention object", x->path);
        rp = full;
    }
    *out = rp;
    return 0;
}

/* Scaling from rs: the 4.x rope_scaling object, or rope_parameters. */
static int hf_rope_scaling(const hf_ctx *x, const kvp_json *rs, const char *what, kvp_config *c)
{
    if (!rs || rs->type == KVP_JSON_NULL)
        return 0;
    if (rs->type != KVP_JSON_OBJECT)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: %s: expected an object or null", x->path, what);
    const char *type = kvp_json_get_str(rs, "rope_type");
    if (!type)
        type = kvp_json_get_str(rs, "type");
    int rc, rc_factor;
    if ((rc = rc_factor = hf_num(x, rs, "factor", &c->rope_factor)) < 0)
        return rc;
    if (type && strcmp(type, "llama3") == 0) {
        c->rope_scaling = KVP_ROPE_SCALING_LLAMA3;
        double orig = 0;
        if ((rc = hf_num(x, rs, "low_freq_factor", &c->rope_low_freq_factor)) < 0 ||
            (rc = hf_num(x, rs, "high_freq_factor", &c->rope_high_freq_factor)) < 0 ||
            (rc = hf_num(x, rs, "original_max_position_embeddings", &orig)) < 0)
            return rc;
        if (orig < 0 || orig > UINT32_MAX)
            return kvp_err_set(x->err, KVP_EFORMAT, "%s: %s.original_max_position_embeddings: out of range",
                               x->path, what);
        c->rope_orig_ctx = (uint32_t)orig;
        if (orig < 1)
            return kvp_err_set(x->err, KVP_EFORMAT, "%s: %s: llama3 scaling needs original_max_position_embeddings",
                               x->path, what);
    } else if (type && strcmp(type, "linear") == 0) {
        c->rope_scaling = KVP_ROPE_SCALING_LINEAR;
    } else if (type && strcmp(type, "default") != 0) {
        /* yarn, dynamic, longrope, or a name we do not know: kvcalc needs
         * no rotation; the engine would rotate without it, so it (and a
         * KVP model file, which could not say it) refuses the model */
        c->rope_scaling = KVP_ROPE_SCALING_OTHER;
        snprintf(c->rope_scaling_name, sizeof c->rope_scaling_name, "%s", type);
    }
    if ((c->rope_scaling == KVP_ROPE_SCALING_LLAMA3 || c->rope_scaling == KVP_ROPE_SCALING_LINEAR) && rc_factor == 1)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: %s: %s scaling needs a factor", x->path, what, type);
    if (c->rope_scaling != KVP_ROPE_SCALING_NONE && !(c->rope_factor > 0))
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: %s.factor: must be positive", x->path, what);
    return 0;
}

static int hf_moe_mla(const hf_ctx *x, kvp_config *c)
{
    int rc;
    if ((rc = hf_uint(x, "num_local_experts", &c->n_expert)) < 0 ||
        (rc == 1 && (rc = hf_uint(x, "n_routed_experts", &c->n_expert)) < 0) ||
        (rc == 1 && (rc = hf_uint(x, "num_experts", &c->n_expert)) < 0) ||
        (rc = hf_uint(x, "num_experts_per_tok", &c->n_expert_used)) < 0 ||
        (rc = hf_uint(x, "moe_intermediate_size", &c->n_ff_expert)) < 0 ||
        (rc = hf_uint(x, "n_shared_experts", &c->n_expert_shared)) < 0 ||
        (rc = hf_uint(x, "first_k_dense_replace", &c->n_layer_dense)) < 0 ||
        (rc = hf_uint(x, "kv_lora_rank", &c->kv_lora_rank)) < 0)
        return rc;
    if (!c->n_expert)
        c->n_expert_used = 0;
    if (c->n_expert_used > c->n_expert)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: num_experts_per_tok: %u exceeds the %u experts", x->path,
                           c->n_expert_used, c->n_expert);
    if (c->kv_lora_rank) {
        uint32_t rope = 0, nope = 0;
        if ((rc = hf_need(x, "qk_rope_head_dim", &rope)) < 0 || (rc = hf_uint(x, "qk_nope_head_dim", &nope)) < 0)
            return rc;
        /* 0 would read back from a KVP CONFIG record as "all of head_dim" */
        if (rope == 0)
            return kvp_err_set(x->err, KVP_EFORMAT, "%s: qk_rope_head_dim: must not be 0", x->path);
        c->rope_head_dim_mla = c->rope_dim = rope;
        if (nope)
            c->head_dim = nope + rope;
    }
    return 0;
}

static int hf_fill(const hf_ctx *x, kvp_config *c)
{
    const char *mt = kvp_json_get_str(x->j, "model_type");
    if (!mt)
        return kvp_err_set(x->err, KVP_ENOTFOUND, "%s: model_type: required key missing (or not a string)", x->path);
    const char *arch = hf_arch(mt);
    if (!arch[0] || strlen(arch) >= sizeof c->arch)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: model_type: \"%.40s\" is empty or too long", x->path, mt);
    strcpy(c->arch, arch);
    const char *name = kvp_json_get_str(x->j, "_name_or_path");
    if (name)
        snprintf(c->name, sizeof c->name, "%s", name);
    int rc;
    if ((rc = hf_need(x, "num_hidden_layers", &c->n_layer)) < 0 || (rc = hf_need(x, "hidden_size", &c->n_embd)) < 0 ||
        (rc = hf_need(x, "num_attention_heads", &c->n_head)) < 0 ||
        (rc = hf_uint(x, "intermediate_size", &c->n_ff)) < 0 || (rc = hf_uint(x, "vocab_size", &c->n_vocab)) < 0 ||
        (rc = hf_uint(x, "max_position_embeddings", &c->n_ctx)) < 0)
        return rc;
    if (c->n_head == 0)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: num_attention_heads: must not be 0", x->path);
    c->n_head_kv = c->n_head;
    if ((rc = hf_uint(x, "num_key_value_heads", &c->n_head_kv)) < 0)
        return rc;
    c->head_dim = c->n_embd / c->n_head;
    if ((rc = hf_uint(x, "head_dim", &c->head_dim)) < 0)
        return rc;
    c->rms_eps = 1e-6; /* the HF Llama default */
    const kvp_json *rp;
    if ((rc = hf_rope_parameters(x, &rp)) < 0 || (rc = hf_num(x, x->j, "rope_theta", &c->rope_theta)) < 0 ||
        (rp && (rc = hf_num(x, rp, "rope_theta", &c->rope_theta)) < 0) ||
        (rc = hf_num(x, x->j, "rms_norm_eps", &c->rms_eps)) < 0)
        return rc;
    c->rope_type = KVP_ROPE_NEOX;
    c->rope_dim = c->head_dim;
    double partial = 1.0;
    if ((rc = hf_num(x, x->j, "partial_rotary_factor", &partial)) < 0)
        return rc;
    int found = rc == 0;
    if (rp) {
        if ((rc = hf_num(x, rp, "partial_rotary_factor", &partial)) < 0)
            return rc;
        found |= rc == 0;
    }
    if (found && partial > 0 && partial < 1)
        c->rope_dim = (uint32_t)(c->head_dim * partial);
    if (c->rope_dim == 0 && c->head_dim) /* 0 would read back as "all of head_dim" */
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: partial_rotary_factor: %g rotates none of the %u head dims",
                           x->path, partial, c->head_dim);
    if ((rc = rp ? hf_rope_scaling(x, rp, "rope_parameters", c)
                 : hf_rope_scaling(x, kvp_json_get(x->j, "rope_scaling"), "rope_scaling", c)) < 0 ||
        (rc = hf_moe_mla(x, c)) < 0)
        return rc;

    /* the activation the loader must refuse unless SiLU (kvcalc plans any) */
    const char *act = kvp_json_get_str(x->j, "hidden_act");
    if (act && strcmp(act, "silu") != 0 && strcmp(act, "swish") != 0)
        snprintf(c->hidden_act, sizeof c->hidden_act, "%.15s", act);
    int use_sw = 1;
    if ((rc = hf_bool(x, "use_sliding_window", &use_sw)) < 0 || (rc = hf_uint(x, "sliding_window", &c->sliding_window)) < 0)
        return rc;
    if (!use_sw)
        c->sliding_window = 0;
    if (c->sliding_window && strcmp(c->arch, "gemma2") == 0)
        c->sliding_period = 2;
    c->tied_embeddings = strncmp(c->arch, "gemma", 5) == 0; /* HF's per-model defaults */
    if ((rc = hf_bool(x, "tie_word_embeddings", &c->tied_embeddings)) < 0)
        return rc;
    c->attn_bias = strcmp(c->arch, "qwen2") == 0;
    if ((rc = hf_bool(x, "attention_bias", &c->attn_bias)) < 0)
        return rc;
    if (c->n_head_kv == 0 || c->n_head % c->n_head_kv)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: num_key_value_heads: %u heads are not a multiple of %u", x->path,
                           c->n_head, c->n_head_kv);
    if (c->head_dim == 0)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: head_dim: must not be 0", x->path);
    return kvp_config_check_reals(c, x->path, "rms_norm_eps", rp ? "rope_parameters.rope_theta" : "rope_theta",
                                  x->err);
}

int kvp_config_from_hf_json(kvp_config *c, const kvp_json *j, const char *name, kvp_err *err)
{
    kvp_config_init(c);
    const char *src = name ? name : "config.json";
    if (!j || j->type != KVP_JSON_OBJECT)
        return kvp_err_set(err, KVP_EFORMAT, "%s: expected a JSON object at the top", src);
    hf_ctx x = {j, src, err};
    return hf_fill(&x, c);
}

int kvp_config_from_hf(kvp_config *c, const char *path, kvp_err *err)
{
    kvp_config_init(c);
    char file[4096];
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        if ((size_t)snprintf(file, sizeof file, "%s/config.json", path) >= sizeof file)
            return kvp_err_set(err, KVP_EINVAL, "%s: path too long", path);
    } else {
        snprintf(file, sizeof file, "%s", path);
    }
    kvp_json *j;
    int rc = kvp_json_parse_file(&j, file, HF_CONFIG_MAX, err);
    if (rc)
        return rc;
    rc = kvp_config_from_hf_json(c, j, file, err);
    kvp_json_free(j);
    return rc;
}

/* tokenizer_config.json's "chat_template": a string, or the "default" of a
 * list of named templates. */
static const char *named_template(const kvp_json *root)
{
    const kvp_json *t = kvp_json_get(root, "chat_template");
    if (t && t->type == KVP_JSON_STRING)
        return t->str;
    for (size_t i = 0; t && t->type == KVP_JSON_ARRAY && i < t->n; i++) {
        const char *name = kvp_json_get_str(kvp_json_at(t, i), "name");
        if (name && strcmp(name, "default") == 0)
            return kvp_json_get_str(kvp_json_at(t, i), "template");
    }
    return NULL;
}

int kvp_hf_chat_template(const char *dir, char **out, kvp_err *err)
{
    const uint64_t TEMPLATE_MAX = UINT64_C(256) << 20; /* as tokenizer.json: a config may list every added token */
    char path[4200];
    struct stat sb;
    *out = NULL;
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
        uint8_t *text;
        size_t len;
        int rc = kvp_read_file(path, TEMPLATE_MAX, &text, &len, err);
        if (rc < 0)
            return rc;
        char *s = realloc(text, len + 1);
        if (!s) {
            free(text);
            return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", path);
        }
        s[len] = '\0';
        *out = s;
        return 0;
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    kvp_json *root = NULL;
    if (stat(path, &sb) != 0)
        return 0;
    /* one that is there but does not parse here is said (1, err), not
     * taken for "no template": --chat would drop the model's default
     * system turn without a word.  Not refused outright: Python's json,
     * and so transformers, reads some files this parser does not (NaN,
     * a key given twice), and a run without --chat needs no template. */
    kvp_err why = {0};
    int rc = kvp_json_parse_file(&root, path, TEMPLATE_MAX, &why);
    if (rc == KVP_ENOMEM)
        return kvp_err_set(err, rc, "%s", why.msg);
    if (rc < 0) {
        kvp_err_set(err, KVP_EFORMAT, "%s", why.msg);
        return 1;
    }
    const char *tpl = named_template(root);
    if (tpl && !(*out = strdup(tpl))) {
        kvp_json_free(root);
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", path);
    }
    kvp_json_free(root);
    return 0;
}
