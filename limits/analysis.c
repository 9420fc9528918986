/* The analysis of a finite-width study's raw data (include/tpk/study.h; theory.md §7): per-seed
 * kernel errors, per-width bias / fluctuation / law distances, the fitting window, paired
 * bootstrap fits of every exponent, the sliced distances; then the HDF5 datasets and the human
 * summary of gplimits. */
#include "tpk/study.h"
#include "tpk/alloc.h"

#include "limits-impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Below this relative spread of the per-network output variance at the W1 coordinate, the
 * variance is fixed by the architecture (LayerNorm's unit diagonal) up to rounding; a real
 * finite-width spread is O(n^-1/2) >= 1e-3 at any width the executor runs. */
#define DEGENERATE_SPREAD 1e-9
/* theory.md §7.4 asks S >= 64; with 16 the transformer's intervals missed -1/2 at 2 of 4 seed
 * bases while 128 seeds cover it (limits/README.md). */
#define MIN_SEEDS_FOR_CI 64
/* Bootstrap replicates of the RB-W1 noise floor at each width, and GP-vs-GP sets of the sliced
 * samples floor: enough for a floor (a mean), far fewer than an interval needs. */
#define RBW1_FLOOR_BOOT 200
#define SW_FLOOR_SETS 50
/* The sliced fit bootstraps S×N×N records per replicate: boot / 5 replicates, at least this. */
#define SLICED_BOOT_MIN 50
/* Statistics need S >= 4 (the sample kurtosis) and the bootstrap at least this many replicates. */
#define MIN_SEEDS 4
#define MIN_BOOT 50

static const char *const column_names[TPK_STUDY_NCOLS] = {
    "rms", "rms_lo", "rms_hi", "bias", "bias_debiased", "bias2_debiased", "bias_floor",
    "fluctuation", "rbw1", "rbw1_floor", "rbw1_shape", "rbw1_shape_lo", "rbw1_shape_hi",
    "rbw1_variance_part", "kurtosis_mixture", "kurtosis_samples"};

const char *tpk_study_column_name(int column)
{
    return column >= 0 && column < TPK_STUDY_NCOLS ? column_names[column] : NULL;
}

void tpk_study_stats_default(tpk_study_stats *o)
{
    *o = (tpk_study_stats){.boot = 1000, .seed = 1, .w1_input = 0, .slices = 8,
                           .fit_min_width = TPK_STUDY_FIT_AUTO,
                           .fit_ratio = TPK_STUDY_FIT_RATIO_DEFAULT};
}

void tpk_study_analysis_free(tpk_study_analysis *a)
{
    if (!a)
        return;
    tpk_allocator al = a->alloc;
    tpk_mem_free(&al, a->widths);
    tpk_mem_free(&al, a->frob_rel);
    tpk_mem_free(&al, a->variance);
    for (int c = 0; c < TPK_STUDY_NCOLS; c++)
        tpk_mem_free(&al, a->col[c]);
    tpk_mem_free(&al, a->sliced_rbw1);
    tpk_mem_free(&al, a->sliced_rbw1_shape);
    tpk_mem_free(&al, a->sliced_w1_samples);
    tpk_mem_free(&al, a->theta);
    tpk_mem_free(&al, a->stability);
    tpk_mem_free(&al, a);
}

static int check_input(const tpk_study_raw *r, const tpk_study_stats *o, tpk_ctx *ctx)
{
    static const char fn[] = "tpk_study_analyse";
    if (!r || !o || !r->widths || !r->khat || !r->K) /* y may be NULL: no output samples */
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: NULL argument", fn);
    if (r->W < 2 || r->S < MIN_SEEDS || r->N < 1)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: needs >= 2 widths, >= %d seeds and >= 1 output "
                         "coordinate (got %zu, %zu, %zu)", fn, MIN_SEEDS, r->W, r->S, r->N);
    for (size_t w = 0; w < r->W; w++)
        if (!(r->widths[w] > 0) || (w > 0 && !(r->widths[w] > r->widths[w - 1])))
            return TPK_ERROR(ctx, TPK_EINVAL, "%s: widths must be positive and increase", fn);
    if (o->w1_input >= r->N)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: w1_input %zu is not below the %zu output "
                         "coordinates", fn, o->w1_input, r->N);
    if (o->boot < MIN_BOOT || o->slices < 1)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: needs boot >= %d and slices >= 1", fn, MIN_BOOT);
    if (o->fit_min_width == TPK_STUDY_FIT_AUTO && !(o->fit_ratio > 0))
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: fit_ratio must be > 0 (got %g)", fn, o->fit_ratio);
    return TPK_OK;
}

