/* model.h - a Llama-family model: its config and its weights, used in place.
 *
 * kvp_model_load opens one of three kinds of model and carves it into weight
 * descriptors (kvp_weight, lib/backend.h) that point into the mapping:
 *   GGUF           (lib/gguf.h): GGUF tensor names, Q/K rows permuted for
 *                  adjacent-pair RoPE (config decides, FACTS.md);
 *   KVP model file (what quantize writes, lib/convert.h): CONFIG, TOKENIZER
 *                  and TENSOR records, with GGUF names or HF names after the
 *                  file it came from; scaled schemes (fp8/i8/i4 with tensor,
 *                  channel or group scales) keep their bytes, their scales
 *                  are widened to f32 (a few floats per row);
 *   HF folder      (or a .safetensors file / index beside config.json and
 *                  tokenizer.json): HF names, unpermuted weights, NEOX RoPE;
 *                  a quantized one (GPTQ, AWQ, compressed-tensors: its
 *                  config.json's quantization_config) through lib/model/
 *                  hfquant.h, each linear layer's parts one scaled tensor.
 * No weight is dequantized, except a GPTQ-style g_idx order no group scheme
 * holds (hfquant.h).  Copies are made only where the bytes cannot be used
 * where they lie: zstd-compressed KVP records (decompressed into owned
 * memory), a KVP model read from a pipe, safetensors data not aligned for
 * its element type, and quantized layouts rewritten as kvp rows.
 *
 * Shapes below are [n_in, n_out] (n_in contiguous), d = n_embd, hd =
 * head_dim; in the tensor table shapes are outermost first, as in KVP.
 *
 * The fingerprint names the model for KV streams (lib/fingerprint.h: XXH64
 * over the config and every tensor's name, dtype, shape and scale layout, in
 * file order), the same definition for all three kinds, so KV made by another
 * model, quantization or layout is refused (not: a model with the same
 * tensors but retrained weights).
 */
#ifndef KVP_MODEL_H
#define KVP_MODEL_H

#include "backend.h"
#include "config.h"
#include "error.h"
#include "gguf.h"
#include "hfquant.h"
#include "io.h"
#include "owned.h"
#include "safetensors.h"
#include "stream.h"
#include "tokenizer.h"

#include <stddef.h>
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

enum kvp_model_format {
    KVP_MODEL_GGUF = 1,
    KVP_MODEL_KVP = 2,
    KVP_MODEL_HF = 3,      /* safetensors + config.json + tokenizer.json */
};

/* One tensor of the file as a KVP tensor record would describe it, and where
 * its sections are (in the mapping, or owned by the model). */
typedef struct kvp_model_tensor {
    kvp_tensor_rec rec;     /* dtype 0xffffffff: a type we cannot read */
    const void *data, *scales, *zeros;
    const char *src_type;   /* such a type's name in its file (GGUF's "q3_k"), or NULL */
} kvp_model_tensor;

typedef struct kvp_model {
    kvp_config cfg;
    int format;             /* kvp_model_format */
    char *path;
    kvp_gguf gguf;          /* GGUF: the mapped file */
    kvp_in in;              /* KVP: the mapped (or read) stream */
    kvp_safetensors st;     /* HF: the mapped shards */
    kvp_hfq_set hfq;        /* HF: the quantized layers' weights (empty when none) */
    char quant_note[640];   /* HF: what quantization_config held and what was done, or "" */
    kvp_meta tok_meta;      /* KVP: the TOKENIZER record's keys */
    int open_gguf, open_in, open_st, has_tok_meta;
    kvp_model_tensor *tensors; /* [n_tensors], file order */
    size_t n_tensors;
    kvp_owned owned;        /* copies and widened scales, freed with the model */
    kvp_weight tok_embd;    /* [d, n_vocab] */
    kvp_weight output_norm; /* [d] */
    kvp_weight output;      /* [d, n_vocab]; == tok_embd when tied */
    kvp_layer *layers;      /* [n_layer] */
    float *inv_freq;        /* [rope_dim / 2] RoPE frequencies, scaling applied */
    uint8_t fingerprint[KVP_FINGERPRINT_SIZE];
    uint64_t weight_bytes;  /* sum of all tensor sizes (data, scales, zeros) */
    uint64_t copied_bytes;  /* of which copied out of the file (see above) */
    const struct kvp_model *base; /* a tensor-parallel shard (shard.h): the whole model it views, else NULL */
    int check_only;         /* kvp_model_check_tensors: records without data, nothing is read or copied */
} kvp_model;

