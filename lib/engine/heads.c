/* heads.c - Medusa heads: the residual block, the heads file, the drafter
 * (see heads.h). */
#include "heads.h"

#include "fingerprint.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVP_HEADS_MAX_EMBD 65536u /* a width no model has reached; bounds what a file may ask for */

int kvp_heads_init(kvp_heads *h, uint32_t n_heads, uint32_t n_embd, const uint8_t fp[KVP_FINGERPRINT_SIZE],
                   kvp_err *err)
{
    memset(h, 0, sizeof *h);
    kvp_meta_init(&h->info);
    if (n_heads < 1 || n_heads > KVP_HEADS_MAX)
        return kvp_err_set(err, KVP_EINVAL, "heads: %u heads (1..%u)", n_heads, KVP_HEADS_MAX);
    if (n_embd < 1 || n_embd > KVP_HEADS_MAX_EMBD)
        return kvp_err_set(err, KVP_EINVAL, "heads: width %u (1..%u)", n_embd, KVP_HEADS_MAX_EMBD);
    h->n_heads = n_heads;
    h->n_embd = n_embd;
    h->w1 = calloc((size_t)n_heads * n_embd * n_embd, sizeof *h->w1);
    h->b1 = calloc((size_t)n_heads * n_embd, sizeof *h->b1);
    if (fp)
        memcpy(h->fingerprint, fp, KVP_FINGERPRINT_SIZE);
    if (!h->w1 || !h->b1)
        return kvp_err_set(err, KVP_ENOMEM, "heads: out of memory for %u heads of width %u", n_heads, n_embd);
    return 0;
}

void kvp_heads_free(kvp_heads *h)
{
    free(h->w1);
    free(h->b1);
    kvp_meta_free(&h->info);
    memset(h, 0, sizeof *h);
}

static float silu(float a) { return a / (1.0f + expf(-a)); }

void kvp_heads_apply(const kvp_heads *h, uint32_t k, const float *x, float *z, float *a)
{
    uint32_t d = h->n_embd;
    const float *w = h->w1 + (size_t)k * d * d, *b = h->b1 + (size_t)k * d;
    for (uint32_t o = 0; o < d; o++) {
        const float *row = w + (size_t)o * d;
        float s = 0;
        for (uint32_t i = 0; i < d; i++)
            s += row[i] * x[i];
        s += b[o];
        if (a)
            a[o] = s;
        z[o] = x[o] + silu(s);
    }
}

/* ---- the file ---- */

static void tensor_rec(kvp_tensor_rec *t, const char *name, uint32_t n_dim, uint64_t d0, uint64_t d1)
{
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = KVP_DTYPE_F32;
    t->n_dim = n_dim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->global_scale = 1;
    t->data_bytes = (n_dim == 2 ? d0 * d1 : d0) * sizeof(float);
}

