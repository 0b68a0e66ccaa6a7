/* test_quant.c - casts and GGUF blocks against golden files from ml_dtypes and
 * gguf-py (scripts/ref/gen_casts.py, gen_ggml_blocks.py), scaled quantization
 * round trips, and the AVX2 paths against the portable ones. */
#include "quant.h"
#include "quant_kv.h"
#include "wire.h"
#include "threadpool.h"
#include "unit.h"

#include <math.h>
#include <stdlib.h>

/* Reads $KVP_TESTS/golden/name whole; NULL (and a failed check) if absent. */
static uint8_t *golden(const char *name, size_t *len)
{
    const char *dir = getenv("KVP_TESTS");
    char path[1024];
    snprintf(path, sizeof path, "%s/golden/%s", dir ? dir : "tests", name);
    FILE *f = fopen(path, "rb");
    CHECK_MSG(f != NULL, "golden file %s missing (set KVP_TESTS to the tests/ folder)", path);
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc((size_t)n + 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return p;
}

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float rd_f32(const uint8_t *p)
{
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Every finite f16 value as f32, in ascending bit order (63488 values). */
static float *finite_f16(int *n)
{
    float *x = malloc(65536 * sizeof *x);
    int k = 0;
    for (uint32_t h = 0; h < 0x10000; h++)
        if (((h >> 10) & 0x1f) != 0x1f)
            x[k++] = kvp_f16_to_f32((uint16_t)h);
    *n = k;
    return x;
}

static int count_diff(const uint8_t *a, const uint8_t *b, size_t n, size_t *first)
{
    int d = 0;
    for (size_t i = n; i-- > 0;)
        if (a[i] != b[i]) {
            d++;
            *first = i;
        }
    return d;
}

static void test_casts_f16(void)
{
    int n;
    float *x = finite_f16(&n);
    uint8_t *out = malloc((size_t)n), *out2 = malloc((size_t)n);
    size_t len, first = 0;
    uint8_t *g;

    CHECK_EQ_I64(n, 63488);
    if ((g = golden("cast_e4m3.bin", &len))) {
        CHECK_EQ_U64(len, (size_t)n);
        for (int i = 0; i < n; i++)
            out[i] = kvp_f32_to_e4m3(x[i]);
        int d = count_diff(out, g, (size_t)n, &first);
        CHECK_MSG(d == 0, "e4m3: %d mismatches, first x=%g ours 0x%02x ml_dtypes 0x%02x", d, (double)x[first],
                  out[first], g[first]);
        kvp_quantize_row_e4m3(x, out2, n);
        CHECK(memcmp(out2, g, (size_t)n) == 0);
        free(g);
    }
    if ((g = golden("cast_e5m2.bin", &len))) {
        CHECK_EQ_U64(len, (size_t)n);
        for (int i = 0; i < n; i++)
            out[i] = kvp_f32_to_e5m2(x[i]);
        int d = count_diff(out, g, (size_t)n, &first);
        CHECK_MSG(d == 0, "e5m2: %d mismatches, first x=%g ours 0x%02x ml_dtypes 0x%02x", d, (double)x[first],
                  out[first], g[first]);
        kvp_quantize_row_e5m2(x, out2, n);
        CHECK(memcmp(out2, g, (size_t)n) == 0);
        free(g);
    }
    if ((g = golden("cast_e2m1.bin", &len))) {
        CHECK_EQ_U64(len, (size_t)n / 2);
        kvp_quantize_row_e2m1(x, out, n);
        int d = count_diff(out, g, (size_t)n / 2, &first);
        CHECK_MSG(d == 0, "e2m1: %d mismatching bytes, first at x=%g ours 0x%02x ml_dtypes 0x%02x", d,
                  (double)x[2 * first], out[first], g[first]);
        free(g);
    }
    if ((g = golden("cast_e8m0.bin", &len))) {
        CHECK_EQ_U64(len, 0x7c00);
        kvp_quantize_row_e8m0(x, out, 0x7c00);
        int d = count_diff(out, g, 0x7c00, &first);
        CHECK_MSG(d == 0, "e8m0: %d mismatches, first x=%g ours 0x%02x ml_dtypes 0x%02x", d, (double)x[first],
                  out[first], g[first]);
        free(g);
    }
    /* the saturating casts are the plain casts of the clamped value */
    int bad = 0;
    for (int i = 0; i < n; i++) {
        float c4 = fminf(fmaxf(x[i], -448.0f), 448.0f), c5 = fminf(fmaxf(x[i], -57344.0f), 57344.0f);
        bad += kvp_f32_to_e4m3_sat(x[i]) != kvp_f32_to_e4m3(c4);
        bad += kvp_f32_to_e5m2_sat(x[i]) != kvp_f32_to_e5m2(c5);
    }
    CHECK_EQ_I64(bad, 0);
    CHECK_EQ_U64(kvp_f32_to_e4m3_sat(INFINITY), 0x7e);
    CHECK_EQ_U64(kvp_f32_to_e4m3_sat(-1e30f), 0xfe);
    CHECK_EQ_U64(kvp_f32_to_e4m3_sat(NAN), 0x7f);
    CHECK_EQ_U64(kvp_f32_to_e5m2_sat(-INFINITY), 0xfb);
    CHECK_EQ_U64(kvp_f32_to_e4m3(NAN), 0x7f);
    CHECK_EQ_U64(kvp_f32_to_e5m2(INFINITY), 0x7c);
    /* AVX2 and portable paths agree on every input, saturating or not */
    for (int v = 0; v < 4; v++) {
        kvp_fp8_row_impl(KVP_IMPL_AUTO, v & 1, v >> 1, x, out, n);
        kvp_fp8_row_impl(KVP_IMPL_PORTABLE, v & 1, v >> 1, x, out2, n);
        CHECK_MSG(memcmp(out, out2, (size_t)n) == 0, "fp8 variant %d: simd and portable differ", v);
    }
    free(x);
    free(out);
    free(out2);
}

static void test_casts_decode_rand(void)
{
    size_t len;
    uint8_t *g = golden("cast_decode.bin", &len);
    if (g) {
        CHECK_EQ_U64(len, (256 * 3 + 16) * 4);
        int bad = 0;
        for (int i = 0; i < 256 * 3 + 16; i++) {
            float want = rd_f32(g + 4 * i), got;
            if (i < 256)
                got = kvp_e4m3_to_f32((uint8_t)i);
            else if (i < 512)
                got = kvp_e5m2_to_f32((uint8_t)(i - 256));
            else if (i < 528)
                got = kvp_e2m1_to_f32((uint8_t)(i - 512));
            else
                got = kvp_e8m0_to_f32((uint8_t)(i - 528));
            if (isnan(want) ? !isnan(got) : fbits(want) != fbits(got)) {
                if (bad++ < 5)
                    printf("decode entry %d: ours %g want %g\n", i, (double)got, (double)want);
            }
        }
        CHECK_EQ_I64(bad, 0);
        free(g);
    }
    g = golden("cast_rand.bin", &len);
    if (g) {
        uint32_t n = (uint32_t)g[0] | (uint32_t)g[1] << 8 | (uint32_t)g[2] << 16 | (uint32_t)g[3] << 24;
        CHECK_EQ_U64(len, 4 + (size_t)n * 8);
        if (len == 4 + (size_t)n * 8) {
            const uint8_t *e4 = g + 4 + 4 * n, *e5 = e4 + n, *e2 = e5 + n, *e8 = e2 + n;
            int bad[4] = {0, 0, 0, 0};
            float *x = malloc(n * sizeof *x);
            uint8_t *o = malloc(n), *o2 = malloc(n);
            for (uint32_t i = 0; i < n; i++) {
                x[i] = rd_f32(g + 4 + 4 * i);
                bad[0] += kvp_f32_to_e4m3(x[i]) != e4[i];
                bad[1] += kvp_f32_to_e5m2(x[i]) != e5[i];
                bad[2] += kvp_f32_to_e2m1(x[i]) != e2[i];
                bad[3] += kvp_f32_to_e8m0(fabsf(x[i])) != e8[i];
            }
            CHECK_MSG(!bad[0] && !bad[1] && !bad[2] && !bad[3], "random f32: mismatches e4m3 %d e5m2 %d e2m1 %d e8m0 %d",
                      bad[0], bad[1], bad[2], bad[3]);
            for (int v = 0; v < 4; v++) {
                kvp_fp8_row_impl(KVP_IMPL_AUTO, v & 1, v >> 1, x, o, n);
                kvp_fp8_row_impl(KVP_IMPL_PORTABLE, v & 1, v >> 1, x, o2, n);
                CHECK(memcmp(o, o2, n) == 0);
            }
            free(x);
            free(o);
            free(o2);
        }
        free(g);
    }
}

/* Our 9-byte NVFP4 blocks from ggml's 36-byte super-blocks (4 scales first). */
static void nvfp4_from_ggml(const uint8_t *src, uint8_t *dst, int n_super)
{
    for (int s = 0; s < n_super; s++)
        for (int k = 0; k < 4; k++) {
            dst[(4 * s + k) * 9] = src[36 * s + k];
            memcpy(dst + (4 * s + k) * 9 + 1, src + 36 * s + 4 + 8 * k, 8);
        }
}

static void test_ggml_dequant(void)
{
    static const struct { const char *name; uint32_t dtype; } types[] = {
        {"q4_0", KVP_DTYPE_Q4_0}, {"q4_1", KVP_DTYPE_Q4_1}, {"q5_0", KVP_DTYPE_Q5_0},
        {"q5_1", KVP_DTYPE_Q5_1}, {"q8_0", KVP_DTYPE_Q8_0}, {"q4_k", KVP_DTYPE_Q4_K},
        {"q6_k", KVP_DTYPE_Q6_K}, {"mxfp4", KVP_DTYPE_MXFP4}, {"nvfp4", KVP_DTYPE_NVFP4},
        {"q5_k", KVP_DTYPE_Q5_K}, {"q2_k", KVP_DTYPE_Q2_K}, {"q3_k", KVP_DTYPE_Q3_K},
        {"iq4_nl", KVP_DTYPE_IQ4_NL}, {"iq4_xs", KVP_DTYPE_IQ4_XS},
    };
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        char fn[64];
        size_t len;
        snprintf(fn, sizeof fn, "ggml_deq_%s.bin", types[t].name);
        uint8_t *g = golden(fn, &len);
        if (!g)
            continue;
        uint32_t n = (uint32_t)g[0] | (uint32_t)g[1] << 8 | (uint32_t)g[2] << 16 | (uint32_t)g[3] << 24;
        int64_t nb = kvp_dtype_row_bytes(types[t].dtype, n);
        CHECK_MSG(nb > 0 && len == 4 + (size_t)nb + 4 * (size_t)n, "%s: golden size %zu", fn, len);
        if (nb > 0 && len == 4 + (size_t)nb + 4 * (size_t)n) {
            const uint8_t *blocks = g + 4, *want = g + 4 + nb;
            float *y = malloc(n * sizeof *y);
            kvp_err err = {0};
            uint8_t *conv = NULL;
            if (types[t].dtype == KVP_DTYPE_NVFP4) { /* same byte count: 4 x 9 = 36 */
                conv = malloc((size_t)nb);
                nvfp4_from_ggml(blocks, conv, (int)(n / 64));
                blocks = conv;
            }
            int rc = kvp_quant_convert(types[t].dtype, blocks, KVP_DTYPE_F32, y, n, &err);
            CHECK_EQ_I64(rc, 0);
            int bad = 0;
            for (uint32_t i = 0; i < n; i++)
                if (fbits(y[i]) != fbits(rd_f32(want + 4 * i)) && bad++ < 3)
                    printf("%s element %u: ours %.9g gguf %.9g\n", types[t].name, i, (double)y[i],
                           (double)rd_f32(want + 4 * i));
            CHECK_MSG(bad == 0, "%s: %d elements differ from gguf", types[t].name, bad);
            free(y);
            free(conv);
        }
        free(g);
    }
}

static void test_ggml_quant(void)
{
    static const struct { const char *name; uint32_t dtype; } types[] = {
        {"q8_0", KVP_DTYPE_Q8_0}, {"q4_0", KVP_DTYPE_Q4_0}, {"q4_1", KVP_DTYPE_Q4_1},
        {"q5_0", KVP_DTYPE_Q5_0}, {"q5_1", KVP_DTYPE_Q5_1}, {"mxfp4", KVP_DTYPE_MXFP4},
    };
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        char fn[64];
        size_t len;
        snprintf(fn, sizeof fn, "ggml_q_%s.bin", types[t].name);
        uint8_t *g = golden(fn, &len);
        if (!g)
            continue;
        uint32_t n = (uint32_t)g[0] | (uint32_t)g[1] << 8 | (uint32_t)g[2] << 16 | (uint32_t)g[3] << 24;
        int64_t nb = kvp_dtype_row_bytes(types[t].dtype, n);
        CHECK_MSG(nb > 0 && len == 4 + 4 * (size_t)n + (size_t)nb, "%s: golden size %zu", fn, len);
        if (nb > 0 && len == 4 + 4 * (size_t)n + (size_t)nb) {
            float *x = malloc(n * sizeof *x);
            uint8_t *q = malloc((size_t)nb);
            for (uint32_t i = 0; i < n; i++)
                x[i] = rd_f32(g + 4 + 4 * i);
            kvp_dtype_get(types[t].dtype)->from_f32(x, q, n);
            size_t first = 0;
            int d = count_diff(q, g + 4 + 4 * n, (size_t)nb, &first);
            CHECK_MSG(d == 0, "%s: %d bytes differ from gguf's quantize, first at byte %zu (0x%02x vs 0x%02x)",
                      types[t].name, d, first, q[first], g[4 + 4 * n + first]);
            free(x);
            free(q);
        }
        free(g);
    }
}

