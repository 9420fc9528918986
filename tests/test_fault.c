/* Fault injection (issue 18, item 3): a counting allocator set on the context (tpk/alloc.h) makes
 * the n-th allocation of a call fail, for n = 1, 2, ... until the call succeeds, for every public
 * entry point of libtpk that allocates (grouped by module, as include/tpk/ is). At every n the
 * call must return TPK_ENOMEM (or the one other status its case names), leave "out of memory" in
 * the context, and give back every block it took: the hook counts live blocks, so a leak on an
 * error path, a block freed through the wrong allocator (the hook's header is checked) or one
 * freed twice fails the test, under ASan in `make check-asan` as well.
 * Two passes per call: memory stays short from the n-th allocation on (as a real shortage: every
 * later allocation fails too), and only the n-th fails (the rest of the error path and any retry
 * run with memory again). A call that recovers from a failure (a fallback that needs no memory:
 * a tuned map without its workspace, a memo that is not extended) must return TPK_OK with a clean
 * context. The functions that allocate nothing through the hook are called once each and must
 * take no block (the `none` cases), so that the list below covers the API. Toy sizes: the whole
 * program runs in well under a minute. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/testutil.h"
#include "tpk/tpk.h"

/* ---- the counting allocator ---------------------------------------------------------------- */

typedef struct hook {
    pthread_mutex_t lock;
    long calls;     /* allocations and resizes asked for */
    long fail_at;   /* 0: none fails */
    int sticky;     /* 1: fail_at and every later one fail; 0: fail_at only */
    long failed;    /* refused */
    long live;      /* blocks handed out and not given back */
    long long bytes;
    struct hdr *head; /* the live blocks, newest first (what a leak report names) */
    long trap;      /* TPK_FAULT_TRAP=k: raise SIGTRAP at the k-th allocation (for gdb) */
} hook;

/* In front of every block: its size, its allocation number, the live list, and a mark, so that
 * a block this hook did not hand out (the C library's, or one freed before) is caught when it
 * comes back. 48 bytes keep malloc's alignment. */
typedef struct hdr {
    struct hdr *prev, *next;
    size_t size;
    long seq;       /* which allocation of the run made it */
    unsigned mark, pad[3];
} hdr;
#define MARK_LIVE 0x74706b31u
#define MARK_DEAD 0x64656164u

static void link_block(hook *h, hdr *b)
{
    b->prev = NULL;
    b->next = h->head;
    if (h->head)
        h->head->prev = b;
    h->head = b;
}

static void unlink_block(hook *h, hdr *b)
{
    if (b->prev)
        b->prev->next = b->next;
    else
        h->head = b->next;
    if (b->next)
        b->next->prev = b->prev;
}

static void *hook_fn(void *ud, void *p, size_t n)
{
    hook *h = ud;
    hdr *b = p ? (hdr *)p - 1 : NULL;
    if (b != NULL && b->mark != MARK_LIVE) {
        fprintf(stderr, "fault hook: %p was not handed out by this hook (%s)\n", p,
                b->mark == MARK_DEAD ? "freed already" : "another allocator's block");
        abort();
    }
    if (n == 0) { /* free */
        pthread_mutex_lock(&h->lock);
        h->live--;
        h->bytes -= (long long)b->size;
        unlink_block(h, b);
        pthread_mutex_unlock(&h->lock);
        b->mark = MARK_DEAD;
        free(b);
        return NULL;
    }
    pthread_mutex_lock(&h->lock);
    long k = ++h->calls;
    int fail = h->fail_at > 0 && (k == h->fail_at || (h->sticky && k > h->fail_at));
    h->failed += fail;
    if (b != NULL)
        unlink_block(h, b);
    pthread_mutex_unlock(&h->lock);
    if (k == h->trap)
        raise(SIGTRAP);
    hdr *q = fail ? NULL : realloc(b, sizeof *q + n);
    pthread_mutex_lock(&h->lock);
    if (q == NULL) { /* refused: a resized block stays as it was */
        if (b != NULL)
            link_block(h, b);
        pthread_mutex_unlock(&h->lock);
        return NULL;
    }
    h->live += b == NULL;
    h->bytes += (long long)n - (long long)(b ? q->size : 0);
    q->size = n;
    q->mark = MARK_LIVE;
    q->seq = b ? q->seq : k;
    link_block(h, q);
    pthread_mutex_unlock(&h->lock);
    return q + 1;
}

/* ---- cases --------------------------------------------------------------------------------- */

/* One call (or the few calls that make one use of an entry point), every result freed again:
 * the status of the entry point under test. */
typedef int (*case_fn)(tpk_ctx *ctx);
typedef struct fcase {
    const char *name;
    case_fn fn;
    int also;  /* a status the call may return instead of TPK_ENOMEM (documented below), or 0 */
    int none;  /* the call allocates nothing through the hook */
    long stride; /* > 1: after the first SAMPLED_HEAD allocations, every stride-th one only */
} fcase;

/* The composite drivers (a whole study, a CNN job) make thousands of allocations, each run
 * taking tens of milliseconds: their first SAMPLED_HEAD allocations are failed one by one, then
 * every stride-th, and the last; every allocation site they reach is also reached one by one
 * through the cases of the functions they call. */
#define SAMPLED_HEAD 40

static long total_runs, total_failed, total_recovered;

static void reset(hook *h, long fail_at, int sticky)
{
    h->calls = h->failed = 0;
    h->fail_at = fail_at;
    h->sticky = sticky;
}

static int run_once(const fcase *c, hook *h, tpk_ctx *ctx)
{
    tpk_ctx_init(ctx);
    tpk_ctx_set_allocator(ctx, hook_fn, h);
    /* TPK_FAULT_TRAP=CASE:N:sticky|once:K stops (SIGTRAP, for gdb) at the K-th allocation of that
     * run, e.g. the allocation a leak report names */
    const char *t = getenv("TPK_FAULT_TRAP");
    char name[128], mode[8];
    long tn, tk;
    h->trap = t && sscanf(t, "%127[^:]:%ld:%7[^:]:%ld", name, &tn, mode, &tk) == 4 &&
                      strcmp(name, c->name) == 0 && tn == h->fail_at &&
                      (strcmp(mode, "sticky") == 0) == h->sticky
                  ? tk
                  : 0;
    long live = h->live;
    int st = c->fn(ctx);
    total_runs++;
    if (h->live != live) {
        char seqs[256] = "";
        size_t k = 0;
        for (const hdr *b = h->head; b && k < sizeof seqs - 24; b = b->next)
            k += (size_t)snprintf(seqs + k, sizeof seqs - k, " #%ld (%zu bytes)", b->seq, b->size);
        fail_msg("%s: %ld block(s) not given back (fail_at %ld, %s, status %d: %s); allocations%s",
                 c->name, h->live - live, h->fail_at, h->sticky ? "sticky" : "once", st,
                 ctx->msg, seqs);
    }
    return st;
}

static long next_n(const fcase *c, long n, long n0)
{
    if (c->stride <= 1 || n < SAMPLED_HEAD || n >= n0)
        return n + 1;
    return n + c->stride < n0 ? n + c->stride : n0;
}

static void run_case(const fcase *c)
{
    hook h = {.lock = PTHREAD_MUTEX_INITIALIZER};
    tpk_ctx ctx;
    reset(&h, 0, 0);
    int st = run_once(c, &h, &ctx);
    if (st != TPK_OK)
        fail_msg("%s: fails without faults (%d): %s", c->name, st, ctx.msg);
    long n0 = h.calls;
    if (c->none) {
        if (n0 != 0)
            fail_msg("%s: listed as allocating nothing, took %ld block(s)", c->name, n0);
        return;
    }
    if (n0 == 0)
        fail_msg("%s: allocates nothing through the hook (list it with the `none` cases)", c->name);
    for (int sticky = 1; sticky >= 0; sticky--) {
        for (long n = 1;; n = next_n(c, n, n0)) {
            reset(&h, n, sticky);
            st = run_once(c, &h, &ctx);
            if (h.failed == 0) { /* past the last allocation: the call succeeds again */
                if (st != TPK_OK)
                    fail_msg("%s: no fault at n = %ld, yet status %d: %s", c->name, n, st, ctx.msg);
                break;
            }
            total_failed++;
            if (st == TPK_OK) {
                if (ctx.status != TPK_OK)
                    fail_msg("%s: n = %ld (%s): TPK_OK with an error left in the context: %s",
                             c->name, n, sticky ? "sticky" : "once", ctx.msg);
                total_recovered++;
                continue;
            }
            if (st != TPK_ENOMEM && st != c->also)
                fail_msg("%s: n = %ld (%s): status %d (%s), not TPK_ENOMEM: %s", c->name, n,
                         sticky ? "sticky" : "once", st, tpk_strerror(st), ctx.msg);
            if (ctx.status != st)
                fail_msg("%s: n = %ld: returned %d but the context holds %d (%s)", c->name, n, st,
                         ctx.status, ctx.msg);
            if (st == TPK_ENOMEM && strstr(ctx.msg, "out of memory") == NULL)
                fail_msg("%s: n = %ld: TPK_ENOMEM without \"out of memory\": %s", c->name, n,
                         ctx.msg);
            if (n > 4 * n0 + 1000)
                fail_msg("%s: still failing at n = %ld (%ld allocations without faults)", c->name,
                         n, n0);
        }
    }
}

static void run_group(const char *group, const fcase *cases, size_t n)
{
    long r0 = total_runs;
    double t0 = tpk_wall_seconds();
    int alloc = 0, none = 0;
    const int verbose = getenv("TPK_FAULT_VERBOSE") != NULL;
    const char *only = getenv("TPK_FAULT_ONLY"); /* one case, by name (debugging) */
    for (size_t i = 0; i < n; i++) {
        if (only != NULL && strcmp(only, cases[i].name) != 0)
            continue;
        long rc = total_runs;
        double tc = tpk_wall_seconds();
        run_case(&cases[i]);
        if (verbose)
            print_message("  %-32s %5ld runs %7.3f s\n", cases[i].name, total_runs - rc,
                          tpk_wall_seconds() - tc);
        alloc += !cases[i].none;
        none += cases[i].none;
    }
    print_message("%-9s %2d allocating entry points, %2d allocating none: %6ld runs, %.2f s\n",
                  group, alloc, none, total_runs - r0, tpk_wall_seconds() - t0);
}

#define CASE(f) {#f, case_##f, 0, 0, 0}
#define CASE_ALSO(f, st) {#f, case_##f, st, 0, 0}
#define SAMPLED(f, stride) {#f, case_##f, 0, 0, stride}
#define NONE(f) {#f, case_##f, 0, 1, 0}
#define PTR(expr) ((expr) != NULL ? TPK_OK : ctx->status)

/* ---- fixtures (made with the default allocator, outside the counted calls) ------------------ */

enum { N = 5, D = 3, M = 3 };
static tu_env *env;
static char root_dir[1024];
static tpk_phi_registry *reg;
static tpk_phi *relu, *erf_, *tanh_;
static tpk_gauss_ws *gws;
static tpk_program *mlp_prog, *cnn_prog, *rnn_prog, *lstm_prog;
static tpk_array *X, *Xt, *Xseq, *Ximg, *Y, *Kn, *Kxt, *Kdiag, *Ktt;
static char path_npy[1100], path_csv[1100], path_npz[1100], path_h5[1100], path_idx[1100];
static char path_out[1100], path_mlp[1100], path_seq[1100], path_kfile[1100], path_lab[1100];

static double val(size_t i, double shift)
{
    return sin(1.37 * (double)i + shift) + 0.1 * cos(0.71 * (double)(i * i) + shift);
}

static tpk_array *filled(int ndim, const size_t *dims, double shift)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_array *a = tpk_array_alloc(ndim, dims, &ctx);
    assert_non_null(a);
    for (size_t i = 0; i < tpk_array_size(a); i++)
        a->data[i] = val(i, shift);
    return a;
}

