/* backend_cpu.c - the CPU implementation of backend.h: host memory, a thread
 * pool, and the kernel table (AVX2 or portable) chosen when it is created. */
#include "argmax.h"
#include "backend.h"
#include "backend_cpu.h"
#include "backend_cpu_kern.h"
#include "comm.h"
#include "kvscale.h"
#include "minifloat.h"
#include "tensor.h"
#include "threadpool.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct cpu_impl {
    kvp_threadpool *pool;
    const kvp_cpu_kernels *k;
    int n_threads;
    int r16;               /* Q8_0, Q4_0, Q4_1, i8, i4 (and Q5_0) weights rewritten in rows of 16 (k->mm_r16) */
    struct cpu_weight *shared; /* the weights to be rewritten, held by refs (cpu_weight.key) */
    /* Scratch, sized by cpu_reserve (never inside an op): */
    uint32_t res_tok;      /* tokens a step may hold */
    uint32_t res_n_in;     /* the widest matmul row */
    uint32_t res_ctx;      /* keys a query may see */
    uint32_t row_n_in;     /* the widest weight prepared for the row path (0: none) */
    void *qbuf;            /* quantized activations [res_tok][res_n_in / 32] */
    size_t qbuf_size;
    void *qown;            /* each thread's own quantized activations (mm_own_quant), qown_stride bytes apiece */
    size_t qown_size, qown_stride;
    uint64_t qrun;         /* bumped by each matmul's preparation: which input a thread's qown holds */
    int q_in_qbuf;         /* the last preparation quantized into qbuf (not into the threads' own) */
    float *att;            /* attention scores, one slice per thread */
    size_t att_per_thread; /* floats */
    void *parts;           /* attention over key chunks: the chunks' results */
    size_t parts_size;
    void *runs;            /* attention's runs (attn_plan), one a token at most */
    size_t runs_size;
    void *tiles;           /* interleaved activation tiles (kvp_cpu_q8_tile_put) */
    size_t tiles_size;
    void *rowbuf;          /* the matmul's row path: rows as f32, per thread */
    size_t rowbuf_size;
} cpu_impl;

/* What prepare_weight keeps for a weight (w->dev). */
typedef struct cpu_weight {
    int32_t *wsum;         /* [n_out][n_in / 32] block sums, for flipped tiles (Q8_0, i8); else NULL */
    /* a Q4_K or Q5_0 weight in a form the kernels take (kvp_cpu_repack),
     * or a Q8_0, Q4_0, Q4_1, i8, i4 or K-quant one in rows of 16 (kvp_cpu_as_r16, cpu_impl.r16),
     * which its matmuls use: made when a descriptor that is multiplied is
     * prepared, so a weight only looked up (kvp_weight.lookup: an untied
     * embedding) never costs the memory; data NULL until then */
    int repack;
    kvp_weight alt;
    /* A weight to be rewritten is shared by every descriptor of the same
     * stored tensor this backend prepares (specdec's layerskip engine over
     * the target's first layers, the target's own): one rewrite, one copy.
     * key: the descriptor it was made for; refs: the descriptors holding it
     * (freed with the last, so an entry never outlives its model). */
    kvp_weight key;
    uint32_t refs;
    struct cpu_weight *next; /* cpu_impl.shared */
} cpu_weight;

/* Rows a matmul task takes on the row path (its f32 scratch), and at least on any path past 8 tokens (mm_task_rows). */
#define KVP_CPU_ROWBUF_ROWS 64

static cpu_impl *impl_of(kvp_backend *b) { return b->impl; }

static void *grow(void **p, size_t *have, size_t need)
{
    if (need <= *have)
        return *p;
    free(*p);
    *p = aligned_alloc(64, (need + 63) & ~(size_t)63);
    *have = *p ? need : 0;
    return *p;
}

/* ---- memory ---- */

/* Every block carries a 64-byte header {size, kind} in front of it.  Large
 * ones (the KV pool) are anonymous mappings: zero pages arrive on first
 * touch, so an unused KV pool costs no resident memory. */
#define KVP_ALLOC_HDR 64
#define KVP_ALLOC_MMAP_MIN ((size_t)1 << 20)

static void *cpu_alloc(kvp_backend *b, size_t bytes)
{
    (void)b;
    size_t n = ((bytes + 63) & ~(size_t)63) + KVP_ALLOC_HDR;
    uint8_t *base;
    int mapped = n >= KVP_ALLOC_MMAP_MIN;
    if (n < bytes)
        return NULL;
    if (mapped) {
        void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        base = m == MAP_FAILED ? NULL : m;
    } else {
        base = aligned_alloc(64, n);
        if (base)
            memset(base, 0, n);
    }
    if (!base)
        return NULL;
    ((size_t *)base)[0] = n;
    ((size_t *)base)[1] = (size_t)mapped;
    return base + KVP_ALLOC_HDR;
}

static void cpu_release(kvp_backend *b, void *p)
{
    (void)b;
    if (!p)
        return;
    uint8_t *base = (uint8_t *)p - KVP_ALLOC_HDR;
    if (((size_t *)base)[1])
        munmap(base, ((size_t *)base)[0]);
    else
        free(base);
}
static int cpu_copy(kvp_backend *b, void *dst, const void *src, size_t bytes, kvp_err *err)
{
    (void)b, (void)err;
    memcpy(dst, src, bytes);
    return 0;
}

/* Every op has finished when it returns: nothing to wait for. */
static int cpu_synchronize(kvp_backend *b, kvp_err *err)
{
    (void)b, (void)err;
    return 0;
}

/* ---- matmul ---- */

/* The work is cut into pieces for the kernels (kvp_mm_blk): up to
 * KVP_MM_ROWS rows (a few tokens of a quantized kind: the table's
 * few_rows) by one token group, the groups tile_tok tokens from token
 * 0 of the step (on AMX: a task's rows by groups of KVP_AMX_TOK).  The
 * kernels give each (row, token) the same bits in any piece, so neither
 * this cut, nor the tasks', nor the thread count reach the results
 * (backend_cpu_kern.h). */
typedef struct mm_ctx {
    const kvp_cpu_kernels *k;
    const kvp_weight *w;
    const float *x;            /* [n_tok][n_in] */
    const kvp_q8blk *xq;       /* [n_tok][n_in/32] when quantized */
    float *y;                  /* [n_tok][n_out] */
    uint8_t *tiles;            /* per group of T tokens: its xt and dxs (kvp_cpu_q8_tile_put), or NULL */
    size_t tile_bytes;         /* per group */
    uint32_t T;                /* tokens a group: tile_tok, or KVP_AMX_TOK on AMX */
    uint32_t unit;             /* the tiles' grouping (tile_unit, or 4 on AMX) */
    int flip;                  /* tiles flipped, and wsum set (tile_flip) */
    int amx;                   /* c->mm is an AMX kernel: pieces of a task's rows */
    int r16;                   /* w is in rows of 16: pieces from a group's first row, no VNNI tile */
    const int32_t *wsum;       /* [n_out][nb] when flip: the weight's (cpu_weight) */
    uint32_t n_tok, rows_per_task, toks_per_task, n_row_tasks;
    int quant;
    uint8_t *qown;             /* mm_own_quant: the threads' own activations (cpu_impl.qown), else NULL */
    size_t qown_stride;
    uint64_t qrun;             /* the input's preparation (cpu_impl.qrun) */
    kvp_mm_fn mm;
    kvp_mm_fn amx_mm;          /* the AMX kernel of w's kind, or NULL (mm_pick) */
    float *rowbuf;             /* the row path: per thread, rows_per_task rows as f32 */
} mm_ctx;

void kvp_cpu_q8_tile_put(const kvp_q8blk *x, uint32_t t, uint32_t T, uint32_t nb, uint32_t unit, int flip,
                         int8_t *xt, float *dxs)
{
    const uint32_t S = kvp_q8_slots(T);
    for (uint32_t b = 0; b < nb; b++, dxs += 3 * S, xt += (size_t)T * KVP_QK) {
        uint64_t q[KVP_QK / 8];
        memcpy(q, x[b].q, KVP_QK);
        for (int i = 0; i < KVP_QK / 8; i++)
            q[i] ^= flip ? 0x8080808080808080ull : 0;
        if (unit == 4) /* constant sizes: memcpy becomes a move, not a call */
            for (uint32_t c = 0; c < KVP_QK / 4; c++)
                memcpy(xt + ((size_t)c * T + t) * 4, (const uint8_t *)q + c * 4, 4);
        else
            memcpy(xt + (size_t)t * KVP_QK, q, KVP_QK);
        dxs[t] = x[b].d;
        dxs[S + t] = x[b].s;
        memcpy(dxs + 2 * S + t, &x[b].sum, sizeof x[b].sum);
        if (t == 0)
            for (uint32_t u = T; u < S; u++) {
                dxs[u] = dxs[S + u] = 0.0f;
                memset(dxs + 2 * S + u, 0, sizeof(float));
            }
    }
}

void kvp_cpu_f32_tile_put(const float *x, uint32_t t, uint32_t T, uint32_t n, float *xt)
{
    for (uint32_t i = 0; i + 8 <= n; i += 8)
        memcpy(xt + (size_t)i * T + 8 * t, x + i, 8 * sizeof(float));
}

/* The tiles' preparation.  Task g quantizes tokens g*T .. g*T+T-1 (T =
 * tile_tok; the last group may be short, its tile's other slots zero) to
 * 8-bit blocks and puts them into its tile: one task a tile, as tokens of
 * one tile written by two threads would share cache lines. */
static void mm_prep_task(void *ctxp, int task, int thread)
{
    (void)thread;
    mm_ctx *c = ctxp;
    const kvp_weight *w = c->w;
    uint32_t nb = w->n_in / KVP_QK, T = c->T;
    uint32_t t0 = (uint32_t)task * T, t1 = t0 + T < c->n_tok ? t0 + T : c->n_tok;
    int8_t *xt = c->tiles ? (int8_t *)(c->tiles + (size_t)task * c->tile_bytes) : NULL;
    if (xt && t1 - t0 < T)
        memset(xt, 0, c->tile_bytes);
    if (!c->quant) { /* a float tile */
        for (uint32_t t = t0; t < t1; t++)
            kvp_cpu_f32_tile_put(c->x + (size_t)t * w->n_in, t - t0, T, w->n_in, (float *)xt);
        return;
    }
    for (uint32_t t = t0; t < t1; t++) {
        kvp_q8blk *xq = (kvp_q8blk *)c->xq + (size_t)t * nb;
        c->k->quant_q8(c->x + (size_t)t * w->n_in, xq, w->n_in);
        if (xt)
            kvp_cpu_q8_tile_put(xq, t - t0, T, nb, c->unit, c->flip, xt, (float *)(xt + (size_t)nb * T * KVP_QK));
    }
}

/* f16 and bf16 weights with float tiles on a float_groups table: the
 * kernel takes a task's full groups in one call, so each chunk of weights
 * is widened once for all of them. */
static int mm_wide_groups(const mm_ctx *c)
{
    return c->k->float_groups && c->tiles && !c->quant && !c->rowbuf &&
           (c->w->dtype == KVP_DTYPE_F16 || c->w->dtype == KVP_DTYPE_BF16);
}

/* The rows a piece takes: KVP_MM_ROWS, or the table's few_rows for a
 * quantized kind's group of few tokens, or KVP_WIDE_ROWS for full groups
 * that mm_wide_groups takes (AMX: all the task's rows).  The row path's
 * f32 rows are never quant. */
static uint32_t mm_piece_rows(const mm_ctx *c, uint32_t nt)
{
    const kvp_cpu_kernels *k = c->k;
    if (c->r16)
        return KVP_R16_ROWS;
    if (nt >= c->T && mm_wide_groups(c))
        return KVP_WIDE_ROWS;
    return c->quant && nt <= k->few_tok && k->few_rows ? k->few_rows : KVP_MM_ROWS;
}

/* The header of a thread's own activations (cpu_impl.qown): the
 * preparation they were quantized for.  A line of its own, the blocks
 * after it, so no line is ever written by one thread and read by another. */
#define KVP_QOWN_HEAD 64

