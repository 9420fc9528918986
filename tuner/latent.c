/* The latent cost model (issue 21; "Toward Compiler World Models", docs/tuner-notes.md §2): a
 * configuration rolled out as the emitter's action sequence through a learned, action-conditioned
 * residual transition, ranked from its final latent state; pairwise logistic rank loss plus an
 * auxiliary decoder of the template's analytic features at the step that completes each and at the
 * final one. Plain C, double precision,
 * a few thousand parameters (include/tpk/tune.h states the architecture). */
#include "tune_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KMAX TPK_TUNE_MAX_KNOBS    /* actions: one per knob */
#define FMAX TPK_TUNE_MAX_FEATURES /* auxiliary targets: the template's features */
#define NX 14                      /* task and machine-class features of the encoder and the head */
#define NDEP_CACHE 128             /* spaces whose feature dependencies are remembered (then the last slot is reused) */
#define DEP_PROBES 24              /* random configurations probed per space for dependencies */
/* A feature "changes" with a knob beyond this relative amount (the features are floats). */
#define DEP_REL_TOL 1e-6
/* A target whose standard deviation over the first fit's rows is below this (relative to its
 * mean) is constant: left out of the auxiliary loss. */
#define CONST_REL_TOL 1e-9

/* One configuration, encoded: the encoder input, the action values and the auxiliary targets
 * with the state that first determines each (dep: the last knob a feature depends on, -1: none;
 * state dep + 1 predicts it, the encoder's state being 0, and so does the final state). */
typedef struct enc {
    double x[NX];
    int na;
    double u[KMAX];
    float z[FMAX];
    signed char dep[FMAX];
} enc;

typedef struct dep_entry {
    tpk_tune_task task;
    char template_name[32];
    int nknob;
    signed char dep[FMAX];
} dep_entry;

struct tpk_tune_latent {
    tpk_tune_latent_opts o;
    int H, M, G, F, NG; /* state, transition, head widths; targets; head input */
    size_t np;
    double *p;                /* parameters (layout: the offsets below) */
    double *m1, *m2, *g;      /* Adam moments, gradient */
    size_t oE, oe, oW1, oA0, oA1, oA2, oW2, ob2, oD, od, oP, opb, ov;
    int zready;
    double zmu[FMAX], zsd[FMAX]; /* target standardisation; zsd 0: constant, not learnt */
    int trained;
    dep_entry *dep;
    int ndep;
};

/* ---- sizes, initialisation ----------------------------------------------------------------- */

void tpk_tune_latent_opts_default(tpk_tune_latent_opts *o)
{
    memset(o, 0, sizeof *o);
    o->hidden = 16;
    o->trans_hidden = 32;
    o->head_hidden = 16;
    o->epochs = 300;
    o->refit_epochs = 100;
    o->lr = 0.01;
    o->aux_weight = 1.0;
    o->l2 = 1e-4;
    o->seed = 1;
}

static void layout(tpk_tune_latent *m)
{
    size_t H = (size_t)m->H, M = (size_t)m->M, G = (size_t)m->G, F = (size_t)m->F, o = 0;
    m->NG = m->H + KMAX + NX;
    m->oE = o, o += H * NX;
    m->oe = o, o += H;
    m->oW1 = o, o += M * H;
    m->oA0 = o, o += M * KMAX;
    m->oA1 = o, o += M * KMAX;
    m->oA2 = o, o += M * KMAX;
    m->oW2 = o, o += H * M;
    m->ob2 = o, o += H;
    m->oD = o, o += F * H;
    m->od = o, o += F;
    m->oP = o, o += G * (size_t)m->NG;
    m->opb = o, o += G;
    m->ov = o, o += G;
    m->np = o;
}

static double gauss(uint64_t *rng)
{
    double u1 = tpk__rng_unif(rng), u2 = tpk__rng_unif(rng);
    return sqrt(-2 * log(u1 + 1e-300)) * cos(6.283185307179586 * u2);
}

/* Scaled normal weights (fan-in), zero biases; the transition's output starts small so that the
 * residual state stays near the encoder's over a dozen actions. */
