/* NETSOR front end, stage 4: elaboration (checked AST → straight-line IR, theory §1.3, §1.10).
 * It evaluates parameters, unrolls `for` loops, instantiates families member by member,
 * applies the per-instruction typing and width rules (G/H/A types, width unification with
 * provenance, index ranges), inlines H-vars into Nonlin bodies so that every Nonlin reads
 * G-vars only, hoists MatMuls and Moments out of expressions into temporaries (%1, %2, ...),
 * folds constants (h[0] = 0: MatMul of 0 is 0), and emits the tpk_program. */
#include "netsor-impl.h"
#include "tpk/alloc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NSR_RPN_HVAR 64 /* internal leaf: an H-var not inlined yet (never reaches the IR) */

typedef struct elab elab;

typedef struct member {
    int fam, nidx;
    int idx[NSR_MAX_INDICES];
    int kind;
    int var;          /* M_VAR, M_GDECL once emitted: IR var id */
    double value;     /* M_CONST */
    double mean, v;   /* M_GDECL: N(mean, v); M_AVAR: v */
    int aid;          /* M_AVAR: avar or embed id, -1 until first use */
    int line, col;
} member;

typedef struct phi_entry {
    char *spec;
    tpk_phi *phi;
} phi_entry;

struct elab {
    nsr_state *S;
    nsr_check *C;
    tpk_program *p;
    int capvar, capinstr, capavar, capembed, capout;
    int *var_node;     /* width node of each IR var (-1 for scalars) */
    int *var_line;
    int capnode, capline;
    /* symbol environment: loop and parameter values */
    double *num;
    const char **spec; /* function parameters: spec string, else NULL */
    int *have;         /* parameter / loop evaluated */
    /* members: open hashing */
    member *mem;
    int nmem, capmem;
    int *bucket;
    int nbucket;
    int ntemps;
    long steps;
    int input_lo;
    phi_entry *phis;
    int nphis, capphis;
    /* rolled mode (issue 14): statements are recorded as family instructions, not unrolled */
    nsr_rolled *R;
    int ndom;
    const nsr_stmt *dom[NSR_MAX_INDICES];
    long dom_size;     /* upper bound of the current domain's size */
};

/* ---- RPN buffers ------------------------------------------------------------------------------ */
typedef struct rbuf {
    tpk_rpn_node *n;
    int len, cap;
} rbuf;

static void rb_free(elab *E, rbuf *r)
{
    tpk_free(E->S->ctx, r->n);
    r->n = NULL;
    r->len = r->cap = 0;
}

static int rb_reserve(elab *E, rbuf *r, int extra)
{
    if (extra > NSR_MAX_BODY || r->len > NSR_MAX_BODY - extra)
        return TPK_EINVAL;
    if (r->len + extra <= r->cap)
        return TPK_OK;
    int cap = r->cap ? r->cap : 8;
    while (cap < r->len + extra)
        cap *= 2;
    tpk_rpn_node *n = tpk_realloc(E->S->ctx, r->n, (size_t)cap * sizeof *n);
    if (n == NULL)
        return TPK_ENOMEM;
    r->n = n;
    r->cap = cap;
    return TPK_OK;
}

static int rb_push(elab *E, rbuf *r, int op, int var, double value, const tpk_phi *fn)
{
    int st = rb_reserve(E, r, 1);
    if (st)
        return st;
    tpk_rpn_node *x = &r->n[r->len++];
    x->op = op;
    x->var = var;
    x->value = value;
    x->fn = fn;
    return TPK_OK;
}

static int rb_append(elab *E, rbuf *r, const tpk_rpn_node *n, int len)
{
    int st = rb_reserve(E, r, len);
    if (st)
        return st;
    memcpy(r->n + r->len, n, (size_t)len * sizeof *n);
    r->len += len;
    return TPK_OK;
}

static int rb_is_const(const rbuf *r, double *v)
{
    if (r->len == 1 && r->n[0].op == TPK_RPN_CONST) {
        if (v)
            *v = r->n[0].value;
        return 1;
    }
    return 0;
}

/* ---- Elaboration state ---------------------------------------------------------------------- */
enum { M_VAR, M_CONST, M_AVAR, M_GDECL, M_OUT };


static int oom(elab *E)
{
    return nsr_oom(E->S);
}

static int grow(elab *E, void **p, int *cap, int need, size_t elt)
{
    if (need <= *cap)
        return TPK_OK;
    int c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *q = tpk_realloc(E->S->ctx, *p, (size_t)c * elt);
    if (q == NULL)
        return TPK_ENOMEM;
    memset((char *)q + (size_t)*cap * elt, 0, (size_t)(c - *cap) * elt);
    *p = q;
    *cap = c;
    return TPK_OK;
}

/* ---- Members ---------------------------------------------------------------------------------- */
static unsigned hash_key(int fam, int nidx, const int *idx)
{
    unsigned h = 2166136261u ^ (unsigned)fam;
    for (int i = 0; i < nidx; i++)
        h = (h ^ (unsigned)idx[i]) * 16777619u;
    return h;
}

static member *find_member(elab *E, int fam, int nidx, const int *idx)
{
    if (E->nbucket == 0)
        return NULL;
    unsigned h = hash_key(fam, nidx, idx) & (unsigned)(E->nbucket - 1);
    for (;;) {
        int m = E->bucket[h];
        if (m < 0)
            return NULL;
        member *x = &E->mem[m];
        if (x->fam == fam && x->nidx == nidx && memcmp(x->idx, idx, (size_t)nidx * sizeof *idx) == 0)
            return x;
        h = (h + 1) & (unsigned)(E->nbucket - 1);
    }
}

static member *add_member(elab *E, int fam, int nidx, const int *idx, int kind, int line, int col)
{
    if (2 * (E->nmem + 1) > E->nbucket) {
        int nb = E->nbucket ? 2 * E->nbucket : 256;
        int *b = tpk_malloc(E->S->ctx, (size_t)nb * sizeof *b);
        if (b == NULL)
            return NULL;
        for (int i = 0; i < nb; i++)
            b[i] = -1;
        for (int m = 0; m < E->nmem; m++) {
            unsigned h = hash_key(E->mem[m].fam, E->mem[m].nidx, E->mem[m].idx) & (unsigned)(nb - 1);
            while (b[h] >= 0)
                h = (h + 1) & (unsigned)(nb - 1);
            b[h] = m;
        }
        tpk_free(E->S->ctx, E->bucket);
        E->bucket = b;
        E->nbucket = nb;
    }
    if (grow(E, (void **)&E->mem, &E->capmem, E->nmem + 1, sizeof *E->mem))
        return NULL;
    member *x = &E->mem[E->nmem];
    memset(x, 0, sizeof *x);
    x->fam = fam;
    x->nidx = nidx;
    memcpy(x->idx, idx, (size_t)nidx * sizeof *idx);
    x->kind = kind;
    x->var = -1;
    x->aid = -1;
    x->line = line;
    x->col = col;
    unsigned h = hash_key(fam, nidx, idx) & (unsigned)(E->nbucket - 1);
    while (E->bucket[h] >= 0)
        h = (h + 1) & (unsigned)(E->nbucket - 1);
    E->bucket[h] = E->nmem++;
    return x;
}

char *nsr_member_name(tpk_ctx *ctx, const char *base, int nidx, const int *idx)
{
    char buf[256];
    size_t k = (size_t)snprintf(buf, sizeof buf, "%s", base);
    for (int i = 0; i < nidx && k < sizeof buf; i++)
        k += (size_t)snprintf(buf + k, sizeof buf - k, "%s%d", i ? "," : "[", idx[i]);
    if (nidx && k < sizeof buf)
        snprintf(buf + k, sizeof buf - k, "]");
    return tpk_strdup(ctx, buf);
}

/* ---- IR emission ------------------------------------------------------------------------------- */
static int new_var(elab *E, char *name, int type, int node, int line)
{
    tpk_program *p = E->p;
    if (name == NULL)
        return oom(E), -1;
    if (grow(E, (void **)&p->var, &E->capvar, p->nvars + 1, sizeof *p->var) ||
        grow(E, (void **)&E->var_node, &E->capnode, p->nvars + 1, sizeof *E->var_node) ||
        grow(E, (void **)&E->var_line, &E->capline, p->nvars + 1, sizeof *E->var_line)) {
        tpk_free(E->S->ctx, name);
        return oom(E), -1;
    }
    tpk_var *v = &p->var[p->nvars];
    v->name = name;
    v->type = type;
    v->width = -1;
    v->def = -1;
    E->var_node[p->nvars] = node;
    E->var_line[p->nvars] = line;
    return p->nvars++;
}

static char *temp_name(elab *E)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%%%d", ++E->ntemps);
    return tpk_strdup(E->S->ctx, buf);
}

static tpk_instr *new_instr(elab *E, int op, int out, int line, int col)
{
    tpk_program *p = E->p;
    if (p->ninstr >= NSR_MAX_INSTR) {
        E->S->too_large = 1;
        nsr_error(E->S, TPK_EINVAL, line, col, "program too large after unrolling (%d instructions)",
                  p->ninstr);
        return NULL;
    }
    if (grow(E, (void **)&p->instr, &E->capinstr, p->ninstr + 1, sizeof *p->instr)) {
        oom(E);
        return NULL;
    }
    tpk_instr *in = &p->instr[p->ninstr];
    memset(in, 0, sizeof *in);
    in->op = op;
    in->out = out;
    in->avar = -1;
    in->src = -1;
    in->line = line;
    in->col = col;
    p->var[out].def = p->ninstr++;
    return in;
}

/* ---- Width facts ---------------------------------------------------------------------------- */
static void var_fact(elab *E, int v, char *buf, size_t n)
{
    if (v < 0) {
        snprintf(buf, n, "the vector has width %s", "_");
        return;
    }
    snprintf(buf, n, "%s has width %s (from line %d)", E->p->var[v].name,
             nsr_uf_show(E->C, E->var_node[v]), E->var_line[v]);
}

/* All vector leaves of `r` must share one width; returns the node (or -1 if none). */
static int unify_leaves(elab *E, const rbuf *r, const char *what, int line, int col, int *status)
{
    int first = -1;
    *status = TPK_OK;
    for (int i = 0; i < r->len; i++) {
        const tpk_rpn_node *x = &r->n[i];
        if (x->op != TPK_RPN_GVAR && x->op != NSR_RPN_HVAR)
            continue;
        if (first < 0) {
            first = x->var;
            continue;
        }
        if (x->var == first)
            continue;
        char fa[256], fb[256];
        var_fact(E, first, fa, sizeof fa);
        var_fact(E, x->var, fb, sizeof fb);
        if ((*status = nsr_uf_unify(E->C, E->var_node[first], E->var_node[x->var], line, col, what,
                                    fa, fb)))
            return -1;
    }
    return first < 0 ? -1 : E->var_node[first];
}

/* ---- Phi instances ----------------------------------------------------------------------------- */
static const tpk_phi *get_phi(elab *E, const char *spec, int line, int col)
{
    for (int i = 0; i < E->nphis; i++)
        if (strcmp(E->phis[i].spec, spec) == 0)
            return E->phis[i].phi;
    if (E->S->reg == NULL) {
        nsr_error(E->S, TPK_ETYPE, line, col, "unknown function '%s': the function registry is "
                  "NULL, so no function is known", spec);
        return NULL;
    }
    tpk_ctx tmp;
    tpk_ctx_init_from(&tmp, E->S->ctx);
    tpk_phi *phi = tpk_phi_alloc(E->S->reg, spec, &tmp);
    if (phi == NULL) {
        nsr_error(E->S, tmp.status == TPK_ENOMEM ? TPK_ENOMEM : TPK_ETYPE, line, col,
                  "cannot instantiate function '%s': %s", spec,
                  tmp.msg[0] ? tmp.msg : tpk_strerror(tmp.status));
        return NULL;
    }
    if (grow(E, (void **)&E->phis, &E->capphis, E->nphis + 1, sizeof *E->phis)) {
        tpk_phi_free(phi);
        oom(E);
        return NULL;
    }
    char *s = tpk_strdup(E->S->ctx, spec);
    if (s == NULL) {
        tpk_phi_free(phi);
        oom(E);
        return NULL;
    }
    E->phis[E->nphis].spec = s;
    E->phis[E->nphis].phi = phi;
    E->nphis++;
    return phi;
}

