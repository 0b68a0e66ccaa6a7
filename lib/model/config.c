/* config.c - model hyperparameters from GGUF-style metadata and back (see
 * config.h).  kvp_config_from_hf (HF config.json) lives in config_hf.c.
 *
 * Keys are llama.cpp's ("<arch>.block_count", ...).  A few facts GGUF has no
 * key for are written under "kvpipe.*" so a KVP CONFIG record round-trips:
 *   kvpipe.rope_type        "norm" | "neox"   (else decided by the architecture)
 *   kvpipe.tied_embeddings  bool              (else left to the caller: GGUF
 *                                              files tie when output.weight is absent)
 *   kvpipe.attn_bias        bool              (else qwen2 -> 1)
 *   kvpipe.n_params         f64
 *   <arch>.rope.scaling.low_freq_factor / high_freq_factor   (llama3 scaling)
 *   <arch>.attention.sliding_window_pattern                  (1 in N layers is global)
 */
#include "config.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

void kvp_config_init(kvp_config *c)
{
    memset(c, 0, sizeof *c);
    c->rope_theta = 10000.0;
    c->rms_eps = 1e-5;
    c->rope_type = KVP_ROPE_NORM;
    c->rope_factor = 1.0;
}

/* Architectures whose GGUF weights are not permuted (NeoX-style rotation);
 * llama.cpp's list, the ones we are likely to meet. */
static int arch_is_neox(const char *arch)
{
    static const char *const neox[] = {
        "qwen", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "gemma", "gemma2", "gemma3", "phi2", "phi3",
        "phimoe", "starcoder2", "stablelm", "gptneox", "falcon", "olmo2", "olmoe", "nemotron", "exaone",
        "orion", "codeshell", "bitnet", "dbrx", "grok", "openelm", "minicpm3",
    };
    for (size_t i = 0; i < sizeof neox / sizeof neox[0]; i++)
        if (strcmp(arch, neox[i]) == 0)
            return 1;
    return 0;
}

typedef struct cfg_ctx {
    const kvp_meta *m;
    const char *arch;
    const char *src;
    kvp_err *err;
} cfg_ctx;

/* Value of "<arch><suffix>" (or of suffix itself when it starts with no '.').
 * Integer arrays (per-layer values, as some converters write) give their
 * maximum.  0 found, 1 absent, <0 error naming the key. */
static int get_uint(const cfg_ctx *x, const char *suffix, uint32_t *out)
{
    char key[160];
    snprintf(key, sizeof key, "%s%s", suffix[0] == '.' ? x->arch : "", suffix);
    const kvp_meta_entry *e = kvp_meta_find(x->m, key);
    if (!e)
        return 1;
    uint64_t v = 0;
    if (e->type == KVP_META_ARR_I32 || e->type == KVP_META_ARR_I64) {
        for (uint64_t i = 0; i < e->n; i++) {
            int64_t a = e->type == KVP_META_ARR_I32 ? ((const int32_t *)e->arr)[i] : ((const int64_t *)e->arr)[i];
            if (a < 0)
                return kvp_err_set(x->err, KVP_EFORMAT, "%s: metadata %s: element %" PRIu64 " is negative", x->src,
                                   key, i);
            if ((uint64_t)a > v)
                v = (uint64_t)a;
        }
    } else if (kvp_meta_get_u64(x->m, key, &v) != 0) {
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: metadata %s: expected a non-negative integer, found %s", x->src,
                           key, kvp_meta_type_name(e->type));
    }
    if (v > UINT32_MAX)
        return kvp_err_set(x->err, KVP_ELIMIT, "%s: metadata %s: %" PRIu64 " is too large", x->src, key, v);
    *out = (uint32_t)v;
    return 0;
}

static int need_uint(const cfg_ctx *x, const char *suffix, uint32_t *out)
{
    int rc = get_uint(x, suffix, out);
    if (rc == 1)
        return kvp_err_set(x->err, KVP_ENOTFOUND, "%s: metadata %s%s: required key missing", x->src, x->arch, suffix);
    return rc;
}

