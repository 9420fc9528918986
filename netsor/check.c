/* NETSOR front end, stage 3: the static checker (theory §6). It resolves every name (params,
 * widths, the input, A-var / initial-G / defined families, loop variables, registered functions),
 * applies `--set` overrides, and enforces the rules that do not depend on unrolling: undefined
 * names and functions, redefinitions, index arity, transposes (NETSOR⊤), MatMul needs an A-var on
 * the left, Moments need NETSOR+, readout only at the top of an output. It also owns the width
 * union-find with provenance that elaboration uses for the per-instruction width rules. */
#include "netsor-impl.h"

#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- Union-find over dimensions ------------------------------------------------------------ */
int nsr_uf_new(nsr_check *C, int rigid)
{
    if (C->nuf == C->capuf) {
        int cap = C->capuf ? 2 * C->capuf : 64;
        nsr_uf *u = nsr_alloc(C->S->arena, (size_t)cap * sizeof *u);
        if (u == NULL) {
            nsr_oom(C->S);
            return -1;
        }
        if (C->nuf)
            memcpy(u, C->uf, (size_t)C->nuf * sizeof *u);
        C->uf = u;
        C->capuf = cap;
    }
    nsr_uf *n = &C->uf[C->nuf];
    n->parent = C->nuf;
    n->rigid = rigid;
    return C->nuf++;
}

int nsr_uf_find(nsr_check *C, int x)
{
    while (C->uf[x].parent != x) {
        C->uf[x].parent = C->uf[C->uf[x].parent].parent;
        x = C->uf[x].parent;
    }
    return x;
}

const char *nsr_uf_show(nsr_check *C, int node)
{
    if (node < 0)
        return "_";
    int r = nsr_uf_find(C, node);
    return C->uf[r].rigid >= 0 ? C->sym[C->uf[r].rigid].name : "_";
}

int nsr_uf_unify(nsr_check *C, int a, int b, int line, int col, const char *what,
                 const char *fact_a, const char *fact_b)
{
    int ra = nsr_uf_find(C, a), rb = nsr_uf_find(C, b);
    if (ra == rb)
        return TPK_OK;
    int sa = C->uf[ra].rigid, sb = C->uf[rb].rigid;
    if (sa >= 0 && sb >= 0 && sa != sb)
        return nsr_error(C->S, TPK_ETYPE, line, col, "%s: %s but %s; cannot unify %s with %s", what,
                         fact_a, fact_b, C->sym[sa].name, C->sym[sb].name);
    /* keep the rigid root */
    if (sa >= 0) {
        C->uf[rb].parent = ra;
    } else {
        C->uf[ra].parent = rb;
    }
    return TPK_OK;
}

static const char *S_src(const nsr_check *C)
{
    return C->S->src;
}

/* ---- Symbols ------------------------------------------------------------------------------- */
static const char *const kind_name[] = {"a parameter", "a width symbol", "an input dimension",
                                        "an input", "an A-var", "an initial G-var", "a variable",
                                        "an output", "a loop variable", "a function"};

typedef struct walker {
    nsr_check *C;
    int loops[NSR_MAX_DEPTH + 1]; /* active loop-variable symbols, innermost last */
    int nloops;
    int in_output;                /* resolving the rhs of an output */
} walker;

static int add_sym(nsr_check *C, const char *name, int kind, int line, int col)
{
    if (C->nsym == C->capsym) {
        int cap = C->capsym ? 2 * C->capsym : 64;
        nsr_sym *s = nsr_alloc(C->S->arena, (size_t)cap * sizeof *s);
        if (s == NULL) {
            nsr_oom(C->S);
            return -1;
        }
        if (C->nsym)
            memcpy(s, C->sym, (size_t)C->nsym * sizeof *s);
        C->sym = s;
        C->capsym = cap;
    }
    nsr_sym *s = &C->sym[C->nsym];
    memset(s, 0, sizeof *s);
    s->name = name;
    s->kind = kind;
    s->line = line;
    s->col = col;
    s->arity = -1;
    s->node = s->node2 = -1;
    return C->nsym++;
}

/* Global (non-loop) symbol by name, or -1. */
int nsr_sym_find(const nsr_check *C, const char *name)
{
    for (int i = 0; i < C->nsym; i++)
        if (C->sym[i].kind != NSR_SYM_LOOP && strcmp(C->sym[i].name, name) == 0)
            return i;
    return -1;
}

static int lookup(const walker *W, const char *name)
{
    for (int i = W->nloops - 1; i >= 0; i--)
        if (strcmp(W->C->sym[W->loops[i]].name, name) == 0)
            return W->loops[i];
    return nsr_sym_find(W->C, name);
}

static int is_reserved(const char *name)
{
    static const char *const words[] = {"param", "width", "use", "input", "output", "for", "in",
                                        "mean", "readout", "A", "G", "H", "N", "scalar"};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        if (strcmp(name, words[i]) == 0)
            return 1;
    return 0;
}

/* Is `name` a registered function? Adds a FUNC symbol on first success. */
static int function_sym(nsr_check *C, const char *name)
{
    int s = nsr_sym_find(C, name);
    if (s >= 0)
        return C->sym[s].kind == NSR_SYM_FUNC ? s : -1;
    if (C->S->reg == NULL)
        return -1;
    tpk_ctx tmp;
    tpk_ctx_init_from(&tmp, C->S->ctx);
    tpk_phi *phi = tpk_phi_alloc(C->S->reg, name, &tmp);
    if (phi == NULL) {
        if (tmp.status == TPK_ENOMEM)
            nsr_oom(C->S);
        return -1;
    }
    tpk_phi_free(phi);
    return add_sym(C, name, NSR_SYM_FUNC, 0, 0);
}

