/* Infinite-width limit of a rolled NETSOR program (issue 14): the Master Theorem recursion of
 * netsor/limit.c, on whole index families instead of member by member (theory.md §1.6–1.9,
 * §2.7–2.8, docs/netsor.md "Rolled programs").
 *
 * Stages, run by nsr_flimit_kernel for each family instruction in order:
 *   plan      the same pass with no inputs (N = 0): domains, index maps, block kinds and which
 *             forms are supported, and every block's last use (liveness);
 *   store     blocks: one per family instruction (and temporaries), each a covariance block over
 *             (input × member) — second moments E[Z_p^a Z_q^c] of the (N·m)×(N·m) block —
 *             with first moments, or a deterministic scalar family (NETSOR+ Moments);
 *   expansion an expression over a domain evaluates to a value: a constant, a scalar family, or
 *             a linear combination of block members with per-input coefficients (a gather —
 *             one member per point — or a dense mixing matrix, as attention's Σ_j a_ij k_j);
 *   back ends MatMul → σ²·E[h hᵀ] of its source (a sandwich C·M2·Cᵀ of the value's terms, GEMMs
 *             for dense maps); a sum over a binder of MatMuls by distinct fresh A-vars
 *             (convolution taps) → one block accumulating each tap's term; φ(Gaussian block) →
 *             the whole-matrix expectation maps of kernels/gauss (closed forms, Mehler,
 *             quadrature); Moments → the block's diagonal; softmax → scalar rows;
 *   driver    outputs → K = σ_v² E[y yᵀ] + β, blocks freed at their last use.
 * Fusions where a block dies at once (the plan says so): A·φ(g) and readout(φ(g)) map straight
 * into their targets, a dying atom lends its matrix to g = atom + b, an embedding of every slot
 * writes the input Gram into its atom. Where the dying block is g itself and the statement reads
 * it once (defined_names), the work runs in place over g's matrix: the layer map of W·φ(g) + b,
 * φ(g)'s moments, and a convolution's taps (per input pair, with φ's map fused in). A fresh
 * (N m)² block costs its first touch — page faults and the kernel's zeroing, more than the map
 * itself — so each in-place step saves one. Symmetric blocks keep their lower triangle and are
 * mirrored only when a reader needs both.
 * Independence is structural: every MatMul by an A-var that no other MatMul uses, every
 * embedding and every initial G-var starts a new root, and blocks without a common root are
 * independent (E[XY] = E[X]E[Y]). What this evaluator does not take — A-vars shared by several
 * MatMuls (recurrent weights), products of two vectors outside mean(), batchnorm, correlated
 * cross terms — is reported as TPK_EUNSUPPORTED with the statement's position, and the caller
 * uses the unrolled form. */
#include "backend-impl.h"
#include "ewplan-impl.h"
#include "tpk/alloc.h"
#include "family-impl.h"

#include "tpk/clock.h"
#include "tpk/cnn.h"
#include "tpk/matmul.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NSR_MAXV (NSR_MAX_INDICES + 12) /* domain indices plus nested binders */
#define MAXANC 48                   /* roots remembered per block */

enum { BK_GAUSS, BK_NONLIN, BK_BIAS, BK_SCAL, BK_MIX, BK_ZERO };
enum { V_CONST, V_SCAL, V_LIN };

typedef struct term {
    int blk;
    int dense;          /* 0: gather idx/w; 1: w is N × m × m_src */
    int *idx;           /* gather: source member per point, −1 = none */
    double *w;          /* gather: N × m weights (NULL: 1) */
} term;

typedef struct val {
    int kind;
    long m;
    double c;           /* V_CONST */
    double *s;          /* V_SCAL: N × m */
    int nt;
    term *t;            /* V_LIN */
    double *mu;         /* V_LIN: N × m constant part (NULL: 0) */
} val;

typedef struct fblock {
    int kind, fam, fi;
    long m;
    int nidx;
    nsr_trie tr;
    double *M2;         /* GAUSS, BIAS, NONLIN (cached): (N m)² second moments */
    double *Fac;        /* GAUSS, optional: M2 = Fac·Facᵀ, (N m) × rank (then M2 is made when a
                         * reader needs it; theory §2.7: the embedding's Gram has rank d) */
    long rank;
    double *mean;       /* N m first moments (NULL: 0); NONLIN: computed with M2 */
    double *s;          /* SCAL */
    const tpk_phi *phi; /* NONLIN: φ(arg) */
    int arg;
    val mix;            /* MIX: a stored value (gather terms only) */
    int nanc;
    int anc[MAXANC];    /* roots; nanc < 0: unknown (correlated with everything) */
    int last_use;
    int lower;          /* M2 holds only its lower triangle (mirrored on first full read) */
    int line, col;
    struct pend *pend;  /* GAUSS, pending: M2 is an entrywise function of other blocks, made
                         * when a reader needs it (ew_flush; ewplan-impl.h) */
    int pins;           /* pending blocks that read this one: its data stays while any does */
    int dead;           /* the plan freed it while pinned: its data goes with the last pin */
} fblock;

/* A pending block: one node of an entrywise program over other blocks (args are block ids;
 * bias terms read a BIAS block's variances), with its diagonal made at once (the moments that
 * read it need no matrix). */
typedef struct pend {
    nsr_ew_node nd;
    double *diag;               /* N m */
    double *w[NSR_EW_MAXT];     /* copies of the terms' weights */
    double *s[NSR_EW_MAXT];     /* bias terms: the variance at each member (m) */
    int *cls[NSR_EW_MAXT];      /* bias terms read by several members: the member each reads */
} pend;

/* The plan made on a second thread while the run starts (it needs no numbers, and at large T it
 * costs as much as several instructions): the run waits for it only where a decision depends on
 * it (a block that dies here lends its matrix), frees blocks once it is there, and takes its
 * error if it fails — so the result is the same as planning first. */
typedef struct plan_job {
    const tpk_program *p;
    size_t T, d;
    int all_outputs;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, st, unsup, nb;
    int *last;          /* each block's last use (−1: the end) */
    double seconds;
    tpk_ctx ctx;
} plan_job;

typedef struct fl {
    nsr_fam X;          /* program, symbol values, current instruction, errors (family-impl.h) */
    const tpk_program *p;
    size_t N, T, d;
    const double *x;
    int dry;            /* plan: no numbers */
    fblock *b;
    int nb, capb;
    const int *last;    /* from the plan: last use per block (real run) */
    int *amark;         /* A-var member → site that used it (−1) */
    long site;
    double err;
    tpk_gauss_ws *ws;
    tpk_program *fill;  /* plan of a rolled-only program: give it its outputs */
    const int *plan;    /* real run: every block's last use from the plan (−1: the end) */
    int nplan;
    int nb_stmts;       /* blocks the statements made (the outputs' are not the plan's) */
    plan_job *pj;       /* the plan being made beside the run (NULL: plan is final) */
    struct {
        void *p;
        size_t bytes;
    } pool[6];          /* freed big matrices, reused: fresh pages cost more than a memset */
    double *inplace;    /* set by matmul_acc: the matrix the new atom takes instead of its own */
    const nsr_stmt *final_out; /* the one output the end reads (its blocks' last reader), or NULL */
    pend *newpend;      /* set by matmul_acc: the pending map the new atom is, instead of a matrix */
    int plan_kind;      /* NSR_PLAN_NAIVE or NSR_PLAN_OPTIMAL (TPK_PLAN) */
    nsr_ew_calib cal;   /* the plans' cost model, measured by the first that needs it */
    FILE *plan_report;  /* netsor plan: every entrywise plan, its kernels and times */
    int plan_verify;    /* netsor plan --verify: every candidate checked in Z_p first */
    int plan_signatures;/* netsor plan --signatures: each kernel's signature in the report (2: and
                         * every candidate's) */
} fl;

/* ---- errors and memory ---------------------------------------------------------------------- */

#define POOL_MIN ((size_t)4 << 20)

/* A zeroed (zero = 1) or uninitialised n × size buffer, from the pool when one of that size
 * is there. */
static void *fl_big(fl *F, size_t n, size_t size, int zero)
{
    size_t bytes = n * size;
    if (n != 0 && bytes / n == size && nsr_fam_too_big(&F->X, bytes))
        return NULL;
    if (n != 0 && bytes / n == size && bytes >= POOL_MIN)
        for (int i = 0; i < 6; i++)
            if (F->pool[i].p != NULL && F->pool[i].bytes == bytes) {
                void *q = F->pool[i].p;
                F->pool[i].p = NULL;
                if (zero)
                    memset(q, 0, bytes);
                return q;
            }
    if (n != 0 && bytes / n == size && bytes >= POOL_MIN) {
        /* malloc + memset, not calloc: calloc's untouched zero pages turn the first += into a
         * copy-on-write fault with a TLB shootdown per page across the threads */
        void *q = tpk_malloc(F->X.ctx, bytes); /* the hook's: never folded into calloc */
        if (q == NULL) {
            TPK_ERROR(F->X.ctx, TPK_ENOMEM, "out of memory (%.3g GB)", (double)bytes / 1e9);
            return NULL;
        }
        if (zero)
            memset(q, 0, bytes);
        return q;
    }
    return nsr_fam_alloc(&F->X, n, size);
}

static void fl_release(fl *F, void *q, size_t bytes)
{
    if (q == NULL)
        return;
    if (bytes >= POOL_MIN)
        for (int i = 0; i < 6; i++)
            if (F->pool[i].p == NULL) {
                F->pool[i].p = q;
                F->pool[i].bytes = bytes;
                return;
            }
    tpk_free(F->X.ctx, q);
}

static void val_free(fl *F, val *v)
{
    tpk_free(F->X.ctx, v->s);
    tpk_free(F->X.ctx, v->mu);
    for (int i = 0; i < v->nt; i++) {
        tpk_free(F->X.ctx, v->t[i].idx);
        tpk_free(F->X.ctx, v->t[i].w);
    }
    tpk_free(F->X.ctx, v->t);
    memset(v, 0, sizeof *v);
}

static void pend_free(fl *F, struct pend *P);

static void block_data_free(fl *F, fblock *b)
{
    size_t n = F->N * (size_t)b->m;
    fl_release(F, b->M2, n * n * sizeof *b->M2);
    tpk_free(F->X.ctx, b->Fac);
    b->Fac = NULL;
    tpk_free(F->X.ctx, b->mean);
    tpk_free(F->X.ctx, b->s);
    b->M2 = b->mean = b->s = NULL;
    val_free(F, &b->mix);
    struct pend *P = b->pend;
    b->pend = NULL;
    pend_free(F, P); /* may free blocks it pinned: b is not used after this */
}

/* A pending block that read block k is done with it: k's data goes with the last such reader
 * where the plan has freed k already. */
static void unpin(fl *F, int k)
{
    fblock *b = &F->b[k];
    if (b->pins > 0 && --b->pins == 0 && b->dead)
        block_data_free(F, b);
}

static void pend_free(fl *F, struct pend *P)
{
    if (P == NULL)
        return;
    tpk_free(F->X.ctx, P->diag);
    if (P->nd.op == NSR_EW_PHI || P->nd.op == NSR_EW_CONV)
        unpin(F, P->nd.arg);
    for (int t = 0; P->nd.op == NSR_EW_SUM && t < P->nd.nt; t++) {
        tpk_free(F->X.ctx, P->w[t]);
        tpk_free(F->X.ctx, P->s[t]);
        tpk_free(F->X.ctx, P->cls[t]);
        if (P->nd.t[t].arg >= 0)
            unpin(F, P->nd.t[t].arg);
    }
    tpk_free(F->X.ctx, P);
}

/* The plan's last use of block k has passed: its data goes now, or with its last pin. */
static void kill_block(fl *F, int k)
{
    if (F->b[k].pins > 0)
        F->b[k].dead = 1;
    else
        block_data_free(F, &F->b[k]);
}

static int new_block(fl *F, int kind, int fam, long m)
{
    if (F->nb == F->capb) {
        int cap = F->capb ? 2 * F->capb : 64;
        fblock *nb = tpk_realloc(F->X.ctx, F->b, (size_t)cap * sizeof *nb);
        if (nb == NULL) {
            TPK_ERROR(F->X.ctx, TPK_ENOMEM, "out of memory");
            return -1;
        }
        F->b = nb;
        F->capb = cap;
    }
    fblock *b = &F->b[F->nb];
    memset(b, 0, sizeof *b);
    b->kind = kind;
    b->fam = fam;
    b->fi = F->X.cur;
    b->m = m;
    b->arg = -1;
    b->last_use = F->X.cur;
    return F->nb++;
}

static void touch(fl *F, int k)
{
    if (F->b[k].last_use < F->X.cur)
        F->b[k].last_use = F->X.cur;
}

/* A family defined by `scalar` statements (NETSOR+ moments: numbers per input, no matrix). */
static int scalar_family(const fl *F, int sym)
{
    for (int k = 0; k < F->X.R->nfi; k++) {
        const nsr_stmt *s = F->X.R->fi[k].stmt;
        if (s->kind == NSR_S_DEF && s->fam == sym)
            return s->annot == NSR_ANN_SCALAR;
    }
    return 0;
}

/* Names of defined G- and H-var families in e. A statement whose value names one reads
 * each block it reaches through that name at one place: a block the plan says dies in this
 * statement may then be overwritten by the one reader (biases, A-vars, parameters, inputs and
 * scalar moments are not such families). Where it names more (a residual g + W·φ(g), φ(g)
 * twice), a block dying here may still be read again after the first reader, so nothing is
 * overwritten. */
static int defined_names(const fl *F, const nsr_expr *e)
{
    if (e == NULL)
        return 0;
    int n = e->kind == NSR_E_NAME && e->sym >= 0 &&
            F->X.C->sym[e->sym].kind == NSR_SYM_DFAM && !scalar_family(F, e->sym);
    for (int i = 0; i < e->nidx; i++)
        n += defined_names(F, e->idx[i]);
    for (int i = 0; i < e->nargs; i++)
        n += defined_names(F, e->args[i]);
    return n + defined_names(F, e->a) + defined_names(F, e->b);
}

/* 1 when the statement being evaluated names one defined family (defined_names); at the end,
 * where the outputs read their blocks, the one output read (final_out) is that statement */
static int stmt_reads_once(const fl *F)
{
    const nsr_stmt *stm = F->X.cur >= 0 && F->X.cur < F->X.R->nfi ? F->X.R->fi[F->X.cur].stmt
                          : F->X.cur == F->X.R->nfi                ? F->final_out
                                                                   : NULL;
    return stm != NULL && defined_names(F, stm->value) == 1;
}

/* The plan, once made (wait = 1: until it is); NULL while it is not (or when it failed). */
static const int *plan_get(fl *F, int wait)
{
    plan_job *J = F->pj;
    if (F->plan != NULL || J == NULL)
        return F->plan;
    pthread_mutex_lock(&J->mu);
    while (wait && !J->done)
        pthread_cond_wait(&J->cv, &J->mu);
    if (J->done && J->st == TPK_OK) {
        F->plan = J->last;
        F->nplan = J->nb;
    }
    pthread_mutex_unlock(&J->mu);
    return F->plan;
}

/* The plan's status once made (wait = 1: until it is); TPK_OK while it is being made. */
static int plan_status(fl *F, int wait)
{
    plan_job *J = F->pj;
    if (J == NULL)
        return TPK_OK;
    plan_get(F, wait);
    pthread_mutex_lock(&J->mu);
    int st = J->done ? J->st : TPK_OK;
    pthread_mutex_unlock(&J->mu);
    return st;
}

/* Does block k die in the instruction being evaluated? (The plan's −1 is the end, where the
 * outputs read their blocks: X.cur = nfi.) */
static int dies_here(fl *F, int k)
{
    const int *pl = plan_get(F, 1);
    return pl != NULL && k >= 0 && k < F->nplan &&
           (pl[k] == F->X.cur || (pl[k] == -1 && F->X.cur == F->X.R->nfi));
}

/* Block k's matrix, taken for a step that overwrites it, where k is a Gaussian block of m members
 * that dies here and the statement reads once (stmt_reads_once); NULL (nothing taken)
 * otherwise. The block holds no matrix afterwards: a fresh (N m)² block's first touch — page
 * faults and the kernel's zeroing — costs more than the map that would fill it. */
static double *take_matrix(fl *F, int k, long m)
{
    fblock *b = &F->b[k];
    if (b->kind != BK_GAUSS || b->fi == -2 || b->m != m || b->M2 == NULL || b->pins > 0 ||
        !dies_here(F, k) || !stmt_reads_once(F))
        return NULL;
    double *M = b->M2;
    b->M2 = NULL;
    return M;
}

/* After a step that may have run over a taken matrix (F->inplace): the new atom takes that
 * matrix, and its own (N m)² block, never touched, goes back to the pool. */
static double *adopt_inplace(fl *F, double *M2, long m)
{
    if (F->inplace == NULL)
        return M2;
    size_t n = F->N * (size_t)m;
    fl_release(F, M2, n * n * sizeof *M2);
    M2 = F->inplace;
    F->inplace = NULL;
    return M2;
}

/* ---- ancestry: the roots a block depends on ------------------------------------------------ */

static void anc_root(fblock *b, int self)
{
    b->nanc = 1;
    b->anc[0] = self;
}

static void anc_union(fblock *b, const fblock *o)
{
    if (b->nanc < 0 || o->nanc < 0) {
        b->nanc = -1;
        return;
    }
    for (int i = 0; i < o->nanc; i++) {
        int j = 0;
        while (j < b->nanc && b->anc[j] != o->anc[i])
            j++;
        if (j < b->nanc)
            continue;
        if (b->nanc == MAXANC) {
            b->nanc = -1;
            return;
        }
        b->anc[b->nanc++] = o->anc[i];
    }
}

/* Members of an initial G-var family (one BK_BIAS block, say b[l in 1..L]) are independent of
 * each other (theory §1.2), so a block made from b[2] is not correlated with a later read of
 * b[3]: such a block remembers the members it read, as ancestors of their own, −2 − (block·2¹⁶
 * + member); the block's own number stands for all of its members. */
#define ANC_MEMBERS 65536

static int anc_member(int blk, long mem)
{
    return blk < INT32_MAX / ANC_MEMBERS - 1 && mem >= 0 && mem < ANC_MEMBERS
               ? -2 - (blk * ANC_MEMBERS + (int)mem)
               : -1;
}

static int anc_block(int id) { return id >= 0 ? id : (-id - 2) / ANC_MEMBERS; }

static void anc_add(fblock *b, int id)
{
    if (b->nanc < 0)
        return;
    for (int j = 0; j < b->nanc; j++)
        if (b->anc[j] == id)
            return;
    if (b->nanc == MAXANC) {
        b->nanc = -1;
        return;
    }
    b->anc[b->nanc++] = id;
}

/* Block-level: conservative (a member ancestor meets its whole block, and vice versa). */
static int correlated(const fblock *x, const fblock *y)
{
    if (x->nanc < 0 || y->nanc < 0)
        return 1;
    for (int i = 0; i < x->nanc; i++)
        for (int j = 0; j < y->nanc; j++) {
            int a = x->anc[i], c = y->anc[j];
            if (a == c || ((a < 0) != (c < 0) && anc_block(a) == anc_block(c)))
                return 1;
        }
    return 0;
}

/* The ancestors a value term brings: the members it reads of an initial G-var family, else its
 * block's. m: the term's points. */
static void anc_union_term(const fl *F, fblock *b, const term *t, long m)
{
    const fblock *o = &F->b[t->blk];
    if (o->kind != BK_BIAS || t->dense || o->nanc != 1 || o->anc[0] != t->blk) {
        anc_union(b, o);
        return;
    }
    for (long p = 0; p < m && b->nanc >= 0; p++)
        if (t->idx[p] >= 0) {
            int id = anc_member(t->blk, t->idx[p]);
            if (id == -1) {
                anc_union(b, o);
                return;
            }
            anc_add(b, id);
        }
}

/* Block x against term s (m points): as correlated(), but a read of members of an initial G-var
 * family meets x only where x has read one of those members (or the whole family). */
static int term_correlated(const fl *F, const fblock *x, const term *s, long m)
{
    const fblock *y = &F->b[s->blk];
    if (y->kind != BK_BIAS || s->dense || y->nanc != 1 || y->anc[0] != s->blk || x->nanc < 0)
        return correlated(x, y);
    for (int i = 0; i < x->nanc; i++)
        if (x->anc[i] == s->blk)
            return 1;
    for (long p = 0; p < m; p++)
        if (s->idx[p] >= 0) {
            int id = anc_member(s->blk, s->idx[p]);
            if (id == -1)
                return correlated(x, y);
            for (int i = 0; i < x->nanc; i++)
                if (x->anc[i] == id)
                    return 1;
        }
    return 0;
}

/* ---- numbers of index expressions ---------------------------------------------------------- */

/* ---- domains ------------------------------------------------------------------------------ */

/* ---- values ------------------------------------------------------------------------------- */

static int v_const(val *v, long m, double c)
{
    memset(v, 0, sizeof *v);
    v->kind = V_CONST;
    v->m = m;
    v->c = c;
    return TPK_OK;
}

/* SCAL array of v (allocating for a constant). */
static int v_scal(fl *F, val *v)
{
    if (v->kind == V_SCAL)
        return TPK_OK;
    size_t n = F->N * (size_t)v->m;
    double *s = nsr_fam_alloc(&F->X, n, sizeof *s);
    if (s == NULL)
        return F->X.ctx->status;
    for (size_t i = 0; i < n; i++)
        s[i] = v->c;
    v->kind = V_SCAL;
    v->s = s;
    return TPK_OK;
}

/* v ← v · c (per input and point when c is SCAL). */
static int v_scale(fl *F, val *v, const val *c)
{
    size_t N = F->N, m = (size_t)v->m;
    if (c->kind == V_CONST && c->c == 1)
        return TPK_OK;
    if (c->kind == V_CONST && c->c == 0) { /* 0 · x is the zero vector, as the unrolled form folds */
        long mv = v->m;
        val_free(F, v);
        return v_const(v, mv, 0);
    }
    if (v->kind == V_CONST && c->kind == V_CONST) {
        v->c *= c->c;
        return TPK_OK;
    }
    if (v->kind != V_LIN) {
        if (v_scal(F, v))
            return F->X.ctx->status;
        for (size_t i = 0; i < N * m; i++)
            v->s[i] *= c->kind == V_CONST ? c->c : c->s[i];
        return TPK_OK;
    }
    if (v->mu)
        for (size_t i = 0; i < N * m; i++)
            v->mu[i] *= c->kind == V_CONST ? c->c : c->s[i];
    for (int k = 0; k < v->nt; k++) {
        term *t = &v->t[k];
        size_t ms = (size_t)F->b[t->blk].m;
        if (t->dense) {
            for (size_t a = 0; a < N; a++)
                for (size_t p = 0; p < m; p++) {
                    double w = c->kind == V_CONST ? c->c : c->s[a * m + p];
                    double *row = t->w + (a * m + p) * ms;
                    for (size_t q = 0; q < ms; q++)
                        row[q] *= w;
                }
            continue;
        }
        if (t->w == NULL) {
            if ((t->w = nsr_fam_alloc(&F->X, N * m, sizeof *t->w)) == NULL)
                return F->X.ctx->status;
            for (size_t i = 0; i < N * m; i++)
                t->w[i] = 1;
        }
        for (size_t i = 0; i < N * m; i++)
            t->w[i] *= c->kind == V_CONST ? c->c : c->s[i];
    }
    return TPK_OK;
}

/* a ← a + s·b (b consumed). */
static int v_add(fl *F, val *a, val *b, double s)
{
    size_t N = F->N, m = (size_t)a->m;
    if (s != 1) {
        val c;
        v_const(&c, b->m, s);
        if (v_scale(F, b, &c))
            return F->X.ctx->status;
    }
    if (a->kind == V_CONST && b->kind == V_CONST) {
        a->c += b->c;
        return TPK_OK;
    }
    if (a->kind != V_LIN && b->kind != V_LIN) {
        if (v_scal(F, a))
            return F->X.ctx->status;
        for (size_t i = 0; i < N * m; i++)
            a->s[i] += b->kind == V_CONST ? b->c : b->s[i];
        val_free(F, b);
        return TPK_OK;
    }
    if (a->kind != V_LIN) {
        val t = *a;
        *a = *b;
        *b = t;
    }
    /* a is LIN */
    if (b->kind != V_LIN) {
        if (b->kind == V_CONST && b->c == 0)
            return TPK_OK;
        if (a->mu == NULL && (a->mu = nsr_fam_alloc(&F->X, N * m, sizeof *a->mu)) == NULL)
            return F->X.ctx->status;
        for (size_t i = 0; i < N * m; i++)
            a->mu[i] += b->kind == V_CONST ? b->c : b->s[i];
        val_free(F, b);
        return TPK_OK;
    }
    if (b->mu) {
        if (a->mu == NULL) {
            a->mu = b->mu;
            b->mu = NULL;
        } else {
            for (size_t i = 0; i < N * m; i++)
                a->mu[i] += b->mu[i];
        }
    }
    term *t = tpk_realloc(F->X.ctx, a->t, (size_t)(a->nt + b->nt) * sizeof *t);
    if (t == NULL)
        return TPK_ERROR(F->X.ctx, TPK_ENOMEM, "out of memory");
    memcpy(t + a->nt, b->t, (size_t)b->nt * sizeof *t);
    a->t = t;
    a->nt += b->nt;
    tpk_free(F->X.ctx, b->t);
    b->t = NULL;
    b->nt = 0;
    val_free(F, b);
    return TPK_OK;
}

