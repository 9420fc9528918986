/* GP regression experiments (include/tpk/gp.h, what gpregress runs): inputs and targets from
 * files, NNGP / RBF / precomputed kernels, noise and hyperparameters by the training marginal
 * likelihood, predictions and scores per kernel, one atomically written HDF5 file. */
#include "gp-impl.h"
#include "tpk/alloc.h"

#include "tpk/clock.h"
#include "tpk/idx.h"
#include "tpk/io.h"

#include <lapacke.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Default size of the training subsample on which noise / hyperparameters are chosen, and of the
 * full-size noise walk (tpk_gp_fit_search_noise). */
#define SELECT_N_DEFAULT 2000
#define NOISE_FITS_DEFAULT 5
/* Gauss–Hermite degrees the kernels accept, and the deepest network of a sweep. */
#define QUAD_DEGREE_MIN 4
#define QUAD_DEGREE_MAX 512
#define DEPTH_MAX 1000
/* A precomputed kernel must be a covariance. Its entries carry the error of whatever computed
 * them (quadrature, QMC orthants: ~1e-8 relative for the shipped kernels); by Gershgorin an
 * entrywise error ε·mean-diagonal moves the spectrum by at most N·ε·mean-diagonal, so an
 * eigenvalue below −N·PSD_REL_TOL·mean-diagonal is no rounding: the file is not PSD. Symmetry
 * is required to the same relative tolerance. */
#define PSD_REL_TOL TPK_GP_PSD_REL_TOL

typedef tpk_gp_experiment_opts opts;

void tpk_gp_experiment_opts_default(tpk_gp_experiment_opts *o)
{
    *o = (tpk_gp_experiment_opts){.kernel = NULL, .phi = "relu", .depth_lo = 3, .depth_hi = 3,
                                  .quad_degree = TPK_GAUSS_DEFAULT_DEGREE, .sigma_w2 = 2.0,
                                  .sigma_b2 = 0.0, .lengthscale2 = 1.0, .amplitude = 1.0,
                                  .noise_auto = 1, .fit_scale = 1, .select_n = SELECT_N_DEFAULT,
                                  .noise_fits = NOISE_FITS_DEFAULT, .name = "tpk_gp_experiment"};
}

/* An option as its caller spelled it (issue 40): gpregress (o->name "gpregress", or
 * "gpregress-mpi") gave a flag, "--sigma-w2"; a C caller set a field, "sigma_w2 (gpregress
 * --sigma-w2)". Into buf; returns buf. */
static const char *spelled(const opts *o, const char *field, const char *flag, char *buf,
                           size_t len)
{
    if (o->name && strncmp(o->name, "gpregress", 9) == 0)
        snprintf(buf, len, "--%s", flag);
    else
        snprintf(buf, len, "%s (gpregress --%s)", field, flag);
    return buf;
}

static int check_var(const opts *o, const char *field, const char *flag, double v, int positive,
                     tpk_ctx *ctx)
{
    char sp[96];
    if (!isfinite(v) || v < 0 || (positive && v == 0))
        return TPK_ERROR(ctx, TPK_EDOM, "%s must be a finite value %s 0 (got %g)",
                         spelled(o, field, flag, sp, sizeof sp), positive ? ">" : ">=", v);
    return TPK_OK;
}

/* 1 when the experiment needs the NTK beside the NNGP. */
static int wants_ntk(const opts *o)
{
    return o->kernel_type == TPK_GP_KERNEL_NTK || o->predict_gd;
}

/* The NTK's and the dynamics' options. */
static int check_ntk(const opts *o, tpk_ctx *ctx)
{
    char sp[96];
    if (o->kernel_type != TPK_GP_KERNEL_NNGP && o->kernel_type != TPK_GP_KERNEL_NTK)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s must be nngp or ntk (got %d)",
                         spelled(o, "kernel_type", "kernel-type", sp, sizeof sp), o->kernel_type);
    if (wants_ntk(o) && !o->kernel_file && !tpk_gp_experiment_table_kernel(o))
        return TPK_ERROR(ctx, TPK_EINVAL, "the NTK (--kernel-type=ntk, --predict=gd) comes with "
                         "an architecture of the table, a --program or a --kernel file of "
                         "gpkernel --kernel=both: not --arch=rbf, a --depth range or --fit-hyper");
    if (o->ntk_param < TPK_NTK_PARAM_NTK || o->ntk_param > TPK_NTK_PARAM_STANDARD)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s must be ntk, tp or standard (got %d)",
                         spelled(o, "ntk_param", "parameterization", sp, sizeof sp), o->ntk_param);
    if (!o->predict_gd) {
        if (o->ntimes > 0 || o->lr != 0 || o->gd_steps || o->momentum != 0 ||
            o->nfinite_widths > 0)
            return TPK_ERROR(ctx, TPK_EINVAL, "--times, --lr, --steps and --momentum go with "
                             "--predict=gd");
        return TPK_OK;
    }
    if (o->ntimes == 0 || !o->times)
        return TPK_ERROR(ctx, TPK_EINVAL, "--predict=gd needs --times=LIST (e.g. 0,10,100,inf)");
    if (!o->test && !o->kernel_file)
        return TPK_ERROR(ctx, TPK_EINVAL, "--predict=gd predicts on the test set: give --test");
    if (!(o->lr >= 0) || !isfinite(o->lr))
        return TPK_ERROR(ctx, TPK_EINVAL, "%s must be a learning rate > 0 (got %g)",
                         spelled(o, "lr", "lr", sp, sizeof sp), o->lr);
    if (!(o->momentum >= 0 && o->momentum < 1))
        return TPK_ERROR(ctx, TPK_EINVAL, "%s must be in [0, 1) (got %g)",
                         spelled(o, "momentum", "momentum", sp, sizeof sp), o->momentum);
    if (o->nfinite_widths > 0) {
        if (!o->gd_steps || o->kernel_type != TPK_GP_KERNEL_NTK || !o->program || o->momentum > 0)
            return TPK_ERROR(ctx, TPK_EINVAL, "--finite-widths trains the program's networks as "
                             "the prediction does: it needs --program, --steps, "
                             "--kernel-type=ntk and no --momentum");
        if (o->finite_seeds == 1)
            return TPK_ERROR(ctx, TPK_EINVAL, "--finite-seeds must be at least 2 (variances)");
        for (size_t i = 0; i < o->nfinite_widths; i++)
            if (o->finite_widths[i] < 1 || (i > 0 && o->finite_widths[i] <= o->finite_widths[i - 1]))
                return TPK_ERROR(ctx, TPK_EINVAL, "--finite-widths must be increasing widths >= 1");
    }
    if (o->momentum > 0 && !o->gd_steps)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s needs --steps: heavy-ball gradient descent is "
                         "defined step by step", spelled(o, "momentum", "momentum", sp, sizeof sp));
    if (o->full_cov)
        return TPK_ERROR(ctx, TPK_EINVAL, "--full-cov is the posterior's; --predict=gd writes "
                         "the variances of the trained ensemble");
    for (size_t i = 0; i < o->ntimes; i++)
        if (!(o->times[i] >= 0) || (o->gd_steps && isfinite(o->times[i]) &&
                                    o->times[i] != floor(o->times[i])))
            return TPK_ERROR(ctx, TPK_EINVAL, "--times: entry %zu is %g: times are >= 0 (inf: "
                             "converged)%s", i + 1, o->times[i],
                             o->gd_steps ? ", and with --steps whole numbers of steps" : "");
    return TPK_OK;
}

