/* Exponent estimation (theory.md §7.4): OLS of log statistic on log width, the two-term model
 * c1 n^(-1/2) + c2 n^(-1), bootstrap-over-seeds percentile intervals, and the exponent's
 * stability as small widths are dropped. */
#include "tpk/limits.h"
#include "tpk/alloc.h"

/* OpenBLAS cblas.h first, then keep GSL's gsl_cblas.h out (they declare the same enums). */
#include <cblas.h>
#define __GSL_CBLAS_H__
#include <gsl/gsl_errno.h>
#include <gsl/gsl_multifit.h>
#include <gsl/gsl_rng.h>
#include <gsl/gsl_sort.h>
#include <gsl/gsl_statistics_double.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "limits-impl.h"

int tpk_limits_stat_rms(const double *recs, size_t S, size_t rec, const size_t *idx,
                        const void *user, double *out, tpk_ctx *ctx)
{
    (void)user;
    if (rec != 1 || S == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_limits_stat_rms: needs rec = 1 and S > 0");
    double s2 = 0;
    for (size_t i = 0; i < S; i++) {
        double e = recs[idx ? idx[i] : i];
        s2 += e * e;
    }
    *out = sqrt(s2 / (double)S);
    return TPK_OK;
}

int tpk_limits_fit_power(const double *n, const double *y, size_t W, double *slope,
                         double *intercept, double *se, tpk_ctx *ctx)
{
    if (!n || !y || !slope || !intercept)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_limits_fit_power: NULL argument");
    if (W < 2)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_limits_fit_power: needs 2 or more widths, got %zu",
                         W);
    double mx = 0, my = 0;
    for (size_t i = 0; i < W; i++) {
        if (!(n[i] > 0) || !(y[i] > 0) || !isfinite(y[i]) || !isfinite(n[i]))
            return TPK_ERROR(ctx, TPK_EDOM,
                             "tpk_limits_fit_power: point %zu (n = %g, y = %g) is not positive",
                             i, n[i], y[i]);
        mx += log(n[i]);
        my += log(y[i]);
    }
    mx /= (double)W;
    my /= (double)W;
    double sxx = 0, sxy = 0;
    for (size_t i = 0; i < W; i++) {
        double dx = log(n[i]) - mx;
        sxx += dx * dx;
        sxy += dx * (log(y[i]) - my);
    }
    if (!(sxx > 0))
        return TPK_ERROR(ctx, TPK_EDOM, "tpk_limits_fit_power: all widths are equal");
    double b = sxy / sxx, a = my - b * mx;
    *slope = b;
    *intercept = a;
    if (se) {
        double rss = 0;
        for (size_t i = 0; i < W; i++) {
            double r = log(y[i]) - a - b * log(n[i]);
            rss += r * r;
        }
        *se = W > 2 ? sqrt(rss / (double)(W - 2) / sxx) : 0.0;
    }
    return TPK_OK;
}