static tpk_array *kernel_of(const tpk_array *A, const tpk_array *B, double diag)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    size_t n = A->dims[0], m = B->dims[0], d = tpk_array_item_size(A);
    tpk_array *K = tpk_array_alloc2(n, m, &ctx);
    assert_non_null(K);
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < m; j++) {
            double s = 0;
            for (size_t k = 0; k < d; k++)
                s += A->data[i * d + k] * B->data[j * d + k];
            K->data[i * m + j] = 0.8 * s / (double)d + 0.3 + (i == j && A == B ? diag : 0.0);
        }
    return K;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int setup(void **state)
{
    (void)state;
    void *e = NULL;
    if (tu_setup_tagged(&e, "fault"))
        return -1;
    env = e;
    const char *r = getenv("TPK_ROOT");
    snprintf(root_dir, sizeof root_dir, "%s", r ? r : ".");
    omp_set_num_threads(1); /* one order of allocations: the n-th is the same block every run */
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    reg = tpk_job_registry(&ctx);
    relu = tpk_phi_alloc(reg, "relu", &ctx);
    erf_ = tpk_phi_alloc(reg, "erf", &ctx);
    tanh_ = tpk_phi_alloc(reg, "tanh", &ctx);
    gws = tpk_gauss_ws_alloc(TPK_GAUSS_DEFAULT_DEGREE, &ctx);
    if (!reg || !relu || !erf_ || !tanh_ || !gws)
        return -1;
    size_t dx[2] = {N, D}, dt[2] = {M, D}, ds[3] = {N, 2, D}, di[3] = {3, 4, 1}, dy[2] = {N, 2};
    X = filled(2, dx, 0.0);
    Xt = filled(2, dt, 1.9);
    Xseq = filled(3, ds, 0.4);
    Ximg = filled(3, di, 0.8);
    Y = filled(2, dy, 2.5);
    Kn = kernel_of(X, X, 0.05);
    Kxt = kernel_of(Xt, X, 0.0);
    Ktt = kernel_of(Xt, Xt, 0.05);
    size_t dd[1] = {M};
    Kdiag = filled(1, dd, 0.0);
    for (size_t i = 0; i < M; i++)
        Kdiag->data[i] = Ktt->data[i * M + i];
    tu_write_npy(tu_path(env, path_npy, sizeof path_npy, "x.npy"), X->data, 2, dx);
    tu_write_npy(tu_path(env, path_seq, sizeof path_seq, "seq.npy"), Xseq->data, 3, ds);
    write_text(tu_path(env, path_csv, sizeof path_csv, "x.csv"),
               "a,b,c\n0.25,1.5,-2\n3.125,0.5,7\n-1,2,0.75\n");
    snprintf(path_npz, sizeof path_npz, "%s/tests/fuzz/corpus-npz/two.npz:x", root_dir);
    snprintf(path_idx, sizeof path_idx, "%s/tests/fuzz/corpus-idx/f8.idx", root_dir);
    tu_path(env, path_h5, sizeof path_h5, "x.h5");
    tu_h5_write(path_h5, "/x", X->data, N, D);
    size_t pos = strlen(path_h5);
    snprintf(path_h5 + pos, sizeof path_h5 - pos, ":/x");
    /* one output path for every case; some write it without provenance (tpk_h5out's own
     * cases), so the jobs that replace it are forced (tpk_h5out_check_replace) */
    tu_path(env, path_out, sizeof path_out, "out.h5");
    tu_path(env, path_kfile, sizeof path_kfile, "k.h5");
    tu_h5_write(path_kfile, "/kernel", Kn->data, N, N);
    {
        /* tu_h5_write makes a new file: the other datasets through the library's own writer */
        tpk_h5out *o = tpk_h5out_open(path_kfile, &ctx);
        assert_non_null(o);
        assert_int_equal(tpk_h5out_write(o, "/kernel", Kn, &ctx), 0);
        assert_int_equal(tpk_h5out_write(o, "/kernel_test_train", Kxt, &ctx), 0);
        assert_int_equal(tpk_h5out_write(o, "/kernel_test_diag", Kdiag, &ctx), 0);
        assert_int_equal(tpk_h5out_commit(o, &ctx), 0);
    }
    tu_write_npy(tu_path(env, path_lab, sizeof path_lab, "y.npy"), Y->data, 2, dy);
    snprintf(path_mlp, sizeof path_mlp, "%s/programs/mlp.nsr", root_dir);
    tpk_param_set sets[] = {{"L", "2"}};
    tpk_netsor_opts no = {.sets = sets, .nsets = 1};
    mlp_prog = tpk_netsor_load_file(path_mlp, &no, reg, &ctx);
    char p2[1100];
    snprintf(p2, sizeof p2, "%s/programs/cnn1d.nsr", root_dir);
    tpk_param_set cs[] = {{"L", "1"}, {"T", "4"}};
    tpk_netsor_opts co = {.sets = cs, .nsets = 2};
    cnn_prog = tpk_netsor_load_file(p2, &co, reg, &ctx);
    snprintf(p2, sizeof p2, "%s/programs/rnn.nsr", root_dir);
    tpk_param_set rs[] = {{"T", "2"}};
    tpk_netsor_opts ro = {.sets = rs, .nsets = 1};
    rnn_prog = tpk_netsor_load_file(p2, &ro, reg, &ctx);
    snprintf(p2, sizeof p2, "%s/programs/lstm.nsr", root_dir); /* T = 2: the joint sampler */
    lstm_prog = tpk_netsor_load_file(p2, &ro, reg, &ctx);
    if (!mlp_prog || !cnn_prog || !rnn_prog || !lstm_prog) {
        fprintf(stderr, "fault setup: %s\n", ctx.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    print_message("fault injection: %ld runs, %ld with a failed allocation, %ld of them recovered "
                  "(a fallback that needs no memory)\n", total_runs, total_failed, total_recovered);
    tpk_program_free(mlp_prog);
    tpk_program_free(cnn_prog);
    tpk_program_free(rnn_prog);
    tpk_program_free(lstm_prog);
    tpk_array *arrs[] = {X, Xt, Xseq, Ximg, Y, Kn, Kxt, Kdiag, Ktt};
    for (size_t i = 0; i < sizeof arrs / sizeof arrs[0]; i++)
        tpk_array_free(arrs[i]);
    tpk_gauss_ws_free(gws);
    tpk_phi_free(relu);
    tpk_phi_free(erf_);
    tpk_phi_free(tanh_);
    tpk_phi_registry_free(reg);
    void *e = env;
    return tu_teardown(&e);
}

/* ---- core: arrays, readers, the HDF5 writer ------------------------------------------------- */

/* The helpers of tpk/alloc.h themselves: each failure reported, nothing kept. */
static int case_tpk_alloc_helpers(tpk_ctx *ctx)
{
    char *a = tpk_malloc(ctx, 10), *b = a ? tpk_calloc(ctx, 3, 7) : NULL;
    char *c = b ? tpk_strdup(ctx, "fault") : NULL, *d = c ? tpk_strndup(ctx, "injection", 3) : NULL;
    double *e = d ? tpk_aligned_alloc(ctx, 64, 100) : NULL;
    int st = e ? TPK_OK : ctx->status;
    if (e != NULL && ((uintptr_t)e % 64 != 0 || strcmp(d, "inj") != 0 || b[20] != 0))
        fail_msg("tpk/alloc.h helpers: misaligned block or wrong contents");
    if (st == TPK_OK) {
        char *r = tpk_realloc(ctx, a, 1000); /* on failure a stays valid */
        a = r ? r : a;
        st = r ? TPK_OK : ctx->status;
    }
    if (st == TPK_OK) {
        char *r = tpk_reallocarray(ctx, c, 40, 2);
        c = r ? r : c;
        st = r ? TPK_OK : ctx->status;
    }
    tpk_allocator al = tpk_ctx_allocator(ctx);
    void *f = st ? NULL : tpk_mem_calloc(&al, 2, 8, ctx);
    if (st == TPK_OK && f == NULL)
        st = ctx->status;
    tpk_mem_free(&al, f);
    tpk_aligned_free(ctx, e);
    tpk_free(ctx, d);
    tpk_free(ctx, c);
    tpk_free(ctx, b);
    tpk_free(ctx, a);
    return st;
}

static int case_tpk_checks(tpk_ctx *ctx)
{
    tpk_cnn_params cp = {.rows = 1, .cols = 4, .channels = 1, .kh = 1, .kw = 3, .depth = 1,
                         .phi = relu, .sigma_u2 = 1, .sigma_w2 = 1, .sigma_v2 = 1};
    tpk_mlp_params mp = {.depth = 2, .phi = relu, .sigma_w2 = 2, .sigma_b2 = 0};
    int st = tpk_cnn_params_check(&cp, ctx);
    if (!st)
        st = tpk_mlp_params_check(&mp, ctx);
    if (!st)
        st = tpk_array_check_memory(1000, "x", ctx);
    if (!st)
        st = tpk_array_check_scale(X, "x", ctx);
    if (!st)
        st = tpk_array_check_items(Xt, "test", X, "train", ctx);
    return st;
}

static int case_tpk_array_alloc(tpk_ctx *ctx)
{
    size_t d[3] = {2, 3, 4};
    tpk_array *a = tpk_array_alloc(3, d, ctx);
    int st = PTR(a);
    tpk_array_free(a);
    return st;
}

static int case_tpk_array_alloc2(tpk_ctx *ctx)
{
    tpk_array *a = tpk_array_alloc2(3, 7, ctx);
    int st = PTR(a);
    tpk_array_free(a);
    return st;
}

static int case_tpk_array_block(tpk_ctx *ctx)
{
    tpk_array *a = tpk_array_block(Kn, 1, 3, 2, 2, ctx);
    int st = PTR(a);
    tpk_array_free(a);
    return st;
}

static int read_spec(const char *spec, tpk_ctx *ctx)
{
    tpk_input_info info;
    tpk_array *a = tpk_io_read(spec, &info, ctx);
    int st = PTR(a);
    tpk_array_free(a);
    return st;
}

static int case_tpk_io_read_npy(tpk_ctx *ctx) { return read_spec(path_npy, ctx); }
static int case_tpk_io_read_npz(tpk_ctx *ctx) { return read_spec(path_npz, ctx); }
static int case_tpk_io_read_csv(tpk_ctx *ctx) { return read_spec(path_csv, ctx); }
static int case_tpk_io_read_h5(tpk_ctx *ctx) { return read_spec(path_h5, ctx); }

static int case_tpk_idx_read(tpk_ctx *ctx)
{
    tpk_array *a = tpk_idx_read(path_idx, 0, ctx);
    int st = PTR(a);
    tpk_array_free(a);
    return st;
}

static int case_tpk_io_read_attr_str(tpk_ctx *ctx)
{
    char buf[64];
    return tpk_io_read_attr_str(path_kfile, "/", "toolkit_version", buf, sizeof buf, ctx) ==
                   TPK_ENOTFOUND
               ? TPK_OK
               : ctx->status;
}

static int case_tpk_io_check_output(tpk_ctx *ctx)
{
    const char *in[] = {path_npy, path_h5};
    return tpk_io_check_output(path_out, in, 2, ctx);
}

/* An output with every kind of content: tpk_h5out_open, then the writer under test, then abort
 * (the temporary goes) or, for commit, the whole file. */
typedef int (*h5op)(tpk_h5out *o, tpk_ctx *ctx);

static int with_output(h5op op, int commit, tpk_ctx *ctx)
{
    tpk_h5out *o = tpk_h5out_open(path_out, ctx);
    if (o == NULL)
        return ctx->status;
    int st = op ? op(o, ctx) : TPK_OK;
    if (commit)
        return st ? (tpk_h5out_abort(o), st) : tpk_h5out_commit(o, ctx);
    tpk_h5out_abort(o);
    return st;
}

static int op_write(tpk_h5out *o, tpk_ctx *ctx) { return tpk_h5out_write(o, "/g/kernel", Kn, ctx); }
static int op_vector(tpk_h5out *o, tpk_ctx *ctx)
{
    return tpk_h5out_write_vector(o, "/v", Kdiag->data, M, ctx);
}
static int op_ints(tpk_h5out *o, tpk_ctx *ctx)
{
    const long long v[] = {3, 1, 4};
    return tpk_h5out_write_ints(o, "/i", v, 3, ctx);
}
static int op_dims(tpk_h5out *o, tpk_ctx *ctx)
{
    const char *const names[] = {"input", "input2"};
    int st = tpk_h5out_write(o, "/kernel", Kn, ctx);
    return st ? st : tpk_h5out_dims(o, "/kernel", names, 2, ctx);
}
static int op_coords(tpk_h5out *o, tpk_ctx *ctx)
{
    const long long w[] = {16, 32};
    const double s[] = {0.5, 2.25};
    const char *const lab[] = {"mean", "lo", "hi"};
    int st = tpk_h5out_coord_ints(o, "width", w, 2, ctx);
    if (!st)
        st = tpk_h5out_coord_doubles(o, "scale", s, 2, ctx);
    if (!st)
        st = tpk_h5out_coord_labels(o, "field", lab, 3, ctx);
    return st;
}
static int op_attrs(tpk_h5out *o, tpk_ctx *ctx)
{
    int st = tpk_h5out_attr_str(o, "/", "k", "v", ctx);
    if (!st)
        st = tpk_h5out_attr_double(o, "/", "d", 2.5, ctx);
    if (!st)
        st = tpk_h5out_attr_int(o, "/", "i", 7, ctx);
    if (!st)
        st = tpk_h5out_attr_auto(o, "/", "a", "0.125", ctx);
    return st;
}
static int op_provenance(tpk_h5out *o, tpk_ctx *ctx)
{
    char a0[] = "prog", a1[] = "--it's", a2[] = "x y";
    char *argv[] = {a0, a1, a2};
    return tpk_h5out_provenance(o, 3, argv, ctx);
}
static int op_input_attrs(tpk_h5out *o, tpk_ctx *ctx)
{
    tpk_input_info info = {.format = "npy"};
    snprintf(info.path, sizeof info.path, "%.1000s", path_npy);
    return tpk_h5out_input_attrs(o, "input", &info, X, ctx);
}

static int case_tpk_h5out_open(tpk_ctx *ctx) { return with_output(NULL, 0, ctx); }
static int case_tpk_h5out_write(tpk_ctx *ctx) { return with_output(op_write, 0, ctx); }
static int case_tpk_h5out_write_vector(tpk_ctx *ctx) { return with_output(op_vector, 0, ctx); }
static int case_tpk_h5out_write_ints(tpk_ctx *ctx) { return with_output(op_ints, 0, ctx); }
static int case_tpk_h5out_dims(tpk_ctx *ctx) { return with_output(op_dims, 0, ctx); }
static int case_tpk_h5out_coords(tpk_ctx *ctx) { return with_output(op_coords, 0, ctx); }
static int case_tpk_h5out_attrs(tpk_ctx *ctx) { return with_output(op_attrs, 0, ctx); }
static int case_tpk_h5out_provenance(tpk_ctx *ctx) { return with_output(op_provenance, 0, ctx); }
static int case_tpk_h5out_input_attrs(tpk_ctx *ctx) { return with_output(op_input_attrs, 0, ctx); }
static int case_tpk_h5out_commit(tpk_ctx *ctx) { return with_output(op_write, 1, ctx); }

/* A temp file another writer made (gpkernel-mpi's HDF5 phase), finished by the library: adopt,
 * write, abort (the adopted temp stays, as documented), then the file is removed here. */
static int case_tpk_h5out_adopt(tpk_ctx *ctx)
{
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s/.out.h5.mpi", env->tmpdir);
    tu_h5_write(tmp, "/first", Kn->data, N, N);
    tpk_h5out *o = tpk_h5out_adopt(path_out, tmp, ctx);
    int st = o ? tpk_h5out_write(o, "/kernel", Kn, ctx) : ctx->status;
    if (o && !st && tpk_h5out_has(o, "/kernel") != 1)
        fail_msg("tpk_h5out_adopt: the written dataset is not there");
    tpk_h5out_abort(o);
    remove(tmp);
    return st;
}

static int progress_calls;
static void count_progress(const tpk_progress_info *p, void *user)
{
    (void)p;
    (void)user;
    progress_calls++;
}

/* The progress entry points (core/progress.c): a report to a callback, the flag, the check. */
static int case_tpk_progress(tpk_ctx *ctx)
{
    static volatile sig_atomic_t flag;
    const tpk_progress pr = {count_progress, NULL, &flag};
    int st = tpk_progress_report(&pr, "steps", 1, 3, ctx);
    if (!st && (tpk_progress_cancelled(&pr) || tpk_progress_check(&pr, ctx) ||
                tpk_progress_report(NULL, "steps", 2, 3, ctx)))
        st = ctx->status ? ctx->status : TPK_EINVAL;
    return st;
}

static void drop_note(void *ud, const char *msg)
{
    (void)msg;
    (*(int *)ud)++;
}

/* Notes (tpk/error.h) through a callback, and the contexts that inherit them. */
static int case_tpk_notes(tpk_ctx *ctx)
{
    int seen = 0;
    tpk_ctx c;
    tpk_ctx_init_from(&c, ctx);
    tpk_ctx_set_notes(&c, drop_note, &seen);
    tpk_note(&c, "a note %d", 1);
    tpk_ctx sub2;
    tpk_ctx_init_from(&sub2, &c);
    tpk_note(&sub2, "inherited");
    tpk_ctx_clear(&sub2);
    tpk_note(&sub2, "kept by clear");
    tpk_note(NULL, "dropped");
    return seen == 3 ? TPK_OK : TPK_EINVAL;
}

static const fcase core_cases[] = {
    CASE(tpk_alloc_helpers), NONE(tpk_checks), CASE(tpk_array_alloc), CASE(tpk_array_alloc2),
    CASE(tpk_array_block),
    CASE(tpk_io_read_npy), CASE(tpk_io_read_npz), CASE(tpk_io_read_csv), CASE(tpk_io_read_h5),
    CASE(tpk_idx_read), NONE(tpk_io_read_attr_str), NONE(tpk_io_check_output),
    CASE(tpk_h5out_open), CASE(tpk_h5out_write), CASE(tpk_h5out_write_vector),
    CASE(tpk_h5out_write_ints), CASE(tpk_h5out_dims), CASE(tpk_h5out_coords),
    CASE(tpk_h5out_attrs), CASE(tpk_h5out_provenance), CASE(tpk_h5out_input_attrs),
    CASE(tpk_h5out_commit), CASE(tpk_h5out_adopt), NONE(tpk_progress), NONE(tpk_notes),
};

static void test_core(void **state)
{
    (void)state;
    run_group("core", core_cases, sizeof core_cases / sizeof core_cases[0]);
}


/* ---- runtime: GEMM, SYRK and the ReLU map (workspaces from the hook when none is given) ----- */

/* Sizes at which the dispatchers pick a tuned kernel where this CPU has a class (it then takes
 * its workspace from the hook), else the reference / BLAS path: the `none` flag of these cases
 * is decided at run time (below). */
enum { GM = 64 };
static double ga[GM * GM], gb[GM * GM], gc[GM * GM];
static float fa[GM * GM], fb[GM * GM], fc[GM * GM];

static void fill_gemm(void)
{
    for (size_t i = 0; i < GM * GM; i++) {
        ga[i] = val(i, 0.1);
        gb[i] = val(i, 0.9);
        fa[i] = (float)ga[i];
        fb[i] = (float)gb[i];
    }
    for (size_t i = 0; i < GM; i++) { /* a PSD S for the map: A Aᵀ */
        for (size_t j = 0; j < GM; j++) {
            double x = 0;
            for (size_t k = 0; k < GM; k++)
                x += ga[i * GM + k] * ga[j * GM + k];
            gb[i * GM + j] = x / GM;
            fb[i * GM + j] = (float)(x / GM);
        }
    }
}

static int case_tpk_gemm_tuned_d(tpk_ctx *ctx)
{
    return tpk_gemm_tuned_d(0, 1, GM, GM, GM, 1.0, ga, GM, ga, GM, 0.0, gc, GM, 1, NULL, ctx);
}
static int case_tpk_gemm_tuned_s(tpk_ctx *ctx)
{
    return tpk_gemm_tuned_s(0, 1, GM, GM, GM, 1.0f, fa, GM, fa, GM, 0.0f, fc, GM, 1, NULL, ctx);
}
static int case_tpk_syrk_tuned_d(tpk_ctx *ctx)
{
    return tpk_syrk_tuned_d(0, GM, GM, 1.0, ga, GM, 0.0, gc, GM, 1, NULL, ctx);
}
static int case_tpk_syrk_tuned_s(tpk_ctx *ctx)
{
    return tpk_syrk_tuned_s(0, GM, GM, 1.0f, fa, GM, 0.0f, fc, GM, 1, NULL, ctx);
}
static int case_tpk_relu_map_tuned_d(tpk_ctx *ctx)
{
    int bad = 0;
    return tpk_relu_map_tuned_d(GM, gb, GM, 1.0, 0.0, gc, GM, 1, NULL, &bad, ctx);
}
static int case_tpk_relu_map_tuned_s(tpk_ctx *ctx)
{
    int bad = 0;
    return tpk_relu_map_tuned_s(GM, fb, GM, 1.0f, 0.0f, fc, GM, 1, NULL, &bad, ctx);
}
static int case_tpk_dgemm(tpk_ctx *ctx)
{
    return tpk_dgemm(0, 0, GM, GM, GM, 1.0, ga, GM, ga, GM, 0.0, gc, GM, ctx);
}
static int case_tpk_dsyrk(tpk_ctx *ctx)
{
    return tpk_dsyrk(0, GM, GM, 1.0, ga, GM, 0.0, gc, GM, ctx);
}

static int case_tpk_dtrmm(tpk_ctx *ctx)
{
    memcpy(gc, gb, sizeof gc);
    int st = tpk_dtrmm(TPK_LEFT, TPK_LOWER, 0, GM, GM, 1.0, ga, GM, gc, GM, ctx);
    return st ? st : tpk_dtrmm(TPK_RIGHT, TPK_UPPER, 1, GM, GM, 0.5, ga, GM, gc, GM, ctx);
}

static void test_runtime(void **state)
{
    (void)state;
    fill_gemm();
    /* a dispatcher allocates only when it runs a tuned kernel of a class this CPU has */
    int d = tpk_gemm_tuned_choice(0, GM, GM, GM, 1, NULL) != TPK_GEMM_OPENBLAS &&
            tpk_gemm_tuned_ws_size(0, GM, GM, GM, 1) > 0;
    int sg = tpk_gemm_tuned_choice(1, GM, GM, GM, 1, NULL) != TPK_GEMM_OPENBLAS &&
             tpk_gemm_tuned_ws_size(1, GM, GM, GM, 1) > 0;
    int sy = tpk_syrk_tuned_choice(0, GM, GM, 1, NULL) != TPK_GEMM_OPENBLAS &&
             tpk_syrk_tuned_ws_size(0, GM, GM, 1) > 0;
    int ss = tpk_syrk_tuned_choice(1, GM, GM, 1, NULL) != TPK_GEMM_OPENBLAS &&
             tpk_syrk_tuned_ws_size(1, GM, GM, 1) > 0;
    int md = tpk_relu_map_tuned_ws_size(0, GM, 1) > 0;
    int ms = tpk_relu_map_tuned_ws_size(1, GM, 1) > 0;
    const fcase cases[] = {
        {"tpk_gemm_tuned_d", case_tpk_gemm_tuned_d, 0, !d, 0},
        {"tpk_gemm_tuned_s", case_tpk_gemm_tuned_s, 0, !sg, 0},
        {"tpk_syrk_tuned_d", case_tpk_syrk_tuned_d, 0, !sy, 0},
        {"tpk_syrk_tuned_s", case_tpk_syrk_tuned_s, 0, !ss, 0},
        {"tpk_relu_map_tuned_d", case_tpk_relu_map_tuned_d, 0, !md, 0},
        {"tpk_relu_map_tuned_s", case_tpk_relu_map_tuned_s, 0, !ms, 0},
        {"tpk_dgemm", case_tpk_dgemm, 0, !d, 0},
        {"tpk_dsyrk", case_tpk_dsyrk, 0, !sy, 0},
        NONE(tpk_dtrmm),
    };
    run_group("runtime", cases, sizeof cases / sizeof cases[0]);
}

/* ---- kernels: φ, Gaussian expectations and maps, batchnorm, CNN, attention, MVN, MLP -------- */

static double f_cube(double x, const double *p)
{
    return p[0] * x * x * x;
}

static int case_tpk_phi_registry_alloc(tpk_ctx *ctx)
{
    tpk_phi_registry *r = tpk_phi_registry_alloc(ctx);
    int st = PTR(r);
    tpk_phi_registry_free(r);
    return st;
}

static int case_tpk_phi_register(tpk_ctx *ctx)
{
    tpk_phi_registry *r = tpk_phi_registry_alloc(ctx);
    if (r == NULL)
        return ctx->status;
    const double one = 1.0;
    char name[16];
    int st = TPK_OK;
    for (int i = 0; i < 10 && st == TPK_OK; i++) { /* past the first capacity: the table grows */
        snprintf(name, sizeof name, "cube%d", i);
        st = tpk_phi_register(r, name, f_cube, 1, &one, TPK_PHI_POLY_BOUNDED, ctx);
    }
    tpk_phi *p = st ? NULL : tpk_phi_alloc(r, "cube9(2.5)", ctx);
    if (st == TPK_OK)
        st = PTR(p);
    tpk_phi_free(p);
    tpk_phi_registry_free(r);
    return st;
}

static int case_tpk_phi_alloc(tpk_ctx *ctx)
{
    tpk_phi *p = tpk_phi_alloc(reg, "leaky_relu(0.1)", ctx);
    int st = PTR(p);
    tpk_phi_free(p);
    return st;
}

static int case_tpk_gauss_ws_alloc(tpk_ctx *ctx)
{
    tpk_gauss_ws *w = tpk_gauss_ws_alloc(16, ctx);
    int st = PTR(w);
    tpk_gauss_ws_free(w);
    return st;
}

static int case_tpk_gauss_expect2(tpk_ctx *ctx)
{
    tpk_estimate e;
    int st = tpk_gauss_expect2(tanh_, 1.2, 0.7, 0.4, gws, &e, ctx);
    if (!st)
        st = tpk_gauss_expect2_quad(tanh_, erf_, 0.3, -0.2, 1.2, 0.7, 0.4, gws, &e, ctx);
    if (!st)
        st = tpk_gauss_expect1(tanh_, 0.25, 1.5, gws, &e, ctx);
    return st;
}

static double S5[N * N];

static void fill_S5(void)
{
    for (size_t i = 0; i < N * N; i++)
        S5[i] = Kn->data[i];
}

static int case_tpk_gauss_map(tpk_ctx *ctx)
{
    double out[N * N], e;
    int st = TPK_OK;
    const tpk_phi *phis[] = {relu, erf_, tanh_}; /* closed forms, and Mehler for tanh */
    for (int i = 0; i < 3 && !st; i++)
        st = tpk_gauss_map(phis[i], S5, N, out, gws, &e, ctx);
    return st;
}

static int case_tpk_gauss_map_affine(tpk_ctx *ctx)
{
    double out[N * N], e;
    int st = tpk_gauss_map_affine(tanh_, S5, N, 2.0, 0.1, out, gws, &e, ctx);
    return st ? st : tpk_gauss_map_affine_lower(relu, S5, N, 2.0, 0.1, out, gws, &e, ctx);
}

static int case_tpk_gauss_map_cross(tpk_ctx *ctx)
{
    double qa[M], qb[N], out[M * N], e;
    for (int i = 0; i < M; i++)
        qa[i] = Ktt->data[i * M + i];
    for (int i = 0; i < N; i++)
        qb[i] = Kn->data[i * N + i];
    return tpk_gauss_map_cross(tanh_, qa, M, qb, N, Kxt->data, out, gws, &e, ctx);
}

static int case_tpk_bn_map(tpk_ctx *ctx)
{
    double out[N * N], err;
    return tpk_bn_map(relu, S5, N, 0.0, out, &err, ctx);
}

static int case_tpk_bn_tangent(tpk_ctx *ctx)
{
    double out[N * N], err;
    return tpk_bn_tangent(relu, S5, S5, N, 0.0, out, &err, ctx);
}

static int case_tpk_bn_cross(tpk_ctx *ctx)
{
    double out[N * M], err;
    double S22[M * M];
    memcpy(S22, Ktt->data, sizeof S22);
    double S12[N * M];
    for (int i = 0; i < N; i++)
        for (int j = 0; j < M; j++)
            S12[i * M + j] = Kxt->data[j * N + i];
    return tpk_bn_cross(relu, S5, N, S12, S22, M, 0.0, out, &err, ctx);
}

static int case_tpk_bn_kernel(tpk_ctx *ctx)
{
    double out[N * N], err;
    return tpk_bn_kernel(relu, N, N, 0.0, S5, NULL, NULL, out, N, 1.0, &err, ctx);
}

static int case_tpk_bn_apply(tpk_ctx *ctx)
{
    double g[N * 4];
    for (int i = 0; i < N * 4; i++)
        g[i] = val((size_t)i, 0.3);
    return tpk_bn_apply(g, N, 4, 0, 0.0, ctx);
}

static tpk_cnn_params cnn_params(int conv)
{
    tpk_cnn_params p = {.rows = 1, .cols = 4, .channels = 1, .kh = 1, .kw = 3, .depth = 2,
                        .phi = relu, .sigma_u2 = 2, .sigma_w2 = 2, .sigma_b2 = 0.1,
                        .sigma_v2 = 1, .sigma_ob2 = 0, .padding = TPK_CNN_CIRCULAR,
                        .readout = TPK_CNN_GAP, .conv = conv};
    return p;
}

static int cnn_kernel(int conv, tpk_ctx *ctx)
{
    tpk_cnn_params p = cnn_params(conv);
    tpk_ctx c0;
    tpk_ctx_init(&c0);
    tpk_array *K = tpk_array_alloc2(3, 3, &c0);
    assert_non_null(K);
    double err;
    int st = tpk_cnn_kernel(&p, Ximg, gws, K, &err, ctx);
    tpk_array_free(K);
    return st;
}

/* Both kernels through every path: flatten (tiles of image pairs), GAP by shifts and by the
 * (P×P) block, per position. */
static int case_tpk_cnn_kernels(tpk_ctx *ctx)
{
    static const int ro[4] = {TPK_CNN_FLATTEN, TPK_CNN_GAP, TPK_CNN_GAP, TPK_CNN_POSITIONS};
    static const int pool[4] = {TPK_CNN_POOL_AUTO, TPK_CNN_POOL_SHIFTS, TPK_CNN_POOL_BLOCK,
                                TPK_CNN_POOL_AUTO};
    int st = TPK_OK;
    for (int i = 0; i < 4 && st == TPK_OK; i++) {
        tpk_cnn_params p = cnn_params(TPK_CNN_CONV_DIRECT);
        p.readout = ro[i];
        p.pool = pool[i];
        const size_t side = ro[i] == TPK_CNN_POSITIONS ? 12 : 3;
        tpk_ctx c0;
        tpk_ctx_init(&c0);
        tpk_array *K = tpk_array_alloc2(side, side, &c0), *T = tpk_array_alloc2(side, side, &c0);
        assert_non_null(K);
        assert_non_null(T);
        st = tpk_cnn_kernels(&p, Ximg, gws, K, T, NULL, ctx);
        tpk_array_free(K);
        tpk_array_free(T);
    }
    return st;
}

static int case_tpk_transformer_kernels(tpk_ctx *ctx)
{
    tpk_transformer_params p = {.depth = 2, .phi = relu, .var_e = 1, .var_u = 1, .var_w = 1,
                                .var_b = 0.1, .temp = 1, .eps = 1e-6, .sigma_v2 = 1};
    tpk_array *K = NULL, *T = NULL;
    int st = tpk_transformer_kernels(&p, Xseq, 1, gws, NULL, &K, &T, NULL, ctx);
    tpk_array_free(K);
    tpk_array_free(T);
    return st;
}

static int case_tpk_cnn_kernel_direct(tpk_ctx *ctx) { return cnn_kernel(TPK_CNN_CONV_DIRECT, ctx); }
static int case_tpk_cnn_kernel_fft(tpk_ctx *ctx) { return cnn_kernel(TPK_CNN_CONV_FFT, ctx); }

static int case_tpk_cnn_conv_block(tpk_ctx *ctx)
{
    double in[16], out[16];
    for (int i = 0; i < 16; i++)
        in[i] = val((size_t)i, 0.2);
    int st = TPK_OK;
    const int method[2] = {TPK_CNN_CONV_DIRECT, TPK_CNN_CONV_FFT};
    for (int i = 0; i < 2 && st == TPK_OK; i++)
        st = tpk_cnn_conv_block(1, 4, 1, 3, TPK_CNN_ZERO, method[i], 2, 0.1, in, out, ctx);
    return st;
}

static int case_tpk_cnn_convws_alloc(tpk_ctx *ctx)
{
    tpk_cnn_convws *c = tpk_cnn_convws_alloc(2, 3, 2, 2, TPK_CNN_CIRCULAR, TPK_CNN_CONV_FFT, ctx);
    int st = PTR(c);
    if (c) {
        double in[36], out[36];
        for (int i = 0; i < 36; i++)
            in[i] = val((size_t)i, 0.5);
        tpk_cnn_convws_apply(c, 1.0, 0.0, in, out);
    }
    tpk_cnn_convws_free(c);
    return st;
}

static tpk_attn_params attn_params(int scaling)
{
    tpk_attn_params p = {.heads = 2, .scaling = scaling, .causal = 0, .var_q = 1, .var_k = 1,
                         .var_v = 1, .var_o = 1, .temp = 1};
    return p;
}

static int case_tpk_attn_limit_covs(tpk_ctx *ctx)
{
    tpk_attn_params p = attn_params(TPK_ATTN_INV_SQRT_N);
    double C[4 * 9], mean[9], se[9];
    size_t sel[3] = {0, 2, 4};
    return tpk_attn_limit_covs(S5, 1, N, &p, sel, 3, 4, 7, C, mean, se, ctx);
}

static int case_tpk_attn_finite_sample(tpk_ctx *ctx)
{
    tpk_attn_params p = attn_params(TPK_ATTN_INV_SQRT_N);
    double Kh[2 * N * N], Yo[2 * N];
    return tpk_attn_finite_sample(S5, N, &p, 8, 2, 3, Kh, Yo, ctx);
}

static int case_tpk_attn_mixture_sample(tpk_ctx *ctx)
{
    double C[2 * 9], Yo[4 * 3];
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 9; i++)
            C[r * 9 + i] = Ktt->data[i] * (1.0 + 0.5 * r);
    return tpk_attn_mixture_sample(C, 2, 3, 4, 9, Yo, ctx);
}

static int case_tpk_attn_w1_samples(tpk_ctx *ctx)
{
    double a[7], b[5], out;
    for (int i = 0; i < 7; i++)
        a[i] = val((size_t)i, 0.0);
    for (int i = 0; i < 5; i++)
        b[i] = val((size_t)i, 1.0);
    return tpk_attn_w1_samples(a, 7, b, 5, &out, ctx);
}

static int case_tpk_attn_energy_mixtures(tpk_ctx *ctx)
{
    const double va[] = {1.0, 1.5, 0.5}, vb[] = {1.1, 0.9};
    double out;
    return tpk_attn_energy_mixtures(va, 3, vb, 2, &out, ctx);
}

static int case_tpk_mvn(tpk_ctx *ctx)
{
    tpk_estimate e;
    const double b3[3] = {0.1, -0.2, 0.3}, r3[3] = {0.2, 0.1, -0.3};
    const double b4[4] = {0.1, -0.2, 0.3, 0.0};
    double R4[16];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            R4[i * 4 + j] = i == j ? 1.0 : 0.2;
    int st = tpk_mvn_bvn(0.1, -0.3, 0.4, &e, ctx);
    if (!st)
        st = tpk_mvn_tvn(b3, r3, 1e-9, &e, ctx);
    if (!st)
        st = tpk_mvn_qvn(b4, R4, 1e-7, &e, ctx);
    if (!st)
        st = tpk_mvn_cdf(4, b4, R4, 1e-6, &e, ctx);
    return st;
}

/* Genz's integrand (kernels/mvn_sov.c): both forms on one block of points, the normals and the
 * Owen scrambling; none takes memory. */
static int case_tpk_mvn_sov(tpk_ctx *ctx)
{
    (void)ctx;
    enum { SM = 3, SB = 8 };
    const double L[SM * SM] = {1.0, 0, 0, 0.4, 0.9, 0, -0.2, 0.3, 0.8}, b[SM] = {0.3, -0.1, 0.7};
    double u[(SM - 1) * TPK_MVN_SOV_BLK], sh[SM] = {0.25, 0.5, 0.125}, out[SB];
    uint32_t rb[SB];
    for (int i = 0; i < (SM - 1) * TPK_MVN_SOV_BLK; i++)
        u[i] = fmod(0.618 * (i + 1), 1.0);
    for (int i = 0; i < SB; i++)
        rb[i] = tpk_mvn_reverse_bits((uint32_t)(i * 2654435761u));
    double s1 = tpk_mvn_sov_sum(SM, L, b, u, sh, SB), s2 = tpk_mvn_sov_sum_ref(SM, L, b, u, sh, SB);
    tpk_mvn_normals(SB, u, NULL, out);
    tpk_mvn_owen_scramble(SB, rb, 7u, out);
    return fabs(s1 - s2) <= 1e-12 * SB ? TPK_OK : TPK_ENUMERIC;
}

static int case_tpk_mlp_kernel(tpk_ctx *ctx)
{
    tpk_mlp_params p = {.depth = 2, .phi = tanh_, .sigma_w2 = 1.5, .sigma_b2 = 0.1};
    tpk_ctx c0;
    tpk_ctx_init(&c0);
    tpk_array *K = tpk_array_alloc2(N, N, &c0), *Kx = tpk_array_alloc2(M, N, &c0);
    size_t dm[1] = {M};
    tpk_array *kd = tpk_array_alloc(1, dm, &c0);
    double err;
    int st = tpk_mlp_kernel(&p, X, Xt, gws, K, Kx, kd, &err, ctx);
    tpk_array_free(K);
    tpk_array_free(Kx);
    tpk_array_free(kd);
    return st;
}

static const fcase kernel_cases[] = {
    CASE(tpk_phi_registry_alloc), CASE(tpk_phi_register), CASE(tpk_phi_alloc),
    CASE(tpk_gauss_ws_alloc), NONE(tpk_gauss_expect2), CASE(tpk_gauss_map),
    CASE(tpk_gauss_map_affine), CASE(tpk_gauss_map_cross), CASE(tpk_bn_map), CASE(tpk_bn_tangent), CASE(tpk_bn_cross),
    CASE(tpk_bn_kernel), NONE(tpk_bn_apply), CASE(tpk_cnn_kernel_direct),
    CASE(tpk_cnn_kernel_fft), CASE(tpk_cnn_kernels), CASE(tpk_transformer_kernels),
    CASE(tpk_cnn_conv_block), CASE(tpk_cnn_convws_alloc),
    CASE(tpk_attn_limit_covs), CASE(tpk_attn_finite_sample), CASE(tpk_attn_mixture_sample),
    CASE(tpk_attn_w1_samples), NONE(tpk_attn_energy_mixtures), NONE(tpk_mvn),
    NONE(tpk_mvn_sov), CASE(tpk_mlp_kernel),
};

static void test_kernels(void **state)
{
    (void)state;
    fill_S5();
    run_group("kernels", kernel_cases, sizeof kernel_cases / sizeof kernel_cases[0]);
}

/* ---- netsor: the front end, the limit evaluators and the executors ------------------------- */

static const char mlp_src[] =
    "param L = 2\nparam phi = relu\nwidth n\ninput x : d\n"
    "A U : (n, d) ~ 2.0\nA W[l in 2..L] : (n, n) ~ 2.0\nG b[l in 1..L] : n ~ N(0, 0.1)\n"
    "g[1] = U x + b[1]\nh[1] = phi(g[1])\n"
    "for l in 2..L {\n    g[l] = W[l] h[l - 1] + b[l]\n    h[l] = phi(g[l])\n}\n"
    "output y = readout(h[L], 1.0, 0.0)\n";

static int case_tpk_netsor_load_string(tpk_ctx *ctx)
{
    tpk_program *p = tpk_netsor_load_string("mlp.nsr", mlp_src, NULL, reg, ctx);
    int st = PTR(p);
    tpk_program_free(p);
    return st;
}

static int load(const char *prog, const tpk_param_set *sets, int nsets, tpk_ctx *ctx)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/programs/%s", root_dir, prog);
    tpk_netsor_opts o = {.sets = sets, .nsets = nsets, .netsor_plus = 1};
    tpk_program *p = tpk_netsor_load_file(path, &o, reg, ctx);
    int st = PTR(p);
    tpk_program_free(p);
    return st;
}

