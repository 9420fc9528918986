/* Genz's separation-of-variables integrand of a multivariate normal probability, summed over a
 * block of quasi-random points (tpk/mvn.h, issue 19): the inner loop of the orthant back end's
 * randomised QMC (netsor/limit_orthant.c). The kernel runs the points through the SIMD layer
 * (gauss_simd.h: AVX-512, AVX2 or scalar by the build) with its own Φ and Φ⁻¹;
 * tpk_mvn_sov_sum_ref is the plain reference (libm erfc, AS 241, one point at a time) that
 * tests/test_mvn.c checks it against.
 *
 * A. Genz, "Numerical computation of multivariate normal probabilities", J. Comput. Graph. Stat.
 * 1 (1992) 141–149: with X = L·Y, L lower-triangular, P(X < b) = ∫ Π_i e_i(u) du over [0,1]^{m−1},
 * e_i = Φ((b_i − Σ_{k<i} L_ik y_k)/L_ii), y_k = Φ⁻¹(u_k e_k). */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "gauss_simd.h"
#include "tpk/mvn.h"

/* Φ⁻¹ is evaluated on p clamped to [P_LO, P_HI]: p = u·e underflows to 0 only where e does, and the
 * product then carries weight 0 whatever y is. */
#define P_LO 1e-300
#define P_HI (1.0 - 1e-16)

/* ---- the reference: one point at a time, libm ---------------------------------------------- */

static double Phi(double x) { return 0.5 * erfc(-x * M_SQRT1_2); }

/* Wichura's AS 241 (PPND16), Appl. Statist. 37 (1988) 477; relative error ~1e-16. */
static double Phi_inv(double p)
{
    p = p < P_LO ? P_LO : p > P_HI ? P_HI : p;
    double q = p - 0.5;
    if (fabs(q) <= 0.425) {
        double r = 0.180625 - q * q;
        return q *
               (((((((2.5090809287301226727e+3 * r + 3.3430575583588128105e+4) * r +
                     6.7265770927008700853e+4) * r + 4.5921953931549871457e+4) * r +
                   1.3731693765509461125e+4) * r + 1.9715909503065514427e+3) * r +
                 1.3314166789178437745e+2) * r + 3.3871328727963666080e0) /
               (((((((5.2264952788528545610e+3 * r + 2.8729085735721942674e+4) * r +
                     3.9307895800092710610e+4) * r + 2.1213794301586595867e+4) * r +
                   5.3941960214247511077e+3) * r + 6.8718700749205790830e+2) * r +
                 4.2313330701600911252e+1) * r + 1.0);
    }
    double r = sqrt(-log(q < 0 ? p : 1.0 - p)), x;
    if (r <= 5.0) {
        r -= 1.6;
        x = (((((((7.74545014278341407640e-4 * r + 2.27238449892691845833e-2) * r +
                  2.41780725177450611770e-1) * r + 1.27045825245236838258e0) * r +
                3.64784832476320460504e0) * r + 5.76949722146069140550e0) * r +
              4.63033784615654529590e0) * r + 1.42343711074968357734e0) /
            (((((((1.05075007164441684324e-9 * r + 5.47593808499534494600e-4) * r +
                  1.51986665636164571966e-2) * r + 1.48103976427480074590e-1) * r +
                6.89767334985100004550e-1) * r + 1.67638483018380384940e0) * r +
              2.05319162663775882187e0) * r + 1.0);
    } else {
        r -= 5.0;
        x = (((((((2.01033439929228813265e-7 * r + 2.71155556874348757815e-5) * r +
                  1.24266094738807843860e-3) * r + 2.65321895265761230930e-2) * r +
                2.96560571828504891230e-1) * r + 1.78482653991729133580e0) * r +
              5.46378491116411436990e0) * r + 6.65790464350110377720e0) /
            (((((((2.04426310338993978564e-15 * r + 1.42151175831644588870e-7) * r +
                  1.84631831751005468180e-5) * r + 7.86869131145613259100e-4) * r +
                1.48753612908506148525e-2) * r + 1.36929880922735805310e-1) * r +
              5.99832206555887937690e-1) * r + 1.0);
    }
    return q < 0 ? -x : x;
}

/* The randomisation of coordinate u by the shift d: frac(u + d), then the baker's (tent)
 * transform x ↦ 1 − |2x − 1|; u, d ∈ [0, 1). */
static double shift_tent(double u, double d)
{
    double x = u + d;
    x = x >= 1.0 ? x - 1.0 : x;
    return 1.0 - fabs(2.0 * x - 1.0);
}

/* e_i of one point from the conditional threshold x (L_ii = 0: an indicator) */
static double factor(double x, double lii) { return lii > 0 ? Phi(x / lii) : (x > 0 ? 1.0 : 0.0); }

