/* Gauss–Hermite back-end: node tables from GSL, 1-D and 2-D (Cholesky) rules, Hermite coefficients (theory.md §3.3). */
#include "gauss_impl.h"
#include "tpk/alloc.h"

#include <gsl/gsl_integration.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MIN_DEGREE 2
#define MAX_DEGREE 512
/* Mehler terms: 2D, capped; each costs two flops per matrix entry. For smooth φ at moderate q
 * 128 terms reach ~1e-10 (tanh: tail 8e-6 at J = 64, q = 1; erf 8e-8). */
#define MEHLER_JMAX GAUSS_MEHLER_JMAX
/* Radial cut-off of the polar rule, in standard deviations: P(r > R) = e^{−R²/2} ≈ 1e-56, so even
 * φ growing like e^{5r} lose nothing. */
#define POLAR_R 16.0
/* Smooth φ use the Cholesky tensor rule unless |ρ| exceeds this: the sheared Gaussian then needs
 * many more nodes (theory.md §3.3, table), while in polar form u, v are r·cos(t), r·cos(t − δ),
 * smooth in t for every ρ. */
#define POLAR_RHO 0.9
/* Kinked φ converge only like D^{-p}, p ≈ 0.7..1 (theory.md §3.3), so |Q_D − Q_{D/2}| under-
 * estimates the error of Q_D by up to 1/(2^p − 1) ≈ 1.6; report 3× the difference for them. */
#define KINKED_ERR_FACTOR 3.0

static void rule_free(const tpk_allocator *al, gauss_rule *r)
{
    tpk_mem_free(al, r->z);
    tpk_mem_free(al, r->w);
    r->z = r->w = NULL;
}

/* n-point rule for the standard normal, from GSL's rule for weight e^{−x²}: z = √2 x, and the
 * weights renormalised by their computed sum so that constants integrate exactly. */
static int rule_init(gauss_rule *r, size_t n, tpk_ctx *ctx)
{
    const tpk_allocator al = tpk_ctx_allocator(ctx);
    r->n = n;
    r->z = tpk_malloc(ctx, n * sizeof *r->z);
    r->w = tpk_malloc(ctx, n * sizeof *r->w);
    gsl_integration_fixed_workspace *g =
        gsl_integration_fixed_alloc(gsl_integration_fixed_hermite, n, 0.0, 1.0, 0.0, 0.0);
    if (!r->z || !r->w || !g) {
        gsl_integration_fixed_free(g);
        rule_free(&al, r);
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory building a %zu-point Gauss-Hermite rule", n);
    }
    const double *x = gsl_integration_fixed_nodes(g), *w = gsl_integration_fixed_weights(g);
    double sum = 0.0;
    for (size_t i = 0; i < n; i++)
        sum += w[i];
    for (size_t i = 0; i < n; i++) {
        r->z[i] = M_SQRT2 * x[i];
        r->w[i] = w[i] / sum;
    }
    gsl_integration_fixed_free(g);
    return TPK_OK;
}

/* n-point Gauss–Legendre rule on [0, 1]. */
static int gl_init(gauss_rule *r, size_t n, tpk_ctx *ctx)
{
    const tpk_allocator al = tpk_ctx_allocator(ctx);
    r->n = n;
    r->z = tpk_malloc(ctx, n * sizeof *r->z);
    r->w = tpk_malloc(ctx, n * sizeof *r->w);
    gsl_integration_glfixed_table *t = gsl_integration_glfixed_table_alloc(n);
    if (!r->z || !r->w || !t) {
        if (t)
            gsl_integration_glfixed_table_free(t);
        rule_free(&al, r);
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory building a %zu-point Gauss-Legendre rule", n);
    }
    for (size_t i = 0; i < n; i++)
        gsl_integration_glfixed_point(0.0, 1.0, i, &r->z[i], &r->w[i], t);
    gsl_integration_glfixed_table_free(t);
    return TPK_OK;
}

