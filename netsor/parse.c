/* NETSOR front end, stage 2: the recursive-descent parser (tokens → AST). Each parse function
 * opens with the grammar rule it implements (docs/netsor.md has the whole EBNF). Index binders
 * in targets (`h[t in 1..T] = ...`) are desugared here into `for` blocks. */
#include "netsor-impl.h"

#include <string.h>

typedef struct parser {
    nsr_state *S;
    const nsr_token *tok;
    int ntok;
    int pos;
    int depth;
    int range_hi; /* parsing a loop range's upper bound: a name 'by' ends it */
} parser;

static const nsr_token *peek(const parser *P, int k)
{
    int i = P->pos + k;
    return &P->tok[i < P->ntok ? i : P->ntok - 1];
}

static const nsr_token *cur(const parser *P)
{
    return peek(P, 0);
}

static void advance(parser *P)
{
    if (P->pos < P->ntok - 1)
        P->pos++;
}

static int is_name(const nsr_token *t, const char *s)
{
    return t->kind == NSR_T_NAME && strcmp(t->text, s) == 0;
}

static int syntax_error(parser *P, const nsr_token *t, const char *expected)
{
    if (t->kind == NSR_T_NAME)
        return nsr_error(P->S, TPK_ESYNTAX, t->line, t->col, "expected %s near '%s'", expected, t->text);
    return nsr_error(P->S, TPK_ESYNTAX, t->line, t->col, "expected %s near %s", expected,
                     nsr_tok_name(t->kind));
}

static int expect(parser *P, int kind, const char *what)
{
    if (cur(P)->kind != kind)
        return syntax_error(P, cur(P), what);
    advance(P);
    return TPK_OK;
}

static void *new_node(parser *P, size_t size)
{
    void *p = nsr_alloc(P->S->arena, size);
    if (p == NULL)
        nsr_oom(P->S);
    return p;
}

static nsr_expr *new_expr(parser *P, int kind, const nsr_token *at)
{
    nsr_expr *e = new_node(P, sizeof *e);
    if (e == NULL)
        return NULL;
    e->kind = kind;
    e->line = at->line;
    e->col = at->col;
    e->start = at->start;
    e->sym = -1;
    return e;
}

static void finish(parser *P, nsr_expr *e)
{
    if (e != NULL && P->pos > 0)
        e->end = P->tok[P->pos - 1].end;
}

/* Growable pointer list in the arena. */
typedef struct plist {
    void **v;
    int n, cap;
} plist;

static int plist_push(parser *P, plist *l, void *x)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 4;
        void **v = nsr_alloc(P->S->arena, (size_t)cap * sizeof *v);
        if (v == NULL)
            return nsr_oom(P->S);
        if (l->n)
            memcpy(v, l->v, (size_t)l->n * sizeof *v);
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = x;
    return TPK_OK;
}

static nsr_expr *expr(parser *P);

static int starts_primary(const nsr_token *t)
{
    return t->kind == NSR_T_NAME || t->kind == NSR_T_LP;
}

/* exprlist = expr { ',' expr }   (closing token `close`) */
static int exprlist(parser *P, int close, const char *what, nsr_expr ***out, int *n)
{
    plist l = {0};
    if (cur(P)->kind != close) {
        for (;;) {
            nsr_expr *e = expr(P);
            if (e == NULL || plist_push(P, &l, e))
                return TPK_ESYNTAX;
            if (cur(P)->kind != NSR_T_COMMA)
                break;
            advance(P);
        }
    }
    if (expect(P, close, what))
        return TPK_ESYNTAX;
    *out = (nsr_expr **)l.v;
    *n = l.n;
    return TPK_OK;
}

/* sum     = 'sum' '(' binder { ',' binder } ( ':' | ',' ) expr ')'
 * softmax = 'softmax' '(' binder ':' expr ')'
 * binder  = NAME 'in' expr '..' expr
 * An index sum (binder = each value of the inclusive range; an empty range is 0), written for
 * attention and convolutions: sum(j in 1..i: a[i, j] * k[j]), sum(i in 0..2, j in 0..2: F[i, j]
 * h[r + i, s + j]); several binders nest. softmax(j in lo..hi: s[j]) is, at the value of the
 * enclosing index j, exp(s[j]) / sum(j' in lo..hi: exp(s[j'])): a causal mask is the range
 * 1..i (docs/netsor.md). The older form sum(j in lo..hi, body) stays valid. */
