/* gpregress: GP regression (and classification as regression on one-hot targets) with NNGP, RBF or
 * precomputed kernels; noise and hyperparameters by the training marginal likelihood. */
#include "tpk/tpk.h"
#include "tpk/gp.h"
#include "tpk/idx.h"
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

/* Automatic noise: σ²/s searched over this range relative to the mean diagonal of K. */
#define NOISE_REL_LO 1e-7
#define NOISE_REL_HI 1e2
/* Default size of the training subsample on which noise / hyperparameters are chosen. */
#define SELECT_N_DEFAULT 2000
/* Full-size noise search (tpk_gp_fit_search_noise): steps in decades of σ², the first kernel's
 * wider (no shift known yet), and the default number of factorisations. */
#define NOISE_STEP_FIRST 0.5
#define NOISE_STEP_NEXT 0.3
#define NOISE_FITS_DEFAULT 5
/* Class labels must be small non-negative integers. */
#define MAX_CLASSES 100000

typedef struct opts {
    const char *arch, *kernel_file, *train, *test, *labels, *test_labels, *output, *phi, *fix;
    int depth_lo, depth_hi, quad_degree;
    double sigma_w2, sigma_b2, lengthscale2, amplitude, noise;
    int noise_auto, fit_scale, fit_hyper, classify, center, unit_norm, full_cov, no_var, quiet;
    long n_train, n_test, select_n, var_n;
    int noise_fits;
} opts;

static const char usage[] =
    "Usage: gpregress (--arch=mlp|rbf --train=SPEC | --kernel=FILE.h5) --labels=SPEC\n"
    "                 [--test=SPEC] [--test-labels=SPEC] [options] --output=FILE.h5\n"
    "Gaussian-process regression with an infinite-width network kernel (NNGP), an RBF kernel or\n"
    "a precomputed kernel; with --classify, classification as regression on one-hot targets.\n"
    "\n"
    "Kernel:\n"
    "  --arch=mlp         deep MLP NNGP (tpk_mlp_kernel; see gpkernel --help for the convention)\n"
    "  --arch=rbf         RBF baseline s*exp(-|x-x'|^2/(2 l2)) (not a network)\n"
    "  --kernel=FILE.h5   precomputed, as gpkernel --test writes: /kernel (N×N),\n"
    "                     /kernel_test_train (M×N), /kernel_test_diag (M), optional\n"
    "                     /kernel_test_test (M×M, for --full-cov)\n"
    "  --depth=L|A-B      hidden layers, or a range swept one layer at a time (default 3)\n"
    "  --phi=NAME         nonlinearity (default relu)\n"
    "  --sigma-w2=V --sigma-b2=V   weight and bias variances (default 2, 0)\n"
    "  --lengthscale2=V --amplitude=V   RBF parameters (default 1, 1)\n"
    "  --quad-degree=D    Gauss-Hermite degree for phi without closed form (default 64)\n"
    "Data:\n"
    "  --train=SPEC --test=SPEC    inputs: FILE.h5:/ds, FILE.npy, FILE.csv, or IDX (NAME-ubyte[.gz])\n"
    "  --labels=SPEC --test-labels=SPEC   targets N×C, or class labels (N) with --classify\n"
    "  --n-train=N --n-test=M      use the first N training / M test items only\n"
    "  --center           subtract the training mean of each feature (train and test)\n"
    "  --unit-norm        scale each item to unit Euclidean norm (after --center)\n"
    "  --classify         one-hot targets from integer labels; report test accuracy\n"
    "Noise and hyperparameters (never chosen by test data):\n"
    "  --noise=V|auto     noise variance; auto (default) maximises the training log marginal\n"
    "                     likelihood over the noise and an output scale s (cov s*(K + r I)) on an\n"
    "                     eigendecomposition of the first --select-n training points\n"
    "  --no-scale         with --noise=auto, hold s = 1\n"
    "  --fit-hyper        maximise the LML over kernel parameters and noise (GSL BFGS) on the\n"
    "                     first --select-n training points; with a depth range, every depth\n"
    "  --fix=NAMES        hold these during --fit-hyper (comma list: sigma_w2, sigma_b2,\n"
    "                     lengthscale2, amplitude, noise)\n"
    "  --select-n=N       subsample size for --noise=auto and --fit-hyper (default 2000)\n"
    "Output:\n"
    "  --output=FILE.h5   written atomically: mean (M×C), var (M, latent, scaled by s), and per\n"
    "                     kernel the noise, scale, LML, jitter, rcond, accuracy, NLL; a depth range\n"
    "                     puts each depth under /depth_L and the summary in /depths, /accuracy, ...\n"
    "  --full-cov         also the full latent predictive covariance /cov (M×M)\n"
    "  --no-var           skip the predictive variance (and the NLL)\n"
    "  --quiet, --help, --version\n";

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

static int parse_long(const char *name, const char *s, long lo, long *out, tpk_ctx *ctx)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || errno == ERANGE || v < lo || v > 1000000000L)
        return TPK_ERROR(ctx, TPK_EINVAL, "--%s: '%s' is not an integer >= %ld", name, s, lo);
    *out = v;
    return TPK_OK;
}

static int parse_depth(const char *s, opts *o, tpk_ctx *ctx)
{
    long a, b;
    const char *dash = strchr(s, '-');
    if (!dash) {
        if (parse_long("depth", s, 1, &a, ctx))
            return ctx->status;
        o->depth_lo = o->depth_hi = (int)a;
        return TPK_OK;
    }
    char buf[64];
    size_t k = (size_t)(dash - s);
    if (k == 0 || k >= sizeof buf)
        return TPK_ERROR(ctx, TPK_EINVAL, "--depth: '%s' is not L or A-B", s);
    memcpy(buf, s, k);
    buf[k] = '\0';
    if (parse_long("depth", buf, 1, &a, ctx) || parse_long("depth", dash + 1, 1, &b, ctx))
        return ctx->status;
    if (b < a || b > 1000)
        return TPK_ERROR(ctx, TPK_EINVAL, "--depth: range '%s' must have 1 <= A <= B <= 1000", s);
    o->depth_lo = (int)a;
    o->depth_hi = (int)b;
    return TPK_OK;
}

