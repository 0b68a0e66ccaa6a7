/* collbackend.c - a collective benchmark backend by name.  Apart from
 * collbench.c because naming "nccl" pulls NCCL and the CUDA runtime into
 * the link, which only tpbench has (Makefile: NCCL_LIBS). */
#include "collbench.h"

#include <string.h>

int kvp_cb_backend_open(const char *name, kvp_comm *c, kvp_cb_backend *b, kvp_err *err)
{
    memset(b, 0, sizeof *b);
    if (strcmp(name, "mpi") == 0)
        return kvp_cb_mpi_open(c, b, err);
    if (strcmp(name, "nccl") == 0)
        return kvp_cb_nccl_open(c, b, err);
    return kvp_err_set(err, KVP_EINVAL, "unknown backend '%s' (mpi or nccl)", name);
}

void kvp_cb_backend_close(kvp_cb_backend *b)
{
    if (b->close)
        b->close(b->state);
    memset(b, 0, sizeof *b);
}
