/* The elaborated IR (tpk_program): its lifecycle, parameter lookup and text dump. */
#include <math.h>
#include "netsor-impl.h"
#include "tpk/alloc.h"

#include <stdlib.h>
#include <string.h>

void nsr_rpn_free(const tpk_allocator *al, tpk_rpn *r)
{
    tpk_mem_free(al, r->node);
    tpk_mem_free(al, r->args);
    r->node = NULL;
    r->args = NULL;
}

void tpk_program_free(tpk_program *p)
{
    if (p == NULL)
        return;
    const tpk_allocator al = p->alloc;
    tpk_mem_free(&al, p->path);
    for (int i = 0; i < p->nwidths; i++)
        tpk_mem_free(&al, p->width_name[i]);
    tpk_mem_free(&al, p->width_name);
    for (int i = 0; i < p->nvars; i++)
        tpk_mem_free(&al, p->var[i].name);
    tpk_mem_free(&al, p->var);
    for (int i = 0; i < p->navars; i++)
        tpk_mem_free(&al, p->avar[i].name);
    tpk_mem_free(&al, p->avar);
    for (int i = 0; i < p->nembeds; i++)
        tpk_mem_free(&al, p->embed[i].name);
    tpk_mem_free(&al, p->embed);
    for (int i = 0; i < p->ninstr; i++) {
        tpk_mem_free(&al, p->instr[i].term);
        tpk_mem_free(&al, p->instr[i].coef);
        nsr_rpn_free(&al, &p->instr[i].body);
    }
    tpk_mem_free(&al, p->instr);
    for (int i = 0; i < p->noutputs; i++) {
        tpk_mem_free(&al, p->output[i].name);
        tpk_mem_free(&al, p->output[i].part);
        tpk_mem_free(&al, p->output[i].readout);
    }
    tpk_mem_free(&al, p->output);
    for (int i = 0; i < p->nphis; i++)
        tpk_phi_free(p->phis[i]);
    tpk_mem_free(&al, p->phis);
    for (int i = 0; i < p->nparams; i++) {
        tpk_mem_free(&al, p->param_name[i]);
        tpk_mem_free(&al, p->param_value[i]);
    }
    tpk_mem_free(&al, p->param_name);
    tpk_mem_free(&al, p->param_value);
    tpk_mem_free(&al, p->param_integer);
    nsr_rolled_free(p->rolled);
    tpk_mem_free(&al, p);
}

int tpk_program_family_instructions(const tpk_program *p)
{
    return p != NULL && p->rolled != NULL ? p->rolled->nfi : 0;
}

int tpk_program_limit_rolled(const tpk_program *p)
{
    return p != NULL && p->rolled != NULL && !p->rolled->limit_unsup;
}

const char *nsr_op_name(int op)
{
    switch (op) {
    case TPK_OP_EMBED: return "EMBED";
    case TPK_OP_BIAS: return "BIAS";
    case TPK_OP_MATMUL: return "MATMUL";
    case TPK_OP_LINCOMB: return "LINCOMB";
    case TPK_OP_NONLIN: return "NONLIN";
    case TPK_OP_MOMENT: return "MOMENT";
    default: return "?";
    }
}

/* ---- Dump ----------------------------------------------------------------------------------- */

/* Print an RPN body in infix form (fully parenthesised below the top). */
static void print_rpn(const tpk_program *p, const tpk_rpn *r, FILE *f)
{
    enum { CAP = 4096 };
    char **st = tpk_mem_calloc(&p->alloc, (size_t)r->len + 1, sizeof *st, NULL);
    if (st == NULL) {
        fputs("<out of memory>", f);
        return;
    }
    int sp = 0;
    for (int i = 0; i < r->len; i++) {
        const tpk_rpn_node *x = &r->node[i];
        char *s = tpk_mem_malloc(&p->alloc, CAP, NULL);
        if (s == NULL)
            break;
        const char *a = sp >= 1 ? st[sp - 1] : "?", *b = sp >= 2 ? st[sp - 2] : "?";
        switch (x->op) {
        case TPK_RPN_CONST: snprintf(s, CAP, "%.10g", x->value); break;
        case TPK_RPN_GVAR:
        case TPK_RPN_SCALAR:
            snprintf(s, CAP, "%s", x->var >= 0 && x->var < p->nvars ? p->var[x->var].name : "?");
            break;
        case TPK_RPN_NEG: snprintf(s, CAP, "-(%s)", a); break;
        case TPK_RPN_POWI: snprintf(s, CAP, "(%s)^%d", a, (int)x->value); break;
        case TPK_RPN_CALL: snprintf(s, CAP, "%s(%s)", x->fn ? tpk_phi_name(x->fn) : "?", a); break;
        default: {
            const char *op = x->op == TPK_RPN_ADD ? " + " : x->op == TPK_RPN_SUB ? " - "
                             : x->op == TPK_RPN_MUL ? "*" : "/";
            snprintf(s, CAP, "(%s%s%s)", b, op, a);
        }
        }
        if (strlen(s) >= CAP - 1)
            snprintf(s, CAP, "...");
        int pops = x->op >= TPK_RPN_ADD && x->op <= TPK_RPN_DIV ? 2
                   : (x->op == TPK_RPN_NEG || x->op == TPK_RPN_POWI || x->op == TPK_RPN_CALL) ? 1 : 0;
        for (int k = 0; k < pops && sp > 0; k++)
            tpk_mem_free(&p->alloc, st[--sp]);
        st[sp++] = s;
    }
    fputs(sp == 1 ? st[0] : "<malformed body>", f);
    for (int k = 0; k < sp; k++)
        tpk_mem_free(&p->alloc, st[k]);
    tpk_mem_free(&p->alloc, st);
}