int tpk_gp_experiment_check(const tpk_gp_experiment_opts *o, tpk_ctx *ctx)
{
    int st;
    char sp[96], sp2[96], names[512];
    if (!o)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_gp_experiment_check: NULL options");
    if (!!o->kernel + !!o->kernel_file + !!o->program != 1)
        return TPK_ERROR(ctx, TPK_EINVAL, "give exactly one of %s, %s and %s",
                         spelled(o, "kernel", "arch", sp, sizeof sp),
                         spelled(o, "program", "program", names, sizeof names),
                         spelled(o, "kernel_file", "kernel", sp2, sizeof sp2));
    if (o->kernel && strcmp(o->kernel, "rbf") != 0 && !tpk_arch_find(o->kernel))
        return TPK_ERROR(ctx, TPK_EINVAL, "unknown --arch '%s' (known: rbf, %s)", o->kernel,
                         tpk_arch_names(names, sizeof names));
    if ((o->kernel || o->program) && !o->train)
        return TPK_ERROR(ctx, TPK_EINVAL, "--%s=%s needs --train=SPEC", o->kernel ? "arch"
                         : "program", o->kernel ? o->kernel : o->program);
    if ((o->narch_flags > 0 || o->layernorm) && !o->kernel)
        return TPK_ERROR(ctx, TPK_EINVAL, "architecture flags go with --arch (a --program takes "
                         "--set NAME=VALUE)");
    if (o->nsets > 0 && !tpk_gp_experiment_table_kernel(o))
        return TPK_ERROR(ctx, TPK_EINVAL, "--set goes with --program or an --arch of the table, "
                         "not --arch=rbf or --kernel");
    if (tpk_gp_experiment_table_kernel(o) && o->fit_hyper)
        return TPK_ERROR(ctx, TPK_EINVAL, "--fit-hyper fits gpregress' own kernel families "
                         "(--arch=mlp with --depth, --phi, --sigma-w2, --sigma-b2 only, or rbf), "
                         "not --%s=%s", o->program ? "program" : "arch",
                         o->program ? o->program : o->kernel);
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
    if (o->depth_lo < 1 || o->depth_hi < o->depth_lo || o->depth_hi > DEPTH_MAX)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: range %d-%d must have 1 <= A <= B <= %d",
                         spelled(o, "depth_lo, depth_hi", "depth", sp, sizeof sp), o->depth_lo,
                         o->depth_hi, DEPTH_MAX);
    if (o->depth_lo != o->depth_hi && (!(o->kernel && strcmp(o->kernel, "mlp") == 0) ||
                                       tpk_gp_experiment_table_kernel(o)))
        return TPK_ERROR(ctx, TPK_EINVAL, "a --depth range needs --arch=mlp without other "
                         "architecture flags or --set (gpregress' own recursion)");
    if (o->full_cov && o->depth_lo != o->depth_hi)
        return TPK_ERROR(ctx, TPK_EINVAL, "--full-cov takes a single depth");
    if (o->fit_hyper && o->kernel_file)
        return TPK_ERROR(ctx, TPK_EINVAL, "--fit-hyper needs a kernel family (--arch), not --kernel");
    if (!o->noise_auto && (st = check_var(o, "noise", "noise", o->noise, 0, ctx)))
        return st;
    if ((st = check_var(o, "sigma_w2", "sigma-w2", o->sigma_w2, 0, ctx)) ||
        (st = check_var(o, "sigma_b2", "sigma-b2", o->sigma_b2, 0, ctx)) ||
        (st = check_var(o, "lengthscale2", "lengthscale2", o->lengthscale2, 1, ctx)) ||
        (st = check_var(o, "amplitude", "amplitude", o->amplitude, 1, ctx)))
        return st;
    if (o->quad_degree < QUAD_DEGREE_MIN || o->quad_degree > QUAD_DEGREE_MAX)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s must be in %d..%d (got %d)",
                         spelled(o, "quad_degree", "quad-degree", sp, sizeof sp), QUAD_DEGREE_MIN,
                         QUAD_DEGREE_MAX, o->quad_degree);
    if (o->select_n < 2 || o->noise_fits < 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s must be >= 2 and %s >= 0",
                         spelled(o, "select_n", "select-n", sp, sizeof sp),
                         spelled(o, "noise_fits", "noise-fits", sp2, sizeof sp2));
    if (o->kernel && strcmp(o->kernel, "mlp") == 0 && !tpk_gp_experiment_table_kernel(o) && !o->phi)
        return TPK_ERROR(ctx, TPK_EINVAL, "--arch=mlp needs --phi");
    return check_ntk(o, ctx);
}

/* ---- one kernel: choose noise, fit, predict, score, write ------------------------------------ */

typedef struct run_state {
    const opts *o;
    const tpk_gp_data *d;
    tpk_gp_report *rep;
    size_t n, m, c;
    double *work;          /* N×N factor workspace (when K must survive) */
    int multi;             /* several kernels (a depth range) */
    const tpk_array *Ktt;  /* for full_cov */
} run_state;

/* A view of the first `rows` items of a (no copy). */
static tpk_array head_view(const tpk_array *a, size_t rows)
{
    tpk_array v = *a;
    v.dims[0] = rows;
    return v;
}

/* Noise by the LML on the first select_n points (eigendecomposition). r = σ²/s. */
static int choose_noise(run_state *rs, const tpk_array *K, double *r, double *s, double *lml_sel,
                        tpk_ctx *ctx)
{
    const size_t n = rs->n, k = tpk_gp_select_size(rs->o, n);
    tpk_array *Ks = tpk_array_alloc2(k, k, ctx);
    if (!Ks)
        return ctx->status;
    for (size_t i = 0; i < k; i++)
        memcpy(Ks->data + i * k, K->data + i * n, k * sizeof(double));
    int st = tpk_gp_report_noise_guess(rs->rep, Ks, r, s, lml_sel, ctx);
    tpk_array_free(Ks);
    return st;
}

/* Mean, variances (first var_n items), covariance of the fitted GP: res's kernel reported. */
static int predict(run_state *rs, const tpk_gp *gp, const tpk_array *Kxt, const tpk_array *kdiag,
                   double scale, tpk_gp_result *res, double t0, tpk_ctx *ctx)
{
    const opts *o = rs->o;
    const size_t m = rs->m, c = rs->c;
    const size_t mv = o->var_n > 0 && o->var_n < m ? o->var_n : m;
    tpk_array *mean = NULL, *var = NULL, *cov = NULL;
    int st = TPK_OK;
    if (Kxt) {
        size_t dm[1] = {mv};
        mean = tpk_array_alloc2(m, c, ctx);
        if (mean && !o->no_var)
            var = tpk_array_alloc(1, dm, ctx);
        st = !mean || (!o->no_var && !var) ? ctx->status : TPK_OK;
    }
    if (!st && mean)
        st = tpk_gp_predict(gp, Kxt, NULL, mean, NULL, ctx);
    if (!st && var) {
        /* Variances of the first mv test items (the O(N²) per item part). */
        tpk_array kh = head_view(Kxt, mv), dh = head_view(kdiag, mv);
        tpk_array *mh = tpk_array_alloc2(mv, c, ctx);
        st = mh ? tpk_gp_predict(gp, &kh, &dh, mh, var, ctx) : ctx->status;
        tpk_array_free(mh);
        for (size_t i = 0; !st && i < mv; i++)
            var->data[i] *= scale;
    }
    if (!st && mean && o->full_cov && rs->Ktt) {
        if (!(cov = tpk_array_alloc2(m, m, ctx)) ||
            tpk_gp_predict_cov(gp, Kxt, rs->Ktt, cov, ctx))
            st = ctx->status;
        for (size_t i = 0; !st && i < m * m; i++)
            cov->data[i] *= scale;
    }
    if (!st) {
        res->seconds = tpk_wall_seconds() - t0;
        st = tpk_gp_report_kernel(rs->rep, res, mean, var, cov, ctx);
    }
    tpk_array_free(mean);
    tpk_array_free(var);
    tpk_array_free(cov);
    return st;
}

