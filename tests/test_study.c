/* The study API (include/tpk/study.h) on its own: a toy study run through the library writes the
 * same datasets as gplimits with the same options; a study stopped from its progress callback
 * resumes from its checkpoint to the same file; the analysis of synthetic raw data with an exact
 * n^-1/2 error against its closed form; every error path of the plan, the run and the analysis. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/testutil.h"
#include "tpk/job.h"
#include "tpk/study.h"

/* The toy of tests/test_limits_cli.c: a few seconds on 2 cores. */
#define TOY_CLI "--arch=mlp --depth=2 --widths=16..128 --seeds=24 --boot=100 --max-inputs=4 " \
                "--seed=11 --quiet"
static const size_t toy_widths[] = {16, 32, 64, 128};
/* Rounding of the synthetic oracle: a handful of operations on O(1) values. */
#define TOL_EXACT 1e-12

typedef struct fixture {
    tu_env *env;
    tpk_phi_registry *reg;
    const tpk_arch *mlp;
    tpk_arch_flag depth;
    char param[64];
    char cli_out[512];       /* gplimits' file of the toy, made once */
} fixture;

static int setup(void **state)
{
    void *e = NULL;
    if (tu_setup_tagged(&e, "study"))
        return -1;
    fixture *f = calloc(1, sizeof *f);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    f->env = e;
    f->reg = tpk_job_registry(&ctx);
    f->mlp = tpk_arch_find("mlp");
    if (!f->reg || !f->mlp || !tpk_arch_flag_param(f->mlp, "depth", f->param, sizeof f->param))
        return -1;
    f->depth = (tpk_arch_flag){.flag = "depth", .value = "2", .param = f->param};
    tu_path(f->env, f->cli_out, sizeof f->cli_out, "cli.h5");
    char args[1024];
    snprintf(args, sizeof args, TOY_CLI " --output='%s'", f->cli_out);
    if (tu_run_tool(f->env, "gplimits", args) != 0)
        return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    tpk_phi_registry_free(f->reg);
    void *e = f->env;
    free(f);
    return tu_teardown(&e);
}

/* The toy's options, as gplimits builds them from TOY_CLI. */
static tpk_study_opts toy_opts(fixture *f, const char *output)
{
    tpk_study_opts o = {.arch = f->mlp, .flags = &f->depth, .nflags = 1, .max_inputs = 4,
                        .widths = toy_widths, .nwidths = 4, .seeds = 24, .seed = 11,
                        .output = output};
    tpk_study_stats_default(&o.stats);
    o.stats.boot = 100;
    o.stats.seed = 11;
    return o;
}

static tpk_array *ds(const char *file, const char *name)
{
    char spec[1100];
    snprintf(spec, sizeof spec, "%s:%s", file, name);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_array *a = tpk_io_read(spec, NULL, &ctx);
    if (!a)
        fail_msg("%s", ctx.msg);
    return a;
}

/* Every dataset of a study file, and the raw-data identity, equal to the last bit. */
static void same_study_files(const char *a, const char *b)
{
    static const char *const fixed[] = {
        "/widths", "/input_rows", "/inputs", "/kernel_limit", "/per_seed/khat",
        "/per_seed/outputs", "/per_seed/frob_rel", "/per_seed/w1_input_variance",
        "/per_width/sliced_rbw1", "/per_width/sliced_rbw1_shape", "/per_width/sliced_w1_samples",
        "/slices", "/fits/rms", "/fits/rbw1_shape", "/fits/rbw1", "/fits/kurtosis_mixture",
        "/fits/sliced_rbw1_shape", "/fits/rms_stability"};
    char names[TPK_STUDY_NCOLS + 32][64];
    size_t k = 0;
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        snprintf(names[k++], sizeof names[0], "%s", fixed[i]);
    for (int c = 0; c < TPK_STUDY_NCOLS; c++)
        snprintf(names[k++], sizeof names[0], "/per_width/%s", tpk_study_column_name(c));
    for (size_t i = 0; i < k; i++) {
        tpk_array *x = ds(a, names[i]), *y = ds(b, names[i]);
        assert_int_equal(tpk_array_size(x), tpk_array_size(y));
        if (memcmp(x->data, y->data, tpk_array_size(x) * sizeof(double)) != 0)
            fail_msg("%s differs between %s and %s", names[i], a, b);
        tpk_array_free(x);
        tpk_array_free(y);
    }
    char ca[4200], cb[4200];
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_io_read_attr_str(a, "/", "gplimits_config", ca, sizeof ca, &ctx), 0);
    assert_int_equal(tpk_io_read_attr_str(b, "/", "gplimits_config", cb, sizeof cb, &ctx), 0);
    assert_string_equal(ca, cb);
}

