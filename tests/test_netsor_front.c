/* Tests of the NETSOR front end (lex → parse → check → elaborate): a table of malformed programs,
 * each with its status, position and message; the shipped programs' elaborated IR; H-var
 * inlining; --set overrides; shape holes. Every error path must return cleanly (run under ASan). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tpk/tpk.h"

static tpk_phi_registry *g_reg;

static double f_sqrt(double x, const double *params)
{
    (void)params;
    return sqrt(x);
}

static int setup(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    g_reg = tpk_phi_registry_alloc(&ctx);
    if (g_reg == NULL)
        return -1;
    tpk_phi *s = tpk_phi_alloc(g_reg, "sqrt", &ctx);
    if (s != NULL) {
        tpk_phi_free(s);
        return 0;
    }
    tpk_ctx_clear(&ctx);
    return tpk_phi_register(g_reg, "sqrt", f_sqrt, 0, NULL, TPK_PHI_CONTROLLED, &ctx) ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    tpk_phi_registry_free(g_reg);
    return 0;
}

/* ---- Malformed programs ------------------------------------------------------------------------ */
#define HDR "width n\ninput x : d\nA U : (n, d) ~ 1.5\n" /* three lines */

typedef struct bad_case {
    const char *src;
    int plus;            /* --netsor-plus */
    const char *set;     /* "name=value" or NULL */
    int status;
    const char *where;   /* "line:col" after "t.nsr:", or NULL for messages without a position */
    const char *msg;     /* substring */
} bad_case;

