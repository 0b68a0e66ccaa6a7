/* test_hfquant.c - quantized HF checkpoints (lib/model/hfquant.h) against
 * the reference package: each folder of tests/golden/hfquant/ (made by
 * scripts/ref/gen_hfquant.py) is imported, every quantized weight is
 * dequantized the way the kernels read it (y = (q - z) * s, f32) and must
 * equal compressed-tensors' own decompression bit for bit; then the scheme
 * each maps to, and bad configs and tensors that must fail naming the field
 * or tensor. */
#include "hfquant.h"
#include "json.h"
#include "minifloat.h"
#include "model.h"
#include "quant.h"
#include "safetensors.h"
#include "unit.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char golden[1024];

typedef struct expect {
    const char *dir;
    uint32_t dtype, scheme, group;
    int asym;           /* zero points kept */
    int in_place;       /* codes used where they lie */
    int bf16_ref;       /* the package returns bf16: compare our f32 rounded to bf16 */
} expect;

static const expect cases[] = {
    {"ct_w4a16_g32", KVP_DTYPE_I4, KVP_SCHEME_GROUP, 32, 0, 0, 0},
    {"ct_w4a16_g32_asym", KVP_DTYPE_I4, KVP_SCHEME_GROUP, 32, 1, 0, 0},
    {"ct_w8a16_channel", KVP_DTYPE_I8, KVP_SCHEME_CHANNEL, 0, 0, 0, 0},
    {"ct_w4_naive_asym", KVP_DTYPE_I4, KVP_SCHEME_GROUP, 32, 1, 0, 0},
    {"ct_w8a8_int8_asym", KVP_DTYPE_I8, KVP_SCHEME_CHANNEL, 0, 1, 1, 0},
    {"ct_fp8_tensor", KVP_DTYPE_FP8_E4M3, KVP_SCHEME_TENSOR, 0, 0, 1, 0},
    {"ct_fp8_channel", KVP_DTYPE_FP8_E4M3, KVP_SCHEME_CHANNEL, 0, 0, 1, 0},
    {"gptq_g32", KVP_DTYPE_I4, KVP_SCHEME_GROUP, 32, 1, 0, 0},
    {"awq_g32", KVP_DTYPE_I4, KVP_SCHEME_GROUP, 32, 1, 0, 0},
    {"gptq_desc_act", KVP_DTYPE_F32, KVP_SCHEME_NONE, 0, 0, 0, 0},
    {"gptq_8bit_channel", KVP_DTYPE_I8, KVP_SCHEME_CHANNEL, 0, 0, 0, 0},
    {"ct_nvfp4", KVP_DTYPE_FP4_E2M1, KVP_SCHEME_GROUP, 16, 0, 1, 1},
};

/* Every imported weight of one case equals ref.safetensors bit for bit. */
static void test_case(const expect *e)
{
    char dir[1200], path[1300];
    snprintf(dir, sizeof dir, "%s/%s", golden, e->dir);
    kvp_err err = {0};
    kvp_safetensors st, ref;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc = kvp_safetensors_open(&st, path, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc)
        return;
    snprintf(path, sizeof path, "%s/ref.safetensors", dir);
    if ((rc = kvp_safetensors_open(&ref, path, &err)) != 0) {
        CHECK_MSG(0, "%s", err.msg);
        kvp_safetensors_close(&st);
        return;
    }
    kvp_hfq_set s;
    char note[640];
    snprintf(path, sizeof path, "%s/config.json", dir);
    rc = kvp_hfq_open(&s, &st, path, note, sizeof note, &err);
    CHECK_MSG(rc == 0, "%s: %s", e->dir, err.msg);
    CHECK_EQ_U64(s.n, ref.n_tensors);
    CHECK_MSG(rc != 0 || strstr(note, "lm_head") == NULL, "%s", note); /* (the note names no ignored layer) */
    for (size_t i = 0; rc == 0 && i < s.n; i++) {
        const kvp_hfq_tensor *t = &s.t[i];
        const kvp_safetensors_tensor *r = kvp_safetensors_find(&ref, t->rec.name);
        CHECK_MSG(r != NULL, "%s: %s not in ref", e->dir, t->rec.name);
        if (!r)
            continue;
        CHECK_EQ_U64(t->rec.dtype, e->dtype);
        CHECK_EQ_U64(t->rec.scheme, e->scheme);
        CHECK_EQ_U64(t->rec.group, e->group);
        CHECK_EQ_U64((t->rec.flags & KVP_TENSOR_ASYM) != 0, e->asym);
        CHECK_EQ_U64(t->converted == 0 && t->dequantized == 0, e->in_place);
        CHECK_EQ_U64(kvp_tensor_data_bytes(&t->rec), t->rec.data_bytes);
        uint64_t n = kvp_tensor_numel(&t->rec);
        CHECK_EQ_U64(n, kvp_safetensors_nelems(r));
        float *y = malloc(n * sizeof *y);
        if (!y)
            break;
        rc = kvp_dequant_tensor(&t->rec, t->data, t->scales, t->zeros, y, NULL, &err);
        CHECK_MSG(rc == 0, "%s", err.msg);
        uint64_t diff = 0, first = n;
        for (uint64_t k = 0; rc == 0 && k < n; k++) {
            if (e->bf16_ref) /* rounded as torch rounds f32 to bf16 (to nearest even) */
                y[k] = kvp_bf16_to_f32(kvp_f32_to_bf16(y[k]));
            if (memcmp(&y[k], (const uint8_t *)r->data + 4 * k, 4) != 0 && diff++ == 0)
                first = k;
        }
        CHECK_MSG(diff == 0, "%s: %s: %llu of %llu values differ from compressed-tensors (first at %llu)", e->dir,
                  t->rec.name, (unsigned long long)diff, (unsigned long long)n, (unsigned long long)first);
        free(y);
    }
    /* lm_head is in "ignore" (and has no scales): loaded as it is */
    const kvp_safetensors_tensor *head = kvp_safetensors_find(&st, "lm_head.weight");
    CHECK(head && s.role && s.role[head - st.tensors] == KVP_HFQ_PLAIN);
    kvp_hfq_set_free(&s);
    kvp_safetensors_close(&ref);
    kvp_safetensors_close(&st);
}

