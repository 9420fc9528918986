/* The block table of the rolled limit evaluator: its buffer pool, block lifecycle (pins, kills),
 * the liveness queries the plan answers, and the blocks made on demand (the input Gram, a
 * factor's product, an initial G-var family's moments). */
#include "flimit-impl.h"
#include "tpk/alloc.h"
#include "tpk/matmul.h"

#include <string.h>

#define POOL_MIN ((size_t)4 << 20)

/* A zeroed (zero = 1) or uninitialised n × size buffer, from the pool when one of that size
 * is there. */
void *nsr_fl_big(fl *F, size_t n, size_t size, int zero)
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

void nsr_fl_release(fl *F, void *q, size_t bytes)
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

/* A block's numbers (its matrix back to the pool); its pending node goes too, unpinning what
 * it read. */
void nsr_fl_block_data_free(fl *F, fblock *b)
{
    size_t n = F->N * (size_t)b->m;
    nsr_fl_release(F, b->M2, n * n * sizeof *b->M2);
    tpk_free(F->X.ctx, b->Fac);
    b->Fac = NULL;
    tpk_free(F->X.ctx, b->mean);
    tpk_free(F->X.ctx, b->s);
    b->M2 = b->mean = b->s = NULL;
    nsr_fl_val_free(F, &b->mix);
    struct pend *P = b->pend;
    b->pend = NULL;
    nsr_fl_pend_free(F, P); /* may free blocks it pinned: b is not used after this */
}

/* A pending block that read block k is done with it: k's data goes with the last such reader
 * where the plan has freed k already. */
static void unpin(fl *F, int k)
{
    fblock *b = &F->b[k];
    if (b->pins > 0 && --b->pins == 0 && b->dead)
        nsr_fl_block_data_free(F, b);
}

void nsr_fl_pend_free(fl *F, struct pend *P)
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
void nsr_fl_kill_block(fl *F, int k)
{
    if (F->b[k].pins > 0)
        F->b[k].dead = 1;
    else
        nsr_fl_block_data_free(F, &F->b[k]);
}

/* A new block of m members made by the instruction being evaluated (its index, or −1). */
int nsr_fl_new_block(fl *F, int kind, int fam, long m)
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
int nsr_fl_defined_names(const fl *F, const nsr_expr *e)
{
    if (e == NULL)
        return 0;
    int n = e->kind == NSR_E_NAME && e->sym >= 0 &&
            F->X.C->sym[e->sym].kind == NSR_SYM_DFAM && !scalar_family(F, e->sym);
    for (int i = 0; i < e->nidx; i++)
        n += nsr_fl_defined_names(F, e->idx[i]);
    for (int i = 0; i < e->nargs; i++)
        n += nsr_fl_defined_names(F, e->args[i]);
    return n + nsr_fl_defined_names(F, e->a) + nsr_fl_defined_names(F, e->b);
}

/* 1 when the statement being evaluated names one defined family (nsr_fl_defined_names); at the
 * end, where the outputs read their blocks, the one output read (final_out) is that statement */
int nsr_fl_stmt_reads_once(const fl *F)
{
    const nsr_stmt *stm = F->X.cur >= 0 && F->X.cur < F->X.R->nfi ? F->X.R->fi[F->X.cur].stmt
                          : F->X.cur == F->X.R->nfi                ? F->final_out
                                                                   : NULL;
    return stm != NULL && nsr_fl_defined_names(F, stm->value) == 1;
}

/* The plan, once made (wait = 1: until it is); NULL while it is not (or when it failed). */
const int *nsr_fl_plan_get(fl *F, int wait)
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
int nsr_fl_plan_status(fl *F, int wait)
{
    plan_job *J = F->pj;
    if (J == NULL)
        return TPK_OK;
    nsr_fl_plan_get(F, wait);
    pthread_mutex_lock(&J->mu);
    int st = J->done ? J->st : TPK_OK;
    pthread_mutex_unlock(&J->mu);
    return st;
}

/* Does block k die in the instruction being evaluated? (The plan's −1 is the end, where the
 * outputs read their blocks: X.cur = nfi.) */
int nsr_fl_dies_here(fl *F, int k)
{
    const int *pl = nsr_fl_plan_get(F, 1);
    return pl != NULL && k >= 0 && k < F->nplan &&
           (pl[k] == F->X.cur || (pl[k] == -1 && F->X.cur == F->X.R->nfi));
}

/* Block k's matrix, taken for a step that overwrites it, where k is a Gaussian block of m members
 * that dies here and the statement reads once (nsr_fl_stmt_reads_once); NULL (nothing taken)
 * otherwise. The block holds no matrix afterwards: a fresh (N m)² block's first touch — page
 * faults and the kernel's zeroing — costs more than the map that would fill it. */
double *nsr_fl_take_matrix(fl *F, int k, long m)
{
    fblock *b = &F->b[k];
    if (b->kind != BK_GAUSS || b->input || b->m != m || b->M2 == NULL || b->pins > 0 ||
        !nsr_fl_dies_here(F, k) || !nsr_fl_stmt_reads_once(F))
        return NULL;
    double *M = b->M2;
    b->M2 = NULL;
    return M;
}

int nsr_fl_ensure_ws(fl *F)
{
    if (F->ws == NULL && (F->ws = tpk_gauss_ws_alloc(TPK_GAUSS_DEFAULT_DEGREE, F->X.ctx)) == NULL)
        return F->X.ctx->status;
    return TPK_OK;
}