double tpk_mvn_sov_sum_ref(int m, const double *L, const double *b, const double *u,
                           const double *shift, int B)
{
    double s = 0.0, y[TPK_MVN_SOV_MAXDIM];
    if (m < 1 || m > TPK_MVN_SOV_MAXDIM)
        return 0.0;
    for (int p = 0; p < B; p++) {
        double e = factor(b[0], L[0]), f = e;
        for (int i = 1; i < m; i++) {
            double ui = u[(size_t)(i - 1) * TPK_MVN_SOV_BLK + p];
            if (shift)
                ui = shift_tent(ui, shift[i - 1]);
            const double *Li = L + (size_t)i * (size_t)m;
            double lp = L[(size_t)(i - 1) * (size_t)m + i - 1];
            y[i - 1] = lp > 0 ? Phi_inv(ui * e) : 0.0;
            double x = b[i];
            for (int k = 0; k < i; k++)
                x -= Li[k] * y[k];
            e = factor(x, Li[i]);
            f *= e;
        }
        s += f;
    }
    return s;
}

void tpk_mvn_sov_prefix_ref(int m, const double *L, const double *b, const double *u, int B,
                            double *sums)
{
    double y[TPK_MVN_SOV_MAXDIM];
    if (m < 1 || m > TPK_MVN_SOV_MAXDIM)
        return;
    for (int p = 0; p < B; p++) {
        double e = factor(b[0], L[0]), f = e;
        sums[0] += f;
        for (int i = 1; i < m; i++) {
            const double *Li = L + (size_t)i * (size_t)m;
            double lp = L[(size_t)(i - 1) * (size_t)m + i - 1];
            y[i - 1] = lp > 0 ? Phi_inv(u[(size_t)(i - 1) * TPK_MVN_SOV_BLK + p] * e) : 0.0;
            double x = b[i];
            for (int k = 0; k < i; k++)
                x -= Li[k] * y[k];
            e = factor(x, Li[i]);
            f *= e;
            sums[i] += f;
        }
    }
}

/* ---- the SIMD kernel ------------------------------------------------------------------------ */

/* Σ c_i t^(n−1−i): Horner with the coefficients highest degree first. */
static inline gv gv_horner(gv t, const double *c, int n)
{
    gv p = gv_set1(c[0]);
    for (int i = 1; i < n; i++)
        p = gv_fma(p, t, gv_set1(c[i]));
    return p;
}

/* Φ(x), branch-free but for the far tail: Hart's algorithm 5666 as given by G. West, "Better
 * approximations to cumulative normal functions", Wilmott (2005): for z = |x| < 10/√2,
 * Φ(−z) = e^{−z²/2}·P(z)/Q(z); beyond, a continued fraction (z is clamped at 37, where
 * Φ(−z) < 1e-299). Absolute error
 * ≤ 2e-16 over the line (checked against erfc in tests/test_mvn.c), which is what the SOV
 * products need: a factor's absolute error bounds its effect on the integrand. */
static inline gv gv_Phi(gv x)
{
    gv z = gv_min(gv_abs(x), gv_set1(37.0));
    gv e = gv_exp(gv_mul(gv_mul(z, z), gv_set1(-0.5)));
    static const double pn[7] = {3.52624965998911e-02, 0.700383064443688, 6.37396220353165,
                                 33.912866078383,      112.079291497871,  221.213596169931,
                                 220.206867912376};
    static const double pq[8] = {8.83883476483184e-02, 1.75566716318264, 16.064177579207,
                                 86.7807322029461,     296.564248779674, 637.333633378831,
                                 793.826512519948,     440.413735824752};
    gv n = gv_horner(z, pn, 7), q = gv_horner(z, pq, 8);
    gv c = gv_mul(gv_mul(e, n), gv_rcp(q));
    gm far = gv_ge(z, gv_set1(7.07106781186547));
    if (gm_any(far)) {
        gv cf = gv_add(z, gv_set1(0.65));
        cf = gv_add(z, gv_div(gv_set1(4.0), cf));
        cf = gv_add(z, gv_div(gv_set1(3.0), cf));
        cf = gv_add(z, gv_div(gv_set1(2.0), cf));
        cf = gv_add(z, gv_div(gv_set1(1.0), cf));
        gv cfar = gv_div(e, gv_mul(cf, gv_set1(2.506628274631)));
        c = gv_select(far, cfar, c);
    }
    return gv_select(gv_lt(x, gv_set1(0.0)), c, gv_sub(gv_set1(1.0), c));
}

static inline gv gv_rat8(gv r, const double *a, const double *b)
{
    return gv_mul(gv_horner(r, a, 8), gv_rcp(gv_horner(r, b, 8)));
}

