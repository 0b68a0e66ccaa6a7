/* owned.h - blocks of memory freed together: the copies, widened scales and
 * converted tensors a loaded model keeps beside its mapped file. */
#ifndef KVP_OWNED_H
#define KVP_OWNED_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvp_owned {
    void **p;
    size_t n, cap;
} kvp_owned;

/* bytes of 64-byte aligned, zeroed memory, kept in o until kvp_owned_free;
 * NULL when out of memory. */
void *kvp_owned_alloc(kvp_owned *o, uint64_t bytes);
/* Free every block and the list; o is empty again. */
void kvp_owned_free(kvp_owned *o);

#endif
