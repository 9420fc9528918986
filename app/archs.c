/* The table of shipped architectures (include/tpk/archs.h) and the flag → parameter translation
 * shared by gpkernel and gplimits. Add an architecture here: one row, a program under programs/,
 * and every tool gets it with the same flags. */
#include "tpk/archs.h"

#include "job-impl.h"

#include "tpk/attention.h"
#include "tpk/cnn.h"
#include "tpk/kernels.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const tpk_arch archs[] = {
    {"mlp", "programs/mlp.nsr", "data/demo-inputs.csv",
     "deep fully connected network, any phi (theory.md §2.1)",
     "depth=L,phi=phi,sigma-w2=sigma_w2,sigma-b2=sigma_b2,residual=alpha,ln-eps=ln_eps",
     "L=3,phi=relu,sigma_w2=2,sigma_b2=0",
     /* the last Dense layer is like the others: output Σ^{L+1} (issue-2 convention) */
     "sigma_v2=sigma_w2,sigma_ob2=sigma_b2", NULL, NULL, 30000},
    /* --layernorm / --residual=α pick programs/mlp-{ln,residual,ln-residual}.nsr (tpk_arch_program) */
    {"batchnorm", "programs/batchnorm.nsr", "data/demo-inputs.csv",
     "relu(BN(W x)) MLP, BN per neuron across a batch of inputs (theory.md §2.5)",
     "depth=L,phi=phi,sigma-w2=sigma_w2,batch-size=batch,bn-eps=eps", "L=3,phi=relu,sigma_w2=2",
     "sigma_v2=sigma_w2", NULL, NULL, 50000},
    {"rnn", "programs/rnn.nsr", "data/demo-sequences.npy",
     "simple RNN, W tied over time, inputs N×T×d (theory.md §2.2)",
     "phi=phi,sigma-w2=sigma_w2,sigma-b2=sigma_b2,sigma-u2=sigma_u2,sigma-v2=sigma_v2", "", "",
     NULL, NULL, 0},
    {"rnn-untied", "programs/rnn_untied.nsr", "data/demo-sequences.npy",
     "RNN with a fresh W at every step: no recurrent cross-time terms (theory.md §1.8)",
     "phi=phi,sigma-w2=sigma_w2,sigma-b2=sigma_b2,sigma-u2=sigma_u2,sigma-v2=sigma_v2", "", "",
     NULL, NULL, 0},
    /* GRU / LSTM: issue-4 names, U_* on the input, W_* on the hidden state, biases N(mu, var) */
    {"gru", "programs/gru.nsr", "data/demo-sequences.npy",
     "erf-GRU of Tensor Programs I, gates (1+erf x)/2, h0 = 0; gate products as Gaussian "
     "orthant probabilities (Genz, randomised QMC; theory.md §2.3); computed by its direct "
     "recursion, kernels/gru.c (TPK_EVALUATOR=program: by the evaluator)",
     "var-Uz=var_Uz,var-Ur=var_Ur,var-Uh=var_Uh,var-Wz=var_Wz,var-Wr=var_Wr,var-Wh=var_Wh,"
     "var-bz=var_bz,var-br=var_br,var-bh=var_bh,mu-bz=mu_bz,mu-br=mu_br,mu-bh=mu_bh,"
     "sigma-v2=sigma_v2", "", "", NULL, app_gru_direct, 0},
    {"lstm", "programs/lstm.nsr", "data/demo-sequences.npy",
     "LSTM, gates erf_sigmoid or sigmoid (--gate), cell tanh; E[gate gate'] closed or 2-D, "
     "E[tanh(c) tanh(c')] by randomised QMC (theory.md §2.4)",
     "gate=gate,var-Ui=var_Ui,var-Uf=var_Uf,var-Uo=var_Uo,var-Ug=var_Ug,var-Wi=var_Wi,"
     "var-Wf=var_Wf,var-Wo=var_Wo,var-Wg=var_Wg,var-bi=var_bi,var-bf=var_bf,var-bo=var_bo,"
     "var-bg=var_bg,mu-bi=mu_bi,mu-bf=mu_bf,mu-bo=mu_bo,mu-bg=mu_bg,sigma-v2=sigma_v2", "", "",
     NULL, NULL, 0},
    {"transformer", "programs/transformer.nsr", "data/demo-tokens.npy",
     "Tensor Programs I transformer: causal single-head attention (q = k = v, 1/n logits), "
     "post-LN residuals, ReLU feed-forward; tokens N×T×d (theory.md §2.7); computed by its direct "
     "recursion, kernels/transformer.c (TPK_EVALUATOR=program: by the evaluator)",
     "depth=L,var-e=var_e,var-u=var_u,var-w=var_w,var-b=var_b,temp=temp,ln-eps=eps,"
     "sigma-v2=sigma_v2", "", "", NULL, app_transformer_direct, 1000},
    /* inv-n: programs/attention.nsr evaluated; inv-sqrt-n: the hierarchical limit (theory §5) */
    {"attention", "programs/attention.nsr", "data/demo-tokens.npy",
     "one multi-head attention layer, independent W_Q, W_K, W_V, W_O; 1/n logits (Gaussian, "
     "uniform averaging) or 1/sqrt(n) (hierarchical, non-Gaussian limit; theory.md §5)",
     "heads=heads,logit-scaling=scaling,score-samples=R,seed=rng_seed,causal=causal,var-e=var_e,"
     "var-q=var_q,var-k=var_k,var-v=var_v,var-o=var_o,temp=temp,sigma-v2=sigma_v2", "", "",
     tpk_attention_job, NULL, 0},
    /* CNNs: the program fixes the parameters, the direct recursion of kernels/cnn.c computes
     * (tpk_cnn_job); padding/readout/filter/conv/window/compute are settings of the job, not of
     * the program */
    {"cnn1d", "programs/cnn1d.nsr", "data/demo-sequences.npy",
     "1-D CNN, a shared A-var per filter tap, signals N×P×C, flatten, GAP or LAP readout (theory.md §2.8)",
     "depth=L,phi=phi,sigma-w2=sigma_w2,sigma-b2=sigma_b2,sigma-u2=sigma_u2,sigma-v2=sigma_v2,"
     "filter=filter,padding=padding,readout=readout,conv=conv,window=window,compute=compute",
     "L=3,phi=relu,sigma_w2=2,sigma_b2=0,readout=gap,padding=circular", "", tpk_cnn_job, NULL, 5000},
    {"cnn2d", "programs/cnn2d.nsr", "data/demo-images.npy",
     "2-D CNN, a shared A-var per filter tap, images N×H×W×C, flatten, GAP or LAP readout (theory.md §2.8)",
     "depth=L,phi=phi,sigma-w2=sigma_w2,sigma-b2=sigma_b2,sigma-u2=sigma_u2,sigma-v2=sigma_v2,"
     "filter=filter,padding=padding,readout=readout,conv=conv,window=window,compute=compute",
     "L=3,phi=relu,sigma_w2=2,sigma_b2=0,readout=gap,padding=circular", "", tpk_cnn_job, NULL, 5000},
};

