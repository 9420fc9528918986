/* netsor: command-line front end for NETSOR programs (docs/netsor.md).
 *   netsor check prog.nsr [--set k=v]... [--netsor-plus] [--explain]
 *   netsor dump  prog.nsr [...]
 *   netsor plan  prog.nsr [--input=SPEC | --inputs=N --dim=D] [--plan=naive|optimal|both]
 *                [--verify] [--signatures] [--emitted[=CACHE]]
 * One function per subcommand, dispatched from the table `commands` (add rows to extend). */
#include "cli.h"

#include "tpk/tpk.h"
#include "tpk/job.h"
#include "tpk/tune.h"

#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Options shared by the subcommands that load a program. */
typedef struct cli {
    const char *path;
    cli_sets sets;
    tpk_netsor_opts opts;
    int nargs;              /* extra positional arguments, for subcommands that take them */
    const char *args[8];
    const char *input, *test, *output, *width, *seed; /* kernel / run / train */
    const char *labels, *seeds, *lr, *steps, *at;     /* train */
    const char *plan, *inputs, *dim;                  /* plan */
    int verify;                                       /* plan --verify */
    int ir;                                           /* dump --ir */
    int signatures;                                   /* plan --signatures */
    int emitted;                                      /* plan --emitted */
    const char *ew_cache;                             /* its cache, or NULL: the default */
    int all_outputs, quiet, force;
    int kernel, ntk_param;  /* kernel --kernel, --parameterization (TPK_JOB_*, TPK_NTK_PARAM_*) */
    size_t ntk_width;       /* kernel --ntk-width (the standard parameterisation's width) */
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
    "  dump     print the elaborated straight-line IR (--ir: the family IR of the rolled\n"
    "           form, which the rolled evaluator and executor run)\n"
    "  kernel   infinite-width kernel by the Master Theorem → HDF5 (/kernel), with the\n"
    "           program's own parameter defaults: programs/mlp.nsr's are gpkernel --arch=mlp's\n"
    "           (the same kernel); other shipped programs may differ from their gpkernel row\n"
    "           (gpkernel --list-archs, \"sets:\")\n"
    "  run      the same program at finite width n with random weights → HDF5\n"
    "           (/kernel_hat: (1/n)<h,h'> times sigma_v2 (+ readout bias), /outputs: sampled readouts)\n"
    "  train    --seeds networks of the program at --width trained by full-batch gradient\n"
    "           descent on MSE (neural-tangents' 'ntk' parameterisation, the gradients of the\n"
    "           empirical NTK's backward pass) → HDF5 (/train_outputs, /test_outputs: seed ×\n"
    "           step × input × output; /loss: seed × step); compare with gpregress --predict=gd\n"
    "  plan     the limit kernel with its orchestration shown: every entrywise plan (fused\n"
    "           kernels chosen by a binary linear program, docs/orchestration.md), its kernels\n"
    "           with predicted and measured times; nothing is written\n"
    "\n"
    "Options:\n"
    "  --set NAME=VALUE   override a program parameter (repeatable): --set L=4 --set phi=erf\n"
    "  --netsor-plus      allow NETSOR+ Moments (mean(...)) without 'use netsor+'\n"
    "  --explain          report inferred shape holes '_' and other notes on stderr\n"
    "  --ir               (dump) the family IR: per family instruction its domain and\n"
    "                     instructions (matmul with its weight and site, map, lin, moment,\n"
    "                     ...), then each weight with the sites that use it (tied weights)\n"
    "  --verify-ir        check the family IR after lowering (any command; also\n"
    "                     TPK_VERIFY_IR=1): a broken rule is an error naming the node\n"
    "  --input=SPEC       (kernel, run) inputs: FILE.h5:/dataset, FILE.npy, FILE.npz:NAME or\n"
    "                     FILE.csv; N×d, or N×T×d for programs with 'input x[t in 1..T]' (T\n"
    "                     set from it)\n"
    "  --test=SPEC        (kernel) test inputs: also /kernel_test_train and /kernel_test_diag;\n"
    "                     (train) inputs whose outputs are recorded, without a loss\n"
    "  --train=SPEC       (train) the training inputs (as --input); --labels=SPEC their targets,\n"
    "                     N or N × outputs\n"
    "  --steps=K          (train) gradient-descent steps; --at=LIST the steps recorded (default\n"
    "                     0,K; K is always recorded)\n"
    "  --lr=V             (train) the learning rate (default 1): loss (1/2N)||f - y||^2 over the\n"
    "                     N targets, the scale of gpregress --predict=gd --steps --lr\n"
    "  --seeds=S          (train) networks, with seeds --seed, --seed + 1, ... (default 1)\n"
    "  --kernel=K         (kernel) nngp (default: /kernel), ntk (/ntk: the Neural Tangent\n"
    "                     Kernel, docs/theory.md section 8) or both\n"
    "  --parameterization=P  (kernel, run) the NTK's: ntk (neural-tangents' 'ntk', the default:\n"
    "                     each weight's term carries its variance) or tp (Tensor Programs II's:\n"
    "                     gradients in the weights' unit-variance entries, no variance factor)\n"
    "                     or standard (neural-tangents' 'standard': the weights' own entries;\n"
    "                     kernel: needs --ntk-width=N, the finite width it depends on; run: --width)\n"
    "  --ntk-width=N      (kernel) the width n of the standard parameterisation's NTK\n"
    "  --output=FILE.h5   (kernel, run) output, written atomically\n"
    "  --force            (kernel, run) replace an existing --output that is not an HDF5 file\n"
    "                     of this toolkit (refused by default: nothing is overwritten)\n"
    "  --all-outputs      (kernel, run) every readout (e.g. all time steps), input-major;\n"
    "                     default: the last output only\n"
    "  --width=N          (run) the width n of every width symbol\n"
    "  --ntk              (run) also the empirical NTK J J^T of the same network (/ntk_hat), by\n"
    "                     a backward pass (every weight's pairs of uses); (check) whether the NTK\n"
    "                     takes the program (BP-like, differentiable, no sqrt(n) logits, no bn)\n"
    "  --seed=S           (run) random seed (default 0); results depend on it alone\n"
    "  --quiet            (kernel, run) no summary on stdout, no progress line\n"
    "  --plan=P           (plan) naive, optimal (default) or both (then compared)\n"
    "  --inputs=N --dim=D (plan) without --input: N inputs N(0, 1) of dimension D, seed 0\n"
    "                     (default 256 and 16; sequences take the program's T)\n"
    "  --verify           (plan) also run every candidate kernel of every entrywise plan\n"
    "                     exactly over Z_p against whole-matrix loops (a Z_p twin: maps\n"
    "                     a random table); a difference is an error (exit 1)\n"
    "  --signatures[=all] (plan) each kernel's signature under it (\"sig: in=...\"), the\n"
    "                     text `tptune ew -` emits, verifies and times it from; =all: every\n"
    "                     candidate's too (time them all once; --emitted then plans with them)\n"
    "  --emitted[=CACHE]  (plan, optimal) run each fused kernel the tuner can emit as emitted C:\n"
    "                     verified exactly (Z_p twin) and against libm, compiled (gcc), timed\n"
    "                     once at this n and cached per machine class (CACHE, default\n"
    "                     ~/.cache/tpk/ew.jsonl, as tptune ew); cached times are the plan's\n"
    "                     costs for those candidates\n"
    "  TPK_PLAN=naive|optimal  (environment) the plan every limit kernel runs (default optimal)\n"
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
       O_SET, O_HELP, O_VERSION, O_PROGRESS, O_NOPROGRESS, O_PLAN, O_INPUTS, O_DIM, O_VERIFY, O_SIGS,
       O_EMITTED, O_FORCE, O_IR, O_VERIFY_IR, O_KERNEL, O_PARAM, O_NTK, O_NTKW, O_TRAIN,
       O_LABELS, O_SEEDS, O_LR, O_STEPS, O_AT };

