/* Where gpregress-mpi's kernel tiles come from (issue 16, docs/scale-out.md "gpregress-mpi"):
 * computed in place by the library — gpkernel's evaluator block by block (tpk_kernel_job on the
 * inputs in memory, the code gpkernel-mpi runs), or the RBF kernel of gpregress on the tile's
 * items — or read from an HDF5 kernel file (gpkernel's or gpkernel-mpi's, float64 or float32)
 * with parallel HDF5, every rank reading its own tiles in collective rounds. */
#ifndef TPK_MPI_KSRC_H
#define TPK_MPI_KSRC_H

#include <mpi.h>

#include "kstore.h"
#include "tpk/tpk.h"

typedef struct mpi_ksrc mpi_ksrc;

/* The kernel job's blocks (borrowed: kj outlives the source). */
mpi_ksrc *mpi_ksrc_job(tpk_kernel_job *kj, tpk_ctx *ctx);
/* RBF s·exp(−|x−x'|²/(2ℓ²)), theta = (ℓ², s), on X and Xt (NULL: none; both borrowed). */
mpi_ksrc *mpi_ksrc_rbf(const double theta[2], const tpk_array *X, const tpk_array *Xt,
                       tpk_ctx *ctx);
/* Collective over comm: open path with the MPI-IO driver: /kernel (N×N) and, when present,
 * /kernel_test_train (M×N) with /kernel_test_diag (M); *n, *m (0: no test block) their sizes.
 * TPK_EINVAL naming the dataset when the shapes disagree, TPK_EIO/TPK_EFORMAT when the file
 * cannot be read. */
int mpi_ksrc_file(MPI_Comm comm, const char *path, size_t *n, size_t *m, mpi_ksrc **out,
                  tpk_ctx *ctx);
void mpi_ksrc_free(mpi_ksrc *s);

/* This rank's tiles of the training kernel into K and, with Kx (NULL: none), the test × training
 * block into Kx and this rank's part of the test diagonal into kdiag (M, zeroed first; the caller
 * sums it over the ranks). err (NULL: not wanted): the largest error estimate of the tiles.
 * Collective for a file source (every rank takes part in every round of reads, also after an
 * error of its own); a non-finite entry is TPK_EDOM naming it. */
int mpi_ksrc_fill(mpi_ksrc *s, mpi_kstore *K, mpi_kstore *Kx, double *kdiag, double *err,
                  tpk_ctx *ctx);

#endif
