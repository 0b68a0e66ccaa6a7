/* quant.c - scaled quantization of tensors and error statistics
 * (see quant.h for the layouts).
 *
 * A tensor is quantized in two passes: the scales (one per scale unit: the
 * tensor, a channel or a group) from each unit's range, then the elements in
 * chunks of CHUNK elements, each chunk also dequantizing what it wrote to
 * measure the error.  Chunks run on the thread pool; their statistics are
 * merged in chunk order, so the figures do not depend on the thread count.
 */
#include "quant.h"
#include "num_impl.h"
#include "wire.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#if KVP_X86_SIMD
#include <immintrin.h>
#endif

#define CHUNK 16384 /* elements per task: a multiple of every block size and of 2 */
#define PIECE 1024  /* elements dequantized at a time for the statistics */

/* ---- statistics ---- */

void kvp_quant_stats_add(kvp_quant_stats *st, const float *x, const float *y, int64_t n)
{
    double se = 0, sr = 0, mx = st->max_abs_err;
    uint64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) {
            bad++;
            continue;
        }
        double e = (double)x[i] - (double)y[i];
        se += e * e;
        sr += (double)x[i] * (double)x[i];
        e = fabs(e);
        if (e > mx || e != e)
            mx = e;
    }
    st->n += (uint64_t)n - bad;
    st->n_nonfinite += bad;
    st->sum_sq_err += se;
    st->sum_sq_ref += sr;
    st->max_abs_err = mx;
}

void kvp_quant_stats_merge(kvp_quant_stats *into, const kvp_quant_stats *from)
{
    into->n += from->n;
    into->n_clipped += from->n_clipped;
    into->n_nonfinite += from->n_nonfinite;
    into->sum_sq_err += from->sum_sq_err;
    into->sum_sq_ref += from->sum_sq_ref;
    if (from->max_abs_err > into->max_abs_err || from->max_abs_err != from->max_abs_err)
        into->max_abs_err = from->max_abs_err;
}

void kvp_quant_stats_report(const kvp_quant_stats *st, kvp_quant_report *r)
{
    double n = st->n ? (double)st->n : 1.0;
    r->rmse = sqrt(st->sum_sq_err / n);
    r->rel_err = st->sum_sq_ref > 0 ? sqrt(st->sum_sq_err / st->sum_sq_ref) : 0.0;
    r->snr_db = st->sum_sq_err > 0 ? 10.0 * log10(st->sum_sq_ref / st->sum_sq_err) : INFINITY;
    r->max_abs_err = st->max_abs_err;
    r->clipped = (double)st->n_clipped / n;
    /* A NaN sum (a finite original reconstructed as NaN: a NaN scale) fails
     * "> 0", and non-finite originals are left out of the sums: either way
     * the figures would read as exact, so none is given. */
    if (st->n_nonfinite || isnan(st->sum_sq_err) || isnan(st->max_abs_err))
        r->rmse = r->rel_err = r->snr_db = r->max_abs_err = NAN;
}

/* ---- the kinds of target ---- */

enum qkind { QK_PLAIN, QK_BLOCK, QK_INT, QK_FP };

static int target_kind(uint32_t dtype)
{
    switch (dtype) {
    case KVP_DTYPE_I8:
    case KVP_DTYPE_I4:
        return QK_INT;
    case KVP_DTYPE_FP8_E4M3:
    case KVP_DTYPE_FP8_E5M2:
    case KVP_DTYPE_FP4_E2M1:
        return QK_FP;
    default:
        break;
    }
    const kvp_dtype_traits *tr = kvp_dtype_get(dtype);
    return tr && tr->is_quantized ? QK_BLOCK : QK_PLAIN;
}

/* The kind of a record: scaled types with no scheme are plain casts. */
static int rec_kind(const kvp_tensor_rec *t)
{
    int k = target_kind(t->dtype);
    return (k == QK_INT || k == QK_FP) && t->scheme == KVP_SCHEME_NONE ? QK_PLAIN : k;
}

static float fp_max(uint32_t dtype)
{
    return dtype == KVP_DTYPE_FP8_E4M3 ? 448.0f : dtype == KVP_DTYPE_FP8_E5M2 ? 57344.0f : 6.0f;
}

/* |v| beyond this overflowed the format before saturation: the tie above the
 * largest value rounds down for E4M3 (to even 448) and up for the others. */
static int fp_clips(uint32_t dtype, float av)
{
    if (dtype == KVP_DTYPE_FP8_E4M3)
        return av > 464.0f;
    return av >= (dtype == KVP_DTYPE_FP8_E5M2 ? 61440.0f : 7.0f);
}

static uint64_t rec_numel(const kvp_tensor_rec *t)
{
    uint64_t n = 1;
    for (uint32_t i = 0; i < t->n_dim && i < KVP_MAX_DIMS; i++)
        n *= t->shape[i];
    return n;
}

