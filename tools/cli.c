/* Shared command-line helpers of tools/ (tools/cli.h). */
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tpk/clock.h"
#include "tpk/threads.h"

/* Every tool, as it starts: as many OpenMP threads as the process may use and other processes
 * leave free (include/tpk/threads.h). */
__attribute__((constructor)) static void cli_threads(void)
{
    tpk_threads_adapt();
}

#ifndef TPK_VERSION
#define TPK_VERSION "unknown"
#endif

int cli_parse_size(const char *name, const char *s, size_t lo, size_t hi, size_t *out,
                   tpk_ctx *ctx)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || *end != '\0' || errno == ERANGE || s[0] == '-' || s[0] == '+' || v < lo ||
        v > hi)
        return TPK_ERROR(ctx, TPK_EINVAL, "--%s: '%s' is not an integer in %zu..%zu", name, s, lo,
                         hi);
    *out = (size_t)v;
    return TPK_OK;
}

int cli_parse_int(const char *name, const char *s, int lo, int hi, int *out, tpk_ctx *ctx)
{
    size_t v = 0;
    if (lo < 0 || hi < lo)
        return TPK_ERROR(ctx, TPK_EINVAL, "--%s: bad range %d..%d", name, lo, hi);
    int st = cli_parse_size(name, s, (size_t)lo, (size_t)hi, &v, ctx);
    if (st == TPK_OK)
        *out = (int)v;
    return st;
}

int cli_parse_choice(const char *name, const char *s, const char *const *names, int *out,
                     tpk_ctx *ctx)
{
    char all[256];
    size_t k = 0;
    all[0] = '\0';
    for (int i = 0; names[i] != NULL; i++) {
        if (strcmp(s, names[i]) == 0) {
            *out = i;
            return TPK_OK;
        }
        k += (size_t)snprintf(all + k, k < sizeof all ? sizeof all - k : 0, "%s%s", i ? ", " : "",
                              names[i]);
        if (k >= sizeof all)
            k = sizeof all - 1;
    }
    return TPK_ERROR(ctx, TPK_EINVAL, "--%s: '%s' is not one of %s", name, s, all);
}

int cli_parse_kernel_kind(const char *s, int *out, tpk_ctx *ctx)
{
    /* the order of TPK_JOB_NNGP, TPK_JOB_NTK, TPK_JOB_BOTH */
    static const char *const names[] = {"nngp", "ntk", "both", NULL};
    return cli_parse_choice("kernel", s, names, out, ctx);
}

int cli_parse_ntk_param(const char *s, int *out, tpk_ctx *ctx)
{
    /* the order of TPK_NTK_PARAM_NTK, TPK_NTK_PARAM_TP */
    static const char *const names[] = {"ntk", "tp", "standard", NULL};
    return cli_parse_choice("parameterization", s, names, out, ctx);
}

int cli_parse_double(const char *name, const char *s, double *out, tpk_ctx *ctx)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || isnan(v))
        return TPK_ERROR(ctx, TPK_EINVAL, "--%s: '%s' is not a number", name, s);
    /* numbers, but not finite doubles: said as such (issue 18: "1e-320 is not a number") */
    if (isinf(v) && errno != ERANGE)
        return TPK_ERROR(ctx, TPK_EINVAL, "--%s: '%s' is not a finite number", name, s);
    if (errno == ERANGE)
        return TPK_ERROR(ctx, TPK_EINVAL, "--%s: '%s' is %s", name, s,
                         isinf(v) ? "beyond the range of a double (about 1.8e308)"
                                  : "below the smallest normal double (about 2.2e-308): give 0 "
                                    "or a larger value");
    *out = v;
    return TPK_OK;
}

int cli_parse_sizes(const char *name, const char *s, size_t lo, size_t hi, size_t *out,
                    size_t max, size_t *n, tpk_ctx *ctx)
{
    const char *dots = strstr(s, "..");
    *n = 0;
    if (dots) {
        char a[64];
        size_t len = (size_t)(dots - s), first, last;
        if (len == 0 || len >= sizeof a)
            return TPK_ERROR(ctx, TPK_EINVAL, "--%s: malformed range '%s'", name, s);
        memcpy(a, s, len);
        a[len] = '\0';
        if (cli_parse_size(name, a, lo > 0 ? lo : 1, hi, &first, ctx) ||
            cli_parse_size(name, dots + 2, lo > 0 ? lo : 1, hi, &last, ctx))
            return TPK_EINVAL;
        if (last <= first)
            return TPK_ERROR(ctx, TPK_EINVAL, "--%s: empty range '%s'", name, s);
        for (size_t v = first; v <= last; v *= 2) {
            if (*n == max)
                return TPK_ERROR(ctx, TPK_EINVAL, "--%s: more than %zu values", name, max);
            out[(*n)++] = v;
        }
        return TPK_OK;
    }
    char buf[1024];
    if (strlen(s) >= sizeof buf)
        return TPK_ERROR(ctx, TPK_EINVAL, "--%s: list too long", name);
    strcpy(buf, s);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (*n == max)
            return TPK_ERROR(ctx, TPK_EINVAL, "--%s: more than %zu values", name, max);
        if (cli_parse_size(name, t, lo, hi, &out[*n], ctx))
            return TPK_EINVAL;
        (*n)++;
    }
    return *n ? TPK_OK : TPK_ERROR(ctx, TPK_EINVAL, "--%s: empty list", name);
}