static void init_params(tpk_tune_latent *m)
{
    uint64_t rng = m->o.seed * 0x2545F4914F6CDD1Dull + 0x9E3779B9ull;
    memset(m->p, 0, m->np * sizeof *m->p);
    struct {
        size_t off, n;
        double sd;
    } blk[] = {
        {m->oE, (size_t)m->H * NX, 1.0 / sqrt(NX)},
        {m->oW1, (size_t)m->M * m->H, 1.0 / sqrt(m->H)},
        {m->oA0, (size_t)m->M * KMAX, 0.5},
        {m->oA1, (size_t)m->M * KMAX, 0.5},
        {m->oA2, (size_t)m->M * KMAX, 0.5},
        {m->oW2, (size_t)m->H * m->M, 0.3 / sqrt(m->M)},
        {m->oD, (size_t)m->F * m->H, 1.0 / sqrt(m->H)},
        {m->oP, (size_t)m->G * m->NG, 1.0 / sqrt(m->NG)},
        {m->ov, (size_t)m->G, 1.0 / sqrt(m->G)},
    };
    for (size_t b = 0; b < sizeof blk / sizeof blk[0]; b++)
        for (size_t i = 0; i < blk[b].n; i++)
            m->p[blk[b].off + i] = blk[b].sd * gauss(&rng);
}

static tpk_tune_latent *latent_new(const tpk_tune_latent_opts *o, int nfeat, tpk_ctx *ctx)
{
    if (nfeat < 1 || nfeat > FMAX || o->hidden < 1 || o->hidden > 256 || o->trans_hidden < 1 ||
        o->trans_hidden > 256 || o->head_hidden < 1 || o->head_hidden > 256 || o->epochs < 0 ||
        o->refit_epochs < 0 || !(o->lr > 0) || !(o->aux_weight >= 0) || !(o->l2 >= 0)) {
        TPK_ERROR(ctx, TPK_EINVAL, "tune: latent model needs 1..%d features, widths 1..256, a positive step and "
                  "non-negative weights", FMAX);
        return NULL;
    }
    tpk_tune_latent *m = calloc(1, sizeof *m);
    if (!m) {
        TPK_ERROR(ctx, TPK_ENOMEM, "tune: out of memory");
        return NULL;
    }
    m->o = *o;
    m->H = o->hidden;
    m->M = o->trans_hidden;
    m->G = o->head_hidden;
    m->F = nfeat;
    layout(m);
    m->p = calloc(m->np, sizeof *m->p);
    m->m1 = calloc(m->np, sizeof *m->m1);
    m->m2 = calloc(m->np, sizeof *m->m2);
    m->g = calloc(m->np, sizeof *m->g);
    m->dep = calloc(NDEP_CACHE, sizeof *m->dep);
    if (!m->p || !m->m1 || !m->m2 || !m->g || !m->dep) {
        tpk_tune_latent_free(m);
        TPK_ERROR(ctx, TPK_ENOMEM, "tune: out of memory");
        return NULL;
    }
    return m;
}

tpk_tune_latent *tpk_tune_latent_alloc(const tpk_tune_latent_opts *o, int nfeat, tpk_ctx *ctx)
{
    tpk_tune_latent_opts d;
    if (!o) {
        tpk_tune_latent_opts_default(&d);
        o = &d;
    }
    tpk_tune_latent *m = latent_new(o, nfeat, ctx);
    if (m)
        init_params(m);
    return m;
}

void tpk_tune_latent_free(tpk_tune_latent *m)
{
    if (!m)
        return;
    free(m->p);
    free(m->m1);
    free(m->m2);
    free(m->g);
    free(m->dep);
    free(m);
}

int tpk_tune_latent_trained(const tpk_tune_latent *m)
{
    return m && m->trained;
}

double *tpk_tune_latent_params(tpk_tune_latent *m, size_t *n)
{
    *n = m->np;
    return m->p;
}

/* ---- encoding: task, machine, actions, targets --------------------------------------------- */

/* The encoder's input: shape (log2), threads, element size, op, target, machine class. */
static void task_features(const tpk_tune_space *s, double *x)
{
    const tpk_tune_task *t = &s->task;
    const tpk_machine *mc = &s->machine;
    x[0] = tpk__log2((double)t->m) / 12;
    x[1] = tpk__log2((double)t->n) / 12;
    x[2] = tpk__log2((double)t->k) / 12;
    x[3] = tpk__log2((double)(t->threads > 0 ? t->threads : 1));
    x[4] = t->dtype == TPK_TUNE_F32 ? -1 : 1;
    x[5] = t->op == TPK_TUNE_GEMM;
    x[6] = t->op == TPK_TUNE_SYRK;
    x[7] = t->op == TPK_TUNE_MAP;
    x[8] = t->target == TPK_TUNE_CUDA;
    x[9] = tpk__log2((double)mc->l1) / 16;
    x[10] = tpk__log2((double)mc->l2) / 21;
    x[11] = tpk__log2((double)mc->l3) / 25;
    x[12] = mc->registers / 32.0;
    x[13] = mc->vector_bits / 512.0;
}

