/* gpkernel: infinite-width GP kernels of whole architectures, written to self-describing HDF5. */
#include "tpk/tpk.h"
#include "tpk/kernels.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef TPK_VERSION
#define TPK_VERSION "unknown"
#endif
#include <unistd.h>

/* Bundled demo input, used when --input is absent so `make run` shows something real.
 * Looked up beside the executable: build/bin/../../data (source tree) or bin/../share/tpk
 * (installed), so it works from any working directory. */
#define DEMO_NAME "demo-inputs.csv"

static const char *find_demo(char *buf, size_t len)
{
    static const char *const rel[] = {"/../../data/" DEMO_NAME, "/../share/tpk/" DEMO_NAME};
    char exe[4096];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k > 0) {
        exe[k] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash)
            *slash = '\0';
        for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
            snprintf(buf, len, "%s%s", exe, rel[i]);
            if (access(buf, R_OK) == 0)
                return buf;
        }
    }
    return "data/" DEMO_NAME;
}

typedef struct opts {
    const char *arch;
    const char *input;
    const char *test;
    const char *output;
    const char *phi;
    int depth;
    double sigma_w2, sigma_b2;
    int quad_degree;
    int quiet;
} opts;

static const char usage[] =
    "Usage: gpkernel --arch=ARCH [options] --output=FILE.h5\n"
    "Infinite-width (NNGP) kernel of an architecture, written to HDF5.\n"
    "\n"
    "Architectures:\n"
    "  mlp        deep fully connected network (theory.md §2.1)\n"
    "\n"
    "Options:\n"
    "  --input=SPEC       inputs: FILE.h5:/dataset, FILE.npy or FILE.csv, N×d\n"
    "                     (default: the bundled demo set data/" DEMO_NAME ")\n"
    "  --test=SPEC        test inputs (M×d): also write the test×train kernel and test diagonal\n"
    "  --output=FILE.h5   output file (written atomically; required)\n"
    "  --depth=L          hidden layers, L >= 1 (default 3)\n"
    "  --phi=NAME         nonlinearity, e.g. relu, erf, tanh, gelu, leaky_relu(0.1) (default relu)\n"
    "  --sigma-w2=V       weight variance sigma_w^2 (default 2)\n"
    "  --sigma-b2=V       bias variance sigma_b^2 (default 0)\n"
    "  --quad-degree=D    Gauss-Hermite degree for phi without closed form (default 64)\n"
    "  --list-phi         list the registered nonlinearities and exit\n"
    "  --quiet            no summary on stdout\n"
    "  --help, --version\n"
    "\n"
    "Convention (mlp): Sigma^1(x,x') = sigma_w2 <x,x'>/d + sigma_b2;\n"
    "  Sigma^{l+1} = sigma_w2 E[phi(u)phi(v)] + sigma_b2, (u,v) ~ N(0, Sigma^l on x,x');\n"
    "  the output is Sigma^{L+1}, the covariance of the scalar output of a network with L hidden\n"
    "  layers (neural-tangents serial([Dense(W_std=sw, b_std=sb), phi]*L + [Dense(...)]).\n"
    "Output datasets: /kernel (N×N); with --test also /kernel_test_train (M×N), /kernel_test_diag (M).\n";

static int parse_double(const char *name, const char *s, double *out, tpk_ctx *ctx)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || errno == ERANGE)
        return TPK_ERROR(ctx, TPK_EINVAL, "--%s: '%s' is not a number", name, s);
    *out = v;
    return TPK_OK;
}

static int parse_int(const char *name, const char *s, int *out, tpk_ctx *ctx)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || errno == ERANGE || v < -1000000 || v > 1000000)
        return TPK_ERROR(ctx, TPK_EINVAL, "--%s: '%s' is not an integer", name, s);
    *out = (int)v;
    return TPK_OK;
}

enum { OPT_ARCH = 256, OPT_INPUT, OPT_TEST, OPT_OUTPUT, OPT_PHI, OPT_DEPTH, OPT_SW2, OPT_SB2,
       OPT_QDEG, OPT_LISTPHI, OPT_QUIET, OPT_HELP, OPT_VERSION };

static const struct option longopts[] = {
    {"arch", required_argument, NULL, OPT_ARCH},
    {"input", required_argument, NULL, OPT_INPUT},
    {"test", required_argument, NULL, OPT_TEST},
    {"output", required_argument, NULL, OPT_OUTPUT},
    {"phi", required_argument, NULL, OPT_PHI},
    {"depth", required_argument, NULL, OPT_DEPTH},
    {"sigma-w2", required_argument, NULL, OPT_SW2},
    {"sigma-b2", required_argument, NULL, OPT_SB2},
    {"quad-degree", required_argument, NULL, OPT_QDEG},
    {"list-phi", no_argument, NULL, OPT_LISTPHI},
    {"quiet", no_argument, NULL, OPT_QUIET},
    {"help", no_argument, NULL, OPT_HELP},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0}};

