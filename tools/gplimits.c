/* gplimits: how fast finite-width networks approach their infinite-width limit. Options in, a
 * study out (include/tpk/study.h, limits/): a NETSOR program at a ladder of widths × seeds
 * through the finite-width executor against its limit kernel, every raw per-seed result plus
 * fitted rates with bootstrap intervals in HDF5 (theory.md §7), checkpointed so that an
 * interrupted run resumes without losing finished seeds. */
#include "cli.h"

#include "tpk/job.h"
#include "tpk/study.h"
#include "tpk/tpk.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_WIDTHS 32
#define DEFAULT_WIDTHS "32..2048"

/* The signal (SIGINT, SIGTERM, SIGHUP) that stopped the runs: the study stops taking new seeds,
 * checkpoints, and gplimits exits 128 + it. Once the runs are done (the analysis and the write)
 * there is nothing to checkpoint: the output's temp file goes, a message says where the runs
 * are, and the exit is immediate (issue 18: a signal then was ignored and the run ended with 0).
 * Signal state is the one piece of process state a program cannot pass around. */
static volatile sig_atomic_t interrupted, analysing;
static char analysis_msg[3][600]; /* what the handler writes in the analysis, per signal */

static int sig_slot(int sig) { return sig == SIGINT ? 0 : sig == SIGTERM ? 1 : 2; }

static void on_signal(int sig)
{
    if (!analysing) {
        interrupted = sig;
        return;
    }
    tpk_h5out_remove_temps();
    const char *m = analysis_msg[sig_slot(sig)];
    ssize_t w = write(2, m, strlen(m));
    (void)w;
    _exit(128 + sig);
}

static const char *sig_what(int sig)
{
    return sig == SIGINT ? "interrupted (SIGINT)" : sig == SIGTERM ? "terminated (SIGTERM)"
                                                                   : "hangup (SIGHUP)";
}

typedef struct opts {
    const char *arch_name;
    tpk_study_opts study;
    cli_arch_flags flags;
    cli_sets sets;
    size_t widths[MAX_WIDTHS];
    int quiet, progress; /* progress: -1 auto (isatty), 0 off, 1 on */
} opts;