/* Declare a global name; a second declaration of the same family kind is a further member. */
static int declare(walker *W, const char *name, int kind, int line, int col)
{
    nsr_check *C = W->C;
    if (is_reserved(name))
        return nsr_error(C->S, TPK_ESYNTAX, line, col, "'%s' is a reserved word", name), -1;
    for (int i = W->nloops - 1; i >= 0; i--)
        if (strcmp(C->sym[W->loops[i]].name, name) == 0)
            return nsr_error(C->S, TPK_ETYPE, line, col,
                             "'%s' is the loop variable of line %d; it cannot be redefined", name,
                             C->sym[W->loops[i]].line), -1;
    int s = nsr_sym_find(C, name);
    if (s >= 0) {
        nsr_sym *o = &C->sym[s];
        int family = kind == NSR_SYM_AFAM || kind == NSR_SYM_GFAM || kind == NSR_SYM_DFAM ||
                     kind == NSR_SYM_OUT;
        if (o->kind == kind && family)
            return s;
        if (o->kind == NSR_SYM_FUNC)
            return nsr_error(C->S, TPK_ETYPE, line, col,
                             "'%s' is the name of a registered function; choose another name", name), -1;
        return nsr_error(C->S, TPK_ETYPE, line, col, "redefinition of '%s' (already %s, line %d)",
                         name, kind_name[o->kind], o->line), -1;
    }
    return add_sym(C, name, kind, line, col);
}

static int set_arity(nsr_check *C, int s, int nidx, int line, int col)
{
    nsr_sym *f = &C->sym[s];
    if (f->arity < 0) {
        f->arity = nidx;
        return TPK_OK;
    }
    if (f->arity != nidx)
        return nsr_error(C->S, TPK_ETYPE, line, col,
                         "'%s' has %d ind%s here but %d at line %d", f->name, nidx,
                         nidx == 1 ? "ex" : "ices", f->arity, f->def_line ? f->def_line : f->line);
    return TPK_OK;
}

/* ---- Expressions --------------------------------------------------------------------------- */
static int resolve(walker *W, nsr_expr *e, int depth);

static int is_amat(walker *W, const nsr_expr *e)
{
    if (e->kind != NSR_E_NAME)
        return 0;
    int s = lookup(W, e->name);
    return s >= 0 && W->C->sym[s].kind == NSR_SYM_AFAM;
}

static int transpose_error(walker *W, const nsr_expr *e)
{
    return nsr_error(W->C->S, TPK_ETYPE, e->line, e->col,
                     "transpose of '%s': NETSOR\xe2\x8a\xa4 transposes are not supported in NNGP mode",
                     e->name ? e->name : "?");
}

/* concat(h1, ..., hm), built in unless the program names something concat */
static int is_concat(walker *W, const nsr_expr *e)
{
    return e->kind == NSR_E_CALL && strcmp(e->name, "concat") == 0 && lookup(W, e->name) < 0 &&
           function_sym(W->C, e->name) < 0;
}

static int resolve_name(walker *W, nsr_expr *e, int depth)
{
    nsr_check *C = W->C;
    int s = lookup(W, e->name);
    if (s < 0)
        s = function_sym(C, e->name);
    if (s < 0) {
        if (strcmp(e->name, "mean") == 0 || strcmp(e->name, "readout") == 0)
            return nsr_error(C->S, TPK_ESYNTAX, e->line, e->col, "'%s' needs arguments: %s(...)",
                             e->name, e->name);
        return nsr_error(C->S, TPK_ETYPE, e->line, e->col, "undefined name '%s'%s", e->name,
                         !C->S->set_value ? ""
                         : strcmp(e->name, "nan") == 0 || strcmp(e->name, "inf") == 0
                         ? " (a parameter must be a finite number)"
                         : " (a value is a number, a function, or an expression of the "
                           "program's parameters)");
    }
    e->sym = s;
    nsr_sym *y = &C->sym[s];
    switch (y->kind) {
    case NSR_SYM_WIDTH:
    case NSR_SYM_DIM:
        return nsr_error(C->S, TPK_ETYPE, e->line, e->col,
                         "width symbol '%s' used as a value (only sqrt(%s) * mean(...) may use it)",
                         e->name, e->name);
    case NSR_SYM_OUT:
        return nsr_error(C->S, TPK_ETYPE, e->line, e->col,
                         "output '%s' cannot be used in an expression (outputs are read out, not reused)",
                         e->name);
    case NSR_SYM_PARAM:
    case NSR_SYM_LOOP:
    case NSR_SYM_FUNC:
        if (e->nidx > 0)
            return nsr_error(C->S, TPK_ETYPE, e->line, e->col, "'%s' is %s; it cannot be indexed",
                             e->name, kind_name[y->kind]);
        return TPK_OK;
    case NSR_SYM_INPUT:
    case NSR_SYM_AFAM:
    case NSR_SYM_GFAM:
    case NSR_SYM_DFAM:
        if (y->arity >= 0 && y->arity != e->nidx) {
            if (y->arity == 0)
                return nsr_error(C->S, TPK_ETYPE, e->line, e->col, "'%s' is not indexed (line %d)",
                                 e->name, y->def_line ? y->def_line : y->line);
            return nsr_error(C->S, TPK_ETYPE, e->line, e->col,
                             "'%s' needs %d ind%s (%s[...]), as at line %d", e->name, y->arity,
                             y->arity == 1 ? "ex" : "ices", e->name, y->def_line ? y->def_line : y->line);
        }
        for (int i = 0; i < e->nidx; i++)
            if (resolve(W, e->idx[i], depth + 1))
                return TPK_ETYPE;
        return TPK_OK;
    default:
        return TPK_OK;
    }
}

/* `mod(a, b)` is built in unless the program or the registry gives `mod` another meaning. */
static int is_builtin_mod(walker *W, const nsr_expr *e)
{
    return strcmp(e->name, "mod") == 0 && lookup(W, e->name) < 0 && function_sym(W->C, e->name) < 0;
}

