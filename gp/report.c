/* Experiments in parts (include/tpk/gp.h): the data an experiment reads, the start and the
 * bookkeeping of its noise choice, and its report (scores, datasets, attributes, summary lines),
 * shared by tpk_gp_experiment_run (gp/experiment.c) and gpregress-mpi (mpi/, issue 16), so that
 * a solver outside this library reads the same data and writes the same file. */
#include "gp-impl.h"
#include "tpk/alloc.h"

#include "tpk/idx.h"
#include "tpk/io.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Full-size noise search (tpk_gp_noise_walk): steps in decades of σ², the first kernel's wider
 * (no shift known yet). */
#define NOISE_STEP_FIRST 0.5
#define NOISE_STEP_NEXT 0.3
/* Class labels must be small non-negative integers. */
#define MAX_CLASSES 100000

typedef tpk_gp_experiment_opts opts;

/* ---- inputs ---------------------------------------------------------------------------------- */

/* limit > 0: the first `limit` items only. */
static tpk_array *read_any(const char *spec, size_t limit, tpk_input_info *info, tpk_ctx *ctx)
{
    tpk_array *a;
    memset(info, 0, sizeof *info);
    if (tpk_idx_name_matches(spec)) {
        a = tpk_idx_read(spec, limit, ctx);
        if (!a)
            return NULL;
        if (limit > 0 && a->dims[0] < limit) {
            TPK_ERROR(ctx, TPK_EINVAL, "%s has %zu items, fewer than the %zu asked for "
                      "(--n-train / --n-test)", spec, a->dims[0], limit);
            tpk_array_free(a);
            return NULL;
        }
        snprintf(info->path, sizeof info->path, "%s", spec);
        snprintf(info->format, sizeof info->format, "idx");
    } else {
        a = tpk_io_read(spec, info, ctx);
        if (!a)
            return NULL;
        if (limit > 0 && a->dims[0] < limit) { /* --n-train / --n-test beyond the file */
            TPK_ERROR(ctx, TPK_EINVAL, "%s has %zu items, fewer than the %zu asked for "
                      "(--n-train / --n-test)", spec, a->dims[0], limit);
            tpk_array_free(a);
            return NULL;
        }
        if (limit > 0 && a->dims[0] > limit)
            a->dims[0] = limit; /* the rows beyond stay allocated, unused */
        else
            return a;
    }
    tpk_sha256_array_hex(a, info->sha256);
    return a;
}

