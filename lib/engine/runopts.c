/* runopts.c - shared options and setup of prefill and decode. */
#include "runopts.h"
#include "backends.h"
#include "cli.h"
#include "kvscale.h"
#include "sample.h"
#include "seqio.h"
#include "shard.h"
#include "tensor.h"
#include "unicode.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

const struct option kvp_runopts_long[] = {
    {"model", required_argument, NULL, 'm'},
    {"prompt", required_argument, NULL, 'p'},
    {"file", required_argument, NULL, 'f'},
    {"tokens", required_argument, NULL, KVP_OPT_TOKENS},
    {"chat", no_argument, NULL, KVP_OPT_CHAT},
    {"system", required_argument, NULL, KVP_OPT_SYSTEM},
    {"max-tokens", required_argument, NULL, 'n'},
    {"threads", required_argument, NULL, 't'},
    {"backend", required_argument, NULL, KVP_OPT_BACKEND},
    {"block-size", required_argument, NULL, KVP_OPT_BLOCK_SIZE},
    {"kv-mem", required_argument, NULL, KVP_OPT_KV_MEM},
    {"kv-blocks", required_argument, NULL, KVP_OPT_KV_BLOCKS},
    {"kv-dtype", required_argument, NULL, KVP_OPT_KV_DTYPE},
    {"temperature", required_argument, NULL, KVP_OPT_TEMP},
    {"top-k", required_argument, NULL, KVP_OPT_TOP_K},
    {"top-p", required_argument, NULL, KVP_OPT_TOP_P},
    {"min-p", required_argument, NULL, KVP_OPT_MIN_P},
    {"repeat-penalty", required_argument, NULL, KVP_OPT_REPEAT},
    {"seed", required_argument, NULL, KVP_OPT_SEED},
    {"chunk", required_argument, NULL, KVP_OPT_CHUNK},
    {"stats", optional_argument, NULL, KVP_OPT_STATS},
    {"json", no_argument, NULL, KVP_OPT_JSON},
    {"stop", required_argument, NULL, KVP_OPT_STOP},
    {"ignore-eos", no_argument, NULL, KVP_OPT_IGNORE_EOS},
    {"kv-out", required_argument, NULL, KVP_OPT_KV_OUT},
    {"max-num-seqs", required_argument, NULL, KVP_OPT_MAX_NUM_SEQS},
    {"max-batched-tokens", required_argument, NULL, KVP_OPT_MAX_BATCHED},
    {"static", no_argument, NULL, KVP_OPT_STATIC},
    {"no-special", no_argument, NULL, KVP_OPT_NO_SPECIAL},
    {"tp", required_argument, NULL, KVP_OPT_TP},
    {"pp", required_argument, NULL, KVP_OPT_PP},
    {"timeout", required_argument, NULL, KVP_OPT_TIMEOUT},
    {"help", no_argument, NULL, KVP_OPT_HELP},
    {"version", no_argument, NULL, KVP_OPT_VERSION},
    {NULL, 0, NULL, 0},
};
_Static_assert(sizeof kvp_runopts_long / sizeof kvp_runopts_long[0] == KVP_RUNOPTS_N_LONG + 1,
               "KVP_RUNOPTS_N_LONG counts kvp_runopts_long's entries");

/* The shared options' help, in three parts: the scheduler's lines are
 * decode's alone (prefill computes one prompt at a time). */
#define HELP_HEAD \
    "  -m, --model FILE        model: GGUF, KVP model file (quantize) or HF folder\n" \
    "  -p, --prompt TEXT       one prompt\n" \
    "  -f, --file FILE         prompts: JSON Lines ({\"id\",\"prompt\"} or {\"messages\"}) or one text\n" \
    "      --tokens IDS        one prompt as token ids, comma-separated\n" \
    "      --chat              render plain prompts in the model's chat format\n" \
    "      --no-special        take <|im_start|> etc. in plain prompts as text, not special tokens\n" \
    "      --system TEXT       system message for --chat\n" \
    "  -n, --max-tokens N      tokens to generate per sequence (128)\n" \
    "      --temperature T     0 is greedy (default 0)\n" \
    "      --repeat-penalty R  logits of the last 64 tokens divided by R (default 1: none)\n" \
    "      --top-k K           keep the K likeliest tokens (default 0: all)\n" \
    "      --top-p P           keep the likeliest summing to P (default 1: all)\n" \
    "      --min-p P           drop tokens below P times the likeliest's probability (default 0)\n" \
    "      --seed N            each sequence's generator, with its id (default 0)\n" \
    "  -t, --threads N         CPU threads (default: all cores)\n" \
    "      --backend NAME      where the model runs: cpu (default) or cuda; -g is --backend cuda\n" \
    "      --block-size N      tokens per KV block (16)\n" \
    "      --kv-mem SIZE       KV cache size (e.g. 512MiB), or --kv-blocks N\n" \
    "      --kv-dtype TYPE     f16 (default), bf16, f32, or fp8 / int8 (a scale per token and head)\n" \
    "      --chunk N           prompt tokens per forward step (512; in decode and specdec it is\n" \
    "                          --max-batched-tokens, 2048 on a GPU backend)\n"
#define HELP_SCHED \
    "      --max-num-seqs N    sequences running at once (64)\n" \
    "      --max-batched-tokens N  tokens per forward step, decode and prompt chunks together\n" \
    "                          (512; 2048 on a GPU backend)\n" \
    "      --static            static batching: a new batch of --max-num-seqs only when the last has ended\n"
