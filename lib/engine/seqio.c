/* seqio.c - write and read sequences + KV blocks (see seqio.h). */
#include "seqio.h"
#include "seqcheck.h"
#include "tensor.h"
#include "u64map.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- writer ---- */

struct kvp_seqio_writer {
    kvp_writer *w;
    kvp_kvcache *kc;
    uint8_t *buf;     /* one block's bytes */
    kvp_u64map seen;  /* hashes of the blocks written so far */
    uint64_t n_blocks, n_refs;
};

int kvp_seqio_writer_open(kvp_seqio_writer **out, kvp_writer *w, kvp_kvcache *kc, kvp_err *err)
{
    *out = NULL;
    kvp_seqio_writer *sw = calloc(1, sizeof *sw);
    const kvp_kv_pool *pool = kvp_kvcache_whole(kc);
    if (!sw || !(sw->buf = malloc(pool->block_bytes))) {
        free(sw);
        return kvp_err_set(err, KVP_ENOMEM, "out of memory for a KV block of %llu bytes",
                           (unsigned long long)pool->block_bytes);
    }
    sw->w = w;
    sw->kc = kc;
    *out = sw;
    return 0;
}

void kvp_seqio_writer_free(kvp_seqio_writer *sw)
{
    if (!sw)
        return;
    free(sw->buf);
    kvp_u64map_free(&sw->seen);
    free(sw);
}

void kvp_seqio_writer_counts(const kvp_seqio_writer *sw, uint64_t *n_blocks, uint64_t *n_refs)
{
    if (n_blocks)
        *n_blocks = sw->n_blocks;
    if (n_refs)
        *n_refs = sw->n_refs;
}

int kvp_seqio_writer_put(kvp_seqio_writer *sw, const kvp_seqio_seq *s, kvp_err *err)
{
    kvp_kvcache *kc = sw->kc;
    const kvp_kv_pool *pool = kvp_kvcache_whole(kc); /* whole blocks, gathered under --tp/--pp */
    uint32_t len = kvp_kvcache_seq_len(kc, s->handle), bs = pool->block_size;
    const uint32_t *tok = kvp_kvcache_seq_tokens(kc, s->handle), *blocks = kvp_kvcache_seq_blocks(kc, s->handle);
    kvp_seq_rec rec = s->rec;
    rec.n_tokens = len;
    rec.block_size = bs;
    int rc = kvp_write_sequence(sw->w, &rec, tok, s->stop, s->n_stop, err);
    uint64_t parent = 0;
    for (uint32_t b = 0; rc == 0 && b * bs < len; b++) {
        uint32_t nt = len - b * bs < bs ? len - b * bs : bs;
        uint64_t h = kvp_kvblock_hash(parent, tok + (size_t)b * bs, nt);
        if (kvp_u64map_get(&sw->seen, h) >= 0) {
            kvp_blockref_rec r = {.seq_id = rec.id, .block_index = b, .n_tokens = nt, .parent_hash = parent,
                                  .hash = h};
            if ((rc = kvp_write_blockref(sw->w, &r, err)) == 0)
                sw->n_refs++;
        } else {
            kvp_kvblock_rec kb = {.seq_id = rec.id, .block_index = b, .block_size = bs, .n_tokens = nt,
                                  .layer_begin = 0, .layer_end = pool->n_layer, .n_head_kv = pool->n_head_kv,
                                  .head_dim = pool->head_dim, .dtype = (uint32_t)pool->dtype,
                                  .parent_hash = parent, .hash = h, .data_bytes = pool->block_bytes};
            const uint8_t *scales = NULL;
            if (pool->scales_off) { /* a scaled cache: its scales follow the data, as in the record */
                kb.data_bytes = pool->scales_off;
                kb.scale_dtype = KVP_DTYPE_F32;
                kb.scales_bytes = pool->block_bytes - pool->scales_off;
                scales = sw->buf + pool->scales_off;
            }
            if ((rc = kvp_kvcache_block_read_whole(kc, blocks[b], sw->buf, err)) == 0 &&
                (rc = kvp_write_kvblock(sw->w, &kb, tok + (size_t)b * bs, sw->buf, scales, err)) == 0) {
                if (kvp_u64map_put(&sw->seen, h, 1) < 0)
                    rc = kvp_err_set(err, KVP_ENOMEM, "out of memory");
                sw->n_blocks++;
            }
        }
        parent = h;
    }
    return rc;
}