static nsr_expr *binder_expr(parser *P, int kind)
{
    nsr_expr *e = new_expr(P, kind, cur(P));
    if (e == NULL)
        return NULL;
    e->name = cur(P)->text;
    advance(P); /* NAME */
    advance(P); /* in */
    e->args = new_node(P, 2 * sizeof *e->args);
    if (e->args == NULL)
        return NULL;
    e->nargs = 2;
    const char *what = kind == NSR_E_SUM ? "'..' in sum(j in lo..hi: ...)"
                                         : "'..' in softmax(j in lo..hi: ...)";
    if ((e->args[0] = expr(P)) == NULL || expect(P, NSR_T_DOTDOT, what) ||
        (e->args[1] = expr(P)) == NULL)
        return NULL;
    if (kind == NSR_E_SUM && cur(P)->kind == NSR_T_COMMA && peek(P, 1)->kind == NSR_T_NAME &&
        is_name(peek(P, 2), "in")) {
        advance(P); /* , */
        if ((e->a = binder_expr(P, NSR_E_SUM)) == NULL)
            return NULL;
        finish(P, e);
        return e;
    }
    if (cur(P)->kind == NSR_T_COLON || (kind == NSR_E_SUM && cur(P)->kind == NSR_T_COMMA)) {
        advance(P);
    } else {
        expect(P, NSR_T_COLON, kind == NSR_E_SUM ? "':' (or ',') after the range of sum(...)"
                                                 : "':' after the range of softmax(...)");
        return NULL;
    }
    if ((e->a = expr(P)) == NULL || expect(P, NSR_T_RP, "')'"))
        return NULL;
    finish(P, e);
    return e;
}

static nsr_expr *sum_expr(parser *P, int kind)
{
    const nsr_token *t = cur(P);
    advance(P); /* sum / softmax */
    advance(P); /* ( */
    nsr_expr *e = binder_expr(P, kind);
    if (e != NULL) { /* the outer node spans the whole call */
        e->line = t->line;
        e->col = t->col;
        e->start = t->start;
    }
    return e;
}

/* primary = NUMBER | NAME [ '[' expr { ',' expr } ']' ] [ '(' [ expr { ',' expr } ] ')' ]
 *         | '(' expr ')' */
static nsr_expr *primary(parser *P)
{
    const nsr_token *t = cur(P);
    if (t->kind == NSR_T_NUM) {
        nsr_expr *e = new_expr(P, NSR_E_NUM, t);
        if (e == NULL)
            return NULL;
        e->num = t->num;
        advance(P);
        finish(P, e);
        return e;
    }
    if (t->kind == NSR_T_LP) {
        advance(P);
        nsr_expr *e = expr(P);
        if (e == NULL || expect(P, NSR_T_RP, "')'"))
            return NULL;
        return e;
    }
    if (t->kind == NSR_T_HOLE) {
        nsr_error(P->S, TPK_ESYNTAX, t->line, t->col,
                  "a hole '_' may only stand for a dimension in a declaration");
        return NULL;
    }
    if (t->kind != NSR_T_NAME) {
        syntax_error(P, t, "an expression");
        return NULL;
    }
    if ((is_name(t, "sum") || is_name(t, "softmax")) && peek(P, 1)->kind == NSR_T_LP &&
        peek(P, 2)->kind == NSR_T_NAME && is_name(peek(P, 3), "in"))
        return sum_expr(P, is_name(t, "sum") ? NSR_E_SUM : NSR_E_SOFTMAX);
    nsr_expr *e = new_expr(P, NSR_E_NAME, t);
    if (e == NULL)
        return NULL;
    e->name = t->text;
    advance(P);
    if (cur(P)->kind == NSR_T_LB) {
        advance(P);
        if (cur(P)->kind == NSR_T_RB) {
            syntax_error(P, cur(P), "an index");
            return NULL;
        }
        if (exprlist(P, NSR_T_RB, "']'", &e->idx, &e->nidx))
            return NULL;
        if (e->nidx > NSR_MAX_INDICES) {
            nsr_error(P->S, TPK_ESYNTAX, e->line, e->col, "at most %d indices are supported",
                      NSR_MAX_INDICES);
            return NULL;
        }
    }
    if (cur(P)->kind == NSR_T_LP) {
        advance(P);
        e->kind = NSR_E_CALL;
        if (exprlist(P, NSR_T_RP, "')'", &e->args, &e->nargs))
            return NULL;
    }
    finish(P, e);
    return e;
}

