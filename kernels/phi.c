/* The φ registry: built-in and user scalar nonlinearities, their flags and closed-form kinds, their
 * derivatives φ′ (formulas, or Ridders' differences for user φ; theory.md §3.5), and the spec
 * parser ("erf(2.0)", "leaky(0.1)", "tanh'") that binds a name and parameters to a tpk_phi. The
 * Gaussian expectations of these functions are in gauss.c (closed forms, theory.md §3.2) and
 * gauss_quad.c (quadrature). */
#include "gauss_impl.h"
#include "tpk/alloc.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SQRT2 1.41421356237309504880

/* glibc's vector math (libmvec, linked by libtpk) for the batched evaluation below: GCC calls
 * these variants from `omp simd` loops once they are declared SIMD (glibc declares them only
 * under -ffast-math) and math errno is off (this file is built with -fno-math-errno). */
__attribute__((simd("notinbranch"))) double tanh(double);
__attribute__((simd("notinbranch"))) double erf(double);
__attribute__((simd("notinbranch"))) double erfc(double);
__attribute__((simd("notinbranch"))) double exp(double);

/* ==== built-in scalar functions ========================================================== */

static double f_identity(double x, const double *p) { (void)p; return x; }
static double f_relu(double x, const double *p) { (void)p; return x > 0 ? x : 0.0; }
static double f_leaky(double x, const double *p) { return x > 0 ? x : p[0] * x; }
static double f_abrelu(double x, const double *p) { return x > 0 ? p[1] * x : p[0] * x; }
static double f_abs(double x, const double *p) { (void)p; return fabs(x); }
static double f_step(double x, const double *p) { (void)p; return x > 0 ? 1.0 : 0.0; }
static double f_sign(double x, const double *p) { (void)p; return (double)((x > 0) - (x < 0)); }
static double f_erf(double x, const double *p) { return erf(p[0] * x); }
static double f_erf_sigmoid(double x, const double *p) { (void)p; return 0.5 * erfc(-x); }
static double f_gelu(double x, const double *p) { (void)p; return 0.5 * x * erfc(-x / SQRT2); }
static double f_sin(double x, const double *p) { return p[0] * sin(p[1] * x + p[2]); }
static double f_cos(double x, const double *p) { return p[0] * cos(p[1] * x + p[2]); }
static double f_exp(double x, const double *p) { return p[0] * exp(p[1] * x); }
static double f_expsq(double x, const double *p) { return p[0] * exp(p[1] * x * x); }
static double f_arccos2(double x, const double *p) { (void)p; return x > 0 ? x * x : 0.0; }
static double f_x2(double x, const double *p) { (void)p; return x * x; }
static double f_x3(double x, const double *p) { (void)p; return x * x * x; }
static double f_x4(double x, const double *p) { (void)p; double y = x * x; return y * y; }
static double f_x5(double x, const double *p) { (void)p; double y = x * x; return y * y * x; }
static double f_tanh(double x, const double *p) { (void)p; return tanh(x); }
static double sigmoid(double x)
{
    if (x >= 0)
        return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}
static double softplus(double x) { return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)); }
static double f_sigmoid(double x, const double *p) { (void)p; return sigmoid(x); }
static double f_softplus(double x, const double *p) { (void)p; return softplus(x); }
static double f_silu(double x, const double *p) { (void)p; return x * sigmoid(x); }
static double f_elu(double x, const double *p) { return x > 0 ? x : p[0] * expm1(x); }
static double f_selu(double x, const double *p)
{
    (void)p; /* Klambauer et al. 2017 constants */
    const double lambda = 1.0507009873554804934, alpha = 1.6732632423543772848;
    return lambda * (x > 0 ? x : alpha * expm1(x));
}
static double f_softsign(double x, const double *p) { (void)p; return x / (1.0 + fabs(x)); }
static double f_gelu_tanh(double x, const double *p)
{
    (void)p;
    return 0.5 * x * (1.0 + tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x)));
}
static double f_mish(double x, const double *p) { (void)p; return x * tanh(softplus(x)); }
static double f_hardtanh(double x, const double *p) { (void)p; return x < -1 ? -1.0 : x > 1 ? 1.0 : x; }

/* ==== derivatives of the built-ins (theory.md §3.5) ======================================== */
/* Where φ′ is one of the functions above with other constants (erf′ = expsq, sin′ = cos, ...)
 * that function serves; the rest follow. At a kink x0, φ′(x0) is the element of least magnitude
 * of the interval between the one-sided derivatives (kink_value). */

#define INV_SQRT2PI 0.39894228040143267794
#define TWO_OVER_SQRTPI 1.12837916709551257390

/* a·1[x<0] + b·1[x>0], c at x = 0 (relu′ = step with step(0) = 0, leaky_relu′, abs′, 1). */
static double d_stepmix(double x, const double *p) { return x < 0 ? p[0] : x > 0 ? p[1] : p[2]; }
/* a·1[|x|<t] (hardtanh′: 0 at ±1). */
static double d_box(double x, const double *p) { return fabs(x) < p[1] ? p[0] : 0.0; }
static double d_xexpsq(double x, const double *p) { return p[0] * x * exp(p[1] * x * x); }
static double d_x2s(double x, const double *p) { return p[0] * x * x; }
static double d_x3s(double x, const double *p) { return p[0] * x * x * x; }
static double d_x4s(double x, const double *p) { double y = x * x; return p[0] * y * y; }
static double d_gelu(double x, const double *p)
{
    (void)p; /* Φ(x) + x φ(x) */
    return 0.5 * erfc(-x / SQRT2) + x * INV_SQRT2PI * exp(-0.5 * x * x);
}
/* sech² x = 1 − tanh² x without the cancellation of 1 − tanh² (relative accuracy for large |x|;
 * 0, not NaN, once e^{−2|x|} underflows). */
