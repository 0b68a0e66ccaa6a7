/* test_engine.c - the forward pass: kernels against each other, a tiny random
 * model against a naive dense forward written here, batching, chunking and
 * prefix sharing invariants, and SmolLM2 against llama.cpp's golden logits
 * (tests/golden/engine_smollm2.txt, scripts/ref/gen_engine.py). */
#include "rig.h"
#include "unit.h"
#include "backend.h"
#include "backend_cpu.h"
#include "backend_cpu_kern.h"
#include "convert.h"
#include "draftmodel.h"
#include "quant.h"
#include "argmax.h"
#include "engine.h"
#include "ggml_quants.h"
#include "gguf.h"
#include "minifloat.h"
#include "seqio.h"
#include "shard.h"
#include "tensor.h"
#include "wire.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- deterministic random numbers ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) { return unit_frand(&rng_state); } /* uniform in [-1, 1) */

/* ---- quantizers for the test weights (the simple round-to-nearest ones) ---- */

static void quant_row(int dtype, const float *x, uint8_t *out, uint32_t n)
{
    for (uint32_t b = 0; b < n / 32; b++) {
        const float *v = x + b * 32;
        if (dtype == KVP_DTYPE_Q8_0) {
            float amax = 0;
            for (int j = 0; j < 32; j++)
                amax = fmaxf(amax, fabsf(v[j]));
            float d = amax / 127;
            kvp_put16(out, kvp_f32_to_f16(d));
            for (int j = 0; j < 32; j++)
                out[2 + j] = (uint8_t)(int8_t)lrintf(d ? v[j] / d : 0);
            out += 34;
        } else { /* Q4_1 or Q4_0 */
            float mn = v[0], mx = v[0];
            for (int j = 1; j < 32; j++)
                mn = fminf(mn, v[j]), mx = fmaxf(mx, v[j]);
            float d, m;
            int hdr;
            if (dtype == KVP_DTYPE_Q4_1) {
                d = (mx - mn) / 15, m = mn, hdr = 4;
                kvp_put16(out, kvp_f32_to_f16(d));
                kvp_put16(out + 2, kvp_f32_to_f16(m));
            } else {
                float amax = fmaxf(fabsf(mn), fabsf(mx));
                d = amax / 8, m = -8 * d, hdr = 2;
                kvp_put16(out, kvp_f32_to_f16(d));
            }
            d = kvp_f16_to_f32(kvp_f32_to_f16(d));
            m = dtype == KVP_DTYPE_Q4_1 ? kvp_f16_to_f32(kvp_f32_to_f16(m)) : -8 * d;
            for (int j = 0; j < 16; j++) {
                int lo = d ? (int)lrintf((v[j] - m) / d) : 0, hi = d ? (int)lrintf((v[j + 16] - m) / d) : 0;
                lo = lo < 0 ? 0 : lo > 15 ? 15 : lo;
                hi = hi < 0 ? 0 : hi > 15 ? 15 : hi;
                out[hdr + j] = (uint8_t)(lo | hi << 4);
            }
            out += hdr + 16;
        }
    }
}

/* A row of random K-quant super-blocks (256 elements): random quants and
 * sub-block scales, the f16 super-block scales set so that the values are
 * of the order of 0.5; IQ4_NL's blocks of 32 (and IQ4_XS's super-blocks)
 * likewise. */
static void kquant_row(int dtype, uint8_t *out, size_t bytes)
{
    for (size_t i = 0; i < bytes; i++)
        out[i] = (uint8_t)((frand() + 1) * 128);
    if (dtype == KVP_DTYPE_Q4_K || dtype == KVP_DTYPE_Q5_K) /* d, dmin, scales[12], (Q5_K: qh[32],) qs[128]: d * sc * q - dmin * m */
        for (size_t o = 0; o < bytes; o += dtype == KVP_DTYPE_Q4_K ? 144 : 176) {
            kvp_put16(out + o, kvp_f32_to_f16(0.001f));
            kvp_put16(out + o + 2, kvp_f32_to_f16(0.004f));
        }
    else if (dtype == KVP_DTYPE_Q2_K) /* scales[16] (4 | 4 bits), qs[64], d, dmin: d * sc * q - dmin * m */
        for (size_t o = 0; o < bytes; o += 84) {
            kvp_put16(out + o + 80, kvp_f32_to_f16(0.01f));
            kvp_put16(out + o + 82, kvp_f32_to_f16(0.01f));
        }
    else if (dtype == KVP_DTYPE_Q3_K) /* hmask[32], qs[64], scales[12], d: d * (sc - 32) * (q - 4) */
        for (size_t o = 0; o < bytes; o += 110)
            kvp_put16(out + o + 108, kvp_f32_to_f16(0.004f));
    else if (dtype == KVP_DTYPE_IQ4_NL) /* d, qs[16]: d * v[q], |v| up to 127 */
        for (size_t o = 0; o < bytes; o += 18)
            kvp_put16(out + o, kvp_f32_to_f16(0.008f));
    else if (dtype == KVP_DTYPE_IQ4_XS) /* d, scales_h, scales_l[4], qs[128]: d * (ls - 32) * v[q] */
        for (size_t o = 0; o < bytes; o += 136)
            kvp_put16(out + o, kvp_f32_to_f16(0.0006f));
    else /* Q6_K: ql[128], qh[64], scales[16] (i8), d: d * sc * (q - 32) */
        for (size_t o = 0; o < bytes; o += 210)
            kvp_put16(out + o + 208, kvp_f32_to_f16(1e-4f));
}

/* ---- kernels: AVX2 against portable ---- */

/* The attention, softmax and SiLU kernels of a fast table against the
 * portable ones, on shapes that reach every tile and tail: queries 1 to 5,
 * 7, 11 and 15 (groups of four and of eight, padded or overlapping the
 * group before), keys 19 (pairs and one alone), head dims 64 (the 512-bit
 * kernels' constant), 80 (32- and 8-wide parts) and 70 (a scalar tail);
 * and the per-query and per-element results the same bits wherever they
 * sit. */
static void test_att_kernels(const kvp_cpu_kernels *ref, const kvp_cpu_kernels *fast)
{
    enum { HD = 80, NP = 19, LDQ = 24 };
    static float qt[HD * LDQ], k[NP * HD], sa[NP * LDQ], sb[NP * LDQ], oa[LDQ * HD], ob[LDQ * HD];
    static uint16_t h[NP * HD];
    for (int i = 0; i < HD * LDQ; i++)
        qt[i] = frand();
    for (int i = 0; i < NP * HD; i++)
        h[i] = kvp_f32_to_f16(frand()), k[i] = kvp_f16_to_f32(h[i]);
    float kf[NP * HD];
    fast->kv_f32(KVP_DTYPE_F16, h, kf, NP * HD - 3);
    CHECK(memcmp(kf, k, (NP * HD - 3) * sizeof(float)) == 0);
    /* a scaled cache's bytes (every fp8 code but NaN, every int8) as their
     * codes' values (fp8's / 256): the same bits from both kernel sets, a
     * tail included; fp8 as f16 bits, those values again */
    static uint8_t b8[259];
    float fa[259], fb[259];
    for (int dt = 0; dt < 2; dt++) {
        int dtype = dt ? KVP_DTYPE_I8 : KVP_DTYPE_FP8_E4M3;
        for (int i = 0; i < 259; i++)
            b8[i] = (uint8_t)(dt || (i & 0x7f) != 0x7f ? i : 0);
        ref->kv_f32(dtype, b8, fa, 259);
        fast->kv_f32(dtype, b8, fb, 259);
        CHECK_MSG(memcmp(fa, fb, sizeof fa) == 0, "%s: scaled %s rows differ", fast->isa,
                  kvp_dtype_name((uint32_t)dtype));
        CHECK_NEAR(fa[dt ? 255 : 0x7e], dt ? -1.0f : 448.0f / 256, 0);
        CHECK_NEAR(fa[dt ? 1 : 0x01], dt ? 1.0f : 0x1p-9f / 256, 0); /* fp8's least subnormal */
        if (dt)
            continue;
        uint16_t ha[259], hb16[259];
        ref->kv_f16_e4m3(b8, ha, 259);
        fast->kv_f16_e4m3(b8, hb16, 259);
        int off = memcmp(ha, hb16, sizeof ha) != 0;
        for (int i = 0; i < 259; i++)
            off += memcmp(&(float){kvp_f16_to_f32(hb16[i])}, &fa[i], sizeof(float)) != 0;
        CHECK_MSG(off == 0, "%s: fp8 codes as f16: %d differ", fast->isa, off);
    }
    /* scores: queries as rows against keys as stored (f16, f32, bf16, and
     * the codes of fp8 and int8 unscaled), head dims with and without a
     * tail; each query's scores the same bits alone as among others,
     * whatever the key's dtype as stored */
    static uint16_t hb[NP * HD];
    static uint8_t k8[NP * HD], ki[NP * HD];
    static float s1[NP * 8], kc[NP * HD];
    for (int i = 0; i < NP * HD; i++) {
        hb[i] = kvp_f32_to_bf16(k[i]);
        k8[i] = kvp_f32_to_e4m3_sat(k[i] * 300.0f);
        ki[i] = (uint8_t)kvp_f32_to_i8(k[i] * 127.0f);
    }
    const int kdt[5] = {KVP_DTYPE_F16, KVP_DTYPE_F32, KVP_DTYPE_BF16, KVP_DTYPE_FP8_E4M3, KVP_DTYPE_I8};
    const void *kks[5] = {h, k, hb, k8, ki};
    const double kmag[5] = {1, 1, 1, 300.0 / 256, 127}; /* the keys' scale: fp8 (/ 256) and int8 codes */
    for (uint32_t nq = 1; nq <= 15; nq += nq < 5 ? 1 : nq < 11 ? 2 + 2 * (nq == 7) : 4)
        for (uint32_t hd = 64; hd <= HD; hd = hd == 64 ? 70 : hd + 10)
            for (int dt = 0; dt < 5; dt++) {
                int dtype = kdt[dt];
                const void *kk = kks[dt];
                uint32_t ldq = nq <= 8 ? 8 : LDQ;
                for (uint32_t i = 0; i < NP * ldq; i++)
                    sa[i] = sb[i] = 99.0f; /* every lane must be written */
                ref->att_scores(qt, nq, dtype, kk, NP, hd, sa, ldq);
                fast->att_scores(qt, nq, dtype, kk, NP, hd, sb, ldq);
                double worst = 0;
                int unset = 0, moved = 0;
                for (uint32_t i = 0; i < NP * ldq; i++) {
                    worst = fmax(worst, fabs(sa[i] - sb[i]) / kmag[dt]);
                    unset += i % ldq >= nq && sb[i] != 0.0f;
                }
                for (uint32_t j = 0; j < nq; j++) {
                    fast->att_scores(qt + j * hd, 1, dtype, kk, NP, hd, s1, 8);
                    for (uint32_t p = 0; p < NP; p++)
                        moved += memcmp(&s1[p * 8], &sb[p * ldq + j], sizeof(float)) != 0;
                }
                if (dt != 1 && dt != 2) { /* keys read as stored or converted: the same bits */
                    fast->kv_f32(dtype, kk, kc, NP * HD);
                    fast->att_scores(qt, nq, KVP_DTYPE_F32, kc, NP, hd, sa, ldq);
                    moved += memcmp(sa, sb, NP * ldq * sizeof(float)) != 0;
                }
                CHECK_MSG(worst < 1e-4 && unset == 0 && moved == 0, "att_scores nq %u hd %u dtype %d: max difference "
                          "%g, %d padding lanes not 0, %d scores other bits alone", nq, hd, dtype, worst, unset, moved);
            }
    /* softmax: lane j sees lim[j] keys; scores spread over [-60, 20] */
    int32_t lim[LDQ];
    float mxa[LDQ], mxb[LDQ], suma[LDQ], sumb[LDQ];
    for (int j = 0; j < LDQ; j++)
        lim[j] = j == 3 ? 0 : 1 + (j * 7) % NP; /* lane 3 sees no key */
    for (int i = 0; i < NP * LDQ; i++)
        sa[i] = sb[i] = 40.0f * frand() - 20.0f - (i % 5 == 0 ? 40.0f : 0.0f);
    ref->att_softmax(sa, LDQ, NP, lim, mxa, suma);
    fast->att_softmax(sb, LDQ, NP, lim, mxb, sumb);
    int bad = 0;
    for (int p = 0; p < NP; p++)
        for (int j = 0; j < LDQ; j++) {
            float a = sa[p * LDQ + j], b = sb[p * LDQ + j];
            bad += p >= lim[j] ? b != 0.0f : fabsf(a - b) > 4e-7f * a + 1e-37f;
        }
    CHECK_MSG(bad == 0, "att_softmax: %d of %d weights differ", bad, NP * LDQ);
    for (int j = 0; j < LDQ; j++)
        CHECK(mxa[j] == mxb[j] && fabsf(suma[j] - sumb[j]) <= 1e-5f * suma[j]);
    /* values read as stored (each dtype) or converted first: the same bits */
    static float oc[LDQ * HD];
    for (uint32_t nq = 5; nq <= 15; nq += 10)
        for (uint32_t hd = 64; hd <= HD; hd = hd == 64 ? 70 : hd + 10)
            for (int dt = 0; dt < 5; dt++) {
                for (uint32_t i = 0; i < LDQ * HD; i++)
                    oa[i] = ob[i] = oc[i] = frand();
                ref->att_values(sa, LDQ, nq, kdt[dt], kks[dt], NP, hd, oa);
                fast->att_values(sa, LDQ, nq, kdt[dt], kks[dt], NP, hd, ob);
                fast->kv_f32(kdt[dt], kks[dt], kc, NP * HD);
                fast->att_values(sa, LDQ, nq, KVP_DTYPE_F32, kc, NP, hd, oc);
                double worst = 0;
                for (uint32_t i = 0; i < LDQ * HD; i++)
                    worst = fmax(worst, fabs(oa[i] - ob[i]) / kmag[dt]);
                CHECK_MSG(worst < 1e-5, "att_values hd %u dtype %d: max difference %g", hd, kdt[dt], worst);
                CHECK_MSG(memcmp(ob, oc, sizeof ob) == 0, "att_values hd %u dtype %d: direct and converted differ", hd,
                          kdt[dt]);
            }
    /* SiLU over its whole range, the exp clamps included */
    enum { NS = 1003 };
    static float ga[NS], gb[NS], u[NS];
    for (int i = 0; i < NS; i++)
        ga[i] = gb[i] = (float)(i - NS / 2) * 0.25f, u[i] = frand();
    ga[0] = gb[0] = -1000.0f, ga[1] = gb[1] = 1000.0f;
    ref->silu_mul(ga, u, NS);
    fast->silu_mul(gb, u, NS);
    bad = 0;
    for (int i = 0; i < NS; i++)
        bad += !(fabsf(ga[i] - gb[i]) <= 1e-6f * fabsf(ga[i]) + 1e-30f);
    CHECK_MSG(bad == 0, "silu_mul: %d of %d values differ", bad, NS);
    bad = 0;
    for (int i = 0; i < NS; i += 7) { /* alone, each is the tail: the same bits as in the body */
        float g1 = (float)(i - NS / 2) * 0.25f;
        fast->silu_mul(&g1, &u[i], 1);
        bad += i > 1 && memcmp(&g1, &gb[i], sizeof g1) != 0;
    }
    CHECK_MSG(bad == 0, "silu_mul: %d values other bits alone", bad);
}

/* A matmul of up to KERN_ROWS rows through table k the way the backend
 * runs it: rows w (nr, stride bytes apart) by tokens x[nt] (nt <=
 * tile_tok), quantized by k and put into a tile when nt > few_tok, with
 * the block sums of a table that flips its tiles (Q8_0, i8) only then (as
 * the backend passes them: the rows of a few tokens get none), the rows
 * cut into the pieces the backend cuts (few_rows for a few tokens of a
 * quantized kind, else KVP_MM_ROWS); y[t * ldy + r]. */
enum { KERN_ROWS = 24 };
typedef struct kern_w {
    int dtype;
    const uint8_t *w;
    size_t stride;
    const float *sc, *zp;    /* scaled kinds */
    size_t sc_stride;
    uint32_t g, n;
} kern_w;

static void kern_mm(const kvp_cpu_kernels *k, const kern_w *kw, uint32_t nr, const float *const *x, uint32_t nt,
                    float *y, size_t ldy)
{
    enum { NBMAX = 80 };
    static kvp_q8blk xq[KVP_MM_TILE][NBMAX];
    static _Alignas(32) int8_t xt[NBMAX * KVP_MM_TILE * 32];
    static float dxs[NBMAX * KVP_Q8_SCALES];
    static int32_t ws[KERN_ROWS * NBMAX];
    uint32_t nb = kw->n / 32, T = k->tile_tok;
    int dt = kw->dtype, quant = dt == KVP_DTYPE_Q4_0 || dt == KVP_DTYPE_Q4_1 || dt == KVP_DTYPE_Q8_0 ||
                                dt == KVP_DTYPE_I8 || dt == KVP_DTYPE_I4;
    int flip = k->tile_flip && (dt == KVP_DTYPE_Q8_0 || dt == KVP_DTYPE_I8);
    const kvp_q8blk *xp[KVP_MM_TILE];
    kvp_mm_blk b = {.w = kw->w, .w_stride = kw->stride, .sc = kw->sc, .zp = kw->zp, .sc_stride = kw->sc_stride,
                    .g = kw->g, .xf = x, .n = kw->n, .nr = nr, .nt = nt, .y = y, .ldy = ldy};
    if (nb > NBMAX || nt > T || nr > KERN_ROWS) {
        CHECK(0);
        return;
    }
    if (quant) {
        memset(xt, 0, sizeof xt);
        for (uint32_t t = 0; t < nt; t++) {
            k->quant_q8(x[t], xq[t], kw->n);
            xp[t] = xq[t];
            if (nt > k->few_tok)
                kvp_cpu_q8_tile_put(xq[t], t, T, nb, k->tile_unit, flip, xt, dxs);
        }
        b.xq = xp;
        if (nt > k->few_tok)
            b.xt = xt, b.dxs = dxs;
        if (flip && nt > k->few_tok) {
            for (uint32_t r = 0; r < nr; r++)
                k->wsum(kw->w + r * kw->stride + (dt == KVP_DTYPE_Q8_0 ? 2 : 0), dt == KVP_DTYPE_Q8_0 ? 34 : 32, nb,
                        ws + r * nb);
            b.wsum = ws;
        }
    }
    kvp_mm_fn f = dt == KVP_DTYPE_Q4_0 ? k->mm_q4_0 : dt == KVP_DTYPE_Q4_1 ? k->mm_q4_1 : dt == KVP_DTYPE_Q8_0
                  ? k->mm_q8_0 : dt == KVP_DTYPE_I8 ? k->mm_i8 : dt == KVP_DTYPE_I4 ? k->mm_i4 : dt == KVP_DTYPE_F32
                  ? k->mm_f32 : dt == KVP_DTYPE_F16 ? k->mm_f16 : dt == KVP_DTYPE_BF16 ? k->mm_bf16 : k->mm_e4m3;
    uint32_t piece = quant && nt <= k->few_tok && k->few_rows ? k->few_rows : KVP_MM_ROWS;
    for (uint32_t r = 0; r < nr; r += piece) {
        kvp_mm_blk p = b;
        p.nr = nr - r < piece ? nr - r : piece;
        p.w = kw->w + r * kw->stride;
        p.sc = kw->sc ? kw->sc + r * kw->sc_stride : NULL;
        p.zp = kw->zp ? kw->zp + r * kw->sc_stride : NULL;
        p.wsum = b.wsum ? b.wsum + (size_t)r * nb : NULL;
        p.y = y + r;
        f(&p);
    }
}

/* Every kind's matmul of a fast table against the portable one and an
 * exact sum, on KERN_ROWS rows (a piece of few_rows and part of another)
 * by KVP_MM_TILE tokens; and each (row,
 * token) the same bits however it is cut into pieces: a row alone or among
 * others, a token alone, first or last of a group, in a tile or not. */
/* The first i < n where a and b differ in their bits, or -1: bit for bit,
 * but any NaN for a NaN (which of two NaN operands a sum passes on follows
 * the compiler's operand order). */
static int first_unlike(const float *a, const float *b, int n)
{
    for (int i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof a[i]) != 0 && !(isnan(a[i]) && isnan(b[i])))
            return i;
    return -1;
}

/* fast->weight_row against the portable decoder, bit for bit, on random
 * bytes: every FP4 code (8, -0, among them), NaN and subnormal E8M0
 * scales, E4M3 NaN scales, an NVFP4 tensor scale, scaled FP4 in groups of
 * 16 and 48, GGUF's Q5_0, Q5_1, Q4_K and Q6_K (random f16 scales: NaN,
 * inf and subnormal ones among them), scaled fp8-E5M2, int8 and int4 in
 * groups under 32, with and without zero points; a kind the table leaves
 * to the portable decoder too. */
static void test_weight_rows(const kvp_cpu_kernels *fast)
{
    enum { N = 768, R = 3 };
    static const struct {
        int dtype, scaled;
        uint32_t group;
        float global;
    } kinds[] = {{KVP_DTYPE_MXFP4, 0, 0, 0},  {KVP_DTYPE_NVFP4, 0, 0, 0},   {KVP_DTYPE_NVFP4, 0, 0, 0.37f},
                 {KVP_DTYPE_FP4_E2M1, 1, 16, 0}, {KVP_DTYPE_FP4_E2M1, 1, 48, 0}, {KVP_DTYPE_Q5_0, 0, 0, 0},
                 {KVP_DTYPE_Q5_1, 0, 0, 0},  {KVP_DTYPE_Q4_K, 0, 0, 0},     {KVP_DTYPE_Q6_K, 0, 0, 0},
                 {KVP_DTYPE_FP8_E5M2, 1, 16, 0}, {KVP_DTYPE_I8, 1, 8, 0}, {KVP_DTYPE_I8, 2, 24, 0},
                 {KVP_DTYPE_I4, 1, 16, 0},   {KVP_DTYPE_I4, 2, 8, 0},       {KVP_DTYPE_F16, 0, 0, 0}};
    static uint8_t data[R * N * 2];
    static float sc[R * N], zp[R * N], a[N], b[N];
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        kvp_weight w = {.name = "rows", .dtype = kinds[k].dtype, .n_in = N, .n_out = R,
                        .row_bytes = kvp_dtype_row_bytes((uint32_t)kinds[k].dtype, N), .data = data,
                        .global = kinds[k].global};
        for (size_t i = 0; i < sizeof data; i++)
            data[i] = (uint8_t)((frand() + 1) * 128);
        if (kinds[k].dtype == KVP_DTYPE_MXFP4) /* scales: NaN (0xff) and 2^-127 (0) among them */
            data[0] = 0xff, data[17] = 0, data[2 * w.row_bytes] = 120;
        if (kinds[k].dtype == KVP_DTYPE_NVFP4)
            data[0] = 0x7f, data[9] = 0; /* E4M3 NaN and zero */
        data[1] = 0x88; /* code 8 in both nibbles */
        if (kinds[k].scaled) { /* 2: with zero points */
            w.scales = sc, w.group = kinds[k].group, w.scale_stride = N / kinds[k].group;
            w.zeros = kinds[k].scaled == 2 ? zp : NULL;
            for (size_t i = 0; i < sizeof sc / sizeof sc[0]; i++)
                sc[i] = frand() * 4, zp[i] = (float)(int)(frand() * 8);
            sc[1] = -1.0f; /* a negative scale turns -0 into +0 */
        }
        for (uint32_t r = 0; r < R; r++) {
            memset(a, 0x55, sizeof a), memset(b, 0xaa, sizeof b);
            int ra = kvp_cpu_dequant_weight_row(&w, r, a), rb = fast->weight_row(&w, r, b);
            CHECK_MSG(ra == 0 && rb == 0, "%s: kind %zu row %u: %d %d", fast->isa, k, r, ra, rb);
            int bad = first_unlike(a, b, N);
            CHECK_MSG(bad < 0, "%s: kind %zu (%s) row %u differs from the portable decoder at %d: %a vs %a", fast->isa,
                      k, kvp_dtype_name((uint32_t)kinds[k].dtype), r, bad, bad < 0 ? 0.0 : (double)a[bad],
                      bad < 0 ? 0.0 : (double)b[bad]);
        }
    }
}

/* The table's kernel for a quantized kind (Q8_0, Q4_0, Q4_1, i8, i4 with
 * zero points) in rows of 16 against its kernel for the kind as stored (y, groups of tile_tok tokens from
 * x[TT][n]): the same bits for every token count up to tile_tok (the
 * stored kernel's rows of 16 and its tile alike), on every row of a whole
 * group of 16 and a padded one. */