/* wrap(v, lo, hi) and inside(v, lo, hi): index arithmetic for padding (docs/netsor.md) */
static int is_builtin_pad(walker *W, const nsr_expr *e)
{
    return (strcmp(e->name, "wrap") == 0 || strcmp(e->name, "inside") == 0) &&
           lookup(W, e->name) < 0 && function_sym(W->C, e->name) < 0;
}

/* sum(j in lo..hi, body): lo and hi in the enclosing scope, body with j as a loop variable. */
static int resolve_sum(walker *W, nsr_expr *e, int depth)
{
    nsr_check *C = W->C;
    if (resolve(W, e->args[0], depth + 1) || resolve(W, e->args[1], depth + 1))
        return TPK_ETYPE;
    if (is_reserved(e->name))
        return nsr_error(C->S, TPK_ESYNTAX, e->line, e->col, "'%s' is a reserved word", e->name);
    int g = nsr_sym_find(C, e->name);
    if (g >= 0 && C->sym[g].kind != NSR_SYM_FUNC)
        return nsr_error(C->S, TPK_ETYPE, e->line, e->col, "sum variable '%s' shadows %s '%s' (line %d)",
                         e->name, kind_name[C->sym[g].kind], e->name, C->sym[g].line);
    for (int i = 0; i < W->nloops; i++)
        if (strcmp(C->sym[W->loops[i]].name, e->name) == 0)
            return nsr_error(C->S, TPK_ETYPE, e->line, e->col,
                             "sum variable '%s' shadows the loop variable of line %d", e->name,
                             C->sym[W->loops[i]].line);
    if (W->nloops >= NSR_MAX_DEPTH)
        return nsr_error(C->S, TPK_ESYNTAX, e->line, e->col, "loops nested too deeply");
    int l = add_sym(C, e->name, NSR_SYM_LOOP, e->line, e->col);
    if (l < 0)
        return TPK_ENOMEM;
    e->sym = l;
    W->loops[W->nloops++] = l;
    int st = resolve(W, e->a, depth + 1);
    W->nloops--;
    return st;
}

/* softmax(j in lo..hi: s): j names an enclosing index (the entry taken) and binds a fresh j
 * inside, as in the paper's a_ij = softmax_j(s_ij). */
static int resolve_softmax(walker *W, nsr_expr *e, int depth)
{
    nsr_check *C = W->C;
    if (!C->netsor_plus)
        return nsr_error(C->S, TPK_ETYPE, e->line, e->col,
                         "softmax(...) computes scalars (NETSOR+): pass --netsor-plus or write "
                         "'use netsor+' at the top of the program");
    if (resolve(W, e->args[0], depth + 1) || resolve(W, e->args[1], depth + 1))
        return TPK_ETYPE;
    int outer = -1;
    for (int i = W->nloops - 1; i >= 0 && outer < 0; i--)
        if (strcmp(C->sym[W->loops[i]].name, e->name) == 0)
            outer = W->loops[i];
    if (outer < 0)
        return nsr_error(C->S, TPK_ETYPE, e->line, e->col,
                         "softmax(%s in ...) gives the entry at the enclosing index '%s', but no "
                         "enclosing loop or binder is named '%s' (write a[i, %s in 1..i] = "
                         "softmax(%s in 1..i: s[i, %s]))", e->name, e->name, e->name, e->name,
                         e->name, e->name);
    if (W->nloops >= NSR_MAX_DEPTH)
        return nsr_error(C->S, TPK_ESYNTAX, e->line, e->col, "loops nested too deeply");
    int l = add_sym(C, e->name, NSR_SYM_LOOP, e->line, e->col);
    if (l < 0)
        return TPK_ENOMEM;
    e->sym = l;
    e->op = outer;
    W->loops[W->nloops++] = l;
    int st = resolve(W, e->a, depth + 1);
    W->nloops--;
    return st;
}