/* Radial rule: r = R x, weight R w r e^{−r²/2}/(2π) (the polar density of N(0, I₂)). */
static int radial_init(gauss_rule *r, const gauss_rule *gl, tpk_ctx *ctx)
{
    const tpk_allocator al = tpk_ctx_allocator(ctx);
    r->n = gl->n;
    r->z = tpk_malloc(ctx, r->n * sizeof *r->z);
    r->w = tpk_malloc(ctx, r->n * sizeof *r->w);
    if (!r->z || !r->w) {
        rule_free(&al, r);
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory building the radial rule");
    }
    for (size_t i = 0; i < r->n; i++) {
        const double rr = POLAR_R * gl->z[i];
        r->z[i] = rr;
        r->w[i] = POLAR_R * gl->w[i] * rr * exp(-0.5 * rr * rr) / (2 * M_PI);
    }
    return TPK_OK;
}

tpk_gauss_ws *tpk_gauss_ws_alloc(size_t degree, tpk_ctx *ctx)
{
    tpk_error_gsl_init(); /* GSL failures as return codes, never abort() (tpk/error.h) */
    if (degree < MIN_DEGREE || degree > MAX_DEGREE) {
        TPK_ERROR(ctx, TPK_EINVAL, "Gauss-Hermite degree %zu out of range %d..%d", degree, MIN_DEGREE,
                  MAX_DEGREE);
        return NULL;
    }
    tpk_gauss_ws *ws = tpk_calloc(ctx, 1, sizeof *ws);
    if (!ws) {
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory allocating a Gauss-Hermite workspace");
        return NULL;
    }
    ws->al = tpk_ctx_allocator(ctx);
    ws->degree = degree;
    ws->J = 2 * degree < MEHLER_JMAX ? 2 * degree : MEHLER_JMAX;
    const size_t d4 = degree / 4 ? degree / 4 : 1;
    if (rule_init(&ws->r2, degree, ctx) || rule_init(&ws->r2lo, degree / 2, ctx) ||
        rule_init(&ws->r1, 2 * degree, ctx) || rule_init(&ws->r1lo, degree, ctx) ||
        rule_init(&ws->rh, 2 * ws->J, ctx) || gl_init(&ws->gl, degree, ctx) ||
        gl_init(&ws->gl2, degree / 2, ctx) || gl_init(&ws->gl4, d4, ctx) ||
        radial_init(&ws->pr, &ws->gl, ctx) || radial_init(&ws->prlo, &ws->gl2, ctx)) {
        tpk_gauss_ws_free(ws);
        return NULL;
    }
    /* hw[j][i] = w_i h_j(z_i), h_j = He_j/√(j!) by the normalised three-term recurrence
     * h_{j+1} = (z h_j − √j h_{j−1})/√(j+1). The rh rule has 2J nodes, so it integrates h_j h_l
     * exactly for j + l < 4J: the 2J×2J discrete transform is orthogonal (discrete Parseval). */
    const size_t nh = ws->rh.n, nj = 2 * ws->J;
    ws->hw = tpk_malloc(ctx, nj * nh * sizeof *ws->hw);
    if (!ws->hw) {
        tpk_gauss_ws_free(ws);
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory allocating Hermite tables");
        return NULL;
    }
    for (size_t i = 0; i < nh; i++) {
        const double z = ws->rh.z[i];
        double hm1 = 0.0, h = 1.0;
        for (size_t j = 0; j < nj; j++) {
            ws->hw[j * nh + i] = ws->rh.w[i] * h;
            double hp = (z * h - sqrt((double)j) * hm1) / sqrt((double)(j + 1));
            hm1 = h;
            h = hp;
        }
    }
    return ws;
}

void tpk_gauss_ws_free(tpk_gauss_ws *ws)
{
    if (!ws)
        return;
    tpk_allocator al = ws->al;
    rule_free(&al, &ws->r2);
    rule_free(&al, &ws->r2lo);
    rule_free(&al, &ws->r1);
    rule_free(&al, &ws->r1lo);
    rule_free(&al, &ws->rh);
    rule_free(&al, &ws->gl);
    rule_free(&al, &ws->gl2);
    rule_free(&al, &ws->gl4);
    rule_free(&al, &ws->pr);
    rule_free(&al, &ws->prlo);
    tpk_mem_free(&al, ws->hw);
    tpk_mem_free(&al, ws);
}

size_t tpk_gauss_ws_degree(const tpk_gauss_ws *ws) { return ws ? ws->degree : 0; }

