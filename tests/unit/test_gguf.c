/* test_gguf.c - the GGUF reader on small files built here byte by byte (all
 * metadata types, tensors of several types), on hostile variants of them
 * (truncation at every offset, every single-bit flip, absurd counts, sizes
 * and dims), and on the real SmolLM2 file when the cache holds it. */
#include "gguf.h"
#include "tensor.h"
#include "unit.h"

#include <stdlib.h>
#include <unistd.h>

/* ---- building GGUF bytes ---- */

enum { T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 };

static void put_str(kvp_buf *b, const char *s)
{
    kvp_buf_u64(b, strlen(s));
    kvp_buf_put(b, s, strlen(s));
}

static void put_key(kvp_buf *b, const char *k, uint32_t type)
{
    put_str(b, k);
    kvp_buf_u32(b, type);
}

/* Offsets inside the small file, for the tests that patch it. */
typedef struct layout {
    size_t n_tensors, n_kv;       /* header fields */
    size_t align_val;             /* u32 value of general.alignment */
    size_t key0_len;              /* first key's u64 length */
    size_t strarr_count;          /* u64 count of the token array */
    size_t tok0_len;              /* u64 length of its first string */
    size_t ti0_name_len, ti0_n_dims, ti0_ne0, ti0_ne1, ti0_type, ti0_off;
    size_t ti1_name, ti1_off;
    size_t data;                  /* data section start */
} layout;

#define N_KV 21
#define N_T 4

/* A v3 (or v2) file: N_KV metadata entries of every kind and N_T tensors:
 *   "w.f32"  F32  [4, 2]      32 bytes
 *   "w.q41"  Q4_1 [32, 2]     40 bytes
 *   "w.q80"  Q8_0 [64]        68 bytes
 *   "w.iq2"  IQ2_XXS [256]    66 bytes (listed with dtype -1) */
