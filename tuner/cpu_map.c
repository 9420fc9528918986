/* The cpu_map template (op relu_map): the ReLU NNGP map over the lower triangle of an N×N
 * covariance, out_ij = α/(2π)·√(q_i q_j)·J(ρ_ij) + β, J(ρ) = sin θ + (π − θ) cos θ, cos θ = ρ
 * (Cho & Saul 2009 arc-cosine kernel of degree 1; theory.md §3.2), as kernels/gauss_map.c computes
 * it for relu. Knob table, constraints, analytic default, features, the C emitter (GCC vector
 * extensions; libmvec or a rational arcsine), the kernel names, and the measuring child. */
#include "tune_impl.h"

#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { K_VW, K_MB, K_NB, K_ACOS, K_RQ, K_UN, K_SPLIT, K_SCHED, K_CHUNK, K_COUNT };
enum { ACOS_POLY = 0, ACOS_MVEC = 1, ACOS_ATAN2 = 2 };
enum { SPLIT_ROWS = 0, SPLIT_TILES = 1, SPLIT_BALANCED = 2 };
enum { SCHED_STATIC = 0, SCHED_DYNAMIC = 1 };

static const char *const acos_labels[] = {"poly", "mvec", "atan2"};
static const char *const rq_labels[] = {"sqrt", "pre"};
static const char *const split_labels[] = {"rows", "tiles", "balanced"};
static const char *const sched_labels[] = {"static", "dynamic"};

/* PSD check as kernels/gauss_map.c (GAUSS_PSD_RTOL): |k| ≤ (1 + tol)√(q_i q_j). In f32 the
 * product √q_i √q_j itself carries a few ulp (6e-8 each), so the f32 check allows 1e-5. */
#define PSD_RTOL_F64 1e-10
#define PSD_RTOL_F32 1e-5
/* |ρ| within this of 1 is ±1 (8 ulp of 1: the rounding of ρ itself; gauss_impl.h RHO_SNAP). */
#define SNAP_F64 "1.7763568394002505e-15"
#define SNAP_F32 "9.5367431640625e-07f"

static void set_knob(tpk_tune_knob *k, const char *name, const int *c, int n, const char *const *labels)
{
    k->name = name;
    k->ncand = n;
    memcpy(k->cand, c, (size_t)n * sizeof *c);
    k->labels = labels;
}

typedef struct map_cfg {
    int es, vl, mb, nb, acos, rq, un, split, sched, chunk;
} map_cfg;

static void cfg_of(const tpk_tune_space *s, const tpk_tune_config *c, map_cfg *m)
{
    m->es = s->task.dtype == TPK_TUNE_F32 ? 4 : 8;
    m->vl = c->v[K_VW] / (8 * m->es);
    m->mb = c->v[K_MB];
    m->nb = c->v[K_NB];
    m->acos = c->v[K_ACOS];
    m->rq = c->v[K_RQ];
    m->un = c->v[K_UN];
    m->split = c->v[K_SPLIT];
    m->sched = c->v[K_SCHED];
    m->chunk = c->v[K_CHUNK];
}

static int map_valid(const tpk_tune_space *s, const tpk_tune_config *c)
{
    map_cfg m;
    cfg_of(s, c, &m);
    const size_t n = s->task.m;
    if (c->v[K_VW] > s->machine.vector_bits) /* no wider vector than the class has */
        return 0;
    /* the balanced split assigns rows itself: the schedule knobs would only duplicate points */
    if (m.split == SPLIT_BALANCED && (m.sched != SCHED_STATIC || m.chunk != 1))
        return 0;
    /* blocks much larger than the problem duplicate a smaller block: keep the smallest */
    if (m.mb > 4 && (size_t)m.mb / 2 >= n)
        return 0;
    if (m.nb > 64 && (size_t)m.nb / 2 >= n)
        return 0;
    /* the S tile should stay within L2 */
    if ((double)m.mb * m.nb * m.es > 2.0 * 1024 * 1024)
        return 0;
    return 1;
}

/* Largest per-thread share of the triangle's entries over the mean, for a split and schedule
 * (dynamic: a chunk of the largest unit late is the worst case). */
static double triangle_balance(const map_cfg *m, size_t n, int th)
{
    if (th <= 1)
        return 1.0;
    const double total = (double)n * ((double)n + 1) / 2, mean = total / th;
    if (m->split == SPLIT_BALANCED)
        return 1.0 + (double)m->mb * (double)n / mean; /* rounding bounds to row blocks */
    size_t nrb = (n + (size_t)m->mb - 1) / (size_t)m->mb;
    double load[64] = {0};
    const int T = th > 64 ? 64 : th;
    if (m->split == SPLIT_ROWS) {
        if (m->sched == SCHED_DYNAMIC) {
            double big = (double)m->mb * (double)n * m->chunk;
            return (mean + big) / mean;
        }
        for (size_t b = 0; b < nrb; b++) {
            double i1 = fmin((double)(b + 1) * m->mb, (double)n), i0 = (double)b * m->mb;
            double ent = (i1 * (i1 + 1) - i0 * (i0 + 1)) / 2;
            load[(b / (size_t)m->chunk) % (size_t)T] += ent;
        }
    } else {
        double tile = (double)m->mb * m->nb;
        if (m->sched == SCHED_DYNAMIC)
            return (mean + tile * m->chunk) / mean;
        /* tiles of (about) equal size dealt in chunks round robin: the busiest thread gets
         * ⌈chunks / T⌉ chunks (cheap: the annealer evaluates features ~10⁵ times) */
        double ntile = 0;
        for (size_t b = 0; b < nrb; b++)
            ntile += ceil(fmin((double)(b + 1) * m->mb, (double)n) / m->nb);
        const double nchunk = ceil(ntile / m->chunk);
        return fmin(ceil(nchunk / T) * m->chunk, ntile) / (ntile / T);
    }
    double mx = 0;
    for (int i = 0; i < T; i++)
        mx = fmax(mx, load[i]);
    return mx / mean;
}

/* Features that keep their meaning across N (tuner-notes §3): knob logs and one-hots, bytes per
 * entry from memory and from the column vectors, tile footprints against L1/L2, edge waste of
 * the diagonal tails, triangle balance, vector width, loop overheads. */
static int map_features(const tpk_tune_space *s, const tpk_tune_config *c, float *f, int cap)
{
    map_cfg m;
    cfg_of(s, c, &m);
    const tpk_machine ca = s->machine;
    const double n = (double)s->task.m, es = m.es, th = s->task.threads > 0 ? s->task.threads : 1;
    const double entries = n * (n + 1) / 2;
    double v[TPK_TUNE_MAX_FEATURES];
    int i = 0;
    v[i++] = tpk__log2(c->v[K_VW]);
    v[i++] = tpk__log2(m.mb);
    v[i++] = tpk__log2(m.nb);
    v[i++] = m.acos == ACOS_POLY;
    v[i++] = m.acos == ACOS_MVEC;
    v[i++] = m.acos == ACOS_ATAN2;
    v[i++] = m.rq;
    v[i++] = tpk__log2(m.un);
    v[i++] = m.split;
    v[i++] = m.sched;
    v[i++] = tpk__log2(m.chunk);
    v[i++] = tpk__log2(n);
    v[i++] = th;
    v[i++] = es;
    v[i++] = m.vl;
    /* bytes per entry: S read + out written from memory; column vectors (q, or 1/√q and √q)
     * re-read per row of a tile, from L1 when the block's vectors fit */
    double colb = (m.rq ? 2 : 1) * es;
    v[i++] = 2 * es;
    v[i++] = colb;
    v[i++] = colb * m.nb / ca.l1;             /* column vectors of a block vs L1 */
    v[i++] = (double)m.mb * m.nb * es / ca.l2; /* S tile vs L2 */
    v[i++] = (double)m.mb * m.nb * es * 2 / ca.l1;
    v[i++] = tpk__log2(n * n * es / ca.l2);   /* matrix vs L2: streaming or resident */
    /* edge waste: one padded tail per row and column block on the diagonal */
    v[i++] = n * m.vl / 2 / entries;
    v[i++] = n * (m.un * m.vl) / 2 / entries;
    /* balance and work units */
    v[i++] = triangle_balance(&m, s->task.m, (int)th);
    double units = m.split == SPLIT_TILES ? entries / ((double)m.mb * m.nb) : ceil(n / m.mb);
    v[i++] = tpk__log2(units);
    v[i++] = units / (ceil(units / th) * th);
    /* loop overheads: rows × column blocks (the calls of the row kernel) per entry */
    v[i++] = tpk__log2(n * ceil(n / m.nb) / 2);
    v[i++] = (m.rq ? 1.0 : 2.0) / m.vl; /* sqrt/div per entry per lane */
    int nf = i < cap ? i : cap;
    for (int j = 0; j < nf; j++)
        f[j] = (float)v[j];
    return nf;
}

