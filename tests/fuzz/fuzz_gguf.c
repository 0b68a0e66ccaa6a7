/* fuzz_gguf.c - libFuzzer harness: the GGUF reader (header, every metadata
 * type, tensor infos, offsets) on arbitrary bytes, then, when the file opens,
 * what a model loader does next: the model config from its metadata (and its
 * round trip through a KVP CONFIG record), and every tensor's bytes, which
 * the reader promises are inside the file. */
#include "config.h"
#include "gguf.h"
#include "meta.h"

#include "config_rt.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Touch the first and last byte of n bytes at p (ASan checks the bounds). */
static void touch(const void *p, uint64_t n)
{
    if (n) {
        (void)*(volatile const uint8_t *)p;
        (void)*(volatile const uint8_t *)((const uint8_t *)p + n - 1);
    }
}

/* Walk every metadata entry through the typed getters and accessors. */
static void walk_meta(const kvp_meta *m)
{
    for (size_t i = 0; i < m->n; i++) {
        const kvp_meta_entry *e = &m->e[i];
        uint64_t u;
        int64_t s;
        double f;
        kvp_meta_get_u64(m, e->key, &u);
        kvp_meta_get_i64(m, e->key, &s);
        kvp_meta_get_f64(m, e->key, &f);
        kvp_meta_get_str(m, e->key);
        (void)kvp_meta_type_name(e->type);
        if (e->type == KVP_META_ARR_STR && e->n) {
            size_t len;
            const char *p = kvp_meta_str_at(e, e->n - 1, &len);
            if (!p || p[len] != '\0')
                abort(); /* every string is NUL-terminated */
        } else if (e->type == KVP_META_STR) {
            if (e->str[e->n] != '\0')
                abort();
        } else if (kvp_meta_elem_size(e->type) && e->n) {
            touch(e->arr, e->n * kvp_meta_elem_size(e->type));
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvp_gguf g;
    kvp_err err = {0};
    if (kvp_gguf_open_mem(&g, data, size, "<fuzz>", &err) != 0) {
        if (err.code >= 0 || !err.msg[0])
            abort(); /* a failure always carries a code and a message */
        return 0;
    }
    walk_meta(&g.meta);
    for (uint64_t i = 0; i < g.n_tensors; i++) {
        const kvp_gguf_tensor *t = &g.tensors[i];
        if (kvp_gguf_find(&g, t->name) != t)
            abort(); /* names are unique */
        touch(kvp_gguf_tensor_data(&g, t), t->nbytes);
        (void)kvp_gguf_tensor_nelems(t);
        (void)kvp_gguf_type_name(t->ggml_type);
    }
    kvp_config c;
    if (kvp_config_from_meta(&c, &g.meta, "<fuzz>", &err) == 0) {
        (void)kvp_config_kv_elems_per_token_layer(&c);
        config_round_trip(&c);
    }
    kvp_gguf_close(&g);
    return 0;
}
