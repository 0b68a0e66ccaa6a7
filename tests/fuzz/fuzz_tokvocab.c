/* fuzz_tokvocab.c - libFuzzer harness: a tokenizer loaded from an arbitrary
 * vocabulary.  The input is a kvp(5) metadata list (what a KVP TOKENIZER
 * record or a GGUF header gives: tokenizer.ggml.*); when it loads, a fixed
 * text with control tokens, digits, spaces and invalid UTF-8 is encoded and
 * decoded, and every id's text and piece is read. */
#include "meta.h"
#include "tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char sample[] = "<|im_start|>user\nThe cat's 12345 r\xc3\xa9sum\xc3\xa9s  \t\xff\xfe!<s></s>\xe2\x96\x81 x<|im_end|>";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvp_meta m;
    kvp_err err = {0};
    if (kvp_meta_decode(&m, data, size, &err) != 0)
        return 0;
    kvp_tokenizer *t;
    int rc = kvp_tokenizer_load_meta(&t, &m, "<fuzz>", &err);
    kvp_meta_free(&m);
    if (rc != 0) {
        if (rc > 0 || !err.msg[0] || t)
            abort();
        return 0;
    }
    size_t nv = kvp_tokenizer_n_vocab(t);
    for (size_t i = 0; i < nv; i++) {
        size_t len;
        (void)kvp_tokenizer_token_text(t, (int32_t)i, &len);
        (void)kvp_tokenizer_piece(t, (int32_t)i, &len);
        (void)kvp_tokenizer_token_type(t, (int32_t)i);
    }
    for (int special = 0; special < 2; special++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (kvp_tokenizer_encode(t, sample, sizeof sample - 1, special, -1, &ids, &n, &err) != 0) {
            if (!err.msg[0])
                abort();
            continue; /* e.g. SentencePiece with no <unk> and no byte tokens */
        }
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || (size_t)ids[i] >= nv)
                abort();
        kvp_buf out;
        kvp_buf_init(&out);
        kvp_tokenizer_decode(t, ids, n, KVP_DETOK_SPECIAL, &out, &err);
        kvp_buf_free(&out);
        free(ids);
    }
    kvp_tokenizer_free(t);
    return 0;
}
