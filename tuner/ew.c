/* Fused entrywise candidates (issue 20 item 1; docs/orchestration.md §7.3): the limit evaluator's
 * candidate kernels — chains of φ-maps and weighted sums over the lower triangle of n×n second
 * moments (netsor/ewplan.c) — as text (signatures), emitted as fused C loops (GCC vector
 * extensions, OpenMP) and as CUDA, each verified exactly by a Z_p twin emitted from the same
 * loop nest (Mirage's probabilistic equivalence check), checked against libm to a tolerance,
 * timed in a process of its own, and cached per machine class and shape in JSON lines.
 *
 * One emitter writes both flavours: the loop nest (rows, full vector steps, the padded tail, row
 * and column pointers, stores) is the same text, and every mutation site of the suite sits in it
 * or in the structure both are emitted from, so the twin exercises exactly the kernel's
 * indexing. Only an entry's arithmetic differs: vectors of doubles and closed-form maps, or
 * lanes of integers mod p with each map a random function. */
#include "tune_impl.h"

#include <dlfcn.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- signatures ------------------------------------------------------------------------------ */

static int perr(tpk_ctx *ctx, const char *sig, const char *at, const char *what)
{
    return TPK_ERROR(ctx, TPK_EINVAL, "ew signature, column %d: %s (in \"%.80s\")", (int)(at - sig) + 1, what, sig);
}

static int parse_value(const char **s, int nval, int *v)
{
    if (**s != 'v')
        return -1;
    char *end;
    long x = strtol(*s + 1, &end, 10);
    if (end == *s + 1 || x < 0 || x >= nval)
        return -1;
    *v = (int)x;
    *s = end;
    return 0;
}

int tpk_tune_ew_parse(const char *sig, tpk_tune_ew *e, tpk_ctx *ctx)
{
    memset(e, 0, sizeof *e);
    const char *s = sig;
    if (strncmp(s, "in=", 3) != 0)
        return perr(ctx, sig, s, "expected in=K");
    char *end;
    long k = strtol(s + 3, &end, 10);
    if (end == s + 3 || k < 0 || k > TPK_TUNE_EW_MAXIN)
        return perr(ctx, sig, s + 3, "the inputs' count must be 0 to 16");
    e->nin = (int)k;
    s = end;
    while (*s == ';') {
        s++;
        if (e->np == TPK_TUNE_EW_MAXP)
            return perr(ctx, sig, s, "more than 16 primitives");
        tpk_tune_ew_prim *p = &e->p[e->np];
        const int nval = e->nin + e->np;
        if (!strncmp(s, "sum(", 4)) {
            p->op = TPK_TUNE_EW_SUM;
            s += 4;
            for (;;) {
                if (p->nt == TPK_TUNE_EW_MAXT)
                    return perr(ctx, sig, s, "more than 8 terms");
                if (*s == 'b') {
                    p->arg[p->nt] = -1;
                    s++;
                } else if (parse_value(&s, nval, &p->arg[p->nt]))
                    return perr(ctx, sig, s, "expected a term: b or vI with I an earlier value");
                if (!strncmp(s, "*w", 2)) {
                    p->weighted[p->nt] = 1;
                    s += 2;
                }
                p->nt++;
                if (*s == ',') {
                    s++;
                    continue;
                }
                if (*s != ')')
                    return perr(ctx, sig, s, "expected , or )");
                s++;
                break;
            }
        } else {
            p->op = TPK_TUNE_EW_MAP;
            p->nt = 1;
            p->b = 1;
            if (!strncmp(s, "relu(", 5))
                p->phi = TPK_TUNE_EW_RELU, s += 4;
            else if (!strncmp(s, "identity(", 9))
                p->phi = TPK_TUNE_EW_IDENTITY, s += 8;
            else if (!strncmp(s, "erf", 3) && (s[3] == '(' || s[3] == '[')) {
                p->phi = TPK_TUNE_EW_ERF;
                s += 3;
                if (*s == '[') {
                    p->b = strtod(s + 1, &end);
                    if (end == s + 1 || *end != ']' || !isfinite(p->b))
                        return perr(ctx, sig, s, "expected erf[b] with b a number");
                    s = end + 1;
                }
            } else
                return perr(ctx, sig, s, "expected sum(...) or a map relu, identity, erf[b] (no other φ has an emitted map)");
            if (*s != '(')
                return perr(ctx, sig, s, "expected (");
            s++;
            if (parse_value(&s, nval, &p->arg[0]))
                return perr(ctx, sig, s, "expected vI with I an earlier value");
            if (*s != ')')
                return perr(ctx, sig, s, "expected )");
            s++;
        }
        if (*s == '!') {
            p->stored = 1;
            s++;
        }
        e->np++;
    }
    if (*s)
        return perr(ctx, sig, s, "expected ; or the end");
    if (e->np == 0)
        return perr(ctx, sig, s, "no primitive");
    e->p[e->np - 1].stored = 1;
    /* a candidate computes only what it writes or reads itself: a dead primitive is a mistake */
    for (int q = 0; q < e->np; q++) {
        int read = e->p[q].stored;
        for (int r = q + 1; r < e->np && !read; r++)
            for (int t = 0; t < e->p[r].nt; t++)
                read |= e->p[r].arg[t] == e->nin + q;
        if (!read)
            return TPK_ERROR(ctx, TPK_EINVAL, "ew signature: primitive %d (v%d) is neither stored (!) nor read (in \"%.80s\")",
                             q, e->nin + q, sig);
    }
    return TPK_OK;
}

void tpk_tune_ew_print(const tpk_tune_ew *e, char *out, size_t cap)
{
    size_t at = 0;
#define PUT(...) (at += (size_t)snprintf(out + (at < cap ? at : cap), at < cap ? cap - at : 0, __VA_ARGS__))
    if (cap)
        out[0] = '\0';
    PUT("in=%d", e->nin);
    for (int q = 0; q < e->np; q++) {
        const tpk_tune_ew_prim *p = &e->p[q];
        if (p->op == TPK_TUNE_EW_MAP) {
            static const char *const nm[] = {"identity", "relu", "erf"};
            PUT(";%s", nm[p->phi]);
            if (p->phi == TPK_TUNE_EW_ERF && p->b != 1) {
                char bs[32];
                snprintf(bs, sizeof bs, "%.15g", p->b); /* shortest of the two that reads back */
                if (strtod(bs, NULL) != p->b)
                    snprintf(bs, sizeof bs, "%.17g", p->b);
                PUT("[%s]", bs);
            }
            PUT("(v%d)", p->arg[0]);
        } else {
            PUT(";sum(");
            for (int t = 0; t < p->nt; t++) {
                if (p->arg[t] < 0)
                    PUT("%sb", t ? "," : "");
                else
                    PUT("%sv%d", t ? "," : "", p->arg[t]);
                if (p->weighted[t])
                    PUT("*w");
            }
            PUT(")");
        }
        if (p->stored && q + 1 < e->np)
            PUT("!");
    }
#undef PUT
}

void tpk_tune_ew_counts(const tpk_tune_ew *e, int *npar, int *nw)
{
    int a = 0, b = 0;
    for (int q = 0; q < e->np; q++) {
        a += e->p[q].op == TPK_TUNE_EW_MAP ? 2 : e->p[q].nt;
        for (int t = 0; t < e->p[q].nt; t++)
            b += e->p[q].op == TPK_TUNE_EW_SUM && e->p[q].weighted[t];
    }
    *npar = a;
    *nw = b;
}

void tpk_tune_ew_default(tpk_tune_ew_cfg *c)
{
    tpk_machine m;
    tpk_machine_host(&m);
    c->lanes = m.vector_bits >= 512 ? 8 : 4;
    c->chunk = 4;
    c->pre = 1;
}

/* ---- the emitter ---------------------------------------------------------------------------- */

/* What an emission needs to know of the structure: per primitive its parameters' offset, per
 * weighted term its weight vector, the column arrays the maps read (a value's diagonal, or with
 * pre its per-map transforms: √q and 1/√q for relu, 1/√(1 + 2b²q) for erf), which inputs are
 * read. Mutations of the structure (a dropped term, swapped arguments or parameters, an argument
 * from the value before) are applied here, so both flavours carry them. */
#define MAXCOL (2 * TPK_TUNE_EW_MAXP)
typedef struct column {
    char src[24];   /* the array: dg[v], or a prologue's A3 / R3 */
    int map, what;  /* pre: the map it serves and its transform (0: A, 1: R); −1: a diagonal */
    int v;          /* the value whose diagonal it comes from */
} column;
typedef struct layout {
    tpk_tune_ew e;
    int pre;
    int par[TPK_TUNE_EW_MAXP], parswap[TPK_TUNE_EW_MAXP];
    int wid[TPK_TUNE_EW_MAXP][TPK_TUNE_EW_MAXT];
    int colA[TPK_TUNE_EW_MAXP], colR[TPK_TUNE_EW_MAXP]; /* a map's columns (−1: none) */
    column col[MAXCOL];
    int inused[TPK_TUNE_EW_MAXIN];
    int nw, ncol;
} layout;

