/* The mutation suite of the exact verifier (tptune verify --mutants=N; issue 20 item 3): bugs
 * injected into the emitted source of generated kernels at the sites the emitters mark
 * (tpk__site, tune_impl.h), each mutant compiled and run through the verifier (tuner/verify.c) in
 * a process of its own, so that a crash or a hang is a caught bug, not the suite's end. */
#include "tune_impl.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Every kind: its name and the class of bug it stands for (the list). */
static const struct {
    const char *name, *cls;
} KINDS[TPK__MUT_KINDS] = {
    [TPK__MUT_ACC_DOUBLE] = {"acc_double", "doubled accumulation"},
    [TPK__MUT_UKR_A_INDEX] = {"ukr_a_index", "wrong index"},
    [TPK__MUT_UKR_B_INDEX] = {"ukr_b_index", "wrong index"},
    [TPK__MUT_K_TAIL] = {"k_tail", "off-by-one bound"},
    [TPK__MUT_K_SKIP] = {"k_skip", "off-by-one step"},
    [TPK__MUT_STORE_BETA] = {"store_beta", "dropped term"},
    [TPK__MUT_STORE_ALPHA] = {"store_alpha", "dropped factor"},
    [TPK__MUT_STORE_STRIDE] = {"store_stride", "swapped strides"},
    [TPK__MUT_PACK_A_STRIDES] = {"pack_a_strides", "swapped strides"},
    [TPK__MUT_PACK_A_ROWS] = {"pack_a_rows", "off-by-one bound"},
    [TPK__MUT_PACK_B_STRIDES] = {"pack_b_strides", "swapped strides"},
    [TPK__MUT_PACK_B_COLS] = {"pack_b_cols", "off-by-one bound"},
    [TPK__MUT_EDGE_ROWS] = {"edge_rows", "off-by-one bound"},
    [TPK__MUT_EDGE_COLS] = {"edge_cols", "off-by-one bound"},
    [TPK__MUT_EDGE_BETA] = {"edge_beta", "dropped term"},
    [TPK__MUT_EDGE_COND] = {"edge_cond", "wrong mask"},
    [TPK__MUT_PANELS_TAIL] = {"panels_tail", "dropped tail"},
    [TPK__MUT_TILE_OFFSET] = {"tile_offset", "wrong index"},
    [TPK__MUT_NPAN_TAIL] = {"npan_tail", "dropped tail"},
    [TPK__MUT_BETA_BLOCKS] = {"beta_blocks", "doubled accumulation"},
    [TPK__MUT_K_BLOCKS] = {"k_blocks", "dropped tail"},
    [TPK__MUT_JC_OFFSET] = {"jc_offset", "wrong index"},
    [TPK__MUT_PC_OFFSET] = {"pc_offset", "swapped strides"},
    [TPK__MUT_IC_SPLIT] = {"ic_split", "off-by-one bound"},
    [TPK__MUT_JR_SPLIT] = {"jr_split", "off-by-one bound"},
    [TPK__MUT_SYRK_DIAG_DROP] = {"syrk_diag_drop", "wrong mask"},
    [TPK__MUT_SYRK_DIAG_OVER] = {"syrk_diag_over", "wrong mask"},
    [TPK__MUT_SYRK_DIAG_COND] = {"syrk_diag_cond", "wrong mask"},
    [TPK__MUT_MAP_TAIL_STORE] = {"map_tail_store", "dropped tail"},
    [TPK__MUT_MAP_TAIL_LOAD] = {"map_tail_load", "wrong index"},
    [TPK__MUT_MAP_TAIL_COL] = {"map_tail_col", "wrong index"},
    [TPK__MUT_MAP_TAIL_MASK] = {"map_tail_mask", "wrong mask"},
    [TPK__MUT_MAP_STEP] = {"map_step", "off-by-one step"},
    [TPK__MUT_MAP_ROW_END] = {"map_row_end", "off-by-one bound"},
    [TPK__MUT_MAP_DIAG_COND] = {"map_diag_cond", "off-by-one bound"},
    [TPK__MUT_MAP_DIAG_INDEX] = {"map_diag_index", "wrong index"},
    [TPK__MUT_MAP_ROW_STRIDE] = {"map_row_stride", "swapped strides"},
    [TPK__MUT_MAP_Q_READ] = {"map_q_read", "wrong index"},
    [TPK__MUT_MAP_BLOCK_ROWS] = {"map_block_rows", "dropped tail"},
    [TPK__MUT_MAP_COL_BLOCKS] = {"map_col_blocks", "off-by-one bound"},
    [TPK__MUT_MAP_TILES] = {"map_tiles", "dropped tail"},
    [TPK__MUT_MAP_BALANCED] = {"map_balanced", "off-by-one bound"},
    [TPK__MUT_MAP_FLAG_LANES] = {"map_flag_lanes", "wrong mask"},
    [TPK__MUT_MAP_BLOCK_COLS] = {"map_block_cols", "off-by-one bound"},
    [TPK__MUT_MAP_UNROLL_LOAD] = {"map_unroll_load", "wrong index"},
    [TPK__MUT_MAP_COL_LOAD] = {"map_col_load", "wrong index"},
    [TPK__MUT_EW_STEP] = {"ew_step", "off-by-one step"},
    [TPK__MUT_EW_ROW_END] = {"ew_row_end", "off-by-one bound"},
    [TPK__MUT_EW_ROWS] = {"ew_rows", "dropped tail"},
    [TPK__MUT_EW_TAIL_STORE] = {"ew_tail_store", "dropped tail"},
    [TPK__MUT_EW_TAIL_LOAD] = {"ew_tail_load", "wrong index"},
    [TPK__MUT_EW_IN_ROW] = {"ew_in_row", "swapped strides"},
    [TPK__MUT_EW_COL_SHIFT] = {"ew_col_shift", "wrong index"},
    [TPK__MUT_EW_Q_ROW] = {"ew_q_row", "wrong index"},
    [TPK__MUT_EW_Q_COL] = {"ew_q_col", "wrong index"},
    [TPK__MUT_EW_W_ROW] = {"ew_w_row", "wrong index"},
    [TPK__MUT_EW_W_COL] = {"ew_w_col", "wrong index"},
    [TPK__MUT_EW_STORE_SKIP] = {"ew_store_skip", "dropped store"},
    [TPK__MUT_EW_TERM_DROP] = {"ew_term_drop", "dropped term"},
    [TPK__MUT_EW_ARG_SWAP] = {"ew_arg_swap", "swapped arguments"},
    [TPK__MUT_EW_PAR_SWAP] = {"ew_par_swap", "swapped parameters"},
    [TPK__MUT_EW_ARG_PREV] = {"ew_arg_prev", "wrong index"},
    [TPK__MUT_EW_PRE_END] = {"ew_pre_end", "dropped tail"},
};

