/* Finite-width convergence statistics: kernel errors, bias/fluctuation, power-law fits with
 * bootstrap-over-seeds intervals, and distances between output laws (theory.md §7).
 * Every function is pure: it reads per-(width, seed) data the caller produced and writes results
 * to caller memory. Nothing here runs a network (a study does: include/tpk/study.h).
 *
 * GSL note: the Rao–Blackwellised W1 uses gsl_integration_qag. GSL's default error handler would
 * abort() on a quadrature failure; these functions switch it off first (tpk_error_gsl_init,
 * include/tpk/error.h), so failures come back as TPK_ENUMERIC. */
#ifndef TPK_LIMITS_H
#define TPK_LIMITS_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Kernel error at one width (theory.md §7.2, §7.3) --------------------------------------- */

/* ‖Khat − K‖_F / ‖K‖_F over `len` entries. TPK_EDOM if ‖K‖_F = 0 or a value is not finite. */
TPK_API int tpk_limits_frob_rel(const double *Khat, const double *K, size_t len, double *out,
                                tpk_ctx *ctx);

/* √(mean_s e_s²): the RMS of S per-seed errors (log of this mean is what gets fitted, §7.4). */
TPK_API double tpk_limits_rms(const double *e, size_t S);

/* Bias and fluctuation of S empirical kernels (S × len, seed-major) against the limit K, all
 * relative to ‖K‖_F. With m = mean_s Khat_s and tr Ĉov = Σ_entries (unbiased sample variance):
 *   E‖m − K‖² = b² + tr Cov / S, so b̂² = ‖m − K‖² − tr Ĉov / S is unbiased for b² (§7.3). */
typedef struct tpk_limits_bias_result {
    double bias;            /* ‖m − K‖/‖K‖ (biased upward by the noise) */
    double bias2_debiased;  /* b̂²/‖K‖²: unbiased, may be negative */
    double bias_debiased;   /* √max(b̂², 0)/‖K‖ */
    double floor;           /* √(tr Ĉov / S)/‖K‖: the naive bias's noise floor */
    double fluct;           /* √(tr Ĉov)/‖K‖: RMS fluctuation of one seed about the mean */
} tpk_limits_bias_result;
/* S ≥ 2. */
TPK_API int tpk_limits_bias(const double *Khat, size_t S, size_t len, const double *K,
                            tpk_limits_bias_result *out, tpk_ctx *ctx);

/* ---- Power-law fits (theory.md §7.4) ----------------------------------------------------------- */

/* OLS of log y = a + γ log n over W points (natural logs). se (may be NULL) gets the
 * residual-based standard error of γ (0 when W = 2). TPK_EDOM if some y ≤ 0 or n ≤ 0. */
TPK_API int tpk_limits_fit_power(const double *n, const double *y, size_t W, double *slope,
                                 double *intercept, double *se, tpk_ctx *ctx);

/* Two-term model y ≈ c1 n^(-1/2) + c2 n^(-1) by linear least squares (gsl_multifit_linear).
 * w (may be NULL: unweighted) are weights, e.g. 1/y² for relative errors; cov (may be NULL)
 * gets the 2×2 covariance of (c1, c2), chisq (may be NULL) the weighted residual sum. W ≥ 2. */
TPK_API int tpk_limits_fit_two_term(const double *n, const double *y, const double *w, size_t W,
                                    double *c1, double *c2, double cov[4], double *chisq,
                                    tpk_ctx *ctx);

/* Per-(width, seed) records: recs[(w·S + s)·rec + r], W widths × S seeds × rec doubles. */
typedef struct tpk_limits_series {
    size_t W, S, rec;
    const double *n;      /* widths, W, increasing */
    const double *recs;
} tpk_limits_series;

/* A statistic of one width's S records, evaluated on the resample idx[0..S−1] (indices into the
 * records, repeats allowed; NULL = each record once). Must be pure and thread-safe (the bootstrap
 * calls it from several OpenMP threads). */
typedef int (*tpk_limits_stat_fn)(const double *recs, size_t S, size_t rec, const size_t *idx,
                                  const void *user, double *out, tpk_ctx *ctx);

/* Stock statistics. */
/* rec = 1 (a per-seed error e): √(mean e²). user unused. */
TPK_API int tpk_limits_stat_rms(const double *recs, size_t S, size_t rec, const size_t *idx,
                                const void *user, double *out, tpk_ctx *ctx);
/* rec = 1 (per-seed output variance K̂_n(x,x)): Rao–Blackwellised W1 between the mixture
 * mean_s N(0, K̂_s) and N(0, *(const double *)user); user NULL: against N(0, mean_s K̂_s), the
 * variance-matched ("shape") distance of tpk_limits_rbw1_shape. */
TPK_API int tpk_limits_stat_rbw1(const double *recs, size_t S, size_t rec, const size_t *idx,
                                 const void *user, double *out, tpk_ctx *ctx);
