/* tpmsg.c - encoding and checking the driver's messages (tpmsg.h). */
#include "tpmsg.h"

#include <stdlib.h>
#include <string.h>

void kvp_tpmsg_buf_free(kvp_tpmsg_buf *b)
{
    free(b->w);
    memset(b, 0, sizeof *b);
}

static int reserve(kvp_tpmsg_buf *b, size_t more, kvp_err *err)
{
    if (b->n + more <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + more)
        cap *= 2;
    uint32_t *w = realloc(b->w, cap * sizeof *w);
    if (!w)
        return kvp_err_set(err, KVP_ENOMEM, "parallel job: out of memory for a message of %zu words", cap);
    b->w = w;
    b->cap = cap;
    return 0;
}

static void put(kvp_tpmsg_buf *b, const void *src, size_t words)
{
    if (words) /* an empty array may be NULL */
        memcpy(b->w + b->n, src, words * sizeof(uint32_t));
    b->n += words;
}

static void put1(kvp_tpmsg_buf *b, uint32_t x) { b->w[b->n++] = x; }

int kvp_tpmsg_put_setup(kvp_tpmsg_buf *b, const kvp_tpmsg_setup *s, kvp_err *err)
{
    b->n = 0;
    int rc = reserve(b, 7, err);
    if (rc < 0)
        return rc;
    put1(b, KVP_TPMSG_MAGIC), put1(b, KVP_TPMSG_SETUP);
    put1(b, s->n_blocks), put1(b, s->block_size), put1(b, s->dtype), put1(b, s->n_layer), put1(b, s->n_vocab);
    return 0;
}

int kvp_tpmsg_put_bare(kvp_tpmsg_buf *b, uint32_t kind, kvp_err *err)
{
    b->n = 0;
    int rc = reserve(b, 2, err);
    if (rc < 0)
        return rc;
    put1(b, KVP_TPMSG_MAGIC), put1(b, kind);
    return 0;
}

int kvp_tpmsg_put_kv(kvp_tpmsg_buf *b, uint32_t kind, uint32_t block, kvp_err *err)
{
    b->n = 0;
    int rc = reserve(b, 3, err);
    if (rc < 0)
        return rc;
    put1(b, KVP_TPMSG_MAGIC), put1(b, kind), put1(b, block);
    return 0;
}

int kvp_tpmsg_put_step(kvp_tpmsg_buf *b, const kvp_tpmsg_step *s, kvp_err *err)
{
    b->n = 0;
    size_t words = 6 + 4 * (size_t)s->n_tok + s->n_rows + s->n_seqs + 2 * (size_t)s->n_copies;
    for (uint32_t i = 0; i < s->n_seqs; i++)
        words += s->n_table[i];
    int rc = reserve(b, words, err);
    if (rc < 0)
        return rc;
    put1(b, KVP_TPMSG_MAGIC), put1(b, KVP_TPMSG_STEP);
    put1(b, s->n_tok), put1(b, s->n_rows), put1(b, s->n_seqs), put1(b, s->n_copies);
    put(b, s->tok, s->n_tok), put(b, s->pos, s->n_tok), put(b, s->slot, s->n_tok), put(b, s->tok_seq, s->n_tok);
    put(b, s->rows, s->n_rows);
    put(b, s->n_table, s->n_seqs);
    for (uint32_t i = 0; i < s->n_seqs; i++)
        put(b, s->tables[i], s->n_table[i]);
    put(b, s->copies, 2 * (size_t)s->n_copies);
    return 0;
}

/* ---- decoding ---- */

typedef struct rd {
    const uint32_t *w;
    size_t n, at;
} rd;

static const uint32_t *take(rd *r, size_t words)
{
    if (words > r->n - r->at)
        return NULL;
    const uint32_t *p = r->w + r->at;
    r->at += words;
    return p;
}

static int trunc_err(kvp_err *err, const char *what)
{
    return kvp_err_set(err, KVP_ETRUNC, "rank 0's message: ends inside %s", what);
}