/* The value "member idx[p] of block k" over m points (idx consumed). */
static int v_gather(fl *F, val *v, long m, int k, int *idx)
{
    memset(v, 0, sizeof *v);
    v->kind = V_LIN;
    v->m = m;
    v->t = nsr_fam_alloc(&F->X, 1, sizeof *v->t);
    if (v->t == NULL) {
        tpk_free(F->X.ctx, idx);
        return F->X.ctx->status;
    }
    v->nt = 1;
    v->t[0].blk = k;
    v->t[0].idx = idx;
    return TPK_OK;
}

/* ---- block second moments --------------------------------------------------------------- */

static int nonlin_moments(fl *F, int k);

/* M2 of block k with both triangles (a symmetric block stored as its lower triangle is
 * mirrored now: most consumers read the lower triangle only and never pay for it). */
static const double *block_m2_full(fl *F, int k);

/* First moments of block k, N·m (NULL: all zero). */
static const double *block_mean(fl *F, int k)
{
    fblock *b = &F->b[k];
    touch(F, k);
    if (b->kind == BK_NONLIN)
        touch(F, b->arg); /* read when its moments are computed (lazily): keep it alive */
    if (b->kind == BK_NONLIN && b->M2 == NULL)
        nonlin_moments(F, k);
    return b->mean;
}

/* The readout that ends an entrywise program at the output: *out (lower triangle, both with
 * full) = alpha·V_φ(k) + beta, or with phi NULL alpha·w_a w_c·k_ac + beta (w NULL: 1; beta ≠ 0
 * only for m = 1, where a bias term is a constant). */
typedef struct ew_readout {
    const tpk_phi *phi;
    double alpha, beta;
    const double *w;
    double **out;
    const double *pool; /* N × m: *out (N×N) = alpha·Σ_pq pool_ap pool_cq V_φ(k)_(ap)(cq) + beta
                         * instead (pair programs only: ew_pairwise) */
} ew_readout;

static int ew_flush(fl *F, int k, const ew_readout *ro, int full);

/* Second moments of block k, (N m)². */
static const double *block_m2(fl *F, int k)
{
    fblock *b = &F->b[k];
    touch(F, k);
    if (b->pend != NULL && !F->dry) /* a pending block: its entrywise program runs now */
        return ew_flush(F, k, NULL, 0) ? NULL : F->b[k].M2;
    if (b->kind == BK_GAUSS && b->fi == -2 && b->M2 == NULL && !F->dry) { /* the input block */
        size_t n = F->N * F->T;
        if ((b->M2 = fl_big(F, n * n, sizeof *b->M2, 0)) == NULL)
            return NULL;
        if (tpk_dsyrk_lower(TPK_NO_TRANS, n, F->d, 1.0 / (double)F->d, F->x, F->d, 0.0, b->M2, n,
                            F->X.ctx)) {
            tpk_free(F->X.ctx, b->M2);
            b->M2 = NULL;
            return NULL;
        }
        b->lower = 1;
    }
    if (b->kind == BK_GAUSS && b->Fac != NULL && b->M2 == NULL && !F->dry) {
        size_t n = F->N * (size_t)b->m;
        if ((b->M2 = fl_big(F, n * n, sizeof *b->M2, 0)) == NULL)
            return NULL;
        /* the lower triangle: most readers need no more (block_m2_full mirrors it) */
        if (tpk_dsyrk_lower(TPK_NO_TRANS, n, (size_t)b->rank, 1.0, b->Fac, (size_t)b->rank, 0.0,
                            b->M2, n, F->X.ctx)) {
            fl_release(F, b->M2, n * n * sizeof *b->M2);
            b->M2 = NULL;
            return NULL;
        }
        b->lower = 1;
    }
    if (b->kind == BK_BIAS && b->M2 == NULL && !F->dry) {
        size_t n = F->N * (size_t)b->m, m = (size_t)b->m;
        if ((b->M2 = fl_big(F, n * n, sizeof *b->M2, 1)) == NULL)
            return NULL;
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < n; j++)
                b->M2[i * n + j] = (i % m == j % m ? b->s[i % m] : 0) +
                                   (b->mean ? b->mean[i] * b->mean[j] : 0);
    }
    if (b->kind == BK_NONLIN)
        touch(F, b->arg);
    if (b->kind == BK_NONLIN && b->M2 == NULL && nonlin_moments(F, k))
        return NULL;
    if (!F->dry && b->kind == BK_GAUSS && b->M2 == NULL && F->X.ctx->status == TPK_OK) {
        /* its matrix went to a block made from it (read again after the plan's last use): never
         * a silent NULL — the unrolled form computes what this one cannot */
        NSR_UNSUP(&F->X, NULL, "a block read after its matrix was given to another (line %d)",
                  b->line);
        return NULL;
    }
    return b->M2;
}

static int ensure_ws(fl *F)
{
    if (F->ws == NULL && (F->ws = tpk_gauss_ws_alloc(TPK_GAUSS_DEFAULT_DEGREE, F->X.ctx)) == NULL)
        return F->X.ctx->status;
    return TPK_OK;
}

/* The workspace where φ's maps need one (quadrature); a closed form needs none, and building
 * the Gauss–Hermite rules costs more than a small layer's map. */
static int ensure_ws_for(fl *F, const tpk_phi *phi)
{
    return tpk_phi_has_closed_form(phi) ? TPK_OK : ensure_ws(F);
}

static const double *block_m2_full(fl *F, int k)
{
    if (F->b[k].pend != NULL && !F->dry) /* both triangles from the plan's tiles, no mirror */
        return ew_flush(F, k, NULL, 1) ? NULL : F->b[k].M2;
    const double *M = block_m2(F, k);
    fblock *b = &F->b[k];
    if (M != NULL && b->lower) {
        nsr_ew_mirror(b->M2, F->N * (size_t)b->m);
        b->lower = 0;
    }
    return M;
}

/* φ(u) block: E[φ(u_p)φ(u_q)] over the block by the library's whole-matrix maps (zero means),
 * or entry by entry with means (theory §3). */
static int nonlin_moments(fl *F, int k)
{
    size_t n = F->N * (size_t)F->b[k].m;
    if (F->dry || n == 0)
        return TPK_OK;
    if (block_m2(F, F->b[k].arg) == NULL) /* a factor block makes its matrix now */
        return F->X.ctx->status ? F->X.ctx->status : TPK_ENOMEM;
    fblock *b = &F->b[k];
    fblock *u = &F->b[b->arg];
    int zero_mean = 1;
    if (u->mean)
        for (size_t i = 0; i < n && zero_mean; i++)
            zero_mean = u->mean[i] == 0;
    /* φ(g) where g dies here and the statement reads it through this block alone (a CNN's
     * h = φ(g) read by the next layer's taps): the map runs over g's matrix and this block takes
     * it (take_matrix; matmul_acc does the same for W·φ(g)). S: g's moments, read in place. */
    const double *S = u->M2;
    double *M2 = zero_mean ? take_matrix(F, b->arg, b->m) : NULL;
    const int in_place = M2 != NULL;
    if (!in_place)
        M2 = fl_big(F, n * n, sizeof *M2, 0);
    double *mean = nsr_fam_alloc(&F->X, n, sizeof *mean);
    if (M2 == NULL || mean == NULL || ensure_ws(F)) {
        if (in_place)
            fl_release(F, M2, n * n * sizeof *M2);
        else
            tpk_free(F->X.ctx, M2);
        tpk_free(F->X.ctx, mean);
        return F->X.ctx->status;
    }
    double e = 0;
    int st = TPK_OK;
    if (zero_mean) {
        /* the means first: an in-place map overwrites the diagonal they read */
        for (size_t i = 0; st == TPK_OK && i < n; i++) {
            tpk_estimate r;
            st = tpk_gauss_expect1(b->phi, 0, S[i * n + i], F->ws, &r, F->X.ctx);
            mean[i] = r.value;
            e = fmax(e, r.err);
        }
        /* the lower triangle only: the tuned maps serve it (ReLU), and most readers need no more */
        double em = 0;
        if (st == TPK_OK)
            st = tpk_gauss_map_affine_lower(b->phi, S, n, 1.0, 0.0, M2, F->ws, &em, F->X.ctx);
        e = fmax(e, em);
    } else {
        for (size_t i = 0; st == TPK_OK && i < n; i++) {
            double mi = u->mean[i], qi = S[i * n + i] - mi * mi;
            tpk_estimate r;
            st = tpk_gauss_expect1(b->phi, mi, fmax(qi, 0), F->ws, &r, F->X.ctx);
            mean[i] = r.value;
            for (size_t j = 0; st == TPK_OK && j <= i; j++) {
                double mj = u->mean[j], qj = S[j * n + j] - mj * mj;
                double kij = S[i * n + j] - mi * mj;
                st = tpk_gauss_expect2_quad(b->phi, b->phi, mi, mj, fmax(qi, 0), fmax(qj, 0), kij,
                                            F->ws, &r, F->X.ctx);
                M2[i * n + j] = M2[j * n + i] = r.value;
                e = fmax(e, r.err);
            }
        }
    }
    if (st) {
        if (in_place) /* a block's matrix, freed (or pooled) like any */
            fl_release(F, M2, n * n * sizeof *M2);
        else
            tpk_free(F->X.ctx, M2);
        tpk_free(F->X.ctx, mean);
        return nsr_fam_err(&F->X, st, NULL, "%s", F->X.ctx->msg);
    }
    F->err = fmax(F->err, e);
    b->M2 = M2;
    b->mean = mean;
    b->lower = zero_mean;
    return TPK_OK;
}

/* P = E[X Yᵀ] for blocks x ≠ y or x = y, as (N m_x) × (N m_y) with leading dimension ld;
 * returns a pointer into the store (x = y) or fills buf. NULL with *st set on failure;
 * *zero = 1 when P = 0 (independent, zero means). */
static const double *pair_m2(fl *F, int x, int y, double **bufp, int *zero, int *st, int full,
                             int indep)
{
    *zero = 0;
    *st = TPK_OK;
    touch(F, x);
    touch(F, y);
    if (x == y) {
        const double *M = full ? block_m2_full(F, x) : block_m2(F, x);
        if (M == NULL && !F->dry)
            *st = F->X.ctx->status ? F->X.ctx->status : TPK_ENOMEM;
        return M;
    }
    fblock *bx = &F->b[x], *by = &F->b[y];
    if (!indep && correlated(bx, by)) {
        if (bx->kind == BK_NONLIN && by->kind == BK_NONLIN && bx->arg == by->arg) {
            /* two functions of one Gaussian block: entry by entry */
            if (F->dry)
                return NULL;
            if (block_m2_full(F, bx->arg) == NULL) {
                *st = F->X.ctx->status ? F->X.ctx->status : TPK_ENOMEM;
                return NULL;
            }
            const fblock *u = &F->b[bx->arg];
            size_t n = F->N * (size_t)bx->m;
            if (ensure_ws(F)) {
                *st = F->X.ctx->status;
                return NULL;
            }
            double *buf = *bufp ? *bufp : (*bufp = nsr_fam_alloc(&F->X, n * n, sizeof *buf));
            if (buf == NULL) {
                *st = F->X.ctx->status;
                return NULL;
            }
            for (size_t i = 0; i < n; i++)
                for (size_t j = 0; j < n; j++) {
                    double mi = u->mean ? u->mean[i] : 0, mj = u->mean ? u->mean[j] : 0;
                    tpk_estimate r;
                    if ((*st = tpk_gauss_expect2_quad(bx->phi, by->phi, mi, mj,
                                                      u->M2[i * n + i] - mi * mi,
                                                      u->M2[j * n + j] - mj * mj,
                                                      u->M2[i * n + j] - mi * mj, F->ws, &r,
                                                      F->X.ctx)))
                        return NULL;
                    buf[i * n + j] = r.value;
                    F->err = fmax(F->err, r.err);
                }
            return buf;
        }
        *st = NSR_UNSUP(&F->X, NULL, "correlated terms of different kinds (line %d and line %d) in one "
                    "expectation", bx->line, by->line);
        return NULL;
    }
    if (F->dry)
        return NULL;
    const double *mx = block_mean(F, x), *my = block_mean(F, y);
    if (F->X.ctx->status) {
        *st = F->X.ctx->status;
        return NULL;
    }
    if (mx == NULL || my == NULL) {
        *zero = 1;
        return NULL;
    }
    size_t nx = F->N * (size_t)bx->m, ny = F->N * (size_t)by->m;
    double *buf = *bufp ? *bufp : (*bufp = nsr_fam_alloc(&F->X, nx * ny, sizeof *buf));
    if (buf == NULL) {
        *st = F->X.ctx->status;
        return NULL;
    }
    for (size_t i = 0; i < nx; i++)
        for (size_t j = 0; j < ny; j++)
            buf[i * ny + j] = mx[i] * my[j];
    return buf;
}

/* Member p read at point p, with weights (per input and point) allowed. */
static int is_identity_gather(const term *t, long m)
{
    if (t->dense)
        return 0;
    for (long p = 0; p < m; p++)
        if (t->idx[p] != p)
            return 0;
    return 1;
}

static int is_identity_term(const term *t, long m)
{
    return t->w == NULL && is_identity_gather(t, m);
}

/* Non-decreasing gather: a symmetric pair of it reads only the lower triangle of its block
 * ((a, idx p) ≥ (c, idx q) whenever (a, p) ≥ (c, q)). */
static int monotone(const int *idx, size_t m)
{
    for (size_t p = 1; p < m; p++)
        if (idx[p] < idx[p - 1])
            return 0;
    return 1;
}

/* 1 when x is NULL or its n entries are all zero. */
static int all_zero(const double *x, size_t n)
{
    for (size_t i = 0; x != NULL && i < n; i++)
        if (x[i] != 0)
            return 0;
    return 1;
}

/* E[u] of a LIN value: mu + Σ_t C_t E[X_t]; N·m into out. */
static int lin_mean(fl *F, const val *u, double *out, int *nonzero)
{
    size_t N = F->N, m = (size_t)u->m;
    *nonzero = u->mu != NULL;
    for (size_t i = 0; i < N * m; i++)
        out[i] = u->mu ? u->mu[i] : 0;
    for (int k = 0; k < u->nt; k++) {
        const term *t = &u->t[k];
        const double *mx = block_mean(F, t->blk);
        if (F->X.ctx->status)
            return F->X.ctx->status;
        if (mx == NULL)
            continue;
        *nonzero = 1;
        size_t ms = (size_t)F->b[t->blk].m;
        for (size_t a = 0; a < N; a++)
            for (size_t p = 0; p < m; p++) {
                double acc = 0;
                if (t->dense) {
                    const double *row = t->w + (a * m + p) * ms;
                    for (size_t q = 0; q < ms; q++)
                        acc += row[q] * mx[a * ms + q];
                } else if (t->idx[p] >= 0) {
                    acc = (t->w ? t->w[a * m + p] : 1) * mx[a * ms + (size_t)t->idx[p]];
                }
                out[a * m + p] += acc;
            }
    }
    return TPK_OK;
}

/* Dense per-input map of a term: N × m × ms (gather expanded). */
static double *term_dense(fl *F, const term *t, size_t m)
{
    size_t N = F->N, ms = (size_t)F->b[t->blk].m;
    if (t->dense)
        return t->w;
    double *w = nsr_fam_alloc(&F->X, N * m * ms, sizeof *w);
    if (w == NULL)
        return NULL;
    for (size_t a = 0; a < N; a++)
        for (size_t p = 0; p < m; p++)
            if (t->idx[p] >= 0)
                w[(a * m + p) * ms + (size_t)t->idx[p]] = t->w ? t->w[a * m + p] : 1;
    return w;
}

/* ext[p] = 1 + the last non-zero column of row p of W (m × n), 0 for a zero row. */
static void row_extents(const double *W, size_t m, size_t n, int *ext)
{
    for (size_t p = 0; p < m; p++) {
        size_t q = n;
        while (q > 0 && W[p * n + q - 1] == 0)
            q--;
        ext[p] = (int)q;
    }
}

#define SW_TILE 256 /* rows per GEMM tile of the sandwich */

/* out (mu × mv, ld) += Wt (mu × mt) · P (mt × ms, ldp) · Wsᵀ (Ws: mv × ms), by tpk_dgemm in
 * row tiles whose inner dimension stops at the tile's last non-zero column (a causal attention
 * matrix is lower triangular: about half the flops); lower: only q ≤ p of out is needed (a
 * diagonal block of a symmetric result). tmp: mu × ms. */
static int sandwich(fl *F, const double *Wt, size_t mu, size_t mt, const int *et, const double *P,
                    size_t ldp, const double *Ws, size_t mv, size_t ms, const int *es, double *out,
                    size_t ld, int lower, double *tmp, double alpha)
{
    int st = TPK_OK;
    for (size_t p0 = 0; p0 < mu && st == TPK_OK; p0 += SW_TILE) {
        size_t p1 = p0 + SW_TILE < mu ? p0 + SW_TILE : mu, K = 0;
        for (size_t p = p0; p < p1; p++)
            K = (size_t)et[p] > K ? (size_t)et[p] : K;
        if (K == 0) {
            memset(tmp + p0 * ms, 0, (p1 - p0) * ms * sizeof *tmp);
            continue;
        }
        st = tpk_dgemm(TPK_NO_TRANS, TPK_NO_TRANS, p1 - p0, ms, K, 1.0, Wt + p0 * mt, mt, P, ldp,
                       0.0, tmp + p0 * ms, ms, F->X.ctx);
    }
    for (size_t p0 = 0; p0 < mu && st == TPK_OK; p0 += SW_TILE) {
        size_t p1 = p0 + SW_TILE < mu ? p0 + SW_TILE : mu;
        size_t qend = lower ? p1 : mv;
        for (size_t q0 = 0; q0 < qend && st == TPK_OK; q0 += SW_TILE) {
            size_t q1 = q0 + SW_TILE < qend ? q0 + SW_TILE : qend, K = 0;
            for (size_t q = q0; q < q1; q++)
                K = (size_t)es[q] > K ? (size_t)es[q] : K;
            if (K == 0)
                continue;
            st = tpk_dgemm(TPK_NO_TRANS, TPK_TRANS, p1 - p0, q1 - q0, K, alpha, tmp + p0 * ms, ms,
                           Ws + q0 * ms, ms, 1.0, out + p0 * ld + q0, ld, F->X.ctx);
        }
    }
    return st;
}

/* out(a, c) += alpha · L_a · P(a, c) · L_cᵀ for every input pair c ≤ a, when each input's map
 * L_a (m × m) is lower triangular — causal attention's I + A (theory §2.7): the sandwich as two
 * triangular products per pair (tpk_dtrmm, half the flops of dense GEMMs, and large calls: the
 * left product covers P(a, 0..a) at once). P is the full (N m)² block, row stride ldp. */
static int tri_sandwich(fl *F, const double *L, size_t m, const double *P, size_t ldp, double *out,
                        size_t ld, double alpha)
{
    size_t N = F->N, bytes = m * N * m * sizeof(double);
    double *tmp = fl_big(F, m * N * m, sizeof *tmp, 0);
    if (tmp == NULL)
        return F->X.ctx->status;
    int st = TPK_OK;
    for (size_t a = 0; a < N && st == TPK_OK; a++) {
        size_t w = (a + 1) * m; /* P(a, c) for c ≤ a: the first w columns of rows a·m.. */
        for (size_t p = 0; p < m; p++)
            memcpy(tmp + p * w, P + (a * m + p) * ldp, w * sizeof *tmp);
        st = tpk_dtrmm(TPK_LEFT, TPK_LOWER, TPK_NO_TRANS, m, w, 1.0, L + a * m * m, m, tmp, w,
                       F->X.ctx);
        for (size_t c = 0; c <= a && st == TPK_OK; c++) {
            st = tpk_dtrmm(TPK_RIGHT, TPK_LOWER, TPK_TRANS, m, m, alpha, L + c * m * m, m,
                           tmp + c * m, w, F->X.ctx);
            if (st)
                break;
            int diag = c == a; /* a diagonal pair: its lower triangle is what is read */
#pragma omp parallel for schedule(static) if (m >= 256)
            for (size_t p = 0; p < m; p++) {
                const double *src = tmp + p * w + c * m;
                double *dst = out + (a * m + p) * ld + c * m;
                size_t qn = diag ? p + 1 : m;
                for (size_t q = 0; q < qn; q++)
                    dst[q] += src[q];
            }
        }
    }
    fl_release(F, tmp, bytes);
    return st;
}

/* A factor Fac (n × r) is kept instead of the (N m)² matrix when r ≤ n / FAC_RATIO. */
#define FAC_RATIO 4

/* C·Fac for one term on a factor block (theory §2.7: a Gram of rank d stays rank d through
 * linear maps), (N m) × rank, times scale: a gather picks and weights rows; a dense map
 * multiplies each input's rows (tpk_dtrmm when it is lower triangular, as causal attention's
 * I + A). NULL when the block has no factor, or on error (ctx set). */
static double *term_factor(fl *F, const term *t, size_t m, double scale, long *rank)
{
    const fblock *b = &F->b[t->blk];
    if (b->kind != BK_GAUSS || b->Fac == NULL || b->mean != NULL)
        return NULL;
    size_t N = F->N, ms = (size_t)b->m, r = (size_t)b->rank;
    double *G = nsr_fam_alloc(&F->X, N * m * r, sizeof *G);
    if (G == NULL)
        return NULL;
    int st = TPK_OK;
    for (size_t a = 0; a < N && st == TPK_OK; a++) {
        const double *Fa = b->Fac + a * ms * r;
        double *Ga = G + a * m * r;
        if (!t->dense) {
            for (size_t p = 0; p < m; p++)
                if (t->idx[p] >= 0) {
                    double w = scale * (t->w ? t->w[a * m + p] : 1);
                    const double *src = Fa + (size_t)t->idx[p] * r;
                    for (size_t q = 0; q < r; q++)
                        Ga[p * r + q] = w * src[q];
                }
            continue;
        }
        const double *W = t->w + a * m * ms;
        int tri = m == ms;
        for (size_t p = 0; p < m && tri; p++)
            for (size_t q = p + 1; q < ms && tri; q++)
                tri = W[p * ms + q] == 0;
        if (tri) {
            memcpy(Ga, Fa, m * r * sizeof *Ga);
            st = tpk_dtrmm(TPK_LEFT, TPK_LOWER, TPK_NO_TRANS, m, r, scale, W, ms, Ga, r, F->X.ctx);
        } else {
            st = tpk_dgemm(TPK_NO_TRANS, TPK_NO_TRANS, m, r, ms, scale, W, ms, Fa, r, 0.0, Ga, r,
                           F->X.ctx);
        }
    }
    if (st) {
        tpk_free(F->X.ctx, G);
        return NULL;
    }
    *rank = b->rank;
    return G;
}

/* The factor of a value that is one term on a factor block with no constant part: 1 (and *G),
 * 0 when it is not, −1 on error. */
static int factor_of(fl *F, const val *u, double scale, double **G, long *rank)
{
    *G = NULL;
    if (F->dry || u->kind != V_LIN || u->nt != 1 || !all_zero(u->mu, F->N * (size_t)u->m))
        return 0;
    const fblock *b = &F->b[u->t[0].blk];
    if (b->Fac == NULL || (size_t)b->rank * FAC_RATIO > F->N * (size_t)u->m)
        return 0;
    *G = term_factor(F, &u->t[0], (size_t)u->m, scale, rank);
    if (*G == NULL)
        return F->X.ctx->status ? -1 : 0;
    touch(F, u->t[0].blk);
    return 1;
}

/* Terms on one block merge into one dense map when any of them is dense (attention's k + Σ a k
 * is (I + A)·k: one sandwich instead of four). */
static int v_merge(fl *F, val *v)
{
    size_t N = F->N, m = (size_t)v->m;
    for (int i = 0; i < v->nt; i++)
        for (int j = i + 1; j < v->nt; j++) {
            term *a = &v->t[i], *b = &v->t[j];
            if (a->blk != b->blk || (!a->dense && !b->dense))
                continue;
            size_t ms = (size_t)F->b[a->blk].m;
            if (!F->dry) {
                if (!a->dense) {
                    double *w = term_dense(F, a, m);
                    if (w == NULL)
                        return F->X.ctx->status;
                    tpk_free(F->X.ctx, a->w);
                    tpk_free(F->X.ctx, a->idx);
                    a->w = w;
                    a->idx = NULL;
                }
                if (b->dense) {
                    for (size_t k = 0; k < N * m * ms; k++)
                        a->w[k] += b->w[k];
                } else {
                    for (size_t x = 0; x < N; x++)
                        for (size_t p = 0; p < m; p++)
                            if (b->idx[p] >= 0)
                                a->w[(x * m + p) * ms + (size_t)b->idx[p]] += b->w ? b->w[x * m + p] : 1;
                }
            } else if (!a->dense) {
                tpk_free(F->X.ctx, a->idx);
                a->idx = NULL;
            }
            a->dense = 1;
            tpk_free(F->X.ctx, b->w);
            tpk_free(F->X.ctx, b->idx);
            v->t[j] = v->t[--v->nt];
            j--;
        }
    return TPK_OK;
}

/* out (N mu × N mv, ld) += Σ_{t,s} C_t E[X_t X_sᵀ] C_sᵀ + mean terms: E[u vᵀ] for LIN values.
 * sym: u = v, and only the lower triangle needs to be right (it is mirrored). */
