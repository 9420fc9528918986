/* Kernel families for hyperparameter fitting (MLP NNGP, RBF) and the depth-by-depth MLP sweep. */
#include "gp-impl.h"
#include "tpk/alloc.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Central-difference step in log θ for the MLP family: truncation O(h²) ≈ 1e-8 relative,
 * rounding O(ε/h) ≈ 1e-12 (tested against the LML's finite differences in tests/test_gp.c). */
#define MLP_FD_STEP 1e-4

void tpk_gp_family_free(tpk_gp_family *f)
{
    if (!f)
        return;
    if (f->destroy)
        f->destroy(f->data);
    tpk_allocator al = f->alloc;
    tpk_mem_free(&al, f);
}

static tpk_array wrap2(double *data, size_t r, size_t c)
{
    tpk_array a = {.ndim = 2, .dims = {r, c}, .data = data};
    return a;
}

/* ---- MLP ---------------------------------------------------------------------------------------- */

typedef struct mlp_data {
    tpk_mlp_params p;
    const tpk_array *X;
    const tpk_gauss_ws *ws;
    double h;
    double *scratch; /* N×N for the minus-side kernel */
    tpk_allocator al;
} mlp_data;

static void mlp_destroy(void *d)
{
    mlp_data *m = d;
    if (m == NULL)
        return;
    tpk_allocator al = m->al;
    tpk_mem_free(&al, m->scratch);
    tpk_mem_free(&al, m);
}

static int mlp_eval(const tpk_gp_family *f, const double *theta, double *K, double *const *dK,
                    tpk_ctx *ctx)
{
    mlp_data *m = f->data;
    const size_t n = f->n;
    tpk_mlp_params p = m->p;
    p.sigma_w2 = theta[0];
    p.sigma_b2 = theta[1];
    tpk_array Ka = wrap2(K, n, n);
    int st = tpk_mlp_kernel(&p, m->X, NULL, m->ws, &Ka, NULL, NULL, NULL, ctx);
    for (size_t i = 0; !st && dK && i < 2; i++) {
        if (!dK[i])
            continue;
        tpk_mlp_params pp = p, pm = p;
        double *v = i == 0 ? &pp.sigma_w2 : &pp.sigma_b2;
        *v *= exp(m->h);
        v = i == 0 ? &pm.sigma_w2 : &pm.sigma_b2;
        *v *= exp(-m->h);
        tpk_array Kp = wrap2(dK[i], n, n), Km = wrap2(m->scratch, n, n);
        st = tpk_mlp_kernel(&pp, m->X, NULL, m->ws, &Kp, NULL, NULL, NULL, ctx);
        if (!st)
            st = tpk_mlp_kernel(&pm, m->X, NULL, m->ws, &Km, NULL, NULL, NULL, ctx);
        if (st)
            break;
        const double inv = 1.0 / (2 * m->h);
        double *d = dK[i];
        const double *s = m->scratch;
#pragma omp parallel for schedule(static)
        for (size_t k = 0; k < n * n; k++)
            d[k] = (d[k] - s[k]) * inv;
    }
    return st;
}

tpk_gp_family *tpk_gp_family_mlp_alloc(const tpk_mlp_params *p, const tpk_array *X,
                                       const tpk_gauss_ws *ws, double fd_step, tpk_ctx *ctx)
{
    if (!X || !X->data || X->dims[0] == 0) {
        TPK_ERROR(ctx, TPK_EINVAL, "no training inputs for the MLP family");
        return NULL;
    }
    if (tpk_mlp_params_check(p, ctx) ||
        tpk_array_check_input(X, "tpk_gp_family_mlp_alloc", "X", ctx))
        return NULL;
    if (!(fd_step >= 0) || fd_step > 0.1) {
        TPK_ERROR(ctx, TPK_EINVAL, "finite-difference step must be in [0, 0.1] (got %g)", fd_step);
        return NULL;
    }
    const size_t n = X->dims[0];
    tpk_gp_family *f = tpk_calloc(ctx, 1, sizeof *f);
    mlp_data *m = tpk_calloc(ctx, 1, sizeof *m);
    if (f)
        f->alloc = tpk_ctx_allocator(ctx);
    if (m) {
        m->al = tpk_ctx_allocator(ctx);
        m->scratch = tpk_malloc(ctx, n * n * sizeof(double));
    }
    if (!f || !m || !m->scratch) {
        tpk_free(ctx, f);
        mlp_destroy(m);
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (%zu×%zu)", n, n);
        return NULL;
    }
    m->p = *p;
    m->X = X;
    m->ws = ws;
    m->h = fd_step > 0 ? fd_step : MLP_FD_STEP;
    f->n = n;
    f->nparams = 2;
    f->names[0] = "sigma_w2";
    f->names[1] = "sigma_b2";
    f->analytic_grad = 0;
    f->eval = mlp_eval;
    f->data = m;
    f->destroy = mlp_destroy;
    return f;
}

/* ---- RBF ---------------------------------------------------------------------------------------- */

static void row_sq_norms(const tpk_array *X, double *out)
{
    const size_t n = X->dims[0], d = tpk_array_item_size(X);
    for (size_t i = 0; i < n; i++)
        out[i] = cblas_ddot((int)d, X->data + i * d, 1, X->data + i * d, 1);
}

/* Squared distances |x_i − x_j|² (N×N, full) by one dsyrk. */
static int sq_dists(const tpk_array *X, double *D, tpk_ctx *ctx)
{
    const size_t n = X->dims[0], d = tpk_array_item_size(X);
    double *q = tpk_malloc(ctx, n * sizeof *q);
    if (!q)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    row_sq_norms(X, q);
    cblas_dsyrk(CblasRowMajor, CblasLower, CblasNoTrans, (int)n, (int)d, -2.0, X->data, (int)d,
                0.0, D, (int)n);
#pragma omp parallel for schedule(dynamic, 64)
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j <= i; j++) {
            double v = i == j ? 0.0 : fmax(D[i * n + j] + q[i] + q[j], 0.0);
            D[i * n + j] = v;
        }
#pragma omp parallel for schedule(dynamic, 64)
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            D[i * n + j] = D[j * n + i];
    tpk_free(ctx, q);
    return TPK_OK;
}