static const bad_case bad[] = {
    /* 0 lexer */
    {HDR "g = U x @ 2\n", 0, NULL, TPK_ESYNTAX, "4:9", "unexpected character '@'"},
    {HDR "g = U x\x01\n", 0, NULL, TPK_ESYNTAX, "4:8", "unexpected byte 0x01"},
    {HDR "g = 1.5e3x\n", 0, NULL, TPK_ESYNTAX, "4:5", "malformed number"},
    /* parser */
    {HDR "g = U x +\n", 0, NULL, TPK_ESYNTAX, "5:1", "expected an expression"},
    {HDR "g = (U x\n", 0, NULL, TPK_ESYNTAX, NULL, "expected ')'"},
    {HDR "for t in 1..3 {\n g[t] = U x\n", 0, NULL, TPK_ESYNTAX, NULL, "expected '}'"},
    {HDR "for t in 1 3 { }\n", 0, NULL, TPK_ESYNTAX, "4:12", "'..'"},
    {HDR "A W : n, n ~ 1\n", 0, NULL, TPK_ESYNTAX, "4:7", "expected '('"},
    {HDR "frobnicate x\n", 0, NULL, TPK_ESYNTAX, "4:1", "unknown statement 'frobnicate'"},
    {HDR "use netsor\n", 0, NULL, TPK_ESYNTAX, "4:5", "unknown feature"},
    {HDR "g = U x\ng = _\n", 0, NULL, TPK_ESYNTAX, "5:5", "hole '_' may only stand for a dimension"},
    {HDR "g = U x h\n", 0, NULL, TPK_ETYPE, "4:7", "MatMul needs an A-var on the left, but 'x' is an input"},
    /* names */
    {HDR "g = V x\n", 0, NULL, TPK_ETYPE, "4:5", "undefined name 'V'"},
    {HDR "g = U x\nh = relux(g)\n", 0, NULL, TPK_ETYPE, "5:5", "unknown function 'relux'"},
    {HDR "A U : (n, d) ~ 1\n", 0, NULL, TPK_ETYPE, "4:3", "redeclaration of U (first declared at line 3)"},
    {HDR "param U = 2\n", 0, NULL, TPK_ETYPE, "4:7", "redefinition of 'U' (already an A-var, line 3)"},
    {HDR "g = U x\nh[t in 1..2] = relu(g)\noutput y = readout(h, 1)\n", 0, NULL, TPK_ETYPE, "6:20",
     "'h' needs 1 index"},
    {HDR "g = U x\noutput y = readout(g[1], 1)\n", 0, NULL, TPK_ETYPE, "5:20", "'g' is not indexed"},
    {HDR "width m\nA W : (m, k) ~ 1\n", 0, NULL, TPK_ETYPE, "5:11", "undefined width 'k'"},
    {HDR "g = U x\nh = g(g)\n", 0, NULL, TPK_ETYPE, "5:5", "not a function"},
    {HDR "g = U x\nfor g in 1..2 { }\n", 0, NULL, TPK_ETYPE, "5:5", "loop variable 'g' shadows"},
    {HDR "g = U x\nh = relu(g, g)\n", 0, NULL, TPK_ETYPE, "5:5", "takes one argument"},
    {HDR "input z : e\n", 0, NULL, TPK_ETYPE, "4:1", "second input 'z'"},
    {"width n\nA W : (n, n) ~ 1\n", 0, NULL, TPK_ETYPE, "1:1", "declares no input"},
    /* types */
    {HDR "g = U x\nh = relu(g)\nk = g + h\noutput y = readout(k, 1)\n", 0, NULL, TPK_ETYPE, "6:5",
     "LinComb argument 'h' is an H-var (line 5); LinComb accepts G-vars only. Hint: write a Nonlin"},
    {HDR "A W : (n, n) ~ 1\ng = U x\nk = W^T g\n", 0, NULL, TPK_ETYPE, "6:5",
     "NETSOR\xe2\x8a\xa4 transposes are not supported in NNGP mode"},
    {HDR "A W : (n, n) ~ 1\ng = U x\nk = W' g\n", 0, NULL, TPK_ETYPE, "6:5", "transposes are not supported"},
    {HDR "g = U x\nk = g h\n", 0, NULL, TPK_ETYPE, "5:5", "MatMul needs an A-var on the left"},
    {HDR "g = U x\nk = U + g\n", 0, NULL, TPK_ETYPE, "5:5", "A-var 'U' can only multiply a vector"},
    {HDR "g = U x\nk = U g\n", 0, NULL, TPK_ETYPE, "5:5",
     "MatMul U\xc2\xb7g: U is A(n, d) (declared at line 3) but g has width n (from line 4); cannot unify d with n"},
    {HDR "k = U (2 + 1)\n", 0, NULL, TPK_ETYPE, "4:5", "it can only multiply the input"},
    {HDR "A W : (n, n) ~ 1\nk = W x\n", 0, NULL, TPK_ETYPE, "5:5", "cannot unify n with d"},
    {HDR "g = U x\nG k = relu(g)\n", 0, NULL, TPK_ETYPE, "5:7", "declared G but"},
    {HDR "g = U x\nscalar s = g + 1\n", 1, NULL, TPK_ETYPE, "5:12", "reads vectors outside mean"},
    {HDR "g = U x\nscalar m = mean(g)\n", 0, NULL, TPK_ETYPE, "5:12", "pass --netsor-plus"},
    {HDR "g = U x\nh = relu(g)\noutput y = readout(sqrt(n), 1)\n", 1, NULL, TPK_ETYPE, "6:20",
     "may only scale a mean"},
    {HDR "g = U x\nh = relu(g)\nk = h + n\n", 0, NULL, TPK_ETYPE, "6:9", "width symbol 'n' used as a value"},
    {HDR "g = U x\nh = relu(g)\noutput y = relu(h)\n", 0, NULL, TPK_ETYPE, "6:12", "readout(var, sigma_v2[, sigma_ob2])"},
    {HDR "g = U x\nh = relu(readout(g, 1))\n", 0, NULL, TPK_ETYPE, "5:10", "readout(...) may only appear"},
    {HDR "g = U x\nh = relu(g)\noutput y = readout(0, 1)\n", 0, NULL, TPK_ETYPE, "6:20",
     "readout of a constant vector"},
    {HDR "g = U x\nscalar m = mean(g)\noutput y = readout(m, 1)\n", 1, NULL, TPK_ETYPE, "6:20",
     "not the scalar 'm'"},
    {HDR "g = U x\nh = relu(g)\noutput y = readout(h, -1)\n", 0, NULL, TPK_ETYPE, "6:23", "readout variance is negative"},
    {HDR "g = U x\nh = relu(g)\n", 0, NULL, TPK_ETYPE, "1:1", "no output"},
    {HDR "G b : n ~ N(0, -0.5)\n", 0, NULL, TPK_ETYPE, "4:16", "variance of b is negative"},
    /* widths with provenance */
    {"width n, n1, n2\ninput x : d\nA W2 : (n2, n1) ~ 1\nA U : (n, d) ~ 1\n\n\ng1 = U x\n\n"
     "h1 = relu(g1)\n\n\ng2 = W2 h1\noutput y = readout(g2, 1)\n",
     0, NULL, TPK_ETYPE, "12:6",
     "MatMul W2\xc2\xb7h1: W2 is A(n2, n1) (declared at line 3) but h1 has width n (from line 9); "
     "cannot unify n1 with n"},
    {"width n, m\ninput x : d\nA U : (n, d) ~ 1\nA V : (m, d) ~ 1\ng = U x\nk = V x\n"
     "h = relu(g) * relu(k)\n", 0, NULL, TPK_ETYPE, "7:5", "g has width n (from line 5) but k has width m"},
    {"width n, m\ninput x : d\nA U : (n, d) ~ 1\nA U : (m, d) ~ 1\n", 0, NULL, TPK_ETYPE, "4:1",
     "cannot unify n with m"},
    {"width n, m\ninput x : d\nA U : (_, d) ~ 1\nA W : (m, _) ~ 1\ng = U x\nh = relu(g)\n"
     "k = W h\noutput y = readout(k, 1)\n", 0, NULL, TPK_ETYPE, "3:8", "hole '_' is unconstrained"},
    /* ranges */
    {"param T = 3\nwidth n\ninput x[t in 1..T] : d\nA W : (n, n) ~ 1\nA U : (n, d) ~ 1\n"
     "for t in 1..T {\n  g[t] = U x[t]\n  h[t] = W h[t-1] + g[t]\n}\noutput y = readout(h[T], 1)\n",
     0, NULL, TPK_ETYPE, "8:12",
     "h[t-1] with t = 1 is out of range: h is defined for 1..T (declare h[0] or start at t = 2)"},
    {"param T = 3\nwidth n\ninput x[t in 1..T] : d\nA U : (n, d) ~ 1\n"
     "g[t in 1..T] = U x[t + 1]\n", 0, NULL, TPK_ETYPE, "5:18", "x[t + 1] with t = 3 is out of range: x is defined for 1..T"},
    {HDR "A W[l in 2..3] : (n, n) ~ 1\ng = U x\nk = W[1] g\n", 0, NULL, TPK_ETYPE, "6:5",
     "W[1] is not declared: W is declared for 2..3"},
    {HDR "g = U x\nh[i in 1..2] = relu(g)\nk = h[i]\n", 0, NULL, TPK_ETYPE, "6:7", "undefined name 'i'"},
    {HDR "g = U x\nh[i in 1..2] = relu(g) + h[i + 1]\n", 0, NULL, TPK_ETYPE, "5:26",
     "h[i + 1] with i = 1 refers to h[2], which is not defined yet"},
    {HDR "g = U x\nh[i in 1..2] = relu(g)\nh[2] = relu(g)\n", 0, NULL, TPK_ETYPE, "6:1",
     "redefinition of h[2] (first defined at line 5)"},
    {HDR "g = U x\nh[i in 1..2.5] = relu(g)\n", 0, NULL, TPK_ETYPE, "5:11", "a range bound must be an integer (got 2.5)"},
    {HDR "g = U x\nh = g^1.5\n", 0, NULL, TPK_ETYPE, "5:7", "exponent must be an integer"},
    /* parameters */
    {HDR "param L = 2\ng = U x\n", 0, "M=3", TPK_EINVAL, NULL, "--set M: unknown parameter 'M'"},
    {HDR "param L = 2\ng = U x\n", 0, "L=3 3", TPK_ESYNTAX, NULL, "--set L=3 3 (column 3)"},
    {HDR "param L = 2\ng = U x\n", 0, "L=foo", TPK_ETYPE, NULL, "undefined name 'foo'"},
    {HDR "param phi = relu\ng = U x\nh = phi(g)\noutput y = readout(h, 1)\n", 0, "phi=2", TPK_ETYPE,
     "6:5", "'phi' is a number parameter"},
    {HDR "param phi = relu\ng = U x\nh = phi + g\n", 0, NULL, TPK_ETYPE, "6:5", "function parameter"},
    {HDR "param f = leaky_relu(1, 2, 3, 4, 5, 6)\n", 0, NULL, TPK_ETYPE, "4:11", "cannot instantiate"},
    {HDR "param a = b\n", 0, NULL, TPK_ETYPE, "4:11", "undefined name 'b'"},
    {HDR "for t in 1..2 {\n param a = 1\n}\n", 0, NULL, TPK_ESYNTAX, "5:2", "only allowed at top level"},
    {HDR "param for = 1\n", 0, NULL, TPK_ESYNTAX, "4:7", "reserved word"},
    /* size limits */
    {HDR "param T = 100000000\nfor t in 1..T { }\n", 0, NULL, TPK_EINVAL, "5:1", "too large"},
    {HDR "use netsor+\ng = U x\nh[0] = relu(g)\nfor t in 1..40 {\n h[t] = h[t-1] * h[t-1] + relu(g)\n}\n",
     0, NULL, TPK_EINVAL, "8:9", "exceeds"},
};

