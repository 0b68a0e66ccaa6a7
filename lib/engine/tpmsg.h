/* tpmsg.h - what rank 0 of a tensor-parallel group tells the other ranks.
 *
 * Rank 0 (the driver) runs the program: it reads the prompts, schedules,
 * samples, writes the output and owns the KV cache's block tables.  The
 * other ranks (workers) hold only their heads of every KV block and compute
 * each step on their shard of the weights (shard.h).  All a worker needs to
 * compute a step is its layout, which the driver broadcasts before it:
 *
 *   SETUP  the pool: blocks, block size, KV dtype, layers and vocabulary
 *          (the worker makes the same pool, with its heads)
 *   STEP   T tokens of n_seqs sequences: token ids, positions, KV slots,
 *          each token's sequence, the R rows whose logits are wanted, each
 *          sequence's block table, and the copy-on-write block copies the
 *          driver's cache made since the last step (done first)
 *   KV_READ  send rank 0 your part of a block (it writes a KV stream)
 *   KV_WRITE receive your part of a block from rank 0 (it reads a KV stream)
 *   STOP   the engine is gone (its pool with it); a SETUP may follow
 *   END    the job is over
 *
 * A message is little-endian u32 words: magic, kind, then the kind's
 * counts and arrays (kvp(5) does not cover it: it never leaves the job).
 * It travels as a 2-word head (magic, words) then the words.  A worker
 * checks every count and index against the pool before using any
 * (kvp_tpmsg_decode), so a message cannot make it read or write outside
 * its buffers.
 */
#ifndef KVP_TPMSG_H
#define KVP_TPMSG_H

#include "error.h"

#include <stddef.h>
#include <stdint.h>

#define KVP_TPMSG_MAGIC 0x5054564bu /* "KVTP" */
#define KVP_TPMSG_MAX_TOK (1u << 20)

enum kvp_tpmsg_kind {
    KVP_TPMSG_SETUP = 1, KVP_TPMSG_STEP = 2, KVP_TPMSG_STOP = 3, KVP_TPMSG_END = 4, KVP_TPMSG_KV_READ = 5,
    KVP_TPMSG_KV_WRITE = 6,
};

typedef struct kvp_tpmsg_setup {
    uint32_t n_blocks, block_size, dtype, n_layer, n_vocab;
} kvp_tpmsg_setup;

/* A step's layout; arrays point into the message words (tables into
 * memory the decoder owns). */
typedef struct kvp_tpmsg_step {
    uint32_t n_tok, n_rows, n_seqs, n_copies;
    const int32_t *tok, *pos;      /* [n_tok] */
    const uint32_t *slot, *tok_seq;/* [n_tok] */
    const uint32_t *rows;          /* [n_rows]: token index of each logits row, increasing */
    const uint32_t *n_table;       /* [n_seqs]: blocks in each table */
    const uint32_t **tables;       /* [n_seqs] */
    const uint32_t *copies;        /* [n_copies][2]: dst, src */
} kvp_tpmsg_step;

typedef struct kvp_tpmsg {
    uint32_t kind;
    uint32_t block;                /* KV_READ, KV_WRITE */
    kvp_tpmsg_setup setup;
    kvp_tpmsg_step step;
    const uint32_t **tables_mem;   /* owned */
} kvp_tpmsg;

/* A growable message being written. */
typedef struct kvp_tpmsg_buf {
    uint32_t *w;
    size_t n, cap;
} kvp_tpmsg_buf;

void kvp_tpmsg_buf_free(kvp_tpmsg_buf *b);
/* Encode into b (reset first).  0 or KVP_ENOMEM. */
int kvp_tpmsg_put_setup(kvp_tpmsg_buf *b, const kvp_tpmsg_setup *s, kvp_err *err);
/* kind KVP_TPMSG_STOP or KVP_TPMSG_END (no fields) */
int kvp_tpmsg_put_bare(kvp_tpmsg_buf *b, uint32_t kind, kvp_err *err);
/* kind KVP_TPMSG_KV_READ or KVP_TPMSG_KV_WRITE */
int kvp_tpmsg_put_kv(kvp_tpmsg_buf *b, uint32_t kind, uint32_t block, kvp_err *err);
/* s->tables[i] has s->n_table[i] blocks. */
int kvp_tpmsg_put_step(kvp_tpmsg_buf *b, const kvp_tpmsg_step *s, kvp_err *err);

/* Decode w[n] words.  A STEP is checked against lim (the worker's pool and
 * vocabulary: every block id, slot, position, sequence and row in range,
 * each slot the one its position's block holds).  0, or KVP_EFORMAT /
 * KVP_ETRUNC / KVP_ELIMIT naming the field.  Free with kvp_tpmsg_free. */
int kvp_tpmsg_decode(kvp_tpmsg *m, const uint32_t *w, size_t n, const kvp_tpmsg_setup *lim, kvp_err *err);
void kvp_tpmsg_free(kvp_tpmsg *m);

#endif
