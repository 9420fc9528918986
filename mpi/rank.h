/* What every MPI program of mpi/ does on each rank: one outcome of a step for all ranks (the
 * lowest failing rank's message and exit status), OpenMP threads per rank, and sums that every
 * rank sees bit for bit alike (so that all ranks take the same decisions from them). */
#ifndef TPK_MPI_RANK_H
#define TPK_MPI_RANK_H

#include <stddef.h>

#include "tpk/error.h"

/* The start of every MPI program: MPI initialised (funneled threads), stdout kept on rank 0 only
 * (help, version and the summary are rank 0's), OpenMP threads per rank (mpi_pick_threads).
 * Returns this rank, or -1 when stdout cannot be redirected. */
int mpi_start(int *argc, char ***argv);
/* Collective over MPI_COMM_WORLD. Every rank's status of one step → 0 when all succeeded, else
 * the exit status of the lowest failing rank, which alone prints its message (usage_error: as a
 * command-line error, exit 2; else exit 1) under the name `tool`. */
int mpi_settle(int st, int usage_error, const tpk_ctx *ctx, const char *tool);
/* OpenMP and OpenBLAS threads: the node's cores shared by its ranks
 * (OMPI_COMM_WORLD_LOCAL_SIZE), unless OMP_NUM_THREADS (or OPENBLAS_NUM_THREADS) says otherwise. */
void mpi_pick_threads(void);
/* Ranks on this node (OMPI_COMM_WORLD_LOCAL_SIZE; 1 when unknown). */
int mpi_local_ranks(void);
/* Collective: buf (n doubles on every rank) becomes the sum over the ranks, the same bits on
 * every rank: reduced to rank 0 and broadcast from it (MPI_Allreduce does not promise equal
 * results on all ranks). */
void mpi_sum_all(double *buf, size_t n);
/* Collective: the sum over the ranks on rank 0 only (the others' buf is left as it was). */
void mpi_sum_root(double *buf, size_t n);
/* Collective: rank 0's n doubles on every rank. */
void mpi_bcast_doubles(double *buf, size_t n);

#endif