/* Terms t (mt points) and s (ms points) on different blocks known independent at the member
 * level (pair_m2's indep): a read of initial G-var members the other block never read. */
static int terms_indep(const fl *F, const term *t, long mt, const term *s, long ms)
{
    if (F->b[s->blk].kind == BK_BIAS)
        return !term_correlated(F, &F->b[t->blk], s, ms);
    if (F->b[t->blk].kind == BK_BIAS)
        return !term_correlated(F, &F->b[s->blk], t, mt);
    return 0;
}

static int lin_m2(fl *F, const val *u, const val *v, double *out, size_t ld, int sym,
                  double alpha)
{
    size_t N = F->N, mu = (size_t)u->m, mv = (size_t)v->m;
    int st = TPK_OK;
    for (int i = 0; i < u->nt && st == TPK_OK; i++)
        for (int j = 0; j < v->nt && st == TPK_OK; j++) {
            const term *t = &u->t[i], *s = &v->t[j];
            if (sym && j > i)
                continue; /* the (j, i) pair is the transpose of (i, j): added below */
            size_t mt = (size_t)F->b[t->blk].m, ms = (size_t)F->b[s->blk].m;
            double *buf = NULL; /* pair_m2's, made only when it writes one */
            if (t->blk == s->blk && F->b[t->blk].kind == BK_BIAS && !t->dense && !s->dense) {
                /* initial G-var members: E[b_i b_j] = var_i δ_ij + μ_i μ_j, shared by all inputs
                 * (theory §1.2), without the (N m)² matrix */
                touch(F, t->blk);
                tpk_free(F->X.ctx, buf);
                if (F->dry)
                    continue;
                const fblock *bb = &F->b[t->blk];
                int twice_b = sym && i != j;
                int same = i == j && t->w == NULL && mu > 0 && t->idx[0] >= 0;
                for (size_t p = 1; same && p < mu; p++)
                    same = t->idx[p] == t->idx[0];
                if (same && sym) { /* one member broadcast to every point: a constant */
                    size_t i0 = (size_t)t->idx[0];
                    double cst = alpha * (bb->s[i0] + (bb->mean ? bb->mean[i0] * bb->mean[i0] : 0));
                    size_t n = N * mu;
                    /* a pass over the triangle per layer: over the threads (it was 10 % of an
                     * MLP N = 2048 run on one, the other spinning) */
#pragma omp parallel for schedule(dynamic, 64) if (n >= 512)
                    for (size_t r = 0; r < n; r++) {
                        double *orow = out + r * ld;
                        for (size_t q = 0; q <= r; q++)
                            orow[q] += cst;
                    }
                    continue;
                }
                for (int pass = 0; pass < 1 + twice_b; pass++) {
                    const term *x = pass ? s : t, *y = pass ? t : s;
                    for (size_t a = 0; a < N; a++)
                        for (size_t p = 0; p < mu; p++) {
                            int ip = x->idx[p];
                            if (ip < 0)
                                continue;
                            double wp = alpha * (x->w ? x->w[a * mu + p] : 1);
                            double mi = bb->mean ? bb->mean[(size_t)ip] : 0;
                            double *orow = out + (a * mu + p) * ld;
                            size_t cmax = sym ? a + 1 : N;
                            for (size_t c = 0; c < cmax; c++) {
                                size_t qmax = sym && c == a ? p + 1 : mv;
                                const double *wy = y->w ? y->w + c * mv : NULL;
                                for (size_t q = 0; q < qmax; q++) {
                                    int iq = y->idx[q];
                                    if (iq < 0)
                                        continue;
                                    double e = (iq == ip ? bb->s[ip] : 0) +
                                               (bb->mean ? mi * bb->mean[(size_t)iq] : 0);
                                    orow[c * mv + q] += wp * (wy ? wy[q] : 1) * e;
                                }
                            }
                        }
                }
                continue;
            }
            if (sym && i == j && !F->dry && F->b[t->blk].Fac != NULL && F->b[t->blk].M2 == NULL) {
                /* a factor block: C·E[X Xᵀ]·Cᵀ = (C Fac)(C Fac)ᵀ, one rank-r update */
                long r = 0;
                double *G = term_factor(F, t, mu, 1.0, &r);
                tpk_free(F->X.ctx, buf);
                if (G == NULL)
                    return F->X.ctx->status ? F->X.ctx->status : TPK_ENOMEM;
                touch(F, t->blk);
                st = tpk_dsyrk_lower(TPK_NO_TRANS, N * mu, (size_t)r, alpha, G, (size_t)r, 1.0, out,
                                     ld, F->X.ctx); /* sym: the lower triangle is read */
                tpk_free(F->X.ctx, G);
                continue;
            }
            int zero;
            /* the lower triangle serves a symmetric identity pair: (a,p) ≥ (c,q) reads only it */
            int full = !(sym && i == j && !t->dense && monotone(t->idx, mu));
            int indep = t->blk != s->blk && terms_indep(F, t, u->m, s, v->m);
            const double *P = pair_m2(F, t->blk, s->blk, &buf, &zero, &st, full, indep);
            if (st || F->dry || zero) {
                tpk_free(F->X.ctx, buf);
                continue;
            }
            size_t ldp = N * ms;
            int twice = sym && i != j; /* (i,j) and (j,i) */
            if (!t->dense && !s->dense) {
                /* s reading its block in order (s->idx[q] = q): contiguous, vectorised rows */
                int sid = mv <= ms;
                for (size_t q = 0; q < mv && sid; q++)
                    sid = s->idx[q] == (int)q;
#pragma omp parallel for schedule(dynamic, 16) if (N * mu >= 1024 && N * mu * mv >= (1u << 20))
                for (size_t r = 0; r < N * mu; r++) {
                    size_t a = r / mu, p = r % mu;
                    int ip = t->idx[p];
                    if (ip < 0)
                        continue;
                    double wp = alpha * (t->w ? t->w[a * mu + p] : 1);
                    const double *Prow = P + (a * mt + (size_t)ip) * ldp;
                    double *orow = out + (a * mu + p) * ld;
                    size_t cmax = sym ? a + 1 : N;
                    for (size_t c = 0; c < cmax; c++) {
                        size_t qmax = sym && c == a ? p + 1 : mv;
                        const double *Pc = Prow + c * ms;
                        const double *ws = s->w ? s->w + c * mv : NULL;
                        double *oc = orow + c * mv;
                        if (sid && ws) {
                            for (size_t q = 0; q < qmax; q++)
                                oc[q] += wp * ws[q] * Pc[q];
                        } else if (sid) {
                            for (size_t q = 0; q < qmax; q++)
                                oc[q] += wp * Pc[q];
                        } else {
                            for (size_t q = 0; q < qmax; q++) {
                                int iq = s->idx[q];
                                if (iq >= 0)
                                    oc[q] += wp * (ws ? ws[q] : 1) * Pc[iq];
                            }
                        }
                    }
                }
                if (twice) { /* the transposed pair: out[(a,p),(c,q)] += C_s P' C_tᵀ */
                    for (size_t a = 0; a < N; a++)
                        for (size_t p = 0; p < mu; p++) {
                            int ip = s->idx[p];
                            if (ip < 0)
                                continue;
                            double wp = alpha * (s->w ? s->w[a * mu + p] : 1);
                            double *orow = out + (a * mu + p) * ld;
                            for (size_t c = 0; c <= a; c++) {
                                size_t qmax = c == a ? p + 1 : mv;
                                for (size_t q = 0; q < qmax; q++) {
                                    int iq = t->idx[q];
                                    if (iq >= 0)
                                        orow[c * mv + q] += wp * (t->w ? t->w[c * mv + q] : 1) *
                                                            P[(c * mt + (size_t)iq) * ldp + a * ms + (size_t)ip];
                                }
                            }
                        }
                }
                tpk_free(F->X.ctx, buf);
                continue;
            }
            /* dense: per input pair, out(a,c) += W_t(a) P(a,c) W_s(c)ᵀ by GEMM */
            double *Wt = term_dense(F, t, mu), *Ws = term_dense(F, s, mv);
            double *tmp = nsr_fam_alloc(&F->X, mu * ms, sizeof *tmp);
            if (Wt == NULL || Ws == NULL || tmp == NULL) {
                if (Wt != t->w)
                    tpk_free(F->X.ctx, Wt);
                if (Ws != s->w)
                    tpk_free(F->X.ctx, Ws);
                tpk_free(F->X.ctx, tmp), tpk_free(F->X.ctx, buf);
                return F->X.ctx->status;
            }
            int *et = nsr_fam_alloc(&F->X, N * mu, sizeof *et), *es = nsr_fam_alloc(&F->X, N * mv, sizeof *es);
            if (et == NULL || es == NULL)
                st = F->X.ctx->status;
            for (size_t a = 0; st == TPK_OK && a < N; a++) {
                row_extents(Wt + a * mu * mt, mu, mt, et + a * mu);
                row_extents(Ws + a * mv * ms, mv, ms, es + a * mv);
            }
            /* one term against itself with a lower-triangular map per input: triangular products */
            int tri = st == TPK_OK && sym && i == j && mu == mt;
            for (size_t r = 0; tri && r < N * mu; r++)
                tri = (size_t)et[r] <= r % mu + 1;
            if (tri)
                st = tri_sandwich(F, Wt, mu, P, ldp, out, ld, alpha);
            for (size_t a = 0; a < N && st == TPK_OK && !tri; a++)
                for (size_t c = 0; c < (sym ? a + 1 : N) && st == TPK_OK; c++) {
                    const double *Pac = P + (a * mt) * ldp + c * ms;
                    st = sandwich(F, Wt + a * mu * mt, mu, mt, et + a * mu, Pac, ldp,
                                  Ws + c * mv * ms, mv, ms, es + c * mv, out + (a * mu) * ld + c * mv,
                                  ld, sym && a == c && !twice, tmp, alpha);
                    if (st == TPK_OK && twice) { /* + (W_s(a) P(c,a)ᵀ... ) = transpose pair */
                        const double *Pca = P + (c * mt) * ldp + a * ms;
                        /* W_s(a) · P(c,a)ᵀ · W_t(c)ᵀ */
                        double *tmp2 = nsr_fam_alloc(&F->X, mv * mt, sizeof *tmp2);
                        if (tmp2 == NULL) {
                            st = F->X.ctx->status;
                            break;
                        }
                        st = tpk_dgemm(TPK_NO_TRANS, TPK_TRANS, mv, mt, ms, 1.0, Ws + a * mv * ms, ms,
                                       Pca, ldp, 0.0, tmp2, mt, F->X.ctx);
                        if (st == TPK_OK)
                            st = tpk_dgemm(TPK_NO_TRANS, TPK_TRANS, mv, mu, mt, alpha, tmp2, mt,
                                           Wt + c * mu * mt, mt, 1.0, out + (a * mu) * ld + c * mv,
                                           ld, F->X.ctx);
                        tpk_free(F->X.ctx, tmp2);
                    }
                }
            tpk_free(F->X.ctx, et), tpk_free(F->X.ctx, es);
            if (Wt != t->w)
                tpk_free(F->X.ctx, Wt);
            if (Ws != s->w)
                tpk_free(F->X.ctx, Ws);
            tpk_free(F->X.ctx, tmp);
            tpk_free(F->X.ctx, buf);
        }
    if (st || F->dry)
        return st;
    /* mean terms: E[uvᵀ] = E[LLᵀ] + μ_u m_vᵀ + m_u μ_vᵀ − μ_u μ_vᵀ (m = full first moment);
     * none when both constant parts vanish (LN's g − mean(g) of a centred g) */
    if (!all_zero(u->mu, N * mu) || !all_zero(v->mu, N * mv)) {
        double *mU = nsr_fam_alloc(&F->X, N * mu, sizeof *mU), *mV = nsr_fam_alloc(&F->X, N * mv, sizeof *mV);
        int nz;
        if (mU == NULL || mV == NULL || lin_mean(F, u, mU, &nz) || lin_mean(F, v, mV, &nz)) {
            tpk_free(F->X.ctx, mU), tpk_free(F->X.ctx, mV);
            return F->X.ctx->status;
        }
#pragma omp parallel for schedule(dynamic, 16) if (N * mu >= 1024)
        for (size_t i = 0; i < N * mu; i++)
            for (size_t j = 0; j < (sym ? i + 1 : N * mv); j++) {
                double a = u->mu ? u->mu[i] : 0, b = v->mu ? v->mu[j] : 0;
                out[i * ld + j] += alpha * (a * mV[j] + mU[i] * b - a * b);
            }
        tpk_free(F->X.ctx, mU), tpk_free(F->X.ctx, mV);
    }
    return TPK_OK;
}

/* The upper triangle of each m×m diagonal block of an (N·m)² matrix from its lower one. */
static void mirror_diagonal_blocks(double *M, size_t N, size_t m)
{
    const size_t n = N * m;
#pragma omp parallel for schedule(dynamic, 32) if (n > 512)
    for (size_t r = 0; r < n; r++) {
        size_t a = r / m, i = r % m;
        for (size_t j = i + 1; j < m; j++)
            M[r * n + a * m + j] = M[(a * m + j) * n + r];
    }
}

/* ---- pending entrywise blocks (ewplan-impl.h; docs/orchestration.md §7) ------------------- */

/* The statement being evaluated (the last one while the outputs are read at the end). */
static const nsr_stmt *cur_stmt(const fl *F)
{
    int k = F->X.cur < 0 ? 0 : F->X.cur >= F->X.R->nfi ? F->X.R->nfi - 1 : F->X.cur;
    return F->X.R->nfi > 0 ? F->X.R->fi[k].stmt : NULL;
}
static int cur_line(const fl *F)
{
    return cur_stmt(F) ? cur_stmt(F)->line : 0;
}
static int cur_col(const fl *F)
{
    return cur_stmt(F) ? cur_stmt(F)->col : 0;
}

/* Block x's diagonal into out (N m): a pending block's own, a matrix's, a factor's row norms, or
 * the input Gram's; NULL-free. */
static int block_diag(fl *F, int x, double *out)
{
    fblock *b = &F->b[x];
    size_t n = F->N * (size_t)b->m;
    if (b->pend) {
        memcpy(out, b->pend->diag, n * sizeof *out);
        return TPK_OK;
    }
    if (b->M2 == NULL && b->Fac != NULL) {
        size_t r = (size_t)b->rank;
        for (size_t i = 0; i < n; i++) {
            double acc = 0;
            for (size_t q = 0; q < r; q++)
                acc += b->Fac[i * r + q] * b->Fac[i * r + q];
            out[i] = acc;
        }
        return TPK_OK;
    }
    if (b->M2 == NULL && b->fi == -2) { /* the input block: (1/d) x xᵀ */
        for (size_t i = 0; i < n; i++) {
            double acc = 0;
            for (size_t q = 0; q < F->d; q++)
                acc += F->x[i * F->d + q] * F->x[i * F->d + q];
            out[i] = acc / (double)F->d;
        }
        return TPK_OK;
    }
    const double *M = block_m2(F, x);
    if (M == NULL)
        return F->X.ctx->status ? F->X.ctx->status : TPK_ENOMEM;
    for (size_t i = 0; i < n; i++)
        out[i] = M[i * n + i];
    return TPK_OK;
}

/* Can block x be read by a pending node: a zero-mean Gaussian block of m members whose matrix
 * is there or can be made (not one whose matrix was given away)? */
static int ew_leafable(const fl *F, int x, long m)
{
    const fblock *b = &F->b[x];
    return b->kind == BK_GAUSS && b->mean == NULL && b->m == m &&
           (b->pend != NULL || b->M2 != NULL || b->Fac != NULL || b->fi == -2);
}

/* A block's name in plan reports: its family's, else "input" or "block". */
static const char *block_label(const fl *F, int x)
{
    const fblock *b = &F->b[x];
    if (b->fi == -2)
        return "input";
    if (b->fam >= 0 && b->fam < F->X.C->nsym)
        return F->X.C->sym[b->fam].name;
    return "block";
}

static void ew_name(nsr_ew_node *nd, const char *what, int line)
{
    snprintf(nd->name, sizeof nd->name, "%s@%d", what, line);
}

/* A new pending block's diagonal: nsr_ew_diag on the node with its arguments as leaves. */
static int pend_diag(fl *F, pend *P, size_t n)
{
    nsr_ew_node tmp[NSR_EW_MAXT + 1];
    double *d[NSR_EW_MAXT] = {NULL};
    int na = 0, st = TPK_OK;
    nsr_ew_node me = P->nd;
    if (me.op == NSR_EW_PHI || me.op == NSR_EW_CONV) {
        memset(&tmp[0], 0, sizeof tmp[0]);
        if ((d[0] = nsr_fam_alloc(&F->X, n, sizeof *d[0])) == NULL ||
            (st = block_diag(F, me.arg, d[0])) != TPK_OK)
            goto done;
        tmp[0].op = NSR_EW_LEAF;
        tmp[0].diag = d[0];
        me.arg = na++;
    } else {
        for (int t = 0; t < me.nt; t++) {
            if (me.t[t].arg < 0)
                continue;
            memset(&tmp[na], 0, sizeof tmp[na]);
            if ((d[na] = nsr_fam_alloc(&F->X, n, sizeof *d[na])) == NULL ||
                (st = block_diag(F, me.t[t].arg, d[na])) != TPK_OK)
                goto done;
            tmp[na].op = NSR_EW_LEAF;
            tmp[na].diag = d[na];
            me.t[t].arg = na++;
        }
    }
    tmp[na] = me;
    if ((P->diag = nsr_fam_alloc(&F->X, n, sizeof *P->diag)) == NULL)
        goto done;
    double e = 0;
    if (me.phi != NULL && (st = ensure_ws_for(F, me.phi)) != TPK_OK)
        goto done;
    st = nsr_ew_diag(tmp, na, n, (long)(n / F->N), F->ws, F->X.R->file, P->diag, &e, F->X.ctx);
    F->err = fmax(F->err, e);
done:
    for (int i = 0; i < NSR_EW_MAXT; i++)
        tpk_free(F->X.ctx, d[i]);
    if (st == TPK_OK && F->X.ctx->status)
        st = F->X.ctx->status;
    return st;
}

/* A pending node never attached (nothing pinned). */
static void pend_discard(fl *F, pend *P)
{
    for (int t = 0; t < NSR_EW_MAXT; t++) {
        tpk_free(F->X.ctx, P->w[t]);
        tpk_free(F->X.ctx, P->s[t]);
        tpk_free(F->X.ctx, P->cls[t]);
    }
    tpk_free(F->X.ctx, P->diag);
    tpk_free(F->X.ctx, P);
}

/* Block k becomes pending as P (its diagonal made, its arguments pinned); P is k's or freed. */
static int pend_attach(fl *F, int k, pend *P)
{
    size_t n = F->N * (size_t)F->b[k].m;
    int st = pend_diag(F, P, n);
    if (st) {
        pend_discard(F, P);
        return st;
    }
    if (P->nd.op == NSR_EW_PHI || P->nd.op == NSR_EW_CONV)
        F->b[P->nd.arg].pins++;
    for (int t = 0; P->nd.op == NSR_EW_SUM && t < P->nd.nt; t++)
        if (P->nd.t[t].arg >= 0)
            F->b[P->nd.t[t].arg].pins++;
    fblock *b = &F->b[k];
    b->pend = P;
    b->lower = 1;
    return TPK_OK;
}

static pend *pend_new(fl *F, int op, int line, int col)
{
    pend *P = nsr_fam_alloc(&F->X, 1, sizeof *P);
    if (P == NULL)
        return NULL;
    memset(P, 0, sizeof *P);
    P->nd.op = op;
    ew_name(&P->nd, op == NSR_EW_PHI ? "map" : op == NSR_EW_CONV ? "conv" : "sum", line);
    P->nd.line = line;
    P->nd.col = col;
    return P;
}

/* u as a pending sum, where it is one: identity gathers (per-index weights allowed) of distinct
 * zero-mean Gaussian or bias blocks of u's members, independent two by two — so that entry
 * (a, c) of its second moments is Σ_t w_t,a w_t,c E[x_t,a x_t,c], no cross terms (theory
 * §1.6). 1: *out is P; 0: not of that form; −1: error. */
static int ew_sum_of(fl *F, const val *u, int line, int col, pend **out)
{
    *out = NULL;
    size_t N = F->N, m = (size_t)u->m;
    if (F->dry || u->kind != V_LIN || u->nt < 1 || u->nt > NSR_EW_MAXT || !all_zero(u->mu, N * m))
        return 0;
    int gauss = 0;
    for (int i = 0; i < u->nt; i++) {
        const term *t = &u->t[i];
        const fblock *b = &F->b[t->blk];
        if (t->dense)
            return 0;
        if (b->kind == BK_BIAS) {
            /* initial G-var members: E[b_idx[p] b_idx[q]] = var where idx[p] = idx[q] (one
             * member read at several points: a CNN layer's bias at every position) */
            if (b->mean != NULL || b->s == NULL)
                return 0;
        } else if (is_identity_gather(t, u->m) && ew_leafable(F, t->blk, u->m)) {
            gauss++;
        } else {
            return 0;
        }
        for (int j = 0; j < i; j++) {
            const term *s = &u->t[j];
            if (s->blk == t->blk ||
                (!terms_indep(F, t, u->m, s, u->m) && correlated(b, &F->b[s->blk])))
                return 0;
        }
    }
    if (gauss == 0)
        return 0;
    pend *P = pend_new(F, NSR_EW_SUM, line, col);
    if (P == NULL)
        return -1;
    P->nd.nt = u->nt;
    for (int i = 0; i < u->nt; i++) {
        const term *t = &u->t[i];
        nsr_ew_term *T = &P->nd.t[i];
        T->c = 1.0;
        if (t->w != NULL) {
            if ((P->w[i] = nsr_fam_alloc(&F->X, N * m, sizeof *P->w[i])) == NULL)
                break;
            memcpy(P->w[i], t->w, N * m * sizeof *P->w[i]);
            T->w = P->w[i];
        }
        if (F->b[t->blk].kind == BK_BIAS) {
            T->arg = -1;
            if ((P->s[i] = nsr_fam_alloc(&F->X, m, sizeof *P->s[i])) == NULL)
                break;
            int shared = 0;
            for (size_t p = 0; p < m; p++) {
                P->s[i][p] = t->idx[p] >= 0 ? F->b[t->blk].s[t->idx[p]] : 0.0;
                for (size_t q = 0; q < p && t->idx[p] >= 0 && !shared; q++)
                    shared = t->idx[q] == t->idx[p];
            }
            T->s = P->s[i];
            if (shared) {
                if ((P->cls[i] = nsr_fam_alloc(&F->X, m, sizeof *P->cls[i])) == NULL)
                    break;
                memcpy(P->cls[i], t->idx, m * sizeof *P->cls[i]);
                T->cls = P->cls[i];
            }
        } else {
            T->arg = t->blk;
        }
        touch(F, t->blk);
    }
    if (F->X.ctx->status) {
        pend_discard(F, P);
        return -1;
    }
    *out = P;
    return 1;
}

/* The number of arguments of pending block x and its t-th (a block id, or −1 for a bias). */
static int pend_nargs(const fl *F, int x)
{
    const pend *P = F->b[x].pend;
    return P == NULL ? 0 : P->nd.op == NSR_EW_SUM ? P->nd.nt : 1;
}
static int pend_arg(const fl *F, int x, int t)
{
    const pend *P = F->b[x].pend;
    return P->nd.op == NSR_EW_SUM ? P->nd.t[t].arg : P->nd.arg;
}

/* The blocks under pending block k (and k), arguments before their readers (a depth-first
 * post-order: block ids are not one, an atom is made before the argument of its map). */
static int ew_collect(fl *F, int k, int *ids, int *nn, int cap)
{
    char *state = nsr_fam_alloc(&F->X, (size_t)F->nb, 1); /* 0 new, 1 open, 2 done */
    int *stack = nsr_fam_alloc(&F->X, (size_t)F->nb, sizeof *stack);
    int *next = nsr_fam_alloc(&F->X, (size_t)F->nb, sizeof *next);
    int st = TPK_OK, top = 0;
    *nn = 0;
    if (state == NULL || stack == NULL || next == NULL) {
        st = F->X.ctx->status;
        goto done;
    }
    memset(state, 0, (size_t)F->nb);
    stack[top++] = k;
    state[k] = 1;
    next[k] = 0;
    while (top > 0 && st == TPK_OK) {
        int x = stack[top - 1];
        if (next[x] < pend_nargs(F, x)) {
            int y = pend_arg(F, x, next[x]++);
            if (y >= 0 && state[y] == 0) {
                state[y] = 1;
                next[y] = 0;
                stack[top++] = y;
            }
            continue;
        }
        top--;
        state[x] = 2;
        if (*nn == cap)
            st = TPK_ERROR(F->X.ctx, TPK_ENOMEM, "internal: entrywise program too large");
        else
            ids[(*nn)++] = x;
    }
done:
    tpk_free(F->X.ctx, next);
    tpk_free(F->X.ctx, stack);
    tpk_free(F->X.ctx, state);
    return st;
}

/* Is the entrywise program under pending block k a pair program (a convolution in it)? 0 also
 * on failure (with the status in the context). */
