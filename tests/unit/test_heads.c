/* test_heads.c - Medusa heads (heads.h): the residual block, the heads
 * file and its refusals, and training (headstrain.h) on a task with a
 * known answer.
 *
 *   test_heads --write-seeds DIR   writes the fuzz corpus of fuzz_heads */
#include "unit.h"
#include "backend_cpu.h"
#include "heads.h"
#include "headstrain.h"
#include "io.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[256] = "/tmp/kvp-test-heads.XXXXXX";

static const char *tmp_path(const char *name)
{
    static char buf[4][320];
    static int i;
    i = (i + 1) % 4;
    snprintf(buf[i], sizeof buf[i], "%s/%s", tmpdir, name);
    return buf[i];
}

static const uint8_t FP[KVP_FINGERPRINT_SIZE] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

static void random_heads(kvp_heads *h, uint32_t K, uint32_t d, uint64_t seed)
{
    kvp_err err;
    CHECK(kvp_heads_init(h, K, d, FP, &err) == 0);
    for (size_t i = 0; i < (size_t)K * d * d; i++)
        h->w1[i] = unit_frand(&seed) * 0.3f;
    for (size_t i = 0; i < (size_t)K * d; i++)
        h->b1[i] = unit_frand(&seed) * 0.1f;
}

/* z = x + SiLU(W1 x + b1), head by head, against a plain double sum. */
static void test_apply(void)
{
    kvp_heads h;
    random_heads(&h, 3, 7, 11);
    float x[7], z[7], a[7];
    uint64_t s = 5;
    for (int i = 0; i < 7; i++)
        x[i] = unit_frand(&s);
    for (uint32_t k = 0; k < 3; k++) {
        kvp_heads_apply(&h, k, x, z, a);
        for (int o = 0; o < 7; o++) {
            double acc = h.b1[k * 7 + o];
            for (int i = 0; i < 7; i++)
                acc += (double)h.w1[(k * 7 + o) * 7 + i] * x[i];
            double want = x[o] + acc / (1 + exp(-acc));
            CHECK_NEAR(a[o], acc, 1e-5);
            CHECK_NEAR(z[o], want, 1e-5);
        }
    }
    kvp_heads_free(&h);
    /* zeroed heads repeat their input: an untrained head guesses the model's next token */
    kvp_err err;
    CHECK(kvp_heads_init(&h, 1, 7, FP, &err) == 0);
    kvp_heads_apply(&h, 0, x, z, NULL);
    CHECK(memcmp(x, z, sizeof x) == 0);
    kvp_heads_free(&h);
}

static void test_round_trip(void)
{
    kvp_heads h, back;
    kvp_err err;
    random_heads(&h, 2, 5, 3);
    CHECK(kvp_meta_set_f64(&h.info, "medusa.train.lr", 0.001) == 0);
    const char *p = tmp_path("rt.kvp");
    CHECK(kvp_heads_write(&h, p, "test", &err) == 0);
    CHECK_MSG(kvp_heads_read(&back, p, &err) == 0, "%s", err.msg);
    CHECK_EQ_U64(back.n_heads, 2);
    CHECK_EQ_U64(back.n_embd, 5);
    CHECK(back.w1 && memcmp(back.w1, h.w1, 2 * 25 * sizeof(float)) == 0);
    CHECK(back.b1 && memcmp(back.b1, h.b1, 2 * 5 * sizeof(float)) == 0);
    double lr = 0;
    CHECK(kvp_meta_get_f64(&back.info, "medusa.train.lr", &lr) == 0 && lr == 0.001);
    CHECK(kvp_heads_check_model(&back, p, FP, 5, &err) == 0);
    uint8_t other[KVP_FINGERPRINT_SIZE] = {0};
    CHECK_EQ_I64(kvp_heads_check_model(&back, p, other, 5, &err), KVP_EMISMATCH);
    CHECK(strstr(err.msg, "rt.kvp") && strstr(err.msg, "0102030405") && strstr(err.msg, "--train-heads"));
    CHECK_EQ_I64(kvp_heads_check_model(&back, p, FP, 6, &err), KVP_EMISMATCH);
    kvp_heads_free(&back);
    /* a failed write leaves nothing behind */
    CHECK(kvp_heads_write(&h, tmp_path("no-such-dir/x.kvp"), "test", &err) < 0);
    kvp_heads_free(&h);
}

static uint8_t *slurp(const char *p, size_t *n)
{
    uint8_t *d;
    kvp_err err;
    return kvp_read_file(p, 1 << 24, &d, n, &err) == 0 ? d : NULL;
}

static void spit(const char *p, const void *d, size_t n)
{
    FILE *f = fopen(p, "wb");
    CHECK(f && fwrite(d, 1, n, f) == n);
    if (f)
        CHECK(fclose(f) == 0);
}

