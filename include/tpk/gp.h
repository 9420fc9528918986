/* Gaussian-process regression from a kernel matrix: fit, predict, marginal likelihood, jitter,
 * diagnostics and hyperparameter fitting (issue 7; Rasmussen & Williams 2006, Alg. 2.1, §5.4). */
#ifndef TPK_GP_H
#define TPK_GP_H

#include <stdio.h>

#include "archs.h"
#include "array.h"
#include "io.h"
#include "kernels.h"
#include "progress.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- fit and predict -------------------------------------------------------------------------
 * Model: each column y_c of Y (N×C) is an independent draw from N(0, K + σ²I); all C outputs share
 * one Cholesky factor A = K + (σ² + jitter)I = UᵀU (LAPACKE_dpotrf). Solves are triangular; no
 * inverse is formed on this path. Matrices are row-major; only the lower triangle of K is read
 * (the strict upper triangle must hold the same values: it is checked, and used to restore K when a
 * factorisation has to be retried with more jitter). */

typedef struct tpk_gp_options {
    int overwrite_k;    /* 1: the factor overwrites K's lower triangle (memory N² + O(NC)); K's
                         * strict upper triangle keeps K. K must outlive the tpk_gp. 0: private copy. */
    double jitter_first; /* first jitter tried after plain σ², relative to mean(diag K) (1e-10) */
    double jitter_max;  /* give up beyond this jitter, relative to mean(diag K) (1e-3) */
    double pivot_ratio_min; /* A counts as numerically PD when dpotrf succeeds and
                         * min U_ii / max U_ii >= this (free: κ₂(A) >= ratio⁻²; default 1e-7) */
    double rcond_min;   /* and, if > 0, its reciprocal condition estimate (dpocon, O(N²) but
                         * ~15 % of a dpotrf at N = 10⁴) is >= this (default 0: not estimated;
                         * tpk_gp_rcond gives it on demand) */
    double sym_tol;     /* tolerated |K_ij − K_ji| relative to max|diag K| (default 1e-8) */
    /* How messages name the caller's things (NULL: the defaults in brackets), so that gpregress
     * and the Python package refuse the same data with the same words (issue 39, item 3). */
    const char *data;       /* the training data, as a prefix "DATA: " (none) */
    const char *noise_name; /* the noise as the caller spells it ("noise"; gpregress: "--noise") */
    const char *noise_auto; /* how the caller asks for a chosen noise ("a noise chosen by the
                             * likelihood"; gpregress: "--noise=auto") */
} tpk_gp_options;

TPK_API void tpk_gp_options_default(tpk_gp_options *o);

typedef struct tpk_gp_info {
    size_t n, c;        /* training points, outputs */
    double noise;       /* σ² as requested */
    double jitter;      /* extra diagonal actually added (absolute), 0 when none was needed */
    int tries;          /* factorisations attempted (1 = first try succeeded) */
    double rcond;       /* dpocon estimate of 1/κ₁(A); NaN when rcond_min = 0 */
    double logdet;      /* log det A */
    double quad;        /* Σ_c y_cᵀ A⁻¹ y_c */
    double lml;         /* log N(Y; 0, A) summed over the C outputs */
} tpk_gp_info;

typedef struct tpk_gp tpk_gp;

/* Fit. K: N×N; Y: N×C (or rank 1, C = 1); noise: σ² ≥ 0. opt may be NULL (defaults).
 * Fails with TPK_EINVAL (shapes, asymmetry), TPK_EDOM (non-finite values, negative noise),
 * TPK_ENUMERIC (not PD even at jitter_max) or TPK_ENOMEM.
 * Interpolation (the rule gpregress and tpk.GPRegressor share): noise 0 asks for a GP through
 * every training point, so two items the kernel cannot tell apart (K_ii + K_jj − 2K_ij within
 * 1e-12 of K_ii + K_jj) must have the same targets (to 1e-9 of the largest), else TPK_EDOM naming
 * both; and a noise below the jitter the factorisation needed asks to interpolate a singular
 * kernel, which holds only for targets in its range: a fit that misses them by more than 1e-3
 * of their norm is TPK_EDOM (no interpolant; give a noise > 0). */
TPK_API tpk_gp *tpk_gp_fit(tpk_array *K, const tpk_array *Y, double noise,
                           const tpk_gp_options *opt, tpk_ctx *ctx);
TPK_API void tpk_gp_free(tpk_gp *gp);
TPK_API const tpk_gp_info *tpk_gp_get_info(const tpk_gp *gp);
/* α = A⁻¹Y as an N×C array (preallocated). */
TPK_API int tpk_gp_weights(const tpk_gp *gp, tpk_array *alpha, tpk_ctx *ctx);