static const char usage[] =
    "Usage: gplimits (--arch=NAME [--FLAG=VALUE]... | --program=FILE.nsr) [--set k=v]...\n"
    "                --output=FILE.h5 [options]\n"
    "Finite-width convergence to the infinite-width limit (theory.md §7): runs the program at\n"
    "each width for S seeds and reports kernel errors, bias, fluctuation, output-law distances\n"
    "and their fitted exponents with bootstrap-over-seeds 95% intervals.\n"
    "\n"
    "Program:\n"
    "  --arch=NAME        a shipped architecture, with the flags and defaults of gpkernel\n"
    "                     (gpkernel --list-archs): mlp (--depth, --phi, --sigma-w2, --sigma-b2,\n"
    "                     --residual=A, --layernorm [--ln-eps]), batchnorm, rnn, rnn-untied,\n"
    "                     transformer, attention (1/n logits only: --logit-scaling=inv-n is\n"
    "                     implied; the 1/sqrt(n) limit is gpattention's), cnn1d, cnn2d\n"
    "                     (--padding, --filter; outputs are the per-position readouts)\n"
    "  --program=FILE     any NETSOR program\n"
    "  --set NAME=VALUE   override a program parameter (repeatable; after the arch flags)\n"
    "  --all-outputs      compare the whole output kernel: every readout of the program (all\n"
    "                     time steps, tokens or positions), input-major, (N*O)x(N*O); default:\n"
    "                     the last output only (NxN), as tpk_netsor_kernel/run with all_outputs=0\n"
    "Run:\n"
    "  --input=SPEC       FILE.h5:/dataset, FILE.npy (any real dtype or order), FILE.npz:NAME\n"
    "                     or FILE.csv (default: the architecture's bundled demo input; with\n"
    "                     --program: data/demo-inputs.csv). Sequences\n"
    "                     N×T×d set a program parameter T, images N×rows×cols×C set rows, cols\n"
    "  --max-inputs=K     use K evenly spaced inputs of SPEC (default 8; 0 = all); the\n"
    "                     summary's first line says how many of how many\n"
    "  --widths=LIST      32,64,128 or 32..2048 (geometric, x2) (default 32..2048)\n"
    "  --seeds=S          networks per width (default 64); seed of network s is BASE + s,\n"
    "  --seed=BASE        shared by all widths (nested widths, theory.md §7.3) (default 1)\n"
    "  --output=FILE.h5   results (written atomically at the end; required)\n"
    "  --resume           continue from FILE.h5.partial.h5 (the checkpoint of a killed run)\n"
    "Statistics:\n"
    "  --boot=B           bootstrap replicates (default 1000; sliced fits use B/5)\n"
    "  --w1-input=I       output coordinate (index within the used inputs, times the outputs\n"
    "                     with --all-outputs) for the 1-D law distance (0)\n"
    "  --slices=L         directions for sliced distances (default 8)\n"
    "  --fit-min-width=N  fit exponents over widths >= N; 0 = all; auto (default): the smallest\n"
    "                     width n_min at which the two-term fit c1 n^-1/2 + c2 n^-1 of the RMS\n"
    "                     error over all widths has |c2|/(c1 sqrt(n_min)) <= --fit-ratio, keeping\n"
    "                     at least 3 widths (capped, with a warning). The RMS exponent for every\n"
    "                     n_min is in /fits/rms_stability. With --resume on a finished FILE.h5\n"
    "                     the statistics are recomputed from its raw data without rerunning.\n"
    "  --fit-ratio=R      the auto rule's bound on the n^-1 / n^-1/2 term ratio (default 0.1)\n"
    "  --kernel=K         nngp (default): K-hat of netsor run against the limit kernel; ntk:\n"
    "                     the empirical NTK of the same networks (netsor run --ntk) against the\n"
    "                     limit NTK (the output samples' law statistics are then NaN)\n"
    "  --parameterization=P  the NTK's: ntk (default) or tp (docs/theory.md section 8.7)\n"
    "Output:\n"
    "  --force            replace an existing --output that is not an HDF5 file of this\n"
    "                     toolkit (refused by default: nothing is overwritten without it)\n"
    "  --progress, --no-progress   the progress line (below)\n"
    "  --quiet            no summary on stdout, no progress line\n"
    "  --help, --version\n"
    "\n"
    "Widths and seeds run in parallel (one OpenMP loop over all (width, seed) pairs, widest\n"
    "first): peak memory is that of one network at the largest width per thread.\n"
    "Reproducing one network: tpk_netsor_run(program, inputs, width, BASE + s, all_outputs)\n"
    "gives the kernel stored at /per_seed/khat[w][s]. Exit status 130, 143, 129: SIGINT,\n"
    "SIGTERM, SIGHUP (the runs so far checkpointed; during the analysis, nothing written).\n"
    "Options take their value as --opt=VALUE or --opt VALUE (architecture flags too).\n"
    CLI_PROGRESS_HELP
    CLI_EXIT_HELP;

enum { OPT_ARCH = 256, OPT_PROGRAM, OPT_SET, OPT_INPUT, OPT_MAXIN, OPT_OUTPUT, OPT_WIDTHS,
       OPT_SEEDS, OPT_SEED, OPT_RESUME, OPT_BOOT, OPT_W1IN, OPT_SLICES, OPT_FITMIN, OPT_FITRATIO,
       OPT_ALLOUT, OPT_LN, OPT_PROGRESS, OPT_NOPROGRESS, OPT_QUIET, OPT_HELP, OPT_VERSION, OPT_FORCE,
       OPT_KERNEL, OPT_PARAM };

