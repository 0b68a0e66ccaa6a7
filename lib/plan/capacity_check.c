/* capacity_check.c - kvcalc --check: decode's --stats summary read back and
 * set beside kvcalc's model of the same pool (capacity_check.h).
 */
#include "capacity_check.h"

#include "io.h"
#include "json.h"
#include "kvscale.h"
#include "shard.h"
#include "tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const pool_names[] = {[KVP_CAP_POOL_MEM] = "kv-mem", [KVP_CAP_POOL_BLOCKS] = "kv-blocks",
                                         [KVP_CAP_POOL_CONTEXT] = "context"};

const char *kvp_cap_pool_name(int pool)
{
    return pool >= 0 && pool <= KVP_CAP_POOL_CONTEXT ? pool_names[pool] : "?";
}

/* ---- reading the stats file ---- */

/* Every number is bounded well inside 64 bits, so sums and the products the
 * check forms cannot overflow. */
#define TOKENS_MAX (1ull << 53)

static int get_u64(const kvp_json *j, const char *name, const char *key, uint64_t lo, uint64_t hi, uint64_t *out,
                   kvp_err *err)
{
    int rc = kvp_json_get_u64(j, key, out);
    if (rc == KVP_ENOTFOUND)
        return kvp_err_set(err, KVP_EFORMAT, "%s: %s: missing (not the --stats output of this decode)", name, key);
    if (rc)
        return kvp_err_set(err, KVP_EFORMAT, "%s: %s: not a non-negative integer", name, key);
    if (*out < lo || *out > hi)
        return kvp_err_set(err, KVP_EFORMAT, "%s: %s: %llu is out of range (%llu..%llu)", name, key,
                           (unsigned long long)*out, (unsigned long long)lo, (unsigned long long)hi);
    return 0;
}

static int get_u32(const kvp_json *j, const char *name, const char *key, uint32_t lo, uint32_t hi, uint32_t *out,
                   kvp_err *err)
{
    uint64_t v;
    int rc = get_u64(j, name, key, lo, hi, &v, err);
    *out = (uint32_t)v;
    return rc;
}

static int get_bool(const kvp_json *j, const char *name, const char *key, int *out, kvp_err *err)
{
    int rc = kvp_json_get_bool(j, key, out);
    if (rc == KVP_ENOTFOUND)
        return kvp_err_set(err, KVP_EFORMAT, "%s: %s: missing (not the --stats output of this decode)", name, key);
    if (rc)
        return kvp_err_set(err, KVP_EFORMAT, "%s: %s: not true or false", name, key);
    return 0;
}

/* "tp" or "pp": 1 when absent (a stats file from before decode wrote them
 * is of a run on one process). */
static int get_split(const kvp_json *j, const char *name, const char *key, uint32_t max, uint32_t *out, kvp_err *err)
{
    *out = 1;
    return kvp_json_get(j, key) ? get_u32(j, name, key, 1, max, out, err) : 0;
}

/* A string member into buf[cap]: no NUL inside, shorter than cap. */
static int get_str(const kvp_json *j, const char *name, const char *key, char *buf, size_t cap, kvp_err *err)
{
    const kvp_json *v = kvp_json_get(j, key);
    if (!v)
        return kvp_err_set(err, KVP_EFORMAT, "%s: %s: missing (not the --stats output of this decode)", name, key);
    if (v->type != KVP_JSON_STRING)
        return kvp_err_set(err, KVP_EFORMAT, "%s: %s: a %s, not a string", name, key, kvp_json_type_name(v->type));
    if (v->len >= cap || strlen(v->str) != v->len)
        return kvp_err_set(err, KVP_EFORMAT, "%s: %s: longer than %zu bytes or holds a NUL", name, key, cap - 1);
    memcpy(buf, v->str, v->len + 1);
    return 0;
}

