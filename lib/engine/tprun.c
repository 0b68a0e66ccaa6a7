/* tprun.c - starting and ending a tensor-parallel job (runopts.h: --tp). */
#include "runopts.h"
#include "backend_cpu.h"
#include "cli.h"
#include "comm.h"
#include "shard.h"

#include <stdio.h>
#include <stdlib.h>

/* The driver's group while the job runs; an exit before kvp_run_tp_close
 * (a fatal error's exit(1)) aborts the job from atexit. */
static kvp_comm *live;

static void abort_job_at_exit(void)
{
    if (live) {
        fprintf(stderr, "%s: rank 0 is ending before the job did; stopping every rank\n", kvp_cli_prog());
        kvp_comm_abort(live, 1);
    }
}

/* The world, checked against --tp. */
static int join(const kvp_runopts *o, kvp_comm **w, kvp_err *err)
{
    kvp_comm_set_timeout(o->timeout);
    int rc = kvp_comm_world(w, err);
    if (rc < 0)
        return rc;
    if ((uint32_t)kvp_comm_size(*w) != o->tp)
        return kvp_err_set(err, KVP_EINVAL, "--tp %u, but the job has %d rank%s: start it with mpirun -np %u (or "
                           "srun -n %u)", o->tp, kvp_comm_size(*w), kvp_comm_size(*w) == 1 ? "" : "s", o->tp, o->tp);
    if (kvp_comm_rank(*w) == 0 && !live) {
        live = *w;
        static int registered;
        if (!registered++)
            atexit(abort_job_at_exit);
    }
    return 0;
}

int kvp_run_tp_open(kvp_run *r, const kvp_runopts *o, kvp_err *err)
{
    kvp_comm *w = NULL;
    int rc = join(o, &w, err);
    if (rc < 0)
        return rc;
    r->whole = r->model;
    r->model = NULL;
    r->tp = w;
    return kvp_model_shard(&r->model, r->whole, 0, o->tp, err);
}

void kvp_run_tp_close(kvp_run *r)
{
    if (!r->tp)
        return;
    kvp_err err = {0};
    if (kvp_engine_tp_end(r->tp, &err) < 0)
        kvp_cli_warn("%s", err.msg);
    live = NULL;
    r->tp = NULL;
    kvp_comm_finalize();
}

int kvp_run_tp_follow(const kvp_runopts *o)
{
    if (o->tp <= 1)
        return -1;
    kvp_err err = {0};
    kvp_comm *w = NULL;
    kvp_model *m = NULL, *shard = NULL;
    kvp_backend *be = NULL;
    int rc = join(o, &w, &err);
    if (rc == 0 && kvp_comm_rank(w) == 0)
        return -1;
    if (rc == 0 && (rc = kvp_model_load(&m, o->model, &err)) == 0 &&
        (rc = kvp_model_shard(&shard, m, (uint32_t)kvp_comm_rank(w), o->tp, &err)) == 0 &&
        (rc = kvp_backend_cpu_create(&be, o->threads, 0, &err)) == 0)
        rc = kvp_engine_tp_serve(shard, be, w, &err);
    kvp_backend_free(be);
    kvp_model_free(shard);
    kvp_model_free(m);
    if (rc < 0) {
        fprintf(stderr, "%s: rank %d: %s\n", kvp_cli_prog(), w ? kvp_comm_rank(w) : -1, err.msg);
        if (w)
            kvp_comm_abort(w, 1);
        return 1;
    }
    kvp_comm_finalize();
    return 0;
}
