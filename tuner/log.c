/* Tuning logs: one JSON object per line per measurement (AutoTVM record.py; tuner-notes §3
 * "Tuning log"), written and read with jansson (strings escaped, every field's type checked, an
 * unknown op or dtype an error), and `tptune show`. */
#include "tune_impl.h"

#include <ctype.h>
#include <jansson.h>
#include <limits.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void tpk_tune_record_fill(tpk_tune_record *r, const tpk_tune_space *s, const tpk_tune_config *c,
                          const tpk_tune_result *res)
{
    memset(r, 0, sizeof *r);
    snprintf(r->target_class, sizeof r->target_class, "%s", tpk_tune_target_class(s->task.target));
    snprintf(r->template_name, sizeof r->template_name, "%s", s->template_name);
    r->task = s->task;
    r->nknob = s->nknob;
    for (int i = 0; i < s->nknob; i++) {
        snprintf(r->knob_name[i], sizeof r->knob_name[i], "%s", s->knob[i].name);
        r->knob_val[i] = c->v[i];
    }
    if (res)
        r->result = *res;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    r->ts = (double)ts.tv_sec;
}

/* Rounded as the logs have always been written: rates to 1e-3, costs to 7 significant digits. */
static double rounded(double x, double unit)
{
    return isfinite(x) ? round(x / unit) * unit : 0.0;
}

static int set(json_t *o, const char *key, json_t *v)
{
    return !v || json_object_set_new(o, key, v) != 0;
}

