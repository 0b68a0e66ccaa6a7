/* test_generate.c - kvp_gen_accept's text as the emit callback sees it:
 * with stop strings the bytes that may begin one are held back, and what
 * is written never ends inside a UTF-8 character (a reader decoding each
 * write, as decode.1 promises), never shows a stop string, and adds up to
 * the whole text.  A small byte-level vocabulary (tests/fuzz/tokvocab.h):
 * byte b is token 3 + b. */
#include "generate.h"
#include "tokenizer.h"
#include "unicode.h"
#include "unit.h"

#include "../fuzz/tokvocab.h"

#include <string.h>

typedef struct chunks {
    char all[256];
    size_t len, n_split, n_calls;
} chunks;

/* Whether bytes [0, n) end on a character boundary: the last lead byte's
 * sequence is whole. */
static int ends_whole(const char *b, size_t n)
{
    size_t i = n, cont = 0;
    while (i > 0 && ((uint8_t)b[i - 1] & 0xC0) == 0x80 && cont < 4)
        i--, cont++;
    if (i == 0)
        return cont == 0;
    uint8_t lead = (uint8_t)b[i - 1];
    size_t want = lead < 0x80 ? 0 : lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : 1;
    return cont == want;
}

static void on_emit(void *ctx, kvp_gen_seq *s, const char *bytes, size_t n)
{
    (void)s;
    chunks *c = ctx;
    if (!n)
        return;
    c->n_calls++;
    if (!ends_whole(bytes, n) || ((uint8_t)bytes[0] & 0xC0) == 0x80)
        c->n_split++;
    if (c->len + n <= sizeof c->all) {
        memcpy(c->all + c->len, bytes, n);
        c->len += n;
    }
}

/* Feed text's bytes as byte tokens with the given stop strings; the
 * chunks written and the finish reason. */
static int feed(const kvp_tokenizer *t, const char *text, const char *const *stop, size_t n_stop, chunks *c)
{
    kvp_gen_seq s;
    memset(&s, 0, sizeof s);
    kvp_gen_seq_init(&s, t);
    kvp_gen_opts o = {.max_tokens = 64, .stop = stop, .n_stop = n_stop};
    kvp_err err;
    memset(c, 0, sizeof *c);
    int done = 0;
    for (size_t i = 0; text[i] && !done; i++) {
        s.rec.next_token = 3 + (uint8_t)text[i];
        int rc = kvp_gen_accept(&s, t, &o, on_emit, c, &err);
        CHECK_MSG(rc >= 0, "%s", err.msg);
        done = rc == 1;
    }
    int reason = s.rec.finish_reason;
    kvp_gen_seq_free(&s);
    return reason;
}

static void test_utf8_chunks(const kvp_tokenizer *t)
{
    /* "日本語で" and a stop string that never comes: every 3-byte
     * character was split by the one byte held back */
    static const char jp[] = "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xa7 ok";
    const char *zz[] = {"zz"};
    chunks c;
    feed(t, jp, zz, 1, &c);
    CHECK_EQ_U64(c.n_split, 0);
    CHECK(c.n_calls >= 4); /* streamed, not held to the end */
    /* the last byte stays held: it might begin "zz" */
    CHECK(c.len == sizeof jp - 2 && memcmp(c.all, jp, c.len) == 0);

    /* a stop string of 3-byte characters: held back whole, cut, never shown */
    const char *hon[] = {"\xe6\x9c\xac\xe8\xaa\x9e"}; /* "本語" */
    CHECK_EQ_I64(feed(t, jp, hon, 1, &c), KVP_FINISH_STOP_STRING);
    CHECK_EQ_U64(c.n_split, 0);
    CHECK(c.len == 3 && memcmp(c.all, jp, 3) == 0);

    /* 4-byte characters (emoji) and a 2-byte stop string */
    static const char emo[] = "a\xf0\x9f\x98\x80\xf0\x9f\x98\x81" "b\xc3\xa9" "c";
    const char *e[] = {"\xc3\xa9"};
    CHECK_EQ_I64(feed(t, emo, e, 1, &c), KVP_FINISH_STOP_STRING);
    CHECK_EQ_U64(c.n_split, 0);
    CHECK(c.len == 10 && memcmp(c.all, emo, 10) == 0);

    /* no stop strings: each character as it completes */
    feed(t, jp, NULL, 0, &c);
    CHECK_EQ_U64(c.n_split, 0);
    CHECK(c.len == sizeof jp - 1 && memcmp(c.all, jp, c.len) == 0);
}

int main(void)
{
    kvp_meta m;
    kvp_meta_init(&m);
    kvp_tokenizer *t = NULL;
    kvp_err err;
    CHECK(tv_gpt2(&m, "gpt2") == 0);
    int rc = kvp_tokenizer_load_meta(&t, &m, "tiny", &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    kvp_meta_free(&m);
    if (rc == 0) {
        test_utf8_chunks(t);
        kvp_tokenizer_free(t);
    }
    return unit_done();
}
