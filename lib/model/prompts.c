/* prompts.c - prompt files (JSON Lines or text), rendered by chat.c. */
#include "prompts.h"
#include "strmap.h"
#include "hash.h"
#include "io.h"
#include "json.h"
#include "stream.h"
#include "unicode.h"
#include "tensor.h"
#include "wire.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define KVP_PROMPTS_MAX_RECORD (1ull << 30) /* one line, or a whole plain-text file */

void kvp_prompts_init(kvp_prompts *ps)
{
    memset(ps, 0, sizeof *ps);
    ps->format = KVP_CHAT_CHATML;
}

static void params_free(kvp_prompt_params *pp)
{
    for (size_t k = 0; k < pp->n_stop; k++)
        free(pp->stop[k]);
    free(pp->stop);
    memset(pp, 0, sizeof *pp);
}

void kvp_prompt_free(kvp_prompt *p)
{
    free(p->label);
    free(p->text);
    free(p->special);
    params_free(&p->params);
    memset(p, 0, sizeof *p);
}

void kvp_prompts_free(kvp_prompts *ps)
{
    for (size_t i = 0; i < ps->n; i++)
        kvp_prompt_free(&ps->p[i]);
    free(ps->p);
    ps->p = NULL;
    ps->n = ps->cap = 0;
}

/* Room for one more prompt: 0 or KVP_ENOMEM. */
static int grow(kvp_prompts *ps)
{
    if (ps->n < ps->cap)
        return 0;
    size_t cap = ps->cap ? ps->cap * 2 : 8;
    kvp_prompt *p = realloc(ps->p, cap * sizeof *p);
    if (!p)
        return KVP_ENOMEM;
    ps->p = p;
    ps->cap = cap;
    return 0;
}

/* Take text (malloc'd, NUL-terminated) and special (malloc'd or NULL) as
 * prompt n, or free them. */
static int push(kvp_prompts *ps, const char *label, char *text, size_t len, kvp_tok_span *special,
                size_t n_special, kvp_err *err)
{
    char *l = NULL;
    if (grow(ps) < 0)
        goto oom;
    if (label && strlen(label) > KVP_NAME_MAX) {
        free(text);
        free(special);
        return kvp_err_set(err, KVP_EINVAL, "prompts: id of %zu bytes, longer than %d", strlen(label), KVP_NAME_MAX);
    }
    if (!(l = strdup(label ? label : "")))
        goto oom;
    ps->p[ps->n++] = (kvp_prompt){.label = l, .text = text, .len = len, .special = special, .n_special = n_special};
    return 0;
oom:
    free(text);
    free(special);
    return kvp_err_set(err, KVP_ENOMEM, "prompts: out of memory");
}

/* The system message of a conversation without one into *sys: --system's
 * ("": none), else the model's default, or NULL.  0, or KVP_EFORMAT when
 * the model's default is needed and unknown (where names the prompt). */
static int system_of(const kvp_prompts *ps, const char *where, const char **sys, kvp_err *err)
{
    if (!ps->system && ps->default_system_error)
        return kvp_err_set(err, KVP_EFORMAT, "%s: %s: the chat template's default system message is unknown "
                           "(give --system, \"\" for none)", where, ps->default_system_error);
    const char *s = ps->system ? ps->system : ps->default_system;
    *sys = s && s[0] ? s : NULL;
    return 0;
}

/* Render msgs and push them: only the markers are special. */
static int push_chat(kvp_prompts *ps, const char *label, const kvp_chat_msg *msgs, size_t n, kvp_err *err)
{
    kvp_buf b;
    kvp_chat_marks marks = {0};
    kvp_buf_init(&b);
    int rc = kvp_chat_render(ps->format, msgs, n, 1, &b, &marks, err);
    if (rc == 0) {
        kvp_buf_u8(&b, 0);
        if (b.oom)
            rc = kvp_err_set(err, KVP_ENOMEM, "prompts: out of memory");
    }
    if (rc < 0) {
        kvp_buf_free(&b);
        kvp_chat_marks_free(&marks);
        return rc;
    }
    return push(ps, label, (char *)b.data, b.len - 1, marks.v, marks.n, err);
}

int kvp_prompts_add_text(kvp_prompts *ps, const char *label, const char *text, size_t len, kvp_err *err)
{
    char *t = malloc(len + 1);
    if (!t)
        return kvp_err_set(err, KVP_ENOMEM, "prompts: out of memory");
    memcpy(t, text, len);
    t[len] = 0;
    if (ps->chat) {
        const char *sys = NULL;
        if (system_of(ps, "--chat", &sys, err) < 0) {
            free(t);
            return KVP_EFORMAT;
        }
        kvp_chat_msg m[2] = {{"system", sys, 0, 0}, {"user", t, 0, len}}; /* t may hold a NUL (JSON's \u0000) */
        int rc = sys ? push_chat(ps, label, m, 2, err) : push_chat(ps, label, m + 1, 1, err);
        free(t);
        return rc;
    }
    kvp_tok_span *all = NULL;
    if (!ps->literal) {
        if (!(all = malloc(sizeof *all))) {
            free(t);
            return kvp_err_set(err, KVP_ENOMEM, "prompts: out of memory");
        }
        *all = (kvp_tok_span){0, len};
    }
    return push(ps, label, t, len, all, all != NULL, err);
}