/* Predictive mean (M×C) = Kxt α and, if var != NULL, the latent variance (M) k(x,x) − kᵀA⁻¹k
 * (add σ² for a noisy target), computed in blocks of test points (workspace N×256).
 * Kxt: M×N test × train; kdiag: M test diagonal (needed only for var). */
TPK_API int tpk_gp_predict(const tpk_gp *gp, const tpk_array *Kxt, const tpk_array *kdiag,
                           tpk_array *mean, tpk_array *var, tpk_ctx *ctx);
/* Full latent predictive covariance (M×M) Ktt − Kxt A⁻¹ Kxtᵀ; workspace N×M. */
TPK_API int tpk_gp_predict_cov(const tpk_gp *gp, const tpk_array *Kxt, const tpk_array *Ktt,
                               tpk_array *cov, tpk_ctx *ctx);
/* LAPACK's estimate (dpocon) of the reciprocal 1-norm condition number of A = K + (σ²+jitter)I. */
TPK_API int tpk_gp_rcond(const tpk_gp *gp, double *rcond, tpk_ctx *ctx);
/* Estimate of the smallest eigenvalue of K (not A): `iters` Lanczos steps on A⁻¹ with the factor
 * (O(N²) each, full reorthogonalisation), minus σ² and jitter. A Ritz value, so an upper bound
 * that tightens with iters (exact at N); near or below 0 says K is (numerically) singular. */
TPK_API int tpk_gp_min_eig(const tpk_gp *gp, int iters, double *lambda_min, tpk_ctx *ctx);

/* ---- noise by eigendecomposition --------------------------------------------------------------
 * K = QΛQᵀ once (LAPACKE_dsyevd, O(N³): meant for N up to a few thousand, e.g. a training
 * subsample), then the log marginal likelihood of Y under N(0, s·K + σ²I) costs O(NC) per (s, σ²).
 * With fit_scale the amplitude s is profiled out: for a ratio r = σ²/s the best s is
 * Σ_c y_cᵀ(K + rI)⁻¹y_c / (NC). */
typedef struct tpk_gp_spectral tpk_gp_spectral;
TPK_API tpk_gp_spectral *tpk_gp_spectral_alloc(const tpk_array *K, const tpk_array *Y,
                                               tpk_ctx *ctx);
TPK_API void tpk_gp_spectral_free(tpk_gp_spectral *s);
/* log N(Y; 0, scale·K + noise·I); -inf when that matrix is not PD. */
TPK_API double tpk_gp_spectral_lml(const tpk_gp_spectral *s, double scale, double noise);
/* Smallest and largest eigenvalue of K. */
TPK_API void tpk_gp_spectral_range(const tpk_gp_spectral *s, double *lo, double *hi);

typedef struct tpk_gp_noise_choice {
    double noise;       /* σ² (absolute, for the kernel scale·K) */
    double scale;       /* s (1 unless fit_scale) */
    double lml;         /* the maximised log marginal likelihood */
    int at_bound;       /* 1 if the optimum sits at noise_lo or noise_hi (or was not bracketed) */
    int fits;           /* N×N factorisations used (tpk_gp_fit_search_noise only; else 0) */
} tpk_gp_noise_choice;

/* Maximise the LML over log σ² in [noise_lo, noise_hi] (a 4-per-decade grid, then GSL's Brent
 * minimiser on the best bracket), and over s in closed form when fit_scale. */
TPK_API int tpk_gp_spectral_choose_noise(const tpk_gp_spectral *s, double noise_lo,
                                         double noise_hi, int fit_scale,
                                         tpk_gp_noise_choice *out, tpk_ctx *ctx);

/* Noise by the LML at full size: factorisations of K + σ²I (each O(N³/3)) at guess·10^(±step),
 * then the guess (e.g. a subsample's tpk_gp_spectral_choose_noise), a walk of `step` decades uphill
 * until the LML falls, and a parabolic step when it moves σ² by more than 0.1 decade: 3 factorisations
 * when the guess is best and near the vertex, at most max_fits + 2 in all. With fit_scale the
 * model is s·(K + rI) with s profiled out; σ² here is r and out->noise = r·s. Returns the GP
 * fitted at the chosen r (its predictive variances are for K: multiply by out->scale).
 * opt->overwrite_k: K's lower triangle is reused for every factor (memory N² + O(NC)). */
TPK_API tpk_gp *tpk_gp_fit_search_noise(tpk_array *K, const tpk_array *Y, double guess,
                                        double step, int max_fits, int fit_scale,
                                        const tpk_gp_options *opt, tpk_gp_noise_choice *out,
                                        tpk_ctx *ctx);

