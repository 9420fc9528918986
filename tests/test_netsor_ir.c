/* The family IR (netsor/ir*.c): every shipped program lowers and passes the verifier; the
 * structure it records is what the programs say, counted here from the program text's own
 * parameters (sites per layer and per step, tied weights of a recurrence, the filter members of
 * a convolution, gate products, batchnorm, √n logits); a malformed IR is refused, one broken rule
 * at a time, naming the node; `netsor dump --ir` prints it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tpk/tpk.h"
#include "support/testutil.h"
#include "../netsor/ir-impl.h"

static const char *root(void)
{
    const char *r = getenv("TPK_ROOT");
    return r && *r ? r : ".";
}

static tpk_program *load(const tu_phis *f, const char *name, const tpk_param_set *sets, int n)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/programs/%s", root(), name);
    tpk_netsor_opts o = {.sets = sets, .nsets = n, .netsor_plus = 1, .verify_ir = 1};
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_program *p = tpk_netsor_load_file(path, &o, f->reg, &ctx);
    if (p == NULL)
        print_message("%s: %s\n", path, ctx.msg);
    assert_non_null(p);
    assert_non_null(p->rolled);
    assert_non_null(p->rolled->ir);
    return p;
}

static int count_op(const nsr_ir *ir, int op)
{
    int c = 0;
    for (int k = 0; k < ir->nn; k++)
        c += ir->n[k].op == op;
    return c;
}

/* Every program under programs/ (and some settings of them): lowered, verified at load
 * (verify_ir), verified again through the public call, and printed. */
static void test_shipped_programs(void **state)
{
    const tu_phis *f = *state;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/programs", root());
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        size_t len = strlen(de->d_name);
        if (len < 5 || strcmp(de->d_name + len - 4, ".nsr") != 0)
            continue;
        tpk_program *p = load(f, de->d_name, NULL, 0);
        tpk_ctx ctx;
        tpk_ctx_init(&ctx);
        assert_int_equal(tpk_program_verify_ir(p, &ctx), TPK_OK);
        char *buf = NULL;
        size_t size = 0;
        FILE *m = open_memstream(&buf, &size);
        assert_non_null(m);
        assert_int_equal(tpk_program_dump_ir(p, m, &ctx), TPK_OK);
        fclose(m);
        assert_true(strncmp(buf, "# family IR of ", 15) == 0);
        /* one node line per node */
        int lines = 0;
        for (char *c = buf; (c = strstr(c, "\n  %")) != NULL; c++)
            lines++;
        assert_int_equal(lines, p->rolled->ir->nn);
        free(buf);
        tpk_program_free(p);
        n++;
    }
    closedir(d);
    assert_true(n >= 15);
    /* deeper and longer settings of the same programs */
    const tpk_param_set deep[] = {{"L", "6"}}, longer[] = {{"T", "9"}}, wide[] = {{"rows", "5"},
                                                                                    {"L", "4"}};
    const struct { const char *prog; const tpk_param_set *s; int n; } v[] = {
        {"mlp.nsr", deep, 1}, {"mlp-ln-residual.nsr", deep, 1}, {"transformer.nsr", deep, 1},
        {"rnn.nsr", longer, 1}, {"gru.nsr", longer, 1}, {"lstm.nsr", longer, 1},
        {"cnn2d.nsr", wide, 2}, {"cnn1d.nsr", deep, 1}};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        tpk_program_free(load(f, v[i].prog, v[i].s, v[i].n));
}

/* The MLP of depth L: the embedding and W[2..L], one site each, no tying; one map per layer. */
static void test_mlp_sites(void **state)
{
    const tu_phis *f = *state;
    const tpk_param_set s[] = {{"L", "5"}};
    tpk_program *p = load(f, "mlp.nsr", s, 1);
    const nsr_ir *ir = p->rolled->ir;
    assert_int_equal(ir->nsites, 5);
    assert_int_equal(count_op(ir, NSR_IR_MAP), 5);
    assert_int_equal(count_op(ir, NSR_IR_OUTPUT), 1);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    nsr_ir_uses u;
    assert_int_equal(nsr_ir_uses_of(p, ir, &u, &ctx), TPK_OK);
    assert_int_equal(u.ntied, 0);
    for (int k = 0; k < u.nsites; k++)
        assert_int_equal(u.site[k].nmembers, 1);
    nsr_ir_uses_free(&u, &ctx);
    tpk_program_free(p);
}