int kvp_prompt_encode(const kvp_prompt *p, const kvp_tokenizer *t, int32_t **ids, size_t *n, kvp_err *err)
{
    return kvp_tokenizer_encode_spans(t, p->text, p->len, p->special, p->n_special, -1, ids, n, err);
}

int kvp_prompts_encode(const kvp_prompts *ps, size_t i, const kvp_tokenizer *t, int32_t **ids, size_t *n,
                       kvp_err *err)
{
    return kvp_prompt_encode(&ps->p[i], t, ids, n, err);
}

/* A number field in [lo, hi] (integral when whole): 1 when present, 0 when
 * absent, or a code naming the line and the field. */
static int num_field(const kvp_json *o, const char *key, double lo, double hi, int whole, double *out,
                     const char *path, uint64_t line, kvp_err *err)
{
    const kvp_json *v = kvp_json_get(o, key);
    if (!v || v->type == KVP_JSON_NULL)
        return 0;
    double x;
    if (v->type != KVP_JSON_NUMBER || kvp_json_get_f64(o, key, &x) < 0 || (whole && !v->is_int) || !(x >= lo) ||
        !(x <= hi)) {
        /* %g would write 2^24 as 1.67772e+07: an integer range is written whole
         * (its bounds are integers below 2^53, so %.0f is exact) */
        if (whole)
            return kvp_err_set(err, KVP_EFORMAT, "%s:%" PRIu64 ": \"%s\" must be an integer in [%.0f, %.0f]", path,
                               line, key, lo, hi);
        return kvp_err_set(err, KVP_EFORMAT, "%s:%" PRIu64 ": \"%s\" must be a number in [%g, %g]", path, line, key,
                           lo, hi);
    }
    *out = x;
    return 1;
}

/* "seed": an integer in [0, 2^63 - 1], the range of --seed, taken from its
 * digits (a double holds integers exactly only up to 2^53).  1 when set, 0
 * when absent, or a code naming the line. */
static int seed_field(const kvp_json *o, uint64_t *out, const char *path, uint64_t line, kvp_err *err)
{
    const kvp_json *v = kvp_json_get(o, "seed");
    if (!v || v->type == KVP_JSON_NULL)
        return 0;
    if (v->type != KVP_JSON_NUMBER || !v->is_int || v->i < 0)
        return kvp_err_set(err, KVP_EFORMAT, "%s:%" PRIu64 ": \"seed\" must be an integer in [0, %" PRId64 "]", path,
                           line, INT64_MAX);
    *out = (uint64_t)v->i;
    return 1;
}

/* "stop": a string or an array of strings. */
static int stop_field(const kvp_json *o, kvp_prompt_params *pp, const char *path, uint64_t line, kvp_err *err)
{
    const kvp_json *v = kvp_json_get(o, "stop");
    if (!v || v->type == KVP_JSON_NULL)
        return 0;
    size_t n = v->type == KVP_JSON_STRING ? 1 : v->type == KVP_JSON_ARRAY ? v->n : 0;
    if (v->type != KVP_JSON_STRING && v->type != KVP_JSON_ARRAY)
        return kvp_err_set(err, KVP_EFORMAT, "%s:%" PRIu64 ": \"stop\" must be a string or an array of strings", path, line);
    if (n > KVP_STOP_MAX_N) /* what a sequence record carries (prefill, --kv-out) */
        return kvp_err_set(err, KVP_ELIMIT, "%s:%" PRIu64 ": %zu stop strings (at most %d)", path, line, n,
                           KVP_STOP_MAX_N);
    pp->stop = calloc(n ? n : 1, sizeof *pp->stop);
    if (!pp->stop)
        return kvp_err_set(err, KVP_ENOMEM, "prompts: out of memory");
    for (size_t i = 0; i < n; i++) {
        const kvp_json *e = v->type == KVP_JSON_STRING ? v : kvp_json_at(v, i);
        if (!e || e->type != KVP_JSON_STRING)
            return kvp_err_set(err, KVP_EFORMAT, "%s:%" PRIu64 ": \"stop\" entry %zu is not a string", path, line, i);
        if (strlen(e->str) != e->len) /* \u0000: a C string would end there */
            return kvp_err_set(err, KVP_EFORMAT, "%s:%" PRIu64 ": \"stop\" entry %zu holds a NUL character", path,
                               line, i);
        if (!e->str[0]) /* as --stop '' is refused: it would end the sequence at once */
            return v->type == KVP_JSON_STRING
                       ? kvp_err_set(err, KVP_EFORMAT, "%s:%" PRIu64 ": \"stop\" is an empty string", path, line)
                       : kvp_err_set(err, KVP_EFORMAT, "%s:%" PRIu64 ": \"stop\" entry %zu is an empty string", path,
                                     line, i);
        if (e->len > KVP_STOP_MAX_LEN)
            return kvp_err_set(err, KVP_ELIMIT, "%s:%" PRIu64 ": \"stop\" entry %zu is %zu bytes (at most %d)", path,
                               line, i, e->len, KVP_STOP_MAX_LEN);
        if (!(pp->stop[i] = strdup(e->str)))
            return kvp_err_set(err, KVP_ENOMEM, "prompts: out of memory");
        pp->n_stop = i + 1;
    }
    pp->set |= KVP_PARAM_STOP;
    return 0;
}

