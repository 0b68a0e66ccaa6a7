/* prompts.c - prompt files (JSON Lines or text), rendered by chat.c. */
#include "prompts.h"
#include "io.h"
#include "json.h"
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
    if (!(l = strdup(label ? label : "")))
        goto oom;
    ps->p[ps->n++] = (kvp_prompt){l, text, len, special, n_special};
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

/* One JSON Lines object. */
static int add_json(kvp_prompts *ps, const kvp_json *o, const char *path, int line, kvp_err *err)
{
    if (o->type != KVP_JSON_OBJECT)
        return kvp_err_set(err, KVP_EFORMAT, "%s:%d: expected an object", path, line);
    char label[64] = "";
    const char *lab = "";
    const kvp_json *id = kvp_json_get(o, "id");
    if (id && id->type == KVP_JSON_STRING) {
        lab = id->str;
    } else if (id && id->type == KVP_JSON_NUMBER && id->is_int) {
        snprintf(label, sizeof label, "%lld", (long long)id->i);
        lab = label;
    } else if (id && id->type != KVP_JSON_NULL) {
        return kvp_err_set(err, KVP_EFORMAT, "%s:%d: \"id\" must be a string or an integer", path, line);
    }
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
