/* runopts.c - shared options and setup of prefill and decode. */
#include "runopts.h"
#include "backend_cpu.h"
#include "cli.h"
#include "sample.h"
#include "seqio.h"
#include "tensor.h"

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
    {"stats", no_argument, NULL, KVP_OPT_STATS},
    {"json", no_argument, NULL, KVP_OPT_JSON},
    {"stop", required_argument, NULL, KVP_OPT_STOP},
    {"ignore-eos", no_argument, NULL, KVP_OPT_IGNORE_EOS},
    {"kv-out", required_argument, NULL, KVP_OPT_KV_OUT},
    {"help", no_argument, NULL, KVP_OPT_HELP},
    {"version", no_argument, NULL, KVP_OPT_VERSION},
    {NULL, 0, NULL, 0},
};
_Static_assert(sizeof kvp_runopts_long / sizeof kvp_runopts_long[0] == KVP_RUNOPTS_N_LONG + 1,
               "KVP_RUNOPTS_N_LONG counts kvp_runopts_long's entries");

const char kvp_runopts_help[] =
    "  -m, --model FILE        model: GGUF, KVP model file (quantize) or HF folder\n"
    "  -p, --prompt TEXT       one prompt\n"
    "  -f, --file FILE         prompts: JSON Lines ({\"id\",\"prompt\"} or {\"messages\"}) or one text\n"
    "      --tokens IDS        one prompt as token ids, comma-separated\n"
    "      --chat              render plain prompts in the model's chat format\n"
    "      --system TEXT       system message for --chat\n"
    "  -n, --max-tokens N      tokens to generate per sequence (128)\n"
    "      --temperature T     0 is greedy (default 0)\n"
    "      --top-k K, --top-p P, --min-p P, --repeat-penalty R, --seed N\n"
    "  -t, --threads N         CPU threads (default: all cores)\n"
    "      --block-size N      tokens per KV block (16)\n"
    "      --kv-mem SIZE       KV cache size (e.g. 512MiB), or --kv-blocks N\n"
    "      --kv-dtype TYPE     f16 (default), bf16 or f32\n"
    "      --chunk N           prompt tokens per forward step (512)\n"
    "      --stats             timings on stderr (with --json: as JSON)\n";