static int case_tpk_netsor_load_file_mlp(tpk_ctx *ctx)
{
    const tpk_param_set s[] = {{"L", "2"}, {"phi", "erf"}};
    return load("mlp.nsr", s, 2, ctx);
}
static int case_tpk_netsor_load_file_cnn(tpk_ctx *ctx)
{
    const tpk_param_set s[] = {{"L", "1"}, {"T", "4"}};
    return load("cnn1d.nsr", s, 2, ctx);
}
static int case_tpk_netsor_load_file_gru(tpk_ctx *ctx)
{
    const tpk_param_set s[] = {{"T", "2"}};
    return load("gru.nsr", s, 1, ctx);
}
static int case_tpk_netsor_load_file_transformer(tpk_ctx *ctx)
{
    const tpk_param_set s[] = {{"T", "2"}, {"L", "1"}};
    return load("transformer.nsr", s, 2, ctx);
}

static int kernel_of_prog(const tpk_program *p, const tpk_array *x, int all, tpk_ctx *ctx)
{
    tpk_array *K = NULL;
    double err;
    int st = tpk_netsor_kernel(p, x, all, &K, &err, ctx);
    if (st == TPK_OK && K == NULL)
        fail_msg("tpk_netsor_kernel: TPK_OK without a kernel");
    tpk_array_free(K);
    return st;
}

