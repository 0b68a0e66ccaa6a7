/* gpu_bench.c - the CUDA backend's decode figures against the device's own
 * copy bandwidth, measured in the same run (DESIGN.md "Numbers first").
 * Run by scripts/device-check; never by make check (it only builds there).
 *
 *   gpu_bench [--budget SECONDS] [--layers N] [--steps N]
 *
 * 1. Copy bandwidth: cudaMemcpy device to device (KVP_HAVE_CUDA builds), and
 *    kv_copy_block of a 256 MiB block through the op table; bytes read plus
 *    bytes written over time.
 * 2. Batch-1 decode of a Llama-3-8B-shaped model (32 layers, d 4096, FFN
 *    14336, 32/8 heads of 128, vocabulary 128256) with random weights in
 *    bf16, fp8 (one scale per tensor) and int4 (groups of 128): the op
 *    sequence of one engine step (embed; per layer rmsnorm, q/k/v matmuls,
 *    rope, kv_store, attention, o matmul, add, rmsnorm, gate/up matmuls,
 *    silu_mul, down matmul, add; final norm, LM head; logits to the host),
 *    context 512.  Weight bytes read per token over the step's time.  Every
 *    layer's weights are their own device copies (prepare_weight of each);
 *    their host bytes are one layer's, shared, to build them quickly.
 * 3. Batch sweep 1..256 (bf16): tokens/s of that step with B sequences.
 * 4. Paged decode attention alone at 1k and 8k contexts: KV bytes read over
 *    a call's time (the mean of bursts of 20 calls between synchronizes).
 * 5. Prompt matmuls (512 tokens) of the FFN's up and down matrices in each
 *    weight type: TFLOP/s, and fp8 and int4 against bf16.
 * Each timing: warm-up steps first, then the median of timed steps, each
 * ended by synchronize (to_host for the logits) before the clock stops.
 * Sections stop early when the time budget runs out, saying so. */
#include "gpu_util.h"
#include "kvscale.h"
#include "tensor.h"

#ifdef KVP_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { D = 4096, FF = 14336, NH = 32, NKV = 8, HD = 128, VOCAB = 128256, BS = 16 };

static kvp_backend *gb;
static double t_end;          /* the budget's end (gpu_now) */
static uint32_t n_layer = 32;
static int n_steps = 15; /* timed steps of batch-1 decode (the sweep: at most 5) */
static uint64_t rng = 0x853c49e6748fea9bull;

static uint64_t next64(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static int over_budget(void) { return gpu_now() > t_end; }

static void die_op(const char *what, const kvp_err *err)
{
    fprintf(stderr, "gpu_bench: %s: %s\n", what, err->msg);
    exit(1);
}

#define OP(what, call)                                                                             \
    do {                                                                                           \
        kvp_err e_ = {0};                                                                          \
        kvp_err *err = &e_;                                                                        \
        if ((call) < 0)                                                                            \
            die_op(what, err);                                                                     \
    } while (0)

static void *dev_alloc(size_t bytes)
{
    void *p = gb->ops->alloc(gb, bytes);
    if (!p) {
        fprintf(stderr, "gpu_bench: cannot allocate %.2f GB on the device\n", bytes / 1e9);
        exit(1);
    }
    return p;
}

/* bytes of random valid values of dtype at h (never zeros: they can run
 * faster than real data): bf16/f16 with a small exponent, fp8 e4m3 without
 * its NaN codes, int8/int4 any byte. */
static void fill_random(uint8_t *h, size_t bytes, int dtype)
{
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        uint64_t r = next64();
        if (dtype == KVP_DTYPE_F16 || dtype == KVP_DTYPE_BF16)
            for (int j = 0; j < 4; j++) {
                uint16_t m = (uint16_t)(r >> (16 * j));
                uint16_t v = dtype == KVP_DTYPE_BF16 ? (uint16_t)((m & 0x807f) | (118 + (m >> 8 & 3)) << 7)
                                                     : (uint16_t)((m & 0x83ff) | (9 + (m >> 10 & 3)) << 10);
                memcpy(h + i + 2 * j, &v, 2);
            }
        else
            for (int j = 0; j < 8; j++) {
                uint8_t b = (uint8_t)(r >> (8 * j));
                h[i + j] = dtype == KVP_DTYPE_FP8_E4M3 && (b & 0x7f) == 0x7f ? b ^ 1 : b;
            }
    }
    for (size_t i = bytes & ~(size_t)7; i < bytes; i++) /* a tail: small values in every type */
        h[i] = 0x1c;
}