/* The workspace where φ's maps need one (quadrature); a closed form needs none, and building
 * the Gauss–Hermite rules costs more than a small layer's map. */
int nsr_fl_ensure_ws_for(fl *F, const tpk_phi *phi)
{
    return tpk_phi_has_closed_form(phi) ? TPK_OK : nsr_fl_ensure_ws(F);
}

/* The statement being evaluated (the last one while the outputs are read at the end). */
static const nsr_stmt *cur_stmt(const fl *F)
{
    int k = F->X.cur < 0 ? 0 : F->X.cur >= F->X.R->nfi ? F->X.R->nfi - 1 : F->X.cur;
    return F->X.R->nfi > 0 ? F->X.R->fi[k].stmt : NULL;
}

int nsr_fl_cur_line(const fl *F)
{
    return cur_stmt(F) ? cur_stmt(F)->line : 0;
}

int nsr_fl_cur_col(const fl *F)
{
    return cur_stmt(F) ? cur_stmt(F)->col : 0;
}

/* A pending node never attached (nothing pinned). */
void nsr_fl_pend_discard(fl *F, pend *P)
{
    for (int t = 0; t < NSR_EW_MAXT; t++) {
        tpk_free(F->X.ctx, P->w[t]);
        tpk_free(F->X.ctx, P->s[t]);
        tpk_free(F->X.ctx, P->cls[t]);
    }
    tpk_free(F->X.ctx, P->diag);
    tpk_free(F->X.ctx, P);
}

/* One block for the declared members of an initial G-var family: E = mean, Cov = var·δ. */
int nsr_fl_bias_block(fl *F, int sym, int *out)
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
    int k = nsr_fl_new_block(F, BK_BIAS, -1, m);
    F->X.cur = save;
    if (k < 0)
        return F->X.ctx->status;
    fblock *b = &F->b[k];
    b->fam = sym;
    b->fi = FI_BEFORE_ALL;
    b->last_use = F->X.cur;
    nsr_fl_anc_root(b, k);
    /* members in declaration order; the nsr_trie degenerates to a sorted scan (few members) */
    b->nidx = nidx;
    b->tr.nlev = -1; /* a table searched linearly: declared biases are few */
    b->tr.nfix = nidx;
    size_t N = F->N;
    /* per member: variance in s, means in mean (N·m, NULL when all zero); the (N m)² second
     * moments are built only if a dense map asks for them (nsr_fl_block_made) */
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

/* The input slots as one Gaussian-like block: M2 = (1/d) x xᵀ over (input × slot), so an
 * embedding U·x[t] is a MatMul of a gather on it (σ_U² E[x_t x_t'] with the 1/d of the
 * embedding's fan-in, theory §1.2). Created once, at its first use. */
int nsr_fl_input_block(fl *F, int *out)
{
    for (int k = 0; k < F->nb; k++)
        if (F->b[k].kind == BK_GAUSS && F->b[k].input) {
            *out = k;
            return TPK_OK;
        }
    int k = nsr_fl_new_block(F, BK_GAUSS, -1, (long)F->T);
    if (k < 0)
        return F->X.ctx->status;
    fblock *b = &F->b[k];
    b->fi = FI_BEFORE_ALL;
    b->input = 1;
    nsr_fl_anc_root(b, k);
    *out = k; /* its M2 is made when first read (nsr_fl_block_made): an embedding of every slot
               * in order writes its Gram straight into the atom instead */
    return TPK_OK;
}

/* The matrix of block k, which is neither pending nor a φ block: kept, or made now — the input
 * Gram (1/d) x xᵀ, a factor's product, an initial G-var family's var·δ + μμ′ — and never a
 * silent NULL where the matrix went to another block. */
const double *nsr_fl_block_made(fl *F, int k)
{
    fblock *b = &F->b[k];
    nsr_fl_touch(F, k);
    if (b->kind == BK_GAUSS && b->input && b->M2 == NULL && !F->dry) { /* the input block */
        size_t n = F->N * F->T;
        if ((b->M2 = nsr_fl_big(F, n * n, sizeof *b->M2, 0)) == NULL)
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
        if ((b->M2 = nsr_fl_big(F, n * n, sizeof *b->M2, 0)) == NULL)
            return NULL;
        /* the lower triangle: most readers need no more (a full read mirrors it) */
        if (tpk_dsyrk_lower(TPK_NO_TRANS, n, (size_t)b->rank, 1.0, b->Fac, (size_t)b->rank, 0.0,
                            b->M2, n, F->X.ctx)) {
            nsr_fl_release(F, b->M2, n * n * sizeof *b->M2);
            b->M2 = NULL;
            return NULL;
        }
        b->lower = 1;
    }
    if (b->kind == BK_BIAS && b->M2 == NULL && !F->dry) {
        size_t n = F->N * (size_t)b->m, m = (size_t)b->m;
        if ((b->M2 = nsr_fl_big(F, n * n, sizeof *b->M2, 1)) == NULL)
            return NULL;
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < n; j++)
                b->M2[i * n + j] = (i % m == j % m ? b->s[i % m] : 0) +
                                   (b->mean ? b->mean[i] * b->mean[j] : 0);
    }
    if (!F->dry && b->kind == BK_GAUSS && b->M2 == NULL && F->X.ctx->status == TPK_OK) {
        /* its matrix went to a block made from it (read again after the plan's last use): never
         * a silent NULL — the unrolled form computes what this one cannot */
        NSR_UNSUP(&F->X, NULL, "a block read after its matrix was given to another (line %d)",
                  b->line);
        return NULL;
    }
    return b->M2;
}
