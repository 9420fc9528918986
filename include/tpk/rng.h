/* Counter-based random numbers: Philox4x32-10 and keyed standard normals (theory.md §7.4).
 * A value depends only on (seed, stream, row, col), never on the order or the thread that
 * asks for it, so finite-width runs are reproducible whatever the thread count. */
#ifndef TPK_RNG_H
#define TPK_RNG_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One Philox4x32-10 block (Salmon, Moraes, Dror & Shaw, SC'11): out = bijection_key(ctr).
 * Matches Random123's known-answer vectors. */
TPK_API void tpk_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* Stream ids: a 64-bit name for one random tensor, e.g. TPK_RNG_STREAM(TPK_RNG_AVAR, id). */
enum tpk_rng_tag {
    TPK_RNG_AVAR = 1,    /* A-var (weight matrix)            */
    TPK_RNG_EMBED = 2,   /* embedding matrix U               */
    TPK_RNG_BIAS = 3,    /* bias vector                      */
    TPK_RNG_READOUT = 4, /* readout vector v                 */
    TPK_RNG_MC = 5       /* Monte Carlo in the limit evaluator */
};
#define TPK_RNG_STREAM(tag, id) (((uint64_t)(tag) << 32) | (uint64_t)(uint32_t)(id))
/* The stream of a named tensor: tag in the top byte, a 56-bit FNV-1a hash of the name below
 * (never equal to a TPK_RNG_STREAM id). The executors key weights by member name ("W[2]"), so
 * a network's weights do not change when statements are added or reordered, and the rolled
 * and unrolled forms of one program draw the same numbers. */
TPK_API uint64_t tpk_rng_stream_named(enum tpk_rng_tag tag, const char *name);

/* Standard normal z(seed, stream, row, col) (inverse CDF of a 53-bit uniform; columns 2k and
 * 2k+1 share one Philox block, one 64-bit half each). Keyed by (row, col), not by a flat index, so the n×n matrix of a
 * width-n network is the top-left block of the (2n)×(2n) one (before scaling by 1/√n). */
TPK_API double tpk_rng_normal_at(uint64_t seed, uint64_t stream, uint32_t row, uint32_t col);
/* out[k] = z(seed, stream, row, col0 + k), k < len (col0 + len ≤ 2^32). */
TPK_API void tpk_rng_normal_row(uint64_t seed, uint64_t stream, uint32_t row, uint32_t col0,
                                size_t len, double *out);
/* Uniform in [0, 1) with 53 random bits, keyed like tpk_rng_normal_at (first half of the block). */
TPK_API double tpk_rng_uniform_at(uint64_t seed, uint64_t stream, uint32_t row, uint32_t col);

#ifdef __cplusplus
}
#endif
#endif