const tpk_arch *tpk_arch_table(size_t *count)
{
    if (count)
        *count = sizeof archs / sizeof archs[0];
    return archs;
}

const tpk_arch *tpk_arch_find(const char *name)
{
    for (size_t i = 0; name && i < sizeof archs / sizeof archs[0]; i++)
        if (strcmp(name, archs[i].name) == 0)
            return &archs[i];
    return NULL;
}

const char *tpk_arch_names(char *buf, size_t len)
{
    size_t k = 0;
    if (len)
        buf[0] = '\0';
    for (size_t i = 0; i < sizeof archs / sizeof archs[0] && k < len; i++) {
        int w = snprintf(buf + k, len - k, "%s%s", i ? ", " : "", archs[i].name);
        if (w < 0)
            break;
        k += (size_t)w;
    }
    return buf;
}

void tpk_arch_list(FILE *f)
{
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++) {
        fprintf(f, "%-12s %s  [%s]\n %12s flags:", archs[i].name, archs[i].summary,
                archs[i].program ? archs[i].program : "built-in", "");
        /* "flag=param,..." → " --flag (param)" */
        for (const char *p = archs[i].flags; p && *p;) {
            const char *eq = strchr(p, '='), *end = strchr(p, ',');
            if (!end)
                end = p + strlen(p);
            if (eq && eq < end && archs[i].max_depth > 0 && eq - p == 5 && !strncmp(p, "depth", 5))
                fprintf(f, " --depth (%.*s, 1..%d)", (int)(end - eq - 1), eq + 1,
                        archs[i].max_depth);
            else if (eq && eq < end)
                fprintf(f, " --%.*s (%.*s)", (int)(eq - p), p, (int)(end - eq - 1), eq + 1);
            p = *end ? end + 1 : end;
        }
        fputc('\n', f);
        /* what the row sets before and after the flags: where the program file's own defaults
         * differ, `netsor kernel PROGRAM` computes another network (issue 39, item 2) */
        int have_d = archs[i].defaults && archs[i].defaults[0];
        int have_f = archs[i].fixed && archs[i].fixed[0];
        if (have_d || have_f)
            fprintf(f, " %12s sets: %s%s%s%s (the program's defaults for the rest)\n", "",
                    have_d ? archs[i].defaults : "", have_d && have_f ? "; then " : "",
                    have_f ? archs[i].fixed : "", have_f ? " after the flags" : "");
    }
}

