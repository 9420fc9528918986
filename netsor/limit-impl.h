/* Internal interface of the unrolled limit evaluator (netsor/limit*.c): the state `lim` its
 * stages share, each stage's entry points, and the back-end table. The stages, in the order a
 * program meets them (theory.md §1.6, §1.10):
 *   limit_plan.c     plan: atoms, families, G-var representations, liveness and free lists
 *   limit_store.c    covariance store: one block per family over (atom × input), covariances
 *                    of G-vars, the memo of generic E[Z^u Z^v], half-products, releases
 *   limit_expand.c   expansion of a body into Σ coef · Π factors
 *   limit_expect.c   expectations: a pair E[Z^u Z^v] (all inputs), its term pairs, the
 *                    independent factor groups of one entry, Moments — each asks the table
 *   limit_backend.c  the back-end table: {name, applicable, eval}, in order of preference
 *   limit_quad.c     quadrature: Gauss–Hermite rules, tensor Gauss–Hermite / (Q)MC of a group
 *   limit.c          driver: instruction by instruction, readouts, PSD check, public entries
 * beside the helpers limit_poly.c (limit-poly.h), limit_orthant.c (orthant-impl.h) and
 * limit_joint.c (joint-impl.h: one QMC sample shared by the high-dimensional groups). Not
 * installed. */
#ifndef TPK_NETSOR_LIMIT_IMPL_H
#define TPK_NETSOR_LIMIT_IMPL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "backend-impl.h"
#include "joint-impl.h"
#include "orthant-impl.h"
#include "tpk/gauss.h"
#include "tpk/netsor.h"

enum { FAM_AVAR, FAM_EMBED, FAM_BIAS };

#define MAXT 16          /* most terms a body may expand into (else it stays one factor) */
#define MAXF 16          /* most factors in one term (a GRU ζ(1,t)·erf term has t + 1) */
#define BLK 256          /* points per RPN block evaluation */
#define GH_MAXDIM 6      /* largest tensor Gauss–Hermite rule we tabulate */
#define MC_DEFAULT 65536 /* Monte Carlo samples per expectation */
#define QMC_SHIFTS 16    /* randomised QMC: shifts (the standard error has 15 degrees of freedom) */
#define NSR_LIM_MAXBACKENDS 16 /* capacity of the per-back-end counters */

/* The levels at which the evaluator decides how an expectation is computed (limit_backend.c). A
 * query no back end takes is refined by the caller (limit_expect.c): a pair into its term pairs,
 * a term pair or a Moment into its entries, each entry into independent groups; every group is
 * taken. */
enum {
    NSR_LIM_PAIR,   /* E[Z^u_a Z^v_c] for all input pairs (a, c): a MatMul sub-block, a readout */
    NSR_LIM_TERM,   /* the same for one pair of one-factor terms (s of u's expansion, t of v's) */
    NSR_LIM_GROUP,  /* E[Π factors] of one independent group at fixed inputs (on any thread) */
    NSR_LIM_MOMENT, /* the N values of Moment instruction k */
    NSR_LIM_NKINDS
};

typedef struct atom {
    int fam, loc;       /* family and index inside it */
    int src;            /* MATMUL: source variable; EMBED: input slot */
    double mean, scale; /* BIAS: mean; EMBED: σ_U */
} atom;

typedef struct family {
    int kind;
    double var;   /* A-var σ_W², bias σ_b² */
    int cap, m;   /* atoms in the program / created so far */
    int *atoms;   /* global atom ids by local index */
    double *blk;  /* (cap·N)² covariance over (atom, input); NULL for a bias */
    double *tblk; /* NTK: the tangent kernel T over (atom, input), as blk (A-var families) */
    int last;     /* last instruction that needs the block */
    int next;     /* free list link */
} family;

/* A G-var as Σ coef · atom + mean. */
typedef struct grep {
    int n;
    int *atom;
    double *coef;
    double mean;
} grep;

