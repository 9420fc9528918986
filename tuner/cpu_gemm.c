/* The cpu_gemm template: BLIS-style five loops (jc, pc, ic, jr, ir) around a register
 * micro-kernel written with GCC vector extensions (BLIS ref_kernels/3/bli_gemm_ref.c is the
 * shape; tuner-notes §3 the knobs). Knob table, constraints, analytic default, features and
 * the C emitter. */
#include "tune_impl.h"

#include <math.h>
#include <string.h>

static const char *const order_labels[] = {"jr_ir", "ir_jr"};
static const char *const par_labels[] = {"ic", "jr"};

enum { K_VW, K_MR, K_NV, K_KC, K_MC, K_NC, K_KU, K_ORDER, K_PAR, K_PF, K_PB, K_PA, K_COUNT };

static void set_knob(tpk_tune_knob *k, const char *name, const int *c, int n,
                     const char *const *labels)
{
    k->name = name;
    k->ncand = n;
    memcpy(k->cand, c, (size_t)n * sizeof *c);
    k->labels = labels;
}

static size_t round_up(size_t x, size_t r)
{
    return (x + r - 1) / r * r;
}

void tpk__cpu_gemm_blocking(const tpk_tune_space *s, const tpk_tune_config *c, tpk__cpu_blocking *b)
{
    b->es = s->task.dtype == TPK_TUNE_F32 ? 4 : 8;
    b->vl = c->v[K_VW] / (8 * b->es);
    b->mr = c->v[K_MR];
    b->nv = c->v[K_NV];
    b->nr = b->nv * b->vl;
    b->kc = c->v[K_KC];
    b->mc = (int)round_up((size_t)c->v[K_MC], (size_t)b->mr);
    b->nc = (int)round_up((size_t)c->v[K_NC], (size_t)b->nr);
    b->ku = c->v[K_KU];
    b->order = c->v[K_ORDER];
    b->par = c->v[K_PAR];
    b->pf = c->v[K_PF];
    b->pb = c->v[K_PB];
    b->pa = c->v[K_PA];
    b->syrk = s->task.op == TPK_TUNE_SYRK;
}

static int cpu_valid(const tpk_tune_space *s, const tpk_tune_config *c)
{
    tpk__cpu_blocking b;
    tpk__cpu_gemm_blocking(s, c, &b);
    /* Registers: mr·nv accumulators + nv B vectors + one broadcast within the class's vector
     * registers (32 with AVX-512, zmm or, with AVX-512VL, ymm; 16 with AVX2); at least 8
     * independent FMA chains to cover the FMA latency of two pipes; no wider vector than the
     * class has. */
    if (b.mr * b.nv + b.nv + 1 > s->machine.registers || b.mr * b.nv < 8 ||
        c->v[K_VW] > s->machine.vector_bits)
        return 0;
    if (b.pb && b.par != TPK__PAR_IC) /* private B needs threads that own whole ic blocks */
        return 0;
    /* Direct A: the ic split and plain gemm only; its mr row addresses share the 16 general
     * registers with the loop state, so at most 16 rows. */
    if (b.pa && (b.par != TPK__PAR_IC || b.syrk || b.mr > 16))
        return 0;
    if ((double)b.mc * b.kc * b.es > 4.0 * 1024 * 1024 || (double)b.kc * b.nc * b.es > 64.0 * 1024 * 1024)
        return 0;
    /* Blocks much larger than the problem duplicate a smaller block: keep the smallest. */
    const tpk_tune_task *t = &s->task;
    if (c->v[K_KC] > 64 && (size_t)c->v[K_KC] / 2 >= t->k)
        return 0;
    if (c->v[K_MC] > 48 && (size_t)c->v[K_MC] / 2 >= round_up(t->m, (size_t)b.mr))
        return 0;
    if (c->v[K_NC] > 256 && (size_t)c->v[K_NC] / 2 >= round_up(t->n, (size_t)b.nr))
        return 0;
    return 1;
}

/* Features that mean the same thing across shapes (tuner-notes §3 "Cost model in C"): knob
 * logs, footprints against each cache level, bytes moved and arithmetic intensity per level,
 * edge waste, parallel balance, register use. */
