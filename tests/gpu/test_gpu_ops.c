/* test_gpu_ops.c - every op of the backend table (lib/backend/backend.h) on
 * the "cuda" backend against the "cpu" backend, on random inputs, by
 * normalized error (gpu_util.h).  Each case runs the same code on both
 * backends: inputs uploaded with from_host, the output buffer poisoned with
 * NaN first (so an op that leaves elements unwritten fails), the result
 * read back with to_host.  Tolerances (README.md beside this file says why):
 *
 *   matmul     ||gpu - cpu|| / ||cpu|| and max|gpu - cpu| / max|cpu|:
 *              f32 1e-3; f16, bf16, q4_0, q4_1, q8_0, i8, i4 1e-2 (either
 *              side may round activations to 8 or 16 bits); fp8 5e-2 (a GPU
 *              may round activations to fp8 for its tensor cores)
 *   embed      f32/f16/bf16 tables exact; block and scaled types 1e-6
 *   rmsnorm 1e-5, rope 1e-4 (dims past rot_dim exact), silu_mul 1e-5
 *   add, add_bias, gather_rows: exact
 *
 * The KV pool's ops (kv_store, attention, kv_copy_block) are test_gpu_kv.c's.
 * Skips with one line when this build or machine has no CUDA backend. */
#include "gpu_util.h"
#include "quant.h"
#include "tensor.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { CPU = 0, GPU = 1 };
static kvp_backend *be[2];
static uint64_t rng = 0x2545f4914f6cdd1dull;
static float frand(void) { return unit_frand(&rng); } /* uniform in [-1, 1) */

/* ---- weights: built with the library's quantizers, prepared per backend ---- */

typedef struct test_weight {
    kvp_weight w;          /* the host descriptor (dev NULL); each backend prepares a copy */
    uint8_t *data, *scales, *zeros;
    char name[64];
} test_weight;

/* x [n_out][n_in] quantized per spec into t.  0, or -1 after a failed check. */
static int weight_make(test_weight *t, const char *name, const kvp_quant_spec *spec, uint32_t n_out, uint32_t n_in,
                       const float *x)
{
    kvp_err err = {0};
    kvp_tensor_rec rec;
    memset(t, 0, sizeof *t);
    memset(&rec, 0, sizeof rec);
    snprintf(t->name, sizeof t->name, "%s", name);
    snprintf(rec.name, sizeof rec.name, "%s", name);
    rec.n_dim = 2, rec.shape[0] = n_out, rec.shape[1] = n_in;
    if (kvp_quant_plan(&rec, spec, &err) < 0) {
        CHECK_MSG(0, "plan %s: %s", name, err.msg);
        return -1;
    }
    t->data = calloc(1, rec.data_bytes + 64);
    t->scales = calloc(1, rec.scales_bytes + 4);
    t->zeros = calloc(1, rec.zeros_bytes + 4);
    if (!t->data || !t->scales || !t->zeros ||
        kvp_quant_tensor(&rec, x, t->data, t->scales, rec.zeros_bytes ? t->zeros : NULL, NULL, NULL, &err) < 0) {
        CHECK_MSG(0, "quantize %s: %s", name, err.msg);
        return -1;
    }
    int scaled = rec.scheme != KVP_SCHEME_NONE;
    t->w = (kvp_weight){.name = t->name, .dtype = (int)rec.dtype, .n_in = n_in, .n_out = n_out,
                        .row_bytes = (uint64_t)kvp_dtype_row_bytes(rec.dtype, n_in), .data = t->data,
                        .scales = scaled ? (const float *)t->scales : NULL,
                        .zeros = rec.zeros_bytes ? (const float *)t->zeros : NULL,
                        .group = rec.scheme == KVP_SCHEME_GROUP ? rec.group : n_in,
                        .scale_stride = rec.scheme == KVP_SCHEME_TENSOR    ? 0
                                        : rec.scheme == KVP_SCHEME_CHANNEL ? 1
                                        : rec.scheme == KVP_SCHEME_GROUP   ? n_in / rec.group
                                                                           : 0,
                        .global = rec.global_scale};
    return 0;
}

/* A 1-D f32 weight (norm weight, bias, RoPE frequencies). */
static int weight_f32(test_weight *t, const char *name, const float *x, uint32_t n)
{
    const kvp_quant_spec f32 = {KVP_DTYPE_F32, KVP_SCHEME_NONE, 0, 0, 0};
    int rc = weight_make(t, name, &f32, 1, n, x);
    t->w.row_bytes = (uint64_t)n * 4;
    return rc;
}

