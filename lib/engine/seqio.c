/* seqio.c - write and read sequences + KV blocks (see seqio.h). */
#include "seqio.h"
#include "tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a small hash -> block map (open addressing; hashes are never 0) ---- */

typedef struct hmap {
    uint64_t *key;
    int64_t *val;
    size_t cap, n;
} hmap;

static void hmap_free(hmap *h)
{
    free(h->key);
    free(h->val);
}

static int64_t hmap_get(const hmap *h, uint64_t k)
{
    if (!h->cap)
        return -1;
    for (size_t i = k & (h->cap - 1);; i = (i + 1) & (h->cap - 1)) {
        if (h->key[i] == k)
            return h->val[i];
        if (!h->key[i])
            return -1;
    }
}

static int hmap_put(hmap *h, uint64_t k, int64_t v)
{
    if ((h->n + 1) * 2 > h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        hmap g = {calloc(cap, sizeof *g.key), calloc(cap, sizeof *g.val), cap, 0};
        if (!g.key || !g.val) {
            hmap_free(&g);
            return -1;
        }
        for (size_t i = 0; i < h->cap; i++)
            if (h->key[i])
                hmap_put(&g, h->key[i], h->val[i]);
        hmap_free(h);
        *h = g;
    }
    size_t i = k & (h->cap - 1);
    while (h->key[i] && h->key[i] != k)
        i = (i + 1) & (h->cap - 1);
    if (!h->key[i])
        h->n++;
    h->key[i] = k;
    h->val[i] = v;
    return 0;
}

/* ---- writer ---- */

int kvp_seqio_write(kvp_writer *w, kvp_kvcache *kc, const kvp_seqio_seq *seqs, uint32_t n, uint64_t *n_blocks,
                    uint64_t *n_refs, kvp_err *err)
{
    const kvp_kv_pool *pool = kvp_kvcache_pool(kc);
    uint8_t *buf = malloc(pool->block_bytes);
    hmap seen = {0};
    int rc = 0;
    uint64_t nb = 0, nr = 0;
    if (!buf)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory for a KV block of %llu bytes",
                           (unsigned long long)pool->block_bytes);
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        const kvp_seqio_seq *s = &seqs[i];
        uint32_t len = kvp_kvcache_seq_len(kc, s->handle), bs = pool->block_size;
        const uint32_t *tok = kvp_kvcache_seq_tokens(kc, s->handle), *blocks = kvp_kvcache_seq_blocks(kc, s->handle);
        kvp_seq_rec rec = s->rec;
        rec.n_tokens = len;
        rec.block_size = bs;
        if ((rc = kvp_write_sequence(w, &rec, tok, err)) < 0)
            break;
        uint64_t parent = 0;
        for (uint32_t b = 0; b * bs < len; b++) {
            uint32_t nt = len - b * bs < bs ? len - b * bs : bs;
            uint64_t h = kvp_kvblock_hash(parent, tok + (size_t)b * bs, nt);
            if (hmap_get(&seen, h) >= 0) {
                kvp_blockref_rec r = {.seq_id = rec.id, .block_index = b, .n_tokens = nt, .parent_hash = parent,
                                      .hash = h};
                if ((rc = kvp_write_blockref(w, &r, err)) < 0)
                    break;
                nr++;
            } else {
                kvp_kvblock_rec kb = {.seq_id = rec.id, .block_index = b, .block_size = bs, .n_tokens = nt,
                                      .layer_begin = 0, .layer_end = pool->n_layer, .n_head_kv = pool->n_head_kv,
                                      .head_dim = pool->head_dim, .dtype = (uint32_t)pool->dtype,
                                      .parent_hash = parent, .hash = h, .data_bytes = pool->block_bytes};
                kvp_kvcache_block_read(kc, blocks[b], buf);
                if ((rc = kvp_write_kvblock(w, &kb, tok + (size_t)b * bs, buf, NULL, err)) < 0)
                    break;
                if (hmap_put(&seen, h, 1) < 0) {
                    rc = kvp_err_set(err, KVP_ENOMEM, "out of memory");
                    break;
                }
                nb++;
            }
            parent = h;
        }
    }
    free(buf);
    hmap_free(&seen);
    if (n_blocks)
        *n_blocks = nb;
    if (n_refs)
        *n_refs = nr;
    return rc < 0 ? rc : 0;
}

/* ---- reader ---- */

typedef struct rd {
    const char *name;
    const kvp_model *m;
    kvp_backend *be;
    kvp_kvcache_opts opts;
    kvp_kvcache *kc;
    kvp_seqio_seq *seqs;
    uint32_t n, cap;
    hmap blocks;      /* stream block hash -> pool block */
} rd;

static kvp_seqio_seq *find_seq(rd *d, uint64_t id)
{
    for (uint32_t i = 0; i < d->n; i++)
        if (d->seqs[i].rec.id == id)
            return &d->seqs[i];
    return NULL;
}