static void test_library_matches_cli(void **state)
{
    fixture *f = *state;
    char out[512];
    tu_path(f->env, out, sizeof out, "lib.h5");
    tpk_study_opts o = toy_opts(f, out);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_study *s = tpk_study_alloc(&o, f->reg, &ctx);
    if (!s)
        fail_msg("%s", ctx.msg);
    const tpk_study_info *in = tpk_study_get_info(s);
    assert_int_equal(in->source, TPK_STUDY_FRESH);
    assert_int_equal(in->inputs, 4);
    assert_int_equal(in->runs, 4 * 24);
    assert_int_equal(in->done, 0);
    assert_null(tpk_study_get_analysis(s));
    assert_int_equal(tpk_study_run(s, NULL, &ctx), TPK_OK);
    assert_int_equal(in->done, in->runs);
    char *argv[] = {"test_study", NULL};
    if (tpk_study_write(s, 1, argv, NULL, &ctx))
        fail_msg("%s", ctx.msg);
    assert_int_equal(access(in->checkpoint, F_OK), -1);
    same_study_files(out, f->cli_out);
    /* The analysis the library keeps is what the file holds. */
    const tpk_study_analysis *a = tpk_study_get_analysis(s);
    assert_non_null(a);
    tpk_array *fit = ds(out, "/fits/rms"), *rms = ds(out, "/per_width/rms");
    assert_true(a->rms.slope == fit->data[0] && a->rms.slope_lo == fit->data[1]);
    for (size_t w = 0; w < 4; w++)
        assert_true(a->col[TPK_STUDY_RMS][w] == rms->data[w]);
    assert_true(a->rms.slope < -0.3 && a->rms.slope > -0.8);
    tpk_array_free(fit);
    tpk_array_free(rms);
    /* The summary prints every width and the five exponents. */
    char sum[512];
    tu_path(f->env, sum, sizeof sum, "summary.txt");
    FILE *fp = fopen(sum, "w+");
    assert_non_null(fp);
    tpk_study_analysis_print(a, fp);
    rewind(fp);
    char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, fp);
    text[n] = '\0';
    fclose(fp);
    assert_non_null(strstr(text, "RMS kernel error"));
    assert_non_null(strstr(text, "sliced RB-W1"));
    assert_non_null(strstr(text, "note: 24 seeds < 64"));
    tpk_study_free(s);
}

typedef struct progress_log {
    volatile sig_atomic_t *stop;
    int calls, finals;
    size_t last_done;
    int monotone;
} progress_log;

static void on_progress(const tpk_study_progress *p, void *user)
{
    progress_log *l = user;
    l->calls++;
    l->finals += p->final;
    l->monotone &= p->done >= l->last_done && p->done <= p->runs && p->ran <= p->todo;
    l->last_done = p->done;
    *l->stop = 1; /* after the first finished run: stop */
}