/* Elements per scale unit (0 when the scheme has no scales). */
static uint64_t unit_len(const kvp_tensor_rec *t)
{
    switch (t->scheme) {
    case KVP_SCHEME_TENSOR:
        return rec_numel(t);
    case KVP_SCHEME_CHANNEL: /* a row of the last dimension: [E, out, in] has E x out */
        return t->n_dim >= 1 && t->n_dim <= KVP_MAX_DIMS ? t->shape[t->n_dim - 1] : 0;
    case KVP_SCHEME_GROUP:
        return t->group;
    default:
        return 0;
    }
}

int kvp_quant_plan(kvp_tensor_rec *rec, const kvp_quant_spec *spec, kvp_err *err)
{
    const kvp_dtype_traits *tr = kvp_dtype_get(spec->dtype);
    const char *name = rec->name;
    if (!tr || !tr->from_f32)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "tensor %s: cannot quantize to dtype %s", name,
                           kvp_dtype_name(spec->dtype));
    if (rec->n_dim < 1 || rec->n_dim > KVP_MAX_DIMS)
        return kvp_err_set(err, KVP_EINVAL, "tensor %s: n_dim %u not in 1..%d", name, rec->n_dim, KVP_MAX_DIMS);
    uint64_t numel = 1;
    for (uint32_t i = 0; i < rec->n_dim; i++) {
        if (rec->shape[i] == 0 || numel > (UINT64_C(1) << 50) / rec->shape[i])
            return kvp_err_set(err, KVP_EINVAL, "tensor %s: shape[%u] = %llu is zero or too large", name, i,
                               (unsigned long long)rec->shape[i]);
        numel *= rec->shape[i];
    }
    uint64_t row = rec->shape[rec->n_dim - 1];
    int kind = target_kind(spec->dtype);
    if ((kind == QK_INT || kind == QK_FP) && spec->scheme == KVP_SCHEME_NONE && !spec->asym)
        kind = QK_PLAIN; /* a plain cast: E4M3 overflow gives NaN, integers saturate */
    uint32_t sdt = spec->scale_dtype ? spec->scale_dtype : KVP_DTYPE_F32;
    rec->dtype = spec->dtype;
    rec->scheme = spec->scheme;
    rec->group = spec->scheme == KVP_SCHEME_GROUP ? spec->group : 0;
    rec->scale_dtype = 0;
    rec->flags = 0;
    rec->global_scale = 1.0f;
    rec->scales_bytes = rec->zeros_bytes = 0;
    if (tr->block_size == 2 && !tr->is_quantized && (row & 1)) /* rows are packed bytewise (kvp_tensor_data_bytes) */
        return kvp_err_set(err, KVP_EINVAL, "tensor %s: %s needs an even row length, not %llu", name, tr->name,
                           (unsigned long long)row);
    if (kind == QK_PLAIN || kind == QK_BLOCK) {
        if (spec->scheme != KVP_SCHEME_NONE || spec->asym)
            return kvp_err_set(err, KVP_EINVAL, "tensor %s: %s takes no scale scheme", name, tr->name);
        if (row % (uint64_t)tr->block_size && !(tr->block_size == 2 && !tr->is_quantized))
            return kvp_err_set(err, KVP_EINVAL, "tensor %s: row of %llu elements is not a multiple of %s's block of %d",
                               name, (unsigned long long)row, tr->name, tr->block_size);
        rec->data_bytes = (uint64_t)kvp_dtype_row_bytes(spec->dtype, (int64_t)numel);
        return 0;
    }
    if (spec->scheme < KVP_SCHEME_TENSOR || spec->scheme > KVP_SCHEME_GROUP)
        return kvp_err_set(err, KVP_EINVAL, "tensor %s: %s needs a scale scheme (tensor, channel or group)", name,
                           tr->name);
    if (spec->asym && kind != QK_INT)
        return kvp_err_set(err, KVP_EINVAL, "tensor %s: asymmetric quantization is for integer types, not %s", name,
                           tr->name);
    if (sdt != KVP_DTYPE_F32 && sdt != KVP_DTYPE_F16 && sdt != KVP_DTYPE_BF16)
        return kvp_err_set(err, KVP_EINVAL, "tensor %s: scale dtype %s is not f32, f16 or bf16", name,
                           kvp_dtype_name(sdt));
    if (spec->scheme == KVP_SCHEME_GROUP && (spec->group == 0 || row % spec->group))
        return kvp_err_set(err, KVP_EINVAL, "tensor %s: group %u does not divide the row of %llu elements", name,
                           spec->group, (unsigned long long)row);
    uint64_t len = unit_len(rec);
    if (tr->block_size == 2 && (len & 1))
        return kvp_err_set(err, KVP_EINVAL, "tensor %s: 4-bit scale units of %llu elements must be even", name,
                           (unsigned long long)len);
    uint64_t units = numel / len, sbytes = (uint64_t)kvp_dtype_row_bytes(sdt, 1);
    rec->scale_dtype = sdt;
    rec->flags = spec->asym ? KVP_TENSOR_ASYM : 0;
    rec->data_bytes = (uint64_t)kvp_dtype_row_bytes(spec->dtype, (int64_t)numel);
    rec->scales_bytes = units * sbytes;
    rec->zeros_bytes = spec->asym ? units * sbytes : 0;
    return 0;
}

