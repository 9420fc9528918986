/* gpkernel's command line, shared with gpkernel-mpi (tools/cli_kernel.h). */
#include "cli_kernel.h"

#include <stdlib.h>
#include <string.h>

const char cli_kernel_options_help[] =
    "Options:\n"
    "  --arch=NAME        a shipped architecture (--list-archs): mlp, rnn, rnn-untied,\n"
    "                     gru, lstm, transformer, attention, cnn1d, cnn2d, ...\n"
    "  --program=FILE     any NETSOR program (docs/netsor.md); with --set NAME=VALUE overrides\n"
    "  --input=SPEC       inputs: FILE.h5:/dataset, FILE.npy (any real dtype or order),\n"
    "                     FILE.npz:NAME or FILE.csv; N×d, or N×T×d for recurrent programs\n"
    "                     (default: the architecture's bundled demo input)\n"
    "  --test=SPEC        test inputs: also /kernel_test_train (M×N) and /kernel_test_diag (M)\n"
    "  --output=FILE.h5   output file (written atomically; required)\n"
    "  --force            replace an existing --output that is not an HDF5 file of this\n"
    "                     toolkit (refused by default: nothing is overwritten without it)\n"
    "  --kernel=K         nngp (default: /kernel), ntk (/ntk, the Neural Tangent Kernel,\n"
    "                     docs/theory.md section 8; cnn1d/cnn2d: their recursion) or both\n"
    "  --parameterization=P  the NTK's: ntk (neural-tangents' 'ntk', default), tp (Tensor\n"
    "                     Programs II's, no variance factors) or standard (neural-tangents'\n"
    "                     'standard', with --ntk-width=N: that NTK depends on the width)\n"
    "  --depth=L          (mlp) hidden layers, 1..30000 (default 3; every row's range:\n"
    "                     --list-archs; deeper programs exceed the elaborator's size limit)\n"
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
    "  --readout=R        (cnn) gap (global average pooling, default), flatten, or lap\n"
    "                     (local average pooling, Li et al. 2019: the flatten kernel's mean\n"
    "                     over the circular shifts within --window=C positions on each axis;\n"
    "                     circular padding only); with --all-times every position: ((N·P)×(N·P))\n"
    "  --window=C         (cnn, --readout=lap) the shifts' reach C >= 0: 0 is flatten, a\n"
    "                     window covering the grid (2C+1 >= its sides) is gap\n"
    "  --compute=F        (cnn, --readout=flatten) f64 (default) or f32: float storage, tap\n"
    "                     sums and maps, double variances and readout sums (~1e-7 relative)\n"
    "  --conv=M           (cnn) tap convolution: auto (default), direct or fft\n"
    "  --depth=L          (transformer) layers, 1..1000 (default 2)\n"
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
    "  --list-archs, --list-phi, --quiet, --help, --version\n";

const char cli_kernel_conventions_help[] =
    "\n"
    "Convention (mlp): Sigma^1(x,x') = sigma_w2 <x,x'>/d + sigma_b2;\n"
    "  Sigma^{l+1} = sigma_w2 E[phi(u)phi(v)] + sigma_b2, (u,v) ~ N(0, Sigma^l on x,x');\n"
    "  the output is Sigma^{L+1}, the covariance of the scalar output of a network with L hidden\n"
    "  layers (neural-tangents serial([Dense(W_std=sw, b_std=sb), phi]*L + [Dense(...)]).\n"
    "Defaults (mlp): the flags' defaults above are programs/mlp.nsr's own (and --layernorm's,\n"
    "  --residual's programs'): sigma_b2 0, sigma_v2 = sigma_w2, sigma_ob2 = sigma_b2 (the readout's\n"
    "  output bias variance, docs/netsor.md), so `netsor kernel programs/mlp.nsr` computes the\n"
    "  same kernel as --arch=mlp. Other rows set what --list-archs shows (\"sets:\"); where that\n"
    "  differs from their program's defaults (batchnorm, cnn1d, cnn2d: 3 layers, not the\n"
    "  program's 2), `netsor kernel` on the file computes another network.\n"
    "Convention (rnn): h_t = W s_{t-1} + U x_t + b, s_t = phi(h_t), s_0 = 0; the output is the\n"
    "  covariance of y_t = <v, s_t>, sigma_v2 E[phi(h_t)phi(h'_r)] (theory.md §2.2).\n"
    "Options take their value as --opt=VALUE or --opt VALUE (architecture flags too).\n";

