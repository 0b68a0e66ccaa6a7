/* prompts.c - prompt files (JSON Lines or text), rendered by chat.c. */
#include "prompts.h"
#include "hash.h"
#include "io.h"
#include "json.h"
#include "tensor.h"
#include "wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVP_PROMPTS_MAX_FILE (1ull << 30)

void kvp_prompts_init(kvp_prompts *ps)
{
    memset(ps, 0, sizeof *ps);
    ps->format = KVP_CHAT_CHATML;
}

void kvp_prompts_free(kvp_prompts *ps)
{
    for (size_t i = 0; i < ps->n; i++) {
        free(ps->p[i].label);
        free(ps->p[i].text);
        free(ps->p[i].special);
        for (size_t k = 0; k < ps->p[i].params.n_stop; k++)
            free(ps->p[i].params.stop[k]);
        free(ps->p[i].params.stop);
    }
    free(ps->p);
    ps->p = NULL;
    ps->n = ps->cap = 0;
}

/* Take text (malloc'd, NUL-terminated) and special (malloc'd or NULL) as
 * prompt n, or free them. */
static int push(kvp_prompts *ps, const char *label, char *text, size_t len, kvp_tok_span *special,
                size_t n_special, kvp_err *err)
{
    char *l = NULL;
    if (ps->n == ps->cap) {
        size_t cap = ps->cap ? ps->cap * 2 : 8;
        kvp_prompt *p = realloc(ps->p, cap * sizeof *p);
        if (!p)
            goto oom;
        ps->p = p;
        ps->cap = cap;
    }
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
        kvp_chat_msg m[2] = {{"system", ps->system}, {"user", t}};
        int rc = ps->system ? push_chat(ps, label, m, 2, err) : push_chat(ps, label, m + 1, 1, err);
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

int kvp_prompts_encode(const kvp_prompts *ps, size_t i, const kvp_tokenizer *t, int32_t **ids, size_t *n,
                       kvp_err *err)
{
    const kvp_prompt *p = &ps->p[i];
    return kvp_tokenizer_encode_spans(t, p->text, p->len, p->special, p->n_special, -1, ids, n, err);
}

static void params_free(kvp_prompt_params *pp)
{
    for (size_t k = 0; k < pp->n_stop; k++)
        free(pp->stop[k]);
    free(pp->stop);
    memset(pp, 0, sizeof *pp);
}

/* A number field in [lo, hi] (integral when whole): 1 when present, 0 when
 * absent, or a code naming the line and the field. */
static int num_field(const kvp_json *o, const char *key, double lo, double hi, int whole, double *out,
                     const char *path, int line, kvp_err *err)
{
    const kvp_json *v = kvp_json_get(o, key);
    if (!v || v->type == KVP_JSON_NULL)
        return 0;
    double x;
    if (v->type != KVP_JSON_NUMBER || kvp_json_get_f64(o, key, &x) < 0 || (whole && !v->is_int) || !(x >= lo) ||
        !(x <= hi))
        return kvp_err_set(err, KVP_EFORMAT, "%s:%d: \"%s\" must be %s in [%g, %g]", path, line, key,
                           whole ? "an integer" : "a number", lo, hi);
    *out = x;
    return 1;
}

/* "stop": a string or an array of strings. */
static int stop_field(const kvp_json *o, kvp_prompt_params *pp, const char *path, int line, kvp_err *err)
{
    const kvp_json *v = kvp_json_get(o, "stop");
    if (!v || v->type == KVP_JSON_NULL)
        return 0;
    size_t n = v->type == KVP_JSON_STRING ? 1 : v->type == KVP_JSON_ARRAY ? v->n : 0;
    if (v->type != KVP_JSON_STRING && v->type != KVP_JSON_ARRAY)
        return kvp_err_set(err, KVP_EFORMAT, "%s:%d: \"stop\" must be a string or an array of strings", path, line);
    if (n > 64)
        return kvp_err_set(err, KVP_ELIMIT, "%s:%d: %zu stop strings (at most 64)", path, line, n);
    pp->stop = calloc(n ? n : 1, sizeof *pp->stop);
    if (!pp->stop)
        return kvp_err_set(err, KVP_ENOMEM, "prompts: out of memory");
    for (size_t i = 0; i < n; i++) {
        const kvp_json *e = v->type == KVP_JSON_STRING ? v : kvp_json_at(v, i);
        if (!e || e->type != KVP_JSON_STRING)
            return kvp_err_set(err, KVP_EFORMAT, "%s:%d: \"stop\" entry %zu is not a string", path, line, i);
        if (!(pp->stop[i] = strdup(e->str)))
            return kvp_err_set(err, KVP_ENOMEM, "prompts: out of memory");
        pp->n_stop = i + 1;
    }
    pp->set |= KVP_PARAM_STOP;
    return 0;
}

/* The request's own generation parameters (kvp_prompt_params). */
static int params_of(const kvp_json *o, kvp_prompt_params *pp, const char *path, int line, kvp_err *err)
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
    FIELD("seed", 0, 9007199254740991.0, 1, KVP_PARAM_SEED, pp->seed = (uint64_t)x)
#undef FIELD
    const kvp_json *salt = kvp_json_get(o, "cache_salt");
    if (salt && salt->type != KVP_JSON_NULL) {
        if (salt->type != KVP_JSON_STRING || salt->len == 0)
            return kvp_err_set(err, KVP_EFORMAT, "%s:%d: \"cache_salt\" must be a non-empty string", path, line);
        pp->cache_salt = kvp_xxh64(salt->str, salt->len, 0) | 1;
        pp->set |= KVP_PARAM_CACHE_SALT;
    }
    return stop_field(o, pp, path, line, err);
}