static void test_stop_and_resume(void **state)
{
    fixture *f = *state;
    char out[512];
    tu_path(f->env, out, sizeof out, "stopped.h5");
    tpk_study_opts o = toy_opts(f, out);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_study *s = tpk_study_alloc(&o, f->reg, &ctx);
    assert_non_null(s);
    volatile sig_atomic_t stop = 0;
    progress_log log = {.stop = &stop, .monotone = 1};
    tpk_study_run_opts ro = {.stop = &stop, .progress = on_progress, .user = &log};
    assert_int_equal(tpk_study_run(s, &ro, &ctx), TPK_OK);
    const tpk_study_info *in = tpk_study_get_info(s);
    print_message("stopped after %zu of %zu runs\n", in->done, in->runs);
    assert_true(in->done >= 1 && in->done < in->runs);
    assert_int_equal(log.finals, 1);
    assert_true(log.monotone);
    assert_int_equal(access(in->checkpoint, F_OK), 0);
    /* An unfinished study writes nothing. */
    assert_int_equal(tpk_study_write(s, 0, NULL, NULL, &ctx), TPK_EINVAL);
    assert_int_equal(access(out, F_OK), -1);
    size_t saved = in->done;
    tpk_study_free(s);

    /* The checkpoint is refused without resume, and with other settings. */
    tpk_ctx_init(&ctx);
    assert_null(tpk_study_alloc(&o, f->reg, &ctx));
    assert_int_equal(ctx.status, TPK_EINVAL);
    assert_non_null(strstr(ctx.msg, "--resume"));
    o.resume = 1;
    o.seeds = 25;
    tpk_ctx_init(&ctx);
    assert_null(tpk_study_alloc(&o, f->reg, &ctx));
    assert_non_null(strstr(ctx.msg, "different settings"));
    /* Resumed: what was saved is kept, the rest is run, the file is the uninterrupted one's. */
    o.seeds = 24;
    tpk_ctx_init(&ctx);
    s = tpk_study_alloc(&o, f->reg, &ctx);
    assert_non_null(s);
    in = tpk_study_get_info(s);
    assert_int_equal(in->source, TPK_STUDY_FROM_CHECKPOINT);
    assert_int_equal(in->done, saved);
    assert_int_equal(tpk_study_run(s, NULL, &ctx), TPK_OK);
    assert_int_equal(tpk_study_write(s, 0, NULL, NULL, &ctx), TPK_OK);
    tpk_study_free(s);
    same_study_files(out, f->cli_out);
    /* Resume on the finished file: its raw data again, nothing to run. */
    tpk_ctx_init(&ctx);
    s = tpk_study_alloc(&o, f->reg, &ctx);
    assert_non_null(s);
    assert_int_equal(tpk_study_get_info(s)->source, TPK_STUDY_FROM_OUTPUT);
    assert_int_equal(tpk_study_get_info(s)->done, 4 * 24);
    tpk_study_free(s);
}

/* Synthetic raw data: Khat_{w,s} = K + e_s n_w^{-1/2} B, so every per-seed relative error is
 * |e_s| ‖B‖ / (‖K‖ √n) and the RMS error is exactly c n^{-1/2}. */
enum { SW = 4, SS = 8, SN = 2 };
static double syn_n[SW] = {16, 32, 64, 128}, syn_K[SN * SN] = {2.385, 0.5, 0.5, 1.7};
static double syn_khat[SW * SS * SN * SN], syn_y[SW * SS * SN];

static tpk_study_raw synthetic(void)
{
    const double B[SN * SN] = {0.9, -0.31, -0.31, 0.47};
    for (size_t w = 0; w < SW; w++)
        for (size_t s = 0; s < SS; s++) {
            double e = sin(1.37 * (double)s + 0.4) * 1.9;
            for (size_t i = 0; i < SN * SN; i++)
                syn_khat[(w * SS + s) * SN * SN + i] = syn_K[i] + e * B[i] / sqrt(syn_n[w]);
            for (size_t i = 0; i < SN; i++)
                syn_y[(w * SS + s) * SN + i] = cos(0.73 * (double)(s * SN + i) + 0.11 * (double)w);
        }
    return (tpk_study_raw){SW, SS, SN, syn_n, syn_khat, syn_y, syn_K};
}

