/* Per-rank plumbing of the MPI programs (mpi/rank.h). */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "rank.h"

#include "../tools/cli.h"

#include <cblas.h>
#include <mpi.h>
#include <omp.h>

#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* MPI counts are ints: long buffers go in pieces. */
#define MPI_PIECE ((size_t)1 << 28)

int mpi_settle(int st, int usage_error, const tpk_ctx *ctx, const char *tool)
{
    int rank, first, rc = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int key = st ? rank : INT_MAX;
    MPI_Allreduce(&key, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (first == INT_MAX)
        return 0;
    if (rank == first)
        rc = usage_error ? cli_report_usage(tool, st, ctx) : cli_report(tool, st, ctx);
    MPI_Bcast(&rc, 1, MPI_INT, first, MPI_COMM_WORLD);
    return rc;
}

int mpi_start(int *argc, char ***argv)
{
    int provided, rank;
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank != 0 && !freopen("/dev/null", "w", stdout))
        return -1;
    mpi_pick_threads();
    return rank;
}

int mpi_local_ranks(void)
{
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    long r = local ? strtol(local, NULL, 10) : 1;
    return r >= 1 && r < INT_MAX ? (int)r : 1;
}

void mpi_pick_threads(void)
{
    long ranks = mpi_local_ranks(), cores = sysconf(_SC_NPROCESSORS_ONLN);
    int per = cores >= 1 && cores / ranks > 0 ? (int)(cores / ranks) : 1;
    /* a rank the launcher bound to some cores (Open MPI binds to a core for np <= 2) has
     * those: more threads would share them (one rank on one of two cores took 2.9x the CG
     * time of two ranks, its two BLAS threads on one core) */
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) >= 1 &&
        CPU_COUNT(&set) < cores)
        per = CPU_COUNT(&set);
    if (!getenv("OMP_NUM_THREADS"))
        omp_set_num_threads(per);
    /* OpenBLAS (pthreads build) keeps its own pool, one thread per core by default: the ranks'
     * products (CG, ScaLAPACK) would oversubscribe the node as many times as it has ranks */
    if (!getenv("OPENBLAS_NUM_THREADS") && !getenv("OMP_NUM_THREADS"))
        openblas_set_num_threads(per);
}

void mpi_sum_root(double *buf, size_t n)
{
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    for (size_t k = 0; k < n; k += MPI_PIECE) {
        int len = (int)(n - k < MPI_PIECE ? n - k : MPI_PIECE);
        MPI_Reduce(rank == 0 ? MPI_IN_PLACE : buf + k, buf + k, len, MPI_DOUBLE, MPI_SUM, 0,
                   MPI_COMM_WORLD);
    }
}

void mpi_sum_all(double *buf, size_t n)
{
    mpi_sum_root(buf, n);
    mpi_bcast_doubles(buf, n);
}

void mpi_bcast_doubles(double *buf, size_t n)
{
    for (size_t k = 0; k < n; k += MPI_PIECE) {
        int len = (int)(n - k < MPI_PIECE ? n - k : MPI_PIECE);
        MPI_Bcast(buf + k, len, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    }
}
