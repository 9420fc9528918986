/* gpkernel: infinite-width GP kernels of whole architectures (shipped NETSOR programs) or of any
 * NETSOR program, written to self-describing HDF5. */
#include "tpk/job.h"
#include "tpk/tpk.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef TPK_VERSION
#define TPK_VERSION "unknown"
#endif

#define MAX_SETS 64

/* A flag of the command line that becomes a program parameter. */
enum flag { F_DEPTH, F_PHI, F_SW2, F_SB2, F_SU2, F_SV2, NFLAGS };
static const char *const flag_name[NFLAGS] = {"depth", "phi", "sigma-w2", "sigma-b2", "sigma-u2",
                                              "sigma-v2"};

/* An architecture is a shipped program plus how the flags map onto its parameters. */
typedef struct arch {
    const char *name;
    const char *program;        /* under programs/ */
    const char *input;          /* default (bundled) input under data/ */
    const char *summary;
    const char *param[NFLAGS];  /* parameter each flag sets; NULL: flag not taken */
    const char *defaults;       /* gpkernel's own defaults, "name=value,..." */
    int is_mlp;                 /* the issue-2 convention: output Σ^{L+1} (see usage) */
} arch;

static const arch archs[] = {
    {"mlp", "programs/mlp.nsr", "data/demo-inputs.csv",
     "deep fully connected network, any phi (theory.md §2.1)",
     {"L", "phi", "sigma_w2", "sigma_b2", NULL, NULL}, "L=3,phi=relu,sigma_w2=2,sigma_b2=0", 1},
    {"rnn", "programs/rnn.nsr", "data/demo-sequences.npy",
     "simple RNN, W tied over time, inputs N×T×d (theory.md §2.2)",
     {NULL, "phi", "sigma_w2", "sigma_b2", "sigma_u2", "sigma_v2"}, "", 0},
    {"rnn-untied", "programs/rnn_untied.nsr", "data/demo-sequences.npy",
     "RNN with a fresh W at every step: no recurrent cross-time terms (theory.md §1.8)",
     {NULL, "phi", "sigma_w2", "sigma_b2", "sigma_u2", "sigma_v2"}, "", 0},
};

static const char usage[] =
    "Usage: gpkernel --arch=NAME [options] --output=FILE.h5\n"
    "       gpkernel --program=FILE.nsr [--set NAME=VALUE]... [options] --output=FILE.h5\n"
    "Infinite-width (NNGP) kernel of an architecture or NETSOR program, written to HDF5.\n"
    "\n"
    "Options:\n"
    "  --arch=NAME        a shipped architecture (--list-archs): mlp, rnn, rnn-untied\n"
    "  --program=FILE     any NETSOR program (docs/netsor.md); with --set NAME=VALUE overrides\n"
    "  --input=SPEC       inputs: FILE.h5:/dataset, FILE.npy or FILE.csv; N×d, or N×T×d for\n"
    "                     recurrent programs (default: the architecture's bundled demo input)\n"
    "  --test=SPEC        test inputs: also /kernel_test_train (M×N) and /kernel_test_diag (M)\n"
    "  --output=FILE.h5   output file (written atomically; required)\n"
    "  --depth=L          (mlp) hidden layers, L >= 1 (default 3)\n"
    "  --phi=NAME         nonlinearity: relu, erf, tanh, gelu, leaky_relu(0.1), ... (--list-phi)\n"
    "                     (mlp default relu)\n"
    "  --sigma-w2=V       weight variance (mlp default 2; rnn: recurrent W)\n"
    "  --sigma-b2=V       bias variance (mlp default 0)\n"
    "  --sigma-u2=V       (rnn) input weight variance\n"
    "  --sigma-v2=V       (rnn) readout variance\n"
    "  --all-times        every readout (all time steps), sequence-major: ((N·T)×(N·T));\n"
    "                     default: the last time step only (N×N)\n"
    "  --set NAME=VALUE   override any program parameter (repeatable)\n"
    "  --netsor-plus      allow NETSOR+ Moments in --program\n"
    "  --list-archs, --list-phi, --quiet, --help, --version\n"
    "\n"
    "Convention (mlp): Sigma^1(x,x') = sigma_w2 <x,x'>/d + sigma_b2;\n"
    "  Sigma^{l+1} = sigma_w2 E[phi(u)phi(v)] + sigma_b2, (u,v) ~ N(0, Sigma^l on x,x');\n"
    "  the output is Sigma^{L+1}, the covariance of the scalar output of a network with L hidden\n"
    "  layers (neural-tangents serial([Dense(W_std=sw, b_std=sb), phi]*L + [Dense(...)]).\n"
    "Convention (rnn): h_t = W s_{t-1} + U x_t + b, s_t = phi(h_t), s_0 = 0; the output is the\n"
    "  covariance of y_t = <v, s_t>, sigma_v2 E[phi(h_t)phi(h'_r)] (theory.md §2.2).\n";

