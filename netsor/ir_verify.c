/* The family IR's verifier (ir-impl.h): the rules every pass and back end may rely on, checked
 * after lowering in the tests and under --verify-ir (LLVM's Verifier is the model: a malformed
 * IR is a bug of the compiler, reported at the first broken rule with the node that breaks it). */
#include "ir-impl.h"
#include "tpk/alloc.h"

#include <stdarg.h>
#include <string.h>

typedef struct vctx {
    const nsr_rolled *R;
    const nsr_ir *ir;
    tpk_ctx *ctx;
} vctx;

static int bad(vctx *V, int k, const char *fmt, ...) TPK_PRINTF(3, 4);
static int bad(vctx *V, int k, const char *fmt, ...)
{
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (k < 0 || k >= V->ir->nn)
        return TPK_ERROR(V->ctx, TPK_EINVAL, "%s: invalid family IR: %s", V->R->file, msg);
    const nsr_irn *n = &V->ir->n[k];
    return TPK_ERROR(V->ctx, TPK_EINVAL, "%s: invalid family IR: node %%%d (%s, family instruction "
                     "%d, @%d:%d): %s", V->R->file, k, nsr_ir_op_name(n->op), n->fi,
                     n->e ? n->e->line : 0, n->e ? n->e->col : 0, msg);
}

/* Operands: each kind's arity, and every operand an earlier node of the same statement. */
static int check_arity(vctx *V, int k)
{
    const nsr_irn *n = &V->ir->n[k];
    int lo = 0, hi = 0;
    switch (n->op) {
    case NSR_IR_NUM: case NSR_IR_SQRTN: case NSR_IR_READ: case NSR_IR_INPUT: case NSR_IR_BN:
    case NSR_IR_UNSUP:
        break;
    case NSR_IR_MAP:
        lo = n->e != NULL && n->e->nargs != 1 ? 0 : 1; /* φ(a, b) is an evaluation error */
        hi = lo;
        break;
    case NSR_IR_MATMUL: case NSR_IR_POW: case NSR_IR_SUM: case NSR_IR_SOFTMAX: case NSR_IR_MOMENT:
    case NSR_IR_DEF:
        lo = hi = 1;
        break;
    case NSR_IR_MUL: case NSR_IR_DIV:
        lo = hi = 2;
        break;
    case NSR_IR_OUTPUT:
        lo = 2, hi = 3;
        break;
    case NSR_IR_LIN:
        if (n->nterms < 1 || n->terms == NULL || n->sign == NULL)
            return bad(V, k, "a LIN without terms");
        lo = hi = n->nterms < NSR_IR_MAXARG ? n->nterms : NSR_IR_MAXARG;
        for (int i = 0; i < n->nterms; i++) {
            if (n->sign[i] != 1 && n->sign[i] != -1)
                return bad(V, k, "term %d has sign %d (not ±1)", i, n->sign[i]);
            if (i < NSR_IR_MAXARG && n->terms[i] != n->arg[i])
                return bad(V, k, "term %d is %%%d but operand %d is %%%d", i, n->terms[i], i,
                           n->arg[i]);
        }
        break;
    default:
        return bad(V, k, "unknown instruction kind %d", n->op);
    }
    if (n->narg < lo || n->narg > hi)
        return lo == hi ? bad(V, k, "%d operands (a %s takes %d)", n->narg, nsr_ir_op_name(n->op), lo)
                        : bad(V, k, "%d operands (a %s takes %d to %d)", n->narg,
                              nsr_ir_op_name(n->op), lo, hi);
    return TPK_OK;
}

static int operand_at(const nsr_irn *n, int i)
{
    return n->op == NSR_IR_LIN ? n->terms[i] : n->arg[i];
}
static int noperands(const nsr_irn *n)
{
    return n->op == NSR_IR_LIN ? n->nterms : n->narg;
}

