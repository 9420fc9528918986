/* Infinite-width training dynamics (issue 36, item 1): the mean and covariance over initialisations
 * of an infinite ensemble trained by gradient flow (or discrete gradient descent) on MSE, as
 * neural-tangents' predict.gradient_descent_mse_ensemble and gp_inference define them
 * (theory.md §8.10). Notation: G is the kernel that trains (Θ for get = ntk, K
 * for get = nngp), K the NNGP (the covariance at initialisation), N = n·k the number of target
 * entries, τ = η t, E_τ(A) = I − e^{−τA/N}. */
#include "gp-impl.h"
#include "tpk/alloc.h"

#include <cblas.h>
#include <float.h>
#include <lapacke.h>
#include <math.h>
#include <string.h>

/* Kernels must be symmetric to this, relative to their largest |diagonal| (as tpk_gp_options'
 * sym_tol): the eigen- and Cholesky paths read one triangle, the products read both. */
#define GD_SYM_TOL 1e-8
/* t = ∞: a Cholesky factor UᵀU with min U_ii / max U_ii below this proves κ₂ ≥ 1e14 (λ_min ≤
 * min U_ii², λ_max ≥ max U_ii²): Θ⁻¹ is then rounding, and the call fails like a singular Θ. */
#define GD_PIVOT_MIN 1e-7

void tpk_gd_opts_default(tpk_gd_opts *o)
{
    o->lr = 1.0;
    o->diag_reg = 0.0;
    o->diag_reg_absolute = 0;
    o->discrete = 0;
    o->momentum = 0.0;
    o->get = TPK_GD_NTK;
}

static const char *mode_name(tpk_gd_get g)
{
    return g == TPK_GD_NNGP ? "nngp" : g == TPK_GD_NTKGP ? "ntkgp" : "ntk";
}

/* ---- checks ------------------------------------------------------------------------------ */

static int check_matrix(const char *entry, const char *name, const tpk_array *a, size_t rows,
                        size_t cols, tpk_ctx *ctx)
{
    if (!a || !a->data)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: %s is NULL", entry, name);
    if (a->ndim != 2 || a->dims[0] != rows || a->dims[1] != cols)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: %s must be %zu×%zu (got rank %d, %zu×%zu)", entry,
                         name, rows, cols, a->ndim, a->dims[0], a->ndim > 1 ? a->dims[1] : 1);
    return tpk_array_check_finite(a, entry, name, ctx);
}

static int check_symmetric(const char *entry, const char *name, const tpk_array *a,
                           tpk_ctx *ctx)
{
    const size_t n = a->dims[0];
    const double *k = a->data;
    double dmax = 0;
    for (size_t i = 0; i < n; i++)
        dmax = fmax(dmax, fabs(k[i * n + i]));
    const double tol = GD_SYM_TOL * (dmax > 0 ? dmax : 1.0);
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < i; j++)
            if (!(fabs(k[i * n + j] - k[j * n + i]) <= tol))
                return TPK_ERROR(ctx, TPK_EINVAL, "%s: %s is not symmetric: [%zu][%zu] = %.17g "
                                 "but [%zu][%zu] = %.17g", entry, name, i, j, k[i * n + j], j, i,
                                 k[j * n + i]);
    return TPK_OK;
}

/* ---- the problem ---------------------------------------------------------------------------- */

typedef struct gd_problem {
    const char *entry;
    size_t n, m, k;      /* train points, test points (0: train-set predictions), outputs */
    int test;            /* 1: test-set predictions */
    int ntk_cov;         /* 1: covariance by the NTK formula (K ≠ G); 0: GP-posterior form */
    const double *gtd;   /* m×n test×train of the training kernel G */
    const double *kdd;   /* n×n NNGP (ntk_cov only) */
    const double *ktd;   /* m×n NNGP test×train (ntk_cov only) */
    const double *ktt;   /* m×m prior covariance of the test outputs, or NULL: no covariance */
    int want_cov;        /* train set: covariance asked for */
    const double *y;     /* n×k */
    double *g;           /* n×n copy of G + regulariser (owned) */
    double *w;           /* eigen path: rows are the eigenvectors of G (owned, n×n) */
    double *lam;         /* eigenvalues, ascending (owned, n) */
    int have_eig;
} gd_problem;