int kvp_seqio_write(kvp_writer *w, kvp_kvcache *kc, const kvp_seqio_seq *seqs, uint32_t n, uint64_t *n_blocks,
                    uint64_t *n_refs, kvp_err *err)
{
    kvp_seqio_writer *sw = NULL;
    int rc = kvp_seqio_writer_open(&sw, w, kc, err);
    for (uint32_t i = 0; rc == 0 && i < n; i++)
        rc = kvp_seqio_writer_put(sw, &seqs[i], err);
    if (sw)
        kvp_seqio_writer_counts(sw, n_blocks, n_refs);
    kvp_seqio_writer_free(sw);
    return rc < 0 ? rc : 0;
}

/* ---- reader ----
 *
 * A sequence is its SEQUENCE record and then exactly its blocks, in order
 * (what the writer writes).  Blocks load into a cache sequence as far as
 * they can: a block referred to that the cache no longer holds, or no free
 * block, ends the loading, and the caller computes the rest from the
 * sequence's tokens (which the SEQUENCE record carries).  Every record is
 * still read and checked. */

struct kvp_seqio_reader {
    kvp_reader *r;
    const char *name;
    const kvp_model *m;
    kvp_backend *be;
    kvp_kvcache_opts opts;
    kvp_kvcache *kc;          /* made at the first sequence (its block size; its first block's dtype) */
    uint8_t *stage;           /* a scaled block's data and scales, put together as the pool holds them */
    uint8_t *copy;            /* a block copied for another salt's sequence (copied_block) */
    int own_kc;
    uint32_t *tokens;         /* the current sequence's tokens */
    uint32_t cap_tokens;
    char **stop;              /* and its stop strings, until next hands them out */
    size_t n_stop;
    uint64_t n_seqs;
    kvp_u64map ids;           /* sequence ids seen: each once */
    kvp_u64map partial;       /* stream hash of a block loaded -> handle << 32 | block index */
    uint64_t salt;            /* of sequences whose record has none */
    int done;
    const char *what_file;    /* before the first sequence: what its records say the file is (NULL: a KV stream) */
    int skim;                 /* tensors skimmed until a sequence comes (note_record) */
    int stopped;              /* a STOP record came: its producer was stopped (stop) */
    kvp_stop_rec stop_rec;
};

/* The block loaded under a stream hash (a partial block's reference, or a
 * salted sequence's reference to a block sent for another salt), if the
 * sequence that loaded it still holds the same tokens there (the handle
 * may since name another sequence: the chained hash over its tokens
 * tells); else -1. */
static int64_t partial_block(const kvp_seqio_reader *sr, uint64_t hash)
{
    int64_t v = kvp_u64map_get(&sr->partial, hash);
    if (v < 0)
        return -1;
    int handle = (int)(v >> 32);
    uint32_t bi = (uint32_t)v, bs = kvp_kvcache_pool(sr->kc)->block_size;
    uint32_t len = kvp_kvcache_seq_len(sr->kc, handle);
    if (kvp_kvcache_seq_n_blocks(sr->kc, handle) <= bi)
        return -1;
    const uint32_t *tok = kvp_kvcache_seq_tokens(sr->kc, handle);
    uint64_t h = 0;
    for (uint32_t b = 0; b <= bi; b++) {
        uint32_t nt = len - b * bs < bs ? len - b * bs : bs;
        h = kvp_kvblock_hash(h, tok + (size_t)b * bs, nt);
    }
    return h == hash ? (int64_t)kvp_kvcache_seq_blocks(sr->kc, handle)[bi] : -1;
}

/* A KV stream holds sequences and their blocks (and may hold records a
 * reader skips); a file of tensors or of saved distributions and no
 * sequence is one given in the wrong place, every record of it skipped: a
 * job of no sequences, exit 0, nothing said.  What a file is and where it
 * belongs, told by one record of it (NULL: a kind a KV stream may hold). */