static int ew_pairwise(fl *F, int k)
{
    int cap = F->nb + 1, nn = 0, pairs = 0;
    int *ids = nsr_fam_alloc(&F->X, (size_t)cap, sizeof *ids);
    if (ids != NULL && ew_collect(F, k, ids, &nn, cap) == TPK_OK)
        for (int i = 0; i < nn; i++)
            pairs |= F->b[ids[i]].pend != NULL && F->b[ids[i]].pend->nd.op == NSR_EW_CONV;
    tpk_free(F->X.ctx, ids);
    return pairs;
}

/* Run the entrywise program under pending block k (ewplan-impl.h): with ro NULL, k's matrix (k
 * is no longer pending); else ro's readout of k into *ro->out, k left pending — where *ro->out
 * was a block of the caller's allocator that may be replaced (freed) by a leaf's. */
static int ew_flush(fl *F, int k, const ew_readout *ro, int full)
{
    size_t n = F->N * (size_t)F->b[k].m;
    int cap = F->nb + 1, nn = 0, st;
    int *ids = nsr_fam_alloc(&F->X, (size_t)cap, sizeof *ids);
    int *at = nsr_fam_alloc(&F->X, (size_t)F->nb, sizeof *at);
    nsr_ew_node *nd = nsr_fam_alloc(&F->X, (size_t)cap, sizeof *nd);
    double **ld = nsr_fam_alloc(&F->X, (size_t)cap, sizeof *ld);
    if (ids == NULL || at == NULL || nd == NULL || ld == NULL) {
        st = F->X.ctx->status;
        goto done;
    }
    memset(ld, 0, (size_t)cap * sizeof *ld);
    if ((st = ew_collect(F, k, ids, &nn, cap)) != TPK_OK)
        goto done;
    int pairs = 0; /* a pair program (netsor/ewpair.c) */
    for (int i = 0; i < nn; i++)
        pairs |= F->b[ids[i]].pend != NULL && F->b[ids[i]].pend->nd.op == NSR_EW_CONV;
    for (int i = 0; i < nn && st == TPK_OK; i++) {
        int x = ids[i];
        at[x] = i;
        const pend *P = F->b[x].pend;
        if (P != NULL) {
            nd[i] = P->nd;
            nd[i].diag = P->diag;
            if (nd[i].op == NSR_EW_PHI || nd[i].op == NSR_EW_CONV)
                nd[i].arg = at[nd[i].arg];
            for (int t = 0; nd[i].op == NSR_EW_SUM && t < nd[i].nt; t++)
                if (nd[i].t[t].arg >= 0)
                    nd[i].t[t].arg = at[nd[i].t[t].arg];
            continue;
        }
        memset(&nd[i], 0, sizeof nd[i]);
        nd[i].op = NSR_EW_LEAF;
        ew_name(&nd[i], block_label(F, x), F->b[x].line);
        if (pairs && F->b[x].fi == -2 && F->b[x].M2 == NULL && F->d <= 8) {
            /* a pair program reads the inputs' Gram per pair (a rank-d product of the pair's
             * rows: few channels, RGB or grey), not the (N m)² matrix first */
            nd[i].x = F->x;
            nd[i].d = F->d;
        } else if ((nd[i].M = block_m2(F, x)) == NULL) {
            st = F->X.ctx->status ? F->X.ctx->status : TPK_ENOMEM;
            break;
        }
        if ((ld[i] = nsr_fam_alloc(&F->X, n, sizeof *ld[i])) == NULL) {
            st = F->X.ctx->status;
            break;
        }
        nsr_ew_diag(nd, i, n, F->b[x].m, NULL, NULL, ld[i], NULL, F->X.ctx); /* a leaf's: read */
        nd[i].diag = ld[i];
    }
    double *dphi = NULL;
    int root = nn - 1;
    const double beta = ro ? ro->beta : 0.0;
    if (st == TPK_OK && ro != NULL && ro->pool != NULL) { /* pooled: by input pairs */
        const nsr_ew_reduce red = {ro->phi, ro->alpha, ro->beta, ro->pool};
        double e = 0;
        if (!pairs)
            st = TPK_ERROR(F->X.ctx, TPK_EINVAL, "internal: a pooled readout of a program that "
                           "is not by input pairs");
        if (st == TPK_OK && ro->phi != NULL)
            st = ensure_ws_for(F, ro->phi);
        for (int i = 0; st == TPK_OK && i < nn; i++)
            if (nd[i].phi != NULL)
                st = ensure_ws_for(F, nd[i].phi);
        if (st == TPK_OK)
            st = nsr_ew_eval_pairs(nd, nn, root, n, F->b[k].m, F->ws, F->X.R->file,
                                   F->plan_report, *ro->out, 1, &red, &e, NULL, F->X.ctx);
        if (st == TPK_OK)
            F->err = fmax(F->err, e);
        goto done;
    }
    if (st == TPK_OK && ro != NULL) { /* the readout: a map over k, or a scaled k */
        memset(&nd[nn], 0, sizeof nd[nn]);
        if (ro->phi != NULL) {
            nd[nn].op = NSR_EW_PHI;
            nd[nn].arg = root;
            nd[nn].phi = ro->phi;
            nd[nn].alpha = ro->alpha;
            nd[nn].beta = ro->beta;
        } else {
            nd[nn].op = NSR_EW_SUM;
            nd[nn].nt = 1;
            nd[nn].t[0] = (nsr_ew_term){.arg = root, .c = ro->alpha, .w = ro->w};
            if (beta != 0.0) /* m = 1 (the caller's): a bias term is a constant */
                nd[nn].t[nd[nn].nt++] = (nsr_ew_term){.arg = -1, .c = 1.0, .s = &beta};
        }
        ew_name(&nd[nn], "readout", cur_line(F));
        nd[nn].line = cur_line(F); /* the readout's failures: at the output statement */
        nd[nn].col = cur_col(F);
        root = nn++;
        if ((dphi = nsr_fam_alloc(&F->X, n, sizeof *dphi)) == NULL ||
            (st = nsr_ew_diag(nd, root, n, F->b[k].m, F->ws, F->X.R->file, dphi, NULL,
                              F->X.ctx)) != TPK_OK)
            st = F->X.ctx->status ? F->X.ctx->status : TPK_ENOMEM;
        nd[root].diag = dphi;
    }
    double *M = NULL;
    /* The result may go over a leaf's matrix that nothing reads afterwards (each kernel reads an
     * entry before it writes it): no fresh block, whose first touch costs more than the maps
     * (a CNN layer's block is (N·784)²). Such a leaf: any, at the readout at the end; else one
     * the plan has freed already whose pending readers are all k (made now) or moot — freed by
     * the plan too, with only k or moot blocks reading them: nothing reads through them again
     * (a transformer layer's attention output, under LayerNorm, residual and feed-forward). */
    int donor = -1;
    const int at_end = ro != NULL && F->X.cur == F->X.R->nfi && F->final_out != NULL;
    const int ndag = ro != NULL ? nn - 1 : nn;
    int *refs = st == TPK_OK ? nsr_fam_alloc(&F->X, (size_t)ndag, sizeof *refs) : NULL;
    if (refs != NULL && ro == NULL) {
        memset(refs, 0, (size_t)ndag * sizeof *refs);
        for (int i = ndag - 1; i >= 0; i--) { /* readers before their arguments */
            const fblock *x = &F->b[ids[i]];
            int gone = i == ndag - 1 || (x->pend != NULL && x->dead && x->pins == refs[i]);
            for (int a = 0; gone && a < pend_nargs(F, ids[i]); a++)
                if (pend_arg(F, ids[i], a) >= 0)
                    refs[at[pend_arg(F, ids[i], a)]]++;
        }
    }
    for (int i = 0; st == TPK_OK && i < ndag && donor < 0; i++) {
        if (nd[i].op != NSR_EW_LEAF)
            continue;
        const fblock *x = &F->b[ids[i]];
        if (nd[i].M == NULL || x->M2 != nd[i].M || x->m != F->b[k].m)
            continue;
        if (at_end || (refs != NULL && ro == NULL && x->dead && x->pins == refs[i]))
            donor = ids[i];
    }
    tpk_free(F->X.ctx, refs);
    if (st == TPK_OK && ro == NULL && donor < 0 && (M = fl_big(F, n * n, sizeof *M, 0)) == NULL)
        st = F->X.ctx->status;
    for (int i = 0; st == TPK_OK && i < nn; i++)
        if (nd[i].phi != NULL)
            st = ensure_ws_for(F, nd[i].phi);
    double e = 0;
    if (st == TPK_OK && F->plan_verify && !pairs) { /* every candidate exactly, first */
        nsr_ew_verified v;
        st = nsr_ew_verify(nd, nn, root, n, F->b[k].m, 1, 0, &v, F->X.ctx);
        if (st == TPK_OK && v.mismatch)
            st = TPK_ERROR(F->X.ctx, TPK_ENUMERIC, "%s: internal: the executor's kernel for %s "
                           "differs from its reference at entry (%zu, %zu) in the Z_p check",
                           F->X.R->file, v.what, v.row, v.col);
        if (st == TPK_OK && F->plan_report)
            fprintf(F->plan_report, "exact check of %s (Z_p twin): %d kernel runs of every "
                    "candidate, all equal to the reference\n", nd[root].name, v.kernels);
    }
    if (st == TPK_OK)
        st = nsr_ew_eval(nd, nn, root, n, F->b[k].m,
                         F->plan_kind | (F->plan_signatures ? NSR_PLAN_SIGNATURES : 0) |
                             (F->plan_signatures > 1 ? NSR_PLAN_CANDIDATES : 0), F->ws, &F->cal,
                         F->X.R->file, F->plan_report,
                         donor >= 0 ? F->b[donor].M2 : ro ? *ro->out : M, donor < 0, full, &e,
                         NULL, F->X.ctx);
    tpk_free(F->X.ctx, dphi);
    if (st == TPK_OK && donor >= 0) { /* the result is the leaf's matrix now */
        if (ro != NULL) {
            tpk_free(F->X.ctx, *ro->out);
            *ro->out = F->b[donor].M2;
        } else {
            M = F->b[donor].M2;
        }
        F->b[donor].M2 = NULL;
    }
    if (st == TPK_OK) {
        F->err = fmax(F->err, e);
        if (ro == NULL) {
            fblock *b = &F->b[k];
            pend *P = b->pend;
            b->pend = NULL;
            b->M2 = M;
            b->lower = !full;
            M = NULL;
            pend_free(F, P);
        }
    }
    if (M != NULL)
        fl_release(F, M, n * n * sizeof *M);
done:
    for (int i = 0; ld && i < cap; i++)
        tpk_free(F->X.ctx, ld[i]);
    tpk_free(F->X.ctx, ld);
    tpk_free(F->X.ctx, nd);
    tpk_free(F->X.ctx, at);
    tpk_free(F->X.ctx, ids);
    return st;
}

/* A Gaussian block holding the LIN value u (its second and first moments). */
/* u = L·x for block x dying here, L lower triangular per input (causal attention's (I + A)·k, one
 * dense term): the two triangular products of tri_sandwich run in x's own matrix, which becomes
 * the result's (lower triangle); no zeroed block, no copy, no add. 1 when done (*M2 set), 0 when
 * u is not of that form, −1 on error. */
static int tri_in_place(fl *F, const val *u, double **M2)
{
    *M2 = NULL;
    if (u->nt != 1 || !u->t[0].dense || !all_zero(u->mu, F->N * (size_t)u->m))
        return 0;
    int x = u->t[0].blk;
    const fblock *bx = &F->b[x];
    size_t N = F->N, m = (size_t)u->m, n = N * m;
    if (bx->kind != BK_GAUSS || bx->M2 == NULL || bx->pins > 0 || bx->mean != NULL ||
        (size_t)bx->m != m || !plan_get(F, 1) || x >= F->nplan || F->plan[x] != F->X.cur)
        return 0;
    const double *W = u->t[0].w; /* N × m × m */
    for (size_t a = 0; a < N; a++)
        for (size_t p = 0; p < m; p++)
            for (size_t q = p + 1; q < m; q++)
                if (W[(a * m + p) * m + q] != 0)
                    return 0;
    /* the products read the lower block triangle and both triangles of the diagonal blocks:
     * a block stored lower-only has those mirrored, not the whole matrix */
    double *P = (double *)block_m2(F, x);
    if (P == NULL)
        return -1;
    if (F->b[x].lower)
        mirror_diagonal_blocks(P, N, m);
    touch(F, x);
    /* blocks (a, c ≤ a) ← L_a P_ac L_cᵀ: each row slab of them times L_a, then each column
     * slab (rows from c's own down) times L_cᵀ — 2N tall products, not N²/2 of m × m */
    for (size_t a = 0; a < N; a++)
        if (tpk_dtrmm(TPK_LEFT, TPK_LOWER, TPK_NO_TRANS, m, (a + 1) * m, 1.0, W + a * m * m, m,
                      P + a * m * n, n, F->X.ctx))
            return -1;
    for (size_t c = 0; c < N; c++)
        if (tpk_dtrmm(TPK_RIGHT, TPK_LOWER, TPK_TRANS, n - c * m, m, 1.0, W + c * m * m, m,
                      P + c * m * n + c * m, n, F->X.ctx))
            return -1;
    F->b[x].M2 = NULL; /* now the result's */
    *M2 = P;
    return 1;
}

static int materialize(fl *F, val *u, int fam, int *out)
{
    for (int k = 0; k < u->nt; k++) {
        int kind = F->b[u->t[k].blk].kind;
        if (kind == BK_NONLIN)
            return NSR_UNSUP(&F->X, NULL, "a function of an H-var that is not Gaussian (a Nonlin of a "
                         "Nonlin): write the composition as one function");
    }
    if (v_merge(F, u))
        return F->X.ctx->status;
    int k = new_block(F, BK_GAUSS, fam, u->m);
    if (k < 0)
        return F->X.ctx->status;
    fblock *b = &F->b[k];
    b->nanc = 0;
    b->line = cur_line(F);
    for (int i = 0; i < u->nt; i++)
        anc_union_term(F, &F->b[k], &u->t[i], u->m);
    if (!F->dry) {
        size_t n = F->N * (size_t)u->m;
        double *G = NULL;
        long rank = 0;
        int fo = factor_of(F, u, 1.0, &G, &rank);
        if (fo < 0)
            return F->X.ctx->status;
        if (fo > 0) { /* stays low rank: its matrix is made only if a reader needs it */
            b = &F->b[k];
            b->Fac = G;
            b->rank = rank;
            *out = k;
            return TPK_OK;
        }
        pend *P = NULL; /* a sum of independent blocks: pending (LayerNorm's w·g, g + W·φ + b) */
        int es = ew_sum_of(F, u, cur_line(F), cur_col(F), &P);
        if (es < 0 || (es > 0 && pend_attach(F, k, P)))
            return F->X.ctx->status;
        if (es > 0) {
            *out = k;
            return TPK_OK;
        }
        /* a block that dies here and is the value's identity term lends its matrix:
         * g = (conv atom) + b adds b in place instead of copying the atom — where the value is
         * the statement's own (fam >= 0) or the statement reads its blocks once: φ(g) twice in
         * one statement materialises g twice, and the second needs the atom the first took */
        int x = u->t[0].blk, steal = 0;
        const fblock *bx = &F->b[x];
        if (plan_get(F, 1) && x < F->nplan && F->plan[x] == F->X.cur && bx->kind == BK_GAUSS &&
            (fam >= 0 || stmt_reads_once(F)) &&
            bx->fi != -2 && bx->M2 && bx->pins == 0 && bx->mean == NULL && bx->m == u->m &&
            is_identity_gather(&u->t[0], u->m)) {
            steal = 1;
            for (int i = 1; i < u->nt && steal; i++)
                steal = u->t[i].blk != x && !term_correlated(F, bx, &u->t[i], u->m);
        }
        double *M2 = NULL, *mean = nsr_fam_alloc(&F->X, n, sizeof *mean);
        int nz = 0, st = mean == NULL ? F->X.ctx->status : TPK_OK;
        int tri = st == TPK_OK && !steal ? tri_in_place(F, u, &M2) : 0;
        if (tri < 0)
            st = F->X.ctx->status ? F->X.ctx->status : TPK_ENOMEM;
        if (tri != 0) {
            /* done (or failed) in place */
        } else if (st == TPK_OK && steal) {
            M2 = F->b[x].M2;
            F->b[x].M2 = NULL;
            const double *w = u->t[0].w; /* LN's 1/√(v + ε): M2_pq ← w_p w_q M2_pq, in place */
            if (w != NULL) {
#pragma omp parallel for schedule(dynamic, 64) if (n >= 512)
                for (size_t r = 0; r < n; r++)
                    for (size_t c = 0; c <= r; c++)
                        M2[r * n + c] *= w[r] * w[c];
            }
            val rest = *u;
            rest.t = u->t + 1;
            rest.nt = u->nt - 1;
            st = lin_m2(F, &rest, &rest, M2, n, 1, 1.0);
        } else if (st == TPK_OK) {
            if ((M2 = fl_big(F, n * n, sizeof *M2, 1)) == NULL)
                st = F->X.ctx->status;
            else
                st = lin_m2(F, u, u, M2, n, 1, 1.0);
        }
        if (st == TPK_OK)
            st = lin_mean(F, u, mean, &nz);
        if (st == TPK_OK && nz) { /* means that are exactly zero are no means (LN's g − m) */
            nz = 0;
            for (size_t i = 0; i < n && !nz; i++)
                nz = mean[i] != 0;
        }
        if (st) {
            tpk_free(F->X.ctx, M2), tpk_free(F->X.ctx, mean);
            return F->X.ctx->status;
        }
        b = &F->b[k];
        b->M2 = M2;
        b->lower = 1;
        if (nz) {
            b->mean = mean;
        } else {
            tpk_free(F->X.ctx, mean);
        }
    } else {
        lin_m2(F, u, u, NULL, 0, 1, 1.0); /* touches the bases, checks support */
    }
    *out = k;
    return F->X.ctx->status;
}

/* ---- expressions ------------------------------------------------------------------------- */

static int eval(fl *F, const nsr_expr *e, const nsr_fdom *D, val *out);

/* A number over the domain (index arithmetic, parameters, loop indices): a constant when it
 * reads no domain index, else one value per point (the same for every input). */
static int number_value(fl *F, const nsr_expr *e, const nsr_fdom *D, val *out)
{
    double c;
    if (!nsr_reads_syms(e, D->sym, D->nv, 0)) {
        if (nsr_fam_num(&F->X, e, &c))
            return F->X.ctx->status;
        return v_const(out, D->m, c);
    }
    v_const(out, D->m, 0);
    if (v_scal(F, out))
        return F->X.ctx->status;
    for (long p = 0; p < D->m; p++) {
        nsr_bind_point(&F->X, D, p);
        if (nsr_fam_num(&F->X, e, &c)) {
            val_free(F, out);
            return F->X.ctx->status;
        }
        for (size_t a = 0; a < F->N; a++)
            out->s[a * (size_t)D->m + (size_t)p] = c;
    }
    return TPK_OK;
}

/* The family instruction block holding member idx of family sym, or −1 (and *mem). */
static int find_block(fl *F, int sym, const int *idx, long *mem)
{
    for (int k = F->nb - 1; k >= 0; k--) {
        const fblock *b = &F->b[k];
        if (b->fam != sym || b->fi >= F->X.cur)
            continue;
        long r = nsr_trie_find(&b->tr, idx);
        if (r >= 0) {
            *mem = r;
            return k;
        }
    }
    return -1;
}

static int bias_block(fl *F, int sym, int *out);

/* A stored combination of this many terms or more becomes a Gaussian block of its own when it is
 * first read: a residual stream g_l = g_{l-1} + α W_l h_{l-1} is otherwise expanded again into
 * all l terms at every layer, O(L²) passes over the matrix where the recursion makes one per
 * layer (theory §2.9). Two-term sums (attention's f + h) stay combinations. */
#define MIX_MATERIALIZE 3

/* Block k (BK_MIX) in place as a Gaussian block (its number is kept: the plan's liveness is per
 * block); left as it is when a term is not Gaussian (a φ block: E[φ·g] is read term by term). */
static int mix_to_gauss(fl *F, int k)
{
    const val *u = &F->b[k].mix;
    for (int i = 0; i < u->nt; i++) {
        int kind = F->b[u->t[i].blk].kind;
        if (kind != BK_GAUSS && kind != BK_BIAS)
            return TPK_OK;
    }
    size_t n = F->N * (size_t)F->b[k].m;
    pend *P = NULL; /* independent terms: a pending sum, no matrix yet */
    int es = ew_sum_of(F, u, F->b[k].line, F->b[k].col, &P);
    if (es < 0)
        return F->X.ctx->status;
    if (es > 0) {
        fblock *b = &F->b[k];
        val_free(F, &b->mix);
        b->kind = BK_GAUSS;
        b->mean = NULL;
        return pend_attach(F, k, P);
    }
    double *M2 = NULL, *mean = NULL;
    int nz = 0, st;
    if (F->dry) {
        st = lin_m2(F, u, u, NULL, 0, 1, 1.0); /* touches the terms, checks support */
    } else if ((M2 = fl_big(F, n * n, sizeof *M2, 1)) == NULL ||
               (mean = nsr_fam_alloc(&F->X, n, sizeof *mean)) == NULL) {
        st = F->X.ctx->status;
    } else if ((st = lin_m2(F, u, u, M2, n, 1, 1.0)) == TPK_OK &&
               (st = lin_mean(F, u, mean, &nz)) == TPK_OK && nz) {
        nz = !all_zero(mean, n); /* exactly zero means are no means (LN's g − m) */
    }
    fblock *b = &F->b[k];
    if (st) {
        fl_release(F, M2, n * n * sizeof *M2);
        tpk_free(F->X.ctx, mean);
        return st;
    }
    if (!nz) {
        tpk_free(F->X.ctx, mean);
        mean = NULL;
    }
    val_free(F, &b->mix);
    b->kind = BK_GAUSS;
    b->M2 = M2;
    b->mean = mean;
    b->lower = 1;
    return TPK_OK;
}