static const struct option longopts[] = {
    {"netsor-plus", no_argument, NULL, O_PLUS}, {"explain", no_argument, NULL, O_EXPLAIN},
    {"all-outputs", no_argument, NULL, O_ALLOUT}, {"quiet", no_argument, NULL, O_QUIET},
    {"input", required_argument, NULL, O_INPUT}, {"test", required_argument, NULL, O_TEST},
    {"output", required_argument, NULL, O_OUTPUT}, {"width", required_argument, NULL, O_WIDTH},
    {"seed", required_argument, NULL, O_SEED}, {"set", required_argument, NULL, O_SET},
    {"help", no_argument, NULL, O_HELP}, {"version", no_argument, NULL, O_VERSION},
    {"progress", no_argument, NULL, O_PROGRESS}, {"no-progress", no_argument, NULL, O_NOPROGRESS},
    {"plan", required_argument, NULL, O_PLAN}, {"inputs", required_argument, NULL, O_INPUTS},
    {"dim", required_argument, NULL, O_DIM}, {"verify", no_argument, NULL, O_VERIFY},
    {"signatures", optional_argument, NULL, O_SIGS},
    {"emitted", optional_argument, NULL, O_EMITTED}, {"force", no_argument, NULL, O_FORCE},
    {"ir", no_argument, NULL, O_IR}, {"verify-ir", no_argument, NULL, O_VERIFY_IR},
    {"kernel", required_argument, NULL, O_KERNEL},
    {"parameterization", required_argument, NULL, O_PARAM}, {"ntk", no_argument, NULL, O_NTK},
    {"ntk-width", required_argument, NULL, O_NTKW},
    {"train", required_argument, NULL, O_TRAIN}, {"labels", required_argument, NULL, O_LABELS},
    {"seeds", required_argument, NULL, O_SEEDS}, {"lr", required_argument, NULL, O_LR},
    {"steps", required_argument, NULL, O_STEPS}, {"at", required_argument, NULL, O_AT},
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
        case O_FORCE: c->force = 1; break;
        case O_PROGRESS: c->progress = 1; break;
        case O_NOPROGRESS: c->progress = 0; break;
        case O_INPUT: c->input = optarg; break;
        case O_TEST: c->test = optarg; break;
        case O_OUTPUT: c->output = optarg; break;
        case O_WIDTH: c->width = optarg; break;
        case O_TRAIN: c->input = optarg; break;
        case O_LABELS: c->labels = optarg; break;
        case O_SEEDS: c->seeds = optarg; break;
        case O_LR: c->lr = optarg; break;
        case O_STEPS: c->steps = optarg; break;
        case O_AT: c->at = optarg; break;
        case O_SEED: c->seed = optarg; break;
        case O_SET: st = cli_sets_add(&c->sets, optarg, &ctx); break;
        case O_PLAN: c->plan = optarg; break;
        case O_INPUTS: c->inputs = optarg; break;
        case O_DIM: c->dim = optarg; break;
        case O_VERIFY: c->verify = 1; break;
        case O_SIGS:
            if (optarg != NULL && strcmp(optarg, "all") != 0) {
                fprintf(stderr, "netsor %s: --signatures=%s: expected --signatures or --signatures=all\n", cmd,
                        optarg);
                return 2;
            }
            c->signatures = optarg != NULL ? 2 : 1;
            break;
        case O_EMITTED: c->emitted = 1, c->ew_cache = optarg; break;
        case O_IR: c->ir = 1; break;
        case O_KERNEL: st = cli_parse_kernel_kind(optarg, &c->kernel, &ctx); break;
        case O_PARAM: st = cli_parse_ntk_param(optarg, &c->ntk_param, &ctx); break;
        case O_NTK: c->kernel = TPK_JOB_BOTH; break;
        case O_NTKW: st = cli_parse_size("ntk-width", optarg, 1, (size_t)1 << 32, &c->ntk_width, &ctx); break;
        case O_VERIFY_IR: /* jobs (kernel, run) load the program themselves */
            c->opts.verify_ir = 1;
            setenv("TPK_VERIFY_IR", "1", 1);
            break;
        default:
            fprintf(stderr, "netsor %s: unknown or malformed option '%s' (see netsor --help)\n",
                    cmd, argv[optind - 1]);
            return 2;
        }
    }
    /* options another command takes are refused, not ignored (issue 18: kernel --width=8 ran
     * the limit as if it were not there) */
    static const char *const run_only[] = {"width", "seed"}, *const job_only[] = {
        "input", "test", "output", "all-outputs", "width", "seed", "force"}, *const plan_only[] = {
        "plan", "inputs", "dim", "verify", "signatures", "emitted"}, *const not_plan[] = {"test", "output", "width", "seed", "force",
        "quiet", "progress", "no-progress"};
    const int train = strcmp(cmd, "train") == 0;
    const int job = strcmp(cmd, "kernel") == 0 || strcmp(cmd, "run") == 0 || train;
    const int plan = strcmp(cmd, "plan") == 0;
    static const char *const train_only[] = {"train", "labels", "seeds", "lr", "steps", "at"};
    for (size_t i = 0; !st && !train && i < sizeof train_only / sizeof train_only[0]; i++)
        st = cli_refuse(&seen, train_only[i], "only netsor train takes it", &ctx);
    if (!st && train)
        st = cli_refuse(&seen, "input", "netsor train reads its training inputs from --train",
                        &ctx);
    for (size_t i = 0; !st && !job && !plan && i < sizeof job_only / sizeof job_only[0]; i++)
        st = cli_refuse(&seen, job_only[i], "check and dump read the program only", &ctx);
    for (size_t i = 0; !st && !plan && i < sizeof plan_only / sizeof plan_only[0]; i++)
        st = cli_refuse(&seen, plan_only[i], "only netsor plan takes it", &ctx);
    for (size_t i = 0; !st && plan && i < sizeof not_plan / sizeof not_plan[0]; i++)
        st = cli_refuse(&seen, not_plan[i], "netsor plan writes no file and prints its plans",
                        &ctx);
    if (!st && strcmp(cmd, "dump") != 0)
        st = cli_refuse(&seen, "ir", "only netsor dump takes it", &ctx);
    if (!st && strcmp(cmd, "kernel") != 0)
        st = cli_refuse(&seen, "kernel", "only netsor kernel takes it (netsor run --ntk: the "
                        "empirical NTK)", &ctx);
    if (!st && strcmp(cmd, "run") != 0 && strcmp(cmd, "check") != 0)
        st = cli_refuse(&seen, "ntk", "only netsor run and check take it (netsor kernel "
                        "--kernel=ntk: the limit NTK)", &ctx);
    if (!st && !job)
        st = cli_refuse(&seen, "parameterization", "only netsor kernel and run take it", &ctx);
    if (!st && strcmp(cmd, "kernel") != 0)
        st = cli_refuse(&seen, "ntk-width", "only netsor kernel takes it (netsor run: --width)", &ctx);
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
    if (p != NULL && c.kernel != TPK_JOB_NNGP) { /* --ntk: what the NTK needs, statically */
        tpk_ctx ctx;
        tpk_ctx_init(&ctx);
        if (tpk_netsor_ntk_check(p, &ctx)) {
            fprintf(stderr, "%s\n", ctx.msg);
            tpk_program_free(p);
            p = NULL;
        }
    }
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
        if (c.kernel != TPK_JOB_NNGP)
            printf("%s: NTK: BP-like (readouts independent, zero-mean, not used inside the "
                   "network: Tensor Programs II, Condition 1); every nonlinearity differentiable\n",
                   c.path);
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
    int rc = p != NULL ? 0 : 1;
    if (p != NULL && !c.ir) {
        tpk_program_dump(p, stdout);
    } else if (p != NULL) {
        tpk_ctx ctx;
        tpk_ctx_init(&ctx);
        if (tpk_program_dump_ir(p, stdout, &ctx)) {
            fprintf(stderr, "netsor dump: %s\n", ctx.msg);
            rc = 1;
        }
    }
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
                     .argv = c->argv, .summary = c->quiet ? NULL : stdout, .force = c->force,
                     .explain = c->opts.explain ? stderr : NULL, .kernel = c->kernel,
                     .ntk_param = c->ntk_param, .ntk_width = c->ntk_width};
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

