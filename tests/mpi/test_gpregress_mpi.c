/* gpregress-mpi end to end under mpirun -np 2 (make check-mpi; issue 16): ScaLAPACK Cholesky
 * gives gpregress's posterior mean, variances, LML, noise and rcond (MLP with the noise walk, a
 * depth range, a kernel file written by gpkernel-mpi, RBF regression on another grid); block
 * CG gives the mean to its residual tolerance and the LML by stochastic Lanczos quadrature
 * within its stated error bar (both preconditioners, float32 storage); bad input is refused
 * with its cause and no output file is left. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "mpitest.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Cholesky: the tiles are the serial kernel to 1e-14 (test_gpkernel_mpi.c, test_job_block.c)
 * and ScaLAPACK's factor rounds otherwise than LAPACK's; the mean, variances and LML move by
 * about κ(A)·N·ε ≈ 1e-11 here. The acceptance bound, relative to the largest value. */
#define TOL_CHOL 1e-8
/* rcond: the same estimator (dlacn2) on solves that round differently. */
#define TOL_RCOND 1e-6
/* SLQ: the estimate is a mean over probes; its error bar is one standard error, and a fixed seed
 * makes the test deterministic: three error bars. */
#define SLQ_SIGMAS 3.0
/* CG: a column stops at ‖r‖ ≤ τ‖y‖, so |δ mean_i| = |k_iᵀ A⁻¹ r| ≤ ‖k_i‖ τ ‖y‖ / σ² (A ⪰ σ²I):
 * with ‖k_i‖ ≤ √N·max|k| and ‖y‖ ≤ √N (one-hot), the bound N·max|k|·τ/σ². */
#define CG_TOL 1e-12
/* float32 storage rounds every entry by 2^-24 relative: the mean moves by about κ(A) times
 * that (κ ≈ 1e3 at the noise below), far above the CG bound; checked against this. */
#define TOL_F32 1e-4

static int setup(void **state) { return tu_setup_tagged(state, "gpr-mpi"); }

/* The root attributes gpregress-mpi adds to gpregress's. */
static const char *const own_attrs[] = {"mpi_ranks", "mpi_grid", "solver", "tile_items",
                                        "dtype"};

/* Training and test inputs (N×12, M×12) and class labels (3 classes from two coordinates). */
static void classify_data(const tu_env *e, size_t n, size_t m)
{
    const char *in[2] = {"x.npy", "t.npy"}, *lab[2] = {"y.npy", "yt.npy"};
    for (int k = 0; k < 2; k++) {
        const size_t items = k ? m : n, shape[2] = {0, 12}, d[1] = {items};
        char p[512];
        mt_write_inputs(tu_path(e, p, sizeof p, in[k]), items, shape, 2, 11 + (uint64_t)k);
        double *x = mt_values(items * 12, 11 + (uint64_t)k), *y = malloc(items * sizeof *y);
        assert_non_null(y);
        for (size_t i = 0; i < items; i++)
            y[i] = (x[i * 12] > 0) + (x[i * 12 + 1] > 0.4);
        tu_write_npy(tu_path(e, p, sizeof p, lab[k]), y, 1, d);
        free(x);
        free(y);
    }
}

static double rel_diff(const char *a, const char *b, const char *dset)
{
    double d = mt_max_abs_diff(a, b, dset), s = mt_max_abs(a, dset);
    return s > 0 ? d / s : d;
}

/* Every dataset of the list agrees to tol (relative to its largest value); each printed. */
static void assert_close(const char *what, const char *s, const char *m, const char *const *ds,
                         size_t n, double tol)
{
    for (size_t i = 0; i < n; i++) {
        double r = rel_diff(s, m, ds[i]);
        print_message("%s: %-14s relative difference %.2e\n", what, ds[i], r);
        if (!(r <= tol))
            fail_msg("%s: %s differs by %.3g > %.3g", what, ds[i], r, tol);
    }
}

