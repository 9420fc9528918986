/* Internal interface of the rolled limit evaluator (netsor/flimit*.c): the Master Theorem
 * recursion of netsor/limit.c on whole index families instead of member by member (issue 14;
 * theory.md §1.6–1.9, §2.7–2.8, docs/netsor.md "Rolled programs"). Its files, bottom up (each
 * calls only the ones above it in this list, never back):
 *   flimit_value.c       values: a constant, per-point scalars, or Σ terms over blocks (a gather,
 *                        one member per point, or a dense mixing map: attention's Σ_j a_ij k_j)
 *   flimit_indep.c       structural independence: the roots each block depends on
 *   flimit_store.c       the block table: buffer pool, block lifecycle and pins, the liveness
 *                        queries the plan answers, blocks made on demand (inputs, biases)
 *   flimit_sandwich.c    GEMM kernels of linear maps: C·M2·Cᵀ sandwiches, triangular ones,
 *                        low-rank factors
 *   flimit_pend.c        pending entrywise blocks: the DAG of maps and sums handed to
 *                        netsor/ewplan.c and netsor/ewpair.c (docs/orchestration.md §7)
 *   flimit_expect.c      second moments: of a block (φ maps, factors), of a pair of blocks, of
 *                        linear values (E[u vᵀ] by term kind), their diagonals and means
 *   flimit_materialize.c a value becomes a Gaussian block (factor, pending sum, in place)
 *   flimit_matmul.c      MatMul lowering: one atom per MatMul, convolution taps
 *   flimit_expand.c      Moments: monomial lists (degree ≤ 2) and their expectations
 *   flimit_eval.c        the expression walk: names, numbers, MatMuls, sums, softmax, φ, mean()
 *   flimit_stmt.c        statements: a family instruction's value becomes its block
 *   flimit_readout.c     outputs → K = σ_v² E[y yᵀ] + β, by a table of readout strategies
 *   flimit.c             driver: plan (the same pass with N = 0, on a second thread), the
 *                        statement loop, blocks freed at their last use
 *
 * How a program runs: the plan is the same pass with no inputs (N = 0): domains, index maps,
 * block kinds and which forms are supported, and every block's last use (liveness). The run
 * keeps one block per family instruction (and temporaries), each a covariance block over
 * (input × member) — second moments E[Z_p^a Z_q^c] of the (N·m)×(N·m) block — with first
 * moments, or a deterministic scalar family (NETSOR+ Moments). An expression over a domain
 * evaluates to a value; MatMul → σ²·E[h hᵀ] of its source (a sandwich C·M2·Cᵀ of the value's
 * terms, GEMMs for dense maps); a sum over a binder of MatMuls by distinct fresh A-vars
 * (convolution taps) → one block accumulating each tap's term; φ(Gaussian block) → the
 * whole-matrix expectation maps of kernels/gauss (closed forms, Mehler, quadrature); Moments →
 * the block's diagonal; softmax → scalar rows; outputs → K, blocks freed at their last use.
 *
 * Fusions where a block dies at once (the plan says so): A·φ(g) and readout(φ(g)) map straight
 * into their targets, a dying atom lends its matrix to g = atom + b, an embedding of every slot
 * writes the input Gram into its atom. Where the dying block is g itself and the statement reads
 * it once (nsr_fl_defined_names), the work runs in place over g's matrix: the layer map of
 * W·φ(g) + b, φ(g)'s moments, and a convolution's taps (per input pair, with φ's map fused in).
 * A fresh (N m)² block costs its first touch — page faults and the kernel's zeroing, more than
 * the map itself — so each in-place step saves one. Symmetric blocks keep their lower triangle
 * and are mirrored only when a reader needs both.
 *
 * Independence is structural: every MatMul by an A-var that no other MatMul uses, every
 * embedding and every initial G-var starts a new root, and blocks without a common root are
 * independent (E[XY] = E[X]E[Y]). What this evaluator does not take — A-vars shared by several
 * MatMuls (recurrent weights), products of two vectors outside mean(), batchnorm, correlated
 * cross terms — is reported as TPK_EUNSUPPORTED with the statement's position, and the caller
 * uses the unrolled form. Not installed. */
#ifndef TPK_NETSOR_FLIMIT_IMPL_H
#define TPK_NETSOR_FLIMIT_IMPL_H

#include <pthread.h>
#include <stdio.h>

#include "backend-impl.h"
#include "ewplan-impl.h"
#include "family-impl.h"
#include "ir-impl.h"