static void test_malformed(void **state)
{
    (void)state;
    int failures = 0;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const bad_case *c = &bad[i];
        tpk_param_set set = {0};
        char buf[64];
        tpk_netsor_opts opts = {.netsor_plus = c->plus};
        if (c->set != NULL) {
            snprintf(buf, sizeof buf, "%s", c->set);
            char *eq = strchr(buf, '=');
            *eq = '\0';
            set.name = buf;
            set.value = eq + 1;
            opts.sets = &set;
            opts.nsets = 1;
        }
        tpk_ctx ctx;
        tpk_ctx_init(&ctx);
        tpk_program *p = tpk_netsor_load_string("t.nsr", c->src, &opts, g_reg, &ctx);
        char where[64] = "";
        if (c->where != NULL)
            snprintf(where, sizeof where, "t.nsr:%s: ", c->where);
        int ok = p == NULL && ctx.status == c->status && strstr(ctx.msg, c->msg) != NULL &&
                 (c->where == NULL || strncmp(ctx.msg, where, strlen(where)) == 0);
        if (!ok)
            print_error("case %zu: expected status %d at '%s' with '%s'; got status %d: %s\n", i,
                        c->status, where, c->msg, ctx.status, ctx.msg);
        tpk_program_free(p);
        failures += !ok;
    }
    assert_int_equal(failures, 0);
    assert_true(sizeof bad / sizeof bad[0] >= 35);
}

