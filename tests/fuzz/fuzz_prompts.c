/* fuzz_prompts.c - libFuzzer harness: the prompts file reader (JSON Lines of
 * {"id","prompt"} or {"messages":[...]}, or one plain text) with ChatML
 * rendering on and off.  It takes a path, so each input goes to one scratch file
 * (removed at exit).  Every prompt accepted must be a NUL-terminated string
 * of the length it claims, its special spans sorted and inside it; read a
 * record at a time (kvp_prompts_reader, asked whether it is ready between
 * records, as decode does), the file gives the same prompts, up to the same
 * failure.  Ids are keys (the label, else the index), each once: decode
 * --resume tells requests apart by them.  kvp_prompts_count_file counts the
 * requests of every file read whole.  A field no request has is told once a
 * name, the same by both readers. */
#define _POSIX_C_SOURCE 200809L
#include "prompts.h"
#include "tensor.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "scratch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Prompt i's key: its label, or its index when it has none. */
static const char *key_of(const kvp_prompts *ps, size_t i, char buf[32])
{
    if (ps->p[i].label[0])
        return ps->p[i].label;
    snprintf(buf, 32, "%zu", i);
    return buf;
}

/* abort() when two prompts have one key or a label is too long. */
static void check_keys(const kvp_prompts *ps)
{
    for (size_t i = 0; i < ps->n; i++) {
        char a[32], b[32];
        const char *ki = key_of(ps, i, a);
        if (strlen(ps->p[i].label) > KVP_NAME_MAX)
            abort();
        for (size_t j = 0; j < i; j++)
            if (strcmp(ki, key_of(ps, j, b)) == 0)
                abort();
    }
}

/* The reader's note of a field no request has: a name of the line's, NUL-
 * terminated, never a request's own, each once (checked by counting: no
 * more notes than the file has bytes). */
static void on_unknown(void *ctx, const char *path, uint64_t line, const char *field)
{
    (void)path;
    size_t *n = ctx;
    if (line == 0 || !strcmp(field, "prompt") || !strcmp(field, "id") || !strcmp(field, "max_tokens"))
        abort();
    (void)strlen(field);
    ++*n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_scratch_write(data, size, "prompts");
    for (int chat = 0; chat <= 1; chat++) {
        kvp_prompts ps;
        kvp_prompts_init(&ps);
        ps.chat = chat;
        ps.system = chat ? "be brief" : NULL;
        size_t notes = 0;
        ps.on_unknown = on_unknown, ps.on_unknown_ctx = &notes;
        kvp_err err = {0};
        if (kvp_prompts_read_file(&ps, path, &err) == 0) {
            check_keys(&ps);
            /* decode --progress's count, made without parsing, agrees
             * with the reader on every file the reader takes whole */
            uint64_t counted = 0;
            kvp_err ec = {0};
            if (kvp_prompts_count_file(path, &counted, &ec) != 0 || counted != ps.n)
                abort();
            for (size_t i = 0; i < ps.n; i++)
                if (!ps.p[i].text || !ps.p[i].label || ps.p[i].text[ps.p[i].len] != '\0')
                    abort();
            for (size_t i = 0; i < ps.n; i++) /* special spans: sorted, inside the text */
                for (size_t k = 0; k < ps.p[i].n_special; k++) {
                    const kvp_tok_span *sp = ps.p[i].special;
                    if (sp[k].off + sp[k].len > ps.p[i].len || (k && sp[k].off < sp[k - 1].off + sp[k - 1].len))
                        abort();
                }
        } else if (err.code >= 0 || !err.msg[0]) {
            abort(); /* a failure must carry a code and a message */
        }
        int whole = err.code;
        size_t first = notes; /* the record-at-a-time pass tells the same names */
        if (first > size)
            abort();
        kvp_prompts_reader *rd;
        kvp_err e2 = {0};
        size_t n = 0;
        int rc = kvp_prompts_reader_open(&rd, path, &ps, &e2);
        while (rc == 0) {
            kvp_prompt p;
            if (!kvp_prompts_reader_ready(rd))
                abort(); /* a file never waits */
            if ((rc = kvp_prompts_reader_next(rd, &p, &e2)) <= 0)
                break;
            if (n >= ps.n || strcmp(p.label, ps.p[n].label) != 0 || p.len != ps.p[n].len ||
                memcmp(p.text, ps.p[n].text, p.len) != 0)
                abort();
            n++;
            kvp_prompt_free(&p);
            rc = 0;
        }
        if (n != ps.n || (rc < 0) != (whole < 0) || (rc < 0 && strcmp(err.msg, e2.msg) != 0) || notes != 2 * first)
            abort();
        if (rc < 0 && kvp_prompts_reader_next(rd, &(kvp_prompt){0}, &e2) != rc)
            abort(); /* a failure stays */
        kvp_prompts_reader_free(rd);
        kvp_prompts_free(&ps);
    }
    return 0;
}
