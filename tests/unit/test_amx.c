/* test_amx.c - the AMX table's prompt matmuls against the VNNI table's: the
 * same bits for every quantized kind (Q4_0, Q4_1, Q8_0, i8 and i4, with and
 * without zero points; AMX tiles) and float kind (f32, f16, bf16; 512-bit
 * runs), every token count around a tile's 16, rows that are not whole
 * tiles, float rows with a tail, one thread and two; and each token's
 * outputs in a prompt-sized step the bits it gets alone (a decode step), so
 * the table keeps the batch invariance backend_cpu_kern.h promises; every
 * quantized kind (multiplied in rows of 16) also against the kind as
 * stored, AMX and VNNI.  Skipped, with a line,
 * where the CPU has no AMX-INT8 or the kernel does not grant it. */
#include "backend_cpu.h"
#include "backend_cpu_kern.h"
#include "minifloat.h"
#include "tensor.h"
#include "unit.h"
#include "wire.h"

#include <math.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) { return unit_frand(&rng_state); }

enum { N_IN = 2240, N_IN_F = 2237, N_OUT = 100, MAX_TOK = 70 };
/* float rows: N_IN_F (chunks of 512 and a tail), then 603 (one widened
 * chunk for the whole row in the f16 and bf16 group runs, and a tail) */
static uint32_t n_in_f = N_IN_F;
/* float weights' rows: N_OUT (pieces of 24 and one of 4: runs of 6 and of
 * 4 in the f16 and bf16 group runs), then 95 and 98 (a last piece of 23,
 * 6-row runs, one of 4 and a row past them; of 2, rows past the runs) */
static uint32_t n_out_f = N_OUT;
/* quantized rows: N_IN (70 blocks), then for the block kinds 69, 3 and 1
 * (an odd count: the rows of 16's pipeline ends on either tile set) */
static uint32_t n_in_q = N_IN;

/* A weight of kind dt: random quants, small finite scales; the scaled
 * kinds with scales (and zero points when zp) of group 64. */
typedef struct test_w {
    kvp_weight w;
    uint8_t *data;
    float *sc, *zp;
} test_w;

static void make_weight(test_w *t, int dt, int zp)
{
    memset(t, 0, sizeof *t);
    kvp_weight *w = &t->w;
    int fl = dt == KVP_DTYPE_F32 || dt == KVP_DTYPE_F16 || dt == KVP_DTYPE_BF16;
    w->name = kvp_dtype_name((uint32_t)dt), w->dtype = dt;
    w->n_in = fl ? n_in_f : n_in_q, w->n_out = fl ? n_out_f : N_OUT;
    w->row_bytes = kvp_dtype_row_bytes((uint32_t)dt, w->n_in);
    t->data = malloc(w->row_bytes * w->n_out);
    for (size_t i = 0; i < w->row_bytes * w->n_out; i++)
        t->data[i] = (uint8_t)(frand() * 128.0f + 128.0f);
    for (size_t i = 0; fl && i < (size_t)w->n_in * w->n_out; i++) {
        float v = frand();
        if (dt == KVP_DTYPE_F32)
            memcpy(t->data + 4 * i, &v, 4);
        else
            kvp_put16(t->data + 2 * i, dt == KVP_DTYPE_F16 ? kvp_f32_to_f16(v) : kvp_f32_to_bf16(v));
    }
    size_t bb = dt == KVP_DTYPE_Q4_0 ? 18 : dt == KVP_DTYPE_Q4_1 ? 20 : dt == KVP_DTYPE_Q8_0 ? 34 : 0;
    for (size_t o = 0; bb && o < w->row_bytes * N_OUT; o += bb)
        for (size_t k = 0; k < (dt == KVP_DTYPE_Q4_1 ? 2u : 1u); k++)
            kvp_put16(t->data + o + 2 * k, kvp_f32_to_f16(0.002f * (frand() + 1.5f) * (k ? -1.0f : 1.0f)));
    if (dt == KVP_DTYPE_I8 || dt == KVP_DTYPE_I4) {
        uint32_t g = 64, per = N_IN / g;
        t->sc = malloc(sizeof(float) * per * N_OUT);
        for (uint32_t i = 0; i < per * N_OUT; i++)
            t->sc[i] = 0.01f + 0.05f * fabsf(frand());
        if (zp) {
            t->zp = malloc(sizeof(float) * per * N_OUT);
            for (uint32_t i = 0; i < per * N_OUT; i++)
                t->zp[i] = (float)((int)(frand() * 4.0f));
        }
        w->scales = t->sc, w->zeros = t->zp, w->group = g, w->scale_stride = per;
    }
    w->data = t->data;
}

