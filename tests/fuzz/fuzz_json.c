/* fuzz_json.c - libFuzzer harness: the strict JSON parser on arbitrary
 * bytes, then a walk of the whole tree through the lookup functions (every
 * key found again by name, every integer conversion). */
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvp_json *root;
    kvp_err err = {0};
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