/* A job command's work: the job with its progress line, then the report (kernel, run, train). */
typedef int (*job_fn)(tpk_job *job, const void *user, tpk_ctx *ctx);

static int run_shown(cli *c, int argc, char **argv, const char *cmd, const char *label,
                     tpk_job *job, job_fn fn, const void *user)
{
    char name[32];
    snprintf(name, sizeof name, "netsor %s", cmd);
    c->argc = argc;
    c->argv = argv;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    cli_notes(&ctx, name);
    shown_job sj = {0};
    int st = show_job(c, name, label, job, &sj, &ctx);
    if (!st)
        st = fn(job, user, &ctx);
    cli_progress_end(&sj.bar, st == TPK_OK);
    free(sj.rec);
    return finish(c, cmd, st, &ctx);
}

static int do_kernel(tpk_job *job, const void *user, tpk_ctx *ctx)
{
    (void)user;
    return tpk_job_kernel(job, ctx);
}

typedef struct run_args {
    size_t n;
    uint64_t seed;
} run_args;

static int do_run(tpk_job *job, const void *user, tpk_ctx *ctx)
{
    const run_args *r = user;
    return tpk_job_run(job, r->n, r->seed, ctx);
}

static int do_train(tpk_job *job, const void *user, tpk_ctx *ctx)
{
    return tpk_job_train(job, user, ctx);
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
    return run_shown(&c, argc, argv, "kernel", "limit kernel", &job, do_kernel, NULL);
}

