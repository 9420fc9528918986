/* Infinite-width limit of a NETSOR(+) program: the Master Theorem recursion over a batch
 * (theory.md §1.6–1.9). Every G-var is a linear combination of atoms (MatMul outputs and initial
 * G-vars); covariances are stored per family (one A-var, one embedding, one bias) over
 * (atom × input). Expectations E[Z^h_a Z^h'_c] are dispatched to, in order: whole-matrix closed
 * forms (tpk_gauss_map / _cross), exact linear moments, splitting into independent families
 * (§2.3), 1-/2-D Gauss–Hermite of the library (tpk_gauss_expect1/2_quad), tensor Gauss–Hermite on
 * the eigen-decomposed joint Gaussian (dimension ≤ 4), and Monte Carlo with a standard error. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <gsl/gsl_integration.h>
#include <lapacke.h>

#include "backend-impl.h"
#include "joint-impl.h"
#include "orthant-impl.h"
#include "tpk/batchnorm.h"
#include "tpk/matmul.h"
#include "tpk/mvn.h"
#include "tpk/rng.h"
#include "limit-poly.h"

enum { FAM_AVAR, FAM_EMBED, FAM_BIAS };

#define MAXT 16          /* most terms a body may expand into (else it stays one factor) */
#define MAXF 16          /* most factors in one term (a GRU ζ(1,t)·erf term has t + 1) */
#define BLK 256          /* points per RPN block evaluation */
#define MC_DEFAULT 65536 /* Monte Carlo samples per expectation */
#define QMC_SHIFTS 16    /* randomised QMC: shifts (the standard error has 15 degrees of freedom) */
#define GH_MAXDIM 6      /* largest tensor Gauss–Hermite rule we tabulate */
/* The joint sampler (m2_joint, netsor/limit_joint.c) takes the groups of more dims than the
 * tensor Gauss–Hermite rule serves (they would be sampled alone). Its sample is shared by all of
 * them, so it affords JOINT_POINTS_X times the points one group gets: an LSTM 8 × 4 then has the
 * per-group rule's RMS error (6e-5) and a smaller largest error estimate (1.8e-4 against 2.6e-4),
 * 16 times faster. Its cache of factor values is bounded by JOINT_MAX_BYTES. */
#define JOINT_POINTS_X 2
#define JOINT_MAX_BYTES ((size_t)512 << 20)
/* Eigenvalues below this fraction of the largest are treated as 0 (Σ may be singular, §1.6). */
#define RANK_TOL 1e-12
/* Clear PSD violation of the final kernel: λ_min < −(PSD_REL·λ_max + PSD_ERR·dim·err). */
#define PSD_REL 1e-9
#define PSD_ERR 8.0

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
    int last;     /* last instruction that needs the block */
    int next;     /* free list link */
} family;

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
    struct m2memo *mm;  /* memo of generic E[Z^u Z^v] matrices (m2_memo_*) */
    tpk_nsr_joint *joint; /* the shared sample of m2_joint (NULL: groups sampled alone) */
    int nmm, capmm;
    tpk_ctx *ctx;
} lim;

/* The same E[Z^u_a Z^v_c] is asked by several MatMuls whose A-vars multiply the same sources:
 * an LSTM's W_i, W_f, W_o, W_g all multiply h^{t−1} (and pair it with every earlier h^{r−1}), a
 * GRU's W_z and W_r likewise (theory §2.3–2.4). The generic (per-entry) results are kept, unscaled,
 * while u and v live, so each is computed once. */
typedef struct m2memo {
    int u, v;
    double *E; /* N×N, row a = input of u */
    double err;
} m2memo;

/* ---- small helpers ---------------------------------------------------------------------- */

static int is_gvar_factor(const tpk_rpn_node *nd, int len)
{
    return len == 1 && nd[0].op == TPK_RPN_GVAR;
}
static int is_call_factor(const tpk_rpn_node *nd, int len)
{
    return len == 2 && nd[0].op == TPK_RPN_GVAR && nd[1].op == TPK_RPN_CALL;
}
static int same_phi(const tpk_phi *a, const tpk_phi *b)
{
    return a == b || strcmp(tpk_phi_name(a), tpk_phi_name(b)) == 0;
}

static double atom_cov(const lim *L, int i, size_t a, int j, size_t c)
{
    const atom *ai = &L->atom[i], *aj = &L->atom[j];
    if (ai->fam != aj->fam)
        return 0.0;
    const family *f = &L->fam[ai->fam];
    if (f->kind == FAM_BIAS)
        return f->var;
    size_t ld = (size_t)f->cap * L->N;
    if (i == j && c > a) { /* a same-atom sub-block is kept in its lower triangle only */
        size_t t = a;
        a = c;
        c = t;
    }
    return f->blk[((size_t)ai->loc * L->N + a) * ld + (size_t)aj->loc * L->N + c];
}

static double cov_dim(const lim *L, int g, size_t a, int h, size_t c)
{
    const grep *r = &L->rep[g], *s = &L->rep[h];
    double acc = 0.0;
    for (int i = 0; i < r->n; i++)
        for (int j = 0; j < s->n; j++)
            if (L->atom[r->atom[i]].fam == L->atom[s->atom[j]].fam)
                acc += r->coef[i] * s->coef[j] * atom_cov(L, r->atom[i], a, s->atom[j], c);
    return acc;
}

/* out[a][c] = Cov(Z^g_a, Z^h_c), N×N; lower: only c ≤ a is written (what tpk_gauss_map reads).
 * One pass over the output: bias families add a constant, the first block assigns. */
static void cov_mat(const lim *L, int g, int h, int lower, double *out)
{
    size_t N = L->N;
    const grep *r = &L->rep[g], *s = &L->rep[h];
    double c0 = 0.0;
    int first = 1;
    for (int i = 0; i < r->n; i++)
        for (int j = 0; j < s->n; j++) {
            const atom *ai = &L->atom[r->atom[i]], *aj = &L->atom[s->atom[j]];
            if (ai->fam == aj->fam && L->fam[ai->fam].kind == FAM_BIAS)
                c0 += r->coef[i] * s->coef[j] * L->fam[ai->fam].var;
        }
    for (int i = 0; i < r->n; i++)
        for (int j = 0; j < s->n; j++) {
            const atom *ai = &L->atom[r->atom[i]], *aj = &L->atom[s->atom[j]];
            if (ai->fam != aj->fam || L->fam[ai->fam].kind == FAM_BIAS)
                continue;
            const family *f = &L->fam[ai->fam];
            double cc = r->coef[i] * s->coef[j];
            size_t ld = (size_t)f->cap * N;
            const double *b = f->blk + (size_t)ai->loc * N * ld + (size_t)aj->loc * N;
            /* a same-atom sub-block holds only its lower triangle: the rest is its transpose */
            const int same = r->atom[i] == s->atom[j];
#pragma omp parallel for schedule(dynamic, 64) if (N >= 512)
            for (size_t a = 0; a < N; a++) {
                size_t cend = lower || same ? a + 1 : N;
                double *o = out + a * N;
                const double *br = b + a * ld;
                if (first)
                    for (size_t c = 0; c < cend; c++)
                        o[c] = c0 + cc * br[c];
                else
                    for (size_t c = 0; c < cend; c++)
                        o[c] += cc * br[c];
                if (same && !lower)
                    for (size_t c = a + 1; c < N; c++)
                        o[c] = (first ? c0 : o[c]) + cc * b[c * ld + a];
            }
            first = 0;
        }
    if (first)
        for (size_t a = 0; a < N; a++)
            for (size_t c = 0; c < (lower ? a + 1 : N); c++)
                out[a * N + c] = c0;
}

/* dst (ld) = scale · src (N×N, ld N), row by row. */
static void put_rows(size_t N, const double *src, double scale, double *dst, size_t ld)
{
    for (size_t a = 0; a < N; a++)
        for (size_t c = 0; c < N; c++)
            dst[a * ld + c] = scale * src[a * N + c];
}

/* ---- body expansion into Σ coef · Π factors ------------------------------------------- */

typedef struct xent {
    int start;
    int n;
    xterm t[MAXT];
} xent;

static void x_atomic(xent *e, int start, int end)
{
    e->start = start;
    e->n = 1;
    e->t[0].coef = 1.0;
    e->t[0].nf = 1;
    e->t[0].fs[0] = start;
    e->t[0].fe[0] = end;
}

static int expand_body(const tpk_rpn_node *node, int len, int atomic_only, xbody *xb)
{
    xb->node = node;
    xb->nterms = 0;
    xb->t = NULL;
    xent *stk = NULL;
    int sp = 0;
    if (atomic_only)
        goto whole;
    int depth = tpk_nsr_rpn_depth(node, len);
    stk = malloc((size_t)(depth > 0 ? depth : 1) * sizeof *stk);
    if (stk == NULL)
        return TPK_ENOMEM;
    for (int i = 0; i < len; i++) {
        const tpk_rpn_node *nd = &node[i];
        switch (nd->op) {
        case TPK_RPN_CONST:
            stk[sp].start = i;
            stk[sp].n = 1;
            stk[sp].t[0].coef = nd->value;
            stk[sp].t[0].nf = 0;
            sp++;
            break;
        case TPK_RPN_GVAR:
        case TPK_RPN_SCALAR:
            x_atomic(&stk[sp++], i, i + 1);
            break;
        case TPK_RPN_NEG:
            for (int t = 0; t < stk[sp - 1].n; t++)
                stk[sp - 1].t[t].coef = -stk[sp - 1].t[t].coef;
            break;
        case TPK_RPN_CALL:
        case TPK_RPN_POWI:
            x_atomic(&stk[sp - 1], stk[sp - 1].start, i + 1);
            break;
        case TPK_RPN_DIV:
            sp--;
            x_atomic(&stk[sp - 1], stk[sp - 1].start, i + 1);
            break;
        case TPK_RPN_ADD:
        case TPK_RPN_SUB: {
            xent *a = &stk[sp - 2], *b = &stk[sp - 1];
            int dummy;
            double da, db, dv;
            /* 1 − σ(g) of a smoothed step stays one factor, σ(−g), for the orthant back-end */
            if (nd->op == TPK_RPN_SUB && a->n == 1 && a->t[0].nf == 0 && a->t[0].coef == 1.0 &&
                tpk_nsr_orthant_factor(node + a->start, i + 1 - a->start, &dummy, &da, &db, &dv)) {
                x_atomic(a, a->start, i + 1);
            } else if (a->n + b->n > MAXT) {
                x_atomic(a, a->start, i + 1);
            } else {
                for (int t = 0; t < b->n; t++) {
                    a->t[a->n] = b->t[t];
                    if (nd->op == TPK_RPN_SUB)
                        a->t[a->n].coef = -a->t[a->n].coef;
                    a->n++;
                }
            }
            sp--;
            break;
        }
        case TPK_RPN_MUL: {
            xent *a = &stk[sp - 2], *b = &stk[sp - 1];
            int ok = a->n * b->n <= MAXT;
            for (int s = 0; ok && s < a->n; s++)
                for (int t = 0; ok && t < b->n; t++)
                    ok = a->t[s].nf + b->t[t].nf <= MAXF;
            if (!ok) {
                x_atomic(a, a->start, i + 1);
            } else {
                xterm prod[MAXT];
                int np = 0;
                for (int s = 0; s < a->n; s++)
                    for (int t = 0; t < b->n; t++) {
                        xterm *r = &prod[np++];
                        *r = a->t[s];
                        r->coef *= b->t[t].coef;
                        for (int f = 0; f < b->t[t].nf; f++) {
                            r->fs[r->nf] = b->t[t].fs[f];
                            r->fe[r->nf] = b->t[t].fe[f];
                            r->nf++;
                        }
                    }
                memcpy(a->t, prod, (size_t)np * sizeof *prod);
                a->n = np;
            }
            sp--;
            break;
        }
        default:
            break;
        }
    }
    xb->t = malloc((size_t)stk[0].n * sizeof *xb->t);
    if (xb->t == NULL) {
        free(stk);
        return TPK_ENOMEM;
    }
    /* drop zero terms (e.g. g − g), keep at least one */
    for (int t = 0; t < stk[0].n; t++)
        if (stk[0].t[t].coef != 0.0 || (t == stk[0].n - 1 && xb->nterms == 0))
            xb->t[xb->nterms++] = stk[0].t[t];
    free(stk);
    return TPK_OK;
whole:
    xb->t = malloc(sizeof *xb->t);
    if (xb->t == NULL)
        return TPK_ENOMEM;
    xb->nterms = 1;
    xb->t[0].coef = 1.0;
    xb->t[0].nf = 1;
    xb->t[0].fs[0] = 0;
    xb->t[0].fe[0] = len;
    return TPK_OK;
}

