/* test_collbench.c - tpbench's arithmetic without a job: busbw factors,
 * counts and sizes, the check values, the half and bfloat16 reduction
 * operators against correctly rounded double references, the alpha-beta
 * link model and the TP cost of a step.  (tests/cli/tpbench.sh runs the
 * collectives themselves under mpirun.) */
#include "collbench.h"
#include "minifloat.h"
#include "presets.h"
#include "tpcost.h"
#include "tpmodel.h"
#include "unit.h"
#include <string.h>

#include <limits.h>
#include <math.h>

static void test_names(void)
{
    for (int op = 0; op < KVP_CB_OP_COUNT; op++)
        CHECK(kvp_cb_op_parse(kvp_cb_op_name(op)) == op);
    for (int t = 0; t < KVP_CB_DTYPE_COUNT; t++)
        CHECK(kvp_cb_dtype_parse(kvp_cb_dtype_name(t)) == t);
    for (int r = 0; r < KVP_CB_REDOP_COUNT; r++)
        CHECK(kvp_cb_redop_parse(kvp_cb_redop_name(r)) == r);
    CHECK(kvp_cb_op_parse("allreduce") == KVP_CB_OP_ALL_REDUCE);
    CHECK(kvp_cb_dtype_parse("bf16") == KVP_CB_DTYPE_BFLOAT16);
    CHECK(kvp_cb_op_parse("all-reduce") == -1 && kvp_cb_dtype_parse("double") == -1 &&
          kvp_cb_redop_parse("avg") == -1);
}

/* nccl-tests' factors (PERFORMANCE.md there): 2(n-1)/n, (n-1)/n, 1. */
static void test_busbw_factors(void)
{
    CHECK_NEAR(kvp_cb_busbw_factor(KVP_CB_OP_ALL_REDUCE, 2), 1.0, 1e-15);
    CHECK_NEAR(kvp_cb_busbw_factor(KVP_CB_OP_ALL_REDUCE, 4), 1.5, 1e-15);
    CHECK_NEAR(kvp_cb_busbw_factor(KVP_CB_OP_ALL_REDUCE, 8), 1.75, 1e-15);
    CHECK_NEAR(kvp_cb_busbw_factor(KVP_CB_OP_ALL_GATHER, 4), 0.75, 1e-15);
    CHECK_NEAR(kvp_cb_busbw_factor(KVP_CB_OP_REDUCE_SCATTER, 3), 2.0 / 3, 1e-15);
    CHECK_NEAR(kvp_cb_busbw_factor(KVP_CB_OP_ALLTOALL, 8), 0.875, 1e-15);
    for (int n = 1; n <= 8; n++) {
        CHECK(kvp_cb_busbw_factor(KVP_CB_OP_BROADCAST, n) == 1.0);
        CHECK(kvp_cb_busbw_factor(KVP_CB_OP_REDUCE, n) == 1.0);
        CHECK(kvp_cb_busbw_factor(KVP_CB_OP_SENDRECV, n) == 1.0);
    }
    CHECK(kvp_cb_busbw_factor(KVP_CB_OP_ALL_REDUCE, 1) == 0.0); /* nothing crosses a link */
}