/* gpregress and gpregress-mpi on the same arguments (the MPI ones appended). */
static void both(const tu_env *e, const char *args, const char *serial, const char *mpi,
                 const char *mpi_args)
{
    char a[8192];
    snprintf(a, sizeof a, "%s --output='%s' --quiet", args, serial);
    assert_int_equal(tu_run_tool(e, "gpregress", a), 0);
    snprintf(a, sizeof a, "%s %s --output='%s' --quiet", args, mpi_args, mpi);
    if (mt_run_mpi(e, "gpregress-mpi", a) != 0) {
        char err[8192];
        tu_stderr(e, err, sizeof err);
        fail_msg("gpregress-mpi %s failed:\n%s", a, err);
    }
}

static void classify_args(const tu_env *e, char *args, size_t cap, const char *extra)
{
    char x[512], t[512], y[512], yt[512];
    snprintf(args, cap, "--arch=mlp --train='%s' --test='%s' --labels='%s' --test-labels='%s' "
             "--classify %s", tu_path(e, x, sizeof x, "x.npy"), tu_path(e, t, sizeof t, "t.npy"),
             tu_path(e, y, sizeof y, "y.npy"), tu_path(e, yt, sizeof yt, "yt.npy"), extra);
}

/* ---- tests ------------------------------------------------------------------------------------ */

/* MLP classes, noise and scale by gpregress's walk (subsample of 100, full-size fits). */
static void test_cholesky_matches_gpregress(void **state)
{
    tu_env *e = *state;
    char args[4096], s[512], m[512];
    classify_data(e, 230, 70);
    classify_args(e, args, sizeof args, "--depth=2 --sigma-b2=0.1 --select-n=100");
    both(e, args, tu_path(e, s, sizeof s, "chol-s.h5"), tu_path(e, m, sizeof m, "chol-m.h5"),
         "--solver=cholesky --tile=64");
    const char *ds[] = {"/mean", "/var", "/lml", "/noise", "/scale", "/lml_select", "/accuracy",
                        "/nll"}, *rc[] = {"/rcond"};
    assert_close("cholesky N=230 M=70", s, m, ds, sizeof ds / sizeof ds[0], TOL_CHOL);
    assert_close("cholesky N=230 M=70", s, m, rc, 1, TOL_RCOND);
    mt_assert_attrs_superset(s, m, own_attrs, sizeof own_attrs / sizeof own_attrs[0]);
}

/* CG at a fixed noise: the mean within its residual bound of gpregress's (and so of the
 * Cholesky path's), the LML within its error bar of the exact one; both preconditioners. */
static void test_cg_mean_and_slq_lml(void **state)
{
    tu_env *e = *state;
    char args[4096], s[512], m[512], extra[256];
    const double noise = 0.05;
    classify_data(e, 230, 70);
    snprintf(extra, sizeof extra, "--depth=2 --noise=%g", noise);
    classify_args(e, args, sizeof args, extra);
    const char *pcs[] = {"pivchol", "jacobi"};
    for (int q = 0; q < 2; q++) {
        char mpi_args[512], name[64];
        snprintf(mpi_args, sizeof mpi_args, "--solver=cg --precond=%s --cg-tol=%g "
                 "--slq-probes=48 --seed=5 --tile=64", pcs[q], CG_TOL);
        snprintf(name, sizeof name, "cg-%s.h5", pcs[q]);
        both(e, args, tu_path(e, s, sizeof s, "cg-s.h5"), tu_path(e, m, sizeof m, name),
             mpi_args);
        const double n = 230;
        size_t cnt;
        double *dg = tu_h5_read(m, "/cg_residual", &cnt), resid = dg[0];
        free(dg);
        /* max|k| of an MLP NNGP is its largest diagonal entry, below 4 for these inputs */
        const double bound = n * 4.0 * CG_TOL / noise, dm = mt_max_abs_diff(s, m, "/mean"),
                     dv = mt_max_abs_diff(s, m, "/var");
        double *ls = tu_h5_read(s, "/lml", &cnt), *lm = tu_h5_read(m, "/lml", &cnt),
               *le = tu_h5_read(m, "/lml_error", &cnt);
        print_message("cg %s: mean %.2e, var %.2e (bound %.2e, residual %.2e); lml %.6f vs "
                      "exact %.6f, error bar %.3g (%.2f bars)\n", pcs[q], dm, dv, bound, resid,
                      lm[0], ls[0], le[0], fabs(lm[0] - ls[0]) / le[0]);
        assert_true(resid <= CG_TOL);
        assert_true(dm <= bound);
        assert_true(dv <= 4.0 * bound);   /* ‖k_i‖²/σ²·τ: one more factor max|k| */
        assert_true(le[0] > 0 && fabs(lm[0] - ls[0]) <= SLQ_SIGMAS * le[0]);
        assert_true(tu_h5_has_attr(m, "preconditioner") && tu_h5_has_attr(m, "slq_probes"));
        free(ls);
        free(lm);
        free(le);
    }
}