/* The RNN over T steps: W and U are each one member multiplied at T sites (tied); the GRU's six
 * matrices likewise, and its gates are products of vectors outside any mean. */
static void test_recurrent_tying(void **state)
{
    const tu_phis *f = *state;
    const tpk_param_set s[] = {{"T", "7"}};
    tpk_program *p = load(f, "rnn.nsr", s, 1);
    const nsr_ir *ir = p->rolled->ir;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    nsr_ir_uses u;
    assert_int_equal(nsr_ir_uses_of(p, ir, &u, &ctx), TPK_OK);
    assert_int_equal(u.nsites, 14);
    assert_int_equal(u.ntied, 2);
    for (int d = 0; d < p->rolled->ndm; d++)
        if (p->rolled->dm[d].kind == NSR_DM_AVAR)
            assert_int_equal(u.nuses[d], 7);
    nsr_ir_uses_free(&u, &ctx);
    tpk_program_free(p);

    p = load(f, "gru.nsr", s, 1);
    ir = p->rolled->ir;
    assert_int_equal(nsr_ir_uses_of(p, ir, &u, &ctx), TPK_OK);
    assert_int_equal(u.ntied, 6);
    int gates = 0;
    for (int k = 0; k < ir->nn; k++)
        gates += ir->n[k].gates && !ir->n[k].in_moment;
    assert_true(gates >= 7); /* at least one per step */
    nsr_ir_uses_free(&u, &ctx);
    tpk_program_free(p);
}

/* A k×k convolution: its tap sum's MatMul reads k² filter members (one per binder point), each
 * at one site; the binders nest twice around it. */
static void test_convolution_members(void **state)
{
    const tu_phis *f = *state;
    const tpk_param_set s[] = {{"kh", "3"}, {"kw", "2"}, {"rows", "4"}, {"cols", "5"}, {"L", "3"}};
    tpk_program *p = load(f, "cnn2d.nsr", s, 5);
    const nsr_ir *ir = p->rolled->ir;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    nsr_ir_uses u;
    assert_int_equal(nsr_ir_uses_of(p, ir, &u, &ctx), TPK_OK);
    assert_int_equal(u.nsites, 3); /* the embedding taps and two layers */
    for (int k = 0; k < u.nsites; k++) {
        assert_true(u.site[k].varies);
        assert_int_equal(u.site[k].nmembers, 6);
        assert_int_equal(ir->n[u.site[k].node].scope, 2);
    }
    assert_int_equal(u.ntied, 0);
    nsr_ir_uses_free(&u, &ctx);
    tpk_program_free(p);
}

/* Products inside mean() are moments, not gates; bn and sqrt(n) have their own kinds. */
static void test_kinds(void **state)
{
    const tu_phis *f = *state;
    tpk_program *p = load(f, "attention.nsr", NULL, 0);
    const nsr_ir *ir = p->rolled->ir;
    int in_mean = 0, outside = 0;
    for (int k = 0; k < ir->nn; k++) {
        in_mean += ir->n[k].gates && ir->n[k].in_moment;
        outside += ir->n[k].gates && !ir->n[k].in_moment;
    }
    assert_true(in_mean > 0);
    assert_int_equal(outside, 0);
    assert_true(count_op(ir, NSR_IR_SOFTMAX) > 0 && count_op(ir, NSR_IR_MOMENT) > 0);
    tpk_program_free(p);
    p = load(f, "batchnorm.nsr", NULL, 0);
    assert_true(count_op(p->rolled->ir, NSR_IR_BN) > 0);
    tpk_program_free(p);
    p = load(f, "attention-sqrtn.nsr", NULL, 0);
    assert_true(count_op(p->rolled->ir, NSR_IR_SQRTN) > 0);
    tpk_program_free(p);
}