static void weight_free(test_weight *t)
{
    free(t->data), free(t->scales), free(t->zeros);
    memset(t, 0, sizeof *t);
}

/* b's own prepared copy of t's weight in *out.  0, or -1 after a failed check. */
static int weight_prepare(kvp_backend *b, const test_weight *t, kvp_weight *out)
{
    kvp_err err = {0};
    *out = t->w;
    out->dev = NULL;
    return gpu_op(b, t->name, b->ops->prepare_weight(b, out, &err), &err);
}

/* ---- every op: one runner each, the same for both backends ---- */

static int run_matmul(kvp_backend *b, const kvp_weight *w, const float *x, uint32_t nt, float *y)
{
    kvp_err err = {0};
    float *dx = gpu_put(b, x, sizeof(float) * nt * w->n_in), *dy = gpu_nan(b, (size_t)nt * w->n_out);
    int rc = dx && dy ? gpu_op(b, "matmul", b->ops->matmul(b, w, dx, dy, nt, &err), &err) : -1;
    if (rc == 0)
        rc = gpu_get(b, y, dy, sizeof(float) * nt * w->n_out, "matmul");
    gpu_free(b, dx), gpu_free(b, dy);
    return rc;
}

static int run_embed(kvp_backend *b, const kvp_weight *w, const int32_t *tok, uint32_t nt, float *y)
{
    kvp_err err = {0};
    int32_t *dt = gpu_put(b, tok, sizeof(int32_t) * nt);
    float *dy = gpu_nan(b, (size_t)nt * w->n_in);
    int rc = dt && dy ? gpu_op(b, "embed", b->ops->embed(b, w, dt, nt, dy, &err), &err) : -1;
    if (rc == 0)
        rc = gpu_get(b, y, dy, sizeof(float) * nt * w->n_in, "embed");
    gpu_free(b, dt), gpu_free(b, dy);
    return rc;
}

/* y = rmsnorm(x); in place when inplace (y's buffer is then x's). */
static int run_rmsnorm(kvp_backend *b, const float *x, const kvp_weight *w, uint32_t nt, uint32_t n, int inplace,
                       float *y)
{
    kvp_err err = {0};
    float *dx = gpu_put(b, x, sizeof(float) * nt * n), *dy = inplace ? dx : gpu_nan(b, (size_t)nt * n);
    int rc = dx && dy ? gpu_op(b, "rmsnorm", b->ops->rmsnorm(b, dx, w, dy, nt, n, 1e-5f, &err), &err) : -1;
    if (rc == 0)
        rc = gpu_get(b, y, dy, sizeof(float) * nt * n, "rmsnorm");
    gpu_free(b, dx);
    if (!inplace)
        gpu_free(b, dy);
    return rc;
}

static int run_rope(kvp_backend *b, float *x, uint32_t nt, uint32_t nh, uint32_t hd, uint32_t rot,
                    const int32_t *pos, const kvp_weight *inv, int kind)
{
    kvp_err err = {0};
    size_t n = (size_t)nt * nh * hd;
    float *dx = gpu_put(b, x, sizeof(float) * n);
    int32_t *dp = gpu_put(b, pos, sizeof(int32_t) * nt);
    int rc = dx && dp ? gpu_op(b, "rope", b->ops->rope(b, dx, nt, nh, hd, rot, dp, inv, kind, &err), &err) : -1;
    if (rc == 0)
        rc = gpu_get(b, x, dx, sizeof(float) * n, "rope");
    gpu_free(b, dx), gpu_free(b, dp);
    return rc;
}

/* which: 0 add_bias (y is the bias weight), 1 add, 2 silu_mul; x in place. */
static int run_elementwise(kvp_backend *b, int which, float *x, const float *y, const kvp_weight *bias, uint32_t nt,
                           uint32_t n)
{
    kvp_err err = {0};
    size_t all = (size_t)nt * n;
    float *dx = gpu_put(b, x, sizeof(float) * all), *dy = which ? gpu_put(b, y, sizeof(float) * all) : NULL;
    int rc = -1;
    if (dx && (dy || !which)) {
        if (which == 0)
            rc = gpu_op(b, "add_bias", b->ops->add_bias(b, dx, bias, nt, n, &err), &err);
        else if (which == 1)
            rc = gpu_op(b, "add", b->ops->add(b, dx, dy, all, &err), &err);
        else
            rc = gpu_op(b, "silu_mul", b->ops->silu_mul(b, dx, dy, all, &err), &err);
    }
    if (rc == 0)
        rc = gpu_get(b, x, dx, sizeof(float) * all, "elementwise");
    gpu_free(b, dx), gpu_free(b, dy);
    return rc;
}