#define HELP_TAIL \
    "      --stats[=FILE]      timings on stderr (with --json: as JSON), or as JSON into FILE\n" \
    "      --tp N              tensor parallelism over N ranks: start with mpirun -np N (each rank maps its\n" \
    "                          shard of the weights and holds its KV heads; rank 0 reads and writes)\n" \
    "      --pp M              pipeline parallelism: the layers in M stages (mpirun -np N*M with --tp N)\n" \
    "      --timeout S         under --tp/--pp: a rank waiting S seconds for its peers ends the job (300)\n"
const char kvp_runopts_help[] = HELP_HEAD HELP_SCHED HELP_TAIL;
const char kvp_runopts_help_one[] = HELP_HEAD HELP_TAIL;

int kvp_runopts_is_sched(int c) { return c == KVP_OPT_MAX_NUM_SEQS || c == KVP_OPT_MAX_BATCHED || c == KVP_OPT_STATIC; }

void kvp_runopts_table(struct option *out, const struct option *own, size_t n_own)
{
    memcpy(out, kvp_runopts_long, KVP_RUNOPTS_N_LONG * sizeof *out);
    memcpy(out + KVP_RUNOPTS_N_LONG, own, n_own * sizeof *own);
    out[KVP_RUNOPTS_N_LONG + n_own] = (struct option){NULL, 0, NULL, 0};
}

void kvp_runopts_init(kvp_runopts *o)
{
    memset(o, 0, sizeof *o);
    kvp_kvcache_opts_init(&o->kv);
    o->kv.dtype_from_stream = 1; /* until --kv-dtype names one */
    kvp_sample_defaults(&o->sampling);
    o->sched.max_num_seqs = 64;
    o->sched.max_batched_tokens = 0; /* kvp_runopts_set_budget, by backend */
}

void kvp_runopts_set_budget(kvp_runopts *o)
{
    if (o->sched.max_batched_tokens)
        return;
    /* On a GPU a step costs about the same at 512 tokens as at 2048 (it is
     * launches and weight reads), so fewer, fuller steps win, as vLLM's
     * chunked-prefill budget of 2048 assumes; on a CPU a step's time grows
     * with its tokens, and 512 keeps the running sequences' next tokens
     * from waiting behind a long prompt. */
    int gpu = o->backend && strcmp(o->backend, "cpu") != 0;
    o->sched.max_batched_tokens = gpu ? KVP_BUDGET_GPU : KVP_BUDGET_CPU;
}

void kvp_runopts_free(kvp_runopts *o)
{
    free(o->stop);
    o->stop = NULL;
}

static uint32_t parse_u32(const char *opt, const char *arg, int64_t min, int64_t max)
{
    return (uint32_t)kvp_cli_opt_i64(opt, arg, min, max);
}

/* Text for the model must be UTF-8, as a JSON prompt's is: a bad byte is
 * refused here rather than silently dropped by the tokenizer. */
static const char *utf8_arg(const char *opt, const char *arg)
{
    size_t n = strlen(arg), k = kvp_unicode_valid_prefix(arg, n);
    if (k < n)
        kvp_cli_usage_error("%s: invalid UTF-8 at byte offset %zu (0x%02x)", opt, k, (unsigned)(unsigned char)arg[k]);
    return arg;
}

