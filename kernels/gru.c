/* The erf-GRU limit kernel by its direct recursion (theory.md §2.3, the model of programs/gru.nsr),
 * with the gate products integrated along nested windows (issue 19).
 *
 * The recursion runs in stages m = 0 .. T−1 (0-based times): stage m computes E[h^t_i h^s_j] for
 * every pair of (sequence, time) points with max(t, s) = m, which needs the families' covariances
 * only at times ≤ m, themselves functions of E[h h'] at earlier stages. Per pair of points:
 *   C_z = var_Uz ⟨x, x'⟩/d + var_Wz E[h^{t−1} h'^{s−1}] + var_bz   (C_r likewise),
 *   E[r r'] = P(ξ < r̃, ξ' < r̃')             a bivariate normal probability (σ(x) = P(ξ < x),
 *                                             ξ ~ N(0, 1/2)),
 *   C_h̃ = var_Uh ⟨x, x'⟩/d + var_Wh E[h h'] E[r r'] + var_bh,
 *   E[erf h̃ erf h̃'] = 4 Φ₂ − 2 Φ − 2 Φ' + 1  (erf x = 2 P(η < x) − 1, η ~ N(0, 1/2)),
 * all closed forms, and
 *   E[h^t h'^s] = Σ_{a ≤ t, b ≤ s} P(a, t; b, s) · E[erf h̃^a erf h̃'^b],
 * where P(a, t; b, s) = E[ζ(a, t) ζ'(b, s)] is the Gaussian orthant probability that in
 * Y = z̃ − ξ (covariance C_z + I/2, its own ξ per factor) gate a is open (Y > 0), gates a+1..t are
 * closed (Y < 0), and likewise b, b+1..s on the other side.
 *
 * For a fixed root (a, b) the problems of growing t (or s) are nested: each adds one closed gate.
 * Genz's separation of variables along one order of the gates estimates all the problems that
 * are prefixes of it from one pass over the points (tpk_mvn_sov_prefix). At stage m the new
 * problems of a root are those with t = m or s = m, and two paths cover them: hook 0 holds side
 * 1 closed up to m in its head and then closes side 2 gate by gate, hook 1 the other way round.
 * Every problem of a path contains its head, so the head is ordered by Genz–Bretz priority (the
 * most constraining gate first); the arm stays in time order. On one sequence (i = j) the two
 * copies of a gate share z̃, so "open on one side, closed on the other" is nearly contradictory:
 * such gates go into a head of their own path. Measured against per-problem Genz–Bretz SOV (what
 * the NETSOR evaluator does): equal standard errors at equal points within ~1.5×, while a step
 * serves up to 2m problems instead of one (issue 19 notes). Problems of 2 or 3 gates are exact
 * (kernels/mvn.c), of 4 gates too when the budget is large (small kernels).
 *
 * Each path is its own randomised QMC estimate: NREP Owen-scrambled copies of Sobol points (the
 * net's point 0 put back). A fixed work budget (points × steps) is shared out over the stages;
 * within a stage, rounds double the points of the paths whose errors, relative to their share of
 * the entry's tolerance, are within a factor 2 of the largest, until the target or the budget is
 * reached, so that the work goes where the entries' errors are. Every decision depends only on the path's own points,
 * in a fixed order: the kernel is the same for any number of threads. The error of an entry is the
 * root-sum-square of its terms' standard errors (the terms of one entry come from different
 * paths, so they are independent); errors carried from earlier stages through the covariances
 * are not counted (as in the NETSOR evaluator). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <gsl/gsl_qrng.h>

#include "tpk/alloc.h"
#include "tpk/kernels.h"
#include "tpk/mvn.h"

#define DEF_TOL 1e-8        /* target standard error of each E[h h'] entry */
/* The default work budget, points × steps over all randomisations: DEF_WORK1 per step of every path
 * (a path of L gates has L steps per point), at least DEF_WORK0 — and up to SMALL_GAIN times
 * DEF_WORK0 for kernels of fewer than SMALL_STEPS path steps, in proportion to how few. Chosen so
 * that a 4-sequence × 8-step kernel (23 736 steps) takes ~1 s on the 2-core machines here and
 * 32 × 8 well under a minute, while a 3 × 4 kernel (1110 steps) reaches the 1e-8 target: at
 * DEF_WORK0 alone its worst entry erred by up to 1.3e-7 against a run at 1e-9 (4 random models ×
 * 4 seeds; 2× the floor: ≤ 4.5e-8; issue 19), and refinement stops at the target, so a small
 * kernel spends the larger floor only where its entries need it (3 × 4: ~2.5 s).
 * tpk_gru_params.budget overrides it. */
