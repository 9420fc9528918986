/* A shipped architecture by name, with the command line's flags as data: the kernel of
 * `gpkernel --arch=mlp --depth=2 --phi=relu --sigma-w2=1.7 --sigma-b2=0.05` on inputs in memory
 * (tpk_arch_kernel). The shipped program (programs/mlp.nsr) is found in the installed data
 * directory: TPK_DATADIR, else where `make install` put it (tpk/job.h: tpk_shipped_find).
 *
 *   arch_kernel X           any input tpk_io_read takes: x.csv, x.npy, x.h5:/ds, ...
 *
 * prints the N×N kernel, one row per line. */
#include <stdio.h>

#include <tpk/tpk.h>

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s X\n", argv[0]);
        return 2;
    }
    /* The first error recorded wins and stays in the context until tpk_ctx_clear (tpk/error.h):
     * this program stops at the first one, so it prints ctx.msg and never clears. */
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_array *X = NULL, *K = NULL;
    int rc = 1;
    if (!(X = tpk_io_read(argv[1], NULL, &ctx)))
        goto done;

    /* Flags as gpkernel spells them, without "--" (gpkernel --list-archs lists each one's). */
    const tpk_arch_flag flags[] = {{.flag = "depth", .value = "2"},
                                   {.flag = "phi", .value = "relu"},
                                   {.flag = "sigma-w2", .value = "1.7"},
                                   {.flag = "sigma-b2", .value = "0.05"}};
    /* root NULL: the installed programs; a folder of your own holding programs/ works too */
    tpk_arch_opts o = {.flags = flags, .nflags = 4, .root = NULL};
    if (tpk_arch_kernel(tpk_arch_find("mlp"), &o, X, NULL, &K, NULL, NULL, NULL, &ctx))
        goto done;
    size_t n = K->dims[0];
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            printf("%.17g%c", K->data[i * n + j], j + 1 < n ? ' ' : '\n');
    rc = 0;

done:
    if (rc)
        fprintf(stderr, "arch_kernel: %s (%s)\n", ctx.msg, tpk_strerror(ctx.status));
    tpk_array_free(K);
    tpk_array_free(X);
    return rc;
}