static int preprocess(const opts *o, tpk_array *X, tpk_array *Xt, tpk_ctx *ctx)
{
    const size_t n = X->dims[0], d = tpk_array_item_size(X);
    if (o->center) {
        double *mu = tpk_calloc(ctx, d, sizeof *mu);
        if (mu == NULL) /* never run uncentred without saying so */
            return ctx->status;
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
        tpk_free(ctx, mu);
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
    return TPK_OK;
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

static int read_inputs(tpk_gp_data *d, const opts *o, tpk_ctx *ctx)
{
    if (!(d->X = read_any(o->train, o->n_train, &d->xi, ctx)))
        return ctx->status;
    if (o->test && !(d->Xt = read_any(o->test, o->n_test, &d->ti, ctx)))
        return ctx->status;
    /* squared norms beyond a double's range would be blamed on the kernel's parameters */
    if (tpk_array_check_scale(d->X, o->train, ctx) ||
        (d->Xt && tpk_array_check_scale(d->Xt, o->test, ctx)))
        return ctx->status;
    /* items are flattened here: the sizes must agree, the shapes may differ (N×784 vs N×28×28) */
    if (d->Xt && tpk_array_item_size(d->Xt) != tpk_array_item_size(d->X) &&
        tpk_array_check_items(d->Xt, o->test, d->X, o->train, ctx))
        return ctx->status;
    d->n = d->X->dims[0];
    d->m = d->Xt ? d->Xt->dims[0] : 0;
    return TPK_OK;
}

/* Targets: one-hot classes (classify) or the values as given, N×C. */
static int read_targets(tpk_gp_data *d, const opts *o, tpk_ctx *ctx)
{
    /* Cut the targets to the items only with --n-train / --n-test (the first items of longer
     * files, e.g. IDX sets); otherwise a count that differs from the items' is an error either
     * way (issue 18: more test labels than test items were silently cut). */
    /* targets of one value per item are stored as vectors (class labels, IDX label files):
     * reading them as N×1 is their meaning, no note */
    tpk_ctx quiet = *ctx;
    tpk_ctx_set_notes(&quiet, NULL, NULL);
    d->L = read_any(o->labels, o->n_train ? d->n : 0, &d->li, &quiet);
    if (d->L && o->test_labels && d->m)
        d->Lt = read_any(o->test_labels, o->n_test ? d->m : 0, &d->lti, &quiet);
    if (!d->L || (o->test_labels && d->m && !d->Lt))
        return TPK_ERROR(ctx, quiet.status, "%s", quiet.msg);
    if (d->L->dims[0] != d->n)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s has %zu rows but there are %zu training items",
                         o->labels, d->L->dims[0], d->n);
    if (o->test_labels) {
        if (!d->m)
            return TPK_ERROR(ctx, TPK_EINVAL, "--test-labels given but no test kernel or inputs");
        if (d->Lt->dims[0] != d->m)
            return TPK_ERROR(ctx, TPK_EINVAL, "%s has %zu rows but there are %zu test items",
                             o->test_labels, d->Lt->dims[0], d->m);
    }
    if (o->classify) {
        int st;
        if ((st = check_labels(o->labels, d->L, ctx)) ||
            (d->Lt && (st = check_labels(o->test_labels, d->Lt, ctx))))
            return st;
        size_t c = 0;
        for (size_t i = 0; i < d->n; i++)
            c = d->L->data[i] + 1 > (double)c ? (size_t)d->L->data[i] + 1 : c;
        for (size_t i = 0; d->Lt && i < d->m; i++)
            if (d->Lt->data[i] >= (double)c)
                return TPK_ERROR(ctx, TPK_EINVAL, "%s: test label %g at item %zu never occurs in "
                                 "training (classes 0..%zu)", o->test_labels, d->Lt->data[i], i,
                                 c - 1);
        if (c < 2)
            return TPK_ERROR(ctx, TPK_EINVAL, "%s: --classify needs at least 2 classes",
                             o->labels);
        if (!(d->Y = one_hot(d->L, c, ctx)) || (d->Lt && !(d->Yt = one_hot(d->Lt, c, ctx))))
            return ctx->status;
        d->c = c;
    } else {
        d->Y = d->L;
        d->L = NULL;
        d->Y->ndim = 2;
        d->Y->dims[1] = tpk_array_item_size(d->Y);
        d->c = d->Y->dims[1];
        if (d->Lt) {
            if (tpk_array_item_size(d->Lt) != d->c)
                return TPK_ERROR(ctx, TPK_EINVAL, "%s has %zu values per item but %s has %zu",
                                 o->test_labels, tpk_array_item_size(d->Lt), o->labels, d->c);
            d->Yt = d->Lt;
            d->Lt = NULL;
        }
        /* The LML and the noise search square and sum the targets: beyond a double's range
         * they failed as "the kernel has eigenvalues below ..." (issue 18). */
        double ss = 0, big = 0;
        for (size_t i = 0; i < tpk_array_size(d->Y); i++) {
            ss += d->Y->data[i] * d->Y->data[i];
            big = fmax(big, fabs(d->Y->data[i]));
        }
        if (!isfinite(ss))
            return TPK_ERROR(ctx, TPK_EDOM, "%s: the targets' squares sum beyond the range of a "
                             "double (entries up to %g): rescale the targets", o->labels, big);
    }
    return TPK_OK;
}

tpk_gp_data *tpk_gp_data_read(const tpk_gp_experiment_opts *o, size_t n, size_t m, tpk_ctx *ctx)
{
    if (!o) {
        TPK_ERROR(ctx, TPK_EINVAL, "tpk_gp_data_read: NULL options");
        return NULL;
    }
    tpk_gp_data *d = tpk_calloc(ctx, 1, sizeof *d);
    if (!d)
        return NULL;
    d->al = tpk_ctx_allocator(ctx);
    int st;
    if (o->kernel_file) {
        d->n = n;
        d->m = m;
        st = n ? TPK_OK : TPK_ERROR(ctx, TPK_EINVAL, "%s: an empty kernel", o->kernel_file);
    } else {
        st = read_inputs(d, o, ctx);
    }
    if (!st)
        st = read_targets(d, o, ctx);
    if (!st && d->X)
        st = preprocess(o, d->X, d->Xt, ctx);
    if (st) {
        tpk_gp_data_free(d);
        return NULL;
    }
    return d;
}

void tpk_gp_data_free(tpk_gp_data *d)
{
    if (!d)
        return;
    tpk_array *arr[] = {d->X, d->Xt, d->L, d->Lt, d->Y, d->Yt};
    for (size_t i = 0; i < sizeof arr / sizeof arr[0]; i++)
        tpk_array_free(arr[i]);
    tpk_allocator al = d->al;
    tpk_mem_free(&al, d);
}

/* ---- the kernel's source ---------------------------------------------------------------------- */

int tpk_gp_experiment_own_mlp(const tpk_gp_experiment_opts *o)
{
    return o && !o->kernel_file && !o->program && o->kernel && strcmp(o->kernel, "mlp") == 0 &&
           o->narch_flags == 0 && o->nsets == 0 && !o->layernorm;
}

int tpk_gp_experiment_table_kernel(const tpk_gp_experiment_opts *o)
{
    if (!o || o->kernel_file)
        return 0;
    if (o->program)
        return 1;
    if (!o->kernel || strcmp(o->kernel, "rbf") == 0)
        return 0;
    if (strcmp(o->kernel, "mlp") != 0 || o->narch_flags > 0 || o->nsets > 0 || o->layernorm)
        return 1;
    /* gpregress' own --arch=mlp at one depth: the same solver as gpkernel (tpk_job_solver), so
     * that both give the same kernel bit for bit; its recursion (kernels/mlp.c: every depth of a
     * range in one pass, the derivatives --fit-hyper needs, its own quadrature degree) only where
     * those are asked for */
    return o->depth_lo == o->depth_hi && !o->fit_hyper &&
           o->quad_degree == TPK_GAUSS_DEFAULT_DEGREE;
}

/* ---- the report ------------------------------------------------------------------------------ */

/* One row of doubles per kernel, as the summary datasets are written (res_names). */
enum { R_DEPTH, R_NOISE, R_SCALE, R_LML, R_LMLSEL, R_JITTER, R_RCOND, R_ACC, R_NLL, R_RMSE,
       R_SECS, R_LMLERR, R_CGIT, R_CGRES, R_NFIELDS };
static const char *const res_names[R_NFIELDS] = {
    "depths", "noise", "scale", "lml", "lml_select", "jitter", "rcond", "accuracy", "nll", "rmse",
    "seconds", "lml_error", "cg_iterations", "cg_residual"};

struct tpk_gp_report {
    const opts *o;
    const tpk_gp_data *d;
    tpk_h5out *out;
    int multi;             /* results go under /depth_L */
    int nk, nres;
    double *res;           /* nk rows of R_NFIELDS */
    double noise_shift;    /* full-size / subsample optimal noise ratio of the last kernel */
    size_t step, steps;    /* progress: steps done of all (o->progress) */
    tpk_allocator al;
};

/* Steps of progress (o->progress) per kernel: the kernel, the noise, the fit and the
 * predictions, and with fit_hyper its BFGS run too. */
enum { STEPS_PER_KERNEL = 4 };

tpk_gp_report *tpk_gp_report_open(const tpk_gp_experiment_opts *o, const tpk_gp_data *d,
                                  tpk_ctx *ctx)
{
    /* Open the output before the heavy work: an unwritable path fails now; an input file is
     * never overwritten. */
    const char *ins[] = {o->kernel_file, o->train, o->test, o->labels, o->test_labels};
    if (tpk_io_check_output(o->output, ins, 5, ctx) ||
        tpk_h5out_check_replace(o->output, o->force, ctx))
        return NULL;
    tpk_gp_report *r = tpk_calloc(ctx, 1, sizeof *r);
    if (!r)
        return NULL;
    r->al = tpk_ctx_allocator(ctx);
    r->o = o;
    r->d = d;
    r->noise_shift = 1.0;
    r->nk = o->depth_hi - o->depth_lo + 1;
    r->multi = r->nk > 1;
    r->steps = (size_t)r->nk * (STEPS_PER_KERNEL + (o->fit_hyper ? 1 : 0));
    int st = (r->out = tpk_h5out_open(o->output, ctx)) ? TPK_OK : ctx->status;
    if (!st)
        st = tpk_progress_report(o->progress, "steps", 0, r->steps, ctx);
    if (!st && !(r->res = tpk_calloc(ctx, (size_t)r->nk * R_NFIELDS, sizeof(double))))
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    if (st) {
        tpk_gp_report_free(r);
        return NULL;
    }
    if (o->summary)
        fprintf(o->summary, "%s: %s, N=%zu train, M=%zu test, C=%zu outputs%s\n", o->name,
                o->kernel_file ? o->kernel_file : o->program ? o->program : o->kernel, d->n, d->m,
                d->c,
                o->classify ? " (one-hot classes)" : "");
    return r;
}

void tpk_gp_report_free(tpk_gp_report *r)
{
    if (!r)
        return;
    tpk_h5out_abort(r->out);
    tpk_allocator al = r->al;
    tpk_mem_free(&al, r->res);
    tpk_mem_free(&al, r);
}

tpk_h5out *tpk_gp_report_output(const tpk_gp_report *r) { return r->out; }

void tpk_gp_report_prefix(const tpk_gp_report *r, int depth, char *buf, size_t len)
{
    if (r->multi)
        snprintf(buf, len, "/depth_%d", depth);
    else if (len)
        buf[0] = '\0';
}

int tpk_gp_report_advance(tpk_gp_report *r, tpk_ctx *ctx)
{
    if (r->step < r->steps)
        r->step++;
    return tpk_progress_report(r->o->progress, "steps", r->step, r->steps, ctx);
}

size_t tpk_gp_select_size(const tpk_gp_experiment_opts *o, size_t n)
{
    return o->select_n < n ? o->select_n : n;
}

double tpk_gp_impl_mean_diag(const tpk_array *K)
{
    const size_t n = K->dims[0];
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += K->data[i * n + i];
    return s / (double)n;
}

int tpk_gp_impl_noise_range(const tpk_array *K, double *lo, double *hi, tpk_ctx *ctx)
{
    const size_t n = K->dims[0];
    double md = 0;
    for (size_t i = 0; i < n; i++) /* the mean without the sum's overflow */
        md += K->data[i * n + i] / (double)n;
    if (!(md > 0))
        md = md == 0 ? 1 : md;
    *lo = GP_NOISE_REL_LO * md;
    *hi = GP_NOISE_REL_HI * md;
    if (!isfinite(*hi) || !(*lo > 0))
        return TPK_ERROR(ctx, TPK_EDOM, "the kernel's mean diagonal is %g: too large for a noise "
                         "search (up to %g times it); rescale the kernel (its amplitude or "
                         "weight variance) or give --noise", md, GP_NOISE_REL_HI);
    return TPK_OK;
}

/* ---- the noise ------------------------------------------------------------------------------- */

int tpk_gp_report_noise_guess(tpk_gp_report *r, const tpk_array *Ks, double *ratio,
                              double *scale, double *lml_select, tpk_ctx *ctx)
{
    const size_t k = Ks->dims[0];
    tpk_array Ys = *r->d->Y;
    Ys.dims[0] = k; /* a view of the first k targets */
    tpk_gp_spectral *sp = tpk_gp_spectral_alloc(Ks, &Ys, ctx);
    int st = sp ? TPK_OK : ctx->status;
    tpk_gp_noise_choice ch = {0};
    double lo, hi;
    if (!st && !(st = tpk_gp_impl_noise_range(Ks, &lo, &hi, ctx)))
        st = tpk_gp_spectral_choose_noise(sp, lo, hi, r->o->fit_scale, &ch, ctx);
    if (!st) {
        *scale = ch.scale;
        *ratio = ch.noise / ch.scale;
        *lml_select = ch.lml;
        if (ch.at_bound && r->o->warnings)
            fprintf(r->o->warnings, "%s: warning: the LML-optimal noise sits at the edge of the "
                    "searched range (%g)\n", r->o->name, ch.noise);
    }
    tpk_gp_spectral_free(sp);
    return st;
}

void tpk_gp_report_noise_start(const tpk_gp_report *r, double sub, double *guess, double *step)
{
    /* The subsample's optimum is biased (the LML-optimal noise falls as N grows): the walk
     * starts from it shifted by the shift the previous kernel of this run needed. */
    *guess = sub * r->noise_shift;
    *step = r->nres ? NOISE_STEP_NEXT : NOISE_STEP_FIRST;
}

void tpk_gp_report_noise_end(tpk_gp_report *r, double sub, const tpk_gp_noise_choice *ch)
{
    r->noise_shift = ch->noise / ch->scale / sub;
    if (ch->at_bound && r->o->warnings)
        fprintf(r->o->warnings, "%s: warning: noise search used its %d factorisations without "
                "bracketing the optimum; took the best seen\n", r->o->name, r->o->noise_fits);
}

/* ---- one kernel ------------------------------------------------------------------------------ */

static int write_block(tpk_gp_report *r, const char *prefix, const char *name, const tpk_array *a,
                       tpk_ctx *ctx)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s", prefix, name);
    int st = tpk_h5out_write(r->out, path, a, ctx);
    /* named axes (xarray, issue 17): mean test × output, var test (with --var-n < M its first
     * items: test_var), cov test × test2 */
    const char *dn[2] = {a->dims[0] == r->d->m ? "test" : "test_var",
                         strcmp(name, "cov") == 0 ? "test2" : "output"};
    return st ? st : tpk_h5out_dims(r->out, path, dn, a->ndim, ctx);
}