static void free_weight(test_w *t)
{
    free(t->data), free(t->sc), free(t->zp);
}

/* y = x . w^T for the first nt tokens on a backend of flags and threads. */
static int run(unsigned flags, int threads, kvp_weight *w, const float *x, uint32_t nt, float *y, const char **isa)
{
    kvp_backend *be = NULL;
    kvp_err err = {0};
    kvp_backend_reserve r = {.max_tok = MAX_TOK, .max_n_in = N_IN};
    int rc = kvp_backend_cpu_create(&be, threads, flags, &err);
    if (rc == 0)
        rc = be->ops->prepare_weight(be, w, &err);
    if (rc == 0)
        rc = be->ops->reserve(be, &r, &err);
    if (rc == 0)
        rc = be->ops->matmul(be, w, x, y, nt, &err);
    if (rc < 0)
        printf("%s: %s\n", w->name, err.msg);
    if (isa && be)
        *isa = kvp_backend_cpu_isa(be);
    if (be) {
        be->ops->release_weight(be, w);
        be->ops->destroy(be);
    }
    return rc;
}

static void test_kind(int dt, int zp, const float *x)
{
    static float ya[MAX_TOK * N_OUT], yv[MAX_TOK * N_OUT], y1[N_OUT];
    const uint32_t counts[] = {3, 5, 6, 8, 15, 16, 17, 31, 32, 33, 40, 64, 70};
    test_w t;
    make_weight(&t, dt, zp);
    const size_t no = t.w.n_out; /* N_OUT at most */
    const char *what = zp ? "with zero points" : "";
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
        uint32_t nt = counts[ci];
        for (int th = 1; th <= 2; th++) {
            const char *isa = NULL;
            if (run(0, th, &t.w, x, nt, ya, &isa) < 0 || run(KVP_CPU_NO_AMX, th, &t.w, x, nt, yv, NULL) < 0) {
                CHECK(0);
                continue;
            }
            CHECK_MSG(isa && strstr(isa, "amx"), "%s: the default backend is %s, not AMX", t.w.name, isa);
            size_t bad = 0, first = 0;
            for (size_t i = 0; i < (size_t)nt * no; i++) /* (floats: weights and x read at n_in 2237) */
                if (memcmp(&ya[i], &yv[i], sizeof(float)) != 0 && !bad++)
                    first = i;
            CHECK_MSG(bad == 0, "%s %s, %u tokens, %d threads: %zu outputs differ from VNNI's, first token %zu row %zu "
                      "(%.9g vs %.9g)", t.w.name, what, nt, th, bad, first / no, first % no,
                      (double)ya[first], (double)yv[first]);
            /* Q8_0, Q4_0 and Q4_1 are multiplied in rows of 16 on both:
             * the bits of the kind as stored, on VNNI and on AMX */
            int r16 = dt == KVP_DTYPE_Q8_0 || dt == KVP_DTYPE_Q4_0 || dt == KVP_DTYPE_Q4_1 || dt == KVP_DTYPE_I8 ||
                      dt == KVP_DTYPE_I4;
            for (unsigned fl = KVP_CPU_AS_STORED; r16 && fl <= (KVP_CPU_AS_STORED | KVP_CPU_NO_AMX);
                 fl += KVP_CPU_NO_AMX) {
                if (run(fl, th, &t.w, x, nt, yv, NULL) < 0) {
                    CHECK(0);
                    continue;
                }
                bad = 0;
                for (size_t i = 0; i < (size_t)nt * no; i++)
                    bad += memcmp(&ya[i], &yv[i], sizeof(float)) != 0;
                CHECK_MSG(bad == 0, "%s, %u tokens, %d threads: %zu outputs in rows of 16 differ from the kind as stored%s",
                          t.w.name, nt, th, bad, fl & KVP_CPU_NO_AMX ? " on VNNI" : "");
            }
        }
        /* each token as a decode step alone: the bits the prompt gave it */
        size_t bad = 0;
        for (uint32_t tok = 0; tok < nt; tok += 13) {
            if (run(0, 1, &t.w, x + (size_t)tok * t.w.n_in, 1, y1, NULL) < 0) {
                CHECK(0);
                break;
            }
            bad += memcmp(y1, ya + (size_t)tok * no, no * sizeof(float)) != 0;
        }
        CHECK_MSG(bad == 0, "%s %s, %u tokens: %zu tokens other bits alone than in the step", t.w.name, what, nt, bad);
    }
    free_weight(&t);
}

