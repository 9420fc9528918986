/* Thin SIMD layer (AVX-512, AVX2+FMA, or a scalar reference) and a vectorised arcsine for the map kernels. */
#ifndef TPK_GAUSS_SIMD_H
#define TPK_GAUSS_SIMD_H

/* Why intrinsics rather than `#pragma omp simd` over libm calls: without -fno-math-errno (which
 * the Makefile does not pass, and `#pragma GCC optimize` does not enable for builtins) GCC will not
 * vectorise sqrt, and it calls libmvec's asin/acos only under -ffast-math. A hand-written layer keeps
 * the closed-form maps (theory.md §3.2) vectorised under every build, ASan included. The scalar
 * branch is the reference implementation; the same kernels compile against all three. */

#include <math.h>
#include <stdint.h>

#if defined(__AVX512F__) && !defined(TPK_GAUSS_NO_SIMD)
#include <immintrin.h>
#define GV_LANES 8
#define GV_ISA "avx512"
typedef __m512d gv;
typedef __mmask8 gm;
static inline gv gv_load(const double *p) { return _mm512_loadu_pd(p); }
static inline void gv_store(double *p, gv x) { _mm512_storeu_pd(p, x); }
static inline gv gv_set1(double a) { return _mm512_set1_pd(a); }
static inline gv gv_add(gv a, gv b) { return _mm512_add_pd(a, b); }
static inline gv gv_sub(gv a, gv b) { return _mm512_sub_pd(a, b); }
static inline gv gv_mul(gv a, gv b) { return _mm512_mul_pd(a, b); }
static inline gv gv_div(gv a, gv b) { return _mm512_div_pd(a, b); }
static inline gv gv_fma(gv a, gv b, gv c) { return _mm512_fmadd_pd(a, b, c); }
static inline gv gv_sqrt(gv a) { return _mm512_sqrt_pd(a); }
static inline gv gv_min(gv a, gv b) { return _mm512_min_pd(a, b); }
static inline gv gv_max(gv a, gv b) { return _mm512_max_pd(a, b); }
static inline gv gv_abs(gv a)
{
    return _mm512_castsi512_pd(
        _mm512_and_epi64(_mm512_castpd_si512(a), _mm512_set1_epi64(INT64_MAX)));
}
/* |mag| with the sign of sgn */
static inline gv gv_copysign(gv mag, gv sgn)
{
    __m512i m = _mm512_set1_epi64(INT64_MAX);
    return _mm512_castsi512_pd(
        _mm512_or_epi64(_mm512_and_epi64(_mm512_castpd_si512(mag), m),
                        _mm512_andnot_epi64(m, _mm512_castpd_si512(sgn))));
}
static inline gm gv_ge(gv a, gv b) { return _mm512_cmp_pd_mask(a, b, _CMP_GE_OQ); }
/* !(a <= b): true when a > b or either is NaN */
static inline gm gv_not_le(gv a, gv b) { return _mm512_cmp_pd_mask(a, b, _CMP_NLE_UQ); }
static inline gv gv_select(gm m, gv t, gv f) { return _mm512_mask_blend_pd(m, f, t); }
static inline gm gm_or(gm a, gm b) { return (gm)(a | b); }
static inline gm gm_none(void) { return 0; }
static inline int gm_any(gm m) { return m != 0; }
/* non-temporal store (p aligned to 64 bytes), and the fence that orders such stores */
static inline void gv_stream(double *p, gv x) { _mm512_stream_pd(p, x); }
static inline void gv_store_fence(void) { _mm_sfence(); }
static inline gm gv_lt(gv a, gv b) { return _mm512_cmp_pd_mask(a, b, _CMP_LT_OQ); }
/* 1/a to ~1 ulp without the divider (its throughput is a tenth of the FMA units'): the 14-bit
 * estimate and two Newton steps r ← r + r(1 − a r), each doubling the correct bits */
