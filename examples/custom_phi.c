/* A nonlinearity of your own: φ(x) = cos(ω x) registered under a name with a parameter ω, then
 * the NNGP kernel of a 2-layer network with it (tpk_mlp_kernel, Gauss–Hermite quadrature).
 *
 *   custom_phi X            any input tpk_io_read takes: x.csv, x.npy, x.h5:/ds, ...
 *
 * prints the N×N kernel, one row per line. Also shows the one rule of tpk_ctx: after an error
 * that the program handles and goes on from, tpk_ctx_clear. */
#include <math.h>
#include <stdio.h>

#include <tpk/tpk.h>

/* φ(x; ω) = cos(ω x). Pure: the library calls it from several threads at once. */
static double cosine(double x, const double *params)
{
    return cos(params[0] * x);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s X\n", argv[0]);
        return 2;
    }
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_array *X = NULL, *K = NULL;
    tpk_phi_registry *reg = NULL;
    tpk_phi *phi = NULL;
    tpk_gauss_ws *ws = NULL;
    int rc = 1;
    if (!(X = tpk_io_read(argv[1], NULL, &ctx)) || !(reg = tpk_phi_registry_alloc(&ctx)))
        goto done;

    /* "cosine" is not a built-in: the first try fails with TPK_ENOTFOUND, which this program
     * handles by registering it. The context keeps that error (the first error wins, so that
     * the root cause of a failure is what the user reads): without tpk_ctx_clear here, a later
     * failure would come back with its own status but this stale message. */
    if (!(phi = tpk_phi_alloc(reg, "cosine(1.5)", &ctx))) {
        if (ctx.status != TPK_ENOTFOUND)
            goto done;
        tpk_ctx_clear(&ctx); /* handled: forget it */
        const double omega_default = 1.0;
        /* smooth and bounded: the Master Theorem's conditions hold, quadrature converges fast */
        if (tpk_phi_register(reg, "cosine", cosine, 1, &omega_default,
                             TPK_PHI_CONTROLLED | TPK_PHI_POLY_BOUNDED | TPK_PHI_LIPSCHITZ |
                                 TPK_PHI_SMOOTH,
                             &ctx) ||
            !(phi = tpk_phi_alloc(reg, "cosine(1.5)", &ctx)))
            goto done;
    }

    /* No closed form for E[φ(u)φ(v)]: the kernel needs Gauss–Hermite nodes (64 per axis). */
    if (!(ws = tpk_gauss_ws_alloc(TPK_GAUSS_DEFAULT_DEGREE, &ctx)))
        goto done;
    tpk_mlp_params p = {.depth = 2, .phi = phi, .sigma_w2 = 1.3, .sigma_b2 = 0.05};
    size_t n = X->dims[0];
    double err;
    if (!(K = tpk_array_alloc2(n, n, &ctx)) ||
        tpk_mlp_kernel(&p, X, NULL, ws, K, NULL, NULL, &err, &ctx))
        goto done;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            printf("%.17g%c", K->data[i * n + j], j + 1 < n ? ' ' : '\n');
    fprintf(stderr, "custom_phi: %s, error bound %.2g\n", tpk_phi_name(phi), err);
    rc = 0;

done:
    if (rc)
        fprintf(stderr, "custom_phi: %s (%s)\n", ctx.msg, tpk_strerror(ctx.status));
    tpk_array_free(K);
    tpk_gauss_ws_free(ws);
    tpk_phi_free(phi);
    tpk_phi_registry_free(reg);
    tpk_array_free(X);
    return rc;
}