static int run_gather(kvp_backend *b, const float *src, uint32_t n_src, const uint32_t *rows, uint32_t n_rows,
                      uint32_t n, float *dst)
{
    kvp_err err = {0};
    float *ds = gpu_put(b, src, sizeof(float) * n_src * n), *dd = gpu_nan(b, (size_t)n_rows * n);
    uint32_t *dr = gpu_put(b, rows, sizeof(uint32_t) * n_rows);
    int rc = ds && dd && dr ? gpu_op(b, "gather_rows", b->ops->gather_rows(b, dd, ds, dr, n_rows, n, &err), &err) : -1;
    if (rc == 0)
        rc = gpu_get(b, dst, dd, sizeof(float) * n_rows * n, "gather_rows");
    gpu_free(b, ds), gpu_free(b, dd), gpu_free(b, dr);
    return rc;
}

/* ---- matmul: every weight dtype of the contract, n_tok 1, 3, 16, 100 ---- */

typedef struct mm_case {
    kvp_quant_spec spec;
    double tol;
} mm_case;

static const mm_case mm_cases[] = {
    {{KVP_DTYPE_F32, KVP_SCHEME_NONE, 0, 0, 0}, 1e-3},
    {{KVP_DTYPE_F16, KVP_SCHEME_NONE, 0, 0, 0}, 1e-2},
    {{KVP_DTYPE_BF16, KVP_SCHEME_NONE, 0, 0, 0}, 1e-2},
    {{KVP_DTYPE_Q4_0, KVP_SCHEME_NONE, 0, 0, 0}, 1e-2},
    {{KVP_DTYPE_Q4_1, KVP_SCHEME_NONE, 0, 0, 0}, 1e-2},
    {{KVP_DTYPE_Q8_0, KVP_SCHEME_NONE, 0, 0, 0}, 1e-2},
    {{KVP_DTYPE_FP8_E4M3, KVP_SCHEME_TENSOR, 0, 0, 0}, 5e-2},
    {{KVP_DTYPE_FP8_E4M3, KVP_SCHEME_CHANNEL, 0, 0, 0}, 5e-2},
    {{KVP_DTYPE_FP8_E4M3, KVP_SCHEME_GROUP, 128, 0, 0}, 5e-2},
    {{KVP_DTYPE_I8, KVP_SCHEME_TENSOR, 0, 0, 0}, 1e-2},
    {{KVP_DTYPE_I8, KVP_SCHEME_CHANNEL, 0, 0, 0}, 1e-2},
    {{KVP_DTYPE_I8, KVP_SCHEME_GROUP, 64, 0, 1}, 1e-2},
    {{KVP_DTYPE_I4, KVP_SCHEME_CHANNEL, 0, 0, 0}, 1e-2},
    {{KVP_DTYPE_I4, KVP_SCHEME_GROUP, 128, 0, 0}, 1e-2},
    {{KVP_DTYPE_I4, KVP_SCHEME_GROUP, 32, 0, 1}, 1e-2},
};

static const char *scheme_name(const kvp_quant_spec *s)
{
    static char buf[48];
    static const char *names[] = {"", " tensor", " channel", " group"};
    snprintf(buf, sizeof buf, "%s%s", s->scheme <= 3 ? names[s->scheme] : " ?", s->asym ? " asym" : "");
    if (s->scheme == KVP_SCHEME_GROUP)
        snprintf(buf + strlen(buf), sizeof buf - strlen(buf), " %u", s->group);
    return buf;
}

/* Random weights whose rows differ in range (a per-channel or per-group
 * scale applied to the wrong row shows), times random activations. */
static void fill_weights(float *w, uint32_t n_out, uint32_t n_in)
{
    for (uint32_t r = 0; r < n_out; r++)
        for (uint32_t i = 0; i < n_in; i++)
            w[(size_t)r * n_in + i] = frand() * (0.25f + (float)(r % 7)) * (i % 97 == 5 ? 4.0f : 1.0f);
}