static int case_tpk_netsor_kernel_rolled(tpk_ctx *ctx)
{
    return kernel_of_prog(mlp_prog, X, 0, ctx);
}
static int case_tpk_netsor_kernel_cnn(tpk_ctx *ctx)
{
    return kernel_of_prog(cnn_prog, Ximg, 0, ctx);
}
static int case_tpk_netsor_kernel_rnn(tpk_ctx *ctx)
{
    return kernel_of_prog(rnn_prog, Xseq, 1, ctx);
}

/* TPK_NETSOR_FORM=unrolled: the member-by-member evaluator and executor on the MLP */
static int case_tpk_netsor_kernel_unrolled(tpk_ctx *ctx)
{
    setenv("TPK_NETSOR_FORM", "unrolled", 1);
    int st = kernel_of_prog(mlp_prog, X, 0, ctx);
    unsetenv("TPK_NETSOR_FORM");
    return st;
}

static int case_tpk_netsor_kernel_progress(tpk_ctx *ctx)
{
    const tpk_progress pr = {0}; /* no callback, no cancel flag */
    tpk_array *K = NULL;
    int st = tpk_netsor_kernel_progress(rnn_prog, Xseq, 0, &pr, &K, NULL, ctx);
    tpk_array_free(K);
    return st;
}