/* G + diag_reg·(tr G / n)·I, or + diag_reg·I (NT's _add_diagonal_regularizer). */
static int copy_regularised(gd_problem *p, const tpk_array *G, const tpk_gd_opts *o,
                            tpk_ctx *ctx)
{
    const size_t n = p->n;
    p->g = tpk_malloc(ctx, n * n * sizeof(double));
    if (!p->g)
        return TPK_ERROR(ctx, TPK_ENOMEM, "%s: out of memory (%zu doubles)", p->entry, n * n);
    memcpy(p->g, G->data, n * n * sizeof(double));
    if (o->diag_reg != 0) {
        double tr = 0;
        for (size_t i = 0; i < n; i++)
            tr += p->g[i * n + i];
        double r = o->diag_reg_absolute ? o->diag_reg : o->diag_reg * tr / (double)n;
        for (size_t i = 0; i < n; i++)
            p->g[i * n + i] += r;
    }
    return TPK_OK;
}

/* G = Wᵀ diag(λ) W (dsyevd on the row-major lower triangle, read as column-major upper: the
 * eigenvectors land as the rows of W). */
static int eigen(gd_problem *p, tpk_ctx *ctx)
{
    if (p->have_eig)
        return TPK_OK;
    const size_t n = p->n;
    p->w = tpk_malloc(ctx, n * n * sizeof(double));
    p->lam = tpk_malloc(ctx, n * sizeof(double));
    if (!p->w || !p->lam)
        return TPK_ERROR(ctx, TPK_ENOMEM, "%s: out of memory (%zu doubles)", p->entry, n * n);
    memcpy(p->w, p->g, n * n * sizeof(double));
    lapack_int info = LAPACKE_dsyevd(LAPACK_COL_MAJOR, 'V', 'U', (lapack_int)n, p->w,
                                     (lapack_int)n, p->lam);
    if (info != 0)
        return TPK_ERROR(ctx, TPK_ENUMERIC, "%s: the eigendecomposition of the training %s "
                         "failed (dsyevd info %d)", p->entry, p->ntk_cov ? "NTK" : "kernel",
                         (int)info);
    p->have_eig = 1;
    return TPK_OK;
}

/* One factor per eigenvalue λ at time t (theory.md §8.10, "Numerics, as NT does them"):
 *   e = e^{−τλ⁺/N}            (gradient flow, τ = η t) or (1 − ηλ⁺/N)^t (t steps of GD),
 *   r = (1 − e)/λ⁺            = the eigenvalue of G⁻¹E_τ(G), with its λ⁺ → 0 limit τ/N (or ηt/N);
 * λ⁺ = max(λ, 0): NT clamps the exponent only and divides by |λ|, which gives 0/0 at λ = 0 and 0
 * for a negative (rounding) λ; the clamp in both keeps r continuous at 0. `mult` scales t (2 for
 * e^{−2τK/N} of the NNGP covariances). */
static void factors(double lam, double t, double mult, double eta, double nn, int discrete,
                    double *e, double *r)
{
    double l = lam > 0 ? lam : 0;
    double s = t * mult;
    if (!discrete) {
        double x = eta * s / nn; /* τ/N */
        double em1 = expm1(-l * x); /* e − 1 */
        *e = 1 + em1;
        *r = l > 0 ? -em1 / l : x;
        return;
    }
    double a = eta * l / nn; /* ηλ/N */
    if (a < 1) {
        double em1 = s == 0 ? 0 : expm1(s * log1p(-a));
        *e = 1 + em1;
        *r = l > 0 ? -em1 / l : eta * s / nn;
    } else {
        *e = pow(1 - a, s);
        *r = (1 - *e) / l;
    }
}

/* The same factors for s steps of heavy-ball gradient descent, θ ← θ − η∇L + μ(θ − θ_prev) from
 * rest: along an eigenvector of G the residual is ρ_s = 1 − a q_s (a = ηλ⁺/N), where
 * q_{s+1} = (1 + μ − a) q_s − μ q_{s−1} + 1, q_0 = q_{−1} = 0 (ρ_{−1} = ρ_0: no initial
 * velocity). q_s is read off a power of the affine 3×3 step (log₂ s squarings), which keeps
 * r = q_s η/N exact at λ = 0; μ = 0 gives (1 − a)^s. */