/* K is consumed (overwritten by its factor) when Kmut != NULL; else it is copied to rs->work.
 * noise < 0: choose it. */
static int evaluate(run_state *rs, int depth, tpk_array *Kmut, const tpk_array *K,
                    const tpk_array *Kxt, const tpk_array *kdiag, double noise, tpk_ctx *ctx)
{
    const double t0 = tpk_wall_seconds();
    const opts *o = rs->o;
    const tpk_array *Y = rs->d->Y;
    const size_t n = rs->n, c = rs->c;
    tpk_gp_result res;
    tpk_gp_result_init(&res, depth);
    double ratio = noise, scale = 1.0;
    int st = TPK_OK;
    if (noise < 0 && (st = choose_noise(rs, K, &ratio, &scale, &res.lml_select, ctx)))
        return st;
    if ((st = tpk_gp_report_advance(rs->rep, ctx))) /* the noise */
        return st;
    /* --noise=0 and a noise below the jitter ask to interpolate: tpk_gp_fit refuses data that
     * has no interpolant, with the words Python's GPRegressor gets too (issue 39, item 3) */
    tpk_gp_options go;
    tpk_gp_options_default(&go);
    go.overwrite_k = 1;
    go.data = o->kernel_file ? o->kernel_file : o->train;
    go.noise_name = "--noise";
    go.noise_auto = "--noise=auto";
    tpk_array A = *K;
    if (!Kmut) {
        memcpy(rs->work, K->data, n * n * sizeof(double));
        A.data = rs->work;
    }
    tpk_gp *gp;
    if (noise < 0 && tpk_gp_select_size(o, n) < n && o->noise_fits > 0) {
        /* the subsample's choice, walked at full size */
        const double sub = ratio;
        double guess, step;
        tpk_gp_report_noise_start(rs->rep, sub, &guess, &step);
        tpk_gp_noise_choice ch = {0};
        gp = tpk_gp_fit_search_noise(&A, Y, guess, step, o->noise_fits, o->fit_scale, &go, &ch,
                                     ctx);
        if (gp) {
            ratio = ch.noise / ch.scale;
            scale = ch.scale;
            res.fits = ch.fits;
            tpk_gp_report_noise_end(rs->rep, sub, &ch);
        }
    } else {
        gp = tpk_gp_fit(&A, Y, ratio, &go, ctx);
    }
    if (!gp)
        return ctx->status;
    if ((st = tpk_gp_report_advance(rs->rep, ctx))) { /* the fit */
        tpk_gp_free(gp);
        return st;
    }
    const tpk_gp_info *in = tpk_gp_get_info(gp);
    if (noise >= 0 && in->jitter > ratio) {
        if (o->warnings)
            fprintf(o->warnings, "%s: warning: --noise=%g but the kernel is numerically "
                    "singular: jitter %.3g (%.3g x mean diagonal) added to its diagonal, so the "
                    "fit, LML and predictions are those of noise = %.3g\n", o->name, noise,
                    in->jitter * scale, in->jitter / tpk_gp_impl_mean_diag(K),
                    (ratio + in->jitter) * scale);
    }
    res.noise = ratio * scale;
    res.scale = scale;
    res.jitter = in->jitter * scale;
    st = tpk_gp_rcond(gp, &res.rcond, ctx);
    /* log N(Y; 0, s·A) from the fit of A. */
    res.lml = -0.5 * in->quad / scale - 0.5 * (double)c * (in->logdet + (double)n * log(scale)) -
              0.5 * (double)(n * c) * log(2 * M_PI);
    if (!st)
        st = tpk_gp_report_advance(rs->rep, ctx); /* the predictions */
    if (!st)
        st = predict(rs, gp, Kxt, kdiag, scale, &res, t0, ctx);
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
        return tpk_progress_check(a->o->progress, ctx);
    int st = tpk_gp_report_advance(a->rs->rep, ctx); /* the kernel of this depth */
    return st ? st : evaluate(a->rs, depth, NULL, K, Kxt, kdiag, a->o->noise_auto ? -1 : a->o->noise, ctx);
}

/* The parameters --fix holds, and the noise when it is 0 (no log scale for 0). A zero
 * sigma_b2 is not in it: fit_hyper_and_run runs that start twice, held at 0 and free from
 * SB2_START (issue 18: held at 0 without a word, a fit on ReLU data stopped at LML -0.34 where a
 * positive bias reaches +0.63). */