static void test_r16_kernel(const kvp_cpu_kernels *fast, const kvp_weight *w, const float *x, float (*y)[KERN_ROWS])
{
    enum { TT = KVP_MM_TILE, NBM = 80 };
    kvp_weight r16;
    kvp_err err = {0};
    CHECK(w->n_out == KERN_ROWS && w->n_in / 32 <= NBM);
    if (!kvp_cpu_r16_takes(w) || kvp_cpu_as_r16(w, &r16, &err) != 1) {
        CHECK(0);
        return;
    }
    static kvp_q8blk xq[TT][NBM];
    const kvp_q8blk *xp[TT];
    for (int t = 0; t < TT; t++)
        fast->quant_q8(x + (size_t)t * w->n_in, xq[t], w->n_in), xp[t] = xq[t];
    int bad = 0;
    for (uint32_t nt = 1; nt <= fast->tile_tok; nt++)
        for (uint32_t t0 = 0; t0 + nt <= TT; t0 += nt) {
            float yr[TT][KERN_ROWS];
            for (uint32_t r = 0; r < KERN_ROWS; r += 16) { /* pieces from each group's first row */
                int sc = r16.scales != NULL;
                kvp_mm_blk b = {.w = (const uint8_t *)r16.data + r * r16.row_bytes, .w_stride = r16.row_bytes,
                                .d16 = sc ? NULL : kvp_r16_plane(r16.data, r16.dtype, r16.n_out, r16.n_in, 0, r),
                                .m16 = sc ? NULL : kvp_r16_plane(r16.data, r16.dtype, r16.n_out, r16.n_in, 1, r),
                                .sc = sc ? r16.scales + (size_t)r * r16.scale_stride : NULL,
                                .zp = r16.zeros ? r16.zeros + (size_t)r * r16.scale_stride : NULL,
                                .sc_stride = r16.scale_stride, .g = r16.group, .xq = xp + t0,
                                .n = w->n_in, .nr = KERN_ROWS - r < 16 ? KERN_ROWS - r : 16, .nt = nt,
                                .y = yr[0] + r, .ldy = KERN_ROWS};
                fast->mm_r16[r16.dtype - KVP_CPU_DTYPE_Q8_0_R16](&b);
            }
            for (uint32_t t = 0; t < nt; t++)
                bad += memcmp(yr[t], y[t0 + t], sizeof yr[t]) != 0;
        }
    CHECK_MSG(bad == 0, "%s: %s in rows of 16: %d tokens' outputs differ from the kind as stored", fast->isa,
              kvp_dtype_name((uint32_t)w->dtype), bad);
    kvp_cpu_repacked_free(&r16);
}

/* RMSNorm rows: the same bits as the portable table's, for lengths with
 * every tail of the eight lanes, in place and not; and the formula. */
static void test_rms_row(const kvp_cpu_kernels *ref, const kvp_cpu_kernels *fast)
{
    enum { N = 583 };
    static float x[N], w[N], ya[N], yb[N];
    for (int i = 0; i < N; i++)
        x[i] = (frand() - 0.5f) * (i % 11 == 0 ? 40.0f : 3.0f), w[i] = 0.5f + frand();
    int bad = 0;
    for (uint32_t n = 1; n <= N; n += n < 24 ? 1 : 37) {
        ref->rms_row(x, w, ya, n, 1e-5f);
        fast->rms_row(x, w, yb, n, 1e-5f);
        bad += memcmp(ya, yb, n * sizeof(float)) != 0;
        memcpy(yb, x, n * sizeof(float));
        fast->rms_row(yb, w, yb, n, 1e-5f); /* in place, as the output norm runs */
        bad += memcmp(ya, yb, n * sizeof(float)) != 0;
    }
    CHECK_MSG(bad == 0, "rms_row %s: %d rows other bits than the portable table's", fast->isa, bad);
    double ss = 0;
    for (int i = 0; i < N; i++)
        ss += (double)x[i] * x[i];
    double s = 1 / sqrt(ss / N + 1e-5);
    fast->rms_row(x, w, yb, N, 1e-5f);
    int far = 0;
    for (int i = 0; i < N; i++)
        far += fabs(yb[i] - x[i] * s * w[i]) > 1e-6 * (1 + fabs(x[i] * s * w[i]));
    CHECK_MSG(far == 0, "rms_row %s: %d values away from the formula", fast->isa, far);
}

static void test_kernels_one(const kvp_cpu_kernels *fast)
{
    const kvp_cpu_kernels *ref = &kvp_cpu_kernels_portable;
    /* rows of 70 blocks: the VNNI tile takes them in two chunks and a tail */
    enum { N = 2240, NB = N / 32, TT = KVP_MM_TILE, R = KERN_ROWS };
    const uint32_t T = fast->tile_tok;
    static float x[TT][N], wf[R][N], sc[R][N / 32], zp[R][N / 32];
    static uint8_t wq[R][N * 4];
    CHECK(T >= 1 && T <= TT && fast->few_tok < T);
    _Static_assert(KERN_ROWS > KVP_MM_FEW_ROWS, "a whole piece of few_rows and part of another");
    CHECK(fast->few_rows % KVP_MM_ROWS == 0 && fast->few_rows <= KVP_MM_FEW_ROWS);
    test_weight_rows(fast);
    for (int i = 0; i < N; i++)
        for (int t = 0; t < TT; t++)
            x[t][i] = frand() * (t % 4 + 1);
    const float *xf[TT];
    for (int t = 0; t < TT; t++)
        xf[t] = x[t];
    kvp_q8blk qa[NB], qb[NB];
    for (int t = 0; t < TT; t++) {
        ref->quant_q8(x[t], qa, N);
        fast->quant_q8(x[t], qb, N);
        CHECK(memcmp(qa[0].q, qb[0].q, 32) == 0);
        CHECK_NEAR(qa[1].d, qb[1].d, 1e-7);
        CHECK_NEAR(qa[2].s, qb[2].s, 1e-4);
        CHECK_EQ_I64(qa[2].sum, qb[2].sum);
    }
    const int kinds[] = {KVP_DTYPE_Q4_0, KVP_DTYPE_Q4_1, KVP_DTYPE_Q8_0, KVP_DTYPE_I8, KVP_DTYPE_I4,
                         KVP_DTYPE_F32, KVP_DTYPE_F16, KVP_DTYPE_BF16, KVP_DTYPE_FP8_E4M3};
    for (int ki = 0; ki < 9; ki++) {
        int dt = kinds[ki], quant = ki < 5, scaled = ki == 3 || ki == 4 || ki == 8;
        uint32_t n = ki >= 5 && ki <= 7 ? N - 5 : N; /* floats: a tail */
        kern_w kw = {.dtype = dt, .n = n, .g = ki == 8 ? 32 : 64};
        kw.stride = (size_t)kvp_dtype_row_bytes((uint32_t)dt, n);
        kw.sc_stride = scaled ? n / kw.g : 0;
        for (int r = 0; r < R; r++) {
            for (uint32_t i = 0; i < n; i++)
                wf[r][i] = frand();
            for (uint32_t u = 0; u < n / kw.g; u++)
                sc[r][u] = 0.01f + 0.1f * fabsf(frand()), zp[r][u] = (float)((r * 3 + (int)u) % 5 - 2);
            uint8_t *o = wq[0] + r * kw.stride;
            if (dt <= KVP_DTYPE_Q8_0 && dt >= KVP_DTYPE_Q4_0)
                quant_row(dt, wf[r], o, n);
            for (uint32_t i = 0; i < n; i++) {
                if (dt == KVP_DTYPE_F32)
                    memcpy(o + 4 * i, &wf[r][i], 4);
                else if (dt == KVP_DTYPE_F16)
                    kvp_put16(o + 2 * i, kvp_f32_to_f16(wf[r][i]));
                else if (dt == KVP_DTYPE_BF16)
                    kvp_put16(o + 2 * i, kvp_f32_to_bf16(wf[r][i]));
                else if (dt == KVP_DTYPE_I8)
                    o[i] = (uint8_t)(int8_t)(i % 17 == 0 ? -128 : lrintf(wf[r][i] * 127));
                else if (dt == KVP_DTYPE_I4)
                    o[i / 2] = (uint8_t)(i % 2 ? (o[i / 2] & 15) | ((lrintf(wf[r][i] * 7) & 15) << 4)
                                                : (lrintf(wf[r][i] * 7) & 15));
                else if (dt == KVP_DTYPE_FP8_E4M3)
                    o[i] = kvp_f32_to_e4m3_sat(wf[r][i] * 100);
            }
        }
        kw.w = wq[0];
        kw.sc = scaled ? sc[0] : NULL;
        kw.zp = ki == 3 || ki == 4 ? zp[0] : NULL; /* i8 and i4 asymmetric */
        float ya[TT][R], yb[TT][R], one[TT][R];
        for (uint32_t t = 0; t < TT; t += ref->tile_tok)
            kern_mm(ref, &kw, R, xf + t, TT - t < ref->tile_tok ? TT - t : ref->tile_tok, ya[t], R);
        for (uint32_t t = 0; t < TT; t += T)
            kern_mm(fast, &kw, R, xf + t, TT - t < T ? TT - t : T, yb[t], R);
        kvp_weight w = {.dtype = dt, .n_in = n, .n_out = R, .row_bytes = kw.stride, .data = kw.w, .scales = kw.sc,
                        .zeros = kw.zp, .group = kw.g, .scale_stride = (uint32_t)kw.sc_stride};
        double worst = 0, worst_exact = 0;
        for (int r = 0; r < R; r++) {
            float deq[N];
            CHECK(kvp_cpu_dequant_weight_row(&w, (uint32_t)r, deq) == 0);
            for (int t = 0; t < TT; t++) {
                double exact = 0, mag = 0;
                for (uint32_t i = 0; i < n; i++)
                    exact += (double)deq[i] * x[t][i], mag += fabs((double)deq[i] * x[t][i]);
                worst = fmax(worst, fabs(ya[t][r] - yb[t][r]) / (1 + mag));
                /* quantized activations: ~ |x|/127 an element, relative to the magnitude */
                worst_exact = fmax(worst_exact, fabs(ya[t][r] - exact) / (1 + mag));
            }
        }
        CHECK_MSG(worst < 1e-5, "%s %s: %s against portable: %g", fast->isa, kvp_dtype_name((uint32_t)dt), "max",
                  worst);
        CHECK_MSG(worst_exact < (quant ? 0.02 : 1e-5), "%s: portable against an exact sum: %g",
                  kvp_dtype_name((uint32_t)dt), worst_exact);
        /* the same bits in any piece: each row alone by each token alone,
         * then each token last of a group and first of another */
        int bad = 0;
        for (int r = 0; r < R; r++) {
            kern_w k1 = kw;
            k1.w = kw.w + r * kw.stride;
            k1.sc = kw.sc ? kw.sc + r * kw.sc_stride : NULL;
            k1.zp = kw.zp ? kw.zp + r * kw.sc_stride : NULL;
            for (int t = 0; t < TT; t++)
                kern_mm(fast, &k1, 1, xf + t, 1, &one[t][r], 1);
        }
        bad += memcmp(one, yb, sizeof one) != 0;
        for (uint32_t g = 2; g <= T && g <= TT; g++) /* TT bounds it too, for the compiler */
            for (int t = 0; t < TT; t++) {
                const float *grp[TT];
                float yg[TT][R];
                for (uint32_t i = 0; i < g; i++)
                    grp[i] = x[(t + TT - (int)(g - 1) + (int)i) % TT]; /* t last */
                kern_mm(fast, &kw, R, grp, g, yg[0], R);
                bad += memcmp(yg[g - 1], yb[t], sizeof yb[t]) != 0;
                for (uint32_t i = 0; i < g; i++)
                    grp[i] = x[(t + (int)i * 3) % TT]; /* t first */
                kern_mm(fast, &kw, R - 3, grp, g, yg[0], R);
                bad += memcmp(yg[0], yb[t], (R - 3) * sizeof(float)) != 0;
            }
        CHECK_MSG(bad == 0, "%s %s: %d pieces give other bits", fast->isa, kvp_dtype_name((uint32_t)dt), bad);
        if (quant && fast->mm_r16[0]) /* every quantized kind has its rows of 16 */
            test_r16_kernel(fast, &w, x[0], yb);
    }
    /* q8_0 with extreme codes (w -128 and 127, x +-127) against an exact
     * sum: the VNNI tile offsets x by 128, its rows w, and each must
     * cancel it exactly */
    {
        static uint8_t rows[2][NB * 34];
        for (int r = 0; r < 2; r++)
            for (int b = 0; b < NB; b++) {
                uint8_t *blk = rows[r] + b * 34;
                kvp_put16(blk, kvp_f32_to_f16(0.5f * (float)(b + 1)));
                for (int j = 0; j < 32; j++)
                    blk[2 + j] = (uint8_t)(int8_t)((j + b + r) % 3 == 0 ? -128 : j % 2 ? 127 : -((j * 37 + r) % 128));
            }
        /* activations that quantize to +-127 and chosen codes: amax 127 in
         * every block, so d = 1 and q = x */
        for (int t = 0; t < TT; t++)
            for (int b = 0; b < NB; b++)
                for (int j = 0; j < 32; j++)
                    x[t][b * 32 + j] = (float)(j == 0 ? 127 : (j + t) % 4 == 0 ? -127 : (j + b) % 5 == 0 ? 127
                                               : (j * 13 + t * 7 + b) % 255 - 127);
        kern_w kw = {.dtype = KVP_DTYPE_Q8_0, .w = rows[0], .stride = NB * 34, .n = N};
        float y[TT][2];
        /* one token, 4 and few_tok (rows with the block sums), a tile */
        const uint32_t nts[] = {1, 4 <= T ? 4 : T, fast->few_tok <= T ? fast->few_tok : T, T};
        for (size_t ni = 0; ni < sizeof nts / sizeof *nts; ni++)
            for (uint32_t t = 0, nt = nts[ni] ? nts[ni] : 1; t < TT; t += nt) {
                kern_mm(fast, &kw, 2, xf + t, TT - t < nt ? TT - t : nt, y[t], 2);
                for (uint32_t u = t; u < t + nt && u < TT; u++)
                    for (int r = 0; r < 2; r++) {
                        double exact = 0;
                        for (int b = 0; b < NB; b++) {
                            long isum = 0;
                            for (int j = 0; j < 32; j++)
                                isum += (long)(int8_t)rows[r][b * 34 + 2 + j] * lrintf(x[u][b * 32 + j]);
                            exact += 0.5 * (b + 1) * (double)isum;
                        }
                        CHECK_NEAR(y[u][r], exact, 1e-5 * (1 + fabs(exact)));
                    }
            }
        if (fast->wsum) { /* the block sums, checked on their own */
            int32_t ws[NB];
            fast->wsum(rows[1] + 2, 34, NB, ws);
            for (int b = 0; b < NB; b++) {
                int sum = 0;
                for (int j = 0; j < 32; j++)
                    sum += (int8_t)rows[1][b * 34 + 2 + j];
                CHECK_EQ_I64(ws[b], -128 * sum);
            }
        }
    }
    test_att_kernels(ref, fast);
    test_rms_row(ref, fast);
}

/* Two tables' scores and value sums: the same bits (the VNNI table's
 * 512-bit ones against the AVX2 table's 256-bit ones), for a decode's
 * three queries up to a 24-lane verify step, heads of 64, 80 and 128,
 * every key dtype, key counts with every tail of the four-key steps. */
static void test_attention_same(const kvp_cpu_kernels *a, const kvp_cpu_kernels *b)
{
    enum { HD = 128, NP = 23, LDQ = 24 };
    static float q[LDQ * HD], kf[NP * HD], sa[NP * LDQ], sb[NP * LDQ], oa[LDQ * HD], ob[LDQ * HD];
    static uint16_t kh[NP * HD], kb[NP * HD];
    static uint8_t k8[NP * HD], ki[NP * HD];
    for (int i = 0; i < LDQ * HD; i++)
        q[i] = frand() - 0.5f;
    for (int i = 0; i < NP * HD; i++) {
        kf[i] = frand() - 0.5f;
        kh[i] = kvp_f32_to_f16(kf[i]), kb[i] = kvp_f32_to_bf16(kf[i]);
        k8[i] = kvp_f32_to_e4m3_sat(kf[i] * 300.0f), ki[i] = (uint8_t)kvp_f32_to_i8(kf[i] * 127.0f);
    }
    const int kdt[5] = {KVP_DTYPE_F16, KVP_DTYPE_F32, KVP_DTYPE_BF16, KVP_DTYPE_FP8_E4M3, KVP_DTYPE_I8};
    const void *kks[5] = {kh, kf, kb, k8, ki};
    const uint32_t nqs[] = {1, 3, 4, 5, 7, 8, 9, 12, 15, 16, 24}, hds[] = {64, 80, 128};
    int bad = 0, runs = 0;
    for (size_t qi = 0; qi < sizeof nqs / sizeof *nqs; qi++)
        for (size_t hi = 0; hi < sizeof hds / sizeof *hds; hi++)
            for (int dt = 0; dt < 5; dt++)
                for (uint32_t np = 17; np <= NP; np += 3) {
                    uint32_t nq = nqs[qi], hd = hds[hi], ldq = nq <= 4 ? 4 : nq <= 8 ? 8 : LDQ;
                    a->att_scores(q, nq, kdt[dt], kks[dt], np, hd, sa, ldq);
                    b->att_scores(q, nq, kdt[dt], kks[dt], np, hd, sb, ldq);
                    int off = memcmp(sa, sb, (size_t)np * ldq * sizeof(float)) != 0;
                    for (uint32_t i = 0; i < LDQ * HD; i++)
                        oa[i] = ob[i] = frand();
                    a->att_values(sa, ldq, nq, kdt[dt], kks[dt], np, hd, oa);
                    b->att_values(sa, ldq, nq, kdt[dt], kks[dt], np, hd, ob);
                    off += 2 * (memcmp(oa, ob, sizeof oa) != 0);
                    if (off && bad++ < 4)
                        printf("  %s / %s: %u queries, hd %u, %s keys, %u of them: %s differ\n", a->isa, b->isa, nq,
                               hd, kvp_dtype_name((uint32_t)kdt[dt]), np,
                               off == 1 ? "scores" : off == 2 ? "value sums" : "scores and value sums");
                    runs++;
                }
    CHECK_MSG(bad == 0, "att_scores / att_values %s / %s: %d of %d runs other bits", a->isa, b->isa, bad, runs);
}

/* Two tables' softmax and block conversion: the same bits (the VNNI
 * table's 512-bit ones against the AVX2 table's), for a decode's four
 * lanes, eight, sixteen and twenty-four, over key counts with every tail
 * of the four-key steps, lanes that see no key, a few keys or all. */
static void test_softmax_same(const kvp_cpu_kernels *a, const kvp_cpu_kernels *b)
{
    enum { NP = 23, LDQ = 24 };
    static float sa[NP * LDQ], sb[NP * LDQ];
    float mxa[LDQ], mxb[LDQ], suma[LDQ], sumb[LDQ];
    int32_t lim[LDQ];
    for (uint32_t ldq = 4; ldq <= LDQ; ldq += ldq == 4 ? 4 : 8)
        for (uint32_t np = 17; np <= NP; np++) {
            for (uint32_t j = 0; j < ldq; j++)
                lim[j] = j == 2 ? 0 : (int32_t)(1 + (j * 5 + np) % np);
            for (uint32_t i = 0; i < np * ldq; i++)
                sa[i] = sb[i] = 60.0f * frand() - 30.0f - (i % 7 == 0 ? 70.0f : 0.0f);
            a->att_softmax(sa, ldq, np, lim, mxa, suma);
            b->att_softmax(sb, ldq, np, lim, mxb, sumb);
            CHECK_MSG(memcmp(sa, sb, np * ldq * sizeof(float)) == 0 && memcmp(mxa, mxb, ldq * sizeof(float)) == 0 &&
                          memcmp(suma, sumb, ldq * sizeof(float)) == 0,
                      "att_softmax %s / %s, %u lanes, %u keys: other bits", a->isa, b->isa, ldq, np);
        }
    static uint16_t h[1000];
    static float fa[1000], fb[1000];
    for (int i = 0; i < 1000; i++)
        h[i] = kvp_f32_to_f16(40.0f * frand() - 20.0f);
    a->kv_f32(KVP_DTYPE_F16, h, fa, 999);
    b->kv_f32(KVP_DTYPE_F16, h, fb, 999);
    CHECK_MSG(memcmp(fa, fb, 999 * sizeof(float)) == 0, "kv_f32 f16 %s / %s: other bits", a->isa, b->isa);
    /* 8-bit blocks: a zero block, halves that round to even (k + 0.5 times
     * the step), one large value among small ones, random rows */
    enum { QN = 32 * 12 };
    static float qx[QN];
    static kvp_q8blk qa[QN / 32], qb[QN / 32];
    for (int i = 0; i < QN; i++)
        qx[i] = i < 32 ? 0.0f : i < 64 ? (float)(i % 16 - 8) + 0.5f : i < 96 ? (i == 70 ? 300.0f : frand())
                                                                   : (frand() - 0.5f) * (float)(1 + i % 5);
    qx[63] = 127.0f; /* the step is 1: the halves round to even */
    a->quant_q8(qx, qa, QN);
    b->quant_q8(qx, qb, QN);
    CHECK_MSG(memcmp(qa, qb, sizeof qa) == 0, "quant_q8 %s / %s: other bits", a->isa, b->isa);
    /* SiLU over its range and past the exp clamps, every tail of sixteen */
    static float u[1000];
    for (int i = 0; i < 1000; i++)
        fa[i] = fb[i] = (float)(i - 500) * 0.19f + (i % 97 == 0 ? (i % 2 ? 900.0f : -900.0f) : 0.0f), u[i] = frand();
    for (size_t n = 983; n <= 999; n++) {
        a->silu_mul(fa, u, n);
        b->silu_mul(fb, u, n);
        CHECK_MSG(memcmp(fa, fb, n * sizeof(float)) == 0, "silu_mul %s / %s, %zu elements: other bits", a->isa,
                  b->isa, n);
    }
}

static void test_kernels(void)
{
    const kvp_cpu_kernels *avx2 = kvp_cpu_kernels_avx2(), *vnni = kvp_cpu_kernels_vnni();
    if (avx2)
        test_kernels_one(avx2);
    else
        printf("note: no AVX2 on this CPU; its kernels not compared\n");
    if (vnni) {
        test_kernels_one(vnni);
        /* its 512-bit attention and element kernels against the 256-bit ones */
        test_attention_same(avx2, vnni);
        test_softmax_same(avx2, vnni);
        /* the 512-bit float matmuls Intel's table takes, on every AVX-512
         * host (Zen 4's table keeps the 256-bit ones) */
        kvp_cpu_kernels wide = *vnni;
        kvp_cpu_vnni_wide_floats(&wide);
        if (wide.mm_f16 != vnni->mm_f16)
            test_kernels_one(&wide);
    } else
        printf("note: no AVX512-VNNI on this CPU; its kernels not compared\n");
    /* the AMX table: its tiles (test_amx) and its 512-bit float matmuls */
    const kvp_cpu_kernels *amx = kvp_cpu_kernels_amx();
    if (amx)
        test_kernels_one(amx);
    else
        printf("note: no AMX on this CPU (or not granted); its kernels not compared\n");
}

/* ---- a tiny random GGUF ---- */

typedef struct tiny_cfg {
    uint32_t n_layer, n_embd, n_ff, n_head, n_head_kv, n_vocab;
    int wtype;   /* dtype of the matrices */
    int tied;
} tiny_cfg;

static void gguf_str(kvp_buf *b, const char *s)
{
    kvp_buf_u64(b, strlen(s));
    kvp_buf_put(b, s, strlen(s));
}
static void kv_u32(kvp_buf *b, const char *k, uint32_t v)
{
    gguf_str(b, k);
    kvp_buf_u32(b, 4);
    kvp_buf_u32(b, v);
}
static void kv_f32(kvp_buf *b, const char *k, float v)
{
    gguf_str(b, k);
    kvp_buf_u32(b, 6);
    kvp_buf_f32(b, v);
}

typedef struct tensor_spec {
    char name[64];
    uint32_t n_in, n_out; /* n_out 0: 1-D */
    int dtype;
} tensor_spec;

