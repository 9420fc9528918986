/* Reference ReLU NNGP maps beside the tuned ones (style.md §9): plain loops in double, the formula
 * of kernels/gauss_map.c for relu (GK_ABRELU with a = 0, b = 1; theory.md §3.2):
 * V(k) = √(q_i q_j)[c0 √(1−ρ²) + (c1 + c0 asin ρ) ρ], c0 = 1/(2π), c1 = 1/4, ρ = k a_i a_j with
 * a = 1/√q clamped to [−1, 1] and snapped to ±1 within 8 ulp; the diagonal q/2 exactly; a zero
 * variance gives 0. out = alpha·V + beta on the lower triangle. */
#include "tpk/map.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

#define PI 3.14159265358979323846
#define PSD_RTOL 1e-10              /* kernels/gauss_impl.h GAUSS_PSD_RTOL */
#define RHO_SNAP (8.0 * DBL_EPSILON) /* kernels/gauss_impl.h GAUSS_RHO_SNAP */

/* One entry; *bad set when |k| exceeds √(q_i q_j) beyond rounding (f32 inputs: psd_rtol wider). */
static double relu_entry(double qi, double qj, double k, double psd_rtol, int *bad)
{
    const double si = sqrt(qi), sj = sqrt(qj);
    if (!(fabs(k) <= (1.0 + psd_rtol) * si * sj))
        *bad = 1;
    const double ai = qi > 0 ? 1.0 / si : 0.0, aj = qj > 0 ? 1.0 / sj : 0.0;
    double x = k * ai * aj;
    x = x > 1.0 ? 1.0 : x < -1.0 ? -1.0 : x;
    if (fabs(x) >= 1.0 - RHO_SNAP)
        x = x > 0 ? 1.0 : -1.0;
    const double c0 = 1.0 / (2 * PI), c1 = 0.25;
    return si * sj * (c0 * sqrt(1.0 - x * x) + (c1 + c0 * asin(x)) * x);
}

/* Rows from the last to the first, each row's diagonal written last: out may be S (in place),
 * and row i reads only its own diagonal and those of rows above it, which are still S's then, so
 * no copy of the diagonal (no allocation) is needed. */
#define REF_MAP(NAME, T, RTOL)                                                                     \
    int NAME(size_t n, const T *S, size_t lds, T alpha, T beta, T *out, size_t ldo)                \
    {                                                                                              \
        int bad = 0;                                                                               \
        for (size_t i = n; i-- > 0;) {                                                             \
            const double qi = (double)S[i * lds + i];                                              \
            for (size_t j = 0; j < i; j++)                                                         \
                out[i * ldo + j] =                                                                 \
                    (T)((double)alpha * relu_entry(qi, (double)S[j * lds + j],                     \
                                                   (double)S[i * lds + j], RTOL, &bad) +           \
                        (double)beta);                                                             \
            out[i * ldo + i] = (T)((double)alpha * (0.5 * qi) + (double)beta);                     \
        }                                                                                          \
        return bad;                                                                                \
    }

REF_MAP(tpk_ref_relu_map_d, double, PSD_RTOL)
REF_MAP(tpk_ref_relu_map_s, float, 1e-5)