const char *tpk_arch_flag_param(const tpk_arch *a, const char *flag, char *buf, size_t len)
{
    size_t fl = strlen(flag);
    for (const char *p = a->flags; p && *p;) {
        const char *eq = strchr(p, '='), *end = strchr(p, ',');
        if (!end)
            end = p + strlen(p);
        if (eq && eq < end && (size_t)(eq - p) == fl && strncmp(p, flag, fl) == 0) {
            snprintf(buf, len, "%.*s", (int)(end - eq - 1), eq + 1);
            return buf;
        }
        p = *end ? end + 1 : end;
    }
    return NULL;
}

/* A flag's number: a finite double, or a message saying what it is instead (issue 18: 1e400
 * and 1e-320 were "not a number"). */
static int flag_number(const char *flag, const char *s, double *v, tpk_ctx *ctx)
{
    char *end;
    errno = 0;
    *v = strtod(s, &end);
    if (end == s || *end != '\0' || isnan(*v))
        return TPK_ERROR(ctx, TPK_EINVAL, "--%s: '%s' is not a number", flag, s);
    if (errno == ERANGE)
        return TPK_ERROR(ctx, TPK_EINVAL, "--%s: '%s' is %s", flag, s,
                         isinf(*v) ? "beyond the range of a double (about 1.8e308)"
                                   : "below the smallest normal double (about 2.2e-308): give 0 "
                                     "or a larger value");
    return TPK_OK;
}

static int check_variance(const char *flag, const char *s, tpk_ctx *ctx)
{
    double v;
    int st = flag_number(flag, s, &v, ctx);
    if (!st && (!(v >= 0) || !isfinite(v)))
        st = TPK_ERROR(ctx, TPK_EDOM, "--%s must be a finite variance >= 0 (got %s)", flag, s);
    return st;
}

static int check_positive(const char *flag, const char *s, tpk_ctx *ctx)
{
    double v;
    int st = flag_number(flag, s, &v, ctx);
    if (!st && (!(v > 0) || !isfinite(v)))
        st = TPK_ERROR(ctx, TPK_EDOM, "--%s must be finite and > 0 (got %s)", flag, s);
    return st;
}

/* The largest depth of any row (the bound of a depth checked without its architecture). */
static int table_max_depth(void)
{
    int m = 0;
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        m = archs[i].max_depth > m ? archs[i].max_depth : m;
    return m;
}

/* --depth in 1..max (a: the architecture, for the message; NULL: any). */
static int check_depth(const tpk_arch *a, const char *s, tpk_ctx *ctx)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    int max = a ? a->max_depth : table_max_depth();
    if (end == s || *end != '\0' || errno == ERANGE)
        return TPK_ERROR(ctx, TPK_EINVAL, "--depth: '%s' is not an integer", s);
    if (v < 1 || v > max)
        return TPK_ERROR(ctx, TPK_EINVAL, "--depth must be in 1..%d layers%s%s (got %ld)%s", max,
                         a ? " for --arch=" : "", a ? a->name : "", v,
                         v > max ? ": the program is elaborated at that depth, and deeper ones "
                                   "exceed its size limit (docs/netsor.md, \"Rolled programs\")"
                                 : "");
    return TPK_OK;
}

int tpk_arch_check_flag(const char *flag, const char *value, const tpk_phi_registry *reg,
                        tpk_ctx *ctx)
{
    int st = strcmp(flag, "depth") == 0 ? check_depth(NULL, value, ctx)
           : strcmp(flag, "temp") == 0 ? check_positive(flag, value, ctx)
           : strncmp(flag, "sigma-", 6) == 0 || strncmp(flag, "var-", 4) == 0 ||
                     strcmp(flag, "ln-eps") == 0
               ? check_variance(flag, value, ctx) : TPK_OK;
    if (st == TPK_OK && reg && strcmp(flag, "phi") == 0) {
        /* name a bad function here, not deep in the program */
        tpk_phi *phi = tpk_phi_alloc(reg, value, ctx);
        if (!phi)
            return ctx->status;
        tpk_phi_free(phi);
    }
    return st;
}

