/* test_cudanum.cu - the CUDA kernels' element decoders and encoders
 * (kernels/cuda_impl.cuh), run on the CPU against lib/num: the casts the
 * KV cache stores must be the same bits (a KV block moves between a GPU and
 * a CPU process unchanged), and every weight format must decode to the
 * values lib/num gives, element for element, with the kernels' 8-element
 * indexing.  Built and run when the build has CUDA (no GPU needed). */
#include "cuda_impl.cuh"

extern "C" {
#include "argmax.h"
#include "intcast.h"
#include "kvscale.h"
#include "minifloat.h"
#include "tensor.h"
}

#include "unit.h"

#include <math.h>
#include <vector>

static uint32_t rnd_u32(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (uint32_t)(*s >> 16);
}

static int same_float(float a, float b) { return (isnan(a) && isnan(b)) || cu_fbits(a) == cu_fbits(b); }

/* Every f16 and e4m3 code decodes as lib/num decodes it. */
static void test_decoders(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++)
        bad += !same_float(cu_f16((uint16_t)h), kvp_f16_to_f32((uint16_t)h)) +
               !same_float(cu_bf16((uint16_t)h), kvp_bf16_to_f32((uint16_t)h));
    for (uint32_t b = 0; b < 256; b++)
        bad += !same_float(cu_e4m3((uint8_t)b), kvp_e4m3_to_f32((uint8_t)b));
    CHECK_MSG(bad == 0, "%d decodes differ", bad);
    /* the small integers without a conversion: the same bits as a cast
     * (+0 for 0), whatever lies above the nibble or byte */
    int ints = 0;
    for (uint32_t b = 0; b < 65536; b++)
        ints += (cu_fbits(cu_i8(b)) != cu_fbits((float)(int8_t)(uint8_t)b)) +
                (cu_fbits(cu_i4(b)) != cu_fbits((float)((int)((b & 15) ^ 8) - 8))) +
                (cu_fbits(cu_small_int(b & 15, 0)) != cu_fbits((float)(b & 15))) +
                (cu_fbits(cu_small_int(b & 15, 8)) != cu_fbits((float)((int)(b & 15) - 8)));
    for (uint32_t u = 0; u < (1u << 23); u += 4099)
        ints += cu_fbits(cu_small_int(u, 0)) != cu_fbits((float)u);
    CHECK_MSG(ints == 0, "%d small integers differ from a cast", ints);
}

/* The encoders give lib/num's bits: around every f16 / e4m3 value and its
 * neighbours (the rounding ties), specials, and random bit patterns. */
static void test_encoders(void)
{
    uint64_t st = 0x9e3779b97f4a7c15ull;
    std::vector<float> xs;
    for (uint32_t h = 0; h < 65536; h++) {
        uint32_t u = cu_fbits(kvp_f16_to_f32((uint16_t)h));
        for (int d = -1; d <= 1; d++)
            xs.push_back(cu_bitsf(u + (uint32_t)d));
        xs.push_back(cu_bitsf(u + 0x1000u)); /* half an f16 ulp above: a tie */
    }
    for (uint32_t b = 0; b < 256; b++) {
        float v = kvp_e4m3_to_f32((uint8_t)b), w = kvp_e4m3_to_f32((uint8_t)(b + 1));
        xs.push_back(v);
        xs.push_back((v + w) / 2);
        xs.push_back(nextafterf((v + w) / 2, INFINITY));
    }
    const float sp[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 448.0f, 464.0f, 465.0f, 1e30f, -1e30f, 0x1p-10f,
                        0x1p-9f, 0x1.8p-10f, 127.5f, -128.5f, 126.5f, 0.5f, -0.5f, 1.5f, 2.5f};
    xs.insert(xs.end(), sp, sp + sizeof sp / sizeof sp[0]);
    for (int i = 0; i < 2000000; i++)
        xs.push_back(cu_bitsf(rnd_u32(&st)));
    for (int i = 0; i < 200000; i++)
        xs.push_back((float)(int32_t)(rnd_u32(&st) % 1200) / 4.0f - 150.0f); /* i8 ties and saturation */
    int f16 = 0, bf16 = 0, e4m3 = 0, i8 = 0;
    for (float x : xs) {
        f16 += cu_to_f16(x) != kvp_f32_to_f16(x);
        bf16 += cu_to_bf16(x) != kvp_f32_to_bf16(x);
        e4m3 += cu_to_e4m3_sat(x) != kvp_f32_to_e4m3_sat(x);
        i8 += cu_to_i8(x) != kvp_f32_to_i8(x);
    }
    CHECK_MSG(f16 == 0, "%d of %zu f16 encodings differ", f16, xs.size());
    CHECK_MSG(bf16 == 0, "%d bf16 encodings differ", bf16);
    CHECK_MSG(e4m3 == 0, "%d e4m3 encodings differ", e4m3);
    CHECK_MSG(i8 == 0, "%d int8 encodings differ", i8);
}

