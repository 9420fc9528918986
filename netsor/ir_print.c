/* The family IR as text (`netsor dump --ir`), and the weights' uses (which declared A-var member
 * each MatMul site multiplies; a member used at several sites is tied). */
#include "ir-impl.h"
#include "tpk/alloc.h"

#include <math.h>
#include <string.h>

/* ---- expressions as text ---------------------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t cap, n;
} sbuf;

static void put(sbuf *b, const char *s)
{
    size_t k = strlen(s);
    if (b->cap == 0)
        return;
    if (b->n + k >= b->cap)
        k = b->cap - 1 - b->n;
    memcpy(b->p + b->n, s, k);
    b->n += k;
    b->p[b->n] = '\0';
}

static void expr(sbuf *b, const nsr_expr *e, int depth, int paren)
{
    char num[40];
    if (e == NULL || depth > 64) {
        put(b, "…");
        return;
    }
    switch (e->kind) {
    case NSR_E_NUM:
        snprintf(num, sizeof num, "%.15g", e->num);
        put(b, num);
        return;
    case NSR_E_NAME:
    case NSR_E_CALL:
        put(b, e->name ? e->name : "?");
        if (e->nidx) {
            put(b, "[");
            for (int i = 0; i < e->nidx; i++) {
                put(b, i ? ", " : "");
                expr(b, e->idx[i], depth + 1, 0);
            }
            put(b, "]");
        }
        if (e->kind == NSR_E_CALL) {
            put(b, "(");
            for (int i = 0; i < e->nargs; i++) {
                put(b, i ? ", " : "");
                expr(b, e->args[i], depth + 1, 0);
            }
            put(b, ")");
        }
        return;
    case NSR_E_APPLY:
        put(b, paren ? "(" : "");
        expr(b, e->a, depth + 1, 1);
        put(b, " ");
        expr(b, e->b, depth + 1, 1);
        put(b, paren ? ")" : "");
        return;
    case NSR_E_NEG:
        put(b, "-");
        expr(b, e->a, depth + 1, 1);
        return;
    case NSR_E_TRANSPOSE:
        expr(b, e->a, depth + 1, 1);
        put(b, "'");
        return;
    case NSR_E_BIN: {
        const char *op = e->op == NSR_T_PLUS ? " + " : e->op == NSR_T_MINUS ? " - "
                         : e->op == NSR_T_STAR ? " * " : e->op == NSR_T_SLASH ? " / " : "^";
        put(b, paren ? "(" : "");
        expr(b, e->a, depth + 1, 1);
        put(b, op);
        expr(b, e->b, depth + 1, 1);
        put(b, paren ? ")" : "");
        return;
    }
    case NSR_E_SUM:
    case NSR_E_SOFTMAX:
        put(b, e->kind == NSR_E_SUM ? "sum(" : "softmax(");
        put(b, e->name ? e->name : "?");
        put(b, " in ");
        if (e->nargs >= 2) {
            expr(b, e->args[0], depth + 1, 1);
            put(b, "..");
            expr(b, e->args[1], depth + 1, 1);
        }
        put(b, ": ");
        expr(b, e->a, depth + 1, 0);
        put(b, ")");
        return;
    default:
        put(b, "?");
        return;
    }
}

void nsr_expr_text(const nsr_expr *e, char *buf, size_t cap)
{
    sbuf b = {buf, cap, 0};
    if (cap)
        buf[0] = '\0';
    expr(&b, e, 0, 0);
}

/* ---- uses of the weights -------------------------------------------------------------------- */

void nsr_ir_uses_free(nsr_ir_uses *u, tpk_ctx *ctx)
{
    for (int s = 0; u->site != NULL && s < u->nsites; s++)
        tpk_free(ctx, u->site[s].members);
    tpk_free(ctx, u->site);
    tpk_free(ctx, u->nuses);
    memset(u, 0, sizeof *u);
}

/* The declared member the weight reference of n names at the bound symbols (−1: none; the
 * evaluation reports that, where it is evaluated). */
static int member_at(nsr_fam *F, const nsr_irn *n)
{
    int d = -1;
    if (nsr_fam_member(F, n->sym, n->e, &d)) {
        tpk_ctx_clear(F->ctx);
        F->unsup = 0;
        return -1;
    }
    return d;
}

/* The scope of node k: its statement's domain extended by the binders around it, outermost
 * first (the domain the back ends evaluate it on). */
