/* results.c - ids already written to a results file (see results.h). */
#include "results.h"
#include "io.h"
#include "json.h"
#include "wire.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define RESULTS_MAX_BYTES (UINT64_C(1) << 36) /* 64 GiB of results: far beyond any job */

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

/* The id of one whole line into done. */
static int line_id(const char *path, uint64_t line, const char *p, size_t n, kvp_idset *done, kvp_err *err)
{
    kvp_json *v = NULL;
    int rc = kvp_json_parse_line(&v, p, n, path, line, err);
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

int kvp_results_scan(const char *path, kvp_idset *done, uint64_t *whole, kvp_err *err)
{
    *whole = 0;
    struct stat st;
    if (stat(path, &st) != 0 && errno == ENOENT)
        return 0; /* nothing written yet */
    uint8_t *data = NULL;
    size_t len = 0;
    int rc = kvp_read_file(path, RESULTS_MAX_BYTES, &data, &len, err);
    if (rc < 0)
        return rc;
    const char *p = (const char *)data;
    const char *nul = memchr(p, 0, len);
    if (nul) { /* a KV stream, a model: no line of it is a result */
        size_t at = (size_t)(nul - p);
        free(data);
        return kvp_err_set(err, KVP_EFORMAT, "%s: byte %zu is NUL: a binary file, not results (JSON Lines)", path, at);
    }
    size_t start = 0;
    uint64_t line = 0;
    for (size_t i = 0; i < len && rc == 0; i++) {
        if (p[i] != '\n')
            continue;
        line++;
        size_t b = start;
        while (b < i && (p[b] == ' ' || p[b] == '\t' || p[b] == '\r'))
            b++;
        if (b < i)
            rc = line_id(path, line, p + start, i - start, done, err);
        start = i + 1;
        if (rc == 0)
            *whole = start;
    }
    free(data);
    return rc;
}
