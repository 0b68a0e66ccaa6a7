/* test_draftlen.c - a cheap drafter's draft length from the steps'
 * measured cost (lib/engine/draftlen.c). */
#include "draftlen.h"
#include "unit.h"

#include <string.h>

/* A machine whose step of n tokens costs cost[n] (1-based), all timed. */
static void timed(kvp_draftlen *c, const double *cost, uint32_t n)
{
    memset(c, 0, sizeof *c);
    for (uint32_t i = 1; i <= n; i++)
        kvp_draftlen_time(c, i, cost[i]);
}

int main(void)
{
    kvp_draftlen c;
    memset(&c, 0, sizeof c);
    /* nothing timed: a plain step first, to time one */
    CHECK(kvp_draftlen_choose(&c, 1, 1, 0.9f, 8) == 0);

    /* a step costs the same whatever its tokens (a GPU's memory-bound
     * decode): any acceptance above 0 pays the longest draft */
    double flat[10] = {0, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    timed(&c, flat, 9);
    CHECK(kvp_draftlen_choose(&c, 1, 1, 0.3f, 8) == 8);
    CHECK(kvp_draftlen_choose(&c, 1, 1, 0.0f, 8) == 0);
    CHECK(kvp_draftlen_choose(&c, 1, 1, 0.9f, 3) == 3); /* most bounds it */

    /* a step's cost jumps from 6 tokens on (AMX on an Intel Xeon): a high
     * acceptance takes 4 guesses, not 5 to 8 */
    double jump[10] = {0, 1.0, 1.03, 1.24, 1.40, 1.56, 2.3, 2.4, 2.5, 2.65};
    timed(&c, jump, 9);
    CHECK(kvp_draftlen_choose(&c, 1, 1, 0.8f, 8) == 4);
    /* a low one none: 1 + 0.2 for 1.03 of a step gains, 1 + 0.1 does not */
    CHECK(kvp_draftlen_choose(&c, 1, 1, 0.2f, 8) == 1);
    CHECK(kvp_draftlen_choose(&c, 1, 1, 0.02f, 8) == 0);
    /* in a batch of 4 requests (yield 4) one guess must add a quarter of
     * what it costs over a plain step of 4 */
    CHECK(kvp_draftlen_choose(&c, 4, 4, 0.3f, 8) == 0);
    CHECK(kvp_draftlen_choose(&c, 4, 4, 0.99f, 1) == 1);

    /* an untimed size is priced optimistically from the timed ones below:
     * tried, then judged by its own time */
    double two[3] = {0, 1.0, 1.1};
    timed(&c, two, 2);
    CHECK(kvp_draftlen_choose(&c, 1, 1, 0.9f, 4) == 4);
    kvp_draftlen_time(&c, 5, 4.0); /* 5 tokens turned out to cost 4 steps */
    kvp_draftlen_time(&c, 3, 3.0), kvp_draftlen_time(&c, 4, 3.5);
    CHECK(kvp_draftlen_choose(&c, 1, 1, 0.9f, 4) == 1);
    /* a faster time replaces the average at once; a slower one moves it a fifth */
    kvp_draftlen_time(&c, 3, 1.2);
    CHECK(c.t[3] == 1.2);
    kvp_draftlen_time(&c, 3, 2.2);
    CHECK(c.t[3] > 1.39 && c.t[3] < 1.41);
    kvp_draftlen_time(&c, 0, 1.0), kvp_draftlen_time(&c, KVP_DRAFTLEN_T + 1, 1.0); /* out of range: ignored */

    /* a step holding a prompt chunk past the table: guesses cost little
     * beside it */
    CHECK(kvp_draftlen_choose(&c, 300, 1, 0.1f, 6) == 6);
    CHECK(kvp_draftlen_choose(&c, KVP_DRAFTLEN_T - 2, 1, 0.1f, 6) <= 2);
    /* a full table's worth of decode tokens: priced, so a low acceptance
     * takes none even where the table has room for a few */
    double lin[KVP_DRAFTLEN_T + 1];
    for (uint32_t i = 1; i <= KVP_DRAFTLEN_T; i++)
        lin[i] = i;
    timed(&c, lin, KVP_DRAFTLEN_T);
    CHECK(kvp_draftlen_choose(&c, KVP_DRAFTLEN_T - 3, KVP_DRAFTLEN_T - 3, 0.5f, 8) == 0);
    CHECK(kvp_draftlen_choose(&c, KVP_DRAFTLEN_T, KVP_DRAFTLEN_T, 1.0f, 8) == 0);

    /* acceptance: a miss at once pulls it down, all kept keeps it up, and a
     * plain step lets it drift back to the prior */
    float a = KVP_DRAFTLEN_PRIOR;
    a = kvp_draftlen_accept(a, 0, 4);
    CHECK(a < 0.31f && a > 0.29f);
    float b = kvp_draftlen_accept(0.8f, 4, 4);
    CHECK(b > 0.8f && b < 1.0f);
    CHECK(kvp_draftlen_accept(0.5f, 3, 0) == 0.5f);
    float d = 0.0f;
    for (int i = 0; i < 50; i++)
        d = kvp_draftlen_idle(d);
    CHECK(d > KVP_DRAFTLEN_PRIOR - 0.01f && d <= KVP_DRAFTLEN_PRIOR);
    return unit_done();
}
