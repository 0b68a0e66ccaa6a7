/* launchrank.c - the launcher's rank number, before MPI is initialized. */
#include "launchrank.h"

#include <stdlib.h>

int kvp_comm_launched_rank(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) >= 0)
            return atoi(v);
    }
    /* SLURM_PROCID is set in a batch script too: only a job step's counts */
    const char *step = getenv("SLURM_STEP_ID"), *id = getenv("SLURM_PROCID");
    return step && id && atoi(id) > 0 ? atoi(id) : 0;
}