/* Every index of the step against the pool (lim). */
static int check_step(const kvp_tpmsg_step *s, const kvp_tpmsg_setup *lim, kvp_err *err)
{
    uint32_t bs = lim->block_size;
    for (uint32_t i = 0; i < s->n_seqs; i++)
        for (uint32_t j = 0; j < s->n_table[i]; j++)
            if (s->tables[i][j] >= lim->n_blocks)
                return kvp_err_set(err, KVP_EFORMAT, "rank 0's message: sequence %u's block %u is %u, "
                                   "past the pool's %u", i, j, s->tables[i][j], lim->n_blocks);
    for (uint32_t t = 0; t < s->n_tok; t++) {
        if (s->tok[t] < 0 || (uint32_t)s->tok[t] >= lim->n_vocab)
            return kvp_err_set(err, KVP_EFORMAT, "rank 0's message: token %u is id %d, outside the "
                               "vocabulary of %u", t, s->tok[t], lim->n_vocab);
        if (s->tok_seq[t] >= s->n_seqs)
            return kvp_err_set(err, KVP_EFORMAT, "rank 0's message: token %u names sequence %u of %u", t,
                               s->tok_seq[t], s->n_seqs);
        uint32_t q = s->tok_seq[t];
        if (s->pos[t] < 0 || (uint32_t)s->pos[t] / bs >= s->n_table[q])
            return kvp_err_set(err, KVP_EFORMAT, "rank 0's message: token %u at position %d is past its "
                               "sequence's %u blocks", t, s->pos[t], s->n_table[q]);
        uint64_t want = (uint64_t)s->tables[q][(uint32_t)s->pos[t] / bs] * bs + (uint32_t)s->pos[t] % bs;
        if (s->slot[t] != want)
            return kvp_err_set(err, KVP_EFORMAT, "rank 0's message: token %u's slot %u is not its "
                               "position's (%llu)", t, s->slot[t], (unsigned long long)want);
    }
    for (uint32_t i = 0; i < s->n_rows; i++)
        if (s->rows[i] >= s->n_tok || (i && s->rows[i] <= s->rows[i - 1]))
            return kvp_err_set(err, KVP_EFORMAT, "rank 0's message: logits row %u is token %u (of %u, "
                               "increasing)", i, s->rows[i], s->n_tok);
    for (uint32_t i = 0; i < 2 * s->n_copies; i++)
        if (s->copies[i] >= lim->n_blocks)
            return kvp_err_set(err, KVP_EFORMAT, "rank 0's message: block copy %u names block %u of %u",
                               i / 2, s->copies[i], lim->n_blocks);
    return 0;
}

static int decode_step(kvp_tpmsg *m, rd *r, const kvp_tpmsg_setup *lim, kvp_err *err)
{
    kvp_tpmsg_step *s = &m->step;
    const uint32_t *h = take(r, 4);
    if (!h)
        return trunc_err(err, "the step's counts");
    s->n_tok = h[0], s->n_rows = h[1], s->n_seqs = h[2], s->n_copies = h[3];
    if (s->n_tok > KVP_TPMSG_MAX_TOK || s->n_rows > s->n_tok || s->n_seqs > s->n_tok ||
        s->n_copies > lim->n_blocks)
        return kvp_err_set(err, KVP_ELIMIT, "rank 0's message: %u tokens, %u rows, %u sequences, %u copies "
                           "(at most %u tokens, rows and sequences at most the tokens, copies at most the %u blocks)",
                           s->n_tok, s->n_rows, s->n_seqs, s->n_copies, KVP_TPMSG_MAX_TOK, lim->n_blocks);
    const uint32_t *tok = take(r, s->n_tok), *pos = take(r, s->n_tok);
    s->slot = take(r, s->n_tok);
    s->tok_seq = take(r, s->n_tok);
    s->rows = take(r, s->n_rows);
    s->n_table = take(r, s->n_seqs);
    if (!tok || !pos || !s->slot || !s->tok_seq || !s->rows || !s->n_table)
        return trunc_err(err, "the step's arrays");
    s->tok = (const int32_t *)tok;
    s->pos = (const int32_t *)pos;
    m->tables_mem = calloc(s->n_seqs ? s->n_seqs : 1, sizeof *m->tables_mem);
    if (!m->tables_mem)
        return kvp_err_set(err, KVP_ENOMEM, "rank 0's message: out of memory");
    s->tables = m->tables_mem;
    for (uint32_t i = 0; i < s->n_seqs; i++) {
        if (s->n_table[i] > lim->n_blocks)
            return kvp_err_set(err, KVP_ELIMIT, "rank 0's message: sequence %u has %u blocks, the pool %u", i,
                               s->n_table[i], lim->n_blocks);
        if (!(m->tables_mem[i] = take(r, s->n_table[i])))
            return trunc_err(err, "a block table");
    }
    if (!(s->copies = take(r, 2 * (size_t)s->n_copies)))
        return trunc_err(err, "the block copies");
    return check_step(s, lim, err);
}