static void test_counts_and_sizes(void)
{
    size_t s, r;
    kvp_cb_counts(KVP_CB_OP_ALL_GATHER, 4, 1024, &s, &r);
    CHECK(s == 256 && r == 1024);
    kvp_cb_counts(KVP_CB_OP_REDUCE_SCATTER, 4, 1024, &s, &r);
    CHECK(s == 1024 && r == 256);
    kvp_cb_counts(KVP_CB_OP_ALLTOALL, 4, 1024, &s, &r);
    CHECK(s == 1024 && r == 1024);

    kvp_cb_opts o;
    kvp_cb_opts_init(&o);
    o.min_bytes = 8;
    o.max_bytes = 128u << 20;
    uint64_t sz[64];
    kvp_err err = {0};
    int k = kvp_cb_sizes(&o, 4, sz, 64, &err);
    CHECK_EQ_I64(k, 25); /* 2^3 .. 2^27 */
    CHECK(k == 25 && sz[0] == 8 && sz[24] == 128u << 20);
    /* all_gather over 3 ranks of floats: whole 12-byte units, repeats dropped */
    o.op = KVP_CB_OP_ALL_GATHER;
    o.max_bytes = 64;
    k = kvp_cb_sizes(&o, 3, sz, 64, &err);
    CHECK_EQ_I64(k, 3);
    CHECK(k == 3 && sz[0] == 12 && sz[1] == 24 && sz[2] == 60);
    o.step_bytes = 100;
    o.min_bytes = 100;
    o.max_bytes = 400;
    o.op = KVP_CB_OP_ALL_REDUCE;
    k = kvp_cb_sizes(&o, 2, sz, 64, &err);
    CHECK(k == 4 && sz[0] == 100 && sz[3] == 400);
    o.step_bytes = 1;
    CHECK(kvp_cb_sizes(&o, 2, sz, 64, &err) == KVP_ELIMIT); /* 301 sizes */
    o.step_bytes = 0;
    o.min_bytes = 0; /* from 1 byte: one float, then doubling */
    k = kvp_cb_sizes(&o, 2, sz, 64, &err);
    CHECK(k == 7 && sz[0] == 4 && sz[6] == 256);
    o.step_factor = 1.0;
    CHECK(kvp_cb_sizes(&o, 2, sz, 64, &err) == KVP_EINVAL);
    /* 16 GiB of floats (2^32 elements): past MPI's int counts (the default
     * limit), within NCCL's size_t ones */
    o.step_factor = 2.0;
    o.min_bytes = o.max_bytes = (uint64_t)16 << 30;
    CHECK(kvp_cb_sizes(&o, 2, sz, 64, &err) == KVP_ELIMIT);
    CHECK_MSG(strstr(err.msg, "over 2147483647 float elements (MPI counts are int)"), "%s", err.msg);
    o.max_count = KVP_CB_NCCL_MAX_COUNT;
    k = kvp_cb_sizes(&o, 2, sz, 64, &err);
    CHECK(k == 1 && sz[0] == (uint64_t)16 << 30);
    o.min_bytes = o.max_bytes = (uint64_t)1 << 43; /* 2^41 floats: past it too */
    CHECK(kvp_cb_sizes(&o, 2, sz, 64, &err) == KVP_ELIMIT);
    CHECK_MSG(strstr(err.msg, "(one call's limit)"), "%s", err.msg);
    o.max_count = 0;
    /* sizes round down, never out of -b .. -e: 5..7 bytes hold no float
     * past 5, 3 bytes none at all, 4 bytes of all_gather over 3 ranks no
     * 12-byte unit */
    o.step_factor = 2.0;
    o.min_bytes = 5;
    o.max_bytes = 7;
    CHECK(kvp_cb_sizes(&o, 1, sz, 64, &err) == KVP_EINVAL);
    CHECK_MSG(strstr(err.msg, "no size from 5 to 7 bytes") && strstr(err.msg, "whole 4-byte units"), "%s", err.msg);
    o.min_bytes = o.max_bytes = 3;
    CHECK(kvp_cb_sizes(&o, 1, sz, 64, &err) == KVP_EINVAL);
    o.op = KVP_CB_OP_ALL_GATHER;
    o.min_bytes = o.max_bytes = 4;
    CHECK(kvp_cb_sizes(&o, 3, sz, 64, &err) == KVP_EINVAL);
    o.min_bytes = 5;
    o.max_bytes = 40;
    k = kvp_cb_sizes(&o, 3, sz, 64, &err); /* 5 -> 0, 10 -> 0, 20 -> 12, 40 -> 36 */
    CHECK(k == 2 && sz[0] == 12 && sz[1] == 36);
}

/* MPI's int counts: a call's count (or one rank's block, for the ops that
 * cut the buffer) over INT_MAX is refused by name, never cast smaller. */
