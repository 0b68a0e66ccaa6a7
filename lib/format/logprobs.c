/* logprobs.c - saved next-token distributions as KVP records: SCORES and
 * LOGPROBS, and whole BASE files (see logprobs.h and kvp(5)). */
#include "logprobs.h"

#include "wire.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The fixed part of a LOGPROBS meta: window, n_pos, top_k, n_vocab. */
#define LOGPROBS_META_SIZE 16

/* No section may be larger than this, so the sums of at most four aligned
 * sections below cannot overflow a u64 (and a reader's limit is far lower). */
#define SECTION_MAX (1ull << 62)

/* ---- SCORES ---- */

/* Whether s breaks a rule of kvp(5); why names the field and its value. */
static int scores_invalid(const kvp_scores_rec *s, char *why, size_t n)
{
    if (s->ctx < 2)
        snprintf(why, n, "ctx %u is below 2", s->ctx);
    else if (s->first >= s->ctx - 1)
        snprintf(why, n, "first %u is not below ctx-1 (%u): a window would score nothing", s->first, s->ctx - 1);
    else if (s->n_windows == 0)
        snprintf(why, n, "n_windows is 0");
    else if ((uint64_t)s->n_windows * s->ctx > s->n_tokens)
        snprintf(why, n, "n_windows %u x ctx %u = %llu exceeds n_tokens %llu", s->n_windows, s->ctx,
                 (unsigned long long)s->n_windows * s->ctx, (unsigned long long)s->n_tokens);
    else if (s->n_vocab == 0)
        snprintf(why, n, "n_vocab is 0");
    else if (s->top_k > KVP_LOGPROBS_MAX_K)
        snprintf(why, n, "top_k %u exceeds %u", s->top_k, KVP_LOGPROBS_MAX_K);
    else if (s->top_k && s->top_k >= s->n_vocab)
        snprintf(why, n, "top_k %u is not below n_vocab %u", s->top_k, s->n_vocab);
    else if (s->bos != KVP_SCORES_NO_BOS && s->bos >= s->n_vocab)
        snprintf(why, n, "bos %u is not below n_vocab %u", s->bos, s->n_vocab);
    else
        return 0;
    return 1;
}

static int bad_record(const kvp_record *rec, kvp_err *err, const char *why)
{
    return kvp_err_set(err, KVP_EFORMAT, "record %llu (%s) at offset %llu: %s", (unsigned long long)rec->index,
                       kvp_kind_name(rec->kind), (unsigned long long)rec->offset, why);
}

static int expect_kind(const kvp_record *rec, uint32_t kind, kvp_err *err)
{
    if (rec->kind != kind)
        return kvp_err_set(err, KVP_EINVAL, "record %llu is a %s record, not %s", (unsigned long long)rec->index,
                           kvp_kind_name(rec->kind), kvp_kind_name(kind));
    return 0;
}

int kvp_scores_decode(const kvp_record *rec, kvp_scores_rec *s, kvp_err *err)
{
    int rc = expect_kind(rec, KVP_KIND_SCORES, err);
    if (rc)
        return rc;
    memset(s, 0, sizeof *s);
    kvp_cur c = kvp_cur_make(rec->meta, rec->meta_size);
    s->tokens_hash = kvp_cur_u64(&c);
    s->n_tokens = kvp_cur_u64(&c);
    s->ctx = kvp_cur_u32(&c);
    s->first = kvp_cur_u32(&c);
    s->n_windows = kvp_cur_u32(&c);
    s->n_vocab = kvp_cur_u32(&c);
    s->top_k = kvp_cur_u32(&c);
    s->bos = kvp_cur_u32(&c);
    uint32_t text_len = kvp_cur_u32(&c);
    char why[200];
    if (c.bad)
        return bad_record(rec, err, "meta cut short");
    if (text_len > KVP_NAME_MAX) {
        snprintf(why, sizeof why, "text length %u exceeds %d", text_len, KVP_NAME_MAX);
        return bad_record(rec, err, why);
    }
    const char *text = kvp_cur_take(&c, text_len);
    if (!text)
        return bad_record(rec, err, "meta cut short in the text");
    if (memchr(text, 0, text_len))
        return bad_record(rec, err, "text holds a NUL byte");
    memcpy(s->text, text, text_len);
    /* Bytes after the text are fields of a later minor version: ignored. */
    if (rec->data_size) {
        snprintf(why, sizeof why, "a scores record has no data part, this one has %llu bytes",
                 (unsigned long long)rec->data_size);
        return bad_record(rec, err, why);
    }
    if (scores_invalid(s, why, sizeof why))
        return bad_record(rec, err, why);
    return 0;
}

