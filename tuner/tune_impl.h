/* Internals shared by the tuner's files: templates, RNG, small helpers. */
#ifndef TPK_TUNE_IMPL_H
#define TPK_TUNE_IMPL_H

#include "tpk/clock.h"
#include "tpk/tune.h"

/* A schedule template (FFTW's solver, AutoTVM's template): which tasks it serves, its knob table
 * (constraints, features), its analytic default configuration, and its emitter. space.c holds the
 * one table of templates and dispatches through it; templates call only the knob mechanics
 * (knob.c), never space.c. */
struct tpk__mutation;
typedef struct tpk__template {
    const char *name;
    int (*applicable)(const tpk_tune_task *t);
    int (*space)(tpk_tune_space *s, const tpk_tune_task *t, tpk_ctx *ctx);
    void (*defaults)(const tpk_tune_space *s, tpk_tune_config *c);
    /* mu: the mutation to inject (tptune verify --mutants), NULL for the kernel itself. */
    int (*emit)(const tpk_tune_space *s, const tpk_tune_config *c, const char *fname,
                int standalone, struct tpk__mutation *mu, FILE *out, tpk_ctx *ctx);
} tpk__template;
extern const tpk__template tpk__template_cpu_gemm, tpk__template_cpu_map, tpk__template_cuda_gemm;
void tpk__cuda_emit_harness(FILE *o, const char *const *names, const int *dtypes, int nk,
                            const size_t (*shapes)[3], int nshape, int repeat);
/* The cpu_gemm template's kernel names (libgen.c): what they are, style.md §12. */
void tpk__cpu_gemm_kernel_name(const tpk_tune_space *s, const tpk_tune_config *c, char *out, size_t cap);
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


/* ---- Mutation sites (tptune verify --mutants: tuner/mutate.c, docs in tuner/README.md) ------- */

/* The bugs the mutation suite injects, by kind. The emitters mark every place where a kind can be
 * injected with tpk__site(); a site is "on" only where it runs, and its mutation changes the
 * result, on the shapes and variants the exact verifier uses (tuner/verify.c), so that no mutant
 * is equivalent by construction. mutate.c holds the names and classes. */
enum tpk__mut_kind {
    /* cpu_gemm / cpu_syrk: micro-kernel */
    TPK__MUT_ACC_DOUBLE, TPK__MUT_UKR_A_INDEX, TPK__MUT_UKR_B_INDEX, TPK__MUT_K_TAIL, TPK__MUT_K_SKIP,
    TPK__MUT_STORE_BETA, TPK__MUT_STORE_ALPHA, TPK__MUT_STORE_STRIDE,
    /* packing */
    TPK__MUT_PACK_A_STRIDES, TPK__MUT_PACK_A_ROWS, TPK__MUT_PACK_B_STRIDES, TPK__MUT_PACK_B_COLS,
    /* macro-kernel: edge tiles, panels */
    TPK__MUT_EDGE_ROWS, TPK__MUT_EDGE_COLS, TPK__MUT_EDGE_BETA, TPK__MUT_EDGE_COND, TPK__MUT_PANELS_TAIL,
    TPK__MUT_TILE_OFFSET,
    /* driver: blocks and threads */
    TPK__MUT_NPAN_TAIL, TPK__MUT_BETA_BLOCKS, TPK__MUT_K_BLOCKS, TPK__MUT_JC_OFFSET, TPK__MUT_PC_OFFSET,
    TPK__MUT_IC_SPLIT, TPK__MUT_JR_SPLIT,
    /* syrk: the triangle */
    TPK__MUT_SYRK_DIAG_DROP, TPK__MUT_SYRK_DIAG_OVER, TPK__MUT_SYRK_DIAG_COND,
    /* cpu_map (the loop nest its Z_p twin shares) */
    TPK__MUT_MAP_TAIL_STORE, TPK__MUT_MAP_TAIL_LOAD, TPK__MUT_MAP_TAIL_COL, TPK__MUT_MAP_TAIL_MASK,
    TPK__MUT_MAP_STEP, TPK__MUT_MAP_ROW_END, TPK__MUT_MAP_DIAG_COND, TPK__MUT_MAP_DIAG_INDEX,
    TPK__MUT_MAP_ROW_STRIDE, TPK__MUT_MAP_Q_READ, TPK__MUT_MAP_BLOCK_ROWS, TPK__MUT_MAP_COL_BLOCKS,
    TPK__MUT_MAP_TILES, TPK__MUT_MAP_BALANCED, TPK__MUT_MAP_FLAG_LANES, TPK__MUT_MAP_BLOCK_COLS,
    TPK__MUT_MAP_UNROLL_LOAD, TPK__MUT_MAP_COL_LOAD,
    /* cpu_ew (fused entrywise candidates, tuner/ew.c: the loop nest its Z_p twin shares, and the
     * structure both are emitted from) */
    TPK__MUT_EW_STEP, TPK__MUT_EW_ROW_END, TPK__MUT_EW_ROWS, TPK__MUT_EW_TAIL_STORE, TPK__MUT_EW_TAIL_LOAD,
    TPK__MUT_EW_IN_ROW, TPK__MUT_EW_COL_SHIFT, TPK__MUT_EW_Q_ROW, TPK__MUT_EW_Q_COL, TPK__MUT_EW_W_ROW,
    TPK__MUT_EW_W_COL, TPK__MUT_EW_STORE_SKIP, TPK__MUT_EW_TERM_DROP, TPK__MUT_EW_ARG_SWAP, TPK__MUT_EW_PAR_SWAP,
    TPK__MUT_EW_ARG_PREV, TPK__MUT_EW_PRE_END,
    TPK__MUT_KINDS
};