/* ---- Expressions ---------------------------------------------------------------------------- */
static int elab_expr(elab *E, const nsr_expr *e, rbuf *out);
static int materialize(elab *E, rbuf *r, int annot, char *name, int fam_node, int line, int col,
                       const char *what);

static int eval_number(elab *E, const nsr_expr *e, const char *what, double *v)
{
    rbuf r = {0};
    int st = elab_expr(E, e, &r);
    if (st == TPK_OK && !rb_is_const(&r, v))
        st = nsr_error(E->S, TPK_ETYPE, e->line, e->col, "%s must be a number known before unrolling "
                       "(parameters, loop variables and constants)", what);
    rb_free(E, &r);
    if (st == TPK_OK && !isfinite(*v))
        st = nsr_error(E->S, TPK_ETYPE, e->line, e->col, "%s is not finite", what);
    return st;
}

static int eval_int(elab *E, const nsr_expr *e, const char *what, int *out)
{
    double v;
    int st = eval_number(E, e, what, &v);
    if (st)
        return st;
    if (v != floor(v) || fabs(v) > 1e8)
        return nsr_error(E->S, TPK_ETYPE, e->line, e->col, "%s must be an integer (got %g)", what, v);
    *out = (int)v;
    return TPK_OK;
}

static int eval_indices(elab *E, nsr_expr *const *idx, int nidx, int *out)
{
    for (int i = 0; i < nidx; i++)
        if (eval_int(E, idx[i], "an index", &out[i]))
            return TPK_ETYPE;
    return TPK_OK;
}

/* Collect "t = 1, i = 2" for the loop variables an expression's indices mention. */
static int loop_values(elab *E, const nsr_expr *e, char *buf, size_t n, int *k, int *lastsym)
{
    if (e == NULL)
        return 0;
    int found = 0;
    if (e->kind == NSR_E_NAME && e->sym >= 0 && E->C->sym[e->sym].kind == NSR_SYM_LOOP) {
        if (strstr(buf, E->C->sym[e->sym].name) == NULL && (size_t)*k < n)
            *k += snprintf(buf + *k, n - (size_t)*k, "%s%s = %d", *k ? ", " : "",
                           E->C->sym[e->sym].name, (int)E->num[e->sym]);
        *lastsym = e->sym;
        found = 1;
    }
    for (int i = 0; i < e->nidx; i++)
        found += loop_values(E, e->idx[i], buf, n, k, lastsym);
    found += loop_values(E, e->a, buf, n, k, lastsym);
    found += loop_values(E, e->b, buf, n, k, lastsym);
    return found;
}

/* The member that `e` names does not exist: explain with the family's ranges (theory §6). */
static int missing_member(elab *E, const nsr_expr *e, int fam, const int *idx, const char *verb)
{
    const nsr_sym *f = &E->C->sym[fam];
    char *key = nsr_member_name(E->S->ctx, f->name, e->nidx, idx);
    if (key == NULL)
        return oom(E);
    char loops[200];
    loops[0] = '\0';
    int k = 0, lastsym = -1;
    for (int i = 0; i < e->nidx; i++)
        loop_values(E, e->idx[i], loops, sizeof loops, &k, &lastsym);
    int len = e->end - e->start;
    if (len > 80 || len < 0)
        len = 80;
    const char *txt = E->S->src + e->start;
    int st;
    if (k > 0 && lastsym >= 0 && e->nidx >= 1 && idx[0] < (int)E->num[lastsym] &&
        f->kind != NSR_SYM_AFAM && f->kind != NSR_SYM_GFAM)
        st = nsr_error(E->S, TPK_ETYPE, e->line, e->col,
                       "%.*s with %s is out of range: %s is %s for %s (declare %s or start at %s = %d)",
                       len, txt, loops, f->name, verb, f->ranges, key, E->C->sym[lastsym].name,
                       (int)E->num[lastsym] + 1);
    else if (k > 0 && f->kind == NSR_SYM_DFAM)
        st = nsr_error(E->S, TPK_ETYPE, e->line, e->col,
                       "%.*s with %s refers to %s, which is not defined yet: %s is defined for %s "
                       "(a definition may only read earlier ones)", len, txt, loops, key, f->name,
                       f->ranges);
    else if (k > 0)
        st = nsr_error(E->S, TPK_ETYPE, e->line, e->col, "%.*s with %s is out of range: %s is %s for %s",
                       len, txt, loops, f->name, verb, f->ranges);
    else
        st = nsr_error(E->S, TPK_ETYPE, e->line, e->col, "%s is not %s: %s is %s for %s", key, verb,
                       f->name, verb, f->ranges);
    tpk_free(E->S->ctx, key);
    return st;
}

static member *lookup_member(elab *E, const nsr_expr *e, const char *verb)
{
    int idx[NSR_MAX_INDICES];
    if (eval_indices(E, e->idx, e->nidx, idx))
        return NULL;
    member *m = find_member(E, e->sym, e->nidx, idx);
    if (m == NULL)
        missing_member(E, e, e->sym, idx, verb);
    return m;
}

/* Initial G-var: the BIAS instruction is emitted at the first use of the member. */
static int use_gdecl(elab *E, member *m)
{
    if (m->var >= 0)
        return m->var;
    const nsr_sym *f = &E->C->sym[m->fam];
    int v = new_var(E, nsr_member_name(E->S->ctx, f->name, m->nidx, m->idx), TPK_VAR_G, f->node,
                    m->line);
    if (v < 0)
        return -1;
    tpk_instr *in = new_instr(E, TPK_OP_BIAS, v, m->line, m->col);
    if (in == NULL)
        return -1;
    in->mean = m->mean;
    in->var = m->v;
    m->var = v;
    return v;
}

static int push_var(elab *E, rbuf *out, int v)
{
    int op = E->p->var[v].type == TPK_VAR_G ? TPK_RPN_GVAR
             : E->p->var[v].type == TPK_VAR_H ? NSR_RPN_HVAR : TPK_RPN_SCALAR;
    if (rb_push(E, out, op, v, 0, NULL))
        return nsr_error(E->S, TPK_EINVAL, E->var_line[v], 1, "expression too large");
    return TPK_OK;
}

static int elab_name(elab *E, const nsr_expr *e, rbuf *out)
{
    const nsr_sym *y = &E->C->sym[e->sym];
    switch (y->kind) {
    case NSR_SYM_LOOP:
    case NSR_SYM_PARAM:
        if (!E->have[e->sym])
            return nsr_error(E->S, TPK_ETYPE, e->line, e->col, "'%s' has no value here", e->name);
        if (E->spec[e->sym] != NULL)
            return nsr_error(E->S, TPK_ETYPE, e->line, e->col,
                             "'%s' is a function parameter (= %s); call it: %s(x)", e->name,
                             E->spec[e->sym], e->name);
        return rb_push(E, out, TPK_RPN_CONST, -1, E->num[e->sym], NULL) ? oom(E) : TPK_OK;
    case NSR_SYM_FUNC:
        return nsr_error(E->S, TPK_ETYPE, e->line, e->col, "function '%s' used as a value; call it: %s(x)",
                         e->name, e->name);
    case NSR_SYM_GFAM: {
        member *m = lookup_member(E, e, "declared");
        if (m == NULL)
            return TPK_ETYPE;
        int v = use_gdecl(E, m);
        return v < 0 ? TPK_ENOMEM : push_var(E, out, v);
    }
    case NSR_SYM_DFAM: {
        member *m = lookup_member(E, e, "defined");
        if (m == NULL)
            return TPK_ETYPE;
        if (m->kind == M_CONST)
            return rb_push(E, out, TPK_RPN_CONST, -1, m->value, NULL) ? oom(E) : TPK_OK;
        return push_var(E, out, m->var);
    }
    default:
        return nsr_error(E->S, TPK_ETYPE, e->line, e->col, "'%s' cannot be used here", e->name);
    }
}

/* Linearity of an RPN body whose leaves are vars (atoms), constants and scalars.
 * Returns 0 constant, 1 affine in the atoms (constant coefficients), 2 otherwise; -1 out of
 * memory (reported). */
static int rpn_linearity(elab *E, const rbuf *r)
{
    struct lv {
        int k;
        double c;
    };
    struct lv *s = tpk_malloc(E->S->ctx, (size_t)(r->len + 1) * sizeof *s);
    if (s == NULL) /* no memory: an error (a guess would change the variable's type) */
        return oom(E), -1;
    int sp = 0;
    for (int i = 0; i < r->len; i++) {
        const tpk_rpn_node *x = &r->n[i];
        switch (x->op) {
        case TPK_RPN_CONST: s[sp].k = 0; s[sp].c = x->value; sp++; break;
        case TPK_RPN_GVAR: case NSR_RPN_HVAR: s[sp].k = 1; sp++; break;
        case TPK_RPN_SCALAR: s[sp].k = 2; sp++; break;
        case TPK_RPN_NEG: break;
        case TPK_RPN_CALL: if (s[sp - 1].k != 0) s[sp - 1].k = 2; break;
        case TPK_RPN_POWI:
            if (s[sp - 1].k == 1 && x->value != 1)
                s[sp - 1].k = 2;
            break;
        case TPK_RPN_ADD: case TPK_RPN_SUB:
            sp--;
            if (s[sp].k > s[sp - 1].k)
                s[sp - 1].k = s[sp].k;
            break;
        case TPK_RPN_MUL:
            sp--;
            if (s[sp].k == 2 || s[sp - 1].k == 2 || (s[sp].k == 1 && s[sp - 1].k == 1))
                s[sp - 1].k = 2;
            else if (s[sp].k == 1)
                s[sp - 1].k = 1;
            break;
        case TPK_RPN_DIV:
            sp--;
            if (s[sp].k != 0)
                s[sp - 1].k = 2;
            break;
        default: break;
        }
    }
    int k = sp == 1 ? s[0].k : 2;
    tpk_free(E->S->ctx, s);
    return k;
}

/* Evaluate an affine RPN with atom `one` set to 1 and every other atom to 0. */
static double rpn_eval_affine(const rbuf *r, int one, double *stack)
{
    int sp = 0;
    for (int i = 0; i < r->len; i++) {
        const tpk_rpn_node *x = &r->n[i];
        double a, b;
        switch (x->op) {
        case TPK_RPN_CONST: stack[sp++] = x->value; break;
        case TPK_RPN_GVAR: case NSR_RPN_HVAR: stack[sp++] = x->var == one ? 1.0 : 0.0; break;
        case TPK_RPN_NEG: stack[sp - 1] = -stack[sp - 1]; break;
        case TPK_RPN_POWI: /* affine only for exponent 1 on atoms, or constants */
            stack[sp - 1] = pow(stack[sp - 1], x->value);
            break;
        case TPK_RPN_CALL: stack[sp - 1] = tpk_phi_eval(x->fn, stack[sp - 1]); break;
        default:
            b = stack[--sp];
            a = stack[sp - 1];
            stack[sp - 1] = x->op == TPK_RPN_ADD ? a + b : x->op == TPK_RPN_SUB ? a - b
                            : x->op == TPK_RPN_MUL ? a * b : a / b;
        }
    }
    return sp == 1 ? stack[0] : NAN;
}

/* Distinct atoms (GVAR/HVAR leaves) in order of first appearance. */
static int rpn_atoms(elab *E, const rbuf *r, int **atoms, int *has_h)
{
    int n = 0;
    *has_h = 0;
    *atoms = tpk_malloc(E->S->ctx, (size_t)(r->len + 1) * sizeof **atoms);
    if (*atoms == NULL)
        return -1;
    for (int i = 0; i < r->len; i++) {
        if (r->n[i].op != TPK_RPN_GVAR && r->n[i].op != NSR_RPN_HVAR)
            continue;
        if (r->n[i].op == NSR_RPN_HVAR)
            *has_h = 1;
        int j;
        for (j = 0; j < n && (*atoms)[j] != r->n[i].var; j++)
            ;
        if (j == n)
            (*atoms)[n++] = r->n[i].var;
    }
    return n;
}

static int rpn_has(const rbuf *r, int op)
{
    for (int i = 0; i < r->len; i++)
        if (r->n[i].op == op)
            return 1;
    return 0;
}