static const struct option longopts[] = {
    {"arch", required_argument, NULL, OPT_ARCH},
    {"program", required_argument, NULL, OPT_PROGRAM},
    {"set", required_argument, NULL, OPT_SET},
    {"input", required_argument, NULL, OPT_INPUT},
    {"max-inputs", required_argument, NULL, OPT_MAXIN},
    {"output", required_argument, NULL, OPT_OUTPUT},
    {"widths", required_argument, NULL, OPT_WIDTHS},
    {"seeds", required_argument, NULL, OPT_SEEDS},
    {"seed", required_argument, NULL, OPT_SEED},
    {"resume", no_argument, NULL, OPT_RESUME},
    {"boot", required_argument, NULL, OPT_BOOT},
    {"w1-input", required_argument, NULL, OPT_W1IN},
    {"slices", required_argument, NULL, OPT_SLICES},
    {"fit-min-width", required_argument, NULL, OPT_FITMIN},
    {"fit-ratio", required_argument, NULL, OPT_FITRATIO},
    {"all-outputs", no_argument, NULL, OPT_ALLOUT},
    {"layernorm", no_argument, NULL, OPT_LN},
    {"progress", no_argument, NULL, OPT_PROGRESS},
    {"no-progress", no_argument, NULL, OPT_NOPROGRESS},
    {"quiet", no_argument, NULL, OPT_QUIET},
    {"force", no_argument, NULL, OPT_FORCE},
    {"kernel", required_argument, NULL, OPT_KERNEL},
    {"parameterization", required_argument, NULL, OPT_PARAM},
    {"help", no_argument, NULL, OPT_HELP},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0}};

/* "32,64,128" or "32..2048" (doubling), increasing, at least 2. */
static int parse_widths(const char *s, opts *o, tpk_ctx *ctx)
{
    size_t n = 0;
    if (cli_parse_sizes("widths", s, 1, 1u << 24, o->widths, MAX_WIDTHS, &n, ctx))
        return TPK_EINVAL;
    for (size_t i = 1; i < n; i++)
        if (o->widths[i] <= o->widths[i - 1])
            return TPK_ERROR(ctx, TPK_EINVAL, "--widths: must increase ('%s')", s);
    if (n < 2)
        return TPK_ERROR(ctx, TPK_EINVAL, "--widths: need at least 2 widths to fit a rate");
    o->study.widths = o->widths;
    o->study.nwidths = n;
    return TPK_OK;
}

/* One option of gplimits' own; -1: done (help, version). */
static int take_option(int c, opts *o, char **argv, tpk_ctx *ctx)
{
    tpk_study_opts *so = &o->study;
    tpk_study_stats *ss = &so->stats;
    size_t v = 0;
    int st = TPK_OK;
    switch (c) {
    case OPT_ARCH: o->arch_name = optarg; break;
    case OPT_PROGRAM: so->program = optarg; break;
    case OPT_SET: st = cli_sets_add(&o->sets, optarg, ctx); break;
    case OPT_INPUT: so->input = optarg; break;
    case OPT_MAXIN: st = cli_parse_size("max-inputs", optarg, 0, 1u << 20, &so->max_inputs, ctx); break;
    case OPT_OUTPUT: so->output = optarg; break;
    case OPT_WIDTHS: st = parse_widths(optarg, o, ctx); break;
    case OPT_SEEDS: st = cli_parse_size("seeds", optarg, 4, 1u << 20, &so->seeds, ctx); break;
    case OPT_SEED:
        st = cli_parse_size("seed", optarg, 0, SIZE_MAX, &v, ctx);
        so->seed = ss->seed = (uint64_t)v;
        break;
    case OPT_RESUME: so->resume = 1; break;
    case OPT_BOOT: st = cli_parse_size("boot", optarg, 50, 1000000, &ss->boot, ctx); break;
    case OPT_W1IN: st = cli_parse_size("w1-input", optarg, 0, 1u << 20, &ss->w1_input, ctx); break;
    case OPT_SLICES: st = cli_parse_size("slices", optarg, 1, 10000, &ss->slices, ctx); break;
    case OPT_FITMIN:
        if (strcmp(optarg, "auto") == 0)
            ss->fit_min_width = TPK_STUDY_FIT_AUTO;
        else
            st = cli_parse_size("fit-min-width", optarg, 0, 1u << 24, &ss->fit_min_width, ctx);
        break;
    case OPT_FITRATIO:
        st = cli_parse_double("fit-ratio", optarg, &ss->fit_ratio, ctx);
        if (st == TPK_OK && !(ss->fit_ratio > 0))
            st = TPK_ERROR(ctx, TPK_EINVAL, "--fit-ratio must be > 0 (got %s)", optarg);
        break;
    case OPT_ALLOUT: so->all_outputs = 1; break;
    case OPT_LN: so->layernorm = 1; break;
    case OPT_PROGRESS: o->progress = 1; break;
    case OPT_NOPROGRESS: o->progress = 0; break;
    case OPT_QUIET: o->quiet = 1; break;
    case OPT_FORCE: so->force = 1; break;
    case OPT_KERNEL:
        st = cli_parse_kernel_kind(optarg, &so->kernel, ctx);
        if (st == TPK_OK && so->kernel == TPK_JOB_BOTH)
            st = TPK_ERROR(ctx, TPK_EINVAL, "--kernel: a study compares one kernel: nngp or ntk");
        break;
    case OPT_PARAM: st = cli_parse_ntk_param(optarg, &so->ntk_param, ctx); break;
    case 'h':
    case OPT_HELP: fputs(usage, stdout); return -1;
    case OPT_VERSION: cli_version("gplimits"); return -1;
    default: return cli_bad_option(argv, ctx);
    }
    return st;
}