/* One weight on both backends at every n_tok; 0, or -1 when it could not
 * run (prepare or matmul failed: already a failed check). */
static int matmul_compare(const test_weight *t, const char *label, double tol)
{
    static const uint32_t nts[] = {1, 3, 16, 100};
    const kvp_weight *hw = &t->w;
    kvp_weight w[2];
    float *x = malloc(sizeof(float) * 100 * hw->n_in), *y[2];
    y[CPU] = malloc(sizeof(float) * 100 * hw->n_out), y[GPU] = malloc(sizeof(float) * 100 * hw->n_out);
    int rc = x && y[CPU] && y[GPU] ? 0 : -1;
    for (size_t i = 0; rc == 0 && i < (size_t)100 * hw->n_in; i++)
        x[i] = frand();
    int prepared[2] = {0, 0};
    for (int k = 0; rc == 0 && k < 2; k++)
        prepared[k] = (rc = weight_prepare(be[k], t, &w[k])) == 0;
    for (size_t j = 0; rc == 0 && j < sizeof nts / sizeof nts[0]; j++) {
        for (int k = 0; rc == 0 && k < 2; k++)
            rc = run_matmul(be[k], &w[k], x, nts[j], y[k]);
        if (rc < 0)
            break;
        gpu_diff d;
        char what[160];
        gpu_diff_f32(&d, y[GPU], y[CPU], (size_t)nts[j] * hw->n_out);
        snprintf(what, sizeof what, "%s %ux%u n_tok %u", label, hw->n_out, hw->n_in, nts[j]);
        gpu_expect(what, &d, tol);
    }
    for (int k = 0; k < 2; k++)
        if (prepared[k])
            be[k]->ops->release_weight(be[k], &w[k]);
    free(x), free(y[CPU]), free(y[GPU]);
    return rc;
}

static void test_matmul(void)
{
    /* n_out x n_in: an odd row count, a wide one, and one whose split GEMM
     * on an H200 has a short last k part (68 steps: 13 parts of 5, one of 3) */
    static const uint32_t shapes[][2] = {{77, 512}, {192, 2048}, {40, 2176}};
    for (size_t c = 0; c < sizeof mm_cases / sizeof mm_cases[0]; c++) {
        const mm_case *mc = &mm_cases[c];
        int scaled = mc->spec.scheme != KVP_SCHEME_NONE;
        char label[96];
        snprintf(label, sizeof label, "matmul %s%s", kvp_dtype_name(mc->spec.dtype), scheme_name(&mc->spec));
        CHECK_MSG(be[GPU]->ops->supports(be[GPU], KVP_USE_MATMUL, (int)mc->spec.dtype, scaled),
                  "%s: the cuda backend says it does not support it (the issue's scope does)", label);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            uint32_t n_out = shapes[s][0], n_in = shapes[s][1];
            float *wf = malloc(sizeof(float) * n_out * n_in);
            test_weight t;
            if (!wf) {
                CHECK(0);
                return;
            }
            fill_weights(wf, n_out, n_in);
            if (weight_make(&t, "blk.0.ffn_up.weight", &mc->spec, n_out, n_in, wf) == 0)
                matmul_compare(&t, label, mc->tol);
            weight_free(&t);
            free(wf);
        }
    }
}

/* prepare_weight refuses what supports() says no to, with KVP_EUNSUPPORTED
 * and the tensor's name; what it says yes to must then match the CPU. */