static int cpu_map_space(tpk_tune_space *s, const tpk_tune_task *t, tpk_ctx *ctx)
{
    (void)ctx;
    static const int vw[] = {256, 512};
    static const int mb[] = {4, 8, 16, 32, 64, 128};
    static const int nb[] = {64, 128, 256, 512, 1024, 2048, 4096};
    static const int acos_v[] = {ACOS_POLY, ACOS_MVEC, ACOS_ATAN2};
    static const int rq[] = {0, 1};
    static const int un[] = {1, 2, 4};
    static const int split[] = {SPLIT_ROWS, SPLIT_TILES, SPLIT_BALANCED};
    static const int sched[] = {SCHED_STATIC, SCHED_DYNAMIC};
    static const int chunk[] = {1, 4, 16};
    s->task = *t;
    s->task.k = 1;
    if (s->task.threads < 1)
        s->task.threads = 1;
    s->template_name = "cpu_map";
    s->nknob = K_COUNT;
    set_knob(&s->knob[K_VW], "vw", vw, 2, NULL);
    set_knob(&s->knob[K_MB], "mb", mb, 6, NULL);
    set_knob(&s->knob[K_NB], "nb", nb, 7, NULL);
    set_knob(&s->knob[K_ACOS], "acos", acos_v, 3, acos_labels);
    set_knob(&s->knob[K_RQ], "rq", rq, 2, rq_labels);
    set_knob(&s->knob[K_UN], "un", un, 3, NULL);
    /* With one thread the split and the schedule do not matter: one candidate each. */
    const int par = s->task.threads > 1;
    set_knob(&s->knob[K_SPLIT], "split", split, par ? 3 : 1, split_labels);
    set_knob(&s->knob[K_SCHED], "sched", sched, par ? 2 : 1, sched_labels);
    set_knob(&s->knob[K_CHUNK], "chunk", chunk, par ? 3 : 1, NULL);
    s->valid = map_valid;
    s->features = map_features;
    return TPK_OK;
}

static void cpu_map_default(const tpk_tune_space *s, tpk_tune_config *c)
{
    const tpk_machine ca = s->machine;
    memset(c, 0, sizeof *c);
    for (int i = 0; i < s->nknob; i++)
        c->v[i] = s->knob[i].cand[0];
    c->v[K_VW] = ca.vector_bits >= 512 ? 512 : 256;
    c->v[K_MB] = 16;
    /* the column vectors of a block (1/√q and √q) in a quarter of L1 */
    const int es = s->task.dtype == TPK_TUNE_F32 ? 4 : 8;
    int nb = 64;
    while (nb < 4096 && 2.0 * (2 * nb) * es <= 0.25 * ca.l1)
        nb *= 2;
    c->v[K_NB] = nb;
    c->v[K_ACOS] = ACOS_POLY; /* no libmvec needed */
    c->v[K_RQ] = 1;
    c->v[K_UN] = 2;
    c->v[K_SPLIT] = SPLIT_ROWS;
    c->v[K_SCHED] = s->task.threads > 1 ? SCHED_DYNAMIC : SCHED_STATIC; /* one thread: one candidate */
    c->v[K_CHUNK] = 1;
    while (!tpk_tune_space_valid(s, c) && c->v[K_NB] > 64)
        c->v[K_NB] /= 2;
    while (!tpk_tune_space_valid(s, c) && c->v[K_MB] > 4)
        c->v[K_MB] /= 2;
    while (!tpk_tune_space_valid(s, c) && c->v[K_UN] > 1)
        c->v[K_UN] /= 2;
}

/* Kernel names say what they are (style.md §12). */
void tpk__cpu_map_kernel_name(const tpk_tune_space *s, const tpk_tune_config *c, char *out, size_t cap)
{
    map_cfg m;
    cfg_of(s, c, &m);
    snprintf(out, cap, "tpk_%crelu_map_avx%d_%dx%d_%s_%s_u%d_%s%s%s%s", m.es == 4 ? 's' : 'd',
             c->v[K_VW] == 512 ? 512 : 2, m.mb, m.nb, acos_labels[m.acos], rq_labels[m.rq], m.un,
             split_labels[m.split], m.split == SPLIT_BALANCED ? "" : "_",
             m.split == SPLIT_BALANCED ? "" : sched_labels[m.sched],
             m.split == SPLIT_BALANCED ? "" : (m.chunk == 1 ? "1" : m.chunk == 4 ? "4" : "16"));
}

/* ---- emitter ------------------------------------------------------------------------------ */

typedef struct vty {
    const char *V, *I, *T, *sfx; /* vector, lane-mask vector, element, literal suffix */
    int lanes, bytes;
    const char *sqrt_fn, *mm; /* intrinsic and its vector type */
    const char *acos_fn, *atan2_fn; /* libmvec (x86_64 vector ABI names) */
} vty;

static const vty VTY[4] = {
    {"tpk_v4d", "tpk_v4l", "double", "", 4, 32, "_mm256_sqrt_pd", "__m256d", "_ZGVdN4v_acos", "_ZGVdN4vv_atan2"},
    {"tpk_v8d", "tpk_v8l", "double", "", 8, 64, "_mm512_sqrt_pd", "__m512d", "_ZGVeN8v_acos", "_ZGVeN8vv_atan2"},
    {"tpk_v8f", "tpk_v8i", "float", "f", 8, 32, "_mm256_sqrt_ps", "__m256", "_ZGVdN8v_acosf", "_ZGVdN8vv_atan2f"},
    {"tpk_v16f", "tpk_v16i", "float", "f", 16, 64, "_mm512_sqrt_ps", "__m512", "_ZGVeN16v_acosf", "_ZGVeN16vv_atan2f"},
};

static const vty *vty_of(int es, int vl)
{
    return es == 8 ? &VTY[vl == 8] : &VTY[2 + (vl == 16)];
}

