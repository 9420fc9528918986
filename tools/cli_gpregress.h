/* gpregress's command line, shared by gpregress and gpregress-mpi (mpi/, issue 16): its options
 * into the experiment's (tpk_gp_experiment_opts), the option help both print, the recorded
 * command line. A tool adds its own options (a getopt table and a handler); everything else
 * means what it means to gpregress. */
#ifndef TPK_TOOLS_CLI_GPREGRESS_H
#define TPK_TOOLS_CLI_GPREGRESS_H

#include "cli.h"

#include "tpk/gp.h"

/* The option lines of gpregress's --help (Kernel: ... Output:), and what follows the tool's own
 * (the option syntax, the progress line, the exit statuses). */
extern const char cli_gpregress_options_help[];
extern const char cli_gpregress_tail_help[];

/* A tool's own options: getopt_long entries whose `val` is at least CLI_GPREGRESS_OWN, and the
 * handler called with that val and optarg (status; an error is a usage error). */
#define CLI_GPREGRESS_OWN 1024
typedef int (*cli_gpregress_own_fn)(int val, const char *arg, void *user, tpk_ctx *ctx);

/* cli_gpregress_parse's return when --help or --version was answered: exit 0. */
#define CLI_GPREGRESS_DONE (-1)

/* The most --times of --predict=gd. */
#define CLI_GD_TIMES 256

typedef struct cli_gpregress {
    tpk_gp_experiment_opts o;  /* argc, argv: the recorded command line (without the display
                                  options); name: the tool */
    int quiet;
    int progress;              /* --progress 1, --no-progress 0, neither -1 */
    char **rec;                /* the recorded command line (o.argv) */
    cli_arch_flags flags;      /* an --arch of the table: its flags (o.arch_flags) */
    cli_sets sets;             /* --set (o.sets) */
    double times[CLI_GD_TIMES]; /* --times (o.times) */
    size_t fwidths[32];        /* --finite-widths (o.finite_widths) */
} cli_gpregress;

/* Parse gpregress's options and the tool's own (own: a getopt table ending in a zero entry,
 * NULL: none), check them together (tpk_gp_experiment_check). --help prints help[0] (the usage
 * lines), cli_gpregress_options_help, help[1] (the tool's own option lines) and
 * cli_gpregress_tail_help; `tool` names the tool in --version and in o.name. Returns TPK_OK,
 * CLI_GPREGRESS_DONE or an error status (a usage error: exit 2, except TPK_ENOMEM). */
int cli_gpregress_parse(int argc, char **argv, const char *tool, const char *const help[2],
                        const struct option *own, cli_gpregress_own_fn fn, void *user,
                        cli_gpregress *g, tpk_ctx *ctx);
void cli_gpregress_free(cli_gpregress *g);

#endif