/* Deterministic test data: a normal-ish mix with per-row magnitudes and outliers. */
static float *test_data(int rows, int cols, uint64_t seed)
{
    float *x = malloc((size_t)rows * cols * sizeof *x);
    uint64_t s = seed;
    for (int r = 0; r < rows; r++) {
        float mag = 0.01f * (float)(1 + r % 7);
        for (int c = 0; c < cols; c++) {
            float acc = 0;
            for (int k = 0; k < 4; k++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                acc += (float)((s >> 40) & 0xffffff) / 16777216.0f - 0.5f;
            }
            x[(size_t)r * cols + c] = acc * mag + (c % 97 == 5 ? 0.3f * mag : 0.0f) + (r % 5 == 1 ? 0.02f : 0.0f);
        }
    }
    return x;
}

typedef struct qcase {
    uint32_t dtype, scheme, group, scale_dtype;
    int asym;
    double min_snr;
} qcase;

static void test_scaled(void)
{
    const int rows = 48, cols = 256;
    float *x = test_data(rows, cols, 42);
    float *y = malloc((size_t)rows * cols * sizeof *y);
    kvp_threadpool *pool = NULL;
    kvp_err err = {0};
    CHECK_EQ_I64(kvp_threadpool_create(&pool, 3, &err), 0);
    static const qcase cases[] = {
        {KVP_DTYPE_I8, KVP_SCHEME_TENSOR, 0, 0, 0, 30},    {KVP_DTYPE_I8, KVP_SCHEME_CHANNEL, 0, 0, 0, 35},
        {KVP_DTYPE_I8, KVP_SCHEME_GROUP, 32, 0, 0, 38},    {KVP_DTYPE_I8, KVP_SCHEME_CHANNEL, 0, 0, 1, 35},
        {KVP_DTYPE_I8, KVP_SCHEME_GROUP, 64, KVP_DTYPE_F16, 1, 38},
        {KVP_DTYPE_I4, KVP_SCHEME_GROUP, 32, 0, 0, 14},    {KVP_DTYPE_I4, KVP_SCHEME_GROUP, 128, 0, 1, 12},
        {KVP_DTYPE_I4, KVP_SCHEME_CHANNEL, 0, KVP_DTYPE_BF16, 0, 10},
        {KVP_DTYPE_FP8_E4M3, KVP_SCHEME_TENSOR, 0, 0, 0, 25}, {KVP_DTYPE_FP8_E4M3, KVP_SCHEME_CHANNEL, 0, 0, 0, 25},
        {KVP_DTYPE_FP8_E5M2, KVP_SCHEME_GROUP, 64, 0, 0, 18},
        {KVP_DTYPE_FP4_E2M1, KVP_SCHEME_GROUP, 32, 0, 0, 12},
        {KVP_DTYPE_NVFP4, 0, 0, 0, 0, 13},                 {KVP_DTYPE_MXFP4, 0, 0, 0, 0, 11},
        {KVP_DTYPE_Q8_0, 0, 0, 0, 0, 38},                  {KVP_DTYPE_Q4_0, 0, 0, 0, 0, 13},
        {KVP_DTYPE_Q4_1, 0, 0, 0, 0, 14},                  {KVP_DTYPE_Q5_1, 0, 0, 0, 0, 20},
        {KVP_DTYPE_F16, 0, 0, 0, 0, 60},                   {KVP_DTYPE_BF16, 0, 0, 0, 0, 40},
    };
    double snr_i8 = 0, snr_fp8 = 0, snr_i4 = 0;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const qcase *c = &cases[k];
        kvp_tensor_rec rec;
        memset(&rec, 0, sizeof rec);
        snprintf(rec.name, sizeof rec.name, "case%zu", k);
        rec.n_dim = 2;
        rec.shape[0] = (uint64_t)rows;
        rec.shape[1] = (uint64_t)cols;
        kvp_quant_spec spec = {c->dtype, c->scheme, c->group, c->scale_dtype, c->asym};
        int rc = kvp_quant_plan(&rec, &spec, &err);
        CHECK_MSG(rc == 0, "%s: plan: %s", rec.name, err.msg);
        if (rc)
            continue;
        CHECK_EQ_I64(kvp_tensor_data_bytes(&rec), (int64_t)rec.data_bytes);
        CHECK_EQ_I64(kvp_tensor_scale_count(&rec) * (rec.scales_bytes ? kvp_dtype_row_bytes(rec.scale_dtype, 1) : 0),
                     (int64_t)rec.scales_bytes);
        uint8_t *d[3], *d2[3];
        for (int i = 0; i < 3; i++) {
            uint64_t nb = i == 0 ? rec.data_bytes : i == 1 ? rec.scales_bytes : rec.zeros_bytes;
            d[i] = calloc(1, nb + 1);
            d2[i] = calloc(1, nb + 1);
        }
        kvp_quant_stats st = {0}, st2 = {0}, st3 = {0};
        kvp_tensor_rec rec2 = rec;
        CHECK_EQ_I64(kvp_quant_tensor(&rec, x, d[0], d[1], d[2], &st, NULL, &err), 0);
        CHECK_EQ_I64(kvp_quant_tensor_impl(KVP_IMPL_PORTABLE, &rec2, x, d2[0], d2[1], d2[2], &st2, pool, &err), 0);
        CHECK_MSG(memcmp(d[0], d2[0], rec.data_bytes) == 0 && memcmp(d[1], d2[1], rec.scales_bytes) == 0 &&
                      memcmp(d[2], d2[2], rec.zeros_bytes) == 0,
                  "%s (%s): simd/1 thread and portable/3 threads differ", rec.name, kvp_dtype_name(c->dtype));
        CHECK(st.sum_sq_err == st2.sum_sq_err && st.n_clipped == st2.n_clipped && st.n == st2.n);
        CHECK(rec.global_scale == rec2.global_scale);
        CHECK_EQ_I64(kvp_dequant_tensor(&rec, d[0], d[1], d[2], y, pool, &err), 0);
        kvp_quant_stats_add(&st3, x, y, (int64_t)rows * cols);
        CHECK_MSG(fabs(st3.sum_sq_err - st.sum_sq_err) <= 1e-9 * st.sum_sq_err && st3.max_abs_err == st.max_abs_err,
                  "%s: dequant differs from what quant measured", rec.name);
        kvp_quant_report r;
        kvp_quant_stats_report(&st, &r);
        CHECK_MSG(r.snr_db >= c->min_snr, "%s (%s scheme %u): SNR %.2f dB < %.1f", rec.name,
                  kvp_dtype_name(c->dtype), c->scheme, r.snr_db, c->min_snr);
        CHECK_MSG(r.clipped == 0.0 || c->dtype == KVP_DTYPE_MXFP4, "%s: %g clipped", rec.name, r.clipped);
        CHECK_EQ_U64(st.n, (uint64_t)rows * cols);
        if (c->dtype == KVP_DTYPE_I8 && c->scheme == KVP_SCHEME_CHANNEL && !c->asym)
            snr_i8 = r.snr_db;
        if (c->dtype == KVP_DTYPE_FP8_E4M3 && c->scheme == KVP_SCHEME_CHANNEL)
            snr_fp8 = r.snr_db;
        if (c->dtype == KVP_DTYPE_I4 && c->group == 128)
            snr_i4 = r.snr_db;
        /* symmetric integer schemes: every error within half a step */
        if (c->dtype == KVP_DTYPE_I8 && c->scheme == KVP_SCHEME_GROUP && !c->asym) {
            int bad = 0;
            for (int i = 0; i < rows * cols; i++) {
                float s;
                uint32_t u = kvp_le32(d[1] + 4 * (i / (int)c->group));
                memcpy(&s, &u, 4);
                bad += fabsf(x[i] - y[i]) > 0.5f * s * 1.0001f;
            }
            CHECK_EQ_I64(bad, 0);
        }
        for (int i = 0; i < 3; i++) {
            free(d[i]);
            free(d2[i]);
        }
    }
    CHECK_MSG(snr_i8 > snr_fp8 && snr_fp8 > snr_i4, "SNR ordering int8 %.1f > fp8 %.1f > int4 %.1f", snr_i8, snr_fp8,
              snr_i4);
    kvp_threadpool_free(pool);
    free(x);
    free(y);
}

