/* chat.c - ChatML and Llama-3 prompt rendering (see chat.h). */
#include "chat.h"

#include <stdlib.h>
#include <string.h>

int kvp_chat_format_parse(const char *name, kvp_chat_format *f, kvp_err *err)
{
    if (name && !strcmp(name, "chatml")) {
        *f = KVP_CHAT_CHATML;
        return 0;
    }
    if (name && (!strcmp(name, "llama3") || !strcmp(name, "llama-3"))) {
        *f = KVP_CHAT_LLAMA3;
        return 0;
    }
    return kvp_err_set(err, KVP_EINVAL, "chat format \"%s\": unknown (chatml, llama3)", name ? name : "");
}

const char *kvp_chat_format_name(kvp_chat_format f)
{
    switch (f) {
    case KVP_CHAT_CHATML: return "chatml";
    case KVP_CHAT_LLAMA3: return "llama3";
    case KVP_CHAT_NONE: return "none";
    }
    return "?";
}

static int no_format(kvp_err *err)
{
    return kvp_err_set(err, KVP_EUNSUPPORTED,
                       "the model's vocabulary has neither <|im_start|> (ChatML) nor <|start_header_id|> (Llama-3): "
                       "it has no chat format to render a conversation in (give plain prompts)");
}

int kvp_chat_detect(const kvp_tokenizer *t, kvp_chat_format *f, kvp_err *err)
{
    if (kvp_tokenizer_find(t, "<|start_header_id|>", 19) >= 0 && kvp_tokenizer_find(t, "<|eot_id|>", 10) >= 0) {
        *f = KVP_CHAT_LLAMA3;
        return 0;
    }
    if (kvp_tokenizer_find(t, "<|im_start|>", 12) >= 0 && kvp_tokenizer_find(t, "<|im_end|>", 10) >= 0) {
        *f = KVP_CHAT_CHATML;
        return 0;
    }
    return no_format(err);
}

/* The text of a Jinja string literal from s to e, its escapes (\n \t \\
 * \' \") undone, into out (e - s + 1 bytes); 0 when it is no plain
 * literal: it holds a quote, brace, '+' or '%' (template logic: the
 * message is built from variables, not ours to guess) or another escape. */
static int literal_text(const char *s, const char *e, char *out)
{
    size_t n = 0;
    for (; s < e; s++) {
        char c = *s;
        if (c == '\\') {
            if (++s == e)
                return 0;
            c = *s == 'n' ? '\n' : *s == 't' ? '\t' : *s;
            if (!strchr("\n\t\\'\"", c))
                return 0;
        } else if (strchr("{}'\"+%", c)) {
            return 0;
        }
        out[n++] = c;
    }
    out[n] = '\0';
    return n > 0;
}

int kvp_chat_default_system(const kvp_meta *m, char **out, kvp_err *err)
{
    static const char open[] = "<|im_start|>system";
    *out = NULL;
    const char *tpl = kvp_meta_get_str(m, "tokenizer.chat_template");
    /* Each system turn the template writes, in order, until one holds a
     * literal message: Qwen2.5's first two are built from variables (its
     * tools branch, a given system message), its third is the default.
     * The newline after the role is real, or the literal's escape. */
    for (const char *s = tpl ? strstr(tpl, open) : NULL; s; s = strstr(s + 1, open)) {
        const char *b = s + sizeof open - 1;
        b += *b == '\n' ? 1 : b[0] == '\\' && b[1] == 'n' ? 2 : 0;
        const char *e = b == s + sizeof open - 1 ? NULL : strstr(b, "<|im_end|>");
        if (!e)
            continue;
        char *text = malloc((size_t)(e - b) + 1);
        if (!text)
            return kvp_err_set(err, KVP_ENOMEM, "out of memory");
        if (literal_text(b, e, text)) {
            *out = text;
            return 0;
        }
        free(text);
    }
    return 0;
}

void kvp_chat_marks_free(kvp_chat_marks *m)
{
    free(m->v);
    memset(m, 0, sizeof *m);
}

