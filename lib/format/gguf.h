/* gguf.h - a validating reader for GGUF v2/v3 model files (llama.cpp's format).
 *
 * kvp_gguf_open maps the file and checks everything before returning: the
 * header counts, every metadata key and value (all types, arrays of any
 * width), general.alignment, and every tensor's name (unique), dims (1..4,
 * no overflow), type and offset + size against the file size.  After a
 * successful open, any tensor's bytes can be used in place without further
 * checks.  Tensors of GGUF types we cannot convert are still listed, with
 * dtype -1, so callers decide (and name the tensor in their error).
 *
 * Layout facts: ../shared/FACTS.md ("GGUF v3").
 */
#ifndef KVP_GGUF_H
#define KVP_GGUF_H

#include "error.h"
#include "io.h"
#include "meta.h"

#include <stdint.h>

/* GGUF type ids (ggml_type), the ones we name. */
enum kvp_gguf_type {
    KVP_GGUF_TYPE_F32 = 0,
    KVP_GGUF_TYPE_F16 = 1,
    KVP_GGUF_TYPE_Q4_0 = 2,
    KVP_GGUF_TYPE_Q4_1 = 3,
    KVP_GGUF_TYPE_Q5_0 = 6,
    KVP_GGUF_TYPE_Q5_1 = 7,
    KVP_GGUF_TYPE_Q8_0 = 8,
    KVP_GGUF_TYPE_Q8_1 = 9,
    KVP_GGUF_TYPE_Q2_K = 10,
    KVP_GGUF_TYPE_Q3_K = 11,
    KVP_GGUF_TYPE_Q4_K = 12,
    KVP_GGUF_TYPE_Q5_K = 13,
    KVP_GGUF_TYPE_Q6_K = 14,
    KVP_GGUF_TYPE_Q8_K = 15,
    KVP_GGUF_TYPE_I8 = 24,
    KVP_GGUF_TYPE_I16 = 25,
    KVP_GGUF_TYPE_I32 = 26,
    KVP_GGUF_TYPE_I64 = 27,
    KVP_GGUF_TYPE_F64 = 28,
    KVP_GGUF_TYPE_BF16 = 30,
};

/* Limits on untrusted input (each named in the error when exceeded). */
#define KVP_GGUF_MAX_TENSORS (1u << 20)   /* tensor infos */
#define KVP_GGUF_MAX_KV (1u << 20)        /* metadata entries */
#define KVP_GGUF_MAX_NAME 4096u           /* key / tensor name bytes */
#define KVP_GGUF_MAX_STR (1u << 30)       /* one string value */
#define KVP_GGUF_MAX_ARR (1ull << 32)     /* elements in one array */

typedef struct kvp_gguf_tensor {
    char *name;            /* NUL-terminated */
    uint32_t ggml_type;    /* GGUF type id (0 F32, 1 F16, 2 Q4_0, 3 Q4_1, 6 Q5_0, 7 Q5_1, 8 Q8_0, 12 Q4_K, 14 Q6_K, 30 BF16, ...) */
    int dtype;             /* the kvp_dtype it maps to, or -1 if unsupported */
    uint32_t n_dims;       /* 1..4 */
    uint64_t ne[4];        /* GGUF order: ne[0] is the contiguous dimension; unused dims = 1 */
    uint64_t offset;       /* absolute byte offset in the file */
    uint64_t nbytes;       /* validated against the file size */
    uint64_t info_offset;  /* where its tensor info starts in the file (messages) */
} kvp_gguf_tensor;

typedef struct kvp_gguf {
    kvp_in in;             /* lib/io.h; mapped */
    const uint8_t *base;   /* the mapped file */
    uint64_t size;
    uint32_t version;
    kvp_meta meta;         /* all metadata (lib/meta.h): GGUF ints -> U64/I64 by signedness, floats -> F64, bool -> BOOL, string -> STR, arrays -> ARR_STR / ARR_I32 (u8..i32 ints) / ARR_I64 (64-bit ints) / ARR_F32 / ARR_F64 / ARR_U8 (bool) */
    uint64_t n_tensors;
    kvp_gguf_tensor *tensors;
    uint32_t alignment;
    uint64_t data_offset;
    uint8_t *owned;        /* file bytes read into memory when it could not be mapped (a pipe), else NULL */
} kvp_gguf;

/* Open and fully validate path ("-" reads stdin into memory).  0 or a
 * negative code with a message "path: field ...: what".  On failure g is
 * left closed (kvp_gguf_close is harmless on it). */
int kvp_gguf_open(kvp_gguf *g, const char *path, kvp_err *err);
/* The same on an input already open (its magic perhaps peeked by
 * kvp_in_kind): g takes *in, closed with g, or at once on failure. */
int kvp_gguf_open_in(kvp_gguf *g, kvp_in *in, kvp_err *err);
/* Same, over bytes already in memory (not copied: they must outlive g).
 * name is used in messages. */
int kvp_gguf_open_mem(kvp_gguf *g, const void *data, uint64_t size, const char *name, kvp_err *err);
void kvp_gguf_close(kvp_gguf *g);
/* The tensor called name, or NULL. */
const kvp_gguf_tensor *kvp_gguf_find(const kvp_gguf *g, const char *name);
/* Pointer to the tensor's nbytes bytes (inside the mapping). */
const void *kvp_gguf_tensor_data(const kvp_gguf *g, const kvp_gguf_tensor *t);
/* Element count of a tensor (product of ne; fits: validated at open). */
uint64_t kvp_gguf_tensor_nelems(const kvp_gguf_tensor *t);
/* Name of a GGUF type id ("q4_1"), "?" when unknown. */
const char *kvp_gguf_type_name(uint32_t ggml_type);
/* The kvp_dtype for a GGUF type id, or -1 when we have none. */
int kvp_gguf_type_to_dtype(uint32_t ggml_type);
/* Block size (elements) and bytes per block of a GGUF type; 0 when unknown. */
int kvp_gguf_type_size(uint32_t ggml_type, uint32_t *block_elems, uint32_t *block_bytes);

#endif
