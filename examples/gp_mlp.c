/* GP regression with the NNGP kernel of a deep ReLU network, the whole path a user writes:
 * read the data, the kernel (tpk_mlp_kernel), fit (tpk_gp_fit), predict, log marginal likelihood.
 *
 *   gp_mlp TRAIN_X TRAIN_Y TEST_X        any input tpk_io_read takes: x.csv, x.npy, x.h5:/ds, ...
 *
 * prints "mean VAR" per test point (the posterior mean and latent variance), then "lml VALUE".
 * Build against an installed tpk:  cc gp_mlp.c $(pkg-config --cflags --libs tpk)  (README). */
#include <stdio.h>
#include <stdlib.h>

#include <tpk/tpk.h>

/* The model: a ReLU network with 3 hidden layers, weight variance 2 (He), bias variance 0.1
 * (tpk/kernels.h gives the recursion), and observation noise 0.01. */
#define DEPTH 3
#define SIGMA_W2 2.0
#define SIGMA_B2 0.1
#define NOISE 0.01

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s TRAIN_X TRAIN_Y TEST_X\n", argv[0]);
        return 2;
    }
    /* One context for every call. Its rule: the first error recorded wins, and a context that
     * holds an error keeps it (tpk/error.h). A program that stops at the first error, as this
     * one does, just prints ctx.msg; one that handles an error and goes on calls
     * tpk_ctx_clear(&ctx) first (examples/custom_phi.c does). */
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_array *X = NULL, *Y = NULL, *Xt = NULL, *K = NULL, *Kxt = NULL, *kdiag = NULL;
    tpk_array *mean = NULL, *var = NULL;
    tpk_phi_registry *reg = NULL;
    tpk_phi *relu = NULL;
    tpk_gp *gp = NULL;
    int rc = 1;

    /* 1. Read: N×d inputs, N targets (N×1), M×d test inputs. */
    if (!(X = tpk_io_read(argv[1], NULL, &ctx)) || !(Y = tpk_io_read(argv[2], NULL, &ctx)) ||
        !(Xt = tpk_io_read(argv[3], NULL, &ctx)))
        goto done;
    size_t n = X->dims[0], m = Xt->dims[0];

    /* 2. The kernel: train × train, test × train and the test diagonal in one call. */
    if (!(reg = tpk_phi_registry_alloc(&ctx)) || !(relu = tpk_phi_alloc(reg, "relu", &ctx)))
        goto done;
    tpk_mlp_params p = {.depth = DEPTH, .phi = relu, .sigma_w2 = SIGMA_W2, .sigma_b2 = SIGMA_B2};
    if (!(K = tpk_array_alloc2(n, n, &ctx)) || !(Kxt = tpk_array_alloc2(m, n, &ctx)) ||
        !(kdiag = tpk_array_alloc(1, &m, &ctx)))
        goto done;
    /* ws NULL: ReLU has a closed form (a φ without one needs tpk_gauss_ws_alloc's nodes) */
    if (tpk_mlp_kernel(&p, X, Xt, NULL, K, Kxt, kdiag, NULL, &ctx))
        goto done;

    /* 3. Fit: one Cholesky factor of K + noise·I (jitter added only if that is not PD). */
    if (!(gp = tpk_gp_fit(K, Y, NOISE, NULL, &ctx)))
        goto done;

    /* 4. Predict: the posterior mean and the latent variance at each test point. */
    size_t c = tpk_array_item_size(Y);
    if (!(mean = tpk_array_alloc2(m, c, &ctx)) || !(var = tpk_array_alloc(1, &m, &ctx)) ||
        tpk_gp_predict(gp, Kxt, kdiag, mean, var, &ctx))
        goto done;
    for (size_t i = 0; i < m; i++)
        printf("%.17g %.17g\n", mean->data[i * c], var->data[i]);

    /* 5. The log marginal likelihood of the training targets, log N(Y; 0, K + noise·I). */
    printf("lml %.17g\n", tpk_gp_get_info(gp)->lml);
    rc = 0;

done:
    if (rc)
        fprintf(stderr, "gp_mlp: %s (%s)\n", ctx.msg, tpk_strerror(ctx.status));
    /* every _free takes NULL, so one exit path frees whatever was made */
    tpk_gp_free(gp);
    tpk_array_free(mean);
    tpk_array_free(var);
    tpk_array_free(K);
    tpk_array_free(Kxt);
    tpk_array_free(kdiag);
    tpk_phi_free(relu);
    tpk_phi_registry_free(reg);
    tpk_array_free(X);
    tpk_array_free(Y);
    tpk_array_free(Xt);
    return rc;
}