static double sech2(double x)
{
    const double e = exp(-2.0 * fabs(x));
    return 4.0 * e / ((1.0 + e) * (1.0 + e));
}
static double d_tanh(double x, const double *p) { (void)p; return sech2(x); }
/* σ′(x) = σ(x)σ(−x) = e^{−|x|}/(1 + e^{−|x|})² */
static double sigmoid_d(double x)
{
    const double e = exp(-fabs(x));
    return e / ((1.0 + e) * (1.0 + e));
}
static double d_sigmoid(double x, const double *p) { (void)p; return sigmoid_d(x); }
static double d_softplus(double x, const double *p) { (void)p; return sigmoid(x); }
static double d_silu(double x, const double *p) { (void)p; return sigmoid(x) + x * sigmoid_d(x); }
/* elu(α)′: 1 (x > 0), α e^x (x < 0), p[1] at 0; selu′ = λ·elu(α)′ with Klambauer's constants. */
static double d_elu(double x, const double *p) { return x > 0 ? 1.0 : x < 0 ? p[0] * exp(x) : p[1]; }
static double d_selu(double x, const double *p)
{
    (void)p;
    const double lambda = 1.0507009873554804934, alpha = 1.6732632423543772848;
    return lambda * (x > 0 ? 1.0 : x < 0 ? alpha * exp(x) : 1.0);
}
static double d_softsign(double x, const double *p)
{
    (void)p;
    const double d = 1.0 + fabs(x);
    return 1.0 / (d * d);
}
static double d_gelu_tanh(double x, const double *p)
{
    (void)p;
    const double c = 0.79788456080286535588, a = 0.044715, u = c * (x + a * x * x * x);
    const double s = sech2(u);
    /* s = 0 where |x| is large enough for x³ to overflow: the second term is 0, not inf·0 */
    return 0.5 * (1.0 + tanh(u)) + (s != 0.0 ? 0.5 * x * s * c * (1.0 + 3.0 * a * x * x) : 0.0);
}
static double d_mish(double x, const double *p)
{
    (void)p; /* tanh(sp) + x·sech²(sp)·σ(x), sp = softplus(x), sp′ = σ */
    const double sp = softplus(x);
    return tanh(sp) + x * sech2(sp) * sigmoid(x);
}

/* The element of least magnitude of [min(l, r), max(l, r)]: φ′ at a kink where the one-sided
 * derivatives are l and r (the minimum-norm subgradient, theory.md §3.5). */
static double kink_value(double l, double r)
{
    if ((l <= 0 && r >= 0) || (l >= 0 && r <= 0))
        return 0.0;
    return fabs(l) < fabs(r) ? l : r;
}

/* ==== built-in table ===================================================================== */

enum builtin {
    B_IDENTITY, B_RELU, B_LEAKY, B_ABRELU, B_ABS, B_STEP, B_SIGN, B_ERF, B_ERF_SIGMOID, B_GELU,
    B_SIN, B_COS, B_EXP, B_EXPSQ, B_ARCCOS0, B_ARCCOS1, B_ARCCOS2, B_X2, B_X3, B_X4, B_X5,
    /* numerical only */
    B_TANH, B_SIGMOID, B_SOFTPLUS, B_SILU, B_ELU, B_SELU, B_SOFTSIGN, B_GELU_TANH, B_MISH,
    B_HARDTANH
};

#define F_C TPK_PHI_CONTROLLED
#define F_P TPK_PHI_POLY_BOUNDED
#define F_L TPK_PHI_LIPSCHITZ
#define F_S TPK_PHI_SMOOTH
#define F_H TPK_PHI_POS_HOMOGENEOUS
#define F_ALL (F_C | F_P | F_L | F_S | F_H)

/* Names: monomials are "x2".."x5" (x^m); arccos0/1/2 are Cho & Saul's x^m·1[x>0]. */
static const phi_def builtins[] = {
    {"identity", f_identity, B_IDENTITY, 0, {0}, NULL, F_ALL, "x"},
    {"relu", f_relu, B_RELU, 0, {0}, NULL, F_C | F_P | F_L | F_H, "max(x,0)"},
    {"leaky_relu", f_leaky, B_LEAKY, 1, {0.01}, "a", F_C | F_P | F_L | F_H, "a*min(x,0)+max(x,0)"},
    {"abrelu", f_abrelu, B_ABRELU, 2, {0.0, 1.0}, "a,b", F_C | F_P | F_L | F_H,
     "a*min(x,0)+b*max(x,0)"},
    {"abs", f_abs, B_ABS, 0, {0}, NULL, F_C | F_P | F_L | F_H, "|x|"},
    {"step", f_step, B_STEP, 0, {0}, NULL, F_C | F_P | F_H, "1[x>0]"},
    {"sign", f_sign, B_SIGN, 0, {0}, NULL, F_C | F_P | F_H, "sign(x)"},
    {"erf", f_erf, B_ERF, 1, {1.0}, "b", F_C | F_P | F_L | F_S, "erf(b*x)"},
    {"erf_sigmoid", f_erf_sigmoid, B_ERF_SIGMOID, 0, {0}, NULL, F_C | F_P | F_L | F_S,
     "(1+erf(x))/2"},
    {"gelu", f_gelu, B_GELU, 0, {0}, NULL, F_C | F_P | F_L | F_S, "x*Phi(x) (exact)"},
    {"sin", f_sin, B_SIN, 3, {1.0, 1.0, 0.0}, "a,b,c", F_C | F_P | F_L | F_S, "a*sin(b*x+c)"},
    {"cos", f_cos, B_COS, 3, {1.0, 1.0, 0.0}, "a,b,c", F_C | F_P | F_L | F_S, "a*cos(b*x+c)"},
    {"exp", f_exp, B_EXP, 2, {1.0, 1.0}, "a,b", F_C | F_S, "a*exp(b*x)"},
    {"expsq", f_expsq, B_EXPSQ, 2, {1.0, -0.5}, "a,b", F_C | F_P | F_L | F_S,
     "a*exp(b*x^2) (b<1/(2q) for finite moments)"},
    {"arccos0", f_step, B_ARCCOS0, 0, {0}, NULL, F_C | F_P | F_H, "1[x>0] (arc-cosine degree 0)"},
    {"arccos1", f_relu, B_ARCCOS1, 0, {0}, NULL, F_C | F_P | F_L | F_H,
     "x*1[x>0] (arc-cosine degree 1 = relu)"},
    {"arccos2", f_arccos2, B_ARCCOS2, 0, {0}, NULL, F_C | F_P | F_H,
     "x^2*1[x>0] (arc-cosine degree 2)"},
    {"x2", f_x2, B_X2, 0, {0}, NULL, F_C | F_P | F_S | F_H, "x^2"},
    {"x3", f_x3, B_X3, 0, {0}, NULL, F_C | F_P | F_S | F_H, "x^3"},
    {"x4", f_x4, B_X4, 0, {0}, NULL, F_C | F_P | F_S | F_H, "x^4"},
    {"x5", f_x5, B_X5, 0, {0}, NULL, F_C | F_P | F_S | F_H, "x^5"},
    {"tanh", f_tanh, B_TANH, 0, {0}, NULL, F_C | F_P | F_L | F_S, "tanh(x)"},
    {"sigmoid", f_sigmoid, B_SIGMOID, 0, {0}, NULL, F_C | F_P | F_L | F_S, "1/(1+exp(-x))"},
    {"softplus", f_softplus, B_SOFTPLUS, 0, {0}, NULL, F_C | F_P | F_L | F_S, "log(1+exp(x))"},
    {"silu", f_silu, B_SILU, 0, {0}, NULL, F_C | F_P | F_L | F_S, "x*sigmoid(x) (swish)"},
    {"elu", f_elu, B_ELU, 1, {1.0}, "alpha", F_C | F_P | F_L, "x>0 ? x : alpha*(exp(x)-1)"},
    {"selu", f_selu, B_SELU, 0, {0}, NULL, F_C | F_P | F_L, "scaled elu (Klambauer et al.)"},
    {"softsign", f_softsign, B_SOFTSIGN, 0, {0}, NULL, F_C | F_P | F_L, "x/(1+|x|)"},
    {"gelu_tanh", f_gelu_tanh, B_GELU_TANH, 0, {0}, NULL, F_C | F_P | F_L | F_S,
     "tanh approximation of gelu"},
    {"mish", f_mish, B_MISH, 0, {0}, NULL, F_C | F_P | F_L | F_S, "x*tanh(softplus(x))"},
    {"hardtanh", f_hardtanh, B_HARDTANH, 0, {0}, NULL, F_C | F_P | F_L, "clamp(x,-1,1)"},
};
#define NBUILTIN (sizeof builtins / sizeof builtins[0])