/* f[idx...] over the domain: a scalar family, a vector family (gather), or a G-decl. */
static int eval_name(fl *F, const nsr_expr *e, const nsr_fdom *D, val *out)
{
    const nsr_sym *y = &F->X.C->sym[e->sym];
    if (y->kind == NSR_SYM_PARAM || y->kind == NSR_SYM_LOOP) {
        if (e->nidx)
            return nsr_fam_err(&F->X, TPK_ETYPE, e, "'%s' is a number, not a family", e->name);
        return number_value(F, e, D, out);
    }
    if (y->kind == NSR_SYM_GFAM) {
        int k = -1, nonzero = 0;
        for (int i = 0; i < F->X.R->ndm && !nonzero; i++)
            nonzero = F->X.R->dm[i].sym == e->sym && (F->X.R->dm[i].var != 0 || F->X.R->dm[i].mean != 0);
        if (!nonzero) /* N(0, 0): the zero vector (σ_b² = 0 biases cost nothing) */
            return v_const(out, D->m, 0);
        if (bias_block(F, e->sym, &k))
            return F->X.ctx->status;
        int *idx = nsr_fam_alloc(&F->X, (size_t)D->m, sizeof *idx);
        if (idx == NULL)
            return F->X.ctx->status;
        const fblock *b = &F->b[k];
        int vary = nsr_reads_syms(e, D->sym, D->nv, 0);
        for (long p = 0; p < D->m; p++) {
            if (vary || p == 0) {
                nsr_bind_point(&F->X, D, p);
                int t[NSR_MAX_INDICES];
                for (int i = 0; i < e->nidx; i++)
                    if (nsr_fam_int(&F->X, e->idx[i], &t[i])) {
                        tpk_free(F->X.ctx, idx);
                        return F->X.ctx->status;
                    }
                long r = nsr_trie_find(&b->tr, t);
                if (r < 0) {
                    tpk_free(F->X.ctx, idx);
                    return nsr_fam_err(&F->X, TPK_ETYPE, e, "%s has no such member", e->name);
                }
                idx[p] = (int)r;
            } else {
                idx[p] = idx[0];
            }
        }
        return v_gather(F, out, D->m, k, idx);
    }
    if (y->kind != NSR_SYM_DFAM)
        return NSR_UNSUP(&F->X, e, "'%s' cannot be read here", e->name);
    /* a defined family: resolve each point's member, one term per block met */
    int vary = nsr_reads_syms(e, D->sym, D->nv, 0);
    int *idx = NULL, blk = -1, k0 = -1;
    long first = -1;
    v_const(out, D->m, 0);
    int is_scal = -1;
    double *sv = NULL;
    nsr_imap A;
    int affine = vary && nsr_imap_of(&F->X, e, D, &A);
    int kfast = -1; /* the block every check has passed for: its next points take the short way */
    for (long p = 0; p < D->m; p++) {
        int t[NSR_MAX_INDICES];
        long mem = -1;
        int k;
        if (affine)
            nsr_imap_at(&A, &D->val[p * D->nv], t);
        if (kfast >= 0 && (!vary || (affine && (mem = nsr_trie_find(&F->b[kfast].tr, t)) >= 0))) {
            if (!vary)
                mem = first;
            if (sv != NULL) {
                const fblock *bf = &F->b[kfast];
                for (size_t a = 0; !F->dry && a < F->N; a++)
                    sv[a * (size_t)D->m + (size_t)p] = bf->s[a * (size_t)bf->m + (size_t)mem];
            } else {
                idx[p] = (int)mem;
            }
            continue;
        }
        if (vary || p == 0) {
            if (!affine) {
                nsr_bind_point(&F->X, D, p);
                for (int i = 0; i < e->nidx; i++)
                    if (nsr_fam_int(&F->X, e->idx[i], &t[i])) {
                        tpk_free(F->X.ctx, idx), tpk_free(F->X.ctx, sv);
                        return F->X.ctx->status;
                    }
            }
            k = k0 >= 0 && (mem = nsr_trie_find(&F->b[k0].tr, t)) >= 0 ? k0 : find_block(F, e->sym, t, &mem);
            if (k < 0) {
                tpk_free(F->X.ctx, idx), tpk_free(F->X.ctx, sv);
                char buf[80] = "";
                size_t n = 0;
                for (int i = 0; i < e->nidx && n < sizeof buf; i++)
                    n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%d", i ? "," : "", t[i]);
                return nsr_fam_err(&F->X, TPK_ETYPE, e, "%s[%s] is read but not defined before (members "
                              "are defined for %s)", e->name, buf, y->ranges[0] ? y->ranges : "?");
            }
        } else {
            k = k0;
            mem = first;
        }
        if (p == 0)
            first = mem;
        k0 = k;
        fblock *b = &F->b[k];
        touch(F, k);
        if (b->kind == BK_ZERO)
            continue;
        int sc = b->kind == BK_SCAL;
        if (is_scal < 0)
            is_scal = sc;
        if (is_scal != sc) {
            tpk_free(F->X.ctx, idx), tpk_free(F->X.ctx, sv);
            return NSR_UNSUP(&F->X, e, "%s mixes scalar and vector members in one read", e->name);
        }
        if (sc) {
            if (sv == NULL && (sv = nsr_fam_alloc(&F->X, F->N * (size_t)D->m, sizeof *sv)) == NULL)
                return F->X.ctx->status;
            if (!F->dry)
                for (size_t a = 0; a < F->N; a++)
                    sv[a * (size_t)D->m + (size_t)p] = b->s[a * (size_t)b->m + (size_t)mem];
            kfast = k;
            continue;
        }
        if (blk >= 0 && blk != k) {
            tpk_free(F->X.ctx, idx), tpk_free(F->X.ctx, sv);
            return NSR_UNSUP(&F->X, e, "a read of %s spans several definitions (lines %d and %d)", e->name,
                         F->b[blk].line, b->line);
        }
        if (idx == NULL) {
            if ((idx = nsr_fam_alloc(&F->X, (size_t)D->m, sizeof *idx)) == NULL)
                return F->X.ctx->status;
            for (long q = 0; q < D->m; q++)
                idx[q] = -1;
        }
        blk = k;
        idx[p] = (int)mem;
        kfast = k;
    }
    if (sv != NULL) {
        out->kind = V_SCAL;
        out->s = sv;
        return TPK_OK;
    }
    if (blk < 0)
        return v_const(out, D->m, 0); /* only padding members */
    if (F->b[blk].kind == BK_MIX && F->b[blk].mix.nt >= MIX_MATERIALIZE && mix_to_gauss(F, blk)) {
        tpk_free(F->X.ctx, idx);
        return F->X.ctx->status;
    }
    fblock *b = &F->b[blk];
    if (b->kind != BK_MIX)
        return v_gather(F, out, D->m, blk, idx);
    /* a stored combination: compose the gathers */
    const val *s = &b->mix;
    memset(out, 0, sizeof *out);
    out->kind = V_LIN;
    out->m = D->m;
    size_t N = F->N, m = (size_t)D->m, mb = (size_t)b->m;
    out->t = nsr_fam_alloc(&F->X, (size_t)s->nt, sizeof *out->t);
    if (out->t == NULL) {
        tpk_free(F->X.ctx, idx);
        return F->X.ctx->status;
    }
    out->nt = s->nt;
    for (int i = 0; i < s->nt; i++) {
        term *t = &out->t[i];
        t->blk = s->t[i].blk;
        touch(F, t->blk);
        t->idx = nsr_fam_alloc(&F->X, m, sizeof *t->idx);
        t->w = s->t[i].w ? nsr_fam_alloc(&F->X, N * m, sizeof *t->w) : NULL;
        if (t->idx == NULL || (s->t[i].w && t->w == NULL)) {
            tpk_free(F->X.ctx, idx);
            val_free(F, out); /* the terms made so far (the rest are zeroed) */
            return F->X.ctx->status;
        }
        for (size_t p = 0; p < m; p++) {
            t->idx[p] = idx[p] < 0 ? -1 : s->t[i].idx[idx[p]];
            if (t->w)
                for (size_t a = 0; a < N; a++)
                    t->w[a * m + p] = idx[p] < 0 ? 0 : s->t[i].w[a * mb + (size_t)idx[p]];
        }
    }
    if (s->mu) {
        if ((out->mu = nsr_fam_alloc(&F->X, N * m, sizeof *out->mu)) == NULL) {
            tpk_free(F->X.ctx, idx);
            val_free(F, out);
            return F->X.ctx->status;
        }
        for (size_t p = 0; p < m; p++)
            for (size_t a = 0; a < N; a++)
                out->mu[a * m + p] = idx[p] < 0 ? 0 : s->mu[a * mb + (size_t)idx[p]];
    }
    tpk_free(F->X.ctx, idx);
    return TPK_OK;
}

/* One block for the declared members of an initial G-var family: E = mean, Cov = var·δ. */
static int bias_block(fl *F, int sym, int *out)
{
    for (int k = 0; k < F->nb; k++)
        if (F->b[k].kind == BK_BIAS && F->b[k].fam == sym) {
            *out = k;
            return TPK_OK;
        }
    const nsr_rolled *R = F->X.R;
    long m = 0;
    int nidx = 0;
    for (int i = 0; i < R->ndm; i++)
        if (R->dm[i].sym == sym) {
            m++;
            nidx = R->dm[i].nidx;
        }
    int save = F->X.cur;
    F->X.cur = -1; /* visible to every instruction */
    int k = new_block(F, BK_BIAS, -1, m);
    F->X.cur = save;
    if (k < 0)
        return F->X.ctx->status;
    fblock *b = &F->b[k];
    b->fam = sym;
    b->fi = -1;
    b->last_use = F->X.cur;
    anc_root(b, k);
    /* members in declaration order; the nsr_trie degenerates to a sorted scan (few members) */
    b->nidx = nidx;
    b->tr.nlev = -1; /* a table searched linearly: declared biases are few */
    b->tr.nfix = nidx;
    size_t N = F->N;
    /* per member: variance in s, means in mean (N·m, NULL when all zero); the (N m)² second
     * moments are built only if a dense map asks for them (block_m2) */
    double *var = nsr_fam_alloc(&F->X, (size_t)m, sizeof *var);
    double *mean = F->dry ? NULL : nsr_fam_alloc(&F->X, N * (size_t)m, sizeof *mean);
    int *tab = nsr_fam_alloc(&F->X, (size_t)m * (NSR_MAX_INDICES + 1), sizeof *tab);
    if (var == NULL || (!F->dry && mean == NULL) || tab == NULL) {
        tpk_free(F->X.ctx, var), tpk_free(F->X.ctx, mean), tpk_free(F->X.ctx, tab);
        return F->X.ctx->status;
    }
    long j = 0;
    int anymean = 0;
    for (int i = 0; i < R->ndm; i++) {
        if (R->dm[i].sym != sym)
            continue;
        memcpy(&tab[j * (NSR_MAX_INDICES + 1)], R->dm[i].idx, sizeof R->dm[i].idx);
        var[j] = R->dm[i].var;
        for (size_t a = 0; mean && a < N; a++)
            mean[a * (size_t)m + (size_t)j] = R->dm[i].mean;
        anymean |= R->dm[i].mean != 0;
        j++;
    }
    if (!anymean) {
        tpk_free(F->X.ctx, mean);
        mean = NULL;
    }
    b = &F->b[k];
    b->s = var;
    b->mean = mean;
    /* store the member table in the nsr_trie's first level arrays */
    b->tr.lo[0] = tab;
    b->tr.nn[0] = m;
    *out = k;
    return TPK_OK;
}

/* ---- MatMul ---------------------------------------------------------------------------------- */

/* The declared member of A-var (or G) family sym at the indices of e, or −1. */
static int dm_find(fl *F, int sym, const nsr_expr *e, int *out)
{
    int t[NSR_MAX_INDICES];
    for (int i = 0; i < e->nidx; i++)
        if (nsr_fam_int(&F->X, e->idx[i], &t[i]))
            return F->X.ctx->status;
    for (int i = 0; i < F->X.R->ndm; i++) {
        const nsr_dmember *d = &F->X.R->dm[i];
        if (d->sym == sym && d->nidx == e->nidx && memcmp(d->idx, t, (size_t)e->nidx * sizeof *t) == 0) {
            *out = i;
            return TPK_OK;
        }
    }
    return nsr_fam_err(&F->X, TPK_ETYPE, e, "%s has no such member (not declared)", e->name);
}

/* The input slots as one Gaussian-like block: M2 = (1/d) x xᵀ over (input × slot), so an
 * embedding U·x[t] is a MatMul of a gather on it (σ_U² E[x_t x_t'] with the 1/d of the
 * embedding's fan-in, theory §1.2). Created once, at its first use. */
static int input_block(fl *F, int *out)
{
    for (int k = 0; k < F->nb; k++)
        if (F->b[k].kind == BK_GAUSS && F->b[k].fi == -2) {
            *out = k;
            return TPK_OK;
        }
    int save = F->X.cur;
    int k = new_block(F, BK_GAUSS, -1, (long)F->T);
    F->X.cur = save;
    if (k < 0)
        return F->X.ctx->status;
    fblock *b = &F->b[k];
    b->fi = -2;
    b->last_use = save;
    anc_root(b, k);
    *out = k; /* its M2 is computed when first read (block_m2): an embedding of every slot in
               * order writes its Gram straight into the atom instead */
    return TPK_OK;
}

/* The embedding's source U·x[slot(p)] as a gather on the input block. */
static int embed_src(fl *F, const nsr_expr *src, const nsr_fdom *D, val *u)
{
    size_t m = (size_t)D->m;
    if (src->nidx != (F->p->nslots > 1 || src->nidx ? 1 : 0))
        return nsr_fam_err(&F->X, TPK_ETYPE, src, "the input is read as %s[t]", src->name);
    int ib = -1;
    if (input_block(F, &ib))
        return F->X.ctx->status;
    int *slot = nsr_fam_alloc(&F->X, m, sizeof *slot);
    if (slot == NULL)
        return F->X.ctx->status;
    int vary = nsr_reads_syms(src, D->sym, D->nv, 0);
    for (size_t p = 0; p < m; p++) {
        int t = F->X.R->input_lo;
        if (vary || p == 0) {
            nsr_bind_point(&F->X, D, (long)p);
            if (src->nidx && nsr_fam_int(&F->X, src->idx[0], &t)) {
                tpk_free(F->X.ctx, slot);
                return F->X.ctx->status;
            }
            t -= F->X.R->input_lo;
        } else {
            t = slot[0];
        }
        if (t < 0 || t >= F->p->nslots) {
            tpk_free(F->X.ctx, slot);
            return nsr_fam_err(&F->X, TPK_ETYPE, src, "input slot %d is outside %d..%d", t + F->X.R->input_lo,
                          F->X.R->input_lo, F->X.R->input_lo + F->p->nslots - 1);
        }
        slot[p] = t;
    }
    return v_gather(F, u, D->m, ib, slot);
}

/* The vector taps of a convolution-like sum, kept to try the convolution lowering. */
typedef struct tap {
    val u;              /* coef · src over the domain */
    double var;
    int b[2];           /* binder values */
} tap;
typedef struct taps {
    int n, cap, nb;     /* nb: binders */
    tap *t;
} taps;

static void taps_free(fl *F, taps *T)
{
    for (int i = 0; i < T->n; i++)
        val_free(F, &T->t[i].u);
    tpk_free(F->X.ctx, T->t);
    memset(T, 0, sizeof *T);
}

static int lin_m2_acc(fl *F, val *u, double var, size_t n, double *M2)
{
    return lin_m2(F, u, u, F->dry ? NULL : M2, F->dry ? 0 : n, 1, var);
}

/* One MatMul term A·src (scaled by coef) added into the atom's M2 (lower triangle), or kept in
 * T (a vector source inside a tap sum). */
static int matmul_acc(fl *F, const nsr_expr *am, const nsr_expr *src, const nsr_fdom *D, val *coef,
                      double *M2, taps *T, double **fac, long *rank)
{
    if (nsr_reads_syms(am, D->sym, D->nv, 0))
        return NSR_UNSUP(&F->X, am, "an A-var that changes with the family's index (%s): untied weights "
                     "per member", am->name);
    int di = -1;
    if (dm_find(F, am->sym, am, &di))
        return F->X.ctx->status;
    if (F->amark[di] >= 0)
        return NSR_UNSUP(&F->X, am, "%s is multiplied in more than one place (weight tying, e.g. a "
                     "recurrence); the rolled evaluator keeps every MatMul's A-var its own",
                     am->name);
    F->amark[di] = (int)F->site;
    double var = F->X.R->dm[di].var;
    val u;
    if (src->kind == NSR_E_NAME && src->sym >= 0 && F->X.C->sym[src->sym].kind == NSR_SYM_INPUT) {
        if (embed_src(F, src, D, &u))
            return F->X.ctx->status;
    } else if (eval(F, src, D, &u)) {
        return F->X.ctx->status;
    }
    if (u.kind != V_LIN) {
        int zero = u.kind == V_CONST && u.c == 0;
        val_free(F, &u);
        if (zero || (coef && coef->kind == V_CONST && coef->c == 0)) {
            if (T == NULL && M2 != NULL) /* eval_matmul's block is uninitialised */
                memset(M2, 0, F->N * (size_t)D->m * F->N * (size_t)D->m * sizeof *M2);
            return TPK_OK;
        }
        return NSR_UNSUP(&F->X, src, "MatMul of a constant vector");
    }
    if ((coef && v_scale(F, &u, coef)) || v_merge(F, &u)) {
        val_free(F, &u);
        return F->X.ctx->status;
    }
    if (T != NULL) {
        if (T->n == T->cap) {
            int cap = T->cap ? 2 * T->cap : 16;
            tap *t = tpk_realloc(F->X.ctx, T->t, (size_t)cap * sizeof *t);
            if (t == NULL) {
                val_free(F, &u);
                return TPK_ERROR(F->X.ctx, TPK_ENOMEM, "out of memory");
            }
            T->t = t;
            T->cap = cap;
        }
        tap *t = &T->t[T->n++];
        memset(t, 0, sizeof *t);
        t->u = u;
        t->var = var;
        return TPK_OK;
    }
    /* U·x[t] over every slot in order: the Gram (σ²/d) x xᵀ straight into the atom */
    if (!F->dry && u.nt == 1 && u.mu == NULL && is_identity_term(&u.t[0], u.m) &&
        F->b[u.t[0].blk].fi == -2 && F->b[u.t[0].blk].M2 == NULL && (size_t)u.m == F->T) {
        size_t n = F->N * F->T;
        touch(F, u.t[0].blk);
        if (fac != NULL && F->d * FAC_RATIO <= n) { /* rank d: the factor √(σ²/d)·x, no Gram */
            val_free(F, &u);
            if ((*fac = nsr_fam_alloc(&F->X, n * F->d, sizeof **fac)) == NULL)
                return F->X.ctx->status;
            double c = sqrt(var / (double)F->d);
            for (size_t i = 0; i < n * F->d; i++)
                (*fac)[i] = c * F->x[i];
            *rank = (long)F->d;
            return TPK_OK;
        }
        int st = tpk_dsyrk_lower(TPK_NO_TRANS, n, F->d, var / (double)F->d, F->x, F->d, 0.0, M2,
                                 n, F->X.ctx); /* the atom is stored lower (finish_atom) */
        val_free(F, &u);
        return st;
    }
    /* A·φ(g) made by eval_matmul (fac: its call), g a zero-mean Gaussian block: the atom is
     * pending, σ²·V_φ(g), and its matrix is made where a reader needs one — with the maps and
     * sums around it, by the plan of ew_flush (docs/orchestration.md §7) */
    if (!F->dry && fac != NULL && u.nt == 1 && u.mu == NULL && is_identity_term(&u.t[0], u.m) &&
        F->b[u.t[0].blk].kind == BK_NONLIN && F->b[u.t[0].blk].M2 == NULL &&
        F->b[u.t[0].blk].m == D->m && ew_leafable(F, F->b[u.t[0].blk].arg, D->m)) {
        int x = u.t[0].blk, g = F->b[x].arg;
        pend *P = pend_new(F, NSR_EW_PHI, F->b[x].line, am->col);
        val_free(F, &u);
        if (P == NULL)
            return F->X.ctx->status;
        P->nd.arg = g;
        P->nd.phi = F->b[x].phi;
        P->nd.alpha = var;
        touch(F, x);
        touch(F, g);
        F->newpend = P;
        return TPK_OK;
    }
    /* A·φ(g) where the φ block dies here: its map goes straight into the (zeroed) atom, scaled
     * by σ², instead of being stored and then copied — one pass over the block per layer, as in
     * the direct recursion's fused map (tpk_gauss_map_affine) */
    if (!F->dry && u.nt == 1 && u.mu == NULL && is_identity_term(&u.t[0], u.m)) {
        int x = u.t[0].blk;
        fblock *bx = &F->b[x];
        if (bx->kind == BK_NONLIN && bx->M2 == NULL && plan_get(F, 1) && x < F->nplan &&
            F->plan[x] == F->X.cur && F->b[bx->arg].mean == NULL && block_m2(F, bx->arg) != NULL &&
            ensure_ws_for(F, bx->phi) == TPK_OK) {
            double e = 0;
            size_t n = F->N * (size_t)D->m;
            touch(F, x);
            touch(F, bx->arg);
            /* and where g dies here too (a layer of a deep network), the map runs in place and
             * the atom takes g's matrix: no fresh block, whose first touch (page faults and the
             * kernel's zeroing) cost more than the map (MLP N = 2048: 56 % of the run) */
            const double *S = F->b[bx->arg].M2;
            double *dst = F->inplace == NULL && defined_names(F, src) == 1
                              ? take_matrix(F, bx->arg, D->m) : NULL;
            if (dst != NULL)
                F->inplace = dst; /* eval_matmul's atom takes it */
            else
                dst = M2;
            int st = tpk_gauss_map_affine_lower(bx->phi, S, n, var, 0.0, dst, F->ws, &e,
                                                F->X.ctx);
            F->err = fmax(F->err, e);
            val_free(F, &u);
            return st;
        }
    }
    if (fac != NULL) { /* A·(C·X) of a factor block: σ·C·Fac */
        int fo = factor_of(F, &u, sqrt(var), fac, rank);
        if (fo != 0) {
            val_free(F, &u);
            return fo < 0 ? F->X.ctx->status : TPK_OK;
        }
    }
    if (fac != NULL && !F->dry) {
        /* A·u, u a sum of independent zero-mean blocks (a transformer's W1·h, U·z): the atom is
         * pending, σ²·Σ_t E[u_t u_tᵀ], another node of the entrywise program (ew_flush) */
        pend *P = NULL;
        int es = ew_sum_of(F, &u, am->line, am->col, &P);
        if (es != 0) {
            val_free(F, &u);
            if (es < 0)
                return F->X.ctx->status;
            for (int t = 0; t < P->nd.nt; t++)
                P->nd.t[t].c *= var;
            F->newpend = P;
            return TPK_OK;
        }
    }
    if (M2 != NULL) /* the generic sum accumulates: eval_matmul's block starts uninitialised */
        memset(M2, 0, F->N * (size_t)D->m * F->N * (size_t)D->m * sizeof *M2);
    int st = lin_m2_acc(F, &u, var, F->N * (size_t)D->m, M2);
    val_free(F, &u);
    return st;
}

/* zero = 0: M2 is left uninitialised (the caller assigns every lower-triangle entry) */
static int new_atom(fl *F, long m, double **M2, int *k, int zero)
{
    if ((*k = new_block(F, BK_GAUSS, -1, m)) < 0)
        return F->X.ctx->status;
    anc_root(&F->b[*k], *k);
    *M2 = NULL;
    if (!F->dry) {
        size_t n = F->N * (size_t)m;
        if ((*M2 = fl_big(F, n * n, sizeof **M2, zero)) == NULL)
            return F->X.ctx->status;
    }
    return TPK_OK;
}

static int finish_atom(fl *F, int k, double *M2, val *out, long m)
{
    F->b[k].M2 = M2;
    F->b[k].lower = 1;
    int *idx = nsr_fam_alloc(&F->X, (size_t)m, sizeof *idx);
    if (idx == NULL)
        return F->X.ctx->status;
    for (long p = 0; p < m; p++)
        idx[p] = (int)p;
    return v_gather(F, out, m, k, idx);
}

static int eval_matmul(fl *F, const nsr_expr *am, const nsr_expr *src, const nsr_fdom *D, val *out)
{
    double *M2;
    int k = -1;
    F->site++;
    if (new_atom(F, D->m, &M2, &k, 0)) /* matmul_acc writes or zeroes it */
        return F->X.ctx->status;
    F->b[k].line = am->line;
    double *fac = NULL;
    long rank = 0;
    F->inplace = NULL;
    F->newpend = NULL;
    int st = matmul_acc(F, am, src, D, NULL, M2, NULL, &fac, &rank);
    if (F->newpend != NULL) { /* a pending map: its own block, never touched, goes back */
        pend *P = F->newpend;
        size_t n = F->N * (size_t)D->m;
        F->newpend = NULL;
        fl_release(F, M2, n * n * sizeof *M2);
        if (pend_attach(F, k, P))
            return F->X.ctx->status;
        return finish_atom(F, k, NULL, out, D->m);
    }
    M2 = adopt_inplace(F, M2, D->m);
    if (st) {
        tpk_free(F->X.ctx, M2);
        return F->X.ctx->status;
    }
    if (fac != NULL) { /* low rank: the block keeps the factor */
        size_t n = F->N * (size_t)D->m;
        fl_release(F, M2, n * n * sizeof *M2);
        M2 = NULL;
        F->b[k].Fac = fac;
        F->b[k].rank = rank;
    }
    return finish_atom(F, k, M2, out, D->m);
}

/* A sum over binders of MatMuls whose A-var changes with the binder (convolution taps:
 * Σ_t F_t h_{p+t}): the terms are independent (distinct A-vars, theory §1.6), so the sum is one
 * Gaussian block with M2 = Σ_t σ_t² E[h_{p+t} h_{q+t}ᵀ] (theory §2.8) — no block per tap. */
static int is_acc_leaf(const fl *F, const nsr_expr *e, const nsr_expr **am, const nsr_expr **src,
                       const nsr_expr **coef)
{
    *coef = NULL;
    if (e->kind == NSR_E_BIN && e->op == NSR_T_STAR) {
        const nsr_expr *x = e->a, *y = e->b;
        if (y->kind == NSR_E_APPLY || (y->kind == NSR_E_CALL && y->sym >= 0 &&
                                       F->X.C->sym[y->sym].kind == NSR_SYM_AFAM)) {
            *coef = x;
            e = y;
        } else {
            *coef = y;
            e = x;
        }
    }
    if (e->kind == NSR_E_APPLY) {
        *am = e->a;
        *src = e->b;
        return 1;
    }
    if (e->kind == NSR_E_CALL && e->sym >= 0 && F->X.C->sym[e->sym].kind == NSR_SYM_AFAM &&
        e->nargs == 1) {
        *am = e;
        *src = e->args[0];
        return 1;
    }
    return 0;
}

static int acc_sum(fl *F, const nsr_expr *e, const nsr_fdom *D, double *M2, taps *T,
                   const int *binders, int nb, int depth)
{
    if (depth > NSR_MAX_DEPTH)
        return NSR_UNSUP(&F->X, e, "sums nested too deeply");
    if (e->kind == NSR_E_SUM) {
        int lo, hi;
        if (nsr_fam_int(&F->X, e->args[0], &lo) || nsr_fam_int(&F->X, e->args[1], &hi))
            return F->X.ctx->status;
        for (int j = lo; j <= hi; j++) {
            F->X.num[e->sym] = j;
            if (acc_sum(F, e->a, D, M2, T, binders, nb, depth + 1))
                return F->X.ctx->status;
        }
        F->X.num[e->sym] = NAN;
        return TPK_OK;
    }
    const nsr_expr *am, *src, *ce;
    if (!is_acc_leaf(F, e, &am, &src, &ce))
        return NSR_UNSUP(&F->X, e, "internal: not a MatMul term");
    val c, *cp = NULL;
    if (ce) {
        if (eval(F, ce, D, &c))
            return F->X.ctx->status;
        if (c.kind == V_LIN) {
            val_free(F, &c);
            return NSR_UNSUP(&F->X, ce, "a MatMul multiplied by a vector");
        }
        cp = &c;
    }
    int n0 = T->n;
    int st = matmul_acc(F, am, src, D, cp, M2, T, NULL, NULL);
    if (st == TPK_OK && T->n > n0)
        for (int i = 0; i < nb && i < 2; i++)
            T->t[T->n - 1].b[i] = (int)F->X.num[binders[i]];
    if (cp)
        val_free(F, cp);
    return st;
}

