/* fuzz_tokenizer.c - libFuzzer harness: the tokenizer on arbitrary bytes.
 * The first byte picks one of five small vocabularies (tokvocab.h: byte-level
 * BPE with each pre-tokenizer, or SentencePiece), whether control tokens
 * are parsed, the detokenizer flags, and (top bit) special spans: then the
 * second byte is a stride, and the text is cut into stretches of that many
 * bytes, every other one a span where control tokens are parsed (markers
 * that straddle a span's edge must stay text).  The rest is the text.
 * Encode, then decode the ids whole and one by one through the streaming
 * detokenizer: both must give the same bytes.  Byte-level BPE (every byte in
 * its vocabulary) must give back the text exactly: without the special
 * tokens' text when none are parsed, with it (KVP_DETOK_SPECIAL) when they
 * are, and then each control token must lie inside a span.  Spans covering
 * all of the text or none must give what parse_special 1 or 0 gives. */
#include "tokenizer.h"
#include "tokvocab.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define N_TOK 5
static kvp_tokenizer *toks[N_TOK]; /* built once, read-only after */

static kvp_tokenizer *get_tok(int k)
{
    static const char *const pre[N_TOK - 1] = {"gpt2", "smollm", "llama-bpe", "qwen2"};
    if (toks[k])
        return toks[k];
    kvp_meta m;
    kvp_meta_init(&m);
    kvp_err err = {0};
    if ((k < N_TOK - 1 ? tv_gpt2(&m, pre[k]) : tv_spm(&m)) != 0 ||
        kvp_tokenizer_load_meta(&toks[k], &m, "<fuzz vocab>", &err) != 0) {
        fprintf(stderr, "fuzz_tokenizer: vocabulary %d: %s\n", k, err.msg);
        abort();
    }
    kvp_meta_free(&m);
    return toks[k];
}

/* Spans of stride bytes, every other one, from the second: [stride, 2 stride), ... */
static kvp_tok_span *make_spans(size_t len, size_t stride, size_t *n)
{
    kvp_tok_span *sp = malloc((len / stride / 2 + 1) * sizeof *sp);
    if (!sp)
        abort();
    *n = 0;
    for (size_t at = stride; at < len; at += 2 * stride)
        sp[(*n)++] = (kvp_tok_span){at, at + stride <= len ? stride : len - at};
    return sp;
}

static int ids_same(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

/* The spans checks: all/none agree with parse_special; control ids lie in
 * spans, found by walking the byte-level pieces over the text. */
static void check_spans(const kvp_tokenizer *t, int byte_level, const char *text, size_t len, size_t stride)
{
    kvp_err err = {0};
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    kvp_tok_span all = {0, len};
    for (int special = 0; special <= 1; special++) {
        if (kvp_tokenizer_encode(t, text, len, special, 0, &a, &na, &err) != 0 ||
            kvp_tokenizer_encode_spans(t, text, len, &all, (size_t)special, 0, &b, &nb, &err) != 0)
            abort();
        if (!ids_same(a, na, b, nb)) {
            fprintf(stderr, "spans covering %s differ from parse_special %d\n", special ? "all" : "none", special);
            abort();
        }
        free(a);
        free(b);
    }
    size_t n_sp;
    kvp_tok_span *sp = make_spans(len, stride, &n_sp);
    if (kvp_tokenizer_encode_spans(t, text, len, sp, n_sp, 0, &a, &na, &err) != 0)
        abort();
    kvp_buf out;
    kvp_buf_init(&out);
    if (kvp_tokenizer_decode(t, a, na, KVP_DETOK_SPECIAL, &out, &err) != 0)
        abort();
    if (byte_level) {
        if (out.len != len || (len && memcmp(out.data, text, len) != 0)) {
            fprintf(stderr, "byte-level round trip with spans: %zu bytes in, %zu out\n", len, out.len);
            abort();
        }
        size_t at = 0;
        for (size_t i = 0; i < na; i++) {
            size_t pl;
            (void)kvp_tokenizer_piece(t, a[i], &pl);
            kvp_token_type ty = kvp_tokenizer_token_type(t, a[i]);
            if (ty == KVP_TOKEN_CONTROL || ty == KVP_TOKEN_UNKNOWN) {
                size_t k = at / stride;
                if (k % 2 == 0 || (at + pl - 1) / stride != k) {
                    fprintf(stderr, "control token %d at byte %zu is outside the spans\n", (int)a[i], at);
                    abort();
                }
            }
            at += pl;
        }
    }
    kvp_buf_free(&out);
    free(a);
    free(sp);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int k = data[0] % N_TOK, special = (data[0] >> 4) & 1, spans = data[0] >> 7;
    const kvp_tokenizer *t = get_tok(k);
    if (spans && size < 2)
        return 0;
    const char *text = (const char *)data + 1 + spans;
    size_t len = size - 1 - (size_t)spans;
    if (spans)
        check_spans(t, k < N_TOK - 1, text, len, 1 + data[1] % 16u);
    int32_t *ids = NULL;
    size_t n = 0;
    kvp_err err = {0};
    if (kvp_tokenizer_encode(t, text, len, special, -1, &ids, &n, &err) != 0) {
        fprintf(stderr, "encode failed: %s\n", err.msg);
        abort(); /* any bytes are text */
    }
    size_t nv = kvp_tokenizer_n_vocab(t);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (size_t)ids[i] >= nv)
            abort();
    int flags = (data[0] >> 5) & 3;
    kvp_buf whole, stream;
    kvp_buf_init(&whole);
    kvp_buf_init(&stream);
    if (kvp_tokenizer_decode(t, ids, n, flags, &whole, &err) != 0)
        abort();
    kvp_detok d;
    kvp_detok_init(&d, t, flags);
    for (size_t i = 0; i < n; i++)
        if (kvp_detok_push(&d, ids[i], &stream, &err) != 0)
            abort();
    if (kvp_detok_flush(&d, &stream, &err) != 0)
        abort();
    if (whole.len != stream.len || (whole.len && memcmp(whole.data, stream.data, whole.len) != 0)) {
        fprintf(stderr, "whole decode (%zu bytes) and streaming decode (%zu bytes) differ\n", whole.len, stream.len);
        abort();
    }
    int bos = kvp_tokenizer_add_bos(t);
    /* byte-level: the text back, less the special tokens' text unless printed */
    int all_back = !special || (flags & KVP_DETOK_SPECIAL);
    if (k < N_TOK - 1 && all_back && !bos && (whole.len != len || (len && memcmp(whole.data, text, len) != 0))) {
        fprintf(stderr, "byte-level round trip: %zu bytes in, %zu out\n", len, whole.len);
        abort();
    }
    for (size_t i = 0; i < n; i++) {
        size_t plen;
        (void)kvp_tokenizer_piece(t, ids[i], &plen);
        (void)kvp_tokenizer_is_eog(t, ids[i]);
    }
    kvp_buf_free(&whole);
    kvp_buf_free(&stream);
    free(ids);
    return 0;
}