/* A user registration: its entry and, once given, its derivative. */
typedef struct user_entry {
    phi_def def; /* first: registry_find hands out &def, tpk_phi_alloc casts back */
    tpk_scalar_fn dfn;
    unsigned dflags;
} user_entry;

struct tpk_phi_registry {
    user_entry *user;
    size_t nuser, cap;
    tpk_allocator al; /* of this struct and user */
};

/* ==== registry =========================================================================== */

tpk_phi_registry *tpk_phi_registry_alloc(tpk_ctx *ctx)
{
    tpk_phi_registry *reg = tpk_calloc(ctx, 1, sizeof *reg);
    if (!reg)
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory allocating the phi registry");
    else
        reg->al = tpk_ctx_allocator(ctx);
    return reg;
}

void tpk_phi_registry_free(tpk_phi_registry *reg)
{
    if (!reg)
        return;
    tpk_allocator al = reg->al;
    tpk_mem_free(&al, reg->user);
    tpk_mem_free(&al, reg);
}

static const phi_def *registry_find(const tpk_phi_registry *reg, const char *name, size_t len)
{
    for (size_t i = 0; i < NBUILTIN; i++)
        if (strlen(builtins[i].name) == len && memcmp(builtins[i].name, name, len) == 0)
            return &builtins[i];
    for (size_t i = 0; reg && i < reg->nuser; i++)
        if (strlen(reg->user[i].def.name) == len && memcmp(reg->user[i].def.name, name, len) == 0)
            return &reg->user[i].def;
    return NULL;
}

static int valid_name(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n >= GAUSS_NAME_MAX || !(isalpha((unsigned char)name[0]) || name[0] == '_'))
        return 0;
    for (size_t i = 1; i < n; i++)
        if (!(isalnum((unsigned char)name[i]) || name[i] == '_'))
            return 0;
    return 1;
}

int tpk_phi_register(tpk_phi_registry *reg, const char *name, tpk_scalar_fn fn, int nparams,
                     const double *defaults, unsigned flags, tpk_ctx *ctx)
{
    const unsigned all_flags = F_ALL;
    if (!reg || !name || !fn)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_phi_register: registry, name and function are required");
    if (!valid_name(name))
        return TPK_ERROR(ctx, TPK_EINVAL,
                         "phi name '%s' is not an identifier ([A-Za-z_][A-Za-z0-9_]*, < %d chars)",
                         name, GAUSS_NAME_MAX);
    if (nparams < 0 || nparams > TPK_PHI_MAXPARAMS)
        return TPK_ERROR(ctx, TPK_EINVAL, "phi '%s': nparams = %d, must be in 0..%d", name, nparams,
                         TPK_PHI_MAXPARAMS);
    if (flags & ~all_flags)
        return TPK_ERROR(ctx, TPK_EINVAL, "phi '%s': unknown flag bits 0x%x", name, flags & ~all_flags);
    if (registry_find(reg, name, strlen(name)))
        return TPK_ERROR(ctx, TPK_EINVAL, "phi '%s' is already registered", name);
    for (int i = 0; defaults && i < nparams; i++)
        if (!isfinite(defaults[i]))
            return TPK_ERROR(ctx, TPK_EINVAL, "phi '%s': default parameter %d is not finite", name,
                             i + 1);
    if (reg->nuser == reg->cap) {
        size_t cap = reg->cap ? 2 * reg->cap : 8;
        user_entry *u = tpk_mem_realloc(&reg->al, reg->user, cap * sizeof *u, ctx);
        if (!u)
            return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory registering phi '%s'", name);
        reg->user = u;
        reg->cap = cap;
    }
    user_entry *ue = &reg->user[reg->nuser++];
    memset(ue, 0, sizeof *ue);
    phi_def *d = &ue->def;
    snprintf(d->name, sizeof d->name, "%s", name);
    d->fn = fn;
    d->variant = -1;
    d->nparams = nparams;
    for (int i = 0; defaults && i < nparams; i++)
        d->defaults[i] = defaults[i];
    d->flags = flags;
    d->help = "user function";
    return TPK_OK;
}