typedef struct xterm {
    double coef;
    int nf;
    int fs[MAXF], fe[MAXF]; /* factor = body nodes [fs, fe) */
} xterm;

typedef struct xbody {
    const tpk_rpn_node *node;
    int nterms;
    xterm *t;
} xbody;

/* Gauss–Hermite rule for the standard normal: E f(Z) ≈ Σ w_i f(x_i). */
typedef struct ghrule {
    int n;
    double *x, *w;
} ghrule;

/* The same E[Z^u_a Z^v_c] is asked by several MatMuls whose A-vars multiply the same sources:
 * an LSTM's W_i, W_f, W_o, W_g all multiply h^{t−1} (and pair it with every earlier h^{r−1}), a
 * GRU's W_z and W_r likewise (theory §2.3–2.4). The generic (per-entry) results are kept, unscaled,
 * while u and v live, so each is computed once. */
typedef struct m2memo {
    int u, v;
    double *E; /* N×N, row a = input of u */
    double err;
} m2memo;

typedef struct lim {
    const tpk_program *p;
    tpk_limit_opts o;
    size_t N, T, d;
    const double *x;
    int natoms, nfam;
    atom *atom;
    family *fam;
    int *fam_of_avar, *fam_of_embed, *atom_of_instr;
    grep *rep;          /* per G-var */
    xbody *xb;          /* per G/H-var, while alive */
    double **scal;      /* per scalar var: N values */
    double **aff;       /* per affine H-var: N means, then N coefficients per arg */
    tpk_rpn_node *gnode; /* per var: a one-node body "GVAR v" */
    int *last;          /* per var: last instruction that reads it */
    int *def;           /* per var: defining instruction, -1 if none */
    int *var_next, *free_var, *free_fam; /* free lists by instruction index */
    int maxlen, maxdepth;
    tpk_gauss_ws *gws;
    ghrule gh[GH_MAXDIM + 1][2]; /* [rank][hi, lo] */
    int gh_ready;
    double *spare;      /* a freed covariance block kept for reuse (saves page faults) */
    size_t spare_len;
    double err;
    tpk_orthant_cache *ocache; /* memo of the orthant back-end (NULL: none) */
    m2memo *mm;         /* memo of generic E[Z^u Z^v] matrices (nsr_lim_memo_*) */
    tpk_nsr_joint *joint; /* the shared sample of m2_joint (NULL: groups sampled alone) */
    int nmm, capmm;
    /* TPK_NETSOR_TRACE: what each back end took, by query kind; what none took (refined) */
    long used[NSR_LIM_MAXBACKENDS][NSR_LIM_NKINDS];
    long fallback[NSR_LIM_NKINDS];
    /* NTK (tangent.c, theory.md §8): the tangent program's partials, the parameterisation,
     * and the instruction of the original program each of this one's stands for (sites) */
    const struct nsr_tangent *tan;
    int ntk_param;
    double ntk_width;   /* TPK_NTK_PARAM_STANDARD: the finite width n of the fan-ins */
    const int *kid;
    int nkid;
    double *tE;         /* NTK scratch: 3 N×N (a T^H, a T of G-vars, an E of partials) */
    double *tspare;     /* a freed tangent block kept for reuse, as spare */
    size_t tspare_len;
    tpk_ctx *ctx;
} lim;

/* The instruction id that seeds the random-number sites of instruction k: the original
 * program's under the NTK, so that both give the NNGP the same numbers. */
static inline uint64_t nsr_lim_kid(const lim *L, int k)
{
    if (L->kid == NULL)
        return (uint64_t)k;
    if (k >= L->p->ninstr)
        return (uint64_t)L->nkid;
    return (uint64_t)(L->kid[k] >= 0 ? L->kid[k] : L->nkid + 1 + k);
}

/* One factor of a product: body nodes [node, node + len) at one input. */
typedef struct fac {
    const tpk_rpn_node *node;
    int len;
    size_t input;
} fac;