static int on_sequence(rd *d, const kvp_record *rec, kvp_err *err)
{
    kvp_seq_rec s;
    const uint32_t *tokens;
    int rc = kvp_seq_decode(rec, &s, &tokens, err);
    if (rc < 0)
        return rc;
    if (find_seq(d, s.id))
        return kvp_err_set(err, KVP_EFORMAT, "%s: record %llu: sequence %llu appears twice", d->name,
                           (unsigned long long)rec->index, (unsigned long long)s.id);
    if (s.block_size == 0 || s.block_size > 4096)
        return kvp_err_set(err, KVP_EFORMAT, "%s: sequence %llu: block size %u", d->name,
                           (unsigned long long)s.id, s.block_size);
    if (!d->kc) {
        d->opts.block_size = s.block_size;
        if ((rc = kvp_kvcache_create(&d->kc, &d->m->cfg, &d->opts, d->be, err)) < 0)
            return rc;
    } else if (s.block_size != kvp_kvcache_pool(d->kc)->block_size) {
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: sequence %llu: block size %u differs from %u earlier",
                           d->name, (unsigned long long)s.id, s.block_size, kvp_kvcache_pool(d->kc)->block_size);
    }
    for (uint32_t i = 0; i < s.n_tokens; i++)
        if (kvp_le32(&tokens[i]) >= d->m->cfg.n_vocab)
            return kvp_err_set(err, KVP_EFORMAT, "%s: sequence %llu: token %u is outside the vocabulary", d->name,
                               (unsigned long long)s.id, kvp_le32(&tokens[i]));
    if (d->n == d->cap) {
        uint32_t cap = d->cap ? d->cap * 2 : 16;
        kvp_seqio_seq *p = realloc(d->seqs, cap * sizeof *p);
        if (!p)
            return kvp_err_set(err, KVP_ENOMEM, "out of memory");
        d->seqs = p;
        d->cap = cap;
    }
    int h = kvp_kvcache_seq_new(d->kc, err);
    if (h < 0)
        return h;
    d->seqs[d->n].rec = s;
    d->seqs[d->n].handle = h;
    d->n++;
    return 0;
}

/* Common checks for a block or ref joining sequence seq_id at index bi. */
static kvp_seqio_seq *block_target(rd *d, const kvp_record *rec, uint64_t seq_id, uint32_t bi, uint32_t nt,
                                   kvp_err *err)
{
    kvp_seqio_seq *s = find_seq(d, seq_id);
    if (!s) {
        kvp_err_set(err, KVP_EFORMAT, "%s: record %llu: KV block for sequence %llu before its sequence record",
                    d->name, (unsigned long long)rec->index, (unsigned long long)seq_id);
        return NULL;
    }
    if (bi != kvp_kvcache_seq_n_blocks(d->kc, s->handle) ||
        (uint64_t)bi * s->rec.block_size + nt > s->rec.n_tokens) {
        kvp_err_set(err, KVP_EFORMAT, "%s: record %llu: block %u of sequence %llu is out of order or too long",
                    d->name, (unsigned long long)rec->index, bi, (unsigned long long)seq_id);
        return NULL;
    }
    return s;
}

static int on_kvblock(rd *d, const kvp_record *rec, kvp_err *err)
{
    kvp_kvblock_rec b;
    const uint8_t *tok_le, *data, *scales;
    int rc = kvp_kvblock_decode(rec, &b, &tok_le, &data, &scales, err);
    if (rc < 0)
        return rc;
    const kvp_kv_pool *pool = d->kc ? kvp_kvcache_pool(d->kc) : NULL;
    if (!pool)
        return kvp_err_set(err, KVP_EFORMAT, "%s: record %llu: KV block before any sequence", d->name,
                           (unsigned long long)rec->index);
    if ((int)b.dtype != pool->dtype)
        return kvp_err_set(err, KVP_EMISMATCH, "%s: KV dtype %s in the stream, this run uses %s (--kv-dtype)",
                           d->name, kvp_dtype_name(b.dtype), kvp_dtype_name((uint32_t)pool->dtype));
    if (b.layer_begin != 0 || b.layer_end != pool->n_layer || b.n_head_kv != pool->n_head_kv ||
        b.head_dim != pool->head_dim || b.block_size != pool->block_size || b.scales_bytes ||
        b.data_bytes != pool->block_bytes)
        return kvp_err_set(err, KVP_EMISMATCH, "%s: record %llu: KV block of layers %u-%u, %u x %u heads, block %u "
                           "does not fit this model (%u layers, %u x %u, block %u)", d->name,
                           (unsigned long long)rec->index, b.layer_begin, b.layer_end, b.n_head_kv, b.head_dim,
                           b.block_size, pool->n_layer, pool->n_head_kv, pool->head_dim, pool->block_size);
    kvp_seqio_seq *s = block_target(d, rec, b.seq_id, b.block_index, b.n_tokens, err);
    if (!s)
        return err->code;
    uint32_t ids[4096];
    for (uint32_t i = 0; i < b.n_tokens; i++)
        ids[i] = kvp_le32(tok_le + 4 * i);
    int64_t from = b.n_tokens == pool->block_size ? kvp_kvcache_find_hash(d->kc, b.hash) : -1;
    int64_t blk = kvp_kvcache_seq_push_block(d->kc, s->handle, ids, b.n_tokens, from, data, err);
    if (blk < 0)
        return (int)blk;
    if (hmap_put(&d->blocks, b.hash, blk) < 0)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    return 0;
}