static const char *wname(const tpk_program *p, int w)
{
    return w >= 0 && w < p->nwidths ? p->width_name[w] : "?";
}

void tpk_program_dump(const tpk_program *p, FILE *f)
{
    if (p == NULL || f == NULL)
        return;
    fprintf(f, "# NETSOR program %s: %d instructions, %d vars, %d A-vars, %d embeddings, "
               "%d input slot%s, %d output%s%s%s%s\n",
            p->path ? p->path : "?", p->ninstr, p->nvars, p->navars, p->nembeds, p->nslots,
            p->nslots == 1 ? "" : "s", p->noutputs, p->noutputs == 1 ? "" : "s",
            p->features & TPK_FEAT_NETSOR_PLUS ? ", netsor+" : "",
            p->features & TPK_FEAT_SQRT_N_LOGITS ? ", sqrt-n-logits" : "",
            p->features & TPK_FEAT_BATCHNORM ? ", batchnorm" : "");
    fputs("widths:", f);
    for (int i = 0; i < p->nwidths; i++)
        fprintf(f, " %s", p->width_name[i]);
    fputc('\n', f);
    for (int i = 0; i < p->navars; i++)
        fprintf(f, "avar %d %s : A(%s, %s) ~ %.10g/fan_in\n", i, p->avar[i].name,
                wname(p, p->avar[i].rows), wname(p, p->avar[i].cols), p->avar[i].var);
    for (int i = 0; i < p->nembeds; i++)
        fprintf(f, "embed %d %s : (%s, d) ~ %.10g/d\n", i, p->embed[i].name, wname(p, p->embed[i].rows),
                p->embed[i].var);
    for (int i = 0; i < p->ninstr; i++) {
        const tpk_instr *in = &p->instr[i];
        const tpk_var *o = &p->var[in->out];
        const char *t = o->type == TPK_VAR_G ? "G" : o->type == TPK_VAR_H ? "H" : "scalar";
        fprintf(f, "%4d  %s %s", i, t, o->name);
        if (o->type != TPK_VAR_SCALAR)
            fprintf(f, " : %s", wname(p, o->width));
        fprintf(f, " = %s ", nsr_op_name(in->op));
        switch (in->op) {
        case TPK_OP_EMBED:
            fprintf(f, "%s x[slot %d]   # var %.10g/d", in->avar >= 0 && in->avar < p->nembeds
                    ? p->embed[in->avar].name : "?", in->src, in->var);
            break;
        case TPK_OP_BIAS:
            fprintf(f, "N(%.10g, %.10g)", in->mean, in->var);
            break;
        case TPK_OP_MATMUL:
            fprintf(f, "%s %s", in->avar >= 0 && in->avar < p->navars ? p->avar[in->avar].name : "?",
                    in->src >= 0 && in->src < p->nvars ? p->var[in->src].name : "?");
            break;
        case TPK_OP_LINCOMB:
            for (int k = 0; k < in->nterms; k++)
                fprintf(f, "%s%.10g*%s", k ? " + " : "", in->coef[k], p->var[in->term[k]].name);
            if (in->nterms == 0)
                fputs("0", f);
            break;
        default:
            if (in->op == TPK_OP_MOMENT)
                fputs(in->src == 1 ? "sqrt(n)*mean " : "mean ", f);
            if (in->bnorm) /* the body reads its G-var batchnorm'ed */
                fprintf(f, in->bn_eps > 0 ? "bn[batch %d, eps %g] " : "bn[batch %d] ", in->batch,
                        in->bn_eps);
            print_rpn(p, &in->body, f);
            fputs("   # args", f);
            for (int k = 0; k < in->body.nargs; k++)
                fprintf(f, " %s", p->var[in->body.args[k]].name);
        }
        fprintf(f, "   @%d:%d\n", in->line, in->col);
    }
    for (int i = 0; i < p->noutputs; i++) {
        const tpk_output *o = &p->output[i];
        fprintf(f, "output %s = readout%s%s%s(%s", o->name, o->readout ? "[" : "",
                o->readout ? o->readout : "", o->readout ? "]" : "", o->nparts > 1 ? "concat(" : "");
        for (int k = 0; k < nsr_out_nparts(o); k++) {
            int v = nsr_out_part(o, k);
            fprintf(f, "%s%s", k ? ", " : "", v >= 0 && v < p->nvars ? p->var[v].name : "?");
        }
        fprintf(f, "%s, %.10g, %.10g)\n", o->nparts > 1 ? ")" : "", o->var, o->bias_var);
    }
}

const char *tpk_program_param(const tpk_program *p, const char *name)
{
    for (int i = p->nparams - 1; i >= 0; i--)
        if (strcmp(p->param_name[i], name) == 0)
            return p->param_value[i];
    return NULL;
}

int tpk_program_param_number(const tpk_program *p, const char *name, double *v, tpk_ctx *ctx)
{
    const char *s = tpk_program_param(p, name);
    char *end;
    if (!s)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: the program has no parameter '%s'", p->path, name);
    *v = strtod(s, &end);
    if (end == s || *end != '\0' || !isfinite(*v))
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: parameter %s = %s is not a number", p->path, name, s);
    return TPK_OK;
}
