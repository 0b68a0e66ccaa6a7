/* capacity_check.h - kvcalc --check: a decode run's summary (decode
 * --stats=FILE) read back, and kvcalc's own model of that run's KV cache set
 * beside what the run measured.
 *
 * decode's CPU pool is one array of blocks, each holding block_size tokens
 * of K and V for every layer of the rank; kvcalc's model (capacity.c) counts
 * KV per layer per GPU.  The check asks kvcalc for one replica split as the
 * run was (its "tp" and "pp"; 1 and 1 when the file has none, as before
 * decode wrote them) and takes the first GPU of the first stage, rank 0,
 * whose pool the stats hold: its stage block over its layers is exactly the
 * engine's block, n_layer x (block_size tokens x 2 x n_head_kv vectors of
 * head_dim elements in the KV format, plus the format's scales per head per
 * block), with the rank's layers and KV heads.  Both go
 * through kvp_cap_fmt, so a KV format the engine gains is counted the way
 * kvcalc counts it.  Sliding windows are not applied: the engine keeps every
 * token in every layer.  The rules are documented in kvcalc(1) CHECKING A
 * RUN; keep the two in step.
 */
#ifndef KVP_CAPACITY_CHECK_H
#define KVP_CAPACITY_CHECK_H

#include "capacity.h"
#include "error.h"

#include <stddef.h>
#include <stdint.h>

/* How decode sized its pool (its "kv_pool_sized_by"). */
enum kvp_cap_pool {
    KVP_CAP_POOL_MEM = 0,     /* --kv-mem: floor(kv_mem / block bytes) blocks */
    KVP_CAP_POOL_BLOCKS = 1,  /* --kv-blocks: the count asked */
    KVP_CAP_POOL_CONTEXT = 2, /* neither: ceil(n_ctx / block_size) blocks (n_ctx 0: 4096) */
};

/* "kv-mem", "kv-blocks", "context". */
const char *kvp_cap_pool_name(int pool);

#define KVP_CAP_STATS_MAX_SIZE (1u << 20) /* bytes of a stats file accepted */

/* The fields of a decode --stats JSON object that the check reads. */
typedef struct kvp_cap_run {
    char model[1024];         /* -m as decode was given it (may be "") */
    char fingerprint[33];     /* 32 lowercase hex digits */
    char input[8];            /* "prompts" or "kvp" (a KV stream) */
    char kv_dtype[24];        /* the pool's dtype name ("f16") */
    int pool;                 /* kvp_cap_pool */
    int has_kv_mem;           /* kv_mem is a number (not null) */
    uint64_t kv_mem;          /* --kv-mem as asked, bytes */
    int kv_out, stopped;      /* --kv-out (finished requests keep their blocks); ended by a signal */
    uint32_t block_size;      /* tokens a block */
    uint64_t kv_block_bytes;  /* bytes a block, all layers */
    uint64_t kv_blocks;       /* blocks in the pool */
    uint64_t kv_pool_bytes;
    uint64_t peak_kv_blocks;  /* most blocks in use at once */
    uint32_t max_num_seqs;
    uint32_t peak_running;    /* most requests running at once */
    uint64_t requests, prompt_tokens, output_tokens;
    uint64_t max_seq_len;     /* longest request, prompt + output tokens */
    uint64_t preemptions;
    uint64_t kv_memory;       /* requests ended for lack of KV memory */
    uint32_t tp, pp;          /* the run's split (1 when the file has none) */
} kvp_cap_run;

/* Read a stats object from text[len] (name for messages).  Every field above
 * is required (kv_mem may be null; tp and pp may be absent) and range-checked; a wrong type, a value
 * out of range, or fields that contradict each other give KVP_EFORMAT with a
 * message "name: FIELD: what".  Other fields are ignored. */