int kvp_write_scores(kvp_writer *w, const kvp_scores_rec *s, kvp_err *err)
{
    char why[200];
    size_t text_len = strnlen(s->text, sizeof s->text);
    if (text_len > KVP_NAME_MAX)
        return kvp_err_set(err, KVP_EINVAL, "scores record: text name longer than %d bytes", KVP_NAME_MAX);
    if (scores_invalid(s, why, sizeof why))
        return kvp_err_set(err, KVP_EINVAL, "scores record: %s", why);
    kvp_buf b;
    kvp_buf_init(&b);
    kvp_buf_u64(&b, s->tokens_hash);
    kvp_buf_u64(&b, s->n_tokens);
    kvp_buf_u32(&b, s->ctx);
    kvp_buf_u32(&b, s->first);
    kvp_buf_u32(&b, s->n_windows);
    kvp_buf_u32(&b, s->n_vocab);
    kvp_buf_u32(&b, s->top_k);
    kvp_buf_u32(&b, s->bos);
    kvp_buf_str32(&b, s->text, text_len);
    int rc = b.oom ? kvp_err_set(err, KVP_ENOMEM, "scores record: out of memory")
                   : kvp_writer_record(w, KVP_KIND_SCORES, b.data, (uint32_t)b.len, NULL, 0, 0, err);
    kvp_buf_free(&b);
    return rc;
}

/* ---- LOGPROBS ---- */

/* The data part of a window: sections at 64-aligned offsets.  top_k > 0:
 * lp_tok, lp_rest, ids, lp; top_k == 0: lp_tok, lp (full rows). */
typedef struct lp_layout {
    int n;
    uint64_t off[4], len[4];
    uint64_t end; /* data part bytes */
} lp_layout;

/* Shape rules of a window alone (the caller compares it with SCORES). */
static int shape_invalid(uint32_t n_pos, uint32_t top_k, uint32_t n_vocab, char *why, size_t n)
{
    if (n_pos == 0)
        snprintf(why, n, "n_pos is 0");
    else if (n_vocab == 0)
        snprintf(why, n, "n_vocab is 0");
    else if (top_k > KVP_LOGPROBS_MAX_K)
        snprintf(why, n, "top_k %u exceeds %u", top_k, KVP_LOGPROBS_MAX_K);
    else if (top_k && top_k >= n_vocab)
        snprintf(why, n, "top_k %u is not below n_vocab %u", top_k, n_vocab);
    else
        return 0;
    return 1;
}

/* 0, or -1 when a section would be absurdly large (full rows of a huge
 * vocabulary): no u64 product or sum below overflows. */
static int lp_layout_of(uint32_t n_pos, uint32_t top_k, uint32_t n_vocab, lp_layout *L)
{
    uint64_t row = (uint64_t)n_pos * 4; /* < 2^34 */
    /* n_pos * top_k < 2^44; n_pos * n_vocab < 2^64 but x4 may not be. */
    uint64_t cells = (uint64_t)n_pos * (top_k ? top_k : n_vocab);
    if (cells > SECTION_MAX / 4)
        return -1;
    uint64_t lens[4] = {row, row, cells * 4, cells * 4};
    if (!top_k)
        lens[1] = cells * 4;
    L->n = top_k ? 4 : 2;
    uint64_t pos = 0;
    for (int i = 0; i < L->n; i++) {
        L->off[i] = kvp_align_up(pos, KVP_ALIGN);
        L->len[i] = lens[i];
        pos = L->off[i] + lens[i];
    }
    L->end = pos;
    return 0;
}