static int resolve_call(walker *W, nsr_expr *e, int depth)
{
    nsr_check *C = W->C;
    if (strcmp(e->name, "mean") == 0) {
        if (e->nargs != 1 || e->nidx)
            return nsr_error(C->S, TPK_ETYPE, e->line, e->col, "mean takes one argument: mean(expr)");
        if (!C->netsor_plus)
            return nsr_error(C->S, TPK_ETYPE, e->line, e->col,
                             "mean(...) is a NETSOR+ Moment: pass --netsor-plus or write "
                             "'use netsor+' at the top of the program");
        return resolve(W, e->args[0], depth + 1);
    }
    if (strcmp(e->name, "readout") == 0)
        return nsr_error(C->S, TPK_ETYPE, e->line, e->col,
                         "readout(...) may only appear as 'output y = readout(var, sigma_v2[, sigma_ob2])'");
    if (is_concat(W, e))
        return nsr_error(C->S, TPK_ETYPE, e->line, e->col,
                         "concat(...) may only appear as a readout's first argument: "
                         "'output y = readout(concat(h1, h2), sigma_v2)'");
    if (is_builtin_pad(W, e)) {
        if (e->nargs != 3 || e->nidx)
            return nsr_error(C->S, TPK_ETYPE, e->line, e->col,
                             "%s takes three integers: %s(v, lo, hi) (index arithmetic for padding)",
                             e->name, e->name);
        for (int i = 0; i < 3; i++)
            if (resolve(W, e->args[i], depth + 1))
                return TPK_ETYPE;
        return TPK_OK;
    }
    if (is_builtin_mod(W, e)) { /* mod(a, b): integer index arithmetic (elab checks the values) */
        if (e->nargs != 2 || e->nidx)
            return nsr_error(C->S, TPK_ETYPE, e->line, e->col,
                             "mod takes two integers: mod(a, b) (index arithmetic, e.g. circular "
                             "padding)");
        if (resolve(W, e->args[0], depth + 1))
            return TPK_ETYPE;
        return resolve(W, e->args[1], depth + 1);
    }
    if (strcmp(e->name, "bn") == 0 && lookup(W, e->name) < 0 && function_sym(C, e->name) < 0) {
        /* bn(g[, batch[, eps]]): batchnorm across the batch (theory §2.5, §8.6); its uses are
         * checked in elab */
        if (e->nargs < 1 || e->nargs > 3 || e->nidx)
            return nsr_error(C->S, TPK_ETYPE, e->line, e->col,
                             "bn takes a G-var, an optional batch size and an optional epsilon: "
                             "bn(g), bn(g, batch) or bn(g, batch, eps)");
        for (int i = 0; i < e->nargs; i++)
            if (resolve(W, e->args[i], depth + 1))
                return TPK_ETYPE;
        return TPK_OK;
    }
    if (strcmp(e->name, "sqrt") == 0 && e->nargs == 1 && e->args[0]->kind == NSR_E_NAME) {
        int s = lookup(W, e->args[0]->name);
        if (s >= 0 && C->sym[s].kind == NSR_SYM_WIDTH) {
            e->args[0]->sym = s;
            e->sym = s; /* sqrt(width): legal only as a factor of mean(...) (checked in elab) */
            return TPK_OK;
        }
    }
    int s = lookup(W, e->name);
    if (s < 0)
        s = function_sym(C, e->name);
    if (s < 0 && C->S->reg == NULL) /* tpk_netsor_load_*(..., reg = NULL, ...) */
        return nsr_error(C->S, TPK_ETYPE, e->line, e->col, "unknown function '%s': the function "
                         "registry is NULL, so no function is known; pass one "
                         "(tpk_phi_registry_alloc, or tpk_job_registry for sqrt too)", e->name);
    if (s < 0)
        return nsr_error(C->S, TPK_ETYPE, e->line, e->col, "unknown function '%s'", e->name);
    e->sym = s;
    nsr_sym *y = &C->sym[s];
    if (y->kind == NSR_SYM_AFAM) {
        if (y->arity >= 0 && y->arity != e->nidx)
            return nsr_error(C->S, TPK_ETYPE, e->line, e->col, "'%s' needs %d ind%s, as at line %d",
                             e->name, y->arity, y->arity == 1 ? "ex" : "ices", y->line);
        for (int i = 0; i < e->nidx; i++)
            if (resolve(W, e->idx[i], depth + 1))
                return TPK_ETYPE;
        if (e->nargs != 1)
            return nsr_error(C->S, TPK_ETYPE, e->line, e->col,
                             "MatMul %s(...) takes one vector", e->name);
        return resolve(W, e->args[0], depth + 1);
    }
    if (y->kind != NSR_SYM_FUNC && y->kind != NSR_SYM_PARAM)
        return nsr_error(C->S, TPK_ETYPE, e->line, e->col, "'%s' is %s (line %d), not a function",
                         e->name, kind_name[y->kind], y->line);
    if (e->nidx)
        return nsr_error(C->S, TPK_ETYPE, e->line, e->col, "function '%s' cannot be indexed", e->name);
    if (e->nargs != 1)
        return nsr_error(C->S, TPK_ETYPE, e->line, e->col,
                         "function '%s' takes one argument (got %d); bind parameters with "
                         "'param f = %s(...)'", e->name, e->nargs, e->name);
    return resolve(W, e->args[0], depth + 1);
}

static int resolve(walker *W, nsr_expr *e, int depth)
{
    nsr_check *C = W->C;
    if (depth > 4 * NSR_MAX_DEPTH)
        return nsr_error(C->S, TPK_ESYNTAX, e->line, e->col, "expression nested too deeply");
    switch (e->kind) {
    case NSR_E_NUM:
        return TPK_OK;
    case NSR_E_NAME:
        return resolve_name(W, e, depth);
    case NSR_E_CALL:
        return resolve_call(W, e, depth);
    case NSR_E_TRANSPOSE:
        if (e->a->kind == NSR_E_NAME || e->a->kind == NSR_E_CALL)
            e->name = e->a->name;
        return transpose_error(W, e);
    case NSR_E_APPLY: {
        nsr_expr *m = e->a;
        if (m->kind == NSR_E_TRANSPOSE) {
            m->name = m->a->name;
            return transpose_error(W, m);
        }
        if (m->kind == NSR_E_BIN && m->op == NSR_T_CARET && is_amat(W, m->a)) {
            m->name = m->a->name;
            return transpose_error(W, m);
        }
        if (m->kind != NSR_E_NAME)
            return nsr_error(C->S, TPK_ETYPE, m->line, m->col,
                             "MatMul needs an A-var on the left of a product written by juxtaposition");
        if (resolve(W, m, depth + 1))
            return TPK_ETYPE;
        if (C->sym[m->sym].kind != NSR_SYM_AFAM)
            return nsr_error(C->S, TPK_ETYPE, m->line, m->col,
                             "MatMul needs an A-var on the left, but '%s' is %s (line %d)%s",
                             m->name, kind_name[C->sym[m->sym].kind], C->sym[m->sym].line,
                             C->sym[m->sym].kind == NSR_SYM_FUNC ? "; write a call as f(x)"
                             : "; write products with '*'");
        return resolve(W, e->b, depth + 1);
    }
    case NSR_E_BIN:
        if (e->op == NSR_T_CARET && is_amat(W, e->a)) {
            e->name = e->a->name;
            return transpose_error(W, e);
        }
        if (resolve(W, e->a, depth + 1))
            return TPK_ETYPE;
        return resolve(W, e->b, depth + 1);
    case NSR_E_NEG:
        return resolve(W, e->a, depth + 1);
    case NSR_E_SUM:
        return resolve_sum(W, e, depth);
    case NSR_E_SOFTMAX:
        return resolve_softmax(W, e, depth);
    default:
        return TPK_OK;
    }
}

/* A-var outside a MatMul position (e.g. `g = W + b`): caught here so elaboration can assume
 * every A-var reference is the left operand of an APPLY or a CALL. */