int kvp_cap_run_parse(kvp_cap_run *out, const char *text, size_t len, const char *name, kvp_err *err);
/* The same from a file ("-": stdin), at most KVP_CAP_STATS_MAX_SIZE bytes. */
int kvp_cap_run_load(kvp_cap_run *out, const char *path, kvp_err *err);

enum kvp_cap_rule {
    KVP_CAP_RULE_INFO = 0,    /* reported, not checked */
    KVP_CAP_RULE_EQUAL = 1,   /* measured == predicted */
    KVP_CAP_RULE_AT_MOST = 2, /* measured <= predicted */
};

typedef struct kvp_cap_check_row {
    const char *field;        /* the stats field measured ("kv_block_bytes") */
    int has_predicted;        /* 0: kvcalc predicts nothing here (INFO) */
    uint64_t predicted;
    uint64_t measured;
    uint64_t len;             /* the concurrency rows: sequence length, tokens */
    int rule;                 /* kvp_cap_rule */
    int ok;
} kvp_cap_check_row;

#define KVP_CAP_CHECK_ROWS 8
enum {
    KVP_CAP_ROW_BLOCK_BYTES = 0, KVP_CAP_ROW_BLOCKS, KVP_CAP_ROW_POOL_BYTES, KVP_CAP_ROW_PEAK_BLOCKS,
    KVP_CAP_ROW_SEQS_MEAN, KVP_CAP_ROW_SEQS_MAX, KVP_CAP_ROW_PREEMPTIONS, KVP_CAP_ROW_KV_MEMORY,
};

typedef struct kvp_cap_check {
    /* kvcalc's plan of the run's rank 0 */
    uint32_t n_layer;            /* its layers (all of them unless pp > 1) */
    uint32_t kv_heads;           /* its KV heads (a share under tp; 1 for MLA's latent) */
    uint64_t layer_block_bytes;  /* one layer's share of a block, scales included */
    uint64_t block_bytes;        /* all layers: the engine's block */
    uint64_t bytes_per_token;    /* KV data a token, all layers */
    uint64_t n_blocks, pool_bytes;
    /* the KV tokens of a request, ceil(mean) and longest: prompt + output
     * less the last token sampled (never fed back); 0 when no request */
    uint64_t mean_len, max_len;
    uint64_t seats;              /* min(max_num_seqs, requests): most the scheduler could run at once */
    int premises;                /* the preemption and kv_memory rules apply (prompts, no --kv-out, not stopped) */
    kvp_cap_check_row row[KVP_CAP_CHECK_ROWS];
    uint32_t n_failed;
} kvp_cap_check;

/* Predict the run's pool from p (cfg, kv_fmt and block_size are read; TP
 * and PP are the run's; GPU and workload fields are ignored) sized by pool (kv_mem for
 * KVP_CAP_POOL_MEM; run->kv_blocks for KVP_CAP_POOL_BLOCKS), and set it
 * beside run.  Rules:
 *   kv_block_bytes, kv_blocks, kv_pool_bytes: equal;
 *   peak_kv_blocks: at most the predicted blocks;
 *   sequences at the mean and the longest length that fit at once (kvcalc's
 *   max_seqs: pool bytes / paged bytes a sequence): beside peak_running, not
 *   checked (running sequences are mostly shorter than their final length);
 *   preemptions: 0 when the premises hold and the sequences of the longest
 *   length that fit are at least `seats` (then every running sequence could
 *   grow to its end: a preemption means the model undercounts the blocks);
 *   kv_memory: 0 when the premises hold and one sequence of the longest
 *   length fits.
 * 0 (out->n_failed says whether they agree) or KVP_EINVAL / KVP_ELIMIT with
 * a message when p cannot be computed, or KVP_EMISMATCH "tp: ..." / "pp:
 * ..." when the run's split does not fit the model (decode would have
 * refused it: the stats are not of this model). */
int kvp_cap_check_run(const kvp_cap_params *p, int pool, uint64_t kv_mem, const kvp_cap_run *run,
                      kvp_cap_check *out, kvp_err *err);

#endif