/* postfix = primary { "'" } */
static nsr_expr *postfix(parser *P)
{
    const nsr_token *start = cur(P);
    nsr_expr *e = primary(P);
    while (e != NULL && cur(P)->kind == NSR_T_QUOTE) {
        nsr_expr *t = new_expr(P, NSR_E_TRANSPOSE, start);
        if (t == NULL)
            return NULL;
        t->a = e;
        advance(P);
        finish(P, t);
        e = t;
    }
    return e;
}

/* power = postfix [ '^' [ '-' ] postfix ] */
static nsr_expr *power(parser *P)
{
    const nsr_token *start = cur(P);
    nsr_expr *e = postfix(P);
    if (e == NULL || cur(P)->kind != NSR_T_CARET)
        return e;
    advance(P);
    nsr_expr *b;
    if (cur(P)->kind == NSR_T_MINUS) {
        const nsr_token *m = cur(P);
        advance(P);
        b = new_expr(P, NSR_E_NEG, m);
        if (b == NULL || (b->a = postfix(P)) == NULL)
            return NULL;
        finish(P, b);
    } else if ((b = postfix(P)) == NULL) {
        return NULL;
    }
    nsr_expr *p = new_expr(P, NSR_E_BIN, start);
    if (p == NULL)
        return NULL;
    p->op = NSR_T_CARET;
    p->a = e;
    p->b = b;
    finish(P, p);
    return p;
}

/* apply = power [ apply ]        juxtaposition is MatMul: `W h`, `W2 W1 h` = W2 (W1 h) */
static nsr_expr *apply(parser *P)
{
    const nsr_token *start = cur(P);
    if (++P->depth > NSR_MAX_DEPTH) {
        nsr_error(P->S, TPK_ESYNTAX, start->line, start->col, "expression nested too deeply");
        return NULL;
    }
    nsr_expr *e = power(P);
    if (e != NULL && starts_primary(cur(P)) && !(P->range_hi && is_name(cur(P), "by"))) {
        nsr_expr *a = new_expr(P, NSR_E_APPLY, start);
        if (a == NULL)
            return NULL;
        a->a = e;
        if ((a->b = apply(P)) == NULL)
            return NULL;
        finish(P, a);
        e = a;
    }
    P->depth--;
    return e;
}

/* unary = '-' unary | apply */
static nsr_expr *unary(parser *P)
{
    const nsr_token *t = cur(P);
    if (t->kind == NSR_T_MINUS || t->kind == NSR_T_PLUS) {
        if (++P->depth > NSR_MAX_DEPTH) {
            nsr_error(P->S, TPK_ESYNTAX, t->line, t->col, "expression nested too deeply");
            return NULL;
        }
        advance(P);
        nsr_expr *a = unary(P);
        P->depth--;
        if (a == NULL || t->kind == NSR_T_PLUS)
            return a;
        nsr_expr *e = new_expr(P, NSR_E_NEG, t);
        if (e == NULL)
            return NULL;
        e->a = a;
        finish(P, e);
        return e;
    }
    return apply(P);
}

/* term = unary { ('*' | '/') unary } */
static nsr_expr *term(parser *P)
{
    const nsr_token *start = cur(P);
    nsr_expr *e = unary(P);
    while (e != NULL && (cur(P)->kind == NSR_T_STAR || cur(P)->kind == NSR_T_SLASH)) {
        nsr_expr *b = new_expr(P, NSR_E_BIN, start);
        if (b == NULL)
            return NULL;
        b->op = cur(P)->kind;
        advance(P);
        b->a = e;
        if ((b->b = unary(P)) == NULL)
            return NULL;
        finish(P, b);
        e = b;
    }
    return e;
}