#define DEF_WORK0 180000000.0
#define DEF_WORK1 2048.0
#define SMALL_STEPS 4500.0
#define SMALL_GAIN 4.0
#define NREP 8              /* randomisations: the standard error has NREP − 1 degrees of freedom */
#define FIRST_PTS 128       /* points per randomisation of the first pass (a multiple of BLK) */
#define MAX_PTS 262144      /* points per randomisation at most (the Sobol table's length) */
#define SOBOL_DIMS 40       /* GSL's Sobol generator; later coordinates are pseudo-random */
#define BLK TPK_MVN_SOV_BLK
/* Problems of up to 3 gates are always exact; of 4 gates when the budget gives every step of the
 * paths at least EXACT4_WORK points (over the randomisations): a deterministic 4-D probability
 * (kernels/mvn.c, ~0.2 ms) then costs less than the QMC it replaces. */
#define EXACT4_WORK 16384.0

static double Phi(double x) { return 0.5 * erfc(-x * M_SQRT1_2); }

int tpk_gru_params_check(const tpk_gru_params *p, tpk_ctx *ctx)
{
    const double v[] = {p->var_Uz, p->var_Ur, p->var_Uh, p->var_Wz, p->var_Wr,
                        p->var_Wh, p->var_bz, p->var_br, p->var_bh, p->sigma_v2};
    static const char *name[] = {"var_Uz", "var_Ur", "var_Uh", "var_Wz", "var_Wr",
                                 "var_Wh", "var_bz", "var_br", "var_bh", "sigma_v2"};
    for (int i = 0; i < 10; i++)
        if (!(v[i] >= 0 && isfinite(v[i])))
            return TPK_ERROR(ctx, TPK_EINVAL, "GRU: %s must be a finite variance >= 0 (got %g)",
                             name[i], v[i]);
    const double mu[] = {p->mu_bz, p->mu_br, p->mu_bh};
    static const char *mname[] = {"mu_bz", "mu_br", "mu_bh"};
    for (int i = 0; i < 3; i++)
        if (!isfinite(mu[i]))
            return TPK_ERROR(ctx, TPK_EINVAL, "GRU: %s must be finite (got %g)", mname[i], mu[i]);
    if (!(p->tol >= 0 && isfinite(p->tol)))
        return TPK_ERROR(ctx, TPK_EINVAL, "GRU: the tolerance must be >= 0 (got %g)", p->tol);
    if (!(p->budget >= 0 && isfinite(p->budget)))
        return TPK_ERROR(ctx, TPK_EINVAL, "GRU: the work budget must be >= 0 (got %g)", p->budget);
    return TPK_OK;
}

/* P(U < h, V < k) for (U, V) centred with variances s1², s2² and covariance c (s1, s2 > 0). */
static int bvn_cov(double h, double k, double s1, double s2, double c, double *out, tpk_ctx *ctx)
{
    double rho = c / (s1 * s2);
    rho = rho > 1 ? 1 : rho < -1 ? -1 : rho;
    tpk_estimate e;
    int st = tpk_mvn_bvn(h / s1, k / s2, rho, &e, ctx);
    *out = e.value;
    return st;
}

/* One path: the gates in SOV order, and which of its prefixes are wanted. Hook 0 wants the entries
 * (m, s) for s = lo..hi: its head is "open a, open b, side 1 closed a+1..m, side 2 closed
 * b+1..lo", its arm side 2 closed lo+1..hi. Hook 1 wants (t, m), t = lo..hi, the sides swapped. */
typedef struct {
    int i, j;          /* sequences of side 1 and side 2 */
    int a, b;          /* the root: open gates a (side 1) and b (side 2) */
    int hook;
    int lo, hi;        /* the wanted entries' range */
} path_task;

enum { MAXNODE = 64 }; /* wanted prefixes of one path, ≤ m + 1 ≤ T */

typedef struct {
    int n;                          /* wanted nodes */
    int t[MAXNODE], s[MAXNODE];     /* their entry (t, s) */
    double val[MAXNODE], se[MAXNODE];
    double work;                    /* points × steps spent (all randomisations) */
    double ratio;                   /* largest standard error / tolerance of its problems */
    double *sums;                   /* NREP × lq running sums of the prefix products */
    size_t M;                       /* points per randomisation so far */
    int init, lq;                   /* set up; longest prefix that needs the QMC (0: none) */
} path_out;