static int cpu_features(const tpk_tune_space *s, const tpk_tune_config *c, float *f, int cap)
{
    const tpk_tune_task *t = &s->task;
    tpk__cpu_blocking b;
    tpk__cpu_gemm_blocking(s, c, &b);
    const tpk_machine ca = s->machine;
    double m = (double)t->m, n = (double)t->n, k = (double)t->k, es = b.es;
    double th = t->threads > 0 ? t->threads : 1;
    double mr = b.mr, nr = b.nr, kc = b.kc, mc = b.mc, nc = b.nc;
    double kce = fmin(kc, k), mce = fmin(mc, round_up(t->m, (size_t)b.mr)),
           nce = fmin(nc, round_up(t->n, (size_t)b.nr));
    double flops = tpk_tune_task_flops(t);
    double nblk_m = ceil(m / mc), nblk_n = ceil(n / nc), nblk_k = ceil(k / kc);
    double v[TPK_TUNE_MAX_FEATURES];
    int i = 0;
    /* knobs */
    v[i++] = tpk__log2(c->v[K_VW]);
    v[i++] = tpk__log2(mr);
    v[i++] = tpk__log2(nr);
    v[i++] = b.nv;
    v[i++] = tpk__log2(kc);
    v[i++] = tpk__log2(mc);
    v[i++] = tpk__log2(nc);
    v[i++] = tpk__log2(b.ku);
    v[i++] = b.order;
    v[i++] = b.par;
    v[i++] = b.pf;
    v[i++] = b.pb;
    /* workload */
    v[i++] = tpk__log2(m);
    v[i++] = tpk__log2(n);
    v[i++] = tpk__log2(k);
    v[i++] = th;
    v[i++] = es;
    v[i++] = b.syrk;
    /* registers */
    v[i++] = (mr * b.nv + b.nv + 1) / 32.0;
    v[i++] = 2 * mr * nr / (mr + nr); /* flops per element loaded into registers */
    /* footprints / capacity */
    v[i++] = (mr + nr) * kce * es / ca.l1;
    v[i++] = nr * kce * es / ca.l1;
    v[i++] = mr * kce * es / ca.l1;
    v[i++] = mce * kce * es / ca.l2;
    v[i++] = kce * nce * es / ca.l2;
    v[i++] = kce * nce * es / ca.l3;
    /* bytes from memory given the blocking: B re-read per mc block, A per nc block, C per kc */
    double mem = es * (k * n * nblk_m + m * k * nblk_n + 2 * m * n * nblk_k);
    v[i++] = tpk__log2(flops / mem);
    /* bytes from L2 into L1: the operand that is not kept in L1 by the inner loop order */
    double l2 = b.order == TPK__ORDER_JR_IR ? es * m * k * ceil(n / nr) : es * k * n * ceil(m / mr);
    v[i++] = tpk__log2(flops / l2);
    /* edge waste: padded tile volume over real volume; last-block fill of each blocking */
    v[i++] = round_up(t->m, (size_t)b.mr) * (double)round_up(t->n, (size_t)b.nr) / (m * n);
    v[i++] = nblk_k * kc / k;
    v[i++] = nblk_m * mc / m;
    v[i++] = nblk_n * nc / n;
    /* parallel balance: units of the split loop over a whole number of rounds */
    double units = b.par == TPK__PAR_IC ? nblk_m : ceil(nce / nr);
    v[i++] = units / (ceil(units / th) * th);
    v[i++] = tpk__log2(units);
    /* loop overheads: micro-kernel calls, k iterations per call, packing work ratio */
    v[i++] = tpk__log2(ceil(m / mr) * ceil(n / nr) * nblk_k);
    v[i++] = fmod(kce, b.ku) == 0 ? 1 : 0;
    v[i++] = (m * k * nblk_n + k * n) / (m * n * k) * 64;
    /* Micro-kernel issue model (two FMA and two load ports, FMA latency 4): per k step mr·nv
     * FMAs against nv vector loads plus mr broadcasts; fewer than 8 accumulator chains leave
     * the pipes idle. Its product with the vector width is the attainable peak fraction. */
    double fmas = mr * b.nv, loads = b.nv + mr;
    double uk = fmas / fmax(fmas, loads) * fmin(1.0, fmas / 8.0);
    v[i++] = uk;
    v[i++] = uk * c->v[K_VW] / 512.0;
    v[i++] = tpk__log2(fmas);
    /* Edge waste per direction (the padded last tiles and blocks of this shape). */
    v[i++] = round_up(t->m, (size_t)b.mr) / m;
    v[i++] = round_up(t->n, (size_t)b.nr) / n;
    v[i++] = (nblk_m * mce - m) / fmax(m, 1);
    /* The A micro-panel (streamed, ir inner) and C micro-tile against L1; packed B panel and
     * A block together against L2 (they compete when nc·kc is small). */
    v[i++] = mr * kce * es / ca.l1;
    v[i++] = (mce * kce + kce * nr) * es / ca.l2;
    /* Roofline of the blocking: time at the attainable peak plus memory traffic at ~16 B/cycle,
     * in flops per cycle (log2); a single number the trees can split on early. */
    double cyc = flops / (2 * (c->v[K_VW] / (8.0 * es)) * 2 * fmax(uk, 0.05)) + mem / 16.0;
    v[i++] = tpk__log2(flops / cyc);
    /* A read in place: no A packing, but mr row streams from memory into each micro-kernel and
     * A re-read from memory (not the packed L2 block) once per B micro-panel of the block. */
    v[i++] = b.pa;
    v[i++] = ((b.pa ? 0 : m * k * nblk_n) + k * n) / (m * n * k) * 64;
    v[i++] = b.pa ? tpk__log2(ceil(nce / nr)) : 0;
    int nf = i < cap ? i : cap;
    for (int j = 0; j < nf; j++)
        f[j] = (float)v[j];
    return nf;
}

static int cpu_gemm_space(tpk_tune_space *s, const tpk_tune_task *t, tpk_ctx *ctx)
{
    (void)ctx;
    static const int vw[] = {256, 512};
    static const int mr[] = {4, 6, 8, 10, 12, 14, 16, 20, 24, 28};
    static const int nv[] = {1, 2, 3, 4};
    static const int kc[] = {64, 96, 128, 192, 256, 320, 384, 512};
    static const int mc[] = {48, 72, 96, 144, 192, 240, 288, 384, 480, 576};
    static const int nc[] = {256, 512, 1024, 2048, 4096, 8192};
    static const int ku[] = {1, 2, 4, 8};
    static const int order[] = {TPK__ORDER_JR_IR, TPK__ORDER_IR_JR};
    static const int par[] = {TPK__PAR_IC, TPK__PAR_JR};
    static const int pf[] = {0, 1, 2};
    s->task = *t;
    if (s->task.threads < 1)
        s->task.threads = 1;
    s->template_name = t->op == TPK_TUNE_SYRK ? "cpu_syrk" : "cpu_gemm";
    s->nknob = K_COUNT;
    set_knob(&s->knob[K_VW], "vw", vw, 2, NULL);
    set_knob(&s->knob[K_MR], "mr", mr, 10, NULL);
    set_knob(&s->knob[K_NV], "nv", nv, 4, NULL);
    set_knob(&s->knob[K_KC], "kc", kc, 8, NULL);
    set_knob(&s->knob[K_MC], "mc", mc, 10, NULL);
    set_knob(&s->knob[K_NC], "nc", nc, 6, NULL);
    set_knob(&s->knob[K_KU], "ku", ku, 4, NULL);
    set_knob(&s->knob[K_ORDER], "order", order, 2, order_labels);
    /* With one thread the split loop does not matter: one candidate, no wasted trials. */
    set_knob(&s->knob[K_PAR], "par", par, s->task.threads > 1 ? 2 : 1, par_labels);
    set_knob(&s->knob[K_PF], "pf", pf, 3, NULL);
    /* B packed once and shared (barriers around it), or by every thread for itself (no barrier:
     * robust when a thread is descheduled). Candidate 0 is what logs without this knob used. */
    static const int pb[] = {0, 1};
    static const char *const pb_labels[] = {"shared", "private"};
    set_knob(&s->knob[K_PB], "pb", pb, s->task.threads > 1 ? 2 : 1, pb_labels);
    /* A packed into mc×kc blocks (candidate 0, what logs without this knob used) or read in
     * place by the micro-kernel: for tall-skinny products (n×n · n×64) A is touched once per
     * B panel, so packing it is a serial memory-bound pass that the micro-kernel's own
     * streaming reads would overlap with arithmetic (tuner/README.md "Direct A"). */
    static const int pa[] = {0, 1};
    static const char *const pa_labels[] = {"packed", "direct"};
    set_knob(&s->knob[K_PA], "pa", pa, t->op == TPK_TUNE_SYRK ? 1 : 2, pa_labels);
    s->valid = cpu_valid;
    s->features = cpu_features;
    return TPK_OK;
}