/* A step of a few tokens (one group, no tiles) on several threads:
 * each thread quantizes the input itself, into its own buffer, at its
 * first task of the preparation, instead of the calling thread doing it
 * alone into one buffer that every thread then reads.  The same kernel on
 * the same x: the same bits.  Done once, the calling thread quantized
 * while the others waited, and its stores went to lines the others had
 * read the matmul before, each a round trip between the cores: on 2 cores
 * of an AMD EPYC (Zen 4) 5 tokens' input took 2.8-9.7 us where one thread
 * alone takes 1.5, 121 times a step.  SmolLM2 q8_0 at 600 tokens of
 * context, the two ways taking turns in one process (min of 15 rounds):
 * steps of 4-8 tokens 4-14% faster, of 1-3 the same; Q4_1 0-5%. */
static int mm_own_quant(const cpu_impl *im, const mm_ctx *c)
{
    return c->quant && !c->tiles && c->n_tok <= c->T && im->pool && im->n_threads > 1 && im->qown;
}

/* This thread's copy of c's input, quantized: made at its first task of
 * the preparation c->qrun, kept for the matmuls that share the input. */
static const kvp_q8blk *own_quant(const mm_ctx *c, int thread)
{
    uint8_t *slot = c->qown + (size_t)thread * c->qown_stride;
    kvp_q8blk *xq = (kvp_q8blk *)(slot + KVP_QOWN_HEAD);
    uint64_t *stamp = (uint64_t *)(void *)slot;
    if (*stamp != c->qrun) {
        uint32_t n = c->w->n_in, nb = n / KVP_QK;
        for (uint32_t t = 0; t < c->n_tok; t++)
            c->k->quant_q8(c->x + (size_t)t * n, xq + (size_t)t * nb, n);
        *stamp = c->qrun;
    }
    return xq;
}

/* Task: rows r0..r1 by tokens t0..t1, one token group at a time, the rows
 * mm_piece_rows a piece (AMX: all of them). */
static void mm_task(void *ctxp, int task, int thread)
{
    mm_ctx *c = ctxp;
    const kvp_weight *w = c->w;
    uint32_t r0 = (uint32_t)task % c->n_row_tasks * c->rows_per_task;
    uint32_t r1 = r0 + c->rows_per_task < w->n_out ? r0 + c->rows_per_task : w->n_out;
    uint32_t t0 = (uint32_t)task / c->n_row_tasks * c->toks_per_task;
    uint32_t t1 = t0 + c->toks_per_task < c->n_tok ? t0 + c->toks_per_task : c->n_tok;
    uint32_t nb = w->n_in / KVP_QK, T = c->T;
    const kvp_q8blk *xq0 = c->qown ? own_quant(c, thread) : c->xq;
    kvp_mm_blk b = {.w = w->data, .w_stride = w->row_bytes, .sc = w->scales, .zp = w->zeros,
                    .sc_stride = w->scale_stride, .g = w->group, .n = w->n_in, .ldy = w->n_out};
    uint32_t rw = 0; /* row rw at b.w */
    if (c->rowbuf) { /* the row path: this task's rows in f32, once for all its tokens */
        /* each thread its own slot of the most rows a task takes (a fused
         * run's matmuls take different numbers) */
        float *buf = c->rowbuf + (size_t)thread * KVP_CPU_ROWBUF_ROWS * w->n_in;
        for (uint32_t r = r0; r < r1; r++)
            c->k->weight_row(w, r, buf + (size_t)(r - r0) * w->n_in);
        b.w = (const uint8_t *)buf, rw = r0;
        b.w_stride = (size_t)w->n_in * sizeof(float);
        b.sc = b.zp = NULL;
    }
    const uint8_t *w0 = b.w;
    const float *sc0 = b.sc, *zp0 = b.zp;
    int groups = mm_wide_groups(c);
    b.xt_stride = c->tile_bytes;
    b.once = c->n_tok <= c->toks_per_task;
    for (uint32_t t = t0; t < t1; t += b.nt * b.ng) { /* t0 is a multiple of T */
        const kvp_q8blk *xq[KVP_AMX_TOK];
        const float *xf[KVP_AMX_TOK];
        b.nt = t1 - t < T ? t1 - t : T;
        b.ng = groups && b.nt == T ? (t1 - t) / T : 1;
        for (uint32_t i = 0; i < b.nt; i++) {
            xq[i] = c->quant ? xq0 + (size_t)(t + i) * nb : NULL;
            xf[i] = c->x + (size_t)(t + i) * w->n_in;
        }
        b.xq = xq, b.xf = xf;
        b.xt = c->tiles ? (const int8_t *)(c->tiles + (size_t)(t / T) * c->tile_bytes) : NULL;
        b.dxs = b.xt && c->quant ? (const float *)(b.xt + (size_t)nb * T * KVP_QK) : NULL;
        uint32_t piece = c->amx ? r1 - r0 : mm_piece_rows(c, b.nt);
        for (uint32_t r = r0; r < r1; r += piece) {
            b.nr = r1 - r < piece ? r1 - r : piece;
            b.w = w0 + (size_t)(r - rw) * b.w_stride;
            b.sc = sc0 ? sc0 + (size_t)r * w->scale_stride : NULL;
            b.zp = zp0 ? zp0 + (size_t)r * w->scale_stride : NULL;
            b.wsum = c->wsum ? c->wsum + (size_t)r * nb : NULL;
            b.d16 = c->r16 && !w->scales ? kvp_r16_plane(w->data, w->dtype, w->n_out, w->n_in, 0, r) : NULL;
            b.m16 = c->r16 && kvp_r16_plane1(w->dtype)
                        ? kvp_r16_plane(w->data, w->dtype, w->n_out, w->n_in, 1, r)
                        : NULL;
            b.y = c->y + (size_t)t * w->n_out + r;
            c->mm(&b);
        }
    }
}

/* The kernel for w: c->mm and c->quant set; 1 when it takes w's bytes
 * directly, 0 when w goes through the row path (f32 rows, mm_f32), -1 when
 * this backend cannot multiply w at all. */
static int mm_pick(const kvp_cpu_kernels *k, const kvp_weight *w, mm_ctx *c)
{
    int scaled_kind = 0;
    c->mm = c->amx_mm = NULL, c->quant = c->r16 = 0;
    switch (w->dtype) {
    case KVP_DTYPE_Q4_0: c->mm = k->mm_q4_0, c->amx_mm = k->amx_mm[0], c->quant = 1; break;
    case KVP_DTYPE_Q4_1: c->mm = k->mm_q4_1, c->amx_mm = k->amx_mm[1], c->quant = 1; break;
    case KVP_DTYPE_Q8_0: c->mm = k->mm_q8_0, c->amx_mm = k->amx_mm[2], c->quant = 1; break;
    case KVP_CPU_DTYPE_Q8_0_R16:
    case KVP_CPU_DTYPE_Q4_0_R16:
    case KVP_CPU_DTYPE_Q4_1_R16:
    case KVP_CPU_DTYPE_I8_R16:
    case KVP_CPU_DTYPE_I4_R16:
    case KVP_CPU_DTYPE_Q6_K_R16:
    case KVP_CPU_DTYPE_Q4_K_R16:
    case KVP_CPU_DTYPE_Q5_K_R16:
    case KVP_CPU_DTYPE_Q5_0_R16:
    case KVP_CPU_DTYPE_Q5_1_R16:
    case KVP_CPU_DTYPE_Q2_K_R16:
    case KVP_CPU_DTYPE_Q3_K_R16:
    case KVP_CPU_DTYPE_IQ4_NL_R16:
    case KVP_CPU_DTYPE_IQ4_XS_R16: /* the K-quants, Q5_x, IQ4: no AMX kernel, the rows of 16 take their prompts too */
        c->mm = k->mm_r16[w->dtype - KVP_CPU_DTYPE_Q8_0_R16];
        c->amx_mm = w->dtype >= KVP_CPU_DTYPE_Q6_K_R16 ? NULL : k->amx_mm[5 + w->dtype - KVP_CPU_DTYPE_Q8_0_R16];
        c->quant = c->r16 = 1;
        scaled_kind = w->dtype == KVP_CPU_DTYPE_I8_R16 || w->dtype == KVP_CPU_DTYPE_I4_R16;
        break;
    case KVP_DTYPE_F32: c->mm = k->mm_f32; break;
    case KVP_DTYPE_F16: c->mm = k->mm_f16; break;
    case KVP_DTYPE_BF16: c->mm = k->mm_bf16; break;
    case KVP_DTYPE_I8: c->mm = k->mm_i8, c->amx_mm = k->amx_mm[3], c->quant = 1, scaled_kind = 1; break;
    case KVP_DTYPE_I4: c->mm = k->mm_i4, c->amx_mm = k->amx_mm[4], c->quant = 1, scaled_kind = 1; break;
    case KVP_DTYPE_FP8_E4M3: c->mm = k->mm_e4m3, scaled_kind = 1; break;
    default: break;
    }
    if (c->mm && scaled_kind == (w->scales != NULL) && (!w->zeros || c->quant) &&
        !(scaled_kind && c->quant && w->group % KVP_QK))
        return 1;
    /* The row path: types with no dot kernel (Q5_x, the K-quants where
     * the table has no rows of 16, MXFP4, NVFP4, fp8-E5M2, scaled FP4, int
     * groups under 32) are turned into f32
     * a task's rows at a time and multiplied with the f32 kernels. */
    c->mm = k->mm_f32, c->amx_mm = NULL, c->quant = 0;
    return kvp_cpu_dequant_weight_row_ok(w) ? 0 : -1;
}

/* Whether AMX takes a matmul of w (picked into c, direct) of n_tok tokens:
 * from the kind's least tokens, its rows short enough for the 32-bit
 * offsets its header gather uses. */
static int mm_amx(const kvp_cpu_kernels *k, const kvp_weight *w, const mm_ctx *c, int direct, uint32_t n_tok)
{
    int q8 = w->dtype == KVP_DTYPE_Q8_0 || w->dtype == KVP_DTYPE_I8 || w->dtype == KVP_CPU_DTYPE_Q8_0_R16 ||
             w->dtype == KVP_CPU_DTYPE_I8_R16;
    int q4r = w->dtype == KVP_CPU_DTYPE_Q4_0_R16 || w->dtype == KVP_CPU_DTYPE_Q4_1_R16 ||
              w->dtype == KVP_CPU_DTYPE_I4_R16;
    return direct == 1 && c->amx_mm && n_tok >= (q8 ? k->amx_min_tok_q8 : q4r ? k->amx_min_tok_q4r : k->amx_min_tok) &&
           w->row_bytes < ((uint64_t)1 << 27);
}

/* Flipped tiles (tile_flip) multiply x + 128: the weight's block sums take
 * the 128s back out, so Q8_0 and i8 weights keep them, unless AMX takes
 * every step of theirs that would go through a tile (more than few_tok
 * tokens): then they would cost memory (4 bytes a block) and a pass at
 * load for nothing.  (It takes them from 9 tokens, so they are kept.) */
static int mm_wants_wsum(const kvp_cpu_kernels *k, const kvp_weight *w, const mm_ctx *c, int direct)
{
    return direct == 1 && k->tile_flip && (w->dtype == KVP_DTYPE_Q8_0 || w->dtype == KVP_DTYPE_I8) &&
           !mm_amx(k, w, c, direct, k->few_tok + 1);
}

static const char *wname(const kvp_weight *w) { return w->name ? w->name : "weight"; }

/* The shape checks every matmul of w needs, once. */
static int mm_check(const kvp_weight *w, const mm_ctx *c, kvp_err *err)
{
    if (w->scales && (!w->group || w->n_in % w->group))
        return kvp_err_set(err, KVP_EFORMAT, "%s: group %u does not divide a row of %u", wname(w), w->group, w->n_in);
    if (w->row_bytes > ((uint64_t)1 << 28)) /* the kernels address 8 rows with 32-bit offsets */
        return kvp_err_set(err, KVP_ELIMIT, "%s: rows of %llu bytes are longer than the CPU kernels take (256 MiB)",
                           wname(w), (unsigned long long)w->row_bytes);
    if (c->quant && w->n_in % KVP_QK)
        return kvp_err_set(err, KVP_EFORMAT, "%s: row of %u elements is not whole blocks of 32", wname(w), w->n_in);
    return 0;
}

/* Scratch the matmul of n_tok tokens by rows of n_in needs beyond what
 * reserve sized: 0, or KVP_ELIMIT naming the weight. */