/* s is one of names[n]: its index, else -1. */
static int one_of(const char *s, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

int kvp_cap_run_parse(kvp_cap_run *out, const char *text, size_t len, const char *name, kvp_err *err)
{
    memset(out, 0, sizeof *out);
    kvp_json *j = NULL;
    int rc = kvp_json_parse(&j, text, len, name, err);
    if (rc)
        return rc;
    if (j->type != KVP_JSON_OBJECT) {
        rc = kvp_err_set(err, KVP_EFORMAT, "%s: a JSON %s, not an object (decode --stats=FILE writes one)", name,
                         kvp_json_type_name(j->type));
        goto out;
    }
    kvp_cap_run *r = out;
    char pool[16];
    uint64_t bs;
    static const char *const inputs[] = {"prompts", "kvp"};
    if ((rc = get_str(j, name, "model", r->model, sizeof r->model, err)) ||
        (rc = get_str(j, name, "model_fingerprint", r->fingerprint, sizeof r->fingerprint, err)) ||
        (rc = get_str(j, name, "input", r->input, sizeof r->input, err)) ||
        (rc = get_str(j, name, "kv_dtype", r->kv_dtype, sizeof r->kv_dtype, err)) ||
        (rc = get_str(j, name, "kv_pool_sized_by", pool, sizeof pool, err)) ||
        (rc = get_bool(j, name, "kv_out", &r->kv_out, err)) || (rc = get_bool(j, name, "stopped", &r->stopped, err)) ||
        (rc = get_u64(j, name, "block_size", 1, 65536, &bs, err)) ||
        (rc = get_u64(j, name, "kv_block_bytes", 1, 1ull << 48, &r->kv_block_bytes, err)) ||
        (rc = get_u64(j, name, "kv_blocks", 1, 1ull << 32, &r->kv_blocks, err)) ||
        (rc = get_u64(j, name, "kv_pool_bytes", 0, 1ull << 62, &r->kv_pool_bytes, err)) ||
        (rc = get_u64(j, name, "peak_kv_blocks", 0, 1ull << 32, &r->peak_kv_blocks, err)) ||
        (rc = get_u32(j, name, "max_num_seqs", 1, UINT32_MAX, &r->max_num_seqs, err)) ||
        (rc = get_u32(j, name, "peak_running", 0, UINT32_MAX, &r->peak_running, err)) ||
        (rc = get_u64(j, name, "requests", 0, TOKENS_MAX, &r->requests, err)) ||
        (rc = get_u64(j, name, "prompt_tokens", 0, TOKENS_MAX, &r->prompt_tokens, err)) ||
        (rc = get_u64(j, name, "output_tokens", 0, TOKENS_MAX, &r->output_tokens, err)) ||
        (rc = get_u64(j, name, "max_seq_len", 0, 1ull << 32, &r->max_seq_len, err)) ||
        (rc = get_u64(j, name, "preemptions", 0, TOKENS_MAX, &r->preemptions, err)) ||
        (rc = get_u64(j, name, "kv_memory", 0, TOKENS_MAX, &r->kv_memory, err)))
        goto out;
    r->block_size = (uint32_t)bs;
    if ((rc = get_split(j, name, "tp", 4096, &r->tp, err)) || (rc = get_split(j, name, "pp", KVP_CAP_MAX_PP, &r->pp, err)))
        goto out;
    const kvp_json *m = kvp_json_get(j, "kv_mem");
    if (!m) {
        rc = kvp_err_set(err, KVP_EFORMAT, "%s: kv_mem: missing (not the --stats output of this decode)", name);
        goto out;
    }
    if (m->type != KVP_JSON_NULL) {
        r->has_kv_mem = 1;
        if ((rc = get_u64(j, name, "kv_mem", 1, 1ull << 62, &r->kv_mem, err)))
            goto out;
    }

    /* the strings' values, and fields that must agree with each other */
    const char *bad = NULL;
    int kv_dt = kvp_dtype_from_name(r->kv_dtype);
    if (strlen(r->fingerprint) != 32 || strspn(r->fingerprint, "0123456789abcdef") != 32)
        bad = "model_fingerprint: not 32 lowercase hex digits";
    else if (one_of(r->input, inputs, 2) < 0)
        bad = "input: not \"prompts\" or \"kvp\"";
    else if ((r->pool = one_of(pool, pool_names, 3)) < 0)
        bad = "kv_pool_sized_by: not \"kv-mem\", \"kv-blocks\" or \"context\"";
    /* only what decode's cache holds (as kvp(5) KV blocks): int4 or fp4
     * KV is a plan for other engines' caches, which no run of decode has */
    else if (kv_dt != KVP_DTYPE_F32 && kv_dt != KVP_DTYPE_F16 && kv_dt != KVP_DTYPE_BF16 && !kvp_kvscale_dtype(kv_dt))
        bad = "kv_dtype: not a dtype decode's KV cache holds (f32 f16 bf16 fp8_e4m3 i8)";
    else if (bs & (bs - 1))
        bad = "block_size: not a power of two";
    else if ((r->pool == KVP_CAP_POOL_MEM) != r->has_kv_mem)
        bad = "kv_mem: a number exactly when kv_pool_sized_by is \"kv-mem\"";
    else if (r->peak_running > r->max_num_seqs)
        bad = "peak_running: more than max_num_seqs";
    else if (r->kv_memory > r->requests)
        bad = "kv_memory: more than requests";
    else if (r->max_seq_len > r->prompt_tokens + r->output_tokens)
        bad = "max_seq_len: more than prompt_tokens + output_tokens";
    else if (r->requests == 0 && (r->max_seq_len || r->prompt_tokens || r->output_tokens))
        bad = "requests: 0 with tokens counted";
    else if (r->requests && r->max_seq_len < (r->prompt_tokens + r->output_tokens + r->requests - 1) / r->requests)
        bad = "max_seq_len: below the mean prompt + output length";
    if (bad)
        rc = kvp_err_set(err, KVP_EFORMAT, "%s: %s", name, bad);
out:
    kvp_json_free(j);
    return rc;
}

int kvp_cap_run_load(kvp_cap_run *out, const char *path, kvp_err *err)
{
    memset(out, 0, sizeof *out);
    uint8_t *data;
    size_t len;
    int rc = kvp_read_file(path, KVP_CAP_STATS_MAX_SIZE, &data, &len, err);
    if (rc)
        return rc;
    rc = kvp_cap_run_parse(out, (const char *)data, len, strcmp(path, "-") == 0 ? "standard input" : path, err);
    free(data);
    return rc;
}

/* ---- the check ---- */

/* kvcalc's figures for one sequence of len tokens on the run's rank 0 (the
 * first GPU of the first stage): the block over its layers, KV bytes a
 * token, and the paged bytes of the sequence. */
static int plan_one(const kvp_cap_params *base, const kvp_cap_run *run, uint64_t len, kvp_cap_check *c,
                    uint64_t *alloc, kvp_err *err)
{
    kvp_cap_params q = *base;
    q.tp = run->tp;
    q.pp = run->pp;
    q.gpus = run->tp * run->pp;
    q.cfg.sliding_window = 0; /* the engine keeps every token in every layer */
    q.batch = 1;
    q.seq_len = len ? len : 1;
    q.gpu_mem_bytes = 0; /* no GPU: only the KV shape is wanted */
    q.gpu_bw = 0;
    kvp_cap_result *r = malloc(sizeof *r); /* its stages are ~5 KiB */
    if (!r)
        return kvp_err_set(err, KVP_ENOMEM, "check: out of memory");
    int rc = kvp_cap_compute(&q, r, err);
    if (!rc) {
        const kvp_cap_stage *st = &r->stage[0];
        c->n_layer = st->layer_end - st->layer_begin;
        c->kv_heads = r->kv_heads_per_gpu;
        c->block_bytes = st->block_bytes;
        c->bytes_per_token = st->kv_bytes_per_token;
        *alloc = st->kv_alloc_bytes_per_seq;
    }
    free(r);
    return rc;
}

/* The run's split as decode's shards take it: else the stats are not of a
 * run of this model. */
static int check_split(const kvp_config *cfg, kvp_col_units col_units, const kvp_cap_run *r, kvp_err *err)
{
    kvp_err why = {0};
    if (kvp_shard_check_split_cols(cfg, col_units, r->tp, &why) < 0)
        return kvp_err_set(err, KVP_EMISMATCH, "tp: %u: %s", r->tp, why.msg);
    if (r->pp > cfg->n_layer)
        return kvp_err_set(err, KVP_EMISMATCH, "pp: %u stages for a model of %u layers (at most one stage a layer)",
                           r->pp, cfg->n_layer);
    return 0;
}

static void row(kvp_cap_check *c, int i, const char *field, int rule, int has_pred, uint64_t pred, uint64_t meas,
                uint64_t len)
{
    kvp_cap_check_row *w = &c->row[i];
    w->field = field;
    w->rule = has_pred ? rule : KVP_CAP_RULE_INFO;
    w->has_predicted = has_pred;
    w->predicted = has_pred ? pred : 0;
    w->measured = meas;
    w->len = len;
    w->ok = w->rule == KVP_CAP_RULE_EQUAL ? meas == pred : w->rule == KVP_CAP_RULE_AT_MOST ? meas <= pred : 1;
    c->n_failed += !w->ok;
}

int kvp_cap_check_run(const kvp_cap_params *p, int pool, uint64_t kv_mem, const kvp_cap_run *run,
                      kvp_cap_check *out, kvp_err *err)
{
    memset(out, 0, sizeof *out);
    kvp_cap_check *c = out;
    const kvp_cap_run *r = run;
    if (r->requests) {
        /* the tokens a request's KV holds: prompt and output less the last
         * token sampled, which no step feeds back (16 + 17 run in two
         * blocks of 16, where 33 tokens took three) */
        uint64_t last = r->output_tokens < r->requests ? r->output_tokens : r->requests;
        c->max_len = r->max_seq_len - (r->output_tokens && r->max_seq_len > 1);
        c->mean_len = (r->prompt_tokens + r->output_tokens - last + r->requests - 1) / r->requests;
    }
    uint64_t alloc_mean, alloc_max;
    int rc = check_split(&p->cfg, p->col_units, r, err);
    if (!rc)
        rc = plan_one(p, r, c->max_len, c, &alloc_max, err);
    if (!rc)
        rc = plan_one(p, r, c->mean_len, c, &alloc_mean, err);
    if (rc)
        return rc;
    c->layer_block_bytes = c->block_bytes / c->n_layer;
    uint32_t bs = p->block_size;
    switch (pool) {
    case KVP_CAP_POOL_MEM: c->n_blocks = kv_mem / c->block_bytes; break;
    case KVP_CAP_POOL_BLOCKS: c->n_blocks = r->kv_blocks; break;
    case KVP_CAP_POOL_CONTEXT:
        c->n_blocks = ((uint64_t)(p->cfg.n_ctx ? p->cfg.n_ctx : 4096) + bs - 1) / bs;
        break;
    default: return kvp_err_set(err, KVP_EINVAL, "check: unknown pool sizing %d", pool);
    }
    if (c->n_blocks && c->block_bytes > UINT64_MAX / c->n_blocks)
        return kvp_err_set(err, KVP_ELIMIT, "check: %llu blocks of %llu bytes overflow 64 bits",
                           (unsigned long long)c->n_blocks, (unsigned long long)c->block_bytes);
    c->pool_bytes = c->n_blocks * c->block_bytes;
    /* kvcalc's max_seqs: the KV memory over the paged bytes of one sequence */
    uint64_t seqs_mean = c->pool_bytes / alloc_mean, seqs_max = c->pool_bytes / alloc_max;
    c->seats = r->requests < r->max_num_seqs ? r->requests : r->max_num_seqs;
    c->premises = strcmp(r->input, "prompts") == 0 && !r->kv_out && !r->stopped && r->requests > 0;

    row(c, KVP_CAP_ROW_BLOCK_BYTES, "kv_block_bytes", KVP_CAP_RULE_EQUAL, 1, c->block_bytes, r->kv_block_bytes, 0);
    row(c, KVP_CAP_ROW_BLOCKS, "kv_blocks", KVP_CAP_RULE_EQUAL, 1, c->n_blocks, r->kv_blocks, 0);
    row(c, KVP_CAP_ROW_POOL_BYTES, "kv_pool_bytes", KVP_CAP_RULE_EQUAL, 1, c->pool_bytes, r->kv_pool_bytes, 0);
    row(c, KVP_CAP_ROW_PEAK_BLOCKS, "peak_kv_blocks", KVP_CAP_RULE_AT_MOST, 1, c->n_blocks, r->peak_kv_blocks, 0);
    row(c, KVP_CAP_ROW_SEQS_MEAN, "peak_running", KVP_CAP_RULE_INFO, r->requests > 0, seqs_mean, r->peak_running,
        c->mean_len);
    row(c, KVP_CAP_ROW_SEQS_MAX, "peak_running", KVP_CAP_RULE_INFO, r->requests > 0, seqs_max, r->peak_running,
        c->max_len);
    row(c, KVP_CAP_ROW_PREEMPTIONS, "preemptions", KVP_CAP_RULE_AT_MOST, c->premises && seqs_max >= c->seats, 0,
        r->preemptions, 0);
    /* a request that ended for memory is in the stats at the length it
     * reached, not the one it asked for: where the longest filled the
     * pool, it may be one of those, and nothing says it would have fit */
    row(c, KVP_CAP_ROW_KV_MEMORY, "kv_memory", KVP_CAP_RULE_AT_MOST, c->premises && c->pool_bytes > alloc_max, 0,
        r->kv_memory, 0);
    return 0;
}
