/* gpkernel: infinite-width GP kernels of whole architectures (shipped NETSOR programs) or of any
 * NETSOR program, written to self-describing HDF5. */
#include "cli.h"

#include "tpk/archs.h"
#include "tpk/job.h"
#include "tpk/tpk.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SETS TPK_ARCH_MAX_SETS

static const char usage[] =
    "Usage: gpkernel --arch=NAME [options] --output=FILE.h5\n"
    "       gpkernel --program=FILE.nsr [--set NAME=VALUE]... [options] --output=FILE.h5\n"
    "Infinite-width (NNGP) kernel of an architecture or NETSOR program, written to HDF5.\n"
    "\n"
    "Options:\n"
    "  --arch=NAME        a shipped architecture (--list-archs): mlp, rnn, rnn-untied,\n"
    "                     gru, lstm, transformer, attention, cnn1d, cnn2d, ...\n"
    "  --program=FILE     any NETSOR program (docs/netsor.md); with --set NAME=VALUE overrides\n"
    "  --input=SPEC       inputs: FILE.h5:/dataset, FILE.npy (any real dtype or order),\n"
    "                     FILE.npz:NAME or FILE.csv; N×d, or N×T×d for recurrent programs\n"
    "                     (default: the architecture's bundled demo input)\n"
    "  --test=SPEC        test inputs: also /kernel_test_train (M×N) and /kernel_test_diag (M)\n"
    "  --output=FILE.h5   output file (written atomically; required)\n"
    "  --depth=L          (mlp) hidden layers, L >= 1 (default 3)\n"
    "  --phi=NAME         nonlinearity: relu, erf, tanh, gelu, leaky_relu(0.1), ... (--list-phi)\n"
    "                     (mlp default relu)\n"
    "  --sigma-w2=V       weight variance (mlp default 2; rnn: recurrent W)\n"
    "  --sigma-b2=V       bias variance (mlp default 0)\n"
    "  --sigma-u2=V       (rnn) input weight variance\n"
    "  --sigma-v2=V       (rnn) readout variance\n"
    "  --layernorm        (mlp) LayerNorm before every phi (theory.md §2.6; programs/mlp-ln.nsr)\n"
    "  --ln-eps=E         (mlp --layernorm) LN epsilon: (g - m)/sqrt(v + E) (default 1e-5)\n"
    "  --residual=ALPHA   (mlp) skip connections g[l] = g[l-1] + ALPHA W phi(g[l-1]) + b\n"
    "                     (theory.md §2.9; programs/mlp-residual.nsr, mlp-ln-residual.nsr)\n"
    "  --batch-size=B     (batchnorm) inputs per batch, consecutive; 0 (default): all inputs\n"
    "  --all-times        every readout (all time steps), sequence-major: ((N·T)×(N·T));\n"
    "                     default: the last time step only (N×N)\n"
    "  --filter=K[,KW]    (cnn1d, cnn2d) filter size k, or kh,kw (default 3)\n"
    "  --padding=P        (cnn) circular (default) or zero\n"
    "  --readout=R        (cnn) gap (global average pooling, default) or flatten;\n"
    "                     with --all-times every position: ((N·P)×(N·P))\n"
    "  --conv=M           (cnn) tap convolution: auto (default), direct or fft\n"
    "  --depth=L          (transformer) layers (default 2)\n"
    "  --var-e=V --var-u=V --var-w=V --var-b=V\n"
    "                     (transformer) variances of the token embedding, the key projections,\n"
    "                     the feed-forward weights and biases (defaults 1, 1, 1, 0)\n"
    "  --temp=T           (transformer) softmax temperature, > 0 (default 1)\n"
    "  --ln-eps=E         (transformer) LN epsilon (default 1e-12); default output: the last\n"
    "                     token of each sequence, --all-times: every token, sequence-major\n"
    "  --heads=H          (attention) heads (default 2); --causal=1: token i sees j <= i\n"
    "  --logit-scaling=S  (attention) inv-sqrt-n (default): <q,k>/sqrt(n), the non-Gaussian\n"
    "                     hierarchical limit: /kernel = E_p[C(p)], /score_covariances = R sampled\n"
    "                     C(p), /excess_kurtosis; inv-n: <q,k>/n, Gaussian (uniform averaging)\n"
    "  --score-samples=R  (attention, inv-sqrt-n) sampled score covariances (default 256)\n"
    "  --seed=S           (attention, inv-sqrt-n) random seed of the score samples (default 0)\n"
    "  --var-q=V --var-k=V --var-v=V --var-o=V  (attention) projection variances (default 1)\n"
    "  --set NAME=VALUE   override any program parameter (repeatable)\n"
    "  --netsor-plus      allow NETSOR+ Moments in --program\n"
    "  --progress, --no-progress   the progress line (below)\n"
    "  --list-archs, --list-phi, --quiet, --help, --version\n"
    "\n"
    "Convention (mlp): Sigma^1(x,x') = sigma_w2 <x,x'>/d + sigma_b2;\n"
    "  Sigma^{l+1} = sigma_w2 E[phi(u)phi(v)] + sigma_b2, (u,v) ~ N(0, Sigma^l on x,x');\n"
    "  the output is Sigma^{L+1}, the covariance of the scalar output of a network with L hidden\n"
    "  layers (neural-tangents serial([Dense(W_std=sw, b_std=sb), phi]*L + [Dense(...)]).\n"
    "Convention (rnn): h_t = W s_{t-1} + U x_t + b, s_t = phi(h_t), s_0 = 0; the output is the\n"
    "  covariance of y_t = <v, s_t>, sigma_v2 E[phi(h_t)phi(h'_r)] (theory.md §2.2).\n"
    "Options take their value as --opt=VALUE or --opt VALUE (architecture flags too).\n"
    CLI_PROGRESS_HELP
    CLI_EXIT_HELP;