static int get_float(const cfg_ctx *x, const char *suffix, double *out)
{
    char key[160];
    snprintf(key, sizeof key, "%s%s", suffix[0] == '.' ? x->arch : "", suffix);
    const kvp_meta_entry *e = kvp_meta_find(x->m, key);
    if (!e)
        return 1;
    if (kvp_meta_get_f64(x->m, key, out) != 0)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: metadata %s: expected a number, found %s", x->src, key,
                           kvp_meta_type_name(e->type));
    if (!isfinite(*out)) /* no setting of a model is infinite or NaN */
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: metadata %s: %g is not a finite number", x->src, key, *out);
    return 0;
}

static int get_bool(const cfg_ctx *x, const char *key, int *out)
{
    const kvp_meta_entry *e = kvp_meta_find(x->m, key);
    if (!e)
        return 1;
    if (e->type != KVP_META_BOOL && e->type != KVP_META_U64)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: metadata %s: expected a bool, found %s", x->src, key,
                           kvp_meta_type_name(e->type));
    *out = e->v.u != 0;
    return 0;
}

static const char *get_arch_str(const cfg_ctx *x, const char *suffix)
{
    char key[160];
    snprintf(key, sizeof key, "%s%s", x->arch, suffix);
    return kvp_meta_get_str(x->m, key);
}

static int read_rope(cfg_ctx *x, kvp_config *c)
{
    int rc;
    if ((rc = get_uint(x, ".rope.dimension_count", &c->rope_dim)) < 0 ||
        (rc = get_float(x, ".rope.freq_base", &c->rope_theta)) < 0)
        return rc;
    const char *rt = kvp_meta_get_str(x->m, "kvpipe.rope_type");
    if (rt && strcmp(rt, "neox") == 0)
        c->rope_type = KVP_ROPE_NEOX;
    else if (rt && strcmp(rt, "norm") == 0)
        c->rope_type = KVP_ROPE_NORM;
    else if (rt)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: metadata kvpipe.rope_type: \"%.40s\" is neither norm nor neox",
                           x->src, rt);
    else
        c->rope_type = arch_is_neox(c->arch) ? KVP_ROPE_NEOX : KVP_ROPE_NORM;

    const char *act = kvp_meta_get_str(x->m, "kvpipe.hidden_act"); /* what config_to_meta wrote */
    if (act && *act)
        snprintf(c->hidden_act, sizeof c->hidden_act, "%.15s", act);
    const char *st = get_arch_str(x, ".rope.scaling.type");
    if (st && strcmp(st, "linear") == 0)
        c->rope_scaling = KVP_ROPE_SCALING_LINEAR;
    else if (st && strcmp(st, "llama3") == 0)
        c->rope_scaling = KVP_ROPE_SCALING_LLAMA3;
    else if (st && strcmp(st, "none") != 0) { /* yarn, ...: planned by kvcalc, refused by the engine */
        c->rope_scaling = KVP_ROPE_SCALING_OTHER;
        snprintf(c->rope_scaling_name, sizeof c->rope_scaling_name, "%s", st);
    }
    if ((rc = get_float(x, ".rope.scaling.factor", &c->rope_factor)) < 0 ||
        (rc = get_float(x, ".rope.scaling.low_freq_factor", &c->rope_low_freq_factor)) < 0 ||
        (rc = get_float(x, ".rope.scaling.high_freq_factor", &c->rope_high_freq_factor)) < 0 ||
        (rc = get_uint(x, ".rope.scaling.original_context_length", &c->rope_orig_ctx)) < 0)
        return rc;
    if (c->rope_scaling != KVP_ROPE_SCALING_NONE && !(c->rope_factor > 0))
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: metadata %s.rope.scaling.factor: must be positive", x->src,
                           x->arch);
    return 0;
}

static int read_moe_mla(cfg_ctx *x, kvp_config *c)
{
    int rc;
    if ((rc = get_uint(x, ".expert_count", &c->n_expert)) < 0 ||
        (rc = get_uint(x, ".expert_used_count", &c->n_expert_used)) < 0 ||
        (rc = get_uint(x, ".expert_feed_forward_length", &c->n_ff_expert)) < 0 ||
        (rc = get_uint(x, ".expert_shared_count", &c->n_expert_shared)) < 0 ||
        (rc = get_uint(x, ".leading_dense_block_count", &c->n_layer_dense)) < 0 ||
        (rc = get_uint(x, ".attention.kv_lora_rank", &c->kv_lora_rank)) < 0)
        return rc;
    if (c->n_expert_used > c->n_expert)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: metadata %s.expert_used_count: %u exceeds expert_count %u",
                           x->src, x->arch, c->n_expert_used, c->n_expert);
    /* MLA: the decoupled RoPE key is what rope.dimension_count counts. */
    if (c->kv_lora_rank)
        c->rope_head_dim_mla = c->rope_dim;
    return 0;
}

