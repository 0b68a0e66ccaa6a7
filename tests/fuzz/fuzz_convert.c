/* fuzz_convert.c - libFuzzer harness: quantize's model conversion
 * (kvp_convert_open, kvp_convert_plan, kvp_convert_write) on an arbitrary
 * file: a GGUF, a KVP model or tensor stream, or a safetensors file, which
 * here is always bare (the scratch folder holds no config.json).  Opening
 * runs kvp_model_check on whatever config and tokenizer the file has; the
 * plan is int4 in groups of 32 (so the group and f16 fallbacks run too); the
 * output goes to /dev/null.  Seeds: corpus/convert/. */
#define _POSIX_C_SOURCE 200809L
#include "convert.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[300], file[340];

static void cleanup(void)
{
    unlink(file);
    rmdir(dir);
}

/* data as the one file of a private scratch folder (made once). */
static const char *scratch(const uint8_t *data, size_t size)
{
    if (!dir[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/kvp-fuzz-convert-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
        if (!mkdtemp(dir))
            abort();
        snprintf(file, sizeof file, "%s/in.safetensors", dir);
        atexit(cleanup);
    }
    FILE *f = fopen(file, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0)
        abort();
    return file;
}

static void expect_error(int rc, const kvp_err *err)
{
    if (rc >= 0 || err->code >= 0 || !err->msg[0])
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = scratch(data, size);
    kvp_convert *cv;
    kvp_err err = {0};
    int rc = kvp_convert_open(&cv, path, &err);
    if (rc != 0) {
        expect_error(rc, &err);
        if (cv)
            abort();
        return 0;
    }
    kvp_convert_opts o;
    kvp_convert_opts_init(&o);
    o.to = KVP_DTYPE_I4;
    o.group = 32;
    o.scheme = KVP_SCHEME_GROUP;
    if ((rc = kvp_convert_plan(cv, &o, &err)) != 0) {
        expect_error(rc, &err);
    } else {
        kvp_out out;
        if ((rc = kvp_out_open(&out, "/dev/null", &err)) != 0)
            abort();
        if ((rc = kvp_convert_write(cv, &out, 0, "fuzz", NULL, NULL, NULL, &err)) == 0)
            rc = kvp_out_commit(&out, &err);
        else
            kvp_out_abort(&out);
        if (rc != 0)
            expect_error(rc, &err);
    }
    kvp_convert_free(cv);
    return 0;
}
