/* Limit evaluator, stage 4 — expectations (theory.md §1.6 rule 3, §1.9, §2.3): E[Z^u_a Z^v_c]
 * for all input pairs (a MatMul sub-block, a readout) and the values of a Moment, by asking the
 * back-end table (limit_backend.c) level by level: the pair as a whole; else each term pair of
 * the two expansions (limit_expand.c); the term pairs none takes, and a Moment none takes, entry
 * by entry, where each product of factors splits into groups of jointly Gaussian factors that
 * are independent (zero covariance) and each group is asked in turn. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "limit-impl.h"
#include "tpk/alloc.h"

static int uf_find(int *p, int i)
{
    while (p[i] != i)
        i = p[i] = p[p[i]];
    return i;
}

/* E[Π_{q<nf} fs[q]] under the limit Gaussian: the factors' G-var leaves at their inputs are the
 * dims; dims with non-zero covariance (and the leaves of one factor) form a group; constant
 * factors are evaluated; each group goes to the table. */
static int prod_expect(lim *L, pws *w, const fac *fs, int nf, uint64_t site, tpk_estimate *out)
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
            w->C[i * D + j] = w->C[j * D + i] =
                nsr_lim_cov(L, w->dg[i], w->da[i], w->dg[j], w->da[j]);
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
        nsr_lim_query q = {.kind = NSR_LIM_GROUP, .w = w, .fs = fs, .nodeoff = nodeoff, .gf = gf,
                           .ngf = ngf, .nd = nd, .D = D, .site = site ^ ((uint64_t)root << 40),
                           .e = {0.0, 0.0}};
        int taken, st = nsr_lim_ask(L, &q, &taken); /* quadrature takes every group */
        if (st)
            return st;
        /* the groups are independent estimates: first-order propagation, root-sum-square */
        err = hypot(err * fabs(q.e.value), q.e.err * fabs(val));
        val *= q.e.value;
    }
    out->value = val;
    out->err = err;
    return TPK_OK;
}

/* A thread's counts of the group back ends into L's (in a critical section). */
static void merge_used(lim *L, const pws *w)
{
    for (int i = 0; i < nsr_lim_nbackends; i++)
        L->used[i][NSR_LIM_GROUP] += w->used[i];
}