static int read_vocab(cfg_ctx *x, kvp_config *c)
{
    int rc = get_uint(x, ".vocab_size", &c->n_vocab);
    if (rc <= 0)
        return rc;
    const kvp_meta_entry *e = kvp_meta_find(x->m, "tokenizer.ggml.tokens");
    if (!e)
        return kvp_err_set(x->err, KVP_ENOTFOUND, "%s: metadata %s.vocab_size: missing, and no tokenizer.ggml.tokens "
                           "to count", x->src, x->arch);
    if (e->type != KVP_META_ARR_STR || e->n > UINT32_MAX)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: metadata tokenizer.ggml.tokens: expected a string array, found %s",
                           x->src, kvp_meta_type_name(e->type));
    c->n_vocab = (uint32_t)e->n;
    return 0;
}

static int check_shape(cfg_ctx *x, kvp_config *c)
{
    if (c->n_head == 0 || c->n_head_kv == 0 || c->n_head % c->n_head_kv)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: metadata %s.attention.head_count_kv: %u query heads are not a "
                           "multiple of %u KV heads", x->src, x->arch, c->n_head, c->n_head_kv);
    if (c->head_dim == 0)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: metadata %s.attention.key_length: head dim is 0", x->src, x->arch);
    if (c->rope_dim > c->head_dim && !c->kv_lora_rank)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: metadata %s.rope.dimension_count: %u exceeds the head dim %u",
                           x->src, x->arch, c->rope_dim, c->head_dim);
    return 0;
}

int kvp_config_from_meta(kvp_config *c, const kvp_meta *m, const char *source, kvp_err *err)
{
    kvp_config_init(c);
    const char *src = source ? source : "?";
    const char *arch = kvp_meta_get_str(m, "general.architecture");
    /* specdec --train-heads' file has a config of its own (medusa.*): the
     * wrong kind of file, not a damaged model */
    if (!arch && kvp_meta_find(m, "medusa.arch"))
        return kvp_err_set(err, KVP_EFORMAT, "%s: a Medusa heads file (specdec --heads), not a model", src);
    if (!arch)
        return kvp_err_set(err, KVP_ENOTFOUND, "%s: metadata general.architecture: required key missing", src);
    if (strlen(arch) == 0 || strlen(arch) >= sizeof c->arch)
        return kvp_err_set(err, KVP_EFORMAT, "%s: metadata general.architecture: \"%.40s\" is empty or too long", src,
                           arch);
    strcpy(c->arch, arch);
    const char *name = kvp_meta_get_str(m, "general.name");
    if (name)
        snprintf(c->name, sizeof c->name, "%s", name);
    cfg_ctx x = {m, c->arch, src, err};
    int rc;
    if ((rc = need_uint(&x, ".block_count", &c->n_layer)) < 0 ||
        (rc = need_uint(&x, ".embedding_length", &c->n_embd)) < 0 ||
        (rc = need_uint(&x, ".attention.head_count", &c->n_head)) < 0 ||
        (rc = get_uint(&x, ".feed_forward_length", &c->n_ff)) < 0 ||
        (rc = get_uint(&x, ".context_length", &c->n_ctx)) < 0 ||
        (rc = get_float(&x, ".attention.layer_norm_rms_epsilon", &c->rms_eps)) < 0 ||
        (rc = get_uint(&x, ".attention.sliding_window", &c->sliding_window)) < 0 ||
        (rc = get_uint(&x, ".attention.sliding_window_pattern", &c->sliding_period)) < 0)
        return rc;
    c->n_head_kv = c->n_head;
    if ((rc = get_uint(&x, ".attention.head_count_kv", &c->n_head_kv)) < 0)
        return rc;
    c->head_dim = c->n_head ? c->n_embd / c->n_head : 0;
    if ((rc = get_uint(&x, ".attention.key_length", &c->head_dim)) < 0)
        return rc;
    if (rc == 1 && c->n_head && c->n_embd % c->n_head)
        return kvp_err_set(err, KVP_EFORMAT, "%s: metadata %s.attention.key_length: missing, and %u is not a multiple "
                           "of %u heads", src, c->arch, c->n_embd, c->n_head);
    if ((rc = read_rope(&x, c)) < 0 || (rc = read_moe_mla(&x, c)) < 0 || (rc = read_vocab(&x, c)) < 0)
        return rc;
    if (c->rope_dim == 0)
        c->rope_dim = c->head_dim;
    if (c->sliding_window && !c->sliding_period && strcmp(c->arch, "gemma2") == 0)
        c->sliding_period = 2; /* llama.cpp hard-codes Gemma-2's alternation */
    if ((rc = get_bool(&x, "kvpipe.tied_embeddings", &c->tied_embeddings)) < 0)
        return rc;
    c->attn_bias = strcmp(c->arch, "qwen2") == 0;
    if ((rc = get_bool(&x, "kvpipe.attn_bias", &c->attn_bias)) < 0 ||
        (rc = get_float(&x, "kvpipe.n_params", &c->n_params)) < 0)
        return rc;
    char eps_key[160], base_key[160];
    snprintf(eps_key, sizeof eps_key, "metadata %s.attention.layer_norm_rms_epsilon", c->arch);
    snprintf(base_key, sizeof base_key, "metadata %s.rope.freq_base", c->arch);
    if ((rc = kvp_config_check_reals(c, src, eps_key, base_key, err)) < 0)
        return rc;
    return check_shape(&x, c);
}