/* The request's own generation parameters (kvp_prompt_params). */
static int params_of(const kvp_json *o, kvp_prompt_params *pp, const char *path, uint64_t line, kvp_err *err)
{
    double x;
    int rc;
    memset(pp, 0, sizeof *pp);
#define FIELD(key, lo, hi, whole, bit, assign)                                                      \
    if ((rc = num_field(o, key, lo, hi, whole, &x, path, line, err)) < 0)                          \
        return rc;                                                                                 \
    if (rc) {                                                                                      \
        assign;                                                                                    \
        pp->set |= bit;                                                                            \
    }
    FIELD("max_tokens", 0, 1 << 24, 1, KVP_PARAM_MAX_TOKENS, pp->max_tokens = (uint32_t)x)
    FIELD("temperature", 0, 100, 0, KVP_PARAM_TEMPERATURE, pp->temperature = (float)x)
    FIELD("top_p", 1e-6, 1, 0, KVP_PARAM_TOP_P, pp->top_p = (float)x)
    FIELD("top_k", 0, 1 << 24, 1, KVP_PARAM_TOP_K, pp->top_k = (int32_t)x)
    FIELD("min_p", 0, 1, 0, KVP_PARAM_MIN_P, pp->min_p = (float)x)
#undef FIELD
    if ((rc = seed_field(o, &pp->seed, path, line, err)) < 0)
        return rc;
    if (rc)
        pp->set |= KVP_PARAM_SEED;
    const kvp_json *salt = kvp_json_get(o, "cache_salt");
    if (salt && salt->type != KVP_JSON_NULL) {
        if (salt->type != KVP_JSON_STRING || salt->len == 0)
            return kvp_err_set(err, KVP_EFORMAT, "%s:%" PRIu64 ": \"cache_salt\" must be a non-empty string", path, line);
        pp->cache_salt = kvp_xxh64(salt->str, salt->len, 0) | 1;
        pp->set |= KVP_PARAM_CACHE_SALT;
    }
    return stop_field(o, pp, path, line, err);
}

static int add_json_prompt(kvp_prompts *ps, const kvp_json *o, const char *lab, const char *path, uint64_t line,
                           kvp_err *err);

/* How a request got its id: the message about a repeated id says so. */
enum { ID_STRING, ID_INT, ID_INDEX };

/* The line's "id" as the request's label (a string as it is, an integer
 * as its decimal digits, in num) with *kind; "" and ID_INDEX when it has
 * none.  0 or a code naming the line. */
static int id_of(const kvp_json *o, char num[32], const char **lab, int *kind, const char *path, uint64_t line,
                 kvp_err *err)
{
    const kvp_json *id = kvp_json_get(o, "id");
    *lab = "";
    *kind = ID_INDEX;
    if (!id || id->type == KVP_JSON_NULL)
        return 0;
    if (id->type == KVP_JSON_STRING) {
        /* "" would stand for the index (the label's "none") and could repeat
         * another line's; a NUL would cut the label, two ids coming out as one */
        if (id->len == 0)
            return kvp_err_set(err, KVP_EFORMAT, "%s:%" PRIu64 ": \"id\" is empty: leave it out to use the line's index",
                               path, line);
        if (memchr(id->str, 0, id->len))
            return kvp_err_set(err, KVP_EFORMAT, "%s:%" PRIu64 ": \"id\" holds a NUL character", path, line);
        /* it travels in a sequence record's label, KVP_NAME_MAX bytes: refused
         * rather than cut, so two long ids never come out the same */
        if (id->len > KVP_NAME_MAX)
            return kvp_err_set(err, KVP_EFORMAT, "%s:%" PRIu64 ": \"id\" is %zu bytes, longer than %d", path, line, id->len,
                               KVP_NAME_MAX);
        *lab = id->str;
        *kind = ID_STRING;
        return 0;
    }
    if (id->type == KVP_JSON_NUMBER && id->is_int) {
        snprintf(num, 32, "%" PRId64, id->i);
        *lab = num;
        *kind = ID_INT;
        return 0;
    }
    /* past int64 (its digits round to 2^63 or beyond): results.c reads
     * integer ids as int64 too, so a bigger one is said to be out of range
     * rather than taken as a string decode would print in quotes anyway */
    if (id->type == KVP_JSON_NUMBER && (id->num >= 9223372036854775808.0 || id->num <= -9223372036854775808.0))
        return kvp_err_set(err, KVP_EFORMAT, "%s:%" PRIu64 ": \"id\" is an integer out of range [%" PRId64 ", %" PRId64
                           "]: write a bigger one as a string", path, line, INT64_MIN, INT64_MAX);
    return kvp_err_set(err, KVP_EFORMAT, "%s:%" PRIu64 ": \"id\" must be a string or an integer", path, line);
}

