/* Pooled CNN readouts without the (P×P) block (theory.md §2.8, issue 37): GAP by shifts against
 * the block recursion (cnn1d, cnn2d; depths, filters, relu and erf, several channels, zero-variance
 * positions); LAP by shifts against two oracles written here from the definition (a naive
 * (N·P)² recursion averaged over the window's position pairs, and the mean of flatten kernels of
 * explicitly shifted images), LAP's limits (window 0 = flatten, a covering window = GAP), the
 * errors, gpkernel --readout=lap --window=c, and the float32 flatten path against float64. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "tpk/cnn.h"
#include "tpk/job.h"
#include "tpk/tpk.h"
#include "support/testutil.h"

/* Shifts against the block recursion: the same 2-D expectations on the same covariances, whose
 * tap sums and readout sums run in another order (L layers of O(1) values, ≤ P² terms summed):
 * rounding, 1e-12 relative (issue 37's acceptance). */
#define TOL_POOL 1e-12
/* LAP against the oracles: the oracles sum the same terms in yet another order (the naive
 * recursion sums every tap in 4-D), so rounding again. */
#define TOL_LAP 1e-12

static const double su2 = 1.3, sw2 = 1.9, sb2 = 0.17, sv2 = 0.8, sob2 = 0.07;
static char tmpdir[256], bindir[1024];
static tpk_phi_registry *reg;
static tpk_phi *relu, *erfp;

static int setup(void **state)
{
    if (tu_setup_tagged(state, "cnnpool"))
        return -1;
    const tu_env *e = *state;
    snprintf(tmpdir, sizeof tmpdir, "%s", e->tmpdir);
    snprintf(bindir, sizeof bindir, "%s", e->bindir);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    reg = tpk_job_registry(&ctx);
    relu = reg ? tpk_phi_alloc(reg, "relu", &ctx) : NULL;
    erfp = reg ? tpk_phi_alloc(reg, "erf", &ctx) : NULL;
    return relu && erfp ? 0 : -1;
}

static int teardown(void **state)
{
    tpk_phi_free(relu);
    tpk_phi_free(erfp);
    tpk_phi_registry_free(reg);
    return tu_teardown(state);
}

/* Deterministic "high-entropy" inputs x[a][position][channel]; border rows/columns zeroed on
 * request (zero-variance positions when σ_b² = 0). */
static void inputs(double *x, size_t N, size_t R, size_t S, size_t C, double salt, int border)
{
    for (size_t a = 0; a < N; a++)
        for (size_t p = 0; p < R * S; p++)
            for (size_t c = 0; c < C; c++) {
                const size_t r = p / S, s = p % S;
                /* a band three wide: the middle of it sees only zeros through a 3-tap filter */
                const int off = border && ((R > 1 && r < 3) || s < 3);
                x[(a * R * S + p) * C + c] =
                    off ? 0.0
                        : sin(1.37 * (double)a + 0.61 * (double)p * (double)p / 7.0 +
                              2.11 * (double)c + salt) * (1.0 + 0.2 * (double)a);
            }
}

static tpk_cnn_params params(size_t R, size_t S, size_t C, int kh, int kw, int L,
                             const tpk_phi *phi, int readout, int window, int pool)
{
    return (tpk_cnn_params){.rows = R, .cols = S, .channels = C, .kh = kh, .kw = kw, .depth = L,
                            .phi = phi, .sigma_u2 = su2, .sigma_w2 = sw2, .sigma_b2 = sb2,
                            .sigma_v2 = sv2, .sigma_ob2 = sob2, .padding = TPK_CNN_CIRCULAR,
                            .readout = readout, .conv = TPK_CNN_CONV_DIRECT, .window = window,
                            .pool = pool};
}

/* K (N×N, or (N·P)² for POSITIONS) of x (N×P×C); *err the reported bound. */
static double *kernel(const tpk_cnn_params *p, const double *x, size_t N, double *err)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    size_t Q = p->rows * p->cols, dims[3] = {N, Q, p->channels};
    tpk_array *X = tpk_array_alloc(3, dims, &ctx);
    memcpy(X->data, x, N * Q * p->channels * sizeof(double));
    size_t side = p->readout == TPK_CNN_POSITIONS ? N * Q : N;
    tpk_array *K = tpk_array_alloc2(side, side, &ctx);
    double e = -1;
    if (tpk_cnn_kernel(p, X, NULL, K, &e, &ctx))
        fail_msg("%s", ctx.msg);
    assert_true(e >= 0);
    if (err)
        *err = e;
    double *out = malloc(side * side * sizeof *out);
    memcpy(out, K->data, side * side * sizeof *out);
    tpk_array_free(X);
    tpk_array_free(K);
    return out;
}

