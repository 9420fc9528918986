/* Issue 20, acceptance 1: the default (optimal) entrywise plan against TPK_PLAN=naive, side by side
 * in one run: whole gpkernel processes, the two plans alternated, medians, and the two kernels
 * compared entry by entry. The architectures of the issue (mlp with LayerNorm and residuals,
 * transformer, cnn2d) as gpkernel runs them, and the transformer and cnn2d again through the
 * NETSOR evaluator (their default here is a direct recursion, which no plan touches): the
 * transformer by TPK_EVALUATOR=program, cnn2d on 8 images, whose whole covariance blocks the
 * CNN job gives to the evaluator (app/job_cnn.c). Inputs N(0, 1), written as .npy into a
 * scratch directory.
 *   bench_plan [REPS] [--toy]      (REPS default 5, more for short runs: about 6 s of each
 *                                  configuration; --toy: tiny sizes, one repetition) */
#include <errno.h>
#include <math.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "tpk/tpk.h"

extern char **environ;

static uint64_t rng(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull); /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* N(0, 1) values into a little-endian float64 .npy of the given shape. */
static int write_npy(const char *path, int ndim, const size_t *dims, uint64_t seed)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    char shape[96] = "(";
    size_t total = 1;
    for (int i = 0; i < ndim; i++) {
        char t[24];
        snprintf(t, sizeof t, "%zu,%s", dims[i], i + 1 < ndim ? " " : "");
        strcat(shape, t);
        total *= dims[i];
    }
    strcat(shape, ")");
    char hdr[160];
    int h = snprintf(hdr, sizeof hdr, "{'descr': '<f8', 'fortran_order': False, 'shape': %s, }",
                     shape);
    int pad = 64 - (10 + h + 1) % 64;
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    unsigned short len = (unsigned short)(h + pad + 1);
    fputc(len & 0xff, f);
    fputc(len >> 8, f);
    fwrite(hdr, 1, (size_t)h, f);
    for (int i = 0; i < pad; i++)
        fputc(' ', f);
    fputc('\n', f);
    uint64_t s = seed;
    for (size_t i = 0; i < total; i += 2) { /* Box–Muller */
        double u1 = ((double)(rng(&s) >> 11) + 0.5) * 0x1p-53, u2 = (double)(rng(&s) >> 11) * 0x1p-53;
        double r = sqrt(-2 * log(u1)), v[2] = {r * cos(2 * M_PI * u2), r * sin(2 * M_PI * u2)};
        fwrite(v, sizeof(double), total - i >= 2 ? 2 : 1, f);
    }
    return fclose(f) == 0 ? 0 : -1;
}

/* Run gpkernel ARGS with TPK_PLAN=plan (and TPK_EVALUATOR=program if evaluator): seconds, or a
 * negative value when it fails. */
static double run(const char *bin, const char *args, const char *input, const char *out,
                  const char *plan, int evaluator)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "TPK_PLAN=%s %s %s/gpkernel %s --input=%s --output=%s --quiet", plan,
             evaluator ? "TPK_EVALUATOR=program" : "", bin, args, input, out);
    char *argv[] = {"sh", "-c", cmd, NULL};
    pid_t pid;
    double t0 = bench_now();
    if (posix_spawn(&pid, "/bin/sh", NULL, NULL, argv, environ) != 0)
        return -1;
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    double t = bench_now() - t0;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? t : -1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* max |a − b| / max |a| over the two /kernel datasets; −1 when one cannot be read. */
static double kernel_diff(const char *a, const char *b)
{
    char sa[1100], sb[1100];
    snprintf(sa, sizeof sa, "%s:/kernel", a);
    snprintf(sb, sizeof sb, "%s:/kernel", b);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_array *A = tpk_io_read(sa, NULL, &ctx), *B = A ? tpk_io_read(sb, NULL, &ctx) : NULL;
    double d = -1;
    if (A && B && tpk_array_size(A) == tpk_array_size(B)) {
        double dm = 0, am = 0;
        for (size_t i = 0; i < tpk_array_size(A); i++) {
            dm = fmax(dm, fabs(A->data[i] - B->data[i]));
            am = fmax(am, fabs(A->data[i]));
        }
        d = am > 0 ? dm / am : dm;
    }
    tpk_array_free(A);
    tpk_array_free(B);
    return d;
}

