/* kvcalc - how much KV cache, how many sequences, how long a context: the
 * capacity planner.  The memory model lives in lib/capacity.c; this file
 * parses options, expands sweeps, and prints a report, JSON or TSV.
 */
#include "capacity.h"
#include "capacity_check.h"
#include "cli.h"
#include "config.h"
#include "model.h"
#include "presets.h"
#include "shard.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: kvcalc [-m MODEL] [-g GPU] [options]\n"
            "       kvcalc --list-models | --list-gpus\n"
            "       kvcalc --check STATS.json [-m MODEL] [--kv-dtype T] [--block-size N] [--kv-mem SIZE] [--json]\n"
            "KV-cache, weight and activation memory per GPU; how many sequences fit.\n"
            "\n"
            "Model:\n"
            "  -m, --model NAME|PATH     preset (--list-models), GGUF, KVP model, HF config.json or folder\n"
            "      --layers N  --hidden N  --heads N  --kv-heads N  --head-dim N  --vocab N  --ffn N\n"
            "      --experts N  --experts-used N  --window N  --params N[K|M|G|B|T]   override the model\n"
            "                            (without -m: --layers --hidden --heads --ffn --vocab describe one)\n"
            "      --weight-dtype T      f16 bf16 f32 fp8 fp8-e5m2 int8 int4 int4-gN fp4-gN nvfp4 mxfp4\n"
            "                            q4_0..q8_0 q2_k..q6_k (any case)\n"
            "      --embed-dtype T       embeddings, lm_head, norms (default: as weights if 16/32-bit, else bf16;\n"
            "                            a GGUF or KVP file's tensors count as stored: give --weight-dtype too)\n"
            "      --kv-dtype T          f16 bf16 f32 fp8 fp8-e5m2 int8 int4 fp4 (default f16; int4, fp4,\n"
            "                            fp8-e5m2: other engines' caches, not decode's)\n"
            "GPU:\n"
            "  -g, --gpu NAME            preset (--list-gpus)\n"
            "      --gpu-mem SIZE        memory per GPU (80G, 141GB, 80GiB)\n"
            "      --gpu-bw RATE         bandwidth per GPU, bytes/s (3.35T)\n"
            "      --gpus N  --tp N  --pp N   GPUs in all; tensor and pipeline parallel (default tp = gpus)\n"
            "      --gpu-util F          usable share of memory (default 0.9)\n"
            "      --overhead SIZE       fixed allowance per GPU (default 1GiB)\n"
            "      --max-batched-tokens N  prefill chunk, sizes the activation allowance (default 8192)\n"
            "Workload:\n"
            "  -s, --seq-len N           tokens per sequence (default: the model's context, else 4096)\n"
            "  -b, --batch N             concurrent sequences (default 1)\n"
            "      --block-size N        tokens per KV block, a power of two (default 16)\n"
            "      --lengths SPEC        simulate fragmentation: FILE, uniform:A:B, normal:MEAN:SD,\n"
            "                            lognormal:MU:SIGMA\n"
            "      --seed N  --shared-prefix N   for --lengths (with the report or --json, not --tsv)\n"
            "Checking a run:\n"
            "      --check STATS.json    set kvcalc's KV model beside what decode --stats=FILE measured:\n"
            "                            block bytes, blocks, peak use, concurrency; exit 1 when they\n"
            "                            disagree.  The model defaults to the one the run names; KV dtype,\n"
            "                            block size and pool are the run's unless given\n"
            "      --kv-mem SIZE         with --check: the KV pool size to predict from\n"
            "Output:\n"
            "      --json                one JSON object (JSON Lines for a sweep)\n"
            "      --tsv                 header and rows\n"
            "  -h, --help  -V, --version\n"
            "Numeric options take START:END:STEP or START:END:xFACTOR for a sweep (at most 100000 points),\n"
            "all but --seed, --shared-prefix and --kv-mem.\n");
}

/* ---- options that sweep ---- */

enum sweep_id {
    SW_SEQ_LEN, SW_BATCH, SW_GPUS, SW_TP, SW_PP, SW_GPU_UTIL, SW_BLOCK, SW_MBT, SW_GPU_MEM, SW_GPU_BW,
    SW_OVERHEAD, SW_LAYERS, SW_KV_HEADS, SW_HEADS, SW_HEAD_DIM, SW_HIDDEN, SW_VOCAB, SW_FFN, SW_EXPERTS,
    SW_EXPERTS_USED, SW_WINDOW, SW_PARAMS, SW_COUNT
};
enum { K_INT, K_SIZE, K_REAL, K_COUNT, K_RATE };

typedef struct sweep_opt {
    const char *name;  /* option name without dashes, also the output column */
    int kind;
    double min, max;
    const char *spec;  /* as given, NULL when not given */
    double *vals;
    size_t n;
} sweep_opt;

static sweep_opt sweeps[SW_COUNT] = {
    [SW_SEQ_LEN] = {"seq-len", K_INT, 1, 4294967296.0, NULL, NULL, 0},
    [SW_BATCH] = {"batch", K_INT, 1, 4294967296.0, NULL, NULL, 0},
    [SW_GPUS] = {"gpus", K_INT, 1, 65536, NULL, NULL, 0},
    [SW_TP] = {"tp", K_INT, 1, 4096, NULL, NULL, 0},
    [SW_PP] = {"pp", K_INT, 1, KVP_CAP_MAX_PP, NULL, NULL, 0},
    [SW_GPU_UTIL] = {"gpu-util", K_REAL, 1e-9, 1, NULL, NULL, 0},
    [SW_BLOCK] = {"block-size", K_INT, 1, 65536, NULL, NULL, 0},
    [SW_MBT] = {"max-batched-tokens", K_INT, 1, 4294967296.0, NULL, NULL, 0},
    [SW_GPU_MEM] = {"gpu-mem", K_SIZE, 1, 1e18, NULL, NULL, 0},
    [SW_GPU_BW] = {"gpu-bw", K_RATE, 1, 1e18, NULL, NULL, 0},
    [SW_OVERHEAD] = {"overhead", K_SIZE, 0, 1e18, NULL, NULL, 0},
    /* a model's shape: the loader's ranges (config.h), so that kvcalc plans
     * no shape a model file could not have; a window is any 32-bit count.
     * Experts used start at 0 as the loader's do: a dense model has none, so
     * a MoE preset turns dense with --experts 0 --experts-used 0 */
    [SW_LAYERS] = {"layers", K_INT, 1, KVP_CONFIG_MAX_LAYER, NULL, NULL, 0},
    [SW_KV_HEADS] = {"kv-heads", K_INT, 1, KVP_CONFIG_MAX_HEAD, NULL, NULL, 0},
    [SW_HEADS] = {"heads", K_INT, 1, KVP_CONFIG_MAX_HEAD, NULL, NULL, 0},
    [SW_HEAD_DIM] = {"head-dim", K_INT, 1, KVP_CONFIG_MAX_HEAD_DIM, NULL, NULL, 0},
    [SW_HIDDEN] = {"hidden", K_INT, 1, KVP_CONFIG_MAX_EMBD, NULL, NULL, 0},
    [SW_VOCAB] = {"vocab", K_INT, 1, KVP_CONFIG_MAX_VOCAB, NULL, NULL, 0},
    [SW_FFN] = {"ffn", K_INT, 1, KVP_CONFIG_MAX_FF, NULL, NULL, 0},
    [SW_EXPERTS] = {"experts", K_INT, 0, KVP_CONFIG_MAX_EXPERT, NULL, NULL, 0},
    [SW_EXPERTS_USED] = {"experts-used", K_INT, 0, KVP_CONFIG_MAX_EXPERT, NULL, NULL, 0},
    [SW_WINDOW] = {"window", K_INT, 0, UINT32_MAX, NULL, NULL, 0},
    [SW_PARAMS] = {"params", K_COUNT, 1, 1e16, NULL, NULL, 0},
};

/* Every number kvcalc takes is written in decimal digits, a fraction where
 * the option allows one: no sign, space, exponent or hex, all of which
 * strtod takes ("-s 0x100" was 256 tokens, "-s ' 8192'" 8192).  The length
 * of such a number at s, 0 when there is none. */
static size_t decimal_len(const char *s, int fraction)
{
    size_t i = strspn(s, "0123456789");
    if (i && fraction && s[i] == '.' && isdigit((unsigned char)s[i + 1]))
        i += 1 + strspn(s + i + 1, "0123456789");
    return i;
}

/* A count of tokens, layers, heads: digits only. */
static int parse_int(const char *s, double *out)
{
    size_t n = decimal_len(s, 0);
    if (!n || s[n])
        return -1;
    double v = strtod(s, NULL);
    if (!isfinite(v))
        return -1;
    *out = v;
    return 0;
}

/* A share (--gpu-util): digits with an optional fraction. */
static int parse_real(const char *s, double *out)
{
    size_t n = decimal_len(s, 1);
    if (!n || s[n])
        return -1;
    double v = strtod(s, NULL);
    if (!isfinite(v))
        return -1;
    *out = v;
    return 0;
}

/* A size: kvp_cli_parse_size's digits and units. */
static int parse_size(const char *s, double *out)
{
    uint64_t v;
    if (kvp_cli_parse_size(s, &v))
        return -1;
    *out = (double)v;
    return 0;
}

/* A rate: a size with an optional "/s" ("3.35TB/s"); only a rate takes it
 * ("--gpu-mem 80GiB/s" is not a memory size). */
static int parse_rate(const char *s, double *out)
{
    char buf[64];
    size_t n = strlen(s);
    if (n >= sizeof buf)
        return -1;
    memcpy(buf, s, n + 1);
    if (n > 2 && strcmp(buf + n - 2, "/s") == 0)
        buf[n - 2] = '\0';
    return parse_size(buf, out);
}

