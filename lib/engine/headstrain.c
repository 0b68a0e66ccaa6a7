/* headstrain.c - training Medusa heads by self-distillation (see
 * headstrain.h).
 *
 * One step on a batch of nb samples, for the R rows (sample, head) that
 * have a label, d = n_embd, V = n_vocab:
 *   a = W1_k h + b1_k,  z = h + SiLU(a)                 [R][d]  (matmul by W1_k)
 *   logits = z W^T,  g = w_k (softmax(logits) - onehot) / n_k   [R][V]  (matmul by W)
 *   dz = g W                                            [R][d]  (matmul by W^T)
 *   da = dz * SiLU'(a);  dW1_k = da^T h,  db1_k = sum da        (matmul by h^T)
 * then Adam.  The products are the backend's, on its device buffers.
 */
#include "headstrain.h"

#include "backend_cpu_kern.h"
#include "generate.h"
#include "sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PAD 32 /* gradient products' inner length is padded to whole blocks */

static void vocab_weights(kvp_heads_vocab *v)
{
    v->w = (kvp_weight){.name = "output (f32, heads training)", .dtype = KVP_DTYPE_F32, .n_in = v->n_embd,
                        .n_out = v->n_vocab, .row_bytes = (uint64_t)v->n_embd * 4, .data = v->wdata};
    v->wt = (kvp_weight){.name = "output transposed (heads training)", .dtype = KVP_DTYPE_F32, .n_in = v->n_vocab,
                         .n_out = v->n_embd, .row_bytes = (uint64_t)v->n_vocab * 4, .data = v->wtdata};
}

/* wtdata from wdata, then both prepared. */
static int vocab_finish(kvp_heads_vocab *v, kvp_err *err)
{
    size_t V = v->n_vocab, d = v->n_embd;
    v->wtdata = malloc(V * d * sizeof *v->wtdata);
    if (!v->wtdata)
        return kvp_err_set(err, KVP_ENOMEM, "heads training: out of memory for the output head (%zu x %zu f32)", V,
                           d);
    for (size_t r = 0; r < V; r++)
        for (size_t c = 0; c < d; c++)
            v->wtdata[c * V + r] = v->wdata[r * d + c];
    vocab_weights(v);
    int rc = v->be->ops->prepare_weight(v->be, &v->w, err);
    return rc < 0 ? rc : v->be->ops->prepare_weight(v->be, &v->wt, err);
}

int kvp_heads_vocab_from_f32(kvp_heads_vocab *v, kvp_backend *be, const float *w, uint32_t n_vocab,
                             uint32_t n_embd, kvp_err *err)
{
    memset(v, 0, sizeof *v);
    v->be = be, v->n_vocab = n_vocab, v->n_embd = n_embd;
    v->wdata = malloc((size_t)n_vocab * n_embd * sizeof *v->wdata);
    if (!v->wdata)
        return kvp_err_set(err, KVP_ENOMEM, "heads training: out of memory for the output head");
    memcpy(v->wdata, w, (size_t)n_vocab * n_embd * sizeof *v->wdata);
    return vocab_finish(v, err);
}

int kvp_heads_vocab_init(kvp_heads_vocab *v, kvp_backend *be, const kvp_weight *out, kvp_err *err)
{
    memset(v, 0, sizeof *v);
    v->be = be, v->n_vocab = out->n_out, v->n_embd = out->n_in;
    if (!kvp_cpu_dequant_weight_row_ok(out))
        return kvp_err_set(err, KVP_EUNSUPPORTED, "heads training: %s: its type cannot be read as f32",
                           out->name ? out->name : "output head");
    v->wdata = malloc((size_t)v->n_vocab * v->n_embd * sizeof *v->wdata);
    if (!v->wdata)
        return kvp_err_set(err, KVP_ENOMEM, "heads training: out of memory for the output head");
    for (uint32_t r = 0; r < v->n_vocab; r++)
        kvp_cpu_dequant_weight_row(out, r, v->wdata + (size_t)r * v->n_embd);
    return vocab_finish(v, err);
}

void kvp_heads_vocab_free(kvp_heads_vocab *v)
{
    if (v->be) {
        v->be->ops->release_weight(v->be, &v->w);
        v->be->ops->release_weight(v->be, &v->wt);
    }
    free(v->wdata);
    free(v->wtdata);
    memset(v, 0, sizeof *v);
}