static int mm_reserved(const cpu_impl *im, const kvp_weight *w, uint32_t n_tok, kvp_err *err)
{
    if (n_tok <= im->res_tok && w->n_in <= im->res_n_in)
        return 0;
    return kvp_err_set(err, KVP_ELIMIT, "%s: a matmul of %u tokens by rows of %u is beyond the scratch reserved "
                       "(%u tokens, rows of %u)", wname(w), n_tok, w->n_in, im->res_tok, im->res_n_in);
}

typedef struct wsum_ctx {
    const kvp_cpu_kernels *k;
    const kvp_weight *w;
    int32_t *wsum;
    uint32_t per;          /* rows a task */
} wsum_ctx;

static void wsum_task(void *ctxp, int task, int thread)
{
    (void)thread;
    wsum_ctx *c = ctxp;
    const kvp_weight *w = c->w;
    uint32_t nb = w->n_in / KVP_QK, r0 = (uint32_t)task * c->per;
    uint32_t r1 = r0 + c->per < w->n_out ? r0 + c->per : w->n_out;
    size_t bb = w->dtype == KVP_DTYPE_Q8_0 ? sizeof(kvp_blk_q8_0) : KVP_QK, qoff = bb - KVP_QK;
    for (uint32_t r = r0; r < r1; r++)
        c->k->wsum((const uint8_t *)w->data + (size_t)r * w->row_bytes + qoff, bb, nb, c->wsum + (size_t)r * nb);
}

/* w->dev made, holding w's block sums (mm_wants_wsum).  0 or a code. */
static int wsum_make(cpu_impl *im, kvp_weight *w, kvp_err *err)
{
    cpu_weight *cw = calloc(1, sizeof *cw);
    size_t n = (size_t)w->n_out * (w->n_in / KVP_QK);
    if (!cw || !(cw->wsum = malloc((n ? n : 1) * sizeof *cw->wsum))) {
        free(cw);
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory for its block sums", wname(w));
    }
    wsum_ctx wc = {.k = im->k, .w = w, .wsum = cw->wsum};
    uint32_t n_tasks = (uint32_t)im->n_threads * 4;
    wc.per = (w->n_out + n_tasks - 1) / n_tasks;
    kvp_threadpool_run(im->pool, wsum_task, &wc, (int)((w->n_out + wc.per - 1) / wc.per));
    w->dev = cw;
    return 0;
}

typedef struct r16_ctx {
    const kvp_weight *w;
    kvp_weight *out;
    uint32_t per;          /* groups of 16 rows a task */
} r16_ctx;

static void r16_task(void *ctxp, int task, int thread)
{
    (void)thread;
    const r16_ctx *c = ctxp;
    uint32_t ng = kvp_r16_groups(c->w->n_out), g0 = (uint32_t)task * c->per;
    kvp_cpu_r16_fill(c->w, c->out, g0, g0 + c->per < ng ? g0 + c->per : ng);
}

/* Whether [a, e) lies in one read-only private mapping of a file (a model
 * file as kvp_in maps it), from /proc/self/maps: its pages can be dropped
 * from this process and read back from the page cache unchanged. */
static int in_readonly_file_map(uintptr_t a, uintptr_t e)
{
    FILE *f = fopen("/proc/self/maps", "re");
    if (!f)
        return 0;
    char line[512];
    int ok = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi, inode;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s %*s %*s %lu", &lo, &hi, perms, &inode) != 4 || a < lo || a >= hi)
            continue;
        ok = e <= hi && inode != 0 && !strcmp(perms, "r--p");
        break;
    }
    fclose(f);
    return ok;
}

/* A weight's stored bytes, which its matmuls no longer read (they read its
 * other form): their pages leave this process's memory, or a model in Q4_K
 * or Q8_0 would take its file's size twice over (the 1.1B shape in Q4_K:
 * peak RSS 1250 MB, 785 with this).  Not destroyed: a mapped file's pages
 * are only unmapped (MADV_DONTNEED) and stay in the page cache, so the
 * next engine over the same model (specdec --compare and --profile make
 * one a run) rewrites the weight from memory, not from the disk, as after
 * MADV_PAGEOUT, which evicts them (a profile's prompts took twice as long
 * so); other memory (a model read from a pipe) is paged out, swapped or
 * kept.  Hints, which a kernel before Linux 5.4 may refuse. */
static void give_back_pages(const void *data, size_t bytes)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), p0 = (uintptr_t)data;
    uintptr_t a = (p0 + page - 1) & ~(page - 1), e = (p0 + (uintptr_t)bytes) & ~(page - 1);
    if (e <= a)
        return;
    if (in_readonly_file_map(a, e)) {
        madvise((void *)a, e - a, MADV_DONTNEED);
        return;
    }
#ifdef MADV_PAGEOUT
    madvise((void *)a, e - a, MADV_PAGEOUT);
#endif
}

/* Whether w is a kind the table takes in rows of 16 (kvp_cpu_r16_alloc's):
 * Q8_0, Q4_0 or Q4_1 without scales, i8 or i4 with scales in groups of a
 * multiple of 32, Q5_0 or Q5_1, in whole blocks; the K-quants in whole
 * super-blocks. */
static int r16_stored(const cpu_impl *im, const kvp_weight *w)
{
    int d = kvp_cpu_r16_dtype(w);
    return im->r16 && d && im->k->mm_r16[d - KVP_CPU_DTYPE_Q8_0_R16];
}

/* Whether w's matmuls multiply another form of it (cpu_weight.alt): Q4_K,
 * Q5_0, IQ4_NL and IQ4_XS (kvp_cpu_repack; in rows of 16 where the table takes them),
 * and Q8_0, Q4_0, Q4_1, i8, i4 and Q6_K where it does. */
static int wants_repack(const cpu_impl *im, const kvp_weight *w)
{
    return kvp_cpu_repackable(w) || r16_stored(im, w);
}

/* The weight a matmul of w multiplies: its other form (wants_repack),
 * made the first time with the block sums its kernel may want (0, or a
 * negative code). */
static int mm_weight(cpu_impl *im, const kvp_weight **w, kvp_err *err)
{
    cpu_weight *cw = (*w)->dev;
    if (!cw || !cw->repack)
        return 0;
    if (!cw->alt.data) {
        int rc;
        if (r16_stored(im, *w)) { /* the threads share the groups */
            if ((rc = kvp_cpu_r16_alloc(*w, &cw->alt, err)) > 0) {
                r16_ctx rc16 = {.w = *w, .out = &cw->alt, .per = 64};
                uint32_t ng = kvp_r16_groups((*w)->n_out);
                kvp_threadpool_run(im->pool, r16_task, &rc16, (int)((ng + rc16.per - 1) / rc16.per));
            }
        } else { /* without rows of 16 for it: Q4_K as int4, Q5_0 and IQ4_NL as Q8_0, IQ4_XS as int8 */
            rc = kvp_cpu_repack(*w, &cw->alt, err);
        }
        if (rc <= 0)
            return rc < 0 ? rc : kvp_err_set(err, KVP_EINVAL, "%s: cannot be rewritten for the kernels",
                                              (*w)->name ? (*w)->name : "weight");
        mm_ctx c = {0};
        int direct = mm_pick(im->k, &cw->alt, &c);
        if (mm_wants_wsum(im->k, &cw->alt, &c, direct) && (rc = wsum_make(im, &cw->alt, err)) < 0) {
            kvp_cpu_repacked_free(&cw->alt);
            return rc;
        }
        give_back_pages((*w)->data, (size_t)((*w)->n_out * (*w)->row_bytes));
    }
    *w = &cw->alt;
    return 0;
}

/* Bytes of weight rows a task of many tokens takes at most (mm_task_rows). */
#define KVP_CPU_TASK_BYTES ((size_t)256 << 10)

/* The most rows a task takes past 8 tokens, or on the row path: each of
 * its token groups passes over them, so they stay in L2 from one pass to
 * the next (1 MiB a core on Zen 4, 2 on the Xeon): as many as
 * KVP_CPU_TASK_BYTES hold, at least KVP_CPU_ROWBUF_ROWS.  The row path's
 * f32 rows are KVP_CPU_ROWBUF_ROWS (its scratch), and so are AMX's tasks
 * (never timed otherwise).  64 rows everywhere made a task of SmolLM2's
 * rows (612 bytes of Q8_0) a stream of 39 KB, and a step of 9 tokens read
 * the output head at half the speed of 8 tokens' (whose tasks are an
 * eighth of its rows).  SmolLM2, 2 threads, AMD EPYC (Zen 4), the two
 * ways in turns in one process: q8_0 steps of 9-15 tokens 3-9% faster,
 * f16 at 12 tokens 4-6%, a 512-token prompt 7% (q8_0), 1-2% (Q4_1), the
 * same (f16); the 1.1B Llama shape's q8_0 256-token prompt the same. */
static uint32_t mm_task_rows(const mm_ctx *c, int direct)
{
    if (!direct || c->amx)
        return KVP_CPU_ROWBUF_ROWS;
    size_t rows = KVP_CPU_TASK_BYTES / (c->w->row_bytes ? c->w->row_bytes : 1);
    return rows < KVP_CPU_ROWBUF_ROWS ? KVP_CPU_ROWBUF_ROWS : rows > UINT32_MAX ? UINT32_MAX : (uint32_t)rows;
}

/* What a matmul of w needs before its tasks (mm_task) run: *cp set up
 * and, when prep, x quantized (with the tiles) as w's kernel takes it.
 * The number of tasks (0: none, *cp unused), or a negative code. */
static int mm_setup(cpu_impl *im, const kvp_weight *w, const float *x, float *y, uint32_t n_tok, int prep,
                    mm_ctx *cp, kvp_err *err)
{
    const kvp_cpu_kernels *k = im->k;
    int rc = mm_weight(im, &w, err);
    if (rc < 0)
        return rc;
    mm_ctx c = {.k = k, .w = w, .x = x, .y = y, .n_tok = n_tok};
    int direct = mm_pick(k, w, &c);
    if (direct < 0)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: weight type %s%s has no CPU matmul", wname(w),
                           kvp_dtype_name((uint32_t)w->dtype), w->scales ? " with scales" : "");
    if ((rc = mm_check(w, &c, err)) < 0)
        return rc;
    if (n_tok == 0)
        return 0;
    if ((rc = mm_reserved(im, w, n_tok, err)) < 0)
        return rc;
    c.T = k->tile_tok, c.unit = k->tile_unit;
    if (mm_amx(k, w, &c, direct, n_tok)) {
        c.mm = c.amx_mm, c.amx = 1;
        c.T = KVP_AMX_TOK, c.unit = c.r16 ? KVP_QK : 4; /* rows of 16: the tokens are A, whole blocks */
    }
    uint32_t T = c.T, n_groups = (n_tok + T - 1) / T, nb = w->n_in / KVP_QK;
    if (c.quant) {
        c.xq = im->qbuf;
        if (c.amx || (n_tok > k->few_tok && !c.r16)) { /* some group goes through a tile */
            c.tile_bytes = kvp_q8_tile_bytes(T, nb);
            c.tiles = im->tiles;
            c.flip = !c.amx && mm_wants_wsum(k, w, &c, direct);
        }
        if (c.flip) {
            const cpu_weight *cw = w->dev;
            if (!cw || !cw->wsum)
                return kvp_err_set(err, KVP_EINVAL, "%s: weight was not prepared (prepare_weight)", wname(w));
            c.wsum = cw->wsum;
        }
        if (mm_own_quant(im, &c)) {
            c.qown = im->qown, c.qown_stride = im->qown_stride;
            if (prep || im->q_in_qbuf)
                im->qrun++, im->q_in_qbuf = 0;
            c.qrun = im->qrun;
        } else if (prep || !im->q_in_qbuf) {
            kvp_threadpool_run(n_groups > 1 ? im->pool : NULL, mm_prep_task, &c, (int)n_groups);
            im->qrun++, im->q_in_qbuf = 1;
        }
    } else if (direct == 1 && k->float_tile && n_tok > 2 && w->n_in >= 8 &&
               (w->dtype == KVP_DTYPE_F32 || w->dtype == KVP_DTYPE_F16 || w->dtype == KVP_DTYPE_BF16)) {
        c.tile_bytes = kvp_f32_tile_bytes(T, w->n_in);
        c.tiles = im->tiles;
        if (prep)
            kvp_threadpool_run(n_groups > 1 ? im->pool : NULL, mm_prep_task, &c, (int)n_groups);
    }
    /* Tasks: rows split so each thread gets several (load balance), tokens
     * split in whole groups so a task's weight rows stay in cache across
     * them. */
    uint32_t nth = (uint32_t)im->n_threads;
    c.toks_per_task = n_tok <= 8 ? n_tok : 64; /* a multiple of T */
    uint32_t n_tok_tasks = (n_tok + c.toks_per_task - 1) / c.toks_per_task;
    uint32_t want = nth * 4 / n_tok_tasks;
    if (want < 1)
        want = 1;
    uint32_t rows = (w->n_out + want - 1) / want;
    uint32_t cap = n_tok > 8 || !direct ? mm_task_rows(&c, direct) : UINT32_MAX;
    if (rows > cap)
        rows = cap;
    /* AMX: whole tiles of 16 rows; a few tokens: whole pieces */
    uint32_t unit_rows = c.amx ? 16 : mm_piece_rows(&c, n_tok);
    rows = (rows + unit_rows - 1) / unit_rows * unit_rows;
    c.rows_per_task = rows;
    c.n_row_tasks = (w->n_out + rows - 1) / rows;
    if (!direct) {
        if (w->n_in > im->row_n_in)
            return kvp_err_set(err, KVP_ELIMIT, "%s: rows of %u as f32 are beyond the scratch reserved (%u; "
                               "prepare_weight, then reserve)", wname(w), w->n_in, im->row_n_in);
        c.rowbuf = im->rowbuf;
    }
    *cp = c;
    return (int)(c.n_row_tasks * n_tok_tasks);
}