/* ---- per-thread workspace and one product expectation E[Π factors] ------------------------ */

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
    struct affv *aff;  /* affine-analysis stack */
    /* m2_entries' joint sampler: while jn_on, the first group that would be sampled alone
     * (more dims than max_gh_dim) is left in jn_f[0..jn_nf) and counts 1 in the product */
    int jn_on, jn_nf;
    fac jn_f[2 * MAXF];
    tpk_ctx ctx;
} pws;

static void pws_free(pws *w)
{
    if (w == NULL)
        return;
    free(w->dg);
    free(w->da);
    free(w->nodedim);
    free(w->sv);
    free(w->gv);
    free(w->C);
    free(w->m);
    free(w->sub);
    free(w->lam);
    free(w->V);
    free(w->scaled);
    free(w->parent);
    free(w->gdims);
    free(w->gfacs);
    free(w->loc);
    free(w->z);
    free(w->stack);
    free(w->fv);
    free(w->prod);
    free(w->xs);
    free(w->aff);
    free(w);
}

static pws *pws_alloc(const lim *L)
{
    pws *w = calloc(1, sizeof *w);
    if (w == NULL)
        return NULL;
    int nodes = 2 * L->maxlen + 2; /* leaves of both sides */
    size_t D = (size_t)nodes;
    w->maxd = nodes;
    tpk_ctx_init(&w->ctx);
    w->dg = malloc(D * sizeof *w->dg);
    w->da = malloc(D * sizeof *w->da);
    w->nodedim = malloc(D * sizeof *w->nodedim);
    w->sv = malloc(D * sizeof *w->sv);
    w->gv = malloc(D * sizeof *w->gv);
    w->C = malloc(D * D * sizeof *w->C);
    w->m = malloc(D * sizeof *w->m);
    w->sub = malloc(D * D * sizeof *w->sub);
    w->lam = malloc(D * sizeof *w->lam);
    w->V = malloc(D * D * sizeof *w->V);
    w->scaled = malloc(D * D * sizeof *w->scaled);
    w->parent = malloc(D * sizeof *w->parent);
    w->gdims = malloc(D * sizeof *w->gdims);
    w->gfacs = malloc((2 * MAXF + 2) * sizeof *w->gfacs);
    w->loc = malloc(D * sizeof *w->loc);
    w->z = malloc(D * BLK * sizeof *w->z);
    w->stack = malloc((size_t)L->maxdepth * BLK * sizeof *w->stack);
    w->fv = malloc(BLK * sizeof *w->fv);
    w->prod = malloc(BLK * sizeof *w->prod);
    w->xs = malloc(D * sizeof *w->xs);
    w->aff = malloc(D * sizeof *w->aff);
    if (!w->xs || !w->aff || !w->dg || !w->da || !w->nodedim || !w->sv || !w->gv || !w->C || !w->m || !w->sub ||
        !w->lam || !w->V || !w->scaled || !w->parent || !w->gdims || !w->gfacs || !w->loc ||
        !w->z || !w->stack || !w->fv || !w->prod) {
        pws_free(w);
        return NULL;
    }
    return w;
}

static int uf_find(int *p, int i)
{
    while (p[i] != i)
        i = p[i] = p[p[i]];
    return i;
}

/* Evaluate Π_{f in group} f at BLK points whose dims are in w->z (group-local layout via
 * w->loc), accumulating Σ weight·value. */
static void eval_group_block(const lim *L, pws *w, const fac *fs, const int *nodeoff,
                             const int *gf, int ngf, size_t B, double *out)
{
    for (size_t b = 0; b < B; b++)
        out[b] = 1.0;
    for (int q = 0; q < ngf; q++) {
        const fac *f = &fs[gf[q]];
        int off = nodeoff[gf[q]];
        for (int i = 0; i < f->len; i++)
            if (f->node[i].op == TPK_RPN_GVAR)
                w->gv[off + i] = w->z + (size_t)w->loc[w->nodedim[off + i]] * BLK;
        tpk_nsr_rpn_eval(f->node, f->len, w->gv + off, w->sv + off, B, w->stack, w->fv);
        for (size_t b = 0; b < B; b++)
            out[b] *= w->fv[b];
    }
    (void)L;
}

/* Expectation of a group over its r-dimensional support z = m + V·√λ·x, x ~ N(0, I_r):
 * tensor Gauss–Hermite (two degrees, difference = error) or Monte Carlo (standard error). */
static void group_numeric(const lim *L, pws *w, const fac *fs, const int *nodeoff, const int *gf,
                          int ngf, int nd, int r, uint64_t site, tpk_estimate *est)
{
    /* w->scaled[k*r + j] = V[k][j]·√λ_j for the r kept eigen-directions */
    int use_mc = L->o.force_mc || r > (L->o.max_gh_dim ? L->o.max_gh_dim : 4) || r > GH_MAXDIM;
    if (!use_mc) {
        double val[2];
        for (int h = 0; h < 2; h++) {
            const ghrule *g = &L->gh[r][h];
            size_t npts = 1;
            for (int j = 0; j < r; j++)
                npts *= (size_t)g->n;
            double acc = 0.0;
            for (size_t p0 = 0; p0 < npts; p0 += BLK) {
                size_t B = npts - p0 < BLK ? npts - p0 : BLK;
                double wt[BLK];
                for (size_t b = 0; b < B; b++) {
                    size_t idx = p0 + b;
                    double x[GH_MAXDIM];
                    wt[b] = 1.0;
                    for (int j = 0; j < r; j++) {
                        size_t ij = idx % (size_t)g->n;
                        idx /= (size_t)g->n;
                        x[j] = g->x[ij];
                        wt[b] *= g->w[ij];
                    }
                    for (int k = 0; k < nd; k++) {
                        double zk = w->m[w->gdims[k]];
                        for (int j = 0; j < r; j++)
                            zk += w->scaled[k * r + j] * x[j];
                        w->z[(size_t)k * BLK + b] = zk;
                    }
                }
                eval_group_block(L, w, fs, nodeoff, gf, ngf, B, w->prod);
                for (size_t b = 0; b < B; b++)
                    acc += wt[b] * w->prod[b];
            }
            val[h] = acc;
        }
        est->value = val[0];
        est->err = fabs(val[0] - val[1]);
        return;
    }
    size_t M = L->o.mc_samples ? L->o.mc_samples : MC_DEFAULT;
    uint64_t stream = TPK_RNG_STREAM(TPK_RNG_MC, (uint32_t)site);
    uint64_t seed = L->o.mc_seed ^ (site >> 32) * UINT64_C(0x9E3779B97F4A7C15);
    double s1 = 0.0, s2 = 0.0;
    if (!L->o.force_mc) {
        /* randomised QMC (netsor/limit_orthant.c): QMC_SHIFTS shifted lattices of M/QMC_SHIFTS
         * points, the standard error over the shifts (theory §3.3: ~M⁻¹ for smooth integrands) */
        size_t Ms = (M + QMC_SHIFTS - 1) / QMC_SHIFTS;
        uint64_t qseed = seed ^ (uint64_t)stream;
        tpk_qmc *g = tpk_nsr_qmc_alloc(r);
        if (g == NULL) { /* no error channel here: an infinite error estimate says it */
            est->value = 0.0;
            est->err = HUGE_VAL;
            return;
        }
        for (int sh = 0; sh < QMC_SHIFTS; sh++) {
            double acc = 0.0;
            tpk_nsr_qmc_start(g, qseed, sh);
            for (size_t p0 = 0; p0 < Ms; p0 += BLK) {
                size_t B = Ms - p0 < BLK ? Ms - p0 : BLK;
                for (size_t b = 0; b < B; b++) {
                    double *x = w->xs;
                    tpk_nsr_qmc_next_normals(g, x);
                    for (int k = 0; k < nd; k++) {
                        double zk = w->m[w->gdims[k]];
                        for (int j = 0; j < r; j++)
                            zk += w->scaled[k * r + j] * x[j];
                        w->z[(size_t)k * BLK + b] = zk;
                    }
                }
                eval_group_block(L, w, fs, nodeoff, gf, ngf, B, w->prod);
                for (size_t b = 0; b < B; b++)
                    acc += w->prod[b];
            }
            acc /= (double)Ms;
            s1 += acc;
            s2 += acc * acc;
        }
        tpk_nsr_qmc_free(g);
        double mean = s1 / QMC_SHIFTS, var = (s2 - QMC_SHIFTS * mean * mean) / (QMC_SHIFTS - 1);
        est->value = mean;
        est->err = var > 0 ? sqrt(var / QMC_SHIFTS) : 0.0;
        return;
    }
    for (size_t p0 = 0; p0 < M; p0 += BLK) {
        size_t B = M - p0 < BLK ? M - p0 : BLK;
        for (size_t b = 0; b < B; b++) {
            double *x = w->xs;
            for (int j = 0; j < r; j++)
                x[j] = tpk_rng_normal_at(seed, stream, (uint32_t)(p0 + b), (uint32_t)j);
            for (int k = 0; k < nd; k++) {
                double zk = w->m[w->gdims[k]];
                for (int j = 0; j < r; j++)
                    zk += w->scaled[k * r + j] * x[j];
                w->z[(size_t)k * BLK + b] = zk;
            }
        }
        eval_group_block(L, w, fs, nodeoff, gf, ngf, B, w->prod);
        for (size_t b = 0; b < B; b++) {
            s1 += w->prod[b];
            s2 += w->prod[b] * w->prod[b];
        }
    }
    double mean = s1 / (double)M;
    double var = s2 / (double)M - mean * mean;
    est->value = mean;
    est->err = var > 0 ? sqrt(var / (double)M) : 0.0;
}

/* Is the factor φ(a·g + b) with a, b fixed for its input (constants, scalars, φ of constants)?
 * Then its expectations go to the library's 1-/2-D rules with shifted, scaled moments, e.g.
 * layernorm's φ((g − m)/√(v + ε)) (theory §2.6). */
static int affine_call(const lim *L, pws *w, const fac *f, int *g, double *a, double *b,
                       const tpk_phi **phi)
{
    int len = f->len, sp = 0;
    if (len < 2 || f->node[len - 1].op != TPK_RPN_CALL)
        return 0;
    struct affv *st = w->aff;
    for (int i = 0; i < len - 1; i++) {
        const tpk_rpn_node *nd = &f->node[i];
        struct affv *x = sp >= 2 ? &st[sp - 2] : NULL, *y = sp >= 1 ? &st[sp - 1] : NULL;
        switch (nd->op) {
        case TPK_RPN_CONST:
            st[sp++] = (struct affv){0, -1, 0.0, nd->value};
            break;
        case TPK_RPN_SCALAR:
            st[sp++] = (struct affv){0, -1, 0.0, L->scal[nd->var][f->input]};
            break;
        case TPK_RPN_GVAR:
            st[sp++] = (struct affv){1, nd->var, 1.0, 0.0};
            break;
        case TPK_RPN_ADD:
        case TPK_RPN_SUB: {
            double sg = nd->op == TPK_RPN_ADD ? 1.0 : -1.0;
            if (x->kind && y->kind && x->g != y->g)
                return 0;
            if (y->kind) {
                x->g = y->g;
                x->a = (x->kind ? x->a : 0.0) + sg * y->a;
                x->kind = 1;
            }
            x->b += sg * y->b;
            sp--;
            break;
        }
        case TPK_RPN_MUL:
            if (x->kind && y->kind)
                return 0;
            if (y->kind) {
                double c = x->b;
                *x = *y;
                x->a *= c;
                x->b *= c;
            } else {
                x->a *= y->b;
                x->b *= y->b;
            }
            sp--;
            break;
        case TPK_RPN_DIV:
            if (y->kind || y->b == 0.0)
                return 0;
            x->a /= y->b;
            x->b /= y->b;
            sp--;
            break;
        case TPK_RPN_NEG:
            y->a = -y->a;
            y->b = -y->b;
            break;
        case TPK_RPN_POWI:
        case TPK_RPN_CALL: {
            if (y->kind)
                return 0;
            if (nd->op == TPK_RPN_CALL) {
                y->b = tpk_phi_eval(nd->fn, y->b);
            } else {
                double base = y->b, r = 1.0;
                int e = (int)nd->value;
                for (int k = e < 0 ? -e : e; k > 0; k--)
                    r *= base;
                y->b = e < 0 ? 1.0 / r : r;
            }
            break;
        }
        default:
            return 0;
        }
    }
    if (sp != 1 || !st[0].kind)
        return 0;
    *g = st[0].g;
    *a = st[0].a;
    *b = st[0].b;
    *phi = f->node[len - 1].fn;
    return 1;
}

