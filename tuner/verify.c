/* Exact verification of generated kernels (tptune verify; issue 20 item 3; tuner/README.md "Exact
 * verification"). GEMM and SYRK kernels run unchanged — the same entry point, strides, ragged
 * shapes, alpha/beta, transposes and leading dimensions the library uses — on small-integer inputs
 * whose every floating-point sum is exact, and every output entry (and every guard and padding
 * element around it) is compared exactly with an int64 reference. The map kernels' loop nest runs
 * as a Z_p twin (tuner/cpu_map.c) against a scalar Z_p reference. Also the child that runs one
 * mutant of the mutation suite (tuner/mutate.c). */
#include "tune_impl.h"

#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- GEMM / SYRK on integers -------------------------------------------------------------- */

/* Entries are nonzero integers in [−B, B]. The verified k is at most 2·kc + 7 ≤ 1031 (kc ≤ 512),
 * |alpha|, |beta| ≤ 3, |C0| ≤ B: every value a kernel forms — a partial dot product in any order
 * and grouping, with or without FMA contraction, alpha times it, beta·C0 plus it — is an integer
 * of magnitude ≤ 3·k·B² + 3·B, which is below 2^53 for f64 (B = 2^11: 1.3e10) and below 2^24 for
 * f32 (B = 2^5: 3.2e6), so it is held exactly and the result must equal the reference exactly.
 * exact_bound() checks the inequality for every run. Nonzero entries: a single dropped or doubled
 * term always changes an entry. */
#define INT_BOUND_F64 2048
#define INT_BOUND_F32 32
#define EXACT_F64 9007199254740992.0 /* 2^53 */
#define EXACT_F32 16777216.0         /* 2^24 */
/* Around every matrix: NaN in A and B (a read outside the matrix poisons the result), sentinels in
 * C (a write outside it, or to the strict upper triangle of a SYRK, is seen). */
#define GUARD_FRONT 4096
#define SENT_C 0.5     /* C's padding and guards: no integer */
#define SENT_UPPER 0.25 /* SYRK's strict upper triangle */

static void fail(tpk_tune_verify_report *r, const char *fmt, ...)
{
    if (!r->ok)
        return;
    r->ok = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->what, sizeof r->what, fmt, ap);
    va_end(ap);
}

static int64_t rand_int(uint64_t *rng, int bound)
{
    int64_t v = (int64_t)(tpk__rng_next(rng) % (uint64_t)(2 * bound)) - bound; /* [−B, B) */
    return v >= 0 ? v + 1 : v;                                                 /* nonzero */
}

/* One verified call: layout of A and B (0 row-major, 1 transposed), leading dimensions beyond the
 * minimum, alpha, beta, threads. */
typedef struct variant {
    int ta, tb, lda_pad, ldb_pad, ldc_pad, alpha, beta, other_threads;
    const char *what;
} variant;

/* The variants (tune_impl.h's mutation sites rely on them): A and B each both ways, beta ∉ {0, 1}
 * with either layout of A, beta = 0 (C must not be read) with alpha ≠ 1 and either layout,
 * padded leading dimensions, the other thread count (the dispatcher may call a kernel with a
 * thread count it was not tuned for); alpha = 0 on the first shape. */
static const variant VARIANTS[] = {
    {0, 0, 3, 2, 1, 3, -2, 0, "A, B row-major, lda = k+3, ldb = n+2, ldc = n+1, alpha 3, beta -2"},
    {1, 1, 1, 2, 3, -1, 0, 0, "A, B transposed, lda = m+1, ldb = k+2, ldc = n+3, alpha -1, beta 0"},
    {1, 0, 0, 0, 0, 2, 3, 1, "A transposed, B row-major, tight, alpha 2, beta 3, other threads"},
    {0, 1, 0, 0, 0, -2, 0, 1, "A row-major, B transposed, tight, alpha -2, beta 0, other threads"},
    {0, 0, 0, 0, 0, 0, -3, 0, "A, B row-major, alpha 0, beta -3"},
};
#define NVARIANT (sizeof VARIANTS / sizeof VARIANTS[0])

/* The verified shapes of a blocking (every code path of the template: edge tiles in m and n, a
 * k remainder of 7, two k blocks, two ic blocks, n > nc), smallest first. Returns the count. */