/* The LSTM's limit on 2 sequences of 2 steps: E[tanh(c) tanh(c')] by the joint sampler
 * (netsor/limit_joint.c) beside the orthant and quadrature back ends. */
static int case_tpk_netsor_kernel_lstm(tpk_ctx *ctx)
{
    tpk_array x = {.ndim = 3, .dims = {2, 2, 3}, .data = Xseq->data};
    tpk_array *K = NULL;
    int st = tpk_netsor_kernel(lstm_prog, &x, 0, &K, NULL, ctx);
    tpk_array_free(K);
    return st;
}

/* A finite-width run reporting to a callback (the tools' progress line). */
static int case_tpk_netsor_run_progress(tpk_ctx *ctx)
{
    const tpk_progress pr = {count_progress, NULL, NULL};
    tpk_array *Kh = NULL, *yy = NULL;
    int st = tpk_netsor_run_progress(rnn_prog, Xseq, 8, 3, 1, &pr, &Kh, &yy, ctx);
    tpk_array_free(Kh);
    tpk_array_free(yy);
    return st;
}

static int run_prog(const tpk_program *p, const tpk_array *x, tpk_ctx *ctx)
{
    tpk_array *Kh = NULL, *yy = NULL;
    int st = tpk_netsor_run(p, x, 8, 3, 0, &Kh, &yy, ctx);
    if (st == TPK_OK && (Kh == NULL || yy == NULL))
        fail_msg("tpk_netsor_run: TPK_OK without outputs");
    tpk_array_free(Kh);
    tpk_array_free(yy);
    return st;
}

static int case_tpk_netsor_run_rolled(tpk_ctx *ctx) { return run_prog(mlp_prog, X, ctx); }
static int case_tpk_netsor_run_cnn(tpk_ctx *ctx) { return run_prog(cnn_prog, Ximg, ctx); }
static int case_tpk_netsor_run_rnn(tpk_ctx *ctx) { return run_prog(rnn_prog, Xseq, ctx); }
static int case_tpk_netsor_run_unrolled(tpk_ctx *ctx)
{
    setenv("TPK_NETSOR_FORM", "unrolled", 1);
    int st = run_prog(mlp_prog, X, ctx);
    unsetenv("TPK_NETSOR_FORM");
    return st;
}

/* tpk_program_dump takes no context: its scratch strings come from the program's allocator, and
 * without memory it prints "<out of memory>" (no status to return). */
static int case_tpk_program_dump(tpk_ctx *ctx)
{
    tpk_program *p = tpk_netsor_load_string("mlp.nsr", mlp_src, NULL, reg, ctx);
    if (p == NULL)
        return ctx->status;
    FILE *f = fopen("/dev/null", "w");
    assert_non_null(f);
    tpk_program_dump(p, f);
    fclose(f);
    tpk_program_free(p);
    return TPK_OK;
}

static int case_tpk_program_param_number(tpk_ctx *ctx)
{
    double v;
    return tpk_program_param_number(mlp_prog, "L", &v, ctx);
}

/* the NTK: the tangent program, the tangent blocks, the finite-width backward pass */
static int case_tpk_netsor_ntk(tpk_ctx *ctx)
{
    tpk_array *K = NULL, *T = NULL;
    int st = tpk_netsor_ntk(rnn_prog, Xseq, 1, TPK_NTK_PARAM_NTK, &K, &T, NULL, ctx);
    if (st == TPK_OK && (K == NULL || T == NULL))
        fail_msg("tpk_netsor_ntk: TPK_OK without outputs");
    tpk_array_free(K);
    tpk_array_free(T);
    return st;
}

static int case_tpk_netsor_run_ntk(tpk_ctx *ctx)
{
    tpk_array *K = NULL, *T = NULL;
    int st = tpk_netsor_run_ntk(rnn_prog, Xseq, 8, 3, 1, TPK_NTK_PARAM_TP, &K, &T, ctx);
    if (st == TPK_OK && (K == NULL || T == NULL))
        fail_msg("tpk_netsor_run_ntk: TPK_OK without outputs");
    tpk_array_free(K);
    tpk_array_free(T);
    return st;
}

/* training: 3 training sequences, 2 test ones; two recorded steps */
static int case_tpk_netsor_train(tpk_ctx *ctx)
{
    tpk_ctx c0;
    tpk_ctx_init(&c0);
    size_t dy[2] = {3, 1}, df[3] = {2, N, 1}, at[2] = {0, 2};
    tpk_array *y = tpk_array_alloc(2, dy, &c0), *f = tpk_array_alloc(3, df, &c0);
    for (size_t i = 0; i < 3; i++)
        y->data[i] = 0.3 * (double)i - 0.2;
    tpk_train_opts o = {.width = 8, .seed = 3, .lr = 0.5, .at = at, .nat = 2};
    double loss[2];
    int st = tpk_netsor_train(rnn_prog, Xseq, 3, y, &o, f, loss, ctx);
    tpk_array_free(y);
    tpk_array_free(f);
    return st;
}

/* the empirical NTK of a bn(...) program: gradients per (output, input of the batch) */
static int case_tpk_netsor_run_ntk_bn(tpk_ctx *ctx)
{
    static const char src[] = "width n\ninput x : d\nA U : (n, d) ~ 2.0\nA W : (n, n) ~ 2.0\n"
                              "g = U x\nh = relu(bn(g))\nz = W h\nk = relu(bn(z))\n"
                              "output y = readout(k, 1.0)\n";
    tpk_program *p = tpk_netsor_load_string("bn.nsr", src, NULL, reg, ctx);
    if (p == NULL)
        return ctx->status;
    tpk_array *K = NULL, *T = NULL;
    int st = tpk_netsor_run_ntk(p, X, 8, 3, 0, TPK_NTK_PARAM_NTK, &K, &T, ctx);
    tpk_array_free(K);
    tpk_array_free(T);
    tpk_program_free(p);
    return st;
}

static const fcase netsor_cases[] = {
    CASE(tpk_netsor_load_string), CASE(tpk_netsor_load_file_mlp), CASE(tpk_netsor_load_file_cnn),
    CASE(tpk_netsor_load_file_gru), CASE(tpk_netsor_load_file_transformer),
    CASE(tpk_netsor_kernel_rolled), CASE(tpk_netsor_kernel_cnn), CASE(tpk_netsor_kernel_rnn),
    CASE(tpk_netsor_kernel_unrolled), CASE(tpk_netsor_kernel_progress),
    CASE(tpk_netsor_run_progress), SAMPLED(tpk_netsor_kernel_lstm, 8),
    CASE(tpk_netsor_run_rolled), CASE(tpk_netsor_run_cnn), CASE(tpk_netsor_run_rnn),
    CASE(tpk_netsor_run_unrolled), CASE(tpk_program_dump), NONE(tpk_program_param_number),
    CASE(tpk_netsor_ntk), CASE(tpk_netsor_run_ntk), CASE(tpk_netsor_train),
    CASE(tpk_netsor_run_ntk_bn),
};

