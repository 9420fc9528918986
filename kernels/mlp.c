/* Deep MLP NNGP kernel by the direct layer recursion (theory.md §2.1). */
#include "tpk/kernels.h"
#include "tpk/alloc.h"
#include "tpk/matmul.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The fields as a C caller names them (tpk_mlp_params.sigma_w2), not as gpkernel spells its
 * flags (--sigma-w2): gpregress and gpkernel check their own flags before they get here. */
int tpk_mlp_params_check(const tpk_mlp_params *p, tpk_ctx *ctx)
{
    if (p == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "no tpk_mlp_params given");
    if (p->depth < 1)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_mlp_params.depth must be at least 1 hidden layer "
                         "(got %d)", p->depth);
    if (p->phi == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_mlp_params.phi is NULL: no nonlinearity given "
                         "(tpk_phi_alloc)");
    if (!(p->sigma_w2 >= 0) || !isfinite(p->sigma_w2))
        return TPK_ERROR(ctx, TPK_EDOM, "tpk_mlp_params.sigma_w2 must be a finite variance >= 0 "
                         "(got %g)", p->sigma_w2);
    if (!(p->sigma_b2 >= 0) || !isfinite(p->sigma_b2))
        return TPK_ERROR(ctx, TPK_EDOM, "tpk_mlp_params.sigma_b2 must be a finite variance >= 0 "
                         "(got %g)", p->sigma_b2);
    return TPK_OK;
}

/* The parameters, then the inputs (each named as the entry point's caller calls it). */
static int check_call(const char *entry, const tpk_mlp_params *p, const tpk_array *X,
                      const char *xname, const tpk_array *Xt, const char *xtname, tpk_ctx *ctx)
{
    int st = tpk_mlp_params_check(p, ctx);
    if (st)
        return st;
    if (X == NULL || X->data == NULL || X->ndim < 1)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: no input array %s", entry, xname);
    if ((st = tpk_array_check_input(X, entry, xname, ctx)))
        return st;
    return Xt ? tpk_array_check_input(Xt, entry, xtname, ctx) : TPK_OK;
}

/* Σ¹ of the train block: the Gram matrix by tpk_dsyrk (the tuned SYRK kernels; symmetric on
 * return), then the bias. */
static int first_layer_train(const tpk_mlp_params *p, const double *X, size_t n, size_t d, double *S,
                             tpk_ctx *ctx)
{
    const double scale = d ? p->sigma_w2 / (double)d : 0.0;
    int st = tpk_dsyrk(TPK_NO_TRANS, n, d, scale, X, d ? d : 1, 0.0, S, n ? n : 1, ctx);
    if (st)
        return st;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n * n; i++)
        S[i] += p->sigma_b2;
    return TPK_OK;
}

static void affine(double *v, size_t len, double a, double b)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < len; i++)
        v[i] = a * v[i] + b;
}

/* TPK_ENUMERIC when an entry overflowed. */
static int all_finite(const double *v, size_t len, tpk_ctx *ctx)
{
    for (size_t i = 0; i < len; i++)
        if (!isfinite(v[i]))
            return TPK_ERROR(ctx, TPK_ENUMERIC,
                             "kernel overflowed to a non-finite value (variance grows without "
                             "bound for this phi, sigma_w2 (--sigma-w2) and depth)");
    return TPK_OK;
}

