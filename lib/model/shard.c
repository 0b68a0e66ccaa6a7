/* shard.c - a rank's slices of a model's weights (shard.h). */
#include "shard.h"

#include "tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

uint32_t kvp_shard_vocab_rows(uint32_t n_vocab, uint32_t n) { return n ? (n_vocab + n - 1) / n : n_vocab; }

/* Why c does not split over n ranks (an error set in err), or 0. */
static int split_fault(const kvp_config *c, uint32_t n, kvp_err *err)
{
    if (n == 0)
        return kvp_err_set(err, KVP_EINVAL, "tensor parallelism over 0 ranks");
    if (c->n_head % n)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "tensor parallelism over %u ranks: %u query heads do not split "
                           "evenly", n, c->n_head);
    /* MLA's latent is one vector, replicated on every rank */
    if (!c->kv_lora_rank && c->n_head_kv && c->n_head_kv % n && n % c->n_head_kv)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "tensor parallelism over %u ranks: %u KV heads neither split "
                           "evenly nor replicate evenly (a divisor or a multiple of %u would)", n, c->n_head_kv,
                           c->n_head_kv);
    if (c->n_ff % n)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "tensor parallelism over %u ranks: the FFN width %u does not "
                           "split evenly", n, c->n_ff);
    if (c->n_expert && c->n_ff_expert % n)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "tensor parallelism over %u ranks: the experts' FFN width %u does "
                           "not split evenly", n, c->n_ff_expert);
    if (c->n_vocab && (uint64_t)kvp_shard_vocab_rows(c->n_vocab, n) * (n - 1) >= c->n_vocab)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "tensor parallelism over %u ranks: a vocabulary of %u leaves the "
                           "last rank no rows", n, c->n_vocab);
    return 0;
}

/* Whether a column slice of w of nc columns (and one from column c0)
 * falls between its quantization blocks and scale groups. */
static int cuts_whole(const kvp_weight *w, uint32_t c0, uint32_t nc)
{
    if (w->dtype < 0)
        return 1;
    int64_t off = kvp_dtype_row_bytes((uint32_t)w->dtype, c0), rb = kvp_dtype_row_bytes((uint32_t)w->dtype, nc);
    int grouped = w->scales && w->scale_stride > 1;
    return off >= 0 && rb > 0 && kvp_dtype_row_bytes((uint32_t)w->dtype, (int64_t)c0 + nc) == off + rb &&
           !(grouped && (c0 % w->group || nc % w->group));
}

/* Why m's weights do not split over n ranks whose shape does (the
 * attention output and FFN down projections are cut by columns: a slice
 * must be whole blocks, e.g. of 256 for the K-quants), or 0. */
static int weights_fault(const kvp_model *m, uint32_t n, kvp_err *err)
{
    const kvp_config *c = &m->cfg;
    uint32_t nh = c->n_head / n * c->head_dim, ff = c->n_ff / n;
    for (uint32_t l = 0; m->layers && l < c->n_layer; l++) {
        const kvp_weight *w[2] = {&m->layers[l].wo, &m->layers[l].w_down};
        uint32_t nc[2] = {nh, ff};
        for (int i = 0; i < 2; i++)
            if (!cuts_whole(w[i], nc[i], nc[i]))
                return kvp_err_set(err, KVP_EUNSUPPORTED, "tensor parallelism over %u ranks: tensor %s (%s%s) "
                                   "cannot be cut into slices of %u of its %u columns (whole %s)", n,
                                   w[i]->name ? w[i]->name : "?", kvp_dtype_name((uint32_t)w[i]->dtype),
                                   w[i]->scales && w[i]->scale_stride > 1 ? " with group scales" : "", nc[i],
                                   w[i]->n_in, w[i]->scales && w[i]->scale_stride > 1 ? "scale groups" : "blocks");
    }
    return 0;
}

/* Why slices of whole blocks (scale groups) of u's columns do not cut c's
 * attention output and FFN down projections over n ranks, or 0.  One rank
 * takes whole rows, whatever their blocks. */