/* Per width: bias/fluctuation, plain RB-W1 and its floor, variance part, sample kurtosis. */
static int per_width(tpk_study_analysis *a, const tpk_study_raw *r, double *proj, tpk_ctx *ctx)
{
    const size_t S = r->S, N = r->N, NN = N * N, i0 = a->stats.w1_input;
    const double vinf = r->K[i0 * N + i0];
    int st = TPK_OK;
    for (size_t w = 0; w < r->W && st == TPK_OK; w++) {
        tpk_limits_bias_result b;
        st = tpk_limits_bias(r->khat + w * S * NN, S, NN, r->K, &b, ctx);
        if (st)
            break;
        a->col[TPK_STUDY_BIAS][w] = b.bias;
        a->col[TPK_STUDY_BIAS_DEBIASED][w] = b.bias_debiased;
        a->col[TPK_STUDY_BIAS2_DEBIASED][w] = b.bias2_debiased;
        a->col[TPK_STUDY_BIAS_FLOOR][w] = b.floor;
        a->col[TPK_STUDY_FLUCT][w] = b.fluct;
        const double *v = a->variance + w * S;
        st = tpk_limits_rbw1(v, S, vinf, &a->col[TPK_STUDY_RBW1][w], ctx);
        if (st == TPK_OK)
            st = tpk_limits_rbw1_floor(v, S, RBW1_FLOOR_BOOT, a->stats.seed + 7 * w,
                                       &a->col[TPK_STUDY_RBW1_FLOOR][w], ctx);
        double vbar = 0;
        for (size_t s = 0; s < S; s++)
            vbar += v[s] / (double)S;
        a->col[TPK_STUDY_VARPART][w] = sqrt(2 / M_PI) * fabs(sqrt(vbar) - sqrt(vinf));
        if (r->y == NULL) { /* no output samples (the NTK): their law is not compared */
            a->col[TPK_STUDY_KURT_SAMPLES][w] = NAN;
            continue;
        }
        for (size_t s = 0; s < S; s++)
            proj[s] = r->y[(w * S + s) * N + i0];
        if (st == TPK_OK)
            st = tpk_limits_kurtosis(proj, S, &a->col[TPK_STUDY_KURT_SAMPLES][w], ctx);
    }
    return st;
}

/* Fitting window. Default: the rule of tpk_limits_fit_window on the RMS error (it never looks
 * at the fitted exponent; theory.md §7.4): if the all-widths paired-bootstrap two-term fit
 * resolves an n^-1 term (c2's interval excludes 0), start at the smallest n_min where it is at
 * most fit_ratio of the n^-1/2 term, keeping >= 3 widths; else keep all widths. The same window
 * serves every fit; the stability fits show every other choice. */
static int choose_window(tpk_study_analysis *a, const tpk_limits_series *ds_err,
                         tpk_limits_boot_opts *bo, tpk_ctx *ctx)
{
    const size_t W = a->W;
    const double *n = a->widths;
    int st = tpk_limits_stability(ds_err, tpk_limits_stat_rms, NULL, bo, a->stability, ctx);
    size_t first = 0;
    memset(&a->window, 0, sizeof a->window);
    a->auto_window = a->stats.fit_min_width == TPK_STUDY_FIT_AUTO;
    if (st == TPK_OK && a->auto_window)
        st = tpk_limits_fit_window(n, W, &a->stability[0], a->stats.fit_ratio, W >= 3 ? 3 : 2,
                                   &a->window, ctx);
    if (st)
        return st;
    if (a->auto_window)
        first = a->window.first;
    else
        while (first < W && n[first] < (double)a->stats.fit_min_width)
            first++;
    if (first + 2 > W)
        return TPK_ERROR(ctx, TPK_EINVAL, "--fit-min-width=%zu leaves fewer than 2 widths to fit",
                         a->stats.fit_min_width);
    bo->first = first;
    return TPK_OK;
}