/* value of an RPN prefix under affine analysis: kind 0 = constant b, 1 = a·Z^g + b */
struct affv {
    int kind, g;
    double a, b;
};

/* Per-thread workspace of one product expectation (limit_quad.c allocates it). */
typedef struct pws {
    int maxd;          /* dims capacity */
    int *dg;           /* dim → G-var */
    size_t *da;        /* dim → input */
    int *nodedim;      /* per factor node: dim index, concatenated */
    double *sv;        /* per factor node: scalar value */
    const double **gv; /* per factor node: leaf pointer */
    double *C, *m, *sub, *lam, *V, *scaled;
    int *parent, *gdims, *gfacs, *loc;
    double *z, *stack, *fv, *prod, *xs;
    double *xb;     /* a block's QMC normals, D × TPK_QMC_BLOCK (tpk_nsr_qmc_next_block) */
    struct affv *aff;  /* affine-analysis stack */
    long used[NSR_LIM_MAXBACKENDS]; /* groups each back end took on this thread */
    /* m2_entries' joint sampler: while jn_on, the first group that would be sampled alone
     * (more dims than max_gh_dim) is left in jn_f[0..jn_nf) and counts 1 in the product (the
     * joint back end, limit_backend.c) */
    int jn_on, jn_nf;
    fac jn_f[2 * MAXF];
    tpk_ctx ctx;
} pws;

/* Half-products of one affine left factor u, kept while one MatMul instruction pairs u with every
 * earlier source v of its family: Q_h[a][c] = Σ_g l^u_g(a) Cov(Z^g_a, Z^h_c) for each G-var h met
 * so far. With them E[Z^u Z^v] costs |args(v)| N² instead of |args(u)|·|args(v)| N² — for a
 * transformer layer (u, v attention outputs over T keys) O(T³ N²) per layer instead of O(T⁴ N²). */
typedef struct affq {
    int on;       /* set by the MatMul instruction for its span */
    int u;        /* owner of the half-products, -1 none */
    int n, cap;
    int *h;
    double **Q;
    size_t bytes;
} affq;

/* N×N scratch of the pair expectations (s1, s2, s3 allocated on first use), N-vectors qa, qb. */
typedef struct scratch {
    double *s1, *s2, *s3, *qa, *qb;
    affq aq;
} scratch;

static inline void note_err(lim *L, double e)
{
    if (e > L->err || isnan(e))
        L->err = e;
}

/* ---- the back-end table (limit_backend.c; theory.md §1.10 "Expectation back-ends") ------- */

typedef struct nsr_lim_query {
    int kind;
    /* PAIR, TERM */
    int u, v;        /* the variables */
    int s, t;        /* TERM: their terms L->xb[u].t[s], L->xb[v].t[t] */
    int alone;       /* TERM: the pair's only term pair: scale·E goes straight into out */
    scratch *sc;
    double *out;     /* PAIR, TERM alone: out[a·ld + c] = scale · E[Z^u_a Z^v_c] */
    size_t ld;
    int lower_ok;    /* out needs only c ≤ a (a same-atom sub-block) */
    double scale;
    double err;      /* PAIR, TERM alone: error of out; TERM: of E (unscaled) */
    double mm;       /* TERM, not alone: E = sc->s1 + mm (mm the product of the means) */
    uint64_t site;   /* PAIR, GROUP: random-number site */
    /* GROUP: factors fs[gf[0..ngf)] (nodes from nodeoff[]) over dims w->gdims[0..nd) of the
     * entry's D dims (moments w->m, w->C D×D) */
    pws *w;
    const fac *fs;
    const int *nodeoff, *gf;
    int ngf, nd, D;
    tpk_estimate e;  /* GROUP: the result */
    struct {         /* GROUP: ≤ 2 factors as φ(a·g + b) (0: not looked at, 1: yes, −1: no) */
        int state, g[2];
        double a[2], b[2];
        const tpk_phi *phi[2];
    } aff;
    /* MOMENT */
    int k;
    int declined;    /* set by eval: not taken after all, the next back end is asked */
} nsr_lim_query;

