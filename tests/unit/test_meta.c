/* test_meta.c - key/value lists: setters, getters, encode/decode round trip,
 * and hostile encodings (truncation at every offset, bit flips, absurd counts). */
#include "meta.h"
#include "unit.h"

#include <stdlib.h>

static void build(kvp_meta *m)
{
    kvp_meta_init(m);
    CHECK(kvp_meta_set_str(m, "general.architecture", "llama", 5) == 0);
    CHECK(kvp_meta_set_u64(m, "llama.block_count", 30) == 0);
    CHECK(kvp_meta_set_i64(m, "neg", -7) == 0);
    CHECK(kvp_meta_set_f64(m, "llama.rope.freq_base", 100000.0) == 0);
    CHECK(kvp_meta_set_bool(m, "flag", 1) == 0);
    const uint8_t u8[3] = {1, 0, 255};
    const int32_t i32[2] = {-1, 2};
    const float f32[2] = {0.5f, -2.0f};
    const int64_t i64[1] = {INT64_MIN};
    const double f64[2] = {1e300, -0.0};
    CHECK(kvp_meta_set_arr(m, "a.u8", KVP_META_ARR_U8, u8, 3) == 0);
    CHECK(kvp_meta_set_arr(m, "a.i32", KVP_META_ARR_I32, i32, 2) == 0);
    CHECK(kvp_meta_set_arr(m, "a.f32", KVP_META_ARR_F32, f32, 2) == 0);
    CHECK(kvp_meta_set_arr(m, "a.i64", KVP_META_ARR_I64, i64, 1) == 0);
    CHECK(kvp_meta_set_arr(m, "a.f64", KVP_META_ARR_F64, f64, 2) == 0);
    CHECK(kvp_meta_set_arr(m, "a.empty", KVP_META_ARR_F32, NULL, 0) == 0);
    const char *toks[3] = {"<s>", "", "a\0b"};
    const size_t lens[3] = {3, 0, 3};
    CHECK(kvp_meta_set_strarr(m, "tokens", toks, lens, 3) == 0);
}

static void check_content(const kvp_meta *m)
{
    CHECK_EQ_U64(m->n, 12);
    CHECK_STR(kvp_meta_get_str(m, "general.architecture"), "llama");
    uint64_t u = 0;
    CHECK(kvp_meta_get_u64(m, "llama.block_count", &u) == 0);
    CHECK_EQ_U64(u, 30);
    CHECK(kvp_meta_get_u64(m, "neg", &u) == KVP_EFORMAT);
    int64_t i = 0;
    CHECK(kvp_meta_get_i64(m, "neg", &i) == 0);
    CHECK_EQ_I64(i, -7);
    double f = 0;
    CHECK(kvp_meta_get_f64(m, "llama.rope.freq_base", &f) == 0);
    CHECK_NEAR(f, 100000.0, 0);
    CHECK(kvp_meta_get_f64(m, "llama.block_count", &f) == 0);
    CHECK_NEAR(f, 30.0, 0);
    CHECK(kvp_meta_get_f64(m, "general.architecture", &f) == KVP_EFORMAT);
    CHECK(kvp_meta_get_u64(m, "flag", &u) == 0 && u == 1);
    CHECK(kvp_meta_get_u64(m, "missing", &u) == KVP_ENOTFOUND);
    CHECK(kvp_meta_get_str(m, "llama.block_count") == NULL);

    const kvp_meta_entry *e = kvp_meta_find(m, "a.u8");
    CHECK(e && e->type == KVP_META_ARR_U8 && e->n == 3 && ((uint8_t *)e->arr)[2] == 255);
    e = kvp_meta_find(m, "a.i32");
    CHECK(e && e->n == 2 && ((int32_t *)e->arr)[0] == -1 && ((int32_t *)e->arr)[1] == 2);
    e = kvp_meta_find(m, "a.f32");
    CHECK(e && e->n == 2 && ((float *)e->arr)[1] == -2.0f);
    e = kvp_meta_find(m, "a.i64");
    CHECK(e && e->n == 1 && ((int64_t *)e->arr)[0] == INT64_MIN);
    e = kvp_meta_find(m, "a.f64");
    CHECK(e && e->n == 2 && ((double *)e->arr)[0] == 1e300);
    e = kvp_meta_find(m, "a.empty");
    CHECK(e && e->n == 0 && e->type == KVP_META_ARR_F32);
    e = kvp_meta_find(m, "tokens");
    CHECK(e && e->type == KVP_META_ARR_STR && e->n == 3);
    size_t len = 99;
    CHECK_STR(kvp_meta_str_at(e, 0, &len), "<s>");
    CHECK_EQ_U64(len, 3);
    CHECK(kvp_meta_str_at(e, 1, &len) && len == 0);
    const char *s = kvp_meta_str_at(e, 2, &len);
    CHECK(s && len == 3 && memcmp(s, "a\0b", 3) == 0);
    CHECK(kvp_meta_str_at(e, 3, &len) == NULL);
}