/* ---- the trainer's buffers ---- */

typedef struct trainer {
    kvp_backend *be;
    const kvp_backend_ops *op;
    kvp_heads *h;
    kvp_heads_vocab *v;
    uint32_t B, K, d, V, R;  /* samples a batch, heads, width, vocabulary, rows (B * K) */
    /* device */
    float *dh, *da, *dz, *dlog, *dgz, *dgat, *dgw;
    /* host */
    float *hb, *a, *arow, *z, *logits, *gz, *gat, *ht, *gw, *gb;
    uint32_t *row_sample, *row_head, *label;
    kvp_weight *w1;          /* [K] views on h->w1, prepared */
    int *w1_ready;
    float *m, *s;            /* Adam moments of every W1 then every b1 */
    uint64_t t;              /* Adam steps taken */
} trainer;

static uint32_t pad_up(uint32_t n) { return (n + PAD - 1) / PAD * PAD; }

static void trainer_free(trainer *t)
{
    float **dev[] = {&t->dh, &t->da, &t->dz, &t->dlog, &t->dgz, &t->dgat, &t->dgw};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
        if (*dev[i])
            t->op->release(t->be, *dev[i]);
    for (uint32_t k = 0; t->w1 && t->w1_ready && k < t->K; k++)
        if (t->w1_ready[k])
            t->op->release_weight(t->be, &t->w1[k]);
    float *host[] = {t->hb, t->a, t->arow, t->z, t->logits, t->gz, t->gat, t->ht, t->gw, t->gb, t->m, t->s};
    for (size_t i = 0; i < sizeof host / sizeof *host; i++)
        free(host[i]);
    free(t->row_sample), free(t->row_head), free(t->label), free(t->w1), free(t->w1_ready);
    memset(t, 0, sizeof *t);
}

/* Head k's W1 as a weight the backend has prepared (again, after an update). */
static int prepare_w1(trainer *t, uint32_t k, kvp_err *err)
{
    if (t->w1_ready[k])
        t->op->release_weight(t->be, &t->w1[k]);
    t->w1_ready[k] = 0;
    size_t d = t->d;
    t->w1[k] = (kvp_weight){.name = "medusa head W1", .dtype = KVP_DTYPE_F32, .n_in = t->d, .n_out = t->d,
                            .row_bytes = d * 4, .data = t->h->w1 + k * d * d};
    int rc = t->op->prepare_weight(t->be, &t->w1[k], err);
    t->w1_ready[k] = rc == 0;
    return rc;
}

static int trainer_init(trainer *t, kvp_heads *h, kvp_heads_vocab *v, uint32_t B, int training, kvp_err *err)
{
    memset(t, 0, sizeof *t);
    t->be = v->be, t->op = v->be->ops, t->h = h, t->v = v;
    t->B = B, t->K = h->n_heads, t->d = h->n_embd, t->V = v->n_vocab, t->R = B * h->n_heads;
    size_t d = t->d, R = t->R, V = t->V, Bp = pad_up(B), f = sizeof(float), K = t->K;
    kvp_backend *be = t->be;
    t->dh = t->op->alloc(be, B * d * f), t->da = t->op->alloc(be, B * d * f), t->dz = t->op->alloc(be, R * d * f);
    t->dlog = t->op->alloc(be, R * V * f);
    t->hb = malloc(B * d * f), t->a = malloc(B * d * f), t->arow = malloc(R * d * f), t->z = malloc(R * d * f);
    t->logits = malloc(R * V * f);
    t->row_sample = malloc(R * sizeof *t->row_sample), t->row_head = malloc(R * sizeof *t->row_head);
    t->label = malloc(R * sizeof *t->label);
    t->w1 = calloc(K, sizeof *t->w1), t->w1_ready = calloc(K, sizeof *t->w1_ready);
    int ok = t->dh && t->da && t->dz && t->dlog && t->hb && t->a && t->arow && t->z && t->logits && t->row_sample &&
             t->row_head && t->label && t->w1 && t->w1_ready;
    if (training) {
        t->dgz = t->op->alloc(be, R * d * f), t->dgat = t->op->alloc(be, d * Bp * f);
        t->dgw = t->op->alloc(be, d * d * f);
        t->gz = malloc(R * d * f), t->gat = calloc(d * Bp, f), t->ht = calloc(d * Bp, f), t->gw = malloc(d * d * f);
        t->gb = malloc(d * f);
        t->m = calloc(K * (d * d + d), f), t->s = calloc(K * (d * d + d), f);
        ok = ok && t->dgz && t->dgat && t->dgw && t->gz && t->gat && t->ht && t->gw && t->gb && t->m && t->s;
    }
    if (!ok)
        return kvp_err_set(err, KVP_ENOMEM, "heads training: out of memory for batches of %u", B);
    /* the largest product: R rows by the transposed head's rows of V */
    uint32_t max_tok = t->R > t->d ? t->R : t->d, max_in = t->V > t->d ? t->V : t->d;
    if (max_in < Bp)
        max_in = (uint32_t)Bp;
    kvp_backend_reserve r = {.max_tok = max_tok, .max_n_in = max_in};
    int rc = t->op->reserve(be, &r, err);
    for (uint32_t k = 0; rc == 0 && k < t->K; k++)
        rc = prepare_w1(t, k, err);
    return rc;
}