/* A scaled KV row as kv_store writes it (the scale of the row's largest
 * finite |x|, each element encoded with its inverse) is kvp_kvscale_row's
 * scale and bytes. */
static void test_kv_rows(void)
{
    uint64_t st = 12345;
    const int dts[] = {KVP_DTYPE_FP8_E4M3, KVP_DTYPE_I8};
    int bad = 0, n_rows = 0;
    for (int di = 0; di < 2; di++)
        for (int r = 0; r < 3000; r++, n_rows++) {
            uint32_t n = 1 + rnd_u32(&st) % 256;
            /* every 13th row tiny: a scale below 2^-128, 1 / scale infinite */
            int lg = r % 13 == 5 ? -140 + (int)(rnd_u32(&st) % 12) : (int)(rnd_u32(&st) % 60) - 30;
            float range = ldexpf(1.0f, lg), x[256];
            for (uint32_t i = 0; i < n; i++)
                x[i] = unit_frand(&st) * range;
            if (r % 7 == 0)
                x[rnd_u32(&st) % n] = r % 14 ? INFINITY : NAN;
            if (r % 11 == 0)
                for (uint32_t i = 0; i < n; i++)
                    x[i] = 0.0f;
            uint8_t want[256], got[256];
            float ws = kvp_kvscale_row(dts[di], x, n, want), amax = 0.0f;
            for (uint32_t i = 0; i < n; i++)
                amax = fabsf(x[i]) > amax && isfinite(x[i]) ? fabsf(x[i]) : amax;
            float gs = cu_kv_row_scale(dts[di], amax), inv = 1.0f / gs;
            for (uint32_t i = 0; i < n; i++)
                got[i] = cu_kv_encode(dts[di], x[i], gs, inv);
            bad += cu_fbits(gs) != cu_fbits(ws) || memcmp(got, want, n) != 0;
        }
    CHECK_MSG(bad == 0, "%d of %d scaled KV rows differ", bad, n_rows);
    uint8_t e = 0x3c; /* a KV element read back: code value, unscaled */
    CHECK(cu_kv_elem<KVP_DTYPE_FP8_E4M3>(&e, 0) == kvp_e4m3_to_f32(e));
}

/* ---- weights: cu_wdec8 against lib/num, row by row ---- */

typedef struct wcase {
    int dtype;
    uint32_t n_in, n_out;
    int scheme;            /* 0 none, 1 tensor, 2 channel, 3 group */
    uint32_t group;
    int zeros;
    float scale_max; /* scales drawn in +-scale_max (0: 0.1) */
} wcase;

/* Element i of row r of w as lib/num reads it. */
static void oracle_row(const wcase &c, const uint8_t *row, const float *sc, const float *zp, float *out)
{
    if (!c.scheme) {
        kvp_dtype_get((uint32_t)c.dtype)->to_f32(row, out, c.n_in);
        return;
    }
    for (uint32_t i = 0; i < c.n_in; i++) {
        float q = c.dtype == KVP_DTYPE_I8 ? (float)(int8_t)row[i]
                  : c.dtype == KVP_DTYPE_I4 ? (float)kvp_i4_at(row, i)
                                            : kvp_e4m3_to_f32(row[i]);
        out[i] = (q - (zp ? zp[i / c.group] : 0.0f)) * sc[i / c.group];
    }
}