static int write_body(const kvp_heads *h, kvp_writer *w, kvp_err *err)
{
    kvp_meta m;
    kvp_meta_init(&m);
    int rc = 0;
    for (size_t i = 0; i < h->info.n && rc == 0; i++) /* training facts; the shape keys are h's own */
        if (strncmp(h->info.e[i].key, "medusa.", 7) == 0 && h->info.e[i].type == KVP_META_STR)
            rc = kvp_meta_set_str(&m, h->info.e[i].key, h->info.e[i].str, h->info.e[i].n);
        else if (strncmp(h->info.e[i].key, "medusa.", 7) == 0 && h->info.e[i].type == KVP_META_F64)
            rc = kvp_meta_set_f64(&m, h->info.e[i].key, h->info.e[i].v.f);
        else if (strncmp(h->info.e[i].key, "medusa.", 7) == 0 && h->info.e[i].type == KVP_META_U64)
            rc = kvp_meta_set_u64(&m, h->info.e[i].key, h->info.e[i].v.u);
    if (rc == 0 && !kvp_meta_find(&m, "medusa.arch")) /* given: a test's spoiled file */
        rc = kvp_meta_set_str(&m, "medusa.arch", KVP_HEADS_ARCH, strlen(KVP_HEADS_ARCH));
    if (rc == 0)
        rc = kvp_meta_set_u64(&m, "medusa.n_heads", h->n_heads);
    if (rc == 0)
        rc = kvp_meta_set_u64(&m, "medusa.n_embd", h->n_embd);
    if (rc < 0) {
        kvp_meta_free(&m);
        return kvp_err_set(err, KVP_ENOMEM, "heads: out of memory");
    }
    rc = kvp_write_meta(w, KVP_KIND_CONFIG, &m, err);
    kvp_meta_free(&m);
    size_t d = h->n_embd;
    for (uint32_t k = 0; k < h->n_heads && rc == 0; k++) {
        kvp_tensor_rec t;
        char name[64];
        snprintf(name, sizeof name, "medusa.%u.w1", k + 1);
        tensor_rec(&t, name, 2, d, d);
        if ((rc = kvp_write_tensor(w, &t, h->w1 + k * d * d, NULL, NULL, err)) < 0)
            break;
        snprintf(name, sizeof name, "medusa.%u.b1", k + 1);
        tensor_rec(&t, name, 1, d, 0);
        rc = kvp_write_tensor(w, &t, h->b1 + k * d, NULL, NULL, err);
    }
    return rc < 0 ? rc : kvp_writer_finish(w, err);
}

int kvp_heads_write(const kvp_heads *h, const char *path, const char *producer, kvp_err *err)
{
    kvp_out out;
    int rc = kvp_out_open(&out, path, err);
    if (rc < 0)
        return rc;
    kvp_writer_opts o = {.producer = producer};
    memcpy(o.fingerprint, h->fingerprint, KVP_FINGERPRINT_SIZE);
    kvp_writer *w = NULL;
    if ((rc = kvp_writer_open(&w, &out, &o, err)) == 0 && (rc = write_body(h, w, err)) == 0)
        rc = kvp_out_commit(&out, err);
    kvp_writer_free(w);
    if (rc < 0)
        kvp_out_abort(&out);
    return rc;
}

/* The CONFIG record: the shape, checked before anything is allocated. */
static int load_config(kvp_heads *h, const kvp_record *rec, const char *name, kvp_err *err)
{
    int rc = kvp_meta_record_decode(rec, &h->info, err);
    if (rc < 0)
        return rc;
    const char *arch = kvp_meta_get_str(&h->info, "medusa.arch");
    uint64_t n = 0, d = 0;
    if (!arch)
        return kvp_err_set(err, KVP_EFORMAT, "%s: record %llu: no medusa.arch: not a heads file (specdec "
                           "--train-heads writes them)", name, (unsigned long long)rec->index);
    if (strcmp(arch, KVP_HEADS_ARCH) != 0)
        return kvp_err_set(err, KVP_EFORMAT, "%s: record %llu: medusa.arch is '%s', this build reads '%s'", name,
                           (unsigned long long)rec->index, arch, KVP_HEADS_ARCH);
    if (kvp_meta_get_u64(&h->info, "medusa.n_heads", &n) < 0 || n < 1 || n > KVP_HEADS_MAX)
        return kvp_err_set(err, KVP_EFORMAT, "%s: record %llu: medusa.n_heads missing or not in 1..%u", name,
                           (unsigned long long)rec->index, KVP_HEADS_MAX);
    if (kvp_meta_get_u64(&h->info, "medusa.n_embd", &d) < 0 || d < 1 || d > KVP_HEADS_MAX_EMBD)
        return kvp_err_set(err, KVP_EFORMAT, "%s: record %llu: medusa.n_embd missing or not in 1..%u", name,
                           (unsigned long long)rec->index, KVP_HEADS_MAX_EMBD);
    h->n_heads = (uint32_t)n;
    h->n_embd = (uint32_t)d;
    return 0;
}