static uint32_t ggml_id(int dtype)
{
    switch (dtype) {
    case KVP_DTYPE_F32: return 0;
    case KVP_DTYPE_F16: return 1;
    case KVP_DTYPE_Q4_0: return 2;
    case KVP_DTYPE_Q4_1: return 3;
    case KVP_DTYPE_Q8_0: return 8;
    case KVP_DTYPE_Q2_K: return 10;
    case KVP_DTYPE_Q3_K: return 11;
    case KVP_DTYPE_Q4_K: return 12;
    case KVP_DTYPE_Q5_K: return 13;
    case KVP_DTYPE_Q6_K: return 14;
    case KVP_DTYPE_IQ4_NL: return 20;
    case KVP_DTYPE_IQ4_XS: return 23;
    default: return 30; /* bf16 */
    }
}

/* Build the file in memory; weights are random (norm weights near 1). */
static uint8_t *tiny_gguf(const tiny_cfg *c, size_t *len)
{
    tensor_spec ts[128];
    int nt = 0;
    uint32_t hd = c->n_embd / c->n_head, kv = c->n_head_kv * hd;
#define T(nm, a, b, dt) (snprintf(ts[nt].name, 64, "%s", nm), ts[nt].n_in = a, ts[nt].n_out = b, ts[nt++].dtype = dt)
    T("token_embd.weight", c->n_embd, c->n_vocab, c->wtype);
    T("output_norm.weight", c->n_embd, 0, KVP_DTYPE_F32);
    if (!c->tied)
        T("output.weight", c->n_embd, c->n_vocab, c->wtype);
    for (uint32_t l = 0; l < c->n_layer; l++) {
        char n[64];
#define L(suffix, a, b, dt) (snprintf(n, 64, "blk.%u.%s", l, suffix), T(n, a, b, dt))
        L("attn_norm.weight", c->n_embd, 0, KVP_DTYPE_F32);
        L("attn_q.weight", c->n_embd, c->n_embd, c->wtype);
        L("attn_k.weight", c->n_embd, kv, c->wtype);
        L("attn_v.weight", c->n_embd, kv, c->wtype);
        L("attn_output.weight", c->n_embd, c->n_embd, c->wtype);
        L("ffn_norm.weight", c->n_embd, 0, KVP_DTYPE_F32);
        L("ffn_gate.weight", c->n_embd, c->n_ff, c->wtype);
        L("ffn_up.weight", c->n_embd, c->n_ff, c->wtype);
        L("ffn_down.weight", c->n_ff, c->n_embd, c->wtype);
#undef L
    }
#undef T
    kvp_buf b;
    kvp_buf_init(&b);
    kvp_buf_put(&b, "GGUF", 4);
    kvp_buf_u32(&b, 3);
    kvp_buf_u64(&b, (uint64_t)nt);
    kvp_buf_u64(&b, 11);
    gguf_str(&b, "general.architecture");
    kvp_buf_u32(&b, 8);
    gguf_str(&b, "llama");
    kv_u32(&b, "llama.block_count", c->n_layer);
    kv_u32(&b, "llama.embedding_length", c->n_embd);
    kv_u32(&b, "llama.feed_forward_length", c->n_ff);
    kv_u32(&b, "llama.attention.head_count", c->n_head);
    kv_u32(&b, "llama.attention.head_count_kv", c->n_head_kv);
    kv_u32(&b, "llama.context_length", 256);
    kv_u32(&b, "llama.rope.dimension_count", hd);
    kv_u32(&b, "llama.vocab_size", c->n_vocab);
    kv_f32(&b, "llama.rope.freq_base", 10000.0f);
    kv_f32(&b, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    uint64_t off = 0;
    for (int i = 0; i < nt; i++) {
        gguf_str(&b, ts[i].name);
        kvp_buf_u32(&b, ts[i].n_out ? 2 : 1);
        kvp_buf_u64(&b, ts[i].n_in);
        if (ts[i].n_out)
            kvp_buf_u64(&b, ts[i].n_out);
        kvp_buf_u32(&b, ggml_id(ts[i].dtype));
        kvp_buf_u64(&b, off);
        off += kvp_align_up((uint64_t)kvp_dtype_row_bytes((uint32_t)ts[i].dtype, ts[i].n_in) *
                                (ts[i].n_out ? ts[i].n_out : 1), 32);
    }
    kvp_buf_align(&b, 32);
    float *row = malloc(sizeof(float) * (c->n_ff > c->n_embd ? c->n_ff : c->n_embd));
    uint8_t *q = malloc(4 * (c->n_ff > c->n_embd ? c->n_ff : c->n_embd));
    for (int i = 0; i < nt; i++) {
        uint32_t rows = ts[i].n_out ? ts[i].n_out : 1;
        int64_t rb = kvp_dtype_row_bytes((uint32_t)ts[i].dtype, ts[i].n_in);
        int is_norm = !ts[i].n_out;
        for (uint32_t r = 0; r < rows; r++) {
            for (uint32_t j = 0; j < ts[i].n_in; j++)
                row[j] = is_norm ? 1.0f + 0.2f * frand() : 0.5f * frand();
            if (ts[i].dtype == KVP_DTYPE_F32)
                memcpy(q, row, (size_t)rb);
            else if (ts[i].dtype == KVP_DTYPE_F16)
                for (uint32_t j = 0; j < ts[i].n_in; j++)
                    kvp_put16(q + 2 * j, kvp_f32_to_f16(row[j]));
            else if (ts[i].dtype == KVP_DTYPE_BF16)
                for (uint32_t j = 0; j < ts[i].n_in; j++)
                    kvp_put16(q + 2 * j, kvp_f32_to_bf16(row[j]));
            else if (kvp_dtype_get((uint32_t)ts[i].dtype)->block_size == 256 || ts[i].dtype == KVP_DTYPE_IQ4_NL)
                kquant_row(ts[i].dtype, q, (size_t)rb);
            else
                quant_row(ts[i].dtype, row, q, ts[i].n_in);
            kvp_buf_put(&b, q, (size_t)rb);
        }
        kvp_buf_align(&b, 32);
    }
    free(row);
    free(q);
    *len = b.len;
    return b.data;
}

static int write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(p, 1, n, f);
    return fclose(f) == 0 && w == n ? 0 : -1;
}

/* ---- a naive dense forward pass (no cache, no paging, f32 everywhere) ---- */

static void naive_matvec(const kvp_weight *w, const float *x, float *y)
{
    float *row = malloc(sizeof(float) * w->n_in);
    for (uint32_t r = 0; r < w->n_out; r++) {
        kvp_cpu_dequant_weight_row(w, r, row);
        double s = 0;
        for (uint32_t i = 0; i < w->n_in; i++)
            s += (double)row[i] * x[i];
        y[r] = (float)s;
    }
    free(row);
}

static void naive_norm(const float *x, const float *w, float *y, uint32_t n, double eps)
{
    double ss = 0;
    for (uint32_t i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    double s = 1 / sqrt(ss / n + eps);
    for (uint32_t i = 0; i < n; i++)
        y[i] = (float)(x[i] * s * w[i]);
}

static void naive_rope(float *v, uint32_t hd, int pos, double theta)
{
    for (uint32_t i = 0; i < hd / 2; i++) {
        double a = pos * pow(theta, -2.0 * i / hd), x0 = v[2 * i], x1 = v[2 * i + 1];
        v[2 * i] = (float)(x0 * cos(a) - x1 * sin(a));
        v[2 * i + 1] = (float)(x0 * sin(a) + x1 * cos(a));
    }
}

/* logits[n][n_vocab] for every position of tokens[n]. */
static void naive_forward(const kvp_model *m, const uint32_t *tokens, uint32_t n, float *logits)
{
    const kvp_config *c = &m->cfg;
    uint32_t d = c->n_embd, hd = c->head_dim, nq = c->n_head * hd, nkv = c->n_head_kv * hd, ff = c->n_ff;
    float *x = calloc((size_t)n * d, 4), *h = malloc(4 * d), *q = malloc(4 * nq), *att = malloc(4 * nq);
    float *K = malloc((size_t)4 * n * nkv), *V = malloc((size_t)4 * n * nkv), *g = malloc(4 * ff), *u = malloc(4 * ff);
    float *o = malloc(4 * d), *sc = malloc(4 * n);
    for (uint32_t t = 0; t < n; t++)
        kvp_cpu_dequant_weight_row(&m->tok_embd, tokens[t], x + t * d);
    for (uint32_t l = 0; l < c->n_layer; l++) {
        const kvp_layer *L = &m->layers[l];
        for (uint32_t t = 0; t < n; t++) { /* K, V of all positions first */
            naive_norm(x + t * d, L->attn_norm.data, h, d, c->rms_eps);
            naive_matvec(&L->wk, h, K + t * nkv);
            naive_matvec(&L->wv, h, V + t * nkv);
            for (uint32_t k = 0; k < c->n_head_kv; k++)
                naive_rope(K + t * nkv + k * hd, hd, (int)t, c->rope_theta);
        }
        float *xn = malloc((size_t)4 * n * d);
        memcpy(xn, x, (size_t)4 * n * d);
        for (uint32_t t = 0; t < n; t++) {
            naive_norm(x + t * d, L->attn_norm.data, h, d, c->rms_eps);
            naive_matvec(&L->wq, h, q);
            for (uint32_t hh = 0; hh < c->n_head; hh++) {
                naive_rope(q + hh * hd, hd, (int)t, c->rope_theta);
                uint32_t kh = hh / (c->n_head / c->n_head_kv);
                double mx = -1e30, sum = 0;
                for (uint32_t p = 0; p <= t; p++) {
                    double s = 0;
                    for (uint32_t i = 0; i < hd; i++)
                        s += (double)q[hh * hd + i] * K[p * nkv + kh * hd + i];
                    sc[p] = (float)(s / sqrt((double)hd));
                    mx = sc[p] > mx ? sc[p] : mx;
                }
                for (uint32_t p = 0; p <= t; p++)
                    sum += exp(sc[p] - mx);
                for (uint32_t i = 0; i < hd; i++) {
                    double a = 0;
                    for (uint32_t p = 0; p <= t; p++)
                        a += exp(sc[p] - mx) / sum * V[p * nkv + kh * hd + i];
                    att[hh * hd + i] = (float)a;
                }
            }
            naive_matvec(&L->wo, att, o);
            for (uint32_t i = 0; i < d; i++)
                xn[t * d + i] += o[i];
            naive_norm(xn + t * d, L->ffn_norm.data, h, d, c->rms_eps);
            naive_matvec(&L->w_gate, h, g);
            naive_matvec(&L->w_up, h, u);
            for (uint32_t i = 0; i < ff; i++)
                g[i] = (float)(g[i] / (1 + exp(-g[i])) * u[i]);
            naive_matvec(&L->w_down, g, o);
            for (uint32_t i = 0; i < d; i++)
                xn[t * d + i] += o[i];
        }
        memcpy(x, xn, (size_t)4 * n * d);
        free(xn);
    }
    for (uint32_t t = 0; t < n; t++) {
        naive_norm(x + t * d, m->output_norm.data, h, d, c->rms_eps);
        naive_matvec(&m->output, h, logits + (size_t)t * c->n_vocab);
    }
    free(x), free(h), free(q), free(att), free(K), free(V), free(g), free(u), free(o), free(sc);
}

/* ---- engine on the tiny model ---- */

static double max_abs_diff(const float *a, const float *b, size_t n)
{
    double mx = 0;
    for (size_t i = 0; i < n; i++)
        mx = fabs(a[i] - b[i]) > mx ? fabs(a[i] - b[i]) : mx;
    return mx;
}

/* max |a - b| relative to max |a|: the normalized error ggml's tests use */
static double rel_err(const float *a, const float *b, size_t n)
{
    double mx = 0;
    for (size_t i = 0; i < n; i++)
        mx = fabs(a[i]) > mx ? fabs(a[i]) : mx;
    return max_abs_diff(a, b, n) / (mx > 0 ? mx : 1);
}

/* A tiny random model of shape c written to dir/name (its path into
 * path[512]) and opened with a cache of n_blocks blocks of bs in kv_dtype.
 * 0, or -1 after a failed check. */
static int tiny_open(rig *r, const char *dir, const char *name, const tiny_cfg *c, int kv_dtype, uint32_t n_blocks,
                     uint32_t bs, char *path)
{
    size_t len;
    uint8_t *file = tiny_gguf(c, &len);
    snprintf(path, 512, "%s/%s", dir, name);
    CHECK(write_file(path, file, len) == 0);
    free(file);
    if (rig_open(r, path, unit_threads(2), 0, kv_dtype, n_blocks, bs) < 0) {
        CHECK(0);
        return -1;
    }
    return 0;
}

/* ---- a tied head is prepared once ----
 *
 * The engine prepares and releases each weight through the backend; a
 * tied model's output head is its embedding table, which a backend that
 * copies weights (the CUDA backend) would otherwise hold twice.  A CPU
 * backend whose prepare_weight and release_weight count the calls on each
 * weight's data, and the engine's logits through it equal the plain one's. */
static const void *pw_data[64];
static int pw_prepared[64], pw_released[64], pw_n;
static const kvp_backend_ops *pw_real;

static int pw_slot(const void *data)
{
    for (int i = 0; i < pw_n; i++)
        if (pw_data[i] == data)
            return i;
    if (pw_n == 64)
        return 63;
    pw_data[pw_n] = data;
    return pw_n++;
}

static int pw_prepare(kvp_backend *b, kvp_weight *w, kvp_err *err)
{
    pw_prepared[pw_slot(w->data)]++;
    return pw_real->prepare_weight(b, w, err);
}

static void pw_release(kvp_backend *b, kvp_weight *w)
{
    pw_released[pw_slot(w->data)]++;
    pw_real->release_weight(b, w);
}

static void test_tied_prepared(const char *dir)
{
    for (int tied = 0; tied < 2; tied++) {
        tiny_cfg c = {.n_layer = 2, .n_embd = 128, .n_ff = 320, .n_head = 4, .n_head_kv = 2, .n_vocab = 96,
                      .wtype = KVP_DTYPE_Q8_0, .tied = tied};
        char path[512];
        rig r;
        if (tiny_open(&r, dir, "tied.gguf", &c, KVP_DTYPE_F16, 64, 4, path) < 0)
            return;
        kvp_backend_ops ops = *r.be->ops;
        ops.prepare_weight = pw_prepare, ops.release_weight = pw_release;
        pw_real = r.be->ops, pw_n = 0;
        memset(pw_prepared, 0, sizeof pw_prepared), memset(pw_released, 0, sizeof pw_released);
        kvp_backend counting = {.ops = &ops, .impl = r.be->impl};
        kvp_engine *e2 = NULL;
        kvp_err err = {0};
        CHECK(kvp_engine_create(&e2, r.m, &counting, r.kc, &err) == 0);
        uint32_t tok[3] = {5, 42, 7}, V = c.n_vocab;
        float want[3 * 96], got[3 * 96];
        int s1 = kvp_kvcache_seq_new(r.kc, &err), s2 = kvp_kvcache_seq_new(r.kc, &err);
        kvp_step_seq a = {.seq = s1, .tokens = tok, .n_tokens = 3, .want = KVP_LOGITS_ALL};
        kvp_step_seq b = {.seq = s2, .tokens = tok, .n_tokens = 3, .want = KVP_LOGITS_ALL};
        CHECK_EQ_I64(kvp_engine_step(r.e, &a, 1, want, &err), 3);
        CHECK_EQ_I64(e2 ? kvp_engine_step(e2, &b, 1, got, &err) : -1, 3);
        CHECK_MSG(max_abs_diff(want, got, 3 * V) == 0, "tied %d: the counted engine's logits differ", tied);
        kvp_engine_free(e2);
        int embd = pw_slot(r.m->tok_embd.data), head = pw_slot(r.m->output.data), once = 1;
        CHECK_MSG(pw_prepared[embd] == 1 && pw_released[embd] == 1, "tied %d: the embedding prepared %d, released %d",
                  tied, pw_prepared[embd], pw_released[embd]);
        CHECK_MSG(tied ? head == embd : pw_prepared[head] == 1 && pw_released[head] == 1,
                  "tied %d: the head prepared %d, released %d", tied, pw_prepared[head], pw_released[head]);
        for (int i = 0; i < pw_n; i++) /* every other weight once too (absent ones, data NULL, are released only) */
            once &= !pw_data[i] || (pw_prepared[i] == 1 && pw_released[i] == 1);
        CHECK_MSG(once && pw_n > 10, "tied %d: %d weights, not each prepared and released once", tied, pw_n);
        kvp_kvcache_seq_free(r.kc, s1);
        kvp_kvcache_seq_free(r.kc, s2);
        rig_close(&r);
    }
}

/* ---- greedy rows as ids (KVP_LOGITS_ARGMAX, _ALL) ----
 *
 * One step of four sequences of 3 tokens asking for every row, then steps
 * of the same tokens on fresh sequences mixing rows and ids: the rows
 * asked for are the first step's, packed in order, and each id the argmax
 * of its row, through the CPU backend's argmax_rows and through a backend
 * without it (the engine's host fallback). */
enum { AM_V = 96 };
static const uint32_t am_tok[4][3] = {{5, 42, 7}, {11, 3, 60}, {23, 8, 91}, {77, 2, 30}};

/* wants[4]; all: the reference's 12 rows (sequence i's token j at 3i + j) */
static void argmax_step(rig *r, kvp_engine *e, const int *wants, const float *all, const char *how)
{
    kvp_err err = {0};
    int sq[4];
    uint32_t id[4][3];
    kvp_step_seq st[4];
    memset(id, 0xff, sizeof id);
    for (int i = 0; i < 4; i++) {
        sq[i] = kvp_kvcache_seq_new(r->kc, &err);
        st[i] = (kvp_step_seq){.seq = sq[i], .tokens = am_tok[i], .n_tokens = 3, .want = wants[i], .argmax = id[i]};
    }
    float got[12 * AM_V];
    int rows = kvp_engine_step(e, st, 4, got, &err), at = 0, bad = 0;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++) {
            const float *ref = all + (size_t)(3 * i + j) * AM_V;
            int w = wants[i], last = j == 2;
            if (w == KVP_LOGITS_ALL || (w == KVP_LOGITS_LAST && last))
                bad += max_abs_diff(got + (size_t)at++ * AM_V, ref, AM_V) != 0;
            else if (w == KVP_LOGITS_ARGMAX_ALL || (w == KVP_LOGITS_ARGMAX && last))
                bad += id[i][w == KVP_LOGITS_ARGMAX ? 0 : j] != kvp_argmax_f32(ref, AM_V);
        }
    CHECK_MSG(rows == at && bad == 0, "%s: %d rows for %d, %d rows or ids wrong", how, rows, at, bad);
    for (int i = 0; i < 4; i++) /* an ARGMAX sequence's id 0 only, a rows' sequence none */
        for (int j = wants[i] == KVP_LOGITS_ARGMAX_ALL ? 3 : wants[i] == KVP_LOGITS_ARGMAX ? 1 : 0; j < 3; j++)
            CHECK_MSG(id[i][j] == UINT32_MAX, "%s: sequence %d: id %d written, not its own", how, i, j);
    for (int i = 0; i < 4; i++)
        kvp_kvcache_seq_free(r->kc, sq[i]);
}

static void test_argmax_want(const char *dir)
{
    tiny_cfg c = {.n_layer = 2, .n_embd = 128, .n_ff = 320, .n_head = 4, .n_head_kv = 2, .n_vocab = AM_V,
                  .wtype = KVP_DTYPE_Q8_0, .tied = 1};
    char path[512];
    rig r;
    if (tiny_open(&r, dir, "argmax.gguf", &c, KVP_DTYPE_F16, 64, 4, path) < 0)
        return;
    kvp_err err = {0};
    int sq[4];
    kvp_step_seq st[4];
    for (int i = 0; i < 4; i++) {
        sq[i] = kvp_kvcache_seq_new(r.kc, &err);
        st[i] = (kvp_step_seq){.seq = sq[i], .tokens = am_tok[i], .n_tokens = 3, .want = KVP_LOGITS_ALL};
    }
    float all[12 * AM_V];
    CHECK_EQ_I64(kvp_engine_step(r.e, st, 4, all, &err), 12);
    for (int i = 0; i < 4; i++)
        kvp_kvcache_seq_free(r.kc, sq[i]);
    /* the test tells ids apart only where they differ: a sequence's last
     * token from the others', and the tokens of one sequence */
    uint32_t g[12];
    for (int i = 0; i < 12; i++)
        g[i] = kvp_argmax_f32(all + (size_t)i * AM_V, AM_V);
    CHECK_MSG(g[2] != g[5] && g[2] != g[8] && g[2] != g[11] && g[5] != g[11] && (g[0] != g[1] || g[1] != g[2]) &&
                  (g[9] != g[10] || g[10] != g[11]),
              "greedy tokens too alike to test with: %u %u %u / %u %u %u / %u %u %u / %u %u %u", g[0], g[1], g[2], g[3],
              g[4], g[5], g[6], g[7], g[8], g[9], g[10], g[11]);

    const int mix_a[4] = {KVP_LOGITS_ARGMAX, KVP_LOGITS_LAST, KVP_LOGITS_ALL, KVP_LOGITS_ARGMAX};
    const int mix_b[4] = {KVP_LOGITS_ARGMAX_ALL, KVP_LOGITS_ALL, KVP_LOGITS_LAST, KVP_LOGITS_ARGMAX_ALL};
    const int ids_only[4] = {KVP_LOGITS_ARGMAX, KVP_LOGITS_ARGMAX_ALL, KVP_LOGITS_NONE, KVP_LOGITS_ARGMAX};
    kvp_backend_ops ops = *r.be->ops;
    ops.argmax_rows = NULL;
    kvp_backend plain = {.ops = &ops, .impl = r.be->impl};
    kvp_engine *e2 = NULL;
    CHECK(kvp_engine_create(&e2, r.m, &plain, r.kc, &err) == 0);
    for (int k = 0; k < 2; k++) {
        kvp_engine *e = k ? e2 : r.e;
        const char *how = k ? "the host fallback" : "argmax_rows";
        if (!e)
            continue;
        argmax_step(&r, e, mix_a, all, how);
        argmax_step(&r, e, mix_b, all, how);
        argmax_step(&r, e, ids_only, all, how);
    }
    kvp_engine_free(e2);

    /* an id with nowhere to go: refused before anything grows */
    int s = kvp_kvcache_seq_new(r.kc, &err);
    for (int w = KVP_LOGITS_ARGMAX; w <= KVP_LOGITS_ARGMAX_ALL; w++) {
        kvp_step_seq bad = {.seq = s, .tokens = am_tok[0], .n_tokens = 3, .want = w};
        CHECK_EQ_I64(kvp_engine_step(r.e, &bad, 1, NULL, &err), KVP_EINVAL);
        CHECK_EQ_I64(kvp_kvcache_seq_len(r.kc, s), 0);
    }
    kvp_kvcache_seq_free(r.kc, s);
    rig_close(&r);
}

