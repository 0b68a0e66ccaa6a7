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
 *   add, add_bias, gather_rows, kv_copy_block, f32/f16/bf16 kv_store: exact
 *   kv_store fp8/i8: scales equal, codes within one step, under 1% of rows
 *   attention  per sequence, over that sequence's largest |out|: f32 pool
 *              1e-4, other pools 2e-3 (both read the same stored K/V)
 *
 * Skips with one line when this build or machine has no CUDA backend. */
#include "gpu_util.h"
#include "kvscale.h"
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
    static const uint32_t shapes[][2] = {{77, 512}, {192, 2048}}; /* n_out x n_in: an odd row count, a wide one */
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

/* ---- the KV pool: kv_store, attention, kv_copy_block ---- */

static size_t kv_elt_bytes(int dtype) { return dtype == KVP_DTYPE_F32 ? 4 : dtype == KVP_DTYPE_F16 || dtype == KVP_DTYPE_BF16 ? 2 : 1; }

/* A pool description as kvcache.c makes one (backend.h's layout). */
static kvp_kv_pool pool_desc(int dtype, uint32_t n_blocks, uint32_t bs, uint32_t n_layer, uint32_t n_kv, uint32_t hd)
{
    kvp_kv_pool p = {.dtype = dtype, .n_blocks = n_blocks, .block_size = bs, .n_layer = n_layer, .n_head_kv = n_kv,
                     .head_dim = hd};
    uint64_t rows = (uint64_t)n_layer * 2 * n_kv * bs;
    p.block_bytes = rows * hd * kv_elt_bytes(dtype);
    if (kvp_kvscale_dtype(dtype)) {
        p.scales_off = p.block_bytes;
        p.block_bytes += rows * 4;
    }
    return p;
}

/* got against ref, two images of pool p: f32/f16/bf16 the same bytes; a
 * scaled cache row by row, each row's scale the same (to 1e-6) and its
 * values within one step of that scale (fp8: an eighth of the value), with
 * under 1% of rows differing at all. */
static void expect_pool(const char *what, const kvp_kv_pool *p, const uint8_t *got, const uint8_t *ref)
{
    size_t total = (size_t)p->n_blocks * p->block_bytes;
    if (!kvp_kvscale_dtype(p->dtype)) {
        size_t diff = 0, first = 0;
        for (size_t i = 0; i < total; i++)
            if (got[i] != ref[i] && !diff++)
                first = i;
        CHECK_MSG(diff == 0, "%s: %zu of %zu bytes differ, first at %zu", what, diff, total, first);
        if (!diff)
            printf("ok %s: the same %zu bytes\n", what, total);
        return;
    }
    uint32_t hd = p->head_dim;
    uint64_t rows = (uint64_t)p->n_layer * 2 * p->n_head_kv * p->block_size;
    size_t n_rows = 0, n_diff = 0, n_far = 0;
    float a[1024], b[1024];
    for (uint32_t blk = 0; blk < p->n_blocks && hd <= 1024; blk++) {
        const uint8_t *g0 = got + (size_t)blk * p->block_bytes, *r0 = ref + (size_t)blk * p->block_bytes;
        for (uint64_t r = 0; r < rows; r++, n_rows++) {
            const uint8_t *gq = g0 + r * hd, *rq = r0 + r * hd;
            float gs, rs;
            memcpy(&gs, g0 + p->scales_off + r * 4, 4);
            memcpy(&rs, r0 + p->scales_off + r * 4, 4);
            if (memcmp(gq, rq, hd) == 0 && memcmp(&gs, &rs, 4) == 0)
                continue;
            n_diff++;
            if (!(fabsf(gs - rs) <= 1e-6f * fabsf(rs))) {
                n_far++;
                continue;
            }
            kvp_kvscale_decode(p->dtype, gq, gs, a, hd);
            kvp_kvscale_decode(p->dtype, rq, rs, b, hd);
            for (uint32_t i = 0; i < hd; i++) {
                float step = p->dtype == KVP_DTYPE_I8 ? rs * 1.0001f : fmaxf(fabsf(a[i]), fabsf(b[i])) / 8 + rs / 256;
                if (!(fabsf(a[i] - b[i]) <= step)) {
                    n_far++;
                    break;
                }
            }
        }
    }
    CHECK_MSG(n_far == 0 && n_diff * 100 <= n_rows,
              "%s: %zu of %zu rows differ, %zu of them by more than one step or in their scale", what, n_diff, n_rows,
              n_far);
    if (n_far == 0 && n_diff * 100 <= n_rows)
        printf("ok %s: %zu of %zu rows differ, each by one step at most\n", what, n_diff, n_rows);
}