static void build(kvp_buf *b, uint32_t version, layout *L)
{
    kvp_buf_init(b);
    kvp_buf_put(b, "GGUF", 4);
    kvp_buf_u32(b, version);
    L->n_tensors = b->len;
    kvp_buf_u64(b, N_T);
    L->n_kv = b->len;
    kvp_buf_u64(b, N_KV);

    L->key0_len = b->len;
    put_key(b, "general.architecture", T_STR);
    put_str(b, "llama");
    put_key(b, "general.alignment", T_U32);
    L->align_val = b->len;
    kvp_buf_u32(b, 64);
    put_key(b, "k.u8", T_U8);
    kvp_buf_u8(b, 200);
    put_key(b, "k.i8", T_I8);
    kvp_buf_u8(b, 0xfe); /* -2 */
    put_key(b, "k.u16", T_U16);
    kvp_buf_u16(b, 60000);
    put_key(b, "k.i16", T_I16);
    kvp_buf_u16(b, 0x8000); /* -32768 */
    put_key(b, "k.u32", T_U32);
    kvp_buf_u32(b, 4000000000u);
    put_key(b, "k.i32", T_I32);
    kvp_buf_u32(b, (uint32_t)-5);
    put_key(b, "k.f32", T_F32);
    kvp_buf_f32(b, 0.25f);
    put_key(b, "k.bool", T_BOOL);
    kvp_buf_u8(b, 1);
    put_key(b, "k.u64", T_U64);
    kvp_buf_u64(b, UINT64_MAX);
    put_key(b, "k.i64", T_I64);
    kvp_buf_u64(b, (uint64_t)INT64_MIN);
    put_key(b, "k.f64", T_F64);
    kvp_buf_f64(b, 1e-5);

    put_key(b, "tokens", T_ARR);
    kvp_buf_u32(b, T_STR);
    L->strarr_count = b->len;
    kvp_buf_u64(b, 3);
    L->tok0_len = b->len;
    put_str(b, "<s>");
    put_str(b, "");
    put_str(b, "hello");
    put_key(b, "a.i32", T_ARR);
    kvp_buf_u32(b, T_I32);
    kvp_buf_u64(b, 3);
    kvp_buf_u32(b, 1);
    kvp_buf_u32(b, (uint32_t)-2);
    kvp_buf_u32(b, 3);
    put_key(b, "a.u8", T_ARR);
    kvp_buf_u32(b, T_U8);
    kvp_buf_u64(b, 2);
    kvp_buf_u8(b, 7);
    kvp_buf_u8(b, 255);
    put_key(b, "a.u32big", T_ARR);
    kvp_buf_u32(b, T_U32);
    kvp_buf_u64(b, 2);
    kvp_buf_u32(b, 1);
    kvp_buf_u32(b, 0xffffffffu);
    put_key(b, "a.f32", T_ARR);
    kvp_buf_u32(b, T_F32);
    kvp_buf_u64(b, 2);
    kvp_buf_f32(b, -1.5f);
    kvp_buf_f32(b, 2.0f);
    put_key(b, "a.bool", T_ARR);
    kvp_buf_u32(b, T_BOOL);
    kvp_buf_u64(b, 2);
    kvp_buf_u8(b, 0);
    kvp_buf_u8(b, 1);
    put_key(b, "a.u64", T_ARR);
    kvp_buf_u32(b, T_U64);
    kvp_buf_u64(b, 1);
    kvp_buf_u64(b, 123456789012345ull);
    put_key(b, "a.f64", T_ARR);
    kvp_buf_u32(b, T_F64);
    kvp_buf_u64(b, 0);

    /* tensor infos; offsets relative to the data section, 64-aligned */
    L->ti0_name_len = b->len;
    put_str(b, "w.f32");
    L->ti0_n_dims = b->len;
    kvp_buf_u32(b, 2);
    L->ti0_ne0 = b->len;
    kvp_buf_u64(b, 4);
    L->ti0_ne1 = b->len;
    kvp_buf_u64(b, 2);
    L->ti0_type = b->len;
    kvp_buf_u32(b, 0);
    L->ti0_off = b->len;
    kvp_buf_u64(b, 0);
    L->ti1_name = b->len;
    put_str(b, "w.q41");
    kvp_buf_u32(b, 2);
    kvp_buf_u64(b, 32);
    kvp_buf_u64(b, 2);
    kvp_buf_u32(b, 3);
    L->ti1_off = b->len;
    kvp_buf_u64(b, 64);
    put_str(b, "w.q80");
    kvp_buf_u32(b, 1);
    kvp_buf_u64(b, 64);
    kvp_buf_u32(b, 8);
    kvp_buf_u64(b, 128);
    put_str(b, "w.iq2");
    kvp_buf_u32(b, 1);
    kvp_buf_u64(b, 256);
    kvp_buf_u32(b, 16);
    kvp_buf_u64(b, 256);

    kvp_buf_align(b, 64);
    L->data = b->len;
    for (int i = 0; i < 8; i++)
        kvp_buf_f32(b, (float)i);
    kvp_buf_zero(b, 32);
    for (int i = 0; i < 40; i++)
        kvp_buf_u8(b, (uint8_t)i);
    kvp_buf_zero(b, 24);
    kvp_buf_zero(b, 68);
    kvp_buf_zero(b, 60);
    kvp_buf_zero(b, 66); /* the file ends with the last tensor's bytes */
}

