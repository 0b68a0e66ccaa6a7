/* engine.c - the Llama forward pass over a batch of sequence chunks.
 *
 * For T tokens in the step (all sequences together), d = n_embd:
 *   x[T][d] = embed(tokens)
 *   per layer:  h = rmsnorm(x) * attn_norm
 *               q = h Wq^T [T][n_head*hd], k, v = h Wk^T, h Wv^T [T][n_head_kv*hd]
 *               RoPE(q, k) by position; store k, v in the cache slots
 *               a = attention(q, cached K/V of each token's sequence)
 *               x += a Wo^T
 *               h = rmsnorm(x) * ffn_norm;  x += (silu(h Wg^T) * (h Wu^T)) Wd^T
 *   logits = rmsnorm(x[rows asked]) * output_norm . output^T
 */
#include "argmax.h"
#include "engine.h"
#include "engine_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


/* Give back a buffer from the backend's alloc; NULL, for the pointer
 * that held it. */
static void *release_dev(kvp_engine *e, void *p)
{
    if (p)
        e->be->ops->release(e->be, p);
    return NULL;
}

static void free_buffers(kvp_engine *e)
{
    float **act[] = {&e->x, &e->h, &e->q, &e->k, &e->v, &e->att, &e->g, &e->u, &e->logits, &e->gathered};
    for (size_t i = 0; i < sizeof act / sizeof *act; i++)
        *act[i] = release_dev(e, *act[i]);
    e->d_tok = release_dev(e, e->d_tok), e->d_pos = release_dev(e, e->d_pos), e->d_slot = release_dev(e, e->d_slot);
    e->d_tok_seq = release_dev(e, e->d_tok_seq), e->d_rows = release_dev(e, e->d_rows);
    e->d_parent = release_dev(e, e->d_parent), e->d_kv_pos = release_dev(e, e->d_kv_pos);
    free(e->host_gathered), free(e->host_x), free(e->host_logits);
    e->host_gathered = e->host_x = e->host_logits = NULL;
    free(e->tok_ids), free(e->pos), free(e->slot), free(e->tok_seq), free(e->rows), free(e->parent), free(e->kv_pos);
    free(e->arg_ids), free(e->arg_host);
    e->tok_ids = e->pos = e->parent = e->kv_pos = NULL;
    e->slot = e->tok_seq = e->rows = e->arg_ids = NULL;
    e->arg_host = NULL, e->cap_arg_host = 0;
    e->cap_tok = e->cap_rows = e->hidden_rows = 0;
}

/* The backend's scratch for steps of n_tok tokens whose queries see up to
 * ctx keys (backend.h: sized between steps, never inside one). */
static int reserve(kvp_engine *e, uint32_t n_tok, uint32_t ctx, kvp_err *err)
{
    kvp_backend_reserve r = {.max_tok = n_tok, .max_ctx = ctx, .max_n_in = e->max_n_in,
                             .n_head = e->m->cfg.n_head, .kv = kvp_kvcache_pool(e->kc)};
    int rc = e->be->ops->reserve(e->be, &r, err);
    if (rc == 0)
        e->res_ctx = ctx;
    return rc;
}

