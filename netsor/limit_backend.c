/* Limit evaluator, stage 5 — the back-end table (theory.md §1.10 "Expectation back-ends, in order
 * of preference"): each way of computing an expectation is one entry {name, applicable, eval},
 * and the expectation stage (limit_expect.c) asks the entries in this order, level by level:
 *   batchnorm    pairs of φ(bn(g)): the Laplace reduction of kernels/batchnorm.c (§2.5)
 *   polynomial   pairs of affine H-vars and Moments of degree ≤ 2: exact (limit_poly.c, §2.6–2.7)
 *   linear       term pairs g·h and groups g, g·h of G-vars: Cov + μμ', μ, exactly (§1.6)
 *   gauss-map    term pairs φ(g)·φ(h) of zero-mean G-vars: the whole-matrix closed forms,
 *                Mehler series or quadrature maps (kernels/gauss_map.c, §3.2–3.3)
 *   normal-prob  groups of ≤ 2 erf / erf-sigmoid / step of affine G-vars, any means: normal
 *                probabilities of dimension ≤ 2 (kernels/mvn.c, §2.3)
 *   gauss-1d2d   groups of ≤ 2 φ(a·g + b): the library's closed forms and 1-/2-D Gauss–Hermite
 *                (kernels/gauss*.c, §3.2–3.3)
 *   orthant      groups of smoothed steps: Gaussian orthant probabilities (limit_orthant.c, §2.3)
 *   joint        groups of more dims than tensor Gauss–Hermite serves, met by m2_entries: left
 *                for the sample all of them share (limit_joint.c)
 *   quadrature   any group: tensor Gauss–Hermite or (quasi-)Monte Carlo (limit_quad.c, §3.3)
 * A query no entry takes is refined by the caller (a pair into term pairs, a term pair or a
 * Moment into entries); quadrature takes every group, so every expectation ends somewhere. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "limit-impl.h"
#include "tpk/alloc.h"
#include "limit-poly.h"
#include "tpk/batchnorm.h"
#include "tpk/mvn.h"

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

/* TERM: the single factors [*na, *na + *la) and [*nb, ...) of the term pair; 0 unless both
 * terms are one factor. */
static int term_factors(const lim *L, const nsr_lim_query *q, const tpk_rpn_node **na, int *la,
                        const tpk_rpn_node **nb, int *lb)
{
    const xbody *bu = &L->xb[q->u], *bv = &L->xb[q->v];
    const xterm *ts = &bu->t[q->s], *tt = &bv->t[q->t];
    if (ts->nf != 1 || tt->nf != 1)
        return 0;
    *na = bu->node + ts->fs[0];
    *nb = bv->node + tt->fs[0];
    *la = ts->fe[0] - ts->fs[0];
    *lb = tt->fe[0] - tt->fs[0];
    return 1;
}

/* ---- batchnorm ------------------------------------------------------------------------- */

static int bn_applicable(const lim *L, nsr_lim_query *q)
{
    return q->kind == NSR_LIM_PAIR && ((L->def[q->u] >= 0 && L->p->instr[L->def[q->u]].bnorm) ||
                                       (L->def[q->v] >= 0 && L->p->instr[L->def[q->v]].bnorm));
}

/* E[Z^u_a Z^v_c] when u, v are batch-coupled Nonlins φ(bn(g)): the Laplace reduction of
 * kernels/batchnorm.c over the covariances of their G-vars (theory §2.5). */