/* The walk of tpk_gp_fit_search_noise over any fit of K + σ²I (a distributed or iterative solver:
 * gpregress-mpi, issue 16). eval fits at noise σ² and fills info's n, c, quad (Σ_c y_cᵀA⁻¹y_c) and
 * logdet (log det A, exact or estimated); a non-zero return stops the walk with that status. The
 * last call is at the chosen noise, so the caller's state holds that fit when the walk returns.
 * out as for tpk_gp_fit_search_noise (out->noise = r·s with fit_scale). */
typedef int (*tpk_gp_noise_eval_fn)(double noise, void *data, tpk_gp_info *info, tpk_ctx *ctx);
TPK_API int tpk_gp_noise_walk(tpk_gp_noise_eval_fn eval, void *data, double guess, double step,
                              int max_fits, int fit_scale, tpk_gp_noise_choice *out,
                              tpk_ctx *ctx);

/* ---- hyperparameters ---------------------------------------------------------------------------
 * A kernel family K(θ), θ > 0, with ∂K/∂log θ_i. The built-in families give dK analytically
 * (RBF) or by central finite differences of the kernel in log θ (MLP: the recursion's derivatives
 * need E[φ'φ'] terms the Gaussian module does not expose; see gp/README.md). */
#define TPK_GP_MAXPARAMS 4

typedef struct tpk_gp_family tpk_gp_family;
struct tpk_gp_family {
    size_t n;                             /* kernel size N */
    size_t nparams;                       /* ≤ TPK_GP_MAXPARAMS */
    const char *names[TPK_GP_MAXPARAMS];
    int analytic_grad;                    /* 1: dK exact; 0: finite differences */
    /* K (N×N, full symmetric) at θ; if dK != NULL also dK[i] = ∂K/∂log θ_i (each N×N). */
    int (*eval)(const tpk_gp_family *f, const double *theta, double *K, double *const *dK,
                tpk_ctx *ctx);
    void *data;
    void (*destroy)(void *data);
    tpk_allocator alloc;                  /* what tpk_gp_family_free gives this struct back to
                                           * (tpk/alloc.h); zeroed in a family built by hand:
                                           * free() */
};

/* MLP NNGP (tpk_mlp_kernel) in θ = (σ_w², σ_b²); p->depth and p->phi fixed. X is borrowed.
 * fd_step: step in log θ for the central differences (0: default 1e-4). */
TPK_API tpk_gp_family *tpk_gp_family_mlp_alloc(const tpk_mlp_params *p, const tpk_array *X,
                                               const tpk_gauss_ws *ws, double fd_step,
                                               tpk_ctx *ctx);
/* RBF k(x,x') = s·exp(−|x−x'|²/(2ℓ²)) in θ = (ℓ², s). X is borrowed. */
TPK_API tpk_gp_family *tpk_gp_family_rbf_alloc(const tpk_array *X, tpk_ctx *ctx);
TPK_API void tpk_gp_family_free(tpk_gp_family *f);
/* RBF cross kernel (M×N) and test diagonal (M) for θ = (ℓ², s). */
TPK_API int tpk_gp_rbf_kernel(const double *theta, const tpk_array *X, const tpk_array *Xt,
                              tpk_array *K, tpk_array *Kxt, tpk_array *kdiag, tpk_ctx *ctx);

/* LML of Y under N(0, K + σ²I) and its gradient: grad[i] = ∂LML/∂log θ_i given dK[i] (i < np),
 * grad[np] = ∂LML/∂log σ² (analytic). R&W eq. 5.9: ½ tr((ααᵀ − C A⁻¹) ∂A). The trace term uses
 * A⁻¹ from dpotri in an N×N workspace (the only inverse in the module, for the gradient only).
 * Jitter escalation as in tpk_gp_fit (opt may be NULL); jitter_out (may be NULL) gets it. */
TPK_API int tpk_gp_lml_grad(const tpk_array *K, const tpk_array *Y, double noise,
                            const double *const *dK, size_t np, const tpk_gp_options *opt,
                            double *lml, double *grad, double *jitter_out, tpk_ctx *ctx);

typedef struct tpk_gp_hyper_options {
    unsigned fixed;     /* bit i: hold θ_i; bit nparams: hold the noise */
    int max_iter;       /* default 60 */
    double gtol;        /* stop when |∇(−LML/(NC))| in log θ is below this (default 1e-4) */
    double log_lo, log_hi; /* box on log θ and log σ² (defaults −25, 10): values are clamped */
    void *trace;        /* FILE* for one line per iteration, or NULL */
    int multistart;     /* BFGS runs from the best points of a grid of starts around the given
                         * one (default 3); ≤ 1: the given start only */
} tpk_gp_hyper_options;
TPK_API void tpk_gp_hyper_options_default(tpk_gp_hyper_options *o);

