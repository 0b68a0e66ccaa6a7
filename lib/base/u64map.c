/* u64map.c - 64-bit keys to values (u64map.h). */
#include "u64map.h"
#include "error.h"

#include <stdlib.h>

void kvp_u64map_free(kvp_u64map *m)
{
    free(m->key);
    free(m->val);
    *m = (kvp_u64map){0};
}

int64_t kvp_u64map_get(const kvp_u64map *m, uint64_t k)
{
    if (k == 0)
        return m->has_zero ? m->zero_val : -1;
    if (!m->cap)
        return -1;
    for (size_t i = k & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (m->key[i] == k)
            return m->val[i];
        if (!m->key[i])
            return -1;
    }
}

/* k (not 0) into a table with room for it. */
static void place(kvp_u64map *m, uint64_t k, int64_t v)
{
    size_t i = k & (m->cap - 1);
    while (m->key[i] && m->key[i] != k)
        i = (i + 1) & (m->cap - 1);
    m->n += !m->key[i];
    m->key[i] = k;
    m->val[i] = v;
}

int kvp_u64map_put(kvp_u64map *m, uint64_t k, int64_t v)
{
    if (k == 0) {
        m->has_zero = 1;
        m->zero_val = v;
        return 0;
    }
    if ((m->n + 1) * 2 > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 64;
        kvp_u64map g = {.key = calloc(cap, sizeof *g.key), .val = calloc(cap, sizeof *g.val), .cap = cap,
                        .has_zero = m->has_zero, .zero_val = m->zero_val};
        if (!g.key || !g.val) {
            free(g.key);
            free(g.val);
            return KVP_ENOMEM;
        }
        for (size_t i = 0; i < m->cap; i++)
            if (m->key[i])
                place(&g, m->key[i], m->val[i]);
        free(m->key);
        free(m->val);
        *m = g;
    }
    place(m, k, v);
    return 0;
}