static int bn_eval(lim *L, nsr_lim_query *q)
{
    int u = q->u, v = q->v;
    const tpk_instr *iu = &L->p->instr[L->def[u]], *iv = &L->p->instr[L->def[v]];
    const tpk_phi *fu = iu->body.len == 2 ? iu->body.node[1].fn : NULL;
    const tpk_phi *fv = iv->body.len == 2 ? iv->body.node[1].fn : NULL;
    if (!iu->bnorm || !iv->bnorm || iu->batch != iv->batch || iu->bn_eps != iv->bn_eps ||
        !fu != !fv || (fu && !same_phi(fu, fv)))
        return TPK_ERROR(L->ctx, TPK_EINVAL,
                         "%d:%d: limit of E[%s·%s] not implemented: both must be phi(bn(g)) with one "
                         "phi and one batch size", iu->line, iu->col, L->p->var[u].name,
                         L->p->var[v].name);
    size_t N = L->N;
    int g = iu->body.node[0].var, h = iv->body.node[0].var;
    double *S = tpk_malloc(L->ctx, (g == h ? 1 : 3) * N * N * sizeof *S);
    if (S == NULL)
        return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
    nsr_lim_cov_mat(L, g, g, 0, S);
    if (g != h) {
        nsr_lim_cov_mat(L, g, h, 0, S + N * N);
        nsr_lim_cov_mat(L, h, h, 0, S + 2 * N * N);
    }
    int st = tpk_bn_kernel(fu, N, (size_t)iu->batch, iu->bn_eps, S, g == h ? NULL : S + N * N,
                           g == h ? NULL : S + 2 * N * N, q->out, q->ld, q->scale, &q->err, L->ctx);
    tpk_free(L->ctx, S);
    return st;
}

/* ---- polynomial ------------------------------------------------------------------------ */

/* A Nonlin whose body is, input by input, affine in its G-vars (the scalars being fixed numbers
 * in the limit, theory §1.9) is itself a Gaussian: layernorm of a residual sum, attention's
 * Σ_j a_ij k_j (§2.6–2.7). L->aff[v] gets its N means, then N coefficients per argument. */
int nsr_lim_poly_prepare(lim *L, int k)
{
    const tpk_instr *in = &L->p->instr[k];
    const tpk_rpn *b = &in->body;
    if (L->o.no_factor || b->nargs == 0 || tpk_nsr_poly_degree(b, TPK_ALLOCATOR_OF(L->ctx)) != 1)
        return TPK_OK;
    size_t N = L->N, na = (size_t)b->nargs;
    tpk_nsr_poly_ws *ws = tpk_nsr_poly_ws_alloc(b, L->ctx);
    double *A = tpk_malloc(L->ctx, N * (na + 1) * sizeof *A), *lin = tpk_malloc(L->ctx, na * sizeof *lin);
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
    tpk_free(L->ctx, lin);
    if (!ok) {
        tpk_free(L->ctx, A);
        return oom ? TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory") : TPK_OK;
    }
    L->aff[in->out] = A;
    return TPK_OK;
}

/* Variable *x as an affine form: its arguments, their count, N means and N coefficients per
 * argument (NULL, NULL for a G-var: itself, mean L->rep[*x].mean); 0 when it has none. */
static int affine_form(const lim *L, const int *x, const int **args, int *na, const double **mean,
                       const double **coef)
{
    if (L->p->var[*x].type == TPK_VAR_G) {
        *args = x;
        *na = 1;
        *mean = *coef = NULL;
        return 1;
    }
    if (L->def[*x] >= 0 && L->aff[*x] != NULL) {
        const tpk_rpn *b = &L->p->instr[L->def[*x]].body;
        *args = b->args;
        *na = b->nargs;
        *mean = L->aff[*x];
        *coef = L->aff[*x] + L->N;
        return 1;
    }
    return 0;
}

static int poly_applicable(const lim *L, nsr_lim_query *q)
{
    if (q->kind == NSR_LIM_MOMENT) {
        if (L->o.no_factor)
            return 0;
        int deg = tpk_nsr_poly_degree(&L->p->instr[q->k].body, TPK_ALLOCATOR_OF(L->ctx));
        return deg >= 0 && deg <= 2;
    }
    if (q->kind != NSR_LIM_PAIR)
        return 0;
    const int *args;
    int na;
    const double *mu, *mv, *coef;
    /* two G-vars are the linear rule of the term pairs */
    return affine_form(L, &q->u, &args, &na, &mu, &coef) &&
           affine_form(L, &q->v, &args, &na, &mv, &coef) && (mu != NULL || mv != NULL);
}