typedef struct tpk_gp_hyper_result {
    double lml;
    int iters, evals;
    int converged;      /* 1: gradient test met; 0: stopped (max_iter or no progress) */
} tpk_gp_hyper_result;

/* Maximise the LML over log θ and log σ² with GSL's vector BFGS (gsl_multimin, gradient-based),
 * from several starts (opt->multistart). theta (nparams) and noise are the start and receive the
 * best point found; res->iters counts the iterations of all runs. */
TPK_API int tpk_gp_fit_hyper(const tpk_gp_family *f, const tpk_array *Y, double *theta,
                             double *noise, const tpk_gp_hyper_options *opt,
                             tpk_gp_hyper_result *res, tpk_ctx *ctx);

/* ---- MLP kernels depth by depth ----------------------------------------------------------------
 * The recursion of tpk_mlp_kernel, stepped one hidden layer at a time so depths 1..p->depth cost
 * one layer each instead of d(d+1)/2. After each layer `cb` sees the kernel of that depth (K N×N,
 * and if Xt != NULL Kxt M×N and kdiag M); it must not modify them. A non-zero return stops. */
typedef int (*tpk_gp_depth_fn)(int depth, const tpk_array *K, const tpk_array *Kxt,
                               const tpk_array *kdiag, void *data, tpk_ctx *ctx);
TPK_API int tpk_gp_mlp_sweep(const tpk_mlp_params *p, const tpk_array *X, const tpk_array *Xt,
                             const tpk_gauss_ws *ws, tpk_array *K, tpk_array *Kxt,
                             tpk_array *kdiag, tpk_gp_depth_fn cb, void *data, tpk_ctx *ctx);

/* ---- infinite-width training dynamics (issue 36, item 1; gp/dynamics.c) ---------------------
 * The mean and covariance over initialisations of an infinite ensemble of infinitely wide networks
 * trained on the loss (1/(2N))‖f(X) − Y‖², exactly as neural-tangents 0.6.5's
 * predict.gradient_descent_mse_ensemble and predict.gp_inference define them (docs/theory.md
 * §8.10). Θ = NTK, K = NNGP; d = train (n points), t = test (m points); Y is
 * n×k; N = n·k (NT's y_train.size); τ = η t; E_τ(A) = I − e^{−τA/N}.
 *   get = NTK:  mean_t(τ) = Θ_td Θ⁻¹E_τ(Θ) Y                  mean_d(τ) = E_τ(Θ) Y
 *               cov_t(τ)  = K_tt + Θ_tdΘ⁻¹E_τ(Θ) K_dd E_τ(Θ)Θ⁻¹Θ_dt − (Θ_tdΘ⁻¹E_τ(Θ)K_dt + transpose)
 *               cov_d(τ)  = e^{−τΘ/N} K_dd e^{−τΘ/N}
 *   get = NNGP: mean as above with K for Θ;  cov_t(τ) = K_tt − K_td K⁻¹(I − e^{−2τK/N}) K_dt,
 *               cov_d(τ) = K_dd e^{−2τK/N}
 *   τ = ∞ (gp_inference): NNGP posterior K_td K⁻¹Y, K_tt − K_td K⁻¹K_dt; NTK Θ_tdΘ⁻¹Y,
 *               K_tt + Θ_tdΘ⁻¹K_ddΘ⁻¹Θ_dt − (Θ_tdΘ⁻¹K_dt + transpose); NTKGP (He et al. 2020) the GP
 *               posterior with Θ as prior covariance: Θ_tdΘ⁻¹Y, Θ_tt − Θ_tdΘ⁻¹Θ_dt.
 * Numerics (as NT): every finite t from one eigendecomposition (dsyevd) of the training kernel
 * G (Θ or K) plus the regulariser; G⁻¹E_τ(G) is (1 − e^{−τλ/N})/λ per eigenvalue with λ clamped
 * at 0 (max(λ, 0)) and its λ → 0 limit τ/N (NT gives 0/0 there); t = ∞ by a Cholesky solve
 * (dpotrf/dpotrs). A singular G at t = ∞ (Cholesky fails, or min/max pivot < 1e-7: κ ≥ 1e14) is
 * TPK_ENUMERIC naming its smallest and largest eigenvalues. No jitter unless diag_reg > 0.
 * Discrete gradient descent (opts.discrete): t counts steps and e^{−τλ/N} becomes (1 − ηλ/N)^t
 * (e^{−2τλ/N}: (1 − ηλ/N)^{2t}), the λ → 0 limit of the ratio η t/N; t = ∞ steps needs
 * η < 2N/λ_max (else TPK_EDOM). Momentum is not implemented. */