/* Integer targets quantized without statistics take whole spans of units
 * through the vector kernel (quant_int_span) and ranges through the
 * vector min/max: the same bytes as the portable path, with units that
 * leave a tail past the last 32 (100 a row), an odd tail, and NaN and
 * infinities in the input (left out of the ranges, NaN quantized to 0). */
static void test_int_spans(void)
{
    static const struct { int rows, cols; uint32_t dtype, scheme, group; int asym; } cases[] = {
        {9, 100, KVP_DTYPE_I8, KVP_SCHEME_CHANNEL, 0, 0}, {9, 100, KVP_DTYPE_I8, KVP_SCHEME_TENSOR, 0, 1},
        {9, 100, KVP_DTYPE_I4, KVP_SCHEME_CHANNEL, 0, 0}, {5, 96, KVP_DTYPE_I4, KVP_SCHEME_GROUP, 32, 1},
        {5, 96, KVP_DTYPE_I8, KVP_SCHEME_GROUP, 32, 0},   {3, 37, KVP_DTYPE_I8, KVP_SCHEME_CHANNEL, 0, 1},
    };
    kvp_threadpool *pool = NULL;
    kvp_err err = {0};
    CHECK_EQ_I64(kvp_threadpool_create(&pool, 2, &err), 0);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int rows = cases[k].rows, cols = cases[k].cols;
        float *x = test_data(rows, cols, 7 + (uint64_t)k);
        x[3] = NAN, x[cols + 1] = INFINITY, x[2 * cols + 2] = -INFINITY;
        kvp_tensor_rec rec, rec2;
        memset(&rec, 0, sizeof rec);
        snprintf(rec.name, sizeof rec.name, "span%zu", k);
        rec.n_dim = 2, rec.shape[0] = (uint64_t)rows, rec.shape[1] = (uint64_t)cols;
        kvp_quant_spec spec = {cases[k].dtype, cases[k].scheme, cases[k].group, 0, cases[k].asym};
        int rc = kvp_quant_plan(&rec, &spec, &err);
        CHECK_MSG(rc == 0, "%s: plan: %s", rec.name, err.msg);
        if (rc) {
            free(x);
            continue;
        }
        rec2 = rec;
        uint8_t *d[3], *d2[3];
        for (int i = 0; i < 3; i++) {
            uint64_t nb = i == 0 ? rec.data_bytes : i == 1 ? rec.scales_bytes : rec.zeros_bytes;
            d[i] = calloc(1, nb + 1), d2[i] = calloc(1, nb + 1);
        }
        CHECK_EQ_I64(kvp_quant_tensor(&rec, x, d[0], d[1], d[2], NULL, pool, &err), 0);
        CHECK_EQ_I64(kvp_quant_tensor_impl(KVP_IMPL_PORTABLE, &rec2, x, d2[0], d2[1], d2[2], NULL, NULL, &err), 0);
        CHECK_MSG(memcmp(d[0], d2[0], rec.data_bytes) == 0 && memcmp(d[1], d2[1], rec.scales_bytes) == 0 &&
                      memcmp(d[2], d2[2], rec.zeros_bytes) == 0,
                  "%s (%s, %d x %d): simd and portable differ without statistics", rec.name,
                  kvp_dtype_name(cases[k].dtype), rows, cols);
        for (int i = 0; i < 3; i++)
            free(d[i]), free(d2[i]);
        free(x);
    }
    kvp_threadpool_free(pool);
}