const char *tpk__mut_name(int kind)
{
    return kind >= 0 && kind < TPK__MUT_KINDS && KINDS[kind].name ? KINDS[kind].name : "?";
}

int tpk_tune_emit_variant(const tpk_tune_space *s, const tpk_tune_config *c, int twin, const char *mutant, FILE *out,
                          tpk_ctx *ctx)
{
    tpk__mutation mu = {.kind = -1};
    if (mutant) {
        char name[64];
        snprintf(name, sizeof name, "%s", mutant);
        char *colon = strchr(name, ':');
        if (colon) {
            *colon = '\0';
            mu.site = atoi(colon + 1);
        }
        for (int k = 0; k < TPK__MUT_KINDS; k++)
            if (!strcmp(KINDS[k].name, name))
                mu.kind = k;
        if (mu.kind < 0)
            return TPK_ERROR(ctx, TPK_EINVAL, "verify: no mutation kind '%s'", name);
    }
    if (twin && s->task.op != TPK_TUNE_MAP)
        return TPK_ERROR(ctx, TPK_EINVAL, "verify: only map kernels have a Z_p twin");
    int st = twin ? tpk__cpu_map_emit_twin(s, c, &mu, out, ctx) : tpk__emit(s, c, "tpk_kernel", 1, &mu, out, ctx);
    if (!st && mutant && mu.count[mu.kind] <= mu.site)
        st = TPK_ERROR(ctx, TPK_EINVAL, "verify: %s has %d sites here", KINDS[mu.kind].name, mu.count[mu.kind]);
    return st;
}