#define MAXANC 48 /* roots remembered per block */

/* A factor Fac (n × r) is kept instead of the (N m)² matrix when r ≤ n / FAC_RATIO. */
#define FAC_RATIO 4

enum { BK_GAUSS, BK_NONLIN, BK_BIAS, BK_SCAL, BK_MIX, BK_ZERO };

/* fblock.fi of the blocks made before every instruction and seen by each: the input slots' and
 * an initial G-var family's. */
#define FI_BEFORE_ALL (-1)

enum { V_CONST, V_SCAL, V_LIN };

/* One term of a linear value: members of block blk read at each point, a gather (one member per
 * point, per-point weights) or a dense per-input map. */
typedef struct term {
    int blk;
    int dense;          /* 0: gather idx/w; 1: w is N × m × m_src */
    int *idx;           /* gather: source member per point, −1 = none */
    double *w;          /* gather: N × m weights (NULL: 1) */
} term;

/* A value over a domain of m points, per input: a constant, per-point scalars, or a linear
 * combination Σ terms + mu of block members (V_LIN: a vector). */
typedef struct val {
    int kind;
    long m;
    double c;           /* V_CONST */
    double *s;          /* V_SCAL: N × m */
    int nt;
    term *t;            /* V_LIN */
    double *mu;         /* V_LIN: N × m constant part (NULL: 0) */
} val;

/* A block: one family instruction's members (or a temporary's) over (input × member), with their
 * second moments, or a deterministic scalar family; kinds BK_*. */