/* ---- the inverse ---- */

static int put_u(kvp_meta *m, const char *arch, const char *suffix, uint64_t v)
{
    char key[160];
    snprintf(key, sizeof key, "%s%s", arch, suffix);
    return kvp_meta_set_u64(m, key, v);
}

static int put_f(kvp_meta *m, const char *arch, const char *suffix, double v)
{
    char key[160];
    snprintf(key, sizeof key, "%s%s", arch, suffix);
    return kvp_meta_set_f64(m, key, v);
}

int kvp_config_to_meta(const kvp_config *c, kvp_meta *m)
{
    const char *a = c->arch;
    if (!a[0])
        return KVP_EINVAL;
    int rc = kvp_meta_set_str(m, "general.architecture", a, strlen(a));
    if (!rc && c->name[0])
        rc = kvp_meta_set_str(m, "general.name", c->name, strlen(c->name));
    rc = rc ? rc : put_u(m, a, ".block_count", c->n_layer);
    rc = rc ? rc : put_u(m, a, ".embedding_length", c->n_embd);
    rc = rc ? rc : put_u(m, a, ".feed_forward_length", c->n_ff);
    rc = rc ? rc : put_u(m, a, ".attention.head_count", c->n_head);
    rc = rc ? rc : put_u(m, a, ".attention.head_count_kv", c->n_head_kv);
    rc = rc ? rc : put_u(m, a, ".attention.key_length", c->head_dim);
    rc = rc ? rc : put_u(m, a, ".attention.value_length", c->head_dim);
    rc = rc ? rc : put_u(m, a, ".vocab_size", c->n_vocab);
    rc = rc ? rc : put_u(m, a, ".context_length", c->n_ctx);
    rc = rc ? rc : put_f(m, a, ".rope.freq_base", c->rope_theta);
    rc = rc ? rc : put_f(m, a, ".attention.layer_norm_rms_epsilon", c->rms_eps);
    rc = rc ? rc : put_u(m, a, ".rope.dimension_count", c->kv_lora_rank ? c->rope_head_dim_mla : c->rope_dim);
    if (!rc) {
        const char *rt = c->rope_type == KVP_ROPE_NEOX ? "neox" : "norm";
        rc = kvp_meta_set_str(m, "kvpipe.rope_type", rt, 4);
    }
    if (!rc && c->rope_scaling != KVP_ROPE_SCALING_NONE) {
        /* another scaling (yarn, ...) is written by its name, which a reader
         * that runs the model refuses rather than rotating without it */
        const char *st = c->rope_scaling == KVP_ROPE_SCALING_LLAMA3   ? "llama3"
                         : c->rope_scaling == KVP_ROPE_SCALING_LINEAR ? "linear"
                                                                      : c->rope_scaling_name;
        char key[160];
        snprintf(key, sizeof key, "%s.rope.scaling.type", a);
        rc = kvp_meta_set_str(m, key, st, strlen(st));
        rc = rc ? rc : put_f(m, a, ".rope.scaling.factor", c->rope_factor);
        rc = rc ? rc : put_u(m, a, ".rope.scaling.original_context_length", c->rope_orig_ctx);
        if (!rc && c->rope_scaling == KVP_ROPE_SCALING_LLAMA3) {
            rc = put_f(m, a, ".rope.scaling.low_freq_factor", c->rope_low_freq_factor);
            rc = rc ? rc : put_f(m, a, ".rope.scaling.high_freq_factor", c->rope_high_freq_factor);
        }
    }
    if (!rc && c->hidden_act[0]) /* another activation than SiLU, by its name: a loader refuses it */
        rc = kvp_meta_set_str(m, "kvpipe.hidden_act", c->hidden_act, strlen(c->hidden_act));
    if (!rc && c->sliding_window) {
        rc = put_u(m, a, ".attention.sliding_window", c->sliding_window);
        rc = rc ? rc : put_u(m, a, ".attention.sliding_window_pattern", c->sliding_period);
    }
    if (!rc && c->n_expert) {
        rc = put_u(m, a, ".expert_count", c->n_expert);
        rc = rc ? rc : put_u(m, a, ".expert_used_count", c->n_expert_used);
        rc = rc ? rc : put_u(m, a, ".expert_feed_forward_length", c->n_ff_expert);
        rc = rc ? rc : put_u(m, a, ".expert_shared_count", c->n_expert_shared);
        rc = rc ? rc : put_u(m, a, ".leading_dense_block_count", c->n_layer_dense);
    }
    if (!rc && c->kv_lora_rank)
        rc = put_u(m, a, ".attention.kv_lora_rank", c->kv_lora_rank);
    rc = rc ? rc : kvp_meta_set_bool(m, "kvpipe.tied_embeddings", c->tied_embeddings);
    rc = rc ? rc : kvp_meta_set_bool(m, "kvpipe.attn_bias", c->attn_bias);
    if (!rc && c->n_params > 0)
        rc = kvp_meta_set_f64(m, "kvpipe.n_params", c->n_params);
    return rc;
}

