/* gpregress's command line, shared with gpregress-mpi (tools/cli_gpregress.h). */
#include "cli_gpregress.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define DEPTH_MAX 1000
#define COUNT_MAX 1000000000

const char cli_gpregress_options_help[] =
    "Kernel:\n"
    "  --arch=mlp         deep MLP NNGP (tpk_mlp_kernel; see gpkernel --help for the convention)\n"
    "  --arch=rbf         RBF baseline s*exp(-|x-x'|^2/(2 l2)) (not a network)\n"
    "  --arch=NAME        any architecture of gpkernel --list-archs (rnn, gru, lstm, transformer,\n"
    "                     attention, cnn1d, cnn2d, batchnorm, mlp with --layernorm or\n"
    "                     --residual, ...) with its flags (--sigma-u2=V, --filter=K, ...; --depth,\n"
    "                     --phi, --sigma-w2, --sigma-b2 too) and --set NAME=VALUE: the kernel\n"
    "                     gpkernel --arch=NAME computes, on the --train / --test inputs\n"
    "  --program=FILE.nsr any NETSOR program (docs/netsor.md), with --set NAME=VALUE and\n"
    "                     --netsor-plus: its limit kernel, as gpkernel --program computes it\n"
    "  --kernel=FILE.h5   precomputed, as gpkernel --test writes: /kernel (N×N),\n"
    "                     /kernel_test_train (M×N), /kernel_test_diag (M), optional\n"
    "                     /kernel_test_test (M×M, for --full-cov)\n"
    "  --depth=L|A-B      hidden layers, or (mlp alone) a range swept one layer at a time\n"
    "                     (default 3)\n"
    "  --phi=NAME         nonlinearity (default relu)\n"
    "  --sigma-w2=V --sigma-b2=V   weight and bias variances (default 2, 0)\n"
    "  --lengthscale2=V --amplitude=V   RBF parameters (default 1, 1)\n"
    "  --quad-degree=D    Gauss-Hermite degree for phi without closed form (default 64)\n"
    "Data:\n"
    "  --train=SPEC --test=SPEC    inputs: FILE.h5:/ds, FILE.npy (any real dtype: int64\n"
    "                     labels too), FILE.npz:NAME, FILE.csv, or IDX (NAME-ubyte[.gz])\n"
    "  --labels=SPEC --test-labels=SPEC   targets N×C, or class labels (N) with --classify\n"
    "  --n-train=N --n-test=M      use the first N training / M test items (and labels) only;\n"
    "                     without them a label file must have one row per item\n"
    "  --center           subtract the training mean of each feature (train and test)\n"
    "  --unit-norm        scale each item to unit Euclidean norm (after --center)\n"
    "  --classify         one-hot targets from integer labels; report test accuracy\n"
    "Noise and hyperparameters (never chosen by test data):\n"
    "  --noise=V|auto     noise variance; auto (default) maximises the training log marginal\n"
    "                     likelihood over the noise and an output scale s (cov s*(K + r I)) on an\n"
    "                     eigendecomposition of the first --select-n training points;\n"
    "                     0 interpolates: items the kernel cannot tell apart must have equal\n"
    "                     targets, and a singular kernel gets diagonal jitter (with a warning)\n"
    "  --no-scale         with --noise=auto, hold s = 1\n"
    "  --fit-hyper        maximise the LML over kernel parameters and noise (GSL BFGS) on the\n"
    "                     first --select-n training points; with a depth range, every depth\n"
    "                     (--arch=mlp with --depth, --phi, --sigma-w2, --sigma-b2 only, or rbf)\n"
    "  --fix=NAMES        hold these during --fit-hyper (comma list: sigma_w2, sigma_b2,\n"
    "                     lengthscale2, amplitude, noise)\n"
    "  --select-n=N       subsample size for --noise=auto and --fit-hyper (default 2000)\n"
    "Output:\n"
    "  --output=FILE.h5   written atomically: mean (M×C), var (M, latent, scaled by s), and per\n"
    "                     kernel the noise, scale, LML, jitter, rcond, accuracy, NLL; a depth range\n"
    "                     puts each depth under /depth_L and the summary in /depths, /accuracy, ...\n"
    "  --force            replace an existing --output that is not an HDF5 file of this\n"
    "                     toolkit (refused by default: nothing is overwritten without it)\n"
    "  --full-cov         also the full latent predictive covariance /cov (M×M)\n"
    "  --no-var           skip the predictive variance (and the NLL)\n"
    "The NTK and training dynamics (an --arch of the table, a --program, or a --kernel file of\n"
    "gpkernel --kernel=both with /ntk):\n"
    "  --kernel-type=K    nngp (default) or ntk: the posterior's prior covariance (ntk: the\n"
    "                     NTK-GP) and, with --predict=gd, what trains (ntk: every layer; nngp:\n"
    "                     the readout alone)\n"
    "  --parameterization=P --ntk-width=N   the NTK's, as gpkernel's (default ntk)\n"
    "  --predict=gd       also the infinite ensemble trained by gradient descent on MSE from\n"
    "                     zero noise (theory.md section 8.10): /gd_mean (time x test x output),\n"
    "                     /gd_var (time x test, the first --var-n items, at most 4000), /gd_time,\n"
    "                     and with --test-labels /gd_rmse, /gd_accuracy per time\n"
    "  --times=LIST       with --predict=gd: times t >= 0 of the gradient flow e^(-lr t K/N),\n"
    "                     comma separated, inf for converged (e.g. 0,10,100,inf)\n"
    "  --lr=V             its learning rate (default 1)\n"
    "  --steps            --times count discrete gradient-descent steps of size --lr\n"
    "  --momentum=M       with --steps: heavy-ball steps, momentum M in [0, 1) (default 0)\n"
    "  --finite-widths=LIST  with --predict=gd --steps --kernel-type=ntk --program: finite\n"
    "                     networks of these widths (64,128,... or 64..1024) trained alike\n"
    "                     (netsor train), compared with the prediction at each step:\n"
    "                     /finite_net_rel (each network against the kernel dynamics from its own\n"
    "                     start), /finite_mean_rel, /finite_var_rel (the ensemble's), exponents\n"
    "                     with bootstrap CIs; --finite-seeds=S networks per width (default 16),\n"
    "                     --finite-seed=s the first seed (default 0)\n"
    "  --progress, --no-progress   the progress line (below)\n"
    "  --quiet, --help, --version\n"