/* Tensor i of the file (head i / 2, w1 then b1): its name, shape and
 * values checked, then copied in.  Memory grows head by head, so a file
 * that claims more than it holds never gets its claim allocated. */
static int load_tensor(kvp_heads *h, uint32_t i, const kvp_record *rec, const char *name, kvp_err *err)
{
    kvp_tensor_rec t;
    const uint8_t *data, *sc, *zp;
    int rc = kvp_tensor_decode(rec, &t, &data, &sc, &zp, err);
    if (rc < 0)
        return rc;
    uint32_t k = i / 2, is_b = i % 2;
    uint64_t d = h->n_embd;
    char want[64];
    snprintf(want, sizeof want, "medusa.%u.%s", k + 1, is_b ? "b1" : "w1");
    unsigned long long ri = (unsigned long long)rec->index;
    if (strcmp(t.name, want) != 0)
        return kvp_err_set(err, KVP_EFORMAT, "%s: record %llu: tensor '%s' where '%s' was expected", name, ri,
                           t.name, want);
    if (t.dtype != KVP_DTYPE_F32 || t.scheme != KVP_SCHEME_NONE || t.n_dim != (is_b ? 1u : 2u) ||
        t.shape[0] != d || (!is_b && t.shape[1] != d))
        return kvp_err_set(err, KVP_EFORMAT, "%s: record %llu: tensor %s must be f32 [%llu%s]", name, ri, want,
                           (unsigned long long)d, is_b ? "" : ", same");
    uint64_t n = is_b ? d : d * d;
    float *dst;
    if (is_b) {
        float *b = realloc(h->b1, (k + 1) * d * sizeof *b);
        if (!b)
            return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", name);
        h->b1 = b;
        dst = b + k * d;
    } else {
        float *w = realloc(h->w1, (k + 1) * d * d * sizeof *w);
        if (!w)
            return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", name);
        h->w1 = w;
        dst = w + k * d * d;
    }
    memcpy(dst, data, n * sizeof *dst); /* the data part is 64-aligned little-endian f32 */
    for (uint64_t j = 0; j < n; j++)
        if (!isfinite(dst[j]))
            return kvp_err_set(err, KVP_EFORMAT, "%s: record %llu: tensor %s: element %llu is not finite", name, ri,
                               want, (unsigned long long)j);
    return 0;
}

int kvp_heads_load(kvp_heads *h, kvp_in *in, const char *name, kvp_err *err)
{
    memset(h, 0, sizeof *h);
    kvp_meta_init(&h->info);
    kvp_reader *r = NULL;
    int rc = kvp_reader_open(&r, in, err);
    uint32_t n_tensors = 0;
    int have_cfg = 0, ended = 0;
    if (rc == 0)
        memcpy(h->fingerprint, kvp_reader_info(r)->fingerprint, KVP_FINGERPRINT_SIZE);
    kvp_record rec;
    while (rc == 0 && (rc = kvp_reader_next(r, &rec, err)) == 1) {
        rc = 0;
        unsigned long long ri = (unsigned long long)rec.index;
        if (rec.kind == KVP_KIND_END)
            ended = 1;
        else if (rec.kind == KVP_KIND_CONFIG && !have_cfg)
            rc = load_config(h, &rec, name, err), have_cfg = 1;
        else if (rec.kind == KVP_KIND_TENSOR && have_cfg && n_tensors < 2 * h->n_heads)
            rc = load_tensor(h, n_tensors++, &rec, name, err);
        else
            rc = kvp_err_set(err, KVP_EFORMAT, "%s: record %llu: a %s record where a heads file has %s", name, ri,
                             kvp_kind_name(rec.kind),
                             !have_cfg ? "its config first" : "only its heads' tensors, then END");
    }
    if (rc == 0 && (!ended || !have_cfg || n_tensors != 2 * h->n_heads))
        rc = kvp_err_set(err, KVP_ETRUNC, "%s: %u of %u heads' tensors, then the end: the file is cut short", name,
                         n_tensors, have_cfg ? 2 * h->n_heads : 0);
    kvp_reader_free(r);
    if (rc < 0)
        kvp_heads_free(h);
    return rc < 0 ? rc : 0;
}