/* Returns 0 to go on, EXIT_EARLY for --help/--version/--list-phi, or an error status. */
#define EXIT_EARLY (-1)
static int parse_args(int argc, char **argv, opts *o, const tpk_phi_registry *reg, tpk_ctx *ctx)
{
    int c, st = TPK_OK;
    opterr = 0;
    while (st == TPK_OK && (c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case OPT_ARCH: o->arch = optarg; break;
        case OPT_INPUT: o->input = optarg; break;
        case OPT_TEST: o->test = optarg; break;
        case OPT_OUTPUT: o->output = optarg; break;
        case OPT_PHI: o->phi = optarg; break;
        case OPT_DEPTH: st = parse_int("depth", optarg, &o->depth, ctx); break;
        case OPT_SW2: st = parse_double("sigma-w2", optarg, &o->sigma_w2, ctx); break;
        case OPT_SB2: st = parse_double("sigma-b2", optarg, &o->sigma_b2, ctx); break;
        case OPT_QDEG: st = parse_int("quad-degree", optarg, &o->quad_degree, ctx); break;
        case OPT_QUIET: o->quiet = 1; break;
        case OPT_LISTPHI: tpk_phi_registry_list(reg, stdout); return EXIT_EARLY;
        case OPT_HELP: fputs(usage, stdout); return EXIT_EARLY;
        case OPT_VERSION: printf("gpkernel (tpk) %s\n", TPK_VERSION); return EXIT_EARLY;
        default:
            return TPK_ERROR(ctx, TPK_EINVAL, "unknown or malformed option '%s' (see --help)",
                             argv[optind - 1]);
        }
    }
    if (st)
        return st;
    if (optind < argc)
        return TPK_ERROR(ctx, TPK_EINVAL, "unexpected argument '%s' (see --help)", argv[optind]);
    if (!o->arch)
        return TPK_ERROR(ctx, TPK_EINVAL, "missing --arch (see --help)");
    if (strcmp(o->arch, "mlp") != 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "unknown architecture '%s' (known: mlp)", o->arch);
    if (!o->output)
        return TPK_ERROR(ctx, TPK_EINVAL, "missing --output=FILE.h5");
    if (o->depth < 1)
        return TPK_ERROR(ctx, TPK_EINVAL, "--depth must be at least 1 (got %d)", o->depth);
    if (!(o->sigma_w2 >= 0) || !isfinite(o->sigma_w2))
        return TPK_ERROR(ctx, TPK_EDOM, "--sigma-w2 must be a variance >= 0 (got %s)",
                         o->sigma_w2 < 0 ? "a negative value" : "a non-finite value");
    if (!(o->sigma_b2 >= 0) || !isfinite(o->sigma_b2))
        return TPK_ERROR(ctx, TPK_EDOM, "--sigma-b2 must be a variance >= 0 (got %s)",
                         o->sigma_b2 < 0 ? "a negative value" : "a non-finite value");
    if (o->quad_degree < 4 || o->quad_degree > 512)
        return TPK_ERROR(ctx, TPK_EINVAL, "--quad-degree must be in 4..512 (got %d)", o->quad_degree);
    return TPK_OK;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Smallest eigenvalue is costly for big N; report symmetry and the diagonal range instead. */
static void summarise(const opts *o, const tpk_array *X, const tpk_array *K, const tpk_array *Xt,
                      double err, double secs)
{
    size_t n = K->dims[0];
    double dmin = INFINITY, dmax = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        dmin = fmin(dmin, K->data[i * n + i]);
        dmax = fmax(dmax, K->data[i * n + i]);
    }
    printf("gpkernel: arch=%s depth=%d phi=%s sigma_w2=%g sigma_b2=%g\n", o->arch, o->depth, o->phi,
           o->sigma_w2, o->sigma_b2);
    printf("  input   %s (N=%zu, d=%zu)\n", o->input, X->dims[0], tpk_array_item_size(X));
    if (Xt)
        printf("  test    %s (M=%zu)\n", o->test, Xt->dims[0]);
    printf("  kernel  %zux%zu, diagonal in [%.6g, %.6g], K[0][1]=%.6g, error estimate %.2e\n", n, n,
           dmin, dmax, n > 1 ? K->data[1] : K->data[0], err);
    printf("  wrote   %s in %.3f s\n", o->output, secs);
}