int tpk_arch_check(const tpk_arch *a, const char *flag, const char *value,
                   const tpk_phi_registry *reg, tpk_ctx *ctx)
{
    if (a && flag && value && strcmp(flag, "depth") == 0 && a->max_depth > 0) {
        int st = check_depth(a, value, ctx);
        if (st)
            return st;
    }
    return tpk_arch_check_flag(flag, value, reg, ctx);
}

/* Append "param=value,..." to out (pointing into buf, which it edits). */
static int add_list(const char *list, char *buf, size_t len, tpk_param_set *out, int cap, int *n)
{
    if (strlen(list ? list : "") >= len)
        return -1;
    snprintf(buf, len, "%s", list ? list : "");
    for (char *p = buf; *p;) {
        char *comma = strchr(p, ','), *eq;
        if (comma)
            *comma = '\0';
        if ((eq = strchr(p, '=')) != NULL) {
            if (*n == cap)
                return -1;
            *eq = '\0';
            out[(*n)++] = (tpk_param_set){.name = p, .value = eq + 1};
        }
        if (!comma)
            break;
        p = comma + 1;
    }
    return 0;
}

int tpk_arch_sets(const tpk_arch *a, const tpk_arch_flag *fl, int nfl, const tpk_param_set *user,
                  int nuser, tpk_param_set *out, int cap, int *n, char *buf, size_t len,
                  tpk_ctx *ctx)
{
    *n = 0;
    /* A --set of a parameter that a flag also sets would make the flag's value, recorded in the
     * output under the flag's name, contradict what ran (issue 18: --depth=2 --set L=5 ran 5
     * layers and recorded depth=2): refuse it, naming both. Some flags set a job setting that
     * the job turns into program parameters (app/job_cnn.c: --filter the taps k or kh, kw,
     * --padding circular): a --set of those was silently overridden by the flag. */
    static const char *const derived[][2] = {{"filter", "k"}, {"filter", "kh"}, {"filter", "kw"},
                                             {"padding", "circular"}};
    for (int i = 0; i < nuser; i++)
        for (int f = 0; f < nfl; f++) {
            int clash = user[i].name && fl[f].param && strcmp(user[i].name, fl[f].param) == 0;
            for (size_t d = 0; !clash && a->custom && user[i].name && fl[f].param &&
                               d < sizeof derived / sizeof derived[0]; d++)
                clash = !strcmp(fl[f].param, derived[d][0]) && !strcmp(user[i].name, derived[d][1]);
            if (clash)
                return TPK_ERROR(ctx, TPK_EINVAL, "--set %s=%s conflicts with --%s=%s: both set "
                                 "the parameter %s of --arch=%s; give only one of them",
                                 user[i].name, user[i].value ? user[i].value : "",
                                 fl[f].flag, fl[f].value ? fl[f].value : "", user[i].name,
                                 a->name);
        }
    size_t half = len / 2;
    int bad = add_list(a->defaults, buf, half, out, cap, n);
    for (int f = 0; !bad && f < nfl; f++) {
        if (*n == cap)
            bad = 1;
        else
            out[(*n)++] = (tpk_param_set){.name = fl[f].param, .value = fl[f].value};
    }
    bad = bad || add_list(a->fixed, buf + half, len - half, out, cap, n);
    for (int i = 0; !bad && i < nuser; i++) {
        if (*n == cap)
            bad = 1;
        else
            out[(*n)++] = user[i];
    }
    return bad ? TPK_ERROR(ctx, TPK_EINVAL, "too many parameter settings") : TPK_OK;
}

int tpk_arch_program(const tpk_arch *a, int layernorm, const tpk_arch_flag *fl, int nfl,
                     const char **program, tpk_ctx *ctx)
{
    int res = 0, eps = 0, mlp = strcmp(a->name, "mlp") == 0;
    for (int f = 0; f < nfl; f++) {
        res |= strcmp(fl[f].flag, "residual") == 0;
        eps |= strcmp(fl[f].flag, "ln-eps") == 0;
    }
    *program = a->program;
    if (layernorm && !mlp)
        return TPK_ERROR(ctx, TPK_EINVAL, "--layernorm is an option of --arch=mlp");
    if (eps && !layernorm && mlp)
        return TPK_ERROR(ctx, TPK_EINVAL, "--ln-eps needs --layernorm");
    if (layernorm)
        *program = res ? "programs/mlp-ln-residual.nsr" : "programs/mlp-ln.nsr";
    else if (mlp && res)
        *program = "programs/mlp-residual.nsr";
    return TPK_OK;
}