static const char *not_kv(const kvp_record *rec)
{
    if (rec->kind == KVP_KIND_SCORES || rec->kind == KVP_KIND_LOGPROBS)
        return "saved next-token distributions (prefill --save-logits), not a KV stream: give it to prefill --kld";
    if (rec->kind != KVP_KIND_TENSOR)
        return NULL;
    kvp_tensor_rec t;
    const uint8_t *data, *scales, *zeros;
    kvp_err ignored = {0};
    /* heads.h: a heads file's tensors are medusa.K.w1 and medusa.K.b1 */
    if (rec->meta && kvp_tensor_decode(rec, &t, &data, &scales, &zeros, &ignored) == 0 &&
        strncmp(t.name, "medusa.", 7) == 0)
        return "a Medusa heads file (tensors), not a KV stream: give it to specdec with --heads";
    return "a model file (tensors), not a KV stream: give it with -m";
}

/* Note a record met before the first sequence into *what (not_kv's, the
 * first such).  After the first tensor the rest are skimmed (headers only,
 * on a mapped file): a model given by mistake fails in a moment, not after
 * a checksum of all its weights.  *skim: whether that is on. */
static void note_record(kvp_reader *r, const kvp_record *rec, const char **what, int *skim)
{
    if (*what)
        return;
    *what = not_kv(rec);
    if (*what && rec->kind == KVP_KIND_TENSOR) {
        kvp_reader_skim(r, 1u << KVP_KIND_TENSOR);
        *skim = 1;
    }
}

/* A stream of another fingerprint may be no KV stream at all (a model file
 * of another model; a tensors-only file, of none): when no sequence or
 * block comes, what it is beats "KV made by another model" (rc and err as
 * they are).  It reads on only when the stream is refused anyway. */
static int mismatch_or_not_kv(kvp_reader *r, const char *name, int rc, kvp_err *err)
{
    kvp_err ignored = {0};
    kvp_record rec;
    const char *what = NULL;
    int skim = 0, got;
    while ((got = kvp_reader_next(r, &rec, &ignored)) > 0 && rec.kind != KVP_KIND_SEQUENCE &&
           rec.kind != KVP_KIND_KV_BLOCK && rec.kind != KVP_KIND_BLOCK_REF)
        note_record(r, &rec, &what, &skim);
    if (skim)
        kvp_reader_skim(r, 0);
    return got == 0 && what ? kvp_err_set(err, KVP_EFORMAT, "%s: %s", name, what) : rc;
}

static int fingerprint_check(kvp_reader *r, const char *name, const kvp_model *m, kvp_err *err)
{
    const kvp_stream_info *info = kvp_reader_info(r);
    if (memcmp(info->fingerprint, m->fingerprint, KVP_FINGERPRINT_SIZE) == 0)
        return 0;
    char a[33], b[33];
    for (int i = 0; i < KVP_FINGERPRINT_SIZE; i++)
        snprintf(a + 2 * i, 3, "%02x", info->fingerprint[i]);
    kvp_model_fingerprint_hex(m, b);
    int rc = kvp_err_set(err, KVP_EMISMATCH, "%s: KV made by another model (fingerprint %s; %s is %s)", name, a,
                         m->path, b);
    return mismatch_or_not_kv(r, name, rc, err);
}

int kvp_seqio_reader_open(kvp_seqio_reader **out, kvp_reader *r, const char *name, const kvp_model *m,
                          kvp_backend *be, const kvp_kvcache_opts *opts, kvp_err *err)
{
    *out = NULL;
    int rc = fingerprint_check(r, name, m, err);
    if (rc < 0)
        return rc;
    kvp_seqio_reader *sr = calloc(1, sizeof *sr);
    if (!sr)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    *sr = (kvp_seqio_reader){.r = r, .name = name, .m = m, .be = be, .opts = *opts, .own_kc = 1};
    *out = sr;
    return 0;
}

void kvp_seqio_reader_set_salt(kvp_seqio_reader *sr, uint64_t salt) { sr->salt = salt; }

void kvp_seqio_reader_free(kvp_seqio_reader *sr)
{
    if (!sr)
        return;
    if (sr->own_kc)
        kvp_kvcache_free(sr->kc);
    free(sr->tokens);
    kvp_seq_stops_free(sr->stop, sr->n_stop);
    free(sr->stage);
    free(sr->copy);
    kvp_u64map_free(&sr->ids);
    kvp_u64map_free(&sr->partial);
    free(sr);
}

