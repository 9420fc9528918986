/* The 2-D process grid of the MPI programs: a BLACS grid (ScaLAPACK's, so that its solvers can
 * take tiles laid out on it in place; docs/scale-out.md "Layout"), row-major over the ranks of
 * MPI_COMM_WORLD. */
#ifndef TPK_MPI_GRID_H
#define TPK_MPI_GRID_H

#include "tpk/error.h"

typedef struct mpi_grid {
    int rank, size;      /* in MPI_COMM_WORLD */
    int nprow, npcol;    /* the grid */
    int myrow, mycol;    /* this process's place in it */
    int ctxt;            /* the BLACS context */
} mpi_grid;

/* "PxQ" (P, Q >= 1) into *p, *q; "auto" gives 0, 0. TPK_EINVAL naming --grid otherwise. */
int mpi_grid_parse(const char *s, int *p, int *q, tpk_ctx *ctx);
/* The grid of nprow × npcol processes (0 × 0: the most nearly square factorisation P × Q of the
 * rank count with P <= Q), which must use every rank (TPK_EINVAL). MPI must be initialised. */
int mpi_grid_init(mpi_grid *g, int nprow, int npcol, tpk_ctx *ctx);
void mpi_grid_free(mpi_grid *g);

#endif
