/* Porting tuned configurations to another machine class (issue 21 item 3; QiMeng-Xpiler's pass
 * pipeline, docs/tuner-notes.md §2): a configuration tuned on one class goes through passes —
 * vector width, register tile, cache re-blocking — each followed by an enumerative repair of the
 * target space's constraints and the exact verifier (tpk_tune_verify_kernel: the kernel compiled
 * and checked bit for bit in a process of its own). The ported set seeds the search there. */
#include "tune_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Repair changes at most this many knobs (the pass output plus a neighbourhood of ~10^4 points). */
#define REPAIR_MAX_KNOBS 3

static int knob_index(const tpk_tune_space *s, const char *name)
{
    for (int i = 0; i < s->nknob; i++)
        if (!strcmp(s->knob[i].name, name))
            return i;
    return -1;
}

/* The candidate of knob k closest to x on the log2 scale (the smaller one on a tie). */
static int nearest(const tpk_tune_knob *k, double x)
{
    int best = k->cand[0];
    double bd = INFINITY;
    for (int j = 0; j < k->ncand; j++) {
        double d = fabs(tpk__log2(k->cand[j]) - tpk__log2(x));
        if (d < bd - 1e-12 || (fabs(d - bd) <= 1e-12 && k->cand[j] < best))
            bd = d, best = k->cand[j];
    }
    return best;
}

/* Distance of a knob change: log2 steps of numeric knobs, 1 for a categorical one. */
static double knob_dist(const tpk_tune_knob *k, int a, int b)
{
    if (a == b)
        return 0;
    if (!k->labels && a > 0 && b > 0)
        return fabs(log2(a) - log2(b));
    return 1;
}

static int in_table(const tpk_tune_knob *k, int v)
{
    for (int j = 0; j < k->ncand; j++)
        if (k->cand[j] == v)
            return 1;
    return 0;
}

/* Enumerative repair: the valid configuration of s nearest to c (sum of knob distances) among
 * those changing at most `left` knobs from index `from` on; *best_d its distance. */
static void repair_search(const tpk_tune_space *s, const tpk_tune_config *orig, tpk_tune_config *c, int from, int left,
                          double d, double *best_d, tpk_tune_config *best)
{
    if (d >= *best_d)
        return;
    if (tpk_tune_space_valid(s, c)) {
        *best_d = d;
        *best = *c;
        return;
    }
    if (left == 0)
        return;
    for (int k = from; k < s->nknob; k++)
        for (int j = 0; j < s->knob[k].ncand; j++) {
            int v = s->knob[k].cand[j];
            if (v == orig->v[k])
                continue;
            int keep = c->v[k];
            c->v[k] = v;
            repair_search(s, orig, c, k + 1, left - 1, d + knob_dist(&s->knob[k], orig->v[k], v), best_d, best);
            c->v[k] = keep;
        }
}

/* 1 when c needed a repair (and was repaired), 0 when it was valid, -1 when nothing within
 * REPAIR_MAX_KNOBS changes is valid. Values outside a knob's table first move to its nearest
 * candidate. */
static int repair(const tpk_tune_space *s, tpk_tune_config *c)
{
    int moved = 0;
    for (int k = 0; k < s->nknob; k++)
        if (!in_table(&s->knob[k], c->v[k])) {
            c->v[k] = nearest(&s->knob[k], c->v[k] > 0 ? c->v[k] : 1);
            moved = 1;
        }
    if (tpk_tune_space_valid(s, c))
        return moved;
    for (int left = 1; left <= REPAIR_MAX_KNOBS; left++) {
        double bd = INFINITY;
        tpk_tune_config best = *c, work = *c;
        repair_search(s, c, &work, 0, left, 0, &bd, &best);
        if (isfinite(bd)) {
            *c = best;
            return 1;
        }
    }
    return -1;
}

/* ---- the passes ---------------------------------------------------------------------------- */

typedef int (*port_pass)(const tpk_tune_space *from, const tpk_tune_space *to, tpk_tune_config *c);
static int pass_registers(const tpk_tune_space *from, const tpk_tune_space *to, tpk_tune_config *c);

/* Vector width: no wider than the target's; the tile's columns (nv vectors) kept in elements,
 * then the register tile re-chosen within the target's registers (a narrower vector doubles nv). */