/* Per channel is one scale per row of the last dimension, whatever the
 * rank: a stacked [E, out, in] weight gets E x out scales, each its row's
 * own (rows here a thousandfold apart, so a scale shared across an expert
 * would round the small rows to zero), and a 1-D tensor gets one. */
static void test_channel_rows(void)
{
    enum { E = 3, OUT = 4, IN = 32, ROWS = E * OUT };
    static const uint32_t types[] = {KVP_DTYPE_I8, KVP_DTYPE_I4, KVP_DTYPE_FP8_E4M3, KVP_DTYPE_FP4_E2M1};
    float x[ROWS * IN], y[ROWS * IN];
    uint64_t s = 5;
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < IN; c++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            x[r * IN + c] = ((float)((s >> 40) & 0xffffff) / 16777216.0f - 0.5f) * powf(10.0f, (float)(r % 4) * 3 - 6);
        }
    kvp_err err = {0};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        kvp_tensor_rec rec;
        memset(&rec, 0, sizeof rec);
        snprintf(rec.name, sizeof rec.name, "experts.%s", kvp_dtype_name(types[k]));
        rec.n_dim = 3, rec.shape[0] = E, rec.shape[1] = OUT, rec.shape[2] = IN;
        kvp_quant_spec spec = {types[k], KVP_SCHEME_CHANNEL, 0, 0, 0};
        CHECK_EQ_I64(kvp_quant_plan(&rec, &spec, &err), 0);
        CHECK_EQ_I64(kvp_tensor_scale_count(&rec), ROWS);
        CHECK_EQ_U64(rec.scales_bytes, 4 * ROWS);
        uint8_t data[ROWS * IN], scales[4 * ROWS];
        CHECK_EQ_I64(kvp_quant_tensor(&rec, x, data, scales, NULL, NULL, NULL, &err), 0);
        CHECK_EQ_I64(kvp_dequant_tensor(&rec, data, scales, NULL, y, NULL, &err), 0);
        int bad = 0;
        for (int r = 0; r < ROWS; r++) {
            float amax = 0, worst = 0;
            for (int c = 0; c < IN; c++) {
                amax = fmaxf(amax, fabsf(x[r * IN + c]));
                worst = fmaxf(worst, fabsf(x[r * IN + c] - y[r * IN + c]));
            }
            float tol = types[k] == KVP_DTYPE_I8 ? 0.5f / 127 : types[k] == KVP_DTYPE_FP8_E4M3 ? 1.0f / 16 : 0.25f;
            if (!(worst <= tol * amax * 1.001f) && bad++ < 3)
                printf("%s row %d: worst error %g of a row max %g\n", rec.name, r, (double)worst, (double)amax);
        }
        CHECK_MSG(bad == 0, "%s: %d rows not scaled by their own max", rec.name, bad);
    }
    kvp_tensor_rec v;
    memset(&v, 0, sizeof v);
    snprintf(v.name, sizeof v.name, "vector");
    v.n_dim = 1, v.shape[0] = 64;
    kvp_quant_spec spec = {KVP_DTYPE_I8, KVP_SCHEME_CHANNEL, 0, 0, 0};
    CHECK_EQ_I64(kvp_quant_plan(&v, &spec, &err), 0);
    CHECK_EQ_I64(kvp_tensor_scale_count(&v), 1);
    CHECK_EQ_U64(v.scales_bytes, 4);
}