/* Test scores from the mean (and the variance of its items): accuracy (with class labels), RMSE
 * and the NLL of the noisy targets (with test targets). */
static void score(const tpk_gp_data *d, const tpk_array *mean, const tpk_array *var,
                  tpk_gp_result *res)
{
    const size_t m = d->m, c = d->c, mv = var ? var->dims[0] : 0;
    if (d->Lt) {
        size_t hits = 0;
        for (size_t i = 0; i < m; i++) {
            size_t best = 0;
            for (size_t k = 1; k < c; k++)
                if (mean->data[i * c + k] > mean->data[i * c + best])
                    best = k;
            hits += (double)best == d->Lt->data[i];
        }
        res->accuracy = (double)hits / (double)m;
    }
    if (d->Yt) {
        double se = 0, nll = 0;
        for (size_t i = 0; i < m; i++)
            for (size_t k = 0; k < c; k++) {
                double e = d->Yt->data[i * c + k] - mean->data[i * c + k];
                se += e * e;
                if (var && i < mv) { /* predictive density of the noisy target */
                    double v = var->data[i] + res->noise;
                    nll += 0.5 * log(2 * M_PI * v) + 0.5 * e * e / v;
                }
            }
        res->rmse = sqrt(se / (double)(m * c));
        res->nll = var ? nll / (double)mv : NAN;
    }
}