static void factors_momentum(double lam, double s, double eta, double nn, double mu, double *e,
                             double *r)
{
    double a = eta * (lam > 0 ? lam : 0) / nn;
    double M[9] = {1 + mu - a, -mu, 1, 1, 0, 0, 0, 0, 1}, P[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1}, X[9];
    for (unsigned long long k = (unsigned long long)s; k; k >>= 1) {
        if (k & 1) {
            for (int i = 0; i < 3; i++)
                for (int j = 0; j < 3; j++)
                    X[i * 3 + j] = P[i * 3] * M[j] + P[i * 3 + 1] * M[3 + j] + P[i * 3 + 2] * M[6 + j];
            memcpy(P, X, sizeof P);
        }
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 3; j++)
                X[i * 3 + j] = M[i * 3] * M[j] + M[i * 3 + 1] * M[3 + j] + M[i * 3 + 2] * M[6 + j];
        memcpy(M, X, sizeof M);
    }
    double q = P[2]; /* (P (0, 0, 1)ᵀ)_0 */
    *e = 1 - a * q;
    *r = q * eta / nn;
}

/* Scratch for the eigen path. */
typedef struct gd_eig_ws {
    double *wy;  /* n×k   W Y */
    double *a;   /* m×n   G_td Wᵀ */
    double *b;   /* m×n   K_td Wᵀ (ntk_cov) */
    double *c;   /* n×n   W K Wᵀ (ntk_cov) */
    double *pm;  /* m×n or n×n: A·diag(r), or diag(e)·C·diag(e) */
    double *q;   /* n×max(m,n) */
    double *e, *r, *r2, *e2;
} gd_eig_ws;

static void eig_ws_free(gd_eig_ws *s, tpk_ctx *ctx)
{
    double **ps[] = {&s->wy, &s->a, &s->b, &s->c, &s->pm, &s->q, &s->e, &s->r, &s->r2, &s->e2};
    for (size_t i = 0; i < sizeof ps / sizeof *ps; i++) {
        tpk_free(ctx, *ps[i]);
        *ps[i] = NULL;
    }
}