int tpk_tune_log_write(FILE *f, const tpk_tune_record *r, tpk_ctx *ctx)
{
    const tpk_tune_task *t = &r->task;
    const tpk_tune_result *s = &r->result;
    json_t *rec = json_object(), *task = json_object(), *knobs = json_object(),
           *res = json_object(), *costs = json_array();
    int bad = !rec || !task || !knobs || !res || !costs;
    bad |= set(rec, "v", json_integer(1)) | set(rec, "target", json_string(r->target_class)) |
           set(rec, "template", json_string(r->template_name));
    bad |= set(task, "op", json_string(tpk_tune_op_name(t->op))) |
           set(task, "dtype", json_string(tpk_tune_dtype_name(t->dtype))) |
           set(task, "m", json_integer((json_int_t)t->m)) | set(task, "n", json_integer((json_int_t)t->n)) |
           set(task, "k", json_integer((json_int_t)t->k)) | set(task, "threads", json_integer(t->threads));
    for (int i = 0; i < r->nknob && !bad; i++)
        bad |= set(knobs, r->knob_name[i], json_integer(r->knob_val[i]));
    for (int i = 0; i < s->ncost && !bad; i++) {
        double c = s->costs_s[i], e = c > 0 ? pow(10, floor(log10(c)) - 6) : 1;
        bad |= json_array_append_new(costs, json_real(rounded(c, e))) != 0;
    }
    bad |= set(res, "err", json_integer(s->err)) | set(res, "gflops", json_real(rounded(s->gflops, 1e-3))) |
           (json_object_set(res, "costs_s", costs) != 0) |
           set(res, "compile_s", json_real(rounded(s->compile_s, 1e-3))) |
           set(res, "cpu_ratio", json_real(rounded(s->cpu_ratio, 1e-3))) | set(res, "redone", json_integer(s->redone)) |
           set(res, "load1", json_real(rounded(s->load1, 1e-2))) |
           set(res, "max_rel_err", json_real(isfinite(s->max_rel_err) ? s->max_rel_err : 0.0));
    if (s->vendor_gflops > 0)
        bad |= set(res, "vendor_gflops", json_real(rounded(s->vendor_gflops, 1e-3)));
    bad |= set(res, "ts", json_integer((json_int_t)r->ts));
    bad |= json_object_set(rec, "task", task) != 0 || json_object_set(rec, "knobs", knobs) != 0 ||
           json_object_set(rec, "result", res) != 0;
    char *line = bad ? NULL : json_dumps(rec, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    json_decref(rec), json_decref(task), json_decref(knobs), json_decref(res), json_decref(costs);
    if (!line)
        return TPK_ERROR(ctx, TPK_ENOMEM, "tune: out of memory writing a log record");
    int ok = fputs(line, f) >= 0 && fputc('\n', f) != EOF;
    free(line);
    if (!ok || fflush(f) != 0 || ferror(f))
        return TPK_ERROR(ctx, TPK_EIO, "tune: cannot write the log: %s", strerror(errno));
    return TPK_OK;
}

/* ---- reading: jansson, with every field's type checked ------------------------------------ */

/* A field of o: NULL when absent; an error (named) when present with another type. */
static json_t *field(json_t *o, const char *key, int (*is)(const json_t *), const char *what,
                     const char *where, int need, tpk_ctx *ctx, int *st)
{
    json_t *v = o ? json_object_get(o, key) : NULL;
    if (*st)
        return NULL;
    if (!v) {
        if (need)
            *st = TPK_ERROR(ctx, TPK_EFORMAT, "%s: not a tuning record: no \"%s\"", where, key);
        return NULL;
    }
    if (!is(v)) {
        *st = TPK_ERROR(ctx, TPK_EFORMAT, "%s: \"%s\" must be %s", where, key, what);
        return NULL;
    }
    return v;
}
static int is_object(const json_t *v) { return json_is_object(v); }
static int is_string(const json_t *v) { return json_is_string(v); }
static int is_number(const json_t *v) { return json_is_number(v); }
static int is_integer(const json_t *v) { return json_is_integer(v); }
static int is_array(const json_t *v) { return json_is_array(v); }

static int copy_string(json_t *v, char *out, size_t cap, const char *key, const char *where, tpk_ctx *ctx)
{
    const char *s = json_string_value(v);
    if (strlen(s) >= cap)
        return TPK_ERROR(ctx, TPK_EFORMAT, "%s: \"%s\" longer than %zu characters", where, key, cap - 1);
    memcpy(out, s, strlen(s) + 1);
    return TPK_OK;
}

static int positive(json_t *v, const char *key, const char *where, json_int_t max, json_int_t *out, tpk_ctx *ctx)
{
    json_int_t x = json_integer_value(v);
    if (x < 1 || x > max)
        return TPK_ERROR(ctx, TPK_EFORMAT, "%s: \"%s\" must be an integer in 1..%lld, not %lld", where, key,
                         (long long)max, (long long)x);
    *out = x;
    return TPK_OK;
}

static double real(json_t *v)
{
    return v ? json_number_value(v) : 0.0;
}

/* One line → one record; where is "PATH:LINE". */
static int parse_record(const char *line, const char *where, tpk_tune_record *r, tpk_ctx *ctx)
{
    memset(r, 0, sizeof *r);
    json_error_t je;
    json_t *rec = json_loads(line, JSON_REJECT_DUPLICATES, &je);
    if (!rec)
        return TPK_ERROR(ctx, TPK_EFORMAT, "%s: not a tuning record: %s (column %d)", where, je.text, je.column);
    int st = TPK_OK;
    if (!json_is_object(rec))
        st = TPK_ERROR(ctx, TPK_EFORMAT, "%s: not a tuning record: not a JSON object", where);
    json_t *target = field(rec, "target", is_string, "a string", where, 1, ctx, &st);
    json_t *tmpl = field(rec, "template", is_string, "a string", where, 1, ctx, &st);
    json_t *task = field(rec, "task", is_object, "an object", where, 1, ctx, &st);
    json_t *knobs = field(rec, "knobs", is_object, "an object", where, 1, ctx, &st);
    json_t *res = field(rec, "result", is_object, "an object", where, 1, ctx, &st);
    if (!st)
        st = copy_string(target, r->target_class, sizeof r->target_class, "target", where, ctx);
    if (!st)
        st = copy_string(tmpl, r->template_name, sizeof r->template_name, "template", where, ctx);
    if (!st && !strncmp(r->target_class, "cuda", 4))
        r->task.target = TPK_TUNE_CUDA;
    /* task: an unknown op or dtype is an error, not a guess */
    json_t *op = field(task, "op", is_string, "a string", where, 1, ctx, &st);
    json_t *dt = field(task, "dtype", is_string, "a string", where, 1, ctx, &st);
    if (!st) {
        const char *o = json_string_value(op), *d = json_string_value(dt);
        if (!strcmp(o, "gemm"))
            r->task.op = TPK_TUNE_GEMM;
        else if (!strcmp(o, "syrk"))
            r->task.op = TPK_TUNE_SYRK;
        else if (!strcmp(o, "relu_map"))
            r->task.op = TPK_TUNE_MAP;
        else
            st = TPK_ERROR(ctx, TPK_EFORMAT, "%s: unknown op \"%s\" (gemm, syrk, relu_map)", where, o);
        if (!st && !strcmp(d, "f64"))
            r->task.dtype = TPK_TUNE_F64;
        else if (!st && !strcmp(d, "f32"))
            r->task.dtype = TPK_TUNE_F32;
        else if (!st)
            st = TPK_ERROR(ctx, TPK_EFORMAT, "%s: unknown dtype \"%s\" (f64, f32)", where, d);
    }
    static const char *const dims[] = {"m", "n", "k", "threads"};
    for (int i = 0; i < 4 && !st; i++) {
        json_t *v = field(task, dims[i], is_integer, "an integer", where, 1, ctx, &st);
        json_int_t x = 0;
        if (!st)
            st = positive(v, dims[i], where, i < 3 ? ((json_int_t)1 << 40) : 4096, &x, ctx);
        if (i == 0)
            r->task.m = (size_t)x;
        else if (i == 1)
            r->task.n = (size_t)x;
        else if (i == 2)
            r->task.k = (size_t)x;
        else
            r->task.threads = (int)x;
    }
    /* knobs, in the order written */
    const char *key;
    json_t *v;
    if (!st)
        json_object_foreach(knobs, key, v)
        {
            if (r->nknob >= TPK_TUNE_MAX_KNOBS) {
                st = TPK_ERROR(ctx, TPK_EFORMAT, "%s: more than %d knobs", where, TPK_TUNE_MAX_KNOBS);
                break;
            }
            if (!json_is_integer(v) || json_integer_value(v) < INT_MIN || json_integer_value(v) > INT_MAX) {
                st = TPK_ERROR(ctx, TPK_EFORMAT, "%s: knob \"%s\" must be an integer", where, key);
                break;
            }
            if (strlen(key) >= sizeof r->knob_name[0]) {
                st = TPK_ERROR(ctx, TPK_EFORMAT, "%s: knob name \"%s\" too long", where, key);
                break;
            }
            memcpy(r->knob_name[r->nknob], key, strlen(key) + 1);
            r->knob_val[r->nknob++] = (int)json_integer_value(v);
        }
    if (!st && r->nknob == 0)
        st = TPK_ERROR(ctx, TPK_EFORMAT, "%s: not a tuning record: no knobs", where);
    /* result */
    tpk_tune_result *s = &r->result;
    json_t *err = field(res, "err", is_integer, "an integer", where, 1, ctx, &st);
    json_t *gf = field(res, "gflops", is_number, "a number", where, 1, ctx, &st);
    json_t *costs = field(res, "costs_s", is_array, "an array", where, 0, ctx, &st);
    json_t *comp = field(res, "compile_s", is_number, "a number", where, 0, ctx, &st);
    json_t *cpu = field(res, "cpu_ratio", is_number, "a number", where, 0, ctx, &st);
    json_t *red = field(res, "redone", is_integer, "an integer", where, 0, ctx, &st);
    json_t *load = field(res, "load1", is_number, "a number", where, 0, ctx, &st);
    json_t *mre = field(res, "max_rel_err", is_number, "a number", where, 0, ctx, &st);
    json_t *ven = field(res, "vendor_gflops", is_number, "a number", where, 0, ctx, &st);
    json_t *ts = field(res, "ts", is_number, "a number", where, 0, ctx, &st);
    if (!st) {
        s->err = (int)json_integer_value(err);
        s->gflops = real(gf);
        s->compile_s = real(comp);
        s->cpu_ratio = real(cpu);
        s->redone = red ? (int)json_integer_value(red) : 0;
        s->load1 = real(load);
        s->max_rel_err = real(mre);
        s->vendor_gflops = real(ven);
        r->ts = real(ts);
        size_t i;
        json_array_foreach(costs, i, v)
        {
            if (!json_is_number(v)) {
                st = TPK_ERROR(ctx, TPK_EFORMAT, "%s: \"costs_s\" must hold numbers", where);
                break;
            }
            if (s->ncost < TPK_TUNE_MAX_REPEAT)
                s->costs_s[s->ncost++] = json_number_value(v);
        }
    }
    json_decref(rec);
    return st;
}

int tpk_tune_log_read(const char *path, tpk_tune_record **recs, size_t *n, tpk_ctx *ctx)
{
    *recs = NULL;
    *n = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return TPK_ERROR(ctx, TPK_EIO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 0, lineno = 0;
    char *line = NULL;
    size_t lcap = 0;
    int st = TPK_OK;
    while (getline(&line, &lcap, f) > 0) {
        lineno++;
        const char *p = line;
        while (isspace((unsigned char)*p))
            p++;
        if (!*p)
            continue;
        char where[1100];
        snprintf(where, sizeof where, "%s:%zu", path, lineno);
        tpk_tune_record r;
        if ((st = parse_record(p, where, &r, ctx)))
            break;
        if (*n == cap) {
            size_t nc = cap ? 2 * cap : 64;
            tpk_tune_record *nr = realloc(*recs, nc * sizeof *nr);
            if (!nr) {
                st = TPK_ERROR(ctx, TPK_ENOMEM, "tune: out of memory reading %s", path);
                break;
            }
            *recs = nr;
            cap = nc;
        }
        (*recs)[(*n)++] = r;
    }
    free(line);
    fclose(f);
    if (st) {
        free(*recs);
        *recs = NULL;
        *n = 0;
    }
    return st;
}

int tpk_tune_record_unloaded(const tpk_tune_record *r)
{
    int threads = r->task.threads > 0 ? r->task.threads : 1;
    return !(r->result.load1 > threads + 1.0);
}

int tpk_tune_record_config(const tpk_tune_space *s, const tpk_tune_record *r, tpk_tune_config *c,
                           tpk_ctx *ctx)
{
    /* A knob the record does not name takes its first candidate: knobs are appended to a
     * template with the old behaviour as candidate 0, so older logs keep their meaning. */
    memset(c, 0, sizeof *c);
    for (int i = 0; i < s->nknob; i++)
        c->v[i] = s->knob[i].cand[0];
    for (int i = 0; i < r->nknob; i++)
        if (tpk_tune_config_set(s, c, r->knob_name[i], r->knob_val[i]) != TPK_OK)
            return TPK_ERROR(ctx, TPK_ENOTFOUND, "tune: knob %s=%d is not in the %s space",
                             r->knob_name[i], r->knob_val[i], s->template_name);
    return TPK_OK;
}

static int same_workload(const tpk_tune_record *a, const tpk_tune_record *b)
{
    return !strcmp(a->target_class, b->target_class) && tpk_tune_task_same(&a->task, &b->task);
}

int tpk_tune_log_show(const tpk_tune_record *recs, size_t n, FILE *out)
{
    char *seen = calloc(n ? n : 1, 1);
    if (!seen)
        return TPK_ENOMEM;
    fprintf(out, "%-26s %-4s %-5s %6s %6s %6s %3s %7s %6s %9s  %s\n", "target", "op", "dtype", "m", "n", "k",
            "thr", "records", "failed", "best GF/s", "best knobs");
    for (size_t i = 0; i < n; i++) {
        if (seen[i])
            continue;
        size_t count = 0, failed = 0, best = i;
        for (size_t j = i; j < n; j++)
            if (!seen[j] && same_workload(&recs[i], &recs[j])) {
                seen[j] = 1;
                count++;
                failed += recs[j].result.err != 0;
                if (recs[j].result.err == 0 && recs[j].result.gflops > recs[best].result.gflops)
                    best = j;
            }
        const tpk_tune_record *b = &recs[best];
        char knobs[256] = "";
        size_t off = 0;
        for (int q = 0; q < b->nknob && off < sizeof knobs; q++) {
            int w = snprintf(knobs + off, sizeof knobs - off, "%s%s=%d", q ? "," : "", b->knob_name[q], b->knob_val[q]);
            if (w < 0)
                break;
            off += (size_t)w;
        }
        fprintf(out, "%-26s %-4s %-5s %6zu %6zu %6zu %3d %7zu %6zu %9.1f  %s\n", b->target_class,
                tpk_tune_op_name(b->task.op), tpk_tune_dtype_name(b->task.dtype), b->task.m, b->task.n, b->task.k, b->task.threads,
                count, failed, b->result.err ? 0.0 : b->result.gflops, knobs);
    }
    free(seen);
    return TPK_OK;
}