int kvp_engine_ensure(kvp_engine *e, uint32_t n_tok, uint32_t n_rows, uint32_t n_seqs, kvp_err *err)
{
    const kvp_config *c = &e->m->cfg;
    if (n_seqs > e->cap_seqs) {
        const uint32_t **t = realloc(e->tables, n_seqs * sizeof *t);
        if (t)
            e->tables = t;
        uint32_t *nt = t ? realloc(e->n_table, n_seqs * sizeof *nt) : NULL;
        if (!nt)
            return kvp_err_set(err, KVP_ENOMEM, "engine: out of memory for %u sequences", n_seqs);
        e->n_table = nt;
        e->cap_seqs = n_seqs;
    }
    if (n_tok <= e->cap_tok && n_rows <= e->cap_rows)
        return 0;
    uint32_t nt = n_tok > e->cap_tok ? n_tok : e->cap_tok, nr = n_rows > e->cap_rows ? n_rows : e->cap_rows;
    free_buffers(e);
    size_t d = c->n_embd, nq = (size_t)c->n_head * c->head_dim, nkv = (size_t)c->n_head_kv * c->head_dim;
    size_t ff = c->n_ff, f = sizeof(float);
    kvp_backend *be = e->be;
    e->x = be->ops->alloc(be, nt * d * f);
    e->h = be->ops->alloc(be, nt * (d > nq ? d : nq) * f);
    e->q = be->ops->alloc(be, nt * nq * f);
    e->k = be->ops->alloc(be, nt * nkv * f);
    e->v = be->ops->alloc(be, nt * nkv * f);
    e->att = be->ops->alloc(be, nt * nq * f);
    e->g = be->ops->alloc(be, nt * ff * f);
    e->u = be->ops->alloc(be, nt * ff * f);
    e->logits = be->ops->alloc(be, (nr ? nr : 1) * (size_t)c->n_vocab * f);
    if (e->tp) { /* every rank's vocabulary slice of every row */
        size_t all = (size_t)e->tp_n * (nr ? nr : 1) * e->vocab_rows * f;
        e->gathered = be->ops->alloc(be, all);
        e->host_gathered = malloc(all);
    }
    int pipe = e->world && (e->prev >= 0 || e->next >= 0);
    e->host_x = pipe ? malloc(nt * d * f) : NULL;
    e->host_logits = e->world && e->rank == e->logits_from ? malloc((nr ? nr : 1) * (size_t)c->n_vocab * f) : NULL;
    e->tok_ids = malloc(nt * sizeof *e->tok_ids);
    e->pos = malloc(nt * sizeof *e->pos);
    e->slot = malloc(nt * sizeof *e->slot);
    e->tok_seq = malloc(nt * sizeof *e->tok_seq);
    e->rows = malloc(nt * sizeof *e->rows);
    e->arg_ids = malloc((nr ? nr : 1) * sizeof *e->arg_ids);
    e->parent = malloc(nt * sizeof *e->parent);
    e->kv_pos = malloc(nt * sizeof *e->kv_pos);
    e->d_parent = be->ops->alloc(be, nt * sizeof *e->d_parent);
    e->d_kv_pos = be->ops->alloc(be, nt * sizeof *e->d_kv_pos);
    e->d_tok = be->ops->alloc(be, nt * sizeof *e->d_tok);
    e->d_pos = be->ops->alloc(be, nt * sizeof *e->d_pos);
    e->d_slot = be->ops->alloc(be, nt * sizeof *e->d_slot);
    e->d_tok_seq = be->ops->alloc(be, nt * sizeof *e->d_tok_seq);
    e->d_rows = be->ops->alloc(be, nt * sizeof *e->d_rows);
    if (!e->x || !e->h || !e->q || !e->k || !e->v || !e->att || !e->g || !e->u || !e->logits || !e->tok_ids ||
        !e->pos || !e->slot || !e->tok_seq || !e->rows || !e->d_tok || !e->d_pos || !e->d_slot || !e->d_tok_seq ||
        !e->arg_ids || !e->parent || !e->kv_pos || !e->d_parent || !e->d_kv_pos ||
        !e->d_rows || (e->tp && (!e->gathered || !e->host_gathered)) || (pipe && !e->host_x) ||
        (e->world && e->rank == e->logits_from && !e->host_logits)) {
        free_buffers(e);
        return kvp_err_set(err, KVP_ENOMEM, "engine: out of memory for a step of %u tokens", nt);
    }
    e->cap_tok = nt;
    e->cap_rows = nr;
    return reserve(e, nt, e->res_ctx, err);
}

/* Every weight the step passes to an op, each with its own copy of the
 * descriptor: the model stays const, the backend keeps its data in dev. */
#define KVP_LAYER_WEIGHTS(L)                                                                                    \
    &(L)->attn_norm, &(L)->wq, &(L)->wk, &(L)->wv, &(L)->bq, &(L)->bk, &(L)->bv, &(L)->wo, &(L)->ffn_norm,    \
        &(L)->w_gate, &(L)->w_up, &(L)->w_down

/* The output head is the embedding table itself (a tied model: kvp_model
 * binds one to the other, and a tensor-parallel rank's sharded head is
 * another weight): prepared once and released once, so a backend that
 * copies weights (the CUDA backend's upload) holds the table once.  The
 * GPU run of 2026-12-04 showed SmolLM2's taking its 30 MB twice. */
static int head_is_embd(const kvp_engine *e)
{
    const kvp_weight *a = &e->tok_embd, *b = &e->output;
    return a->dtype >= 0 && a->data == b->data && a->dtype == b->dtype && a->n_in == b->n_in && a->n_out == b->n_out &&
           a->row_bytes == b->row_bytes && a->scales == b->scales && a->zeros == b->zeros && a->group == b->group &&
           a->scale_stride == b->scale_stride && a->global == b->global;
}

static void release_weights(kvp_engine *e)
{
    kvp_backend *be = e->be;
    for (uint32_t il = 0; il < e->m->cfg.n_layer; il++) {
        kvp_weight *ws[] = {KVP_LAYER_WEIGHTS(&e->layers[il])};
        for (size_t i = 0; i < sizeof ws / sizeof *ws; i++)
            be->ops->release_weight(be, ws[i]);
    }
    if (!head_is_embd(e))
        be->ops->release_weight(be, &e->output);
    be->ops->release_weight(be, &e->tok_embd);
    be->ops->release_weight(be, &e->output_norm);
    be->ops->release_weight(be, &e->rope_freq);
}

static int prepare_one(kvp_engine *e, kvp_weight *w, kvp_err *err)
{
    w->dev = NULL;
    if (w->dtype >= 0 && w->n_in > e->max_n_in)
        e->max_n_in = w->n_in;
    return kvp_backend_prepare(e->be, w, err);
}

static int prepare_weights(kvp_engine *e, kvp_err *err)
{
    const kvp_model *m = e->m;
    int rc = 0;
    e->tok_embd = m->tok_embd, e->output = m->output, e->output_norm = m->output_norm;
    e->rope_freq = (kvp_weight){.name = "rope frequencies", .dtype = KVP_DTYPE_F32, .n_in = m->cfg.rope_dim / 2,
                                .n_out = 1, .row_bytes = (uint64_t)(m->cfg.rope_dim / 2) * sizeof(float),
                                .data = m->inv_freq};
    for (uint32_t il = 0; il < m->cfg.n_layer && rc == 0; il++) {
        e->layers[il] = m->layers[il];
        kvp_weight *ws[] = {KVP_LAYER_WEIGHTS(&e->layers[il])};
        for (size_t i = 0; i < sizeof ws / sizeof *ws && rc == 0; i++)
            rc = prepare_one(e, ws[i], err);
    }
    e->tok_embd.lookup = !head_is_embd(e);
    if (rc == 0 && (rc = prepare_one(e, &e->tok_embd, err)) == 0) {
        if (head_is_embd(e))
            e->output.dev = e->tok_embd.dev;
        else
            rc = prepare_one(e, &e->output, err);
    }
    if (rc == 0 && (rc = prepare_one(e, &e->output_norm, err)) == 0)
        rc = prepare_one(e, &e->rope_freq, err);
    return rc;
}