static int scope_of(nsr_fam *F, const nsr_ir *ir, const int *parent, int k, nsr_fdom *X)
{
    const nsr_finstr *fi = &F->R->fi[ir->n[k].fi];
    nsr_trie tr;
    memset(&tr, 0, sizeof tr);
    memset(X, 0, sizeof *X);
    int st = nsr_instr_domain(F, fi, X, &tr);
    nsr_trie_free(&tr, F->ctx);
    int chain[NSR_MAXV], nc = 0;
    for (int a = parent[k]; a >= 0 && nc < NSR_MAXV; a = parent[a])
        if (ir->n[a].op == NSR_IR_SUM || ir->n[a].op == NSR_IR_SOFTMAX)
            chain[nc++] = a;
    for (int i = nc - 1; st == TPK_OK && i >= 0; i--) {
        nsr_fdom Y;
        long *par = NULL;
        if (X->m > NSR_IR_USES_MAX)
            break;
        st = nsr_extend(F, ir->n[chain[i]].e, X, &Y, &par);
        tpk_free(F->ctx, par);
        tpk_free(F->ctx, X->val);
        *X = Y;
    }
    return st;
}

static int site_members(nsr_fam *F, const nsr_ir *ir, const int *parent, int k, nsr_ir_site *s,
                        char *seen)
{
    const nsr_rolled *R = F->R;
    const nsr_irn *n = &ir->n[k];
    memcpy(F->num, R->fi[n->fi].num, ((size_t)R->C.nsym + 1) * sizeof *F->num);
    F->cur = n->fi;
    nsr_fdom X;
    if (scope_of(F, ir, parent, k, &X)) { /* the evaluation reports it */
        tpk_free(F->ctx, X.val);
        tpk_ctx_clear(F->ctx);
        F->unsup = 0;
        s->nmembers = -1;
        return TPK_OK;
    }
    s->varies = nsr_reads_syms(n->e, X.sym, X.nv, 0);
    if (X.m > NSR_IR_USES_MAX) {
        tpk_free(F->ctx, X.val);
        s->nmembers = s->varies ? -1 : 0;
        if (!s->varies)
            X.m = 0;
        else
            return TPK_OK;
    }
    long m = s->varies ? X.m : 1;
    memset(seen, 0, (size_t)R->ndm + 1);
    for (long p = 0; p < m; p++) {
        if (s->varies)
            nsr_bind_point(F, &X, p);
        int d = member_at(F, n);
        if (d >= 0)
            seen[d] = 1;
    }
    tpk_free(F->ctx, X.val);
    int c = 0;
    for (int d = 0; d < R->ndm; d++)
        c += seen[d];
    s->members = tpk_calloc(F->ctx, (size_t)c + 1, sizeof *s->members);
    if (s->members == NULL)
        return F->ctx->status;
    for (int d = 0; d < R->ndm; d++)
        if (seen[d])
            s->members[s->nmembers++] = d;
    return TPK_OK;
}

int nsr_ir_uses_of(const tpk_program *p, const nsr_ir *ir, nsr_ir_uses *u, tpk_ctx *ctx)
{
    memset(u, 0, sizeof *u);
    const nsr_rolled *R = p->rolled;
    nsr_fam F;
    if (nsr_fam_init(&F, p, ctx))
        return ctx->status;
    int *parent = tpk_calloc(ctx, (size_t)ir->nn + 1, sizeof *parent);
    char *seen = tpk_calloc(ctx, (size_t)R->ndm + 1, 1);
    u->site = tpk_calloc(ctx, (size_t)ir->nsites + 1, sizeof *u->site);
    u->nuses = tpk_calloc(ctx, (size_t)R->ndm + 1, sizeof *u->nuses);
    int st = parent && seen && u->site && u->nuses ? TPK_OK : ctx->status;
    for (int k = 0; st == TPK_OK && k < ir->nn; k++)
        parent[k] = -1;
    for (int k = 0; st == TPK_OK && k < ir->nn; k++) {
        const nsr_irn *n = &ir->n[k];
        int na = n->op == NSR_IR_LIN ? n->nterms : n->narg;
        for (int i = 0; i < na; i++)
            parent[n->op == NSR_IR_LIN ? n->terms[i] : n->arg[i]] = k;
    }
    for (int k = 0; st == TPK_OK && k < ir->nn; k++) {
        if (ir->n[k].op != NSR_IR_MATMUL)
            continue;
        nsr_ir_site *s = &u->site[u->nsites++];
        s->node = k;
        st = site_members(&F, ir, parent, k, s, seen);
        for (int i = 0; st == TPK_OK && i < s->nmembers; i++)
            if (++u->nuses[s->members[i]] == 2)
                u->ntied++;
    }
    tpk_free(ctx, parent);
    tpk_free(ctx, seen);
    nsr_fam_free(&F);
    if (st)
        nsr_ir_uses_free(u, ctx);
    return st;
}