/* Every malformed file under tests/malformed/ fails cleanly with a positioned message. */
static void test_malformed_files(void **state)
{
    (void)state;
    static const struct {
        const char *file;
        int status;
        const char *msg;
    } files[] = {
        {"width_clash.nsr", TPK_ETYPE, ":7:5: MatMul W\xc2\xb7h: W is A(m, m) (declared at line 5) but h has width n (from line 6)"},
        {"rnn_no_s0.nsr", TPK_ETYPE, ":11:14: s[t - 1] with t = 1 is out of range: s is defined for 1..T "
                                     "(declare s[0] or start at t = 2)"},
        {"gru_lincomb_h.nsr", TPK_ETYPE, "LinComb argument 'z[1]' is an H-var"},
        {"transpose.nsr", TPK_ETYPE, ":7:6: transpose of 'W'"},
        {"moment_no_plus.nsr", TPK_ETYPE, ":7:12: mean(...) is a NETSOR+ Moment"},
    };
    const char *root = getenv("TPK_ROOT");
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/tests/malformed/%s", root ? root : ".", files[i].file);
        tpk_ctx ctx;
        tpk_ctx_init(&ctx);
        tpk_program *p = tpk_netsor_load_file(path, NULL, g_reg, &ctx);
        int ok = p == NULL && ctx.status == files[i].status && strstr(ctx.msg, files[i].msg) != NULL &&
                 strncmp(ctx.msg, path, strlen(path)) == 0;
        if (!ok)
            print_error("%s: got status %d: %s\n", files[i].file, ctx.status, ctx.msg);
        tpk_program_free(p);
        assert_true(ok);
    }
}

static void test_io_errors(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_null(tpk_netsor_load_file("/nonexistent/prog.nsr", NULL, g_reg, &ctx));
    assert_int_equal(ctx.status, TPK_EIO);
    tpk_ctx_init(&ctx);
    assert_null(tpk_netsor_load_string("t.nsr", NULL, NULL, g_reg, &ctx));
    assert_int_equal(ctx.status, TPK_EINVAL);
    /* no registry: functions are unknown, reported at the call */
    tpk_ctx_init(&ctx);
    assert_null(tpk_netsor_load_string("t.nsr", HDR "g = U x\nh = relu(g)\n", NULL, NULL, &ctx));
    assert_int_equal(ctx.status, TPK_ETYPE);
    assert_non_null(strstr(ctx.msg, "t.nsr:5:5: unknown function 'relu'"));
    tpk_program_free(NULL);
    tpk_program_dump(NULL, stdout);
}

/* ---- Shipped programs --------------------------------------------------------------------------- */
static tpk_program *load_prog(const char *name, const tpk_param_set *sets, int nsets)
{
    char path[1024];
    const char *root = getenv("TPK_ROOT");
    snprintf(path, sizeof path, "%s/programs/%s", root ? root : ".", name);
    tpk_netsor_opts opts = {.sets = sets, .nsets = nsets};
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_program *p = tpk_netsor_load_file(path, &opts, g_reg, &ctx);
    if (p == NULL)
        print_error("%s: %s\n", name, ctx.msg);
    return p;
}

static int count_op(const tpk_program *p, int op)
{
    int k = 0;
    for (int i = 0; i < p->ninstr; i++)
        k += p->instr[i].op == op;
    return k;
}

static int var_named(const tpk_program *p, const char *name)
{
    for (int i = 0; i < p->nvars; i++)
        if (strcmp(p->var[i].name, name) == 0)
            return i;
    return -1;
}