typedef struct opts {
    const arch *a;
    const char *program, *input, *test, *output;
    const char *flag[NFLAGS];
    tpk_param_set sets[MAX_SETS];
    char *owned[MAX_SETS];
    int nsets, all_times, netsor_plus, quiet;
} opts;

#define EXIT_EARLY (-1) /* --help, --version, --list-*: done, successfully */

static int add_set(opts *o, const char *name, const char *value, int copy_name, tpk_ctx *ctx)
{
    if (o->nsets == MAX_SETS)
        return TPK_ERROR(ctx, TPK_EINVAL, "at most %d parameter settings", MAX_SETS);
    char *n = NULL;
    if (copy_name && (n = strdup(name)) == NULL)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    o->owned[o->nsets] = n;
    o->sets[o->nsets++] = (tpk_param_set){.name = n ? n : name, .value = value};
    return TPK_OK;
}

/* "--set name=value" */
static int parse_set(opts *o, const char *kv, tpk_ctx *ctx)
{
    const char *eq = strchr(kv, '=');
    if (!eq || eq == kv)
        return TPK_ERROR(ctx, TPK_EINVAL, "--set needs NAME=VALUE (got '%s')", kv);
    char name[128];
    snprintf(name, sizeof name, "%.*s", (int)(eq - kv), kv);
    return add_set(o, name, eq + 1, 1, ctx);
}

static int check_variance(const char *flag, const char *s, tpk_ctx *ctx)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || errno == ERANGE)
        return TPK_ERROR(ctx, TPK_EINVAL, "--%s: '%s' is not a number", flag, s);
    if (!(v >= 0) || !isfinite(v))
        return TPK_ERROR(ctx, TPK_EDOM, "--%s must be a finite variance >= 0 (got %s)", flag, s);
    return TPK_OK;
}

static int check_depth(const char *s, tpk_ctx *ctx)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || errno == ERANGE)
        return TPK_ERROR(ctx, TPK_EINVAL, "--depth: '%s' is not an integer", s);
    if (v < 1 || v > 100000)
        return TPK_ERROR(ctx, TPK_EINVAL, "--depth must be in 1..100000 hidden layers (got %ld)", v);
    return TPK_OK;
}

static void list_archs(void)
{
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        printf("%-12s %s  [%s]\n", archs[i].name, archs[i].summary, archs[i].program);
}

enum { OPT_ARCH = 256, OPT_PROGRAM, OPT_INPUT, OPT_TEST, OPT_OUTPUT, OPT_SET, OPT_ALLT,
       OPT_PLUS, OPT_LISTARCH, OPT_LISTPHI, OPT_QUIET, OPT_HELP, OPT_VERSION, OPT_FLAG0 };

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
    {"depth", required_argument, NULL, OPT_FLAG0 + F_DEPTH},
    {"phi", required_argument, NULL, OPT_FLAG0 + F_PHI},
    {"sigma-w2", required_argument, NULL, OPT_FLAG0 + F_SW2},
    {"sigma-b2", required_argument, NULL, OPT_FLAG0 + F_SB2},
    {"sigma-u2", required_argument, NULL, OPT_FLAG0 + F_SU2},
    {"sigma-v2", required_argument, NULL, OPT_FLAG0 + F_SV2},
    {NULL, 0, NULL, 0}};

