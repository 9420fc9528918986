/* A kernel matrix held in tiles over the process grid (issue 16, docs/scale-out.md "Solvers"):
 * the training kernel (N×N, symmetric: only the tiles on or below the diagonal, i ≥ j) or the
 * test × training block (M×N, every tile), each tile on its owner of the 2-D block-cyclic layout
 * (mpi/tiles.h). Two layouts of a process's tiles:
 *   scalapack  float64, ScaLAPACK's local array (column-major, block size = the tile side), with
 *              its descriptor, so that pdpotrf & co. take the matrix in place (the training
 *              kernel's upper tiles are left zero: the solvers read the lower triangle only);
 *   packed     only the owned tiles, one after another, column-major, float64 or float32 (half
 *              the memory: the CG solver's storage; every product accumulates in float64).
 * Products run tile by tile with replicated vectors (every rank holds all N rows, column-major
 * N×k): a process adds its tiles' contributions into a zeroed result, and mpi_sum_all makes the
 * sum every rank's. R = 1 readout per item (GP regression). */
#ifndef TPK_MPI_KSTORE_H
#define TPK_MPI_KSTORE_H

#include <stddef.h>

#include "grid.h"
#include "tiles.h"

enum { MPI_KSTORE_SCALAPACK, MPI_KSTORE_PACKED };

typedef struct mpi_kstore {
    const mpi_tiles *t;
    int test;              /* 0: training kernel (tiles i >= j), 1: test × training */
    int layout, f32;       /* f32: packed float32 storage */
    int myrow, mycol;
    size_t rows, cols;     /* N or M, and N */
    size_t ntiles;         /* tiles held here */
    size_t *ids;           /* their ids (mpi_tiles_id) */
    size_t *off;           /* packed: where each starts (entries) */
    size_t mloc, nloc, lld; /* scalapack: the local array, lld >= 1 */
    double *a;             /* scalapack local array, or packed float64 tiles */
    float *af;             /* packed float32 tiles */
    double *conv;          /* float32: one tile converted to float64 */
    int desc[9];           /* scalapack: the descriptor */
    size_t bytes;          /* the storage held */
} mpi_kstore;

/* ScaLAPACK's numroc: the rows (or columns) of an n-vector in blocks of nb that process p of np
 * holds (first block on process 0). */
size_t mpi_numroc(size_t n, size_t nb, int p, int np);
/* Bytes a store of this layout would hold on process (prow, pcol). */
size_t mpi_kstore_bytes(const mpi_tiles *t, int test, int layout, int f32, int prow, int pcol);

/* The store on grid g (its BLACS context for the descriptor), zeroed. TPK_ENOMEM, or TPK_EINVAL
 * for a layout ScaLAPACK cannot index (sizes beyond int). */
int mpi_kstore_alloc(mpi_kstore *s, const mpi_tiles *t, const mpi_grid *g, int test, int layout,
                     int f32, tpk_ctx *ctx);
void mpi_kstore_free(mpi_kstore *s);

/* Tile k (0 .. ntiles-1) held here: its extent (items) and, column-major, its entries in
 * float64: *p, leading dimension *ld (a float32 tile is converted into s->conv, valid until the
 * next call). */
mpi_tile mpi_kstore_tile(mpi_kstore *s, size_t k, size_t *r0, size_t *nr, size_t *c0, size_t *nc,
                         const double **p, size_t *ld);
/* Store tile k from T (nr × nc row-major, row stride ldT): a non-finite entry is TPK_EDOM naming
 * it (`what`: the dataset or source) and nothing is stored. */
int mpi_kstore_put(mpi_kstore *s, size_t k, const double *T, size_t ldT, const char *what,
                   tpk_ctx *ctx);
/* Add noise to the diagonal of the training kernel held here (its diagonal tiles). */
void mpi_kstore_shift_diag(mpi_kstore *s, double noise);

/* This process's part of products with replicated N×k (column-major, leading dimension N)
 * vectors, added into y (the caller zeroes y first and sums over the ranks after):
 *   training store: y (N×k) += K x, each tile below the diagonal also as its transpose;
 *   test store:     y (M×k) += Kxt x. */
void mpi_kstore_mul(mpi_kstore *s, const double *x, size_t k, double *y);
/* Training store, this process's part (zeroed first, then summed by the caller): the diagonal
 * (N), column p (N), the leading k×k block (row-major, both triangles). */
void mpi_kstore_diag(mpi_kstore *s, double *d);
void mpi_kstore_column(mpi_kstore *s, size_t p, double *col);
void mpi_kstore_lead(mpi_kstore *s, size_t k, double *Kk);
/* Training store, this process's part (zeroed first): the column sums of |K + shift·I| (N), whose
 * largest sum over the ranks is the 1-norm of K + shift·I. */
void mpi_kstore_abs_colsums(mpi_kstore *s, double shift, double *sums);
/* Test store, this process's part: rows i0 .. i0+q-1 of Kxt, transposed: R (N×q column-major,
 * R[j + c·N] = Kxt[i0 + c][j]), zeroed first. */
void mpi_kstore_rows_t(mpi_kstore *s, size_t i0, size_t q, double *R);

#endif