enum { O_ARCH = 256, O_KERNEL, O_TRAIN, O_TEST, O_LABELS, O_TLABELS, O_OUTPUT, O_PHI, O_DEPTH,
       O_SW2, O_SB2, O_L2, O_AMP, O_QDEG, O_NOISE, O_NOSCALE, O_FITH, O_FIX, O_SELN, O_NTRAIN,
       O_NTEST, O_NFITS, O_VARN, O_CENTER, O_UNIT, O_CLASSIFY, O_FULLCOV, O_NOVAR, O_QUIET, O_HELP, O_VERSION };

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
    {NULL, 0, NULL, 0}};

static int check_var(const char *name, double v, int positive, tpk_ctx *ctx)
{
    if (!isfinite(v) || v < 0 || (positive && v == 0))
        return TPK_ERROR(ctx, TPK_EDOM, "--%s must be a finite value %s 0 (got %g)", name,
                         positive ? ">" : ">=", v);
    return TPK_OK;
}

/* Returns TPK_OK (with *done set after --help/--version) or an error status. */
static int parse_args(int argc, char **argv, opts *o, int *done, tpk_ctx *ctx)
{
    int c, st = TPK_OK;
    opterr = 0;
    while (st == TPK_OK && (c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case O_ARCH: o->arch = optarg; break;
        case O_KERNEL: o->kernel_file = optarg; break;
        case O_TRAIN: o->train = optarg; break;
        case O_TEST: o->test = optarg; break;
        case O_LABELS: o->labels = optarg; break;
        case O_TLABELS: o->test_labels = optarg; break;
        case O_OUTPUT: o->output = optarg; break;
        case O_PHI: o->phi = optarg; break;
        case O_DEPTH: st = parse_depth(optarg, o, ctx); break;
        case O_SW2: st = parse_double("sigma-w2", optarg, &o->sigma_w2, ctx); break;
        case O_SB2: st = parse_double("sigma-b2", optarg, &o->sigma_b2, ctx); break;
        case O_L2: st = parse_double("lengthscale2", optarg, &o->lengthscale2, ctx); break;
        case O_AMP: st = parse_double("amplitude", optarg, &o->amplitude, ctx); break;
        case O_QDEG: {
            long v;
            st = parse_long("quad-degree", optarg, 4, &v, ctx);
            o->quad_degree = (int)v;
            break;
        }
        case O_NOISE:
            o->noise_auto = strcmp(optarg, "auto") == 0;
            if (!o->noise_auto)
                st = parse_double("noise", optarg, &o->noise, ctx);
            break;
        case O_NOSCALE: o->fit_scale = 0; break;
        case O_FITH: o->fit_hyper = 1; break;
        case O_FIX: o->fix = optarg; break;
        case O_SELN: st = parse_long("select-n", optarg, 2, &o->select_n, ctx); break;
        case O_NFITS: {
            long v;
            st = parse_long("noise-fits", optarg, 0, &v, ctx);
            o->noise_fits = (int)v;
            break;
        }
        case O_VARN: st = parse_long("var-n", optarg, 1, &o->var_n, ctx); break;
        case O_NTRAIN: st = parse_long("n-train", optarg, 1, &o->n_train, ctx); break;
        case O_NTEST: st = parse_long("n-test", optarg, 1, &o->n_test, ctx); break;
        case O_CENTER: o->center = 1; break;
        case O_UNIT: o->unit_norm = 1; break;
        case O_CLASSIFY: o->classify = 1; break;
        case O_FULLCOV: o->full_cov = 1; break;
        case O_NOVAR: o->no_var = 1; break;
        case O_QUIET: o->quiet = 1; break;
        case O_HELP: fputs(usage, stdout); *done = 1; return TPK_OK;
        case O_VERSION: printf("gpregress (tpk) %s\n", TPK_VERSION); *done = 1; return TPK_OK;
        default:
            return TPK_ERROR(ctx, TPK_EINVAL, "unknown or malformed option '%s' (see --help)",
                             argv[optind - 1]);
        }
    }
    if (st)
        return st;
    if (optind < argc)
        return TPK_ERROR(ctx, TPK_EINVAL, "unexpected argument '%s' (see --help)", argv[optind]);
    if (!!o->arch == !!o->kernel_file)
        return TPK_ERROR(ctx, TPK_EINVAL, "give exactly one of --arch and --kernel (see --help)");
    if (o->arch && strcmp(o->arch, "mlp") != 0 && strcmp(o->arch, "rbf") != 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "unknown --arch '%s' (known: mlp, rbf)", o->arch);
    if (o->arch && !o->train)
        return TPK_ERROR(ctx, TPK_EINVAL, "--arch=%s needs --train=SPEC", o->arch);
    if (o->kernel_file && (o->train || o->test || o->center || o->unit_norm))
        return TPK_ERROR(ctx, TPK_EINVAL,
                         "--kernel takes precomputed kernels: --train/--test/--center/--unit-norm "
                         "do not apply");
    if (!o->labels)
        return TPK_ERROR(ctx, TPK_EINVAL, "missing --labels=SPEC (training targets)");
    if (!o->output)
        return TPK_ERROR(ctx, TPK_EINVAL, "missing --output=FILE.h5");
    if (o->test_labels && !o->test && !o->kernel_file)
        return TPK_ERROR(ctx, TPK_EINVAL, "--test-labels needs --test");
    if (o->depth_lo != o->depth_hi && !(o->arch && strcmp(o->arch, "mlp") == 0))
        return TPK_ERROR(ctx, TPK_EINVAL, "a --depth range needs --arch=mlp");
    if (o->full_cov && o->depth_lo != o->depth_hi)
        return TPK_ERROR(ctx, TPK_EINVAL, "--full-cov takes a single depth");
    if (o->fit_hyper && o->kernel_file)
        return TPK_ERROR(ctx, TPK_EINVAL, "--fit-hyper needs a kernel family (--arch), not --kernel");
    if (!o->noise_auto && (st = check_var("noise", o->noise, 0, ctx)))
        return st;
    if ((st = check_var("sigma-w2", o->sigma_w2, 0, ctx)) ||
        (st = check_var("sigma-b2", o->sigma_b2, 0, ctx)) ||
        (st = check_var("lengthscale2", o->lengthscale2, 1, ctx)) ||
        (st = check_var("amplitude", o->amplitude, 1, ctx)))
        return st;
    if (o->quad_degree > 512)
        return TPK_ERROR(ctx, TPK_EINVAL, "--quad-degree must be in 4..512 (got %d)", o->quad_degree);
    return TPK_OK;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- inputs ---------------------------------------------------------------------------------- */

static tpk_array *read_any(const char *spec, long limit, tpk_input_info *info, tpk_ctx *ctx)
{
    tpk_array *a;
    memset(info, 0, sizeof *info);
    if (tpk_idx_name_matches(spec)) {
        a = tpk_idx_read(spec, limit > 0 ? (size_t)limit : 0, ctx);
        if (!a)
            return NULL;
        snprintf(info->path, sizeof info->path, "%s", spec);
        snprintf(info->format, sizeof info->format, "idx");
    } else {
        a = tpk_io_read(spec, info, ctx);
        if (!a)
            return NULL;
        if (limit > 0 && a->dims[0] > (size_t)limit)
            a->dims[0] = (size_t)limit; /* the rows beyond stay allocated, unused */
        else
            return a;
    }
    tpk_sha256_array_hex(a, info->sha256);
    return a;
}

/* A view of the first `rows` items of a (no copy). */
static tpk_array head_view(const tpk_array *a, size_t rows)
{
    tpk_array v = *a;
    v.dims[0] = rows;
    return v;
}

static void preprocess(const opts *o, tpk_array *X, tpk_array *Xt)
{
    const size_t n = X->dims[0], d = tpk_array_item_size(X);
    if (o->center) {
        double *mu = calloc(d, sizeof *mu);
        if (mu) {
            for (size_t i = 0; i < n; i++)
                for (size_t j = 0; j < d; j++)
                    mu[j] += X->data[i * d + j];
            for (size_t j = 0; j < d; j++)
                mu[j] /= (double)n;
            for (size_t i = 0; i < n; i++)
                for (size_t j = 0; j < d; j++)
                    X->data[i * d + j] -= mu[j];
            for (size_t i = 0; Xt && i < Xt->dims[0]; i++)
                for (size_t j = 0; j < d; j++)
                    Xt->data[i * d + j] -= mu[j];
        }
        free(mu);
    }
    if (o->unit_norm) {
        tpk_array *arr[2] = {X, Xt};
        for (int a = 0; a < 2; a++) {
            if (!arr[a])
                continue;
            for (size_t i = 0; i < arr[a]->dims[0]; i++) {
                double *r = arr[a]->data + i * d, s = 0;
                for (size_t j = 0; j < d; j++)
                    s += r[j] * r[j];
                if (s > 0)
                    for (size_t j = 0; j < d; j++)
                        r[j] /= sqrt(s);
            }
        }
    }
}

/* Class labels (N or N×1, integers in 0..MAX_CLASSES-1). */
static int check_labels(const char *spec, const tpk_array *L, tpk_ctx *ctx)
{
    if (tpk_array_item_size(L) != 1)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: --classify needs one integer label per item (got "
                         "%zu values per item)", spec, tpk_array_item_size(L));
    for (size_t i = 0; i < L->dims[0]; i++) {
        double v = L->data[i];
        if (v < 0 || v >= MAX_CLASSES || v != floor(v))
            return TPK_ERROR(ctx, TPK_EINVAL, "%s: label %g at item %zu is not a class index in "
                             "0..%d", spec, v, i, MAX_CLASSES - 1);
    }
    return TPK_OK;
}

static tpk_array *one_hot(const tpk_array *L, size_t c, tpk_ctx *ctx)
{
    tpk_array *Y = tpk_array_alloc2(L->dims[0], c, ctx);
    if (Y)
        for (size_t i = 0; i < L->dims[0]; i++)
            Y->data[i * c + (size_t)L->data[i]] = 1.0;
    return Y;
}

/* ---- one kernel: choose noise, fit, predict, score, write ------------------------------------ */

typedef struct run_state {
    const opts *o;
    tpk_h5out *out;
    const tpk_array *Y;    /* N×C training targets */
    const tpk_array *Yt;   /* M×C test targets or NULL */
    const tpk_array *Lt;   /* test class labels or NULL */
    size_t n, m, c;
    double *work;          /* N×N factor workspace (when K must survive) */
    double noise_shift;    /* full-size / subsample optimal noise ratio of the last kernel */
    int last_fits;         /* factorisations the last noise search used */
    int multi;             /* results go under /depth_L */
    int nres;
    double *res;           /* per kernel: depth, noise, scale, lml, lml_select, jitter, rcond,
                            * accuracy, nll, rmse, seconds */
    const tpk_array *Ktt;  /* for --full-cov */
} run_state;

enum { R_DEPTH, R_NOISE, R_SCALE, R_LML, R_LMLSEL, R_JITTER, R_RCOND, R_ACC, R_NLL, R_RMSE,
       R_SECS, R_NFIELDS };
static const char *const res_names[R_NFIELDS] = {
    "depths", "noise", "scale", "lml", "lml_select", "jitter", "rcond", "accuracy", "nll", "rmse",
    "seconds"};

static double mean_diag(const tpk_array *K)
{
    const size_t n = K->dims[0];
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += K->data[i * n + i];
    return s / (double)n;
}

/* Noise by the LML on the first select_n points (eigendecomposition). r = σ²/s. */
static int choose_noise(run_state *rs, const tpk_array *K, double *r, double *s, double *lml_sel,
                        tpk_ctx *ctx)
{
    const size_t n = rs->n;
    const size_t k = rs->o->select_n < (long)n ? (size_t)rs->o->select_n : n;
    tpk_array *Ks = tpk_array_alloc2(k, k, ctx);
    if (!Ks)
        return ctx->status;
    for (size_t i = 0; i < k; i++)
        memcpy(Ks->data + i * k, K->data + i * n, k * sizeof(double));
    tpk_array Ys = head_view(rs->Y, k);
    tpk_gp_spectral *sp = tpk_gp_spectral_alloc(Ks, &Ys, ctx);
    int st = sp ? TPK_OK : ctx->status;
    tpk_gp_noise_choice ch = {0};
    if (!st) {
        double md = mean_diag(Ks);
        if (!(md > 0))
            md = 1;
        st = tpk_gp_spectral_choose_noise(sp, NOISE_REL_LO * md, NOISE_REL_HI * md,
                                          rs->o->fit_scale, &ch, ctx);
    }
    if (!st) {
        *s = ch.scale;
        *r = ch.noise / ch.scale;
        *lml_sel = ch.lml;
        if (ch.at_bound && !rs->o->quiet)
            fprintf(stderr, "gpregress: warning: the LML-optimal noise sits at the edge of the "
                            "searched range (%g)\n", ch.noise);
    }
    tpk_gp_spectral_free(sp);
    tpk_array_free(Ks);
    return st;
}

static int write_block(run_state *rs, const char *prefix, const char *name, const tpk_array *a,
                       tpk_ctx *ctx)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s", prefix, name);
    return tpk_h5out_write(rs->out, path, a, ctx);
}