/* Sliced over all compared coordinates: RB (variance-matched and plain), samples vs GP floor. */
static int sliced(tpk_study_analysis *a, const tpk_study_raw *r, const tpk_limits_boot_opts *bo,
                  tpk_ctx *ctx)
{
    const size_t W = r->W, S = r->S, N = r->N, NN = N * N, L = a->stats.slices;
    int st = tpk_limits_directions(N, L, a->stats.seed, a->theta, ctx);
    tpk_limits_slices sl = {N, L, a->theta, r->K, 0};
    for (size_t w = 0; w < W && st == TPK_OK; w++) {
        st = tpk_limits_rbsw1(r->khat + w * S * NN, S, &sl, &a->sliced_rbw1[w], ctx);
        if (st == TPK_OK && r->y == NULL)
            a->sliced_w1_samples[w] = NAN;
        else if (st == TPK_OK)
            st = tpk_limits_sw1_samples(r->y + w * S * N, S, &sl, &a->sliced_w1_samples[w], ctx);
    }
    if (st == TPK_OK)
        st = tpk_limits_sw1_gp_floor(S, &sl, SW_FLOOR_SETS, a->stats.seed, &a->gp_floor_mean,
                                     &a->gp_floor_sd, ctx);
    sl.matched = 1;
    tpk_limits_series ds_k = {W, S, NN, a->widths, r->khat};
    tpk_limits_boot_opts bs = *bo;
    bs.B = a->stats.boot / 5 < SLICED_BOOT_MIN ? SLICED_BOOT_MIN : a->stats.boot / 5;
    if (st == TPK_OK)
        st = tpk_limits_boot_fit(&ds_k, tpk_limits_stat_rbsw1, &sl, &bs, &a->sliced,
                                 a->sliced_rbw1_shape, NULL, NULL, ctx);
    return st;
}

static tpk_study_analysis *analysis_alloc(const tpk_study_raw *r, const tpk_study_stats *o,
                                          tpk_ctx *ctx)
{
    const size_t W = r->W, S = r->S;
    tpk_study_analysis *a = tpk_calloc(ctx, 1, sizeof *a);
    if (a != NULL)
        a->alloc = tpk_ctx_allocator(ctx);
    if (!a) {
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        return NULL;
    }
    a->W = W;
    a->S = S;
    a->N = r->N;
    a->stats = *o;
    int ok = (a->widths = tpk_malloc(ctx, W * sizeof(double))) != NULL;
    ok &= (a->frob_rel = tpk_malloc(ctx, W * S * sizeof(double))) != NULL;
    ok &= (a->variance = tpk_malloc(ctx, W * S * sizeof(double))) != NULL;
    for (int c = 0; c < TPK_STUDY_NCOLS; c++)
        ok &= (a->col[c] = tpk_calloc(ctx, W, sizeof(double))) != NULL;
    ok &= (a->sliced_rbw1 = tpk_calloc(ctx, W, sizeof(double))) != NULL;
    ok &= (a->sliced_rbw1_shape = tpk_calloc(ctx, W, sizeof(double))) != NULL;
    ok &= (a->sliced_w1_samples = tpk_calloc(ctx, W, sizeof(double))) != NULL;
    ok &= (a->theta = tpk_malloc(ctx, o->slices * r->N * sizeof(double))) != NULL;
    ok &= (a->stability = tpk_calloc(ctx, W, sizeof *a->stability)) != NULL;
    if (!ok) {
        tpk_study_analysis_free(a);
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory for the analysis of %zu widths x %zu seeds", W,
                  S);
        return NULL;
    }
    memcpy(a->widths, r->widths, W * sizeof(double));
    return a;
}