/* E[Z^u_a Z^v_c] = Σ_{g,h} l^u_g(a) l^v_h(c) Cov(Z^g_a, Z^h_c) + m^u(a) m^v(c), exact, when u and v
 * are G-vars or affine H-vars and not both G-vars. */
static int poly_pair(lim *L, nsr_lim_query *q)
{
    size_t N = L->N;
    int u = q->u, v = q->v;
    scratch *sc = q->sc;
    const int *args[2];
    int na[2];
    const double *mean[2], *coef[2];
    double *ones = NULL;
    affine_form(L, &q->u, &args[0], &na[0], &mean[0], &coef[0]);
    affine_form(L, &q->v, &args[1], &na[1], &mean[1], &coef[1]);
    if ((sc->s1 == NULL && (sc->s1 = tpk_malloc(L->ctx, N * N * sizeof *sc->s1)) == NULL) ||
        (sc->s2 == NULL && (sc->s2 = tpk_malloc(L->ctx, N * N * sizeof *sc->s2)) == NULL) ||
        (ones = tpk_malloc(L->ctx, N * sizeof *ones)) == NULL)
        return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
    for (size_t a = 0; a < N; a++)
        ones[a] = 1.0;
    double *acc = sc->s2, *C = sc->s1;
    for (size_t a = 0; a < N; a++) {
        double mu = mean[0] ? mean[0][a] : L->rep[u].mean;
        for (size_t c = 0; c < N; c++)
            acc[a * N + c] = mu * (mean[1] ? mean[1][c] : L->rep[v].mean);
    }
    affq *hq = &sc->aq;
    if (hq->on && hq->u != u)
        nsr_lim_halfprod_clear(hq, L->ctx);
    for (int hj = 0; hj < na[1]; hj++) {
        int h = args[1][hj];
        const double *cv = coef[1] ? coef[1] + (size_t)hj * N : ones;
        const double *Q = nsr_lim_halfprod(L, hq, u, args[0], na[0], coef[0], h, C);
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
            tpk_free(L->ctx, ones);
            return L->ctx->status;
        }
        for (int gi = 0; gi < na[0]; gi++) {
            int g = args[0][gi];
            if (!nsr_lim_share_family(L, g, h))
                continue;
            nsr_lim_cov_mat(L, g, h, 0, C);
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
    nsr_lim_put_rows(N, acc, q->scale, q->out, q->ld);
    q->err = 0.0;
    tpk_free(L->ctx, ones);
    return TPK_OK;
}

/* A Moment whose body is a polynomial of degree ≤ 2 in its G-vars (for fixed scalars):
 * E = c0 + Σ l_g μ_g + Σ Q_gh (C_gh + μ_g μ_h), exactly — mean(r), mean((r − m)²), logits
 * mean(k_i k_j), and Moments of scalars alone. Declined when a value is not finite (a division
 * by a zero scalar): the general rules take it then. */
static int poly_moment(lim *L, nsr_lim_query *q)
{
    const tpk_instr *in = &L->p->instr[q->k];
    const tpk_rpn *b = &in->body;
    int deg = tpk_nsr_poly_degree(b, TPK_ALLOCATOR_OF(L->ctx));
    size_t N = L->N, na = (size_t)(b->nargs > 0 ? b->nargs : 1);
    tpk_nsr_poly_ws *ws = tpk_nsr_poly_ws_alloc(b, L->ctx);
    double *s = tpk_malloc(L->ctx, N * sizeof *s), *lin = tpk_malloc(L->ctx, na * sizeof *lin);
    double *quad = deg == 2 ? tpk_malloc(L->ctx, na * na * sizeof *quad) : NULL;
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
                double qq = quad[(size_t)g * na + (size_t)h];
                if (qq != 0.0)
                    val += qq * (nsr_lim_cov(L, b->args[g], a, b->args[h], a) +
                                 L->rep[b->args[g]].mean * L->rep[b->args[h]].mean);
            }
        s[a] = val;
    }
    tpk_nsr_poly_ws_free(ws);
    tpk_free(L->ctx, lin);
    tpk_free(L->ctx, quad);
    if (!ok) {
        tpk_free(L->ctx, s);
        if (oom)
            return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
        q->declined = 1;
        return TPK_OK;
    }
    L->scal[in->out] = s;
    return TPK_OK;
}