/* Row-major C = alpha·op(A)·op(B) + beta·C. */
static void mm(int ta, int tb, size_t M, size_t N, size_t K, double alpha, const double *A,
               size_t lda, const double *B, size_t ldb, double beta, double *C, size_t ldc)
{
    if (M == 0 || N == 0)
        return;
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

static int eig_ws_alloc(gd_problem *p, gd_eig_ws *s, tpk_ctx *ctx)
{
    const size_t n = p->n, m = p->m, k = p->k, mx = (m > n ? m : n) ? (m > n ? m : n) : 1;
    memset(s, 0, sizeof *s);
    s->wy = tpk_malloc(ctx, n * k * sizeof(double) + 1);
    s->a = tpk_malloc(ctx, (m ? m : 1) * n * sizeof(double));
    s->b = tpk_malloc(ctx, (m ? m : 1) * n * sizeof(double));
    s->c = tpk_malloc(ctx, n * n * sizeof(double));
    s->pm = tpk_malloc(ctx, mx * n * sizeof(double));
    s->q = tpk_malloc(ctx, mx * mx * sizeof(double));
    s->e = tpk_malloc(ctx, n * sizeof(double));
    s->r = tpk_malloc(ctx, n * sizeof(double));
    s->e2 = tpk_malloc(ctx, n * sizeof(double));
    s->r2 = tpk_malloc(ctx, n * sizeof(double));
    if (!s->wy || !s->a || !s->b || !s->c || !s->pm || !s->q || !s->e || !s->r || !s->e2 ||
        !s->r2) {
        eig_ws_free(s, ctx);
        return TPK_ERROR(ctx, TPK_ENOMEM, "%s: out of memory (workspace of %zu doubles)",
                         p->entry, 4 * mx * n + 4 * n);
    }
    mm(0, 0, n, k, n, 1, p->w, n, p->y, k, 0, s->wy, k);
    if (p->test)
        mm(0, 1, m, n, n, 1, p->gtd, n, p->w, n, 0, s->a, n);
    if (p->ntk_cov && (p->ktt || p->want_cov)) {
        mm(0, 0, n, n, n, 1, p->w, n, p->kdd, n, 0, s->q, n);
        mm(0, 1, n, n, n, 1, s->q, n, p->w, n, 0, s->c, n);
        if (p->test)
            mm(0, 1, m, n, n, 1, p->ktd, n, p->w, n, 0, s->b, n);
    }
    return TPK_OK;
}

/* Mean and covariance at one finite time (theory.md §8.10, "Mean and covariance over
 * initialisations"). mean: (m or n)×k; cov: (m or n)² or NULL. */
static void eig_at(const gd_problem *p, gd_eig_ws *s, double t, const tpk_gd_opts *o,
                   double *mean, double *cov)
{
    const size_t n = p->n, m = p->m, k = p->k;
    const double nn = (double)(n * k);
    for (size_t j = 0; j < n; j++) {
        if (o->momentum > 0) { /* e₂ = e², r₂ = (1 − e²)/λ = r(1 + e): the squared decay */
            factors_momentum(p->lam[j], t, o->lr, nn, o->momentum, &s->e[j], &s->r[j]);
            s->e2[j] = s->e[j] * s->e[j];
            s->r2[j] = s->r[j] * (1 + s->e[j]);
            continue;
        }
        factors(p->lam[j], t, 1, o->lr, nn, o->discrete, &s->e[j], &s->r[j]);
        factors(p->lam[j], t, 2, o->lr, nn, o->discrete, &s->e2[j], &s->r2[j]);
    }
    if (p->test) {
        /* P = G_td G⁻¹E_τ(G) in the eigenbasis: A·diag(r) (m×n); mean = P·WY. */
        for (size_t i = 0; i < m; i++)
            for (size_t j = 0; j < n; j++)
                s->pm[i * n + j] = s->a[i * n + j] * s->r[j];
        mm(0, 0, m, k, n, 1, s->pm, n, s->wy, k, 0, mean, k);
        if (!cov)
            return;
        memcpy(cov, p->ktt, m * m * sizeof(double));
        if (p->ntk_cov) {
            /* K_tt + P C Pᵀ − P Bᵀ − B Pᵀ (NT: term_1 K term_1 − term_2 − term_2ᵀ + K_tt). */
            mm(0, 1, n, m, n, 1, s->c, n, s->pm, n, 0, s->q, m);   /* C Pᵀ: n×m */
            mm(0, 0, m, m, n, 1, s->pm, n, s->q, m, 1, cov, m);    /* + P C Pᵀ */
            mm(0, 1, m, m, n, -1, s->pm, n, s->b, n, 1, cov, m);   /* − P Bᵀ */
            mm(0, 1, m, m, n, -1, s->b, n, s->pm, n, 1, cov, m);   /* − B Pᵀ */
        } else {
            /* K_tt − K_td K⁻¹(I − e^{−2τK/N})K_dt: − A diag(r₂) Aᵀ. */
            for (size_t i = 0; i < m; i++)
                for (size_t j = 0; j < n; j++)
                    s->pm[i * n + j] = s->a[i * n + j] * s->r2[j];
            mm(0, 1, m, m, n, -1, s->pm, n, s->a, n, 1, cov, m);
        }
        return;
    }
    /* Train set: mean = E_τ(G) Y = Wᵀ diag(1 − e) WY. */
    for (size_t j = 0; j < n; j++)
        for (size_t c = 0; c < k; c++)
            s->q[j * k + c] = (1 - s->e[j]) * s->wy[j * k + c];
    mm(1, 0, n, k, n, 1, p->w, n, s->q, k, 0, mean, k);
    if (!cov)
        return;
    if (p->ntk_cov) {
        /* e^{−τΘ/N} K e^{−τΘ/N} = Wᵀ diag(e) C diag(e) W. */
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < n; j++)
                s->pm[i * n + j] = s->e[i] * s->c[i * n + j] * s->e[j];
    } else {
        /* K e^{−2τK/N} = Wᵀ diag(λ⁺ e₂) W. */
        memset(s->pm, 0, n * n * sizeof(double));
        for (size_t j = 0; j < n; j++)
            s->pm[j * n + j] = (p->lam[j] > 0 ? p->lam[j] : 0) * s->e2[j];
    }
    mm(0, 0, n, n, n, 1, s->pm, n, p->w, n, 0, s->q, n);
    mm(1, 0, n, n, n, 1, p->w, n, s->q, n, 0, cov, n);
}

/* t = ∞ (NT gp_inference; theory.md §8.10 table): G + reg = UᵀU by dpotrf. A failed or
 * ill-conditioned factor is TPK_ENUMERIC naming G's extreme eigenvalues. */