/* The evaluator as the joint sampler sees it (netsor/joint-impl.h). */
static double joint_cov(void *c, int g, size_t a, int h, size_t b)
{
    return nsr_lim_cov((const lim *)c, g, a, h, b);
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
    size_t *off = tpk_malloc(L->ctx, (ng + 1) * sizeof *off);
    size_t *item = off ? tpk_malloc(L->ctx, ng * sizeof *item) : NULL;
    tpk_nsr_jfac *f = item ? tpk_malloc(L->ctx, nf * sizeof *f) : NULL;
    tpk_estimate *e = f ? tpk_malloc(L->ctx, ng * sizeof *e) : NULL;
    int st = e ? TPK_OK : L->ctx->status;
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
    tpk_free(L->ctx, off);
    tpk_free(L->ctx, item);
    tpk_free(L->ctx, f);
    tpk_free(L->ctx, e);
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
    int status = nsr_lim_gh_init(L);
    double emax = 0.0;
    if (status)
        return status;
    size_t nent = sym ? N * (N + 1) / 2 : N * N, nitem = nent * (size_t)ngen;
    double *iv = tpk_malloc(L->ctx, 2 * (nitem ? nitem : 1) * sizeof *iv);
    if (iv == NULL)
        return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
    /* with the joint sampler, an item's group of more dims than max_gh_dim is left in
     * rec[it] (its factors, rnf[it] of them; 0: none) and integrated by m2_joint with the others */
    /* without memory for them, the items are integrated alone: nothing recorded (a fallback) */
    const tpk_allocator *al = TPK_ALLOCATOR_OF(L->ctx);
    fac *rec = L->joint ? tpk_mem_malloc(al, (nitem ? nitem : 1) * 2 * MAXF * sizeof *rec, NULL)
                        : NULL;
    int *rnf = rec ? tpk_mem_malloc(al, (nitem ? nitem : 1) * sizeof *rnf, NULL) : NULL;
    if (rnf != NULL) /* items a cancel skips record nothing */
        memset(rnf, 0, (nitem ? nitem : 1) * sizeof *rnf);
    int joint = rec != NULL && rnf != NULL, retry = 0;
again:
#pragma omp parallel
    {
        pws *w = nsr_lim_pws_alloc(L);
        int my_st = w == NULL ? TPK_ENOMEM : TPK_OK;
#pragma omp for schedule(dynamic, 1)
        for (size_t it = 0; it < nitem; it++) {
            if (my_st != TPK_OK || tpk_progress_cancelled(L->o.progress)) /* a QMC item: ms */
                continue;
            size_t ent = it / (size_t)ngen, a, c;
            int g = (int)(it % (size_t)ngen);
            if (sym) { /* ent = a(a+1)/2 + c, c ≤ a */
                tpk_lower_index(ent, &a, &c);
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
            if (w != NULL)
                merge_used(L, w);
        }
        nsr_lim_pws_free(w);
    }
    /* cancelled: the items skipped set neither iv nor rec, so the shared sample must not run on
     * them (it read uninitialised counts: a crash of Ctrl-C in the erf-GRU, 2 in 14 runs of
     * python/tests/test_interrupt.py) */
    if (status == TPK_OK)
        status = tpk_progress_check(L->o.progress, L->ctx);
    if (status == TPK_OK && joint) {
        status = m2_joint(L, nitem, rec, rnf, iv, &joint);
        if (status == TPK_OK && !joint) { /* the sampler's cache is full: these items alone */
            retry = 1;
            goto again;
        }
    }
    tpk_mem_free(al, rec);
    tpk_mem_free(al, rnf);
    if (status == TPK_OK)
        status = tpk_progress_check(L->o.progress, L->ctx);
    if (status != TPK_OK) {
        tpk_free(L->ctx, iv);
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
    tpk_free(L->ctx, iv);
    *errmax = emax;
    return TPK_OK;
}

/* out[a·ld + c] = scale · E[Z^u_a Z^v_c] for all input pairs; error estimate (max over entries,
 * scaled) into *errp. The pair goes to the table as a whole (batchnorm, polynomial), else to the
 * memo, else term pair by term pair: a lone gauss-map pair straight into out, otherwise the sum
 * of the term pairs' matrices (linear, gauss-map) and of the rest computed entry by entry, which
 * the memo keeps. */
int nsr_lim_m2(lim *L, int u, int v, uint64_t site, scratch *sc, double *out, size_t ld,
               int lower_ok, double scale, double *errp)
{
    size_t N = L->N;
    nsr_lim_query q = {.kind = NSR_LIM_PAIR, .u = u, .v = v, .sc = sc, .out = out, .ld = ld,
                       .lower_ok = lower_ok, .scale = scale, .site = site};
    int taken, st = nsr_lim_ask(L, &q, &taken);
    if (st || taken >= 0) {
        *errp = q.err;
        return st;
    }
    int tr;
    const m2memo *hit = nsr_lim_memo_find(L, u, v, &tr);
    if (hit != NULL) {
        for (size_t a = 0; a < N; a++)
            for (size_t c = 0; c < N; c++)
                out[a * ld + c] = scale * (tr ? hit->E[c * N + a] : hit->E[a * N + c]);
        *errp = fabs(scale) * hit->err;
        return TPK_OK;
    }
    const xbody *bu = &L->xb[u], *bv = &L->xb[v];
    int gen[MAXT * MAXT][2], ngen = 0;
    int fast[MAXT * MAXT][3], nfast = 0; /* term pair, its back end */
    double err = 0.0;
    q.kind = NSR_LIM_TERM;
    for (int s = 0; s < bu->nterms; s++)
        for (int t = 0; t < bv->nterms; t++) {
            q.s = s;
            q.t = t;
            int be = nsr_lim_pick(L, &q, 0);
            if (be < 0) {
                gen[ngen][0] = s;
                gen[ngen][1] = t;
                ngen++;
            } else {
                fast[nfast][0] = s;
                fast[nfast][1] = t;
                fast[nfast][2] = be;
                nfast++;
            }
        }
    if ((ld != N || u != v) && sc->s1 == NULL && (sc->s1 = tpk_malloc(L->ctx, N * N * sizeof *sc->s1)) == NULL)
        return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
    if (nfast == 1 && ngen == 0) { /* the only term pair: its back end may write out itself */
        q.s = fast[0][0];
        q.t = fast[0][1];
        q.alone = 1;
        st = nsr_lim_take(L, &q, fast[0][2]);
        if (st || !q.declined) {
            *errp = q.err;
            return st;
        }
        q.alone = 0;
    }
    if (sc->s1 == NULL && (sc->s1 = tpk_malloc(L->ctx, N * N * sizeof *sc->s1)) == NULL)
        return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
    if (nsr_lim_gh_init(L))
        return L->ctx->status;
    if (sc->s2 == NULL && (sc->s2 = tpk_malloc(L->ctx, N * N * sizeof *sc->s2)) == NULL)
        return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
    if (ngen > 0 && sc->s3 == NULL && (sc->s3 = tpk_malloc(L->ctx, N * N * sizeof *sc->s3)) == NULL)
        return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
    double *acc = sc->s2;
    memset(acc, 0, N * N * sizeof *acc);
    for (int i = 0; i < nfast; i++) {
        q.s = fast[i][0];
        q.t = fast[i][1];
        if ((st = nsr_lim_take(L, &q, fast[i][2])))
            return st;
        double cc = bu->t[q.s].coef * bv->t[q.t].coef;
        for (size_t k = 0; k < N * N; k++)
            acc[k] += cc * (sc->s1[k] + q.mm);
        err = hypot(err, fabs(cc) * q.err);
    }
    if (ngen > 0) {
        double e = 0.0;
        L->fallback[NSR_LIM_TERM] += ngen;
        st = m2_entries(L, u, v, (const int(*)[2])gen, ngen, site, acc, sc->s3, &e);
        if (st)
            return st;
        err = hypot(err, e);
        nsr_lim_memo_put(L, u, v, acc, err);
    }
    nsr_lim_put_rows(N, acc, scale, out, ld);
    *errp = fabs(scale) * err;
    return TPK_OK;
}

/* The N values of Moment instruction k into L->scal[out]: the table (polynomial), else input
 * by input, Σ over its expansion's terms of coef · E[Π factors]. */
int nsr_lim_moment(lim *L, int k)
{
    const tpk_instr *in = &L->p->instr[k];
    size_t N = L->N;
    xbody xb;
    nsr_lim_query mq = {.kind = NSR_LIM_MOMENT, .k = k};
    int taken, pst = nsr_lim_ask(L, &mq, &taken);
    if (pst || taken >= 0)
        return pst;
    if (nsr_lim_gh_init(L))
        return L->ctx->status;
    if (nsr_lim_expand(in->body.node, in->body.len, L->o.no_factor, &xb, L->ctx))
        return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
    double *s = tpk_malloc(L->ctx, N * sizeof *s);
    if (s == NULL) {
        tpk_free(L->ctx, xb.t);
        return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
    }
    int status = TPK_OK;
    double emax = 0.0;
#pragma omp parallel
    {
        pws *w = nsr_lim_pws_alloc(L);
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
                my_st = prod_expect(L, w, fs, xb.t[t].nf, nsr_lim_kid(L, k) * 4096 + (uint64_t)t, &e);
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
            if (w != NULL)
                merge_used(L, w);
        }
        nsr_lim_pws_free(w);
    }
    tpk_free(L->ctx, xb.t);
    if (status != TPK_OK) {
        tpk_free(L->ctx, s);
        return status;
    }
    note_err(L, emax);
    L->scal[in->out] = s;
    return TPK_OK;
}