static int pass_vector(const tpk_tune_space *from, const tpk_tune_space *to, tpk_tune_config *c)
{
    (void)from;
    int kvw = knob_index(to, "vw"), knv = knob_index(to, "nv");
    if (kvw < 0 || c->v[kvw] <= to->machine.vector_bits)
        return 0;
    int old = c->v[kvw];
    c->v[kvw] = nearest(&to->knob[kvw], to->machine.vector_bits);
    if (knv >= 0) {
        c->v[knv] = c->v[knv] * old / c->v[kvw]; /* may leave the table: the register tile decides */
        pass_registers(from, to, c);
        c->v[knv] = nearest(&to->knob[knv], c->v[knv]);
    }
    return 1;
}

/* Register tile (cpu_gemm): within the target's vector registers (mr·nv accumulators, nv B
 * vectors, one broadcast) with ≥ 8 FMA chains, the tile area mr·nv closest to the source's. */
static int pass_registers(const tpk_tune_space *from, const tpk_tune_space *to, tpk_tune_config *c)
{
    (void)from;
    int kmr = knob_index(to, "mr"), knv = knob_index(to, "nv");
    if (kmr < 0 || knv < 0)
        return 0;
    int mr = c->v[kmr], nv = c->v[knv], R = to->machine.registers;
    if (mr * nv + nv + 1 <= R)
        return 0;
    double bd = INFINITY;
    int bm = mr, bn = nv;
    for (int i = 0; i < to->knob[kmr].ncand; i++)
        for (int j = 0; j < to->knob[knv].ncand; j++) {
            int a = to->knob[kmr].cand[i], b = to->knob[knv].cand[j];
            if (a * b + b + 1 > R || a * b < 8)
                continue;
            /* the area first, then the shape (a tile as square in registers as the source's) */
            double d = fabs(log2((double)a * b) - log2((double)mr * nv)) + 0.25 * fabs(log2((double)a / b) - log2((double)mr / nv));
            if (d < bd - 1e-12)
                bd = d, bm = a, bn = b;
        }
    c->v[kmr] = bm;
    c->v[knv] = bn;
    return 1;
}

/* Re-blocking to the target's caches: each block keeps its share of the level it was sized for
 * (BLIS's analytical model, Low et al. 2016: kc by the B micro-panel in L1, mc by the A block in
 * L2, nc by the B panel in L3; the map's column block by L1 and its tile by L2). */
static int pass_caches(const tpk_tune_space *from, const tpk_tune_space *to, tpk_tune_config *c)
{
    const tpk_machine *a = &from->machine, *b = &to->machine;
    tpk_tune_config old = *c;
    int kkc = knob_index(to, "kc"), kmc = knob_index(to, "mc"), knc = knob_index(to, "nc");
    int kmb = knob_index(to, "mb"), knb = knob_index(to, "nb");
    if (kkc >= 0 && kmc >= 0 && knc >= 0) {
        double kc = c->v[kkc] * b->l1 / a->l1;
        c->v[kkc] = nearest(&to->knob[kkc], kc);
        double keep = (double)old.v[kkc] / c->v[kkc]; /* mc·kc and kc·nc keep their bytes per level */
        c->v[kmc] = nearest(&to->knob[kmc], c->v[kmc] * keep * b->l2 / a->l2);
        c->v[knc] = nearest(&to->knob[knc], c->v[knc] * keep * b->l3 / a->l3);
    } else if (kmb >= 0 && knb >= 0) {
        c->v[knb] = nearest(&to->knob[knb], c->v[knb] * b->l1 / a->l1);
        c->v[kmb] = nearest(&to->knob[kmb], c->v[kmb] * ((double)old.v[knb] / c->v[knb]) * b->l2 / a->l2);
    }
    return memcmp(&old, c, sizeof old) != 0;
}

static const struct {
    const char *name;
    port_pass run;
} passes[] = {{"vector", pass_vector}, {"registers", pass_registers}, {"caches", pass_caches}};

