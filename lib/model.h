/* model.h - a Llama-family model: its config and its weights, used in place.
 *
 * kvp_model_load maps a GGUF file (lib/gguf.h) and carves it into weight
 * descriptors (kvp_weight, lib/backend.h) that point into the mapping: no
 * weight is copied or dequantized.  Shapes below are in GGUF order
 * [n_in, n_out] (n_in contiguous), with d = n_embd, hd = head_dim.
 *
 * The fingerprint names the model for KV streams (lib/fingerprint.h: XXH64
 * over the config and every tensor's name, dtype and shape), so KV made by
 * another model, quantization or layout is refused (not: a model with the
 * same tensors but retrained weights).
 */
#ifndef KVP_MODEL_H
#define KVP_MODEL_H

#include "backend.h"
#include "config.h"
#include "error.h"
#include "gguf.h"
#include "stream.h"

#include <stdint.h>

typedef struct kvp_layer {
    kvp_weight attn_norm;   /* [d] f32 */
    kvp_weight wq;          /* [d, n_head * hd] */
    kvp_weight wk, wv;      /* [d, n_head_kv * hd] */
    kvp_weight bq, bk, bv;  /* qwen2 biases [n_out] f32; dtype -1 when absent */
    kvp_weight wo;          /* [n_head * hd, d] */
    kvp_weight ffn_norm;    /* [d] f32 */
    kvp_weight w_gate, w_up;/* [d, n_ff] */
    kvp_weight w_down;      /* [n_ff, d] */
} kvp_layer;

typedef struct kvp_model {
    kvp_config cfg;
    kvp_gguf gguf;          /* the mapped file the weights point into */
    char *path;
    kvp_weight tok_embd;    /* [d, n_vocab] */
    kvp_weight output_norm; /* [d] */
    kvp_weight output;      /* [d, n_vocab]; == tok_embd when tied */
    kvp_layer *layers;      /* [n_layer] */
    float *inv_freq;        /* [rope_dim / 2] RoPE frequencies, scaling applied */
    uint8_t fingerprint[KVP_FINGERPRINT_SIZE];
    uint64_t weight_bytes;  /* sum of all tensor sizes */
} kvp_model;

/* Load path (GGUF).  0 or a code; messages name the file and tensor:
 * "m.gguf: tensor blk.3.attn_q.weight: shape [576, 512], expected [576, 576]". */
int kvp_model_load(kvp_model **m, const char *path, kvp_err *err);
void kvp_model_free(kvp_model *m);
/* 32 lowercase hex digits of the fingerprint into buf[33]. */
void kvp_model_fingerprint_hex(const kvp_model *m, char buf[33]);

#endif
