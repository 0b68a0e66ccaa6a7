/* fuzz_tokjson.c - libFuzzer harness: an HF tokenizer.json (arbitrary bytes)
 * through kvp_json_parse, kvp_tokenizer_meta_from_json and
 * kvp_tokenizer_load_meta; when it loads, a fixed text is encoded and
 * decoded. */
#include "json.h"
#include "meta.h"
#include "tokenizer.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char sample[] = "<|im_start|>user\nThe cat's 12345 r\xc3\xa9sum\xc3\xa9s  \t\xff!</s> x<|im_end|>";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvp_json *j;
    kvp_err err = {0};
    if (kvp_json_parse(&j, (const char *)data, size, "<fuzz>", &err) != 0)
        return 0;
    kvp_meta m;
    kvp_meta_init(&m);
    int rc = kvp_tokenizer_meta_from_json(&m, j, "<fuzz>", &err);
    kvp_json_free(j);
    kvp_tokenizer *t = NULL;
    if (rc == 0)
        rc = kvp_tokenizer_load_meta(&t, &m, "<fuzz>", &err);
    kvp_meta_free(&m);
    if (rc != 0) {
        if (rc > 0 || !err.msg[0])
            abort();
        return 0;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    if (kvp_tokenizer_encode(t, sample, sizeof sample - 1, 1, -1, &ids, &n, &err) == 0) {
        kvp_buf out;
        kvp_buf_init(&out);
        kvp_tokenizer_decode(t, ids, n, KVP_DETOK_SPECIAL, &out, &err);
        kvp_buf_free(&out);
        free(ids);
    }
    kvp_tokenizer_free(t);
    return 0;
}
