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
        return kvp_err_set(err, KVP_EFORMAT, "parallel job: a message head %08x of %u words from rank 0",
                           head[0], head[1]);
    if (head[1] > b->cap) {
        uint32_t *w = realloc(b->w, (size_t)head[1] * sizeof *w);
        if (!w)
            return kvp_err_set(err, KVP_ENOMEM, "parallel job: out of memory for a message of %u words",
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

/* This rank's place in the job, from d. */
static void set_group(kvp_engine *e, const kvp_parallel *d)
{
    e->world = d->world;
    e->rank = kvp_comm_rank(d->world);
    e->tp = d->tp_size > 1 ? d->tp : NULL;
    e->tp_n = (int)d->tp_size;
    e->vocab_rows = kvp_shard_vocab_rows(e->m->cfg.n_vocab, d->tp_size);
    e->prev = d->stage > 0 ? e->rank - (int)d->tp_size : -1;
    e->next = d->stage + 1 < d->pp_size ? e->rank + (int)d->tp_size : -1;
    e->logits_from = d->pp_size > 1 ? (int)((d->pp_size - 1) * d->tp_size) : -1;
    e->pp_n = (int)d->pp_size;
}

/* The whole model's layer count, whatever this rank's stage holds. */
static uint32_t whole_layers(const kvp_model *m) { return m->base ? m->base->cfg.n_layer : m->cfg.n_layer; }

/* ---- whole KV blocks, for a KV stream: each rank's layers and heads ---- */

/* Where world rank q's part of a block goes in the whole one. */
typedef struct part {
    uint32_t l0, n_layer, kv0, n_kv; /* its layers and KV heads */
    uint64_t data, bytes;            /* its data bytes, its whole block bytes (data + scales) */
} part;

static part part_of(const kvp_engine *e, const kvp_kv_pool *whole, int q)
{
    uint32_t tp = (uint32_t)e->tp_n, pp = (uint32_t)e->pp_n, s = (uint32_t)q / tp, t = (uint32_t)q % tp;
    uint32_t L = whole->n_layer, H = whole->n_head_kv, bs = whole->block_size;
    part p = {.l0 = kvp_shard_first_layer(L, s, pp)};
    p.n_layer = kvp_shard_first_layer(L, s + 1, pp) - p.l0;
    p.n_kv = H % tp == 0 ? H / tp : 1;
    p.kv0 = H % tp == 0 ? t * p.n_kv : t / (tp / H); /* as shard.c splits them */
    uint64_t rows = (uint64_t)p.n_layer * 2 * p.n_kv * bs;
    p.data = rows * whole->head_dim * (uint64_t)kvp_dtype_row_bytes((uint32_t)whole->dtype, 1);
    p.bytes = p.data + (whole->scales_off ? rows * sizeof(float) : 0);
    return p;
}

/* Copy a rank's part of a block (laid out as that rank's own pool's block)
 * into the whole block (to_whole) or out of it. */
static void copy_part(const kvp_kv_pool *w, const part *p, uint8_t *whole, uint8_t *mine, int to_whole)
{
    uint64_t slab = (uint64_t)w->block_size * w->head_dim * (uint64_t)kvp_dtype_row_bytes((uint32_t)w->dtype, 1);
    uint64_t sslab = (uint64_t)w->block_size * sizeof(float);
    for (uint32_t l = 0; l < p->n_layer; l++)
        for (uint32_t kv = 0; kv < 2; kv++)
            for (uint32_t h = 0; h < p->n_kv; h++) {
                uint64_t at_mine = ((uint64_t)l * 2 + kv) * p->n_kv + h;
                uint64_t at_whole = ((uint64_t)(p->l0 + l) * 2 + kv) * w->n_head_kv + p->kv0 + h;
                uint8_t *a = whole + at_whole * slab, *m = mine + at_mine * slab;
                memcpy(to_whole ? a : m, to_whole ? m : a, slab);
                if (!w->scales_off)
                    continue;
                a = whole + w->scales_off + at_whole * sslab, m = mine + p->data + at_mine * sslab;
                memcpy(to_whole ? a : m, to_whole ? m : a, sslab);
            }
}

/* The driver's kvp_kvcache_read_hook: every rank's part of block b, whole. */
static int read_whole(void *ctx, uint32_t b, void *host, kvp_err *err)
{
    kvp_engine *e = ctx;
    const kvp_kv_pool *w = kvp_kvcache_whole(e->kc);
    int n = kvp_comm_size(e->world), rc = kvp_tpmsg_put_kv(&e->msg, KVP_TPMSG_KV_READ, b, err);
    if (rc < 0 || (rc = send_msg(e->world, &e->msg, err)) < 0)
        return rc;
    uint8_t *buf = malloc(kvp_kvcache_pool(e->kc)->block_bytes); /* stage 0's part is the largest */
    if (!buf)
        rc = kvp_err_set(err, KVP_ENOMEM, "parallel job: out of memory for a KV block");
    /* every rank answers (a failure here leaves the job unable to go on: the
     * caller's error ends it) */
    for (int q = 0; q < n && rc == 0; q++) {
        part p = part_of(e, w, q);
        if (q == 0)
            rc = kvp_kvcache_block_read(e->kc, b, buf, err);
        else
            rc = kvp_comm_recv(e->world, buf, p.bytes, q, KVP_TAG_KV, err);
        if (rc == 0)
            copy_part(w, &p, host, buf, 1);
    }
    free(buf);
    return rc;
}

/* The driver's kvp_kvcache_write_hook: block b whole (a KV stream read),
 * each rank's part to it. */
static int write_whole(void *ctx, uint32_t b, const void *host, kvp_err *err)
{
    kvp_engine *e = ctx;
    const kvp_kv_pool *w = kvp_kvcache_whole(e->kc);
    int n = kvp_comm_size(e->world), rc = kvp_tpmsg_put_kv(&e->msg, KVP_TPMSG_KV_WRITE, b, err);
    if (rc < 0 || (rc = send_msg(e->world, &e->msg, err)) < 0)
        return rc;
    uint8_t *buf = malloc(kvp_kvcache_pool(e->kc)->block_bytes); /* stage 0's part is the largest */
    if (!buf)
        return kvp_err_set(err, KVP_ENOMEM, "parallel job: out of memory for a KV block");
    for (int q = 0; q < n && rc == 0; q++) {
        part p = part_of(e, w, q);
        copy_part(w, &p, (uint8_t *)(uintptr_t)host, buf, 0); /* only read from */
        if (q == 0)
            rc = kvp_kvcache_block_write(e->kc, b, buf, err);
        else
            rc = kvp_comm_send(e->world, buf, p.bytes, q, KVP_TAG_KV, err);
    }
    free(buf);
    return rc;
}

/* A worker's answer to KV_WRITE: its part of block b, from rank 0. */
static int recv_part(kvp_engine *e, uint32_t b, kvp_err *err)
{
    const kvp_kv_pool *kv = kvp_kvcache_pool(e->kc);
    uint8_t *buf = malloc(kv->block_bytes);
    if (!buf)
        return kvp_err_set(err, KVP_ENOMEM, "parallel job: out of memory for a KV block");
    int rc = kvp_comm_recv(e->world, buf, kv->block_bytes, 0, KVP_TAG_KV, err);
    if (rc == 0)
        rc = kvp_kvcache_block_write(e->kc, b, buf, err);
    free(buf);
    return rc;
}

int kvp_engine_tp_adopt(kvp_engine *e, const kvp_kv_pool *old, kvp_err *err)
{
    uint8_t *buf = malloc(old->block_bytes);
    if (!buf)
        return kvp_err_set(err, KVP_ENOMEM, "parallel job: out of memory for a KV block");
    int rc = 0;
    for (uint32_t b = 0; b < old->n_blocks && rc == 0; b++) {
        if (!kvp_kvcache_block_refs(e->kc, b) && !kvp_kvcache_block_hash(e->kc, b))
            continue; /* free: nothing in it */
        rc = e->be->ops->to_host(e->be, buf, (const uint8_t *)old->base + (uint64_t)b * old->block_bytes,
                                 old->block_bytes, err);
        if (rc == 0)
            rc = write_whole(e, b, buf, err);
    }
    free(buf);
    return rc;
}

/* The job's whole block shape, for the KV streams the driver writes. */
static void set_whole(kvp_engine *e)
{
    const kvp_config *c = e->m->base ? &e->m->base->cfg : &e->m->cfg;
    const kvp_kv_pool *kv = kvp_kvcache_pool(e->kc);
    kvp_kv_pool w = *kv;
    w.base = NULL;
    w.n_layer = c->n_layer;
    w.n_head_kv = c->n_head_kv;
    w.block_bytes = kvp_kvcache_block_bytes(c, kv->block_size, kv->dtype);
    w.scales_off = kv->scales_off ? w.block_bytes - (uint64_t)w.n_layer * 2 * w.n_head_kv * w.block_size * sizeof(float)
                                  : 0;
    kvp_kvcache_set_whole(e->kc, &w, read_whole, write_whole, e);
}

/* A worker's answer to KV_READ: its part of block b, to rank 0. */
static int send_part(kvp_engine *e, uint32_t b, kvp_err *err)
{
    const kvp_kv_pool *kv = kvp_kvcache_pool(e->kc);
    uint8_t *buf = malloc(kv->block_bytes);
    if (!buf)
        return kvp_err_set(err, KVP_ENOMEM, "parallel job: out of memory for a KV block");
    int rc = kvp_kvcache_block_read(e->kc, b, buf, err);
    if (rc == 0)
        rc = kvp_comm_send(e->world, buf, kv->block_bytes, 0, KVP_TAG_KV, err);
    free(buf);
    return rc;
}

int kvp_engine_tp_start(kvp_engine *e, const kvp_parallel *d, kvp_err *err)
{
    if (e->cap_tok)
        return kvp_err_set(err, KVP_EINVAL, "parallel job: the engine has run a step already");
    if (kvp_comm_rank(d->world) != 0)
        return kvp_err_set(err, KVP_EINVAL, "parallel job: rank %d is not the driver", kvp_comm_rank(d->world));
    set_group(e, d);
    kvp_kvcache_set_copy_hook(e->kc, note_copy, e);
    set_whole(e);
    const kvp_kv_pool *kv = kvp_kvcache_pool(e->kc);
    kvp_tpmsg_setup s = {.n_blocks = kv->n_blocks, .block_size = kv->block_size, .dtype = (uint32_t)kv->dtype,
                         .n_layer = whole_layers(e->m), .n_vocab = e->m->cfg.n_vocab};
    int rc = kvp_tpmsg_put_setup(&e->msg, &s, err);
    return rc < 0 ? rc : send_msg(e->world, &e->msg, err);
}

int kvp_engine_tp_send_step(kvp_engine *e, uint32_t T, uint32_t R, uint32_t n_seqs, kvp_err *err)
{
    if (e->copies_lost)
        return kvp_err_set(err, KVP_ENOMEM, "parallel job: out of memory recording a block copy");
    kvp_tpmsg_step s = {.n_tok = T, .n_rows = R, .n_seqs = n_seqs, .n_copies = e->n_copies, .tok = e->tok_ids,
                        .pos = e->pos, .slot = e->slot, .tok_seq = e->tok_seq, .rows = e->rows,
                        .n_table = e->n_table, .tables = e->tables, .copies = e->copies};
    int rc = kvp_tpmsg_put_step(&e->msg, &s, err);
    if (rc == 0 && (rc = send_msg(e->world, &e->msg, err)) == 0)
        e->n_copies = 0;
    return rc;
}

void kvp_engine_tp_release(kvp_engine *e)
{
    if (e->world && e->rank == 0) {
        kvp_err ignored;
        kvp_kvcache_set_copy_hook(e->kc, NULL, NULL);
        kvp_kvcache_set_whole(e->kc, NULL, NULL, NULL, NULL);
        if (kvp_tpmsg_put_bare(&e->msg, KVP_TPMSG_STOP, &ignored) == 0)
            send_msg(e->world, &e->msg, &ignored);
    }
    kvp_tpmsg_buf_free(&e->msg);
    free(e->copies);
    e->copies = NULL;
    e->n_copies = e->cap_copies = 0;
}

int kvp_engine_tp_end(const kvp_parallel *d, kvp_err *err)
{
    kvp_tpmsg_buf b = {0};
    int rc = kvp_tpmsg_put_bare(&b, KVP_TPMSG_END, err);
    if (rc == 0)
        rc = send_msg(d->world, &b, err);
    kvp_tpmsg_buf_free(&b);
    return rc;
}

/* ---- the workers ---- */

/* One step the driver laid out, on this rank's shard. */
static int follow_step(kvp_engine *e, const kvp_tpmsg_step *s, kvp_err *err)
{
    int rc = kvp_engine_ensure(e, s->n_tok, s->n_rows, s->n_seqs, err);
    if (rc < 0)
        return rc;
    const kvp_kv_pool *kv = kvp_kvcache_pool(e->kc);
    for (uint32_t i = 0; i < s->n_copies && rc == 0; i++)
        rc = e->be->ops->kv_copy_block(e->be, kv, s->copies[2 * i], s->copies[2 * i + 1], err);
    if (rc < 0)
        return rc;
    memcpy(e->tok_ids, s->tok, s->n_tok * sizeof *e->tok_ids);
    memcpy(e->pos, s->pos, s->n_tok * sizeof *e->pos);
    memcpy(e->slot, s->slot, s->n_tok * sizeof *e->slot);
    memcpy(e->tok_seq, s->tok_seq, s->n_tok * sizeof *e->tok_seq);
    memcpy(e->rows, s->rows, s->n_rows * sizeof *e->rows);
    for (uint32_t i = 0; i < s->n_seqs; i++) {
        e->tables[i] = s->tables[i];
        e->n_table[i] = s->n_table[i];
    }
    return kvp_engine_run(e, s->n_tok, s->n_rows, s->n_seqs, NULL, err);
}

/* From a SETUP to its STOP: a pool like the driver's (with this rank's
 * heads) and the steps on it. */
static int follow_engine(const kvp_model *shard, kvp_backend *be, const kvp_parallel *d, const kvp_tpmsg_setup *su,
                         kvp_tpmsg_buf *b, kvp_err *err)
{
    if (su->n_layer != whole_layers(shard) || su->n_vocab != shard->cfg.n_vocab)
        return kvp_err_set(err, KVP_EMISMATCH, "parallel job: rank 0's model has %u layers and %u tokens, this "
                           "rank's %u and %u (every rank must load the same model)", su->n_layer, su->n_vocab,
                           whole_layers(shard), shard->cfg.n_vocab);
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
        set_group(e, d);
    while (rc == 0) {
        kvp_tpmsg m;
        if ((rc = recv_msg(d->world, b, err)) < 0 || (rc = kvp_tpmsg_decode(&m, b->w, b->n, su, err)) < 0)
            break;
        if (m.kind == KVP_TPMSG_STOP) {
            kvp_tpmsg_free(&m);
            break;
        }
        rc = m.kind == KVP_TPMSG_STEP      ? follow_step(e, &m.step, err)
             : m.kind == KVP_TPMSG_KV_READ ? send_part(e, m.block, err)
             : m.kind == KVP_TPMSG_KV_WRITE ? recv_part(e, m.block, err)
                                           : kvp_err_set(err, KVP_EFORMAT, "parallel job: message kind %u inside a "
                                                         "run", m.kind);
        kvp_tpmsg_free(&m);
    }
    if (e)
        e->world = NULL; /* a worker sends no STOP */
    kvp_engine_free(e);
    kvp_kvcache_free(kc);
    return rc;
}

int kvp_engine_tp_serve(const kvp_model *shard, kvp_backend *be, const kvp_parallel *d, kvp_err *err)
{
    kvp_tpmsg_buf b = {0};
    int rc = 0;
    for (;;) {
        kvp_tpmsg m;
        if ((rc = recv_msg(d->world, &b, err)) < 0 || (rc = kvp_tpmsg_decode(&m, b.w, b.n, NULL, err)) < 0)
            break;
        if (m.kind == KVP_TPMSG_END)
            break;
        rc = m.kind == KVP_TPMSG_SETUP ? follow_engine(shard, be, d, &m.setup, &b, err)
                                       : kvp_err_set(err, KVP_EFORMAT, "parallel job: message kind %u before a "
                                                     "setup", m.kind);
        kvp_tpmsg_free(&m);
        if (rc < 0)
            break;
    }
    kvp_tpmsg_buf_free(&b);
    return rc;
}