/* A unit whose max is so small that its scale is below 2^-128 (1/s is
 * inf in f32): its zeros stay zeros (0 x inf was NaN, read as values
 * beyond fp8's range) and its other values keep their size (x x inf made
 * each one +-max), through the vector and the portable paths alike.  A
 * row of ones beside it keeps its bytes. */
static void test_tiny_units(void)
{
    static const uint32_t types[] = {KVP_DTYPE_FP8_E4M3, KVP_DTYPE_FP8_E5M2, KVP_DTYPE_I8, KVP_DTYPE_I4};
    enum { N = 64 };
    float x[2 * N], y[2 * N];
    for (int i = 0; i < N; i++) {
        x[i] = 1.0f;
        x[N + i] = 0.0f;
    }
    x[N + 3] = ldexpf(1.0f, -123), x[N + 4] = -ldexpf(1.0f, -124), x[N + 40] = ldexpf(1.0f, -125);
    x[N + 41] = 3e-39f; /* subnormal */
    kvp_err err = {0};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++)
        for (int impl = 0; impl < 2; impl++) {
            kvp_tensor_rec rec;
            memset(&rec, 0, sizeof rec);
            snprintf(rec.name, sizeof rec.name, "tiny.%s.%s", kvp_dtype_name(types[k]), impl ? "portable" : "auto");
            rec.n_dim = 2, rec.shape[0] = 2, rec.shape[1] = N;
            kvp_quant_spec spec = {types[k], KVP_SCHEME_CHANNEL, 0, 0, 0};
            CHECK_EQ_I64(kvp_quant_plan(&rec, &spec, &err), 0);
            uint8_t data[2 * N], scales[8];
            kvp_quant_stats st = {0};
            CHECK_EQ_I64(kvp_quant_tensor_impl(impl ? KVP_IMPL_PORTABLE : KVP_IMPL_AUTO, &rec, x, data, scales, NULL,
                                               &st, NULL, &err),
                         0);
            CHECK_EQ_I64(kvp_dequant_tensor(&rec, data, scales, NULL, y, NULL, &err), 0);
            float tol = types[k] == KVP_DTYPE_I4 ? 0.5f / 7 : types[k] == KVP_DTYPE_I8 ? 0.5f / 127 : 0.125f;
            int bad = 0;
            for (int i = 0; i < 2 * N; i++) {
                float amax = i < N ? 1.0f : ldexpf(1.0f, -123);
                if (!(fabsf(y[i] - x[i]) <= tol * amax) && bad++ < 3)
                    printf("%s element %d: %g came back as %g\n", rec.name, i, (double)x[i], (double)y[i]);
            }
            CHECK_MSG(bad == 0, "%s: %d elements off", rec.name, bad);
            CHECK_EQ_U64(st.n_clipped, 0);
        }
}