/* rec = 1 (per-seed variances): excess kurtosis of the mixture, 3 Var(v)/E[v]² (unbiased Var). */
TPK_API int tpk_limits_stat_mix_kurtosis(const double *recs, size_t S, size_t rec,
                                         const size_t *idx, const void *user, double *out,
                                         tpk_ctx *ctx);
/* rec = k·k (per-seed K̂ on k inputs), user = const tpk_limits_slices *: RB sliced W1. */
TPK_API int tpk_limits_stat_rbsw1(const double *recs, size_t S, size_t rec, const size_t *idx,
                                  const void *user, double *out, tpk_ctx *ctx);

/* Fit of a statistic against width, with bootstrap-over-seeds intervals. */
typedef struct tpk_limits_fit {
    size_t first;                 /* fitted over widths first..W−1 */
    double slope, intercept;      /* OLS on the full-sample statistic */
    double slope_se;              /* OLS residual standard error (for reference only) */
    double slope_lo, slope_hi;    /* bootstrap percentile interval at `level` */
    double slope_med;             /* bootstrap median */
    double c1, c2;                /* two-term fit c1 n^(-1/2) + c2 n^(-1), weights 1/y² */
    double c1_lo, c1_hi, c2_lo, c2_hi;
    size_t nboot;                 /* replicates requested */
    size_t nfail;                 /* replicates with a non-positive statistic (not in the CI) */
} tpk_limits_fit;

typedef struct tpk_limits_boot_opts {
    size_t B;          /* replicates (1000–2000 for a 95% interval) */
    uint64_t seed;     /* GSL mt19937 seeded per replicate from (seed, replicate): reproducible
                          whatever the thread count */
    double level;      /* e.g. 0.95 */
    int paired;        /* 1: one seed resample shared by all widths (nested / common random
                          numbers, §7.3); 0: independent per width */
    size_t first;      /* fit over widths first..W−1 (W − first ≥ 2) */
} tpk_limits_boot_opts;

/* Evaluate `stat` at every width, fit power law and two-term model, and bootstrap over seeds.
 * value/lo/hi (W each, may be NULL) get the full-sample statistic per width and its percentile
 * interval. Fails if the full-sample statistic is not positive at a fitted width (TPK_EDOM), or if
 * fewer than half the replicates succeed (TPK_ENUMERIC). */
TPK_API int tpk_limits_boot_fit(const tpk_limits_series *d, tpk_limits_stat_fn stat,
                                const void *user, const tpk_limits_boot_opts *o,
                                tpk_limits_fit *fit, double *value, double *lo, double *hi,
                                tpk_ctx *ctx);

/* Stability of the exponent as small widths are dropped: fits[k] for first = k, k = 0..W−2 (one
 * boot fit each; o->first ignored). Returns the first error. */
TPK_API int tpk_limits_stability(const tpk_limits_series *d, tpk_limits_stat_fn stat,
                                 const void *user, const tpk_limits_boot_opts *o,
                                 tpk_limits_fit *fits, tpk_ctx *ctx);

/* The fitting window for an n^(-1/2) statistic (theory.md §7.4), chosen by a rule that never
 * looks at the fitted exponent. `all` is the fit over all W widths (first = 0, e.g. fits[0] of
 * tpk_limits_stability): its two-term model c1 n^(-1/2) + c2 n^(-1) and c2's bootstrap interval.
 *  - If that interval contains 0 (or c1 ≤ 0 … see below), the n^(-1) correction is not resolved
 *    by the data: its effect on the slope is within the noise, and all widths are kept.
 *  - Else `first` is the smallest width whose n^(-1) term is at most `ratio` times the n^(-1/2)
 *    term, |c2| / (c1 √n_first) ≤ ratio. At that width the model's local log-slope,
 *    −(1/2 + r)/(1 + r) with r = c2/(c1 √n), is within |r|/(2(1 − |r|)) of −1/2 (≈ ratio/2),
 *    and closer above.
 * At least `keep` widths stay (2 ≤ keep ≤ W): if the rule would leave fewer, or c1 ≤ 0 with a
 * resolved c2 (no n^(-1/2) regime seen), first = W − keep and *capped = 1: the ladder does not
 * reach widths where the correction is small, and the slope keeps a bias of that sign. */
typedef struct tpk_limits_window {
    size_t first;          /* fit over widths first..W−1 */
    double c1, c2;         /* the all-widths two-term fit (copied from `all`) */
    int resolved;          /* c2's interval excludes 0 */
    double ratio_at_first; /* |c2| / (c1 √n_first) (inf if c1 ≤ 0) */
    double n_needed;       /* the smallest n with ratio ≤ `ratio`: (|c2| / (ratio c1))² */
    int capped;
} tpk_limits_window;
TPK_API int tpk_limits_fit_window(const double *n, size_t W, const tpk_limits_fit *all,
                                  double ratio, size_t keep, tpk_limits_window *out,
                                  tpk_ctx *ctx);

/* ---- Output laws (theory.md §7.5) ----------------------------------------------------------- */