/* Structural invariants every elaborated program satisfies. */
static void check_invariants(const tpk_program *p)
{
    for (int i = 0; i < p->ninstr; i++) {
        const tpk_instr *in = &p->instr[i];
        assert_true(in->out >= 0 && in->out < p->nvars);
        assert_int_equal(p->var[in->out].def, i);
        switch (in->op) {
        case TPK_OP_MATMUL:
            assert_true(in->avar >= 0 && in->avar < p->navars);
            assert_true(p->var[in->src].def < i && p->var[in->src].type != TPK_VAR_SCALAR);
            assert_int_equal(p->avar[in->avar].cols, p->var[in->src].width);
            assert_int_equal(p->avar[in->avar].rows, p->var[in->out].width);
            break;
        case TPK_OP_EMBED:
            assert_true(in->avar >= 0 && in->avar < p->nembeds);
            assert_true(in->src >= 0 && in->src < p->nslots);
            break;
        case TPK_OP_LINCOMB:
            for (int k = 0; k < in->nterms; k++) {
                assert_int_equal(p->var[in->term[k]].type, TPK_VAR_G);
                assert_true(p->var[in->term[k]].def < i);
            }
            break;
        case TPK_OP_NONLIN:
        case TPK_OP_MOMENT:
            for (int k = 0; k < in->body.nargs; k++) {
                assert_int_equal(p->var[in->body.args[k]].type, TPK_VAR_G);
                assert_true(p->var[in->body.args[k]].def < i);
                if (k > 0)
                    assert_true(in->body.args[k - 1] < in->body.args[k]);
            }
            for (int k = 0; k < in->body.len; k++) {
                const tpk_rpn_node *x = &in->body.node[k];
                assert_true(x->op >= TPK_RPN_CONST && x->op <= TPK_RPN_CALL);
                if (x->op == TPK_RPN_GVAR)
                    assert_int_equal(p->var[x->var].type, TPK_VAR_G);
                if (x->op == TPK_RPN_SCALAR)
                    assert_int_equal(p->var[x->var].type, TPK_VAR_SCALAR);
                if (x->op == TPK_RPN_CALL)
                    assert_non_null(x->fn);
            }
            break;
        default:
            break;
        }
    }
    for (int o = 0; o < p->noutputs; o++)
        assert_true(p->var[p->output[o].src].type != TPK_VAR_SCALAR);
    FILE *f = tmpfile();
    assert_non_null(f);
    tpk_program_dump(p, f);
    assert_true(ftell(f) > 0);
    fclose(f);
}

static void test_mlp(void **state)
{
    (void)state;
    tpk_program *p = load_prog("mlp.nsr", NULL, 0);
    assert_non_null(p);
    check_invariants(p);
    assert_int_equal(count_op(p, TPK_OP_BIAS), 3);
    assert_int_equal(count_op(p, TPK_OP_EMBED), 1);
    assert_int_equal(count_op(p, TPK_OP_MATMUL), 2);
    assert_int_equal(count_op(p, TPK_OP_LINCOMB), 3);
    assert_int_equal(count_op(p, TPK_OP_NONLIN), 3);
    assert_int_equal(count_op(p, TPK_OP_MOMENT), 0);
    assert_int_equal(p->nslots, 1);
    assert_int_equal(p->nwidths, 1);
    assert_string_equal(p->width_name[0], "n");
    assert_int_equal(p->navars, 2);
    assert_int_equal(p->nembeds, 1);
    assert_int_equal(p->features, 0);
    assert_int_equal(p->noutputs, 1);
    assert_string_equal(p->output[0].name, "y");
    assert_int_equal(p->output[0].src, var_named(p, "h[3]"));
    /* gpkernel --arch=mlp's defaults (issue 39, item 2): sigma_v2 = sigma_w2,
     * sigma_ob2 = sigma_b2 = 0 */
    assert_true(p->output[0].var == 2.0);
    assert_true(p->output[0].bias_var == 0.0);
    assert_true(p->avar[0].var == 2.0);
    assert_true(p->embed[0].var == 2.0); /* sigma_u2 defaults to sigma_w2 */
    int b1 = var_named(p, "b[1]");
    assert_true(b1 >= 0);
    assert_true(p->instr[p->var[b1].def].var == 0.0);
    /* g[2] = W[2] h[1] + b[2]: a MatMul into a temporary, then a LinComb */
    const tpk_instr *g2 = &p->instr[p->var[var_named(p, "g[2]")].def];
    assert_int_equal(g2->op, TPK_OP_LINCOMB);
    assert_int_equal(g2->nterms, 2);
    assert_int_equal(p->var[g2->term[0]].name[0], '%');
    assert_int_equal(p->instr[p->var[g2->term[0]].def].op, TPK_OP_MATMUL);
    assert_int_equal(p->instr[p->var[g2->term[0]].def].src, var_named(p, "h[1]"));
    const tpk_instr *h3 = &p->instr[p->var[var_named(p, "h[3]")].def];
    assert_int_equal(h3->body.len, 2);
    assert_string_equal(tpk_phi_name(h3->body.node[1].fn), "relu");
    tpk_program_free(p);
}

/* docs/netsor.md as a user reads it (issue 39, item 2): its grammar gives readout a third
 * argument, and its first example, run as written, has the output bias variance it declares
 * (0.05) and the readout variance (1.0): the example is the documented form, not a sketch. */