static int poly_eval(lim *L, nsr_lim_query *q)
{
    return q->kind == NSR_LIM_MOMENT ? poly_moment(L, q) : poly_pair(L, q);
}

/* ---- linear ---------------------------------------------------------------------------- */

static int linear_applicable(const lim *L, nsr_lim_query *q)
{
    if (L->o.no_factor)
        return 0;
    if (q->kind == NSR_LIM_TERM) {
        const tpk_rpn_node *na, *nb;
        int la, lb;
        return term_factors(L, q, &na, &la, &nb, &lb) && is_gvar_factor(na, la) &&
               is_gvar_factor(nb, lb);
    }
    if (q->kind != NSR_LIM_GROUP || q->ngf > 2)
        return 0;
    const fac *f1 = &q->fs[q->gf[0]], *f2 = q->ngf > 1 ? &q->fs[q->gf[1]] : NULL;
    return is_gvar_factor(f1->node, f1->len) && (f2 == NULL || is_gvar_factor(f2->node, f2->len));
}

/* TERM: E[Z^g_a Z^h_c] = Cov + μ_g μ_h exactly (sc->s1 and q->mm; alone it declines: the sum
 * of one term pair is as cheap). GROUP: E Z^g, E[Z^g Z^h]. */
static int linear_eval(lim *L, nsr_lim_query *q)
{
    if (q->kind == NSR_LIM_TERM) {
        if (q->alone) {
            q->declined = 1;
            return TPK_OK;
        }
        const tpk_rpn_node *na, *nb;
        int la, lb;
        term_factors(L, q, &na, &la, &nb, &lb);
        int g = na[0].var, h = nb[0].var;
        q->mm = L->rep[g].mean * L->rep[h].mean;
        nsr_lim_cov_mat(L, g, h, 0, q->sc->s1);
        q->err = 0.0;
        return TPK_OK;
    }
    const pws *w = q->w;
    int k1 = w->nodedim[q->nodeoff[q->gf[0]]];
    if (q->ngf == 1) {
        q->e.value = w->m[k1];
    } else {
        int k2 = w->nodedim[q->nodeoff[q->gf[1]]];
        q->e.value = w->C[k1 * q->D + k2] + w->m[k1] * w->m[k2];
    }
    return TPK_OK;
}

/* ---- gauss-map ------------------------------------------------------------------------- */

static int map_applicable(const lim *L, nsr_lim_query *q)
{
    const tpk_rpn_node *na, *nb;
    int la, lb;
    return q->kind == NSR_LIM_TERM && !L->o.no_factor && !L->o.no_fastpath &&
           term_factors(L, q, &na, &la, &nb, &lb) && is_call_factor(na, la) &&
           is_call_factor(nb, lb) && same_phi(na[1].fn, nb[1].fn) &&
           L->rep[na[0].var].mean == 0.0 && L->rep[nb[0].var].mean == 0.0;
}

/* sc->s1 = E[φ(Z^g_a) φ(Z^h_c)] for g ≠ h: the cross map over both variances. */
static int cross_map(lim *L, scratch *sc, const tpk_phi *phi, int g, int h, double *e)
{
    size_t N = L->N;
    for (size_t a = 0; a < N; a++) {
        sc->qa[a] = nsr_lim_cov(L, g, a, g, a);
        sc->qb[a] = nsr_lim_cov(L, h, a, h, a);
    }
    nsr_lim_cov_mat(L, g, h, 0, sc->s1);
    return tpk_gauss_map_cross(phi, sc->qa, N, sc->qb, N, sc->s1, sc->s1, L->gws, e, L->ctx);
}