static double max_rel(const double *a, const double *b, size_t n)
{
    double scale = 0, worst = 0;
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(b[i]));
    for (size_t i = 0; i < n; i++)
        worst = fmax(worst, fabs(a[i] - b[i]));
    return worst / scale;
}

/* ---- GAP: shifts = block ------------------------------------------------------------------ */

static double gap_case(size_t R, size_t S, size_t C, int kh, int kw, int L, const tpk_phi *phi,
                       int border)
{
    enum { N = 4 };
    double *x = malloc(N * R * S * C * sizeof *x);
    inputs(x, N, R, S, C, 0.3 * (double)L + (double)kw, border);
    tpk_cnn_params ps = params(R, S, C, kh, kw, L, phi, TPK_CNN_GAP, 0, TPK_CNN_POOL_SHIFTS);
    tpk_cnn_params pb = ps;
    pb.pool = TPK_CNN_POOL_BLOCK;
    if (border)
        ps.sigma_b2 = pb.sigma_b2 = 0; /* zero-variance positions stay zero at the first layer */
    double es, eb;
    double *Ks = kernel(&ps, x, N, &es), *Kb = kernel(&pb, x, N, &eb);
    double e = max_rel(Ks, Kb, N * N);
    print_message("GAP %zux%zu C=%zu filter %dx%d L=%d %s%s: shifts vs block %.2e (bounds %.1e, "
                  "%.1e)\n", R, S, C, kh, kw, L, tpk_phi_name(phi), border ? ", zero borders" : "",
                  e, es, eb);
    assert_true(e <= TOL_POOL);
    /* symmetric, with the diagonal the largest in its row (a PSD kernel's Cauchy–Schwarz) */
    for (size_t a = 0; a < N; a++)
        for (size_t c = 0; c < N; c++) {
            assert_true(Ks[a * N + c] == Ks[c * N + a]);
            assert_true(fabs(Ks[a * N + c] - sob2) <=
                        sqrt((Ks[a * N + a] - sob2) * (Ks[c * N + c] - sob2)) * (1 + 1e-12));
        }
    free(Ks);
    free(Kb);
    free(x);
    return e;
}

static void test_gap_shifts_1d(void **state)
{
    (void)state;
    double worst = 0;
    worst = fmax(worst, gap_case(1, 7, 1, 1, 3, 1, relu, 0));
    worst = fmax(worst, gap_case(1, 7, 3, 1, 3, 3, relu, 0));
    worst = fmax(worst, gap_case(1, 9, 2, 1, 2, 4, erfp, 0)); /* even filter: centre offset 0 */
    worst = fmax(worst, gap_case(1, 8, 3, 1, 5, 2, erfp, 0));
    worst = fmax(worst, gap_case(1, 11, 2, 1, 3, 3, relu, 1));
    print_message("cnn1d GAP: worst shifts vs block %.2e\n", worst);
}

static void test_gap_shifts_2d(void **state)
{
    (void)state;
    double worst = 0;
    worst = fmax(worst, gap_case(5, 6, 1, 3, 3, 1, relu, 0));
    worst = fmax(worst, gap_case(5, 6, 3, 3, 3, 3, relu, 0));
    worst = fmax(worst, gap_case(6, 5, 2, 2, 3, 4, erfp, 0));
    worst = fmax(worst, gap_case(4, 7, 3, 3, 2, 2, erfp, 0));
    worst = fmax(worst, gap_case(7, 7, 2, 3, 3, 3, relu, 1));
    worst = fmax(worst, gap_case(7, 6, 1, 1, 1, 2, relu, 0)); /* 1×1 filter: no taps to sum */
    print_message("cnn2d GAP: worst shifts vs block %.2e\n", worst);
}

/* A grid large enough for several blocks of shifts per pair (SHIFT_BLOCK_DOUBLES / P column
 * shifts per block on 1-D: 32768 / 300 = 109 of 300). */
static void test_gap_shifts_blocks(void **state)
{
    (void)state;
    gap_case(1, 300, 1, 1, 3, 2, relu, 0);
    gap_case(20, 20, 1, 3, 3, 2, relu, 0); /* 81 column shifts per block: 20 per row, 4 rows */
}

/* ---- LAP ---------------------------------------------------------------------------------- */

