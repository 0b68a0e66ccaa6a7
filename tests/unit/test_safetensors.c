/* test_safetensors.c - the safetensors reader on the golden tiny checkpoint
 * written by the safetensors package (scripts/ref/gen_safetensors.py): one
 * file, a folder, shards through the index; its config.json; and hostile
 * inputs (truncation at every offset, bit flips in the header, absurd
 * lengths, shapes and offsets, broken indexes) that must fail naming the
 * file and field, never crash. */
#include "config.h"
#include "safetensors.h"
#include "tensor.h"
#include "unit.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static char golden[1024];

/* Names as in gen_safetensors.py; k = index; element i = ((i + k) % 7 - 3) / 4. */
static const char *const names[] = {
    "model.embed_tokens.weight",
    "model.layers.0.input_layernorm.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.self_attn.k_proj.weight",
    "model.layers.0.self_attn.v_proj.weight",
    "model.layers.0.self_attn.o_proj.weight",
    "model.layers.0.post_attention_layernorm.weight",
    "model.layers.0.mlp.gate_proj.weight",
    "model.layers.0.mlp.up_proj.weight",
    "model.layers.0.mlp.down_proj.weight",
    "model.norm.weight",
};
#define N_NAMES (sizeof names / sizeof names[0])

static float elem(const kvp_safetensors_tensor *t, uint64_t i)
{
    const uint8_t *p = (const uint8_t *)t->data;
    switch (t->dtype) {
    case KVP_DTYPE_F32: {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    case KVP_DTYPE_F16: return kvp_f16_to_f32(kvp_le16(p + 2 * i));
    case KVP_DTYPE_BF16: return kvp_bf16_to_f32(kvp_le16(p + 2 * i));
    default: {
        const kvp_dtype_traits *tr = kvp_dtype_get((uint32_t)t->dtype);
        float f = -99;
        if (tr && tr->to_f32 && tr->block_size == 1)
            tr->to_f32(p + i, &f, 1);
        return f;
    }
    }
}

static void check_model(const kvp_safetensors *st, const char *what)
{
    CHECK_MSG(st->n_tensors == N_NAMES + 1, "%s: %llu tensors", what, (unsigned long long)st->n_tensors);
    int values_ok = 1;
    for (size_t k = 0; k < N_NAMES; k++) {
        const kvp_safetensors_tensor *t = kvp_safetensors_find(st, names[k]);
        CHECK_MSG(t != NULL, "%s: %s missing", what, names[k]);
        if (!t)
            continue;
        uint64_t n = kvp_safetensors_nelems(t);
        for (uint64_t i = 0; i < n; i++)
            if (elem(t, i) != (float)((int)((i + k) % 7) - 3) / 4.0f)
                values_ok = 0;
    }
    CHECK_MSG(values_ok, "%s: tensor values differ from the generator's formula", what);
    const kvp_safetensors_tensor *t = kvp_safetensors_find(st, "model.embed_tokens.weight");
    CHECK(t && t->dtype == KVP_DTYPE_F32 && t->n_dims == 2 && t->shape[0] == 16 && t->shape[1] == 8 && t->nbytes == 512);
    t = kvp_safetensors_find(st, "model.layers.0.self_attn.q_proj.weight");
    CHECK(t && t->dtype == KVP_DTYPE_F16 && t->shape[0] == 8 && t->shape[1] == 8);
    t = kvp_safetensors_find(st, "model.layers.0.self_attn.k_proj.weight");
    CHECK(t && t->dtype == KVP_DTYPE_BF16 && t->shape[0] == 4 && t->shape[1] == 8 && strcmp(t->dtype_name, "BF16") == 0);
    t = kvp_safetensors_find(st, "model.layers.0.self_attn.v_proj.weight");
    CHECK(t && t->dtype == KVP_DTYPE_FP8_E4M3 && t->nbytes == 32 && strcmp(t->dtype_name, "F8_E4M3") == 0);
    t = kvp_safetensors_find(st, "model.norm.weight");
    CHECK(t && t->n_dims == 1 && t->shape[0] == 8);
    t = kvp_safetensors_find(st, "step");
    CHECK(t && t->dtype == -1 && t->n_dims == 0 && t->nbytes == 8 && kvp_safetensors_nelems(t) == 1);
    if (t) {
        int64_t v;
        memcpy(&v, t->data, 8);
        CHECK_EQ_I64(v, 7);
    }
    CHECK(kvp_safetensors_find(st, "lm_head.weight") == NULL);
    CHECK_STR(kvp_meta_get_str(&st->meta, "format"), "pt");
}

static void test_golden(void)
{
    char path[1200];
    kvp_safetensors st;
    kvp_err err = {0};
    const char *forms[] = {"", "/model.safetensors", "/sharded", "/sharded/model.safetensors.index.json"};
    for (size_t f = 0; f < 4; f++) {
        snprintf(path, sizeof path, "%s%s", golden, forms[f]);
        int rc = kvp_safetensors_open(&st, path, &err);
        CHECK_MSG(rc == 0, "%s: %s", path, err.msg);
        if (rc == 0) {
            check_model(&st, path);
            CHECK_EQ_U64(st.n_files, f >= 2 ? 2 : 1);
        }
        kvp_safetensors_close(&st);
    }
    kvp_safetensors_close(&st); /* harmless twice */

    kvp_config c;
    int rc = kvp_config_from_hf(&c, golden, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    CHECK(c.n_layer == 1 && c.n_embd == 8 && c.n_head == 2 && c.n_head_kv == 1 && c.head_dim == 4);
    CHECK(c.n_ff == 16 && c.n_vocab == 16 && c.tied_embeddings == 1 && c.rope_type == KVP_ROPE_NEOX);
    CHECK(c.n_ctx == 64 && c.rms_eps == 1e-5);

    CHECK(kvp_safetensors_open(&st, "/nonexistent", &err) < 0);
    CHECK(strstr(err.msg, "/nonexistent") != NULL);
    snprintf(path, sizeof path, "%s/config.json", golden); /* JSON that is not an index */
    CHECK(kvp_safetensors_open(&st, path, &err) == KVP_EFORMAT);
    CHECK(strstr(err.msg, "weight_map") != NULL);
}

static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    uint8_t *b = malloc(1 << 16);
    *n = fread(b, 1, 1 << 16, f);
    fclose(f);
    return b;
}

static int open_bytes(const void *p, size_t n, kvp_err *err)
{
    kvp_safetensors st;
    err->msg[0] = '\0';
    int rc = kvp_safetensors_open_mem(&st, p, n, "t.safetensors", err);
    kvp_safetensors_close(&st);
    return rc;
}

static void test_truncate_flip(void)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/model.safetensors", golden);
    size_t n = 0;
    uint8_t *b = slurp(path, &n);
    CHECK(b && n > 100);
    if (!b)
        return;
    kvp_err err;
    CHECK(open_bytes(b, n, &err) == 0);
    int ok = 1;
    for (size_t cut = 0; cut < n; cut++) {
        uint8_t *copy = malloc(cut ? cut : 1);
        memcpy(copy, b, cut);
        int rc = open_bytes(copy, cut, &err);
        if (rc >= 0 || strncmp(err.msg, "t.safetensors", 13) != 0) {
            ok = 0;
            printf("cut %zu: rc %d: %s\n", cut, rc, err.msg);
        }
        free(copy);
    }
    CHECK(ok);
    uint64_t hlen = kvp_le64(b);
    ok = 1;
    int fails = 0;
    for (size_t i = 0; i < 8 + hlen; i++) {
        for (int bit = 0; bit < 8; bit++) {
            b[i] ^= (uint8_t)(1u << bit);
            int rc = open_bytes(b, n, &err);
            if (rc < 0) {
                fails++;
                if (strncmp(err.msg, "t.safetensors", 13) != 0)
                    ok = 0;
            }
            b[i] ^= (uint8_t)(1u << bit);
        }
    }
    CHECK(ok && fails > 0);
    free(b);
}

