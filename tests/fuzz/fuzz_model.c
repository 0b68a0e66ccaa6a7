/* fuzz_model.c - libFuzzer harness: the model loader (kvp_model_load) on an
 * arbitrary file: the GGUF or KVP reader, then the loader's own checks (the
 * architecture and config bounds, every weight's name, shape and type, the
 * RoPE table) and the tokenizer from the file's vocabulary.  The loader
 * takes a path, so each input is written to one scratch file (removed at
 * exit); seeds are complete tiny Llama GGUF files. */
#define _POSIX_C_SOURCE 200809L
#include "model.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "scratch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_scratch_write(data, size, "model");
    kvp_model *m;
    kvp_err err = {0};
    if (kvp_model_load(&m, path, &err) != 0) {
        if (err.code >= 0 || !err.msg[0] || m)
            abort();
        return 0;
    }
    kvp_tokenizer *t;
    if (kvp_model_load_tokenizer(m, &t, &err) == 0) {
        int32_t *ids;
        size_t n;
        if (kvp_tokenizer_encode(t, "hello the world 12", 18, 1, -1, &ids, &n, &err) == 0)
            free(ids);
        kvp_tokenizer_free(t);
    }
    char hex[33];
    kvp_model_fingerprint_hex(m, hex);
    kvp_model_free(m);
    return 0;
}