/* E[φ(Z^g_a) φ(Z^h_c)] for all (a, c) by one whole-matrix map: g = h the lower triangle of
 * Cov(Z^g) through tpk_gauss_map, else the cross map over both variances. Alone (the common
 * case, one pair φ(g)·φ(g) of the same zero-mean φ): scale·coefs folded into the map, straight
 * from tpk_gauss_map_affine into out — what keeps a plain MLP as fast as the direct recursion. */
static int map_eval(lim *L, nsr_lim_query *q)
{
    size_t N = L->N;
    scratch *sc = q->sc;
    const xbody *bu = &L->xb[q->u], *bv = &L->xb[q->v];
    const xterm *ts = &bu->t[q->s], *tt = &bv->t[q->t];
    const tpk_rpn_node *na = bu->node + ts->fs[0], *nb = bv->node + tt->fs[0];
    int g = na[0].var, h = nb[0].var, st;
    double e = 0.0;
    if (!q->alone) {
        if (g == h) {
            nsr_lim_cov_mat(L, g, g, 1, sc->s1);
            st = tpk_gauss_map(na[1].fn, sc->s1, N, sc->s1, L->gws, &e, L->ctx);
        } else {
            st = cross_map(L, sc, na[1].fn, g, h, &e);
        }
        q->mm = 0.0;
        q->err = e;
        return st;
    }
    if (!tpk_phi_has_closed_form(na[1].fn) && nsr_lim_gh_init(L))
        return L->ctx->status;
    double cc = q->scale * ts->coef * tt->coef;
    double *out = q->out;
    size_t ld = q->ld;
    if (g == h) {
        /* in place when out is contiguous (out never aliases a block g reads: a family
         * with one atom is the one being written, and g cannot contain it yet) */
        double *dst = ld == N ? out : sc->s1;
        nsr_lim_cov_mat(L, g, g, 1, dst);
        st = (q->lower_ok && dst == out ? tpk_gauss_map_affine_lower : tpk_gauss_map_affine)(
            na[1].fn, dst, N, cc, 0.0, dst, L->gws, &e, L->ctx);
        if (st == TPK_OK && dst != out)
            nsr_lim_put_rows(N, sc->s1, 1.0, out, ld);
    } else {
        st = cross_map(L, sc, na[1].fn, g, h, &e);
        if (st == TPK_OK)
            nsr_lim_put_rows(N, sc->s1, cc, out, ld);
        e *= fabs(cc);
    }
    q->err = e;
    return st;
}

/* ---- groups of ≤ 2 factors φ(a·g + b): normal-prob, gauss-1d2d ------------------------- */

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

/* Are all (≤ 2) factors of the group φ(a·g + b)? Looked at once per group, kept in q->aff. */
static int group_affine(const lim *L, nsr_lim_query *q)
{
    if (q->aff.state == 0) {
        const fac *f1 = &q->fs[q->gf[0]], *f2 = q->ngf > 1 ? &q->fs[q->gf[1]] : NULL;
        q->aff.a[1] = q->aff.b[1] = 0.0;
        q->aff.phi[1] = NULL;
        int ok = affine_call(L, q->w, f1, &q->aff.g[0], &q->aff.a[0], &q->aff.b[0],
                             &q->aff.phi[0]);
        if (ok && f2 != NULL)
            ok = affine_call(L, q->w, f2, &q->aff.g[1], &q->aff.a[1], &q->aff.b[1],
                             &q->aff.phi[1]);
        q->aff.state = ok ? 1 : -1;
    }
    return q->aff.state > 0;
}