static void test_tiny(const char *dir, int wtype, int tied, uint32_t n_head, uint32_t n_head_kv, int kv_dtype,
                      double tol)
{
    tiny_cfg c = {.n_layer = 2, .n_embd = 128, .n_ff = 320, .n_head = n_head, .n_head_kv = n_head_kv,
                  .n_vocab = 96, .wtype = wtype, .tied = tied};
    char path[512];
    rig r;
    if (tiny_open(&r, dir, "tiny.gguf", &c, kv_dtype, 64, 4, path) < 0)
        return;
    CHECK_EQ_U64(r.m->cfg.tied_embeddings, tied);
    enum { N = 21 };
    uint32_t tok[N];
    for (int i = 0; i < N; i++)
        tok[i] = (uint32_t)(i * 37 + 5) % c.n_vocab;
    uint32_t V = c.n_vocab;
    float *want = malloc(sizeof(float) * N * V), *got = malloc(sizeof(float) * N * V);
    naive_forward(r.m, tok, N, want);

    /* 1. whole prompt in one step, every row */
    kvp_err err = {0};
    int s = kvp_kvcache_seq_new(r.kc, &err);
    kvp_step_seq ss = {.seq = s, .tokens = tok, .n_tokens = N, .want = KVP_LOGITS_ALL};
    CHECK_EQ_I64(kvp_engine_step(r.e, &ss, 1, got, &err), N);
    double e1 = rel_err(want, got, (size_t)N * V);
    CHECK_MSG(e1 < tol, "%s%s %u/%u heads kv %s: one step vs naive: max rel %g", kvp_dtype_name((uint32_t)wtype),
              tied ? " tied" : "", n_head, n_head_kv, kvp_dtype_name((uint32_t)kv_dtype), e1);

    /* 1b. the hidden states behind those rows, projected again, give the
     *     very logits (Medusa heads draft through this); the rows are gone
     *     once anything else used the buffers */
    float *hid = malloc(sizeof(float) * N * c.n_embd), *proj = malloc(sizeof(float) * N * V);
    CHECK_EQ_I64(kvp_engine_hidden(r.e, hid, N + 1, &err), KVP_EINVAL);
    CHECK(kvp_engine_hidden(r.e, hid, N, &err) == 0);
    CHECK(kvp_engine_project(r.e, hid, N, proj, &err) == 0);
    CHECK(memcmp(proj, got, sizeof(float) * N * V) == 0);
    CHECK_EQ_I64(kvp_engine_hidden(r.e, hid, 1, &err), KVP_EINVAL);
    CHECK_EQ_U64(kvp_engine_n_embd(r.e), c.n_embd);
    free(hid);
    free(proj);

    /* 2. token by token in a second sequence, batched beside a third that
     *    takes the prompt in uneven chunks */
    int s2 = kvp_kvcache_seq_new(r.kc, &err), s3 = kvp_kvcache_seq_new(r.kc, &err);
    float *row2 = malloc(sizeof(float) * 2 * V);
    double e2 = 0, e2s = 0; /* against the naive pass, against the one-step logits */
    uint32_t done3 = 0;
    for (uint32_t t = 0; t < N; t++) {
        uint32_t k3 = done3 < N ? (t % 3 + 1 < N - done3 ? t % 3 + 1 : N - done3) : 0;
        kvp_step_seq b[2] = {{.seq = s2, .tokens = tok + t, .n_tokens = 1, .want = KVP_LOGITS_LAST},
                             {.seq = s3, .tokens = tok + done3, .n_tokens = k3, .want = KVP_LOGITS_LAST}};
        int rows = kvp_engine_step(r.e, b, k3 ? 2 : 1, row2, &err);
        CHECK_EQ_I64(rows, k3 ? 2 : 1);
        double d2 = rel_err(want + (size_t)t * V, row2, V), d2s = rel_err(got + (size_t)t * V, row2, V);
        e2 = d2 > e2 ? d2 : e2;
        e2s = d2s > e2s ? d2s : e2s;
        if (k3) {
            done3 += k3;
            double d3 = rel_err(want + (size_t)(done3 - 1) * V, row2 + V, V);
            e2 = d3 > e2 ? d3 : e2;
        }
    }
    CHECK_MSG(e2 < tol, "decode + batched chunks vs naive: max rel %g", e2);
    CHECK_MSG(e2s < tol / 5, "decode vs one step: max rel %g", e2s);

    /* 3. the portable kernels (and AVX2 without VNNI) give the same logits
     *    within rounding */
    rig p;
    unsigned fl = wtype == KVP_DTYPE_Q4_1 ? KVP_CPU_NO_VNNI : KVP_CPU_PORTABLE;
    if (rig_open(&p, path, 1, fl, kv_dtype, 64, 4) == 0) {
        int sp = kvp_kvcache_seq_new(p.kc, &err);
        kvp_step_seq sp1 = {.seq = sp, .tokens = tok, .n_tokens = N, .want = KVP_LOGITS_ALL};
        CHECK_EQ_I64(kvp_engine_step(p.e, &sp1, 1, want, &err), N);
        double e3 = rel_err(want, got, (size_t)N * V);
        CHECK_MSG(e3 < tol / 10, "%s vs %s: max rel %g", kvp_backend_cpu_isa(p.be), kvp_backend_cpu_isa(r.be), e3);
        rig_close(&p);
    }
    free(row2);
    free(want);
    free(got);
    rig_close(&r);
    unlink(path);
}

/* kvp_engine_set_cancel: a raised flag stops a prompt before its next
 * chunk with KVP_EINTR (before the first here: nothing computed), a
 * lowered one or none lets it run. */
static void test_prefill_cancel(const char *dir)
{
    tiny_cfg c = {.n_layer = 2, .n_embd = 64, .n_ff = 128, .n_head = 4, .n_head_kv = 2, .n_vocab = 64,
                  .wtype = KVP_DTYPE_Q8_0, .tied = 1};
    char path[512];
    rig r;
    if (tiny_open(&r, dir, "tiny_cancel.gguf", &c, KVP_DTYPE_F16, 32, 4, path) < 0)
        return;
    kvp_err err = {0};
    uint32_t a[14];
    for (int i = 0; i < 14; i++)
        a[i] = (uint32_t)(i * 5 + 2) % 64;
    float la[64];
    volatile sig_atomic_t flag = 1;
    int s = kvp_kvcache_seq_new(r.kc, &err);
    kvp_engine_set_cancel(r.e, &flag);
    CHECK_EQ_I64(kvp_engine_prefill(r.e, s, a, 14, 4, la, &err), KVP_EINTR);
    CHECK_MSG(strstr(err.msg, "stopped after 0 of the prompt's 14 tokens") != NULL, "%s", err.msg);
    CHECK_EQ_U64(kvp_kvcache_seq_len(r.kc, s), 0);
    flag = 0;
    CHECK(kvp_engine_prefill(r.e, s, a, 14, 4, la, &err) == 0 && kvp_kvcache_seq_len(r.kc, s) == 14);
    flag = 1;
    kvp_engine_set_cancel(r.e, NULL);
    int s2 = kvp_kvcache_seq_new(r.kc, &err);
    CHECK(kvp_engine_prefill(r.e, s2, a, 14, 4, la, &err) == 0 && kvp_kvcache_seq_len(r.kc, s2) == 14);
    rig_close(&r);
    unlink(path);
}

/* Prefix sharing: a second prompt with the same start computes only its tail,
 * and its logits equal a private computation. */
static void test_prefix_sharing(const char *dir)
{
    tiny_cfg c = {.n_layer = 2, .n_embd = 64, .n_ff = 128, .n_head = 4, .n_head_kv = 2, .n_vocab = 64,
                  .wtype = KVP_DTYPE_Q8_0, .tied = 1};
    char path[512];
    rig r;
    if (tiny_open(&r, dir, "tiny_prefix.gguf", &c, KVP_DTYPE_F16, 32, 4, path) < 0)
        return;
    kvp_err err = {0};
    uint32_t a[14], b[14];
    for (int i = 0; i < 14; i++)
        a[i] = b[i] = (uint32_t)(i * 7 + 1) % 64;
    b[10] = 3, b[13] = 9; /* shares 2 full blocks of 4, then differs inside block 2 */
    float la[64], lb[64], lpriv[64];
    int sa = kvp_kvcache_seq_new(r.kc, &err), sb = kvp_kvcache_seq_new(r.kc, &err);
    CHECK(kvp_engine_prefill(r.e, sa, a, 14, 5, la, &err) == 0);
    kvp_kvcache_stats st0, st1;
    kvp_kvcache_get_stats(r.kc, &st0);
    CHECK(kvp_engine_prefill(r.e, sb, b, 14, 0, lb, &err) == 0);
    kvp_kvcache_get_stats(r.kc, &st1);
    CHECK_EQ_U64(st1.prefix_blocks - st0.prefix_blocks, 2);       /* blocks 0, 1 reused */
    CHECK_EQ_U64(st0.n_free - st1.n_free, 2);                      /* only blocks 2, 3 are new */
    CHECK_EQ_U64(kvp_kvcache_seq_blocks(r.kc, sa)[1], kvp_kvcache_seq_blocks(r.kc, sb)[1]);
    CHECK_EQ_U64(kvp_kvcache_block_refs(r.kc, kvp_kvcache_seq_blocks(r.kc, sa)[0]), 2);
    /* the same prompt b computed privately in a fresh cache */
    rig q;
    if (rig_open(&q, path, unit_threads(2), 0, KVP_DTYPE_F16, 32, 4) == 0) {
        int sq = kvp_kvcache_seq_new(q.kc, &err);
        kvp_step_seq one = {.seq = sq, .tokens = b, .n_tokens = 14, .want = KVP_LOGITS_LAST};
        CHECK_EQ_I64(kvp_engine_step(q.e, &one, 1, lpriv, &err), 1);
        CHECK_MSG(max_abs_diff(lb, lpriv, 64) < 1e-4, "shared prefix vs private: %g", max_abs_diff(lb, lpriv, 64));
        rig_close(&q);
    }
    /* fork + copy-on-write: the fork continues differently, the original's
     * next logits are unchanged */
    int sf = kvp_kvcache_seq_fork(r.kc, sa, &err);
    CHECK(sf >= 0);
    uint32_t ta = 5, tf = 6;
    float l1[64], l2[64];
    kvp_step_seq f1 = {.seq = sf, .tokens = &tf, .n_tokens = 1, .want = KVP_LOGITS_LAST};
    CHECK_EQ_I64(kvp_engine_step(r.e, &f1, 1, l1, &err), 1);
    kvp_kvcache_get_stats(r.kc, &st1);
    CHECK_EQ_U64(st1.cow_copies, 1);
    kvp_step_seq a1 = {.seq = sa, .tokens = &ta, .n_tokens = 1, .want = KVP_LOGITS_LAST};
    CHECK_EQ_I64(kvp_engine_step(r.e, &a1, 1, l2, &err), 1);
    if (rig_open(&q, path, unit_threads(2), 0, KVP_DTYPE_F16, 32, 4) == 0) {
        uint32_t a2[15];
        memcpy(a2, a, sizeof a);
        a2[14] = ta;
        int sq = kvp_kvcache_seq_new(q.kc, &err);
        kvp_step_seq one = {.seq = sq, .tokens = a2, .n_tokens = 15, .want = KVP_LOGITS_LAST};
        CHECK_EQ_I64(kvp_engine_step(q.e, &one, 1, lpriv, &err), 1);
        CHECK_MSG(max_abs_diff(l2, lpriv, 64) < 1e-4, "after fork + cow vs private: %g", max_abs_diff(l2, lpriv, 64));
        rig_close(&q);
    }
    /* running out of blocks is an error that names the numbers, and the
     * sequence is left as it was */
    uint32_t many[200] = {0};
    uint32_t before = kvp_kvcache_seq_len(r.kc, sb);
    kvp_step_seq big = {.seq = sb, .tokens = many, .n_tokens = 200, .want = KVP_LOGITS_NONE};
    CHECK_EQ_I64(kvp_engine_step(r.e, &big, 1, NULL, &err), KVP_ELIMIT);
    CHECK(strstr(err.msg, "out of blocks") != NULL && strstr(err.msg, "of 32 blocks") != NULL);
    CHECK_EQ_U64(kvp_kvcache_seq_len(r.kc, sb), before);
    /* a bad token id fails cleanly too */
    uint32_t bad = 64;
    kvp_step_seq bs1 = {.seq = sb, .tokens = &bad, .n_tokens = 1, .want = KVP_LOGITS_LAST};
    CHECK(kvp_engine_step(r.e, &bs1, 1, l1, &err) == KVP_EINVAL);
    CHECK_EQ_U64(kvp_kvcache_seq_len(r.kc, sb), before);
    rig_close(&r);
    unlink(path);
}

/* KV written for one model is refused by another; read back by the same
 * model it gives the same next logits as the cache it came from. */
static void test_seqio(const char *dir)
{
    tiny_cfg c = {.n_layer = 2, .n_embd = 64, .n_ff = 128, .n_head = 4, .n_head_kv = 2, .n_vocab = 64,
                  .wtype = KVP_DTYPE_Q8_0, .tied = 1};
    char pa[512], pb[512], ps[512];
    snprintf(pa, sizeof pa, "%s/a.gguf", dir);
    snprintf(pb, sizeof pb, "%s/b.gguf", dir);
    snprintf(ps, sizeof ps, "%s/s.kvp", dir);
    size_t len;
    uint8_t *f = tiny_gguf(&c, &len);
    CHECK(write_file(pa, f, len) == 0);
    free(f);
    c.n_head_kv = 1;
    f = tiny_gguf(&c, &len);
    CHECK(write_file(pb, f, len) == 0);
    free(f);
    rig a;
    if (rig_open(&a, pa, unit_threads(2), 0, KVP_DTYPE_F16, 32, 4) < 0) {
        CHECK(0);
        return;
    }
    kvp_err err = {0};
    uint32_t t1[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, t2[6] = {1, 2, 3, 4, 9, 9};
    /* records a reader takes: a defined state, sampling a run accepts (kvp(5)) */
    const kvp_sampling smp = {.top_p = 1, .repeat_penalty = 1};
    kvp_seqio_seq ss[2] = {{.rec = {.id = 7, .state = KVP_SEQ_PREFILLED, .sampling = smp}},
                           {.rec = {.id = 8, .state = KVP_SEQ_PREFILLED, .sampling = smp}}};
    ss[0].handle = kvp_kvcache_seq_new(a.kc, &err);
    ss[1].handle = kvp_kvcache_seq_new(a.kc, &err);
    float l0[64], l1[64];
    CHECK(kvp_engine_prefill(a.e, ss[0].handle, t1, 10, 0, l0, &err) == 0);
    CHECK(kvp_engine_prefill(a.e, ss[1].handle, t2, 6, 0, l0, &err) == 0);
    kvp_out out;
    kvp_writer *w = NULL;
    kvp_writer_opts wo = {.producer = "test_engine"};
    memcpy(wo.fingerprint, a.m->fingerprint, KVP_FINGERPRINT_SIZE);
    uint64_t nb = 0, nr = 0;
    CHECK(kvp_out_open(&out, ps, &err) == 0 && kvp_writer_open(&w, &out, &wo, &err) == 0 &&
          kvp_seqio_write(w, a.kc, ss, 2, &nb, &nr, &err) == 0 && kvp_writer_finish(w, &err) == 0 &&
          kvp_out_commit(&out, &err) == 0);
    kvp_writer_free(w);
    CHECK_EQ_U64(nb, 4); /* seq 7: 3 blocks; seq 8: its first block is a reference */
    CHECK_EQ_U64(nr, 1);
    /* next logits after one more token, from the live cache */
    uint32_t nx = 11;
    kvp_step_seq st = {.seq = ss[0].handle, .tokens = &nx, .n_tokens = 1, .want = KVP_LOGITS_LAST};
    CHECK_EQ_I64(kvp_engine_step(a.e, &st, 1, l0, &err), 1);
    /* the same model reads it back */
    kvp_in in;
    kvp_reader *r = NULL;
    kvp_kvcache *kc = NULL;
    kvp_seqio_seq *got = NULL;
    uint32_t n = 0;
    kvp_kvcache_opts o;
    kvp_kvcache_opts_init(&o);
    o.n_blocks = 16;
    CHECK(kvp_in_open(&in, ps, &err) == 0 && kvp_reader_open(&r, &in, &err) == 0);
    CHECK(kvp_seqio_read(r, ps, a.m, a.be, &o, &kc, &got, &n, NULL, &err) == 0);
    kvp_reader_free(r);
    kvp_in_close(&in);
    CHECK_EQ_U64(n, 2);
    if (n == 2) {
        CHECK_EQ_U64(got[0].rec.id, 7);
        CHECK_EQ_U64(kvp_kvcache_seq_len(kc, got[1].handle), 6);
        /* the shared first block is shared again */
        CHECK_EQ_U64(kvp_kvcache_seq_blocks(kc, got[0].handle)[0], kvp_kvcache_seq_blocks(kc, got[1].handle)[0]);
        kvp_engine *e2;
        CHECK(kvp_engine_create(&e2, a.m, a.be, kc, &err) == 0);
        kvp_step_seq st2 = {.seq = got[0].handle, .tokens = &nx, .n_tokens = 1, .want = KVP_LOGITS_LAST};
        CHECK_EQ_I64(kvp_engine_step(e2, &st2, 1, l1, &err), 1);
        CHECK_MSG(max_abs_diff(l0, l1, 64) == 0, "reloaded KV gives other logits: %g", max_abs_diff(l0, l1, 64));
        kvp_engine_free(e2);
    }
    kvp_seqio_seqs_free(got, n);
    kvp_kvcache_free(kc);
    /* another model refuses it */
    kvp_model *mb;
    CHECK(kvp_model_load(&mb, pb, &err) == 0);
    CHECK(memcmp(mb->fingerprint, a.m->fingerprint, KVP_FINGERPRINT_SIZE) != 0);
    CHECK(kvp_in_open(&in, ps, &err) == 0 && kvp_reader_open(&r, &in, &err) == 0);
    CHECK_EQ_I64(kvp_seqio_read(r, ps, mb, a.be, &o, &kc, &got, &n, NULL, &err), KVP_EMISMATCH);
    CHECK(strstr(err.msg, "another model") != NULL);
    kvp_reader_free(r);
    kvp_in_close(&in);
    /* and another KV dtype is refused with both names */
    o.dtype = KVP_DTYPE_BF16;
    CHECK(kvp_in_open(&in, ps, &err) == 0 && kvp_reader_open(&r, &in, &err) == 0);
    CHECK_EQ_I64(kvp_seqio_read(r, ps, a.m, a.be, &o, &kc, &got, &n, NULL, &err), KVP_EMISMATCH);
    CHECK_MSG(strstr(err.msg, "a KV block of dtype f16, where this run's cache is bf16") != NULL, "%s", err.msg);
    kvp_reader_free(r);
    kvp_in_close(&in);
    kvp_model_free(mb);
    /* Read one sequence at a time (decode after a pipe): each comes with all
     * its tokens; a reference to a block the cache has let go stops the
     * loading (the caller computes the rest), and so does a full cache. */
    for (int run = 0; run < 3; run++) {
        int small = run == 1, cached = run == 2;
        o.dtype = KVP_DTYPE_F16;
        o.n_blocks = small ? 2 : 16;
        o.no_cache = !cached;
        kvp_seqio_reader *sr = NULL;
        kvp_seqio_seq q;
        const uint32_t *tok;
        CHECK(kvp_in_open(&in, ps, &err) == 0 && kvp_reader_open(&r, &in, &err) == 0);
        CHECK(kvp_seqio_reader_open(&sr, r, ps, a.m, a.be, &o, &err) == 0);
        CHECK_EQ_I64(kvp_seqio_reader_next(sr, &q, &tok, &err), 1);
        kvp_kvcache *kc2 = kvp_seqio_reader_take_cache(sr);
        CHECK(kc2 != NULL && q.rec.id == 7 && q.rec.n_tokens == 10 && memcmp(tok, t1, sizeof t1) == 0);
        /* 3 blocks of 4 into a pool of 2: loading stops, nothing fails */
        CHECK_EQ_U64(kvp_kvcache_seq_len(kc2, q.handle), small ? 8 : 10);
        /* its blocks go (or, caching, stay findable): seq 8's reference to
         * its first block finds nothing (or finds it) */
        kvp_kvcache_seq_free(kc2, q.handle);
        CHECK_EQ_I64(kvp_seqio_reader_next(sr, &q, &tok, &err), 1);
        CHECK(q.rec.id == 8 && q.rec.n_tokens == 6 && memcmp(tok, t2, sizeof t2) == 0);
        CHECK_EQ_U64(kvp_kvcache_seq_len(kc2, q.handle), cached ? 6 : 0);
        CHECK_EQ_I64(kvp_seqio_reader_next(sr, &q, &tok, &err), 0);
        CHECK_EQ_I64(kvp_seqio_reader_next(sr, &q, &tok, &err), 0); /* and stays at the end */
        kvp_seqio_reader_free(sr);
        kvp_kvcache_free(kc2);
        kvp_reader_free(r);
        kvp_in_close(&in);
    }
    rig_close(&a);
    unlink(pa);
    unlink(pb);
    unlink(ps);
}

/* ---- scaled schemes: matmul on stored bytes against dequantize + f32 ---- */

/* A NaN in token 0's input makes all of token 0's outputs non-finite and
 * leaves the other tokens' finite: the 8-bit activations' max dropped a
 * NaN (a model's NaN norm weight), so decode printed text from it and
 * exited 0 (the step's non-finite check saw nothing).  1 and 6 tokens (a
 * decode step, a verify step's tiles). */
static void check_nan_input(kvp_backend *be, const kvp_weight *w, const char *what)
{
    enum { NT = 6 };
    uint32_t ni = w->n_in, no = w->n_out;
    float *x = malloc(sizeof(float) * NT * ni), *y = malloc(sizeof(float) * NT * no);
    kvp_err err = {0};
    CHECK(x && y);
    uint64_t rng = 0x6e616e;
    for (uint32_t i = 0; x && i < NT * ni; i++)
        x[i] = unit_frand(&rng);
    if (x)
        x[ni / 2 + 3] = NAN;
    for (uint32_t nt = 1; x && y && nt <= NT; nt += NT - 1) {
        rig_reserve(be, nt, ni, 0, 0, NULL);
        CHECK_MSG(be->ops->matmul(be, w, x, y, nt, &err) == 0, "%s", err.msg);
        uint32_t finite0 = 0, bad_rest = 0;
        for (uint32_t r = 0; r < no; r++)
            finite0 += isfinite(y[r]) != 0;
        for (uint32_t i = no; i < nt * no; i++)
            bad_rest += !isfinite(y[i]);
        CHECK_MSG(finite0 == 0 && bad_rest == 0, "%s %s, %u tokens: %u of %u outputs finite past a NaN input, %u of "
                  "the other tokens' not", kvp_backend_cpu_isa(be), what, nt, finite0, no, bad_rest);
    }
    free(x), free(y);
}

/* check_nan_input for GGUF's Q8_0 and Q4_1 (made here: a scale of 1/64,
 * random quants) on every kernel set. */
static void test_nan_input_ggml(void)
{
    enum { NO = 5, NI = 256, NB = NI / 32 };
    static uint8_t q8[NO * NB * 34], q41[NO * NB * 20];
    uint64_t rng = 0x71;
    uint16_t d = kvp_f32_to_f16(1.0f / 64), m = kvp_f32_to_f16(-0.25f);
    for (int b = 0; b < NO * NB; b++) {
        memcpy(q8 + b * 34, &d, 2);
        for (int j = 0; j < 32; j++)
            q8[b * 34 + 2 + j] = (uint8_t)(int8_t)(unit_frand(&rng) * 100);
        memcpy(q41 + b * 20, &d, 2), memcpy(q41 + b * 20 + 2, &m, 2);
        for (int j = 0; j < 16; j++)
            q41[b * 20 + 4 + j] = (uint8_t)((unit_frand(&rng) + 1) * 127.99f);
    }
    static const unsigned flags[] = {0, KVP_CPU_PORTABLE, KVP_CPU_NO_VNNI};
    for (size_t f = 0; f < sizeof flags / sizeof *flags; f++) {
        kvp_backend *be = rig_backend(flags[f]);
        if (!be)
            continue;
        kvp_err err = {0};
        kvp_weight w8 = {.name = "q8_0", .dtype = KVP_DTYPE_Q8_0, .n_in = NI, .n_out = NO, .row_bytes = NB * 34,
                         .data = q8},
                   w4 = {.name = "q4_1", .dtype = KVP_DTYPE_Q4_1, .n_in = NI, .n_out = NO, .row_bytes = NB * 20,
                         .data = q41};
        CHECK_MSG(be->ops->prepare_weight(be, &w8, &err) == 0 && be->ops->prepare_weight(be, &w4, &err) == 0,
                  "prepare: %s", err.msg);
        check_nan_input(be, &w8, "q8_0");
        check_nan_input(be, &w4, "q4_1");
        be->ops->release_weight(be, &w8);
        be->ops->release_weight(be, &w4);
        kvp_backend_free(be);
    }
}

/* y[t][r] for a weight quantized by lib/quant.c with spec, through the
 * backend's matmul (portable or SIMD kernels), against the dequantized
 * weights times x in double. */
static void test_scaled_one(unsigned flags, const kvp_quant_spec *spec)
{
    enum { NO = 6, NI = 256, NT = 19 }; /* 19 tokens: whole tiles of 4 and 8, and leftovers */
    static float w[NO * NI], deq[NO * NI], x[NT * NI], y[NT * NO];
    for (int i = 0; i < NO * NI; i++)
        w[i] = frand() * (1 + (i / NI)); /* rows of different ranges */
    for (int i = 0; i < NT * NI; i++)
        x[i] = frand();
    kvp_err err = {0};
    kvp_tensor_rec rec;
    memset(&rec, 0, sizeof rec);
    snprintf(rec.name, sizeof rec.name, "w");
    rec.n_dim = 2, rec.shape[0] = NO, rec.shape[1] = NI;
    if (kvp_quant_plan(&rec, spec, &err) < 0) {
        CHECK_MSG(0, "plan: %s", err.msg);
        return;
    }
    uint8_t *data = calloc(1, rec.data_bytes), *sc = calloc(1, rec.scales_bytes + 4);
    uint8_t *zp = calloc(1, rec.zeros_bytes + 4);
    CHECK(kvp_quant_tensor(&rec, w, data, sc, rec.zeros_bytes ? zp : NULL, NULL, NULL, &err) == 0);
    CHECK(kvp_dequant_tensor(&rec, data, sc, rec.zeros_bytes ? zp : NULL, deq, NULL, &err) == 0);
    kvp_weight kw = {.name = "w", .dtype = (int)rec.dtype, .n_in = NI, .n_out = NO, .data = data,
                     .scales = (const float *)sc, .zeros = rec.zeros_bytes ? (const float *)zp : NULL};
    kw.row_bytes = (uint64_t)kvp_dtype_row_bytes(rec.dtype, NI);
    kw.group = rec.scheme == KVP_SCHEME_GROUP ? rec.group : NI;
    kw.scale_stride = rec.scheme == KVP_SCHEME_TENSOR ? 0 : rec.scheme == KVP_SCHEME_CHANNEL ? 1 : NI / rec.group;
    kvp_backend *be;
    CHECK(kvp_backend_cpu_create(&be, unit_threads(2), flags, &err) == 0);
    CHECK_MSG(be->ops->prepare_weight(be, &kw, &err) == 0, "prepare: %s", err.msg);
    rig_reserve(be, NT, NI, 0, 0, NULL);
    double worst = 0;
    for (uint32_t nt = 1; nt <= NT; nt += 2) {
        CHECK_MSG(be->ops->matmul(be, &kw, x, y, nt, &err) == 0, "%s", err.msg);
        for (uint32_t t = 0; t < nt; t++)
            for (uint32_t r = 0; r < NO; r++) {
                double ref = 0, mag = 0;
                for (uint32_t i = 0; i < NI; i++) {
                    ref += (double)deq[r * NI + i] * x[t * NI + i];
                    mag += fabs((double)deq[r * NI + i] * x[t * NI + i]);
                }
                double e = fabs(y[t * NO + r] - ref) / mag;
                worst = e > worst ? e : worst;
            }
    }
    /* f32 activations (fp8): rounding only; 8-bit activations (int): about
     * 1/254 of each product at worst, far less on average */
    double tol = rec.dtype == KVP_DTYPE_FP8_E4M3 ? 1e-5 : 4e-3;
    CHECK_MSG(worst < tol, "%s %s scheme %u group %u%s: max error %g of sum |w x|", kvp_backend_cpu_isa(be),
              kvp_dtype_name(rec.dtype), rec.scheme, rec.group, spec->asym ? " asym" : "", worst);
    check_nan_input(be, &kw, kvp_dtype_name(rec.dtype));
    be->ops->release_weight(be, &kw);
    kvp_backend_free(be);
    free(data), free(sc), free(zp);
}

static void test_scaled(void)
{
    const kvp_quant_spec specs[] = {
        {KVP_DTYPE_FP8_E4M3, KVP_SCHEME_TENSOR, 0, KVP_DTYPE_F32, 0},
        {KVP_DTYPE_FP8_E4M3, KVP_SCHEME_CHANNEL, 0, KVP_DTYPE_F32, 0},
        {KVP_DTYPE_FP8_E4M3, KVP_SCHEME_GROUP, 16, KVP_DTYPE_F32, 0},
        {KVP_DTYPE_I8, KVP_SCHEME_CHANNEL, 0, KVP_DTYPE_F32, 0},
        {KVP_DTYPE_I8, KVP_SCHEME_TENSOR, 0, KVP_DTYPE_F32, 0},
        {KVP_DTYPE_I8, KVP_SCHEME_GROUP, 64, KVP_DTYPE_F32, 1},
        {KVP_DTYPE_I4, KVP_SCHEME_GROUP, 128, KVP_DTYPE_F32, 0},
        {KVP_DTYPE_I4, KVP_SCHEME_GROUP, 32, KVP_DTYPE_F32, 1},
        {KVP_DTYPE_I4, KVP_SCHEME_CHANNEL, 0, KVP_DTYPE_F32, 0},
    };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        test_scaled_one(KVP_CPU_PORTABLE, &specs[i]);
        test_scaled_one(0, &specs[i]);
        test_scaled_one(KVP_CPU_NO_VNNI, &specs[i]);
    }
}