typedef struct {
    const tpk_gru_params *p;
    int N, T, m;
    const double *Cz, *Ee;         /* (N·T)² */
    const uint32_t *rb;            /* Sobol table: rb[c·MAX_PTS + k], the reversed bits */
    int ndims_tab;
    size_t npts_tab;
    double tol;
    int exact_max;                 /* problems of at most this many gates are exact */
} gru_ws;

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* The variables of the path: (side, time, sign) with sign +1 open (Y > 0), −1 closed; the wanted
 * prefixes' lengths and entries. */
static int path_vars(const path_task *q, int m, int *side, int *time, int *sign, int *node_len,
                     int *node_t, int *node_s, int *nn)
{
    int L = 0, n = 0;
    const int full = q->hook == 0 ? 0 : 1; /* the side closed up to m in the head */
    const int root[2] = {q->a, q->b};
    side[L] = 0, time[L] = q->a, sign[L++] = 1;
    side[L] = 1, time[L] = q->b, sign[L++] = 1;
    for (int u = root[full] + 1; u <= m; u++)
        side[L] = full, time[L] = u, sign[L++] = -1;
    for (int u = root[!full] + 1; u <= q->hi; u++) {
        side[L] = !full, time[L] = u, sign[L++] = -1;
        if (u < q->lo)
            continue;
        node_len[n] = L, node_t[n] = full ? u : m, node_s[n++] = full ? m : u;
    }
    if (q->lo == root[!full]) { /* the head alone is the first problem: put it first */
        for (int k = n; k > 0; k--)
            node_len[k] = node_len[k - 1], node_t[k] = node_t[k - 1], node_s[k] = node_s[k - 1];
        node_len[0] = 2 + (m - root[full]);
        node_t[0] = full ? q->a : m, node_s[0] = full ? m : q->b;
        n++;
    }
    *nn = n;
    return L;
}

/* The number of variables of a path. */
static double path_len(const path_task *q, int m)
{
    int side[2 * MAXNODE + 2], time[2 * MAXNODE + 2], sign[2 * MAXNODE + 2];
    int nlen[MAXNODE], nt[MAXNODE], ns[MAXNODE], nn;
    return path_vars(q, m, side, time, sign, nlen, nt, ns, &nn);
}

/* The Genz–Bretz priority order (the most constraining variable first, given the expected values
 * of the earlier ones: Genz & Bretz 2009, §4.1.3) on the first h variables of the path, which
 * every wanted problem contains, so that any order of them keeps the problems prefixes; the
 * rest (the arm, one gate per problem) stay in time order. Permutes S (L×L) and b in place. */
static void head_order(int L, int h, double *S, double *b)
{
    double Lw[L * h], yexp[h];
    int perm[L];
    for (int v = 0; v < L; v++)
        perm[v] = v;
    for (int i = 0; i < h; i++) {
        int best = i;
        double pbest = 2.0, s2best = 0, numbest = 0;
        for (int j = i; j < h; j++) {
            int v = perm[j];
            double s2 = S[v * L + v], num = b[v];
            for (int k = 0; k < i; k++) {
                s2 -= Lw[v * h + k] * Lw[v * h + k];
                num -= Lw[v * h + k] * yexp[k];
            }
            double pr = Phi(num / sqrt(fmax(s2, 1e-300)));
            if (pr < pbest)
                pbest = pr, best = j, s2best = s2, numbest = num;
        }
        int t = perm[i];
        perm[i] = perm[best];
        perm[best] = t;
        int v = perm[i];
        double lii = sqrt(fmax(s2best, 1e-300));
        Lw[v * h + i] = lii;
        for (int j = i + 1; j < L; j++) {
            int u = perm[j];
            double x = S[u * L + v];
            for (int k = 0; k < i; k++)
                x -= Lw[u * h + k] * Lw[v * h + k];
            Lw[u * h + i] = x / lii;
        }
        double c = numbest / lii, P = Phi(c); /* E[Y | Y < c] */
        yexp[i] = P > 1e-300 ? -exp(-0.5 * c * c) / (sqrt(2.0 * M_PI) * P) : c;
    }
    double T2[L * L], b2[L];
    for (int r = 0; r < L; r++) {
        b2[r] = b[perm[r]];
        for (int c = 0; c < L; c++)
            T2[r * L + c] = S[perm[r] * L + perm[c]];
    }
    memcpy(S, T2, sizeof T2);
    memcpy(b, b2, sizeof b2);
}