static void test_plan_errors(void)
{
    kvp_tensor_rec rec;
    kvp_err err = {0};
    memset(&rec, 0, sizeof rec);
    strcpy(rec.name, "blk.0.attn_q.weight");
    rec.n_dim = 2;
    rec.shape[0] = 8;
    rec.shape[1] = 100;
    kvp_quant_spec g = {KVP_DTYPE_I4, KVP_SCHEME_GROUP, 32, 0, 0};
    CHECK_EQ_I64(kvp_quant_plan(&rec, &g, &err), KVP_EINVAL);
    CHECK(strstr(err.msg, "blk.0.attn_q.weight") != NULL);
    kvp_quant_spec a = {KVP_DTYPE_FP8_E4M3, KVP_SCHEME_TENSOR, 0, 0, 1};
    CHECK_EQ_I64(kvp_quant_plan(&rec, &a, &err), KVP_EINVAL);
    kvp_quant_spec q = {KVP_DTYPE_Q8_0, 0, 0, 0, 0};
    CHECK_EQ_I64(kvp_quant_plan(&rec, &q, &err), KVP_EINVAL); /* 100 is no multiple of 32 */
    kvp_quant_spec k = {KVP_DTYPE_Q4_K, 0, 0, 0, 0};
    CHECK_EQ_I64(kvp_quant_plan(&rec, &k, &err), KVP_EUNSUPPORTED);
    kvp_quant_spec c = {KVP_DTYPE_I8, KVP_SCHEME_CHANNEL, 0, 0, 1};
    CHECK_EQ_I64(kvp_quant_plan(&rec, &c, &err), 0);
    CHECK_EQ_U64(rec.data_bytes, 800);
    CHECK_EQ_U64(rec.scales_bytes, 32);
    CHECK_EQ_U64(rec.zeros_bytes, 32);
    CHECK_EQ_U64(rec.flags, KVP_TENSOR_ASYM);
    kvp_quant_spec i4 = {KVP_DTYPE_I4, KVP_SCHEME_GROUP, 50, KVP_DTYPE_F16, 0};
    CHECK_EQ_I64(kvp_quant_plan(&rec, &i4, &err), 0);
    CHECK_EQ_U64(rec.data_bytes, 400);
    CHECK_EQ_U64(rec.scales_bytes, 32);
    i4.group = 25; /* odd groups would split bytes between scales */
    CHECK_EQ_I64(kvp_quant_plan(&rec, &i4, &err), KVP_EINVAL);
    rec.shape[1] = 99; /* odd rows: kvp_tensor_data_bytes pads each row */
    kvp_quant_spec f4 = {KVP_DTYPE_FP4_E2M1, KVP_SCHEME_TENSOR, 0, 0, 0};
    CHECK_EQ_I64(kvp_quant_plan(&rec, &f4, &err), KVP_EINVAL);
}

