/* The 2-D process grid of the MPI programs: a BLACS grid (ScaLAPACK's, so that its solvers can
 * take tiles laid out on it in place; docs/scale-out.md "Layout"), row-major over the ranks of
 * MPI_COMM_WORLD. */
#ifndef TPK_MPI_GRID_H
#define TPK_MPI_GRID_H

#include <getopt.h>
#include <stddef.h>

#include "tpk/error.h"

typedef struct mpi_grid {
    int rank, size;      /* in MPI_COMM_WORLD */
    int nprow, npcol;    /* the grid */
    int myrow, mycol;    /* this process's place in it */
    int ctxt;            /* the BLACS context */
} mpi_grid;

/* "PxQ" (P, Q >= 1) into *p, *q; "auto" gives 0, 0. TPK_EINVAL naming --grid otherwise. */
int mpi_grid_parse(const char *s, int *p, int *q, tpk_ctx *ctx);

/* The layout options of every MPI program: getopt entries --tile=B, --grid=PxQ and
 * --dtype=float64|float32 with the values base, base + 1, base + 2, and their values. */
#define MPI_LAYOUT_OPTIONS(base)                                                                  \
    {"tile", required_argument, NULL, (base)}, {"grid", required_argument, NULL, (base) + 1},     \
        {"dtype", required_argument, NULL, (base) + 2}
typedef struct mpi_layout {
    size_t tile;         /* items per tile side */
    int nprow, npcol;    /* 0, 0: auto */
    int f32;             /* float32 storage */
} mpi_layout;
/* Option `which` (0 tile, 1 grid, 2 dtype) of MPI_LAYOUT_OPTIONS; tiles of 1 .. tile_max items.
 * TPK_EINVAL naming the option. */
int mpi_layout_option(int which, const char *arg, size_t tile_max, mpi_layout *l, tpk_ctx *ctx);
/* The grid of nprow × npcol processes (0 × 0: the most nearly square factorisation P × Q of the
 * rank count with P <= Q), which must use every rank (TPK_EINVAL). MPI must be initialised. */
int mpi_grid_init(mpi_grid *g, int nprow, int npcol, tpk_ctx *ctx);
void mpi_grid_free(mpi_grid *g);

#endif