/* ---- scales ---- */

/* s (>= 0) rounded up to the scale dtype, so the range still fits. */
static float scale_round(uint32_t sdt, float s)
{
    if (sdt == KVP_DTYPE_F16) {
        uint16_t h = kvp_f32_to_f16(s);
        if (kvp_f16_to_f32(h) < s && h < 0x7bff)
            h++;
        return kvp_f16_to_f32(h);
    }
    if (sdt == KVP_DTYPE_BF16) {
        uint16_t h = kvp_f32_to_bf16(s);
        if (kvp_bf16_to_f32(h) < s && h < 0x7f7f)
            h++;
        return kvp_bf16_to_f32(h);
    }
    return s;
}

static void scale_put(uint32_t sdt, uint8_t *p, uint64_t i, float s)
{
    if (sdt == KVP_DTYPE_F32) {
        uint32_t u;
        memcpy(&u, &s, 4);
        kvp_put32(p + 4 * i, u);
    } else {
        kvp_put16(p + 2 * i, sdt == KVP_DTYPE_F16 ? kvp_f32_to_f16(s) : kvp_f32_to_bf16(s));
    }
}

static float scale_get(uint32_t sdt, const uint8_t *p, uint64_t i)
{
    if (sdt == KVP_DTYPE_F32) {
        uint32_t u = kvp_le32(p + 4 * i);
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    uint16_t h = kvp_le16(p + 2 * i);
    return sdt == KVP_DTYPE_F16 ? kvp_f16_to_f32(h) : kvp_bf16_to_f32(h);
}

typedef struct range {
    float mn, mx, amax; /* over the finite values */
} range;

static void range_init(range *r)
{
    r->mn = INFINITY;
    r->mx = -INFINITY;
    r->amax = 0.0f;
}

static void range_add_c(float *mnp, float *mxp, const float *x, int64_t n)
{
    float mn = *mnp, mx = *mxp;
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        if (fabsf(v) <= FLT_MAX) {
            mn = v < mn ? v : mn;
            mx = v > mx ? v : mx;
        }
    }
    *mnp = mn, *mxp = mx;
}

#if KVP_X86_SIMD
/* range_add_c eight lanes at a time: a lane's value that is not finite
 * (inf, NaN) is replaced by +inf for the minimum and -inf for the
 * maximum, which leaves both as they were.  The same minimum and maximum
 * (a min/max is exact; only which of -0 and +0 it keeps could differ, and
 * the scale and zero point take either alike). */
KVP_AVX2 static void range_add_avx2(float *mnp, float *mxp, const float *x, int64_t n)
{
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), big = _mm256_set1_ps(FLT_MAX);
    const __m256 pinf = _mm256_set1_ps(INFINITY), ninf = _mm256_set1_ps(-INFINITY);
    __m256 mn = pinf, mx = ninf;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 fin = _mm256_cmp_ps(_mm256_and_ps(v, absm), big, _CMP_LE_OQ);
        mn = _mm256_min_ps(mn, _mm256_blendv_ps(pinf, v, fin));
        mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, v, fin));
    }
    float a[8], b[8];
    _mm256_storeu_ps(a, mn);
    _mm256_storeu_ps(b, mx);
    for (int k = 0; k < 8; k++) {
        *mnp = a[k] < *mnp ? a[k] : *mnp;
        *mxp = b[k] > *mxp ? b[k] : *mxp;
    }
    range_add_c(mnp, mxp, x + i, n - i);
}
#endif

/* Widens r by the finite values of x[0..n). */
static void range_add(int impl, range *r, const float *x, int64_t n)
{
#if KVP_X86_SIMD
    if (kvp_use_simd(impl))
        range_add_avx2(&r->mn, &r->mx, x, n);
    else
#endif
        range_add_c(&r->mn, &r->mx, x, n);
    (void)impl;
    r->amax = fmaxf(fabsf(r->mn), fabsf(r->mx));
    if (r->mn > r->mx)
        r->amax = 0.0f;
}