tpk_study_analysis *tpk_study_analyse(const tpk_study_raw *r, const tpk_study_stats *o,
                                      tpk_ctx *ctx)
{
    if (check_input(r, o, ctx))
        return NULL;
    const size_t W = r->W, S = r->S, N = r->N, NN = N * N, i0 = o->w1_input;
    tpk_study_analysis *a = analysis_alloc(r, o, ctx);
    double *proj = a ? tpk_malloc(ctx, S * sizeof *proj) : NULL;
    if (!proj) {
        if (a)
            TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        tpk_study_analysis_free(a);
        return NULL;
    }
    int st = TPK_OK;
    for (size_t k = 0; k < W * S && st == TPK_OK; k++) {
        st = tpk_limits_frob_rel(r->khat + k * NN, r->K, NN, &a->frob_rel[k], ctx);
        a->variance[k] = r->khat[k * NN + i0 * N + i0];
    }
    const double vinf = r->K[i0 * N + i0];
    a->vdev = 0;
    for (size_t k = 0; k < W * S && st == TPK_OK; k++)
        a->vdev = fmax(a->vdev, fabs(a->variance[k] - vinf) / vinf);
    a->degenerate = a->vdev < DEGENERATE_SPREAD;
    if (st == TPK_OK)
        st = per_width(a, r, proj, ctx);
    /* Paired bootstrap: seed s is the same network seed at every width (nested, §7.3). */
    tpk_limits_boot_opts bo = {o->boot, o->seed, 0.95, 1, 0};
    tpk_limits_series ds_err = {W, S, 1, a->widths, a->frob_rel};
    tpk_limits_series ds_v = {W, S, 1, a->widths, a->variance};
    if (st == TPK_OK)
        st = choose_window(a, &ds_err, &bo, ctx);
    if (st == TPK_OK)
        st = tpk_limits_boot_fit(&ds_err, tpk_limits_stat_rms, NULL, &bo, &a->rms,
                                 a->col[TPK_STUDY_RMS], a->col[TPK_STUDY_RMS_LO],
                                 a->col[TPK_STUDY_RMS_HI], ctx);
    if (st == TPK_OK)
        st = tpk_limits_boot_fit(&ds_v, tpk_limits_stat_rbw1, NULL, &bo, &a->shape,
                                 a->col[TPK_STUDY_SHAPE], a->col[TPK_STUDY_SHAPE_LO],
                                 a->col[TPK_STUDY_SHAPE_HI], ctx);
    if (st == TPK_OK)
        st = tpk_limits_boot_fit(&ds_v, tpk_limits_stat_rbw1, &vinf, &bo, &a->rbw1, NULL, NULL,
                                 NULL, ctx);
    if (st == TPK_OK)
        st = tpk_limits_boot_fit(&ds_v, tpk_limits_stat_mix_kurtosis, NULL, &bo, &a->kurt,
                                 a->col[TPK_STUDY_KURT_MIX], NULL, NULL, ctx);
    if (st == TPK_OK)
        st = sliced(a, r, &bo, ctx);
    tpk_free(ctx, proj);
    if (st) {
        tpk_study_analysis_free(a);
        return NULL;
    }
    return a;
}

/* ---- Output ------------------------------------------------------------------------------------ */

/* The fields of a fit record (/fits/NAME, its dimension fit_stat) and of the stability table. */
#define FIT_NFIELDS 14
static const char *const fit_fields[FIT_NFIELDS] = {
    "slope", "slope_lo", "slope_hi", "slope_median", "intercept", "slope_ols_se", "c1", "c1_lo",
    "c1_hi", "c2", "c2_lo", "c2_hi", "first_width", "boot_failures"};
static const char *const stability_fields[4] = {"first_width", "slope", "slope_lo", "slope_hi"};

/* A fit as a small dataset plus readable attributes. */
static int write_fit(tpk_h5out *h, const char *name, const tpk_limits_fit *f, const double *n,
                     tpk_ctx *ctx)
{
    const char *const *keys = fit_fields;
    double v[FIT_NFIELDS] = {f->slope, f->slope_lo, f->slope_hi, f->slope_med, f->intercept, f->slope_se,
                    f->c1, f->c1_lo, f->c1_hi, f->c2, f->c2_lo, f->c2_hi, n[f->first],
                    (double)f->nfail};
    tpk_h5out_write_vector(h, name, v, FIT_NFIELDS, ctx);
    tpk_h5out_dims(h, name, (const char *const[]){"fit_stat"}, 1, ctx);
    for (int i = 0; i < FIT_NFIELDS; i++)
        tpk_h5out_attr_double(h, name, keys[i], v[i], ctx);
    tpk_h5out_attr_int(h, name, "boot_replicates", (long long)f->nboot, ctx);
    return ctx->status;
}