/* Circular distance on an axis of length n. */
static long cdist(long i, long j, long n)
{
    long d = ((j - i) % n + n) % n;
    return d < n - d ? d : n - d;
}

/* Distinct shifts within c on an axis of length n. */
static long wcount(long c, long n)
{
    return 2 * c + 1 < n ? 2 * c + 1 : n;
}

/* Oracle 1: a positions kernel ((N·P)², σ_v² K^L + σ_ob²) averaged over the position pairs within
 * the window, from the definition (1/(P|W|)) Σ_p Σ_{p' : |p' − p|_axis ≤ c} K^L_{(p,a),(p',c)}. */
static void lap_of_positions(const double *Kp, size_t N, size_t R, size_t S, long c, double *K)
{
    const size_t Q = R * S, M = N * Q;
    const double W = (double)(wcount(c, (long)R) * wcount(c, (long)S));
    for (size_t a = 0; a < N; a++)
        for (size_t b = 0; b < N; b++) {
            double s = 0;
            for (size_t p = 0; p < Q; p++)
                for (size_t q = 0; q < Q; q++)
                    if (cdist((long)(p / S), (long)(q / S), (long)R) <= c &&
                        cdist((long)(p % S), (long)(q % S), (long)S) <= c)
                        s += Kp[(a * Q + p) * M + b * Q + q];
            K[a * N + b] = s / ((double)Q * W);
        }
}

/* A naive (N·P)² ReLU recursion, every tap summed in 4-D (the convention of tpk_cnn_params,
 * circular padding), σ_v² K^L + σ_ob²: independent of kernels/cnn.c. */
static double relu_e2(double q1, double q2, double k)
{
    double s = sqrt(q1 * q2);
    if (s == 0)
        return 0;
    double rho = fmax(-1.0, fmin(1.0, k / s)), th = acos(rho);
    return s / (2 * M_PI) * (sin(th) + (M_PI - th) * cos(th));
}

static double *naive_positions(const double *x, size_t N, size_t R, size_t S, size_t C, int kh,
                               int kw, int L)
{
    const long Q = (long)(R * S), M = (long)N * Q;
    double *G = calloc((size_t)(M * M), sizeof *G), *Sg = malloc((size_t)(M * M) * sizeof *Sg);
    for (long i = 0; i < M; i++)
        for (long j = 0; j < M; j++) {
            double g = 0;
            for (size_t c = 0; c < C; c++)
                g += x[(size_t)i * C + c] * x[(size_t)j * C + c];
            G[i * M + j] = g / (double)C;
        }
    const double taps = (double)kh * kw;
    for (int l = 0; l <= L; l++) {
        if (l > 0)
            for (long i = 0; i < M; i++)
                for (long j = 0; j < M; j++)
                    G[i * M + j] = relu_e2(Sg[i * M + i], Sg[j * M + j], Sg[i * M + j]);
        if (l == L)
            break;
        const double alpha = (l == 0 ? su2 : sw2) / taps;
        for (long a = 0; a < (long)N; a++)
            for (long b = 0; b < (long)N; b++)
                for (long p = 0; p < Q; p++)
                    for (long q = 0; q < Q; q++) {
                        double acc = 0;
                        for (int i = 0; i < kh; i++)
                            for (int j = 0; j < kw; j++) {
                                long di = i - (kh - 1) / 2, dj = j - (kw - 1) / 2;
                                long pr = ((p / (long)S + di) % (long)R + (long)R) % (long)R;
                                long ps = ((p % (long)S + dj) % (long)S + (long)S) % (long)S;
                                long qr = ((q / (long)S + di) % (long)R + (long)R) % (long)R;
                                long qs = ((q % (long)S + dj) % (long)S + (long)S) % (long)S;
                                acc += G[(a * Q + pr * (long)S + ps) * M + b * Q + qr * (long)S + qs];
                            }
                        Sg[(a * Q + p) * M + b * Q + q] = alpha * acc + sb2;
                    }
    }
    for (long i = 0; i < M * M; i++)
        G[i] = sv2 * G[i] + sob2;
    free(Sg);
    return G;
}

/* Oracle 2: the mean over the window's shifts u of the flatten kernel of (x_a, x_b shifted so
 * that position p reads x_b[p + u]), each computed by the flatten path (kernels/cnn.c's closed
 * position-diagonal recursion over the stacked inputs), then (a, b) read out of it. */
