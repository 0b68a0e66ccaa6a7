/* launch.c - how many ranks the launcher started, before MPI is initialized. */
#include "comm.h"

#include <stdlib.h>

int kvp_comm_launched_size(void)
{
    /* OpenMPI's mpirun, MPICH/Hydra (PMI), then Slurm's srun. */
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 0)
            return atoi(v);
    }
    const char *step = getenv("SLURM_STEP_ID"), *n = getenv("SLURM_NTASKS");
    if (step && n && atoi(n) > 0)
        return atoi(n);
    return 1;
}