/* K is consumed (overwritten by its factor) when Kmut != NULL; else it is copied to rs->work.
 * noise < 0: choose it. */
static int evaluate(run_state *rs, int depth, tpk_array *Kmut, const tpk_array *K,
                    const tpk_array *Kxt, const tpk_array *kdiag, double noise, tpk_ctx *ctx)
{
    const double t0 = now_seconds();
    const opts *o = rs->o;
    const size_t n = rs->n, c = rs->c;
    double *r = rs->res + (size_t)rs->nres * R_NFIELDS;
    for (int f = 0; f < R_NFIELDS; f++)
        r[f] = NAN;
    r[R_DEPTH] = depth;
    double ratio = noise, scale = 1.0;
    int st = TPK_OK;
    if (noise < 0 && (st = choose_noise(rs, K, &ratio, &scale, &r[R_LMLSEL], ctx)))
        return st;
    tpk_gp_options go;
    tpk_gp_options_default(&go);
    go.overwrite_k = 1;
    tpk_array A = *K;
    if (!Kmut) {
        memcpy(rs->work, K->data, n * n * sizeof(double));
        A.data = rs->work;
    }
    tpk_gp *gp;
    rs->last_fits = 0;
    const size_t k_sel = o->select_n < (long)n ? (size_t)o->select_n : n;
    if (noise < 0 && k_sel < n && o->noise_fits > 0) {
        /* The subsample's optimum is biased (the LML-optimal noise falls as N grows): walk from
         * it, shifted by the shift the previous kernel of this run needed, at full size. */
        const double sub = ratio;
        tpk_gp_noise_choice ch = {0};
        gp = tpk_gp_fit_search_noise(&A, rs->Y, sub * rs->noise_shift,
                                     rs->nres ? NOISE_STEP_NEXT : NOISE_STEP_FIRST, o->noise_fits,
                                     o->fit_scale, &go, &ch, ctx);
        if (gp) {
            ratio = ch.noise / ch.scale;
            scale = ch.scale;
            rs->noise_shift = ratio / sub;
            rs->last_fits = ch.fits;
            if (ch.at_bound && !o->quiet)
                fprintf(stderr, "gpregress: warning: noise search used its %d factorisations "
                                "without bracketing the optimum; took the best seen\n",
                        o->noise_fits);
        }
    } else {
        gp = tpk_gp_fit(&A, rs->Y, ratio, &go, ctx);
    }
    const tpk_gp_info *in = tpk_gp_get_info(gp);
    tpk_array *mean = NULL, *var = NULL, *cov = NULL;
    r[R_NOISE] = ratio * scale;
    r[R_SCALE] = scale;
    r[R_JITTER] = in->jitter * scale;
    if ((st = tpk_gp_rcond(gp, &r[R_RCOND], ctx)))
        goto done;
    /* log N(Y; 0, s·A) from the fit of A. */
    r[R_LML] = -0.5 * in->quad / scale - 0.5 * (double)c * (in->logdet + (double)n * log(scale)) -
               0.5 * (double)(n * c) * log(2 * M_PI);
    char prefix[64] = "";
    if (rs->multi)
        snprintf(prefix, sizeof prefix, "/depth_%d", depth);
    if (Kxt) {
        const size_t m = rs->m;
        const size_t mv = o->var_n > 0 && (size_t)o->var_n < m ? (size_t)o->var_n : m;
        mean = tpk_array_alloc2(m, c, ctx);
        size_t dm[1] = {mv};
        if (!o->no_var)
            var = tpk_array_alloc(1, dm, ctx);
        if (!mean || (!o->no_var && !var)) {
            st = ctx->status;
            goto done;
        }
        if ((st = tpk_gp_predict(gp, Kxt, NULL, mean, NULL, ctx)))
            goto done;
        if (var) {
            /* Variances of the first mv test items (the O(N²) per item part). */
            tpk_array kh = head_view(Kxt, mv), dh = head_view(kdiag, mv);
            tpk_array *mh = tpk_array_alloc2(mv, c, ctx);
            if (!mh || (st = tpk_gp_predict(gp, &kh, &dh, mh, var, ctx))) {
                tpk_array_free(mh);
                st = ctx->status;
                goto done;
            }
            tpk_array_free(mh);
            for (size_t i = 0; i < mv; i++)
                var->data[i] *= scale;
        }
        if (o->full_cov && rs->Ktt) {
            if (!(cov = tpk_array_alloc2(m, m, ctx)) ||
                (st = tpk_gp_predict_cov(gp, Kxt, rs->Ktt, cov, ctx)))
                goto done;
            for (size_t i = 0; i < m * m; i++)
                cov->data[i] *= scale;
        }
        if (rs->Lt) {
            size_t hits = 0;
            for (size_t i = 0; i < m; i++) {
                size_t best = 0;
                for (size_t k = 1; k < c; k++)
                    if (mean->data[i * c + k] > mean->data[i * c + best])
                        best = k;
                hits += (double)best == rs->Lt->data[i];
            }
            r[R_ACC] = (double)hits / (double)m;
        }
        if (rs->Yt) {
            double se = 0, nll = 0;
            for (size_t i = 0; i < m; i++)
                for (size_t k = 0; k < c; k++) {
                    double e = rs->Yt->data[i * c + k] - mean->data[i * c + k];
                    se += e * e;
                    if (var && i < mv) { /* predictive density of the noisy target */
                        double v = var->data[i] + ratio * scale;
                        nll += 0.5 * log(2 * M_PI * v) + 0.5 * e * e / v;
                    }
                }
            r[R_RMSE] = sqrt(se / (double)(m * c));
            r[R_NLL] = var ? nll / (double)mv : NAN;
        }
        st = write_block(rs, prefix, "mean", mean, ctx);
        if (!st && var)
            st = write_block(rs, prefix, "var", var, ctx);
        if (!st && cov)
            st = write_block(rs, prefix, "cov", cov, ctx);
        if (st)
            goto done;
    }
    r[R_SECS] = now_seconds() - t0;
    if (!o->quiet) {
        if (depth)
            printf("  depth %-2d", depth);
        else
            printf("  kernel  ");
        printf(" noise %.4g  scale %.4g  lml/(NC) %+.6f", r[R_NOISE], scale,
               r[R_LML] / (double)(n * c));
        if (rs->last_fits)
            printf(" (%d fits)", rs->last_fits);
        if (in->jitter > 0)
            printf("  jitter %.3g", r[R_JITTER]);
        printf("  rcond %.2e", r[R_RCOND]);
        if (!isnan(r[R_ACC]))
            printf("  accuracy %.4f", r[R_ACC]);
        if (!isnan(r[R_NLL]))
            printf("  nll %.4f", r[R_NLL]);
        else if (!isnan(r[R_RMSE]))
            printf("  rmse %.4g", r[R_RMSE]);
        printf("  (%.1f s)\n", r[R_SECS]);
        fflush(stdout);
    }
    rs->nres++;
done:
    tpk_array_free(mean);
    tpk_array_free(var);
    tpk_array_free(cov);
    tpk_gp_free(gp);
    return st;
}