static int unit_fault(const kvp_config *c, kvp_col_units u, uint32_t n, kvp_err *err)
{
    uint32_t nh = c->n_head / n * c->head_dim, ff = c->n_ff / n;
    if (n <= 1)
        return 0;
    if (u.attn > 1 && nh && nh % u.attn)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "tensor parallelism over %u ranks: the attention output's slices "
                           "of %u columns are not whole blocks of %u", n, nh, u.attn);
    if (u.ffn > 1 && ff && ff % u.ffn)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "tensor parallelism over %u ranks: the FFN down projection's "
                           "slices of %u columns are not whole blocks of %u", n, ff, u.ffn);
    return 0;
}

static int fault(const kvp_config *c, const kvp_model *m, kvp_col_units unit, uint32_t n, kvp_err *err)
{
    int rc = split_fault(c, n, err);
    if (rc == 0)
        rc = unit_fault(c, unit, n, err);
    return rc < 0 || !m ? rc : weights_fault(m, n, err);
}

/* c's split (m's weights, or slices of unit columns, too, when given)
 * over n ranks, naming the rank counts that work when it does not. */
static int check_split(const kvp_config *c, const kvp_model *m, kvp_col_units unit, uint32_t n, kvp_err *err)
{
    int rc = fault(c, m, unit, n, err);
    if (rc == 0 || n == 0)
        return rc;
    /* the rank counts (to 64) that pass every check, not one check's
     * divisors: 9 divides SmolLM2's 9 heads but not its FFN width */
    char ok[256];
    size_t at = 0;
    ok[0] = 0;
    for (uint32_t d = 1; d <= 64 && at + 16 < sizeof ok; d++) {
        kvp_err e = {0};
        if (fault(c, m, unit, d, &e) == 0)
            at += (size_t)snprintf(ok + at, sizeof ok - at, "%s%u", at ? ", " : "", d);
    }
    kvp_err why = {0};
    fault(c, m, unit, n, &why);
    return kvp_err_set(err, rc, "%s (rank counts that split this model: %s)", why.msg, ok);
}

int kvp_shard_check_split(const kvp_config *c, uint32_t n, kvp_err *err)
{
    return check_split(c, NULL, (kvp_col_units){0, 0}, n, err);
}

int kvp_shard_check_split_cols(const kvp_config *c, kvp_col_units u, uint32_t n, kvp_err *err)
{
    return check_split(c, NULL, u, n, err);
}

int kvp_shard_check_model(const kvp_model *m, uint32_t n, kvp_err *err)
{
    int rc = check_split(&m->cfg, m, (kvp_col_units){0, 0}, n, err);
    if (rc < 0)
        return rc;
    return kvp_shard_check(&m->cfg, n, err);
}

int kvp_shard_check(const kvp_config *c, uint32_t n, kvp_err *err)
{
    int rc = kvp_shard_check_split(c, n, err);
    if (rc < 0)
        return rc;
    if (c->n_expert || c->kv_lora_rank)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "tensor parallelism: %s models (experts or MLA) are not split",
                           c->arch);
    return 0;
}

/* Rows [r0, r0 + nr) of w, in place. */
static kvp_weight rows(const kvp_weight *w, uint32_t r0, uint32_t nr)
{
    kvp_weight v = *w;
    if (w->dtype < 0)
        return v;
    v.n_out = nr;
    v.data = (const uint8_t *)w->data + (uint64_t)r0 * w->row_bytes;
    v.dev = NULL;
    if (w->scales && w->scale_stride)
        v.scales = w->scales + (uint64_t)r0 * w->scale_stride;
    if (w->zeros && w->scale_stride)
        v.zeros = w->zeros + (uint64_t)r0 * w->scale_stride;
    return v;
}

/* A 1-D weight's elements [e0, e0 + ne) (the biases of row slices). */
static kvp_weight elems(const kvp_weight *w, uint32_t e0, uint32_t ne)
{
    kvp_weight v = *w;
    if (w->dtype < 0)
        return v;
    v.n_in = ne;
    v.data = (const float *)w->data + e0;
    v.row_bytes = (uint64_t)ne * sizeof(float);
    return v;
}