static int no_bare_amat(walker *W, const nsr_expr *e, int depth)
{
    if (e == NULL || depth > 4 * NSR_MAX_DEPTH)
        return TPK_OK;
    switch (e->kind) {
    case NSR_E_NAME:
        if (e->sym >= 0 && W->C->sym[e->sym].kind == NSR_SYM_AFAM)
            return nsr_error(W->C->S, TPK_ETYPE, e->line, e->col,
                             "A-var '%s' can only multiply a vector (write '%s h')", e->name, e->name);
        if (e->sym >= 0 && W->C->sym[e->sym].kind == NSR_SYM_INPUT)
            return nsr_error(W->C->S, TPK_ETYPE, e->line, e->col,
                             "input '%s' can only be embedded by an A-var of shape (width, %s): "
                             "write 'U %s'", e->name, nsr_uf_show(W->C, W->C->sym[e->sym].node),
                             e->name);
        for (int i = 0; i < e->nidx; i++)
            if (no_bare_amat(W, e->idx[i], depth + 1))
                return TPK_ETYPE;
        return TPK_OK;
    case NSR_E_APPLY:
        for (int i = 0; i < e->a->nidx; i++)
            if (no_bare_amat(W, e->a->idx[i], depth + 1))
                return TPK_ETYPE;
        if (e->b->kind == NSR_E_NAME && e->b->sym >= 0 &&
            W->C->sym[e->b->sym].kind == NSR_SYM_INPUT) {
            for (int i = 0; i < e->b->nidx; i++)
                if (no_bare_amat(W, e->b->idx[i], depth + 1))
                    return TPK_ETYPE;
            return TPK_OK;
        }
        return no_bare_amat(W, e->b, depth + 1);
    case NSR_E_CALL:
        if (e->sym >= 0 && W->C->sym[e->sym].kind == NSR_SYM_AFAM && e->nargs == 1 &&
            e->args[0]->kind == NSR_E_NAME && e->args[0]->sym >= 0 &&
            W->C->sym[e->args[0]->sym].kind == NSR_SYM_INPUT)
            return TPK_OK;
        for (int i = 0; i < e->nargs; i++)
            if (no_bare_amat(W, e->args[i], depth + 1))
                return TPK_ETYPE;
        return TPK_OK;
    default:
        if (no_bare_amat(W, e->a, depth + 1))
            return TPK_ETYPE;
        return no_bare_amat(W, e->b, depth + 1);
    }
}

static int resolve_value(walker *W, nsr_expr *e)
{
    if (resolve(W, e, 0))
        return TPK_ETYPE;
    return no_bare_amat(W, e, 0);
}

/* ---- Dimensions ------------------------------------------------------------------------------ */
static int resolve_dim(walker *W, nsr_dim *d, int allow_dim)
{
    nsr_check *C = W->C;
    if (d->name == NULL) {
        d->node = nsr_uf_new(C, -1);
        if (d->node < 0)
            return TPK_ENOMEM;
        C->uf[d->node].hole = 1;
        C->uf[d->node].line = d->line;
        C->uf[d->node].col = d->col;
        return TPK_OK;
    }
    int s = nsr_sym_find(C, d->name);
    if (s < 0)
        return nsr_error(C->S, TPK_ETYPE, d->line, d->col,
                         "undefined width '%s' (declare it with 'width %s')", d->name, d->name);
    if (C->sym[s].kind == NSR_SYM_DIM && !allow_dim)
        return nsr_error(C->S, TPK_ETYPE, d->line, d->col,
                         "'%s' is the input dimension (line %d); a vector's width must be a width symbol",
                         d->name, C->sym[s].line);
    if (C->sym[s].kind != NSR_SYM_WIDTH && C->sym[s].kind != NSR_SYM_DIM)
        return nsr_error(C->S, TPK_ETYPE, d->line, d->col, "'%s' is %s (line %d), not a width symbol",
                         d->name, kind_name[C->sym[s].kind], C->sym[s].line);
    d->node = C->sym[s].node;
    return TPK_OK;
}

/* ---- Pre-pass: families defined by definitions and outputs (they may be read before the
 * statement that defines them textually, e.g. s[t-1] in a loop body above s[t] = ...). ------- */
static void append_range(nsr_check *C, nsr_sym *f, const walker *W, const nsr_stmt *s)
{
    char buf[160];
    size_t k = 0;
    buf[0] = '\0';
    if (s->nidx > 1)
        k += (size_t)snprintf(buf + k, sizeof buf - k, "(");
    for (int i = 0; i < s->nidx && k < sizeof buf; i++) {
        const nsr_expr *ix = s->idx[i];
        const char *txt = C->S->src + ix->start;
        int len = ix->end - ix->start;
        if (ix->kind == NSR_E_NAME && ix->nidx == 0) {
            for (int j = W->nloops - 1; j >= 0; j--) {
                const nsr_sym *l = &C->sym[W->loops[j]];
                if (strcmp(l->name, ix->name) == 0) {
                    txt = C->S->src + l->decl->range_start;
                    len = l->decl->range_end - l->decl->range_start;
                    break;
                }
            }
        }
        if (len < 0 || len > 60)
            len = 60;
        k += (size_t)snprintf(buf + k, sizeof buf - k, "%s%.*s", i ? ", " : "", len, txt);
    }
    if (s->nidx > 1 && k < sizeof buf)
        snprintf(buf + k, sizeof buf - k, ")");
    size_t have = strlen(f->ranges), bl = strlen(buf);
    if (have + bl + 6 < sizeof f->ranges && strstr(f->ranges, buf) == NULL) {
        if (have > 0) {
            memcpy(f->ranges + have, " and ", 5);
            have += 5;
        }
        memcpy(f->ranges + have, buf, bl + 1);
    }
}