static void test_weights(void)
{
    const wcase cases[] = {
        {KVP_DTYPE_F32, 64, 3, 0, 0, 0, 0.0f},        {KVP_DTYPE_F32, 37, 3, 0, 0, 0, 0.0f},
        {KVP_DTYPE_F16, 64, 3, 0, 0, 0, 0.0f},        {KVP_DTYPE_F16, 13, 3, 0, 0, 0, 0.0f},
        {KVP_DTYPE_BF16, 72, 3, 0, 0, 0, 0.0f},       {KVP_DTYPE_BF16, 9, 2, 0, 0, 0, 0.0f},
        {KVP_DTYPE_Q4_0, 96, 3, 0, 0, 0, 0.0f},       {KVP_DTYPE_Q4_1, 64, 3, 0, 0, 0, 0.0f},
        {KVP_DTYPE_Q8_0, 96, 3, 0, 0, 0, 0.0f},       {KVP_DTYPE_FP8_E4M3, 40, 3, 1, 40, 0, 0.0f},
        {KVP_DTYPE_FP8_E4M3, 64, 3, 3, 16, 0, 0.0f},
        {KVP_DTYPE_FP8_E4M3, 64, 5, 3, 8, 0, 1000.0f}, /* scales past 2^8 too: the grouped fold's limit */
        {KVP_DTYPE_I8, 48, 3, 2, 48, 0, 0.0f},        {KVP_DTYPE_I8, 64, 3, 3, 32, 1, 0.0f},
        {KVP_DTYPE_I8, 21, 2, 3, 7, 1, 0.0f},         {KVP_DTYPE_I4, 64, 3, 3, 32, 1, 0.0f},
        {KVP_DTYPE_I4, 31, 3, 2, 31, 0, 0.0f},        {KVP_DTYPE_I4, 128, 2, 1, 128, 1, 0.0f},
        {KVP_DTYPE_I4, 64, 3, 3, 16, 0, 0.0f},        {KVP_DTYPE_I8, 64, 3, 3, 16, 0, 0.0f},
    };
    uint64_t st = 777;
    for (const wcase &c : cases) {
        uint64_t row_bytes = (uint64_t)kvp_dtype_row_bytes((uint32_t)c.dtype, c.n_in);
        std::vector<uint8_t> data(row_bytes * c.n_out + 16);
        uint8_t *base = data.data() + (16 - ((uintptr_t)data.data() & 15)) % 16; /* as cudaMalloc'd rows */
        for (uint64_t i = 0; i < row_bytes * c.n_out; i++)
            base[i] = (uint8_t)rnd_u32(&st);
        if (c.dtype == KVP_DTYPE_FP8_E4M3) /* NaN codes, each in a group of 8 of its own */
            base[5] = 0x7f, base[row_bytes + 9] = 0xff;
        if (c.dtype == KVP_DTYPE_F32) /* finite floats */
            for (uint32_t i = 0; i < c.n_in * c.n_out; i++) {
                float f = unit_frand(&st) * 10.0f;
                memcpy(base + 4 * i, &f, 4);
            }
        uint32_t bb = c.dtype == KVP_DTYPE_Q4_0 ? 18 : c.dtype == KVP_DTYPE_Q4_1 ? 20 : c.dtype == KVP_DTYPE_Q8_0 ? 34 : 0;
        for (uint64_t b = 0; bb && b < row_bytes * c.n_out / bb; b++) { /* finite block scales and minimums */
            uint16_t d = kvp_f32_to_f16(unit_frand(&st)), m = kvp_f32_to_f16(unit_frand(&st) * 4.0f);
            memcpy(base + b * bb, &d, 2);
            if (c.dtype == KVP_DTYPE_Q4_1)
                memcpy(base + b * bb + 2, &m, 2);
        }
        uint32_t stride = c.scheme == 1 ? 0 : c.scheme == 2 ? 1 : c.scheme == 3 ? c.n_in / c.group : 0;
        size_t n_sc = c.scheme ? (stride ? (size_t)c.n_out * stride : 1) : 0;
        std::vector<float> sc(n_sc + 1), zp(n_sc + 1);
        for (size_t i = 0; i < n_sc; i++) {
            sc[i] = unit_frand(&st) * (c.scale_max > 0.0f ? c.scale_max : 0.1f);
            zp[i] = (float)(int)(rnd_u32(&st) % 7) - 3.0f;
        }
        cu_wview w;
        w.data = base, w.row_bytes = row_bytes, w.n_in = c.n_in;
        w.sc = c.scheme ? sc.data() : NULL, w.zp = c.zeros ? zp.data() : NULL;
        w.group = c.group, w.scale_stride = stride;
        int bad = 0, grouped = 0;
        std::vector<float> want(c.n_in);
        for (uint32_t r = 0; r < c.n_out; r++) {
            oracle_row(c, base + r * row_bytes, w.sc ? w.sc + (size_t)r * stride : NULL,
                       w.zp ? w.zp + (size_t)r * stride : NULL, want.data());
            /* past the row: zeros (element kinds; the kernels never ask a block kind there) */
            for (uint32_t i0 = 0; i0 < c.n_in + (bb ? 0 : 8); i0 += 8) {
                float got[8];
                switch (c.dtype) {
#define CU_DEC_CASE(DT) \
    case DT: cu_wdec8<DT>(w, r, i0, got); break;
                    CU_WEIGHT_DTYPES(CU_DEC_CASE)
#undef CU_DEC_CASE
                default: bad++; continue;
                }
                for (uint32_t j = 0; j < 8; j++)
                    bad += !same_float(got[j], i0 + j < c.n_in ? want[i0 + j] : 0.0f);
                if (i0 >= c.n_in || !cu_wgrouped(w, c.dtype))
                    continue;
                grouped++; /* the GEMV's grouped decoder: the same values */
                if (c.dtype == KVP_DTYPE_FP8_E4M3)
                    cu_wdec8_grp<KVP_DTYPE_FP8_E4M3>(w, r, i0, got);
                else if (c.dtype == KVP_DTYPE_I8)
                    cu_wdec8_grp<KVP_DTYPE_I8>(w, r, i0, got);
                else
                    cu_wdec8_grp<KVP_DTYPE_I4>(w, r, i0, got);
                for (uint32_t j = 0; j < 8; j++)
                    bad += !same_float(got[j], want[i0 + j]);
            }
        }
        CHECK_MSG(bad == 0, "%s, %u x %u, scheme %d group %u%s: %d elements differ", kvp_dtype_name((uint32_t)c.dtype),
                  c.n_out, c.n_in, c.scheme, c.group, c.zeros ? " with zeros" : "", bad);
        /* which cases the grouped decoder takes: groups and rows in 8s */
        int want_grouped = c.scheme && c.group % 8 == 0 && c.n_in % 8 == 0;
        CHECK_MSG((grouped > 0) == want_grouped, "%s, %u x %u, group %u: grouped decoder %s",
                  kvp_dtype_name((uint32_t)c.dtype), c.n_out, c.n_in, c.group, grouped ? "taken" : "not taken");
    }
}