static void print_result(const tpk_gp_report *r, const tpk_gp_result *res)
{
    FILE *f = r->o->summary;
    if (!f)
        return;
    if (res->depth)
        fprintf(f, "  depth %-2d", res->depth);
    else
        fprintf(f, "  kernel  ");
    const double nc = (double)(r->d->n * r->d->c);
    fprintf(f, " noise %.4g  scale %.4g  lml/(NC) %+.6f", res->noise, res->scale, res->lml / nc);
    if (!isnan(res->lml_error))
        fprintf(f, " +- %.2g", res->lml_error / nc);
    if (res->fits)
        fprintf(f, " (%d fits)", res->fits);
    if (res->jitter > 0)
        fprintf(f, "  jitter %.3g", res->jitter);
    if (!isnan(res->rcond))
        fprintf(f, "  rcond %.2e", res->rcond);
    if (!isnan(res->cg_iterations))
        fprintf(f, "  cg %.0f it, residual %.2e", res->cg_iterations, res->cg_residual);
    if (!isnan(res->accuracy))
        fprintf(f, "  accuracy %.4f", res->accuracy);
    if (!isnan(res->nll))
        fprintf(f, "  nll %.4f", res->nll);
    else if (!isnan(res->rmse))
        fprintf(f, "  rmse %.4g", res->rmse);
    fprintf(f, "  (%.1f s)\n", res->seconds);
    fflush(f);
}

