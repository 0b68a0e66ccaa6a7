/* prompts.c - prompt files (JSON Lines or text) and chat rendering. */
#include "prompts.h"
#include "io.h"
#include "json.h"
#include "tensor.h"
#include "wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVP_PROMPTS_MAX_FILE (1ull << 30)

void kvp_prompts_init(kvp_prompts *ps, int chat, const char *system)
{
    memset(ps, 0, sizeof *ps);
    ps->chat = chat;
    ps->system = system;
}

void kvp_prompts_free(kvp_prompts *ps)
{
    for (size_t i = 0; i < ps->n; i++) {
        free(ps->p[i].label);
        free(ps->p[i].text);
    }
    free(ps->p);
    ps->p = NULL;
    ps->n = ps->cap = 0;
}

static void put_str(kvp_buf *b, const char *s) { kvp_buf_put(b, s, strlen(s)); }

int kvp_prompts_render(int fmt, const char *const *role, const char *const *content, size_t n, char **out,
                    size_t *len, kvp_err *err)
{
    kvp_buf b;
    kvp_buf_init(&b);
    for (size_t i = 0; i < n; i++) {
        if (fmt == KVP_CHAT_LLAMA3) {
            if (i == 0)
                put_str(&b, "<|begin_of_text|>");
            put_str(&b, "<|start_header_id|>");
            put_str(&b, role[i]);
            put_str(&b, "<|end_header_id|>\n\n");
            put_str(&b, content[i]);
            put_str(&b, "<|eot_id|>");
        } else {
            put_str(&b, "<|im_start|>");
            put_str(&b, role[i]);
            put_str(&b, "\n");
            put_str(&b, content[i]);
            put_str(&b, "<|im_end|>\n");
        }
    }
    put_str(&b, fmt == KVP_CHAT_LLAMA3 ? "<|start_header_id|>assistant<|end_header_id|>\n\n" : "<|im_start|>assistant\n");
    kvp_buf_u8(&b, 0);
    if (b.oom) {
        kvp_buf_free(&b);
        return kvp_err_set(err, KVP_ENOMEM, "chat: out of memory");
    }
    *out = (char *)b.data;
    *len = b.len - 1;
    return 0;
}

static int push(kvp_prompts *ps, const char *label, char *text, size_t len, int special, kvp_err *err)
{
    if (ps->n == ps->cap) {
        size_t cap = ps->cap ? ps->cap * 2 : 8;
        kvp_prompt *p = realloc(ps->p, cap * sizeof *p);
        if (!p) {
            free(text);
            return kvp_err_set(err, KVP_ENOMEM, "prompts: out of memory");
        }
        ps->p = p;
        ps->cap = cap;
    }
    if (label && strlen(label) > KVP_NAME_MAX) {
        free(text);
        return kvp_err_set(err, KVP_EINVAL, "prompts: id of %zu bytes, longer than %d", strlen(label), KVP_NAME_MAX);
    }
    char *l = strdup(label ? label : "");
    if (!l) {
        free(text);
        return kvp_err_set(err, KVP_ENOMEM, "prompts: out of memory");
    }
    ps->p[ps->n++] = (kvp_prompt){l, text, len, special};
    return 0;
}

int kvp_prompts_add_text(kvp_prompts *ps, const char *label, const char *text, size_t len, kvp_err *err)
{
    char *t;
    size_t n;
    if (ps->chat) {
        const char *role[2] = {"system", "user"}, *content[2] = {ps->system, NULL};
        char *user = malloc(len + 1);
        if (!user)
            return kvp_err_set(err, KVP_ENOMEM, "prompts: out of memory");
        memcpy(user, text, len);
        user[len] = 0;
        content[1] = user;
        int rc = ps->system ? kvp_prompts_render(ps->chat, role, content, 2, &t, &n, err)
                            : kvp_prompts_render(ps->chat, role + 1, content + 1, 1, &t, &n, err);
        free(user);
        if (rc < 0)
            return rc;
        return push(ps, label, t, n, 1, err);
    }
    if (!(t = malloc(len + 1)))
        return kvp_err_set(err, KVP_ENOMEM, "prompts: out of memory");
    memcpy(t, text, len);
    t[len] = 0;
    return push(ps, label, t, len, 0, err);
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
    const kvp_json *pr = kvp_json_get(o, "prompt"), *msgs = kvp_json_get(o, "messages");
    if (pr && pr->type == KVP_JSON_STRING)
        return kvp_prompts_add_text(ps, lab, pr->str, pr->len, err);
    if (!msgs || msgs->type != KVP_JSON_ARRAY || msgs->n == 0)
        return kvp_err_set(err, KVP_EFORMAT, "%s:%d: needs a \"prompt\" string or a non-empty \"messages\" array",
                           path, line);
    const char **role = calloc(msgs->n + 1, sizeof *role), **content = calloc(msgs->n + 1, sizeof *content);
    int rc = 0;
    size_t k = 0;
    if (!role || !content) {
        rc = kvp_err_set(err, KVP_ENOMEM, "prompts: out of memory");
        goto out;
    }
    if (ps->system && strcmp(kvp_json_get_str(kvp_json_at(msgs, 0), "role") ? kvp_json_get_str(kvp_json_at(msgs, 0), "role") : "", "system") != 0) {
        role[k] = "system";
        content[k++] = ps->system;
    }
    for (size_t i = 0; i < msgs->n; i++, k++) {
        const kvp_json *m = kvp_json_at(msgs, i);
        role[k] = kvp_json_get_str(m, "role");
        content[k] = kvp_json_get_str(m, "content");
        if (!role[k] || !content[k]) {
            rc = kvp_err_set(err, KVP_EFORMAT, "%s:%d: message %zu needs \"role\" and \"content\" strings", path,
                             line, i);
            goto out;
        }
    }
    char *t;
    size_t n;
    if ((rc = kvp_prompts_render(ps->chat ? ps->chat : KVP_CHAT_CHATML, role, content, k, &t, &n, err)) == 0)
        rc = push(ps, lab, t, n, 1, err);
out:
    free(role);
    free(content);
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
