/* capacity_load.c - a model's shape for kvcalc from whatever file holds it:
 * GGUF (header and tensor table), KVP (its CONFIG record) or HF config.json.
 */
#include "capacity.h"

#include "gguf.h"
#include "hfquant.h"
#include "io.h"
#include "json.h"
#include "stream.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int load_gguf(const char *path, kvp_cap_model_file *out, kvp_err *err)
{
    kvp_gguf g;
    int rc = kvp_gguf_open(&g, path, err);
    if (rc)
        return rc;
    kvp_config_init(&out->cfg);
    rc = kvp_config_from_meta(&out->cfg, &g.meta, path, err);
    if (!rc) {
        /* GGUF ties embeddings by leaving output.weight out */
        if (!kvp_meta_find(&g.meta, "kvpipe.tied_embeddings"))
            out->cfg.tied_embeddings = kvp_gguf_find(&g, "output.weight") == NULL;
        /* bytes by GGUF type; the largest share names the weight format */
        uint64_t by_type[64] = {0};
        for (uint64_t i = 0; i < g.n_tensors; i++) {
            out->weight_bytes += g.tensors[i].nbytes;
            if (g.tensors[i].ggml_type < 64 && g.tensors[i].n_dims >= 2)
                by_type[g.tensors[i].ggml_type] += g.tensors[i].nbytes;
        }
        uint32_t best = 0;
        for (uint32_t t = 1; t < 64; t++)
            if (by_type[t] > by_type[best])
                best = t;
        if (by_type[best])
            snprintf(out->weight_type, sizeof out->weight_type, "%s", kvp_gguf_type_name(best));
        snprintf(out->kind, sizeof out->kind, "gguf");
        char key[64];
        uint64_t q;
        snprintf(key, sizeof key, "%s.attention.q_lora_rank", out->cfg.arch);
        if (kvp_meta_get_u64(&g.meta, key, &q) == 0 && q <= 65536)
            out->q_lora_rank = (uint32_t)q;
    }
    kvp_gguf_close(&g);
    return rc;
}

static int load_kvp(const char *path, kvp_cap_model_file *out, kvp_err *err)
{
    kvp_in in;
    int rc = kvp_in_open(&in, path, err);
    if (rc)
        return rc;
    kvp_reader *r = NULL;
    rc = kvp_reader_open(&r, &in, err);
    kvp_record rec;
    int found = 0;
    /* Read to the end, so a file cut short is refused, but skim the tensors:
     * their payloads are most of a model and kvcalc needs none of them. */
    if (!rc)
        kvp_reader_skim(r, 1u << KVP_KIND_TENSOR);
    while (!rc) {
        int n = kvp_reader_next(r, &rec, err);
        if (n < 0) {
            rc = n;
            break;
        }
        if (n == 0)
            break;
        if (rec.kind != KVP_KIND_CONFIG || found)
            continue;
        kvp_meta m;
        kvp_meta_init(&m);
        rc = kvp_meta_record_decode(&rec, &m, err);
        if (!rc) {
            kvp_config_init(&out->cfg);
            rc = kvp_config_from_meta(&out->cfg, &m, path, err);
        }
        kvp_meta_free(&m);
        found = 1;
    }
    if (!rc && !found)
        rc = kvp_err_set(err, KVP_ENOTFOUND, "%s: no CONFIG record: not a model file", path);
    if (!rc)
        snprintf(out->kind, sizeof out->kind, "kvp");
    kvp_reader_free(r);
    kvp_in_close(&in);
    return rc;
}

/* HF: the shape from kvp_config_from_hf, plus MLA's q_lora_rank and the
 * weight format a quantization_config gives (hfquant.h; one it cannot read
 * is an error naming the field, as the loader's would be). */
static int load_hf(const char *path, int is_dir, kvp_cap_model_file *out, kvp_err *err)
{
    int rc = kvp_config_from_hf(&out->cfg, path, err);
    if (rc)
        return rc;
    snprintf(out->kind, sizeof out->kind, "hf");
    char file[4096];
    if (snprintf(file, sizeof file, is_dir ? "%s/config.json" : "%s", path) >= (int)sizeof file)
        return 0;
    kvp_json *j = NULL;
    uint64_t q;
    if (kvp_json_parse_file(&j, file, 16u << 20, NULL) == 0 && kvp_json_get_u64(j, "q_lora_rank", &q) == 0 &&
        q <= 65536)
        out->q_lora_rank = (uint32_t)q;
    /* a quantized checkpoint: its linear layers' format (GPTQ, AWQ, compressed-tensors) */
    kvp_hfq hq;
    if (j && (rc = kvp_hfq_parse(&hq, j, file, err)) == 0)
        kvp_hfq_cap_format(&hq, out->weight_type, sizeof out->weight_type);
    kvp_json_free(j);
    return rc;
}

int kvp_cap_load_model(const char *path, kvp_cap_model_file *out, kvp_err *err)
{
    memset(out, 0, sizeof *out);
    struct stat st;
    if (stat(path, &st) != 0)
        return kvp_err_set(err, KVP_EIO, "%s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode))
        return load_hf(path, 1, out, err);
    /* sniff the first bytes: GGUF, KVP, else JSON */
    uint8_t head[8] = {0};
    FILE *f = fopen(path, "rb");
    if (!f)
        return kvp_err_set(err, KVP_EIO, "%s: %s", path, strerror(errno));
    size_t n = fread(head, 1, sizeof head, f);
    int read_err = ferror(f);
    fclose(f);
    if (read_err)
        return kvp_err_set(err, KVP_EIO, "%s: read failed", path);
    if (n >= 4 && memcmp(head, "GGUF", 4) == 0)
        return load_gguf(path, out, err);
    if (n >= 4 && memcmp(head + 1, "KVP", 3) == 0)
        return load_kvp(path, out, err);
    size_t i = 0;
    while (i < n && (head[i] == ' ' || head[i] == '\n' || head[i] == '\r' || head[i] == '\t'))
        i++;
    if (i < n && head[i] == '{')
        return load_hf(path, 0, out, err);
    return kvp_err_set(err, KVP_EFORMAT, "%s: not a model file (GGUF, KVP, or HF config.json)", path);
}