/* One matmul, x prepared first when prep (else as the matmul before it
 * left it: mm_same_input). */
static int mm_run(cpu_impl *im, const kvp_weight *w, const float *x, float *y, uint32_t n_tok, int prep, kvp_err *err)
{
    mm_ctx c;
    int n = mm_setup(im, w, x, y, n_tok, prep, &c, err);
    if (n > 0)
        kvp_threadpool_run(im->pool, mm_task, &c, n);
    return n < 0 ? n : 0;
}

static int cpu_matmul(kvp_backend *b, const kvp_weight *w, const float *x, float *y, uint32_t n_tok, kvp_err *err)
{
    return mm_run(impl_of(b), w, x, y, n_tok, 1, err);
}

/* Weights matmul_n runs in one pass of the pool, at most, and the most
 * tokens it does so for: a decode step's passes are short enough that
 * waiting on the pool is a share of them (SmolLM2 Q4_1 and q8_0 generation
 * +7% fused, paired runs); a prompt's are not (no gain measured). */
#define KVP_CPU_MM_FUSE 4
#define KVP_CPU_MM_FUSE_TOK 16

/* The tasks of several matmuls of one input as one run: task i of the run
 * is task i - base[j] of matmul j. */
typedef struct mm_fused {
    mm_ctx c[KVP_CPU_MM_FUSE];
    int base[KVP_CPU_MM_FUSE + 1];
} mm_fused;

static void mm_fused_task(void *ctxp, int task, int thread)
{
    mm_fused *f = ctxp;
    int j = 0;
    while (task >= f->base[j + 1])
        j++;
    mm_task(&f->c[j], task - f->base[j], thread);
}

/* Whether matmuls of w[0] and w quantize x alike (same kernel, same rows),
 * so that the first one's preparation serves both. */
static int mm_same_input(const kvp_weight *a, const kvp_weight *w)
{
    return a->dtype == w->dtype && a->n_in == w->n_in && !a->scales == !w->scales && !a->zeros == !w->zeros &&
           a->group == w->group;
}

/* y[j] = x . w[j]^T, j < n_w: matmuls of one input (a layer's Q, K and V;
 * gate and up), x prepared (quantized, put in tiles) once for all of them.
 * Up to KVP_CPU_MM_FUSE_TOK tokens in one pass of the pool, so a small
 * model's decode step waits on the pool three times a layer fewer; more,
 * one matmul after another, the first one's preparation serving the rest
 * (SmolLM2 q8_0 prompts quantized each layer's input 7 times for 4).  Each
 * matmul's tasks and kernels are cpu_matmul's: the same bits. */
static int cpu_matmul_n(kvp_backend *b, const kvp_weight *const *w, uint32_t n_w, const float *x, float *const *y,
                        uint32_t n_tok, kvp_err *err)
{
    cpu_impl *im = impl_of(b);
    int same = n_w <= KVP_CPU_MM_FUSE;
    const kvp_weight *mw[KVP_CPU_MM_FUSE]; /* what each multiplies (mm_weight) */
    for (uint32_t j = 0; same && j < n_w; j++) {
        mw[j] = w[j];
        int rc = mm_weight(im, &mw[j], err);
        if (rc < 0)
            return rc;
    }
    for (uint32_t j = 1; same && j < n_w; j++)
        same = mm_same_input(mw[0], mw[j]);
    if (!same || n_tok > KVP_CPU_MM_FUSE_TOK) {
        for (uint32_t j = 0; j < n_w; j++) {
            int rc = mm_run(im, w[j], x, y[j], n_tok, !same || j == 0, err);
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    mm_fused f;
    f.base[0] = 0;
    for (uint32_t j = 0; j < n_w; j++) {
        int n = mm_setup(im, w[j], x, y[j], n_tok, j == 0, &f.c[j], err);
        if (n < 0)
            return n;
        f.base[j + 1] = f.base[j] + n;
    }
    if (f.base[n_w] > 0)
        kvp_threadpool_run(im->pool, mm_fused_task, &f, f.base[n_w]);
    return 0;
}

/* ---- weights and scratch ---- */

/* The same stored tensor, as the descriptors of two engines over one model
 * (or over its first layers) give it. */
static int same_stored(const kvp_weight *a, const kvp_weight *b)
{
    return a->data == b->data && a->dtype == b->dtype && a->n_in == b->n_in && a->n_out == b->n_out &&
           a->row_bytes == b->row_bytes && a->scales == b->scales && a->zeros == b->zeros && a->group == b->group &&
           a->scale_stride == b->scale_stride;
}

static void cpu_release_weight(kvp_backend *b, kvp_weight *w)
{
    cpu_weight *cw = w->dev;
    if (cw && cw->repack) { /* shared: the last holder frees it */
        cpu_impl *im = impl_of(b);
        w->dev = NULL;
        if (--cw->refs > 0)
            return;
        cpu_weight **p = &im->shared;
        while (*p && *p != cw)
            p = &(*p)->next;
        if (*p)
            *p = cw->next;
    }
    if (cw) {
        free(cw->wsum);
        if (cw->alt.data) {
            cpu_release_weight(b, &cw->alt); /* its block sums */
            kvp_cpu_repacked_free(&cw->alt);
        }
        free(cw);
    }
    w->dev = NULL;
}

/* Check w once; keep the block sums flipped tiles need; note the widest
 * row-path weight, whose f32 rows reserve sizes. */
static int cpu_prepare_weight(kvp_backend *b, kvp_weight *w, kvp_err *err)
{
    cpu_impl *im = impl_of(b);
    mm_ctx c = {0};
    int direct = mm_pick(im->k, w, &c), rc;
    if (w->n_out == 1 && w->dtype == KVP_DTYPE_F32) /* norm weights, biases, frequencies: read as they are */
        return 0;
    if (wants_repack(im, w) && !w->dev) { /* shared, and rewritten below (mm_weight) */
        cpu_weight *cw = im->shared;
        while (cw && !same_stored(&cw->key, w))
            cw = cw->next;
        if (!cw) {
            if (!(cw = calloc(1, sizeof *cw)))
                return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", wname(w));
            cw->repack = 1;
            cw->key = *w;
            cw->next = im->shared;
            im->shared = cw;
        }
        cw->refs++;
        w->dev = cw;
        /* Rewritten now, not at its first product: the engine is made
         * before a job's clock starts, and a first request's TTFT carried
         * the rewrite (1.1B Q4_K_M: 1.7 s against 0.2 for the next). */
        const kvp_weight *mw = w;
        if (!w->lookup && (rc = mm_weight(im, &mw, err)) < 0)
            return rc;
    }
    if (direct < 0)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: weight type %s%s is not supported by the CPU backend",
                           wname(w), w->dtype >= 0 ? kvp_dtype_name((uint32_t)w->dtype) : "(absent)",
                           w->scales ? " with scales" : "");
    if (direct >= 0 && (rc = mm_check(w, &c, err)) < 0)
        return rc;
    if (direct == 0 && w->n_in > im->row_n_in) {
        size_t need = (size_t)im->n_threads * KVP_CPU_ROWBUF_ROWS * w->n_in * sizeof(float);
        if (!grow(&im->rowbuf, &im->rowbuf_size, need))
            return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory for %u rows of %u as f32", wname(w),
                               KVP_CPU_ROWBUF_ROWS, w->n_in);
        im->row_n_in = w->n_in;
    }
    if (!mm_wants_wsum(im->k, w, &c, direct) || w->dev)
        return 0;
    return wsum_make(im, w, err);
}

static int cpu_supports(const kvp_backend *b, int use, int dtype, int scaled)
{
    (void)b;
    if (use == KVP_USE_TREE)
        return 1;
    if (use == KVP_USE_KV) /* fp8 and i8 pools always carry their scales */
        return (dtype == KVP_DTYPE_F32 || dtype == KVP_DTYPE_F16 || dtype == KVP_DTYPE_BF16 ||
                           dtype == KVP_DTYPE_FP8_E4M3 || dtype == KVP_DTYPE_I8);
    if (use != KVP_USE_MATMUL && use != KVP_USE_EMBED)
        return 0;
    /* The row reader decides: any dtype it turns into f32 rows is usable. */
    kvp_weight w = {.dtype = dtype, .n_in = 256, .n_out = 1, .group = 32, .scale_stride = 8};
    static const float one[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    w.scales = scaled ? one : NULL;
    return kvp_cpu_dequant_weight_row_ok(&w);
}

static int cpu_embed(kvp_backend *b, const kvp_weight *w, const int32_t *tokens, uint32_t n_tok, float *out,
                     kvp_err *err)
{
    const kvp_cpu_kernels *k = impl_of(b)->k;
    /* A tied output head already in rows of 16 is read there: the same
     * values, and the stored rows' pages, given back (mm_weight), stay
     * out of memory instead of being faulted back a token at a time. */
    const cpu_weight *cw = w->dev;
    const kvp_weight *r16 = cw && cw->alt.data && kvp_r16_kind(cw->alt.dtype) ? &cw->alt : NULL;
    for (uint32_t t = 0; t < n_tok; t++) {
        if (tokens[t] < 0 || (uint32_t)tokens[t] >= w->n_out)
            return kvp_err_set(err, KVP_EINVAL, "%s: token id %d is outside the vocabulary of %u",
                               w->name ? w->name : "embedding", tokens[t], w->n_out);
        float *row = out + (size_t)t * w->n_in;
        if ((r16 ? kvp_cpu_r16_row(r16, (uint32_t)tokens[t], row) : k->weight_row(w, (uint32_t)tokens[t], row)) < 0)
            return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: embedding type %s is not supported",
                               w->name ? w->name : "embedding", kvp_dtype_name((uint32_t)w->dtype));
    }
    return 0;
}

/* ---- elementwise ---- */

/* A 1-D f32 weight's n floats (norm weights, biases, RoPE frequencies). */
static const float *f32_vec(const kvp_weight *w, uint32_t n, kvp_err *err)
{
    if (w->dtype != KVP_DTYPE_F32 || (uint64_t)w->n_in * w->n_out < n || !w->data) {
        kvp_err_set(err, KVP_EINVAL, "%s: wanted %u f32 values, it holds %s [%u x %u]", wname(w), n,
                    w->dtype >= 0 ? kvp_dtype_name((uint32_t)w->dtype) : "nothing", w->n_out, w->n_in);
        return NULL;
    }
    return w->data;
}

/* Elementwise work of a step of many tokens (a prompt chunk, a batch of
 * sequences) is split over the pool: each element is computed as one
 * thread alone computes it, so the bits do not change.  Below this many
 * elements the pool's handoff costs more than the work (decode's token). */
