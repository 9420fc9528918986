/* Assemble elaborated NETSOR IR by hand (netsor/backend-impl.h): used by the back-end tests and
 * by code that builds architectures programmatically rather than from the DSL. */
#include <stdlib.h>
#include <string.h>

#include "backend-impl.h"
#include "tpk/alloc.h"

tpk_program *tpk_nsr_prog_new(int nslots)
{
    if (nslots < 1)
        return NULL;
    tpk_program *p = tpk_calloc(NULL, 1, sizeof *p);
    if (p == NULL)
        return NULL;
    p->nslots = nslots;
    p->nwidths = 1;
    p->width_name = tpk_calloc(NULL, 1, sizeof *p->width_name);
    if (p->width_name == NULL || (p->width_name[0] = tpk_strdup(NULL, "n")) == NULL) {
        tpk_free(NULL, p->width_name);
        tpk_free(NULL, p);
        return NULL;
    }
    return p;
}

void tpk_nsr_prog_free(tpk_program *p)
{
    if (p == NULL)
        return;
    for (int i = 0; i < p->nwidths; i++)
        tpk_free(NULL, p->width_name[i]);
    tpk_free(NULL, p->width_name);
    for (int i = 0; i < p->nvars; i++)
        tpk_free(NULL, p->var[i].name);
    tpk_free(NULL, p->var);
    for (int i = 0; i < p->navars; i++)
        tpk_free(NULL, p->avar[i].name);
    tpk_free(NULL, p->avar);
    for (int i = 0; i < p->nembeds; i++)
        tpk_free(NULL, p->embed[i].name);
    tpk_free(NULL, p->embed);
    for (int i = 0; i < p->ninstr; i++) {
        tpk_free(NULL, p->instr[i].term);
        tpk_free(NULL, p->instr[i].coef);
        tpk_free(NULL, p->instr[i].body.node);
        tpk_free(NULL, p->instr[i].body.args);
    }
    tpk_free(NULL, p->instr);
    for (int i = 0; i < p->noutputs; i++) {
        tpk_free(NULL, p->output[i].name);
        tpk_free(NULL, p->output[i].part);
        tpk_free(NULL, p->output[i].readout);
    }
    tpk_free(NULL, p->output);
    tpk_free(NULL, p->path);
    tpk_free(NULL, p);
}

static int grow(void **arr, int n, size_t size)
{
    void *q = tpk_realloc(NULL, *arr, (size_t)(n + 1) * size);
    if (q == NULL)
        return -1;
    *arr = q;
    memset((char *)q + (size_t)n * size, 0, size);
    return 0;
}

static int add_var(tpk_program *p, const char *name, int type)
{
    if (grow((void **)&p->var, p->nvars, sizeof *p->var))
        return -1;
    tpk_var *v = &p->var[p->nvars];
    if ((v->name = tpk_strdup(NULL, name ? name : "_")) == NULL)
        return -1;
    v->type = type;
    v->width = 0;
    v->def = p->ninstr;
    return p->nvars++;
}

static tpk_instr *add_instr(tpk_program *p, int op, const char *out, int type)
{
    if (grow((void **)&p->instr, p->ninstr, sizeof *p->instr))
        return NULL;
    int v = add_var(p, out, type);
    if (v < 0)
        return NULL;
    tpk_instr *in = &p->instr[p->ninstr++];
    in->op = op;
    in->out = v;
    in->line = p->ninstr;
    in->col = 1;
    return in;
}

int tpk_nsr_add_avar(tpk_program *p, const char *name, double var)
{
    if (grow((void **)&p->avar, p->navars, sizeof *p->avar))
        return -1;
    tpk_avar *a = &p->avar[p->navars];
    if ((a->name = tpk_strdup(NULL, name ? name : "W")) == NULL)
        return -1;
    a->var = var;
    return p->navars++;
}

int tpk_nsr_add_embed(tpk_program *p, const char *name, double var)
{
    if (grow((void **)&p->embed, p->nembeds, sizeof *p->embed))
        return -1;
    tpk_embed *e = &p->embed[p->nembeds];
    if ((e->name = tpk_strdup(NULL, name ? name : "U")) == NULL)
        return -1;
    e->var = var;
    return p->nembeds++;
}