int main(int argc, char **argv)
{
    int reps = 5, toy = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--toy") == 0)
            toy = 1;
        else if (atoi(argv[i]) > 0 && atoi(argv[i]) < 100)
            reps = atoi(argv[i]);
    }
    if (toy)
        reps = 1;
    const char *bin = getenv("TPK_BIN") ? getenv("TPK_BIN") : "build/bin";
    char dir[] = "/tmp/tpk-bench-plan-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("bench_plan: mkdtemp");
        return 1;
    }
    char mlp_in[128], tok_in[128], img_in[128], img8_in[128];
    snprintf(mlp_in, sizeof mlp_in, "%s/x.npy", dir);
    snprintf(tok_in, sizeof tok_in, "%s/tokens.npy", dir);
    snprintf(img_in, sizeof img_in, "%s/images.npy", dir);
    snprintf(img8_in, sizeof img8_in, "%s/images8.npy", dir);
    size_t dm[2] = {toy ? 256 : 2048, 16}, dt[3] = {toy ? 2 : 4, toy ? 16 : 256, 16},
           di[4] = {toy ? 4 : 16, toy ? 8 : 28, toy ? 8 : 28, 1}, di8[4] = {toy ? 2 : 8, di[1], di[2], 1};
    if (write_npy(mlp_in, 2, dm, 1) || write_npy(tok_in, 3, dt, 2) || write_npy(img_in, 4, di, 3) ||
        write_npy(img8_in, 4, di8, 4)) {
        fprintf(stderr, "bench_plan: cannot write inputs under %s\n", dir);
        return 1;
    }
    const struct {
        const char *name, *args, *input;
        int evaluator;
    } cases[] = {
        {"mlp-ln-res", "--arch=mlp --layernorm --residual=0.5 --depth=8", mlp_in, 0},
        {"transformer", "--arch=transformer --all-times --depth=2", tok_in, 0},
        {"cnn2d", toy ? "--arch=cnn2d --depth=3 --readout=gap" : "--arch=cnn2d --depth=6 --readout=gap",
         img_in, 0},
        {"transformer*", "--arch=transformer --all-times --depth=2", tok_in, 1},
        {"cnn2d*", toy ? "--arch=cnn2d --depth=3 --readout=gap" : "--arch=cnn2d --depth=6 --readout=gap",
         img8_in, 0},
    };
    printf("default (optimal) entrywise plan vs TPK_PLAN=naive: whole gpkernel processes, "
           "alternated; speed-up = median of the pairs' ratios (at least %d pairs)\n(mlp %zu "
           "inputs; transformer %zu x %zu tokens; cnn2d %zu images %zux%zu; * = through the "
           "evaluator: transformer* by TPK_EVALUATOR=program, "
           "cnn2d* on %zu images)\n", reps, dm[0], dt[0], dt[1], di[0], di[1], di[2], di8[0]);
    int ok = 1, faster = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        double tn[100], to[100];
        char on[160], oo[160];
        snprintf(on, sizeof on, "%s/naive.h5", dir);
        snprintf(oo, sizeof oo, "%s/optimal.h5", dir);
        int bad = 0, n = reps;
        for (int r = 0; r < n && !bad; r++) {
            /* alternate which goes first: neither plan always meets a warm cache */
            int first = r % 2;
            for (int k = 0; k < 2; k++) {
                int naive = (k == 0) == (first == 0);
                double t = run(bin, cases[c].args, cases[c].input, naive ? on : oo,
                               naive ? "naive" : "optimal", cases[c].evaluator);
                bad |= t < 0;
                (naive ? tn : to)[r] = t;
            }
            /* short runs vary by more than the bar between processes: at least ~6 s of
             * them, up to 41 pairs; and long ones at least ~20 s (5 pairs of cnn2d's 1.7 s
             * processes gave 0.94 for identical code on a loaded machine, session 18) */
            if (r == 0 && !bad && !toy && tn[0] + to[0] > 0) {
                const double budget = tn[0] + to[0] > 1.0 ? 20.0 : 6.0;
                int want = (int)ceil(budget / (tn[0] + to[0]));
                n = want > n ? (want < 41 ? want | 1 : 41) : n;
            }
        }
        if (bad) {
            printf("%-13s FAILED to run (%s)\n", cases[c].name, cases[c].args);
            ok = 0;
            continue;
        }
        /* the speed-up: the median of the pairs' ratios (each pair back to back, so a drift of
         * the shared machine over the run cancels), beside the medians of the times */
        double pr[100];
        for (int r = 0; r < n; r++)
            pr[r] = tn[r] / to[r];
        double ratio = median(pr, n);
        double mn = median(tn, n), mo = median(to, n), d = kernel_diff(on, oo);
        faster |= ratio >= 1.2;
        int pass = ratio >= 0.98 && d >= 0 && d <= 1e-13;
        ok &= pass;
        printf("%-13s naive %7.3f s  optimal %7.3f s  speed-up %5.2f  max rel diff %.1e  %s (%d "
               "pairs)\n", cases[c].name, mn, mo, ratio, d, pass ? "ok" : "BELOW BAR", n);
        remove(on);
        remove(oo);
    }
    remove(mlp_in);
    remove(tok_in);
    remove(img_in);
    remove(img8_in);
    rmdir(dir);
    printf("bars: every ratio >= 0.98 and kernels equal to 1e-13: %s; >= 1.2 on one: %s\n",
           ok ? "PASS" : "FAIL", faster ? "PASS" : "FAIL");
    return 0;
}