/* Largest candidate of knob `ki` not above `target` (the smallest if none is). */
static int pick_le(const tpk_tune_knob *k, double target)
{
    int best = k->cand[0];
    for (int j = 0; j < k->ncand; j++)
        if (k->cand[j] <= target)
            best = k->cand[j];
    return best;
}

static void cpu_gemm_default(const tpk_tune_space *s, tpk_tune_config *c)
{
    const tpk_machine ca = s->machine;
    int es = s->task.dtype == TPK_TUNE_F32 ? 4 : 8;
    memset(c, 0, sizeof *c);
    const int vw = ca.vector_bits >= 512 ? 512 : 256;
    c->v[K_VW] = vw;
    if (ca.registers >= 32) {
        c->v[K_MR] = 8;
        c->v[K_NV] = 3; /* 24 accumulators, 3 B vectors, one broadcast: 28 of 32 registers */
    } else {
        c->v[K_MR] = 6;
        c->v[K_NV] = 2; /* 12 accumulators, 2 B vectors, one broadcast: 15 of 16 (BLIS haswell) */
    }
    int nr = c->v[K_NV] * vw / (8 * es);
    /* kc: the B micro-panel (nr×kc) in half of L1; mc: the A block in half of L2; nc: the B
     * panel in a quarter of L3 (BLIS's analytical model, Low et al. 2016). */
    const tpk_tune_task *t = &s->task;
    double kmax = 2.0 * (double)t->k - 1, mmax = 2.0 * (double)round_up(t->m, 8) - 1,
           nmax = 2.0 * (double)round_up(t->n, (size_t)nr) - 1;
    c->v[K_KC] = pick_le(&s->knob[K_KC], fmin(0.5 * ca.l1 / (nr * es), kmax));
    c->v[K_MC] = pick_le(&s->knob[K_MC], fmin(0.5 * ca.l2 / (c->v[K_KC] * es), mmax));
    c->v[K_NC] = pick_le(&s->knob[K_NC], fmin(0.25 * ca.l3 / (c->v[K_KC] * es), nmax));
    c->v[K_KU] = 4;
    c->v[K_ORDER] = TPK__ORDER_JR_IR;
    c->v[K_PAR] = TPK__PAR_IC;
    c->v[K_PF] = 1;
    c->v[K_PB] = s->task.threads > 1 ? 1 : 0;
    /* Shrink blocks that the validity filter rejects for a small problem. */
    while (!tpk_tune_space_valid(s, c) && c->v[K_KC] > 64)
        c->v[K_KC] = pick_le(&s->knob[K_KC], c->v[K_KC] - 1);
    while (!tpk_tune_space_valid(s, c) && c->v[K_MC] > 48)
        c->v[K_MC] = pick_le(&s->knob[K_MC], c->v[K_MC] - 1);
    while (!tpk_tune_space_valid(s, c) && c->v[K_NC] > 256)
        c->v[K_NC] = pick_le(&s->knob[K_NC], c->v[K_NC] - 1);
}

/* ---- emitter ------------------------------------------------------------------------------ */

void tpk_tune_emit_cpu_prelude(FILE *o)
{
    fputs("#include <stddef.h>\n#include <string.h>\n#include <omp.h>\n\n"
          "/* Vector types (GCC vector extensions) and unaligned loads/stores via memcpy, which\n"
          " * GCC turns into single vector moves. */\n", o);
    static const struct { const char *name, *elt; int bytes; } vt[] = {
        {"tpk_v4d", "double", 32}, {"tpk_v8d", "double", 64},
        {"tpk_v8f", "float", 32},  {"tpk_v16f", "float", 64}};
    /* 512-bit types only where the class's flags enable AVX-512: passing them by value is
     * ABI-defined only there (an AVX2 class's file compiles without them). */
    for (int i = 0; i < 4; i++) {
        if (vt[i].bytes == 64)
            fputs("#ifdef __AVX512F__\n", o);
        fprintf(o, "typedef %s %s __attribute__((vector_size(%d)));\n", vt[i].elt, vt[i].name, vt[i].bytes);
        fprintf(o, "static inline %s %s_ld(const %s *p)\n{\n    %s v;\n    memcpy(&v, p, sizeof v);\n    return v;\n}\n",
                vt[i].name, vt[i].name, vt[i].elt, vt[i].name);
        fprintf(o, "static inline void %s_st(%s *p, %s v)\n{\n    memcpy(p, &v, sizeof v);\n}\n",
                vt[i].name, vt[i].elt, vt[i].name);
        if (vt[i].bytes == 64)
            fputs("#endif\n", o);
    }
    fputs("\n", o);
}

/* The register micro-kernel. Packed: a is an mr-row panel stored k-major (a[p·mr + i]).
 * Direct (_ukr_d): a points at row-major A itself (a[i·lda + p]); the mr rows are streams the
 * hardware prefetcher follows, and pf ≥ 2 prefetches each row a few lines ahead. Mutation sites
 * (tune_impl.h): both micro-kernels run full tiles in the verifier's variants with beta ∉ {0, 1}
 * and with beta = 0, alpha ≠ 1 (the packed one with A transposed), the unrolled loop at least
 * twice (kc ≥ 64), the remainder loop whenever ku > 1 (a last k block of 7). */