/* One JSON Lines object; *kind says how its id was given (id_of). */
static int add_json(kvp_prompts *ps, const kvp_json *o, const char *path, uint64_t line, int *kind, kvp_err *err)
{
    if (o->type != KVP_JSON_OBJECT)
        return kvp_err_set(err, KVP_EFORMAT, "%s:%" PRIu64 ": expected an object", path, line);
    char num[32];
    const char *lab;
    int rc = id_of(o, num, &lab, kind, path, line, err);
    if (rc < 0)
        return rc;
    kvp_prompt_params pp;
    rc = params_of(o, &pp, path, line, err);
    if (rc < 0) {
        params_free(&pp);
        return rc;
    }
    size_t before = ps->n;
    rc = add_json_prompt(ps, o, lab, path, line, err);
    if (rc == 0 && ps->n == before + 1) {
        ps->p[before].params = pp;
        ps->p[before].label_int = *kind == ID_INT;
    } else
        params_free(&pp);
    return rc;
}

/* The prompt of one JSON Lines object: "prompt", or "messages" rendered. */
static int add_json_prompt(kvp_prompts *ps, const kvp_json *o, const char *lab, const char *path, uint64_t line,
                           kvp_err *err)
{
    const kvp_json *pr = kvp_json_get(o, "prompt"), *msgs = kvp_json_get(o, "messages");
    /* which one the writer meant is not ours to guess (null is absent, as
     * for every other field) */
    if (pr && pr->type != KVP_JSON_NULL && msgs && msgs->type != KVP_JSON_NULL)
        return kvp_err_set(err, KVP_EFORMAT, "%s:%" PRIu64 ": both \"prompt\" and \"messages\": give one", path, line);
    /* as for -p: a plain prompt has no system turn, and --system unused
     * would be a silent change of every answer */
    if (pr && pr->type == KVP_JSON_STRING && ps->system && ps->system[0] && !ps->chat)
        return kvp_err_set(err, KVP_EFORMAT, "%s:%" PRIu64 ": a \"prompt\" string has no system turn for --system: "
                           "give --chat too (or \"messages\")", path, line);
    if (pr && pr->type == KVP_JSON_STRING)
        return kvp_prompts_add_text(ps, lab, pr->str, pr->len, err);
    if (!msgs || msgs->type != KVP_JSON_ARRAY || msgs->n == 0)
        return kvp_err_set(err, KVP_EFORMAT, "%s:%" PRIu64 ": needs a \"prompt\" string or a non-empty \"messages\" array",
                           path, line);
    if (ps->format == KVP_CHAT_NONE)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s:%" PRIu64 ": \"messages\": the model's vocabulary has no chat "
                           "markers (neither <|im_start|> nor <|start_header_id|>) to render them in: give a \"prompt\"",
                           path, line);
    kvp_chat_msg *m = calloc(msgs->n + 1, sizeof *m);
    size_t k = 0;
    if (!m)
        return kvp_err_set(err, KVP_ENOMEM, "prompts: out of memory");
    const kvp_json *first = kvp_json_get(kvp_json_at(msgs, 0), "role");
    if (!(first && first->type == KVP_JSON_STRING && first->len == 6 && !memcmp(first->str, "system", 6))) {
        char where[4200];
        const char *sys = NULL;
        snprintf(where, sizeof where, "%s:%" PRIu64, path, line);
        if (system_of(ps, where, &sys, err) < 0) {
            free(m);
            return KVP_EFORMAT;
        }
        if (sys)
            m[k++] = (kvp_chat_msg){"system", sys, 0, 0};
    }
    for (size_t i = 0; i < msgs->n; i++, k++) {
        const kvp_json *e = kvp_json_at(msgs, i);
        const kvp_json *role = kvp_json_get(e, "role"), *content = kvp_json_get(e, "content");
        if (!role || role->type != KVP_JSON_STRING || !role->len || !content || content->type != KVP_JSON_STRING) {
            free(m);
            return kvp_err_set(err, KVP_EFORMAT, "%s:%" PRIu64 ": message %zu needs a non-empty \"role\" and a \"content\" "
                               "string", path, line, i);
        }
        /* the lengths the JSON gave: a \u0000 stays in the text */
        m[k] = (kvp_chat_msg){role->str, content->str, role->len, content->len};
    }
    int rc = push_chat(ps, lab, m, k, err);
    free(m);
    return rc;
}