static double err_factor(const tpk_phi *f, const tpk_phi *g)
{
    return (tpk_phi_flags(f) & tpk_phi_flags(g) & TPK_PHI_SMOOTH) ? 1.0 : KINKED_ERR_FACTOR;
}

/* Σ w_i h(z_i) for h(z) = f(m1 + a1 z)·g(m2 + a2 z) (g may be NULL: h = f). *abs_sum gets
 * Σ w_i |h(z_i)|, which bounds the summation rounding. */
static double rule1(const tpk_phi *f, const tpk_phi *g, double m1, double a1, double m2, double a2,
                    const gauss_rule *r, double *abs_sum)
{
    double s = 0.0, as = 0.0;
    for (size_t i = 0; i < r->n; i++) {
        double h = tpk_phi_eval(f, m1 + a1 * r->z[i]);
        if (g && h != 0.0)
            h *= tpk_phi_eval(g, m2 + a2 * r->z[i]);
        s += r->w[i] * h;
        as += r->w[i] * fabs(h);
    }
    *abs_sum = as;
    return s;
}

/* Tensor rule after the Cholesky transform (theory.md §3.3): u = m1 + su·x,
 * v = m2 + a·x + b·y with (x, y) independent standard normals, a = ρ√q2, b = √(q2(1−ρ²)). */
static double rule2(const tpk_phi *f, const tpk_phi *g, double m1, double m2, double su, double a,
                    double b, const gauss_rule *r, double *abs_sum)
{
    double s = 0.0, as = 0.0;
    for (size_t i = 0; i < r->n; i++) {
        const double fu = tpk_phi_eval(f, m1 + su * r->z[i]);
        if (fu == 0.0)
            continue; /* half the nodes for relu-like f */
        const double base = m2 + a * r->z[i];
        double in = 0.0, ain = 0.0;
        for (size_t j = 0; j < r->n; j++) {
            const double gv = tpk_phi_eval(g, base + b * r->z[j]);
            in += r->w[j] * gv;
            ain += r->w[j] * fabs(gv);
        }
        s += r->w[i] * fu * in;
        as += r->w[i] * fabs(fu) * ain;
    }
    *abs_sum = as;
    return s;
}

/* E f(m + √q Z) for kinked f: Gauss–Legendre on [−R, z*] and [z*, R], z* = −m/√q, the point
 * where the argument crosses 0 (where the built-ins have their kinks), so each piece is smooth. */
static double rule1_split(const tpk_phi *f, double m, double sd, const gauss_rule *gl,
                          double *abs_sum)
{
    double zs = -m / sd;
    zs = zs < -POLAR_R ? -POLAR_R : zs > POLAR_R ? POLAR_R : zs;
    const double lo[2] = {-POLAR_R, zs}, hi[2] = {zs, POLAR_R};
    double s = 0.0, as = 0.0;
    for (int p = 0; p < 2; p++) {
        const double len = hi[p] - lo[p];
        if (len <= 0)
            continue;
        for (size_t i = 0; i < gl->n; i++) {
            const double z = lo[p] + len * gl->z[i];
            const double w = len * gl->w[i] * exp(-0.5 * z * z) / sqrt(2 * M_PI);
            const double h = tpk_phi_eval(f, m + sd * z);
            s += w * h;
            as += w * fabs(h);
        }
    }
    *abs_sum = as;
    return s;
}

void tpk__gauss_quad1(const tpk_phi *f, double m, double q, const tpk_gauss_ws *ws, double *val,
                      double *err)
{
    if (q == 0) {
        *val = tpk_phi_eval(f, m);
        *err = 0.0;
        return;
    }
    const double sd = sqrt(q);
    double as, asl, hi, lo;
    size_t n;
    if (tpk_phi_flags(f) & TPK_PHI_SMOOTH) {
        hi = rule1(f, NULL, m, sd, 0, 0, &ws->r1, &as);
        lo = rule1(f, NULL, m, sd, 0, 0, &ws->r1lo, &asl);
        n = ws->r1.n;
    } else {
        hi = rule1_split(f, m, sd, &ws->gl, &as);
        lo = rule1_split(f, m, sd, &ws->gl2, &asl);
        n = ws->gl.n;
    }
    *val = hi;
    /* difference with the half-degree rule, plus a first-order bound on summation rounding, plus
     * a numerically differentiated f's own error (gauss_impl.h GAUSS_NUMDIFF_RTOL) */
    *err = fabs(hi - lo) * err_factor(f, f) + ((double)n * GAUSS_EPS + tpk__phi_eval_rtol(f)) * as;
}