/* ---- the pipelined attention's K/V chunks ----
 *
 * cu_kv_chunk_load then cu_kv_chunk_elem give cu_kv_elem's value for every
 * element of a row, by one vector load (where the kernel takes it: head_dim
 * a multiple of 8, the row aligned to a chunk) and element by element, 0
 * past head_dim; the words are poisoned first. */
template <int DT>
static int kv_chunk_row_bad(const uint8_t *row, uint32_t hd, int *vec_rows)
{
    int bad = 0;
    const uint32_t cb = CU_KV_CH * cu_kv_fmt<DT>::ES; /* a chunk's bytes */
    for (uint32_t dc = 0; dc < (hd + CU_KV_CH - 1) / CU_KV_CH; dc++)
        for (int vec = 0; vec < 2; vec++) {
            if (vec && (hd % CU_KV_CH || (uintptr_t)row % (cb < 16 ? cb : 16)))
                continue;
            *vec_rows += vec && dc == 0;
            uint32_t w[8];
            memset(w, 0xa5, sizeof w);
            cu_kv_chunk_load<DT>(row, dc, hd, vec, w);
            for (int k = 0; k < CU_KV_CH; k++) {
                uint32_t d = dc * CU_KV_CH + k;
                bad += !same_float(cu_kv_chunk_elem<DT>(w, k), d < hd ? cu_kv_elem<DT>(row, d) : 0.0f);
            }
        }
    return bad;
}