/* ---- configs that must be refused, naming the field ---- */

static int parse_text(const char *text, kvp_hfq *q, kvp_err *err)
{
    kvp_json *j;
    int rc = kvp_json_parse(&j, text, strlen(text), "config.json", err);
    if (rc == 0) {
        rc = kvp_hfq_parse(q, j, "config.json", err);
        kvp_json_free(j);
    }
    return rc;
}

static void test_bad_configs(void)
{
    static const struct {
        const char *json, *field;
    } bad[] = {
        {"{\"quantization_config\":{\"quant_method\":\"bitsandbytes\"}}", "quant_method: 'bitsandbytes'"},
        {"{\"quantization_config\":{}}", "quant_method: missing"},
        {"{\"quantization_config\":7}", "quantization_config: expected an object"},
        {"{\"quantization_config\":{\"quant_method\":\"gptq\",\"bits\":3,\"group_size\":128}}", "bits: 3 bits"},
        {"{\"quantization_config\":{\"quant_method\":\"gptq\",\"group_size\":128}}", "bits: missing"},
        {"{\"quantization_config\":{\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":-5}}", "group size -5"},
        {"{\"quantization_config\":{\"quant_method\":\"gptq\",\"bits\":4,\"checkpoint_format\":\"marlin\"}}",
         "checkpoint_format: 'marlin'"},
        {"{\"quantization_config\":{\"quant_method\":\"awq\",\"bits\":4,\"version\":\"gemv\"}}", "version: 'gemv'"},
        {"{\"quantization_config\":{\"quant_method\":\"awq\",\"bits\":8}}", "GEMM layout is 4-bit"},
        {"{\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"pack-quantized\"}}",
         "config_groups: missing"},
        {"{\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"marlin-24\","
         "\"config_groups\":{\"g\":{\"targets\":[\"Linear\"],\"weights\":{\"num_bits\":4}}}}}",
         "format: 'marlin-24'"},
        {"{\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"pack-quantized\","
         "\"config_groups\":{\"g\":{\"targets\":[\"Linear\"],\"weights\":{\"num_bits\":2}}}}}",
         "config_groups.g.weights: 2 bits"},
        {"{\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"float-quantized\","
         "\"config_groups\":{\"g\":{\"targets\":[\"Linear\"],\"weights\":{\"num_bits\":8,\"type\":\"float\","
         "\"strategy\":\"block\",\"block_structure\":[128,128]}}}}}",
         "weights.strategy: 'block'"},
        {"{\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"nvfp4-pack-quantized\","
         "\"config_groups\":{\"g\":{\"targets\":[\"Linear\"],\"weights\":{\"num_bits\":4,\"type\":\"float\"}}}}}",
         "4-bit float weights other than NVFP4"},
        {"{\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"mxfp4-pack-quantized\","
         "\"config_groups\":{\"g\":{\"targets\":[\"Linear\"],\"weights\":{\"num_bits\":4,\"type\":\"float\"}}}}}",
         "format: 'mxfp4-pack-quantized'"},
        {"{\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"pack-quantized\","
         "\"config_groups\":{\"g\":{\"targets\":[\"Linear\"],\"weights\":{\"num_bits\":4,\"strategy\":\"group\"}}}}}",
         "group_size: a positive size"},
        {"{\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"pack-quantized\","
         "\"config_groups\":{\"g\":{\"weights\":{\"num_bits\":4}}}}}",
         "targets: missing"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvp_hfq q;
        kvp_err err = {0};
        int rc = parse_text(bad[i].json, &q, &err);
        CHECK_MSG(rc < 0 && strstr(err.msg, bad[i].field) && strstr(err.msg, "config.json"), "case %zu: rc %d: %s",
                  i, rc, err.msg);
        CHECK(q.method == KVP_HFQ_NONE);
    }
    kvp_hfq q;
    kvp_err err = {0};
    CHECK(parse_text("{\"quantization_config\":null}", &q, &err) == 0 && q.method == KVP_HFQ_NONE);
    CHECK(parse_text("{\"quantization_config\":{\"quant_method\":\"gptq\",\"bits\":8,\"group_size\":-1,"
                     "\"desc_act\":true}}", &q, &err) == 0);
    CHECK(q.method == KVP_HFQ_GPTQ && q.schemes[0].bits == 8 && q.schemes[0].strategy == KVP_SCHEME_CHANNEL &&
          q.schemes[0].act_order && q.gptq_v1);
    char buf[256];
    kvp_hfq_cap_format(&q, buf, sizeof buf);
    CHECK_STR(buf, "int8");
    /* compressed-tensors' defaults: symmetric, strategy tensor */
    CHECK(parse_text("{\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":"
                     "\"nvfp4-pack-quantized\",\"config_groups\":{\"g\":{\"targets\":[\"Linear\"],\"weights\":"
                     "{\"num_bits\":4,\"type\":\"float\",\"strategy\":\"tensor_group\",\"group_size\":16}}}}}",
                     &q, &err) == 0);
    CHECK(q.method == KVP_HFQ_CT && q.schemes[0].symmetric && q.schemes[0].is_float && q.schemes[0].group == 16);
    kvp_hfq_cap_format(&q, buf, sizeof buf);
    CHECK_STR(buf, "nvfp4");
    CHECK(parse_text("{\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":"
                     "\"naive-quantized\",\"config_groups\":{\"g\":{\"targets\":[\"Linear\"],\"weights\":"
                     "{\"num_bits\":8}}}}}", &q, &err) == 0);
    CHECK(q.schemes[0].symmetric && q.schemes[0].strategy == KVP_SCHEME_TENSOR && q.schemes[0].format == KVP_HFQ_FMT_NAIVE);
    CHECK(parse_text("{\"quantization_config\":{\"quant_method\":\"awq\",\"w_bit\":4,\"q_group_size\":128,"
                     "\"version\":\"GEMM\"}}", &q, &err) == 0);
    kvp_hfq_cap_format(&q, buf, sizeof buf);
    CHECK_STR(buf, "int4-g128");
}