typedef enum tpk_gd_get {
    TPK_GD_NTK = 0,   /* all layers trained: Θ trains, K is the prior covariance (NT get='ntk') */
    TPK_GD_NNGP = 1,  /* readout only: K trains (NT get='nngp') */
    TPK_GD_NTKGP = 2  /* tpk_gd_gp_inference only: the GP posterior with Θ as covariance */
} tpk_gd_get;

typedef struct tpk_gd_opts {
    double lr;              /* η > 0 (default 1) */
    double diag_reg;        /* r ≥ 0: G + r·(tr G/n)·I (default 0: none) */
    int diag_reg_absolute;  /* 1: G + r·I instead (NT diag_reg_absolute_scale) */
    int discrete;           /* 1: t counts gradient-descent steps (whole numbers or INFINITY) */
    double momentum;        /* μ in [0, 1): heavy-ball steps θ ← θ − η∇L + μ(θ − θ_prev) from
                             * rest (needs discrete; default 0) */
    tpk_gd_get get;         /* default TPK_GD_NTK */
} tpk_gd_opts;
TPK_API void tpk_gd_opts_default(tpk_gd_opts *o);

/* NT gradient_descent_mse_ensemble at times t[0..nt) (INFINITY allowed: the τ = ∞ row, by
 * Cholesky). Kernels row-major, symmetric ones checked to 1e-8·max|diag|: ntk_dd, nngp_dd n×n;
 * ntk_td, nngp_td m×n; nngp_tt m×m; y n×k (or n: k = 1). get = NTK needs ntk_dd (and ntk_td for
 * test outputs), and nngp_dd (and nngp_td) only for a covariance; get = NNGP reads the nngp ones
 * only (the ntk ones may be NULL). Test outputs when the training kernel's test block (ntk_td or
 * nngp_td) is given: mean nt×m×k, cov (NULL: none; then nngp_tt may be NULL) nt×m×m. Training-set
 * outputs when both test blocks are NULL: mean nt×n×k, cov nt×n×n (at t = ∞: Y and 0).
 * Outputs are preallocated. opt NULL: defaults. Errors: TPK_EINVAL (NULL or mis-shaped arrays,
 * asymmetric kernels, t < 0, fractional steps, bad options), TPK_EDOM (non-finite entries;
 * discrete t = ∞ beyond the stable rate), TPK_ENUMERIC (singular G at t = ∞), TPK_ENOMEM. */
TPK_API int tpk_gd_mse_ensemble(const tpk_array *ntk_dd, const tpk_array *nngp_dd,
                                const tpk_array *ntk_td, const tpk_array *nngp_td,
                                const tpk_array *nngp_tt, const tpk_array *y, const double *t,
                                size_t nt, const tpk_gd_opts *opt, tpk_array *mean,
                                tpk_array *cov, tpk_ctx *ctx);
/* NT gp_inference (τ = ∞) for opt->get = NNGP, NTK or NTKGP: mean m×k, cov m×m (NULL: none).
 * k_tt is the prior test covariance: K_tt for NNGP and NTK, Θ_tt for NTKGP. NTKGP reads the ntk
 * arrays only. opt->lr and opt->discrete are ignored. */
TPK_API int tpk_gd_gp_inference(const tpk_array *ntk_dd, const tpk_array *nngp_dd,
                                const tpk_array *ntk_td, const tpk_array *nngp_td,
                                const tpk_array *k_tt, const tpk_array *y,
                                const tpk_gd_opts *opt, tpk_array *mean, tpk_array *cov,
                                tpk_ctx *ctx);
/* NT max_learning_rate: 2(1 + momentum)·N/(λ_max(ntk_dd) + eps), N = y_size (0: n). NT's
 * defaults are momentum 0, eps 1e-12. Gradient descent (momentum 0) converges iff η is below it. */
TPK_API int tpk_gd_max_learning_rate(const tpk_array *ntk_dd, size_t y_size, double momentum,
                                     double eps, double *lr, tpk_ctx *ctx);

/* ---- experiments: what gpregress runs ---------------------------------------------------------
 * Inputs and targets from files, a kernel per depth (or a precomputed one), noise and
 * hyperparameters chosen by the training marginal likelihood only (never by test data), the
 * posterior mean and variance on the test items, scores, all in one atomically written HDF5 file.
 * Options mirror gpregress's one to one; messages name an option as its caller spelled it: the
 * flag ("--sigma-w2") when `name` is gpregress's, else the field with the flag beside it
 * ("sigma_w2 (gpregress --sigma-w2)"). */