static void test_mpi_count(void)
{
    kvp_err err = {0};
    int k = -1;
    CHECK(kvp_cb_mpi_count(KVP_CB_OP_ALL_REDUCE, KVP_CB_DTYPE_FLOAT, 4, INT_MAX, &k, &err) == 0 && k == INT_MAX);
    k = -1;
    CHECK(kvp_cb_mpi_count(KVP_CB_OP_ALL_REDUCE, KVP_CB_DTYPE_FLOAT, 4, (size_t)INT_MAX + 1, &k, &err) ==
          KVP_ELIMIT);
    CHECK(k == -1);
    CHECK_MSG(strstr(err.msg, "all_reduce of 2147483648 float elements over 4 ranks") &&
              strstr(err.msg, "over its limit of 2147483647"), "%s", err.msg);
    /* a 2^33 count (4 times 2^31) truncated to int was 0: a call of nothing */
    CHECK(kvp_cb_mpi_count(KVP_CB_OP_SENDRECV, KVP_CB_DTYPE_HALF, 2, (size_t)1 << 33, &k, &err) == KVP_ELIMIT);
    /* all_gather gives MPI one rank's block: 4 ranks of 2^30 gather 2^32 */
    CHECK(kvp_cb_mpi_count(KVP_CB_OP_ALL_GATHER, KVP_CB_DTYPE_FLOAT, 4, (size_t)1 << 32, &k, &err) == 0 &&
          k == 1 << 30);
    CHECK(kvp_cb_mpi_count(KVP_CB_OP_ALLTOALL, KVP_CB_DTYPE_FLOAT, 2, (size_t)1 << 32, &k, &err) == KVP_ELIMIT);
    CHECK(kvp_cb_mpi_count(KVP_CB_OP_REDUCE_SCATTER, KVP_CB_DTYPE_BFLOAT16, 3, 3 * (size_t)INT_MAX, &k, &err) ==
          0 && k == INT_MAX);
}

/* A --model step's phase against a backend's counts: rounded up to whole
 * elements a rank where the op cuts its buffer, refused by name past them
 * (tpbench checks it before any output, kvp_cb_time_phases again). */
static void test_phase_check(void)
{
    kvp_err err = {0};
    size_t c = 0;
    kvp_cb_phase ag = {KVP_CB_OP_ALL_GATHER, 10, 1, 0}, ar = {KVP_CB_OP_ALL_REDUCE, 10, 64, 0};
    CHECK(kvp_cb_phase_check(&ag, 3, 12, &c, &err) == 0 && c == 12);
    CHECK(kvp_cb_phase_check(&ag, 3, 11, &c, &err) == KVP_ELIMIT);
    CHECK_MSG(strcmp(err.msg, "all_gather of 12 elements: over 11 a call") == 0, "%s", err.msg);
    CHECK(kvp_cb_phase_check(&ar, 3, 10, &c, &err) == 0 && c == 10);
    ag.count = (size_t)20000 * 128256; /* llama-3-8b's logits at --batch 20000 */
    CHECK(kvp_cb_phase_check(&ag, 2, 0, &c, &err) == KVP_ELIMIT);
    CHECK_MSG(strstr(err.msg, "all_gather of 2565120000 elements: over 2147483647 a call (MPI counts are int)"),
              "%s", err.msg);
}

/* Every check value is exact in every dtype, float sums of them are exact
 * in any order, and products stay in half's range at any rank count. */