/* ---- KVP model files (what quantize writes) ---- */

static int convert_to(const char *in, const char *out, const kvp_convert_opts *o, int zstd, uint8_t fp[16],
                      kvp_err *err)
{
    kvp_convert *cv;
    int rc = kvp_convert_open(&cv, in, err);
    if (rc < 0)
        return rc;
    if ((rc = kvp_convert_plan(cv, o, err)) == 0) {
        kvp_out ko;
        if ((rc = kvp_out_open(&ko, out, err)) == 0) {
            rc = kvp_convert_write(cv, &ko, zstd, "test_engine", NULL, NULL, NULL, err);
            rc = rc ? (kvp_out_abort(&ko), rc) : kvp_out_commit(&ko, err);
        }
        kvp_convert_fingerprint(cv, fp);
    }
    kvp_convert_free(cv);
    return rc;
}

/* All logits of a prompt in one step. */
static int run_all(const char *path, unsigned flags, const uint32_t *tok, uint32_t n, float *out, rig *keep)
{
    rig r;
    kvp_err err = {0};
    if (rig_open(&r, path, unit_threads(2), flags, KVP_DTYPE_F32, 64, 4) < 0)
        return -1;
    int s = kvp_kvcache_seq_new(r.kc, &err);
    kvp_step_seq ss = {.seq = s, .tokens = tok, .n_tokens = n, .want = KVP_LOGITS_ALL};
    int rc = kvp_engine_step(r.e, &ss, 1, out, &err);
    if (keep)
        *keep = r;
    else
        rig_close(&r);
    return rc == (int)n ? 0 : -1;
}

/* Every 2-D tensor of m as the engine reads its rows (the row path and the
 * embedding lookup) equals the quantize library's whole-tensor dequantizer,
 * which the golden files check against gguf and ml_dtypes. */
static void check_rows_decode(const kvp_model *m, const char *what)
{
    int bad = 0, seen = 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        const kvp_model_tensor *t = &m->tensors[i];
        const kvp_weight *w = NULL;
        if (strcmp(t->rec.name, "token_embd.weight") == 0)
            w = &m->tok_embd;
        else if (strcmp(t->rec.name, "blk.0.attn_q.weight") == 0)
            w = &m->layers[0].wq;
        else if (strcmp(t->rec.name, "blk.1.ffn_down.weight") == 0)
            w = &m->layers[1].w_down;
        if (!w)
            continue;
        seen++;
        size_t n = (size_t)w->n_out * w->n_in;
        float *ref = malloc(n * sizeof(float)), *row = malloc(w->n_in * sizeof(float));
        kvp_err err = {0};
        CHECK_MSG(kvp_dequant_tensor(&t->rec, t->data, t->scales, t->zeros, ref, NULL, &err) == 0, "%s", err.msg);
        for (uint32_t r = 0; r < w->n_out; r++) {
            CHECK(kvp_cpu_dequant_weight_row(w, r, row) == 0);
            bad += memcmp(row, ref + (size_t)r * w->n_in, w->n_in * sizeof(float)) != 0;
        }
        free(ref), free(row);
    }
    CHECK_MSG(seen == 3 && bad == 0, "%s: %d of 3 tensors seen, %d rows decode otherwise than kvp_dequant_tensor",
              what, seen, bad);
}

static void test_kvp_models(const char *dir)
{
    tiny_cfg c = {.n_layer = 2, .n_embd = 128, .n_ff = 320, .n_head = 4, .n_head_kv = 2, .n_vocab = 96,
                  .wtype = KVP_DTYPE_F32, .tied = 0};
    size_t len;
    uint8_t *file = tiny_gguf(&c, &len);
    char gpath[512], kpath[512];
    snprintf(gpath, sizeof gpath, "%s/src.gguf", dir);
    snprintf(kpath, sizeof kpath, "%s/m.kvp", dir);
    CHECK(write_file(gpath, file, len) == 0);
    free(file);
    enum { N = 13 };
    uint32_t tok[N], V = c.n_vocab;
    for (int i = 0; i < N; i++)
        tok[i] = (uint32_t)(i * 29 + 3) % V;
    float *ref = malloc(sizeof(float) * N * V), *got = malloc(sizeof(float) * N * V);
    float *port = malloc(sizeof(float) * N * V);
    float *naive = malloc(sizeof(float) * N * V);
    rig g;
    if (run_all(gpath, 0, tok, N, ref, &g) < 0) {
        CHECK(0);
        return;
    }
    const struct {
        int to, embed;
        uint32_t scheme, group;
        int asym, zstd;
        double tol; /* against the naive pass over the same stored weights */
    } cases[] = {
        {KVP_CONVERT_KEEP, KVP_CONVERT_KEEP, 0, 0, 0, 0, 0},
        {KVP_CONVERT_KEEP, KVP_CONVERT_KEEP, 0, 0, 0, 3, 0},
        {KVP_DTYPE_F16, KVP_CONVERT_KEEP, 0, 0, 0, 0, 1e-4},
        {KVP_DTYPE_Q8_0, KVP_DTYPE_Q8_0, 0, 0, 0, 0, 0.25},
        {KVP_DTYPE_FP8_E4M3, KVP_CONVERT_KEEP, 0, 0, 0, 0, 1e-4},
        {KVP_DTYPE_FP8_E4M3, KVP_DTYPE_FP8_E4M3, KVP_SCHEME_GROUP, 32, 0, 2, 1e-4},
        {KVP_DTYPE_I8, KVP_DTYPE_I8, 0, 0, 0, 0, 0.25},
        {KVP_DTYPE_I8, KVP_CONVERT_KEEP, KVP_SCHEME_GROUP, 64, 1, 0, 0.25},
        {KVP_DTYPE_I4, KVP_DTYPE_I4, 0, 0, 0, 0, 0.25},
        {KVP_DTYPE_I4, KVP_CONVERT_KEEP, KVP_SCHEME_GROUP, 32, 1, 3, 0.25},
        /* Q5_0 as Q8_0 (backend_cpu_repack.c): 8-bit activations */
        {KVP_DTYPE_Q5_0, KVP_DTYPE_Q5_1, 0, 0, 0, 0, 0.25},
        /* Q5_1: in rows of 16 on VNNI tables (8-bit activations; the tolerance
         * is set below), elsewhere the row path (no dot kernel: rows turned
         * into f32), so f32 math */
        {KVP_DTYPE_Q5_1, KVP_CONVERT_KEEP, 0, 0, 0, 2, 1e-4},
        {KVP_DTYPE_FP8_E5M2, KVP_DTYPE_FP8_E5M2, 0, 0, 0, 0, 1e-4},
        {KVP_DTYPE_FP4_E2M1, KVP_CONVERT_KEEP, 0, 0, 0, 0, 1e-4},
        {KVP_DTYPE_NVFP4, KVP_DTYPE_NVFP4, 0, 0, 0, 0, 1e-4},
        {KVP_DTYPE_MXFP4, KVP_CONVERT_KEEP, 0, 0, 0, 0, 1e-4},
        {KVP_DTYPE_I4, KVP_DTYPE_I8, KVP_SCHEME_GROUP, 16, 1, 0, 1e-4},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        kvp_convert_opts o;
        kvp_convert_opts_init(&o);
        o.to = cases[k].to, o.embed = cases[k].embed, o.scheme = cases[k].scheme, o.group = cases[k].group;
        o.asym = cases[k].asym;
        kvp_err err = {0};
        uint8_t fp[16];
        int rc = convert_to(gpath, kpath, &o, cases[k].zstd, fp, &err);
        CHECK_MSG(rc == 0, "convert case %zu: %s", k, err.msg);
        rig r;
        if (rc < 0 || run_all(kpath, 0, tok, N, got, &r) < 0) {
            CHECK_MSG(0, "case %zu: load or run failed", k);
            continue;
        }
        CHECK_EQ_U64(r.m->format, KVP_MODEL_KVP);
        CHECK_MSG(memcmp(fp, r.m->fingerprint, 16) == 0, "case %zu: fingerprint differs from quantize's", k);
        CHECK_EQ_U64(r.m->copied_bytes > 0, cases[k].zstd > 0); /* in place unless compressed */
        const char *what = o.to == KVP_CONVERT_KEEP ? "keep" : kvp_dtype_name((uint32_t)o.to);
        check_rows_decode(r.m, what);
        /* a kind the fast table multiplies with 8-bit activations and the
         * portable one in f32 */
        int act8_fast = o.to == KVP_DTYPE_Q5_1 && kvp_cpu_kernels_vnni();
        if (cases[k].tol == 0) {
            /* the same bytes: the same logits as the GGUF, bit for bit */
            CHECK_MSG(memcmp(ref, got, sizeof(float) * N * V) == 0, "case %zu (%s): logits differ from the GGUF's", k,
                      what);
        } else {
            naive_forward(r.m, tok, N, naive);
            double e = rel_err(naive, got, (size_t)N * V);
            CHECK_MSG(e < (act8_fast ? 0.25 : cases[k].tol), "case %zu (%s): engine vs naive: max rel %g", k, what, e);
            /* and still the model it was made from (3-bit mantissas and int4 on
             * random weights: loosely) */
            double eg = rel_err(ref, got, (size_t)N * V);
            int coarse = o.to == KVP_DTYPE_I4 || o.to == KVP_DTYPE_FP8_E4M3 || o.to == KVP_DTYPE_FP8_E5M2 ||
                         o.to == KVP_DTYPE_FP4_E2M1 || o.to == KVP_DTYPE_NVFP4 || o.to == KVP_DTYPE_MXFP4 ||
                         o.to == KVP_DTYPE_Q5_0 || o.to == KVP_DTYPE_Q5_1; /* 5 bits and less on random
                                                                             * weights: loosely */
            double gtol = coarse ? 1.5 : 0.3;
            CHECK_MSG(eg < gtol, "case %zu (%s): vs the f32 GGUF: max rel %g", k, what, eg);
            if (run_all(kpath, KVP_CPU_PORTABLE, tok, N, port, NULL) == 0) {
                double ep = rel_err(port, got, (size_t)N * V);
                CHECK_MSG(ep < (act8_fast ? 0.25 : 3e-3), "case %zu (%s): portable vs %s: max rel %g", k, what,
                          kvp_backend_cpu_isa(r.be), ep);
            }
        }
        rig_close(&r);
    }
    rig_close(&g);
    free(ref), free(got), free(port), free(naive);
    unlink(gpath);
    unlink(kpath);
}

/* ---- SmolLM2 against llama.cpp ---- */

/* Read "key N v v v ..." lines of the golden file. */
static int read_ids(FILE *f, const char *key, uint32_t *ids, uint32_t max)
{
    char k[32];
    unsigned n;
    if (fscanf(f, "%31s %u", k, &n) != 2 || strcmp(k, key) != 0 || n > max)
        return -1;
    for (unsigned i = 0; i < n; i++)
        if (fscanf(f, "%u", &ids[i]) != 1)
            return -1;
    return (int)n;
}

/* One "pos P id:logit x5" line of a golden logits file: 0, or -1 when the
 * file holds no such line. */
static int read_top5(FILE *f, unsigned id[5], float v[5])
{
    unsigned pp;
    return fscanf(f, " pos %u %u:%f %u:%f %u:%f %u:%f %u:%f", &pp, &id[0], &v[0], &id[1], &v[1], &id[2], &v[2],
                  &id[3], &v[3], &id[4], &v[4]) == 11 ? 0 : -1;
}

/* The prompt through r's engine in one step: every position's logits,
 * n * n_vocab floats the caller frees. */
static float *prompt_logits(rig *r, const uint32_t *prompt, int n)
{
    float *lg = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1) * r->m->cfg.n_vocab);
    kvp_err err = {0};
    int s = kvp_kvcache_seq_new(r->kc, &err);
    kvp_step_seq ss = {.seq = s, .tokens = prompt, .n_tokens = (uint32_t)n, .want = KVP_LOGITS_ALL};
    CHECK_EQ_I64(kvp_engine_step(r->e, &ss, 1, lg, &err), n);
    kvp_kvcache_seq_free(r->kc, s);
    return lg;
}

typedef struct top5_cmp {
    int agree, ties;            /* top-1 equal; different where the golden's top two are within tie */
    double max_abs, max_rel, sq; /* errors on the golden's top-5 entries (rel: of max(1, |top-1|)) */
} top5_cmp;

/* Our logits lg[n][V] against the golden's next n top-5 lines; a top-1
 * disagreement that is not a tie is printed, naming ref. */
static top5_cmp compare_top5(FILE *f, const float *lg, int n, uint32_t V, float tie, const char *ref)
{
    top5_cmp c = {0};
    for (int p = 0; p < n; p++) {
        unsigned id[5];
        float v[5];
        if (read_top5(f, id, v) < 0) {
            CHECK(0);
            break;
        }
        const float *row = lg + (size_t)p * V;
        uint32_t best = unit_argmax(row, V);
        if (best == id[0])
            c.agree++;
        else if (v[0] - v[1] < tie)
            c.ties++;
        else
            printf("pos %d: top-1 %u, %s %u (%.5f vs %.5f)\n", p, best, ref, id[0], v[0], v[1]);
        if (getenv("KVP_ENGINE_VERBOSE"))
            printf("pos %d err top1 %.4f\n", p, row[id[0]] - v[0]);
        double range = fabs(v[0]) > 1 ? fabs(v[0]) : 1;
        for (int j = 0; j < 5; j++) {
            double d = fabs(row[id[j]] - v[j]);
            c.sq += d * d;
            c.max_abs = fmax(c.max_abs, d);
            c.max_rel = fmax(c.max_rel, d / range);
        }
    }
    return c;
}

/* The SmolLM2 golden file `name` (tests/golden), opened, and the model's
 * path in *mpath; NULL, with a note, when either is absent. */
static FILE *smollm2_golden(const char *name, const char **mpath)
{
    const char *tests = getenv("KVP_TESTS") ? getenv("KVP_TESTS") : "tests";
    char gpath[1024];
    snprintf(gpath, sizeof gpath, "%s/golden/%s", tests, name);
    *mpath = unit_model_path();
    FILE *f = fopen(gpath, "r");
    if (access(*mpath, R_OK) != 0 || !f) {
        printf("note: skipping the comparison with %s (%s or it absent; run scripts/fetch-model)\n", name, *mpath);
        if (f)
            fclose(f);
        return NULL;
    }
    return f;
}

static void test_smollm2(void)
{
    const char *mpath;
    FILE *f = smollm2_golden("engine_smollm2.txt", &mpath);
    if (!f)
        return;
    rig r;
    if (rig_open(&r, mpath, unit_threads(0), 0, KVP_DTYPE_F16, 64, 16) < 0) {
        CHECK(0);
        fclose(f);
        return;
    }
    char name[128];
    unsigned long long size;
    CHECK(fscanf(f, "model %127s %llu", name, &size) == 2);
    uint32_t prompt[1024], gp[1024], gen[256];
    int n = read_ids(f, "prompt", prompt, 1024);
    CHECK(n > 0);
    uint32_t V = r.m->cfg.n_vocab;
    float *lg = prompt_logits(&r, prompt, n);
    kvp_err err = {0};
    top5_cmp c = compare_top5(f, lg, n, V, 0.3f, "llama.cpp"); /* within 0.3 llama.cpp itself is undecided */
    printf("smollm2 vs llama.cpp: top-1 agreement %d/%d (%d more near ties), top-5 logits max abs err %.4f, "
           "max rel err %.4f\n", c.agree, n, c.ties, c.max_abs, c.max_rel);
    CHECK(c.agree + c.ties == n);
    CHECK(c.agree >= n * 97 / 100);
    long gpos = ftell(f); /* the spread lines are last; read them now */
    float spread = 0, spread_rms = 0;
    char line[256];
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "spread %f", &spread) != 1)
            sscanf(line, "spread_rms %f", &spread_rms);
    fseek(f, gpos, SEEK_SET);
    double rms = n > 0 ? sqrt(c.sq / (5.0 * n)) : 0;
    printf("smollm2: top-5 logits rms err %.4f; llama.cpp's own spread (f16 vs f32 KV) rms %.4f, max %.4f\n", rms,
           spread_rms, spread);
    CHECK(spread > 0 && spread_rms > 0);
    /* The RMS is the steady figure: three kernel sets that differ only in
     * summation order gave top-1 logit errors of RMS 0.182-0.184.  The max is decided by the one
     * position where an 8-bit activation rounding flips, and moved between
     * 0.72 and 1.93 over five (the batch-invariant VNNI order gave 1.93 at
     * position 158, where its logits and the portable kernels' differ by
     * 2.45; the earlier VNNI order reached 2.55 against them at 109); it
     * gets the wider bound. */
    CHECK_MSG(rms < 1.5 * spread_rms, "rms logit error %g, llama.cpp's own rms spread %g", rms, spread_rms);
    CHECK_MSG(c.max_abs < 3.5 * spread, "max abs logit error %g, llama.cpp's own spread %g", c.max_abs, spread);

    int ng = read_ids(f, "greedy_prompt", gp, 1024), ngen = read_ids(f, "greedy", gen, 256);
    CHECK(ng > 0 && ngen > 0);
    if (ng > 0 && ngen > 0) {
        int s2 = kvp_kvcache_seq_new(r.kc, &err);
        float *row = malloc(sizeof(float) * V);
        CHECK(kvp_engine_prefill(r.e, s2, gp, (uint32_t)ng, 0, row, &err) == 0);
        int same = 0;
        double diverge_gap = 0;
        for (int i = 0; i < ngen; i++) {
            uint32_t best = unit_argmax(row, V);
            if (best != gen[i]) {
                /* a divergence is acceptable only where the two candidates
                 * are a near tie (the references disagree among themselves
                 * by ~1 logit: f16 vs f32 KV in llama.cpp) */
                diverge_gap = row[best] - row[gen[i]];
                printf("smollm2 greedy: token %d: ours %u, llama.cpp %u; our logits %.3f vs %.3f\n", i, best,
                       gen[i], row[best], row[gen[i]]);
                break;
            }
            same++;
            kvp_step_seq one = {.seq = s2, .tokens = &best, .n_tokens = 1, .want = KVP_LOGITS_LAST};
            if (kvp_engine_step(r.e, &one, 1, row, &err) != 1)
                break;
        }
        printf("smollm2 greedy: first %d of %d tokens identical to llama.cpp\n", same, ngen);
        CHECK_MSG(same == ngen || diverge_gap < 0.5, "greedy diverges at %d with a gap of %.3f", same, diverge_gap);
        CHECK(same >= 16);
        free(row);
    }
    free(lg);
    fclose(f);
    rig_close(&r);
}

/* ---- attention: tiled/GQA-packed CPU path against a scalar reference ---- */

/* The backend's RoPE against a double-precision rotation, NORM and NEOX,
 * full and partial rot_dim, up to head dims far past the 1024 the old fixed
 * angle table held: every pair rotated, dims past rot_dim untouched. */
static void test_rope_one(uint32_t hd, uint32_t rot, int kind)
{
    enum { NT = 3, NH = 2 };
    const int32_t pos[NT] = {0, 7, 1000};
    kvp_backend *be = rig_backend(0);
    float *x = malloc(sizeof(float) * NT * NH * hd), *x0 = malloc(sizeof(float) * NT * NH * hd);
    float *inv = malloc(sizeof(float) * (rot / 2 + 1));
    if (!be || !x || !x0 || !inv) {
        CHECK(0);
        goto out;
    }
    for (uint32_t i = 0; i < NT * NH * hd; i++)
        x0[i] = x[i] = frand();
    for (uint32_t i = 0; i < rot / 2; i++)
        inv[i] = (float)pow(10000.0, -2.0 * i / rot);
    kvp_weight freq = {.name = "freq", .dtype = KVP_DTYPE_F32, .n_in = rot / 2, .n_out = 1, .data = inv};
    kvp_err err = {0};
    CHECK_MSG(be->ops->rope(be, x, NT, NH, hd, rot, pos, &freq, kind, &err) == 0, "rope: %s", err.msg);
    double worst = 0;
    int untouched = 1;
    for (uint32_t t = 0; t < NT; t++)
        for (uint32_t h = 0; h < NH; h++) {
            const float *a = x0 + ((size_t)t * NH + h) * hd, *b = x + ((size_t)t * NH + h) * hd;
            for (uint32_t i = 0; i < rot / 2; i++) {
                uint32_t e0 = kind == KVP_ROPE_KIND_NEOX ? i : 2 * i, e1 = kind == KVP_ROPE_KIND_NEOX ? i + rot / 2 : 2 * i + 1;
                double ang = (double)pos[t] * inv[i], r0 = a[e0] * cos(ang) - a[e1] * sin(ang);
                double r1 = a[e0] * sin(ang) + a[e1] * cos(ang);
                worst = fmax(worst, fmax(fabs(r0 - b[e0]), fabs(r1 - b[e1])));
            }
            for (uint32_t i = rot; i < hd; i++)
                untouched &= a[i] == b[i];
        }
    CHECK_MSG(worst < 1e-3, "rope hd %u rot %u kind %d: error %g", hd, rot, kind, worst);
    CHECK_MSG(untouched, "rope hd %u rot %u kind %d: dims past rot_dim changed", hd, rot, kind);
out:
    kvp_backend_free(be);
    free(x);
    free(x0);
    free(inv);
}