/* An action's value in [-1, 1]: numeric knobs (positive, unlabelled) on the log2 scale of their
 * candidates, categorical ones by value over the largest candidate; the same value means the same
 * u in every space of a template, whatever its candidate count (par has one candidate on one
 * thread). */
static double action_value(const tpk_tune_knob *k, int v)
{
    int lo = k->cand[0], hi = k->cand[0], numeric = !k->labels;
    for (int j = 0; j < k->ncand; j++) {
        lo = k->cand[j] < lo ? k->cand[j] : lo;
        hi = k->cand[j] > hi ? k->cand[j] : hi;
        numeric &= k->cand[j] > 0;
    }
    if (numeric && v > 0)
        return hi > lo ? 2 * (log2(v) - log2(lo)) / (log2(hi) - log2(lo)) - 1 : 0;
    return hi > 0 ? 2.0 * v / hi - 1 : -1;
}

/* The last knob each feature depends on, probed on random configurations: a feature that moves
 * when knob i alone changes depends on it. Deterministic (fixed probe seed), cached per space. */
static const signed char *space_deps(tpk_tune_latent *m, const tpk_tune_space *s)
{
    for (int i = 0; i < m->ndep; i++)
        if (tpk_tune_task_same(&m->dep[i].task, &s->task) && m->dep[i].nknob == s->nknob &&
            !strcmp(m->dep[i].template_name, s->template_name))
            return m->dep[i].dep;
    dep_entry *d = &m->dep[m->ndep < NDEP_CACHE ? m->ndep++ : NDEP_CACHE - 1];
    d->task = s->task;
    snprintf(d->template_name, sizeof d->template_name, "%s", s->template_name);
    d->nknob = s->nknob;
    memset(d->dep, -1, sizeof d->dep);
    uint64_t rng = 0x5EEDull;
    float f0[FMAX], f1[FMAX];
    for (int r = 0; r < DEP_PROBES; r++) {
        tpk_tune_config c;
        tpk_tune_space_point(s, tpk_tune_space_random(s, &rng), &c);
        int n0 = s->features(s, &c, f0, FMAX);
        for (int i = 0; i < s->nknob; i++)
            for (int j = 0; j < s->knob[i].ncand; j++) {
                if (s->knob[i].cand[j] == c.v[i])
                    continue;
                tpk_tune_config e = c;
                e.v[i] = s->knob[i].cand[j];
                int n1 = s->features(s, &e, f1, FMAX);
                for (int f = 0; f < n0 && f < n1; f++)
                    if (isfinite(f0[f]) && isfinite(f1[f]) &&
                        fabs((double)f1[f] - f0[f]) > DEP_REL_TOL * (1 + fabs((double)f0[f])) && d->dep[f] < i)
                        d->dep[f] = (signed char)i;
            }
    }
    return d->dep;
}

static int encode(tpk_tune_latent *m, const tpk_tune_latent_row *r, int targets, enc *e, tpk_ctx *ctx)
{
    const tpk_tune_space *s = r->s;
    task_features(s, e->x);
    e->na = s->nknob;
    for (int t = 0; t < KMAX; t++)
        e->u[t] = t < s->nknob ? action_value(&s->knob[t], r->c.v[t]) : 0;
    if (!targets)
        return TPK_OK;
    int nf = s->features(s, &r->c, e->z, FMAX);
    if (nf != m->F)
        return TPK_ERROR(ctx, TPK_EINVAL, "tune: latent model of %d features given a %s space of %d", m->F,
                         s->template_name, nf);
    for (int f = 0; f < nf; f++)
        if (!isfinite(e->z[f]))
            e->z[f] = 0;
    memcpy(e->dep, space_deps(m, s), sizeof e->dep);
    return TPK_OK;
}

/* ---- forward and backward through one configuration ------------------------------------------ */