int cli_bad_option(char **argv, tpk_ctx *ctx)
{
    return TPK_ERROR(ctx, TPK_EINVAL, "unknown or malformed option '%s' (see --help)",
                     argv[optind - 1]);
}

int cli_no_operands(int argc, char **argv, tpk_ctx *ctx)
{
    if (optind < argc)
        return TPK_ERROR(ctx, TPK_EINVAL, "unexpected argument '%s' (see --help)", argv[optind]);
    return TPK_OK;
}

void cli_seen_init(cli_seen *s, const struct option *opts)
{
    memset(s, 0, sizeof *s);
    s->opts = opts;
}

int cli_seen_add(cli_seen *s, int longindex, const char *value, tpk_ctx *ctx)
{
    if (longindex < 0 || longindex >= CLI_MAX_OPTIONS)
        return TPK_OK; /* a short option (-h) */
    const struct option *op = &s->opts[longindex];
    if (s->given[longindex]++ && op->has_arg != no_argument && strcmp(op->name, "set") != 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "--%s given twice ('%s', then '%s'): give it once",
                         op->name, s->value[longindex] ? s->value[longindex] : "",
                         value ? value : "");
    s->value[longindex] = value;
    return TPK_OK;
}

int cli_getopt(int argc, char **argv, const struct option *opts, cli_seen *seen, int *st,
               tpk_ctx *ctx)
{
    int li = -1, c = getopt_long(argc, argv, "h", opts, &li);
    if (c != -1 && c != '?' && c != ':' && (*st = cli_seen_add(seen, li, optarg, ctx)))
        return -1;
    return c;
}

int cli_given(const cli_seen *s, const char *name)
{
    for (int i = 0; i < CLI_MAX_OPTIONS && s->opts[i].name; i++)
        if (strcmp(s->opts[i].name, name) == 0)
            return s->given[i] > 0;
    return 0;
}

int cli_refuse(const cli_seen *s, const char *name, const char *because, tpk_ctx *ctx)
{
    if (!cli_given(s, name))
        return TPK_OK;
    return TPK_ERROR(ctx, TPK_EINVAL, "--%s does not apply: %s", name, because);
}

int cli_sets_add(cli_sets *s, const char *kv, tpk_ctx *ctx)
{
    const char *eq = strchr(kv, '=');
    if (!eq || eq == kv)
        return TPK_ERROR(ctx, TPK_EINVAL, "--set needs NAME=VALUE (got '%s')", kv);
    for (int i = 0; i < s->n; i++)
        if (strlen(s->set[i].name) == (size_t)(eq - kv) &&
            strncmp(s->set[i].name, kv, (size_t)(eq - kv)) == 0)
            return TPK_ERROR(ctx, TPK_EINVAL, "--set %s given twice ('%s', then '%s'): give it "
                             "once", s->set[i].name, s->set[i].value, eq + 1);
    if (s->n == CLI_MAX_SETS)
        return TPK_ERROR(ctx, TPK_EINVAL, "--set: more than %d overrides", CLI_MAX_SETS);
    char *name = malloc((size_t)(eq - kv) + 1);
    if (!name)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    memcpy(name, kv, (size_t)(eq - kv));
    name[eq - kv] = '\0';
    s->owned[s->n] = name;
    s->set[s->n++] = (tpk_param_set){name, eq + 1};
    return TPK_OK;
}

void cli_sets_free(cli_sets *s)
{
    for (int i = 0; i < s->n; i++)
        free(s->owned[i]);
    s->n = 0;
}

const tpk_arch *cli_arch(const char *name, tpk_ctx *ctx)
{
    char names[512];
    const tpk_arch *a = tpk_arch_find(name);
    if (!a)
        TPK_ERROR(ctx, TPK_EINVAL, "--arch: unknown architecture '%s' (known: %s)", name,
                  tpk_arch_names(names, sizeof names));
    return a;
}