/* A parameter count: 8.03B, 70G, 135M, 405000000000. */
static int parse_count(const char *s, double *out)
{
    size_t n = decimal_len(s, 1);
    if (!n)
        return -1;
    double v = strtod(s, NULL), mult = 1;
    const char *e = s + n;
    switch (*e) {
    case 'k': case 'K': mult = 1e3; e++; break;
    case 'm': case 'M': mult = 1e6; e++; break;
    case 'b': case 'B': case 'g': case 'G': mult = 1e9; e++; break;
    case 't': case 'T': mult = 1e12; e++; break;
    default: break;
    }
    if (*e || !isfinite(v))
        return -1;
    *out = v * mult;
    return 0;
}

/* What each kind of value is, for messages: "'0x100' is not ..." */
static const char *const kind_what[] = {
    [K_INT] = "a whole number in digits",
    [K_SIZE] = "a size: digits, an optional fraction and unit (80G, 141GB, 80GiB, 3.35T)",
    [K_REAL] = "a number in digits with an optional fraction (0.9)",
    [K_COUNT] = "a count: digits, an optional fraction and K, M, B or T (8.03B)",
    [K_RATE] = "a rate: digits, an optional fraction and unit, then an optional /s (3.35T, 3.35TB/s)",
};

static void expand_sweep(sweep_opt *o)
{
    static const kvp_cap_num_parser parsers[] = {[K_INT] = parse_int, [K_SIZE] = parse_size,
                                                 [K_REAL] = parse_real, [K_COUNT] = parse_count,
                                                 [K_RATE] = parse_rate};
    kvp_err err = {0};
    o->vals = malloc(KVP_CAP_SWEEP_MAX * sizeof *o->vals);
    if (!o->vals)
        kvp_cli_die("out of memory");
    int whole = o->kind == K_INT || o->kind == K_SIZE || o->kind == K_RATE;
    if (kvp_cap_sweep_parse(o->spec, parsers[o->kind], kind_what[o->kind], whole, o->vals, KVP_CAP_SWEEP_MAX, &o->n,
                            &err)) {
        /* "8k" tokens is 8192 to some and 8000 to others: counts take digits */
        if (o->kind == K_INT && strpbrk(o->spec, "kKmMgG"))
            kvp_cli_usage_error("--%s: %s (a count takes digits only: 8192 or 8000, not 8k)", o->name, err.msg);
        kvp_cli_usage_error("--%s: %s", o->name, err.msg);
    }
    for (size_t i = 0; i < o->n; i++) {
        double v = o->vals[i];
        if (v < o->min || v > o->max)
            kvp_cli_usage_error("--%s: %.15g is out of range (%.15g..%.15g)", o->name, v, o->min, o->max);
        if (&sweeps[SW_BLOCK] == o && ((uint64_t)v & ((uint64_t)v - 1)))
            kvp_cli_usage_error("--block-size: %.15g is not a power of two", v);
    }
}

/* --seed, --shared-prefix: digits only, like every count; one value, as
 * the simulation has one stream of lengths. */
static uint64_t opt_whole(const char *opt, const char *s, uint64_t max)
{
    if (strchr(s, ':'))
        kvp_cli_usage_error("%s: '%s': one value, not a sweep (--seed and --shared-prefix do not sweep)", opt, s);
    size_t n = decimal_len(s, 0);
    unsigned long long v = 0;
    if (n && !s[n]) {
        errno = 0;
        v = strtoull(s, NULL, 10);
    }
    if (!n || s[n] || errno == ERANGE || v > max)
        kvp_cli_usage_error("%s: '%s' is not a whole number in digits from 0 to %" PRIu64, opt, s, max);
    return (uint64_t)v;
}

/* ---- the run's fixed choices ---- */

typedef struct run {
    kvp_cap_params base;
    const char *model_label;      /* argv, a preset, or base.cfg.name: never copied */
    const char *model_source;     /* "preset", "gguf", "kvp", "hf", "options" */
    const kvp_gpu_preset *gpu;
    int have_gpu;
    int json, tsv;
    int tsv_header_done;
    int sweeping;
    kvp_cap_lengths lengths;
    int have_lengths;
    uint64_t seed, shared_prefix;
    int gpus_given, tp_given;
    double point[SW_COUNT];       /* the swept options' values at the point being emitted */
    /* a text sweep's fragmentation, printed after its table */
    struct sim_point *sim_pts;
    size_t n_sim_pts, cap_sim_pts;
} run;

#define SIM_SIZES 7

/* One sweep point's simulation: the swept values, the rows. */
typedef struct sim_point {
    double point[SW_COUNT];
    kvp_cap_sim_row rows[SIM_SIZES + 2];
    size_t n;
} sim_point;

static void apply(kvp_cap_params *p, int id, double v)
{
    uint32_t u = (uint32_t)v;
    kvp_config *c = &p->cfg;
    switch (id) {
    case SW_SEQ_LEN: p->seq_len = (uint64_t)v; break;
    case SW_BATCH: p->batch = (uint64_t)v; break;
    case SW_GPUS: p->gpus = u; break;
    case SW_TP: p->tp = u; break;
    case SW_PP: p->pp = u; break;
    case SW_GPU_UTIL: p->gpu_util = v; break;
    case SW_BLOCK: p->block_size = u; break;
    case SW_MBT: p->max_batched_tokens = (uint64_t)v; break;
    case SW_GPU_MEM: p->gpu_mem_bytes = (uint64_t)v; break;
    case SW_GPU_BW: p->gpu_bw = v; break;
    case SW_OVERHEAD: p->overhead_bytes = (uint64_t)v; break;
    case SW_LAYERS: c->n_layer = u; break;
    case SW_KV_HEADS: c->n_head_kv = u; break;
    case SW_HEADS: c->n_head = u; break;
    case SW_HEAD_DIM: c->head_dim = u; c->rope_dim = u; break;
    case SW_HIDDEN: c->n_embd = u; break;
    case SW_VOCAB: c->n_vocab = u; break;
    case SW_FFN: c->n_ff = u; break;
    case SW_EXPERTS: c->n_expert = u; break;
    case SW_EXPERTS_USED: c->n_expert_used = u; break;
    case SW_WINDOW: c->sliding_window = u; break;
    case SW_PARAMS: p->n_params = v; break;
    default: break;
    }
}

/* ---- printing helpers ---- */

/* 1342177280 -> "1,342,177,280" */
static const char *commas(char *buf, size_t n, uint64_t v)
{
    char tmp[32];
    int len = snprintf(tmp, sizeof tmp, "%" PRIu64, v);
    size_t o = 0;
    for (int i = 0; i < len && o + 2 < n; i++) {
        if (i && (len - i) % 3 == 0)
            buf[o++] = ',';
        buf[o++] = tmp[i];
    }
    buf[o] = '\0';
    return buf;
}

/* "1.34 GB (1.25 GiB)" */
static const char *gbs(char *buf, size_t n, double bytes)
{
    if (fabs(bytes) >= 1e9)
        snprintf(buf, n, "%.2f GB (%.2f GiB)", bytes / 1e9, bytes / 1073741824.0);
    else
        snprintf(buf, n, "%.2f MB (%.2f MiB)", bytes / 1e6, bytes / 1048576.0);
    return buf;
}

/* One output row as name/value pairs, shared by JSON and TSV. */
typedef struct field {
    const char *name;
    const char *str;     /* a string (put_s), quoted in JSON; else NULL */
    char num[32];        /* else a number or a JSON literal */
} field;

typedef struct row {
    field f[96];
    int n;
} row;

static field *put(row *r, const char *name)
{
    field *f = &r->f[r->n++];
    f->name = name;
    f->str = NULL;
    return f;
}
static void put_u(row *r, const char *name, uint64_t v)
{
    field *f = put(r, name);
    snprintf(f->num, sizeof f->num, "%" PRIu64, v);
}
static void put_i(row *r, const char *name, int64_t v)
{
    field *f = put(r, name);
    snprintf(f->num, sizeof f->num, "%" PRId64, v);
}
static void put_f(row *r, const char *name, double v)
{
    field *f = put(r, name);
    snprintf(f->num, sizeof f->num, "%.6g", v);
}
/* v must outlive the row (argv, a preset, the run's config). */
static void put_s(row *r, const char *name, const char *v) { put(r, name)->str = v; }
/* null, true or false */
static void put_lit(row *r, const char *name, const char *lit)
{
    field *f = put(r, name);
    snprintf(f->num, sizeof f->num, "%s", lit);
}