/* expr = term { ('+' | '-') term } */
static nsr_expr *expr(parser *P)
{
    const nsr_token *start = cur(P);
    if (++P->depth > NSR_MAX_DEPTH) {
        nsr_error(P->S, TPK_ESYNTAX, start->line, start->col, "expression nested too deeply");
        return NULL;
    }
    nsr_expr *e = term(P);
    while (e != NULL && (cur(P)->kind == NSR_T_PLUS || cur(P)->kind == NSR_T_MINUS)) {
        nsr_expr *b = new_expr(P, NSR_E_BIN, start);
        if (b == NULL)
            return NULL;
        b->op = cur(P)->kind;
        advance(P);
        b->a = e;
        if ((b->b = term(P)) == NULL)
            return NULL;
        finish(P, b);
        e = b;
    }
    P->depth--;
    return e;
}

/* ---- Statements ------------------------------------------------------------------------------ */

static nsr_stmt *new_stmt(parser *P, int kind, const nsr_token *at)
{
    nsr_stmt *s = new_node(P, sizeof *s);
    if (s == NULL)
        return NULL;
    s->kind = kind;
    s->line = at->line;
    s->col = at->col;
    s->fam = -1;
    return s;
}

static int take_name(parser *P, nsr_stmt *s, const char *what)
{
    const nsr_token *t = cur(P);
    if (t->kind != NSR_T_NAME)
        return syntax_error(P, t, what);
    s->name = t->text;
    s->name_line = t->line;
    s->name_col = t->col;
    advance(P);
    return TPK_OK;
}

/* range = expr '..' expr [ 'by' ( '1' | '-1' ) ]   ('by' only for a loop: the order of its
 * iterations; the range, the set of indices, stays lo..hi) */
static int range(parser *P, nsr_stmt *s, int loop)
{
    s->range_start = cur(P)->start;
    if ((s->lo = expr(P)) == NULL || expect(P, NSR_T_DOTDOT, "'..' in a range lo..hi"))
        return TPK_ESYNTAX;
    P->range_hi = 1;
    s->hi = expr(P);
    P->range_hi = 0;
    if (s->hi == NULL)
        return TPK_ESYNTAX;
    s->range_end = P->tok[P->pos - 1].end;
    if (is_name(cur(P), "by")) {
        const nsr_token *by = cur(P);
        if (!loop)
            return nsr_error(P->S, TPK_ESYNTAX, by->line, by->col,
                             "an input's steps have no order to reverse: 'by' belongs to a loop "
                             "('for t in 1..T by -1')");
        advance(P);
        int neg = cur(P)->kind == NSR_T_MINUS;
        if (neg)
            advance(P);
        const nsr_token *t = cur(P);
        if (t->kind != NSR_T_NUM || t->num != 1.0)
            return nsr_error(P->S, TPK_ESYNTAX, by->line, by->col,
                             "a loop runs 'by 1' (ascending, the default) or 'by -1' (from hi "
                             "down to lo)");
        advance(P);
        s->down = neg;
    }
    return TPK_OK;
}

/* dim = NAME | '_' */
static int dim(parser *P, nsr_dim *d)
{
    const nsr_token *t = cur(P);
    d->line = t->line;
    d->col = t->col;
    d->node = -1;
    if (t->kind == NSR_T_HOLE) {
        d->name = NULL;
    } else if (t->kind == NSR_T_NAME) {
        d->name = t->text;
    } else {
        return syntax_error(P, t, "a width symbol or '_'");
    }
    advance(P);
    return TPK_OK;
}

/* targets = '[' target { ',' target } ']'      target = NAME 'in' range | expr
 * Binders become enclosing `for` statements (returned outermost first in `fors`). */
