/* fuzz_hfconfig.c - libFuzzer harness: an HF config.json (arbitrary bytes)
 * to a model config, through kvp_json_parse and kvp_config_from_hf_json.  A
 * config that is accepted must survive the trip through a KVP CONFIG record
 * (quantize writes one from config.json; prefill and decode read it back). */
#include "config.h"
#include "json.h"

#include "config_rt.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvp_json *j;
    kvp_err err = {0};
    if (kvp_json_parse(&j, (const char *)data, size, "<fuzz>", &err) != 0)
        return 0;
    kvp_config c;
    int rc = kvp_config_from_hf_json(&c, j, "<fuzz>", &err);
    if (rc == 0) {
        (void)kvp_config_kv_elems_per_token_layer(&c);
        config_round_trip(&c);
    } else if (rc > 0 || !err.msg[0]) {
        abort();
    }
    kvp_json_free(j);
    return 0;
}
