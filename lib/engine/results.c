/* results.c - ids already written to a results file (see results.h). */
#include "results.h"
#include "json.h"
#include "wire.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void kvp_idset_init(kvp_idset *s) { kvp_strmap_init(s); }

void kvp_idset_free(kvp_idset *s) { kvp_strmap_free(s); }

int kvp_idset_has(const kvp_idset *s, const char *id, size_t len) { return kvp_strmap_has(s, id, len); }

int kvp_idset_add(kvp_idset *s, const char *id, size_t len) { return kvp_strmap_add(s, id, len, 0, NULL); }

/* What is wrong with a result line's "id" (NULL when it is fine), else
 * its key into *key, *len: a string as it is, an integer as its decimal
 * digits in num.  Keys are the prompts reader's (prompts.h): decode prints
 * an integer id of a prompts file and the index of a line without one as
 * integers, a string id as a string, and each reads back as the key the
 * prompts file gives that request (results files written when an integer
 * id came back as the string of its digits read the same). */
static const char *id_key(const kvp_json *id, char num[32], const char **key, size_t *len)
{
    int64_t k;
    if (!id || id->type == KVP_JSON_NULL)
        return "a result line without an \"id\" (string or integer)";
    if (id->type == KVP_JSON_STRING) {
        /* decode never writes these (a prompts file cannot give them): a
         * hand-edited line, whose key would match no request */
        if (id->len == 0)
            return "\"id\" is empty";
        if (memchr(id->str, 0, id->len))
            return "\"id\" holds a NUL character";
        *key = id->str;
        *len = id->len;
        return NULL;
    }
    if (kvp_json_to_i64(id, &k) < 0)
        return "\"id\" must be a string or an integer in [-9223372036854775808, 9223372036854775807]";
    *len = (size_t)snprintf(num, 32, "%" PRId64, k);
    *key = num;
    return NULL;
}

/* The id of one whole line into done: the line checked whole, its "id"
 * alone kept (a result's text is not copied). */
static int line_id(const char *path, uint64_t line, const char *p, size_t n, kvp_idset *done, kvp_err *err)
{
    kvp_json *v = NULL;
    int rc = kvp_json_parse_line_member(&v, p, n, path, line, "id", err);
    if (rc < 0)
        return rc;
    char num[32];
    const char *key = NULL;
    size_t len = 0;
    const char *bad = id_key(kvp_json_get(v, "id"), num, &key, &len);
    if (bad) {
        kvp_json_free(v);
        return kvp_err_set(err, KVP_EFORMAT, "%s:%" PRIu64 ": %s", path, line, bad);
    }
    rc = kvp_idset_add(done, key, len);
    kvp_json_free(v);
    return rc < 0 ? kvp_err_set(err, KVP_ENOMEM, "%s: out of memory for its ids", path) : 0;
}

/* The scan's state: the bytes of the line in hand (and what follows it of
 * the last read) in buf, grown only for a line longer than it. */
typedef struct scan {
    const char *path;
    int fd;
    char *buf;
    size_t cap, len;   /* buf[0..len): the current line's start onward */
    uint64_t at;       /* the file offset of buf[0] */
    uint64_t line;     /* whole lines taken */
} scan;

/* More bytes after buf[0..len), the buffer doubled when the line fills it:
 * the count read (0 at the end), or a code naming the file. */
static int scan_fill(scan *sc, kvp_err *err)
{
    if (sc->len == sc->cap) {
        if (sc->cap > KVP_JSON_MAX_SIZE)
            return kvp_err_set(err, KVP_ELIMIT, "%s:%" PRIu64 ": a line of over %llu bytes: not a result line",
                               sc->path, sc->line + 1, (unsigned long long)KVP_JSON_MAX_SIZE);
        char *b = realloc(sc->buf, sc->cap * 2);
        if (!b)
            return kvp_err_set(err, KVP_ENOMEM, "%s:%" PRIu64 ": out of memory for a line of %zu bytes", sc->path,
                               sc->line + 1, sc->len);
        sc->buf = b;
        sc->cap *= 2;
    }
    ssize_t n;
    while ((n = read(sc->fd, sc->buf + sc->len, sc->cap - sc->len)) < 0 && errno == EINTR)
        ;
    if (n < 0)
        return kvp_err_set(err, KVP_EIO, "%s: %s", sc->path, strerror(errno));
    /* a KV stream, a model: no line of it is a result */
    const char *nul = memchr(sc->buf + sc->len, 0, (size_t)n);
    if (nul)
        return kvp_err_set(err, KVP_EFORMAT, "%s: byte %" PRIu64 " is NUL: a binary file, not results (JSON Lines)",
                           sc->path, sc->at + (uint64_t)(nul - sc->buf));
    sc->len += (size_t)n;
    return (int)(n > 0);
}

int kvp_results_scan(const char *path, kvp_idset *done, uint64_t *whole, kvp_err *err)
{
    *whole = 0;
    scan sc = {.path = path, .cap = 1 << 16};
    while ((sc.fd = open(path, O_RDONLY | O_CLOEXEC)) < 0 && errno == EINTR)
        ;
    if (sc.fd < 0 && errno == ENOENT)
        return 0; /* nothing written yet */
    if (sc.fd < 0)
        return kvp_err_set(err, KVP_EIO, "%s: %s", path, strerror(errno));
    if (!(sc.buf = malloc(sc.cap))) {
        close(sc.fd);
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", path);
    }
    /* A line at a time: the memory of the longest line, whatever the
     * file's length.  What follows the last newline is a killed run's
     * cut-off line (or nothing): left out, *whole ending before it. */
    size_t scanned = 0; /* buf[0..scanned) holds no newline */
    int rc;
    while ((rc = scan_fill(&sc, err)) > 0) {
        size_t start = 0;
        for (char *nl; (nl = memchr(sc.buf + scanned, '\n', sc.len - scanned)) != NULL && rc >= 0;) {
            size_t i = (size_t)(nl - sc.buf), b = start;
            sc.line++;
            while (b < i && (sc.buf[b] == ' ' || sc.buf[b] == '\t' || sc.buf[b] == '\r'))
                b++;
            if (b < i)
                rc = line_id(path, sc.line, sc.buf + start, i - start, done, err);
            start = scanned = i + 1;
            if (rc >= 0)
                *whole = sc.at + start;
        }
        if (rc < 0)
            break;
        memmove(sc.buf, sc.buf + start, sc.len - start);
        sc.len -= start;
        sc.at += start;
        scanned = sc.len;
    }
    free(sc.buf);
    close(sc.fd);
    return rc < 0 ? rc : 0;
}
