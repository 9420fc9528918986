/* Internal helpers shared by the limits/ sources (not exported). */
#ifndef TPK_LIMITS_IMPL_H
#define TPK_LIMITS_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "tpk/study.h"

/* Multiplicity of each record in a resample: cnt[s] = #{i : idx[i] = s}; idx NULL → all ones. */
static inline void tpk_limits_counts(const size_t *idx, size_t S, double *cnt)
{
    for (size_t s = 0; s < S; s++)
        cnt[s] = idx ? 0.0 : 1.0;
    if (idx)
        for (size_t i = 0; i < S; i++)
            cnt[idx[i]] += 1.0;
}

/* A 64-bit mix (splitmix64 finaliser) to derive per-replicate GSL seeds from (seed, replicate). */
static inline uint64_t tpk_limits_mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* tpk_study_analysis_write with the compared coordinates' axis named `point` ("input" when
 * they are the inputs, "coord" with every readout); tpk_study_write's. */
int tpk_study_analysis_write_named(const tpk_study_analysis *a, tpk_h5out *h, const char *point,
                                   tpk_ctx *ctx);

#endif
