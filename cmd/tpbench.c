/* tpbench - collectives between the ranks of an MPI job, timed and checked
 * the nccl-tests way (lib/comm/collbench.c), and the traffic of one
 * tensor-parallel decode step of a model, measured here beside an
 * alpha-beta model of GPU links (lib/comm/tpmodel.c, lib/plan/tpcost.c).
 * This file parses options and prints; only rank 0 prints results.
 */
#include "cli.h"
#include "collbench.h"
#include "comm.h"
#include "launchrank.h"
#include "presets.h"
#include "shard.h"
#include "tpcost.h"
#include "tpmodel.h"

#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: mpirun -np N tpbench [OPERATION] [-b SIZE] [-e SIZE] [-f FACTOR | -i STEP] [options]\n"
            "       [mpirun -np N] tpbench --model PRESET --tp N [--batch B] [--gpu GPU] [--link LINK]\n"
            "Time and check collectives between the ranks of an MPI job (nccl-tests' table),\n"
            "or one tensor-parallel decode step's traffic, measured here and modeled for GPU links.\n"
            "\n"
            "OPERATION: all_reduce (default), all_gather, reduce_scatter, broadcast, reduce,\n"
            "           alltoall, sendrecv (a ring)\n"
            "  -b, --minbytes SIZE       smallest message (default 8)\n"
            "  -e, --maxbytes SIZE       largest message (default 8M); K M G T P are powers of 1024\n"
            "  -f, --stepfactor F        multiply the size by F each row (default 2)\n"
            "  -i, --stepbytes SIZE      add SIZE each row instead\n"
            "  -n, --iters N             timed calls a row (default 20)\n"
            "  -w, --warmup_iters N      untimed calls first (default 5)\n"
            "  -c, --check 0|1           count wrong elements (default 1)\n"
            "  -d, --datatype T          float, half, bfloat16 (default float; bfloat16 with --model)\n"
            "  -o, --op OP               sum, prod, max, min (default sum)\n"
            "  -r, --root R              root of broadcast and reduce (default 0)\n"
            "  -z, --in-place            in place only\n"
            "      --backend mpi|nccl    host memory over MPI (default), or one GPU a rank over NCCL\n"
            "      --timeout S           seconds a rank waits for its peers before the job is\n"
            "                            aborted (default 300)\n"
            "      --json                one JSON object instead of the table\n"
            "Model-shaped traffic:\n"
            "      --model PRESET        a model preset (kvcalc --list-models)\n"
            "      --tp N                tensor-parallel ranks to model (measured when the job has N)\n"
            "      --batch B             sequences decoded together (default 1)\n"
            "      --seq-len N           context each holds, for the roofline (default 4096)\n"
            "      --gpu GPU             GPU preset for the roofline (default h100)\n"
            "      --link LINK|all       nvlink4 nvlink3 pcie5 pcie4 ib-ndr ib-hdr (default all)\n"
            "      --alpha US            override the link's latency per ring step, microseconds\n"
            "      --bandwidth RATE      override its one-way bandwidth, bytes/s (450G)\n"
            "  -h, --help  -V, --version\n");
}

typedef struct opts {
    kvp_cb_opts cb;
    const char *backend;
    int json;
    double timeout;
    /* --model */
    const char *model, *gpu, *link;
    uint32_t tp;
    uint64_t batch, seq_len;
    double alpha_us, bandwidth;
    int dtype_given;
    const char *model_opt; /* a --model option given without --model */
    char sweep_opt[3];     /* the last option of the sweep alone ("-b"), for a usage error with --model */
    int step_given;        /* -f or -i: the sweep steps one way */
} opts;

/* OPT_TP .. OPT_BANDWIDTH are the options of --model alone: keep them together. */
enum { OPT_BACKEND = 256, OPT_TIMEOUT, OPT_JSON, OPT_MODEL, OPT_TP, OPT_BATCH, OPT_SEQ_LEN, OPT_GPU, OPT_LINK,
       OPT_ALPHA, OPT_BANDWIDTH };

#define SHORTOPTS "b:e:f:i:n:w:c:d:o:r:zhV"

/* -b, -e, -i as nccl-tests reads them: K, M, G are powers of 1024 there,
 * so `-e 128M` ends the sweep at 2^27 bytes as it does in nccl-tests (the
 * other kvpipe programs' K M G are powers of 1000; Ki Mi Gi work too).
 * Every suffix the size parser knows (K M G T P) is made binary here: one
 * left decimal would make `-b 1P` a thousand times off its neighbours. */