/* One refinement of a path: its first FIRST_PTS points per randomisation (and its exact problems),
 * or twice the points it has (up to MAX_PTS); the wanted prefixes' probabilities and standard
 * errors in o, and o->ratio, the largest standard error over its problem's share of the entry's
 * tolerance. Returns a status; the only failures are of the deterministic back ends on their own
 * inputs (not expected: S is positive definite, its eigenvalues ≥ 1/2). */
static int run_path(const gru_ws *w, const path_task *q, path_out *o, tpk_ctx *ctx)
{
    const int T = w->T, m = w->m;
    int side[2 * MAXNODE + 2], time[2 * MAXNODE + 2], sign[2 * MAXNODE + 2];
    int nlen[MAXNODE], nt[MAXNODE], ns[MAXNODE], nn;
    int L = path_vars(q, m, side, time, sign, nlen, nt, ns, &nn);
    const double mu = w->p->mu_bz;
    const int NT = w->N * T;
    /* X_v = −σ_v (Y_v − μ) < σ_v μ: the orthant in P(X < b) form */
    double S[L * L], Lc[L * L], b[2 * MAXNODE + 2];
    for (int v = 0; v < L; v++) {
        int pv = (side[v] ? q->j : q->i) * T + time[v];
        b[v] = sign[v] * mu;
        for (int u = 0; u <= v; u++) {
            int pu = (side[u] ? q->j : q->i) * T + time[u];
            double c = w->Cz[(size_t)pv * NT + pu] + (u == v ? 0.5 : 0.0);
            S[v * L + u] = S[u * L + v] = sign[u] * sign[v] * c;
        }
    }
    head_order(L, nlen[0], S, b);
    for (int v = 0; v < L; v++) /* Cholesky; S ≥ I/2 */
        for (int u = 0; u <= v; u++) {
            double s = S[v * L + u];
            for (int k = 0; k < u; k++)
                s -= Lc[v * L + k] * Lc[u * L + k];
            if (u == v)
                Lc[v * L + v] = sqrt(fmax(s, 0.0));
            else
                Lc[v * L + u] = Lc[u * L + u] > 0 ? s / Lc[u * L + u] : 0.0;
        }
    for (int v = 0; v < L; v++)
        for (int u = v + 1; u < L; u++)
            Lc[v * L + u] = 0.0;
    const double wgt = fabs(w->Ee[(size_t)(q->i * T + q->a) * NT + (q->j * T + q->b)]);
    int lq = 0;
    for (int k = 0; k < nn; k++)
        if (nlen[k] > w->exact_max)
            lq = nlen[k];
    if (!o->init) {
        o->init = 1;
        o->n = nn;
        o->lq = lq;
        for (int k = 0; k < nn; k++) {
            o->t[k] = nt[k], o->s[k] = ns[k];
            o->se[k] = o->val[k] = 0.0;
            if (nlen[k] > w->exact_max)
                continue;
            double Sk[16]; /* exact: Φ₂, or the trivariate of kernels/mvn.c */
            int d = nlen[k];
            for (int r = 0; r < d; r++)
                for (int c = 0; c < d; c++)
                    Sk[r * d + c] = S[r * L + c];
            tpk_estimate e;
            int st = tpk_mvn_cdf(d, b, Sk, 0.0, &e, ctx);
            if (st != TPK_OK && st != TPK_ENUMERIC)
                return st;
            o->val[k] = e.value;
            o->se[k] = e.err;
        }
    }
    if (lq == 0)
        return TPK_OK;
    /* the factor of the lq leading variables, stride lq (S is no longer needed) */
    double *Lq = S;
    for (int r = 0; r < lq; r++)
        for (int c = 0; c < lq; c++)
            Lq[r * lq + c] = Lc[r * L + c];
    double tolk[MAXNODE];
    for (int k = 0; k < nn; k++) /* an entry (t, s) sums (t + 1)(s + 1) terms */
        tolk[k] = w->tol / sqrt((double)(nt[k] + 1) * (ns[k] + 1)) / fmax(wgt, 1e-300);
    uint32_t seeds[NREP][2 * MAXNODE + 2];
    uint64_t key = mix64(w->p->seed ^ mix64(((uint64_t)m << 48) ^ ((uint64_t)q->i << 32) ^
                                            ((uint64_t)q->j << 16) ^ ((uint64_t)q->lo << 8) ^
                                            (uint64_t)q->hook) ^
                         mix64(((uint64_t)q->a << 32) | (uint64_t)q->b));
    for (int r = 0; r < NREP; r++)
        for (int c = 0; c < lq - 1; c++)
            seeds[r][c] = (uint32_t)(mix64(key + (uint64_t)(r * 256 + c + 1)) >> 32);
    double us[(2 * MAXNODE + 1) * BLK];
    const size_t M = o->M, Mnext = M == 0 ? FIRST_PTS : 2 * M;
    if (Mnext > MAX_PTS)
        return TPK_OK;
    for (size_t k0 = M; k0 < Mnext; k0 += BLK) {
        for (int r = 0; r < NREP; r++) {
            for (int c = 0; c < lq - 1; c++) {
                if (c < w->ndims_tab) {
                    tpk_mvn_owen_scramble(BLK, w->rb + (size_t)c * w->npts_tab + k0,
                                          seeds[r][c], us + c * BLK);
                } else { /* beyond the Sobol dimensions: independent uniforms */
                    for (int p = 0; p < BLK; p++)
                        us[c * BLK + p] =
                            ((double)(mix64(key ^ mix64(((uint64_t)(k0 + p) << 16) |
                                                        (uint64_t)(r * 256 + c))) >> 11) +
                             0.5) * 0x1p-53;
                }
            }
            tpk_mvn_sov_prefix(lq, Lq, b, us, BLK, o->sums + r * lq);
        }
    }
    o->work += (double)(Mnext - M) * NREP * lq;
    o->M = Mnext;
    /* the estimates against the tolerance */
    o->ratio = 0.0;
    for (int k = 0; k < nn; k++) {
        if (nlen[k] <= w->exact_max)
            continue;
        int l = nlen[k] - 1;
        double s1 = 0, s2 = 0;
        for (int r = 0; r < NREP; r++) {
            double x = o->sums[r * lq + l] / (double)Mnext;
            s1 += x;
            s2 += x * x;
        }
        double mean = s1 / NREP, var = (s2 - NREP * mean * mean) / (NREP - 1);
        o->val[k] = mean;
        o->se[k] = var > 0 ? sqrt(var / NREP) : 0.0;
        o->ratio = fmax(o->ratio, o->se[k] / tolk[k]);
    }
    return TPK_OK;
}