static int targets(parser *P, nsr_stmt *s, plist *fors)
{
    if (cur(P)->kind != NSR_T_LB)
        return TPK_OK;
    advance(P);
    plist idx = {0};
    for (;;) {
        const nsr_token *t = cur(P);
        if (t->kind == NSR_T_NAME && is_name(peek(P, 1), "in")) {
            nsr_stmt *f = new_stmt(P, NSR_S_FOR, t);
            if (f == NULL || take_name(P, f, "a loop variable"))
                return TPK_ESYNTAX;
            advance(P); /* in */
            if (range(P, f, 1) || plist_push(P, fors, f))
                return TPK_ESYNTAX;
            f->generated = 1;
            nsr_expr *v = new_expr(P, NSR_E_NAME, t);
            if (v == NULL || plist_push(P, &idx, v))
                return TPK_ESYNTAX;
            v->name = t->text;
            v->end = t->end;
        } else {
            nsr_expr *e = expr(P);
            if (e == NULL || plist_push(P, &idx, e))
                return TPK_ESYNTAX;
        }
        if (cur(P)->kind != NSR_T_COMMA)
            break;
        advance(P);
    }
    if (expect(P, NSR_T_RB, "']'"))
        return TPK_ESYNTAX;
    if (idx.n > NSR_MAX_INDICES)
        return nsr_error(P->S, TPK_ESYNTAX, s->line, s->col, "at most %d indices are supported",
                         NSR_MAX_INDICES);
    s->idx = (nsr_expr **)idx.v;
    s->nidx = idx.n;
    return TPK_OK;
}

/* Wrap `s` in the binder loops collected by targets(). */
static nsr_stmt *wrap(parser *P, nsr_stmt *s, plist *fors)
{
    for (int i = fors->n - 1; i >= 0; i--) {
        nsr_stmt *f = fors->v[i];
        f->body = new_node(P, sizeof *f->body);
        if (f->body == NULL)
            return NULL;
        f->body[0] = s;
        f->nbody = 1;
        s = f;
    }
    return s;
}

static int block(parser *P, plist *out, int close);

/* stmt = 'param' NAME '=' expr
 *      | 'width' NAME { ',' NAME }
 *      | 'use' NAME '+'
 *      | 'input' NAME [ '[' NAME 'in' range ']' ] ':' dim
 *      | 'A' NAME [ targets ] ':' '(' dim ',' dim ')' '~' expr
 *      | 'G' NAME [ targets ] ':' dim '~' ( 'N' '(' expr ',' expr ')' | expr )
 *      | [ 'G' | 'H' | 'scalar' ] NAME [ targets ] '=' expr
 *      | 'output' NAME [ targets ] '=' expr
 *      | 'for' NAME 'in' range '{' block '}' */
