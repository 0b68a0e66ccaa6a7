/* seqcheck.c - a KV stream's sequences and blocks (seqcheck.h). */
#include "seqcheck.h"
#include "u64map.h"
#include "wire.h"

#include <stdlib.h>

int kvp_seq_block_check(const kvp_seq_rec *s, const uint32_t *tokens, uint32_t bi, uint64_t parent, uint64_t rec,
                        uint64_t seq_id, uint32_t idx, uint32_t nt, uint64_t rec_parent, uint64_t hash,
                        const uint32_t *block_size, const uint8_t *tokens_le, kvp_err *err)
{
    uint32_t bs = s->block_size;
    uint64_t start = (uint64_t)bi * bs;
    uint32_t want_nt = s->n_tokens - start < bs ? (uint32_t)(s->n_tokens - start) : bs;
    if (seq_id != s->id || idx != bi || nt != want_nt)
        return kvp_err_set(err, KVP_EFORMAT, "record %llu: block %u of sequence %llu (%u tokens) where block %u "
                           "of sequence %llu (%u tokens) belongs", (unsigned long long)rec, idx,
                           (unsigned long long)seq_id, nt, bi, (unsigned long long)s->id, want_nt);
    if (block_size && *block_size != bs)
        return kvp_err_set(err, KVP_EFORMAT, "record %llu: block %u of sequence %llu: block size %u, the "
                           "sequence's is %u", (unsigned long long)rec, bi, (unsigned long long)seq_id, *block_size,
                           bs);
    for (uint32_t i = 0; tokens_le && i < nt; i++)
        if (kvp_le32(tokens_le + 4 * i) != tokens[start + i])
            return kvp_err_set(err, KVP_EFORMAT, "record %llu: block %u's tokens differ from its sequence's",
                               (unsigned long long)rec, bi);
    /* the chain the record names: a reference's was never checked, and a
     * block's hash is its parent's (a wrong one fails the hash below) */
    if (rec_parent != parent)
        return kvp_err_set(err, KVP_EFORMAT, "record %llu: block %u of sequence %llu names parent hash %016llx, "
                           "where %s %016llx", (unsigned long long)rec, bi, (unsigned long long)seq_id,
                           (unsigned long long)rec_parent, bi ? "the hash of its block before is" : "block 0's is",
                           (unsigned long long)parent);
    if (kvp_kvblock_hash(parent, tokens + start, nt) != hash)
        return kvp_err_set(err, KVP_EFORMAT, "record %llu: block %u of sequence %llu: its hash does not match "
                           "the sequence's tokens", (unsigned long long)rec, bi, (unsigned long long)seq_id);
    return 0;
}

struct kvp_seqcheck {
    kvp_u64map ids;    /* sequence ids named so far */
    kvp_u64map blocks; /* hashes of the KV blocks carried so far */
    kvp_seq_rec s;     /* the sequence whose blocks come now */
    uint32_t *tokens;  /* its tokens, host order */
    uint32_t cap;
    uint32_t nb, bi;   /* its blocks, and the next one's index */
    uint64_t parent;   /* the hash of its block before bi */
};

int kvp_seqcheck_new(kvp_seqcheck **c, kvp_err *err)
{
    if (!(*c = calloc(1, sizeof **c)))
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    return 0;
}

void kvp_seqcheck_free(kvp_seqcheck *c)
{
    if (!c)
        return;
    kvp_u64map_free(&c->ids);
    kvp_u64map_free(&c->blocks);
    free(c->tokens);
    free(c);
}

static int owed(const kvp_seqcheck *c, kvp_err *err)
{
    return kvp_err_set(err, KVP_EFORMAT, "sequence %llu: the stream carries KV for %u of its %u blocks",
                       (unsigned long long)c->s.id, c->bi, c->nb);
}

static int on_sequence(kvp_seqcheck *c, const kvp_record *rec, kvp_err *err)
{
    const uint32_t *ids;
    int rc = kvp_seq_decode(rec, &c->s, &ids, err);
    if (rc < 0)
        return rc;
    if (kvp_u64map_get(&c->ids, c->s.id) >= 0)
        return kvp_err_set(err, KVP_EFORMAT, "record %llu: sequence %llu appears twice",
                           (unsigned long long)rec->index, (unsigned long long)c->s.id);
    if (kvp_u64map_put(&c->ids, c->s.id, 1) < 0)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    if (c->s.n_tokens > c->cap) {
        uint32_t *t = realloc(c->tokens, (size_t)c->s.n_tokens * sizeof *t);
        if (!t)
            return kvp_err_set(err, KVP_ENOMEM, "out of memory for %u tokens", c->s.n_tokens);
        c->tokens = t;
        c->cap = c->s.n_tokens;
    }
    for (uint32_t i = 0; i < c->s.n_tokens; i++)
        c->tokens[i] = kvp_le32(&ids[i]);
    /* the decoder has checked the block size is not 0 */
    c->nb = (uint32_t)(((uint64_t)c->s.n_tokens + c->s.block_size - 1) / c->s.block_size);
    c->bi = 0;
    c->parent = 0;
    return 0;
}

static int on_block(kvp_seqcheck *c, const kvp_record *rec, kvp_err *err)
{
    if (c->bi == c->nb)
        return kvp_err_set(err, KVP_EFORMAT, "record %llu: a KV block with no sequence before it",
                           (unsigned long long)rec->index);
    int rc;
    uint64_t hash;
    if (rec->kind == KVP_KIND_KV_BLOCK) {
        kvp_kvblock_rec b;
        const uint8_t *tok_le;
        if ((rc = kvp_kvblock_decode(rec, &b, &tok_le, NULL, NULL, err)) < 0 ||
            (rc = kvp_seq_block_check(&c->s, c->tokens, c->bi, c->parent, rec->index, b.seq_id, b.block_index,
                                      b.n_tokens, b.parent_hash, b.hash, &b.block_size, tok_le, err)) < 0)
            return rc;
        hash = b.hash;
        if (kvp_u64map_put(&c->blocks, hash, 1) < 0)
            return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    } else {
        kvp_blockref_rec r;
        if ((rc = kvp_blockref_decode(rec, &r, err)) < 0 ||
            (rc = kvp_seq_block_check(&c->s, c->tokens, c->bi, c->parent, rec->index, r.seq_id, r.block_index,
                                      r.n_tokens, r.parent_hash, r.hash, NULL, NULL, err)) < 0)
            return rc;
        if (kvp_u64map_get(&c->blocks, r.hash) < 0)
            return kvp_err_set(err, KVP_EFORMAT, "record %llu: refers to block %016llx, which no earlier record holds",
                               (unsigned long long)rec->index, (unsigned long long)r.hash);
        hash = r.hash;
    }
    c->parent = hash;
    c->bi++;
    return 0;
}

int kvp_seqcheck_record(kvp_seqcheck *c, const kvp_record *rec, kvp_err *err)
{
    if (rec->kind == KVP_KIND_KV_BLOCK || rec->kind == KVP_KIND_BLOCK_REF)
        return on_block(c, rec, err);
    if (!kvp_kind_known(rec->kind))
        return 0;
    if (c->bi < c->nb)
        return owed(c, err);
    return rec->kind == KVP_KIND_SEQUENCE ? on_sequence(c, rec, err) : 0;
}

int kvp_seqcheck_end(kvp_seqcheck *c, kvp_err *err) { return c->bi < c->nb ? owed(c, err) : 0; }