uint64_t kvp_config_kv_elems_per_token_layer(const kvp_config *c)
{
    if (c->kv_lora_rank)
        return (uint64_t)c->kv_lora_rank + c->rope_head_dim_mla;
    return 2ull * c->n_head_kv * c->head_dim;
}

/* ---- the checks every model passes ---- */

int kvp_config_check_reals(const kvp_config *c, const char *source, const char *eps_key, const char *base_key,
                           kvp_err *err)
{
    const char *src = source ? source : "?";
    if (!(isfinite(c->rms_eps) && c->rms_eps > 0 && c->rms_eps < 1))
        return kvp_err_set(err, KVP_EFORMAT, "%s: %s: %g is out of range (want a finite number in (0, 1))", src,
                           eps_key, c->rms_eps);
    if (!(isfinite(c->rope_theta) && c->rope_theta > 1))
        return kvp_err_set(err, KVP_EFORMAT, "%s: %s: %g is out of range (want a finite number above 1)", src,
                           base_key, c->rope_theta);
    return 0;
}

/* MLA's sizes, within the ranges the planner (lib/plan) takes too, so a
 * file kvcalc refuses does not load either.  Its RoPE key is exempt from the
 * head dim (kvp_config_check_shape), so it has a ceiling of its own. */
static int check_mla(const kvp_config *c, const char *src, kvp_err *err)
{
    if (c->kv_lora_rank > KVP_CONFIG_MAX_LORA_RANK)
        return kvp_err_set(err, KVP_ELIMIT, "%s: config: %u MLA latent rank (kv_lora_rank; want 0..%u)", src,
                           c->kv_lora_rank, KVP_CONFIG_MAX_LORA_RANK);
    if (!c->kv_lora_rank)
        return 0;
    uint32_t rope = c->rope_head_dim_mla > c->rope_dim ? c->rope_head_dim_mla : c->rope_dim;
    if (rope > KVP_CONFIG_MAX_ROPE_DIM_MLA)
        return kvp_err_set(err, KVP_ELIMIT, "%s: config: %u MLA RoPE key dims (rope dimension; want 0..%u)", src,
                           rope, KVP_CONFIG_MAX_ROPE_DIM_MLA);
    return 0;
}