static void flags_str(unsigned f, char out[6])
{
    out[0] = (f & F_C) ? 'C' : '-';
    out[1] = (f & F_P) ? 'P' : '-';
    out[2] = (f & F_L) ? 'L' : '-';
    out[3] = (f & F_S) ? 'S' : '-';
    out[4] = (f & F_H) ? 'H' : '-';
    out[5] = '\0';
}

static int def_has_closed_form(const phi_def *d)
{
    return d->variant >= 0 && d->variant < B_TANH;
}

static void list_one(FILE *f, const phi_def *d)
{
    char sig[96], fl[6];
    if (d->nparams == 0) {
        snprintf(sig, sizeof sig, "%s", d->name);
    } else {
        /* "name(a=0.01,b=1)" */
        int len = snprintf(sig, sizeof sig, "%s(", d->name);
        const char *pn = d->pnames;
        for (int i = 0; i < d->nparams && len > 0 && (size_t)len < sizeof sig; i++) {
            char nm[16];
            if (pn) {
                size_t l = strcspn(pn, ",");
                snprintf(nm, sizeof nm, "%.*s", (int)(l < 15 ? l : 15), pn);
                pn = pn[l] ? pn + l + 1 : pn + l;
            } else {
                snprintf(nm, sizeof nm, "p%d", i + 1);
            }
            len += snprintf(sig + len, sizeof sig - (size_t)len, "%s%s=%g", i ? "," : "", nm,
                            d->defaults[i]);
        }
        if (len > 0 && (size_t)len < sizeof sig)
            snprintf(sig + len, sizeof sig - (size_t)len, ")");
    }
    flags_str(d->flags, fl);
    fprintf(f, "%-22s %s  %-11s %s\n", sig, fl, def_has_closed_form(d) ? "closed-form" : "quadrature",
            d->help ? d->help : "");
}

void tpk_phi_registry_list(const tpk_phi_registry *reg, void *file)
{
    FILE *f = file ? (FILE *)file : stdout;
    fprintf(f, "# flags: C controlled, P polynomially bounded, L Lipschitz, S smooth (analytic), "
               "H positively homogeneous\n");
    for (size_t i = 0; i < NBUILTIN; i++)
        list_one(f, &builtins[i]);
    for (size_t i = 0; reg && i < reg->nuser; i++)
        list_one(f, &reg->user[i].def);
}

/* ==== spec parsing ======================================================================= */

/* Edit distance with adjacent transpositions ("rleu" → "relu" is 1), for "did you mean". */
static size_t edit_distance(const char *a, size_t la, const char *b)
{
    size_t lb = strlen(b), d[GAUSS_NAME_MAX + 1][GAUSS_NAME_MAX + 1];
    if (la > GAUSS_NAME_MAX)
        la = GAUSS_NAME_MAX;
    if (lb > GAUSS_NAME_MAX)
        lb = GAUSS_NAME_MAX;
    for (size_t i = 0; i <= la; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            const char ai = (char)tolower((unsigned char)a[i - 1]);
            size_t best = d[i - 1][j - 1] + (ai != b[j - 1]);
            if (d[i - 1][j] + 1 < best)
                best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best)
                best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && ai == b[j - 2] && tolower((unsigned char)a[i - 2]) == b[j - 1] &&
                d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[la][lb];
}

static void add_suggestion(char *buf, size_t cap, const char *name, const char *typed, size_t tlen)
{
    size_t d = edit_distance(typed, tlen, name);
    size_t lim = tlen <= 4 ? 1 : 2;
    int prefix = tlen >= 2 && strncmp(name, typed, tlen) == 0;
    if ((d <= lim || prefix) && strlen(buf) + strlen(name) + 3 < cap) {
        if (buf[0])
            strcat(buf, ", ");
        strcat(buf, name);
    }
}

static int unknown_phi(const tpk_phi_registry *reg, const char *name, size_t len, tpk_ctx *ctx)
{
    char sugg[256] = "";
    for (size_t i = 0; i < NBUILTIN; i++)
        add_suggestion(sugg, sizeof sugg, builtins[i].name, name, len);
    for (size_t i = 0; reg && i < reg->nuser; i++)
        add_suggestion(sugg, sizeof sugg, reg->user[i].def.name, name, len);
    /* the list, as a C caller and as a command-line user reach it */
    if (sugg[0])
        return TPK_ERROR(ctx, TPK_ENOTFOUND, "unknown nonlinearity '%.*s'; did you mean %s? (the "
                         "registered names: tpk_phi_registry_list, or --list-phi)", (int)len,
                         name, sugg);
    return TPK_ERROR(ctx, TPK_ENOTFOUND, "unknown nonlinearity '%.*s' (the registered names: "
                     "tpk_phi_registry_list, or --list-phi; a function of your own: "
                     "tpk_phi_register)", (int)len, name);
}

static const char *skip_ws(const char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    return s;
}

/* Shortest "%.Ng" that reads back exactly, so canonical names round-trip. */
static void fmt_double(char *buf, size_t cap, double x)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, x);
        if (strtod(buf, NULL) == x)
            return;
    }
}