static void test_refuse(void)
{
    static const kvp_quant_spec others[] = {
        {KVP_DTYPE_Q5_0, KVP_SCHEME_NONE, 0, 0, 0},     {KVP_DTYPE_Q5_1, KVP_SCHEME_NONE, 0, 0, 0},
        {KVP_DTYPE_FP8_E5M2, KVP_SCHEME_TENSOR, 0, 0, 0}, {KVP_DTYPE_NVFP4, KVP_SCHEME_NONE, 0, 0, 0},
        {KVP_DTYPE_MXFP4, KVP_SCHEME_NONE, 0, 0, 0},    {KVP_DTYPE_FP4_E2M1, KVP_SCHEME_GROUP, 32, 0, 0},
    };
    enum { NO = 40, NI = 256 };
    static float wf[NO * NI];
    fill_weights(wf, NO, NI);
    int refused = 0;
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        const kvp_quant_spec *sp = &others[i];
        test_weight t;
        char name[64], label[96];
        snprintf(name, sizeof name, "blk.3.attn_%s.weight", kvp_dtype_name(sp->dtype));
        snprintf(label, sizeof label, "matmul %s%s (beyond the scope)", kvp_dtype_name(sp->dtype), scheme_name(sp));
        if (weight_make(&t, name, sp, NO, NI, wf) < 0) {
            weight_free(&t);
            continue;
        }
        if (be[GPU]->ops->supports(be[GPU], KVP_USE_MATMUL, (int)sp->dtype, sp->scheme != KVP_SCHEME_NONE)) {
            matmul_compare(&t, label, 5e-2);
        } else {
            kvp_err err = {0};
            kvp_weight w = t.w;
            int rc = be[GPU]->ops->prepare_weight(be[GPU], &w, &err);
            CHECK_MSG(rc == KVP_EUNSUPPORTED && strstr(err.msg, name),
                      "prepare_weight of unsupported %s: rc %d (want %d) message \"%s\" (must name %s)",
                      kvp_dtype_name(sp->dtype), rc, KVP_EUNSUPPORTED, err.msg, name);
            if (rc == 0)
                be[GPU]->ops->release_weight(be[GPU], &w);
            else
                printf("ok prepare_weight refuses %s: %s\n", kvp_dtype_name(sp->dtype), err.msg);
            refused++;
        }
        weight_free(&t);
    }
    if (!refused)
        printf("note: the cuda backend supports every dtype tried; refusal not exercised\n");
}

/* ---- embed, rmsnorm, rope, elementwise, gather_rows ---- */

static void test_embed(void)
{
    static const kvp_quant_spec specs[] = {
        {KVP_DTYPE_F32, KVP_SCHEME_NONE, 0, 0, 0},  {KVP_DTYPE_F16, KVP_SCHEME_NONE, 0, 0, 0},
        {KVP_DTYPE_BF16, KVP_SCHEME_NONE, 0, 0, 0}, {KVP_DTYPE_Q4_0, KVP_SCHEME_NONE, 0, 0, 0},
        {KVP_DTYPE_Q4_1, KVP_SCHEME_NONE, 0, 0, 0}, {KVP_DTYPE_Q8_0, KVP_SCHEME_NONE, 0, 0, 0},
        {KVP_DTYPE_FP8_E4M3, KVP_SCHEME_CHANNEL, 0, 0, 0}, {KVP_DTYPE_I8, KVP_SCHEME_CHANNEL, 0, 0, 0},
        {KVP_DTYPE_I4, KVP_SCHEME_GROUP, 32, 0, 1},
    };
    enum { NV = 300, ND = 256, NT = 9 };
    static float wf[NV * ND], y[2][NT * ND];
    const int32_t tok[NT] = {0, NV - 1, 17, 17, 150, 3, 299, 64, 1};
    fill_weights(wf, NV, ND);
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        const kvp_quant_spec *sp = &specs[i];
        int scaled = sp->scheme != KVP_SCHEME_NONE, plain = sp->dtype <= KVP_DTYPE_BF16;
        char what[96];
        snprintf(what, sizeof what, "embed %s%s", kvp_dtype_name(sp->dtype), scheme_name(sp));
        if (!be[GPU]->ops->supports(be[GPU], KVP_USE_EMBED, (int)sp->dtype, scaled)) {
            CHECK_MSG(scaled, "%s: the cuda backend does not support this embedding type", what);
            printf("note: %s: not supported by the cuda backend, not compared\n", what);
            continue;
        }
        test_weight t;
        kvp_weight w[2];
        if (weight_make(&t, "token_embd.weight", sp, NV, ND, wf) == 0 && weight_prepare(be[CPU], &t, &w[CPU]) == 0) {
            if (weight_prepare(be[GPU], &t, &w[GPU]) == 0) {
                if (run_embed(be[CPU], &w[CPU], tok, NT, y[CPU]) == 0 &&
                    run_embed(be[GPU], &w[GPU], tok, NT, y[GPU]) == 0) {
                    gpu_diff d;
                    gpu_diff_f32(&d, y[GPU], y[CPU], NT * ND);
                    gpu_expect(what, &d, plain ? 0 : 1e-6);
                }
                be[GPU]->ops->release_weight(be[GPU], &w[GPU]);
            }
            be[CPU]->ops->release_weight(be[CPU], &w[CPU]);
        }
        weight_free(&t);
    }
}