static int gemm_shapes(const tpk__cpu_blocking *b, size_t sh[4][3])
{
    int ns = 0;
    const size_t mr = (size_t)b->mr, nr = (size_t)b->nr, kc = (size_t)b->kc, mc = (size_t)b->mc,
                 nc = (size_t)b->nc;
    sh[ns][0] = 1, sh[ns][1] = 1, sh[ns][2] = 1, ns++;
    sh[ns][0] = 2 * mr + 3, sh[ns][1] = 2 * nr + 5, sh[ns][2] = kc + 7, ns++; /* edges, k tail 7 */
    sh[ns][0] = mc + 2, sh[ns][1] = nr + 3, sh[ns][2] = 2 * kc + 5, ns++;     /* 2 ic, 3 k blocks */
    if (!b->syrk || nc <= TPK__VERIFY_SYRK_NC_MAX)
        sh[ns][0] = mc + mr + 1, sh[ns][1] = nc + nr + 3, sh[ns][2] = 3, ns++; /* 2 jc blocks */
    if (b->syrk) /* square: the larger side */
        for (int i = 0; i < ns; i++)
            sh[i][0] = sh[i][1] = sh[i][0] > sh[i][1] ? sh[i][0] : sh[i][1];
    return ns;
}

static int exact_bound(int f32, size_t k, int alpha, int beta)
{
    const double B = f32 ? INT_BOUND_F32 : INT_BOUND_F64;
    const double bound = fabs((double)alpha) * (double)k * B * B + fabs((double)beta) * B;
    return bound < (f32 ? EXACT_F32 : EXACT_F64);
}

/* The integer problem of one shape: A (m×k), B (k×n; syrk: none), C0 (m×n), AB = A·B (syrk A·Aᵀ). */
typedef struct intprob {
    size_t m, n, k;
    int32_t *A, *B, *C0;
    int64_t *AB;
} intprob;

static void intprob_free(intprob *p)
{
    free(p->A), free(p->B), free(p->C0), free(p->AB);
}

static int intprob_make(intprob *p, size_t m, size_t n, size_t k, int syrk, int bound, uint64_t *rng)
{
    memset(p, 0, sizeof *p);
    p->m = m, p->n = n, p->k = k;
    p->A = malloc(m * k * sizeof *p->A);
    p->B = syrk ? NULL : malloc(k * n * sizeof *p->B);
    p->C0 = malloc(m * n * sizeof *p->C0);
    p->AB = malloc(m * n * sizeof *p->AB);
    if (!p->A || (!syrk && !p->B) || !p->C0 || !p->AB) {
        intprob_free(p);
        return TPK_ENOMEM;
    }
    for (size_t i = 0; i < m * k; i++)
        p->A[i] = (int32_t)rand_int(rng, bound);
    for (size_t i = 0; !syrk && i < k * n; i++)
        p->B[i] = (int32_t)rand_int(rng, bound);
    for (size_t i = 0; i < m * n; i++)
        p->C0[i] = (int32_t)rand_int(rng, bound);
    for (size_t i = 0; i < m; i++)
        for (size_t j = 0; j < n; j++) {
            int64_t z = 0;
            for (size_t q = 0; q < k; q++)
                z += (int64_t)p->A[i * k + q] * (syrk ? p->A[j * k + q] : p->B[q * n + j]);
            p->AB[i * n + j] = z;
        }
    return TPK_OK;
}