/* ---- ids: one key per request, each once ----
 *
 * decode --resume skips the requests whose id a results file has, and
 * --shard's outputs merge by id, both comparing ids as text: a string id,
 * an integer id's decimal digits ("id":1 and "id":"1" are one id), or, on a
 * line without "id", the request's index.  Two requests with one key would
 * make a resumed job skip one it never ran, so the reader keeps each key
 * (at most KVP_NAME_MAX bytes) with its line: memory grows with the number
 * of requests, never with their text. */

/* A key's value in the reader's map: the line that had it first, and how
 * it came to the key (ID_*), which its message shows. */
static uint64_t id_value(uint64_t line, int kind) { return line << 2 | (uint64_t)kind; }

/* The key of the request just parsed (label, else its index), refused when
 * an earlier request has it: 0 or a code naming both lines and the id. */
static int id_once(kvp_strmap *s, const char *label, int kind, uint64_t index, const char *path, uint64_t line,
                   kvp_err *err)
{
    char num[32];
    const char *key = label;
    if (kind == ID_INDEX) {
        snprintf(num, sizeof num, "%" PRIu64, index);
        key = num;
    }
    size_t len = strlen(key);
    uint64_t first = 0;
    int rc = kvp_strmap_add(s, key, len, id_value(line, kind), &first);
    if (rc < 0)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory for the ids of %zu requests", path, s->n);
    if (rc == 1)
        return 0;
    /* how each line came to the key where they differ: 1 and "1" are one id */
    char shown[80], now[128], as[128] = "";
    kvp_json_show(shown, sizeof shown, key, len);
    if (kind == ID_INDEX)
        snprintf(now, sizeof now, "%s (this line's index: it has no \"id\")", key);
    else
        snprintf(now, sizeof now, "%s", kind == ID_STRING ? shown : key);
    int first_kind = (int)(first & 3);
    if (first_kind != kind)
        snprintf(as, sizeof as, " (as %s%s)",
                 first_kind == ID_INT ? "the integer " : first_kind == ID_INDEX ? "the index of a line without \"id\"" : "",
                 first_kind == ID_INT ? key : first_kind == ID_STRING ? shown : "");
    return kvp_err_set(err, KVP_EFORMAT, "%s:%" PRIu64 ": id %s was already on line %" PRIu64 "%s: each request needs "
                       "its own id", path, line, now, first >> 2, as);
}

/* ---- the reader: one record at a time ----
 *
 * buf[beg, end) holds input read and not yet used: the rest of the line in
 * hand and whatever came after it (a whole plain-text file); buf[beg, scan)
 * is known to have no newline.  The mode is decided by the first non-blank
 * byte, found without using it up (a plain-text prompt is every byte). */

enum { MODE_UNKNOWN, MODE_JSON, MODE_TEXT };

struct kvp_prompts_reader {
    kvp_in in;
    int in_open;
    char *path;             /* as given, for messages ("-" for stdin) */
    kvp_prompts one;        /* the settings; the record being parsed lands in one.p[0] */
    char *buf;
    size_t cap, beg, scan, end;
    int eof, mode, text_done;
    int bom_done;           /* a leading byte order mark skipped, or found absent */
    kvp_strmap ids;         /* the keys of the requests returned, with their lines (id_value) */
    kvp_strmap unknown;     /* field names no request has, each told once (on_unknown) */
    void (*on_unknown)(void *ctx, const char *path, uint64_t line, const char *field);
    void *on_unknown_ctx;
    uint64_t line;          /* lines used up */
    uint64_t line_last;     /* the line of the prompt last returned */
    uint64_t n;             /* prompts returned */
    int rc;                 /* a failure, repeated by every later call */
    kvp_err e;
};

int kvp_prompts_reader_open(kvp_prompts_reader **out, const char *path, const kvp_prompts *ps, kvp_err *err)
{
    *out = NULL;
    kvp_prompts_reader *rd = calloc(1, sizeof *rd);
    if (!rd || !(rd->path = strdup(path))) {
        free(rd);
        return kvp_err_set(err, KVP_ENOMEM, "prompts: out of memory");
    }
    kvp_prompts_init(&rd->one);
    rd->one.format = ps->format;
    rd->one.chat = ps->chat;
    rd->one.literal = ps->literal;
    rd->one.system = ps->system;
    rd->one.default_system = ps->default_system;
    rd->one.default_system_error = ps->default_system_error;
    rd->on_unknown = ps->on_unknown;
    rd->on_unknown_ctx = ps->on_unknown_ctx;
    int rc = kvp_in_open(&rd->in, path, err);
    if (rc < 0) {
        kvp_prompts_reader_free(rd);
        return rc;
    }
    rd->in_open = 1;
    kvp_in_unmap(&rd->in); /* read(2) into one line's buffer: the file's pages are not kept */
    *out = rd;
    return 0;
}