/* The convolution lowering (theory §2.8): the taps of a sum Σ_t F_t h[p + t] over a rows×cols
 * grid, every tap reading one block h defined on the same grid at the shifted position — wrapped
 * (circular) or masked to zero outside (zero padding) — with one variance, are the step between
 * CNN layers of kernels/cnn.c: M2 += σ² Σ_t M2_h[p+t, q+t] per input pair by
 * tpk_cnn_conv_block. Returns 1 when it took the taps, 2 when they are a pending node
 * (F->newpend); 0 leaves them to the generic sum. */
static int conv_lowering(fl *F, const nsr_fdom *D, taps *T, double *M2, int *st)
{
    *st = TPK_OK;
    if (F->dry || T->n == 0 || D->nv < 1 || D->nv > 2 || T->nb != D->nv)
        return 0; /* the plan takes the generic path: it touches the same block */
    /* the grid: D is r0..r1 × s0..s1 in row-major order */
    int two = D->nv == 2;
    int r0 = two ? D->val[0] : 1, s0 = D->val[two ? 1 : 0];
    const int *last = &D->val[(D->m - 1) * D->nv];
    int r1 = two ? last[0] : 1, s1 = last[two ? 1 : 0];
    long R = r1 - r0 + 1, C = s1 - s0 + 1;
    if (R < 1 || C < 1 || R * C != D->m)
        return 0;
    for (long p = 0; p < D->m; p++)
        if ((two && D->val[p * 2] != r0 + p / C) || D->val[p * D->nv + two] != s0 + p % C)
            return 0;
    const tap *t0 = &T->t[0];
    if (t0->u.nt != 1)
        return 0;
    int X = t0->u.t[0].blk;
    const fblock *bx = &F->b[X];
    if (bx->m != D->m)
        return 0;
    /* X's members: the same grid, row-major (the input's slots are, by the program's
     * (r − 1)·cols + s, which the index check below confirms) */
    if (bx->fi != -2 && (bx->tr.nlev != D->nv || bx->tr.nn[0] != 1 ||
                         bx->tr.lo[0][0] != (two ? r0 : s0) || bx->tr.hi[0][0] != (two ? r1 : s1)))
        return 0;
    if (two && bx->fi != -2)
        for (long q = 0; q < bx->tr.nn[1]; q++)
            if (bx->tr.lo[1][q] != s0 || bx->tr.hi[1][q] != s1)
                return 0;
    int kh = 1, kw = 0;
    for (int i = 0; i < T->n; i++) {
        kh = two && T->t[i].b[0] + 1 > kh ? T->t[i].b[0] + 1 : kh;
        kw = T->t[i].b[two] + 1 > kw ? T->t[i].b[two] + 1 : kw;
    }
    if (kh * kw != T->n || kh > R || kw > C)
        return 0;
    int cr = (kh - 1) / 2, cs = (kw - 1) / 2, padding = -1;
    size_t N = F->N, m = (size_t)D->m;
    for (int i = 0; i < T->n; i++) {
        const tap *t = &T->t[i];
        const term *u = &t->u.t[0];
        int ti = two ? t->b[0] : 0, tj = t->b[two];
        if (t->u.nt != 1 || u->blk != X || u->dense || t->u.mu || t->var != t0->var || ti < 0 ||
            tj < 0 || ti != i / kw || tj != i % kw)
            return 0;
        for (long p = 0; p < D->m; p++) {
            long r = two ? p / C : 0, c = p % C;
            long rr = r + ti - cr, cc = c + tj - cs;
            int in = rr >= 0 && rr < R && cc >= 0 && cc < C;
            long want = ((rr % R + R) % R) * C + (cc % C + C) % C;
            double w = u->w ? u->w[p] : 1;
            for (size_t a = 1; u->w && a < N; a++)
                if (u->w[a * m + (size_t)p] != w)
                    return 0;
            if (!(w == 1 || w == 0) || (w == 1 && u->idx[p] != want))
                return 0;
            int pad = w == 0 ? TPK_CNN_ZERO : in ? -1 : TPK_CNN_CIRCULAR;
            if (w == 0 && in)
                return 0;
            if (pad >= 0) {
                if (padding >= 0 && padding != pad)
                    return 0;
                padding = pad;
            }
        }
    }
    if (padding < 0)
        padding = TPK_CNN_CIRCULAR; /* no tap leaves the grid */
    if (F->plan_kind == NSR_PLAN_OPTIMAL) {
        /* The convolution stays pending, a node of a pair program (netsor/ewpair.c): over φ(g)
         * with g a zero-mean Gaussian block (pending or not), or over a Gaussian block itself
         * (the inputs': their Gram is made per pair). A CNN's layers then run one input pair
         * at a time from the inputs to the readout, in buffers, as kernels/cnn.c does. */
        int psrc = -1;
        const tpk_phi *pphi = NULL;
        if (bx->kind == BK_NONLIN && bx->M2 == NULL && ew_leafable(F, bx->arg, D->m)) {
            psrc = bx->arg;
            pphi = bx->phi;
        } else if (bx->kind == BK_GAUSS && ew_leafable(F, X, D->m)) {
            psrc = X;
        }
        if (psrc >= 0) {
            pend *P = pend_new(F, NSR_EW_CONV, cur_line(F), cur_col(F));
            if (P == NULL) {
                *st = F->X.ctx->status;
                return 1;
            }
            P->nd.arg = psrc;
            P->nd.phi = pphi;
            P->nd.alpha = t0->var;
            P->nd.rows = (int)R;
            P->nd.cols = (int)C;
            P->nd.kh = kh;
            P->nd.kw = kw;
            P->nd.pad = padding;
            touch(F, X);
            touch(F, psrc);
            F->newpend = P;
            return 2;
        }
    }
    size_t n = N * m, npairs = N * (N + 1) / 2;
    /* The taps read h = φ(g) whose moments are not made yet, and h dies here: φ's map runs per
     * input pair on the pair's block of g, in the buffer the convolution reads next (map and
     * taps fused, as the direct recursion of kernels/cnn.c does), so h's (N m)² matrix is never
     * written and read back. The pair's map needs both inputs' variances: g's diagonal, kept
     * first. */
    const tpk_phi *fphi = NULL;
    int gsrc = X;
    if (bx->kind == BK_NONLIN && bx->M2 == NULL && dies_here(F, X) && stmt_reads_once(F)) {
        const fblock *bg = &F->b[bx->arg];
        int zero_mean = bg->kind == BK_GAUSS && bg->m == bx->m;
        for (size_t i = 0; zero_mean && bg->mean && i < n; i++)
            zero_mean = bg->mean[i] == 0;
        if (zero_mean) {
            fphi = bx->phi;
            gsrc = bx->arg;
            touch(F, X);
        }
    }
    /* The taps read the inputs themselves and nothing after this statement does: each pair's
     * block of their Gram, ⟨x_ap, x_cq⟩/d, is made where the convolution needs it (a rank-d
     * product per pair) instead of the whole (N m)² Gram first — a CNN's first layer on images
     * then touches one fresh block, not two. Few channels only (RGB, grey): the per-pair loop
     * is plain, where the whole Gram would be one tuned SYRK. */
    int from_x = fphi == NULL && bx->fi == -2 && bx->M2 == NULL && dies_here(F, X) &&
                 (size_t)bx->m == F->T && F->d > 0 && F->d <= 8;
    if (from_x)
        touch(F, X);
    const double *MX = from_x ? NULL : block_m2(F, gsrc);
    int lowerX = F->b[gsrc].lower;
    double *in = nsr_fam_alloc(&F->X, m * m, sizeof *in), *out = nsr_fam_alloc(&F->X, m * m, sizeof *out);
    double *dg = fphi ? nsr_fam_alloc(&F->X, n, sizeof *dg) : NULL;
    if ((MX == NULL && !from_x) || in == NULL || out == NULL ||
        (fphi && (dg == NULL || ensure_ws_for(F, fphi)))) {
        tpk_free(F->X.ctx, in), tpk_free(F->X.ctx, out), tpk_free(F->X.ctx, dg);
        *st = F->X.ctx->status ? F->X.ctx->status : TPK_ENOMEM;
        return 1;
    }
    tpk_free(F->X.ctx, in), tpk_free(F->X.ctx, out);
    for (size_t i = 0; fphi && i < n; i++)
        dg[i] = MX[i * n + i];
    /* Each input pair's block of the result depends on that pair's block of the source alone,
     * so where the source dies here (read once by this statement) the result is written over it
     * and the atom takes its matrix (eval_sum): no fresh (N m)² block to fault in. */
    double *taken = MX != NULL && F->inplace == NULL ? take_matrix(F, gsrc, D->m) : NULL;
    if (taken != NULL)
        M2 = F->inplace = taken; /* eval_sum's atom takes it */
    int fail = 0, mapst = TPK_OK;
    double emap = 0.0;
    char mapmsg[sizeof F->X.ctx->msg] = "";
    /* input pairs are independent: one per thread, each with its two P×P buffers */
#pragma omp parallel reduction(| : fail)
    {
        void *vi = tpk_mem_malloc(TPK_ALLOCATOR_OF(F->X.ctx), m * m * sizeof(double), NULL); /* see fl_big */
        void *vo = tpk_mem_malloc(TPK_ALLOCATOR_OF(F->X.ctx), m * m * sizeof(double), NULL);
        double *bi = vi, *bo = vo;
        tpk_ctx lc;
        tpk_ctx_init_from(&lc, F->X.ctx);
        tpk_cnn_convws *cv = tpk_cnn_convws_alloc((size_t)R, (size_t)C, kh, kw, padding,
                                              TPK_CNN_CONV_AUTO, &lc);
        fail |= bi == NULL || bo == NULL || cv == NULL;
        if (bi != NULL && bo != NULL) { /* touch the pages by writing (see fl_big) */
            memset(bi, 0, m * m * sizeof *bi);
            memset(bo, 0, m * m * sizeof *bo);
        }
#pragma omp for schedule(dynamic, 1)
        for (size_t ac = 0; ac < npairs; ac++) {
            if (bi == NULL || bo == NULL || cv == NULL)
                continue;
            size_t a, c;
            tpk_lower_index(ac, &a, &c);
            nsr_pair_block(from_x ? NULL : MX, lowerX, F->x, F->d, n, m, a, c, bi);
            if (fphi != NULL) {
                double e = 0.0;
                int ms = tpk_gauss_map_cross(fphi, dg + a * m, m, dg + c * m, m, bi, bi, F->ws, &e,
                                             &lc);
                if (ms != TPK_OK) {
#pragma omp critical(tpk_flimit_convmap)
                    if (mapst == TPK_OK) {
                        mapst = ms;
                        snprintf(mapmsg, sizeof mapmsg, "%s", lc.msg);
                    }
                    continue;
                }
#pragma omp critical(tpk_flimit_convmap)
                emap = fmax(emap, e);
            }
            tpk_cnn_convws_apply(cv, t0->var, 0.0, bi, bo);
            for (size_t p = 0; p < m; p++) {
                double *row = M2 + (a * m + p) * n + c * m;
                for (size_t q = 0; q < m; q++)
                    row[q] = bo[p * m + q]; /* the block was uninitialised: assign */
            }
        }
        tpk_free(F->X.ctx, bi), tpk_free(F->X.ctx, bo);
        tpk_cnn_convws_free(cv);
    }
    tpk_free(F->X.ctx, dg);
    if (fail)
        *st = TPK_ERROR(F->X.ctx, TPK_ENOMEM, "convolution of the covariance blocks failed (out of "
                        "memory)");
    else if (mapst != TPK_OK)
        *st = nsr_fam_err(&F->X, mapst, NULL, "%s", mapmsg);
    else
        F->err = fmax(F->err, emap);
    return 1;
}

/* Does the innermost body of nested sums have the accumulable form, with an A-var reading a
 * binder? */
static int accumulable(const fl *F, const nsr_expr *e, int *binders, int nb)
{
    while (e->kind == NSR_E_SUM && nb < NSR_MAXV) {
        binders[nb++] = e->sym;
        e = e->a;
    }
    const nsr_expr *am, *src, *ce;
    if (!is_acc_leaf(F, e, &am, &src, &ce))
        return 0;
    return nsr_reads_syms(am, binders, nb, 0);
}

/* ---- sums, softmax -------------------------------------------------------------------------- */

static int eval_sum(fl *F, const nsr_expr *e, const nsr_fdom *D, val *out)
{
    int binders[NSR_MAXV];
    if (accumulable(F, e, binders, 0)) {
        double *M2;
        int k = -1;
        F->site++;
        if (new_atom(F, D->m, &M2, &k, 0))
            return F->X.ctx->status;
        F->b[k].line = e->line;
        taps T = {.nb = 0};
        const nsr_expr *q = e;
        while (q->kind == NSR_E_SUM && T.nb < NSR_MAXV)
            T.nb++, q = q->a;
        if (acc_sum(F, e, D, M2, &T, binders, T.nb, 0)) {
            taps_free(F, &T);
            tpk_free(F->X.ctx, M2);
            return F->X.ctx->status;
        }
        int st = TPK_OK;
        F->inplace = NULL;
        F->newpend = NULL;
        int lowered = conv_lowering(F, D, &T, M2, &st);
        if (lowered == 2) { /* pending: its own block, never touched, goes back */
            pend *P = F->newpend;
            size_t n = F->N * (size_t)D->m;
            F->newpend = NULL;
            taps_free(F, &T);
            fl_release(F, M2, n * n * sizeof *M2);
            if (pend_attach(F, k, P))
                return F->X.ctx->status;
            return finish_atom(F, k, NULL, out, D->m);
        }
        M2 = adopt_inplace(F, M2, D->m);
        if (!lowered) {
            size_t n = F->N * (size_t)D->m; /* the generic sum adds into a zeroed block */
            if (M2 != NULL)
                memset(M2, 0, n * n * sizeof *M2);
            for (int i = 0; i < T.n && st == TPK_OK; i++)
                st = lin_m2_acc(F, &T.t[i].u, T.t[i].var, F->N * (size_t)D->m, M2);
        }
        taps_free(F, &T);
        if (st) {
            tpk_free(F->X.ctx, M2);
            return st;
        }
        return finish_atom(F, k, M2, out, D->m);
    }
    nsr_fdom X;
    long *parent;
    if (nsr_extend(&F->X, e, D, &X, &parent))
        return F->X.ctx->status;
    val v;
    int st = eval(F, e->a, &X, &v);
    tpk_free(F->X.ctx, X.val);
    if (st) {
        tpk_free(F->X.ctx, parent);
        return st;
    }
    size_t N = F->N, m = (size_t)D->m, mx = (size_t)X.m;
    if (v.kind != V_LIN) {
        v_const(out, D->m, 0);
        if (v_scal(F, out) || v_scal(F, &v)) {
            tpk_free(F->X.ctx, parent), val_free(F, &v);
            return F->X.ctx->status;
        }
        for (size_t a = 0; a < N; a++)
            for (size_t r = 0; r < mx; r++)
                out->s[a * m + (size_t)parent[r]] += v.s[a * mx + r];
        tpk_free(F->X.ctx, parent), val_free(F, &v);
        return TPK_OK;
    }
    memset(out, 0, sizeof *out);
    out->kind = V_LIN;
    out->m = D->m;
    if (v.mu) {
        if ((out->mu = nsr_fam_alloc(&F->X, N * m, sizeof *out->mu)) == NULL) {
            tpk_free(F->X.ctx, parent), val_free(F, &v);
            return F->X.ctx->status;
        }
        for (size_t a = 0; a < N; a++)
            for (size_t r = 0; r < mx; r++)
                out->mu[a * m + (size_t)parent[r]] += v.mu[a * mx + r];
    }
    /* each term becomes a dense map; terms on one block merge */
    out->t = nsr_fam_alloc(&F->X, (size_t)v.nt, sizeof *out->t);
    if (out->t == NULL) {
        tpk_free(F->X.ctx, parent), val_free(F, &v), val_free(F, out);
        return F->X.ctx->status;
    }
    for (int i = 0; i < v.nt && st == TPK_OK; i++) {
        const term *t = &v.t[i];
        size_t ms = (size_t)F->b[t->blk].m;
        int j = 0;
        while (j < out->nt && out->t[j].blk != t->blk)
            j++;
        if (j == out->nt) {
            out->t[j].blk = t->blk;
            out->t[j].dense = 1;
            out->nt++;
            if (!F->dry && (out->t[j].w = nsr_fam_alloc(&F->X, N * m * ms, sizeof(double))) == NULL)
                st = F->X.ctx->status;
        }
        if (st || F->dry)
            continue;
        double *W = out->t[j].w;
        for (size_t a = 0; a < N; a++)
            for (size_t r = 0; r < mx; r++) {
                double *row = W + (a * m + (size_t)parent[r]) * ms;
                if (t->dense) {
                    const double *src = t->w + (a * mx + r) * ms;
                    for (size_t q = 0; q < ms; q++)
                        row[q] += src[q];
                } else if (t->idx[r] >= 0) {
                    row[t->idx[r]] += t->w ? t->w[a * mx + r] : 1;
                }
            }
    }
    tpk_free(F->X.ctx, parent);
    val_free(F, &v);
    if (st)
        val_free(F, out);
    return st;
}

/* softmax(j in lo..hi: s) at the enclosing j. Its rows depend on the other indices only, so
 * they are computed once per row (a[i, j] for all j ≤ i costs T² exp, not T³), shifted by the
 * row maximum. */
static int eval_softmax(fl *F, const nsr_expr *e, const nsr_fdom *D, val *out)
{
    nsr_softmax_shape S;
    val v;
    memset(&v, 0, sizeof v);
    int st = nsr_softmax_shape_of(&F->X, e, D, &S);
    if (st == TPK_OK)
        st = eval(F, e->a, &S.X, &v);
    if (st == TPK_OK && v.kind == V_LIN)
        st = NSR_UNSUP(&F->X, e->a, "softmax of a vector: its argument must be scalars (Moments)");
    if (st == TPK_OK)
        st = v_scal(F, &v);
    if (st == TPK_OK) {
        v_const(out, D->m, 0);
        st = v_scal(F, out);
    }
    size_t N = F->N, m = (size_t)D->m, mx = (size_t)S.X.m, nr = (size_t)S.rows.m;
    if (st == TPK_OK && !F->dry) {
        /* one exp per row entry: the row pass keeps exp(s − max) in place of s (v is ours),
         * then each point picks its entry and divides by its row's sum */
        double *z = nsr_fam_alloc(&F->X, nr, sizeof *z);
        if (z == NULL)
            st = F->X.ctx->status;
        for (size_t a = 0; st == TPK_OK && a < N; a++) {
            double *sv = v.s + a * mx;
#pragma omp parallel for schedule(dynamic, 64) if (mx >= 65536)
            for (size_t r = 0; r < nr; r++) {
                double mm = -INFINITY, zz = 0;
                for (long q = S.start[r]; q < S.start[r + 1]; q++)
                    mm = fmax(mm, sv[q]);
                for (long q = S.start[r]; q < S.start[r + 1]; q++)
                    zz += (sv[q] = exp(sv[q] - mm));
                z[r] = zz;
            }
            for (size_t p = 0; p < m; p++)
                out->s[a * m + p] = sv[S.pick[p]] / z[S.row[p]];
        }
        tpk_free(F->X.ctx, z);
    }
    nsr_softmax_shape_free(&S, F->X.ctx);
    val_free(F, &v);
    return st;
}

/* ---- Moments ----------------------------------------------------------------------------- */

typedef struct mono {
    val coef;           /* CONST or SCAL */
    int nf;
    val f[2];           /* LIN factors */
} mono;

typedef struct mlist {
    int n, cap;
    mono *v;
} mlist;

static void ml_free(fl *F, mlist *L)
{
    for (int i = 0; i < L->n; i++) {
        val_free(F, &L->v[i].coef);
        for (int k = 0; k < L->v[i].nf; k++)
            val_free(F, &L->v[i].f[k]);
    }
    tpk_free(F->X.ctx, L->v);
    memset(L, 0, sizeof *L);
}

static void mono_free(fl *F, mono *m)
{
    val_free(F, &m->coef);
    for (int k = 0; k < m->nf; k++)
        val_free(F, &m->f[k]);
    memset(m, 0, sizeof *m);
}

/* Append m to L, which owns it from now on (on failure it is freed: no caller leaks it). */
static int ml_push(fl *F, mlist *L, mono *m)
{
    if (L->n == L->cap) {
        int cap = L->cap ? 2 * L->cap : 8;
        mono *v = tpk_realloc(F->X.ctx, L->v, (size_t)cap * sizeof *v);
        if (v == NULL) {
            mono_free(F, m);
            return TPK_ERROR(F->X.ctx, TPK_ENOMEM, "out of memory");
        }
        L->v = v;
        L->cap = cap;
    }
    L->v[L->n++] = *m;
    return TPK_OK;
}

static int v_copy(fl *F, const val *a, val *out)
{
    size_t N = F->N, m = (size_t)a->m;
    *out = *a;
    out->s = NULL;
    out->mu = NULL;
    out->t = NULL;
    out->nt = 0; /* until out->t exists: a copy that fails half-way is freed with val_free */
    if (a->s && (out->s = nsr_fam_alloc(&F->X, N * m, sizeof *out->s)) == NULL)
        return F->X.ctx->status;
    if (a->s)
        memcpy(out->s, a->s, N * m * sizeof *out->s);
    if (a->mu && (out->mu = nsr_fam_alloc(&F->X, N * m, sizeof *out->mu)) == NULL)
        return F->X.ctx->status;
    if (a->mu)
        memcpy(out->mu, a->mu, N * m * sizeof *out->mu);
    if (a->nt) {
        if ((out->t = nsr_fam_alloc(&F->X, (size_t)a->nt, sizeof *out->t)) == NULL)
            return F->X.ctx->status;
        out->nt = a->nt;
        for (int i = 0; i < a->nt; i++) {
            const term *t = &a->t[i];
            term *u = &out->t[i];
            *u = *t;
            u->idx = NULL;
            u->w = NULL;
            size_t ms = (size_t)F->b[t->blk].m;
            size_t nw = t->dense ? N * m * ms : N * m;
            if (t->idx && (u->idx = nsr_fam_alloc(&F->X, m, sizeof *u->idx)) == NULL)
                return F->X.ctx->status;
            if (t->idx)
                memcpy(u->idx, t->idx, m * sizeof *u->idx);
            if (t->w && (u->w = nsr_fam_alloc(&F->X, nw, sizeof *u->w)) == NULL)
                return F->X.ctx->status;
            if (t->w)
                memcpy(u->w, t->w, nw * sizeof *u->w);
        }
    }
    return TPK_OK;
}

static int expand(fl *F, const nsr_expr *e, const nsr_fdom *D, mlist *L, int depth);

static int ml_mul(fl *F, mlist *A, mlist *B, mlist *out, const nsr_expr *e)
{
    int st = TPK_OK;
    for (int i = 0; i < A->n && st == TPK_OK; i++)
        for (int j = 0; j < B->n && st == TPK_OK; j++) {
            mono *x = &A->v[i], *y = &B->v[j];
            if (x->nf + y->nf > 2) {
                st = NSR_UNSUP(&F->X, e, "a Moment of degree > 2 in vectors: write the product as one "
                           "function");
                break;
            }
            mono r = {0};
            if ((st = v_copy(F, &x->coef, &r.coef)) == TPK_OK)
                st = v_scale(F, &r.coef, &y->coef);
            for (int k = 0; k < x->nf && st == TPK_OK; k++)
                st = v_copy(F, &x->f[k], &r.f[r.nf++]);
            for (int k = 0; k < y->nf && st == TPK_OK; k++)
                st = v_copy(F, &y->f[k], &r.f[r.nf++]);
            if (st == TPK_OK)
                st = ml_push(F, out, &r);
            else {
                val_free(F, &r.coef);
                for (int k = 0; k < r.nf; k++)
                    val_free(F, &r.f[k]);
            }
        }
    return st;
}