void tpk_gp_result_init(tpk_gp_result *res, int depth)
{
    *res = (tpk_gp_result){.depth = depth, .noise = NAN, .scale = NAN, .lml = NAN,
                           .lml_select = NAN, .jitter = NAN, .rcond = NAN, .lml_error = NAN,
                           .cg_iterations = NAN, .cg_residual = NAN, .seconds = NAN,
                           .accuracy = NAN, .nll = NAN, .rmse = NAN};
}

int tpk_gp_report_kernel(tpk_gp_report *r, tpk_gp_result *res, const tpk_array *mean,
                         const tpk_array *var, const tpk_array *cov, tpk_ctx *ctx)
{
    if (r->nres >= r->nk)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_gp_report_kernel: more kernels than the %d of "
                         "the depth range", r->nk);
    char prefix[64];
    tpk_gp_report_prefix(r, res->depth, prefix, sizeof prefix);
    int st = TPK_OK;
    if (mean) {
        score(r->d, mean, var, res);
        st = write_block(r, prefix, "mean", mean, ctx);
    }
    if (!st && var)
        st = write_block(r, prefix, "var", var, ctx);
    if (!st && cov)
        st = write_block(r, prefix, "cov", cov, ctx);
    if (st)
        return st;
    double *row = r->res + (size_t)r->nres * R_NFIELDS;
    const double v[R_NFIELDS] = {
        [R_DEPTH] = res->depth, [R_NOISE] = res->noise, [R_SCALE] = res->scale,
        [R_LML] = res->lml, [R_LMLSEL] = res->lml_select, [R_JITTER] = res->jitter,
        [R_RCOND] = res->rcond, [R_ACC] = res->accuracy, [R_NLL] = res->nll,
        [R_RMSE] = res->rmse, [R_SECS] = res->seconds, [R_LMLERR] = res->lml_error,
        [R_CGIT] = res->cg_iterations, [R_CGRES] = res->cg_residual};
    memcpy(row, v, sizeof v);
    print_result(r, res);
    r->nres++;
    return TPK_OK;
}