typedef struct sweep_arg {
    run_state *rs;
    const opts *o;
} sweep_arg;

static int sweep_cb(int depth, const tpk_array *K, const tpk_array *Kxt, const tpk_array *kdiag,
                    void *data, tpk_ctx *ctx)
{
    sweep_arg *a = data;
    if (depth < a->o->depth_lo)
        return TPK_OK;
    return evaluate(a->rs, depth, NULL, K, Kxt, kdiag, a->o->noise_auto ? -1 : a->o->noise, ctx);
}

static unsigned fixed_mask(const opts *o, const tpk_gp_family *f, tpk_ctx *ctx, int *st)
{
    unsigned mask = 0;
    *st = TPK_OK;
    for (size_t p = 0; p < f->nparams; p++) /* a zero variance cannot move in log scale */
        if ((p == 1 && f->nparams == 2 && strcmp(f->names[1], "sigma_b2") == 0 &&
             o->sigma_b2 == 0))
            mask |= 1u << p;
    if (!o->noise_auto && o->noise == 0)
        mask |= 1u << f->nparams;
    if (!o->fix)
        return mask;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", o->fix);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        size_t p = 0;
        while (p < f->nparams && strcmp(f->names[p], t) != 0)
            p++;
        if (p == f->nparams && strcmp(t, "noise") != 0) {
            *st = TPK_ERROR(ctx, TPK_EINVAL, "--fix: '%s' is not a parameter of this kernel "
                            "(%s, %s, noise)", t, f->names[0], f->names[1]);
            return 0;
        }
        mask |= 1u << p;
    }
    return mask;
}