/* kv_store of the given slots of one layer on b (k, v host [n][n_kv * hd]). */
static int run_kv_store(kvp_backend *b, const kvp_kv_pool *p, uint32_t layer, const float *k, const float *v,
                        const uint32_t *slots, uint32_t n)
{
    kvp_err err = {0};
    size_t row = (size_t)p->n_head_kv * p->head_dim;
    float *dk = gpu_put(b, k, sizeof(float) * n * row), *dv = gpu_put(b, v, sizeof(float) * n * row);
    uint32_t *ds = gpu_put(b, slots, sizeof(uint32_t) * n);
    int rc = dk && dv && ds ? gpu_op(b, "kv_store", b->ops->kv_store(b, p, layer, dk, dv, n, ds, &err), &err) : -1;
    gpu_free(b, dk), gpu_free(b, dv), gpu_free(b, ds);
    return rc;
}

/* One attention call's inputs (host). */
typedef struct att_in {
    uint32_t n_tok, n_head, n_seq, stride, max_ctx;
    const float *q;
    const int32_t *pos;
    const uint32_t *seq, *tables;
} att_in;

static int run_attention(kvp_backend *b, const kvp_kv_pool *p, const att_in *in, float *out)
{
    kvp_err err = {0};
    size_t n = (size_t)in->n_tok * in->n_head * p->head_dim;
    float *dq = gpu_put(b, in->q, sizeof(float) * n), *dout = gpu_nan(b, n);
    int32_t *dp = gpu_put(b, in->pos, sizeof(int32_t) * in->n_tok);
    uint32_t *ds = gpu_put(b, in->seq, sizeof(uint32_t) * in->n_tok);
    uint32_t *dt = gpu_put(b, in->tables, sizeof(uint32_t) * in->n_seq * in->stride);
    int rc = -1;
    if (dq && dout && dp && ds && dt) {
        kvp_attn_args a = {.q = dq, .out = dout, .n_tok = in->n_tok, .n_head = in->n_head, .layer = 1,
                           .scale = 1.0f / sqrtf((float)p->head_dim), .pos = dp, .tok_seq = ds, .tables = dt,
                           .n_seq = in->n_seq, .table_stride = in->stride, .host_pos = in->pos,
                           .host_tok_seq = in->seq, .max_ctx = in->max_ctx, .kv = p};
        rc = gpu_op(b, "attention", b->ops->attention(b, &a, &err), &err);
    }
    if (rc == 0)
        rc = gpu_get(b, out, dout, sizeof(float) * n, "attention");
    gpu_free(b, dq), gpu_free(b, dout), gpu_free(b, dp), gpu_free(b, ds), gpu_free(b, dt);
    return rc;
}

/* Each sequence's rows of out compared alone: a long context's output is
 * an average of many values, far smaller than a one-key sequence's. */
static void expect_attention(const char *what, const att_in *in, uint32_t hd, const float *got, const float *ref,
                             double tol)
{
    size_t row = (size_t)in->n_head * hd;
    for (uint32_t t0 = 0; t0 < in->n_tok;) {
        uint32_t t1 = t0;
        while (t1 < in->n_tok && in->seq[t1] == in->seq[t0])
            t1++;
        gpu_diff d;
        char w[192];
        gpu_diff_f32(&d, got + t0 * row, ref + t0 * row, (t1 - t0) * row);
        snprintf(w, sizeof w, "%s: sequence %u, %u token%s at %d..%d", what, in->seq[t0], t1 - t0, t1 - t0 > 1 ? "s" : "",
                 in->pos[t0], in->pos[t1 - 1]);
        gpu_expect(w, &d, tol);
        t0 = t1;
    }
}

/* One pool dtype and head shape: kv_store into poisoned pools, then the
 * same pool bytes on both sides for attention (mixed prompt chunk and
 * decode tokens, then decode only) and kv_copy_block. */