int kvp_heads_read(kvp_heads *h, const char *path, kvp_err *err)
{
    kvp_in in;
    int rc = kvp_in_open(&in, path, err);
    if (rc < 0) {
        memset(h, 0, sizeof *h);
        return rc;
    }
    rc = kvp_heads_load(h, &in, path, err);
    kvp_in_close(&in);
    return rc;
}

int kvp_heads_check_model(const kvp_heads *h, const char *path, const uint8_t fp[KVP_FINGERPRINT_SIZE],
                          uint32_t n_embd, kvp_err *err)
{
    char have[2 * KVP_FINGERPRINT_SIZE + 1], want[2 * KVP_FINGERPRINT_SIZE + 1];
    kvp_fingerprint_hex(h->fingerprint, have);
    kvp_fingerprint_hex(fp, want);
    if (memcmp(h->fingerprint, fp, KVP_FINGERPRINT_SIZE) != 0)
        return kvp_err_set(err, KVP_EMISMATCH, "%s: heads trained for model %s, not this one (%s): train them on it "
                           "with specdec --train-heads", path, have, want);
    if (h->n_embd != n_embd)
        return kvp_err_set(err, KVP_EMISMATCH, "%s: heads of width %u, the model's is %u", path, h->n_embd, n_embd);
    return 0;
}

/* ---- the drafter ---- */

/* Room for rows of z and logits. */
static int drafter_rows(kvp_heads_drafter *d, uint32_t rows)
{
    if (rows <= d->cap_rows)
        return 0;
    float *z = realloc(d->z, (size_t)rows * d->h->n_embd * sizeof *z);
    if (z)
        d->z = z;
    float *l = z ? realloc(d->logits, (size_t)rows * d->n_vocab * sizeof *l) : NULL;
    if (!l)
        return kvp_err_set(&d->err, KVP_ENOMEM, "heads: out of memory for %u rows of logits", rows);
    d->logits = l;
    d->cap_rows = rows;
    return 0;
}

int kvp_heads_drafter_init(kvp_heads_drafter *d, const kvp_heads *h, kvp_engine *e, kvp_err *err)
{
    memset(d, 0, sizeof *d);
    d->h = h;
    d->e = e;
    d->n_vocab = kvp_engine_n_vocab(e);
    if (drafter_rows(d, h->n_heads) < 0) {
        kvp_heads_drafter_free(d);
        return kvp_err_set(err, KVP_ENOMEM, "heads: out of memory for %u heads' logits", h->n_heads);
    }
    return 0;
}

void kvp_heads_drafter_free(kvp_heads_drafter *d)
{
    free(d->z);
    free(d->logits);
    d->z = d->logits = NULL;
    d->cap_rows = 0;
}

/* The w (<= KVP_DRAFT_BRANCHES) best tokens of logits x[n], best first,
 * with their log-probabilities. */
static void top_w(const float *x, uint32_t n, uint32_t w, uint32_t *id, double *lp)
{
    uint32_t got = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (got == w && x[i] <= x[id[w - 1]])
            continue;
        uint32_t j = got < w ? got++ : w - 1;
        for (; j > 0 && x[id[j - 1]] < x[i]; j--)
            id[j] = id[j - 1];
        id[j] = i;
    }
    double mx = x[id[0]], sum = 0;
    for (uint32_t i = 0; i < n; i++)
        sum += exp((double)x[i] - mx);
    for (uint32_t j = 0; j < got; j++)
        lp[j] = (double)x[id[j]] - mx - log(sum);
}

