/* fuzz_safetensors.c - libFuzzer harness: one safetensors file (u64 header
 * length, JSON header, data) on arbitrary bytes.  On success every tensor's
 * bytes must lie inside the input and be found again by name. */
#include "safetensors.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvp_safetensors st;
    kvp_err err = {0};
    if (kvp_safetensors_open_mem(&st, data, size, "<fuzz>", &err) != 0) {
        if (err.code >= 0 || !err.msg[0])
            abort();
        return 0;
    }
    for (uint64_t i = 0; i < st.n_tensors; i++) {
        const kvp_safetensors_tensor *t = &st.tensors[i];
        if (kvp_safetensors_find(&st, t->name) != t)
            abort();
        const uint8_t *p = t->data;
        if (p < data || t->nbytes > size || p - data > (ptrdiff_t)(size - t->nbytes))
            abort();
        if (t->nbytes) {
            (void)*(volatile const uint8_t *)p;
            (void)*(volatile const uint8_t *)(p + t->nbytes - 1);
        }
        int dtype;
        if (kvp_safetensors_dtype_size(t->dtype_name, &dtype) * kvp_safetensors_nelems(t) != t->nbytes)
            abort();
    }
    for (size_t i = 0; i < st.meta.n; i++)
        (void)kvp_meta_get_str(&st.meta, st.meta.e[i].key);
    kvp_safetensors_close(&st);
    return 0;
}
