/* Index families of a rolled NETSOR program (issue 14), shared by the two evaluators of the
 * rolled form: the infinite-width limit (netsor/flimit.c) and the finite-width executor
 * (netsor/fexec.c). Both walk the family instructions of nsr_rolled in order; this is what they
 * have in common: index arithmetic over the bound symbols, the domain of an instruction (the
 * points of its rolled loops), the member lookup of a stored family (a trie over the target's
 * rolled positions), domains extended by a binder (sum, softmax), and error reporting with the
 * statement's file:line:col. Not installed. */
#ifndef TPK_NETSOR_FAMILY_IMPL_H
#define TPK_NETSOR_FAMILY_IMPL_H

#include "netsor-impl.h"

#define NSR_MAXV (NSR_MAX_INDICES + 12) /* domain indices plus nested binders */

/* The state both evaluators carry: which program, the values of its symbols at the point
 * being evaluated, and the error context. */
typedef struct nsr_fam {
    const nsr_rolled *R;
    const nsr_check *C;
    double *num;          /* symbol values of the current instruction (domain, binders set) */
    int cur;              /* instruction being evaluated */
    tpk_ctx *ctx;
    int unsup;            /* the failure is a form this evaluator does not take (fall back) */
    long work, work_budget; /* domain points visited, and the limit (0: none) */
    int deferred;         /* stopped at work_budget */
    const char *big_hint; /* said when one buffer would not fit in memory */
    const tpk_progress *progress; /* the caller's reports and cancel flag, or NULL */
} nsr_fam;

/* An evaluation domain: m points over nv index symbols (point-major values). */
typedef struct nsr_fdom {
    long m;
    int nv;
    int sym[NSR_MAXV];
    int *val;             /* m × nv */
} nsr_fdom;

/* Member lookup of a stored family: target index tuple → member. */
typedef struct nsr_trie {
    int nlev;             /* rolled levels; −1: a table of nfix-index tuples in lo[0] */
    int pos[NSR_MAX_INDICES];   /* target position of each rolled level */
    int nfix;
    int fpos[NSR_MAX_INDICES], fval[NSR_MAX_INDICES]; /* fixed target positions */
    int *lo[NSR_MAX_INDICES], *hi[NSR_MAX_INDICES];
    long *base[NSR_MAX_INDICES];
    long nn[NSR_MAX_INDICES];
} nsr_trie;

/* An index expression as k + Σ_v c_v·(domain index v), with integer k and c. */
typedef struct nsr_iaff {
    double k, c[NSR_MAXV];
} nsr_iaff;

int nsr_fam_init(nsr_fam *F, const tpk_program *p, tpk_ctx *ctx);
/* The input array x for program p: N×d (one slot) or N×T×d, non-empty, finite. */
int nsr_rolled_input(const tpk_program *p, const tpk_array *x, size_t *N, size_t *T, size_t *d,
                     tpk_ctx *ctx);
void nsr_fam_free(nsr_fam *F);

/* Report "file:line:col: message" at e (or the current statement); TPK_EUNSUPPORTED also sets
 * F->unsup. Returns st (or the status already set). */
int nsr_fam_err(nsr_fam *F, int st, const nsr_expr *e, const char *fmt, ...) TPK_PRINTF(4, 5);
#define NSR_UNSUP(F, e, ...) nsr_fam_err((F), TPK_EUNSUPPORTED, (e), __VA_ARGS__)

/* calloc of n × size (at least one element), with a clear error beyond 60% of the machine's
 * memory or on failure (NULL, status in F->ctx). */
void *nsr_fam_alloc(nsr_fam *F, size_t n, size_t size);
/* Would one buffer of this many bytes exceed the share of memory a block may take? (Reports.) */
int nsr_fam_too_big(nsr_fam *F, size_t bytes);

/* The declared member (A-var or initial G-var, an index into R->dm) of family sym at the indices
 * of e under the bound symbols; an error naming e where the program declares none. */
int nsr_fam_member(nsr_fam *F, int sym, const nsr_expr *e, int *out);

/* Index arithmetic: the value of e from the bound symbols (F->num); an integer index. */
int nsr_fam_num(nsr_fam *F, const nsr_expr *e, double *v);
int nsr_fam_int(nsr_fam *F, const nsr_expr *e, int *out);
/* Does e read any of the symbols syms[0..n)? */
int nsr_reads_syms(const nsr_expr *e, const int *syms, int n, int depth);
/* Bind the domain indices of point p. */
void nsr_bind_point(nsr_fam *F, const nsr_fdom *D, long p);
/* e as an integer affine form of D's indices (1), or not one (0). */
int nsr_iaff_of(nsr_fam *F, const nsr_expr *e, const nsr_fdom *D, nsr_iaff *a, int depth);

/* The index tuple of a read e[i, ...] as integer affine maps of the domain's point, keeping only
 * the non-zero terms (a read k[l, j] over (i, j) is t = (l, v_j): one load per index, where the
 * dense double form costs a multiply-add per domain index). */
typedef struct nsr_imap {
    int n;
    long k[NSR_MAX_INDICES];
    int nt[NSR_MAX_INDICES];
    int q[NSR_MAX_INDICES][NSR_MAXV];
    long c[NSR_MAX_INDICES][NSR_MAXV];
} nsr_imap;
/* 1 when every index of e is affine in D's indices with integer coefficients (then m is set). */
int nsr_imap_of(nsr_fam *F, const nsr_expr *e, const nsr_fdom *D, nsr_imap *m);
static inline void nsr_imap_at(const nsr_imap *m, const int *pv, int *t)
{
    for (int i = 0; i < m->n; i++) {
        long v = m->k[i];
        for (int r = 0; r < m->nt[i]; r++)
            v += m->c[i][r] * pv[m->q[i][r]];
        t[i] = (int)v;
    }
}

/* The points of the rolled loops loop[0..n) (bounds may read outer loops), in loop order, and
 * (tr non-NULL) the levels of the member-lookup trie. */
int nsr_build_domain(nsr_fam *F, const nsr_stmt *const *loop, int n, nsr_fdom *D, nsr_trie *tr);
/* The domain of family instruction fi and the member lookup of its target. */
int nsr_instr_domain(nsr_fam *F, const nsr_finstr *fi, nsr_fdom *D, nsr_trie *tr);
long nsr_trie_find(const nsr_trie *t, const int *idx);
void nsr_trie_free(nsr_trie *t, tpk_ctx *ctx); /* ctx: the evaluation's, whose allocator built t */
/* X = D × (binder of e in lo..hi), points grouped by parent (each point's parent in D). */
int nsr_extend(nsr_fam *F, const nsr_expr *e, const nsr_fdom *D, nsr_fdom *X, long **parent);

/* The shape of softmax(j in lo..hi: s) over D: its rows (the points of D with the entry's
 * index j dropped, so a[i, j] for all j ≤ i costs one row per i), the row domain extended by
 * the binder (X, argument points grouped by row: row r is X points start[r]..start[r+1]), and
 * for each point of D its row and the X point of its entry. */
typedef struct nsr_softmax_shape {
    nsr_fdom rows, X;
    long *row;            /* D->m: row of each point */
    long *start;          /* rows.m + 1 */
    long *pick;           /* D->m: X point of each point's entry */
    long *parent;         /* X.m: row of each argument point */
} nsr_softmax_shape;
int nsr_softmax_shape_of(nsr_fam *F, const nsr_expr *e, const nsr_fdom *D, nsr_softmax_shape *S);
void nsr_softmax_shape_free(nsr_softmax_shape *S, tpk_ctx *ctx);

#endif