/* Emit a LinComb of G-vars `atoms` with the coefficients of affine `r`. */
static int emit_lincomb(elab *E, const rbuf *r, const int *atoms, int n, char *name, int node,
                        int line, int col)
{
    double *stack = tpk_malloc(E->S->ctx, (size_t)(r->len + 1) * sizeof *stack);
    int *term = tpk_malloc(E->S->ctx, (size_t)(n + 1) * sizeof *term);
    double *coef = tpk_malloc(E->S->ctx, (size_t)(n + 1) * sizeof *coef);
    if (stack == NULL || term == NULL || coef == NULL) {
        tpk_free(E->S->ctx, stack), tpk_free(E->S->ctx, term), tpk_free(E->S->ctx, coef), tpk_free(E->S->ctx, name);
        return oom(E), -1;
    }
    double c0 = rpn_eval_affine(r, -1, stack);
    int k = 0;
    for (int i = 0; i < n; i++) {
        double c = rpn_eval_affine(r, atoms[i], stack) - c0;
        if (c != 0) {
            term[k] = atoms[i];
            coef[k++] = c;
        }
    }
    tpk_free(E->S->ctx, stack);
    int v = new_var(E, name, TPK_VAR_G, node, line);
    tpk_instr *in = v < 0 ? NULL : new_instr(E, TPK_OP_LINCOMB, v, line, col);
    if (in == NULL) {
        tpk_free(E->S->ctx, term), tpk_free(E->S->ctx, coef);
        return -1;
    }
    in->nterms = k;
    in->term = term;
    in->coef = coef;
    return v;
}

/* Replace H-var leaves by their bodies (theory §1.3: a Nonlin of H-vars is one Nonlin of G-vars). */
static int inline_h(elab *E, const rbuf *r, rbuf *out, int line, int col, const char *what)
{
    for (int i = 0; i < r->len; i++) {
        const tpk_rpn_node *x = &r->n[i];
        int st;
        if (x->op == NSR_RPN_HVAR) {
            const tpk_instr *d = &E->p->instr[E->p->var[x->var].def];
            if (d->bnorm) /* a batch-coupled Nonlin is not coordinatewise in one input */
                return nsr_error(E->S, TPK_ETYPE, line, col,
                                 "%s: '%s' is batchnorm'ed (line %d); it can only be multiplied by "
                                 "an A-var or read out, e.g. W relu(bn(g)) (docs/netsor.md)", what,
                                 E->p->var[x->var].name, d->line);
            const tpk_rpn *b = &d->body;
            st = rb_append(E, out, b->node, b->len);
        } else {
            st = rb_push(E, out, x->op, x->var, x->value, x->fn);
        }
        if (st == TPK_ENOMEM)
            return oom(E);
        if (st)
            return nsr_error(E->S, TPK_EINVAL, line, col,
                             "%s: the inlined Nonlin body exceeds %d nodes (an H-var is read more "
                             "than once per step, so inlining grows exponentially); read it through "
                             "a MatMul or restructure the recurrence", what, NSR_MAX_BODY);
    }
    return TPK_OK;
}

static int finish_body(elab *E, rbuf *r, tpk_rpn *body)
{
    int *args = tpk_malloc(E->S->ctx, (size_t)(r->len + 1) * sizeof *args);
    if (args == NULL)
        return oom(E);
    int n = 0;
    for (int i = 0; i < r->len; i++) {
        if (r->n[i].op != TPK_RPN_GVAR)
            continue;
        int j;
        for (j = 0; j < n && args[j] != r->n[i].var; j++)
            ;
        if (j == n)
            args[n++] = r->n[i].var;
    }
    for (int i = 1; i < n; i++) /* insertion sort: ascending ids */
        for (int j = i; j > 0 && args[j - 1] > args[j]; j--) {
            int t = args[j];
            args[j] = args[j - 1];
            args[j - 1] = t;
        }
    body->node = r->n;
    body->len = r->len;
    body->nargs = n;
    body->args = args;
    r->n = NULL;
    r->len = r->cap = 0;
    return TPK_OK;
}

/* Emit a Nonlin (H) or Moment (scalar) over body r (H leaves are inlined here). */
static int emit_body(elab *E, int op, const rbuf *r, char *name, int node, int line, int col,
                     const char *what)
{
    rbuf in = {0};
    if (name == NULL && (name = temp_name(E)) == NULL)
        return oom(E), -1;
    if (inline_h(E, r, &in, line, col, what)) {
        rb_free(E, &in);
        tpk_free(E->S->ctx, name);
        return -1;
    }
    int v = new_var(E, name, op == TPK_OP_NONLIN ? TPK_VAR_H : TPK_VAR_SCALAR, node, line);
    tpk_instr *ins = v < 0 ? NULL : new_instr(E, op, v, line, col);
    if (ins == NULL || finish_body(E, &in, &ins->body)) {
        rb_free(E, &in);
        return -1;
    }
    if (op == TPK_OP_MOMENT || rpn_has(r, TPK_RPN_SCALAR))
        E->p->features |= TPK_FEAT_NETSOR_PLUS;
    return v;
}

/* Turn an expression into a variable (G via LinComb, or H via Nonlin), or report why not.
 * `name` is owned (NULL → a fresh temporary). Returns the var id, or -1 on error.
 * For a constant expression returns -2 and leaves it in r. */
static int materialize(elab *E, rbuf *r, int annot, char *name, int fam_node, int line, int col,
                       const char *what)
{
    int st;
    int node = unify_leaves(E, r, what, line, col, &st);
    if (st) {
        tpk_free(E->S->ctx, name);
        return -1;
    }
    if (name == NULL && (name = temp_name(E)) == NULL)
        return oom(E), -1;
    if (fam_node >= 0 && node >= 0) {
        char fa[256], fb[256];
        snprintf(fa, sizeof fa, "%s has width %s", name, nsr_uf_show(E->C, fam_node));
        snprintf(fb, sizeof fb, "its right-hand side has width %s", nsr_uf_show(E->C, node));
        if (nsr_uf_unify(E->C, fam_node, node, line, col, what, fa, fb)) {
            tpk_free(E->S->ctx, name);
            return -1;
        }
    }
    if (fam_node < 0)
        fam_node = node >= 0 ? node : nsr_uf_new(E->C, -1);
    int *atoms;
    int has_h;
    int n = rpn_atoms(E, r, &atoms, &has_h);
    if (n < 0) {
        tpk_free(E->S->ctx, name);
        return oom(E), -1;
    }
    int lin = rpn_linearity(E, r);
    if (lin < 0) {
        tpk_free(E->S->ctx, atoms);
        tpk_free(E->S->ctx, name);
        return -1;
    }
    double stack0 = 0;
    int v = -1;
    if (n == 0) {
        /* no vectors: a constant (caller folds) or a scalar expression (Moment of a constant) */
        if (!rpn_has(r, TPK_RPN_SCALAR) && r->len == 1) {
            tpk_free(E->S->ctx, atoms);
            tpk_free(E->S->ctx, name);
            return -2;
        }
        tpk_free(E->S->ctx, atoms);
        if (annot == NSR_ANN_G || annot == NSR_ANN_H) {
            if (!rpn_has(r, TPK_RPN_SCALAR)) {
                v = emit_body(E, TPK_OP_NONLIN, r, name, fam_node, line, col, what);
                return v;
            }
            nsr_error(E->S, TPK_ETYPE, line, col, "%s: '%s' is declared a vector but its "
                      "right-hand side is a scalar", what, name);
            tpk_free(E->S->ctx, name);
            return -1;
        }
        return emit_body(E, TPK_OP_MOMENT, r, name, -1, line, col, what);
    }
    if (annot == NSR_ANN_SCALAR) {
        nsr_error(E->S, TPK_ETYPE, line, col,
                  "%s: scalar '%s' reads vectors outside mean(...); a scalar is a Moment: "
                  "scalar %s = mean(...)", what, name, name);
        tpk_free(E->S->ctx, atoms), tpk_free(E->S->ctx, name);
        return -1;
    }
    if (lin <= 1) {
        double *stack = tpk_malloc(E->S->ctx, (size_t)(r->len + 1) * sizeof *stack);
        if (stack == NULL) {
            tpk_free(E->S->ctx, atoms), tpk_free(E->S->ctx, name);
            return oom(E), -1;
        }
        stack0 = rpn_eval_affine(r, -1, stack);
        tpk_free(E->S->ctx, stack);
    }
    if (lin <= 1 && stack0 == 0 && annot != NSR_ANN_H) {
        if (has_h) {
            int h = -1;
            for (int i = 0; i < n && h < 0; i++)
                if (E->p->var[atoms[i]].type == TPK_VAR_H)
                    h = atoms[i];
            nsr_error(E->S, TPK_ETYPE, line, col,
                      "%s: LinComb argument '%s' is an H-var (line %d); LinComb accepts G-vars only. "
                      "Hint: write a Nonlin with a linear function ('H %s = ...')", what,
                      E->p->var[h].name, E->var_line[h], name);
            tpk_free(E->S->ctx, atoms), tpk_free(E->S->ctx, name);
            return -1;
        }
        v = emit_lincomb(E, r, atoms, n, name, fam_node, line, col);
        tpk_free(E->S->ctx, atoms);
        return v;
    }
    tpk_free(E->S->ctx, atoms);
    if (annot == NSR_ANN_G) {
        nsr_error(E->S, TPK_ETYPE, line, col,
                  "%s: '%s' is declared G but its right-hand side is not a linear combination of "
                  "G-vars without constant term (it is a Nonlin, an H-var); drop the 'G'", what, name);
        tpk_free(E->S->ctx, name);
        return -1;
    }
    return emit_body(E, TPK_OP_NONLIN, r, name, fam_node, line, col, what);
}

/* MatMul `A·src` (or the embedding `U·x[t]`) into a new G-var. Appends a GVAR leaf (or the
 * constant 0 when src is the zero vector) to out. */
