/* Internal to gp/: the checked, jittered Cholesky factorisation shared by fit and the LML gradient. */
#ifndef TPK_GP_IMPL_H
#define TPK_GP_IMPL_H

#include "tpk/gp.h"

#include <stddef.h>

/* Automatic noise: σ²/s searched over this range relative to the mean diagonal of K (the
 * experiment's subsample choice and the start of its hyperparameter fit). */
#define GP_NOISE_REL_LO 1e-7
#define GP_NOISE_REL_HI 1e2

/* Storage convention: a row-major N×N matrix's lower triangle is the column-major upper triangle
 * of the same buffer, so every LAPACK call is LAPACK_COL_MAJOR with uplo 'U' (no transposed copies,
 * which LAPACKE's row-major wrappers would make) and A = UᵀU with U = Lᵀ. */

/* Validated kernel: finite lower triangle, symmetric within tolerance; col_abs[i] is the sum of
 * |K_ij| over j ≠ i (for the 1-norm that dpocon needs), diag[i] = K_ii. */
typedef struct gp_kcheck {
    double *col_abs;
    double *diag;
    double mean_diag;
    tpk_allocator al; /* of col_abs and diag */
} gp_kcheck;

/* mean(diag K) of an N×N array. */
double tpk_gp_impl_mean_diag(const tpk_array *K);
/* The noise search range of kernel K: GP_NOISE_REL_LO..GP_NOISE_REL_HI of its mean diagonal (1
 * for a zero one); TPK_EDOM when it overflows (an amplitude or variance near the largest double:
 * issue 18's "noise range must satisfy 0 < lo < hi < inf (got inf, inf)"). */
int tpk_gp_impl_noise_range(const tpk_array *K, double *lo, double *hi, tpk_ctx *ctx);

int tpk_gp_impl_check_kernel(const double *K, size_t n, double sym_tol, const char *what,
                             gp_kcheck *kc, tpk_ctx *ctx);
void tpk_gp_impl_kcheck_free(gp_kcheck *kc);
/* Y as targets of an N×N kernel (N or N×C, finite: tpk_array_check_finite naming `entry`). */
int tpk_gp_impl_check_targets(const char *entry, const tpk_array *Y, size_t n, size_t *c,
                              tpk_ctx *ctx);
int tpk_gp_impl_check_noise(double noise, tpk_ctx *ctx);

/* Factor A = K + (noise + jitter)I into the buffer A (N×N). src == A: overwrite mode (K's strict
 * upper triangle and kc->diag restore it between tries); otherwise the lower triangle of src is
 * copied in first (anorm may be NULL: receives ‖A‖₁); restore_first: A holds an earlier factor, restore before the first try. On success *jitter, *tries and *rcond (NaN if not estimated) are set. */
int tpk_gp_impl_factor(double *A, const double *src, size_t n, double noise, const gp_kcheck *kc,
                       const tpk_gp_options *opt, int restore_first, double *jitter, int *tries,
                       double *rcond, double *anorm, tpk_ctx *ctx);

/* α (column-major N×C: output c at alpha + c·N) = A⁻¹Y from the factor; returns quad = Σ yᵀα. */
int tpk_gp_impl_solve(const double *A, size_t n, const tpk_array *Y, size_t c, double *alpha,
                      double *quad, tpk_ctx *ctx);
double tpk_gp_impl_logdet(const double *A, size_t n);

/* gpregress --predict=gd --finite-widths: finite networks trained alike against the prediction
 * (gp/gd_finite.c). mean (times × m × 1) and var (times × mv, or NULL) are the prediction's, kd
 * the NNGP's test diagonal (the variances at t = 0). */
int gp_gd_finite(const tpk_gp_experiment_opts *o, const tpk_gp_data *d, const tpk_array *T,
                 const tpk_array *K, const tpk_array *Txt, const tpk_array *Kxt,
                 const tpk_array *kd, const tpk_array *mean, const tpk_array *var, size_t mv,
                 const tpk_gd_opts *go, tpk_h5out *out, tpk_ctx *ctx);

#endif
