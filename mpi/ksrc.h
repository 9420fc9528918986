/* Where gpregress-mpi's kernel tiles come from (issue 16, docs/scale-out.md "gpregress-mpi"):
 * computed in place by the library — gpregress's MLP kernel (tpk_mlp_kernel; a tile at the cost
 * of its own entries by tpk_mlp_kernel_cross) or its RBF kernel on the tile's items — or read
 * from an HDF5 kernel file (gpkernel's or gpkernel-mpi's, float64 or float32) with parallel
 * HDF5, every rank reading its own tiles in collective rounds. */
#ifndef TPK_MPI_KSRC_H
#define TPK_MPI_KSRC_H

#include <mpi.h>

#include "kstore.h"
#include "tpk/tpk.h"
#include "../tools/cli.h"

typedef struct mpi_ksrc mpi_ksrc;

/* RBF s·exp(−|x−x'|²/(2ℓ²)), theta = (ℓ², s), on X and Xt (NULL: none; both borrowed). */
mpi_ksrc *mpi_ksrc_rbf(const double theta[2], const tpk_array *X, const tpk_array *Xt,
                       tpk_ctx *ctx);
/* gpregress's MLP kernel (tpk_mlp_kernel, theory.md §2.1) on X and Xt (NULL: none; both
 * borrowed): every layer's diagonal computed once here, each tile then at the cost of its own
 * entries. */
mpi_ksrc *mpi_ksrc_mlp(const char *phi, int quad_degree, int depth, double sigma_w2,
                       double sigma_b2, const tpk_array *X, const tpk_array *Xt, tpk_ctx *ctx);
/* Collective over comm: open path with the MPI-IO driver: /BASE (N×N) and, when present,
 * /BASE_test_train (M×N) with /BASE_test_diag (M), BASE "kernel" (the NNGP) or "ntk" (gpkernel
 * --kernel=ntk|both: the NTK-GP's covariance); *n, *m (0: no test block) their sizes.
 * TPK_EINVAL naming the dataset when the shapes disagree, TPK_EIO/TPK_EFORMAT when the file
 * cannot be read. */
int mpi_ksrc_file(MPI_Comm comm, const char *path, const char *base, size_t *n, size_t *m,
                  mpi_ksrc **out, tpk_ctx *ctx);
void mpi_ksrc_free(mpi_ksrc *s);

/* This rank's tiles of the training kernel into K and, with Kx (NULL: none), the test × training
 * block into Kx and this rank's part of the test diagonal into kdiag (M, zeroed first; the caller
 * sums it over the ranks). err (NULL: not wanted): the largest error estimate of the tiles.
 * Collective for a file source (every rank takes part in every round of reads, also after an
 * error of its own); a non-finite entry is TPK_EDOM naming it. prog (NULL: none): a stage of
 * the progress line counting the computed tiles (its prog and on as set by the caller). */
int mpi_ksrc_fill(mpi_ksrc *s, mpi_kstore *K, mpi_kstore *Kx, double *kdiag, double *err,
                  cli_progress *prog, tpk_ctx *ctx);

#endif
