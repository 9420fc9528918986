/* Internals shared by the tuner's files: templates, RNG, small helpers. */
#ifndef TPK_TUNE_IMPL_H
#define TPK_TUNE_IMPL_H

#include "tpk/clock.h"
#include "tpk/tune.h"

/* A schedule template (FFTW's solver, AutoTVM's template): which tasks it serves, its knob table
 * (constraints, features), its analytic default configuration, and its emitter. space.c holds the
 * one table of templates and dispatches through it; templates call only the knob mechanics
 * (knob.c), never space.c. */
typedef struct tpk__template {
    const char *name;
    int (*applicable)(const tpk_tune_task *t);
    int (*space)(tpk_tune_space *s, const tpk_tune_task *t, tpk_ctx *ctx);
    void (*defaults)(const tpk_tune_space *s, tpk_tune_config *c);
    int (*emit)(const tpk_tune_space *s, const tpk_tune_config *c, const char *fname,
                int standalone, FILE *out, tpk_ctx *ctx);
} tpk__template;
extern const tpk__template tpk__template_cpu_gemm, tpk__template_cpu_map, tpk__template_cuda_gemm;
void tpk__cuda_emit_harness(FILE *o, const char *const *names, const int *dtypes, int nk,
                            const size_t (*shapes)[3], int nshape, int repeat);
/* The cpu_map template's (relu_map, tuner/cpu_map.c) kernel names, prelude and measuring child (h: the dlopen'd
 * candidate; times it on the n×n workload after checking it against tpk_ref_relu_map_*). */
void tpk__cpu_map_kernel_name(const tpk_tune_space *s, const tpk_tune_config *c, char *out, size_t cap);
void tpk__cpu_map_prelude(FILE *out);
int tpk__cpu_map_child(void *h, int dtype, size_t n, int threads, int repeat, double min_repeat_ms,
                       tpk_tune_result *r);
void tpk__cuda_kernel_name(const tpk_tune_space *s, const tpk_tune_config *c, char *out, size_t cap);
int tpk__cuda_measure(const tpk_tune_space *s, const tpk_tune_config *c,
                      const tpk_tune_measure_opts *o, tpk_tune_result *res, tpk_ctx *ctx);

/* Derived blocking of a cpu_gemm configuration (the knobs after rounding to the tile). */
typedef struct tpk__cpu_blocking {
    int es;   /* element size in bytes */
    int vl;   /* vector length in elements */
    int mr, nr, nv, kc, mc, nc, ku, order, par, pf;
    int pb;   /* B packed per thread, no barriers (par = ic only) */
    int pa;   /* A read in place by the micro-kernel (row-contiguous A), not packed */
    int syrk; /* lower triangle only */
} tpk__cpu_blocking;
void tpk__cpu_gemm_blocking(const tpk_tune_space *s, const tpk_tune_config *c, tpk__cpu_blocking *b);
enum { TPK__ORDER_JR_IR = 0, TPK__ORDER_IR_JR = 1 };
enum { TPK__PAR_IC = 0, TPK__PAR_JR = 1 };


/* splitmix64: small, seedable, good enough for search decisions. */
static inline uint64_t tpk__rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline double tpk__rng_unif(uint64_t *s)
{
    return (double)(tpk__rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

double tpk__label(const tpk_tune_result *r);

/* Library generation (libgen.c, map_libgen.c): the best valid record per workload of the logs
 * (AutoTVM's ApplyHistoryBest), with its space, configuration and kernel name. */
typedef struct tpk__pick {
    const tpk_tune_record *r;
    tpk_tune_space s;
    tpk_tune_config c;
    char name[160];
} tpk__pick;
typedef int (*tpk__rec_cmp)(const tpk_tune_record *a, const tpk_tune_record *b);
typedef void (*tpk__kernel_namer)(const tpk_tune_space *s, const tpk_tune_config *c, char *out, size_t cap);
/* Fills p (room for n) with one pick per workload among the records of class m (target m->name)
 * that accept() takes, workloads told apart and ordered by cmp, spaces on m; returns the count.
 * Records of an older space are skipped. */
size_t tpk__pick_best(const tpk_tune_record *recs, size_t n, const tpk_machine *m,
                      int (*accept)(const tpk_tune_record *r), tpk__rec_cmp cmp,
                      tpk__kernel_namer name, tpk__pick *p);
/* The analytic default configuration of task t on class m as a pick (r NULL): the generators'
 * safe kernels. */
int tpk__pick_default(const tpk_tune_task *t, const tpk_machine *m, tpk__kernel_namer name,
                      tpk__pick *p, tpk_ctx *ctx);
/* A C identifier from a class id ("avx512-intel" → "avx512_intel"). */
void tpk__class_ident(const char *id, char *out, size_t cap);
double tpk__log2(double x);

#endif