typedef struct rbf_data {
    double *D2; /* squared distances of the training inputs */
    tpk_allocator al;
} rbf_data;

static void rbf_destroy(void *d)
{
    rbf_data *r = d;
    if (r == NULL)
        return;
    tpk_allocator al = r->al;
    tpk_mem_free(&al, r->D2);
    tpk_mem_free(&al, r);
}

static int rbf_check(const double *theta, tpk_ctx *ctx)
{
    if (!(theta[0] > 0) || !isfinite(theta[0]))
        return TPK_ERROR(ctx, TPK_EDOM, "RBF lengthscale² must be finite and > 0 (got %g)",
                         theta[0]);
    if (!(theta[1] > 0) || !isfinite(theta[1]))
        return TPK_ERROR(ctx, TPK_EDOM, "RBF amplitude must be finite and > 0 (got %g)", theta[1]);
    return TPK_OK;
}

static int rbf_eval(const tpk_gp_family *f, const double *theta, double *K, double *const *dK,
                    tpk_ctx *ctx)
{
    int st = rbf_check(theta, ctx);
    if (st)
        return st;
    const rbf_data *r = f->data;
    const size_t len = f->n * f->n;
    const double g = 0.5 / theta[0], s = theta[1];
    double *d0 = dK ? dK[0] : NULL, *d1 = dK ? dK[1] : NULL;
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < len; k++) {
        double e = s * exp(-g * r->D2[k]);
        K[k] = e;
        if (d0) /* ∂/∂log ℓ² of s·exp(−d²/(2ℓ²)) */
            d0[k] = e * g * r->D2[k];
        if (d1)
            d1[k] = e;
    }
    return TPK_OK;
}

tpk_gp_family *tpk_gp_family_rbf_alloc(const tpk_array *X, tpk_ctx *ctx)
{
    if (!X || !X->data || X->dims[0] == 0) {
        TPK_ERROR(ctx, TPK_EINVAL, "no training inputs for the RBF family");
        return NULL;
    }
    if (tpk_array_check_input(X, "tpk_gp_family_rbf_alloc", "X", ctx))
        return NULL;
    const size_t n = X->dims[0];
    tpk_gp_family *f = tpk_calloc(ctx, 1, sizeof *f);
    rbf_data *r = tpk_calloc(ctx, 1, sizeof *r);
    if (f)
        f->alloc = tpk_ctx_allocator(ctx);
    if (r) {
        r->al = tpk_ctx_allocator(ctx);
        r->D2 = tpk_malloc(ctx, n * n * sizeof(double));
    }
    if (!f || !r || !r->D2) {
        tpk_free(ctx, f);
        rbf_destroy(r);
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (%zu×%zu)", n, n);
        return NULL;
    }
    if (sq_dists(X, r->D2, ctx)) {
        tpk_free(ctx, f);
        rbf_destroy(r);
        return NULL;
    }
    f->n = n;
    f->nparams = 2;
    f->names[0] = "lengthscale2";
    f->names[1] = "amplitude";
    f->analytic_grad = 1;
    f->eval = rbf_eval;
    f->data = r;
    f->destroy = rbf_destroy;
    return f;
}

