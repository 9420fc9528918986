/* gpkernel's command line, shared by gpkernel and gpkernel-mpi (mpi/, issue 16): its options,
 * their parsing into a kernel job (tpk_job), and the option help both print. A tool adds its own
 * options (a getopt table and a handler); everything else means what it means to gpkernel. */
#ifndef TPK_TOOLS_CLI_KERNEL_H
#define TPK_TOOLS_CLI_KERNEL_H

#include "cli.h"

#include "tpk/archs.h"
#include "tpk/job.h"

/* The option lines of gpkernel's --help (between its usage and its conventions). */
extern const char cli_kernel_options_help[];
/* The conventions gpkernel's --help ends with (mlp, rnn, option syntax). */
extern const char cli_kernel_conventions_help[];

/* A tool's own options: getopt_long entries whose `val` is at least CLI_KERNEL_OWN, and the
 * handler called with that val and optarg (status; an error is a usage error). */
#define CLI_KERNEL_OWN 1024
typedef int (*cli_kernel_own_fn)(int val, const char *arg, void *user, tpk_ctx *ctx);

/* cli_kernel_parse's return when --help, --version or --list-* was answered: exit 0. */
#define CLI_KERNEL_DONE (-1)

typedef struct cli_kernel {
    const tpk_arch *a;                /* --arch (NULL with --program) */
    const char *program, *input, *test, *output;
    cli_arch_flags flags;             /* --flag=value of the architecture */
    char attr[CLI_MAX_FLAGS][64];     /* output attribute of each: the flag with '_' for '-' */
    cli_sets sets;
    int all_times, netsor_plus, quiet, layernorm, force;
    int kernel, ntk_param;    /* --kernel, --parameterization (TPK_JOB_*, TPK_NTK_PARAM_*) */
    size_t ntk_width;         /* --ntk-width */
    int progress;                     /* --progress 1, --no-progress 0, neither -1 */
    /* the job (cli_kernel_job) and what it points into */
    char prog[4200], input_buf[4200], lists[2048];
    tpk_param_set jsets[TPK_ARCH_MAX_SETS];
    int njsets;
    tpk_attr attrs[CLI_MAX_FLAGS + 2];
    int nattrs;
    tpk_job job;
} cli_kernel;

/* Parse gpkernel's options and the tool's own (own: a getopt table ending in a zero entry, NULL:
 * none). `tool` names the tool in --version. --help prints help[0] (the usage lines),
 * cli_kernel_options_help, help[1] (the tool's own option lines), cli_kernel_conventions_help,
 * help[2], then the architectures and their flags. Returns TPK_OK, CLI_KERNEL_DONE, or an error
 * status (a usage error: exit 2). argv is not changed. */
int cli_kernel_parse(int argc, char **argv, const char *tool, const char *const help[3],
                     const struct option *own, cli_kernel_own_fn fn, void *user, cli_kernel *k,
                     tpk_ctx *ctx);
/* Build k->job from the parsed options: the architecture's settings, its program, the flags as
 * attributes, the command line (argc, argv) for provenance. *usage_error is set when the
 * failure is the command line's (a --program without --input). */
int cli_kernel_job(cli_kernel *k, int argc, char **argv, int *usage_error, tpk_ctx *ctx);
void cli_kernel_free(cli_kernel *k);

#endif