static void test_rmsnorm(void)
{
    static const uint32_t ns[] = {576, 4096, 100};
    static const uint32_t nts[] = {1, 5};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
        for (size_t j = 0; j < 2; j++)
            for (int inplace = 0; inplace < 2; inplace++) {
                uint32_t n = ns[i], nt = nts[j];
                float *x = malloc(sizeof(float) * nt * n), *g = malloc(sizeof(float) * n);
                float *y[2] = {malloc(sizeof(float) * nt * n), malloc(sizeof(float) * nt * n)};
                test_weight t;
                kvp_weight w[2];
                int ok = x && g && y[0] && y[1];
                for (uint32_t k = 0; ok && k < nt * n; k++)
                    x[k] = frand() * (1 + k / n); /* rows of different scales */
                for (uint32_t k = 0; ok && k < n; k++)
                    g[k] = 1 + frand() / 2;
                if (ok && weight_f32(&t, "blk.0.attn_norm.weight", g, n) == 0) {
                    int rc = 0;
                    for (int k = 0; k < 2 && rc == 0; k++) {
                        if ((rc = weight_prepare(be[k], &t, &w[k])) < 0)
                            break;
                        rc = run_rmsnorm(be[k], x, &w[k], nt, n, inplace, y[k]);
                        be[k]->ops->release_weight(be[k], &w[k]);
                    }
                    if (rc == 0) {
                        gpu_diff d;
                        char what[96];
                        gpu_diff_f32(&d, y[GPU], y[CPU], (size_t)nt * n);
                        snprintf(what, sizeof what, "rmsnorm n %u n_tok %u%s", n, nt, inplace ? " in place" : "");
                        gpu_expect(what, &d, 1e-5);
                    }
                }
                weight_free(&t);
                free(x), free(g), free(y[0]), free(y[1]);
            }
}

static void test_rope(void)
{
    static const struct {
        uint32_t hd, rot;
        int kind;
    } cs[] = {{64, 64, KVP_ROPE_KIND_NORM}, {64, 64, KVP_ROPE_KIND_NEOX}, {128, 64, KVP_ROPE_KIND_NEOX},
              {128, 96, KVP_ROPE_KIND_NORM}, {80, 32, KVP_ROPE_KIND_NORM}};
    enum { NT = 5, NH = 3 };
    const int32_t pos[NT] = {0, 1, 777, 4999, 131000};
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        uint32_t hd = cs[c].hd, rot = cs[c].rot;
        size_t n = (size_t)NT * NH * hd;
        float *x0 = malloc(sizeof(float) * n), *x[2] = {malloc(sizeof(float) * n), malloc(sizeof(float) * n)};
        float inv[64];
        test_weight t;
        kvp_weight w[2];
        if (!x0 || !x[0] || !x[1]) {
            CHECK(0);
            free(x0), free(x[0]), free(x[1]);
            return;
        }
        for (size_t i = 0; i < n; i++)
            x0[i] = x[0][i] = x[1][i] = frand();
        for (uint32_t i = 0; i < rot / 2; i++)
            inv[i] = (float)pow(500000.0, -2.0 * i / rot);
        int rc = weight_f32(&t, "rope_freqs.weight", inv, rot / 2);
        for (int k = 0; k < 2 && rc == 0; k++) {
            if ((rc = weight_prepare(be[k], &t, &w[k])) < 0)
                break;
            rc = run_rope(be[k], x[k], NT, NH, hd, rot, pos, &w[k], cs[c].kind);
            be[k]->ops->release_weight(be[k], &w[k]);
        }
        if (rc == 0) {
            gpu_diff d;
            char what[96];
            size_t moved = 0;
            gpu_diff_f32(&d, x[GPU], x[CPU], n);
            snprintf(what, sizeof what, "rope %s head_dim %u rot_dim %u", cs[c].kind ? "neox" : "norm", hd, rot);
            gpu_expect(what, &d, 1e-4);
            for (size_t i = 0; i < n; i++)
                moved += i % hd >= rot && memcmp(&x[GPU][i], &x0[i], sizeof(float)) != 0;
            CHECK_MSG(moved == 0, "%s: %zu elements past rot_dim changed", what, moved);
        }
        weight_free(&t);
        free(x0), free(x[0]), free(x[1]);
    }
}