static int elab_matmul(elab *E, const nsr_expr *a, const nsr_expr *src, const nsr_expr *at,
                       char *name, int fam_node, rbuf *out)
{
    const nsr_sym *af = &E->C->sym[a->sym];
    member *m = lookup_member(E, a, "declared");
    char *aname = m ? nsr_member_name(E->S->ctx, af->name, m->nidx, m->idx) : NULL;
    char what[300], fa[300], fb[300];
    int st = TPK_OK;
    if (m == NULL || aname == NULL) {
        tpk_free(E->S->ctx, name);
        return m == NULL ? TPK_ETYPE : oom(E);
    }
    snprintf(fa, sizeof fa, "%s is A(%s, %s) (declared at line %d)", aname, nsr_uf_show(E->C, af->node),
             nsr_uf_show(E->C, af->node2), m->line);
    int line = at->line, col = at->col;
    int v = -1;
    const nsr_sym *ys = src->kind == NSR_E_NAME && src->sym >= 0 ? &E->C->sym[src->sym] : NULL;
    if (ys != NULL && ys->kind == NSR_SYM_INPUT) {
        /* embedding U·x[t]: an initial G-var (theory §1.2) */
        int slot = 0;
        if (src->nidx == 1) {
            int t;
            if (eval_int(E, src->idx[0], "an index", &t)) {
                tpk_free(E->S->ctx, aname), tpk_free(E->S->ctx, name);
                return TPK_ETYPE;
            }
            slot = t - E->input_lo;
            if (slot < 0 || slot >= E->p->nslots) {
                int idx[1] = {t};
                tpk_free(E->S->ctx, aname), tpk_free(E->S->ctx, name);
                return missing_member(E, src, src->sym, idx, "defined");
            }
        }
        snprintf(what, sizeof what, "MatMul %s\xc2\xb7%s", aname, src->name);
        snprintf(fb, sizeof fb, "%s is an input of dimension %s (line %d)", src->name,
                 nsr_uf_show(E->C, ys->node), ys->line);
        if (nsr_uf_unify(E->C, af->node2, ys->node, line, col, what, fa, fb)) {
            tpk_free(E->S->ctx, aname), tpk_free(E->S->ctx, name);
            return TPK_ETYPE;
        }
        if (m->aid < 0) {
            tpk_program *p = E->p;
            if (grow(E, (void **)&p->embed, &E->capembed, p->nembeds + 1, sizeof *p->embed)) {
                tpk_free(E->S->ctx, aname), tpk_free(E->S->ctx, name);
                return oom(E);
            }
            p->embed[p->nembeds].name = aname;
            aname = NULL;
            p->embed[p->nembeds].var = m->v;
            p->embed[p->nembeds].rows = af->node; /* resolved to a width id at the end */
            m->aid = p->nembeds++;
        }
        tpk_free(E->S->ctx, aname);
        v = new_var(E, name ? name : temp_name(E), TPK_VAR_G, fam_node >= 0 ? fam_node : af->node, line);
        tpk_instr *in = v < 0 ? NULL : new_instr(E, TPK_OP_EMBED, v, line, col);
        if (in == NULL)
            return TPK_ENOMEM;
        if (fam_node >= 0 && nsr_uf_unify(E->C, fam_node, af->node, line, col, what, fa,
                                           "the result's family has another width"))
            return TPK_ETYPE;
        in->avar = m->aid;
        in->src = slot;
        in->var = m->v;
        return push_var(E, out, v);
    }
    /* the source: a variable, the zero vector, or an expression made into a temporary */
    rbuf r = {0};
    if ((st = elab_expr(E, src, &r))) {
        tpk_free(E->S->ctx, aname), tpk_free(E->S->ctx, name);
        return st;
    }
    char *sname = NULL;
    int srcvar = -1;
    double c = 0;
    int is_const = rb_is_const(&r, &c);
    if (r.len == 1 && (r.n[0].op == TPK_RPN_GVAR || r.n[0].op == NSR_RPN_HVAR)) {
        srcvar = r.n[0].var;
    } else if (r.len == 1 && r.n[0].op == TPK_RPN_SCALAR) {
        rb_free(E, &r);
        tpk_free(E->S->ctx, aname), tpk_free(E->S->ctx, name);
        return nsr_error(E->S, TPK_ETYPE, src->line, src->col,
                         "MatMul %s needs a G- or H-var on the right, not a scalar", af->name);
    } else if (!is_const) {
        snprintf(what, sizeof what, "MatMul %s\xc2\xb7(...)", aname);
        srcvar = materialize(E, &r, NSR_ANN_H, NULL, -1, src->line, src->col, what);
        if (srcvar < 0) {
            rb_free(E, &r);
            tpk_free(E->S->ctx, aname), tpk_free(E->S->ctx, name);
            return TPK_ETYPE;
        }
    }
    rb_free(E, &r);
    int src_node;
    if (srcvar >= 0) {
        sname = E->p->var[srcvar].name;
        src_node = E->var_node[srcvar];
        var_fact(E, srcvar, fb, sizeof fb);
    } else {
        /* a constant vector: from a family member (h[0] = 0) or a literal */
        src_node = ys != NULL && ys->kind == NSR_SYM_DFAM ? ys->node : nsr_uf_new(E->C, -1);
        sname = ys != NULL ? (char *)ys->name : "const";
        snprintf(fb, sizeof fb, "%s has width %s (line %d)", sname, nsr_uf_show(E->C, src_node),
                 ys ? ys->def_line : line);
    }
    snprintf(what, sizeof what, "MatMul %s\xc2\xb7%s", aname, sname);
    if (nsr_uf_unify(E->C, af->node2, src_node, line, col, what, fa, fb)) {
        tpk_free(E->S->ctx, aname), tpk_free(E->S->ctx, name);
        return TPK_ETYPE;
    }
    int root = nsr_uf_find(E->C, af->node2);
    if (E->C->uf[root].rigid >= 0 && E->C->sym[E->C->uf[root].rigid].kind == NSR_SYM_DIM) {
        tpk_free(E->S->ctx, name);
        st = nsr_error(E->S, TPK_ETYPE, line, col,
                       "%s: %s is an embedding A(%s, %s) (declared at line %d); it can only multiply "
                       "the input", what, aname, nsr_uf_show(E->C, af->node),
                       nsr_uf_show(E->C, af->node2), m->line);
        tpk_free(E->S->ctx, aname);
        return st;
    }
    if (srcvar < 0 && c == 0) {
        /* W·0 = 0: no instruction; the constant folds into whatever reads it */
        tpk_free(E->S->ctx, aname), tpk_free(E->S->ctx, name);
        return rb_push(E, out, TPK_RPN_CONST, -1, 0.0, NULL) ? oom(E) : TPK_OK;
    }
    if (srcvar < 0) {
        /* a nonzero constant vector becomes a Nonlin with a constant body */
        rbuf k = {0};
        if (rb_push(E, &k, TPK_RPN_CONST, -1, c, NULL)) {
            tpk_free(E->S->ctx, aname), tpk_free(E->S->ctx, name);
            return oom(E);
        }
        srcvar = emit_body(E, TPK_OP_NONLIN, &k, NULL, src_node, line, col, what);
        rb_free(E, &k);
        if (srcvar < 0) {
            tpk_free(E->S->ctx, aname), tpk_free(E->S->ctx, name);
            return TPK_ENOMEM;
        }
    }
    if (m->aid < 0) {
        tpk_program *p = E->p;
        if (grow(E, (void **)&p->avar, &E->capavar, p->navars + 1, sizeof *p->avar)) {
            tpk_free(E->S->ctx, aname), tpk_free(E->S->ctx, name);
            return oom(E);
        }
        p->avar[p->navars].name = aname;
        aname = NULL;
        p->avar[p->navars].var = m->v;
        p->avar[p->navars].rows = af->node; /* nodes until finalize() */
        p->avar[p->navars].cols = af->node2;
        m->aid = p->navars++;
    }
    tpk_free(E->S->ctx, aname);
    if (fam_node >= 0) {
        char f1[256], f2[256];
        snprintf(f1, sizeof f1, "%s has width %s", name ? name : "the result", nsr_uf_show(E->C, fam_node));
        snprintf(f2, sizeof f2, "%s has %s rows", E->p->avar[m->aid].name, nsr_uf_show(E->C, af->node));
        if (nsr_uf_unify(E->C, fam_node, af->node, line, col, what, f1, f2)) {
            tpk_free(E->S->ctx, name);
            return TPK_ETYPE;
        }
    }
    v = new_var(E, name ? name : temp_name(E), TPK_VAR_G, af->node, line);
    tpk_instr *in = v < 0 ? NULL : new_instr(E, TPK_OP_MATMUL, v, line, col);
    if (in == NULL)
        return TPK_ENOMEM;
    in->avar = m->aid;
    in->src = srcvar;
    in->var = m->v;
    return push_var(E, out, v);
}

static int is_sqrt_width(const elab *E, const nsr_expr *e)
{
    return e->kind == NSR_E_CALL && e->sym >= 0 && E->C->sym[e->sym].kind == NSR_SYM_WIDTH;
}

static int is_mean(const nsr_expr *e)
{
    return e->kind == NSR_E_CALL && strcmp(e->name, "mean") == 0;
}

/* mean(body) → a Moment (NETSOR+); sqrt_n marks the √n-scaled inner product of theory §5. */
static int elab_mean(elab *E, const nsr_expr *e, char *name, int sqrt_n, rbuf *out)
{
    rbuf r = {0};
    int st = elab_expr(E, e->args[0], &r);
    if (st) {
        rb_free(E, &r);
        tpk_free(E->S->ctx, name);
        return st;
    }
    int ust;
    unify_leaves(E, &r, "Moment mean(...)", e->line, e->col, &ust);
    if (ust) {
        rb_free(E, &r);
        tpk_free(E->S->ctx, name);
        return ust;
    }
    int v = emit_body(E, TPK_OP_MOMENT, &r, name ? name : temp_name(E), -1, e->line, e->col,
                      "Moment mean(...)");
    rb_free(E, &r);
    if (v < 0)
        return TPK_ETYPE;
    if (sqrt_n) {
        E->p->instr[E->p->var[v].def].src = 1;
        E->p->features |= TPK_FEAT_SQRT_N_LOGITS;
        nsr_note(E->S, e->line, e->col,
                 "sqrt(n)-scaled inner product: its limit is random and non-Gaussian (theory \xc2\xa7" "5); "
                 "the program is flagged sqrt-n-logits");
    }
    return out ? push_var(E, out, v) : TPK_OK;
}

static int is_bn(const nsr_expr *e)
{
    return e->kind == NSR_E_CALL && e->sym < 0 && strcmp(e->name, "bn") == 0;
}

/* The function of a call f(...) (a registered name or a function parameter), or NULL. */
static const tpk_phi *call_phi(elab *E, const nsr_expr *e)
{
    if (e->kind != NSR_E_CALL || e->sym < 0 || e->nargs != 1)
        return NULL;
    const nsr_sym *y = &E->C->sym[e->sym];
    if (y->kind == NSR_SYM_FUNC)
        return get_phi(E, y->name, e->line, e->col);
    if (y->kind == NSR_SYM_PARAM && E->spec[e->sym] != NULL)
        return get_phi(E, E->spec[e->sym], e->line, e->col);
    return NULL;
}

/* phi(bn(g[, batch])) or bn(g[, batch]) (phi NULL): one batch-coupled Nonlin whose body is
 * phi(g), flagged bnorm (theory §2.5, docs/netsor.md "Batchnorm"). g must be a G-var or a
 * LinComb of G-vars. `name` is owned (NULL: a temporary); pushes the H-var onto out. */
static int elab_bn(elab *E, const nsr_expr *e, const tpk_phi *phi, char *name, int fam_node,
                   rbuf *out)
{
    int batch = 0, st;
    double eps = 0.0;
    if (e->nargs == 3) {
        if (eval_number(E, e->args[2], "an epsilon", &eps)) {
            tpk_free(E->S->ctx, name);
            return TPK_ETYPE;
        }
        if (!(isfinite(eps) && eps >= 0)) {
            tpk_free(E->S->ctx, name);
            return nsr_error(E->S, TPK_ETYPE, e->args[2]->line, e->args[2]->col,
                             "bn: epsilon must be a finite number >= 0, got %g", eps);
        }
    }
    if (e->nargs >= 2) {
        if (eval_int(E, e->args[1], "a batch size", &batch)) {
            tpk_free(E->S->ctx, name);
            return TPK_ETYPE;
        }
        if (batch < 0) {
            tpk_free(E->S->ctx, name);
            return nsr_error(E->S, TPK_ETYPE, e->args[1]->line, e->args[1]->col,
                             "bn: batch size must be >= 0 (0: all inputs), got %d", batch);
        }
    }
    rbuf r = {0};
    if ((st = elab_expr(E, e->args[0], &r))) {
        rb_free(E, &r);
        tpk_free(E->S->ctx, name);
        return st;
    }
    int g = -1, lin = 0;
    if (r.len == 1 && r.n[0].op == TPK_RPN_GVAR)
        g = r.n[0].var;
    else if (!rb_is_const(&r, NULL) && !rpn_has(&r, NSR_RPN_HVAR) && !rpn_has(&r, TPK_RPN_SCALAR) &&
             (lin = rpn_linearity(E, &r)) == 1)
        g = materialize(E, &r, NSR_ANN_NONE, NULL, -1, e->line, e->col, "bn(...)");
    if (lin < 0) {
        rb_free(E, &r);
        tpk_free(E->S->ctx, name);
        return TPK_ENOMEM;
    }
    rb_free(E, &r);
    if (g >= 0 && E->p->var[g].type != TPK_VAR_G)
        g = -1;
    if (g < 0) {
        tpk_free(E->S->ctx, name);
        return E->S->ctx->status ? E->S->ctx->status
               : nsr_error(E->S, TPK_ETYPE, e->line, e->col,
                           "bn(...) normalises a G-var: its argument must be a G-var or a linear "
                           "combination of G-vars without constant term (a constant cancels anyway)");
    }
    int node = E->var_node[g];
    if (fam_node >= 0) {
        char fa[256], fb[256];
        snprintf(fa, sizeof fa, "%s has width %s", name ? name : "the result", nsr_uf_show(E->C, fam_node));
        var_fact(E, g, fb, sizeof fb);
        if (nsr_uf_unify(E->C, fam_node, node, e->line, e->col, "bn(...)", fa, fb)) {
            tpk_free(E->S->ctx, name);
            return TPK_ETYPE;
        }
    }
    rbuf b = {0};
    if (rb_push(E, &b, TPK_RPN_GVAR, g, 0, NULL) || (phi && rb_push(E, &b, TPK_RPN_CALL, -1, 0, phi))) {
        rb_free(E, &b);
        tpk_free(E->S->ctx, name);
        return oom(E);
    }
    int v = emit_body(E, TPK_OP_NONLIN, &b, name, fam_node >= 0 ? fam_node : node, e->line, e->col,
                      "bn(...)");
    rb_free(E, &b);
    if (v < 0)
        return TPK_ETYPE;
    tpk_instr *in = &E->p->instr[E->p->var[v].def];
    in->bnorm = 1;
    in->batch = batch;
    in->bn_eps = eps;
    E->p->features |= TPK_FEAT_BATCHNORM;
    return out ? push_var(E, out, v) : TPK_OK;
}