static inline gv gv_rcp(gv a)
{
    gv r = _mm512_rcp14_pd(a), one = _mm512_set1_pd(1.0);
    r = _mm512_fmadd_pd(r, _mm512_fnmadd_pd(a, r, one), r);
    return _mm512_fmadd_pd(r, _mm512_fnmadd_pd(a, r, one), r);
}
/* √a for a > 0, likewise: y ≈ 1/√a by two Newton steps y ← y(3 − a y²)/2, then a·y */
static inline gv gv_sqrt_pos(gv a)
{
    gv y = _mm512_rsqrt14_pd(a), h = _mm512_set1_pd(0.5), t = _mm512_set1_pd(1.5);
    gv ha = _mm512_mul_pd(a, h);
    y = _mm512_mul_pd(y, _mm512_fnmadd_pd(ha, _mm512_mul_pd(y, y), t));
    y = _mm512_mul_pd(y, _mm512_fnmadd_pd(ha, _mm512_mul_pd(y, y), t));
    gv s = _mm512_mul_pd(a, y); /* one Heron-type correction: s + (a − s²)·y/2 */
    return _mm512_fmadd_pd(_mm512_fnmadd_pd(s, s, a), _mm512_mul_pd(y, h), s);
}
static inline gv gv_round(gv a)
{
    return _mm512_roundscale_pd(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
/* a·2^k for an integral k with a·2^k normal */
static inline gv gv_ldexp(gv a, gv k) { return _mm512_scalef_pd(a, k); }
/* a > 0 normal: *e = floor(log2 a), returns the mantissa in [1, 2) */
static inline gv gv_frexp1(gv a, gv *e)
{
    *e = _mm512_getexp_pd(a);
    return _mm512_getmant_pd(a, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_zero);
}

#elif defined(__AVX2__) && defined(__FMA__) && !defined(TPK_GAUSS_NO_SIMD)
#include <immintrin.h>
#define GV_LANES 4
#define GV_ISA "avx2"
typedef __m256d gv;
typedef __m256d gm;
static inline gv gv_load(const double *p) { return _mm256_loadu_pd(p); }
static inline void gv_store(double *p, gv x) { _mm256_storeu_pd(p, x); }
static inline gv gv_set1(double a) { return _mm256_set1_pd(a); }
static inline gv gv_add(gv a, gv b) { return _mm256_add_pd(a, b); }
static inline gv gv_sub(gv a, gv b) { return _mm256_sub_pd(a, b); }
static inline gv gv_mul(gv a, gv b) { return _mm256_mul_pd(a, b); }
static inline gv gv_div(gv a, gv b) { return _mm256_div_pd(a, b); }
static inline gv gv_fma(gv a, gv b, gv c) { return _mm256_fmadd_pd(a, b, c); }
static inline gv gv_sqrt(gv a) { return _mm256_sqrt_pd(a); }
static inline gv gv_min(gv a, gv b) { return _mm256_min_pd(a, b); }
static inline gv gv_max(gv a, gv b) { return _mm256_max_pd(a, b); }
static inline gv gv_abs(gv a) { return _mm256_andnot_pd(_mm256_set1_pd(-0.0), a); }
static inline gv gv_copysign(gv mag, gv sgn)
{
    gv s = _mm256_set1_pd(-0.0);
    return _mm256_or_pd(_mm256_andnot_pd(s, mag), _mm256_and_pd(s, sgn));
}
static inline gm gv_ge(gv a, gv b) { return _mm256_cmp_pd(a, b, _CMP_GE_OQ); }
static inline gm gv_not_le(gv a, gv b) { return _mm256_cmp_pd(a, b, _CMP_NLE_UQ); }
static inline gv gv_select(gm m, gv t, gv f) { return _mm256_blendv_pd(f, t, m); }
static inline gm gm_or(gm a, gm b) { return _mm256_or_pd(a, b); }
static inline gm gm_none(void) { return _mm256_setzero_pd(); }
static inline int gm_any(gm m) { return _mm256_movemask_pd(m) != 0; }
static inline void gv_stream(double *p, gv x) { _mm256_stream_pd(p, x); }
static inline void gv_store_fence(void) { _mm_sfence(); }
static inline gm gv_lt(gv a, gv b) { return _mm256_cmp_pd(a, b, _CMP_LT_OQ); }
static inline gv gv_rcp(gv a) { return _mm256_div_pd(_mm256_set1_pd(1.0), a); }
static inline gv gv_sqrt_pos(gv a) { return _mm256_sqrt_pd(a); }
static inline gv gv_round(gv a) { return _mm256_round_pd(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/* a·2^k for an integral k, |k| ≤ 1022, with a·2^k normal: 2^k from its exponent bits (k + 1.5·2^52
 * puts k in the low bits) */
static inline gv gv_ldexp(gv a, gv k)
{
    const __m256i magic = _mm256_castpd_si256(_mm256_set1_pd(6755399441055744.0));
    __m256i ki = _mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(k, _mm256_set1_pd(6755399441055744.0))), magic);
    __m256i bits = _mm256_slli_epi64(_mm256_add_epi64(ki, _mm256_set1_epi64x(1023)), 52);
    return _mm256_mul_pd(a, _mm256_castsi256_pd(bits));
}
/* a > 0 normal: *e = floor(log2 a), returns the mantissa in [1, 2) (exponent bits as a double
 * through the 2^52 trick) */
static inline gv gv_frexp1(gv a, gv *e)
{
    __m256i bits = _mm256_castpd_si256(a);
    __m256i be = _mm256_srli_epi64(bits, 52);
    gv ed = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(be, _mm256_castpd_si256(_mm256_set1_pd(4503599627370496.0)))),
                          _mm256_set1_pd(4503599627370496.0));
    *e = _mm256_sub_pd(ed, _mm256_set1_pd(1023.0));
    __m256i mb = _mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi64x(0x000FFFFFFFFFFFFFLL)),
                                 _mm256_set1_epi64x(0x3FF0000000000000LL));
    return _mm256_castsi256_pd(mb);
}

