/* config_rt.h - a config read from any file must survive being written to a
 * KVP CONFIG record and read back (quantize writes it, prefill and decode
 * read it): shared by the harnesses that produce configs.  Aborts on a
 * difference, which libFuzzer reports as a crash. */
#ifndef KVP_FUZZ_CONFIG_RT_H
#define KVP_FUZZ_CONFIG_RT_H

#include "config.h"
#include "meta.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
        back.kv_lora_rank != c->kv_lora_rank || back.tied_embeddings != c->tied_embeddings ||
        back.attn_bias != c->attn_bias || strcmp(back.arch, c->arch)) {
        fprintf(stderr, "round trip: config differs (rope_dim %u/%u, head_dim %u/%u)\n", c->rope_dim, back.rope_dim,
                c->head_dim, back.head_dim);
        abort();
    }
    kvp_meta_free(&m);
}

#endif