int kvp_runopts_parse(kvp_runopts *o, int c, const char *arg)
{
    switch (c) {
    case 'm': o->model = kvp_cli_opt_path("-m", arg); break;
    case 'p': o->prompt = utf8_arg("-p", arg); break;
    case 'f': o->file = kvp_cli_opt_path("-f", arg); break;
    case KVP_OPT_TOKENS: o->tokens = arg; break;
    case KVP_OPT_CHAT: o->chat = 1; break;
    case KVP_OPT_NO_SPECIAL: o->no_special = 1; break;
    case KVP_OPT_SYSTEM: o->system = utf8_arg("--system", arg); break;
    case 'n': o->sampling.max_tokens = parse_u32("--max-tokens", arg, 0, 1 << 24); o->sampling_set |= KVP_SET_MAX; break;
    case 't': o->threads = (int)kvp_cli_opt_i64("--threads", arg, 1, 1024); break;
    case 'g': o->backend = "cuda"; break;
    case KVP_OPT_BACKEND:
        if (strcmp(arg, "cpu") && strcmp(arg, "cuda"))
            kvp_cli_usage_error("--backend: '%s': use cpu or cuda", arg);
        o->backend = arg;
        break;
    case KVP_OPT_BLOCK_SIZE:
        o->kv.block_size = parse_u32("--block-size", arg, 1, 4096);
        /* Blocks are allocated and hashed as power-of-two token groups, as in
         * kvcalc; anything else is a mistake worth catching early. */
        if (o->kv.block_size & (o->kv.block_size - 1))
            kvp_cli_usage_error("--block-size: %u is not a power of two", o->kv.block_size);
        break;
    case KVP_OPT_KV_MEM:
    case KVP_OPT_KV_BLOCKS:
        /* one size for the cache: the second would be silently ignored */
        if (c == KVP_OPT_KV_MEM ? o->kv.n_blocks != 0 : o->kv.mem_bytes != 0)
            kvp_cli_usage_error("--kv-mem and --kv-blocks both size the KV cache: give one");
        if (c == KVP_OPT_KV_BLOCKS) {
            o->kv.n_blocks = parse_u32("--kv-blocks", arg, 1, 1 << 30);
        } else if ((o->kv.mem_bytes = kvp_cli_opt_size("--kv-mem", arg)) == 0) {
            kvp_cli_usage_error("--kv-mem: 0 bytes hold no KV block");
        }
        break;
    case KVP_OPT_KV_DTYPE: {
        int d = kvp_dtype_from_name(arg);
        if (d != KVP_DTYPE_F16 && d != KVP_DTYPE_BF16 && d != KVP_DTYPE_F32 && !kvp_kvscale_dtype(d))
            kvp_cli_usage_error("--kv-dtype: '%s': use f16, bf16, f32, fp8 (e4m3) or int8", arg);
        o->kv.dtype = d;
        o->kv.dtype_from_stream = 0;
        break;
    }
    case KVP_OPT_TEMP: o->sampling.temperature = (float)kvp_cli_opt_f64("--temperature", arg, 0, 100); o->sampling_set |= KVP_SET_TEMP; break;
    case KVP_OPT_TOP_K: o->sampling.top_k = (int32_t)kvp_cli_opt_i64("--top-k", arg, 0, 1 << 24); o->sampling_set |= KVP_SET_TOP_K; break;
    case KVP_OPT_TOP_P: o->sampling.top_p = (float)kvp_cli_opt_f64("--top-p", arg, 1e-6, 1); o->sampling_set |= KVP_SET_TOP_P; break;
    case KVP_OPT_MIN_P: o->sampling.min_p = (float)kvp_cli_opt_f64("--min-p", arg, 0, 1); o->sampling_set |= KVP_SET_MIN_P; break;
    case KVP_OPT_REPEAT: o->sampling.repeat_penalty = (float)kvp_cli_opt_f64("--repeat-penalty", arg, 1e-3, 100); o->sampling_set |= KVP_SET_REPEAT; break;
    case KVP_OPT_SEED: o->sampling.seed = (uint64_t)kvp_cli_opt_i64("--seed", arg, 0, INT64_MAX); o->sampling_set |= KVP_SET_SEED; break;
    case KVP_OPT_CHUNK: o->chunk = o->sched.max_batched_tokens = parse_u32("--chunk", arg, 1, 1 << 16); break;
    case KVP_OPT_MAX_NUM_SEQS: o->sched.max_num_seqs = parse_u32("--max-num-seqs", arg, 1, 1 << 16); break;
    case KVP_OPT_MAX_BATCHED: o->sched.max_batched_tokens = parse_u32("--max-batched-tokens", arg, 1, 1 << 16); break;
    case KVP_OPT_STATIC: o->sched.static_batch = 1; break;
    case KVP_OPT_STATS:
        if (arg && !arg[0])
            kvp_cli_usage_error("--stats=: an empty file name (--stats alone writes to standard error)");
        o->stats = 1;
        o->stats_file = arg;
        break;
    case KVP_OPT_JSON: o->json = 1; break;
    case KVP_OPT_IGNORE_EOS: o->ignore_eos = 1; break;
    case KVP_OPT_KV_OUT: o->kv_out = arg; break;
    case KVP_OPT_TP: o->tp = parse_u32("--tp", arg, 1, 1024); break;
    case KVP_OPT_PP: o->pp = parse_u32("--pp", arg, 1, 1024); break;
    case KVP_OPT_TIMEOUT: o->timeout = kvp_cli_opt_f64("--timeout", arg, 0.001, 1e7); break;
    case KVP_OPT_STOP: {
        if (!arg[0])
            kvp_cli_usage_error("--stop: an empty string (it would end every sequence at once)");
        utf8_arg("--stop", arg); /* else it could match inside a character */
        /* the strings travel in sequence records (prefill's stream, decode's
         * --kv-out): what a record cannot carry is refused here, before any
         * work, not when the first record is written */
        if (o->n_stop == KVP_STOP_MAX_N)
            kvp_cli_usage_error("--stop given %zu times (a sequence record carries at most %d)", o->n_stop + 1,
                                KVP_STOP_MAX_N);
        if (strlen(arg) > KVP_STOP_MAX_LEN)
            kvp_cli_usage_error("--stop: a stop string of %zu bytes (a sequence record carries at most %d)",
                                strlen(arg), KVP_STOP_MAX_LEN);
        const char **s = realloc(o->stop, (o->n_stop + 1) * sizeof *s);
        if (!s)
            kvp_cli_die("out of memory");
        o->stop = s;
        o->stop[o->n_stop++] = arg;
        break;
    }
    default:
        return 0;
    }
    return 1;
}

void kvp_runopts_apply_sampling(const kvp_runopts *o, kvp_sampling *s, uint32_t own, uint64_t id)
{
    unsigned f = o->sampling_set;
    if ((f & KVP_SET_TEMP) && !(own & KVP_SEQ_OWN_TEMPERATURE)) s->temperature = o->sampling.temperature;
    if ((f & KVP_SET_TOP_K) && !(own & KVP_SEQ_OWN_TOP_K)) s->top_k = o->sampling.top_k;
    if ((f & KVP_SET_TOP_P) && !(own & KVP_SEQ_OWN_TOP_P)) s->top_p = o->sampling.top_p;
    if ((f & KVP_SET_MIN_P) && !(own & KVP_SEQ_OWN_MIN_P)) s->min_p = o->sampling.min_p;
    if (f & KVP_SET_REPEAT) s->repeat_penalty = o->sampling.repeat_penalty; /* no line sets it */
    if ((f & KVP_SET_MAX) && !(own & KVP_SEQ_OWN_MAX_TOKENS)) s->max_tokens = o->sampling.max_tokens;
    /* another seed: the generator starts again; the record's own seed
     * given again continues its generator where the record left it, so a
     * saved sequence continued with its --seed goes on as one run would */
    if ((f & KVP_SET_SEED) && !(own & KVP_SEQ_OWN_SEED) && s->seed != o->sampling.seed) {
        s->seed = o->sampling.seed;
        kvp_sample_seed(s, id);
    }
}