/* Per-row scale groups of a column slice: scales[r][g0 .. g0 + ng) copied. */
static const float *slice_groups(kvp_model *s, const float *src, uint32_t n_out, uint32_t stride, uint32_t g0,
                                 uint32_t ng)
{
    float *dst = kvp_model_own(s, (uint64_t)n_out * ng * sizeof(float));
    if (!dst)
        return NULL;
    for (uint32_t r = 0; r < n_out; r++)
        memcpy(dst + (uint64_t)r * ng, src + (uint64_t)r * stride + g0, ng * sizeof(float));
    return dst;
}

/* The pages of a whole tensor this rank copied its columns from leave its
 * resident memory (each rank keeps ~1/n of the weights); they stay in the
 * page cache for the other ranks.  Only for the mapped file: dropping a
 * private copy's pages would lose them. */
static void give_back(const kvp_model *m, const void *p, uint64_t n)
{
    if (!kvp_model_file_backed(m, p, n))
        return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = ((uintptr_t)p + page - 1) & ~(page - 1);
    uintptr_t b = ((uintptr_t)p + (uintptr_t)n) & ~(page - 1);
    if (b > a)
        madvise((void *)a, b - a, MADV_DONTNEED);
}

/* Columns [c0, c0 + nc) of w, copied (one piece of every row). */
static int cols(kvp_model *s, const kvp_weight *w, uint32_t c0, uint32_t nc, kvp_weight *out, kvp_err *err)
{
    *out = *w;
    int64_t off = kvp_dtype_row_bytes((uint32_t)w->dtype, c0), rb = kvp_dtype_row_bytes((uint32_t)w->dtype, nc);
    int grouped = w->scales && w->scale_stride > 1;
    if (!cuts_whole(w, c0, nc)) /* kvp_shard_check_model said so first */
        return kvp_err_set(err, KVP_EUNSUPPORTED, "tensor %s: %s%s cannot be cut into columns %u to %u of %u (a cut "
                           "must fall between %s)", w->name, kvp_dtype_name((uint32_t)w->dtype),
                           grouped ? " with group scales" : "", c0, c0 + nc, w->n_in,
                           grouped ? "scale groups" : "quantization blocks");
    uint8_t *dst = kvp_model_own(s, (uint64_t)rb * w->n_out);
    if (!dst)
        return kvp_err_set(err, KVP_ENOMEM, "tensor %s: out of memory for its slice", w->name);
    for (uint32_t r = 0; r < w->n_out; r++)
        memcpy(dst + (uint64_t)r * (uint64_t)rb, (const uint8_t *)w->data + (uint64_t)r * w->row_bytes + off,
               (size_t)rb);
    give_back(s->base, w->data, (uint64_t)w->n_out * w->row_bytes);
    out->data = dst;
    out->dev = NULL;
    out->n_in = nc;
    out->row_bytes = (uint64_t)rb;
    if (grouped) {
        uint32_t g0 = c0 / w->group, ng = nc / w->group;
        out->scale_stride = ng;
        out->scales = slice_groups(s, w->scales, w->n_out, w->scale_stride, g0, ng);
        out->zeros = w->zeros ? slice_groups(s, w->zeros, w->n_out, w->scale_stride, g0, ng) : NULL;
        if (!out->scales || (w->zeros && !out->zeros))
            return kvp_err_set(err, KVP_ENOMEM, "tensor %s: out of memory for its scales", w->name);
    }
    return 0;
}