/* A one-file safetensors from a header string and data bytes. */
static int hdr(const char *json, size_t data_len, uint64_t hlen_override, kvp_err *err)
{
    kvp_buf b;
    kvp_buf_init(&b);
    kvp_buf_u64(&b, hlen_override ? hlen_override : strlen(json));
    kvp_buf_put(&b, json, strlen(json));
    kvp_buf_zero(&b, data_len);
    int rc = open_bytes(b.data, b.len, err);
    kvp_buf_free(&b);
    return rc;
}

static void expect(const char *json, size_t data_len, uint64_t hlen, int code, const char *word)
{
    kvp_err err;
    int rc = hdr(json, data_len, hlen, &err);
    CHECK_MSG(rc == code, "%s: rc %d (want %d): %s", json, rc, code, err.msg);
    CHECK_MSG(strstr(err.msg, word) != NULL && strncmp(err.msg, "t.safetensors", 13) == 0,
              "\"%s\" lacks \"%s\"", err.msg, word);
}

static void test_hostile(void)
{
    kvp_err err;
    CHECK(hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 0, &err) == 0);
    CHECK(hdr("{}", 0, 0, &err) == 0);
    expect("{}", 0, 1ull << 60, KVP_ELIMIT, "header length");
    expect("{}", 0, 1000, KVP_ETRUNC, "header length");
    expect("{\"a\":1", 0, 0, KVP_EFORMAT, "t.safetensors: header:1:");
    expect("[]", 0, 0, KVP_EFORMAT, "expected a JSON object");
    expect("{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 0, KVP_EUNSUPPORTED, "dtype");
    expect("{\"a\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 0, KVP_EFORMAT, "dtype");
    expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, 0, KVP_EFORMAT, "shape[0]");
    expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8, 0, KVP_EFORMAT, "shape[0]");
    expect("{\"a\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8, 0, KVP_EFORMAT, "shape");
    expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, 0, KVP_EFORMAT,
           "dims");
    expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,8]}}", 8, 0,
           KVP_EFORMAT, "overflows");
    expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,8]}}", 8, 0, KVP_EFORMAT,
           "data_offsets");
    expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,16]}}", 8, 0, KVP_ETRUNC, "data_offsets");
    expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, 0, KVP_ETRUNC, "data_offsets");
    expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,18446744073709551615]}}", 8, 0, KVP_EFORMAT,
           "data_offsets");
    expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, 0, KVP_EFORMAT, "need 12");
    expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, 0, KVP_EFORMAT, "data_offsets");
    expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
           "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
           12, 0, KVP_EFORMAT, "overlaps");
    expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
           "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
           16, 0, KVP_EFORMAT, "duplicate key");
    expect("{\"a\":[]}", 0, 0, KVP_EFORMAT, "tensor \"a\": expected an object");
    expect("{\"__metadata__\":{\"format\":1}}", 0, 0, KVP_EFORMAT, "__metadata__.format");
    expect("{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 0, KVP_EFORMAT, "NUL");
    /* A tensor of zero elements is fine. */
    CHECK(hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[0,0]}}", 0, 0, &err) == 0);
}