/* Shared by every map kernel of a file: lane masks, select, sqrt, and π − θ three ways. */
void tpk__cpu_map_prelude(FILE *o)
{
    fputs("#include <math.h>\n#include <immintrin.h>\n\n"
          "/* Lane masks (what a vector comparison yields) and a lane select. */\n"
          "typedef long long tpk_v4l __attribute__((vector_size(32)));\n"
          "typedef long long tpk_v8l __attribute__((vector_size(64)));\n"
          "typedef int tpk_v8i __attribute__((vector_size(32)));\n"
          "typedef int tpk_v16i __attribute__((vector_size(64)));\n\n"
          "/* libmvec (glibc's vector math, x86_64 vector ABI): acos and atan2. */\n", o);
    /* 512-bit helpers only where the class's flags enable AVX-512: passing those vectors by value
     * is ABI-defined only there (an AVX2 class's file compiles without them). */
    for (int t = 0; t < 4; t++)
        fprintf(o, "%s%s %s(%s);\n%s %s(%s, %s);\n%s", VTY[t].bytes == 64 ? "#ifdef __AVX512F__\n" : "",
                VTY[t].V, VTY[t].acos_fn, VTY[t].V, VTY[t].V, VTY[t].atan2_fn, VTY[t].V, VTY[t].V,
                VTY[t].bytes == 64 ? "#endif\n" : "");
    fputs("\n", o);
    for (int t = 0; t < 4; t++) {
        const vty *y = &VTY[t];
        if (y->bytes == 64)
            fputs("#ifdef __AVX512F__\n", o);
        const char *V = y->V, *I = y->I, *f = y->sfx;
        fprintf(o, "static inline %s %s_sel(%s m, %s a, %s b)\n{\n    return (%s)((m & (%s)a) | (~m & (%s)b));\n}\n", V, V,
                I, V, V, V, I, I);
        fprintf(o, "static inline %s %s_sqrt(%s x)\n{\n    return (%s)%s((%s)x);\n}\n", V, V, V, V, y->sqrt_fn, y->mm);
        /* fdlibm / musl asin: R(z) rational in z, asin x = x + x R(x²) for |x| ≤ 1/2, and
         * asin|x| = π/2 − 2(s + s R(z)), z = (1 − |x|)/2, s = √z above. */
        fprintf(o, "/* π − θ = π/2 + asin x, θ = acos x: the rational arcsine of fdlibm (musl src/math/asin%s.c). */\n"
                   "static inline %s %s_pmt_poly(%s x)\n{\n"
                   "    const %s ax = %s_sel(x < 0%s, -x, x);\n"
                   "    const %s small = ax <= 0.5%s;\n"
                   "    const %s z = %s_sel(small, x * x, 0.5%s * (1.0%s - ax));\n",
                t >= 2 ? "f" : "", V, V, V, V, V, t >= 2 ? ".0f" : ".0", I, f, V, V, f, f);
        if (t < 2)
            fprintf(o, "    const %s p = z * (1.66666666666666657415e-01 + z * (-3.25565818622400915405e-01 +\n"
                       "        z * (2.01212532134862925881e-01 + z * (-4.00555345006794114027e-02 +\n"
                       "        z * (7.91534994289814532176e-04 + z * 3.47933107596021167570e-05)))));\n"
                       "    const %s q = 1.0 + z * (-2.40339491173441421878e+00 + z * (2.02094576023350569471e+00 +\n"
                       "        z * (-6.88283971605453293030e-01 + z * 7.70381505559019352791e-02)));\n"
                       "    const double pio2 = 1.57079632679489661923, pi = 3.14159265358979323846;\n", V, V);
        else
            fprintf(o, "    const %s p = z * (1.6666586697e-01f + z * (-4.2743422091e-02f + z * -8.6563630030e-03f));\n"
                       "    const %s q = 1.0f + z * -7.0662963390e-01f;\n"
                       "    const float pio2 = 1.57079632679489661923f, pi = 3.14159265358979323846f;\n", V, V);
        fprintf(o, "    const %s s = %s_sel(small, x, %s_sqrt(z));\n"
                   "    const %s u = s + s * (p / q);\n"
                   "    return %s_sel(small, pio2 + u, %s_sel(x > 0%s, pi - 2.0%s * u, 2.0%s * u));\n}\n",
                V, V, V, V, V, V, t >= 2 ? ".0f" : ".0", f, f);
        fprintf(o, "/* π − θ from libmvec's acos, and from atan2(sin θ, cos θ). */\n"
                   "static inline %s %s_pmt_mvec(%s x)\n{\n    return %s - %s(x);\n}\n"
                   "static inline %s %s_pmt_atan2(%s x, %s w)\n{\n    return %s - %s(w, x);\n}\n\n",
                V, V, V, t >= 2 ? "3.14159265358979323846f" : "3.14159265358979323846", y->acos_fn, V, V, V, V,
                t >= 2 ? "3.14159265358979323846f" : "3.14159265358979323846", y->atan2_fn);
        if (y->bytes == 64)
            fputs("#endif\n\n", o);
    }
}

/* What the kernel and its Z_p twin (tpk__cpu_map_emit_twin) do differently: the types and the
 * arithmetic of an entry, the diagonal and the column vectors. The loop nest — rows, unrolled
 * loops, tails, the diagonal's place, blocks, the parallel split, the flag reduction — is emitted
 * once for both (emit_rows, emit_driver), mutation sites included. */
typedef struct map_flav {
    const char *V, *I, *T; /* vector, lane mask, element */
    char a2p[64];          /* the entry's factor of alpha */
    char lim[64], lim2[64];/* the PSD bounds (rq pre / sqrt) */
    char diag[96];         /* the diagonal entry */
    char prep[160];        /* rs[i] and ra[i] from q[i] */
} map_flav;

static void flav_real(const map_cfg *m, map_flav *fl)
{
    const vty *y = vty_of(m->es, m->vl);
    const double tol = m->es == 4 ? PSD_RTOL_F32 : PSD_RTOL_F64;
    fl->V = y->V, fl->I = y->I, fl->T = y->T;
    snprintf(fl->a2p, sizeof fl->a2p, "alpha * (%s)0.15915494309189533577", y->T);
    snprintf(fl->lim, sizeof fl->lim, "(%s)%.17g * rs[i]", y->T, 1 + tol);
    snprintf(fl->lim2, sizeof fl->lim2, "(%s)%.17g", y->T, (1 + tol) * (1 + tol));
    snprintf(fl->diag, sizeof fl->diag, "alpha * (q[i] * (%s)0.5) + beta", y->T);
    snprintf(fl->prep, sizeof fl->prep, "        rs[i] = sqrt%s(q[i]);\n        ra[i] = q[i] > 0 ? 1 / rs[i] : 0;\n",
             m->es == 4 ? "f" : "");
}

/* Rows i0..i1 of the column block j0..j1. Mutation sites (tune_impl.h) rely on the twin checks of
 * tuner/verify.c: n = 37 and n = nb + mb + 3 (rows longer than a column block, several row
 * blocks, tails of every length), out of place with lds ≠ ldo, in place, and a flagged entry in
 * every lane. */