/* A kernel file from gpkernel-mpi: float64 through Cholesky as gpregress reads it, float32
 * through CG (the mean moves by the storage's rounding only). */
static void test_kernel_file(void **state)
{
    tu_env *e = *state;
    char args[4096], k64[512], k32[512], s[512], m[512], x[512], t[512], y[512], yt[512];
    classify_data(e, 230, 70);
    tu_path(e, x, sizeof x, "x.npy");
    tu_path(e, t, sizeof t, "t.npy");
    tu_path(e, k64, sizeof k64, "k64.h5");
    tu_path(e, k32, sizeof k32, "k32.h5");
    snprintf(args, sizeof args, "--arch=mlp --depth=3 --input='%s' --test='%s' --output='%s' "
             "--tile=50 --quiet", x, t, k64);
    assert_int_equal(mt_run_mpi(e, "gpkernel-mpi", args), 0);
    snprintf(args, sizeof args, "--arch=mlp --depth=3 --input='%s' --test='%s' --output='%s' "
             "--tile=50 --dtype=float32 --quiet", x, t, k32);
    assert_int_equal(mt_run_mpi(e, "gpkernel-mpi", args), 0);
    snprintf(args, sizeof args, "--kernel='%s' --labels='%s' --test-labels='%s' --classify "
             "--select-n=120", k64, tu_path(e, y, sizeof y, "y.npy"),
             tu_path(e, yt, sizeof yt, "yt.npy"));
    both(e, args, tu_path(e, s, sizeof s, "kf-s.h5"), tu_path(e, m, sizeof m, "kf-m.h5"),
         "--tile=64");
    double dm = rel_diff(s, m, "/mean"), dl = rel_diff(s, m, "/lml");
    print_message("kernel file, cholesky: mean %.2e, lml %.2e\n", dm, dl);
    assert_true(dm <= TOL_CHOL && dl <= TOL_CHOL);
    /* float32 storage, CG, at the noise the float64 run chose */
    size_t cnt;
    double *nz = tu_h5_read(m, "/noise", &cnt), *sc = tu_h5_read(m, "/scale", &cnt);
    char a[4096], m32[512];
    snprintf(a, sizeof a, "--kernel='%s' --labels='%s' --test-labels='%s' --classify "
             "--noise=%.17g --solver=cg --dtype=float32 --cg-tol=%g --no-var --output='%s' "
             "--quiet", k32, y, yt, nz[0] / sc[0], CG_TOL, tu_path(e, m32, sizeof m32,
                                                                     "kf-32.h5"));
    assert_int_equal(mt_run_mpi(e, "gpregress-mpi", a), 0);
    /* the scale: the float64 run's mean is s-free (the mean of s(K + rI) is that of K + rI) */
    double d32 = mt_max_abs_diff(m, m32, "/mean");
    print_message("kernel file, float32 storage with cg: mean %.2e from float64 cholesky\n", d32);
    assert_true(d32 <= TOL_F32);
    free(nz);
    free(sc);
    /* --kernel-type=ntk: the NTK-GP (the /ntk blocks of gpkernel --kernel=both's file) on
     * ScaLAPACK's Cholesky, as gpregress solves it; its mean is not the NNGP's */
    char kb[512], sn[512], mn[512];
    tu_path(e, kb, sizeof kb, "kboth.h5");
    snprintf(args, sizeof args, "--arch=mlp --depth=3 --input='%s' --test='%s' --kernel=both "
             "--output='%s' --quiet", x, t, kb);
    assert_int_equal(tu_run_tool(e, "gpkernel", args), 0);
    snprintf(args, sizeof args, "--kernel='%s' --labels='%s' --test-labels='%s' --classify "
             "--select-n=120 --kernel-type=ntk", kb, y, yt);
    both(e, args, tu_path(e, sn, sizeof sn, "ntk-s.h5"), tu_path(e, mn, sizeof mn, "ntk-m.h5"),
         "--tile=64");
    double dn = rel_diff(sn, mn, "/mean"), dln = rel_diff(sn, mn, "/lml");
    double dk = mt_max_abs_diff(mn, m, "/mean");
    print_message("kernel file, NTK-GP: mean %.2e, lml %.2e from gpregress; %.3g from the "
                  "NNGP's mean\n", dn, dln, dk);
    assert_true(dn <= TOL_CHOL && dln <= TOL_CHOL);
    assert_true(dk > 1e-3);
}