static void test_docs_first_example(void **state)
{
    (void)state;
    char path[1024];
    const char *root = getenv("TPK_ROOT");
    snprintf(path, sizeof path, "%s/docs/%s", root ? root : ".", "netsor.md");
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char doc[200000];
    size_t n = fread(doc, 1, sizeof doc - 1, f);
    doc[n] = '\0';
    fclose(f);
    assert_non_null(strstr(doc, "'readout' [ '[' NAME ']' ] '(' vectors ',' expr [ ',' expr ] ')'"));
    const char *ex = strstr(doc, "## A first example");
    assert_non_null(ex);
    const char *open = strstr(ex, "```\n"), *close = open ? strstr(open + 4, "```") : NULL;
    assert_true(open && close);
    char src[8192];
    assert_true((size_t)(close - open - 4) < sizeof src);
    memcpy(src, open + 4, (size_t)(close - open - 4));
    src[close - open - 4] = '\0';
    tpk_netsor_opts opts = {0};
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_program *p = tpk_netsor_load_string("netsor.md", src, &opts, g_reg, &ctx);
    if (!p)
        fail_msg("the first example of docs/netsor.md: %s", ctx.msg);
    assert_int_equal(p->noutputs, 1);
    assert_true(p->output[0].var == 1.0);
    assert_true(p->output[0].bias_var == 0.05);
    tpk_program_free(p);
}

static void test_overrides(void **state)
{
    (void)state;
    tpk_param_set sets[] = {{"L", "5"}, {"phi", "erf"}, {"sigma_w2", "1.5"}, {"sigma_b2", "0"}};
    tpk_program *p = load_prog("mlp.nsr", sets, 4);
    assert_non_null(p);
    check_invariants(p);
    assert_int_equal(count_op(p, TPK_OP_BIAS), 5);
    assert_int_equal(count_op(p, TPK_OP_MATMUL), 4);
    assert_int_equal(count_op(p, TPK_OP_NONLIN), 5);
    assert_true(p->avar[0].var == 1.5);
    assert_true(p->embed[0].var == 1.5);
    const tpk_instr *h = &p->instr[p->var[var_named(p, "h[5]")].def];
    assert_non_null(strstr(tpk_phi_name(h->body.node[h->body.len - 1].fn), "erf"));
    assert_true(p->instr[p->var[var_named(p, "b[2]")].def].var == 0.0);
    tpk_program_free(p);
    /* a function parameter with bound parameters */
    tpk_param_set lk[] = {{"phi", "leaky_relu(0.2)"}, {"L", "1"}};
    p = load_prog("mlp.nsr", lk, 2);
    assert_non_null(p);
    assert_int_equal(count_op(p, TPK_OP_MATMUL), 0);
    const tpk_instr *h1 = &p->instr[p->var[var_named(p, "h[1]")].def];
    assert_non_null(strstr(tpk_phi_name(h1->body.node[1].fn), "leaky_relu(0.2"));
    tpk_program_free(p);
}

static void test_rnn(void **state)
{
    (void)state;
    tpk_program *p = load_prog("rnn.nsr", NULL, 0);
    assert_non_null(p);
    check_invariants(p);
    assert_int_equal(p->nslots, 4);
    assert_int_equal(count_op(p, TPK_OP_EMBED), 4);
    assert_int_equal(count_op(p, TPK_OP_MATMUL), 3); /* W s[0] = 0 is folded away */
    assert_int_equal(count_op(p, TPK_OP_BIAS), 1);
    assert_int_equal(p->navars, 1);                   /* W tied over time */
    assert_int_equal(p->noutputs, 4);
    for (int t = 0; t < 4; t++) {
        char name[16];
        snprintf(name, sizeof name, "y[%d]", t + 1);
        assert_string_equal(p->output[t].name, name);
        snprintf(name, sizeof name, "s[%d]", t + 1);
        assert_int_equal(p->output[t].src, var_named(p, name));
    }
    int slot = 0;
    for (int i = 0; i < p->ninstr; i++)
        if (p->instr[i].op == TPK_OP_EMBED)
            assert_int_equal(p->instr[i].src, slot++);
    /* h[1] = U x[1] + b: the zero MatMul folded, so a LinComb of two initial G-vars */
    const tpk_instr *h1 = &p->instr[p->var[var_named(p, "h[1]")].def];
    assert_int_equal(h1->op, TPK_OP_LINCOMB);
    assert_int_equal(h1->nterms, 2);
    assert_int_equal(var_named(p, "s[0]"), -1);
    tpk_program_free(p);

    p = load_prog("rnn_untied.nsr", NULL, 0);
    assert_non_null(p);
    check_invariants(p);
    assert_int_equal(p->navars, 3);
    assert_int_equal(count_op(p, TPK_OP_MATMUL), 3);
    for (int i = 0, a = 0; i < p->ninstr; i++)
        if (p->instr[i].op == TPK_OP_MATMUL)
            assert_int_equal(p->instr[i].avar, a++);
    tpk_program_free(p);
}

