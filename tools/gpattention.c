/* gpattention: finite-width attention against its hierarchical 1/sqrt(n) limit (theory.md §5,
 * §7.5; issue 5 item 3). Samples the limit (score covariances C(p)), runs M networks per width with
 * the exact-in-law sampler, and writes law distances (Rao–Blackwellised energy and W1 of a
 * coordinate, energy and MMD² of the s-token output), excess kurtosis, the distance of the limit
 * from the Gaussian with its covariance, and the infinite-head trend, to HDF5. */
#include "cli.h"

#include "tpk/attention.h"
#include "tpk/io.h"
#include "tpk/limits.h"
#include "tpk/tpk.h"

#include <gsl/gsl_randist.h>
#include <gsl/gsl_rng.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_WIDTHS 32
#define MAX_HEADS 16
#define BOOT 200 /* bootstrap replicates for kurtosis standard errors */
/* Largest token-kernel entry: fourth moments (Sigma^x squared, summed over up to 2^24 networks)
 * stay finite. */
#define SX_MAX 1e150

static const char usage_text[] =
    "Usage: gpattention --output=FILE.h5 [options]\n"
    "One attention layer with 1/sqrt(n) logits at finite width against its hierarchical limit\n"
    "(theory.md §5): law distances per width, excess kurtosis (not a GP), infinite heads.\n"
    "\n"
    "Options:\n"
    "  --tokens=S         tokens, with token kernel Sigma^x = I (theory §5.4; default 4)\n"
    "  --input=SPEC       instead: the first sequence of an N×T×d input, embedded with\n"
    "                     Sigma^x = <x, x'>/d\n"
    "  --heads=H          heads (default 2)     --causal    token i sees j <= i\n"
    "  --widths=LIST      4,16,64 or 4..1024 (x2 steps: 4..1024 gives 4,8,...) (default 4..1024)\n"
    "  --networks=M       networks per width (default 3000)\n"
    "  --score-samples=R  limit draws (default 3000)\n"
    "  --heads-list=LIST  heads for the infinite-head trend (default 1,2,4,16,64)\n"
    "  --seed=S           (default 1)     --quiet, --help, --version\n"
    "  --force            replace an existing --output that is not an HDF5 file of this\n"
    "                     toolkit (refused by default: nothing is overwritten without it)\n"
    "\n"
    "Output: /widths, /energy_limit and /energy_gauss (RB energy of y_1 against the limit and\n"
    "the Gaussian N(0, E_p[C])), /w1_limit, /w1_gauss (RB W1 of y_1), /energy_samples and\n"
    "/mmd2_samples (s-dim outputs vs limit samples), /kurtosis and /kurtosis_se (y_1 per width),\n"
    "/limit_kurtosis, /limit_energy_gauss, /heads_list with /heads_kurtosis, /heads_energy_gauss,\n"
    "/limit_mean (E_p[C]), /token_kernel.\n"
    CLI_PROGRESS_HELP
    "Options take their value as --opt=VALUE or --opt VALUE.\n"
    CLI_EXIT_HELP;

typedef struct opts {
    size_t tokens, heads, networks, R, nwidths, nheads, widths[MAX_WIDTHS];
    int causal, quiet, force;
    size_t hl[MAX_HEADS];
    unsigned long long seed;
    const char *input, *output;
} opts;

/* Widths and head counts: 1..2^24 each. */
#define COUNT_MAX (1u << 24)

/* 3 Var v / E[v]² over M variances (stride apart), with a bootstrap standard error. */
static void mix_kurtosis(const double *v, size_t M, size_t stride, uint64_t seed, double *k,
                         double *se)
{
    double s1 = 0, s2 = 0, b1 = 0, b2 = 0;
    for (size_t i = 0; i < M; i++)
        s1 += v[i * stride], s2 += v[i * stride] * v[i * stride];
    double m = s1 / (double)M;
    *k = 3 * (s2 - (double)M * m * m) / (double)(M - 1) / (m * m);
    gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(rng, (unsigned long)seed);
    for (int b = 0; b < BOOT; b++) {
        double t1 = 0, t2 = 0;
        for (size_t i = 0; i < M; i++) {
            double x = v[gsl_rng_uniform_int(rng, M) * stride];
            t1 += x, t2 += x * x;
        }
        double mm = t1 / (double)M, kb = 3 * (t2 - (double)M * mm * mm) / (double)(M - 1) / (mm * mm);
        b1 += kb, b2 += kb * kb;
    }
    gsl_rng_free(rng);
    *se = sqrt(fmax(b2 / BOOT - (b1 / BOOT) * (b1 / BOOT), 0.0));
}