static void test_elementwise(void)
{
    enum { NT = 7, N = 1001 }; /* 7007 elements: no multiple of a vector width */
    static float x0[NT * N], y0[NT * N], x[2][NT * N], bias[N];
    static const char *names[] = {"add_bias", "add", "silu_mul"};
    for (int i = 0; i < NT * N; i++)
        x0[i] = 8 * frand(), y0[i] = 3 * frand();
    for (int i = 0; i < N; i++)
        bias[i] = frand();
    test_weight t;
    if (weight_f32(&t, "blk.0.attn_q.bias", bias, N) < 0) {
        weight_free(&t);
        return;
    }
    for (int which = 0; which < 3; which++) {
        kvp_weight w[2];
        int rc = 0;
        for (int k = 0; k < 2 && rc == 0; k++) {
            memcpy(x[k], x0, sizeof x0);
            if ((rc = weight_prepare(be[k], &t, &w[k])) < 0)
                break;
            rc = run_elementwise(be[k], which, x[k], y0, &w[k], NT, N);
            be[k]->ops->release_weight(be[k], &w[k]);
        }
        if (rc == 0) {
            gpu_diff d;
            gpu_diff_f32(&d, x[GPU], x[CPU], NT * N);
            gpu_expect(names[which], &d, which == 2 ? 1e-5 : 0);
        }
    }
    weight_free(&t);
}

static void test_gather(void)
{
    enum { NS = 9, N = 333, NR = 6 };
    static float src[NS * N], dst[2][NR * N];
    const uint32_t rows[NR] = {8, 0, 3, 3, 7, 1};
    for (int i = 0; i < NS * N; i++)
        src[i] = frand();
    if (run_gather(be[CPU], src, NS, rows, NR, N, dst[CPU]) == 0 && run_gather(be[GPU], src, NS, rows, NR, N, dst[GPU]) == 0) {
        gpu_diff d;
        gpu_diff_f32(&d, dst[GPU], dst[CPU], NR * N);
        gpu_expect("gather_rows", &d, 0);
    }
}

/* ---- argmax_rows: the ids of the CPU's rule, exactly ----
 *
 * Rows of 49,152 (SmolLM2's vocabulary) with ties, NaN and infinities.
 * The CUDA backend drops the op with KVP_CUDA_ARGMAX=0 (the engine then
 * picks on the host). */
static int run_argmax(kvp_backend *b, const float *x, uint32_t n_rows, uint32_t n, uint32_t *ids)
{
    kvp_err err = {0};
    kvp_backend_reserve r = {.max_tok = n_rows};
    float *dx = gpu_put(b, x, sizeof(float) * n_rows * n);
    int rc = dx && gpu_op(b, "reserve", b->ops->reserve(b, &r, &err), &err) == 0
                 ? gpu_op(b, "argmax_rows", b->ops->argmax_rows(b, dx, n_rows, n, ids, &err), &err)
                 : -1;
    gpu_free(b, dx);
    return rc;
}

static void test_argmax(void)
{
    if (!be[GPU]->ops->argmax_rows) {
        printf("argmax_rows: not in the %s backend's table (KVP_CUDA_ARGMAX=0?)\n", be[GPU]->ops->name);
        return;
    }
    enum { R = 9, N = 49152 };
    float *x = malloc(sizeof(float) * R * N);
    uint32_t ids[2][R];
    if (!x) {
        CHECK(0);
        return;
    }
    for (size_t i = 0; i < (size_t)R * N; i++) {
        float f = frand();
        x[i] = f > 0.99f ? NAN : f < -0.995f ? -INFINITY : (float)(int)(f * 60);
    }
    x[2 * N + 40000] = INFINITY, x[2 * N + 100] = INFINITY; /* the lower of two infinities */
    for (uint32_t i = 0; i < N; i++)
        x[5 * N + i] = NAN; /* none counts: 0 */
    if (run_argmax(be[CPU], x, R, N, ids[CPU]) == 0 && run_argmax(be[GPU], x, R, N, ids[GPU]) == 0) {
        int bad = 0;
        for (int r = 0; r < R; r++)
            bad += ids[GPU][r] != ids[CPU][r];
        CHECK_MSG(bad == 0 && ids[CPU][2] == 100 && ids[CPU][5] == 0, "argmax_rows: %d of %d rows differ", bad, R);
        if (bad == 0)
            printf("ok argmax_rows: %d rows of %d equal\n", R, N);
    }
    free(x);
}

/* ---- memory: alloc zeroed and aligned, from_host/to_host round trips ---- */