static void test_analysis_exact_rate(void **state)
{
    (void)state;
    tpk_study_raw r = synthetic();
    tpk_study_stats o;
    tpk_study_stats_default(&o);
    o.boot = 200;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_study_analysis *a = tpk_study_analyse(&r, &o, &ctx);
    if (!a)
        fail_msg("%s", ctx.msg);
    double kk = 0, bb = 0.9 * 0.9 + 2 * 0.31 * 0.31 + 0.47 * 0.47, e2 = 0;
    for (size_t i = 0; i < SN * SN; i++)
        kk += syn_K[i] * syn_K[i];
    for (size_t s = 0; s < SS; s++)
        e2 += pow(sin(1.37 * (double)s + 0.4) * 1.9, 2) / SS;
    for (size_t w = 0; w < SW; w++) {
        double want = sqrt(e2 * bb / kk / syn_n[w]);
        assert_true(fabs(a->col[TPK_STUDY_RMS][w] - want) <= TOL_EXACT * want);
        assert_true(a->col[TPK_STUDY_RMS_LO][w] <= a->col[TPK_STUDY_RMS][w] + TOL_EXACT);
    }
    assert_true(fabs(a->rms.slope + 0.5) < TOL_EXACT);
    assert_true(fabs(a->stability[SW - 2].slope + 0.5) < TOL_EXACT);
    assert_true(a->window.first < SW - 1);
    assert_false(a->degenerate);
    assert_true(a->vdev > 0);
    /* Every width's variance at coordinate 0 is K00 + e_s B00 / √n. */
    for (size_t s = 0; s < SS; s++)
        assert_true(a->variance[3 * SS + s] == syn_khat[(3 * SS + s) * SN * SN]);
    tpk_study_analysis_free(a);
    /* Deterministic: a second analysis is the same to the last bit. */
    a = tpk_study_analyse(&r, &o, &ctx);
    tpk_study_analysis *b = tpk_study_analyse(&r, &o, &ctx);
    assert_non_null(a);
    assert_non_null(b);
    assert_memory_equal(a->col[TPK_STUDY_SHAPE], b->col[TPK_STUDY_SHAPE], SW * sizeof(double));
    assert_true(a->sliced.slope == b->sliced.slope);
    tpk_study_analysis_free(a);
    tpk_study_analysis_free(b);
}

static void analyse_fails(const tpk_study_raw *r, const tpk_study_stats *o, int status,
                          const char *needle)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_study_analysis *a = tpk_study_analyse(r, o, &ctx);
    if (a || ctx.status != status || (needle && !strstr(ctx.msg, needle)))
        fail_msg("wanted status %d with '%s', got %d: %s", status, needle ? needle : "",
                 ctx.status, ctx.msg);
}

static void test_analysis_errors(void **state)
{
    (void)state;
    tpk_study_raw r = synthetic(), bad;
    tpk_study_stats o, ob;
    tpk_study_stats_default(&o);
    analyse_fails(NULL, &o, TPK_EINVAL, "NULL");
    analyse_fails(&r, NULL, TPK_EINVAL, "NULL");
    bad = r;
    bad.W = 1;
    analyse_fails(&bad, &o, TPK_EINVAL, "2 widths");
    bad = r;
    bad.S = 3;
    analyse_fails(&bad, &o, TPK_EINVAL, "seeds");
    double back[SW] = {16, 64, 32, 128};
    bad = r;
    bad.widths = back;
    analyse_fails(&bad, &o, TPK_EINVAL, "increase");
    ob = o;
    ob.w1_input = SN;
    analyse_fails(&r, &ob, TPK_EINVAL, "w1_input");
    ob = o;
    ob.boot = 10;
    analyse_fails(&r, &ob, TPK_EINVAL, "boot");
    ob = o;
    ob.fit_ratio = 0;
    analyse_fails(&r, &ob, TPK_EINVAL, "fit_ratio");
    ob = o;
    ob.fit_min_width = 100;
    analyse_fails(&r, &ob, TPK_EINVAL, "fewer than 2 widths");
    double Kzero[SN * SN] = {0};
    bad = r;
    bad.K = Kzero;
    analyse_fails(&bad, &o, TPK_EDOM, NULL);
    /* Fixed window: fit_min_width = 32 starts at the second width. */
    ob = o;
    ob.fit_min_width = 32;
    ob.boot = 50;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_study_analysis *a = tpk_study_analyse(&r, &ob, &ctx);
    assert_non_null(a);
    assert_int_equal(a->rms.first, 1);
    assert_false(a->auto_window);
    tpk_study_analysis_free(a);
    tpk_study_analysis_free(NULL);
    tpk_study_analysis_print(NULL, stdout);
    assert_int_equal(tpk_study_analysis_write(NULL, NULL, &ctx), TPK_EINVAL);
    assert_null(tpk_study_column_name(-1));
    assert_null(tpk_study_column_name(TPK_STUDY_NCOLS));
    assert_string_equal(tpk_study_column_name(TPK_STUDY_RMS), "rms");
}