/* ---- one batch ---- */

static float sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }

/* The forward pass over samples idx[nb] of s: rows laid out (those with a
 * label), their logits on the host.  Returns the row count or a code. */
static int forward(trainer *t, const kvp_heads_set *s, const uint32_t *idx, uint32_t nb, kvp_err *err)
{
    const kvp_backend_ops *op = t->op;
    size_t d = t->d, f = sizeof(float);
    for (uint32_t b = 0; b < nb; b++)
        memcpy(t->hb + b * d, s->hidden + (size_t)idx[b] * d, d * f);
    int rc = op->from_host(t->be, t->dh, t->hb, nb * d * f, err);
    uint32_t R = 0;
    for (uint32_t k = 0; rc == 0 && k < t->K; k++) {
        if ((rc = op->matmul(t->be, &t->w1[k], t->dh, t->da, nb, err)) < 0 ||
            (rc = op->to_host(t->be, t->a, t->da, nb * d * f, err)) < 0)
            break;
        const float *b1 = t->h->b1 + k * d;
        for (uint32_t b = 0; b < nb; b++) {
            uint32_t y = s->label[(size_t)idx[b] * s->n_heads + k];
            if (y == KVP_HEADS_NO_LABEL)
                continue;
            float *ar = t->arow + (size_t)R * d, *zr = t->z + (size_t)R * d;
            const float *hr = t->hb + b * d, *ab = t->a + b * d;
            for (size_t o = 0; o < d; o++) {
                ar[o] = ab[o] + b1[o];
                zr[o] = hr[o] + ar[o] * sigmoid(ar[o]);
            }
            t->row_sample[R] = b, t->row_head[R] = k, t->label[R] = y;
            R++;
        }
    }
    if (rc == 0 && R && (rc = op->from_host(t->be, t->dz, t->z, (size_t)R * d * f, err)) == 0 &&
        (rc = op->matmul(t->be, &t->v->w, t->dz, t->dlog, R, err)) == 0)
        rc = op->to_host(t->be, t->logits, t->dlog, (size_t)R * t->V * f, err);
    return rc < 0 ? rc : (int)R;
}

/* Row r's cross-entropy and whether its argmax is the label; with grad,
 * its logits become scale * (softmax - onehot). */
static double row_loss(float *x, uint32_t V, uint32_t y, int *hit, double scale, int grad)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < V; i++)
        if (x[i] > x[best])
            best = i;
    double mx = x[best], sum = 0;
    for (uint32_t i = 0; i < V; i++)
        sum += exp((double)x[i] - mx);
    double loss = mx + log(sum) - x[y];
    *hit = best == y;
    if (grad) {
        for (uint32_t i = 0; i < V; i++)
            x[i] = (float)(scale * exp((double)x[i] - mx) / sum);
        x[y] -= (float)scale;
    }
    return loss;
}

/* Adam on n parameters p with gradient g, moments m and s. */
static void adam(float *p, const float *g, float *m, float *s, size_t n, double lr, uint64_t t)
{
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    double c1 = 1 - pow(b1, (double)t), c2 = 1 - pow(b2, (double)t);
    for (size_t i = 0; i < n; i++) {
        m[i] = (float)(b1 * m[i] + (1 - b1) * g[i]);
        s[i] = (float)(b2 * s[i] + (1 - b2) * (double)g[i] * g[i]);
        p[i] -= (float)(lr * (m[i] / c1) / (sqrt(s[i] / c2) + eps));
    }
}

