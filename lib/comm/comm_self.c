/* comm_self.c - kvp_comm without MPI: a world of one process.
 *
 * Collectives over one rank are the identity, so the engine runs the same
 * code alone; asking for a launched job of several ranks is refused with what
 * to install. */
#ifndef KVP_HAVE_MPI
#include "comm.h"

#include <stdlib.h>
#include <string.h>

struct kvp_comm {
    int unused;
};

static kvp_comm self;
static double timeout_s = 300.0;

int kvp_comm_have_mpi(void) { return 0; }
void kvp_comm_set_timeout(double seconds) { timeout_s = seconds > 0 ? seconds : 300.0; }
double kvp_comm_timeout(void) { return timeout_s; }

int kvp_comm_world(kvp_comm **out, kvp_err *err)
{
    *out = NULL;
    if (kvp_comm_launched_size() > 1)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "this build has no MPI, so it runs as one process only: install "
                           "an MPI (Debian: libopenmpi-dev openmpi-bin) and rebuild");
    *out = &self;
    return 0;
}

void kvp_comm_finalize(void) {}
int kvp_comm_rank(const kvp_comm *c) { (void)c; return 0; }
int kvp_comm_size(const kvp_comm *c) { (void)c; return 1; }
void *kvp_comm_handle(kvp_comm *c) { (void)c; return NULL; }

int kvp_comm_split(kvp_comm *c, int color, int key, kvp_comm **out, kvp_err *err)
{
    (void)color, (void)key, (void)err;
    *out = c;
    return 0;
}

void kvp_comm_free(kvp_comm *c) { (void)c; }

int kvp_comm_allreduce_f32(kvp_comm *c, float *x, size_t n, kvp_err *err)
{
    (void)c, (void)x, (void)n, (void)err;
    return 0;
}

int kvp_comm_allgather(kvp_comm *c, const void *send, void *recv, size_t bytes, kvp_err *err)
{
    (void)c, (void)err;
    if (send != recv)
        memmove(recv, send, bytes);
    return 0;
}

int kvp_comm_bcast(kvp_comm *c, void *buf, size_t bytes, int root, kvp_err *err)
{
    (void)c, (void)buf, (void)bytes, (void)root, (void)err;
    return 0;
}

int kvp_comm_bcast_idle(kvp_comm *c, void *buf, size_t bytes, int root, kvp_err *err)
{
    return kvp_comm_bcast(c, buf, bytes, root, err);
}

int kvp_comm_send(kvp_comm *c, const void *buf, size_t bytes, int dst, int tag, kvp_err *err)
{
    (void)c, (void)buf, (void)bytes, (void)tag;
    return kvp_err_set(err, KVP_EINVAL, "send to rank %d in a world of one process", dst);
}

int kvp_comm_recv(kvp_comm *c, void *buf, size_t bytes, int src, int tag, kvp_err *err)
{
    (void)c, (void)buf, (void)bytes, (void)tag;
    return kvp_err_set(err, KVP_EINVAL, "receive from rank %d in a world of one process", src);
}

int kvp_comm_barrier(kvp_comm *c, kvp_err *err)
{
    (void)c, (void)err;
    return 0;
}

int kvp_comm_mpi_error(kvp_err *err, int rc, const char *what)
{
    return kvp_err_set(err, KVP_EIO, "%s: MPI error %d", what, rc);
}

void kvp_comm_setup_done(void) {}

int kvp_comm_wait(kvp_comm *c, void *request, const char *what, kvp_err *err)
{
    (void)c, (void)request;
    return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: no MPI in this build", what);
}

void kvp_comm_abort(kvp_comm *c, int status)
{
    (void)c;
    exit(status);
}
#else
typedef int kvp_comm_self_absent; /* ISO C: a translation unit is never empty */
#endif
