/* backend_cpu_portable.c - plain C kernels: the reference every faster kernel
 * set is tested against, and what runs on CPUs without AVX2. */
#include "backend_cpu_kern.h"
#include "backend.h"
#include "quant.h"
#include "tensor.h"

#include <math.h>
#include <string.h>

static void quant_q8(const float *x, kvp_q8blk *y, uint32_t n)
{
    for (uint32_t b = 0; b < n / KVP_QK; b++, x += KVP_QK) {
        float amax = 0, probe = 0;
        for (int j = 0; j < KVP_QK; j++) {
            amax = fmaxf(amax, fabsf(x[j]));
            probe += x[j] - x[j]; /* NaN for a NaN or an infinity, else 0 */
        }
        if (isnan(probe)) {
            kvp_q8_nan_block(&y[b]);
            continue;
        }
        float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < KVP_QK; j++) {
            int q = (int)lrintf(x[j] * id);
            y[b].q[j] = (int8_t)q;
            sum += q;
        }
        y[b].d = d;
        y[b].sum = sum;
        y[b].s = d * (float)sum;
    }
}

/* Shared by Q4_0 and Q4_1: stored nibbles times the activation. */
static int dot_nibbles(const uint8_t *qs, const int8_t *xq)
{
    int s = 0;
    for (int j = 0; j < 16; j++)
        s += (qs[j] & 15) * xq[j] + (qs[j] >> 4) * xq[j + 16];
    return s;
}

/* One row by one token's blocks x[nb] (or floats x[n]): every kind's sum
 * runs through the blocks (elements) in order into one float. */
static float dot_q4_0(const kvp_blk_q4_0 *wb, const kvp_q8blk *x, uint32_t nb)
{
    float acc = 0;
    for (uint32_t b = 0; b < nb; b++) {
        float dw = kvp_f16_to_f32(wb[b].d);
        acc += dw * x[b].d * (float)dot_nibbles(wb[b].qs, x[b].q) - 8.0f * dw * x[b].s;
    }
    return acc;
}

static float dot_q4_1(const kvp_blk_q4_1 *wb, const kvp_q8blk *x, uint32_t nb)
{
    float acc = 0;
    for (uint32_t b = 0; b < nb; b++) {
        float dw = kvp_f16_to_f32(wb[b].d), mw = kvp_f16_to_f32(wb[b].m);
        acc += dw * x[b].d * (float)dot_nibbles(wb[b].qs, x[b].q) + mw * x[b].s;
    }
    return acc;
}

static float dot_q8_0(const kvp_blk_q8_0 *wb, const kvp_q8blk *x, uint32_t nb)
{
    float acc = 0;
    for (uint32_t b = 0; b < nb; b++) {
        int s = 0;
        for (int j = 0; j < KVP_QK; j++)
            s += wb[b].qs[j] * x[b].q[j];
        acc += kvp_f16_to_f32(wb[b].d) * x[b].d * (float)s;
    }
    return acc;
}

/* f32, f16 or bf16 weights */
static float dot_f(int dtype, const void *w, const float *x, uint32_t n)
{
    float acc = 0;
    for (uint32_t i = 0; i < n; i++)
        acc += (dtype == KVP_DTYPE_F32 ? ((const float *)w)[i] : dtype == KVP_DTYPE_F16
                ? kvp_f16_to_f32(((const uint16_t *)w)[i]) : kvp_bf16_to_f32(((const uint16_t *)w)[i])) * x[i];
    return acc;
}

/* ---- scaled schemes ---- */

/* i8 (is4 0) or i4 (1): per group the blocks' sums, then times the scale */
static float dot_int(int is4, const uint8_t *q, const float *sc, const float *zp, uint32_t g, const kvp_q8blk *x,
                     uint32_t nb)
{
    uint32_t bpg = g / KVP_QK; /* blocks per scale */
    float acc = 0;
    for (uint32_t b0 = 0; b0 < nb; b0 += bpg) {
        float z = (zp ? zp[b0 / bpg] : 0.0f) + (is4 ? 8.0f : 0.0f), ga = 0;
        for (uint32_t b = b0; b < b0 + bpg; b++) {
            int s = 0;
            if (is4) {
                const uint8_t *qb = q + (size_t)b * 16;
                for (int j = 0; j < 16; j++)
                    s += ((qb[j] & 15) ^ 8) * x[b].q[2 * j] + ((qb[j] >> 4) ^ 8) * x[b].q[2 * j + 1];
            } else {
                for (int j = 0; j < KVP_QK; j++)
                    s += (int8_t)q[(size_t)b * KVP_QK + j] * x[b].q[j];
            }
            ga += x[b].d * (float)s - z * x[b].s;
        }
        acc += sc[b0 / bpg] * ga;
    }
    return acc;
}