#else /* scalar reference */
#define GV_LANES 1
#define GV_ISA "scalar"
typedef double gv;
typedef int gm;
static inline gv gv_load(const double *p) { return *p; }
static inline void gv_store(double *p, gv x) { *p = x; }
static inline gv gv_set1(double a) { return a; }
static inline gv gv_add(gv a, gv b) { return a + b; }
static inline gv gv_sub(gv a, gv b) { return a - b; }
static inline gv gv_mul(gv a, gv b) { return a * b; }
static inline gv gv_div(gv a, gv b) { return a / b; }
static inline gv gv_fma(gv a, gv b, gv c) { return fma(a, b, c); }
static inline gv gv_sqrt(gv a) { return sqrt(a); }
static inline gv gv_min(gv a, gv b) { return a < b ? a : b; }
static inline gv gv_max(gv a, gv b) { return a > b ? a : b; }
static inline gv gv_abs(gv a) { return fabs(a); }
static inline gv gv_copysign(gv mag, gv sgn) { return copysign(mag, sgn); }
static inline gm gv_ge(gv a, gv b) { return a >= b; }
static inline gm gv_not_le(gv a, gv b) { return !(a <= b); }
static inline gv gv_select(gm m, gv t, gv f) { return m ? t : f; }
static inline gm gm_or(gm a, gm b) { return a | b; }
static inline gm gm_none(void) { return 0; }
static inline int gm_any(gm m) { return m != 0; }
static inline void gv_stream(double *p, gv x) { *p = x; }
static inline void gv_store_fence(void) {}
static inline gm gv_lt(gv a, gv b) { return a < b; }
static inline gv gv_rcp(gv a) { return 1.0 / a; }
static inline gv gv_sqrt_pos(gv a) { return sqrt(a); }
static inline gv gv_round(gv a) { return nearbyint(a); }
static inline gv gv_ldexp(gv a, gv k) { return ldexp(a, (int)k); }
static inline gv gv_frexp1(gv a, gv *e)
{
    int ie;
    double m = frexp(a, &ie); /* [1/2, 1) */
    *e = (double)(ie - 1);
    return 2.0 * m;
}
#endif

/* e^x for x ∈ [−708, 709] (the caller clamps): x = k·ln2 + r, |r| ≤ ln2/2, with ln2 in two parts
 * (Cody & Waite) so that r is exact to ~1 ulp for |k| < 2^36; e^r by its Taylor series to r^12
 * (truncation < 2e-16 relative), scaled by 2^k. */
static inline gv gv_exp(gv x)
{
    static const double c[13] = {1.0, 1.0, 1.0 / 2, 1.0 / 6, 1.0 / 24, 1.0 / 120, 1.0 / 720,
                                 1.0 / 5040, 1.0 / 40320, 1.0 / 362880, 1.0 / 3628800,
                                 1.0 / 39916800, 1.0 / 479001600};
    gv k = gv_round(gv_mul(x, gv_set1(1.4426950408889634)));
    gv r = gv_fma(k, gv_set1(-6.93145751953125e-1), x);
    r = gv_fma(k, gv_set1(-1.42860682030941723212e-6), r);
    gv p = gv_set1(c[12]);
    for (int i = 11; i >= 0; i--)
        p = gv_fma(r, p, gv_set1(c[i]));
    return gv_ldexp(p, k);
}

/* log x for a normal x > 0: x = 2^e·m, m ∈ [√½, √2), log m = 2 atanh s, s = (m − 1)/(m + 1),
 * |s| ≤ 0.1716, by its series to s^21 (truncation < 1e-17); e·ln2 in two parts. */