static int is_own_option(const struct option *own, const char *name, size_t len)
{
    for (const struct option *op = own; op->name; op++)
        if (strlen(op->name) == len && strncmp(op->name, name, len) == 0)
            return 1;
    return 0;
}

static int own_takes_value(const struct option *own, const char *name)
{
    for (const struct option *op = own; op->name; op++)
        if (strcmp(op->name, name) == 0)
            return op->has_arg == required_argument;
    return 0;
}

char **cli_arch_flags_take(int argc, char **argv, const struct option *own, cli_arch_flags *f,
                           int *nrest, tpk_ctx *ctx)
{
    char **rest = malloc((size_t)(argc + 1) * sizeof *rest);
    if (!rest) {
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        return NULL;
    }
    int k = 0;
    f->n = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (i == 0 || strncmp(a, "--", 2) != 0 || a[2] == '\0') {
            rest[k++] = argv[i];
            continue;
        }
        const char *eq = strchr(a, '='), *value = eq ? eq + 1 : NULL;
        size_t len = eq ? (size_t)(eq - a - 2) : strlen(a) - 2;
        if (is_own_option(own, a + 2, len)) {
            rest[k++] = argv[i];
            /* "--own value": the value is the next word, never an architecture flag */
            if (!eq && own_takes_value(own, a + 2) && i + 1 < argc)
                rest[k++] = argv[++i];
            continue;
        }
        if (!eq) { /* "--flag value": every architecture flag takes a value */
            const char *next = i + 1 < argc ? argv[i + 1] : NULL;
            if (!next || (next[0] == '-' && next[1] == '-')) {
                rest[k++] = argv[i]; /* getopt reports it as unknown */
                continue;
            }
            value = argv[++i];
        }
        if (f->n == CLI_MAX_FLAGS || len == 0 || len >= sizeof f->flag[0]) {
            free(rest);
            if (f->n == CLI_MAX_FLAGS)
                TPK_ERROR(ctx, TPK_EINVAL, "more than %d architecture flags", CLI_MAX_FLAGS);
            else
                TPK_ERROR(ctx, TPK_EINVAL, "unknown option '%s' (see --help)", a);
            return NULL;
        }
        for (int j = 0; j < f->n; j++)
            if (strlen(f->flag[j]) == len && strncmp(f->flag[j], a + 2, len) == 0) {
                TPK_ERROR(ctx, TPK_EINVAL, "--%s given twice ('%s', then '%s'): give it once",
                          f->flag[j], f->fl[j].value, value);
                free(rest);
                return NULL;
            }
        snprintf(f->flag[f->n], sizeof f->flag[0], "%.*s", (int)len, a + 2);
        f->fl[f->n] = (tpk_arch_flag){.flag = f->flag[f->n], .value = value};
        f->n++;
    }
    rest[k] = NULL;
    *nrest = k;
    return rest;
}

int cli_arch_flags_resolve(cli_arch_flags *f, const tpk_arch *a, const tpk_phi_registry *reg,
                           tpk_ctx *ctx)
{
    for (int i = 0; i < f->n; i++) {
        const char *flag = f->fl[i].flag;
        if (!a)
            return TPK_ERROR(ctx, TPK_EINVAL, "unknown option '--%s': architecture flags go with "
                             "--arch; use --set NAME=VALUE with --program", flag);
        if (!tpk_arch_flag_param(a, flag, f->param[i], sizeof f->param[0]))
            return TPK_ERROR(ctx, TPK_EINVAL, "unknown option '--%s' for --arch=%s (see --help "
                             "and gpkernel --list-archs)", flag, a->name);
        f->fl[i].param = f->param[i];
        int st = tpk_arch_check(a, flag, f->fl[i].value, reg, ctx);
        if (st)
            return st;
    }
    return TPK_OK;
}

static void note_stderr(void *ud, const char *msg)
{
    fprintf(stderr, "%s: note: %s\n", (const char *)ud, msg);
}

void cli_notes(tpk_ctx *ctx, const char *prog)
{
    tpk_ctx_set_notes(ctx, note_stderr, (void *)prog);
}

void cli_version(const char *prog)
{
    printf("%s (tpk) %s\n", prog, TPK_VERSION);
}

int cli_report(const char *prog, int st, const tpk_ctx *ctx)
{
    if (st == TPK_OK)
        return CLI_EXIT_OK;
    int status = ctx->status ? ctx->status : st;
    fprintf(stderr, "%s: error: %s (%s)\n", prog, ctx->msg[0] ? ctx->msg : "failed",
            tpk_strerror(status));
    return CLI_EXIT_ERROR;
}