/* erf, the erf-sigmoid gate and the step as α·P(ξ < x) + β, ξ ~ N(0, v) (theory §2.3:
 * erf x = 2Φ(√2 x) − 1 = 2σ(x) − 1). Returns 0 for other φ. */
static int smooth_affine(const tpk_phi *phi, double *al, double *be, double *v)
{
    const char *n = tpk_phi_name(phi);
    double b = 1.0;
    if (strcmp(n, "erf") == 0 || (sscanf(n, "erf(%lf)", &b) == 1 && isfinite(b) && b != 0.0)) {
        /* erf(b x) = sign(b)·(2 P(ξ < x) − 1), ξ ~ N(0, 1/(2b²)) */
        double sg = b > 0 ? 1.0 : -1.0;
        return *al = 2.0 * sg, *be = -sg, *v = 0.5 / (b * b), 1;
    }
    if (strcmp(n, "erf_sigmoid") == 0)
        return *al = 1.0, *be = 0.0, *v = 0.5, 1;
    if (strcmp(n, "step") == 0)
        return *al = 1.0, *be = 0.0, *v = 0.0, 1;
    return 0;
}

/* E[φ1(u)] or E[φ1(u)φ2(w)] for φ ∈ {erf, erf_sigmoid, step} with any means, exactly: products of
 * P(ξ < ·) are normal probabilities of dimension ≤ 2 (kernels/mvn.c, error 1e-15) — the 2-D
 * Gauss–Hermite rule loses digits here (1e-4 at variance 4: erf(x) is steep on the rule's
 * scale), and the GRU's r-gates and erf(h̃) with biases of non-zero mean are exactly these.
 * Returns 1 when it took the pair (status in *st). */
static int smooth_expect(int ngf, const tpk_phi *p1, const tpk_phi *p2, double m1, double m2,
                         double q1, double q2, double k, tpk_estimate *e, int *st, tpk_ctx *ctx)
{
    double a1, b1, v1, a2 = 0.0, b2 = 1.0, v2 = 0.0;
    if (!smooth_affine(p1, &a1, &b1, &v1) || (ngf == 2 && !smooth_affine(p2, &a2, &b2, &v2)))
        return 0;
    tpk_estimate A1, A2 = {0.0, 0.0}, B = {0.0, 0.0};
    double s1 = q1 + v1, S[4] = {q1 + v1, k, k, q2 + v2}, mu[2] = {m1, m2};
    *st = tpk_mvn_cdf(1, &m1, &s1, 0.0, &A1, ctx);
    if (!*st && ngf == 2) {
        double s2 = q2 + v2;
        *st = tpk_mvn_cdf(1, &m2, &s2, 0.0, &A2, ctx);
        if (!*st)
            *st = tpk_mvn_cdf(2, mu, S, 0.0, &B, ctx);
    }
    if (*st == TPK_EUNSUPPORTED) /* cannot happen for m ≤ 2; keep the general rules then */
        return 0;
    e->value = a1 * a2 * B.value + a1 * b2 * A1.value + b1 * a2 * A2.value + b1 * b2;
    e->err = fabs(a1 * a2) * B.err + fabs(a1 * b2) * A1.err + fabs(b1 * a2) * A2.err;
    return 1;
}

/* Orthant back-end (netsor/limit_orthant.c): a group whose factors are all smoothed steps
 * σ_v(a·g + b) = P(ξ < a·g + b) (erf-sigmoid gates, steps) is P(w > 0) with
 * w_q = a_q Z^{g_q} + b_q − ξ_q, the ξ_q ~ N(0, v_q) independent — a repeated factor gets its own
 * ξ (theory §2.3). Returns 1 when it took the group (status in *st). */
static int orthant_group(const lim *L, pws *w, const fac *fs, const int *nodeoff, const int *gf,
                         int ngf, int D, uint64_t site, tpk_estimate *e, int *st)
{
    int k[TPK_ORTHANT_MAXDIM];
    double a[TPK_ORTHANT_MAXDIM], b[TPK_ORTHANT_MAXDIM], v[TPK_ORTHANT_MAXDIM];
    double mu[TPK_ORTHANT_MAXDIM], S[TPK_ORTHANT_MAXDIM * TPK_ORTHANT_MAXDIM];
    if (ngf > TPK_ORTHANT_MAXDIM)
        return 0;
    for (int q = 0; q < ngf; q++) {
        const fac *f = &fs[gf[q]];
        int leaf;
        if (!tpk_nsr_orthant_factor(f->node, f->len, &leaf, &a[q], &b[q], &v[q]))
            return 0;
        k[q] = w->nodedim[nodeoff[gf[q]] + leaf];
    }
    for (int i = 0; i < ngf; i++) {
        mu[i] = a[i] * w->m[k[i]] + b[i];
        for (int j = 0; j < ngf; j++)
            S[i * ngf + j] = a[i] * a[j] * w->C[k[i] * D + k[j]] + (i == j ? v[i] : 0.0);
    }
    tpk_orthant_opts oo = {.abs_tol = L->o.orthant_abs_tol, .rel_tol = L->o.orthant_rel_tol,
                           .max_points = L->o.orthant_max_points};
    (void)site; /* shifts are keyed by the problem, so a memo hit equals a recomputation */
    *st = tpk_nsr_orthant_cached(L->ocache, ngf, mu, S, L->o.mc_seed, &oo, e, &w->ctx);
    return 1;
}

/* E[Π_{q<nf} fs[q]] under the limit Gaussian. */
static int prod_expect(const lim *L, pws *w, const fac *fs, int nf, uint64_t site,
                       tpk_estimate *out)
{
    int D = 0, off = 0;
    int nodeoff[2 * MAXF + 2];
    for (int q = 0; q < nf; q++) {
        nodeoff[q] = off;
        for (int i = 0; i < fs[q].len; i++, off++) {
            const tpk_rpn_node *nd = &fs[q].node[i];
            w->nodedim[off] = -1;
            if (nd->op == TPK_RPN_GVAR) {
                int k;
                for (k = 0; k < D; k++)
                    if (w->dg[k] == nd->var && w->da[k] == fs[q].input)
                        break;
                if (k == D) {
                    w->dg[D] = nd->var;
                    w->da[D] = fs[q].input;
                    D++;
                }
                w->nodedim[off] = k;
            } else if (nd->op == TPK_RPN_SCALAR) {
                w->sv[off] = L->scal[nd->var][fs[q].input];
            }
        }
    }
    for (int i = 0; i < D; i++) {
        w->m[i] = L->rep[w->dg[i]].mean;
        for (int j = 0; j <= i; j++)
            w->C[i * D + j] = w->C[j * D + i] = cov_dim(L, w->dg[i], w->da[i], w->dg[j], w->da[j]);
        w->parent[i] = i;
    }
    /* independence groups: zero covariance ⇒ independent (jointly Gaussian) */
    int fgroup[2 * MAXF + 2];
    if (L->o.no_factor) {
        for (int i = 1; i < D; i++)
            w->parent[uf_find(w->parent, i)] = uf_find(w->parent, 0);
    } else {
        for (int i = 0; i < D; i++)
            for (int j = 0; j < i; j++)
                if (w->C[i * D + j] != 0.0)
                    w->parent[uf_find(w->parent, i)] = uf_find(w->parent, j);
    }
    for (int q = 0; q < nf; q++) {
        int first = -1;
        for (int i = 0; i < fs[q].len; i++) {
            int k = w->nodedim[nodeoff[q] + i];
            if (k < 0)
                continue;
            if (first < 0)
                first = uf_find(w->parent, k);
            else
                w->parent[uf_find(w->parent, k)] = uf_find(w->parent, first);
        }
    }
    for (int q = 0; q < nf; q++) {
        fgroup[q] = -1;
        for (int i = 0; i < fs[q].len; i++)
            if (w->nodedim[nodeoff[q] + i] >= 0) {
                fgroup[q] = uf_find(w->parent, w->nodedim[nodeoff[q] + i]);
                break;
            }
    }
    double val = 1.0, err = 0.0;
    /* constant factors (no G-var leaves) */
    for (int q = 0; q < nf; q++)
        if (fgroup[q] < 0) {
            double v;
            tpk_nsr_rpn_eval(fs[q].node, fs[q].len, w->gv + nodeoff[q], w->sv + nodeoff[q], 1,
                             w->stack, &v);
            err *= fabs(v);
            val *= v;
        }
    for (int root = 0; root < D; root++) {
        if (uf_find(w->parent, root) != root)
            continue;
        int ngf = 0, nd = 0;
        int gf[2 * MAXF + 2];
        for (int q = 0; q < nf; q++)
            if (fgroup[q] == root)
                gf[ngf++] = q;
        if (ngf == 0)
            continue;
        for (int i = 0; i < D; i++)
            if (uf_find(w->parent, i) == root) {
                w->loc[i] = nd;
                w->gdims[nd++] = i;
            }
        tpk_estimate e = {0.0, 0.0};
        int done = 0;
        if (!L->o.no_factor) {
            const fac *f1 = &fs[gf[0]], *f2 = ngf > 1 ? &fs[gf[1]] : NULL;
            int k1 = w->nodedim[nodeoff[gf[0]]], k2 = ngf > 1 ? w->nodedim[nodeoff[gf[1]]] : -1;
            if (ngf == 1 && is_gvar_factor(f1->node, f1->len)) {
                e.value = w->m[k1];
                done = 1;
            } else if (ngf == 2 && is_gvar_factor(f1->node, f1->len) &&
                       is_gvar_factor(f2->node, f2->len)) {
                e.value = w->C[k1 * D + k2] + w->m[k1] * w->m[k2];
                done = 1;
            } else if (ngf <= 2) {
                int g1, g2;
                double a1, b1, a2 = 0.0, b2 = 0.0;
                const tpk_phi *p1, *p2 = NULL;
                if (affine_call(L, w, f1, &g1, &a1, &b1, &p1) &&
                    (ngf == 1 || affine_call(L, w, f2, &g2, &a2, &b2, &p2))) {
                    /* dims of the single G-var leaf of each factor */
                    for (int i = 0; i < f1->len; i++)
                        if (f1->node[i].op == TPK_RPN_GVAR)
                            k1 = w->nodedim[nodeoff[gf[0]] + i];
                    int st = TPK_OK;
                    double m1 = a1 * w->m[k1] + b1, q1 = a1 * a1 * w->C[k1 * D + k1];
                    double m2s = 0.0, q2s = 0.0, kks = 0.0;
                    if (ngf == 2) {
                        for (int i = 0; i < f2->len; i++)
                            if (f2->node[i].op == TPK_RPN_GVAR)
                                k2 = w->nodedim[nodeoff[gf[1]] + i];
                        m2s = a2 * w->m[k2] + b2;
                        q2s = a2 * a2 * w->C[k2 * D + k2];
                        kks = a1 * a2 * w->C[k1 * D + k2];
                    }
                    if (smooth_expect(ngf, p1, p2, m1, m2s, q1, q2s, kks, &e, &st, &w->ctx)) {
                        if (st)
                            return st;
                    } else if (ngf == 1) {
                        st = tpk_gauss_expect1(p1, m1, q1, L->gws, &e, &w->ctx);
                    } else {
                        for (int i = 0; i < f2->len; i++)
                            if (f2->node[i].op == TPK_RPN_GVAR)
                                k2 = w->nodedim[nodeoff[gf[1]] + i];
                        double m2 = a2 * w->m[k2] + b2, q2 = a2 * a2 * w->C[k2 * D + k2];
                        double kk = a1 * a2 * w->C[k1 * D + k2];
                        if (m1 == 0.0 && m2 == 0.0 && same_phi(p1, p2) && tpk_phi_has_closed_form(p1))
                            st = tpk_gauss_expect2(p1, q1, q2, kk, L->gws, &e, &w->ctx);
                        else
                            st = tpk_gauss_expect2_quad(p1, p2, m1, m2, q1, q2, kk, L->gws, &e,
                                                        &w->ctx);
                    }
                    if (st)
                        return st;
                    done = 1;
                }
            }
        }
        if (!done && !L->o.no_factor && ngf >= 2) {
            int ost = TPK_OK;
            done = orthant_group(L, w, fs, nodeoff, gf, ngf, D, site ^ ((uint64_t)root << 40), &e,
                                 &ost);
            if (ost)
                return ost;
        }
        if (!done && w->jn_on && w->jn_nf < 0 && nd > (L->o.max_gh_dim ? L->o.max_gh_dim : 4)) {
            for (int q = 0; q < ngf; q++)
                w->jn_f[q] = fs[gf[q]];
            w->jn_nf = ngf;
            done = 1; /* e = 1: the product is the group's weight (m2_joint) */
            e.value = 1.0;
        }
        if (!done) {
            /* eigen-decomposition of the group covariance, clipped at 0 (§1.6) */
            for (int i = 0; i < nd; i++)
                for (int j = 0; j < nd; j++)
                    w->V[i * nd + j] = w->C[w->gdims[i] * D + w->gdims[j]];
            if (nd == 1) {
                w->lam[0] = w->V[0];
                w->V[0] = 1.0;
            } else if (LAPACKE_dsyev(LAPACK_ROW_MAJOR, 'V', 'U', nd, w->V, nd, w->lam) != 0) {
                return TPK_ERROR(&w->ctx, TPK_ENUMERIC, "eigen-decomposition of a %d×%d covariance failed", nd, nd);
            }
            double lmax = 0.0;
            for (int j = 0; j < nd; j++)
                if (w->lam[j] > lmax)
                    lmax = w->lam[j];
            int r = 0;
            for (int j = 0; j < nd; j++)
                if (w->lam[j] > RANK_TOL * lmax && w->lam[j] > 0.0) {
                    double s = sqrt(w->lam[j]);
                    for (int k = 0; k < nd; k++)
                        w->sub[k * nd + r] = w->V[k * nd + j] * s;
                    r++;
                }
            for (int k = 0; k < nd; k++)
                for (int j = 0; j < r; j++)
                    w->scaled[k * r + j] = w->sub[k * nd + j];
            if (r == 0) {
                for (int k = 0; k < nd; k++)
                    w->z[(size_t)k * BLK] = w->m[w->gdims[k]];
                eval_group_block(L, w, fs, nodeoff, gf, ngf, 1, w->prod);
                e.value = w->prod[0];
            } else {
                group_numeric(L, w, fs, nodeoff, gf, ngf, nd, r, site ^ ((uint64_t)root << 40), &e);
            }
        }
        /* the groups are independent estimates: first-order propagation, root-sum-square */
        err = hypot(err * fabs(e.value), e.err * fabs(val));
        val *= e.value;
    }
    out->value = val;
    out->err = err;
    return TPK_OK;
}

