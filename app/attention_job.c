/* gpkernel --arch=attention: the 1/n layer as a NETSOR+ evaluation (programs/attention.nsr), the
 * 1/sqrt(n) layer as the hierarchical limit of theory.md §5 (sampled score covariances). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tpk/archs.h"
#include "tpk/alloc.h"
#include "tpk/clock.h"
#include "tpk/attention.h"
#include "tpk/io.h"

#define DEFAULT_R 256   /* score samples: the mean kernel's MC error is ~ sd/√R */
#define MAX_SETS 80

static int parse_count(const char *what, const char *s, unsigned long long lo,
                       unsigned long long hi, unsigned long long *out, tpk_ctx *ctx)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || *end != '\0' || errno == ERANGE || s[0] == '-' || v < lo || v > hi)
        return TPK_ERROR(ctx, TPK_EINVAL, "--%s: '%s' is not an integer in %llu..%llu", what, s, lo,
                         hi);
    *out = v;
    return TPK_OK;
}

int tpk_attention_job(const tpk_job *job, tpk_ctx *ctx)
{
    /* the job's own settings (gpkernel maps --logit-scaling, --score-samples, --seed to them);
     * everything else goes to the program */
    const char *scaling = "inv-sqrt-n";
    unsigned long long R = DEFAULT_R, seed = 0;
    tpk_param_set sets[MAX_SETS + 1];
    int nsets = 0, st = TPK_OK;
    if (!job->program || !job->input || !job->output)
        return TPK_ERROR(ctx, TPK_EINVAL, "a job needs a program, an input and an output");
    if (job->kernel != TPK_JOB_NNGP)
        return TPK_ERROR(ctx, TPK_EUNSUPPORTED,
                         "--kernel=%s: the attention limit of this job (1/sqrt(n) logits, a "
                         "non-Gaussian limit) is outside Tensor Programs II, which gives the NTK; "
                         "the 1/n attention's NTK is the interpreter's: netsor kernel "
                         "programs/attention.nsr --kernel=%s",
                         job->kernel == TPK_JOB_NTK ? "ntk" : "both",
                         job->kernel == TPK_JOB_NTK ? "ntk" : "both");
    for (int i = 0; i < job->nsets; i++) {
        const tpk_param_set *s = &job->sets[i];
        if (strcmp(s->name, "scaling") == 0)
            scaling = s->value;
        else if (strcmp(s->name, "R") == 0)
            st = parse_count("score-samples", s->value, 2, 100000000, &R, ctx);
        else if (strcmp(s->name, "rng_seed") == 0)
            st = parse_count("seed", s->value, 0, UINT64_MAX, &seed, ctx);
        else if (nsets == MAX_SETS)
            st = TPK_ERROR(ctx, TPK_EINVAL, "too many parameter settings");
        else
            sets[nsets++] = *s;
        if (st)
            return st;
    }
    int sqrt_n = strcmp(scaling, "inv-sqrt-n") == 0;
    if (!sqrt_n && strcmp(scaling, "inv-n") != 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "--logit-scaling must be inv-n or inv-sqrt-n (got '%s')",
                         scaling);
    if (!sqrt_n) { /* Gaussian limit: the NETSOR+ program, uniform averaging (theory §2.7) */
        tpk_job j = *job;
        j.sets = sets;
        j.nsets = nsets;
        j.netsor_plus = 1;
        return tpk_job_kernel(&j, ctx);
    }

    double t0 = tpk_wall_seconds();
    char prog[4200];
    /* beside the job's own program (a caller's tpk_arch_opts.root), else the shipped one */
    const char *slash = job->program ? strrchr(job->program, '/') : NULL;
    if (slash)
        snprintf(prog, sizeof prog, "%.*s/attention-sqrtn.nsr", (int)(slash - job->program),
                 job->program);
    else if (tpk_shipped_find("programs/attention-sqrtn.nsr", prog, sizeof prog, ctx))
        return ctx->status;
    tpk_input_info info;
    tpk_phi_registry *reg = NULL;
    tpk_program *p = NULL;
    tpk_array *X = NULL, *Sx = NULL, *K = NULL, *SE = NULL, *Cs = NULL, *kurt = NULL;
    tpk_h5out *out = NULL;
    size_t *sel = NULL;
    char tbuf[32];
    if (!(X = tpk_io_read(job->input, &info, ctx)) || !(reg = tpk_job_registry(ctx))) {
        st = ctx->status;
        goto done;
    }
    size_t N = X->dims[0], T = X->ndim >= 3 ? X->dims[1] : 1, d = tpk_array_item_size(X) / T;
    int user_T = 0;
    for (int i = 0; i < nsets; i++)
        user_T |= strcmp(sets[i].name, "T") == 0;
    if (!user_T) {
        snprintf(tbuf, sizeof tbuf, "%zu", T);
        sets[nsets++] = (tpk_param_set){.name = "T", .value = tbuf};
    }
    tpk_netsor_opts o = {.sets = sets, .nsets = nsets, .netsor_plus = 1};
    if (!(p = tpk_netsor_load_file(prog, &o, reg, ctx))) {
        st = ctx->status;
        goto done;
    }
    if ((size_t)p->nslots != T) {
        st = TPK_ERROR(ctx, TPK_EINVAL, "%s: the program has %d tokens but the input has %zu",
                       job->input, p->nslots, T);
        goto done;
    }
    double H, causal, var_e, sv2;
    tpk_attn_params prm = {.scaling = TPK_ATTN_INV_SQRT_N};
    st = tpk_program_param_number(p, "heads", &H, ctx);
    if (!st) st = tpk_program_param_number(p, "causal", &causal, ctx);
    if (!st) st = tpk_program_param_number(p, "var_e", &var_e, ctx);
    if (!st) st = tpk_program_param_number(p, "var_q", &prm.var_q, ctx);
    if (!st) st = tpk_program_param_number(p, "var_k", &prm.var_k, ctx);
    if (!st) st = tpk_program_param_number(p, "var_v", &prm.var_v, ctx);
    if (!st) st = tpk_program_param_number(p, "var_o", &prm.var_o, ctx);
    if (!st) st = tpk_program_param_number(p, "temp", &prm.temp, ctx);
    if (!st) st = tpk_program_param_number(p, "sigma_v2", &sv2, ctx);
    if (st)
        goto done;
    if (H < 1 || H != floor(H) || H > 1e6 || (causal != 0 && causal != 1) || !(var_e >= 0)) {
        st = TPK_ERROR(ctx, TPK_EINVAL, "heads must be a positive integer, causal 0 or 1, var_e >= 0");
        goto done;
    }
    prm.heads = (int)H;
    prm.causal = (int)causal;
    /* the token kernel: embedded tokens z = E x, Σ^x = var_e ⟨x, x'⟩/d (theory §1.2) */
    size_t P = N * T, m = job->all_outputs ? P : N;
    if (!(Sx = tpk_array_alloc2(P, P, ctx)) || !(K = tpk_array_alloc2(m, m, ctx)) ||
        !(SE = tpk_array_alloc2(m, m, ctx))) {
        st = ctx->status;
        goto done;
    }
    for (size_t i = 0; i < P; i++)
        for (size_t j = 0; j < P; j++) {
            double s = 0.0;
            for (size_t k = 0; k < d; k++)
                s += X->data[i * d + k] * X->data[j * d + k];
            Sx->data[i * P + j] = var_e * s / (double)d;
        }
    size_t cd[3] = {(size_t)R, m, m}, kd[1] = {m};
    if (!(Cs = tpk_array_alloc(3, cd, ctx)) || !(kurt = tpk_array_alloc(1, kd, ctx)) ||
        !(sel = tpk_malloc(ctx, m * sizeof *sel))) {
        st = ctx->status ? ctx->status : TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < m; i++)
        sel[i] = job->all_outputs ? i : i * T + T - 1; /* default: each sequence's last token */
    const char *ins[] = {job->program, job->input, job->test};
    if (tpk_io_check_output(job->output, ins, 3, ctx) ||
        tpk_h5out_check_replace(job->output, job->force, ctx) ||
        !(out = tpk_h5out_open(job->output, ctx))) { /* fail before computing */
        st = ctx->status;
        goto done;
    }
    if ((st = tpk_attn_limit_covs(Sx->data, N, T, &prm, sel, m, (size_t)R, (uint64_t)seed,
                                  Cs->data, K->data, SE->data, ctx)) ||
        (st = tpk_progress_check(job->progress, ctx)))
        goto done;
    double err = 0.0;
    for (size_t i = 0; i < tpk_array_size(Cs); i++)
        Cs->data[i] *= sv2;
    for (size_t i = 0; i < m * m; i++) {
        K->data[i] *= sv2;
        SE->data[i] *= sv2;
        err = SE->data[i] > err ? SE->data[i] : err;
    }
    /* a coordinate is a Gaussian scale mixture: excess kurtosis 3 Var C_ii / E[C_ii]² (§5.2) */
    for (size_t i = 0; i < m; i++) {
        double mu = K->data[i * m + i], v = 0.0;
        for (size_t r = 0; r < R; r++) {
            double c = Cs->data[(r * m + i) * m + i] - mu;
            v += c * c;
        }
        v /= (double)(R - 1);
        kurt->data[i] = mu > 0 ? 3.0 * v / (mu * mu) : 0.0;
    }
    st = tpk_h5out_write(out, "/kernel", K, ctx);
    if (!st) st = tpk_h5out_write(out, "/kernel_se", SE, ctx);
    if (!st) st = tpk_h5out_write(out, "/score_covariances", Cs, ctx);
    if (!st) st = tpk_h5out_write(out, "/excess_kurtosis", kurt, ctx);
    if (!st) st = tpk_h5out_write(out, "/input_kernel", Sx, ctx);
    /* named axes: the kernel's items as gpkernel names them, score samples, the P = N·T tokens */
    if (!st) st = tpk_job_kernel_dims(out, K, X, 0, ctx);
    const char *kdn = m == N ? "train" : "train_readout", *kdn2 = m == N ? "train2"
                                                                         : "train_readout2";
    if (!st) st = tpk_h5out_dims(out, "/kernel_se", (const char *const[]){kdn, kdn2}, 2, ctx);
    if (!st) st = tpk_h5out_dims(out, "/score_covariances",
                                 (const char *const[]){"sample", kdn, kdn2}, 3, ctx);
    if (!st) st = tpk_h5out_dims(out, "/excess_kurtosis", (const char *const[]){kdn}, 1, ctx);
    if (!st) st = tpk_h5out_dims(out, "/input_kernel", (const char *const[]){"token", "token2"},
                                 2, ctx);
    if (!st) st = tpk_job_describe(out, job, p, prog, "attention", ctx);
    if (!st) st = tpk_h5out_attr_str(out, "/", "logit_scaling", "inv-sqrt-n", ctx);
    if (!st) st = tpk_h5out_attr_int(out, "/", "score_samples", (long long)R, ctx);
    if (!st) st = tpk_h5out_attr_int(out, "/", "seed", (long long)seed, ctx);
    if (!st) st = tpk_h5out_attr_str(out, "/", "limit", "hierarchical: y | p ~ N(0, C(p)), "
                                     "C(p) = (1/H) sum_a A^a Sigma^V A^a^T (theory.md 5.2)", ctx);
    if (!st) st = tpk_h5out_input_attrs(out, "input", &info, X, ctx);
    if (!st) st = tpk_h5out_attr_double(out, "/", "error_estimate", err, ctx);
    if (!st) {
        st = tpk_h5out_commit(out, ctx);
        out = NULL;
    }
    if (!st && job->summary) {
        double kmax = 0.0;
        for (size_t i = 0; i < m; i++)
            kmax = kurt->data[i] > kmax ? kurt->data[i] : kmax;
        fprintf(job->summary, "kernel: %s, 1/sqrt(n) logits, %d head%s: hierarchical limit from %llu "
                "score samples (theory.md §5)\n", job->label ? job->label : "attention", prm.heads,
                prm.heads == 1 ? "" : "s", R);
        fprintf(job->summary, "  input   %s (N=%zu, T=%zu)\n", job->input, N, T);
        fprintf(job->summary, "  kernel  %zux%zu mean E_p[C(p)], K[0][0]=%.6g, MC error <= %.2e; "
                "excess kurtosis up to %.3g (not a GP)\n", m, m, K->data[0], err, kmax);
        fprintf(job->summary, "  wrote   %s in %.3f s\n", job->output, tpk_wall_seconds() - t0);
    }
done:
    tpk_h5out_abort(out);
    tpk_free(ctx, sel);
    tpk_array_free(kurt);
    tpk_array_free(Cs);
    tpk_array_free(SE);
    tpk_array_free(K);
    tpk_array_free(Sx);
    tpk_array_free(X);
    tpk_program_free(p);
    tpk_phi_registry_free(reg);
    return st;
}