/* A depth range recomputes the kernel per depth: /depth_L/mean and the summary per depth. At a
 * given noise: with --noise=auto each depth's walk starts from the last one's shift, and the
 * subsample's Brent search stops within its tolerance wherever rounding takes it, so the noise
 * (and the mean with it) is the serial one's to ~1e-9 only (measured, erf depths 1-2 here:
 * noise 2e-9, mean 7e-9) — a property of the search, not of the solve. */
static void test_depth_range(void **state)
{
    tu_env *e = *state;
    char args[4096], s[512], m[512];
    classify_data(e, 230, 70);
    /* tanh by Gauss–Hermite of a degree of its own: the same rule as gpregress's */
    classify_args(e, args, sizeof args, "--depth=1-2 --phi=tanh --quad-degree=24 --noise=0.07 "
                  "--var-n=20");
    both(e, args, tu_path(e, s, sizeof s, "dr-s.h5"), tu_path(e, m, sizeof m, "dr-m.h5"),
         "--tile=48 --solver=cholesky");
    const char *ds[] = {"/depth_1/mean", "/depth_2/mean", "/depth_2/var", "/lml", "/rcond"};
    assert_close("depths 1-2", s, m, ds, sizeof ds / sizeof ds[0], TOL_CHOL);
    assert_true(mt_max_abs_diff(s, m, "/depths") == 0);
}

/* --progress off a terminal: rank 0's plain lines for the kernel tiles and each CG solve, each
 * stage ending in "done in"; the file is the one a run without the line writes. */