int tpk_tune_port_config(const tpk_tune_space *from, const tpk_tune_config *c, const tpk_tune_space *to,
                         const tpk_tune_mutant_opts *verify, tpk_tune_port_report *rep, tpk_ctx *ctx)
{
    memset(rep, 0, sizeof *rep);
    if (strcmp(from->template_name, to->template_name) != 0 || from->nknob != to->nknob)
        return TPK_ERROR(ctx, TPK_EINVAL, "port: a %s configuration cannot go to a %s space", from->template_name,
                         to->template_name);
    tpk_tune_config cur = *c;
    rep->ok = 1;
    int npass = (int)(sizeof passes / sizeof passes[0]);
    for (int p = 0; p < npass && p < TPK_TUNE_PORT_MAX_STEPS; p++) {
        tpk_tune_port_step *st = &rep->step[rep->nstep++];
        snprintf(st->pass, sizeof st->pass, "%s", passes[p].name);
        st->changed = passes[p].run(from, to, &cur);
        int r = repair(to, &cur);
        st->repaired = r > 0;
        st->verified = -1;
        tpk_tune_config_str(to, &cur, st->knobs, sizeof st->knobs);
        if (r < 0) {
            snprintf(st->why, sizeof st->why, "no valid configuration within %d knob changes", REPAIR_MAX_KNOBS);
            rep->ok = 0;
            break;
        }
        /* The exact verifier after every pass that changed the kernel (and on the first pass,
         * so that the source configuration itself is checked on the target's space). */
        if (verify && (st->changed || st->repaired || p == 0)) {
            int ok = 0;
            int s2 = tpk_tune_verify_kernel(to, &cur, verify, &ok, st->why, sizeof st->why, ctx);
            if (s2)
                return s2;
            st->verified = ok;
            if (!ok) {
                rep->ok = 0;
                break;
            }
        }
    }
    rep->c = cur;
    return TPK_OK;
}

int tpk_tune_port(const tpk_tune_record *recs, size_t n, const tpk_machine *from, const tpk_machine *to,
                  const tpk_tune_mutant_opts *verify, FILE *report, FILE *log, int *nported, int *nfailed,
                  tpk_ctx *ctx)
{
    *nported = *nfailed = 0;
    tpk__pick *pg = NULL, *pm = NULL, dg[4], dm[2];
    size_t ng = 0, nm = 0;
    int st = tpk__gemm_picks(recs, n, from, &pg, &ng, dg, ctx);
    if (!st)
        st = tpk__map_picks(recs, n, from, &pm, &nm, dm, ctx);
    if (!st && ng + nm == 0)
        st = TPK_ERROR(ctx, TPK_EINVAL, "port: no tuned configurations of class %s in the logs", from->name);
    for (size_t i = 0; !st && i < ng + nm; i++) {
        const tpk__pick *p = i < ng ? &pg[i] : &pm[i - ng];
        tpk_tune_space ts;
        if ((st = tpk_tune_space_init_on(&ts, &p->r->task, to, ctx)))
            break;
        tpk_tune_port_report rep;
        if ((st = tpk_tune_port_config(&p->s, &p->c, &ts, verify, &rep, ctx)))
            break;
        char src[256];
        tpk_tune_config_str(&p->s, &p->c, src, sizeof src);
        const tpk_tune_task *t = &p->r->task;
        if (report) {
            fprintf(report, "%s %s %zux%zux%zu %dt: %s\n", tpk_tune_op_name(t->op), tpk_tune_dtype_name(t->dtype), t->m,
                    t->n, t->k, t->threads, src);
            for (int k = 0; k < rep.nstep; k++) {
                const tpk_tune_port_step *q = &rep.step[k];
                fprintf(report, "  %-9s %s%s%s %s%s%s\n", q->pass, q->changed ? "changed" : "kept",
                        q->repaired ? ", repaired" : "",
                        q->verified == 1 ? ", verified" : q->verified == 0 ? ", VERIFY FAILED" : "", q->knobs,
                        q->why[0] ? ": " : "", q->why);
            }
            fprintf(report, "  %s\n", rep.ok ? "ported" : "NOT PORTED");
        }
        if (!rep.ok) {
            (*nfailed)++;
            continue;
        }
        (*nported)++;
        if (log) {
            /* An unmeasured record of the target class: the configuration to measure first there
             * (tptune gemm --init=FILE); rate 0, so that it is never a pick of tptune gen. */
            tpk_tune_record rec;
            tpk_tune_result res;
            memset(&res, 0, sizeof res);
            tpk_tune_record_fill(&rec, &ts, &rep.c, &res);
            snprintf(rec.target_class, sizeof rec.target_class, "%s", to->name);
            st = tpk_tune_log_write(log, &rec, ctx);
        }
    }
    free(pg);
    free(pm);
    return st;
}
