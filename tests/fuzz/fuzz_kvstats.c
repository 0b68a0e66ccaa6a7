/* fuzz_kvstats.c - libFuzzer harness: kvcalc --check's reader of decode's
 * --stats JSON (kvp_cap_run_parse), then the check itself.  A refused input
 * must give a negative code and a message; an accepted one must hold the
 * ranges the reader promises and be checkable against a real model shape
 * (SmolLM2-135M) under each way of sizing the pool, with every row's verdict
 * following its rule. */
#include "capacity_check.h"
#include "presets.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvp_cap_run r;
    kvp_err err = {0};
    int rc = kvp_cap_run_parse(&r, (const char *)data, size, "<fuzz>", &err);
    if (rc) {
        if (rc > 0 || !err.msg[0])
            abort();
        return 0;
    }
    if (r.block_size == 0 || (r.block_size & (r.block_size - 1)) || r.kv_blocks == 0 || r.kv_block_bytes == 0 ||
        r.peak_running > r.max_num_seqs || r.max_seq_len > r.prompt_tokens + r.output_tokens ||
        strlen(r.fingerprint) != 32 || r.pool < 0 || r.pool > KVP_CAP_POOL_CONTEXT ||
        (r.pool == KVP_CAP_POOL_MEM) != r.has_kv_mem)
        abort();
    kvp_cap_params p;
    kvp_cap_params_init(&p);
    const kvp_model_preset *m = kvp_preset_model_find("smollm2-135m");
    if (!m)
        abort();
    p.cfg = m->cfg;
    p.block_size = r.block_size;
    if (kvp_cap_kv_fmt(r.kv_dtype, &p.kv_fmt, &err))
        abort(); /* the reader accepted a dtype kvcalc does not know */
    for (int pool = KVP_CAP_POOL_MEM; pool <= KVP_CAP_POOL_CONTEXT; pool++) {
        kvp_cap_check c;
        if (kvp_cap_check_run(&p, pool, r.has_kv_mem ? r.kv_mem : 1, &r, &c, &err))
            abort();
        uint32_t failed = 0;
        for (int i = 0; i < KVP_CAP_CHECK_ROWS; i++) {
            const kvp_cap_check_row *w = &c.row[i];
            int ok = w->rule == KVP_CAP_RULE_EQUAL     ? w->measured == w->predicted
                     : w->rule == KVP_CAP_RULE_AT_MOST ? w->measured <= w->predicted
                                                       : 1;
            if (!w->field || ok != w->ok || (!w->has_predicted && w->rule != KVP_CAP_RULE_INFO))
                abort();
            failed += !ok;
        }
        if (failed != c.n_failed || c.pool_bytes != c.n_blocks * c.block_bytes)
            abort();
    }
    return 0;
}