int tpk_limits_fit_two_term(const double *n, const double *y, const double *w, size_t W,
                            double *c1, double *c2, double cov[4], double *chisq, tpk_ctx *ctx)
{
    tpk_error_gsl_init(); /* GSL failures as return codes, never abort() (tpk/error.h) */
    if (!n || !y || !c1 || !c2)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_limits_fit_two_term: NULL argument");
    if (W < 2)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_limits_fit_two_term: needs 2 or more widths");
    for (size_t i = 0; i < W; i++)
        if (!(n[i] > 0) || !isfinite(y[i]) || (w && !(w[i] >= 0)))
            return TPK_ERROR(ctx, TPK_EDOM, "tpk_limits_fit_two_term: bad point %zu", i);
    /* the matrices and vectors are views of one buffer from the allocator hook (tpk/alloc.h);
     * only GSL's least-squares workspace is GSL's own */
    double *buf = tpk_malloc(ctx, (4 * W + 6) * sizeof *buf);
    gsl_multifit_linear_workspace *ws = buf ? gsl_multifit_linear_alloc(W, 2) : NULL;
    int st = TPK_OK;
    if (!buf || !ws) {
        st = TPK_ERROR(ctx, TPK_ENOMEM, "tpk_limits_fit_two_term: out of memory");
    } else {
        gsl_matrix_view Xv = gsl_matrix_view_array(buf, W, 2);
        gsl_matrix_view Cv = gsl_matrix_view_array(buf + 2 * W, 2, 2);
        gsl_vector_view Yv = gsl_vector_view_array(buf + 2 * W + 4, W);
        gsl_vector_view Wv = gsl_vector_view_array(buf + 3 * W + 4, W);
        gsl_vector_view cv = gsl_vector_view_array(buf + 4 * W + 4, 2);
        gsl_matrix *X = &Xv.matrix, *C = &Cv.matrix;
        gsl_vector *Y = &Yv.vector, *Wt = w ? &Wv.vector : NULL, *c = &cv.vector;
        for (size_t i = 0; i < W; i++) {
            gsl_matrix_set(X, i, 0, 1.0 / sqrt(n[i]));
            gsl_matrix_set(X, i, 1, 1.0 / n[i]);
            gsl_vector_set(Y, i, y[i]);
            if (Wt)
                gsl_vector_set(Wt, i, w[i]);
        }
        double chi = 0;
        int g = Wt ? gsl_multifit_wlinear(X, Wt, Y, c, C, &chi, ws)
                   : gsl_multifit_linear(X, Y, c, C, &chi, ws);
        if (g != GSL_SUCCESS) {
            st = TPK_ERROR(ctx, TPK_ENUMERIC, "tpk_limits_fit_two_term: %s", gsl_strerror(g));
        } else {
            *c1 = gsl_vector_get(c, 0);
            *c2 = gsl_vector_get(c, 1);
            if (cov)
                for (int i = 0; i < 4; i++)
                    cov[i] = gsl_matrix_get(C, (size_t)(i / 2), (size_t)(i % 2));
            if (chisq)
                *chisq = chi;
        }
    }
    if (ws != NULL)
        gsl_multifit_linear_free(ws);
    tpk_free(ctx, buf);
    return st;
}

int tpk_limits_fit_window(const double *n, size_t W, const tpk_limits_fit *all, double ratio,
                          size_t keep, tpk_limits_window *out, tpk_ctx *ctx)
{
    if (!n || !all || !out)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_limits_fit_window: NULL argument");
    if (keep < 2 || keep > W || !(ratio > 0))
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_limits_fit_window: needs 2 <= keep <= W (%zu, %zu) "
                         "and ratio > 0", keep, W);
    if (!isfinite(all->c1) || !isfinite(all->c2) || !(all->c2_lo <= all->c2_hi))
        return TPK_ERROR(ctx, TPK_EDOM, "tpk_limits_fit_window: the two-term fit is not finite");
    for (size_t i = 0; i < W; i++)
        if (!(n[i] > 0) || (i > 0 && !(n[i] > n[i - 1])))
            return TPK_ERROR(ctx, TPK_EDOM, "tpk_limits_fit_window: widths must increase");
    memset(out, 0, sizeof *out);
    out->c1 = all->c1;
    out->c2 = all->c2;
    out->resolved = all->c2_lo > 0 || all->c2_hi < 0;
    double c1 = out->c1, c2 = out->resolved ? fabs(out->c2) : 0;
    size_t first = W;
    if (c1 > 0) {
        out->n_needed = pow(c2 / (ratio * c1), 2);
        for (size_t i = 0; i < W && first == W; i++)
            if (c2 / (c1 * sqrt(n[i])) <= ratio)
                first = i;
    } else {
        out->n_needed = out->resolved ? INFINITY : 0;
        first = out->resolved ? W : 0;
    }
    if (first > W - keep) {
        first = W - keep;
        out->capped = 1;
    }
    out->first = first;
    out->ratio_at_first = c1 > 0 ? fabs(out->c2) / (c1 * sqrt(n[first])) : INFINITY;
    return TPK_OK;
}

/* Both fits on points first..W−1 of (n, y); the two-term fit weighted 1/y² (relative errors,
 * since y spans decades). Returns nonzero if y is not positive there. */
static int fit_both(const double *n, const double *y, size_t W, size_t first, double *slope,
                    double *icpt, double *se, double *c1, double *c2, double *wbuf, tpk_ctx *ctx)
{
    size_t m = W - first;
    int st = tpk_limits_fit_power(n + first, y + first, m, slope, icpt, se, ctx);
    if (st)
        return st;
    for (size_t i = 0; i < m; i++)
        wbuf[i] = 1.0 / (y[first + i] * y[first + i]);
    return tpk_limits_fit_two_term(n + first, y + first, wbuf, m, c1, c2, NULL, NULL, ctx);
}