/* A file that reads back as heads fails with code and a message naming
 * the file and holding `what`. */
static void expect_refused(const char *name, int code, const char *what)
{
    kvp_heads h;
    kvp_err err = {0};
    int rc = kvp_heads_read(&h, tmp_path(name), &err);
    CHECK_MSG(rc == code, "%s: %d (%s), expected %d", name, rc, err.msg, code);
    CHECK_MSG(strstr(err.msg, name) && strstr(err.msg, what), "%s: '%s' lacks '%s'", name, err.msg, what);
    CHECK(h.w1 == NULL && h.b1 == NULL && h.n_heads == 0);
}

/* Heads written with a hook that spoils them: the refusals. */
static void write_spoiled(const char *name, uint32_t K, uint32_t d, float poison, const char *arch)
{
    kvp_heads h;
    random_heads(&h, K, d, 9);
    if (poison != 0)
        h.w1[d + 1] = poison;
    if (arch)
        CHECK(kvp_meta_set_str(&h.info, "medusa.arch", arch, strlen(arch)) == 0);
    kvp_err err;
    CHECK(kvp_heads_write(&h, tmp_path(name), "test", &err) == 0);
    kvp_heads_free(&h);
}

static void test_refusals(void)
{
    write_spoiled("nan.kvp", 2, 4, NAN, NULL);
    expect_refused("nan.kvp", KVP_EFORMAT, "not finite");
    write_spoiled("good.kvp", 2, 4, 0, NULL);
    size_t n;
    uint8_t *d = slurp(tmp_path("good.kvp"), &n);
    CHECK(d && n > 256);
    if (!d)
        return;
    spit(tmp_path("cut.kvp"), d, n - 64); /* END lost */
    expect_refused("cut.kvp", KVP_ETRUNC, "cut.kvp");
    spit(tmp_path("half.kvp"), d, n / 2);
    kvp_heads h;
    kvp_err err = {0};
    CHECK(kvp_heads_read(&h, tmp_path("half.kvp"), &err) < 0 && strstr(err.msg, "half.kvp"));
    d[n / 2] ^= 0x40; /* a flipped bit: a checksum */
    spit(tmp_path("flip.kvp"), d, n);
    CHECK(kvp_heads_read(&h, tmp_path("flip.kvp"), &err) < 0 && strstr(err.msg, "flip.kvp"));
    free(d);
    /* a model file is not a heads file */
    kvp_writer *w = NULL;
    kvp_out out;
    kvp_meta m;
    kvp_meta_init(&m);
    CHECK(kvp_meta_set_str(&m, "general.architecture", "llama", 5) == 0);
    CHECK(kvp_out_open(&out, tmp_path("model.kvp"), &err) == 0 && kvp_writer_open(&w, &out, NULL, &err) == 0 &&
          kvp_write_meta(w, KVP_KIND_CONFIG, &m, &err) == 0 && kvp_writer_finish(w, &err) == 0 &&
          kvp_out_commit(&out, &err) == 0);
    kvp_writer_free(w);
    kvp_meta_free(&m);
    expect_refused("model.kvp", KVP_EFORMAT, "not a heads file");
    write_spoiled("arch.kvp", 1, 4, 0, "medusa2");
    expect_refused("arch.kvp", KVP_EFORMAT, "medusa2");
    CHECK(kvp_heads_read(&h, tmp_path("absent.kvp"), &err) < 0 && strstr(err.msg, "absent.kvp"));
}

/* ---- training ---- */

#define TV 48  /* vocabulary */
#define TD 16  /* width */
#define TK 2   /* heads */
#define TN 600 /* samples */

/* A task the heads can learn: head k's label is the output head's argmax
 * of a true residual block's output, z = h + SiLU(A_k h) (a different A a
 * head, large enough that z is far from h), so the model's own argmax of
 * h is mostly another token. */
typedef struct task {
    float w[TV * TD];
    float hidden[TN * TD];
    uint32_t label[TN * TK];
} task;

static void make_task(task *t, uint64_t seed)
{
    for (int i = 0; i < TV * TD; i++)
        t->w[i] = unit_frand(&seed);
    float A[TK][TD][TD];
    for (int k = 0; k < TK; k++)
        for (int o = 0; o < TD; o++)
            for (int i = 0; i < TD; i++)
                A[k][o][i] = 1.5f * unit_frand(&seed);
    for (int n = 0; n < TN; n++) {
        float *h = t->hidden + n * TD;
        for (int i = 0; i < TD; i++)
            h[i] = unit_frand(&seed);
        for (int k = 0; k < TK; k++) {
            float z[TD], l[TV];
            for (int o = 0; o < TD; o++) {
                float a = 0;
                for (int i = 0; i < TD; i++)
                    a += A[k][o][i] * h[i];
                z[o] = h[o] + a / (1 + expf(-a));
            }
            for (int v = 0; v < TV; v++) {
                l[v] = 0;
                for (int i = 0; i < TD; i++)
                    l[v] += t->w[v * TD + i] * z[i];
            }
            /* the last head has no label for every fifth sample (the end of an answer) */
            t->label[n * TK + k] = k == TK - 1 && n % 5 == 4 ? KVP_HEADS_NO_LABEL : unit_argmax(l, TV);
        }
    }
}