static void test_int_casts(void)
{
    float x[9] = {0.5f, 1.5f, -2.5f, 127.4f, 200.0f, -300.0f, NAN, -0.4f, 7.6f};
    int8_t q[9];
    kvp_quantize_row_i8(x, q, 9);
    CHECK(q[0] == 0 && q[1] == 2 && q[2] == -2 && q[3] == 127 && q[4] == 127 && q[5] == -128 && q[6] == 0 &&
          q[7] == 0 && q[8] == 8);
    uint8_t p[5];
    float y[9];
    kvp_quantize_row_i4(x, p, 9);
    kvp_dequantize_row_i4(p, y, 9);
    CHECK(y[0] == 0 && y[1] == 2 && y[2] == -2 && y[3] == 7 && y[5] == -8 && y[6] == 0 && y[8] == 7);
    CHECK_EQ_U64(p[4] >> 4, 0); /* odd count: last high nibble stays 0 */
}

static void test_kv(void)
{
    kvp_kvblock_rec b;
    kvp_err err = {0};
    memset(&b, 0, sizeof b);
    b.seq_id = 7;
    b.block_index = 2;
    b.block_size = 16;
    b.n_tokens = 10;
    b.layer_begin = 3;
    b.layer_end = 5;
    b.n_head_kv = 3;
    b.head_dim = 64;
    b.dtype = KVP_DTYPE_F16;
    const int slabs = 2 * 2 * 3, len = 16 * 64, n = slabs * len;
    b.data_bytes = (uint64_t)n * 2;
    float *x = test_data(slabs * 16, 64, 9), *y = malloc((size_t)n * sizeof *y);
    for (int k = 0; k < slabs; k++) /* unfilled slots hold junk the conversion must drop */
        for (int i = 10 * 64; i < len; i++)
            x[k * len + i] = 1000.0f;
    uint8_t *f16 = malloc((size_t)n * 2);
    kvp_quant_convert(KVP_DTYPE_F32, x, KVP_DTYPE_F16, f16, n, &err);
    static const uint32_t to[] = {KVP_DTYPE_FP8_E4M3, KVP_DTYPE_I8, KVP_DTYPE_BF16, KVP_DTYPE_F32};
    static const double min_snr[] = {25, 35, 40, 200};
    for (int t = 0; t < 4; t++) {
        kvp_kvblock_rec d, back;
        CHECK_EQ_I64(kvp_quant_kv_plan(&b, to[t], &d, &err), 0);
        CHECK_EQ_U64(d.scales_bytes, t < 2 ? (uint64_t)slabs * 4 : 0);
        CHECK_EQ_U64(d.data_bytes, (uint64_t)n * (t < 2 ? 1 : t == 2 ? 2 : 4));
        uint8_t *data = malloc(d.data_bytes), *scales = malloc(d.scales_bytes + 1), *f16b = malloc((size_t)n * 2);
        kvp_quant_stats st = {0}, st2 = {0};
        CHECK_EQ_I64(kvp_quant_kv_convert(&b, f16, NULL, &d, data, scales, &st, &err), 0);
        kvp_quant_report r;
        kvp_quant_stats_report(&st, &r);
        CHECK_MSG(r.snr_db > min_snr[t], "kv f16 -> %s: SNR %.1f", kvp_dtype_name(to[t]), r.snr_db);
        CHECK_EQ_U64(st.n, (uint64_t)slabs * 10 * 64);
        CHECK_EQ_I64(kvp_quant_kv_plan(&d, KVP_DTYPE_F16, &back, &err), 0);
        CHECK_EQ_I64(kvp_quant_kv_convert(&d, data, scales, &back, f16b, NULL, &st2, &err), 0);
        kvp_quant_convert(KVP_DTYPE_F16, f16b, KVP_DTYPE_F32, y, n, &err);
        int junk = 0;
        for (int k = 0; k < slabs; k++)
            for (int i = 10 * 64; i < len; i++)
                junk += y[k * len + i] != 0.0f;
        CHECK_EQ_I64(junk, 0);
        kvp_quant_stats_report(&st2, &r); /* back to f16: the error is only f16 rounding of what we had */
        CHECK_MSG(r.snr_db > 60, "kv %s -> f16: SNR %.1f", kvp_dtype_name(to[t]), r.snr_db);
        free(data);
        free(scales);
        free(f16b);
    }
    kvp_kvblock_rec d;
    b.n_tokens = 17;
    CHECK_EQ_I64(kvp_quant_kv_plan(&b, KVP_DTYPE_I8, &d, &err), KVP_EFORMAT);
    CHECK(strstr(err.msg, "n_tokens 17") != NULL);
    b.n_tokens = 10;
    CHECK_EQ_I64(kvp_quant_kv_plan(&b, KVP_DTYPE_Q4_0, &d, &err), KVP_EUNSUPPORTED);
    free(x);
    free(y);
    free(f16);
}