/* ---- E[Z^u_a Z^v_c] for all input pairs ------------------------------------------------ */

/* Half-products of one affine left factor u, kept while one MatMul instruction pairs u with every
 * earlier source v of its family: Q_h[a][c] = Σ_g l^u_g(a) Cov(Z^g_a, Z^h_c) for each G-var h met
 * so far. With them E[Z^u Z^v] costs |args(v)| N² instead of |args(u)|·|args(v)| N² — for a
 * transformer layer (u, v attention outputs over T keys) O(T³ N²) per layer instead of O(T⁴ N²). */
#define AFFQ_MAX_BYTES ((size_t)256 << 20) /* beyond this, pairs are summed directly */
typedef struct affq {
    int on;       /* set by do_matmul for the span of one instruction */
    int u;        /* owner of the half-products, -1 none */
    int n, cap;
    int *h;
    double **Q;
    size_t bytes;
} affq;

static void affq_clear(affq *q)
{
    for (int i = 0; i < q->n; i++)
        free(q->Q[i]);
    q->n = 0;
    q->u = -1;
    q->bytes = 0;
}

static void affq_free(affq *q)
{
    affq_clear(q);
    free(q->h);
    free(q->Q);
    q->h = NULL;
    q->Q = NULL;
    q->cap = 0;
}

typedef struct scratch {
    double *s1, *s2, *s3, *qa, *qb;
    affq aq;
} scratch;

/* ---- affine and quadratic bodies (netsor/limit_poly.c) --------------------------------- */

/* A Nonlin whose body is, input by input, affine in its G-vars (the scalars being fixed numbers
 * in the limit, theory §1.9) is itself a Gaussian: layernorm of a residual sum, attention's
 * Σ_j a_ij k_j (§2.6–2.7). L->aff[v] gets its N means, then N coefficients per argument. */
static int aff_build(lim *L, int k)
{
    const tpk_instr *in = &L->p->instr[k];
    const tpk_rpn *b = &in->body;
    if (L->o.no_factor || b->nargs == 0 || tpk_nsr_poly_degree(b) != 1)
        return TPK_OK;
    size_t N = L->N, na = (size_t)b->nargs;
    tpk_nsr_poly_ws *ws = tpk_nsr_poly_ws_alloc(b);
    double *A = malloc(N * (na + 1) * sizeof *A), *lin = malloc(na * sizeof *lin);
    int ok = ws && A && lin;
    for (size_t a = 0; a < N && ok; a++) {
        double c0;
        ok = tpk_nsr_poly_eval(b, L->scal, a, 1, ws, &c0, lin, NULL) >= 0;
        for (size_t g = 0; g < na && ok; g++) {
            c0 += lin[g] * L->rep[b->args[g]].mean;
            A[(1 + g) * N + a] = lin[g];
        }
        if (ok)
            A[a] = c0;
    }
    int oom = !ws || !A || !lin;
    tpk_nsr_poly_ws_free(ws);
    free(lin);
    if (!ok) {
        free(A);
        return oom ? TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory") : TPK_OK;
    }
    L->aff[in->out] = A;
    return TPK_OK;
}

/* Do some atoms of G-vars g and h share a family (else Cov(Z^g, Z^h) = 0)? */
static int share_family(const lim *L, int g, int h)
{
    const grep *r = &L->rep[g], *s = &L->rep[h];
    for (int i = 0; i < r->n; i++)
        for (int j = 0; j < s->n; j++)
            if (L->atom[r->atom[i]].fam == L->atom[s->atom[j]].fam)
                return 1;
    return 0;
}

/* Q_h of the cache (computed on first use; C is N×N scratch), or NULL when the cache is off or
 * full — the caller then sums the pairs directly — or out of memory (L->ctx set). */
static const double *half_product(lim *L, affq *q, int u, const int *argu, int nu,
                                  const double *coefu, int h, double *C)
{
    size_t N = L->N, nn = N * N;
    if (!q->on)
        return NULL;
    for (int i = 0; i < q->n; i++)
        if (q->h[i] == h)
            return q->Q[i];
    if (q->bytes + nn * sizeof(double) > AFFQ_MAX_BYTES)
        return NULL;
    if (q->n == q->cap) {
        int cap = q->cap ? 2 * q->cap : 16;
        int *nh = realloc(q->h, (size_t)cap * sizeof *nh);
        if (nh)
            q->h = nh;
        double **nq = nh ? realloc(q->Q, (size_t)cap * sizeof *nq) : NULL;
        if (!nq) {
            TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
            return NULL;
        }
        q->Q = nq;
        q->cap = cap;
    }
    double *Q = calloc(nn, sizeof *Q);
    if (!Q) {
        TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
        return NULL;
    }
    for (int gi = 0; gi < nu; gi++) {
        int g = argu[gi];
        if (!share_family(L, g, h))
            continue;
        cov_mat(L, g, h, 0, C);
        const double *cu = coefu ? coefu + (size_t)gi * N : NULL;
        for (size_t a = 0; a < N; a++) {
            double w = cu ? cu[a] : 1.0;
            if (w == 0.0)
                continue;
            double *o = Q + a * N;
            const double *Ca = C + a * N;
            for (size_t c = 0; c < N; c++)
                o[c] += w * Ca[c];
        }
    }
    q->u = u;
    q->h[q->n] = h;
    q->Q[q->n++] = Q;
    q->bytes += nn * sizeof(double);
    return Q;
}

/* E[Z^u_a Z^v_c] = Σ_{g,h} l^u_g(a) l^v_h(c) Cov(Z^g_a, Z^h_c) + m^u(a) m^v(c), exact, when u and v
 * are G-vars or affine H-vars and not both G-vars. Returns 1 if it took the pair (status in st). */
static int aff_m2(lim *L, int u, int v, scratch *sc, double *out, size_t ld, double scale,
                  double *errp, int *st)
{
    size_t N = L->N;
    const int *args[2];
    int na[2], x[2] = {u, v};
    const double *mean[2], *coef[2];
    double *ones = NULL;
    for (int s = 0; s < 2; s++) {
        if (L->p->var[x[s]].type == TPK_VAR_G) {
            args[s] = &x[s];
            na[s] = 1;
            mean[s] = coef[s] = NULL;
        } else if (L->def[x[s]] >= 0 && L->aff[x[s]] != NULL) {
            const tpk_rpn *b = &L->p->instr[L->def[x[s]]].body;
            args[s] = b->args;
            na[s] = b->nargs;
            mean[s] = L->aff[x[s]];
            coef[s] = L->aff[x[s]] + N;
        } else {
            return 0;
        }
    }
    if (mean[0] == NULL && mean[1] == NULL)
        return 0; /* two G-vars: the linear rule of m2 */
    *st = TPK_OK;
    if ((sc->s1 == NULL && (sc->s1 = malloc(N * N * sizeof *sc->s1)) == NULL) ||
        (sc->s2 == NULL && (sc->s2 = malloc(N * N * sizeof *sc->s2)) == NULL) ||
        (ones = malloc(N * sizeof *ones)) == NULL) {
        *st = TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
        return 1;
    }
    for (size_t a = 0; a < N; a++)
        ones[a] = 1.0;
    double *acc = sc->s2, *C = sc->s1;
    for (size_t a = 0; a < N; a++) {
        double mu = mean[0] ? mean[0][a] : L->rep[u].mean;
        for (size_t c = 0; c < N; c++)
            acc[a * N + c] = mu * (mean[1] ? mean[1][c] : L->rep[v].mean);
    }
    affq *q = &sc->aq;
    if (q->on && q->u != u)
        affq_clear(q);
    for (int hj = 0; hj < na[1]; hj++) {
        int h = args[1][hj];
        const double *cv = coef[1] ? coef[1] + (size_t)hj * N : ones;
        const double *Q = half_product(L, q, u, args[0], na[0], coef[0], h, C);
        if (Q != NULL) { /* E += l^v_h(c) Q_h[a][c] */
            for (size_t a = 0; a < N; a++) {
                double *o = acc + a * N;
                const double *Qa = Q + a * N;
                for (size_t c = 0; c < N; c++)
                    o[c] += cv[c] * Qa[c];
            }
            continue;
        }
        if (L->ctx->status) {
            *st = L->ctx->status;
            free(ones);
            return 1;
        }
        for (int gi = 0; gi < na[0]; gi++) {
            int g = args[0][gi];
            if (!share_family(L, g, h))
                continue;
            cov_mat(L, g, h, 0, C);
            const double *cu = coef[0] ? coef[0] + (size_t)gi * N : ones;
            for (size_t a = 0; a < N; a++) {
                if (cu[a] == 0.0)
                    continue;
                double *o = acc + a * N;
                const double *Ca = C + a * N;
                for (size_t c = 0; c < N; c++)
                    o[c] += cu[a] * cv[c] * Ca[c];
            }
        }
    }
    put_rows(N, acc, scale, out, ld);
    *errp = 0.0;
    free(ones);
    return 1;
}

/* A Moment whose body is a polynomial of degree ≤ 2 in its G-vars (for fixed scalars):
 * E = c0 + Σ l_g μ_g + Σ Q_gh (C_gh + μ_g μ_h), exactly — mean(r), mean((r − m)²), logits
 * mean(k_i k_j), and Moments of scalars alone. *took = 0 leaves it to the general rules. */