/* netsor train: the job's input is --train, its targets --labels. */
static int cmd_train(int argc, char **argv)
{
    cli c;
    tpk_job job;
    int st = parse_cli(argc - 1, argv + 1, &c, "train");
    if (!st && (c.input == NULL || c.labels == NULL || c.width == NULL || c.steps == NULL)) {
        fprintf(stderr, "netsor train: needs --train=SPEC, --labels=SPEC, --width=N and "
                        "--steps=K (see netsor --help)\n");
        st = 2;
    }
    if (!st)
        st = make_job(&c, "train", &job);
    size_t n = 0, seed = 0, seeds = 1, K = 0, at[256], nat = 0;
    double lr = 1.0;
    tpk_ctx pctx;
    tpk_ctx_init(&pctx);
    if (!st && (cli_parse_size("width", c.width, 1, (size_t)1 << 32, &n, &pctx) ||
                (c.seed && cli_parse_size("seed", c.seed, 0, SIZE_MAX / 2, &seed, &pctx)) ||
                (c.seeds && cli_parse_size("seeds", c.seeds, 1, 1u << 20, &seeds, &pctx)) ||
                cli_parse_size("steps", c.steps, 0, (size_t)1 << 40, &K, &pctx) ||
                (c.lr && cli_parse_double("lr", c.lr, &lr, &pctx)) ||
                (c.at && cli_parse_sizes("at", c.at, 0, K, at, 255, &nat, &pctx)))) {
        fprintf(stderr, "netsor train: %s\n", pctx.msg);
        st = 2;
    }
    if (!st && !(lr > 0)) {
        fprintf(stderr, "netsor train: --lr: %s is not > 0\n", c.lr);
        st = 2;
    }
    if (st) {
        cli_free(&c);
        return st;
    }
    if (c.at == NULL) /* the untrained and the trained network */
        at[nat++] = 0;
    int hasK = 0;
    for (size_t i = 0; i < nat; i++)
        hasK |= at[i] == K;
    if (!hasK)
        at[nat++] = K;
    tpk_job_train_opts t = {.labels = c.labels, .width = n, .seeds = seeds, .seed = seed,
                            .lr = lr, .steps = at, .nsteps = nat};
    return run_shown(&c, argc, argv, "train", "training", &job, do_train, &t);
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
    run_args ra = {n, (uint64_t)seed};
    return run_shown(&c, argc, argv, "run", "finite-width run", &job, do_run, &ra);
}