/* Workspace of one rollout: states h[0..na], transition activations a[1..na], head hidden q and
 * head input gin, in one block of roll_size(m) doubles. */
typedef struct roll {
    double *h, *a, *q, *gin;
} roll;

static size_t roll_size(const tpk_tune_latent *m)
{
    return (size_t)(KMAX + 1) * (size_t)m->H + (size_t)KMAX * (size_t)m->M + (size_t)m->G + (size_t)m->NG;
}

static roll roll_at(const tpk_tune_latent *m, double *base)
{
    roll w = {base, base + (KMAX + 1) * m->H, base + (KMAX + 1) * m->H + KMAX * m->M,
              base + (KMAX + 1) * m->H + KMAX * m->M + m->G};
    return w;
}

/* tanh through one exp (about twice as fast as libm's here, and as accurate in absolute terms:
 * the error is a few ulps of 1, so the derivative 1 - t^2 the backward pass uses stays exact to
 * rounding). */
static inline double tanh_fast(double x)
{
    if (x > 20)
        return 1;
    if (x < -20)
        return -1;
    return 1 - 2 / (exp(2 * x) + 1);
}

static double forward(const tpk_tune_latent *m, const enc *e, roll *w, int head)
{
    const int H = m->H, M = m->M, G = m->G, NG = m->NG;
    const double *p = m->p, *E = p + m->oE, *eb = p + m->oe, *W1 = p + m->oW1, *A0 = p + m->oA0,
                 *A1 = p + m->oA1, *A2 = p + m->oA2, *W2 = p + m->oW2, *b2 = p + m->ob2;
    for (int i = 0; i < H; i++) {
        double acc = eb[i];
        for (int j = 0; j < NX; j++)
            acc += E[i * NX + j] * e->x[j];
        w->h[i] = tanh_fast(acc);
    }
    for (int t = 0; t < e->na; t++) {
        const double *hp = w->h + t * H, u = e->u[t], u2 = u * u;
        double *hn = w->h + (t + 1) * H, *at = w->a + t * M;
        for (int r = 0; r < M; r++) {
            double acc = A0[r * KMAX + t] + u * A1[r * KMAX + t] + u2 * A2[r * KMAX + t];
            const double *wr = W1 + r * H;
            for (int i = 0; i < H; i++)
                acc += wr[i] * hp[i];
            at[r] = tanh_fast(acc);
        }
        for (int i = 0; i < H; i++) {
            double acc = b2[i];
            const double *wr = W2 + i * M;
            for (int r = 0; r < M; r++)
                acc += wr[r] * at[r];
            hn[i] = hp[i] + acc;
        }
    }
    if (!head)
        return 0;
    const double *P = p + m->oP, *pb = p + m->opb, *v = p + m->ov, *hT = w->h + e->na * H;
    memcpy(w->gin, hT, (size_t)H * sizeof *hT);
    memcpy(w->gin + H, e->u, KMAX * sizeof *e->u);
    memcpy(w->gin + H + KMAX, e->x, NX * sizeof *e->x);
    double s = 0;
    for (int r = 0; r < G; r++) {
        double acc = pb[r];
        const double *pr = P + r * NG;
        for (int i = 0; i < NG; i++)
            acc += pr[i] * w->gin[i];
        w->q[r] = tanh_fast(acc);
        s += v[r] * w->q[r];
    }
    return s;
}

/* Adds to g the gradient of ds · score (head) + aux_scale · (auxiliary squared error of this row)
 * after forward(m, e, w, head); returns the row's auxiliary squared error. */