/* gplimits' own options by getopt, the architecture flags taken out first and resolved once
 * --arch is known. Returns 0 to go on, -1 to exit successfully (help, version), or a status. */
static int parse_args(int argc, char **argv, const tpk_phi_registry *reg, opts *o, tpk_ctx *ctx)
{
    int nrest = 0, c, st = TPK_OK;
    char **rest = cli_arch_flags_take(argc, argv, longopts, &o->flags, &nrest, ctx);
    if (!rest)
        return ctx->status;
    opterr = 0;
    cli_seen seen;
    cli_seen_init(&seen, longopts);
    while (st == TPK_OK && (c = cli_getopt(nrest, rest, longopts, &seen, &st, ctx)) != -1)
        st = take_option(c, o, rest, ctx);
    if (st == TPK_OK)
        st = cli_no_operands(nrest, rest, ctx);
    free(rest);
    if (st)
        return st;
    if (!o->arch_name == !o->study.program)
        return TPK_ERROR(ctx, TPK_EINVAL, "give exactly one of --arch and --program (see --help)");
    if (o->arch_name && !(o->study.arch = cli_arch(o->arch_name, ctx)))
        return ctx->status;
    if ((st = cli_arch_flags_resolve(&o->flags, o->study.arch, reg, ctx)))
        return st;
    if (o->study.layernorm && !o->study.arch)
        return TPK_ERROR(ctx, TPK_EINVAL, "--layernorm goes with --arch=mlp");
    if (!o->study.output)
        return TPK_ERROR(ctx, TPK_EINVAL, "--output=FILE.h5 is required");
    if (!o->study.widths)
        st = parse_widths(DEFAULT_WIDTHS, o, ctx);
    o->study.flags = o->flags.fl;
    o->study.nflags = o->flags.n;
    o->study.sets = o->sets.set;
    o->study.nsets = o->sets.n;
    return st;
}

/* The study's reports as the progress line: (width, seed) runs done of all, widths finished. */
static void progress_draw(const tpk_study_progress *p, void *user)
{
    cli_progress *bar = user;
    if (bar->unit == NULL || strcmp(bar->unit, "(width, seed) runs") != 0) { /* a new stage */
        cli_progress_end(bar, 1); /* the limit kernel's line, if one is open */
        cli_progress_start(bar, "gplimits", NULL, p->runs, bar->on);
        bar->unit = "(width, seed) runs";
        bar->done0 = p->done - p->ran; /* a resumed study: the rate of this run's seeds */
        bar->t0 -= p->elapsed;
        bar->tstage = bar->t0;
    }
    snprintf(bar->note, sizeof bar->note, "widths %zu/%zu", p->widths_done, p->widths);
    cli_progress_update(bar, p->done);
}