/* Which limit back end takes each shipped program, decided on the IR (ir_support.c): the reason
 * names the construct, and the program's flag agrees with it. */
static void test_limit_support(void **state)
{
    const tu_phis *f = *state;
    const struct { const char *prog, *why; } v[] = {
        {"mlp.nsr", NULL}, {"mlp-ln-residual.nsr", NULL}, {"transformer.nsr", NULL},
        {"cnn2d.nsr", NULL}, {"cnn1d.nsr", NULL}, {"attention.nsr", NULL},
        {"layernorm-mlp.nsr", NULL}, {"rnn.nsr", "W is multiplied in more than one place"},
        {"rnn_untied.nsr", "U is multiplied in more than one place"},
        {"gru.nsr", "a product of two vectors outside mean()"},
        {"lstm.nsr", "a product of two vectors outside mean()"},
        {"batchnorm.nsr", "'bn(...)'"}, {"attention-sqrtn.nsr", "'sqrt(...)'"}};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        tpk_program *p = load(f, v[i].prog, NULL, 0);
        char why[TPK_MSG_MAX];
        tpk_ctx ctx;
        tpk_ctx_init(&ctx);
        int r = nsr_ir_limit_refusal(p, why, sizeof why, &ctx);
        if (r != (v[i].why != NULL) || (r && strstr(why, v[i].why) == NULL))
            print_message("%s: %d %s\n", v[i].prog, r, r ? why : "");
        assert_int_equal(r, v[i].why != NULL);
        assert_int_equal(tpk_program_limit_rolled(p), !r);
        if (r)
            assert_non_null(strstr(why, v[i].why));
        tpk_program_free(p);
    }
}

/* One broken rule at a time on a copy of a real IR: each is refused, naming a node. */
typedef struct breaker {
    const char *what;
    int (*apply)(nsr_ir *ir); /* returns 1 when it found a place to break */
} breaker;

static int find(const nsr_ir *ir, int op)
{
    for (int k = 0; k < ir->nn; k++)
        if (ir->n[k].op == op)
            return k;
    return -1;
}
static int forward_operand(nsr_ir *ir)
{
    int k = find(ir, NSR_IR_MAP);
    ir->n[k].arg[0] = k + 1;
    return k >= 0;
}
static int used_twice(nsr_ir *ir)
{
    int k = find(ir, NSR_IR_MUL);
    if (k < 0)
        return 0;
    ir->n[k].arg[1] = ir->n[k].arg[0];
    return 1;
}
static int weight_not_avar(nsr_ir *ir)
{
    int k = find(ir, NSR_IR_MATMUL), r = find(ir, NSR_IR_DEF);
    ir->n[k].sym = ir->n[r].sym;
    return 1;
}
static int wrong_type(nsr_ir *ir)
{
    ir->n[find(ir, NSR_IR_MAP)].type = NSR_TY_G;
    return 1;
}
static int root_in_middle(nsr_ir *ir)
{
    ir->n[find(ir, NSR_IR_MAP)].op = NSR_IR_DEF;
    return 1;
}
static int site_skipped(nsr_ir *ir)
{
    ir->n[find(ir, NSR_IR_MATMUL)].site = 5;
    return 1;
}
static int bad_sign(nsr_ir *ir)
{
    int k = find(ir, NSR_IR_LIN);
    if (k < 0)
        return 0;
    ir->n[k].sign[0] = 2;
    return 1;
}
static int map_without_phi(nsr_ir *ir)
{
    ir->n[find(ir, NSR_IR_MAP)].phi = NULL;
    return 1;
}
static int wrong_scope(nsr_ir *ir)
{
    int k = find(ir, NSR_IR_SUM);
    if (k < 0)
        return 0;
    ir->n[ir->n[k].arg[0]].scope = 0;
    return 1;
}
static int input_outside_matmul(nsr_ir *ir)
{
    ir->n[find(ir, NSR_IR_MATMUL)].op = NSR_IR_MOMENT; /* the embedding's input under a mean */
    return 1;
}
static int gap_between_statements(nsr_ir *ir)
{
    ir->fi[1].first++;
    return 1;
}