static void test_netsor(void **state)
{
    (void)state;
    run_group("netsor", netsor_cases, sizeof netsor_cases / sizeof netsor_cases[0]);
}

/* ---- app: jobs, the architecture table, the custom jobs (CNN, 1/sqrt(n) attention) --------- */

static const tpk_param_set job_sets[] = {{"L", "2"}};

static tpk_job mlp_job(void)
{
    tpk_job j = {.label = "mlp", .program = path_mlp, .sets = job_sets, .nsets = 1,
                 .input = path_npy, .test = path_csv, .output = path_out, .force = 1};
    return j;
}

static int case_tpk_job_registry(tpk_ctx *ctx)
{
    tpk_phi_registry *r = tpk_job_registry(ctx);
    int st = PTR(r);
    tpk_phi_registry_free(r);
    return st;
}

static int case_tpk_job_kernel_arrays(tpk_ctx *ctx)
{
    tpk_job j = mlp_job();
    tpk_array *K = NULL, *Kx = NULL, *kd = NULL;
    double err;
    int st = tpk_job_kernel_arrays(&j, X, Xt, &K, &Kx, &kd, &err, ctx);
    tpk_array_free(K);
    tpk_array_free(Kx);
    tpk_array_free(kd);
    return st;
}

static int case_tpk_job_run_arrays(tpk_ctx *ctx)
{
    tpk_job j = mlp_job();
    j.test = NULL;
    tpk_array *Kh = NULL, *yy = NULL;
    int st = tpk_job_run_arrays(&j, X, 8, 5, &Kh, &yy, ctx);
    tpk_array_free(Kh);
    tpk_array_free(yy);
    return st;
}

static int case_tpk_job_kernel(tpk_ctx *ctx)
{
    tpk_job j = mlp_job();
    return tpk_job_kernel(&j, ctx);
}

static int case_tpk_job_run(tpk_ctx *ctx)
{
    tpk_job j = mlp_job();
    j.test = NULL;
    return tpk_job_run(&j, 8, 5, ctx);
}

static int describe(tpk_h5out *o, tpk_ctx *ctx)
{
    tpk_job j = mlp_job();
    char a0[] = "gpkernel", a1[] = "--arch=mlp";
    char *argv[] = {a0, a1};
    j.argc = 2;
    j.argv = argv;
    int st = tpk_job_describe(o, &j, mlp_prog, NULL, "mlp", ctx);
    if (!st)
        st = tpk_h5out_write(o, "/kernel", Kn, ctx);
    if (!st)
        st = tpk_job_kernel_dims(o, Kn, X, 0, ctx);
    return st;
}

static int case_tpk_job_describe(tpk_ctx *ctx) { return with_output(describe, 0, ctx); }

static const tpk_arch_flag mlp_flags[] = {{.flag = "depth", .value = "2"},
                                          {.flag = "phi", .value = "erf"}};

static int case_tpk_arch_kernel(tpk_ctx *ctx)
{
    tpk_arch_opts o = {.flags = mlp_flags, .nflags = 2, .root = root_dir};
    tpk_array *K = NULL, *Kx = NULL, *kd = NULL;
    int st = tpk_arch_kernel(tpk_arch_find("mlp"), &o, X, Xt, &K, &Kx, &kd, NULL, ctx);
    tpk_array_free(K);
    tpk_array_free(Kx);
    tpk_array_free(kd);
    return st;
}

/* gpregress-mpi's tiles: the job on arrays, one block of it (the evaluator's allocations). */
static int case_tpk_arch_kernel_job(tpk_ctx *ctx)
{
    tpk_arch_opts o = {.flags = mlp_flags, .nflags = 2, .root = root_dir};
    tpk_kernel_job *kj = tpk_arch_kernel_job(tpk_arch_find("mlp"), &o, X, Xt, ctx);
    if (!kj)
        return ctx->status;
    const size_t n = X->dims[0], m = Xt->dims[0];
    double B[64], dg[8];
    int st = n * m <= 64 && m <= 8
                 ? tpk_kernel_job_block(kj, 1, 0, m, 0, n, B, n, dg, NULL, ctx)
                 : TPK_ERROR(ctx, TPK_EINVAL, "the fault inputs outgrew the block buffer");
    tpk_kernel_job_free(kj);
    return st;
}

static int case_tpk_arch_job(tpk_ctx *ctx)
{
    tpk_arch_opts o = {.flags = mlp_flags, .nflags = 2, .root = root_dir, .force = 1};
    return tpk_arch_job(tpk_arch_find("mlp"), &o, path_npy, NULL, path_out, ctx);
}

static char path_img[1100];

/* The CNN custom job (tpk_cnn_job behind it) on 3 images of 4 positions, 1 channel. */
static int case_tpk_cnn_job(tpk_ctx *ctx)
{
    const tpk_arch_flag f[] = {{.flag = "depth", .value = "1"}};
    tpk_arch_opts o = {.flags = f, .nflags = 1, .root = root_dir, .force = 1};
    return tpk_arch_job(tpk_arch_find("cnn1d"), &o, path_img, NULL, path_out, ctx);
}

/* The 1/sqrt(n) attention job (tpk_attention_job) on N sequences of 2 tokens. */
static int case_tpk_attention_job(tpk_ctx *ctx)
{
    const tpk_arch_flag f[] = {{.flag = "logit-scaling", .value = "inv-sqrt-n"}};
    tpk_arch_opts o = {.flags = f, .nflags = 1, .root = root_dir, .force = 1};
    return tpk_arch_job(tpk_arch_find("attention"), &o, path_seq, NULL, path_out, ctx);
}

static int case_tpk_arch_sets(tpk_ctx *ctx)
{
    const tpk_arch *a = tpk_arch_find("mlp");
    tpk_param_set out[32];
    char buf[1024];
    int n;
    const char *prog;
    int st = tpk_arch_check_flag("depth", "2", reg, ctx);
    if (!st)
        st = tpk_arch_sets(a, mlp_flags, 2, NULL, 0, out, 32, &n, buf, sizeof buf, ctx);
    if (!st)
        st = tpk_arch_program(a, 0, mlp_flags, 2, &prog, ctx);
    return st;
}

/* A kernel job block by block (app/job_block.c, gpkernel-mpi's tiles): a diagonal block, an
 * off-diagonal one, a test block, and the description of the output. */
static int kernel_job_use(const tpk_arch *a, const tpk_job *j, tpk_ctx *ctx)
{
    tpk_kernel_job *kj = tpk_kernel_job_alloc(a, j, ctx);
    if (kj == NULL)
        return ctx->status;
    const size_t n = tpk_kernel_job_items(kj, 0), m = tpk_kernel_job_items(kj, 1);
    const size_t O = tpk_kernel_job_readouts(kj), w = n * O, wt = m * O;
    double *K = malloc(w * w * sizeof *K), *dg = malloc(w * sizeof *dg), err;
    double *Kt = malloc((wt ? wt : 1) * w * sizeof *Kt), *dt = malloc((wt ? wt : 1) * sizeof *dt);
    assert_true(K && dg && Kt && dt && tpk_kernel_job_input(kj, 0) != NULL && n >= 3);
    int st = tpk_kernel_job_block(kj, 0, 0, 2, 0, 2, K, w, dg, &err, ctx);
    if (!st && m > 0)
        st = tpk_kernel_job_block(kj, 1, 0, m, 0, n, Kt, w, dt, &err, ctx);
    if (!st)
        st = tpk_kernel_job_block(kj, 0, 2, n - 2, 0, 2, K, w, NULL, &err, ctx);
    if (!st) /* the whole kernel: the output's /kernel, which the description names */
        st = tpk_kernel_job_block(kj, 0, 0, n, 0, n, K, w, dg, &err, ctx);
    if (!st) {
        tpk_array Ka = {.ndim = 2, .dims = {w, w}, .data = K};
        tpk_h5out *o = tpk_h5out_open(path_out, ctx);
        tpk_array Ta = {.ndim = 2, .dims = {wt, w}, .data = Kt};
        st = o ? tpk_h5out_write(o, "/kernel", &Ka, ctx) : ctx->status;
        if (!st && m > 0)
            st = tpk_h5out_write(o, "/kernel_test_train", &Ta, ctx);
        if (!st && m > 0)
            st = tpk_h5out_write_vector(o, "/kernel_test_diag", dt, wt, ctx);
        if (!st)
            st = tpk_kernel_job_describe(kj, o, ctx);
        tpk_h5out_abort(o);
    }
    free(K);
    free(dg);
    free(Kt);
    free(dt);
    tpk_kernel_job_free(kj);
    return st;
}

static int case_tpk_kernel_job_program(tpk_ctx *ctx)
{
    tpk_job j = mlp_job();
    return kernel_job_use(NULL, &j, ctx);
}

/* The CNN's kernel job (app/job_cnn.c's state) on the 3 images. */
static int case_tpk_kernel_job_cnn(tpk_ctx *ctx)
{
    const tpk_arch *a = tpk_arch_find("cnn1d");
    const tpk_arch_flag f[] = {{.flag = "depth", .value = "1", .param = "L"}};
    tpk_param_set sets[32];
    char buf[1024], prog[1200];
    int n = 0;
    if (tpk_arch_sets(a, f, 1, NULL, 0, sets, 32, &n, buf, sizeof buf, ctx))
        return ctx->status;
    snprintf(prog, sizeof prog, "%s/%s", root_dir, a->program);
    tpk_job j = {.label = "cnn1d", .program = prog, .sets = sets, .nsets = n, .input = path_img,
                 .output = path_out};
    return kernel_job_use(a, &j, ctx);
}

static const fcase app_cases[] = {
    CASE(tpk_job_registry), CASE(tpk_job_kernel_arrays), CASE(tpk_job_run_arrays),
    CASE(tpk_job_kernel), CASE(tpk_job_run), CASE(tpk_job_describe), CASE(tpk_arch_kernel),
    CASE(tpk_arch_kernel_job), CASE(tpk_arch_job), SAMPLED(tpk_cnn_job, 8),
    CASE(tpk_attention_job), NONE(tpk_arch_sets), SAMPLED(tpk_kernel_job_program, 8),
    SAMPLED(tpk_kernel_job_cnn, 8),
};

static void test_app(void **state)
{
    (void)state;
    size_t di[3] = {3, 4, 1};
    tu_write_npy(tu_path(env, path_img, sizeof path_img, "img.npy"), Ximg->data, 3, di);
    run_group("app", app_cases, sizeof app_cases / sizeof app_cases[0]);
}

/* ---- orch: the primitive graph, candidate kernels, the solvers (orch/) --------------------- */

/* x → a = x·x (linear) → b = φ(a) → c = rowsum(b) → d = b·c (map, broadcast c), outputs c and d:
 * small enough for the exhaustive solver, with fusions for the BLP to choose. */
static int orch_build(tpk_orch_graph **gp, tpk_ctx *ctx)
{
    const tpk_orch_shape m = {2, {64, 64, 0, 0}, 8}, v = {1, {64, 0, 0, 0}, 8};
    tpk_orch_graph *g = *gp = tpk_orch_graph_alloc(ctx);
    int x, a, b, c, d, st = g ? TPK_OK : ctx->status;
    if (!st)
        st = tpk_orch_graph_add_input(g, "x", &m, &x, ctx);
    if (!st)
        st = tpk_orch_graph_add_prim(g, "a", TPK_ORCH_LINEAR, &m, 2.0 * 64 * 64 * 64, 1,
                                     (int[]){x}, &a, ctx);
    if (!st)
        st = tpk_orch_graph_add_prim(g, "b", TPK_ORCH_MAP, &m, 64 * 64, 1, (int[]){a}, &b, ctx);
    if (!st)
        st = tpk_orch_graph_add_prim(g, "c", TPK_ORCH_REDUCE, &v, 64 * 64, 1, (int[]){b}, &c, ctx);
    if (!st)
        st = tpk_orch_graph_add_prim(g, "d", TPK_ORCH_MAP, &m, 64 * 64, 2, (int[]){b, c}, &d,
                                     ctx);
    if (!st)
        st = tpk_orch_graph_set_output(g, c, ctx);
    if (!st)
        st = tpk_orch_graph_set_output(g, d, ctx);
    if (!st && (tpk_orch_graph_nvalues(g) != 5 || !tpk_orch_graph_value(g, d)))
        st = TPK_EINVAL;
    return st;
}

