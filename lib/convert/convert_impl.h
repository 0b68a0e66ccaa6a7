/* convert_impl.h - what convert.c (open, plan) shares with convert_write.c;
 * not part of the public API. */
#ifndef KVP_CONVERT_IMPL_H
#define KVP_CONVERT_IMPL_H

#include "convert.h"
#include "gguf.h"
#include "meta.h"
#include "model.h"
#include "safetensors.h"

struct kvp_convert {
    int format;                /* kvp_convert_format */
    char *path;
    kvp_gguf gguf;             /* GGUF input (mapped) */
    kvp_safetensors st;        /* safetensors input (mapped) */
    int gguf_open, st_open;
    int bare;                  /* tensors only: no config (so no CONFIG record, zero fingerprint) */
    kvp_config cfg;            /* all zero when bare */
    kvp_meta config_meta;      /* the CONFIG record to write */
    kvp_meta tok_meta;         /* the TOKENIZER record (none when empty) */
    kvp_convert_item *items;   /* one per input tensor, input order */
    size_t n_items;
    uint64_t *src_index;       /* GGUF / safetensors tensor index of each item */
    kvp_hfq_set hfq;           /* safetensors: the quantized layers' weights (hfquant.h), empty when none */
    int32_t *src_hfq;          /* safetensors: the hfq tensor of each item, or -1 */
    uint32_t *src_ndim;        /* the input's own dimension count (may exceed 4) */
    char **notes;
    size_t n_notes;
    /* by kvp_convert_patterns: the tensors each pattern of that list
     * matched in the last plan, n_pattern_hits of them (0 until a plan
     * succeeds) */
    uint64_t *pattern_hits[KVP_CONVERT_PATTERNS_COUNT];
    size_t n_pattern_hits[KVP_CONVERT_PATTERNS_COUNT];
    int planned;
};

/* Bytes of a tensor record's data part sections: data, scales, zeros. */
static inline uint64_t kvp_convert_rec_bytes(const kvp_tensor_rec *t)
{
    return t->data_bytes + t->scales_bytes + t->zeros_bytes;
}

/* err's message with "path: " in front unless it starts so (the stream
 * reader's messages name the record, not the file); err->code. */
int kvp_convert_name_file(const char *path, kvp_err *err);

#endif