typedef struct fblock {
    int kind, fam;
    int fi;             /* the family instruction that made it (FI_BEFORE_ALL: none) */
    int input;          /* the input slots' block (GAUSS): M2 = (1/d) x xᵀ over (input × slot),
                         * made when first read (nsr_fl_input_block) */
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
                         * when a reader needs it (nsr_fl_ew_flush; ewplan-impl.h) */
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

/* The evaluator's state, one per pass: the plan's (dry, N = 0) or the run's. */
typedef struct fl {
    nsr_fam X;          /* program, symbol values, current instruction, errors (family-impl.h) */
    const nsr_ir *ir;   /* the program's family IR: what this evaluator runs (ir-impl.h) */
    const tpk_program *p;
    size_t N, T, d;
    const double *x;
    int dry;            /* plan: no numbers */
    fblock *b;
    int nb, capb;
    int *avar_site;     /* declared A-var member → the MatMul site that multiplies it (−1: none
                         * yet); a second site is weight tying, which this evaluator refuses */
    long nsites;        /* MatMul sites met so far (each MatMul, each tap sum) */
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
    const nsr_stmt *final_out; /* the one output the end reads (its blocks' last reader), or NULL */
    int trace;          /* TPK_NETSOR_TRACE=1 (the run, not the plan): times and strategies */
    double t_mark;      /* trace: the time of the last line */
    int plan_kind;      /* NSR_PLAN_NAIVE or NSR_PLAN_OPTIMAL (TPK_PLAN) */
    nsr_ew_calib cal;   /* the plans' cost model, measured by the first that needs it */
    FILE *plan_report;  /* netsor plan: every entrywise plan, its kernels and times */
    int plan_verify;    /* netsor plan --verify: every candidate checked in Z_p first */
    int plan_signatures;/* netsor plan --signatures: each kernel's signature in the report (2: and
                         * every candidate's) */
} fl;

/* The readout that ends an entrywise program at the output: *out (lower triangle, both with
 * full) = alpha·V_φ(k) + beta, or with phi NULL alpha·w_a w_c·k_ac + beta (w NULL: 1; beta ≠ 0
 * only for m = 1, where a bias term is a constant). */
typedef struct ew_readout {
    const tpk_phi *phi;
    double alpha, beta;
    const double *w;
    double **out;
    const double *pool; /* N × m: *out (N×N) = alpha·Σ_pq pool_ap pool_cq V_φ(k)_(ap)(cq) + beta
                         * instead (pair programs only: nsr_fl_ew_pairwise) */
} ew_readout;

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

/* A monomial of a Moment's body: coef · Π f (degree ≤ 2 in vectors), and a list of them. */
typedef struct mono {
    val coef;           /* CONST or SCAL */
    int nf;
    val f[2];           /* LIN factors */
} mono;

typedef struct mlist {
    int n, cap;
    mono *v;
} mlist;

/* An output statement's value and its readout variances. */
typedef struct fout {
    val v;
    double var, bias_var;
} fout;

/* Block k is read by the instruction being evaluated: it lives at least until then. */
static inline void nsr_fl_touch(fl *F, int k)
{
    if (F->b[k].last_use < F->X.cur)
        F->b[k].last_use = F->X.cur;
}

/* ---- flimit_value.c: values ----------------------------------------------------------------- */
void nsr_fl_val_free(fl *F, val *v);
int nsr_fl_val_const(val *v, long m, double c);
/* v as per-point scalars (a constant is spread over N × m). */
int nsr_fl_val_scal(fl *F, val *v);
/* v ← v · c (per input and point when c is SCAL). */
int nsr_fl_val_scale(fl *F, val *v, const val *c);
/* a ← a + s·b (b consumed). */
int nsr_fl_val_add(fl *F, val *a, val *b, double s);
/* The value "member idx[p] of block k" over m points (idx consumed). */
int nsr_fl_val_gather(fl *F, val *v, long m, int k, int *idx);
/* Terms on one block merge into one dense map when any of them is dense. */
int nsr_fl_val_merge(fl *F, val *v);
int nsr_fl_val_copy(fl *F, const val *a, val *out);
/* Keep only the last member of v (the default kernel reads the last output). */
int nsr_fl_val_last(fl *F, val *v);
/* v is block b itself: every member in order, unweighted, no constant part. */
int nsr_fl_val_is_block(const val *v, const fblock *b);
/* Dense per-input map of a term: N × m × ms (a gather expanded; a dense term's own w). */
double *nsr_fl_term_dense(fl *F, const term *t, size_t m);
/* Member p read at point p, with weights allowed (gather), and without (term). */
int nsr_fl_identity_gather(const term *t, long m);
int nsr_fl_identity_term(const term *t, long m);
/* Non-decreasing gather: a symmetric pair of it reads only the lower triangle of its block. */
int nsr_fl_monotone(const int *idx, size_t m);
/* 1 when x is NULL or its n entries are all zero. */
int nsr_fl_all_zero(const double *x, size_t n);

/* ---- flimit_indep.c: structural independence ------------------------------------------------ */
void nsr_fl_anc_root(fblock *b, int self);
void nsr_fl_anc_union(fblock *b, const fblock *o);
/* The ancestors a value term of m points brings into b. */
void nsr_fl_anc_union_term(const fl *F, fblock *b, const term *t, long m);
/* Blocks with a common root (block level, conservative). */
int nsr_fl_correlated(const fblock *x, const fblock *y);
/* Block x against term s of m points, at the member level for initial G-var families. */
int nsr_fl_term_correlated(const fl *F, const fblock *x, const term *s, long m);
/* Terms on different blocks known independent at the member level. */
int nsr_fl_terms_indep(const fl *F, const term *t, long mt, const term *s, long ms);

/* ---- flimit_store.c: the block table -------------------------------------------------------- */
/* A zeroed (zero = 1) or uninitialised n × size buffer, from the pool where one fits. */
void *nsr_fl_big(fl *F, size_t n, size_t size, int zero);
/* A buffer of nsr_fl_big back to the pool (or freed). */
void nsr_fl_release(fl *F, void *q, size_t bytes);
int nsr_fl_new_block(fl *F, int kind, int fam, long m);
void nsr_fl_block_data_free(fl *F, fblock *b);
/* The plan's last use of block k has passed: its data goes now, or with its last pin. */
void nsr_fl_kill_block(fl *F, int k);
/* A pending node: freed with its block (its pins released), or never attached (discard). */
void nsr_fl_pend_free(fl *F, struct pend *P);
void nsr_fl_pend_discard(fl *F, pend *P);
/* How many defined G- and H-var families expression e names (reads through a name). */
int nsr_fl_defined_names(const fl *F, const nsr_expr *e);
/* The statement being evaluated names one defined family (nsr_fl_defined_names). */
int nsr_fl_stmt_reads_once(const fl *F);
/* The plan once made (wait = 1: until it is), NULL while not; its status (TPK_OK while made). */
const int *nsr_fl_plan_get(fl *F, int wait);
int nsr_fl_plan_status(fl *F, int wait);
/* Does block k die in the instruction being evaluated? */
int nsr_fl_dies_here(fl *F, int k);
/* Block k's matrix, taken for a step that overwrites it, or NULL (nothing taken). */
double *nsr_fl_take_matrix(fl *F, int k, long m);
/* The Gauss–Hermite workspace (always, or where φ's maps need quadrature). */
int nsr_fl_ensure_ws(fl *F);
int nsr_fl_ensure_ws_for(fl *F, const tpk_phi *phi);
/* Line and column of the statement being evaluated (the last one at the end). */
int nsr_fl_cur_line(const fl *F);
int nsr_fl_cur_col(const fl *F);
/* The block of the input slots, (1/d) x xᵀ, and the block of an initial G-var family. */
int nsr_fl_input_block(fl *F, int *out);
int nsr_fl_bias_block(fl *F, int sym, int *out);
/* The matrix of block k, which is neither pending nor a φ block: kept, or made now. */
const double *nsr_fl_block_made(fl *F, int k);

/* ---- flimit_sandwich.c: GEMM kernels of linear maps ----------------------------------------- */
/* ext[p] = 1 + the last non-zero column of row p of W (m × n), 0 for a zero row. */
void nsr_fl_row_extents(const double *W, size_t m, size_t n, int *ext);
int nsr_fl_sandwich(fl *F, const double *Wt, size_t mu, size_t mt, const int *et, const double *P,
                    size_t ldp, const double *Ws, size_t mv, size_t ms, const int *es, double *out,
                    size_t ld, int lower, double *tmp, double alpha);
int nsr_fl_tri_sandwich(fl *F, const double *L, size_t m, const double *P, size_t ldp,
                        double *out, size_t ld, double alpha);
double *nsr_fl_term_factor(fl *F, const term *t, size_t m, double scale, long *rank);
int nsr_fl_factor_of(fl *F, const val *u, double scale, double **G, long *rank);
void nsr_fl_mirror_diagonal_blocks(double *M, size_t N, size_t m);

/* ---- flimit_pend.c: pending entrywise blocks ------------------------------------------------ */
/* Can block x (m members) be read by a pending node? */
int nsr_fl_ew_leafable(const fl *F, int x, long m);
pend *nsr_fl_pend_new(fl *F, int op, int line, int col);
/* Block k becomes pending as P (its diagonal made, its arguments pinned); P is k's or freed. */
int nsr_fl_pend_attach(fl *F, int k, pend *P);
/* u as a pending sum: 1 (*out), 0 (not of that form), −1 (error). */
int nsr_fl_ew_sum_of(fl *F, const val *u, int line, int col, pend **out);
/* Is the entrywise program under pending block k a pair program? */
int nsr_fl_ew_pairwise(fl *F, int k);
/* Run the entrywise program under pending block k: its matrix (ro NULL), or ro's readout. */
int nsr_fl_ew_flush(fl *F, int k, const ew_readout *ro, int full);

/* ---- flimit_expect.c: second moments -------------------------------------------------------- */
/* Second moments of block k, (N m)² (often only the lower triangle: fblock.lower). */
const double *nsr_fl_block_m2(fl *F, int k);
/* E[u] of a LIN value: N·m into out. */
int nsr_fl_lin_mean(fl *F, const val *u, double *out, int *nonzero);
/* out (N mu × N mv, ld) += alpha·E[u vᵀ] for LIN values (sym: u = v, lower triangle). */
int nsr_fl_lin_m2(fl *F, const val *u, const val *v, double *out, size_t ld, int sym,
                  double alpha);
/* E[u_p v_p] at each input and point: N·m into out (added). */
int nsr_fl_diag_m2(fl *F, const val *u, const val *v, double *out);

/* ---- flimit_materialize.c: a value becomes a block ------------------------------------------ */
int nsr_fl_materialize(fl *F, val *u, int fam, int *out);
/* A stored combination (BK_MIX) k in place as a Gaussian block. */
int nsr_fl_mix_to_gauss(fl *F, int k);

/* ---- flimit_matmul.c: MatMul lowering ------------------------------------------------------- */
/* A strategy's apply that finds its case is not one after all (nsr_fl_factor_of,
 * nsr_fl_ew_sum_of answer 0): the next entry of the table runs. */
#define NSR_FL_DECLINED (-1)

/* An atom: the Gaussian block that one MatMul, or one sum of MatMuls by distinct A-vars
 * (convolution taps), defines — a root of its own (theory §1.6) — and what its lowering made of
 * it. At most one of taken, pend, fac is set; else the lowering wrote M2 (lower triangle). */
typedef struct nsr_fl_atom {
    int k;              /* its block */
    long m;
    double *M2;         /* its own (N m)² matrix, uninitialised (NULL in the plan) */
    double *taken;      /* a dying block's matrix the lowering wrote in place: the atom's */
    pend *pend;         /* the atom is pending: its matrix is made when a reader needs one */
    double *fac;        /* a low-rank factor, (N m) × rank: M2 = Fac·Facᵀ when a reader needs it */
    long rank;
    const char *how;    /* the strategy that took it (TPK_NETSOR_TRACE) */
} nsr_fl_atom;

int nsr_fl_atom_new(fl *F, long m, int line, nsr_fl_atom *A);
/* The atom's block takes what the lowering made (st: its status); *out reads the block. */
int nsr_fl_atom_finish(fl *F, nsr_fl_atom *A, int st, val *out);
/* The A-var of a MatMul am over D: its checks (untied or tied weights refused), its σ². */
int nsr_fl_matmul_weight(fl *F, const nsr_expr *am, const nsr_fdom *D, double *var);
/* A·src over D into atom A (src_val: src's value, consumed), by the first strategy taking it. */
int nsr_fl_matmul(fl *F, const nsr_expr *am, const nsr_expr *src, const nsr_fdom *D, double var,
                  val *src_val, nsr_fl_atom *A);
/* One more tap of a sum of MatMuls (src_val consumed; coef: a scalar factor or NULL; b[0..nb):
 * its binder values), and the lowering of the whole sum into atom A. */
int nsr_fl_taps_push(fl *F, taps *T, const nsr_expr *src, val *coef, double var, val *src_val,
                     const int *b, int nb);
int nsr_fl_tap_sum(fl *F, const nsr_fdom *D, taps *T, nsr_fl_atom *A, int line);
void nsr_fl_taps_free(fl *F, taps *T);

/* ---- flimit_expand.c: Moments --------------------------------------------------------------- */
void nsr_fl_ml_free(fl *F, mlist *L);
void nsr_fl_mono_free(fl *F, mono *m);
/* Append m to L, which owns it from now on (on failure it is freed). */
int nsr_fl_ml_push(fl *F, mlist *L, mono *m);
/* out += A·B, out += A·A (each product a monomial of degree ≤ 2; e: where a larger one is
 * refused). */
int nsr_fl_ml_mul(fl *F, mlist *A, mlist *B, mlist *out, const nsr_expr *e);
int nsr_fl_ml_square(fl *F, mlist *A, mlist *out, const nsr_expr *e);
/* Moves A's monomials into L, each coefficient times *scale (NULL: 1); A is left empty. */
int nsr_fl_ml_append(fl *F, mlist *L, mlist *A, const val *scale);
/* out = the expectation of L's sum at every input and point of an m-point domain (scalars). */
int nsr_fl_ml_expect(fl *F, const mlist *L, long m, val *out);

/* ---- flimit_eval.c: the family IR's instructions ------------------------------------------- */
/* The value of IR node n over domain D (nothing is left in out on failure). */
int nsr_fl_eval(fl *F, const nsr_irn *n, const nsr_fdom *D, val *out);
/* Operand i of node n. */
static inline const nsr_irn *nsr_fl_arg(const fl *F, const nsr_irn *n, int i)
{
    return &F->ir->n[n->op == NSR_IR_LIN ? n->terms[i] : n->arg[i]];
}
/* The IR root (DEF or OUTPUT) of the family instruction being evaluated. */
static inline const nsr_irn *nsr_fl_root(const fl *F)
{
    return &F->ir->n[nsr_ir_root(F->ir, F->X.cur)];
}

/* ---- flimit_stmt.c: statements -------------------------------------------------------------- */
int nsr_fl_run_def(fl *F, const nsr_finstr *fi);
int nsr_fl_run_output(fl *F, const nsr_finstr *fi, fout *o);
/* The outputs of an output instruction as the program's tpk_output entries ("y[3]"). */
int nsr_fl_name_outputs(fl *F, const nsr_stmt *s, const nsr_fdom *D, double var, double bias);

/* ---- flimit_readout.c: the kernel of the outputs ------------------------------------------ */
/* K (dim × dim, dim = N·O) of the outputs out[0..no) by the first readout strategy that takes
 * them; in the plan, their walk without numbers (*K stays NULL). On failure *K may be set: the
 * caller frees it. */
int nsr_fl_readout(fl *F, const fout *out, int no, tpk_array **K);

#endif