static unsigned fixed_mask(const opts *o, const tpk_gp_family *f, tpk_ctx *ctx, int *st)
{
    unsigned mask = 0;
    *st = TPK_OK;
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

/* The LML-best noise for the family at theta on its k points (a start for BFGS). */
static int start_noise(const tpk_gp_family *f, const double *theta, const tpk_array *Ys,
                       size_t k, double *noise, tpk_ctx *ctx)
{
    tpk_array *Ks = tpk_array_alloc2(k, k, ctx);
    int st;
    if (!Ks || f->eval(f, theta, Ks->data, NULL, ctx)) {
        st = ctx->status;
    } else {
        tpk_gp_spectral *sp = tpk_gp_spectral_alloc(Ks, Ys, ctx);
        tpk_gp_noise_choice ch = {0};
        double lo, hi;
        st = !sp ? ctx->status : tpk_gp_impl_noise_range(Ks, &lo, &hi, ctx);
        if (!st)
            st = tpk_gp_spectral_choose_noise(sp, lo, hi, 0, &ch, ctx);
        *noise = ch.noise;
        tpk_gp_spectral_free(sp);
    }
    tpk_array_free(Ks);
    return st;
}

/* A start off the zero boundary for sigma_b2, relative to sigma_w2 (the grid of
 * tpk_gp_fit_hyper then spans e^±3 around it). */
#define SB2_START 0.1

/* One tpk_gp_fit_hyper from theta (and the noise: with auto, its LML-best value there). */
static int fit_from(const tpk_gp_family *f, const tpk_array *Ys, size_t k, int noise_auto,
                    double *theta, double *noise, const tpk_gp_hyper_options *ho,
                    tpk_gp_hyper_result *hr, tpk_ctx *ctx)
{
    int st = noise_auto ? start_noise(f, theta, Ys, k, noise, ctx) : TPK_OK;
    return st ? st : tpk_gp_fit_hyper(f, Ys, theta, noise, ho, hr, ctx);
}

/* fit_hyper: BFGS on the first select_n points, then one full fit at the optimum. */
static int fit_hyper_and_run(run_state *rs, const opts *o, const tpk_array *X,
                             const tpk_array *Xt, const tpk_phi *phi, const tpk_gauss_ws *ws,
                             tpk_array *K, tpk_array *Kxt, tpk_array *kd, tpk_ctx *ctx)
{
    const size_t k = tpk_gp_select_size(o, rs->n);
    tpk_array Xs = head_view(X, k), Ys = head_view(rs->d->Y, k);
    const int mlp = strcmp(o->kernel, "mlp") == 0;
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
        /* a zero sigma_b2 cannot move in log scale: held there, and (unless --fix holds it)
         * a second fit from a positive one; the better LML wins */
        const int zero_b2 = mlp && theta[1] == 0, free_b2 = zero_b2 && !(ho.fixed & 2u);
        if (zero_b2)
            ho.fixed |= 2u;
        if (!st)
            st = fit_from(f, &Ys, k, o->noise_auto, theta, &noise, &ho, &hr, ctx);
        if (!st && free_b2) {
            double t2[2] = {o->sigma_w2, SB2_START * (o->sigma_w2 > 0 ? o->sigma_w2 : 1.0)};
            double n2 = o->noise;
            tpk_gp_hyper_result h2;
            ho.fixed &= ~2u;
            st = fit_from(f, &Ys, k, o->noise_auto, t2, &n2, &ho, &h2, ctx);
            if (!st && h2.lml > hr.lml) {
                h2.iters += hr.iters;
                h2.evals += hr.evals;
                memcpy(theta, t2, sizeof t2);
                noise = n2;
                hr = h2;
            } else if (!st) {
                hr.iters += h2.iters;
                hr.evals += h2.evals;
            }
        }
        if (!st)
            st = tpk_gp_report_advance(rs->rep, ctx); /* the BFGS run */
        tpk_gp_family_free(f);
        if (st)
            return st;
        if (o->summary)
            fprintf(o->summary, "  fit-hyper%s%.0d on %zu points: %s=%.6g %s=%.6g noise=%.6g "
                    "lml/(NC) %+.6f (%d iterations, %d evaluations%s)\n", mlp ? " depth " : "",
                    depth, k, mlp ? "sigma_w2" : "lengthscale2", theta[0],
                    mlp ? "sigma_b2" : "amplitude", theta[1], noise,
                    hr.lml / (double)(k * rs->c), hr.iters, hr.evals,
                    hr.converged ? "" : ", not converged");
        if (mlp) {
            p.sigma_w2 = theta[0];
            p.sigma_b2 = theta[1];
            st = tpk_mlp_kernel(&p, X, Xt, ws, K, Kxt, kd, NULL, ctx);
        } else {
            st = tpk_gp_rbf_kernel(theta, X, Xt, K, Kxt, kd, ctx);
        }
        if (!st)
            st = tpk_gp_report_advance(rs->rep, ctx); /* the kernel */
        if (!st) {
            char prefix[64], path[128];
            tpk_gp_report_prefix(rs->rep, depth, prefix, sizeof prefix);
            const char *nm[2] = {mlp ? "sigma_w2" : "lengthscale2", mlp ? "sigma_b2" : "amplitude"};
            for (int q = 0; q < 2 && !st; q++) {
                snprintf(path, sizeof path, "%s/fitted_%s", prefix, nm[q]);
                st = tpk_h5out_write_vector(tpk_gp_report_output(rs->rep), path, &theta[q], 1, ctx);
                if (!st)
                    st = tpk_h5out_dims(tpk_gp_report_output(rs->rep), path,
                                       (const char *const[]){"model"}, 1, ctx);
            }
        }
        /* The final model uses exactly the hyperparameters printed above (kernel parameters
         * and noise of the fit), not a noise re-selected at full size. */
        if (!st)
            st = evaluate(rs, depth, rs->multi ? NULL : K, K, Xt ? Kxt : NULL, kd, noise, ctx);
    }
    return st;
}

/* ---- the experiment ---------------------------------------------------------------------------- */

/* Everything an experiment holds; freed in one place. */
typedef struct exp_state {
    tpk_phi_registry *reg;
    tpk_phi *phi;
    tpk_gauss_ws *ws;
    tpk_gp_data *d;
    tpk_array *K, *Kxt, *kd, *Ktt;
    tpk_array *T, *Txt, *td;  /* the NTK's blocks (wants_ntk) */
    run_state rs;
} exp_state;

static void exp_free(exp_state *e, tpk_ctx *ctx)
{
    tpk_gp_report_free(e->rs.rep);
    tpk_free(ctx, e->rs.work);
    tpk_array *arr[] = {e->K, e->Kxt, e->kd, e->Ktt, e->T, e->Txt, e->td};
    for (size_t i = 0; i < sizeof arr / sizeof arr[0]; i++)
        tpk_array_free(arr[i]);
    tpk_gp_data_free(e->d);
    tpk_gauss_ws_free(e->ws);
    tpk_phi_free(e->phi);
    tpk_phi_registry_free(e->reg);
}

/* Symmetric and positive semidefinite within PSD_REL_TOL, or an error naming the entry or the
 * smallest eigenvalue (issue 18: an indefinite /kernel was taken without a word, the automatic
 * noise hiding the negative eigenvalues). One Cholesky factorisation of K + N·tol·md·I decides;
 * the eigenvalue is computed only for the message. */
static int check_psd(const char *file, const tpk_array *K, tpk_ctx *ctx)
{
    const size_t n = K->dims[0];
    const double *k = K->data;
    double md = tpk_gp_impl_mean_diag(K);
    for (size_t i = 0; i < n; i++)
        if (!(k[i * n + i] >= 0))
            return TPK_ERROR(ctx, TPK_EDOM, "%s: /kernel is not a covariance: diagonal entry "
                             "[%zu, %zu] = %g is negative", file, i, i, k[i * n + i]);
    if (!(md > 0))
        return TPK_ERROR(ctx, TPK_EDOM, "%s: /kernel is zero on its diagonal: no covariance "
                         "to regress with", file);
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < i; j++)
            if (fabs(k[i * n + j] - k[j * n + i]) > PSD_REL_TOL * md)
                return TPK_ERROR(ctx, TPK_EDOM, "%s: /kernel is not symmetric: entry [%zu, %zu] "
                                 "= %.17g but [%zu, %zu] = %.17g", file, i, j, k[i * n + j], j,
                                 i, k[j * n + i]);
    if (n > (size_t)INT_MAX)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: kernel of size %zu exceeds LAPACK's int indexing",
                         file, n);
    double *a = tpk_malloc(ctx, n * n * sizeof *a);
    if (!a)
        return TPK_ERROR(ctx, TPK_ENOMEM, "%s: out of memory (PSD check of /kernel)", file);
    const double shift = (double)n * PSD_REL_TOL * md;
    memcpy(a, k, n * n * sizeof *a);
    for (size_t i = 0; i < n; i++)
        a[i * n + i] += shift;
    lapack_int info = LAPACKE_dpotrf_work(LAPACK_ROW_MAJOR, 'L', (lapack_int)n, a, (lapack_int)n);
    int st = TPK_OK;
    if (info > 0) {
        memcpy(a, k, n * n * sizeof *a);
        double w[1] = {NAN};
        lapack_int m = 0, isuppz[2];
        lapack_int einfo = LAPACKE_dsyevr(LAPACK_ROW_MAJOR, 'N', 'I', 'L', (lapack_int)n, a,
                                          (lapack_int)n, 0, 0, 1, 1, 0, &m, w, NULL, 1, isuppz);
        if (einfo == 0 && m == 1)
            st = TPK_ERROR(ctx, TPK_EDOM, "%s: /kernel is not positive semidefinite: its "
                           "smallest eigenvalue is %.4g (%.3g x the mean diagonal %.4g; "
                           "tolerance %.3g): not a covariance, so no GP has it", file, w[0],
                           w[0] / md, md, -shift);
        else
            st = TPK_ERROR(ctx, TPK_EDOM, "%s: /kernel is not positive semidefinite: Cholesky "
                           "of /kernel + %.3g I fails at column %d: not a covariance", file,
                           shift, (int)info);
    } else if (info < 0) {
        st = TPK_ERROR(ctx, TPK_EINVAL, "dpotrf rejected argument %d (internal error)",
                       (int)-info);
    }
    tpk_free(ctx, a);
    return st;
}

