/* gpregress: GP regression (and classification as regression on one-hot targets) with NNGP, RBF or
 * precomputed kernels; noise and hyperparameters by the training marginal likelihood. Options in,
 * one experiment of the library out (tpk_gp_experiment_run, gp/experiment.c). */
#include "cli_gpregress.h"

#include "tpk/clock.h"
#include "tpk/gp.h"
#include "tpk/tpk.h"

#include <stdio.h>

static const char *const help[2] = {
    "Usage: gpregress (--arch=NAME [--FLAG=VALUE]... | --program=FILE.nsr) [--set NAME=VALUE]...\n"
    "                 --train=SPEC --labels=SPEC [--test=SPEC] [options] --output=FILE.h5\n"
    "       gpregress --kernel=FILE.h5 --labels=SPEC [options] --output=FILE.h5\n"
    "Gaussian-process regression with the infinite-width kernel (NNGP) of any architecture\n"
    "(gpkernel --list-archs) or NETSOR program, an RBF kernel or a precomputed kernel; with\n"
    "--classify, classification as regression on one-hot targets.\n"
    "\n",
    ""};

int main(int argc, char **argv)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    cli_notes(&ctx, "gpregress");
    const double t0 = tpk_wall_seconds();
    cli_gpregress g;
    int st = cli_gpregress_parse(argc, argv, "gpregress", help, NULL, NULL, NULL, &g, &ctx);
    if (st == CLI_GPREGRESS_DONE)
        return 0;
    if (st != TPK_OK) {
        cli_gpregress_free(&g);
        return st == TPK_ENOMEM ? cli_report("gpregress", st, &ctx)
                                : cli_report_usage("gpregress", st, &ctx);
    }
    tpk_gp_experiment_opts *o = &g.o;
    cli_progress bar;
    cli_progress_start(&bar, "gpregress", NULL, 0, !g.quiet && cli_progress_wanted(g.progress));
    o->summary = g.quiet ? NULL : cli_progress_stream(&bar, stdout);
    o->warnings = g.quiet ? NULL : cli_progress_stream(&bar, stderr);
    o->progress = cli_progress_lib(&bar, NULL);
    st = tpk_gp_experiment_run(o, &ctx);
    cli_progress_end(&bar, st == TPK_OK);
    if (st == TPK_OK && !g.quiet)
        printf("  wrote %s in %.1f s\n", o->output, tpk_wall_seconds() - t0);
    cli_gpregress_free(&g);
    return cli_report("gpregress", st, &ctx);
}