static void lap_by_flatten(const tpk_cnn_params *lp, const double *x, size_t N, double *K)
{
    const size_t R = lp->rows, S = lp->cols, C = lp->channels, Q = R * S;
    const long c = lp->window, nr = wcount(c, (long)R), ns = wcount(c, (long)S);
    const long r0 = nr == (long)R ? 0 : -c, s0 = ns == (long)S ? 0 : -c;
    tpk_cnn_params fp = *lp;
    fp.readout = TPK_CNN_FLATTEN;
    fp.pool = TPK_CNN_POOL_AUTO;
    double *xs = malloc(2 * N * Q * C * sizeof *xs);
    memset(K, 0, N * N * sizeof *K);
    for (long dr = r0; dr < r0 + nr; dr++)
        for (long ds = s0; ds < s0 + ns; ds++) {
            memcpy(xs, x, N * Q * C * sizeof *xs);
            for (size_t b = 0; b < N; b++)
                for (size_t r = 0; r < R; r++)
                    for (size_t s = 0; s < S; s++) {
                        size_t rr = (size_t)((((long)r + dr) % (long)R + (long)R) % (long)R);
                        size_t ss = (size_t)((((long)s + ds) % (long)S + (long)S) % (long)S);
                        memcpy(xs + ((N + b) * Q + r * S + s) * C, x + (b * Q + rr * S + ss) * C,
                               C * sizeof *xs);
                    }
            double *Kf = kernel(&fp, xs, 2 * N, NULL);
            for (size_t a = 0; a < N; a++)
                for (size_t b = 0; b < N; b++)
                    K[a * N + b] += Kf[a * 2 * N + N + b];
            free(Kf);
        }
    for (size_t i = 0; i < N * N; i++)
        K[i] /= (double)(nr * ns);
    free(xs);
}

static void lap_case(size_t R, size_t S, size_t C, int kh, int kw, int L, const tpk_phi *phi,
                     int c, int naive)
{
    enum { N = 3 };
    const size_t Q = R * S;
    double *x = malloc(N * Q * C * sizeof *x);
    inputs(x, N, R, S, C, 0.9 + c, 0);
    tpk_cnn_params ps = params(R, S, C, kh, kw, L, phi, TPK_CNN_LAP, c, TPK_CNN_POOL_SHIFTS);
    tpk_cnn_params pb = ps;
    pb.pool = TPK_CNN_POOL_BLOCK;
    double *Ks = kernel(&ps, x, N, NULL), *Kb = kernel(&pb, x, N, NULL);
    double Kf[N * N], Kw[N * N];
    lap_by_flatten(&ps, x, N, Kf);
    tpk_cnn_params pp = ps;
    pp.readout = TPK_CNN_POSITIONS;
    pp.pool = TPK_CNN_POOL_AUTO;
    double *Kp = naive ? naive_positions(x, N, R, S, C, kh, kw, L) : kernel(&pp, x, N, NULL);
    lap_of_positions(Kp, N, R, S, c, Kw);
    const double eb = max_rel(Ks, Kb, N * N), ef = max_rel(Ks, Kf, N * N),
                 ew = max_rel(Ks, Kw, N * N);
    print_message("LAP c=%d %zux%zu C=%zu filter %dx%d L=%d %s: shifts vs block %.2e, vs shifted "
                  "flatten kernels %.2e, vs %s positions kernel %.2e\n", c, R, S, C, kh, kw, L,
                  tpk_phi_name(phi), eb, ef, naive ? "naive" : "the recursion's", ew);
    assert_true(eb <= TOL_LAP && ef <= TOL_LAP && ew <= TOL_LAP);
    free(Kp);
    free(Ks);
    free(Kb);
    free(x);
}

static void test_lap_oracles(void **state)
{
    (void)state;
    lap_case(1, 9, 2, 1, 3, 2, relu, 1, 1);  /* cnn1d, naive oracle */
    lap_case(1, 10, 1, 1, 4, 3, erfp, 2, 0); /* even filter */
    lap_case(5, 6, 2, 3, 3, 2, relu, 1, 1);  /* cnn2d, naive oracle */
    lap_case(6, 7, 3, 3, 2, 3, erfp, 2, 0);
    lap_case(7, 5, 1, 3, 3, 2, relu, 2, 0);  /* covers the 5 columns (2c + 1 = 5), not the rows */
    lap_case(4, 9, 2, 2, 2, 1, erfp, 1, 0);
}

/* Window 0 is the flatten kernel; a window covering the grid is GAP (both by shifts and by the
 * block); windows past the grid add nothing (each shift once). */