static void test_rope(void)
{
    test_rope_one(64, 64, KVP_ROPE_KIND_NORM);
    test_rope_one(64, 32, KVP_ROPE_KIND_NEOX);
    test_rope_one(130, 126, KVP_ROPE_KIND_NORM); /* a last chunk of 63 pairs */
    test_rope_one(2048, 2048, KVP_ROPE_KIND_NORM);
    test_rope_one(4096, 3000, KVP_ROPE_KIND_NEOX);
}

/* Two sequences in one call, the first a causal chunk at positions 5..11
 * (with history 0..4 in the cache), the second a fresh chunk 0..4, so the
 * backend's token tiles cross a sequence boundary; block tables scattered.
 * K/V values are rounded to the pool dtype first so only summation order
 * separates the backend from the double-precision reference. */
static void test_attention_one(int kv_dtype, uint32_t n_head_kv, uint32_t n_rep, unsigned flags)
{
    enum { HD = 36, BS = 4, NB = 8, NL = 2, NSEQ = 2, MAXP = 12 };
    const uint32_t lo[NSEQ] = {5, 0}, hi[NSEQ] = {12, 5}; /* query positions [lo, hi) */
    const uint32_t tab0[] = {3, 0, 5}, tab1[] = {1, 6};
    const uint32_t *tables[NSEQ] = {tab0, tab1};
    uint32_t n_head = n_head_kv * n_rep, row = n_head_kv * HD;
    size_t es = kv_dtype == KVP_DTYPE_F32 ? 4 : 2;
    kvp_err err = {0};
    kvp_backend *be = rig_backend(flags);
    if (!be)
        return;
    kvp_kv_pool kv = {.dtype = kv_dtype, .n_blocks = NB, .block_size = BS, .n_layer = NL, .n_head_kv = n_head_kv,
                      .head_dim = HD};
    kv.block_bytes = (uint64_t)NL * 2 * n_head_kv * BS * HD * es;
    kv.base = be->ops->alloc(be, (size_t)NB * kv.block_bytes);
    float *k = calloc((size_t)NSEQ * MAXP * row, sizeof(float)), *v = calloc((size_t)NSEQ * MAXP * row, sizeof(float));
    uint32_t n_tok = 0;
    for (int s = 0; s < NSEQ; s++)
        n_tok += hi[s] - lo[s];
    float *q = malloc((size_t)n_tok * n_head * HD * sizeof(float));
    float *out = malloc((size_t)n_tok * n_head * HD * sizeof(float));
    int32_t pos[MAXP * NSEQ];
    uint32_t seq[MAXP * NSEQ];
    CHECK(kv.base && k && v && q && out);
    if (!kv.base || !k || !v || !q || !out)
        goto done;
    for (size_t i = 0; i < (size_t)NSEQ * MAXP * row; i++) {
        k[i] = frand();
        v[i] = frand();
        if (kv_dtype == KVP_DTYPE_F16) {
            k[i] = kvp_f16_to_f32(kvp_f32_to_f16(k[i]));
            v[i] = kvp_f16_to_f32(kvp_f32_to_f16(v[i]));
        }
    }
    for (size_t i = 0; i < (size_t)n_tok * n_head * HD; i++)
        q[i] = 2 * frand(); /* sharper softmax than uniform */
    /* store all positions 0..hi of each sequence in layer 1 */
    for (uint32_t s = 0, t = 0; s < NSEQ; s++) {
        for (uint32_t p = 0; p < hi[s]; p++) {
            uint32_t slot = tables[s][p / BS] * BS + p % BS;
            const float *kr = k + ((size_t)s * MAXP + p) * row, *vr = v + ((size_t)s * MAXP + p) * row;
            CHECK(be->ops->kv_store(be, &kv, 1, kr, vr, 1, &slot, &err) == 0);
        }
        for (uint32_t p = lo[s]; p < hi[s]; p++, t++) {
            pos[t] = (int32_t)p;
            seq[t] = s;
        }
    }
    const uint32_t n_blk[NSEQ] = {3, 2};
    uint32_t flat[NSEQ * 3];
    rig_flat_tables(tables, n_blk, NSEQ, 3, flat);
    rig_reserve(be, n_tok, 0, n_head, MAXP, &kv);
    kvp_attn_args a = rig_attn_args(q, out, n_tok, n_head, 1, 1.0f / sqrtf((float)HD), pos, seq, flat, NSEQ, 3, &kv);
    CHECK_MSG(be->ops->attention(be, &a, &err) == 0, "%s", err.msg);
    double worst = 0;
    for (uint32_t t = 0; t < n_tok; t++)
        for (uint32_t h = 0; h < n_head; h++) {
            const float *qh = q + ((size_t)t * n_head + h) * HD;
            uint32_t g = h / n_rep, np = (uint32_t)pos[t] + 1;
            double sc[MAXP], mx = -1e300, sum = 0;
            for (uint32_t p = 0; p < np; p++) {
                const float *kr = k + ((size_t)seq[t] * MAXP + p) * row + (size_t)g * HD;
                double d = 0;
                for (uint32_t i = 0; i < HD; i++)
                    d += (double)qh[i] * kr[i];
                sc[p] = d * a.scale;
                mx = sc[p] > mx ? sc[p] : mx;
            }
            for (uint32_t p = 0; p < np; p++)
                sum += sc[p] = exp(sc[p] - mx);
            for (uint32_t i = 0; i < HD; i++) {
                double ref = 0;
                for (uint32_t p = 0; p < np; p++)
                    ref += sc[p] / sum * v[((size_t)seq[t] * MAXP + p) * row + (size_t)g * HD + i];
                double e = fabs(out[((size_t)t * n_head + h) * HD + i] - ref);
                worst = e > worst ? e : worst;
            }
        }
    CHECK_MSG(worst < 1e-5, "attention kv %d heads %u/%u flags %u: worst error %g", kv_dtype, n_head, n_head_kv,
              flags, worst);
done:
    if (kv.base)
        be->ops->release(be, kv.base);
    free(k);
    free(v);
    free(q);
    free(out);
    be->ops->destroy(be);
}

/* One-token runs over long contexts split their keys into chunks: against a
 * naive softmax in double, and the same numbers for a sequence alone as in a
 * batch (the split depends on the run only). */
static void test_attention_split(int kv_dtype, unsigned flags)
{
    enum { HD = 64, BS = 16, NKV = 3, REP = 3, NH = NKV * REP, L0 = 1300, L1 = 600 };
    const uint32_t len[2] = {L0, L1}, nblk[2] = {(L0 + BS - 1) / BS, (L1 + BS - 1) / BS};
    uint32_t row = NKV * HD, nb = nblk[0] + nblk[1];
    size_t es = kv_dtype == KVP_DTYPE_F32 ? 4 : 2;
    kvp_err err = {0};
    kvp_backend *be = rig_backend(flags);
    if (!be)
        return;
    kvp_kv_pool kv = {.dtype = kv_dtype, .n_blocks = nb, .block_size = BS, .n_layer = 1, .n_head_kv = NKV,
                      .head_dim = HD};
    kv.block_bytes = (uint64_t)2 * NKV * BS * HD * es;
    kv.base = be->ops->alloc(be, (size_t)nb * kv.block_bytes);
    uint32_t *tab[2] = {malloc(nblk[0] * sizeof(uint32_t)), malloc(nblk[1] * sizeof(uint32_t))};
    float *k = malloc(sizeof(float) * (L0 + L1) * row), *v = malloc(sizeof(float) * (L0 + L1) * row);
    float q[2 * NH * HD], out_alone[2][NH * HD], out_both[2 * NH * HD];
    for (uint32_t i = 0; i < nblk[0]; i++)
        tab[0][i] = nb - 1 - i; /* scattered, reversed */
    for (uint32_t i = 0; i < nblk[1]; i++)
        tab[1][i] = i;
    for (size_t i = 0; i < (size_t)(L0 + L1) * row; i++) {
        k[i] = frand(), v[i] = frand();
        if (kv_dtype == KVP_DTYPE_F16)
            k[i] = kvp_f16_to_f32(kvp_f32_to_f16(k[i])), v[i] = kvp_f16_to_f32(kvp_f32_to_f16(v[i]));
    }
    for (int i = 0; i < 2 * NH * HD; i++)
        q[i] = 3 * frand();
    for (int sq = 0; sq < 2; sq++)
        for (uint32_t p = 0; p < len[sq]; p++) {
            uint32_t slot = tab[sq][p / BS] * BS + p % BS;
            const float *base = (sq ? k + (size_t)L0 * row : k) + (size_t)p * row;
            const float *vb = (sq ? v + (size_t)L0 * row : v) + (size_t)p * row;
            CHECK(be->ops->kv_store(be, &kv, 0, base, vb, 1, &slot, &err) == 0);
        }
    const uint32_t *const tables[2] = {tab[0], tab[1]};
    uint32_t *flat = malloc(sizeof(uint32_t) * 2 * nblk[0]);
    rig_flat_tables(tables, nblk, 2, nblk[0], flat);
    rig_reserve(be, 2, 0, NH, L0, &kv);
    int32_t pos[2] = {L0 - 1, L1 - 1};
    uint32_t seqs[2] = {0, 1};
    for (int sq = 0; sq < 2; sq++) { /* each alone, then both */
        kvp_attn_args a = rig_attn_args(q + sq * NH * HD, out_alone[sq], 1, NH, 0, 0.125f, pos + sq, seqs + sq, flat, 2,
                                        nblk[0], &kv);
        CHECK(be->ops->attention(be, &a, &err) == 0);
    }
    kvp_attn_args ab = rig_attn_args(q, out_both, 2, NH, 0, 0.125f, pos, seqs, flat, 2, nblk[0], &kv);
    CHECK(be->ops->attention(be, &ab, &err) == 0);
    CHECK_MSG(memcmp(out_alone[0], out_both, sizeof out_alone[0]) == 0 &&
              memcmp(out_alone[1], out_both + NH * HD, sizeof out_alone[1]) == 0,
              "a split run gives other numbers in a batch (kv %d flags %u)", kv_dtype, flags);
    double worst = 0;
    double *sc = malloc(sizeof(double) * L0);
    for (int sq = 0; sq < 2; sq++)
        for (uint32_t h = 0; h < NH; h++) {
            const float *qh = q + (sq * NH + h) * HD, *kb = sq ? k + (size_t)L0 * row : k;
            const float *vb = sq ? v + (size_t)L0 * row : v;
            uint32_t g = h / REP;
            double mx = -1e300, sum = 0;
            for (uint32_t p = 0; p < len[sq]; p++) {
                double d = 0;
                for (int i = 0; i < HD; i++)
                    d += (double)qh[i] * kb[(size_t)p * row + g * HD + i];
                sc[p] = d * 0.125;
                mx = fmax(mx, sc[p]);
            }
            for (uint32_t p = 0; p < len[sq]; p++)
                sum += sc[p] = exp(sc[p] - mx);
            for (int i = 0; i < HD; i++) {
                double ref = 0;
                for (uint32_t p = 0; p < len[sq]; p++)
                    ref += sc[p] / sum * vb[(size_t)p * row + g * HD + i];
                worst = fmax(worst, fabs(out_alone[sq][h * HD + i] - ref));
            }
        }
    CHECK_MSG(worst < 1e-5, "split attention kv %d flags %u: worst error %g", kv_dtype, flags, worst);
    free(sc), free(k), free(v), free(tab[0]), free(tab[1]), free(flat);
    be->ops->release(be, kv.base);
    be->ops->destroy(be);
}

/* A NaN in a cached K row makes its score NaN: the outputs of every query
 * that sees it must be NaN too (the engine's check then ends the
 * sequence), never finite.  The SIMD exp clamped its input with a max that
 * returns its other operand for a NaN, so the key got weight ~1e-38 and
 * decode ran on as if nothing were wrong; the portable expf carried it.
 * Each kernel set (flags), a decode step (one token) and a verify step of
 * six (the 512-bit queries' path), heads 64 wide as SmolLM2's. */
static void test_attention_nan(int kv_dtype, uint32_t n_tok, unsigned flags)
{
    enum { HD = 64, BS = 16, NB = 2, NP = 20, NREP = 3, BAD = 3 };
    size_t es = kv_dtype == KVP_DTYPE_F32 ? 4 : 2;
    kvp_err err = {0};
    kvp_backend *be = rig_backend(flags);
    if (!be)
        return;
    kvp_kv_pool kv = {.dtype = kv_dtype, .n_blocks = NB, .block_size = BS, .n_layer = 1, .n_head_kv = 1,
                      .head_dim = HD, .block_bytes = (uint64_t)2 * BS * HD * es};
    kv.base = be->ops->alloc(be, NB * kv.block_bytes);
    float kr[HD], vr[HD], q[8 * NREP * HD], out[8 * NREP * HD];
    int32_t pos[8];
    uint32_t seq[8] = {0}, flat[NB] = {0, 1};
    uint64_t rng = 0x4e614e;
    CHECK(kv.base && n_tok <= 8);
    for (uint32_t p = 0; kv.base && p < NP; p++) {
        for (uint32_t i = 0; i < HD; i++)
            kr[i] = unit_frand(&rng), vr[i] = unit_frand(&rng);
        if (p == BAD)
            kr[HD / 2] = NAN;
        uint32_t slot = p;
        CHECK(be->ops->kv_store(be, &kv, 0, kr, vr, 1, &slot, &err) == 0);
    }
    for (uint32_t i = 0; i < n_tok * NREP * HD; i++)
        q[i] = unit_frand(&rng);
    for (uint32_t t = 0; t < n_tok; t++)
        pos[t] = (int32_t)(NP - n_tok + t);
    rig_reserve(be, n_tok, 0, NREP, NP, &kv);
    kvp_attn_args a = rig_attn_args(q, out, n_tok, NREP, 0, 0.125f, pos, seq, flat, 1, NB, &kv);
    CHECK_MSG(kv.base && be->ops->attention(be, &a, &err) == 0, "%s", err.msg);
    uint32_t finite_rows = 0;
    for (uint32_t r = 0; kv.base && r < n_tok * NREP; r++) {
        int bad = 0;
        for (uint32_t i = 0; i < HD; i++)
            bad |= !isfinite(out[r * HD + i]);
        finite_rows += !bad;
    }
    CHECK_MSG(finite_rows == 0, "kv dtype %d, %u tokens, flags %u (%s): %u of %u query rows finite past a NaN key",
              kv_dtype, n_tok, flags, kvp_backend_cpu_isa(be), finite_rows, n_tok * NREP);
    if (kv.base)
        be->ops->release(be, kv.base);
    kvp_backend_free(be);
}

static void test_attention(void)
{
    for (unsigned fl = 0; fl <= KVP_CPU_NO_VNNI; fl++)
        for (uint32_t nt = 1; nt <= 6; nt += 5) {
            test_attention_nan(KVP_DTYPE_F32, nt, fl);
            test_attention_nan(KVP_DTYPE_F16, nt, fl);
        }
    const int dts[] = {KVP_DTYPE_F32, KVP_DTYPE_F16};
    const uint32_t reps[] = {1, 3, 9};
    for (int d = 0; d < 2; d++)
        for (int r = 0; r < 3; r++)
            for (unsigned fl = 0; fl < 2; fl++) {
                test_attention_one(dts[d], 2, reps[r], fl);
                test_attention_one(dts[d], 1, reps[r], fl);
            }
    for (unsigned fl = 0; fl < 2; fl++) {
        test_attention_split(KVP_DTYPE_F16, fl);
        test_attention_split(KVP_DTYPE_F32, fl);
    }
}

/* SmolLM2 against HF transformers in fp32 (tests/golden/engine_smollm2_hf.txt,
 * scripts/ref/gen_engine_smollm2_hf.py): transformers dequantized the Q4_1
 * GGUF itself; here our converter writes it as f32 weights and the engine
 * runs with an f32 KV cache, so what is left is summation order. */
static void test_smollm2_hf(const char *dir)
{
    char f32path[1100];
    snprintf(f32path, sizeof f32path, "%s/smollm2-f32.kvp", dir);
    const char *mpath;
    FILE *f = smollm2_golden("engine_smollm2_hf.txt", &mpath);
    if (!f)
        return;
    char name[128];
    unsigned long long size;
    uint32_t prompt[1024];
    CHECK(fscanf(f, "model %127s %llu", name, &size) == 2);
    int n = read_ids(f, "prompt", prompt, 1024);
    kvp_convert_opts o;
    kvp_convert_opts_init(&o);
    o.to = o.embed = KVP_DTYPE_F32;
    uint8_t fp[16];
    kvp_err err = {0};
    rig r;
    if (n <= 0 || convert_to(mpath, f32path, &o, 0, fp, &err) < 0 ||
        rig_open(&r, f32path, unit_threads(0), 0, KVP_DTYPE_F32, 64, 16) < 0) {
        printf("smollm2 f32: %s\n", err.msg);
        CHECK(0);
        fclose(f);
        unlink(f32path);
        return;
    }
    uint32_t V = r.m->cfg.n_vocab;
    float *lg = prompt_logits(&r, prompt, n);
    top5_cmp c = compare_top5(f, lg, n, V, 1e-3f, "transformers"); /* a tie at the golden's 5 decimals */
    printf("smollm2 f32 vs transformers fp32: top-1 agreement %d/%d (%d ties), top-5 logits max rel err %.2e\n",
           c.agree, n, c.ties, c.max_rel);
    CHECK(c.agree + c.ties == n);
    /* the golden's 5 decimals alone allow 5e-6 of a logit near 1 */
    CHECK_MSG(c.max_rel < 1e-4, "max relative logit error %g against transformers", c.max_rel);
    free(lg);
    rig_close(&r);
    fclose(f);
    unlink(f32path);
}

/* SmolLM2 quantized by llm-compressor (scripts/ref/make_smollm2_ct.py, cached
 * outside the repo) against transformers running the same checkpoint through
 * compressed-tensors in fp32 (tests/golden/engine_smollm2_ct_SCHEME.txt,
 * gen_engine_smollm2_ct.py).  The folder is loaded as it is (i4 / i8 / fp8
 * weights in their own kernels), and through quantize as f32 weights, where
 * only summation order is left.  Skipped when the checkpoint is absent or
 * was made again elsewhere (its size differs from the golden's). */
static void test_smollm2_ct(const char *dir, const char *scheme, double in_place_bound)
{
    const char *tests = getenv("KVP_TESTS") ? getenv("KVP_TESTS") : "tests";
    const char *cache = getenv("KVPIPE_CACHE");
    char gpath[1024], ckpt[1024], st[1100], f32path[1100];
    snprintf(gpath, sizeof gpath, "%s/golden/engine_smollm2_ct_%s.txt", tests, scheme);
    if (cache)
        snprintf(ckpt, sizeof ckpt, "%s/smollm2-ct/%s", cache, scheme);
    else
        snprintf(ckpt, sizeof ckpt, "%s/.cache/kvpipe/smollm2-ct/%s", getenv("HOME") ? getenv("HOME") : ".", scheme);
    snprintf(st, sizeof st, "%s/model.safetensors", ckpt);
    snprintf(f32path, sizeof f32path, "%s/smollm2-ct-%s.kvp", dir, scheme);
    FILE *f = fopen(gpath, "r");
    struct stat sb;
    char name[128];
    unsigned long long size = 0;
    if (!f || fscanf(f, "model %127s %llu", name, &size) != 2 || stat(st, &sb) != 0 || (uint64_t)sb.st_size != size) {
        printf("note: skipping %s: %s absent or not the checkpoint it was made from (scripts/ref/make_smollm2_ct.py)\n",
               gpath, st);
        if (f)
            fclose(f);
        return;
    }
    uint32_t prompt[1024];
    int n = read_ids(f, "prompt", prompt, 1024);
    long at = ftell(f);
    kvp_convert_opts o;
    kvp_convert_opts_init(&o);
    o.to = o.embed = KVP_DTYPE_F32;
    uint8_t fp[16];
    kvp_err err = {0};
    rig r;
    for (int f32 = 0; f32 < 2 && n > 0; f32++) {
        if ((f32 && convert_to(ckpt, f32path, &o, 0, fp, &err) < 0) ||
            rig_open(&r, f32 ? f32path : ckpt, unit_threads(0), 0, KVP_DTYPE_F32, 64, 16) < 0) {
            printf("smollm2 %s: %s\n", scheme, err.msg);
            CHECK(0);
            break;
        }
        float *lg = prompt_logits(&r, prompt, n);
        fseek(f, at, SEEK_SET);
        top5_cmp c = compare_top5(f, lg, n, r.m->cfg.n_vocab, 1e-3f, "transformers");
        printf("smollm2 %s (%s) vs transformers + compressed-tensors fp32: top-1 agreement %d/%d (%d ties), top-5 "
               "logits max rel err %.2e\n", scheme, f32 ? "as f32 weights" : "in place", c.agree, n, c.ties,
               c.max_rel);
        /* f32 weights: summation order only; in place: the kernels' 8-bit activations (i4, i8) */
        CHECK_MSG(c.max_rel < (f32 ? 1e-4 : in_place_bound), "%s: max relative logit error %g", scheme, c.max_rel);
        if (f32)
            CHECK(c.agree + c.ties == n);
        else
            CHECK_MSG(c.agree + c.ties >= n * 95 / 100, "%s: top-1 agreement %d/%d", scheme, c.agree, n);
        free(lg);
        rig_close(&r);
    }
    fclose(f);
    unlink(f32path);
}

/* GGUF K-quants (Q4_K, Q6_K), which only llama.cpp writes: random valid
 * super-blocks in a tiny GGUF, run through the row path (embedding lookup
 * included) against the naive pass and the portable kernels, and each
 * tensor's rows against the library's dequantizer. */
/* kvp_cpu_q4k_as_i4: random Q4_K rows (one sub-block a super-block with
 * a zero scale) as int4 with group scales and zero points give the Q4_K's
 * values, within the rounding of the zero point, and a zero-scale
 * sub-block's -M exactly; other types and partial super-blocks are left
 * alone. */
static void test_q4k_repack(void)
{
    enum { N = 512, R = 3, SB = 144 };
    static uint8_t q[R * 2 * SB];
    static float a[N], b[N];
    for (size_t i = 0; i < sizeof q; i++)
        q[i] = (uint8_t)((frand() + 1) * 128);
    for (int s = 0; s < R * 2; s++) {
        uint8_t *blk = q + s * SB;
        uint16_t d = kvp_f32_to_f16(0.02f * (1.5f + frand())), dmin = kvp_f32_to_f16(0.01f * (1.5f + frand()));
        blk[0] = (uint8_t)d, blk[1] = (uint8_t)(d >> 8), blk[2] = (uint8_t)dmin, blk[3] = (uint8_t)(dmin >> 8);
        blk[4 + s % 4] &= 0xc0; /* sub-block s % 4: scale 0 */
        blk[8 + s % 4] |= 1;    /* and a minimum that is not */
    }
    kvp_weight w = {.name = "q4k", .dtype = KVP_DTYPE_Q4_K, .n_in = N, .n_out = R, .row_bytes = 2 * SB, .data = q},
               i4;
    kvp_err err = {0};
    CHECK_EQ_I64(kvp_cpu_q4k_as_i4(&w, &i4, &err), 1);
    CHECK_EQ_I64(i4.dtype, KVP_DTYPE_I4);
    CHECK_EQ_I64(i4.group, 32);
    for (uint32_t r = 0; r < R; r++) {
        CHECK(kvp_cpu_dequant_weight_row(&w, r, a) == 0 && kvp_cpu_dequant_weight_row(&i4, r, b) == 0);
        double mx = 0, diff = 0;
        for (int i = 0; i < N; i++) {
            mx = fabs(a[i]) > mx ? fabs(a[i]) : mx;
            diff = fabs((double)a[i] - b[i]) > diff ? fabs((double)a[i] - b[i]) : diff;
        }
        CHECK_MSG(mx > 0 && diff <= 1e-5 * mx, "row %u: int4 form differs by %g (values up to %g)", r, diff, mx);
        for (int sb = 0; sb < 2; sb++) { /* the zero-scale sub-block: -M throughout, exactly */
            int j = (int)(r * 2 + (uint32_t)sb) % 4, off = sb * 256 + 32 * j;
            int same = 1;
            for (int i = 0; i < 32; i++)
                same &= a[off + i] == b[off + i] && a[off + i] == a[off];
            CHECK_MSG(same && a[off] < 0, "row %u super-block %d: the zero-scale sub-block is not -M throughout", r, sb);
        }
    }
    kvp_cpu_repacked_free(&i4);
    w.n_in = 384, w.row_bytes = 3 * SB / 2; /* not whole super-blocks */
    CHECK_EQ_I64(kvp_cpu_q4k_as_i4(&w, &i4, &err), 0);
    w.n_in = N, w.dtype = KVP_DTYPE_Q6_K;
    CHECK_EQ_I64(kvp_cpu_q4k_as_i4(&w, &i4, &err), 0);
}