/* A natural log of a probability: <= 0, -inf allowed; NaN fails too. */
static int lp_ok(float x) { return x <= 0.0f; }

/* Repeats among a row's ids in O(top_k): a bitmap over the vocabulary,
 * its bits cleared again after each row; for a vocabulary too large for one
 * (more than IDMAP_MAX_VOCAB ids, 2 MiB of bits; no model comes near), a
 * sorted copy of the row. */
#define IDMAP_MAX_VOCAB (1u << 24)

typedef struct idcheck {
    uint64_t *bits; /* n_vocab bits, or NULL: sort instead */
    uint32_t *copy; /* [top_k] */
} idcheck;

static int idcheck_init(idcheck *c, uint32_t top_k, uint32_t n_vocab)
{
    c->bits = NULL;
    c->copy = NULL;
    if (n_vocab <= IDMAP_MAX_VOCAB)
        c->bits = calloc(((size_t)n_vocab + 63) / 64, sizeof *c->bits);
    else
        c->copy = malloc((size_t)top_k * sizeof *c->copy);
    return c->bits || c->copy ? 0 : -1;
}

static void idcheck_free(idcheck *c)
{
    free(c->bits);
    free(c->copy);
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* A repeated id of ids[0..k) (all below the bitmap's n_vocab), or -1. */
static int64_t idcheck_repeat(idcheck *c, const uint32_t *ids, uint32_t k)
{
    int64_t rep = -1;
    if (!c->bits) {
        memcpy(c->copy, ids, (size_t)k * sizeof *ids);
        qsort(c->copy, k, sizeof *c->copy, cmp_u32);
        for (uint32_t j = 1; j < k && rep < 0; j++)
            if (c->copy[j] == c->copy[j - 1])
                rep = c->copy[j];
        return rep;
    }
    uint32_t j;
    for (j = 0; j < k; j++) {
        uint64_t bit = 1ull << (ids[j] % 64);
        if (c->bits[ids[j] / 64] & bit) {
            rep = ids[j];
            break;
        }
        c->bits[ids[j] / 64] |= bit;
    }
    while (j-- > 0) /* ids[0..j) set their bits (distinct): clear them */
        c->bits[ids[j] / 64] &= ~(1ull << (ids[j] % 64));
    return rep;
}

/* Check every value of a window whose shape is valid.  0, KVP_EFORMAT with
 * why filled, or KVP_ENOMEM. */
static int values_invalid(const kvp_logprobs_view *v, char *why, size_t n)
{
    for (uint32_t r = 0; r < v->n_pos; r++)
        if (!lp_ok(v->lp_tok[r])) {
            snprintf(why, n, "lp_tok[%u] = %g is not a log-probability (<= 0)", r, (double)v->lp_tok[r]);
            return KVP_EFORMAT;
        }
    if (!v->top_k) {
        uint64_t cells = (uint64_t)v->n_pos * v->n_vocab;
        for (uint64_t i = 0; i < cells; i++)
            if (!lp_ok(v->lp[i])) {
                snprintf(why, n, "row %llu: lp[%llu] = %g is not a log-probability (<= 0)",
                         (unsigned long long)(i / v->n_vocab), (unsigned long long)(i % v->n_vocab),
                         (double)v->lp[i]);
                return KVP_EFORMAT;
            }
        return 0;
    }
    idcheck ic;
    if (idcheck_init(&ic, v->top_k, v->n_vocab))
        return KVP_ENOMEM;
    int rc = 0;
    uint32_t k = v->top_k;
    for (uint32_t r = 0; r < v->n_pos && !rc; r++) {
        const uint32_t *ids = v->ids + (uint64_t)r * k;
        const float *lp = v->lp + (uint64_t)r * k;
        rc = KVP_EFORMAT;
        if (!lp_ok(v->lp_rest[r])) {
            snprintf(why, n, "lp_rest[%u] = %g is not a log-probability (<= 0)", r, (double)v->lp_rest[r]);
            break;
        }
        uint32_t j;
        for (j = 0; j < k; j++) {
            if (ids[j] >= v->n_vocab) {
                snprintf(why, n, "row %u: ids[%u] = %u is not below n_vocab %u", r, j, ids[j], v->n_vocab);
                break;
            }
            if (!lp_ok(lp[j])) {
                snprintf(why, n, "row %u: lp[%u] = %g is not a log-probability (<= 0)", r, j, (double)lp[j]);
                break;
            }
            if (j > 0 && lp[j] > lp[j - 1]) {
                snprintf(why, n, "row %u: lp[%u] = %g is above lp[%u] = %g (not most probable first)", r, j,
                         (double)lp[j], j - 1, (double)lp[j - 1]);
                break;
            }
        }
        if (j < k)
            break;
        int64_t rep = idcheck_repeat(&ic, ids, k);
        if (rep >= 0) {
            snprintf(why, n, "row %u: id %lld appears twice", r, (long long)rep);
            break;
        }
        rc = 0;
    }
    idcheck_free(&ic);
    return rc;
}

int kvp_logprobs_decode(const kvp_record *rec, kvp_logprobs_view *v, kvp_err *err)
{
    int rc = expect_kind(rec, KVP_KIND_LOGPROBS, err);
    if (rc)
        return rc;
    memset(v, 0, sizeof *v);
    kvp_cur c = kvp_cur_make(rec->meta, rec->meta_size);
    v->window = kvp_cur_u32(&c);
    v->n_pos = kvp_cur_u32(&c);
    v->top_k = kvp_cur_u32(&c);
    v->n_vocab = kvp_cur_u32(&c);
    char why[240];
    if (c.bad)
        return bad_record(rec, err, "meta cut short");
    /* Bytes after the fixed meta are fields of a later minor version. */
    if (shape_invalid(v->n_pos, v->top_k, v->n_vocab, why, sizeof why))
        return bad_record(rec, err, why);
    lp_layout L = {0};
    if (lp_layout_of(v->n_pos, v->top_k, v->n_vocab, &L) || L.end != rec->data_size) {
        char need[32] = "more than 2^62";
        if (L.n)
            snprintf(need, sizeof need, "%llu", (unsigned long long)L.end);
        snprintf(why, sizeof why, "window %u: data part holds %llu bytes, n_pos %u, top_k %u and n_vocab %u need %s",
                 v->window, (unsigned long long)rec->data_size, v->n_pos, v->top_k, v->n_vocab, need);
        return bad_record(rec, err, why);
    }
    /* The reader gives 64-aligned data; a record made by hand might not be. */
    if ((uintptr_t)rec->data % 4)
        return kvp_err_set(err, KVP_EINVAL, "record %llu (logprobs): data part is not 4-byte aligned",
                           (unsigned long long)rec->index);
    v->lp_tok = (const float *)(const void *)(rec->data + L.off[0]);
    if (v->top_k) {
        v->lp_rest = (const float *)(const void *)(rec->data + L.off[1]);
        v->ids = (const uint32_t *)(const void *)(rec->data + L.off[2]);
        v->lp = (const float *)(const void *)(rec->data + L.off[3]);
    } else {
        v->lp = (const float *)(const void *)(rec->data + L.off[1]);
    }
    char what[200];
    rc = values_invalid(v, what, sizeof what);
    if (rc == KVP_ENOMEM)
        return kvp_err_set(err, rc, "record %llu (logprobs): out of memory", (unsigned long long)rec->index);
    if (rc) {
        snprintf(why, sizeof why, "window %u: %s", v->window, what);
        return bad_record(rec, err, why);
    }
    return 0;
}

int kvp_write_logprobs(kvp_writer *w, const kvp_logprobs_view *v, kvp_err *err)
{
    char why[200];
    lp_layout L = {0};
    if (shape_invalid(v->n_pos, v->top_k, v->n_vocab, why, sizeof why))
        return kvp_err_set(err, KVP_EINVAL, "logprobs window %u: %s", v->window, why);
    if (lp_layout_of(v->n_pos, v->top_k, v->n_vocab, &L))
        return kvp_err_set(err, KVP_EINVAL, "logprobs window %u: %u rows of %u are too large", v->window, v->n_pos,
                           v->n_vocab);
    if (!v->lp_tok || !v->lp || (v->top_k && (!v->lp_rest || !v->ids)))
        return kvp_err_set(err, KVP_EINVAL, "logprobs window %u: a section of the view is missing", v->window);
    /* Refuse what a reader would refuse, so no file is written in vain. */
    int rc = values_invalid(v, why, sizeof why);
    if (rc == KVP_ENOMEM)
        return kvp_err_set(err, rc, "logprobs window %u: out of memory", v->window);
    if (rc)
        return kvp_err_set(err, KVP_EINVAL, "logprobs window %u: %s", v->window, why);
    uint8_t meta[LOGPROBS_META_SIZE];
    kvp_put32(meta, v->window);
    kvp_put32(meta + 4, v->n_pos);
    kvp_put32(meta + 8, v->top_k);
    kvp_put32(meta + 12, v->n_vocab);
    kvp_piece pieces[4] = {{v->lp_tok, L.len[0]}, {NULL, 0}, {NULL, 0}, {NULL, 0}};
    if (v->top_k) {
        pieces[1] = (kvp_piece){v->lp_rest, L.len[1]};
        pieces[2] = (kvp_piece){v->ids, L.len[2]};
        pieces[3] = (kvp_piece){v->lp, L.len[3]};
    } else {
        pieces[1] = (kvp_piece){v->lp, L.len[1]};
    }
    return kvp_writer_record(w, KVP_KIND_LOGPROBS, meta, sizeof meta, pieces, L.n, 1, err);
}

/* ======================================================================
 * a whole BASE file
 * ====================================================================== */

struct kvp_lpfile_writer {
    kvp_out out;
    kvp_writer *w;
    kvp_scores_rec s;
    uint32_t next;  /* window the next put must carry */
    int broken;     /* a write failed: the stream is cut, only abort remains */
};

int kvp_lpfile_create(kvp_lpfile_writer **fwp, const char *path, const uint8_t fingerprint[KVP_FINGERPRINT_SIZE],
                      const char *producer, const kvp_scores_rec *s, kvp_err *err)
{
    *fwp = NULL;
    char why[200];
    /* Checked before the output exists, so a bad call leaves nothing behind. */
    if (strnlen(s->text, sizeof s->text) > KVP_NAME_MAX)
        return kvp_err_set(err, KVP_EINVAL, "%s: scores record: text name longer than %d bytes", path,
                           KVP_NAME_MAX);
    if (scores_invalid(s, why, sizeof why))
        return kvp_err_set(err, KVP_EINVAL, "%s: scores record: %s", path, why);
    kvp_lpfile_writer *fw = calloc(1, sizeof *fw);
    if (!fw)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", path);
    fw->s = *s;
    int rc = kvp_out_open(&fw->out, path, err);
    if (rc) {
        free(fw);
        return rc;
    }
    kvp_writer_opts o = {.producer = producer};
    if (fingerprint)
        memcpy(o.fingerprint, fingerprint, KVP_FINGERPRINT_SIZE);
    rc = kvp_writer_open(&fw->w, &fw->out, &o, err);
    if (!rc)
        rc = kvp_write_scores(fw->w, s, err);
    if (rc) {
        kvp_lpfile_abort(fw);
        return rc;
    }
    *fwp = fw;
    return 0;
}

int kvp_lpfile_put(kvp_lpfile_writer *fw, const kvp_logprobs_view *v, kvp_err *err)
{
    const char *name = kvp_out_name(&fw->out);
    const kvp_scores_rec *s = &fw->s;
    if (fw->broken)
        return kvp_err_set(err, KVP_EINVAL, "%s: a window after a failed write", name);
    if (fw->next >= s->n_windows)
        return kvp_err_set(err, KVP_EINVAL, "%s: window %u is one more than the %u the scores record announces",
                           name, v->window, s->n_windows);
    if (v->window != fw->next)
        return kvp_err_set(err, KVP_EINVAL, "%s: window %u where window %u comes next", name, v->window, fw->next);
    if (v->n_pos != kvp_scores_n_pos(s) || v->top_k != s->top_k || v->n_vocab != s->n_vocab)
        return kvp_err_set(err, KVP_EINVAL,
                           "%s: window %u has n_pos %u, top_k %u, n_vocab %u; the scores record says %u, %u, %u",
                           name, v->window, v->n_pos, v->top_k, v->n_vocab, kvp_scores_n_pos(s), s->top_k,
                           s->n_vocab);
    uint64_t before = fw->out.pos;
    int rc = kvp_write_logprobs(fw->w, v, err);
    if (rc) {
        /* A refused view wrote nothing; a failed write left part of a record. */
        fw->broken = fw->out.pos != before;
        if (!fw->broken) /* an I/O error names the output already */
            kvp_err_prefix(err, "%s", name);
        return rc;
    }
    fw->next++;
    return 0;
}

int kvp_lpfile_seal(kvp_lpfile_writer *fw, kvp_err *err)
{
    const char *name = kvp_out_name(&fw->out);
    int rc = 0;
    if (fw->broken)
        rc = kvp_err_set(err, KVP_EINVAL, "%s: finished after a failed write", name);
    else if (fw->next != fw->s.n_windows)
        rc = kvp_err_set(err, KVP_EINVAL, "%s: %u windows written, the scores record announces %u", name, fw->next,
                         fw->s.n_windows);
    if (!rc)
        rc = kvp_writer_finish(fw->w, err);
    if (!rc)
        rc = kvp_out_seal(&fw->out, err);
    if (rc)
        kvp_lpfile_abort(fw);
    return rc;
}

int kvp_lpfile_commit(kvp_lpfile_writer *fw, kvp_err *err)
{
    int rc = kvp_out_commit(&fw->out, err);
    kvp_lpfile_abort(fw); /* after a commit: frees only */
    return rc;
}

int kvp_lpfile_finish(kvp_lpfile_writer *fw, kvp_err *err)
{
    int rc = kvp_lpfile_seal(fw, err);
    return rc ? rc : kvp_lpfile_commit(fw, err);
}

void kvp_lpfile_abort(kvp_lpfile_writer *fw)
{
    if (!fw)
        return;
    kvp_writer_free(fw->w);
    kvp_out_abort(&fw->out);
    free(fw);
}

struct kvp_lpfile {
    kvp_in in;
    kvp_reader *r;
    kvp_scores_rec s;
    uint32_t next;    /* window the next LOGPROBS must carry */
    int state;        /* LPF_* */
};

enum { LPF_WINDOWS = 0, LPF_DONE = 1, LPF_FAILED = 2 };

/* Kinds this version knows (kvp_kind_name gives them a name). */
static int kind_known(uint32_t kind) { return strcmp(kvp_kind_name(kind), "unknown") != 0; }

int kvp_lpfile_open(kvp_lpfile **fp, const char *path, kvp_scores_rec *s, kvp_err *err)
{
    *fp = NULL;
    kvp_lpfile *f = calloc(1, sizeof *f);
    if (!f)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", path);
    int rc = kvp_in_open(&f->in, path, err);
    if (rc) {
        free(f);
        return rc;
    }
    const char *name = f->in.name;
    rc = kvp_reader_open(&f->r, &f->in, err);
    kvp_record rec;
    while (!rc) {
        rc = kvp_reader_next(f->r, &rec, err);
        if (rc == 1 && rec.kind == KVP_KIND_SCORES) {
            if ((rc = kvp_scores_decode(&rec, &f->s, err)) != 0)
                kvp_err_prefix(err, "%s", name);
            break;
        }
        if (rc == 1 && kind_known(rec.kind))
            rc = kvp_err_set(err, KVP_EFORMAT, "%s: not a saved-distributions file (record %llu is a%s %s record, "
                             "before any scores record)", name, (unsigned long long)rec.index,
                             rec.kind == KVP_KIND_END ? "n" : "", kvp_kind_name(rec.kind));
        else if (rc == 1)
            rc = 0; /* a kind of a later version: skipped */
        else if (rc == 0) /* the reader ends cleanly only after END, which stops us above */
            rc = kvp_err_set(err, KVP_EFORMAT, "%s: no scores record", name);
    }
    if (rc < 0) {
        kvp_lpfile_close(f);
        return rc;
    }
    *s = f->s;
    *fp = f;
    return 0;
}

const uint8_t *kvp_lpfile_fingerprint(const kvp_lpfile *f) { return kvp_reader_info(f->r)->fingerprint; }

static int lpfile_next(kvp_lpfile *f, kvp_logprobs_view *v, kvp_err *err)
{
    const char *name = f->in.name;
    const kvp_scores_rec *s = &f->s;
    kvp_record rec;
    for (;;) {
        int rc = kvp_reader_next(f->r, &rec, err);
        if (rc <= 0)
            return rc ? rc : kvp_err_set(err, KVP_EFORMAT, "%s: stream ended before its end record", name);
        unsigned long long idx = (unsigned long long)rec.index, off = (unsigned long long)rec.offset;
        if (rec.kind == KVP_KIND_END) {
            if (f->next != s->n_windows)
                return kvp_err_set(err, KVP_EFORMAT,
                                   "%s: record %llu (end) at offset %llu: the scores record announces %u windows, "
                                   "%u came", name, idx, off, s->n_windows, f->next);
            /* Nothing may follow END: one more read proves the clean end. */
            if ((rc = kvp_reader_next(f->r, &rec, err)) < 0)
                return rc;
            f->state = LPF_DONE;
            return 0;
        }
        if (rec.kind != KVP_KIND_LOGPROBS) {
            if (!kind_known(rec.kind))
                continue;
            return kvp_err_set(err, KVP_EFORMAT, "%s: record %llu at offset %llu: a %s record among the windows",
                               name, idx, off, kvp_kind_name(rec.kind));
        }
        if ((rc = kvp_logprobs_decode(&rec, v, err)) != 0) {
            kvp_err_prefix(err, "%s", name);
            return rc;
        }
        if (f->next >= s->n_windows)
            return kvp_err_set(err, KVP_EFORMAT,
                               "%s: record %llu (logprobs) at offset %llu: window %u is more than the %u the scores "
                               "record announces", name, idx, off, v->window, s->n_windows);
        if (v->window != f->next)
            return kvp_err_set(err, KVP_EFORMAT,
                               "%s: record %llu (logprobs) at offset %llu: window %u where window %u comes next", name,
                               idx, off, v->window, f->next);
        if (v->n_pos != kvp_scores_n_pos(s) || v->top_k != s->top_k || v->n_vocab != s->n_vocab)
            return kvp_err_set(err, KVP_EFORMAT,
                               "%s: record %llu (logprobs) at offset %llu: window %u has n_pos %u, top_k %u, n_vocab "
                               "%u; the scores record says %u, %u, %u",
                               name, idx, off, v->window, v->n_pos, v->top_k, v->n_vocab, kvp_scores_n_pos(s), s->top_k,
                               s->n_vocab);
        f->next++;
        return 1;
    }
}

int kvp_lpfile_next(kvp_lpfile *f, kvp_logprobs_view *v, kvp_err *err)
{
    memset(v, 0, sizeof *v);
    if (f->state == LPF_DONE)
        return 0;
    if (f->state == LPF_FAILED)
        return kvp_err_set(err, KVP_EINVAL, "%s: read on after an error", f->in.name);
    int rc = lpfile_next(f, v, err);
    if (rc < 0) {
        memset(v, 0, sizeof *v);
        f->state = LPF_FAILED;
    }
    return rc;
}

void kvp_lpfile_close(kvp_lpfile *f)
{
    if (!f)
        return;
    kvp_reader_free(f->r);
    kvp_in_close(&f->in);
    free(f);
}