static int on_blockref(rd *d, const kvp_record *rec, kvp_err *err)
{
    kvp_blockref_rec r;
    int rc = kvp_blockref_decode(rec, &r, err);
    if (rc < 0)
        return rc;
    int64_t from = hmap_get(&d->blocks, r.hash);
    if (from < 0 || !d->kc)
        return kvp_err_set(err, KVP_EFORMAT, "%s: record %llu: reference to block %016llx, which the stream has "
                           "not carried", d->name, (unsigned long long)rec->index, (unsigned long long)r.hash);
    kvp_seqio_seq *s = block_target(d, rec, r.seq_id, r.block_index, r.n_tokens, err);
    if (!s)
        return err->code;
    /* the tokens are those of the block referred to (its hash names them) */
    uint32_t bs = kvp_kvcache_pool(d->kc)->block_size, ids[4096];
    if (r.n_tokens == 0 || r.n_tokens > bs)
        return kvp_err_set(err, KVP_EFORMAT, "%s: record %llu: block reference of %u tokens (block size %u)",
                           d->name, (unsigned long long)rec->index, r.n_tokens, bs);
    const uint32_t *src_tok = NULL;
    for (uint32_t i = 0; i < d->n && !src_tok; i++) {
        const uint32_t *bl = kvp_kvcache_seq_blocks(d->kc, d->seqs[i].handle);
        uint32_t nb = kvp_kvcache_seq_n_blocks(d->kc, d->seqs[i].handle);
        for (uint32_t j = 0; j < nb; j++)
            if (bl[j] == (uint32_t)from) {
                src_tok = kvp_kvcache_seq_tokens(d->kc, d->seqs[i].handle) + (size_t)j * bs;
                break;
            }
    }
    if (!src_tok || kvp_kvblock_hash(r.parent_hash, src_tok, r.n_tokens) != r.hash)
        return kvp_err_set(err, KVP_EFORMAT, "%s: record %llu: block reference does not match the block it names",
                           d->name, (unsigned long long)rec->index);
    memcpy(ids, src_tok, (size_t)r.n_tokens * sizeof *ids);
    int64_t blk = kvp_kvcache_seq_push_block(d->kc, s->handle, ids, r.n_tokens, from, NULL, err);
    return blk < 0 ? (int)blk : 0;
}

int kvp_seqio_read(kvp_reader *r, const char *name, const kvp_model *m, kvp_backend *be,
                   const kvp_kvcache_opts *opts, kvp_kvcache **kc, kvp_seqio_seq **seqs, uint32_t *n, kvp_err *err)
{
    *kc = NULL;
    *seqs = NULL;
    *n = 0;
    rd d = {.name = name, .m = m, .be = be, .opts = *opts};
    const kvp_stream_info *info = kvp_reader_info(r);
    int rc = 0;
    if (memcmp(info->fingerprint, m->fingerprint, KVP_FINGERPRINT_SIZE) != 0) {
        char a[33], b[33];
        for (int i = 0; i < KVP_FINGERPRINT_SIZE; i++)
            snprintf(a + 2 * i, 3, "%02x", info->fingerprint[i]);
        kvp_model_fingerprint_hex(m, b);
        rc = kvp_err_set(err, KVP_EMISMATCH, "%s: KV made by another model (fingerprint %s; %s is %s)", name, a,
                         m->path, b);
        goto done;
    }
    kvp_record rec;
    int got;
    while ((got = kvp_reader_next(r, &rec, err)) > 0) {
        if (rec.kind == KVP_KIND_SEQUENCE)
            rc = on_sequence(&d, &rec, err);
        else if (rec.kind == KVP_KIND_KV_BLOCK)
            rc = on_kvblock(&d, &rec, err);
        else if (rec.kind == KVP_KIND_BLOCK_REF)
            rc = on_blockref(&d, &rec, err);
        if (rc < 0)
            goto done;
    }
    if (got < 0) {
        rc = got;
        goto done;
    }
    for (uint32_t i = 0; i < d.n; i++) {
        uint32_t have = kvp_kvcache_seq_len(d.kc, d.seqs[i].handle);
        if (have != d.seqs[i].rec.n_tokens) {
            rc = kvp_err_set(err, KVP_EFORMAT, "%s: sequence %llu: the stream carries KV for %u of its %u tokens",
                             name, (unsigned long long)d.seqs[i].rec.id, have, d.seqs[i].rec.n_tokens);
            goto done;
        }
    }
done:
    hmap_free(&d.blocks);
    if (rc < 0) {
        free(d.seqs);
        kvp_kvcache_free(d.kc);
        return rc;
    }
    *kc = d.kc;
    *seqs = d.seqs;
    *n = d.n;
    return 0;
}
