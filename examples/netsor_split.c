/* A network written as a NETSOR program in a string (docs/netsor.md), its infinite-width kernel
 * on a training set and a test set (tpk_job_kernel_arrays), with one parameter set from C.
 *
 *   netsor_split TRAIN_X TEST_X        any input tpk_io_read takes: x.csv, x.npy, x.h5:/ds, ...
 *
 * prints the test × train kernel, one test point per line, then "diag" and the test diagonal.
 * tpk_netsor_kernel computes the kernel of one batch; tpk_job_kernel_arrays takes a training
 * and a test set, runs them as one batch and hands back the three blocks a GP needs. */
#include <stdio.h>

#include <tpk/tpk.h>

/* Two erf layers with biases; the readout has variance 1. "param" lines are defaults that the
 * caller may override (tpk_job.sets, netsor --set). */
static const char program[] =
    "param sigma_w2 = 1.0\n"
    "param sigma_b2 = 0.2\n"
    "width n\n"
    "input x : d\n"
    "A U : (n, d) ~ sigma_w2\n"
    "A W : (n, n) ~ sigma_w2\n"
    "G b1 : n ~ N(0, sigma_b2)\n"
    "G b2 : n ~ N(0, sigma_b2)\n"
    "g1 = U x + b1\n"
    "h1 = erf(g1)\n"
    "g2 = W h1 + b2\n"
    "output y = readout(erf(g2), 1.0)\n";

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s TRAIN_X TEST_X\n", argv[0]);
        return 2;
    }
    /* The first error recorded wins and stays in the context until tpk_ctx_clear (tpk/error.h):
     * this program stops at the first one, so it prints ctx.msg and never clears. */
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_array *X = NULL, *Xt = NULL, *K = NULL, *Kxt = NULL, *kdiag = NULL;
    int rc = 1;
    if (!(X = tpk_io_read(argv[1], NULL, &ctx)) || !(Xt = tpk_io_read(argv[2], NULL, &ctx)))
        goto done;

    /* The program's text, a name for its messages ("split.nsr:9:6: ..."), and a setting. */
    const tpk_param_set sets[] = {{.name = "sigma_w2", .value = "1.5"}};
    tpk_job job = {.program = "split.nsr", .source = program, .sets = sets, .nsets = 1,
                   .input = argv[1], .test = argv[2]};
    double err;
    if (tpk_job_kernel_arrays(&job, X, Xt, &K, &Kxt, &kdiag, &err, &ctx))
        goto done;

    size_t n = X->dims[0], m = Xt->dims[0];
    for (size_t i = 0; i < m; i++)
        for (size_t j = 0; j < n; j++)
            printf("%.17g%c", Kxt->data[i * n + j], j + 1 < n ? ' ' : '\n');
    printf("diag");
    for (size_t i = 0; i < m; i++)
        printf(" %.17g", kdiag->data[i]);
    printf("\n");
    fprintf(stderr, "netsor_split: %zu train, %zu test points, error estimate %.2g\n", n, m, err);
    rc = 0;

done:
    if (rc)
        fprintf(stderr, "netsor_split: %s (%s)\n", ctx.msg, tpk_strerror(ctx.status));
    tpk_array_free(K);
    tpk_array_free(Kxt);
    tpk_array_free(kdiag);
    tpk_array_free(X);
    tpk_array_free(Xt);
    return rc;
}