static double backward(const tpk_tune_latent *m, const enc *e, roll *w, int head, double ds, double aux_scale,
                       double *g)
{
    const int H = m->H, M = m->M, G = m->G, NG = m->NG, F = m->F, na = e->na;
    const double *p = m->p, *W1 = p + m->oW1, *W2 = p + m->oW2, *D = p + m->oD, *d = p + m->od;
    double dh[256];
    memset(dh, 0, sizeof dh);
    if (head) {
        const double *P = p + m->oP, *v = p + m->ov;
        double *gP = g + m->oP, *gpb = g + m->opb, *gv = g + m->ov;
        for (int r = 0; r < G; r++) {
            gv[r] += ds * w->q[r];
            double dpre = ds * v[r] * (1 - w->q[r] * w->q[r]);
            gpb[r] += dpre;
            double *gr = gP + r * NG;
            const double *pr = P + r * NG;
            for (int i = 0; i < NG; i++)
                gr[i] += dpre * w->gin[i];
            for (int i = 0; i < H; i++)
                dh[i] += dpre * pr[i];
        }
    }
    double sq = 0;
    double *gD = g + m->oD, *gd = g + m->od, *gW1 = g + m->oW1, *gW2 = g + m->oW2, *gb2 = g + m->ob2,
           *gA0 = g + m->oA0, *gA1 = g + m->oA1, *gA2 = g + m->oA2;
    for (int t = na; t >= 0; t--) {
        const double *h = w->h + t * H;
        /* auxiliary targets this state predicts: those its action completed (their last knob
         * is the one just applied), and at the final state all */
        for (int f = 0; f < F; f++) {
            if ((t != na && e->dep[f] != t - 1) || m->zsd[f] == 0)
                continue;
            const double *dr = D + f * H;
            double r = d[f] - e->z[f];
            for (int i = 0; i < H; i++)
                r += dr[i] * h[i];
            sq += r * r;
            double dz = 2 * aux_scale * r;
            gd[f] += dz;
            double *gr = gD + f * H;
            for (int i = 0; i < H; i++) {
                gr[i] += dz * h[i];
                dh[i] += dz * dr[i];
            }
        }
        if (t == 0)
            break;
        /* h_t = h_{t-1} + W2 a_t + b2, a_t = tanh(W1 h_{t-1} + A0 + u A1 + u^2 A2) */
        const double *hp = w->h + (t - 1) * H, *at = w->a + (t - 1) * M, u = e->u[t - 1];
        double dpre[256], dhp[256];
        for (int i = 0; i < H; i++) {
            gb2[i] += dh[i];
            double *gr = gW2 + i * M;
            for (int r = 0; r < M; r++)
                gr[r] += dh[i] * at[r];
        }
        for (int r = 0; r < M; r++) {
            double da = 0;
            for (int i = 0; i < H; i++)
                da += W2[i * M + r] * dh[i];
            dpre[r] = da * (1 - at[r] * at[r]);
            gA0[r * KMAX + t - 1] += dpre[r];
            gA1[r * KMAX + t - 1] += dpre[r] * u;
            gA2[r * KMAX + t - 1] += dpre[r] * u * u;
        }
        for (int i = 0; i < H; i++)
            dhp[i] = dh[i];
        for (int r = 0; r < M; r++) {
            double *gr = gW1 + r * H;
            const double *wr = W1 + r * H;
            for (int i = 0; i < H; i++) {
                gr[i] += dpre[r] * hp[i];
                dhp[i] += dpre[r] * wr[i];
            }
        }
        memcpy(dh, dhp, (size_t)H * sizeof *dh);
    }
    /* h0 = tanh(E x + e) */
    double *gE = g + m->oE, *ge = g + m->oe;
    for (int i = 0; i < H; i++) {
        double dpe = dh[i] * (1 - w->h[i] * w->h[i]);
        ge[i] += dpe;
        for (int j = 0; j < NX; j++)
            gE[i * NX + j] += dpe * e->x[j];
    }
    return sq;
}

/* ---- the training loss --------------------------------------------------------------------- */

typedef struct batch {
    enc *L, *U;
    size_t nL, nU;
    const double *y;
    const unsigned *group;
    size_t ngroup;
    double npairs, naux; /* normalisers */
    double *gmax;        /* the largest label of each group (pair weights) */
    double *s, *ds;      /* scores, their gradients (nL) */
    double *wbuf;        /* rollouts: one per labelled row (kept from forward to backward), one more */
} batch;

/* Standardisation of the targets from the first fit's rows (labelled and unlabelled). */
static void standardise_init(tpk_tune_latent *m, const batch *b)
{
    size_t n = b->nL + b->nU;
    for (int f = 0; f < m->F; f++) {
        double s = 0, s2 = 0;
        for (size_t i = 0; i < n; i++) {
            double z = i < b->nL ? b->L[i].z[f] : b->U[i - b->nL].z[f];
            s += z;
            s2 += z * z;
        }
        double mu = n ? s / (double)n : 0, var = n ? s2 / (double)n - mu * mu : 0;
        double sd = var > 0 ? sqrt(var) : 0;
        m->zmu[f] = mu;
        m->zsd[f] = sd > CONST_REL_TOL * (1 + fabs(mu)) ? sd : 0;
    }
    m->zready = 1;
}