static void sort4(double *a)
{
    for (int i = 1; i < 4; i++)
        for (int j = i; j > 0 && a[j - 1] > a[j]; j--) {
            double t = a[j];
            a[j] = a[j - 1];
            a[j - 1] = t;
        }
}

/* Radial integral ∫_0^R h(r) r e^{−r²/2}/(2π) dr of h(r) = f(m1 + ca r)·g(m2 + cb r), split where
 * either argument crosses 0 (r = −m/c when that lies in (0, R)), so that for φ kinked at 0 every
 * piece is smooth even with non-zero means. pr: the precomputed rule for one piece [0, R]; gl: the
 * raw Gauss–Legendre rule it was built from, used for split pieces. */
static double radial(const tpk_phi *f, const tpk_phi *g, double m1, double m2, double ca, double cb,
                     const gauss_rule *pr, const gauss_rule *gl, double *abs_sum)
{
    double cut[4] = {0.0, POLAR_R, POLAR_R, POLAR_R};
    int nc = 1;
    if (m1 != 0 && ca != 0 && -m1 / ca > 0 && -m1 / ca < POLAR_R)
        cut[nc++] = -m1 / ca;
    if (m2 != 0 && cb != 0 && -m2 / cb > 0 && -m2 / cb < POLAR_R)
        cut[nc++] = -m2 / cb;
    double s = 0.0, as = 0.0;
    if (nc == 1) {
        for (size_t b = 0; b < pr->n; b++) {
            double h = tpk_phi_eval(f, m1 + ca * pr->z[b]);
            if (h != 0.0)
                h *= tpk_phi_eval(g, m2 + cb * pr->z[b]);
            s += pr->w[b] * h;
            as += pr->w[b] * fabs(h);
        }
    } else {
        if (nc == 3 && cut[1] > cut[2]) {
            double t = cut[1];
            cut[1] = cut[2];
            cut[2] = t;
        }
        cut[nc] = POLAR_R;
        for (int p = 0; p < nc; p++) {
            const double r0 = cut[p], len = cut[p + 1] - r0;
            for (size_t b = 0; len > 0 && b < gl->n; b++) {
                const double r = r0 + len * gl->z[b];
                const double w = len * gl->w[b] * r * exp(-0.5 * r * r) / (2 * M_PI);
                double h = tpk_phi_eval(f, m1 + ca * r);
                if (h != 0.0)
                    h *= tpk_phi_eval(g, m2 + cb * r);
                s += w * h;
                as += w * fabs(h);
            }
        }
    }
    *abs_sum = as;
    return s;
}

/* Polar form (theory.md §3.3): with (x, y) = r(cos t, sin t) standard normal and δ = arccos ρ,
 * u = m1 + √q1 r cos t and v = m2 + √q2 r cos(t − δ). The angle is split where cos t or
 * cos(t − δ) vanish and the radius where u or v cross 0, so for φ kinked only at 0 every piece is
 * smooth and the rule converges exponentially, for any ρ, since nothing is sheared. pt: Gauss–
 * Legendre on [0, 1] for each angular piece; pr/gl: radial rules. */
static double rule_polar(const tpk_phi *f, const tpk_phi *g, double m1, double m2, double su,
                         double sv, double rho, const gauss_rule *pt, const gauss_rule *pr,
                         const gauss_rule *gl, double *abs_sum)
{
    const double twopi = 2 * M_PI, delta = acos(rho);
    double bp[4] = {M_PI / 2, 3 * M_PI / 2, fmod(delta + M_PI / 2, twopi),
                    fmod(delta + 3 * M_PI / 2, twopi)};
    sort4(bp);
    double s = 0.0, as = 0.0;
    for (int p = 0; p < 4; p++) {
        const double t0 = bp[p], len = (p < 3 ? bp[p + 1] : bp[0] + twopi) - t0;
        if (len <= 0)
            continue;
        for (size_t a = 0; a < pt->n; a++) {
            const double t = t0 + len * pt->z[a], wt = len * pt->w[a];
            double ain;
            const double in = radial(f, g, m1, m2, su * cos(t), sv * cos(t - delta), pr, gl, &ain);
            s += wt * in;
            as += wt * ain;
        }
    }
    *abs_sum = as;
    return s;
}

