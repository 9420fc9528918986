/* The tiles of a kernel job over a 2-D block-cyclic process grid (ScaLAPACK's layout; issue 16,
 * docs/scale-out.md "Layout"): which tiles there are, their numbering in the checkpoint, their
 * extent, and which grid process owns each. Pure arithmetic, no MPI: the grid's shape and this
 * process's place in it come from BLACS (mpi/grid.c). */
#ifndef TPK_MPI_TILES_H
#define TPK_MPI_TILES_H

#include <stddef.h>

/* The kernel's tiles: b items a side (the last row and column of tiles may be shorter), R
 * readouts per item, so a tile is (b·R) × (b·R) entries of the dataset. The training kernel is
 * symmetric: only tiles on or below the diagonal (i ≥ j) are computed; the one below is written
 * transposed into the one above. With a test set, every test × training tile. */
typedef struct mpi_tiles {
    size_t n, m;       /* training and test items (m = 0: no test set) */
    size_t b;          /* items per tile side */
    size_t readouts;   /* kernel rows per item */
    size_t tn, tm;     /* tiles per side: ceil(n / b), ceil(m / b) */
    size_t ntrain;     /* training tiles on or below the diagonal: tn (tn + 1) / 2 */
    size_t ntiles;     /* ntrain + tm · tn */
    int nprow, npcol;  /* the process grid */
} mpi_tiles;

/* One tile: test = 0, row block i ≥ column block j of the training kernel, or test = 1, test
 * row block i, training column block j. */
typedef struct mpi_tile {
    int test;
    size_t i, j;
} mpi_tile;

/* The layout; 0, or -1 when the sizes are out of range (n = 0, b = 0, readouts = 0, a grid
 * dimension < 1, or more tiles than size_t counts). */
int mpi_tiles_init(mpi_tiles *t, size_t n, size_t m, size_t b, size_t readouts, int nprow,
                   int npcol);
/* The checkpoint's number of a tile: training tiles row by row, i (i + 1)/2 + j, then test tiles
 * ntrain + i · tn + j. */
size_t mpi_tiles_id(const mpi_tiles *t, mpi_tile tile);
mpi_tile mpi_tiles_tile(const mpi_tiles *t, size_t id);
/* Items a tile spans: rows r0 .. r0 + nr − 1 of its row set, columns c0 .. c0 + nc − 1. */
void mpi_tiles_extent(const mpi_tiles *t, mpi_tile tile, size_t *r0, size_t *nr, size_t *c0,
                      size_t *nc);
/* The grid process (row, column) that owns the tile: block row i on process row i mod nprow,
 * block column j on process column j mod npcol (ScaLAPACK's block-cyclic distribution with
 * the first block on process (0, 0), RSRC = CSRC = 0). */
void mpi_tiles_owner(const mpi_tiles *t, mpi_tile tile, int *prow, int *pcol);
/* The first tile id >= id that the grid process (prow, pcol) owns, t->ntiles when none:
 * for (id = mpi_tiles_next(t, r, c, 0); id < t->ntiles; id = mpi_tiles_next(t, r, c, id + 1)). */
size_t mpi_tiles_next(const mpi_tiles *t, int prow, int pcol, size_t id);
/* Tiles the grid process (prow, pcol) owns. */
size_t mpi_tiles_count(const mpi_tiles *t, int prow, int pcol);

#endif
