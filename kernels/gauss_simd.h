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
#endif

/* arcsin on [-1, 1], branch-free (both halves computed, then blended), ≤ 2 ulp against glibc
 * (checked densely by tests/test_gauss.c). The rational approximation R(t) of
 * (asin √t − √t)/(√t)³ and the reduction asin x = π/2 − 2 asin √((1−x)/2) for |x| ≥ 1/2 are
 * fdlibm's (e_asin.c); both halves use the same t ∈ [0, 1/4], so one division serves both.
 * For |x| ≥ 1/2 the result is 2·((π/4)_hi − s − (sR − (π/4)_lo)), which keeps the cancellation
 * against π/4 exact enough for ~1 ulp. Inputs outside [-1, 1] are the caller's bug (clamped). */
static inline gv gv_asin(gv x)
{
    const double pS0 = 1.66666666666666657415e-01, pS1 = -3.25565818622400915405e-01,
                 pS2 = 2.01212532134862925881e-01, pS3 = -4.00555345006794114027e-02,
                 pS4 = 7.91534994289814532176e-04, pS5 = 3.47933107596021167570e-05,
                 qS1 = -2.40339491173441421878e+00, qS2 = 2.02094576023350569471e+00,
                 qS3 = -6.88283971605453293030e-01, qS4 = 7.70381505559019352791e-02;
    const double pio4_hi = 7.85398163397448278999e-01, pio4_lo = 3.06161699786838301793e-17;
    gv ax = gv_abs(x);
    gm big = gv_ge(ax, gv_set1(0.5));
    gv t = gv_select(big, gv_mul(gv_sub(gv_set1(1.0), ax), gv_set1(0.5)), gv_mul(ax, ax));
    gv p = gv_fma(t, gv_set1(pS5), gv_set1(pS4));
    p = gv_fma(t, p, gv_set1(pS3));
    p = gv_fma(t, p, gv_set1(pS2));
    p = gv_fma(t, p, gv_set1(pS1));
    p = gv_fma(t, p, gv_set1(pS0));
    p = gv_mul(t, p);
    gv q = gv_fma(t, gv_set1(qS4), gv_set1(qS3));
    q = gv_fma(t, q, gv_set1(qS2));
    q = gv_fma(t, q, gv_set1(qS1));
    q = gv_fma(t, q, gv_set1(1.0));
    gv r = gv_div(p, q);
    gv s = gv_sqrt(t);
    gv small = gv_fma(ax, r, ax);
    gv large = gv_sub(gv_sub(gv_set1(pio4_hi), s), gv_fma(s, r, gv_set1(-pio4_lo)));
    large = gv_add(large, large);
    return gv_copysign(gv_select(big, large, small), x);
}

#endif
