/* Finite networks trained by the same gradient descent, against the infinite ensemble of
 * gpregress --predict=gd (issue 36, item 3; theory.md §8.10): at each width, `seeds` networks of
 * the program (tpk_job_train_arrays: the executor's forward and backward passes, NT 'ntk'
 * parameterisation) are trained on the training set at the same learning rate and steps, and
 * their test outputs are compared with the prediction three ways:
 *   - each network against the kernel dynamics started from its own initial outputs,
 *     f₀(x*) + Θ_{*d}Θ⁻¹(I − (I − ηΘ/N)^t)(Y − f₀(X)): what differs is the finite network's
 *     Θ̂ and its change in training, O(n^(-1/2)) per network, with no floor from the seeds;
 *   - the ensemble's mean against the predicted mean, relative to the predicted outputs' RMS
 *     (√(‖μ‖² + tr Σ): the mean itself is 0 at t = 0);
 *   - the ensemble's variances against the predicted ones.
 * The last two carry the sampling error of `seeds` networks, a floor that does not fall with
 * the width. Each is fitted against the width at the last recorded step, with bootstrap-over-
 * seeds intervals (tpk_limits_boot_fit; the seeds are nested across widths, so the resample is
 * paired). */
#include "gp-impl.h"
#include "tpk/alloc.h"
#include "tpk/job.h"
#include "tpk/limits.h"

#include <math.h>
#include <string.h>

typedef struct mean_user {
    const double *mu; /* predicted mean, m */
    size_t m;
    double scale;     /* √(‖μ‖² + tr Σ) */
} mean_user;

/* rec = m test outputs of one network: ‖mean over idx − μ‖ / scale. */
static int stat_mean(const double *recs, size_t S, size_t rec, const size_t *idx,
                     const void *user, double *out, tpk_ctx *ctx)
{
    const mean_user *u = user;
    double d2 = 0;
    (void)ctx;
    for (size_t i = 0; i < u->m; i++) {
        double s = 0;
        for (size_t k = 0; k < S; k++)
            s += recs[(idx ? idx[k] : k) * rec + i];
        double r = s / (double)S - u->mu[i];
        d2 += r * r;
    }
    *out = sqrt(d2) / u->scale;
    return TPK_OK;
}

typedef struct var_user {
    const double *v; /* predicted variances, mv */
    size_t mv;
} var_user;

/* rec = m test outputs: ‖sample variances over idx (first mv items) − v‖ / ‖v‖. */
static int stat_var(const double *recs, size_t S, size_t rec, const size_t *idx,
                    const void *user, double *out, tpk_ctx *ctx)
{
    const var_user *u = user;
    double d2 = 0, v2 = 0;
    if (S < 2)
        return TPK_ERROR(ctx, TPK_EINVAL, "variances need at least 2 networks");
    for (size_t i = 0; i < u->mv; i++) {
        double s = 0, q = 0;
        for (size_t k = 0; k < S; k++)
            s += recs[(idx ? idx[k] : k) * rec + i];
        s /= (double)S;
        for (size_t k = 0; k < S; k++) {
            double r = recs[(idx ? idx[k] : k) * rec + i] - s;
            q += r * r;
        }
        double r = q / (double)(S - 1) - u->v[i];
        d2 += r * r;
        v2 += u->v[i] * u->v[i];
    }
    *out = sqrt(d2 / v2);
    return TPK_OK;
}

