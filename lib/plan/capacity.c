/* capacity.c - the memory model behind kvcalc.
 *
 * Weights are counted tensor by tensor from the model's shape, each in its
 * storage format and each split (or replicated) the way tensor parallelism
 * splits it; layers go to pipeline stages in balanced contiguous ranges.  KV
 * is counted per layer, with windows for sliding layers and whole blocks for
 * paged allocation.  kvcalc(1) "MEMORY MODEL" describes the same rules.
 */
#include "capacity.h"

#include "shard.h"
#include "tensor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- formats ---- */

static uint64_t div_up(uint64_t a, uint64_t b) { return b ? (a + b - 1) / b : 0; }

static void fmt_set(kvp_cap_fmt *f, const char *name, uint32_t be, uint32_t bb, uint32_t scale, uint32_t sb,
                    uint32_t group)
{
    memset(f, 0, sizeof *f);
    snprintf(f->name, sizeof f->name, "%s", name);
    f->block_elems = be;
    f->block_bytes = bb;
    f->scale = scale;
    f->scale_bytes = sb;
    f->group = group;
}

/* GGUF block types: from the dtype table where it has them, else FACTS.md's
 * k-quant sizes (256-element super-blocks). */
static int fmt_gguf(const char *name, kvp_cap_fmt *f)
{
    static const struct { const char *name; uint32_t bytes; } kquants[] = {
        {"q2_k", 84}, {"q3_k", 110}, {"q4_k", 144}, {"q5_k", 176}, {"q6_k", 210},
    };
    int t = kvp_dtype_from_name(name);
    const kvp_dtype_traits *tr = t >= 0 ? kvp_dtype_get((uint32_t)t) : NULL;
    if (tr && tr->is_quantized && name[0] != 'n' && name[0] != 'm' && name[0] != 'N' && name[0] != 'M') {
        fmt_set(f, tr->name, (uint32_t)tr->block_size, (uint32_t)tr->block_bytes, KVP_CAP_SCALE_NONE, 0, 0);
        return 0;
    }
    for (size_t i = 0; i < sizeof kquants / sizeof kquants[0]; i++)
        if (strcasecmp(kquants[i].name, name) == 0) {
            fmt_set(f, kquants[i].name, 256, kquants[i].bytes, KVP_CAP_SCALE_NONE, 0, 0);
            return 0;
        }
    return -1;
}

/* f32 / f16 / bf16 under any of their spellings. */
static int fmt_plain_float(const char *name, kvp_cap_fmt *f)
{
    int t = kvp_dtype_from_name(name);
    if (t == KVP_DTYPE_F32)
        fmt_set(f, "f32", 1, 4, KVP_CAP_SCALE_NONE, 0, 0);
    else if (t == KVP_DTYPE_F16)
        fmt_set(f, "f16", 1, 2, KVP_CAP_SCALE_NONE, 0, 0);
    else if (t == KVP_DTYPE_BF16)
        fmt_set(f, "bf16", 1, 2, KVP_CAP_SCALE_NONE, 0, 0);
    else
        return -1;
    return 0;
}

static int is_fp8(const char *name, int *e5m2)
{
    int t = kvp_dtype_from_name(name);
    *e5m2 = t == KVP_DTYPE_FP8_E5M2;
    return t == KVP_DTYPE_FP8_E4M3 || t == KVP_DTYPE_FP8_E5M2;
}

int kvp_cap_weight_fmt(const char *name, kvp_cap_fmt *f, kvp_err *err)
{
    int e5m2;
    unsigned g;
    char tail;
    if (fmt_plain_float(name, f) == 0)
        return 0;
    if (is_fp8(name, &e5m2)) {
        fmt_set(f, e5m2 ? "fp8-e5m2" : "fp8", 1, 1, KVP_CAP_SCALE_TENSOR, 4, 0);
        return 0;
    }
    if (strcasecmp(name, "int8") == 0 || strcasecmp(name, "i8") == 0) {
        fmt_set(f, "int8", 1, 1, KVP_CAP_SCALE_ROW, 4, 0);
        return 0;
    }
    if (strcasecmp(name, "int4") == 0 || strcasecmp(name, "i4") == 0) {
        fmt_set(f, "int4-g128", 2, 1, KVP_CAP_SCALE_GROUP, 2, 128);
        return 0;
    }
    /* int4 with an f16 scale a group (GPTQ, AWQ); quantize --to fp4's E2M1
     * with an f32 one */
    static const struct {
        const char *prefix;
        uint32_t scale_bytes;
    } grouped[] = {{"int4-g", 2}, {"fp4-g", 4}};
    for (size_t i = 0; i < sizeof grouped / sizeof grouped[0]; i++) {
        /* any case, as every other name (INT4-G64 as Q4_K); N in digits */
        size_t n = strlen(grouped[i].prefix);
        if (strncasecmp(name, grouped[i].prefix, n) != 0) /* first: a shorter name ends before name + n */
            continue;
        size_t nd = strspn(name + n, "0123456789");
        if (nd >= 1 && nd <= 5 && !name[n + nd] &&
            sscanf(name + n, "%u%c", &g, &tail) == 1 && g >= 2 && g <= 65536 && g % 2 == 0) {
            char buf[24];
            snprintf(buf, sizeof buf, "%s%u", grouped[i].prefix, g);
            fmt_set(f, buf, 2, 1, KVP_CAP_SCALE_GROUP, grouped[i].scale_bytes, g);
            return 0;
        }
    }
    if (strcasecmp(name, "nvfp4") == 0 || strcasecmp(name, "fp4") == 0) {
        fmt_set(f, "nvfp4", 16, 9, KVP_CAP_SCALE_TENSOR, 4, 0);
        return 0;
    }
    if (strcasecmp(name, "mxfp4") == 0) {
        fmt_set(f, "mxfp4", 32, 17, KVP_CAP_SCALE_NONE, 0, 0);
        return 0;
    }
    if (fmt_gguf(name, f) == 0)
        return 0;
    return kvp_err_set(err, KVP_EINVAL,
                       "unknown weight format '%s' (f32 f16 bf16 fp8 fp8-e5m2 int8 int4 int4-gN fp4-gN nvfp4 mxfp4 "
                       "q4_0 q4_1 q5_0 q5_1 q8_0 q2_k q3_k q4_k q5_k q6_k)",
                       name);
}