/* One variant of one shape: lay the operands out with guards, call, compare every element. */
#define GEMM_RUN(T, KFN)                                                                            \
    static int run_##T(KFN fn, tpk_gemm_ws_fn wsf, const intprob *p, int syrk, const variant *v,    \
                       int nt, size_t kc, size_t mr, size_t nr, tpk_tune_verify_report *r)          \
    {                                                                                              \
        const size_t m = p->m, n = p->n, k = p->k;                                                 \
        /* stored shapes: A m×k (or k×m), B k×n (or n×k) */                                        \
        const size_t ar = v->ta ? k : m, ac = v->ta ? m : k, br = v->tb ? n : k, bc = v->tb ? k : n; \
        const size_t lda = ac + (size_t)v->lda_pad, ldb = bc + (size_t)v->ldb_pad,                 \
                     ldc = n + (size_t)v->ldc_pad;                                                 \
        /* room for a mutant's reads and writes outside the matrices: rows past the end by a      \
         * k block (swapped or dropped strides), a tile's rows past C's last row */               \
        const size_t na = GUARD_FRONT + ar * lda + (kc + k + mr) * lda + 4096,                     \
                     nb = syrk ? 0 : GUARD_FRONT + br * ldb + (kc + nr) * ldb + kc + 4096,         \
                     nc = GUARD_FRONT + m * ldc + (mr + 1) * ldc + nr + 4096;                      \
        const size_t wsb = (wsf(nt) + 63) / 64 * 64;                                               \
        T *A = aligned_alloc(64, (na * sizeof(T) + 63) / 64 * 64);                                 \
        T *B = syrk ? NULL : aligned_alloc(64, (nb * sizeof(T) + 63) / 64 * 64);                   \
        T *C = aligned_alloc(64, (nc * sizeof(T) + 63) / 64 * 64);                                 \
        void *ws = aligned_alloc(64, wsb ? wsb : 64);                                              \
        if (!A || (!syrk && !B) || !C || !ws) {                                                    \
            free(A), free(B), free(C), free(ws);                                                   \
            return TPK_ENOMEM;                                                                     \
        }                                                                                          \
        for (size_t i = 0; i < na; i++)                                                            \
            A[i] = (T)NAN;                                                                         \
        for (size_t i = 0; i < nb; i++)                                                            \
            B[i] = (T)NAN;                                                                         \
        for (size_t i = 0; i < nc; i++)                                                            \
            C[i] = (T)SENT_C;                                                                      \
        memset(ws, 0xff, wsb); /* NaN: a kernel must not depend on its workspace's contents */     \
        T *a = A + GUARD_FRONT, *c = C + GUARD_FRONT;                                              \
        for (size_t i = 0; i < m; i++)                                                             \
            for (size_t q = 0; q < k; q++)                                                         \
                a[v->ta ? q * lda + i : i * lda + q] = (T)p->A[i * k + q];                         \
        if (!syrk)                                                                                 \
            for (size_t q = 0; q < k; q++)                                                         \
                for (size_t j = 0; j < n; j++)                                                     \
                    B[GUARD_FRONT + (v->tb ? j * ldb + q : q * ldb + j)] = (T)p->B[q * n + j];     \
        for (size_t i = 0; i < m; i++)                                                             \
            for (size_t j = 0; j < n; j++)                                                         \
                c[i * ldc + j] = syrk && j > i ? (T)SENT_UPPER                                     \
                                 : v->beta == 0 ? (T)NAN : (T)p->C0[i * n + j];                    \
        const size_t rsa = v->ta ? 1 : lda, csa = v->ta ? lda : 1;                                 \
        const T *b = syrk ? a : B + GUARD_FRONT;                                                   \
        const size_t rsb = syrk ? csa : v->tb ? 1 : ldb, csb = syrk ? rsa : v->tb ? ldb : 1;       \
        fn(m, n, k, (T)v->alpha, a, rsa, csa, b, rsb, csb, (T)v->beta, c, ldc, nt, ws);             \
        size_t wrong = 0;                                                                          \
        for (size_t q = 0; q < nc; q++) {                                                          \
            const size_t off = q < GUARD_FRONT ? 0 : q - GUARD_FRONT, i = off / ldc, j = off % ldc; \
            const int inside = q >= GUARD_FRONT && i < m && j < n;                                 \
            double want;                                                                           \
            if (!inside)                                                                           \
                want = SENT_C;                                                                     \
            else if (syrk && j > i)                                                                \
                want = SENT_UPPER;                                                                 \
            else                                                                                   \
                want = (double)((int64_t)v->alpha * p->AB[i * n + j] +                             \
                                (v->beta ? (int64_t)v->beta * p->C0[i * n + j] : 0));              \
            const double got = (double)C[q];                                                       \
            if (got == want) /* integers held exactly: equality is bit equality up to ±0 */       \
                continue;                                                                          \
            if (!wrong++) {                                                                        \
                if (inside)                                                                        \
                    fail(r, "%zux%zux%zu, %s, %d thread(s): C[%zu][%zu] = %.17g, want %.17g", m, n, k, \
                         v->what, nt, i, j, got, want);                                            \
                else                                                                               \
                    fail(r, "%zux%zux%zu, %s, %d thread(s): written outside C (element %td of the " \
                         "guarded buffer, %.17g)", m, n, k, v->what, nt, (ptrdiff_t)q - GUARD_FRONT, got); \
            }                                                                                      \
        }                                                                                          \
        r->runs++;                                                                                 \
        r->entries += nc;                                                                          \
        free(A), free(B), free(C), free(ws);                                                       \
        return TPK_OK;                                                                             \
    }

