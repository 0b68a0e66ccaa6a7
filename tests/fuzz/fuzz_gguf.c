/* fuzz_gguf.c - libFuzzer harness: the GGUF reader (header, every metadata
 * type, tensor infos, offsets) on arbitrary bytes, then, when the file opens,
 * what a model loader does next: the model config from its metadata (and its
 * round trip through a KVP CONFIG record), and every tensor's bytes, which
 * the reader promises are inside the file. */
#include "config.h"
#include "gguf.h"
#include "meta.h"

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

/* A config read from a file must survive being written to a KVP CONFIG
 * record and read back (quantize writes it, prefill and decode read it). */
static void config_round_trip(const kvp_config *c)
{
    kvp_meta m;
    kvp_meta_init(&m);
    kvp_err err = {0};
    kvp_config back;
    if (kvp_config_to_meta(c, &m) != 0)
        abort();
    if (kvp_config_from_meta(&back, &m, "<round trip>", &err) != 0) {
        fprintf(stderr, "round trip: %s\n", err.msg);
        abort();
    }
    if (back.n_layer != c->n_layer || back.n_embd != c->n_embd || back.n_head != c->n_head ||
        back.n_head_kv != c->n_head_kv || back.head_dim != c->head_dim || back.rope_dim != c->rope_dim ||
        back.n_vocab != c->n_vocab || back.n_ctx != c->n_ctx || back.rope_type != c->rope_type ||
        back.rope_scaling != c->rope_scaling || back.sliding_window != c->sliding_window ||
        back.n_expert != c->n_expert || back.n_expert_used != c->n_expert_used ||
        back.kv_lora_rank != c->kv_lora_rank || back.attn_bias != c->attn_bias || strcmp(back.arch, c->arch)) {
        fprintf(stderr, "round trip: config differs (rope_dim %u/%u, head_dim %u/%u)\n", c->rope_dim, back.rope_dim,
                c->head_dim, back.head_dim);
        abort();
    }
    kvp_meta_free(&m);
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
