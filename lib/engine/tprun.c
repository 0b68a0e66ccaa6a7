/* tprun.c - starting and ending a tensor- or pipeline-parallel job
 * (runopts.h: --tp, --pp). */
#include "runopts.h"
#include "cli.h"
#include "comm.h"
#include "fingerprint.h"
#include "shard.h"
#include "stopsig.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The driver's world while the job runs; an exit before kvp_run_tp_close
 * (a fatal error's exit(1)) aborts the job from atexit. */
static kvp_comm *live;

/* Set when every rank knows the job cannot start (agree_parts): rank 0's
 * exit then ends MPI with the others instead of aborting them. */
static int ended_together;

static void abort_job_at_exit(void)
{
    if (ended_together) {
        kvp_comm_finalize();
        return;
    }
    if (live) {
        fprintf(stderr, "%s: rank 0 is ending before the job did; stopping every rank\n", kvp_cli_prog());
        kvp_comm_abort(live, 1);
    }
}

/* Every rank's --tp and --pp, side by side: a rank started with others
 * than rank 0's would cut another part of the model and take another place
 * in the layout, computing garbage with the rest or waiting in a
 * collective they never join (mpirun -np 1 decode --tp 2 : -np 1 decode
 * --pp 2).  The same answer on every rank: 0, or KVP_EINVAL naming the
 * first rank that differs and both splits. */
static int agree_split(const kvp_parallel *d, kvp_err *err)
{
    int n = kvp_comm_size(d->world);
    uint32_t mine[2] = {d->tp_size, d->pp_size}, *all = malloc((size_t)n * sizeof mine);
    if (!all)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory for the ranks' --tp and --pp");
    int rc = kvp_comm_allgather(d->world, mine, all, sizeof mine, err);
    int first = 0, differ = 0;
    for (int q = 1; q < n && rc == 0; q++)
        if (all[2 * q] != all[0] || all[2 * q + 1] != all[1])
            first = first ? first : q, differ++;
    if (differ)
        rc = kvp_err_set(err, KVP_EINVAL, "rank %d was started with --tp %u --pp %u, rank 0 with --tp %u --pp %u "
                         "(%d of the job's %d ranks differ): every rank needs the same --tp and --pp", first,
                         all[2 * first], all[2 * first + 1], all[0], all[1], differ, n);
    free(all);
    return rc;
}

/* The world, checked against --tp and --pp, and this rank's place in it:
 * world rank = stage * tp + tp rank; d->tp the ranks of its stage.  On an
 * error every rank meets alike (how the job was started: its size, the
 * ranks' --tp and --pp) *usage is set. */
static kvp_parallel joined; /* rank 0 joins once: kvp_run_tp_follow, then kvp_run_tp_open */

static int join(const kvp_runopts *o, kvp_parallel *d, int *usage, kvp_err *err)
{
    *usage = 0;
    if (joined.world) { /* splitting again would be a collective the others never join */
        *d = joined;
        return 0;
    }
    memset(d, 0, sizeof *d);
    d->tp_size = o->tp ? o->tp : 1;
    d->pp_size = o->pp ? o->pp : 1;
    kvp_comm_set_timeout(o->timeout);
    kvp_comm *w = NULL;
    int rc = kvp_comm_world(&w, err);
    if (rc < 0)
        return rc;
    uint32_t want = d->tp_size * d->pp_size;
    d->world = w; /* for the rank in messages */
    if ((rc = agree_split(d, err)) < 0) {
        *usage = rc == KVP_EINVAL;
        return rc;
    }
    if ((uint32_t)kvp_comm_size(w) != want) {
        *usage = 1;
        return kvp_err_set(err, KVP_EINVAL, "--tp %u --pp %u: %u ranks, but the job has %d: start it with mpirun -np "
                           "%u (or srun -n %u)", d->tp_size, d->pp_size, want, kvp_comm_size(w), want, want);
    }
    d->world = w;
    d->stage = (uint32_t)kvp_comm_rank(w) / d->tp_size;
    if ((rc = kvp_comm_split(w, (int)d->stage, kvp_comm_rank(w), &d->tp, err)) < 0)
        return rc;
    if (kvp_comm_rank(w) == 0 && !live) {
        joined = *d;
        live = w;
        static int registered;
        if (!registered++)
            atexit(abort_job_at_exit);
    }
    return 0;
}

static int shard_of(const kvp_model *m, const kvp_parallel *d, kvp_model **out, kvp_err *err)
{
    return kvp_model_shard(out, m, (uint32_t)kvp_comm_rank(d->world) % d->tp_size, d->tp_size, d->stage, d->pp_size,
                           err);
}

/* What rank 0 tells the others before the job starts (agree_parts). */
typedef struct start_word {
    uint8_t bad;                               /* rank 0 could not take its part */
    uint8_t fingerprint[KVP_FINGERPRINT_SIZE]; /* of rank 0's model (model.h) */
    char model[240];                           /* its path, cut to fit, for the others' messages */
} start_word;

/* What the ranks agreed: whether rank 0 took its part, how many ranks past
 * 0 did not, and of those how many hold another model than rank 0's. */
typedef struct agreed {
    int ok0, failed, other;
} agreed;

/* A rank past 0 whose model m is not rank 0's: another file, or the same
 * weights in another format or quantization (every rank would compute
 * its part of another model, and the sum of the parts is nobody's). */
static int other_model(const kvp_model *m, const start_word *w, kvp_err *err)
{
    char mine[2 * KVP_FINGERPRINT_SIZE + 1], theirs[2 * KVP_FINGERPRINT_SIZE + 1];
    kvp_model_fingerprint_hex(m, mine);
    kvp_fingerprint_hex(w->fingerprint, theirs);
    return kvp_err_set(err, KVP_EMISMATCH, "%s is not rank 0's model %s (fingerprint %s, rank 0's %s): every rank "
                       "must load the same model, in the same format and quantization", m->path, w->model, mine,
                       theirs);
}

/* Every rank has read the model and cut its part, or failed to: they say
 * so to each other before the job starts, and a rank past 0 whose model is
 * not rank 0's (m, the whole model; NULL when it failed to load) fails
 * here, *my_rc and my_err saying so.  An error that every rank meets alike
 * (heads that do not split over --tp) is then said once, by rank 0, and
 * the ranks end together: no abort, no message from each. */
static int agree_parts(const kvp_parallel *d, const kvp_model *m, int *my_rc, kvp_err *my_err, agreed *a,
                       kvp_err *err)
{
    int rank = kvp_comm_rank(d->world);
    /* rank 0's word first, waited for as long as it takes (it may read a
     * --compare prompts pipe before its model), then the others' counts */
    start_word w;
    memset(&w, 0, sizeof w);
    if (rank == 0) {
        w.bad = *my_rc < 0;
        if (m) {
            memcpy(w.fingerprint, m->fingerprint, sizeof w.fingerprint);
            snprintf(w.model, sizeof w.model, "%s", m->path);
        }
    }
    int rc = kvp_comm_bcast_idle(d->world, &w, sizeof w, 0, err);
    if (rc < 0)
        return rc;
    float n[2] = {0, 0}; /* ranks past 0 that failed; of them, with another model */
    if (rank != 0 && *my_rc == 0 && !w.bad && memcmp(m->fingerprint, w.fingerprint, sizeof w.fingerprint) != 0)
        *my_rc = other_model(m, &w, my_err), n[1] = 1;
    n[0] = rank != 0 && *my_rc < 0;
    if ((rc = kvp_comm_allreduce_f32(d->world, n, 2, err)) < 0)
        return rc;
    a->ok0 = !w.bad, a->failed = (int)n[0], a->other = (int)n[1];
    return 0;
}

int kvp_run_tp_open(kvp_run *r, const kvp_runopts *o, kvp_err *err)
{
    int usage;
    int rc = join(o, &r->dist, &usage, err);
    if (rc < 0)
        return rc;
    r->whole = r->model;
    r->model = NULL;
    rc = shard_of(r->whole, &r->dist, &r->model, err);
    agreed a;
    kvp_err aerr = {0};
    if (agree_parts(&r->dist, r->whole, &rc, err, &a, &aerr) < 0)
        return rc < 0 ? rc : kvp_err_set(err, aerr.code, "%s", aerr.msg);
    kvp_comm_setup_done(); /* a stop's grace follows the steps from here, not the loads */
    int n = kvp_comm_size(r->dist.world);
    if (rc == 0 && a.other) {
        char fp[2 * KVP_FINGERPRINT_SIZE + 1];
        kvp_model_fingerprint_hex(r->whole, fp);
        rc = kvp_err_set(err, KVP_EMISMATCH, "%d of the job's %d ranks loaded another model than %s (fingerprint %s; "
                         "each says which): every rank must load the same model", a.other, n, r->whole->path, fp);
    } else if (rc == 0 && a.failed) {
        rc = kvp_err_set(err, KVP_EINVAL, "%d of the job's %d ranks could not take their part of the model (each "
                         "says why)", a.failed, n);
    }
    if (rc < 0)
        ended_together = 1, live = NULL;
    return rc;
}

void kvp_run_tp_close(kvp_run *r)
{
    if (!r->dist.world)
        return;
    kvp_err err = {0};
    if (kvp_engine_tp_end(&r->dist, &err) < 0)
        kvp_cli_warn("%s", err.msg);
    live = NULL;
    kvp_comm_free(r->dist.tp);
    memset(&r->dist, 0, sizeof r->dist);
    memset(&joined, 0, sizeof joined);
    kvp_comm_finalize();
}

int kvp_run_tp_follow(const kvp_runopts *o)
{
    /* mpirun's ranks, or srun's tasks of a job step (a batch script's own
     * commands see the job's task count but no step: not counted) */
    int launched = kvp_comm_launched_size();
    const char *how = kvp_comm_mpi_launched_size() > 1 ? "mpirun -np" : "srun -n";
    /* every rank would run the whole job: its outputs twice, its files
     * written by each (the programs leave usage errors to rank 0) */
    if (o->tp <= 1 && o->pp <= 1 && launched > 1)
        kvp_cli_usage_error("started as one of %d ranks (%s %d), but without --tp or --pp each rank would "
                            "run the whole job: give --tp and --pp whose product is %d, or start one process",
                            launched, how, launched, launched);
    if (o->tp <= 1 && o->pp <= 1)
        return -1;
    kvp_err err = {0};
    kvp_parallel d;
    kvp_model *m = NULL, *shard = NULL;
    kvp_backend *be = NULL;
    int usage;
    int rc = join(o, &d, &usage, &err);
    if (rc < 0 && usage) {
        /* a job of the wrong size, or ranks given other --tp or --pp, is
         * how it was started, a usage error (as tpbench's): said once, by
         * rank 0; every rank knows it, so all end together */
        if (kvp_comm_rank(d.world) == 0) {
            kvp_cli_warn("%s", err.msg);
            fprintf(stderr, "Try '%s --help' for more information.\n", kvp_cli_prog());
            fflush(stderr);
        }
        kvp_comm_finalize();
        return KVP_EXIT_USAGE;
    }
    if (rc == 0 && kvp_comm_rank(d.world) == 0)
        return -1; /* the driver: kvp_run_tp_open takes the place it joined */
    if (rc == 0)
        kvp_stopsig_defer(); /* a stop is rank 0's to make */
    if (rc == 0) {
        if ((rc = kvp_model_load(&m, o->model, &err)) == 0)
            rc = shard_of(m, &d, &shard, &err);
        agreed a;
        kvp_err aerr = {0};
        if (agree_parts(&d, rc == 0 ? m : NULL, &rc, &err, &a, &aerr) < 0) {
            if (rc == 0)
                rc = -1, err = aerr;
        } else if (!a.ok0 || a.failed) {
            /* the job will not start: rank 0 says why (a rank's own
             * failure it says itself when rank 0 has none to say) */
            if (rc < 0 && a.ok0)
                fprintf(stderr, "%s: rank %d: %s\n", kvp_cli_prog(), kvp_comm_rank(d.world), err.msg);
            kvp_model_free(shard);
            kvp_model_free(m);
            kvp_comm_free(d.tp);
            kvp_comm_finalize();
            return 1;
        }
    }
    if (rc == 0 && (rc = kvp_run_open_backend(&be, o, &err)) == 0)
        rc = kvp_engine_tp_serve(shard, be, &d, &err);
    kvp_backend_free(be);
    kvp_model_free(shard);
    kvp_model_free(m);
    if (rc < 0) {
        fprintf(stderr, "%s: rank %d: %s\n", kvp_cli_prog(), d.world ? kvp_comm_rank(d.world) : -1, err.msg);
        if (d.world)
            kvp_comm_abort(d.world, 1);
        return 1;
    }
    kvp_comm_free(d.tp);
    kvp_comm_finalize();
    return 0;
}
