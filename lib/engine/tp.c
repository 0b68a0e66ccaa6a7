/* tp.c - tensor parallelism in the engine (engine.h): rank 0 drives, the
 * other ranks follow its messages (tpmsg.h).
 *
 * Every rank runs the same forward pass on its shard (shard.h) over its
 * heads of the KV pool; the hidden state stays whole and identical on every
 * rank, because each row-parallel product is all-reduced before the residual
 * add (engine.c).  Only the driver has a KV cache manager: block tables,
 * prefix sharing and preemption are its decisions, and a worker's pool
 * follows them through the slots, tables and block copies of each step.
 */
#include "engine_impl.h"
#include "shard.h"

#include <stdlib.h>
#include <string.h>

/* Messages longer than this are refused before any allocation: a step of
 * 2^20 tokens over a 2^30-block pool stays far below it. */
#define MAX_WORDS ((uint64_t)1 << 28)

static int send_msg(kvp_comm *tp, const kvp_tpmsg_buf *b, kvp_err *err)
{
    uint32_t head[2] = {KVP_TPMSG_MAGIC, (uint32_t)b->n};
    int rc = kvp_comm_bcast(tp, head, sizeof head, 0, err);
    return rc < 0 ? rc : kvp_comm_bcast(tp, b->w, b->n * sizeof *b->w, 0, err);
}

/* A worker: the next message, waiting as long as the driver takes. */
static int recv_msg(kvp_comm *tp, kvp_tpmsg_buf *b, kvp_err *err)
{
    uint32_t head[2];
    int rc = kvp_comm_bcast_idle(tp, head, sizeof head, 0, err);
    if (rc < 0)
        return rc;
    if (head[0] != KVP_TPMSG_MAGIC || head[1] < 2 || head[1] > MAX_WORDS)
        return kvp_err_set(err, KVP_EFORMAT, "tensor parallel: a message head %08x of %u words from rank 0",
                           head[0], head[1]);
    if (head[1] > b->cap) {
        uint32_t *w = realloc(b->w, (size_t)head[1] * sizeof *w);
        if (!w)
            return kvp_err_set(err, KVP_ENOMEM, "tensor parallel: out of memory for a message of %u words",
                               head[1]);
        b->w = w;
        b->cap = head[1];
    }
    b->n = head[1];
    return kvp_comm_bcast(tp, b->w, b->n * sizeof *b->w, 0, err);
}

/* The driver's cache copied a block: the workers copy theirs before the next step. */
static void note_copy(void *ctx, uint32_t dst, uint32_t src)
{
    kvp_engine *e = ctx;
    if (e->n_copies == e->cap_copies) {
        uint32_t cap = e->cap_copies ? 2 * e->cap_copies : 16;
        uint32_t *c = realloc(e->copies, (size_t)cap * 2 * sizeof *c);
        if (!c) {
            e->copies_lost = 1; /* reported by the next step */
            return;
        }
        e->copies = c;
        e->cap_copies = cap;
    }
    e->copies[2 * e->n_copies] = dst;
    e->copies[2 * e->n_copies + 1] = src;
    e->n_copies++;
}

static void set_group(kvp_engine *e, kvp_comm *tp)
{
    e->tp = tp;
    e->tp_rank = kvp_comm_rank(tp);
    e->tp_n = kvp_comm_size(tp);
    e->vocab_rows = kvp_shard_vocab_rows(e->m->cfg.n_vocab, (uint32_t)e->tp_n);
}

int kvp_engine_tp_start(kvp_engine *e, kvp_comm *tp, kvp_err *err)
{
    if (e->cap_tok)
        return kvp_err_set(err, KVP_EINVAL, "tensor parallel: the engine has run a step already");
    if (kvp_comm_rank(tp) != 0)
        return kvp_err_set(err, KVP_EINVAL, "tensor parallel: rank %d is not the driver", kvp_comm_rank(tp));
    set_group(e, tp);
    kvp_kvcache_set_copy_hook(e->kc, note_copy, e);
    const kvp_kv_pool *kv = kvp_kvcache_pool(e->kc);
    kvp_tpmsg_setup s = {.n_blocks = kv->n_blocks, .block_size = kv->block_size, .dtype = (uint32_t)kv->dtype,
                         .n_layer = e->m->cfg.n_layer, .n_vocab = e->m->cfg.n_vocab};
    int rc = kvp_tpmsg_put_setup(&e->msg, &s, err);
    return rc < 0 ? rc : send_msg(tp, &e->msg, err);
}

int kvp_engine_tp_send_step(kvp_engine *e, uint32_t T, uint32_t R, uint32_t n_seqs, kvp_err *err)
{
    if (e->copies_lost)
        return kvp_err_set(err, KVP_ENOMEM, "tensor parallel: out of memory recording a block copy");
    kvp_tpmsg_step s = {.n_tok = T, .n_rows = R, .n_seqs = n_seqs, .n_copies = e->n_copies, .tok = e->tok_ids,
                        .pos = e->pos, .slot = e->slot, .tok_seq = e->tok_seq, .rows = e->rows,
                        .n_table = e->n_table, .tables = e->tables, .copies = e->copies};
    int rc = kvp_tpmsg_put_step(&e->msg, &s, err);
    if (rc == 0 && (rc = send_msg(e->tp, &e->msg, err)) == 0)
        e->n_copies = 0;
    return rc;
}