GEMM_RUN(double, tpk_dgemm_kernel_fn)
GEMM_RUN(float, tpk_sgemm_kernel_fn)

int tpk_tune_verify_gemm(const tpk_tune_space *s, const tpk_tune_config *c, tpk_dgemm_kernel_fn dfn,
                         tpk_sgemm_kernel_fn sfn, tpk_gemm_ws_fn wsf, uint64_t seed, tpk_tune_verify_report *rep,
                         tpk_ctx *ctx)
{
    memset(rep, 0, sizeof *rep);
    rep->ok = 1;
    if (s->task.target != TPK_TUNE_CPU || (s->task.op != TPK_TUNE_GEMM && s->task.op != TPK_TUNE_SYRK))
        return TPK_ERROR(ctx, TPK_EINVAL, "verify: not a cpu_gemm / cpu_syrk space");
    const int f32 = s->task.dtype == TPK_TUNE_F32;
    if (!wsf || (f32 ? !sfn : !dfn))
        return TPK_ERROR(ctx, TPK_EINVAL, "verify: no %s kernel or workspace function", f32 ? "f32" : "f64");
    tpk__cpu_blocking b;
    tpk__cpu_gemm_blocking(s, c, &b);
    const int nt = s->task.threads < 1 ? 1 : s->task.threads, other = nt == 1 ? 2 : 1;
    size_t sh[4][3];
    const int ns = gemm_shapes(&b, sh);
    uint64_t rng = seed ^ 0x6a09e667f3bcc909ull;
    for (int si = 0; si < ns && rep->ok; si++) {
        intprob p;
        if (intprob_make(&p, sh[si][0], sh[si][1], sh[si][2], b.syrk, f32 ? INT_BOUND_F32 : INT_BOUND_F64, &rng))
            return TPK_ERROR(ctx, TPK_ENOMEM, "verify: out of memory");
        rep->shapes++;
        for (size_t vi = 0; vi < NVARIANT && rep->ok; vi++) {
            const variant *v = &VARIANTS[vi];
            if (v->alpha == 0 && si != 1) /* the alpha = 0 path once */
                continue;
            if (!exact_bound(f32, p.k, v->alpha, v->beta)) {
                intprob_free(&p);
                return TPK_ERROR(ctx, TPK_EINVAL, "verify: k = %zu leaves the exact integer range", p.k);
            }
            const int t = v->other_threads ? other : nt;
            int st = f32 ? run_float(sfn, wsf, &p, b.syrk, v, t, (size_t)b.kc, (size_t)b.mr, (size_t)b.nr, rep)
                         : run_double(dfn, wsf, &p, b.syrk, v, t, (size_t)b.kc, (size_t)b.mr, (size_t)b.nr, rep);
            if (st) {
                intprob_free(&p);
                return TPK_ERROR(ctx, st, "verify: out of memory");
            }
        }
        intprob_free(&p);
    }
    return TPK_OK;
}

/* ---- the map's Z_p twin ------------------------------------------------------------------ */

/* The model (tuner/README.md "Exact verification"). The twin computes, over Z_p (p = 2^31 − 1),
 * out_ij = α f0(S_ij) f1(q_i) f1(q_j) + f2(q_i) f2(q_j) + β below the diagonal and
 * out_ii = α f3(q_i) + β on it, q_i = S_ii, where f_t(x) = T_t[x mod 2^16] + c_t x: random tables
 * (φ, √q and 1/√q replaced by lookups) plus a random linear term, so two different inputs give
 * independent-looking values. The inputs S (every entry, both triangles), α and β are uniform in
 * Z_p. A loop-nest bug — an entry read or written at the wrong place, from the wrong column
 * vector, left out, processed twice in place, a flag lost — leaves at some checked position a value
 * that is either a sentinel (never in Z_p), or the same formula of other inputs, or garbage.
 * Against the expected value, a polynomial of degree 3 in the random table values and
 * coefficients, it agrees with probability ≤ 3/p (Schwartz–Zippel), plus ≤ 1/p that the other
 * inputs collide with the right ones: ≤ 4/p ≈ 1.9e-9 per wrong entry. */