/* Row l + 1 of q from row l: E[φ(u)²], u ~ N(0, q), then the affine step. */
static int diag_step(const tpk_mlp_params *p, const double *q, double *next, size_t n, int layer,
                     const tpk_gauss_ws *ws, double *err, tpk_ctx *ctx)
{
    double e = 0;
    for (size_t i = 0; i < n; i++) {
        tpk_estimate r;
        int st = tpk_gauss_expect2(p->phi, q[i], q[i], q[i], ws, &r, ctx);
        if (st == TPK_ENUMERIC && ctx) { /* the layer is what the user can change */
            char why[sizeof ctx->msg];
            snprintf(why, sizeof why, "%s", ctx->msg);
            tpk_ctx_clear(ctx);
            return TPK_ERROR(ctx, TPK_ENUMERIC, "kernel overflowed at hidden layer %d (%s): the "
                             "variance grows without bound for this phi, sigma_w2 (--sigma-w2) and "
                             "depth", layer, why);
        }
        if (st)
            return st;
        next[i] = p->sigma_w2 * r.value + p->sigma_b2;
        e = fmax(e, r.err);
        if (!isfinite(next[i]))
            return TPK_ERROR(ctx, TPK_ENUMERIC, "kernel overflowed at hidden layer %d: the "
                             "variance grows without bound for this phi, sigma_w2 (--sigma-w2) and "
                             "depth", layer);
    }
    *err = e;
    return TPK_OK;
}

int tpk_mlp_diag(const tpk_mlp_params *p, const tpk_array *X, const tpk_gauss_ws *ws, double *q,
                 double *err, tpk_ctx *ctx)
{
    int st = check_call("tpk_mlp_diag", p, X, "X", NULL, NULL, ctx);
    if (st)
        return st;
    const size_t n = X->dims[0], d = tpk_array_item_size(X);
    const double scale = d ? p->sigma_w2 / (double)d : 0.0;
    for (size_t i = 0; i < n; i++) {
        const double *xi = X->data + i * d;
        double s = 0;
        for (size_t j = 0; j < d; j++)
            s += xi[j] * xi[j];
        q[i] = scale * s + p->sigma_b2;
    }
    double e = 0;
    for (int l = 0; l < p->depth; l++) {
        double el = 0;
        if ((st = diag_step(p, q + (size_t)l * n, q + (size_t)(l + 1) * n, n, l + 1, ws, &el, ctx)))
            return st;
        e = p->sigma_w2 * e + p->sigma_w2 * el;
    }
    if (err)
        *err = e;
    return TPK_OK;
}

int tpk_mlp_kernel_cross(const tpk_mlp_params *p, const tpk_array *Xr, const double *qr,
                         const tpk_array *Xc, const double *qc, const tpk_gauss_ws *ws, double *K,
                         double *err, tpk_ctx *ctx)
{
    int st = check_call("tpk_mlp_kernel_cross", p, Xr, "Xr", Xc, "Xc", ctx);
    if (st)
        return st;
    if (Xc == NULL || Xc->data == NULL || !qr || !qc)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_mlp_kernel_cross: Xc, qr and qc are required");
    const size_t m = Xr->dims[0], n = Xc->dims[0], d = tpk_array_item_size(Xc);
    const size_t L1 = (size_t)p->depth + 1;
    if ((st = tpk_values_check_finite(qr, L1 * m, "tpk_mlp_kernel_cross", "qr", ctx)) ||
        (st = tpk_values_check_finite(qc, L1 * n, "tpk_mlp_kernel_cross", "qc", ctx)))
        return st;
    if (tpk_array_item_size(Xr) != d)
        return TPK_ERROR(ctx, TPK_EINVAL, "cross kernel: items of dimension %zu against %zu",
                         tpk_array_item_size(Xr), d);
    const double scale = d ? p->sigma_w2 / (double)d : 0.0;
    if ((st = tpk_dgemm(TPK_NO_TRANS, TPK_TRANS, m, n, d, scale, Xr->data, d ? d : 1, Xc->data,
                        d ? d : 1, 0.0, K, n ? n : 1, ctx)))
        return st;
    affine(K, m * n, 1.0, p->sigma_b2);
    /* first order: a layer's map error plus σ_w² times what came in (tpk_mlp_kernel) */
    double e = 0;
    for (int l = 0; l < p->depth; l++) {
        double el = 0;
        st = tpk_gauss_map_cross(p->phi, qr + (size_t)l * m, m, qc + (size_t)l * n, n, K, K, ws,
                                 &el, ctx);
        if (st)
            return st;
        affine(K, m * n, p->sigma_w2, p->sigma_b2);
        e = p->sigma_w2 * e + p->sigma_w2 * el;
    }
    if ((st = all_finite(K, m * n, ctx)))
        return st;
    if (err)
        *err = e;
    return TPK_OK;
}