void kvp_runopts_apply_record(const kvp_runopts *o, kvp_seq_rec *rec)
{
    if (rec->state != KVP_SEQ_PREFILLED && (o->sampling_set & KVP_SET_MAX))
        rec->flags &= ~KVP_SEQ_OWN_MAX_TOKENS; /* N more tokens: the value is -n's now */
    kvp_runopts_apply_sampling(o, &rec->sampling, rec->flags, rec->id);
}

uint32_t kvp_runopts_own_flags(unsigned param_set)
{
    static const struct {
        unsigned param;
        uint32_t own;
    } map[] = {{KVP_PARAM_MAX_TOKENS, KVP_SEQ_OWN_MAX_TOKENS}, {KVP_PARAM_TEMPERATURE, KVP_SEQ_OWN_TEMPERATURE},
               {KVP_PARAM_TOP_P, KVP_SEQ_OWN_TOP_P},           {KVP_PARAM_TOP_K, KVP_SEQ_OWN_TOP_K},
               {KVP_PARAM_MIN_P, KVP_SEQ_OWN_MIN_P},           {KVP_PARAM_SEED, KVP_SEQ_OWN_SEED},
               {KVP_PARAM_STOP, KVP_SEQ_OWN_STOP}};
    uint32_t own = 0;
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (param_set & map[i].param)
            own |= map[i].own;
    return own;
}

int kvp_runopts_request_sampling(const kvp_runopts *o, const kvp_prompt_params *pp, uint64_t i, kvp_sampling *smp,
                                 kvp_err *err)
{
    *smp = o->sampling;
    if (pp->set & KVP_PARAM_MAX_TOKENS)
        smp->max_tokens = pp->max_tokens;
    if (pp->set & KVP_PARAM_TEMPERATURE)
        smp->temperature = pp->temperature;
    if (pp->set & KVP_PARAM_TOP_P)
        smp->top_p = pp->top_p;
    if (pp->set & KVP_PARAM_TOP_K)
        smp->top_k = pp->top_k;
    if (pp->set & KVP_PARAM_MIN_P)
        smp->min_p = pp->min_p;
    if (pp->set & KVP_PARAM_SEED)
        smp->seed = pp->seed;
    kvp_sample_seed(smp, pp->set & KVP_PARAM_SEED ? 0 : i);
    return kvp_sample_check(smp, err);
}

/* What the tokenizer's loading has to say (a BPE vocabulary without a
 * pre-tokenizer: which one is assumed), once per load. */
static void note_tokenizer(const kvp_run *r)
{
    const char *note = kvp_tokenizer_note(r->tok);
    if (note)
        kvp_cli_warn("note: %s", note);
}

/* The model's own default system message, as its chat template adds it
 * where a conversation has none (SmolLM2's "You are a helpful AI
 * assistant named SmolLM, ..."), so --chat renders what HF's
 * apply_chat_template and llama.cpp render. */
static int keep_default_system(kvp_run *r, kvp_err *err)
{
    const kvp_meta *m = kvp_model_tok_meta(r->model);
    const char *why = m ? kvp_meta_get_str(m, KVP_CHAT_TEMPLATE_ERROR) : NULL;
    if (why) /* unknown, not none: said where a conversation needs it (prompts.c) */
        return (r->default_system_error = strdup(why)) ? 0 : kvp_err_set(err, KVP_ENOMEM, "out of memory");
    return m ? kvp_chat_default_system(m, &r->default_system, err) : 0;
}

/* A sliding window the engine does not apply (it attends over every
 * position): sequences are held to it, said once, so a longer one's
 * "length" end or refusal is not a mystery (Mistral-7B-v0.1: 4,096 of its
 * 32,768 tokens of context). */
static void note_window(const kvp_model *m, const char *path)
{
    const kvp_config *c = &m->cfg;
    if (c->sliding_window && kvp_config_ctx_limit(c) == c->sliding_window && c->sliding_window != c->n_ctx)
        kvp_cli_warn("note: %s attends over a sliding window of %u tokens, which this engine does not apply: "
                     "sequences are held to %u tokens", path, c->sliding_window, c->sliding_window);
}

int kvp_run_open(kvp_run *r, const kvp_runopts *o, kvp_err *err)
{
    memset(r, 0, sizeof *r);
    int rc;
    if ((rc = kvp_model_load(&r->model, o->model, err)) < 0)
        return rc;
    note_window(r->model, o->model);
    if ((rc = kvp_model_load_tokenizer(r->model, &r->tok, err)) < 0)
        return rc;
    note_tokenizer(r);
    if ((rc = keep_default_system(r, err)) < 0)
        return rc;
    if ((o->tp > 1 || o->pp > 1) && (rc = kvp_run_tp_open(r, o, err)) < 0)
        return rc;
    return kvp_run_open_backend(&r->be, o, err);
}

int kvp_run_open_backend(kvp_backend **be, const kvp_runopts *o, kvp_err *err)
{
    kvp_backend_config cfg = {.n_threads = o->threads};
    return kvp_backend_open(be, o->backend ? o->backend : "cpu", &cfg, err);
}