static void test_pool(int dtype, uint32_t hd, uint32_t n_kv, uint32_t rep)
{
    enum { BS = 16, NB = 400, NL = 2, CHUNK = 96 };
    kvp_kv_pool p[2];
    uint8_t *img[2] = {NULL, NULL};
    char what[128];
    const char *dn = kvp_dtype_name((uint32_t)dtype);
    uint32_t n_head = n_kv * rep, row = n_kv * hd;
    kvp_err err = {0};
    if (!be[GPU]->ops->supports(be[GPU], KVP_USE_KV, dtype, kvp_kvscale_dtype(dtype))) {
        CHECK_MSG(dtype != KVP_DTYPE_F16 && dtype != KVP_DTYPE_BF16, "the cuda backend does not support a %s KV pool", dn);
        printf("note: the cuda backend does not support a %s KV pool; not compared\n", dn);
        return;
    }
    for (int k = 0; k < 2; k++) {
        p[k] = pool_desc(dtype, NB, BS, NL, n_kv, hd);
        kvp_backend_reserve r = {.max_tok = 128, .max_ctx = 8192, .max_n_in = 4096, .n_head = n_head, .kv = &p[k]};
        if (gpu_op(be[k], "reserve", be[k]->ops->reserve(be[k], &r, &err), &err) < 0)
            return;
    }
    size_t bytes = (size_t)NB * p[0].block_bytes, nslot = (size_t)NB * BS;
    float *kv = malloc(sizeof(float) * 2 * CHUNK * row);
    uint32_t *slots = malloc(sizeof(uint32_t) * nslot);
    img[0] = malloc(bytes), img[1] = malloc(bytes);
    p[0].base = be[0]->ops->alloc(be[0], bytes);
    p[1].base = be[1]->ops->alloc(be[1], bytes);
    if (!kv || !slots || !img[0] || !img[1] || !p[0].base || !p[1].base) {
        CHECK_MSG(0, "%s pool of %zu bytes: out of memory", dn, bytes);
        goto out;
    }
    /* kv_store: 37 scattered slots of layer 1, 5 of layer 0, into pools
     * filled with 0xff (NaN in every float type) */
    memset(img[0], 0xff, bytes);
    for (size_t i = 0; i < nslot; i++)
        slots[i] = (uint32_t)i;
    for (size_t i = nslot - 1; i > 0; i--) { /* a random permutation of the slots */
        size_t j = (size_t)((frand() + 1) / 2 * (double)(i + 1)) % (i + 1);
        uint32_t s = slots[i];
        slots[i] = slots[j], slots[j] = s;
    }
    for (size_t i = 0; i < 2 * CHUNK * row; i++)
        kv[i] = frand() * (i % 5 == 0 ? 3 : 1);
    int rc = 0;
    for (int k = 0; k < 2 && rc == 0; k++) {
        rc = gpu_op(be[k], "from_host", be[k]->ops->from_host(be[k], p[k].base, img[0], bytes, &err), &err);
        if (rc == 0)
            rc = run_kv_store(be[k], &p[k], 1, kv, kv + CHUNK * row, slots, 37);
        if (rc == 0)
            rc = run_kv_store(be[k], &p[k], 0, kv + 37 * row, kv + (CHUNK + 37) * row, slots + 37, 5);
        if (rc == 0)
            rc = gpu_get(be[k], img[k], p[k].base, bytes, "kv pool");
    }
    snprintf(what, sizeof what, "kv_store %s head_dim %u kv heads %u", dn, hd, n_kv);
    if (rc == 0)
        expect_pool(what, &p[0], img[GPU], img[CPU]);
    /* every slot of both layers through the CPU, then those bytes on both */
    for (uint32_t l = 0; l < NL && rc == 0; l++)
        for (size_t s = 0; s < nslot && rc == 0; s += CHUNK) {
            uint32_t n = (uint32_t)(nslot - s < CHUNK ? nslot - s : CHUNK);
            for (size_t i = 0; i < 2 * CHUNK * row; i++)
                kv[i] = frand();
            rc = run_kv_store(be[CPU], &p[CPU], l, kv, kv + CHUNK * row, slots + s, n);
        }
    if (rc == 0 && gpu_get(be[CPU], img[CPU], p[CPU].base, bytes, "kv pool") == 0)
        rc = gpu_op(be[GPU], "from_host", be[GPU]->ops->from_host(be[GPU], p[GPU].base, img[CPU], bytes, &err), &err);
    else
        rc = -1;
    /* attention: s0 one token at 4999 (split-K), s1 a chunk 24..63, s2 one
     * token at 0, s3 one token at 700; block tables from the shuffled slots */
    enum { NSEQ = 4, STRIDE = 313 };
    static const int32_t first[NSEQ] = {4999, 24, 0, 700}, last[NSEQ] = {4999, 63, 0, 700};
    /* distinct blocks in a shuffled order; unused entries 0 (a block
     * like any other: the decode call below reads s1's position 64 there) */
    uint32_t tables[NSEQ * STRIDE], used = 0;
    uint32_t *perm = malloc(sizeof(uint32_t) * NB);
    if (!perm) {
        CHECK(0);
        goto out;
    }
    for (uint32_t i = 0; i < NB; i++)
        perm[i] = i;
    for (uint32_t i = NB - 1; i > 0; i--) {
        uint32_t j = (uint32_t)((frand() + 1) / 2 * (i + 1)) % (i + 1), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    used = 0;
    for (int s = 0; s < NSEQ; s++)
        for (uint32_t i = 0; i < STRIDE; i++)
            tables[s * STRIDE + i] = i <= (uint32_t)last[s] / BS ? perm[used++] : 0;
    free(perm);
    int32_t pos[64];
    uint32_t seq[64], n_tok = 0, max_ctx = 0;
    for (uint32_t s = 0; s < NSEQ; s++)
        for (int32_t q = first[s]; q <= last[s]; q++) {
            pos[n_tok] = q, seq[n_tok++] = s;
            max_ctx = (uint32_t)q + 1 > max_ctx ? (uint32_t)q + 1 : max_ctx;
        }
    size_t qn = (size_t)n_tok * n_head * hd;
    float *q = malloc(sizeof(float) * qn), *out[2] = {malloc(sizeof(float) * qn), malloc(sizeof(float) * qn)};
    if (!q || !out[0] || !out[1]) {
        CHECK(0);
        rc = -1;
    }
    for (size_t i = 0; rc == 0 && i < qn; i++)
        q[i] = 3 * frand(); /* a sharper softmax than uniform */
    double tol = dtype == KVP_DTYPE_F32 ? 1e-4 : 2e-3;
    att_in mixed = {.n_tok = n_tok, .n_head = n_head, .n_seq = NSEQ, .stride = STRIDE, .max_ctx = max_ctx, .q = q,
                    .pos = pos, .seq = seq, .tables = tables};
    snprintf(what, sizeof what, "attention %s head_dim %u heads %u/%u", dn, hd, n_head, n_kv);
    if (rc == 0 && run_attention(be[CPU], &p[CPU], &mixed, out[CPU]) == 0 &&
        run_attention(be[GPU], &p[GPU], &mixed, out[GPU]) == 0)
        expect_attention(what, &mixed, hd, out[GPU], out[CPU], tol);
    /* decode only: s0, s1's next token, s3: one token each */
    int32_t dpos[3] = {4999, 64, 700};
    uint32_t dseq[3] = {0, 1, 3};
    att_in dec = {.n_tok = 3, .n_head = n_head, .n_seq = NSEQ, .stride = STRIDE, .max_ctx = 5000, .q = q,
                  .pos = dpos, .seq = dseq, .tables = tables};
    snprintf(what, sizeof what, "decode attention %s head_dim %u heads %u/%u", dn, hd, n_head, n_kv);
    if (rc == 0 && run_attention(be[CPU], &p[CPU], &dec, out[CPU]) == 0 &&
        run_attention(be[GPU], &p[GPU], &dec, out[GPU]) == 0)
        expect_attention(what, &dec, hd, out[GPU], out[CPU], tol);
    /* kv_copy_block on the same bytes: exact */
    for (int k = 0; k < 2 && rc == 0; k++) {
        rc = gpu_op(be[k], "kv_copy_block", be[k]->ops->kv_copy_block(be[k], &p[k], 3, 200, &err), &err);
        if (rc == 0)
            rc = gpu_op(be[k], "kv_copy_block", be[k]->ops->kv_copy_block(be[k], &p[k], 399, 0, &err), &err);
        if (rc == 0)
            rc = gpu_get(be[k], img[k], p[k].base, bytes, "kv pool");
    }
    if (rc == 0) {
        size_t diff = 0;
        for (size_t i = 0; i < bytes; i++)
            diff += img[GPU][i] != img[CPU][i];
        CHECK_MSG(diff == 0, "kv_copy_block %s: %zu of %zu bytes differ", dn, diff, bytes);
        CHECK_MSG(memcmp(img[GPU] + 3 * p[0].block_bytes, img[GPU] + 200 * p[0].block_bytes, p[0].block_bytes) == 0,
                  "kv_copy_block %s: block 3 is not block 200's copy", dn);
        if (!diff)
            printf("ok kv_copy_block %s: the same %zu bytes\n", dn, bytes);
    }
    free(q), free(out[0]), free(out[1]);
out:
    for (int k = 0; k < 2; k++)
        gpu_free(be[k], p[k].base), free(img[k]);
    free(kv), free(slots);
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
    static const int kv_dtypes[] = {KVP_DTYPE_F32, KVP_DTYPE_F16, KVP_DTYPE_BF16, KVP_DTYPE_FP8_E4M3, KVP_DTYPE_I8};
    for (size_t i = 0; i < sizeof kv_dtypes / sizeof kv_dtypes[0]; i++) {
        test_pool(kv_dtypes[i], 128, 2, 4); /* Llama-3's head shape, GQA 4 */
        test_pool(kv_dtypes[i], 64, 3, 3);  /* SmolLM2's head_dim, GQA 3 */
    }
    CHECK(gpu_op(be[GPU], "synchronize", be[GPU]->ops->synchronize(be[GPU], &err), &err) == 0);
    test_embed_range();
    kvp_backend_free(be[GPU]);
    kvp_backend_free(be[CPU]);
    return unit_done();
}