static void fill_row(row *w, const run *R, const kvp_cap_params *p, const kvp_cap_result *r)
{
    const kvp_config *c = &p->cfg;
    w->n = 0;
    put_s(w, "model", R->model_label);
    put_s(w, "source", R->model_source);
    put_u(w, "n_layer", c->n_layer);
    put_u(w, "n_embd", c->n_embd);
    put_u(w, "n_head", c->n_head);
    put_u(w, "n_head_kv", c->n_head_kv);
    put_u(w, "head_dim", c->head_dim ? c->head_dim : c->n_embd / c->n_head);
    put_u(w, "n_vocab", c->n_vocab);
    put_u(w, "n_ff", c->n_ff);
    put_u(w, "n_expert", c->n_expert);
    put_u(w, "sliding_window", c->sliding_window);
    put_u(w, "kv_lora_rank", c->kv_lora_rank);
    put_s(w, "weight_dtype", p->weight_fmt.name);
    put_s(w, "kv_dtype", p->kv_fmt.name);
    put_u(w, "seq_len", p->seq_len);
    put_u(w, "batch", p->batch);
    put_u(w, "block_size", p->block_size);
    put_u(w, "n_params", r->n_params);
    put_u(w, "n_params_active", r->n_params_active);
    put_u(w, "weight_bytes", r->weight_bytes);
    put_u(w, "kv_bytes_per_token", r->kv_bytes_per_token);
    put_u(w, "kv_bytes_per_seq", r->kv_bytes_per_seq);
    put_u(w, "kv_bytes", r->kv_bytes);
    put_u(w, "kv_alloc_bytes_per_seq", r->kv_alloc_bytes_per_seq);
    put_u(w, "kv_alloc_bytes", r->kv_alloc_bytes);
    put_u(w, "kv_waste_bytes_per_seq", r->kv_waste_bytes_per_seq);
    put_u(w, "tp", p->tp);
    put_u(w, "pp", p->pp);
    put_u(w, "gpus", p->gpus);
    put_u(w, "kv_heads_per_gpu", r->kv_heads_per_gpu);
    if (!R->have_gpu) {
        put_lit(w, "gpu", "null");
        return;
    }
    const kvp_cap_stage *st = &r->stage[r->binding];
    put_s(w, "gpu", R->gpu ? R->gpu->name : "custom");
    put_u(w, "gpu_mem_bytes", p->gpu_mem_bytes);
    put_u(w, "gpu_bw_bytes_per_s", (uint64_t)p->gpu_bw);
    put_f(w, "gpu_util", p->gpu_util);
    put_u(w, "max_batched_tokens", p->max_batched_tokens);
    put_u(w, "usable_bytes", r->usable_bytes);
    put_u(w, "binding_stage", r->binding);
    put_u(w, "weight_bytes_per_gpu", st->weight_bytes);
    put_u(w, "overhead_bytes", p->overhead_bytes);
    put_u(w, "activation_bytes", st->activation_bytes);
    put_i(w, "kv_free_bytes", st->kv_free_bytes);
    put_u(w, "kv_bytes_per_token_per_gpu", st->kv_bytes_per_token);
    put_u(w, "kv_alloc_bytes_per_seq_per_gpu", st->kv_alloc_bytes_per_seq);
    put_u(w, "block_bytes", st->block_bytes);
    put_u(w, "kv_blocks", st->n_blocks);
    put_lit(w, "fits", r->fits ? "true" : "false");
    put_lit(w, "batch_fits", r->batch_fits ? "true" : "false");
    put_u(w, "max_seqs", r->max_seqs);
    put_u(w, "replicas", r->replicas);
    put_u(w, "max_seqs_total", r->max_seqs_total);
    if (r->max_context < 0)
        put_lit(w, "max_context", "null");
    else
        put_i(w, "max_context", r->max_context);
    put_u(w, "decode_bytes_per_step", r->decode_bytes_per_step);
    put_f(w, "decode_tokens_per_s", r->decode_tokens_per_s);
}

static void print_json_fields(const row *w)
{
    for (int i = 0; i < w->n; i++) {
        printf("%s\"%s\":", i ? "," : "", w->f[i].name);
        if (w->f[i].str)
            kvp_cli_json_str(stdout, w->f[i].str, strlen(w->f[i].str));
        else
            fputs(w->f[i].num, stdout);
    }
}

static void print_stages_json(const kvp_cap_result *r)
{
    printf(",\"stages\":[");
    for (uint32_t s = 0; s < r->n_stages; s++) {
        const kvp_cap_stage *st = &r->stage[s];
        printf("%s{\"layer_begin\":%u,\"layer_end\":%u,\"weight_bytes\":%" PRIu64 ",\"activation_bytes\":%" PRIu64
               ",\"kv_free_bytes\":%" PRId64 ",\"kv_bytes_per_token\":%" PRIu64 ",\"kv_blocks\":%" PRIu64
               ",\"max_seqs\":%" PRIu64 "}",
               s ? "," : "", st->layer_begin, st->layer_end, st->weight_bytes, st->activation_bytes,
               st->kv_free_bytes, st->kv_bytes_per_token, st->n_blocks, st->max_seqs);
    }
    printf("]");
}

/* ---- fragmentation ---- */

static size_t sim_block_sizes(uint32_t chosen, uint32_t *out)
{
    static const uint32_t std[] = {8, 16, 32, 64, 128, 256};
    size_t n = 0;
    int have = 0;
    for (size_t i = 0; i < sizeof std / sizeof std[0]; i++) {
        if (!have && chosen < std[i]) {
            out[n++] = chosen;
            have = 1;
        }
        if (std[i] == chosen)
            have = 1;
        out[n++] = std[i];
    }
    if (!have)
        out[n++] = chosen;
    return n;
}

static int simulate(const run *R, const kvp_cap_params *p, const kvp_cap_result *r, kvp_cap_sim_row *rows,
                    size_t *n_rows, uint32_t *sizes)
{
    const kvp_cap_stage *st = &r->stage[r->binding];
    uint32_t nl = st->layer_end - st->layer_begin; /* the stage's figures are its layers' sums */
    kvp_cap_sim_opts o = {
        .kv_bytes = st->kv_free_bytes > 0 ? (uint64_t)st->kv_free_bytes : 0,
        .bytes_per_token = st->kv_bytes_per_token / nl,
        .scale_bytes_per_block = (st->block_bytes - p->block_size * st->kv_bytes_per_token) / nl,
        .n_full = st->n_full,
        .n_sliding = st->n_sliding,
        .window = p->cfg.sliding_window,
        .max_len = p->seq_len,
        .shared_prefix = R->shared_prefix,
        .seed = R->seed,
    };
    size_t n = sim_block_sizes(p->block_size, sizes);
    kvp_err err = {0};
    if (kvp_cap_simulate(&o, &R->lengths, sizes, n, rows, &err))
        kvp_cli_die_err(&err);
    *n_rows = n + 1;
    return 0;
}

static void print_sim_json(const kvp_cap_sim_row *rows, size_t n)
{
    printf(",\"fragmentation\":[");
    for (size_t i = 0; i < n; i++) {
        const kvp_cap_sim_row *s = &rows[i];
        printf("%s{\"scheme\":\"%s\",\"block_size\":%u,\"seqs\":%" PRIu64 ",\"tokens\":%" PRIu64
               ",\"alloc_bytes\":%" PRIu64 ",\"waste_bytes\":%" PRIu64 ",\"seqs_shared\":%" PRIu64
               ",\"saved_bytes\":%" PRIu64 "}",
               i ? "," : "", s->block_size ? "paged" : "contiguous", s->block_size, s->seqs, s->tokens,
               s->alloc_bytes, s->waste_bytes, s->seqs_shared, s->saved_bytes);
    }
    printf("]");
}

static void print_sim_head(const run *R, const char *lead)
{
    printf("  %s%-16s %10s %10s %12s %24s %7s", lead, "scheme", "seqs", "mean len", "tokens", "wasted", "waste%");
    if (R->shared_prefix)
        printf(" %10s %24s", "seqs+share", "saved");
    printf("\n");
}

static void print_sim_row(const run *R, const kvp_cap_sim_row *s, const char *lead)
{
    char b1[64], name[32];
    if (s->block_size)
        snprintf(name, sizeof name, "paged %u", s->block_size);
    else
        snprintf(name, sizeof name, "contiguous");
    double pct = s->alloc_bytes ? 100.0 * (double)s->waste_bytes / (double)s->alloc_bytes : 0;
    printf("  %s%-16s %10" PRIu64 " %10.1f %12" PRIu64 " %24s %6.1f%%", lead, name, s->seqs,
           s->seqs ? (double)s->tokens / (double)s->seqs : 0.0, s->tokens, gbs(b1, sizeof b1, (double)s->waste_bytes),
           pct);
    if (R->shared_prefix && s->block_size)
        printf(" %10" PRIu64 " %24s", s->seqs_shared, gbs(b1, sizeof b1, (double)s->saved_bytes));
    printf("\n");
}

/* "(simulated lengths, seed 1, reserve 4096 tokens contiguous, shared prefix 64)" */
static void print_sim_title(const run *R, const char *reserve)
{
    printf("\nFragmentation (simulated lengths, seed %" PRIu64 ", reserve %s tokens contiguous", R->seed, reserve);
    if (R->shared_prefix)
        printf(", shared prefix %" PRIu64, R->shared_prefix);
    printf(")\n");
}

static void print_sim_human(const run *R, const kvp_cap_params *p, const kvp_cap_sim_row *rows, size_t n)
{
    char reserve[32];
    snprintf(reserve, sizeof reserve, "%" PRIu64, p->seq_len);
    print_sim_title(R, reserve);
    print_sim_head(R, "");
    for (size_t i = 0; i < n; i++)
        print_sim_row(R, &rows[i], "");
}

/* ---- the human report ---- */