static int elab_call(elab *E, const nsr_expr *e, rbuf *out)
{
    if (is_bn(e))
        return elab_bn(E, e, NULL, NULL, -1, out);
    if (e->nargs == 1 && is_bn(e->args[0])) {
        const tpk_phi *phi = call_phi(E, e);
        if (phi == NULL)
            return E->S->ctx->status ? E->S->ctx->status
                   : nsr_error(E->S, TPK_ETYPE, e->line, e->col,
                               "'%s' is not a function; bn(g) can be wrapped in one function: "
                               "relu(bn(g))", e->name);
        return elab_bn(E, e->args[0], phi, NULL, -1, out);
    }
    if (is_mean(e))
        return elab_mean(E, e, NULL, 0, out);
    if (is_sqrt_width(E, e))
        return nsr_error(E->S, TPK_ETYPE, e->line, e->col,
                         "sqrt(%s) of a width may only scale a mean: sqrt(%s) * mean(q * k) is the "
                         "1/sqrt(n)-scaled inner product <q, k>/sqrt(n)", e->args[0]->name,
                         e->args[0]->name);
    if (e->sym < 0 && strcmp(e->name, "mod") == 0) { /* built-in mod(a, b), floored: 0..b-1 */
        int a, b;
        if (eval_int(E, e->args[0], "mod's first argument", &a) ||
            eval_int(E, e->args[1], "mod's second argument", &b))
            return TPK_ETYPE;
        if (b < 1)
            return nsr_error(E->S, TPK_ETYPE, e->args[1]->line, e->args[1]->col,
                             "mod(a, b) needs b >= 1 (got %d)", b);
        return rb_push(E, out, TPK_RPN_CONST, -1, (double)(((a % b) + b) % b), NULL) ? oom(E) : TPK_OK;
    }
    if (e->sym < 0 && (strcmp(e->name, "wrap") == 0 || strcmp(e->name, "inside") == 0)) {
        int v, lo, hi;
        if (eval_int(E, e->args[0], "an index", &v) || eval_int(E, e->args[1], "a range bound", &lo) ||
            eval_int(E, e->args[2], "a range bound", &hi))
            return TPK_ETYPE;
        if (hi < lo)
            return nsr_error(E->S, TPK_ETYPE, e->line, e->col, "%s(v, lo, hi) needs lo <= hi (got %d..%d)",
                             e->name, lo, hi);
        double r = e->name[0] == 'w' ? (double)nsr_wrap(v, lo, hi) : (double)(v >= lo && v <= hi);
        return rb_push(E, out, TPK_RPN_CONST, -1, r, NULL) ? oom(E) : TPK_OK;
    }
    const nsr_sym *y = &E->C->sym[e->sym];
    if (y->kind == NSR_SYM_AFAM) {
        nsr_expr a = *e;
        a.kind = NSR_E_NAME;
        return elab_matmul(E, &a, e->args[0], e, NULL, -1, out);
    }
    const char *spec;
    if (y->kind == NSR_SYM_PARAM) {
        if (E->spec[e->sym] == NULL)
            return nsr_error(E->S, TPK_ETYPE, e->line, e->col,
                             "'%s' is a number parameter (= %g), not a function", e->name, E->num[e->sym]);
        spec = E->spec[e->sym];
    } else {
        spec = y->name;
    }
    rbuf r = {0};
    int st = elab_expr(E, e->args[0], &r);
    if (st) {
        rb_free(E, &r);
        return st;
    }
    const tpk_phi *phi = get_phi(E, spec, e->line, e->col);
    if (phi == NULL) {
        rb_free(E, &r);
        return TPK_ETYPE;
    }
    double c = 0;
    if (rb_is_const(&r, &c)) {
        rb_free(E, &r);
        return rb_push(E, out, TPK_RPN_CONST, -1, tpk_phi_eval(phi, c), NULL) ? oom(E) : TPK_OK;
    }
    /* φ(a + b) over several G-vars: hoist the LinComb so the expectation stays low-dimensional */
    int *atoms, has_h;
    int n = rpn_atoms(E, &r, &atoms, &has_h);
    if (n < 0) {
        rb_free(E, &r);
        return oom(E);
    }
    tpk_free(E->S->ctx, atoms);
    int lin = n >= 2 && !has_h ? rpn_linearity(E, &r) : 0;
    double *stack = lin == 1 ? tpk_malloc(E->S->ctx, (size_t)(r.len + 1) * sizeof *stack) : NULL;
    if (lin < 0 || (lin == 1 && stack == NULL)) {
        rb_free(E, &r);
        return oom(E);
    }
    double c0 = lin == 1 && !rpn_has(&r, TPK_RPN_SCALAR) ? rpn_eval_affine(&r, -1, stack) : 1;
    tpk_free(E->S->ctx, stack);
    if (lin == 1 && !rpn_has(&r, TPK_RPN_SCALAR)) {
        if (c0 == 0) {
            int v = materialize(E, &r, NSR_ANN_NONE, NULL, -1, e->line, e->col, "LinComb");
            rb_free(E, &r);
            if (v < 0)
                return TPK_ETYPE;
            if (push_var(E, &r, v))
                return TPK_EINVAL;
        }
    }
    st = rb_push(E, &r, TPK_RPN_CALL, -1, 0, phi);
    if (st == TPK_OK)
        st = rb_append(E, out, r.n, r.len);
    rb_free(E, &r);
    if (st)
        return nsr_error(E->S, TPK_EINVAL, e->line, e->col, "expression too large");
    return TPK_OK;
}

static double fold(int op, double a, double b)
{
    switch (op) {
    case TPK_RPN_ADD: return a + b;
    case TPK_RPN_SUB: return a - b;
    case TPK_RPN_MUL: return a * b;
    default: return a / b;
    }
}

/* sum(j in lo..hi, body) → body(lo) + ... + body(hi), folding constants as '+' does (so the
 * zero members of a padded family drop out); 0 for an empty range. */
static int elab_sum(elab *E, const nsr_expr *e, rbuf *out)
{
    int lo, hi;
    if (eval_int(E, e->args[0], "a range bound", &lo) || eval_int(E, e->args[1], "a range bound", &hi))
        return TPK_ETYPE;
    rbuf acc = {0};
    int st = TPK_OK, nonconst = 0;
    double c0 = 0;
    E->have[e->sym] = 1;
    for (long j = lo; j <= hi && st == TPK_OK; j++) {
        E->num[e->sym] = (double)j;
        rbuf b = {0};
        double cb;
        st = elab_expr(E, e->a, &b);
        if (st == TPK_OK && rb_is_const(&b, &cb))
            c0 += cb;
        else if (st == TPK_OK && (st = rb_append(E, &acc, b.n, b.len)) == TPK_OK && nonconst++ > 0)
            st = rb_push(E, &acc, TPK_RPN_ADD, -1, 0, NULL);
        rb_free(E, &b);
    }
    E->have[e->sym] = 0;
    if (st == TPK_OK && (c0 != 0 || nonconst == 0)) {
        st = rb_push(E, &acc, TPK_RPN_CONST, -1, c0, NULL);
        if (st == TPK_OK && nonconst > 0)
            st = rb_push(E, &acc, TPK_RPN_ADD, -1, 0, NULL);
    }
    if (st == TPK_OK)
        st = rb_append(E, out, acc.n, acc.len);
    rb_free(E, &acc);
    if (st && !E->S->failed)
        st = nsr_error(E->S, TPK_EINVAL, e->line, e->col, "expression too large");
    return st;
}

/* softmax(j in lo..hi: s) at the enclosing j: exp(s_j − s_hi) / Σ_j' exp(s_j' − s_hi). The
 * shift by the last logit changes nothing mathematically and keeps a causal row finite (its
 * largest logit is the diagonal one for the shipped attention programs); the rolled evaluator
 * shifts by the row maximum instead. */
static int elab_softmax(elab *E, const nsr_expr *e, rbuf *out)
{
    int lo, hi;
    if (eval_int(E, e->args[0], "a range bound", &lo) || eval_int(E, e->args[1], "a range bound", &hi))
        return TPK_ETYPE;
    if (hi < lo)
        return nsr_error(E->S, TPK_ETYPE, e->line, e->col, "softmax over the empty range %d..%d",
                         lo, hi);
    int at = (int)E->num[e->op];
    if (at < lo || at > hi)
        return nsr_error(E->S, TPK_ETYPE, e->line, e->col,
                         "softmax entry %s = %d is outside its range %d..%d", e->name, at, lo, hi);
    const tpk_phi *ex = get_phi(E, "exp", e->line, e->col);
    if (ex == NULL)
        return TPK_ETYPE;
    rbuf ref = {0}, num = {0}, den = {0};
    E->have[e->sym] = 1;
    E->num[e->sym] = hi;
    int st = elab_expr(E, e->a, &ref);
    for (long j = lo; j <= hi && st == TPK_OK; j++) {
        E->num[e->sym] = (double)j;
        rbuf b = {0};
        st = elab_expr(E, e->a, &b);
        if (st == TPK_OK && (st = rb_append(E, &b, ref.n, ref.len)) == TPK_OK &&
            (st = rb_push(E, &b, TPK_RPN_SUB, -1, 0, NULL)) == TPK_OK &&
            (st = rb_push(E, &b, TPK_RPN_CALL, -1, 0, ex)) == TPK_OK) {
            if (j == at)
                st = rb_append(E, &num, b.n, b.len);
            if (st == TPK_OK && (st = rb_append(E, &den, b.n, b.len)) == TPK_OK && j > lo)
                st = rb_push(E, &den, TPK_RPN_ADD, -1, 0, NULL);
        }
        rb_free(E, &b);
    }
    E->have[e->sym] = 0;
    if (st == TPK_OK && (st = rb_append(E, &num, den.n, den.len)) == TPK_OK &&
        (st = rb_push(E, &num, TPK_RPN_DIV, -1, 0, NULL)) == TPK_OK)
        st = rb_append(E, out, num.n, num.len);
    rb_free(E, &ref);
    rb_free(E, &num);
    rb_free(E, &den);
    if (st && !E->S->failed)
        st = nsr_error(E->S, TPK_EINVAL, e->line, e->col, "expression too large");
    return st;
}