/* ---- tensors that must be refused, naming the tensor ---- */

/* A one-file safetensors image of the given header JSON and data. */
static uint8_t *st_image(const char *header, const void *data, size_t n, size_t *size)
{
    size_t h = strlen(header);
    uint8_t *b = calloc(1, 8 + h + n);
    if (!b)
        return NULL;
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, header, h);
    memcpy(b + 8 + h, data, n);
    *size = 8 + h + n;
    return b;
}

/* GPTQ 4-bit, one module of 8 outputs x 64 inputs, group 32, with this g_idx. */
static int gptq_import(const int32_t *g_idx, int qweight_rows, kvp_err *err)
{
    uint8_t data[4096] = {0};
    int32_t *gi = (int32_t *)(data + 2048);
    memcpy(gi, g_idx, 64 * 4);
    char hdr[1024];
    /* qweight [64/8, 8] i32 at 0, qzeros [2, 1] at 256, scales [2, 8] f32 at 512, g_idx at 2048 */
    snprintf(hdr, sizeof hdr,
             "{\"m.qweight\":{\"dtype\":\"I32\",\"shape\":[%d,8],\"data_offsets\":[0,%d]},"
             "\"m.qzeros\":{\"dtype\":\"I32\",\"shape\":[2,1],\"data_offsets\":[256,264]},"
             "\"m.scales\":{\"dtype\":\"F32\",\"shape\":[2,8],\"data_offsets\":[512,576]},"
             "\"m.g_idx\":{\"dtype\":\"I32\",\"shape\":[64],\"data_offsets\":[2048,2304]}}",
             qweight_rows, qweight_rows * 32);
    size_t size;
    uint8_t *img = st_image(hdr, data, sizeof data, &size);
    kvp_safetensors st;
    int rc = kvp_safetensors_open_mem(&st, img, size, "bad.safetensors", err);
    if (rc == 0) {
        kvp_hfq q;
        kvp_json *j;
        const char *cfg = "{\"quantization_config\":{\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":32,"
                          "\"desc_act\":true}}";
        kvp_json_parse(&j, cfg, strlen(cfg), "config.json", err);
        kvp_hfq_parse(&q, j, "config.json", err);
        kvp_hfq_set s;
        rc = kvp_hfq_import(&s, &q, &st, "bad", err);
        if (rc == 0) {
            CHECK(s.n == 1 && s.t[0].rec.shape[0] == 8 && s.t[0].rec.shape[1] == 64);
            kvp_hfq_set_free(&s);
        }
        kvp_json_free(j);
        kvp_safetensors_close(&st);
    }
    free(img);
    return rc;
}