;

const char cli_gpregress_tail_help[] =
    "Options take their value as --opt=VALUE or --opt VALUE.\n"
    CLI_PROGRESS_HELP
    CLI_EXIT_HELP;

/* "L" or "A-B". */
static int parse_depth(const char *s, tpk_gp_experiment_opts *o, tpk_ctx *ctx)
{
    const char *dash = strchr(s, '-');
    if (!dash) {
        if (cli_parse_int("depth", s, 1, DEPTH_MAX, &o->depth_lo, ctx))
            return ctx->status;
        o->depth_hi = o->depth_lo;
        return TPK_OK;
    }
    char buf[64];
    size_t k = (size_t)(dash - s);
    if (k == 0 || k >= sizeof buf)
        return TPK_ERROR(ctx, TPK_EINVAL, "--depth: '%s' is not L or A-B", s);
    memcpy(buf, s, k);
    buf[k] = '\0';
    if (cli_parse_int("depth", buf, 1, DEPTH_MAX, &o->depth_lo, ctx) ||
        cli_parse_int("depth", dash + 1, 1, DEPTH_MAX, &o->depth_hi, ctx))
        return ctx->status;
    if (o->depth_hi < o->depth_lo)
        return TPK_ERROR(ctx, TPK_EINVAL, "--depth: range '%s' must have 1 <= A <= B <= %d", s,
                         DEPTH_MAX);
    return TPK_OK;
}

enum { O_ARCH = 256, O_KERNEL, O_TRAIN, O_TEST, O_LABELS, O_TLABELS, O_OUTPUT, O_PHI, O_DEPTH,
       O_SW2, O_SB2, O_L2, O_AMP, O_QDEG, O_NOISE, O_NOSCALE, O_FITH, O_FIX, O_SELN, O_NTRAIN,
       O_NTEST, O_NFITS, O_VARN, O_CENTER, O_UNIT, O_CLASSIFY, O_FULLCOV, O_NOVAR, O_QUIET, O_HELP,
       O_VERSION, O_PROGRESS, O_NOPROGRESS, O_FORCE, O_PROGRAM, O_SET, O_PLUS, O_LN,
       O_KTYPE, O_PARAM, O_NTKW, O_PREDICT, O_TIMES, O_LR, O_STEPS, O_MOMENTUM, O_FWIDTHS, O_FSEEDS, O_FSEED };