static void print_human(const run *R, const kvp_cap_params *p, const kvp_cap_result *r)
{
    const kvp_config *c = &p->cfg;
    char b1[64], b2[64];
    uint32_t hd = c->head_dim ? c->head_dim : c->n_embd / c->n_head;
    printf("model      %s (%s): %u layers, hidden %u, %u heads", R->model_label, R->model_source, c->n_layer,
           c->n_embd, c->n_head);
    if (c->kv_lora_rank)
        printf(", MLA latent %u + rope %u", c->kv_lora_rank, c->rope_head_dim_mla);
    else
        printf(" / %u KV heads x %u", c->n_head_kv, hd);
    printf(", vocab %u\n", c->n_vocab);
    if (c->n_expert)
        printf("           %u experts, top-%u%s\n", c->n_expert, c->n_expert_used,
               c->n_expert_shared ? " + shared" : "");
    if (c->sliding_window)
        printf("           sliding window %u on %s layers\n", c->sliding_window,
               c->sliding_period > 1 ? "alternate" : "all");
    printf("           %.3f B params", (double)r->n_params / 1e9);
    if (r->n_params_active != r->n_params)
        printf(" (%.3f B active)", (double)r->n_params_active / 1e9);
    printf("; weights %s", p->weight_fmt.name);
    /* their bytes are in the total: name them (a file's: its embeddings'
     * own format; the head and norms may be others, counted as stored) */
    if (strcmp(p->embed_fmt.name, p->weight_fmt.name) != 0)
        printf(" (embeddings%s %s)", p->weight_bytes_override ? "" : ", head and norms", p->embed_fmt.name);
    printf(", KV %s: %s\n", p->kv_fmt.name, gbs(b1, sizeof b1, (double)r->weight_bytes));

    printf("\nKV cache (whole model)\n");
    printf("  per token          %s B", commas(b1, sizeof b1, r->kv_bytes_per_token));
    if (c->kv_lora_rank)
        printf("  (%u elements x %u layers)\n", r->kv_vector_elems, c->n_layer);
    else if (p->kv_fmt.scale == KVP_CAP_SCALE_TOKEN)
        printf("  (K+V x %u heads x (%u + a %u-byte scale) x %u layers)\n", c->n_head_kv, hd, p->kv_fmt.scale_bytes,
               c->n_layer);
    else
        printf("  (K+V x %u heads x %u x %u layers)\n", c->n_head_kv, hd, c->n_layer);
    printf("  per sequence       %s B = %s at %" PRIu64 " tokens\n", commas(b1, sizeof b1, r->kv_bytes_per_seq),
           gbs(b2, sizeof b2, (double)r->kv_bytes_per_seq), p->seq_len);
    printf("  batch of %-9" PRIu64 " %s B = %s\n", p->batch, commas(b1, sizeof b1, r->kv_bytes),
           gbs(b2, sizeof b2, (double)r->kv_bytes));
    printf("  paged, block %-5u %s B a sequence (%s B in the partial last block and scales)\n", p->block_size,
           commas(b1, sizeof b1, r->kv_alloc_bytes_per_seq), commas(b2, sizeof b2, r->kv_waste_bytes_per_seq));
    if (!R->have_gpu) {
        printf("\n(no --gpu or --gpu-mem: capacity not computed)\n");
        return;
    }
    const kvp_cap_stage *st = &r->stage[r->binding];
    printf("\nPer GPU: %s, %s", R->gpu ? R->gpu->desc : "custom", gbs(b1, sizeof b1, (double)p->gpu_mem_bytes));
    if (p->gpu_bw > 0)
        printf(", %.2f TB/s", p->gpu_bw / 1e12);
    printf("; tp %u x pp %u", p->tp, p->pp);
    if (p->pp > 1)
        printf(" (stage %u: layers %u-%u, the tightest)", r->binding, st->layer_begin, st->layer_end - 1);
    printf("\n");
    printf("  usable (x%.2f)     %s\n", p->gpu_util, gbs(b1, sizeof b1, (double)r->usable_bytes));
    printf("  - weights          %s\n", gbs(b1, sizeof b1, (double)st->weight_bytes));
    printf("  - overhead         %s  (CUDA context, libraries' workspaces)\n",
           gbs(b1, sizeof b1, (double)p->overhead_bytes));
    printf("  - activations      %s  (%" PRIu64 " batched tokens)\n", gbs(b1, sizeof b1, (double)st->activation_bytes),
           p->max_batched_tokens);
    printf("  = KV cache         %s\n", gbs(b1, sizeof b1, (double)st->kv_free_bytes));
    if (c->kv_lora_rank)
        printf("  KV per GPU         MLA latent, replicated on every TP rank; %s B per token\n",
               commas(b1, sizeof b1, st->kv_bytes_per_token));
    else
        printf("  KV heads per GPU   %u%s; %s B per token\n", r->kv_heads_per_gpu,
               p->tp > c->n_head_kv ? " (replicated: tp > KV heads)" : "",
               commas(b1, sizeof b1, st->kv_bytes_per_token));
    printf("  blocks             %s of %u tokens (%s B each)\n", commas(b1, sizeof b1, st->n_blocks), p->block_size,
           commas(b2, sizeof b2, st->block_bytes));
    printf("\nAnswer\n");
    if (!r->fits) {
        if (st->kv_free_bytes <= 0)
            printf("  does not fit: weights and allowance exceed the usable memory by %s\n",
                   gbs(b1, sizeof b1, (double)-st->kv_free_bytes));
        else
            printf("  does not fit: not one sequence of %" PRIu64 " tokens fits in the KV memory\n", p->seq_len);
    }
    printf("  sequences of %" PRIu64 " tokens at once: %" PRIu64, p->seq_len, r->max_seqs);
    if (r->replicas > 1)
        printf(" per replica, %" PRIu64 " over %u replicas", r->max_seqs_total, r->replicas);
    printf("\n");
    /* every length up to it fits (a windowed model's longer one may where a shorter does not) */
    printf("  longest context for %" PRIu64 " sequence%s: ", p->batch, p->batch == 1 ? "" : "s");
    if (r->max_context < 0)
        printf("unbounded (sliding windows on every layer: memory stops growing)\n");
    else
        printf("%s%" PRId64 " tokens%s\n", (uint64_t)r->max_context == KVP_CAP_MAX_SEQ_LEN ? "at least " : "",
               r->max_context,
               c->n_ctx && (uint64_t)r->max_context > c->n_ctx ? " (beyond the trained context)" : "");
    if (!r->batch_fits && r->fits)
        printf("  a batch of %" PRIu64 " does not fit\n", p->batch);
    if (r->decode_tokens_per_s > 0)
        printf("  decode roofline, batch %" PRIu64 ": %.0f tokens/s (reads %s a step)\n", p->batch,
               r->decode_tokens_per_s, gbs(b1, sizeof b1, (double)r->decode_bytes_per_step));
}

/* ---- one point of the sweep ---- */

/* Swept over more than one value. */
static int swept(int id) { return sweeps[id].spec && sweeps[id].n > 1; }

/* The sweep table's own columns; any other swept option gets one ahead of them. */
static int in_sweep_table(int id)
{
    return id == SW_SEQ_LEN || id == SW_BATCH || id == SW_TP || id == SW_PP || id == SW_BLOCK;
}

static void sweep_value(char *buf, size_t n, int id, double v)
{
    snprintf(buf, n, sweeps[id].kind == K_REAL ? "%.6g" : "%.0f", v);
}

/* A swept option's column: as wide as its name and its widest value. */
static int sweep_width(int id)
{
    static int width[SW_COUNT];
    if (!width[id]) {
        width[id] = (int)strlen(sweeps[id].name) > 10 ? (int)strlen(sweeps[id].name) : 10;
        for (size_t i = 0; i < sweeps[id].n; i++) {
            char v[32];
            sweep_value(v, sizeof v, id, sweeps[id].vals[i]);
            if ((int)strlen(v) > width[id])
                width[id] = (int)strlen(v);
        }
    }
    return width[id];
}

/* The leading columns of a sweep's row: the swept options' names (point
 * NULL) or their values at point; all: every swept option, else those the
 * table has no column for. */
static const char *sweep_lead(char *buf, size_t n, const double *point, int all)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int id = 0; id < SW_COUNT && o < n; id++) {
        if (!swept(id) || (!all && in_sweep_table(id)))
            continue;
        char v[32];
        if (point)
            sweep_value(v, sizeof v, id, point[id]);
        else
            snprintf(v, sizeof v, "%s", sweeps[id].name);
        o += (size_t)snprintf(buf + o, n - o, "%-*s ", sweep_width(id), v);
    }
    return buf;
}

/* A text sweep prints its fragmentation after the table: keep this point's. */
static void keep_sim(run *R, const kvp_cap_sim_row *rows, size_t n)
{
    if (R->n_sim_pts == R->cap_sim_pts) {
        size_t cap = R->cap_sim_pts ? 2 * R->cap_sim_pts : 16;
        sim_point *q = realloc(R->sim_pts, cap * sizeof *q);
        if (!q)
            kvp_cli_die("out of memory for the sweep's fragmentation results");
        R->sim_pts = q;
        R->cap_sim_pts = cap;
    }
    sim_point *s = &R->sim_pts[R->n_sim_pts++];
    memcpy(s->point, R->point, sizeof s->point);
    memcpy(s->rows, rows, n * sizeof *rows);
    s->n = n;
}

static void print_sim_sweep(const run *R)
{
    char lead[1024], reserve[32];
    if (!R->n_sim_pts)
        return;
    if (swept(SW_SEQ_LEN))
        snprintf(reserve, sizeof reserve, "seq-len");
    else
        snprintf(reserve, sizeof reserve, "%" PRIu64, sweeps[SW_SEQ_LEN].spec ? (uint64_t)sweeps[SW_SEQ_LEN].vals[0]
                                                                            : R->base.seq_len);
    print_sim_title(R, reserve);
    print_sim_head(R, sweep_lead(lead, sizeof lead, NULL, 1));
    for (size_t i = 0; i < R->n_sim_pts; i++) {
        sweep_lead(lead, sizeof lead, R->sim_pts[i].point, 1);
        for (size_t k = 0; k < R->sim_pts[i].n; k++)
            print_sim_row(R, &R->sim_pts[i].rows[k], lead);
    }
}