int gp_gd_finite(const tpk_gp_experiment_opts *o, const tpk_gp_data *d, const tpk_array *T,
                 const tpk_array *K, const tpk_array *Txt, const tpk_array *Kxt,
                 const tpk_array *kd, const tpk_array *mean, const tpk_array *var, size_t mv,
                 const tpk_gd_opts *go, tpk_h5out *out, tpk_ctx *ctx)
{
    const size_t n = d->n, m = d->m, W = o->nfinite_widths, S = o->finite_seeds ? o->finite_seeds : 16;
    if (d->c != 1 || !d->Xt)
        return TPK_ERROR(ctx, TPK_EINVAL, "--finite-widths trains the program's one output on "
                         "one target column and a test set (here %zu columns%s)", d->c,
                         d->Xt ? "" : ", no test set");
    /* the finite recorded steps: the --times that are not inf, with 0 always (the networks'
     * starting outputs) */
    size_t nf = 0, *at = tpk_malloc(ctx, (o->ntimes + 1) * sizeof *at);
    size_t *ti = tpk_malloc(ctx, (o->ntimes + 1) * sizeof *ti); /* index into o->times, or SIZE_MAX */
    if (!at || !ti) {
        tpk_free(ctx, at);
        tpk_free(ctx, ti);
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    }
    at[nf] = 0, ti[nf++] = SIZE_MAX;
    for (size_t t = 0; t < o->ntimes; t++)
        if (isfinite(o->times[t])) {
            if (o->times[t] == 0)
                ti[0] = t;
            else
                at[nf] = (size_t)o->times[t], ti[nf++] = t;
        }
    for (size_t j = 1; j < nf; j++) /* ascending, as training records them */
        for (size_t k = j; k > 1 && at[k] < at[k - 1]; k--) {
            size_t a = at[k], b = ti[k];
            at[k] = at[k - 1], ti[k] = ti[k - 1];
            at[k - 1] = a, ti[k - 1] = b;
        }
    /* the training inputs, then the test inputs: one forward pass per step (tpk_netsor_train) */
    size_t dims[TPK_ARRAY_MAXDIM];
    memcpy(dims, d->X->dims, sizeof dims);
    dims[0] = n + m;
    tpk_array *X = tpk_array_alloc(d->X->ndim, dims, ctx);
    tpk_array *f = tpk_array_alloc(3, (size_t[3]){nf, n + m, 1}, ctx);
    tpk_array *Yc = tpk_array_alloc2(n, S, ctx), *pm = tpk_array_alloc(3, (size_t[3]){nf, m, S}, ctx);
    double *F = tpk_malloc(ctx, W * S * nf * (n + m) * sizeof *F);      /* w, s, step, input */
    double *enet = tpk_malloc(ctx, nf * W * S * sizeof *enet);           /* step, w, s */
    double *emean = tpk_malloc(ctx, nf * W * sizeof *emean), *evar = tpk_malloc(ctx, nf * W * sizeof *evar);
    double *recs = tpk_malloc(ctx, W * S * m * sizeof *recs), *wd = tpk_malloc(ctx, W * sizeof *wd);
    double *times = tpk_malloc(ctx, nf * sizeof *times);
    double *zero = tpk_calloc(ctx, m, sizeof *zero); /* the prediction at t = 0: mean 0, K_tt */
    int st = X && f && Yc && pm && F && enet && emean && evar && recs && wd && times && zero
                 ? TPK_OK : TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    if (!st) {
        memcpy(X->data, d->X->data, tpk_array_size(d->X) * sizeof(double));
        memcpy(X->data + tpk_array_size(d->X), d->Xt->data, tpk_array_size(d->Xt) * sizeof(double));
    }
    tpk_job job = {.label = "program", .program = o->program, .sets = o->sets, .nsets = o->nsets,
                   .netsor_plus = o->netsor_plus, .input = o->train, .test = NULL};
    for (size_t w = 0; w < W && !st; w++)
        for (size_t s = 0; s < S && !st; s++) {
            if ((st = tpk_progress_report(o->progress, "networks", w * S + s, W * S, ctx)))
                break;
            tpk_train_opts t = {.width = o->finite_widths[w], .seed = o->finite_seed + s,
                                .lr = go->lr, .at = at, .nat = nf};
            st = tpk_job_train_arrays(&job, X, n, d->Y, &t, f, NULL, ctx);
            if (!st)
                memcpy(F + (w * S + s) * nf * (n + m), f->data, nf * (n + m) * sizeof *F);
        }
    if (!st)
        st = tpk_progress_report(o->progress, "networks", W * S, W * S, ctx);
    for (size_t j = 0; j < nf; j++)
        times[j] = (double)at[j];
    /* each network's own kernel dynamics: the prediction's mean is linear in the targets, so
     * one call with a column Y − f₀(X) per network; N = n·S target entries there, hence the
     * learning rate S·η for the same (I − ηΘ/n)^t */
    tpk_gd_opts g1 = *go;
    g1.lr = go->lr * (double)S;
    for (size_t w = 0; w < W && !st; w++) {
        for (size_t s = 0; s < S; s++)
            for (size_t a = 0; a < n; a++)
                Yc->data[a * S + s] = d->Y->data[a] - F[(w * S + s) * nf * (n + m) + a];
        if ((st = tpk_gd_mse_ensemble(T, K, Txt, Kxt, NULL, Yc, times, nf, &g1, pm, NULL, ctx)))
            break;
        for (size_t j = 0; j < nf; j++)
            for (size_t s = 0; s < S; s++) {
                const double *fs = F + ((w * S + s) * nf + j) * (n + m) + n;
                const double *f0 = F + (w * S + s) * nf * (n + m) + n;
                double d2 = 0, p2 = 0;
                for (size_t i = 0; i < m; i++) {
                    double p = f0[i] + pm->data[(j * m + i) * S + s];
                    d2 += (fs[i] - p) * (fs[i] - p);
                    p2 += p * p;
                }
                enet[(j * W + w) * S + s] = p2 > 0 ? sqrt(d2 / p2) : 0.0;
            }
    }
    /* the ensemble's mean and variances against the prediction, at the steps of --times */
    for (size_t j = 0; j < nf && !st; j++) {
        size_t t = ti[j];
        const double *mu = t == SIZE_MAX ? zero : mean->data + t * m;
        const double *v = !var ? NULL : t == SIZE_MAX ? kd->data : var->data + t * mv;
        double tr = 0, mu2 = 0;
        for (size_t i = 0; v && i < mv; i++)
            tr += v[i];
        for (size_t i = 0; mu && i < m; i++)
            mu2 += mu[i] * mu[i];
        for (size_t w = 0; w < W; w++) {
            for (size_t s = 0; s < S; s++)
                memcpy(recs + (w * S + s) * m, F + ((w * S + s) * nf + j) * (n + m) + n,
                       m * sizeof *recs);
            mean_user mu_u = {mu, m, sqrt(mu2 + (mv ? tr * (double)m / (double)mv : 0))};
            var_user vu = {v, mv};
            emean[j * W + w] = evar[j * W + w] = NAN;
            if (mu_u.scale > 0)
                stat_mean(recs + w * S * m, S, m, NULL, &mu_u, &emean[j * W + w], ctx);
            if (v && mv && tr > 0)
                stat_var(recs + w * S * m, S, m, NULL, &vu, &evar[j * W + w], ctx);
        }
    }
    /* fits at the last recorded step, if it is one of --times (not only the added 0) */
    tpk_limits_fit fn = {0}, fm = {0}, fv = {0};
    size_t jl = nf - 1, tl = ti[jl];
    int fitted = 0;
    if (!st && nf > 1 && W >= 2) {
        for (size_t w = 0; w < W; w++)
            wd[w] = (double)o->finite_widths[w];
        tpk_limits_boot_opts bo = {.B = o->finite_boot ? o->finite_boot : 1000, .seed = 1,
                                   .level = 0.95, .paired = 1, .first = 0};
        tpk_limits_series sn = {W, S, 1, wd, enet + jl * W * S};
        st = tpk_limits_boot_fit(&sn, tpk_limits_stat_rms, NULL, &bo, &fn, NULL, NULL, NULL, ctx);
        for (size_t w = 0; w < W && !st; w++)
            for (size_t s = 0; s < S; s++)
                memcpy(recs + (w * S + s) * m, F + ((w * S + s) * nf + jl) * (n + m) + n,
                       m * sizeof *recs);
        tpk_limits_series se = {W, S, m, wd, recs};
        double mu2 = 0, tr = 0;
        const double *mu = mean->data + tl * m, *v = var ? var->data + tl * mv : NULL;
        for (size_t i = 0; i < m; i++)
            mu2 += mu[i] * mu[i];
        for (size_t i = 0; v && i < mv; i++)
            tr += v[i];
        mean_user mu_u = {mu, m, sqrt(mu2 + (mv ? tr * (double)m / (double)mv : 0))};
        var_user vu = {v, mv};
        if (!st)
            st = tpk_limits_boot_fit(&se, stat_mean, &mu_u, &bo, &fm, NULL, NULL, NULL, ctx);
        if (!st && v && mv)
            st = tpk_limits_boot_fit(&se, stat_var, &vu, &bo, &fv, NULL, NULL, NULL, ctx);
        fitted = !st;
    }
    /* the output: per-network and ensemble distances per (step, width), the outputs */
    long long *c = st ? NULL : tpk_malloc(ctx, (nf > W ? (nf > S ? nf : S) : (W > S ? W : S)) * sizeof *c);
    if (!st && !c)
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    for (size_t j = 0; !st && j < nf; j++)
        c[j] = (long long)at[j];
    if (!st) st = tpk_h5out_coord_ints(out, "finite_step", c, nf, ctx);
    for (size_t w = 0; !st && w < W; w++)
        c[w] = (long long)o->finite_widths[w];
    if (!st) st = tpk_h5out_coord_ints(out, "finite_width", c, W, ctx);
    for (size_t s = 0; !st && s < S; s++)
        c[s] = (long long)(o->finite_seed + s);
    if (!st) st = tpk_h5out_coord_ints(out, "finite_seed", c, S, ctx);
    tpk_array a3 = {0}, a2 = {0};
    a3.ndim = 3, a3.dims[0] = nf, a3.dims[1] = W, a3.dims[2] = S, a3.data = enet;
    a2.ndim = 2, a2.dims[0] = nf, a2.dims[1] = W, a2.data = emean;
    if (!st) st = tpk_h5out_write(out, "/finite_net_rel", &a3, ctx);
    if (!st) st = tpk_h5out_dims(out, "/finite_net_rel", (const char *const[]){"finite_step", "finite_width", "finite_seed"}, 3, ctx);
    if (!st) st = tpk_h5out_write(out, "/finite_mean_rel", &a2, ctx);
    if (!st) st = tpk_h5out_dims(out, "/finite_mean_rel", (const char *const[]){"finite_step", "finite_width"}, 2, ctx);
    a2.data = evar;
    if (!st && var) st = tpk_h5out_write(out, "/finite_var_rel", &a2, ctx);
    if (!st && var) st = tpk_h5out_dims(out, "/finite_var_rel", (const char *const[]){"finite_step", "finite_width"}, 2, ctx);
    tpk_array a4 = {0};
    a4.ndim = 4, a4.dims[0] = W, a4.dims[1] = S, a4.dims[2] = nf, a4.dims[3] = n + m, a4.data = F;
    if (!st) st = tpk_h5out_write(out, "/finite_outputs", &a4, ctx);
    if (!st) st = tpk_h5out_dims(out, "/finite_outputs", (const char *const[]){"finite_width", "finite_seed", "finite_step", "train_test"}, 4, ctx);
    const struct { const char *name; const tpk_limits_fit *f; } fits[3] = {
        {"finite_net", &fn}, {"finite_mean", &fm}, {"finite_var", &fv}};
    for (int k = 0; fitted && !st && k < 3; k++) {
        if (k == 2 && !(var && mv))
            break;
        char key[64];
        const double vals[3] = {fits[k].f->slope, fits[k].f->slope_lo, fits[k].f->slope_hi};
        const char *suf[3] = {"exponent", "exponent_lo", "exponent_hi"};
        for (int q = 0; q < 3 && !st; q++) {
            snprintf(key, sizeof key, "%s_%s", fits[k].name, suf[q]);
            st = tpk_h5out_attr_double(out, "/", key, vals[q], ctx);
        }
    }
    if (!st && o->summary) {
        fprintf(o->summary, "  finite networks trained alike (%zu per width), step %zu:\n",
                S, at[jl]);
        fprintf(o->summary, "    %8s  %14s  %14s  %14s\n", "width", "net vs own", "ensemble mean",
                "ensemble var");
        for (size_t w = 0; w < W; w++) {
            double r = 0;
            for (size_t s = 0; s < S; s++)
                r += enet[(jl * W + w) * S + s] * enet[(jl * W + w) * S + s];
            fprintf(o->summary, "    %8zu  %14.4g  %14.4g  %14.4g\n", o->finite_widths[w],
                    sqrt(r / (double)S), emean[jl * W + w], evar[jl * W + w]);
        }
        if (fitted)
            fprintf(o->summary, "    exponents (95%% CI over seeds): net %.3f [%.3f, %.3f], mean "
                    "%.3f [%.3f, %.3f], var %.3f [%.3f, %.3f]\n", fn.slope, fn.slope_lo,
                    fn.slope_hi, fm.slope, fm.slope_lo, fm.slope_hi, fv.slope, fv.slope_lo,
                    fv.slope_hi);
    }
    tpk_free(ctx, c);
    tpk_free(ctx, at);
    tpk_free(ctx, ti);
    tpk_free(ctx, F);
    tpk_free(ctx, enet);
    tpk_free(ctx, emean);
    tpk_free(ctx, evar);
    tpk_free(ctx, recs);
    tpk_free(ctx, wd);
    tpk_free(ctx, times);
    tpk_free(ctx, zero);
    tpk_array_free(X);
    tpk_array_free(f);
    tpk_array_free(Yc);
    tpk_array_free(pm);
    return st;
}