static void test_f16_paths(void)
{
    uint16_t *h = malloc(65536 * 2);
    float *a = malloc(65536 * sizeof *a), *b = malloc(65536 * sizeof *b);
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)i; /* little-endian hosts: the bytes are the f16 pattern */
    kvp_f16_row_to_f32(KVP_IMPL_AUTO, h, a, 65536);
    kvp_f16_row_to_f32(KVP_IMPL_PORTABLE, h, b, 65536);
    CHECK(memcmp(a, b, 65536 * sizeof *a) == 0);
    uint64_t s = 1;
    for (int i = 0; i < 65536; i++) { /* random f32 patterns, many in f16's subnormal and overflow range */
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t u = (uint32_t)(s >> 32);
        u = (u & 0x807fffffu) | ((100u + (u >> 23) % 56u) << 23);
        if (i % 1000 == 0)
            u |= 0x7f800000u;
        memcpy(&a[i], &u, 4);
    }
    uint16_t *h2 = malloc(65536 * 2);
    kvp_f16_row_from_f32(KVP_IMPL_AUTO, a, h, 65536);
    kvp_f16_row_from_f32(KVP_IMPL_PORTABLE, a, h2, 65536);
    CHECK(memcmp(h, h2, 65536 * 2) == 0);
    free(h);
    free(h2);
    free(a);
    free(b);
}

/* The error figures never read as exact when they could not be measured:
 * a non-finite original (skipped in the sums), or a finite one reconstructed
 * as NaN (a NaN scale); an exact conversion still gives +inf. */
static void test_stats_nonfinite(void)
{
    const float x[4] = {1.0f, -2.0f, 0.5f, 4.0f}, exact[4] = {1.0f, -2.0f, 0.5f, 4.0f};
    float inf_x[4] = {INFINITY, -2.0f, 0.5f, 4.0f}, nan_y[4] = {NAN, -2.0f, 0.5f, 4.0f};
    kvp_quant_stats st;
    kvp_quant_report r;
    memset(&st, 0, sizeof st);
    kvp_quant_stats_add(&st, x, exact, 4);
    kvp_quant_stats_report(&st, &r);
    CHECK(isinf(r.snr_db) && r.snr_db > 0 && r.rmse == 0 && r.max_abs_err == 0);
    memset(&st, 0, sizeof st);
    kvp_quant_stats_add(&st, inf_x, exact, 4); /* +inf became 1: not exact */
    kvp_quant_stats_report(&st, &r);
    CHECK_MSG(isnan(r.snr_db) && isnan(r.rmse) && isnan(r.rel_err) && isnan(r.max_abs_err),
              "inf original: snr %g rmse %g max %g", r.snr_db, r.rmse, r.max_abs_err);
    memset(&st, 0, sizeof st);
    kvp_quant_stats_add(&st, x, nan_y, 4);
    kvp_quant_stats_report(&st, &r);
    CHECK_MSG(isnan(r.snr_db) && isnan(r.rmse), "NaN reconstruction: snr %g rmse %g", r.snr_db, r.rmse);
    kvp_quant_stats merged;
    memset(&merged, 0, sizeof merged);
    memset(&st, 0, sizeof st);
    kvp_quant_stats_add(&st, inf_x, exact, 4);
    kvp_quant_stats_merge(&merged, &st); /* a merged total keeps it */
    memset(&st, 0, sizeof st);
    kvp_quant_stats_add(&st, x, exact, 4);
    kvp_quant_stats_merge(&merged, &st);
    kvp_quant_stats_report(&merged, &r);
    CHECK(isnan(r.snr_db));
}

int main(void)
{
    test_stats_nonfinite();
    test_f16_paths();
    test_kv();
    test_casts_f16();
    test_casts_decode_rand();
    test_ggml_dequant();
    test_ggml_quant();
    test_int_casts();
    test_plan_errors();
    test_scaled();
    test_int_spans();
    test_channel_rows();
    test_tiny_units();
    return unit_done();
}