static void emit_rows(FILE *o, const char *fn, const map_cfg *m, const map_flav *fl, tpk__mutation *mu)
{
    const char *V = fl->V, *I = fl->I, *T = fl->T;
    const int L = m->vl;
    char t[192], x[192];
    const char *colc = m->rq ? "ra" : "q";
    fprintf(o, "/* Rows [i0, i1) × columns [j0, min(j1, i)) of the map; the diagonal α q_i/2 + β when in the block. */\n"
               "static void %s_rows(size_t i0, size_t i1, size_t j0, size_t j1, const %s *S, size_t lds, %s *out,\n"
               "        size_t ldo, const %s *q, const %s *ra, const %s *rs, %s alpha, %s beta, %s *bad)\n{\n"
               "    const %s zero = {0};\n"
               "    const %s a2p = zero + %s, bv = zero + beta;\n",
            fn, T, T, T, T, T, T, T, I, V, V, fl->a2p);
    if (!m->rq)
        fprintf(o, "    (void)ra;\n    (void)rs;\n    const %s lim2 = zero + %s;\n", V, fl->lim2);
    /* the row end one short (entry (i, i − 1)); S's and out's row strides swapped */
    const char *je = tpk__site(mu, TPK__MUT_MAP_ROW_END, 1, "j1 < i ? j1 : i", "j1 < i ? j1 : (i ? i - 1 : 0)");
    const char *sst = tpk__site(mu, TPK__MUT_MAP_ROW_STRIDE, 1, "lds", "(ldo + 0 * lds)"); /* lds still used */
    const char *ost = tpk__site(mu, TPK__MUT_MAP_ROW_STRIDE, 1, "ldo", "(lds + 0 * ldo)");
    fprintf(o, "    for (size_t i = i0; i < i1; i++) {\n"
               "        const size_t je = %s; /* strictly below the diagonal */\n"
               "        const %s *srow = S + i * %s;\n"
               "        %s *orow = out + i * %s;\n", je, T, sst, T, ost);
    if (m->rq)
        fprintf(o, "        const %s ci = zero + ra[i], si = zero + rs[i], lim = zero + %s;\n", V, fl->lim);
    else
        fprintf(o, "        const %s ci = zero + q[i];\n", V);
    const char *args = m->rq ? "ci, %s_ld(ra + j%s%s), si, %s_ld(rs + j%s), lim, a2p, bv, bad"
                             : "ci, %s_ld(q + j%s%s), lim2, a2p, bv, bad";
    fprintf(o, "        size_t j = j0;\n");
    for (int pass = 0; pass < 2; pass++) {
        int U = pass == 0 ? m->un : 1;
        if (pass == 0 && m->un == 1)
            continue;
        /* sites of the first loop: its step one long (an entry skipped: needs rows longer than
         * U·L within a block), the second load of an unrolled step from the first one's place,
         * the first column vector misaligned */
        const int first = pass == 0 || m->un == 1;
        snprintf(t, sizeof t, "        for (; j + %d <= je; j += %d) {\n", U * L, U * L);
        snprintf(x, sizeof x, "        for (; j + %d <= je; j += %d) {\n", U * L, U * L + 1);
        fputs(tpk__site(mu, TPK__MUT_MAP_STEP, first && m->nb > U * L, t, x), o);
        for (int u = 0; u < U; u++) {
            char off[32] = "";
            if (u)
                snprintf(off, sizeof off, " + %d", u * L);
            const int again = pass == 0 && u == 1 && tpk__mut_at(mu, TPK__MUT_MAP_UNROLL_LOAD, 1);
            fprintf(o, "            const %s k%d = %s_ld(srow + j%s);\n", V, u, V, again ? "" : off);
        }
        for (int u = 0; u < U; u++) {
            char off[32] = "", a[256];
            if (u)
                snprintf(off, sizeof off, " + %d", u * L);
            const char *mis = first && u == 0 && tpk__mut_at(mu, TPK__MUT_MAP_COL_LOAD, 1) ? " + 1" : "";
            if (m->rq)
                snprintf(a, sizeof a, args, V, off, mis, V, off);
            else
                snprintf(a, sizeof a, args, V, off, mis);
            fprintf(o, "            %s_st(orow + j%s, %s_ent(k%d, %s));\n", V, off, fn, u, a);
        }
        fprintf(o, "        }\n");
    }
    /* tail: padded lanes k = 0 with zero column scales give β, flag nothing. Sites: the tail's S
     * value, or its column vector, read one to the right; its last entry not stored; every lane
     * stored (past the diagonal: the upper triangle) */
    const char *tl = tpk__site(mu, TPK__MUT_MAP_TAIL_LOAD, 1, "j + l", "j + l + 1");
    const char *tc = tpk__site(mu, TPK__MUT_MAP_TAIL_COL, 1, "j + l", "j + l + 1");
    const char *td = tpk__site(mu, TPK__MUT_MAP_TAIL_COL, m->rq, "j + l", "j + l + 1"); /* sqrt: td unused */
    fprintf(o, "        if (j < je) {\n"
               "            %s tk[%d] = {0}, tc[%d] = {0}, td[%d] = {0}, to[%d];\n"
               "            for (size_t l = 0; j + l < je; l++) {\n"
               "                tk[l] = srow[%s];\n"
               "                tc[l] = %s[%s];\n"
               "                td[l] = %s[%s];\n"
               "            }\n",
            T, L, L, L, L, tl, colc, tc, m->rq ? "rs" : "q", td);
    if (m->rq)
        fprintf(o, "            %s_st(to, %s_ent(%s_ld(tk), ci, %s_ld(tc), si, %s_ld(td), lim, a2p, bv, bad));\n", V, fn, V, V, V);
    else
        fprintf(o, "            (void)td;\n            %s_st(to, %s_ent(%s_ld(tk), ci, %s_ld(tc), lim2, a2p, bv, bad));\n", V, fn, V, V);
    snprintf(x, sizeof x, "l < %d", L);
    const char *ts = tpk__site(mu, TPK__MUT_MAP_TAIL_STORE, 1, "j + l < je", "j + l + 1 < je");
    ts = tpk__site(mu, TPK__MUT_MAP_TAIL_MASK, 1, ts, x);
    /* the diagonal of a block's first row left out; stored one to the left */
    const char *dc = tpk__site(mu, TPK__MUT_MAP_DIAG_COND, 1, "i >= j0 && i < j1", "i > j0 && i < j1");
    const char *di = tpk__site(mu, TPK__MUT_MAP_DIAG_INDEX, 1, "i", "i - 1");
    fprintf(o, "            for (size_t l = 0; %s; l++)\n"
               "                orow[j + l] = to[l];\n"
               "        }\n"
               "        if (%s)\n"
               "            orow[%s] = %s;\n"
               "    }\n}\n\n", ts, dc, di, fl->diag);
}

/* Workspace size and the driver: the column vectors from the diagonal, the tile offsets, the
 * parallel split, the flag reduction. */