/* The pairs of points (P, Q) = (i·T + t, j·T + s) of stage m (max(t, s) = m), into pq (2 ints each,
 * room for 2·N²·(2m + 1)); returns their number. */
static size_t stage_pairs(int N, int T, int m, int *pq)
{
    size_t n = 0;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++)
            for (int t = 0; t <= m; t++)
                for (int s = 0; s <= m; s++)
                    if (t == m || s == m) {
                        pq[2 * n] = i * T + t;
                        pq[2 * n + 1] = j * T + s;
                        n++;
                    }
    return n;
}

/* The closed-form families at stage m: C_z, E[r r'], C_h̃ and E[erf h̃ erf h̃'] for every pair of
 * points with max(t, s) = m (the diagonal of C_r on the fly; that of C_h̃ is among the pairs). */
static int stage_families(const tpk_gru_params *p, int N, int T, int m, const double *Gx,
                          const double *Ehh, double *Cz, double *Ch, double *Ee, int *pq,
                          tpk_ctx *ctx)
{
    const size_t NT = (size_t)N * T, np = stage_pairs(N, T, m, pq);
    int st = TPK_OK;
    for (size_t k = 0; k < np && !st; k++) {
        const size_t P = (size_t)pq[2 * k], Q = (size_t)pq[2 * k + 1], e = P * NT + Q;
        const int t = (int)(P % T), s = (int)(Q % T);
        double g = Gx[e];
        double prev = t > 0 && s > 0 ? Ehh[(P - 1) * NT + (Q - 1)] : 0.0;
        Cz[e] = p->var_Uz * g + p->var_Wz * prev + p->var_bz;
        double crpq = p->var_Ur * g + p->var_Wr * prev + p->var_br;
        double dP = t > 0 ? Ehh[(P - 1) * NT + (P - 1)] : 0.0;
        double dQ = s > 0 ? Ehh[(Q - 1) * NT + (Q - 1)] : 0.0;
        double crp = p->var_Ur * Gx[P * NT + P] + p->var_Wr * dP + p->var_br;
        double crq = p->var_Ur * Gx[Q * NT + Q] + p->var_Wr * dQ + p->var_br;
        double rr;
        st = bvn_cov(p->mu_br, p->mu_br, sqrt(crp + 0.5), sqrt(crq + 0.5), crpq, &rr, ctx);
        Ch[e] = p->var_Uh * g + p->var_Wh * prev * rr + p->var_bh;
    }
    for (size_t k = 0; k < np && !st; k++) {
        const size_t P = (size_t)pq[2 * k], Q = (size_t)pq[2 * k + 1], e = P * NT + Q;
        double s1 = sqrt(Ch[P * NT + P] + 0.5), s2 = sqrt(Ch[Q * NT + Q] + 0.5), both;
        const double mh = p->mu_bh;
        st = bvn_cov(mh, mh, s1, s2, Ch[e], &both, ctx);
        Ee[e] = 4.0 * both - 2.0 * Phi(mh / s1) - 2.0 * Phi(mh / s2) + 1.0;
    }
    return st;
}

