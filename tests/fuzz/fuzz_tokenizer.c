/* fuzz_tokenizer.c - libFuzzer harness: the tokenizer on arbitrary bytes.
 * The first byte picks one of five small vocabularies (tokvocab.h: byte-level
 * BPE with each pre-tokenizer, or SentencePiece) and whether control tokens
 * are parsed; the rest is the text.  Encode, then decode the ids whole and
 * one by one through the streaming detokenizer: both must give the same
 * bytes, and byte-level BPE (every byte in its vocabulary, no specials
 * parsed) must give back the text exactly. */
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int k = data[0] % N_TOK, special = (data[0] >> 4) & 1;
    const kvp_tokenizer *t = get_tok(k);
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
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
    if (k < N_TOK - 1 && !special && !bos && (whole.len != len || (len && memcmp(whole.data, text, len) != 0))) {
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