#define KVP_CPU_EW_MIN 16384

typedef void (*ew_fn)(void *args, size_t a, size_t b); /* units [a, b) */
typedef struct ew_ctx {
    ew_fn fn;
    void *args;
    size_t n, per;
} ew_ctx;

static void ew_task(void *ctxp, int task, int thread)
{
    (void)thread;
    const ew_ctx *c = ctxp;
    size_t a = (size_t)task * c->per, e = a + c->per < c->n ? a + c->per : c->n;
    c->fn(c->args, a, e);
}

/* fn over units [0, n) of `elems` elements each, two pieces a thread, each
 * a multiple of `align` units (a SIMD body's width, so the scalar tails
 * stay the elements they were). */
static void ew_run(cpu_impl *im, ew_fn fn, void *args, size_t n, size_t elems, size_t align)
{
    size_t parts = (size_t)im->n_threads * 2;
    if (im->n_threads < 2 || n < 2 || n * elems < KVP_CPU_EW_MIN) {
        fn(args, 0, n);
        return;
    }
    size_t per = (n + parts - 1) / parts;
    per = (per + align - 1) / align * align;
    ew_ctx c = {.fn = fn, .args = args, .n = n, .per = per};
    kvp_threadpool_run(im->pool, ew_task, &c, (int)((n + per - 1) / per));
}

typedef struct norm_args {
    const float *x, *weight;
    float *y;
    uint32_t n;
    float eps;
    void (*rms_row)(const float *x, const float *w, float *y, uint32_t n, float eps);
} norm_args;

static void rmsnorm_rows(void *ap, size_t t0, size_t t1)
{
    const norm_args *a = ap;
    for (size_t t = t0; t < t1; t++) {
        const float *x = a->x + t * a->n;
        float *y = a->y + t * a->n;
        a->rms_row(x, a->weight, y, a->n, a->eps);
    }
}

static int cpu_rmsnorm(kvp_backend *b, const float *x, const kvp_weight *w, float *y, uint32_t n_tok, uint32_t n,
                       float eps, kvp_err *err)
{
    const float *weight = f32_vec(w, n, err);
    if (!weight)
        return err->code;
    norm_args a = {.x = x, .weight = weight, .y = y, .n = n, .eps = eps, .rms_row = impl_of(b)->k->rms_row};
    ew_run(impl_of(b), rmsnorm_rows, &a, n_tok, n, 1);
    return 0;
}

/* Any rot_dim: the angles go through a small table KVP_ROPE_CHUNK pairs at a
 * time, each chunk applied to every head before the next is computed. */
#define KVP_ROPE_CHUNK 64

typedef struct rope_args {
    float *x;
    uint32_t n_head, head_dim, half;
    const int32_t *pos;
    const float *inv_freq;
    int kind;
} rope_args;

static void rope_rows(void *ap, size_t t0, size_t t1)
{
    const rope_args *a = ap;
    uint32_t half = a->half;
    float cs[KVP_ROPE_CHUNK], sn[KVP_ROPE_CHUNK];
    for (size_t t = t0; t < t1; t++) {
        for (uint32_t i0 = 0; i0 < half; i0 += KVP_ROPE_CHUNK) {
            uint32_t n = half - i0 < KVP_ROPE_CHUNK ? half - i0 : KVP_ROPE_CHUNK;
            for (uint32_t j = 0; j < n; j++) {
                float ang = (float)a->pos[t] * a->inv_freq[i0 + j];
                cs[j] = cosf(ang);
                sn[j] = sinf(ang);
            }
            for (uint32_t h = 0; h < a->n_head; h++) {
                float *v = a->x + (t * a->n_head + h) * a->head_dim;
                for (uint32_t j = 0; j < n; j++) {
                    uint32_t i = i0 + j;
                    uint32_t e0 = a->kind == KVP_ROPE_KIND_NEOX ? i : 2 * i;
                    uint32_t e1 = a->kind == KVP_ROPE_KIND_NEOX ? i + half : 2 * i + 1;
                    float p = v[e0], q = v[e1];
                    v[e0] = p * cs[j] - q * sn[j];
                    v[e1] = p * sn[j] + q * cs[j];
                }
            }
        }
    }
}

static int cpu_rope(kvp_backend *b, float *x, uint32_t n_tok, uint32_t n_head, uint32_t head_dim, uint32_t rot_dim,
                    const int32_t *pos, const kvp_weight *freq, int kind, kvp_err *err)
{
    uint32_t half = rot_dim / 2;
    const float *inv_freq = f32_vec(freq, half, err);
    if (!inv_freq)
        return err->code;
    if (rot_dim > head_dim)
        return kvp_err_set(err, KVP_EINVAL, "rope: %u rotated dims in a head of %u", rot_dim, head_dim);
    rope_args a = {.x = x, .n_head = n_head, .head_dim = head_dim, .half = half, .pos = pos, .inv_freq = inv_freq,
                   .kind = kind};
    /* a token's cost is its sines and cosines as much as its heads' elements */
    ew_run(impl_of(b), rope_rows, &a, n_tok, (size_t)n_head * head_dim + 8 * half, 1);
    return 0;
}

static int cpu_add_bias(kvp_backend *b, float *x, const kvp_weight *w, uint32_t n_tok, uint32_t n, kvp_err *err)
{
    (void)b;
    const float *bias = f32_vec(w, n, err);
    if (!bias)
        return err->code;
    for (uint32_t t = 0; t < n_tok; t++, x += n)
        for (uint32_t i = 0; i < n; i++)
            x[i] += bias[i];
    return 0;
}

typedef struct pair_args {
    float *x;
    const float *y;
    void (*silu_mul)(float *g, const float *u, size_t n);
} pair_args;

static void add_range(void *ap, size_t i0, size_t i1)
{
    const pair_args *a = ap;
    for (size_t i = i0; i < i1; i++)
        a->x[i] += a->y[i];
}

static void silu_mul_range(void *ap, size_t i0, size_t i1)
{
    const pair_args *a = ap;
    a->silu_mul(a->x + i0, a->y + i0, i1 - i0);
}

static int cpu_add(kvp_backend *b, float *x, const float *y, size_t n, kvp_err *err)
{
    (void)err;
    pair_args a = {.x = x, .y = y};
    ew_run(impl_of(b), add_range, &a, n, 1, 64);
    return 0;
}

static int cpu_silu_mul(kvp_backend *b, float *g, const float *u, size_t n, kvp_err *err)
{
    (void)err;
    pair_args a = {.x = g, .y = u, .silu_mul = impl_of(b)->k->silu_mul};
    ew_run(impl_of(b), silu_mul_range, &a, n, 1, 64);
    return 0;
}

static int cpu_gather_rows(kvp_backend *b, float *dst, const float *src, const uint32_t *rows, uint32_t n_rows,
                           uint32_t n, kvp_err *err)
{
    (void)b, (void)err;
    for (uint32_t i = 0; i < n_rows; i++)
        memcpy(dst + (size_t)i * n, src + (size_t)rows[i] * n, (size_t)n * sizeof(float));
    return 0;
}

typedef struct {
    const float *x;
    uint32_t n;
    uint32_t *ids;
} argmax_args;

static void argmax_units(void *argsp, size_t a, size_t e)
{
    const argmax_args *g = argsp;
    for (size_t i = a; i < e; i++)
        g->ids[i] = kvp_argmax_f32(g->x + i * g->n, g->n);
}

/* Rows spread over the threads: a step of many greedy sequences reads a
 * row of logits each (196 KB for a 49,152-token vocabulary). */
static int cpu_argmax_rows(kvp_backend *b, const float *x, uint32_t n_rows, uint32_t n, uint32_t *ids, kvp_err *err)
{
    (void)err;
    argmax_args g = {.x = x, .n = n, .ids = ids};
    ew_run(b->impl, argmax_units, &g, n_rows, n, 1);
    return 0;
}

/* ---- paged KV ---- */

/* Byte offset of (block, layer, K/V, head, slot) in the pool. */
static size_t kv_off(const kvp_kv_pool *kv, uint32_t block, uint32_t layer, uint32_t which, uint32_t head,
                     uint32_t slot)
{
    return (size_t)block * kv->block_bytes + kvp_kv_row_off(kv, layer, which, head, slot);
}

/* The scales of slab (block, layer, K/V, head) of a scaled cache, one a slot. */
static float *kv_scales(const kvp_kv_pool *kv, uint32_t block, uint32_t layer, uint32_t which, uint32_t head)
{
    return (float *)((uint8_t *)kv->base + (size_t)block * kv->block_bytes + kvp_kv_scale_off(kv, layer, which, head, 0));
}

static void kv_put(int dtype, void *dst, const float *src, uint32_t n)
{
    if (dtype == KVP_DTYPE_F32) {
        memcpy(dst, src, (size_t)n * 4);
        return;
    }
    if (dtype == KVP_DTYPE_F16) { /* F16C where the CPU has it: the same bits as the portable cast */
        kvp_f16_row_from_f32(KVP_IMPL_AUTO, src, dst, n);
        return;
    }
    uint16_t *h = dst;
    for (uint32_t i = 0; i < n; i++)
        h[i] = kvp_f32_to_bf16(src[i]);
}

/* One head's row src[head_dim] into slot s of its slab. */
static void kv_put_row(const kvp_kv_pool *kv, uint32_t blk, uint32_t layer, uint32_t which, uint32_t h, uint32_t s,
                       const float *src)
{
    uint8_t *base = kv->base;
    if (kvp_kvscale_dtype(kv->dtype))
        kv_scales(kv, blk, layer, which, h)[s] =
            kvp_kvscale_row(kv->dtype, src, kv->head_dim, base + kv_off(kv, blk, layer, which, h, s));
    else
        kv_put(kv->dtype, base + kv_off(kv, blk, layer, which, h, s), src, kv->head_dim);
}

static int cpu_kv_store(kvp_backend *b, const kvp_kv_pool *kv, uint32_t layer, const float *k, const float *v,
                        uint32_t n_tok, const uint32_t *slot, kvp_err *err)
{
    (void)b;
    if (layer >= kv->n_layer)
        return kvp_err_set(err, KVP_EINVAL, "kv_store: layer %u of a pool of %u", layer, kv->n_layer);
    size_t row = (size_t)kv->n_head_kv * kv->head_dim;
    for (uint32_t t = 0; t < n_tok; t++) {
        uint32_t blk = slot[t] / kv->block_size, s = slot[t] % kv->block_size;
        for (uint32_t h = 0; h < kv->n_head_kv; h++) {
            kv_put_row(kv, blk, layer, 0, h, s, k + t * row + (size_t)h * kv->head_dim);
            kv_put_row(kv, blk, layer, 1, h, s, v + t * row + (size_t)h * kv->head_dim);
        }
    }
    return 0;
}

static int cpu_kv_copy_block(kvp_backend *b, const kvp_kv_pool *kv, uint32_t dst, uint32_t src, kvp_err *err)
{
    (void)b;
    if (dst >= kv->n_blocks || src >= kv->n_blocks)
        return kvp_err_set(err, KVP_EINVAL, "kv_copy_block: block %u to %u in a pool of %u", src, dst, kv->n_blocks);
    uint8_t *base = kv->base;
    if (dst != src)
        memcpy(base + (size_t)dst * kv->block_bytes, base + (size_t)src * kv->block_bytes, kv->block_bytes);
    return 0;
}

/* ---- attention ----
 *
 * Batch invariance: a query's output depends only on its own q, its
 * position and its sequence's keys and values.  Its keys are taken in
 * chunks fixed by absolute position (0 .. C-1, C .. 2C-1, ...; C =
 * KVP_ATT_CHUNK rounded up to whole blocks), each chunk gives a part (the
 * weighted sum of its values against the chunk's own max score, and the
 * weights' sum), and the parts are folded in chunk order by attn_fold.
 * The kernels compute each query lane alone (backend_cpu_kern.h), so it
 * makes no difference which other queries share a run, how many tokens the
 * step holds, the thread count, or whether a run's chunks are computed in
 * turn in one task or in parallel tasks and folded after. */

