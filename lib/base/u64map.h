/* u64map.h - a map from 64-bit keys (0 included) to values of 0 and up:
 * the KV blocks a stream has carried by hash, the sequence ids it has
 * named (lib/format/seqcheck.c), a reader's partial blocks
 * (lib/engine/seqio.c).  Open addressing, at most half full. */
#ifndef KVP_U64MAP_H
#define KVP_U64MAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvp_u64map {
    uint64_t *key; /* [cap], 0 an empty slot (key 0 is held beside them) */
    int64_t *val;
    size_t cap, n;
    int has_zero;
    int64_t zero_val;
} kvp_u64map; /* all zero: empty */

void kvp_u64map_free(kvp_u64map *m); /* and empty it */
/* The value of k, or -1 when k is not there. */
int64_t kvp_u64map_get(const kvp_u64map *m, uint64_t k);
/* Set k's value to v (v >= 0): 0, or KVP_ENOMEM (m unchanged). */
int kvp_u64map_put(kvp_u64map *m, uint64_t k, int64_t v);

#endif