static void range_merge(range *r, const range *o)
{
    r->mn = o->mn < r->mn ? o->mn : r->mn;
    r->mx = o->mx > r->mx ? o->mx : r->mx;
    r->amax = fmaxf(r->amax, o->amax);
}

/* Scale (rounded to the scale dtype) and integer zero point of a unit. */
static void unit_scale(const kvp_tensor_rec *t, const range *r, float *s, float *z)
{
    int kind = target_kind(t->dtype);
    int i4 = t->dtype == KVP_DTYPE_I4;
    float qmax = i4 ? 7.0f : 127.0f, qmin = i4 ? -8.0f : -128.0f;
    *z = 0.0f;
    if (kind == QK_FP) {
        *s = scale_round(t->scale_dtype, r->amax / fp_max(t->dtype));
    } else if (!(t->flags & KVP_TENSOR_ASYM)) {
        *s = scale_round(t->scale_dtype, r->amax / qmax);
    } else {
        float mn = fminf(r->mn, 0.0f), mx = fmaxf(r->mx, 0.0f);
        if (r->mn > r->mx)
            mn = mx = 0.0f;
        *s = scale_round(t->scale_dtype, (mx - mn) / (qmax - qmin));
        if (*s > 0.0f) {
            float zz = kvp_rne(qmin - mn / *s);
            *z = zz < qmin ? qmin : zz > qmax ? qmax : zz;
        }
    }
}

/* ---- element kernels for the scaled types ---- */

typedef struct qctx {
    kvp_tensor_rec *t;
    const float *x;
    uint8_t *data, *scales, *zeros;
    float *s, *z;          /* per unit, as used (already rounded) */
    range *ranges;         /* per task of the range pass */
    kvp_quant_stats *st;   /* per chunk */
    uint64_t numel, len, units;
    int impl, kind, want_stats;
    const uint8_t *zin;    /* dequantization: zero points */
    float *y;              /* dequantization output */
} qctx;

/* The multiplier of a unit's elements, 1/s (0 for an all-zero unit's s of
 * 0).  For s below 2^-128 (a unit whose largest value is under 1.3e-36
 * for fp8 E4M3, 1.7e-34 for E5M2, 3.7e-37 for int8) 1/s overflows to inf:
 * 0 x inf was NaN (a false "beyond the range of fp8" refusal) and every
 * other element the format's largest code.  Such a unit keeps inv = inf
 * as its mark and its elements are divided by s instead; every other unit
 * multiplies by the reciprocal as before, byte for byte. */
static float unit_inv(float s) { return s != 0.0f ? 1.0f / s : 0.0f; }

/* Element x of a unit with scale s and multiplier inv (unit_inv(s)). */
static inline float unit_elem(float x, float s, float inv) { return isinf(inv) ? x / s : x * inv; }

/* q = clamp(rne(x s^-1) + z) for integer targets; returns the clipped count. */
static int64_t int_kernel_c(const float *x, int64_t n, float s, float z, int lo, int hi, int8_t *q)
{
    int64_t clipped = 0;
    float inv = unit_inv(s);
    for (int64_t i = 0; i < n; i++) {
        float v = unit_elem(x[i], s, inv);
        if (!(v == v))
            v = 0.0f;
        v = kvp_rne(v) + z;
        if (v < (float)lo || v > (float)hi) {
            clipped++;
            v = v < (float)lo ? (float)lo : (float)hi;
        }
        q[i] = (int8_t)(int)v;
    }
    return clipped;
}

/* Pack n (even) i4 values from q into bytes at element offset pos (even). */
static void pack_i4(uint8_t *d, int64_t pos, const int8_t *q, int64_t n)
{
    uint8_t *p = d + pos / 2;
    for (int64_t i = 0; i + 1 < n; i += 2)
        p[i / 2] = (uint8_t)((q[i] & 15) | (q[i + 1] & 15) << 4);
    if (n & 1)
        p[n / 2] = (uint8_t)(q[n - 1] & 15);
}

#if KVP_X86_SIMD
/* int_kernel_c for 32 elements: their q in element order, the clipped
 * count added to *clipped. */