typedef struct attn_ctx {
    const kvp_attn_args *a;
    const kvp_cpu_kernels *k;
    float *scratch;          /* per thread: see attn_scratch */
    size_t per_thread;
    uint32_t n_head_kv, n_rep;
    uint32_t ldq;            /* query lanes the scratch holds */
    struct attn_runrec *runs; /* the step's runs (attn_plan) */
    uint32_t n_runs;
    uint32_t chunk;          /* C: keys a chunk holds */
    float *parts;            /* split runs: per (run, head, chunk) an attn_part's floats */
    size_t parts_cap;        /* floats parts holds: runs past it are not split */
} attn_ctx;

/* A run: consecutive query tokens of one sequence that go through the
 * kernels together, one task per KV head taking the chunks in turn.  A run
 * of a few tokens over two chunks or more (decode or a verify step over a
 * long context) is split instead: one task per head and chunk, the parts
 * folded after. */
typedef struct attn_runrec {
    uint32_t t0, nt;
    uint32_t n_chunks;       /* split: its chunks; 1: not split */
    uint32_t first_task;     /* its tasks: n_head_kv * n_chunks from here */
    size_t part;             /* split: offset of its parts in c->parts (floats) */
} attn_runrec;

/* Queries a task aims for: the kernels' lanes hold them, and every V block
 * converted to f32 serves all of them. */
#define KVP_ATT_QUERIES 48
#define KVP_ATT_TILE_MAX 48
/* Keys a chunk holds (rounded up to whole blocks). */
#define KVP_ATT_CHUNK 256
/* Tokens a run may hold and still be split by chunks: a verify step's
 * few.  A prompt's runs are tiles of many tokens, tasks enough. */
#define KVP_ATT_SPLIT_RUN 8
/* Query lanes up to which a run reads an f16 or bf16 cache as stored
 * (attn_range), rather than converting each block to f32 first, which
 * wrote 4 KiB a block to read it back: a verify step of up to 8 tokens at
 * 3 query heads a KV head.  SmolLM2 q8_0, 2 threads, AMD EPYC (Zen 4),
 * the two ways in turns in one process: steps of 3-8 tokens 2-5% faster
 * at 600 tokens of context, 5-10% at 2000; at 27-48 lanes (9-16 tokens)
 * no difference either way, so prompts keep their one conversion. */
#define KVP_ATT_DIRECT_LANES 24

static uint32_t attn_lanes(uint32_t nq) { return (nq + 7) & ~7u; }
/* A run's score lanes: a decode token's few query heads (<= 4) take four,
 * so the softmax does not exponentiate lanes no query uses. */
static uint32_t attn_run_lanes(uint32_t nq) { return nq <= 4 ? 4 : attn_lanes(nq); }

/* A task's scratch for ldq query lanes: queries as rows q[ldq][hd], the
 * chunk's scores s[C][ldq] and part o[ldq][hd], the fold so far O[ldq][hd]
 * with its max M and sum L, one K or V block as f32 buf[bs][hd] and its
 * rows' scales vsc[bs] (a draft tree's gathered rows), and per lane its key
 * count lim, the part's max mx and sum. */
typedef struct attn_scratch {
    float *q, *s, *o, *O, *buf, *vsc, *mx, *sum, *M, *L;
    int32_t *lim;
} attn_scratch;

static size_t attn_scratch_floats(uint32_t ldq, uint32_t chunk, uint32_t hd, uint32_t bs)
{
    return (size_t)ldq * (3 * (size_t)hd + chunk + 5) + (size_t)bs * (hd + 1);
}

static attn_scratch attn_scratch_at(const attn_ctx *c, float *base)
{
    uint32_t hd = c->a->kv->head_dim, ldq = c->ldq;
    attn_scratch w;
    w.q = base, w.s = w.q + (size_t)ldq * hd, w.o = w.s + (size_t)c->chunk * ldq, w.O = w.o + (size_t)ldq * hd;
    w.buf = w.O + (size_t)ldq * hd, w.vsc = w.buf + (size_t)c->a->kv->block_size * hd;
    w.mx = w.vsc + c->a->kv->block_size;
    w.sum = w.mx + ldq, w.M = w.sum + ldq, w.L = w.M + ldq, w.lim = (int32_t *)(w.L + ldq);
    return w;
}

/* What the kernels' values of a scaled cache's codes are short of the
 * codes' own (backend_cpu_kern.h): fp8 e4m3 codes read as code / 256. */
static float kv_code_unit(int dtype) { return dtype == KVP_DTYPE_FP8_E4M3 ? 256.0f : 1.0f; }

/* K (which 0) or V (1) rows of block slot range [0, np) of KV head g at
 * table entry blk, as f32: in place for an f32 cache, else converted (a
 * scaled cache's codes unscaled: see scale_rows). */
static const float *attn_block(const attn_ctx *c, const uint32_t *table, uint32_t blk, uint32_t which, uint32_t g,
                               uint32_t np, float *buf)
{
    const kvp_kv_pool *kv = c->a->kv;
    const void *src = (const uint8_t *)kv->base + kv_off(kv, table[blk], c->a->layer, which, g, 0);
    if (kv->dtype == KVP_DTYPE_F32)
        return src;
    c->k->kv_f32(kv->dtype, src, buf, np * kv->head_dim);
    return buf;
}

/* K (which 0) or V (1) rows of block slot range [0, np) of KV head g at
 * table entry blk as the kernels read them without an f32 copy (*dtype
 * set): the cache's own bytes, but an fp8 cache's as f16 in buf (three
 * integer operations a 16 codes, backend_cpu_kern.h, against six a load
 * of 8 read as stored: a 2048-token generation on an fp8 cache ran 7-11%
 * behind f16's). */
static const void *attn_direct(const attn_ctx *c, const uint32_t *table, uint32_t blk, uint32_t which, uint32_t g,
                               uint32_t np, float *buf, int *dtype)
{
    const kvp_kv_pool *kv = c->a->kv;
    const uint8_t *src = (const uint8_t *)kv->base + kv_off(kv, table[blk], c->a->layer, which, g, 0);
    *dtype = kv->dtype;
    if (kv->dtype != KVP_DTYPE_FP8_E4M3)
        return src;
    c->k->kv_f16_e4m3(src, (uint16_t *)buf, np * kv->head_dim);
    *dtype = KVP_DTYPE_F16;
    return buf;
}

/* A scaled cache's row scales, factored out of the sums they scale: key
 * p's scores s[p][0..ldq) times its K scale, and after the softmax, its
 * weights times its V scale.  Every way of reading the codes (direct, as
 * f16, converted to f32 first) gives the same values, so all give the same
 * bits, as for f16.  unit is what the kernels' code values are short of
 * the codes' (256 for fp8: backend_cpu_kern.h); a power of two, so
 * sc * unit is exact and so are the products it scales. */
static void scale_by(const float *restrict sc, float unit, float *restrict s, uint32_t np, uint32_t ldq)
{
    /* sc[p] read once a row: reread after every store (s might have been
     * sc), each product waited on the store before it, and this pass took
     * 6% of an fp8 cache's generation after a 2048-token prompt */
    for (uint32_t p = 0; p < np; p++) {
        const float f = sc[p] * unit;
        float *row = s + (size_t)p * ldq;
        for (uint32_t j = 0; j < ldq; j++)
            row[j] *= f;
    }
}

/* scale_by with the scales of block blk (table entry) of K/V head g. */
static void scale_rows(const attn_ctx *c, const uint32_t *table, uint32_t blk, uint32_t which, uint32_t g, float *s,
                       uint32_t np, uint32_t ldq)
{
    const kvp_kv_pool *kv = c->a->kv;
    if (kvp_kvscale_dtype(kv->dtype))
        scale_by(kv_scales(kv, table[blk], c->a->layer, which, g), kv_code_unit(kv->dtype), s, np, ldq);
}

/* Asks for the K (which 0) or V (1) rows of KV head g in block table[blk]
 * to be brought into the cache.  A head's rows in a block are one run of
 * bs * hd elements, and the next block's run is elsewhere: the hardware's
 * stream prefetcher, which follows one run, has to find each block anew,
 * so a decode over a long context waits on memory for every block.
 * Into L2 (locality 2: prefetcht1), not L1: a block's K and V are 64
 * lines asked for at once, more than a core's L1 misses in flight, and
 * into L1 the core stalled on them.  SmolLM2's heads at 2048 tokens, 30
 * layers, 2 threads (scripts/bench-attn 2048 1 30, AMD EPYC Zen 4): 0.118-
 * 0.126 ms a layer into L1, 0.068-0.076 into L2; 16 sequences of 1024
 * tokens 1.18-1.21 ms, 0.71-0.72.  Inlined: GCC finds a function of
 * nothing but prefetches without effect and drops its calls. */
__attribute__((always_inline)) static inline void attn_prefetch(const attn_ctx *c, const uint32_t *table, uint32_t blk,
                                                                uint32_t which, uint32_t g)
{
    const kvp_kv_pool *kv = c->a->kv;
    const uint8_t *src = (const uint8_t *)kv->base + kv_off(kv, table[blk], c->a->layer, which, g, 0);
    size_t bytes = (size_t)kv->block_size * kv->head_dim * kvp_cpu_kv_esize(kv->dtype);
    for (size_t o = 0; o < bytes; o += 64)
        __builtin_prefetch(src + o, 0, 2);
    /* a scaled cache's row scales sit apart from the rows (kvp(5)): their
     * line too, or scale_rows waits on it once a block */
    if (kvp_kvscale_dtype(kv->dtype))
        __builtin_prefetch(kv_scales(kv, table[blk], c->a->layer, which, g), 0, 2);
}

/* A draft tree's query (kvp_attn_args.parent): where the keys of its
 * path are (kvp_attn_tree_path, which the CUDA kernel walks too).
 * Positions lo..hi (hi its own) are in the slots of positions at[hi - p];
 * those below lo in their own. */
typedef struct attn_path {
    int32_t lo, hi;
    uint32_t n;
    int32_t at[KVP_TREE_MAX_DEPTH];
} attn_path;

static void attn_path_of(const kvp_attn_args *a, uint32_t t, attn_path *pa)
{
    pa->n = kvp_attn_tree_path(a->parent, a->kv_pos, t, pa->at);
    pa->hi = a->pos[t];
    pa->lo = pa->hi - (int32_t)pa->n + 1;
}

/* Rows [p, p + np) of K (which 0) or V (1) of head g along a tree query's
 * path, as f32 in buf[np][hd] (the codes of a scaled cache, their scales
 * in vsc): each row from the slot its position's key is in. */
static void attn_path_block(const attn_ctx *c, const uint32_t *table, const attn_path *pa, uint32_t p, uint32_t np,
                            uint32_t which, uint32_t g, float *buf, float *vsc)
{
    const kvp_kv_pool *kv = c->a->kv;
    uint32_t hd = kv->head_dim, bs = kv->block_size;
    for (uint32_t r = 0; r < np; r++) {
        int32_t q = (int32_t)(p + r);
        uint32_t at = (uint32_t)kvp_attn_tree_slot_pos(pa->at, pa->n, pa->hi, q);
        const void *src = (const uint8_t *)kv->base + kv_off(kv, table[at / bs], c->a->layer, which, g, at % bs);
        if (kv->dtype == KVP_DTYPE_F32)
            memcpy(buf + (size_t)r * hd, src, hd * sizeof(float));
        else
            c->k->kv_f32(kv->dtype, src, buf + (size_t)r * hd, hd);
        if (kvp_kvscale_dtype(kv->dtype))
            vsc[r] = kv_scales(kv, table[at / bs], c->a->layer, which, g)[at % bs];
    }
}

/* scale_rows for gathered rows: their scales in vsc. */
static void scale_path_rows(const attn_ctx *c, const float *vsc, float *s, uint32_t np, uint32_t ldq)
{
    if (kvp_kvscale_dtype(c->a->kv->dtype))
        scale_by(vsc, kv_code_unit(c->a->kv->dtype), s, np, ldq);
}

/* Tokens tok[0..nt) of one sequence against KV head g, over the keys of
 * the chunk [p0, p1) (p0 a multiple of C, p1 - p0 <= C).  Their nq = nt *
 * n_rep query heads go into lanes, so each K and V row serves them all.  A
 * query sees positions 0..pos (causal): later keys are scored but weighted
 * 0, and a query before p0 sees none (mx -inf, sum 0).  Leaves the part in
 * w->o, w->mx, w->sum; returns nq. */