static void test_gru_inlining(void **state)
{
    (void)state;
    tpk_program *p = load_prog("gru.nsr", NULL, 0);
    assert_non_null(p);
    check_invariants(p); /* every Nonlin reads G-vars only */
    int h3 = var_named(p, "h[3]");
    assert_true(h3 >= 0);
    const tpk_instr *in = &p->instr[p->var[h3].def];
    assert_int_equal(in->op, TPK_OP_NONLIN);
    /* h[3] unrolls to Σ_a ζ(a,3) erf(hh[a]): it reads zt[1..3] and hh[1..3] */
    assert_int_equal(in->body.nargs, 6);
    const char *want[] = {"zt[1]", "hh[1]", "zt[2]", "hh[2]", "zt[3]", "hh[3]"};
    for (int k = 0; k < 6; k++)
        assert_int_equal(in->body.args[k], var_named(p, want[k]));
    /* Uh (h[t-1] * r[t]) multiplies an H-var temporary */
    int hr = 0;
    for (int i = 0; i < p->ninstr; i++)
        if (p->instr[i].op == TPK_OP_MATMUL && p->var[p->instr[i].src].type == TPK_VAR_H &&
            p->var[p->instr[i].src].name[0] == '%')
            hr++;
    assert_int_equal(hr, 2); /* t = 2, 3 (h[0] * r[1] = 0 folds) */
    assert_int_equal(p->nembeds, 3);
    assert_int_equal(p->navars, 3);
    tpk_program_free(p);

    /* a Nonlin of H-vars given inline */
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    p = tpk_netsor_load_string("t.nsr",
                               HDR "G b : n ~ 0.3\ng = U x\nk = U x + b\nz = relu(g)\n"
                               "w = tanh(k)\nh = z * w + sin(z)\noutput y = readout(h, 1)\n",
                               NULL, g_reg, &ctx);
    assert_non_null(p);
    check_invariants(p);
    in = &p->instr[p->var[var_named(p, "h")].def];
    assert_int_equal(in->body.nargs, 2);
    assert_int_equal(in->body.args[0], var_named(p, "g"));
    assert_int_equal(in->body.args[1], var_named(p, "k"));
    tpk_program_free(p);
}

static void test_netsor_plus(void **state)
{
    (void)state;
    tpk_program *p = load_prog("layernorm-mlp.nsr", NULL, 0);
    assert_non_null(p);
    check_invariants(p);
    assert_int_equal(count_op(p, TPK_OP_MOMENT), 4);
    assert_true(p->features & TPK_FEAT_NETSOR_PLUS);
    assert_false(p->features & TPK_FEAT_SQRT_N_LOGITS);
    const tpk_instr *h = &p->instr[p->var[var_named(p, "h[1]")].def];
    int scalars = 0;
    for (int k = 0; k < h->body.len; k++)
        scalars += h->body.node[k].op == TPK_RPN_SCALAR;
    assert_int_equal(scalars, 2);
    assert_int_equal(p->var[var_named(p, "m[1]")].type, TPK_VAR_SCALAR);
    assert_int_equal(p->var[var_named(p, "m[1]")].width, -1);
    tpk_program_free(p);

    /* attention logits mean(k[i] * k[j]) / temp, and a sqrt(n)-scaled product, flagged */
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_netsor_opts opts = {.netsor_plus = 1};
    p = tpk_netsor_load_string("t.nsr",
                               HDR "param temp = 2\nk[i in 1..2] = U x\n"
                               "a[i in 1..2, j in 1..2] = mean(k[i] * k[j]) / temp\n"
                               "h = exp(a[1, 2]) * k[1]\nq = sqrt(n) * mean(k[1] * k[2])\n"
                               "output y = readout(h, 1)\n", &opts, g_reg, &ctx);
    assert_non_null(p);
    check_invariants(p);
    assert_true(p->features & TPK_FEAT_NETSOR_PLUS);
    assert_true(p->features & TPK_FEAT_SQRT_N_LOGITS);
    int q = var_named(p, "q");
    assert_int_equal(p->instr[p->var[q].def].op, TPK_OP_MOMENT);
    assert_int_equal(p->instr[p->var[q].def].src, 1);
    /* a[1,2] = %m / temp: a Moment of a scalar expression (no G-var arguments) */
    const tpk_instr *a12 = &p->instr[p->var[var_named(p, "a[1,2]")].def];
    assert_int_equal(a12->op, TPK_OP_MOMENT);
    assert_int_equal(a12->body.nargs, 0);
    tpk_program_free(p);
}