static int parse_args(int argc, char **argv, opts *o, const tpk_phi_registry *reg, tpk_ctx *ctx)
{
    int c, st = TPK_OK;
    const char *arch_name = NULL;
    opterr = 0;
    while (st == TPK_OK && (c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case OPT_ARCH: arch_name = optarg; break;
        case OPT_PROGRAM: o->program = optarg; break;
        case OPT_INPUT: o->input = optarg; break;
        case OPT_TEST: o->test = optarg; break;
        case OPT_OUTPUT: o->output = optarg; break;
        case OPT_SET: st = parse_set(o, optarg, ctx); break;
        case OPT_ALLT: o->all_times = 1; break;
        case OPT_PLUS: o->netsor_plus = 1; break;
        case OPT_QUIET: o->quiet = 1; break;
        case OPT_LISTARCH: list_archs(); return EXIT_EARLY;
        case OPT_LISTPHI: tpk_phi_registry_list(reg, stdout); return EXIT_EARLY;
        case OPT_HELP: fputs(usage, stdout); return EXIT_EARLY;
        case OPT_VERSION: printf("gpkernel (tpk) %s\n", TPK_VERSION); return EXIT_EARLY;
        default:
            if (c >= OPT_FLAG0 && c < OPT_FLAG0 + NFLAGS) {
                o->flag[c - OPT_FLAG0] = optarg;
                break;
            }
            return TPK_ERROR(ctx, TPK_EINVAL, "unknown or malformed option '%s' (see --help)",
                             argv[optind - 1]);
        }
    }
    if (st)
        return st;
    if (optind < argc)
        return TPK_ERROR(ctx, TPK_EINVAL, "unexpected argument '%s' (see --help)", argv[optind]);
    if (!arch_name == !o->program)
        return TPK_ERROR(ctx, TPK_EINVAL, "give exactly one of --arch=NAME and --program=FILE.nsr");
    if (arch_name) {
        for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
            if (strcmp(arch_name, archs[i].name) == 0)
                o->a = &archs[i];
        if (!o->a)
            return TPK_ERROR(ctx, TPK_EINVAL,
                             "unknown architecture '%s' (see --list-archs: mlp, rnn, rnn-untied)",
                             arch_name);
    }
    if (!o->output)
        return TPK_ERROR(ctx, TPK_EINVAL, "missing --output=FILE.h5");
    for (int f = 0; f < NFLAGS; f++) {
        if (!o->flag[f])
            continue;
        if (!o->a || !o->a->param[f])
            return TPK_ERROR(ctx, TPK_EINVAL, "--%s is not an option of %s (use --set)", flag_name[f],
                             o->a ? o->a->name : "--program");
        st = f == F_DEPTH ? check_depth(o->flag[f], ctx)
           : f == F_PHI   ? TPK_OK
                          : check_variance(flag_name[f], o->flag[f], ctx);
        if (st)
            return st;
    }
    if (o->flag[F_PHI]) { /* name the bad function here, not deep inside the program */
        tpk_phi *phi = tpk_phi_alloc(reg, o->flag[F_PHI], ctx);
        if (!phi)
            return ctx->status;
        tpk_phi_free(phi);
    }
    return TPK_OK;
}

/* Turn the architecture's defaults and the user's flags into parameter settings. Later settings
 * win in the front end, so the order is: defaults, flags, the mlp convention, --set. */