static void test_lap_limits(void **state)
{
    (void)state;
    enum { N = 3, R = 5, S = 6, C = 2 };
    double x[N * R * S * C];
    inputs(x, N, R, S, C, 0.4, 0);
    for (int ph = 0; ph < 2; ph++) {
        const tpk_phi *phi = ph ? erfp : relu;
        tpk_cnn_params p0 = params(R, S, C, 3, 3, 3, phi, TPK_CNN_LAP, 0, TPK_CNN_POOL_SHIFTS);
        tpk_cnn_params pf = params(R, S, C, 3, 3, 3, phi, TPK_CNN_FLATTEN, 0, TPK_CNN_POOL_AUTO);
        tpk_cnn_params pg = params(R, S, C, 3, 3, 3, phi, TPK_CNN_GAP, 0, TPK_CNN_POOL_BLOCK);
        double *K0 = kernel(&p0, x, N, NULL), *Kf = kernel(&pf, x, N, NULL),
               *Kg = kernel(&pg, x, N, NULL);
        double e0 = max_rel(K0, Kf, N * N), eg = 0;
        for (int c = 3; c <= 7; c += 4) /* 2c + 1 = 7 ≥ 6: covers; c = 7 wraps past it */
            for (int pool = TPK_CNN_POOL_SHIFTS; pool <= TPK_CNN_POOL_BLOCK; pool++) {
                tpk_cnn_params pl = params(R, S, C, 3, 3, 3, phi, TPK_CNN_LAP, c, pool);
                double *Kl = kernel(&pl, x, N, NULL);
                eg = fmax(eg, max_rel(Kl, Kg, N * N));
                free(Kl);
            }
        print_message("%s: LAP c=0 vs flatten %.2e; covering LAP vs GAP %.2e\n", tpk_phi_name(phi),
                      e0, eg);
        assert_true(e0 <= TOL_POOL && eg <= TOL_POOL);
        free(K0);
        free(Kf);
        free(Kg);
    }
}

/* The cost estimate: LAP with a small window by shifts ((2c+1)²/P of GAP's expectations); zero
 * padding and the other readouts never. Its choice between the two GAP paths, whose op counts
 * differ only by overheads, is printed, not tested: both give the same kernel (above). */
static void test_pool_choice(void **state)
{
    (void)state;
    tpk_cnn_params p = params(28, 28, 1, 3, 3, 8, relu, TPK_CNN_LAP, 2, TPK_CNN_POOL_AUTO);
    assert_true(tpk_cnn_pool_prefers_shifts(&p));
    p.padding = TPK_CNN_ZERO;
    assert_false(tpk_cnn_pool_prefers_shifts(&p));
    p = params(1, 256, 1, 1, 3, 4, relu, TPK_CNN_LAP, 3, TPK_CNN_POOL_AUTO);
    assert_true(tpk_cnn_pool_prefers_shifts(&p));
    p.readout = TPK_CNN_FLATTEN;
    assert_false(tpk_cnn_pool_prefers_shifts(&p));
    p.readout = TPK_CNN_POSITIONS;
    assert_false(tpk_cnn_pool_prefers_shifts(&p));
    assert_false(tpk_cnn_pool_prefers_shifts(NULL));
    static const size_t grid[3][2] = {{28, 28}, {32, 32}, {1, 256}};
    for (int i = 0; i < 3; i++) {
        p = params(grid[i][0], grid[i][1], 1, grid[i][0] > 1 ? 3 : 1, 3, 8, relu, TPK_CNN_GAP, 0,
                   TPK_CNN_POOL_AUTO);
        print_message("%zux%zu depth 8 GAP: AUTO pools by %s\n", grid[i][0], grid[i][1],
                      tpk_cnn_pool_prefers_shifts(&p) ? "shifts" : "the block");
    }
}