static void test_holes(void **state)
{
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *diag = open_memstream(&buf, &len);
    assert_non_null(diag);
    tpk_netsor_opts opts = {.explain = 1, .diag = diag};
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_program *p = tpk_netsor_load_string(
        "prog.nsr",
        "width n, m\ninput x : d\nA W : (_, n) ~ 2\nA U : (n, _) ~ 1\nA V : (m, n) ~ 1\n"
        "g = U x\nh = relu(g)\nk = W h\nj = V relu(k)\noutput y = readout(j, 1)\n",
        &opts, g_reg, &ctx);
    fclose(diag);
    if (p == NULL)
        print_error("%s\n", ctx.msg);
    assert_non_null(p);
    assert_non_null(strstr(buf, "prog.nsr:3:8: note: hole '_' must be n\n"));
    assert_non_null(strstr(buf, "prog.nsr:4:11: note: hole '_' must be d\n"));
    /* W : (_, n) became A(n, n); k = W h therefore has width n */
    assert_string_equal(p->avar[0].name, "W");
    assert_int_equal(p->avar[0].rows, 0);
    assert_int_equal(p->avar[0].cols, 0);
    assert_string_equal(p->width_name[p->var[var_named(p, "k")].width], "n");
    assert_string_equal(p->width_name[p->var[var_named(p, "j")].width], "m");
    tpk_program_free(p);
    free(buf);
}

static void test_syntax_variants(void **state)
{
    (void)state;
    /* `;` separators, continuation lines, call-style MatMul W(h), unary minus, powers, constants */
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_program *p = tpk_netsor_load_string(
        "t.nsr",
        "width n; input x : d; A U : (n, d) ~ 1; A W : (n, n) ~ 2\n"
        "g = U(x)\nh = relu(g)^2 -\n    0.5 * -g\nk = W(h) - 2 * g   # LinComb with coefficients\n"
        "H lin = k + g\nc = 3\nz = W c\noutput y = readout(k, 1)\noutput w = readout(lin + z, 1)\n",
        NULL, g_reg, &ctx);
    if (p == NULL)
        print_error("%s\n", ctx.msg);
    assert_non_null(p);
    check_invariants(p);
    const tpk_instr *k = &p->instr[p->var[var_named(p, "k")].def];
    assert_int_equal(k->op, TPK_OP_LINCOMB);
    assert_true(k->coef[0] == 1.0);
    assert_true(k->coef[1] == -2.0);
    assert_int_equal(p->var[var_named(p, "lin")].type, TPK_VAR_H);
    /* W c with c = 3: a constant Nonlin (no arguments) feeds the MatMul */
    const tpk_instr *z = &p->instr[p->var[var_named(p, "z")].def];
    assert_int_equal(z->op, TPK_OP_MATMUL);
    assert_int_equal(p->instr[p->var[z->src].def].body.nargs, 0);
    assert_int_equal(p->noutputs, 2);
    assert_string_equal(p->output[1].name, "w");
    tpk_program_free(p);
}

/* Final parameter values: overrides win, functions come back as specs, bad lookups say why; and
 * tpk_array_block copies a block and refuses one outside the matrix. */
static void test_param_lookup(void **state)
{
    (void)state;
    tpk_param_set sets[] = {{"sigma_w2", "1.375"}, {"phi", "leaky_relu(0.25)"}};
    tpk_program *p = load_prog("mlp.nsr", sets, 2);
    assert_non_null(p);
    double v = 0;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_program_param_number(p, "sigma_w2", &v, &ctx), TPK_OK);
    assert_true(v == 1.375);
    assert_non_null(strstr(tpk_program_param(p, "phi"), "leaky_relu"));
    assert_null(tpk_program_param(p, "no_such"));
    assert_int_equal(tpk_program_param_number(p, "no_such", &v, &ctx), TPK_EINVAL);
    assert_non_null(strstr(ctx.msg, "no_such"));
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_program_param_number(p, "phi", &v, &ctx), TPK_EINVAL);
    assert_non_null(strstr(ctx.msg, "not a number"));
    tpk_program_free(p);

    tpk_array *A = tpk_array_alloc2(3, 4, NULL);
    for (int i = 0; i < 12; i++)
        A->data[i] = 0.5 * i - 1.25;
    tpk_array *B = tpk_array_block(A, 1, 2, 1, 3, NULL);
    assert_non_null(B);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            assert_true(B->data[i * 3 + j] == A->data[(1 + i) * 4 + 1 + j]);
    tpk_ctx_init(&ctx);
    assert_null(tpk_array_block(A, 2, 2, 0, 1, &ctx));
    assert_int_equal(ctx.status, TPK_EINVAL);
    tpk_array_free(B);
    tpk_array_free(A);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_malformed_files),
        cmocka_unit_test(test_io_errors),
        cmocka_unit_test(test_mlp),
        cmocka_unit_test(test_docs_first_example),
        cmocka_unit_test(test_overrides),
        cmocka_unit_test(test_param_lookup),
        cmocka_unit_test(test_rnn),
        cmocka_unit_test(test_gru_inlining),
        cmocka_unit_test(test_netsor_plus),
        cmocka_unit_test(test_holes),
        cmocka_unit_test(test_syntax_variants),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
