/* strmap.h - a set of byte strings, each with a 64-bit value: the ids a
 * results file already holds (lib/engine/results.c), the tensor names a
 * KVP stream has carried and their records (lib/format/stream.c).  Open
 * addressing, at most half full; keys are copied. */
#ifndef KVP_STRMAP_H
#define KVP_STRMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvp_strmap_slot kvp_strmap_slot;

typedef struct kvp_strmap {
    kvp_strmap_slot **slot; /* [cap], NULL empty; cap a power of two */
    size_t cap, n;
} kvp_strmap;

void kvp_strmap_init(kvp_strmap *m);
void kvp_strmap_free(kvp_strmap *m);
/* Add key[0..len) with val: 1; 0 when it is there already (*old, when not
 * NULL, gets the value it was added with); or KVP_ENOMEM. */
int kvp_strmap_add(kvp_strmap *m, const char *key, size_t len, uint64_t val, uint64_t *old);
int kvp_strmap_has(const kvp_strmap *m, const char *key, size_t len);

#endif