int kvp_seqio_reader_stopped(const kvp_seqio_reader *sr, kvp_stop_rec *s)
{
    if (sr->stopped && s)
        *s = sr->stop_rec;
    return sr->stopped;
}

kvp_kvcache *kvp_seqio_reader_take_cache(kvp_seqio_reader *sr)
{
    sr->own_kc = 0;
    return sr->kc;
}

/* The cache, made for the stream's block size at its first sequence. */
static int cache_for(kvp_seqio_reader *sr, const kvp_seq_rec *s, kvp_err *err)
{
    if (s->block_size == 0 || s->block_size > 4096)
        return kvp_err_set(err, KVP_EFORMAT, "%s: sequence %llu: block size %u", sr->name, (unsigned long long)s->id,
                           s->block_size);
    if (!sr->kc) {
        sr->opts.block_size = s->block_size;
        return 0; /* made by make_cache, which may first see the dtype */
    }
    if (s->block_size != kvp_kvcache_pool(sr->kc)->block_size)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: sequence %llu: block size %u differs from %u earlier",
                           sr->name, (unsigned long long)s->id, s->block_size, kvp_kvcache_pool(sr->kc)->block_size);
    return 0;
}

static int on_sequence(kvp_seqio_reader *sr, const kvp_record *rec, kvp_seq_rec *s, kvp_err *err)
{
    const uint32_t *tokens;
    int rc = kvp_seq_decode(rec, s, &tokens, err);
    if (rc < 0) /* the decoder names the record; the stream is ours to name */
        return kvp_err_prefix(err, "%s", sr->name);
    kvp_seq_stops_free(sr->stop, sr->n_stop);
    sr->stop = NULL, sr->n_stop = 0;
    if ((rc = kvp_seq_stops(rec, &sr->stop, &sr->n_stop, err)) < 0)
        return rc;
    if (kvp_u64map_get(&sr->ids, s->id) >= 0)
        return kvp_err_set(err, KVP_EFORMAT, "%s: record %llu: sequence %llu appears twice", sr->name,
                           (unsigned long long)rec->index, (unsigned long long)s->id);
    if (kvp_u64map_put(&sr->ids, s->id, 1) < 0)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    if ((rc = cache_for(sr, s, err)) < 0)
        return rc;
    if (s->n_tokens > sr->cap_tokens) {
        uint32_t *t = realloc(sr->tokens, (size_t)s->n_tokens * sizeof *t);
        if (!t)
            return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory for %u tokens", sr->name, s->n_tokens);
        sr->tokens = t;
        sr->cap_tokens = s->n_tokens;
    }
    if (s->next_token >= 0 && (uint32_t)s->next_token >= sr->m->cfg.n_vocab)
        return kvp_err_set(err, KVP_EFORMAT, "%s: sequence %llu: next token %d is outside the vocabulary", sr->name,
                           (unsigned long long)s->id, (int)s->next_token);
    for (uint32_t i = 0; i < s->n_tokens; i++) {
        sr->tokens[i] = kvp_le32(&tokens[i]);
        if (sr->tokens[i] >= sr->m->cfg.n_vocab)
            return kvp_err_set(err, KVP_EFORMAT, "%s: sequence %llu: token %u is outside the vocabulary", sr->name,
                               (unsigned long long)s->id, sr->tokens[i]);
    }
    return 0;
}

/* The cache, at the first sequence: of the dtype of its first block when
 * the options leave it to the stream (rec, that block, or NULL). */