void kvp_prompts_reader_free(kvp_prompts_reader *rd)
{
    if (!rd)
        return;
    if (rd->in_open)
        kvp_in_close(&rd->in);
    kvp_prompts_free(&rd->one);
    kvp_strmap_free(&rd->ids);
    kvp_strmap_free(&rd->unknown);
    free(rd->buf);
    free(rd->path);
    free(rd);
}

uint64_t kvp_prompts_reader_line(const kvp_prompts_reader *rd) { return rd->line_last; }

int kvp_prompts_reader_is_file(const kvp_prompts_reader *rd) { return rd->in.size_known; }

/* A failure (its message in rd->e) for this and every later call. */
static int fail(kvp_prompts_reader *rd, int rc)
{
    rd->rc = rc;
    return rc;
}

/* One read after buf[end]: 1 when bytes came, 0 at the end, or a code (the
 * record in hand past the ceiling: KVP_ELIMIT naming its line). */
static int fill(kvp_prompts_reader *rd)
{
    if (rd->beg > 0) {
        memmove(rd->buf, rd->buf + rd->beg, rd->end - rd->beg);
        rd->scan -= rd->beg;
        rd->end -= rd->beg;
        rd->beg = 0;
    }
    if (rd->end == rd->cap) {
        if (rd->cap >= KVP_PROMPTS_MAX_RECORD) {
            if (rd->mode == MODE_TEXT)
                kvp_err_set(&rd->e, KVP_ELIMIT, "%s: a plain-text prompt of more than %llu bytes", rd->path,
                            (unsigned long long)KVP_PROMPTS_MAX_RECORD);
            else
                kvp_err_set(&rd->e, KVP_ELIMIT, "%s:%" PRIu64 ": a line of more than %llu bytes", rd->path,
                            rd->line + 1, (unsigned long long)KVP_PROMPTS_MAX_RECORD);
            return fail(rd, KVP_ELIMIT);
        }
        size_t cap = rd->cap ? rd->cap * 2 : 65536;
        char *b = realloc(rd->buf, cap);
        if (!b)
            return fail(rd, kvp_err_set(&rd->e, KVP_ENOMEM, "%s: out of memory for a line of %zu bytes", rd->path,
                                        cap));
        rd->buf = b;
        rd->cap = cap;
    }
    int64_t r = kvp_in_read_some(&rd->in, rd->buf + rd->end, rd->cap - rd->end, &rd->e);
    if (r < 0)
        return fail(rd, (int)r);
    rd->end += (size_t)r;
    rd->eof = r == 0;
    return r > 0;
}

/* The next line, buf[beg, *eol) (without its newline), when it is whole
 * (or the last, unended, at the end of input): 1, else 0. */
static int whole_line(kvp_prompts_reader *rd, size_t *eol)
{
    const char *nl = rd->scan < rd->end ? memchr(rd->buf + rd->scan, '\n', rd->end - rd->scan) : NULL;
    if (nl) {
        *eol = (size_t)(nl - rd->buf);
        return 1;
    }
    rd->scan = rd->end;
    *eol = rd->end;
    return rd->eof && rd->beg < rd->end;
}

/* Use up the line ending at eol. */
static void next_line(kvp_prompts_reader *rd, size_t eol)
{
    rd->line++;
    rd->beg = rd->scan = eol < rd->end ? eol + 1 : eol;
}

static int blank(char c) { return c == ' ' || c == '\t' || c == '\r'; }

/* A UTF-8 byte order mark opening the file (Windows editors write one)
 * is not part of it: skipped before the mode is decided, from a JSON Lines
 * file and a plain-text prompt alike.  1 when that is settled, 0 when the
 * bytes at hand are a start of one and more must be read. */
static int skip_bom(kvp_prompts_reader *rd)
{
    static const char bom[3] = {'\xef', '\xbb', '\xbf'};
    size_t have = rd->end - rd->beg;
    if (have < sizeof bom && !rd->eof && (have == 0 || memcmp(rd->buf + rd->beg, bom, have) == 0))
        return 0;
    if (have >= sizeof bom && memcmp(rd->buf + rd->beg, bom, sizeof bom) == 0)
        rd->beg = rd->scan = rd->beg + sizeof bom;
    rd->bom_done = 1;
    return 1;
}

/* Whether the buffer holds what the next call needs (a whole non-blank
 * line, all of a plain-text file, or the end), deciding the mode on the
 * way and using up blank lines: 1 or 0 (more must be read). */