static int inf_at(gd_problem *p, double *mean, double *cov, tpk_ctx *ctx)
{
    const size_t n = p->n, m = p->m, k = p->k;
    if (!p->test) { /* train set: N(Y, 0) */
        memcpy(mean, p->y, n * k * sizeof(double));
        if (cov)
            memset(cov, 0, n * n * sizeof(double));
        return TPK_OK;
    }
    double *u = tpk_malloc(ctx, n * n * sizeof(double));
    double *sol = tpk_malloc(ctx, n * (m ? m : 1) * sizeof(double)); /* column-major n×m */
    double *q = tpk_malloc(ctx, n * (m ? m : 1) * sizeof(double));
    int st = TPK_OK;
    if (!u || !sol || !q) {
        st = TPK_ERROR(ctx, TPK_ENOMEM, "%s: out of memory (%zu doubles)", p->entry,
                       n * n + 2 * n * m);
        goto out;
    }
    memcpy(u, p->g, n * n * sizeof(double));
    lapack_int info = LAPACKE_dpotrf(LAPACK_COL_MAJOR, 'U', (lapack_int)n, u, (lapack_int)n);
    double pmin = INFINITY, pmax = 0;
    if (info == 0)
        for (size_t i = 0; i < n; i++) {
            pmin = fmin(pmin, u[i * n + i]);
            pmax = fmax(pmax, u[i * n + i]);
        }
    if (info != 0 || !(pmin >= GD_PIVOT_MIN * pmax)) {
        if ((st = eigen(p, ctx)))
            goto out;
        st = TPK_ERROR(ctx, TPK_ENUMERIC, "%s: the training %s is singular (smallest eigenvalue "
                       "%.3g, largest %.3g%s): t = inf needs its inverse; give diag_reg > 0 "
                       "(e.g. 1e-6) or a finite t", p->entry,
                       p->ntk_cov ? "NTK" : "kernel", p->lam[0], p->lam[n - 1],
                       info != 0 ? ", Cholesky failed" : ", condition number above 1e14");
        goto out;
    }
    /* S = G⁻¹ G_dt (n×m), column-major n×m = row-major m×n = G_td. */
    memcpy(sol, p->gtd, m * n * sizeof(double));
    if (m && (info = LAPACKE_dpotrs(LAPACK_COL_MAJOR, 'U', (lapack_int)n, (lapack_int)m, u,
                                    (lapack_int)n, sol, (lapack_int)n)) != 0) {
        st = TPK_ERROR(ctx, TPK_ENUMERIC, "%s: dpotrs failed (info %d)", p->entry, (int)info);
        goto out;
    }
    /* sol as row-major m×n is Sᵀ = G_td G⁻¹. mean = Sᵀ Y. */
    mm(0, 0, m, k, n, 1, sol, n, p->y, k, 0, mean, k);
    if (!cov)
        goto out;
    memcpy(cov, p->ktt, m * m * sizeof(double));
    if (p->ntk_cov) {
        /* K_tt + Sᵀ K S − Sᵀ K_dt − K_td S */
        mm(0, 1, n, m, n, 1, p->kdd, n, sol, n, 0, q, m);  /* K S: n×m */
        mm(0, 0, m, m, n, 1, sol, n, q, m, 1, cov, m);
        mm(0, 1, m, m, n, -1, sol, n, p->ktd, n, 1, cov, m);
        mm(0, 1, m, m, n, -1, p->ktd, n, sol, n, 1, cov, m);
    } else {
        /* K_tt − G_td G⁻¹ G_dt */
        mm(0, 1, m, m, n, -1, sol, n, p->gtd, n, 1, cov, m);
    }
out:
    tpk_free(ctx, u);
    tpk_free(ctx, sol);
    tpk_free(ctx, q);
    return st;
}

static void problem_free(gd_problem *p, tpk_ctx *ctx)
{
    tpk_free(ctx, p->g);
    tpk_free(ctx, p->w);
    tpk_free(ctx, p->lam);
}