static int run(int argc, char **argv, int *usage, tpk_ctx *ctx)
{
    opts o = {.tokens = 4, .heads = 2, .networks = 3000, .R = 3000, .seed = 1};
    int st = cli_parse_sizes("widths", "4..1024", 1, COUNT_MAX, o.widths, MAX_WIDTHS, &o.nwidths,
                             ctx);
    st = st ? st : cli_parse_sizes("heads-list", "1,2,4,16,64", 1, COUNT_MAX, o.hl, MAX_HEADS,
                                   &o.nheads, ctx);
    static const struct option lo[] = {
        {"tokens", 1, NULL, 't'}, {"input", 1, NULL, 'i'}, {"heads", 1, NULL, 'H'},
        {"causal", 0, NULL, 'c'}, {"widths", 1, NULL, 'w'}, {"networks", 1, NULL, 'M'},
        {"score-samples", 1, NULL, 'R'}, {"heads-list", 1, NULL, 'L'}, {"seed", 1, NULL, 's'},
        {"output", 1, NULL, 'o'}, {"quiet", 0, NULL, 'q'}, {"help", 0, NULL, 'h'},
        {"version", 0, NULL, 'v'}, {"progress", 0, NULL, 'p'}, {"no-progress", 0, NULL, 'P'},
        {"force", 0, NULL, 'F'}, {NULL, 0, NULL, 0}};
    int c, progress = -1;
    size_t sd = 1;
    opterr = 0;
    cli_seen seen;
    cli_seen_init(&seen, lo);
    while (!st && (c = cli_getopt(argc, argv, lo, &seen, &st, ctx)) != -1) {
        switch (c) {
        case 't': st = cli_parse_size("tokens", optarg, 1, 64, &o.tokens, ctx); break;
        case 'i': o.input = optarg; break;
        case 'H': st = cli_parse_size("heads", optarg, 1, 100000, &o.heads, ctx); break;
        case 'c': o.causal = 1; break;
        case 'w':
            st = cli_parse_sizes("widths", optarg, 1, COUNT_MAX, o.widths, MAX_WIDTHS, &o.nwidths,
                                 ctx);
            break;
        case 'M': st = cli_parse_size("networks", optarg, 8, COUNT_MAX, &o.networks, ctx); break;
        case 'R': st = cli_parse_size("score-samples", optarg, 8, COUNT_MAX, &o.R, ctx); break;
        case 'L':
            st = cli_parse_sizes("heads-list", optarg, 1, COUNT_MAX, o.hl, MAX_HEADS, &o.nheads,
                                 ctx);
            break;
        case 's': st = cli_parse_size("seed", optarg, 0, SIZE_MAX, &sd, ctx); o.seed = sd; break;
        case 'o': o.output = optarg; break;
        case 'q': o.quiet = 1; break;
        case 'F': o.force = 1; break;
        case 'p': progress = 1; break;
        case 'P': progress = 0; break;
        case 'h': fputs(usage_text, stdout); return -1;
        case 'v': cli_version("gpattention"); return -1;
        default: st = cli_bad_option(argv, ctx);
        }
    }
    if (!st)
        st = cli_no_operands(argc, argv, ctx);
    if (!st && o.input) /* issue 18: --tokens was ignored without a word */
        st = cli_refuse(&seen, "tokens", "with --input the tokens are the first sequence of the "
                        "input (its T)", ctx);
    if (!st && !o.output)
        st = TPK_ERROR(ctx, TPK_EINVAL, "missing --output=FILE.h5");
    if (st) {
        *usage = 1;
        return st;
    }
    /* before any work: an existing file that is not this toolkit's stays (issue 39, item 4) */
    const char *ins0[] = {o.input};
    if (tpk_io_check_output(o.output, ins0, 1, ctx) ||
        tpk_h5out_check_replace(o.output, o.force, ctx))
        return ctx->status;
    cli_progress bar = {0};
    const int show = !o.quiet && cli_progress_wanted(progress);

    /* the token kernel */
    size_t s = o.tokens;
    tpk_input_info info;
    tpk_array *X = NULL;
    double *Sx;
    if (o.input) {
        if (!(X = tpk_io_read(o.input, &info, ctx)))
            return ctx->status;
        if (tpk_array_check_scale(X, o.input, ctx)) { /* NaN kurtosis at the write otherwise */
            tpk_array_free(X);
            return ctx->status;
        }
        s = X->ndim >= 3 ? X->dims[1] : 1;
        if (s > 64) {
            tpk_array_free(X);
            return TPK_ERROR(ctx, TPK_EINVAL, "%s: at most 64 tokens per sequence", o.input);
        }
    }
    size_t d = X ? tpk_array_item_size(X) / s : 0, M = o.networks, R = o.R, W = o.nwidths;
    Sx = calloc(s * s, sizeof *Sx);
    double *C = malloc(R * s * s * sizeof *C), *mean = malloc(s * s * sizeof *mean);
    double *Yl = malloc(M * s * sizeof *Yl), *Yn = malloc(M * s * sizeof *Yn);
    double *Kn = malloc(M * s * s * sizeof *Kn), *cl = malloc(R * sizeof *cl), *vn = malloc(M * sizeof *vn);
    double *res = calloc(8 * W + 3 * o.nheads, sizeof *res);
    tpk_h5out *out = NULL;
    if (!Sx || !C || !mean || !Yl || !Yn || !Kn || !cl || !vn || !res) {
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < s; i++)
        for (size_t j = 0; j < s; j++) {
            double v = i == j;
            if (X) {
                v = 0;
                for (size_t k = 0; k < d; k++)
                    v += X->data[i * d + k] * X->data[j * d + k] / (double)d;
            }
            Sx[i * s + j] = v;
        }
    /* y_1's kurtosis takes fourth moments, of the order of Sigma^x squared: beyond SX_MAX they
     * overflow and the file was refused at the end for a NaN (issue 18) */
    double sxmax = 0;
    for (size_t i = 0; i < s * s; i++)
        sxmax = fmax(sxmax, fabs(Sx[i]));
    if (sxmax > SX_MAX) {
        st = TPK_ERROR(ctx, TPK_EDOM, "%s: the token kernel reaches %g, beyond %g: the fourth "
                       "moments of y_1 (its kurtosis) would overflow a double; rescale the input",
                       o.input, sxmax, SX_MAX);
        goto done;
    }
    tpk_attn_params prm = {.heads = (int)o.heads, .scaling = TPK_ATTN_INV_SQRT_N,
                           .causal = o.causal, .var_q = 1, .var_k = 1, .var_v = 1, .var_o = 1,
                           .temp = 1};
    const char *ins[] = {o.input};
    if (tpk_io_check_output(o.output, ins, 1, ctx) || !(out = tpk_h5out_open(o.output, ctx))) {
        st = ctx->status;
        goto done;
    }
    if ((st = tpk_attn_limit_covs(Sx, 1, s, &prm, NULL, s, R, o.seed, C, mean, NULL, ctx)) ||
        (st = tpk_attn_mixture_sample(C, R, s, M, o.seed + 1, Yl, ctx)))
        goto done;
    for (size_t r = 0; r < R; r++)
        cl[r] = C[r * s * s];
    double g = mean[0], e_lg, w_lg, kl, kl_se;
    /* Kurtosis divides by the variance of y_1: zero tokens (Sigma^x = 0 on what y_1 sees) give
     * y_1 = 0 in every network, whose law has no kurtosis (issue 18: NaN was written). */
    if (!(g > 0)) {
        /* tokens that are not zero but whose squares underflow are said to be that */
        double big = 0;
        for (size_t k = 0; X && k < s * d; k++)
            big = fmax(big, fabs(X->data[k]));
        char why[160];
        if (big > 0)
            snprintf(why, sizeof why, "are so small (entries up to %g) that their products "
                     "underflow to 0: rescale the input", big);
        else
            snprintf(why, sizeof why, "embed to zero: give nonzero tokens");
        st = TPK_ERROR(ctx, TPK_EDOM, "%s: the first output y_1 is identically 0 (limit variance "
                       "E[C_11] = %g, token kernel Sigma^x[0][0] = %g), so its kurtosis and "
                       "distances are undefined: the tokens it attends to %s",
                       o.input ? o.input : "--tokens", g, Sx[0], why);
        goto done;
    }
    if ((st = tpk_attn_energy_mixtures(cl, R, &g, 1, &e_lg, ctx)) ||
        (st = tpk_limits_w1_mixtures(cl, NULL, R, &g, NULL, 1, &w_lg, ctx)))
        goto done;
    mix_kurtosis(C, R, s * s, o.seed + 2, &kl, &kl_se);
    double *en = res, *eg = res + W, *w1 = res + 2 * W, *wg = res + 3 * W, *es = res + 4 * W;
    double *mmd = res + 5 * W, *kn = res + 6 * W, *kse = res + 7 * W;
    /* MMD bandwidth: the median-heuristic scale of the limit's outputs, √(2 tr E[C]) */
    double tr = 0;
    for (size_t i = 0; i < s; i++)
        tr += mean[i * s + i];
    double h = sqrt(fmax(tr, 1e-300));
    if (!o.quiet)
        printf("gpattention: s=%zu tokens, H=%zu, %zu networks per width, %zu limit draws\n"
               "  limit: E[C_11]=%.5g, excess kurtosis of y_1 %.4f ± %.4f (a GP has 0); "
               "RB energy to N(0, E C) %.3g, W1 %.3g\n", s, o.heads, M, R, g, kl, kl_se, e_lg, w_lg);
    cli_progress_start(&bar, "gpattention", "widths and head counts", W + o.nheads, show);
    for (size_t w = 0; w < W; w++) {
        cli_progress_update(&bar, w);
        if ((st = tpk_attn_finite_sample(Sx, s, &prm, o.widths[w], M, o.seed + 100 + w, Kn, Yn, ctx)))
            goto done;
        for (size_t i = 0; i < M; i++)
            vn[i] = Kn[i * s * s];
        if ((st = tpk_attn_energy_mixtures(vn, M, cl, R, &en[w], ctx)) ||
            (st = tpk_attn_energy_mixtures(vn, M, &g, 1, &eg[w], ctx)) ||
            (st = tpk_limits_w1_mixtures(vn, NULL, M, cl, NULL, R, &w1[w], ctx)) ||
            (st = tpk_limits_w1_mixtures(vn, NULL, M, &g, NULL, 1, &wg[w], ctx)) ||
            (st = tpk_limits_energy(Yn, M, Yl, M, s, &es[w], ctx)) ||
            (st = tpk_limits_mmd2(Yn, M, Yl, M, s, h, &mmd[w], ctx)))
            goto done;
        mix_kurtosis(Kn, M, s * s, o.seed + 3 + w, &kn[w], &kse[w]);
        cli_progress_clear(&bar);
        if (!o.quiet)
            printf("  n=%6zu: y_1 RB energy to limit %9.2e, to Gaussian %9.2e; W1 %8.2e / %8.2e; "
                   "samples energy %9.2e, MMD² %9.2e; kurtosis %.4f ± %.4f\n", o.widths[w], en[w],
                   eg[w], w1[w], wg[w], es[w], mmd[w], kn[w], kse[w]);
    }
    double *hk = res + 8 * W, *hks = hk + o.nheads, *he = hks + o.nheads, hd[MAX_HEADS];
    for (size_t k = 0; k < o.nheads; k++) {
        cli_progress_update(&bar, W + k);
        tpk_attn_params p2 = prm;
        p2.heads = (int)o.hl[k];
        hd[k] = (double)o.hl[k];
        double m2[64 * 64];
        if ((st = tpk_attn_limit_covs(Sx, 1, s, &p2, NULL, s, R, o.seed + 7 + k, C, m2, NULL, ctx)))
            goto done;
        for (size_t r = 0; r < R; r++)
            cl[r] = C[r * s * s];
        mix_kurtosis(C, R, s * s, o.seed + 50 + k, &hk[k], &hks[k]);
        if ((st = tpk_attn_energy_mixtures(cl, R, &g, 1, &he[k], ctx)))
            goto done;
        cli_progress_clear(&bar);
        if (!o.quiet)
            printf("  H=%5zu: limit kurtosis %.4f ± %.4f, RB energy to N(0, E C) %.3g\n", o.hl[k],
                   hk[k], hks[k], he[k]);
    }
    cli_progress_end(&bar, 1);
    size_t dm[2] = {s, s};
    tpk_array *A = tpk_array_alloc(2, dm, ctx), *B = tpk_array_alloc(2, dm, ctx);
    if (!A || !B) {
        tpk_array_free(A);
        tpk_array_free(B);
        st = ctx->status;
        goto done;
    }
    memcpy(A->data, mean, s * s * sizeof *mean);
    memcpy(B->data, Sx, s * s * sizeof *Sx);
    st = tpk_h5out_write(out, "/limit_mean", A, ctx);
    if (!st) st = tpk_h5out_write(out, "/token_kernel", B, ctx);
    tpk_array_free(A);
    tpk_array_free(B);
    static const char *const names[8] = {"/energy_limit", "/energy_gauss", "/w1_limit", "/w1_gauss",
                                         "/energy_samples", "/mmd2_samples", "/kurtosis",
                                         "/kurtosis_se"};
    /* named axes (xarray): width and heads with their values as integer coordinates, tokens */
    long long iw[MAX_WIDTHS], ih[MAX_HEADS];
    for (size_t w = 0; w < W; w++)
        iw[w] = (long long)o.widths[w];
    for (size_t k = 0; k < o.nheads; k++)
        ih[k] = (long long)o.hl[k];
    const char *const tt[] = {"token", "token2"}, *const wd[] = {"width"}, *const hdim[] = {"heads"};
    if (!st) st = tpk_h5out_coord_ints(out, "width", iw, W, ctx);
    if (!st && o.nheads) st = tpk_h5out_coord_ints(out, "heads", ih, o.nheads, ctx);
    if (!st) st = tpk_h5out_dims(out, "/limit_mean", tt, 2, ctx);
    if (!st) st = tpk_h5out_dims(out, "/token_kernel", tt, 2, ctx);
    if (!st) st = tpk_h5out_write_ints(out, "/widths", iw, W, ctx);
    if (!st) st = tpk_h5out_dims(out, "/widths", wd, 1, ctx);
    for (int q = 0; !st && q < 8; q++) {
        st = tpk_h5out_write_vector(out, names[q], res + (size_t)q * W, W, ctx);
        if (!st) st = tpk_h5out_dims(out, names[q], wd, 1, ctx);
    }
    static const char *const hnames[4] = {"/heads_list", "/heads_kurtosis", "/heads_kurtosis_se",
                                          "/heads_energy_gauss"};
    const double *hv[4] = {hd, hk, hks, he};
    for (int q = 0; !st && q < 4 && o.nheads; q++) {
        if (q == 0)
            st = tpk_h5out_write_ints(out, hnames[q], ih, o.nheads, ctx);
        else
            st = tpk_h5out_write_vector(out, hnames[q], hv[q], o.nheads, ctx);
        if (!st) st = tpk_h5out_dims(out, hnames[q], hdim, 1, ctx);
    }
    if (!st) { /* the command as recorded: without the display options */
        int nrec = 0;
        char **rec = cli_record_argv(argc, argv, &nrec);
        st = rec ? tpk_h5out_provenance(out, nrec, rec, ctx)
                 : TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        free(rec);
    }
    if (!st) st = tpk_h5out_attr_double(out, "/", "limit_kurtosis", kl, ctx);
    if (!st) st = tpk_h5out_attr_double(out, "/", "limit_kurtosis_se", kl_se, ctx);
    if (!st) st = tpk_h5out_attr_double(out, "/", "limit_energy_gauss", e_lg, ctx);
    if (!st) st = tpk_h5out_attr_double(out, "/", "limit_w1_gauss", w_lg, ctx);
    if (!st) st = tpk_h5out_attr_int(out, "/", "heads", (long long)o.heads, ctx);
    if (!st) st = tpk_h5out_attr_int(out, "/", "networks", (long long)M, ctx);
    if (!st) st = tpk_h5out_attr_int(out, "/", "score_samples", (long long)R, ctx);
    if (!st) st = tpk_h5out_attr_int(out, "/", "causal", o.causal, ctx);
    if (!st) st = tpk_h5out_attr_double(out, "/", "mmd_bandwidth", h, ctx);
    if (!st && X) st = tpk_h5out_input_attrs(out, "input", &info, X, ctx);
    if (!st) {
        st = tpk_h5out_commit(out, ctx);
        out = NULL;
    }
done:
    cli_progress_end(&bar, 0); /* after an error: the line ends where it stands */
    tpk_h5out_abort(out);
    tpk_array_free(X);
    free(Sx);
    free(C);
    free(mean);
    free(Yl);
    free(Yn);
    free(Kn);
    free(cl);
    free(vn);
    free(res);
    return st;
}

int main(int argc, char **argv)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    cli_notes(&ctx, "gpattention");
    int usage = 0, st = run(argc, argv, &usage, &ctx);
    if (st < 0)
        return CLI_EXIT_OK; /* --help, --version */
    return usage ? cli_report_usage("gpattention", st, &ctx) : cli_report("gpattention", st, &ctx);
}