/* The tree: post-order within the statement, each non-root node used once, roots last. */
static int check_tree(vctx *V, int *uses)
{
    const nsr_ir *ir = V->ir;
    if (ir->nfi != V->R->nfi)
        return bad(V, -1, "%d family instructions, the rolled form has %d", ir->nfi, V->R->nfi);
    int next = 0;
    for (int f = 0; f < ir->nfi; f++) {
        if (ir->fi[f].first != next || ir->fi[f].count < 1)
            return bad(V, -1, "family instruction %d covers nodes %d..%d, not from %d", f,
                       ir->fi[f].first, ir->fi[f].first + ir->fi[f].count - 1, next);
        next += ir->fi[f].count;
    }
    if (next != ir->nn)
        return bad(V, -1, "the family instructions cover %d of %d nodes", next, ir->nn);
    for (int f = 0; f < ir->nfi; f++) {
        int root = nsr_ir_root(ir, f);
        for (int k = ir->fi[f].first; k <= root; k++) {
            const nsr_irn *n = &ir->n[k];
            int is_root = n->op == NSR_IR_DEF || n->op == NSR_IR_OUTPUT;
            if (n->fi != f)
                return bad(V, k, "says family instruction %d, stands in %d", n->fi, f);
            if (is_root != (k == root))
                return bad(V, k, k == root ? "the last node of a statement is not DEF or OUTPUT"
                                           : "DEF or OUTPUT before the end of its statement");
            if (check_arity(V, k))
                return TPK_EINVAL;
            for (int i = 0; i < noperands(n); i++) {
                int a = operand_at(n, i);
                if (a < ir->fi[f].first || a >= k)
                    return bad(V, k, "operand %d is %%%d, not an earlier node of its statement", i, a);
                if (ir->n[a].op == NSR_IR_DEF || ir->n[a].op == NSR_IR_OUTPUT)
                    return bad(V, k, "operand %d is the root %%%d", i, a);
                uses[a]++;
            }
        }
    }
    for (int k = 0; k < ir->nn; k++) {
        const nsr_irn *n = &ir->n[k];
        int is_root = n->op == NSR_IR_DEF || n->op == NSR_IR_OUTPUT;
        if (!is_root && uses[k] != 1)
            return bad(V, k, "used %d times (every value of the tree is used once)", uses[k]);
    }
    return TPK_OK;
}

/* What each kind names: weights and their sites, binders, functions, statements; scopes and
 * moment bodies pass down the tree. */
static int check_kinds(vctx *V, int *parent)
{
    const nsr_ir *ir = V->ir;
    const nsr_check *C = &V->R->C;
    int site = 0;
    for (int k = 0; k < ir->nn; k++)
        for (int i = 0; i < noperands(&ir->n[k]); i++)
            parent[operand_at(&ir->n[k], i)] = k;
    for (int k = 0; k < ir->nn; k++) {
        const nsr_irn *n = &ir->n[k];
        int sk = n->sym >= 0 && n->sym < C->nsym ? C->sym[n->sym].kind : -1;
        switch (n->op) {
        case NSR_IR_MATMUL:
            if (sk != NSR_SYM_AFAM)
                return bad(V, k, "multiplies %s, not an A-var family", n->e ? n->e->name : "?");
            if (n->site != site)
                return bad(V, k, "site %d, expected %d (sites are numbered in order)", n->site, site);
            site++;
            if (n->embed != (ir->n[n->arg[0]].op == NSR_IR_INPUT))
                return bad(V, k, "embed is %d but its operand is a%s input", n->embed,
                           n->embed ? " not an" : "n");
            break;
        case NSR_IR_INPUT:
            if (parent[k] < 0 || ir->n[parent[k]].op != NSR_IR_MATMUL)
                return bad(V, k, "an input read outside an embedding MatMul");
            if (sk != NSR_SYM_INPUT)
                return bad(V, k, "reads a symbol that is not the input");
            break;
        case NSR_IR_READ:
            if (sk != NSR_SYM_DFAM && sk != NSR_SYM_GFAM && sk != NSR_SYM_PARAM &&
                sk != NSR_SYM_LOOP && sk != -1)
                return bad(V, k, "reads '%s', which is not a family", n->e ? n->e->name : "?");
            break;
        case NSR_IR_MAP:
            if (n->phi == NULL)
                return bad(V, k, "a map without its function");
            break;
        case NSR_IR_SUM:
        case NSR_IR_SOFTMAX:
            if (sk != NSR_SYM_LOOP)
                return bad(V, k, "its binder is not an index symbol");
            break;
        case NSR_IR_UNSUP:
            if (n->why == NULL)
                return bad(V, k, "UNSUP without a reason");
            break;
        case NSR_IR_DEF:
        case NSR_IR_OUTPUT:
            if (n->s == NULL || n->s != V->R->fi[n->fi].stmt || n->sym != n->s->fam ||
                n->s->kind != (n->op == NSR_IR_DEF ? NSR_S_DEF : NSR_S_OUTPUT))
                return bad(V, k, "its statement is not its family instruction's");
            if (n->scope != 0 || n->in_moment)
                return bad(V, k, "a root inside a binder or a moment");
            break;
        default:
            break;
        }
        for (int i = 0; i < noperands(n); i++) {
            const nsr_irn *a = &ir->n[operand_at(n, i)];
            int scope = n->scope + (n->op == NSR_IR_SUM || n->op == NSR_IR_SOFTMAX);
            int mom = n->in_moment || n->op == NSR_IR_MOMENT;
            if (a->scope != scope)
                return bad(V, k, "operand %d has scope %d, expected %d", i, a->scope, scope);
            if (a->in_moment != mom)
                return bad(V, k, "operand %d is %sinside a moment, its user %s", i,
                           a->in_moment ? "" : "not ", mom ? "is" : "is not");
        }
    }
    if (site != ir->nsites)
        return bad(V, -1, "%d MatMul sites, the IR says %d", site, ir->nsites);
    return TPK_OK;
}