/* The precomputed kernels of kernel_file: /kernel, and if present the test blocks. */
static int read_kernel_file(exp_state *e, const opts *o, tpk_ctx *ctx)
{
    char spec[1200];
    snprintf(spec, sizeof spec, "%s:/kernel", o->kernel_file);
    if (!(e->K = tpk_io_read(spec, NULL, ctx)))
        return ctx->status;
    tpk_ctx lc;
    tpk_ctx_init_from(&lc, ctx);
    snprintf(spec, sizeof spec, "%s:/kernel_test_train", o->kernel_file);
    e->Kxt = tpk_io_read(spec, NULL, &lc);
    if (!e->Kxt && lc.status != TPK_ENOTFOUND)
        return TPK_ERROR(ctx, lc.status, "%s", lc.msg);
    if (e->Kxt) {
        /* a vector, as gpkernel writes it: read as M×1 without the reader's rank-1 note, which
         * is for inputs (issue 39, item 10) */
        tpk_ctx quiet;
        tpk_ctx_init_from(&quiet, ctx);
        tpk_ctx_set_notes(&quiet, NULL, NULL);
        snprintf(spec, sizeof spec, "%s:/kernel_test_diag", o->kernel_file);
        if (!(e->kd = tpk_io_read(spec, NULL, &quiet)))
            return TPK_ERROR(ctx, quiet.status, "%s", quiet.msg);
        if (o->full_cov) {
            snprintf(spec, sizeof spec, "%s:/kernel_test_test", o->kernel_file);
            if (!(e->Ktt = tpk_io_read(spec, NULL, ctx)))
                return ctx->status;
        }
    }
    if (e->K->ndim != 2 || e->K->dims[0] != e->K->dims[1])
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: /kernel must be N×N (got %zu×%zu)", o->kernel_file,
                         e->K->dims[0], tpk_array_item_size(e->K));
    if (wants_ntk(o)) { /* gpkernel --kernel=both's NTK blocks, shaped as the NNGP's */
        static const char *const ds[3] = {"/ntk", "/ntk_test_train", "/ntk_test_diag"};
        tpk_array **out[3] = {&e->T, &e->Txt, &e->td};
        const tpk_array *like[3] = {e->K, e->Kxt, e->kd};
        tpk_ctx quiet;
        tpk_ctx_init_from(&quiet, ctx);
        tpk_ctx_set_notes(&quiet, NULL, NULL);
        for (int i = 0; i < (e->Kxt ? 3 : 1); i++) {
            snprintf(spec, sizeof spec, "%s:%s", o->kernel_file, ds[i]);
            if (!(*out[i] = tpk_io_read(spec, NULL, &quiet)))
                return quiet.status == TPK_ENOTFOUND
                           ? TPK_ERROR(ctx, TPK_EINVAL, "%s: no %s: --kernel-type=ntk and "
                                       "--predict=gd read the NTK a kernel file has from gpkernel "
                                       "--kernel=both", o->kernel_file, ds[i])
                           : TPK_ERROR(ctx, quiet.status, "%s", quiet.msg);
            if (tpk_array_size(*out[i]) != tpk_array_size(like[i]))
                return TPK_ERROR(ctx, TPK_EINVAL, "%s: %s has %zu entries, its NNGP block %zu",
                                 o->kernel_file, ds[i], tpk_array_size(*out[i]),
                                 tpk_array_size(like[i]));
        }
        int st = check_psd(o->kernel_file, e->T, ctx);
        if (st)
            return st;
    }
    if (e->Kxt && (e->Kxt->dims[1] != e->K->dims[0] || tpk_array_size(e->kd) != e->Kxt->dims[0]))
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: /kernel_test_train is %zu×%zu and "
                         "/kernel_test_diag has %zu entries, but /kernel is %zu×%zu",
                         o->kernel_file, e->Kxt->dims[0], tpk_array_item_size(e->Kxt),
                         tpk_array_size(e->kd), e->K->dims[0], e->K->dims[0]);
    for (size_t i = 0; e->Kxt && i < e->Kxt->dims[0]; i++) /* a variance; the rest of the test
                                                              * blocks is checked by
                                                              * tpk_gp_predict */
        if (!(e->kd->data[i] >= 0))
            return TPK_ERROR(ctx, TPK_EDOM, "%s: /kernel_test_diag is not a variance: entry [%zu] "
                             "= %g is negative", o->kernel_file, i, e->kd->data[i]);
    return check_psd(o->kernel_file, e->K, ctx);
}

/* ---- any kernel: the architecture table or a NETSOR program (issue 39, item 10) -------------- */

/* An architecture whose kernel is its own job over files (attention; the CNN rows run theirs on
 * arrays): X (and Xt) into a scratch folder as HDF5, the job as gpkernel runs it, its kernels
 * read back. The folder is removed whatever happens. */