static nsr_stmt *statement(parser *P)
{
    const nsr_token *t = cur(P);
    plist fors = {0};
    nsr_stmt *s;
    if (t->kind != NSR_T_NAME) {
        syntax_error(P, t, "a statement");
        return NULL;
    }
    if (is_name(t, "param")) {
        advance(P);
        if ((s = new_stmt(P, NSR_S_PARAM, t)) == NULL || take_name(P, s, "a parameter name") ||
            expect(P, NSR_T_EQ, "'=' and a default value") || (s->value = expr(P)) == NULL)
            return NULL;
        return s;
    }
    if (is_name(t, "width")) {
        advance(P);
        if ((s = new_stmt(P, NSR_S_WIDTH, t)) == NULL)
            return NULL;
        plist names = {0}, dims = {0};
        for (;;) {
            const nsr_token *n = cur(P);
            if (n->kind != NSR_T_NAME) {
                syntax_error(P, n, "a width symbol");
                return NULL;
            }
            nsr_dim *d = new_node(P, sizeof *d);
            if (d == NULL || plist_push(P, &names, (void *)n->text) || plist_push(P, &dims, d))
                return NULL;
            d->name = n->text;
            d->line = n->line;
            d->col = n->col;
            advance(P);
            if (cur(P)->kind != NSR_T_COMMA)
                break;
            advance(P);
        }
        s->nnames = names.n;
        s->names = (const char **)names.v;
        s->dims = new_node(P, (size_t)dims.n * sizeof *s->dims);
        if (s->dims == NULL)
            return NULL;
        for (int i = 0; i < dims.n; i++)
            s->dims[i] = *(nsr_dim *)dims.v[i];
        return s;
    }
    if (is_name(t, "use")) {
        advance(P);
        if ((s = new_stmt(P, NSR_S_USE, t)) == NULL || take_name(P, s, "a feature name (netsor+)"))
            return NULL;
        if (strcmp(s->name, "netsor") != 0 || cur(P)->kind != NSR_T_PLUS) {
            nsr_error(P->S, TPK_ESYNTAX, s->name_line, s->name_col,
                      "unknown feature '%s' (the only one is 'use netsor+')", s->name);
            return NULL;
        }
        advance(P);
        return s;
    }
    if (is_name(t, "input")) {
        advance(P);
        if ((s = new_stmt(P, NSR_S_INPUT, t)) == NULL || take_name(P, s, "an input name"))
            return NULL;
        if (cur(P)->kind == NSR_T_LB) {
            advance(P);
            nsr_stmt tmp = {0};
            if (take_name(P, &tmp, "a binder 't in lo..hi'"))
                return NULL;
            if (!is_name(cur(P), "in")) {
                syntax_error(P, cur(P), "'in' (a sequence input is written x[t in 1..T])");
                return NULL;
            }
            advance(P);
            if (range(P, s, 0) || expect(P, NSR_T_RB, "']'"))
                return NULL;
        }
        if (expect(P, NSR_T_COLON, "':' and the input dimension (input x : d)") || dim(P, &s->rows))
            return NULL;
        return s;
    }
    if (is_name(t, "for")) {
        advance(P);
        if ((s = new_stmt(P, NSR_S_FOR, t)) == NULL || take_name(P, s, "a loop variable"))
            return NULL;
        if (!is_name(cur(P), "in")) {
            syntax_error(P, cur(P), "'in'");
            return NULL;
        }
        advance(P);
        if (range(P, s, 1))
            return NULL;
        while (cur(P)->kind == NSR_T_NL)
            advance(P);
        if (expect(P, NSR_T_LC, "'{'"))
            return NULL;
        if (++P->depth > NSR_MAX_DEPTH) {
            nsr_error(P->S, TPK_ESYNTAX, t->line, t->col, "blocks nested too deeply");
            return NULL;
        }
        plist body = {0};
        if (block(P, &body, NSR_T_RC))
            return NULL;
        P->depth--;
        advance(P); /* } */
        s->body = (nsr_stmt **)body.v;
        s->nbody = body.n;
        return s;
    }
    if (is_name(t, "output")) {
        advance(P);
        if ((s = new_stmt(P, NSR_S_OUTPUT, t)) == NULL || take_name(P, s, "an output name") ||
            targets(P, s, &fors) || expect(P, NSR_T_EQ, "'=' readout(var, sigma_v2)") ||
            (s->value = expr(P)) == NULL)
            return NULL;
        return wrap(P, s, &fors);
    }
    const nsr_token *n1 = peek(P, 1);
    if (is_name(t, "A") && n1->kind == NSR_T_NAME) {
        advance(P);
        if ((s = new_stmt(P, NSR_S_ADECL, t)) == NULL || take_name(P, s, "an A-var name") ||
            targets(P, s, &fors) || expect(P, NSR_T_COLON, "':' (A W : (rows, cols) ~ variance)") ||
            expect(P, NSR_T_LP, "'(' (A W : (rows, cols) ~ variance)") || dim(P, &s->rows) ||
            expect(P, NSR_T_COMMA, "','") || dim(P, &s->cols) || expect(P, NSR_T_RP, "')'") ||
            expect(P, NSR_T_TILDE, "'~' and the variance sigma^2 (entries N(0, sigma^2/fan_in))") ||
            (s->var = expr(P)) == NULL)
            return NULL;
        return wrap(P, s, &fors);
    }
    int annot = NSR_ANN_NONE;
    if (n1->kind == NSR_T_NAME) {
        if (is_name(t, "G"))
            annot = NSR_ANN_G;
        else if (is_name(t, "H"))
            annot = NSR_ANN_H;
        else if (is_name(t, "scalar"))
            annot = NSR_ANN_SCALAR;
        if (annot != NSR_ANN_NONE)
            advance(P);
    }
    if ((s = new_stmt(P, NSR_S_DEF, t)) == NULL || take_name(P, s, "a statement") ||
        targets(P, s, &fors))
        return NULL;
    s->annot = annot;
    if (annot == NSR_ANN_G && cur(P)->kind == NSR_T_COLON) {
        /* initial G-var: G b : n ~ N(mean, var) */
        s->kind = NSR_S_GDECL;
        advance(P);
        if (dim(P, &s->rows) || expect(P, NSR_T_TILDE, "'~' N(mean, variance)"))
            return NULL;
        const nsr_token *d = cur(P);
        if (is_name(d, "N") && peek(P, 1)->kind == NSR_T_LP) {
            advance(P);
            advance(P);
            if ((s->mean = expr(P)) == NULL || expect(P, NSR_T_COMMA, "',' in N(mean, variance)") ||
                (s->var = expr(P)) == NULL || expect(P, NSR_T_RP, "')'"))
                return NULL;
        } else if ((s->var = expr(P)) == NULL) {
            return NULL;
        }
        return wrap(P, s, &fors);
    }
    if (cur(P)->kind != NSR_T_EQ) {
        if (annot == NSR_ANN_NONE && cur(P)->kind == NSR_T_NAME)
            nsr_error(P->S, TPK_ESYNTAX, t->line, t->col,
                      "unknown statement '%s' (expected param, width, use, input, A, G, H, scalar, "
                      "output, for or a definition 'name = ...')", t->text);
        else
            syntax_error(P, cur(P), annot == NSR_ANN_G ? "'=' or ':'" : "'='");
        return NULL;
    }
    advance(P);
    if ((s->value = expr(P)) == NULL)
        return NULL;
    return wrap(P, s, &fors);
}

