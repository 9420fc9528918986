/* netsor: command-line front end for NETSOR programs (docs/netsor.md).
 *   netsor check prog.nsr [--set k=v]... [--netsor-plus] [--explain]
 *   netsor dump  prog.nsr [...]
 * One function per subcommand, dispatched from the table `commands` (add rows to extend). */
#include "cli.h"

#include "tpk/tpk.h"
#include "tpk/job.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Options shared by the subcommands that load a program. */
typedef struct cli {
    const char *path;
    cli_sets sets;
    tpk_netsor_opts opts;
    int nargs;              /* extra positional arguments, for subcommands that take them */
    const char *args[8];
    const char *input, *test, *output, *width, *seed; /* kernel / run */
    int all_outputs, quiet;
    int progress;           /* --progress 1, --no-progress 0, neither -1 */
    int argc;               /* the whole command line, for provenance */
    char **argv;
} cli;

static const char usage[] =
    "Usage: netsor COMMAND PROGRAM.nsr [options]\n"
    "Parse, check and elaborate NETSOR programs (infinite-width Tensor Programs).\n"
    "\n"
    "Commands:\n"
    "  check    type-check and elaborate; print a one-line summary\n"
    "  dump     print the elaborated straight-line IR\n"
    "  kernel   infinite-width kernel by the Master Theorem → HDF5 (/kernel)\n"
    "  run      the same program at finite width n with random weights → HDF5\n"
    "           (/kernel_hat: (1/n)<h,h'> times sigma_v2 (+ readout bias), /outputs: sampled readouts)\n"
    "\n"
    "Options:\n"
    "  --set NAME=VALUE   override a program parameter (repeatable): --set L=4 --set phi=erf\n"
    "  --netsor-plus      allow NETSOR+ Moments (mean(...)) without 'use netsor+'\n"
    "  --explain          report inferred shape holes '_' and other notes on stderr\n"
    "  --input=SPEC       (kernel, run) inputs: FILE.h5:/dataset, FILE.npy, FILE.npz:NAME or\n"
    "                     FILE.csv; N×d, or N×T×d for programs with 'input x[t in 1..T]' (T\n"
    "                     set from it)\n"
    "  --test=SPEC        (kernel) test inputs: also /kernel_test_train and /kernel_test_diag\n"
    "  --output=FILE.h5   (kernel, run) output, written atomically\n"
    "  --all-outputs      (kernel, run) every readout (e.g. all time steps), input-major;\n"
    "                     default: the last output only\n"
    "  --width=N          (run) the width n of every width symbol\n"
    "  --seed=S           (run) random seed (default 0); results depend on it alone\n"
    "  --quiet            (kernel, run) no summary on stdout, no progress line\n"
    "  --progress, --no-progress   (kernel, run) the progress line (below)\n"
    "  --help             this text        --version   the toolkit version\n"
    "\n"
    "Options take their value as --opt=VALUE or --opt VALUE.\n"
    "Errors go to stderr (file:line:col: message for the program's own).\n"
    CLI_PROGRESS_HELP
    CLI_EXIT_HELP;

static void cli_free(cli *c)
{
    cli_sets_free(&c->sets);
}

enum { O_PLUS = 256, O_EXPLAIN, O_ALLOUT, O_QUIET, O_INPUT, O_TEST, O_OUTPUT, O_WIDTH, O_SEED,
       O_SET, O_HELP, O_VERSION, O_PROGRESS, O_NOPROGRESS };

static const struct option longopts[] = {
    {"netsor-plus", no_argument, NULL, O_PLUS}, {"explain", no_argument, NULL, O_EXPLAIN},
    {"all-outputs", no_argument, NULL, O_ALLOUT}, {"quiet", no_argument, NULL, O_QUIET},
    {"input", required_argument, NULL, O_INPUT}, {"test", required_argument, NULL, O_TEST},
    {"output", required_argument, NULL, O_OUTPUT}, {"width", required_argument, NULL, O_WIDTH},
    {"seed", required_argument, NULL, O_SEED}, {"set", required_argument, NULL, O_SET},
    {"help", no_argument, NULL, O_HELP}, {"version", no_argument, NULL, O_VERSION},
    {"progress", no_argument, NULL, O_PROGRESS}, {"no-progress", no_argument, NULL, O_NOPROGRESS},
    {NULL, 0, NULL, 0}};

/* Parse PROGRAM and options after the subcommand name (getopt_long: --opt=v or --opt v; argv[0]
 * is the subcommand). Returns 0, or 2 on a usage error. */