static void test_check_values(void)
{
    uint16_t h;
    float f;
    int inexact = 0, order = 0, range = 0;
    for (int redop = -1; redop < KVP_CB_REDOP_COUNT; redop++)
        for (int r = 0; r < 64; r++)
            for (size_t i = 0; i < 500; i++) {
                double v = kvp_cb_value(redop, r, i);
                for (int t = 0; t < KVP_CB_DTYPE_COUNT; t++) {
                    kvp_cb_store(t, t ? (void *)&h : (void *)&f, 0, v);
                    inexact += kvp_cb_load(t, t ? (void *)&h : (void *)&f, 0) != v;
                }
            }
    for (int n = 1; n <= 64; n++)
        for (size_t i = 0; i < 300; i++) {
            float up = 0, down = 0;
            for (int r = 0; r < n; r++) {
                up += (float)kvp_cb_value(KVP_CB_REDOP_SUM, r, i);
                down += (float)kvp_cb_value(KVP_CB_REDOP_SUM, n - 1 - r, i);
            }
            order += up != down || up != (float)kvp_cb_reduced(KVP_CB_REDOP_SUM, n, i);
            double p = fabs(kvp_cb_reduced(KVP_CB_REDOP_PROD, n, i));
            range += !(p >= 0.25 && p <= 4);
            order += kvp_cb_tolerance(KVP_CB_DTYPE_FLOAT, KVP_CB_REDOP_SUM, n, i) != 0;
            order += kvp_cb_tolerance(KVP_CB_DTYPE_BFLOAT16, KVP_CB_REDOP_MAX, n, i) != 0;
        }
    CHECK_MSG(inexact == 0, "%d values not exact in some dtype", inexact);
    CHECK_MSG(order == 0, "%d float sums depend on order", order);
    CHECK_MSG(range == 0, "%d products out of [1/4, 4]", range);
    /* ranks and neighbours differ, so a misplaced block is caught */
    CHECK(kvp_cb_value(-1, 0, 5) != kvp_cb_value(-1, 1, 5) && kvp_cb_value(-1, 0, 5) != kvp_cb_value(-1, 0, 6));
    CHECK_NEAR(kvp_cb_reduced(KVP_CB_REDOP_MAX, 3, 7),
               fmax(fmax(kvp_cb_value(2, 0, 7), kvp_cb_value(2, 1, 7)), kvp_cb_value(2, 2, 7)), 0);
    CHECK(kvp_cb_tolerance(KVP_CB_DTYPE_HALF, KVP_CB_REDOP_SUM, 4, 3) > 0);
}

/* The 16-bit value nearest to d, ties to even: a search among the
 * neighbours of the f32 cast, independent of the code under test. */
static uint16_t nearest16(int dtype, double d)
{
    float f = (float)d;
    uint16_t h0 = dtype == KVP_CB_DTYPE_HALF ? kvp_f32_to_f16(f) : kvp_f32_to_bf16(f), best = h0;
    double bd = INFINITY;
    for (int k = -1; k <= 1; k++) {
        uint16_t h = (uint16_t)(h0 + k);
        if ((h ^ h0) & 0x8000) /* crossed the sign */
            continue;
        double v = dtype == KVP_CB_DTYPE_HALF ? kvp_f16_to_f32(h) : kvp_bf16_to_f32(h);
        double e = fabs(v - d);
        if (e < bd || (e == bd && !(h & 1))) {
            bd = e;
            best = h;
        }
    }
    return best;
}

static void test_reduce16(void)
{
    enum { N = 4000 };
    uint64_t st = 0x5eed;
    for (int t = KVP_CB_DTYPE_HALF; t <= KVP_CB_DTYPE_BFLOAT16; t++)
        for (int redop = 0; redop < KVP_CB_REDOP_COUNT; redop++) {
            static uint16_t a[N], b[N], want[N];
            for (int i = 0; i < N; i++) {
                double x = 4 * unit_frand(&st), y = 4 * unit_frand(&st);
                if (i % 7 == 0)
                    y *= 1.0 / 1024; /* far apart exponents: the rounding matters */
                kvp_cb_store(t, a, (size_t)i, x);
                kvp_cb_store(t, b, (size_t)i, y);
                x = kvp_cb_load(t, a, (size_t)i);
                y = kvp_cb_load(t, b, (size_t)i);
                double e = redop == KVP_CB_REDOP_SUM ? x + y : redop == KVP_CB_REDOP_PROD ? x * y
                           : redop == KVP_CB_REDOP_MAX ? fmax(x, y) : fmin(x, y);
                want[i] = nearest16(t, e); /* x + y and x * y are exact in double */
            }
            kvp_cb_reduce16(t, redop, a, b, N);
            int bad = 0;
            for (int i = 0; i < N; i++)
                bad += b[i] != want[i];
            CHECK_MSG(bad == 0, "%s %s: %d of %d not correctly rounded", kvp_cb_dtype_name(t),
                      kvp_cb_redop_name(redop), bad, N);
        }
    /* NaN propagates */
    uint16_t x = kvp_f32_to_bf16(NAN), y = kvp_f32_to_bf16(1.0f);
    kvp_cb_reduce16(KVP_CB_DTYPE_BFLOAT16, KVP_CB_REDOP_MAX, &x, &y, 1);
    CHECK(isnan(kvp_bf16_to_f32(y)));
}