static int shard_layer(kvp_model *s, const kvp_layer *L, kvp_layer *o, const kvp_config *c, uint32_t r, uint32_t n,
                       kvp_err *err)
{
    uint32_t hd = c->head_dim, nh = c->n_head / n, ff = c->n_ff / n;
    /* KV heads of this rank: its share, or the one its query heads use. */
    uint32_t nkv = c->n_head_kv % n == 0 ? c->n_head_kv / n : 1;
    uint32_t kv0 = c->n_head_kv % n == 0 ? r * nkv : r / (n / c->n_head_kv);
    *o = *L;
    o->wq = rows(&L->wq, r * nh * hd, nh * hd);
    o->wk = rows(&L->wk, kv0 * hd, nkv * hd);
    o->wv = rows(&L->wv, kv0 * hd, nkv * hd);
    o->bq = elems(&L->bq, r * nh * hd, nh * hd);
    o->bk = elems(&L->bk, kv0 * hd, nkv * hd);
    o->bv = elems(&L->bv, kv0 * hd, nkv * hd);
    o->w_gate = rows(&L->w_gate, r * ff, ff);
    o->w_up = rows(&L->w_up, r * ff, ff);
    int rc = cols(s, &L->wo, r * nh * hd, nh * hd, &o->wo, err);
    return rc < 0 ? rc : cols(s, &L->w_down, r * ff, ff, &o->w_down, err);
}

uint32_t kvp_shard_first_layer(uint32_t n_layer, uint32_t stage, uint32_t pp)
{
    uint32_t base = n_layer / pp, extra = n_layer % pp;
    return stage * base + (stage < extra ? stage : extra);
}

int kvp_model_shard(kvp_model **out, const kvp_model *m, uint32_t r, uint32_t n, uint32_t stage, uint32_t pp,
                    kvp_err *err)
{
    *out = NULL;
    int rc = kvp_shard_check_model(m, n, err);
    if (rc < 0)
        return rc;
    if (r >= n || stage >= pp)
        return kvp_err_set(err, KVP_EINVAL, "rank %u of %u, stage %u of %u", r, n, stage, pp);
    if (pp > m->cfg.n_layer)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "pipeline parallelism over %u stages: the model has %u layers (at "
                           "most one stage a layer)", pp, m->cfg.n_layer);
    uint32_t l0 = kvp_shard_first_layer(m->cfg.n_layer, stage, pp);
    uint32_t l1 = kvp_shard_first_layer(m->cfg.n_layer, stage + 1, pp);
    kvp_model *s = calloc(1, sizeof *s);
    if (!s)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    /* Everything read-only is shared with m (the mapping, the tokenizer's
     * metadata, the fingerprint); the shard owns its layers and copies. */
    *s = *m;
    s->base = m;
    memset(&s->owned, 0, sizeof s->owned);
    s->layers = calloc(l1 - l0, sizeof *s->layers);
    if (!s->layers) {
        free(s);
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    }
    for (uint32_t il = l0; il < l1 && rc == 0; il++)
        rc = shard_layer(s, &m->layers[il], &s->layers[il - l0], &m->cfg, r, n, err);
    if (rc < 0) {
        kvp_err_prefix(err, "%s: shard %u of %u", m->path, r, n);
        kvp_model_free(s);
        return rc;
    }
    s->cfg.n_layer = l1 - l0;
    uint32_t vs = kvp_shard_vocab_rows(m->cfg.n_vocab, n), v0 = r * vs;
    s->output = rows(&m->output, v0, v0 + vs <= m->cfg.n_vocab ? vs : m->cfg.n_vocab - v0);
    s->cfg.n_head = m->cfg.n_head / n;
    s->cfg.n_head_kv = m->cfg.n_head_kv % n == 0 ? m->cfg.n_head_kv / n : 1;
    s->cfg.n_ff = m->cfg.n_ff / n;
    if (n > 1 || pp > 1)
        kvp_model_give_back(m);
    *out = s;
    return 0;
}

int kvp_model_first_layers(kvp_model **out, const kvp_model *m, uint32_t n_layer, kvp_err *err)
{
    *out = NULL;
    if (n_layer == 0 || n_layer > m->cfg.n_layer)
        return kvp_err_set(err, KVP_EINVAL, "%s: %u layers of a model of %u", m->path, n_layer, m->cfg.n_layer);
    kvp_model *s = calloc(1, sizeof *s);
    if (!s)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    *s = *m;
    s->base = m;
    memset(&s->owned, 0, sizeof s->owned);
    if (!(s->layers = malloc(n_layer * sizeof *s->layers))) {
        free(s);
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    }
    memcpy(s->layers, m->layers, n_layer * sizeof *s->layers);
    s->cfg.n_layer = n_layer;
    *out = s;
    return 0;
}