static const struct option longopts[] = {
    {"arch", required_argument, NULL, O_ARCH}, {"kernel", required_argument, NULL, O_KERNEL},
    {"train", required_argument, NULL, O_TRAIN}, {"test", required_argument, NULL, O_TEST},
    {"labels", required_argument, NULL, O_LABELS},
    {"test-labels", required_argument, NULL, O_TLABELS},
    {"output", required_argument, NULL, O_OUTPUT}, {"phi", required_argument, NULL, O_PHI},
    {"depth", required_argument, NULL, O_DEPTH}, {"sigma-w2", required_argument, NULL, O_SW2},
    {"sigma-b2", required_argument, NULL, O_SB2},
    {"lengthscale2", required_argument, NULL, O_L2},
    {"amplitude", required_argument, NULL, O_AMP},
    {"quad-degree", required_argument, NULL, O_QDEG},
    {"noise", required_argument, NULL, O_NOISE}, {"no-scale", no_argument, NULL, O_NOSCALE},
    {"fit-hyper", no_argument, NULL, O_FITH}, {"fix", required_argument, NULL, O_FIX},
    {"select-n", required_argument, NULL, O_SELN},
    {"noise-fits", required_argument, NULL, O_NFITS},
    {"var-n", required_argument, NULL, O_VARN},
    {"n-train", required_argument, NULL, O_NTRAIN}, {"n-test", required_argument, NULL, O_NTEST},
    {"center", no_argument, NULL, O_CENTER}, {"unit-norm", no_argument, NULL, O_UNIT},
    {"classify", no_argument, NULL, O_CLASSIFY}, {"full-cov", no_argument, NULL, O_FULLCOV},
    {"no-var", no_argument, NULL, O_NOVAR}, {"quiet", no_argument, NULL, O_QUIET},
    {"help", no_argument, NULL, O_HELP}, {"version", no_argument, NULL, O_VERSION},
    {"progress", no_argument, NULL, O_PROGRESS}, {"no-progress", no_argument, NULL, O_NOPROGRESS},
    {"force", no_argument, NULL, O_FORCE},
    {"program", required_argument, NULL, O_PROGRAM}, {"set", required_argument, NULL, O_SET},
    {"netsor-plus", no_argument, NULL, O_PLUS}, {"layernorm", no_argument, NULL, O_LN},
    {"kernel-type", required_argument, NULL, O_KTYPE},
    {"parameterization", required_argument, NULL, O_PARAM},
    {"ntk-width", required_argument, NULL, O_NTKW},
    {"predict", required_argument, NULL, O_PREDICT}, {"times", required_argument, NULL, O_TIMES},
    {"lr", required_argument, NULL, O_LR}, {"steps", no_argument, NULL, O_STEPS},
    {"momentum", required_argument, NULL, O_MOMENTUM},
    {"finite-widths", required_argument, NULL, O_FWIDTHS},
    {"finite-seeds", required_argument, NULL, O_FSEEDS},
    {"finite-seed", required_argument, NULL, O_FSEED}, {NULL, 0, NULL, 0}};

/* --times=LIST: numbers >= 0 and inf, comma separated. */
static int parse_times(const char *s, cli_gpregress *g, tpk_ctx *ctx)
{
    char buf[64];
    size_t n = 0;
    for (const char *p = s;;) {
        const char *comma = strchr(p, ',');
        size_t k = comma ? (size_t)(comma - p) : strlen(p);
        if (k == 0 || k >= sizeof buf)
            return TPK_ERROR(ctx, TPK_EINVAL, "--times: '%s' is not a comma list of times", s);
        if (n == CLI_GD_TIMES)
            return TPK_ERROR(ctx, TPK_EINVAL, "--times: more than %d times", CLI_GD_TIMES);
        memcpy(buf, p, k);
        buf[k] = '\0';
        if (strcmp(buf, "inf") == 0 || strcmp(buf, "infinity") == 0)
            g->times[n] = INFINITY;
        else if (cli_parse_double("times", buf, &g->times[n], ctx))
            return ctx->status;
        if (!(g->times[n] >= 0))
            return TPK_ERROR(ctx, TPK_EINVAL, "--times: %s is negative", buf);
        n++;
        if (!comma)
            break;
        p = comma + 1;
    }
    g->o.times = g->times;
    g->o.ntimes = n;
    return TPK_OK;
}