static int moment_poly(lim *L, int k, int *took)
{
    const tpk_instr *in = &L->p->instr[k];
    const tpk_rpn *b = &in->body;
    *took = 0;
    int deg = L->o.no_factor ? -1 : tpk_nsr_poly_degree(b);
    if (deg < 0 || deg > 2)
        return TPK_OK;
    size_t N = L->N, na = (size_t)(b->nargs > 0 ? b->nargs : 1);
    tpk_nsr_poly_ws *ws = tpk_nsr_poly_ws_alloc(b);
    double *s = malloc(N * sizeof *s), *lin = malloc(na * sizeof *lin);
    double *quad = deg == 2 ? malloc(na * na * sizeof *quad) : NULL;
    int ok = ws && s && lin && (deg < 2 || quad), oom = !ok;
    for (size_t a = 0; a < N && ok; a++) {
        double c0;
        int dg = tpk_nsr_poly_eval(b, L->scal, a, 2, ws, &c0, lin, quad);
        ok = dg >= 0;
        double val = c0;
        for (int g = 0; ok && dg >= 1 && g < b->nargs; g++)
            val += lin[g] * L->rep[b->args[g]].mean;
        for (int g = 0; ok && dg == 2 && g < b->nargs; g++)
            for (int h = 0; h < b->nargs; h++) {
                double q = quad[(size_t)g * na + (size_t)h];
                if (q != 0.0)
                    val += q * (cov_dim(L, b->args[g], a, b->args[h], a) +
                                L->rep[b->args[g]].mean * L->rep[b->args[h]].mean);
            }
        s[a] = val;
    }
    tpk_nsr_poly_ws_free(ws);
    free(lin);
    free(quad);
    if (!ok) {
        free(s);
        return oom ? TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory") : TPK_OK;
    }
    L->scal[in->out] = s;
    *took = 1;
    return TPK_OK;
}

static void note_err(lim *L, double e)
{
    if (e > L->err || isnan(e))
        L->err = e;
}

static int gh_init(lim *L);

/* The evaluator as the joint sampler sees it (netsor/joint-impl.h). */
static double joint_cov(void *c, int g, size_t a, int h, size_t b)
{
    return cov_dim((const lim *)c, g, a, h, b);
}
static double joint_mean(void *c, int g) { return ((const lim *)c)->rep[g].mean; }
static double joint_scalar(void *c, int v, size_t a) { return ((const lim *)c)->scal[v][a]; }
static int joint_alive(void *c, int g) { return ((const lim *)c)->rep[g].atom != NULL; }

/* The groups the items of m2_entries left in rec (rnf[it] factors; 0: none), integrated on the
 * shared sample of netsor/limit_joint.c (issue 19): item it's value iv[2it] — its weight, the
 * product of its other groups — times the group's expectation, the error to first order.
 * *joint = 0 when the sampler declines (its cache is full): nothing changed, the caller computes
 * those items alone. */
static int m2_joint(lim *L, size_t nitem, const fac *rec, const int *rnf, double *iv, int *joint)
{
    size_t ng = 0, nf = 0;
    for (size_t it = 0; it < nitem; it++)
        if (rnf[it]) {
            ng++;
            nf += (size_t)rnf[it];
        }
    if (ng == 0)
        return TPK_OK;
    size_t *off = malloc((ng + 1) * sizeof *off), *item = malloc(ng * sizeof *item);
    tpk_nsr_jfac *f = malloc(nf * sizeof *f);
    tpk_estimate *e = malloc(ng * sizeof *e);
    int st = off && item && f && e ? TPK_OK : TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
    for (size_t it = 0, g = 0, q = 0; st == TPK_OK && it < nitem; it++) {
        if (!rnf[it])
            continue;
        off[g] = q;
        item[g++] = it;
        for (int k = 0; k < rnf[it]; k++, q++) {
            const fac *x = &rec[it * 2 * MAXF + (size_t)k];
            f[q] = (tpk_nsr_jfac){x->node, x->len, x->input};
        }
        off[g] = q;
    }
    tpk_nsr_joint_env env = {L, joint_cov, joint_mean, joint_scalar, joint_alive};
    if (st == TPK_OK)
        st = tpk_nsr_joint_expect(L->joint, &env, (int)ng, off, f, e, L->ctx);
    if (st == TPK_EUNSUPPORTED) {
        *joint = 0;
        st = TPK_OK;
    } else if (st == TPK_OK) {
        for (size_t g = 0; g < ng; g++) {
            double *v = iv + 2 * item[g];
            v[1] = hypot(v[1] * e[g].value, v[0] * e[g].err);
            v[0] *= e[g].value;
        }
    }
    free(off);
    free(item);
    free(f);
    free(e);
    return st;
}

/* Per-entry generic expectations for the term pairs gen[]; results added into out. The work
 * is one batch of (entry, term pair) items over OpenMP (dynamic: an item's cost ranges from a
 * closed form to a QMC orthant probability), so a few entries with many terms still use every
 * thread; the orthant memo computes each distinct problem once. An entry's error is the
 * root-sum-square of its terms' (independent) errors (issue 19). */
static int m2_entries(lim *L, int u, int v, const int (*gen)[2], int ngen, uint64_t site,
                      double *out, double *vals, double *errmax)
{
    tpk_error_gsl_init(); /* GSL failures as return codes, never abort() (tpk/error.h) */
    size_t N = L->N;
    const xbody *bu = &L->xb[u], *bv = &L->xb[v];
    int sym = u == v;
    int status = gh_init(L);
    double emax = 0.0;
    if (status)
        return status;
    size_t nent = sym ? N * (N + 1) / 2 : N * N, nitem = nent * (size_t)ngen;
    double *iv = malloc(2 * (nitem ? nitem : 1) * sizeof *iv);
    if (iv == NULL)
        return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
    /* with the joint sampler, an item's group of more dims than max_gh_dim is left in
     * rec[it] (its factors, rnf[it] of them; 0: none) and integrated by m2_joint with the others */
    fac *rec = L->joint ? malloc((nitem ? nitem : 1) * 2 * MAXF * sizeof *rec) : NULL;
    int *rnf = L->joint ? malloc((nitem ? nitem : 1) * sizeof *rnf) : NULL;
    int joint = rec != NULL && rnf != NULL, retry = 0;
again:
#pragma omp parallel
    {
        pws *w = pws_alloc(L);
        int my_st = w == NULL ? TPK_ENOMEM : TPK_OK;
#pragma omp for schedule(dynamic, 1)
        for (size_t it = 0; it < nitem; it++) {
            if (my_st != TPK_OK)
                continue;
            size_t ent = it / (size_t)ngen, a, c;
            int g = (int)(it % (size_t)ngen);
            if (sym) { /* ent = a(a+1)/2 + c, c ≤ a */
                a = (size_t)((sqrt(8.0 * (double)ent + 1.0) - 1.0) / 2.0);
                while (a * (a + 1) / 2 > ent)
                    a--;
                while ((a + 1) * (a + 2) / 2 <= ent)
                    a++;
                c = ent - a * (a + 1) / 2;
            } else {
                a = ent / N;
                c = ent % N;
            }
            const xterm *ts = &bu->t[gen[g][0]], *tt = &bv->t[gen[g][1]];
            fac fs[2 * MAXF];
            int nf = 0;
            for (int q = 0; q < ts->nf; q++)
                fs[nf++] = (fac){bu->node + ts->fs[q], ts->fe[q] - ts->fs[q], a};
            for (int q = 0; q < tt->nf; q++)
                fs[nf++] = (fac){bv->node + tt->fs[q], tt->fe[q] - tt->fs[q], c};
            tpk_estimate e = {0.0, 0.0};
            if (retry && rnf[it] == 0)
                continue; /* done in the first pass */
            w->jn_on = joint;
            w->jn_nf = -1;
            my_st = prod_expect(L, w, fs, nf,
                                site * (MAXT * MAXT) + (uint64_t)(gen[g][0] * MAXT + gen[g][1]), &e);
            w->jn_on = 0;
            if (joint) {
                rnf[it] = w->jn_nf > 0 ? w->jn_nf : 0;
                if (rnf[it])
                    memcpy(rec + it * 2 * MAXF, w->jn_f, (size_t)rnf[it] * sizeof *rec);
            }
            double cc = ts->coef * tt->coef;
            iv[2 * it] = cc * e.value;
            iv[2 * it + 1] = cc * e.err;
        }
#pragma omp critical(tpk_limit_err)
        {
            if (my_st != TPK_OK && status == TPK_OK) {
                status = my_st;
                if (w != NULL && w->ctx.status != TPK_OK)
                    TPK_ERROR(L->ctx, w->ctx.status, "%s", w->ctx.msg);
                else
                    TPK_ERROR(L->ctx, my_st, "expectation failed (out of memory?)");
            }
        }
        pws_free(w);
    }
    if (status == TPK_OK && joint) {
        status = m2_joint(L, nitem, rec, rnf, iv, &joint);
        if (status == TPK_OK && !joint) { /* the sampler's cache is full: these items alone */
            retry = 1;
            goto again;
        }
    }
    free(rec);
    free(rnf);
    if (status != TPK_OK) {
        free(iv);
        return status;
    }
    size_t ent = 0;
    for (size_t a = 0; a < N; a++) {
        size_t cend = sym ? a + 1 : N;
        for (size_t c = 0; c < cend; c++, ent++) {
            double sum = 0.0, e2 = 0.0;
            for (int g = 0; g < ngen; g++) {
                sum += iv[2 * (ent * (size_t)ngen + (size_t)g)];
                double e = iv[2 * (ent * (size_t)ngen + (size_t)g) + 1];
                e2 += e * e;
            }
            vals[a * N + c] = sum;
            double esum = sqrt(e2);
            if (esum > emax || isnan(esum))
                emax = esum;
            out[a * N + c] += sum;
            if (sym && c != a)
                out[c * N + a] += sum;
        }
    }
    free(iv);
    *errmax = emax;
    return TPK_OK;
}

/* out[a·ld + c] = scale · E[Z^u_a Z^v_c] for all input pairs; error estimate (max over entries,
 * scaled) into *errp. A single closed-form term pair goes straight from tpk_gauss_map_affine
 * into out, which is what keeps a plain MLP as fast as the direct recursion. */
/* E[Z^u_a Z^v_c] when u, v are batch-coupled Nonlins φ(bn(g)): the Laplace reduction of
 * kernels/batchnorm.c over the covariances of their G-vars (theory §2.5). */
static int bn_m2(lim *L, int u, int v, double *out, size_t ld, double scale, double *errp)
{
    const tpk_instr *iu = &L->p->instr[L->def[u]], *iv = &L->p->instr[L->def[v]];
    const tpk_phi *fu = iu->body.len == 2 ? iu->body.node[1].fn : NULL;
    const tpk_phi *fv = iv->body.len == 2 ? iv->body.node[1].fn : NULL;
    if (!iu->bnorm || !iv->bnorm || iu->batch != iv->batch || !fu != !fv || (fu && !same_phi(fu, fv)))
        return TPK_ERROR(L->ctx, TPK_EINVAL,
                         "%d:%d: limit of E[%s·%s] not implemented: both must be phi(bn(g)) with one "
                         "phi and one batch size", iu->line, iu->col, L->p->var[u].name,
                         L->p->var[v].name);
    size_t N = L->N;
    int g = iu->body.node[0].var, h = iv->body.node[0].var;
    double *S = malloc((g == h ? 1 : 3) * N * N * sizeof *S);
    if (S == NULL)
        return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
    cov_mat(L, g, g, 0, S);
    if (g != h) {
        cov_mat(L, g, h, 0, S + N * N);
        cov_mat(L, h, h, 0, S + 2 * N * N);
    }
    int st = tpk_bn_kernel(fu, N, (size_t)iu->batch, S, g == h ? NULL : S + N * N,
                           g == h ? NULL : S + 2 * N * N, out, ld, scale, errp, L->ctx);
    free(S);
    return st;
}

static const m2memo *m2_memo_find(const lim *L, int u, int v, int *transposed)
{
    for (int i = 0; i < L->nmm; i++) {
        if (L->mm[i].u == u && L->mm[i].v == v) {
            *transposed = 0;
            return &L->mm[i];
        }
        if (L->mm[i].u == v && L->mm[i].v == u) {
            *transposed = 1;
            return &L->mm[i];
        }
    }
    return NULL;
}

/* Keep a copy of E (N×N); out of memory only skips the memo. */
static void m2_memo_put(lim *L, int u, int v, const double *E, double err)
{
    size_t nn = L->N * L->N;
    if (L->nmm == L->capmm) {
        int cap = L->capmm ? 2 * L->capmm : 16;
        m2memo *n = realloc(L->mm, (size_t)cap * sizeof *n);
        if (n == NULL)
            return;
        L->mm = n;
        L->capmm = cap;
    }
    double *c = malloc(nn * sizeof *c);
    if (c == NULL)
        return;
    memcpy(c, E, nn * sizeof *c);
    L->mm[L->nmm++] = (m2memo){u, v, c, err};
}

/* Drop the entries that read variable x (it is being freed). */
static void m2_memo_drop(lim *L, int x)
{
    int j = 0;
    for (int i = 0; i < L->nmm; i++) {
        if (L->mm[i].u == x || L->mm[i].v == x)
            free(L->mm[i].E);
        else
            L->mm[j++] = L->mm[i];
    }
    L->nmm = j;
}