/* Load path: a .gguf, a KVP model file, an HF folder, a .safetensors file or
 * a model.safetensors.index.json (the kind is told by the first bytes).  0
 * or a code; messages name the file and tensor:
 * "m.gguf: tensor blk.3.attn_q.weight: shape [576, 512], expected [576, 576]". */
int kvp_model_load(kvp_model **m, const char *path, kvp_err *err);
/* Its metadata and tokenizer only, for tokenizing: no tensor is read or
 * needed (llama.cpp's vocabulary-only GGUF files load too).  *m serves
 * kvp_model_tok_meta and kvp_model_free, nothing that needs weights. */
int kvp_model_load_vocab(kvp_model **m, kvp_tokenizer **tok, const char *path, kvp_err *err);
void kvp_model_free(kvp_model *m);
/* What a model file must satisfy whatever reads it: the one validation that
 * kvp_model_load runs and quantize (lib/convert.h) runs before writing, so
 * that quantize never writes a model the loader would refuse, and refuses
 * it with the loader's message.  c: kvp_config_check (NULL: a tensor file
 * with no config); tok: the file's metadata holding its tokenizer.* keys,
 * checked by kvp_tokenizer_check_meta when it has any tokenizer.ggml.* key
 * (NULL or none: no tokenizer to check).  What the engine cannot run but is
 * well formed (another architecture, tokenizer algorithm or pre-tokenizer)
 * passes: kvp_model_load and kvp_model_load_tokenizer refuse that
 * themselves.  0 or a negative code, the message naming source. */
int kvp_model_check(const kvp_config *c, const kvp_meta *tok, const char *source, kvp_err *err);
/* The loader's tensor checks on records alone (no data): for a config the
 * engine runs, every weight it binds present (by its GGUF or HF name), of
 * the shape the config implies, of a type and scale layout it reads, and
 * norms and biases in f32, f16 or bf16 -- the very functions kvp_model_load
 * binds with, so quantize refuses with decode's message a model whose
 * tensors contradict its config (31 layers declared, 30 present).  c passed
 * kvp_model_check.  format (kvp_model_format) is the kind of file the
 * records came from, which decides the name a missing weight is called by.
 * A config the engine does not run (another architecture, experts, latent
 * attention) passes: its tensor layout is not the engine's to judge.  0 or
 * a negative code, the message naming source and the tensor. */
int kvp_model_check_tensors(const kvp_config *c, const kvp_tensor_rec *recs, size_t n, int format,
                            const char *source, kvp_err *err);
/* The model's tokenizer: GGUF metadata, the KVP TOKENIZER record, or the
 * folder's tokenizer.json.  0 or a code naming the file. */
int kvp_model_load_tokenizer(const kvp_model *m, kvp_tokenizer **t, kvp_err *err);
/* 32 lowercase hex digits of the fingerprint into buf[33]. */
void kvp_model_fingerprint_hex(const kvp_model *m, char buf[33]);
/* 64-byte aligned, zeroed memory freed with m (NULL when out of memory). */
void *kvp_model_own(kvp_model *m, uint64_t bytes);
/* Whether [p, p + n) lies in m's file as mapped (GGUF, or KVP read from a
 * file): pages there can be given back (madvise) and read again from the
 * file, unlike copies and bytes read from a pipe. */
int kvp_model_file_backed(const kvp_model *m, const void *p, uint64_t n);
/* Drop the resident pages of m's mapped file (GGUF, or KVP read from a
 * file; nothing for other kinds): they are read again from the file where
 * used.  A tensor-parallel rank calls it once its shard is made, since
 * loading read the whole file (a KVP file's checksums) and the rank uses
 * a slice of it. */
void kvp_model_give_back(const kvp_model *m);
/* "gguf", "kvp" or "hf". */
const char *kvp_model_format_name(const kvp_model *m);
/* The tokenizer's keys (GGUF's metadata, a KVP file's TOKENIZER record),
 * chat template included; NULL for an HF folder or a file without them. */
const kvp_meta *kvp_model_tok_meta(const kvp_model *m);

#endif