void kvp_engine_tp_release(kvp_engine *e)
{
    if (e->tp && e->tp_rank == 0) {
        kvp_err ignored;
        kvp_kvcache_set_copy_hook(e->kc, NULL, NULL);
        if (kvp_tpmsg_put_stop(&e->msg, &ignored) == 0)
            send_msg(e->tp, &e->msg, &ignored);
    }
    kvp_tpmsg_buf_free(&e->msg);
    free(e->copies);
    e->copies = NULL;
    e->n_copies = e->cap_copies = 0;
}

int kvp_engine_tp_end(kvp_comm *tp, kvp_err *err)
{
    kvp_tpmsg_buf b = {0};
    uint32_t w[2] = {KVP_TPMSG_MAGIC, KVP_TPMSG_END};
    b.w = w;
    b.n = b.cap = 2;
    return send_msg(tp, &b, err);
}

/* ---- the workers ---- */

/* One step the driver laid out, on this rank's shard. */
static int follow_step(kvp_engine *e, const kvp_tpmsg_step *s, kvp_err *err)
{
    int rc = kvp_engine_ensure(e, s->n_tok, s->n_rows, s->n_seqs, err);
    if (rc < 0)
        return rc;
    const kvp_kv_pool *kv = kvp_kvcache_pool(e->kc);
    for (uint32_t i = 0; i < s->n_copies; i++)
        e->be->ops->kv_copy_block(e->be, kv, s->copies[2 * i], s->copies[2 * i + 1]);
    memcpy(e->tok_ids, s->tok, s->n_tok * sizeof *e->tok_ids);
    memcpy(e->pos, s->pos, s->n_tok * sizeof *e->pos);
    memcpy(e->slot, s->slot, s->n_tok * sizeof *e->slot);
    memcpy(e->tok_seq, s->tok_seq, s->n_tok * sizeof *e->tok_seq);
    memcpy(e->rows, s->rows, s->n_rows * sizeof *e->rows);
    for (uint32_t i = 0; i < s->n_seqs; i++)
        e->tables[i] = s->tables[i];
    return kvp_engine_run(e, s->n_tok, s->n_rows, NULL, err);
}

/* From a SETUP to its STOP: a pool like the driver's (with this rank's
 * heads) and the steps on it. */
static int follow_engine(const kvp_model *shard, kvp_backend *be, kvp_comm *tp, const kvp_tpmsg_setup *su,
                         kvp_tpmsg_buf *b, kvp_err *err)
{
    if (su->n_layer != shard->cfg.n_layer || su->n_vocab != shard->cfg.n_vocab)
        return kvp_err_set(err, KVP_EMISMATCH, "tensor parallel: rank 0's model has %u layers and %u tokens, this "
                           "rank's %u and %u (every rank must load the same model)", su->n_layer, su->n_vocab,
                           shard->cfg.n_layer, shard->cfg.n_vocab);
    kvp_kvcache_opts ko;
    kvp_kvcache_opts_init(&ko);
    ko.n_blocks = su->n_blocks;
    ko.block_size = su->block_size;
    ko.dtype = (int)su->dtype;
    kvp_kvcache *kc = NULL;
    kvp_engine *e = NULL;
    int rc = kvp_kvcache_create(&kc, &shard->cfg, &ko, be, err);
    if (rc == 0)
        rc = kvp_engine_create(&e, shard, be, kc, err);
    if (rc == 0)
        set_group(e, tp);
    while (rc == 0) {
        kvp_tpmsg m;
        if ((rc = recv_msg(tp, b, err)) < 0 || (rc = kvp_tpmsg_decode(&m, b->w, b->n, su, err)) < 0)
            break;
        if (m.kind == KVP_TPMSG_STOP) {
            kvp_tpmsg_free(&m);
            break;
        }
        rc = m.kind == KVP_TPMSG_STEP ? follow_step(e, &m.step, err)
                                      : kvp_err_set(err, KVP_EFORMAT, "tensor parallel: message kind %u inside a run",
                                                    m.kind);
        kvp_tpmsg_free(&m);
    }
    if (e)
        e->tp = NULL; /* a worker sends no STOP */
    kvp_engine_free(e);
    kvp_kvcache_free(kc);
    return rc;
}

int kvp_engine_tp_serve(const kvp_model *shard, kvp_backend *be, kvp_comm *tp, kvp_err *err)
{
    kvp_tpmsg_buf b = {0};
    int rc = 0;
    for (;;) {
        kvp_tpmsg m;
        if ((rc = recv_msg(tp, &b, err)) < 0 || (rc = kvp_tpmsg_decode(&m, b.w, b.n, NULL, err)) < 0)
            break;
        if (m.kind == KVP_TPMSG_END)
            break;
        rc = m.kind == KVP_TPMSG_SETUP ? follow_engine(shard, be, tp, &m.setup, &b, err)
                                       : kvp_err_set(err, KVP_EFORMAT, "tensor parallel: message kind %u before a "
                                                     "setup", m.kind);
        kvp_tpmsg_free(&m);
        if (rc < 0)
            break;
    }
    kvp_tpmsg_buf_free(&b);
    if (rc < 0)
        kvp_err_prefix(err, "rank %d", kvp_comm_rank(tp));
    return rc;
}