static int elab_expr(elab *E, const nsr_expr *e, rbuf *out)
{
    if (++E->steps > NSR_MAX_STEPS * 4L) {
        E->S->too_large = 1;
        return nsr_error(E->S, TPK_EINVAL, e->line, e->col, "program too large after unrolling");
    }
    switch (e->kind) {
    case NSR_E_NUM:
        return rb_push(E, out, TPK_RPN_CONST, -1, e->num, NULL) ? oom(E) : TPK_OK;
    case NSR_E_NAME:
        return elab_name(E, e, out);
    case NSR_E_CALL:
        return elab_call(E, e, out);
    case NSR_E_APPLY:
        return elab_matmul(E, e->a, e->b, e, NULL, -1, out);
    case NSR_E_SUM:
        return elab_sum(E, e, out);
    case NSR_E_SOFTMAX:
        return elab_softmax(E, e, out);
    case NSR_E_NEG: {
        rbuf a = {0};
        int st = elab_expr(E, e->a, &a);
        double c;
        if (st == TPK_OK) {
            if (rb_is_const(&a, &c))
                st = rb_push(E, out, TPK_RPN_CONST, -1, -c, NULL);
            else if ((st = rb_append(E, out, a.n, a.len)) == TPK_OK)
                st = rb_push(E, out, TPK_RPN_NEG, -1, 0, NULL);
            if (st)
                st = nsr_error(E->S, TPK_EINVAL, e->line, e->col, "expression too large");
        }
        rb_free(E, &a);
        return st;
    }
    case NSR_E_BIN: {
        if (e->op == NSR_T_STAR && ((is_sqrt_width(E, e->a) && is_mean(e->b)) ||
                                    (is_mean(e->a) && is_sqrt_width(E, e->b))))
            return elab_mean(E, is_mean(e->a) ? e->a : e->b, NULL, 1, out);
        if (e->op == NSR_T_CARET) {
            double k;
            int st = eval_number(E, e->b, "an exponent", &k);
            if (st)
                return st;
            if (k != floor(k) || fabs(k) > 64)
                return nsr_error(E->S, TPK_ETYPE, e->b->line, e->b->col,
                                 "exponent must be an integer between -64 and 64 (got %g); use a "
                                 "registered function for other powers", k);
            rbuf a = {0};
            st = elab_expr(E, e->a, &a);
            double c;
            if (st == TPK_OK) {
                if (rb_is_const(&a, &c))
                    st = rb_push(E, out, TPK_RPN_CONST, -1, pow(c, k), NULL);
                else if (k == 1)
                    st = rb_append(E, out, a.n, a.len);
                else if ((st = rb_append(E, out, a.n, a.len)) == TPK_OK)
                    st = rb_push(E, out, TPK_RPN_POWI, -1, k, NULL);
                if (st)
                    st = nsr_error(E->S, TPK_EINVAL, e->line, e->col, "expression too large");
            }
            rb_free(E, &a);
            return st;
        }
        int op = e->op == NSR_T_PLUS ? TPK_RPN_ADD : e->op == NSR_T_MINUS ? TPK_RPN_SUB
                 : e->op == NSR_T_STAR ? TPK_RPN_MUL : TPK_RPN_DIV;
        rbuf a = {0}, b = {0};
        int st = elab_expr(E, e->a, &a);
        if (st == TPK_OK)
            st = elab_expr(E, e->b, &b);
        double ca = 0, cb = 0;
        if (st == TPK_OK) {
            int ka = rb_is_const(&a, &ca), kb = rb_is_const(&b, &cb);
            if (op == TPK_RPN_DIV && kb && cb == 0) {
                rb_free(E, &a);
                rb_free(E, &b);
                return nsr_error(E->S, TPK_ETYPE, e->b->line, e->b->col,
                                 "division by the constant 0");
            }
            if (ka && kb && !isfinite(fold(op, ca, cb))) {
                rb_free(E, &a);
                rb_free(E, &b);
                return nsr_error(E->S, TPK_ETYPE, e->line, e->col,
                                 "the constant expression is not finite (%g)", fold(op, ca, cb));
            }
            if (ka && kb) {
                st = rb_push(E, out, TPK_RPN_CONST, -1, fold(op, ca, cb), NULL);
            } else if ((op == TPK_RPN_MUL && ((ka && ca == 0) || (kb && cb == 0))) ||
                       (op == TPK_RPN_DIV && ka && ca == 0)) {
                st = rb_push(E, out, TPK_RPN_CONST, -1, 0.0, NULL); /* 0 * x folds (h[0] = 0) */
            } else if ((op == TPK_RPN_ADD && ka && ca == 0) || (op == TPK_RPN_MUL && ka && ca == 1)) {
                st = rb_append(E, out, b.n, b.len);
            } else if (((op == TPK_RPN_ADD || op == TPK_RPN_SUB) && kb && cb == 0) ||
                       ((op == TPK_RPN_MUL || op == TPK_RPN_DIV) && kb && cb == 1)) {
                st = rb_append(E, out, a.n, a.len);
            } else if (op == TPK_RPN_SUB && ka && ca == 0) {
                if ((st = rb_append(E, out, b.n, b.len)) == TPK_OK)
                    st = rb_push(E, out, TPK_RPN_NEG, -1, 0, NULL);
            } else if ((st = rb_append(E, out, a.n, a.len)) == TPK_OK &&
                       (st = rb_append(E, out, b.n, b.len)) == TPK_OK) {
                st = rb_push(E, out, op, -1, 0, NULL);
            }
            if (st)
                st = nsr_error(E->S, TPK_EINVAL, e->line, e->col, "expression too large");
        }
        rb_free(E, &a);
        rb_free(E, &b);
        return st;
    }
    default:
        return nsr_error(E->S, TPK_ETYPE, e->line, e->col, "unsupported expression");
    }
}

/* ---- Rolled mode (issue 14) ---------------------------------------------------------------- */

/* A number from constants, parameters and bound loop variables, or 0 without a word (the
 * unrolled-size estimate must not report errors the evaluator will report with context). */
static int try_number(const elab *E, const nsr_expr *e, double *v)
{
    double a, b;
    switch (e->kind) {
    case NSR_E_NUM:
        *v = e->num;
        return 1;
    case NSR_E_NAME:
        if (e->nidx || e->sym < 0 || !E->have[e->sym] ||
            (E->C->sym[e->sym].kind != NSR_SYM_PARAM && E->C->sym[e->sym].kind != NSR_SYM_LOOP))
            return 0;
        *v = E->num[e->sym];
        return 1;
    case NSR_E_NEG:
        if (!try_number(E, e->a, &a))
            return 0;
        *v = -a;
        return 1;
    case NSR_E_BIN:
        if (!try_number(E, e->a, &a) || !try_number(E, e->b, &b))
            return 0;
        *v = e->op == NSR_T_PLUS ? a + b : e->op == NSR_T_MINUS ? a - b : e->op == NSR_T_STAR ? a * b
             : e->op == NSR_T_SLASH ? a / b : pow(a, b);
        return 1;
    default:
        return 0;
    }
}

/* Unrolled steps of one member of an expression: nodes, index sums multiplied out. */
static long expr_cost(const elab *E, const nsr_expr *e, int depth)
{
    if (e == NULL || depth > NSR_MAX_DEPTH)
        return 1;
    long c = 1;
    if (e->kind == NSR_E_SUM || e->kind == NSR_E_SOFTMAX) {
        double lo, hi;
        long n = try_number(E, e->args[0], &lo) && try_number(E, e->args[1], &hi) && hi >= lo
                     ? (long)fmin(hi - lo + 1, 1e7) : 1000;
        long b = expr_cost(E, e->a, depth + 1);
        return 1 + (e->kind == NSR_E_SOFTMAX ? 3 : 1) * n * b;
    }
    c += expr_cost(E, e->a, depth + 1) + (e->kind == NSR_E_BIN || e->kind == NSR_E_APPLY
                                          ? expr_cost(E, e->b, depth + 1) : 0);
    for (int i = 0; i < e->nargs; i++)
        c += expr_cost(E, e->args[i], depth + 1);
    return c > 1000000000L ? 1000000000L : c;
}

/* Instantiate the functions an expression calls (e->phi), so the evaluator needs no registry. */
static int bind_phis(elab *E, nsr_expr *e, int depth)
{
    if (e == NULL || depth > 4 * NSR_MAX_DEPTH)
        return TPK_OK;
    if (e->kind == NSR_E_CALL && e->sym >= 0 && !is_mean(e) && !is_bn(e)) {
        const nsr_sym *y = &E->C->sym[e->sym];
        const char *spec = y->kind == NSR_SYM_FUNC ? y->name
                           : y->kind == NSR_SYM_PARAM ? E->spec[e->sym] : NULL;
        if (y->kind == NSR_SYM_PARAM && spec == NULL)
            return nsr_error(E->S, TPK_ETYPE, e->line, e->col,
                             "'%s' is a number parameter (= %g), not a function", e->name,
                             E->num[e->sym]);
        if (spec != NULL && (e->phi = get_phi(E, spec, e->line, e->col)) == NULL)
            return TPK_ETYPE;
    }
    if (bind_phis(E, e->a, depth + 1) || bind_phis(E, e->b, depth + 1))
        return TPK_ETYPE;
    for (int i = 0; i < e->nargs; i++)
        if (bind_phis(E, e->args[i], depth + 1))
            return TPK_ETYPE;
    for (int i = 0; i < e->nidx; i++)
        if (bind_phis(E, e->idx[i], depth + 1))
            return TPK_ETYPE;
    return TPK_OK;
}

static int record_family(elab *E, nsr_stmt *s)
{
    nsr_rolled *R = E->R;
    if (R->nfi >= NSR_MAX_FAMILY_INSTR)
        return nsr_error(E->S, TPK_EINVAL, s->line, s->col,
                         "more than %d family instructions", NSR_MAX_FAMILY_INSTR);
    if (bind_phis(E, s->value, 0))
        return TPK_ETYPE;
    if (grow(E, (void **)&R->fi, &R->capfi, R->nfi + 1, sizeof *R->fi))
        return oom(E);
    nsr_finstr *f = &R->fi[R->nfi];
    memset(f, 0, sizeof *f);
    f->stmt = s;
    f->nloops = E->ndom;
    memcpy(f->loop, E->dom, sizeof E->dom);
    f->num = nsr_alloc(R->arena, ((size_t)E->C->nsym + 1) * sizeof *f->num);
    if (f->num == NULL)
        return oom(E);
    for (int i = 0; i < E->C->nsym; i++)
        f->num[i] = E->have[i] ? E->num[i] : NAN;
    f->estimate = E->dom_size * expr_cost(E, s->value, 0);
    R->nfi++;
    return TPK_OK;
}

static int record_decl(elab *E, const nsr_stmt *s)
{
    int idx[NSR_MAX_INDICES];
    if (eval_indices(E, s->idx, s->nidx, idx))
        return TPK_ETYPE;
    member *m = find_member(E, s->fam, s->nidx, idx);
    nsr_rolled *R = E->R;
    if (m == NULL || grow(E, (void **)&R->dm, &R->capdm, R->ndm + 1, sizeof *R->dm))
        return oom(E);
    nsr_dmember *d = &R->dm[R->ndm++];
    memset(d, 0, sizeof *d);
    d->sym = s->fam;
    d->nidx = s->nidx;
    memcpy(d->idx, idx, sizeof idx);
    d->kind = s->kind == NSR_S_ADECL ? NSR_DM_AVAR : NSR_DM_GDECL;
    d->mean = m->mean;
    d->var = m->v;
    return TPK_OK;
}

/* ---- Statements ------------------------------------------------------------------------------ */
static int exec_block(elab *E, nsr_stmt **stmts, int n);

static int exec_param(elab *E, const nsr_stmt *s)
{
    int p = s->fam;
    const nsr_expr *v = s->value;
    E->have[p] = 1;
    if (v->kind == NSR_E_NAME && v->sym >= 0) {
        const nsr_sym *y = &E->C->sym[v->sym];
        if (y->kind == NSR_SYM_FUNC) {
            E->spec[p] = y->name;
            return TPK_OK;
        }
        if (y->kind == NSR_SYM_PARAM && E->spec[v->sym] != NULL) {
            E->spec[p] = E->spec[v->sym];
            return TPK_OK;
        }
    }
    if (v->kind == NSR_E_CALL && v->sym >= 0 && E->C->sym[v->sym].kind == NSR_SYM_FUNC) {
        /* a function with bound parameters: leaky_relu(0.1) → spec "leaky_relu(0.1)" */
        char buf[256];
        size_t k = (size_t)snprintf(buf, sizeof buf, "%s(", v->name);
        for (int i = 0; i < v->nargs && k < sizeof buf; i++) {
            double x;
            if (eval_number(E, v->args[i], "a function parameter", &x))
                return TPK_ETYPE;
            k += (size_t)snprintf(buf + k, sizeof buf - k, "%s%.15g", i ? "," : "", x);
        }
        if (k < sizeof buf)
            snprintf(buf + k, sizeof buf - k, ")");
        char *spec = nsr_strndup(E->S->arena, buf, strlen(buf));
        if (spec == NULL)
            return oom(E);
        E->spec[p] = spec;
        /* instantiate now, so that a bad spec is reported at the parameter */
        return get_phi(E, spec, v->line, v->col) == NULL ? TPK_ETYPE : TPK_OK;
    }
    return eval_number(E, v, "a parameter value", &E->num[p]);
}

static int exec_decl(elab *E, const nsr_stmt *s)
{
    int idx[NSR_MAX_INDICES];
    if (eval_indices(E, s->idx, s->nidx, idx))
        return TPK_ETYPE;
    member *o = find_member(E, s->fam, s->nidx, idx);
    if (o != NULL) {
        char *key = nsr_member_name(E->S->ctx, s->name, s->nidx, idx);
        int st = nsr_error(E->S, TPK_ETYPE, s->name_line, s->name_col,
                           "redeclaration of %s (first declared at line %d)", key ? key : s->name,
                           o->line);
        tpk_free(E->S->ctx, key);
        return st;
    }
    double mean = 0, var;
    if (s->mean != NULL && eval_number(E, s->mean, "a mean", &mean))
        return TPK_ETYPE;
    if (eval_number(E, s->var, "a variance", &var))
        return TPK_ETYPE;
    if (var < 0)
        return nsr_error(E->S, TPK_ETYPE, s->var->line, s->var->col, "variance of %s is negative (%g)",
                         s->name, var);
    member *m = add_member(E, s->fam, s->nidx, idx, s->kind == NSR_S_ADECL ? M_AVAR : M_GDECL,
                           s->name_line, s->name_col);
    if (m == NULL)
        return oom(E);
    m->mean = mean;
    m->v = var;
    return TPK_OK;
}