/* One kernel's source, with mutation mu (NULL-free: kind < 0 only counts the sites). */
static int emit_one(const tpk_tune_space *s, const tpk_tune_config *c, tpk__mutation *mu, FILE *f, tpk_ctx *ctx)
{
    return s->task.op == TPK_TUNE_MAP ? tpk__cpu_map_emit_twin(s, c, mu, f, ctx)
                                      : tpk__emit(s, c, "tpk_kernel", 1, mu, f, ctx);
}

static uint64_t fnv1a(const char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 0x100000001b3ull;
    return h;
}

typedef struct cand {
    size_t kernel;
    int kind, site;
} cand;

/* The child in this process (no runner program): its argv. */
static void child_inproc(void *arg, int fd)
{
    (void)fd; /* the child's stdout is already the pipe */
    char **argv = arg;
    tpk_tune_verify_child_main(11, argv);
    fflush(stdout);
}

/* Run one compiled mutant: 1 caught (with why), 0 passed the verifier, −1 the check could not run. */
static int run_mutant(const char *so, const tpk_tune_space *s, const tpk_tune_config *c, const tpk_tune_mutant_opts *o,
                      char *why, size_t cap)
{
    char rbuf[600], a[8][32];
    const char *runner = tpk__find_runner(o->runner, rbuf, sizeof rbuf);
    snprintf(a[0], 32, "%d", s->task.op);
    snprintf(a[1], 32, "%d", s->task.dtype);
    snprintf(a[2], 32, "%zu", s->task.m);
    snprintf(a[3], 32, "%zu", s->task.n);
    snprintf(a[4], 32, "%zu", s->task.k);
    snprintf(a[5], 32, "%d", s->task.threads);
    snprintf(a[6], 32, "%llu", (unsigned long long)tpk_tune_space_index(s, c));
    snprintf(a[7], 32, "%llu", (unsigned long long)o->seed);
    char *argv[] = {(char *)(runner ? runner : "tptune"), "__verify", (char *)so, a[0], a[1], a[2], a[3], a[4],
                    a[5], a[6], a[7], NULL};
    char out[4096];
    const double tmo = o->timeout_s > 0 ? o->timeout_s : 120;
    if (tpk__run_capture(runner, argv, s->task.threads, tmo, child_inproc, argv, out, sizeof out) != 0) {
        snprintf(why, cap, "crashed or timed out (%.0f s)", tmo);
        return 1;
    }
    const char *p = strstr(out, "TPKVERIFY ");
    if (!p || !strncmp(p + 10, "error", 5)) {
        snprintf(why, cap, "%s", p ? p + 16 : "no result line");
        why[strcspn(why, "\n")] = '\0';
        return -1;
    }
    int runs = 0;
    size_t entries = 0;
    char verdict[16] = "";
    int used = 0;
    if (sscanf(p + 10, "%15s %d %zu %n", verdict, &runs, &entries, &used) < 3)
        return -1;
    snprintf(why, cap, "%s", p + 10 + used);
    why[strcspn(why, "\n")] = '\0';
    if (!strcmp(verdict, "ok")) {
        snprintf(why, cap, "passed %d runs, %zu elements", runs, entries);
        return 0;
    }
    return 1;
}