static int add_col(layout *L, int v, int map, int what)
{
    for (int k = 0; k < L->ncol; k++) /* without pre, maps of one value share its diagonal */
        if (map < 0 && L->col[k].map < 0 && L->col[k].v == v)
            return k;
    column *c = &L->col[L->ncol];
    c->v = v;
    c->map = map;
    c->what = what;
    if (map < 0)
        snprintf(c->src, sizeof c->src, "dg[%d]", v);
    else
        snprintf(c->src, sizeof c->src, "%c%d", what ? 'R' : 'A', map);
    return L->ncol++;
}

static void lay_out(const tpk_tune_ew *src, int pre, tpk__mutation *mu, layout *L)
{
    memset(L, 0, sizeof *L);
    L->e = *src;
    L->pre = pre;
    tpk_tune_ew *e = &L->e;
    int off = 0;
    for (int q = 0; q < e->np; q++) {
        tpk_tune_ew_prim *p = &e->p[q];
        L->par[q] = off;
        off += p->op == TPK_TUNE_EW_MAP ? 2 : p->nt;
        for (int t = 0; t < p->nt; t++)
            L->wid[q][t] = p->op == TPK_TUNE_EW_SUM && p->weighted[t] ? L->nw++ : -1;
        /* sites: a map's α and β swapped (the verifier draws them distinct); a sum's last term
         * dropped (its parameters stay where they were); two value terms' arguments swapped
         * (their coefficients stay); an argument taken from the value before it */
        if (p->op == TPK_TUNE_EW_MAP)
            L->parswap[q] = tpk__mut_at(mu, TPK__MUT_EW_PAR_SWAP, 1);
        if (p->op == TPK_TUNE_EW_SUM && tpk__mut_at(mu, TPK__MUT_EW_TERM_DROP, p->nt > 1))
            p->nt--;
        if (p->op == TPK_TUNE_EW_SUM && p->nt > 1 && p->arg[0] >= 0 && p->arg[1] >= 0 && p->arg[0] != p->arg[1] &&
            tpk__mut_at(mu, TPK__MUT_EW_ARG_SWAP, 1)) {
            int a = p->arg[0];
            p->arg[0] = p->arg[1];
            p->arg[1] = a;
        }
        if (p->arg[0] > 0 && tpk__mut_at(mu, TPK__MUT_EW_ARG_PREV, 1))
            p->arg[0]--;
    }
    for (int q = 0; q < e->np; q++) {
        const tpk_tune_ew_prim *p = &e->p[q];
        L->colA[q] = L->colR[q] = -1;
        for (int t = 0; t < p->nt; t++)
            if (p->arg[t] >= 0 && p->arg[t] < e->nin)
                L->inused[p->arg[t]] = 1;
        if (p->op != TPK_TUNE_EW_MAP || p->phi == TPK_TUNE_EW_IDENTITY) /* the identity reads no variance */
            continue;
        L->colA[q] = add_col(L, p->arg[0], pre ? q : -1, 0);
        if (pre && p->phi == TPK_TUNE_EW_RELU)
            L->colR[q] = add_col(L, p->arg[0], q, 1);
    }
}

/* Where the body reads and writes, at a full step (pointers into the matrices at column j) or in
 * the tail (padded local rows). Row scalars are cr<k> (column k at row i) and wr<t>. */
typedef struct names {
    char x[TPK_TUNE_EW_MAXIN][48], c[MAXCOL][48], wc[TPK_TUNE_EW_MAXP * TPK_TUNE_EW_MAXT][48], o[TPK_TUNE_EW_MAXP][48];
} names;

/* A value's row of L entries as the body names it: an input's or a primitive's local. */
static void vname(const layout *L, int v, char *out, size_t cap)
{
    if (v < L->e.nin)
        snprintf(out, cap, "x%d", v);
    else
        snprintf(out, cap, "p%d", v - L->e.nin);
}

/* The body of the real kernel: vectors of `lanes` doubles. */
static void body_real(FILE *o, const layout *L, const char *V, const names *nm)
{
    const tpk_tune_ew *e = &L->e;
    for (int k = 0; k < e->nin; k++)
        if (L->inused[k])
            fprintf(o, "            const %s x%d = %s_ld(%s);\n", V, k, V, nm->x[k]);
    for (int q = 0; q < e->np; q++) {
        const tpk_tune_ew_prim *p = &e->p[q];
        char a[16];
        const int pa = L->par[q], sw = L->parswap[q], cA = L->colA[q], cR = L->colR[q];
        if (p->op == TPK_TUNE_EW_MAP) {
            vname(L, p->arg[0], a, sizeof a);
            const char *al = sw ? "1" : "0", *be = sw ? "0" : "1";
            if (p->phi == TPK_TUNE_EW_IDENTITY) {
                fprintf(o, "            const %s p%d = par[%d + %s] * %s + par[%d + %s];\n", V, q, pa, al, a, pa, be);
                continue;
            }
            fprintf(o, "            %s p%d;\n            {\n                const %s ca = %s_ld(%s);\n", V, q, V, V, nm->c[cA]);
            if (p->phi == TPK_TUNE_EW_RELU) {
                /* α/(2π) √(q_i q_j) (sin θ + (π − θ) cos θ) + β, cos θ = ρ (theory.md §3.2) */
                if (L->pre)
                    fprintf(o, "                const %s s = cr%d * ca;\n"
                               "                %s r = %s * (cr%d * %s_ld(%s));\n",
                            V, cA, V, a, cR, V, nm->c[cR]);
                else
                    fprintf(o, "                const %s s = %s_sqrt(cr%d * ca);\n"
                               "                %s r = %s_sel(s > 0, %s / %s_sel(s > 0, s, one), zero);\n",
                            V, V, cA, V, V, a, V);
                fprintf(o, "                r = %s_sel(r > 1, one, %s_sel(r < -1, -one, r));\n"
                           "                const %s c = one - r * r;\n"
                           "                const %s J = %s_sqrt(%s_sel(c > 0, c, zero)) + %s_pmt_poly(r) * r;\n"
                           "                p%d = (par[%d + %s] * 0.15915494309189533577) * s * J + par[%d + %s];\n",
                        V, V, V, V, V, V, V, q, pa, al, pa, be);
            } else {
                /* α (2/π) asin(2b²x / √((1 + 2b² q_i)(1 + 2b² q_j))) + β (Williams 1997) */
                fprintf(o, "                const double g = %.17g;\n", 2 * p->b * p->b);
                if (L->pre)
                    fprintf(o, "                %s z = (g * %s) * (cr%d * ca);\n", V, a, cA);
                else
                    fprintf(o, "                %s z = (g * %s) / %s_sqrt((one + g * cr%d) * (one + g * ca));\n", V, a,
                            V, cA);
                fprintf(o, "                z = %s_sel(z > 1, one, %s_sel(z < -1, -one, z));\n"
                           "                p%d = (par[%d + %s] * 0.63661977236758134308) * (%s_pmt_poly(z) - 1.57079632679489661923)"
                           " + par[%d + %s];\n",
                        V, V, q, pa, al, V, pa, be);
            }
            fprintf(o, "            }\n");
            continue;
        }
        fprintf(o, "            const %s p%d = zero", V, q);
        for (int t = 0; t < p->nt; t++) {
            const int wi = L->wid[q][t];
            char w[96] = "";
            if (wi >= 0)
                snprintf(w, sizeof w, " * (wr%d * %s_ld(%s))", wi, V, nm->wc[wi]);
            if (p->arg[t] < 0)
                fprintf(o, "\n                + par[%d]%s", pa + t, w);
            else {
                vname(L, p->arg[t], a, sizeof a);
                fprintf(o, "\n                + par[%d] * %s%s", pa + t, a, w);
            }
        }
        fprintf(o, ";\n");
    }
    for (int q = 0; q < e->np; q++)
        if (nm->o[q][0])
            fprintf(o, "            %s_st(%s, p%d);\n", V, nm->o[q], q);
}

/* The body of the twin: the same reads and writes, lane by lane in Z_p. A map is
 * α f_q(x, h_i, h_j) + β with f_q a random function (the table of tpk_twin_tables) and h what
 * the kernel reads of row i and column j: the variance, or with pre the prologue's A + 3R. A sum
 * is Σ c_t (w_i w_j) x_t mod p. */
static void body_twin(FILE *o, const layout *L, int lanes, const names *nm)
{
    const tpk_tune_ew *e = &L->e;
    fprintf(o, "            for (int l = 0; l < %d; l++) {\n", lanes);
    for (int k = 0; k < e->nin; k++)
        if (L->inused[k])
            fprintf(o, "                const uint64_t x%d = (uint64_t)(%s)[l];\n", k, nm->x[k]);
    for (int q = 0; q < e->np; q++) {
        const tpk_tune_ew_prim *p = &e->p[q];
        char a[16];
        const int pa = L->par[q], sw = L->parswap[q], cA = L->colA[q], cR = L->colR[q];
        if (p->op == TPK_TUNE_EW_MAP) {
            vname(L, p->arg[0], a, sizeof a);
            char hi[96] = "0", hj[160] = "0";
            if (cA >= 0 && cR >= 0) {
                snprintf(hi, sizeof hi, "zadd(zp(cr%d), zmul(3, zp(cr%d)))", cA, cR);
                snprintf(hj, sizeof hj, "zadd(zp((%s)[l]), zmul(3, zp((%s)[l])))", nm->c[cA], nm->c[cR]);
            } else if (cA >= 0) {
                snprintf(hi, sizeof hi, "zp(cr%d)", cA);
                snprintf(hj, sizeof hj, "zp((%s)[l])", nm->c[cA]);
            }
            fprintf(o, "                const uint64_t p%d = zadd(zmul(zp(par[%d]), zf(%d, %s, %s, %s)), zp(par[%d]));\n",
                    q, pa + sw, q, a, hi, hj, pa + 1 - sw);
            continue;
        }
        fprintf(o, "                uint64_t p%d = 0;\n", q);
        for (int t = 0; t < p->nt; t++) {
            const int wi = L->wid[q][t];
            char term[200];
            if (p->arg[t] < 0)
                snprintf(term, sizeof term, "zp(par[%d])", pa + t);
            else {
                vname(L, p->arg[t], a, sizeof a);
                snprintf(term, sizeof term, "zmul(zp(par[%d]), %s)", pa + t, a);
            }
            if (wi >= 0)
                fprintf(o, "                p%d = zadd(p%d, zmul(%s, zmul(zp(wr%d), zp((%s)[l]))));\n", q, q, term, wi, nm->wc[wi]);
            else
                fprintf(o, "                p%d = zadd(p%d, %s);\n", q, q, term);
        }
    }
    for (int q = 0; q < e->np; q++)
        if (nm->o[q][0])
            fprintf(o, "                (%s)[l] = (double)p%d;\n", nm->o[q], q);
    fprintf(o, "            }\n");
}

static void body(FILE *o, const layout *L, int twin, int lanes, const char *V, const names *nm)
{
    if (twin)
        body_twin(o, L, lanes, nm);
    else
        body_real(o, L, V, nm);
}

/* The twin's prelude: Z_p arithmetic and the random functions. */
static void twin_prelude(FILE *o)
{
    fputs("#include <stddef.h>\n#include <stdint.h>\n#include <stdlib.h>\n#include <omp.h>\n\n"
          "#define TPK_ZP_P 2147483647ull\n"
          "/* tab: 2^16 random values of Z_p, then four coefficients (tpk_twin_tables) */\n"
          "static const uint64_t *tpk_zp_tab;\n"
          "void tpk_twin_tables(const uint64_t *tab);\n"
          "void tpk_twin_tables(const uint64_t *tab)\n{\n    tpk_zp_tab = tab;\n}\n"
          "static inline uint64_t zp(double x)\n{\n    return (uint64_t)x;\n}\n"
          "static inline uint64_t zadd(uint64_t a, uint64_t b)\n{\n    return (a + b) % TPK_ZP_P;\n}\n"
          "static inline uint64_t zmul(uint64_t a, uint64_t b)\n{\n    return a * b % TPK_ZP_P;\n}\n"
          "/* f_q(x, a, b) = T[(x + 7919 q) mod 2^16] + c0 x + c1 (a + b) + c2 a b + c3 q (mod p) */\n"
          "static inline uint64_t zf(int q, uint64_t x, uint64_t a, uint64_t b)\n{\n"
          "    const uint64_t *c = tpk_zp_tab + 65536;\n"
          "    uint64_t r = zadd(tpk_zp_tab[(x + 7919u * (unsigned)q) & 65535u], zmul(c[0], x));\n"
          "    r = zadd(r, zmul(c[1], zadd(a, b)));\n"
          "    return zadd(zadd(r, zmul(c[2], zmul(a, b))), zmul(c[3], (uint64_t)q));\n}\n\n", o);
}

/* The prologue's transforms of column k at entry j of its diagonal q (pre). */
static void prologue_entry(FILE *o, const layout *L, int k, int twin)
{
    const column *c = &L->col[k];
    const tpk_tune_ew_prim *p = &L->e.p[c->map];
    if (twin)
        fprintf(o, "        %s[j] = (double)zf(%d, zp(dg[%d][j]), 0, 0);\n", c->src, 64 + 2 * c->map + c->what, c->v);
    else if (p->phi == TPK_TUNE_EW_ERF)
        fprintf(o, "        %s[j] = 1 / sqrt(1 + %.17g * dg[%d][j]);\n", c->src, 2 * p->b * p->b, c->v);
    else if (c->what == 0)
        fprintf(o, "        %s[j] = sqrt(dg[%d][j]);\n", c->src, c->v);
    else
        fprintf(o, "        %s[j] = dg[%d][j] > 0 ? 1 / sqrt(dg[%d][j]) : 0;\n", c->src, c->v, c->v);
}

int tpk__ew_emit(const tpk_tune_ew *e0, const tpk_tune_ew_cfg *c, const char *fn, int twin, int standalone,
                 tpk__mutation *mu, FILE *o, tpk_ctx *ctx)
{
    if (c->lanes != 4 && c->lanes != 8)
        return TPK_ERROR(ctx, TPK_EINVAL, "ew: lanes must be 4 or 8 doubles");
    if (c->chunk < 1 || c->chunk > 1024)
        return TPK_ERROR(ctx, TPK_EINVAL, "ew: chunk must be 1 to 1024 rows");
    if (c->pre != 0 && c->pre != 1)
        return TPK_ERROR(ctx, TPK_EINVAL, "ew: pre must be 0 or 1");
    layout L;
    lay_out(e0, c->pre, mu, &L);
    const tpk_tune_ew *e = &L.e;
    const int W = c->lanes;
    const char *V = W == 8 ? "tpk_v8d" : "tpk_v4d";
    char sig[TPK_TUNE_EW_SIGLEN];
    tpk_tune_ew_print(e0, sig, sizeof sig);
    if (standalone) {
        fprintf(o, "/* Generated by tptune (tpk tuner, cpu_ew template%s) - DO NOT EDIT. */\n",
                twin ? ", Z_p twin for exact verification" : "");
        if (twin)
            twin_prelude(o);
        else {
            tpk_tune_emit_cpu_prelude(o);
            tpk__cpu_map_prelude(o);
            fputs("#include <stdlib.h>\n\n", o);
        }
    }
    fprintf(o, "/* ---- %s: the fused entrywise kernel %s, lanes=%d chunk=%d pre=%d%s ---- */\n", fn, sig, W, c->chunk,
            c->pre, twin ? " (Z_p twin)" : "");
    fprintf(o, "int %s(size_t n, const double *const *in, const double *const *dg, double *const *out,\n"
               "        const double *par, const double *const *w, int threads);\n", fn);
    fprintf(o, "int %s(size_t n, const double *const *in, const double *const *dg, double *const *out,\n"
               "        const double *par, const double *const *w, int threads)\n{\n", fn);
    fprintf(o, "    (void)in, (void)dg, (void)out, (void)w;\n");
    fprintf(o, "    const int nt = threads > 0 ? threads : omp_get_max_threads();\n");
    if (!twin)
        fprintf(o, "    const %s zero = {0}, one = zero + 1;\n    (void)one;\n", V);
    /* pre: each map's column transforms, once per call (a few entries past n: the tail's padding
     * is read from them, never stored) */
    const int npre = c->pre ? L.ncol : 0;
    if (npre) {
        fprintf(o, "    double *const buf = malloc(%d * (n + 8) * sizeof(double));\n    if (!buf)\n        return -1;\n", npre);
        for (int k = 0; k < L.ncol; k++)
            fprintf(o, "    double *const %s = buf + %d * (n + 8);\n", L.col[k].src, k);
        fprintf(o, "#pragma omp parallel for schedule(static) num_threads(nt)\n    for (size_t j = 0; j < %s; j++) {\n",
                tpk__site(mu, TPK__MUT_EW_PRE_END, 1, "n", "n - 1"));
        for (int k = 0; k < L.ncol; k++)
            prologue_entry(o, &L, k, twin);
        fprintf(o, "    }\n");
    }
    /* rows: the last one dropped (a site) */
    fprintf(o, "#pragma omp parallel for schedule(dynamic, %d) num_threads(nt)\n"
               "    for (size_t i = 0; i < %s; i++) {\n",
            c->chunk, tpk__site(mu, TPK__MUT_EW_ROWS, 1, "n", "(n > 1 ? n - 1 : n)"));
    fprintf(o, "        const size_t je = %s;\n", tpk__site(mu, TPK__MUT_EW_ROW_END, 1, "i + 1", "i"));
    for (int k = 0; k < e->nin; k++)
        if (L.inused[k])
            fprintf(o, "        const double *xr%d = in[%d] + %s;\n", k, k,
                    tpk__site(mu, TPK__MUT_EW_IN_ROW, 1, "i * n", "(i > 0 ? i - 1 : 0) * n"));
    for (int k = 0; k < L.ncol; k++)
        fprintf(o, "        const double cr%d = %s[%s];\n", k, L.col[k].src,
                tpk__site(mu, TPK__MUT_EW_Q_ROW, 1, "i", "i > 0 ? i - 1 : 1 % n"));
    for (int q = 0; q < e->np; q++)
        for (int t = 0; t < e->p[q].nt; t++)
            if (L.wid[q][t] >= 0)
                fprintf(o, "        const double wr%d = w[%d][%s];\n", L.wid[q][t], L.wid[q][t],
                        tpk__site(mu, TPK__MUT_EW_W_ROW, 1, "i", "i > 0 ? i - 1 : 1 % n"));
    int laststore = -1;
    for (int q = 0; q < e->np; q++)
        if (e->p[q].stored)
            fprintf(o, "        double *or%d = out[%d] + i * n;\n", q, q), laststore = q;
    /* full steps */
    names nm;
    memset(&nm, 0, sizeof nm);
    int first = 1;
    for (int k = 0; k < e->nin; k++)
        if (L.inused[k]) {
            snprintf(nm.x[k], sizeof nm.x[k], "xr%d + j%s", k,
                     tpk__site(mu, TPK__MUT_EW_COL_SHIFT, first, "", " + 1"));
            first = 0;
        }
    for (int k = 0; k < L.ncol; k++)
        snprintf(nm.c[k], sizeof nm.c[k], "%s + j%s", L.col[k].src, tpk__site(mu, TPK__MUT_EW_Q_COL, 1, "", " + 1"));
    for (int i = 0; i < L.nw; i++)
        snprintf(nm.wc[i], sizeof nm.wc[i], "w[%d] + j%s", i, tpk__site(mu, TPK__MUT_EW_W_COL, 1, "", " + 1"));
    for (int q = 0; q < e->np; q++)
        if (e->p[q].stored && !(q != laststore && tpk__mut_at(mu, TPK__MUT_EW_STORE_SKIP, 1)))
            snprintf(nm.o[q], sizeof nm.o[q], "or%d + j", q);
    fprintf(o, "        size_t j = 0;\n        for (; j + %d <= je; j += %s) {\n", W,
            tpk__site(mu, TPK__MUT_EW_STEP, 1, W == 8 ? "8" : "4", W == 8 ? "9" : "5"));
    body(o, &L, twin, W, V, &nm);
    fprintf(o, "        }\n");
    /* the tail: its rows copied into padded locals (columns 1, values and weights 0), the same
     * body, the first len entries stored */
    fprintf(o, "        if (j < je) {\n            const size_t len = je - j;\n");
    fprintf(o, "            double tx[%d][%d] = {{0}}, tc[%d][%d], tw[%d][%d] = {{0}}, to[%d][%d];\n",
            e->nin > 0 ? e->nin : 1, W, L.ncol > 0 ? L.ncol : 1, W, L.nw > 0 ? L.nw : 1, W, e->np, W);
    fprintf(o, "            (void)tx, (void)tc, (void)tw;\n"
               "            for (int l = 0; l < %d; l++) {\n"
               "                for (int k = 0; k < %d; k++)\n                    tc[k][l] = 1;\n"
               "                for (int k = 0; k < %d; k++)\n                    to[k][l] = 0;\n            }\n",
            W, L.ncol > 0 ? L.ncol : 1, e->np);
    fprintf(o, "            for (size_t l = 0; l < len; l++) {\n");
    first = 1;
    for (int k = 0; k < e->nin; k++)
        if (L.inused[k]) {
            fprintf(o, "                tx[%d][l] = xr%d[j + l%s];\n", k, k,
                    tpk__site(mu, TPK__MUT_EW_TAIL_LOAD, first, "", " + 1"));
            first = 0;
        }
    for (int k = 0; k < L.ncol; k++)
        fprintf(o, "                tc[%d][l] = %s[j + l];\n", k, L.col[k].src);
    for (int i = 0; i < L.nw; i++)
        fprintf(o, "                tw[%d][l] = w[%d][j + l];\n", i, i);
    fprintf(o, "            }\n");
    names tn;
    memset(&tn, 0, sizeof tn);
    for (int k = 0; k < e->nin; k++)
        snprintf(tn.x[k], sizeof tn.x[k], "tx[%d]", k);
    for (int k = 0; k < L.ncol; k++)
        snprintf(tn.c[k], sizeof tn.c[k], "tc[%d]", k);
    for (int i = 0; i < L.nw; i++)
        snprintf(tn.wc[i], sizeof tn.wc[i], "tw[%d]", i);
    for (int q = 0; q < e->np; q++)
        if (e->p[q].stored)
            snprintf(tn.o[q], sizeof tn.o[q], "to[%d]", q);
    fprintf(o, "            {\n");
    body(o, &L, twin, W, V, &tn);
    fprintf(o, "            }\n");
    for (int q = 0; q < e->np; q++)
        if (e->p[q].stored)
            fprintf(o, "            for (size_t l = 0; l < %s; l++)\n                or%d[j + l] = to[%d][l];\n",
                    tpk__site(mu, TPK__MUT_EW_TAIL_STORE, 1, "len", "len - 1"), q, q);
    fprintf(o, "        }\n    }\n");
    if (npre)
        fprintf(o, "    free(buf);\n");
    fprintf(o, "    return 0;\n}\n\n");
    return ferror(o) ? TPK_ERROR(ctx, TPK_EIO, "ew: write error") : TPK_OK;
}

int tpk_tune_ew_emit(const tpk_tune_ew *e, const tpk_tune_ew_cfg *c, const char *fname, int twin, FILE *out,
                     tpk_ctx *ctx)
{
    return tpk__ew_emit(e, c, fname, twin, 1, NULL, out, ctx);
}

/* ---- CUDA ------------------------------------------------------------------------------------ */

int tpk_tune_ew_emit_cuda(const tpk_tune_ew *e0, const char *fn, FILE *o, tpk_ctx *ctx)
{
    layout L;
    lay_out(e0, 0, NULL, &L);
    const tpk_tune_ew *e = &L.e;
    char sig[TPK_TUNE_EW_SIGLEN];
    tpk_tune_ew_print(e0, sig, sizeof sig);
    fprintf(o, "/* Generated by tptune (tpk tuner, cuda_ew template) - DO NOT EDIT. */\n"
               "/* ---- %s: the fused entrywise kernel %s, one thread per entry of the lower triangle.\n"
               " * CUDA C under nvcc (%s, %s_launch); plain C otherwise: the host emulation of the same grid\n"
               " * behind %s with the C kernels' interface (tpk/tune.h), checked against libm. ---- */\n"
               "#include <math.h>\n#include <stddef.h>\n\n"
               "#ifdef __CUDACC__\n#define TPK_HD static __host__ __device__ __forceinline__\n"
               "#else\n#define TPK_HD static inline\n#endif\n"
               "enum { TPK_BX = 32, TPK_BY = 8 }; /* the block: columns, rows */\n\n", fn, sig, fn, fn, fn);
    fprintf(o, "/* The thread of block (bx, by), (tx, ty): entry (i, j), j <= i. */\n"
               "TPK_HD void tpk_ew_thread(size_t n, const double *const *in, const double *const *dg, double *const *out,\n"
               "        const double *par, const double *const *w, size_t bx, size_t by, size_t tx, size_t ty)\n{\n"
               "    const size_t j = bx * TPK_BX + tx;\n"
               "    const size_t i = by * TPK_BY + ty;\n"
               "    if (i >= n || j > i)\n        return;\n"
               "    const size_t ij = i * n + j;\n"
               "    (void)in, (void)dg, (void)par, (void)w;\n");
    for (int k = 0; k < e->nin; k++)
        if (L.inused[k])
            fprintf(o, "    const double x%d = in[%d][ij];\n", k, k);
    for (int q = 0; q < e->np; q++) {
        const tpk_tune_ew_prim *p = &e->p[q];
        char a[16];
        const int pa = L.par[q];
        if (p->op == TPK_TUNE_EW_MAP) {
            vname(&L, p->arg[0], a, sizeof a);
            const int v = p->arg[0];
            if (p->phi == TPK_TUNE_EW_IDENTITY)
                fprintf(o, "    const double p%d = par[%d] * %s + par[%d];\n", q, pa, a, pa + 1);
            else if (p->phi == TPK_TUNE_EW_RELU)
                fprintf(o, "    double p%d;\n    {\n"
                           "        const double s = sqrt(dg[%d][i] * dg[%d][j]);\n"
                           "        const double r = s > 0 ? fmin(1.0, fmax(-1.0, %s / s)) : 0.0;\n"
                           "        const double J = sqrt(fmax(0.0, 1 - r * r)) + (3.14159265358979323846 - acos(r)) * r;\n"
                           "        p%d = par[%d] * 0.15915494309189533577 * s * J + par[%d];\n    }\n",
                        q, v, v, a, q, pa, pa + 1);
            else
                fprintf(o, "    double p%d;\n    {\n        const double g = %.17g;\n"
                           "        const double z = fmin(1.0, fmax(-1.0, g * %s / sqrt((1 + g * dg[%d][i]) * (1 + g * dg[%d][j]))));\n"
                           "        p%d = par[%d] * 0.63661977236758134308 * asin(z) + par[%d];\n    }\n",
                        q, 2 * p->b * p->b, a, v, v, q, pa, pa + 1);
            continue;
        }
        fprintf(o, "    const double p%d = 0.0", q);
        for (int t = 0; t < p->nt; t++) {
            const int wi = L.wid[q][t];
            char w[64] = "";
            if (wi >= 0)
                snprintf(w, sizeof w, " * (w[%d][i] * w[%d][j])", wi, wi);
            if (p->arg[t] < 0)
                fprintf(o, "\n        + par[%d]%s", pa + t, w);
            else {
                vname(&L, p->arg[t], a, sizeof a);
                fprintf(o, "\n        + par[%d] * %s%s", pa + t, a, w);
            }
        }
        fprintf(o, ";\n");
    }
    for (int q = 0; q < e->np; q++)
        if (e->p[q].stored)
            fprintf(o, "    out[%d][ij] = p%d;\n", q, q);
    fprintf(o, "}\n\n#ifdef __CUDACC__\n#include <cuda_runtime.h>\n\n"
               "__global__ void %s(size_t n, const double *const *in, const double *const *dg, double *const *out,\n"
               "        const double *par, const double *const *w)\n{\n"
               "    tpk_ew_thread(n, in, dg, out, par, w, blockIdx.x, blockIdx.y, threadIdx.x, threadIdx.y);\n}\n\n"
               "/* The pointer arrays (in, dg, out, w) and par live in device memory. */\n"
               "extern \"C\" cudaError_t %s_launch(size_t n, const double *const *in, const double *const *dg,\n"
               "        double *const *out, const double *par, const double *const *w, cudaStream_t stream)\n{\n"
               "    if (n == 0)\n        return cudaSuccess;\n"
               "    const dim3 block(TPK_BX, TPK_BY), grid((unsigned)((n + TPK_BX - 1) / TPK_BX), (unsigned)((n + TPK_BY - 1) / TPK_BY));\n"
               "    %s<<<grid, block, 0, stream>>>(n, in, dg, out, par, w);\n"
               "    return cudaGetLastError();\n}\n"
               "#else\n"
               "/* The host emulation: every block and thread of the launch's grid in turn. */\n"
               "int %s(size_t n, const double *const *in, const double *const *dg, double *const *out,\n"
               "        const double *par, const double *const *w, int threads);\n"
               "int %s(size_t n, const double *const *in, const double *const *dg, double *const *out,\n"
               "        const double *par, const double *const *w, int threads)\n{\n"
               "    (void)threads;\n"
               "    for (size_t by = 0; by < (n + TPK_BY - 1) / TPK_BY; by++)\n"
               "        for (size_t bx = 0; bx < (n + TPK_BX - 1) / TPK_BX; bx++)\n"
               "            for (size_t ty = 0; ty < TPK_BY; ty++)\n"
               "                for (size_t tx = 0; tx < TPK_BX; tx++)\n"
               "                    tpk_ew_thread(n, in, dg, out, par, w, bx, by, tx, ty);\n"
               "    return 0;\n}\n#endif\n", fn, fn, fn, fn, fn);
    return ferror(o) ? TPK_ERROR(ctx, TPK_EIO, "ew: write error") : TPK_OK;
}
/* ---- references ------------------------------------------------------------------------------ */

#define ZP 2147483647ull
#define TWIN_TAB (65536 + 4)

static uint64_t zadd(uint64_t a, uint64_t b)
{
    return (a + b) % ZP;
}
static uint64_t zmul(uint64_t a, uint64_t b)
{
    return a * b % ZP;
}
static uint64_t zf(const uint64_t *tab, int q, uint64_t x, uint64_t a, uint64_t b)
{
    const uint64_t *c = tab + 65536;
    uint64_t r = zadd(tab[(x + 7919u * (unsigned)q) & 65535u], zmul(c[0], x));
    r = zadd(r, zmul(c[1], zadd(a, b)));
    return zadd(zadd(r, zmul(c[2], zmul(a, b))), zmul(c[3], (uint64_t)q));
}

/* Every primitive's lower triangle (or diagonal only) by the definitions, entry by entry: in
 * doubles with libm (tab NULL; a primitive's diagonal then goes to dg) or in Z_p with tab's
 * random functions (dg given). M[v]: value v's matrix (inputs given), leading dimension n. */
static void reference(const tpk_tune_ew *e, size_t n, double *const *M, double *const *dg, const double *par,
                      const double *const *w, const uint64_t *tab, int pre, int diag_only)
{
    int off = 0, wi = 0;
    for (int q = 0; q < e->np; q++) {
        const tpk_tune_ew_prim *p = &e->p[q];
        double *Y = M[e->nin + q];
        for (size_t i = 0; i < n; i++)
            for (size_t j = diag_only ? i : 0; j <= i; j++) {
                const size_t ij = i * n + j;
                double y;
                if (p->op == TPK_TUNE_EW_MAP) {
                    const double x = M[p->arg[0]][ij], qi = dg[p->arg[0]][i], qj = dg[p->arg[0]][j];
                    const double al = par[off], be = par[off + 1];
                    if (tab) { /* what the twin reads of rows i and j: q, or pre's A (+ 3R) */
                        uint64_t hi = (uint64_t)qi, hj = (uint64_t)qj;
                        if (p->phi == TPK_TUNE_EW_IDENTITY)
                            hi = hj = 0;
                        else if (pre) {
                            const int ka = 64 + 2 * q, two = p->phi == TPK_TUNE_EW_RELU;
                            hi = zf(tab, ka, (uint64_t)qi, 0, 0);
                            hj = zf(tab, ka, (uint64_t)qj, 0, 0);
                            if (two) {
                                hi = zadd(hi, zmul(3, zf(tab, ka + 1, (uint64_t)qi, 0, 0)));
                                hj = zadd(hj, zmul(3, zf(tab, ka + 1, (uint64_t)qj, 0, 0)));
                            }
                        }
                        y = (double)zadd(zmul((uint64_t)al, zf(tab, q, (uint64_t)x, hi, hj)), (uint64_t)be);
                    }
                    else if (p->phi == TPK_TUNE_EW_IDENTITY)
                        y = al * x + be;
                    else if (p->phi == TPK_TUNE_EW_RELU) {
                        const double sq = sqrt(qi * qj), r = sq > 0 ? fmin(1, fmax(-1, x / sq)) : 0;
                        y = al / (2 * M_PI) * sq * (sqrt(fmax(0, 1 - r * r)) + (M_PI - acos(r)) * r) + be;
                    } else {
                        const double g = 2 * p->b * p->b;
                        const double z = fmin(1, fmax(-1, g * x / sqrt((1 + g * qi) * (1 + g * qj))));
                        y = al * (2 / M_PI) * asin(z) + be;
                    }
                } else {
                    uint64_t zy = 0;
                    y = 0;
                    for (int t = 0, k = wi; t < p->nt; t++) {
                        const double c = par[off + t], x = p->arg[t] < 0 ? 1 : M[p->arg[t]][ij];
                        const int has_w = p->weighted[t];
                        const double ww = has_w ? w[k][i] * w[k][j] : 1;
                        if (tab) {
                            uint64_t term = p->arg[t] < 0 ? (uint64_t)c : zmul((uint64_t)c, (uint64_t)x);
                            if (has_w)
                                term = zmul(term, zmul((uint64_t)w[k][i], (uint64_t)w[k][j]));
                            zy = zadd(zy, term);
                        } else
                            y += c * x * ww;
                        k += has_w;
                    }
                    if (tab)
                        y = (double)zy;
                }
                Y[ij] = y;
            }
        if (!tab)
            for (size_t i = 0; i < n; i++)
                dg[e->nin + q][i] = Y[i * n + i];
        off += p->op == TPK_TUNE_EW_MAP ? 2 : p->nt;
        for (int t = 0; t < p->nt; t++)
            wi += p->op == TPK_TUNE_EW_SUM && p->weighted[t];
    }
}

/* ---- the checks, in a child process ---------------------------------------------------------- */

typedef int (*ew_fn)(size_t n, const double *const *in, const double *const *dg, double *const *out,
                      const double *par, const double *const *w, int threads);

#define PAD 64          /* doubles past every array: a mutant reading one entry further stays inside */
#define SENTINEL -1.0   /* neither a Z_p element nor a value the kernel computes from our inputs */

/* Arrays of one run: values' matrices (inputs, the kernel's outputs, the reference's), diagonals,
 * weights, parameters. */
typedef struct bufs {
    size_t n;
    int nv, npar, nw;
    double *M[TPK_TUNE_EW_MAXIN + TPK_TUNE_EW_MAXP], *O[TPK_TUNE_EW_MAXP], *dg[TPK_TUNE_EW_MAXIN + TPK_TUNE_EW_MAXP];
    double *w[TPK_TUNE_EW_MAXP * TPK_TUNE_EW_MAXT], *par;
} bufs;

static void bufs_free(bufs *b)
{
    for (int v = 0; v < TPK_TUNE_EW_MAXIN + TPK_TUNE_EW_MAXP; v++)
        free(b->M[v]), free(b->dg[v]);
    for (int q = 0; q < TPK_TUNE_EW_MAXP; q++)
        free(b->O[q]);
    for (int i = 0; i < TPK_TUNE_EW_MAXP * TPK_TUNE_EW_MAXT; i++)
        free(b->w[i]);
    free(b->par);
    memset(b, 0, sizeof *b);
}

static int bufs_alloc(bufs *b, const tpk_tune_ew *e, size_t n)
{
    memset(b, 0, sizeof *b);
    b->n = n;
    b->nv = e->nin + e->np;
    tpk_tune_ew_counts(e, &b->npar, &b->nw);
    int bad = !(b->par = calloc((size_t)b->npar + 1, sizeof *b->par));
    for (int v = 0; v < b->nv; v++) {
        bad |= !(b->M[v] = malloc((n * n + PAD) * sizeof(double)));
        bad |= !(b->dg[v] = malloc((n + PAD) * sizeof(double)));
    }
    for (int q = 0; q < e->np; q++)
        if (e->p[q].stored)
            bad |= !(b->O[q] = malloc((n * n + PAD) * sizeof(double)));
    for (int i = 0; i < b->nw; i++)
        bad |= !(b->w[i] = malloc((n + PAD) * sizeof(double)));
    if (bad)
        bufs_free(b);
    return bad ? -1 : 0;
}

static double unif(uint64_t *r, double lo, double hi)
{
    return lo + (hi - lo) * tpk__rng_unif(r);
}

/* Twin inputs: random elements of Z_p everywhere (upper triangles and padding too). */
static void fill_twin(bufs *b, const tpk_tune_ew *e, uint64_t *rng)
{
    const size_t n = b->n;
    for (int v = 0; v < b->nv; v++) {
        for (size_t i = 0; i < n * n + PAD; i++)
            b->M[v][i] = v < e->nin ? (double)(tpk__rng_next(rng) % ZP) : SENTINEL;
        for (size_t i = 0; i < n + PAD; i++)
            b->dg[v][i] = (double)(tpk__rng_next(rng) % ZP);
    }
    for (int i = 0; i < b->nw; i++)
        for (size_t k = 0; k < n + PAD; k++)
            b->w[i][k] = (double)(tpk__rng_next(rng) % ZP);
    for (int i = 0; i < b->npar; i++)
        b->par[i] = (double)(tpk__rng_next(rng) % ZP);
}

/* Real inputs: PSD matrices (Gram matrices of points in R^4, every 7th a zero point), positive
 * coefficients, weights and biases, so that every value is PSD and ρ stays in [−1, 1]. */
static void fill_real(bufs *b, const tpk_tune_ew *e, uint64_t *rng)
{
    const size_t n = b->n;
    double *x = malloc(4 * n * sizeof *x + 1);
    for (int v = 0; v < e->nin && x; v++) {
        for (size_t i = 0; i < 4 * n; i++)
            x[i] = (i / 4) % 7 == 3 ? 0 : unif(rng, -1.2, 1.2);
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < n; j++)
                b->M[v][i * n + j] = x[4 * i] * x[4 * j] + x[4 * i + 1] * x[4 * j + 1] + x[4 * i + 2] * x[4 * j + 2] +
                                     x[4 * i + 3] * x[4 * j + 3];
        for (size_t i = 0; i < n; i++)
            b->dg[v][i] = b->M[v][i * n + i];
    }
    free(x);
    for (int i = 0; i < b->nw; i++)
        for (size_t k = 0; k < n; k++)
            b->w[i][k] = unif(rng, 0.5, 1.5);
    for (int i = 0; i < b->npar; i++)
        b->par[i] = unif(rng, 0.2, 1.2);
}

static void clear_outputs(bufs *b, const tpk_tune_ew *e)
{
    for (int q = 0; q < e->np; q++)
        if (b->O[q])
            for (size_t i = 0; i < b->n * b->n + PAD; i++)
                b->O[q][i] = SENTINEL;
}

static int run(ew_fn f, bufs *b, int threads)
{
    return f(b->n, (const double *const *)b->M, (const double *const *)b->dg, b->O, b->par,
             (const double *const *)b->w, threads);
}

typedef struct child_arg {
    const char *so;
    const tpk_tune_ew *e;
    int lanes, pre, twin, threads, repeat;
    size_t n;
    uint64_t seed;
} child_arg;

/* The twin against the Z_p reference: "TPKEW ok ENTRIES" or "TPKEW bad WHY". */
static void child_twin(void *arg, int fd)
{
    const child_arg *a = arg;
    void *h = dlopen(a->so, RTLD_NOW | RTLD_LOCAL);
    ew_fn f = h ? (ew_fn)dlsym(h, "tpk_kernel") : NULL;
    void (*tables)(const uint64_t *) = h ? (void (*)(const uint64_t *))dlsym(h, "tpk_twin_tables") : NULL;
    uint64_t *tab = malloc(TWIN_TAB * sizeof *tab);
    if (!f || !tables || !tab) {
        dprintf(fd, "TPKEW bad load\n");
        return;
    }
    uint64_t rng = a->seed ^ 0x7ea5ull;
    for (int i = 0; i < TWIN_TAB; i++)
        tab[i] = tpk__rng_next(&rng) % ZP;
    tables(tab);
    const size_t sizes[] = {1, 2, 37, (size_t)(3 * a->lanes + 5)};
    long entries = 0;
    for (int si = 0; si < 5; si++) {
        const size_t n = sizes[si < 4 ? si : 2];
        const int threads = si == 4 ? 1 : 2;
        bufs b, r;
        if (bufs_alloc(&b, a->e, n) || bufs_alloc(&r, a->e, n)) {
            dprintf(fd, "TPKEW bad memory\n");
            return;
        }
        fill_twin(&b, a->e, &rng);
        for (int v = 0; v < b.nv; v++) {
            memcpy(r.M[v], b.M[v], (n * n + PAD) * sizeof(double));
            memcpy(r.dg[v], b.dg[v], (n + PAD) * sizeof(double));
        }
        clear_outputs(&b, a->e);
        if (run(f, &b, threads)) {
            dprintf(fd, "TPKEW bad kernel out of memory\n");
            return;
        }
        reference(a->e, n, r.M, r.dg, b.par, (const double *const *)b.w, tab, a->pre, 0);
        for (int q = 0; q < a->e->np; q++) {
            if (!b.O[q])
                continue;
            const double *O = b.O[q], *R = r.M[a->e->nin + q];
            for (size_t i = 0; i < n * n + PAD; i++) {
                const size_t row = i / n, col = i % n;
                const int lower = i < n * n && col <= row;
                if (lower ? O[i] != R[i] : O[i] != SENTINEL) {
                    dprintf(fd, "TPKEW bad n=%zu primitive %d entry (%zu, %zu)%s\n", n, q, row, col,
                            lower ? "" : " outside the lower triangle written");
                    bufs_free(&b), bufs_free(&r);
                    return;
                }
                entries += lower;
            }
        }
        /* the inputs read only */
        for (int v = 0; v < a->e->nin; v++)
            if (memcmp(b.M[v], r.M[v], (n * n + PAD) * sizeof(double))) {
                dprintf(fd, "TPKEW bad n=%zu input %d written\n", n, v);
                bufs_free(&b), bufs_free(&r);
                return;
            }
        bufs_free(&b), bufs_free(&r);
    }
    dprintf(fd, "TPKEW ok %ld\n", entries);
}

/* The kernel against the libm reference on PSD inputs: "TPKEW ok 0 MAXERR". */
static void child_real(void *arg, int fd)
{
    const child_arg *a = arg;
    void *h = dlopen(a->so, RTLD_NOW | RTLD_LOCAL);
    ew_fn f = h ? (ew_fn)dlsym(h, "tpk_kernel") : NULL;
    if (!f) {
        dprintf(fd, "TPKEW bad load\n");
        return;
    }
    uint64_t rng = a->seed ^ 0x4ea1ull;
    const size_t sizes[] = {1, 37, 203};
    double worst = 0;
    for (int si = 0; si < 3; si++) {
        const size_t n = sizes[si];
        bufs b;
        if (bufs_alloc(&b, a->e, n)) {
            dprintf(fd, "TPKEW bad memory\n");
            return;
        }
        fill_real(&b, a->e, &rng);
        reference(a->e, n, b.M, b.dg, b.par, (const double *const *)b.w, NULL, 0, 0);
        clear_outputs(&b, a->e);
        if (run(f, &b, 2)) {
            dprintf(fd, "TPKEW bad kernel out of memory\n");
            return;
        }
        for (int q = 0; q < a->e->np; q++) {
            if (!b.O[q])
                continue;
            const double *O = b.O[q], *R = b.M[a->e->nin + q];
            double scale = 0;
            for (size_t i = 0; i < n; i++)
                for (size_t j = 0; j <= i; j++)
                    scale = fmax(scale, fabs(R[i * n + j]));
            for (size_t i = 0; i < n; i++)
                for (size_t j = 0; j < n; j++) {
                    const double d = j <= i ? fabs(O[i * n + j] - R[i * n + j]) / (scale > 0 ? scale : 1)
                                            : (O[i * n + j] == SENTINEL ? 0 : INFINITY);
                    if (!(d <= worst))
                        worst = isnan(d) ? INFINITY : d;
                }
        }
        bufs_free(&b);
    }
    dprintf(fd, "TPKEW ok 0 %.3g\n", worst);
}

/* Seconds per call at n (median of repeat): "TPKEW ok 0 SECONDS". */
static void child_time(void *arg, int fd)
{
    const child_arg *a = arg;
    void *h = dlopen(a->so, RTLD_NOW | RTLD_LOCAL);
    ew_fn f = h ? (ew_fn)dlsym(h, "tpk_kernel") : NULL;
    bufs b;
    if (!f || bufs_alloc(&b, a->e, a->n)) {
        dprintf(fd, "TPKEW bad load\n");
        return;
    }
    uint64_t rng = a->seed;
    fill_real(&b, a->e, &rng);
    reference(a->e, a->n, b.M, b.dg, b.par, (const double *const *)b.w, NULL, 0, 1); /* diagonals only */
    clear_outputs(&b, a->e);
    double t0 = tpk_wall_seconds();
    if (run(f, &b, a->threads)) {
        dprintf(fd, "TPKEW bad kernel out of memory\n");
        bufs_free(&b);
        return;
    }
    const double once = tpk_wall_seconds() - t0;
    long calls = (long)ceil(0.02 / (once > 1e-9 ? once : 1e-9));
    double t[TPK_TUNE_MAX_REPEAT];
    const int rep = a->repeat < 1 ? 1 : a->repeat > TPK_TUNE_MAX_REPEAT ? TPK_TUNE_MAX_REPEAT : a->repeat;
    for (int r = 0; r < rep; r++) {
        double s = tpk_wall_seconds();
        for (long c = 0; c < calls; c++)
            (void)run(f, &b, a->threads);
        t[r] = (tpk_wall_seconds() - s) / (double)calls;
    }
    for (int i = 1; i < rep; i++) /* insertion sort: a handful */
        for (int k = i; k > 0 && t[k] < t[k - 1]; k--) {
            double x = t[k];
            t[k] = t[k - 1];
            t[k - 1] = x;
        }
    bufs_free(&b);
    dprintf(fd, "TPKEW ok 0 %.17g\n", t[rep / 2]);
}

/* Emit (twin or not, mutation mu) as tpk_kernel, compile, run `child` on it in a process of its
 * own. *ok: the child said ok (0: it said bad, crashed or hung); *val its number. */
static void (*const CHILDREN[3])(void *, int) = {child_twin, child_real, child_time};
static const char *const CHILD_NAMES[3] = {"twin", "real", "time"};

int tpk_tune_ew_child_main(int argc, char **argv)
{
    if (argc != 11 || strcmp(argv[1], "__ew") != 0)
        return 2;
    int kind = -1;
    for (int k = 0; k < 3; k++)
        kind = strcmp(argv[2], CHILD_NAMES[k]) == 0 ? k : kind;
    tpk_tune_ew e;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    if (kind < 0 || tpk_tune_ew_parse(argv[4], &e, &ctx) != TPK_OK)
        return 2;
    child_arg a = {.so = argv[3], .e = &e, .lanes = atoi(argv[5]), .pre = atoi(argv[6]),
                   .seed = strtoull(argv[7], NULL, 10), .n = strtoull(argv[8], NULL, 10), .threads = atoi(argv[9]),
                   .repeat = atoi(argv[10])};
    CHILDREN[kind](&a, 1);
    return 0;
}

/* The child of kind k on ca: exec'd as `RUNNER __ew ...` where there is a runner (a process that
 * has run OpenMP regions cannot fork a child that runs them: libgomp's pool does not survive
 * fork), else forked. 0: its output in buf. */
static int run_child(int k, const tpk_tune_ew *e, child_arg *ca, const char *runner, char *buf, size_t cap)
{
    char rbuf[4096], sig[TPK_TUNE_EW_SIGLEN], av[6][32];
    const char *run = tpk__find_runner(runner, rbuf, sizeof rbuf);
    if (run == NULL)
        return tpk__run_capture(NULL, NULL, ca->threads, 120, CHILDREN[k], ca, buf, cap);
    tpk_tune_ew_print(e, sig, sizeof sig);
    snprintf(av[0], 32, "%d", ca->lanes);
    snprintf(av[1], 32, "%d", ca->pre);
    snprintf(av[2], 32, "%llu", (unsigned long long)ca->seed);
    snprintf(av[3], 32, "%zu", ca->n);
    snprintf(av[4], 32, "%d", ca->threads);
    snprintf(av[5], 32, "%d", ca->repeat);
    char *argv[] = {(char *)run, "__ew", (char *)CHILD_NAMES[k], (char *)ca->so, sig, av[0], av[1], av[2], av[3],
                    av[4], av[5], NULL};
    return tpk__run_capture(run, argv, ca->threads, 120, NULL, NULL, buf, cap);
}

static int build_and_run(const tpk_tune_ew *e, const tpk_tune_ew_cfg *c, int twin, tpk__mutation *mu, const char *cc,
                         const char *runner, int kind, child_arg *ca, int *ok, long *count, double *val, char *why,
                         size_t wcap, tpk_ctx *ctx)
{
    char src[600], so[600];
    int st = tpk__scratch(NULL, twin == 1 ? "ewtwin" : twin == 2 ? "ewcuda" : "ew", src, so, sizeof src, ctx);
    if (st)
        return st;
    FILE *f = fopen(src, "w");
    if (!f)
        return TPK_ERROR(ctx, TPK_EIO, "ew: cannot write %s: %s", src, strerror(errno));
    st = twin == 2 ? tpk_tune_ew_emit_cuda(e, "tpk_kernel", f, ctx) : tpk__ew_emit(e, c, "tpk_kernel", twin, 1, mu, f, ctx);
    if (fclose(f) && !st)
        st = TPK_ERROR(ctx, TPK_EIO, "ew: cannot write %s", src);
    *ok = 0;
    if (!st) {
        tpk_ctx cctx;
        tpk_ctx_init(&cctx);
        if (tpk__compile_cpu(src, so, cc, "-Wno-psabi", 120, NULL, &cctx)) {
            snprintf(why, wcap, "does not compile");
        } else {
            char buf[512] = "";
            ca->so = so;
            ca->e = e;
            ca->lanes = c->lanes;
            ca->pre = c->pre;
            ca->twin = twin;
            if (run_child(kind, e, ca, runner, buf, sizeof buf) != 0)
                snprintf(why, wcap, "crashed or hung");
            else {
                char *l = strstr(buf, "TPKEW ");
                long cnt = 0;
                double v = 0;
                if (l && sscanf(l, "TPKEW ok %ld %lg", &cnt, &v) >= 1) {
                    *ok = 1;
                    if (count)
                        *count = cnt;
                    if (val)
                        *val = v;
                    snprintf(why, wcap, "ok");
                } else
                    snprintf(why, wcap, "%.200s", l ? l + 6 : "no answer");
                char *nl = strchr(why, '\n');
                if (nl)
                    *nl = '\0';
            }
        }
        unlink(so);
    }
    unlink(src);
    return st;
}

/* A wrong entry of the twin is a different expression in the random table and coefficients: it
 * matches the right one with probability at most 4/p (degree ≤ 3 in the coefficients, Schwartz–
 * Zippel, or one table collision), independently of the other entries it spoils. */
#define EW_MISS_BOUND (4.0 / 2147483647.0)
#define EW_REAL_TOL 1e-12