int tpk_nsr_embed(tpk_program *p, const char *out, int embed, int slot)
{
    if (embed < 0 || embed >= p->nembeds)
        return -1;
    tpk_instr *in = add_instr(p, TPK_OP_EMBED, out, TPK_VAR_G);
    if (in == NULL)
        return -1;
    in->avar = embed;
    in->src = slot;
    in->var = p->embed[embed].var;
    return in->out;
}

int tpk_nsr_bias(tpk_program *p, const char *out, double mean, double var)
{
    tpk_instr *in = add_instr(p, TPK_OP_BIAS, out, TPK_VAR_G);
    if (in == NULL)
        return -1;
    in->mean = mean;
    in->var = var;
    return in->out;
}

int tpk_nsr_matmul(tpk_program *p, const char *out, int avar, int src)
{
    tpk_instr *in = add_instr(p, TPK_OP_MATMUL, out, TPK_VAR_G);
    if (in == NULL)
        return -1;
    in->avar = avar;
    in->src = src;
    if (avar >= 0 && avar < p->navars)
        in->var = p->avar[avar].var;
    return in->out;
}

int tpk_nsr_lincomb(tpk_program *p, const char *out, int nterms, const int *term,
                    const double *coef)
{
    if (nterms < 1)
        return -1;
    int *t = tpk_malloc(NULL, (size_t)nterms * sizeof *t);
    double *c = tpk_malloc(NULL, (size_t)nterms * sizeof *c);
    tpk_instr *in = t && c ? add_instr(p, TPK_OP_LINCOMB, out, TPK_VAR_G) : NULL;
    if (in == NULL) {
        tpk_free(NULL, t);
        tpk_free(NULL, c);
        return -1;
    }
    memcpy(t, term, (size_t)nterms * sizeof *t);
    memcpy(c, coef, (size_t)nterms * sizeof *c);
    in->nterms = nterms;
    in->term = t;
    in->coef = c;
    return in->out;
}

static int body(tpk_program *p, int op, const char *out, const tpk_rpn_node *node, int len)
{
    if (len < 1)
        return -1;
    tpk_rpn_node *nd = tpk_malloc(NULL, (size_t)len * sizeof *nd);
    int *args = tpk_malloc(NULL, (size_t)len * sizeof *args);
    tpk_instr *in = nd && args ? add_instr(p, op, out, op == TPK_OP_NONLIN ? TPK_VAR_H : TPK_VAR_SCALAR) : NULL;
    if (in == NULL) {
        tpk_free(NULL, nd);
        tpk_free(NULL, args);
        return -1;
    }
    memcpy(nd, node, (size_t)len * sizeof *nd);
    int na = 0;
    for (int i = 0; i < len; i++) /* distinct G-var leaves, ascending */
        if (nd[i].op == TPK_RPN_GVAR) {
            int j = 0;
            while (j < na && args[j] < nd[i].var)
                j++;
            if (j < na && args[j] == nd[i].var)
                continue;
            memmove(args + j + 1, args + j, (size_t)(na - j) * sizeof *args);
            args[j] = nd[i].var;
            na++;
        }
    in->body.len = len;
    in->body.node = nd;
    in->body.nargs = na;
    in->body.args = args;
    return in->out;
}

int tpk_nsr_nonlin(tpk_program *p, const char *out, const tpk_rpn_node *node, int len)
{
    return body(p, TPK_OP_NONLIN, out, node, len);
}

int tpk_nsr_moment(tpk_program *p, const char *out, const tpk_rpn_node *node, int len)
{
    p->features |= TPK_FEAT_NETSOR_PLUS;
    return body(p, TPK_OP_MOMENT, out, node, len);
}

int tpk_nsr_output(tpk_program *p, const char *name, int src, double var)
{
    if (grow((void **)&p->output, p->noutputs, sizeof *p->output))
        return -1;
    tpk_output *o = &p->output[p->noutputs];
    if ((o->name = tpk_strdup(NULL, name ? name : "y")) == NULL)
        return -1;
    o->src = src;
    o->var = var;
    return p->noutputs++;
}