static void check_good(const kvp_gguf *g, uint32_t version, const layout *L)
{
    CHECK_EQ_U64(g->version, version);
    CHECK_EQ_U64(g->n_tensors, N_T);
    CHECK_EQ_U64(g->meta.n, N_KV);
    CHECK_EQ_U64(g->alignment, 64);
    CHECK_EQ_U64(g->data_offset, L->data);
    const kvp_meta *m = &g->meta;
    CHECK_STR(kvp_meta_get_str(m, "general.architecture"), "llama");
    uint64_t u = 0;
    int64_t i = 0;
    double f = 0;
    CHECK(kvp_meta_get_u64(m, "k.u8", &u) == 0 && u == 200);
    CHECK(kvp_meta_get_i64(m, "k.i8", &i) == 0 && i == -2);
    CHECK(kvp_meta_get_u64(m, "k.u16", &u) == 0 && u == 60000);
    CHECK(kvp_meta_get_i64(m, "k.i16", &i) == 0 && i == -32768);
    CHECK(kvp_meta_get_u64(m, "k.u32", &u) == 0 && u == 4000000000u);
    CHECK(kvp_meta_get_i64(m, "k.i32", &i) == 0 && i == -5);
    CHECK(kvp_meta_get_f64(m, "k.f32", &f) == 0 && f == 0.25);
    CHECK(kvp_meta_find(m, "k.bool")->type == KVP_META_BOOL && kvp_meta_find(m, "k.bool")->v.u == 1);
    CHECK(kvp_meta_get_u64(m, "k.u64", &u) == 0 && u == UINT64_MAX);
    CHECK(kvp_meta_get_i64(m, "k.i64", &i) == 0 && i == INT64_MIN);
    CHECK(kvp_meta_get_f64(m, "k.f64", &f) == 0 && f == 1e-5);
    const kvp_meta_entry *e = kvp_meta_find(m, "tokens");
    CHECK(e && e->type == KVP_META_ARR_STR && e->n == 3);
    size_t len = 0;
    CHECK_STR(kvp_meta_str_at(e, 2, &len), "hello");
    CHECK(kvp_meta_str_at(e, 1, &len) && len == 0);
    e = kvp_meta_find(m, "a.i32");
    CHECK(e && e->type == KVP_META_ARR_I32 && e->n == 3 && ((int32_t *)e->arr)[1] == -2);
    e = kvp_meta_find(m, "a.u8");
    CHECK(e && e->type == KVP_META_ARR_I32 && e->n == 2 && ((int32_t *)e->arr)[1] == 255);
    e = kvp_meta_find(m, "a.u32big");
    CHECK(e && e->type == KVP_META_ARR_I64 && ((int64_t *)e->arr)[1] == 0xffffffffll);
    e = kvp_meta_find(m, "a.f32");
    CHECK(e && e->type == KVP_META_ARR_F32 && ((float *)e->arr)[0] == -1.5f);
    e = kvp_meta_find(m, "a.bool");
    CHECK(e && e->type == KVP_META_ARR_U8 && ((uint8_t *)e->arr)[1] == 1);
    e = kvp_meta_find(m, "a.u64");
    CHECK(e && e->type == KVP_META_ARR_I64 && ((int64_t *)e->arr)[0] == 123456789012345ll);
    e = kvp_meta_find(m, "a.f64");
    CHECK(e && e->type == KVP_META_ARR_F64 && e->n == 0);

    const kvp_gguf_tensor *t = kvp_gguf_find(g, "w.f32");
    CHECK(t && t->dtype == KVP_DTYPE_F32 && t->n_dims == 2 && t->ne[0] == 4 && t->ne[1] == 2 && t->ne[2] == 1);
    CHECK(t && t->nbytes == 32 && t->offset == L->data);
    if (t) {
        const float *d = kvp_gguf_tensor_data(g, t);
        CHECK(d[0] == 0.0f && d[7] == 7.0f);
        CHECK_EQ_U64(kvp_gguf_tensor_nelems(t), 8);
    }
    t = kvp_gguf_find(g, "w.q41");
    CHECK(t && t->dtype == KVP_DTYPE_Q4_1 && t->ggml_type == 3 && t->nbytes == 40 && t->offset == L->data + 64);
    if (t)
        CHECK(((const uint8_t *)kvp_gguf_tensor_data(g, t))[39] == 39);
    t = kvp_gguf_find(g, "w.q80");
    CHECK(t && t->dtype == KVP_DTYPE_Q8_0 && t->nbytes == 68 && t->n_dims == 1);
    t = kvp_gguf_find(g, "w.iq2");
    CHECK(t && t->dtype == -1 && t->ggml_type == 16 && t->nbytes == 66);
    CHECK_EQ_I64(kvp_gguf_type_to_dtype(10), KVP_DTYPE_Q2_K); /* the K-quants are read */
    CHECK_EQ_I64(kvp_gguf_type_to_dtype(11), KVP_DTYPE_Q3_K);
    CHECK_EQ_I64(kvp_gguf_type_to_dtype(13), KVP_DTYPE_Q5_K);
    CHECK(kvp_gguf_find(g, "nope") == NULL);
    CHECK_STR(kvp_gguf_type_name(14), "q6_k");
    CHECK_EQ_I64(kvp_gguf_type_to_dtype(30), KVP_DTYPE_BF16);
    /* GGUF's MXFP4 is kvp(5)'s mxfp4 block (it had been refused as "not
     * supported for inference"): e 128 scales by 2, code 1 is 0.5, 7 is 6 */
    CHECK_EQ_I64(kvp_gguf_type_to_dtype(39), KVP_DTYPE_MXFP4);
    const kvp_dtype_traits *tr = kvp_dtype_get(KVP_DTYPE_MXFP4);
    uint8_t blk[17] = {128, 0x71};
    float y[32];
    CHECK(tr && tr->block_size == 32 && tr->block_bytes == 17);
    if (tr) {
        tr->to_f32(blk, y, 32);
        CHECK(y[0] == 1.0f && y[16] == 12.0f && y[1] == 0.0f);
    }
}