static void test_progress_line(void **state)
{
    tu_env *e = *state;
    char args[4096], run[4600], a[512], b[512];
    classify_data(e, 230, 70);
    classify_args(e, args, sizeof args, "--depth=2 --noise=0.05 --solver=cg --tile=64");
    setenv("TPK_PROGRESS_AFTER", "0", 1);
    setenv("TPK_PROGRESS_EVERY", "0", 1);
    snprintf(run, sizeof run, "%s --progress --output='%s'", args, tu_path(e, a, sizeof a, "pr.h5"));
    assert_int_equal(mt_run_mpi(e, "gpregress-mpi", run), 0);
    mt_assert_stderr_has(e, "gpregress-mpi: kernel tiles (rank 0's)");
    mt_assert_stderr_has(e, "CG residual (tenths of decades)");
    mt_assert_stderr_has(e, "done in");
    snprintf(run, sizeof run, "%s --no-progress --output='%s'", args, tu_path(e, b, sizeof b, "np.h5"));
    assert_int_equal(mt_run_mpi(e, "gpregress-mpi", run), 0);
    unsetenv("TPK_PROGRESS_AFTER");
    unsetenv("TPK_PROGRESS_EVERY");
    char err[8192];
    tu_stderr(e, err, sizeof err);
    assert_null(strstr(err, "CG residual"));
    assert_true(mt_max_abs_diff(a, b, "/mean") == 0);
}

/* RBF regression (two real targets, no classes) on a 2x1 grid, both solvers. */
static void test_rbf_regression(void **state)
{
    tu_env *e = *state;
    char args[4096], x[512], t[512], y[512], yt[512], s[512], m[512], g[512];
    const size_t shape[2] = {0, 5}, n = 150, mt = 40;
    mt_write_inputs(tu_path(e, x, sizeof x, "rx.npy"), n, shape, 2, 21);
    mt_write_inputs(tu_path(e, t, sizeof t, "rt.npy"), mt, shape, 2, 22);
    const size_t tshape[2] = {0, 2};
    mt_write_inputs(tu_path(e, y, sizeof y, "ry.npy"), n, tshape, 2, 23);
    mt_write_inputs(tu_path(e, yt, sizeof yt, "ryt.npy"), mt, tshape, 2, 24);
    snprintf(args, sizeof args, "--arch=rbf --lengthscale2=2.7 --train='%s' --test='%s' "
             "--labels='%s' --test-labels='%s' --select-n=60", x, t, y, yt);
    both(e, args, tu_path(e, s, sizeof s, "rbf-s.h5"), tu_path(e, m, sizeof m, "rbf-m.h5"),
         "--grid=2x1 --tile=32");
    double dm = rel_diff(s, m, "/mean"), dl = rel_diff(s, m, "/lml"), dr = rel_diff(s, m, "/rmse");
    print_message("rbf regression, 2x1 grid: mean %.2e, lml %.2e, rmse %.2e\n", dm, dl, dr);
    assert_true(dm <= TOL_CHOL && dl <= TOL_CHOL && dr <= TOL_CHOL);
    /* the CG path by memory: --memory too small for Cholesky's two copies picks it */
    char a[8192];
    size_t cnt;
    double *nz = tu_h5_read(m, "/noise", &cnt), *sc = tu_h5_read(m, "/scale", &cnt);
    /* a given noise: --select-n (of the noise search) would be refused as meaningless */
    snprintf(a, sizeof a, "%s --noise=%.17g --memory=100K --cg-tol=%g --output='%s' --quiet",
             args, nz[0] / sc[0], CG_TOL, tu_path(e, g, sizeof g, "rbf-cg.h5"));
    char *sel = strstr(a, " --select-n=60");
    assert_non_null(sel);
    memmove(sel, sel + 14, strlen(sel + 14) + 1);
    assert_int_equal(mt_run_mpi(e, "gpregress-mpi", a), 0);
    assert_true(tu_h5_has_attr(g, "cg_tol"));
    double dc = mt_max_abs_diff(m, g, "/mean");
    print_message("rbf regression, cg by memory: mean %.2e from cholesky\n", dc);
    /* the same bound as above with max|k| = amplitude 1, ‖y‖ ≤ √N·max|y| (1.2) */
    assert_true(dc <= (double)n * 1.2 * CG_TOL / (nz[0] / sc[0]) + TOL_CHOL);
    free(nz);
    free(sc);
}