/* netsor plan: the limit kernel by the rolled evaluator with every entrywise plan printed (its
 * kernels, their predicted and measured times); --plan=both runs the naive plan beside the
 * optimal one on the same input and compares them. */

/* ---- emitted kernels for `netsor plan --emitted` (docs/orchestration.md §7.3) ---------------
 * The provider of tpk_netsor_kernel_plan_with: per signature, the tuner's C kernel — with the
 * fastest schedule the cache knows for this class and n, else the default — verified exactly and
 * against libm (tpk_tune_ew_verify, in processes of their own), compiled, loaded; timed once at
 * n where the cache has no time yet, and the time appended. A kernel that fails verification is
 * not used (the executor runs it) and said so on stderr. */
typedef struct ew_kernel {
    char sig[TPK_TUNE_EW_SIGLEN];
    tpk_netsor_ew_fn fn; /* NULL: not emittable or failed */
    void *h;
} ew_kernel;

typedef struct ew_prov {
    char cache[4096];
    char dir[64];
    tpk_tune_ew_rec *recs;
    size_t nrec;
    ew_kernel *k;
    int nk, cap, threads, failed;
    const char *cls;
    char runner[4096]; /* tptune, whose `__ew` child checks and times: exec'd, not forked */
} ew_prov;

static tpk_tune_ew_rec ew_key(const ew_prov *P, const char *sig, size_t n)
{
    tpk_tune_ew_rec key;
    memset(&key, 0, sizeof key);
    snprintf(key.target_class, sizeof key.target_class, "%s", P->cls);
    snprintf(key.sig, sizeof key.sig, "%s", sig);
    key.n = n;
    key.threads = P->threads;
    return key;
}