/* Head k's gradient from the rows' dz (t->gz), then its Adam step. */
static int update_head(trainer *t, uint32_t k, uint32_t R, double lr, kvp_err *err)
{
    size_t d = t->d, f = sizeof(float);
    uint32_t n = 0;
    memset(t->gb, 0, d * f);
    for (uint32_t r = 0; r < R; r++) {
        if (t->row_head[r] != k)
            continue;
        const float *ar = t->arow + (size_t)r * d, *gr = t->gz + (size_t)r * d, *hr = t->hb + t->row_sample[r] * d;
        for (size_t o = 0; o < d; o++) {
            float sg = sigmoid(ar[o]), ga = gr[o] * sg * (1 + ar[o] * (1 - sg)); /* SiLU' */
            t->gat[o * pad_up(t->B) + n] = ga;
            t->gb[o] += ga;
        }
        for (size_t i = 0; i < d; i++)
            t->ht[i * pad_up(t->B) + n] = hr[i];
        n++;
    }
    if (!n)
        return 0;
    /* dW1[o][i] = sum_n da[n][o] h[n][i]: rows da^T by the "weight" h^T */
    uint32_t np = pad_up(t->B);
    for (size_t o = 0; o < d; o++) /* columns past n are zero: stale ones from a fuller batch cleared */
        memset(t->gat + o * np + n, 0, (np - n) * f), memset(t->ht + o * np + n, 0, (np - n) * f);
    kvp_weight hw = {.name = "hidden states (heads training)", .dtype = KVP_DTYPE_F32, .n_in = np,
                     .n_out = t->d, .row_bytes = (uint64_t)np * 4, .data = t->ht};
    int rc = t->op->prepare_weight(t->be, &hw, err);
    if (rc < 0)
        return rc;
    if ((rc = t->op->from_host(t->be, t->dgat, t->gat, d * np * f, err)) == 0 &&
        (rc = t->op->matmul(t->be, &hw, t->dgat, t->dgw, t->d, err)) == 0)
        rc = t->op->to_host(t->be, t->gw, t->dgw, d * d * f, err);
    t->op->release_weight(t->be, &hw);
    if (rc < 0)
        return rc;
    size_t dd = d * d, off_b = (size_t)t->K * dd + k * d;
    adam(t->h->w1 + k * dd, t->gw, t->m + k * dd, t->s + k * dd, dd, lr, t->t);
    adam(t->h->b1 + k * d, t->gb, t->m + off_b, t->s + off_b, d, lr, t->t);
    return prepare_w1(t, k, err);
}

/* Losses of the rows laid out, into ev; with lr > 0 a training step. */
static int batch_step(trainer *t, const kvp_heads_set *s, const uint32_t *idx, uint32_t nb, double lr,
                      double decay, kvp_heads_eval *ev, kvp_err *err)
{
    int got = forward(t, s, idx, nb, err);
    if (got <= 0)
        return got;
    uint32_t R = (uint32_t)got, n_k[KVP_HEADS_MAX] = {0};
    for (uint32_t r = 0; r < R; r++)
        n_k[t->row_head[r]]++;
    for (uint32_t r = 0; r < R; r++) {
        uint32_t k = t->row_head[r];
        int hit;
        double scale = pow(decay, k) / n_k[k];
        double loss = row_loss(t->logits + (size_t)r * t->V, t->V, t->label[r], &hit, scale, lr > 0);
        ev->loss[k] += loss, ev->acc[k] += hit, ev->n[k]++;
    }
    if (lr <= 0)
        return 0;
    const kvp_backend_ops *op = t->op;
    size_t f = sizeof(float);
    int rc;
    if ((rc = op->from_host(t->be, t->dlog, t->logits, (size_t)R * t->V * f, err)) < 0 ||
        (rc = op->matmul(t->be, &t->v->wt, t->dlog, t->dgz, R, err)) < 0 ||
        (rc = op->to_host(t->be, t->gz, t->dgz, (size_t)R * t->d * f, err)) < 0)
        return rc;
    t->t++;
    for (uint32_t k = 0; k < t->K && rc == 0; k++)
        rc = update_head(t, k, R, lr, err);
    return rc;
}