KVP_AVX2 __attribute__((always_inline)) static inline __m256i int_block_avx2(const float *x, __m256 vinv, __m256 vz,
                                                                            __m256 vlo, __m256 vhi, int64_t *clipped)
{
    __m256i r[4];
    for (int k = 0; k < 4; k++) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), vinv);
        v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q)); /* NaN -> 0 */
        v = _mm256_add_ps(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), vz);
        __m256 out = _mm256_or_ps(_mm256_cmp_ps(v, vlo, _CMP_LT_OQ), _mm256_cmp_ps(v, vhi, _CMP_GT_OQ));
        *clipped += __builtin_popcount((unsigned)_mm256_movemask_ps(out));
        r[k] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, vlo), vhi));
    }
    /* packs work within 128-bit lanes; the permute puts the bytes back in order */
    __m256i p01 = _mm256_packs_epi32(r[0], r[1]), p23 = _mm256_packs_epi32(r[2], r[3]);
    return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* 32 i4 values (in i8 lanes, element order) as 16 bytes, element 2k in
 * the low nibble of byte k (pack_i4's layout). */
KVP_AVX2 static inline __m128i pack_i4_avx2(__m256i q)
{
    __m256i w = _mm256_and_si256(q, _mm256_set1_epi8(15)); /* each 16-bit word: q[2k] | q[2k+1] << 8 */
    w = _mm256_or_si256(_mm256_and_si256(w, _mm256_set1_epi16(0x000f)),
                        _mm256_and_si256(_mm256_srli_epi16(w, 4), _mm256_set1_epi16(0x00f0)));
    __m256i b = _mm256_packus_epi16(w, w); /* bytes 0-7 of each lane hold its 8 */
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(b, 0x08));
}

/* Elements [0, n) of one unit (scale s with a finite inverse, zero point
 * z) into i8 (i4 0) or packed i4 (i4 1) at element pos of data: the blocks
 * of 32 in vectors, the rest through int_kernel_c.  pos is even for i4. */
KVP_AVX2 static int64_t int_span_avx2(const float *x, int64_t n, float s, float z, int i4, uint8_t *data,
                                      uint64_t pos)
{
    int lo = i4 ? -8 : -128, hi = i4 ? 7 : 127;
    float inv = unit_inv(s);
    const __m256 vinv = _mm256_set1_ps(inv), vz = _mm256_set1_ps(z);
    const __m256 vlo = _mm256_set1_ps((float)lo), vhi = _mm256_set1_ps((float)hi);
    int64_t clipped = 0, i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i q = int_block_avx2(x + i, vinv, vz, vlo, vhi, &clipped);
        if (i4)
            _mm_storeu_si128((__m128i *)(void *)(data + (pos + (uint64_t)i) / 2), pack_i4_avx2(q));
        else
            _mm256_storeu_si256((__m256i *)(void *)(data + pos + (uint64_t)i), q);
    }
    if (i < n) {
        int8_t q[32];
        clipped += int_kernel_c(x + i, n - i, s, z, lo, hi, i4 ? q : (int8_t *)data + pos + i);
        if (i4)
            pack_i4(data, (int64_t)pos + i, q, n - i);
    }
    return clipped;
}
#endif

/* Integer targets: elements [a, b) (whole units or parts of one) into the
 * output, each unit's run with its scale, no unit boundary found by a
 * division per run.  Returns the clipped count. */
static int64_t quant_int_span(const qctx *c, uint64_t a, uint64_t b)
{
    int i4 = c->t->dtype == KVP_DTYPE_I4;
    int64_t clipped = 0;
    for (uint64_t pos = a, u = a / c->len; pos < b; u++) {
        uint64_t end = (u + 1) * c->len < b ? (u + 1) * c->len : b;
        float s = c->s[u];
#if KVP_X86_SIMD
        if (kvp_use_simd(c->impl) && !isinf(unit_inv(s))) { /* a tiny unit's division: int_kernel_c */
            clipped += int_span_avx2(c->x + pos, (int64_t)(end - pos), s, c->z[u], i4, c->data, pos);
            pos = end;
            continue;
        }
#endif
        while (pos < end) { /* a piece at a time through a buffer */
            uint64_t e = end - pos > PIECE ? pos + PIECE : end;
            int8_t q[PIECE];
            clipped += int_kernel_c(c->x + pos, (int64_t)(e - pos), s, c->z[u], i4 ? -8 : -128, i4 ? 7 : 127,
                                    i4 ? q : (int8_t *)c->data + pos);
            if (i4)
                pack_i4(c->data, (int64_t)pos, q, (int64_t)(e - pos));
            pos = e;
        }
    }
    return clipped;
}


/* Quantize elements [pos, pos+n) of unit u (n <= PIECE); returns clipped. */
static int64_t quant_piece(const qctx *c, uint64_t pos, int64_t n, uint64_t u)
{
    const kvp_tensor_rec *t = c->t;
    const float *x = c->x + pos;
    float s = c->s[u], inv = unit_inv(s);
    if (c->kind == QK_INT)
        return quant_int_span(c, pos, pos + (uint64_t)n);
    float v[PIECE];
    int64_t clipped = 0;
    if (isinf(inv))
        for (int64_t i = 0; i < n; i++)
            v[i] = x[i] / s;
    else
        for (int64_t i = 0; i < n; i++)
            v[i] = x[i] * inv;
    for (int64_t i = 0; i < n; i++)
        clipped += fp_clips(t->dtype, fabsf(v[i]));
    if (t->dtype == KVP_DTYPE_FP4_E2M1)
        kvp_quantize_row_e2m1(v, c->data + pos / 2, n);
    else
        kvp_fp8_row_impl(c->impl, t->dtype == KVP_DTYPE_FP8_E5M2, 1, v, c->data + pos, n);
    return clipped;
}