/* The paths of stage m, in a fixed order. Same sequence (i = j): the entries (t, m), t ≤ m, by
 * hook 1 ((m, t) by symmetry); where a < b ≤ m the gate b is open on side 2 and closed on side 1
 * for t ≥ b, nearly contradictory (the two copies share z̃^b), so those entries get a path of
 * their own whose head holds that gate and is ordered by priority. */
static size_t stage_tasks(int N, int m, path_task *out)
{
    size_t n = 0;
#define ADD(...)                                                                                   \
    do {                                                                                           \
        if (out)                                                                                   \
            out[n] = (path_task){__VA_ARGS__};                                                     \
        n++;                                                                                       \
    } while (0)
    for (int i = 0; i < N; i++)
        for (int j = i; j < N; j++)
            for (int a = 0; a <= m; a++)
                for (int b = 0; b <= m; b++) {
                    if (i == j) {
                        if (a < b) {
                            ADD(i, j, a, b, 1, a, b - 1);
                            ADD(i, j, a, b, 1, b, m);
                        } else {
                            ADD(i, j, a, b, 1, a, m);
                        }
                        continue;
                    }
                    ADD(i, j, a, b, 0, b, m);
                    if (a < m)
                        ADD(i, j, a, b, 1, a, m - 1);
                }
#undef ADD
    return n;
}

/* The Sobol table: reversed bits of the first npts points in ndims coordinates, point 0 (which GSL
 * skips) put back, coordinate-major. */
static uint32_t *sobol_table(int ndims, size_t npts, tpk_ctx *ctx)
{
    uint32_t *rb = tpk_calloc(ctx, (size_t)ndims * npts, sizeof *rb);
    if (!rb)
        return NULL;
    tpk_error_gsl_init();
    gsl_qrng *g = gsl_qrng_alloc(gsl_qrng_sobol, (unsigned)ndims);
    if (!g) {
        tpk_free(ctx, rb);
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory for a Sobol generator");
        return NULL;
    }
    double pt[SOBOL_DIMS];
    for (size_t k = 1; k < npts; k++) {
        gsl_qrng_get(g, pt);
        for (int c = 0; c < ndims; c++)
            rb[(size_t)c * npts + k] = tpk_mvn_reverse_bits((uint32_t)(pt[c] * 4294967296.0));
    }
    gsl_qrng_free(g);
    return rb;
}