static tpk_orch_graph *ograph;
static tpk_orch_cands *ocands;
static const tpk_orch_roofline oroof = {3.7e-6, 2.13e10, 8.9e10};

static int case_tpk_orch_graph(tpk_ctx *ctx)
{
    tpk_orch_graph *g = NULL;
    int st = orch_build(&g, ctx);
    tpk_orch_graph_free(g);
    return st;
}

static int case_tpk_orch_cands(tpk_ctx *ctx)
{
    tpk_orch_cands *c = tpk_orch_cands_alloc(ograph, NULL, ctx);
    int st = c ? tpk_orch_cands_cost(c, tpk_orch_cost_roofline, (void *)&oroof, ctx) : ctx->status;
    if (!st)
        st = tpk_orch_cands_set_cost(c, 0, tpk_orch_cands_get(c, 0)->cost, ctx);
    if (!st && (tpk_orch_cands_count(c) < 4 || tpk_orch_cands_graph(c) != ograph))
        st = TPK_EINVAL;
    tpk_orch_cands_free(c);
    return st;
}

/* A solver's plan, checked (the check allocates too) and freed with the allocator it remembers. */
static int orch_plan_use(tpk_orch_plan *p, tpk_ctx *ctx)
{
    int st = p ? tpk_orch_plan_check(ocands, p, ctx) : ctx->status;
    tpk_orch_plan_free(p);
    return st;
}

static int case_tpk_orch_solve_blp(tpk_ctx *ctx)
{
    return orch_plan_use(tpk_orch_solve_blp(ocands, NULL, ctx), ctx);
}
static int case_tpk_orch_solve_exhaustive(tpk_ctx *ctx)
{
    return orch_plan_use(tpk_orch_solve_exhaustive(ocands, ctx), ctx);
}
static int case_tpk_orch_solve_naive(tpk_ctx *ctx)
{
    return orch_plan_use(tpk_orch_solve_naive(ocands, ctx), ctx);
}

/* The plan's text and the roofline cost: no memory of their own. */
static int case_tpk_orch_plan_write(tpk_ctx *ctx)
{
    tpk_ctx c0;
    tpk_ctx_init(&c0);
    tpk_orch_plan *p = tpk_orch_solve_naive(ocands, &c0); /* outside the counted allocator */
    FILE *f = fopen("/dev/null", "w");
    double cost;
    int st = p && f ? tpk_orch_plan_write(f, ocands, p, ctx) : TPK_EIO;
    if (!st)
        st = tpk_orch_cost_roofline(ograph, tpk_orch_cands_get(ocands, 0), (void *)&oroof, &cost,
                                    ctx);
    if (f)
        fclose(f);
    tpk_orch_plan_free(p);
    return st;
}

static const fcase orch_cases[] = {
    CASE(tpk_orch_graph), CASE(tpk_orch_cands), CASE(tpk_orch_solve_blp),
    CASE(tpk_orch_solve_exhaustive), CASE(tpk_orch_solve_naive), NONE(tpk_orch_plan_write),
};

static void test_orch(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(orch_build(&ograph, &ctx), TPK_OK);
    ocands = tpk_orch_cands_alloc(ograph, NULL, &ctx);
    assert_non_null(ocands);
    assert_int_equal(tpk_orch_cands_cost(ocands, tpk_orch_cost_roofline, (void *)&oroof, &ctx),
                     TPK_OK);
    run_group("orch", orch_cases, sizeof orch_cases / sizeof orch_cases[0]);
    tpk_orch_cands_free(ocands);
    tpk_orch_graph_free(ograph);
}

/* ---- limits: statistics of finite-width runs, fits with bootstrap intervals, laws ---------- */

enum { LW = 4, LS = 6, LK = 3, LL = 4 };
static double lwidths[LW] = {16, 32, 64, 128};
static double lrecs[LW * LS], lkh[LW * LS * LK * LK], lK[LK * LK], ltheta[LL * LK];

static void fill_limits(void)
{
    for (int w = 0; w < LW; w++)
        for (int s2 = 0; s2 < LS; s2++) {
            double sc = 1.0 / sqrt(lwidths[w]);
            lrecs[w * LS + s2] = sc * (1.2 + 0.3 * val((size_t)(w * LS + s2), 0.4));
            for (int i = 0; i < LK; i++)
                for (int j = 0; j < LK; j++) {
                    double base = (i == j ? 1.3 : 0.4) + 0.1 * (i + j);
                    double noise = sc * 0.2 * val((size_t)(w * 97 + s2 * 13 + i * 3 + j), 0.1);
                    lkh[((w * LS + s2) * LK + i) * LK + j] = base + (i == j ? fabs(noise) : 0.0) +
                                                            (i != j ? 0.05 * noise : 0.0);
                }
        }
    for (int i = 0; i < LK; i++)
        for (int j = 0; j < LK; j++)
            lK[i * LK + j] = (i == j ? 1.3 : 0.4) + 0.1 * (i + j);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_limits_directions(LK, LL, 5, ltheta, &ctx), 0);
}

static tpk_limits_slices slices(void)
{
    tpk_limits_slices sl = {.k = LK, .L = LL, .theta = ltheta, .K = lK, .matched = 0};
    return sl;
}

static int case_tpk_limits_frob_rel(tpk_ctx *ctx)
{
    double out;
    return tpk_limits_frob_rel(lkh, lK, LK * LK, &out, ctx);
}

static int case_tpk_limits_bias(tpk_ctx *ctx)
{
    tpk_limits_bias_result r;
    return tpk_limits_bias(lkh, LS, LK * LK, lK, &r, ctx);
}

static int case_tpk_limits_fit_power(tpk_ctx *ctx)
{
    double sl, ic, se;
    return tpk_limits_fit_power(lwidths, lrecs, LW, &sl, &ic, &se, ctx);
}

static int case_tpk_limits_fit_two_term(tpk_ctx *ctx)
{
    double c1, c2, cov[4], chi, w[LW] = {1, 2, 3, 4};
    return tpk_limits_fit_two_term(lwidths, lrecs, w, LW, &c1, &c2, cov, &chi, ctx);
}

static int case_tpk_limits_stats(tpk_ctx *ctx)
{
    double out, v_inf = 1.3;
    tpk_limits_slices sl = slices();
    int st = tpk_limits_stat_rms(lrecs, LS, 1, NULL, NULL, &out, ctx);
    if (!st)
        st = tpk_limits_stat_rbw1(lrecs, LS, 1, NULL, &v_inf, &out, ctx);
    if (!st)
        st = tpk_limits_stat_mix_kurtosis(lrecs, LS, 1, NULL, NULL, &out, ctx);
    if (!st)
        st = tpk_limits_stat_rbsw1(lkh, LS, LK * LK, NULL, &sl, &out, ctx);
    return st;
}

static tpk_limits_boot_opts boot_opts(void)
{
    tpk_limits_boot_opts o = {.B = 20, .seed = 3, .level = 0.9, .paired = 1, .first = 0};
    return o;
}

static int case_tpk_limits_boot_fit(tpk_ctx *ctx)
{
    tpk_limits_series d = {.W = LW, .S = LS, .rec = 1, .n = lwidths, .recs = lrecs};
    tpk_limits_boot_opts o = boot_opts();
    tpk_limits_fit f;
    double v[LW], lo[LW], hi[LW];
    return tpk_limits_boot_fit(&d, tpk_limits_stat_rms, NULL, &o, &f, v, lo, hi, ctx);
}

static int case_tpk_limits_boot_fit_sliced(tpk_ctx *ctx)
{
    tpk_limits_series d = {.W = LW, .S = LS, .rec = LK * LK, .n = lwidths, .recs = lkh};
    tpk_limits_boot_opts o = boot_opts();
    o.paired = 0;
    tpk_limits_slices sl = slices();
    tpk_limits_fit f;
    return tpk_limits_boot_fit(&d, tpk_limits_stat_rbsw1, &sl, &o, &f, NULL, NULL, NULL, ctx);
}

static int case_tpk_limits_stability(tpk_ctx *ctx)
{
    tpk_limits_series d = {.W = LW, .S = LS, .rec = 1, .n = lwidths, .recs = lrecs};
    tpk_limits_boot_opts o = boot_opts();
    tpk_limits_fit f[LW - 1];
    return tpk_limits_stability(&d, tpk_limits_stat_rms, NULL, &o, f, ctx);
}

static int case_tpk_limits_fit_window(tpk_ctx *ctx)
{
    tpk_limits_fit all = {.c1 = 1.2, .c2 = 0.4, .c1_lo = 1.0, .c1_hi = 1.4, .c2_lo = 0.1,
                          .c2_hi = 0.7};
    tpk_limits_window w;
    return tpk_limits_fit_window(lwidths, LW, &all, 0.1, 2, &w, ctx);
}

static int case_tpk_limits_w1_mixtures(tpk_ctx *ctx)
{
    const double va[] = {1.0, 1.4, 0.7}, wa[] = {1, 2, 1}, vb[] = {1.1, 0.9}, wb[] = {1, 1};
    double out;
    return tpk_limits_w1_mixtures(va, wa, 3, vb, wb, 2, &out, ctx);
}

static int case_tpk_limits_rbw1(tpk_ctx *ctx)
{
    double out, v[LS];
    for (int i = 0; i < LS; i++)
        v[i] = 1.0 + 0.2 * val((size_t)i, 0.3);
    int st = tpk_limits_rbw1(v, LS, 1.1, &out, ctx);
    return st ? st : tpk_limits_rbw1_shape(v, LS, &out, ctx);
}

static int case_tpk_limits_rbw1_floor(tpk_ctx *ctx)
{
    double out, v[LS];
    for (int i = 0; i < LS; i++)
        v[i] = 1.0 + 0.2 * val((size_t)i, 0.3);
    return tpk_limits_rbw1_floor(v, LS, 8, 4, &out, ctx);
}

static int case_tpk_limits_directions(tpk_ctx *ctx)
{
    double th[LL * LK];
    return tpk_limits_directions(LK, LL, 5, th, ctx);
}

static int case_tpk_limits_rbsw1(tpk_ctx *ctx)
{
    tpk_limits_slices sl = slices();
    double out;
    return tpk_limits_rbsw1(lkh, LS, &sl, &out, ctx);
}

static int case_tpk_limits_samples(tpk_ctx *ctx)
{
    enum { SM = 12 };
    double x[SM], Ys[SM * LK], out;
    for (int i = 0; i < SM; i++)
        x[i] = val((size_t)i, 0.6);
    for (int i = 0; i < SM * LK; i++)
        Ys[i] = val((size_t)i, 1.6);
    tpk_limits_slices sl = slices();
    int st = tpk_limits_w1_gauss_samples(x, SM, 1.2, &out, ctx);
    if (!st)
        st = tpk_limits_sw1_samples(Ys, SM, &sl, &out, ctx);
    if (!st)
        st = tpk_limits_kurtosis(x, SM, &out, ctx);
    return st;
}

static int case_tpk_limits_sw1_gp_floor(tpk_ctx *ctx)
{
    tpk_limits_slices sl = slices();
    double mean, sd;
    return tpk_limits_sw1_gp_floor(10, &sl, 4, 9, &mean, &sd, ctx);
}

static int case_tpk_limits_energy(tpk_ctx *ctx)
{
    double Xs[8 * 2], Ys[6 * 2], out;
    for (int i = 0; i < 16; i++)
        Xs[i] = val((size_t)i, 0.2);
    for (int i = 0; i < 12; i++)
        Ys[i] = val((size_t)i, 2.2);
    int st = tpk_limits_energy(Xs, 8, Ys, 6, 2, &out, ctx);
    return st ? st : tpk_limits_mmd2(Xs, 8, Ys, 6, 2, 0.7, &out, ctx);
}

/* study: gplimits' library half on a toy (two widths of 4 seeds, two inputs) */
static const size_t study_widths[] = {8, 16};

static tpk_study_opts study_opts(void)
{
    static tpk_arch_flag depth = {.flag = "depth", .value = "1"};
    static char param[64];
    const tpk_arch *mlp = tpk_arch_find("mlp");
    tpk_arch_flag_param(mlp, "depth", param, sizeof param);
    depth.param = param;
    tpk_study_opts o = {.arch = mlp, .flags = &depth, .nflags = 1, .input = path_npy,
                        .max_inputs = 2, .widths = study_widths, .nwidths = 2, .seeds = 4,
                        .seed = 11, .output = path_out, .root = root_dir, .force = 1};
    tpk_study_stats_default(&o.stats);
    o.stats.boot = 50;
    o.stats.slices = 2;
    o.stats.seed = 11;
    return o;
}