enum { OPT_ARCH = 256, OPT_PROGRAM, OPT_INPUT, OPT_TEST, OPT_OUTPUT, OPT_SET, OPT_ALLT,
       OPT_PLUS, OPT_LISTARCH, OPT_LISTPHI, OPT_QUIET, OPT_HELP, OPT_VERSION, OPT_LN,
       OPT_PROGRESS, OPT_NOPROGRESS, OPT_FORCE, OPT_KERNEL, OPT_PARAM, OPT_NTKW };

static const struct option kernel_opts[] = {
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
    {"force", no_argument, NULL, OPT_FORCE},
    {"kernel", required_argument, NULL, OPT_KERNEL},
    {"parameterization", required_argument, NULL, OPT_PARAM},
    {"ntk-width", required_argument, NULL, OPT_NTKW},
    {NULL, 0, NULL, 0}};

static int check_args(cli_kernel *k, const char *arch_name, const tpk_phi_registry *reg,
                      tpk_ctx *ctx);

int cli_kernel_parse(int argc, char **argv, const char *tool, const char *const help[3],
                     const struct option *own, cli_kernel_own_fn fn, void *user, cli_kernel *k,
                     tpk_ctx *ctx)
{
    memset(k, 0, sizeof *k);
    k->progress = -1;
    tpk_phi_registry *reg = tpk_job_registry(ctx);
    if (!reg)
        return ctx->status;
    struct option *longopts = cli_options_join(kernel_opts, own, ctx);
    if (!longopts) {
        tpk_phi_registry_free(reg);
        return ctx->status;
    }
    int c, st = TPK_OK, nrest = 0;
    const char *arch_name = NULL;
    /* Architecture flags (--depth=3, --var-Uz=0.5, ...) are not known to getopt: out first. */
    char **rest = cli_arch_flags_take(argc, argv, longopts, &k->flags, &nrest, ctx);
    if (!rest) {
        free(longopts);
        tpk_phi_registry_free(reg);
        return ctx->status;
    }
    argc = nrest;
    argv = rest;
    opterr = 0;
    optind = 1;
    cli_seen seen;
    cli_seen_init(&seen, longopts);
    while (st == TPK_OK && (c = cli_getopt(argc, argv, longopts, &seen, &st, ctx)) != -1) {
        switch (c) {
        case OPT_ARCH: arch_name = optarg; break;
        case OPT_PROGRAM: k->program = optarg; break;
        case OPT_INPUT: k->input = optarg; break;
        case OPT_TEST: k->test = optarg; break;
        case OPT_OUTPUT: k->output = optarg; break;
        case OPT_SET: st = cli_sets_add(&k->sets, optarg, ctx); break;
        case OPT_ALLT: k->all_times = 1; break;
        case OPT_PLUS: k->netsor_plus = 1; break;
        case OPT_QUIET: k->quiet = 1; break;
        case OPT_LN: k->layernorm = 1; break;
        case OPT_PROGRESS: k->progress = 1; break;
        case OPT_NOPROGRESS: k->progress = 0; break;
        case OPT_FORCE: k->force = 1; break;
        case OPT_KERNEL: st = cli_parse_kernel_kind(optarg, &k->kernel, ctx); break;
        case OPT_PARAM: st = cli_parse_ntk_param(optarg, &k->ntk_param, ctx); break;
        case OPT_NTKW: st = cli_parse_size("ntk-width", optarg, 1, (size_t)1 << 32, &k->ntk_width, ctx); break;
        case OPT_LISTARCH: tpk_arch_list(stdout); st = CLI_KERNEL_DONE; break;
        case OPT_LISTPHI: tpk_phi_registry_list(reg, stdout); st = CLI_KERNEL_DONE; break;
        case 'h':
        case OPT_HELP: /* the usage, then every architecture's flags from its row's flag map */
            fputs(help[0], stdout);
            fputs(cli_kernel_options_help, stdout);
            fputs(help[1], stdout);
            fputs(cli_kernel_conventions_help, stdout);
            fputs(help[2], stdout);
            fputs("\nArchitectures (--arch=NAME) and their flags (--flag=value sets the parameter):\n",
                  stdout);
            tpk_arch_list(stdout);
            st = CLI_KERNEL_DONE;
            break;
        case OPT_VERSION: cli_version(tool); st = CLI_KERNEL_DONE; break;
        default:
            st = c >= CLI_KERNEL_OWN && fn ? fn(c, optarg, user, ctx) : cli_bad_option(argv, ctx);
        }
    }
    if (!st)
        st = cli_no_operands(argc, argv, ctx);
    free(rest);
    free(longopts);
    if (!st)
        st = check_args(k, arch_name, reg, ctx);
    tpk_phi_registry_free(reg);
    return st;
}