/* ---- the printer ---------------------------------------------------------------------------- */

static void member_name(const nsr_rolled *R, int d, char *buf, size_t cap)
{
    const nsr_dmember *m = &R->dm[d];
    size_t k = (size_t)snprintf(buf, cap, "%s", R->C.sym[m->sym].name);
    for (int i = 0; i < m->nidx && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%d%s", i ? "," : "[", m->idx[i],
                              i == m->nidx - 1 ? "]" : "");
}

static void print_node(FILE *f, const tpk_program *p, const nsr_ir *ir, const nsr_ir_uses *u, int k)
{
    const nsr_rolled *R = p->rolled;
    const nsr_irn *n = &ir->n[k];
    char t[256], w[80];
    t[0] = '\0';
    fprintf(f, "  %%%-4d = %-7s ", k, nsr_ir_op_name(n->op));
    switch (n->op) {
    case NSR_IR_NUM: case NSR_IR_SQRTN: case NSR_IR_READ: case NSR_IR_INPUT: case NSR_IR_BN:
        nsr_expr_text(n->e, t, sizeof t);
        fprintf(f, "%s", t);
        break;
    case NSR_IR_MATMUL: {
        nsr_expr_text(n->e, t, sizeof t);
        /* the weight reference without its operand */
        char *paren = n->e->kind == NSR_E_CALL ? strchr(t, '(') : NULL;
        if (paren)
            *paren = '\0';
        fprintf(f, "%s %%%d   site %d", t, n->arg[0], n->site);
        const nsr_ir_site *s = u && n->site < u->nsites ? &u->site[n->site] : NULL;
        int tied = 0;
        for (int i = 0; s && i < s->nmembers; i++)
            tied |= u->nuses[s->members[i]] > 1;
        if (s && s->nmembers == 1) {
            member_name(R, s->members[0], w, sizeof w);
            fprintf(f, " (%s%s)", w, tied ? ", tied" : "");
        } else if (s && s->nmembers > 1) {
            member_name(R, s->members[0], w, sizeof w);
            fprintf(f, " (%d members from %s%s)", s->nmembers, w, tied ? ", tied" : "");
        } else if (s && s->nmembers < 0) {
            fprintf(f, " (a member per point; scope not enumerated)");
        }
        break;
    }
    case NSR_IR_MAP:
        fprintf(f, "%s", tpk_phi_name(n->phi));
        if (n->narg)
            fprintf(f, " %%%d", n->arg[0]);
        break;
    case NSR_IR_LIN:
        for (int i = 0; i < n->nterms; i++)
            fprintf(f, "%s%%%d", i == 0 ? (n->sign[i] < 0 ? "-" : "") : n->sign[i] < 0 ? " - " : " + ",
                    n->terms[i]);
        break;
    case NSR_IR_MUL: case NSR_IR_DIV:
        fprintf(f, "%%%d %s %%%d", n->arg[0], n->op == NSR_IR_MUL ? "*" : "/", n->arg[1]);
        break;
    case NSR_IR_POW:
        nsr_expr_text(n->e->b, t, sizeof t);
        fprintf(f, "%%%d ^ %s", n->arg[0], t);
        break;
    case NSR_IR_SUM: case NSR_IR_SOFTMAX: {
        char lo[80], hi[80];
        nsr_expr_text(n->e->args[0], lo, sizeof lo);
        nsr_expr_text(n->e->args[1], hi, sizeof hi);
        fprintf(f, "%s in %s..%s: %%%d", n->e->name, lo, hi, n->arg[0]);
        break;
    }
    case NSR_IR_MOMENT:
        fprintf(f, "%%%d", n->arg[0]);
        break;
    case NSR_IR_UNSUP:
        nsr_expr_text(n->e, t, sizeof t);
        fprintf(f, "%s: %s", n->why, t);
        break;
    case NSR_IR_DEF: case NSR_IR_OUTPUT: {
        size_t q = (size_t)snprintf(t, sizeof t, "%s", n->s->name);
        for (int i = 0; i < n->s->nidx && q < sizeof t; i++) {
            nsr_expr_text(n->s->idx[i], w, sizeof w);
            q += (size_t)snprintf(t + q, sizeof t - q, "%s%s%s", i ? ", " : "[", w,
                                  i == n->s->nidx - 1 ? "]" : "");
        }
        fprintf(f, "%s = ", t);
        if (n->op == NSR_IR_DEF)
            fprintf(f, "%%%d", n->arg[0]);
        else
            fprintf(f, "readout(%%%d, %%%d%s", n->arg[0], n->arg[1], n->narg > 2 ? ", " : ")");
        if (n->op == NSR_IR_OUTPUT && n->narg > 2)
            fprintf(f, "%%%d)", n->arg[2]);
        break;
    }
    default:
        break;
    }
    if (n->type != NSR_TY_NONE || n->gates || n->in_moment)
        fprintf(f, "   : %s%s%s", nsr_ir_type_name(n->type), n->gates ? ", gates" : "",
                n->in_moment ? ", in mean" : "");
    if (n->e)
        fprintf(f, "   @%d:%d", n->e->line, n->e->col);
    fputc('\n', f);
}

static void print_header(FILE *f, const nsr_rolled *R, int k)
{
    const nsr_finstr *fi = &R->fi[k];
    char lo[80], hi[80];
    fprintf(f, "fi %d  @%d:%d", k, fi->stmt->line, fi->stmt->col);
    int any = 0;
    for (int s = 0; s < R->C.nsym; s++) {
        if (R->C.sym[s].kind != NSR_SYM_LOOP || isnan(fi->num[s]))
            continue;
        int rolled = 0;
        for (int i = 0; i < fi->nloops; i++)
            rolled |= fi->loop[i]->fam == s;
        if (!rolled)
            fprintf(f, "%s%s = %g", any++ ? ", " : "  ", R->C.sym[s].name, fi->num[s]);
    }
    for (int i = 0; i < fi->nloops; i++) {
        nsr_expr_text(fi->loop[i]->lo, lo, sizeof lo);
        nsr_expr_text(fi->loop[i]->hi, hi, sizeof hi);
        fprintf(f, "%s%s in %s..%s", i ? ", " : "  domain ", fi->loop[i]->name, lo, hi);
    }
    fputc('\n', f);
}

int nsr_ir_print(const tpk_program *p, FILE *f, tpk_ctx *ctx)
{
    const nsr_rolled *R = p->rolled;
    const nsr_ir *ir = R ? R->ir : NULL;
    if (ir == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: the program has no rolled form, so no family IR",
                         p->path ? p->path : "program");
    nsr_ir_uses u;
    if (nsr_ir_uses_of(p, ir, &u, ctx))
        return ctx->status;
    fprintf(f, "# family IR of %s: %d family instructions, %d nodes, %d MatMul sites, %d tied "
               "weight%s\n", R->file, ir->nfi, ir->nn, ir->nsites, u.ntied, u.ntied == 1 ? "" : "s");
    for (int k = 0; k < ir->nfi; k++) {
        print_header(f, R, k);
        for (int j = ir->fi[k].first; j <= nsr_ir_root(ir, k); j++)
            print_node(f, p, ir, &u, j);
    }
    /* the weights: each declared A-var member and the sites that read it */
    char w[80];
    fprintf(f, "# weights\n");
    for (int d = 0; d < R->ndm; d++) {
        if (R->dm[d].kind != NSR_DM_AVAR)
            continue;
        member_name(R, d, w, sizeof w);
        fprintf(f, "#   %-12s ~ %-8g %d site%s", w, R->dm[d].var, u.nuses[d], u.nuses[d] == 1 ? "" : "s");
        for (int s = 0, c = 0; s < u.nsites; s++)
            for (int i = 0; i < u.site[s].nmembers; i++)
                if (u.site[s].members[i] == d)
                    fprintf(f, "%s%d", c++ ? ", " : ": ", s);
        fprintf(f, "%s\n", u.nuses[d] > 1 ? "   (tied)" : "");
    }
    for (int s = 0; s < u.nsites; s++)
        if (u.site[s].varies) {
            nsr_expr_text(ir->n[u.site[s].node].e, w, sizeof w);
            fprintf(f, "#   site %d multiplies %s: a member per point of its scope\n", s, w);
        }
    nsr_ir_uses_free(&u, ctx);
    return TPK_OK;
}

int tpk_program_dump_ir(const tpk_program *p, FILE *f, tpk_ctx *ctx)
{
    if (p == NULL || f == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_program_dump_ir: no program or no stream");
    return nsr_ir_print(p, f, ctx);
}
