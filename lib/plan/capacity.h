/* capacity.h - kvcalc's memory model: weights, KV cache and activations per
 * GPU, paged-block capacity, tensor/pipeline-parallel splits, a decode
 * roofline, and a fragmentation simulator.
 *
 * All byte counts are exact integers for the formats described (no "GB"
 * rounding).  The model (what is counted, where each tensor lives under TP/PP,
 * and the allowance for context and activations) is documented in kvcalc(1)
 * "MEMORY MODEL"; keep the two in step.
 */
#ifndef KVP_CAPACITY_H
#define KVP_CAPACITY_H

#include "config.h"
#include "error.h"

#include <stddef.h>
#include <stdint.h>

/* ---- storage formats ---- */

enum kvp_cap_scale {
    KVP_CAP_SCALE_NONE = 0,   /* plain type, or scales inside each block (GGUF, NVFP4) */
    KVP_CAP_SCALE_TENSOR = 1, /* one scale per tensor */
    KVP_CAP_SCALE_ROW = 2,    /* one scale per output row */
    KVP_CAP_SCALE_GROUP = 3,  /* one scale per `group` elements along a row */
    KVP_CAP_SCALE_BLOCK = 4,  /* KV only: one scale per head per KV block (kvp(5) KV_BLOCK) */
    KVP_CAP_SCALE_TOKEN = 5,  /* KV only: one scale per head per token (decode's fp8/int8 cache) */
};

/* How a tensor (weights) or a KV vector is stored: rows are cut into blocks
 * of block_elems elements of block_bytes bytes each, plus separate scales. */
typedef struct kvp_cap_fmt {
    char name[24];
    uint32_t block_elems;  /* elements per block along a row (1 for scalars, 2 for packed 4-bit) */
    uint32_t block_bytes;
    uint32_t scale;        /* kvp_cap_scale */
    uint32_t scale_bytes;  /* bytes per separate scale */
    uint32_t group;        /* elements per scale for KVP_CAP_SCALE_GROUP */
} kvp_cap_fmt;

/* Weight formats: f32 f16 bf16 fp8 fp8-e5m2 (f32 tensor scale), int8 (f32
 * scale per row), int4 / int4-gN (group N, default 128, f16 scales), nvfp4,
 * mxfp4, and the GGUF types q4_0 q4_1 q5_0 q5_1 q8_0 q2_k q3_k q4_k q5_k q6_k.
 * Returns 0 or KVP_EINVAL with a message listing the choices. */
int kvp_cap_weight_fmt(const char *name, kvp_cap_fmt *f, kvp_err *err);
/* KV formats: f32 f16 bf16, fp8 (E4M3) and int8 (an f32 scale per head per
 * token, as decode's cache holds them); for other engines' caches, which
 * decode has none of, int4 (an f32 scale per head per block), fp8-e5m2 (a
 * per-layer scale, not counted), fp4 (NVFP4 blocks). */
int kvp_cap_kv_fmt(const char *name, kvp_cap_fmt *f, kvp_err *err);
/* Bytes of a rows x cols tensor in format f (scales included). */
uint64_t kvp_cap_fmt_bytes(const kvp_cap_fmt *f, uint64_t rows, uint64_t cols);
/* Whether f keeps full 16/32-bit floats (then small tensors use f too). */
int kvp_cap_fmt_is_float(const kvp_cap_fmt *f);

/* A model's weights by where they go and how they split: the layers'
 * matrices (a stage holds its own, tensor parallelism splits them), the
 * token embeddings (the first stage), the output head (the last; a tied
 * model's copy of the table is the embeddings'), vectors (norms, which
 * every rank keeps whole, and attention biases, split with their heads),
 * the rest (matrices no layer names). */
enum { KVP_CAP_W_LAYERS, KVP_CAP_W_EMBD, KVP_CAP_W_OUT, KVP_CAP_W_VECTORS, KVP_CAP_W_REST, KVP_CAP_W_CLASSES };

/* ---- the calculation ---- */

#define KVP_CAP_MAX_SEQ_LEN (1ull << 32) /* the longest seq_len planned, and max_context searched */