static int make_cache(kvp_seqio_reader *sr, const kvp_record *rec, kvp_err *err)
{
    if (sr->kc)
        return 0;
    kvp_kvblock_rec b;
    const uint8_t *tok_le, *data, *scales;
    if (rec && rec->kind == KVP_KIND_KV_BLOCK && sr->opts.dtype_from_stream &&
        kvp_kvblock_decode(rec, &b, &tok_le, &data, &scales, err) == 0 &&
        kvp_kvcache_block_bytes(&sr->m->cfg, 1, (int)b.dtype) > 0)
        sr->opts.dtype = (int)b.dtype; /* one the cache cannot hold is refused by on_block, naming it */
    int rc = kvp_kvcache_create(&sr->kc, &sr->m->cfg, &sr->opts, sr->be, err);
    const kvp_kv_pool *pool = rc == 0 ? kvp_kvcache_whole(sr->kc) : NULL;
    if (pool && pool->scales_off && !(sr->stage = malloc(pool->block_bytes)))
        rc = kvp_err_set(err, KVP_ENOMEM, "out of memory for a KV block of %llu bytes",
                         (unsigned long long)pool->block_bytes);
    return rc;
}

/* A scaled block's payload as the pool holds it: data, then its scales, one
 * a slot (a block of `quantize --kv`, one scale a head, gives each slot its
 * head's: the same values).  kvp_kvblock_decode has checked each filled
 * slot's scale finite and positive (a zero or NaN scale would poison every
 * score that reads it). */
static const uint8_t *stage_scaled(kvp_seqio_reader *sr, const kvp_kvblock_rec *b, const uint8_t *data,
                                   const uint8_t *scales)
{
    const kvp_kv_pool *pool = kvp_kvcache_whole(sr->kc);
    uint64_t n = (pool->block_bytes - pool->scales_off) / 4, per = kvp_kvblock_scales_per_slot(b) ? 1 : pool->block_size;
    uint8_t *sc = sr->stage + pool->scales_off;
    memcpy(sr->stage, data, pool->scales_off);
    for (uint64_t i = 0; i < n; i++)
        memcpy(sc + 4 * i, scales + 4 * (i / per), 4);
    return sr->stage;
}

/* A reference to a block the stream sent for a sequence of another salt
 * (the writer sends equal blocks once, whatever their salts; no salt is
 * one too): the block's bytes, copied into sr->copy, for a block of this
 * sequence's own, since tenants never share one; NULL when it is no
 * longer loaded (then computed again, as any block not loaded). */
static const uint8_t *copied_block(kvp_seqio_reader *sr, uint64_t hash)
{
    int64_t src = partial_block(sr, hash);
    if (src < 0)
        return NULL;
    const kvp_kv_pool *pool = kvp_kvcache_whole(sr->kc);
    if (!sr->copy && !(sr->copy = malloc(pool->block_bytes)))
        return NULL;
    kvp_err quiet = {0};
    if (kvp_kvcache_block_read_whole(sr->kc, (uint32_t)src, sr->copy, &quiet) < 0)
        return NULL;
    return sr->copy;
}

/* A block's hash in the cache: the stream's own (hash) for an unsalted
 * sequence (sparent 0 throughout), else the block chained from the salted
 * parent (not 0: a salt never is, a block hash with a chance of 2^-64). */
static uint64_t salted_hash(uint64_t hash, uint64_t sparent, const uint32_t *tok, uint32_t nt)
{
    return sparent == 0 ? hash : kvp_kvblock_hash(sparent, tok, nt);
}

/* A block's filled rows hold no NaN or infinity: one would reach every
 * score that reads it, and the step's check could only say that some
 * hidden state went bad, not which file and record did it. */
static int block_finite(const kvp_seqio_reader *sr, const kvp_record *rec, const kvp_kvblock_rec *b,
                        const uint8_t *data, kvp_err *err)
{
    uint64_t slabs = (uint64_t)(b->layer_end - b->layer_begin) * 2 * b->n_head_kv;
    uint64_t slab = (uint64_t)kvp_dtype_row_bytes(b->dtype, (int64_t)b->block_size * b->head_dim);
    uint64_t filled = (uint64_t)b->n_tokens * b->head_dim;
    for (uint64_t k = 0; k < slabs; k++) {
        uint64_t i = kvp_kv_first_non_finite(b->dtype, data + k * slab, filled);
        if (i < filled)
            return kvp_err_set(err, KVP_EFORMAT, "%s: record %llu: KV block %u of sequence %llu: the %s value at "
                               "token %llu of layer %llu, KV head %llu is NaN or infinity: the stream's KV cache is "
                               "broken",
                               sr->name, (unsigned long long)rec->index, b->block_index,
                               (unsigned long long)b->seq_id, k / b->n_head_kv % 2 ? "V" : "K",
                               (unsigned long long)(i / b->head_dim),
                               (unsigned long long)(b->layer_begin + k / (2 * (uint64_t)b->n_head_kv)),
                               (unsigned long long)(k % b->n_head_kv));
    }
    return 0;
}