/* --fit-hyper: BFGS on the first select_n points, then one full fit at the optimum. */
static int fit_hyper_and_run(run_state *rs, const opts *o, const tpk_array *X,
                             const tpk_array *Xt, const tpk_phi *phi, const tpk_gauss_ws *ws,
                             tpk_array *K, tpk_array *Kxt, tpk_array *kd, tpk_ctx *ctx)
{
    const size_t k = o->select_n < (long)rs->n ? (size_t)o->select_n : rs->n;
    tpk_array Xs = head_view(X, k), Ys = head_view(rs->Y, k);
    const int mlp = strcmp(o->arch, "mlp") == 0;
    int st = TPK_OK;
    for (int depth = mlp ? o->depth_lo : 0; depth <= (mlp ? o->depth_hi : 0) && !st; depth++) {
        tpk_mlp_params p = {.depth = depth, .phi = phi, .sigma_w2 = o->sigma_w2,
                            .sigma_b2 = o->sigma_b2};
        tpk_gp_family *f = mlp ? tpk_gp_family_mlp_alloc(&p, &Xs, ws, 0, ctx)
                               : tpk_gp_family_rbf_alloc(&Xs, ctx);
        if (!f)
            return ctx->status;
        double theta[2] = {mlp ? o->sigma_w2 : o->lengthscale2, mlp ? o->sigma_b2 : o->amplitude};
        double noise = o->noise;
        tpk_gp_hyper_options ho;
        tpk_gp_hyper_options_default(&ho);
        ho.fixed = fixed_mask(o, f, ctx, &st);
        tpk_gp_hyper_result hr;
        if (!st && o->noise_auto) {
            /* Start the noise at the LML-best value for the starting kernel. */
            tpk_array *Ks = tpk_array_alloc2(k, k, ctx);
            if (!Ks || (st = f->eval(f, theta, Ks->data, NULL, ctx))) {
                st = ctx->status;
            } else {
                tpk_gp_spectral *sp = tpk_gp_spectral_alloc(Ks, &Ys, ctx);
                tpk_gp_noise_choice ch = {0};
                double md = mean_diag(Ks);
                st = sp ? tpk_gp_spectral_choose_noise(sp, NOISE_REL_LO * md, NOISE_REL_HI * md,
                                                       0, &ch, ctx)
                        : ctx->status;
                noise = ch.noise;
                tpk_gp_spectral_free(sp);
            }
            tpk_array_free(Ks);
        }
        if (!st)
            st = tpk_gp_fit_hyper(f, &Ys, theta, &noise, &ho, &hr, ctx);
        tpk_gp_family_free(f);
        if (st)
            return st;
        if (!o->quiet)
            printf("  fit-hyper%s%.0d on %zu points: %s=%.6g %s=%.6g noise=%.6g lml/(NC) %+.6f "
                   "(%d iterations, %d evaluations%s)\n", mlp ? " depth " : "", depth, k,
                   mlp ? "sigma_w2" : "lengthscale2", theta[0], mlp ? "sigma_b2" : "amplitude",
                   theta[1], noise, hr.lml / (double)(k * rs->c), hr.iters, hr.evals,
                   hr.converged ? "" : ", not converged");
        if (mlp) {
            p.sigma_w2 = theta[0];
            p.sigma_b2 = theta[1];
            st = tpk_mlp_kernel(&p, X, Xt, ws, K, Kxt, kd, NULL, ctx);
        } else {
            st = tpk_gp_rbf_kernel(theta, X, Xt, K, Kxt, kd, ctx);
        }
        if (!st) {
            char prefix[64] = "";
            if (rs->multi)
                snprintf(prefix, sizeof prefix, "/depth_%d", depth);
            char path[128];
            const char *nm[2] = {mlp ? "sigma_w2" : "lengthscale2", mlp ? "sigma_b2" : "amplitude"};
            for (int q = 0; q < 2 && !st; q++) {
                tpk_array v = {.ndim = 1, .dims = {1}, .data = &theta[q]};
                snprintf(path, sizeof path, "%s/fitted_%s", prefix, nm[q]);
                st = tpk_h5out_write(rs->out, path, &v, ctx);
            }
        }
        /* Kernel parameters from the subsample; the noise (and scale) at full size as without
         * --fit-hyper when it is automatic: the subsample's noise is biased upwards. */
        if (!st)
            st = evaluate(rs, depth, rs->multi ? NULL : K, K, Xt ? Kxt : NULL, kd,
                          o->noise_auto ? -1 : noise, ctx);
    }
    return st;
}

