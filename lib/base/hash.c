/* hash.c - CRC32C and XXH64 (see hash.h). */
#include "hash.h"

#include <pthread.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <nmmintrin.h>
#define KVP_HAVE_SSE42_PATH 1
#endif

/* Reflected Castagnoli polynomial. */
#define CRC32C_POLY 0x82F63B78u

static uint32_t crc32c_table[8][256];
static pthread_once_t crc32c_table_once = PTHREAD_ONCE_INIT;

/* Slice-by-8 tables: table[0] is the byte-at-a-time table, table[t] is
 * table[t - 1] carried over one more zero byte.  Built once, on first use,
 * under pthread_once: any thread may be the first to checksum (the SSE4.2
 * path never needs them; aarch64 and older x86 hosts always do). */
static void crc32c_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (CRC32C_POLY & (0u - (c & 1)));
        crc32c_table[0][i] = c;
    }
    for (int t = 1; t < 8; t++)
        for (uint32_t i = 0; i < 256; i++)
            crc32c_table[t][i] = (crc32c_table[t - 1][i] >> 8) ^ crc32c_table[0][crc32c_table[t - 1][i] & 0xff];
}

uint32_t kvp_crc32c_portable(uint32_t crc, const void *p, size_t n)
{
    pthread_once(&crc32c_table_once, crc32c_init);
    const uint8_t *b = p;
    crc = ~crc;
    while (n >= 8) {
        uint32_t lo = crc ^ ((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24);
        crc = crc32c_table[7][lo & 0xff] ^ crc32c_table[6][(lo >> 8) & 0xff] ^
              crc32c_table[5][(lo >> 16) & 0xff] ^ crc32c_table[4][lo >> 24] ^
              crc32c_table[3][b[4]] ^ crc32c_table[2][b[5]] ^ crc32c_table[1][b[6]] ^ crc32c_table[0][b[7]];
        b += 8;
        n -= 8;
    }
    while (n--)
        crc = (crc >> 8) ^ crc32c_table[0][(crc ^ *b++) & 0xff];
    return ~crc;
}

#ifdef KVP_HAVE_SSE42_PATH
__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t c = ~crc;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, b, 8);
        c = _mm_crc32_u64(c, v);
        b += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--)
        c32 = _mm_crc32_u8(c32, *b++);
    return ~c32;
}
#endif

uint32_t kvp_crc32c(uint32_t crc, const void *p, size_t n)
{
#ifdef KVP_HAVE_SSE42_PATH
    if (__builtin_cpu_supports("sse4.2"))
        return crc32c_sse42(crc, p, n);
#endif
    return kvp_crc32c_portable(crc, p, n);
}

/* ---- XXH64 ---- */

static const uint64_t P1 = 11400714785074694791ULL;
static const uint64_t P2 = 14029467366897019727ULL;
static const uint64_t P3 = 1609587929392839161ULL;
static const uint64_t P4 = 9650029242287828579ULL;
static const uint64_t P5 = 2870177450012600261ULL;

static uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static uint64_t rd64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}
static uint32_t rd32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

static uint64_t xxh_round(uint64_t acc, uint64_t lane)
{
    acc += lane * P2;
    acc = rotl64(acc, 31);
    return acc * P1;
}

static uint64_t xxh_merge(uint64_t acc, uint64_t v)
{
    acc ^= xxh_round(0, v);
    return acc * P1 + P4;
}

void kvp_xxh64_init(kvp_xxh64_state *st, uint64_t seed)
{
    memset(st, 0, sizeof *st);
    st->seed = seed;
    st->v[0] = seed + P1 + P2;
    st->v[1] = seed + P2;
    st->v[2] = seed;
    st->v[3] = seed - P1;
}

static void xxh_stripe(kvp_xxh64_state *st, const uint8_t *p)
{
    for (int i = 0; i < 4; i++)
        st->v[i] = xxh_round(st->v[i], rd64(p + 8 * i));
}

void kvp_xxh64_update(kvp_xxh64_state *st, const void *data, size_t n)
{
    const uint8_t *p = data;
    st->total += n;
    if (st->memsize + n < 32) { /* not a whole stripe yet: keep it */
        memcpy(st->mem + st->memsize, p, n);
        st->memsize += (uint32_t)n;
        return;
    }
    if (st->memsize) { /* complete the stripe begun earlier */
        size_t k = 32 - st->memsize;
        memcpy(st->mem + st->memsize, p, k);
        xxh_stripe(st, st->mem);
        p += k;
        n -= k;
        st->memsize = 0;
    }
    for (; n >= 32; p += 32, n -= 32)
        xxh_stripe(st, p);
    memcpy(st->mem, p, n);
    st->memsize = (uint32_t)n;
}

uint64_t kvp_xxh64_digest(const kvp_xxh64_state *st)
{
    uint64_t h;
    if (st->total >= 32) {
        h = rotl64(st->v[0], 1) + rotl64(st->v[1], 7) + rotl64(st->v[2], 12) + rotl64(st->v[3], 18);
        for (int i = 0; i < 4; i++)
            h = xxh_merge(h, st->v[i]);
    } else {
        h = st->seed + P5;
    }
    h += st->total;
    const uint8_t *p = st->mem, *end = p + st->memsize;
    while (p + 8 <= end) {
        h ^= xxh_round(0, rd64(p));
        h = rotl64(h, 27) * P1 + P4;
        p += 8;
    }
    if (p + 4 <= end) {
        h ^= (uint64_t)rd32(p) * P1;
        h = rotl64(h, 23) * P2 + P3;
        p += 4;
    }
    while (p < end) {
        h ^= (*p++) * P5;
        h = rotl64(h, 11) * P1;
    }
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

uint64_t kvp_xxh64(const void *data, size_t n, uint64_t seed)
{
    kvp_xxh64_state st;
    kvp_xxh64_init(&st, seed);
    kvp_xxh64_update(&st, data, n);
    return kvp_xxh64_digest(&st);
}