/* Load one block record into seq (while *loading).  *parent chains the
 * stream's hashes (unsalted, as every stream's), *sparent the cache's (from
 * the sequence's salt): a full block is looked up in the cache by the
 * latter, so a salted sequence finds only its own tenant's blocks.  A
 * record that cannot be loaded stops the loading, never the reading. */
static int on_block(kvp_seqio_reader *sr, const kvp_record *rec, const kvp_seq_rec *s, int handle, uint32_t bi,
                    uint64_t *parent, uint64_t *sparent, int *loading, kvp_err *err)
{
    /* whole blocks: under --tp/--pp the cache scatters them to the ranks */
    const kvp_kv_pool *pool = kvp_kvcache_whole(sr->kc);
    const uint32_t *tok = sr->tokens + (size_t)bi * s->block_size;
    int64_t from = -1;
    const uint8_t *data = NULL;
    uint32_t nt;
    uint64_t hash, shash;
    int rc;
    if (rec->kind == KVP_KIND_KV_BLOCK) {
        kvp_kvblock_rec b;
        const uint8_t *tok_le, *scales;
        if ((rc = kvp_kvblock_decode(rec, &b, &tok_le, &data, &scales, err)) < 0)
            return kvp_err_prefix(err, "%s", sr->name);
        if ((int)b.dtype != pool->dtype)
            return kvp_err_set(err, KVP_EMISMATCH, "%s: record %llu: a KV block of dtype %s, where this run's cache "
                               "is %s (set by --kv-dtype, or else by the stream's first block)", sr->name,
                               (unsigned long long)rec->index, kvp_dtype_name(b.dtype),
                               kvp_dtype_name((uint32_t)pool->dtype));
        uint64_t want_data = pool->scales_off ? pool->scales_off : pool->block_bytes;
        uint64_t want_scales = pool->block_bytes - want_data;
        /* one scale a slot or one a head (the decoder matched either to the
         * record's shape, which must be the pool's) */
        int scales_ok = want_scales ? b.scale_dtype == KVP_DTYPE_F32 && kvp_kvblock_scales_per_slot(&b) >= 0
                                    : b.scales_bytes == 0;
        if (b.layer_begin != 0 || b.layer_end != pool->n_layer || b.n_head_kv != pool->n_head_kv ||
            b.head_dim != pool->head_dim || b.block_size != pool->block_size || !scales_ok ||
            b.data_bytes != want_data)
            return kvp_err_set(err, KVP_EMISMATCH, "%s: record %llu: KV block of layers %u-%u, %u x %u heads, block "
                               "%u does not fit this model (%u layers, %u x %u, block %u)", sr->name,
                               (unsigned long long)rec->index, b.layer_begin, b.layer_end, b.n_head_kv, b.head_dim,
                               b.block_size, pool->n_layer, pool->n_head_kv, pool->head_dim, pool->block_size);
        if ((rc = kvp_seq_block_check(s, sr->tokens, bi, *parent, rec->index, b.seq_id, b.block_index, b.n_tokens,
                                      b.parent_hash, b.hash, &b.block_size, tok_le, err)) < 0)
            return kvp_err_prefix(err, "%s", sr->name);
        if ((rc = block_finite(sr, rec, &b, data, err)) < 0)
            return rc;
        if (want_scales)
            data = stage_scaled(sr, &b, data, scales);
        nt = b.n_tokens;
        hash = b.hash;
        shash = salted_hash(hash, *sparent, tok, nt);
        /* a full block the cache already holds is shared, not copied */
        if (nt == pool->block_size)
            from = kvp_kvcache_find_hash(sr->kc, shash);
    } else {
        kvp_blockref_rec r;
        if ((rc = kvp_blockref_decode(rec, &r, err)) < 0)
            return kvp_err_prefix(err, "%s", sr->name);
        if ((rc = kvp_seq_block_check(s, sr->tokens, bi, *parent, rec->index, r.seq_id, r.block_index, r.n_tokens,
                                      r.parent_hash, r.hash, NULL, NULL, err)) < 0)
            return kvp_err_prefix(err, "%s", sr->name);
        nt = r.n_tokens;
        hash = r.hash;
        shash = salted_hash(hash, *sparent, tok, nt);
        /* A full block by its registered hash; a partial one (the tail of an
         * equal prompt) where it was loaded, if still there.  One that has
         * left the cache is computed again from the tokens. */
        from = nt == pool->block_size ? kvp_kvcache_find_hash(sr->kc, shash) : partial_block(sr, hash);
        /* a block the stream sent for another salt (or for a salted
         * sequence, to an unsalted one): registered under that salt, so
         * not found by this one's hash; copied, never shared */
        if (from < 0 && *loading)
            data = copied_block(sr, hash);
        if (from < 0 && !data)
            *loading = 0;
    }
    *sparent = *sparent ? shash : 0; /* an unsalted chain stays 0: the stream's hashes serve */
    *parent = hash;
    if (!*loading)
        return 0;
    kvp_err quiet = {0};
    int64_t blk = kvp_kvcache_seq_push_block(sr->kc, handle, tok, nt, from, from >= 0 ? NULL : data, &quiet);
    if (blk == KVP_ELIMIT || blk == KVP_ENOTFOUND)
        *loading = 0; /* no free block, or the block found holds other tokens: computed later */
    else if (blk < 0)
        return kvp_err_set(err, (int)blk, "%s: %s", sr->name, quiet.msg);
    else if (kvp_u64map_put(&sr->partial, hash, (int64_t)handle << 32 | bi) < 0)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    return 0;
}