/* One of gpregress's options (not --help, --version). */
static int take_option(int c, tpk_gp_experiment_opts *o, cli_gpregress *g, char **argv,
                       tpk_ctx *ctx)
{
    switch (c) {
    case O_ARCH: o->kernel = optarg; return TPK_OK;
    case O_KERNEL: o->kernel_file = optarg; return TPK_OK;
    case O_TRAIN: o->train = optarg; return TPK_OK;
    case O_TEST: o->test = optarg; return TPK_OK;
    case O_LABELS: o->labels = optarg; return TPK_OK;
    case O_TLABELS: o->test_labels = optarg; return TPK_OK;
    case O_OUTPUT: o->output = optarg; return TPK_OK;
    case O_PHI: o->phi = optarg; return TPK_OK;
    case O_DEPTH: return parse_depth(optarg, o, ctx);
    case O_SW2: return cli_parse_double("sigma-w2", optarg, &o->sigma_w2, ctx);
    case O_SB2: return cli_parse_double("sigma-b2", optarg, &o->sigma_b2, ctx);
    case O_L2: return cli_parse_double("lengthscale2", optarg, &o->lengthscale2, ctx);
    case O_AMP: return cli_parse_double("amplitude", optarg, &o->amplitude, ctx);
    case O_QDEG: return cli_parse_int("quad-degree", optarg, 4, 512, &o->quad_degree, ctx);
    case O_NOISE:
        o->noise_auto = strcmp(optarg, "auto") == 0;
        return o->noise_auto ? TPK_OK : cli_parse_double("noise", optarg, &o->noise, ctx);
    case O_NOSCALE: o->fit_scale = 0; return TPK_OK;
    case O_FITH: o->fit_hyper = 1; return TPK_OK;
    case O_FIX: o->fix = optarg; return TPK_OK;
    case O_SELN: return cli_parse_size("select-n", optarg, 2, COUNT_MAX, &o->select_n, ctx);
    case O_NFITS: return cli_parse_int("noise-fits", optarg, 0, COUNT_MAX, &o->noise_fits, ctx);
    case O_VARN: return cli_parse_size("var-n", optarg, 1, COUNT_MAX, &o->var_n, ctx);
    case O_NTRAIN: return cli_parse_size("n-train", optarg, 1, COUNT_MAX, &o->n_train, ctx);
    case O_NTEST: return cli_parse_size("n-test", optarg, 1, COUNT_MAX, &o->n_test, ctx);
    case O_CENTER: o->center = 1; return TPK_OK;
    case O_UNIT: o->unit_norm = 1; return TPK_OK;
    case O_CLASSIFY: o->classify = 1; return TPK_OK;
    case O_FULLCOV: o->full_cov = 1; return TPK_OK;
    case O_NOVAR: o->no_var = 1; return TPK_OK;
    case O_FORCE: o->force = 1; return TPK_OK;
    case O_PROGRAM: o->program = optarg; return TPK_OK;
    case O_SET: return cli_sets_add(&g->sets, optarg, ctx);
    case O_PLUS: o->netsor_plus = 1; return TPK_OK;
    case O_LN: o->layernorm = 1; return TPK_OK;
    case O_KTYPE: {
        static const char *const names[] = {"nngp", "ntk", NULL}; /* TPK_GP_KERNEL_* */
        return cli_parse_choice("kernel-type", optarg, names, &o->kernel_type, ctx);
    }
    case O_PARAM: return cli_parse_ntk_param(optarg, &o->ntk_param, ctx);
    case O_NTKW: return cli_parse_size("ntk-width", optarg, 1, (size_t)1 << 32, &o->ntk_width, ctx);
    case O_PREDICT: {
        static const char *const names[] = {"posterior", "gd", NULL};
        return cli_parse_choice("predict", optarg, names, &o->predict_gd, ctx);
    }
    case O_TIMES: return parse_times(optarg, g, ctx);
    case O_LR:
        if (cli_parse_double("lr", optarg, &o->lr, ctx))
            return ctx->status;
        return o->lr > 0 ? TPK_OK : TPK_ERROR(ctx, TPK_EINVAL, "--lr: %s is not > 0", optarg);
    case O_STEPS: o->gd_steps = 1; return TPK_OK;
    case O_FWIDTHS:
        o->finite_widths = g->fwidths;
        return cli_parse_sizes("finite-widths", optarg, 1, (size_t)1 << 24, g->fwidths, 32,
                               &o->nfinite_widths, ctx);
    case O_FSEEDS: return cli_parse_size("finite-seeds", optarg, 2, 1u << 20, &o->finite_seeds, ctx);
    case O_FSEED: {
        size_t s;
        int st = cli_parse_size("finite-seed", optarg, 0, SIZE_MAX / 2, &s, ctx);
        o->finite_seed = s;
        return st;
    }
    case O_MOMENTUM:
        if (cli_parse_double("momentum", optarg, &o->momentum, ctx))
            return ctx->status;
        return o->momentum >= 0 && o->momentum < 1
                   ? TPK_OK
                   : TPK_ERROR(ctx, TPK_EINVAL, "--momentum: %s is not in [0, 1)", optarg);
    case O_QUIET: g->quiet = 1; return TPK_OK;
    case O_PROGRESS: g->progress = 1; return TPK_OK;
    case O_NOPROGRESS: g->progress = 0; return TPK_OK;
    default: return cli_bad_option(argv, ctx);
    }
}