/* A back end: applicable says from the query alone (and the state) whether it takes it — a
 * query of a kind it does not serve is never applicable — and may note what it found in q for
 * eval. eval computes it (status; q->declined = 1 passes it on). GROUP queries come from several
 * threads at once: their applicable and eval write only q, q->w and the thread-safe memo. */
typedef struct nsr_lim_backend {
    const char *name;
    int (*applicable)(const lim *L, nsr_lim_query *q);
    int (*eval)(lim *L, nsr_lim_query *q);
} nsr_lim_backend;

extern const nsr_lim_backend nsr_lim_backends[];
extern const int nsr_lim_nbackends;

/* Index of the first back end at or after `from` that takes q, -1 when none does. */
int nsr_lim_pick(const lim *L, nsr_lim_query *q, int from);
/* Evaluate q by back end i (status; q->declined when it passed), counted for the trace. */
int nsr_lim_take(lim *L, nsr_lim_query *q, int i);
/* Ask the table in order: evaluate q by the first back end that takes it and does not decline;
 * *taken = its index, -1 when none took it (the caller refines q then). */
int nsr_lim_ask(lim *L, nsr_lim_query *q, int *taken);
/* The polynomial back end's view of a Nonlin: its affine form (L->aff), when it has one. */
int nsr_lim_poly_prepare(lim *L, int k);

/* ---- plan (limit_plan.c) ------------------------------------------------------------------ */
int nsr_lim_plan(lim *L, int all_outputs);
void nsr_lim_free(lim *L);

/* ---- covariance store (limit_store.c) ----------------------------------------------------- */
double nsr_lim_cov(const lim *L, int g, size_t a, int h, size_t c);
void nsr_lim_cov_mat(const lim *L, int g, int h, int lower, double *out);
void nsr_lim_kern_mat(const lim *L, int g, int h, int lower, int tangent, double *out);
int nsr_lim_tblock_new(lim *L, family *f);
void nsr_lim_put_rows(size_t N, const double *src, double scale, double *dst, size_t ld);
int nsr_lim_share_family(const lim *L, int g, int h);
int nsr_lim_block_new(lim *L, family *f);
void nsr_lim_block_mirror(lim *L, family *f, double *blk, int lj, int li);
const m2memo *nsr_lim_memo_find(const lim *L, int u, int v, int *transposed);
void nsr_lim_memo_put(lim *L, int u, int v, const double *E, double err);
const double *nsr_lim_halfprod(lim *L, affq *q, int u, const int *argu, int nu,
                               const double *coefu, int h, double *C);
void nsr_lim_halfprod_clear(affq *q, tpk_ctx *ctx); /* ctx: the evaluation's */
void nsr_lim_halfprod_free(affq *q, tpk_ctx *ctx);
void nsr_lim_release(lim *L, int k);

/* ---- expansion (limit_expand.c) ----------------------------------------------------------- */
int nsr_lim_expand(const tpk_rpn_node *node, int len, int atomic_only, xbody *xb,
                   tpk_ctx *ctx);

/* ---- expectations (limit_expect.c) -------------------------------------------------------- */
int nsr_lim_m2(lim *L, int u, int v, uint64_t site, scratch *sc, double *out, size_t ld,
               int lower_ok, double scale, double *errp);
int nsr_lim_moment(lim *L, int k);

/* ---- quadrature (limit_quad.c) ------------------------------------------------------------ */
int nsr_lim_gh_init(lim *L);
pws *nsr_lim_pws_alloc(const lim *L);
void nsr_lim_pws_free(pws *w);
int nsr_lim_quad_group(const lim *L, nsr_lim_query *q);

#endif