static void test_link_model(void)
{
    kvp_link l = {"test", "", 100e9, 1e-6};
    /* 4 ranks, 1 MB: 6 steps of 1 us + 1.5 x 1e6 / 1e11 s */
    CHECK_NEAR(kvp_link_allreduce_s(&l, 4, 1e6), 6e-6 + 15e-6, 1e-12);
    CHECK_NEAR(kvp_link_allgather_s(&l, 4, 1e6), 3e-6 + 7.5e-6, 1e-12);
    CHECK(kvp_link_allreduce_s(&l, 1, 1e6) == 0 && kvp_link_allgather_s(&l, 1, 1e6) == 0);
    const kvp_link *nv = kvp_link_find("nvlink4");
    CHECK(nv && nv->bw == 450e9 && kvp_link_find("pcie4") && kvp_link_find("ib-ndr") && !kvp_link_find("x"));
    kvp_tp_traffic t;
    kvp_tp_step_traffic(80, 8192, 128256, 4, &t);
    CHECK(t.n_allreduce == 160 && t.allreduce_elems == 4 * 8192 && t.n_allgather == 1 &&
          t.allgather_elems == 4 * 128256);
    CHECK_NEAR(kvp_tp_comm_s(&l, 2, &t, 2),
               160 * kvp_link_allreduce_s(&l, 2, 65536) + kvp_link_allgather_s(&l, 2, 4 * 128256 * 2), 1e-15);
}

static void test_tpcost(void)
{
    kvp_tpcost_in in = {kvp_preset_model_find("llama-3-70b"), kvp_preset_gpu_find("h100"), *kvp_link_find("nvlink4"),
                        8, 1, 4096, 2};
    CHECK(in.model && in.gpu);
    if (!in.model || !in.gpu)
        return;
    kvp_tpcost c;
    kvp_err err = {0};
    CHECK(kvp_tpcost_compute(&in, &c, &err) == 0);
    /* compute scales ~1/tp (the weights dominate); overhead is comm's share */
    CHECK_MSG(c.compute1_s / c.compute_s > 7 && c.compute1_s / c.compute_s <= 8.01, "%g", c.compute1_s / c.compute_s);
    CHECK_NEAR(c.overhead, c.comm_s / (c.comm_s + c.compute_s), 1e-12);
    CHECK_NEAR(c.comm_s, kvp_tp_comm_s(&in.link, 8, &c.traffic, 2), 1e-15);
    /* 141 GB of bf16 weights over 8 H100s at 3.35 TB/s: about 5.3 ms */
    CHECK_MSG(c.compute_s > 5e-3 && c.compute_s < 5.6e-3, "%g s", c.compute_s);
    in.tp = 1;
    CHECK(kvp_tpcost_compute(&in, &c, &err) == 0 && c.comm_s == 0 && c.overhead == 0);
}

int main(void)
{
    test_names();
    test_busbw_factors();
    test_counts_and_sizes();
    test_mpi_count();
    test_phase_check();
    test_check_values();
    test_reduce16();
    test_link_model();
    test_tpcost();
    return unit_done();
}