/* One mutant: the site-th "on" site of `kind` (kind < 0: none). count[] gathers, per kind, the
 * on-sites the emitter passed: one emission with kind < 0 enumerates a kernel's sites. */
typedef struct tpk__mutation {
    int kind, site;
    int count[TPK__MUT_KINDS];
} tpk__mutation;

/* 1 at the mutated site; `on` as above (off sites are not counted). mu NULL: the kernel itself.
 * tpk__site: the text of a site, `orig`, or `mutated` there. */
static inline int tpk__mut_at(tpk__mutation *mu, int kind, int on)
{
    if (!mu || !on)
        return 0;
    return mu->count[kind]++ == mu->site && mu->kind == kind;
}
static inline const char *tpk__site(tpk__mutation *mu, int kind, int on, const char *orig,
                                    const char *mutated)
{
    return tpk__mut_at(mu, kind, on) ? mutated : orig;
}

/* The name of a mutation kind ("k_tail"), tuner/mutate.c. */
const char *tpk__mut_name(int kind);
/* A fused entrywise candidate (tuner/ew.c) with a mutation (NULL: none); standalone: with its prelude. */
int tpk__ew_emit(const tpk_tune_ew *e, const tpk_tune_ew_cfg *c, const char *fname, int twin, int standalone,
                 tpk__mutation *mu, FILE *out, tpk_ctx *ctx);
/* Emit through the template table with a mutation (NULL: tpk_tune_emit). */
int tpk__emit(const tpk_tune_space *s, const tpk_tune_config *c, const char *fname, int standalone,
              tpk__mutation *mu, FILE *out, tpk_ctx *ctx);
/* The Z_p twin of a cpu_map configuration (tuner/cpu_map.c): the same loop nest over uint32_t
 * values in Z_p, p = 2^31 − 1, with the entry arithmetic replaced by table lookups (verify.c
 * states the model). Standalone: tpk_kernel, tpk_kernel_ws and tpk_twin_tables(tab). */
int tpk__cpu_map_emit_twin(const tpk_tune_space *s, const tpk_tune_config *c, tpk__mutation *mu,
                           FILE *out, tpk_ctx *ctx);
/* A compiled Z_p twin (shared object so) of configuration c checked by the verifier (verify.c). */
int tpk__verify_twin_so(const char *so, const tpk_tune_space *s, const tpk_tune_config *c, uint64_t seed,
                        tpk_tune_verify_report *r, tpk_ctx *ctx);
/* The map's lanes (vector length in elements), row block and column block. */
void tpk__cpu_map_shape(const tpk_tune_space *s, const tpk_tune_config *c, int *lanes, int *mb, int *nb,
                        int *un);

/* Verified shapes need n > nc for the jc loop; a syrk kernel with a larger nc would need an nc²
 * matrix, so its jc-dependent sites are off (the gemm kernels run the same driver code). */
#define TPK__VERIFY_SYRK_NC_MAX 1200

/* Compile a CPU kernel source with the measurer's flags plus `extra` (one flag or NULL). */
int tpk__compile_cpu(const char *src, const char *so, const char *cc, const char *extra, double timeout_s,
                     double *seconds, tpk_ctx *ctx);
/* Run `runner argv` (or, runner NULL, fork and call inproc(arg, fd) in the child) with OPENBLAS_NUM_THREADS =
 * threads and capture its stdout into buf (NUL-terminated); 0 when it exited 0 within timeout_s,
 * -1 when it crashed, timed out or failed. */
int tpk__run_capture(const char *runner, char *const argv[], int threads, double timeout_s,
                     void (*inproc)(void *arg, int fd), void *arg, char *buf, size_t cap);
/* The runner program of o (measure.c's rule: o->runner, $TPK_TUNE_RUNNER, $TPK_BIN/tptune, or
 * NULL for a plain fork); buf holds the path when it is built. */
const char *tpk__find_runner(const char *runner, char *buf, size_t cap);
/* A fresh scratch directory for this process (removed at exit if empty), or o_dir. */
int tpk__workdir(const char *o_dir, char *dir, size_t cap, tpk_ctx *ctx);
/* Fresh file names TAG<pid>_<count>.c and .so in that directory. */
int tpk__scratch(const char *o_dir, const char *tag, char *src, char *so, size_t cap, tpk_ctx *ctx);

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
/* The distinct kernels of a generated file, in its order: the picks (but those skip() takes: a
 * workload OpenBLAS won) then the defaults, each name once; out has room for np + nd. */
size_t tpk__distinct_kernels(const tpk__pick *p, size_t np, const tpk__pick *def, size_t nd,
                             int (*skip)(const tpk_tune_record *r), const tpk__pick **out);
/* The picks of a class's GEMM file (*p malloc'd) and its four defaults (libgen.c); the records
 * whose workload OpenBLAS won there. */
int tpk__gemm_picks(const tpk_tune_record *recs, size_t n, const tpk_machine *cls, tpk__pick **p, size_t *np,
                    tpk__pick *def, tpk_ctx *ctx);
int tpk__vendor_wins(const tpk_tune_record *r);
/* The picks of a class's map file (*p malloc'd) and its two defaults (map_libgen.c). */
int tpk__map_picks(const tpk_tune_record *recs, size_t n, const tpk_machine *cls, tpk__pick **p, size_t *np,
                   tpk__pick *def, tpk_ctx *ctx);
/* A C identifier from a class id ("avx512-intel" → "avx512_intel"). */
void tpk__class_ident(const char *id, char *out, size_t cap);
double tpk__log2(double x);

#endif