static float dot_e4m3(const uint8_t *q, const float *sc, uint32_t g, const float *x, uint32_t n)
{
    float acc = 0;
    for (uint32_t i0 = 0; i0 < n; i0 += g) {
        float ga = 0;
        for (uint32_t i = i0; i < i0 + g; i++)
            ga += kvp_e4m3_to_f32(q[i]) * x[i];
        acc += sc[i0 / g] * ga;
    }
    return acc;
}

/* Every (row, token) of the piece on its own. */
static void mm_kind(int dtype, const kvp_mm_blk *b)
{
    uint32_t nb = b->n / KVP_QK;
    for (uint32_t r = 0; r < b->nr; r++) {
        const uint8_t *w = b->w + (size_t)r * b->w_stride;
        const float *sc = b->sc ? b->sc + (size_t)r * b->sc_stride : NULL;
        const float *zp = b->zp ? b->zp + (size_t)r * b->sc_stride : NULL;
        for (uint32_t t = 0; t < b->nt; t++) {
            float v;
            switch (dtype) {
            case KVP_DTYPE_Q4_0: v = dot_q4_0((const kvp_blk_q4_0 *)w, b->xq[t], nb); break;
            case KVP_DTYPE_Q4_1: v = dot_q4_1((const kvp_blk_q4_1 *)w, b->xq[t], nb); break;
            case KVP_DTYPE_Q8_0: v = dot_q8_0((const kvp_blk_q8_0 *)w, b->xq[t], nb); break;
            case KVP_DTYPE_I8: v = dot_int(0, w, sc, zp, b->g, b->xq[t], nb); break;
            case KVP_DTYPE_I4: v = dot_int(1, w, sc, zp, b->g, b->xq[t], nb); break;
            case KVP_DTYPE_FP8_E4M3: v = dot_e4m3(w, sc, b->g, b->xf[t], b->n); break;
            default: v = dot_f(dtype, w, b->xf[t], b->n); break;
            }
            b->y[(size_t)t * b->ldy + r] = v;
        }
    }
}

static void mm_q4_0(const kvp_mm_blk *b) { mm_kind(KVP_DTYPE_Q4_0, b); }
static void mm_q4_1(const kvp_mm_blk *b) { mm_kind(KVP_DTYPE_Q4_1, b); }
static void mm_q8_0(const kvp_mm_blk *b) { mm_kind(KVP_DTYPE_Q8_0, b); }
static void mm_i8(const kvp_mm_blk *b) { mm_kind(KVP_DTYPE_I8, b); }
static void mm_i4(const kvp_mm_blk *b) { mm_kind(KVP_DTYPE_I4, b); }
static void mm_f32(const kvp_mm_blk *b) { mm_kind(KVP_DTYPE_F32, b); }
static void mm_f16(const kvp_mm_blk *b) { mm_kind(KVP_DTYPE_F16, b); }
static void mm_bf16(const kvp_mm_blk *b) { mm_kind(KVP_DTYPE_BF16, b); }
static void mm_e4m3(const kvp_mm_blk *b) { mm_kind(KVP_DTYPE_FP8_E4M3, b); }

/* Element i of a K/V row: a float kind's value, a scaled kind's code's
 * value, unscaled (fp8 e4m3's / 256: backend_cpu_kern.h). */