static int check_opts(const char *entry, const tpk_gd_opts *o, tpk_ctx *ctx)
{
    if (!(isfinite(o->lr) && o->lr > 0))
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: the learning rate must be finite and > 0 (got "
                         "%g)", entry, o->lr);
    if (!(isfinite(o->diag_reg) && o->diag_reg >= 0))
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: diag_reg must be finite and >= 0 (got %g)", entry,
                         o->diag_reg);
    if (!(isfinite(o->momentum) && o->momentum >= 0 && o->momentum < 1))
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: momentum must be in [0, 1) (got %g)", entry,
                         o->momentum);
    if (o->momentum > 0 && !o->discrete)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: momentum %g needs discrete steps (discrete = 1): "
                         "heavy-ball gradient descent is defined step by step", entry, o->momentum);
    if (o->get != TPK_GD_NTK && o->get != TPK_GD_NNGP && o->get != TPK_GD_NTKGP)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: get must be TPK_GD_NTK, TPK_GD_NNGP or "
                         "TPK_GD_NTKGP (got %d)", entry, (int)o->get);
    return TPK_OK;
}

/* The shared set-up: shapes, finiteness, symmetry, the regularised training kernel. */
static int setup(gd_problem *p, const char *entry, tpk_gd_get get, const tpk_array *ntk_dd,
                 const tpk_array *nngp_dd, const tpk_array *ntk_td, const tpk_array *nngp_td,
                 const tpk_array *k_tt, const tpk_array *y, int want_cov, const tpk_gd_opts *o,
                 tpk_ctx *ctx)
{
    memset(p, 0, sizeof *p);
    p->entry = entry;
    int st;
    if ((st = check_opts(entry, o, ctx)))
        return st;
    /* The training kernel and its test block: Θ for ntk and ntkgp, K for nngp. */
    const int use_ntk = get != TPK_GD_NNGP;
    const tpk_array *G = use_ntk ? ntk_dd : nngp_dd, *Gtd = use_ntk ? ntk_td : nngp_td;
    const char *gname = use_ntk ? "ntk_dd" : "nngp_dd", *gtdname = use_ntk ? "ntk_td" : "nngp_td";
    if (!G || !G->data)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: %s is NULL (get = %s trains with it)", entry,
                         gname, mode_name(get));
    if (G->ndim != 2 || G->dims[0] != G->dims[1] || G->dims[0] == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: %s must be a non-empty square matrix (got rank "
                         "%d, %zu×%zu)", entry, gname, G->ndim, G->dims[0],
                         G->ndim > 1 ? G->dims[1] : 1);
    p->n = G->dims[0];
    if ((st = check_matrix(entry, gname, G, p->n, p->n, ctx)) ||
        (st = check_symmetric(entry, gname, G, ctx)))
        return st;
    if (!y || !y->data)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: y is NULL", entry);
    if (y->ndim < 1 || y->ndim > 2 || y->dims[0] != p->n)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: y must be %zu×k targets (or %zu; got rank %d, "
                         "first dimension %zu)", entry, p->n, p->n, y->ndim, y->dims[0]);
    p->k = y->ndim == 2 ? y->dims[1] : 1;
    if (p->k == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: y has no outputs (%zu×0)", entry, p->n);
    if ((st = tpk_array_check_finite(y, entry, "y", ctx)))
        return st;
    p->y = y->data;
    p->test = Gtd != NULL;
    p->ntk_cov = get == TPK_GD_NTK;
    p->want_cov = want_cov;
    if (p->test) {
        if (Gtd->ndim != 2 || Gtd->dims[1] != p->n)
            return TPK_ERROR(ctx, TPK_EINVAL, "%s: %s must be m×%zu test×train (got rank %d, "
                             "%zu×%zu)", entry, gtdname, p->n, Gtd->ndim, Gtd->dims[0],
                             Gtd->ndim > 1 ? Gtd->dims[1] : 1);
        p->m = Gtd->dims[0];
        if ((st = check_matrix(entry, gtdname, Gtd, p->m, p->n, ctx)))
            return st;
        p->gtd = Gtd->data;
        if (want_cov) {
            if (!k_tt)
                return TPK_ERROR(ctx, TPK_EINVAL, "%s: a covariance was asked for (cov != NULL) "
                                 "but k_tt is NULL", entry);
            if ((st = check_matrix(entry, "k_tt", k_tt, p->m, p->m, ctx)) ||
                (st = check_symmetric(entry, "k_tt", k_tt, ctx)))
                return st;
            p->ktt = k_tt->data;
        }
    } else if (ntk_td || nngp_td) {
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: %s is NULL but the other test×train block is "
                         "not: give %s for test predictions, or neither for the training set",
                         entry, gtdname, gtdname);
    }
    /* The NTK covariance needs the NNGP beside Θ (NT: "you need both NTK and NNGP"). */
    if (p->ntk_cov && want_cov) {
        if ((st = check_matrix(entry, "nngp_dd", nngp_dd, p->n, p->n, ctx)) ||
            (st = check_symmetric(entry, "nngp_dd", nngp_dd, ctx)))
            return st;
        p->kdd = nngp_dd->data;
        if (p->test) {
            if ((st = check_matrix(entry, "nngp_td", nngp_td, p->m, p->n, ctx)))
                return st;
            p->ktd = nngp_td->data;
        }
    }
    return copy_regularised(p, G, o, ctx);
}