static int write_attrs(tpk_h5out *out, const opts *o, int argc, char **argv, const tpk_array *X,
                       const tpk_input_info *xi, const tpk_array *Xt, const tpk_input_info *ti,
                       double err, tpk_ctx *ctx)
{
    int st = tpk_h5out_provenance(out, argc, argv, ctx);
    if (!st) st = tpk_h5out_attr_str(out, "/", "architecture", o->arch, ctx);
    if (!st) st = tpk_h5out_attr_str(out, "/", "phi", o->phi, ctx);
    if (!st) st = tpk_h5out_attr_int(out, "/", "depth", o->depth, ctx);
    if (!st) st = tpk_h5out_attr_double(out, "/", "sigma_w2", o->sigma_w2, ctx);
    if (!st) st = tpk_h5out_attr_double(out, "/", "sigma_b2", o->sigma_b2, ctx);
    if (!st) st = tpk_h5out_attr_int(out, "/", "quad_degree", o->quad_degree, ctx);
    if (!st) st = tpk_h5out_attr_str(out, "/", "convention",
                                     "Sigma^1 = sigma_w2 <x,x'>/d + sigma_b2; Sigma^{l+1} = sigma_w2 "
                                     "E[phi(u)phi(v)] + sigma_b2; output Sigma^{depth+1}", ctx);
    if (!st) st = tpk_h5out_attr_double(out, "/", "error_estimate", err, ctx);
    if (!st) st = tpk_h5out_input_attrs(out, "input", xi, X, ctx);
    if (!st && Xt) st = tpk_h5out_input_attrs(out, "test", ti, Xt, ctx);
    return st;
}

static int run(int argc, char **argv, tpk_ctx *ctx)
{
    opts o = {.phi = "relu", .depth = 3, .sigma_w2 = 2.0, .sigma_b2 = 0.0,
              .quad_degree = TPK_GAUSS_DEFAULT_DEGREE};
    char demo[4200];
    o.input = find_demo(demo, sizeof demo);
    tpk_phi_registry *reg = tpk_phi_registry_alloc(ctx);
    if (!reg)
        return ctx->status;
    tpk_phi *phi = NULL;
    tpk_gauss_ws *ws = NULL;
    tpk_array *X = NULL, *Xt = NULL, *K = NULL, *Kxt = NULL, *kd = NULL;
    tpk_h5out *out = NULL;
    tpk_input_info xi, ti;

    int st = parse_args(argc, argv, &o, reg, ctx);
    if (st == EXIT_EARLY) {
        tpk_phi_registry_free(reg);
        return TPK_OK;
    }
    if (st)
        goto done;
    phi = tpk_phi_alloc(reg, o.phi, ctx);
    if (!phi) { st = ctx->status; goto done; }
    X = tpk_io_read(o.input, &xi, ctx);
    if (!X) { st = ctx->status; goto done; }
    if (o.test) {
        Xt = tpk_io_read(o.test, &ti, ctx);
        if (!Xt) { st = ctx->status; goto done; }
        if (tpk_array_item_size(Xt) != tpk_array_item_size(X)) {
            st = TPK_ERROR(ctx, TPK_EINVAL, "%s: test inputs have dimension %zu but %s has %zu",
                           o.test, tpk_array_item_size(Xt), o.input, tpk_array_item_size(X));
            goto done;
        }
    }
    /* Open the output before computing: an unwritable path fails in milliseconds, not after. */
    out = tpk_h5out_open(o.output, ctx);
    if (!out) { st = ctx->status; goto done; }
    if (!tpk_phi_has_closed_form(phi)) {
        ws = tpk_gauss_ws_alloc((size_t)o.quad_degree, ctx);
        if (!ws) { st = ctx->status; goto done; }
    }
    size_t n = X->dims[0];
    K = tpk_array_alloc2(n, n, ctx);
    if (!K) { st = ctx->status; goto done; }
    if (Xt) {
        size_t m = Xt->dims[0];
        Kxt = tpk_array_alloc2(m, n, ctx);
        size_t dm[1] = {m};
        kd = tpk_array_alloc(1, dm, ctx);
        if (!Kxt || !kd) { st = ctx->status; goto done; }
    }
    double t0 = now_seconds(), err = 0;
    tpk_mlp_params p = {.depth = o.depth, .phi = phi, .sigma_w2 = o.sigma_w2, .sigma_b2 = o.sigma_b2};
    st = tpk_mlp_kernel(&p, X, Xt, ws, K, Kxt, kd, &err, ctx);
    if (st) goto done;
    st = tpk_h5out_write(out, "/kernel", K, ctx);
    if (!st && Xt) st = tpk_h5out_write(out, "/kernel_test_train", Kxt, ctx);
    if (!st && Xt) st = tpk_h5out_write(out, "/kernel_test_diag", kd, ctx);
    if (!st) st = write_attrs(out, &o, argc, argv, X, &xi, Xt, &ti, err, ctx);
    if (st) goto done;
    st = tpk_h5out_commit(out, ctx);
    out = NULL;
    if (st) goto done;
    if (!o.quiet)
        summarise(&o, X, K, Xt, err, now_seconds() - t0);
done:
    tpk_h5out_abort(out);
    tpk_array_free(X);
    tpk_array_free(Xt);
    tpk_array_free(K);
    tpk_array_free(Kxt);
    tpk_array_free(kd);
    tpk_gauss_ws_free(ws);
    tpk_phi_free(phi);
    tpk_phi_registry_free(reg);
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
