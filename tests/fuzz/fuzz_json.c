/* fuzz_json.c - libFuzzer harness: the strict JSON parser on arbitrary
 * bytes, then a walk of the whole tree through the lookup functions (every
 * key found again by name, every integer conversion); the parse for one
 * member against the whole one. */
#include "json.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void walk(const kvp_json *v, int depth)
{
    if (depth > KVP_JSON_MAX_DEPTH + 1)
        abort(); /* the parser bounds nesting */
    uint64_t u;
    int64_t s;
    kvp_json_to_u64(v, &u);
    kvp_json_to_i64(v, &s);
    (void)kvp_json_type_name(v->type);
    switch (v->type) {
    case KVP_JSON_STRING:
        if (v->str[v->len] != '\0')
            abort();
        break;
    case KVP_JSON_ARRAY:
        for (size_t i = 0; i < v->n; i++) {
            if (kvp_json_at(v, i) != &v->items[i])
                abort();
            walk(&v->items[i], depth + 1);
        }
        if (kvp_json_at(v, v->n))
            abort();
        break;
    case KVP_JSON_OBJECT:
        for (size_t i = 0; i < v->n; i++) {
            /* keys holding a NUL cannot be looked up by a C string */
            if (strlen(v->keys[i]) == v->key_lens[i] && kvp_json_get(v, v->keys[i]) != &v->items[i])
                abort(); /* keys are unique, so lookup finds this one */
            double f;
            int b;
            kvp_json_get_u64(v, v->keys[i], &u);
            kvp_json_get_i64(v, v->keys[i], &s);
            kvp_json_get_f64(v, v->keys[i], &f);
            kvp_json_get_bool(v, v->keys[i], &b);
            kvp_json_get_str(v, v->keys[i]);
            walk(&v->items[i], depth + 1);
        }
        kvp_json_get(v, "");
        kvp_json_get(v, "\x7f\x7f");
        break;
    default: break;
    }
}

/* The line parsed for its "id" alone is checked as strictly: the same
 * verdict and message as the whole parse, the same id, the rest null. */
static void same_member(const uint8_t *data, size_t size)
{
    kvp_json *a = NULL, *b = NULL;
    kvp_err ea = {0}, eb = {0};
    int ra = kvp_json_parse_line(&a, (const char *)data, size, "<fuzz>", 1, &ea);
    int rb = kvp_json_parse_line_member(&b, (const char *)data, size, "<fuzz>", 1, "id", &eb);
    if (ra != rb || (ra < 0 && strcmp(ea.msg, eb.msg) != 0) || (ra == 0) != (b != NULL))
        abort();
    if (ra == 0) {
        const kvp_json *ia = kvp_json_get(a, "id"), *ib = kvp_json_get(b, "id");
        if ((ia == NULL) != (ib == NULL) || a->type != b->type || a->n != b->n)
            abort();
        if (ia && (ia->type != ib->type || ia->len != ib->len || (ia->str && memcmp(ia->str, ib->str, ia->len)) ||
                   (ia->type == KVP_JSON_NUMBER && ia->num != ib->num)))
            abort();
        for (size_t k = 0; b->type == KVP_JSON_OBJECT && k < b->n; k++)
            if (&b->items[k] != ib && b->items[k].type != KVP_JSON_NULL)
                abort();
    }
    kvp_json_free(a);
    kvp_json_free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvp_json *root;
    kvp_err err = {0};
    same_member(data, size);
    if (kvp_json_parse(&root, (const char *)data, size, "<fuzz>", &err) != 0) {
        if (err.code >= 0 || !err.msg[0] || root)
            abort();
        return 0;
    }
    walk(root, 0);
    int line, col;
    kvp_json_linecol((const char *)data, size, size, &line, &col);
    kvp_json_free(root);
    return 0;
}