/* ---- the file -------------------------------------------------------------------------------- */

static int write_summary(tpk_gp_report *r, tpk_ctx *ctx)
{
    const opts *o = r->o;
    int st = tpk_h5out_provenance(r->out, o->argc, o->argv, ctx);
    tpk_array *col = tpk_array_alloc(1, (size_t[]){(size_t)r->nres}, ctx);
    if (!col)
        return ctx->status;
    /* one entry per kernel: the axis "depth" (its values the depths, integers) for a depth
     * range, else "model" */
    const char *kdim[1] = {r->multi ? "depth" : "model"};
    long long *dv = r->multi ? tpk_malloc(ctx, (size_t)r->nres * sizeof *dv) : NULL;
    for (int i = 0; dv && i < r->nres; i++)
        dv[i] = (long long)r->res[(size_t)i * R_NFIELDS + R_DEPTH];
    if (!st && r->multi)
        st = dv ? tpk_h5out_coord_ints(r->out, "depth", dv, (size_t)r->nres, ctx)
                : TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    if (!st && r->multi)
        st = tpk_h5out_write_ints(r->out, "/depths", dv, (size_t)r->nres, ctx);
    if (!st && r->multi)
        st = tpk_h5out_dims(r->out, "/depths", kdim, 1, ctx);
    tpk_free(ctx, dv);
    for (int f = R_DEPTH + 1; f < R_NFIELDS && !st; f++) {
        int any = 0;
        for (int i = 0; i < r->nres; i++) {
            col->data[i] = r->res[(size_t)i * R_NFIELDS + f];
            any |= !isnan(col->data[i]);
        }
        /* NaN marks a quantity this run does not compute (lml_select with a given noise, nll
         * without test targets, the error bar of an exact LML): no dataset then. A NaN among
         * computed values is a failure, which the writer refuses. */
        if (!any)
            continue;
        char path[64];
        snprintf(path, sizeof path, "/%s", res_names[f]);
        st = tpk_h5out_write(r->out, path, col, ctx);
        if (!st)
            st = tpk_h5out_dims(r->out, path, kdim, 1, ctx);
        if (!st && f == R_SECS)
            st = tpk_h5out_attr_str(r->out, path, "units", "s", ctx);
    }
    tpk_array_free(col);
    const char *kind = o->kernel_file ? "precomputed" : o->program ? "program" : o->kernel;
    if (!st) st = tpk_h5out_attr_str(r->out, "/", "kernel", kind, ctx);
    if (!st && tpk_gp_experiment_table_kernel(o)) { /* what gpkernel would record */
        if (o->program) {
            st = tpk_h5out_attr_str(r->out, "/", "program", o->program, ctx);
            if (!st) st = tpk_h5out_program_attrs(r->out, o->program, NULL, ctx);
        }
        for (int i = 0; !st && i < o->narch_flags; i++) {
            char name[64];
            snprintf(name, sizeof name, "%s", o->arch_flags[i].flag);
            for (char *c = name; *c; c++)
                *c = *c == '-' ? '_' : *c;
            st = tpk_h5out_attr_auto(r->out, "/", name, o->arch_flags[i].value, ctx);
        }
        for (int i = 0; !st && i < o->nsets; i++)
            st = tpk_h5out_attr_auto(r->out, "/", o->sets[i].name, o->sets[i].value, ctx);
        if (!st && o->layernorm)
            st = tpk_h5out_attr_int(r->out, "/", "layernorm", 1, ctx);
    } else if (!st && o->kernel && strcmp(o->kernel, "mlp") == 0) {
        st = tpk_h5out_attr_str(r->out, "/", "phi", o->phi, ctx);
        if (!st) st = tpk_h5out_attr_double(r->out, "/", "sigma_w2", o->sigma_w2, ctx);
        if (!st) st = tpk_h5out_attr_double(r->out, "/", "sigma_b2", o->sigma_b2, ctx);
    }
    if (!st) st = tpk_h5out_attr_str(r->out, "/", "noise_selection",
                                     o->fit_hyper ? "fit-hyper: LML by BFGS on a training subsample"
                                     : o->noise_auto ? "auto: training LML, subsample "
                                                       "eigendecomposition then full-size walk, "
                                                       "scale profiled"
                                                     : "fixed", ctx);
    if (!st) st = tpk_h5out_attr_int(r->out, "/", "select_n", (long long)o->select_n, ctx);
    if (!st) st = tpk_h5out_attr_int(r->out, "/", "noise_fits", o->noise_fits, ctx);
    if (!st) st = tpk_h5out_attr_int(r->out, "/", "nll_test_items",
                                     (long long)(o->var_n > 0 && o->var_n < r->d->m ? o->var_n
                                                                                    : r->d->m),
                                     ctx);
    if (!st) st = tpk_h5out_attr_str(r->out, "/", "model",
                                     "y_c ~ N(0, scale*(K + (noise/scale) I)) for each output c; "
                                     "var is the latent variance (add noise for targets)", ctx);
    if (!st) st = tpk_h5out_attr_int(r->out, "/", "classify", o->classify, ctx);
    return st;
}

int tpk_gp_report_commit(tpk_gp_report *r, tpk_ctx *ctx)
{
    const tpk_gp_data *d = r->d;
    int st = write_summary(r, ctx);
    if (!st && d->X)
        st = tpk_h5out_input_attrs(r->out, "input", &d->xi, d->X, ctx);
    if (!st && d->Xt)
        st = tpk_h5out_input_attrs(r->out, "test", &d->ti, d->Xt, ctx);
    if (st)
        return st;
    st = tpk_h5out_commit(r->out, ctx);
    r->out = NULL;
    const opts *o = r->o;
    if (!st && o->summary && r->multi && d->m && o->classify) {
        int b = 0;
        for (int i = 1; i < r->nres; i++)
            if (r->res[(size_t)i * R_NFIELDS + R_LML] > r->res[(size_t)b * R_NFIELDS + R_LML])
                b = i;
        fprintf(o->summary, "  depth chosen by training LML: %d (accuracy %.4f)\n",
                (int)r->res[(size_t)b * R_NFIELDS + R_DEPTH],
                r->res[(size_t)b * R_NFIELDS + R_ACC]);
    }
    return st;
}