int tpk_tune_verify_mutants(const tpk_tune_space *s, const tpk_tune_config *c, size_t nk, const tpk_tune_mutant_opts *o,
                            FILE *out, int *caught, tpk_ctx *ctx)
{
    *caught = 0;
    if (o->n < 1 || nk == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "verify: no mutants wanted or no kernels to mutate");
    int want[TPK__MUT_KINDS];
    for (int k = 0; k < TPK__MUT_KINDS; k++) {
        char pat[40];
        snprintf(pat, sizeof pat, ",%s,", KINDS[k].name);
        char list[1024];
        snprintf(list, sizeof list, ",%s,", o->kinds ? o->kinds : "");
        want[k] = !o->kinds || strstr(list, pat) != NULL;
    }
    /* 1. Every kernel's sites, per kind. */
    cand *pool[TPK__MUT_KINDS] = {0};
    size_t npool[TPK__MUT_KINDS] = {0}, total = 0;
    FILE *null = fopen("/dev/null", "w");
    if (!null)
        return TPK_ERROR(ctx, TPK_EIO, "verify: cannot open /dev/null");
    int st = TPK_OK;
    for (size_t i = 0; i < nk && !st; i++) {
        tpk__mutation mu = {.kind = -1};
        st = emit_one(&s[i], &c[i], &mu, null, ctx);
        for (int k = 0; k < TPK__MUT_KINDS && !st; k++) {
            cand *g = realloc(pool[k], (npool[k] + (size_t)mu.count[k] + 1) * sizeof *g);
            if (!g) {
                st = TPK_ERROR(ctx, TPK_ENOMEM, "verify: out of memory");
                break;
            }
            pool[k] = g;
            for (int q = 0; q < mu.count[k] && want[k]; q++)
                pool[k][npool[k]++] = (cand){i, k, q};
            total += want[k] ? (size_t)mu.count[k] : 0;
        }
    }
    fclose(null);
    /* 2. Each kind's sites in a seeded order; then round robin over the kinds, so that the first
     * mutants already span every kind the kernels have. */
    uint64_t rng = o->seed ^ 0x510e527fade682d1ull;
    for (int k = 0; k < TPK__MUT_KINDS && !st; k++)
        for (size_t q = npool[k]; q > 1; q--) {
            size_t r = (size_t)(tpk__rng_next(&rng) % q);
            cand t = pool[k][q - 1];
            pool[k][q - 1] = pool[k][r];
            pool[k][r] = t;
        }
    uint64_t *seen = calloc(total + 1, sizeof *seen);
    if (!st && !seen)
        st = TPK_ERROR(ctx, TPK_ENOMEM, "verify: out of memory");
    if (!st)
        fprintf(out, "mutation suite: %d mutants drawn from %zu sites of %zu kernels (seed %llu); a mutant that is caught "
                     "fails the exact check, crashes or hangs\n", o->n, total, nk, (unsigned long long)o->seed);
    int done = 0, discarded = 0;
    size_t nseen = 0;
    for (size_t round = 0; !st && done < o->n; round++) {
        int any = 0;
        for (int k = 0; k < TPK__MUT_KINDS && !st && done < o->n; k++) {
            if (round >= npool[k])
                continue;
            any = 1;
            const cand cd = pool[k][round];
            tpk__mutation mu = {.kind = cd.kind, .site = cd.site};
            char *text = NULL;
            size_t len = 0;
            FILE *mem = open_memstream(&text, &len);
            if (!mem) {
                st = TPK_ERROR(ctx, TPK_ENOMEM, "verify: out of memory");
                break;
            }
            st = emit_one(&s[cd.kernel], &c[cd.kernel], &mu, mem, ctx);
            fclose(mem);
            const uint64_t h = fnv1a(text ? text : "", len);
            int dup = 0;
            for (size_t q = 0; q < nseen; q++)
                dup |= seen[q] == h;
            if (st || dup) { /* the same source twice is one mutant */
                free(text);
                continue;
            }
            seen[nseen++] = h;
            char src[600], so[600], why[600], name[160];
            st = tpk__scratch(NULL, "mutant", src, so, sizeof src, ctx);
            FILE *f = st ? NULL : fopen(src, "w");
            if (!f || fwrite(text, 1, len, f) != len) {
                if (f)
                    fclose(f);
                free(text);
                if (!st)
                    st = TPK_ERROR(ctx, TPK_EIO, "verify: cannot write %s", src);
                break;
            }
            fclose(f);
            free(text);
            tpk_ctx q;
            tpk_ctx_init(&q);
            const int map = s[cd.kernel].task.op == TPK_TUNE_MAP;
            if (map)
                tpk__cpu_map_kernel_name(&s[cd.kernel], &c[cd.kernel], name, sizeof name);
            else
                tpk__cpu_gemm_kernel_name(&s[cd.kernel], &c[cd.kernel], name, sizeof name);
            if (tpk__compile_cpu(src, so, o->cc, map ? "-Wno-psabi" : NULL, 120, NULL, &q)) {
                /* not a bug the verifier could see: replaced by the next site */
                discarded++;
                fprintf(out, "mutant %s, site %d of %s did not compile: replaced\n", KINDS[cd.kind].name, cd.site, name);
                if (!getenv("TPK_VERIFY_KEEP"))
                    unlink(src);
                continue;
            }
            const int r = run_mutant(so, &s[cd.kernel], &c[cd.kernel], o, why, sizeof why);
            unlink(src);
            unlink(so);
            if (r < 0) {
                st = TPK_ERROR(ctx, TPK_EIO, "verify: mutant %d could not be checked: %s", done + 1, why);
                break;
            }
            done++;
            *caught += r;
            fprintf(out, "mutant %3d/%d %s %s (%s), site %d of %s%s: %s\n", done, o->n, r ? "caught" : "MISSED",
                    KINDS[cd.kind].name, KINDS[cd.kind].cls, cd.site, name, map ? " (Z_p twin)" : "", why);
            fflush(out);
        }
        if (!any)
            break;
    }
    for (int k = 0; k < TPK__MUT_KINDS; k++)
        free(pool[k]);
    free(seen);
    if (st)
        return st;
    if (done < o->n)
        return TPK_ERROR(ctx, TPK_EINVAL, "verify: only %d distinct mutants that compile (%zu sites, %d discarded)",
                         done, total, discarded);
    if (discarded)
        fprintf(out, "%d mutants did not compile and were replaced\n", discarded);
    fprintf(out, "caught %d/%d\n", *caught, o->n);
    return TPK_OK;
}

