/* gpregress-mpi's iterative solver (issue 16, docs/scale-out.md "Conjugate gradients"): block
 * preconditioned conjugate gradients on (K + σ²I) X = B over the distributed tiles — every
 * right-hand side its own recurrence, one product K·[columns] per iteration for all of them
 * (the modified batched CG of Gardner, Pleiss, Bindel, Weinberger & Wilson, NeurIPS 2018) —
 * with a pivoted-Cholesky (rank r, Harbrecht, Peters & Schneider 2012) or block-Jacobi (the
 * diagonal tiles) preconditioner; the kernel in float32 or float64 storage, every product
 * accumulated in float64. log det(K + σ²I) by stochastic Lanczos quadrature (Ubaru, Chen & Saad,
 * SIAM J. Matrix Anal. Appl. 38, 2017) on Rademacher probes solved in the same block: the
 * recurrences' coefficients are the Lanczos tridiagonals of the preconditioned matrix. Every
 * function is collective over the ranks; vectors are replicated (every rank holds all N rows). */
#ifndef TPK_MPI_PCG_H
#define TPK_MPI_PCG_H

#include <stdint.h>

#include "kstore.h"
#include "tpk/gp.h"
#include "../tools/cli.h"

enum { MPI_PRECOND_NONE, MPI_PRECOND_PIVCHOL, MPI_PRECOND_JACOBI };

typedef struct mpi_pcg_opts {
    double tol;        /* stop a column when ‖r‖ ≤ tol·‖b‖ */
    int maxiter;
    int precond;       /* MPI_PRECOND_* */
    size_t rank;       /* pivoted Cholesky: columns (at most) */
    int probes;        /* SLQ: Rademacher probes (>= 2: the error bar is their spread) */
    uint64_t seed;     /* of the probes */
    cli_progress *prog; /* rank 0's progress line (NULL: none): each solve a stage counted in
                         * tenths of decades of the largest residual, so its ETA assumes the
                         * linear convergence of CG */
} mpi_pcg_opts;

typedef struct mpi_pcg mpi_pcg;

/* The solver on the training kernel K (packed or scalapack layout) and targets Y (N×C,
 * replicated), both borrowed; the preconditioner's noise-free part built here (pivoted Cholesky
 * of K, or the eigendecompositions of the diagonal tiles). Errors are every rank's. */
int mpi_pcg_alloc(mpi_kstore *K, const tpk_array *Y, const mpi_pcg_opts *o, mpi_pcg **out,
                  tpk_ctx *ctx);
void mpi_pcg_free(mpi_pcg *p);
/* Solve at noise σ² for Y and the probes: α, quad = Σ yᵀα and the SLQ estimate of log det into
 * info (a tpk_gp_noise_eval_fn with data = the mpi_pcg). */
int mpi_pcg_fit(double noise, void *p, tpk_gp_info *info, tpk_ctx *ctx);
/* Of the last fit: α (N×C, column-major, replicated), the standard error of the log-determinant,
 * the block's iterations and the largest relative residual of the targets' columns, and the
 * preconditioner's rank actually used (pivoted Cholesky; 0 otherwise). */
const double *mpi_pcg_alpha(const mpi_pcg *p);
void mpi_pcg_stats(const mpi_pcg *p, double *logdet_se, int *iters, double *residual,
                   size_t *pc_rank);
/* Latent variances k(x,x) − kᵀA⁻¹k of the first mv test items at the last fit's noise: the rows
 * of Kx solved in blocks (one solve per item). var (mv), kdiag replicated. */
int mpi_pcg_var(mpi_pcg *p, mpi_kstore *Kx, size_t mv, const double *kdiag, double *var,
                tpk_ctx *ctx);

#endif