static void test_roundtrip(void)
{
    kvp_meta m;
    build(&m);
    check_content(&m);
    /* Setting a key again replaces its value (and its type). */
    CHECK(kvp_meta_set_str(&m, "llama.block_count", "x", 1) == 0);
    CHECK_EQ_U64(m.n, 12);
    CHECK_STR(kvp_meta_get_str(&m, "llama.block_count"), "x");
    CHECK(kvp_meta_set_u64(&m, "llama.block_count", 30) == 0);
    CHECK(kvp_meta_set_arr(&m, "bad", KVP_META_ARR_STR, NULL, 0) == KVP_EINVAL);

    kvp_buf b;
    kvp_buf_init(&b);
    CHECK(kvp_meta_encode(&m, &b) == 0);
    kvp_meta d;
    kvp_err err = {0};
    CHECK(kvp_meta_decode(&d, b.data, b.len, &err) == 0);
    check_content(&d);
    /* Encoding is deterministic: decode then encode gives the same bytes. */
    kvp_buf b2;
    kvp_buf_init(&b2);
    CHECK(kvp_meta_encode(&d, &b2) == 0);
    CHECK(b2.len == b.len && memcmp(b.data, b2.data, b.len) == 0);

    /* Truncation at every offset fails cleanly. */
    int all_fail = 1;
    for (size_t cut = 0; cut < b.len; cut++) {
        kvp_meta t;
        uint8_t *copy = malloc(cut ? cut : 1);
        memcpy(copy, b.data, cut);
        if (kvp_meta_decode(&t, copy, cut, &err) >= 0) {
            all_fail = 0;
            printf("cut at %zu decoded\n", cut);
            kvp_meta_free(&t);
        } else if (err.msg[0] == '\0') {
            all_fail = 0;
        }
        free(copy);
    }
    CHECK(all_fail);
    /* Trailing bytes are refused. */
    kvp_buf_u8(&b2, 0);
    {
        kvp_meta t;
        CHECK(kvp_meta_decode(&t, b2.data, b2.len, &err) == KVP_EFORMAT);
        CHECK(strstr(err.msg, "trailing") != NULL);
    }

    /* Every single-bit flip either decodes or fails with a message; never a crash. */
    int flips_ok = 1;
    for (size_t i = 0; i < b.len; i++) {
        for (int bit = 0; bit < 8; bit++) {
            b.data[i] ^= (uint8_t)(1u << bit);
            kvp_meta t;
            err.msg[0] = '\0';
            int rc = kvp_meta_decode(&t, b.data, b.len, &err);
            if (rc == 0)
                kvp_meta_free(&t);
            else if (err.msg[0] == '\0')
                flips_ok = 0;
            b.data[i] ^= (uint8_t)(1u << bit);
        }
    }
    CHECK(flips_ok);
    kvp_buf_free(&b);
    kvp_buf_free(&b2);
    kvp_meta_free(&d);
    kvp_meta_free(&m);
}

static int decode_bytes(const kvp_buf *b, kvp_err *err)
{
    kvp_meta t;
    int rc = kvp_meta_decode(&t, b->data, b->len, err);
    if (rc == 0)
        kvp_meta_free(&t);
    return rc;
}

static void entry_head(kvp_buf *b, const char *key, uint32_t type, uint64_t n)
{
    kvp_buf_str32(b, key, strlen(key));
    kvp_buf_u32(b, type);
    kvp_buf_u64(b, n);
}