/* Device memory filled with random values of dtype, through a 64 MiB host
 * buffer. */
static void dev_fill(void *dev, size_t bytes, int dtype)
{
    size_t chunk = (size_t)64 << 20;
    uint8_t *h = malloc(chunk);
    if (!h)
        exit(1);
    fill_random(h, chunk, dtype);
    for (size_t off = 0; off < bytes; off += chunk) {
        size_t n = bytes - off < chunk ? bytes - off : chunk;
        OP("from_host", gb->ops->from_host(gb, (uint8_t *)dev + off, h, n, err));
    }
    free(h);
}

/* ---- 1. copy bandwidth ---- */

static double copy_bw_cuda(void)
{
#ifdef KVP_HAVE_CUDA
    size_t bytes = (size_t)2 << 30;
    void *a = NULL, *b = NULL;
    cudaEvent_t e0, e1;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess ||
        cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) {
        fprintf(stderr, "gpu_bench: cudaMalloc of 2 x 2 GiB failed\n");
        cudaFree(a);
        return 0;
    }
    cudaMemset(a, 0x3c, bytes);
    float best = 1e30f;
    for (int i = 0; i < 12; i++) {
        float ms = 0;
        cudaEventRecord(e0, 0);
        cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms, e0, e1);
        if (i >= 2 && ms < best) /* two warm-ups */
            best = ms;
    }
    cudaError_t st = cudaGetLastError();
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaFree(a), cudaFree(b);
    return st == cudaSuccess ? 2.0 * bytes / (best * 1e-3) : 0;
#else
    return 0;
#endif
}

/* kv_copy_block of one 256 MiB block: the op table's own copy. */
static double copy_bw_op(void)
{
    kvp_kv_pool p = {.dtype = KVP_DTYPE_F16, .n_blocks = 2, .block_size = 16384, .n_layer = 1, .n_head_kv = 32,
                     .head_dim = 128};
    p.block_bytes = (uint64_t)2 * p.n_head_kv * p.block_size * p.head_dim * 2;
    p.base = dev_alloc(2 * p.block_bytes);
    dev_fill(p.base, p.block_bytes, KVP_DTYPE_F16);
    double best = 1e30;
    for (int i = 0; i < 12; i++) {
        double t0 = gpu_now();
        OP("kv_copy_block", gb->ops->kv_copy_block(gb, &p, 1, 0, err));
        OP("synchronize", gb->ops->synchronize(gb, err));
        double t = gpu_now() - t0;
        if (i >= 2 && t < best)
            best = t;
    }
    gb->ops->release(gb, p.base);
    return 2.0 * p.block_bytes / best;
}

/* ---- 2, 3. the decode step ---- */

typedef struct layer_w {
    kvp_weight q, k, v, o, gate, up, down;
} layer_w;

typedef struct model_w {
    int dtype;
    layer_w *layers;
    kvp_weight embd, head, norm, inv_freq;
    uint64_t bytes_per_token; /* every matrix once (the embedding: one row) */
    void *host[9];            /* host bytes, shared by every layer: 7 matrices, head, bf16 embedding */
    float *scales, *norm_w, *inv;
} model_w;

/* Host bytes of one random n_out x n_in weight in dtype (bf16, fp8 with a
 * tensor scale, int4 with groups of 128 and f32 scales). */
static void weight_host(model_w *m, kvp_weight *w, const char *name, void *data, uint32_t n_out, uint32_t n_in)
{
    *w = (kvp_weight){.name = name, .dtype = m->dtype, .n_in = n_in, .n_out = n_out,
                      .row_bytes = (uint64_t)kvp_dtype_row_bytes((uint32_t)m->dtype, n_in), .data = data};
    if (m->dtype == KVP_DTYPE_FP8_E4M3)
        w->scales = m->scales, w->group = n_in, w->scale_stride = 0;
    else if (m->dtype == KVP_DTYPE_I4)
        w->scales = m->scales, w->group = 128, w->scale_stride = n_in / 128;
}

static void *host_random(size_t bytes, int dtype)
{
    uint8_t *h = malloc(bytes);
    if (!h) {
        fprintf(stderr, "gpu_bench: out of host memory (%.2f GB)\n", bytes / 1e9);
        exit(1);
    }
    fill_random(h, bytes, dtype);
    return h;
}

static void prepare(kvp_weight *w)
{
    OP(w->name, gb->ops->prepare_weight(gb, w, err));
}

static uint64_t weight_bytes(const kvp_weight *w)
{
    uint64_t b = w->row_bytes * w->n_out;
    if (w->scales)
        b += 4ull * (w->scale_stride ? (uint64_t)w->scale_stride * w->n_out : 1);
    return b;
}