static int exec_def(elab *E, const nsr_stmt *s)
{
    int idx[NSR_MAX_INDICES];
    if (eval_indices(E, s->idx, s->nidx, idx))
        return TPK_ETYPE;
    member *o = find_member(E, s->fam, s->nidx, idx);
    char *name = nsr_member_name(E->S->ctx, s->name, s->nidx, idx);
    if (name == NULL)
        return oom(E);
    if (o != NULL) {
        int st = nsr_error(E->S, TPK_ETYPE, s->name_line, s->name_col,
                           "redefinition of %s (first defined at line %d)", name, o->line);
        tpk_free(E->S->ctx, name);
        return st;
    }
    const nsr_sym *f = &E->C->sym[s->fam];
    const nsr_expr *e = s->value;
    char what[300];
    snprintf(what, sizeof what, "definition of %s", name);
    int v;
    rbuf r = {0};
    if (e->kind == NSR_E_APPLY ||
        (e->kind == NSR_E_CALL && e->sym >= 0 && E->C->sym[e->sym].kind == NSR_SYM_AFAM)) {
        /* g = W h: the MatMul writes the target directly */
        if (s->annot == NSR_ANN_SCALAR) {
            tpk_free(E->S->ctx, name);
            return nsr_error(E->S, TPK_ETYPE, e->line, e->col,
                             "%s: a MatMul gives a G-var, not a scalar", what);
        }
        nsr_expr a;
        const nsr_expr *am = e->a, *src = e->b;
        if (e->kind == NSR_E_CALL) {
            a = *e;
            a.kind = NSR_E_NAME;
            am = &a;
            src = e->args[0];
        }
        int st = elab_matmul(E, am, src, e, name, f->node, &r);
        if (st) {
            rb_free(E, &r);
            return st;
        }
        if (rb_is_const(&r, NULL)) {
            v = -2;
        } else {
            v = r.n[0].var;
        }
    } else if (s->annot != NSR_ANN_G && s->annot != NSR_ANN_H &&
               (is_mean(e) || (e->kind == NSR_E_BIN && e->op == NSR_T_STAR &&
                               ((is_sqrt_width(E, e->a) && is_mean(e->b)) ||
                                (is_mean(e->a) && is_sqrt_width(E, e->b)))))) {
        /* m = mean(...) / q = sqrt(n) * mean(...): the Moment writes the target directly */
        int sq = !is_mean(e);
        int st = elab_mean(E, sq ? (is_mean(e->a) ? e->a : e->b) : e, name, sq, &r);
        if (st) {
            rb_free(E, &r);
            return st;
        }
        v = r.n[0].var;
    } else if (s->annot != NSR_ANN_G && s->annot != NSR_ANN_SCALAR &&
               (is_bn(e) || (e->kind == NSR_E_CALL && e->nargs == 1 && is_bn(e->args[0])))) {
        /* h = relu(bn(g)): the batch-coupled Nonlin writes the target directly */
        const tpk_phi *phi = is_bn(e) ? NULL : call_phi(E, e);
        int st = !is_bn(e) && phi == NULL
                     ? (E->S->ctx->status ? E->S->ctx->status
                        : nsr_error(E->S, TPK_ETYPE, e->line, e->col, "'%s' is not a function", e->name))
                     : elab_bn(E, is_bn(e) ? e : e->args[0], phi, name, f->node, &r);
        if (st) {
            if (!is_bn(e) && phi == NULL)
                tpk_free(E->S->ctx, name);
            rb_free(E, &r);
            return st;
        }
        v = r.n[0].var;
    } else {
        int st = elab_expr(E, e, &r);
        if (st) {
            rb_free(E, &r);
            tpk_free(E->S->ctx, name);
            return st;
        }
        v = materialize(E, &r, s->annot, name, f->node, e->line, e->col, what);
        if (v == -1) {
            rb_free(E, &r);
            return TPK_ETYPE;
        }
    }
    member *m = add_member(E, s->fam, s->nidx, idx, v >= 0 ? M_VAR : M_CONST, s->name_line,
                           s->name_col);
    if (m == NULL) {
        rb_free(E, &r);
        return oom(E);
    }
    if (v >= 0) {
        m->var = v;
    } else {
        m->value = r.len == 1 ? r.n[0].value : 0;
    }
    rb_free(E, &r);
    return TPK_OK;
}

/* The var that one readout vector reads: a G- or H-var, materialised as an H-var when it is an
 * expression (readout(relu(g), ...)). */
static int readout_vector(elab *E, const nsr_expr *e, const nsr_expr *rd, int *out)
{
    rbuf r = {0};
    int v = -1, st = elab_expr(E, e, &r);
    if (st == TPK_OK) {
        if (r.len == 1 && (r.n[0].op == TPK_RPN_GVAR || r.n[0].op == NSR_RPN_HVAR)) {
            v = r.n[0].var;
        } else if (r.len == 1 && r.n[0].op == TPK_RPN_SCALAR) {
            st = nsr_error(E->S, TPK_ETYPE, e->line, e->col,
                           "readout needs a G- or H-var, not the scalar '%s'", E->p->var[r.n[0].var].name);
        } else if (rb_is_const(&r, NULL)) {
            st = nsr_error(E->S, TPK_ETYPE, e->line, e->col,
                           "readout of a constant vector; a readout must read an H- or G-var");
        } else {
            v = materialize(E, &r, NSR_ANN_H, NULL, -1, rd->line, rd->col, "readout");
            if (v == -1)
                st = TPK_ETYPE;
            else if (v < 0 || E->p->var[v].type == TPK_VAR_SCALAR)
                st = nsr_error(E->S, TPK_ETYPE, e->line, e->col,
                               "readout needs a G- or H-var, not a scalar expression");
        }
    }
    rb_free(E, &r);
    *out = v;
    return st;
}

static int exec_output(elab *E, const nsr_stmt *s)
{
    int idx[NSR_MAX_INDICES];
    if (eval_indices(E, s->idx, s->nidx, idx))
        return TPK_ETYPE;
    member *o = find_member(E, s->fam, s->nidx, idx);
    char *name = nsr_member_name(E->S->ctx, s->name, s->nidx, idx);
    if (name == NULL)
        return oom(E);
    if (o != NULL) {
        int st = nsr_error(E->S, TPK_ETYPE, s->name_line, s->name_col,
                           "redefinition of output %s (first defined at line %d)", name, o->line);
        tpk_free(E->S->ctx, name);
        return st;
    }
    const nsr_expr *rd = s->value;
    double var, bias_var = 0;
    int st = eval_number(E, rd->args[1], "the readout variance", &var);
    if (st == TPK_OK && var < 0)
        st = nsr_error(E->S, TPK_ETYPE, rd->args[1]->line, rd->args[1]->col,
                       "readout variance is negative (%g)", var);
    if (st == TPK_OK && rd->nargs == 3) {
        st = eval_number(E, rd->args[2], "the readout bias variance", &bias_var);
        if (st == TPK_OK && bias_var < 0)
            st = nsr_error(E->S, TPK_ETYPE, rd->args[2]->line, rd->args[2]->col,
                           "readout bias variance is negative (%g)", bias_var);
    }
    /* the parts: one vector, or the m of readout(concat(h1, ..., hm), ...) (checked in check.c) */
    const nsr_expr *a0 = rd->args[0];
    int concat = a0->kind == NSR_E_CALL && a0->sym < 0 && strcmp(a0->name, "concat") == 0;
    int m = concat ? a0->nargs : 1;
    int *part = st == TPK_OK && concat ? tpk_malloc(E->S->ctx, (size_t)m * sizeof *part) : NULL;
    int v = -1;
    if (st == TPK_OK && concat && part == NULL)
        st = oom(E);
    for (int k = 0; k < m && st == TPK_OK; k++) {
        st = readout_vector(E, concat ? a0->args[k] : a0, rd, &v);
        if (part != NULL)
            part[k] = v;
    }
    char *rname = NULL;
    if (st == TPK_OK && rd->nidx == 1 &&
        (rname = tpk_strdup(E->S->ctx, rd->idx[0]->name)) == NULL)
        st = oom(E);
    tpk_program *p = E->p;
    /* one readout vector has one width: every output it reads has the same number of parts */
    for (int i = 0; i < p->noutputs && st == TPK_OK; i++) {
        const tpk_output *q = &p->output[i];
        const tpk_output me = {.readout = rname};
        if (nsr_same_readout(q, &me) && nsr_out_nparts(q) != m)
            st = nsr_error(E->S, TPK_ETYPE, rd->line, rd->col,
                           "%s reads %d vector%s out through the %s readout vector, as %s reads "
                           "%d: give one of them a readout vector of its own, readout[u](...)",
                           name, m, m == 1 ? "" : "s", rname ? rname : "default", q->name,
                           nsr_out_nparts(q));
    }
    if (st == TPK_OK &&
        (grow(E, (void **)&p->output, &E->capout, p->noutputs + 1, sizeof *p->output) ||
         add_member(E, s->fam, s->nidx, idx, M_OUT, s->name_line, s->name_col) == NULL))
        st = oom(E);
    if (st) {
        tpk_free(E->S->ctx, part);
        tpk_free(E->S->ctx, rname);
        tpk_free(E->S->ctx, name);
        return st;
    }
    tpk_output *y = &p->output[p->noutputs];
    y->name = name;
    y->src = part != NULL ? part[0] : v;
    y->var = var;
    y->bias_var = bias_var;
    y->nparts = m > 1 ? m : 0;
    y->part = part;
    y->readout = rname;
    p->noutputs++;
    return TPK_OK;
}

/* Final parameter values (after --set), so outputs can describe themselves. */
static int record_params(elab *E)
{
    const nsr_check *C = E->C;
    tpk_program *p = E->p;
    int n = 0;
    for (int i = 0; i < C->nsym; i++)
        n += C->sym[i].kind == NSR_SYM_PARAM && E->have[i];
    p->param_name = tpk_calloc(E->S->ctx, (size_t)n + 1, sizeof *p->param_name);
    p->param_value = tpk_calloc(E->S->ctx, (size_t)n + 1, sizeof *p->param_value);
    p->param_integer = tpk_calloc(E->S->ctx, (size_t)n + 1, sizeof *p->param_integer);
    if (p->param_name == NULL || p->param_value == NULL || p->param_integer == NULL)
        return TPK_ENOMEM;
    for (int i = 0; i < C->nsym; i++) {
        if (C->sym[i].kind != NSR_SYM_PARAM || !E->have[i])
            continue;
        char buf[64];
        if (E->spec[i] == NULL)
            snprintf(buf, sizeof buf, "%.17g", E->num[i]);
        p->param_name[p->nparams] = tpk_strdup(E->S->ctx, C->sym[i].name);
        p->param_value[p->nparams] = tpk_strdup(E->S->ctx, E->spec[i] ? E->spec[i] : buf);
        p->param_integer[p->nparams] = E->spec[i] == NULL && C->sym[i].integer;
        if (p->param_name[p->nparams] == NULL || p->param_value[p->nparams] == NULL) {
            tpk_free(E->S->ctx, p->param_name[p->nparams]);
            tpk_free(E->S->ctx, p->param_value[p->nparams]);
            return TPK_ENOMEM;
        }
        p->nparams++;
    }
    return TPK_OK;
}