/* block = { sep } { stmt sep { sep } }     ends before `close` (EOF or '}') */
static int block(parser *P, plist *out, int close)
{
    for (;;) {
        while (cur(P)->kind == NSR_T_NL || cur(P)->kind == NSR_T_SEMI)
            advance(P);
        if (cur(P)->kind == close)
            return TPK_OK;
        if (cur(P)->kind == NSR_T_EOF)
            return syntax_error(P, cur(P), "'}'");
        nsr_stmt *s = statement(P);
        if (s == NULL || plist_push(P, out, s))
            return TPK_ESYNTAX;
        int k = cur(P)->kind;
        if (k != NSR_T_NL && k != NSR_T_SEMI && k != close && s->kind != NSR_S_USE)
            return syntax_error(P, cur(P), "end of statement");
    }
}

/* program = block EOF */
int nsr_parse(nsr_state *S, const nsr_token *toks, int ntoks, nsr_ast *ast)
{
    parser P = {.S = S, .tok = toks, .ntok = ntoks};
    plist l = {0};
    if (block(&P, &l, NSR_T_EOF))
        return S->ctx->status ? S->ctx->status : TPK_ESYNTAX;
    ast->stmts = (nsr_stmt **)l.v;
    ast->nstmts = l.n;
    return TPK_OK;
}

/* value = expr EOF          (the right-hand side of `--set name=value`) */
nsr_expr *nsr_parse_value(nsr_state *S, const char *text, int *status)
{
    nsr_token *toks;
    int ntoks;
    *status = nsr_lex(S, text, &toks, &ntoks);
    if (*status)
        return NULL;
    parser P = {.S = S, .tok = toks, .ntok = ntoks};
    nsr_expr *e = expr(&P);
    while (e != NULL && cur(&P)->kind == NSR_T_NL)
        advance(&P);
    if (e != NULL && cur(&P)->kind != NSR_T_EOF) {
        syntax_error(&P, cur(&P), "end of value");
        e = NULL;
    }
    if (e == NULL)
        *status = S->ctx->status ? S->ctx->status : TPK_ESYNTAX;
    return e;
}