/* The next record of a sequence's blocks: records of kinds this version
 * does not define are skipped there too, as kvp(5) has readers do
 * everywhere (quantize --kv passes them through in place). */
static int next_block_record(kvp_seqio_reader *sr, kvp_record *rec, kvp_err *err)
{
    int got;
    while ((got = kvp_reader_next(sr->r, rec, err)) > 0 && !kvp_kind_known(rec->kind))
        ;
    return got;
}

int kvp_seqio_reader_next(kvp_seqio_reader *sr, kvp_seqio_seq *out, const uint32_t **tokens, kvp_err *err)
{
    kvp_record rec;
    int got;
    if (sr->done)
        return 0;
    while ((got = kvp_reader_next(sr->r, &rec, err)) > 0 && rec.kind != KVP_KIND_SEQUENCE) {
        if (rec.kind == KVP_KIND_KV_BLOCK || rec.kind == KVP_KIND_BLOCK_REF)
            return kvp_err_set(err, KVP_EFORMAT, "%s: record %llu: a KV block with no sequence before it", sr->name,
                               (unsigned long long)rec.index);
        if (rec.kind == KVP_KIND_STOP) {
            if (kvp_stop_decode(&rec, &sr->stop_rec, err) < 0)
                return kvp_err_prefix(err, "%s", sr->name);
            sr->stopped = 1;
            continue;
        }
        if (!sr->n_seqs)
            note_record(sr->r, &rec, &sr->what_file, &sr->skim);
    }
    if (got == 0 && !sr->n_seqs && sr->what_file) /* the end, and no sequence came */
        return kvp_err_set(err, KVP_EFORMAT, "%s: %s", sr->name, sr->what_file);
    if (got <= 0) {
        sr->done = 1;
        return got;
    }
    if (sr->skim) { /* a sequence after all: read every record whole again */
        kvp_reader_skim(sr->r, 0);
        sr->skim = 0;
    }
    kvp_seq_rec s;
    int rc = on_sequence(sr, &rec, &s, err);
    if (rc < 0)
        return rc;
    uint32_t nb = (uint32_t)(((uint64_t)s.n_tokens + s.block_size - 1) / s.block_size);
    int ahead = 0; /* the first block's record, read before the cache is made */
    if (!sr->kc) {
        if (nb && (got = next_block_record(sr, &rec, err)) < 0)
            return got;
        ahead = nb && got > 0;
        if ((rc = make_cache(sr, ahead ? &rec : NULL, err)) < 0)
            return rc;
    }
    int handle = kvp_kvcache_seq_new(sr->kc, err);
    if (handle < 0)
        return handle;
    uint64_t salt = s.cache_salt ? s.cache_salt : sr->salt, parent = 0, sparent = salt;
    if ((rc = kvp_kvcache_seq_set_salt(sr->kc, handle, salt, err)) < 0) {
        kvp_kvcache_seq_free(sr->kc, handle);
        return rc;
    }
    int loading = 1;
    for (uint32_t bi = 0; bi < nb && rc == 0; bi++) {
        if (!ahead)
            got = next_block_record(sr, &rec, err);
        ahead = 0;
        if (got <= 0 || (rec.kind != KVP_KIND_KV_BLOCK && rec.kind != KVP_KIND_BLOCK_REF))
            rc = got < 0 ? got
                         : kvp_err_set(err, KVP_EFORMAT, "%s: sequence %llu: the stream carries KV for %u of its %u "
                                       "blocks", sr->name, (unsigned long long)s.id, bi, nb);
        else
            rc = on_block(sr, &rec, &s, handle, bi, &parent, &sparent, &loading, err);
    }
    if (rc < 0) {
        kvp_kvcache_seq_free(sr->kc, handle);
        return rc;
    }
    out->rec = s;
    out->handle = handle;
    out->stop = (const char *const *)sr->stop; /* the caller's now */
    out->n_stop = sr->n_stop;
    sr->stop = NULL;
    sr->n_stop = 0;
    *tokens = sr->tokens;
    sr->n_seqs++;
    return 1;
}

