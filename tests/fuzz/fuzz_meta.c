/* fuzz_meta.c - libFuzzer harness: kvp_meta_decode (the payload of KVP
 * CONFIG and TOKENIZER records) on arbitrary bytes.  What decodes must
 * encode back to the very same bytes: the decoder is strict, so the
 * encoding is canonical. */
#include "meta.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvp_meta m;
    kvp_err err = {0};
    if (kvp_meta_decode(&m, data, size, &err) != 0) {
        if (err.code >= 0 || !err.msg[0] || m.n)
            abort(); /* a failure names itself and leaves m empty */
        kvp_meta_free(&m);
        return 0;
    }
    for (size_t i = 0; i < m.n; i++) {
        const kvp_meta_entry *e = &m.e[i];
        if (kvp_meta_find(&m, e->key) != e)
            abort();
        uint64_t u;
        int64_t s;
        double f;
        kvp_meta_get_u64(&m, e->key, &u);
        kvp_meta_get_i64(&m, e->key, &s);
        kvp_meta_get_f64(&m, e->key, &f);
        kvp_meta_get_str(&m, e->key);
        for (uint64_t j = 0; e->type == KVP_META_ARR_STR && j < e->n; j++) {
            size_t len;
            const char *p = kvp_meta_str_at(e, j, &len);
            if (!p || p[len] != '\0')
                abort();
        }
    }
    kvp_buf b;
    kvp_buf_init(&b);
    if (kvp_meta_encode(&m, &b) != 0 || b.len != size || memcmp(b.data, data, size) != 0)
        abort();
    kvp_buf_free(&b);
    kvp_meta_free(&m);
    return 0;
}