#define ZP_P 2147483647u
#define ZP_TAB 65536
#define ZP_OUTSIDE 0xffffffffu /* padding of S: outside Z_p, flagged when read as an entry */
#define ZP_SENT 0xfffffff0u    /* out's untouched elements */
#define ZP_MISS (4.0 / 2147483647.0)

typedef int (*twin_fn)(size_t n, const uint32_t *S, size_t lds, uint32_t alpha, uint32_t beta, uint32_t *out,
                       size_t ldo, int nt, void *ws);
typedef size_t (*twin_ws_fn)(size_t n);
typedef void (*twin_tab_fn)(const uint32_t *tab);

static uint32_t zp_mul(uint32_t a, uint32_t b)
{
    return (uint32_t)((uint64_t)a * b % ZP_P);
}

static uint32_t zp_add(uint32_t a, uint32_t b)
{
    return (uint32_t)(((uint64_t)a + b) % ZP_P);
}

static uint32_t zp_f(const uint32_t *tab, int t, uint32_t x)
{
    return zp_add(tab[t * ZP_TAB + (x & (ZP_TAB - 1))], zp_mul(tab[4 * ZP_TAB + t], x));
}

/* The reference entry (i, j ≤ i) of S (its diagonal q). */
static uint32_t zp_want(const uint32_t *tab, const uint32_t *S, size_t lds, size_t i, size_t j, uint32_t al,
                        uint32_t be)
{
    const uint32_t qi = S[i * lds + i], qj = S[j * lds + j];
    if (i == j)
        return zp_add(zp_mul(al, zp_f(tab, 3, qi)), be);
    const uint32_t e = zp_mul(zp_mul(zp_mul(al, zp_f(tab, 0, S[i * lds + j])), zp_f(tab, 1, qi)), zp_f(tab, 1, qj));
    return zp_add(zp_add(e, zp_mul(zp_f(tab, 2, qi), zp_f(tab, 2, qj))), be);
}

typedef struct twin {
    twin_fn fn;
    twin_ws_fn ws;
    int lanes, mb, nb, nt;
} twin;

/* One call of the twin on n: out of place (lds = n + 3, ldo = n + 5) or in place (ld = n + 1); a
 * flagged entry at (fi, fj) when flag. Every element of the buffers is checked. */
static int twin_run(const twin *tw, size_t n, int inplace, int flag, size_t fi, size_t fj, int nt, uint64_t *rng,
                    const uint32_t *tab, tpk_tune_verify_report *r)
{
    const size_t lds = inplace ? n + 1 : n + 3, ldo = inplace ? lds : n + 5;
    const size_t guard = 4096 + 16, ns = 2 * guard + n * lds, no = 2 * guard + n * ldo;
    uint32_t *S = malloc(ns * sizeof *S), *S0 = malloc(ns * sizeof *S0);
    uint32_t *O = inplace ? S : malloc(no * sizeof *O);
    void *ws = aligned_alloc(64, (tw->ws(n) + 63) / 64 * 64 + 64);
    if (!S || !S0 || !O || !ws) {
        free(S), free(S0), free(ws);
        if (!inplace)
            free(O);
        return TPK_ENOMEM;
    }
    for (size_t q = 0; q < ns; q++) {
        const size_t off = q - guard, j = off % lds;
        S[q] = q >= guard && off < n * lds && j < n ? (uint32_t)(tpk__rng_next(rng) % ZP_P) : ZP_OUTSIDE;
    }
    if (flag)
        S[guard + fi * lds + fj] = ZP_OUTSIDE;
    memcpy(S0, S, ns * sizeof *S);
    if (!inplace)
        for (size_t q = 0; q < no; q++)
            O[q] = ZP_SENT;
    const uint32_t al = 1 + (uint32_t)(tpk__rng_next(rng) % (ZP_P - 1)), be = (uint32_t)(tpk__rng_next(rng) % ZP_P);
    memset(ws, 0xff, tw->ws(n));
    int bad = tw->fn(n, S + guard, lds, al, be, O + guard, ldo, nt, ws);
    r->runs++;
    const char *how = inplace ? "in place, ld = n+1" : "out of place, lds = n+3, ldo = n+5";
    if (flag) {
        if (!bad)
            fail(r, "n = %zu, %s, %d thread(s): S[%zu][%zu] outside Z_p not flagged", n, how, nt, fi, fj);
    } else {
        if (bad)
            fail(r, "n = %zu, %s, %d thread(s): flagged an entry on valid input", n, how, nt);
        size_t wrong = 0;
        for (size_t q = 0; q < no; q++) {
            const size_t off = q - guard, i = off / ldo, j = off % ldo;
            const int inside = q >= guard && off < n * ldo && j < n;
            uint32_t want;
            if (inside && j <= i)
                want = zp_want(tab, S0 + guard, lds, i, j, al, be);
            else
                want = inplace ? S0[q] : ZP_SENT; /* the upper triangle, padding and guards untouched */
            if (O[q] == want)
                continue;
            if (!wrong++) {
                if (inside)
                    fail(r, "n = %zu, %s, %d thread(s): out[%zu][%zu] = %u, want %u", n, how, nt, i, j, O[q], want);
                else
                    fail(r, "n = %zu, %s, %d thread(s): written outside out (element %td of the guarded buffer)", n,
                         how, nt, (ptrdiff_t)q - (ptrdiff_t)guard);
            }
        }
        r->entries += no;
    }
    free(S), free(S0), free(ws);
    if (!inplace)
        free(O);
    return TPK_OK;
}