/* Every error of the new settings, with its message. */
static void test_pool_errors(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    size_t dims[3] = {2, 6, 1};
    tpk_array *X = tpk_array_alloc(3, dims, &ctx), *K = tpk_array_alloc2(2, 2, &ctx);
    for (size_t i = 0; i < 12; i++)
        X->data[i] = sin(0.7 * (double)i + 0.2);
    tpk_cnn_params good = params(1, 6, 1, 1, 3, 2, relu, TPK_CNN_LAP, 1, TPK_CNN_POOL_AUTO), p;
    assert_int_equal(tpk_cnn_kernel(&good, X, NULL, K, NULL, &ctx), TPK_OK);
    static const struct { int what; const char *msg; } bad[] = {
        {0, "needs circular padding"},       /* LAP, zero padding */
        {1, "shift reach c >= 0"},           /* window < 0 */
        {2, "pooling by shifts needs"},      /* shifts, zero padding */
        {3, "pooling by shifts needs"},      /* shifts, flatten */
        {4, "flatten readout only"},         /* f32, LAP */
        {5, "unknown pooling method"},
        {6, "unknown compute precision"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p = good;
        switch (bad[i].what) {
        case 0: p.padding = TPK_CNN_ZERO; break;
        case 1: p.window = -1; break;
        case 2: p.readout = TPK_CNN_GAP; p.pool = TPK_CNN_POOL_SHIFTS; p.padding = TPK_CNN_ZERO; break;
        case 3: p.readout = TPK_CNN_FLATTEN; p.pool = TPK_CNN_POOL_SHIFTS; break;
        case 4: p.compute = TPK_CNN_F32; break;
        case 5: p.pool = 7; break;
        default: p.compute = 5; break;
        }
        tpk_ctx_init(&ctx);
        assert_int_equal(tpk_cnn_kernel(&p, X, NULL, K, NULL, &ctx), TPK_EINVAL);
        if (!strstr(ctx.msg, bad[i].msg))
            fail_msg("case %zu: expected '%s' in: %s", i, bad[i].msg, ctx.msg);
    }
    tpk_array_free(X);
    tpk_array_free(K);
}

/* ---- gpkernel --readout=lap --window=c ----------------------------------------------------- */

static void test_gpkernel_lap(void **state)
{
    (void)state;
    enum { N = 3, P = 7, C = 2 };
    double x[N * P * C];
    inputs(x, N, 1, P, C, 1.1, 0);
    char in[512], out[512], cmd[4096];
    snprintf(in, sizeof in, "%s/sig.npy", tmpdir);
    const size_t dims[3] = {N, P, C};
    tu_write_npy(in, x, 3, dims);
    static const char flags[] = "--depth=2 --filter=3 --sigma-u2=1.3 --sigma-w2=1.9 "
                                "--sigma-b2=0.17 --sigma-v2=0.8 --set sigma_ob2=0.07";
    for (int c = 0; c <= 3; c += 1) {
        snprintf(out, sizeof out, "%s/k-lap%d.h5", tmpdir, c);
        snprintf(cmd, sizeof cmd, "'%s/gpkernel' --arch=cnn1d --readout=lap --window=%d %s "
                 "--input='%s' --output='%s' --quiet", bindir, c, flags, in, out);
        int rc = system(cmd);
        assert_true(WIFEXITED(rc) && WEXITSTATUS(rc) == 0);
        size_t cnt;
        double *K = tu_h5_read(out, "/kernel", &cnt);
        assert_int_equal(cnt, N * N);
        tpk_cnn_params lp = params(1, P, C, 1, 3, 2, relu, TPK_CNN_LAP, c, TPK_CNN_POOL_AUTO);
        double Kf[N * N];
        lap_by_flatten(&lp, x, N, Kf); /* the oracle, not the library's LAP */
        double e = max_rel(K, Kf, N * N);
        print_message("gpkernel --arch=cnn1d --readout=lap --window=%d vs shifted flatten kernels "
                      "%.2e\n", c, e);
        assert_true(e <= TOL_LAP);
        free(K);
    }
    /* refused, saying why */
    static const struct { const char *args, *msg; } bad[] = {
        {"--readout=lap --window=1 --padding=zero", "needs circular padding"},
        {"--readout=lap", "needs --window"},
        {"--readout=gap --window=1", "--window is the reach of --readout=lap"},
        {"--readout=gap --compute=f32", "flatten readout only"},
        {"--readout=flatten --compute=f16", "--compute must be f64 or f32"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char log[600];
        snprintf(log, sizeof log, "%s/err.txt", tmpdir);
        snprintf(out, sizeof out, "%s/k-bad.h5", tmpdir);
        snprintf(cmd, sizeof cmd, "'%s/gpkernel' --arch=cnn1d %s --input='%s' --output='%s' "
                 "--quiet 2>'%s'", bindir, bad[i].args, in, out, log);
        int rc = system(cmd);
        assert_true(WIFEXITED(rc) && WEXITSTATUS(rc) != 0);
        FILE *f = fopen(log, "r");
        char msg[2048] = {0};
        assert_non_null(f);
        size_t got = fread(msg, 1, sizeof msg - 1, f);
        (void)got;
        fclose(f);
        if (!strstr(msg, bad[i].msg))
            fail_msg("gpkernel %s: expected '%s' in: %s", bad[i].args, bad[i].msg, msg);
    }
}

/* ---- float32 flatten against float64 ------------------------------------------------------- */

/* The float path's error (theory.md §2.8): per layer, the covariances carry kh + kw + 4 float
 * roundings relative to √(q_a q_c) (storage, the tap sums' adds, the scales), which the map
 * passes on with its slope in ρ, at most F32_SLOPE times its scale (ReLU: (1/4 + 1/2)/0.66 =
 * 1.14; erf: (2/π)/√(1 − ρ'²) relative to its bound 1, ≤ 1.5 for variances ≤ 2), plus its own
 * ~F32_MAP_ULPS roundings; the relative errors add over layers (the maps' slopes are ≤ 1 in the
 * normalised correlation). The readout sums in double. So the relative error is at most
 * L·(F32_SLOPE·(kh + kw + 4) + F32_MAP_ULPS)·2^−24. */
#define F32_SLOPE 1.5
#define F32_MAP_ULPS 16.0

static void f32_case(size_t N, size_t R, size_t S, size_t C, int kh, int kw, int L,
                     const tpk_phi *phi)
{
    double *x = malloc(N * R * S * C * sizeof *x);
    inputs(x, N, R, S, C, 0.2 * (double)L, 0);
    tpk_cnn_params p64 = params(R, S, C, kh, kw, L, phi, TPK_CNN_FLATTEN, 0, TPK_CNN_POOL_AUTO);
    tpk_cnn_params p32 = p64;
    p32.compute = TPK_CNN_F32;
    double e64, e32;
    double *K64 = kernel(&p64, x, N, &e64), *K32 = kernel(&p32, x, N, &e32);
    double scale = 0, diff = 0;
    for (size_t i = 0; i < N * N; i++) {
        scale = fmax(scale, fabs(K64[i]));
        diff = fmax(diff, fabs(K32[i] - K64[i]));
    }
    const double tol = L * (F32_SLOPE * (kh + kw + 4) + F32_MAP_ULPS) * (FLT_EPSILON / 2);
    print_message("f32 flatten N=%zu %zux%zu C=%zu filter %dx%d L=%d %s: max |K32 - K64| / max |K64| = "
                  "%.2e (analysis %.1e; the library's bound %.1e relative)\n", N, R, S, C, kh, kw, L,
                  tpk_phi_name(phi), diff / scale, tol, e32 / scale);
    assert_true(diff / scale <= tol);
    assert_true(diff <= e32); /* the library's own bound holds */
    for (size_t a = 0; a < N; a++) /* the diagonal comes from the double diagonal recursion */
        assert_true(fabs(K32[a * N + a] - K64[a * N + a]) <= 1e-12 * scale);
    free(K64);
    free(K32);
    free(x);
}

static void test_f32_flatten(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_phi *leaky = tpk_phi_alloc(reg, "leaky_relu(0.1)", &ctx), *gelu = tpk_phi_alloc(reg, "gelu", &ctx);
    assert_non_null(leaky);
    assert_non_null(gelu);
    f32_case(6, 1, 12, 3, 1, 3, 3, relu);
    f32_case(6, 6, 7, 2, 3, 3, 1, relu);
    f32_case(6, 6, 7, 2, 3, 3, 8, relu);
    f32_case(6, 6, 7, 1, 3, 3, 8, erfp);
    f32_case(6, 5, 6, 3, 2, 3, 4, leaky);
    f32_case(6, 5, 6, 2, 3, 3, 3, gelu); /* no float map: mapped in double from the float values */
    f32_case(140, 1, 5, 2, 1, 3, 3, relu); /* 140² entries a position: the threaded map */
    tpk_phi_free(leaky);
    tpk_phi_free(gelu);
}

/* Cross blocks (tpk_cnn_kernels_cross, a distributed kernel's tiles): the entries of the kernel
 * of the column items then the row items, the very numbers, and the rows' own entries; for every
 * readout's path (flatten in double and float, GAP by shifts and by blocks, LAP; zero padding and
 * zero-variance borders), NNGP and NTK. */
static void test_cross_blocks(void **state)
{
    (void)state;
    enum { NC = 5, NR = 3, N = NC + NR, R = 5, S = 6, C = 2 };
    double x[N * R * S * C];
    inputs(x, N, R, S, C, 0.7, 1);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    size_t dc[3] = {NC, R * S, C}, dr[3] = {NR, R * S, C}, da[3] = {N, R * S, C};
    tpk_array *Xc = tpk_array_alloc(3, dc, &ctx), *Xr = tpk_array_alloc(3, dr, &ctx),
              *X = tpk_array_alloc(3, da, &ctx);
    memcpy(X->data, x, sizeof x);
    memcpy(Xc->data, x, NC * R * S * C * sizeof(double));
    memcpy(Xr->data, x + NC * R * S * C, NR * R * S * C * sizeof(double));
    tpk_array *K = tpk_array_alloc2(N, N, &ctx), *T = tpk_array_alloc2(N, N, &ctx),
              *Kx = tpk_array_alloc2(NR, NC, &ctx), *Tx = tpk_array_alloc2(NR, NC, &ctx);
    static const struct { int readout, window, pool, f32, zero; } cases[] = {
        {TPK_CNN_FLATTEN, 0, TPK_CNN_POOL_AUTO, 0, 0}, {TPK_CNN_FLATTEN, 0, TPK_CNN_POOL_AUTO, 0, 1},
        {TPK_CNN_FLATTEN, 0, TPK_CNN_POOL_AUTO, 1, 0}, {TPK_CNN_GAP, 0, TPK_CNN_POOL_SHIFTS, 0, 0},
        {TPK_CNN_GAP, 0, TPK_CNN_POOL_BLOCK, 0, 1},    {TPK_CNN_LAP, 2, TPK_CNN_POOL_SHIFTS, 0, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int ph = 0; ph < 2; ph++) {
            tpk_cnn_params p = params(R, S, C, 3, 3, 3, ph ? erfp : relu, cases[i].readout,
                                      cases[i].window, cases[i].pool);
            p.compute = cases[i].f32 ? TPK_CNN_F32 : TPK_CNN_F64;
            p.padding = cases[i].zero ? TPK_CNN_ZERO : TPK_CNN_CIRCULAR;
            const int ntk = !cases[i].f32;
            double kd[NR], td[NR], e1 = -1, e2 = -1;
            if (tpk_cnn_kernels(&p, X, NULL, K, ntk ? T : NULL, &e1, &ctx) ||
                tpk_cnn_kernels_cross(&p, Xr, Xc, NULL, Kx, ntk ? Tx : NULL, kd, td, &e2, &ctx))
                fail_msg("case %zu: %s", i, ctx.msg);
            for (size_t a = 0; a < NR; a++) {
                for (size_t c = 0; c < NC; c++) {
                    assert_true(Kx->data[a * NC + c] == K->data[(NC + a) * N + c]);
                    assert_true(!ntk || Tx->data[a * NC + c] == T->data[(NC + a) * N + c]);
                }
                assert_true(kd[a] == K->data[(NC + a) * N + NC + a]);
                assert_true(!ntk || td[a] == T->data[(NC + a) * N + NC + a]);
            }
            assert_true(e2 >= 0 && e2 <= e1);
        }
    /* the per-position readout has no blocks; shapes are checked */
    tpk_cnn_params pp = params(R, S, C, 3, 3, 2, relu, TPK_CNN_POSITIONS, 0, TPK_CNN_POOL_AUTO);
    assert_int_equal(tpk_cnn_kernels_cross(&pp, Xr, Xc, NULL, Kx, NULL, NULL, NULL, NULL, &ctx),
                     TPK_EUNSUPPORTED);
    tpk_ctx_clear(&ctx);
    tpk_cnn_params pf = params(R, S, C, 3, 3, 2, relu, TPK_CNN_FLATTEN, 0, TPK_CNN_POOL_AUTO);
    assert_int_equal(tpk_cnn_kernels_cross(&pf, Xc, Xr, NULL, Kx, NULL, NULL, NULL, NULL, &ctx),
                     TPK_EINVAL);
    assert_non_null(strstr(ctx.msg, "kernel output must be 5x3"));
    tpk_array_free(X);
    tpk_array_free(Xc);
    tpk_array_free(Xr);
    tpk_array_free(K);
    tpk_array_free(T);
    tpk_array_free(Kx);
    tpk_array_free(Tx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gap_shifts_1d),
        cmocka_unit_test(test_gap_shifts_2d),
        cmocka_unit_test(test_gap_shifts_blocks),
        cmocka_unit_test(test_lap_oracles),
        cmocka_unit_test(test_lap_limits),
        cmocka_unit_test(test_pool_choice),
        cmocka_unit_test(test_pool_errors),
        cmocka_unit_test(test_gpkernel_lap),
        cmocka_unit_test(test_f32_flatten),
        cmocka_unit_test(test_cross_blocks),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