/* Moments of the group's affine arguments: means m[i], variances v[i], their covariance *kk
 * (the dims of each factor's G-var leaf). */
static void group_affine_moments(const nsr_lim_query *q, double *m, double *v, double *kk)
{
    const pws *w = q->w;
    int k[2] = {-1, -1};
    for (int s = 0; s < q->ngf; s++) {
        const fac *f = &q->fs[q->gf[s]];
        for (int i = 0; i < f->len; i++)
            if (f->node[i].op == TPK_RPN_GVAR)
                k[s] = w->nodedim[q->nodeoff[q->gf[s]] + i];
        m[s] = q->aff.a[s] * w->m[k[s]] + q->aff.b[s];
        v[s] = q->aff.a[s] * q->aff.a[s] * w->C[k[s] * q->D + k[s]];
    }
    if (q->ngf == 1) {
        m[1] = v[1] = *kk = 0.0;
        return;
    }
    *kk = q->aff.a[0] * q->aff.a[1] * w->C[k[0] * q->D + k[1]];
}

/* erf, the erf-sigmoid gate and the step as α·P(ξ < x) + β, ξ ~ N(0, v) (theory §2.3:
 * erf x = 2Φ(√2 x) − 1 = 2σ(x) − 1). Returns 0 for other φ. */