int kvp_cap_kv_fmt(const char *name, kvp_cap_fmt *f, kvp_err *err)
{
    int e5m2;
    if (fmt_plain_float(name, f) == 0)
        return 0;
    if (is_fp8(name, &e5m2)) {
        /* E4M3 as kvpipe's cache holds it: one f32 scale per head per token,
         * like int8 (vLLM's fp8 cache keeps one per layer instead: 3% less
         * for a 128-wide head) */
        if (e5m2)
            fmt_set(f, "fp8-e5m2", 1, 1, KVP_CAP_SCALE_NONE, 0, 0);
        else
            fmt_set(f, "fp8", 1, 1, KVP_CAP_SCALE_TOKEN, 4, 0);
        return 0;
    }
    if (strcasecmp(name, "int8") == 0 || strcasecmp(name, "i8") == 0) {
        fmt_set(f, "int8", 1, 1, KVP_CAP_SCALE_TOKEN, 4, 0);
        return 0;
    }
    if (strcasecmp(name, "int4") == 0 || strcasecmp(name, "i4") == 0) {
        fmt_set(f, "int4", 2, 1, KVP_CAP_SCALE_BLOCK, 4, 0);
        return 0;
    }
    if (strcasecmp(name, "fp4") == 0 || strcasecmp(name, "nvfp4") == 0) {
        fmt_set(f, "fp4", 16, 9, KVP_CAP_SCALE_NONE, 0, 0);
        return 0;
    }
    return kvp_err_set(err, KVP_EINVAL, "unknown KV format '%s' (f32 f16 bf16 fp8 fp8-e5m2 int8 int4 fp4)", name);
}

uint64_t kvp_cap_fmt_bytes(const kvp_cap_fmt *f, uint64_t rows, uint64_t cols)
{
    if (rows == 0 || cols == 0)
        return 0;
    uint64_t bytes = rows * div_up(cols, f->block_elems) * f->block_bytes;
    switch (f->scale) {
    case KVP_CAP_SCALE_TENSOR: bytes += f->scale_bytes; break;
    case KVP_CAP_SCALE_ROW: bytes += rows * f->scale_bytes; break;
    case KVP_CAP_SCALE_GROUP: bytes += rows * div_up(cols, f->group) * f->scale_bytes; break;
    default: break;
    }
    return bytes;
}

int kvp_cap_fmt_is_float(const kvp_cap_fmt *f)
{
    return f->scale == KVP_CAP_SCALE_NONE && f->block_elems == 1 && f->block_bytes >= 2;
}

void kvp_cap_params_init(kvp_cap_params *p)
{
    memset(p, 0, sizeof *p);
    fmt_set(&p->weight_fmt, "f16", 1, 2, KVP_CAP_SCALE_NONE, 0, 0);
    p->embed_fmt = p->weight_fmt;
    p->kv_fmt = p->weight_fmt;
    p->gpu_util = 0.9;
    p->gpus = p->tp = p->pp = 1;
    p->block_size = 16;
    p->max_batched_tokens = 8192;
    p->overhead_bytes = 1ull << 30;
    p->seq_len = 4096;
    p->batch = 1;
}

/* ---- layers ---- */

int kvp_cap_layer_is_sliding(const kvp_config *c, uint32_t i)
{
    if (!c->sliding_window)
        return 0;
    if (c->sliding_period <= 1)
        return 1;
    return i % c->sliding_period != c->sliding_period - 1;
}

uint64_t kvp_cap_layer_blocks(uint64_t len, uint32_t bs, uint32_t window)
{
    if (len == 0 || bs == 0)
        return 0;
    if (!window || len <= window)
        return div_up(len, bs);
    /* tokens [len - window, len) live in blocks first..last */
    return (len - 1) / bs - (len - window) / bs + 1;
}

/* Tokens a layer holds (exact, no blocks). */
static uint64_t layer_tokens(uint64_t len, uint32_t window) { return window && len > window ? window : len; }

static uint32_t head_dim_of(const kvp_config *c) { return c->head_dim ? c->head_dim : c->n_embd / c->n_head; }

static int is_mla(const kvp_config *c) { return c->kv_lora_rank > 0; }

/* Layers [begin, end) of stage s among pp: decode's split (shard.h), so
 * the stage planned is the stage that runs. */
static void stage_range(uint32_t n_layer, uint32_t pp, uint32_t s, uint32_t *begin, uint32_t *end)
{
    *begin = kvp_shard_first_layer(n_layer, s, pp);
    *end = kvp_shard_first_layer(n_layer, s + 1, pp);
}

/* ---- weights: walk every tensor once ---- */

typedef struct walk {
    const kvp_cap_params *p;
    uint32_t tp;
    uint64_t params, active;
    uint64_t bytes;                       /* whole model, unsplit */
    uint64_t stage_bytes[KVP_CAP_MAX_PP]; /* per GPU of each stage */
    int cls;                              /* what add() is walking (KVP_CAP_W_*) */
    uint64_t cls_bytes[KVP_CAP_W_CLASSES]; /* bytes by class, whole model */
    uint64_t stage_cls[KVP_CAP_MAX_PP][KVP_CAP_W_CLASSES]; /* stage_bytes by class */
    uint64_t stage_expert_bytes[KVP_CAP_MAX_PP]; /* routed experts, per GPU (read only when chosen) */
} walk;