static void test_bad_tensors(void)
{
    int32_t g[64];
    kvp_err err = {0};
    for (int i = 0; i < 64; i++)
        g[i] = i / 32;
    CHECK_MSG(gptq_import(g, 8, &err) == 0, "%s", err.msg);
    g[5] = 1, g[40] = 0; /* a permutation still: desc_act order */
    CHECK_MSG(gptq_import(g, 8, &err) == 0, "%s", err.msg);
    g[7] = 2;
    CHECK(gptq_import(g, 8, &err) == KVP_EFORMAT);
    CHECK_MSG(strstr(err.msg, "m.g_idx") && strstr(err.msg, "element 7 is group 2"), "%s", err.msg);
    g[7] = 1; /* group 1 now has 33 columns */
    CHECK(gptq_import(g, 8, &err) == KVP_EFORMAT);
    CHECK_MSG(strstr(err.msg, "m.g_idx") && strstr(err.msg, "not a permutation"), "%s", err.msg);
    g[7] = 0;
    CHECK(gptq_import(g, 4, &err) == KVP_EFORMAT); /* qweight of 32 inputs: scales say 2 groups of 32 */
    CHECK_MSG(strstr(err.msg, "m.scales") || strstr(err.msg, "m.g_idx"), "%s", err.msg);

    /* compressed-tensors pack-quantized: packed size against weight_shape, and a missing scale */
    uint8_t data[1024] = {0};
    int64_t shape[2] = {8, 64};
    memcpy(data + 512, shape, sizeof shape);
    const char *cfg = "{\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"pack-quantized\","
                      "\"config_groups\":{\"g\":{\"targets\":[\"Linear\"],\"weights\":{\"num_bits\":4,\"strategy\":"
                      "\"channel\"}}}}}";
    static const char *const hdrs[] = {
        "{\"m.weight_packed\":{\"dtype\":\"I32\",\"shape\":[8,7],\"data_offsets\":[0,224]},"
        "\"m.weight_scale\":{\"dtype\":\"F32\",\"shape\":[8,1],\"data_offsets\":[256,288]},"
        "\"m.weight_shape\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[512,528]}}",
        "{\"m.weight_packed\":{\"dtype\":\"I32\",\"shape\":[8,8],\"data_offsets\":[0,256]},"
        "\"m.weight_shape\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[512,528]}}",
        "{\"m.weight_packed\":{\"dtype\":\"I32\",\"shape\":[8,8],\"data_offsets\":[0,256]},"
        "\"m.weight_scale\":{\"dtype\":\"F32\",\"shape\":[4,1],\"data_offsets\":[256,272]},"
        "\"m.weight_shape\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[512,528]}}",
    };
    static const char *const want[] = {"m.weight_packed: shape [8, 7]", "m.weight_scale is missing",
                                       "m.weight_scale: shape [4, 1]"};
    for (size_t i = 0; i < 3; i++) {
        size_t size;
        uint8_t *img = st_image(hdrs[i], data, sizeof data, &size);
        kvp_safetensors st;
        kvp_json *j;
        kvp_hfq q;
        kvp_hfq_set s;
        CHECK(kvp_safetensors_open_mem(&st, img, size, "bad.safetensors", &err) == 0);
        CHECK(kvp_json_parse(&j, cfg, strlen(cfg), "config.json", &err) == 0);
        CHECK(kvp_hfq_parse(&q, j, "config.json", &err) == 0);
        int rc = kvp_hfq_import(&s, &q, &st, "ckpt", &err);
        CHECK_MSG(rc < 0 && strstr(err.msg, want[i]) && strstr(err.msg, "ckpt"), "case %zu: %s", i, err.msg);
        kvp_json_free(j);
        kvp_safetensors_close(&st);
        free(img);
    }
}

int main(void)
{
    const char *t = getenv("KVP_TESTS");
    snprintf(golden, sizeof golden, "%s/golden/hfquant", t ? t : "tests");
    struct stat sb;
    if (stat(golden, &sb) != 0) {
        printf("%s: missing (run scripts/ref/gen_hfquant.py)\n", golden);
        CHECK(0);
        return unit_done();
    }
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        test_case(&cases[i]);
    test_bad_configs();
    test_bad_tensors();
    return unit_done();
}
