/* Shared by both NETSOR back ends: IR validation and block evaluation of RPN bodies. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend-impl.h"
#include "tpk/alloc.h"

int tpk_nsr_rpn_depth(const tpk_rpn_node *node, int len)
{
    int depth = 0, maxd = 0;
    if (len <= 0 || node == NULL)
        return -1;
    for (int i = 0; i < len; i++) {
        switch (node[i].op) {
        case TPK_RPN_CONST:
        case TPK_RPN_GVAR:
        case TPK_RPN_SCALAR:
            depth++;
            break;
        case TPK_RPN_ADD:
        case TPK_RPN_SUB:
        case TPK_RPN_MUL:
        case TPK_RPN_DIV:
            if (depth < 2)
                return -1;
            depth--;
            break;
        case TPK_RPN_NEG:
        case TPK_RPN_POWI:
            if (depth < 1)
                return -1;
            break;
        case TPK_RPN_CALL:
            if (depth < 1 || node[i].fn == NULL)
                return -1;
            break;
        default:
            return -1;
        }
        if (depth > maxd)
            maxd = depth;
    }
    return depth == 1 ? maxd : -1;
}

static void powi_block(double *a, size_t B, int e)
{
    unsigned m = e < 0 ? (unsigned)(-(long)e) : (unsigned)e;
    for (size_t j = 0; j < B; j++) {
        double base = a[j], r = 1.0;
        for (unsigned k = m; k; k >>= 1) {
            if (k & 1u)
                r *= base;
            base *= base;
        }
        a[j] = e < 0 ? 1.0 / r : r;
    }
}

void tpk_nsr_rpn_eval(const tpk_rpn_node *node, int len, const double *const *gv,
                      const double *sv, size_t B, double *stack, double *out)
{
    int sp = 0; /* number of entries on the stack */
    for (int i = 0; i < len; i++) {
        const tpk_rpn_node *nd = &node[i];
        double *top = stack + (size_t)sp * B;      /* next free slot */
        double *a = stack + (size_t)(sp - 2) * B;  /* binary: left operand */
        double *b = stack + (size_t)(sp - 1) * B;  /* binary: right; unary: operand */
        switch (nd->op) {
        case TPK_RPN_CONST:
            for (size_t j = 0; j < B; j++)
                top[j] = nd->value;
            sp++;
            break;
        case TPK_RPN_GVAR:
            memcpy(top, gv[i], B * sizeof *top);
            sp++;
            break;
        case TPK_RPN_SCALAR:
            for (size_t j = 0; j < B; j++)
                top[j] = sv[i];
            sp++;
            break;
        case TPK_RPN_ADD:
            for (size_t j = 0; j < B; j++)
                a[j] += b[j];
            sp--;
            break;
        case TPK_RPN_SUB:
            for (size_t j = 0; j < B; j++)
                a[j] -= b[j];
            sp--;
            break;
        case TPK_RPN_MUL:
            for (size_t j = 0; j < B; j++)
                a[j] *= b[j];
            sp--;
            break;
        case TPK_RPN_DIV:
            for (size_t j = 0; j < B; j++)
                a[j] /= b[j];
            sp--;
            break;
        case TPK_RPN_NEG:
            for (size_t j = 0; j < B; j++)
                b[j] = -b[j];
            break;
        case TPK_RPN_POWI:
            powi_block(b, B, (int)nd->value);
            break;
        case TPK_RPN_CALL:
            tpk_phi_eval_n(nd->fn, B, b, b);
            break;
        default:
            break; /* rejected by tpk_nsr_rpn_depth */
        }
    }
    memcpy(out, stack, B * sizeof *out);
}

/* ---- validation ---------------------------------------------------------------------------- */


