/* The distance between GEMM shapes by which "the nearest tuned shape" is chosen: in one file of
 * its own because both the dispatcher (in the library) and the generator of gen/ (tptune-gen,
 * linked without the library, mk/tuner.mk) need it. */
#include "tpk/gemm.h"

#include <math.h>

static double log2_ratio(size_t a, size_t b)
{
    return fabs(log2((double)(a ? a : 1) / (double)(b ? b : 1)));
}

double tpk_gemm_shape_distance(size_t m1, size_t n1, size_t k1, size_t m2, size_t n2, size_t k2)
{
    return log2_ratio(m1, m2) + log2_ratio(n1, n2) + log2_ratio(k1, k2);
}