void kvp_seqio_seqs_free(kvp_seqio_seq *seqs, uint32_t n)
{
    for (uint32_t i = 0; seqs && i < n; i++)
        kvp_seq_stops_free((char **)seqs[i].stop, seqs[i].n_stop);
    free(seqs);
}

int kvp_seqio_read(kvp_reader *r, const char *name, const kvp_model *m, kvp_backend *be,
                   const kvp_kvcache_opts *opts, kvp_kvcache **kc, kvp_seqio_seq **seqs, uint32_t *n,
                   kvp_stop_rec *stop, kvp_err *err)
{
    *kc = NULL;
    *seqs = NULL;
    *n = 0;
    kvp_seqio_reader *sr = NULL;
    kvp_seqio_seq *v = NULL;
    uint32_t k = 0, cap = 0;
    const uint32_t *tok;
    int rc = kvp_seqio_reader_open(&sr, r, name, m, be, opts, err);
    while (rc == 0) {
        kvp_seqio_seq s;
        int got = kvp_seqio_reader_next(sr, &s, &tok, err);
        if (got <= 0) {
            rc = got;
            break;
        }
        /* whole reads keep every block: the cache was sized for the stream */
        if (kvp_kvcache_seq_len(sr->kc, s.handle) != s.rec.n_tokens)
            rc = kvp_err_set(err, KVP_ELIMIT, "%s: sequence %llu: the KV cache has no room for all its blocks; "
                             "raise --kv-mem or --kv-blocks", name, (unsigned long long)s.rec.id);
        if (rc == 0 && k == cap) {
            kvp_seqio_seq *p = realloc(v, (cap ? cap * 2 : 16) * sizeof *p);
            if (!p)
                rc = kvp_err_set(err, KVP_ENOMEM, "out of memory");
            else
                v = p, cap = cap ? cap * 2 : 16;
        }
        if (rc < 0) {
            kvp_seq_stops_free((char **)s.stop, s.n_stop);
            break;
        }
        v[k++] = s;
    }
    if (rc == 0 && !sr->kc) /* no sequence: a cache of the options' own block size */
        rc = kvp_kvcache_create(&sr->kc, &m->cfg, opts, be, err);
    if (rc < 0) {
        kvp_seqio_seqs_free(v, k);
        kvp_seqio_reader_free(sr);
        return rc;
    }
    if (stop && !kvp_seqio_reader_stopped(sr, stop))
        memset(stop, 0, sizeof *stop);
    *kc = kvp_seqio_reader_take_cache(sr);
    kvp_seqio_reader_free(sr);
    *seqs = v;
    *n = k;
    return 0;
}