/* count tensors of rows x cols (params), active of them used per token;
 * rows_gpu x cols_gpu the shard one GPU of `stage` holds. */
static void add(walk *w, int stage, const kvp_cap_fmt *f, uint64_t rows, uint64_t cols, uint64_t rows_gpu,
                uint64_t cols_gpu, uint64_t count, uint64_t active, int expert)
{
    w->params += rows * cols * count;
    w->active += rows * cols * active;
    w->bytes += kvp_cap_fmt_bytes(f, rows, cols) * count;
    int k = rows == 1 ? KVP_CAP_W_VECTORS : w->cls; /* norms, biases: a file's 1-D tensors */
    w->cls_bytes[k] += kvp_cap_fmt_bytes(f, rows, cols) * count;
    if (stage >= 0) {
        uint64_t b = kvp_cap_fmt_bytes(f, rows_gpu, cols_gpu) * count;
        w->stage_bytes[stage] += b;
        w->stage_cls[stage][k] += b;
        if (expert)
            w->stage_expert_bytes[stage] += b;
    }
}

/* Column-parallel (output rows split), row-parallel (input split), replicated. */
static void add_col(walk *w, int st, const kvp_cap_fmt *f, uint64_t rows, uint64_t cols, uint64_t n, uint64_t a)
{
    add(w, st, f, rows, cols, div_up(rows, w->tp), cols, n, a, 0);
}
static void add_row(walk *w, int st, const kvp_cap_fmt *f, uint64_t rows, uint64_t cols, uint64_t n, uint64_t a)
{
    add(w, st, f, rows, cols, rows, div_up(cols, w->tp), n, a, 0);
}
static void add_rep(walk *w, int st, const kvp_cap_fmt *f, uint64_t rows, uint64_t cols, uint64_t n, uint64_t a)
{
    add(w, st, f, rows, cols, rows, cols, n, a, 0);
}

/* KV heads on one GPU: split by TP, one head replicated when tp > heads
 * (check_params lets through only a tp that divides them or that they
 * divide, as decode's shards). */
static uint32_t kv_heads_gpu(uint32_t n_kv, uint32_t tp)
{
    return n_kv >= tp ? (uint32_t)div_up(n_kv, tp) : 1;
}

static void walk_attention(walk *w, int st)
{
    const kvp_config *c = &w->p->cfg;
    const kvp_cap_fmt *f = &w->p->weight_fmt, *sm = &w->p->embed_fmt;
    uint64_t e = c->n_embd, hd = head_dim_of(c), nh = c->n_head;
    if (is_mla(c)) {
        /* DeepSeek-V2/V3: q through an optional low-rank, K/V through a
         * latent of kv_lora_rank plus a shared rope key.  head_dim is the
         * query/key head (nope + rope, 192), as GGUF key_length and HF give
         * it; the value head is taken equal to the nope part (128). */
        uint64_t rope = c->rope_head_dim_mla, q_lora = w->p->q_lora_rank, lat = c->kv_lora_rank;
        uint64_t nope = hd > rope ? hd - rope : hd, v = nope;
        if (q_lora) {
            add_rep(w, st, f, q_lora, e, 1, 1);
            add_rep(w, st, sm, 1, q_lora, 1, 1); /* q_a_norm */
            add_col(w, st, f, nh * (nope + rope), q_lora, 1, 1);
        } else {
            add_col(w, st, f, nh * (nope + rope), e, 1, 1);
        }
        add_rep(w, st, f, lat + rope, e, 1, 1);
        add_rep(w, st, sm, 1, lat, 1, 1); /* kv_a_norm */
        add_col(w, st, f, nh * (nope + v), lat, 1, 1);
        add_row(w, st, f, e, nh * v, 1, 1);
        return;
    }
    uint64_t nkv = c->n_head_kv, kv_gpu = kv_heads_gpu(c->n_head_kv, w->tp);
    add_col(w, st, f, nh * hd, e, 1, 1);
    add(w, st, f, nkv * hd, e, kv_gpu * hd, e, 2, 2, 0); /* k, v */
    add_row(w, st, f, e, nh * hd, 1, 1);
    if (c->attn_bias) { /* one row each, split with the heads they add to, as decode's shards cut them */
        add(w, st, sm, 1, nh * hd, 1, div_up(nh, w->tp) * hd, 1, 1, 0);
        add(w, st, sm, 1, nkv * hd, 1, kv_gpu * hd, 2, 2, 0);
    }
}

static void walk_ffn(walk *w, int st, uint32_t layer)
{
    const kvp_config *c = &w->p->cfg;
    const kvp_cap_fmt *f = &w->p->weight_fmt, *sm = &w->p->embed_fmt;
    uint64_t e = c->n_embd;
    if (!c->n_expert || layer < c->n_layer_dense) {
        add_col(w, st, f, c->n_ff, e, 2, 2); /* gate, up */
        add_row(w, st, f, e, c->n_ff, 1, 1); /* down */
        return;
    }
    uint64_t ff = c->n_ff_expert ? c->n_ff_expert : c->n_ff;
    uint64_t ne = c->n_expert, used = c->n_expert_used ? c->n_expert_used : 1;
    /* routed experts: every expert split by TP (vLLM's default for MoE) */
    add(w, st, f, ff, e, div_up(ff, w->tp), e, 2 * ne, 2 * used, 1);
    add(w, st, f, e, ff, e, div_up(ff, w->tp), ne, used, 1);
    if (c->n_expert_shared) {
        add_col(w, st, f, ff, e, 2 * c->n_expert_shared, 2 * c->n_expert_shared);
        add_row(w, st, f, e, ff, c->n_expert_shared, c->n_expert_shared);
    }
    add_rep(w, st, sm, ne, e, 1, 1); /* router */
}