static void emit(run *R, const kvp_cap_params *p)
{
    kvp_cap_result r;
    kvp_err err = {0};
    if (kvp_cap_compute(p, &r, &err)) {
        if (err.code == KVP_EINVAL)
            kvp_cli_usage_error("%s", err.msg);
        kvp_cli_die_err(&err);
    }
    kvp_cap_sim_row sim[SIM_SIZES + 2];
    uint32_t sizes[SIM_SIZES + 1];
    size_t n_sim = 0;
    if (R->have_lengths)
        simulate(R, p, &r, sim, &n_sim, sizes);

    row w;
    fill_row(&w, R, p, &r);
    if (R->json) {
        printf("{");
        print_json_fields(&w);
        if (p->pp > 1 && R->have_gpu)
            print_stages_json(&r);
        if (n_sim)
            print_sim_json(sim, n_sim);
        printf("}\n");
    } else if (R->tsv) {
        if (!R->tsv_header_done) {
            for (int i = 0; i < w.n; i++)
                printf("%s%s", i ? "\t" : "", w.f[i].name);
            printf("\n");
            R->tsv_header_done = 1;
        }
        for (int i = 0; i < w.n; i++) {
            if (i)
                putchar('\t');
            for (const char *q = w.f[i].str ? w.f[i].str : w.f[i].num; *q; q++) /* a field must not break the row */
                putchar(*q == '\t' || *q == '\n' || *q == '\r' ? ' ' : *q);
        }
        printf("\n");
    } else if (R->sweeping) {
        char lead[1024];
        if (!R->tsv_header_done) {
            printf("%s%-10s %-8s %-5s %-4s %-4s %16s %18s %16s %10s %12s\n", sweep_lead(lead, sizeof lead, NULL, 0),
                   "seq_len", "batch", "tp", "pp", "block", "kv_bytes (B)", "weights/gpu (B)", "kv_free/gpu (B)",
                   "max_seqs", "max_context");
            R->tsv_header_done = 1;
        }
        const kvp_cap_stage *st = &r.stage[r.binding];
        char ctx[32]; /* as the report says it: unbounded, or at least 2^32 */
        if (r.max_context < 0)
            snprintf(ctx, sizeof ctx, "unbounded");
        else
            snprintf(ctx, sizeof ctx, "%s%" PRId64, (uint64_t)r.max_context == KVP_CAP_MAX_SEQ_LEN ? ">=" : "",
                     r.max_context);
        printf("%s%-10" PRIu64 " %-8" PRIu64 " %-5u %-4u %-4u %16" PRIu64 " %18" PRIu64 " %16" PRId64 " %10" PRIu64
               " %12s\n",
               sweep_lead(lead, sizeof lead, R->point, 0), p->seq_len, p->batch, p->tp, p->pp, p->block_size,
               r.kv_bytes, st->weight_bytes, st->kv_free_bytes, r.max_seqs, ctx);
        if (n_sim)
            keep_sim(R, sim, n_sim);
    } else {
        print_human(R, p, &r);
        if (n_sim)
            print_sim_human(R, p, sim, n_sim);
    }
}

/* The options that change the model's shape. */
static int shapes_model(int id) { return id >= SW_LAYERS && id <= SW_EXPERTS_USED; }

/* "Llama-3-8B with --kv-heads 7", or for a model of options alone
 * "--layers 2 --hidden 64 --heads 4 --kv-heads 3": what a shape's refusal
 * names, the shape options at this point with their values. */
static const char *shape_source(char *buf, size_t n, const run *R)
{
    size_t o = 0;
    int from_options = strcmp(R->model_source, "options") == 0;
    buf[0] = '\0';
    if (!from_options)
        o += (size_t)snprintf(buf, n, "%s with", R->model_label);
    for (int id = 0; id < SW_COUNT && o < n; id++) {
        if (!shapes_model(id) || !sweeps[id].spec)
            continue;
        char v[32];
        sweep_value(v, sizeof v, id, R->point[id]);
        o += (size_t)snprintf(buf + o, n - o, "%s--%s %s", o ? " " : "", sweeps[id].name, v);
    }
    return buf;
}

/* Before anything is printed, every point passes the rules decode applies:
 * its loader's to the model's shape, its shards' to the --tp split.  A
 * file's own values passed when it was read, so what fails here came from
 * the command line: a usage error. */
static void check_point(run *R, const kvp_cap_params *q)
{
    kvp_err err = {0};
    char src[512];
    if (kvp_config_check_shape(&q->cfg, shape_source(src, sizeof src, R), &err))
        kvp_cli_usage_error("%s", err.msg);
    if (kvp_shard_check_split_cols(&q->cfg, q->col_units, q->tp, &err) < 0)
        kvp_cli_usage_error("%s: %s", R->tp_given ? "--tp" : "--gpus", err.msg);
}

/* Nested loops over every swept option, in table order; leaf gets each
 * point. */
static void sweep_from(run *R, kvp_cap_params *p, int id, void (*leaf)(run *, const kvp_cap_params *))
{
    while (id < SW_COUNT && !sweeps[id].spec)
        id++;
    if (id == SW_COUNT) {
        kvp_cap_params q = *p;
        if (!R->gpus_given) /* one replica */
            q.gpus = q.tp * q.pp;
        else if (!R->tp_given && q.gpus % q.pp == 0) /* --gpus N alone: tensor parallel over them */
            q.tp = q.gpus / q.pp;
        leaf(R, &q);
        return;
    }
    for (size_t i = 0; i < sweeps[id].n; i++) {
        kvp_cap_params q = *p;
        apply(&q, id, sweeps[id].vals[i]);
        R->point[id] = sweeps[id].vals[i];
        sweep_from(R, &q, id + 1, leaf);
    }
}

/* Every sequence starts with the shared prefix, so none may be shorter
 * than it: refused, not clamped, when even the longest length the
 * simulation can draw (at the shortest --seq-len swept) is. */
static void check_shared_prefix(const run *R, const char *spec)
{
    uint64_t seq_len = R->base.seq_len;
    if (sweeps[SW_SEQ_LEN].spec)
        for (size_t i = 0; i < sweeps[SW_SEQ_LEN].n; i++)
            if (i == 0 || (uint64_t)sweeps[SW_SEQ_LEN].vals[i] < seq_len)
                seq_len = (uint64_t)sweeps[SW_SEQ_LEN].vals[i];
    uint64_t longest = kvp_cap_lengths_max(&R->lengths, seq_len);
    if (R->shared_prefix <= longest)
        return;
    if (longest < seq_len)
        kvp_cli_usage_error("--shared-prefix: %" PRIu64 " tokens is longer than the longest sequence, %" PRIu64
                            " tokens (the most --lengths %s gives)",
                            R->shared_prefix, longest, spec);
    kvp_cli_usage_error("--shared-prefix: %" PRIu64 " tokens is longer than the longest sequence, %" PRIu64
                        " tokens (--seq-len%s: lengths are clamped to it)",
                        R->shared_prefix, longest, swept(SW_SEQ_LEN) ? ", the shortest swept" : "");
}

/* ---- listing ---- */

static void list_models(int json)
{
    for (size_t i = 0; i < kvp_preset_model_count(); i++) {
        const kvp_model_preset *m = kvp_preset_model_at(i);
        uint64_t total, active;
        kvp_cap_param_count(&m->cfg, m->q_lora_rank, &total, &active);
        kvp_cap_params p;
        kvp_cap_params_init(&p);
        p.cfg = m->cfg;
        p.q_lora_rank = m->q_lora_rank;
        kvp_cap_result r;
        kvp_err err = {0};
        if (kvp_cap_compute(&p, &r, &err))
            kvp_cli_die_err(&err);
        if (json) {
            printf("{\"name\":");
            kvp_cli_json_str(stdout, m->name, strlen(m->name));
            printf(",\"description\":");
            kvp_cli_json_str(stdout, m->desc, strlen(m->desc));
            printf(",\"n_params\":%" PRIu64 ",\"n_params_active\":%" PRIu64 ",\"kv_bytes_per_token\":%" PRIu64
                   ",\"n_ctx\":%u}\n",
                   total, active, r.kv_bytes_per_token, m->cfg.n_ctx);
        } else {
            if (i == 0)
                printf("%-16s %9s %14s %8s  %s\n", "name", "params", "KV B/token f16", "context", "description");
            printf("%-16s %8.2fB %14" PRIu64 " %8u  %s\n", m->name, (double)total / 1e9, r.kv_bytes_per_token,
                   m->cfg.n_ctx, m->desc);
        }
    }
}

static void list_gpus(int json)
{
    for (size_t i = 0; i < kvp_preset_gpu_count(); i++) {
        const kvp_gpu_preset *g = kvp_preset_gpu_at(i);
        if (json) {
            printf("{\"name\":");
            kvp_cli_json_str(stdout, g->name, strlen(g->name));
            printf(",\"description\":");
            kvp_cli_json_str(stdout, g->desc, strlen(g->desc));
            printf(",\"mem_bytes\":%" PRIu64 ",\"bw_bytes_per_s\":%.0f,\"tflops_bf16\":%g,\"tflops_fp8\":%g}\n",
                   g->mem_bytes, g->bw_bytes_per_s, g->tflops_bf16, g->tflops_fp8);
        } else {
            if (i == 0)
                printf("%-10s %10s %10s %8s %8s  %s\n", "name", "memory", "GiB", "TB/s", "bf16 TF", "description");
            printf("%-10s %7.1f GB %10.2f %8.2f %8.0f  %s\n", g->name, (double)g->mem_bytes / 1e9,
                   (double)g->mem_bytes / 1073741824.0, g->bw_bytes_per_s / 1e12, g->tflops_bf16, g->desc);
        }
    }
}

/* ---- main ---- */

