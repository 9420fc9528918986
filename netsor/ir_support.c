/* Which limit back end takes a program, read off its family IR (the one fallback decision).
 *
 * The rolled limit evaluator (netsor/flimit.c) is a "linear Gaussian plus φ-maps" engine:
 * values are linear combinations of covariance blocks, independence is structural, and every
 * MatMul site starts a fresh Gaussian root (theory §1.6). What it cannot represent is
 * structural, and the IR shows it before anything is evaluated:
 *   - a weight multiplied at more than one site (tied: a recurrence), whose sites are correlated
 *     through the weight — the member-level evaluator keeps (atom × input) blocks for that;
 *   - a weight that changes with the statement's own index outside a tap sum (untied members);
 *   - a product or quotient of vectors, or a power of one, outside mean() (GRU/LSTM gates): a
 *     Nonlin of several G-vars, whose expectation is not a φ-map of one block;
 *   - bn(...), batch-coupled (theory §2.5), and sqrt(n)-scaled logits (non-Gaussian, §5);
 *   - forms no rolled back end takes (UNSUP).
 * The first of these in evaluation order is the reason, with its position, which is what the
 * evaluator itself would have stopped at. Programs without one are planned by the rolled
 * evaluator, which may still refuse a form found only on evaluation (its message then says so). */
#include "ir-impl.h"
#include "tpk/alloc.h"

#include <string.h>

static int why_at(const nsr_rolled *R, const nsr_expr *e, char *why, size_t cap, const char *fmt,
                  const char *a)
{
    char msg[TPK_MSG_MAX];
    snprintf(msg, sizeof msg, fmt, a);
    snprintf(why, cap, "%s:%d:%d: %s", R->file, e ? e->line : 1, e ? e->col : 1, msg);
    return 1;
}

/* The sites that read member d, as "0 (@19:12), 2 (@19:12), …" for the message. */
static void site_list(const nsr_ir *ir, const nsr_ir_uses *u, int d, char *buf, size_t cap)
{
    size_t k = 0;
    buf[0] = '\0';
    for (int s = 0, c = 0; s < u->nsites && k < cap; s++)
        for (int i = 0; i < u->site[s].nmembers && k < cap; i++)
            if (u->site[s].members[i] == d) {
                const nsr_expr *e = ir->n[u->site[s].node].e;
                if (c++ == 6) {
                    k += (size_t)snprintf(buf + k, cap - k, ", …");
                    break;
                }
                k += (size_t)snprintf(buf + k, cap - k, "%s%d (@%d:%d)", c > 1 ? ", " : "", s,
                                      e->line, e->col);
            }
}

int nsr_ir_limit_refusal(const tpk_program *p, char *why, size_t cap, tpk_ctx *ctx)
{
    const nsr_rolled *R = p->rolled;
    const nsr_ir *ir = R->ir;
    nsr_ir_uses u;
    if (nsr_ir_uses_of(p, ir, &u, ctx))
        return -1;
    int *seen = tpk_calloc(ctx, (size_t)R->ndm + 1, sizeof *seen);
    if (seen == NULL) {
        nsr_ir_uses_free(&u, ctx);
        return -1;
    }
    int refused = 0;
    char sites[400];
    for (int k = 0; k < ir->nn && !refused; k++) {
        const nsr_irn *n = &ir->n[k];
        switch (n->op) {
        case NSR_IR_MATMUL: {
            const nsr_ir_site *s = &u.site[n->site];
            const nsr_finstr *fi = &R->fi[n->fi];
            int dom[NSR_MAX_INDICES];
            for (int i = 0; i < fi->nloops; i++)
                dom[i] = fi->loop[i]->fam;
            if (nsr_reads_syms(n->e, dom, fi->nloops, 0)) {
                refused = why_at(R, n->e, why, cap, "an A-var that changes with the family's "
                                 "index (%s): untied weights per member", n->e->name);
                break;
            }
            for (int i = 0; i < s->nmembers && !refused; i++)
                if (seen[s->members[i]]++ && !s->varies) {
                    site_list(ir, &u, s->members[i], sites, sizeof sites);
                    char msg[600];
                    snprintf(msg, sizeof msg, "%%s is multiplied in more than one place (weight "
                             "tying, e.g. a recurrence: sites %s); the rolled evaluator keeps "
                             "every MatMul's A-var its own", sites);
                    refused = why_at(R, n->e, why, cap, msg, n->e->name);
                }
            break;
        }
        case NSR_IR_MUL:
        case NSR_IR_DIV:
        case NSR_IR_POW:
            if (n->gates && !n->in_moment)
                refused = why_at(R, n->e, why, cap, "%s", n->op == NSR_IR_MUL
                                 ? "a product of two vectors outside mean() (a Nonlin of several "
                                   "G-vars)" : n->op == NSR_IR_DIV ? "division by a vector"
                                 : "a power of a vector outside mean(): write it as a function");
            break;
        case NSR_IR_BN:
        case NSR_IR_SQRTN:
        case NSR_IR_UNSUP: {
            char what[96];
            refused = why_at(R, n->e, why, cap, "%s is not taken by the rolled evaluator",
                             nsr_ir_unsup_text(n, what, sizeof what));
            break;
        }
        default:
            break;
        }
    }
    tpk_free(ctx, seen);
    nsr_ir_uses_free(&u, ctx);
    return refused;
}