/* Percentile interval of v[0..m−1] (sorted in place). */
static void interval(double *v, size_t m, double level, double *lo, double *hi, double *med)
{
    if (m == 0) {
        *lo = *hi = NAN;
        if (med)
            *med = NAN;
        return;
    }
    gsl_sort(v, 1, m);
    double a = 0.5 * (1 - level);
    *lo = gsl_stats_quantile_from_sorted_data(v, 1, m, a);
    *hi = gsl_stats_quantile_from_sorted_data(v, 1, m, 1 - a);
    if (med)
        *med = gsl_stats_quantile_from_sorted_data(v, 1, m, 0.5);
}

static int series_check(const tpk_limits_series *d, tpk_limits_stat_fn stat,
                        const tpk_limits_boot_opts *o, const char *fn, tpk_ctx *ctx)
{
    if (!d || !stat || !o || !d->n || !d->recs)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: NULL argument", fn);
    if (d->S < 2 || d->rec == 0 || d->W < 2)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: needs W >= 2 widths, S >= 2 seeds, rec >= 1", fn);
    if (o->B < 10)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: B = %zu replicates is too few (>= 10)", fn, o->B);
    if (!(o->level > 0 && o->level < 1))
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: level %g outside (0, 1)", fn, o->level);
    return TPK_OK;
}

int tpk_limits_boot_fit(const tpk_limits_series *d, tpk_limits_stat_fn stat, const void *user,
                        const tpk_limits_boot_opts *o, tpk_limits_fit *fit, double *value,
                        double *lo, double *hi, tpk_ctx *ctx)
{
    tpk_error_gsl_init();
    static const char fn[] = "tpk_limits_boot_fit";
    int st = series_check(d, stat, o, fn, ctx);
    if (st)
        return st;
    if (!fit)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: NULL fit", fn);
    size_t W = d->W, S = d->S, rec = d->rec, B = o->B, first = o->first;
    if (first + 2 > W)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: fitting from width %zu leaves fewer than 2 of %zu",
                         fn, first, W);
    memset(fit, 0, sizeof *fit);
    fit->first = first;
    fit->nboot = B;

    double *y = tpk_malloc(ctx, W * sizeof *y), *wbuf = tpk_malloc(ctx, W * sizeof *wbuf);
    double *bstat = tpk_malloc(ctx, B * W * sizeof *bstat), *bs = tpk_malloc(ctx, B * sizeof *bs),
           *b1 = tpk_malloc(ctx, B * sizeof *b1), *b2 = tpk_malloc(ctx, B * sizeof *b2);
    unsigned char *ok = tpk_calloc(ctx, B, 1);
    if (!y || !wbuf || !bstat || !bs || !b1 || !b2 || !ok) {
        st = TPK_ERROR(ctx, TPK_ENOMEM, "%s: out of memory", fn);
        goto done;
    }
    for (size_t w = 0; w < W && st == TPK_OK; w++)
        st = stat(d->recs + w * S * rec, S, rec, NULL, user, &y[w], ctx);
    if (st)
        goto done;
    st = fit_both(d->n, y, W, first, &fit->slope, &fit->intercept, &fit->slope_se, &fit->c1,
                  &fit->c2, wbuf, ctx);
    if (st)
        goto done;