enum {
    OPT_LIST_MODELS = 256, OPT_LIST_GPUS, OPT_JSON, OPT_TSV, OPT_KV_DTYPE, OPT_WEIGHT_DTYPE, OPT_EMBED_DTYPE,
    OPT_LENGTHS, OPT_SEED, OPT_SHARED_PREFIX, OPT_CHECK, OPT_KV_MEM, OPT_SWEEP_BASE = 512
};

static const char *model_path_like(const char *s)
{
    size_t n = strlen(s);
    if (strchr(s, '/'))
        return s;
    if (n > 5 && (strcmp(s + n - 5, ".gguf") == 0 || strcmp(s + n - 5, ".json") == 0))
        return s;
    if (n > 4 && strcmp(s + n - 4, ".kvp") == 0)
        return s;
    return NULL;
}

static void load_model(run *R, const char *name)
{
    kvp_cap_params *p = &R->base;
    const kvp_model_preset *m = kvp_preset_model_find(name);
    struct stat st;
    if (m && stat(name, &st) != 0) {
        p->cfg = m->cfg;
        p->q_lora_rank = m->q_lora_rank;
        R->model_label = m->cfg.name;
        R->model_source = "preset";
        return;
    }
    /* '-' is standard input: the loader keeps the bytes it sniffs the kind
     * from, so a pipe works as a file does */
    if (strcmp(name, "-") != 0 && stat(name, &st) != 0 && !model_path_like(name))
        kvp_cli_usage_error("--model: '%s' is neither a preset (kvcalc --list-models) nor a file", name);
    kvp_cap_model_file mf;
    kvp_err err = {0};
    if (kvp_cap_load_model(name, &mf, &err))
        kvp_cli_die_err(&err);
    p->cfg = mf.cfg;
    p->q_lora_rank = mf.q_lora_rank;
    p->col_units = mf.col_units;
    R->model_source = mf.kind[0] == 'g' ? "gguf" : mf.kind[0] == 'k' ? "kvp" : "hf";
    R->model_label = p->cfg.name[0] ? p->cfg.name : name;
    if (mf.weight_bytes) {
        p->weight_bytes_override = mf.weight_bytes;
        memcpy(p->weight_class_bytes, mf.weight_class_bytes, sizeof p->weight_class_bytes);
        kvp_cap_fmt f;
        if (mf.weight_type[0] && kvp_cap_weight_fmt(mf.weight_type, &f, NULL) == 0)
            p->weight_fmt = p->embed_fmt = f;
        if (mf.embed_type[0] && kvp_cap_weight_fmt(mf.embed_type, &f, NULL) == 0)
            p->embed_fmt = f;
    } else if (mf.weight_type[0]) { /* an HF quantization_config: the linear layers' format */
        kvp_cap_fmt f;
        if (kvp_cap_weight_fmt(mf.weight_type, &f, NULL) == 0)
            p->weight_fmt = f; /* embeddings, norms and lm_head stay 16-bit, as such checkpoints keep them */
    }
}

/* ---- --check: kvcalc's model beside a decode run (kvcalc(1) CHECKING A RUN) ---- */

/* The options --check takes: the model's shape and the block size, one
 * value each.  The rest plan a GPU, which the check has none of. */
static int check_takes(int id)
{
    return id == SW_BLOCK || (id >= SW_LAYERS && id <= SW_PARAMS && id != SW_WINDOW);
}

static const char *row_label(char *buf, size_t n, const kvp_cap_check_row *w, int i)
{
    if (i == KVP_CAP_ROW_SEQS_MEAN || i == KVP_CAP_ROW_SEQS_MAX)
        snprintf(buf, n, "seqs of %" PRIu64 " tok (%s)", w->len, i == KVP_CAP_ROW_SEQS_MEAN ? "mean" : "longest");
    else
        snprintf(buf, n, "%s", w->field);
    return buf;
}

/* Why a row is reported and not checked. */
static const char *row_note(char *buf, size_t n, const kvp_cap_check *c, const kvp_cap_run *rs, int i)
{
    const kvp_cap_check_row *w = &c->row[i];
    buf[0] = '\0';
    if (w->rule != KVP_CAP_RULE_INFO)
        return buf;
    if (i == KVP_CAP_ROW_SEQS_MEAN || i == KVP_CAP_ROW_SEQS_MAX)
        snprintf(buf, n, ": decode's is peak_running");
    else if (rs->requests == 0)
        snprintf(buf, n, ": no request");
    else if (strcmp(rs->input, "kvp") == 0)
        snprintf(buf, n, ": a KV stream's sequences hold blocks while they wait");
    else if (rs->kv_out)
        snprintf(buf, n, ": --kv-out keeps finished requests' blocks");
    else if (rs->stopped)
        snprintf(buf, n, ": the run was stopped");
    else if (i == KVP_CAP_ROW_PREEMPTIONS)
        snprintf(buf, n, ": %" PRIu64 " of the longest fit, %" PRIu64 " could run",
                 c->row[KVP_CAP_ROW_SEQS_MAX].predicted, c->seats);
    else if (c->row[KVP_CAP_ROW_SEQS_MAX].predicted >= 1) /* kv_memory: the longest filled the pool */
        snprintf(buf, n, ": the longest filled the pool (a request that ran out is counted at the length it reached)");
    else
        snprintf(buf, n, ": not one of the longest fits");
    return buf;
}

/* The fields that disagree, comma-separated: JSON strings, or words. */
static void print_failed(int fp_bad, const kvp_cap_check *c, int json)
{
    int k = 0;
    for (int i = -1; i < KVP_CAP_CHECK_ROWS; i++) {
        if (i < 0 ? !fp_bad : c->row[i].ok)
            continue;
        const char *name = i < 0 ? "model_fingerprint" : c->row[i].field;
        printf(json ? "%s\"%s\"" : "%s %s", k++ ? "," : "", name);
    }
}

static const char *rule_name(int rule)
{
    return rule == KVP_CAP_RULE_EQUAL ? "equal" : rule == KVP_CAP_RULE_AT_MOST ? "at most" : "reported";
}