static int prepass(walker *W, nsr_stmt **stmts, int n, int depth)
{
    nsr_check *C = W->C;
    for (int i = 0; i < n; i++) {
        nsr_stmt *s = stmts[i];
        if (s->kind == NSR_S_USE)
            C->netsor_plus = 1;
        if (s->kind == NSR_S_FOR) {
            if (W->nloops >= NSR_MAX_DEPTH)
                return nsr_error(C->S, TPK_ESYNTAX, s->line, s->col, "loops nested too deeply");
            int l = add_sym(C, s->name, NSR_SYM_LOOP, s->name_line, s->name_col);
            if (l < 0)
                return TPK_ENOMEM;
            C->sym[l].decl = s;
            W->loops[W->nloops++] = l;
            int st = prepass(W, s->body, s->nbody, depth + 1);
            W->nloops--;
            if (st)
                return st;
            continue;
        }
        if (s->kind != NSR_S_DEF && s->kind != NSR_S_OUTPUT)
            continue;
        int kind = s->kind == NSR_S_DEF ? NSR_SYM_DFAM : NSR_SYM_OUT;
        if (is_reserved(s->name))
            return nsr_error(C->S, TPK_ESYNTAX, s->name_line, s->name_col, "'%s' is a reserved word",
                             s->name);
        int f = nsr_sym_find(C, s->name);
        if (f >= 0 && C->sym[f].kind != kind)
            return nsr_error(C->S, TPK_ETYPE, s->name_line, s->name_col,
                             "redefinition of '%s' (already %s, line %d)", s->name,
                             kind_name[C->sym[f].kind], C->sym[f].line);
        if (f < 0) {
            f = add_sym(C, s->name, kind, s->name_line, s->name_col);
            if (f < 0)
                return TPK_ENOMEM;
            C->sym[f].def_line = s->line;
            if (kind == NSR_SYM_DFAM && (C->sym[f].node = nsr_uf_new(C, -1)) < 0)
                return TPK_ENOMEM;
        }
        if (set_arity(C, f, s->nidx, s->name_line, s->name_col))
            return TPK_ETYPE;
        s->fam = f;
        append_range(C, &C->sym[f], W, s);
    }
    return TPK_OK;
}

/* ---- Main walk, in program order --------------------------------------------------------- */

/* Whether a parameter's declared default (before any --set) is integer arithmetic: integer
 * literals written without '.' or an exponent, integer parameters declared earlier, + - * / ^
 * and mod/wrap/inside of those. Outputs store such a parameter as an integer (issue 39,
 * item 9: L, T, cols, circular were stored as floats). */
static int declared_integer(const walker *W, const nsr_expr *e)
{
    const char *src = W->C->S->src;
    switch (e->kind) {
    case NSR_E_NUM:
        if (e->num != floor(e->num) || src == NULL || e->start < 0 || e->end <= e->start)
            return 0;
        for (int i = e->start; i < e->end; i++)
            if (src[i] == '.' || src[i] == 'e' || src[i] == 'E')
                return 0;
        return 1;
    case NSR_E_NAME: {
        int y = e->nidx == 0 ? lookup(W, e->name) : -1;
        return y >= 0 && W->C->sym[y].kind == NSR_SYM_PARAM && W->C->sym[y].integer;
    }
    case NSR_E_NEG:
        return declared_integer(W, e->a);
    case NSR_E_BIN:
        return declared_integer(W, e->a) && declared_integer(W, e->b);
    case NSR_E_CALL: {
        if (e->nidx != 0 || (strcmp(e->name, "mod") != 0 && strcmp(e->name, "wrap") != 0 &&
                             strcmp(e->name, "inside") != 0))
            return 0;
        for (int i = 0; i < e->nargs; i++)
            if (!declared_integer(W, e->args[i]))
                return 0;
        return 1;
    }
    default:
        return 0;
    }
}

static int apply_override(walker *W, nsr_stmt *s)
{
    nsr_state *S = W->C->S;
    const tpk_netsor_opts *o = S->opts;
    if (o == NULL)
        return TPK_OK;
    const char *value = NULL;
    for (int i = 0; i < o->nsets; i++)
        if (o->sets[i].name != NULL && strcmp(o->sets[i].name, s->name) == 0)
            value = o->sets[i].value;
    if (value == NULL)
        return TPK_OK;
    char *where = nsr_alloc(S->arena, strlen(S->file) + strlen(s->name) + strlen(value) + 16);
    if (where == NULL)
        return nsr_oom(S);
    sprintf(where, "%s: --set %s=%s", S->file, s->name, value);
    nsr_state sub = *S;
    sub.file = where;
    sub.src = value;
    sub.failed = 0;
    sub.set_value = 1;
    int st;
    nsr_expr *e = nsr_parse_value(&sub, value, &st);
    if (e == NULL) {
        S->failed = 1;
        return st ? st : TPK_ESYNTAX;
    }
    s->value = e;
    S->file = where; /* name-resolution errors in the value point at the --set */
    S->set_value = 1;
    return TPK_OK;
}

static int walk(walker *W, nsr_stmt **stmts, int n);