static void test_kv_chunks(void)
{
    /* a tile's chunk numbers name each (K/V, key, chunk of the row) once */
    static const uint32_t nchs[] = {1, 5, 8, 10, 16, 32};
    for (uint32_t nch : nchs) {
        std::vector<int> seen(2 * 16 * nch, 0);
        int ok = 1;
        for (uint32_t c = 0; c < 2 * 16 * nch; c++) {
            uint32_t which, j, dc;
            cu_kv_chunk_at(c, nch, 16, which, j, dc);
            ok &= which < 2 && j < 16 && dc < nch;
            if (which < 2 && j < 16 && dc < nch)
                seen[(which * 16 + j) * nch + dc]++;
            ok &= c == 0 || dc == (c % nch); /* dc fastest */
        }
        for (int v : seen)
            ok &= v == 1;
        CHECK_MSG(ok, "chunks of rows of %u: not one to one", nch);
    }
    uint64_t st = 4242;
    static const uint32_t hds[] = {36, 64, 80, 128, 5};
    for (uint32_t hd : hds) {
        std::vector<uint8_t> buf(4 * hd + 64);
        uint8_t *row = buf.data() + (16 - ((uintptr_t)buf.data() & 15)) % 16; /* as the pool's rows */
        for (size_t i = 0; i < 4 * hd; i++)
            row[i] = (uint8_t)rnd_u32(&st);
        int bad = 0, vec_rows = 0;
        bad += kv_chunk_row_bad<KVP_DTYPE_F16>(row, hd, &vec_rows);
        bad += kv_chunk_row_bad<KVP_DTYPE_BF16>(row, hd, &vec_rows);
        bad += kv_chunk_row_bad<KVP_DTYPE_FP8_E4M3>(row, hd, &vec_rows);
        bad += kv_chunk_row_bad<KVP_DTYPE_I8>(row, hd, &vec_rows);
        bad += kv_chunk_row_bad<KVP_DTYPE_I8>(row + 3, hd, &vec_rows); /* unaligned: element by element */
        for (uint32_t i = 0; i < hd; i++) {                            /* f32: finite values */
            float f = unit_frand(&st) * 100.0f;
            memcpy(row + 4 * i, &f, 4);
        }
        bad += kv_chunk_row_bad<KVP_DTYPE_F32>(row, hd, &vec_rows);
        CHECK_MSG(bad == 0, "head_dim %u: %d chunk elements differ from cu_kv_elem", hd, bad);
        CHECK_MSG((vec_rows > 0) == (hd % 8 == 0), "head_dim %u: vector loads %s", hd,
                  vec_rows ? "taken" : "not taken");
    }
}