/* Reconstruct elements [pos, pos+n) of a scaled tensor into y. */
static void dequant_piece(const kvp_tensor_rec *t, const uint8_t *data, uint64_t pos, int64_t n, float s, float z,
                          float *y)
{
    switch (t->dtype) {
    case KVP_DTYPE_I8:
        for (int64_t i = 0; i < n; i++)
            y[i] = ((float)((const int8_t *)data)[pos + i] - z) * s;
        return;
    case KVP_DTYPE_I4:
        for (int64_t i = 0; i < n; i++)
            y[i] = ((float)kvp_i4_at(data, (int64_t)pos + i) - z) * s;
        return;
    case KVP_DTYPE_FP4_E2M1:
        for (int64_t i = 0; i < n; i++)
            y[i] = kvp_e2m1_to_f32((uint8_t)(data[(pos + i) / 2] >> (4 * ((pos + i) & 1)))) * s;
        return;
    default: {
        float (*dec)(uint8_t) = t->dtype == KVP_DTYPE_FP8_E5M2 ? kvp_e5m2_to_f32 : kvp_e4m3_to_f32;
        for (int64_t i = 0; i < n; i++)
            y[i] = dec(data[pos + i]) * s;
    }
    }
}

/* Plain and block types: whole pieces through the traits (global scale for NVFP4). */
static int64_t quant_piece_blocks(const qctx *c, uint64_t pos, int64_t n)
{
    const kvp_tensor_rec *t = c->t;
    uint8_t *d = c->data + kvp_dtype_row_bytes(t->dtype, (int64_t)pos);
    if (t->dtype == KVP_DTYPE_NVFP4)
        return kvp_quantize_row_nvfp4(c->x + pos, d, n, t->global_scale);
    if (t->dtype == KVP_DTYPE_MXFP4)
        return kvp_quantize_row_mxfp4(c->x + pos, d, n);
    if (t->dtype == KVP_DTYPE_FP8_E4M3 || t->dtype == KVP_DTYPE_FP8_E5M2) {
        kvp_fp8_row_impl(c->impl, t->dtype == KVP_DTYPE_FP8_E5M2, 0, c->x + pos, d, n);
        return 0;
    }
    kvp_dtype_get(t->dtype)->from_f32(c->x + pos, d, n);
    return 0;
}

static void dequant_piece_blocks(const kvp_tensor_rec *t, const uint8_t *data, uint64_t pos, int64_t n, float *y)
{
    const uint8_t *d = data + kvp_dtype_row_bytes(t->dtype, (int64_t)pos);
    if (t->dtype == KVP_DTYPE_NVFP4)
        kvp_dequantize_row_nvfp4_g(d, y, n, t->global_scale);
    else
        kvp_dtype_get(t->dtype)->to_f32(d, y, n);
}

/* ---- the passes ---- */

static void range_task(void *ctx, int task, int thread)
{
    (void)thread;
    qctx *c = ctx;
    if (c->units == 1) { /* one unit: tasks split it into chunks, merged later */
        uint64_t a = (uint64_t)task * CHUNK, b = a + CHUNK < c->numel ? a + CHUNK : c->numel;
        range_init(&c->ranges[task]);
        range_add(c->impl, &c->ranges[task], c->x + a, (int64_t)(b - a));
        return;
    }
    uint64_t per = c->len >= CHUNK ? 1 : CHUNK / c->len;
    for (uint64_t u = (uint64_t)task * per; u < c->units && u < (uint64_t)(task + 1) * per; u++) {
        range r;
        range_init(&r);
        range_add(c->impl, &r, c->x + u * c->len, (int64_t)c->len);
        unit_scale(c->t, &r, &c->s[u], &c->z[u]);
    }
}

