/* gpregress-mpi's direct solver (issue 16, docs/scale-out.md "Cholesky"): ScaLAPACK's pdpotrf on
 * the training kernel's tiles in place (the tiles are ScaLAPACK's blocks), one factorisation for
 * all C outputs (pdpotrs with C right-hand sides), the log-determinant from the factor's
 * diagonal, the same jitter policy as tpk_gp_fit; variances by pdtrsm on the test × training
 * block. Every function is collective over the grid's ranks. */
#ifndef TPK_MPI_CHOL_H
#define TPK_MPI_CHOL_H

#include "kstore.h"
#include "tpk/gp.h"

typedef struct mpi_chol {
    mpi_kstore *K;          /* the training kernel, scalapack layout (kept as it is) */
    double *fac;            /* the factor of the last fit (K's local layout) */
    size_t n, c;
    const tpk_array *Y;     /* targets N×C (replicated) */
    double *Yl;             /* Y in ScaLAPACK's layout (N×C, blocks of the tile side) */
    size_t ylld, ynloc;
    int descY[9];
    double *alpha;          /* α = A⁻¹Y of the last fit, replicated, column-major N×C */
    double mean_diag;
    tpk_gp_options opt;     /* tpk_gp_fit's jitter policy */
    double noise, jitter;   /* of the last fit: A = K + (noise + jitter) I */
    int tries;
} mpi_chol;

/* K and Y borrowed. mean_diag: of K (the jitter's scale). TPK_ENOMEM (this rank). */
int mpi_chol_alloc(mpi_chol *ch, mpi_kstore *K, const tpk_array *Y, double mean_diag,
                   tpk_ctx *ctx);
void mpi_chol_free(mpi_chol *ch);
/* Factor K + noise·I (with jitter as tpk_gp_fit adds it), solve, info's n, c, quad, logdet, lml,
 * jitter, tries (a tpk_gp_noise_eval_fn with data = ch). TPK_ENUMERIC as tpk_gp_fit's. */
int mpi_chol_fit(double noise, void *ch, tpk_gp_info *info, tpk_ctx *ctx);
/* The estimate of 1/κ₁ of the last fit's A that tpk_gp_rcond (LAPACK's dpocon) makes: ‖A‖₁ from
 * the tiles, ‖A⁻¹‖₁ by dpocon's estimator (dlacn2) on solves with the distributed factor.
 * ScaLAPACK's pdpocon estimates another way (measured: 4.6 times the exact value where dpocon
 * was within 12 %). */
int mpi_chol_rcond(mpi_chol *ch, double *rcond, tpk_ctx *ctx);
/* K + shift·I has a Cholesky factor: 0 on success, else the failing column (1-based). */
int mpi_chol_factors(mpi_chol *ch, double shift, tpk_ctx *ctx);
/* Latent variances k(x,x) − kᵀA⁻¹k of the first mv test items (mv ≥ 1) from the last fit: Kx
 * (scalapack layout) is overwritten by Kx L⁻ᵀ. var (mv) and kdiag replicated. */
int mpi_chol_var(mpi_chol *ch, mpi_kstore *Kx, size_t mv, const double *kdiag, double *var,
                 tpk_ctx *ctx);

#endif