static int copy_file(const char *from, const char *to)
{
    size_t n;
    uint8_t *b = slurp(from, &n);
    FILE *f = fopen(to, "wb");
    if (!b || !f) {
        free(b);
        if (f)
            fclose(f);
        return -1;
    }
    fwrite(b, 1, n, f);
    fclose(f);
    free(b);
    return 0;
}

static void write_text(const char *path, const char *s)
{
    FILE *f = fopen(path, "w");
    fputs(s, f);
    fclose(f);
}

static void test_bad_index(void)
{
    char dir[] = "/tmp/kvp_test_st_XXXXXX";
    if (!mkdtemp(dir))
        return;
    char from[1200], to[1200], idx[1200];
    const char *shards[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    for (int i = 0; i < 2; i++) {
        snprintf(from, sizeof from, "%s/sharded/%s", golden, shards[i]);
        snprintf(to, sizeof to, "%s/%s", dir, shards[i]);
        CHECK(copy_file(from, to) == 0);
    }
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    kvp_safetensors st;
    kvp_err err;

    write_text(idx, "{\"weight_map\":{\"step\":\"model-00001-of-00002.safetensors\","
                    "\"model.norm.weight\":\"model-00002-of-00002.safetensors\"}}");
    CHECK(kvp_safetensors_open(&st, dir, &err) == KVP_EMISMATCH);
    CHECK_MSG(strstr(err.msg, "weight_map.step") != NULL, "%s", err.msg);

    write_text(idx, "{\"weight_map\":{\"nope\":\"model-00001-of-00002.safetensors\"}}");
    CHECK(kvp_safetensors_open(&st, dir, &err) == KVP_ENOTFOUND);
    CHECK(strstr(err.msg, "weight_map.nope") != NULL);

    write_text(idx, "{\"weight_map\":{\"step\":\"../etc/passwd\"}}");
    CHECK(kvp_safetensors_open(&st, dir, &err) == KVP_EFORMAT);
    CHECK(strstr(err.msg, "same folder") != NULL);

    write_text(idx, "{\"weight_map\":{\"step\":\"model-00003-of-00002.safetensors\"}}");
    CHECK(kvp_safetensors_open(&st, dir, &err) == KVP_EIO);
    CHECK(strstr(err.msg, "model-00003-of-00002.safetensors") != NULL);

    write_text(idx, "{\"weight_map\":[]}");
    CHECK(kvp_safetensors_open(&st, dir, &err) == KVP_EFORMAT);

    /* The same tensor in two shards. */
    snprintf(to, sizeof to, "%s/model-00003-of-00002.safetensors", dir);
    snprintf(from, sizeof from, "%s/%s", dir, shards[1]);
    CHECK(copy_file(from, to) == 0);
    write_text(idx, "{\"weight_map\":{\"step\":\"model-00002-of-00002.safetensors\","
                    "\"model.norm.weight\":\"model-00003-of-00002.safetensors\"}}");
    CHECK(kvp_safetensors_open(&st, dir, &err) == KVP_EFORMAT);
    CHECK_MSG(strstr(err.msg, "appears twice") != NULL, "%s", err.msg);
    unlink(to);

    /* A full, correct index over the copies still opens. */
    write_text(idx, "{\"metadata\":{},\"weight_map\":{\"step\":\"model-00002-of-00002.safetensors\","
                    "\"model.embed_tokens.weight\":\"model-00001-of-00002.safetensors\"}}");
    int rc = kvp_safetensors_open(&st, dir, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc == 0)
        check_model(&st, dir);
    kvp_safetensors_close(&st);

    unlink(idx);
    for (int i = 0; i < 2; i++) {
        snprintf(to, sizeof to, "%s/%s", dir, shards[i]);
        unlink(to);
    }
    CHECK(kvp_safetensors_open(&st, dir, &err) == KVP_ENOTFOUND); /* empty folder */
    CHECK(strstr(err.msg, "model.safetensors") != NULL);
    rmdir(dir);
}

int main(void)
{
    const char *t = getenv("KVP_TESTS");
    snprintf(golden, sizeof golden, "%s/golden/tiny-st", t ? t : "tests");
    struct stat sb;
    if (stat(golden, &sb) != 0) {
        printf("%s: missing (run scripts/ref/gen_safetensors.py)\n", golden);
        CHECK(0);
        return unit_done();
    }
    test_golden();
    test_truncate_flip();
    test_hostile();
    test_bad_index();
    return unit_done();
}