int tpk_tune_verify_kernel(const tpk_tune_space *s, const tpk_tune_config *c, const tpk_tune_mutant_opts *o, int *ok,
                           char *why, size_t cap, tpk_ctx *ctx)
{
    *ok = 0;
    why[0] = '\0';
    char src[600], so[600];
    int st = tpk__scratch(NULL, "port", src, so, sizeof src, ctx);
    if (st)
        return st;
    FILE *f = fopen(src, "w");
    if (!f)
        return TPK_ERROR(ctx, TPK_EIO, "verify: cannot write %s", src);
    tpk__mutation mu = {.kind = -1};
    st = emit_one(s, c, &mu, f, ctx);
    if (fclose(f) != 0 && !st)
        st = TPK_ERROR(ctx, TPK_EIO, "verify: cannot write %s", src);
    const int map = s->task.op == TPK_TUNE_MAP;
    tpk_ctx q;
    tpk_ctx_init(&q);
    if (!st && tpk__compile_cpu(src, so, o->cc, map ? "-Wno-psabi" : NULL, 120, NULL, &q)) {
        snprintf(why, cap, "does not compile: %s", q.msg);
        unlink(src);
        return TPK_OK;
    }
    unlink(src);
    if (st)
        return st;
    const int r = run_mutant(so, s, c, o, why, cap);
    unlink(so);
    if (r < 0)
        return TPK_ERROR(ctx, TPK_EIO, "verify: the kernel could not be checked: %s", why);
    *ok = r == 0;
    return TPK_OK;
}