typedef struct opts {
    const tpk_arch *a;
    const char *program, *input, *test, *output;
    cli_arch_flags flags;       /* --flag=value of the architecture */
    char attr[CLI_MAX_FLAGS][64]; /* output attribute of each: the flag with '_' for '-' */
    cli_sets sets;
    int all_times, netsor_plus, quiet, layernorm;
    int progress;               /* --progress 1, --no-progress 0, neither -1 */
} opts;

#define EXIT_EARLY (-1) /* --help, --version, --list-*: done, successfully */

enum { OPT_ARCH = 256, OPT_PROGRAM, OPT_INPUT, OPT_TEST, OPT_OUTPUT, OPT_SET, OPT_ALLT,
       OPT_PLUS, OPT_LISTARCH, OPT_LISTPHI, OPT_QUIET, OPT_HELP, OPT_VERSION, OPT_LN,
       OPT_PROGRESS, OPT_NOPROGRESS };

static const struct option longopts[] = {
    {"arch", required_argument, NULL, OPT_ARCH},
    {"program", required_argument, NULL, OPT_PROGRAM},
    {"input", required_argument, NULL, OPT_INPUT},
    {"test", required_argument, NULL, OPT_TEST},
    {"output", required_argument, NULL, OPT_OUTPUT},
    {"set", required_argument, NULL, OPT_SET},
    {"all-times", no_argument, NULL, OPT_ALLT},
    {"netsor-plus", no_argument, NULL, OPT_PLUS},
    {"list-archs", no_argument, NULL, OPT_LISTARCH},
    {"list-phi", no_argument, NULL, OPT_LISTPHI},
    {"quiet", no_argument, NULL, OPT_QUIET},
    {"help", no_argument, NULL, OPT_HELP},
    {"version", no_argument, NULL, OPT_VERSION},
    {"layernorm", no_argument, NULL, OPT_LN},
    {"progress", no_argument, NULL, OPT_PROGRESS},
    {"no-progress", no_argument, NULL, OPT_NOPROGRESS},
    {NULL, 0, NULL, 0}};

static int check_args(opts *o, const char *arch_name, const tpk_phi_registry *reg, tpk_ctx *ctx);

static int parse_args(int argc, char **argv, opts *o, const tpk_phi_registry *reg, tpk_ctx *ctx)
{
    int c, st = TPK_OK, nrest = 0;
    const char *arch_name = NULL;
    /* Architecture flags (--depth=3, --var-Uz=0.5, ...) are not known to getopt: out first. */
    char **rest = cli_arch_flags_take(argc, argv, longopts, &o->flags, &nrest, ctx);
    if (!rest)
        return ctx->status;
    argc = nrest;
    argv = rest;
    opterr = 0;
    while (st == TPK_OK && (c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case OPT_ARCH: arch_name = optarg; break;
        case OPT_PROGRAM: o->program = optarg; break;
        case OPT_INPUT: o->input = optarg; break;
        case OPT_TEST: o->test = optarg; break;
        case OPT_OUTPUT: o->output = optarg; break;
        case OPT_SET: st = cli_sets_add(&o->sets, optarg, ctx); break;
        case OPT_ALLT: o->all_times = 1; break;
        case OPT_PLUS: o->netsor_plus = 1; break;
        case OPT_QUIET: o->quiet = 1; break;
        case OPT_PROGRESS: o->progress = 1; break;
        case OPT_NOPROGRESS: o->progress = 0; break;
        case OPT_LN: o->layernorm = 1; break;
        case OPT_LISTARCH: tpk_arch_list(stdout); st = EXIT_EARLY; break;
        case OPT_LISTPHI: tpk_phi_registry_list(reg, stdout); st = EXIT_EARLY; break;
        case 'h':
        case OPT_HELP: /* the usage, then every architecture's flags from its row's flag map */
            fputs(usage, stdout);
            fputs("\nArchitectures (--arch=NAME) and their flags (--flag=value sets the parameter):\n",
                  stdout);
            tpk_arch_list(stdout);
            st = EXIT_EARLY;
            break;
        case OPT_VERSION: cli_version("gpkernel"); st = EXIT_EARLY; break;
        default: st = cli_bad_option(argv, ctx);
        }
    }
    if (!st)
        st = cli_no_operands(argc, argv, ctx);
    free(rest);
    if (st)
        return st;
    return check_args(o, arch_name, reg, ctx);
}