/* Φ⁻¹(p), AS 241 (the coefficients of Phi_inv above, highest degree first): the central
 * rational for every lane, the tail ones only when a lane needs them. */
static inline gv gv_Phi_inv(gv p)
{
    static const double ca[8] = {2.5090809287301226727e+3, 3.3430575583588128105e+4,
                                 6.7265770927008700853e+4, 4.5921953931549871457e+4,
                                 1.3731693765509461125e+4, 1.9715909503065514427e+3,
                                 1.3314166789178437745e+2, 3.3871328727963666080e0};
    static const double cb[8] = {5.2264952788528545610e+3, 2.8729085735721942674e+4,
                                 3.9307895800092710610e+4, 2.1213794301586595867e+4,
                                 5.3941960214247511077e+3, 6.8718700749205790830e+2,
                                 4.2313330701600911252e+1, 1.0};
    static const double ia[8] = {7.74545014278341407640e-4, 2.27238449892691845833e-2,
                                 2.41780725177450611770e-1, 1.27045825245236838258e0,
                                 3.64784832476320460504e0, 5.76949722146069140550e0,
                                 4.63033784615654529590e0, 1.42343711074968357734e0};
    static const double ib[8] = {1.05075007164441684324e-9, 5.47593808499534494600e-4,
                                 1.51986665636164571966e-2, 1.48103976427480074590e-1,
                                 6.89767334985100004550e-1, 1.67638483018380384940e0,
                                 2.05319162663775882187e0, 1.0};
    static const double oa[8] = {2.01033439929228813265e-7, 2.71155556874348757815e-5,
                                 1.24266094738807843860e-3, 2.65321895265761230930e-2,
                                 2.96560571828504891230e-1, 1.78482653991729133580e0,
                                 5.46378491116411436990e0, 6.65790464350110377720e0};
    static const double ob[8] = {2.04426310338993978564e-15, 1.42151175831644588870e-7,
                                 1.84631831751005468180e-5, 7.86869131145613259100e-4,
                                 1.48753612908506148525e-2, 1.36929880922735805310e-1,
                                 5.99832206555887937690e-1, 1.0};
    p = gv_min(gv_max(p, gv_set1(P_LO)), gv_set1(P_HI));
    gv q = gv_sub(p, gv_set1(0.5));
    gv r = gv_fma(gv_mul(q, q), gv_set1(-1.0), gv_set1(0.180625));
    gv x = gv_mul(q, gv_rat8(r, ca, cb));
    gm tail = gv_not_le(gv_abs(q), gv_set1(0.425));
    if (gm_any(tail)) {
        gv pt = gv_min(p, gv_sub(gv_set1(1.0), p));
        gv rt = gv_sqrt_pos(gv_mul(gv_log(pt), gv_set1(-1.0)));
        gv xt = gv_rat8(gv_sub(rt, gv_set1(1.6)), ia, ib);
        gm out = gv_not_le(rt, gv_set1(5.0));
        if (gm_any(out))
            xt = gv_select(out, gv_rat8(gv_sub(rt, gv_set1(5.0)), oa, ob), xt);
        xt = gv_select(gv_lt(q, gv_set1(0.0)), gv_mul(xt, gv_set1(-1.0)), xt);
        x = gv_select(tail, xt, x);
    }
    return x;
}

/* The SIMD body of tpk_mvn_sov_sum and tpk_mvn_sov_prefix over Bv (a multiple of the lanes)
 * points: variable by variable over all the points, so that the vectors of one step, which are
 * independent, overlap their Φ / Φ⁻¹ chains (one vector at a time would wait on each step's
 * latency). Returns Σ_p Π_i e_i; with sums, also adds Σ_p Π_{i≤k} e_i to sums[k] for every k. */