/* A test that could not fail would prove nothing: a weight whose last row
 * changes must change AMX's outputs for that row, and only it. */
static void test_sensitive(const float *x)
{
    static float a[32 * N_OUT], b[32 * N_OUT];
    test_w t;
    make_weight(&t, KVP_DTYPE_Q8_0, 0);
    CHECK(run(0, 1, &t.w, x, 32, a, NULL) == 0);
    t.data[(N_OUT - 1) * t.w.row_bytes + 40] ^= 0x11; /* block 1's quants, last row */
    CHECK(run(0, 1, &t.w, x, 32, b, NULL) == 0);
    size_t diff_last = 0, diff_other = 0;
    for (size_t i = 0; i < 32 * N_OUT; i++)
        if (a[i] != b[i]) {
            if (i % N_OUT == N_OUT - 1)
                diff_last++;
            else
                diff_other++;
        }
    CHECK_MSG(diff_last > 0 && diff_other == 0, "changed last row: %zu of its outputs, %zu others", diff_last,
              diff_other);
    free_weight(&t);
}

int main(void)
{
    if (!kvp_cpu_kernels_amx()) {
        printf("note: no AMX-INT8 here (or the kernel refuses its tile state); AMX kernels not checked\n");
        CHECK(kvp_cpu_kernels_amx() == NULL);
        return unit_done();
    }
    float *x = malloc(sizeof(float) * MAX_TOK * N_IN);
    for (size_t i = 0; i < (size_t)MAX_TOK * N_IN; i++)
        x[i] = frand() * (float)(1 + i % 3);
    const int kinds[] = {KVP_DTYPE_Q4_0, KVP_DTYPE_Q4_1, KVP_DTYPE_Q8_0, KVP_DTYPE_I8,
                         KVP_DTYPE_I4,   KVP_DTYPE_F32,  KVP_DTYPE_F16,  KVP_DTYPE_BF16};
    for (int k = 0; k < 8; k++) {
        test_kind(kinds[k], 0, x);
        if (kinds[k] == KVP_DTYPE_I8 || kinds[k] == KVP_DTYPE_I4)
            test_kind(kinds[k], 1, x);
    }
    const uint32_t odd[] = {69 * 32, 3 * 32, 32};
    for (int i = 0; i < 3; i++) {
        n_in_q = odd[i];
        test_kind(KVP_DTYPE_Q4_0, 0, x);
        test_kind(KVP_DTYPE_Q4_1, 0, x);
        test_kind(KVP_DTYPE_Q8_0, 0, x);
    }
    n_in_q = N_IN;
    n_in_f = 603;
    test_kind(KVP_DTYPE_F16, 0, x);
    test_kind(KVP_DTYPE_BF16, 0, x);
    n_in_f = N_IN_F;
    for (n_out_f = 95; n_out_f <= 98; n_out_f += 3) {
        test_kind(KVP_DTYPE_F16, 0, x);
        test_kind(KVP_DTYPE_BF16, 0, x);
    }
    n_out_f = N_OUT;
    test_sensitive(x);
    free(x);
    return unit_done();
}