/* The random functions' tables and coefficients (seeded). */
static uint32_t *zp_tables(uint64_t seed)
{
    uint32_t *tab = malloc((4 * ZP_TAB + 4) * sizeof *tab);
    if (!tab)
        return NULL;
    uint64_t rng = seed ^ 0xbb67ae8584caa73bull;
    for (int i = 0; i < 4 * ZP_TAB; i++)
        tab[i] = (uint32_t)(tpk__rng_next(&rng) % ZP_P);
    for (int t = 0; t < 4; t++)
        tab[4 * ZP_TAB + t] = 1 + (uint32_t)(tpk__rng_next(&rng) % (ZP_P - 1));
    return tab;
}

/* The twin checks: n = 1, 2, 37, nb + mb + 3 (rows longer than a column block, several row
 * blocks), out of place with the tuned threads, in place with the other count; on n = 37 an entry
 * outside Z_p in every lane, once in a full vector and once in a tail, must be flagged. */
static int twin_verify(const twin *tw, const uint32_t *tab, uint64_t seed, tpk_tune_verify_report *r)
{
    uint64_t rng = seed ^ 0x3c6ef372fe94f82bull;
    r->miss_bound = ZP_MISS;
    const size_t sizes[] = {1, 2, 37, (size_t)tw->nb + (size_t)tw->mb + 3};
    const int other = tw->nt == 1 ? 2 : 1;
    int st = TPK_OK;
    for (int si = 0; si < 4 && r->ok && !st; si++) {
        r->shapes++;
        st = twin_run(tw, sizes[si], 0, 0, 0, 0, tw->nt, &rng, tab, r);
        if (!st && r->ok)
            st = twin_run(tw, sizes[si], 1, 0, 0, 0, other, &rng, tab, r);
        for (int l = 0; sizes[si] == 37 && l < tw->lanes && r->ok && !st; l++) {
            st = twin_run(tw, 37, 0, 1, 36, (size_t)l, tw->nt, &rng, tab, r);
            if (!st && r->ok)
                st = twin_run(tw, 37, 0, 1, (size_t)(tw->lanes + l + 1), (size_t)(tw->lanes + l), tw->nt, &rng,
                              tab, r);
        }
    }
    return st;
}

/* A compiled twin (shared object `so`) of configuration c: loaded, given the tables, checked. */
int tpk__verify_twin_so(const char *so, const tpk_tune_space *s, const tpk_tune_config *c, uint64_t seed,
                         tpk_tune_verify_report *r, tpk_ctx *ctx)
{
    tpk_tune_pin_openmp(); /* the twin is OpenMP code: keep libgomp when it is unloaded */
    void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return TPK_ERROR(ctx, TPK_EIO, "verify: cannot load %s: %s", so, dlerror());
    twin tw;
    tw.fn = (twin_fn)dlsym(h, "tpk_kernel");
    tw.ws = (twin_ws_fn)dlsym(h, "tpk_kernel_ws");
    twin_tab_fn settab = (twin_tab_fn)dlsym(h, "tpk_twin_tables");
    uint32_t *tab = zp_tables(seed);
    int st = TPK_OK;
    if (!tw.fn || !tw.ws || !settab)
        st = TPK_ERROR(ctx, TPK_EIO, "verify: %s is not a Z_p twin", so);
    else if (!tab)
        st = TPK_ERROR(ctx, TPK_ENOMEM, "verify: out of memory");
    else {
        int un;
        tpk__cpu_map_shape(s, c, &tw.lanes, &tw.mb, &tw.nb, &un);
        tw.nt = s->task.threads < 1 ? 1 : s->task.threads;
        settab(tab);
        if (twin_verify(&tw, tab, seed, r))
            st = TPK_ERROR(ctx, TPK_ENOMEM, "verify: out of memory");
    }
    dlclose(h);
    free(tab);
    return st;
}