typedef struct tpk_gp_experiment_opts {
    /* kernel: exactly one of `kernel`, `kernel_file` and `program` */
    const char *kernel;         /* "mlp" (the NNGP of tpk_mlp_kernel), "rbf" (s·exp(−|x−x'|²/(2ℓ²)))
                                   or any architecture of the table (include/tpk/archs.h, gpkernel
                                   --list-archs): its kernel by tpk_arch_kernel, or its own job for
                                   the CNN and attention rows, as gpkernel computes it. mlp at one
                                   depth (no --fit-hyper, the default quadrature), or with
                                   arch_flags, sets or layernorm, is the table's row too */
    const char *kernel_file;    /* precomputed, as gpkernel --test writes: /kernel (N×N),
                                   /kernel_test_train (M×N), /kernel_test_diag (M), optional
                                   /kernel_test_test (M×M, for full_cov) */
    const char *phi;            /* mlp: the nonlinearity (default relu) */
    int depth_lo, depth_hi;     /* mlp: hidden layers; a range is swept one layer at a time */
    int quad_degree;            /* Gauss–Hermite degree for φ without closed form, 4..512 */
    double sigma_w2, sigma_b2;  /* mlp variances (default 2, 0) */
    double lengthscale2, amplitude; /* rbf ℓ² and s (default 1, 1) */
    /* data: FILE.h5:/ds, FILE.npy, FILE.csv or IDX (NAME-ubyte[.gz]) */
    const char *train, *test;   /* inputs (with `kernel`); test may be NULL */
    const char *labels, *test_labels; /* targets N×C, or class labels with classify */
    size_t n_train, n_test;     /* use the first items only (0: all) */
    int center;                 /* subtract the training mean of each feature */
    int unit_norm;              /* scale each item to unit norm (after centering) */
    int classify;               /* one-hot targets from integer labels; test accuracy */
    /* noise and hyperparameters */
    int noise_auto;             /* noise (and scale) by the training LML: an eigendecomposition
                                   of the first select_n points, then a full-size walk */
    double noise;               /* fixed noise variance when !noise_auto (>= 0) */
    int fit_scale;              /* noise_auto: profile an output scale s (cov s·(K + rI)) */
    int fit_hyper;              /* BFGS on the LML over kernel parameters and noise, on the
                                   first select_n points (every depth of a range) */
    const char *fix;            /* fit_hyper: held parameters, comma list of sigma_w2, sigma_b2,
                                   lengthscale2, amplitude, noise (NULL: none) */
    size_t select_n;            /* subsample size for noise_auto and fit_hyper (>= 2) */
    int noise_fits;             /* full-size factorisations of the noise walk (0: none) */
    size_t var_n;               /* predictive variances (and NLL) of the first var_n test items
                                   only (0: all) */
    /* output */
    const char *output;         /* HDF5, atomically: mean, var, per kernel the noise, scale, LML,
                                   jitter, rcond, accuracy, NLL; a depth range under /depth_L and
                                   the summary in /depths, /accuracy, ... */
    int full_cov;               /* also the full latent predictive covariance /cov (one depth) */
    int no_var;                 /* skip the predictive variance (and the NLL) */
    int argc;                   /* command line for provenance */
    char **argv;
    const char *name;           /* prefix of the summary's first line and of warnings */
    FILE *summary;              /* one line per kernel, as gpregress prints it; NULL: none */
    FILE *warnings;             /* NULL: none */
    const tpk_progress *progress; /* "steps" done of all (per kernel: the kernel, the noise,
                                   the fit, the predictions; with fit_hyper also the BFGS run)
                                   and the cancel flag (TPK_ECANCELED, no output file); NULL:
                                   none (include/tpk/progress.h) */
    int force;                  /* replace an existing output that is not an HDF5 file of this
                                   toolkit (tpk_h5out_check_replace; --force) */
    /* any kernel (issue 39, item 10): an architecture of the table or a NETSOR program */
    const char *program;        /* a .nsr file: its limit kernel (tpk_job_kernel_arrays) */
    const tpk_param_set *sets;  /* its --set overrides, or the architecture's */
    int nsets;
    int netsor_plus;            /* program: allow Moments without 'use netsor+' */
    const tpk_arch_flag *arch_flags; /* the architecture's flags (depth, phi, sigma-w2, ...;
                                   the param member is looked up in its row) */
    int narch_flags;
    int layernorm;              /* mlp: the LayerNorm programs (gpkernel --layernorm) */
    /* the NTK and training dynamics (issue 36): an architecture of the table, a program, or a
     * kernel file with /ntk, /ntk_test_train, /ntk_test_diag (gpkernel --kernel=both) */
    int kernel_type;            /* TPK_GP_KERNEL_NNGP (0, default) or TPK_GP_KERNEL_NTK: the
                                   posterior's covariance (with the NTK: the NTK-GP, He et al.
                                   2020) and, with predict_gd, what trains (the NTK: every
                                   layer; the NNGP: the readout alone) */
    int ntk_param;              /* the NTK's parameterisation (TPK_NTK_PARAM_*, include/tpk/ntk.h) */
    size_t ntk_width;           /* 'standard': the width n */
    int predict_gd;             /* also the infinite ensemble trained by gradient descent on MSE
                                   (tpk_gd_mse_ensemble) at times[0..ntimes): /gd_mean
                                   (time × test × output), /gd_var (time × the variances' test
                                   items), /gd_time, and with test targets /gd_rmse (and
                                   /gd_accuracy); needs a test set */
    const double *times;        /* gradient-flow times t ≥ 0 (INFINITY: converged), e^{−ηtΘ/N} */
    size_t ntimes;
    double lr;                  /* η > 0 (0: 1) */
    int gd_steps;               /* times count discrete steps of size η (whole numbers) */
    double momentum;            /* with gd_steps: heavy-ball momentum μ in [0, 1) (0: none) */
    const size_t *finite_widths; /* with predict_gd, gd_steps, kernel_type NTK and a program:
                                   finite networks of these widths trained alike (netsor train)
                                   against the prediction (/finite_net_rel, /finite_mean_rel,
                                   /finite_var_rel, /finite_outputs; exponents as attributes) */
    size_t nfinite_widths;
    size_t finite_seeds;        /* networks per width (>= 2; 0: 16) */
    uint64_t finite_seed;       /* network s has seed finite_seed + s at every width */
    size_t finite_boot;         /* bootstrap replicates of the exponents (0: 1000) */
} tpk_gp_experiment_opts;
enum { TPK_GP_KERNEL_NNGP = 0, TPK_GP_KERNEL_NTK = 1 };

