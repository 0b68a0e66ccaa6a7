/* safetensors.h - a validating reader for HF safetensors checkpoints: one
 * file, or shards listed by model.safetensors.index.json.
 *
 * A file is: u64 header length N, N bytes of JSON
 *   {"__metadata__": {"k": "v", ...},
 *    "name": {"dtype": "BF16", "shape": [out, in], "data_offsets": [begin, end]}, ...}
 * then the data; offsets are relative to the byte after the header.  Shapes
 * are outermost first (row-major: an HF linear weight is [out, in]).
 *
 * kvp_safetensors_open checks everything before returning: header length,
 * JSON (lib/json), each dtype, shape (no overflow), offsets inside the data
 * and consistent with dtype x shape, no two tensors overlapping, names
 * unique across shards, every index entry present in its shard.  Tensors of
 * dtypes without a kvp_dtype (I16, I64, BOOL, ...) are listed with dtype -1.
 * Data pointers point into the mapping and need not be aligned.
 */
#ifndef KVP_SAFETENSORS_H
#define KVP_SAFETENSORS_H

#include "error.h"
#include "io.h"
#include "meta.h"

#include <stdint.h>

#define KVP_SAFETENSORS_MAX_DIMS 8
#define KVP_SAFETENSORS_MAX_HEADER (100u << 20) /* bytes of header JSON (the reference library's limit) */
#define KVP_SAFETENSORS_MAX_SHARDS 4096u

typedef struct kvp_safetensors_tensor {
    char *name;                /* NUL-terminated */
    char dtype_name[12];       /* as written: "F32", "BF16", "F8_E4M3", ... */
    int dtype;                 /* kvp_dtype, or -1 when we have none */
    uint32_t n_dims;           /* 0 (scalar) .. KVP_SAFETENSORS_MAX_DIMS */
    uint64_t shape[KVP_SAFETENSORS_MAX_DIMS]; /* outermost first; unused = 1 */
    uint64_t nbytes;
    uint32_t shard;            /* index into files[] */
    uint64_t offset;           /* absolute byte offset in its shard file */
    const void *data;          /* nbytes inside the mapping (maybe unaligned) */
} kvp_safetensors_tensor;

typedef struct kvp_safetensors_file {
    kvp_in in;                 /* mapped */
    char *path;
    const uint8_t *base;
    uint64_t size;
    uint64_t data_offset;      /* 8 + header length */
} kvp_safetensors_file;

typedef struct kvp_safetensors {
    char *dir;                 /* folder of the files (config.json lives here for HF) */
    uint32_t n_files;
    kvp_safetensors_file *files;
    uint64_t n_tensors;
    kvp_safetensors_tensor *tensors; /* file order, then header order */
    size_t *sorted;            /* tensor indices by name (lookups) */
    kvp_meta meta;             /* "__metadata__" of the first file, strings (STR) */
} kvp_safetensors;

/* A model path whose first bytes were peeked through in and matched
 * neither GGUF nor KVP (a folder, or a safetensors file): in closed, and
 * the path refused when it came through a pipe, whose bytes safetensors
 * cannot take (it maps its files by name). */
int kvp_safetensors_release_peeked(kvp_in *in, const char *path, kvp_err *err);

/* Open path: a .safetensors file, a model.safetensors.index.json, or a folder
 * holding model.safetensors.index.json or model.safetensors.  0 or a negative
 * code with a message naming the file and the field ("x.safetensors: tensor
 * \"w\": data_offsets: ...").  On failure st is closed. */
int kvp_safetensors_open(kvp_safetensors *st, const char *path, kvp_err *err);
/* One file's bytes already in memory (not copied; must outlive st). */
int kvp_safetensors_open_mem(kvp_safetensors *st, const void *data, uint64_t size, const char *name, kvp_err *err);
void kvp_safetensors_close(kvp_safetensors *st);
/* The tensor called name, or NULL (O(log n)). */
const kvp_safetensors_tensor *kvp_safetensors_find(const kvp_safetensors *st, const char *name);
/* Element count (product of the shape; 1 for a scalar). */
uint64_t kvp_safetensors_nelems(const kvp_safetensors_tensor *t);
/* Bytes per element of a safetensors dtype name, 0 when unknown; *dtype gets
 * the kvp_dtype or -1. */
uint32_t kvp_safetensors_dtype_size(const char *name, int *dtype);

#endif