/* Options the others make meaningless are refused, not ignored (issue 18: --sigma-w2 with
 * --arch=rbf, --depth with --kernel, --fix without --fit-hyper ran as if never given). */
static int refuse_unused(const cli_seen *seen, const tpk_gp_experiment_opts *o, tpk_ctx *ctx)
{
    static const char *const mlp_only[] = {"depth", "phi", "sigma-w2", "sigma-b2", "quad-degree"};
    static const char *const rbf_only[] = {"lengthscale2", "amplitude"};
    const int rbf = o->kernel && strcmp(o->kernel, "rbf") == 0;
    const int mlp = o->kernel && strcmp(o->kernel, "mlp") == 0;
    const int table = tpk_gp_experiment_table_kernel(o);
    int st = TPK_OK;
    /* an architecture of the table takes depth, phi and the variances as its flags (where its
     * row has them: table_flags); the quadrature degree is gpregress' own mlp's */
    for (size_t i = 0; !st && i < sizeof mlp_only / sizeof mlp_only[0]; i++)
        st = !mlp && !(table && o->kernel && i < 4)
                 ? cli_refuse(seen, mlp_only[i], rbf ? "it is a parameter of --arch=mlp, not of "
                              "the RBF kernel" : o->program ? "a program's parameters are given "
                              "by --set NAME=VALUE" : "--kernel gives the kernel itself", ctx)
             : mlp && table && i == 4
                 ? cli_refuse(seen, mlp_only[i], "it is gpregress' own mlp recursion's, and "
                              "architecture flags or --set give the architecture's program", ctx)
                 : 0;
    for (size_t i = 0; !st && i < sizeof rbf_only / sizeof rbf_only[0]; i++)
        st = !rbf ? cli_refuse(seen, rbf_only[i], o->kernel || o->program ? "it is a parameter "
                               "of --arch=rbf, not of this kernel" : "--kernel gives the kernel "
                               "itself", ctx) : 0;
    if (!st && !o->fit_hyper)
        st = cli_refuse(seen, "fix", "it holds parameters of --fit-hyper, which is not given", ctx);
    if (!st && !o->noise_auto && !o->fit_hyper)
        st = cli_refuse(seen, "select-n", "it sizes the subsample of --noise=auto and "
                        "--fit-hyper, and neither is used", ctx);
    if (!st && !o->noise_auto)
        st = cli_refuse(seen, "no-scale", "it goes with --noise=auto (a given noise has no "
                        "output scale to choose)", ctx);
    if (!st && o->kernel_type != TPK_GP_KERNEL_NTK && !o->predict_gd)
        st = cli_refuse(seen, "parameterization", "it is the NTK's, and neither "
                        "--kernel-type=ntk nor --predict=gd asks for it", ctx);
    if (!st && o->ntk_param != TPK_NTK_PARAM_STANDARD)
        st = cli_refuse(seen, "ntk-width", "it is the width of --parameterization=standard",
                        ctx);
    return st;
}

/* An architecture of the table (issue 39, item 10): gpregress' own --depth, --phi, --sigma-w2,
 * --sigma-b2 become its flags (as gpkernel's), and every flag is resolved against its row. */