static int add_json_prompt(kvp_prompts *ps, const kvp_json *o, const char *lab, const char *path, int line,
                           kvp_err *err);

/* One JSON Lines object. */
static int add_json(kvp_prompts *ps, const kvp_json *o, const char *path, int line, kvp_err *err)
{
    if (o->type != KVP_JSON_OBJECT)
        return kvp_err_set(err, KVP_EFORMAT, "%s:%d: expected an object", path, line);
    char label[64] = "";
    const char *lab = "";
    const kvp_json *id = kvp_json_get(o, "id");
    if (id && id->type == KVP_JSON_STRING) {
        /* it travels in a sequence record's label, KVP_NAME_MAX bytes: refused
         * rather than cut, so two long ids never come out the same */
        if (id->len > KVP_NAME_MAX)
            return kvp_err_set(err, KVP_EFORMAT, "%s:%d: \"id\" is %zu bytes, longer than %d", path, line, id->len,
                               KVP_NAME_MAX);
        lab = id->str;
    } else if (id && id->type == KVP_JSON_NUMBER && id->is_int) {
        snprintf(label, sizeof label, "%lld", (long long)id->i);
        lab = label;
    } else if (id && id->type != KVP_JSON_NULL) {
        return kvp_err_set(err, KVP_EFORMAT, "%s:%d: \"id\" must be a string or an integer", path, line);
    }
    kvp_prompt_params pp;
    int rc = params_of(o, &pp, path, line, err);
    if (rc < 0) {
        params_free(&pp);
        return rc;
    }
    size_t before = ps->n;
    rc = add_json_prompt(ps, o, lab, path, line, err);
    if (rc == 0 && ps->n == before + 1)
        ps->p[before].params = pp;
    else
        params_free(&pp);
    return rc;
}

/* The prompt of one JSON Lines object: "prompt", or "messages" rendered. */
static int add_json_prompt(kvp_prompts *ps, const kvp_json *o, const char *lab, const char *path, int line,
                           kvp_err *err)
{
    const kvp_json *pr = kvp_json_get(o, "prompt"), *msgs = kvp_json_get(o, "messages");
    if (pr && pr->type == KVP_JSON_STRING)
        return kvp_prompts_add_text(ps, lab, pr->str, pr->len, err);
    if (!msgs || msgs->type != KVP_JSON_ARRAY || msgs->n == 0)
        return kvp_err_set(err, KVP_EFORMAT, "%s:%d: needs a \"prompt\" string or a non-empty \"messages\" array",
                           path, line);
    kvp_chat_msg *m = calloc(msgs->n + 1, sizeof *m);
    size_t k = 0;
    if (!m)
        return kvp_err_set(err, KVP_ENOMEM, "prompts: out of memory");
    const char *first = kvp_json_get_str(kvp_json_at(msgs, 0), "role");
    if (ps->system && (!first || strcmp(first, "system") != 0))
        m[k++] = (kvp_chat_msg){"system", ps->system};
    for (size_t i = 0; i < msgs->n; i++, k++) {
        const kvp_json *e = kvp_json_at(msgs, i);
        m[k] = (kvp_chat_msg){kvp_json_get_str(e, "role"), kvp_json_get_str(e, "content")};
        if (!m[k].role || !m[k].role[0] || !m[k].content) {
            free(m);
            return kvp_err_set(err, KVP_EFORMAT, "%s:%d: message %zu needs a non-empty \"role\" and a \"content\" "
                               "string", path, line, i);
        }
    }
    int rc = push_chat(ps, lab, m, k, err);
    free(m);
    return rc;
}

int kvp_prompts_read_file(kvp_prompts *ps, const char *path, kvp_err *err)
{
    uint8_t *data;
    size_t len;
    int rc = kvp_read_file(path, KVP_PROMPTS_MAX_FILE, &data, &len, err);
    if (rc < 0)
        return rc;
    const char *s = (const char *)data;
    size_t i = 0;
    while (i < len && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
        i++;
    if (i == len) {
        free(data);
        return kvp_err_set(err, KVP_EFORMAT, "%s: no prompt in the file", path);
    }
    if (s[i] != '{') {
        rc = kvp_prompts_add_text(ps, "", s, len, err);
        free(data);
        return rc;
    }
    size_t pos = 0;
    int line = 0;
    while (pos < len && rc == 0) {
        size_t end = pos;
        while (end < len && s[end] != '\n')
            end++;
        line++;
        size_t a = pos;
        while (a < end && (s[a] == ' ' || s[a] == '\t' || s[a] == '\r'))
            a++;
        if (a < end) {
            kvp_json *o;
            char name[300];
            snprintf(name, sizeof name, "%s:%d", path, line);
            rc = kvp_json_parse(&o, s + a, end - a, name, err);
            if (rc == 0) {
                rc = add_json(ps, o, path, line, err);
                kvp_json_free(o);
            }
        }
        pos = end + 1;
    }
    free(data);
    return rc;
}