static double ew_cost(void *user, const char *sig, size_t n)
{
    ew_prov *P = user;
    tpk_tune_ew e;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    char canon[TPK_TUNE_EW_SIGLEN];
    if (tpk_tune_ew_parse(sig, &e, &ctx) != TPK_OK)
        return -1;
    tpk_tune_ew_print(&e, canon, sizeof canon);
    tpk_tune_ew_rec key = ew_key(P, canon, n);
    const tpk_tune_ew_rec *b = tpk_tune_ew_cache_best(P->recs, P->nrec, &key, NULL);
    return b ? b->seconds : -1;
}

static tpk_netsor_ew_fn ew_find(void *user, const char *sig, size_t n)
{
    ew_prov *P = user;
    for (int i = 0; i < P->nk; i++)
        if (strcmp(P->k[i].sig, sig) == 0)
            return P->k[i].fn;
    if (P->nk == P->cap) {
        ew_kernel *g = realloc(P->k, (size_t)(P->cap = P->cap ? 2 * P->cap : 16) * sizeof *g);
        if (g == NULL)
            return NULL;
        P->k = g;
    }
    ew_kernel *K = &P->k[P->nk++];
    memset(K, 0, sizeof *K);
    snprintf(K->sig, sizeof K->sig, "%s", sig);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_tune_ew e;
    if (tpk_tune_ew_parse(sig, &e, &ctx) != TPK_OK)
        return NULL;
    char canon[TPK_TUNE_EW_SIGLEN];
    tpk_tune_ew_print(&e, canon, sizeof canon);
    tpk_tune_ew_rec key = ew_key(P, canon, n);
    const tpk_tune_ew_rec *b = tpk_tune_ew_cache_best(P->recs, P->nrec, &key, NULL);
    tpk_tune_ew_cfg cfg;
    tpk_tune_ew_default(&cfg);
    if (b != NULL)
        cfg = b->cfg;
    tpk_tune_ew_report r;
    if (tpk_tune_ew_verify(&e, &cfg, NULL, P->runner, 0, 1, NULL, &r, &ctx) != TPK_OK || !r.exact_ok || !r.real_ok) {
        fprintf(stderr, "netsor plan: emitted kernel %s %s; the executor runs it\n", canon,
                ctx.status ? ctx.msg : "failed verification");
        P->failed++;
        return NULL;
    }
    char src[128], so[128];
    snprintf(src, sizeof src, "%s/k%d.c", P->dir, P->nk);
    snprintf(so, sizeof so, "%s/k%d.so", P->dir, P->nk);
    FILE *f = fopen(src, "w");
    int st = f ? tpk_tune_ew_emit(&e, &cfg, "tpk_kernel", 0, f, &ctx) : TPK_EIO;
    if (f != NULL && fclose(f) != 0)
        st = TPK_EIO;
    if (st == TPK_OK)
        st = tpk_tune_compile_cpu(src, so, NULL, 120, NULL, &ctx);
    K->h = st == TPK_OK ? dlopen(so, RTLD_NOW | RTLD_LOCAL) : NULL;
    K->fn = K->h ? (tpk_netsor_ew_fn)dlsym(K->h, "tpk_kernel") : NULL;
    unlink(src);
    unlink(so); /* loaded: the mapping stays */
    if (K->fn == NULL) {
        fprintf(stderr, "netsor plan: emitted kernel %s did not build; the executor runs it\n", canon);
        P->failed++;
        return NULL;
    }
    if (b == NULL) { /* timed once at this n, then cached */
        key.cfg = cfg;
        key.verified = 1;
        key.ts = (double)time(NULL);
        if (tpk_tune_ew_measure(&e, &cfg, n, P->threads, 3, NULL, P->runner, &key.seconds, &ctx) == TPK_OK &&
            P->cache[0] && tpk_tune_ew_cache_add(P->cache, &key, &ctx) != TPK_OK)
            fprintf(stderr, "netsor plan: %s\n", ctx.msg);
    }
    return K->fn;
}