int tpk_gru_kernel(const tpk_gru_params *p, const tpk_array *X, int all_times,
                   const tpk_progress *prog, tpk_array **K, double *err, tpk_ctx *ctx)
{
    if (!p || !X || !X->data || !K)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_gru_kernel: NULL argument");
    *K = NULL;
    if (err)
        *err = 0.0;
    int st = tpk_gru_params_check(p, ctx);
    if (st)
        return st;
    if (X->ndim != 3 || X->dims[0] < 1 || X->dims[1] < 1 || X->dims[2] < 1)
        return TPK_ERROR(ctx, TPK_EINVAL, "GRU inputs are N x T x d sequences (got rank %d)",
                         X->ndim);
    if (X->dims[1] > MAXNODE - 1)
        return TPK_ERROR(ctx, TPK_EINVAL, "GRU: %zu time steps; the direct recursion serves up "
                         "to %d", X->dims[1], MAXNODE - 1);
    if (X->dims[0] > 65535)
        return TPK_ERROR(ctx, TPK_EINVAL, "GRU: %zu sequences is more than 65535", X->dims[0]);
    const int N = (int)X->dims[0], T = (int)X->dims[1], d = (int)X->dims[2], NT = N * T;
    if ((st = tpk_array_check_input(X, "tpk_gru_kernel", "X", ctx)))
        return st;
    size_t nn = (size_t)NT * NT;
    double *Gx = tpk_calloc(ctx, nn, sizeof *Gx), *Ehh = tpk_calloc(ctx, nn, sizeof *Ehh);
    double *E2 = tpk_calloc(ctx, nn, sizeof *E2), *Cz = tpk_calloc(ctx, nn, sizeof *Cz);
    double *Ch = tpk_calloc(ctx, nn, sizeof *Ch), *Ee = tpk_calloc(ctx, nn, sizeof *Ee);
    const int LMAX = 2 * T + 1; /* a path's variables at most */
    size_t maxtasks = stage_tasks(N, T - 1, NULL);
    path_task *tasks = tpk_calloc(ctx, maxtasks, sizeof *tasks);
    path_out *outs = tpk_calloc(ctx, maxtasks, sizeof *outs);
    double *sums = tpk_calloc(ctx, maxtasks * NREP, (size_t)LMAX * sizeof *sums);
    double *steps = tpk_calloc(ctx, (size_t)T, sizeof *steps); /* Σ path lengths per stage */
    int *pq = tpk_calloc(ctx, 4 * (size_t)N * N * T, sizeof *pq);
    gru_ws w = {.p = p, .N = N, .T = T, .Cz = Cz, .Ee = Ee, .tol = p->tol > 0 ? p->tol : DEF_TOL};
    w.ndims_tab = 2 * T - 1 < SOBOL_DIMS ? 2 * T - 1 : SOBOL_DIMS;
    w.npts_tab = MAX_PTS;
    uint32_t *rb = NULL;
    if (!Gx || !Ehh || !E2 || !Cz || !Ch || !Ee || !tasks || !outs || !sums || !steps || !pq)
        st = ctx->status ? ctx->status : TPK_ENOMEM;
    double steps_all = 0.0;
    for (int m = 0; m < T && !st; m++) {
        size_t nt = stage_tasks(N, m, tasks);
        for (size_t k = 0; k < nt; k++)
            steps[m] += path_len(&tasks[k], m);
        steps_all += steps[m];
    }
    /* the work budget (points × steps over all randomisations), shared out over the stages in
     * proportion to their paths' lengths; what a stage leaves goes to the later ones */
    const double floor0 = DEF_WORK0 * fmin(SMALL_GAIN, fmax(1.0, SMALL_STEPS / steps_all));
    double budget = p->budget > 0 ? p->budget : fmax(floor0, DEF_WORK1 * steps_all), used = 0.0;
    w.exact_max = budget >= EXACT4_WORK * steps_all ? 4 : 3;
    if (!st) {
        rb = sobol_table(w.ndims_tab, w.npts_tab, ctx);
        if (!rb)
            st = ctx->status;
        w.rb = rb;
    }
    for (int P = 0; P < NT && !st; P++) /* ⟨x, x'⟩/d */
        for (int Q = 0; Q <= P; Q++) {
            double s = 0;
            for (int k = 0; k < d; k++)
                s += X->data[(size_t)P * d + k] * X->data[(size_t)Q * d + k];
            Gx[(size_t)P * NT + Q] = Gx[(size_t)Q * NT + P] = s / d;
        }
    double steps_left = steps_all;
    for (int m = 0; m < T && !st; m++) {
        w.m = m;
        st = stage_families(p, N, T, m, Gx, Ehh, Cz, Ch, Ee, pq, ctx);
        size_t nt = st ? 0 : stage_tasks(N, m, tasks);
        const double share = (budget - used) * (steps[m] / steps_left), start = used;
        steps_left -= steps[m];
        memset(outs, 0, nt * sizeof *outs);
        memset(sums, 0, nt * NREP * (size_t)LMAX * sizeof *sums);
        for (size_t k = 0; k < nt; k++)
            outs[k].sums = sums + k * NREP * (size_t)LMAX;
        /* rounds of refinement: the first gives every path FIRST_PTS points; each later one
         * doubles the points of the paths whose errors are within a factor 2 of the largest
         * (relative to their share of the tolerance), so the budget goes to the problems that
         * limit the entries' errors; a round's cost is known before it runs */
        for (int round = 0; !st; round++) {
            double top = 0.0, cost = 0.0;
            for (size_t k = 0; k < nt && round > 0; k++)
                if (outs[k].lq > 0 && 2 * outs[k].M <= MAX_PTS)
                    top = fmax(top, outs[k].ratio);
            const double bar = round == 0 ? 0.0 : fmax(1.0, 0.5 * top);
            for (size_t k = 0; k < nt && round > 0; k++)
                if (outs[k].lq > 0 && 2 * outs[k].M <= MAX_PTS && outs[k].ratio > bar)
                    cost += outs[k].work;
            if (round > 0 && (top <= 1.0 || cost == 0.0 || used - start + cost > share))
                break;
            int fail = TPK_OK;
            char msg[sizeof ctx->msg] = "";
#pragma omp parallel for schedule(dynamic, 4)
            for (size_t k = 0; k < nt; k++) {
                if (fail || tpk_progress_cancelled(prog))
                    continue;
                if (round > 0 && (outs[k].lq == 0 || 2 * outs[k].M > MAX_PTS ||
                                  outs[k].ratio <= bar))
                    continue;
                tpk_ctx lc;
                tpk_ctx_init(&lc);
                int s = run_path(&w, &tasks[k], &outs[k], &lc);
                if (s) {
#pragma omp critical(tpk_gru_fail)
                    if (!fail) {
                        fail = s;
                        snprintf(msg, sizeof msg, "%s", lc.msg);
                    }
                }
            }
            if (fail) {
                st = TPK_ERROR(ctx, fail, "GRU gate product: %s", msg);
                break;
            }
            if ((st = tpk_progress_check(prog, ctx)))
                break;
            used = start;
            for (size_t k = 0; k < nt; k++)
                used += outs[k].work;
        }
        for (size_t k = 0; k < nt && !st; k++) { /* in a fixed order: the sums are reproducible */
            const path_task *q = &tasks[k];
            const path_out *o = &outs[k];
            double ee = Ee[(size_t)(q->i * T + q->a) * NT + (q->j * T + q->b)];
            for (int n = 0; n < o->n; n++) {
                size_t e = (size_t)(q->i * T + o->t[n]) * NT + (q->j * T + o->s[n]);
                Ehh[e] += o->val[n] * ee;
                E2[e] += o->se[n] * ee * (o->se[n] * ee);
            }
        }
        if (!st)
            st = tpk_progress_report(prog, "time steps", (size_t)m + 1, (size_t)T, ctx);
        /* the mirrored entries: (j, s; i, t) of every computed (i, t; j, s), i ≤ j, and on one
         * sequence (s, t) of (t, s), t ≤ s */
        for (size_t k = 0, np = st ? 0 : stage_pairs(N, T, m, pq); k < np; k++) {
            const size_t P = (size_t)pq[2 * k], Q = (size_t)pq[2 * k + 1];
            if (P / T > Q / T || (P / T == Q / T && P > Q))
                continue;
            Ehh[Q * NT + P] = Ehh[P * NT + Q];
            E2[Q * NT + P] = E2[P * NT + Q];
        }
    }
    if (!st) {
        size_t n = all_times ? (size_t)NT : (size_t)N;
        tpk_array *out = tpk_array_alloc2(n, n, ctx);
        if (!out) {
            st = ctx->status;
        } else {
            double emax = 0;
            for (size_t r = 0; r < n; r++)
                for (size_t c = 0; c < n; c++) {
                    size_t P = all_times ? r : r * T + (T - 1), Q = all_times ? c : c * T + (T - 1);
                    out->data[r * n + c] = p->sigma_v2 * Ehh[P * NT + Q];
                    emax = fmax(emax, sqrt(E2[P * NT + Q]));
                }
            for (size_t k = 0; k < n * n && !st; k++)
                if (!isfinite(out->data[k]))
                    st = TPK_ERROR(ctx, TPK_ENUMERIC, "GRU: kernel entry %zu is not finite", k);
            if (st) {
                tpk_array_free(out);
            } else {
                *K = out;
                if (err)
                    *err = p->sigma_v2 * emax;
            }
        }
    }
    tpk_free(ctx, rb);
    tpk_free(ctx, pq);
    tpk_free(ctx, steps);
    tpk_free(ctx, sums);
    tpk_free(ctx, outs);
    tpk_free(ctx, tasks);
    tpk_free(ctx, Ee);
    tpk_free(ctx, Ch);
    tpk_free(ctx, Cz);
    tpk_free(ctx, E2);
    tpk_free(ctx, Ehh);
    tpk_free(ctx, Gx);
    return st;
}