/* Sums into means; the weighted loss. */
static void finish_eval(kvp_heads_eval *ev, uint32_t K, double decay)
{
    ev->weighted = 0;
    for (uint32_t k = 0; k < K; k++) {
        if (ev->n[k])
            ev->loss[k] /= (double)ev->n[k], ev->acc[k] /= (double)ev->n[k];
        ev->weighted += pow(decay, k) * ev->loss[k];
    }
}

static int check_set(const kvp_heads *h, const kvp_heads_vocab *v, const kvp_heads_set *s, kvp_err *err)
{
    if (s->n_heads != h->n_heads || v->n_embd != h->n_embd)
        return kvp_err_set(err, KVP_EINVAL, "heads training: %u heads of width %u, samples for %u heads, an output "
                           "head of width %u", h->n_heads, h->n_embd, s->n_heads, v->n_embd);
    for (uint64_t i = 0; i < (uint64_t)s->n * s->n_heads; i++)
        if (s->label[i] != KVP_HEADS_NO_LABEL && s->label[i] >= v->n_vocab)
            return kvp_err_set(err, KVP_EINVAL, "heads training: sample %llu: token %u is outside the vocabulary",
                               (unsigned long long)(i / s->n_heads), s->label[i]);
    return 0;
}

int kvp_heads_evaluate(const kvp_heads *h, kvp_heads_vocab *v, const kvp_heads_set *s, uint32_t batch,
                       kvp_heads_eval *out, kvp_err *err)
{
    memset(out, 0, sizeof *out);
    int rc = check_set(h, v, s, err);
    if (rc < 0)
        return rc;
    uint32_t B = batch ? batch : 32;
    trainer t;
    rc = trainer_init(&t, (kvp_heads *)h, v, B, 0, err); /* evaluation never writes the heads */
    uint32_t *idx = malloc(B * sizeof *idx);
    if (rc == 0 && !idx)
        rc = kvp_err_set(err, KVP_ENOMEM, "heads training: out of memory");
    for (uint32_t i0 = 0; rc == 0 && i0 < s->n; i0 += B) {
        uint32_t nb = s->n - i0 < B ? s->n - i0 : B;
        for (uint32_t b = 0; b < nb; b++)
            idx[b] = i0 + b;
        rc = batch_step(&t, s, idx, nb, 0, 1, out, err);
    }
    free(idx);
    trainer_free(&t);
    finish_eval(out, h->n_heads, 0.8);
    return rc;
}

int kvp_heads_train(kvp_heads *h, kvp_heads_vocab *v, const kvp_heads_set *s, const kvp_heads_train_opts *o,
                    kvp_err *err)
{
    int rc = check_set(h, v, s, err);
    if (rc < 0)
        return rc;
    uint32_t B = o->batch ? o->batch : 32, epochs = o->epochs ? o->epochs : 2;
    double lr = o->lr > 0 ? o->lr : 1e-3, decay = o->decay > 0 ? o->decay : 0.8;
    trainer t;
    rc = trainer_init(&t, h, v, B, 1, err);
    uint32_t *order = malloc((s->n ? s->n : 1) * sizeof *order);
    if (rc == 0 && !order)
        rc = kvp_err_set(err, KVP_ENOMEM, "heads training: out of memory for %u samples", s->n);
    kvp_sampling rng = {.seed = o->seed};
    kvp_sample_seed(&rng, 0);
    for (uint32_t e = 0; rc == 0 && e < epochs; e++) {
        double t0 = kvp_gen_now();
        for (uint32_t i = 0; i < s->n; i++)
            order[i] = i;
        for (uint32_t i = s->n; i > 1; i--) { /* Fisher-Yates */
            uint32_t j = (uint32_t)(kvp_sample_uniform(&rng) * i), tmp = order[i - 1];
            order[i - 1] = order[j], order[j] = tmp;
        }
        kvp_heads_eval ev = {0};
        for (uint32_t i0 = 0; rc == 0 && i0 < s->n; i0 += B)
            rc = batch_step(&t, s, order + i0, s->n - i0 < B ? s->n - i0 : B, lr, decay, &ev, err);
        finish_eval(&ev, h->n_heads, decay);
        if (rc == 0 && o->progress)
            o->progress(o->ctx, e + 1, ev.weighted, kvp_gen_now() - t0);
    }
    free(order);
    trainer_free(&t);
    return rc;
}
