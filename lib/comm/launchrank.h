/* launchrank.h - this process's rank as its launcher numbered it, read
 * before MPI is initialized (comm.h's kvp_comm_launched_size has the
 * size): a program can keep all but rank 0 quiet while it parses options. */
#ifndef KVP_LAUNCHRANK_H
#define KVP_LAUNCHRANK_H

/* OMPI_COMM_WORLD_RANK (OpenMPI), PMI_RANK (MPICH/Hydra), SLURM_PROCID
 * (srun); 0 when started alone. */
int kvp_comm_launched_rank(void);

#endif