int kvp_config_check(const kvp_config *c, const char *source, kvp_err *err)
{
    const char *src = source ? source : "?";
    uint32_t ff = c->n_ff ? c->n_ff : c->n_expert ? c->n_ff_expert : 0;
    const struct {
        uint32_t v, max;
        const char *what;
    } dim[] = {
        {c->n_layer, KVP_CONFIG_MAX_LAYER, "layers"},
        {c->n_embd, KVP_CONFIG_MAX_EMBD, "embedding width"},
        {ff, KVP_CONFIG_MAX_FF, "feed-forward width"},
        {c->n_head, KVP_CONFIG_MAX_HEAD, "attention heads"},
        {c->n_head_kv, KVP_CONFIG_MAX_HEAD, "KV heads"},
        {c->head_dim, KVP_CONFIG_MAX_HEAD_DIM, "head dim"},
        {c->n_vocab, KVP_CONFIG_MAX_VOCAB, "vocabulary"},
    };
    for (size_t i = 0; i < sizeof dim / sizeof dim[0]; i++)
        if (dim[i].v == 0 || dim[i].v > dim[i].max)
            return kvp_err_set(err, dim[i].v ? KVP_ELIMIT : KVP_EFORMAT, "%s: config: %u %s (want 1..%u)", src,
                               dim[i].v, dim[i].what, dim[i].max);
    if (c->n_ff_expert > KVP_CONFIG_MAX_FF)
        return kvp_err_set(err, KVP_ELIMIT, "%s: config: %u expert feed-forward width (want 0..%u)", src,
                           c->n_ff_expert, KVP_CONFIG_MAX_FF);
    if (c->n_expert > KVP_CONFIG_MAX_EXPERT)
        return kvp_err_set(err, KVP_ELIMIT, "%s: config: %u experts (want 0..%u)", src, c->n_expert,
                           KVP_CONFIG_MAX_EXPERT);
    int rc = check_mla(c, src, err);
    return rc ? rc : kvp_config_check_shape(c, source, err);
}

uint32_t kvp_config_ctx_limit(const kvp_config *c)
{
    if (c->sliding_window && (!c->n_ctx || c->sliding_window < c->n_ctx))
        return c->sliding_window;
    return c->n_ctx;
}

int kvp_config_check_shape(const kvp_config *c, const char *source, kvp_err *err)
{
    const char *src = source ? source : "?";
    if (!c->head_dim && c->n_head && c->n_embd % c->n_head)
        return kvp_err_set(err, KVP_EFORMAT, "%s: config: hidden size %u is not a multiple of %u heads (and no head "
                           "dim is given)", src, c->n_embd, c->n_head);
    uint32_t hd = c->head_dim ? c->head_dim : c->n_head ? c->n_embd / c->n_head : 0;
    if (!c->head_dim && hd > KVP_CONFIG_MAX_HEAD_DIM) /* a given head dim has a range of its own */
        return kvp_err_set(err, KVP_ELIMIT, "%s: config: hidden size %u over %u heads is a head dim of %u (want "
                           "1..%u)", src, c->n_embd, c->n_head, hd, KVP_CONFIG_MAX_HEAD_DIM);
    if (c->n_head_kv && c->n_head % c->n_head_kv)
        return kvp_err_set(err, KVP_EFORMAT, "%s: config: %u heads are not a multiple of %u KV heads", src, c->n_head,
                           c->n_head_kv);
    if (c->n_expert_used > c->n_expert)
        return kvp_err_set(err, KVP_EFORMAT, "%s: config: %u experts used a token, more than the %u experts", src,
                           c->n_expert_used, c->n_expert);
    /* a mixture whose tokens go to none of its experts has no feed-forward
     * at all (the planner counted one expert for its weights, none for its
     * activations) */
    if (c->n_expert && !c->n_expert_used)
        return kvp_err_set(err, KVP_EFORMAT, "%s: config: %u experts, but none used a token", src, c->n_expert);
    if (c->rope_dim % 2 || (c->rope_dim > hd && !c->kv_lora_rank))
        return kvp_err_set(err, KVP_EFORMAT, "%s: config: rope dimension %u with head dim %u", src, c->rope_dim, hd);
    return 0;
}