/* W1 between two zero-mean Gaussian scale mixtures Σ_i wa_i N(0, va_i) / Σ wa and
 * Σ_j wb_j N(0, vb_j) / Σ wb (weights NULL: equal; zero weights skipped), by 1-D quadrature of
 * |F_a − F_b| (GSL qag between the sign changes). Variances ≥ 0, not all zero. */
TPK_API int tpk_limits_w1_mixtures(const double *va, const double *wa, size_t na,
                                   const double *vb, const double *wb, size_t nb, double *out,
                                   tpk_ctx *ctx);
/* Rao–Blackwellised W1 of the width-n output law at one input: mixture mean_s N(0, v_s) of the
 * per-seed conditional variances v_s = K̂_n(ω_s)(x,x) against the GP N(0, v_inf). */
TPK_API int tpk_limits_rbw1(const double *v, size_t S, double v_inf, double *out, tpk_ctx *ctx);
/* Its noise floor: the mean over B bootstrap resamples of W1(resampled mixture, full mixture),
 * an estimate of E W1(F̂_S, F_n), the part of the RB-W1 due to finite S. */
/* Variance-matched ("shape") RB-W1: W1(mean_s N(0, v_s), N(0, v̄)), v̄ = mean_s v_s. The mixture
 * and the target have the same variance, so the O((nS)^{-1/2}) first-order sampling noise of the
 * plain RB-W1 cancels exactly and what is left is the O(Var v / v̄) non-Gaussianity, resolvable
 * with S ≪ n. By the triangle inequality
 *   W1(F_n, GP) ≤ shape + √(2/π) |√E v − √v_inf|,
 * the second term being the kernel bias at that input (a bias statistic: resolving it needs
 * S ≫ n, theory.md §7.3). For inputs whose variance is unbiased (ReLU diagonal, no bias) the
 * shape term is the whole distance. */
TPK_API int tpk_limits_rbw1_shape(const double *v, size_t S, double *out, tpk_ctx *ctx);
TPK_API int tpk_limits_rbw1_floor(const double *v, size_t S, size_t B, uint64_t seed,
                                  double *out, tpk_ctx *ctx);

/* Directions for sliced distances: L unit vectors in R^k, and the limit kernel (k×k). */
typedef struct tpk_limits_slices {
    size_t k, L;
    const double *theta;  /* L × k, unit rows */
    const double *K;      /* k × k limit covariance */
    int matched;          /* RB sliced only: compare each slice with N(0, mean_s θᵀK̂_sθ) (shape) */
} tpk_limits_slices;
/* L directions uniform on the sphere (GSL mt19937 seeded with `seed`), into theta (L×k). */
TPK_API int tpk_limits_directions(size_t k, size_t L, uint64_t seed, double *theta, tpk_ctx *ctx);

/* Rao–Blackwellised sliced W1: mean over directions θ of W1(mean_s N(0, θᵀK̂_sθ), N(0, θᵀKθ)).
 * Khat: S × k × k. */
TPK_API int tpk_limits_rbsw1(const double *Khat, size_t S, const tpk_limits_slices *sl,
                             double *out, tpk_ctx *ctx);

/* 1-D W1 of M samples (sorted copy taken internally) against N(0, var):
 * (1/M) Σ_i |x_(i) − √var Φ⁻¹((i − ½)/M)| (§7.5). */
TPK_API int tpk_limits_w1_gauss_samples(const double *x, size_t M, double var, double *out,
                                        tpk_ctx *ctx);
/* Sample-based sliced W1 of M output vectors Y (M × k) against N(0, K): mean over directions of
 * the 1-D estimator above. */
TPK_API int tpk_limits_sw1_samples(const double *Y, size_t M, const tpk_limits_slices *sl,
                                   double *out, tpk_ctx *ctx);
/* GP-vs-GP floor of that estimator: R independent sets of M exact draws from N(0, K)
 * (Cholesky; GSL mt19937 seeded with `seed`), the estimator on each; mean and sd (sd may be
 * NULL) over the R sets. */
TPK_API int tpk_limits_sw1_gp_floor(size_t M, const tpk_limits_slices *sl, size_t R,
                                    uint64_t seed, double *mean, double *sd, tpk_ctx *ctx);

/* Excess kurtosis of M samples: m4/m2² − 3 with central moments (M ≥ 4). */
TPK_API int tpk_limits_kurtosis(const double *x, size_t M, double *out, tpk_ctx *ctx);

/* Two-sample statistics for non-Gaussian limits (attention, theory.md §5, §7.5). X: M × k,
 * Y: P × k (M, P ≥ 2). Energy distance 2E|X−Y| − E|X−X′| − E|Y−Y′| with U-statistics for the
 * within-sample terms (unbiased; can be slightly negative under equality). */
TPK_API int tpk_limits_energy(const double *X, size_t M, const double *Y, size_t P, size_t k,
                              double *out, tpk_ctx *ctx);
/* Unbiased MMD² with the Gaussian kernel exp(−|x−y|²/(2h²)), h > 0. */
TPK_API int tpk_limits_mmd2(const double *X, size_t M, const double *Y, size_t P, size_t k,
                            double h, double *out, tpk_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif
