/* The tangent program of the NTK (theory.md §8): the program's instructions, each Nonlin
 * followed by its partial derivatives ∂φ/∂g_i as Nonlins of their own, so that the limit
 * evaluator computes E[∂_iφ(Z) ∂_jφ̄(Z̄)] as it computes any E[Z^u Z^v], and the NTK pass of the
 * member-level evaluator (limit.c) propagates the tangent kernel
 *   T(h, h̄) = Σ_ij E[∂_iφ ∂_jφ̄] · T(g_i, ḡ_j)
 * through the Nonlins. Moments (scalars) are constants of the derivative: in the limit their
 * tangents do not contribute (Tensor Programs II, App. E.5: LayerNorm's backward pass reduces
 * to dx/std(x), 1/n attention keeps only its value path).
 * The derivative of a body is taken symbolically on its RPN, with constants folded so that a
 * linear body gives a constant partial. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tangent-impl.h"
#include "tpk/alloc.h"

/* A derivative under construction: a constant, or an RPN sequence. */
typedef struct dx {
    int isc;
    double c;
    tpk_rpn_node *n;
    int len;
} dx;

typedef struct tb {
    const tpk_rpn_node *node; /* the body */
    int *start;               /* per node: first node of its subtree (RPN spans) */
    nsr_tangent *t;
    tpk_ctx *ctx;
    int st;
    int leaf; /* the kind of variable differentiated by: TPK_RPN_GVAR or TPK_RPN_SCALAR */
    int line, col; /* the instruction's source position, for messages */
} tb;

static dx dconst(double c)
{
    return (dx){1, c, NULL, 0};
}

static void dfree(tb *B, dx *a)
{
    tpk_free(B->ctx, a->n);
    a->n = NULL;
    a->len = 0;
}

/* concatenation of up to four pieces: RPN spans of the body or derivatives */
static dx cat(tb *B, const tpk_rpn_node *const *p, const int *len, int k)
{
    dx r = {0, 0, NULL, 0};
    int n = 0;
    for (int i = 0; i < k; i++)
        n += len[i];
    r.n = tpk_malloc(B->ctx, (size_t)(n ? n : 1) * sizeof *r.n);
    if (r.n == NULL) {
        B->st = TPK_ENOMEM;
        return dconst(0);
    }
    for (int i = 0, at = 0; i < k; i++) {
        memcpy(r.n + at, p[i], (size_t)len[i] * sizeof *r.n);
        at += len[i];
    }
    r.len = n;
    return r;
}

static tpk_rpn_node op_node(int op, double value)
{
    tpk_rpn_node o;
    memset(&o, 0, sizeof o);
    o.op = op;
    o.value = value;
    return o;
}

/* the value of a derivative as an RPN piece (a constant becomes one node) */
static void piece(const dx *a, tpk_rpn_node *tmp, const tpk_rpn_node **p, int *len)
{
    if (a->isc) {
        *tmp = op_node(TPK_RPN_CONST, a->c);
        *p = tmp;
        *len = 1;
    } else {
        *p = a->n;
        *len = a->len;
    }
}

/* a ∘ b for ∘ in {+, −, ×, ÷}, folding constants (both consumed) */
static dx combine(tb *B, int op, dx a, dx b)
{
    if (a.isc && b.isc) {
        double v = op == TPK_RPN_ADD ? a.c + b.c : op == TPK_RPN_SUB ? a.c - b.c
                   : op == TPK_RPN_MUL ? a.c * b.c : a.c / b.c;
        return dconst(v);
    }
    if (op == TPK_RPN_MUL && ((a.isc && a.c == 0) || (b.isc && b.c == 0))) {
        dfree(B, &a);
        dfree(B, &b);
        return dconst(0);
    }
    if ((op == TPK_RPN_ADD && a.isc && a.c == 0) || (op == TPK_RPN_MUL && a.isc && a.c == 1))
        return b;
    if (((op == TPK_RPN_ADD || op == TPK_RPN_SUB) && b.isc && b.c == 0) ||
        ((op == TPK_RPN_MUL || op == TPK_RPN_DIV) && b.isc && b.c == 1))
        return a;
    tpk_rpn_node ta, tb_, o = op_node(op, 0);
    const tpk_rpn_node *p[3];
    int len[3];
    piece(&a, &ta, &p[0], &len[0]);
    piece(&b, &tb_, &p[1], &len[1]);
    p[2] = &o;
    len[2] = 1;
    dx r = cat(B, p, len, 3);
    dfree(B, &a);
    dfree(B, &b);
    return r;
}

/* a copy of the body's subtree ending at node i */
static dx span(tb *B, int i)
{
    const tpk_rpn_node *p = B->node + B->start[i];
    int len = i - B->start[i] + 1;
    if (len == 1 && p->op == TPK_RPN_CONST)
        return dconst(p->value);
    return cat(B, &p, &len, 1);
}

static const tpk_phi *derivative_of(tb *B, const tpk_phi *fn)
{
    nsr_tangent *t = B->t;
    for (int i = 0; i < t->nphis; i++)
        if (t->of[i] == fn)
            return t->phis[i];
    tpk_phi **np = tpk_realloc(B->ctx, t->phis, (size_t)(t->nphis + 1) * sizeof *np);
    const tpk_phi **no = np ? tpk_realloc(B->ctx, t->of, (size_t)(t->nphis + 1) * sizeof *no) : NULL;
    if (np)
        t->phis = np;
    if (no)
        t->of = no;
    if (np == NULL || no == NULL) {
        B->st = TPK_ERROR(B->ctx, TPK_ENOMEM, "out of memory");
        return NULL;
    }
    tpk_phi *d = tpk_phi_derivative(fn, B->ctx);
    if (d == NULL) { /* Tensor Programs II needs φ′ as a function (a weak derivative) */
        char why[TPK_MSG_MAX];
        snprintf(why, sizeof why, "%s", B->ctx->msg);
        int code = B->ctx->status ? B->ctx->status : TPK_EINVAL;
        tpk_ctx_clear(B->ctx); /* the first error wins: this one says where */
        B->st = TPK_ERROR(B->ctx, code,
                          "%s:%d:%d: the NTK differentiates every nonlinearity: %s", t->path,
                          B->line, B->col, why);
        return NULL;
    }
    t->phis[t->nphis] = d;
    t->of[t->nphis++] = fn;
    return d;
}

/* ∂(subtree ending at node i)/∂g */
static dx deriv(tb *B, int i, int g)
{
    const tpk_rpn_node *nd = &B->node[i];
    if (B->st)
        return dconst(0);
    switch (nd->op) {
    case TPK_RPN_CONST:
        return dconst(0);
    case TPK_RPN_GVAR:
    case TPK_RPN_SCALAR:
        return dconst(nd->op == B->leaf && nd->var == g ? 1 : 0);
    case TPK_RPN_NEG:
        return combine(B, TPK_RPN_SUB, dconst(0), deriv(B, i - 1, g));
    case TPK_RPN_ADD:
    case TPK_RPN_SUB: {
        int b = i - 1, a = B->start[b] - 1;
        dx da = deriv(B, a, g), db = deriv(B, b, g);
        return combine(B, nd->op, da, db);
    }
    case TPK_RPN_MUL: { /* a′b + ab′ */
        int b = i - 1, a = B->start[b] - 1;
        dx da = deriv(B, a, g), db = deriv(B, b, g);
        dx l = da.isc && da.c == 0 ? da : combine(B, TPK_RPN_MUL, da, span(B, b));
        dx r = db.isc && db.c == 0 ? db : combine(B, TPK_RPN_MUL, span(B, a), db);
        return combine(B, TPK_RPN_ADD, l, r);
    }
    case TPK_RPN_DIV: { /* a′/b − a b′/b² */
        int b = i - 1, a = B->start[b] - 1;
        dx da = deriv(B, a, g), db = deriv(B, b, g);
        dx l = da.isc && da.c == 0 ? da : combine(B, TPK_RPN_DIV, da, span(B, b));
        if (db.isc && db.c == 0)
            return l;
        tpk_rpn_node sq = op_node(TPK_RPN_POWI, 2);
        dx b2 = span(B, b);
        if (!b2.isc) {
            const tpk_rpn_node *p[2] = {b2.n, &sq};
            int len[2] = {b2.len, 1};
            dx t = cat(B, p, len, 2);
            dfree(B, &b2);
            b2 = t;
        } else {
            b2.c *= b2.c;
        }
        dx r = combine(B, TPK_RPN_DIV, combine(B, TPK_RPN_MUL, span(B, a), db), b2);
        return combine(B, TPK_RPN_SUB, l, r);
    }
    case TPK_RPN_POWI: { /* k a^(k−1) a′ */
        dx da = deriv(B, i - 1, g);
        double k = nd->value;
        if ((da.isc && da.c == 0) || k == 0) {
            dfree(B, &da);
            return dconst(0);
        }
        dx pw = span(B, i - 1);
        if (k - 1 != 1 && !pw.isc) {
            tpk_rpn_node o = op_node(TPK_RPN_POWI, k - 1);
            const tpk_rpn_node *p[2] = {pw.n, &o};
            int len[2] = {pw.len, 1};
            dx t = cat(B, p, len, 2);
            dfree(B, &pw);
            pw = t;
        } else if (pw.isc) {
            pw.c = pow(pw.c, k - 1);
        }
        if (k - 1 == 0) {
            dfree(B, &pw);
            pw = dconst(1);
        }
        return combine(B, TPK_RPN_MUL, combine(B, TPK_RPN_MUL, dconst(k), pw), da);
    }
    case TPK_RPN_CALL: { /* φ′(a) a′ */
        dx da = deriv(B, i - 1, g);
        if (da.isc && da.c == 0)
            return da;
        const tpk_phi *d = derivative_of(B, nd->fn);
        if (d == NULL) {
            dfree(B, &da);
            return dconst(0);
        }
        dx a = span(B, i - 1);
        tpk_rpn_node o = op_node(TPK_RPN_CALL, 0), ta;
        o.fn = d;
        const tpk_rpn_node *p[2];
        int len[2];
        piece(&a, &ta, &p[0], &len[0]);
        p[1] = &o;
        len[1] = 1;
        dx fa = cat(B, p, len, 2);
        dfree(B, &a);
        return combine(B, TPK_RPN_MUL, fa, da);
    }
    default:
        B->st = TPK_ERROR(B->ctx, TPK_EINVAL, "tangent program: unknown RPN operation %d", nd->op);
        return dconst(0);
    }
}

/* subtree starts of an RPN body: a leaf is its own span; an operation's span starts where its
 * first operand's does */
static int spans(const tpk_rpn *b, int *start, tpk_ctx *ctx)
{
    int *stack = tpk_malloc(ctx, (size_t)b->len * sizeof *stack), sp = 0;
    if (stack == NULL)
        return -1;
    for (int i = 0; i < b->len; i++) {
        int op = b->node[i].op;
        int arity = op == TPK_RPN_CONST || op == TPK_RPN_GVAR || op == TPK_RPN_SCALAR ? 0
                    : op == TPK_RPN_NEG || op == TPK_RPN_POWI || op == TPK_RPN_CALL ? 1 : 2;
        if (sp < arity) {
            tpk_free(ctx, stack);
            return -1;
        }
        sp -= arity;
        start[i] = arity == 0 ? i : start[stack[sp]];
        stack[sp++] = i;
    }
    tpk_free(ctx, stack);
    return sp == 1 ? 0 : -1;
}

static char *name2(const char *a, const char *b, tpk_ctx *ctx)
{
    size_t n = strlen(a) + strlen(b) + 8;
    char *s = tpk_malloc(ctx, n);
    if (s)
        snprintf(s, n, "d%s/d%s", a, b);
    return s;
}

void nsr_tangent_free(nsr_tangent *t, tpk_ctx *ctx)
{
    if (t == NULL)
        return;
    if (t->q && t->part)
        for (int v = 0; v < t->q->nvars && v < t->cap; v++) {
            tpk_free(ctx, t->part[v].d);
            tpk_free(ctx, t->part[v].g);
            tpk_free(ctx, t->part[v].s);
            tpk_free(ctx, t->part[v].ds);
        }
    tpk_free(ctx, t->part);
    tpk_free(ctx, t->kid);
    tpk_nsr_prog_free(t->q);
    for (int i = 0; i < t->nphis; i++)
        tpk_phi_free(t->phis[i]);
    tpk_free(ctx, t->phis);
    tpk_free(ctx, t->of);
    memset(t, 0, sizeof *t);
}

static int grow_parts(nsr_tangent *t, int nv, tpk_ctx *ctx)
{
    if (nv <= t->cap)
        return TPK_OK;
    int c = t->cap ? t->cap : 64;
    while (c < nv)
        c *= 2;
    nsr_partials *np = tpk_realloc(ctx, t->part, (size_t)c * sizeof *np);
    if (np == NULL)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    memset(np + t->cap, 0, (size_t)(c - t->cap) * sizeof *np);
    t->part = np;
    t->cap = c;
    return TPK_OK;
}

/* The partials of q's Nonlin instruction defining var v (q ids): one Nonlin per G-var read. */
static int add_partials(nsr_tangent *t, int v, tpk_ctx *ctx)
{
    const tpk_instr *in = &t->q->instr[t->q->var[v].def];
    int na = in->body.nargs, len = in->body.len;
    const int bnorm = in->bnorm, batch = in->batch; /* `in` moves when partials are added */
    const double bn_eps = in->bn_eps;
    int *start = tpk_malloc(ctx, (size_t)len * sizeof *start);
    int *args = tpk_malloc(ctx, (size_t)(na ? na : 1) * sizeof *args);
    int *d = tpk_malloc(ctx, (size_t)(na ? na : 1) * sizeof *d);
    int *sargs = tpk_malloc(ctx, (size_t)len * sizeof *sargs), ns = 0;
    int *ds = tpk_malloc(ctx, (size_t)len * sizeof *ds);
    /* copy the body: adding instructions may move q->instr */
    tpk_rpn_node *body = tpk_malloc(ctx, (size_t)len * sizeof *body);
    int st = TPK_OK;
    if (!start || !args || !d || !sargs || !ds || !body) {
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        goto done;
    }
    memcpy(body, in->body.node, (size_t)len * sizeof *body);
    memcpy(args, in->body.args, (size_t)na * sizeof *args);
    if (spans(&in->body, start, ctx)) {
        st = TPK_ERROR(ctx, TPK_EINVAL, "tangent program: malformed body of %s", t->q->var[v].name);
        goto done;
    }
    /* the scalars the body reads (Moments): the finite-width NTK's backward pass needs their
     * partials, the limit does not (they are constants of its tangent, App. E.5) */
    for (int i = 0; i < len; i++)
        if (body[i].op == TPK_RPN_SCALAR) {
            int j = 0;
            while (j < ns && sargs[j] != body[i].var)
                j++;
            if (j == ns)
                sargs[ns++] = body[i].var;
        }
    tb B = {body, start, t, ctx, TPK_OK, TPK_RPN_GVAR, in->line, in->col};
    for (int i = 0; i < na + ns && st == TPK_OK; i++) {
        int x = i < na ? args[i] : sargs[i - na];
        B.leaf = i < na ? TPK_RPN_GVAR : TPK_RPN_SCALAR;
        dx r = deriv(&B, len - 1, x);
        if ((st = B.st)) {
            dfree(&B, &r);
            break;
        }
        tpk_rpn_node c = op_node(TPK_RPN_CONST, r.c);
        char *nm = name2(t->q->var[v].name, t->q->var[x].name, ctx);
        int w = nm ? tpk_nsr_nonlin(t->q, nm, r.isc ? &c : r.n, r.isc ? 1 : r.len) : -1;
        const int isc = r.isc;
        tpk_free(ctx, nm);
        dfree(&B, &r);
        if (w < 0 || grow_parts(t, t->q->nvars, ctx)) {
            st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
            break;
        }
        if (bnorm && !isc) { /* a constant partial reads nothing to normalise */
            t->q->instr[t->q->var[w].def].bnorm = bnorm;
            t->q->instr[t->q->var[w].def].batch = batch;
            t->q->instr[t->q->var[w].def].bn_eps = bn_eps;
        }
        if (i < na)
            d[i] = w;
        else
            ds[i - na] = w;
    }
    if (st == TPK_OK) {
        t->part[v].n = na;
        t->part[v].g = args;
        t->part[v].d = d;
        t->part[v].ns = ns;
        t->part[v].s = sargs;
        t->part[v].ds = ds;
        args = d = sargs = ds = NULL;
    }
done:
    tpk_free(ctx, start);
    tpk_free(ctx, args);
    tpk_free(ctx, d);
    tpk_free(ctx, sargs);
    tpk_free(ctx, ds);
    tpk_free(ctx, body);
    return st;
}

int nsr_tangent_build(const tpk_program *p, nsr_tangent *t, tpk_ctx *ctx)
{
    memset(t, 0, sizeof *t);
    t->path = p->path ? p->path : "program";
    int *map = tpk_malloc(ctx, ((size_t)p->nvars + 1) * sizeof *map);
    t->q = tpk_nsr_prog_new(p->nslots);
    int st = map && t->q ? grow_parts(t, p->nvars + 1, ctx) : TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    t->nkid = p->ninstr;
    /* at most p's instructions, their partials (one per G-var a body reads) and the constant 1 */
    size_t nk = (size_t)p->ninstr + 1; /* + a partial per leaf of every body, at most */
    for (int k = 0; k < p->ninstr; k++)
        nk += p->instr[k].op == TPK_OP_NONLIN || p->instr[k].op == TPK_OP_MOMENT
                  ? (size_t)p->instr[k].body.len : 0;
    if (st == TPK_OK && (t->kid = tpk_malloc(ctx, nk * sizeof *t->kid)) == NULL)
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    if (st == TPK_OK) {
        tpk_rpn_node one = op_node(TPK_RPN_CONST, 1.0);
        t->one = tpk_nsr_nonlin(t->q, "1", &one, 1);
        if (t->one < 0 || grow_parts(t, t->q->nvars, ctx))
            st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        else
            t->kid[0] = -1;
    }
    for (int a = 0; a < p->navars && st == TPK_OK; a++)
        if (tpk_nsr_add_avar(t->q, p->avar[a].name, p->avar[a].var) < 0)
            st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    for (int a = 0; a < p->nembeds && st == TPK_OK; a++)
        if (tpk_nsr_add_embed(t->q, p->embed[a].name, p->embed[a].var) < 0)
            st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    for (int k = 0; k < p->ninstr && st == TPK_OK; k++) {
        const tpk_instr *in = &p->instr[k];
        const char *nm = p->var[in->out].name;
        int w = -1;
        switch (in->op) {
        case TPK_OP_EMBED:
            w = tpk_nsr_embed(t->q, nm, in->avar, in->src);
            break;
        case TPK_OP_BIAS:
            w = tpk_nsr_bias(t->q, nm, in->mean, in->var);
            break;
        case TPK_OP_MATMUL:
            w = tpk_nsr_matmul(t->q, nm, in->avar, map[in->src]);
            break;
        case TPK_OP_LINCOMB: {
            int *term = tpk_malloc(ctx, (size_t)in->nterms * sizeof *term);
            if (term == NULL)
                break;
            for (int i = 0; i < in->nterms; i++)
                term[i] = map[in->term[i]];
            w = tpk_nsr_lincomb(t->q, nm, in->nterms, term, in->coef);
            tpk_free(ctx, term);
            break;
        }
        case TPK_OP_NONLIN:
        case TPK_OP_MOMENT: {
            tpk_rpn_node *body = tpk_malloc(ctx, (size_t)in->body.len * sizeof *body);
            if (body == NULL)
                break;
            memcpy(body, in->body.node, (size_t)in->body.len * sizeof *body);
            for (int i = 0; i < in->body.len; i++)
                if (body[i].op == TPK_RPN_GVAR || body[i].op == TPK_RPN_SCALAR)
                    body[i].var = map[body[i].var];
            w = in->op == TPK_OP_NONLIN ? tpk_nsr_nonlin(t->q, nm, body, in->body.len)
                                        : tpk_nsr_moment(t->q, nm, body, in->body.len);
            tpk_free(ctx, body);
            break;
        }
        default:
            break;
        }
        if (w < 0) {
            st = TPK_ERROR(ctx, TPK_ENOMEM, "tangent program: could not copy instruction %d", k);
            break;
        }
        map[in->out] = w;
        t->q->instr[t->q->ninstr - 1].line = in->line;
        t->q->instr[t->q->ninstr - 1].col = in->col;
        /* φ(bn(g)) stays batch-coupled; so do its partials below, φ′ at the normalised g */
        t->q->instr[t->q->ninstr - 1].bnorm = in->op == TPK_OP_NONLIN ? in->bnorm : 0;
        t->q->instr[t->q->ninstr - 1].batch = in->op == TPK_OP_NONLIN ? in->batch : 0;
        t->q->instr[t->q->ninstr - 1].bn_eps = in->op == TPK_OP_NONLIN ? in->bn_eps : 0.0;
        t->kid[t->q->ninstr - 1] = k;
        if ((st = grow_parts(t, t->q->nvars, ctx)))
            break;
        if (in->op == TPK_OP_NONLIN || in->op == TPK_OP_MOMENT) {
            int k0 = t->q->ninstr;
            st = add_partials(t, w, ctx);
            for (int j = k0; j < t->q->ninstr; j++)
                t->kid[j] = -1;
        }
    }
    for (int o = 0; o < p->noutputs && st == TPK_OK; o++) {
        const tpk_output *po = &p->output[o];
        int y = tpk_nsr_output(t->q, po->name, map[po->src], po->var);
        if (y < 0) {
            st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
            break;
        }
        tpk_output *qo = &t->q->output[y];
        qo->bias_var = po->bias_var;
        if (po->readout && (qo->readout = tpk_strdup(NULL, po->readout)) == NULL)
            st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        if (st == TPK_OK && po->nparts > 1) {
            if ((qo->part = tpk_malloc(NULL, (size_t)po->nparts * sizeof *qo->part)) == NULL) {
                st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
                break;
            }
            qo->nparts = po->nparts;
            for (int k = 0; k < po->nparts; k++)
                qo->part[k] = map[po->part[k]];
        }
    }
    if (st == TPK_OK && p->path && (t->q->path = tpk_strdup(NULL, p->path)) == NULL)
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    if (st == TPK_OK) {
        t->q->features = p->features;
        for (int v = 0; v < t->q->nvars; v++)
            t->q->var[v].width = 0;
    }
    tpk_free(ctx, map);
    if (st)
        nsr_tangent_free(t, ctx);
    return st;
}