/* The KV layout helpers index backend.h's [layer][K/V][head][slot][dim]. */
static void test_kv_layout(void)
{
    kvp_kv_pool kv;
    memset(&kv, 0, sizeof kv);
    kv.dtype = KVP_DTYPE_F16, kv.block_size = 16, kv.n_layer = 3, kv.n_head_kv = 2, kv.head_dim = 64;
    CHECK_EQ_U64(cu_kv_row(kv, 0, 0, 0, 1), 64 * 2);
    CHECK_EQ_U64(cu_kv_row(kv, 0, 1, 0, 0), 2 * 16 * 64 * 2);
    CHECK_EQ_U64(cu_kv_row(kv, 2, 1, 1, 15), ((((2 * 2 + 1) * 2 + 1) * 16 + 15) * 64) * 2);
    CHECK_EQ_U64(cu_kv_scale(kv, 2, 1, 1, 15), ((2 * 2 + 1) * 2 + 1) * 16 + 15);
    kv.dtype = KVP_DTYPE_I8;
    CHECK_EQ_U64(cu_kv_row(kv, 1, 0, 1, 2), (((1 * 2 + 0) * 2 + 1) * 16 + 2) * 64);
}

/* cu_argmax_k's folds run on the CPU: 256 threads each over its strided
 * elements, then each warp's shuffle-down tree and the eight warps' the
 * same way, all by cu_argmax_beats; the result must be kvp_argmax_f32's on
 * rows with ties, NaN and infinities, short and long. */
static uint32_t argmax_as_kernel(const float *x, uint32_t n)
{
    enum { THREADS = 256 };
    float bv[THREADS];
    uint32_t bi[THREADS];
    for (uint32_t t = 0; t < THREADS; t++) {
        bv[t] = -INFINITY, bi[t] = UINT32_MAX;
        for (uint32_t i = t; i < n; i += THREADS)
            if (cu_argmax_beats(x[i], i, bv[t], bi[t]))
                bv[t] = x[i], bi[t] = i;
    }
    float wv[THREADS / 32];
    uint32_t wi[THREADS / 32];
    for (uint32_t w = 0; w < THREADS / 32; w++) { /* __shfl_down_sync: lanes past the warp keep their own */
        float *v = bv + 32 * w;
        uint32_t *ix = bi + 32 * w;
        for (int off = 16; off > 0; off >>= 1)
            for (int l = 0; l + off < 32; l++) /* in lane order: lane l reads l + off before l + off changes */
                if (cu_argmax_beats(v[l + off], ix[l + off], v[l], ix[l]))
                    v[l] = v[l + off], ix[l] = ix[l + off];
        wv[w] = v[0], wi[w] = ix[0];
    }
    float v[32];
    uint32_t ix[32];
    for (int l = 0; l < 32; l++)
        v[l] = l < THREADS / 32 ? wv[l] : -INFINITY, ix[l] = l < THREADS / 32 ? wi[l] : UINT32_MAX;
    for (int off = 16; off > 0; off >>= 1)
        for (int l = 0; l + off < 32; l++)
            if (cu_argmax_beats(v[l + off], ix[l + off], v[l], ix[l]))
                v[l] = v[l + off], ix[l] = ix[l + off];
    return ix[0] == UINT32_MAX ? 0 : ix[0];
}

static void test_argmax(void)
{
    uint64_t s = 5;
    std::vector<float> x(70000);
    int bad = 0, rows = 0;
    for (uint32_t n : {1u, 7u, 255u, 256u, 257u, 1000u, 49152u, 70000u})
        for (int rep = 0; rep < 6; rep++, rows++) {
            for (uint32_t i = 0; i < n; i++) {
                uint32_t r = rnd_u32(&s) % 1000;
                x[i] = r < 20 ? NAN : r < 30 ? -INFINITY : r < (rep == 5 ? 1000u : 33u) ? INFINITY : (float)(r % 50);
            }
            if (rep == 4)
                for (uint32_t i = 0; i < n; i++)
                    x[i] = NAN; /* none counts: 0 */
            bad += argmax_as_kernel(x.data(), n) != kvp_argmax_f32(x.data(), n);
        }
    CHECK_MSG(bad == 0, "argmax: %d of %d rows differ from kvp_argmax_f32", bad, rows);
}

int main(void)
{
    test_argmax();
    test_decoders();
    test_encoders();
    test_kv_rows();
    test_weights();
    test_kv_chunks();
    test_kv_layout();
    return unit_done();
}