static int check_out(const char *entry, const char *name, const tpk_array *a, int ndim,
                     const size_t *dims, tpk_ctx *ctx)
{
    if (!a || !a->data)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: %s is NULL", entry, name);
    int ok = a->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        ok = a->dims[i] == dims[i];
    if (!ok) {
        if (ndim == 3)
            return TPK_ERROR(ctx, TPK_EINVAL, "%s: %s must be %zu×%zu×%zu (got rank %d, first "
                             "dimension %zu)", entry, name, dims[0], dims[1], dims[2], a->ndim,
                             a->dims[0]);
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: %s must be %zu×%zu (got rank %d, first dimension "
                         "%zu)", entry, name, dims[0], dims[1], a->ndim, a->dims[0]);
    }
    return TPK_OK;
}

int tpk_gd_mse_ensemble(const tpk_array *ntk_dd, const tpk_array *nngp_dd,
                        const tpk_array *ntk_td, const tpk_array *nngp_td,
                        const tpk_array *nngp_tt, const tpk_array *y, const double *t,
                        size_t nt, const tpk_gd_opts *opt, tpk_array *mean, tpk_array *cov,
                        tpk_ctx *ctx)
{
    static const char entry[] = "tpk_gd_mse_ensemble";
    tpk_gd_opts o;
    if (opt)
        o = *opt;
    else
        tpk_gd_opts_default(&o);
    if (o.get == TPK_GD_NTKGP)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: get = ntkgp is a posterior only (NT "
                         "gp_inference): call tpk_gd_gp_inference", entry);
    if (!t || nt == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: no times given (t NULL or nt = 0)", entry);
    gd_problem p;
    int st = setup(&p, entry, o.get, ntk_dd, nngp_dd, ntk_td, nngp_td, nngp_tt, y, cov != NULL,
                   &o, ctx);
    if (st) {
        problem_free(&p, ctx);
        return st;
    }
    const size_t rows = p.test ? p.m : p.n;
    if ((st = check_out(entry, "mean", mean, 3, (size_t[]){nt, rows, p.k}, ctx)) ||
        (cov && (st = check_out(entry, "cov", cov, 3, (size_t[]){nt, rows, rows}, ctx)))) {
        problem_free(&p, ctx);
        return st;
    }
    int finite = 0;
    for (size_t i = 0; i < nt; i++) {
        if (!(t[i] >= 0)) {
            problem_free(&p, ctx);
            return TPK_ERROR(ctx, TPK_EINVAL, "%s: t[%zu] = %g: times must be >= 0 (INFINITY "
                             "for the end of training)", entry, i, t[i]);
        }
        if (o.discrete && isfinite(t[i]) && t[i] != floor(t[i])) {
            problem_free(&p, ctx);
            return TPK_ERROR(ctx, TPK_EINVAL, "%s: t[%zu] = %g: discrete gradient descent counts "
                             "steps, which must be whole numbers", entry, i, t[i]);
        }
        finite |= isfinite(t[i]) != 0;
    }
    gd_eig_ws ws;
    memset(&ws, 0, sizeof ws);
    if (finite && ((st = eigen(&p, ctx)) || (st = eig_ws_alloc(&p, &ws, ctx)))) {
        problem_free(&p, ctx);
        return st;
    }
    const size_t msz = rows * p.k, csz = rows * rows;
    for (size_t i = 0; i < nt && !st; i++) {
        double *mi = mean->data + i * msz, *ci = cov ? cov->data + i * csz : NULL;
        if (isfinite(t[i])) {
            eig_at(&p, &ws, t[i], &o, mi, ci);
            continue;
        }
        if (o.discrete) {
            /* (1 − ηλ/N)^s → 0 for every λ > 0 only when η < 2N/λ_max, and with momentum μ
             * when η < 2(1 + μ)N/λ_max (the heavy-ball recursion's roots inside the unit circle;
             * theory.md §8.10). */
            if ((st = eigen(&p, ctx)))
                break;
            double lmax = p.lam[p.n - 1], nn = (double)(p.n * p.k), lim = 2 * (1 + o.momentum) * nn;
            if (!(o.lr * lmax < lim)) {
                st = TPK_ERROR(ctx, TPK_EDOM, "%s: t[%zu] = inf steps of gradient descent: "
                               "learning rate %g is not below the stable limit 2(1 + momentum)N/"
                               "lambda_max = %.6g (N = %.0f, lambda_max = %.6g): the iterates "
                               "diverge", entry, i, o.lr, lim / lmax, nn, lmax);
                break;
            }
        }
        st = inf_at(&p, mi, ci, ctx);
    }
    eig_ws_free(&ws, ctx);
    problem_free(&p, ctx);
    return st;
}

int tpk_gd_gp_inference(const tpk_array *ntk_dd, const tpk_array *nngp_dd,
                        const tpk_array *ntk_td, const tpk_array *nngp_td, const tpk_array *k_tt,
                        const tpk_array *y, const tpk_gd_opts *opt, tpk_array *mean,
                        tpk_array *cov, tpk_ctx *ctx)
{
    static const char entry[] = "tpk_gd_gp_inference";
    tpk_gd_opts o;
    if (opt)
        o = *opt;
    else
        tpk_gd_opts_default(&o);
    o.discrete = 0;
    o.momentum = 0.0; /* t = ∞ only: the end point is the same with or without momentum */
    gd_problem p;
    int st = setup(&p, entry, o.get, ntk_dd, nngp_dd, ntk_td, nngp_td, k_tt, y, cov != NULL, &o,
                   ctx);
    if (!st) {
        const size_t rows = p.test ? p.m : p.n;
        if (!(st = check_out(entry, "mean", mean, 2, (size_t[]){rows, p.k}, ctx)) &&
            !(cov && (st = check_out(entry, "cov", cov, 2, (size_t[]){rows, rows}, ctx))))
            st = inf_at(&p, mean->data, cov ? cov->data : NULL, ctx);
    }
    problem_free(&p, ctx);
    return st;
}

int tpk_gd_max_learning_rate(const tpk_array *ntk_dd, size_t y_size, double momentum,
                             double eps, double *lr, tpk_ctx *ctx)
{
    static const char entry[] = "tpk_gd_max_learning_rate";
    if (!lr)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: lr is NULL", entry);
    if (!ntk_dd || !ntk_dd->data || ntk_dd->ndim != 2 || ntk_dd->dims[0] != ntk_dd->dims[1] ||
        ntk_dd->dims[0] == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: ntk_dd must be a non-empty square matrix", entry);
    if (!(isfinite(momentum) && momentum >= 0) || !(isfinite(eps) && eps >= 0))
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: momentum and eps must be finite and >= 0 (got "
                         "%g, %g)", entry, momentum, eps);
    const size_t n = ntk_dd->dims[0];
    int st;
    if ((st = tpk_array_check_finite(ntk_dd, entry, "ntk_dd", ctx)) ||
        (st = check_symmetric(entry, "ntk_dd", ntk_dd, ctx)))
        return st;
    double *w = tpk_malloc(ctx, n * n * sizeof(double)), *lam = tpk_malloc(ctx, n * sizeof *lam);
    if (!w || !lam) {
        tpk_free(ctx, w);
        tpk_free(ctx, lam);
        return TPK_ERROR(ctx, TPK_ENOMEM, "%s: out of memory (%zu doubles)", entry, n * n);
    }
    memcpy(w, ntk_dd->data, n * n * sizeof(double));
    lapack_int info = LAPACKE_dsyevd(LAPACK_COL_MAJOR, 'N', 'U', (lapack_int)n, w, (lapack_int)n,
                                     lam);
    if (info != 0)
        st = TPK_ERROR(ctx, TPK_ENUMERIC, "%s: dsyevd failed (info %d)", entry, (int)info);
    else /* NT max_learning_rate: 2(1 + μ)N/(λ_max + eps), N = y_size or n (theory.md §8.10) */
        *lr = 2 * (1 + momentum) * (double)(y_size ? y_size : n) / (lam[n - 1] + eps);
    tpk_free(ctx, w);
    tpk_free(ctx, lam);
    return st;
}