static void emit_driver(FILE *o, const char *fn, const char *ename, const char *st, int standalone, const map_cfg *m,
                        const map_flav *fl, tpk__mutation *mu)
{
    const char *T = fl->T, *I = fl->I;
    const int L = m->vl;
    char t[192], x[192];
    fprintf(o, "/* Workspace bytes: q, 1/√q and √q (n + %d each), and the row-block tile offsets. */\n", L);
    if (standalone)
        fprintf(o, "size_t tpk_kernel_ws(size_t n);\nint tpk_kernel(size_t n, const %s *S, size_t lds, %s alpha, %s beta, %s *out,\n"
                   "        size_t ldo, int nt, void *ws);\n\n", T, T, T, T);
    fprintf(o, "%ssize_t %s_ws(size_t n)\n{\n    return (3 * (n + %d) * sizeof(%s) + 63) / 64 * 64 + (n / %d + 2) * sizeof(size_t);\n}\n\n",
            st, ename, L, T, m->mb);
    /* sites: q read from the first column, not the diagonal; the last partial tile of every row
     * block left out (tiles split only) */
    const char *qr = tpk__site(mu, TPK__MUT_MAP_Q_READ, 1, "i * lds + i", "i * lds");
    snprintf(t, sizeof t, "(i1 + %d - 1) / %d", m->nb, m->nb);
    snprintf(x, sizeof x, "i1 / %d", m->nb);
    const char *tiles = tpk__site(mu, TPK__MUT_MAP_TILES, m->split == SPLIT_TILES, t, x);
    fprintf(o, "/* Lower triangle of out = α·V_relu(S) + β (out may be S); returns non-zero when a covariance\n"
               " * exceeds its bound or is NaN. */\n"
               "%sint %s(size_t n, const %s *S, size_t lds, %s alpha, %s beta, %s *out, size_t ldo, int nt,\n"
               "        void *ws)\n{\n"
               "    if (n == 0)\n        return 0;\n"
               "    if (nt < 1)\n        nt = 1;\n"
               "    %s *const q = ws, *const ra = q + n + %d, *const rs = ra + n + %d;\n"
               "    size_t *const pre = (size_t *)((char *)ws + (3 * (n + %d) * sizeof(%s) + 63) / 64 * 64);\n"
               "    const size_t nrb = (n + %d - 1) / %d;\n"
               "    for (size_t i = 0; i < n; i++) {\n"
               "        q[i] = S[%s];\n"
               "%s"
               "    }\n"
               "    /* tiles before row block b (column blocks of %d up to the block's last row) */\n"
               "    pre[0] = 0;\n"
               "    for (size_t b = 0; b < nrb; b++) {\n"
               "        const size_t i1 = (b + 1) * %d < n ? (b + 1) * %d : n;\n"
               "        pre[b + 1] = pre[b] + %s;\n"
               "    }\n"
               "    int bad = 0;\n"
               "#pragma omp parallel num_threads(nt) if (nt > 1) reduction(| : bad)\n"
               "    {\n"
               "        %s badv = {0};\n",
            st, ename, T, T, T, T, T, L, L, L, T, m->mb, m->mb, qr, fl->prep, m->nb, m->mb, m->mb, tiles, I);
    /* sites: the last row block one row short; each row block's last column block left out (the
     * one holding the diagonal); a block's last column left out (rows longer than a block); the
     * balanced split's first block left out */
    snprintf(t, sizeof t, "i0 + %d < n ? i0 + %d : n", m->mb, m->mb);
    snprintf(x, sizeof x, "i0 + %d < n ? i0 + %d : n - 1", m->mb, m->mb);
    const char *i1 = tpk__site(mu, TPK__MUT_MAP_BLOCK_ROWS, 1, t, x);
    const char *cb = tpk__site(mu, TPK__MUT_MAP_COL_BLOCKS, m->split != SPLIT_TILES, "j0 < i1", "j0 + %d < i1");
    char cbuf[64], j1[64], mj1[64];
    snprintf(cbuf, sizeof cbuf, cb, m->nb);
    snprintf(j1, sizeof j1, "j0 + %d", m->nb);
    snprintf(mj1, sizeof mj1, "j0 + %d - 1", m->nb);
    const char *je = tpk__site(mu, TPK__MUT_MAP_BLOCK_COLS, 1, j1, mj1);
    const char *sched = m->sched == SCHED_STATIC ? "static" : "dynamic";
    if (m->split == SPLIT_ROWS)
        fprintf(o, "        /* row blocks of the triangle, %s schedule, chunk %d */\n"
                   "#pragma omp for schedule(%s, %d)\n"
                   "        for (size_t b = 0; b < nrb; b++) {\n"
                   "            const size_t i0 = b * %d, i1 = %s;\n"
                   "            for (size_t j0 = 0; %s; j0 += %d)\n"
                   "                %s_rows(i0, i1, j0, %s, S, lds, out, ldo, q, ra, rs, alpha, beta, &badv);\n"
                   "        }\n",
                sched, m->chunk, sched, m->chunk, m->mb, i1, cbuf, m->nb, fn, je);
    else if (m->split == SPLIT_TILES)
        fprintf(o, "        /* tiles of the triangle, linearised row block by row block, %s schedule, chunk %d */\n"
                   "#pragma omp for schedule(%s, %d)\n"
                   "        for (size_t t = 0; t < pre[nrb]; t++) {\n"
                   "            size_t lo = 0, hi = nrb; /* the row block b with pre[b] <= t < pre[b + 1] */\n"
                   "            while (hi - lo > 1) {\n"
                   "                const size_t mid = (lo + hi) / 2;\n"
                   "                if (pre[mid] <= t)\n                    lo = mid;\n                else\n                    hi = mid;\n"
                   "            }\n"
                   "            const size_t i0 = lo * %d, i1 = %s, j0 = (t - pre[lo]) * %d;\n"
                   "            %s_rows(i0, i1, j0, %s, S, lds, out, ldo, q, ra, rs, alpha, beta, &badv);\n"
                   "        }\n",
                sched, m->chunk, sched, m->chunk, m->mb, i1, m->nb, fn, je);
    else {
        char r0[32];
        snprintf(r0, sizeof r0, "tid == 0 ? %d :", m->mb);
        fprintf(o, "        /* balanced: thread t owns rows [n√(t/T), n√((t+1)/T)), rounded to row blocks, so that\n"
                   "         * every thread gets about the same share of the triangle's entries */\n"
                   "        const size_t tid = (size_t)omp_get_thread_num(), nth = (size_t)omp_get_num_threads();\n"
                   "        const size_t r0 = %s ((size_t)((double)n * sqrt((double)tid / (double)nth)) + %d / 2) / %d * %d;\n"
                   "        const size_t r1 = tid + 1 == nth ? n : ((size_t)((double)n * sqrt((double)(tid + 1) / (double)nth)) + %d / 2) / %d * %d;\n"
                   "        for (size_t i0 = r0; i0 < r1 && i0 < n; i0 += %d) {\n"
                   "            const size_t i1 = %s;\n"
                   "            for (size_t j0 = 0; %s; j0 += %d)\n"
                   "                %s_rows(i0, i1, j0, %s, S, lds, out, ldo, q, ra, rs, alpha, beta, &badv);\n"
                   "        }\n",
                tpk__site(mu, TPK__MUT_MAP_BALANCED, 1, "tid == 0 ? 0 :", r0), m->mb, m->mb, m->mb, m->mb, m->mb, m->mb, m->mb, i1,
                cbuf, m->nb, fn, je);
    }
    /* site: the last lane's flags not reduced */
    snprintf(t, sizeof t, "l < %d", L);
    snprintf(x, sizeof x, "l < %d", L - 1);
    fprintf(o, "        for (int l = 0; %s; l++)\n"
               "            bad |= badv[l] != 0;\n"
               "    }\n"
               "    return bad;\n}\n\n", tpk__site(mu, TPK__MUT_MAP_FLAG_LANES, 1, t, x));
}