int kvp_run_open_vocab(kvp_run *r, const kvp_runopts *o, kvp_err *err)
{
    memset(r, 0, sizeof *r);
    int rc = kvp_model_load(&r->model, o->model, err);
    if (rc < 0 || (rc = kvp_model_load_tokenizer(r->model, &r->tok, err)) < 0)
        return rc;
    note_tokenizer(r);
    return keep_default_system(r, err);
}

int kvp_run_open_tokenizer(kvp_run *r, const kvp_runopts *o, kvp_err *err)
{
    memset(r, 0, sizeof *r);
    int rc = kvp_model_load_vocab(&r->model, &r->tok, o->model, err);
    if (rc < 0)
        return rc;
    note_tokenizer(r);
    return keep_default_system(r, err);
}

kvp_chat_format kvp_run_chat_format(const kvp_run *r)
{
    kvp_chat_format f = KVP_CHAT_NONE;
    kvp_err ignored;
    kvp_chat_detect(r->tok, &f, &ignored);
    return f;
}

int kvp_run_start(kvp_run *r, const kvp_runopts *o, kvp_kvcache *kc, kvp_err *err)
{
    int rc;
    if (kc)
        r->kc = kc;
    else if ((rc = kvp_kvcache_create(&r->kc, &r->model->cfg, &o->kv, r->be, err)) < 0)
        return rc;
    if (kc && r->dist.world) {
        /* read whole from a stream (the whole model's shape): this rank's
         * pool in its place, and every block in use scattered to the ranks */
        kvp_kv_pool old;
        if ((rc = kvp_kvcache_repool(kc, &r->model->cfg, &old, err)) < 0)
            return rc;
        if ((rc = kvp_engine_create(&r->engine, r->model, r->be, r->kc, err)) == 0 &&
            (rc = kvp_engine_tp_start(r->engine, &r->dist, err)) == 0)
            rc = kvp_engine_tp_adopt(r->engine, &old, err);
        r->be->ops->release(r->be, old.base);
        return rc;
    }
    if ((rc = kvp_engine_create(&r->engine, r->model, r->be, r->kc, err)) < 0)
        return rc;
    return r->dist.world ? kvp_engine_tp_start(r->engine, &r->dist, err) : 0;
}

/* A drafter's own cache holds the tokens the target's does: as many blocks
 * of its block size.  o's --kv-mem bytes would give a draft its own
 * context's worth, or (--tp) rank 0's whole draft a third of the blocks of
 * the target's shard, and a request that did not fit stopped drafting for
 * every request of its draft step. */
static kvp_runopts drafter_opts(const kvp_runopts *o, const kvp_run *target)
{
    kvp_runopts d = *o;
    if (target->kc) {
        const kvp_kv_pool *p = kvp_kvcache_pool(target->kc);
        d.kv.n_blocks = p->n_blocks;
        d.kv.mem_bytes = 0;
        d.kv.block_size = p->block_size;
    }
    return d;
}

int kvp_run_open_draft(kvp_run *d, const kvp_run *target, const kvp_runopts *o, const char *path, kvp_err *err)
{
    kvp_runopts dro = *o;
    dro.model = path;
    int rc = kvp_run_open_vocab(d, &dro, err);
    if (rc < 0)
        return rc;
    int64_t at = kvp_tokenizer_vocab_diff(target->tok, d->tok);
    if (at >= 0) {
        size_t na = kvp_tokenizer_n_vocab(target->tok), nb = kvp_tokenizer_n_vocab(d->tok);
        if (na != nb)
            return kvp_err_set(err, KVP_EINVAL, "%s: a vocabulary of %zu tokens; the model's (%s) has %zu: a draft "
                               "model must share its vocabulary", path, nb, o->model, na);
        return kvp_err_set(err, KVP_EINVAL, "%s: token %lld differs from the model's (%s): a draft model must share "
                           "its vocabulary", path, (long long)at, o->model);
    }
    d->be = target->be;
    kvp_runopts co = drafter_opts(o, target);
    return kvp_run_start(d, &co, NULL, err);
}

int kvp_run_open_layerskip(kvp_run *d, const kvp_run *target, const kvp_runopts *o, uint32_t n_layer, kvp_err *err)
{
    memset(d, 0, sizeof *d);
    int rc = kvp_model_first_layers(&d->model, kvp_run_loaded(target), n_layer, err);
    if (rc < 0)
        return rc;
    d->be = target->be;
    if (target->dist.world || !target->kc) {
        kvp_runopts co = drafter_opts(o, target);
        return kvp_run_start(d, &co, NULL, err);
    }
    d->kc = target->kc;
    d->kc_borrowed = 1;
    return kvp_engine_create_first(&d->engine, d->model, d->be, d->kc, err);
}

void kvp_run_close_draft(kvp_run *d)
{
    d->be = NULL; /* the target's */
    if (d->kc_borrowed)
        d->kc = NULL;
    kvp_run_close(d);
}

void kvp_run_close(kvp_run *r)
{
    kvp_engine_free(r->engine);
    kvp_kvcache_free(r->kc);
    kvp_run_tp_close(r);
    kvp_backend_free(r->be);
    kvp_tokenizer_free(r->tok);
    kvp_model_free(r->model);
    kvp_model_free(r->whole);
    free(r->default_system);
    free(r->default_system_error);
    memset(r, 0, sizeof *r);
}

/* One --tokens item at s (spaces around it allowed): its digits' value in
 * *x, the end in *end; -1 when it is empty, signed or not a number. */