static int write_stability(const tpk_study_analysis *a, tpk_h5out *h, tpk_ctx *ctx)
{
    const size_t W = a->W;
    double *stb = tpk_malloc(ctx, (W - 1) * 4 * sizeof *stb);
    if (!stb)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    for (size_t k = 0; k + 1 < W; k++) {
        stb[k * 4] = a->widths[k];
        stb[k * 4 + 1] = a->stability[k].slope;
        stb[k * 4 + 2] = a->stability[k].slope_lo;
        stb[k * 4 + 3] = a->stability[k].slope_hi;
    }
    tpk_array sa = {.ndim = 2, .dims = {W - 1, 4, 0, 0}, .data = stb};
    tpk_h5out_write(h, "/fits/rms_stability", &sa, ctx);
    long long *fw = tpk_malloc(ctx, (W - 1) * sizeof *fw);
    if (!fw) {
        tpk_free(ctx, stb);
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    }
    for (size_t k = 0; k + 1 < W; k++)
        fw[k] = llround(a->widths[k]);
    tpk_h5out_coord_ints(h, "first_width", fw, W - 1, ctx);
    tpk_h5out_coord_labels(h, "stability_stat", stability_fields, 4, ctx);
    tpk_h5out_dims(h, "/fits/rms_stability", (const char *const[]){"first_width",
                   "stability_stat"}, 2, ctx);
    tpk_free(ctx, fw);
    tpk_h5out_attr_str(h, "/fits/rms_stability", "columns", "first_width slope slope_lo slope_hi",
                       ctx);
    tpk_free(ctx, stb);
    return ctx->status;
}

/* A ratio or width that is infinite by definition (c1 <= 0: the two-term fit never reaches the
 * ratio) as the text "inf", since the writer refuses non-finite numbers as failed results. */
static int attr_maybe_inf(tpk_h5out *h, const char *obj, const char *key, double v, tpk_ctx *ctx)
{
    if (isinf(v))
        return tpk_h5out_attr_str(h, obj, key, v > 0 ? "inf" : "-inf", ctx);
    return tpk_h5out_attr_double(h, obj, key, v, ctx);
}

/* How the window was chosen (tpk_limits_fit_window): attributes of /fits/rms. */
static int write_window(const tpk_study_analysis *a, tpk_h5out *h, tpk_ctx *ctx)
{
    tpk_h5out_attr_str(h, "/fits/rms", "window_rule",
                       a->auto_window
                           ? "auto: in the all-widths two-term fit of the RMS error, if c2's "
                             "95% interval excludes 0, the smallest width with |c2|/(c1 "
                             "sqrt(n)) <= window_ratio, >= 3 widths kept; else all widths"
                           : "--fit-min-width", ctx);
    if (a->auto_window) {
        const tpk_limits_window *wn = &a->window;
        tpk_h5out_attr_double(h, "/fits/rms", "window_ratio", a->stats.fit_ratio, ctx);
        tpk_h5out_attr_double(h, "/fits/rms", "window_c1_all_widths", wn->c1, ctx);
        tpk_h5out_attr_double(h, "/fits/rms", "window_c2_all_widths", wn->c2, ctx);
        attr_maybe_inf(h, "/fits/rms", "window_ratio_at_first", wn->ratio_at_first, ctx);
        attr_maybe_inf(h, "/fits/rms", "window_n_needed", wn->n_needed, ctx);
        tpk_h5out_attr_int(h, "/fits/rms", "window_capped", wn->capped, ctx);
        tpk_h5out_attr_int(h, "/fits/rms", "window_c2_resolved", wn->resolved, ctx);
    }
    return ctx->status;
}

int tpk_study_analysis_write(const tpk_study_analysis *a, tpk_h5out *h, tpk_ctx *ctx)
{
    return tpk_study_analysis_write_named(a, h, "coord", ctx);
}

/* A rank-1 statistic per width, its axis named. */
static void write_per_width(tpk_h5out *h, const char *name, const double *v, size_t W,
                            tpk_ctx *ctx)
{
    tpk_h5out_write_vector(h, name, v, W, ctx);
    tpk_h5out_dims(h, name, (const char *const[]){"width"}, 1, ctx);
}