static void standardise(const tpk_tune_latent *m, enc *e, size_t n)
{
    for (size_t i = 0; i < n; i++)
        for (int f = 0; f < m->F; f++)
            e[i].z[f] = m->zsd[f] > 0 ? (float)((e[i].z[f] - m->zmu[f]) / m->zsd[f]) : 0;
}

static void batch_free(batch *b)
{
    free(b->L);
    free(b->U);
    free(b->s);
    free(b->ds);
    free(b->wbuf);
    free(b->gmax);
    memset(b, 0, sizeof *b);
}

/* Weight of the ordered pair y_i > y_j of group g: 1, or (pair_weight) the label gap relative to
 * the group's best, which spends the loss on the differences that matter to the search. */
static double pair_weight(const tpk_tune_latent *m, const batch *b, size_t g, size_t i, size_t j)
{
    return m->o.pair_weight && b->gmax[g] > 0 ? (b->y[i] - b->y[j]) / b->gmax[g] : 1;
}

static int batch_make(tpk_tune_latent *m, const tpk_tune_latent_row *rows, const double *y, size_t n,
                      const unsigned *group, size_t ngroup, const tpk_tune_latent_row *unlab, size_t nunlab,
                      batch *b, tpk_ctx *ctx)
{
    memset(b, 0, sizeof *b);
    if (n == 0 && nunlab == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "tune: fitting a model on no data");
    size_t tot = 0;
    for (size_t g = 0; group && g < ngroup; g++)
        tot += group[g];
    if (group && tot != n)
        return TPK_ERROR(ctx, TPK_EINVAL, "tune: latent groups cover %zu of %zu rows", tot, n);
    b->L = calloc(n + 1, sizeof *b->L);
    b->U = calloc(nunlab + 1, sizeof *b->U);
    b->s = calloc(n + 1, sizeof *b->s);
    b->ds = calloc(n + 1, sizeof *b->ds);
    b->wbuf = malloc((n + 1) * roll_size(m) * sizeof *b->wbuf);
    b->gmax = calloc((group ? ngroup : 1) + 1, sizeof *b->gmax);
    if (!b->L || !b->U || !b->s || !b->ds || !b->wbuf || !b->gmax) {
        batch_free(b);
        return TPK_ERROR(ctx, TPK_ENOMEM, "tune: out of memory");
    }
    b->nL = n;
    b->nU = nunlab;
    b->y = y;
    b->group = group;
    b->ngroup = group ? ngroup : 1;
    int st = TPK_OK;
    for (size_t i = 0; !st && i < n; i++)
        st = encode(m, &rows[i], 1, &b->L[i], ctx);
    for (size_t i = 0; !st && i < nunlab; i++)
        st = encode(m, &unlab[i], 1, &b->U[i], ctx);
    if (st) {
        batch_free(b);
        return st;
    }
    if (!m->zready)
        standardise_init(m, b);
    standardise(m, b->L, n);
    standardise(m, b->U, nunlab);
    /* Normalisers: ordered pairs within groups; predicted target entries over all states. */
    size_t off = 0;
    for (size_t g = 0; g < b->ngroup; g++) {
        size_t len = group ? group[g] : n;
        for (size_t i = off; i < off + len; i++)
            b->gmax[g] = y[i] > b->gmax[g] ? y[i] : b->gmax[g];
        for (size_t i = off; i < off + len; i++)
            for (size_t j = off; j < off + len; j++)
                b->npairs += y[i] > y[j] ? pair_weight(m, b, g, i, j) : 0;
        off += len;
    }
    for (size_t i = 0; i < n + nunlab; i++) {
        const enc *e = i < n ? &b->L[i] : &b->U[i - n];
        for (int f = 0; f < m->F; f++)
            if (m->zsd[f] > 0)
                b->naux += e->dep[f] + 1 == e->na ? 1 : 2; /* states dep + 1 and na */
    }
    return TPK_OK;
}

/* log(1 + e^-d), stable */
static double softplus_neg(double d)
{
    return d > 0 ? log1p(exp(-d)) : -d + log1p(exp(d));
}