static int write_summary(run_state *rs, int argc, char **argv, tpk_ctx *ctx)
{
    const opts *o = rs->o;
    int st = tpk_h5out_provenance(rs->out, argc, argv, ctx);
    tpk_array *col = tpk_array_alloc(1, (size_t[]){(size_t)rs->nres}, ctx);
    if (!col)
        return ctx->status;
    for (int f = 0; f < R_NFIELDS && !st; f++) {
        if (f == R_DEPTH && !rs->multi)
            continue;
        for (int i = 0; i < rs->nres; i++)
            col->data[i] = rs->res[(size_t)i * R_NFIELDS + f];
        char path[64];
        snprintf(path, sizeof path, "/%s", res_names[f]);
        st = tpk_h5out_write(rs->out, path, col, ctx);
    }
    tpk_array_free(col);
    const char *kind = o->kernel_file ? "precomputed" : o->arch;
    if (!st) st = tpk_h5out_attr_str(rs->out, "/", "kernel", kind, ctx);
    if (!st && o->arch && strcmp(o->arch, "mlp") == 0) {
        st = tpk_h5out_attr_str(rs->out, "/", "phi", o->phi, ctx);
        if (!st) st = tpk_h5out_attr_double(rs->out, "/", "sigma_w2", o->sigma_w2, ctx);
        if (!st) st = tpk_h5out_attr_double(rs->out, "/", "sigma_b2", o->sigma_b2, ctx);
    }
    if (!st) st = tpk_h5out_attr_str(rs->out, "/", "noise_selection",
                                     o->fit_hyper ? "fit-hyper: LML by BFGS on a training subsample"
                                     : o->noise_auto ? "auto: training LML, subsample "
                                                       "eigendecomposition then full-size walk, "
                                                       "scale profiled"
                                                     : "fixed", ctx);
    if (!st) st = tpk_h5out_attr_int(rs->out, "/", "select_n", o->select_n, ctx);
    if (!st) st = tpk_h5out_attr_int(rs->out, "/", "noise_fits", o->noise_fits, ctx);
    if (!st) st = tpk_h5out_attr_int(rs->out, "/", "nll_test_items",
                                     o->var_n > 0 && (size_t)o->var_n < rs->m ? o->var_n
                                                                              : (long)rs->m, ctx);
    if (!st) st = tpk_h5out_attr_str(rs->out, "/", "model",
                                     "y_c ~ N(0, scale*(K + (noise/scale) I)) for each output c; "
                                     "var is the latent variance (add noise for targets)", ctx);
    if (!st) st = tpk_h5out_attr_int(rs->out, "/", "classify", o->classify, ctx);
    return st;
}