int tpk_tune_verify_map(const tpk_tune_space *s, const tpk_tune_config *c, uint64_t seed, const char *cc,
                        tpk_tune_verify_report *rep, tpk_ctx *ctx)
{
    memset(rep, 0, sizeof *rep);
    rep->ok = 1;
    char src[600], so[600];
    int st = tpk__scratch(NULL, "twin", src, so, sizeof src, ctx);
    if (st)
        return st;
    FILE *f = fopen(src, "w");
    if (!f)
        return TPK_ERROR(ctx, TPK_EIO, "verify: cannot write %s", src);
    st = tpk__cpu_map_emit_twin(s, c, NULL, f, ctx);
    if (fclose(f) != 0 && !st)
        st = TPK_ERROR(ctx, TPK_EIO, "verify: cannot write %s", src);
    /* -Wno-psabi: a 16-lane uint32_t vector passed by value is an AVX-512 type on an AVX2 host */
    if (!st)
        st = tpk__compile_cpu(src, so, cc, "-Wno-psabi", 120, NULL, ctx);
    if (!st)
        st = tpk__verify_twin_so(so, s, c, seed, rep, ctx);
    unlink(src);
    unlink(so);
    return st;
}

/* ---- the mutation suite's child ----------------------------------------------------------- */

int tpk_tune_verify_child_main(int argc, char **argv)
{
    if (argc != 11 || strcmp(argv[1], "__verify") != 0) {
        fprintf(stderr, "usage: %s __verify SO OP DTYPE M N K THREADS INDEX SEED\n", argv[0]);
        return 2;
    }
    tpk_tune_task t = {TPK_TUNE_CPU, atoi(argv[4]), strtoull(argv[5], NULL, 10), strtoull(argv[6], NULL, 10),
                       strtoull(argv[7], NULL, 10), atoi(argv[8]), atoi(argv[3])};
    const uint64_t index = strtoull(argv[9], NULL, 10), seed = strtoull(argv[10], NULL, 10);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_machine host;
    tpk_machine_host(&host);
    tpk_tune_space s;
    tpk_tune_config c;
    tpk_tune_verify_report r;
    memset(&r, 0, sizeof r);
    int st = tpk_tune_space_init_on(&s, &t, &host, &ctx);
    if (!st) {
        tpk_tune_space_point(&s, index, &c);
        if (t.op == TPK_TUNE_MAP) {
            r.ok = 1;
            st = tpk__verify_twin_so(argv[2], &s, &c, seed, &r, &ctx);
        } else {
            tpk_tune_pin_openmp();
            void *h = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
            if (!h)
                st = TPK_ERROR(&ctx, TPK_EIO, "verify: cannot load %s: %s", argv[2], dlerror());
            else
                st = tpk_tune_verify_gemm(&s, &c, (tpk_dgemm_kernel_fn)dlsym(h, "tpk_kernel"),
                                          (tpk_sgemm_kernel_fn)dlsym(h, "tpk_kernel"),
                                          (tpk_gemm_ws_fn)dlsym(h, "tpk_kernel_ws"), seed, &r, &ctx);
            /* no dlclose: the process ends here */
        }
    }
    if (st) {
        printf("TPKVERIFY error %s\n", ctx.msg);
        return 1;
    }
    for (char *p = r.what; *p; p++) /* one line */
        if (*p == '\n')
            *p = ' ';
    printf("TPKVERIFY %s %d %zu %s\n", r.ok ? "ok" : "wrong", r.runs, r.entries, r.what);
    fflush(stdout);
    return 0;
}