static uint32_t attn_range(const attn_ctx *c, const uint32_t *tok, uint32_t nt, uint32_t g, uint32_t p0, uint32_t p1,
                           const attn_scratch *w)
{
    const kvp_attn_args *a = c->a;
    const kvp_kv_pool *kv = a->kv;
    uint32_t hd = kv->head_dim, bs = kv->block_size, nq = nt * c->n_rep, ldq = attn_run_lanes(nq), n = p1 - p0;
    const uint32_t *table = a->tables + (size_t)a->tok_seq[tok[0]] * a->table_stride;
    for (uint32_t j = 0; j < ldq; j++) {
        int32_t seen = j < nq ? a->pos[tok[j / c->n_rep]] + 1 - (int32_t)p0 : 1; /* keys of the range it sees */
        w->lim[j] = seen > 0 ? seen : 0;
        if (j >= nq)
            continue;
        const float *qj = a->q + ((size_t)tok[j / c->n_rep] * a->n_head + (size_t)g * c->n_rep + j % c->n_rep) * hd;
        for (uint32_t d = 0; d < hd; d++)
            w->q[(size_t)j * hd + d] = qj[d] * a->scale;
    }
    /* A few queries (decode) read each key and value as stored (f16, bf16,
     * fp8, int8); more share one conversion of the block to f32 (the same
     * numbers either way).  The score kernels take queries eight at a time
     * and convert each key as they load it, so up to eight queries (a
     * verify step's few tokens) read keys as stored too; the value tiles
     * load each row once per pair of queries.  The cache is read in its
     * own bytes: no f32 copy of it.  A tree's query (a run of its own)
     * reads the blocks that hold its path gathered, as f32 (the same
     * numbers again).  f16 and bf16 cost one or two operations a load, so
     * up to KVP_ATT_DIRECT_LANES queries read them as stored, and fp8 as
     * an f16 copy of each block (attn_direct). */
    int cheap = kv->dtype == KVP_DTYPE_F16 || kv->dtype == KVP_DTYPE_BF16 || kv->dtype == KVP_DTYPE_FP8_E4M3;
    int convert_k = nq > (cheap ? KVP_ATT_DIRECT_LANES : 8) && kv->dtype != KVP_DTYPE_F32;
    int convert = nq > (cheap ? KVP_ATT_DIRECT_LANES : 4) && kv->dtype != KVP_DTYPE_F32;
    attn_path pa = {.lo = INT32_MAX, .hi = -1};
    if (a->parent)
        attn_path_of(a, tok[0], &pa);
#define ON_PATH(p, np) ((int32_t)((p) + (np)) > pa.lo && (int32_t)(p) <= pa.hi)
    for (uint32_t p = p0; p < p1; p += bs) {
        uint32_t np = p1 - p < bs ? p1 - p : bs;
        float *sp = w->s + (size_t)(p - p0) * ldq;
        if (ON_PATH(p, np)) {
            attn_path_block(c, table, &pa, p, np, 0, g, w->buf, w->vsc);
            c->k->att_scores(w->q, nq, KVP_DTYPE_F32, w->buf, np, hd, sp, ldq);
            scale_path_rows(c, w->vsc, sp, np, ldq);
            continue;
        }
        /* the chunk's first keys at once, each block's successor while it
         * is scored, and its values for the pass after the softmax: every
         * line of a block asked for together, not one miss after another */
        if (p == p0)
            attn_prefetch(c, table, p / bs, 0, g);
        if (p + bs < p1)
            attn_prefetch(c, table, p / bs + 1, 0, g);
        attn_prefetch(c, table, p / bs, 1, g);
        if (convert_k) {
            c->k->att_scores(w->q, nq, KVP_DTYPE_F32, attn_block(c, table, p / bs, 0, g, np, w->buf), np, hd, sp,
                             ldq);
        } else {
            int dt;
            const void *k = attn_direct(c, table, p / bs, 0, g, np, w->buf, &dt);
            c->k->att_scores(w->q, nq, dt, k, np, hd, sp, ldq);
        }
        scale_rows(c, table, p / bs, 0, g, sp, np, ldq);
    }
    c->k->att_softmax(w->s, ldq, n, w->lim, w->mx, w->sum);
    memset(w->o, 0, (size_t)nq * hd * sizeof(float));
    for (uint32_t p = p0; p < p1; p += bs) {
        uint32_t np = p1 - p < bs ? p1 - p : bs;
        float *sp = w->s + (size_t)(p - p0) * ldq;
        if (ON_PATH(p, np)) {
            attn_path_block(c, table, &pa, p, np, 1, g, w->buf, w->vsc);
            scale_path_rows(c, w->vsc, sp, np, ldq);
            c->k->att_values(sp, ldq, nq, KVP_DTYPE_F32, w->buf, np, hd, w->o);
            continue;
        }
        scale_rows(c, table, p / bs, 1, g, sp, np, ldq);
        if (convert) {
            c->k->att_values(sp, ldq, nq, KVP_DTYPE_F32, attn_block(c, table, p / bs, 1, g, np, w->buf), np, hd,
                             w->o);
        } else {
            int dt;
            const void *v = attn_direct(c, table, p / bs, 1, g, np, w->buf, &dt);
            c->k->att_values(sp, ldq, nq, dt, v, np, hd, w->o);
        }
    }
#undef ON_PATH
    return nq;
}

/* Fold one chunk's part (max m, sum l, weighted values o[hd]) of a query
 * into the fold so far (*M, *L, O[hd]), the first chunk's part as it is:
 * both are rescaled to the larger max.  Every query's chunks go through
 * this in chunk order, whichever way they were computed. */
static void attn_fold(float *M, float *L, float *O, float m, float l, const float *o, uint32_t hd, int first)
{
    if (first) {
        *M = m, *L = l;
        memcpy(O, o, hd * sizeof(float));
        return;
    }
    float mn = fmaxf(*M, m), s = expf(*M - mn), t = expf(m - mn);
    *M = mn, *L = *L * s + l * t;
    for (uint32_t d = 0; d < hd; d++)
        O[d] = O[d] * s + o[d] * t;
}

/* The softmax's division, once per output row. */
static void attn_finish(float *dst, const float *O, float L, uint32_t hd)
{
    float inv = 1.0f / L;
    for (uint32_t d = 0; d < hd; d++)
        dst[d] = O[d] * inv;
}

/* Query lane j of head g of the run tok[] in the output. */
static float *attn_out_row(const attn_ctx *c, const uint32_t *tok, uint32_t g, uint32_t j)
{
    const kvp_attn_args *a = c->a;
    return a->out + ((size_t)tok[j / c->n_rep] * a->n_head + (size_t)g * c->n_rep + j % c->n_rep) * a->kv->head_dim;
}

/* The whole run over all its chunks in turn. */
static void attn_run(const attn_ctx *c, const uint32_t *tok, uint32_t nt, uint32_t g, const attn_scratch *w)
{
    const kvp_attn_args *a = c->a;
    uint32_t hd = a->kv->head_dim, n_pos = 0, nq = nt * c->n_rep;
    for (uint32_t i = 0; i < nt; i++)
        n_pos = (uint32_t)a->pos[tok[i]] + 1 > n_pos ? (uint32_t)a->pos[tok[i]] + 1 : n_pos;
    for (uint32_t p0 = 0; p0 < n_pos; p0 += c->chunk) {
        attn_range(c, tok, nt, g, p0, p0 + c->chunk < n_pos ? p0 + c->chunk : n_pos, w);
        for (uint32_t j = 0; j < nq; j++)
            if ((uint32_t)a->pos[tok[j / c->n_rep]] >= p0)
                attn_fold(&w->M[j], &w->L[j], w->O + (size_t)j * hd, w->mx[j], w->sum[j], w->o + (size_t)j * hd, hd,
                          p0 == 0);
    }
    for (uint32_t j = 0; j < nq; j++)
        attn_finish(attn_out_row(c, tok, g, j), w->O + (size_t)j * hd, w->L[j], hd);
}

/* Floats of one (run, head, chunk) part of a split run of nt tokens: o
 * [nt * n_rep][hd], mx and sum. */
static size_t attn_part_floats(const attn_ctx *c, uint32_t nt)
{
    return (size_t)nt * c->n_rep * (c->a->kv->head_dim + 2);
}

/* Keys the run's last token sees: its tokens' positions rise. */
static uint32_t attn_run_pos(const int32_t *pos, uint32_t t0, uint32_t nt)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < nt; i++)
        n = (uint32_t)pos[t0 + i] + 1 > n ? (uint32_t)pos[t0 + i] + 1 : n;
    return n;
}

/* Task i: the run holding it (binary search on first_task), its head, and
 * for a split run its chunk. */