static int m2(lim *L, int u, int v, uint64_t site, scratch *sc, double *out, size_t ld, int lower_ok,
              double scale, double *errp)
{
    size_t N = L->N;
    if ((L->def[u] >= 0 && L->p->instr[L->def[u]].bnorm) ||
        (L->def[v] >= 0 && L->p->instr[L->def[v]].bnorm))
        return bn_m2(L, u, v, out, ld, scale, errp);
    int ast = TPK_OK;
    if (aff_m2(L, u, v, sc, out, ld, scale, errp, &ast))
        return ast;
    int tr;
    const m2memo *hit = m2_memo_find(L, u, v, &tr);
    if (hit != NULL) {
        size_t N2 = L->N;
        for (size_t a = 0; a < N2; a++)
            for (size_t c = 0; c < N2; c++)
                out[a * ld + c] = scale * (tr ? hit->E[c * N2 + a] : hit->E[a * N2 + c]);
        *errp = fabs(scale) * hit->err;
        return TPK_OK;
    }
    const xbody *bu = &L->xb[u], *bv = &L->xb[v];
    int gen[MAXT * MAXT][2], ngen = 0, nlin = 0;
    int fast[MAXT * MAXT][2], nfast = 0;
    double err = 0.0;
    for (int s = 0; s < bu->nterms; s++)
        for (int t = 0; t < bv->nterms; t++) {
            const xterm *ts = &bu->t[s], *tt = &bv->t[t];
            int kind = 0; /* 0 generic, 1 linear, 2 map */
            if (ts->nf == 1 && tt->nf == 1 && !L->o.no_factor) {
                const tpk_rpn_node *na = bu->node + ts->fs[0], *nb = bv->node + tt->fs[0];
                int la = ts->fe[0] - ts->fs[0], lb = tt->fe[0] - tt->fs[0];
                if (is_gvar_factor(na, la) && is_gvar_factor(nb, lb))
                    kind = 1;
                else if (!L->o.no_fastpath && is_call_factor(na, la) && is_call_factor(nb, lb) &&
                         same_phi(na[1].fn, nb[1].fn) && L->rep[na[0].var].mean == 0.0 &&
                         L->rep[nb[0].var].mean == 0.0)
                    kind = 2; /* whole-matrix map: closed form, Mehler series or quadrature */
            }
            if (kind == 0) {
                gen[ngen][0] = s;
                gen[ngen][1] = t;
                ngen++;
            } else {
                fast[nfast][0] = s;
                fast[nfast][1] = t;
                nfast++;
                nlin += kind == 1;
            }
        }
    if ((nfast > 1 || ngen > 0 || nlin > 0 || ld != N || u != v) && sc->s1 == NULL &&
        (sc->s1 = malloc(N * N * sizeof *sc->s1)) == NULL)
        return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
    /* the common case: one pair φ(g)·φ(g) of the same zero-mean φ */
    if (nfast == 1 && ngen == 0 && nlin == 0) {
        if (!tpk_phi_has_closed_form(bu->node[bu->t[fast[0][0]].fs[0] + 1].fn) && gh_init(L))
            return L->ctx->status;
        const xterm *ts = &bu->t[fast[0][0]], *tt = &bv->t[fast[0][1]];
        const tpk_rpn_node *na = bu->node + ts->fs[0], *nb = bv->node + tt->fs[0];
        int g = na[0].var, h = nb[0].var, st;
        double cc = scale * ts->coef * tt->coef, e = 0.0;
        if (g == h) {
            /* in place when out is contiguous (out never aliases a block g reads: a family
             * with one atom is the one being written, and g cannot contain it yet) */
            double *dst = ld == N ? out : sc->s1;
            cov_mat(L, g, g, 1, dst);
            st = (lower_ok && dst == out ? tpk_gauss_map_affine_lower : tpk_gauss_map_affine)(
                na[1].fn, dst, N, cc, 0.0, dst, L->gws, &e, L->ctx);
            if (st == TPK_OK && dst != out)
                put_rows(N, sc->s1, 1.0, out, ld);
        } else {
            for (size_t a = 0; a < N; a++) {
                sc->qa[a] = cov_dim(L, g, a, g, a);
                sc->qb[a] = cov_dim(L, h, a, h, a);
            }
            cov_mat(L, g, h, 0, sc->s1);
            st = tpk_gauss_map_cross(na[1].fn, sc->qa, N, sc->qb, N, sc->s1, sc->s1, L->gws, &e,
                                     L->ctx);
            if (st == TPK_OK)
                put_rows(N, sc->s1, cc, out, ld);
            e *= fabs(cc);
        }
        *errp = e;
        return st;
    }
    if (gh_init(L))
        return L->ctx->status;
    if (sc->s2 == NULL && (sc->s2 = malloc(N * N * sizeof *sc->s2)) == NULL)
        return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
    if (ngen > 0 && sc->s3 == NULL && (sc->s3 = malloc(N * N * sizeof *sc->s3)) == NULL)
        return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
    double *acc = sc->s2;
    memset(acc, 0, N * N * sizeof *acc);
    for (int q = 0; q < nfast; q++) {
        const xterm *ts = &bu->t[fast[q][0]], *tt = &bv->t[fast[q][1]];
        const tpk_rpn_node *na = bu->node + ts->fs[0], *nb = bv->node + tt->fs[0];
        int g = na[0].var, h = nb[0].var, st = TPK_OK;
        double cc = ts->coef * tt->coef, e = 0.0, mm = 0.0;
        if (na[0].op == TPK_RPN_GVAR && na[0].var == g && ts->fe[0] - ts->fs[0] == 1) {
            /* linear pair: E[Z Z'] = Cov + μμ' exactly */
            mm = L->rep[g].mean * L->rep[h].mean;
            cov_mat(L, g, h, 0, sc->s1);
        } else if (g == h) {
            cov_mat(L, g, g, 1, sc->s1);
            st = tpk_gauss_map(na[1].fn, sc->s1, N, sc->s1, L->gws, &e, L->ctx);
        } else {
            for (size_t a = 0; a < N; a++) {
                sc->qa[a] = cov_dim(L, g, a, g, a);
                sc->qb[a] = cov_dim(L, h, a, h, a);
            }
            cov_mat(L, g, h, 0, sc->s1);
            st = tpk_gauss_map_cross(na[1].fn, sc->qa, N, sc->qb, N, sc->s1, sc->s1, L->gws, &e,
                                     L->ctx);
        }
        if (st)
            return st;
        for (size_t i = 0; i < N * N; i++)
            acc[i] += cc * (sc->s1[i] + mm);
        err = hypot(err, fabs(cc) * e);
    }
    if (ngen > 0) {
        double e = 0.0;
        int st = m2_entries(L, u, v, (const int(*)[2])gen, ngen, site, acc, sc->s3, &e);
        if (st)
            return st;
        err = hypot(err, e);
        m2_memo_put(L, u, v, acc, err);
    }
    put_rows(N, acc, scale, out, ld);
    *errp = fabs(scale) * err;
    return TPK_OK;
}

/* ---- program set-up: atoms, families, reps, liveness ------------------------------------ */

static int rep_merge(grep *r, const tpk_instr *in, const grep *rep)
{
    int cap = 0;
    for (int t = 0; t < in->nterms; t++)
        cap += rep[in->term[t]].n;
    r->atom = malloc((size_t)(cap ? cap : 1) * sizeof *r->atom);
    r->coef = malloc((size_t)(cap ? cap : 1) * sizeof *r->coef);
    if (r->atom == NULL || r->coef == NULL)
        return TPK_ENOMEM;
    r->n = 0;
    r->mean = 0.0;
    for (int t = 0; t < in->nterms; t++) {
        const grep *s = &rep[in->term[t]];
        r->mean += in->coef[t] * s->mean;
        for (int i = 0; i < s->n; i++) {
            int k;
            for (k = 0; k < r->n; k++)
                if (r->atom[k] == s->atom[i])
                    break;
            if (k == r->n) {
                r->atom[k] = s->atom[i];
                r->coef[k] = 0.0;
                r->n++;
            }
            r->coef[k] += in->coef[t] * s->coef[i];
        }
    }
    return TPK_OK;
}

static void touch(lim *L, int v, int k)
{
    const tpk_program *p = L->p;
    if (L->last[v] < k)
        L->last[v] = k;
    if (p->var[v].type == TPK_VAR_H && L->def[v] >= 0) {
        /* an H-var is read through its body's leaves */
        const tpk_rpn *b = &p->instr[L->def[v]].body;
        for (int j = 0; j < b->len; j++)
            if (b->node[j].op == TPK_RPN_GVAR || b->node[j].op == TPK_RPN_SCALAR)
                if (L->last[b->node[j].var] < k)
                    L->last[b->node[j].var] = k;
    }
}

static int setup(lim *L, int all_outputs)
{
    const tpk_program *p = L->p;
    int nv = p->nvars, ni = p->ninstr, nbias = 0;
    for (int k = 0; k < ni; k++) {
        int op = p->instr[k].op;
        if (op == TPK_OP_BIAS)
            nbias++;
        if (op == TPK_OP_BIAS || op == TPK_OP_EMBED || op == TPK_OP_MATMUL)
            L->natoms++;
    }
    L->nfam = p->navars + p->nembeds + nbias;
    L->atom = calloc((size_t)L->natoms + 1, sizeof *L->atom);
    L->fam = calloc((size_t)L->nfam + 1, sizeof *L->fam);
    L->fam_of_avar = calloc((size_t)p->navars + 1, sizeof(int));
    L->fam_of_embed = calloc((size_t)p->nembeds + 1, sizeof(int));
    L->atom_of_instr = calloc((size_t)ni + 1, sizeof(int));
    L->rep = calloc((size_t)nv, sizeof *L->rep);
    L->xb = calloc((size_t)nv, sizeof *L->xb);
    L->scal = calloc((size_t)nv, sizeof *L->scal);
    L->aff = calloc((size_t)nv, sizeof *L->aff);
    L->gnode = calloc((size_t)nv, sizeof *L->gnode);
    L->last = malloc((size_t)nv * sizeof *L->last);
    L->def = malloc((size_t)nv * sizeof *L->def);
    L->var_next = malloc(((size_t)nv + (size_t)L->nfam) * sizeof *L->var_next);
    L->free_var = malloc(((size_t)ni + 2) * sizeof *L->free_var);
    L->free_fam = malloc(((size_t)ni + 2) * sizeof *L->free_fam);
    if (!L->atom || !L->fam || !L->fam_of_avar || !L->fam_of_embed || !L->atom_of_instr ||
        !L->rep || !L->xb || !L->scal || !L->aff || !L->gnode || !L->last || !L->def || !L->var_next ||
        !L->free_var || !L->free_fam)
        return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory setting up the limit evaluator");
    int f = 0;
    for (int i = 0; i < p->navars; i++, f++) {
        L->fam_of_avar[i] = f;
        L->fam[f].kind = FAM_AVAR;
        L->fam[f].var = p->avar[i].var;
    }
    for (int i = 0; i < p->nembeds; i++, f++) {
        L->fam_of_embed[i] = f;
        L->fam[f].kind = FAM_EMBED;
    }
    for (int v = 0; v < nv; v++) {
        L->gnode[v].op = TPK_RPN_GVAR;
        L->gnode[v].var = v;
        L->last[v] = -1;
        L->def[v] = -1;
    }
    /* atoms and reps, symbolically, in program order */
    int na = 0;
    int *deff = L->def;
    for (int k = 0; k < ni; k++) {
        const tpk_instr *in = &p->instr[k];
        deff[in->out] = k;
        L->atom_of_instr[k] = -1;
        if (in->op == TPK_OP_LINCOMB) {
            if (rep_merge(&L->rep[in->out], in, L->rep))
                return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
            continue;
        }
        if (in->op != TPK_OP_BIAS && in->op != TPK_OP_EMBED && in->op != TPK_OP_MATMUL)
            continue;
        atom *a = &L->atom[na];
        if (in->op == TPK_OP_BIAS) {
            a->fam = f;
            L->fam[f].kind = FAM_BIAS;
            L->fam[f].var = in->var;
            a->mean = in->mean;
            f++;
        } else if (in->op == TPK_OP_EMBED) {
            a->fam = L->fam_of_embed[in->avar];
            a->src = in->src;
            a->scale = sqrt(in->var);
        } else {
            a->fam = L->fam_of_avar[in->avar];
            a->src = in->src;
        }
        a->loc = L->fam[a->fam].cap++;
        L->fam[a->fam].last = k;
        L->atom_of_instr[k] = na;
        grep *r = &L->rep[in->out];
        r->atom = malloc(sizeof *r->atom);
        r->coef = malloc(sizeof *r->coef);
        if (r->atom == NULL || r->coef == NULL)
            return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
        r->n = 1;
        r->atom[0] = na;
        r->coef[0] = 1.0;
        r->mean = a->mean;
        na++;
    }
    for (int i = 0; i < L->nfam; i++) {
        family *fm = &L->fam[i];
        fm->atoms = malloc((size_t)(fm->cap ? fm->cap : 1) * sizeof *fm->atoms);
        if (fm->atoms == NULL)
            return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
        if (fm->cap == 0)
            fm->last = -1;
    }
    /* liveness: who reads what, and when */
    int *lastmm = malloc(((size_t)p->navars + 1) * sizeof *lastmm);
    if (lastmm == NULL)
        return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
    for (int i = 0; i < p->navars; i++)
        lastmm[i] = -1;
    for (int k = 0; k < ni; k++)
        if (p->instr[k].op == TPK_OP_MATMUL)
            lastmm[p->instr[k].avar] = k;
    for (int k = 0; k < ni; k++) {
        const tpk_instr *in = &p->instr[k];
        switch (in->op) {
        case TPK_OP_MATMUL: /* new atom is correlated with every earlier one of its A-var */
            touch(L, in->src, lastmm[in->avar]);
            break;
        case TPK_OP_LINCOMB:
            for (int t = 0; t < in->nterms; t++)
                touch(L, in->term[t], k);
            break;
        case TPK_OP_NONLIN: /* aff_build reads its scalars when it is defined */
            for (int j = 0; j < in->body.len; j++)
                if (in->body.node[j].op == TPK_RPN_SCALAR)
                    touch(L, in->body.node[j].var, k);
            break;
        case TPK_OP_MOMENT:
            for (int j = 0; j < in->body.len; j++)
                if (in->body.node[j].op == TPK_RPN_GVAR || in->body.node[j].op == TPK_RPN_SCALAR)
                    touch(L, in->body.node[j].var, k);
            break;
        default:
            break;
        }
    }
    for (int o = all_outputs ? 0 : p->noutputs - 1; o < p->noutputs; o++)
        touch(L, p->output[o].src, ni);
    for (int v = 0; v < nv; v++)
        if (p->var[v].type == TPK_VAR_G)
            for (int i = 0; i < L->rep[v].n; i++) {
                family *fm = &L->fam[L->atom[L->rep[v].atom[i]].fam];
                if (fm->last < L->last[v])
                    fm->last = L->last[v];
            }
    /* free lists: var v after instruction max(def, last) */
    for (int k = 0; k <= ni; k++)
        L->free_var[k] = L->free_fam[k] = -1;
    for (int v = 0; v < nv; v++) {
        if (deff[v] < 0)
            continue;
        int at = L->last[v] > deff[v] ? L->last[v] : deff[v];
        L->var_next[v] = L->free_var[at];
        L->free_var[at] = v;
    }
    for (int i = 0; i < L->nfam; i++) {
        family *fm = &L->fam[i];
        if (fm->last < 0)
            continue;
        fm->next = L->free_fam[fm->last];
        L->free_fam[fm->last] = i;
    }
    free(lastmm);
    return TPK_OK;
}