int tpk_gp_rbf_kernel(const double *theta, const tpk_array *X, const tpk_array *Xt, tpk_array *K,
                      tpk_array *Kxt, tpk_array *kdiag, tpk_ctx *ctx)
{
    int st = rbf_check(theta, ctx);
    if (st)
        return st;
    if (!X || !X->data)
        return TPK_ERROR(ctx, TPK_EINVAL, "no training inputs");
    if ((st = tpk_array_check_input(X, "tpk_gp_rbf_kernel", "X", ctx)) ||
        (st = tpk_array_check_input(Xt, "tpk_gp_rbf_kernel", "Xt", ctx)))
        return st;
    const size_t n = X->dims[0], d = tpk_array_item_size(X);
    const double g = 0.5 / theta[0], s = theta[1];
    if (K) {
        if (K->ndim != 2 || K->dims[0] != n || K->dims[1] != n)
            return TPK_ERROR(ctx, TPK_EINVAL, "kernel output must be %zu×%zu", n, n);
        if ((st = sq_dists(X, K->data, ctx)))
            return st;
#pragma omp parallel for schedule(static)
        for (size_t k = 0; k < n * n; k++)
            K->data[k] = s * exp(-g * K->data[k]);
    }
    if (!Xt)
        return TPK_OK;
    const size_t m = Xt->dims[0];
    if (tpk_array_item_size(Xt) != d)
        return TPK_ERROR(ctx, TPK_EINVAL, "test inputs have dimension %zu but training inputs %zu",
                         tpk_array_item_size(Xt), d);
    if (!Kxt || Kxt->ndim != 2 || Kxt->dims[0] != m || Kxt->dims[1] != n || !kdiag ||
        tpk_array_size(kdiag) != m)
        return TPK_ERROR(ctx, TPK_EINVAL, "cross-kernel outputs must be %zu×%zu and %zu", m, n, m);
    double *qa = tpk_malloc(ctx, (m + n + 1) * sizeof *qa);
    if (!qa)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    double *qb = qa + m;
    row_sq_norms(Xt, qa);
    row_sq_norms(X, qb);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n, (int)d, -2.0, Xt->data,
                (int)d, X->data, (int)d, 0.0, Kxt->data, (int)n);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < m; i++)
        for (size_t j = 0; j < n; j++) {
            double v = fmax(Kxt->data[i * n + j] + qa[i] + qb[j], 0.0);
            Kxt->data[i * n + j] = s * exp(-g * v);
        }
    for (size_t i = 0; i < m; i++)
        kdiag->data[i] = s;
    tpk_free(ctx, qa);
    return TPK_OK;
}

/* ---- MLP depth sweep ------------------------------------------------------------------------------ */

static void affine(double *v, size_t len, double a, double b)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < len; i++)
        v[i] = a * v[i] + b;
}

int tpk_gp_mlp_sweep(const tpk_mlp_params *p, const tpk_array *X, const tpk_array *Xt,
                     const tpk_gauss_ws *ws, tpk_array *K, tpk_array *Kxt, tpk_array *kdiag,
                     tpk_gp_depth_fn cb, void *data, tpk_ctx *ctx)
{
    int st = tpk_mlp_params_check(p, ctx);
    if (st || (st = tpk_array_check_input(X, "tpk_gp_mlp_sweep", "X", ctx)) ||
        (st = tpk_array_check_input(Xt, "tpk_gp_mlp_sweep", "Xt", ctx)))
        return st;
    if (!cb)
        return TPK_ERROR(ctx, TPK_EINVAL, "no callback given to the depth sweep");
    /* Depth 1 by the library's own recursion (first layer included), then one layer at a time
     * with the same maps and affine steps (kernels/mlp.c, theory.md §2.1). */
    tpk_mlp_params p1 = *p;
    p1.depth = 1;
    if ((st = tpk_mlp_kernel(&p1, X, Xt, ws, K, Kxt, kdiag, NULL, ctx)))
        return st;
    if ((st = cb(1, K, Kxt, kdiag, data, ctx)))
        return st;
    const size_t n = K->dims[0], m = Xt ? Xt->dims[0] : 0;
    double *qtrain = NULL;
    if (Xt && !(qtrain = tpk_malloc(ctx, (n ? n : 1) * sizeof *qtrain)))
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    for (int l = 2; l <= p->depth && !st; l++) {
        if (Xt) {
            for (size_t i = 0; i < n; i++)
                qtrain[i] = K->data[i * n + i];
            st = tpk_gauss_map_cross(p->phi, kdiag->data, m, qtrain, n, Kxt->data, Kxt->data, ws,
                                     NULL, ctx);
            for (size_t i = 0; i < m && !st; i++) {
                tpk_estimate r;
                st = tpk_gauss_expect2(p->phi, kdiag->data[i], kdiag->data[i], kdiag->data[i], ws,
                                       &r, ctx);
                kdiag->data[i] = r.value;
            }
            if (st)
                break;
            affine(Kxt->data, m * n, p->sigma_w2, p->sigma_b2);
            affine(kdiag->data, m, p->sigma_w2, p->sigma_b2);
        }
        if ((st = tpk_gauss_map(p->phi, K->data, n, K->data, ws, NULL, ctx)))
            break;
        affine(K->data, n * n, p->sigma_w2, p->sigma_b2);
        int bad = 0;
        for (size_t i = 0; i < n && !bad; i++)
            bad = !isfinite(K->data[i * n + i]);
        for (size_t i = 0; i < m && !bad; i++)
            bad = !isfinite(kdiag->data[i]);
        if (bad) {
            st = TPK_ERROR(ctx, TPK_ENUMERIC, "kernel overflowed at hidden layer %d", l);
            break;
        }
        st = cb(l, K, Kxt, kdiag, data, ctx);
    }
    tpk_free(ctx, qtrain);
    return st;
}