static void test_memory(void)
{
    enum { N = (1 << 20) + 3 };
    kvp_backend *g = be[GPU];
    kvp_err err = {0};
    uint8_t *h = malloc(N), *back = malloc(N);
    uint8_t *d = g->ops->alloc(g, N);
    CHECK_MSG(d != NULL, "alloc of %d bytes", N);
    if (!h || !back || !d)
        goto out;
    CHECK_MSG((uintptr_t)d % 64 == 0, "alloc: %p is not 64-byte aligned", (void *)d);
    memset(back, 0xa5, N);
    if (gpu_get(g, back, d, N, "alloc") == 0) {
        size_t nz = 0;
        for (size_t i = 0; i < N; i++)
            nz += back[i] != 0;
        CHECK_MSG(nz == 0, "alloc: %zu of %d bytes not zeroed", nz, N);
    }
    for (size_t i = 0; i < N; i++)
        h[i] = (uint8_t)(frand() * 128 + 128);
    CHECK(gpu_op(g, "from_host", g->ops->from_host(g, d, h, N, &err), &err) == 0);
    /* a short copy at an odd offset, then the whole buffer back */
    for (size_t i = 1001; i < 1001 + 333; i++)
        h[i] ^= 0x5a;
    CHECK(gpu_op(g, "from_host", g->ops->from_host(g, d + 1001, h + 1001, 333, &err), &err) == 0);
    if (gpu_get(g, back, d, N, "round trip") == 0)
        CHECK_MSG(memcmp(back, h, N) == 0, "from_host/to_host: the bytes came back different");
    if (gpu_get(g, back, d + 7, 5, "odd read") == 0)
        CHECK_MSG(memcmp(back, h + 7, 5) == 0, "to_host at an odd offset: different bytes");
    CHECK(gpu_op(g, "synchronize", g->ops->synchronize(g, &err), &err) == 0);
out:
    if (d)
        g->ops->release(g, d);
    free(h), free(back);
}

/* Last: an embedding id past the table is KVP_EINVAL, from embed or from
 * the synchronize after it (a GPU finds out asynchronously). */
static void test_embed_range(void)
{
    enum { NV = 50, ND = 64 };
    static float wf[NV * ND];
    const kvp_quant_spec f16 = {KVP_DTYPE_F16, KVP_SCHEME_NONE, 0, 0, 0};
    const int32_t tok[3] = {1, NV, 2};
    kvp_backend *g = be[GPU];
    test_weight t;
    kvp_weight w;
    kvp_err err = {0};
    fill_weights(wf, NV, ND);
    if (weight_make(&t, "token_embd.weight", &f16, NV, ND, wf) == 0 && weight_prepare(g, &t, &w) == 0) {
        int32_t *dt = gpu_put(g, tok, sizeof tok);
        float *dy = gpu_nan(g, 3 * ND);
        if (dt && dy) {
            int rc = g->ops->embed(g, &w, dt, 3, dy, &err);
            int rs = g->ops->synchronize(g, &err);
            CHECK_MSG(rc == KVP_EINVAL || (rc == 0 && rs == KVP_EINVAL),
                      "embed of id %d in a table of %d: embed %d, synchronize %d (want %d): %s", NV, NV, rc, rs,
                      KVP_EINVAL, err.msg);
        }
        gpu_free(g, dt), gpu_free(g, dy);
        g->ops->release_weight(g, &w);
    }
    weight_free(&t);
}

int main(void)
{
    int open = gpu_open("test_gpu_ops", &be[CPU], &be[GPU]);
    if (open <= 0)
        return unit_done();
    kvp_err err = {0};
    kvp_backend_reserve r = {.max_tok = 128, .max_ctx = 8192, .max_n_in = 4096, .n_head = 8, .kv = NULL};
    for (int k = 0; k < 2; k++)
        CHECK(gpu_op(be[k], "reserve", be[k]->ops->reserve(be[k], &r, &err), &err) == 0);
    test_memory();
    test_matmul();
    test_refuse();
    test_embed();
    test_rmsnorm();
    test_rope();
    test_elementwise();
    test_gather();
    test_argmax();
    CHECK(gpu_op(be[GPU], "synchronize", be[GPU]->ops->synchronize(be[GPU], &err), &err) == 0);
    test_embed_range();
    kvp_backend_free(be[GPU]);
    kvp_backend_free(be[CPU]);
    return unit_done();
}