/* A path of the beam: its tokens so far and their summed log-probability. */
typedef struct path {
    uint32_t tok[KVP_DRAFT_MAX];
    double score;
} path;

static int by_score(const void *a, const void *b)
{
    double x = ((const path *)a)->score, y = ((const path *)b)->score;
    return (x < y) - (x > y);
}

/* Request i's tree from its heads' logits rows l[k][n_vocab]. */
static uint32_t beam_search(const kvp_heads_drafter *d, const float *l, uint32_t k, uint32_t max_b, uint32_t *out,
                            uint32_t *len)
{
    /* The heads guess independently, so a path's score is the sum of its
     * tokens' log-probabilities, and the best path is each head's argmax:
     * a beam of max_b paths, each extended by every head's max_b best. */
    path beam[KVP_DRAFT_BRANCHES], next[KVP_DRAFT_BRANCHES * KVP_DRAFT_BRANCHES];
    uint32_t nb = 1, id[KVP_DRAFT_BRANCHES];
    double lp[KVP_DRAFT_BRANCHES];
    beam[0].score = 0;
    for (uint32_t j = 0; j < k; j++) {
        top_w(l + (size_t)j * d->n_vocab, d->n_vocab, max_b, id, lp);
        uint32_t nn = 0;
        for (uint32_t p = 0; p < nb; p++)
            for (uint32_t c = 0; c < max_b; c++) {
                next[nn] = beam[p];
                next[nn].tok[j] = id[c];
                next[nn++].score = beam[p].score + lp[c];
            }
        qsort(next, nn, sizeof *next, by_score);
        nb = nn < max_b ? nn : max_b;
        memcpy(beam, next, nb * sizeof *beam);
    }
    for (uint32_t p = 0; p < nb; p++) {
        memcpy(out + (size_t)p * KVP_DRAFT_MAX, beam[p].tok, k * sizeof *out);
        len[p] = k;
    }
    return nb;
}

/* The guesses request i gets: its k, within the heads there are. */
static uint32_t depth(const kvp_heads *h, uint32_t k)
{
    k = k < h->n_heads ? k : h->n_heads;
    return k < KVP_DRAFT_MAX ? k : KVP_DRAFT_MAX;
}

void kvp_heads_draft(void *ctx, uint32_t n, const float *const *hidden, const uint32_t *k, uint32_t max_b,
                     uint32_t *out, uint32_t *len, uint32_t *n_branch)
{
    kvp_heads_drafter *d = ctx;
    const kvp_heads *h = d->h;
    uint32_t rows = 0;
    for (uint32_t i = 0; i < n; i++) {
        n_branch[i] = 0;
        rows += depth(h, k[i]);
    }
    max_b = max_b < KVP_DRAFT_BRANCHES ? max_b : KVP_DRAFT_BRANCHES;
    if (d->failed || !rows || !max_b)
        return;
    /* A failed projection (out of memory, a device fault) stops drafting;
     * decoding goes on plainly and the run reports it. */
    if (drafter_rows(d, rows) < 0) {
        d->failed = 1;
        return;
    }
    for (uint32_t i = 0, r = 0; i < n; r += depth(h, k[i]), i++)
        for (uint32_t j = 0; j < depth(h, k[i]); j++)
            kvp_heads_apply(h, j, hidden[i], d->z + (size_t)(r + j) * h->n_embd, NULL);
    if (kvp_engine_project(d->e, d->z, rows, d->logits, &d->err) < 0) {
        d->failed = 1;
        return;
    }
    for (uint32_t i = 0, r = 0; i < n; r += depth(h, k[i]), i++)
        if (depth(h, k[i])) {
            size_t at = (size_t)i * KVP_DRAFT_BRANCHES;
            n_branch[i] = beam_search(d, d->logits + (size_t)r * d->n_vocab, depth(h, k[i]), max_b,
                                      out + at * KVP_DRAFT_MAX, len + at);
        }
    d->calls++;
}