/* No file of the output's name is in the directory (the atomic writer's temporary either). */
static void assert_no_output(const tu_env *e, const char *name)
{
    DIR *d = opendir(e->tmpdir);
    assert_non_null(d);
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
        if (strncmp(de->d_name, name, strlen(name)) == 0)
            fail_msg("%s left behind", de->d_name);
    closedir(d);
}

static void test_errors(void **state)
{
    tu_env *e = *state;
    char args[8192], base[4096], k[512], y[512], out[512];
    classify_data(e, 230, 70);
    classify_args(e, base, sizeof base, "");
    tu_path(e, out, sizeof out, "bad.h5");
    struct { const char *extra; int rc; const char *msg; } usage[] = {
        {"--solver=lu", 2, "--solver"},
        {"--solver=cholesky --dtype=float32", 2, "float32"},
        {"--fit-hyper", 2, "--fit-hyper"},
        {"--full-cov", 2, "--full-cov"},
        {"--noise=0", 2, "--noise=0"},
        {"--grid=3x1", 2, "--grid=3x1"},
        {"--slq-probes=1", 2, "--slq-probes"},
        {"--kernel-type=ntk", 2, "--kernel=FILE"},
        {"--predict=gd --times=1", 2, "--predict=gd"},
        {"--n-train=500", 1, "fewer than"},
    };
    for (size_t i = 0; i < sizeof usage / sizeof usage[0]; i++) {
        snprintf(args, sizeof args, "%s %s --output='%s'", base, usage[i].extra, out);
        assert_int_equal(mt_run_mpi(e, "gpregress-mpi", args), usage[i].rc);
        mt_assert_stderr_has(e, usage[i].msg);
        assert_no_output(e, "bad.h5");
    }
    /* a kernel file that is no covariance (indefinite), one with a non-finite entry */
    const size_t n = 40;
    double *K = malloc(n * n * sizeof *K), *lab = malloc(n * sizeof *lab);
    assert_non_null(K);
    assert_non_null(lab);
    for (size_t i = 0; i < n; i++) {
        lab[i] = 0.37 * (double)(i % 5) - 0.6;
        for (size_t j = 0; j < n; j++)
            K[i * n + j] = i == j ? 1.0 : 0.9 * cos(0.3 * (double)(i + j)); /* indefinite */
    }
    tu_h5_write(tu_path(e, k, sizeof k, "indef.h5"), "/kernel", K, n, n);
    size_t d1[1] = {n};
    tu_write_npy(tu_path(e, y, sizeof y, "ky.npy"), lab, 1, d1);
    snprintf(args, sizeof args, "--kernel='%s' --labels='%s' --noise=0.01 --solver=cholesky "
             "--tile=16 --output='%s'", k, y, out);
    assert_int_equal(mt_run_mpi(e, "gpregress-mpi", args), 1);
    mt_assert_stderr_has(e, "not positive semidefinite");
    assert_no_output(e, "bad.h5");
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            K[i * n + j] = exp(-0.1 * fabs((double)i - (double)j));
    K[33 * n + 21] = NAN;
    tu_h5_write(tu_path(e, k, sizeof k, "nan.h5"), "/kernel", K, n, n);
    snprintf(args, sizeof args, "--kernel='%s' --labels='%s' --noise=0.01 --tile=16 "
             "--output='%s'", k, y, out);
    assert_int_equal(mt_run_mpi(e, "gpregress-mpi", args), 1);
    mt_assert_stderr_has(e, "non-finite kernel entry");
    mt_assert_stderr_has(e, "[33, 21]");
    assert_no_output(e, "bad.h5");
    free(K);
    free(lab);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cholesky_matches_gpregress),
        cmocka_unit_test(test_cg_mean_and_slq_lml),
        cmocka_unit_test(test_kernel_file),
        cmocka_unit_test(test_depth_range),
        cmocka_unit_test(test_progress_line),
        cmocka_unit_test(test_rbf_regression),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests_name("gpregress-mpi", tests, setup, tu_teardown);
}