/* Bind the normalised closed-form description of a built-in (theory.md §3.2 rows). */
static void phi_bind(tpk_phi *phi)
{
    const double *p = phi->p;
    phi->kind = GK_NUMERIC;
    phi->flags = phi->def.flags;
    switch (phi->def.variant) {
    case B_IDENTITY: phi->kind = GK_IDENTITY; break;
    case B_RELU:
    case B_ARCCOS1: phi->kind = GK_ABRELU; phi->ca = 0.0; phi->cb = 1.0; break;
    case B_LEAKY: phi->kind = GK_ABRELU; phi->ca = p[0]; phi->cb = 1.0; break;
    case B_ABRELU: phi->kind = GK_ABRELU; phi->ca = p[0]; phi->cb = p[1]; break;
    case B_ABS: phi->kind = GK_ABRELU; phi->ca = -1.0; phi->cb = 1.0; break;
    case B_STEP:
    case B_ARCCOS0: phi->kind = GK_STEP; break;
    case B_SIGN: phi->kind = GK_SIGN; break;
    case B_ARCCOS2: phi->kind = GK_ARCCOS2; break;
    case B_ERF: phi->kind = GK_ERF; phi->cb = p[0]; break;
    case B_ERF_SIGMOID: phi->kind = GK_ERF_SIGMOID; break;
    case B_GELU: phi->kind = GK_GELU; break;
    case B_SIN:
    case B_COS:
        phi->kind = GK_SIN;
        phi->ca = p[0]; phi->cb = p[1]; phi->cc = p[2];
        phi->m = phi->def.variant == B_COS;
        break;
    case B_EXP: phi->kind = GK_EXP; phi->ca = p[0]; phi->cb = p[1]; break;
    case B_EXPSQ:
        phi->kind = GK_EXPSQ; phi->ca = p[0]; phi->cb = p[1];
        /* e^{bx²} with b > 0 grows faster than exp(C|x|^{2-ε}): not controlled (§1.4). */
        if (p[1] > 0)
            phi->flags = F_S;
        break;
    case B_X2: case B_X3: case B_X4: case B_X5:
        phi->kind = GK_MONO; phi->m = 2 + (phi->def.variant - B_X2); phi->ca = 1.0;
        break;
    default: break;
    }
    if (phi->kind == GK_ABRELU && phi->ca == phi->cb)
        phi->flags |= F_S; /* linear */
}

/* ==== derivatives (theory.md §3.5) ======================================================== */

/* Ridders' method (C. J. F. Ridders, Adv. Eng. Software 4 (1982); Numerical Recipes, 3rd ed.,
 * §5.7 dfridr): central differences at steps h, h/CON, h/CON², … extrapolated to h → 0 in a
 * Neville tableau (each column removes the next even power of h); the estimate kept is the one
 * whose neighbours in the tableau agree best. Unlike dfridr the whole tableau is built: its early
 * stop (the diagonal growing worse than twice the best spread) is fooled where the first rows
 * agree by accident — tanh(1.7x) at x = −0.39, where φ‴ ≈ 0, stopped after two rows 4e-5 off with
 * a spread of 1.5e-6 — while entries in the rounding regime carry their own rounding bound. */
#define ND_NTAB 12   /* steps h0 … h0/1.4^11 ≈ h0/40: 24 evaluations of φ */
#define ND_CON 1.4
#define ND_H0 0.1    /* first step, relative to max(1, |x|): φ's curvature scale is O(1) */
/* Accuracy assumed of φ's own values: within 4 ulp of φ(y) at an argument within 4 ulp of y (the
 * user's b·y + c rounds before sin sees it), i.e. |δφ| ≤ ND_FEPS·(|φ(y)| + |y φ′(y)|). */
#define ND_FEPS (4.0 * DBL_EPSILON)

/* φ′(x) of f(·, p). smooth = 0: φ may be kinked at 0 (as the quadrature assumes, theory.md §3.3),
 * so the steps stay below |x|/2 and the differences on x's side; at x = 0 itself the result is
 * the mean of the one-sided derivatives. *err: the spread of the estimate's neighbours in the
 * tableau plus the propagated rounding of φ's values (ND_FEPS), itself extrapolated. */
static double numdiff(tpk_scalar_fn f, const double *p, int smooth, double x, double *err)
{
    /* a[j][i]: column j of row i (step h0/CON^i); r[j][i]: its propagated rounding bound */
    double h = ND_H0 * (fabs(x) > 1.0 ? fabs(x) : 1.0);
    if (!smooth && x != 0 && h > 0.5 * fabs(x))
        h = 0.5 * fabs(x);
    double a[ND_NTAB][ND_NTAB], r[ND_NTAB][ND_NTAB];
    double best = NAN, spread = INFINITY, round = INFINITY;
    for (int i = 0; i < ND_NTAB; i++, h /= ND_CON) {
        /* the steps actually taken: x ± h rounded, so their difference is the divisor */
        const double xp = x + h, xm = x - h, dx = xp - xm;
        const double fp = f(xp, p), fm = f(xm, p);
        a[0][i] = (fp - fm) / dx;
        r[0][i] = ND_FEPS * (fabs(fp) + fabs(fm) + (fabs(xp) + fabs(xm)) * fabs(a[0][i])) / dx +
                  2.0 * DBL_EPSILON * fabs(a[0][i]);
        double fac = ND_CON * ND_CON;
        for (int j = 1; j <= i; j++) {
            a[j][i] = (a[j - 1][i] * fac - a[j - 1][i - 1]) / (fac - 1.0);
            r[j][i] = (r[j - 1][i] * fac + r[j - 1][i - 1]) / (fac - 1.0) +
                      DBL_EPSILON * fabs(a[j][i]);
            fac *= ND_CON * ND_CON;
            const double d1 = fabs(a[j][i] - a[j - 1][i]), d2 = fabs(a[j][i] - a[j - 1][i - 1]);
            const double t = d1 > d2 ? d1 : d2;
            if (t <= spread) {
                spread = t;
                best = a[j][i];
                round = r[j][i];
            }
        }
    }
    if (err)
        *err = isfinite(best) ? spread + round : INFINITY;
    return best;
}

/* Bind d (a copy of phi with deriv = 1) to φ′: its function, constants, flags and closed-form
 * kind. Built-ins by their formulas (theory.md §3.5 table); user functions by dfn or numdiff. */