void kvp_runopts_init(kvp_runopts *o)
{
    memset(o, 0, sizeof *o);
    kvp_kvcache_opts_init(&o->kv);
    kvp_sample_defaults(&o->sampling);
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

int kvp_runopts_parse(kvp_runopts *o, int c, const char *arg)
{
    switch (c) {
    case 'm': o->model = arg; break;
    case 'p': o->prompt = arg; break;
    case 'f': o->file = arg; break;
    case KVP_OPT_TOKENS: o->tokens = arg; break;
    case KVP_OPT_CHAT: o->chat = 1; break;
    case KVP_OPT_SYSTEM: o->system = arg; break;
    case 'n': o->sampling.max_tokens = parse_u32("--max-tokens", arg, 0, 1 << 24); o->sampling_set |= KVP_SET_MAX; break;
    case 't': o->threads = (int)kvp_cli_opt_i64("--threads", arg, 1, 1024); break;
    case KVP_OPT_BLOCK_SIZE:
        o->kv.block_size = parse_u32("--block-size", arg, 1, 4096);
        /* Blocks are allocated and hashed as power-of-two token groups, as in
         * kvcalc; anything else is a mistake worth catching early. */
        if (o->kv.block_size & (o->kv.block_size - 1))
            kvp_cli_usage_error("--block-size: %u is not a power of two", o->kv.block_size);
        break;
    case KVP_OPT_KV_MEM: o->kv.mem_bytes = kvp_cli_opt_size("--kv-mem", arg); break;
    case KVP_OPT_KV_BLOCKS: o->kv.n_blocks = parse_u32("--kv-blocks", arg, 1, 1 << 30); break;
    case KVP_OPT_KV_DTYPE: {
        int d = kvp_dtype_from_name(arg);
        if (d != KVP_DTYPE_F16 && d != KVP_DTYPE_BF16 && d != KVP_DTYPE_F32)
            kvp_cli_usage_error("--kv-dtype: '%s': use f16, bf16 or f32", arg);
        o->kv.dtype = d;
        o->kv_dtype_set = 1;
        break;
    }
    case KVP_OPT_TEMP: o->sampling.temperature = (float)kvp_cli_opt_f64("--temperature", arg, 0, 100); o->sampling_set |= KVP_SET_TEMP; break;
    case KVP_OPT_TOP_K: o->sampling.top_k = (int32_t)kvp_cli_opt_i64("--top-k", arg, 0, 1 << 24); o->sampling_set |= KVP_SET_TOP_K; break;
    case KVP_OPT_TOP_P: o->sampling.top_p = (float)kvp_cli_opt_f64("--top-p", arg, 1e-6, 1); o->sampling_set |= KVP_SET_TOP_P; break;
    case KVP_OPT_MIN_P: o->sampling.min_p = (float)kvp_cli_opt_f64("--min-p", arg, 0, 1); o->sampling_set |= KVP_SET_MIN_P; break;
    case KVP_OPT_REPEAT: o->sampling.repeat_penalty = (float)kvp_cli_opt_f64("--repeat-penalty", arg, 1e-3, 100); o->sampling_set |= KVP_SET_REPEAT; break;
    case KVP_OPT_SEED: o->sampling.seed = (uint64_t)kvp_cli_opt_i64("--seed", arg, 0, INT64_MAX); o->sampling_set |= KVP_SET_SEED; break;
    case KVP_OPT_CHUNK: o->chunk = parse_u32("--chunk", arg, 1, 1 << 16); break;
    case KVP_OPT_STATS: o->stats = 1; break;
    case KVP_OPT_JSON: o->json = 1; break;
    case KVP_OPT_IGNORE_EOS: o->ignore_eos = 1; break;
    case KVP_OPT_KV_OUT: o->kv_out = arg; break;
    case KVP_OPT_STOP: {
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

void kvp_runopts_apply_sampling(const kvp_runopts *o, kvp_sampling *s)
{
    unsigned f = o->sampling_set;
    if (f & KVP_SET_TEMP) s->temperature = o->sampling.temperature;
    if (f & KVP_SET_TOP_K) s->top_k = o->sampling.top_k;
    if (f & KVP_SET_TOP_P) s->top_p = o->sampling.top_p;
    if (f & KVP_SET_MIN_P) s->min_p = o->sampling.min_p;
    if (f & KVP_SET_REPEAT) s->repeat_penalty = o->sampling.repeat_penalty;
    if (f & KVP_SET_MAX) s->max_tokens = o->sampling.max_tokens;
    if (f & KVP_SET_SEED) s->seed = o->sampling.seed;
}

int kvp_run_open(kvp_run *r, const kvp_runopts *o, kvp_err *err)
{
    memset(r, 0, sizeof *r);
    int rc;
    if ((rc = kvp_model_load(&r->model, o->model, err)) < 0)
        return rc;
    if ((rc = kvp_model_load_tokenizer(r->model, &r->tok, err)) < 0)
        return rc;
    return kvp_backend_cpu_create(&r->be, o->threads, 0, err);
}

int kvp_run_start(kvp_run *r, const kvp_runopts *o, kvp_kvcache *kc, kvp_err *err)
{
    int rc;
    if (kc)
        r->kc = kc;
    else if ((rc = kvp_kvcache_create(&r->kc, &r->model->cfg, &o->kv, r->be, err)) < 0)
        return rc;
    return kvp_engine_create(&r->engine, r->model, r->be, r->kc, err);
}

void kvp_run_close(kvp_run *r)
{
    kvp_engine_free(r->engine);
    kvp_kvcache_free(r->kc);
    kvp_backend_free(r->be);
    kvp_tokenizer_free(r->tok);
    kvp_model_free(r->model);
    memset(r, 0, sizeof *r);
}

static int parse_ids(const char *s, uint32_t n_vocab, uint32_t **ids, uint32_t *n, kvp_err *err)
{
    size_t cap = 16, k = 0;
    uint32_t *v = malloc(cap * sizeof *v);
    if (!v)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    while (*s) {
        char *end;
        while (*s == ' ' || *s == ',')
            s++;
        if (!*s)
            break;
        unsigned long x = strtoul(s, &end, 10);
        if (end == s || x >= n_vocab || (*end && *end != ',' && *end != ' ')) {
            free(v);
            return kvp_err_set(err, KVP_EINVAL, "--tokens: '%.20s' is not a token id below %u", s, n_vocab);
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
        s = end;
    }
    if (!k) {
        free(v);
        return kvp_err_set(err, KVP_EINVAL, "--tokens: no token ids");
    }
    *ids = v;
    *n = (uint32_t)k;
    return 0;
}

int kvp_run_prompts(const kvp_run *r, const kvp_runopts *o, kvp_prompts *ps, uint32_t ***ids, uint32_t **lens,
                    kvp_err *err)
{
    int chat = 0, rc = 0;
    if (o->chat)
        chat = kvp_tokenizer_find(r->tok, "<|start_header_id|>", 19) >= 0 ? KVP_CHAT_LLAMA3 : KVP_CHAT_CHATML;
    kvp_prompts_init(ps, chat, o->system);
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
        if ((rc = kvp_tokenizer_encode(r->tok, ps->p[i].text, ps->p[i].len, ps->p[i].special, -1, &t, &n, err)) < 0)
            return rc;
        if (n == 0) {
            free(t);
            return kvp_err_set(err, KVP_EINVAL, "prompt %zu%s%s is empty", i + 1, ps->p[i].label[0] ? " " : "",
                               ps->p[i].label);
        }
        (*ids)[i] = (uint32_t *)t; /* ids are < n_vocab: same bits */
        (*lens)[i] = (uint32_t)n;
    }
    return 0;
}

int kvp_run_save(kvp_run *r, const char *path, const char *producer, const kvp_gen_seq *seqs, uint32_t n,
                 uint64_t *n_blocks, uint64_t *n_refs, kvp_err *err)
{
    kvp_out out;
    int rc = kvp_out_open(&out, path, err);
    if (rc < 0)
        return rc;
    kvp_writer_opts wo = {.zstd_level = 0, .producer = producer};
    memcpy(wo.fingerprint, r->model->fingerprint, KVP_FINGERPRINT_SIZE);
    kvp_writer *w = NULL;
    kvp_seqio_seq *ss = malloc((n ? n : 1) * sizeof *ss);
    if (!ss) {
        kvp_out_abort(&out);
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    }
    for (uint32_t i = 0; i < n; i++) {
        ss[i].rec = seqs[i].rec;
        ss[i].handle = seqs[i].handle;
    }
    if ((rc = kvp_writer_open(&w, &out, &wo, err)) == 0 &&
        (rc = kvp_seqio_write(w, r->kc, ss, n, n_blocks, n_refs, err)) == 0 && (rc = kvp_writer_finish(w, err)) == 0)
        rc = kvp_out_commit(&out, err);
    if (rc < 0)
        kvp_out_abort(&out);
    kvp_writer_free(w);
    free(ss);
    return rc;
}

int kvp_run_resume(kvp_run *r, const kvp_runopts *o, const char *path, kvp_gen_seq **out, uint32_t *n_out,
                   kvp_err *err)
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
        (rc = kvp_seqio_read(rd, in.name, r->model, r->be, &o->kv, &kc, &ss, &n, err)) == 0)
        rc = kvp_run_start(r, o, kc, err);
    kvp_reader_free(rd);
    kvp_in_close(&in);
    if (rc < 0) {
        if (!r->kc)
            kvp_kvcache_free(kc);
        free(ss);
        return rc;
    }
    kvp_gen_seq *seqs = calloc(n ? n : 1, sizeof *seqs);
    if (!seqs) {
        free(ss);
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    }
    for (uint32_t i = 0; i < n; i++) {
        kvp_gen_seq_init(&seqs[i], r->tok);
        seqs[i].rec = ss[i].rec;
        seqs[i].handle = ss[i].handle;
        kvp_runopts_apply_sampling(o, &seqs[i].rec.sampling);
        if (o->sampling_set & KVP_SET_SEED)
            kvp_sample_seed(&seqs[i].rec.sampling, seqs[i].rec.id);
    }
    free(ss);
    *out = seqs;
    *n_out = n;
    return 0;
}

/* The next turn's text: plain, or with --chat the assistant's turn closed
 * and a user turn rendered with the assistant's opened after it. */
static int turn_text(const kvp_run *r, const kvp_runopts *o, kvp_buf *b, kvp_err *err)
{
    if (o->chat) {
        int llama3 = kvp_tokenizer_find(r->tok, "<|start_header_id|>", 19) >= 0;
        const char *close = llama3 ? "<|eot_id|>" : "<|im_end|>\n", *role = "user";
        char *t = NULL;
        size_t n = 0;
        int rc = kvp_prompts_render(llama3 ? KVP_CHAT_LLAMA3 : KVP_CHAT_CHATML, &role, &o->prompt, 1, &t, &n, err);
        if (rc < 0)
            return rc;
        kvp_buf_put(b, close, strlen(close));
        kvp_buf_put(b, t, n);
        free(t);
    } else {
        kvp_buf_put(b, o->prompt, strlen(o->prompt));
    }
    return b->oom ? kvp_err_set(err, KVP_ENOMEM, "out of memory") : 0;
}

int kvp_run_turn_ids(const kvp_run *r, const kvp_runopts *o, const kvp_gen_seq *s, uint32_t **ids, uint32_t *n,
                     kvp_err *err)
{
    *ids = NULL;
    *n = 0;
    uint32_t *tv = NULL, tn = 0;
    int rc = 0;
    if (o->tokens) {
        if ((rc = parse_ids(o->tokens, r->model->cfg.n_vocab, &tv, &tn, err)) < 0)
            return rc;
    } else if (o->prompt) {
        kvp_buf b;
        kvp_buf_init(&b);
        int32_t *t = NULL;
        size_t k = 0;
        if ((rc = turn_text(r, o, &b, err)) == 0)
            rc = kvp_tokenizer_encode(r->tok, (const char *)b.data, b.len, o->chat, 0, &t, &k, err);
        kvp_buf_free(&b);
        if (rc < 0)
            return rc;
        tv = (uint32_t *)t; /* ids are < n_vocab: same bits */
        tn = (uint32_t)k;
    }
    int pend = s->rec.next_token >= 0;
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