typedef struct kvp_cap_params {
    kvp_config cfg;               /* the model */
    uint32_t q_lora_rank;         /* MLA query low rank (0: direct q projection) */
    double n_params;              /* > 0: override the parameter count (weights scale with it) */
    kvp_cap_fmt weight_fmt;       /* attention, FFN and expert matrices */
    kvp_cap_fmt embed_fmt;        /* token embeddings, lm_head, norms, biases, router */
    kvp_cap_fmt kv_fmt;
    uint64_t weight_bytes_override; /* > 0: exact model weight bytes (from a file's tensors) */
    /* with it, a file's bytes by KVP_CAP_W_* (they sum to it), so each
     * stage gets its own tensors' bytes where the file's formats differ
     * (a Q2_K file's Q6_K output head on the last stage); all 0: the
     * override scales every tensor alike */
    uint64_t weight_class_bytes[KVP_CAP_W_CLASSES];
    kvp_col_units col_units;      /* a file's kvp_cap_model_file.col_units (0: not known) */
    uint64_t gpu_mem_bytes;       /* per GPU */
    double gpu_bw;                /* bytes/s per GPU, 0 when unknown */
    double gpu_util;              /* share of gpu_mem usable, (0, 1] */
    uint32_t gpus;                /* total GPUs (replicas = gpus / (tp x pp)) */
    uint32_t tp, pp;
    uint32_t block_size;          /* tokens per KV block (power of two) */
    uint64_t max_batched_tokens;  /* prefill chunk: sizes the activation allowance */
    uint64_t overhead_bytes;      /* fixed per-GPU allowance: CUDA context, workspaces */
    uint64_t seq_len;             /* tokens per sequence (prompt + output) */
    uint64_t batch;               /* concurrent sequences */
} kvp_cap_params;

/* Defaults: gpu_util 0.9, tp = pp = gpus = 1, block 16, 8192 batched tokens,
 * 1 GiB overhead, f16 everything, seq_len 4096, batch 1.  cfg is zeroed. */
void kvp_cap_params_init(kvp_cap_params *p);

/* One pipeline stage's GPU. */
typedef struct kvp_cap_stage {
    uint32_t layer_begin, layer_end;   /* layers [begin, end) */
    uint32_t n_full, n_sliding;        /* of those, full-attention and windowed layers */
    uint64_t weight_bytes;             /* this GPU's shard */
    uint64_t activation_bytes;         /* allowance, scales with max_batched_tokens */
    uint64_t kv_bytes_per_token;       /* all this GPU's layers, data only */
    uint64_t block_bytes;              /* one block over this GPU's layers, scales included */
    uint64_t kv_alloc_bytes_per_seq;   /* one sequence at seq_len, whole blocks */
    int64_t kv_free_bytes;             /* usable - weights - overhead - activations; < 0: does not fit */
    uint64_t n_blocks;                 /* kv_free / block_bytes (full-attention blocks) */
    uint64_t max_seqs;                 /* sequences of seq_len that fit */
} kvp_cap_stage;

#define KVP_CAP_MAX_PP 64

typedef struct kvp_cap_result {
    /* whole model, as on one GPU */
    uint64_t n_params, n_params_active; /* active: per token (MoE top-k) */
    uint64_t weight_bytes;
    uint32_t kv_vectors_per_layer;      /* K and V heads (2 x kv heads), or 1 latent (MLA) */
    uint32_t kv_vector_elems;           /* head_dim, or latent + rope (MLA) */
    uint64_t kv_bytes_per_token;        /* data, all layers as if full attention */
    uint64_t kv_bytes_per_seq;          /* exact: tokens held (windows applied) x bytes, no rounding */
    uint64_t kv_bytes;                  /* x batch */
    uint64_t kv_alloc_bytes_per_seq;    /* paged: whole blocks, scales included */
    uint64_t kv_alloc_bytes;            /* x batch */
    uint64_t kv_waste_bytes_per_seq;    /* alloc - exact: the partial last block (and scales) */
    /* per GPU */
    uint32_t kv_heads_per_gpu;          /* after the TP split (>= 1: replicated when tp > kv heads) */
    uint64_t usable_bytes;              /* gpu_mem x gpu_util */
    uint32_t n_stages;
    kvp_cap_stage stage[KVP_CAP_MAX_PP];
    uint32_t binding;                   /* the stage with the fewest sequences */
    /* the answer */
    int fits;                           /* weights + allowance fit, and one seq_len sequence */
    int batch_fits;                     /* batch x seq_len fits */
    uint64_t max_seqs;                  /* per replica, at seq_len */
    /* the largest L such that `batch` sequences of every length 1..L fit
     * (windows make a longer one fit where a shorter does not); -1: every
     * length fits (windowed layers only: memory stops growing);
     * KVP_CAP_MAX_SEQ_LEN: every length up to it fits, and perhaps more */
    int64_t max_context;
    uint32_t replicas;
    uint64_t max_seqs_total;            /* x replicas */
    uint64_t decode_bytes_per_step;     /* bytes all stages read for one step of `batch` */
    double decode_tokens_per_s;         /* roofline for one replica, 0 when gpu_bw is 0 */
} kvp_cap_result;