/* first: m may be the first layers of kc's model (kvp_engine_create_first). */
static int engine_new(kvp_engine **out, const kvp_model *m, kvp_backend *be, kvp_kvcache *kc, int first,
                      kvp_err *err)
{
    *out = NULL;
    const kvp_kv_pool *kv = kvp_kvcache_pool(kc);
    int layers_ok = first ? kv->n_layer >= m->cfg.n_layer : kv->n_layer == m->cfg.n_layer;
    if (!layers_ok || kv->n_head_kv != m->cfg.n_head_kv || kv->head_dim != m->cfg.head_dim)
        return kvp_err_set(err, KVP_EMISMATCH, "engine: KV cache shape (%u layers, %u x %u) is not the model's "
                           "(%u layers, %u x %u)", kv->n_layer, kv->n_head_kv, kv->head_dim, m->cfg.n_layer,
                           m->cfg.n_head_kv, m->cfg.head_dim);
    kvp_engine *e = calloc(1, sizeof *e);
    if (!e || !(e->layers = calloc(m->cfg.n_layer ? m->cfg.n_layer : 1, sizeof *e->layers))) {
        free(e);
        return kvp_err_set(err, KVP_ENOMEM, "engine: out of memory");
    }
    e->m = m;
    e->be = be;
    e->kc = kc;
    e->prev = e->next = e->logits_from = -1; /* alone until kvp_engine_tp_start */
    int rc = prepare_weights(e, err);
    if (rc < 0) {
        kvp_engine_free(e);
        return rc;
    }
    *out = e;
    return 0;
}

int kvp_engine_create(kvp_engine **out, const kvp_model *m, kvp_backend *be, kvp_kvcache *kc, kvp_err *err)
{
    return engine_new(out, m, be, kc, 0, err);
}

int kvp_engine_create_first(kvp_engine **out, const kvp_model *m, kvp_backend *be, kvp_kvcache *kc, kvp_err *err)
{
    return engine_new(out, m, be, kc, 1, err);
}

void kvp_engine_free(kvp_engine *e)
{
    if (!e)
        return;
    kvp_engine_tp_release(e);
    free_buffers(e);
    release_weights(e);
    e->d_flat = release_dev(e, e->d_flat);
    free(e->flat);
    free(e->layers);
    free(e->tables);
    free(e->n_table);
    free(e);
}

/* A row-parallel matmul's partial sums, summed over the ranks (tensor
 * parallelism; alone, nothing to do). */
static int reduce(kvp_engine *e, float *x, size_t n, kvp_err *err)
{
    return e->tp ? e->be->ops->all_reduce(e->be, e->tp, x, n, err) : 0;
}

