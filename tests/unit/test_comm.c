/* test_comm.c - lib/comm: the one-process world, then (with MPI and mpirun)
 * the same binary as 3 ranks checking every collective against values each
 * rank can compute alone. */
#include "comm.h"
#include "unit.h"

#include <unistd.h>

static void test_world_of_one(void)
{
    kvp_err err = {0};
    kvp_comm *w = NULL;
    CHECK(kvp_comm_world(&w, &err) == 0 && w);
    if (!w)
        return;
    CHECK(kvp_comm_size(w) == 1 && kvp_comm_rank(w) == 0);
    float x[3] = {1.5f, -2, 3};
    CHECK(kvp_comm_allreduce_f32(w, x, 3, &err) == 0 && x[0] == 1.5f && x[1] == -2 && x[2] == 3);
    int a = 7, b = 0;
    CHECK(kvp_comm_allgather(w, &a, &b, sizeof a, &err) == 0 && b == 7);
    CHECK(kvp_comm_bcast(w, &a, sizeof a, 0, &err) == 0 && a == 7);
    kvp_comm *s = NULL;
    CHECK(kvp_comm_split(w, 0, 0, &s, &err) == 0 && s && kvp_comm_size(s) == 1);
    kvp_comm_free(s);
    CHECK(kvp_comm_barrier(w, &err) == 0);
    kvp_comm_set_timeout(12);
    CHECK(kvp_comm_timeout() == 12);
    kvp_comm_set_timeout(0); /* back to the default */
    CHECK(kvp_comm_timeout() == 300);
}

/* One rank of a launched job; returns its failure count. */
static void rank_checks(kvp_comm *w)
{
    kvp_err err = {0};
    int r = kvp_comm_rank(w), n = kvp_comm_size(w);
    CHECK(n == kvp_comm_launched_size());
    /* Sums of rank-dependent values, exact in f32 (small integers). */
    enum { N = 3000 };
    static float x[N];
    for (int i = 0; i < N; i++)
        x[i] = (float)(r * 1000 + i % 97);
    CHECK(kvp_comm_allreduce_f32(w, x, N, &err) == 0);
    int wrong = 0;
    for (int i = 0; i < N; i++)
        wrong += x[i] != (float)(1000 * n * (n - 1) / 2 + n * (i % 97));
    CHECK_MSG(wrong == 0, "%d wrong sums", wrong);
    int mine[2] = {r, r * r}, all[2 * 8] = {0};
    CHECK(n <= 8 && kvp_comm_allgather(w, mine, all, sizeof mine, &err) == 0);
    for (int k = 0; k < n && k < 8; k++)
        CHECK(all[2 * k] == k && all[2 * k + 1] == k * k);
    char msg[16] = {0};
    if (r == n - 1)
        memcpy(msg, "from the last", 14);
    CHECK(kvp_comm_bcast(w, msg, sizeof msg, n - 1, &err) == 0 && strcmp(msg, "from the last") == 0);
    /* A ring: send to the next, receive from the previous (even ranks send
     * first so the blocking pair cannot deadlock). */
    int to = (r + 1) % n, from = (r + n - 1) % n, got = -1, sent = 100 + r;
    if (r % 2 == 0)
        CHECK(kvp_comm_send(w, &sent, sizeof sent, to, 5, &err) == 0 &&
              kvp_comm_recv(w, &got, sizeof got, from, 5, &err) == 0);
    else
        CHECK(kvp_comm_recv(w, &got, sizeof got, from, 5, &err) == 0 &&
              kvp_comm_send(w, &sent, sizeof sent, to, 5, &err) == 0);
    CHECK(got == 100 + from);
    kvp_comm *s = NULL;
    CHECK(kvp_comm_split(w, r % 2, -r, &s, &err) == 0 && s);
    if (s) {
        CHECK(kvp_comm_size(s) == (n + 1 - r % 2) / 2);
        float one = 1, ranks = (float)r;
        CHECK(kvp_comm_allreduce_f32(s, &one, 1, &err) == 0 && one == (float)kvp_comm_size(s));
        CHECK(kvp_comm_allreduce_f32(s, &ranks, 1, &err) == 0);
        float want = 0;
        for (int k = r % 2; k < n; k += 2)
            want += (float)k;
        CHECK(ranks == want);
        /* key -r: the highest world rank of the color comes first */
        int above = 0;
        for (int k = r + 2; k < n; k += 2)
            above++;
        CHECK(kvp_comm_rank(s) == above);
        kvp_comm_free(s);
    }
    CHECK(kvp_comm_barrier(w, &err) == 0);
}

/* The parent: this binary again under mpirun with 3 ranks. */
static void test_three_ranks(const char *self)
{
    if (!kvp_comm_have_mpi() || system("command -v mpirun >/dev/null 2>&1") != 0) {
        printf("skip: no MPI in this build or no mpirun: the 3-rank checks did not run\n");
        return;
    }
    unit_mpirun(self, 3, "", "mpirun");
}

/* Rank 0's wait for its peers after a stop signal: half a second, or twice
 * the longest wait it has seen complete (a pipeline stage's share of a
 * long step must not read as a dead peer). */
static void test_stop_grace(void)
{
    CHECK_NEAR(kvp_comm_stop_grace(0), 0.5, 0);
    CHECK_NEAR(kvp_comm_stop_grace(0.2), 0.5, 0);
    CHECK_NEAR(kvp_comm_stop_grace(0.25), 0.5, 0);
    CHECK_NEAR(kvp_comm_stop_grace(1.5), 3.0, 1e-12);
}

int main(int argc, char **argv)
{
    (void)argc;
    if (kvp_comm_launched_size() > 1) {
        kvp_err err = {0};
        kvp_comm *w = NULL;
        if (kvp_comm_world(&w, &err) < 0) {
            printf("rank: %s\n", err.msg);
            return 1;
        }
        kvp_comm_set_timeout(60);
        rank_checks(w);
        if (unit_failed == 0)
            printf("rank ok\n");
        fflush(stdout);
        kvp_comm_finalize();
        return unit_failed ? 1 : 0;
    }
    test_world_of_one();
    test_stop_grace();
    test_three_ranks(argv[0]);
    kvp_comm_finalize();
    return unit_done();
}