static int open_bytes(const uint8_t *p, size_t n, kvp_err *err)
{
    kvp_gguf g;
    err->msg[0] = '\0';
    int rc = kvp_gguf_open_mem(&g, p, n, "t.gguf", err);
    kvp_gguf_close(&g);
    return rc;
}

static void test_good(void)
{
    for (uint32_t v = 2; v <= 3; v++) {
        kvp_buf b;
        layout L;
        build(&b, v, &L);
        kvp_gguf g;
        kvp_err err = {0};
        int rc = kvp_gguf_open_mem(&g, b.data, b.len, "mem.gguf", &err);
        CHECK_MSG(rc == 0, "%s", err.msg);
        if (rc == 0)
            check_good(&g, v, &L);
        kvp_gguf_close(&g);
        kvp_gguf_close(&g); /* harmless twice */

        /* The same through a real file (mapped). */
        char path[] = "/tmp/kvp_test_gguf_XXXXXX";
        int fd = mkstemp(path);
        CHECK(fd >= 0 && write(fd, b.data, b.len) == (ssize_t)b.len);
        close(fd);
        rc = kvp_gguf_open(&g, path, &err);
        CHECK_MSG(rc == 0, "%s", err.msg);
        if (rc == 0)
            check_good(&g, v, &L);
        kvp_gguf_close(&g);
        unlink(path);
        kvp_buf_free(&b);
    }
    kvp_gguf g;
    kvp_err err = {0};
    CHECK(kvp_gguf_open(&g, "/nonexistent/x.gguf", &err) < 0);
    CHECK(strstr(err.msg, "/nonexistent/x.gguf") != NULL);
    kvp_gguf_close(&g);
}

static void test_truncate_and_flip(void)
{
    kvp_buf b;
    layout L;
    build(&b, 3, &L);
    kvp_err err;
    int ok = 1;
    for (size_t cut = 0; cut < b.len; cut++) {
        uint8_t *copy = malloc(cut ? cut : 1); /* exact size so ASan sees any overrun */
        memcpy(copy, b.data, cut);
        int rc = open_bytes(copy, cut, &err);
        if (rc >= 0 || strncmp(err.msg, "t.gguf: ", 8) != 0) {
            ok = 0;
            printf("cut %zu: rc %d msg \"%s\"\n", cut, rc, err.msg);
        }
        free(copy);
    }
    CHECK(ok);

    /* Every bit of the header and infos: opens, or fails naming the file. */
    ok = 1;
    int fails = 0;
    for (size_t i = 0; i < L.data; i++) {
        for (int bit = 0; bit < 8; bit++) {
            b.data[i] ^= (uint8_t)(1u << bit);
            int rc = open_bytes(b.data, b.len, &err);
            if (rc < 0) {
                fails++;
                if (strncmp(err.msg, "t.gguf: ", 8) != 0)
                    ok = 0;
            }
            b.data[i] ^= (uint8_t)(1u << bit);
        }
    }
    CHECK(ok);
    CHECK(fails > 0);
    kvp_buf_free(&b);
}

/* Patch one field of a fresh copy, open it, expect code and a word in the message. */
static void expect(size_t at, int width, uint64_t v, int code, const char *word)
{
    kvp_buf b;
    layout L;
    build(&b, 3, &L);
    (void)L;
    if (width == 4)
        kvp_put32(b.data + at, (uint32_t)v);
    else if (width == 8)
        kvp_put64(b.data + at, v);
    else
        b.data[at] = (uint8_t)v;
    kvp_err err;
    int rc = open_bytes(b.data, b.len, &err);
    CHECK_MSG(rc == code, "patch at %zu = %llu: rc %d (want %d): %s", at, (unsigned long long)v, rc, code, err.msg);
    CHECK_MSG(strstr(err.msg, word) != NULL && strncmp(err.msg, "t.gguf: ", 8) == 0, "\"%s\" lacks \"%s\"", err.msg,
              word);
    kvp_buf_free(&b);
}

