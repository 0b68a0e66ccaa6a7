/* tprun.c - starting and ending a tensor- or pipeline-parallel job
 * (runopts.h: --tp, --pp). */
#include "runopts.h"
#include "cli.h"
#include "comm.h"
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

/* The world, checked against --tp and --pp, and this rank's place in it:
 * world rank = stage * tp + tp rank; d->tp the ranks of its stage. */
static kvp_parallel joined; /* rank 0 joins once: kvp_run_tp_follow, then kvp_run_tp_open */

static int join(const kvp_runopts *o, kvp_parallel *d, kvp_err *err)
{
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
    if ((uint32_t)kvp_comm_size(w) != want)
        return kvp_err_set(err, KVP_EINVAL, "--tp %u --pp %u: %u ranks, but the job has %d: start it with mpirun -np "
                           "%u (or srun -n %u)", d->tp_size, d->pp_size, want, kvp_comm_size(w), want, want);
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

/* Every rank has read the model and cut its part, or failed to: they say
 * so to each other before the job starts.  *ok0 whether rank 0 cut its
 * part, *failed how many ranks past 0 did not.  An error that every rank
 * meets alike (heads that do not split over --tp) is then said once, by
 * rank 0, and the ranks end together: no abort, no message from each. */
static int agree_parts(const kvp_parallel *d, int my_rc, int *ok0, int *failed, kvp_err *err)
{
    int rank = kvp_comm_rank(d->world);
    /* rank 0's word first, waited for as long as it takes (it may read a
     * --compare prompts pipe before its model), then the others' count */
    uint8_t bad0 = rank == 0 && my_rc < 0;
    float n = rank != 0 && my_rc < 0 ? 1.0f : 0.0f;
    int rc = kvp_comm_bcast_idle(d->world, &bad0, 1, 0, err);
    if (rc == 0)
        rc = kvp_comm_allreduce_f32(d->world, &n, 1, err);
    if (rc < 0)
        return rc;
    *ok0 = !bad0, *failed = (int)n;
    return 0;
}

int kvp_run_tp_open(kvp_run *r, const kvp_runopts *o, kvp_err *err)
{
    int rc = join(o, &r->dist, err);
    if (rc < 0)
        return rc;
    r->whole = r->model;
    r->model = NULL;
    rc = shard_of(r->whole, &r->dist, &r->model, err);
    int ok0, failed;
    kvp_err aerr = {0};
    if (agree_parts(&r->dist, rc, &ok0, &failed, &aerr) < 0)
        return rc < 0 ? rc : kvp_err_set(err, aerr.code, "%s", aerr.msg);
    if (rc == 0 && failed)
        rc = kvp_err_set(err, KVP_EINVAL, "%d of the job's %d ranks could not take their part of the model (each "
                         "says why)", failed, kvp_comm_size(r->dist.world));
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
    int launched = kvp_comm_mpi_launched_size();
    /* every rank would run the whole job: its outputs twice, its files
     * written by each (the programs leave usage errors to rank 0) */
    if (o->tp <= 1 && o->pp <= 1 && launched > 1)
        kvp_cli_usage_error("started as one of %d ranks (mpirun -np %d), but without --tp or --pp each rank would "
                            "run the whole job: give --tp and --pp whose product is %d, or start one process",
                            launched, launched, launched);
    if (o->tp <= 1 && o->pp <= 1)
        return -1;
    kvp_err err = {0};
    kvp_parallel d;
    kvp_model *m = NULL, *shard = NULL;
    kvp_backend *be = NULL;
    int rc = join(o, &d, &err);
    if (rc < 0 && d.world && (uint32_t)kvp_comm_size(d.world) != d.tp_size * d.pp_size) {
        /* a job of the wrong size is how it was started, a usage error
         * (as tpbench's): said once, by rank 0; every rank knows it, so
         * all end together */
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
        int ok0 = 1, failed = 0;
        kvp_err aerr = {0};
        if (agree_parts(&d, rc, &ok0, &failed, &aerr) < 0) {
            if (rc == 0)
                rc = -1, err = aerr;
        } else if (!ok0 || failed) {
            /* the job will not start: rank 0 says why (a rank's own
             * failure it says itself when rank 0 has none to say) */
            if (rc < 0 && ok0)
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