/* kvp_cpu_q5_0_as_q8_0: random Q5_0 rows as Q8_0 give the same values bit
 * for bit (d (q - 16) either way; any NaN for a NaN scale's); other kinds
 * are left alone. */
static void test_q5_0_repack(void)
{
    enum { N = 96, R = 3 };
    static uint8_t q[R * (N / 32) * 22];
    static float a[N], b[N];
    for (size_t i = 0; i < sizeof q; i++)
        q[i] = (uint8_t)((frand() + 1) * 128);
    kvp_weight w = {.name = "q5_0", .dtype = KVP_DTYPE_Q5_0, .n_in = N, .n_out = R, .row_bytes = N / 32 * 22,
                    .data = q},
               q8;
    kvp_err err = {0};
    CHECK_EQ_I64(kvp_cpu_q5_0_as_q8_0(&w, &q8, &err), 1);
    CHECK_EQ_I64(q8.dtype, KVP_DTYPE_Q8_0);
    for (uint32_t r = 0; r < R; r++) {
        CHECK(kvp_cpu_dequant_weight_row(&w, r, a) == 0 && kvp_cpu_dequant_weight_row(&q8, r, b) == 0);
        int bad = first_unlike(a, b, N);
        CHECK_MSG(bad < 0, "row %u: the Q8_0 form differs from the Q5_0 at %d", r, bad);
    }
    kvp_cpu_repacked_free(&q8);
    w.dtype = KVP_DTYPE_Q5_1;
    CHECK_EQ_I64(kvp_cpu_q5_0_as_q8_0(&w, &q8, &err), 0);
    CHECK_EQ_I64(kvp_cpu_repackable(&w), 0);
}

/* kvp_cpu_as_r16: Q8_0, Q4_0, Q4_1, and i8 and i4 with scales (per row,
 * in groups of 64 with zero points, one for the tensor) in rows of 16 (19
 * rows: a group and a padded one) read back by kvp_cpu_r16_row give the
 * stored values bit for bit (any NaN for a NaN scale's), Q5_0 through
 * Q8_0 likewise; a row past the end, other kinds and groups under 32 are
 * refused. */
static void test_r16_repack(void)
{
    enum { N = 128, R = 19, NB = N / 32 };
    static uint8_t q[R * NB * 34];
    static float a[N], b[N], sc[R * N / 32], zp[R * N / 32];
    static const struct {
        int dtype, as;
        uint32_t group, stride; /* scaled: group and scales a row (0: one for the tensor) */
        int zeros;
    } kinds[] = {{KVP_DTYPE_Q8_0, KVP_CPU_DTYPE_Q8_0_R16, 0, 0, 0}, {KVP_DTYPE_Q4_0, KVP_CPU_DTYPE_Q4_0_R16, 0, 0, 0},
                 {KVP_DTYPE_Q4_1, KVP_CPU_DTYPE_Q4_1_R16, 0, 0, 0}, {KVP_DTYPE_Q5_0, KVP_CPU_DTYPE_Q5_0_R16, 0, 0, 0},
                 {KVP_DTYPE_Q5_1, KVP_CPU_DTYPE_Q5_1_R16, 0, 0, 0},
                 {KVP_DTYPE_I8, KVP_CPU_DTYPE_I8_R16, N, 1, 0},     {KVP_DTYPE_I8, KVP_CPU_DTYPE_I8_R16, 64, 2, 1},
                 {KVP_DTYPE_I4, KVP_CPU_DTYPE_I4_R16, 64, 2, 1},    {KVP_DTYPE_I4, KVP_CPU_DTYPE_I4_R16, N, 0, 0}};
    kvp_err err = {0};
    kvp_weight r16;
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        for (size_t i = 0; i < sizeof q; i++)
            q[i] = (uint8_t)((frand() + 1) * 128);
        for (size_t i = 0; i < sizeof sc / sizeof *sc; i++)
            sc[i] = frand() * 0.1f, zp[i] = (float)((int)i % 7 - 3);
        kvp_weight w = {.name = kvp_dtype_name((uint32_t)kinds[k].dtype), .dtype = kinds[k].dtype, .n_in = N,
                        .n_out = R, .row_bytes = (uint64_t)kvp_dtype_row_bytes((uint32_t)kinds[k].dtype, N), .data = q};
        if (kinds[k].group)
            w.scales = sc, w.zeros = kinds[k].zeros ? zp : NULL, w.group = kinds[k].group,
            w.scale_stride = kinds[k].stride;
        CHECK_EQ_I64(kvp_cpu_as_r16(&w, &r16, &err), 1);
        CHECK_EQ_I64(r16.dtype, kinds[k].as);
        int bad = 0;
        for (uint32_t r = 0; r < R; r++) {
            CHECK(kvp_cpu_dequant_weight_row(&w, r, a) == 0 && kvp_cpu_r16_row(&r16, r, b) == 0);
            bad += first_unlike(a, b, N) >= 0;
        }
        CHECK_MSG(bad == 0, "%s (case %zu): %d rows in rows of 16 differ from the stored ones", w.name, k, bad);
        CHECK_EQ_I64(kvp_cpu_r16_row(&r16, R, b), -1);
        kvp_cpu_repacked_free(&r16);
        if (kinds[k].group == 64) { /* groups under 32 stay on the row path */
            w.group = 16, w.scale_stride = N / 16;
            CHECK_EQ_I64(kvp_cpu_as_r16(&w, &r16, &err), 0);
        }
        if (kinds[k].dtype == KVP_DTYPE_Q5_0) { /* other kinds are left alone */
            w.dtype = KVP_DTYPE_MXFP4;
            CHECK_EQ_I64(kvp_cpu_as_r16(&w, &r16, &err), 0);
        }
    }
}

/* The Q6_K product the rows of 16 give (backend_cpu_kern.h), written
 * from the format: per block of 32 the exact integer sc_lo sum((q - 32) x)
 * over its first 16 elements plus sc_hi's over the rest, then one FMA by
 * d dx into the row's sum. */
static float q36k_ref_dot(int q6, const uint8_t *row, const kvp_q8blk *x, uint32_t n)
{
    float acc = 0;
    int off = q6 ? 32 : 4;
    for (uint32_t i = 0; i < n / 256; i++, row += q6 ? 210 : 110) {
        uint8_t q[256];
        int8_t sc[16];
        if (q6)
            kvp_q6k_codes(row, q), memcpy(sc, row + 192, 16);
        else
            kvp_q3k_codes(row, q), kvp_q3k_scales(row, sc);
        float d = q6 ? kvp_f16_to_f32((uint16_t)(row[208] | row[209] << 8))
                     : kvp_f16_to_f32((uint16_t)(row[108] | row[109] << 8));
        for (int j = 0; j < 8; j++) {
            const kvp_q8blk *xb = &x[i * 8 + (uint32_t)j];
            int32_t half[2] = {0, 0};
            for (int e = 0; e < 32; e++)
                half[e / 16] += (q[32 * j + e] - off) * xb->q[e];
            int32_t isum = sc[2 * j] * half[0] + sc[2 * j + 1] * half[1];
            acc = fmaf((float)isum, d * xb->d, acc);
        }
    }
    return acc;
}

/* The Q2_K product: per half-block the exact integer sums of c x and of x,
 * weighted by the half's scale and minimum, into FMAs by d dx and by dmin
 * -dx, the two chains added at the end. */
static float q2k_ref_dot(const uint8_t *row, const kvp_q8blk *x, uint32_t n)
{
    float acc = 0, ma = 0;
    for (uint32_t i = 0; i < n / 256; i++, row += 84) {
        uint8_t q[256];
        kvp_q2k_codes(row, q);
        float d = kvp_f16_to_f32((uint16_t)(row[80] | row[81] << 8)), dmin = kvp_f16_to_f32((uint16_t)(row[82] | row[83] << 8));
        for (int j = 0; j < 8; j++) {
            const kvp_q8blk *xb = &x[i * 8 + (uint32_t)j];
            int32_t dot[2] = {0, 0}, xs[2] = {0, 0};
            for (int e = 0; e < 32; e++)
                dot[e / 16] += q[32 * j + e] * xb->q[e], xs[e / 16] += xb->q[e];
            const uint8_t *s = row + 2 * j;
            int32_t isum = (s[0] & 15) * dot[0] + (s[1] & 15) * dot[1], mi = (s[0] >> 4) * xs[0] + (s[1] >> 4) * xs[1];
            acc = fmaf((float)isum, d * xb->d, acc);
            ma = fmaf((float)mi, dmin * -xb->d, ma);
        }
    }
    return acc + ma;
}

/* Whether table k has the rows-of-16 kernel of kind as; if so, nt tokens
 * x[t * n] quantized by its quant_q8 into xq[t * nb], xp[t] pointing at
 * each. */
static int r16_table_tokens(const kvp_cpu_kernels *k, int as, const float *x, uint32_t n, uint32_t nt, kvp_q8blk *xq,
                            uint32_t nb, const kvp_q8blk **xp)
{
    if (!k || !k->mm_r16[as - KVP_CPU_DTYPE_Q8_0_R16])
        return 0;
    for (uint32_t t = 0; t < nt; t++)
        k->quant_q8(x + (size_t)t * n, xq + (size_t)t * nb, n), xp[t] = xq + (size_t)t * nb;
    return 1;
}

/* y[nt][w.n_out] = the products of w (in rows of 16) by nt tokens' blocks
 * xp on table k: every group of 16 rows, the last padded. */
static void r16_products(const kvp_cpu_kernels *k, const kvp_weight *w, const kvp_q8blk **xp, uint32_t nt, float *y)
{
    uint32_t R = w->n_out, N = w->n_in;
    for (uint32_t r = 0; r < R; r += 16) {
        kvp_mm_blk blk = {.w = (const uint8_t *)w->data + r * w->row_bytes, .w_stride = w->row_bytes,
                          .d16 = kvp_r16_plane(w->data, w->dtype, R, N, 0, r),
                          .m16 = kvp_r16_plane1(w->dtype) ? kvp_r16_plane(w->data, w->dtype, R, N, 1, r) : NULL,
                          .xq = xp, .n = N, .nr = R - r < 16 ? R - r : 16, .nt = nt, .y = y + r, .ldy = R};
        k->mm_r16[w->dtype - KVP_CPU_DTYPE_Q8_0_R16](&blk);
    }
}

/* A reference product of one stored row by a token's blocks x. */
typedef float (*r16_ref_fn)(const void *ctx, const uint8_t *row, const kvp_q8blk *x);

/* r16, w in rows of 16, multiplied by every table that takes it, 1 to
 * KVP_MM_TILE tokens of x[KVP_MM_TILE][w.n_in] (xq their blocks' room):
 * ref's bits for every row; at the extremes (x quantizing to itself, d 1)
 * the exact sum too. */
static void r16_check_tables(const kvp_weight *w, const kvp_weight *r16, const float *x, kvp_q8blk *xq, int extreme,
                             r16_ref_fn ref, const void *ctx)
{
    enum { TT = KVP_MM_TILE };
    uint32_t N = w->n_in, R = w->n_out, NB = N / 32;
    const kvp_cpu_kernels *tables[] = {kvp_cpu_kernels_vnni(), kvp_cpu_kernels_amx()};
    float *y = malloc(sizeof(float) * TT * R), *a = malloc(sizeof(float) * N);
    CHECK(y && a);
    for (size_t ti = 0; y && a && ti < sizeof tables / sizeof *tables; ti++) {
        const kvp_cpu_kernels *k = tables[ti];
        const kvp_q8blk *xp[TT];
        if (!r16_table_tokens(k, r16->dtype, x, N, TT, xq, NB, xp))
            continue;
        int bad_bits = 0, bad_exact = 0;
        for (uint32_t nt = 1; nt <= TT; nt++)
            for (uint32_t t0 = 0; t0 + nt <= TT; t0 += nt) {
                r16_products(k, r16, xp + t0, nt, y);
                for (uint32_t t = 0; t < nt; t++)
                    for (uint32_t r = 0; r < R; r++) {
                        const kvp_q8blk *xb = xp[t0 + t];
                        float want = ref(ctx, (const uint8_t *)w->data + (size_t)r * w->row_bytes, xb);
                        bad_bits += memcmp(&y[t * R + r], &want, 4) != 0;
                        if (!extreme)
                            continue;
                        CHECK(kvp_cpu_dequant_weight_row(w, r, a) == 0);
                        double ex = 0;
                        for (uint32_t i = 0; i < N; i++)
                            ex += (double)a[i] * xb[i / 32].q[i % 32] * xb[i / 32].d;
                        bad_exact += fabs(y[t * R + r] - ex) > 1e-6 * (1 + fabs(ex));
                    }
            }
        CHECK_MSG(bad_bits == 0, "%s: %s in rows of 16: %d outputs differ from the reference's bits", k->isa,
                  w->name, bad_bits);
        CHECK_MSG(bad_exact == 0, "%s: %s at the extremes: %d outputs off the exact sum", k->isa, w->name, bad_exact);
    }
    free(y), free(a);
}

/* The Q5_1 product of the rows of 16, Q4_1's: per block the exact
 * integer sum(q x) into one FMA by d dx, m s into a second chain. */
static float q5_1_ref_dot(const uint8_t *row, const kvp_q8blk *x, uint32_t nb)
{
    float acc = 0, ma = 0;
    for (uint32_t b = 0; b < nb; b++, row += 24) {
        uint8_t q[32];
        int isum = 0;
        kvp_q5_codes(row + 4, row + 8, q);
        for (int e = 0; e < 32; e++)
            isum += q[e] * x[b].q[e];
        float d = kvp_f16_to_f32((uint16_t)(row[0] | row[1] << 8)), m = kvp_f16_to_f32((uint16_t)(row[2] | row[3] << 8));
        acc = fmaf((float)isum, d * x[b].d, acc);
        ma = fmaf(m, x[b].s, ma);
    }
    return acc + ma;
}

/* GGUF's Q5_0 and Q5_1 in rows of 16 (19 rows, 1-8 tokens) on every table
 * that takes them: Q5_0 the bits of its values as Q8_0 in rows of 16 (the
 * same integers, the same d), Q5_1 q5_1_ref_dot's. */
static void test_q5_r16(void)
{
    enum { N = 256, R = 19, NB = N / 32, TT = KVP_MM_TILE };
    static uint8_t q[R * NB * 24];
    static float x[TT][N];
    static kvp_q8blk xq[TT][NB];
    kvp_err err = {0};
    const kvp_cpu_kernels *tables[] = {kvp_cpu_kernels_vnni(), kvp_cpu_kernels_amx()};
    for (int q51 = 0; q51 < 2; q51++) {
        int dt = q51 ? KVP_DTYPE_Q5_1 : KVP_DTYPE_Q5_0, as = q51 ? KVP_CPU_DTYPE_Q5_1_R16 : KVP_CPU_DTYPE_Q5_0_R16;
        size_t bb = q51 ? 24 : 22;
        for (size_t i = 0; i < R * NB * bb; i++)
            q[i] = (uint8_t)((frand() + 1) * 128);
        for (size_t o = 0; o < R * NB * bb; o += bb) { /* sane f16 scales and minimums */
            kvp_put16(q + o, kvp_f32_to_f16(0.01f + 0.01f * frand()));
            if (q51)
                kvp_put16(q + o + 2, kvp_f32_to_f16(0.1f * frand()));
        }
        for (int t = 0; t < TT; t++)
            for (int i = 0; i < N; i++)
                x[t][i] = frand();
        kvp_weight w = {.name = kvp_dtype_name((uint32_t)dt), .dtype = dt, .n_in = N, .n_out = R,
                        .row_bytes = NB * bb, .data = q},
                   r16, q8, q8r;
        CHECK_EQ_I64(kvp_cpu_as_r16(&w, &r16, &err), 1);
        CHECK_EQ_I64(r16.dtype, as);
        if (!q51) {
            CHECK_EQ_I64(kvp_cpu_q5_0_as_q8_0(&w, &q8, &err), 1);
            CHECK_EQ_I64(kvp_cpu_as_r16(&q8, &q8r, &err), 1);
        }
        for (size_t ti = 0; ti < sizeof tables / sizeof *tables; ti++) {
            const kvp_cpu_kernels *k = tables[ti];
            const kvp_q8blk *xp[TT];
            if (!r16_table_tokens(k, as, x[0], N, TT, xq[0], NB, xp))
                continue;
            int bad = 0;
            for (uint32_t nt = 1; nt <= TT; nt++)
                for (uint32_t t0 = 0; t0 + nt <= TT; t0 += nt) {
                    float y[TT][R], yq[TT][R];
                    for (int pass = 0; pass < (q51 ? 1 : 2); pass++)
                        r16_products(k, pass ? &q8r : &r16, xp + t0, nt, (pass ? yq : y)[0]);
                    for (uint32_t t = 0; t < nt; t++)
                        for (uint32_t r = 0; r < R; r++) {
                            float ref = q51 ? q5_1_ref_dot(q + (size_t)r * w.row_bytes, xq[t0 + t], NB) : yq[t][r];
                            bad += memcmp(&y[t][r], &ref, 4) != 0;
                        }
                }
            CHECK_MSG(bad == 0, "%s: %s in rows of 16: %d outputs differ from the reference's bits", k->isa, w.name,
                      bad);
        }
        kvp_cpu_repacked_free(&r16);
        if (!q51)
            kvp_cpu_repacked_free(&q8), kvp_cpu_repacked_free(&q8r);
    }
}

/* The Q4_K (Q5_K) product of the rows of 16: per block of 32 the exact
 * integer sum(q x) into one FMA by (d sc) dx, the minimum's dmin m times
 * -s into a second chain, the two added at the end. */
static float q45k_ref_dot(int q5, const uint8_t *row, const kvp_q8blk *x, uint32_t n)
{
    float acc = 0, ma = 0;
    for (uint32_t i = 0; i < n / 256; i++, row += q5 ? 176 : 144) {
        float d = kvp_f16_to_f32((uint16_t)(row[0] | row[1] << 8)), dmin = kvp_f16_to_f32((uint16_t)(row[2] | row[3] << 8));
        uint8_t q[256];
        if (q5)
            kvp_q5k_codes(row, q);
        for (int e = 0; !q5 && e < 256; e++)
            q[e] = (uint8_t)((row[16 + 32 * (e / 64) + e % 32] >> (4 * (e / 32 % 2))) & 15);
        for (int j = 0; j < 8; j++) {
            const kvp_q8blk *xb = &x[i * 8 + (uint32_t)j];
            int sc, m, isum = 0;
            kvp_q4k_scale_min(row + 4, j, &sc, &m);
            for (int e = 0; e < 32; e++)
                isum += q[32 * j + e] * xb->q[e];
            acc = fmaf((float)isum, d * (float)sc * xb->d, acc);
            ma = fmaf(dmin * (float)m, -xb->s, ma);
        }
    }
    return acc + ma;
}

/* test_kq_r16's reference: the K-quant's own dot (q36k_ref_dot, q2k_ref_dot, q45k_ref_dot). */
typedef struct kq_ref_ctx {
    int dtype;
    uint32_t n;
} kq_ref_ctx;

static float kq_ref(const void *ctx, const uint8_t *row, const kvp_q8blk *x)
{
    const kq_ref_ctx *c = ctx;
    switch (c->dtype) {
    case KVP_DTYPE_Q6_K: case KVP_DTYPE_Q3_K: return q36k_ref_dot(c->dtype == KVP_DTYPE_Q6_K, row, x, c->n);
    case KVP_DTYPE_Q2_K: return q2k_ref_dot(row, x, c->n);
    default: return q45k_ref_dot(c->dtype == KVP_DTYPE_Q5_K, row, x, c->n);
    }
}

/* GGUF's K-quants (Q2_K to Q6_K) in rows of 16 (19 rows: a group and a
 * padded one): read back by kvp_cpu_r16_row, the dequantizer's values bit
 * for bit; multiplied by every table that takes them (1-8 tokens), the
 * reference product's bits (q36k_ref_dot, q45k_ref_dot, q2k_ref_dot); at
 * the extremes (codes 0 and their largest; scales -128 and 127 (Q6_K),
 * -32 and 31 (Q3_K), 63 (Q4_K, Q5_K, with minimums 63), 15 (Q2_K, with
 * minimums 15); activations +-127) the exact sum; partial super-blocks
 * refused. */
static void test_kq_r16(int dtype)
{
    enum { N = 512, R = 19, NB = N / 32, TT = KVP_MM_TILE };
    const int q6 = dtype == KVP_DTYPE_Q6_K, q5 = dtype == KVP_DTYPE_Q5_K, q3 = dtype == KVP_DTYPE_Q3_K;
    const int q2 = dtype == KVP_DTYPE_Q2_K;
    const int as = q6 ? KVP_CPU_DTYPE_Q6_K_R16 : q5 ? KVP_CPU_DTYPE_Q5_K_R16 : q3 ? KVP_CPU_DTYPE_Q3_K_R16
                   : q2 ? KVP_CPU_DTYPE_Q2_K_R16 : KVP_CPU_DTYPE_Q4_K_R16;
    const size_t sb = q6 ? 210 : q5 ? 176 : q3 ? 110 : q2 ? 84 : 144;
    static uint8_t q[R * (N / 256) * 210];
    static float a[N], b[N], x[TT][N];
    static kvp_q8blk xq[TT][NB];
    kvp_err err = {0};
    kvp_weight r16;
    const char *name = kvp_dtype_name((uint32_t)dtype);
    for (int extreme = 0; extreme < 2; extreme++) {
        size_t bytes = R * (N / 256) * sb;
        kquant_row(dtype, q, bytes);
        for (int t = 0; t < TT; t++)
            for (int i = 0; i < N; i++)
                x[t][i] = extreme ? ((i + t) % 3 ? 127.0f : -127.0f) : frand();
        for (size_t o = 0; extreme && o < bytes; o += sb) { /* codes all max or all 0 by super-block */
            int hi = (o / sb) % 2;
            if (q6) {
                memset(q + o, hi ? 0xff : 0, 192);
                for (int j = 0; j < 16; j++)
                    q[o + 192 + j] = (uint8_t)(j % 3 ? 127 : 0x80);
                kvp_put16(q + o + 208, kvp_f32_to_f16(1.0f));
            } else if (q3) { /* scales 0 (-32) and 63 (31) by sub-block */
                memset(q + o, hi ? 0xff : 0, 96);
                memset(q + o + 96, hi ? 0 : 0xff, 12);
                q[o + 97] = 0x0f, q[o + 104] = 0xfc; /* scale 2 from 63 to 15 (-17), 8 from 15 to 3 (-29) */
                kvp_put16(q + o + 108, kvp_f32_to_f16(1.0f));
            } else if (q2) {
                memset(q + o, 0xff, 16); /* every scale and minimum 15 */
                memset(q + o + 16, hi ? 0xff : 0, 64);
                kvp_put16(q + o + 80, kvp_f32_to_f16(1.0f)), kvp_put16(q + o + 82, kvp_f32_to_f16(0.5f));
            } else {
                kvp_put16(q + o, kvp_f32_to_f16(1.0f)), kvp_put16(q + o + 2, kvp_f32_to_f16(0.5f));
                memset(q + o + 4, 0xff, 12); /* every scale and minimum 63 */
                memset(q + o + 16, hi ? 0xff : 0, sb - 16);
            }
        }
        kvp_weight w = {.name = name, .dtype = dtype, .n_in = N, .n_out = R, .row_bytes = 2 * sb, .data = q};
        CHECK_EQ_I64(kvp_cpu_as_r16(&w, &r16, &err), 1);
        CHECK_EQ_I64(r16.dtype, as);
        int bad = 0;
        for (uint32_t r = 0; r < R; r++) {
            CHECK(kvp_cpu_dequant_weight_row(&w, r, a) == 0 && kvp_cpu_r16_row(&r16, r, b) == 0);
            bad += first_unlike(a, b, N) >= 0;
        }
        CHECK_MSG(bad == 0, "%s: %d rows in rows of 16 differ from the stored ones", name, bad);
        kq_ref_ctx rc = {dtype, N};
        r16_check_tables(&w, &r16, x[0], xq[0], extreme, kq_ref, &rc);
        kvp_cpu_repacked_free(&r16);
    }
    kvp_weight part = {.name = name, .dtype = dtype, .n_in = 256 + 32, .n_out = 1, .row_bytes = sb, .data = q};
    CHECK_EQ_I64(kvp_cpu_as_r16(&part, &r16, &err), 0);
}

