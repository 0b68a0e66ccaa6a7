/* sample.c - repetition penalty, top-k / top-p / min-p, temperature, draw. */
#include "sample.h"
#include "argmax.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void kvp_sample_defaults(kvp_sampling *s)
{
    memset(s, 0, sizeof *s);
    s->temperature = 0;
    s->top_k = 0;
    s->top_p = 1;
    s->min_p = 0;
    s->repeat_penalty = 1;
    s->max_tokens = 128;
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void kvp_sample_seed(kvp_sampling *s, uint64_t seq_id)
{
    uint64_t x = s->seed ^ (seq_id * 0xd1b54a32d192ed03ull);
    s->rng[0] = splitmix64(&x);
    s->rng[1] = splitmix64(&x);
    if (!s->rng[0] && !s->rng[1])
        s->rng[1] = 1; /* xoroshiro's one forbidden state */
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

double kvp_sample_uniform(kvp_sampling *s)
{
    uint64_t s0 = s->rng[0], s1 = s->rng[1], r = s0 + s1;
    s1 ^= s0;
    s->rng[0] = rotl(s0, 24) ^ s1 ^ (s1 << 16);
    s->rng[1] = rotl(s1, 37);
    return (double)(r >> 11) * (1.0 / 9007199254740992.0);
}

int kvp_sample_check(const kvp_sampling *s, kvp_err *err) { return kvp_sampling_check(s, err); }

typedef struct cand {
    float logit;
    uint32_t id;
} cand;

static int cand_cmp(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit > y->logit ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static void penalize(float *logits, uint32_t n_vocab, const uint32_t *recent, uint32_t n_recent, float pen)
{
    /* Each distinct token once (n_recent is a short window: quadratic is fine). */
    for (uint32_t i = 0; i < n_recent; i++) {
        uint32_t t = recent[i];
        if (t >= n_vocab)
            continue;
        int seen = 0;
        for (uint32_t j = 0; j < i && !seen; j++)
            seen = recent[j] == t;
        if (seen)
            continue;
        logits[t] = logits[t] > 0 ? logits[t] / pen : logits[t] * pen;
    }
}

uint32_t kvp_sample_argmax(const float *x, uint32_t n) { return kvp_argmax_f32(x, n); }

/* ---- the filters ---- */

static void cand_swap(cand *a, cand *b)
{
    cand t = *a;
    *a = *b;
    *b = t;
}

/* Partial selection: c[0..k) become the k first of c[0..n) in cand_cmp's
 * order (in no order themselves), expected O(n): the same set a sort's
 * first k would be, ties broken by id. */
static void select_first(cand *c, uint32_t n, uint32_t k)
{
    uint32_t lo = 0, hi = n; /* the k-th lies in [lo, hi) */
    uint64_t x = 0x9e3779b97f4a7c15ull ^ n;
    while (hi - lo > 1) {
        cand pivot = c[lo + (uint32_t)(splitmix64(&x) % (hi - lo))];
        uint32_t lt = lo, i = lo, gt = hi; /* [lo,lt) before, [lt,i) equal, [gt,hi) after */
        while (i < gt) {
            int o = cand_cmp(&c[i], &pivot);
            if (o < 0)
                cand_swap(&c[lt++], &c[i++]);
            else if (o > 0)
                cand_swap(&c[i], &c[--gt]);
            else
                i++;
        }
        if (k <= lt)
            hi = lt;
        else if (k >= gt)
            lo = gt;
        else
            return; /* the k-th is the pivot: [0, k) is the first k */
    }
}

/* Top-p: the smallest prefix of c[0..n) in cand_cmp's order whose share of
 * mass reaches p, sorted; its length.  The first 256, 1024, ... are
 * selected and sorted until their sum reaches p: the prefix is nearly
 * always short, and sorting the whole vocabulary for it had cost more
 * than the model's step (SmolLM2's 49,152 candidates a token).  The first
 * k of the order are the first k of a whole sort, summed in that order:
 * the same prefix, the same bits. */
static uint32_t top_p_prefix(cand *c, uint32_t n, float mx, double mass, float p)
{
    for (uint32_t k = 256;; k *= 4) {
        uint32_t m = k < n ? k : n;
        if (m < n)
            select_first(c, n, m);
        qsort(c, m, sizeof *c, cand_cmp);
        double cum = 0;
        for (uint32_t i = 0; i < m; i++) {
            cum += exp((double)c[i].logit - mx) / mass;
            if (cum >= p)
                return i + 1;
        }
        if (m == n)
            return n;
    }
}

/* The tokens the filters keep, in the order a draw walks them: c[0..*n)
 * (malloc'd) and the largest logit *mx.  Top-k by partial selection, then
 * min-p as a threshold against the top; whatever a filter kept is sorted
 * (logit down, id up), only top-p needing the whole vocabulary sorted.
 * With no filter, every token in id order.  The same set and order as
 * sorting everything first. */
static int warp(const kvp_sampling *s, const float *logits, uint32_t n_vocab, cand **out, uint32_t *n_out, float *mx_out,
                kvp_err *err)
{
    cand *c = n_vocab ? malloc((size_t)n_vocab * sizeof *c) : NULL;
    if (!c)
        return kvp_err_set(err, KVP_ENOMEM, "sample: out of memory for %u candidates", n_vocab);
    for (uint32_t i = 0; i < n_vocab; i++)
        c[i] = (cand){logits[i], i};
    uint32_t n = n_vocab;
    /* a top-k at or past the vocabulary keeps everything: no filter (and
     * no sort of the whole vocabulary for it) */
    int top_k = s->top_k > 0 && (uint32_t)s->top_k < n;
    if (top_k) {
        select_first(c, n, (uint32_t)s->top_k);
        n = (uint32_t)s->top_k;
    }
    float mx = c[0].logit;
    for (uint32_t i = 1; i < n; i++)
        mx = c[i].logit > mx ? c[i].logit : mx;
    /* top-p's mass is of what top-k kept (min-p comes after it, as in
     * llama.cpp's chain) */
    double mass = 0;
    for (uint32_t i = 0; s->top_p < 1 && i < n; i++)
        mass += exp((double)c[i].logit - mx);
    if (s->min_p > 0) { /* relative to the top probability: exp(l - mx) >= min_p */
        uint32_t keep = 0;
        for (uint32_t i = 0; i < n; i++)
            if (c[i].logit == mx || exp((double)c[i].logit - mx) >= s->min_p)
                c[keep++] = c[i];
        n = keep;
    }
    if (s->top_p < 1) {
        n = top_p_prefix(c, n, mx, mass, s->top_p);
    } else if (top_k || s->min_p > 0) {
        qsort(c, n, sizeof *c, cand_cmp);
    }
    *out = c, *n_out = n, *mx_out = mx;
    return 0;
}

/* A kept token's weight at the temperature (1 / inv_t), and their sum. */
static double temp_weight(const cand *c, float mx, double inv_t) { return exp(((double)c->logit - mx) * inv_t); }

static double temp_sum(const cand *c, uint32_t n, float mx, double inv_t)
{
    double sum = 0;
    for (uint32_t i = 0; i < n; i++)
        sum += temp_weight(&c[i], mx, inv_t);
    return sum;
}

int kvp_sample_next(kvp_sampling *s, float *logits, uint32_t n_vocab, const uint32_t *recent, uint32_t n_recent,
                    kvp_err *err)
{
    if (n_vocab == 0)
        return kvp_err_set(err, KVP_EINVAL, "sample: empty vocabulary");
    if (s->repeat_penalty != 1 && n_recent)
        penalize(logits, n_vocab, recent, n_recent, s->repeat_penalty);
    if (s->temperature <= 0)
        return (int)kvp_sample_argmax(logits, n_vocab);
    cand *c;
    uint32_t n;
    float mx;
    int rc = warp(s, logits, n_vocab, &c, &n, &mx, err);
    if (rc < 0)
        return rc;
    /* temperature, then draw */
    double inv_t = 1.0 / s->temperature, r = kvp_sample_uniform(s) * temp_sum(c, n, mx, inv_t), acc = 0;
    uint32_t pick = c[n - 1].id;
    for (uint32_t i = 0; i < n; i++) {
        acc += temp_weight(&c[i], mx, inv_t);
        if (r < acc) {
            pick = c[i].id;
            break;
        }
    }
    free(c);
    return (int)pick;
}

int kvp_sample_probs(const kvp_sampling *s, float *logits, uint32_t n_vocab, const uint32_t *recent,
                     uint32_t n_recent, float *p, kvp_err *err)
{
    if (n_vocab == 0)
        return kvp_err_set(err, KVP_EINVAL, "sample: empty vocabulary");
    if (s->repeat_penalty != 1 && n_recent)
        penalize(logits, n_vocab, recent, n_recent, s->repeat_penalty);
    memset(p, 0, (size_t)n_vocab * sizeof *p);
    if (s->temperature <= 0) {
        p[kvp_sample_argmax(logits, n_vocab)] = 1;
        return 0;
    }
    cand *c;
    uint32_t n;
    float mx;
    int rc = warp(s, logits, n_vocab, &c, &n, &mx, err);
    if (rc < 0)
        return rc;
    double inv_t = 1.0 / s->temperature, sum = temp_sum(c, n, mx, inv_t);
    for (uint32_t i = 0; i < n; i++)
        p[c[i].id] = (float)(temp_weight(&c[i], mx, inv_t) / sum);
    free(c);
    return 0;
}

uint32_t kvp_sample_from(const float *p, uint32_t n, double u)
{
    double sum = 0, acc = 0;
    uint32_t last = 0;
    for (uint32_t i = 0; i < n; i++)
        if (p[i] > 0)
            sum += p[i], last = i;
    double r = u * sum;
    for (uint32_t i = 0; i < n; i++) {
        acc += p[i] > 0 ? p[i] : 0;
        if (p[i] > 0 && r < acc)
            return i;
    }
    return last; /* rounding: the last token with mass */
}