static void test_hostile(void)
{
    layout L;
    kvp_buf b;
    build(&b, 3, &L);
    kvp_buf_free(&b);

    expect(0, 1, 'X', KVP_EFORMAT, "magic");
    expect(4, 4, 1, KVP_EVERSION, "version");
    expect(4, 4, 4, KVP_EVERSION, "version");
    expect(L.n_tensors, 8, 1ull << 60, KVP_ELIMIT, "n_tensors");
    expect(L.n_kv, 8, 1ull << 60, KVP_ELIMIT, "n_kv");
    expect(L.n_tensors, 8, 100000, KVP_ETRUNC, "n_tensors");
    expect(L.key0_len, 8, 1ull << 63, KVP_ELIMIT, "key");
    expect(L.key0_len, 8, 3000, KVP_ETRUNC, "metadata entry 0");
    expect(L.key0_len, 8, 0, KVP_EFORMAT, "empty");
    expect(L.key0_len + 8 + 20, 4, 77, KVP_EFORMAT, "unknown value type");
    expect(L.strarr_count, 8, 1ull << 62, KVP_ELIMIT, "tokens");
    expect(L.strarr_count, 8, 1ull << 31, KVP_ETRUNC, "tokens");
    expect(L.strarr_count - 4, 4, 9, KVP_EUNSUPPORTED, "arrays of arrays");
    expect(L.strarr_count - 4, 4, 99, KVP_EFORMAT, "element type");
    expect(L.tok0_len, 8, 1ull << 40, KVP_ELIMIT, "string element 0");
    expect(L.tok0_len, 8, 1ull << 20, KVP_ETRUNC, "string element 0");
    expect(L.align_val, 4, 3, KVP_EFORMAT, "general.alignment");
    expect(L.align_val, 4, 0, KVP_EFORMAT, "general.alignment");
    expect(L.ti0_name_len, 8, UINT64_MAX, KVP_ELIMIT, "name");
    expect(L.ti0_n_dims, 4, 5, KVP_EFORMAT, "n_dims");
    expect(L.ti0_n_dims, 4, 0, KVP_EFORMAT, "n_dims");
    expect(L.ti0_ne0, 8, 1ull << 32, KVP_ETRUNC, "runs past the end");
    expect(L.ti0_ne0, 8, 1ull << 63, KVP_EFORMAT, "dim 0");
    expect(L.ti0_ne1, 8, 1ull << 62, KVP_EFORMAT, "overflows");
    expect(L.ti0_ne0, 8, 1ull << 40, KVP_ETRUNC, "w.f32");
    expect(L.ti0_type, 4, 200, KVP_EUNSUPPORTED, "unknown ggml type");
    expect(L.ti0_off, 8, 32, KVP_EFORMAT, "alignment");
    expect(L.ti0_off, 8, UINT64_MAX - 63, KVP_ETRUNC, "w.f32");
    expect(L.ti1_off, 8, 1ull << 20, KVP_ETRUNC, "w.q41");
    /* found once every info is read: the offset named is still its info's */
    char at1[80];
    snprintf(at1, sizeof at1, "tensor info 1 (\"w.q41\") at offset %zu: data", L.ti1_name);
    expect(L.ti1_off, 8, 1ull << 20, KVP_ETRUNC, at1);
    expect(L.ti1_name + 8 + 5 + 4, 8, 33, KVP_EFORMAT, "block size"); /* q4_1 ne0 = 33 */

    /* Duplicate key: rename "k.u8" to "k.i8". */
    build(&b, 3, &L);
    uint8_t *p = memmem(b.data, b.len, "k.u8", 4);
    CHECK(p != NULL);
    if (p)
        p[2] = 'i';
    kvp_err err;
    CHECK(open_bytes(b.data, b.len, &err) == KVP_EFORMAT);
    CHECK(strstr(err.msg, "\"k.i8\" appears twice") != NULL);
    /* bool value 2 */
    if (p)
        p[2] = 'u';
    p = memmem(b.data, b.len, "k.bool", 6);
    if (p)
        p[6 + 4] = 2;
    CHECK(open_bytes(b.data, b.len, &err) == KVP_EFORMAT);
    CHECK(strstr(err.msg, "k.bool") != NULL);
    kvp_buf_free(&b);
}