static int at_hand(kvp_prompts_reader *rd)
{
    if (rd->rc < 0 || rd->text_done)
        return 1;
    if (!rd->bom_done && !skip_bom(rd))
        return 0;
    if (rd->mode == MODE_UNKNOWN) {
        size_t i = rd->beg;
        while (i < rd->end && (blank(rd->buf[i]) || rd->buf[i] == '\n'))
            i++;
        if (i == rd->end)
            return rd->eof;
        /* prefill's output where prompts belong: a KVP stream starts with
         * byte 0x89 (kvp(5)), which no UTF-8 text does */
        if ((unsigned char)rd->buf[i] == 0x89) {
            int kvp = rd->end - i >= 4 && !memcmp(rd->buf + i + 1, "KVP", 3);
            int rc = kvp_err_set(&rd->e, KVP_EFORMAT,
                                 "%s: starts with byte 0x89%s, not a prompts file (text, or JSON lines): decode and "
                                 "specdec read a KVP stream as their input file (or standard input), not with -f",
                                 rd->path, kvp ? " \"KVP\": a KVP stream" : "");
            fail(rd, rc);
            return 1;
        }
        rd->mode = rd->buf[i] == '{' ? MODE_JSON : MODE_TEXT;
    }
    if (rd->mode == MODE_TEXT) {
        /* a NUL is at hand at once: a binary file (a model, /dev/zero) is
         * refused without reading it all (up to the 1 GiB ceiling) */
        if (rd->scan < rd->end && memchr(rd->buf + rd->scan, 0, rd->end - rd->scan))
            return 1;
        rd->scan = rd->end;
        return rd->eof;
    }
    size_t eol;
    while (whole_line(rd, &eol)) {
        size_t a = rd->beg;
        while (a < eol && blank(rd->buf[a]))
            a++;
        if (a < eol)
            return 1;
        next_line(rd, eol);
    }
    return rd->eof;
}

int kvp_prompts_reader_ready(kvp_prompts_reader *rd)
{
    while (!at_hand(rd)) {
        if (kvp_in_would_block(&rd->in))
            return 0;
        if (fill(rd) < 0)
            return 1; /* the failure is at hand */
    }
    return 1;
}

/* Hand the prompt parsed into rd->one out as *p. */
static int hand_out(kvp_prompts_reader *rd, kvp_prompt *p)
{
    *p = rd->one.p[0];
    rd->one.n = 0;
    rd->line_last = rd->line;
    rd->n++;
    return 1;
}

/* A plain-text prompt must be UTF-8, as a JSON one's strings are (the
 * tokenizer would drop a bad byte): 0, or KVP_EFORMAT naming the line and
 * the byte offset in it. */
static int text_utf8(kvp_prompts_reader *rd)
{
    const char *t = rd->buf + rd->beg;
    size_t n = rd->end - rd->beg, k = kvp_unicode_valid_prefix(t, n), line = 1, sol = 0;
    if (k == n)
        return 0;
    for (size_t i = 0; i < k; i++)
        if (t[i] == '\n')
            line++, sol = i + 1;
    return kvp_err_set(&rd->e, KVP_EFORMAT, "%s:%zu: invalid UTF-8 at byte offset %zu of the line (0x%02x)", rd->path,
                       line, k - sol, (unsigned)(unsigned char)t[k]);
}

/* A request line's fields (params_of, id_of, add_json_prompt read them). */
static const char *const request_fields[] = {"id",    "prompt", "messages", "max_tokens", "temperature", "top_p",
                                             "top_k", "min_p",  "seed",     "stop",       "cache_salt"};

/* o's fields that no request has, each name told once: a misspelt one
 * ("max_token") would otherwise leave its default in force unseen.
 * Passed over, not refused: OpenAI-style request files carry fields of
 * their own ("model", "user", ...). */
static int tell_unknown(kvp_prompts_reader *rd, const kvp_json *o)
{
    if (!rd->on_unknown || o->type != KVP_JSON_OBJECT)
        return 0;
    for (size_t k = 0; k < o->n; k++) {
        size_t f = 0, n = sizeof request_fields / sizeof *request_fields;
        while (f < n && strcmp(o->keys[k], request_fields[f]) != 0)
            f++;
        if (f < n)
            continue;
        int added = kvp_strmap_add(&rd->unknown, o->keys[k], strlen(o->keys[k]), rd->line, NULL);
        if (added < 0)
            return kvp_err_set(&rd->e, KVP_ENOMEM, "prompts: out of memory");
        if (added)
            rd->on_unknown(rd->on_unknown_ctx, rd->path, rd->line, o->keys[k]);
    }
    return 0;
}