static int cpu_map_emit(const tpk_tune_space *s, const tpk_tune_config *c, const char *fn, int standalone,
                        tpk__mutation *mu, FILE *o, tpk_ctx *ctx)
{
    (void)ctx;
    map_cfg m;
    cfg_of(s, c, &m);
    const vty *y = vty_of(m.es, m.vl);
    const char *V = y->V, *I = y->I, *f = y->sfx;
    const int L = m.vl;
    const char *st = standalone ? "" : "static ";
    const char *ename = standalone ? "tpk_kernel" : fn;
    char knobs[256];
    tpk_tune_config_str(s, c, knobs, sizeof knobs);
    map_flav fl;
    flav_real(&m, &fl);
    if (standalone) {
        fprintf(o, "/* Generated by tptune (tpk tuner, cpu_map template) - DO NOT EDIT. */\n");
        tpk_tune_emit_cpu_prelude(o);
        tpk__cpu_map_prelude(o);
    }
    fprintf(o, "/* ---- %s: %s relu map (lower triangle), %s ---- */\n", fn, m.es == 4 ? "f32" : "f64", knobs);

    /* one vector of entries */
    const char *pmt = m.acos == ACOS_POLY ? "pmt_poly(x)" : m.acos == ACOS_MVEC ? "pmt_mvec(x)" : "pmt_atan2(x, w)";
    fprintf(o, "/* α/(2π)·√(q_i q_j)·[sin θ + (π − θ) cos θ] + β for %d entries of a row, cos θ = k/√(q_i q_j)\n"
               " * clamped to [−1, 1] (snapped to ±1 within 8 ulp); a2p = α/(2π). Lanes whose |k| exceeds\n"
               " * √(q_i q_j) beyond rounding, or are NaN, are flagged in *bad. */\n", L);
    if (m.rq)
        fprintf(o, "static inline __attribute__((always_inline)) %s %s_ent(%s k, %s ai, %s aj, %s si, %s sj, %s lim,\n"
                   "        %s a2p, %s b, %s *bad)\n{\n"
                   "    const %s zero = {0};\n"
                   "    *bad |= ~(%s_sel(k < 0%s, -k, k) <= lim * sj);\n"
                   "    %s x = k * ai * aj;\n",
                V, fn, V, V, V, V, V, V, V, V, I, V, V, m.es == 4 ? ".0f" : ".0", V);
    else
        fprintf(o, "static inline __attribute__((always_inline)) %s %s_ent(%s k, %s qi, %s qj, %s lim2, %s a2p, %s b,\n"
                   "        %s *bad)\n{\n"
                   "    const %s zero = {0};\n"
                   "    const %s qq = qi * qj, r = %s_sqrt(qq);\n"
                   "    *bad |= ~(k * k <= lim2 * qq);\n"
                   "    %s x = %s_sel(r > 0%s, k / r, zero);\n",
                V, fn, V, V, V, V, V, V, I, V, V, V, V, V, m.es == 4 ? ".0f" : ".0");
    fprintf(o, "    const %s one = zero + 1.0%s, mone = zero - 1.0%s;\n"
               "    x = %s_sel(x > one, one, x);\n"
               "    x = %s_sel(x < mone, mone, x);\n"
               "    x = %s_sel(%s_sel(x < 0%s, -x, x) >= 1.0%s - %s, %s_sel(x < 0%s, mone, one), x);\n"
               "    const %s w = %s_sqrt((1.0%s - x) * (1.0%s + x));\n"
               "    const %s p = %s_%s;\n"
               "    return a2p * (%s) * (w + p * x) + b;\n}\n\n",
            V, f, f, V, V, V, V, m.es == 4 ? ".0f" : ".0", f, m.es == 4 ? SNAP_F32 : SNAP_F64, V,
            m.es == 4 ? ".0f" : ".0", V, V, f, f, V, V, pmt, m.rq ? "si * sj" : "r");

    emit_rows(o, fn, &m, &fl, mu);
    emit_driver(o, fn, ename, st, standalone, &m, &fl, mu);
    return TPK_OK;
}

/* ---- the Z_p twin (tptune verify: tuner/verify.c) -------------------------------------------- */

void tpk__cpu_map_shape(const tpk_tune_space *s, const tpk_tune_config *c, int *lanes, int *mb, int *nb, int *un)
{
    map_cfg m;
    cfg_of(s, c, &m);
    *lanes = m.vl, *mb = m.mb, *nb = m.nb, *un = m.un;
}

/* The loop nest of the kernel (emit_rows, emit_driver) over uint32_t vectors of the same lanes,
 * with the entry, the diagonal and the column vectors computed in Z_p from random functions
 * (table + random linear term; verify.c states the model and the miss probability). */
int tpk__cpu_map_emit_twin(const tpk_tune_space *s, const tpk_tune_config *c, tpk__mutation *mu, FILE *o,
                           tpk_ctx *ctx)
{
    if (s->task.op != TPK_TUNE_MAP || !tpk_tune_space_valid(s, c))
        return TPK_ERROR(ctx, TPK_EINVAL, "tune: the Z_p twin needs a valid cpu_map configuration");
    map_cfg m;
    cfg_of(s, c, &m);
    const int L = m.vl;
    char V[16], I[16], knobs[256];
    snprintf(V, sizeof V, "tpk_zv%d", L);
    snprintf(I, sizeof I, "tpk_zm%d", L);
    tpk_tune_config_str(s, c, knobs, sizeof knobs);
    map_flav fl = {V, I, "uint32_t", "alpha", "0", "0", "tpk_zp_diag(alpha, q[i], beta)",
                   "        rs[i] = tpk_zp_fn(1, q[i]);\n        ra[i] = tpk_zp_fn(2, q[i]);\n"};
    fprintf(o, "/* Generated by tptune (tpk tuner, cpu_map template, Z_p twin for tptune verify) - DO NOT EDIT. */\n"
               "/* ---- the Z_p twin of the %s relu map %s: its loop nest over values in Z_p, p = 2^31 - 1 ---- */\n"
               "#include <math.h>\n#include <omp.h>\n#include <stddef.h>\n#include <stdint.h>\n#include <string.h>\n\n"
               "typedef uint32_t %s __attribute__((vector_size(%d)));\n"
               "typedef int %s __attribute__((vector_size(%d)));\n"
               "static inline %s %s_ld(const uint32_t *p)\n{\n    %s v;\n    memcpy(&v, p, sizeof v);\n    return v;\n}\n"
               "static inline void %s_st(uint32_t *p, %s v)\n{\n    memcpy(p, &v, sizeof v);\n}\n\n",
            m.es == 4 ? "f32" : "f64", knobs, V, 4 * L, I, 4 * L, V, V, V, V, V);
    fputs("#define TPK_ZP_P 2147483647u\n"
          "/* Four random tables of 2^16 values and four random coefficients (tpk_twin_tables): f_t(x) =\n"
          " * tab[t][x mod 2^16] + c_t x in Z_p; t = 0 the entry's phi, 1 and 2 the column scales (the\n"
          " * kernel's sqrt q and 1/sqrt q), 3 the diagonal. */\n"
          "static const uint32_t *tpk_zp_tab;\n"
          "void tpk_twin_tables(const uint32_t *tab);\n"
          "void tpk_twin_tables(const uint32_t *tab)\n{\n    tpk_zp_tab = tab;\n}\n"
          "static inline uint32_t tpk_zp_mul(uint32_t a, uint32_t b)\n{\n"
          "    uint64_t x = (uint64_t)a * b;\n"
          "    x = (x & TPK_ZP_P) + (x >> 31); /* 2^31 = 1 mod p */\n"
          "    x = (x & TPK_ZP_P) + (x >> 31);\n"
          "    return (uint32_t)(x >= TPK_ZP_P ? x - TPK_ZP_P : x);\n}\n"
          "static inline uint32_t tpk_zp_add(uint32_t a, uint32_t b)\n{\n"
          "    return (uint32_t)(((uint64_t)a + b) % TPK_ZP_P);\n}\n"
          "static inline uint32_t tpk_zp_fn(int t, uint32_t x)\n{\n"
          "    return tpk_zp_add(tpk_zp_tab[t * 65536 + (x & 65535)], tpk_zp_mul(tpk_zp_tab[4 * 65536 + t], x));\n}\n"
          "/* An entry: alpha phi(k) s_i s_j + a_i a_j + beta; the diagonal: alpha f_3(q_i) + beta. */\n"
          "static inline uint32_t tpk_zp_ent(uint32_t k, uint32_t ai, uint32_t aj, uint32_t si, uint32_t sj, uint32_t a,\n"
          "        uint32_t b)\n{\n"
          "    return tpk_zp_add(tpk_zp_add(tpk_zp_mul(tpk_zp_mul(tpk_zp_mul(a, tpk_zp_fn(0, k)), si), sj), tpk_zp_mul(ai, aj)), b);\n}\n"
          "static inline uint32_t tpk_zp_diag(uint32_t a, uint32_t q, uint32_t b)\n{\n"
          "    return tpk_zp_add(tpk_zp_mul(a, tpk_zp_fn(3, q)), b);\n}\n\n", o);
    fprintf(o, "/* %d entries of a row in Z_p; an S value outside Z_p (none of the inputs) is flagged in *bad. */\n", L);
    if (m.rq)
        fprintf(o, "static inline __attribute__((always_inline)) %s tpk_twin_ent(%s k, %s ai, %s aj, %s si, %s sj, %s lim,\n"
                   "        %s a2p, %s b, %s *bad)\n{\n    %s r = {0};\n    (void)lim;\n"
                   "    for (int l = 0; l < %d; l++) {\n"
                   "        if (k[l] >= TPK_ZP_P)\n            (*bad)[l] = -1;\n"
                   "        r[l] = tpk_zp_ent(k[l], ai[l], aj[l], si[l], sj[l], a2p[l], b[l]);\n"
                   "    }\n    return r;\n}\n\n", V, V, V, V, V, V, V, V, V, I, V, L);
    else
        fprintf(o, "static inline __attribute__((always_inline)) %s tpk_twin_ent(%s k, %s qi, %s qj, %s lim2, %s a2p, %s b,\n"
                   "        %s *bad)\n{\n    %s r = {0};\n    (void)lim2;\n"
                   "    for (int l = 0; l < %d; l++) {\n"
                   "        if (k[l] >= TPK_ZP_P)\n            (*bad)[l] = -1;\n"
                   "        r[l] = tpk_zp_ent(k[l], tpk_zp_fn(2, qi[l]), tpk_zp_fn(2, qj[l]), tpk_zp_fn(1, qi[l]),\n"
                   "                tpk_zp_fn(1, qj[l]), a2p[l], b[l]);\n"
                   "    }\n    return r;\n}\n\n", V, V, V, V, V, V, V, I, V, L);
    emit_rows(o, "tpk_twin", &m, &fl, mu);
    emit_driver(o, "tpk_twin", "tpk_kernel", "", 1, &m, &fl, mu);
    return ferror(o) ? TPK_ERROR(ctx, TPK_EIO, "tune: write error") : TPK_OK;
}