static int table_flags(const cli_seen *seen, cli_gpregress *g, tpk_ctx *ctx)
{
    tpk_gp_experiment_opts *o = &g->o;
    static const char *const own_flags[] = {"depth", "phi", "sigma-w2", "sigma-b2"};
    for (size_t i = 0; o->kernel && i < sizeof own_flags / sizeof own_flags[0]; i++) {
        const char *v = NULL;
        for (int j = 0; j < CLI_MAX_OPTIONS && seen->opts[j].name; j++)
            if (strcmp(seen->opts[j].name, own_flags[i]) == 0 && seen->given[j])
                v = seen->value[j];
        if (!v)
            continue;
        if (g->flags.n == CLI_MAX_FLAGS)
            return TPK_ERROR(ctx, TPK_EINVAL, "more than %d architecture flags", CLI_MAX_FLAGS);
        snprintf(g->flags.flag[g->flags.n], sizeof g->flags.flag[0], "%s", own_flags[i]);
        g->flags.fl[g->flags.n] = (tpk_arch_flag){.flag = g->flags.flag[g->flags.n], .value = v};
        g->flags.n++;
    }
    const tpk_arch *a = o->kernel ? cli_arch(o->kernel, ctx) : NULL;
    if (o->kernel && !a)
        return ctx->status;
    tpk_phi_registry *reg = tpk_job_registry(ctx);
    if (!reg)
        return ctx->status;
    int st = cli_arch_flags_resolve(&g->flags, a, reg, ctx);
    tpk_phi_registry_free(reg);
    if (!st && a && o->layernorm && strcmp(a->name, "mlp") != 0)
        st = TPK_ERROR(ctx, TPK_EINVAL, "--layernorm is an option of --arch=mlp");
    o->arch_flags = g->flags.fl;
    o->narch_flags = g->flags.n;
    return st;
}

int cli_gpregress_parse(int argc, char **argv, const char *tool, const char *const help[2],
                        const struct option *own, cli_gpregress_own_fn fn, void *user,
                        cli_gpregress *g, tpk_ctx *ctx)
{
    memset(g, 0, sizeof *g);
    g->progress = -1;
    tpk_gp_experiment_opts *o = &g->o;
    tpk_gp_experiment_opts_default(o);
    struct option *opts = cli_options_join(longopts, own, ctx);
    if (!opts)
        return ctx->status;
    int c, st = TPK_OK, nrest = 0;
    /* an architecture's own flags (--sigma-u2=V, --filter=K, ...) are not getopt's: out first */
    char **rest = cli_arch_flags_take(argc, argv, opts, &g->flags, &nrest, ctx);
    if (!rest) {
        free(opts);
        return ctx->status;
    }
    char **argv_all = argv;
    const int argc_all = argc;
    argc = nrest;
    argv = rest;
    opterr = 0;
    optind = 1;
    cli_seen seen; /* a repeated option is a usage error (issue 18) */
    cli_seen_init(&seen, opts);
    while (st == TPK_OK && (c = cli_getopt(argc, argv, opts, &seen, &st, ctx)) != -1) {
        if (c == 'h' || c == O_HELP) {
            fputs(help[0], stdout);
            fputs(cli_gpregress_options_help, stdout);
            fputs(help[1], stdout);
            fputs(cli_gpregress_tail_help, stdout);
            st = CLI_GPREGRESS_DONE;
        } else if (c == O_VERSION) {
            cli_version(tool);
            st = CLI_GPREGRESS_DONE;
        } else if (c >= CLI_GPREGRESS_OWN && fn) {
            st = fn(c, optarg, user, ctx);
        } else {
            st = take_option(c, o, g, argv, ctx);
        }
    }
    if (st == TPK_OK)
        st = cli_no_operands(argc, argv, ctx);
    o->sets = g->sets.set;
    o->nsets = g->sets.n;
    o->narch_flags = g->flags.n; /* resolved below: counted now for the checks */
    if (st == TPK_OK)
        st = tpk_gp_experiment_check(o, ctx); /* options together: still the command line */
    if (st == TPK_OK)
        st = refuse_unused(&seen, o, ctx);
    /* gpregress' own --arch=mlp keeps its numeric settings (the table path reads them) */
    if (st == TPK_OK && tpk_gp_experiment_table_kernel(o) && !tpk_gp_experiment_own_mlp(o))
        st = table_flags(&seen, g, ctx);
    else if (st == TPK_OK && g->flags.n > 0)
        st = TPK_ERROR(ctx, TPK_EINVAL, "unknown option '--%s' (see --help)", g->flags.fl[0].flag);
    free(opts); /* seen points into it */
    free(rest);
    argv = argv_all;
    argc = argc_all;
    if (st != TPK_OK)
        return st;
    int nrec = 0;
    if (!(g->rec = cli_record_argv(argc, argv, &nrec))) /* without the display options */
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    o->argc = nrec;
    o->argv = g->rec;
    o->name = tool;
    return TPK_OK;
}

void cli_gpregress_free(cli_gpregress *g)
{
    free(g->rec);
    g->rec = NULL;
    cli_sets_free(&g->sets);
}