static int ew_prov_init(ew_prov *P, const char *cache, tpk_ctx *ctx)
{
    memset(P, 0, sizeof *P);
    P->cls = tpk_tune_target_class(TPK_TUNE_CPU);
    P->threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    tpk_tune_ew_cache_path(cache, P->cache, sizeof P->cache);
    /* the checking child: this process runs OpenMP, so it cannot fork one (libgomp); tptune
     * beside netsor, else $TPK_TUNE_RUNNER or $TPK_BIN/tptune */
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    self[len > 0 ? len : 0] = '\0';
    char *slash = strrchr(self, '/');
    if (slash != NULL) {
        *slash = '\0';
        snprintf(P->runner, sizeof P->runner, "%.4000s/tptune", self);
    }
    if (P->runner[0] == '\0' || access(P->runner, X_OK) != 0) {
        const char *env = getenv("TPK_TUNE_RUNNER"), *bin = getenv("TPK_BIN");
        if (env != NULL && *env)
            snprintf(P->runner, sizeof P->runner, "%s", env);
        else if (bin != NULL && *bin)
            snprintf(P->runner, sizeof P->runner, "%s/tptune", bin);
        if (access(P->runner, X_OK) != 0)
            return TPK_ERROR(ctx, TPK_ENOTFOUND, "--emitted needs tptune (beside netsor, or "
                             "$TPK_TUNE_RUNNER, or $TPK_BIN/tptune): its child checks the kernels");
    }
    snprintf(P->dir, sizeof P->dir, "/tmp/tpk-ew-XXXXXX");
    if (mkdtemp(P->dir) == NULL)
        return TPK_ERROR(ctx, TPK_EIO, "cannot make a scratch folder in /tmp");
    return P->cache[0] ? tpk_tune_ew_cache_load(P->cache, &P->recs, &P->nrec, ctx) : TPK_OK;
}

static void ew_prov_free(ew_prov *P)
{
    /* the loaded kernels stay mapped: OpenMP workers may still run their code's frames */
    free(P->k);
    free(P->recs);
    rmdir(P->dir);
}

static const char *plan_name(int k, int base)
{
    return k == 0 && base == TPK_PLAN_NAIVE ? "naive" : "optimal";
}