static void attn_task(void *ctxp, int task, int thread)
{
    attn_ctx *c = ctxp;
    uint32_t lo = 0, hi = c->n_runs - 1, i = (uint32_t)task;
    while (lo < hi) {
        uint32_t mid = (lo + hi + 1) / 2;
        if (c->runs[mid].first_task <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    const attn_runrec *r = &c->runs[lo];
    uint32_t k = i - r->first_task, g = k / r->n_chunks, ch = k % r->n_chunks, hd = c->a->kv->head_dim;
    uint32_t tok[KVP_ATT_TILE_MAX];
    for (uint32_t j = 0; j < r->nt; j++)
        tok[j] = r->t0 + j;
    attn_scratch w = attn_scratch_at(c, c->scratch + (size_t)thread * c->per_thread);
    if (r->n_chunks == 1) {
        attn_run(c, tok, r->nt, g, &w);
        return;
    }
    uint32_t n_pos = attn_run_pos(c->a->pos, r->t0, r->nt), p0 = ch * c->chunk;
    uint32_t nq = attn_range(c, tok, r->nt, g, p0, p0 + c->chunk < n_pos ? p0 + c->chunk : n_pos, &w);
    float *dst = c->parts + r->part + (size_t)k * attn_part_floats(c, r->nt);
    memcpy(dst, w.o, (size_t)nq * hd * sizeof(float));
    memcpy(dst + (size_t)nq * hd, w.mx, nq * sizeof(float));
    memcpy(dst + (size_t)nq * (hd + 1), w.sum, nq * sizeof(float));
}

/* A split run, after its tasks: each query's parts folded in chunk order
 * into its output row, up to the chunk holding its own position (as
 * attn_run folds them). */
static void attn_merge(const attn_ctx *c, const attn_runrec *r)
{
    uint32_t hd = c->a->kv->head_dim, nq = r->nt * c->n_rep, tok[KVP_ATT_TILE_MAX];
    size_t pf = attn_part_floats(c, r->nt);
    for (uint32_t j = 0; j < r->nt; j++)
        tok[j] = r->t0 + j;
    for (uint32_t g = 0; g < c->n_head_kv; g++)
        for (uint32_t j = 0; j < nq; j++) {
            const float *base = c->parts + r->part + (size_t)g * r->n_chunks * pf;
            float M = 0, L = 0, *dst = attn_out_row(c, tok, g, j);
            uint32_t seen = (uint32_t)c->a->pos[tok[j / c->n_rep]] / c->chunk + 1; /* chunks it sees */
            for (uint32_t ch = 0; ch < seen; ch++) {
                const float *part = base + ch * pf;
                attn_fold(&M, &L, dst, part[(size_t)nq * hd + j], part[(size_t)nq * (hd + 1) + j],
                          part + (size_t)j * hd, hd, ch == 0);
            }
            attn_finish(dst, dst, L, hd);
        }
}

/* The runs of the step (from the host copies of pos and tok_seq): tiles
 * of `tile` tokens, cut where the sequence changes; sets their tasks and
 * parts.  A run is split only while the reserved parts hold it (either way
 * gives the same bits).  Returns the task count; *parts the floats the
 * split runs use. */
static uint32_t attn_plan(attn_ctx *c, uint32_t tile, size_t *parts)
{
    const kvp_attn_args *a = c->a;
    uint32_t n = 0, tasks = 0;
    *parts = 0;
    for (uint32_t t = 0; t < a->n_tok;) {
        /* a tree's tokens each see their own path: a run apiece */
        uint32_t end = a->host_parent ? t + 1 : t + tile < a->n_tok ? t + tile : a->n_tok, u = t + 1;
        while (u < end && a->host_tok_seq[u] == a->host_tok_seq[t])
            u++;
        /* five to eight query lanes (a verify step's two tokens at n_rep
         * 3) go as runs of the few-query kernels' four: the eight-lane ones
         * cost more a query there */
        if ((u - t) * c->n_rep > 4 && (u - t) * c->n_rep <= 8)
            u = t + (c->n_rep <= 4 ? 4 / c->n_rep : 1);
        attn_runrec *r = &c->runs[n++];
        uint32_t n_pos = attn_run_pos(a->host_pos, t, u - t), n_chunks = (n_pos + c->chunk - 1) / c->chunk;
        size_t need = (size_t)c->n_head_kv * n_chunks * attn_part_floats(c, u - t);
        r->t0 = t, r->nt = u - t, r->first_task = tasks, r->part = *parts;
        r->n_chunks = r->nt <= KVP_ATT_SPLIT_RUN && n_pos >= 2 * c->chunk && *parts + need <= c->parts_cap ? n_chunks
                                                                                                           : 1;
        tasks += c->n_head_kv * r->n_chunks;
        if (r->n_chunks > 1)
            *parts += need;
        t = u;
    }
    c->n_runs = n;
    return tasks;
}

/* Attention's chunk C for a pool of block_size bs: KVP_ATT_CHUNK in whole blocks. */
static uint32_t attn_chunk(uint32_t bs) { return (KVP_ATT_CHUNK + bs - 1) / bs * bs; }

/* The widest query lanes a task takes with n_rep query heads a KV head. */
static uint32_t attn_max_lanes(uint32_t n_rep)
{
    return attn_lanes(n_rep >= KVP_ATT_QUERIES ? n_rep : KVP_ATT_QUERIES / n_rep * n_rep);
}

/* Decode steps that split long contexts across threads: the parts
 * reserved hold this many such tokens (past it, the rest run unsplit). */
#define KVP_ATT_SPLIT_TOKENS 256

static int attn_beyond(const kvp_attn_args *a, uint32_t res_tok, kvp_err *err)
{
    return kvp_err_set(err, KVP_ELIMIT, "attention: %u queries over heads of %u are beyond the scratch reserved "
                       "(%u tokens)", a->n_tok, a->kv->head_dim, res_tok);
}

static int cpu_attention(kvp_backend *b, const kvp_attn_args *a, kvp_err *err)
{
    cpu_impl *im = impl_of(b);
    attn_ctx c = {.a = a, .k = im->k, .n_head_kv = a->kv->n_head_kv};
    uint32_t bs = a->kv->block_size;
    if (!c.n_head_kv || a->n_head % c.n_head_kv)
        return kvp_err_set(err, KVP_EINVAL, "attention: %u query heads over %u KV heads", a->n_head, c.n_head_kv);
    c.n_rep = a->n_head / c.n_head_kv;
    c.chunk = attn_chunk(bs);
    if (a->n_tok > im->res_tok) /* the runs hold one a token at most */
        return attn_beyond(a, im->res_tok, err);
    c.runs = im->runs;
    c.parts = im->parts;
    c.parts_cap = im->parts_size / sizeof(float);
    /* Tokens per tile: KVP_ATT_QUERIES queries, fewer while that leaves
     * under two tasks a thread, counting a split run's chunks (a query's
     * numbers do not depend on its tile: the lanes are independent). */
    uint32_t tile = c.n_rep >= KVP_ATT_QUERIES ? 1 : KVP_ATT_QUERIES / c.n_rep, n_tasks;
    size_t parts;
    while ((n_tasks = attn_plan(&c, tile, &parts)) < 2 * (uint32_t)im->n_threads && tile > 1)
        tile = (tile + 1) / 2;
    c.ldq = attn_lanes(tile * c.n_rep);
    size_t need = attn_scratch_floats(c.ldq, c.chunk, a->kv->head_dim, bs);
    if (need > im->att_per_thread)
        return attn_beyond(a, im->res_tok, err);
    c.scratch = im->att;
    c.per_thread = im->att_per_thread;
    kvp_threadpool_run(im->pool, attn_task, &c, (int)n_tasks);
    for (uint32_t i = 0; parts && i < c.n_runs; i++)
        if (c.runs[i].n_chunks > 1)
            attn_merge(&c, &c.runs[i]);
    return 0;
}

/* Grow *p to need bytes; KVP_ENOMEM naming what when it cannot. */
static int reserve_one(void **p, size_t *have, size_t need, const char *what, kvp_err *err)
{
    if (grow(p, have, need ? need : 1))
        return 0;
    return kvp_err_set(err, KVP_ENOMEM, "cpu backend: out of memory for %zu bytes of %s", need, what);
}

/* Scratch for the largest step to come: every buffer an op uses, sized
 * here so the ops never allocate (backend.h). */
static int cpu_reserve(kvp_backend *b, const kvp_backend_reserve *r, kvp_err *err)
{
    cpu_impl *im = impl_of(b);
    uint32_t nt = r->max_tok > im->res_tok ? r->max_tok : im->res_tok;
    uint32_t n_in = r->max_n_in > im->res_n_in ? r->max_n_in : im->res_n_in;
    uint32_t ctx = r->max_ctx > im->res_ctx ? r->max_ctx : im->res_ctx;
    uint32_t nb = (n_in + KVP_QK - 1) / KVP_QK, nth = (uint32_t)im->n_threads;
    /* the larger of the two tilings a step may take */
    size_t tiles = kvp_q8_tile_bytes(im->k->tile_tok, nb) * ((nt + im->k->tile_tok - 1) / im->k->tile_tok);
    size_t amx_tiles = kvp_q8_tile_bytes(KVP_AMX_TOK, nb) * ((nt + KVP_AMX_TOK - 1) / KVP_AMX_TOK);
    int rc;
    size_t f_tiles = kvp_f32_tile_bytes(im->k->tile_tok, n_in) * ((nt + im->k->tile_tok - 1) / im->k->tile_tok);
    if (im->k->amx_min_tok && amx_tiles > tiles)
        tiles = amx_tiles;
    if (im->k->float_tile && f_tiles > tiles)
        tiles = f_tiles;
    /* each thread's own: a group's tokens (mm_own_quant), whole lines apiece */
    size_t own = ((size_t)KVP_QOWN_HEAD + (size_t)im->k->tile_tok * nb * sizeof(kvp_q8blk) + 63) & ~(size_t)63;
    if (nth > 1 && own > im->qown_stride) {
        if ((rc = reserve_one(&im->qown, &im->qown_size, own * nth, "activations (per thread)", err)) < 0) {
            im->qown_stride = 0;
            return rc;
        }
        im->qown_stride = own;
        for (uint32_t t = 0; t < nth; t++) /* no preparation yet: stamps no qrun will equal */
            *(uint64_t *)(void *)((uint8_t *)im->qown + (size_t)t * own) = UINT64_MAX;
    }
    if ((rc = reserve_one(&im->qbuf, &im->qbuf_size, (size_t)nt * nb * sizeof(kvp_q8blk), "activations", err)) < 0 ||
        (rc = reserve_one(&im->tiles, &im->tiles_size, tiles, "activation tiles", err)) < 0 ||
        (rc = reserve_one(&im->runs, &im->runs_size, (size_t)nt * sizeof(attn_runrec), "attention runs", err)) < 0)
        return rc;
    im->res_tok = nt, im->res_n_in = n_in;
    const kvp_kv_pool *kv = r->kv;
    if (!kv || !kv->n_head_kv || !r->n_head)
        return 0;
    uint32_t n_rep = r->n_head / kv->n_head_kv, chunk = attn_chunk(kv->block_size);
    size_t per = attn_scratch_floats(attn_max_lanes(n_rep ? n_rep : 1), chunk, kv->head_dim, kv->block_size);
    if (per > im->att_per_thread) {
        void *p = im->att;
        size_t have = im->att_per_thread * nth * sizeof(float);
        if ((rc = reserve_one(&p, &have, per * nth * sizeof(float), "attention scratch", err)) < 0) {
            im->att = NULL, im->att_per_thread = 0; /* grow freed the old one */
            return rc;
        }
        im->att = p, im->att_per_thread = per;
    }
    /* Split decode tokens: each of up to KVP_ATT_SPLIT_TOKENS keeps a part
     * per KV head and chunk of the longest context. */
    size_t split = nt < KVP_ATT_SPLIT_TOKENS ? nt : KVP_ATT_SPLIT_TOKENS;
    size_t part = (size_t)n_rep * (kv->head_dim + 2);
    size_t parts = ctx >= 2 * chunk ? split * kv->n_head_kv * ((ctx + chunk - 1) / chunk) * part : 0;
    if (parts && (rc = reserve_one(&im->parts, &im->parts_size, parts * sizeof(float), "attention parts", err)) < 0)
        return rc;
    im->res_ctx = ctx;
    return 0;
}

/* ---- create / destroy ---- */

static void cpu_destroy(kvp_backend *b)
{
    cpu_impl *im = impl_of(b);
    if (im) {
        kvp_threadpool_free(im->pool);
        free(im->qbuf);
        free(im->qown);
        free(im->att);
        free(im->parts);
        free(im->runs);
        free(im->tiles);
        free(im->rowbuf);
        free(im);
    }
    free(b);
}

/* ---- tensor parallelism: host memory, so MPI reads it directly ---- */

static int cpu_all_reduce(kvp_backend *b, struct kvp_comm *comm, float *x, size_t n, kvp_err *err)
{
    (void)b;
    return kvp_comm_allreduce_f32(comm, x, n, err);
}

static int cpu_all_gather(kvp_backend *b, struct kvp_comm *comm, const float *send, float *recv, size_t n,
                          kvp_err *err)
{
    (void)b;
    return kvp_comm_allgather(comm, send, recv, n * sizeof(float), err);
}

static const kvp_backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .supports = cpu_supports,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .to_host = cpu_copy,
    .from_host = cpu_copy,
    .synchronize = cpu_synchronize,
    .reserve = cpu_reserve,
    .prepare_weight = cpu_prepare_weight,
    .release_weight = cpu_release_weight,
    .matmul = cpu_matmul,
    .matmul_n = cpu_matmul_n,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .add_bias = cpu_add_bias,
    .add = cpu_add,
    .silu_mul = cpu_silu_mul,
    .gather_rows = cpu_gather_rows,
    .argmax_rows = cpu_argmax_rows,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .kv_copy_block = cpu_kv_copy_block,
    .all_reduce = cpu_all_reduce,
    .all_gather = cpu_all_gather,
};

int kvp_backend_cpu_create(kvp_backend **out, int n_threads, unsigned flags, kvp_err *err)
{
    *out = NULL;
    kvp_backend *b = calloc(1, sizeof *b);
    cpu_impl *im = calloc(1, sizeof *im);
    if (!b || !im) {
        free(b);
        free(im);
        return kvp_err_set(err, KVP_ENOMEM, "cpu backend: out of memory");
    }
    b->ops = &cpu_ops;
    b->impl = im;
    im->k = NULL;
    if (!(flags & (KVP_CPU_PORTABLE | KVP_CPU_NO_VNNI | KVP_CPU_NO_AMX)))
        im->k = kvp_cpu_kernels_amx();
    if (!im->k && !(flags & KVP_CPU_PORTABLE) && !(flags & KVP_CPU_NO_VNNI))
        im->k = kvp_cpu_kernels_vnni();
    if (!im->k && !(flags & KVP_CPU_PORTABLE))
        im->k = kvp_cpu_kernels_avx2();
    if (!im->k)
        im->k = &kvp_cpu_kernels_portable;
    int rc = kvp_threadpool_create(&im->pool, n_threads, err);
    if (rc < 0) {
        cpu_destroy(b);
        return rc;
    }
    im->n_threads = kvp_threadpool_size(im->pool);
    im->r16 = im->k->mm_r16[0] && !(flags & KVP_CPU_AS_STORED);
    *out = b;
    return 0;
}

const char *kvp_backend_cpu_isa(const kvp_backend *b)
{
    return b && b->ops == &cpu_ops ? ((const cpu_impl *)b->impl)->k->isa : "?";
}

int kvp_backend_cpu_threads(const kvp_backend *b)
{
    return b && b->ops == &cpu_ops ? ((const cpu_impl *)b->impl)->n_threads : 0;
}