static int parse_cli(int argc, char **argv, cli *c, const char *cmd)
{
    memset(c, 0, sizeof *c);
    c->progress = -1;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    int o, st = TPK_OK;
    opterr = 0;
    optind = 0; /* GNU getopt: start afresh */
    cli_seen seen;
    cli_seen_init(&seen, longopts);
    while (st == TPK_OK && (o = cli_getopt(argc, argv, longopts, &seen, &st, &ctx)) != -1) {
        switch (o) {
        case O_PLUS: c->opts.netsor_plus = 1; break;
        case O_EXPLAIN: c->opts.explain = 1; break;
        case O_ALLOUT: c->all_outputs = 1; break;
        case O_QUIET: c->quiet = 1; break;
        case O_PROGRESS: c->progress = 1; break;
        case O_NOPROGRESS: c->progress = 0; break;
        case O_INPUT: c->input = optarg; break;
        case O_TEST: c->test = optarg; break;
        case O_OUTPUT: c->output = optarg; break;
        case O_WIDTH: c->width = optarg; break;
        case O_SEED: c->seed = optarg; break;
        case O_SET: st = cli_sets_add(&c->sets, optarg, &ctx); break;
        default:
            fprintf(stderr, "netsor %s: unknown or malformed option '%s' (see netsor --help)\n",
                    cmd, argv[optind - 1]);
            return 2;
        }
    }
    /* options another command takes are refused, not ignored (issue 18: kernel --width=8 ran
     * the limit as if it were not there) */
    static const char *const run_only[] = {"width", "seed"}, *const job_only[] = {
        "input", "test", "output", "all-outputs", "width", "seed"};
    const int job = strcmp(cmd, "kernel") == 0 || strcmp(cmd, "run") == 0;
    for (size_t i = 0; !st && !job && i < sizeof job_only / sizeof job_only[0]; i++)
        st = cli_refuse(&seen, job_only[i], "check and dump read the program only", &ctx);
    for (size_t i = 0; !st && strcmp(cmd, "kernel") == 0 && i < 2; i++)
        st = cli_refuse(&seen, run_only[i], "the limit kernel has no width and no random "
                        "weights (that is netsor run)", &ctx);
    if (st) {
        fprintf(stderr, "netsor %s: %s\n", cmd, ctx.msg);
        return 2;
    }
    for (int i = optind; i < argc; i++) {
        if (c->path == NULL) {
            c->path = argv[i];
        } else if (c->nargs < (int)(sizeof c->args / sizeof c->args[0])) {
            c->args[c->nargs++] = argv[i];
        } else {
            fprintf(stderr, "netsor %s: too many arguments\n", cmd);
            return 2;
        }
    }
    if (c->path == NULL) {
        fprintf(stderr, "netsor %s: missing PROGRAM.nsr (see netsor --help)\n", cmd);
        return 2;
    }
    c->opts.sets = c->sets.set;
    c->opts.nsets = c->sets.n;
    c->opts.diag = stderr;
    return 0;
}

/* Load the program named on the command line; prints the error and returns NULL on failure. */
static tpk_program *load(cli *c, tpk_phi_registry **reg)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    *reg = tpk_job_registry(&ctx);
    tpk_program *p = *reg ? tpk_netsor_load_file(c->path, &c->opts, *reg, &ctx) : NULL;
    if (p == NULL)
        fprintf(stderr, "%s\n", ctx.msg[0] ? ctx.msg : tpk_strerror(ctx.status));
    return p;
}

static int cmd_check(int argc, char **argv)
{
    cli c;
    int st = parse_cli(argc - 1, argv + 1, &c, "check");
    if (st) {
        cli_free(&c);
        return st;
    }
    tpk_phi_registry *reg;
    tpk_program *p = load(&c, &reg);
    if (p != NULL) {
        int ng = 0, nh = 0, ns = 0;
        for (int i = 0; i < p->nvars; i++) {
            ng += p->var[i].type == TPK_VAR_G;
            nh += p->var[i].type == TPK_VAR_H;
            ns += p->var[i].type == TPK_VAR_SCALAR;
        }
        int nf = tpk_program_family_instructions(p);
        if (p->ninstr == 0 && nf > 0) /* only the rolled form: the unrolled one is too large */
            printf("%s: ok (rolled: %d family instructions, %d input slot%s, %d output%s%s)\n",
                   c.path, nf, p->nslots, p->nslots == 1 ? "" : "s", p->noutputs,
                   p->noutputs == 1 ? "" : "s",
                   p->features & TPK_FEAT_NETSOR_PLUS ? ", netsor+" : "");
        else
            printf("%s: ok (%d instructions, %d G-vars, %d H-vars, %d scalars, %d A-vars, %d "
                   "embeddings, %d input slot%s, %d output%s%s%s%s)\n",
                   c.path, p->ninstr, ng, nh, ns, p->navars, p->nembeds, p->nslots,
                   p->nslots == 1 ? "" : "s", p->noutputs, p->noutputs == 1 ? "" : "s",
                   p->features & TPK_FEAT_NETSOR_PLUS ? ", netsor+" : "",
                   p->features & TPK_FEAT_SQRT_N_LOGITS ? ", sqrt-n-logits" : "",
                   nf > 0 ? ", rolled" : "");
    }
    int rc = p != NULL ? 0 : 1;
    tpk_program_free(p);
    tpk_phi_registry_free(reg);
    cli_free(&c);
    return rc;
}