static int cmd_plan(int argc, char **argv)
{
    cli c;
    int st = parse_cli(argc - 1, argv + 1, &c, "plan");
    if (st) {
        cli_free(&c);
        return st;
    }
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    cli_notes(&ctx, "netsor plan");
    int which = 2; /* 1 naive, 2 optimal, 3 both */
    if (c.plan != NULL) {
        which = strcmp(c.plan, "naive") == 0 ? 1 : strcmp(c.plan, "optimal") == 0 ? 2
                : strcmp(c.plan, "both") == 0  ? 3 : 0;
        if (which == 0) {
            fprintf(stderr, "netsor plan: --plan=%s: expected naive, optimal or both\n", c.plan);
            cli_free(&c);
            return 2;
        }
    }
    size_t N = 256, d = 16;
    if ((c.inputs && cli_parse_size("inputs", c.inputs, 1, (size_t)1 << 20, &N, &ctx)) ||
        (c.dim && cli_parse_size("dim", c.dim, 1, (size_t)1 << 20, &d, &ctx))) {
        fprintf(stderr, "netsor plan: %s\n", ctx.msg);
        cli_free(&c);
        return 2;
    }
    if (c.input != NULL && (c.inputs || c.dim)) {
        fprintf(stderr, "netsor plan: --input and --inputs/--dim exclude each other\n");
        cli_free(&c);
        return 2;
    }
    tpk_phi_registry *reg;
    tpk_program *p = load(&c, &reg);
    if (p == NULL) {
        tpk_phi_registry_free(reg);
        cli_free(&c);
        return 1;
    }
    tpk_array *X = NULL;
    if (c.input != NULL) {
        X = tpk_io_read(c.input, NULL, &ctx);
    } else { /* N inputs N(0, 1), seed 0: (N, T, d) for sequences */
        size_t T = p->nslots > 1 ? (size_t)p->nslots : 1;
        size_t dims[3] = {N, T, d};
        X = T > 1 ? tpk_array_alloc(3, dims, &ctx) : tpk_array_alloc2(N, d, &ctx);
        for (size_t r = 0; X && r < N * T; r++)
            tpk_rng_normal_row(0, 1, (uint32_t)r, 0, (uint32_t)d, X->data + r * d);
    }
    st = X ? TPK_OK : ctx.status;
    ew_prov prov;
    tpk_netsor_ew_provider provider = {ew_find, ew_cost, &prov};
    if (c.emitted && st == TPK_OK)
        st = ew_prov_init(&prov, c.ew_cache, &ctx);
    tpk_array *K[2] = {NULL, NULL};
    double secs[2] = {0, 0};
    for (int k = 0; st == TPK_OK && k < 2; k++) {
        /* with --emitted, the baseline of --plan=both is the optimal plan on the executor alone */
        const int base = c.emitted && which == 3 ? TPK_PLAN_OPTIMAL : TPK_PLAN_NAIVE;
        int plan = (k == 0 ? base : TPK_PLAN_OPTIMAL) | (c.verify ? TPK_PLAN_VERIFY : 0) |
                   (c.signatures ? TPK_PLAN_SIGNATURES : 0) | (c.signatures > 1 ? TPK_PLAN_CANDIDATES : 0);
        if (!(which & (1 << k)))
            continue;
        printf("# %s plan%s\n", plan_name(k, base), c.emitted && k == 1 ? " with emitted kernels" : "");
        double err = 0, t0 = tpk_wall_seconds();
        /* emitted kernels run under the optimal plan: naive stays the executor's baseline */
        st = tpk_netsor_kernel_plan_with(p, X, c.all_outputs, plan, stdout,
                                         c.emitted && k == 1 ? &provider : NULL, &K[k], &err, &ctx);
        secs[k] = tpk_wall_seconds() - t0;
        if (st == TPK_OK)
            printf("kernel %zu x %zu in %.4f s (%s plan, error estimate %.3g)\n", K[k]->dims[0],
                   K[k]->dims[1], secs[k], plan_name(k, base), err);
    }
    if (st == TPK_OK && which == 3) {
        double dmax = 0, kmax = 0;
        for (size_t i = 0; i < tpk_array_size(K[0]); i++) {
            dmax = fmax(dmax, fabs(K[0]->data[i] - K[1]->data[i]));
            kmax = fmax(kmax, fabs(K[0]->data[i]));
        }
        printf("%s: %.3gx faster, max relative difference %.3g\n",
               c.emitted ? "emitted vs executor (whole calls; the emitted one includes verifying and compiling its kernels)"
                         : "optimal vs naive",
               secs[0] / secs[1], kmax > 0 ? dmax / kmax : dmax);
    }
    if (c.emitted && X != NULL)
        ew_prov_free(&prov);
    tpk_array_free(K[0]);
    tpk_array_free(K[1]);
    tpk_array_free(X);
    tpk_program_free(p);
    tpk_phi_registry_free(reg);
    return finish(&c, "plan", st, &ctx);
}

typedef struct command {
    const char *name;
    int (*fn)(int argc, char **argv); /* the whole command line: argv[1] is the command */
} command;

static const command commands[] = {
    {"check", cmd_check},
    {"dump", cmd_dump},
    {"kernel", cmd_kernel},
    {"plan", cmd_plan},
    {"run", cmd_run},
    {"train", cmd_train},
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