static int parse_id(const char *s, unsigned long *x, const char **end)
{
    while (*s == ' ')
        s++;
    if (*s < '0' || *s > '9')
        return -1;
    errno = 0;
    char *e;
    *x = strtoul(s, &e, 10);
    if (errno)
        *x = ULONG_MAX; /* out of range: above any vocabulary */
    while (*e == ' ')
        e++;
    *end = e;
    return 0;
}

/* "1, 2,3": token ids below n_vocab (0: any, the syntax alone) separated
 * by commas; an empty item ("1,,2", a trailing comma), a sign or other text
 * is an error, not skipped, so a mistyped list is not run as another
 * prompt. */
static int parse_ids(const char *s, uint32_t n_vocab, uint32_t **ids, uint32_t *n, kvp_err *err)
{
    size_t cap = 16, k = 0;
    uint32_t *v = malloc(cap * sizeof *v);
    if (!v)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    for (;;) {
        const char *end;
        unsigned long x;
        if (parse_id(s, &x, &end) < 0 || (*end && *end != ',')) {
            free(v);
            if (s[strspn(s, " ")] == ',' || !s[strspn(s, " ")])
                return kvp_err_set(err, KVP_EINVAL, "--tokens: item %zu is empty", k + 1);
            return kvp_err_set(err, KVP_EINVAL, "--tokens: item %zu ('%.20s') is not a token id (digits, separated by commas)",
                               k + 1, s);
        }
        if (n_vocab && x >= n_vocab) {
            free(v);
            return kvp_err_set(err, KVP_EINVAL, "--tokens: item %zu (%.*s) is not below the vocabulary's %u", k + 1,
                               (int)(end - s < 24 ? end - s : 24), s, n_vocab);
        }
        if (k == cap) {
            uint32_t *w = realloc(v, (cap *= 2) * sizeof *v);
            if (!w) {
                free(v);
                return kvp_err_set(err, KVP_ENOMEM, "out of memory");
            }
            v = w;
        }
        v[k++] = (uint32_t)x;
        if (!*end)
            break;
        s = end + 1;
    }
    *ids = v;
    *n = (uint32_t)k;
    return 0;
}

void kvp_runopts_check_prompt_args(const kvp_runopts *o)
{
    if (o->tokens) {
        uint32_t *v, n;
        kvp_err err = {0};
        if (parse_ids(o->tokens, 0, &v, &n, &err) < 0)
            kvp_cli_usage_error("%s", err.msg);
        free(v);
    }
    /* -m - reads the model to the end of standard input */
    if (o->model && !strcmp(o->model, "-") && o->file && !strcmp(o->file, "-"))
        kvp_cli_usage_error("-m - and -f -: the model is read from standard input, so the prompts cannot be");
    /* ids are the prompt as they are: no template is put around them */
    if (o->tokens && o->chat)
        kvp_cli_usage_error("--chat renders a text in the chat template: give the text with -p (--tokens are ids, "
                            "used as they are)");
    /* a plain -p or --tokens prompt has no system turn to put it in */
    if (o->system && (o->prompt || o->tokens) && !o->chat)
        kvp_cli_usage_error("--system is a chat prompt's system message: give --chat too (a prompts file's "
                            "{\"messages\"} lines take it without)");
    /* a chat turn renders its template around even an empty text */
    if (o->prompt && !o->prompt[0] && !o->chat)
        kvp_cli_usage_error("-p: an empty prompt (nothing to run the model on)");
}

void kvp_run_id_json(FILE *f, const char *label, int label_int, uint64_t index)
{
    if (!label[0])
        fprintf(f, "%" PRIu64, index);
    else if (label_int) /* its digits, checked where it came in (prompts.c, stream.c) */
        fputs(label, f);
    else
        kvp_cli_json_str(f, label, strlen(label));
}

/* A prompts line's field that no request has, once a name: a note, since
 * a misspelt parameter ("max_token") leaves the default in force. */
static void note_unknown_field(void *ctx, const char *path, uint64_t line, const char *field)
{
    (void)ctx;
    fprintf(stderr, "%s: note: %s:%" PRIu64 ": ", kvp_cli_prog(), path, line);
    kvp_cli_json_str(stderr, field, strlen(field));
    fputs(" is not a request field (passed over: decode(1), -f)\n", stderr);
}

void kvp_run_prompt_settings(const kvp_run *r, const kvp_runopts *o, kvp_prompts *ps)
{
    kvp_prompts_init(ps);
    ps->format = kvp_run_chat_format(r);
    ps->chat = o->chat;
    ps->literal = o->no_special;
    ps->system = o->system;
    ps->default_system = r->default_system;
    ps->default_system_error = r->default_system_error;
    ps->on_unknown = note_unknown_field;
}