static int table_kernel_job(const tpk_arch *a, const tpk_arch_opts *ao, const tpk_array *X,
                            const tpk_array *Xt, tpk_array **K, tpk_array **Kxt, tpk_array **kd,
                            tpk_array *T3[3], tpk_ctx *ctx)
{
    const char *tmp = getenv("TMPDIR");
    char dir[1024], xs[1100], ts[1100], kf[1100], spec[1200];
    snprintf(dir, sizeof dir, "%s/tpk-gpregress-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir))
        return TPK_ERROR(ctx, TPK_EIO, "%s: cannot make a scratch folder for the kernel of "
                         "--arch=%s", dir, a->name);
    snprintf(xs, sizeof xs, "%s/x.h5", dir);
    snprintf(ts, sizeof ts, "%s/t.h5", dir);
    snprintf(kf, sizeof kf, "%s/k.h5", dir);
    const tpk_array *arr[2] = {X, Xt};
    const char *path[2] = {xs, ts};
    int st = TPK_OK;
    for (int i = 0; i < 2 && !st && arr[i]; i++) {
        tpk_h5out *h = tpk_h5out_open(path[i], ctx);
        st = !h || tpk_h5out_write(h, "/x", arr[i], ctx) || tpk_h5out_commit(h, ctx)
                 ? ctx->status : TPK_OK;
        if (h && st)
            tpk_h5out_abort(h);
    }
    char xspec[1200], tspec[1200];
    snprintf(xspec, sizeof xspec, "%s:/x", xs);
    snprintf(tspec, sizeof tspec, "%s:/x", ts);
    if (!st)
        st = tpk_arch_job(a, ao, xspec, Xt ? tspec : NULL, kf, ctx);
    static const char *const ds[6] = {"/kernel", "/kernel_test_train", "/kernel_test_diag",
                                      "/ntk", "/ntk_test_train", "/ntk_test_diag"};
    tpk_array **out[6] = {K, Kxt, kd, T3 ? &T3[0] : NULL, T3 ? &T3[1] : NULL, T3 ? &T3[2] : NULL};
    tpk_ctx quiet;
    tpk_ctx_init_from(&quiet, ctx);
    tpk_ctx_set_notes(&quiet, NULL, NULL); /* /kernel_test_diag is a vector: no rank-1 note */
    for (int i = 0; i < 6 && !st; i++) {
        if (!out[i] || (i % 3 > 0 && !Xt))
            continue;
        snprintf(spec, sizeof spec, "%s:%s", kf, ds[i]);
        if (!(*out[i] = tpk_io_read(spec, NULL, &quiet)))
            st = quiet.status == TPK_ENOTFOUND
                     ? TPK_ERROR(ctx, TPK_EUNSUPPORTED, "--arch=%s: its job gives no %s for "
                                 "test inputs (its limit is not computed across a test set)",
                                 a->name, ds[i])
                     : TPK_ERROR(ctx, quiet.status, "%s", quiet.msg);
    }
    unlink(xs);
    unlink(ts);
    unlink(kf);
    rmdir(dir);
    return st;
}

/* X as N×(the rest): a view of the same data (never freed through it). */
static const tpk_array *flat_view(const tpk_array *X, tpk_array *v)
{
    *v = *X;
    v->ndim = 2;
    for (int i = 2; i < X->ndim; i++)
        v->dims[1] *= X->dims[i];
    return v;
}

/* The kernels of X (and Xt) by the table's architecture o->kernel or the program o->program,
 * as gpkernel computes them: *K (N×N), *Kxt (M×N) and *kd (M) with Xt. */
static int table_kernel(const opts *o, const tpk_array *X, const tpk_array *Xt, tpk_array **K,
                        tpk_array **Kxt, tpk_array **kd, tpk_array *T3[3], tpk_ctx *ctx)
{
    *K = NULL;
    if (Kxt)
        *Kxt = NULL;
    if (kd)
        *kd = NULL;
    if (o->program) {
        tpk_job job = {.label = "program", .program = o->program, .sets = o->sets,
                       .nsets = o->nsets, .netsor_plus = o->netsor_plus, .input = o->train,
                       .test = o->test, .progress = o->progress, .ntk_param = o->ntk_param,
                       .ntk_width = o->ntk_width};
        if (T3) { /* both kernels, one pass */
            tpk_array *B[3];
            int st = tpk_job_kernels_arrays(&job, X, Xt, B, T3, NULL, ctx);
            *K = B[0];
            if (Kxt)
                *Kxt = B[1];
            else
                tpk_array_free(B[1]);
            if (kd)
                *kd = B[2];
            else
                tpk_array_free(B[2]);
            return st;
        }
        return tpk_job_kernel_arrays(&job, X, Xt, K, Kxt, kd, NULL, ctx);
    }
    const tpk_arch *a = tpk_arch_find(o->kernel);
    tpk_arch_opts ao = {.flags = o->arch_flags, .nflags = o->narch_flags, .sets = o->sets,
                        .nsets = o->nsets, .layernorm = o->layernorm, .progress = o->progress,
                        .kernel = T3 ? TPK_JOB_BOTH : TPK_JOB_NNGP, .ntk_param = o->ntk_param,
                        .ntk_width = o->ntk_width};
    /* --arch=mlp from the experiment's own fields (a C or Python caller, or no flag given):
     * its depth, phi and variances as the row's flags */
    char v[3][32];
    tpk_arch_flag own[4];
    if (a && strcmp(a->name, "mlp") == 0 && o->narch_flags == 0 && o->nsets == 0 &&
        !o->layernorm) {
        snprintf(v[0], sizeof v[0], "%d", o->depth_lo);
        snprintf(v[1], sizeof v[1], "%.17g", o->sigma_w2);
        snprintf(v[2], sizeof v[2], "%.17g", o->sigma_b2);
        own[0] = (tpk_arch_flag){.flag = "depth", .value = v[0]};
        own[1] = (tpk_arch_flag){.flag = "phi", .value = o->phi ? o->phi : "relu"};
        own[2] = (tpk_arch_flag){.flag = "sigma-w2", .value = v[1]};
        own[3] = (tpk_arch_flag){.flag = "sigma-b2", .value = v[2]};
        ao.flags = own;
        ao.nflags = 4;
    }
    if (!a)
        return TPK_ERROR(ctx, TPK_EINVAL, "unknown --arch '%s'", o->kernel);
    /* the MLP reads every item as one vector, as gpregress' own recursion did (IDX images
     * N×rows×cols): views of the same data as N×d */
    tpk_array xv, tv;
    if (strcmp(a->name, "mlp") == 0 && X->ndim > 2)
        X = flat_view(X, &xv);
    if (strcmp(a->name, "mlp") == 0 && Xt && Xt->ndim > 2)
        Xt = flat_view(Xt, &tv);
    int st;
    if (T3) {
        tpk_array *B[3];
        st = tpk_arch_kernels(a, &ao, X, Xt, B, T3, NULL, ctx);
        *K = B[0];
        if (Kxt)
            *Kxt = B[1];
        if (kd)
            *kd = B[2];
    } else {
        st = tpk_arch_kernel(a, &ao, X, Xt, K, Kxt, kd, NULL, ctx);
    }
    if (st == TPK_EUNSUPPORTED && a->custom) { /* attention: its job writes HDF5 */
        tpk_ctx_clear(ctx);
        return table_kernel_job(a, &ao, X, Xt, K, Kxt, kd, T3, ctx);
    }
    return st;
}

/* Kernel buffers (computed kernels only) and the factor workspace of a sweep. */
static int alloc_kernels(exp_state *e, const opts *o, tpk_ctx *ctx)
{
    const size_t n = e->rs.n, m = e->rs.m;
    if (!o->kernel_file && !tpk_gp_experiment_table_kernel(o)) {
        if (!(e->K = tpk_array_alloc2(n, n, ctx)) ||
            (e->d->Xt && (!(e->Kxt = tpk_array_alloc2(m, n, ctx)) ||
                       !(e->kd = tpk_array_alloc(1, (size_t[]){m}, ctx)))))
            return ctx->status;
        if (o->full_cov && e->d->Xt && !(e->Ktt = tpk_array_alloc2(m, m, ctx)))
            return ctx->status;
    }
    if (e->rs.multi && !(e->rs.work = tpk_malloc(ctx, n * n * sizeof(double))))
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (%zu×%zu workspace)", n, n);
    return TPK_OK;
}

/* The trained ensemble's predictions at o->times (tpk_gd_mse_ensemble, NT's
 * gradient_descent_mse_ensemble): the mean of every test item, the variances of the first var_n
 * (all by default, at most GD_VAR_MAX: the covariance it comes from is times × items²), scores
 * per time against the test targets; its datasets under the report's file. The prior's test
 * covariance enters the variances by its diagonal alone, so a diagonal K_tt stands for it. */
#define GD_VAR_MAX 4000
static int gd_predict(exp_state *e, tpk_ctx *ctx)
{
    const opts *o = e->rs.o;
    const tpk_gp_data *d = e->d;
    const size_t nt = o->ntimes, m = e->Kxt ? e->Kxt->dims[0] : 0, c = d->c, n = e->rs.n;
    if (m == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "--predict=gd predicts on the test set, and the kernel "
                         "has no test block");
    size_t mv = o->no_var ? 0 : o->var_n > 0 && o->var_n < m ? o->var_n : m;
    if (mv > GD_VAR_MAX)
        mv = GD_VAR_MAX;
    tpk_gd_opts go;
    tpk_gd_opts_default(&go);
    go.lr = o->lr > 0 ? o->lr : 1.0;
    go.discrete = o->gd_steps;
    go.momentum = o->momentum;
    go.get = o->kernel_type == TPK_GP_KERNEL_NTK ? TPK_GD_NTK : TPK_GD_NNGP;
    const int ntk = go.get == TPK_GD_NTK;
    tpk_array *mean = tpk_array_alloc(3, (size_t[3]){nt, m, c}, ctx), *var = NULL, *cov = NULL;
    tpk_array *ktt = NULL, *mh = NULL;
    int st = mean ? TPK_OK : ctx->status;
    /* the means of every test item; when the variances are of every item too, one call (one
     * eigendecomposition) gives both */
    if (!st && mv < m)
        st = tpk_gd_mse_ensemble(ntk ? e->T : NULL, e->K, ntk ? e->Txt : NULL, e->Kxt, NULL, d->Y,
                                 o->times, nt, &go, mean, NULL, ctx);
    if (!st && mv > 0) {
        tpk_array kh = head_view(e->Kxt, mv), th = ntk ? head_view(e->Txt, mv) : kh;
        if (!(ktt = tpk_array_alloc2(mv, mv, ctx)) ||
            !(cov = tpk_array_alloc(3, (size_t[3]){nt, mv, mv}, ctx)) ||
            (mv < m && !(mh = tpk_array_alloc(3, (size_t[3]){nt, mv, c}, ctx))) ||
            !(var = tpk_array_alloc2(nt, mv, ctx)))
            st = ctx->status;
        for (size_t i = 0; !st && i < mv; i++)
            ktt->data[i * mv + i] = e->kd->data[i];
        if (!st)
            st = tpk_gd_mse_ensemble(ntk ? e->T : NULL, e->K, ntk ? &th : NULL, &kh, ktt, d->Y,
                                     o->times, nt, &go, mv < m ? mh : mean, cov, ctx);
        for (size_t t = 0; !st && t < nt; t++)
            for (size_t i = 0; i < mv; i++)
                var->data[t * mv + i] = cov->data[(t * mv + i) * mv + i];
    }
    tpk_h5out *out = tpk_gp_report_output(e->rs.rep);
    /* the times as the coordinate's labels ("inf" for t = ∞, which no float dataset holds) */
    char(*lab)[32] = st ? NULL : tpk_malloc(ctx, nt * sizeof *lab);
    const char **labp = lab ? tpk_malloc(ctx, nt * sizeof *labp) : NULL;
    if (!st && !labp)
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    for (size_t t = 0; !st && t < nt; t++) {
        snprintf(lab[t], sizeof lab[t], isinf(o->times[t]) ? "inf" : "%.17g", o->times[t]);
        labp[t] = lab[t];
    }
    if (!st) st = tpk_h5out_coord_labels(out, "gd_time", labp, nt, ctx);
    tpk_free(ctx, labp);
    tpk_free(ctx, lab);
    if (!st) st = tpk_h5out_write(out, "/gd_mean", mean, ctx);
    if (!st) st = tpk_h5out_dims(out, "/gd_mean", (const char *const[]){"gd_time", "test", "output"}, 3, ctx);
    if (!st && var) st = tpk_h5out_write(out, "/gd_var", var, ctx);
    if (!st && var) st = tpk_h5out_dims(out, "/gd_var", (const char *const[]){"gd_time", "test_var"}, 2, ctx);
    /* scores per time: RMSE of the mean, and with classify the accuracy of its argmax */
    if (!st && d->Yt) {
        tpk_array *rm = tpk_array_alloc(1, (size_t[1]){nt}, ctx);
        tpk_array *ac = rm && d->Lt ? tpk_array_alloc(1, (size_t[1]){nt}, ctx) : NULL;
        st = !rm || (d->Lt && !ac) ? ctx->status : TPK_OK;
        for (size_t t = 0; !st && t < nt; t++) {
            const double *mt = mean->data + t * m * c;
            double se = 0;
            size_t hit = 0;
            for (size_t i = 0; i < m; i++) {
                size_t best = 0;
                for (size_t k = 0; k < c; k++) {
                    const double r = mt[i * c + k] - d->Yt->data[i * c + k];
                    se += r * r;
                    if (mt[i * c + k] > mt[i * c + best])
                        best = k;
                }
                hit += ac && (double)best == d->Lt->data[i];
            }
            rm->data[t] = sqrt(se / (double)(m * c));
            if (ac)
                ac->data[t] = (double)hit / (double)m;
        }
        if (!st) st = tpk_h5out_write(out, "/gd_rmse", rm, ctx);
        if (!st && ac) st = tpk_h5out_write(out, "/gd_accuracy", ac, ctx);
        for (size_t t = 0; !st && o->summary && t < nt; t++) {
            fprintf(o->summary, "  gd %s t=%-8g test RMSE %.6g", ntk ? "(NTK)" : "(NNGP, readout)",
                    o->times[t], rm->data[t]);
            if (ac)
                fprintf(o->summary, ", accuracy %.4f", ac->data[t]);
            fputc('\n', o->summary);
        }
        tpk_array_free(rm);
        tpk_array_free(ac);
    }
    if (!st) st = tpk_h5out_attr_double(out, "/", "gd_lr", go.lr, ctx);
    if (!st) st = tpk_h5out_attr_str(out, "/", "gd_trains", ntk ? "ntk" : "nngp", ctx);
    if (!st) st = tpk_h5out_attr_int(out, "/", "gd_steps", o->gd_steps, ctx);
    if (!st) st = tpk_h5out_attr_double(out, "/", "gd_momentum", o->momentum, ctx);
    if (!st) st = tpk_h5out_attr_int(out, "/", "gd_train_items", (long long)n, ctx);
    if (!st && o->nfinite_widths > 0)
        st = gp_gd_finite(o, d, e->T, e->K, e->Txt, e->Kxt, e->kd, mean, var, mv, &go, out, ctx);
    tpk_array_free(mean);
    tpk_array_free(var);
    tpk_array_free(cov);
    tpk_array_free(ktt);
    tpk_array_free(mh);
    return st;
}

/* The posterior with the kernel o->kernel_type names (the NTK: the NTK-GP), then with
 * predict_gd the trained ensemble. */
static int evaluate_ntk(exp_state *e, double noise, tpk_ctx *ctx)
{
    const opts *o = e->rs.o;
    const int ntk = o->kernel_type == TPK_GP_KERNEL_NTK;
    int st = TPK_OK;
    if (wants_ntk(o) && !e->T)
        return TPK_ERROR(ctx, TPK_EINVAL, "no NTK was computed for this kernel");
    if (!st && o->predict_gd) /* before evaluate, which factors K in place */
        st = gd_predict(e, ctx);
    if (!st && o->summary && ntk)
        fprintf(o->summary, "  posterior: the NTK-GP (the NTK as the prior covariance, "
                "%s parameterization)\n", tpk_ntk_param_name(o->ntk_param));
    if (!st && wants_ntk(o)) /* (a plain NNGP run's attributes are gpregress-mpi's too) */
        st = tpk_h5out_attr_str(tpk_gp_report_output(e->rs.rep), "/", "kernel_type",
                                ntk ? "ntk" : "nngp", ctx);
    if (!st)
        st = ntk ? evaluate(&e->rs, 0, e->T, e->T, e->Txt, e->td, noise, ctx)
                 : evaluate(&e->rs, 0, e->K, e->K, e->Kxt, e->kd, noise, ctx);
    return st;
}

/* Every kernel of the experiment through evaluate (or the fit_hyper loop). */
static int run_kernels(exp_state *e, const opts *o, tpk_ctx *ctx)
{
    run_state *rs = &e->rs;
    const tpk_array *X = e->d->X, *Xt = e->d->Xt;
    const int mlp = o->kernel && strcmp(o->kernel, "mlp") == 0;
    const double noise = o->noise_auto ? -1 : o->noise;
    int st = TPK_OK;
    if (tpk_gp_experiment_table_kernel(o)) { /* gpkernel's kernel of any architecture */
        tpk_array *T3[3] = {NULL, NULL, NULL};
        st = table_kernel(o, X, Xt, &e->K, Xt ? &e->Kxt : NULL, Xt ? &e->kd : NULL,
                          wants_ntk(o) ? T3 : NULL, ctx);
        e->T = T3[0];
        e->Txt = T3[1];
        e->td = T3[2];
        if (!st && o->full_cov && Xt)
            st = table_kernel(o, Xt, NULL, &e->Ktt, NULL, NULL, NULL, ctx);
        rs->Ktt = e->Ktt;
        if (!st && o->full_cov && !e->Ktt)
            st = TPK_ERROR(ctx, TPK_EINVAL, "--full-cov needs test inputs");
        if (!st && (e->K->ndim != 2 || e->K->dims[0] != rs->n))
            st = TPK_ERROR(ctx, TPK_EINVAL, "the kernel has %zu rows for %zu training items (a "
                           "kernel of every readout, --all-times, is not a regression kernel)",
                           e->K->dims[0], rs->n);
        if (!st)
            st = tpk_gp_report_advance(rs->rep, ctx); /* the kernel */
        return st ? st : evaluate_ntk(e, noise, ctx);
    }
    if (o->full_cov && Xt && !o->fit_hyper) {
        tpk_mlp_params p = {.depth = o->depth_lo, .phi = e->phi, .sigma_w2 = o->sigma_w2,
                            .sigma_b2 = o->sigma_b2};
        st = mlp ? tpk_mlp_kernel(&p, Xt, NULL, e->ws, e->Ktt, NULL, NULL, NULL, ctx)
                 : tpk_gp_rbf_kernel((double[]){o->lengthscale2, o->amplitude}, Xt, NULL,
                                     e->Ktt, NULL, NULL, ctx);
        if (st)
            return st;
    }
    rs->Ktt = e->Ktt;
    if (o->full_cov && !e->Ktt && rs->m)
        return TPK_ERROR(ctx, TPK_EINVAL, "--full-cov needs test inputs, or /kernel_test_test in "
                         "the kernel file");
    if (o->fit_hyper) {
        if (o->full_cov)
            return TPK_ERROR(ctx, TPK_EINVAL, "--full-cov is not available with --fit-hyper");
        return fit_hyper_and_run(rs, o, X, Xt, e->phi, e->ws, e->K, e->Kxt, e->kd, ctx);
    }
    if (o->kernel_file)
        return (st = tpk_gp_report_advance(rs->rep, ctx)) ? st : evaluate_ntk(e, noise, ctx);
    if (mlp) {
        tpk_mlp_params p = {.depth = o->depth_hi, .phi = e->phi, .sigma_w2 = o->sigma_w2,
                            .sigma_b2 = o->sigma_b2};
        if (rs->multi) {
            sweep_arg sa = {rs, o};
            return tpk_gp_mlp_sweep(&p, X, Xt, e->ws, e->K, e->Kxt, e->kd, sweep_cb, &sa,
                                    ctx);
        }
        st = tpk_mlp_kernel(&p, X, Xt, e->ws, e->K, e->Kxt, e->kd, NULL, ctx);
        if (!st)
            st = tpk_gp_report_advance(rs->rep, ctx); /* the kernel */
        return st ? st : evaluate(rs, o->depth_lo, e->K, e->K, e->Kxt, e->kd, noise, ctx);
    }
    double th[2] = {o->lengthscale2, o->amplitude};
    st = tpk_gp_rbf_kernel(th, X, Xt, e->K, e->Kxt, e->kd, ctx);
    if (!st)
        st = tpk_gp_report_advance(rs->rep, ctx); /* the kernel */
    return st ? st : evaluate(rs, 0, e->K, e->K, e->Kxt, e->kd, noise, ctx);
}

static int experiment(exp_state *e, const opts *o, tpk_ctx *ctx)
{
    run_state *rs = &e->rs;
    int st;
    if (o->kernel && strcmp(o->kernel, "mlp") == 0 && !tpk_gp_experiment_table_kernel(o)) {
        if (!(e->reg = tpk_phi_registry_alloc(ctx)) || !(e->phi = tpk_phi_alloc(e->reg, o->phi, ctx)))
            return ctx->status;
        if (!tpk_phi_has_closed_form(e->phi) &&
            !(e->ws = tpk_gauss_ws_alloc((size_t)o->quad_degree, ctx)))
            return ctx->status;
    }
    if (o->kernel_file && (st = read_kernel_file(e, o, ctx)))
        return st;
    if (!(e->d = tpk_gp_data_read(o, e->K ? e->K->dims[0] : 0, e->Kxt ? e->Kxt->dims[0] : 0,
                                  ctx)))
        return ctx->status;
    rs->d = e->d;
    rs->n = e->d->n;
    rs->m = e->d->m;
    rs->c = e->d->c;
    rs->multi = o->depth_hi > o->depth_lo;
    if (!(rs->rep = tpk_gp_report_open(o, e->d, ctx)))
        return ctx->status;
    if ((st = alloc_kernels(e, o, ctx)) || (st = run_kernels(e, o, ctx)))
        return st;
    return tpk_gp_report_commit(rs->rep, ctx);
}

int tpk_gp_experiment_run(const tpk_gp_experiment_opts *o, tpk_ctx *ctx)
{
    int st = tpk_gp_experiment_check(o, ctx);
    if (st)
        return st;
    exp_state e;
    memset(&e, 0, sizeof e);
    e.rs.o = o;
    st = experiment(&e, o, ctx);
    exp_free(&e, ctx);
    return st;
}
