/* fuzz_hfconfig.c - libFuzzer harness: an HF config.json (arbitrary bytes)
 * to a model config, through kvp_json_parse and kvp_config_from_hf_json.  A
 * config that is accepted must survive the trip through a KVP CONFIG record
 * (quantize writes one from config.json; prefill and decode read it back).
 * Its quantization_config goes through kvp_hfq_parse (lib/model/hfquant.h)
 * whatever the rest gave: refused with a message, or described. */
#include "config.h"
#include "hfquant.h"
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
    kvp_hfq q;
    kvp_err qerr = {0};
    rc = kvp_hfq_parse(&q, j, "<fuzz>", &qerr);
    if (rc == 0) {
        char buf[512];
        kvp_hfq_describe(&q, buf, sizeof buf);
        kvp_hfq_cap_format(&q, buf, sizeof buf);
        if (q.method != KVP_HFQ_NONE && (q.n_schemes == 0 || q.n_schemes > KVP_HFQ_MAX_SCHEMES))
            abort();
    } else if (rc > 0 || !qerr.msg[0] || q.method != KVP_HFQ_NONE) {
        abort();
    }
    kvp_json_free(j);
    return 0;
}
