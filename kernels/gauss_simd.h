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
#endif

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