static void emit_ukr(FILE *o, const char *fn, const tpk__cpu_blocking *bk, const char *T, const char *V,
                     int direct, tpk__mutation *mu)
{
    const tpk__cpu_blocking b = *bk;
    char txt[256], mtx[256];
    if (direct)
        fprintf(o, "/* C[%d×%d] = alpha·a·b + beta·C from %d rows of A in place (stride lda) and a packed panel b (kc×%d). */\n"
                   "static void %s_ukr_d(size_t kc, const %s *restrict a, size_t lda, const %s *restrict b, %s *restrict c,\n"
                   "        size_t ldc, %s alpha, %s beta)\n{\n",
                b.mr, b.nr, b.mr, b.nr, fn, T, T, T, T, T);
    else
        fprintf(o, "/* C[%d×%d] = alpha·a·b + beta·C from packed panels a (kc×%d) and b (kc×%d). */\n"
                   "static void %s_ukr(size_t kc, const %s *restrict a, const %s *restrict b, %s *restrict c,\n"
                   "        size_t ldc, %s alpha, %s beta)\n{\n",
                b.mr, b.nr, b.mr, b.nr, fn, T, T, T, T, T);
    for (int i = 0; i < b.mr; i++) {
        fprintf(o, "    %s", V);
        for (int j = 0; j < b.nv; j++)
            fprintf(o, "%s c%d_%d = {0}", j ? "," : "", i, j);
        fprintf(o, ";\n");
    }
    if (b.pf >= 1)
        for (int i = 0; i < b.mr; i++)
            fprintf(o, "    __builtin_prefetch(c + %d * ldc, 1, 3);\n    __builtin_prefetch(c + %d * ldc + %d, 1, 3);\n",
                    i, i, b.nr - 1);
    fprintf(o, "    size_t p = 0;\n");
    for (int pass = 0; pass < 2; pass++) {
        int steps = pass == 0 ? b.ku : 1;
        if (pass == 0) { /* skipping a k step: terms p = ku, 2ku + 1, ... missing */
            snprintf(txt, sizeof txt, "    for (; p + %d <= kc; p += %d) {\n", b.ku, b.ku);
            snprintf(mtx, sizeof mtx, "    for (; p + %d <= kc; p += %d) {\n", b.ku, b.ku + 1);
            fputs(tpk__site(mu, TPK__MUT_K_SKIP, 1, txt, mtx), o);
        } else /* the last k term of a block dropped */
            fputs(tpk__site(mu, TPK__MUT_K_TAIL, b.ku > 1, "    for (; p < kc; p++) {\n",
                            "    for (; p + 1 < kc; p++) {\n"), o);
        if (pass == 0 && b.pf >= 2 && !direct)
            fprintf(o, "        __builtin_prefetch(a + (p + %d) * %d, 0, 3);\n", 2 * b.ku, b.mr);
        if (pass == 0 && b.pf >= 2 && direct) /* four lines ahead on every row */
            for (int i = 0; i < b.mr; i++)
                fprintf(o, "        __builtin_prefetch(a + %d * lda + p + %d, 0, 3);\n", i, 256 / b.es);
        for (int u = 0; u < steps; u++) {
            const int s0 = pass == 0 && u == 0; /* the sites: first step of the unrolled loop */
            fprintf(o, "        {\n");
            for (int j = 0; j < b.nv; j++) {
                /* the last B vector read from the first one's place */
                snprintf(txt, sizeof txt, "            const %s b%d = %s_ld(b + (p + %d) * %d + %d);\n", V, j, V, u,
                         b.nr, j * b.vl);
                snprintf(mtx, sizeof mtx, "            const %s b%d = %s_ld(b + (p + %d) * %d + %d);\n", V, j, V, u,
                         b.nr, 0);
                fputs(tpk__site(mu, TPK__MUT_UKR_B_INDEX, s0 && j == b.nv - 1 && b.nv > 1, txt, mtx), o);
            }
            for (int i = 0; i < b.mr; i++) {
                /* the last row's A element read from row 0 */
                const int ir = s0 && i == b.mr - 1 && tpk__mut_at(mu, TPK__MUT_UKR_A_INDEX, 1) ? 0 : i;
                if (direct)
                    fprintf(o, "            { const %s ai = a[%d * lda + p + %d];", T, ir, u);
                else
                    fprintf(o, "            { const %s ai = a[(p + %d) * %d + %d];", T, u, b.mr, ir);
                for (int j = 0; j < b.nv; j++) {
                    /* one accumulator's terms added twice */
                    const int dbl = s0 && ((i == 0 && j == 0) || (i == b.mr - 1 && j == b.nv - 1)) &&
                                    tpk__mut_at(mu, TPK__MUT_ACC_DOUBLE, 1);
                    fprintf(o, " c%d_%d += ai * b%d;", i, j, j);
                    if (dbl)
                        fprintf(o, " c%d_%d += ai * b%d;", i, j, j);
                }
                fprintf(o, " }\n");
            }
            fprintf(o, "        }\n");
        }
        fprintf(o, "    }\n");
    }
    fprintf(o, "    if (beta == 0) {\n");
    for (int i = 0; i < b.mr; i++)
        for (int j = 0; j < b.nv; j++) {
            /* alpha dropped from one store */
            const int noalpha = i == 0 && j == 0 && tpk__mut_at(mu, TPK__MUT_STORE_ALPHA, 1);
            fprintf(o, "        %s_st(c + %d * ldc + %d, %sc%d_%d);\n", V, i, j * b.vl, noalpha ? "" : "alpha * ", i, j);
        }
    fprintf(o, "    } else {\n");
    for (int i = 0; i < b.mr; i++)
        for (int j = 0; j < b.nv; j++) {
            /* beta dropped from one store; one row stored with the tile's stride, not C's */
            const int nobeta = i == 0 && j == 0 && tpk__mut_at(mu, TPK__MUT_STORE_BETA, 1);
            const int stride = i == b.mr - 1 && j == 0 && tpk__mut_at(mu, TPK__MUT_STORE_STRIDE, 1);
            char at[64];
            if (stride)
                snprintf(at, sizeof at, "c + %d * %d + %d", i, b.nr, j * b.vl);
            else
                snprintf(at, sizeof at, "c + %d * ldc + %d", i, j * b.vl);
            fprintf(o, "        %s_st(%s, %s%s_ld(%s) + alpha * c%d_%d);\n", V, at, nobeta ? "" : "beta * ", V, at, i, j);
        }
    fprintf(o, "    }\n}\n\n");
}

/* Sites the two macro-kernels share: the partial last panel left out; a tile stored one column to
 * the right (its first column never written); beta dropped from the edge store. */