/* 1 when the experiment's kernel comes from the architecture table or a NETSOR program (the
 * kernel gpkernel computes), not from gpregress' own mlp recursion, RBF or a kernel file. */
TPK_API int tpk_gp_experiment_table_kernel(const tpk_gp_experiment_opts *o);
/* 1 when the experiment is --arch=mlp with gpregress' own settings only (depth, phi, σ_w², σ_b²:
 * no architecture flags, --set or layernorm): the kernel its recursion also computes (one depth
 * through the table, tpk_gp_experiment_table_kernel; gpregress-mpi tiles it by the recursion). */
TPK_API int tpk_gp_experiment_own_mlp(const tpk_gp_experiment_opts *o);

/* gpregress's defaults: mlp depth 3, relu, σ_w² 2, σ_b² 0, ℓ² 1, s 1, automatic noise with a
 * profiled scale, select_n 2000, 5 noise fits, TPK_GAUSS_DEFAULT_DEGREE; no files, no streams. */
TPK_API void tpk_gp_experiment_opts_default(tpk_gp_experiment_opts *o);
/* The options together: exactly one kernel source, the files each needs, ranges. */
TPK_API int tpk_gp_experiment_check(const tpk_gp_experiment_opts *o, tpk_ctx *ctx);
/* Check, read, open the output (before the heavy work: an unwritable path fails at once), then
 * every kernel: noise, fit, predict, score, write; commit. On failure no output file (and no
 * temporary) is left behind. */
TPK_API int tpk_gp_experiment_run(const tpk_gp_experiment_opts *o, tpk_ctx *ctx);

/* ---- experiments in parts (gp/report.c) --------------------------------------------------------
 * What tpk_gp_experiment_run does around its solver, for a program that solves elsewhere
 * (gpregress-mpi: ScaLAPACK or conjugate gradients over MPI ranks, issue 16) and must read the
 * same data, choose the noise the same way and write the same file: the data, the noise choice's
 * subsample start and walk bookkeeping, and the report (scores, datasets, attributes, summary). */

/* Training and test data as the experiment reads them. */
typedef struct tpk_gp_data {
    tpk_array *X, *Xt;          /* inputs (with o->kernel), centred and scaled as o says; Xt
                                   NULL without o->test */
    tpk_array *Y;               /* training targets N×C (one-hot with classify) */
    tpk_array *Yt;              /* test targets M×C, or NULL */
    tpk_array *Lt;              /* test class labels (classify), or NULL */
    tpk_array *L;               /* training class labels (classify), or NULL */
    size_t n, m, c;             /* training items, test items, outputs */
    tpk_input_info xi, ti, li, lti; /* the files read */
    tpk_allocator al;
} tpk_gp_data;