static int chat_is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* Text appended to out with the marks it holds; *oom set on failure. */
typedef struct chat_out {
    kvp_buf *b;
    kvp_chat_marks *marks;
    int oom;
} chat_out;

static void chat_put_trimmed(chat_out *o, const char *s, size_t n)
{
    while (n && chat_is_space(*s))
        s++, n--;
    while (n && chat_is_space(s[n - 1]))
        n--;
    kvp_buf_put(o->b, s, n);
}

static void chat_put(chat_out *o, const char *s) { kvp_buf_put(o->b, s, strlen(s)); }

/* A message's field: its given length, else the C string's. */
static size_t chat_len(const char *s, size_t len) { return len ? len : strlen(s); }

/* A template marker: special where the text around it is not. */
static void chat_mark(chat_out *o, const char *s)
{
    kvp_chat_marks *m = o->marks;
    size_t at = o->b->len, len = strlen(s);
    chat_put(o, s);
    if (!m)
        return;
    if (m->n && m->v[m->n - 1].off + m->v[m->n - 1].len == at) {
        m->v[m->n - 1].len += len; /* adjacent markers: one span */
        return;
    }
    if (m->n == m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 16;
        kvp_tok_span *v = realloc(m->v, cap * sizeof *v);
        if (!v) {
            o->oom = 1;
            return;
        }
        m->v = v;
        m->cap = cap;
    }
    m->v[m->n++] = (kvp_tok_span){at, len};
}

static int chat_done(chat_out *o, kvp_err *err)
{
    if (o->b->oom || o->oom)
        return kvp_err_set(err, KVP_ENOMEM, "chat: out of memory");
    return 0;
}

int kvp_chat_render(kvp_chat_format f, const kvp_chat_msg *msgs, size_t n, int add_generation, kvp_buf *out,
                    kvp_chat_marks *marks, kvp_err *err)
{
    if (f == KVP_CHAT_NONE)
        return no_format(err);
    if (f != KVP_CHAT_CHATML && f != KVP_CHAT_LLAMA3)
        return kvp_err_set(err, KVP_EINVAL, "chat: format %d is not chatml or llama3", (int)f);
    chat_out o = {out, marks, 0};
    for (size_t i = 0; i < n; i++) {
        const kvp_chat_msg *m = &msgs[i];
        size_t rl = m->role ? chat_len(m->role, m->role_len) : 0;
        if (!rl || !m->content)
            return kvp_err_set(err, KVP_EINVAL, "chat: message %zu has no %s", i, m->content ? "role" : "content");
        size_t cl = chat_len(m->content, m->content_len);
        if (f == KVP_CHAT_CHATML) {
            chat_mark(&o, "<|im_start|>");
            kvp_buf_put(o.b, m->role, rl);
            chat_put(&o, "\n");
            kvp_buf_put(o.b, m->content, cl);
            chat_mark(&o, "<|im_end|>");
            chat_put(&o, "\n");
        } else {
            chat_mark(&o, "<|start_header_id|>");
            kvp_buf_put(o.b, m->role, rl);
            chat_mark(&o, "<|end_header_id|>");
            chat_put(&o, "\n\n");
            chat_put_trimmed(&o, m->content, cl);
            chat_mark(&o, "<|eot_id|>");
        }
    }
    if (add_generation) {
        if (f == KVP_CHAT_CHATML) {
            chat_mark(&o, "<|im_start|>");
            chat_put(&o, "assistant\n");
        } else {
            chat_mark(&o, "<|start_header_id|>");
            chat_put(&o, "assistant");
            chat_mark(&o, "<|end_header_id|>");
            chat_put(&o, "\n\n");
        }
    }
    return chat_done(&o, err);
}

int kvp_chat_prompt(kvp_chat_format f, const char *system, const char *user, kvp_buf *out, kvp_chat_marks *marks,
                    kvp_err *err)
{
    kvp_chat_msg m[2];
    size_t n = 0;
    if (system && system[0])
        m[n++] = (kvp_chat_msg){"system", system, 0, 0};
    m[n++] = (kvp_chat_msg){"user", user, 0, 0};
    return kvp_chat_render(f, m, n, 1, out, marks, err);
}

int kvp_chat_close_turn(kvp_chat_format f, kvp_buf *out, kvp_chat_marks *marks, kvp_err *err)
{
    if (f == KVP_CHAT_NONE)
        return no_format(err);
    if (f != KVP_CHAT_CHATML && f != KVP_CHAT_LLAMA3)
        return kvp_err_set(err, KVP_EINVAL, "chat: format %d is not chatml or llama3", (int)f);
    chat_out o = {out, marks, 0};
    if (f == KVP_CHAT_CHATML) {
        chat_mark(&o, "<|im_end|>");
        chat_put(&o, "\n");
    } else {
        chat_mark(&o, "<|eot_id|>");
    }
    return chat_done(&o, err);
}

/* c as it may stand in a one-line message: a control byte as '?'. */
static char chat_printable(char c) { return (unsigned char)c < 0x20 || c == 0x7f ? '?' : c; }

int kvp_chat_check_open(kvp_chat_format f, const kvp_tokenizer *t, const uint32_t *ids, size_t n, kvp_err *err)
{
    if (f == KVP_CHAT_NONE)
        return no_format(err);
    if (f != KVP_CHAT_CHATML && f != KVP_CHAT_LLAMA3)
        return kvp_err_set(err, KVP_EINVAL, "chat: format %d is not chatml or llama3", (int)f);
    int llama3 = f == KVP_CHAT_LLAMA3;
    const char *open = llama3 ? "<|start_header_id|>" : "<|im_start|>";
    int32_t id_open = kvp_tokenizer_find(t, open, strlen(open));
    int32_t id_role_end = llama3 ? kvp_tokenizer_find(t, "<|end_header_id|>", 17) : -1;
    size_t s = n; /* the first token after the last turn's opening marker */
    while (s > 0 && (int64_t)ids[s - 1] != id_open)
        s--;
    if (id_open < 0 || s == 0)
        return kvp_err_set(err, KVP_EINVAL, "it holds no %s turn (%s)", llama3 ? "Llama-3" : "ChatML", open);
    /* the role: the text up to the header's end (ChatML: a newline;
     * Llama-3: <|end_header_id|>); a turn is closed by any end of
     * generation after its marker (<|im_end|>, <|eot_id|>, EOS) */
    char role[48];
    size_t rl = 0, i = s;
    int whole = 0;
    for (; i < n && !whole && !kvp_tokenizer_is_eog(t, (int32_t)ids[i]); i++) {
        if ((int64_t)ids[i] == id_role_end) {
            whole = 1;
            break;
        }
        size_t len = 0;
        const char *p = kvp_tokenizer_piece(t, (int32_t)ids[i], &len);
        for (size_t k = 0; p && k < len && !whole; k++) {
            if (!llama3 && p[k] == '\n')
                whole = 1;
            else if (rl < sizeof role - 1)
                role[rl++] = chat_printable(p[k]);
        }
    }
    role[rl] = '\0';
    for (size_t j = s; j < n; j++) {
        if (kvp_tokenizer_is_eog(t, (int32_t)ids[j])) {
            size_t len = 0;
            const char *p = kvp_tokenizer_piece(t, (int32_t)ids[j], &len);
            return kvp_err_set(err, KVP_EINVAL, "its last turn (role \"%s\") is closed by %.*s", role,
                               p ? (int)len : 0, p ? p : "");
        }
    }
    if (!whole)
        return kvp_err_set(err, KVP_EINVAL, "its last turn's header is cut short (%s%s)", open, role);
    if (strcmp(role, "assistant") != 0)
        return kvp_err_set(err, KVP_EINVAL, "its last turn's role is \"%s\", not \"assistant\"", role);
    return 0;
}