/* Types, recomputed in order with the families' types as the definitions give them. */
static int check_types(vctx *V, int *famtype)
{
    const nsr_ir *ir = V->ir;
    for (int k = 0; k < ir->nn; k++) {
        nsr_irn m = ir->n[k];
        nsr_ir_type_node(ir, &m, famtype, &V->R->C);
        if (m.type != ir->n[k].type || m.gates != ir->n[k].gates)
            return bad(V, k, "type %s%s, its operands make it %s%s",
                       nsr_ir_type_name(ir->n[k].type), ir->n[k].gates ? " (gates)" : "",
                       nsr_ir_type_name(m.type), m.gates ? " (gates)" : "");
        if (m.op == NSR_IR_OUTPUT) {
            for (int i = 1; i < m.narg; i++)
                if (ir->n[m.arg[i]].type != NSR_TY_NUM)
                    return bad(V, k, "readout variance %d is not a number", i);
        }
        if (m.op == NSR_IR_DEF) {
            famtype[m.sym] = nsr_ir_type_join(famtype[m.sym], nsr_ir_def_type(ir, &ir->n[k]));
        }
    }
    return TPK_OK;
}

int nsr_ir_verify(const nsr_rolled *R, const nsr_ir *ir, tpk_ctx *ctx)
{
    vctx V = {.R = R, .ir = ir, .ctx = ctx};
    if (ir == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: no family IR", R->file);
    size_t n = (size_t)ir->nn + (size_t)R->C.nsym + 1;
    int *scratch = tpk_calloc(ctx, 2 * n, sizeof *scratch);
    if (scratch == NULL)
        return ctx->status;
    int *uses = scratch, *parent = scratch + n;
    int st = check_tree(&V, uses);
    if (st == TPK_OK) {
        for (int k = 0; k < ir->nn; k++)
            parent[k] = -1;
        st = check_kinds(&V, parent);
    }
    if (st == TPK_OK) {
        memset(scratch, 0, n * sizeof *scratch);
        st = check_types(&V, scratch);
    }
    tpk_free(ctx, scratch);
    return st;
}

int tpk_program_verify_ir(const tpk_program *p, tpk_ctx *ctx)
{
    if (p == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_program_verify_ir: no program");
    if (p->rolled == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: the program has no rolled form, so no family IR",
                         p->path ? p->path : "program");
    return nsr_ir_verify(p->rolled, p->rolled->ir, ctx);
}