static void model_build(model_w *m, int dtype)
{
    static const uint32_t shp[7][2] = {{D, D}, {NKV * HD, D}, {NKV * HD, D}, {D, D}, {FF, D}, {FF, D}, {D, FF}};
    static const char *names[7] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
    memset(m, 0, sizeof *m);
    m->dtype = dtype;
    m->scales = malloc(sizeof(float) * ((size_t)VOCAB * D / 128 + 1));
    m->norm_w = malloc(sizeof(float) * D);
    m->inv = malloc(sizeof(float) * HD / 2);
    m->layers = calloc(n_layer, sizeof *m->layers);
    if (!m->scales || !m->norm_w || !m->inv || !m->layers)
        exit(1);
    for (size_t i = 0; i < (size_t)VOCAB * D / 128 + 1; i++)
        m->scales[i] = 0.002f * (1 + (float)(next64() % 100) / 100);
    for (int i = 0; i < D; i++)
        m->norm_w[i] = 1 + (float)(next64() % 100) / 1000;
    for (int i = 0; i < HD / 2; i++)
        m->inv[i] = (float)pow(500000.0, -2.0 * i / HD);
    for (int j = 0; j < 7; j++)
        m->host[j] = host_random((size_t)kvp_dtype_row_bytes((uint32_t)dtype, shp[j][1]) * shp[j][0], dtype);
    m->host[7] = host_random((size_t)kvp_dtype_row_bytes((uint32_t)dtype, D) * VOCAB, dtype);
    m->host[8] = host_random((size_t)D * 2 * VOCAB, KVP_DTYPE_BF16);
    for (uint32_t l = 0; l < n_layer; l++) {
        kvp_weight *ws[7] = {&m->layers[l].q, &m->layers[l].k, &m->layers[l].v, &m->layers[l].o,
                             &m->layers[l].gate, &m->layers[l].up, &m->layers[l].down};
        for (int j = 0; j < 7; j++) {
            weight_host(m, ws[j], names[j], m->host[j], shp[j][0], shp[j][1]);
            prepare(ws[j]);
            m->bytes_per_token += weight_bytes(ws[j]);
        }
    }
    weight_host(m, &m->head, "output.weight", m->host[7], VOCAB, D);
    prepare(&m->head);
    m->bytes_per_token += weight_bytes(&m->head);
    /* the embedding table in bf16 whatever the matrices' type: a gather of B rows */
    m->embd = (kvp_weight){.name = "token_embd.weight", .dtype = KVP_DTYPE_BF16, .n_in = D, .n_out = VOCAB,
                           .row_bytes = 2 * D, .data = m->host[8]};
    prepare(&m->embd);
    m->bytes_per_token += m->embd.row_bytes;
    m->norm = (kvp_weight){.name = "output_norm.weight", .dtype = KVP_DTYPE_F32, .n_in = D, .n_out = 1,
                           .row_bytes = 4 * D, .data = m->norm_w};
    m->inv_freq = (kvp_weight){.name = "rope_freqs.weight", .dtype = KVP_DTYPE_F32, .n_in = HD / 2, .n_out = 1,
                               .row_bytes = 2 * HD, .data = m->inv};
    prepare(&m->norm);
    prepare(&m->inv_freq);
}

static void model_free(model_w *m)
{
    for (uint32_t l = 0; l < n_layer; l++) {
        kvp_weight *ws[7] = {&m->layers[l].q, &m->layers[l].k, &m->layers[l].v, &m->layers[l].o,
                             &m->layers[l].gate, &m->layers[l].up, &m->layers[l].down};
        for (int j = 0; j < 7; j++)
            gb->ops->release_weight(gb, ws[j]);
    }
    gb->ops->release_weight(gb, &m->head);
    gb->ops->release_weight(gb, &m->embd);
    gb->ops->release_weight(gb, &m->norm);
    gb->ops->release_weight(gb, &m->inv_freq);
    for (int j = 0; j < 9; j++)
        free(m->host[j]);
    free(m->layers), free(m->scales), free(m->norm_w), free(m->inv);
}

/* A step's device buffers for up to max_b sequences, and the KV pool:
 * sequence s holds blocks [s * per_seq, (s + 1) * per_seq). */
typedef struct step_bufs {
    uint32_t max_b, per_seq;
    float *x, *h, *q, *k, *v, *att, *t, *g, *u, *logits, *host_logits;
    int32_t *tok, *pos, *host_pos;
    uint32_t *slot, *seq, *tables, *host_slot, *host_seq;
    kvp_kv_pool kv;
} step_bufs;