static int check_body(const tpk_program *p, const tpk_instr *in, const char *defined,
                      tpk_nsr_shape *sh, tpk_ctx *ctx)
{
    const tpk_rpn *b = &in->body;
    int depth = tpk_nsr_rpn_depth(b->node, b->len);
    if (depth < 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "%d:%d: malformed expression body", in->line, in->col);
    for (int i = 0; i < b->len; i++) {
        const tpk_rpn_node *nd = &b->node[i];
        if (nd->op == TPK_RPN_GVAR || nd->op == TPK_RPN_SCALAR) {
            int want = nd->op == TPK_RPN_GVAR ? TPK_VAR_G : TPK_VAR_SCALAR;
            if (nd->var < 0 || nd->var >= p->nvars || !defined[nd->var] ||
                p->var[nd->var].type != want)
                return TPK_ERROR(ctx, TPK_EINVAL,
                                 "%d:%d: body reads variable %d that is not a defined %s",
                                 in->line, in->col, nd->var,
                                 want == TPK_VAR_G ? "G-var" : "scalar");
        }
        if (nd->op == TPK_RPN_POWI && (nd->value != floor(nd->value) || fabs(nd->value) > 64))
            return TPK_ERROR(ctx, TPK_EINVAL, "%d:%d: integer power %g out of range", in->line,
                             in->col, nd->value);
    }
    if (b->len > sh->maxlen)
        sh->maxlen = b->len;
    if (depth > sh->maxdepth)
        sh->maxdepth = depth;
    return TPK_OK;
}