int kvp_run_prompts(const kvp_run *r, const kvp_runopts *o, kvp_prompts *ps, uint32_t ***ids, uint32_t **lens,
                    kvp_err *err)
{
    int rc = 0;
    kvp_run_prompt_settings(r, o, ps);
    *ids = NULL;
    *lens = NULL;
    if (o->tokens) {
        uint32_t *v = NULL, n = 0;
        if ((rc = parse_ids(o->tokens, r->model->cfg.n_vocab, &v, &n, err)) < 0)
            return rc;
        if ((rc = kvp_prompts_add_text(ps, "", "", 0, err)) < 0 || !(*ids = malloc(sizeof **ids)) ||
            !(*lens = malloc(sizeof **lens))) {
            free(v);
            return rc < 0 ? rc : kvp_err_set(err, KVP_ENOMEM, "out of memory");
        }
        (*ids)[0] = v;
        (*lens)[0] = n;
        return 0;
    }
    if (o->prompt)
        rc = kvp_prompts_add_text(ps, "", o->prompt, strlen(o->prompt), err);
    else if (o->file)
        rc = kvp_prompts_read_file(ps, o->file, err);
    if (rc < 0)
        return rc;
    *ids = calloc(ps->n ? ps->n : 1, sizeof **ids);
    *lens = calloc(ps->n ? ps->n : 1, sizeof **lens);
    if (!*ids || !*lens)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    for (size_t i = 0; i < ps->n; i++) {
        int32_t *t;
        size_t n;
        if ((rc = kvp_prompts_encode(ps, i, r->tok, &t, &n, err)) < 0)
            return rc;
        if (n == 0) {
            char id[KVP_UNICODE_ESCAPED_SIZE(KVP_NAME_MAX)];
            free(t);
            return kvp_err_set(err, KVP_EINVAL, "prompt %zu%s%s is empty", i + 1, ps->p[i].label[0] ? " " : "",
                               kvp_unicode_escape(id, sizeof id, ps->p[i].label, 0));
        }
        (*ids)[i] = (uint32_t *)t; /* ids are < n_vocab: same bits */
        (*lens)[i] = (uint32_t)n;
    }
    return 0;
}

int kvp_run_save_open(kvp_run_saver *sv, kvp_run *r, const char *path, const char *producer, kvp_err *err)
{
    memset(sv, 0, sizeof *sv);
    int rc = kvp_out_open(&sv->out, path, err);
    if (rc < 0)
        return rc;
    sv->open = 1;
    kvp_writer_opts wo = {.zstd_level = 0, .producer = producer};
    memcpy(wo.fingerprint, r->model->fingerprint, KVP_FINGERPRINT_SIZE);
    if ((rc = kvp_writer_open(&sv->w, &sv->out, &wo, err)) == 0)
        rc = kvp_seqio_writer_open(&sv->sw, sv->w, r->kc, err);
    if (rc < 0)
        kvp_run_save_abort(sv);
    return rc;
}

int kvp_run_save_put(kvp_run_saver *sv, const kvp_gen_seq *s, const char *const *stop, size_t n_stop, kvp_err *err)
{
    kvp_seqio_seq q = {.rec = s->rec, .handle = s->handle, .stop = stop, .n_stop = n_stop};
    int rc = kvp_seqio_writer_put(sv->sw, &q, err);
    if (rc < 0)
        kvp_run_save_abort(sv);
    return rc;
}

void kvp_run_say_input_cut(const char *path, const kvp_stop_rec *s, const char *tail)
{
    kvp_cli_warn("%s: the stream was cut short: its producer was stopped by %s after writing %llu sequences "
                 "(%llu read and not finished%s)%s", strcmp(path, "-") ? path : "<stdin>", strsignal((int)s->signal),
                 (unsigned long long)s->written, (unsigned long long)s->left,
                 s->flags & KVP_STOP_INPUT_LEFT ? ", the rest of its input not read" : "", tail);
}

int kvp_run_save_stopped(kvp_run_saver *sv, const kvp_stop_rec *s, kvp_err *err)
{
    int rc = kvp_write_stop(sv->w, s, err);
    if (rc < 0)
        kvp_run_save_abort(sv);
    return rc;
}

void kvp_run_save_counts(const kvp_run_saver *sv, uint64_t *n_blocks, uint64_t *n_refs)
{
    kvp_seqio_writer_counts(sv->sw, n_blocks, n_refs);
}

int kvp_run_save_seal(kvp_run_saver *sv, kvp_err *err)
{
    int rc = kvp_writer_finish(sv->w, err);
    if (rc == 0)
        rc = kvp_out_seal(&sv->out, err);
    if (rc < 0) {
        kvp_run_save_abort(sv);
        return rc;
    }
    kvp_seqio_writer_free(sv->sw);
    kvp_writer_free(sv->w);
    sv->sw = NULL;
    sv->w = NULL;
    return 0;
}

int kvp_run_save_commit(kvp_run_saver *sv, kvp_err *err)
{
    int rc = kvp_out_commit(&sv->out, err);
    if (rc < 0) {
        kvp_run_save_abort(sv);
        return rc;
    }
    sv->open = 0;
    return 0;
}

int kvp_run_save_finish(kvp_run_saver *sv, uint64_t *n_blocks, uint64_t *n_refs, kvp_err *err)
{
    kvp_run_save_counts(sv, n_blocks, n_refs);
    int rc = kvp_run_save_seal(sv, err);
    return rc < 0 ? rc : kvp_run_save_commit(sv, err);
}

void kvp_run_save_abort(kvp_run_saver *sv)
{
    if (sv->open)
        kvp_out_abort(&sv->out);
    sv->open = 0;
    kvp_seqio_writer_free(sv->sw);
    kvp_writer_free(sv->w);
    sv->sw = NULL;
    sv->w = NULL;
}

