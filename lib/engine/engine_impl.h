/* engine_impl.h - the engine's state, shared by engine.c (the forward
 * pass) and tp.c (tensor parallelism: the driver's messages and the
 * workers' loop).  Nothing else includes it. */
#ifndef KVP_ENGINE_IMPL_H
#define KVP_ENGINE_IMPL_H

#include "comm.h"
#include "engine.h"
#include "tpmsg.h"

#include <signal.h>

struct kvp_engine {
    const kvp_model *m;
    kvp_backend *be;
    kvp_kvcache *kc;
    /* The model's weights as the backend prepared them (prepare_weight):
     * copies of the model's descriptors, each with its backend data. */
    kvp_layer *layers;     /* [n_layer] */
    kvp_weight tok_embd, output, output_norm;
    kvp_weight rope_freq;  /* the model's inv_freq, [rope_dim / 2] f32 */
    uint32_t max_n_in;     /* the widest weight row */
    uint32_t cap_tok;      /* tokens the buffers hold */
    uint32_t cap_rows;     /* logits rows the buffers hold */
    uint32_t res_ctx;      /* keys a query may see, as reserved in the backend */
    uint32_t hidden_rows;  /* rows of e->h that hold the last step's normed hidden states */
    /* greedy rows (KVP_LOGITS_ARGMAX): the last n_argmax of a step's rows,
     * picked by the backend's argmax_rows into arg_ids [cap_rows] (host);
     * without that op, or across ranks, all rows come to arg_host first */
    uint32_t n_argmax;
    uint32_t *arg_ids;
    float *arg_host;
    size_t cap_arg_host;   /* floats arg_host holds */
    /* device buffers */
    float *x, *h, *q, *k, *v, *att, *g, *u, *logits;
    /* host metadata for the step */
    int32_t *tok_ids, *pos;
    uint32_t *slot, *tok_seq, *rows;
    int32_t *parent, *kv_pos; /* a draft tree's (kvp_attn_args), when tree */
    int tree;                 /* the step holds a draft tree */
    const uint32_t **tables;
    uint32_t cap_seqs;
    /* the step's metadata on the device (kvp_engine_run uploads it) */
    int32_t *d_tok, *d_pos, *d_parent, *d_kv_pos;
    uint32_t *d_slot, *d_tok_seq, *d_rows;
    uint32_t *flat, *d_flat; /* block tables [n_seq][stride], host and device */
    size_t cap_flat;       /* uint32s each holds */
    /* tensor and pipeline parallelism (NULL world: one process) */
    kvp_comm *world;       /* the job: messages from rank 0, hidden states, logits */
    kvp_comm *tp;          /* this stage's ranks, when more than one: all-reduce, logits gather */
    int tp_n;              /* ranks a stage */
    int rank, prev, next;  /* world ranks: this one, the previous and next stage's peer (-1: none) */
    int logits_from;       /* world rank that sends rank 0 the logits (-1: rank 0 has them) */
    int pp_n;              /* pipeline stages */
    uint32_t vocab_rows;   /* kvp_shard_vocab_rows: each rank's share of the logits */
    float *gathered;       /* device [tp_n][cap_rows * vocab_rows] */
    float *host_gathered;  /* its host copy */
    float *host_x;         /* pipeline stages: the hidden state sent or received, [cap_tok][n_embd] */
    float *host_logits;    /* the last stage's first rank: logits sent to rank 0, [cap_rows][n_vocab] */
    kvp_tpmsg_buf msg;     /* the driver's next message */
    uint32_t *copies, n_copies, cap_copies; /* the driver's block copies since the last step: [n][2] */
    int copies_lost;       /* a copy could not be recorded (out of memory) */
    uint32_t *n_table;     /* the driver's [cap_seqs] table lengths */
    const volatile sig_atomic_t *cancel; /* kvp_engine_set_cancel */
};

/* Point-to-point tags between pipeline stages. */
#define KVP_TAG_HIDDEN 11
#define KVP_TAG_LOGITS 12
#define KVP_TAG_KV 13

/* Make room for a step of n_tok tokens, n_rows logits rows, n_seqs sequences. */
int kvp_engine_ensure(kvp_engine *e, uint32_t n_tok, uint32_t n_rows, uint32_t n_seqs, kvp_err *err);
/* The step laid out in e's host arrays (T tokens of n_seqs sequences, R
 * logits rows): uploaded, then embed, every layer, and the logits rows
 * (gathered across ranks under tensor parallelism) into logits (host; NULL
 * on a worker).  0 or a code. */
int kvp_engine_run(kvp_engine *e, uint32_t T, uint32_t R, uint32_t n_seqs, float *logits, kvp_err *err);
/* The driver: broadcast the step laid out in e's arrays (tp.c). */
int kvp_engine_tp_send_step(kvp_engine *e, uint32_t T, uint32_t R, uint32_t n_seqs, kvp_err *err);
/* Release the tensor-parallel buffers (tp.c). */
void kvp_engine_tp_release(kvp_engine *e);

#endif