int tpk_nsr_validate(const tpk_program *p, const tpk_array *x, int all_outputs,
                     tpk_nsr_shape *sh, tpk_ctx *ctx)
{
    (void)all_outputs;
    memset(sh, 0, sizeof *sh);
    sh->maxlen = 1;
    sh->maxdepth = 1;
    if (p == NULL || x == NULL || x->data == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "NULL program or input array");
    if (p->nslots < 1)
        return TPK_ERROR(ctx, TPK_EINVAL, "program has %d input slots", p->nslots);
    if (x->ndim == 2 && p->nslots == 1) {
        sh->T = 1;
        sh->d = x->dims[1];
    } else if (x->ndim == 3 && x->dims[1] == (size_t)p->nslots) {
        sh->T = x->dims[1];
        sh->d = x->dims[2];
    } else {
        return TPK_ERROR(ctx, TPK_EINVAL,
                         "input array has rank %d; the program needs N×d (1 slot) or N×%d×d",
                         x->ndim, p->nslots);
    }
    sh->N = x->dims[0];
    if (sh->N == 0 || sh->d == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "empty input array (N = %zu, d = %zu)", sh->N, sh->d);
    /* x·0 is NaN exactly when x is not finite: one vectorisable pass, then locate */
    size_t nx = tpk_array_size(x);
    double probe = 0.0;
    for (size_t i = 0; i < nx; i++)
        probe += x->data[i] * 0.0;
    if (probe != 0.0)
        for (size_t i = 0; i < nx; i++)
            if (!isfinite(x->data[i]))
                return TPK_ERROR(ctx, TPK_EDOM, "input array holds a non-finite value at %zu", i);
    if (p->noutputs < 1 || p->output == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "program has no outputs");
    if (p->nvars < 1 || p->var == NULL || p->ninstr < 0 || (p->ninstr > 0 && p->instr == NULL))
        return TPK_ERROR(ctx, TPK_EINVAL, "program has no variables");
    char *defined = tpk_calloc(ctx, (size_t)p->nvars, 1);
    if (defined == NULL)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory validating the program");
    int st = TPK_OK;
    for (int k = 0; k < p->ninstr && st == TPK_OK; k++) {
        const tpk_instr *in = &p->instr[k];
        int want = TPK_VAR_G;
        if (in->out < 0 || in->out >= p->nvars) {
            st = TPK_ERROR(ctx, TPK_EINVAL, "%d:%d: output variable %d out of range", in->line,
                           in->col, in->out);
            break;
        }
        if (defined[in->out]) {
            st = TPK_ERROR(ctx, TPK_EINVAL, "%d:%d: variable '%s' defined twice", in->line,
                           in->col, p->var[in->out].name ? p->var[in->out].name : "?");
            break;
        }
        switch (in->op) {
        case TPK_OP_EMBED:
            if (in->avar < 0 || in->avar >= p->nembeds)
                st = TPK_ERROR(ctx, TPK_EINVAL, "%d:%d: embedding id %d out of range", in->line,
                               in->col, in->avar);
            else if (in->src < 0 || in->src >= p->nslots)
                st = TPK_ERROR(ctx, TPK_EINVAL, "%d:%d: input slot %d outside 0..%d", in->line,
                               in->col, in->src, p->nslots - 1);
            else if (!(in->var >= 0) || !isfinite(in->var))
                st = TPK_ERROR(ctx, TPK_EINVAL, "%d:%d: embedding variance %g", in->line,
                               in->col, in->var);
            break;
        case TPK_OP_BIAS:
            if (!(in->var >= 0) || !isfinite(in->var) || !isfinite(in->mean))
                st = TPK_ERROR(ctx, TPK_EINVAL, "%d:%d: bias N(%g, %g) is not valid", in->line,
                               in->col, in->mean, in->var);
            break;
        case TPK_OP_MATMUL:
            if (in->avar < 0 || in->avar >= p->navars)
                st = TPK_ERROR(ctx, TPK_EINVAL, "%d:%d: A-var id %d out of range", in->line,
                               in->col, in->avar);
            else if (!(p->avar[in->avar].var >= 0) || !isfinite(p->avar[in->avar].var))
                st = TPK_ERROR(ctx, TPK_EINVAL, "%d:%d: A-var variance %g", in->line, in->col,
                               p->avar[in->avar].var);
            else if (in->src < 0 || in->src >= p->nvars || !defined[in->src] ||
                     p->var[in->src].type == TPK_VAR_SCALAR)
                st = TPK_ERROR(ctx, TPK_EINVAL, "%d:%d: MatMul source %d is not a defined G/H-var",
                               in->line, in->col, in->src);
            break;
        case TPK_OP_LINCOMB:
            if (in->nterms < 1 || in->term == NULL || in->coef == NULL) {
                st = TPK_ERROR(ctx, TPK_EINVAL, "%d:%d: empty LinComb", in->line, in->col);
                break;
            }
            for (int t = 0; t < in->nterms; t++)
                if (in->term[t] < 0 || in->term[t] >= p->nvars || !defined[in->term[t]] ||
                    p->var[in->term[t]].type != TPK_VAR_G || !isfinite(in->coef[t])) {
                    st = TPK_ERROR(ctx, TPK_EINVAL,
                                   "%d:%d: LinComb term %d is not a defined G-var with a finite "
                                   "coefficient", in->line, in->col, t);
                    break;
                }
            break;
        case TPK_OP_NONLIN:
            want = TPK_VAR_H;
            st = check_body(p, in, defined, sh, ctx);
            if (st == TPK_OK && in->bnorm && /* φ(bn(g)): GVAR g [CALL φ]; whole batches */
                (!(in->body.len == 1 || (in->body.len == 2 && in->body.node[1].op == TPK_RPN_CALL)) ||
                 in->body.node[0].op != TPK_RPN_GVAR || in->batch < 0 ||
                 (in->batch > 0 && sh->N % (size_t)in->batch != 0)))
                st = TPK_ERROR(ctx, TPK_EINVAL,
                               "%d:%d: batchnorm Nonlin must be phi(bn(g)) over whole batches "
                               "(batch %d, %zu inputs)", in->line, in->col, in->batch, sh->N);
            break;
        case TPK_OP_MOMENT:
            want = TPK_VAR_SCALAR;
            st = check_body(p, in, defined, sh, ctx);
            break;
        default:
            st = TPK_ERROR(ctx, TPK_EINVAL, "%d:%d: unknown instruction %d", in->line, in->col,
                           in->op);
        }
        if (st == TPK_OK && p->var[in->out].type != want)
            st = TPK_ERROR(ctx, TPK_EINVAL, "%d:%d: instruction writes variable '%s' of the wrong type",
                           in->line, in->col, p->var[in->out].name ? p->var[in->out].name : "?");
        defined[in->out] = 1;
    }
    for (int o = 0; o < p->noutputs && st == TPK_OK; o++) {
        const tpk_output *po = &p->output[o];
        if (po->nparts > 1 && (po->part == NULL || po->part[0] != po->src))
            st = TPK_ERROR(ctx, TPK_EINVAL, "output %d has %d parts but no part list starting "
                           "with its src", o, po->nparts);
        for (int k = 0; k < nsr_out_nparts(po) && st == TPK_OK; k++) {
            int s = nsr_out_part(po, k);
            if (s < 0 || s >= p->nvars || !defined[s] || p->var[s].type == TPK_VAR_SCALAR)
                st = TPK_ERROR(ctx, TPK_EINVAL, "output %d reads %d, not a defined G/H-var", o, s);
        }
        if (st)
            break;
        if (!(p->output[o].var >= 0) || !isfinite(p->output[o].var) ||
                 !(p->output[o].bias_var >= 0) || !isfinite(p->output[o].bias_var))
            st = TPK_ERROR(ctx, TPK_EINVAL, "output %d has readout variance %g, bias variance %g",
                           o, p->output[o].var, p->output[o].bias_var);
    }
    tpk_free(ctx, defined);
    return st;
}