int kvp_tpmsg_decode(kvp_tpmsg *m, const uint32_t *w, size_t n, const kvp_tpmsg_setup *lim, kvp_err *err)
{
    memset(m, 0, sizeof *m);
    rd r = {.w = w, .n = n};
    const uint32_t *h = take(&r, 2);
    if (!h)
        return trunc_err(err, "its head");
    if (h[0] != KVP_TPMSG_MAGIC)
        return kvp_err_set(err, KVP_EFORMAT, "rank 0's message: magic %08x, not %08x", h[0], KVP_TPMSG_MAGIC);
    m->kind = h[1];
    int rc = 0;
    switch (m->kind) {
    case KVP_TPMSG_SETUP: {
        const uint32_t *s = take(&r, 5);
        if (!s)
            return trunc_err(err, "the setup");
        m->setup = (kvp_tpmsg_setup){s[0], s[1], s[2], s[3], s[4]};
        if (!m->setup.n_blocks || !m->setup.block_size)
            return kvp_err_set(err, KVP_EFORMAT, "rank 0's message: a pool of %u blocks of %u tokens",
                               m->setup.n_blocks, m->setup.block_size);
        break;
    }
    case KVP_TPMSG_STOP:
    case KVP_TPMSG_END:
        break;
    case KVP_TPMSG_KV_READ:
    case KVP_TPMSG_KV_WRITE: {
        const char *what = m->kind == KVP_TPMSG_KV_READ ? "read" : "write";
        const uint32_t *b = take(&r, 1);
        if (!b)
            return trunc_err(err, m->kind == KVP_TPMSG_KV_READ ? "the block to read" : "the block to write");
        if (!lim)
            return kvp_err_set(err, KVP_EFORMAT, "rank 0's message: a block %s before the setup", what);
        if (*b >= lim->n_blocks)
            return kvp_err_set(err, KVP_EFORMAT, "rank 0's message: %s of block %u of %u", what, *b,
                               lim->n_blocks);
        m->block = *b;
        break;
    }
    case KVP_TPMSG_STEP:
        if (!lim)
            return kvp_err_set(err, KVP_EFORMAT, "rank 0's message: a step before the setup");
        rc = decode_step(m, &r, lim, err);
        break;
    default:
        return kvp_err_set(err, KVP_EFORMAT, "rank 0's message: unknown kind %u", m->kind);
    }
    if (rc == 0 && r.at != r.n)
        rc = kvp_err_set(err, KVP_EFORMAT, "rank 0's message: %zu words past its end", r.n - r.at);
    if (rc < 0)
        kvp_tpmsg_free(m);
    return rc;
}

void kvp_tpmsg_free(kvp_tpmsg *m)
{
    free(m->tables_mem);
    m->tables_mem = NULL;
}