static int walk_stmt(walker *W, nsr_stmt *s)
{
    nsr_check *C = W->C;
    switch (s->kind) {
    case NSR_S_USE:
        return TPK_OK;
    case NSR_S_PARAM: {
        if (W->nloops > 0)
            return nsr_error(C->S, TPK_ESYNTAX, s->line, s->col, "'param' is only allowed at top level");
        const char *file = C->S->file;
        const int integer = declared_integer(W, s->value); /* as declared, before a --set */
        if (apply_override(W, s))
            return TPK_ESYNTAX;
        /* resolve before declaring: a parameter's default cannot mention itself */
        int st;
        nsr_expr *v = s->value;
        int fs = v->kind == NSR_E_CALL && v->nidx == 0 && lookup(W, v->name) < 0
                 ? function_sym(C, v->name) : -1;
        if (fs >= 0) {
            /* a function with bound parameters: param f = leaky_relu(0.1) */
            v->sym = fs;
            st = TPK_OK;
            for (int i = 0; i < v->nargs && st == TPK_OK; i++)
                st = resolve(W, v->args[i], 0);
        } else {
            st = resolve(W, v, 0);
        }
        C->S->file = file;
        C->S->set_value = 0;
        if (st)
            return TPK_ETYPE;
        int p = declare(W, s->name, NSR_SYM_PARAM, s->name_line, s->name_col);
        if (p < 0)
            return TPK_ETYPE;
        C->sym[p].decl = s;
        C->sym[p].integer = integer;
        s->fam = p;
        return TPK_OK;
    }
    case NSR_S_WIDTH:
        if (W->nloops > 0)
            return nsr_error(C->S, TPK_ESYNTAX, s->line, s->col, "'width' is only allowed at top level");
        for (int i = 0; i < s->nnames; i++) {
            int w = declare(W, s->names[i], NSR_SYM_WIDTH, s->dims[i].line, s->dims[i].col);
            if (w < 0 || (C->sym[w].node = nsr_uf_new(C, w)) < 0)
                return TPK_ETYPE;
        }
        return TPK_OK;
    case NSR_S_INPUT: {
        if (W->nloops > 0)
            return nsr_error(C->S, TPK_ESYNTAX, s->line, s->col, "'input' is only allowed at top level");
        if (C->input_sym >= 0)
            return nsr_error(C->S, TPK_ETYPE, s->line, s->col,
                             "second input '%s': a program has one input (already '%s' at line %d); "
                             "the batch axis is implicit", s->name, C->sym[C->input_sym].name,
                             C->sym[C->input_sym].line);
        if (s->lo != NULL && (resolve_value(W, s->lo) || resolve_value(W, s->hi)))
            return TPK_ETYPE;
        if (s->rows.name == NULL)
            return nsr_error(C->S, TPK_ETYPE, s->rows.line, s->rows.col,
                             "name the input dimension (input x : d)");
        int d = nsr_sym_find(C, s->rows.name);
        if (d < 0) {
            if (is_reserved(s->rows.name))
                return nsr_error(C->S, TPK_ESYNTAX, s->rows.line, s->rows.col,
                                 "'%s' is a reserved word", s->rows.name);
            d = add_sym(C, s->rows.name, NSR_SYM_DIM, s->rows.line, s->rows.col);
            if (d < 0 || (C->sym[d].node = nsr_uf_new(C, d)) < 0)
                return TPK_ENOMEM;
        } else {
            return nsr_error(C->S, TPK_ETYPE, s->rows.line, s->rows.col,
                             "input dimension '%s' is already %s (line %d); use a fresh name",
                             s->rows.name, kind_name[C->sym[d].kind], C->sym[d].line);
        }
        int x = declare(W, s->name, NSR_SYM_INPUT, s->name_line, s->name_col);
        if (x < 0)
            return TPK_ETYPE;
        C->sym[x].node = C->sym[d].node;
        C->sym[x].arity = s->lo != NULL ? 1 : 0;
        C->sym[x].decl = s;
        if (s->lo != NULL)
            snprintf(C->sym[x].ranges, sizeof C->sym[x].ranges, "%.*s",
                     s->range_end - s->range_start > 100 ? 100 : s->range_end - s->range_start,
                     S_src(C) + s->range_start);
        C->input_sym = x;
        s->fam = x;
        return TPK_OK;
    }
    case NSR_S_ADECL: {
        for (int i = 0; i < s->nidx; i++)
            if (resolve_value(W, s->idx[i]))
                return TPK_ETYPE;
        if (resolve_dim(W, &s->rows, 0) || resolve_dim(W, &s->cols, 1) || resolve_value(W, s->var))
            return TPK_ETYPE;
        int a = declare(W, s->name, NSR_SYM_AFAM, s->name_line, s->name_col);
        if (a < 0 || set_arity(C, a, s->nidx, s->name_line, s->name_col))
            return TPK_ETYPE;
        nsr_sym *f = &C->sym[a];
        s->fam = a;
        if (f->decl == NULL) {
            f->decl = s;
            f->node = s->rows.node;
            f->node2 = s->cols.node;
            append_range(C, f, W, s);
            return TPK_OK;
        }
        append_range(C, f, W, s);
        char fa[200], fb[200];
        snprintf(fa, sizeof fa, "%s is A(%s, %s) at line %d", s->name, nsr_uf_show(C, f->node),
                 nsr_uf_show(C, f->node2), f->line);
        snprintf(fb, sizeof fb, "here it is A(%s, %s)", nsr_uf_show(C, s->rows.node),
                 nsr_uf_show(C, s->cols.node));
        if (nsr_uf_unify(C, f->node, s->rows.node, s->line, s->col, "declaration", fa, fb) ||
            nsr_uf_unify(C, f->node2, s->cols.node, s->line, s->col, "declaration", fa, fb))
            return TPK_ETYPE;
        return TPK_OK;
    }
    case NSR_S_GDECL: {
        for (int i = 0; i < s->nidx; i++)
            if (resolve_value(W, s->idx[i]))
                return TPK_ETYPE;
        if (resolve_dim(W, &s->rows, 0) || (s->mean && resolve_value(W, s->mean)) ||
            resolve_value(W, s->var))
            return TPK_ETYPE;
        int g = declare(W, s->name, NSR_SYM_GFAM, s->name_line, s->name_col);
        if (g < 0 || set_arity(C, g, s->nidx, s->name_line, s->name_col))
            return TPK_ETYPE;
        nsr_sym *f = &C->sym[g];
        s->fam = g;
        append_range(C, f, W, s);
        if (f->decl == NULL) {
            f->decl = s;
            f->node = s->rows.node;
            return TPK_OK;
        }
        char fa[200], fb[200];
        snprintf(fa, sizeof fa, "%s has width %s at line %d", s->name, nsr_uf_show(C, f->node), f->line);
        snprintf(fb, sizeof fb, "here width %s", nsr_uf_show(C, s->rows.node));
        return nsr_uf_unify(C, f->node, s->rows.node, s->line, s->col, "declaration", fa, fb);
    }
    case NSR_S_DEF:
        for (int i = 0; i < W->nloops; i++)
            if (strcmp(C->sym[W->loops[i]].name, s->name) == 0)
                return nsr_error(C->S, TPK_ETYPE, s->name_line, s->name_col,
                                 "'%s' is the loop variable of line %d; it cannot be redefined",
                                 s->name, C->sym[W->loops[i]].line);
        for (int i = 0; i < s->nidx; i++)
            if (resolve_value(W, s->idx[i]))
                return TPK_ETYPE;
        return resolve_value(W, s->value);
    case NSR_S_OUTPUT: {
        for (int i = 0; i < s->nidx; i++)
            if (resolve_value(W, s->idx[i]))
                return TPK_ETYPE;
        nsr_expr *r = s->value;
        if (r->kind != NSR_E_CALL || strcmp(r->name, "readout") != 0)
            return nsr_error(C->S, TPK_ETYPE, r->line, r->col,
                             "an output must be 'readout(var, sigma_v2[, sigma_ob2])'");
        if (r->nargs != 2 && r->nargs != 3)
            return nsr_error(C->S, TPK_ETYPE, r->line, r->col,
                             "readout takes two or three arguments: readout(var, sigma_v2[, "
                             "sigma_ob2]), the readout weights' and the output bias' variances");
        /* readout[u](...): a readout vector (and bias) of its own, named u; names of readout
         * vectors are their own namespace and are never values */
        if (r->nidx > 1 || (r->nidx == 1 && r->idx[0]->kind != NSR_E_NAME))
            return nsr_error(C->S, TPK_ETYPE, r->idx[0]->line, r->idx[0]->col,
                             "readout[u](...) takes one name u, the readout vector of its own");
        nsr_expr *v = r->args[0];
        if (is_concat(W, v)) { /* readout(concat(h1, ..., hm), ...): one readout of width m·n */
            if (v->nargs < 2 || v->nidx)
                return nsr_error(C->S, TPK_ETYPE, v->line, v->col,
                                 "concat takes two or more vectors: readout(concat(h1, h2), "
                                 "sigma_v2)");
            for (int i = 0; i < v->nargs; i++)
                if (resolve_value(W, v->args[i]))
                    return TPK_ETYPE;
        } else if (resolve_value(W, v)) {
            return TPK_ETYPE;
        }
        if (resolve_value(W, r->args[1]) || (r->nargs == 3 && resolve_value(W, r->args[2])))
            return TPK_ETYPE;
        return TPK_OK;
    }
    case NSR_S_FOR: {
        if (resolve_value(W, s->lo) || resolve_value(W, s->hi))
            return TPK_ETYPE;
        if (is_reserved(s->name))
            return nsr_error(C->S, TPK_ESYNTAX, s->name_line, s->name_col, "'%s' is a reserved word",
                             s->name);
        int g = nsr_sym_find(C, s->name);
        if (g >= 0 && C->sym[g].kind != NSR_SYM_FUNC)
            return nsr_error(C->S, TPK_ETYPE, s->name_line, s->name_col,
                             "loop variable '%s' shadows %s '%s' (line %d)", s->name,
                             kind_name[C->sym[g].kind], s->name, C->sym[g].line);
        for (int i = 0; i < W->nloops; i++)
            if (strcmp(C->sym[W->loops[i]].name, s->name) == 0)
                return nsr_error(C->S, TPK_ETYPE, s->name_line, s->name_col,
                                 "loop variable '%s' shadows the loop variable of line %d", s->name,
                                 C->sym[W->loops[i]].line);
        if (W->nloops >= NSR_MAX_DEPTH)
            return nsr_error(C->S, TPK_ESYNTAX, s->line, s->col, "loops nested too deeply");
        int l = add_sym(C, s->name, NSR_SYM_LOOP, s->name_line, s->name_col);
        if (l < 0)
            return TPK_ENOMEM;
        C->sym[l].decl = s;
        s->fam = l;
        W->loops[W->nloops++] = l;
        int st = walk(W, s->body, s->nbody);
        W->nloops--;
        return st;
    }
    default:
        return TPK_OK;
    }
}