/* The study: prepare, run (until done or interrupted), write. Returns the exit status. */
static int study(opts *o, int argc, char **argv, const tpk_phi_registry *reg, tpk_ctx *ctx)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigfillset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    cli_progress bar;
    cli_progress_start(&bar, "gplimits", "limit kernel", 0, !o->quiet && cli_progress_wanted(o->progress));
    o->study.progress = cli_progress_lib(&bar, &interrupted);
    tpk_study *s = tpk_study_alloc(&o->study, reg, ctx);
    if (!s) {
        cli_progress_end(&bar, 0);
        if (ctx->status == TPK_ECANCELED) {
            fprintf(stderr, "gplimits: %s while computing the limit kernel\n",
                    sig_what(interrupted));
            return 128 + interrupted;
        }
        return cli_report("gplimits", ctx->status, ctx);
    }
    const tpk_study_info *in = tpk_study_get_info(s);
    if (!o->quiet && in->source == TPK_STUDY_FROM_OUTPUT)
        fprintf(stderr, "gplimits: reusing the raw data of %s\n", o->study.output);
    else if (!o->quiet && in->source == TPK_STUDY_NO_CHECKPOINT)
        fprintf(stderr, "gplimits: no checkpoint %s, starting from scratch\n", in->checkpoint);
    tpk_study_run_opts ro = {.stop = &interrupted, .progress = bar.on ? progress_draw : NULL,
                             .user = &bar};
    int rc = 0, analysed = 0, st = tpk_study_run(s, &ro, ctx);
    cli_progress_end(&bar, st == TPK_OK && !interrupted);
    if (st == TPK_OK && interrupted) {
        fprintf(stderr, "gplimits: %s; %zu of %zu (width, seed) runs saved in %s; "
                "rerun with --resume\n", sig_what(interrupted), in->done, in->runs,
                in->checkpoint);
        rc = 128 + interrupted;
    } else if (st == TPK_OK) {
        const int sigs[3] = {SIGINT, SIGTERM, SIGHUP};
        for (int i = 0; i < 3; i++)
            snprintf(analysis_msg[i], sizeof analysis_msg[i], "gplimits: %s during the analysis: "
                     "nothing written to %s%s%s%s\n", sig_what(sigs[i]), o->study.output,
                     access(in->checkpoint, F_OK) == 0 ? "; every run is saved in " : "",
                     access(in->checkpoint, F_OK) == 0 ? in->checkpoint : "",
                     access(in->checkpoint, F_OK) == 0 ? ": rerun with --resume" : "");
        analysing = 1;
        /* --resume is left out of the recorded command: a resumed run writes the same file;
         * and so are the display options (cli_record_argv). */
        int n = 0, pc = 0;
        char **pv = cli_record_argv(argc, argv, &n);
        for (int i = 0; pv && i < n; i++)
            if (strcmp(pv[i], "--resume") != 0)
                pv[pc++] = pv[i];
        st = pv ? tpk_study_write(s, pc, pv, o->quiet ? NULL : stdout, ctx)
                : TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        free(pv);
        analysed = 1;
    }
    if (st)
        rc = cli_report("gplimits", st, ctx);
    /* A failure after the runs: the checkpoint stays only where a rerun can succeed (the file
     * could not be written: a full disk); any other cause would fail the same way again, and a
     * checkpoint left behind made the next run refuse to start (issue 18). */
    if (st && analysed && access(in->checkpoint, F_OK) == 0) {
        if (ctx->status == TPK_EIO)
            fprintf(stderr, "gplimits: every run is saved in %s: rerun with --resume once the "
                    "output can be written\n", in->checkpoint);
        else
            remove(in->checkpoint);
    }
    tpk_study_free(s);
    return rc;
}

int main(int argc, char **argv)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    cli_notes(&ctx, "gplimits");
    opts o;
    memset(&o, 0, sizeof o);
    o.study.seeds = 64;
    o.study.seed = 1;
    o.study.max_inputs = 8;
    o.progress = -1;
    tpk_study_stats_default(&o.study.stats);
    tpk_phi_registry *reg = tpk_job_registry(&ctx); /* built-ins plus sqrt (LN, attention) */
    int st = reg ? parse_args(argc, argv, reg, &o, &ctx) : ctx.status;
    int rc = st == -1 ? 0
             : st      ? (reg ? cli_report_usage("gplimits", st, &ctx) : cli_report("gplimits", st, &ctx))
                       : study(&o, argc, argv, reg, &ctx);
    cli_sets_free(&o.sets);
    tpk_phi_registry_free(reg);
    return rc;
}