static int check_run(run *R, const char *stats, const char *model, const char *kv_dtype, const char *kv_mem)
{
    for (int i = 0; i < SW_COUNT; i++) {
        if (!sweeps[i].spec)
            continue;
        if (!check_takes(i))
            kvp_cli_usage_error("--check: --%s does not apply (the run's pool is checked, not a GPU plan)",
                                sweeps[i].name);
        expand_sweep(&sweeps[i]);
        if (sweeps[i].n != 1)
            kvp_cli_usage_error("--check: --%s: one value, not a sweep", sweeps[i].name);
    }
    uint64_t mem = 0;
    if (kv_mem) {
        if (strchr(kv_mem, ':')) /* one pool is checked */
            kvp_cli_usage_error("--kv-mem: '%s': one value, not a sweep", kv_mem);
        mem = kvp_cli_opt_size("--kv-mem", kv_mem);
        if (mem == 0)
            kvp_cli_usage_error("--kv-mem: 0 bytes holds no block");
    }
    kvp_cap_run rs;
    kvp_err err = {0};
    if (kvp_cap_run_load(&rs, stats, &err))
        kvp_cli_die_err(&err);

    /* the model: -m, else the file the run names */
    int model_from_run = !model;
    if (!model) {
        struct stat st;
        /* a stats file's fault like its other fields' (exit 1); with -m the
         * field is not needed */
        if (!rs.model[0])
            kvp_cli_die("%s: model: empty, the run names no model file: give -m MODEL", stats);
        if (stat(rs.model, &st) != 0)
            kvp_cli_die("%s: model: '%s' is not here (a path as decode was given it): give -m MODEL", stats,
                        rs.model);
        model = rs.model;
    }
    load_model(R, model);
    kvp_cap_params *p = &R->base;
    for (int i = SW_LAYERS; i <= SW_PARAMS; i++)
        if (sweeps[i].spec) {
            apply(p, i, sweeps[i].vals[0]);
            R->point[i] = sweeps[i].vals[0];
        }
    char src[512];
    if (kvp_config_check_shape(&p->cfg, shape_source(src, sizeof src, R), &err))
        kvp_cli_usage_error("%s", err.msg);
    /* the run's KV dtype, block size and pool, unless the command line says */
    const char *dtype_src = kv_dtype ? "--kv-dtype" : "the run's";
    if (kvp_cap_kv_fmt(kv_dtype ? kv_dtype : rs.kv_dtype, &p->kv_fmt, &err))
        kvp_cli_usage_error("--kv-dtype: %s", err.msg);
    const char *bs_src = sweeps[SW_BLOCK].spec ? "--block-size" : "the run's";
    p->block_size = sweeps[SW_BLOCK].spec ? (uint32_t)sweeps[SW_BLOCK].vals[0] : rs.block_size;
    int pool = kv_mem ? KVP_CAP_POOL_MEM : rs.pool;
    if (!kv_mem)
        mem = rs.kv_mem;

    /* the fingerprint, when the model is a file the loader reads */
    char fp[33] = "";
    const char *fp_note = "not checked: a preset has no fingerprint";
    int fp_bad = 0;
    if (strcmp(R->model_source, "preset") != 0) {
        kvp_model *m = NULL;
        kvp_err merr = {0};
        if (kvp_model_load(&m, model, &merr) == 0) {
            kvp_model_fingerprint_hex(m, fp);
            fp_bad = strcmp(fp, rs.fingerprint) != 0;
            fp_note = fp_bad ? "DIFFERS from the run's" : "the run's";
            kvp_model_free(m);
        } else {
            fp_note = "not checked: decode's loader does not read this model";
        }
    }

    kvp_cap_check c;
    if (kvp_cap_check_run(p, pool, mem, &rs, &c, &err)) {
        if (err.code == KVP_EINVAL)
            kvp_cli_usage_error("--check: %s", err.msg);
        if (err.code == KVP_EMISMATCH) /* the run's tp or pp: the stats file's field */
            kvp_cli_die("%s: %s", stats, err.msg);
        kvp_cli_die_err(&err);
    }
    int agree = c.n_failed == 0 && !fp_bad;
    const kvp_config *cfg = &p->cfg;

    if (R->json) {
        printf("{\"stats\":");
        kvp_cli_json_str(stdout, stats, strlen(stats));
        printf(",\"model\":");
        kvp_cli_json_str(stdout, R->model_label, strlen(R->model_label));
        printf(",\"source\":\"%s\",\"model_path\":", R->model_source);
        kvp_cli_json_str(stdout, model, strlen(model));
        printf(",\"model_fingerprint\":");
        if (fp[0])
            printf("\"%s\"", fp);
        else
            printf("null");
        printf(",\"run_fingerprint\":\"%s\",\"fingerprint_ok\":%s", rs.fingerprint,
               fp[0] ? (fp_bad ? "false" : "true") : "null");
        printf(",\"kv_dtype\":\"%s\",\"block_size\":%u,\"kv_pool_sized_by\":\"%s\",\"kv_mem\":", p->kv_fmt.name,
               p->block_size, kvp_cap_pool_name(pool));
        if (pool == KVP_CAP_POOL_MEM)
            printf("%" PRIu64, mem);
        else
            printf("null");
        printf(",\"tp\":%u,\"pp\":%u,\"n_layer\":%u,\"n_head_kv\":%u,\"layer_block_bytes\":%" PRIu64
               ",\"kv_bytes_per_token\":%" PRIu64 ",\"mean_seq_len\":%" PRIu64 ",\"max_seq_len\":%" PRIu64
               ",\"seats\":%" PRIu64 ",\"rows\":[",
               rs.tp, rs.pp, c.n_layer, c.kv_heads, c.layer_block_bytes, c.bytes_per_token, c.mean_len, c.max_len,
               c.seats);
        for (int i = 0; i < KVP_CAP_CHECK_ROWS; i++) {
            const kvp_cap_check_row *w = &c.row[i];
            char lb[48];
            printf("%s{\"quantity\":", i ? "," : "");
            row_label(lb, sizeof lb, w, i);
            kvp_cli_json_str(stdout, lb, strlen(lb));
            printf(",\"field\":\"%s\",\"kvcalc\":", w->field);
            if (w->has_predicted)
                printf("%" PRIu64, w->predicted);
            else
                printf("null");
            printf(",\"decode\":%" PRIu64 ",\"ratio\":", w->measured);
            if (w->has_predicted && w->predicted)
                printf("%.6g", (double)w->measured / (double)w->predicted);
            else
                printf("null");
            printf(",\"rule\":\"%s\",\"ok\":%s}", rule_name(w->rule), w->ok ? "true" : "false");
        }
        printf("],\"agree\":%s,\"failed\":[", agree ? "true" : "false");
        print_failed(fp_bad, &c, 1);
        printf("]}\n");
    } else {
        char b1[32], b2[32], b3[32];
        printf("decode's run (%s) beside kvcalc's model\n", stats);
        printf("  model        %s (%s: %s%s)\n", R->model_label, R->model_source, model,
               model_from_run ? ", as the run names it" : "");
        printf("  fingerprint  %s: %s\n", fp[0] ? fp : rs.fingerprint, fp_note);
        if (rs.tp > 1 || rs.pp > 1)
            printf("  split        tp %u x pp %u: the pool is rank 0's, %u of %u layers and %u of %u KV heads\n",
                   rs.tp, rs.pp, c.n_layer, cfg->n_layer, c.kv_heads, cfg->kv_lora_rank ? 1 : cfg->n_head_kv);
        printf("  KV           %s (%s), blocks of %u tokens (%s); one block holds all %u layers:\n", p->kv_fmt.name,
               dtype_src, p->block_size, bs_src, c.n_layer);
        printf("               %u x %s B%s = %s B\n", c.n_layer, commas(b1, sizeof b1, c.layer_block_bytes),
               p->kv_fmt.scale == KVP_CAP_SCALE_BLOCK || p->kv_fmt.scale == KVP_CAP_SCALE_TOKEN ? " (scales included)" : "",
               commas(b2, sizeof b2, c.block_bytes));
        if (pool == KVP_CAP_POOL_MEM)
            printf("  pool         --kv-mem %s B (%s): %s blocks\n", commas(b1, sizeof b1, mem),
                   kv_mem ? "the command line" : "the run's", commas(b2, sizeof b2, c.n_blocks));
        else if (pool == KVP_CAP_POOL_BLOCKS)
            printf("  pool         --kv-blocks %s (the run's)\n", commas(b1, sizeof b1, c.n_blocks));
        else
            printf("  pool         the model's context, %u tokens: %s blocks\n", cfg->n_ctx ? cfg->n_ctx : 4096,
                   commas(b1, sizeof b1, c.n_blocks));
        printf("  run          %" PRIu64 " requests (%s), mean %.2f + %.2f tokens, longest %" PRIu64
               "; up to %u at once\n\n",
               rs.requests, strcmp(rs.input, "kvp") == 0 ? "from a KV stream" : "from prompts",
               rs.requests ? (double)rs.prompt_tokens / (double)rs.requests : 0.0,
               rs.requests ? (double)rs.output_tokens / (double)rs.requests : 0.0, rs.max_seq_len,
               rs.max_num_seqs);
        printf("%-24s %14s %14s %8s  %s\n", "quantity", "kvcalc", "decode", "ratio", "check");
        for (int i = 0; i < KVP_CAP_CHECK_ROWS; i++) {
            const kvp_cap_check_row *w = &c.row[i];
            char lb[48], pb[40], rb[16];
            row_label(lb, sizeof lb, w, i);
            if (!w->has_predicted)
                snprintf(pb, sizeof pb, "-");
            else if (w->rule == KVP_CAP_RULE_AT_MOST)
                snprintf(pb, sizeof pb, "<= %s", commas(b1, sizeof b1, w->predicted));
            else
                snprintf(pb, sizeof pb, "%s", commas(b1, sizeof b1, w->predicted));
            if (w->has_predicted && w->predicted)
                snprintf(rb, sizeof rb, "%.3f", (double)w->measured / (double)w->predicted);
            else
                snprintf(rb, sizeof rb, "-");
            char nb[96];
            printf("%-24s %14s %14s %8s  %s%s%s\n", lb, pb, commas(b3, sizeof b3, w->measured), rb,
                   w->rule == KVP_CAP_RULE_INFO ? "" : w->ok ? "ok: " : "DIFFERS: ", rule_name(w->rule),
                   row_note(nb, sizeof nb, &c, &rs, i));
        }
        if (agree)
            printf("verdict: agree (block bytes, blocks and pool exact; peak within the pool%s)\n",
                   c.row[KVP_CAP_ROW_PREEMPTIONS].has_predicted ? "; no preemption where all fit" : "");
        else {
            printf("verdict: DISAGREE on");
            print_failed(fp_bad, &c, 0);
            printf("\n");
        }
    }
    int rc = kvp_cli_close_stdout();
    if (!agree) {
        char msg[512];
        size_t o = 0;
        if (fp_bad)
            o += (size_t)snprintf(msg + o, sizeof msg - o, " model_fingerprint (kvcalc's model %s, the run's %s)", fp,
                                  rs.fingerprint);
        for (int i = 0; i < KVP_CAP_CHECK_ROWS && o < sizeof msg; i++)
            if (!c.row[i].ok)
                o += (size_t)snprintf(msg + o, sizeof msg - o, "%s %s (kvcalc %s%" PRIu64 ", decode %" PRIu64 ")",
                                      o ? "," : "", c.row[i].field,
                                      c.row[i].rule == KVP_CAP_RULE_AT_MOST ? "at most " : "", c.row[i].predicted,
                                      c.row[i].measured);
        kvp_cli_warn("%s: the run disagrees with kvcalc's model on%s", stats, msg);
        return KVP_EXIT_FAIL;
    }
    return rc;
}