static void bufs_make(step_bufs *s, uint32_t max_b, uint32_t max_ctx)
{
    memset(s, 0, sizeof *s);
    s->max_b = max_b;
    s->per_seq = (max_ctx + BS - 1) / BS;
    s->x = dev_alloc(4ull * max_b * D), s->h = dev_alloc(4ull * max_b * D), s->q = dev_alloc(4ull * max_b * D);
    s->k = dev_alloc(4ull * max_b * NKV * HD), s->v = dev_alloc(4ull * max_b * NKV * HD);
    s->att = dev_alloc(4ull * max_b * D), s->t = dev_alloc(4ull * max_b * D);
    s->g = dev_alloc(4ull * max_b * FF), s->u = dev_alloc(4ull * max_b * FF);
    s->logits = dev_alloc(4ull * max_b * VOCAB);
    s->tok = dev_alloc(4ull * max_b), s->pos = dev_alloc(4ull * max_b), s->slot = dev_alloc(4ull * max_b);
    s->seq = dev_alloc(4ull * max_b), s->tables = dev_alloc(4ull * max_b * s->per_seq);
    s->host_logits = malloc(4ull * max_b * VOCAB);
    s->host_pos = malloc(4ull * max_b), s->host_slot = malloc(4ull * max_b), s->host_seq = malloc(4ull * max_b);
    uint32_t *tab = malloc(4ull * max_b * s->per_seq);
    if (!s->host_logits || !s->host_pos || !s->host_slot || !s->host_seq || !tab)
        exit(1);
    for (uint32_t i = 0; i < max_b * s->per_seq; i++)
        tab[i] = i;
    for (uint32_t i = 0; i < max_b; i++)
        s->host_seq[i] = i;
    OP("from_host", gb->ops->from_host(gb, s->tables, tab, 4ull * max_b * s->per_seq, err));
    OP("from_host", gb->ops->from_host(gb, s->seq, s->host_seq, 4ull * max_b, err));
    OP("from_host", gb->ops->from_host(gb, s->tok, tab, 4ull * max_b, err)); /* token ids 0..max_b-1 */
    free(tab);
    s->kv = (kvp_kv_pool){.dtype = KVP_DTYPE_F16, .n_blocks = max_b * s->per_seq, .block_size = BS,
                          .n_layer = n_layer, .n_head_kv = NKV, .head_dim = HD};
    s->kv.block_bytes = (uint64_t)n_layer * 2 * NKV * BS * HD * 2;
    s->kv.base = dev_alloc((size_t)s->kv.n_blocks * s->kv.block_bytes);
    dev_fill(s->kv.base, (size_t)s->kv.n_blocks * s->kv.block_bytes, KVP_DTYPE_F16);
    kvp_backend_reserve r = {.max_tok = max_b, .max_ctx = max_ctx, .max_n_in = FF, .n_head = NH, .kv = &s->kv};
    OP("reserve", gb->ops->reserve(gb, &r, err));
}

static void bufs_free(step_bufs *s)
{
    void *d[] = {s->x, s->h, s->q, s->k, s->v, s->att, s->t, s->g, s->u, s->logits, s->tok, s->pos, s->slot,
                 s->seq, s->tables, s->kv.base};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
        gpu_free(gb, d[i]);
    free(s->host_logits), free(s->host_pos), free(s->host_slot), free(s->host_seq);
}

/* One decode step of b sequences, each at position ctx (attending to ctx +
 * 1 keys); returns its time in seconds, logits on the host. */