int tpk_study_analysis_write_named(const tpk_study_analysis *a, tpk_h5out *h, const char *point,
                                   tpk_ctx *ctx)
{
    if (!a || !h)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_study_analysis_write: NULL argument");
    const size_t W = a->W, S = a->S;
    const double *n = a->widths;
    /* the coordinates of the width axis are the widths (integers); the caller may have made it */
    long long *wi = tpk_malloc(ctx, W * sizeof *wi);
    if (!wi)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    for (size_t w = 0; w < W; w++)
        wi[w] = llround(n[w]);
    if (!tpk_h5out_has(h, "/width"))
        tpk_h5out_coord_ints(h, "width", wi, W, ctx);
    tpk_free(ctx, wi);
    tpk_h5out_coord_labels(h, "fit_stat", fit_fields, FIT_NFIELDS, ctx);
    const char *const ws[] = {"width", "seed"};
    tpk_array e2 = {2, {W, S, 0, 0}, a->frob_rel, {NULL, NULL}};
    tpk_array v2 = {2, {W, S, 0, 0}, a->variance, {NULL, NULL}};
    tpk_h5out_write(h, "/per_seed/frob_rel", &e2, ctx);
    tpk_h5out_dims(h, "/per_seed/frob_rel", ws, 2, ctx);
    tpk_h5out_write(h, "/per_seed/w1_input_variance", &v2, ctx);
    tpk_h5out_dims(h, "/per_seed/w1_input_variance", ws, 2, ctx);
    /* without output samples (the NTK), their statistics are absent, not NaN */
    const int samples = !isnan(a->sliced_w1_samples[0]);
    for (int c = 0; c < TPK_STUDY_NCOLS; c++) {
        char name[64];
        if (!samples && c == TPK_STUDY_KURT_SAMPLES)
            continue;
        snprintf(name, sizeof name, "/per_width/%s", column_names[c]);
        write_per_width(h, name, a->col[c], W, ctx);
    }
    write_per_width(h, "/per_width/sliced_rbw1", a->sliced_rbw1, W, ctx);
    write_per_width(h, "/per_width/sliced_rbw1_shape", a->sliced_rbw1_shape, W, ctx);
    if (samples) {
        write_per_width(h, "/per_width/sliced_w1_samples", a->sliced_w1_samples, W, ctx);
        tpk_h5out_attr_double(h, "/per_width/sliced_w1_samples", "gp_floor_mean",
                              a->gp_floor_mean, ctx);
        tpk_h5out_attr_double(h, "/per_width/sliced_w1_samples", "gp_floor_sd", a->gp_floor_sd,
                              ctx);
    }
    tpk_array th = {.ndim = 2, .dims = {a->stats.slices, a->N, 0, 0}, .data = a->theta};
    tpk_h5out_write(h, "/slices", &th, ctx);
    tpk_h5out_dims(h, "/slices", (const char *const[]){"slice", point}, 2, ctx);
    write_fit(h, "/fits/rms", &a->rms, n, ctx);
    write_fit(h, "/fits/rbw1_shape", &a->shape, n, ctx);
    tpk_h5out_attr_int(h, "/per_seed/w1_input_variance", "degenerate", a->degenerate, ctx);
    tpk_h5out_attr_double(h, "/per_seed/w1_input_variance", "max_relative_deviation", a->vdev,
                          ctx);
    write_fit(h, "/fits/rbw1", &a->rbw1, n, ctx);
    write_fit(h, "/fits/kurtosis_mixture", &a->kurt, n, ctx);
    write_fit(h, "/fits/sliced_rbw1_shape", &a->sliced, n, ctx);
    if (ctx->status == TPK_OK)
        write_stability(a, h, ctx);
    if (ctx->status == TPK_OK)
        write_window(a, h, ctx);
    return ctx->status;
}

/* ---- Summary ----------------------------------------------------------------------------------- */