/* y[j] = x . w[j]^T, j < n: in one op where the backend has matmul_n. */
static int matmul_same_x(kvp_engine *e, const kvp_weight *const *w, uint32_t n, const float *x, float *const *y,
                         uint32_t T, kvp_err *err)
{
    const kvp_backend_ops *op = e->be->ops;
    if (op->matmul_n)
        return op->matmul_n(e->be, w, n, x, y, T, err);
    for (uint32_t j = 0; j < n; j++) {
        int rc = op->matmul(e->be, w[j], x, y[j], T, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* One transformer layer over tokens [t0, t0 + T) of the step (all of them,
 * or one micro-batch of a pipeline stage: every buffer is rows of tokens).
 * Each op's failure stops the layer (an asynchronous backend may report
 * an earlier op's). */
static int layer_forward(kvp_engine *e, uint32_t il, uint32_t t0, uint32_t T, kvp_attn_args *aa, kvp_err *err)
{
    const kvp_config *c = &e->m->cfg;
    const kvp_layer *L = &e->layers[il];
    const kvp_backend_ops *op = e->be->ops;
    kvp_backend *be = e->be;
    uint32_t d = c->n_embd, nq = c->n_head * c->head_dim, nkv = c->n_head_kv * c->head_dim;
    float eps = (float)c->rms_eps;
    float *x = e->x + (size_t)t0 * d, *h = e->h + (size_t)t0 * d, *q = e->q + (size_t)t0 * nq;
    float *k = e->k + (size_t)t0 * nkv, *v = e->v + (size_t)t0 * nkv, *att = e->att + (size_t)t0 * nq;
    float *g = e->g + (size_t)t0 * c->n_ff, *u = e->u + (size_t)t0 * c->n_ff;
    const int32_t *pos = e->d_pos + t0;
    int rc;

    const kvp_weight *qkv[3] = {&L->wq, &L->wk, &L->wv}, *gate_up[2] = {&L->w_gate, &L->w_up};
    float *qkv_out[3] = {q, k, v}, *gate_up_out[2] = {g, u};
    if ((rc = op->rmsnorm(be, x, &L->attn_norm, h, T, d, eps, err)) < 0 ||
        (rc = matmul_same_x(e, qkv, 3, h, qkv_out, T, err)) < 0)
        return rc;
    if (L->bq.dtype >= 0 &&
        ((rc = op->add_bias(be, q, &L->bq, T, nq, err)) < 0 || (rc = op->add_bias(be, k, &L->bk, T, nkv, err)) < 0 ||
         (rc = op->add_bias(be, v, &L->bv, T, nkv, err)) < 0))
        return rc;
    if ((rc = op->rope(be, q, T, c->n_head, c->head_dim, c->rope_dim, pos, &e->rope_freq, (int)c->rope_type,
                       err)) < 0 ||
        (rc = op->rope(be, k, T, c->n_head_kv, c->head_dim, c->rope_dim, pos, &e->rope_freq, (int)c->rope_type,
                       err)) < 0)
        return rc;
    /* All K/V of this layer are stored before any token attends (kvcache.h);
     * a micro-batch's tokens attend only to earlier ones, stored first. */
    if ((rc = op->kv_store(be, kvp_kvcache_pool(e->kc), il, k, v, T, e->d_slot + t0, err)) < 0)
        return rc;
    aa->layer = il;
    aa->q = q, aa->out = att, aa->n_tok = T, aa->pos = pos, aa->tok_seq = e->d_tok_seq + t0;
    aa->host_pos = e->pos + t0, aa->host_tok_seq = e->tok_seq + t0;
    /* a tree's parents are step indices: a step with one is never cut
     * into micro-batches (kvp_engine_step refuses it under parallelism) */
    aa->parent = e->tree ? e->d_parent : NULL, aa->kv_pos = e->tree ? e->d_kv_pos : NULL;
    aa->host_parent = e->tree ? e->parent : NULL, aa->host_kv_pos = e->tree ? e->kv_pos : NULL;
    if ((rc = op->attention(be, aa, err)) < 0 || (rc = op->matmul(be, &L->wo, att, h, T, err)) < 0 ||
        (rc = reduce(e, h, (size_t)T * d, err)) < 0 || (rc = op->add(be, x, h, (size_t)T * d, err)) < 0)
        return rc;

    if ((rc = op->rmsnorm(be, x, &L->ffn_norm, h, T, d, eps, err)) < 0 ||
        (rc = matmul_same_x(e, gate_up, 2, h, gate_up_out, T, err)) < 0 ||
        (rc = op->silu_mul(be, g, u, (size_t)T * c->n_ff, err)) < 0 ||
        (rc = op->matmul(be, &L->w_down, g, h, T, err)) < 0 || (rc = reduce(e, h, (size_t)T * d, err)) < 0)
        return rc;
    return op->add(be, x, h, (size_t)T * d, err);
}

static float *arg_host(kvp_engine *e, uint32_t rows, kvp_err *err);

/* A NaN in the weights or in a KV stream's blocks spreads through a step:
 * no token may be chosen from it.  The sampled rows' logits come to the
 * host and are checked there (batch.c, generate.c); the greedy rows'
 * argmax is picked where they are, so their hidden states (n_embd floats a
 * row, not n_vocab) are brought over and checked here. */
static int check_greedy_rows(kvp_engine *e, uint32_t H, kvp_err *err)
{
    size_t d = e->m->cfg.n_embd, n = (size_t)e->n_argmax * d, V = e->m->cfg.n_vocab;
    float *hh = arg_host(e, (uint32_t)((n + V - 1) / V), err); /* rows of n_vocab floats enough for n */
    if (!hh)
        return err->code;
    int rc = e->be->ops->to_host(e->be, hh, e->h + (size_t)H * d, n * sizeof *hh, err);
    if (rc < 0)
        return rc;
    size_t bad = kvp_first_nonfinite_f32(hh, n);
    return bad < n ? kvp_err_set(err, KVP_EFORMAT, "the hidden state of the step's greedy row %zu holds NaN or "
                                 "infinity, so would its logits: the model's weights or the KV blocks it read hold "
                                 "non-finite values", bad / d)
                   : 0;
}

/* The logits rows: alone, straight to the host; under tensor parallelism
 * each rank projects its vocabulary rows and the slices are gathered. */
static int project(kvp_engine *e, uint32_t R, float *logits, kvp_err *err)
{
    const kvp_config *c = &e->m->cfg;
    const kvp_backend_ops *op = e->be->ops;
    kvp_backend *be = e->be;
    int rc;
    if ((rc = op->matmul(be, &e->output, e->h, e->logits, R, err)) < 0)
        return rc;
    if (!e->tp) { /* the rows asked for to the host, then the greedy ones' ids (kvp_engine_step) */
        uint32_t H = R - e->n_argmax; /* R > 0 here */
        if (H && (rc = op->to_host(be, logits, e->logits, (size_t)H * c->n_vocab * sizeof(float), err)) < 0)
            return rc;
        if (!e->n_argmax)
            return 0;
        /* the ids first: argmax_rows waits for the step, so the check's
         * copy does not stall a device between the head and the argmax */
        if ((rc = op->argmax_rows(be, e->logits + (size_t)H * c->n_vocab, e->n_argmax, c->n_vocab, e->arg_ids,
                                  err)) < 0)
            return rc;
        return check_greedy_rows(e, H, err);
    }
    /* Each rank's slice is [R][its rows], packed; the last rank may hold
     * fewer rows than vocab_rows, the rest of its piece is unused. */
    size_t piece = (size_t)R * e->vocab_rows;
    if ((rc = op->all_gather(be, e->tp, e->logits, e->gathered, piece, err)) < 0 || !logits ||
        (rc = op->to_host(be, e->host_gathered, e->gathered, piece * (size_t)e->tp_n * sizeof(float), err)) < 0)
        return rc;
    for (int q = 0; q < e->tp_n; q++) {
        uint32_t v0 = (uint32_t)q * e->vocab_rows;
        uint32_t nv = c->n_vocab - v0 < e->vocab_rows ? c->n_vocab - v0 : e->vocab_rows;
        const float *src = e->host_gathered + (size_t)q * piece;
        for (uint32_t i = 0; i < R; i++)
            memcpy(logits + (size_t)i * c->n_vocab + v0, src + (size_t)i * nv, nv * sizeof(float));
    }
    return 0;
}

/* Micro-batches of a step of T tokens: one without pipeline stages; with
 * them, twice the stages (a step's bubble is then a third of what one
 * batch leaves), but at least 16 tokens each: a decode step's few tokens
 * would read the weights once a micro-batch for no gain.  Every rank
 * derives the same count from T. */
static uint32_t micro_batches(const kvp_engine *e, uint32_t T)
{
    if (e->pp_n <= 1)
        return 1;
    uint32_t want = 2 * (uint32_t)e->pp_n, fit = T / 16;
    return fit < 1 ? 1 : fit < want ? fit : want;
}

/* The block tables of the step's n_seqs sequences as one [n_seqs][stride]
 * array (stride: the longest table), on the host and the device. */
static int upload_tables(kvp_engine *e, uint32_t n_seqs, uint32_t *stride, kvp_err *err)
{
    uint32_t w = 1;
    for (uint32_t i = 0; i < n_seqs; i++)
        w = e->n_table[i] > w ? e->n_table[i] : w;
    size_t n = (size_t)(n_seqs ? n_seqs : 1) * w;
    if (n > e->cap_flat) {
        size_t cap = n > 2 * e->cap_flat ? n : 2 * e->cap_flat;
        free(e->flat);
        e->d_flat = release_dev(e, e->d_flat);
        e->cap_flat = 0;
        if (!(e->flat = malloc(cap * sizeof *e->flat)) ||
            !(e->d_flat = e->be->ops->alloc(e->be, cap * sizeof *e->d_flat)))
            return kvp_err_set(err, KVP_ENOMEM, "engine: out of memory for the block tables of %u sequences",
                               n_seqs);
        e->cap_flat = cap;
    }
    for (uint32_t i = 0; i < n_seqs; i++) {
        memcpy(e->flat + (size_t)i * w, e->tables[i], (size_t)e->n_table[i] * sizeof *e->flat);
        memset(e->flat + (size_t)i * w + e->n_table[i], 0, (size_t)(w - e->n_table[i]) * sizeof *e->flat);
    }
    *stride = w;
    return e->be->ops->from_host(e->be, e->d_flat, e->flat, n * sizeof *e->flat, err);
}

/* The step's metadata to the device, and the backend's scratch grown to
 * its longest context first (between steps: backend.h). */
static int upload_step(kvp_engine *e, uint32_t T, uint32_t R, uint32_t n_seqs, kvp_attn_args *aa, kvp_err *err)
{
    const kvp_backend_ops *op = e->be->ops;
    kvp_backend *be = e->be;
    uint32_t ctx = 0, stride = 0;
    for (uint32_t t = 0; t < T; t++)
        ctx = (uint32_t)e->pos[t] + 1 > ctx ? (uint32_t)e->pos[t] + 1 : ctx;
    int rc = 0;
    if (ctx > e->res_ctx) /* doubling: a growing sequence reserves rarely */
        rc = reserve(e, e->cap_tok, ctx > 2 * e->res_ctx ? ctx : 2 * e->res_ctx, err);
    if (rc < 0 || (rc = upload_tables(e, n_seqs, &stride, err)) < 0 ||
        (rc = op->from_host(be, e->d_tok, e->tok_ids, T * sizeof *e->tok_ids, err)) < 0 ||
        (rc = op->from_host(be, e->d_pos, e->pos, T * sizeof *e->pos, err)) < 0 ||
        (rc = op->from_host(be, e->d_slot, e->slot, T * sizeof *e->slot, err)) < 0 ||
        (rc = op->from_host(be, e->d_tok_seq, e->tok_seq, T * sizeof *e->tok_seq, err)) < 0 ||
        (R && (rc = op->from_host(be, e->d_rows, e->rows, R * sizeof *e->rows, err)) < 0) ||
        (e->tree && ((rc = op->from_host(be, e->d_parent, e->parent, T * sizeof *e->parent, err)) < 0 ||
                     (rc = op->from_host(be, e->d_kv_pos, e->kv_pos, T * sizeof *e->kv_pos, err)) < 0)))
        return rc;
    aa->tables = e->d_flat, aa->table_stride = stride, aa->n_seq = n_seqs, aa->max_ctx = ctx;
    return 0;
}

int kvp_engine_run(kvp_engine *e, uint32_t T, uint32_t R, uint32_t n_seqs, float *logits, kvp_err *err)
{
    const kvp_config *c = &e->m->cfg;
    const kvp_backend_ops *op = e->be->ops;
    kvp_backend *be = e->be;
    e->hidden_rows = 0;
    kvp_attn_args aa = {.n_head = c->n_head, .scale = 1.0f / sqrtf((float)c->head_dim),
                        .kv = kvp_kvcache_pool(e->kc)};
    size_t d = c->n_embd;
    int rc = upload_step(e, T, R, n_seqs, &aa, err);
    /* Pipeline stages take the step in micro-batches, so stage s computes
     * one while stage s + 1 computes the one before (micro_batches). */
    uint32_t M = micro_batches(e, T);
    for (uint32_t mb = 0; mb < M && rc == 0; mb++) {
        uint32_t t0 = (uint32_t)((uint64_t)T * mb / M), n = (uint32_t)((uint64_t)T * (mb + 1) / M) - t0;
        size_t xb = (size_t)n * d * sizeof(float);
        float *x = e->x + (size_t)t0 * d;
        if (e->prev < 0)
            rc = op->embed(be, &e->tok_embd, e->d_tok + t0, n, x, err);
        else if ((rc = kvp_comm_recv(e->world, e->host_x, xb, e->prev, KVP_TAG_HIDDEN, err)) == 0)
            rc = op->from_host(be, x, e->host_x, xb, err);
        for (uint32_t il = 0; il < c->n_layer && rc == 0; il++)
            rc = layer_forward(e, il, t0, n, &aa, err);
        if (rc == 0 && e->next >= 0 && (rc = op->to_host(be, e->host_x, x, xb, err)) == 0) /* the next stage goes on */
            rc = kvp_comm_send(e->world, e->host_x, xb, e->next, KVP_TAG_HIDDEN, err);
    }
    if (rc < 0)
        return rc;
    if (e->next >= 0) { /* the last stage has the logits */
        if (!R || e->rank)
            return rc;
        return kvp_comm_recv(e->world, logits, (size_t)R * c->n_vocab * sizeof(float), e->logits_from,
                             KVP_TAG_LOGITS, err);
    }
    if (!R)
        return op->synchronize(be, err);
    /* Gather the rows asked for, then norm and project only those. */
    if ((rc = op->gather_rows(be, e->h, e->x, e->d_rows, R, c->n_embd, err)) < 0 ||
        (rc = op->rmsnorm(be, e->h, &e->output_norm, e->h, R, c->n_embd, (float)c->rms_eps, err)) < 0)
        return rc;
    e->hidden_rows = R;
    if (e->rank != e->logits_from || e->rank == 0)
        return project(e, R, logits, err);
    /* the last stage's first rank: to rank 0, which waits in its own stage */
    if ((rc = project(e, R, e->host_logits, err)) < 0)
        return rc;
    return kvp_comm_send(e->world, e->host_logits, (size_t)R * c->n_vocab * sizeof(float), 0, KVP_TAG_LOGITS, err);
}

/* Medusa heads and their training need one process's whole output head. */
static int check_alone(const kvp_engine *e, const char *what, kvp_err *err)
{
    if (e->world)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "engine: %s under tensor or pipeline parallelism", what);
    return 0;
}

int kvp_engine_hidden(kvp_engine *e, float *out, uint32_t R, kvp_err *err)
{
    int rc = check_alone(e, "hidden states", err);
    if (rc < 0)
        return rc;
    if (R > e->hidden_rows)
        return kvp_err_set(err, KVP_EINVAL, "engine: %u hidden rows asked for, the last step left %u", R,
                           e->hidden_rows);
    size_t bytes = (size_t)R * e->m->cfg.n_embd * sizeof(float);
    return R ? e->be->ops->to_host(e->be, out, e->h, bytes, err) : 0;
}

int kvp_engine_project(kvp_engine *e, const float *h, uint32_t R, float *logits, kvp_err *err)
{
    int rc = check_alone(e, "projecting hidden states", err);
    if (rc < 0 || R == 0 || (rc = kvp_engine_ensure(e, R, R, 1, err)) < 0)
        return rc;
    e->hidden_rows = 0; /* e->h is overwritten */
    size_t bytes = (size_t)R * e->m->cfg.n_embd * sizeof(float);
    if ((rc = e->be->ops->from_host(e->be, e->h, h, bytes, err)) < 0)
        return rc;
    return project(e, R, logits, err);
}

/* A draft tree's parents (kvp_step_seq.parent): each -1 or an earlier
 * token of the sequence's entry, no path longer than KVP_TREE_MAX_DEPTH,
 * on a backend that takes trees, in one process (the step messages of
 * tensor and pipeline parallelism carry no tree). */
static int check_tree(const kvp_engine *e, const kvp_step_seq *s, kvp_err *err)
{
    if (!s->parent)
        return 0;
    if (!kvp_engine_takes_trees(e))
        return kvp_err_set(err, KVP_EUNSUPPORTED, "engine: draft trees need a backend that takes them (%s does%s) "
                           "in one process", e->be->ops->name,
                           e->be->ops->supports(e->be, KVP_USE_TREE, 0, 0) ? "" : " not");
    uint8_t depth[KVP_TREE_STEP_MAX];
    if (s->n_tokens > KVP_TREE_STEP_MAX)
        return kvp_err_set(err, KVP_ELIMIT, "engine: a draft tree of %u tokens (at most %u)", s->n_tokens,
                           KVP_TREE_STEP_MAX);
    for (uint32_t j = 0; j < s->n_tokens; j++) {
        int32_t p = s->parent[j];
        if (p < -1 || p >= (int32_t)j)
            return kvp_err_set(err, KVP_EINVAL, "engine: draft tree token %u has parent %d (-1 or an earlier token)",
                               j, p);
        depth[j] = p < 0 ? 1 : (uint8_t)(depth[p] + 1);
        if (depth[j] > KVP_TREE_MAX_DEPTH)
            return kvp_err_set(err, KVP_ELIMIT, "engine: a draft tree path of more than %u tokens",
                               KVP_TREE_MAX_DEPTH);
    }
    return 0;
}

/* Undo the appends of a failed step. */
static void rollback(kvp_engine *e, const kvp_step_seq *seqs, uint32_t n, const uint32_t *old_len)
{
    for (uint32_t i = 0; i < n; i++)
        kvp_kvcache_seq_truncate(e->kc, seqs[i].seq, old_len[i], NULL);
}

/* The greedy rows' logits when the backend cannot pick on the device (no
 * argmax_rows) or the rows come from other ranks: all R + A rows to the
 * host first, in e->arg_host. */
static float *arg_host(kvp_engine *e, uint32_t rows, kvp_err *err)
{
    size_t n = (size_t)rows * e->m->cfg.n_vocab;
    if (n > e->cap_arg_host) {
        float *p = realloc(e->arg_host, n * sizeof *p);
        if (!p) {
            kvp_err_set(err, KVP_ENOMEM, "engine: out of memory for %u rows of logits", rows);
            return NULL;
        }
        e->arg_host = p, e->cap_arg_host = n;
    }
    return e->arg_host;
}

/* The ids s asks for instead of rows: every token's, its last one's, or none. */
static uint32_t ids_wanted(const kvp_step_seq *s)
{
    return s->want == KVP_LOGITS_ARGMAX_ALL ? s->n_tokens : s->want == KVP_LOGITS_ARGMAX && s->n_tokens > 0;
}

/* After a step with A greedy rows (the last A of R + A): their ids to the
 * sequences that asked, in order; picked here from host rows when the
 * backend did not (out is then arg_host, whose first R rows go to logits). */
static void give_argmax(kvp_engine *e, const kvp_step_seq *seqs, uint32_t n_seqs, uint32_t R, uint32_t A,
                        const float *out, float *logits)
{
    uint32_t V = e->m->cfg.n_vocab;
    if (out != logits) {
        if (R)
            memcpy(logits, out, (size_t)R * V * sizeof *out);
        for (uint32_t k = 0; k < A; k++)
            e->arg_ids[k] = kvp_argmax_f32(out + (size_t)(R + k) * V, V);
    }
    for (uint32_t i = 0, k = 0; i < n_seqs; i++) {
        uint32_t n = ids_wanted(&seqs[i]);
        if (n)
            memcpy(seqs[i].argmax, e->arg_ids + k, n * sizeof *e->arg_ids);
        k += n;
    }
}

int kvp_engine_step(kvp_engine *e, const kvp_step_seq *seqs, uint32_t n_seqs, float *logits, kvp_err *err)
{
    const kvp_config *c = &e->m->cfg;
    uint64_t T64 = 0, R64 = 0, A64 = 0;
    int tree = 0;
    for (uint32_t i = 0; i < n_seqs; i++) {
        int rc = check_tree(e, &seqs[i], err);
        if (rc < 0)
            return rc;
        int ids = seqs[i].want == KVP_LOGITS_ARGMAX || seqs[i].want == KVP_LOGITS_ARGMAX_ALL;
        if (ids && !seqs[i].argmax)
            return kvp_err_set(err, KVP_EINVAL, "engine: sequence %d asks for its argmax but gives no place for it",
                               seqs[i].seq);
        tree |= seqs[i].parent != NULL;
        T64 += seqs[i].n_tokens;
        R64 += seqs[i].want == KVP_LOGITS_ALL ? seqs[i].n_tokens : seqs[i].want == KVP_LOGITS_LAST && seqs[i].n_tokens;
        A64 += ids_wanted(&seqs[i]);
        for (uint32_t j = 0; j < i; j++)
            if (seqs[j].seq == seqs[i].seq)
                return kvp_err_set(err, KVP_EINVAL, "engine: sequence %d appears twice in one step", seqs[i].seq);
    }
    if (T64 == 0)
        return 0;
    if (T64 > (1u << 20))
        return kvp_err_set(err, KVP_ELIMIT, "engine: %llu tokens in one step (at most %u)", (unsigned long long)T64,
                           1u << 20);
    if (R64 && !logits)
        return kvp_err_set(err, KVP_EINVAL, "engine: logits asked for but no buffer given");
    uint32_t T = (uint32_t)T64, R = (uint32_t)R64, A = (uint32_t)A64;
    int rc = kvp_engine_ensure(e, T, R + A, n_seqs, err);
    if (rc < 0)
        return rc;
    /* the greedy rows can come back as ids alone: one process, a backend
     * that picks them (argmax_rows); else as rows, through arg_host */
    int on_device = A && !e->world && e->be->ops->argmax_rows;
    float *out = A && !on_device ? arg_host(e, R + A, err) : logits;
    if (A && !on_device && !out)
        return KVP_ENOMEM;
    uint32_t *old_len = malloc(((size_t)n_seqs + A + 1) * sizeof *old_len);
    if (!old_len)
        return kvp_err_set(err, KVP_ENOMEM, "engine: out of memory");
    uint32_t *arg_tok = old_len + n_seqs; /* the greedy rows' tokens [A], after the others */

    /* Reserve cache slots and lay the step's tokens out. */
    uint32_t t = 0, r = 0, a = 0, n_app = 0;
    for (uint32_t i = 0; i < n_seqs; i++, n_app++) {
        const kvp_step_seq *s = &seqs[i];
        old_len[i] = kvp_kvcache_seq_len(e->kc, s->seq);
        /* a tree's rows are not the sequence's tokens in order: no block of
         * them is registered for reuse (kvp_kvcache_seq_keep_path does,
         * once the path that stays is known) */
        if ((rc = (s->parent ? kvp_kvcache_seq_append_draft : kvp_kvcache_seq_append)(e->kc, s->seq, s->tokens,
                                                                                    s->n_tokens, e->slot + t, err)) < 0)
            goto fail;
        uint32_t t_first = t;
        for (uint32_t j = 0; j < s->n_tokens; j++, t++) {
            if (s->tokens[j] >= c->n_vocab) {
                n_app++;
                rc = kvp_err_set(err, KVP_EINVAL, "engine: token id %u is outside the vocabulary of %u",
                                 s->tokens[j], c->n_vocab);
                goto fail;
            }
            e->tok_ids[t] = (int32_t)s->tokens[j];
            e->pos[t] = (int32_t)(old_len[i] + j);
            e->kv_pos[t] = e->pos[t], e->parent[t] = -1;
            if (s->parent && s->parent[j] >= 0) { /* one past its parent, whose row it follows */
                e->parent[t] = (int32_t)t_first + s->parent[j];
                e->pos[t] = e->pos[e->parent[t]] + 1;
            } else if (s->parent) {
                e->pos[t] = (int32_t)old_len[i];
            }
            e->tok_seq[t] = i;
            if (s->want == KVP_LOGITS_ALL || (s->want == KVP_LOGITS_LAST && j + 1 == s->n_tokens))
                e->rows[r++] = t;
            else if (s->want == KVP_LOGITS_ARGMAX_ALL || (s->want == KVP_LOGITS_ARGMAX && j + 1 == s->n_tokens))
                arg_tok[a++] = t;
        }
    }
    if (A)
        memcpy(e->rows + R, arg_tok, A * sizeof *arg_tok);
    for (uint32_t i = 0; i < n_seqs; i++) {
        e->tables[i] = kvp_kvcache_seq_blocks(e->kc, seqs[i].seq);
        e->n_table[i] = kvp_kvcache_seq_n_blocks(e->kc, seqs[i].seq);
    }

    e->tree = tree;
    if (e->world && (rc = kvp_engine_tp_send_step(e, T, R + A, n_seqs, err)) < 0)
        goto fail;
    e->n_argmax = on_device ? A : 0;
    rc = kvp_engine_run(e, T, R + A, n_seqs, out, err);
    e->n_argmax = 0;
    if (rc < 0)
        goto fail;
    if (A)
        give_argmax(e, seqs, n_seqs, R, A, out, logits);
    free(old_len);
    return (int)R;
fail:
    rollback(e, seqs, n_app < n_seqs ? n_app : n_seqs, old_len);
    free(old_len);
    return rc;
}

int kvp_engine_takes_trees(const kvp_engine *e)
{
    return !e->world && e->be->ops->supports(e->be, KVP_USE_TREE, 0, 0);
}

uint32_t kvp_engine_n_vocab(const kvp_engine *e) { return e->m->cfg.n_vocab; }

uint32_t kvp_engine_n_embd(const kvp_engine *e) { return e->m->cfg.n_embd; }

void kvp_engine_set_cancel(kvp_engine *e, const volatile sig_atomic_t *flag) { e->cancel = e->world ? NULL : flag; }

int kvp_engine_prefill(kvp_engine *e, int seq, const uint32_t *tokens, uint32_t n, uint32_t chunk, float *last_logits,
                       kvp_err *err)
{
    if (n == 0)
        return kvp_err_set(err, KVP_EINVAL, "engine: empty prompt");
    if (chunk == 0)
        chunk = 512;
    uint32_t done = 0;
    if (kvp_kvcache_seq_len(e->kc, seq) == 0) {
        int got = kvp_kvcache_seq_share_prefix(e->kc, seq, tokens, n, err);
        if (got < 0)
            return got;
        done = (uint32_t)got;
    }
    while (done < n) {
        if (e->cancel && *e->cancel)
            return kvp_err_set(err, KVP_EINTR, "stopped after %u of the prompt's %u tokens", done, n);
        uint32_t k = n - done < chunk ? n - done : chunk;
        int last = done + k == n;
        kvp_step_seq s = {.seq = seq, .tokens = tokens + done, .n_tokens = k,
                          .want = last && last_logits ? KVP_LOGITS_LAST : KVP_LOGITS_NONE};
        int rc = kvp_engine_step(e, &s, 1, last ? last_logits : NULL, err);
        if (rc < 0)
            return rc;
        done += k;
    }
    return 0;
}