void tpk__gauss_quad2(const tpk_phi *f, const tpk_phi *g, double m1, double m2, double q1,
                      double q2, double rho, const tpk_gauss_ws *ws, double *val, double *err)
{
    /* Degenerate Σ: a zero variance makes that variable constant (its mean). */
    if (q1 == 0 && q2 == 0) {
        *val = tpk_phi_eval(f, m1) * tpk_phi_eval(g, m2);
        *err = 0.0;
        return;
    }
    if (q1 == 0 || q2 == 0) {
        const tpk_phi *c = q1 == 0 ? f : g, *r = q1 == 0 ? g : f;
        const double cv = tpk_phi_eval(c, q1 == 0 ? m1 : m2);
        double v, e;
        tpk__gauss_quad1(r, q1 == 0 ? m2 : m1, q1 == 0 ? q2 : q1, ws, &v, &e);
        *val = cv * v;
        *err = fabs(cv) * e + GAUSS_EPS * fabs(*val);
        return;
    }
    const double su = sqrt(q1), sv = sqrt(q2), fac = err_factor(f, g);
    const int smooth = (tpk_phi_flags(f) & tpk_phi_flags(g) & TPK_PHI_SMOOTH) != 0;
    double as, asl, hi, lo;
    size_t n;
    if (!smooth || fabs(rho) > POLAR_RHO) {
        /* 4 angular pieces of D/2 nodes × D radial nodes; companion D/4 × D/2 */
        hi = rule_polar(f, g, m1, m2, su, sv, rho, &ws->gl2, &ws->pr, &ws->gl, &as);
        lo = rule_polar(f, g, m1, m2, su, sv, rho, &ws->gl4, &ws->prlo, &ws->gl2, &asl);
        n = 3 * ws->degree; /* D radial + 2D angular summands on any path */
    } else if (rho == 1.0 || rho == -1.0) {
        /* rank 1 (reachable only with POLAR_RHO ≥ 1): v = m2 ± √q2·x, a 1-D integral */
        hi = rule1(f, g, m1, su, m2, rho * sv, &ws->r1, &as);
        lo = rule1(f, g, m1, su, m2, rho * sv, &ws->r1lo, &asl);
        n = ws->r1.n;
    } else {
        /* Cholesky tensor rule; (1−ρ)(1+ρ) rather than 1−ρ²: no cancellation as ρ → ±1 */
        const double a = rho * sv, b = sv * sqrt((1.0 - rho) * (1.0 + rho));
        hi = rule2(f, g, m1, m2, su, a, b, &ws->r2, &as);
        lo = rule2(f, g, m1, m2, su, a, b, &ws->r2lo, &asl);
        n = 2 * ws->r2.n;
    }
    *val = hi;
    *err = fabs(hi - lo) * fac +
           ((double)n * GAUSS_EPS + tpk__phi_eval_rtol(f) + tpk__phi_eval_rtol(g)) * as;
}

void tpk__gauss_hermite_coeffs(const tpk_phi *phi, double q, const tpk_gauss_ws *ws, double *c,
                               size_t stride, double *tail, double *norm, double *fbuf)
{
    const size_t nh = ws->rh.n, J = ws->J;
    const double sd = sqrt(q);
    double n2 = 0.0;
    for (size_t i = 0; i < nh; i++) {
        fbuf[i] = tpk_phi_eval(phi, sd * ws->rh.z[i]);
        n2 += ws->rh.w[i] * fbuf[i] * fbuf[i];
    }
    double t2 = 0.0;
    for (size_t j = 0; j < 2 * J; j++) {
        const double *h = ws->hw + j * nh;
        double cj = 0.0;
        for (size_t i = 0; i < nh; i++)
            cj += h[i] * fbuf[i];
        if (j < J)
            c[j * stride] = cj;
        else
            t2 += cj * cj;
    }
    *tail = sqrt(t2);
    *norm = sqrt(n2);
}