static void walk_model(walk *w)
{
    const kvp_config *c = &w->p->cfg;
    const kvp_cap_fmt *sm = &w->p->embed_fmt;
    uint32_t pp = w->p->pp ? w->p->pp : 1;
    uint32_t norms = strcmp(c->arch, "gemma2") == 0 ? 4 : 2; /* Gemma-2 norms before and after each block */
    w->cls = KVP_CAP_W_LAYERS;
    for (uint32_t s = 0; s < pp; s++) {
        uint32_t b, e;
        stage_range(c->n_layer, pp, s, &b, &e);
        for (uint32_t l = b; l < e; l++) {
            walk_attention(w, (int)s);
            walk_ffn(w, (int)s, l);
            add_rep(w, (int)s, sm, 1, c->n_embd, norms, norms);
        }
    }
    /* token embeddings: vocab-parallel on the first stage (counted as
     * active, as published "active parameter" figures do) */
    w->cls = KVP_CAP_W_EMBD;
    add(w, 0, sm, c->n_vocab, c->n_embd, div_up(c->n_vocab, w->tp), c->n_embd, 1, 1, 0);
    int last = (int)pp - 1;
    w->cls = KVP_CAP_W_REST;
    add_rep(w, last, sm, 1, c->n_embd, 1, 1); /* output norm */
    w->cls = KVP_CAP_W_OUT;
    if (!c->tied_embeddings)
        add_col(w, last, sm, c->n_vocab, c->n_embd, 1, 1);
    else if (pp > 1) { /* the last stage keeps its own copy of the tied table: the table's bytes */
        uint64_t copy = kvp_cap_fmt_bytes(sm, div_up(c->n_vocab, w->tp), c->n_embd);
        w->stage_bytes[last] += copy;
        w->stage_cls[last][KVP_CAP_W_EMBD] += copy;
    }
}

/* The scale from the walk's bytes of class k to a file's (0: none) */
static double class_scale(const walk *w, const kvp_cap_params *p, int k)
{
    return w->cls_bytes[k] ? (double)p->weight_class_bytes[k] / (double)w->cls_bytes[k] : 0;
}

/* Whether p carries a file's bytes by class that add up to its total,
 * each class the walk has and only those (a file whose tensors have other
 * names scales every tensor alike, as before). */
static int have_class_bytes(const walk *w, const kvp_cap_params *p)
{
    uint64_t sum = 0;
    for (int k = 0; k < KVP_CAP_W_CLASSES; k++) {
        sum += p->weight_class_bytes[k];
        if ((p->weight_class_bytes[k] > 0) != (w->cls_bytes[k] > 0))
            return 0;
    }
    return p->weight_bytes_override && sum == p->weight_bytes_override;
}

void kvp_cap_param_count(const kvp_config *c, uint32_t q_lora_rank, uint64_t *total, uint64_t *active)
{
    kvp_cap_params p;
    kvp_cap_params_init(&p);
    p.cfg = *c;
    p.q_lora_rank = q_lora_rank;
    walk w;
    memset(&w, 0, sizeof w);
    w.p = &p;
    w.tp = 1;
    if (c->n_layer && c->n_head)
        walk_model(&w);
    if (total)
        *total = w.params;
    if (active)
        *active = w.active;
}

/* ---- checks ---- */