static int smooth_affine(const tpk_phi *phi, double *al, double *be, double *v)
{
    const char *n = tpk_phi_name(phi);
    double b = 1.0;
    int end = 0; /* the whole name: "erf(1)'" is erf's derivative, not erf */
    if (strcmp(n, "erf") == 0 ||
        (sscanf(n, "erf(%lf)%n", &b, &end) == 1 && n[end] == '\0' && isfinite(b) && b != 0.0)) {
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

static int normal_applicable(const lim *L, nsr_lim_query *q)
{
    double al, be, v;
    return q->kind == NSR_LIM_GROUP && !L->o.no_factor && q->ngf <= 2 && group_affine(L, q) &&
           smooth_affine(q->aff.phi[0], &al, &be, &v) &&
           (q->ngf == 1 || smooth_affine(q->aff.phi[1], &al, &be, &v));
}

/* E[φ1(u)] or E[φ1(u)φ2(w)] for φ ∈ {erf, erf_sigmoid, step} with any means, exactly: products of
 * P(ξ < ·) are normal probabilities of dimension ≤ 2 (kernels/mvn.c, error 1e-15) — the 2-D
 * Gauss–Hermite rule loses digits here (1e-4 at variance 4: erf(x) is steep on the rule's
 * scale), and the GRU's r-gates and erf(h̃) with biases of non-zero mean are exactly these. */
static int normal_eval(lim *L, nsr_lim_query *q)
{
    (void)L;
    int ngf = q->ngf;
    double a1, b1, v1, a2 = 0.0, b2 = 1.0, v2 = 0.0;
    double m[2], qv[2], k;
    smooth_affine(q->aff.phi[0], &a1, &b1, &v1);
    if (ngf == 2)
        smooth_affine(q->aff.phi[1], &a2, &b2, &v2);
    group_affine_moments(q, m, qv, &k);
    tpk_estimate A1, A2 = {0.0, 0.0}, B = {0.0, 0.0};
    double s1 = qv[0] + v1, S[4] = {qv[0] + v1, k, k, qv[1] + v2}, mu[2] = {m[0], m[1]};
    tpk_ctx *ctx = &q->w->ctx;
    int st = tpk_mvn_cdf(1, &m[0], &s1, 0.0, &A1, ctx);
    if (!st && ngf == 2) {
        double s2 = qv[1] + v2;
        st = tpk_mvn_cdf(1, &m[1], &s2, 0.0, &A2, ctx);
        if (!st)
            st = tpk_mvn_cdf(2, mu, S, 0.0, &B, ctx);
    }
    if (st == TPK_EUNSUPPORTED) { /* cannot happen for m ≤ 2; keep the general rules then */
        q->declined = 1;
        return TPK_OK;
    }
    if (st)
        return st;
    q->e.value = a1 * a2 * B.value + a1 * b2 * A1.value + b1 * a2 * A2.value + b1 * b2;
    q->e.err = fabs(a1 * a2) * B.err + fabs(a1 * b2) * A1.err + fabs(b1 * a2) * A2.err;
    return TPK_OK;
}

static int gauss12_applicable(const lim *L, nsr_lim_query *q)
{
    return q->kind == NSR_LIM_GROUP && !L->o.no_factor && q->ngf <= 2 && group_affine(L, q);
}

/* E[φ1(u)] by the library's 1-D rule; E[φ1(u)φ2(w)] by its closed form when the means are zero
 * and φ1 = φ2 has one (§3.2), else by its 2-D Gauss–Hermite rule with means (§3.3). */
static int gauss12_eval(lim *L, nsr_lim_query *q)
{
    double m[2], v[2], k;
    const tpk_phi *p1 = q->aff.phi[0], *p2 = q->aff.phi[1];
    group_affine_moments(q, m, v, &k);
    if (q->ngf == 1)
        return tpk_gauss_expect1(p1, m[0], v[0], L->gws, &q->e, &q->w->ctx);
    if (m[0] == 0.0 && m[1] == 0.0 && same_phi(p1, p2) && tpk_phi_has_closed_form(p1))
        return tpk_gauss_expect2(p1, v[0], v[1], k, L->gws, &q->e, &q->w->ctx);
    return tpk_gauss_expect2_quad(p1, p2, m[0], m[1], v[0], v[1], k, L->gws, &q->e, &q->w->ctx);
}

/* ---- orthant --------------------------------------------------------------------------- */

static int orthant_applicable(const lim *L, nsr_lim_query *q)
{
    if (q->kind != NSR_LIM_GROUP || L->o.no_factor || q->ngf < 2 || q->ngf > TPK_ORTHANT_MAXDIM)
        return 0;
    for (int i = 0; i < q->ngf; i++) {
        const fac *f = &q->fs[q->gf[i]];
        int leaf;
        double a, b, v;
        if (!tpk_nsr_orthant_factor(f->node, f->len, &leaf, &a, &b, &v))
            return 0;
    }
    return 1;
}

/* A group whose factors are all smoothed steps σ_v(a·g + b) = P(ξ < a·g + b) (erf-sigmoid gates,
 * steps) is P(w > 0) with w_q = a_q Z^{g_q} + b_q − ξ_q, the ξ_q ~ N(0, v_q) independent — a
 * repeated factor gets its own ξ (theory §2.3). Shifts are keyed by the problem, so a memo hit
 * equals a recomputation (q->site is not used). */
static int orthant_eval(lim *L, nsr_lim_query *q)
{
    int ngf = q->ngf, D = q->D, k[TPK_ORTHANT_MAXDIM];
    double a[TPK_ORTHANT_MAXDIM], b[TPK_ORTHANT_MAXDIM], v[TPK_ORTHANT_MAXDIM];
    double mu[TPK_ORTHANT_MAXDIM], S[TPK_ORTHANT_MAXDIM * TPK_ORTHANT_MAXDIM];
    const pws *w = q->w;
    for (int i = 0; i < ngf; i++) {
        const fac *f = &q->fs[q->gf[i]];
        int leaf;
        tpk_nsr_orthant_factor(f->node, f->len, &leaf, &a[i], &b[i], &v[i]);
        k[i] = w->nodedim[q->nodeoff[q->gf[i]] + leaf];
    }
    for (int i = 0; i < ngf; i++) {
        mu[i] = a[i] * w->m[k[i]] + b[i];
        for (int j = 0; j < ngf; j++)
            S[i * ngf + j] = a[i] * a[j] * w->C[k[i] * D + k[j]] + (i == j ? v[i] : 0.0);
    }
    tpk_orthant_opts oo = {.abs_tol = L->o.orthant_abs_tol, .rel_tol = L->o.orthant_rel_tol,
                           .max_points = L->o.orthant_max_points};
    return tpk_nsr_orthant_cached(L->ocache, ngf, mu, S, L->o.mc_seed, &oo, &q->e, &q->w->ctx);
}

/* ---- joint ----------------------------------------------------------------------------- */

static int joint_applicable(const lim *L, nsr_lim_query *q)
{
    const pws *w = q->w;
    return q->kind == NSR_LIM_GROUP && w->jn_on && w->jn_nf < 0 &&
           q->nd > (L->o.max_gh_dim ? L->o.max_gh_dim : 4);
}

/* A group of more dims than the tensor Gauss–Hermite rule serves, met by m2_entries while the
 * joint sampler is on (limit_expect.c): its factors are left in w->jn_f for m2_joint, which
 * integrates it on the sample all such groups share (netsor/limit_joint.c); here it counts 1, so
 * the product is the group's weight (the product of the entry's other groups). */
static int joint_eval(lim *L, nsr_lim_query *q)
{
    (void)L;
    pws *w = q->w;
    for (int i = 0; i < q->ngf; i++)
        w->jn_f[i] = q->fs[q->gf[i]];
    w->jn_nf = q->ngf;
    q->e.value = 1.0;
    q->e.err = 0.0;
    return TPK_OK;
}

/* ---- quadrature ------------------------------------------------------------------------ */

static int quad_applicable(const lim *L, nsr_lim_query *q)
{
    (void)L;
    return q->kind == NSR_LIM_GROUP;
}

static int quad_eval(lim *L, nsr_lim_query *q)
{
    return nsr_lim_quad_group(L, q);
}

/* ---- the table ------------------------------------------------------------------------- */

const nsr_lim_backend nsr_lim_backends[] = {
    {"batchnorm", bn_applicable, bn_eval},
    {"polynomial", poly_applicable, poly_eval},
    {"linear", linear_applicable, linear_eval},
    {"gauss-map", map_applicable, map_eval},
    {"normal-prob", normal_applicable, normal_eval},
    {"gauss-1d2d", gauss12_applicable, gauss12_eval},
    {"orthant", orthant_applicable, orthant_eval},
    {"joint", joint_applicable, joint_eval},
    {"quadrature", quad_applicable, quad_eval},
};
const int nsr_lim_nbackends = (int)(sizeof nsr_lim_backends / sizeof nsr_lim_backends[0]);
_Static_assert(sizeof nsr_lim_backends / sizeof nsr_lim_backends[0] <= NSR_LIM_MAXBACKENDS,
               "NSR_LIM_MAXBACKENDS counts every back end");

int nsr_lim_pick(const lim *L, nsr_lim_query *q, int from)
{
    for (int i = from; i < nsr_lim_nbackends; i++)
        if (nsr_lim_backends[i].applicable(L, q))
            return i;
    return -1;
}

int nsr_lim_take(lim *L, nsr_lim_query *q, int i)
{
    q->declined = 0;
    int st = nsr_lim_backends[i].eval(L, q);
    if (st == TPK_OK && !q->declined) {
        if (q->kind == NSR_LIM_GROUP)
            q->w->used[i]++; /* a thread's own counts, merged after the parallel loop */
        else
            L->used[i][q->kind]++;
    }
    return st;
}

int nsr_lim_ask(lim *L, nsr_lim_query *q, int *taken)
{
    *taken = -1;
    for (int i = nsr_lim_pick(L, q, 0); i >= 0; i = nsr_lim_pick(L, q, i + 1)) {
        int st = nsr_lim_take(L, q, i);
        if (st)
            return st;
        if (!q->declined) {
            *taken = i;
            return TPK_OK;
        }
    }
    if (q->kind != NSR_LIM_GROUP)
        L->fallback[q->kind]++;
    return TPK_OK;
}