#pragma omp parallel
    {
        gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
        size_t *idx = tpk_malloc(ctx, S * sizeof *idx);
        double *yb = tpk_malloc(ctx, W * sizeof *yb), *wb = tpk_malloc(ctx, W * sizeof *wb);
        tpk_ctx lctx;
        tpk_ctx_init_from(&lctx, ctx);
        if (!r || !idx || !yb || !wb)
            TPK_ERROR(&lctx, TPK_ENOMEM, "%s: out of memory", fn);
#pragma omp for schedule(dynamic, 1)
        for (size_t b = 0; b < B; b++) {
            if (lctx.status)
                continue;
            /* One generator state per replicate: the interval is the same for any thread count. */
            gsl_rng_set(r, (unsigned long)tpk_limits_mix64(o->seed ^ tpk_limits_mix64(b)));
            int good = 1;
            for (size_t w = 0; w < W; w++) {
                if (w == 0 || !o->paired)
                    for (size_t i = 0; i < S; i++)
                        idx[i] = gsl_rng_uniform_int(r, S);
                tpk_ctx sctx; /* a failing replicate is counted, not fatal */
                tpk_ctx_init_from(&sctx, ctx);
                if (stat(d->recs + w * S * rec, S, rec, idx, user, &yb[w], &sctx) != TPK_OK ||
                    !isfinite(yb[w]))
                    yb[w] = NAN;
                if (sctx.status == TPK_ENOMEM) /* but out of memory is: no replicate is lost */
                    tpk_error_at(&lctx, TPK_ENOMEM, sctx.src_file, sctx.src_line, "%s", sctx.msg);
                bstat[b * W + w] = yb[w];
                if (w >= first && !(yb[w] > 0))
                    good = 0;
            }
            if (good) {
                tpk_ctx fctx;
                tpk_ctx_init_from(&fctx, ctx);
                double icpt;
                good = fit_both(d->n, yb, W, first, &bs[b], &icpt, NULL, &b1[b], &b2[b], wb,
                                &fctx) == TPK_OK;
                if (fctx.status == TPK_ENOMEM)
                    tpk_error_at(&lctx, TPK_ENOMEM, fctx.src_file, fctx.src_line, "%s", fctx.msg);
            }
            ok[b] = (unsigned char)good;
        }
#pragma omp critical(tpk_limits_boot_err)
        if (lctx.status && st == TPK_OK)
            st = TPK_ERROR(ctx, lctx.status, "%s", lctx.msg);
        gsl_rng_free(r);
        tpk_free(ctx, idx);
        tpk_free(ctx, yb);
        tpk_free(ctx, wb);
    }
    if (st)
        goto done;

    /* Compact the successful replicates, then take percentiles. */
    size_t m = 0;
    for (size_t b = 0; b < B; b++)
        if (ok[b]) {
            bs[m] = bs[b];
            b1[m] = b1[b];
            b2[m] = b2[b];
            m++;
        }
    fit->nfail = B - m;
    if (2 * m < B) {
        st = TPK_ERROR(ctx, TPK_ENUMERIC,
                       "%s: only %zu of %zu bootstrap replicates gave a positive statistic at "
                       "every fitted width (the statistic is at its noise floor)",
                       fn, m, B);
        goto done;
    }
    interval(bs, m, o->level, &fit->slope_lo, &fit->slope_hi, &fit->slope_med);
    interval(b1, m, o->level, &fit->c1_lo, &fit->c1_hi, NULL);
    interval(b2, m, o->level, &fit->c2_lo, &fit->c2_hi, NULL);
    for (size_t w = 0; w < W; w++) {
        if (value)
            value[w] = y[w];
        if (lo || hi) {
            size_t k = 0;
            for (size_t b = 0; b < B; b++)
                if (isfinite(bstat[b * W + w]))
                    bs[k++] = bstat[b * W + w];
            double l, h;
            interval(bs, k, o->level, &l, &h, NULL);
            if (lo)
                lo[w] = l;
            if (hi)
                hi[w] = h;
        }
    }
done:
    tpk_free(ctx, y);
    tpk_free(ctx, wbuf);
    tpk_free(ctx, bstat);
    tpk_free(ctx, bs);
    tpk_free(ctx, b1);
    tpk_free(ctx, b2);
    tpk_free(ctx, ok);
    return st;
}

int tpk_limits_stability(const tpk_limits_series *d, tpk_limits_stat_fn stat, const void *user,
                         const tpk_limits_boot_opts *o, tpk_limits_fit *fits, tpk_ctx *ctx)
{
    int st = series_check(d, stat, o, "tpk_limits_stability", ctx);
    if (st)
        return st;
    if (!fits)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_limits_stability: NULL fits");
    for (size_t k = 0; k + 2 <= d->W; k++) {
        tpk_limits_boot_opts ok = *o;
        ok.first = k;
        st = tpk_limits_boot_fit(d, stat, user, &ok, &fits[k], NULL, NULL, NULL, ctx);
        if (st)
            return st;
    }
    return TPK_OK;
}