static uint64_t nccl_size(const char *opt, const char *s)
{
    char buf[64];
    size_t n = strlen(s);
    if (n + 2 > sizeof buf)
        kvp_cli_usage_error("%s: '%s' is not a size", opt, s);
    memcpy(buf, s, n + 1);
    if (n > 1 && (buf[n - 1] == 'B' || buf[n - 1] == 'b'))
        buf[--n] = 0;
    if (n > 1 && strchr("KMGTPkmgtp", buf[n - 1])) {
        buf[n] = 'i';
        buf[n + 1] = 0;
    }
    return kvp_cli_opt_size(opt, buf);
}

static int parse_named(const char *opt, const char *s, int (*parse)(const char *), const char *choices)
{
    int v = parse(s);
    if (v < 0)
        kvp_cli_usage_error("%s: '%s' is not one of %s", opt, s, choices);
    return v;
}

static void parse_opts(int argc, char **argv, opts *o)
{
    static const struct option longs[] = {
        {"minbytes", required_argument, NULL, 'b'}, {"maxbytes", required_argument, NULL, 'e'},
        {"stepfactor", required_argument, NULL, 'f'}, {"stepbytes", required_argument, NULL, 'i'},
        {"iters", required_argument, NULL, 'n'}, {"warmup_iters", required_argument, NULL, 'w'},
        {"check", required_argument, NULL, 'c'}, {"datatype", required_argument, NULL, 'd'},
        {"op", required_argument, NULL, 'o'}, {"root", required_argument, NULL, 'r'},
        {"in-place", no_argument, NULL, 'z'}, {"backend", required_argument, NULL, OPT_BACKEND},
        {"timeout", required_argument, NULL, OPT_TIMEOUT}, {"json", no_argument, NULL, OPT_JSON},
        {"model", required_argument, NULL, OPT_MODEL}, {"tp", required_argument, NULL, OPT_TP},
        {"batch", required_argument, NULL, OPT_BATCH}, {"seq-len", required_argument, NULL, OPT_SEQ_LEN},
        {"gpu", required_argument, NULL, OPT_GPU}, {"link", required_argument, NULL, OPT_LINK},
        {"alpha", required_argument, NULL, OPT_ALPHA}, {"bandwidth", required_argument, NULL, OPT_BANDWIDTH},
        {"help", no_argument, NULL, 'h'}, {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    kvp_cb_opts *cb = &o->cb;
    int c, li = -1;
    while ((c = getopt_long(argc, argv, SHORTOPTS, longs, &li)) != -1) {
        if (c >= OPT_TP && c <= OPT_BANDWIDTH)
            o->model_opt = longs[li].name; /* goes with --model */
        if (c < 256 && strchr("befizorc", c)) /* the sweep's alone: --model times its own calls */
            snprintf(o->sweep_opt, sizeof o->sweep_opt, "-%c", c);
        if ((c == 'f' || c == 'i') && o->step_given++)
            kvp_cli_usage_error("-f and -i: the sizes step by a factor or by bytes, one of the two");
        switch (c) {
        case 'b': cb->min_bytes = nccl_size("-b", optarg); break;
        case 'e': cb->max_bytes = nccl_size("-e", optarg); break;
        case 'f': cb->step_factor = kvp_cli_opt_f64("-f", optarg, 1.0001, 1e6); break;
        case 'i':
            /* 0 is how kvp_cb_opts says "no -i": it would silently step by -f */
            if (!(cb->step_bytes = nccl_size("-i", optarg)))
                kvp_cli_usage_error("-i: a step of 0 bytes never grows the size");
            break;
        case 'n': cb->iters = (int)kvp_cli_opt_i64("-n", optarg, 1, 100000000); break;
        case 'w': cb->warmup = (int)kvp_cli_opt_i64("-w", optarg, 0, 100000000); break;
        case 'c': cb->check = (int)kvp_cli_opt_i64("-c", optarg, 0, 1); break;
        case 'd':
            cb->dtype = parse_named("-d", optarg, kvp_cb_dtype_parse, "float half bfloat16");
            o->dtype_given = 1;
            break;
        case 'o': cb->redop = parse_named("-o", optarg, kvp_cb_redop_parse, "sum prod max min"); break;
        case 'r': cb->root = (int)kvp_cli_opt_i64("-r", optarg, 0, 1 << 24); break;
        case 'z': cb->in_place_only = 1; break;
        case OPT_BACKEND:
            if (strcmp(optarg, "mpi") != 0 && strcmp(optarg, "nccl") != 0)
                kvp_cli_usage_error("--backend: '%s' is not one of mpi nccl", optarg);
            o->backend = optarg;
            break;
        case OPT_TIMEOUT: o->timeout = kvp_cli_opt_f64("--timeout", optarg, 0.001, 1e7); break;
        case OPT_JSON: o->json = 1; break;
        case OPT_MODEL: o->model = optarg; break;
        case OPT_TP: o->tp = (uint32_t)kvp_cli_opt_i64("--tp", optarg, 1, 4096); break;
        case OPT_BATCH: o->batch = (uint64_t)kvp_cli_opt_i64("--batch", optarg, 1, 1 << 20); break;
        case OPT_SEQ_LEN: o->seq_len = (uint64_t)kvp_cli_opt_i64("--seq-len", optarg, 1, 1 << 26); break;
        case OPT_GPU: o->gpu = optarg; break;
        case OPT_LINK: o->link = optarg; break;
        case OPT_ALPHA: o->alpha_us = kvp_cli_opt_f64("--alpha", optarg, 0, 1e6); break;
        case OPT_BANDWIDTH:
            /* 0 is how opts says "the datasheet's": it would silently be ignored */
            if (!(o->bandwidth = (double)kvp_cli_opt_size("--bandwidth", optarg)))
                kvp_cli_usage_error("--bandwidth: 0 bytes/s carries nothing");
            break;
        case 'h':
            usage(stdout);
            exit(kvp_cli_close_stdout());
        case 'V': kvp_cli_version();
        default: kvp_cli_bad_option(argv, SHORTOPTS, longs);
        }
    }
    if (cb->max_bytes < cb->min_bytes)
        kvp_cli_usage_error("-e %" PRIu64 " is below -b %" PRIu64, cb->max_bytes, cb->min_bytes);
    if (o->model) {
        if (optind < argc)
            kvp_cli_usage_error("--model runs a decode step's collectives: no OPERATION ('%s')", argv[optind]);
        if (!kvp_preset_model_find(o->model))
            kvp_cli_usage_error("--model: no preset '%s' (kvcalc --list-models)", o->model);
        if (!kvp_preset_gpu_find(o->gpu))
            kvp_cli_usage_error("--gpu: no preset '%s' (kvcalc --list-gpus)", o->gpu);
        if (strcmp(o->link, "all") != 0 && !kvp_link_find(o->link))
            kvp_cli_usage_error("--link: '%s' is not one of all nvlink4 nvlink3 pcie5 pcie4 ib-ndr ib-hdr",
                                o->link);
        if (o->tp == 0)
            kvp_cli_usage_error("--model needs --tp N");
        if (o->sweep_opt[0])
            kvp_cli_usage_error("%s goes with a sweep of one OPERATION, not --model (its sizes are the model's)",
                                o->sweep_opt);
        /* only a split decode runs (and kvcalc plans): the same rule */
        kvp_err err = {0};
        if (kvp_shard_check_split(&kvp_preset_model_find(o->model)->cfg, o->tp, &err) < 0)
            kvp_cli_usage_error("--tp: %s", err.msg);
        return;
    }
    if (o->model_opt)
        kvp_cli_usage_error("--%s goes with --model", o->model_opt);
    if (optind < argc)
        cb->op = parse_named("OPERATION", argv[optind++], kvp_cb_op_parse,
                             "all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv");
    if (optind < argc)
        kvp_cli_usage_error("one OPERATION at a time ('%s' too)", argv[optind]);
    if (cb->in_place_only && !kvp_cb_op_in_place(cb->op))
        kvp_cli_usage_error("-z: %s has no in-place form", kvp_cb_op_name(cb->op));
}

/* ---- the collectives table ---- */

typedef struct printer {
    FILE *f;                /* stdout, or the JSON document in memory (main) */
    const opts *o;
    int rank, n, rows;
    double busbw_sum;
    int busbw_n;
    int64_t wrong;
} printer;

static void print_cell(FILE *f, const kvp_cb_row *r, int mode)
{
    if (r->time_us[mode] < 0) {
        fprintf(f, "  %7s  %6s  %6s  %6s", "N/A", "N/A", "N/A", "N/A");
        return;
    }
    fprintf(f, "  %7.2f  %6.2f  %6.2f", r->time_us[mode], r->algbw[mode], r->busbw[mode]);
    if (r->wrong[mode] < 0)
        fprintf(f, "  %6s", "N/A");
    else
        fprintf(f, "  %6" PRId64, r->wrong[mode]);
}

static void json_cell(FILE *f, const kvp_cb_row *r, int mode)
{
    if (r->time_us[mode] < 0) {
        fprintf(f, "null");
        return;
    }
    /* 9 significant digits: busbw recomputed from time_us agrees to 1e-8 */
    fprintf(f, "{\"time_us\":%.9g,\"algbw\":%.9g,\"busbw\":%.9g,\"wrong\":", r->time_us[mode], r->algbw[mode],
           r->busbw[mode]);
    if (r->wrong[mode] < 0)
        fprintf(f, "null}");
    else
        fprintf(f, "%" PRId64 "}", r->wrong[mode]);
}

static void on_row(void *arg, const kvp_cb_row *r)
{
    printer *p = arg;
    FILE *f = p->f;
    const kvp_cb_opts *cb = &p->o->cb;
    for (int m = 0; m < 2; m++) {
        if (r->time_us[m] >= 0) {
            p->busbw_sum += r->busbw[m];
            p->busbw_n++;
        }
        if (r->wrong[m] > 0)
            p->wrong += r->wrong[m];
    }
    if (p->rank != 0)
        return;
    int root = kvp_cb_op_rooted(cb->op) ? cb->root : -1;
    const char *redop = kvp_cb_op_reduces(cb->op) ? kvp_cb_redop_name(cb->redop) : "none";
    if (p->o->json) {
        fprintf(f, "%s\n    {\"size\":%" PRIu64 ",\"count\":%zu,\"out_of_place\":", p->rows ? "," : "", r->bytes,
               r->count);
        json_cell(f, r, 0);
        fprintf(f, ",\"in_place\":");
        json_cell(f, r, 1);
        fprintf(f, "}");
    } else {
        fprintf(f, "%12" PRIu64 "  %12zu  %8s  %6s  %6d", r->bytes, r->count, kvp_cb_dtype_name(cb->dtype), redop, root);
        print_cell(f, r, 0);
        print_cell(f, r, 1);
        fprintf(f, "\n");
    }
    p->rows++;
    fflush(f); /* the table, row by row (a JSON document is written whole, by main) */
}

/* "#  Rank  0 Pid  1234 on HOST" for every rank, as nccl-tests lists its
 * devices: where each rank ran is the first thing to check on many nodes. */
static void print_ranks(FILE *f, kvp_comm *w, int json)
{
    enum { HOST = 64 };
    struct { int32_t pid; char host[HOST]; } me, *all = NULL;
    memset(&me, 0, sizeof me);
    me.pid = (int32_t)getpid();
    gethostname(me.host, HOST - 1);
    int n = kvp_comm_size(w);
    kvp_err err = {0};
    if (!(all = calloc((size_t)n, sizeof *all)) || kvp_comm_allgather(w, &me, all, sizeof me, &err) < 0) {
        free(all);
        return; /* only informative */
    }
    if (kvp_comm_rank(w) == 0) {
        for (int r = 0; r < n; r++) {
            if (json) {
                fprintf(f, "%s{\"rank\":%d,\"pid\":%d,\"host\":", r ? "," : "", r, (int)all[r].pid);
                kvp_cli_json_str(f, all[r].host, strlen(all[r].host));
                fprintf(f, "}");
            } else {
                fprintf(f, "#  Rank %2d Pid %7d on %s\n", r, (int)all[r].pid, all[r].host);
            }
        }
    }
    free(all);
}

static void print_header(FILE *f, const opts *o, kvp_comm *w, const char *backend)
{
    const kvp_cb_opts *cb = &o->cb;
    int n = kvp_comm_size(w), rank = kvp_comm_rank(w);
    if (o->json) {
        if (rank == 0)
            fprintf(f, "{\"program\":\"tpbench\",\"version\":\"%s\",\"op\":\"%s\",\"backend\":\"%s\",\"ranks\":%d,"
                   "\"datatype\":\"%s\",\"redop\":\"%s\",\"root\":%d,\"iters\":%d,\"warmup_iters\":%d,"
                   "\"check\":%d,\"in_place_only\":%d,\"busbw_factor\":%.6f,\"rank_list\":[",
                   KVP_VERSION, kvp_cb_op_name(cb->op), backend, n, kvp_cb_dtype_name(cb->dtype),
                   kvp_cb_op_reduces(cb->op) ? kvp_cb_redop_name(cb->redop) : "none",
                   kvp_cb_op_rooted(cb->op) ? cb->root : -1, cb->iters, cb->warmup, cb->check, cb->in_place_only,
                   kvp_cb_busbw_factor(cb->op, n));
        print_ranks(f, w, 1);
        if (rank == 0)
            fprintf(f, "],\n  \"rows\":[");
        return;
    }
    if (rank == 0) {
        /* a build without MPI runs its "mpi" backend in one process */
        int alone = !kvp_comm_have_mpi() && strcmp(backend, "mpi") == 0;
        fprintf(f, "# tpbench %s: %d rank%s %s%s, minBytes %" PRIu64 " maxBytes %" PRIu64 " step: ",
               kvp_cb_op_name(cb->op), n, n == 1 ? "" : "s", alone ? "in one process (this build has no MPI)" : "over ",
               alone ? "" : backend, cb->min_bytes, cb->max_bytes);
        if (cb->step_bytes)
            fprintf(f, "%" PRIu64 "(bytes)", cb->step_bytes);
        else
            fprintf(f, "%g(factor)", cb->step_factor);
        fprintf(f, " warmup iters: %d iters: %d validation: %d\n#\n", cb->warmup, cb->iters, cb->check);
    }
    print_ranks(f, w, 0);
    if (rank == 0)
        fprintf(f, "#\n"
               "#                                                              out-of-place"
               "                       in-place\n"
               "#       size         count      type   redop    root     time   algbw   busbw  #wrong"
               "     time   algbw   busbw  #wrong\n"
               "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)        "
               "     (us)  (GB/s)  (GB/s)\n");
    fflush(f); /* the rank list is out before the first row (tests find pids there) */
}

static void print_footer(FILE *f, const opts *o, const printer *p)
{
    double avg = p->busbw_n ? p->busbw_sum / p->busbw_n : 0;
    if (o->json) {
        fprintf(f, "\n  ],\n  \"avg_busbw\":%.9g,\"wrong\":", avg);
        if (o->cb.check)
            fprintf(f, "%" PRId64 "}\n", p->wrong);
        else
            fprintf(f, "null}\n");
        return;
    }
    if (o->cb.check)
        fprintf(f, "# Wrong elements     : %" PRId64 " %s\n", p->wrong, p->wrong ? "FAILED" : "OK");
    fprintf(f, "# Avg bus bandwidth  : %g\n#\n", avg);
}

static int run_collectives(FILE *f, const opts *o, kvp_comm *w, kvp_cb_backend *be, kvp_err *err)
{
    printer p = {.f = f, .o = o, .rank = kvp_comm_rank(w), .n = kvp_comm_size(w)};
    print_header(f, o, w, be->name);
    int rc = kvp_cb_run(w, be, &o->cb, on_row, &p, err);
    if (rc < 0)
        return rc;
    if (p.rank == 0)
        print_footer(f, o, &p);
    return p.wrong ? 1 : 0;
}

/* ---- --model: one decode step's traffic ---- */

static void model_links(const opts *o, kvp_link *out, int *n)
{
    *n = 0;
    for (size_t i = 0; i < kvp_link_count(); i++) {
        const kvp_link *l = kvp_link_at(i);
        if (strcmp(o->link, "all") != 0 && strcmp(o->link, l->name) != 0)
            continue;
        out[*n] = *l;
        if (o->alpha_us >= 0)
            out[*n].alpha = o->alpha_us * 1e-6;
        if (o->bandwidth > 0)
            out[*n].bw = o->bandwidth;
        (*n)++;
    }
}

/* One decode step's collectives of model m at batch sequences; tp 1 has none. */
static void step_traffic(const kvp_model_preset *m, uint32_t tp, uint64_t batch, kvp_tp_traffic *t)
{
    kvp_tp_step_traffic(m->cfg.n_layer, m->cfg.n_embd, m->cfg.n_vocab, batch, t);
    if (tp <= 1)
        memset(t, 0, sizeof *t);
}

static void step_phases(const kvp_tp_traffic *t, kvp_cb_phase ph[2])
{
    ph[0] = (kvp_cb_phase){KVP_CB_OP_ALL_REDUCE, (size_t)t->allreduce_elems, (int)t->n_allreduce, 0};
    ph[1] = (kvp_cb_phase){KVP_CB_OP_ALL_GATHER, (size_t)t->allgather_elems, (int)t->n_allgather, 0};
}

/* The measured half: this job's ranks run the step's collectives. */
static int measure_step(const opts *o, kvp_comm *w, kvp_cb_backend *be, const kvp_tp_traffic *t,
                        kvp_cb_phase ph[2], double *step_s, kvp_err *err)
{
    step_phases(t, ph);
    return kvp_cb_time_phases(w, be, o->cb.dtype, ph, 2, o->cb.warmup, o->cb.iters, step_s, err);
}

static void print_measured(FILE *f, const opts *o, int n, const char *backend, const kvp_cb_phase *ph, double step_s)
{
    size_t es = kvp_cb_dtype_size(o->cb.dtype);
    if (o->json) {
        fprintf(f, ",\n  \"measured\":{\"source\":\"measured\",\"ranks\":%d,\"backend\":\"%s\",\"phases\":[", n, backend);
        for (int p = 0; p < 2; p++)
            fprintf(f, "%s{\"op\":\"%s\",\"calls\":%d,\"bytes\":%zu,\"us_each\":%.3f}", p ? "," : "",
                   kvp_cb_op_name(ph[p].op), ph[p].repeat, ph[p].count * es, ph[p].seconds * 1e6);
        fprintf(f, "],\"step_us\":%.3f,\"us_per_token\":%.3f}", step_s * 1e6, step_s * 1e6 / (double)o->batch);
        return;
    }
    fprintf(f, "#\n# measured here: %d ranks over %s, %d steps after %d warmup\n", n, backend, o->cb.iters,
           o->cb.warmup);
    fprintf(f, "#  source    collective    calls       bytes   us each   us/step\n");
    for (int p = 0; p < 2; p++)
        fprintf(f, "   measured  %-12s %6d  %10zu  %8.2f  %8.1f\n", kvp_cb_op_name(ph[p].op), ph[p].repeat,
               ph[p].count * es, ph[p].seconds * 1e6, ph[p].seconds * 1e6 * ph[p].repeat);
    fprintf(f, "   measured  step          comm %.1f us a step, %.2f us a token (batch %" PRIu64 ")\n", step_s * 1e6,
           step_s * 1e6 / (double)o->batch, o->batch);
}

static int print_modeled(FILE *f, const opts *o, kvp_err *err)
{
    kvp_link links[16];
    int nl = 0;
    model_links(o, links, &nl);
    kvp_tpcost_in in = {kvp_preset_model_find(o->model), kvp_preset_gpu_find(o->gpu), {0}, o->tp, o->batch,
                        o->seq_len, kvp_cb_dtype_size(o->cb.dtype)};
    if (!o->json)
        fprintf(f, "#\n# modeled: %s (%.2f TB/s), decode roofline (kvcalc: bf16 weights, f16 KV at %" PRIu64
               " tokens), alpha-beta ring collectives, no overlap\n"
               "#  source   link       GB/s  alpha_us  comm_ms  compute_ms  step_ms  overhead  speedup  tokens/s\n",
               in.gpu->name, in.gpu->bw_bytes_per_s / 1e12, o->seq_len);
    else
        fprintf(f, ",\n  \"modeled\":[");
    for (int i = 0; i < nl; i++) {
        in.link = links[i];
        kvp_tpcost r;
        int rc = kvp_tpcost_compute(&in, &r, err);
        if (rc < 0)
            return rc;
        double tps = (double)o->batch / r.step_s;
        if (o->json)
            fprintf(f, "%s\n    {\"source\":\"modeled\",\"link\":\"%s\",\"gbps\":%.3f,\"alpha_us\":%.3f,"
                   "\"comm_ms\":%.6f,\"compute_ms\":%.6f,\"compute_tp1_ms\":%.6f,\"step_ms\":%.6f,"
                   "\"overhead\":%.6f,\"speedup\":%.6f,\"tokens_per_s\":%.3f}",
                   i ? "," : "", links[i].name, links[i].bw / 1e9, links[i].alpha * 1e6, r.comm_s * 1e3,
                   r.compute_s * 1e3, r.compute1_s * 1e3, r.step_s * 1e3, r.overhead, r.speedup, tps);
        else
            fprintf(f, "   modeled  %-9s %6.0f  %8.2f  %7.3f  %10.3f  %7.3f  %7.1f%%  %6.2fx  %8.0f\n", links[i].name,
                   links[i].bw / 1e9, links[i].alpha * 1e6, r.comm_s * 1e3, r.compute_s * 1e3, r.step_s * 1e3,
                   100 * r.overhead, r.speedup, tps);
    }
    if (o->json)
        fprintf(f, "\n  ]}\n");
    else
        fprintf(f, "#  speedup: the tp 1 roofline step over this step (tp 1 may not fit in the GPU's memory)\n");
    return 0;
}

static int run_model(FILE *f, const opts *o, kvp_comm *w, kvp_cb_backend *be, kvp_err *err)
{
    const kvp_model_preset *m = kvp_preset_model_find(o->model);
    int n = kvp_comm_size(w), rank = kvp_comm_rank(w);
    kvp_tp_traffic t;
    step_traffic(m, o->tp, o->batch, &t);
    kvp_cb_phase ph[2];
    double step_s = 0;
    int measured = n > 1, rc;
    if (measured && (rc = measure_step(o, w, be, &t, ph, &step_s, err)) < 0)
        return rc;
    if (rank != 0)
        return 0;
    const char *dt = kvp_cb_dtype_name(o->cb.dtype);
    size_t es = kvp_cb_dtype_size(o->cb.dtype);
    if (o->json) {
        /* the presets found, named as kvcalc --json names them (the model's
         * own name, the GPU's canonical one), not as --model and --gpu were
         * spelled (h_1.0-0 is h100-sxm): the two programs' outputs join */
        const kvp_gpu_preset *g = kvp_preset_gpu_find(o->gpu);
        fprintf(f, "{\"program\":\"tpbench\",\"version\":\"%s\",\"model\":\"%s\",\"tp\":%u,\"batch\":%" PRIu64
               ",\"seq_len\":%" PRIu64 ",\"datatype\":\"%s\",\"gpu\":\"%s\",\n  \"traffic\":{\"all_reduce\":%u,"
               "\"all_reduce_bytes\":%" PRIu64 ",\"all_gather\":%u,\"all_gather_bytes\":%" PRIu64 "}",
               KVP_VERSION, m->cfg.name, o->tp, o->batch, o->seq_len, dt, g->name, t.n_allreduce,
               t.allreduce_elems * es, t.n_allgather, t.allgather_elems * es);
    } else if (o->tp <= 1) {
        fprintf(f, "# tpbench --model %s --tp 1 --batch %" PRIu64 ": one decode step's collectives, %s\n"
                "#   none: one rank holds the whole model\n", m->name, o->batch, dt);
    } else {
        fprintf(f, "# tpbench --model %s --tp %u --batch %" PRIu64 ": one decode step's collectives, %s\n"
               "#   %u all_reduce of %" PRIu64 " x %u (%" PRIu64 " B each), %u all_gather of the logits, %" PRIu64
               " x %u (%" PRIu64 " B)\n",
               m->name, o->tp, o->batch, dt, t.n_allreduce, o->batch, m->cfg.n_embd, t.allreduce_elems * es,
               t.n_allgather, o->batch, m->cfg.n_vocab, t.allgather_elems * es);
    }
    if (measured)
        print_measured(f, o, n, be->name, ph, step_s);
    else if (o->json)
        fprintf(f, ",\n  \"measured\":null");
    else if (o->tp == 1)
        fprintf(f, "#\n# measured: nothing to measure (--tp 1 has no collectives)\n");
    else if (!kvp_comm_have_mpi())
        fprintf(f, "#\n# measured: not run (this build has no MPI: install one (Debian: libopenmpi-dev openmpi-bin), "
               "rebuild, and mpirun -np %u tpbench ... measures this machine's transport)\n", o->tp);
    else
        fprintf(f, "#\n# measured: not run (a job of one rank; mpirun -np %u tpbench ... measures this machine's "
               "transport)\n", o->tp);
    return print_modeled(f, o, err);
}

/* ---- main ---- */

/* Set while a silenced rank parses: see linger. */
static int quiet_parse;

/* mpirun ends the whole job as soon as one rank exits non-zero, and rank
 * 0's usage message could go down with it: a silenced rank that finds the
 * same error leaves only after rank 0 has had time to say it. */
static void linger(void)
{
    if (quiet_parse)
        usleep(500 * 1000);
}

/* Parse the options with every rank but the launcher's rank 0 silenced:
 * each rank parses the same argv, and one usage message is enough. */
static void parse_quietly(int argc, char **argv, opts *o)
{
    int saved = -1;
    if (kvp_comm_launched_rank() > 0) {
        int null = open("/dev/null", O_WRONLY);
        saved = dup(2);
        if (null >= 0) {
            dup2(null, 2);
            close(null);
        }
        quiet_parse = 1;
        atexit(linger);
    }
    parse_opts(argc, argv, o);
    quiet_parse = 0;
    if (saved >= 0) {
        dup2(saved, 2);
        close(saved);
    }
}

/* A usage error found after MPI started (it needs the rank count): every
 * rank finds it; rank 0 says it before MPI_Finalize (which waits for all
 * ranks), so no rank's exit can end the job before the message is out. */
static _Noreturn void usage_after_init(int rank, const char *msg)
{
    if (rank == 0) {
        kvp_cli_warn("%s", msg);
        fprintf(stderr, "Try '%s --help' for more information.\n", kvp_cli_prog());
        fflush(stderr);
    }
    kvp_comm_finalize();
    exit(KVP_EXIT_USAGE);
}

/* The sweep's sizes depend on the rank count (each is rounded to whole
 * blocks a rank), so they are checked once MPI is up, yet before any
 * output: a size past the backend's counts (MPI's are int, NCCL's size_t),
 * or too many rows, is a usage error like -b and -e themselves. */
static void check_sizes(const kvp_cb_opts *cb, int rank, int n)
{
    kvp_err err = {0};
    if (kvp_cb_sizes_check(cb, n, &err) < 0)
        usage_after_init(rank, err.msg);
}

/* The same for the collectives a measured --model step runs: one past the
 * backend's counts is a usage error before any output, naming the
 * collective and the largest --batch that fits. */
static void check_step(const opts *o, int rank, int n)
{
    const kvp_model_preset *m = kvp_preset_model_find(o->model);
    uint64_t lim = kvp_cb_backend_max_count(o->backend);
    kvp_tp_traffic t;
    kvp_cb_phase ph[2];
    step_traffic(m, o->tp, o->batch, &t);
    step_phases(&t, ph);
    size_t count;
    for (int p = 0; p < 2; p++) {
        if (kvp_cb_phase_check(&ph[p], n, lim, &count, NULL) == 0)
            continue;
        /* the most sequences whose phase still fits: each adds per elements */
        uint64_t per = ph[p].count / o->batch, fit = lim / per;
        for (kvp_cb_phase q = ph[p]; fit > 0; fit--) {
            size_t c;
            q.count = (size_t)(fit * per);
            if (kvp_cb_phase_check(&q, n, lim, &c, NULL) == 0)
                break;
        }
        char msg[300];
        snprintf(msg, sizeof msg, "--batch %" PRIu64 ": its %s of %zu elements is over the %s backend's %" PRIu64
                 " a call%s: --batch %" PRIu64 " at most", o->batch, kvp_cb_op_name(ph[p].op), count, o->backend,
                 lim, lim == INT_MAX ? " (MPI counts are int)" : "", fit);
        usage_after_init(rank, msg);
    }
}

int main(int argc, char **argv)
{
    kvp_cli_init(argv[0]);
    opts o = {.backend = "mpi", .timeout = 300, .gpu = "h100", .link = "all", .batch = 1, .seq_len = 4096,
              .alpha_us = -1};
    kvp_cb_opts_init(&o.cb);
    parse_quietly(argc, argv, &o);
    if (o.model && !o.dtype_given)
        o.cb.dtype = KVP_CB_DTYPE_BFLOAT16; /* what a GPU serving engine sends */
    kvp_comm_set_timeout(o.timeout);

    kvp_err err = {0};
    kvp_comm *w = NULL;
    if (kvp_comm_world(&w, &err) < 0)
        kvp_cli_die("rank %d: %s", kvp_comm_launched_rank(), err.msg);
    int rank = kvp_comm_rank(w), n = kvp_comm_size(w);
    char msg[160];
    if (!o.model && kvp_cb_op_rooted(o.cb.op) && o.cb.root >= n) {
        snprintf(msg, sizeof msg, "-r %d: the job has %d rank%s", o.cb.root, n, n == 1 ? "" : "s");
        usage_after_init(rank, msg);
    }
    if (!o.model) {
        o.cb.max_count = kvp_cb_backend_max_count(o.backend); /* the counts of the backend it will run on */
        check_sizes(&o.cb, rank, n);
    }
    if (o.model && n > 1 && (uint32_t)n != o.tp) {
        snprintf(msg, sizeof msg, "--tp %u in a job of %d ranks: measure with mpirun -np %u, or run alone to "
                 "model only", o.tp, n, o.tp);
        usage_after_init(rank, msg);
    }
    if (o.model && n > 1)
        check_step(&o, rank, n);
    /* --model alone only models: no backend (a login node has no GPU for
     * --backend nccl, and needs none) */
    int measures = !o.model || n > 1;
    kvp_cb_backend be;
    if (measures && kvp_cb_backend_open(o.backend, w, &be, &err) < 0) {
        kvp_cli_warn("rank %d: %s", rank, err.msg);
        kvp_comm_finalize();
        return KVP_EXIT_FAIL;
    }
    /* --json is one object (tpbench.1): rank 0 writes it into memory and
     * out whole once the run is done, so a run that fails (out of memory,
     * a rank killed) leaves nothing on stdout rather than half a document;
     * the table goes out row by row */
    char *doc = NULL;
    size_t doc_len = 0;
    FILE *f = stdout;
    int rc = 0;
    if (o.json && rank == 0 && !(f = open_memstream(&doc, &doc_len)))
        f = stdout, rc = kvp_err_set(&err, KVP_ENOMEM, "out of memory for the JSON document");
    if (rc == 0)
        rc = o.model ? run_model(f, &o, w, measures ? &be : NULL, &err) : run_collectives(f, &o, w, &be, &err);
    if (f != stdout) {
        if (fclose(f) != 0 && rc >= 0)
            rc = kvp_err_set(&err, KVP_ENOMEM, "out of memory for the JSON document");
        if (rc >= 0)
            fwrite(doc, 1, doc_len, stdout);
        free(doc);
    }
    if (rc < 0) {
        /* one rank's failure would leave the others waiting: end the job */
        kvp_cli_warn("rank %d: %s", rank, err.msg);
        if (n > 1)
            kvp_comm_abort(w, KVP_EXIT_FAIL);
        rc = KVP_EXIT_FAIL;
    }
    if (measures)
        kvp_cb_backend_close(&be);
    kvp_comm_finalize();
    int out = kvp_cli_close_stdout();
    return rc ? rc : out;
}