/* ---- the measuring child ------------------------------------------------------------------ */

/* Verification: |out − ref| ≤ tol·(|α|√(q_i q_j)/2 + |β|), the size of the entry's terms
 * (J ≤ π, so √(q_i q_j)/2 bounds the map before the affine step). tol: issue 6's 1e-14 for
 * f64 (the reference itself is good to about 16 ε, kernels/gauss_map.c vector_err) and 1e-6 for
 * f32 (inputs and the float arithmetic carry a few float ulp of 6e-8; J is π-Lipschitz in ρ). */
#define MAP_TOL_F64 1e-14
#define MAP_TOL_F32 1e-6

static double map_scale(double qi, double qj, double alpha, double beta)
{
    return fabs(alpha) * sqrt(qi) * sqrt(qj) / 2 + fabs(beta);
}

static double now_cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A covariance of n points with degenerate rows: vectors in R^3 (rank 3, so many ρ near ±1),
 * every 7th a zero vector, every 5th a copy of the previous one, every 11th its negative. */
static void fill_cov(double *S, size_t n, uint64_t *rng)
{
    double *x = malloc(3 * n * sizeof *x);
    if (!x)
        return;
    for (size_t i = 0; i < n; i++)
        for (int d = 0; d < 3; d++) {
            double v = (2 * tpk__rng_unif(rng) - 1) * 1.7;
            if (i % 7 == 3)
                v = 0;
            else if (i % 5 == 4 && i)
                v = x[3 * (i - 1) + d];
            else if (i % 11 == 10 && i)
                v = -x[3 * (i - 1) + d];
            x[3 * i + d] = v;
        }
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            S[i * n + j] = x[3 * i] * x[3 * j] + x[3 * i + 1] * x[3 * j + 1] + x[3 * i + 2] * x[3 * j + 2];
    free(x);
}

/* The tolerance check (step 1 of the measuring child; tpk_tune_check_map): the largest error over
 * the small sizes, INFINITY for a wrong flag or an upper-triangle write, −1 when out of memory. */
#define MAP_CHECK(T, KFN, REF)                                                                     \
    static double map_check_##T(KFN kern, tpk_map_ws_fn wsf, int nt, uint64_t *rngp)              \
    {                                                                                              \
        uint64_t rng = *rngp;                                                                      \
        double worst = 0;                                                                          \
        /* 1. Odd sizes with degenerate rows, out of place (upper triangle untouched) and in       \
         * place, against the reference; a corrupted entry must be flagged. */                     \
        static const size_t small[] = {1, 2, 37, 203};                                             \
        for (int si = 0; si < 4; si++) {                                                           \
            const size_t ns = small[si];                                                           \
            double *Sd = malloc(ns * ns * sizeof *Sd);                                             \
            T *S = malloc(ns * ns * sizeof *S), *O = malloc(ns * ns * sizeof *O);                  \
            T *R = malloc(ns * ns * sizeof *R);                                                    \
            void *ws = aligned_alloc(64, (wsf(ns) + 63) / 64 * 64);                                \
            if (!Sd || !S || !O || !R || !ws) {                                                    \
                free(Sd); free(S); free(O); free(R); free(ws);                                     \
                return -1;                                                                         \
            }                                                                                      \
            fill_cov(Sd, ns, &rng);                                                                \
            for (size_t i = 0; i < ns * ns; i++) {                                                 \
                S[i] = (T)Sd[i];                                                                   \
                O[i] = (T)7.25;                                                                    \
            }                                                                                      \
            const T al = (T)1.375, be = (T)0.3125;                                                 \
            int bad = kern(ns, S, ns, al, be, O, ns, nt, ws);                                      \
            int rbad = REF(ns, S, ns, al, be, R, ns);                                              \
            for (size_t i = 0; i < ns; i++)                                                        \
                for (size_t j = 0; j < ns; j++) {                                                  \
                    double e;                                                                      \
                    if (j > i)                                                                     \
                        e = O[i * ns + j] == (T)7.25 ? 0 : INFINITY;                               \
                    else                                                                           \
                        e = fabs((double)O[i * ns + j] - (double)R[i * ns + j]) /                  \
                            map_scale(S[i * ns + i], S[j * ns + j], al, be);                       \
                    if (!(e <= worst))                                                             \
                        worst = isnan(e) ? INFINITY : e;                                           \
                }                                                                                  \
            if (bad || rbad)                                                                       \
                worst = INFINITY;                                                                  \
            /* in place */                                                                         \
            kern(ns, S, ns, al, be, S, ns, nt, ws);                                                \
            for (size_t i = 0; i < ns; i++)                                                        \
                for (size_t j = 0; j <= i; j++)                                                    \
                    if (S[i * ns + j] != O[i * ns + j])                                            \
                        worst = INFINITY;                                                          \
            /* a covariance beyond its bound is flagged */                                         \
            if (ns > 2) {                                                                          \
                for (size_t i = 0; i < ns * ns; i++)                                               \
                    S[i] = (T)Sd[i];                                                               \
                size_t i = ns - 1, j = 0;                                                          \
                while (i > 1 && S[i * ns + i] == 0)                                                \
                    i--;                                                                           \
                while (j + 1 < i && S[j * ns + j] == 0)                                            \
                    j++;                                                                           \
                S[i * ns + j] = (T)(1.5 * sqrt((double)S[i * ns + i] * (double)S[j * ns + j]) + 0.5); \
                if (!kern(ns, S, ns, al, be, O, ns, nt, ws))                                       \
                    worst = INFINITY;                                                              \
            }                                                                                      \
            free(Sd); free(S); free(O); free(R); free(ws);                                         \
        }                                                                                          \
        *rngp = rng;                                                                               \
        return worst;                                                                              \
    }