static void quant_task(void *ctx, int task, int thread)
{
    (void)thread;
    qctx *c = ctx;
    kvp_quant_stats *st = &c->st[task];
    memset(st, 0, sizeof *st);
    uint64_t a = (uint64_t)task * CHUNK, b = a + CHUNK < c->numel ? a + CHUNK : c->numel;
    if (c->kind == QK_INT && !c->want_stats) { /* no pieces to measure: the whole span at once */
        st->n_clipped += (uint64_t)quant_int_span(c, a, b);
        return;
    }
    float y[PIECE];
    for (uint64_t pos = a; pos < b;) {
        uint64_t end = pos + PIECE < b ? pos + PIECE : b, u = 0;
        if (c->kind == QK_INT || c->kind == QK_FP) {
            u = pos / c->len;
            end = end < (u + 1) * c->len ? end : (u + 1) * c->len;
            st->n_clipped += (uint64_t)quant_piece(c, pos, (int64_t)(end - pos), u);
            if (c->want_stats)
                dequant_piece(c->t, c->data, pos, (int64_t)(end - pos), c->s[u], c->z[u], y);
        } else {
            st->n_clipped += (uint64_t)quant_piece_blocks(c, pos, (int64_t)(end - pos));
            if (c->want_stats)
                dequant_piece_blocks(c->t, c->data, pos, (int64_t)(end - pos), y);
        }
        if (c->want_stats) /* the error measurement costs more than the quantization */
            kvp_quant_stats_add(st, c->x + pos, y, (int64_t)(end - pos));
        pos = end;
    }
}

static void dequant_task(void *ctx, int task, int thread)
{
    (void)thread;
    qctx *c = ctx;
    uint64_t a = (uint64_t)task * CHUNK, b = a + CHUNK < c->numel ? a + CHUNK : c->numel;
    for (uint64_t pos = a; pos < b;) {
        uint64_t end = pos + PIECE < b ? pos + PIECE : b;
        if (c->kind == QK_INT || c->kind == QK_FP) {
            uint64_t u = pos / c->len;
            end = end < (u + 1) * c->len ? end : (u + 1) * c->len;
            float z = c->t->flags & KVP_TENSOR_ASYM ? scale_get(c->t->scale_dtype, c->zin, u) : 0.0f;
            dequant_piece(c->t, c->data, pos, (int64_t)(end - pos), scale_get(c->t->scale_dtype, c->scales, u), z,
                          c->y + pos);
        } else {
            dequant_piece_blocks(c->t, c->data, pos, (int64_t)(end - pos), c->y + pos);
        }
        pos = end;
    }
}

/* Checks that rec is what kvp_quant_plan would make of itself. */
static int check_rec(const kvp_tensor_rec *t, kvp_err *err)
{
    kvp_tensor_rec p = *t;
    kvp_quant_spec spec = {t->dtype, t->scheme, t->group, t->scale_dtype, (t->flags & KVP_TENSOR_ASYM) != 0};
    int rc = kvp_quant_plan(&p, &spec, err);
    if (rc < 0)
        return rc;
    if (p.data_bytes != t->data_bytes || p.scales_bytes != t->scales_bytes || p.zeros_bytes != t->zeros_bytes)
        return kvp_err_set(err, KVP_EFORMAT, "tensor %s: byte counts (%llu, %llu, %llu) do not match %s", t->name,
                           (unsigned long long)t->data_bytes, (unsigned long long)t->scales_bytes,
                           (unsigned long long)t->zeros_bytes, kvp_dtype_name(t->dtype));
    return 0;
}

static int n_chunks(uint64_t numel, kvp_err *err, const char *name)
{
    uint64_t k = (numel + CHUNK - 1) / CHUNK;
    if (k > 0x7fffffff)
        return kvp_err_set(err, KVP_ELIMIT, "tensor %s: too many elements", name);
    return (int)k;
}

int kvp_quant_tensor(kvp_tensor_rec *rec, const float *x, void *data, void *scales, void *zeros,
                     kvp_quant_stats *st, kvp_threadpool *pool, kvp_err *err)
{
    return kvp_quant_tensor_impl(KVP_IMPL_AUTO, rec, x, data, scales, zeros, st, pool, err);
}