static int run(int argc, char **argv, tpk_ctx *ctx)
{
    opts o = {.phi = "relu", .depth_lo = 3, .depth_hi = 3, .sigma_w2 = 2.0, .sigma_b2 = 0.0,
              .lengthscale2 = 1.0, .amplitude = 1.0, .noise_auto = 1, .fit_scale = 1,
              .select_n = SELECT_N_DEFAULT, .noise_fits = NOISE_FITS_DEFAULT, .quad_degree = TPK_GAUSS_DEFAULT_DEGREE};
    int done = 0;
    int st = parse_args(argc, argv, &o, &done, ctx);
    if (st || done)
        return st;
    tpk_phi_registry *reg = NULL;
    tpk_phi *phi = NULL;
    tpk_gauss_ws *ws = NULL;
    tpk_array *X = NULL, *Xt = NULL, *L = NULL, *Lt = NULL, *Y = NULL, *Yt = NULL;
    tpk_array *K = NULL, *Kxt = NULL, *kd = NULL, *Ktt = NULL;
    tpk_h5out *out = NULL;
    run_state rs = {.o = &o, .noise_shift = 1.0};
    tpk_input_info xi, ti, li, lti;
    const double t0 = now_seconds();

    if (o.arch && strcmp(o.arch, "mlp") == 0) {
        if (!(reg = tpk_phi_registry_alloc(ctx)) || !(phi = tpk_phi_alloc(reg, o.phi, ctx))) {
            st = ctx->status;
            goto done;
        }
        if (!tpk_phi_has_closed_form(phi) &&
            !(ws = tpk_gauss_ws_alloc((size_t)o.quad_degree, ctx))) {
            st = ctx->status;
            goto done;
        }
    }
    /* Inputs and targets. */
    if (o.kernel_file) {
        char spec[1200];
        snprintf(spec, sizeof spec, "%s:/kernel", o.kernel_file);
        if (!(K = tpk_io_read(spec, &xi, ctx))) {
            st = ctx->status;
            goto done;
        }
        tpk_ctx lc;
        tpk_ctx_init(&lc);
        snprintf(spec, sizeof spec, "%s:/kernel_test_train", o.kernel_file);
        Kxt = tpk_io_read(spec, NULL, &lc);
        if (!Kxt && lc.status != TPK_ENOTFOUND) {
            st = TPK_ERROR(ctx, lc.status, "%s", lc.msg);
            goto done;
        }
        if (Kxt) {
            snprintf(spec, sizeof spec, "%s:/kernel_test_diag", o.kernel_file);
            if (!(kd = tpk_io_read(spec, NULL, ctx))) {
                st = ctx->status;
                goto done;
            }
            if (o.full_cov) {
                snprintf(spec, sizeof spec, "%s:/kernel_test_test", o.kernel_file);
                if (!(Ktt = tpk_io_read(spec, NULL, ctx))) {
                    st = ctx->status;
                    goto done;
                }
            }
        }
        if (K->ndim != 2 || K->dims[0] != K->dims[1]) {
            st = TPK_ERROR(ctx, TPK_EINVAL, "%s: /kernel must be N×N (got %zu×%zu)", o.kernel_file,
                           K->dims[0], tpk_array_item_size(K));
            goto done;
        }
        if (Kxt && (Kxt->dims[1] != K->dims[0] || tpk_array_size(kd) != Kxt->dims[0])) {
            st = TPK_ERROR(ctx, TPK_EINVAL, "%s: /kernel_test_train is %zu×%zu and "
                           "/kernel_test_diag has %zu entries, but /kernel is %zu×%zu",
                           o.kernel_file, Kxt->dims[0], tpk_array_item_size(Kxt),
                           tpk_array_size(kd), K->dims[0], K->dims[0]);
            goto done;
        }
        rs.n = K->dims[0];
        rs.m = Kxt ? Kxt->dims[0] : 0;
    } else {
        if (!(X = read_any(o.train, o.n_train, &xi, ctx))) {
            st = ctx->status;
            goto done;
        }
        if (o.test && !(Xt = read_any(o.test, o.n_test, &ti, ctx))) {
            st = ctx->status;
            goto done;
        }
        if (Xt && tpk_array_item_size(Xt) != tpk_array_item_size(X)) {
            st = TPK_ERROR(ctx, TPK_EINVAL, "%s: test items have %zu values but %s has %zu",
                           o.test, tpk_array_item_size(Xt), o.train, tpk_array_item_size(X));
            goto done;
        }
        rs.n = X->dims[0];
        rs.m = Xt ? Xt->dims[0] : 0;
    }
    if (!(L = read_any(o.labels, (long)rs.n, &li, ctx))) {
        st = ctx->status;
        goto done;
    }
    if (L->dims[0] != rs.n) {
        st = TPK_ERROR(ctx, TPK_EINVAL, "%s has %zu rows but there are %zu training items",
                       o.labels, L->dims[0], rs.n);
        goto done;
    }
    if (o.test_labels) {
        if (!rs.m) {
            st = TPK_ERROR(ctx, TPK_EINVAL, "--test-labels given but no test kernel or inputs");
            goto done;
        }
        if (!(Lt = read_any(o.test_labels, (long)rs.m, &lti, ctx))) {
            st = ctx->status;
            goto done;
        }
        if (Lt->dims[0] != rs.m) {
            st = TPK_ERROR(ctx, TPK_EINVAL, "%s has %zu rows but there are %zu test items",
                           o.test_labels, Lt->dims[0], rs.m);
            goto done;
        }
    }
    if (o.classify) {
        if ((st = check_labels(o.labels, L, ctx)) ||
            (Lt && (st = check_labels(o.test_labels, Lt, ctx))))
            goto done;
        size_t c = 0;
        for (size_t i = 0; i < rs.n; i++)
            c = L->data[i] + 1 > (double)c ? (size_t)L->data[i] + 1 : c;
        for (size_t i = 0; Lt && i < rs.m; i++)
            if (Lt->data[i] >= (double)c) {
                st = TPK_ERROR(ctx, TPK_EINVAL, "%s: test label %g at item %zu never occurs in "
                               "training (classes 0..%zu)", o.test_labels, Lt->data[i], i, c - 1);
                goto done;
            }
        if (c < 2) {
            st = TPK_ERROR(ctx, TPK_EINVAL, "%s: --classify needs at least 2 classes", o.labels);
            goto done;
        }
        if (!(Y = one_hot(L, c, ctx)) || (Lt && !(Yt = one_hot(Lt, c, ctx)))) {
            st = ctx->status;
            goto done;
        }
        rs.c = c;
    } else {
        Y = L;
        L = NULL;
        Y->ndim = 2;
        Y->dims[1] = tpk_array_item_size(Y);
        rs.c = Y->dims[1];
        if (Lt) {
            if (tpk_array_item_size(Lt) != rs.c) {
                st = TPK_ERROR(ctx, TPK_EINVAL, "%s has %zu values per item but %s has %zu",
                               o.test_labels, tpk_array_item_size(Lt), o.labels, rs.c);
                goto done;
            }
            Yt = Lt;
            Lt = NULL;
        }
    }
    rs.Y = Y;
    rs.Yt = Yt;
    rs.Lt = o.classify ? Lt : NULL;
    /* Open the output before the heavy work: an unwritable path fails now. */
    if (!(out = tpk_h5out_open(o.output, ctx))) {
        st = ctx->status;
        goto done;
    }
    rs.out = out;
    if (X)
        preprocess(&o, X, Xt);
    const size_t n = rs.n, m = rs.m;
    const int nk = o.depth_hi - o.depth_lo + 1;
    rs.multi = nk > 1;
    rs.res = calloc((size_t)nk * R_NFIELDS, sizeof(double));
    if (!rs.res) {
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        goto done;
    }
    if (!o.quiet)
        printf("gpregress: %s, N=%zu train, M=%zu test, C=%zu outputs%s\n",
               o.kernel_file ? o.kernel_file : o.arch, n, m, rs.c,
               o.classify ? " (one-hot classes)" : "");
    if (!o.kernel_file) {
        if (!(K = tpk_array_alloc2(n, n, ctx)) ||
            (Xt && (!(Kxt = tpk_array_alloc2(m, n, ctx)) ||
                    !(kd = tpk_array_alloc(1, (size_t[]){m}, ctx))))) {
            st = ctx->status;
            goto done;
        }
        if (o.full_cov && Xt) {
            if (!(Ktt = tpk_array_alloc2(m, m, ctx))) {
                st = ctx->status;
                goto done;
            }
        }
    }
    if (rs.multi && !(rs.work = malloc(n * n * sizeof(double)))) {
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (%zu×%zu workspace)", n, n);
        goto done;
    }
    const int mlp = o.arch && strcmp(o.arch, "mlp") == 0;
    if (o.full_cov && Xt && !o.fit_hyper) {
        tpk_mlp_params p = {.depth = o.depth_lo, .phi = phi, .sigma_w2 = o.sigma_w2,
                            .sigma_b2 = o.sigma_b2};
        st = mlp ? tpk_mlp_kernel(&p, Xt, NULL, ws, Ktt, NULL, NULL, NULL, ctx)
                 : tpk_gp_rbf_kernel((double[]){o.lengthscale2, o.amplitude}, Xt, NULL, Ktt,
                                     NULL, NULL, ctx);
        if (st)
            goto done;
    }
    rs.Ktt = Ktt;
    if (o.full_cov && !Ktt && m) {
        st = TPK_ERROR(ctx, TPK_EINVAL, "--full-cov needs test inputs, or /kernel_test_test in "
                       "the kernel file");
        goto done;
    }
    if (o.fit_hyper) {
        if (o.full_cov) {
            st = TPK_ERROR(ctx, TPK_EINVAL, "--full-cov is not available with --fit-hyper");
            goto done;
        }
        st = fit_hyper_and_run(&rs, &o, X, Xt, phi, ws, K, Kxt, kd, ctx);
    } else if (o.kernel_file) {
        st = evaluate(&rs, 0, K, K, Kxt, kd, o.noise_auto ? -1 : o.noise, ctx);
    } else if (mlp) {
        tpk_mlp_params p = {.depth = o.depth_hi, .phi = phi, .sigma_w2 = o.sigma_w2,
                            .sigma_b2 = o.sigma_b2};
        if (rs.multi) {
            sweep_arg sa = {&rs, &o};
            st = tpk_gp_mlp_sweep(&p, X, Xt, ws, K, Kxt, kd, sweep_cb, &sa, ctx);
        } else {
            st = tpk_mlp_kernel(&p, X, Xt, ws, K, Kxt, kd, NULL, ctx);
            if (!st)
                st = evaluate(&rs, o.depth_lo, K, K, Kxt, kd, o.noise_auto ? -1 : o.noise, ctx);
        }
    } else {
        double th[2] = {o.lengthscale2, o.amplitude};
        st = tpk_gp_rbf_kernel(th, X, Xt, K, Kxt, kd, ctx);
        if (!st)
            st = evaluate(&rs, 0, K, K, Kxt, kd, o.noise_auto ? -1 : o.noise, ctx);
    }
    if (!st)
        st = write_summary(&rs, argc, argv, ctx);
    if (!st && X)
        st = tpk_h5out_input_attrs(out, "input", &xi, X, ctx);
    if (!st && Xt)
        st = tpk_h5out_input_attrs(out, "test", &ti, Xt, ctx);
    if (st)
        goto done;
    st = tpk_h5out_commit(out, ctx);
    out = NULL;
    if (!st && !o.quiet) {
        if (rs.multi && m && o.classify) {
            int b = 0;
            for (int i = 1; i < rs.nres; i++)
                if (rs.res[(size_t)i * R_NFIELDS + R_LML] > rs.res[(size_t)b * R_NFIELDS + R_LML])
                    b = i;
            printf("  depth chosen by training LML: %d (accuracy %.4f)\n",
                   (int)rs.res[(size_t)b * R_NFIELDS + R_DEPTH],
                   rs.res[(size_t)b * R_NFIELDS + R_ACC]);
        }
        printf("  wrote %s in %.1f s\n", o.output, now_seconds() - t0);
    }
done:
    tpk_h5out_abort(out);
    free(rs.work);
    free(rs.res);
    tpk_array_free(X);
    tpk_array_free(Xt);
    tpk_array_free(L);
    tpk_array_free(Lt);
    tpk_array_free(Y);
    tpk_array_free(Yt);
    tpk_array_free(K);
    tpk_array_free(Kxt);
    tpk_array_free(kd);
    tpk_array_free(Ktt);
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
        fprintf(stderr, "gpregress: error: %s\n", ctx.msg[0] ? ctx.msg : tpk_strerror(st));
        return 1;
    }
    return 0;
}