int cli_report_usage(const char *prog, int st, const tpk_ctx *ctx)
{
    if (st == TPK_OK)
        return CLI_EXIT_OK;
    const char *m = ctx->msg[0] ? ctx->msg : "bad command line";
    if (strstr(m, "--help"))
        fprintf(stderr, "%s: usage error: %s\n", prog, m);
    else
        fprintf(stderr, "%s: usage error: %s (see %s --help)\n", prog, m, prog);
    return CLI_EXIT_USAGE;
}

/* ---- progress ---------------------------------------------------------------------------------- */

int cli_progress_wanted(int flag)
{
    return flag == 1 || (flag == -1 && isatty(STDERR_FILENO));
}

/* A threshold in seconds from the environment (tests, logs), else the default. */
static double env_seconds(const char *name, double dflt)
{
    const char *v = getenv(name);
    if (v == NULL || v[0] == '\0')
        return dflt;
    char *end;
    double x = strtod(v, &end);
    return *end == '\0' && x >= 0 && x < 1e9 ? x : dflt;
}

void cli_progress_start(cli_progress *p, const char *prog, const char *label, size_t total, int on)
{
    memset(p, 0, sizeof *p);
    p->prog = prog;
    p->label = label;
    p->total = total;
    p->on = on;
    p->tty = on && isatty(STDERR_FILENO);
    p->t0 = p->tstage = tpk_wall_seconds();
    p->after = env_seconds("TPK_PROGRESS_AFTER", CLI_PROGRESS_AFTER);
    p->every = env_seconds("TPK_PROGRESS_EVERY", CLI_PROGRESS_EVERY);
}

/* "mm:ss", or "h:mm:ss" from an hour on; "--:--" when unknown. */
static void clock_text(char *buf, size_t len, double s)
{
    if (!(s >= 0) || s > 1e8) {
        snprintf(buf, len, "--:--");
        return;
    }
    long t = lround(s);
    if (t >= 3600)
        snprintf(buf, len, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, len, "%02ld:%02ld", t / 60, t % 60);
}

/* "PROG: LABEL: UNIT done/total (p%)[, NOTE]" */
static int line_head(const cli_progress *p, char *buf, size_t len)
{
    double pc = p->total ? 100.0 * (double)p->done / (double)p->total : 0;
    return snprintf(buf, len, "%s: %s%s%s %zu/%zu (%.0f%%)%s%s", p->prog, p->label ? p->label : "",
                    p->label && p->unit ? ": " : "", p->unit ? p->unit : "", p->done, p->total,
                    pc, p->note[0] ? ", " : "", p->note);
}

/* Write text as the line: in place on a terminal (padded over a longer previous one), as a line
 * of its own elsewhere; final: end it. */
static void emit(cli_progress *p, const char *text, int final)
{
    int n = (int)strlen(text);
    if (p->tty) {
        fprintf(stderr, "\r%s%*s", text, p->width > n ? p->width - n : 0, "");
        if (final)
            fputc('\n', stderr);
        p->width = n;
        p->open = !final;
    } else {
        fprintf(stderr, "%s\n", text);
    }
    fflush(stderr);
    p->shown = 1;
}

/* The buffered library output so far to its destination, the line blanked first. */
static void flush_streams(cli_progress *p)
{
    for (int i = 0; i < p->nout; i++) {
        fflush(p->out[i].buf);
        if (p->out[i].len > p->out[i].sent) {
            cli_progress_clear(p);
            fwrite(p->out[i].data + p->out[i].sent, 1, p->out[i].len - p->out[i].sent,
                   p->out[i].dest);
            fflush(p->out[i].dest);
            p->out[i].sent = p->out[i].len;
        }
    }
}

void cli_progress_update(cli_progress *p, size_t done)
{
    if (!p->on || !p->total)
        return;
    flush_streams(p);
    p->done = done < p->total ? done : p->total;
    double now = tpk_wall_seconds(), t = now - p->t0, ts = now - p->tstage;
    if (t < p->after)
        return;
    int stage_end = p->done == p->total;
    if (!stage_end && p->shown &&
        now - p->tlast < (p->tty ? CLI_PROGRESS_REDRAW : p->every))
        return;
    if (stage_end && !p->shown) /* a stage that ended before anything was shown: nothing */
        return;
    char line[512], eta[32];
    int k = line_head(p, line, sizeof line);
    if (k < 0 || (size_t)k >= sizeof line)
        k = (int)sizeof line - 1;
    if (stage_end) {
        snprintf(line + k, sizeof line - (size_t)k, ", done in %.1f s", ts);
    } else {
        size_t dd = p->done - p->done0;
        clock_text(eta, sizeof eta, dd > 0 ? ts * (double)(p->total - p->done) / (double)dd : -1);
        snprintf(line + k, sizeof line - (size_t)k, ", %.0f s, ETA %s", t, eta);
    }
    emit(p, line, stage_end);
    p->tlast = now;
    if (stage_end)
        p->shown = 0; /* the next stage draws anew once it is due */
}