static void free_var_data(lim *L, int v)
{
    m2_memo_drop(L, v);
    free(L->rep[v].atom);
    free(L->rep[v].coef);
    L->rep[v].atom = NULL;
    L->rep[v].coef = NULL;
    L->rep[v].n = 0;
    free(L->xb[v].t);
    L->xb[v].t = NULL;
    free(L->scal[v]);
    L->scal[v] = NULL;
    free(L->aff[v]);
    L->aff[v] = NULL;
}

static void lim_free(lim *L)
{
    const tpk_program *p = L->p;
    if (L->rep || L->xb || L->scal)
        for (int v = 0; v < p->nvars; v++) {
            if (L->rep)
                free(L->rep[v].atom), free(L->rep[v].coef);
            if (L->xb)
                free(L->xb[v].t);
            if (L->scal)
                free(L->scal[v]);
            if (L->aff)
                free(L->aff[v]);
        }
    if (L->fam)
        for (int i = 0; i < L->nfam; i++) {
            free(L->fam[i].atoms);
            free(L->fam[i].blk);
        }
    free(L->atom);
    free(L->fam);
    free(L->fam_of_avar);
    free(L->fam_of_embed);
    free(L->atom_of_instr);
    free(L->rep);
    free(L->xb);
    free(L->scal);
    free(L->aff);
    free(L->gnode);
    free(L->last);
    free(L->def);
    free(L->var_next);
    free(L->free_var);
    free(L->free_fam);
    for (int r = 0; r <= GH_MAXDIM; r++)
        for (int h = 0; h < 2; h++) {
            free(L->gh[r][h].x);
            free(L->gh[r][h].w);
        }
    tpk_gauss_ws_free(L->gws);
    tpk_nsr_orthant_cache_free(L->ocache);
    tpk_nsr_joint_free(L->joint);
    for (int i = 0; i < L->nmm; i++)
        free(L->mm[i].E);
    free(L->mm);
    free(L->spare);
}

/* Gauss–Hermite rules for N(0,1) from GSL's e^{−x²} rule: x → √2 x, w → w/√π. */
static int gh_init(lim *L)
{
    if (L->gh_ready)
        return TPK_OK;
    L->gh_ready = 1;
    /* the library's 1-/2-D rules; closed-form fast paths never need them */
    L->gws = tpk_gauss_ws_alloc(TPK_GAUSS_DEFAULT_DEGREE, L->ctx);
    if (L->gws == NULL)
        return L->ctx && L->ctx->status ? L->ctx->status : TPK_ENOMEM;
    static const int deg[GH_MAXDIM + 1][2] = {{1, 1}, {96, 64}, {64, 44}, {28, 20},
                                              {16, 12}, {8, 6},  {6, 4}};
    for (int r = 1; r <= GH_MAXDIM; r++)
        for (int h = 0; h < 2; h++) {
            int n = deg[r][h];
            ghrule *g = &L->gh[r][h];
            gsl_integration_fixed_workspace *ws =
                gsl_integration_fixed_alloc(gsl_integration_fixed_hermite, (size_t)n, 0.0, 1.0, 0.0, 0.0);
            g->x = malloc((size_t)n * sizeof *g->x);
            g->w = malloc((size_t)n * sizeof *g->w);
            if (ws == NULL || g->x == NULL || g->w == NULL) {
                gsl_integration_fixed_free(ws);
                return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory for Gauss–Hermite rules");
            }
            const double *x = gsl_integration_fixed_nodes(ws), *w = gsl_integration_fixed_weights(ws);
            double sw = 0.0;
            for (int i = 0; i < n; i++)
                sw += w[i];
            for (int i = 0; i < n; i++) {
                g->x[i] = 1.41421356237309504880 * x[i];
                g->w[i] = w[i] / sw;
            }
            g->n = n;
            gsl_integration_fixed_free(ws);
        }
    return TPK_OK;
}

/* ---- instructions --------------------------------------------------------------------- */

static int new_block(lim *L, family *f)
{
    if (f->blk != NULL)
        return TPK_OK;
    /* every sub-block is written when its later atom is created, before anyone reads it */
    size_t dim = (size_t)f->cap * L->N;
    if (L->spare != NULL && L->spare_len == dim * dim) {
        f->blk = L->spare;
        L->spare = NULL;
        return TPK_OK;
    }
    f->blk = malloc(dim * dim * sizeof *f->blk);
    if (f->blk == NULL)
        return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory for a %zu×%zu covariance block", dim, dim);
    return TPK_OK;
}

/* Sub-block (li, lj) ← transpose of sub-block (lj, li), in cache-sized tiles. */
static void mirror_block(lim *L, family *f, int lj, int li)
{
    if (li == lj)
        return;
    size_t N = L->N, ld = (size_t)f->cap * N, TS = 32;
    const double *src = f->blk + (size_t)lj * N * ld + (size_t)li * N;
    double *dst = f->blk + (size_t)li * N * ld + (size_t)lj * N;
    for (size_t a0 = 0; a0 < N; a0 += TS)
        for (size_t c0 = 0; c0 < N; c0 += TS)
            for (size_t c = c0; c < c0 + TS && c < N; c++)
                for (size_t a = a0; a < a0 + TS && a < N; a++)
                    dst[c * ld + a] = src[a * ld + c];
}

static int do_embed(lim *L, int k, scratch *sc)
{
    const tpk_instr *in = &L->p->instr[k];
    atom *aj = &L->atom[L->atom_of_instr[k]];
    family *f = &L->fam[aj->fam];
    size_t N = L->N, d = L->d, ldx = L->T * d, ld;
    (void)sc;
    if (new_block(L, f))
        return L->ctx->status;
    ld = (size_t)f->cap * N;
    f->atoms[aj->loc] = L->atom_of_instr[k];
    f->m = aj->loc + 1;
    for (int li = 0; li <= aj->loc; li++) {
        const atom *ai = &L->atom[f->atoms[li]];
        /* Cov(U x_a^s, U x_c^s') = σ_U σ_U' ⟨x_a^s, x_c^s'⟩/d (theory §1.2) */
        double *dst = f->blk + (size_t)aj->loc * N * ld + (size_t)li * N;
        int st;
        if (ai->src == in->src) { /* same slot: a symmetric Gram matrix, half the flops */
            st = tpk_dsyrk(TPK_NO_TRANS, N, d, aj->scale * ai->scale / (double)d,
                           L->x + (size_t)in->src * d, ldx, 0.0, dst, ld, L->ctx);
            if (st)
                return st;
            mirror_block(L, f, aj->loc, li);
            continue;
        }
        st = tpk_dgemm(TPK_NO_TRANS, TPK_TRANS, N, N, d, aj->scale * ai->scale / (double)d,
                           L->x + (size_t)in->src * d, ldx, L->x + (size_t)ai->src * d, ldx, 0.0,
                           dst, ld, L->ctx);
        if (st)
            return st;
        mirror_block(L, f, aj->loc, li);
    }
    return TPK_OK;
}

static int do_matmul(lim *L, int k, scratch *sc)
{
    const tpk_instr *in = &L->p->instr[k];
    atom *aj = &L->atom[L->atom_of_instr[k]];
    family *f = &L->fam[aj->fam];
    size_t N = L->N, ld;
    if (new_block(L, f))
        return L->ctx->status;
    ld = (size_t)f->cap * N;
    f->atoms[aj->loc] = L->atom_of_instr[k];
    f->m = aj->loc + 1;
    sc->aq.on = 1; /* u = in->src is the left factor of every pair below */
    int st = TPK_OK;
    for (int li = 0; li <= aj->loc; li++) {
        const atom *ai = &L->atom[f->atoms[li]];
        double e = 0.0;
        /* Cov(W h_a, W h'_c) = σ_W² E[Z^h_a Z^h'_c] (theory §1.6 rule 3) */
        /* the diagonal sub-block (li = loc) needs only its lower triangle (see atom_cov) */
        st = m2(L, in->src, ai->src, (uint64_t)k * 4096 + (uint64_t)li, sc,
                    f->blk + (size_t)aj->loc * N * ld + (size_t)li * N, ld, li == aj->loc, f->var,
                    &e);
        if (st)
            break;
        note_err(L, e);
        mirror_block(L, f, aj->loc, li);
    }
    /* the half-products hold covariances of live G-vars only while this instruction runs */
    affq_clear(&sc->aq);
    sc->aq.on = 0;
    return st;
}