static int arch_sets(opts *o, tpk_param_set *out, int *n, char *buf, size_t len, tpk_ctx *ctx)
{
    *n = 0;
    char *p = buf;
    snprintf(buf, len, "%s", o->a->defaults);
    while (*p) {
        char *comma = strchr(p, ',');
        if (comma)
            *comma = '\0';
        char *eq = strchr(p, '=');
        if (eq) {
            *eq = '\0';
            out[(*n)++] = (tpk_param_set){.name = p, .value = eq + 1};
        }
        if (!comma)
            break;
        p = comma + 1;
    }
    for (int f = 0; f < NFLAGS; f++)
        if (o->flag[f])
            out[(*n)++] = (tpk_param_set){.name = o->a->param[f], .value = o->flag[f]};
    if (o->a->is_mlp) {
        /* The last Dense layer is like the others: readout variance σ_w², readout bias σ_b². */
        out[(*n)++] = (tpk_param_set){.name = "sigma_v2", .value = "sigma_w2"};
        out[(*n)++] = (tpk_param_set){.name = "sigma_ob2", .value = "sigma_b2"};
    }
    for (int i = 0; i < o->nsets; i++) {
        if (*n == MAX_SETS)
            return TPK_ERROR(ctx, TPK_EINVAL, "too many parameter settings");
        out[(*n)++] = o->sets[i];
    }
    return TPK_OK;
}

static int run(int argc, char **argv, tpk_ctx *ctx)
{
    opts o = {0};
    tpk_phi_registry *reg = tpk_job_registry(ctx);
    if (!reg)
        return ctx->status;
    int st = parse_args(argc, argv, &o, reg, ctx);
    tpk_phi_registry_free(reg);
    if (st == EXIT_EARLY) {
        st = TPK_OK;
        goto done;
    }
    if (st)
        goto done;

    char prog[4200], input[4200], defbuf[512];
    tpk_param_set sets[MAX_SETS + 16];
    tpk_attr attrs[NFLAGS];
    int nsets = 0, nattrs = 0;
    if (o.a) {
        st = arch_sets(&o, sets, &nsets, defbuf, sizeof defbuf, ctx);
        if (st)
            goto done;
        tpk_shipped_path(o.a->program, prog, sizeof prog);
        if (!o.input)
            o.input = tpk_shipped_path(o.a->input, input, sizeof input);
        /* The CLI's own names too, e.g. depth = L, so files read the way the command was typed. */
        for (int f = 0; f < NFLAGS; f++)
            if (o.a->param[f] && strcmp(o.a->param[f], flag_name[f]) != 0 && f == F_DEPTH) {
                for (int i = nsets - 1; i >= 0; i--)
                    if (strcmp(sets[i].name, o.a->param[f]) == 0) {
                        attrs[nattrs++] = (tpk_attr){.name = "depth", .value = sets[i].value};
                        break;
                    }
            }
    } else {
        memcpy(sets, o.sets, (size_t)o.nsets * sizeof *sets);
        nsets = o.nsets;
        if (!o.input) {
            st = TPK_ERROR(ctx, TPK_EINVAL, "--program needs --input=SPEC");
            goto done;
        }
    }
    tpk_job job = {.label = o.a ? o.a->name : "program", .program = o.a ? prog : o.program,
                   .sets = sets, .nsets = nsets, .netsor_plus = o.netsor_plus, .input = o.input,
                   .test = o.test, .output = o.output, .all_outputs = o.all_times, .attrs = attrs,
                   .nattrs = nattrs, .argc = argc, .argv = argv, .summary = o.quiet ? NULL : stdout};
    st = tpk_job_kernel(&job, ctx);
done:
    for (int i = 0; i < o.nsets; i++)
        free(o.owned[i]);
    return st;
}

int main(int argc, char **argv)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    int st = run(argc, argv, &ctx);
    if (st) {
        fprintf(stderr, "gpkernel: error: %s\n", ctx.msg[0] ? ctx.msg : tpk_strerror(st));
        return 1;
    }
    return 0;
}