MAP_CHECK(double, tpk_dmap_kernel_fn, tpk_ref_relu_map_d)
MAP_CHECK(float, tpk_smap_kernel_fn, tpk_ref_relu_map_s)

int tpk_tune_check_map(tpk_dmap_kernel_fn dfn, tpk_smap_kernel_fn sfn, tpk_map_ws_fn ws, int nt, double *worst)
{
    uint64_t rng = 0x5eed0002;
    *worst = dfn ? map_check_double(dfn, ws, nt < 1 ? 1 : nt, &rng) : map_check_float(sfn, ws, nt < 1 ? 1 : nt, &rng);
    return *worst >= 0 && *worst <= (dfn ? MAP_TOL_F64 : MAP_TOL_F32);
}

#define MAP_CHILD(T, KFN, REF, TOL)                                                                \
    static int map_child_##T(void *h, size_t n, int threads, int repeat, double min_ms,            \
                             tpk_tune_result *r)                                                   \
    {                                                                                              \
        KFN kern = (KFN)dlsym(h, "tpk_kernel");                                                    \
        tpk_map_ws_fn wsf = (tpk_map_ws_fn)dlsym(h, "tpk_kernel_ws");                              \
        if (!kern || !wsf)                                                                         \
            return TPK_TUNE_ELOAD;                                                                 \
        const int nt = threads < 1 ? 1 : threads;                                                  \
        uint64_t rng = 0x5eed0002;                                                                 \
        double worst = map_check_##T(kern, wsf, nt, &rng);                                        \
        if (worst < 0)                                                                             \
            return TPK_TUNE_ECRASH;                                                                \
        r->max_rel_err = worst;                                                                    \
        if (!(worst <= TOL))                                                                       \
            return TPK_TUNE_EWRONG;                                                                \
        /* 2. The workload: S_ij = √(q_i q_j)·c_ij, c uniform in [−1, 1], a few zero variances;    \
         * sampled entries against the reference formula, the upper triangle untouched. */         \
        T *S = aligned_alloc(64, (n * n * sizeof(T) + 63) / 64 * 64);                              \
        T *O = aligned_alloc(64, (n * n * sizeof(T) + 63) / 64 * 64);                              \
        void *ws = aligned_alloc(64, (wsf(n) + 63) / 64 * 64);                                     \
        double *qd = malloc(n * sizeof *qd);                                                       \
        if (!S || !O || !ws || !qd) {                                                              \
            free(S); free(O); free(ws); free(qd);                                                  \
            return TPK_TUNE_ECRASH;                                                                \
        }                                                                                          \
        for (size_t i = 0; i < n; i++)                                                             \
            qd[i] = i % 97 == 13 ? 0 : 0.25 + 2 * tpk__rng_unif(&rng);                             \
        for (size_t i = 0; i < n; i++)                                                             \
            for (size_t j = 0; j < n; j++)                                                         \
                S[i * n + j] = (T)(i == j ? qd[i]                                                  \
                                          : 0.999 * sqrt(qd[i] * qd[j]) * (2 * tpk__rng_unif(&rng) - 1)); \
        for (size_t i = 0; i < n * n; i++)                                                         \
            O[i] = (T)7.25;                                                                        \
        const T al = (T)1.5, be = (T)0.25;                                                         \
        int bad = kern(n, S, n, al, be, O, n, nt, ws);                                             \
        worst = bad ? INFINITY : 0;                                                                \
        for (int sm = 0; sm < 4096; sm++) {                                                        \
            size_t i = (size_t)(tpk__rng_next(&rng) % n), j = (size_t)(tpk__rng_next(&rng) % n);   \
            double e;                                                                              \
            if (j > i) {                                                                           \
                e = O[i * n + j] == (T)7.25 ? 0 : INFINITY;                                        \
            } else {                                                                               \
                T s3[4] = {S[j * n + j], S[j * n + i], S[i * n + j], S[i * n + i]}, o3[4];         \
                if (j == i)                                                                        \
                    s3[1] = s3[2] = s3[0];                                                         \
                REF(2, s3, 2, al, be, o3, 2);                                                      \
                e = fabs((double)O[i * n + j] - (double)o3[j == i ? 0 : 2]) /                      \
                    map_scale(S[i * n + i], S[j * n + j], al, be);                                 \
            }                                                                                      \
            if (!(e <= worst))                                                                     \
                worst = isnan(e) ? INFINITY : e;                                                   \
        }                                                                                          \
        r->max_rel_err = fmax(r->max_rel_err, worst);                                              \
        if (!(worst <= TOL)) {                                                                     \
            free(S); free(O); free(ws); free(qd);                                                  \
            return TPK_TUNE_EWRONG;                                                                \
        }                                                                                          \
        /* 3. Time: warm-up, calls per repeat grown to min_ms, median of repeats. */               \
        double t0 = tpk_wall_seconds();                                                                    \
        kern(n, S, n, al, be, O, n, nt, ws);                                                       \
        double tw = tpk_wall_seconds() - t0;                                                               \
        long number = (long)ceil(min_ms * 1e-3 / (tw > 1e-9 ? tw : 1e-9));                         \
        if (number < 1)                                                                            \
            number = 1;                                                                            \
        double c0 = now_cpu(), w0 = tpk_wall_seconds();                                                    \
        for (int rep = 0; rep < repeat; rep++) {                                                   \
            double t = tpk_wall_seconds();                                                                 \
            for (long it = 0; it < number; it++)                                                   \
                kern(n, S, n, al, be, O, n, nt, ws);                                               \
            r->costs_s[rep] = (tpk_wall_seconds() - t) / (double)number;                                   \
        }                                                                                          \
        r->cpu_ratio = (now_cpu() - c0) / ((tpk_wall_seconds() - w0) * (double)nt);                        \
        r->ncost = repeat;                                                                         \
        double sorted[TPK_TUNE_MAX_REPEAT];                                                        \
        memcpy(sorted, r->costs_s, (size_t)repeat * sizeof *sorted);                               \
        qsort(sorted, (size_t)repeat, sizeof *sorted, cmp_dbl);                                    \
        r->gflops = (double)n * ((double)n + 1) / 2 / sorted[repeat / 2] * 1e-9;                   \
        free(S); free(O); free(ws); free(qd);                                                      \
        return TPK_TUNE_OK;                                                                        \
    }

MAP_CHILD(double, tpk_dmap_kernel_fn, tpk_ref_relu_map_d, MAP_TOL_F64)
MAP_CHILD(float, tpk_smap_kernel_fn, tpk_ref_relu_map_s, MAP_TOL_F32)

int tpk__cpu_map_child(void *h, int dtype, size_t n, int threads, int repeat, double min_repeat_ms,
                       tpk_tune_result *r)
{
    if (repeat < 1 || repeat > TPK_TUNE_MAX_REPEAT)
        repeat = 5;
    return dtype == TPK_TUNE_F32 ? map_child_float(h, n, threads, repeat, min_repeat_ms, r)
                                 : map_child_double(h, n, threads, repeat, min_repeat_ms, r);
}

/* ---- the template (space.c lists it) ----------------------------------------------------- */

/* Serves the ReLU NNGP map, on the CPU only. */
static int cpu_map_applicable(const tpk_tune_task *t)
{
    return t->target == TPK_TUNE_CPU && t->op == TPK_TUNE_MAP;
}

const tpk__template tpk__template_cpu_map = {"cpu_map", cpu_map_applicable, cpu_map_space, cpu_map_default, cpu_map_emit};