static int walk(walker *W, nsr_stmt **stmts, int n)
{
    for (int i = 0; i < n; i++)
        if (walk_stmt(W, stmts[i]))
            return W->C->S->ctx->status ? W->C->S->ctx->status : TPK_ETYPE;
    return TPK_OK;
}

int nsr_check_program(nsr_state *S, nsr_ast *ast, nsr_check *C)
{
    memset(C, 0, sizeof *C);
    C->S = S;
    C->input_sym = -1;
    C->netsor_plus = S->opts != NULL && S->opts->netsor_plus;
    walker W = {.C = C};
    int st = prepass(&W, ast->stmts, ast->nstmts, 0);
    if (st)
        return st;
    st = walk(&W, ast->stmts, ast->nstmts);
    if (st)
        return st;
    if (S->opts != NULL) {
        for (int i = 0; i < S->opts->nsets; i++) {
            const char *name = S->opts->sets[i].name;
            int p = name != NULL ? nsr_sym_find(C, name) : -1;
            if (p < 0 || C->sym[p].kind != NSR_SYM_PARAM) {
                char list[256];
                size_t k = 0;
                list[0] = '\0';
                for (int j = 0; j < C->nsym && k < sizeof list; j++)
                    if (C->sym[j].kind == NSR_SYM_PARAM)
                        k += (size_t)snprintf(list + k, sizeof list - k, "%s%s", k ? ", " : "",
                                              C->sym[j].name);
                if (!S->failed)
                    TPK_ERROR(S->ctx, TPK_EINVAL, "%s: --set %s: unknown parameter '%s' (%s%s)",
                              S->file, name ? name : "(null)", name ? name : "(null)",
                              k ? "the program's parameters: " : "the program has no parameters",
                              list);
                S->failed = 1;
                return TPK_EINVAL;
            }
        }
    }
    if (C->input_sym < 0)
        return nsr_error(S, TPK_ETYPE, 1, 1, "the program declares no input (write 'input x : d')");
    return TPK_OK;
}