int tpk_mlp_kernel(const tpk_mlp_params *p, const tpk_array *X, const tpk_array *Xt,
                   const tpk_gauss_ws *ws, tpk_array *K, tpk_array *Kxt, tpk_array *kdiag,
                   double *err, tpk_ctx *ctx)
{
    int st = check_call("tpk_mlp_kernel", p, X, "X", Xt, "Xt", ctx);
    if (st)
        return st;
    if (K == NULL || K->data == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_mlp_kernel: no output array K");
    const size_t n = X->dims[0], d = tpk_array_item_size(X);
    if (K->ndim != 2 || K->dims[0] != n || K->dims[1] != n)
        return TPK_ERROR(ctx, TPK_EINVAL, "kernel output must be %zux%zu", n, n);
    size_t m = 0;
    if (Xt) {
        m = Xt->dims[0];
        if (tpk_array_item_size(Xt) != d)
            return TPK_ERROR(ctx, TPK_EINVAL,
                             "test inputs have dimension %zu but training inputs have %zu",
                             tpk_array_item_size(Xt), d);
        if (!Kxt || !kdiag || Kxt->dims[0] != m || Kxt->dims[1] != n || tpk_array_size(kdiag) != m)
            return TPK_ERROR(ctx, TPK_EINVAL, "cross-kernel outputs must be %zux%zu and %zu", m, n, m);
    }

    if ((st = first_layer_train(p, X->data, n, d, K->data, ctx)))
        return st;
    /* The test block: every layer's diagonal of both sets, then the cross block alone. */
    double ex = 0;
    if (Xt) {
        const size_t L1 = (size_t)p->depth + 1;
        double *q = tpk_malloc(ctx, (L1 * (n + m) + 1) * sizeof *q), e2 = 0;
        if (!q)
            return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        double *qtrain = q, *qtest = q + L1 * n;
        st = tpk_mlp_diag(p, X, ws, qtrain, NULL, ctx);
        if (!st)
            st = tpk_mlp_diag(p, Xt, ws, qtest, &e2, ctx);
        if (!st)
            st = tpk_mlp_kernel_cross(p, Xt, qtest, X, qtrain, ws, Kxt->data, &ex, ctx);
        if (!st)
            memcpy(kdiag->data, qtest + (L1 - 1) * m, m * sizeof *qtest);
        tpk_free(ctx, q);
        if (st)
            return st;
        ex += e2;
    }

    /* Error bookkeeping: first order, each layer multiplies earlier errors by the map's gain,
     * which we bound by σ_w² times a unit Lipschitz constant of the normalised kernel map. */
    double e = 0.0;
    for (int l = 0; l < p->depth; l++) {
        double el = 0.0;
        /* Fused σ_w² V_φ(Σ) + σ_b²: one pass over the matrix per layer. The maps read only the
         * lower triangle, so inner layers leave the upper one stale; the last layer mirrors. */
        st = (l + 1 == p->depth ? tpk_gauss_map_affine : tpk_gauss_map_affine_lower)(
            p->phi, K->data, n, p->sigma_w2, p->sigma_b2, K->data, ws, &el, ctx);
        if (st)
            return st;
        e = p->sigma_w2 * e + el;
        /* Off-diagonal entries are bounded by the diagonal (Cauchy–Schwarz), so a finite
         * diagonal is enough to go on; stop at the first layer whose variance overflows. */
        int bad = 0;
        for (size_t i = 0; i < n && !bad; i++)
            bad = !isfinite(K->data[i * n + i]);
        if (bad)
            return TPK_ERROR(ctx, TPK_ENUMERIC,
                             "kernel overflowed at hidden layer %d: the variance grows without "
                             "bound for this phi, sigma_w2 (--sigma-w2) and depth", l + 1);
    }

    /* the test block and diagonal were checked where they were made */
    if ((st = all_finite(K->data, n * n, ctx)))
        return st;
    if (err)
        *err = e + ex;
    return TPK_OK;
}