void cli_progress_clear(cli_progress *p)
{
    if (p->on && p->tty && p->open) {
        fprintf(stderr, "\r%*s\r", p->width, "");
        fflush(stderr);
        p->open = 0;
        p->tlast = 0; /* redraw at the next update */
    }
}

/* Close the stage's line: ok, as finished ("done in"); else ended where it stands (a newline on
 * a terminal, so that what follows starts a line of its own). */
static void close_stage(cli_progress *p, int ok)
{
    if (p->on && p->shown && ok && p->total) {
        p->done = p->total;
        char line[512];
        int k = line_head(p, line, sizeof line);
        if (k >= 0 && (size_t)k < sizeof line)
            snprintf(line + k, sizeof line - (size_t)k, ", done in %.1f s",
                     tpk_wall_seconds() - p->tstage);
        emit(p, line, 1);
    } else if (p->on && p->tty && p->open) {
        fputc('\n', stderr);
        fflush(stderr);
    }
    p->open = 0;
    p->shown = 0;
}

void cli_progress_end(cli_progress *p, int ok)
{
    close_stage(p, ok);
    flush_streams(p);
    for (int i = 0; i < p->nout; i++) {
        fclose(p->out[i].buf);
        free(p->out[i].data);
    }
    p->nout = 0;
}

/* A report of the library: a new unit or total is a new stage. */
static void on_report(const tpk_progress_info *in, void *user)
{
    cli_progress *p = user;
    if (!p->unit || strcmp(p->unit, in->what) != 0 || p->total != in->total) {
        close_stage(p, 0); /* a stage that stopped short (the next evaluator takes over) */
        p->unit = in->what;
        p->total = in->total;
        p->done0 = in->done;
        p->tstage = tpk_wall_seconds();
        p->tlast = 0;
    }
    cli_progress_update(p, in->done);
}

const tpk_progress *cli_progress_lib(cli_progress *p, const volatile sig_atomic_t *cancel)
{
    p->lib = (tpk_progress){.fn = p->on ? on_report : NULL, .user = p, .cancel = cancel};
    return &p->lib;
}

FILE *cli_progress_stream(cli_progress *p, FILE *dest)
{
    if (!dest || !p->tty || !isatty(fileno(dest)) || p->nout == CLI_PROGRESS_BUFFERS)
        return dest;
    int i = p->nout;
    p->out[i].data = NULL;
    p->out[i].len = p->out[i].sent = 0;
    p->out[i].buf = open_memstream(&p->out[i].data, &p->out[i].len);
    if (!p->out[i].buf)
        return dest;
    p->out[i].dest = dest;
    p->nout++;
    return p->out[i].buf;
}

/* ---- option tables ------------------------------------------------------------------------------ */

struct option *cli_options_join(const struct option *base, const struct option *own,
                                tpk_ctx *ctx)
{
    size_t nb = 0, no = 0;
    while (base[nb].name)
        nb++;
    while (own && own[no].name)
        no++;
    struct option *t = malloc((nb + no + 1) * sizeof *t);
    if (!t) {
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        return NULL;
    }
    memcpy(t, base, nb * sizeof *t);
    if (no)
        memcpy(t + nb, own, no * sizeof *t);
    t[nb + no] = base[nb];
    return t;
}

/* ---- the recorded command line ------------------------------------------------------------------- */

char **cli_record_argv(int argc, char **argv, int *n)
{
    static const char *const display[] = {"--progress", "--no-progress", "--quiet"};
    char **v = malloc(((size_t)argc + 1) * sizeof *v);
    if (!v)
        return NULL;
    int k = 0;
    for (int i = 0; i < argc; i++) {
        int skip = 0;
        for (size_t j = 0; j < sizeof display / sizeof display[0]; j++)
            skip |= i > 0 && strcmp(argv[i], display[j]) == 0;
        if (!skip)
            v[k++] = argv[i];
    }
    v[k] = NULL;
    *n = k;
    return v;
}