/* Check p (0 or KVP_EINVAL naming the field) and compute r. */
int kvp_cap_compute(const kvp_cap_params *p, kvp_cap_result *r, kvp_err *err);

/* Parameter count of the model (total, and active per token for MoE) from
 * its shape; does not use cfg.n_params. */
void kvp_cap_param_count(const kvp_config *c, uint32_t q_lora_rank, uint64_t *total, uint64_t *active);

/* KV blocks one layer holds for a sequence of len tokens: ceil(len / bs), or
 * for a window of w tokens the blocks spanned by the last min(len, w) tokens. */
uint64_t kvp_cap_layer_blocks(uint64_t len, uint32_t bs, uint32_t window);

/* Is layer i (0-based) a sliding-window layer?  sliding_period 0: all layers
 * slide when a window is set; P: every P-th layer (i % P == P - 1) is global. */
int kvp_cap_layer_is_sliding(const kvp_config *c, uint32_t i);

/* ---- model files (capacity_load.c) ---- */

typedef struct kvp_cap_model_file {
    kvp_config cfg;
    char kind[8];           /* "gguf", "kvp" or "hf" */
    uint64_t weight_bytes;  /* all tensors' exact bytes, scales included, when the file lists them (GGUF, KVP); else 0 */
    uint64_t weight_class_bytes[KVP_CAP_W_CLASSES]; /* weight_bytes by KVP_CAP_W_* (tensor names) */
    char weight_type[16];   /* the format of most matrix bytes ("q4_1"), the layers' where there are
                               layers, or an HF quantization_config's ("int4-g128"); "" */
    char embed_type[16];    /* the token embeddings' format, "" when not known */
    uint32_t q_lora_rank;   /* MLA query low rank, which kvp_config does not carry; 0 if none */
    /* the columns a tensor-parallel slice of the attention output and of
     * the FFN down projections must be whole multiples of (their
     * quantization blocks and scale groups; kvp_shard_check_split_cols),
     * 0 when the file does not list its tensors */
    kvp_col_units col_units;
} kvp_cap_model_file;

/* Read a model's shape from path: a GGUF file (header and tensor table
 * only), a KVP model file (its CONFIG record and every record's header to the
 * end, tensor payloads skipped unless compressed), an HF config.json, or a
 * folder holding one.  A file that lists its tensors gives their exact bytes
 * and ties embeddings exactly when it has no lm_head (output.weight or
 * lm_head.weight), as decode's loader does.  The shape must pass
 * kvp_config_check, as the loader's must.  0 or a negative code with a
 * message naming the file. */
int kvp_cap_load_model(const char *path, kvp_cap_model_file *out, kvp_err *err);

/* ---- sweeps: "V", "START:END:STEP" or "START:END:xFACTOR" ---- */

typedef int (*kvp_cap_num_parser)(const char *s, double *out);
#define KVP_CAP_SWEEP_MAX 100000
/* Expand spec into values (at most max); START, END, STEP or a single
 * value are parsed by parse (so sizes may carry suffixes), a FACTOR is
 * decimal digits.  whole: each point rounded to the nearest whole number
 * and a repeat of the one before dropped (a small factor rounds several
 * steps to one count), so max bounds the points kept.  0 or KVP_EINVAL
 * with a message naming the part that is bad and saying it "is not
 * <what>" ("a whole number in digits"); KVP_ELIMIT past max points. */
int kvp_cap_sweep_parse(const char *spec, kvp_cap_num_parser parse, const char *what, int whole, double *vals,
                        size_t max, size_t *n, kvp_err *err);

/* ---- fragmentation simulation (capacity_sim.c) ---- */

/* xoshiro256** seeded through splitmix64: the simulator's own generator, so
 * results are the same on every platform for a given seed. */