static double decode_step(const model_w *m, step_bufs *s, uint32_t b, uint32_t ctx)
{
    double t0 = gpu_now();
    uint32_t max_ctx = ctx + 1;
    for (uint32_t i = 0; i < b; i++) {
        s->host_pos[i] = (int32_t)ctx;
        s->host_slot[i] = (i * s->per_seq + ctx / BS) * BS + ctx % BS;
    }
    OP("from_host", gb->ops->from_host(gb, s->pos, s->host_pos, 4ull * b, err));
    OP("from_host", gb->ops->from_host(gb, s->slot, s->host_slot, 4ull * b, err));
    OP("embed", gb->ops->embed(gb, &m->embd, s->tok, b, s->x, err));
    for (uint32_t l = 0; l < n_layer; l++) {
        const layer_w *w = &m->layers[l];
        OP("rmsnorm", gb->ops->rmsnorm(gb, s->x, &m->norm, s->h, b, D, 1e-5f, err));
        OP("matmul q", gb->ops->matmul(gb, &w->q, s->h, s->q, b, err));
        OP("matmul k", gb->ops->matmul(gb, &w->k, s->h, s->k, b, err));
        OP("matmul v", gb->ops->matmul(gb, &w->v, s->h, s->v, b, err));
        OP("rope q", gb->ops->rope(gb, s->q, b, NH, HD, HD, s->pos, &m->inv_freq, KVP_ROPE_KIND_NORM, err));
        OP("rope k", gb->ops->rope(gb, s->k, b, NKV, HD, HD, s->pos, &m->inv_freq, KVP_ROPE_KIND_NORM, err));
        OP("kv_store", gb->ops->kv_store(gb, &s->kv, l, s->k, s->v, b, s->slot, err));
        kvp_attn_args a = {.q = s->q, .out = s->att, .n_tok = b, .n_head = NH, .layer = l,
                           .scale = 1.0f / sqrtf((float)HD), .pos = s->pos, .tok_seq = s->seq, .tables = s->tables,
                           .n_seq = b, .table_stride = s->per_seq, .host_pos = s->host_pos,
                           .host_tok_seq = s->host_seq, .max_ctx = max_ctx, .kv = &s->kv};
        OP("attention", gb->ops->attention(gb, &a, err));
        OP("matmul o", gb->ops->matmul(gb, &w->o, s->att, s->t, b, err));
        OP("add", gb->ops->add(gb, s->x, s->t, (size_t)b * D, err));
        OP("rmsnorm", gb->ops->rmsnorm(gb, s->x, &m->norm, s->h, b, D, 1e-5f, err));
        OP("matmul gate", gb->ops->matmul(gb, &w->gate, s->h, s->g, b, err));
        OP("matmul up", gb->ops->matmul(gb, &w->up, s->h, s->u, b, err));
        OP("silu_mul", gb->ops->silu_mul(gb, s->g, s->u, (size_t)b * FF, err));
        OP("matmul down", gb->ops->matmul(gb, &w->down, s->g, s->t, b, err));
        OP("add", gb->ops->add(gb, s->x, s->t, (size_t)b * D, err));
    }
    OP("rmsnorm", gb->ops->rmsnorm(gb, s->x, &m->norm, s->h, b, D, 1e-5f, err));
    OP("matmul head", gb->ops->matmul(gb, &m->head, s->h, s->logits, b, err));
    OP("to_host", gb->ops->to_host(gb, s->host_logits, s->logits, 4ull * b * VOCAB, err));
    return gpu_now() - t0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median step time of b sequences: warm steps, then timed ones, contexts
 * advancing from ctx0 as decoding does; 0 when the budget ran out first. */
static double decode_median(const model_w *m, step_bufs *s, uint32_t b, uint32_t ctx0, int warm, int timed)
{
    double t[64];
    int n = 0;
    for (int i = 0; i < warm + timed && i - warm < 64; i++) {
        if (over_budget())
            return 0;
        double dt = decode_step(m, s, b, ctx0 + (uint32_t)i);
        if (i >= warm)
            t[n++] = dt;
    }
    qsort(t, (size_t)n, sizeof t[0], cmp_double);
    return t[n / 2];
}

/* ---- 3b. the batch-1 GEMV alone ----
 *
 * GB/s of one token's matmul through one kind of matrix of every layer
 * back to back (32 distinct matrices, so none is read from the 60 MB L2),
 * the median of 5 rounds after a warm one: the kernel's own bandwidth,
 * without the step's other kernels and launch gaps. */
static double gemv_gbs(const model_w *m, step_bufs *s, int which)
{
    double t[5];
    int n = 0;
    uint64_t bytes = 0;
    for (int round = 0; round < 6 && !over_budget(); round++) {
        double t0 = gpu_now();
        bytes = 0;
        for (uint32_t l = 0; l < n_layer; l++) {
            const layer_w *w = &m->layers[l];
            const kvp_weight *x = which == 0 ? &w->q : which == 1 ? &w->up : &w->down;
            float *in = which == 2 ? s->g : s->h, *out = which == 0 ? s->q : which == 1 ? s->u : s->t;
            OP("matmul", gb->ops->matmul(gb, x, in, out, 1, err));
            bytes += weight_bytes(x);
        }
        OP("synchronize", gb->ops->synchronize(gb, err));
        if (round > 0)
            t[n++] = gpu_now() - t0;
    }
    if (n < 5)
        return 0;
    qsort(t, (size_t)n, sizeof t[0], cmp_double);
    return bytes / t[n / 2] / 1e9;
}

/* ---- 4. attention alone ---- */

static double attention_gbs(uint32_t b, uint32_t ctx, double *secs)
{
    uint32_t per_seq = (ctx + BS - 1) / BS;
    kvp_kv_pool kv = {.dtype = KVP_DTYPE_F16, .n_blocks = b * per_seq, .block_size = BS, .n_layer = 1,
                      .n_head_kv = NKV, .head_dim = HD};
    kv.block_bytes = (uint64_t)2 * NKV * BS * HD * 2;
    kv.base = dev_alloc((size_t)kv.n_blocks * kv.block_bytes);
    dev_fill(kv.base, (size_t)kv.n_blocks * kv.block_bytes, KVP_DTYPE_F16);
    int32_t *hp = malloc(4ull * b);
    uint32_t *hs = malloc(4ull * b), *tab = malloc(4ull * kv.n_blocks);
    if (!hp || !hs || !tab)
        exit(1);
    for (uint32_t i = 0; i < b; i++)
        hp[i] = (int32_t)ctx - 1, hs[i] = i;
    for (uint32_t i = 0; i < kv.n_blocks; i++) /* each sequence's blocks scattered over the pool */
        tab[i] = (uint32_t)(((uint64_t)i * 7919) % kv.n_blocks);
    float *q = dev_alloc(4ull * b * NH * HD), *out = dev_alloc(4ull * b * NH * HD);
    int32_t *dp = dev_alloc(4ull * b);
    uint32_t *ds = dev_alloc(4ull * b), *dt = dev_alloc(4ull * kv.n_blocks);
    float *hq = malloc(4ull * b * NH * HD);
    if (!hq)
        exit(1);
    for (size_t i = 0; i < (size_t)b * NH * HD; i++)
        hq[i] = (float)((int)(next64() % 2001) - 1000) / 1000;
    OP("from_host", gb->ops->from_host(gb, q, hq, 4ull * b * NH * HD, err));
    free(hq);
    OP("from_host", gb->ops->from_host(gb, dp, hp, 4ull * b, err));
    OP("from_host", gb->ops->from_host(gb, ds, hs, 4ull * b, err));
    OP("from_host", gb->ops->from_host(gb, dt, tab, 4ull * kv.n_blocks, err));
    kvp_backend_reserve r = {.max_tok = b, .max_ctx = ctx, .max_n_in = D, .n_head = NH, .kv = &kv};
    OP("reserve", gb->ops->reserve(gb, &r, err));
    kvp_attn_args a = {.q = q, .out = out, .n_tok = b, .n_head = NH, .layer = 0, .scale = 1.0f / sqrtf((float)HD),
                       .pos = dp, .tok_seq = ds, .tables = dt, .n_seq = b, .table_stride = per_seq,
                       .host_pos = hp, .host_tok_seq = hs, .max_ctx = ctx, .kv = &kv};
    /* rounds of 20 calls between synchronizes, a call's time their mean:
     * one call and a synchronize would time the launch and the wait too,
     * as much as a fast kernel itself */
    enum { BURST = 20 };
    double t[9];
    int n = 0;
    for (int i = 0; i < 11 && !over_budget(); i++) {
        double t0 = gpu_now();
        for (int j = 0; j < BURST; j++)
            OP("attention", gb->ops->attention(gb, &a, err));
        OP("synchronize", gb->ops->synchronize(gb, err));
        if (i >= 2)
            t[n++] = (gpu_now() - t0) / BURST;
    }
    void *d[] = {kv.base, q, out, dp, ds, dt};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
        gb->ops->release(gb, d[i]);
    free(hp), free(hs), free(tab);
    if (!n)
        return 0;
    qsort(t, (size_t)n, sizeof t[0], cmp_double);
    *secs = t[n / 2];
    double bytes = (double)b * ctx * 2 * NKV * HD * 2 + 8.0 * b * NH * HD; /* K and V read, q read and out written */
    return bytes / t[n / 2] / 1e9;
}

/* ---- 5. prompt matmuls ---- */

/* TFLOP/s of y[n_tok][n_out] = x . w^T for one of the model's matrices at
 * a prompt chunk's n_tok (the median of 5 after 2 warm-ups); 0 when the
 * budget ran out.  x holds small random values. */
static double prompt_tflops(const kvp_weight *w, uint32_t n_tok)
{
    float *x = dev_alloc(4ull * n_tok * w->n_in), *y = dev_alloc(4ull * n_tok * w->n_out);
    float *hx = malloc(4ull * n_tok * w->n_in);
    if (!hx)
        exit(1);
    for (size_t i = 0; i < (size_t)n_tok * w->n_in; i++)
        hx[i] = (float)((int)(next64() % 2001) - 1000) / 1000;
    OP("from_host", gb->ops->from_host(gb, x, hx, 4ull * n_tok * w->n_in, err));
    free(hx);
    kvp_backend_reserve r = {.max_tok = n_tok, .max_ctx = 1, .max_n_in = w->n_in, .n_head = NH, .kv = NULL};
    OP("reserve", gb->ops->reserve(gb, &r, err));
    double t[5];
    int n = 0;
    for (int i = 0; i < 7 && !over_budget(); i++) {
        double t0 = gpu_now();
        OP("matmul", gb->ops->matmul(gb, w, x, y, n_tok, err));
        OP("synchronize", gb->ops->synchronize(gb, err));
        if (i >= 2)
            t[n++] = gpu_now() - t0;
    }
    gb->ops->release(gb, x);
    gb->ops->release(gb, y);
    if (n < 5)
        return 0;
    qsort(t, (size_t)n, sizeof t[0], cmp_double);
    return 2.0 * n_tok * w->n_in * w->n_out / t[n / 2] / 1e12;
}

int main(int argc, char **argv)
{
    double budget = 120;
    static const struct option opts[] = {{"budget", required_argument, 0, 'b'}, {"layers", required_argument, 0, 'l'},
                                         {"steps", required_argument, 0, 's'}, {0, 0, 0, 0}};
    for (int c; (c = getopt_long(argc, argv, "b:l:s:", opts, NULL)) != -1;) {
        if (c == 'b')
            budget = atof(optarg);
        else if (c == 'l')
            n_layer = (uint32_t)atoi(optarg);
        else if (c == 's')
            n_steps = atoi(optarg);
        else {
            fprintf(stderr, "usage: gpu_bench [--budget SECONDS] [--layers N] [--steps N]\n");
            return 2;
        }
    }
    if (n_layer < 1 || n_layer > 32 || !(budget > 0) || n_steps < 1 || n_steps > 60) {
        fprintf(stderr, "gpu_bench: --layers 1..32, --budget > 0, --steps 1..60\n");
        return 2;
    }
    t_end = gpu_now() + budget;
    int open = gpu_open("gpu_bench", NULL, &gb);
    if (open <= 0)
        return open < 0;

    double bw_cuda = copy_bw_cuda(), bw_op = copy_bw_op(), bw = bw_cuda > 0 ? bw_cuda : bw_op;
    printf("copy bandwidth (bytes read + written): cudaMemcpy D2D %.0f GB/s, kv_copy_block %.0f GB/s\n", bw_cuda / 1e9,
           bw_op / 1e9);

    static const int dts[3] = {KVP_DTYPE_BF16, KVP_DTYPE_FP8_E4M3, KVP_DTYPE_I4};
    static const char *dnames[3] = {"bf16", "fp8 (tensor scale)", "int4 (g128)"};
    double b1_ms[3] = {0}, b1_gb[3] = {0}, pf_up[3] = {0}, pf_down[3] = {0}, gemv[3][3] = {{0}};
    enum { PROMPT = 512 };
    static const uint32_t sweep[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
    enum { NSW = sizeof sweep / sizeof sweep[0], CTX = 512 };
    double sweep_ms[NSW] = {0};
    step_bufs s;
    bufs_make(&s, 256, CTX + 64);
    for (int d = 0; d < 3 && !over_budget(); d++) {
        model_w m;
        double t0 = gpu_now();
        model_build(&m, dts[d]);
        printf("%s: %u layers built and prepared in %.1f s, %.2f GB of weights read per token\n", dnames[d], n_layer,
               gpu_now() - t0, m.bytes_per_token / 1e9);
        fflush(stdout);
        for (int k = 0; k < 3; k++)
            gemv[d][k] = gemv_gbs(&m, &s, k);
        double t = decode_median(&m, &s, 1, CTX, 3, n_steps);
        b1_ms[d] = t * 1e3, b1_gb[d] = m.bytes_per_token / 1e9;
        if (d == 0) /* the sweep on bf16 */
            for (int i = 0; i < NSW && t > 0; i++) {
                sweep_ms[i] = i == 0 ? t * 1e3 : decode_median(&m, &s, sweep[i], CTX, 2, n_steps < 5 ? n_steps : 5) * 1e3;
                if (sweep_ms[i] <= 0)
                    break;
                printf("  bf16 batch %3u: %8.2f ms/step %9.1f tokens/s\n", sweep[i], sweep_ms[i],
                       sweep[i] / (sweep_ms[i] * 1e-3));
                fflush(stdout);
            }
        pf_up[d] = prompt_tflops(&m.layers[0].up, PROMPT);
        pf_down[d] = prompt_tflops(&m.layers[0].down, PROMPT);
        model_free(&m);
    }
    bufs_free(&s);

    static const uint32_t att[][2] = {{1, 1024}, {64, 1024}, {1, 8192}, {16, 8192}};
    double att_gbs[4] = {0}, att_s[4] = {0};
    for (int i = 0; i < 4 && !over_budget(); i++)
        att_gbs[i] = attention_gbs(att[i][0], att[i][1], &att_s[i]);

    printf("\n== Llama-3-8B shape, %u layers, batch-1 decode at context %d (weights read / step time) ==\n", n_layer,
           CTX);
    printf("%-20s %10s %10s %10s %10s\n", "weights", "GB/token", "ms/token", "GB/s", "of copy");
    for (int d = 0; d < 3; d++)
        if (b1_ms[d] > 0)
            printf("%-20s %10.2f %10.3f %10.0f %9.0f%%\n", dnames[d], b1_gb[d], b1_ms[d], b1_gb[d] / (b1_ms[d] * 1e-3),
                   100 * b1_gb[d] / (b1_ms[d] * 1e-3) / (bw / 1e9));
        else
            printf("%-20s %10s\n", dnames[d], "(not run: out of time)");
    printf("\n== batch-1 GEMV alone, %u layers' matrices back to back (GB/s, %% of copy) ==\n", n_layer);
    printf("%-20s %16s %16s %16s\n", "weights", "q 4096x4096", "up 14336x4096", "down 4096x14336");
    for (int d = 0; d < 3; d++)
        if (gemv[d][0] > 0)
            printf("%-20s %9.0f (%3.0f%%) %9.0f (%3.0f%%) %9.0f (%3.0f%%)\n", dnames[d], gemv[d][0],
                   100 * gemv[d][0] / (bw / 1e9), gemv[d][1], 100 * gemv[d][1] / (bw / 1e9), gemv[d][2],
                   100 * gemv[d][2] / (bw / 1e9));
    printf("\n== batch sweep, bf16, context %d ==\n%8s %10s %12s\n", CTX, "batch", "ms/step", "tokens/s");
    for (int i = 0; i < NSW; i++)
        if (sweep_ms[i] > 0)
            printf("%8u %10.2f %12.1f\n", sweep[i], sweep_ms[i], sweep[i] / (sweep_ms[i] * 1e-3));
    printf("\n== paged decode attention, f16 KV, 32/8 heads of 128 ==\n%8s %8s %10s %10s %10s\n", "seqs", "context",
           "us", "GB/s", "of copy");
    for (int i = 0; i < 4; i++)
        if (att_gbs[i] > 0)
            printf("%8u %8u %10.1f %10.0f %9.0f%%\n", att[i][0], att[i][1], att_s[i] * 1e6, att_gbs[i],
                   100 * att_gbs[i] / (bw / 1e9));
    printf("\n== prompt matmuls, %d tokens (TFLOP/s) ==\n%-20s %12s %12s\n", PROMPT, "weights", "up 14336x4096",
           "down 4096x14336");
    for (int d = 0; d < 3; d++)
        if (pf_up[d] > 0)
            printf("%-20s %12.1f %12.1f\n", dnames[d], pf_up[d], pf_down[d]);
    printf("\nratios against the copy bandwidth measured above (%.0f GB/s, %s):\n", bw / 1e9,
           bw_cuda > 0 ? "cudaMemcpy" : "kv_copy_block");
    for (int d = 0; d < 3; d++)
        if (b1_ms[d] > 0)
            printf("  batch-1 decode %-20s %.2f\n", dnames[d], b1_gb[d] / (b1_ms[d] * 1e-3) / (bw / 1e9));
    for (int i = 0; i < 4; i++)
        if (att_gbs[i] > 0)
            printf("  attention %3u x %-5u            %.2f\n", att[i][0], att[i][1], att_gbs[i] / (bw / 1e9));
    for (int d = 1; d < 3; d++)
        if (pf_up[d] > 0 && pf_up[0] > 0)
            printf("prompt matmul %s against bf16 (up, down)   %.2f, %.2f\n", dnames[d], pf_up[d] / pf_up[0],
                   pf_down[d] / pf_down[0]);
    if (over_budget())
        printf("(the %.0f s budget ran out: rows missing above were not run)\n", budget);
    kvp_backend_free(gb);
    return 0;
}