static inline float kv_elem(int dtype, const void *p, uint32_t i)
{
    if (dtype == KVP_DTYPE_FP8_E4M3)
        return kvp_e4m3_to_f32(((const uint8_t *)p)[i]) * (1.0f / 256.0f);
    if (dtype == KVP_DTYPE_I8)
        return (float)((const int8_t *)p)[i];
    if (dtype == KVP_DTYPE_F16)
        return kvp_f16_to_f32(((const uint16_t *)p)[i]);
    if (dtype == KVP_DTYPE_BF16)
        return kvp_bf16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

static void kv_f32(int dtype, const void *src, float *dst, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        dst[i] = kv_elem(dtype, src, i);
}

static void kv_f16_e4m3(const uint8_t *src, uint16_t *dst, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        dst[i] = kvp_e4m3_f16_bits(src[i]);
}

static void att_scores(const float *q, uint32_t nq, int dtype, const void *k, uint32_t np, uint32_t hd, float *s,
                       uint32_t ldq)
{
    for (uint32_t p = 0; p < np; p++)
        for (uint32_t j = 0; j < ldq; j++) {
            float acc = 0;
            for (uint32_t d = 0; j < nq && d < hd; d++)
                acc += q[(size_t)j * hd + d] * kv_elem(dtype, k, p * hd + d);
            s[(size_t)p * ldq + j] = acc;
        }
}

static void att_softmax(float *s, uint32_t ldq, uint32_t np, const int32_t *lim, float *mx, float *sum)
{
    for (uint32_t j = 0; j < ldq; j++) {
        uint32_t n = (uint32_t)lim[j] < np ? (uint32_t)lim[j] : np;
        float m = -INFINITY, t = 0;
        for (uint32_t p = 0; p < n; p++)
            m = fmaxf(m, s[(size_t)p * ldq + j]);
        for (uint32_t p = 0; p < np; p++) {
            float *e = &s[(size_t)p * ldq + j];
            *e = p < n ? expf(*e - m) : 0.0f;
            t += *e;
        }
        mx[j] = m, sum[j] = t;
    }
}

static void att_values(const float *s, uint32_t ldq, uint32_t nq, int dtype, const void *v, uint32_t np,
                       uint32_t hd, float *o)
{
    for (uint32_t j = 0; j < nq; j++)
        for (uint32_t p = 0; p < np; p++)
            for (uint32_t i = 0; i < hd; i++)
                o[(size_t)j * hd + i] += s[(size_t)p * ldq + j] * kv_elem(dtype, v, p * hd + i);
}

static void silu_mul(float *g, const float *u, size_t n)
{
    for (size_t i = 0; i < n; i++)
        g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void rms_row(const float *x, const float *w, float *y, uint32_t n, float eps)
{
    double l[8] = {0};
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            l[j] += (double)x[i + j] * x[i + j];
    double ss = ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
    for (; i < n; i++)
        ss += (double)x[i] * x[i];
    float s = (float)(1.0 / sqrt(ss / n + eps));
    for (i = 0; i < n; i++)
        y[i] = x[i] * s * w[i];
}

const kvp_cpu_kernels kvp_cpu_kernels_portable = {
    .isa = "portable",
    .tile_tok = 4,
    .few_tok = 4, /* no tiles */
    .tile_unit = KVP_QK,
    .quant_q8 = quant_q8,
    .mm_q4_0 = mm_q4_0,
    .mm_q4_1 = mm_q4_1,
    .mm_q8_0 = mm_q8_0,
    .mm_i8 = mm_i8,
    .mm_i4 = mm_i4,
    .mm_f32 = mm_f32,
    .mm_f16 = mm_f16,
    .mm_bf16 = mm_bf16,
    .mm_e4m3 = mm_e4m3,
    .kv_f32 = kv_f32,
    .kv_f16_e4m3 = kv_f16_e4m3,
    .att_scores = att_scores,
    .att_softmax = att_softmax,
    .att_values = att_values,
    .silu_mul = silu_mul,
    .rms_row = rms_row,
    .weight_row = kvp_cpu_dequant_weight_row,
};

int kvp_cpu_dequant_row(int dtype, const void *src, float *dst, uint32_t n)
{
    switch (dtype) {
    case KVP_DTYPE_F32:
        memcpy(dst, src, (size_t)n * 4);
        return 0;
    case KVP_DTYPE_F16:
    case KVP_DTYPE_BF16:
        for (uint32_t i = 0; i < n; i++)
            dst[i] = kv_elem(dtype, src, i);
        return 0;
    case KVP_DTYPE_Q4_0:
    case KVP_DTYPE_Q4_1: {
        /* Q4_0 and Q4_1 differ only in the header; walk by block size. */
        const uint8_t *p = src;
        size_t bb = dtype == KVP_DTYPE_Q4_0 ? sizeof(kvp_blk_q4_0) : sizeof(kvp_blk_q4_1);
        for (uint32_t b = 0; b < n / KVP_QK; b++, p += bb, dst += KVP_QK) {
            float d = kvp_f16_to_f32((uint16_t)(p[0] | p[1] << 8)), m;
            const uint8_t *qs;
            if (dtype == KVP_DTYPE_Q4_0) {
                m = -8.0f * d;
                qs = p + 2;
            } else {
                m = kvp_f16_to_f32((uint16_t)(p[2] | p[3] << 8));
                qs = p + 4;
            }
            for (int j = 0; j < 16; j++) {
                dst[j] = (float)(qs[j] & 15) * d + m;
                dst[j + 16] = (float)(qs[j] >> 4) * d + m;
            }
        }
        return 0;
    }
    case KVP_DTYPE_Q8_0: {
        const kvp_blk_q8_0 *b = src;
        for (uint32_t i = 0; i < n / KVP_QK; i++, dst += KVP_QK) {
            float d = kvp_f16_to_f32(b[i].d);
            for (int j = 0; j < KVP_QK; j++)
                dst[j] = (float)b[i].qs[j] * d;
        }
        return 0;
    }
    /* types with no dot kernel: the matmul runs them a row at a time in f32 */
    case KVP_DTYPE_Q5_0: kvp_dequantize_row_q5_0(src, dst, n); return 0;
    case KVP_DTYPE_Q5_1: kvp_dequantize_row_q5_1(src, dst, n); return 0;
    case KVP_DTYPE_Q4_K: kvp_dequantize_row_q4_k(src, dst, n); return 0;
    case KVP_DTYPE_Q2_K: kvp_dequantize_row_q2_k(src, dst, n); return 0;
    case KVP_DTYPE_Q3_K: kvp_dequantize_row_q3_k(src, dst, n); return 0;
    case KVP_DTYPE_IQ4_NL: kvp_dequantize_row_iq4_nl(src, dst, n); return 0;
    case KVP_DTYPE_IQ4_XS: kvp_dequantize_row_iq4_xs(src, dst, n); return 0;
    case KVP_DTYPE_Q5_K: kvp_dequantize_row_q5_k(src, dst, n); return 0;
    case KVP_DTYPE_Q6_K: kvp_dequantize_row_q6_k(src, dst, n); return 0;
    case KVP_DTYPE_MXFP4: kvp_dequantize_row_mxfp4(src, dst, n); return 0;
    case KVP_DTYPE_NVFP4: kvp_dequantize_row_nvfp4(src, dst, n); return 0;
    default:
        return -1;
    }
}

/* Scaled element i of a row: (q - z) * s, q decoded from the stored dtype. */
static float scaled_elem(const kvp_weight *w, const uint8_t *row, const float *sc, const float *zp, uint32_t i)
{
    float q;
    if (w->dtype == KVP_DTYPE_I8)
        q = (float)(int8_t)row[i];
    else if (w->dtype == KVP_DTYPE_I4)
        q = (float)((int)(((i & 1) ? row[i / 2] >> 4 : row[i / 2] & 15) ^ 8) - 8);
    else if (w->dtype == KVP_DTYPE_FP4_E2M1)
        q = kvp_e2m1_to_f32((uint8_t)((i & 1) ? row[i / 2] >> 4 : row[i / 2] & 15));
    else if (w->dtype == KVP_DTYPE_FP8_E5M2)
        q = kvp_e5m2_to_f32(row[i]);
    else
        q = kvp_e4m3_to_f32(row[i]);
    return (q - (zp ? zp[i / w->group] : 0.0f)) * sc[i / w->group];
}

int kvp_cpu_dequant_weight_row_ok(const kvp_weight *w)
{
    switch (w->dtype) {
    case KVP_DTYPE_F32: case KVP_DTYPE_F16: case KVP_DTYPE_BF16: case KVP_DTYPE_Q4_0: case KVP_DTYPE_Q4_1:
    case KVP_DTYPE_Q8_0: case KVP_DTYPE_Q5_0: case KVP_DTYPE_Q5_1: case KVP_DTYPE_Q4_K: case KVP_DTYPE_Q5_K:
    case KVP_DTYPE_Q6_K: case KVP_DTYPE_Q2_K: case KVP_DTYPE_Q3_K: case KVP_DTYPE_IQ4_NL: case KVP_DTYPE_IQ4_XS:
    case KVP_DTYPE_MXFP4: case KVP_DTYPE_NVFP4:
        return !w->scales && !w->zeros;
    case KVP_DTYPE_I8: case KVP_DTYPE_I4:
        return w->scales != NULL;
    case KVP_DTYPE_FP8_E4M3: case KVP_DTYPE_FP8_E5M2: case KVP_DTYPE_FP4_E2M1:
        return w->scales != NULL && !w->zeros;
    default:
        return 0;
    }
}

int kvp_cpu_dequant_weight_row(const kvp_weight *w, uint32_t r, float *dst)
{
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
    if (!kvp_cpu_dequant_weight_row_ok(w))
        return -1;
    if (w->dtype == KVP_DTYPE_NVFP4) { /* the tensor scale too */
        kvp_dequantize_row_nvfp4_g(row, dst, w->n_in, w->global != 0 ? w->global : 1.0f);
        return 0;
    }
    if (!w->scales)
        return kvp_cpu_dequant_row(w->dtype, row, dst, w->n_in);
    const float *sc = w->scales + (size_t)r * w->scale_stride;
    const float *zp = w->zeros ? w->zeros + (size_t)r * w->scale_stride : NULL;
    for (uint32_t i = 0; i < w->n_in; i++)
        dst[i] = scaled_elem(w, row, sc, zp, i);
    return 0;
}