static void print_window(const tpk_study_analysis *a, FILE *f)
{
    const tpk_limits_window *wn = &a->window;
    const double *n = a->widths;
    const tpk_limits_fit *all = &a->stability[0];
    if (!wn->resolved)
        fprintf(f, "fit window n >= %g: all widths give %.4g n^-1/2 + %.4g n^-1 [c2 95%% CI "
                "%.3g, %.3g]: the n^-1 term is not resolved, every width is fitted\n",
                n[a->rms.first], wn->c1, wn->c2, all->c2_lo, all->c2_hi);
    else
        fprintf(f, "fit window n >= %g: all widths give %.4g n^-1/2 + %.4g n^-1 [c2 95%% CI "
                "%.3g, %.3g], whose n^-1 term is %.3g of the n^-1/2 term there (rule: <= "
                "%g%s)\n", n[a->rms.first], wn->c1, wn->c2, all->c2_lo, all->c2_hi,
                wn->ratio_at_first, a->stats.fit_ratio,
                wn->capped ? "; NOT MET: capped to keep 3 widths" : "");
    if (wn->capped)
        fprintf(f, "warning: widths up to >= %.0f are needed for the O(1/n) correction to be "
                "small; the exponent is biased toward %s\n", wn->n_needed,
                wn->c2 > 0 ? "steeper values" : "shallower values");
}

void tpk_study_analysis_print(const tpk_study_analysis *a, FILE *f)
{
    if (!a || !f)
        return;
    const size_t W = a->W, S = a->S;
    const double *n = a->widths;
    double *const *col = a->col;
    fprintf(f, "%7s %11s %11s %11s %11s %11s %11s %11s\n", "width", "rms", "bias_deb", "floor",
            "fluct", "rbw1_shape", "rbw1", "rbw1_floor");
    for (size_t w = 0; w < W; w++)
        fprintf(f, "%7g %11.4e %11.4e %11.4e %11.4e %11.4e %11.4e %11.4e\n", n[w],
                col[TPK_STUDY_RMS][w], col[TPK_STUDY_BIAS_DEBIASED][w],
                col[TPK_STUDY_BIAS_FLOOR][w], col[TPK_STUDY_FLUCT][w], col[TPK_STUDY_SHAPE][w],
                col[TPK_STUDY_RBW1][w], col[TPK_STUDY_RBW1_FLOOR][w]);
    const struct { const char *name; const tpk_limits_fit *f; double expect; } rows[] = {
        {"RMS kernel error", &a->rms, -0.5},
        {"RB-W1 law distance (variance-matched)", &a->shape, -1},
        {"RB-W1 vs GP (plain, floor-limited)", &a->rbw1, -1},
        {"excess kurtosis (mixture)", &a->kurt, -1},
        {"sliced RB-W1 (variance-matched)", &a->sliced, -1}};
    for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++)
        fprintf(f, "%-40s exponent %7.3f  95%% CI [%7.3f, %7.3f]  (expected %g: %s)\n",
                rows[k].name, rows[k].f->slope, rows[k].f->slope_lo, rows[k].f->slope_hi,
                rows[k].expect,
                a->degenerate && k >= 1 && k <= 3 ? "degenerate, see below"
                : rows[k].f->slope_lo <= rows[k].expect && rows[k].expect <= rows[k].f->slope_hi
                    ? "inside"
                    : "outside");
    if (S < MIN_SEEDS_FOR_CI)
        fprintf(f, "note: %zu seeds < %d (theory.md §7.4): percentile-bootstrap intervals from "
                "so few networks are too narrow and the window rule's c2 test too eager (see "
                "limits/README.md)\n", S, MIN_SEEDS_FOR_CI);
    if (a->degenerate)
        fprintf(f, "note: the output variance at coordinate %zu is the same for every network "
                "(max relative deviation %.1e; e.g. LayerNorm): its 1-D law is exactly the "
                "GP's and the 1-D fits above are of rounding noise; the sliced distance is the "
                "law statistic here\n", a->stats.w1_input, a->vdev);
    fprintf(f, "two-term RMS fit (n >= %g): %.4g n^-1/2 + %.4g n^-1\n", n[a->rms.first],
            a->rms.c1, a->rms.c2);
    if (a->auto_window)
        print_window(a, f);
    fprintf(f, "RMS exponent as small widths are dropped:");
    for (size_t k = 0; k + 1 < W; k++)
        fprintf(f, " n>=%g: %.3f", n[k], a->stability[k].slope);
    if (isnan(a->sliced_w1_samples[W - 1])) { /* no output samples: the NTK */
        fprintf(f, "\n");
        return;
    }
    fprintf(f, "\nsliced W1 of samples vs GP: %.3e at n=%g (GP-vs-GP floor %.3e +- %.1e)\n",
            a->sliced_w1_samples[W - 1], n[W - 1], a->gp_floor_mean, a->gp_floor_sd);
}
