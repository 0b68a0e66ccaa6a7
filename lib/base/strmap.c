/* strmap.c - a set of byte strings with a value each (strmap.h). */
#include "strmap.h"
#include "error.h"
#include "hash.h"

#include <stdlib.h>
#include <string.h>

struct kvp_strmap_slot {
    uint64_t val;
    size_t len;
    char key[]; /* len bytes */
};

void kvp_strmap_init(kvp_strmap *m) { memset(m, 0, sizeof *m); }

void kvp_strmap_free(kvp_strmap *m)
{
    for (size_t i = 0; i < m->cap; i++)
        free(m->slot[i]);
    free(m->slot);
    memset(m, 0, sizeof *m);
}

/* The slot of key, or of the empty place where it would go. */
static size_t find(const kvp_strmap *m, const char *key, size_t len)
{
    size_t i = (size_t)kvp_xxh64(key, len, 0) & (m->cap - 1);
    while (m->slot[i] && (m->slot[i]->len != len || memcmp(m->slot[i]->key, key, len) != 0))
        i = (i + 1) & (m->cap - 1);
    return i;
}

int kvp_strmap_has(const kvp_strmap *m, const char *key, size_t len)
{
    return m->cap && m->slot[find(m, key, len)] != NULL;
}

static int grow(kvp_strmap *m)
{
    size_t cap = m->cap ? m->cap * 2 : 256;
    kvp_strmap g = {calloc(cap, sizeof *g.slot), cap, m->n};
    if (!g.slot)
        return KVP_ENOMEM;
    for (size_t i = 0; i < m->cap; i++)
        if (m->slot[i])
            g.slot[find(&g, m->slot[i]->key, m->slot[i]->len)] = m->slot[i];
    free(m->slot);
    *m = g;
    return 0;
}

int kvp_strmap_add(kvp_strmap *m, const char *key, size_t len, uint64_t val, uint64_t *old)
{
    if ((m->n + 1) * 2 > m->cap && grow(m) < 0)
        return KVP_ENOMEM;
    size_t i = find(m, key, len);
    if (m->slot[i]) {
        if (old)
            *old = m->slot[i]->val;
        return 0;
    }
    kvp_strmap_slot *e = malloc(sizeof *e + len);
    if (!e)
        return KVP_ENOMEM;
    e->val = val;
    e->len = len;
    memcpy(e->key, key, len);
    m->slot[i] = e;
    m->n++;
    return 1;
}