static int cmd_dump(int argc, char **argv)
{
    cli c;
    int st = parse_cli(argc - 1, argv + 1, &c, "dump");
    if (st) {
        cli_free(&c);
        return st;
    }
    tpk_phi_registry *reg;
    tpk_program *p = load(&c, &reg);
    if (p != NULL)
        tpk_program_dump(p, stdout);
    int rc = p != NULL ? 0 : 1;
    tpk_program_free(p);
    tpk_phi_registry_free(reg);
    cli_free(&c);
    return rc;
}

/* Build the job that `kernel` and `run` share; prints a message and returns 2 on a usage error. */
static int make_job(const cli *c, const char *cmd, tpk_job *job)
{
    if (c->input == NULL || c->output == NULL) {
        fprintf(stderr, "netsor %s: needs --input=SPEC and --output=FILE.h5 (see netsor --help)\n", cmd);
        return 2;
    }
    *job = (tpk_job){.label = "program", .program = c->path, .sets = c->sets.set,
                     .nsets = c->sets.n,
                     .netsor_plus = c->opts.netsor_plus, .input = c->input, .test = c->test,
                     .output = c->output, .all_outputs = c->all_outputs, .argc = c->argc,
                     .argv = c->argv, .summary = c->quiet ? NULL : stdout};
    return 0;
}

/* The job of `kernel` or `run` with the progress line: the command line recorded without the
 * display options, the summary through the line's stream. */
typedef struct shown_job {
    cli_progress bar;
    char **rec;
} shown_job;

static int show_job(cli *c, const char *prog, const char *label, tpk_job *job, shown_job *sj,
                    tpk_ctx *ctx)
{
    int nrec = 0;
    sj->rec = cli_record_argv(c->argc, c->argv, &nrec);
    if (!sj->rec)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    job->argc = nrec;
    job->argv = sj->rec;
    cli_progress_start(&sj->bar, prog, label, 0, !c->quiet && cli_progress_wanted(c->progress));
    job->summary = c->quiet ? NULL : cli_progress_stream(&sj->bar, stdout);
    job->progress = cli_progress_lib(&sj->bar, NULL);
    return TPK_OK;
}

static int finish(cli *c, const char *cmd, int st, const tpk_ctx *ctx)
{
    char name[32];
    snprintf(name, sizeof name, "netsor %s", cmd);
    cli_free(c);
    return cli_report(name, st, ctx);
}

static int cmd_kernel(int argc, char **argv)
{
    cli c;
    tpk_job job;
    int st = parse_cli(argc - 1, argv + 1, &c, "kernel");
    if (!st)
        st = make_job(&c, "kernel", &job);
    if (st) {
        cli_free(&c);
        return st;
    }
    c.argc = argc;
    c.argv = argv;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    cli_notes(&ctx, "netsor kernel");
    shown_job sj = {0};
    st = show_job(&c, "netsor kernel", "limit kernel", &job, &sj, &ctx);
    if (!st)
        st = tpk_job_kernel(&job, &ctx);
    cli_progress_end(&sj.bar, st == TPK_OK);
    free(sj.rec);
    return finish(&c, "kernel", st, &ctx);
}

static int cmd_run(int argc, char **argv)
{
    cli c;
    tpk_job job;
    int st = parse_cli(argc - 1, argv + 1, &c, "run");
    if (!st)
        st = make_job(&c, "run", &job);
    if (!st && c.width == NULL) {
        fprintf(stderr, "netsor run: needs --width=N\n");
        st = 2;
    }
    size_t n = 0, seed = 0;
    tpk_ctx pctx;
    tpk_ctx_init(&pctx);
    if (!st && (cli_parse_size("width", c.width, 1, (size_t)1 << 32, &n, &pctx) ||
                (c.seed && cli_parse_size("seed", c.seed, 0, SIZE_MAX, &seed, &pctx)))) {
        fprintf(stderr, "netsor run: %s\n", pctx.msg);
        st = 2;
    }
    if (st) {
        cli_free(&c);
        return st;
    }
    c.argc = argc;
    c.argv = argv;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    cli_notes(&ctx, "netsor run");
    shown_job sj = {0};
    st = show_job(&c, "netsor run", "finite-width run", &job, &sj, &ctx);
    if (!st)
        st = tpk_job_run(&job, n, (uint64_t)seed, &ctx);
    cli_progress_end(&sj.bar, st == TPK_OK);
    free(sj.rec);
    return finish(&c, "run", st, &ctx);
}

typedef struct command {
    const char *name;
    int (*fn)(int argc, char **argv); /* the whole command line: argv[1] is the command */
} command;

static const command commands[] = {
    {"check", cmd_check},
    {"dump", cmd_dump},
    {"kernel", cmd_kernel},
    {"run", cmd_run},
};

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage, stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        fputs(usage, stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        cli_version("netsor");
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0) {
            for (int k = 2; k < argc; k++) {
                if (strcmp(argv[k], "--help") == 0 || strcmp(argv[k], "-h") == 0) {
                    fputs(usage, stdout);
                    return 0;
                }
                if (strcmp(argv[k], "--version") == 0) {
                    cli_version("netsor");
                    return 0;
                }
            }
            return commands[i].fn(argc, argv);
        }
    fprintf(stderr, "netsor: unknown command '%s' (see netsor --help)\n", argv[1]);
    return 2;
}