int kvp_quant_tensor_impl(int impl, kvp_tensor_rec *rec, const float *x, void *data, void *scales, void *zeros,
                          kvp_quant_stats *st, kvp_threadpool *pool, kvp_err *err)
{
    int rc = check_rec(rec, err);
    if (rc < 0)
        return rc;
    qctx c;
    memset(&c, 0, sizeof c);
    c.t = rec;
    c.x = x;
    c.data = data;
    c.scales = scales;
    c.zeros = zeros;
    c.numel = rec_numel(rec);
    c.kind = rec_kind(rec);
    int chunks = n_chunks(c.numel, err, rec->name);
    if (chunks < 0)
        return chunks;
    c.st = calloc((size_t)chunks, sizeof *c.st);
    if (!c.st)
        return kvp_err_set(err, KVP_ENOMEM, "tensor %s: out of memory", rec->name);
    if (c.kind == QK_INT || c.kind == QK_FP || rec->dtype == KVP_DTYPE_NVFP4) {
        c.len = c.kind == QK_BLOCK ? c.numel : unit_len(rec);
        c.units = c.numel / c.len;
        int tasks = c.units == 1 ? chunks : (int)((c.units + (c.len >= CHUNK ? 1 : CHUNK / c.len) - 1) /
                                                   (c.len >= CHUNK ? 1 : CHUNK / c.len));
        c.s = malloc(c.units * sizeof *c.s);
        c.z = malloc(c.units * sizeof *c.z);
        c.ranges = c.units == 1 ? calloc((size_t)chunks, sizeof *c.ranges) : NULL;
        if (!c.s || !c.z || (c.units == 1 && !c.ranges)) {
            rc = kvp_err_set(err, KVP_ENOMEM, "tensor %s: out of memory", rec->name);
            goto out;
        }
        kvp_threadpool_run(pool, range_task, &c, tasks);
        if (c.units == 1) {
            for (int i = 1; i < chunks; i++)
                range_merge(&c.ranges[0], &c.ranges[i]);
            if (c.kind == QK_BLOCK) { /* NVFP4: the tensor scale puts the largest block scale at 448 */
                float g = c.ranges[0].amax / (448.0f * 6.0f);
                rec->global_scale = g > 0.0f && isfinite(g) ? g : 1.0f;
            } else {
                unit_scale(rec, &c.ranges[0], &c.s[0], &c.z[0]);
            }
        }
        for (uint64_t u = 0; c.kind != QK_BLOCK && u < c.units; u++) {
            scale_put(rec->scale_dtype, scales, u, c.s[u]);
            if (rec->flags & KVP_TENSOR_ASYM)
                scale_put(rec->scale_dtype, zeros, u, c.z[u]);
        }
    }
    c.impl = kvp_use_simd(impl) ? KVP_IMPL_SIMD : KVP_IMPL_PORTABLE; /* ask the CPU once */
    c.want_stats = st != NULL;
    kvp_threadpool_run(pool, quant_task, &c, chunks);
    if (st)
        for (int i = 0; i < chunks; i++)
            kvp_quant_stats_merge(st, &c.st[i]);
out:
    free(c.st);
    free(c.s);
    free(c.z);
    free(c.ranges);
    return rc;
}

int kvp_dequant_tensor(const kvp_tensor_rec *rec, const void *data, const void *scales, const void *zeros,
                       float *y, kvp_threadpool *pool, kvp_err *err)
{
    const kvp_dtype_traits *tr = kvp_dtype_get(rec->dtype);
    if (!tr || !tr->to_f32)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "tensor %s: cannot read dtype %s", rec->name,
                           kvp_dtype_name(rec->dtype));
    int rc = check_rec(rec, err);
    if (rc < 0 && !(tr->from_f32 == NULL)) /* read-only block types (q4_k) have no plan; sizes below */
        return rc;
    qctx c;
    memset(&c, 0, sizeof c);
    c.t = (kvp_tensor_rec *)rec; /* only read */
    c.numel = rec_numel(rec);
    if (!tr->from_f32 && (int64_t)rec->data_bytes != kvp_dtype_row_bytes(rec->dtype, (int64_t)c.numel))
        return kvp_err_set(err, KVP_EFORMAT, "tensor %s: %llu data bytes do not match %s", rec->name,
                           (unsigned long long)rec->data_bytes, tr->name);
    c.kind = rec_kind(rec);
    c.data = (uint8_t *)data;
    c.scales = (uint8_t *)scales;
    c.zin = zeros;
    c.y = y;
    c.len = unit_len(rec);
    if ((c.kind == QK_INT || c.kind == QK_FP) && (!scales || ((rec->flags & KVP_TENSOR_ASYM) && !zeros)))
        return kvp_err_set(err, KVP_EINVAL, "tensor %s: scales or zero points missing", rec->name);
    int chunks = n_chunks(c.numel, err, rec->name);
    if (chunks < 0)
        return chunks;
    kvp_threadpool_run(pool, dequant_task, &c, chunks);
    return 0;
}

int kvp_quant_convert(uint32_t from, const void *src, uint32_t to, void *dst, int64_t n, kvp_err *err)
{
    const kvp_dtype_traits *a = kvp_dtype_get(from), *b = kvp_dtype_get(to);
    if (!a || !a->to_f32 || !b || !b->from_f32)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "no conversion from %s to %s", kvp_dtype_name(from),
                           kvp_dtype_name(to));
    if (kvp_dtype_row_bytes(from, n) < 0 || kvp_dtype_row_bytes(to, n) < 0)
        return kvp_err_set(err, KVP_EINVAL, "%lld elements are not whole blocks of %s and %s", (long long)n, a->name,
                           b->name);
    float buf[PIECE];
    for (int64_t i = 0; i < n; i += PIECE) {
        int64_t k = n - i < PIECE ? n - i : PIECE;
        a->to_f32((const uint8_t *)src + kvp_dtype_row_bytes(from, i), buf, k);
        b->from_f32(buf, (uint8_t *)dst + kvp_dtype_row_bytes(to, i), k);
    }
    return 0;
}