/* Loss and gradient (into m->g) at the current parameters. */
static double batch_loss(tpk_tune_latent *m, batch *b)
{
    memset(m->g, 0, m->np * sizeof *m->g);
    double loss = 0;
    const size_t rs = roll_size(m);
    /* rank: logistic on score differences of ordered pairs within each group */
    for (size_t i = 0; i < b->nL; i++) {
        roll w = roll_at(m, b->wbuf + i * rs);
        b->s[i] = forward(m, &b->L[i], &w, 1);
    }
    memset(b->ds, 0, b->nL * sizeof *b->ds);
    if (b->npairs > 0) {
        size_t off = 0;
        for (size_t g = 0; g < b->ngroup; g++) {
            size_t len = b->group ? b->group[g] : b->nL;
            for (size_t i = off; i < off + len; i++)
                for (size_t j = off; j < off + len; j++) {
                    if (!(b->y[i] > b->y[j]))
                        continue;
                    double d = b->s[i] - b->s[j], w = pair_weight(m, b, g, i, j) / b->npairs;
                    loss += w * softplus_neg(d);
                    double sg = w / (1 + exp(d)); /* -dl/dd */
                    b->ds[i] -= sg;
                    b->ds[j] += sg;
                }
            off += len;
        }
    }
    double aux = b->naux > 0 ? m->o.aux_weight / b->naux : 0, sq = 0;
    for (size_t i = 0; i < b->nL + b->nU; i++) {
        const enc *e = i < b->nL ? &b->L[i] : &b->U[i - b->nL];
        int head = i < b->nL && b->npairs > 0;
        roll w = roll_at(m, b->wbuf + (i < b->nL ? i : b->nL) * rs);
        if (i >= b->nL) /* labelled rows were rolled out above */
            forward(m, e, &w, 0);
        sq += backward(m, e, &w, head, head ? b->ds[i] : 0, aux, m->g);
    }
    loss += aux * sq;
    for (size_t k = 0; k < m->np; k++) {
        loss += m->o.l2 * m->p[k] * m->p[k];
        m->g[k] += 2 * m->o.l2 * m->p[k];
    }
    return loss;
}

int tpk_tune_latent_loss(tpk_tune_latent *m, const tpk_tune_latent_row *rows, const double *y, size_t n,
                         const unsigned *group, size_t ngroup, const tpk_tune_latent_row *unlab, size_t nunlab,
                         double *loss, double *grad, tpk_ctx *ctx)
{
    batch b;
    int st = batch_make(m, rows, y, n, group, ngroup, unlab, nunlab, &b, ctx);
    if (st)
        return st;
    *loss = batch_loss(m, &b);
    if (grad)
        memcpy(grad, m->g, m->np * sizeof *grad);
    batch_free(&b);
    return TPK_OK;
}

int tpk_tune_latent_fit(tpk_tune_latent *m, const tpk_tune_latent_row *rows, const double *y, size_t n,
                        const unsigned *group, size_t ngroup, const tpk_tune_latent_row *unlab, size_t nunlab,
                        tpk_ctx *ctx)
{
    batch b;
    int st = batch_make(m, rows, y, n, group, ngroup, unlab, nunlab, &b, ctx);
    if (st)
        return st;
    /* Adam (Kingma & Ba 2015), moments fresh for every fit, parameters kept from the last. */
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8, lr = m->o.lr;
    int epochs = m->trained ? m->o.refit_epochs : m->o.epochs;
    memset(m->m1, 0, m->np * sizeof *m->m1);
    memset(m->m2, 0, m->np * sizeof *m->m2);
    double p1 = 1, p2 = 1;
    for (int it = 0; it < epochs; it++) {
        double loss = batch_loss(m, &b);
        if (!isfinite(loss)) {
            st = TPK_ERROR(ctx, TPK_ENUMERIC, "tune: latent model diverged (loss %g at step %d)", loss, it);
            break;
        }
        p1 *= b1;
        p2 *= b2;
        for (size_t k = 0; k < m->np; k++) {
            m->m1[k] = b1 * m->m1[k] + (1 - b1) * m->g[k];
            m->m2[k] = b2 * m->m2[k] + (1 - b2) * m->g[k] * m->g[k];
            m->p[k] -= lr * (m->m1[k] / (1 - p1)) / (sqrt(m->m2[k] / (1 - p2)) + eps);
        }
    }
    batch_free(&b);
    if (!st && n > 0)
        m->trained = 1;
    return st;
}