static double sov_simd(int m, const double *L, const double *b, const double *u,
                       const double *shift, int Bv, double *sums)
{
    double y[TPK_MVN_SOV_MAXDIM - 1][TPK_MVN_SOV_BLK], e[TPK_MVN_SOV_BLK], f[TPK_MVN_SOV_BLK];
    const double e0 = factor(b[0], L[0]);
    for (int p = 0; p < Bv; p++)
        e[p] = f[p] = e0;
    if (sums)
        sums[0] += e0 * Bv;
    for (int i = 1; i < m; i++) {
        const double *Li = L + (size_t)i * (size_t)m, *ui = u + (size_t)(i - 1) * TPK_MVN_SOV_BLK;
        double lp = L[(size_t)(i - 1) * (size_t)m + i - 1], lii = Li[i];
        gv d = gv_set1(shift ? shift[i - 1] : 0.0), inv = gv_set1(lii > 0 ? 1.0 / lii : 0.0);
        gv acc = gv_set1(0.0);
        double *yp = y[i - 1];
        for (int p = 0; p < Bv; p += GV_LANES) {
            gv uv = gv_load(ui + p);
            if (shift) { /* frac(u + d), then the tent */
                uv = gv_add(uv, d);
                uv = gv_select(gv_ge(uv, gv_set1(1.0)), gv_sub(uv, gv_set1(1.0)), uv);
                uv = gv_sub(gv_set1(1.0), gv_abs(gv_fma(uv, gv_set1(2.0), gv_set1(-1.0))));
            }
            gv yv = lp > 0 ? gv_Phi_inv(gv_mul(uv, gv_load(e + p))) : gv_set1(0.0);
            gv_store(yp + p, yv);
            gv x = gv_set1(b[i]);
            for (int k = 0; k < i; k++)
                x = gv_fma(gv_set1(-Li[k]), gv_load(y[k] + p), x);
            gv ev = lii > 0 ? gv_Phi(gv_mul(x, inv))
                            : gv_select(gv_not_le(x, gv_set1(0.0)), gv_set1(1.0), gv_set1(0.0));
            gv_store(e + p, ev);
            gv fv = gv_mul(gv_load(f + p), ev);
            gv_store(f + p, fv);
            acc = gv_add(acc, fv);
        }
        if (sums) {
            double lane[GV_LANES];
            gv_store(lane, acc);
            for (int l = 0; l < GV_LANES; l++)
                sums[i] += lane[l];
        }
    }
    double s = 0.0;
    for (int p = 0; p < Bv; p++)
        s += f[p];
    return s;
}

double tpk_mvn_sov_sum(int m, const double *L, const double *b, const double *u,
                       const double *shift, int B)
{
    if (m < 1 || m > TPK_MVN_SOV_MAXDIM)
        return 0.0;
    const int Bv = B - B % GV_LANES;
    double s = Bv < B ? tpk_mvn_sov_sum_ref(m, L, b, u + Bv, shift, B - Bv) : 0.0;
    return Bv > 0 ? s + sov_simd(m, L, b, u, shift, Bv, NULL) : s;
}

void tpk_mvn_sov_prefix(int m, const double *L, const double *b, const double *u, int B,
                        double *sums)
{
    if (m < 1 || m > TPK_MVN_SOV_MAXDIM)
        return;
    const int Bv = B - B % GV_LANES;
    if (Bv < B)
        tpk_mvn_sov_prefix_ref(m, L, b, u + Bv, B - Bv, sums);
    if (Bv > 0)
        sov_simd(m, L, b, u, NULL, Bv, sums);
}

void tpk_mvn_normals(int n, const double *u, const double *shift, double *out)
{
    int nv = n - n % GV_LANES;
    for (int i = 0; i < nv; i += GV_LANES) {
        gv uv = gv_load(u + i);
        if (shift) {
            uv = gv_add(uv, gv_load(shift + i));
            uv = gv_select(gv_ge(uv, gv_set1(1.0)), gv_sub(uv, gv_set1(1.0)), uv);
            uv = gv_sub(gv_set1(1.0), gv_abs(gv_fma(uv, gv_set1(2.0), gv_set1(-1.0))));
        }
        gv_store(out + i, gv_Phi_inv(uv));
    }
    for (int i = nv; i < n; i++)
        out[i] = Phi_inv(shift ? shift_tent(u[i], shift[i]) : u[i]);
}

/* ---- Owen scrambling of quasi-random coordinates ------------------------------------------- */

static inline uint32_t reverse_bits(uint32_t x)
{
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0F0F0F0Fu) | ((x & 0x0F0F0F0Fu) << 4);
    x = ((x >> 8) & 0x00FF00FFu) | ((x & 0x00FF00FFu) << 8);
    return (x >> 16) | (x << 16);
}

uint32_t tpk_mvn_reverse_bits(uint32_t x) { return reverse_bits(x); }

/* B. Burley, "Practical hash-based Owen scrambling", J. Computer Graphics Techniques 9 (2020):
 * the Laine–Karras permutation on the reversed bits (x += seed, then x ^= x·c for even c: bit k
 * changes as a function of bits < k only, i.e. of the more significant digits of the fraction).
 * Plain C: -march and -O3 (kernel flags) vectorise the loop. */
void tpk_mvn_owen_scramble(int n, const uint32_t *rbits, uint32_t seed, double *out)
{
    const double inv = 1.0 / 4294967296.0;
    for (int i = 0; i < n; i++) {
        uint32_t x = rbits[i] + seed;
        x ^= x * 0x6c50b47cu;
        x ^= x * 0xb82f1e52u;
        x ^= x * 0xc7afe638u;
        x ^= x * 0x8d22f6e6u;
        out[i] = ((double)reverse_bits(x) + 0.5) * inv;
    }
}