static void test_verifier_refuses(void **state)
{
    const tu_phis *f = *state;
    const breaker b[] = {
        {"operand", forward_operand}, {"used 2 times", used_twice}, {"not an A-var", weight_not_avar},
        {"its operands make it", wrong_type}, {"DEF or OUTPUT before the end", root_in_middle},
        {"numbered in order", site_skipped}, {"sign 2", bad_sign}, {"without its function", map_without_phi},
        {"scope", wrong_scope}, {"input read outside", input_outside_matmul},
        {"covers nodes", gap_between_statements}};
    /* cnn1d has every kind the breakers need: taps (sum, mul), a LIN, maps, an embedding */
    tpk_program *p = load(f, "cnn1d.nsr", NULL, 0);
    const nsr_ir *ir = p->rolled->ir;
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) {
        nsr_ir copy = *ir;
        copy.n = malloc((size_t)ir->nn * sizeof *copy.n);
        copy.fi = malloc((size_t)ir->nfi * sizeof *copy.fi);
        assert_non_null(copy.n);
        assert_non_null(copy.fi);
        memcpy(copy.n, ir->n, (size_t)ir->nn * sizeof *copy.n);
        memcpy(copy.fi, ir->fi, (size_t)ir->nfi * sizeof *copy.fi);
        signed char *signs[64] = {0};
        for (int k = 0; k < copy.nn && k < 64; k++)
            if (copy.n[k].op == NSR_IR_LIN) {
                signs[k] = malloc((size_t)copy.n[k].nterms);
                memcpy(signs[k], copy.n[k].sign, (size_t)copy.n[k].nterms);
                copy.n[k].sign = signs[k];
            }
        tpk_ctx ctx;
        tpk_ctx_init(&ctx);
        assert_int_equal(nsr_ir_verify(p->rolled, &copy, &ctx), TPK_OK); /* the copy is sound */
        assert_true(b[i].apply(&copy));
        int st = nsr_ir_verify(p->rolled, &copy, &ctx);
        if (st != TPK_EINVAL || strstr(ctx.msg, b[i].what) == NULL ||
            strstr(ctx.msg, "invalid family IR") == NULL)
            print_message("breaker %zu (%s): status %d, message: %s\n", i, b[i].what, st, ctx.msg);
        assert_int_equal(st, TPK_EINVAL);
        assert_non_null(strstr(ctx.msg, b[i].what));
        for (int k = 0; k < 64; k++)
            free(signs[k]);
        free(copy.n);
        free(copy.fi);
    }
    tpk_program_free(p);
}

/* The command line: dump --ir prints it, --verify-ir passes, --ir is refused elsewhere. */
static void test_cli(void **state)
{
    (void)state;
    const char *bin = getenv("TPK_BIN");
    char cmd[2048], out[1 << 16];
    snprintf(cmd, sizeof cmd, "'%s/netsor' dump --ir --verify-ir '%s/programs/rnn.nsr' --set T=3",
             bin ? bin : "build/bin", root());
    assert_int_equal(tu_capture(cmd, out, sizeof out), 0);
    assert_non_null(strstr(out, "# family IR of"));
    assert_non_null(strstr(out, "(tied)"));
    assert_non_null(strstr(out, "= matmul  W"));
    snprintf(cmd, sizeof cmd, "'%s/netsor' check --ir '%s/programs/mlp.nsr' 2>/dev/null",
             bin ? bin : "build/bin", root());
    assert_int_equal(tu_capture(cmd, out, sizeof out), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shipped_programs),
        cmocka_unit_test(test_mlp_sites),
        cmocka_unit_test(test_recurrent_tying),
        cmocka_unit_test(test_convolution_members),
        cmocka_unit_test(test_kinds),
        cmocka_unit_test(test_limit_support),
        cmocka_unit_test(test_verifier_refuses),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, tu_phis_setup, tu_phis_teardown);
}
