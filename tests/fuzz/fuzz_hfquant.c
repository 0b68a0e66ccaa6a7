/* fuzz_hfquant.c - libFuzzer harness: a quantized checkpoint's tensors
 * (lib/model/hfquant.h).  Input: one byte choosing a quantization_config
 * from the list below, then a safetensors file image.  An import that
 * succeeds must describe every weight consistently (data bytes as dtype and
 * shape imply, scales as the scheme implies) and dequantize without reading
 * outside what it points to; one that fails must say why.  Seeds: the
 * golden tiny checkpoints of tests/golden/hfquant/ behind their config's
 * byte, kept with the other model files in tests/golden/fuzz-seeds/hfquant/. */
#include "hfquant.h"
#include "json.h"
#include "quant.h"
#include "safetensors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const configs[] = {
    "{\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"pack-quantized\","
    "\"config_groups\":{\"g\":{\"targets\":[\"Linear\"],\"weights\":{\"num_bits\":4,\"symmetric\":false,"
    "\"strategy\":\"group\",\"group_size\":32,\"actorder\":\"group\"}}}}}",
    "{\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"pack-quantized\","
    "\"config_groups\":{\"g\":{\"targets\":[\"re:.*proj$\"],\"weights\":{\"num_bits\":8,\"strategy\":\"channel\"}}}}}",
    "{\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"int-quantized\","
    "\"config_groups\":{\"g\":{\"targets\":[\"Linear\"],\"weights\":{\"num_bits\":8,\"symmetric\":false,"
    "\"strategy\":\"channel\"}}}}}",
    "{\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"float-quantized\","
    "\"config_groups\":{\"g\":{\"targets\":[\"Linear\"],\"weights\":{\"num_bits\":8,\"type\":\"float\","
    "\"strategy\":\"tensor\"}}}}}",
    "{\"quantization_config\":{\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":32,\"desc_act\":true}}",
    "{\"quantization_config\":{\"quant_method\":\"gptq\",\"bits\":8,\"group_size\":-1,"
    "\"checkpoint_format\":\"gptq_v2\"}}",
    "{\"quantization_config\":{\"quant_method\":\"awq\",\"bits\":4,\"group_size\":32,\"version\":\"gemm\"}}",
    "{\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"nvfp4-pack-quantized\","
    "\"config_groups\":{\"g\":{\"targets\":[\"Linear\"],\"weights\":{\"num_bits\":4,\"type\":\"float\","
    "\"strategy\":\"tensor_group\",\"group_size\":16}}}}}",
};

static void check_tensor(const kvp_hfq_tensor *t)
{
    if (kvp_tensor_data_bytes(&t->rec) != (int64_t)t->rec.data_bytes || !t->data)
        abort();
    int64_t ns = kvp_tensor_scale_count(&t->rec);
    if (ns < 0 || (uint64_t)ns * 4 != t->rec.scales_bytes || (ns && !t->scales) ||
        ((t->rec.flags & KVP_TENSOR_ASYM) && !t->zeros))
        abort();
    uint64_t n = kvp_tensor_numel(&t->rec);
    float *y = malloc(n * sizeof *y);
    kvp_err err = {0};
    if (y && kvp_dequant_tensor(&t->rec, t->data, t->scales, t->zeros, y, NULL, &err) != 0)
        abort();
    free(y);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const char *cfg = configs[data[0] % (sizeof configs / sizeof configs[0])];
    kvp_json *j;
    kvp_err err = {0};
    kvp_hfq q;
    if (kvp_json_parse(&j, cfg, strlen(cfg), "config.json", &err) != 0 || kvp_hfq_parse(&q, j, "config.json", &err))
        abort();
    kvp_safetensors st;
    if (kvp_safetensors_open_mem(&st, data + 1, size - 1, "<fuzz>", &err) == 0) {
        kvp_hfq_set s;
        int rc = kvp_hfq_import(&s, &q, &st, "<fuzz>", &err);
        if (rc == 0) {
            for (size_t i = 0; i < s.n; i++)
                check_tensor(&s.t[i]);
            kvp_hfq_set_free(&s);
        } else if (rc > 0 || !err.msg[0]) {
            abort();
        }
        kvp_safetensors_close(&st);
    }
    kvp_json_free(j);
    return 0;
}
