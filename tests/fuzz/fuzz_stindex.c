/* fuzz_stindex.c - libFuzzer harness: model.safetensors.index.json (the
 * shard list of a sharded HF checkpoint) on arbitrary bytes.  The index is
 * only read from a folder, so the harness keeps one scratch folder holding
 * two small valid shards and writes each input as the index there; the
 * folder is removed at exit. */
#define _POSIX_C_SOURCE 200809L
#include "safetensors.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[256];          /* the scratch folder, "" until made */
static char index_path[300];

static void cleanup(void)
{
    char p[320];
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    unlink(p);
    unlink(index_path);
    rmdir(dir);
}

/* A shard: u64 header length, the JSON header, then the data bytes. */
static int write_shard(const char *name, const char *header, size_t data_bytes)
{
    char p[320];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f)
        return -1;
    uint64_t n = strlen(header);
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)(n >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(header, 1, n, f);
    for (size_t i = 0; i < data_bytes; i++)
        fputc((int)(i & 0xff), f);
    return fclose(f);
}

static int setup(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/kvp-fuzz-stindex-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(dir))
        return -1;
    snprintf(index_path, sizeof index_path, "%s/model.safetensors.index.json", dir);
    atexit(cleanup);
    if (write_shard("model-00001-of-00002.safetensors",
                    "{\"__metadata__\":{\"format\":\"pt\"},\"a.weight\":{\"dtype\":\"F32\",\"shape\":[2,2],"
                    "\"data_offsets\":[0,16]},\"b.weight\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[16,24]}}",
                    24) ||
        write_shard("model-00002-of-00002.safetensors",
                    "{\"c.weight\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]},"
                    "\"step\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[4,12]}}",
                    12))
        return -1;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!dir[0] && setup() != 0)
        abort(); /* the harness itself cannot run */
    FILE *f = fopen(index_path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0)
        abort();
    kvp_safetensors st;
    kvp_err err = {0};
    if (kvp_safetensors_open(&st, index_path, &err) != 0) {
        if (err.code >= 0 || !err.msg[0])
            abort();
        return 0;
    }
    for (uint64_t i = 0; i < st.n_tensors; i++) {
        const kvp_safetensors_tensor *t = &st.tensors[i];
        if (t->shard >= st.n_files || kvp_safetensors_find(&st, t->name) != t)
            abort();
        if (t->nbytes) {
            (void)*(volatile const uint8_t *)t->data;
            (void)*((volatile const uint8_t *)t->data + t->nbytes - 1);
        }
    }
    kvp_safetensors_close(&st);
    return 0;
}