int kvp_run_resume(kvp_run *r, const kvp_runopts *o, const char *path, kvp_gen_seq **out, kvp_seqio_seq **saved,
                   uint32_t *n_out, kvp_stop_rec *stop, kvp_err *err)
{
    kvp_in in;
    kvp_reader *rd = NULL;
    kvp_kvcache *kc = NULL;
    kvp_seqio_seq *ss = NULL;
    uint32_t n = 0;
    *out = NULL;
    *n_out = 0;
    int rc = kvp_in_open(&in, path, err);
    if (rc < 0)
        return rc;
    if ((rc = kvp_reader_open(&rd, &in, err)) == 0 &&
        (rc = kvp_seqio_read(rd, in.name, kvp_run_loaded(r), r->be, &o->kv, &kc, &ss, &n, stop, err)) == 0)
        rc = kvp_run_start(r, o, kc, err);
    kvp_reader_free(rd);
    kvp_in_close(&in);
    kvp_gen_seq *seqs = rc < 0 ? NULL : calloc(n ? n : 1, sizeof *seqs);
    if (rc == 0 && !seqs)
        rc = kvp_err_set(err, KVP_ENOMEM, "out of memory");
    if (rc < 0) {
        if (!r->kc)
            kvp_kvcache_free(kc);
        kvp_seqio_seqs_free(ss, n);
        return rc;
    }
    for (uint32_t i = 0; i < n; i++) {
        kvp_gen_seq_init(&seqs[i], r->tok);
        seqs[i].rec = ss[i].rec;
        seqs[i].handle = ss[i].handle;
        kvp_runopts_apply_record(o, &seqs[i].rec);
    }
    if (saved)
        *saved = ss;
    else
        kvp_seqio_seqs_free(ss, n);
    *out = seqs;
    *n_out = n;
    return 0;
}

/* The next turn's text: plain, or with --chat the assistant's turn closed
 * and a user turn rendered with the assistant's opened after it; marks
 * gets where control tokens are parsed. */
static int turn_text(const kvp_run *r, const kvp_runopts *o, kvp_buf *b, kvp_chat_marks *marks, kvp_err *err)
{
    if (o->chat) {
        kvp_chat_format f = kvp_run_chat_format(r);
        int rc = kvp_chat_close_turn(f, b, marks, err);
        return rc < 0 ? rc : kvp_chat_prompt(f, NULL, o->prompt, b, marks, err);
    }
    kvp_buf_put(b, o->prompt, strlen(o->prompt));
    if (!o->no_special && b->len) {
        if (!(marks->v = malloc(sizeof *marks->v)))
            return kvp_err_set(err, KVP_ENOMEM, "out of memory");
        marks->v[0] = (kvp_tok_span){0, b->len};
        marks->n = marks->cap = 1;
    }
    return b->oom ? kvp_err_set(err, KVP_ENOMEM, "out of memory") : 0;
}

/* --chat closes the assistant's turn s ends in (its cache, then its
 * pending token when fed): one that holds no such turn (a plain text, a
 * closed turn, the user's) would get a stray end marker and a conversation
 * the model never saw, so it is refused, saying what s ends in. */
static int check_open_turn(const kvp_run *r, const kvp_gen_seq *s, int pend, kvp_err *err)
{
    uint32_t n = s->rec.n_tokens;
    uint32_t *v = malloc(((size_t)n + 1) * sizeof *v);
    if (!v)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    if (n)
        memcpy(v, kvp_kvcache_seq_tokens(r->kc, s->handle), (size_t)n * sizeof *v);
    if (pend)
        v[n++] = (uint32_t)s->rec.next_token;
    kvp_err why = {0};
    int rc = kvp_chat_check_open(kvp_run_chat_format(r), r->tok, v, n, &why);
    free(v);
    if (rc < 0)
        return kvp_err_set(err, rc, "sequence %llu: --chat continues the assistant's open turn, but %s; "
                           "without --chat the text goes in as it is", (unsigned long long)s->rec.id, why.msg);
    return 0;
}

int kvp_run_turn_ids(const kvp_run *r, const kvp_runopts *o, const kvp_gen_seq *s, uint32_t **ids, uint32_t *n,
                     kvp_err *err)
{
    *ids = NULL;
    *n = 0;
    uint32_t *tv = NULL, tn = 0;
    int rc = 0;
    /* the pending token goes first when someone saw it: a sequence that
     * generated (decode's) showed it; a prefilled one's (prefill's sample,
     * never shown) is dropped, or "The capital of France is" resumed with
     * " Paris" read "... is Paris Paris" */
    int pend = s->rec.next_token >= 0 && s->rec.state != KVP_SEQ_PREFILLED;
    if (o->tokens) {
        if ((rc = parse_ids(o->tokens, r->model->cfg.n_vocab, &tv, &tn, err)) < 0)
            return rc;
    } else if (o->prompt) {
        kvp_buf b;
        kvp_chat_marks marks = {0};
        kvp_buf_init(&b);
        int32_t *t = NULL;
        size_t k = 0;
        if (o->chat && (rc = check_open_turn(r, s, pend, err)) < 0)
            return rc;
        if ((rc = turn_text(r, o, &b, &marks, err)) == 0)
            rc = kvp_tokenizer_encode_spans(r->tok, (const char *)b.data, b.len, marks.v, marks.n, 0, &t, &k, err);
        kvp_buf_free(&b);
        kvp_chat_marks_free(&marks);
        if (rc < 0)
            return rc;
        tv = (uint32_t *)t; /* ids are < n_vocab: same bits */
        tn = (uint32_t)k;
    }
    if (tn == 0) {
        free(tv);
        return kvp_err_set(err, KVP_EINVAL, "the next turn is empty");
    }
    uint32_t *v = malloc(((size_t)tn + 1) * sizeof *v);
    if (!v) {
        free(tv);
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    }
    if (pend)
        v[0] = (uint32_t)s->rec.next_token;
    memcpy(v + pend, tv, (size_t)tn * sizeof *v);
    free(tv);
    *ids = v;
    *n = tn + (uint32_t)pend;
    return 0;
}