static int check_params(const kvp_cap_params *p, kvp_err *err)
{
    /* the loader's ceilings (config.h): no plan for a shape no file can have */
    const kvp_config *c = &p->cfg;
    if (c->n_layer == 0 || c->n_layer > KVP_CONFIG_MAX_LAYER)
        return kvp_err_set(err, KVP_EINVAL, "layers: %u is out of range (1..%u)", c->n_layer, KVP_CONFIG_MAX_LAYER);
    if (c->n_embd == 0 || c->n_embd > KVP_CONFIG_MAX_EMBD)
        return kvp_err_set(err, KVP_EINVAL, "hidden: %u is out of range (1..%u)", c->n_embd, KVP_CONFIG_MAX_EMBD);
    if (c->n_head == 0 || c->n_head > KVP_CONFIG_MAX_HEAD)
        return kvp_err_set(err, KVP_EINVAL, "heads: %u is out of range (1..%u)", c->n_head, KVP_CONFIG_MAX_HEAD);
    if (!is_mla(c) && (c->n_head_kv == 0 || c->n_head_kv > KVP_CONFIG_MAX_HEAD))
        return kvp_err_set(err, KVP_EINVAL, "kv-heads: %u is out of range (1..%u)", c->n_head_kv,
                           KVP_CONFIG_MAX_HEAD);
    if (head_dim_of(c) == 0 || head_dim_of(c) > KVP_CONFIG_MAX_HEAD_DIM)
        return kvp_err_set(err, KVP_EINVAL, "head-dim: %u is out of range (1..%u)", head_dim_of(c),
                           KVP_CONFIG_MAX_HEAD_DIM);
    if (c->n_ff > KVP_CONFIG_MAX_FF || c->n_ff_expert > KVP_CONFIG_MAX_FF)
        return kvp_err_set(err, KVP_EINVAL, "ffn: too large (max %u)", KVP_CONFIG_MAX_FF);
    if (c->n_vocab > KVP_CONFIG_MAX_VOCAB)
        return kvp_err_set(err, KVP_EINVAL, "vocab: too large (max %u)", KVP_CONFIG_MAX_VOCAB);
    if (c->n_expert > KVP_CONFIG_MAX_EXPERT)
        return kvp_err_set(err, KVP_EINVAL, "experts: %u is out of range (0..%u)", c->n_expert,
                           KVP_CONFIG_MAX_EXPERT);
    if (c->kv_lora_rank > KVP_CONFIG_MAX_LORA_RANK)
        return kvp_err_set(err, KVP_EINVAL, "kv-lora-rank: %u is out of range (0..%u)", c->kv_lora_rank,
                           KVP_CONFIG_MAX_LORA_RANK);
    if (c->rope_head_dim_mla > KVP_CONFIG_MAX_ROPE_DIM_MLA)
        return kvp_err_set(err, KVP_EINVAL, "rope-head-dim (MLA): %u is out of range (0..%u)", c->rope_head_dim_mla,
                           KVP_CONFIG_MAX_ROPE_DIM_MLA);
    if (p->q_lora_rank > KVP_CONFIG_MAX_LORA_RANK)
        return kvp_err_set(err, KVP_EINVAL, "q-lora-rank: %u is out of range (0..%u)", p->q_lora_rank,
                           KVP_CONFIG_MAX_LORA_RANK);
    if (!(p->gpu_util > 0 && p->gpu_util <= 1))
        return kvp_err_set(err, KVP_EINVAL, "gpu-util: %g is not in (0, 1]", p->gpu_util);
    if (p->tp == 0 || p->tp > 4096)
        return kvp_err_set(err, KVP_EINVAL, "tp: %u is out of range (1..4096)", p->tp);
    /* only the splits decode runs: a plan for one it refuses means nothing */
    kvp_err split = {0};
    if (kvp_shard_check_split_cols(c, p->col_units, p->tp, &split) < 0)
        return kvp_err_set(err, KVP_EINVAL, "tp: %s", split.msg);
    if (p->pp == 0 || p->pp > KVP_CAP_MAX_PP || p->pp > c->n_layer)
        return kvp_err_set(err, KVP_EINVAL, "pp: %u is out of range (1..%u and at most the %u layers)", p->pp,
                           KVP_CAP_MAX_PP, c->n_layer);
    if (p->gpus < p->tp * p->pp || p->gpus % (p->tp * p->pp))
        return kvp_err_set(err, KVP_EINVAL, "gpus: %u is not a multiple of tp x pp = %u", p->gpus,
                           p->tp * p->pp);
    if (p->block_size == 0 || (p->block_size & (p->block_size - 1)) || p->block_size > 65536)
        return kvp_err_set(err, KVP_EINVAL, "block-size: %u is not a power of two in 1..65536", p->block_size);
    if (p->seq_len == 0 || p->seq_len > KVP_CAP_MAX_SEQ_LEN)
        return kvp_err_set(err, KVP_EINVAL, "seq-len: %llu is out of range (1..2^32)",
                           (unsigned long long)p->seq_len);
    if (p->batch == 0 || p->batch > (1ull << 32))
        return kvp_err_set(err, KVP_EINVAL, "batch: %llu is out of range (1..2^32)", (unsigned long long)p->batch);
    if (p->max_batched_tokens > (1ull << 32))
        return kvp_err_set(err, KVP_EINVAL, "max-batched-tokens: too large (max 2^32)");
    if (p->weight_fmt.block_elems == 0 || p->embed_fmt.block_elems == 0 || p->kv_fmt.block_elems == 0)
        return kvp_err_set(err, KVP_EINVAL, "format: not set");
    return 0;
}

/* ---- KV ---- */

typedef struct kvshape {
    uint32_t vectors;     /* per token per layer on this GPU */
    uint32_t elems;       /* per vector */
    uint64_t tok_bytes;   /* per token per layer */
    uint64_t block_bytes; /* per block per layer, scales included */
} kvshape;

static kvshape kv_shape(const kvp_cap_params *p, uint32_t tp)
{
    const kvp_config *c = &p->cfg;
    kvshape k;
    if (is_mla(c)) { /* one latent vector, replicated on every TP rank */
        k.vectors = 1;
        k.elems = c->kv_lora_rank + c->rope_head_dim_mla;
    } else {
        k.vectors = 2 * kv_heads_gpu(c->n_head_kv, tp);
        k.elems = head_dim_of(c);
    }
    k.tok_bytes = (uint64_t)k.vectors * div_up(k.elems, p->kv_fmt.block_elems) * p->kv_fmt.block_bytes;
    if (p->kv_fmt.scale == KVP_CAP_SCALE_TOKEN)
        k.tok_bytes += (uint64_t)k.vectors * p->kv_fmt.scale_bytes;
    k.block_bytes = p->block_size * k.tok_bytes;
    if (p->kv_fmt.scale == KVP_CAP_SCALE_BLOCK)
        k.block_bytes += (uint64_t)k.vectors * p->kv_fmt.scale_bytes;
    return k;
}

/* a * b + c, UINT64_MAX where it passes 64 bits (and so wherever a or c is
 * UINT64_MAX and b is not 0: a saturated term stays saturated) */
static uint64_t sat_muladd(uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t m, r;
    return __builtin_mul_overflow(a, b, &m) || __builtin_add_overflow(m, c, &r) ? UINT64_MAX : r;
}

/* Exact and paged bytes of one sequence over layers [b, e): UINT64_MAX
 * where they pass 64 bits (a sequence that cannot fit, never a wrapped
 * small one). */