static int deriv_bind(tpk_phi *d, const tpk_phi *phi, tpk_ctx *ctx)
{
    const double *p = phi->p;
    double *q = d->p;
    int kind = GK_NUMERIC;
    unsigned fl = F_C | F_P | F_L | F_S; /* smooth, bounded, Lipschitz φ′ (tanh′, σ′, …) */
    tpk_scalar_fn fn = NULL;
    d->ca = d->cb = d->cc = 0.0;
    d->m = 0;
    switch (phi->def.variant) {
    case -1:
        if (phi->dfn) {
            fn = phi->dfn;
            fl = phi->dflags;
        } else {
            /* numerical: φ's regularity carries over except Lipschitz (φ″ may be unbounded) */
            d->ufn = phi->def.fn;
            fl = phi->flags & (F_C | F_P | F_S | F_H);
        }
        break;
    case B_STEP:
    case B_SIGN:
    case B_ARCCOS0:
        return TPK_ERROR(ctx, TPK_EDOM, "%s has no derivative as a function (its weak derivative "
                         "is a multiple of Dirac's delta at 0; the NTK needs polynomially bounded "
                         "weak derivatives, theory.md §3.5)", phi->canon);
    case B_X2:
    case B_ARCCOS2:
        /* (x²)′ = 2x, (x² 1[x>0])′ = 2 relu(x): the piecewise-linear family */
        fn = f_abrelu;
        q[0] = phi->def.variant == B_X2 ? 2.0 : 0.0;
        q[1] = 2.0;
        kind = GK_ABRELU;
        d->ca = q[0];
        d->cb = q[1];
        fl = q[0] == q[1] ? (F_C | F_P | F_L | F_S | F_H) : (F_C | F_P | F_L | F_H);
        break;
    case B_IDENTITY: case B_RELU: case B_ARCCOS1: case B_LEAKY: case B_ABRELU: case B_ABS:
        /* a·min(x,0) + b·max(x,0) ↦ a·1[x<0] + b·1[x>0] (phi_bind normalised them onto ca, cb) */
        fn = d_stepmix;
        q[0] = phi->kind == GK_IDENTITY ? 1.0 : phi->ca;
        q[1] = phi->kind == GK_IDENTITY ? 1.0 : phi->cb;
        q[2] = kink_value(q[0], q[1]);
        kind = GK_STEPMIX;
        d->ca = q[0];
        d->cb = q[1];
        d->cc = q[2];
        fl = q[0] == q[1] ? (F_C | F_P | F_L | F_S | F_H) : (F_C | F_P | F_H);
        break;
    case B_ERF:
    case B_ERF_SIGMOID: {
        /* erf(bx)′ = (2b/√π) e^{−b²x²}; ((1 + erf x)/2)′ = e^{−x²}/√π: both a·exp(βx²) */
        const double b = phi->def.variant == B_ERF ? p[0] : 1.0;
        fn = f_expsq;
        q[0] = phi->def.variant == B_ERF ? TWO_OVER_SQRTPI * b : 0.5 * TWO_OVER_SQRTPI;
        q[1] = -b * b;
        kind = GK_EXPSQ;
        d->ca = q[0];
        d->cb = q[1];
        break;
    }
    case B_GELU: fn = d_gelu; kind = GK_GELU_D; break;
    case B_SIN:
    case B_COS:
        /* (a sin(bx+c))′ = ab cos(bx+c); (a cos(bx+c))′ = −ab sin(bx+c) */
        fn = phi->def.variant == B_SIN ? f_cos : f_sin;
        q[0] = (phi->def.variant == B_SIN ? 1.0 : -1.0) * p[0] * p[1];
        q[1] = p[1];
        q[2] = p[2];
        kind = GK_SIN;
        d->ca = q[0];
        d->cb = q[1];
        d->cc = q[2];
        d->m = phi->def.variant == B_SIN;
        break;
    case B_EXP:
        fn = f_exp;
        q[0] = p[0] * p[1];
        q[1] = p[1];
        kind = GK_EXP;
        d->ca = q[0];
        d->cb = q[1];
        fl = F_C | F_S;
        break;
    case B_EXPSQ:
        /* (a e^{bx²})′ = 2ab·x·e^{bx²}: bounded and Lipschitz for b ≤ 0, not controlled for b > 0 */
        fn = d_xexpsq;
        q[0] = 2.0 * p[0] * p[1];
        q[1] = p[1];
        kind = GK_XEXPSQ;
        d->ca = q[0];
        d->cb = q[1];
        fl = p[1] > 0 ? F_S : (F_C | F_P | F_L | F_S);
        break;
    case B_X3: case B_X4: case B_X5:
        /* (x^m)′ = m x^{m−1} */
        d->m = 2 + (phi->def.variant - B_X3);
        fn = d->m == 2 ? d_x2s : d->m == 3 ? d_x3s : d_x4s;
        q[0] = d->m + 1;
        kind = GK_MONO;
        d->ca = q[0];
        fl = F_C | F_P | F_S | F_H;
        break;
    case B_TANH: fn = d_tanh; break;
    case B_SIGMOID: fn = d_sigmoid; break;
    case B_SOFTPLUS: fn = d_softplus; break;
    case B_SILU: fn = d_silu; break;
    case B_GELU_TANH: fn = d_gelu_tanh; break;
    case B_MISH: fn = d_mish; break;
    case B_ELU:
        /* jumps at 0 unless α = 1 (then continuous with a kink, Lipschitz) */
        fn = d_elu;
        q[0] = p[0];
        q[1] = kink_value(p[0], 1.0);
        fl = p[0] == 1.0 ? (F_C | F_P | F_L) : (F_C | F_P);
        break;
    case B_SELU: fn = d_selu; fl = F_C | F_P; break;
    case B_SOFTSIGN: fn = d_softsign; fl = F_C | F_P | F_L; break;
    case B_HARDTANH:
        fn = d_box;
        q[0] = 1.0;
        q[1] = 1.0;
        kind = GK_BOX;
        d->ca = 1.0;
        d->cb = 1.0;
        fl = F_C | F_P;
        break;
    default:
        return TPK_ERROR(ctx, TPK_EINVAL, "internal: no derivative rule for %s", phi->canon);
    }
    d->def.fn = fn; /* NULL for a numerical derivative: tpk_phi_eval calls numdiff */
    d->kind = kind;
    d->flags = fl;
    return TPK_OK;
}