int kvp_prompts_reader_next(kvp_prompts_reader *rd, kvp_prompt *p, kvp_err *err)
{
    memset(p, 0, sizeof *p);
    while (!at_hand(rd))
        if (fill(rd) < 0)
            break;
    if (rd->rc < 0) {
        if (err)
            *err = rd->e;
        return rd->rc;
    }
    int rc = 0;
    if (rd->mode == MODE_UNKNOWN) {
        return 0; /* nothing but blanks: no prompt, which each program judges (a night with nothing to do) */
    } else if (rd->mode == MODE_TEXT) {
        if (rd->text_done)
            return 0;
        rd->text_done = 1;
        const char *nul = memchr(rd->buf + rd->beg, 0, rd->end - rd->beg);
        if (nul) /* a binary file (a model, say) given as the prompt */
            rc = kvp_err_set(&rd->e, KVP_EFORMAT, "%s: byte %zu is NUL: a binary file, not a text prompt", rd->path,
                             (size_t)(nul - (rd->buf + rd->beg)));
        else if (rd->one.system && rd->one.system[0] && !rd->one.chat)
            rc = kvp_err_set(&rd->e, KVP_EFORMAT, "%s: a plain-text prompt has no system turn for --system: give "
                             "--chat too", rd->path);
        else if ((rc = text_utf8(rd)) == 0) {
            /* a text file's last newline (`echo ... > p.txt`, an editor's)
             * ends the file, not the prompt, as llama.cpp's -f takes it */
            size_t n = rd->end - rd->beg;
            if (n && rd->buf[rd->beg + n - 1] == '\n')
                n -= n > 1 && rd->buf[rd->beg + n - 2] == '\r' ? 2 : 1;
            rc = kvp_prompts_add_text(&rd->one, "", rd->buf + rd->beg, n, &rd->e);
        }
        rd->line = 1;
        rd->beg = rd->scan = rd->end;
        if (rc == 0)
            return hand_out(rd, p);
    } else {
        size_t eol;
        if (!whole_line(rd, &eol))
            return 0; /* at_hand used up the blank lines before the end */
        size_t a = rd->beg; /* from the line's start: a message's column is the file's */
        next_line(rd, eol); /* the bytes stay where they are until the next read */
        kvp_json *o;
        rc = kvp_json_parse_line(&o, rd->buf + a, eol - a, rd->path, rd->line, &rd->e);
        int kind = ID_INDEX;
        if (rc == 0) {
            rc = add_json(&rd->one, o, rd->path, rd->line, &kind, &rd->e);
            if (rc == 0)
                rc = tell_unknown(rd, o);
            kvp_json_free(o);
        }
        if (rc == 0 && (rc = id_once(&rd->ids, rd->one.p[0].label, kind, rd->n, rd->path, rd->line, &rd->e)) < 0) {
            kvp_prompt_free(&rd->one.p[0]);
            rd->one.n = 0;
        }
        if (rc == 0)
            return hand_out(rd, p);
    }
    if (rc < 0) {
        if (err)
            *err = rd->e;
        return fail(rd, rc);
    }
    return 0;
}

/* The counting state of kvp_prompts_count_file, a chunk at a time. */
typedef struct line_count {
    int started;      /* the first non-blank byte has been seen */
    int text;         /* it was not '{': one plain-text prompt */
    int line_has;     /* the current line has a non-blank byte */
    uint64_t n;
} line_count;

static void count_bytes(line_count *c, const char *p, size_t n)
{
    for (size_t i = 0; i < n && !c->text; i++) {
        char b = p[i];
        if (b == '\n') {
            c->n += c->line_has;
            c->line_has = 0;
        } else if (!blank(b)) {
            if (!c->started) {
                c->started = 1;
                c->text = b != '{';
            }
            c->line_has = 1;
        }
    }
}

int kvp_prompts_count_file(const char *path, uint64_t *n, kvp_err *err)
{
    *n = 0;
    struct stat st;
    if (strcmp(path, "-") == 0 || stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        return 0; /* the reader reports what is wrong with it */
    FILE *f = fopen(path, "rb");
    if (!f)
        return kvp_err_set(err, KVP_EIO, "%s: %s", path, strerror(errno));
    static const char bom[3] = {'\xef', '\xbb', '\xbf'};
    char buf[65536];
    line_count c = {0};
    size_t got;
    int first = 1;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
        size_t off = first && got >= 3 && memcmp(buf, bom, 3) == 0 ? 3 : 0;
        first = 0;
        count_bytes(&c, buf + off, got - off);
        if (c.text)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad)
        return kvp_err_set(err, KVP_EIO, "%s: read error", path);
    *n = c.text ? 1 : c.n + c.line_has;
    return 0;
}

int kvp_prompts_read_file(kvp_prompts *ps, const char *path, kvp_err *err)
{
    kvp_prompts_reader *rd;
    int rc = kvp_prompts_reader_open(&rd, path, ps, err);
    while (rc == 0) {
        kvp_prompt p;
        if ((rc = kvp_prompts_reader_next(rd, &p, err)) <= 0)
            break;
        if ((rc = grow(ps)) < 0) {
            kvp_prompt_free(&p);
            rc = kvp_err_set(err, KVP_ENOMEM, "prompts: out of memory");
            break;
        }
        ps->p[ps->n++] = p;
        rc = 0;
    }
    kvp_prompts_reader_free(rd);
    return rc;
}