static inline gv gv_log(gv x)
{
    gv e, m = gv_frexp1(x, &e);
    gm hi = gv_ge(m, gv_set1(1.4142135623730951));
    m = gv_select(hi, gv_mul(m, gv_set1(0.5)), m);
    e = gv_select(hi, gv_add(e, gv_set1(1.0)), e);
    gv s = gv_mul(gv_sub(m, gv_set1(1.0)), gv_rcp(gv_add(m, gv_set1(1.0))));
    gv z = gv_mul(s, s);
    gv p = gv_set1(1.0 / 21);
    for (int i = 19; i >= 1; i -= 2)
        p = gv_fma(z, p, gv_set1(1.0 / i));
    gv lm = gv_mul(gv_add(s, s), p);
    return gv_fma(e, gv_set1(6.93145751953125e-1), gv_fma(e, gv_set1(1.42860682030941723212e-6), lm));
}

/* Horner on t for a degree-12 polynomial, c lowest degree first. */
static inline gv gv_poly12(gv t, const double *c)
{
    gv p = gv_set1(c[12]);
    for (int i = 11; i >= 0; i--)
        p = gv_fma(t, p, gv_set1(c[i]));
    return p;
}

/* arcsin on [-1, 1] and, optionally, √(1 − x²), branch-free (both halves computed, then blended),
 * ≤ 2 ulp against glibc (checked densely by tests/test_gauss.c). The reduction is fdlibm's
 * (e_asin.c): |x| < 1/2: asin x = x + x t R(t), t = x²; |x| ≥ 1/2: asin|x| = π/2 − 2 asin s,
 * s = √t, t = (1 − |x|)/2, written 2·((π/4)_hi − s − (s t R − (π/4)_lo)) so the cancellation
 * against π/4 stays within ~1 ulp. Both halves share t ∈ [0, 1/4], so one polynomial R serves
 * both, and √(1 − x²) is P(t) = √(1 − t) on the small half and 2 s P(t) on the large one
 * (|x| = 1 − 2s², so 1 − x² = 4s²(1 − s²)). R and P are degree-12 near-minimax polynomials
 * (kernels/gauss_simd_coeffs.py): one square root per entry and no division, which matters
 * because square root and division share one slow unit. Inputs outside [-1, 1] are the caller's
 * bug (clamped before). */
static inline gv gv_asin_w(gv x, gv *w)
{
    static const double r[13] = {1.6666666666666668e-1, 7.4999999999984329e-2, 4.464285714635543e-2,
                                 3.0381944138531247e-2, 2.2372172942149888e-2, 1.7352392720869973e-2,
                                 1.3971212973552933e-2, 1.1479177415184906e-2, 1.0322814350185779e-2,
                                 5.4575067186403583e-3, 1.7400879442694022e-2, -1.4851887071247203e-2,
                                 2.8757851367421565e-2};
    static const double sq[13] = {9.9999999999999999e-1, -4.9999999999998153e-1,
                                  -1.2500000000412438e-1, -6.2499999639313425e-2,
                                  -3.9062516332901697e-2, -2.7343311640892069e-2,
                                  -2.0515325325567756e-2, -1.6027596302914372e-2,
                                  -1.375441009387522e-2, -7.4468288654236637e-3,
                                  -2.1194963521473255e-2, 1.7190548009281534e-2,
                                  -3.4308838583332473e-2};
    const double pio4_hi = 7.85398163397448278999e-01, pio4_lo = 3.06161699786838301793e-17;
    gv ax = gv_abs(x);
    gm big = gv_ge(ax, gv_set1(0.5));
    gv t = gv_select(big, gv_mul(gv_sub(gv_set1(1.0), ax), gv_set1(0.5)), gv_mul(ax, ax));
    gv tr = gv_mul(t, gv_poly12(t, r));
    gv s = gv_sqrt(t);
    gv small = gv_fma(ax, tr, ax);
    gv large = gv_sub(gv_sub(gv_set1(pio4_hi), s), gv_fma(s, tr, gv_set1(-pio4_lo)));
    large = gv_add(large, large);
    if (w) {
        gv pw = gv_poly12(t, sq);
        *w = gv_select(big, gv_mul(gv_add(s, s), pw), pw);
    }
    return gv_copysign(gv_select(big, large, small), x);
}

static inline gv gv_asin(gv x) { return gv_asin_w(x, NULL); }

#endif