/* Everything parse_args collected must make sense together. */
static int check_args(opts *o, const char *arch_name, const tpk_phi_registry *reg, tpk_ctx *ctx)
{
    int st;
    if (!arch_name == !o->program)
        return TPK_ERROR(ctx, TPK_EINVAL, "give exactly one of --arch=NAME and --program=FILE.nsr");
    if (arch_name && !(o->a = cli_arch(arch_name, ctx)))
        return ctx->status;
    if (!o->output)
        return TPK_ERROR(ctx, TPK_EINVAL, "missing --output=FILE.h5");
    if ((st = cli_arch_flags_resolve(&o->flags, o->a, reg, ctx)))
        return st;
    for (int f = 0; f < o->flags.n; f++) {
        const char *flag = o->flags.fl[f].flag;
        for (size_t i = 0; i <= strlen(flag); i++)
            o->attr[f][i] = flag[i] == '-' ? '_' : flag[i];
    }
    return TPK_OK;
}

static int run(int argc, char **argv, int *usage_error, tpk_ctx *ctx)
{
    opts o = {0};
    o.progress = -1;
    cli_progress bar = {0};
    int nrec = 0;
    char **rec = NULL; /* the command line as recorded */
    tpk_phi_registry *reg = tpk_job_registry(ctx);
    if (!reg)
        return ctx->status;
    int st = parse_args(argc, argv, &o, reg, ctx);
    tpk_phi_registry_free(reg);
    if (st == EXIT_EARLY) {
        st = TPK_OK;
        goto done;
    }
    if (st) {
        *usage_error = 1; /* the command line itself: exit 2 */
        goto done;
    }

    char prog[4200], input[4200], lists[2048];
    tpk_param_set sets[MAX_SETS];
    tpk_attr attrs[CLI_MAX_FLAGS + 2];
    int nsets = 0, nattrs = 0;
    const tpk_arch_flag *afl = o.flags.fl;
    const int nafl = o.flags.n;
    if (o.a) {
        if ((st = tpk_arch_sets(o.a, afl, nafl, o.sets.set, o.sets.n, sets, MAX_SETS, &nsets,
                                lists, sizeof lists, ctx)))
            goto done;
        const char *program = NULL;
        if ((st = tpk_arch_program(o.a, o.layernorm, afl, nafl, &program, ctx)))
            goto done;
        if (program)
            tpk_shipped_path(program, prog, sizeof prog);
        if (o.layernorm)
            attrs[nattrs++] = (tpk_attr){.name = "layernorm", .value = "1"};
        if (!o.input)
            o.input = tpk_shipped_path(o.a->input, input, sizeof input);
        /* Flags under their own names when those differ from the parameter (depth vs L), so a
         * file reads the way the command was typed; equal names are written as parameters. */
        for (int f = 0; f < nafl; f++)
            if (strcmp(o.attr[f], afl[f].param) != 0)
                attrs[nattrs++] = (tpk_attr){.name = o.attr[f], .value = afl[f].value};
        /* mlp's depth is always recorded, also when it is the default */
        if (strcmp(o.a->name, "mlp") == 0) {
            int have = 0;
            for (int f = 0; f < nafl; f++)
                have |= strcmp(afl[f].flag, "depth") == 0;
            if (!have)
                for (int i = nsets - 1; i >= 0; i--)
                    if (strcmp(sets[i].name, "L") == 0) {
                        attrs[nattrs++] = (tpk_attr){.name = "depth", .value = sets[i].value};
                        break;
                    }
        }
    } else {
        memcpy(sets, o.sets.set, (size_t)o.sets.n * sizeof *sets);
        nsets = o.sets.n;
        if (!o.input) {
            st = TPK_ERROR(ctx, TPK_EINVAL, "--program needs --input=SPEC");
            *usage_error = 1;
            goto done;
        }
    }
    if (!(rec = cli_record_argv(argc, argv, &nrec))) {
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        goto done;
    }
    cli_progress_start(&bar, "gpkernel", "limit kernel", 0, !o.quiet && cli_progress_wanted(o.progress));
    tpk_job job = {.label = o.a ? o.a->name : "program",
                   .program = o.a ? (o.a->program ? prog : NULL) : o.program, .sets = sets,
                   .nsets = nsets, .netsor_plus = o.netsor_plus, .input = o.input, .test = o.test,
                   .output = o.output, .all_outputs = o.all_times, .attrs = attrs,
                   .nattrs = nattrs, .argc = nrec, .argv = rec,
                   .summary = o.quiet ? NULL : cli_progress_stream(&bar, stdout),
                   .progress = cli_progress_lib(&bar, NULL)};
    st = o.a && o.a->custom ? o.a->custom(&job, ctx) : tpk_job_kernel(&job, ctx);
done:
    cli_progress_end(&bar, st == TPK_OK);
    free(rec);
    cli_sets_free(&o.sets);
    return st;
}

int main(int argc, char **argv)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    int usage_error = 0, st = run(argc, argv, &usage_error, &ctx);
    return usage_error ? cli_report_usage("gpkernel", st, &ctx) : cli_report("gpkernel", st, &ctx);
}
