/* test_hash.c - the portable CRC32C against published check values, first
 * used by two threads at once (its tables are built on first use: under
 * `make tsan` a racy build is reported), and the dispatching CRC32C equal to
 * it.  XXH64's published values are checked in test_stream. */
#include "unit.h"
#include "hash.h"

#include <pthread.h>

/* RFC 3720 (iSCSI) B.4 vectors and the common "123456789" check value. */
typedef struct vec {
    uint8_t data[32];
    size_t n;
    uint32_t crc;
} vec;
static vec vecs[5];

static void make_vecs(void)
{
    memset(vecs[0].data, 0, 32), vecs[0].n = 32, vecs[0].crc = 0x8A9136AAu;
    memset(vecs[1].data, 0xff, 32), vecs[1].n = 32, vecs[1].crc = 0x62A8AB43u;
    for (int i = 0; i < 32; i++)
        vecs[2].data[i] = (uint8_t)i, vecs[3].data[i] = (uint8_t)(31 - i);
    vecs[2].n = vecs[3].n = 32, vecs[2].crc = 0x46DD794Eu, vecs[3].crc = 0x113FDB5Cu;
    memcpy(vecs[4].data, "123456789", 9), vecs[4].n = 9, vecs[4].crc = 0xE3069283u;
}

/* Each thread checks every vector many times; returns the mismatches. */
static void *crc_thread(void *arg)
{
    int *bad = arg;
    for (int r = 0; r < 200; r++)
        for (int i = 0; i < 5; i++)
            *bad += kvp_crc32c_portable(0, vecs[i].data, vecs[i].n) != vecs[i].crc;
    return NULL;
}

int main(void)
{
    make_vecs();
    /* First: two threads, before anything else in this process has used
     * the portable CRC. */
    pthread_t th[2];
    int bad[2] = {0, 0}, started = 0;
    for (int i = 0; i < 2; i++)
        started += pthread_create(&th[i], NULL, crc_thread, &bad[i]) == 0;
    CHECK_EQ_I64(started, 2);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    CHECK_EQ_I64(bad[0] + bad[1], 0);

    for (int i = 0; i < 5; i++) {
        CHECK_EQ_U64(kvp_crc32c_portable(0, vecs[i].data, vecs[i].n), vecs[i].crc);
        CHECK_EQ_U64(kvp_crc32c(0, vecs[i].data, vecs[i].n), vecs[i].crc);
    }
    /* Continued in pieces of every split, on both paths. */
    int differ = 0;
    for (size_t k = 0; k <= 32; k++) {
        differ += kvp_crc32c_portable(kvp_crc32c_portable(0, vecs[2].data, k), vecs[2].data + k, 32 - k) != vecs[2].crc;
        differ += kvp_crc32c(kvp_crc32c(0, vecs[2].data, k), vecs[2].data + k, 32 - k) != vecs[2].crc;
    }
    CHECK_EQ_I64(differ, 0);
    CHECK_EQ_U64(kvp_crc32c_portable(0, "", 0), 0);
    return unit_done();
}