static void seq_bytes(const kvp_cap_params *p, const kvshape *k, uint32_t b, uint32_t e, uint64_t len,
                      uint64_t *exact, uint64_t *alloc)
{
    const kvp_config *c = &p->cfg;
    uint64_t n_full = 0, n_slide = 0;
    for (uint32_t l = b; l < e; l++) {
        if (kvp_cap_layer_is_sliding(c, l))
            n_slide++;
        else
            n_full++;
    }
    uint32_t w = c->sliding_window;
    if (exact)
        *exact = sat_muladd(sat_muladd(n_full, len, sat_muladd(n_slide, layer_tokens(len, w), 0)), k->tok_bytes, 0);
    if (alloc)
        *alloc = sat_muladd(sat_muladd(n_full, kvp_cap_layer_blocks(len, p->block_size, 0),
                                       sat_muladd(n_slide, kvp_cap_layer_blocks(len, p->block_size, w), 0)),
                            k->block_bytes, 0);
}

/* Activation allowance for one GPU: the widest per-token intermediates of a
 * prefill chunk in 16-bit, plus f32 logits for up to 256 sampled rows on the
 * last stage. */
static uint64_t activation_bytes(const kvp_cap_params *p, int last)
{
    const kvp_config *c = &p->cfg;
    uint32_t tp = p->tp;
    uint64_t hd = head_dim_of(c);
    uint64_t q = div_up(c->n_head, tp) * hd;
    uint64_t kv = is_mla(c) ? (uint64_t)c->kv_lora_rank + c->rope_head_dim_mla : 2 * kv_heads_gpu(c->n_head_kv, tp) * hd;
    uint64_t ff = div_up(c->n_ff, tp);
    if (c->n_expert) {
        uint64_t ffe = c->n_ff_expert ? c->n_ff_expert : c->n_ff;
        uint64_t moe = div_up(((uint64_t)c->n_expert_used + c->n_expert_shared) * ffe, tp);
        if (moe > ff)
            ff = moe;
    }
    uint64_t width = 2 * (uint64_t)c->n_embd + q + kv + 2 * ff;
    uint64_t bytes = p->max_batched_tokens * width * 2;
    if (last) {
        uint64_t rows = p->max_batched_tokens < 256 ? p->max_batched_tokens : 256;
        bytes += rows * div_up(c->n_vocab, tp) * 4;
    }
    return bytes;
}

/* The most blocks a windowed layer holds for any length 1..len: the
 * blocks the window spans grow to ceil(window / bs) at len = window, then
 * depend only on where the window starts within a block (len - window mod
 * bs), the most when it starts at a block's last token; so what a length
 * holds is not monotone in it (Mistral's 4096 tokens at block 16: 256
 * blocks at 4112, 257 at 4097).  len: any 64-bit count. */
static uint64_t layer_blocks_upto(uint64_t len, uint32_t bs, uint32_t window)
{
    if (!window || len <= window)
        return kvp_cap_layer_blocks(len, bs, window);
    uint64_t r = len - window < bs - 1 ? len - window : bs - 1; /* the latest start within a block */
    uint64_t most = (r + window - 1) / bs + 1;
    uint64_t at_window = div_up(window, bs);
    return most > at_window ? most : at_window;
}

/* Paged bytes of one sequence on stage st: full_blocks in each of its
 * full-attention layers, slide_blocks in each windowed one (UINT64_MAX past
 * 64 bits). */
static uint64_t stage_alloc(const kvp_cap_stage *st, const kvshape *k, uint64_t full_blocks, uint64_t slide_blocks)
{
    return sat_muladd(sat_muladd(st->n_full, full_blocks, sat_muladd(st->n_sliding, slide_blocks, 0)),
                      k->block_bytes, 0);
}

/* Do `batch` sequences of len tokens fit on every stage?  upto: of every
 * length 1..len (the most any of them holds), else of len itself. */
static int context_fits(const kvp_cap_params *p, const kvp_cap_result *r, const kvshape *k, uint64_t len, int upto)
{
    uint32_t bs = p->block_size, w = p->cfg.sliding_window;
    uint64_t full = kvp_cap_layer_blocks(len, bs, 0);
    uint64_t slide = upto ? layer_blocks_upto(len, bs, w) : kvp_cap_layer_blocks(len, bs, w);
    for (uint32_t s = 0; s < r->n_stages; s++) {
        const kvp_cap_stage *st = &r->stage[s];
        if (st->kv_free_bytes <= 0 || stage_alloc(st, k, full, slide) > (uint64_t)st->kv_free_bytes / p->batch)
            return 0;
    }
    return 1;
}

/* The largest L such that batch sequences of every length 1..L fit: a
 * windowed layer's blocks are not monotone in the length (a longer
 * sequence may fit where a shorter one does not), so not merely the
 * longest that fits.  -1 when every length fits (only windowed layers, at
 * their most blocks: memory stops growing); KVP_CAP_MAX_SEQ_LEN when every
 * length up to it does (more may). */