static int expand(fl *F, const nsr_expr *e, const nsr_fdom *D, mlist *L, int depth)
{
    if (depth > NSR_MAX_DEPTH)
        return NSR_UNSUP(&F->X, e, "expression nested too deeply");
    if (e->kind == NSR_E_BIN && (e->op == NSR_T_PLUS || e->op == NSR_T_MINUS)) {
        mlist B = {0};
        if (expand(F, e->a, D, L, depth + 1) || expand(F, e->b, D, &B, depth + 1)) {
            ml_free(F, &B);
            return F->X.ctx->status;
        }
        val neg;
        v_const(&neg, D->m, -1);
        for (int i = 0; i < B.n; i++) {
            if (e->op == NSR_T_MINUS && v_scale(F, &B.v[i].coef, &neg))
                break;
            if (ml_push(F, L, &B.v[i]))
                break;
            memset(&B.v[i], 0, sizeof B.v[i]);
        }
        ml_free(F, &B);
        return F->X.ctx->status;
    }
    if (e->kind == NSR_E_NEG) {
        mlist A = {0};
        if (expand(F, e->a, D, &A, depth + 1)) {
            ml_free(F, &A);
            return F->X.ctx->status;
        }
        val neg;
        v_const(&neg, D->m, -1);
        for (int i = 0; i < A.n; i++) {
            v_scale(F, &A.v[i].coef, &neg);
            ml_push(F, L, &A.v[i]);
            memset(&A.v[i], 0, sizeof A.v[i]);
        }
        ml_free(F, &A);
        return F->X.ctx->status;
    }
    if (e->kind == NSR_E_BIN && (e->op == NSR_T_STAR || e->op == NSR_T_CARET)) {
        mlist A = {0}, B = {0};
        int st = expand(F, e->a, D, &A, depth + 1);
        if (st == TPK_OK && e->op == NSR_T_STAR)
            st = expand(F, e->b, D, &B, depth + 1);
        if (st == TPK_OK && e->op == NSR_T_CARET) {
            double k;
            st = nsr_fam_num(&F->X, e->b, &k);
            if (st == TPK_OK && k == 1) {
                for (int i = 0; i < A.n; i++) {
                    ml_push(F, L, &A.v[i]);
                    memset(&A.v[i], 0, sizeof A.v[i]);
                }
                ml_free(F, &A);
                return F->X.ctx->status;
            }
            if (st == TPK_OK && k != 2) {
                int vec = 0;
                for (int i = 0; i < A.n; i++)
                    vec |= A.v[i].nf > 0;
                if (vec)
                    st = NSR_UNSUP(&F->X, e, "a power other than 2 of a vector inside mean()");
            }
            if (st == TPK_OK && k == 2) {
                mlist A2 = {0};
                for (int i = 0; i < A.n && st == TPK_OK; i++) {
                    mono c = {0};
                    if ((st = v_copy(F, &A.v[i].coef, &c.coef)) == TPK_OK) {
                        for (int q = 0; q < A.v[i].nf && st == TPK_OK; q++)
                            st = v_copy(F, &A.v[i].f[q], &c.f[c.nf++]);
                    }
                    if (st == TPK_OK)
                        st = ml_push(F, &A2, &c);
                    else
                        mono_free(F, &c);
                }
                if (st == TPK_OK)
                    st = ml_mul(F, &A, &A2, L, e);
                ml_free(F, &A2);
                ml_free(F, &A);
                return st;
            }
        }
        if (st == TPK_OK && e->op == NSR_T_STAR)
            st = ml_mul(F, &A, &B, L, e);
        ml_free(F, &A);
        ml_free(F, &B);
        if (st == TPK_OK && e->op == NSR_T_CARET) {
            /* a scalar power: evaluate as a leaf */
            goto leaf;
        }
        return st;
    }
    if (e->kind == NSR_E_BIN && e->op == NSR_T_SLASH) {
        val d;
        if (eval(F, e->b, D, &d))
            return F->X.ctx->status;
        if (d.kind == V_LIN) {
            val_free(F, &d);
            return NSR_UNSUP(&F->X, e->b, "division by a vector inside mean()");
        }
        if (v_scal(F, &d)) {
            val_free(F, &d);
            return F->X.ctx->status;
        }
        for (size_t i = 0; i < F->N * (size_t)D->m; i++)
            d.s[i] = 1.0 / d.s[i];
        mlist A = {0};
        if (expand(F, e->a, D, &A, depth + 1) == TPK_OK)
            for (int i = 0; i < A.n; i++) {
                v_scale(F, &A.v[i].coef, &d);
                ml_push(F, L, &A.v[i]);
                memset(&A.v[i], 0, sizeof A.v[i]);
            }
        ml_free(F, &A);
        val_free(F, &d);
        return F->X.ctx->status;
    }
leaf:;
    mono r = {0};
    val v;
    if (eval(F, e, D, &v))
        return F->X.ctx->status;
    if (v.kind == V_LIN) {
        v_const(&r.coef, D->m, 1);
        r.f[0] = v;
        r.nf = 1;
    } else {
        r.coef = v;
    }
    return ml_push(F, L, &r);
}

/* E[u_p v_p] at each input and point (same input, same member): N·m into out. */
static int diag_m2(fl *F, const val *u, const val *v, double *out)
{
    size_t N = F->N, m = (size_t)u->m;
    for (int i = 0; i < u->nt; i++)
        for (int j = 0; j < v->nt; j++) {
            const term *t = &u->t[i], *s = &v->t[j];
            size_t mt = (size_t)F->b[t->blk].m, ms = (size_t)F->b[s->blk].m;
            double *buf = NULL; /* pair_m2's, made only when it writes one */
            const fblock *bf = &F->b[t->blk];
            int same_member = t->blk == s->blk && !t->dense && !s->dense;
            for (size_t p = 0; same_member && p < m; p++)
                same_member = t->idx[p] < 0 || s->idx[p] < 0 || t->idx[p] == s->idx[p];
            if (!F->dry && same_member && bf->pend != NULL) {
                /* a pending block's diagonal is there: no matrix for a moment (LayerNorm's v) */
                touch(F, t->blk);
                const double *dg = bf->pend->diag;
                for (size_t a = 0; a < N; a++)
                    for (size_t p = 0; p < m; p++)
                        if (t->idx[p] >= 0 && s->idx[p] >= 0)
                            out[a * m + p] += (t->w ? t->w[a * m + p] : 1) *
                                              (s->w ? s->w[a * m + p] : 1) *
                                              dg[a * mt + (size_t)t->idx[p]];
                continue;
            }
            if (t->blk == s->blk && bf->kind == BK_BIAS && !t->dense && !s->dense) {
                /* initial G-var members: E[b_i b_j] = var_i δ_ij + μ_i μ_j (as lin_m2), not
                 * the block's (N m)² matrix */
                touch(F, t->blk);
                tpk_free(F->X.ctx, buf);
                for (size_t a = 0; !F->dry && a < N; a++)
                    for (size_t p = 0; p < m; p++) {
                        int i1 = t->idx[p], i2 = s->idx[p];
                        if (i1 < 0 || i2 < 0)
                            continue;
                        double e = (i1 == i2 ? bf->s[i1] : 0) +
                                   (bf->mean ? bf->mean[i1] * bf->mean[i2] : 0);
                        out[a * m + p] += (t->w ? t->w[a * m + p] : 1) *
                                          (s->w ? s->w[a * m + p] : 1) * e;
                    }
                continue;
            }
            if (!F->dry && t->blk == s->blk && !t->dense && !s->dense && bf->Fac != NULL &&
                bf->M2 == NULL) { /* entries of a factor block: dot products of its rows */
                size_t r = (size_t)bf->rank;
                touch(F, t->blk);
                for (size_t a = 0; a < N; a++)
                    for (size_t p = 0; p < m; p++) {
                        if (t->idx[p] < 0 || s->idx[p] < 0)
                            continue;
                        const double *x = bf->Fac + (a * mt + (size_t)t->idx[p]) * r;
                        const double *y = bf->Fac + (a * mt + (size_t)s->idx[p]) * r;
                        double acc = 0;
                        for (size_t q = 0; q < r; q++)
                            acc += x[q] * y[q];
                        out[a * m + p] += (t->w ? t->w[a * m + p] : 1) * (s->w ? s->w[a * m + p] : 1) * acc;
                    }
                tpk_free(F->X.ctx, buf);
                continue;
            }
            int zero, st;
            /* two gathers of one block read entries (a, i), (a, j): the lower triangle holds
             * them as (a, max), (a, min), so a lower-stored block need not be mirrored */
            int lower_ok = t->blk == s->blk && !t->dense && !s->dense;
            int indep = t->blk != s->blk && terms_indep(F, t, u->m, s, v->m);
            const double *P = pair_m2(F, t->blk, s->blk, &buf, &zero, &st, !lower_ok, indep);
            if (st || F->dry || zero) {
                tpk_free(F->X.ctx, buf);
                if (st)
                    return st;
                continue;
            }
            size_t ldp = N * ms;
            double *Wt = (t->dense || s->dense) ? term_dense(F, t, m) : NULL;
            double *Ws = (t->dense || s->dense) ? term_dense(F, s, m) : NULL;
            for (size_t a = 0; a < N; a++)
                for (size_t p = 0; p < m; p++) {
                    double acc = 0;
                    if (Wt) {
                        for (size_t q = 0; q < mt; q++) {
                            double wq = Wt[(a * m + p) * mt + q];
                            if (wq == 0)
                                continue;
                            const double *Prow = P + (a * mt + q) * ldp + a * ms;
                            for (size_t r = 0; r < ms; r++)
                                acc += wq * Prow[r] * Ws[(a * m + p) * ms + r];
                        }
                    } else if (t->idx[p] >= 0 && s->idx[p] >= 0) {
                        size_t i1 = (size_t)t->idx[p], i2 = (size_t)s->idx[p];
                        if (lower_ok && i2 > i1) { /* same block: ms = mt */
                            size_t tmpi = i1;
                            i1 = i2;
                            i2 = tmpi;
                        }
                        acc = (t->w ? t->w[a * m + p] : 1) * (s->w ? s->w[a * m + p] : 1) *
                              P[(a * mt + i1) * ldp + a * ms + i2];
                    }
                    out[a * m + p] += acc;
                }
            if (Wt && Wt != t->w)
                tpk_free(F->X.ctx, Wt);
            if (Ws && Ws != s->w)
                tpk_free(F->X.ctx, Ws);
            tpk_free(F->X.ctx, buf);
        }
    if (F->dry || (u->mu == NULL && v->mu == NULL))
        return TPK_OK;
    double *mU = nsr_fam_alloc(&F->X, N * m, sizeof *mU), *mV = nsr_fam_alloc(&F->X, N * m, sizeof *mV);
    int nz;
    if (mU == NULL || mV == NULL || lin_mean(F, u, mU, &nz) || lin_mean(F, v, mV, &nz)) {
        tpk_free(F->X.ctx, mU), tpk_free(F->X.ctx, mV);
        return F->X.ctx->status;
    }
    for (size_t i = 0; i < N * m; i++) {
        double a = u->mu ? u->mu[i] : 0, b = v->mu ? v->mu[i] : 0;
        out[i] += a * mV[i] + mU[i] * b - a * b;
    }
    tpk_free(F->X.ctx, mU), tpk_free(F->X.ctx, mV);
    return TPK_OK;
}

/* mean(body) at every point: Σ monomials coef·E[Π factors] (theory §1.9: the limit of a
 * NETSOR+ Moment is the expectation under the limit Gaussian). */
static int eval_mean(fl *F, const nsr_expr *e, const nsr_fdom *D, val *out)
{
    mlist L = {0};
    if (expand(F, e->args[0], D, &L, 0)) {
        ml_free(F, &L);
        return F->X.ctx->status;
    }
    size_t N = F->N, m = (size_t)D->m;
    v_const(out, D->m, 0);
    int st = v_scal(F, out);
    double *tmp = st ? NULL : nsr_fam_alloc(&F->X, N * m, sizeof *tmp);
    if (st == TPK_OK && tmp == NULL)
        st = F->X.ctx->status;
    for (int i = 0; i < L.n && st == TPK_OK; i++) {
        mono *q = &L.v[i];
        memset(tmp, 0, N * m * sizeof *tmp);
        int nz = 1;
        if (q->nf == 0) {
            for (size_t k = 0; k < N * m; k++)
                tmp[k] = 1;
        } else if (q->nf == 1) {
            st = lin_mean(F, &q->f[0], tmp, &nz);
        } else {
            st = diag_m2(F, &q->f[0], &q->f[1], tmp);
        }
        if (st)
            break;
        for (size_t k = 0; k < N * m; k++)
            out->s[k] += (q->coef.kind == V_CONST ? q->coef.c : q->coef.s[k]) * tmp[k];
    }
    tpk_free(F->X.ctx, tmp);
    ml_free(F, &L);
    if (st) /* eval's contract: nothing is left in out on failure */
        val_free(F, out);
    return st;
}

/* ---- functions --------------------------------------------------------------------------- */

static int eval_phi(fl *F, const nsr_expr *e, const nsr_fdom *D, val *out)
{
    if (e->nargs != 1)
        return nsr_fam_err(&F->X, TPK_ETYPE, e, "%s takes one argument", e->name);
    val u;
    if (eval(F, e->args[0], D, &u))
        return F->X.ctx->status;
    if (u.kind == V_CONST) {
        u.c = tpk_phi_eval(e->phi, u.c);
        *out = u;
        return TPK_OK;
    }
    if (u.kind == V_SCAL) {
        for (size_t i = 0; i < F->N * (size_t)u.m; i++)
            u.s[i] = tpk_phi_eval(e->phi, u.s[i]);
        *out = u;
        return TPK_OK;
    }
    /* a Gaussian argument, as one block */
    int arg = -1;
    if (u.nt == 1 && u.mu == NULL && !u.t[0].dense && u.t[0].w == NULL &&
        F->b[u.t[0].blk].kind == BK_GAUSS && F->b[u.t[0].blk].m == u.m) {
        arg = u.t[0].blk;
        for (long p = 0; p < u.m && arg >= 0; p++)
            if (u.t[0].idx[p] != p)
                arg = -1;
    }
    if (arg < 0 && materialize(F, &u, -1, &arg)) {
        val_free(F, &u);
        return F->X.ctx->status;
    }
    val_free(F, &u);
    int k = new_block(F, BK_NONLIN, -1, D->m);
    if (k < 0)
        return F->X.ctx->status;
    fblock *b = &F->b[k];
    b->phi = e->phi;
    b->arg = arg;
    b->line = e->line;
    b->nanc = 0;
    anc_union(b, &F->b[arg]);
    touch(F, arg);
    int *idx = nsr_fam_alloc(&F->X, (size_t)D->m, sizeof *idx);
    if (idx == NULL)
        return F->X.ctx->status;
    for (long p = 0; p < D->m; p++)
        idx[p] = (int)p;
    return v_gather(F, out, D->m, k, idx);
}

static int eval_call(fl *F, const nsr_expr *e, const nsr_fdom *D, val *out)
{
    if (e->sym < 0 && (strcmp(e->name, "mod") == 0 || strcmp(e->name, "wrap") == 0 ||
                       strcmp(e->name, "inside") == 0)) {
        return number_value(F, e, D, out);
    }
    if (strcmp(e->name, "mean") == 0 && e->sym < 0)
        return eval_mean(F, e, D, out);
    if (e->sym >= 0 && F->X.C->sym[e->sym].kind == NSR_SYM_AFAM)
        return eval_matmul(F, e, e->args[0], D, out);
    if (e->phi != NULL)
        return eval_phi(F, e, D, out);
    return NSR_UNSUP(&F->X, e, "'%s(...)' is not taken by the rolled evaluator", e->name);
}

static int eval(fl *F, const nsr_expr *e, const nsr_fdom *D, val *out)
{
    memset(out, 0, sizeof *out);
    if (F->X.ctx->status)
        return F->X.ctx->status;
    switch (e->kind) {
    case NSR_E_NUM:
        return v_const(out, D->m, e->num);
    case NSR_E_NAME:
        if (e->sym >= 0 && F->X.C->sym[e->sym].kind == NSR_SYM_INPUT)
            return nsr_fam_err(&F->X, TPK_ETYPE, e, "the input can only be embedded (U %s)", e->name);
        return eval_name(F, e, D, out);
    case NSR_E_CALL:
        return eval_call(F, e, D, out);
    case NSR_E_APPLY:
        return eval_matmul(F, e->a, e->b, D, out);
    case NSR_E_SUM:
        return eval_sum(F, e, D, out);
    case NSR_E_SOFTMAX:
        return eval_softmax(F, e, D, out);
    case NSR_E_NEG: {
        if (eval(F, e->a, D, out))
            return F->X.ctx->status;
        val c;
        v_const(&c, D->m, -1);
        return v_scale(F, out, &c);
    }
    case NSR_E_BIN: {
        val a, b;
        if (e->op == NSR_T_CARET) {
            double k;
            if (nsr_fam_num(&F->X, e->b, &k))
                return F->X.ctx->status;
            if (eval(F, e->a, D, &a))
                return F->X.ctx->status;
            if (a.kind == V_LIN) {
                if (k == 1) {
                    *out = a;
                    return TPK_OK;
                }
                val_free(F, &a);
                return NSR_UNSUP(&F->X, e, "a power of a vector outside mean(): write it as a function");
            }
            if (a.kind == V_CONST) {
                a.c = pow(a.c, k);
            } else {
                for (size_t i = 0; i < F->N * (size_t)a.m; i++)
                    a.s[i] = pow(a.s[i], k);
            }
            *out = a;
            return TPK_OK;
        }
        if (eval(F, e->a, D, &a))
            return F->X.ctx->status;
        if (eval(F, e->b, D, &b)) {
            val_free(F, &a);
            return F->X.ctx->status;
        }
        int st = TPK_OK;
        if (e->op == NSR_T_PLUS || e->op == NSR_T_MINUS) {
            st = v_add(F, &a, &b, e->op == NSR_T_PLUS ? 1 : -1);
        } else if (e->op == NSR_T_STAR) {
            if (a.kind == V_LIN && b.kind == V_LIN)
                st = NSR_UNSUP(&F->X, e, "a product of two vectors outside mean() (a Nonlin of several "
                           "G-vars)");
            else if (a.kind == V_LIN)
                st = v_scale(F, &a, &b);
            else {
                st = v_scale(F, &b, &a);
                val t = a;
                a = b;
                b = t;
            }
        } else { /* / */
            if (b.kind == V_CONST && b.c == 0) {
                st = nsr_fam_err(&F->X, TPK_ETYPE, e->b, "division by the constant 0");
            } else if (b.kind == V_LIN) {
                st = NSR_UNSUP(&F->X, e->b, "division by a vector");
            } else if ((st = v_scal(F, &b)) == TPK_OK) {
                for (size_t i = 0; i < F->N * (size_t)b.m; i++)
                    b.s[i] = 1.0 / b.s[i];
                st = v_scale(F, &a, &b);
            }
        }
        if (st) {
            val_free(F, &a);
            val_free(F, &b);
            return st;
        }
        val_free(F, &b);
        *out = a;
        return TPK_OK;
    }
    default:
        return NSR_UNSUP(&F->X, e, "expression not taken by the rolled evaluator");
    }
}

/* ---- instructions --------------------------------------------------------------------------- */

typedef struct fout {
    val v;
    double var, bias_var;
} fout;

static int is_identity(const val *v, const fblock *b)
{
    if (v->kind != V_LIN || v->nt != 1 || v->mu || v->t[0].dense || v->t[0].w || b->m != v->m)
        return 0;
    for (long p = 0; p < v->m; p++)
        if (v->t[0].idx[p] != p)
            return 0;
    return 1;
}

static int run_def(fl *F, const nsr_finstr *fi)
{
    const nsr_stmt *s = fi->stmt;
    nsr_fdom D;
    nsr_trie tr;
    memset(&tr, 0, sizeof tr);
    if (nsr_instr_domain(&F->X, fi, &D, &tr)) {
        tpk_free(F->X.ctx, D.val);
        nsr_trie_free(&tr, F->X.ctx);
        return F->X.ctx->status;
    }
    val v;
    int st = eval(F, s->value, &D, &v);
    tpk_free(F->X.ctx, D.val);
    if (st) {
        nsr_trie_free(&tr, F->X.ctx);
        return st;
    }
    int k = -1;
    if (v.kind != V_LIN) {
        if (s->annot == NSR_ANN_G || s->annot == NSR_ANN_H) {
            val_free(F, &v);
            nsr_trie_free(&tr, F->X.ctx);
            return nsr_fam_err(&F->X, TPK_ETYPE, s->value, "%s is annotated %s but its value is a scalar",
                          s->name, s->annot == NSR_ANN_G ? "G" : "H");
        }
        int zero = v.kind == V_CONST && v.c == 0 && s->annot != NSR_ANN_SCALAR;
        k = new_block(F, zero ? BK_ZERO : BK_SCAL, s->fam, v.m);
        if (k >= 0 && !zero && (st = v_scal(F, &v)) == TPK_OK) {
            F->b[k].s = v.s;
            v.s = NULL;
        }
        val_free(F, &v);
    } else if (s->annot == NSR_ANN_SCALAR) {
        val_free(F, &v);
        nsr_trie_free(&tr, F->X.ctx);
        return nsr_fam_err(&F->X, TPK_ETYPE, s->value, "%s is annotated scalar but its value is a vector",
                      s->name);
    } else {
        int dense = 0, nonlin = 0;
        for (int i = 0; i < v.nt; i++) {
            dense |= v.t[i].dense;
            nonlin |= F->b[v.t[i].blk].kind == BK_NONLIN;
        }
        if (v.nt == 1 && is_identity(&v, &F->b[v.t[0].blk]) && F->b[v.t[0].blk].fam < 0 &&
            F->b[v.t[0].blk].kind != BK_BIAS) {
            /* a new block (MatMul, φ) is the family's own */
            k = v.t[0].blk;
            F->b[k].fam = s->fam;
            F->b[k].fi = F->X.cur;
            val_free(F, &v);
        } else if (dense && !nonlin) {
            st = materialize(F, &v, s->fam, &k);
            val_free(F, &v);
        } else if (dense) {
            val_free(F, &v);
            st = NSR_UNSUP(&F->X, s->value, "an index sum of H-vars defining a family (pooling is taken "
                       "in a readout)");
        } else {
            k = new_block(F, BK_MIX, s->fam, v.m);
            if (k >= 0) {
                fblock *b = &F->b[k];
                b->nanc = 0;
                for (int i = 0; i < v.nt; i++) {
                    anc_union_term(F, &F->b[k], &v.t[i], v.m);
                    touch(F, v.t[i].blk);
                }
                F->b[k].mix = v;
            } else {
                val_free(F, &v);
            }
        }
    }
    if (k < 0 || st) {
        nsr_trie_free(&tr, F->X.ctx);
        return st ? st : F->X.ctx->status;
    }
    fblock *b = &F->b[k];
    b->fam = s->fam;
    b->fi = F->X.cur;
    b->nidx = s->nidx;
    b->tr = tr;
    b->line = s->name_line;
    b->col = s->name_col;
    return TPK_OK;
}

