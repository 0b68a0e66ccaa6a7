/* fuzz_hfconfig.c - libFuzzer harness: an HF config.json (arbitrary bytes)
 * to a model config, through kvp_json_parse and kvp_config_from_hf_json.  A
 * config that is accepted must survive the trip through a KVP CONFIG record
 * (quantize writes one from config.json; prefill and decode read it back). */
#include "config.h"
#include "json.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void round_trip(const kvp_config *c)
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
        back.kv_lora_rank != c->kv_lora_rank || back.tied_embeddings != c->tied_embeddings ||
        back.attn_bias != c->attn_bias || strcmp(back.arch, c->arch)) {
        fprintf(stderr, "round trip: config differs (rope_dim %u/%u, head_dim %u/%u)\n", c->rope_dim, back.rope_dim,
                c->head_dim, back.head_dim);
        abort();
    }
    kvp_meta_free(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvp_json *j;
    kvp_err err = {0};
    if (kvp_json_parse(&j, (const char *)data, size, "<fuzz>", &err) != 0)
        return 0;
    kvp_config c;
    int rc = kvp_config_from_hf_json(&c, j, "<fuzz>", &err);
    if (rc == 0) {
        (void)kvp_config_kv_elems_per_token_layer(&c);
        round_trip(&c);
    } else if (rc > 0 || !err.msg[0]) {
        abort();
    }
    kvp_json_free(j);
    return 0;
}