static int64_t max_context(const kvp_cap_params *p, const kvp_cap_result *r, const kvshape *k)
{
    int windows_only = 1;
    for (uint32_t s = 0; s < r->n_stages; s++)
        windows_only &= r->stage[s].n_full == 0;
    /* a block past the window, a windowed layer holds its most */
    if (windows_only && context_fits(p, r, k, (uint64_t)p->cfg.sliding_window + p->block_size, 1))
        return -1;
    /* the most of 1..len is monotone in len: search it */
    uint64_t lo = 0, hi = KVP_CAP_MAX_SEQ_LEN + 1;
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (context_fits(p, r, k, mid, 1))
            lo = mid;
        else
            hi = mid;
    }
    if (lo == KVP_CAP_MAX_SEQ_LEN)
        return (int64_t)lo;
    uint32_t bs = p->block_size;
    uint64_t w = p->cfg.sliding_window;
    if (!w || lo < w) /* no windowed layer holds fewer blocks than at a shorter length */
        return (int64_t)lo;
    /* lo + 1 holds more than fits at some length up to it: the full
     * layers' blocks at lo + 1 and the windowed layers' most, which recurs
     * every block once past the window.  So a length within a block of
     * lo + 1 does not fit, and the first that does not is lo + 1 or one
     * that holds more than the length before it: where a new block starts
     * (len = 1 mod bs), the first past the window, or where the window's
     * start within its block spans one block more ((len - w) mod bs = r0). */
    uint64_t last = lo + bs < KVP_CAP_MAX_SEQ_LEN ? lo + bs : KVP_CAP_MAX_SEQ_LEN;
    uint64_t r0 = (bs - (w - 1) % bs) % bs, past = lo + 1 > w + 1 ? lo + 1 : w + 1;
    uint64_t at[4] = {lo + 1, lo + 1 + (bs - lo % bs) % bs, w + 1, past + (r0 + bs - (past - w) % bs) % bs};
    uint64_t first = UINT64_MAX;
    for (int i = 0; i < 4; i++)
        if (at[i] > lo && at[i] <= last && at[i] < first && !context_fits(p, r, k, at[i], 0))
            first = at[i];
    return first == UINT64_MAX ? (int64_t)last : (int64_t)first - 1;
}

static double experts_touched(const kvp_config *c, uint64_t batch)
{
    /* expected distinct experts chosen by batch tokens, each picking top-k of E */
    double e = c->n_expert, k = c->n_expert_used ? c->n_expert_used : 1;
    return e * (1.0 - pow(1.0 - k / e, (double)batch));
}

int kvp_cap_compute(const kvp_cap_params *p, kvp_cap_result *r, kvp_err *err)
{
    int rc = check_params(p, err);
    if (rc)
        return rc;
    memset(r, 0, sizeof *r);
    const kvp_config *c = &p->cfg;

    walk w;
    memset(&w, 0, sizeof w);
    w.p = p;
    w.tp = p->tp;
    walk_model(&w);
    r->n_params = w.params;
    r->n_params_active = w.active;
    r->weight_bytes = w.bytes;
    /* an override (--params, or a file's exact tensor bytes) rescales every shard */
    double scale = 1.0;
    if (p->weight_bytes_override && w.bytes)
        scale = (double)p->weight_bytes_override / (double)w.bytes;
    else if (p->n_params > 0 && w.params)
        scale = p->n_params / (double)w.params;
    if (scale != 1.0) {
        if (p->n_params > 0 && w.params) {
            r->n_params = (uint64_t)llround(p->n_params);
            r->n_params_active = (uint64_t)llround((double)w.active * p->n_params / (double)w.params);
        }
        r->weight_bytes = p->weight_bytes_override ? p->weight_bytes_override : (uint64_t)llround(w.bytes * scale);
        int by_class = have_class_bytes(&w, p);
        for (uint32_t s = 0; s < p->pp; s++) {
            if (by_class) { /* each class at its own file's rate: a stage holds its own tensors' bytes */
                double b = 0;
                for (int k = 0; k < KVP_CAP_W_CLASSES; k++)
                    b += (double)w.stage_cls[s][k] * class_scale(&w, p, k);
                w.stage_bytes[s] = (uint64_t)llround(b);
            } else {
                w.stage_bytes[s] = (uint64_t)llround((double)w.stage_bytes[s] * scale);
            }
            w.stage_expert_bytes[s] = (uint64_t)llround((double)w.stage_expert_bytes[s] *
                                                        (by_class ? class_scale(&w, p, KVP_CAP_W_LAYERS) : scale));
        }
    }

    kvshape whole = kv_shape(p, 1), gpu = kv_shape(p, p->tp);
    r->kv_vectors_per_layer = whole.vectors;
    r->kv_vector_elems = whole.elems;
    r->kv_heads_per_gpu = is_mla(c) ? 1 : gpu.vectors / 2;
    r->kv_bytes_per_token = whole.tok_bytes * c->n_layer;
    seq_bytes(p, &whole, 0, c->n_layer, p->seq_len, &r->kv_bytes_per_seq, &r->kv_alloc_bytes_per_seq);
    if (r->kv_alloc_bytes_per_seq == UINT64_MAX)
        return kvp_err_set(err, KVP_EINVAL, "seq-len: one sequence's KV bytes overflow 64 bits");
    if (r->kv_alloc_bytes_per_seq && p->batch > UINT64_MAX / r->kv_alloc_bytes_per_seq)
        return kvp_err_set(err, KVP_EINVAL, "batch x seq-len: the KV bytes overflow 64 bits");
    r->kv_bytes = r->kv_bytes_per_seq * p->batch;
    r->kv_alloc_bytes = r->kv_alloc_bytes_per_seq * p->batch;
    r->kv_waste_bytes_per_seq = r->kv_alloc_bytes_per_seq - r->kv_bytes_per_seq;

    r->usable_bytes = (uint64_t)((double)p->gpu_mem_bytes * p->gpu_util);
    r->n_stages = p->pp;
    r->replicas = p->gpus / (p->tp * p->pp);
    r->max_seqs = UINT64_MAX;
    double step_seconds = 0;
    for (uint32_t s = 0; s < p->pp; s++) {
        kvp_cap_stage *st = &r->stage[s];
        stage_range(c->n_layer, p->pp, s, &st->layer_begin, &st->layer_end);
        for (uint32_t l = st->layer_begin; l < st->layer_end; l++) {
            if (kvp_cap_layer_is_sliding(c, l))
                st->n_sliding++;
            else
                st->n_full++;
        }
        uint32_t nl = st->layer_end - st->layer_begin;
        st->weight_bytes = w.stage_bytes[s];
        st->activation_bytes = activation_bytes(p, s == p->pp - 1);
        st->kv_bytes_per_token = gpu.tok_bytes * nl;
        st->block_bytes = gpu.block_bytes * nl;
        uint64_t exact;
        seq_bytes(p, &gpu, st->layer_begin, st->layer_end, p->seq_len, &exact, &st->kv_alloc_bytes_per_seq);
        st->kv_free_bytes = (int64_t)r->usable_bytes - (int64_t)st->weight_bytes - (int64_t)p->overhead_bytes -
                            (int64_t)st->activation_bytes;
        if (st->kv_free_bytes > 0) {
            st->n_blocks = (uint64_t)st->kv_free_bytes / st->block_bytes;
            st->max_seqs = (uint64_t)st->kv_free_bytes / st->kv_alloc_bytes_per_seq;
        }
        if (st->max_seqs < r->max_seqs) {
            r->max_seqs = st->max_seqs;
            r->binding = s;
        }
        /* decode step: weights once (routed experts only as far as chosen)
         * plus every sequence's KV, on each stage in turn */
        uint64_t wread = st->weight_bytes;
        if (c->n_expert && st->weight_bytes >= w.stage_expert_bytes[s]) {
            double frac = experts_touched(c, p->batch) / c->n_expert;
            wread = st->weight_bytes - w.stage_expert_bytes[s] +
                    (uint64_t)llround((double)w.stage_expert_bytes[s] * frac);
        }
        uint64_t read = wread + exact * p->batch;
        r->decode_bytes_per_step += read;
        if (p->gpu_bw > 0)
            step_seconds += (double)read / p->gpu_bw;
    }
    r->fits = r->max_seqs >= 1;
    r->batch_fits = r->max_seqs >= p->batch;
    r->max_seqs_total = r->max_seqs * r->replicas;
    r->max_context = max_context(p, r, &gpu);
    r->decode_tokens_per_s = step_seconds > 0 ? (double)p->batch / step_seconds : 0;
    return 0;
}