/* The outputs of an output instruction as the program's tpk_output entries ("y[3]"). */
static int name_outputs(fl *F, const nsr_stmt *s, const nsr_fdom *D, double var, double bias)
{
    tpk_program *P = F->fill;
    int st = TPK_OK;
    {
        tpk_output *no = tpk_realloc(F->X.ctx, P->output, ((size_t)P->noutputs + (size_t)D->m) * sizeof *no);
        if (no == NULL)
            st = TPK_ERROR(F->X.ctx, TPK_ENOMEM, "out of memory");
        else
            P->output = no;
        for (long q = 0; st == TPK_OK && q < D->m; q++) {
            char buf[160];
            size_t n = (size_t)snprintf(buf, sizeof buf, "%s", s->name);
            nsr_bind_point(&F->X, D, q);
            for (int i = 0; i < s->nidx && st == TPK_OK && n < sizeof buf; i++) {
                int v;
                st = nsr_fam_int(&F->X, s->idx[i], &v);
                n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%d", i ? "," : "[", v);
                if (i == s->nidx - 1 && n < sizeof buf)
                    n += (size_t)snprintf(buf + n, sizeof buf - n, "]");
            }
            tpk_output *y = &P->output[P->noutputs];
            memset(y, 0, sizeof *y);
            if (st == TPK_OK && (y->name = tpk_strdup(F->X.ctx, buf)) == NULL)
                st = TPK_ERROR(F->X.ctx, TPK_ENOMEM, "out of memory");
            if (st == TPK_OK) {
                y->src = -1;
                y->var = var;
                y->bias_var = bias;
                P->noutputs++;
            }
        }
    }
    return st;
}

static int run_output(fl *F, const nsr_finstr *fi, fout *o)
{
    const nsr_stmt *s = fi->stmt;
    const nsr_expr *rd = s->value;
    nsr_fdom D;
    nsr_trie tr;
    memset(&tr, 0, sizeof tr);
    int st = nsr_instr_domain(&F->X, fi, &D, &tr);
    nsr_trie_free(&tr, F->X.ctx);
    if (st) {
        tpk_free(F->X.ctx, D.val);
        return st;
    }
    memset(o, 0, sizeof *o);
    if (nsr_fam_num(&F->X, rd->args[1], &o->var) || (rd->nargs == 3 && nsr_fam_num(&F->X, rd->args[2], &o->bias_var))) {
        tpk_free(F->X.ctx, D.val);
        return F->X.ctx->status;
    }
    if (o->var < 0 || o->bias_var < 0) {
        tpk_free(F->X.ctx, D.val);
        return nsr_fam_err(&F->X, TPK_ETYPE, rd, "readout variance is negative");
    }
    st = eval(F, rd->args[0], &D, &o->v);
    if (st == TPK_OK && o->v.kind != V_LIN)
        st = nsr_fam_err(&F->X, TPK_ETYPE, rd->args[0], "readout needs a G- or H-var, not a scalar");
    if (st == TPK_OK && F->fill != NULL) /* a rolled-only program: name its outputs */
        st = name_outputs(F, s, &D, o->var, o->bias_var);
    tpk_free(F->X.ctx, D.val);
    return st;
}

/* ---- driver ------------------------------------------------------------------------------- */

static void fl_free(fl *F)
{
    for (int k = 0; k < F->nb; k++) {
        block_data_free(F, &F->b[k]);
        nsr_trie_free(&F->b[k].tr, F->X.ctx);
    }
    tpk_free(F->X.ctx, F->b);
    tpk_free(F->X.ctx, F->amark);
    nsr_fam_free(&F->X);

    for (int i = 0; i < 6; i++)
        tpk_free(F->X.ctx, F->pool[i].p);
    tpk_gauss_ws_free(F->ws);
}

/* Keep only the last member of v (the default kernel reads the last output). */
static int v_last(fl *F, val *v)
{
    size_t N = F->N, m = (size_t)v->m;
    for (int i = 0; i < v->nt; i++) {
        term *t = &v->t[i];
        size_t ms = (size_t)F->b[t->blk].m;
        if (t->dense) {
            for (size_t a = 0; a < N; a++)
                memmove(t->w + a * ms, t->w + (a * m + m - 1) * ms, ms * sizeof *t->w);
        } else {
            t->idx[0] = t->idx[m - 1];
            if (t->w)
                for (size_t a = 0; a < N; a++)
                    t->w[a] = t->w[a * m + m - 1];
        }
    }
    if (v->mu)
        for (size_t a = 0; a < N; a++)
            v->mu[a] = v->mu[a * m + m - 1];
    v->m = 1;
    return TPK_OK;
}

/* One pass over the program: plan (F->dry) or numbers. */
static int fl_run(fl *F, int all_outputs, const int *plan_last, int nplan, tpk_array **K)
{
    const nsr_rolled *R = F->X.R;
    int nout = 0;
    for (int k = 0; k < R->nfi; k++)
        nout += R->fi[k].stmt->kind == NSR_S_OUTPUT;
    if (nout == 0)
        return TPK_ERROR(F->X.ctx, TPK_ETYPE, "%s: the program has no output", R->file);
    fout *out = nsr_fam_alloc(&F->X, (size_t)nout, sizeof *out);
    if (out == NULL)
        return F->X.ctx->status;
    int no = 0, st = TPK_OK;
    if (plan_last != NULL || F->pj == NULL) {
        F->plan = plan_last;
        F->nplan = nplan;
    }
    /* TPK_NETSOR_TRACE=1: seconds per family instruction on stderr (where the time goes) */
    const char *tr = getenv("TPK_NETSOR_TRACE");
    int trace = !F->dry && tr != NULL && strcmp(tr, "1") == 0;
    double t_prev = trace ? tpk_wall_seconds() : 0;
    for (int k = 0; k < R->nfi && st == TPK_OK; k++) {
        if (!F->dry && (st = tpk_progress_report(F->X.progress, "family instructions", (size_t)k,
                                                 (size_t)R->nfi, F->X.ctx)))
            break;
        if (trace && k > 0) {
            double t = tpk_wall_seconds();
            fprintf(stderr, "  %s:%d: %s %.4f s\n", R->file, R->fi[k - 1].stmt->line,
                    R->fi[k - 1].stmt->name, t - t_prev);
            t_prev = t;
        }
        F->X.cur = k;
        memcpy(F->X.num, R->fi[k].num, ((size_t)F->X.C->nsym + 1) * sizeof *F->X.num);
        st = R->fi[k].stmt->kind == NSR_S_OUTPUT ? run_output(F, &R->fi[k], &out[no++])
                                                 : run_def(F, &R->fi[k]);
        const int *pl = F->dry ? NULL : plan_get(F, 0);
        if (st == TPK_OK)
            st = plan_status(F, 0); /* the plan failed: its error is the result */
        if (st == TPK_OK && pl)
            for (int b = 0; b < F->nb && b < F->nplan; b++)
                if (pl[b] <= k && pl[b] >= 0 && F->b[b].last_use != INT32_MAX) {
                    kill_block(F, b);
                    F->b[b].last_use = INT32_MAX; /* freed */
                }
    }
    if (trace && R->nfi > 0) {
        double t = tpk_wall_seconds();
        fprintf(stderr, "  %s:%d: %s %.4f s\n", R->file, R->fi[R->nfi - 1].stmt->line,
                R->fi[R->nfi - 1].stmt->name, t - t_prev);
        t_prev = t;
    }
    if (st == TPK_OK && !F->dry && F->pj != NULL) { /* the rest of the frees, and its verdict */
        st = plan_status(F, 1);
        if (trace) {
            double t = tpk_wall_seconds();
            fprintf(stderr, "  %s: waiting for the plan %.4f s\n", R->file, t - t_prev);
            t_prev = t;
        }
        const int *pl = plan_get(F, 0);
        for (int b = 0; st == TPK_OK && pl && b < F->nb && b < F->nplan; b++)
            if (pl[b] >= 0 && F->b[b].last_use != INT32_MAX) {
                kill_block(F, b);
                F->b[b].last_use = INT32_MAX;
            }
    }
    if (st == TPK_OK && !F->dry)
        st = tpk_progress_report(F->X.progress, "family instructions", (size_t)R->nfi,
                                 (size_t)R->nfi, F->X.ctx);
    F->X.cur = R->nfi; /* the outputs read their blocks at the end */
    F->nb_stmts = F->nb;
    if (st == TPK_OK && !all_outputs) {
        for (int i = 0; i < no - 1; i++)
            val_free(F, &out[i].v);
        out[0] = out[no - 1];
        no = 1;
        v_last(F, &out[0].v);
    }
    /* one output read: the last output statement (the kernel of every output reads several) */
    F->final_out = NULL;
    for (int k = R->nfi - 1; k >= 0 && no == 1; k--)
        if (R->fi[k].stmt->kind == NSR_S_OUTPUT) {
            F->final_out = R->fi[k].stmt;
            break;
        }
    size_t O = 0;
    for (int i = 0; st == TPK_OK && i < no; i++)
        O += (size_t)out[i].v.m;
    if (st == TPK_OK && O > 200000)
        st = TPK_ERROR(F->X.ctx, TPK_EINVAL, "%s: %zu outputs per input are too many for one kernel",
                       R->file, O);
    size_t N = F->N, dim = N * O;
    tpk_array *Kout = NULL;
    if (st == TPK_OK && !F->dry) {
        /* uninitialised: every path below writes each entry or gives K a block of its own
         * (zeroing dim² entries that a leaf's matrix then replaces was 3 % of a transformer) */
        double *q = tpk_array_check_memory(dim * dim, "kernel", F->X.ctx) ? NULL
                    : fl_big(F, dim * dim, sizeof *q, 0);
        Kout = q != NULL ? tpk_array_alloc2(1, 1, F->X.ctx) : NULL;
        if (Kout == NULL) {
            tpk_free(F->X.ctx, q);
            st = F->X.ctx->status;
        } else {
            tpk_free(F->X.ctx, Kout->data);
            Kout->data = q;
            Kout->dims[0] = Kout->dims[1] = dim;
        }
    }
    size_t oi0 = 0;
    for (int i = 0; i < no && st == TPK_OK; i++) {
        size_t oj0 = 0;
        for (int j = 0; j <= i && st == TPK_OK; j++) {
            const fout *a = &out[i], *c = &out[j];
            size_t mi = (size_t)a->v.m, mj = (size_t)c->v.m;
            if (F->dry) {
                st = lin_m2(F, &a->v, &c->v, NULL, 0, i == j, 1.0);
                oj0 += mj;
                continue;
            }
            if (no == 1 && a->v.nt == 1 && a->v.mu == NULL && is_identity_term(&a->v.t[0], a->v.m) &&
                F->b[a->v.t[0].blk].kind == BK_NONLIN && F->b[a->v.t[0].blk].M2 == NULL &&
                F->b[F->b[a->v.t[0].blk].arg].pend != NULL &&
                (size_t)F->b[a->v.t[0].blk].m * N == dim) {
                /* y = readout(φ(g)), g pending: the readout's map is the plan's last node, its
                 * result the kernel (the whole recursion in the passes the plan chooses) */
                const fblock *bx = &F->b[a->v.t[0].blk];
                st = ensure_ws_for(F, bx->phi);
                const ew_readout ro = {.phi = bx->phi, .alpha = a->var, .beta = a->bias_var,
                                      .out = &Kout->data};
                if (st == TPK_OK)
                    st = ew_flush(F, bx->arg, &ro, 1);
                break;
            }
            if (no == 1 && a->v.nt == 1 && a->v.mu == NULL && is_identity_term(&a->v.t[0], a->v.m) &&
                F->b[a->v.t[0].blk].kind == BK_NONLIN && F->b[a->v.t[0].blk].M2 == NULL &&
                F->b[F->b[a->v.t[0].blk].arg].mean == NULL &&
                block_m2(F, F->b[a->v.t[0].blk].arg) != NULL &&
                ensure_ws_for(F, F->b[a->v.t[0].blk].phi) == TPK_OK) {
                /* y = readout(φ(g)): K = σ_v² V_φ(Σ_g) + β in one fused map */
                const fblock *bx = &F->b[a->v.t[0].blk];
                double e = 0;
                /* the lower triangle by the map (the tuned kernel for ReLU), then the mirror:
                 * measured faster than the map's own mirrored tiles (N = 4096: 42 ms, 54 ms) */
                fblock *g = &F->b[bx->arg];
                if (g->M2 != NULL && g->pins == 0 && (size_t)g->m * N == dim) {
                    /* g is read for the last time: the map runs in place and K takes its
                     * matrix (no fresh dim² pages to fault in); both come from F's allocator */
                    tpk_free(F->X.ctx, Kout->data);
                    Kout->data = g->M2;
                    g->M2 = NULL;
                }
                st = tpk_gauss_map_affine_lower(bx->phi, g->M2 ? g->M2 : Kout->data, dim, a->var,
                                                a->bias_var, Kout->data, F->ws, &e, F->X.ctx);
                if (st == TPK_OK)
                    nsr_ew_mirror(Kout->data, dim);
                F->err = fmax(F->err, e * a->var);
                break;
            }
            const term *t0 = a->v.nt == 1 ? &a->v.t[0] : NULL;
            fblock *g0 = t0 ? &F->b[t0->blk] : NULL;
            if (no == 1 && a->v.kind == V_LIN && a->v.nt == 1 && a->v.t[0].dense &&
                a->v.m == 1 && all_zero(a->v.mu, N)) {
                /* y = readout(Σ_p w_p φ(g)_p) (a CNN's global average pool), g a pair program:
                 * each input pair's block is pooled where it is made — no (N m)² matrix */
                const fblock *bx = &F->b[a->v.t[0].blk];
                int g = bx->kind == BK_NONLIN && bx->M2 == NULL ? bx->arg
                        : bx->kind == BK_GAUSS                  ? a->v.t[0].blk
                                                                : -1;
                if (g >= 0 && F->b[g].pend != NULL && F->b[g].mean == NULL &&
                    F->b[g].m == bx->m && ew_pairwise(F, g)) {
                    const ew_readout ro = {.phi = bx->kind == BK_NONLIN ? bx->phi : NULL,
                                           .alpha = a->var, .beta = a->bias_var,
                                           .pool = a->v.t[0].w, .out = &Kout->data};
                    st = ew_flush(F, g, &ro, 1);
                    break;
                }
                if (F->X.ctx->status) {
                    st = F->X.ctx->status;
                    break;
                }
            }
            if (no == 1 && a->v.kind == V_LIN && (a->bias_var == 0 || a->v.m == 1)) {
                /* y = readout(Σ_t w_t·g_t) of independent blocks, some pending (a transformer's
                 * last LayerNorm over its residual sum): the sum and the readout's scaling are
                 * the plan's last nodes, both triangles written from its tiles (no mirror) */
                pend *P = NULL;
                int es = ew_sum_of(F, &a->v, cur_line(F), cur_col(F), &P), k = -1;
                if (es > 0 && ((k = new_block(F, BK_GAUSS, -1, a->v.m)) < 0 || pend_attach(F, k, P))) {
                    if (k < 0)
                        pend_discard(F, P);
                    es = -1;
                }
                if (es < 0) {
                    st = F->X.ctx->status;
                    break;
                }
                if (es > 0) {
                    const ew_readout ro = {.alpha = a->var, .beta = a->bias_var, .out = &Kout->data};
                    st = ew_flush(F, k, &ro, 1);
                    break;
                }
            }
            if (no == 1 && t0 && g0->kind == BK_GAUSS && g0->M2 != NULL && g0->pins == 0 &&
                g0->mean == NULL &&
                (size_t)g0->m * N == dim && is_identity_gather(t0, a->v.m) &&
                all_zero(a->v.mu, dim)) {
                /* y = readout(w·g), g read for the last time: K takes g's matrix, scaled in
                 * place (no zeroed dim² block), as the φ readout above */
                double *M = g0->M2;
                const double *w = t0->w, sc = a->var, beta = a->bias_var;
                g0->M2 = NULL;
                tpk_free(F->X.ctx, Kout->data);
                Kout->data = M;
#pragma omp parallel for schedule(dynamic, 64) if (dim >= 512)
                for (size_t r = 0; r < dim; r++)
                    for (size_t q = 0; q <= r; q++)
                        M[r * dim + q] = sc * (w ? w[r] * w[q] : 1) * M[r * dim + q] + beta;
                nsr_ew_mirror(M, dim);
                break;
            }
            if (no == 1) { /* one output family: K is its second-moment block itself */
                double sc = a->var, beta = a->bias_var;
                /* a block of the pool where one is free (a freed block of this size: no fresh
                 * pages to fault in, measured 83 ms of 95 for the transformer's 2000² output),
                 * else fresh pages zeroed by writing before the first += reads them (fl_big) */
                double *q = fl_big(F, dim * dim, sizeof *q, 1);
                if (q == NULL) {
                    st = F->X.ctx->status;
                    break;
                }
                tpk_free(F->X.ctx, Kout->data);
                Kout->data = q;
                st = lin_m2(F, &a->v, &a->v, Kout->data, dim, 1, sc);
                if (st == TPK_OK) {
                    nsr_ew_mirror(Kout->data, dim);
                    if (beta != 0)
                        for (size_t x = 0; x < dim * dim; x++)
                            Kout->data[x] += beta;
                }
                break;
            }
            double *M = nsr_fam_alloc(&F->X, N * mi * N * mj, sizeof *M);
            if (M == NULL) {
                st = F->X.ctx->status;
                break;
            }
            st = lin_m2(F, &a->v, &c->v, M, N * mj, i == j, 1.0);
            if (st == TPK_OK && i == j)
                nsr_ew_mirror(M, N * mi);
            double s = sqrt(a->var * c->var), beta = sqrt(a->bias_var * c->bias_var);
            for (size_t x = 0; st == TPK_OK && x < N; x++)
                for (size_t p = 0; p < mi; p++)
                    for (size_t y = 0; y < N; y++)
                        for (size_t q = 0; q < mj; q++) {
                            double v = s * M[(x * mi + p) * N * mj + y * mj + q] + beta;
                            Kout->data[(x * O + oi0 + p) * dim + y * O + oj0 + q] = v;
                            Kout->data[(y * O + oj0 + q) * dim + x * O + oi0 + p] = v;
                        }
            tpk_free(F->X.ctx, M);
            oj0 += mj;
        }
        oi0 += (size_t)out[i].v.m;
    }
    for (int i = 0; i < no; i++)
        val_free(F, &out[i].v);
    tpk_free(F->X.ctx, out);
    int finite = 1; /* checked over the threads first; the first bad entry is named below */
    if (st == TPK_OK && Kout) {
        const double *kd = Kout->data;
        size_t nn = dim * dim;
#pragma omp parallel for reduction(& : finite) schedule(static) if (nn >= ((size_t)1 << 18))
        for (size_t i = 0; i < nn; i++)
            finite &= isfinite(kd[i]) != 0;
    }
    if (st == TPK_OK && Kout && !finite)
        for (size_t i = 0; i < dim * dim; i++)
            if (!isfinite(Kout->data[i])) {
                st = TPK_ERROR(F->X.ctx, TPK_ENUMERIC, "limit kernel has a non-finite entry (%zu, %zu)",
                               i / dim, i % dim);
                break;
            }
    if (trace)
        fprintf(stderr, "  %s: kernel of the outputs %.4f s\n", R->file, tpk_wall_seconds() - t_prev);
    if (st) {
        tpk_array_free(Kout);
        return st;
    }
    if (K)
        *K = Kout;
    return TPK_OK;
}

static int fl_init(fl *F, const tpk_program *p, size_t N, size_t T, size_t d, const double *x,
                   tpk_ctx *ctx)
{
    memset(F, 0, sizeof *F);
    int st = nsr_fam_init(&F->X, p, ctx);
    F->X.big_hint = "one covariance block over (input × member)";
    F->p = p;
    F->N = N;
    F->T = T;
    F->d = d;
    F->x = x;
    F->dry = N == 0;
    if (st)
        return st;
    F->amark = nsr_fam_alloc(&F->X, (size_t)F->X.R->ndm + 1, sizeof *F->amark);
    if (F->amark == NULL)
        return ctx->status;
    for (int i = 0; i < F->X.R->ndm; i++)
        F->amark[i] = -1;
    return TPK_OK;
}

int nsr_flimit_plan(tpk_program *p, long budget, tpk_ctx *ctx, int *unsupported, int *deferred)
{
    fl F;
    *deferred = 0;
    int st = fl_init(&F, p, 0, (size_t)p->nslots, 0, NULL, ctx);
    F.X.work_budget = budget;
    if (st == TPK_OK)
        st = fl_run(&F, 1, NULL, 0, NULL);
    *unsupported = F.X.unsup;
    *deferred = F.X.deferred;
    if (st == TPK_OK) {
        nsr_rolled *R = p->rolled;
        tpk_mem_free(&R->al, R->plan_last); /* no memory: each evaluation plans (no error) */
        R->plan_last = tpk_mem_malloc(&R->al, ((size_t)F.nb + 1) * sizeof *R->plan_last, NULL);
        if (R->plan_last != NULL) {
            for (int k = 0; k < F.nb_stmts; k++)
                R->plan_last[k] = F.b[k].last_use >= R->nfi ? -1 : F.b[k].last_use;
            R->nplan = F.nb_stmts;
        }
    }
    fl_free(&F);
    return st;
}

int nsr_flimit_outputs(tpk_program *p, tpk_ctx *ctx)
{
    fl F;
    int st = fl_init(&F, p, 0, (size_t)p->nslots, 0, NULL, ctx);
    F.fill = p;
    for (int k = 0; st == TPK_OK && k < F.X.R->nfi; k++) {
        const nsr_finstr *fi = &F.X.R->fi[k];
        if (fi->stmt->kind != NSR_S_OUTPUT)
            continue;
        F.X.cur = k;
        memcpy(F.X.num, fi->num, ((size_t)F.X.C->nsym + 1) * sizeof *F.X.num);
        nsr_fdom D;
        nsr_trie tr;
        memset(&tr, 0, sizeof tr);
        st = nsr_instr_domain(&F.X, fi, &D, &tr);
        nsr_trie_free(&tr, ctx);
        double var = 0, bias = 0;
        const nsr_expr *rd = fi->stmt->value;
        if (st == TPK_OK)
            st = nsr_fam_num(&F.X, rd->args[1], &var);
        if (st == TPK_OK && rd->nargs == 3)
            st = nsr_fam_num(&F.X, rd->args[2], &bias);
        if (st == TPK_OK)
            st = name_outputs(&F, fi->stmt, &D, var, bias);
        tpk_free(ctx, D.val);
    }
    fl_free(&F);
    return st;
}

static void *plan_thread(void *arg)
{
    plan_job *J = arg;
    double t0 = tpk_wall_seconds();
    fl P;
    int st = fl_init(&P, J->p, 0, J->T, J->d, NULL, &J->ctx);
    if (st == TPK_OK)
        st = fl_run(&P, J->all_outputs, NULL, 0, NULL);
    int *last = NULL;
    if (st == TPK_OK &&
        (last = tpk_malloc(&J->ctx, ((size_t)P.nb_stmts + 1) * sizeof *last)) == NULL)
        st = TPK_ERROR(&J->ctx, TPK_ENOMEM, "out of memory");
    for (int k = 0; st == TPK_OK && k < P.nb_stmts; k++)
        last[k] = P.b[k].last_use >= P.X.R->nfi ? -1 : P.b[k].last_use;
    pthread_mutex_lock(&J->mu);
    J->st = st;
    J->unsup = P.X.unsup;
    J->nb = P.nb_stmts;
    J->last = last;
    J->seconds = tpk_wall_seconds() - t0;
    J->done = 1;
    pthread_cond_broadcast(&J->cv);
    pthread_mutex_unlock(&J->mu);
    fl_free(&P);
    return NULL;
}

int nsr_flimit_kernel(const tpk_program *p, const tpk_array *x, int all_outputs, tpk_array **K,
                      double *err, int *unsupported, const tpk_limit_opts *opts, tpk_ctx *ctx)
{
    *unsupported = 0;
    size_t N, T, d;
    const tpk_progress *progress = opts ? opts->progress : NULL;
    int plan_kind = opts ? opts->plan : 0;
    if (plan_kind == 0 && nsr_plan_from_env(&plan_kind, ctx))
        return ctx->status;
    if (nsr_rolled_input(p, x, &N, &T, &d, ctx))
        return ctx->status;
    const nsr_rolled *RR = p->rolled;
    int st = TPK_OK, nb = 0, threaded = 0;
    int *last = NULL;
    plan_job J;
    memset(&J, 0, sizeof J);
    if (RR->plan_last != NULL) { /* planned at load */
        nb = RR->nplan;
        if ((last = tpk_malloc(ctx, ((size_t)nb + 1) * sizeof *last)) == NULL)
            return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        memcpy(last, RR->plan_last, (size_t)nb * sizeof *last);
    } else {
        J.p = p;
        J.T = T;
        J.d = d;
        J.all_outputs = all_outputs;
        tpk_ctx_init_from(&J.ctx, ctx);
        pthread_t th;
        if (pthread_mutex_init(&J.mu, NULL) == 0) {
            if (pthread_cond_init(&J.cv, NULL) == 0) {
                threaded = pthread_create(&th, NULL, plan_thread, &J) == 0 ? 1 : 0;
                if (!threaded)
                    pthread_cond_destroy(&J.cv);
            }
            if (!threaded)
                pthread_mutex_destroy(&J.mu);
        }
        if (!threaded) { /* no second thread: plan first, as the thread would */
            fl P;
            st = fl_init(&P, p, 0, T, d, NULL, ctx);
            if (st == TPK_OK)
                st = fl_run(&P, all_outputs, NULL, 0, NULL);
            *unsupported = P.X.unsup;
            nb = P.nb_stmts;
            if (st == TPK_OK && (last = tpk_malloc(ctx, ((size_t)nb + 1) * sizeof *last)) == NULL)
                st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
            for (int k = 0; st == TPK_OK && k < nb; k++)
                last[k] = P.b[k].last_use >= P.X.R->nfi ? -1 : P.b[k].last_use;
            fl_free(&P);
            if (st)
                return st;
        }
        if (threaded) {
            fl F;
            tpk_ctx rc;
            tpk_ctx_init_from(&rc, ctx);
            st = fl_init(&F, p, N, T, d, x->data, &rc);
            F.pj = &J;
            F.X.progress = progress; /* reports and the cancel flag, as without the thread */
            F.plan_kind = plan_kind;
            F.plan_report = opts ? opts->plan_report : NULL;
            F.plan_verify = opts ? opts->plan_verify : 0;
            F.plan_signatures = opts ? opts->plan_signatures : 0;
            F.cal.provider = opts ? opts->ew_provider : NULL;
            if (st == TPK_OK)
                st = fl_run(&F, all_outputs, NULL, 0, K);
            int made = st == TPK_OK && K != NULL; /* *K is ours to free if the verdict is no */
            pthread_join(th, NULL);
            pthread_cond_destroy(&J.cv);
            pthread_mutex_destroy(&J.mu);
            const char *tr = getenv("TPK_NETSOR_TRACE");
            if (tr != NULL && strcmp(tr, "1") == 0)
                fprintf(stderr, "  %s: plan %.4f s beside the run, %d blocks\n", RR->file, J.seconds,
                        J.nb);
            if (J.st != TPK_OK) { /* the plan's error, as if it had run first */
                st = J.st;
                *unsupported = J.unsup;
                tpk_error_at(ctx, J.ctx.status, J.ctx.src_file, J.ctx.src_line, "%s", J.ctx.msg);
            } else {
                if (st == TPK_OK && F.nb_stmts != J.nb)
                    st = TPK_ERROR(&rc, TPK_EINVAL, "internal: the plan and the run differ (%d vs "
                                   "%d blocks)", J.nb, F.nb_stmts);
                if (st)
                    tpk_error_at(ctx, rc.status, rc.src_file, rc.src_line, "%s", rc.msg);
                *unsupported = F.X.unsup;
            }
            if (st != TPK_OK && made) {
                tpk_array_free(*K);
                *K = NULL;
            }
            if (err)
                *err = F.err;
            tpk_free(ctx, J.last);
            fl_free(&F);
            return st;
        }
    }
    fl F;
    st = fl_init(&F, p, N, T, d, x->data, ctx);
    F.X.progress = progress;
    F.plan_kind = plan_kind;
    F.plan_report = opts ? opts->plan_report : NULL;
    F.plan_verify = opts ? opts->plan_verify : 0;
    F.plan_signatures = opts ? opts->plan_signatures : 0;
    F.cal.provider = opts ? opts->ew_provider : NULL;
    if (st == TPK_OK)
        st = fl_run(&F, all_outputs, last, nb, K);
    if (st == TPK_OK && F.nb_stmts != nb)
        st = TPK_ERROR(ctx, TPK_EINVAL, "internal: the plan and the run differ (%d vs %d blocks)",
                       nb, F.nb_stmts);
    *unsupported = F.X.unsup;
    if (err)
        *err = F.err;
    tpk_free(ctx, last);
    fl_free(&F);
    return st;
}

int nsr_flimit_refusal(const tpk_program *p, tpk_ctx *ctx)
{
    return TPK_ERROR(ctx, TPK_EUNSUPPORTED, "%s (the unrolled form is too large here; the "
                     "finite-width executor runs the program)",
                     p->rolled && p->rolled->limit_why[0] ? p->rolled->limit_why
                                                          : "no limit evaluator takes it");
}