tpk_phi *tpk_phi_derivative(const tpk_phi *phi, tpk_ctx *ctx)
{
    if (!phi) {
        TPK_ERROR(ctx, TPK_EINVAL, "tpk_phi_derivative: phi is required");
        return NULL;
    }
    if (phi->deriv) {
        TPK_ERROR(ctx, TPK_EUNSUPPORTED, "%s is a derivative already: second derivatives are not "
                  "available", phi->canon);
        return NULL;
    }
    tpk_phi *d = tpk_calloc(ctx, 1, sizeof *d);
    if (!d) {
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory allocating the derivative of %s", phi->canon);
        return NULL;
    }
    *d = *phi;
    d->al = tpk_ctx_allocator(ctx);
    d->deriv = 1;
    d->ufn = NULL;
    if (deriv_bind(d, phi, ctx) != TPK_OK) {
        tpk_phi_free(d);
        return NULL;
    }
    const size_t len = strlen(phi->canon);
    if (len + 2 > sizeof d->canon) {
        TPK_ERROR(ctx, TPK_EINVAL, "the name of the derivative of %s is too long", phi->canon);
        tpk_phi_free(d);
        return NULL;
    }
    d->canon[len] = '\'';
    d->canon[len + 1] = '\0';
    return d;
}

int tpk_phi_register_derivative(tpk_phi_registry *reg, const char *name, tpk_scalar_fn dfn,
                                unsigned flags, tpk_ctx *ctx)
{
    if (!reg || !name || !dfn)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_phi_register_derivative: registry, name and "
                         "derivative are required");
    if (flags & ~(unsigned)F_ALL)
        return TPK_ERROR(ctx, TPK_EINVAL, "derivative of phi '%s': unknown flag bits 0x%x", name,
                         flags & ~(unsigned)F_ALL);
    for (size_t i = 0; i < reg->nuser; i++)
        if (strcmp(reg->user[i].def.name, name) == 0) {
            reg->user[i].dfn = dfn;
            reg->user[i].dflags = flags;
            return TPK_OK;
        }
    if (registry_find(reg, name, strlen(name)))
        return TPK_ERROR(ctx, TPK_EINVAL, "'%s' is a built-in: its derivative is built in", name);
    return TPK_ERROR(ctx, TPK_ENOTFOUND, "no user function '%s' is registered (tpk_phi_register "
                     "first)", name);
}

/* spec := name [ '(' [ number { ',' number } ] ')' ] [ "'" ], blanks allowed around tokens. */
tpk_phi *tpk_phi_alloc(const tpk_phi_registry *reg, const char *spec, tpk_ctx *ctx)
{
    if (!spec) {
        TPK_ERROR(ctx, TPK_EINVAL, "phi spec is NULL");
        return NULL;
    }
    const char *s = skip_ws(spec), *name = s;
    while (isalnum((unsigned char)*s) || *s == '_')
        s++;
    size_t nlen = (size_t)(s - name);
    if (nlen == 0) {
        TPK_ERROR(ctx, TPK_EINVAL, "phi spec '%s': expected a name at column %d", spec,
                  (int)(name - spec) + 1);
        return NULL;
    }
    double vals[TPK_PHI_MAXPARAMS + 1];
    int nvals = 0;
    s = skip_ws(s);
    if (*s == '(') {
        s = skip_ws(s + 1);
        if (*s != ')') {
            for (;;) {
                char *end;
                double v = strtod(s, &end);
                if (end == s) {
                    TPK_ERROR(ctx, TPK_EINVAL, "phi spec '%s': expected a number at column %d", spec,
                              (int)(s - spec) + 1);
                    return NULL;
                }
                if (!isfinite(v)) {
                    TPK_ERROR(ctx, TPK_EINVAL, "phi spec '%s': parameter %d is not finite", spec,
                              nvals + 1);
                    return NULL;
                }
                if (nvals == TPK_PHI_MAXPARAMS) {
                    TPK_ERROR(ctx, TPK_EINVAL, "phi spec '%s': more than %d parameters", spec,
                              TPK_PHI_MAXPARAMS);
                    return NULL;
                }
                vals[nvals++] = v;
                s = skip_ws(end);
                if (*s == ',') {
                    s = skip_ws(s + 1);
                    continue;
                }
                if (*s == ')')
                    break;
                TPK_ERROR(ctx, TPK_EINVAL, "phi spec '%s': expected ',' or ')' at column %d", spec,
                          (int)(s - spec) + 1);
                return NULL;
            }
        }
        s = skip_ws(s + 1);
    }
    int primes = 0;
    while (*s == '\'') {
        primes++;
        s = skip_ws(s + 1);
    }
    if (*s != '\0') {
        TPK_ERROR(ctx, TPK_EINVAL, "phi spec '%s': unexpected '%c' at column %d", spec, *s,
                  (int)(s - spec) + 1);
        return NULL;
    }
    const phi_def *d = registry_find(reg, name, nlen);
    if (!d) {
        unknown_phi(reg, name, nlen, ctx);
        return NULL;
    }
    if (nvals > d->nparams) {
        TPK_ERROR(ctx, TPK_EINVAL, "phi '%s' takes %d parameter%s, got %d", d->name, d->nparams,
                  d->nparams == 1 ? "" : "s", nvals);
        return NULL;
    }
    tpk_phi *phi = tpk_calloc(ctx, 1, sizeof *phi);
    if (!phi) {
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory allocating phi '%s'", d->name);
        return NULL;
    }
    phi->def = *d;
    phi->al = tpk_ctx_allocator(ctx);
    if (d->variant == -1) {
        const user_entry *ue = (const user_entry *)d;
        phi->dfn = ue->dfn;
        phi->dflags = ue->dflags;
    }
    for (int i = 0; i < d->nparams; i++)
        phi->p[i] = i < nvals ? vals[i] : d->defaults[i];
    int len = snprintf(phi->canon, sizeof phi->canon, "%s", d->name);
    for (int i = 0; i < d->nparams; i++) {
        char num[32];
        fmt_double(num, sizeof num, phi->p[i]);
        len += snprintf(phi->canon + len, sizeof phi->canon - (size_t)len, "%s%s", i ? "," : "(", num);
    }
    if (d->nparams)
        snprintf(phi->canon + len, sizeof phi->canon - (size_t)len, ")");
    phi_bind(phi);
    if (primes == 0)
        return phi;
    if (primes > 1) {
        TPK_ERROR(ctx, TPK_EUNSUPPORTED, "phi spec '%s': only first derivatives are available", spec);
        tpk_phi_free(phi);
        return NULL;
    }
    tpk_phi *dphi = tpk_phi_derivative(phi, ctx);
    tpk_phi_free(phi);
    return dphi;
}