/* The IQ4 product of the rows of 16, written from the format: per block
 * of 32 the exact integer sum(v[q] x) into one FMA by d dx (IQ4_XS: by
 * (d (ls - 32)) dx). */
static float iq4_ref_dot(int nl, const uint8_t *row, const kvp_q8blk *x, uint32_t nb)
{
    float acc = 0;
    for (uint32_t b = 0; b < nb; b++) {
        const uint8_t *sb = row + (nl ? 18 * b : 136 * (b / 8));
        const uint8_t *qs = nl ? sb + 2 : sb + 8 + 16 * (b % 8);
        float d = kvp_f16_to_f32((uint16_t)(sb[0] | sb[1] << 8));
        float s = nl ? d : d * (float)kvp_iq4xs_scale(sb, (int)(b % 8));
        int8_t c[32];
        kvp_iq4_codes(qs, c);
        int isum = 0;
        for (int e = 0; e < 32; e++)
            isum += c[e] * x[b].q[e];
        acc = fmaf((float)isum, s * x[b].d, acc);
    }
    return acc + 0.0f;
}

static float iq4_ref(const void *ctx, const uint8_t *row, const kvp_q8blk *x)
{
    const kq_ref_ctx *c = ctx;
    return iq4_ref_dot(c->dtype == KVP_DTYPE_IQ4_NL, row, x, c->n / 32);
}

/* IQ4_NL and IQ4_XS in rows of 16 (19 rows: a group and a padded one), on
 * every table that takes them, 1-8 tokens: iq4_ref_dot's bits, with
 * random blocks and at the extremes (indices all 0 or all 15, IQ4_XS's ls
 * 0 and 63, activations +-127), where the product is the exact sum too. */
static void test_iq4_r16(int dtype)
{
    enum { N = 512, R = 19, NB = N / 32, TT = KVP_MM_TILE };
    const int nl = dtype == KVP_DTYPE_IQ4_NL;
    const size_t rb = nl ? NB * 18 : N / 256 * 136;
    const int as = nl ? KVP_CPU_DTYPE_IQ4_NL_R16 : KVP_CPU_DTYPE_IQ4_XS_R16;
    static uint8_t q[R * NB * 18];
    static float x[TT][N];
    static kvp_q8blk xq[TT][NB];
    const char *name = kvp_dtype_name((uint32_t)dtype);
    kvp_err err = {0};
    for (int extreme = 0; extreme < 2; extreme++) {
        kquant_row(dtype, q, R * rb);
        for (size_t o = 0; extreme && o < R * rb; o += nl ? 18 : 136) { /* d 1; indices 0 or 15 by block */
            int hi = (int)(o / (nl ? 18 : 136)) % 2;
            kvp_put16(q + o, kvp_f32_to_f16(1.0f));
            if (nl) {
                memset(q + o + 2, hi ? 0xff : 0, 16);
            } else { /* ls 63 for sub-blocks 0-3, 0 for 4-7 */
                q[o + 2] = 0xff, q[o + 3] = 0x00;
                memset(q + o + 4, 0xff, 2), memset(q + o + 6, 0, 2);
                memset(q + o + 8, hi ? 0xff : 0, 128);
            }
        }
        for (int t = 0; t < TT; t++)
            for (int i = 0; i < N; i++)
                x[t][i] = extreme ? ((i + t) % 3 ? 127.0f : -127.0f) : frand();
        kvp_weight w = {.name = name, .dtype = dtype, .n_in = N, .n_out = R, .row_bytes = rb, .data = q}, r16;
        CHECK_EQ_I64(kvp_cpu_as_r16(&w, &r16, &err), 1);
        CHECK_EQ_I64(r16.dtype, as);
        kq_ref_ctx rc = {dtype, N};
        r16_check_tables(&w, &r16, x[0], xq[0], extreme, iq4_ref, &rc);
        kvp_cpu_repacked_free(&r16);
    }
}

/* GGUF's IQ4_NL and IQ4_XS (19 rows of 512, random indices and scales):
 * rewritten (kvp_cpu_repack) as Q8_0 and as int8 with a scale a group of
 * 32, and in rows of 16 (kvp_cpu_as_r16), each read back gives the
 * dequantizer's values bit for bit; multiplied on each table (1, 5 and 19
 * tokens), the IQ4 weight gives the bits of its rewritten form prepared as
 * a weight of its own, and the product of its dequantized f32 rows to 8-bit
 * activations' error (test_scaled_one's bound: 4e-3 of sum |w x|); other
 * kinds and partial blocks are left alone. */
static void test_iq4_repack(int dtype)
{
    enum { N = 512, R = 19, NT = 19 };
    const int nl = dtype == KVP_DTYPE_IQ4_NL;
    const size_t rb = nl ? N / 32 * 18 : N / 256 * 136;
    static uint8_t q[R * (N / 32) * 18];
    static float a[N], b[N], deq[R * N], x[NT * N], y[NT * R], yr[NT * R], yf[NT * R];
    const char *name = kvp_dtype_name((uint32_t)dtype);
    kvp_err err = {0};
    kquant_row(dtype, q, R * rb);
    for (size_t o = 0; !nl && o < R * rb; o += 136) /* sub-block 3 of each: ls 32, a zero scale */
        q[o + 5] &= 0x0f, q[o + 2] = (uint8_t)((q[o + 2] & 0x3f) | 0x80);
    for (int i = 0; i < NT * N; i++)
        x[i] = frand();
    kvp_weight w = {.name = name, .dtype = dtype, .n_in = N, .n_out = R, .row_bytes = rb, .data = q}, re, r16;
    CHECK_EQ_I64(kvp_cpu_repackable(&w), 1);
    CHECK_EQ_I64(kvp_cpu_repack(&w, &re, &err), 1);
    CHECK_EQ_I64(re.dtype, nl ? KVP_DTYPE_Q8_0 : KVP_DTYPE_I8);
    CHECK_EQ_I64(kvp_cpu_as_r16(&w, &r16, &err), 1);
    CHECK_EQ_I64(r16.dtype, nl ? KVP_CPU_DTYPE_IQ4_NL_R16 : KVP_CPU_DTYPE_IQ4_XS_R16);
    int bad = 0, bad16 = 0;
    for (uint32_t r = 0; r < R; r++) {
        CHECK(kvp_cpu_dequant_weight_row(&w, r, deq + (size_t)r * N) == 0);
        CHECK(kvp_cpu_dequant_weight_row(&re, r, a) == 0 && kvp_cpu_r16_row(&r16, r, b) == 0);
        bad += first_unlike(deq + (size_t)r * N, a, N) >= 0;
        bad16 += first_unlike(deq + (size_t)r * N, b, N) >= 0;
    }
    CHECK_MSG(bad == 0 && bad16 == 0, "%s: %d rows rewritten, %d in rows of 16 differ from the stored ones", name, bad,
              bad16);
    kvp_cpu_repacked_free(&r16);
    kvp_weight wf = {.name = "f32", .dtype = KVP_DTYPE_F32, .n_in = N, .n_out = R, .row_bytes = N * 4, .data = deq};
    static const unsigned flags[] = {0, KVP_CPU_PORTABLE};
    for (size_t fi = 0; fi < sizeof flags / sizeof *flags; fi++) {
        kvp_backend *be = rig_backend(flags[fi]);
        if (!be)
            continue;
        kvp_weight wi = w, wr = re, wd = wf;
        CHECK_MSG(be->ops->prepare_weight(be, &wi, &err) == 0 && be->ops->prepare_weight(be, &wr, &err) == 0 &&
                      be->ops->prepare_weight(be, &wd, &err) == 0,
                  "prepare: %s", err.msg);
        rig_reserve(be, NT, N, 0, 0, NULL);
        double worst = 0;
        int differ = 0;
        static const uint32_t toks[] = {1, 5, NT};
        for (size_t ti = 0; ti < sizeof toks / sizeof *toks; ti++) {
            uint32_t nt = toks[ti];
            CHECK_MSG(be->ops->matmul(be, &wi, x, y, nt, &err) == 0 && be->ops->matmul(be, &wr, x, yr, nt, &err) == 0 &&
                          be->ops->matmul(be, &wd, x, yf, nt, &err) == 0,
                      "%s", err.msg);
            differ += memcmp(y, yr, sizeof(float) * nt * R) != 0;
            for (uint32_t t = 0; t < nt; t++)
                for (uint32_t r = 0; r < R; r++) {
                    double mag = 0;
                    for (int i = 0; i < N; i++)
                        mag += fabs((double)deq[(size_t)r * N + i] * x[(size_t)t * N + (size_t)i]);
                    double e = fabs((double)y[t * R + r] - yf[t * R + r]) / mag;
                    worst = e > worst ? e : worst;
                }
        }
        CHECK_MSG(differ == 0, "%s %s: the product differs from its rewritten form's", kvp_backend_cpu_isa(be), name);
        CHECK_MSG(worst < 4e-3, "%s %s: max error %g of sum |w x| against its f32 rows", kvp_backend_cpu_isa(be), name,
                  worst);
        be->ops->release_weight(be, &wi), be->ops->release_weight(be, &wr), be->ops->release_weight(be, &wd);
        kvp_backend_free(be);
    }
    kvp_cpu_repacked_free(&re);
    w.n_in = nl ? N - 16 : N - 32, w.row_bytes = rb; /* not whole blocks */
    CHECK_EQ_I64(kvp_cpu_repackable(&w), 0);
    CHECK_EQ_I64(kvp_cpu_repack(&w, &re, &err), 0);
    w.n_in = N, w.dtype = nl ? KVP_DTYPE_Q4_0 : KVP_DTYPE_Q4_K; /* the other's function leaves w alone */
    CHECK_EQ_I64((nl ? kvp_cpu_iq4nl_as_q8_0 : kvp_cpu_iq4xs_as_i8)(&w, &re, &err), 0);
}

/* A GGUF tensor of a type the engine cannot read (one Q3_K tensor's type
 * id turned into IQ3_S's, the same 110 bytes a super-block) is refused
 * naming the tensor and its GGUF type. */
static void test_unread_type(const char *dir)
{
    tiny_cfg c = {.n_layer = 1, .n_embd = 256, .n_ff = 512, .n_head = 2, .n_head_kv = 1, .n_vocab = 96,
                  .wtype = KVP_DTYPE_Q3_K, .tied = 1};
    char path[512];
    snprintf(path, sizeof path, "%s/iq3.gguf", dir);
    size_t len;
    uint8_t *file = tiny_gguf(&c, &len);
    static const char name[] = "blk.0.ffn_down.weight";
    uint8_t *at = NULL;
    for (size_t i = 8; i + sizeof name < len && !at; i++) /* the tensor info: u64 length, name, u32 dims, u64 x dims, u32 type */
        if (!memcmp(file + i, name, sizeof name - 1) && file[i - 8] == sizeof name - 1)
            at = file + i + sizeof name - 1;
    CHECK(at != NULL);
    if (at) {
        uint32_t nd = (uint32_t)at[0] | (uint32_t)at[1] << 8;
        uint8_t *ty = at + 4 + 8 * nd;
        CHECK_EQ_I64(ty[0], 11); /* Q3_K */
        ty[0] = 21;              /* IQ3_S */
        CHECK(write_file(path, file, len) == 0);
        kvp_model *m = NULL;
        kvp_err err = {0};
        CHECK(kvp_model_load(&m, path, &err) < 0);
        CHECK_MSG(strstr(err.msg, "tensor blk.0.ffn_down.weight: type iq3_s is not supported") != NULL, "got: %s",
                  err.msg);
        if (m)
            kvp_model_free(m);
        unlink(path);
    }
    free(file);
}

static void test_kquants(const char *dir)
{
    char path[512];
    snprintf(path, sizeof path, "%s/kq.gguf", dir);
    enum { N = 11 };
    uint32_t tok[N];
    /* Q4_K untied, Q6_K tied, Q4_K tied (its output head's other form
     * gives its file pages back, which the embedding lookups then read),
     * and Q5_K, Q2_K, Q3_K, IQ4_NL and IQ4_XS tied */
    int types[] = {KVP_DTYPE_Q4_K, KVP_DTYPE_Q6_K, KVP_DTYPE_Q4_K, KVP_DTYPE_Q5_K,
                   KVP_DTYPE_Q2_K, KVP_DTYPE_Q3_K, KVP_DTYPE_IQ4_NL, KVP_DTYPE_IQ4_XS};
    for (int k = 0; k < 8; k++) {
        tiny_cfg c = {.n_layer = 2, .n_embd = 256, .n_ff = 512, .n_head = 4, .n_head_kv = 2, .n_vocab = 96,
                      .wtype = types[k], .tied = k > 0};
        size_t len;
        uint8_t *file = tiny_gguf(&c, &len);
        CHECK(write_file(path, file, len) == 0);
        free(file);
        for (int i = 0; i < N; i++)
            tok[i] = (uint32_t)(i * 37 + 5) % c.n_vocab;
        float *got = malloc(sizeof(float) * N * c.n_vocab), *naive = malloc(sizeof(float) * N * c.n_vocab);
        float *port = malloc(sizeof(float) * N * c.n_vocab);
        rig r;
        if (run_all(path, 0, tok, N, got, &r) < 0) {
            CHECK_MSG(0, "%s: load or run failed", kvp_dtype_name((uint32_t)types[k]));
        } else {
            check_rows_decode(r.m, kvp_dtype_name((uint32_t)types[k]));
            naive_forward(r.m, tok, N, naive);
            double e = rel_err(naive, got, (size_t)N * c.n_vocab);
            /* Q4_K as int4 or in rows of 16 (backend_cpu_repack.c), IQ4_NL
             * as Q8_0, IQ4_XS as int8, in every table: 8-bit activations;
             * Q6_K and Q5_K in rows of 16 where the table takes them (VNNI):
             * 8-bit activations against the portable table's f32 rows;
             * elsewhere f32 math in both */
            int iq4 = types[k] == KVP_DTYPE_IQ4_NL || types[k] == KVP_DTYPE_IQ4_XS;
            int as_i4 = types[k] == KVP_DTYPE_Q4_K || iq4, q6_r16 = !as_i4 && kvp_cpu_kernels_vnni() != NULL;
            /* (2 and 3 bits: outputs that cancel more, so a larger share of
             * error; IQ4's symmetric random weights, IQ4_XS's scales -32 to
             * 31 at random, more still (0.02 and 0.13 here): test_tiny's
             * bound for Q8_0, whose kernels they use; their matmuls alone
             * are held to 4e-3 in test_iq4_repack) */
            int low = types[k] == KVP_DTYPE_Q2_K || types[k] == KVP_DTYPE_Q3_K;
            double tol = iq4 ? 0.25 : as_i4 ? 2e-2 : q6_r16 ? (low ? 5e-2 : 3e-2) : 1e-4, tol_port = as_i4 ? 3e-3 : tol;
            CHECK_MSG(e < tol, "%s: engine vs naive: max rel %g", kvp_dtype_name((uint32_t)types[k]), e);
            CHECK(run_all(path, KVP_CPU_PORTABLE, tok, N, port, NULL) == 0);
            double ep = rel_err(port, got, (size_t)N * c.n_vocab);
            CHECK_MSG(ep < tol_port, "%s: portable vs fast: max rel %g",
                      kvp_dtype_name((uint32_t)types[k]), ep);
            rig_close(&r);
        }
        free(got), free(naive), free(port);
    }
    unlink(path);
}

/* Self-speculation in the target's own cache (kvp_engine_create_first,
 * draftmodel's on_target): the first layers draft the same tokens as the
 * same layers over a cache of their own; the request's sequence comes back
 * as it was (length, tokens, no block kept); the verify step that follows
 * gives the very logits of a sequence no draft ever touched (every layer
 * of the drafted slots is written again); and an engine of fewer layers is
 * still refused by kvp_engine_create. */
static void test_first_layers(const char *dir)
{
    tiny_cfg c = {.n_layer = 3, .n_embd = 128, .n_ff = 320, .n_head = 4, .n_head_kv = 2, .n_vocab = 96,
                  .wtype = KVP_DTYPE_Q8_0, .tied = 1};
    char path[512];
    rig r;
    int rc = tiny_open(&r, dir, "tiny-skip.gguf", &c, KVP_DTYPE_F16, 64, 4, path);
    if (rc < 0)
        return;
    kvp_err err = {0};
    kvp_model *first = NULL;
    kvp_engine *fe = NULL, *oe = NULL, *bad = NULL;
    kvp_kvcache *okc = NULL;
    kvp_kvcache_opts ko;
    kvp_kvcache_opts_init(&ko);
    ko.dtype = KVP_DTYPE_F16, ko.n_blocks = 64, ko.block_size = 4;
    if (kvp_model_first_layers(&first, r.m, 2, &err) < 0 || kvp_kvcache_create(&okc, &first->cfg, &ko, r.be, &err) < 0 ||
        kvp_engine_create(&oe, first, r.be, okc, &err) < 0 || kvp_engine_create_first(&fe, first, r.be, r.kc, &err) < 0) {
        CHECK_MSG(0, "first layers: %s", err.msg);
        goto out;
    }
    CHECK_EQ_I64(kvp_engine_create(&bad, first, r.be, r.kc, &err), KVP_EMISMATCH);
    enum { N = 23, K = 5 };
    uint32_t tok[N], got[K], want[K], V = c.n_vocab;
    for (int i = 0; i < N; i++)
        tok[i] = (uint32_t)(i * 29 + 3) % c.n_vocab;
    kvp_draft_model on = {0}, own = {0};
    CHECK(kvp_draft_model_init(&on, fe, r.kc, &err) == 0 && kvp_draft_model_init(&own, oe, okc, &err) == 0);
    on.on_target = 1;
    int s = kvp_kvcache_seq_new(r.kc, &err);
    CHECK(s >= 0 && kvp_engine_prefill(r.e, s, tok, N - 1, 0, NULL, &err) == 0);
    kvp_kvcache_stats before, after;
    kvp_kvcache_get_stats(r.kc, &before);
    void *st_on = (void *)(intptr_t)(s + 1), *st_own = NULL;
    CHECK_EQ_U64(kvp_draft_model_draft(&on, &st_on, tok, N, K, got), K);
    CHECK_EQ_U64(kvp_draft_model_draft(&own, &st_own, tok, N, K, want), K);
    CHECK(memcmp(got, want, sizeof got) == 0);
    kvp_kvcache_get_stats(r.kc, &after);
    CHECK_EQ_U64(kvp_kvcache_seq_len(r.kc, s), N - 1);
    CHECK(memcmp(kvp_kvcache_seq_tokens(r.kc, s), tok, (N - 1) * sizeof *tok) == 0);
    CHECK_EQ_U64(after.n_free, before.n_free);
    kvp_draft_model_release(&on, st_on); /* names the target's sequence: not freed */
    CHECK_EQ_U64(kvp_kvcache_seq_len(r.kc, s), N - 1);
    /* the verify step over the drafted slots, against a sequence never drafted on */
    uint32_t step[1 + K];
    step[0] = tok[N - 1];
    memcpy(step + 1, got, sizeof got);
    float *a = malloc(sizeof(float) * (1 + K) * V), *b = malloc(sizeof(float) * (1 + K) * V);
    int s2 = kvp_kvcache_seq_new(r.kc, &err);
    CHECK(s2 >= 0 && kvp_engine_prefill(r.e, s2, tok, N - 1, 0, NULL, &err) == 0);
    kvp_step_seq v1 = {.seq = s, .tokens = step, .n_tokens = 1 + K, .want = KVP_LOGITS_ALL};
    kvp_step_seq v2 = {.seq = s2, .tokens = step, .n_tokens = 1 + K, .want = KVP_LOGITS_ALL};
    CHECK(a && b && kvp_engine_step(r.e, &v1, 1, a, &err) == 1 + K && kvp_engine_step(r.e, &v2, 1, b, &err) == 1 + K);
    CHECK(a && b && memcmp(a, b, sizeof(float) * (1 + K) * V) == 0);
    free(a), free(b);
    kvp_draft_model_release(&own, st_own);
    kvp_draft_model_free(&on), kvp_draft_model_free(&own);
out:
    kvp_engine_free(fe), kvp_engine_free(oe), kvp_engine_free(bad);
    kvp_kvcache_free(okc);
    kvp_model_free(first);
    rig_close(&r);
    unlink(path);
}

/* Each test draws from a stream of its own, seeded by its name, so its
 * random weights and data do not depend on which tests ran before it or
 * how many numbers they drew (one CPU compares more kernel sets than
 * another). */
static void rng_for(const char *test)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a of the name; never 0, which xorshift keeps */
    for (const char *c = test; *c; c++)
        h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
    rng_state = h ? h : 0x9e3779b97f4a7c15ull;
}

#define RUN(test, ...) (rng_for(#test), test(__VA_ARGS__))

int main(void)
{
    char dir[] = "/tmp/kvp-test-engine.XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0);
        return unit_done();
    }
    RUN(test_kernels);
    RUN(test_attention);
    RUN(test_tiny, dir, KVP_DTYPE_F32, 0, 4, 4, KVP_DTYPE_F32, 1e-4);
    RUN(test_tiny, dir, KVP_DTYPE_F16, 1, 4, 2, KVP_DTYPE_F32, 1e-4);
    RUN(test_tiny, dir, KVP_DTYPE_BF16, 0, 4, 1, KVP_DTYPE_BF16, 0.1);
    /* quantized weights: activations are quantized to 8 bits, so the error
     * against the f32 naive pass is that of Q8 activations */
    RUN(test_tiny, dir, KVP_DTYPE_Q8_0, 1, 4, 2, KVP_DTYPE_F16, 0.25);
    RUN(test_tiny, dir, KVP_DTYPE_Q4_1, 0, 8, 2, KVP_DTYPE_F16, 0.25);
    RUN(test_tiny, dir, KVP_DTYPE_Q4_0, 1, 2, 2, KVP_DTYPE_F16, 0.25);
    RUN(test_tied_prepared, dir);
    RUN(test_argmax_want, dir);
    RUN(test_prefix_sharing, dir);
    RUN(test_first_layers, dir);
    RUN(test_seqio, dir);
    RUN(test_scaled);
    RUN(test_nan_input_ggml);
    RUN(test_kvp_models, dir);
    RUN(test_q4k_repack);
    RUN(test_q5_0_repack);
    RUN(test_r16_repack);
    RUN(test_kq_r16, KVP_DTYPE_Q6_K);
    RUN(test_kq_r16, KVP_DTYPE_Q4_K);
    RUN(test_kq_r16, KVP_DTYPE_Q5_K);
    RUN(test_kq_r16, KVP_DTYPE_Q2_K);
    RUN(test_kq_r16, KVP_DTYPE_Q3_K);
    RUN(test_q5_r16);
    RUN(test_iq4_repack, KVP_DTYPE_IQ4_NL);
    RUN(test_iq4_r16, KVP_DTYPE_IQ4_NL);
    RUN(test_iq4_r16, KVP_DTYPE_IQ4_XS);
    RUN(test_iq4_repack, KVP_DTYPE_IQ4_XS);
    RUN(test_kquants, dir);
    RUN(test_unread_type, dir);
    RUN(test_smollm2);
    RUN(test_smollm2_hf, dir);
    RUN(test_smollm2_ct, dir, "w4a16-g64", 1e-1);
    RUN(test_smollm2_ct, dir, "w8a8-int8", 1e-1);
    RUN(test_smollm2_ct, dir, "fp8", 1e-4);
    RUN(test_rope);
    RUN(test_prefill_cancel, dir);
    rmdir(dir);
    return unit_done();
}