static const char *panels_tail(tpk__mutation *mu, const tpk__cpu_blocking *b, char *t, char *m)
{
    snprintf(t, 192, "(mc + %d - 1) / %d", b->mr, b->mr);
    snprintf(m, 192, "mc / %d", b->mr);
    return tpk__site(mu, TPK__MUT_PANELS_TAIL, 1, t, m);
}

static const char *tile_offset(tpk__mutation *mu, const tpk__cpu_blocking *b, char *t, char *m)
{
    snprintf(t, 192, "C + ip * %d * ldc + jp * %d", b->mr, b->nr);
    snprintf(m, 192, "C + ip * %d * ldc + jp * %d + 1", b->mr, b->nr);
    return tpk__site(mu, TPK__MUT_TILE_OFFSET, 1, t, m);
}

static const char *edge_beta(tpk__mutation *mu)
{
    return tpk__site(mu, TPK__MUT_EDGE_BETA, 1, "beta == 0 ? 0 : beta * c[i * ldc + j]", "beta == 0 ? 0 : c[i * ldc + j]");
}

static int cpu_gemm_emit(const tpk_tune_space *s, const tpk_tune_config *c, const char *fn,
                         int standalone, tpk__mutation *mu, FILE *o, tpk_ctx *ctx)
{
    (void)ctx;
    tpk__cpu_blocking b;
    tpk__cpu_gemm_blocking(s, c, &b);
    const char *T = b.es == 4 ? "float" : "double";
    char V[16];
    snprintf(V, sizeof V, "tpk_v%d%c", b.vl, b.es == 4 ? 'f' : 'd');
    const char *st = standalone ? "" : "static ";
    char knobs[256];
    tpk_tune_config_str(s, c, knobs, sizeof knobs);
    if (standalone) {
        fprintf(o, "/* Generated by tptune (tpk tuner, cpu_gemm template) - DO NOT EDIT. */\n");
        tpk_tune_emit_cpu_prelude(o);
    }
    fprintf(o, "/* ---- %s: %s%s, %s ---- */\n", fn, b.es == 4 ? "s" : "d", b.syrk ? "syrk (lower triangle)" : "gemm", knobs);
    fprintf(o, "enum { %s_MR = %d, %s_NR = %d, %s_KC = %d, %s_MC = %d, %s_NC = %d };\n\n", fn, b.mr,
            fn, b.nr, fn, b.kc, fn, b.mc, fn, b.nc);

    emit_ukr(o, fn, &b, T, V, 0, mu);
    if (b.pa)
        emit_ukr(o, fn, &b, T, V, 1, mu);
    /* Mutation sites below (tune_impl.h) rely on the verifier's shapes (tuner/verify.c): edge
     * tiles in m and n, two k blocks, two ic blocks, n > nc (gemm; syrk only up to
     * TPK__VERIFY_SYRK_NC_MAX), A and B each row-major and transposed, beta = 0 and beta ∉ {0, 1}.
     * Left out as equivalent there: the zero padding of packed panels (padded rows and columns of
     * an edge tile are never stored), prefetches, the unrolled loop's bound (the remainder loop
     * takes what it leaves). */
    char t1[192], m1[192], t2[192], m2[192];

    /* packing */
    /* packed A: the last row of full panels left out (packed kernels: A row-major runs it);
     * strides swapped in the general loop (A transposed, and the partial panels) */
    snprintf(t1, sizeof t1, "i < %d", b.mr);
    snprintf(m1, sizeof m1, "i + 1 < %d", b.mr);
    fprintf(o,
        "/* Pack an mr_e×kc block of A (strides rsa, csa) into an %d-row panel, zero-padded. */\n"
        "static void %s_pack_a(size_t mr_e, size_t kc, const %s *A, size_t rsa, size_t csa, %s *restrict dst)\n{\n"
        "    if (csa == 1 && mr_e == %d) {\n"
        "        for (size_t i = 0; %s; i++)\n"
        "            for (size_t p = 0; p < kc; p++)\n"
        "                dst[p * %d + i] = A[i * rsa + p];\n"
        "        return;\n    }\n"
        "    for (size_t p = 0; p < kc; p++) {\n"
        "        size_t i = 0;\n"
        "        for (; i < mr_e; i++)\n            dst[p * %d + i] = %s;\n"
        "        for (; i < %d; i++)\n            dst[p * %d + i] = 0;\n"
        "    }\n}\n\n",
        b.mr, fn, T, T, b.mr, tpk__site(mu, TPK__MUT_PACK_A_ROWS, !b.pa, t1, m1), b.mr, b.mr,
        tpk__site(mu, TPK__MUT_PACK_A_STRIDES, 1, "A[i * rsa + p * csa]", "A[i * csa + p * rsa]"), b.mr, b.mr);
    /* packed B: the last column of every panel left out (B row-major, or Aᵀ of a transposed A);
     * strides swapped (B transposed, syrk's Aᵀ of a row-major A) */
    fprintf(o,
        "/* Pack a kc×nr_e block of B (strides rsb, csb) into a %d-column panel, zero-padded. */\n"
        "static void %s_pack_b(size_t nr_e, size_t kc, const %s *B, size_t rsb, size_t csb, %s *restrict dst)\n{\n"
        "    for (size_t p = 0; p < kc; p++) {\n"
        "        size_t j = 0;\n"
        "        if (csb == 1)\n            for (; %s; j++)\n                dst[p * %d + j] = B[p * rsb + j];\n"
        "        else\n            for (; j < nr_e; j++)\n                dst[p * %d + j] = %s;\n"
        "        for (; j < %d; j++)\n            dst[p * %d + j] = 0;\n"
        "    }\n}\n\n",
        b.nr, fn, T, T, tpk__site(mu, TPK__MUT_PACK_B_COLS, 1, "j < nr_e", "j + 1 < nr_e"), b.nr, b.nr,
        tpk__site(mu, TPK__MUT_PACK_B_STRIDES, 1, "B[p * rsb + j * csb]", "B[p * csb + j * rsb]"), b.nr, b.nr);

    /* macro-kernel */
    fprintf(o,
        "/* One packed mc×kc block of A against B panels [jp0, jp1) of the packed kc×nc block%s. */\n"
        "static void %s_macro(size_t mc, size_t nc, size_t kc, const %s *ap, const %s *bp, size_t jp0,\n"
        "        size_t jp1, %s *C, size_t ldc, %s alpha, %s beta, %s *ct%s)\n{\n"
        "    const size_t mpan = %s;\n",
        b.syrk ? "; (i0, j0): where the block sits in C, for the triangle" : "", fn, T, T, T, T, T, T,
        b.syrk ? ", size_t i0, size_t j0" : "", panels_tail(mu, &b, t1, m1));
    const char *outer = b.order == TPK__ORDER_JR_IR ? "    for (size_t jp = jp0; jp < jp1; jp++)\n"
                                                    : "    for (size_t ip = 0; ip < mpan; ip++)\n";
    const char *inner = b.order == TPK__ORDER_JR_IR ? "        for (size_t ip = 0; ip < mpan; ip++) {\n"
                                                    : "        for (size_t jp = jp0; jp < jp1; jp++) {\n";
    fprintf(o, "%s%s", outer, inner);
    fprintf(o,
        "            const size_t mr_e = mc - ip * %d < %d ? mc - ip * %d : %d;\n"
        "            const size_t nr_e = nc - jp * %d < %d ? nc - jp * %d : %d;\n",
        b.mr, b.mr, b.mr, b.mr, b.nr, b.nr, b.nr, b.nr);
    if (b.syrk)
        fprintf(o,
            "            /* Lower triangle: tile rows gi.., columns gj..; skip tiles wholly above it. */\n"
            "            const size_t gi = i0 + ip * %d, gj = j0 + jp * %d;\n"
            "            if (gj > gi + mr_e - 1)\n                continue;\n"
            "            const int diag = gj + nr_e - 1 > gi;\n", b.mr, b.nr);
    /* edge tiles: a full tile's condition with || (a partial tile stored whole: rows past m land
     * in C's guard), syrk's diagonal tiles stored whole; the last row or column of an edge tile
     * left out; beta dropped; syrk's row limit one short (the diagonal entry) or one long (above) */
    const char *tile = tile_offset(mu, &b, t2, m2);
    char cond[96], mcond[96], nodiag[96];
    snprintf(cond, sizeof cond, "mr_e == %d && nr_e == %d%s", b.mr, b.nr, b.syrk ? " && !diag" : "");
    snprintf(mcond, sizeof mcond, "(mr_e == %d || nr_e == %d)%s", b.mr, b.nr, b.syrk ? " && !diag" : "");
    snprintf(nodiag, sizeof nodiag, "mr_e == %d && nr_e == %d", b.mr, b.nr);
    const char *cd = tpk__site(mu, TPK__MUT_EDGE_COND, 1, cond, mcond);
    cd = tpk__site(mu, TPK__MUT_SYRK_DIAG_COND, b.syrk, cd, nodiag);
    const char *rows = tpk__site(mu, TPK__MUT_EDGE_ROWS, 1, "i < mr_e", "i + 1 < mr_e"), *cols;
    if (b.syrk) {
        cols = tpk__site(mu, TPK__MUT_EDGE_COLS, 1,
                         "j < (!diag ? nr_e : gi + i < gj ? 0 : gi + i + 1 - gj < nr_e ? gi + i + 1 - gj : nr_e)",
                         "j < (!diag ? nr_e - 1 : gi + i < gj ? 0 : gi + i + 1 - gj < nr_e ? gi + i + 1 - gj : nr_e)");
        cols = tpk__site(mu, TPK__MUT_SYRK_DIAG_DROP, 1, cols,
                         "j < (!diag ? nr_e : gi + i < gj ? 0 : gi + i - gj < nr_e ? gi + i - gj : nr_e)");
        cols = tpk__site(mu, TPK__MUT_SYRK_DIAG_OVER, 1, cols,
                         "j < (!diag ? nr_e : gi + i < gj ? 0 : gi + i + 2 - gj < nr_e ? gi + i + 2 - gj : nr_e)");
    } else
        cols = tpk__site(mu, TPK__MUT_EDGE_COLS, 1, "j < nr_e", "j + 1 < nr_e");
    const char *bc = edge_beta(mu);
    fprintf(o,
        "            %s *c = %s;\n"
        "            const %s *a = ap + ip * %d * kc, *b = bp + jp * %d * kc;\n"
        "            if (%s) {\n"
        "                %s_ukr(kc, a, b, c, ldc, alpha, beta);\n"
        "                continue;\n"
        "            }\n"
        "            /* Edge tile: full tile into ct, then the valid part into C. */\n"
        "            %s_ukr(kc, a, b, ct, %d, 1, 0);\n"
        "            for (size_t i = 0; %s; i++)\n"
        "                for (size_t j = 0; %s; j++)\n"
        "                    c[i * ldc + j] = (%s) + alpha * ct[i * %d + j];\n"
        "        }\n}\n\n",
        T, tile, T, b.mr, b.nr, cd, fn, fn, b.nr, rows, cols, bc, b.nr);

    if (b.pa) {
        /* Direct A: whole mr-row panels straight from A (row stride lda), the last partial
         * panel packed into ape by the driver. */
        fprintf(o,
            "/* An mc×kc block of A read in place (whole %d-row panels; the partial last one packed in\n"
            " * ape) against B panels [jp0, jp1) of the packed kc×nc block. */\n"
            "static void %s_macro_d(size_t mc, size_t nc, size_t kc, const %s *A, size_t lda, const %s *ape,\n"
            "        const %s *bp, size_t jp0, size_t jp1, %s *C, size_t ldc, %s alpha, %s beta, %s *ct)\n{\n"
            "    const size_t mpan = %s, full = mc / %d;\n%s%s",
            b.mr, fn, T, T, T, T, T, T, T, panels_tail(mu, &b, t1, m1), b.mr, outer, inner); /* the loop order of _macro */
        const char *tile_d = tile_offset(mu, &b, t2, m2);
        snprintf(cond, sizeof cond, "ip < full && nr_e == %d", b.nr);
        snprintf(mcond, sizeof mcond, "ip <= full && nr_e == %d", b.nr); /* the partial panel in place */
        const char *cd_d = tpk__site(mu, TPK__MUT_EDGE_COND, 1, cond, mcond);
        const char *rows_d = tpk__site(mu, TPK__MUT_EDGE_ROWS, 1, "i < mr_e", "i + 1 < mr_e");
        const char *cols_d = tpk__site(mu, TPK__MUT_EDGE_COLS, 1, "j < nr_e", "j + 1 < nr_e");
        const char *bc_d = edge_beta(mu);
        fprintf(o,
            "            const size_t mr_e = mc - ip * %d < %d ? mc - ip * %d : %d;\n"
            "            const size_t nr_e = nc - jp * %d < %d ? nc - jp * %d : %d;\n"
            "            %s *c = %s;\n"
            "            const %s *b = bp + jp * %d * kc;\n"
            "            if (%s) {\n"
            "                %s_ukr_d(kc, A + ip * %d * lda, lda, b, c, ldc, alpha, beta);\n"
            "                continue;\n"
            "            }\n"
            "            if (ip < full)\n"
            "                %s_ukr_d(kc, A + ip * %d * lda, lda, b, ct, %d, 1, 0);\n"
            "            else\n"
            "                %s_ukr(kc, ape, b, ct, %d, 1, 0);\n"
            "            for (size_t i = 0; %s; i++)\n"
            "                for (size_t j = 0; %s; j++)\n"
            "                    c[i * ldc + j] = (%s) + alpha * ct[i * %d + j];\n"
            "        }\n}\n\n",
            b.mr, b.mr, b.mr, b.mr, b.nr, b.nr, b.nr, b.nr, T, tile_d, T, b.nr, cd_d, fn, b.mr, fn, b.mr,
            b.nr, fn, b.nr, rows_d, cols_d, bc_d, b.nr);
    }

    /* workspace and driver */
    size_t apn = (size_t)b.mc * (size_t)b.kc, bpn = (size_t)b.kc * (size_t)b.nc;
    fprintf(o, "/* Workspace bytes for nt threads: %s packed B block and %s packed A block%s. */\n",
            b.pb ? "per thread a" : "the", b.par == TPK__PAR_IC ? "one" : "a shared", b.par == TPK__PAR_IC ? " per thread" : "");
    if (b.pb)
        fprintf(o, "%ssize_t %s_ws(int nt)\n{\n    return (size_t)(nt < 1 ? 1 : nt) * (%zu + %zu) * sizeof(%s);\n}\n\n",
                st, standalone ? "tpk_kernel" : fn, bpn, apn, T);
    else
        fprintf(o, "%ssize_t %s_ws(int nt)\n{\n%s    return (%zu + (size_t)%s * %zu) * sizeof(%s);\n}\n\n",
                st, standalone ? "tpk_kernel" : fn,
                b.par == TPK__PAR_IC ? "" : "    (void)nt; /* one shared A block whatever the threads */\n", bpn,
                b.par == TPK__PAR_IC ? "(nt < 1 ? 1 : nt)" : "1", apn, T);
    if (!standalone)
        fprintf(o, "/* C = alpha·op(A)·op(B) + beta·C; transposes are strides. ws: %s_ws(nt) bytes, 64-aligned. */\n", fn);
    else
        fprintf(o, "size_t tpk_kernel_ws(int nt);\nvoid tpk_kernel(size_t m, size_t n, size_t k, %s alpha, const %s *A, size_t rsa,\n"
                   "        size_t csa, const %s *B, size_t rsb, size_t csb, %s beta, %s *C, size_t ldc, int nt, void *ws);\n\n",
                T, T, T, T, T);
    fprintf(o,
        "%svoid %s(size_t m, size_t n, size_t k, %s alpha, const %s *A, size_t rsa,\n"
        "        size_t csa, const %s *B, size_t rsb, size_t csb, %s beta, %s *C, size_t ldc, int nt, void *ws)\n{\n"
        "    if (m == 0 || n == 0)\n        return;\n"
        "    if (k == 0 || alpha == 0) {\n"
        "        for (size_t i = 0; i < m; i++)\n"
        "            for (size_t j = 0; j < %s; j++)\n"
        "                C[i * ldc + j] = beta == 0 ? 0 : beta * C[i * ldc + j];\n"
        "        return;\n    }\n"
        "    if (nt < 1)\n        nt = 1;\n",
        st, standalone ? "tpk_kernel" : fn, T, T, T, T, T, b.syrk ? "n && j <= i" : "n");
    if (!b.pb)
        fprintf(o, "    %s *const bp = ws, *const ap_all = bp + %zu;\n", T, bpn);
    fprintf(o,
        "#pragma omp parallel num_threads(nt) if (nt > 1)\n"
        "    {\n"
        "        const size_t tid = (size_t)omp_get_thread_num(), nth = (size_t)omp_get_num_threads();\n"
        "        %s ct[%d * %d] __attribute__((aligned(64)));\n", T, b.mr, b.nr);
    if (b.pb)
        fprintf(o,
            "        /* Every thread packs B for itself: no barrier anywhere. */\n"
            "        %s *const bp = (%s *)ws + tid * %zu, *const ap = bp + %zu;\n"
            "        const size_t nblk = (m + %d - 1) / %d, b0 = nblk * tid / nth, b1 = nblk * (tid + 1) / nth;\n",
            T, T, bpn + apn, bpn, b.mc, b.mc);
    /* the last partial B panel left out; beta applied to every k block, or the earlier blocks
     * dropped; every column block packed from the first one's B (needs n > nc) */
    snprintf(t1, sizeof t1, "(nc + %d - 1) / %d", b.nr, b.nr);
    snprintf(m1, sizeof m1, "nc / %d", b.nr);
    const char *npan = tpk__site(mu, TPK__MUT_NPAN_TAIL, 1, t1, m1);
    const char *bet = tpk__site(mu, TPK__MUT_BETA_BLOCKS, 1, "pc == 0 ? beta : 1", "beta");
    bet = tpk__site(mu, TPK__MUT_K_BLOCKS, 1, bet, "pc == 0 ? beta : 0");
    fprintf(o,
        "        for (size_t jc = 0; jc < n; jc += %d) {\n"
        "            const size_t nc = n - jc < %d ? n - jc : %d;\n"
        "            const size_t npan = %s;\n"
        "            for (size_t pc = 0; pc < k; pc += %d) {\n"
        "                const size_t kc = k - pc < %d ? k - pc : %d;\n"
        "                const %s bet = %s;\n",
        b.nc, b.nc, b.nc, npan, b.kc, b.kc, b.kc, T, bet);
    if (b.pb)
        fprintf(o,
            "                if (b0 == b1)\n                    continue;\n"
            "                for (size_t jp = 0; jp < npan; jp++)\n");
    else
        fprintf(o, "                for (size_t jp = tid; jp < npan; jp += nth)\n");
    snprintf(t1, sizeof t1, "(jc + jp * %d)", b.nr);
    snprintf(m1, sizeof m1, "(jp * %d)", b.nr);
    fprintf(o,
        "                    %s_pack_b(nc - jp * %d < %d ? nc - jp * %d : %d, kc, B + pc * rsb + %s * csb,\n"
        "                            rsb, csb, bp + jp * %d * kc);\n",
        fn, b.nr, b.nr, b.nr, b.nr,
        tpk__site(mu, TPK__MUT_JC_OFFSET, !b.syrk || b.nc <= TPK__VERIFY_SYRK_NC_MAX, t1, m1), b.nr);
    if (!b.pb)
        fprintf(o, "#pragma omp barrier\n");
    /* syrk: a row block wholly above the diagonal of this column block does nothing. */
    const char *skip = b.syrk ? "                    if (ic + mc <= jc)\n                        continue;\n" : "";
    if (b.par == TPK__PAR_IC) {
        if (b.pb)
            fprintf(o, "                /* Threads split the ic loop; each packs its own A block. */\n"
                       "                for (size_t ib = b0; %s; ib++) {\n",
                    tpk__site(mu, TPK__MUT_IC_SPLIT, 1, "ib < b1", "ib + 1 < b1")); /* a thread's last block left out */
        else
            fprintf(o,
                "                /* Threads split the ic loop; each packs its own A block. */\n"
                "                %s *const ap = ap_all + tid * %zu;\n"
                "                const size_t nblk = (m + %d - 1) / %d;\n"
                "                for (size_t ib = nblk * tid / nth; %s; ib++) {\n",
                T, apn, b.mc, b.mc,
                tpk__site(mu, TPK__MUT_IC_SPLIT, 1, "ib < nblk * (tid + 1) / nth", "ib + 1 < nblk * (tid + 1) / nth"));
        fprintf(o, "                    const size_t ic = ib * %d, mc = m - ic < %d ? m - ic : %d;\n%s", b.mc,
                b.mc, b.mc, skip);
        if (b.pa)
            fprintf(o,
                "                    if (csa == 1) { /* rows of A contiguous: read them in place */\n"
                "                        const size_t full = mc / %d;\n"
                "                        if (full * %d < mc)\n"
                "                            %s_pack_a(mc - full * %d, kc, A + (ic + full * %d) * rsa + pc, rsa, 1, ap);\n"
                "                        %s_macro_d(mc, nc, kc, %s, rsa, ap, bp, 0, npan, C + ic * ldc + jc,\n"
                "                                ldc, alpha, bet, ct);\n"
                "                        continue;\n"
                "                    }\n",
                b.mr, b.mr, fn, b.mr, b.mr, fn,
                tpk__site(mu, TPK__MUT_PC_OFFSET, 1, "A + ic * rsa + pc", "A + ic * rsa")); /* k offset dropped */
        fprintf(o,
            "                    for (size_t ip = 0; ip * %d < mc; ip++)\n"
            "                        %s_pack_a(mc - ip * %d < %d ? mc - ip * %d : %d, kc, A + (ic + ip * %d) * rsa + %s,\n"
            "                                rsa, csa, ap + ip * %d * kc);\n"
            "                    %s_macro(mc, nc, kc, ap, bp, 0, npan, C + ic * ldc + jc, ldc, alpha, bet, ct%s);\n"
            "                }\n",
            b.mr, fn, b.mr, b.mr, b.mr, b.mr, b.mr, tpk__site(mu, TPK__MUT_PC_OFFSET, 1, "pc * csa", "pc * rsa"), b.mr,
            fn, b.syrk ? ", ic, jc" : "");
    } else
        fprintf(o,
            "                /* Threads pack the A block together and split the jr loop. */\n"
            "                for (size_t ic = 0; ic < m; ic += %d) {\n"
            "                    const size_t mc = m - ic < %d ? m - ic : %d, mpan = (mc + %d - 1) / %d;\n"
            "%s"
            "                    for (size_t ip = tid; ip < mpan; ip += nth)\n"
            "                        %s_pack_a(mc - ip * %d < %d ? mc - ip * %d : %d, kc, A + (ic + ip * %d) * rsa + %s,\n"
            "                                rsa, csa, ap_all + ip * %d * kc);\n"
            "#pragma omp barrier\n"
            "                    %s_macro(mc, nc, kc, ap_all, bp, npan * tid / nth, %s, C + ic * ldc + jc,\n"
            "                            ldc, alpha, bet, ct%s);\n"
            "#pragma omp barrier\n"
            "                }\n",
            b.mc, b.mc, b.mc, b.mr, b.mr, skip, fn, b.mr, b.mr, b.mr, b.mr, b.mr,
            tpk__site(mu, TPK__MUT_PC_OFFSET, 1, "pc * csa", "pc * rsa"), b.mr, fn,
            /* a thread's last B panel left out (a non-empty range: npan ≥ 3 ≥ threads) */
            tpk__site(mu, TPK__MUT_JR_SPLIT, 1, "npan * (tid + 1) / nth",
                      "npan * (tid + 1) / nth - (npan * (tid + 1) / nth > npan * tid / nth)"),
            b.syrk ? ", ic, jc" : "");
    fprintf(o, "%s            }\n        }\n    }\n}\n\n", b.pb ? "" : "#pragma omp barrier\n");
    return TPK_OK;
}

/* ---- the template (space.c lists it) ----------------------------------------------------- */

/* Serves GEMM and SYRK on the CPU. */
static int cpu_gemm_applicable(const tpk_tune_task *t)
{
    return t->target == TPK_TUNE_CPU && (t->op == TPK_TUNE_GEMM || t->op == TPK_TUNE_SYRK);
}

const tpk__template tpk__template_cpu_gemm = {"cpu_gemm", cpu_gemm_applicable, cpu_gemm_space, cpu_gemm_default, cpu_gemm_emit};