typedef struct kvp_cap_rng {
    uint64_t s[4];
} kvp_cap_rng;
void kvp_cap_rng_seed(kvp_cap_rng *r, uint64_t seed);
uint64_t kvp_cap_rng_next(kvp_cap_rng *r);
double kvp_cap_rng_uniform(kvp_cap_rng *r); /* [0, 1) with 53 random bits */
double kvp_cap_rng_normal(kvp_cap_rng *r);  /* standard normal (Box-Muller) */

enum kvp_cap_dist {
    KVP_CAP_DIST_LIST = 0,      /* lengths from a file, used in order, cyclically */
    KVP_CAP_DIST_UNIFORM = 1,   /* integers in [a, b] */
    KVP_CAP_DIST_NORMAL = 2,    /* round(N(a, b)) */
    KVP_CAP_DIST_LOGNORMAL = 3, /* round(exp(N(a, b))) */
};

typedef struct kvp_cap_lengths {
    int kind;          /* kvp_cap_dist */
    double a, b;
    uint32_t *list;    /* LIST: owned, freed by kvp_cap_lengths_free */
    size_t n_list;
} kvp_cap_lengths;

#define KVP_CAP_LENGTHS_MAX 10000000u
/* "uniform:A:B", "normal:MEAN:SD", "lognormal:MU:SIGMA", or else a file of
 * whitespace-separated positive integers. */
int kvp_cap_lengths_parse(kvp_cap_lengths *d, const char *spec, kvp_err *err);
void kvp_cap_lengths_free(kvp_cap_lengths *d);
/* The i-th length of the stream, clamped to [1, max_len]. */
uint64_t kvp_cap_lengths_draw(const kvp_cap_lengths *d, kvp_cap_rng *r, uint64_t i, uint64_t max_len);
/* The longest length the stream can give, clamped to [1, max_len]: B of a
 * uniform, the list's largest, max_len for a normal or log-normal spread. */
uint64_t kvp_cap_lengths_max(const kvp_cap_lengths *d, uint64_t max_len);

/* The GPU's layers are charged as the plan charges them (kvp_cap_compute):
 * a full-attention layer every token, a windowed one the tokens of its
 * window (whole blocks: kvp_cap_layer_blocks), so for lengths all equal to
 * max_len the paged scheme at the plan's block size admits the plan's
 * max_seqs. */
typedef struct kvp_cap_sim_opts {
    uint64_t kv_bytes;              /* KV memory on the GPU */
    uint64_t bytes_per_token;       /* KV data per token in one layer on the GPU */
    uint64_t scale_bytes_per_block; /* per block in one layer on the GPU (scaled KV formats) */
    uint32_t n_full, n_sliding;     /* the GPU's full-attention and windowed layers (at least one) */
    uint32_t window;                /* tokens a windowed layer keeps (above 0 where n_sliding is) */
    uint64_t max_len;               /* reservation per sequence for the contiguous scheme (a windowed
                                       layer's: its window, where shorter) */
    uint64_t shared_prefix;         /* tokens every sequence shares (0: none) */
    uint64_t seed;
} kvp_cap_sim_opts;

typedef struct kvp_cap_sim_row {
    uint32_t block_size;            /* 0: contiguous max-length reservation */
    uint64_t seqs;                  /* admitted (first come first served, until one does not fit) */
    uint64_t tokens;                /* their total length */
    uint64_t alloc_bytes;           /* reserved for them */
    uint64_t waste_bytes;           /* reserved token slots left empty (a windowed layer's slots past its window
                                       are not reserved) */
    uint64_t seqs_shared;           /* admitted when full prefix blocks are shared */
    uint64_t saved_bytes;           /* bytes the sharing saved on those */
} kvp_cap_sim_row;

#define KVP_CAP_SIM_MAX_SEQS 100000000u
/* Simulate admission: row 0 the contiguous scheme, then one row per block
 * size.  Every scheme sees the same length stream (same seed).  A shared
 * prefix's whole blocks are stored once; a windowed layer shares those of
 * them still inside its window. */
int kvp_cap_simulate(const kvp_cap_sim_opts *o, const kvp_cap_lengths *d, const uint32_t *block_sizes,
                     size_t n_block_sizes, kvp_cap_sim_row *rows, kvp_err *err);

#endif