static void test_training(void)
{
    static task t;
    make_task(&t, 77);
    kvp_backend *be = NULL;
    kvp_err err = {0};
    CHECK(kvp_backend_cpu_create(&be, unit_threads(2), 0, &err) == 0);
    kvp_heads_vocab v;
    CHECK_MSG(kvp_heads_vocab_from_f32(&v, be, t.w, TV, TD, &err) == 0, "%s", err.msg);
    kvp_heads h;
    CHECK(kvp_heads_init(&h, TK, TD, FP, &err) == 0);
    kvp_heads_set s = {.hidden = t.hidden, .label = t.label, .n = TN, .n_heads = TK};
    kvp_heads_eval e0, e1, e2;
    CHECK_MSG(kvp_heads_evaluate(&h, &v, &s, 64, &e0, &err) == 0, "%s", err.msg);
    CHECK_EQ_U64(e0.n[0], TN);
    CHECK_EQ_U64(e0.n[1], TN - TN / 5);
    /* the untrained loss is the cross-entropy of softmax(W h), by hand */
    double want = 0;
    for (int n = 0; n < TN; n++) {
        float l[TV];
        double mx = -1e30, sum = 0;
        for (int vv = 0; vv < TV; vv++) {
            l[vv] = 0;
            for (int i = 0; i < TD; i++)
                l[vv] += t.w[vv * TD + i] * t.hidden[n * TD + i];
            mx = l[vv] > mx ? l[vv] : mx;
        }
        for (int vv = 0; vv < TV; vv++)
            sum += exp(l[vv] - mx);
        want += mx + log(sum) - l[t.label[n * TK]];
    }
    CHECK_NEAR(e0.loss[0], want / TN, 1e-3);
    /* one small step down the gradient lowers the loss: a wrong sign raises it */
    kvp_heads_train_opts one = {.epochs = 1, .batch = TN, .lr = 1e-3, .seed = 1};
    CHECK(kvp_heads_train(&h, &v, &s, &one, &err) == 0);
    CHECK(kvp_heads_evaluate(&h, &v, &s, 64, &e1, &err) == 0);
    CHECK_MSG(e1.loss[0] < e0.loss[0] && e1.loss[1] < e0.loss[1], "%f %f -> %f %f", e0.loss[0], e0.loss[1],
              e1.loss[0], e1.loss[1]);
    /* then training learns the task */
    kvp_heads_train_opts o = {.epochs = 60, .batch = 32, .lr = 3e-2, .seed = 2};
    CHECK(kvp_heads_train(&h, &v, &s, &o, &err) == 0);
    CHECK(kvp_heads_evaluate(&h, &v, &s, 64, &e2, &err) == 0);
    CHECK_MSG(e0.acc[0] < 0.3 && e2.acc[0] > 0.8 && e2.acc[1] > 0.8, "accuracy %.3f %.3f -> %.3f %.3f", e0.acc[0],
              e0.acc[1], e2.acc[0], e2.acc[1]);
    /* a label outside the vocabulary is refused */
    t.label[7] = TV;
    CHECK_EQ_I64(kvp_heads_train(&h, &v, &s, &o, &err), KVP_EINVAL);
    kvp_heads_free(&h);
    kvp_heads_vocab_free(&v);
    kvp_backend_free(be);
}

/* The fuzz corpus: a good file and spoiled ones. */
static int write_seeds(const char *dir)
{
    if (snprintf(tmpdir, sizeof tmpdir, "%s", dir) >= (int)sizeof tmpdir)
        return 1;
    write_spoiled("good.kvp", 2, 8, 0, NULL);
    write_spoiled("one-head.kvp", 1, 4, 0, NULL);
    write_spoiled("bad-nan.kvp", 1, 4, NAN, NULL);
    write_spoiled("bad-arch.kvp", 1, 4, 0, "medusa2");
    size_t n;
    uint8_t *d = slurp(tmp_path("good.kvp"), &n);
    if (!d)
        return 1;
    spit(tmp_path("bad-cut.kvp"), d, n - 64);
    free(d);
    return unit_failed;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--write-seeds") == 0)
        return write_seeds(argv[2]);
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_apply();
    test_round_trip();
    test_refusals();
    test_training();
    char cmd[320];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        printf("could not remove %s\n", tmpdir);
    return unit_done();
}