static int exec_stmt(elab *E, nsr_stmt *s)
{
    if (++E->steps > NSR_MAX_STEPS) {
        E->S->too_large = 1;
        return nsr_error(E->S, TPK_EINVAL, s->line, s->col,
                         "program too large after unrolling (more than %d statements)", NSR_MAX_STEPS);
    }
    switch (s->kind) {
    case NSR_S_PARAM:
        return exec_param(E, s);
    case NSR_S_INPUT:
        if (s->lo != NULL) {
            int lo, hi;
            if (eval_int(E, s->lo, "a range bound", &lo) || eval_int(E, s->hi, "a range bound", &hi))
                return TPK_ETYPE;
            if (hi < lo)
                return nsr_error(E->S, TPK_ETYPE, s->lo->line, s->lo->col,
                                 "empty input range %d..%d", lo, hi);
            if ((long)hi - lo + 1 > 1000000)
                return nsr_error(E->S, TPK_ETYPE, s->lo->line, s->lo->col, "input range too long");
            E->input_lo = lo;
            E->p->nslots = hi - lo + 1;
        } else {
            E->input_lo = 0;
            E->p->nslots = 1;
        }
        return TPK_OK;
    case NSR_S_ADECL:
    case NSR_S_GDECL: {
        int st = exec_decl(E, s);
        return st || E->R == NULL ? st : record_decl(E, s);
    }
    case NSR_S_DEF:
        return E->R ? record_family(E, s) : exec_def(E, s);
    case NSR_S_OUTPUT:
        return E->R ? record_family(E, s) : exec_output(E, s);
    case NSR_S_FOR: {
        int lo, hi;
        if (E->R && s->rolled) {
            /* one index of the domain; bounds may read outer rolled indices, which stand at
             * their largest value here, so dom_size bounds the domain's size */
            double a, b;
            long n = try_number(E, s->lo, &a) && try_number(E, s->hi, &b)
                         ? (b >= a ? (long)fmin(b - a + 1, 1e9) : 0) : 1000;
            if (E->ndom >= NSR_MAX_INDICES)
                return nsr_error(E->S, TPK_EINVAL, s->line, s->col, "loops nested too deeply");
            long saved = E->dom_size;
            E->dom_size = saved * n > 4000000000000L / (n ? n : 1) ? saved : saved * n;
            E->dom[E->ndom++] = s;
            E->have[s->fam] = 1;
            E->num[s->fam] = try_number(E, s->hi, &b) ? b : 0;
            int st = exec_block(E, s->body, s->nbody);
            E->have[s->fam] = 0;
            E->ndom--;
            E->dom_size = saved;
            return st;
        }
        if (eval_int(E, s->lo, "a range bound", &lo) || eval_int(E, s->hi, "a range bound", &hi))
            return TPK_ETYPE;
        E->have[s->fam] = 1;
        for (long i = lo; i <= hi; i++) {
            long t = s->down ? hi - (i - lo) : i; /* 'by -1': hi down to lo */
            if (++E->steps > NSR_MAX_STEPS) {
                E->S->too_large = 1;
                return nsr_error(E->S, TPK_EINVAL, s->line, s->col,
                                 "program too large after unrolling (more than %d steps)", NSR_MAX_STEPS);
            }
            E->num[s->fam] = (double)t;
            int st = exec_block(E, s->body, s->nbody);
            if (st)
                return st;
        }
        E->have[s->fam] = 0;
        return TPK_OK;
    }
    default:
        return TPK_OK;
    }
}

static int exec_block(elab *E, nsr_stmt **stmts, int n)
{
    for (int i = 0; i < n; i++) {
        int st = exec_stmt(E, stmts[i]);
        if (st)
            return st;
    }
    return TPK_OK;
}

/* ---- Finalisation: width ids, holes, features --------------------------------------------- */
static int width_id(elab *E, int node, const char *what, int line, int *out)
{
    nsr_check *C = E->C;
    int r = nsr_uf_find(C, node);
    int s = C->uf[r].rigid;
    if (s < 0) {
        if (E->p->nwidths == 1) {
            *out = 0;
            return TPK_OK;
        }
        for (int i = 0; i < C->nuf; i++)
            if (C->uf[i].hole && nsr_uf_find(C, i) == r)
                return nsr_error(E->S, TPK_ETYPE, C->uf[i].line, C->uf[i].col,
                                 "hole '_' is unconstrained, so the width of %s (line %d) cannot be "
                                 "inferred; write a width symbol", what, line);
        return nsr_error(E->S, TPK_ETYPE, line, 1,
                         "cannot infer the width of %s: nothing constrains it (declare it, or "
                         "declare exactly one width symbol)", what);
    }
    for (int i = 0; i < E->p->nwidths; i++)
        if (strcmp(E->p->width_name[i], C->sym[s].name) == 0) {
            *out = i;
            return TPK_OK;
        }
    return nsr_error(E->S, TPK_ETYPE, line, 1, "%s has the input dimension %s as a width", what,
                     C->sym[s].name);
}

static int finalize(elab *E)
{
    tpk_program *p = E->p;
    nsr_check *C = E->C;
    int nw = 0;
    for (int i = 0; i < C->nsym; i++)
        nw += C->sym[i].kind == NSR_SYM_WIDTH;
    if (nw == 0)
        return nsr_error(E->S, TPK_ETYPE, 1, 1, "the program declares no width (write 'width n')");
    p->width_name = tpk_calloc(E->S->ctx, (size_t)nw, sizeof *p->width_name);
    if (p->width_name == NULL)
        return oom(E);
    for (int i = 0; i < C->nsym; i++)
        if (C->sym[i].kind == NSR_SYM_WIDTH) {
            if ((p->width_name[p->nwidths] = tpk_strdup(E->S->ctx, C->sym[i].name)) == NULL)
                return oom(E);
            p->nwidths++;
        }
    for (int v = 0; v < p->nvars; v++) {
        if (p->var[v].type == TPK_VAR_SCALAR)
            continue;
        if (width_id(E, E->var_node[v], p->var[v].name, E->var_line[v], &p->var[v].width))
            return TPK_ETYPE;
    }
    for (int a = 0; a < p->navars; a++) {
        int rows = p->avar[a].rows, cols = p->avar[a].cols;
        if (width_id(E, rows, p->avar[a].name, 1, &p->avar[a].rows) ||
            width_id(E, cols, p->avar[a].name, 1, &p->avar[a].cols))
            return TPK_ETYPE;
    }
    for (int a = 0; a < p->nembeds; a++)
        if (width_id(E, p->embed[a].rows, p->embed[a].name, 1, &p->embed[a].rows))
            return TPK_ETYPE;
    if (p->noutputs == 0)
        return nsr_error(E->S, TPK_ETYPE, 1, 1,
                         "the program has no output (write 'output y = readout(h, sigma_v2)')");
    /* a concatenation [h1; ...; hm] has width m·n only when its parts share the width n */
    for (int o = 0; o < p->noutputs; o++)
        for (int k = 1; k < nsr_out_nparts(&p->output[o]); k++) {
            const tpk_var *a = &p->var[p->output[o].src], *b = &p->var[p->output[o].part[k]];
            if (a->width != b->width)
                return nsr_error(E->S, TPK_ETYPE, E->var_line[p->output[o].part[k]], 1,
                                 "%s concatenates %s (width %s) and %s (width %s): the parts of "
                                 "concat(...) must have one width", p->output[o].name, a->name,
                                 p->width_name[a->width], b->name, p->width_name[b->width]);
        }
    if (E->S->opts != NULL && E->S->opts->explain)
        for (int i = 0; i < C->nuf; i++) {
            if (!C->uf[i].hole)
                continue;
            int r = nsr_uf_find(C, i);
            if (C->uf[r].rigid >= 0)
                nsr_note(E->S, C->uf[i].line, C->uf[i].col, "hole '_' must be %s",
                         C->sym[C->uf[r].rigid].name);
            else
                nsr_note(E->S, C->uf[i].line, C->uf[i].col,
                         "hole '_' is unconstrained (any width symbol)%s",
                         p->nwidths == 1 ? "; taking the only width" : "");
        }
    if (record_params(E))
        return oom(E);
    /* hand the function instances to the program */
    if (E->nphis > 0) {
        p->phis = tpk_calloc(E->S->ctx, (size_t)E->nphis, sizeof *p->phis);
        if (p->phis == NULL)
            return oom(E);
        for (int i = 0; i < E->nphis; i++) {
            p->phis[i] = E->phis[i].phi;
            E->phis[i].phi = NULL;
        }
        p->nphis = E->nphis;
    }
    return TPK_OK;
}

/* The elaborator's working arrays (both forms), given back once the program is built. */
static void elab_scratch_free(nsr_state *S, elab *E)
{
    tpk_free(S->ctx, E->phis);
    tpk_free(S->ctx, E->num);
    tpk_free(S->ctx, E->spec);
    tpk_free(S->ctx, E->have);
    tpk_free(S->ctx, E->mem);
    tpk_free(S->ctx, E->bucket);
    tpk_free(S->ctx, E->var_node);
    tpk_free(S->ctx, E->var_line);
}

tpk_program *nsr_elaborate(nsr_state *S, nsr_ast *ast, nsr_check *C)
{
    elab E = {.S = S, .C = C};
    E.p = tpk_calloc(S->ctx, 1, sizeof *E.p);
    if (E.p != NULL)
        E.p->alloc = tpk_ctx_allocator(S->ctx);
    E.num = tpk_calloc(S->ctx, (size_t)C->nsym + 1, sizeof *E.num);
    E.spec = tpk_calloc(S->ctx, (size_t)C->nsym + 1, sizeof *E.spec);
    E.have = tpk_calloc(S->ctx, (size_t)C->nsym + 1, sizeof *E.have);
    int st = TPK_ENOMEM;
    if (E.p != NULL && E.num != NULL && E.spec != NULL && E.have != NULL) {
        E.p->path = tpk_strdup(S->ctx, S->file);
        st = E.p->path == NULL ? oom(&E) : exec_block(&E, ast->stmts, ast->nstmts);
        if (st == TPK_OK)
            st = finalize(&E);
    } else {
        oom(&E);
    }
    for (int i = 0; i < E.nphis; i++) {
        tpk_free(S->ctx, E.phis[i].spec);
        tpk_phi_free(E.phis[i].phi);
    }
    elab_scratch_free(S, &E);
    if (st) {
        tpk_program_free(E.p);
        return NULL;
    }
    return E.p;
}

/* Rolled mode: parameters, declarations and sequential loops as above; every definition and
 * output becomes a family instruction of r (issue 14). p gets the widths, input slots and the
 * final parameter values; its instructions stay empty. */
int nsr_elaborate_rolled(nsr_state *S, nsr_ast *ast, nsr_check *C, tpk_program *p, nsr_rolled *R)
{
    elab E = {.S = S, .C = C, .p = p, .R = R, .dom_size = 1};
    E.num = tpk_calloc(S->ctx, (size_t)C->nsym + 1, sizeof *E.num);
    E.spec = tpk_calloc(S->ctx, (size_t)C->nsym + 1, sizeof *E.spec);
    E.have = tpk_calloc(S->ctx, (size_t)C->nsym + 1, sizeof *E.have);
    int st = TPK_ENOMEM;
    if (E.num != NULL && E.spec != NULL && E.have != NULL) {
        st = exec_block(&E, ast->stmts, ast->nstmts);
        R->input_lo = E.input_lo;
        if (st == TPK_OK && record_params(&E))
            st = oom(&E);
        int nw = 0;
        for (int i = 0; st == TPK_OK && i < C->nsym; i++)
            nw += C->sym[i].kind == NSR_SYM_WIDTH;
        if (st == TPK_OK && nw == 0)
            st = nsr_error(S, TPK_ETYPE, 1, 1, "the program declares no width (write 'width n')");
        if (st == TPK_OK &&
            (p->width_name = tpk_calloc(S->ctx, (size_t)nw, sizeof *p->width_name)) == NULL)
            st = oom(&E);
        for (int i = 0; st == TPK_OK && i < C->nsym; i++)
            if (C->sym[i].kind == NSR_SYM_WIDTH &&
                (p->width_name[p->nwidths++] = tpk_strdup(S->ctx, C->sym[i].name)) == NULL)
                st = oom(&E);
    } else {
        oom(&E);
    }
    /* the function instances stay with the rolled form */
    R->phis = tpk_calloc(S->ctx, (size_t)E.nphis + 1, sizeof *R->phis);
    for (int i = 0; i < E.nphis; i++) {
        tpk_free(S->ctx, E.phis[i].spec);
        if (R->phis != NULL)
            R->phis[R->nphis++] = E.phis[i].phi;
        else
            tpk_phi_free(E.phis[i].phi);
    }
    if (R->phis == NULL && st == TPK_OK)
        st = oom(&E);
    elab_scratch_free(S, &E);
    return st;
}