int tpk_tune_latent_predict(tpk_tune_latent *m, const tpk_tune_latent_row *rows, size_t n, float *out,
                            tpk_ctx *ctx)
{
    if (!m->trained)
        return TPK_ERROR(ctx, TPK_EINVAL, "tune: predicting with an untrained model");
    double *buf = malloc(roll_size(m) * sizeof *buf);
    if (!buf)
        return TPK_ERROR(ctx, TPK_ENOMEM, "tune: out of memory");
    roll w = roll_at(m, buf);
    for (size_t i = 0; i < n; i++) {
        enc e;
        encode(m, &rows[i], 0, &e, ctx);
        out[i] = (float)forward(m, &e, &w, 1);
    }
    free(buf);
    return TPK_OK;
}

/* ---- persistence --------------------------------------------------------------------------- */

#define SAVE_MAGIC "tpk-latent-model 1"

int tpk_tune_latent_save(const tpk_tune_latent *m, const char *path, tpk_ctx *ctx)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return TPK_ERROR(ctx, TPK_EIO, "%s: cannot open for writing", path);
    const tpk_tune_latent_opts *o = &m->o;
    fprintf(f, "%s\n%d %d %d %d %d %d %.17g %.17g %.17g %d %llu %d %d\n", SAVE_MAGIC, m->H, m->M, m->G, m->F,
            o->epochs, o->refit_epochs, o->lr, o->aux_weight, o->l2, o->pair_weight, (unsigned long long)o->seed,
            m->zready, m->trained);
    for (int i = 0; i < m->F; i++)
        fprintf(f, "%.17g %.17g\n", m->zmu[i], m->zsd[i]);
    for (size_t i = 0; i < m->np; i++)
        fprintf(f, "%.17g\n", m->p[i]);
    if (fclose(f) != 0)
        return TPK_ERROR(ctx, TPK_EIO, "%s: write failed", path);
    return TPK_OK;
}

tpk_tune_latent *tpk_tune_latent_load(const char *path, tpk_ctx *ctx)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        TPK_ERROR(ctx, TPK_EIO, "%s: cannot open", path);
        return NULL;
    }
    char magic[64] = "";
    tpk_tune_latent_opts o;
    tpk_tune_latent_opts_default(&o);
    int F = 0, zready = 0, trained = 0;
    unsigned long long seed = 0;
    tpk_tune_latent *m = NULL;
    if (!fgets(magic, sizeof magic, f) || strncmp(magic, SAVE_MAGIC, strlen(SAVE_MAGIC)) != 0 ||
        fscanf(f, "%d %d %d %d %d %d %lf %lf %lf %d %llu %d %d", &o.hidden, &o.trans_hidden, &o.head_hidden, &F,
               &o.epochs, &o.refit_epochs, &o.lr, &o.aux_weight, &o.l2, &o.pair_weight, &seed, &zready, &trained) != 13)
        goto bad;
    o.seed = seed;
    m = latent_new(&o, F, ctx);
    if (!m)
        goto fail;
    for (int i = 0; i < F; i++)
        if (fscanf(f, "%lf %lf", &m->zmu[i], &m->zsd[i]) != 2)
            goto bad;
    for (size_t i = 0; i < m->np; i++)
        if (fscanf(f, "%lf", &m->p[i]) != 1 || !isfinite(m->p[i]))
            goto bad;
    m->zready = zready != 0;
    m->trained = trained != 0;
    fclose(f);
    return m;
bad:
    TPK_ERROR(ctx, TPK_EIO, "%s: not a latent model file (or cut short)", path);
fail:
    tpk_tune_latent_free(m);
    fclose(f);
    return NULL;
}

/* ---- Kendall's tau-b ----------------------------------------------------------------------- */

double tpk_tune_kendall_tau(const double *a, const double *b, size_t n)
{
    double conc = 0, disc = 0, ta = 0, tb = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++) {
            double da = a[i] - a[j], db = b[i] - b[j];
            if (da == 0 && db == 0)
                continue;
            if (da == 0)
                ta++;
            else if (db == 0)
                tb++;
            else if ((da > 0) == (db > 0))
                conc++;
            else
                disc++;
        }
    double den = sqrt((conc + disc + ta) * (conc + disc + tb));
    return den > 0 ? (conc - disc) / den : 0;
}