/* Everything cli_kernel_parse collected must make sense together. */
static int check_args(cli_kernel *k, const char *arch_name, const tpk_phi_registry *reg,
                      tpk_ctx *ctx)
{
    int st;
    if (!arch_name == !k->program)
        return TPK_ERROR(ctx, TPK_EINVAL, "give exactly one of --arch=NAME and --program=FILE.nsr");
    if (arch_name && !(k->a = cli_arch(arch_name, ctx)))
        return ctx->status;
    if (!k->output)
        return TPK_ERROR(ctx, TPK_EINVAL, "missing --output=FILE.h5");
    if ((st = cli_arch_flags_resolve(&k->flags, k->a, reg, ctx)))
        return st;
    for (int f = 0; f < k->flags.n; f++) {
        const char *flag = k->flags.fl[f].flag;
        for (size_t i = 0; i <= strlen(flag); i++)
            k->attr[f][i] = flag[i] == '-' ? '_' : flag[i];
    }
    return TPK_OK;
}

int cli_kernel_job(cli_kernel *k, int argc, char **argv, int *usage_error, tpk_ctx *ctx)
{
    int st;
    const tpk_arch_flag *afl = k->flags.fl;
    const int nafl = k->flags.n;
    tpk_attr *attrs = k->attrs;
    tpk_param_set *sets = k->jsets;
    int nattrs = 0, nsets = 0;
    if (k->a) {
        if ((st = tpk_arch_sets(k->a, afl, nafl, k->sets.set, k->sets.n, sets, TPK_ARCH_MAX_SETS,
                                &nsets, k->lists, sizeof k->lists, ctx)))
            return st;
        const char *program = NULL;
        if ((st = tpk_arch_program(k->a, k->layernorm, afl, nafl, &program, ctx)))
            return st;
        if (program)
            tpk_shipped_path(program, k->prog, sizeof k->prog);
        if (k->layernorm)
            attrs[nattrs++] = (tpk_attr){.name = "layernorm", .value = "1"};
        if (!k->input)
            k->input = tpk_shipped_path(k->a->input, k->input_buf, sizeof k->input_buf);
        /* Flags under their own names when those differ from the parameter (depth vs L), so a
         * file reads the way the command was typed; equal names are written as parameters. */
        for (int f = 0; f < nafl; f++)
            if (strcmp(k->attr[f], afl[f].param) != 0)
                attrs[nattrs++] = (tpk_attr){.name = k->attr[f], .value = afl[f].value,
                                             .param = afl[f].param};
        /* mlp's depth is always recorded, also when it is the default */
        if (strcmp(k->a->name, "mlp") == 0) {
            int have = 0;
            for (int f = 0; f < nafl; f++)
                have |= strcmp(afl[f].flag, "depth") == 0;
            if (!have)
                for (int i = nsets - 1; i >= 0; i--)
                    if (strcmp(sets[i].name, "L") == 0) {
                        attrs[nattrs++] = (tpk_attr){.name = "depth", .value = sets[i].value,
                                                     .param = "L"};
                        break;
                    }
        }
    } else {
        memcpy(sets, k->sets.set, (size_t)k->sets.n * sizeof *sets);
        nsets = k->sets.n;
        if (!k->input) {
            *usage_error = 1;
            return TPK_ERROR(ctx, TPK_EINVAL, "--program needs --input=SPEC");
        }
    }
    k->njsets = nsets;
    k->nattrs = nattrs;
    k->job = (tpk_job){.label = k->a ? k->a->name : "program",
                       .direct = k->a ? k->a->direct : NULL,
                       .program = k->a ? (k->a->program ? k->prog : NULL) : k->program,
                       .sets = sets, .nsets = nsets, .netsor_plus = k->netsor_plus,
                       .input = k->input, .test = k->test, .output = k->output,
                       .all_outputs = k->all_times, .attrs = attrs, .nattrs = nattrs,
                       .argc = argc, .argv = argv, .summary = k->quiet ? NULL : stdout,
                       .force = k->force, .kernel = k->kernel, .ntk_param = k->ntk_param,
                       .ntk_width = k->ntk_width};
    return TPK_OK;
}

void cli_kernel_free(cli_kernel *k)
{
    cli_sets_free(&k->sets);
}
