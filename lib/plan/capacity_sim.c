/* capacity_sim.c - how many sequences a KV memory admits when sequence
 * lengths vary: contiguous max-length reservation versus paged blocks, with
 * and without a shared prompt prefix.
 *
 * Admission is first come, first served: sequences arrive in stream order
 * and the first one that does not fit ends the run (a scheduler that skips
 * ahead would admit a few more short ones; this is the FCFS answer).
 */
#include "capacity.h"
#include "cli.h"
#include "io.h"

#include <ctype.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- generator: xoshiro256** seeded by splitmix64 ---- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void kvp_cap_rng_seed(kvp_cap_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t kvp_cap_rng_next(kvp_cap_rng *r)
{
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double kvp_cap_rng_uniform(kvp_cap_rng *r) { return (double)(kvp_cap_rng_next(r) >> 11) * 0x1p-53; }

double kvp_cap_rng_normal(kvp_cap_rng *r)
{
    /* Box-Muller; 1 - u keeps the log argument in (0, 1] */
    double u = 1.0 - kvp_cap_rng_uniform(r), v = kvp_cap_rng_uniform(r);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* ---- length distributions ---- */

/* "A:B", each a plain decimal number (kvp_cli_parse_f64), so a space, a
 * '+', hex or a third part is refused rather than read as a value. */
static int parse_two(const char *s, double *a, double *b)
{
    const char *colon = strchr(s, ':');
    char first[64];
    if (!colon || (size_t)(colon - s) >= sizeof first)
        return -1;
    memcpy(first, s, (size_t)(colon - s));
    first[colon - s] = 0;
    if (kvp_cli_parse_f64(first, -DBL_MAX, DBL_MAX, a) || kvp_cli_parse_f64(colon + 1, -DBL_MAX, DBL_MAX, b))
        return -1;
    return 0;
}

static int load_list(kvp_cap_lengths *d, const char *path, kvp_err *err)
{
    uint8_t *data;
    size_t len;
    int rc = kvp_read_file(path, 1ull << 30, &data, &len, err);
    if (rc)
        return rc;
    size_t cap = 0, line = 1;
    const char *p = (const char *)data, *end = p + len;
    while (p < end) {
        if (*p == '\n')
            line++;
        if (isspace((unsigned char)*p)) {
            p++;
            continue;
        }
        if (*p == '#') { /* comment to end of line */
            while (p < end && *p != '\n')
                p++;
            continue;
        }
        char *e;
        unsigned long long v = strtoull(p, &e, 10);
        if (e == p || !isdigit((unsigned char)*p) || (e < end && !isspace((unsigned char)*e)) || v == 0 ||
            v > 0xffffffffull) {
            free(data);
            free(d->list);
            d->list = NULL;
            return kvp_err_set(err, KVP_EFORMAT, "%s: line %zu: not a length (a whole number 1..4294967295)",
                               path, line);
        }
        if (d->n_list == cap) {
            if (cap >= KVP_CAP_LENGTHS_MAX) {
                free(data);
                free(d->list);
                d->list = NULL;
                return kvp_err_set(err, KVP_ELIMIT, "%s: more than %u lengths", path, KVP_CAP_LENGTHS_MAX);
            }
            cap = cap ? cap * 2 : 1024;
            uint32_t *n = realloc(d->list, cap * sizeof *n);
            if (!n) {
                free(data);
                free(d->list);
                d->list = NULL;
                return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory for lengths", path);
            }
            d->list = n;
        }
        d->list[d->n_list++] = (uint32_t)v;
        p = e;
    }
    free(data);
    if (!d->n_list)
        return kvp_err_set(err, KVP_EFORMAT, "%s: no lengths in the file", path);
    return 0;
}

int kvp_cap_lengths_parse(kvp_cap_lengths *d, const char *spec, kvp_err *err)
{
    static const struct { const char *prefix, *parts; int kind; } dists[] = {
        {"uniform:", "A:B", KVP_CAP_DIST_UNIFORM},
        {"normal:", "MEAN:SD", KVP_CAP_DIST_NORMAL},
        {"lognormal:", "MU:SIGMA", KVP_CAP_DIST_LOGNORMAL},
    };
    memset(d, 0, sizeof *d);
    for (size_t i = 0; i < sizeof dists / sizeof dists[0]; i++) {
        size_t n = strlen(dists[i].prefix);
        if (strncmp(spec, dists[i].prefix, n) != 0)
            continue;
        d->kind = dists[i].kind;
        if (parse_two(spec + n, &d->a, &d->b) != 0)
            return kvp_err_set(err, KVP_EINVAL, "lengths '%s': want %s%s with two numbers", spec, dists[i].prefix,
                               dists[i].parts);
        if (d->kind == KVP_CAP_DIST_UNIFORM &&
            (d->a < 1 || d->b < d->a || d->b > 4294967295.0 || d->a != floor(d->a) || d->b != floor(d->b)))
            return kvp_err_set(err, KVP_EINVAL, "lengths '%s': want whole numbers 1 <= A <= B", spec);
        if (d->kind != KVP_CAP_DIST_UNIFORM && d->b < 0)
            return kvp_err_set(err, KVP_EINVAL, "lengths '%s': the spread must not be negative", spec);
        return 0;
    }
    d->kind = KVP_CAP_DIST_LIST;
    return load_list(d, spec, err);
}

void kvp_cap_lengths_free(kvp_cap_lengths *d)
{
    free(d->list);
    d->list = NULL;
    d->n_list = 0;
}

static uint64_t clamp_len(double v, uint64_t max_len)
{
    if (!(v >= 1)) /* also NaN */
        return 1;
    if (v >= (double)max_len)
        return max_len;
    return (uint64_t)llround(v) < 1 ? 1 : (uint64_t)llround(v);
}

uint64_t kvp_cap_lengths_draw(const kvp_cap_lengths *d, kvp_cap_rng *r, uint64_t i, uint64_t max_len)
{
    switch (d->kind) {
    case KVP_CAP_DIST_UNIFORM: {
        uint64_t lo = (uint64_t)d->a, span = (uint64_t)d->b - lo + 1;
        /* span is at most 2^32: the modulo bias of a 64-bit draw is below 2^-32 */
        return clamp_len((double)(lo + kvp_cap_rng_next(r) % span), max_len);
    }
    case KVP_CAP_DIST_NORMAL: return clamp_len(d->a + d->b * kvp_cap_rng_normal(r), max_len);
    case KVP_CAP_DIST_LOGNORMAL: return clamp_len(exp(d->a + d->b * kvp_cap_rng_normal(r)), max_len);
    default: return d->n_list ? clamp_len((double)d->list[i % d->n_list], max_len) : 1;
    }
}

uint64_t kvp_cap_lengths_max(const kvp_cap_lengths *d, uint64_t max_len)
{
    switch (d->kind) {
    case KVP_CAP_DIST_UNIFORM: return clamp_len(d->b, max_len);
    case KVP_CAP_DIST_NORMAL: return d->b == 0 ? clamp_len(d->a, max_len) : max_len;
    case KVP_CAP_DIST_LOGNORMAL: return d->b == 0 ? clamp_len(exp(d->a), max_len) : max_len;
    default: {
        uint32_t m = 0;
        for (size_t i = 0; i < d->n_list; i++)
            if (d->list[i] > m)
                m = d->list[i];
        return clamp_len((double)m, max_len);
    }
    }
}

/* ---- admission ---- */

static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* One scheme: bs 0 is contiguous reservation of max_len (a windowed layer
 * reserves its window where that is shorter: a ring); shared counts full
 * prefix blocks once (a sequence always keeps at least one block of its
 * own).  Memory is counted in one layer's units, a block or (contiguous) a
 * token, as the plan counts a sequence's blocks layer by layer. */
static void admit(const kvp_cap_sim_opts *o, const kvp_cap_lengths *d, uint32_t bs, int shared, uint64_t *seqs,
                  uint64_t *tokens, uint64_t *alloc, uint64_t *waste, uint64_t *saved)
{
    kvp_cap_rng rng;
    kvp_cap_rng_seed(&rng, o->seed);
    uint64_t nf = o->n_full, ns = o->n_sliding, w = o->n_sliding ? o->window : 0;
    uint64_t unit = bs ? bs * o->bytes_per_token + o->scale_bytes_per_block : o->bytes_per_token;
    uint64_t budget = unit ? o->kv_bytes / unit : 0; /* layers' blocks, or layers' token slots */
    uint64_t used = 0;
    /* contiguous: every sequence reserves the same slots */
    uint64_t reserve = nf * o->max_len + ns * (w && w < o->max_len ? w : o->max_len);
    *seqs = *tokens = *alloc = *waste = *saved = 0;
    for (uint64_t i = 0; i < KVP_CAP_SIM_MAX_SEQS; i++) {
        uint64_t len = kvp_cap_lengths_draw(d, &rng, i, o->max_len);
        uint64_t held = nf * len + ns * (w && w < len ? w : len); /* tokens the layers hold */
        uint64_t need = reserve, share = 0;
        if (bs) {
            need = nf * kvp_cap_layer_blocks(len, bs, 0) + ns * kvp_cap_layer_blocks(len, bs, w);
            if (shared && i > 0) {
                /* the prefix's whole blocks, only as long as the sequence,
                 * bar its last block; a windowed layer holds blocks first..
                 * of them */
                uint64_t pre = min_u64(min_u64(len, o->shared_prefix) / bs, (len - 1) / bs);
                uint64_t first = w && len > w ? (len - w) / bs : 0;
                share = nf * pre + ns * (pre > first ? pre - first : 0);
            }
        }
        if (used + need - share > budget)
            break;
        used += need - share;
        *saved += share * unit;
        (*seqs)++;
        *tokens += len;
        *waste += ((bs ? need * bs : reserve) - held) * o->bytes_per_token;
    }
    *alloc = used * unit;
}

int kvp_cap_simulate(const kvp_cap_sim_opts *o, const kvp_cap_lengths *d, const uint32_t *block_sizes,
                     size_t n_block_sizes, kvp_cap_sim_row *rows, kvp_err *err)
{
    if (o->max_len == 0 || o->bytes_per_token == 0)
        return kvp_err_set(err, KVP_EINVAL, "simulation: max length and bytes per token must be above 0");
    if (o->n_full + (uint64_t)o->n_sliding == 0 || (o->n_sliding && !o->window))
        return kvp_err_set(err, KVP_EINVAL, "simulation: no layers, or windowed layers with no window");
    if (d->kind == KVP_CAP_DIST_LIST && !d->n_list)
        return kvp_err_set(err, KVP_EINVAL, "simulation: no lengths");
    for (size_t i = 0; i <= n_block_sizes; i++) {
        kvp_cap_sim_row *row = &rows[i];
        uint32_t bs = i ? block_sizes[i - 1] : 0;
        if (i && (bs == 0 || (bs & (bs - 1))))
            return kvp_err_set(err, KVP_EINVAL, "simulation: block size %u is not a power of two", bs);
        memset(row, 0, sizeof *row);
        row->block_size = bs;
        uint64_t saved;
        admit(o, d, bs, 0, &row->seqs, &row->tokens, &row->alloc_bytes, &row->waste_bytes, &saved);
        if (o->shared_prefix && bs) {
            uint64_t t, a, wst;
            admit(o, d, bs, 1, &row->seqs_shared, &t, &a, &wst, &row->saved_bytes);
        } else {
            row->seqs_shared = row->seqs;
        }
    }
    return 0;
}
