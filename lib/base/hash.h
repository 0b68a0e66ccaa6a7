/* hash.h - checksums and content hashes.
 *
 * CRC32C (Castagnoli) protects every KVP record header and payload: it is in
 * hardware on x86 (SSE4.2) and ARMv8, and detects all burst errors up to 32
 * bits.  XXH64 names content: KV blocks (chained with the parent block's hash
 * so equal prefixes hash equal) and model fingerprints.
 */
#ifndef KVP_HASH_H
#define KVP_HASH_H

#include <stddef.h>
#include <stdint.h>

/* CRC32C of n bytes, continuing from crc (start with 0).  Uses the SSE4.2
 * instruction when the CPU has it; same result either way. */
uint32_t kvp_crc32c(uint32_t crc, const void *p, size_t n);
/* The table-driven version, always; for tests against the fast one. */
uint32_t kvp_crc32c_portable(uint32_t crc, const void *p, size_t n);

/* XXH64 of n bytes with seed (the published algorithm, same values). */
uint64_t kvp_xxh64(const void *p, size_t n, uint64_t seed);

/* The same hash fed in pieces: init, any number of updates, digest. */
typedef struct kvp_xxh64_state {
    uint64_t v[4], total;
    uint8_t mem[32];
    uint32_t memsize;
    uint64_t seed;
} kvp_xxh64_state;
void kvp_xxh64_init(kvp_xxh64_state *st, uint64_t seed);
void kvp_xxh64_update(kvp_xxh64_state *st, const void *p, size_t n);
uint64_t kvp_xxh64_digest(const kvp_xxh64_state *st);

#endif