static int do_moment(lim *L, int k)
{
    const tpk_instr *in = &L->p->instr[k];
    size_t N = L->N;
    xbody xb;
    int took = 0, pst = moment_poly(L, k, &took);
    if (pst || took)
        return pst;
    if (gh_init(L))
        return L->ctx->status;
    if (expand_body(in->body.node, in->body.len, L->o.no_factor, &xb))
        return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
    double *s = malloc(N * sizeof *s);
    if (s == NULL) {
        free(xb.t);
        return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
    }
    int status = TPK_OK;
    double emax = 0.0;
#pragma omp parallel
    {
        pws *w = pws_alloc(L);
        int my_st = w == NULL ? TPK_ENOMEM : TPK_OK;
        double my_emax = 0.0;
#pragma omp for schedule(dynamic, 1)
        for (size_t a = 0; a < N; a++) {
            double sum = 0.0, esum = 0.0;
            for (int t = 0; t < xb.nterms && my_st == TPK_OK; t++) {
                fac fs[MAXF];
                for (int q = 0; q < xb.t[t].nf; q++)
                    fs[q] = (fac){xb.node + xb.t[t].fs[q], xb.t[t].fe[q] - xb.t[t].fs[q], a};
                tpk_estimate e;
                my_st = prod_expect(L, w, fs, xb.t[t].nf, (uint64_t)k * 4096 + (uint64_t)t, &e);
                sum += xb.t[t].coef * e.value;
                esum = hypot(esum, xb.t[t].coef * e.err); /* independent terms: RSS */
            }
            s[a] = sum;
            if (esum > my_emax)
                my_emax = esum;
        }
#pragma omp critical(tpk_limit_err)
        {
            if (my_st != TPK_OK && status == TPK_OK) {
                status = my_st;
                TPK_ERROR(L->ctx, my_st, "%d:%d: moment: %s", in->line, in->col,
                          w ? w->ctx.msg : "out of memory");
            }
            if (my_emax > emax)
                emax = my_emax;
        }
        pws_free(w);
    }
    free(xb.t);
    if (status != TPK_OK) {
        free(s);
        return status;
    }
    note_err(L, emax);
    L->scal[in->out] = s;
    return TPK_OK;
}

static double wall_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* "\r  limit kernel: instruction k/n, t s" once the run is older than TPK_NETSOR_PROGRESS_AFTER
 * (short runs print nothing); returns 1 when it printed. */
static int progress_line(FILE *f, int k, int n, double t0, int shown)
{
    double t = wall_seconds() - t0;
    if (t < TPK_NETSOR_PROGRESS_AFTER && !shown)
        return 0;
    if (k < n)
        fprintf(f, "\r  limit kernel: instruction %d/%d (%.0f%%), %.1f s", k + 1, n,
                100.0 * k / n, t);
    else
        fprintf(f, "\r  limit kernel: readouts, %.1f s%12s", t, "");
    fflush(f);
    return 1;
}

int nsr_check_psd(const double *K, size_t n, double err, tpk_ctx *ctx)
{
    /* Cheap enough up to a few hundred rows; beyond that the O(n³) check would dominate. */
    if (n > 600)
        return TPK_OK;
    double *A = malloc(n * n * sizeof *A), *lam = malloc(n * sizeof *lam);
    int st = TPK_OK;
    if (A == NULL || lam == NULL) {
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    } else {
        memcpy(A, K, n * n * sizeof *A);
        if (LAPACKE_dsyev(LAPACK_ROW_MAJOR, 'N', 'L', (int)n, A, (int)n, lam) == 0) {
            double lmax = fabs(lam[n - 1]) > fabs(lam[0]) ? fabs(lam[n - 1]) : fabs(lam[0]);
            double tol = PSD_REL * lmax + PSD_ERR * (double)n * err + DBL_MIN;
            if (lam[0] < -tol)
                st = TPK_ERROR(ctx, TPK_ENUMERIC,
                               "limit kernel is not PSD: smallest eigenvalue %.3g (largest %.3g, "
                               "error estimate %.3g)", lam[0], lam[n - 1], err);
        }
    }
    free(A);
    free(lam);
    return st;
}

static int check_psd(lim *L, const double *K, size_t n)
{
    return nsr_check_psd(K, n, L->err, L->ctx);
}

int tpk_netsor_kernel_ex(const tpk_program *p, const tpk_array *x, int all_outputs,
                         const tpk_limit_opts *opts, tpk_array **K, double *err, tpk_ctx *ctx)
{
    tpk_nsr_shape sh;
    if (K == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_netsor_kernel: K must not be NULL");
    *K = NULL;
    if (err)
        *err = 0.0;
    /* TPK_NETSOR_FORM=unrolled: the unrolled evaluator even where the rolled one serves
     * (comparisons and benchmarks of the two; docs/netsor.md) */
    tpk_ctx local;
    if (ctx == NULL) { /* the rolled evaluator reports through a context */
        tpk_ctx_init(&local);
        ctx = &local;
    }
    const char *form = getenv("TPK_NETSOR_FORM");
    int force_unrolled = (opts && opts->unrolled) || (form && strcmp(form, "unrolled") == 0);
    if (p != NULL && p->rolled != NULL && !force_unrolled) {
        /* the rolled form first; a form it does not take falls back to the unrolled one */
        int unsup = 0;
        int st = nsr_flimit_kernel(p, x, all_outputs, K, err, &unsup, ctx);
        if (st == TPK_OK) {
            st = nsr_check_psd((*K)->data, (*K)->dims[0], err ? *err : 0, ctx);
            if (st) {
                tpk_array_free(*K);
                *K = NULL;
            }
            return st;
        }
        if (!unsup || p->ninstr == 0)
            return st;
        tpk_ctx_clear(ctx);
    }
    int st = tpk_nsr_validate(p, x, all_outputs, &sh, ctx);
    if (st)
        return st;
    if (p->features & TPK_FEAT_SQRT_N_LOGITS)
        return TPK_ERROR(ctx, TPK_EUNSUPPORTED,
                         "%s: sqrt(n) * mean(q * k) logits have a random, non-Gaussian limit "
                         "(theory.md §5), not a NETSOR+ kernel; the finite-width executor runs it, "
                         "and gpkernel --arch=attention --logit-scaling=inv-sqrt-n computes the "
                         "hierarchical limit", p->path ? p->path : "program");
    lim L;
    memset(&L, 0, sizeof L);
    L.p = p;
    if (opts)
        L.o = *opts;
    L.N = sh.N;
    L.T = sh.T;
    L.d = sh.d;
    L.x = x->data;
    L.maxlen = sh.maxlen;
    L.maxdepth = sh.maxdepth;
    L.ctx = ctx;
    L.ocache = tpk_nsr_orthant_cache_alloc(); /* NULL (out of memory) only disables the memo */
    /* NULL (out of memory, or the options ask for Monte Carlo per group) disables it */
    size_t jpts = (L.o.mc_samples ? L.o.mc_samples : MC_DEFAULT) / QMC_SHIFTS; /* per shift */
    jpts *= JOINT_POINTS_X;
    L.joint = L.o.force_mc || L.o.no_factor || L.o.no_joint ? NULL
              : tpk_nsr_joint_alloc(QMC_SHIFTS, jpts > 0 ? jpts : 1,
                                    L.o.joint_max_bytes ? L.o.joint_max_bytes : JOINT_MAX_BYTES,
                                    L.o.mc_seed);
    double t_start = wall_seconds();
    int shown = 0; /* a progress line was printed */
    size_t N = L.N;
    /* s1, s2, s3 only serve the cross/general paths: allocated on first use */
    scratch sc = {NULL, NULL, NULL, malloc(N * sizeof(double)), malloc(N * sizeof(double)),
                  {0, -1, 0, 0, NULL, NULL, 0}};
    tpk_array *out = NULL;
    double *M = NULL;
    if (!sc.qa || !sc.qb) {
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        goto done;
    }
    if ((st = setup(&L, all_outputs)))
        goto done;
    for (int k = 0; k < p->ninstr; k++) {
        const tpk_instr *in = &p->instr[k];
        if (L.o.progress && (in->op == TPK_OP_MATMUL || in->op == TPK_OP_MOMENT))
            shown |= progress_line(L.o.progress, k, p->ninstr, t_start, shown);
        switch (in->op) {
        case TPK_OP_EMBED:
            st = do_embed(&L, k, &sc);
            break;
        case TPK_OP_BIAS:
            break;
        case TPK_OP_MATMUL:
            st = do_matmul(&L, k, &sc);
            break;
        case TPK_OP_LINCOMB:
            break;
        case TPK_OP_NONLIN:
            if (expand_body(in->body.node, in->body.len, L.o.no_factor, &L.xb[in->out]))
                st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
            else
                st = aff_build(&L, k);
            break;
        case TPK_OP_MOMENT:
            st = do_moment(&L, k);
            break;
        default:
            break;
        }
        if (st == TPK_OK && p->var[in->out].type == TPK_VAR_G) {
            int v = in->out;
            L.xb[v].node = &L.gnode[v];
            L.xb[v].nterms = 1;
            L.xb[v].t = malloc(sizeof *L.xb[v].t);
            if (L.xb[v].t == NULL)
                st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
            else
                L.xb[v].t[0] = (xterm){1.0, 1, {0}, {1}};
        }
        if (st)
            goto done;
        for (int v = L.free_var[k]; v >= 0; v = L.var_next[v])
            free_var_data(&L, v);
        for (int f = L.free_fam[k]; f >= 0; f = L.fam[f].next) {
            if (L.spare == NULL && L.fam[f].blk != NULL) {
                size_t dim = (size_t)L.fam[f].cap * N;
                L.spare = L.fam[f].blk;
                L.spare_len = dim * dim;
            } else {
                free(L.fam[f].blk);
            }
            L.fam[f].blk = NULL;
        }
    }
    /* outputs: K[(a,o),(c,o')] = σ_v² E[Z^o_a Z^o'_c], input-major */
    if (L.o.progress)
        shown |= progress_line(L.o.progress, p->ninstr, p->ninstr, t_start, shown);
    int o0 = all_outputs ? 0 : p->noutputs - 1, O = p->noutputs - o0;
    size_t dim = N * (size_t)O;
    out = tpk_array_alloc2(dim, dim, ctx);
    if (out != NULL && L.spare != NULL && L.spare_len == dim * dim) {
        free(out->data); /* a freed block has its pages already: reuse it for K */
        out->data = L.spare;
        L.spare = NULL;
    }
    M = O > 1 ? malloc(N * N * sizeof *M) : NULL;
    if (out == NULL || (O > 1 && M == NULL)) {
        st = out == NULL ? ctx->status : TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        goto done;
    }
    for (int oi = 0; oi < O; oi++)
        for (int oj = 0; oj <= oi; oj++) {
            const tpk_output *po = &p->output[o0 + oi], *pq = &p->output[o0 + oj];
            double e = 0.0, s = sqrt(po->var * pq->var);
            uint64_t site = (uint64_t)p->ninstr * 4096 + (uint64_t)(oi * O + oj);
            /* a scalar readout bias β shared by the outputs adds its variance everywhere */
            double beta = sqrt(po->bias_var * pq->bias_var);
            if (O == 1) { /* straight into K */
                if ((st = m2(&L, po->src, pq->src, site, &sc, out->data, N, 0, s, &e)))
                    goto done;
                note_err(&L, e);
                if (beta != 0.0)
                    for (size_t i = 0; i < N * N; i++)
                        out->data[i] += beta;
                continue;
            }
            if ((st = m2(&L, po->src, pq->src, site, &sc, M, N, 0, s, &e)))
                goto done;
            note_err(&L, e);
            for (size_t a = 0; a < N; a++)
                for (size_t c = 0; c < N; c++) {
                    double v = M[a * N + c] + beta;
                    out->data[(a * (size_t)O + (size_t)oi) * dim + c * (size_t)O + (size_t)oj] = v;
                    out->data[(c * (size_t)O + (size_t)oj) * dim + a * (size_t)O + (size_t)oi] = v;
                }
        }
    for (size_t i = 0; i < dim * dim; i++)
        if (!isfinite(out->data[i])) {
            st = TPK_ERROR(ctx, TPK_ENUMERIC, "limit kernel has a non-finite entry (%zu, %zu)",
                           i / dim, i % dim);
            goto done;
        }
    if ((st = check_psd(&L, out->data, dim)))
        goto done;
    if (err)
        *err = L.err;
    *K = out;
    out = NULL;
done:
    if (L.o.progress && shown) {
        fprintf(L.o.progress, "\r  limit kernel: done in %.1f s%20s\n", wall_seconds() - t_start, "");
        fflush(L.o.progress);
    }
    tpk_array_free(out);
    free(M);
    free(sc.s1);
    free(sc.s2);
    free(sc.s3);
    free(sc.qa);
    free(sc.qb);
    affq_free(&sc.aq);
    lim_free(&L);
    return st;
}

int tpk_netsor_kernel(const tpk_program *p, const tpk_array *x, int all_outputs, tpk_array **K,
                      double *err, tpk_ctx *ctx)
{
    return tpk_netsor_kernel_ex(p, x, all_outputs, NULL, K, err, ctx);
}

int tpk_netsor_kernel_progress(const tpk_program *p, const tpk_array *x, int all_outputs,
                               FILE *progress, tpk_array **K, double *err, tpk_ctx *ctx)
{
    tpk_limit_opts o;
    memset(&o, 0, sizeof o);
    o.progress = progress;
    return tpk_netsor_kernel_ex(p, x, all_outputs, &o, K, err, ctx);
}