static void alloc_fails(fixture *f, const tpk_study_opts *o, int status, const char *needle)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_study *s = tpk_study_alloc(o, f->reg, &ctx);
    if (s || ctx.status != status || (needle && !strstr(ctx.msg, needle)))
        fail_msg("wanted status %d with '%s', got %d: %s", status, needle ? needle : "",
                 ctx.status, ctx.msg);
}

static void test_plan_errors(void **state)
{
    fixture *f = *state;
    char out[512], partial[600];
    tu_path(f->env, out, sizeof out, "err.h5");
    snprintf(partial, sizeof partial, "%s.partial.h5", out);
    tpk_study_opts o = toy_opts(f, out), b;
    alloc_fails(f, NULL, TPK_EINVAL, "NULL");
    b = o;
    b.program = "programs/mlp.nsr";
    alloc_fails(f, &b, TPK_EINVAL, "exactly one");
    b = o;
    b.nwidths = 1;
    alloc_fails(f, &b, TPK_EINVAL, "2 widths");
    size_t flat[2] = {32, 32};
    b = o;
    b.widths = flat;
    b.nwidths = 2;
    alloc_fails(f, &b, TPK_EINVAL, "increase");
    b = o;
    b.seeds = 3;
    alloc_fails(f, &b, TPK_EINVAL, "4 seeds");
    b = o;
    b.stats.w1_input = 4;
    alloc_fails(f, &b, TPK_EINVAL, "--w1-input");
    b = o;
    b.input = "no-such-input.csv";
    alloc_fails(f, &b, TPK_EIO, "no-such-input.csv");
    const tpk_arch *att = tpk_arch_find("attention");
    char scal[64];
    assert_non_null(tpk_arch_flag_param(att, "logit-scaling", scal, sizeof scal));
    tpk_arch_flag sq = {.flag = "logit-scaling", .value = "inv-sqrt-n", .param = scal};
    b = o;
    b.arch = att;
    b.flags = &sq;
    alloc_fails(f, &b, TPK_EUNSUPPORTED, "gpattention");
    /* Checkpoints that are not ours. */
    FILE *fp = fopen(partial, "w");
    assert_non_null(fp);
    fputs("not hdf5", fp);
    fclose(fp);
    b = o;
    b.resume = 1;
    alloc_fails(f, &b, TPK_EFORMAT, "checkpoint");
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_h5out *h = tpk_h5out_open(partial, &ctx);
    double one = 1;
    assert_int_equal(tpk_h5out_write_vector(h, "/x", &one, 1, &ctx), 0);
    assert_int_equal(tpk_h5out_commit(h, &ctx), 0);
    alloc_fails(f, &b, TPK_EFORMAT, "not a gplimits checkpoint");
    remove(partial);
    /* NULL studies. */
    assert_int_equal(tpk_study_run(NULL, NULL, &ctx), TPK_EINVAL);
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_study_write(NULL, 0, NULL, NULL, &ctx), TPK_EINVAL);
    assert_null(tpk_study_get_info(NULL));
    assert_null(tpk_study_get_analysis(NULL));
    assert_int_equal(tpk_study_get_raw(NULL).W, 0);
    tpk_study_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_library_matches_cli),
        cmocka_unit_test(test_stop_and_resume),
        cmocka_unit_test(test_analysis_exact_rate),
        cmocka_unit_test(test_analysis_errors),
        cmocka_unit_test(test_plan_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