static int case_tpk_study_alloc(tpk_ctx *ctx)
{
    tpk_study_opts o = study_opts();
    tpk_study *st = tpk_study_alloc(&o, reg, ctx);
    int r = PTR(st);
    tpk_study_free(st);
    return r;
}

static int case_tpk_study_run(tpk_ctx *ctx)
{
    /* a failed run keeps its checkpoint (OUT.partial.h5, for --resume): start over each time */
    char partial[1200];
    snprintf(partial, sizeof partial, "%s.partial.h5", path_out);
    unlink(partial);
    tpk_study_opts o = study_opts();
    tpk_study *s2 = tpk_study_alloc(&o, reg, ctx);
    if (s2 == NULL)
        return ctx->status;
    int st = tpk_study_run(s2, NULL, ctx);
    if (!st)
        st = tpk_study_write(s2, 0, NULL, NULL, ctx);
    tpk_study_free(s2);
    return st;
}

/* the statistics of finished raw data (made once, without faults) */
static double *sraw_khat, *sraw_y, sraw_K[4];

static void make_raw(void)
{
    size_t W = 2, S = 4, Nn = 2;
    sraw_khat = calloc(W * S * Nn * Nn, sizeof *sraw_khat);
    sraw_y = calloc(W * S * Nn, sizeof *sraw_y);
    assert_true(sraw_khat && sraw_y);
    for (size_t i = 0; i < 4; i++)
        sraw_K[i] = i == 0 || i == 3 ? 1.4 : 0.5;
    for (size_t w = 0; w < W; w++)
        for (size_t s2 = 0; s2 < S; s2++) {
            double sc = 1.0 / sqrt((double)study_widths[w]);
            for (size_t i = 0; i < 4; i++)
                sraw_khat[(w * S + s2) * 4 + i] = sraw_K[i] + (i == 0 || i == 3 ? 1 : 0.3) * sc *
                                                                  0.3 * val(w * 31 + s2 * 7 + i, 0);
            for (size_t i = 0; i < Nn; i++)
                sraw_y[(w * S + s2) * Nn + i] = val(w * 17 + s2 * 5 + i, 1.0);
        }
}

static int case_tpk_study_analyse(tpk_ctx *ctx)
{
    const double wd[2] = {8, 16};
    tpk_study_raw raw = {.W = 2, .S = 4, .N = 2, .widths = wd, .khat = sraw_khat, .y = sraw_y,
                         .K = sraw_K};
    tpk_study_stats o;
    tpk_study_stats_default(&o);
    o.boot = 50;
    o.slices = 2;
    tpk_study_analysis *a = tpk_study_analyse(&raw, &o, ctx);
    int st = PTR(a);
    if (a) {
        tpk_h5out *out = tpk_h5out_open(path_out, ctx);
        st = out ? tpk_study_analysis_write(a, out, ctx) : ctx->status;
        tpk_h5out_abort(out);
        FILE *f = fopen("/dev/null", "w");
        tpk_study_analysis_print(a, f);
        fclose(f);
    }
    tpk_study_analysis_free(a);
    return st;
}

static const fcase limits_cases[] = {
    NONE(tpk_limits_frob_rel), NONE(tpk_limits_bias), NONE(tpk_limits_fit_power),
    CASE(tpk_limits_fit_two_term), NONE(tpk_limits_stats), CASE(tpk_limits_boot_fit),
    CASE(tpk_limits_boot_fit_sliced), CASE(tpk_limits_stability), NONE(tpk_limits_fit_window),
    NONE(tpk_limits_w1_mixtures), NONE(tpk_limits_rbw1), CASE(tpk_limits_rbw1_floor),
    NONE(tpk_limits_directions), NONE(tpk_limits_rbsw1), CASE(tpk_limits_samples),
    CASE(tpk_limits_sw1_gp_floor), NONE(tpk_limits_energy), CASE(tpk_study_alloc),
    SAMPLED(tpk_study_run, 24), SAMPLED(tpk_study_analyse, 12),
};

static void test_limits(void **state)
{
    (void)state;
    fill_limits();
    make_raw();
    run_group("limits", limits_cases, sizeof limits_cases / sizeof limits_cases[0]);
    free(sraw_khat);
    free(sraw_y);
}

/* ---- gp: regression, noise search, kernel families, hyperparameters, the experiment -------- */

static int case_tpk_gp_fit(tpk_ctx *ctx)
{
    tpk_gp_options o;
    tpk_gp_options_default(&o);
    tpk_gp *gp = tpk_gp_fit(Kn, Y, 0.01, &o, ctx);
    if (gp == NULL)
        return ctx->status;
    tpk_ctx c0;
    tpk_ctx_init(&c0);
    tpk_array *alpha = tpk_array_alloc2(N, 2, &c0), *mean = tpk_array_alloc2(M, 2, &c0);
    size_t dm[1] = {M};
    tpk_array *var = tpk_array_alloc(1, dm, &c0), *cov = tpk_array_alloc2(M, M, &c0);
    double rc, lam;
    int st = tpk_gp_weights(gp, alpha, ctx);
    if (!st)
        st = tpk_gp_predict(gp, Kxt, Kdiag, mean, var, ctx);
    if (!st)
        st = tpk_gp_predict_cov(gp, Kxt, Ktt, cov, ctx);
    if (!st)
        st = tpk_gp_rcond(gp, &rc, ctx);
    if (!st)
        st = tpk_gp_min_eig(gp, 20, &lam, ctx);
    tpk_array_free(alpha);
    tpk_array_free(mean);
    tpk_array_free(var);
    tpk_array_free(cov);
    tpk_gp_free(gp);
    return st;
}

static int case_tpk_gp_spectral(tpk_ctx *ctx)
{
    tpk_gp_spectral *sp = tpk_gp_spectral_alloc(Kn, Y, ctx);
    if (sp == NULL)
        return ctx->status;
    tpk_gp_noise_choice c;
    double lo, hi;
    tpk_gp_spectral_range(sp, &lo, &hi);
    (void)tpk_gp_spectral_lml(sp, 1.0, 0.01);
    int st = tpk_gp_spectral_choose_noise(sp, 1e-6, 1.0, 1, &c, ctx);
    tpk_gp_spectral_free(sp);
    return st;
}

static int case_tpk_gp_fit_search_noise(tpk_ctx *ctx)
{
    tpk_gp_options o;
    tpk_gp_options_default(&o);
    tpk_gp_noise_choice c;
    tpk_gp *gp = tpk_gp_fit_search_noise(Kn, Y, 0.01, 0.5, 4, 1, &o, &c, ctx);
    int st = PTR(gp);
    tpk_gp_free(gp);
    return st;
}

static int case_tpk_gp_lml_grad(tpk_ctx *ctx)
{
    double lml, grad[2], jit; /* np + 1 entries: the last is d/d log(noise) */
    const double *dK[1] = {Kn->data};
    return tpk_gp_lml_grad(Kn, Y, 0.02, dK, 1, NULL, &lml, grad, &jit, ctx);
}

static int case_tpk_gp_family_rbf(tpk_ctx *ctx)
{
    tpk_gp_family *f = tpk_gp_family_rbf_alloc(X, ctx);
    if (f == NULL)
        return ctx->status;
    tpk_gp_hyper_options o;
    tpk_gp_hyper_options_default(&o);
    o.max_iter = 4;
    double theta[2] = {1.0, 1.0}, noise = 0.05;
    tpk_gp_hyper_result r;
    int st = tpk_gp_fit_hyper(f, Y, theta, &noise, &o, &r, ctx);
    tpk_gp_family_free(f);
    return st;
}

static int case_tpk_gp_family_mlp(tpk_ctx *ctx)
{
    tpk_mlp_params p = {.depth = 1, .phi = relu, .sigma_w2 = 2.0, .sigma_b2 = 0.1};
    tpk_gp_family *f = tpk_gp_family_mlp_alloc(&p, X, gws, 0, ctx);
    if (f == NULL)
        return ctx->status;
    tpk_gp_hyper_options o;
    tpk_gp_hyper_options_default(&o);
    o.max_iter = 2;
    o.multistart = 1;
    double theta[2] = {2.0, 0.1}, noise = 0.05;
    tpk_gp_hyper_result r;
    int st = tpk_gp_fit_hyper(f, Y, theta, &noise, &o, &r, ctx);
    tpk_gp_family_free(f);
    return st;
}

static int case_tpk_gp_rbf_kernel(tpk_ctx *ctx)
{
    const double theta[2] = {1.5, 0.8};
    tpk_ctx c0;
    tpk_ctx_init(&c0);
    tpk_array *K = tpk_array_alloc2(N, N, &c0), *Kx = tpk_array_alloc2(M, N, &c0);
    size_t dm[1] = {M};
    tpk_array *kd = tpk_array_alloc(1, dm, &c0);
    int st = tpk_gp_rbf_kernel(theta, X, Xt, K, Kx, kd, ctx);
    tpk_array_free(K);
    tpk_array_free(Kx);
    tpk_array_free(kd);
    return st;
}

static int depth_cb(int depth, const tpk_array *K, const tpk_array *Kx, const tpk_array *kd,
                    void *data, tpk_ctx *ctx)
{
    (void)depth, (void)K, (void)Kx, (void)kd, (void)data, (void)ctx;
    return TPK_OK;
}

static int case_tpk_gp_mlp_sweep(tpk_ctx *ctx)
{
    tpk_mlp_params p = {.depth = 3, .phi = erf_, .sigma_w2 = 1.5, .sigma_b2 = 0.1};
    tpk_ctx c0;
    tpk_ctx_init(&c0);
    tpk_array *K = tpk_array_alloc2(N, N, &c0), *Kx = tpk_array_alloc2(M, N, &c0);
    size_t dm[1] = {M};
    tpk_array *kd = tpk_array_alloc(1, dm, &c0);
    int st = tpk_gp_mlp_sweep(&p, X, Xt, gws, K, Kx, kd, depth_cb, NULL, ctx);
    tpk_array_free(K);
    tpk_array_free(Kx);
    tpk_array_free(kd);
    return st;
}

static tpk_gp_experiment_opts exp_opts(void)
{
    tpk_gp_experiment_opts o;
    tpk_gp_experiment_opts_default(&o);
    o.kernel = "mlp";
    o.depth_lo = 1;
    o.depth_hi = 2;
    o.train = path_npy;
    o.test = path_npy;
    o.labels = path_lab;
    o.test_labels = path_lab;
    o.select_n = 4;
    o.output = path_out;
    o.force = 1;
    o.name = "fault";
    return o;
}

static int case_tpk_gp_experiment_run(tpk_ctx *ctx)
{
    tpk_gp_experiment_opts o = exp_opts();
    int st = tpk_gp_experiment_check(&o, ctx);
    return st ? st : tpk_gp_experiment_run(&o, ctx);
}

static int case_tpk_gp_experiment_hyper(tpk_ctx *ctx)
{
    tpk_gp_experiment_opts o = exp_opts();
    o.kernel = "rbf";
    o.depth_lo = o.depth_hi = 1;
    o.fit_hyper = 1;
    o.center = 1;
    return tpk_gp_experiment_run(&o, ctx);
}

static int case_tpk_gp_experiment_file(tpk_ctx *ctx)
{
    tpk_gp_experiment_opts o = exp_opts();
    o.kernel = NULL;
    o.kernel_file = path_kfile;
    o.depth_lo = o.depth_hi = 1;
    o.train = o.test = NULL;
    o.noise_auto = 0;
    o.noise = 0.04;
    o.test_labels = NULL;
    return tpk_gp_experiment_run(&o, ctx);
}

static const fcase gp_cases[] = {
    CASE(tpk_gp_fit), CASE(tpk_gp_spectral), CASE(tpk_gp_fit_search_noise), CASE(tpk_gp_lml_grad),
    CASE(tpk_gp_family_rbf), CASE(tpk_gp_family_mlp), CASE(tpk_gp_rbf_kernel),
    CASE(tpk_gp_mlp_sweep), CASE(tpk_gp_experiment_run), SAMPLED(tpk_gp_experiment_hyper, 8),
    CASE(tpk_gp_experiment_file),
};

static void test_gp(void **state)
{
    (void)state;
    run_group("gp", gp_cases, sizeof gp_cases / sizeof gp_cases[0]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_core),
        cmocka_unit_test(test_runtime),
        cmocka_unit_test(test_orch),
        cmocka_unit_test(test_kernels),
        cmocka_unit_test(test_netsor),
        cmocka_unit_test(test_app),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_gp),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