void tpk_phi_free(tpk_phi *phi)
{
    if (phi != NULL) {
        tpk_allocator al = phi->al;
        tpk_mem_free(&al, phi);
    }
}
const char *tpk_phi_name(const tpk_phi *phi) { return phi->canon; }
double tpk_phi_eval(const tpk_phi *phi, double x)
{
    if (phi->ufn)
        return numdiff(phi->ufn, phi->p, (phi->def.flags & F_S) != 0, x, NULL);
    return phi->def.fn(x, phi->p);
}

double tpk_phi_eval_err(const tpk_phi *phi, double x, double *err)
{
    if (phi->ufn) {
        double e;
        const double v = numdiff(phi->ufn, phi->p, (phi->def.flags & F_S) != 0, x, &e);
        if (err)
            *err = e;
        return v;
    }
    if (err)
        *err = 0.0;
    return phi->def.fn(x, phi->p);
}

int tpk_phi_is_derivative(const tpk_phi *phi) { return phi->deriv; }
double tpk__phi_eval_rtol(const tpk_phi *phi) { return phi->ufn ? GAUSS_NUMDIFF_RTOL : 0.0; }

/* The same functions as the scalar ones above, a vector of lanes at a time: the interpreters
 * evaluate φ over blocks of samples (netsor/exec_rpn.c), and a call per entry through the
 * registry's pointer cost a third of an LSTM kernel's time (perf: erfc, expm1 inside tanh).
 * libmvec's functions are within 4 ulp of the scalar ones (tests/test_gauss.c checks every
 * built-in against tpk_phi_eval). */
/* The derivatives the backward pass of an NTK evaluates most (netsor run --ntk): relu′ and its
 * piecewise-constant kin, erf′, tanh′, sigmoid′, by the same formulas as the scalar ones. */
static void eval_n_deriv(const tpk_phi *phi, size_t n, const double *x, double *y)
{
    const double *p = phi->p;
    if (phi->kind == GK_STEPMIX) {
        const double a = p[0], b = p[1], c = p[2];
#pragma omp simd
        for (size_t i = 0; i < n; i++)
            y[i] = x[i] < 0 ? a : x[i] > 0 ? b : c;
        return;
    }
    if (phi->kind == GK_EXPSQ) {
        const double a = p[0], b = p[1];
#pragma omp simd
        for (size_t i = 0; i < n; i++)
            y[i] = a * exp(b * x[i] * x[i]);
        return;
    }
    switch (phi->ufn ? -1 : phi->def.variant) {
    case B_TANH:
#pragma omp simd
        for (size_t i = 0; i < n; i++) {
            const double e = exp(-2.0 * fabs(x[i]));
            y[i] = 4.0 * e / ((1.0 + e) * (1.0 + e));
        }
        return;
    case B_SIGMOID:
#pragma omp simd
        for (size_t i = 0; i < n; i++) {
            const double e = exp(-fabs(x[i]));
            y[i] = e / ((1.0 + e) * (1.0 + e));
        }
        return;
    default:
        for (size_t i = 0; i < n; i++)
            y[i] = tpk_phi_eval(phi, x[i]);
    }
}

void tpk_phi_eval_n(const tpk_phi *phi, size_t n, const double *x, double *y)
{
    const double *p = phi->p;
    if (phi->deriv) {
        eval_n_deriv(phi, n, x, y);
        return;
    }
    switch (phi->def.variant) {
    case B_IDENTITY:
        if (y != x)
            memmove(y, x, n * sizeof *y);
        return;
    case B_RELU:
    case B_ARCCOS1:
#pragma omp simd
        for (size_t i = 0; i < n; i++)
            y[i] = x[i] > 0 ? x[i] : 0.0;
        return;
    case B_TANH:
#pragma omp simd
        for (size_t i = 0; i < n; i++)
            y[i] = tanh(x[i]);
        return;
    case B_ERF: {
        const double b = p[0];
#pragma omp simd
        for (size_t i = 0; i < n; i++)
            y[i] = erf(b * x[i]);
        return;
    }
    case B_ERF_SIGMOID:
#pragma omp simd
        for (size_t i = 0; i < n; i++)
            y[i] = 0.5 * erfc(-x[i]);
        return;
    case B_GELU:
#pragma omp simd
        for (size_t i = 0; i < n; i++)
            y[i] = 0.5 * x[i] * erfc(-x[i] / SQRT2);
        return;
    case B_EXP: {
        const double a = p[0], b = p[1];
#pragma omp simd
        for (size_t i = 0; i < n; i++)
            y[i] = a * exp(b * x[i]);
        return;
    }
    case B_SIGMOID:
#pragma omp simd
        for (size_t i = 0; i < n; i++) {
            /* both branches of sigmoid(): exp of a non-positive argument, no overflow */
            const double e = exp(-fabs(x[i]));
            y[i] = x[i] >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
        }
        return;
    default:
        for (size_t i = 0; i < n; i++)
            y[i] = phi->def.fn(x[i], p);
    }
}
unsigned tpk_phi_flags(const tpk_phi *phi) { return phi->flags; }
int tpk_phi_has_closed_form(const tpk_phi *phi) { return phi->kind != GK_NUMERIC; }