static void test_duplicate_tensor(void)
{
    kvp_buf b;
    layout L;
    build(&b, 3, &L);
    /* "w.q80" -> "w.q41" */
    uint8_t *p = memmem(b.data, b.len, "w.q80", 5);
    CHECK(p != NULL);
    if (p)
        memcpy(p, "w.q41", 5);
    kvp_err err;
    CHECK(open_bytes(b.data, b.len, &err) == KVP_EFORMAT);
    CHECK_MSG(strstr(err.msg, "\"w.q41\" appears twice") != NULL, "%s", err.msg);
    kvp_buf_free(&b);
}

/* "-" reads stdin; a pipe cannot be mapped, so the reader copies it. */
static void test_pipe(void)
{
    kvp_buf b;
    layout L;
    build(&b, 3, &L);
    int fds[2];
    CHECK(pipe(fds) == 0);
    int saved = dup(0);
    CHECK(write(fds[1], b.data, b.len) == (ssize_t)b.len); /* under the pipe buffer size */
    close(fds[1]);
    dup2(fds[0], 0);
    close(fds[0]);
    kvp_gguf g;
    kvp_err err = {0};
    int rc = kvp_gguf_open(&g, "-", &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc == 0) {
        CHECK(g.owned != NULL);
        check_good(&g, 3, &L);
    }
    kvp_gguf_close(&g);
    dup2(saved, 0);
    close(saved);
    kvp_buf_free(&b);
}

static void test_real_model(void)
{
    const char *path = unit_model_path();
    if (access(path, R_OK) != 0) {
        printf("note: %s absent, real-model checks skipped (scripts/fetch-model makes it present)\n", path);
        return;
    }
    kvp_gguf g;
    kvp_err err = {0};
    int rc = kvp_gguf_open(&g, path, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc)
        return;
    CHECK_EQ_U64(g.version, 3);
    CHECK_EQ_U64(g.n_tensors, 272);
    CHECK_STR(kvp_meta_get_str(&g.meta, "general.architecture"), "llama");
    uint64_t u = 0;
    CHECK(kvp_meta_get_u64(&g.meta, "llama.block_count", &u) == 0 && u == 30);
    CHECK(kvp_meta_get_u64(&g.meta, "llama.embedding_length", &u) == 0 && u == 576);
    CHECK(kvp_meta_get_u64(&g.meta, "llama.feed_forward_length", &u) == 0 && u == 1536);
    CHECK(kvp_meta_get_u64(&g.meta, "llama.attention.head_count", &u) == 0 && u == 9);
    CHECK(kvp_meta_get_u64(&g.meta, "llama.attention.head_count_kv", &u) == 0 && u == 3);
    double f = 0;
    CHECK(kvp_meta_get_f64(&g.meta, "llama.rope.freq_base", &f) == 0 && f == 100000.0);
    const kvp_meta_entry *e = kvp_meta_find(&g.meta, "tokenizer.ggml.tokens");
    CHECK(e && e->type == KVP_META_ARR_STR && e->n == 49152);
    if (e) {
        size_t len;
        CHECK_STR(kvp_meta_str_at(e, 1, &len), "<|im_start|>");
    }
    const kvp_gguf_tensor *t = kvp_gguf_find(&g, "blk.0.attn_k.weight");
    CHECK(t && t->ne[0] == 576 && t->ne[1] == 192 && t->ggml_type == 3 && t->dtype == KVP_DTYPE_Q4_1);
    t = kvp_gguf_find(&g, "token_embd.weight");
    CHECK(t && t->ne[0] == 576 && t->ne[1] == 49152);
    if (t)
        printf("note: token_embd.weight is %s\n", kvp_gguf_type_name(t->ggml_type));
    CHECK(kvp_gguf_find(&g, "output.weight") == NULL);
    t = kvp_gguf_find(&g, "output_norm.weight");
    CHECK(t && t->dtype == KVP_DTYPE_F32 && t->n_dims == 1 && t->ne[0] == 576);
    uint64_t end = 0;
    for (uint64_t i = 0; i < g.n_tensors; i++)
        if (g.tensors[i].offset + g.tensors[i].nbytes > end)
            end = g.tensors[i].offset + g.tensors[i].nbytes;
    CHECK(end <= g.size && g.size - end < g.alignment);
    kvp_gguf_close(&g);
}

int main(void)
{
    test_good();
    test_truncate_and_flip();
    test_hostile();
    test_duplicate_tensor();
    test_pipe();
    test_real_model();
    return unit_done();
}