/* A precomputed kernel is taken as a covariance when K + N·TPK_GP_PSD_REL_TOL·mean(diag K)·I
 * has a Cholesky factor (the experiment's check; its reason in gp/experiment.c). */
#define TPK_GP_PSD_REL_TOL 1e-7

/* Inputs and targets read, for options that passed tpk_gp_experiment_check. With o->kernel_file
 * the kernel is the caller's: n and m are its training and test item counts (m = 0: no test
 * block) and only the targets are read. */
TPK_API tpk_gp_data *tpk_gp_data_read(const tpk_gp_experiment_opts *o, size_t n, size_t m,
                                      tpk_ctx *ctx);
TPK_API void tpk_gp_data_free(tpk_gp_data *d);

/* One kernel's result; NaN: not computed (no dataset is written for a quantity no kernel has). */
typedef struct tpk_gp_result {
    int depth;                  /* the MLP depth, 0 for a single kernel of another kind */
    double noise, scale;        /* σ² (absolute) and s of cov s·(K + (σ²/s) I) */
    double lml, lml_select;     /* training LML; the subsample's, when the noise was chosen */
    double jitter, rcond;       /* the direct solver's extra diagonal and 1/κ₁ estimate */
    double lml_error;           /* error bar of an estimated LML (one standard error) */
    double cg_iterations, cg_residual; /* an iterative solver's iterations and relative residual */
    int fits;                   /* full-size fits of the noise walk (printed only) */
    double seconds;
    double accuracy, nll, rmse; /* set by tpk_gp_report_kernel from the test targets */
} tpk_gp_result;
/* Every quantity NaN, fits 0. */
TPK_API void tpk_gp_result_init(tpk_gp_result *res, int depth);

typedef struct tpk_gp_report tpk_gp_report;
/* Check the output against the inputs and open it (written atomically at commit), for the
 * kernels of o's depth range; print the summary's first line; progress at 0. d must outlive r. */
TPK_API tpk_gp_report *tpk_gp_report_open(const tpk_gp_experiment_opts *o, const tpk_gp_data *d,
                                          tpk_ctx *ctx);
/* Aborts the output unless it was committed (no file left). NULL: no-op. */
TPK_API void tpk_gp_report_free(tpk_gp_report *r);
/* The output, for a program's own datasets and attributes. */
TPK_API tpk_h5out *tpk_gp_report_output(const tpk_gp_report *r);
/* Where a kernel's datasets go: "/depth_L" for a depth range, else "" (the root). */
TPK_API void tpk_gp_report_prefix(const tpk_gp_report *r, int depth, char *buf, size_t len);
/* One more step of o->progress (tpk_gp_experiment_opts.progress); TPK_ECANCELED once cancelled. */
TPK_API int tpk_gp_report_advance(tpk_gp_report *r, tpk_ctx *ctx);
/* The subsample the noise and hyperparameters are chosen on: the first min(select_n, n) items. */
TPK_API size_t tpk_gp_select_size(const tpk_gp_experiment_opts *o, size_t n);
/* The noise by the LML of the subsample: Ks is the kernel of its k items (k×k, the first k of
 * the training set), eigendecomposed (tpk_gp_spectral_choose_noise over 1e-7..1e2 × its mean
 * diagonal). ratio = σ²/s, scale = s, lml_select the subsample's LML; warns at a range edge. */
TPK_API int tpk_gp_report_noise_guess(tpk_gp_report *r, const tpk_array *Ks, double *ratio,
                                      double *scale, double *lml_select, tpk_ctx *ctx);
/* The full-size walk (tpk_gp_noise_walk, o->noise_fits fits) from the subsample's ratio sub:
 * its start and step, then its end (the shift the next kernel starts from; a warning when the
 * optimum was not bracketed). */
TPK_API void tpk_gp_report_noise_start(const tpk_gp_report *r, double sub, double *guess,
                                       double *step);
TPK_API void tpk_gp_report_noise_end(tpk_gp_report *r, double sub,
                                     const tpk_gp_noise_choice *ch);
/* One kernel: scores into res (accuracy, NLL, RMSE), mean (M×C), var (the latent variance of
 * the first items, scaled by s; NULL: none) and cov (NULL: none) written under the kernel's
 * prefix, its summary line printed. mean NULL: no test set. */
TPK_API int tpk_gp_report_kernel(tpk_gp_report *r, tpk_gp_result *res, const tpk_array *mean,
                                 const tpk_array *var, const tpk_array *cov, tpk_ctx *ctx);
/* The summary datasets (one entry per kernel), the attributes, provenance and inputs; commit;
 * with a depth range and classes, the line naming the depth the training LML chooses. */
TPK_API int tpk_gp_report_commit(tpk_gp_report *r, tpk_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif
