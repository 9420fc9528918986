/* The family IR (ir-impl.h): lowering of a rolled program's statements, and its types. Every
 * classification of an expression — which call is a MatMul, a Nonlin, a Moment, index
 * arithmetic; which product multiplies two vectors — is made here, once, so that the back ends
 * dispatch on instruction kinds and never on the shape of the syntax. */
#include "ir-impl.h"
#include "tpk/alloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *nsr_ir_op_name(int op)
{
    static const char *const names[] = {
#define NSR_IR_NAME(name, text) text,
        NSR_IR_OPS(NSR_IR_NAME)
#undef NSR_IR_NAME
    };
    return op >= 0 && op < NSR_IR_NOPS ? names[op] : "?";
}

const char *nsr_ir_type_name(int type)
{
    static const char *const names[] = {"-", "zero", "num", "scalar", "G", "H", "mixed"};
    return type >= 0 && type <= NSR_TY_MIXED ? names[type] : "?";
}

const char *nsr_ir_unsup_text(const nsr_irn *n, char *buf, size_t cap)
{
    /* a call no back end knows is named; a form with a reason of its own says the reason */
    if (n->e != NULL && n->e->kind == NSR_E_CALL && n->e->name != NULL &&
        (n->why == NULL || strcmp(n->why, "this call") == 0))
        snprintf(buf, cap, "'%s(...)'", n->e->name);
    else
        snprintf(buf, cap, "%s", n->why ? n->why : "this expression");
    return buf;
}

int nsr_ir_type_join(int a, int b)
{
    if (a == NSR_TY_NONE || a == NSR_TY_ZERO)
        return b == NSR_TY_NONE ? a : b;
    if (b == NSR_TY_NONE || b == NSR_TY_ZERO || a == b)
        return a;
    if (a == NSR_TY_MIXED || b == NSR_TY_MIXED)
        return NSR_TY_MIXED;
    if (nsr_ir_is_vector(a) != nsr_ir_is_vector(b))
        return NSR_TY_MIXED;
    return nsr_ir_is_vector(a) ? NSR_TY_H : NSR_TY_SCALAR; /* G ∨ H, NUM ∨ SCALAR */
}

static int is_scalarish(int t)
{
    return t == NSR_TY_NUM || t == NSR_TY_SCALAR || t == NSR_TY_ZERO;
}

void nsr_ir_type_node(const nsr_ir *ir, nsr_irn *n, const int *famtype, const nsr_check *C)
{
    /* x^k: the exponent is index arithmetic, read by the back end; the type needs it only to
     * tell x^1 (x itself) from a Nonlin */
    double pow_k = n->op == NSR_IR_POW && n->e->b->kind == NSR_E_NUM ? n->e->b->num : 2;
    int t0 = n->narg > 0 ? ir->n[n->arg[0]].type : NSR_TY_NONE;
    int t1 = n->narg > 1 ? ir->n[n->arg[1]].type : NSR_TY_NONE;
    n->gates = 0;
    switch (n->op) {
    case NSR_IR_NUM:
    case NSR_IR_SQRTN:
        n->type = NSR_TY_NUM;
        break;
    case NSR_IR_READ:
        n->type = n->sym >= 0 && C->sym[n->sym].kind == NSR_SYM_GFAM ? NSR_TY_G
                  : n->sym >= 0 ? famtype[n->sym] : NSR_TY_NONE;
        break;
    case NSR_IR_MATMUL:
        n->type = NSR_TY_G;
        break;
    case NSR_IR_MAP:
        n->type = nsr_ir_is_vector(t0) ? NSR_TY_H : t0 == NSR_TY_ZERO ? NSR_TY_NUM : t0;
        break;
    case NSR_IR_BN:
        n->type = NSR_TY_H;
        break;
    case NSR_IR_LIN: {
        int v = NSR_TY_NONE, s = NSR_TY_NONE;
        for (int i = 0; i < n->nterms; i++) {
            int t = ir->n[n->terms[i]].type;
            if (is_scalarish(t))
                s = nsr_ir_type_join(s, t);
            else
                v = nsr_ir_type_join(v, t);
        }
        /* a vector plus numbers is the vector shifted by them */
        n->type = v != NSR_TY_NONE ? v : s;
        break;
    }
    case NSR_IR_MUL:
    case NSR_IR_DIV:
        if (nsr_ir_is_vector(t0) && nsr_ir_is_vector(t1)) {
            n->type = NSR_TY_H;
            n->gates = 1;
        } else if (nsr_ir_is_vector(t1) && n->op == NSR_IR_DIV) {
            n->type = NSR_TY_H;
            n->gates = 1;
        } else if (nsr_ir_is_vector(t0) || nsr_ir_is_vector(t1)) {
            n->type = nsr_ir_is_vector(t0) ? t0 : t1; /* a scaling keeps G a G */
        } else {
            n->type = nsr_ir_type_join(t0 == NSR_TY_ZERO ? NSR_TY_NUM : t0, t1 == NSR_TY_ZERO ? NSR_TY_NUM : t1);
        }
        break;
    case NSR_IR_POW:
        if (nsr_ir_is_vector(t0) && pow_k != 1) {
            n->type = NSR_TY_H;
            n->gates = 1;
        } else {
            n->type = t0 == NSR_TY_ZERO ? NSR_TY_NUM : t0;
        }
        break;
    case NSR_IR_SUM:
        n->type = t0;
        break;
    case NSR_IR_SOFTMAX:
    case NSR_IR_MOMENT:
        n->type = t0 == NSR_TY_NUM ? NSR_TY_NUM : NSR_TY_SCALAR;
        break;
    default: /* INPUT, UNSUP, DEF, OUTPUT */
        n->type = NSR_TY_NONE;
        break;
    }
}

int nsr_ir_def_type(const nsr_ir *ir, const nsr_irn *def)
{
    const nsr_irn *v = &ir->n[def->arg[0]];
    if (v->op == NSR_IR_NUM && v->e->kind == NSR_E_NUM && v->e->num == 0 &&
        def->s->annot != NSR_ANN_SCALAR)
        return NSR_TY_ZERO;
    if (v->type == NSR_TY_NUM)
        return NSR_TY_SCALAR;
    return v->type;
}

/* ---- lowering ---------------------------------------------------------------------------------- */

typedef struct lower {
    const nsr_rolled *R;
    const nsr_check *C;
    nsr_ir *ir;
    int *famtype;            /* per symbol */
    int fi;
    tpk_ctx *ctx;
} lower;

static int new_node(lower *L, int op, const nsr_expr *e, int *out)
{
    nsr_ir *ir = L->ir;
    if (ir->nn == ir->capn) {
        int cap = ir->capn ? 2 * ir->capn : 64;
        nsr_irn *n = tpk_mem_realloc(&ir->al, ir->n, (size_t)cap * sizeof *n, L->ctx);
        if (n == NULL)
            return TPK_ENOMEM;
        ir->n = n;
        ir->capn = cap;
    }
    nsr_irn *n = &ir->n[ir->nn];
    memset(n, 0, sizeof *n);
    n->op = op;
    n->fi = L->fi;
    n->e = e;
    n->sym = -1;
    n->site = -1;
    *out = ir->nn++;
    return TPK_OK;
}

static int lower_expr(lower *L, const nsr_expr *e, int scope, int in_moment, int *out);

static int finish(lower *L, int k)
{
    nsr_ir_type_node(L->ir, &L->ir->n[k], L->famtype, L->C);
    return TPK_OK;
}

static int unsup(lower *L, const nsr_expr *e, const char *why, int *out)
{
    if (new_node(L, NSR_IR_UNSUP, e, out))
        return TPK_ENOMEM;
    L->ir->n[*out].why = why;
    return finish(L, *out);
}

/* Operands come before their node (post-order): the node is made after them. arg_moment: the
 * operand is inside a mean() (the node itself is where in_moment says). */
static int unary(lower *L, int op, const nsr_expr *e, const nsr_expr *a, int scope, int in_moment,
                 int arg_moment, int *out)
{
    int x;
    if (lower_expr(L, a, op == NSR_IR_SUM || op == NSR_IR_SOFTMAX ? scope + 1 : scope, arg_moment,
                   &x) ||
        new_node(L, op, e, out))
        return TPK_ENOMEM;
    nsr_irn *n = &L->ir->n[*out];
    n->arg[0] = x;
    n->narg = 1;
    n->scope = scope;
    n->in_moment = in_moment;
    return finish(L, *out);
}

/* A node of no operands (NUM, SQRTN, and BN, which no rolled back end evaluates). */
static int leaf(lower *L, int op, const nsr_expr *e, int scope, int in_moment, int *out)
{
    if (new_node(L, op, e, out))
        return TPK_ENOMEM;
    L->ir->n[*out].scope = scope;
    L->ir->n[*out].in_moment = in_moment;
    return finish(L, *out);
}

static int lower_matmul(lower *L, const nsr_expr *am, const nsr_expr *src, int scope,
                        int in_moment, int *out)
{
    int x;
    if (src->kind == NSR_E_NAME && src->sym >= 0 && L->C->sym[src->sym].kind == NSR_SYM_INPUT) {
        if (new_node(L, NSR_IR_INPUT, src, &x))
            return TPK_ENOMEM;
        L->ir->n[x].sym = src->sym;
        L->ir->n[x].scope = scope;
    } else if (lower_expr(L, src, scope, in_moment, &x)) {
        return TPK_ENOMEM;
    }
    if (new_node(L, NSR_IR_MATMUL, am, out))
        return TPK_ENOMEM;
    nsr_irn *n = &L->ir->n[*out];
    n->arg[0] = x;
    n->narg = 1;
    n->sym = am->sym;
    n->site = L->ir->nsites++;
    n->embed = L->ir->n[x].op == NSR_IR_INPUT;
    n->scope = scope;
    n->in_moment = in_moment;
    return finish(L, *out);
}

/* a ± b ± c …: a chain of additions (left-nested in the syntax) is one LIN of its terms, kept in
 * source order so that back ends add them as the syntax would. */
static int lower_lin(lower *L, const nsr_expr *e, int scope, int in_moment, int *out)
{
    const nsr_expr *chain[64];
    int n = 0;
    const nsr_expr *c = e;
    while (n < 63 && c->kind == NSR_E_BIN && (c->op == NSR_T_PLUS || c->op == NSR_T_MINUS)) {
        chain[n++] = c;
        c = c->a;
    }
    /* terms: c, then chain[n-1]->b, …, chain[0]->b */
    int nt = n + 1;
    int *terms = tpk_mem_calloc(&L->ir->al, (size_t)nt, sizeof *terms, L->ctx);
    signed char *sign = tpk_mem_calloc(&L->ir->al, (size_t)nt, 1, L->ctx);
    if (terms == NULL || sign == NULL) {
        tpk_mem_free(&L->ir->al, terms);
        tpk_mem_free(&L->ir->al, sign);
        return TPK_ENOMEM;
    }
    int st = TPK_OK;
    sign[0] = 1;
    if (c->kind == NSR_E_NEG) { /* −a + …: the first term negated */
        sign[0] = -1;
        c = c->a;
    }
    st = lower_expr(L, c, scope, in_moment, &terms[0]);
    for (int i = 1; st == TPK_OK && i < nt; i++) {
        const nsr_expr *b = chain[n - i];
        sign[i] = b->op == NSR_T_PLUS ? 1 : -1;
        st = lower_expr(L, b->b, scope, in_moment, &terms[i]);
    }
    if (st == TPK_OK)
        st = new_node(L, NSR_IR_LIN, e, out);
    if (st) {
        tpk_mem_free(&L->ir->al, terms);
        tpk_mem_free(&L->ir->al, sign);
        return st;
    }
    nsr_irn *k = &L->ir->n[*out];
    k->nterms = nt;
    k->terms = terms;
    k->sign = sign;
    k->narg = nt < NSR_IR_MAXARG ? nt : NSR_IR_MAXARG;
    memcpy(k->arg, terms, (size_t)k->narg * sizeof *terms);
    k->scope = scope;
    k->in_moment = in_moment;
    return finish(L, *out);
}

static int lower_call(lower *L, const nsr_expr *e, int scope, int in_moment, int *out)
{
    const nsr_check *C = L->C;
    if (e->sym < 0 && (strcmp(e->name, "mod") == 0 || strcmp(e->name, "wrap") == 0 ||
                       strcmp(e->name, "inside") == 0))
        return leaf(L, NSR_IR_NUM, e, scope, in_moment, out);
    if (e->sym < 0 && strcmp(e->name, "mean") == 0) {
        if (e->nargs != 1)
            return unsup(L, e, "'mean(...)' of several arguments", out);
        return unary(L, NSR_IR_MOMENT, e, e->args[0], scope, in_moment, 1, out);
    }
    if (e->sym >= 0 && C->sym[e->sym].kind == NSR_SYM_WIDTH) /* sqrt(n) */
        return leaf(L, NSR_IR_SQRTN, e, scope, in_moment, out);
    if (e->sym >= 0 && C->sym[e->sym].kind == NSR_SYM_AFAM && e->nargs == 1)
        return lower_matmul(L, e, e->args[0], scope, in_moment, out);
    if (e->sym < 0 && strcmp(e->name, "bn") == 0)
        return leaf(L, NSR_IR_BN, e, scope, in_moment, out);
    if (e->phi != NULL) {
        /* of several arguments, the back ends say "takes one argument" where it is evaluated */
        int st = e->nargs != 1 ? leaf(L, NSR_IR_MAP, e, scope, in_moment, out)
                               : unary(L, NSR_IR_MAP, e, e->args[0], scope, in_moment, in_moment, out);
        if (st == TPK_OK) {
            L->ir->n[*out].phi = e->phi;
            st = finish(L, *out);
        }
        return st;
    }
    return unsup(L, e, "this call", out);
}

static int lower_binary(lower *L, int op, const nsr_expr *e, int scope, int in_moment, int *out)
{
    int a, b;
    if (lower_expr(L, e->a, scope, in_moment, &a) || lower_expr(L, e->b, scope, in_moment, &b) ||
        new_node(L, op, e, out))
        return TPK_ENOMEM;
    nsr_irn *n = &L->ir->n[*out];
    n->arg[0] = a;
    n->arg[1] = b;
    n->narg = 2;
    n->scope = scope;
    n->in_moment = in_moment;
    return finish(L, *out);
}

static int lower_expr(lower *L, const nsr_expr *e, int scope, int in_moment, int *out)
{
    const nsr_check *C = L->C;
    switch (e->kind) {
    case NSR_E_NUM:
        return leaf(L, NSR_IR_NUM, e, scope, in_moment, out);
    case NSR_E_NAME: {
        int k = e->sym >= 0 ? C->sym[e->sym].kind : -1;
        int op = (k == NSR_SYM_PARAM || k == NSR_SYM_LOOP) && e->nidx == 0 ? NSR_IR_NUM
                 : k == NSR_SYM_INPUT ? NSR_IR_INPUT : NSR_IR_READ;
        if (new_node(L, op, e, out))
            return TPK_ENOMEM;
        L->ir->n[*out].sym = e->sym;
        L->ir->n[*out].scope = scope;
        L->ir->n[*out].in_moment = in_moment;
        return finish(L, *out);
    }
    case NSR_E_CALL:
        return lower_call(L, e, scope, in_moment, out);
    case NSR_E_APPLY:
        return lower_matmul(L, e->a, e->b, scope, in_moment, out);
    case NSR_E_SUM:
    case NSR_E_SOFTMAX:
        if (unary(L, e->kind == NSR_E_SUM ? NSR_IR_SUM : NSR_IR_SOFTMAX, e, e->a, scope, in_moment,
                  in_moment, out))
            return TPK_ENOMEM;
        L->ir->n[*out].sym = e->sym;
        return TPK_OK;
    case NSR_E_NEG:
        return lower_lin(L, e, scope, in_moment, out);
    case NSR_E_BIN:
        if (e->op == NSR_T_PLUS || e->op == NSR_T_MINUS)
            return lower_lin(L, e, scope, in_moment, out);
        if (e->op == NSR_T_CARET)
            return unary(L, NSR_IR_POW, e, e->a, scope, in_moment, in_moment, out);
        return lower_binary(L, e->op == NSR_T_STAR ? NSR_IR_MUL : NSR_IR_DIV, e, scope, in_moment,
                            out);
    default:
        return unsup(L, e, "this expression", out);
    }
}

/* The statement of family instruction k: DEF (value) or OUTPUT (value, σ_v², bias σ²). */
static int lower_stmt(lower *L, int k)
{
    const nsr_stmt *s = L->R->fi[k].stmt;
    int first = L->ir->nn, root;
    L->fi = k;
    if (s->kind == NSR_S_OUTPUT) {
        const nsr_expr *rd = s->value, *a0 = rd->args[0];
        int v, var, bias = -1;
        /* a readout of several vectors, or through a readout vector of its own, couples outputs
         * in a way the rolled back ends' readouts (one shared v) do not: the member level runs it */
        int concat = a0->kind == NSR_E_CALL && a0->sym < 0 && strcmp(a0->name, "concat") == 0;
        if (concat || rd->nidx > 0) {
            if (unsup(L, concat ? a0 : rd, concat ? "a concatenation readout concat(...)"
                                                  : "a readout vector of its own (readout[name](...))", &v))
                return TPK_ENOMEM;
        } else if (lower_expr(L, a0, 0, 0, &v)) {
            return TPK_ENOMEM;
        }
        if (lower_expr(L, rd->args[1], 0, 0, &var) ||
            (rd->nargs == 3 && lower_expr(L, rd->args[2], 0, 0, &bias)) ||
            new_node(L, NSR_IR_OUTPUT, rd, &root))
            return TPK_ENOMEM;
        nsr_irn *n = &L->ir->n[root];
        n->s = s;
        n->arg[0] = v;
        n->arg[1] = var;
        n->narg = 2;
        if (bias >= 0)
            n->arg[n->narg++] = bias;
        n->sym = s->fam;
    } else {
        int v;
        if (lower_expr(L, s->value, 0, 0, &v) || new_node(L, NSR_IR_DEF, s->value, &root))
            return TPK_ENOMEM;
        nsr_irn *n = &L->ir->n[root];
        n->s = s;
        n->arg[0] = v;
        n->narg = 1;
        n->sym = s->fam;
        L->famtype[s->fam] = nsr_ir_type_join(L->famtype[s->fam], nsr_ir_def_type(L->ir, n));
    }
    L->ir->fi[k].first = first;
    L->ir->fi[k].count = L->ir->nn - first;
    return TPK_OK;
}

void nsr_ir_free(nsr_ir *ir)
{
    if (ir == NULL)
        return;
    tpk_allocator al = ir->al;
    for (int i = 0; i < ir->nn; i++) {
        tpk_mem_free(&al, ir->n[i].terms);
        tpk_mem_free(&al, ir->n[i].sign);
    }
    tpk_mem_free(&al, ir->n);
    tpk_mem_free(&al, ir->fi);
    tpk_mem_free(&al, ir);
}

int nsr_ir_lower(const nsr_rolled *R, nsr_ir **out, tpk_ctx *ctx)
{
    *out = NULL;
    tpk_allocator al = tpk_ctx_allocator(ctx);
    nsr_ir *ir = tpk_mem_calloc(&al, 1, sizeof *ir, ctx);
    if (ir == NULL)
        return TPK_ERROR(ctx, TPK_ENOMEM, "%s: out of memory (family IR)", R->file);
    ir->al = al;
    lower L = {.R = R, .C = &R->C, .ir = ir, .ctx = ctx};
    ir->fi = tpk_mem_calloc(&al, (size_t)R->nfi + 1, sizeof *ir->fi, ctx);
    L.famtype = tpk_mem_calloc(&al, (size_t)R->C.nsym + 1, sizeof *L.famtype, ctx);
    int st = ir->fi == NULL || L.famtype == NULL ? TPK_ENOMEM : TPK_OK;
    for (int k = 0; st == TPK_OK && k < R->nfi; k++)
        st = lower_stmt(&L, k);
    ir->nfi = st == TPK_OK ? R->nfi : 0;
    tpk_mem_free(&al, L.famtype);
    if (st) {
        nsr_ir_free(ir);
        return TPK_ERROR(ctx, TPK_ENOMEM, "%s: out of memory (family IR)", R->file);
    }
    *out = ir;
    return TPK_OK;
}
