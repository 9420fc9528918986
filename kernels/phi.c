/* The φ registry: built-in and user scalar nonlinearities, their flags and closed-form kinds, and
 * the spec parser ("erf(2.0)", "leaky(0.1)") that binds a name and parameters to a tpk_phi. The
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

struct tpk_phi_registry {
    phi_def *user;
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
        if (strlen(reg->user[i].name) == len && memcmp(reg->user[i].name, name, len) == 0)
            return &reg->user[i];
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
        phi_def *u = tpk_mem_realloc(&reg->al, reg->user, cap * sizeof *u, ctx);
        if (!u)
            return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory registering phi '%s'", name);
        reg->user = u;
        reg->cap = cap;
    }
    phi_def *d = &reg->user[reg->nuser++];
    memset(d, 0, sizeof *d);
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
        list_one(f, &reg->user[i]);
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
        add_suggestion(sugg, sizeof sugg, reg->user[i].name, name, len);
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
        phi->kind = GK_MONO; phi->m = 2 + (phi->def.variant - B_X2);
        break;
    default: break;
    }
    if (phi->kind == GK_ABRELU && phi->ca == phi->cb)
        phi->flags |= F_S; /* linear */
}

/* spec := name [ '(' [ number { ',' number } ] ')' ], blanks allowed around tokens. */
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
    return phi;
}

void tpk_phi_free(tpk_phi *phi)
{
    if (phi != NULL) {
        tpk_allocator al = phi->al;
        tpk_mem_free(&al, phi);
    }
}
const char *tpk_phi_name(const tpk_phi *phi) { return phi->canon; }
double tpk_phi_eval(const tpk_phi *phi, double x) { return phi->def.fn(x, phi->p); }

/* The same functions as the scalar ones above, a vector of lanes at a time: the interpreters
 * evaluate φ over blocks of samples (netsor/exec_rpn.c), and a call per entry through the
 * registry's pointer cost a third of an LSTM kernel's time (perf: erfc, expm1 inside tanh).
 * libmvec's functions are within 4 ulp of the scalar ones (tests/test_gauss.c checks every
 * built-in against tpk_phi_eval). */
void tpk_phi_eval_n(const tpk_phi *phi, size_t n, const double *x, double *y)
{
    const double *p = phi->p;
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