int main(int argc, char **argv)
{
    kvp_cli_init(argv[0]);
    static run R;
    kvp_cap_params_init(&R.base);
    R.model_source = "options";
    R.model_label = "custom";
    R.seed = 1;

    static const struct option fixed[] = {
        {"model", required_argument, NULL, 'm'},
        {"gpu", required_argument, NULL, 'g'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {"list-models", no_argument, NULL, OPT_LIST_MODELS},
        {"list-gpus", no_argument, NULL, OPT_LIST_GPUS},
        {"json", no_argument, NULL, OPT_JSON},
        {"tsv", no_argument, NULL, OPT_TSV},
        {"kv-dtype", required_argument, NULL, OPT_KV_DTYPE},
        {"weight-dtype", required_argument, NULL, OPT_WEIGHT_DTYPE},
        {"embed-dtype", required_argument, NULL, OPT_EMBED_DTYPE},
        {"lengths", required_argument, NULL, OPT_LENGTHS},
        {"seed", required_argument, NULL, OPT_SEED},
        {"shared-prefix", required_argument, NULL, OPT_SHARED_PREFIX},
        {"check", required_argument, NULL, OPT_CHECK},
        {"kv-mem", required_argument, NULL, OPT_KV_MEM},
    };
    /* the fixed options, one a sweep, the zero entry: sized by the compiler */
    struct option longopts[sizeof fixed / sizeof fixed[0] + SW_COUNT + 1];
    size_t nl = 0;
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        longopts[nl++] = fixed[i];
    for (int i = 0; i < SW_COUNT; i++)
        longopts[nl++] = (struct option){sweeps[i].name, required_argument, NULL, OPT_SWEEP_BASE + i};
    longopts[nl] = (struct option){NULL, 0, NULL, 0};

    const char *model = NULL, *gpu = NULL, *kv_dtype = NULL, *weight_dtype = NULL, *embed_dtype = NULL;
    const char *lengths = NULL, *check = NULL, *kv_mem = NULL;
    const char *not_for_check = NULL; /* an option --check has no use for */
    int list_m = 0, list_g = 0, seed_given = 0, prefix_given = 0, opt;
    while ((opt = getopt_long(argc, argv, "m:g:s:b:hV", longopts, NULL)) != -1) {
        switch (opt) {
        case 'm':
            /* no preset or file has it: a usage error, not "neither a preset nor a file" */
            if (!*optarg)
                kvp_cli_usage_error("--model: an empty name (a preset, kvcalc --list-models, or a model file)");
            model = optarg;
            break;
        case 'g': gpu = optarg; not_for_check = "--gpu"; break;
        case 's': sweeps[SW_SEQ_LEN].spec = optarg; break;
        case 'b': sweeps[SW_BATCH].spec = optarg; break;
        case 'h': usage(stdout); return kvp_cli_close_stdout();
        case 'V': kvp_cli_version();
        case OPT_LIST_MODELS: list_m = 1; break;
        case OPT_LIST_GPUS: list_g = 1; break;
        case OPT_JSON: R.json = 1; break;
        case OPT_TSV: R.tsv = 1; not_for_check = "--tsv"; break;
        case OPT_KV_DTYPE: kv_dtype = optarg; break;
        case OPT_WEIGHT_DTYPE: weight_dtype = optarg; not_for_check = "--weight-dtype"; break;
        case OPT_EMBED_DTYPE: embed_dtype = optarg; not_for_check = "--embed-dtype"; break;
        case OPT_LENGTHS:
            /* else read as a file named "": "No such file or directory", exit 1 */
            if (!*optarg)
                kvp_cli_usage_error("--lengths: an empty spec (a file of lengths, uniform:A:B, normal:MEAN:SD or "
                                    "lognormal:MU:SIGMA)");
            lengths = optarg;
            not_for_check = "--lengths";
            break;
        case OPT_SEED:
            R.seed = opt_whole("--seed", optarg, INT64_MAX);
            seed_given = 1;
            not_for_check = "--seed";
            break;
        case OPT_SHARED_PREFIX:
            R.shared_prefix = opt_whole("--shared-prefix", optarg, 1ull << 32);
            prefix_given = 1;
            not_for_check = "--shared-prefix";
            break;
        case OPT_CHECK: check = optarg; break;
        case OPT_KV_MEM: kv_mem = optarg; break;
        default:
            if (opt >= OPT_SWEEP_BASE && opt < OPT_SWEEP_BASE + SW_COUNT) {
                sweeps[opt - OPT_SWEEP_BASE].spec = optarg;
                break;
            }
            kvp_cli_bad_option(argv, "m:g:s:b:hV", longopts);
        }
    }
    if (optind < argc)
        kvp_cli_usage_error("unexpected argument '%s'", argv[optind]);
    if (R.json && R.tsv)
        kvp_cli_usage_error("--json and --tsv: choose one");
    /* one standard input for two files */
    if (model && !strcmp(model, "-") && ((lengths && !strcmp(lengths, "-")) || (check && !strcmp(check, "-"))))
        kvp_cli_usage_error("-m - and %s - both read standard input: give one of them as a file",
                            lengths && !strcmp(lengths, "-") ? "--lengths" : "--check");
    if (kv_mem && !check)
        kvp_cli_usage_error("--kv-mem goes with --check (for a plan, give --gpu-mem)");
    if (check) {
        if (!*check) /* no file has it: a usage error, not "No such file" */
            kvp_cli_usage_error("--check: an empty file name");
        if (list_m || list_g)
            kvp_cli_usage_error("--check and --list-models/--list-gpus: choose one");
        if (not_for_check)
            kvp_cli_usage_error("--check: %s does not apply (the run's pool is checked, not a GPU plan)",
                                not_for_check);
        return check_run(&R, check, model, kv_dtype, kv_mem);
    }
    if (list_m || list_g) {
        if (R.tsv) /* the tables have no TSV form */
            kvp_cli_usage_error("--tsv: --list-models and --list-gpus print a table, or JSON Lines with --json");
        if (list_m)
            list_models(R.json);
        if (list_g)
            list_gpus(R.json);
        return kvp_cli_close_stdout();
    }

    /* the simulation's settings mean nothing without one */
    if (!lengths && (seed_given || prefix_given))
        kvp_cli_usage_error("%s needs --lengths (it sets up the fragmentation simulation)",
                            prefix_given ? "--shared-prefix" : "--seed");

    /* every swept value is checked before anything is computed */
    for (int i = 0; i < SW_COUNT; i++)
        if (sweeps[i].spec)
            expand_sweep(&sweeps[i]);
    size_t points = 1;
    for (int i = 0; i < SW_COUNT; i++)
        if (sweeps[i].spec) {
            points *= sweeps[i].n;
            if (points > KVP_CAP_SWEEP_MAX)
                kvp_cli_usage_error("the sweep has more than %d points", KVP_CAP_SWEEP_MAX);
        }
    R.sweeping = points > 1;
    for (int i = 0; i < SW_COUNT; i++)
        if (sweeps[i].spec && sweeps[i].n > 1)
            R.sweeping = 1;

    kvp_err err = {0};
    kvp_cap_params *p = &R.base;
    if (model)
        load_model(&R, model);
    else {
        /* a model from options alone: every dimension a model file must
         * have (kvp_config_check), or the FFN and vocabulary were planned
         * as 0 and the weights undercounted */
        static const int need[] = {SW_LAYERS, SW_HIDDEN, SW_HEADS, SW_FFN, SW_VOCAB};
        char missing[128];
        size_t o = 0;
        missing[0] = '\0';
        for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
            if (!sweeps[need[i]].spec)
                o += (size_t)snprintf(missing + o, sizeof missing - o, "%s--%s", o ? ", " : "",
                                      sweeps[need[i]].name);
        if (o)
            kvp_cli_usage_error("give --model, or a model from options: --layers, --hidden, --heads, --ffn and "
                                "--vocab (missing %s)",
                                missing);
    }
    if (!model && !sweeps[SW_KV_HEADS].spec) /* a model from options alone: MHA unless told */
        p->cfg.n_head_kv = (uint32_t)sweeps[SW_HEADS].vals[0];
    /* a changed shape invalidates a file's exact weight bytes */
    for (int i = SW_LAYERS; i <= SW_PARAMS; i++)
        if (sweeps[i].spec && i != SW_WINDOW)
            p->weight_bytes_override = 0;
    if (weight_dtype) {
        if (kvp_cap_weight_fmt(weight_dtype, &p->weight_fmt, &err))
            kvp_cli_usage_error("--weight-dtype: %s", err.msg);
        p->weight_bytes_override = 0; /* a file's own bytes no longer apply */
        if (kvp_cap_fmt_is_float(&p->weight_fmt))
            p->embed_fmt = p->weight_fmt;
        else
            kvp_cap_weight_fmt("bf16", &p->embed_fmt, NULL);
    }
    /* a file's tensors are counted at their own bytes, whatever format the
     * embeddings are said to be in: the label would claim what the bytes
     * are not */
    if (embed_dtype && p->weight_bytes_override)
        kvp_cli_usage_error("--embed-dtype: %s's weights are its tensors' own bytes (embeddings %s): give "
                            "--weight-dtype too, to plan the model in other formats",
                            model, p->embed_fmt.name);
    if (embed_dtype && kvp_cap_weight_fmt(embed_dtype, &p->embed_fmt, &err))
        kvp_cli_usage_error("--embed-dtype: %s", err.msg);
    if (kv_dtype && kvp_cap_kv_fmt(kv_dtype, &p->kv_fmt, &err))
        kvp_cli_usage_error("--kv-dtype: %s", err.msg);
    if (p->cfg.n_ctx)
        p->seq_len = p->cfg.n_ctx;

    if (gpu) {
        R.gpu = kvp_preset_gpu_find(gpu);
        if (!R.gpu)
            kvp_cli_usage_error("--gpu: unknown GPU '%s' (kvcalc --list-gpus)", gpu);
        p->gpu_mem_bytes = R.gpu->mem_bytes;
        p->gpu_bw = R.gpu->bw_bytes_per_s;
        R.have_gpu = 1;
    }
    if (sweeps[SW_GPU_MEM].spec)
        R.have_gpu = 1;
    R.gpus_given = sweeps[SW_GPUS].spec != NULL;
    R.tp_given = sweeps[SW_TP].spec != NULL;

    if (lengths) {
        if (!R.have_gpu)
            kvp_cli_usage_error("--lengths needs --gpu or --gpu-mem (the simulation fills a GPU's KV memory)");
        if (kvp_cap_lengths_parse(&R.lengths, lengths, &err)) {
            if (err.code == KVP_EINVAL)
                kvp_cli_usage_error("--lengths: %s", err.msg);
            kvp_cli_die_err(&err);
        }
        R.have_lengths = 1;
    }

    if (R.have_lengths && R.tsv)
        kvp_cli_usage_error("--lengths prints with the report or --json, not --tsv");
    if (R.have_lengths)
        check_shared_prefix(&R, lengths);
    sweep_from(&R, p, 0, check_point);
    sweep_from(&R, p, 0, emit);
    if (R.sweeping && !R.json)
        print_sim_sweep(&R);
    free(R.sim_pts);
    kvp_cap_lengths_free(&R.lengths);
    return kvp_cli_close_stdout();
}