/* ---- sweeps ---- */

/* A FACTOR: digits with an optional fraction, as every number kvcalc takes
 * (strtod alone would take " 2", "2e0" and "0x2"). */
static int parse_factor(const char *s, double *out)
{
    size_t i = strspn(s, "0123456789");
    if (i && s[i] == '.' && s[i + 1] >= '0' && s[i + 1] <= '9')
        i += 1 + strspn(s + i + 1, "0123456789");
    if (!i || s[i])
        return -1;
    *out = strtod(s, NULL);
    return isfinite(*out) ? 0 : -1;
}

int kvp_cap_sweep_parse(const char *spec, kvp_cap_num_parser parse, const char *what, int whole, double *vals,
                        size_t max, size_t *n, kvp_err *err)
{
    char buf[128];
    *n = 0;
    if (strlen(spec) >= sizeof buf)
        return kvp_err_set(err, KVP_EINVAL, "'%.40s...': too long", spec);
    snprintf(buf, sizeof buf, "%s", spec);
    char *c1 = strchr(buf, ':');
    if (!c1) {
        if (max < 1 || parse(buf, &vals[0]) != 0)
            return kvp_err_set(err, KVP_EINVAL, "'%s' is not %s", spec, what);
        *n = 1;
        return 0;
    }
    char *c2 = strchr(c1 + 1, ':');
    if (!c2 || strchr(c2 + 1, ':'))
        return kvp_err_set(err, KVP_EINVAL, "'%s': a sweep is START:END:STEP or START:END:xFACTOR", spec);
    *c1 = *c2 = '\0';
    double a, b, step;
    int geometric = c2[1] == 'x' || c2[1] == 'X';
    if (parse(buf, &a) != 0)
        return kvp_err_set(err, KVP_EINVAL, "'%s': START '%s' is not %s", spec, buf, what);
    if (parse(c1 + 1, &b) != 0)
        return kvp_err_set(err, KVP_EINVAL, "'%s': END '%s' is not %s", spec, c1 + 1, what);
    if (geometric) {
        if (parse_factor(c2 + 2, &step) != 0 || !(step > 1))
            return kvp_err_set(err, KVP_EINVAL, "'%s': FACTOR must be a number above 1 (digits: x2, x1.5)", spec);
        if (!(a > 0))
            return kvp_err_set(err, KVP_EINVAL, "'%s': a geometric sweep needs START above 0", spec);
    } else if (parse(c2 + 1, &step) != 0) {
        return kvp_err_set(err, KVP_EINVAL, "'%s': STEP '%s' is not %s", spec, c2 + 1, what);
    } else if (!(step > 0)) {
        return kvp_err_set(err, KVP_EINVAL, "'%s': STEP must be above 0", spec);
    }
    if (b < a)
        return kvp_err_set(err, KVP_EINVAL, "'%s': END is below START", spec);
    /* allow for rounding in the last step so 0.5:0.9:0.1 ends at 0.9 */
    double slack = (b - a) * 1e-9 + 1e-12;
    for (size_t i = 0;; i++) {
        double v = geometric ? a * pow(step, (double)i) : a + step * (double)i;
        if (v > b + slack)
            break;
        v = v > b ? b : v;
        if (whole) {
            v = floor(v + 0.5); /* geometric steps land off whole numbers */
            if (*n && v == vals[*n - 1])
                continue;
        }
        if (*n >= max)
            return kvp_err_set(err, KVP_ELIMIT, "'%s': more than %zu points", spec, max);
        vals[(*n)++] = v;
    }
    return 0;
}