int tpk_tune_ew_verify(const tpk_tune_ew *e, const tpk_tune_ew_cfg *c, const char *cc, const char *runner, int mutants,
                       uint64_t seed, FILE *log, tpk_tune_ew_report *r, tpk_ctx *ctx)
{
    memset(r, 0, sizeof *r);
    r->miss_bound = EW_MISS_BOUND;
    char why[256];
    child_arg ca = {.threads = 2, .seed = seed};
    int ok;
    long cnt = 0;
    double err = 0;
    int st = build_and_run(e, c, 1, NULL, cc, runner, 0, &ca, &ok, &cnt, NULL, why, sizeof why, ctx);
    if (st)
        return st;
    r->exact_ok = ok;
    r->entries = cnt;
    if (log && !ok)
        fprintf(log, "  twin: %s\n", why);
    /* the C kernel, then the CUDA kernel's host emulation (its per-thread code over the launch's
     * grid), against libm */
    for (int flav = 0; flav <= 2; flav += 2) {
        err = 0;
        st = build_and_run(e, c, flav, NULL, cc, runner, 1, &ca, &ok, NULL, &err, why, sizeof why, ctx);
        if (st)
            return st;
        *(flav ? &r->cuda_max_rel_err : &r->max_rel_err) = ok ? err : INFINITY;
        *(flav ? &r->cuda_ok : &r->real_ok) = ok && err <= EW_REAL_TOL;
        if (log && !ok)
            fprintf(log, "  %s: %s\n", flav ? "CUDA host emulation" : "kernel", why);
    }
    if (mutants <= 0)
        return TPK_OK;
    /* the sites, per kind, as the emitter passes them; then round robin over kinds in a seeded
     * order of sites, so that a few mutants already span every kind */
    FILE *null = fopen("/dev/null", "w");
    if (!null)
        return TPK_ERROR(ctx, TPK_EIO, "ew: cannot open /dev/null");
    tpk__mutation all = {.kind = -1};
    st = tpk__ew_emit(e, c, "tpk_kernel", 1, 1, &all, null, ctx);
    fclose(null);
    if (st)
        return st;
    int order[TPK__MUT_KINDS][64], nord[TPK__MUT_KINDS];
    uint64_t rng = seed ^ 0x3c6ef372fe94f82bull;
    for (int k = 0; k < TPK__MUT_KINDS; k++) {
        nord[k] = all.count[k] < 64 ? all.count[k] : 64;
        for (int i = 0; i < nord[k]; i++)
            order[k][i] = i;
        for (int i = nord[k] - 1; i > 0; i--) {
            int j = (int)(tpk__rng_next(&rng) % (uint64_t)(i + 1)), t = order[k][i];
            order[k][i] = order[k][j];
            order[k][j] = t;
        }
    }
    for (int round = 0; r->mutants < mutants; round++) {
        int any = 0;
        for (int k = 0; k < TPK__MUT_KINDS && r->mutants < mutants; k++) {
            if (round >= nord[k])
                continue;
            any = 1;
            tpk__mutation mu = {.kind = k, .site = order[k][round]};
            st = build_and_run(e, c, 1, &mu, cc, runner, 0, &ca, &ok, NULL, NULL, why, sizeof why, ctx);
            if (st)
                return st;
            r->mutants++;
            r->caught += !ok;
            if (log)
                fprintf(log, "  mutant %s:%d: %s\n", tpk__mut_name(k), mu.site, ok ? "MISSED" : why);
        }
        if (!any)
            break;
    }
    return TPK_OK;
}

int tpk_tune_ew_measure(const tpk_tune_ew *e, const tpk_tune_ew_cfg *c, size_t n, int threads, int repeat,
                        const char *cc, const char *runner, double *seconds, tpk_ctx *ctx)
{
    if (n == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "ew: n must be positive");
    char why[256];
    child_arg ca = {.threads = threads, .n = n, .repeat = repeat, .seed = 0x5eedull};
    int ok;
    int st = build_and_run(e, c, 0, NULL, cc, runner, 2, &ca, &ok, NULL, seconds, why, sizeof why, ctx);
    if (!st && !ok)
        st = TPK_ERROR(ctx, TPK_EIO, "ew: measuring failed: %s", why);
    return st;
}

/* ---- the cache ------------------------------------------------------------------------------- */

static int same_key(const tpk_tune_ew_rec *a, const tpk_tune_ew_rec *b)
{
    return !strcmp(a->target_class, b->target_class) && !strcmp(a->sig, b->sig) && a->n == b->n &&
           a->threads == b->threads;
}

int tpk_tune_ew_cache_load(const char *path, tpk_tune_ew_rec **recs, size_t *nrec, tpk_ctx *ctx)
{
    *recs = NULL;
    *nrec = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return errno == ENOENT ? TPK_OK : TPK_ERROR(ctx, TPK_EIO, "%s: cannot open: %s", path, strerror(errno));
    char line[4096];
    int lineno = 0, st = TPK_OK;
    size_t cap = 0;
    while (!st && fgets(line, sizeof line, f)) {
        lineno++;
        if (line[0] == '\n' || line[0] == '#')
            continue;
        json_error_t je;
        json_t *j = json_loads(line, 0, &je);
        const char *cls = NULL, *sig = NULL;
        json_int_t n = 0, th = 0, lanes = 0, chunk = 0, pre = 0, ver = 0;
        double sec = 0, ts = 0;
        if (!j || json_unpack(j, "{s:s, s:s, s:I, s:I, s:{s:I, s:I, s:I}, s:F, s:b, s?F}", "target", &cls, "sig", &sig,
                              "n", &n, "threads", &th, "knobs", "lanes", &lanes, "chunk", &chunk, "pre", &pre, "seconds",
                              &sec, "verified", &ver, "ts", &ts) != 0) {
            st = TPK_ERROR(ctx, TPK_EFORMAT, "%s:%d: not an ew cache record", path, lineno);
        } else if (*nrec == cap) {
            tpk_tune_ew_rec *g = realloc(*recs, (cap = cap ? 2 * cap : 64) * sizeof *g);
            if (!g)
                st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
            else
                *recs = g;
        }
        if (!st) {
            tpk_tune_ew_rec *r = &(*recs)[(*nrec)++];
            memset(r, 0, sizeof *r);
            snprintf(r->target_class, sizeof r->target_class, "%s", cls);
            snprintf(r->sig, sizeof r->sig, "%s", sig);
            r->n = (size_t)n;
            r->threads = (int)th;
            r->cfg = (tpk_tune_ew_cfg){(int)lanes, (int)chunk, (int)pre};
            r->seconds = sec;
            r->verified = (int)ver;
            r->ts = ts;
        }
        json_decref(j);
    }
    fclose(f);
    if (st) {
        free(*recs);
        *recs = NULL;
        *nrec = 0;
    }
    return st;
}

const tpk_tune_ew_rec *tpk_tune_ew_cache_best(const tpk_tune_ew_rec *recs, size_t nrec, const tpk_tune_ew_rec *key,
                                              const tpk_tune_ew_cfg *c)
{
    const tpk_tune_ew_rec *best = NULL;
    for (size_t i = 0; i < nrec; i++) {
        const tpk_tune_ew_rec *r = &recs[i];
        if (same_key(r, key) && r->verified &&
            (!c || (c->lanes == r->cfg.lanes && c->chunk == r->cfg.chunk && c->pre == r->cfg.pre)) &&
            (!best || r->seconds < best->seconds))
            best = r;
    }
    return best;
}

int tpk_tune_ew_cache_find(const char *path, const tpk_tune_ew_rec *key, const tpk_tune_ew_cfg *c,
                           tpk_tune_ew_rec *out, int *found, tpk_ctx *ctx)
{
    tpk_tune_ew_rec *recs;
    size_t n;
    int st = tpk_tune_ew_cache_load(path, &recs, &n, ctx);
    const tpk_tune_ew_rec *b = st ? NULL : tpk_tune_ew_cache_best(recs, n, key, c);
    *found = b != NULL;
    if (b)
        *out = *b;
    free(recs);
    return st;
}

void tpk_tune_ew_cache_path(const char *opt, char *out, size_t cap)
{
    if (opt != NULL) { /* a file, or "none" */
        snprintf(out, cap, "%s", strcmp(opt, "none") != 0 ? opt : "");
        return;
    }
    const char *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    char base[3900] = "";
    if (x != NULL && *x)
        snprintf(base, sizeof base, "%s", x);
    else if (h != NULL && *h)
        snprintf(base, sizeof base, "%s/.cache", h);
    if (!base[0]) {
        snprintf(out, cap, "%s", "");
        return;
    }
    mkdir(base, 0755); /* an existing folder is fine; a failure shows when the cache is written */
    snprintf(out, cap, "%s/tpk", base);
    mkdir(out, 0755);
    snprintf(out, cap, "%s/tpk/ew.jsonl", base);
}

int tpk_tune_ew_cache_add(const char *path, const tpk_tune_ew_rec *r, tpk_ctx *ctx)
{
    json_t *j = json_pack("{s:s, s:s, s:s, s:I, s:I, s:{s:i, s:i, s:i}, s:f, s:b, s:f}", "target", r->target_class,
                          "template", "cpu_ew", "sig", r->sig, "n", (json_int_t)r->n, "threads", (json_int_t)r->threads,
                          "knobs", "lanes", r->cfg.lanes, "chunk", r->cfg.chunk, "pre", r->cfg.pre, "seconds", r->seconds,
                          "verified", r->verified, "ts", r->ts);
    char *text = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    if (!text)
        return TPK_ERROR(ctx, TPK_ENOMEM, "ew: out of memory");
    FILE *f = fopen(path, "a");
    int st = TPK_OK;
    if (!f || fprintf(f, "%s\n", text) < 0)
        st = TPK_ERROR(ctx, TPK_EIO, "%s: cannot append: %s", path, strerror(errno));
    if (f && fclose(f) && !st)
        st = TPK_ERROR(ctx, TPK_EIO, "%s: cannot append", path);
    free(text);
    return st;
}
