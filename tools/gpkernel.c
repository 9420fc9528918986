/* gpkernel: infinite-width GP kernels of whole architectures (shipped NETSOR programs) or of any
 * NETSOR program, written to self-describing HDF5. The command line is tools/cli_kernel.c's,
 * shared with gpkernel-mpi. */
#include "cli_kernel.h"

#include "tpk/tpk.h"

#include <stdio.h>
#include <stdlib.h>

static const char *const help[3] = {
    "Usage: gpkernel --arch=NAME [options] --output=FILE.h5\n"
    "       gpkernel --program=FILE.nsr [--set NAME=VALUE]... [options] --output=FILE.h5\n"
    "Infinite-width (NNGP) kernel of an architecture or NETSOR program, written to HDF5.\n"
    "\n",
    "",
    CLI_PROGRESS_HELP
    CLI_EXIT_HELP};

static int run(int argc, char **argv, int *usage_error, tpk_ctx *ctx)
{
    cli_kernel k;
    int st = cli_kernel_parse(argc, argv, "gpkernel", help, NULL, NULL, NULL, &k, ctx);
    if (st == CLI_KERNEL_DONE)
        st = TPK_OK;
    else if (st)
        *usage_error = 1; /* the command line itself: exit 2 */
    else {
        int nrec = 0;
        char **rec = cli_record_argv(argc, argv, &nrec); /* the command line as recorded */
        cli_progress bar = {0};
        if (rec == NULL) {
            st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        } else if (!(st = cli_kernel_job(&k, nrec, rec, usage_error, ctx))) {
            cli_progress_start(&bar, "gpkernel", "limit kernel", 0,
                               !k.quiet && cli_progress_wanted(k.progress));
            k.job.summary = k.quiet ? NULL : cli_progress_stream(&bar, stdout);
            k.job.progress = cli_progress_lib(&bar, NULL);
            st = k.a && k.a->custom ? tpk_arch_custom_job(k.a, &k.job, ctx) : tpk_job_kernel(&k.job, ctx);
            cli_progress_end(&bar, st == TPK_OK);
        }
        free(rec);
    }
    cli_kernel_free(&k);
    return st;
}

int main(int argc, char **argv)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    cli_notes(&ctx, "gpkernel");
    int usage_error = 0, st = run(argc, argv, &usage_error, &ctx);
    return usage_error ? cli_report_usage("gpkernel", st, &ctx) : cli_report("gpkernel", st, &ctx);
}
