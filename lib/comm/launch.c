/* launch.c - how many ranks the launcher started, before MPI is initialized,
 * and how long a stop waits on them. */
#include "comm.h"

#include <stdlib.h>

int kvp_comm_mpi_launched_size(void)
{
    /* OpenMPI's mpirun, MPICH/Hydra (PMI) */
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 0)
            return atoi(v);
    }
    return 1;
}

int kvp_comm_mpi_launched(void) { return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE"); }

int kvp_comm_launched_size(void)
{
    int mpi = kvp_comm_mpi_launched_size(); /* then Slurm's srun */
    if (mpi > 1)
        return mpi;
    const char *step = getenv("SLURM_STEP_ID"), *n = getenv("SLURM_NTASKS");
    if (step && n && atoi(n) > 0)
        return atoi(n);
    return 1;
}

double kvp_comm_stop_grace(double longest_s)
{
    double grace = 2 * longest_s;
    return grace > 0.5 ? grace : 0.5;
}
