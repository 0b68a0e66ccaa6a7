/* owned.c - blocks of memory freed together (owned.h). */
#include "owned.h"

#include <stdlib.h>
#include <string.h>

void *kvp_owned_alloc(kvp_owned *o, uint64_t bytes)
{
    if (bytes > SIZE_MAX - 64)
        return NULL;
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 16;
        void **p = realloc(o->p, cap * sizeof *p);
        if (!p)
            return NULL;
        o->p = p;
        o->cap = cap;
    }
    size_t n = ((size_t)bytes + 63) & ~(size_t)63;
    void *b = aligned_alloc(64, n ? n : 64);
    if (!b)
        return NULL;
    memset(b, 0, n ? n : 64);
    o->p[o->n++] = b;
    return b;
}

void kvp_owned_free(kvp_owned *o)
{
    for (size_t i = 0; i < o->n; i++)
        free(o->p[i]);
    free(o->p);
    memset(o, 0, sizeof *o);
}