static void test_hostile(void)
{
    kvp_err err = {0};
    kvp_buf b;

    kvp_buf_init(&b); /* absurd entry count */
    kvp_buf_u32(&b, 0xffffffffu);
    CHECK(decode_bytes(&b, &err) == KVP_ELIMIT);
    kvp_buf_free(&b);

    kvp_buf_init(&b); /* plausible count, no bytes behind it */
    kvp_buf_u32(&b, 1000);
    CHECK(decode_bytes(&b, &err) == KVP_ETRUNC);
    kvp_buf_free(&b);

    kvp_buf_init(&b); /* array of 2^60 f64 */
    kvp_buf_u32(&b, 1);
    entry_head(&b, "big", KVP_META_ARR_F64, 1ull << 60);
    kvp_buf_zero(&b, 64);
    CHECK(decode_bytes(&b, &err) == KVP_ETRUNC);
    CHECK(strstr(err.msg, "big") != NULL);
    kvp_buf_free(&b);

    kvp_buf_init(&b); /* string array of 2^62 strings */
    kvp_buf_u32(&b, 1);
    entry_head(&b, "strs", KVP_META_ARR_STR, 1ull << 62);
    kvp_buf_zero(&b, 64);
    CHECK(decode_bytes(&b, &err) == KVP_ETRUNC);
    kvp_buf_free(&b);

    kvp_buf_init(&b); /* string element longer than what is left */
    kvp_buf_u32(&b, 1);
    entry_head(&b, "strs", KVP_META_ARR_STR, 1);
    kvp_buf_u32(&b, 0x7fffffff);
    kvp_buf_zero(&b, 8);
    CHECK(decode_bytes(&b, &err) == KVP_ETRUNC);
    kvp_buf_free(&b);

    kvp_buf_init(&b); /* STR length past the end */
    kvp_buf_u32(&b, 1);
    entry_head(&b, "s", KVP_META_STR, UINT64_MAX);
    kvp_buf_zero(&b, 8);
    CHECK(decode_bytes(&b, &err) == KVP_ETRUNC);
    kvp_buf_free(&b);

    kvp_buf_init(&b); /* key too long */
    kvp_buf_u32(&b, 1);
    kvp_buf_u32(&b, KVP_META_MAX_KEY + 1);
    kvp_buf_zero(&b, KVP_META_MAX_KEY + 32);
    CHECK(decode_bytes(&b, &err) == KVP_ELIMIT);
    kvp_buf_free(&b);

    kvp_buf_init(&b); /* unknown type */
    kvp_buf_u32(&b, 1);
    entry_head(&b, "k", 99, 1);
    kvp_buf_u64(&b, 0);
    CHECK(decode_bytes(&b, &err) == KVP_EFORMAT);
    CHECK(strstr(err.msg, "\"k\"") != NULL);
    kvp_buf_free(&b);

    kvp_buf_init(&b); /* duplicate keys */
    kvp_buf_u32(&b, 2);
    entry_head(&b, "k", KVP_META_U64, 1);
    kvp_buf_u64(&b, 1);
    entry_head(&b, "k", KVP_META_U64, 1);
    kvp_buf_u64(&b, 2);
    CHECK(decode_bytes(&b, &err) == KVP_EFORMAT);
    CHECK(strstr(err.msg, "twice") != NULL);
    kvp_buf_free(&b);

    kvp_buf_init(&b); /* scalar with n != 1, bool of 2 */
    kvp_buf_u32(&b, 1);
    entry_head(&b, "k", KVP_META_U64, 2);
    kvp_buf_u64(&b, 1);
    CHECK(decode_bytes(&b, &err) == KVP_EFORMAT);
    kvp_buf_free(&b);
    kvp_buf_init(&b);
    kvp_buf_u32(&b, 1);
    entry_head(&b, "k", KVP_META_BOOL, 1);
    kvp_buf_u64(&b, 2);
    CHECK(decode_bytes(&b, &err) == KVP_EFORMAT);
    kvp_buf_free(&b);

    kvp_buf_init(&b); /* empty list is fine */
    kvp_buf_u32(&b, 0);
    CHECK(decode_bytes(&b, &err) == 0);
    kvp_buf_free(&b);
}

static void test_many_keys(void)
{
    /* The duplicate check is O(n log n): 60000 keys decode quickly. */
    kvp_meta m;
    kvp_meta_init(&m);
    char key[32];
    int pushed = 1;
    for (int i = 0; i < 60000; i++) {
        kvp_meta_entry e;
        memset(&e, 0, sizeof e);
        snprintf(key, sizeof key, "k%d", i);
        e.key = strdup(key);
        e.type = KVP_META_U64;
        e.n = 1;
        e.v.u = (uint64_t)i;
        if (kvp_meta_push(&m, &e))
            pushed = 0;
    }
    CHECK(pushed);
    CHECK(kvp_meta_find_duplicate(&m) == NULL);
    kvp_buf b;
    kvp_buf_init(&b);
    CHECK(kvp_meta_encode(&m, &b) == 0);
    kvp_meta d;
    kvp_err err = {0};
    CHECK(kvp_meta_decode(&d, b.data, b.len, &err) == 0);
    CHECK_EQ_U64(d.n, 60000);
    kvp_meta_free(&d);
    kvp_buf_free(&b);
    kvp_meta_entry e;
    memset(&e, 0, sizeof e);
    e.key = strdup("k59999");
    e.type = KVP_META_U64;
    e.n = 1;
    CHECK(kvp_meta_push(&m, &e) == 0);
    CHECK_STR(kvp_meta_find_duplicate(&m), "k59999");
    kvp_meta_free(&m);
}

int main(void)
{
    test_roundtrip();
    test_hostile();
    test_many_keys();
    return unit_done();
}
