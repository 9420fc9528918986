/* Tuning logs: one JSON object per line per measurement (AutoTVM record.py; tuner-notes §3
 * "Tuning log"), a small JSON reader for our own records, and `tptune show`. */
#include "tune_impl.h"

#include <ctype.h>
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

int tpk_tune_log_write(FILE *f, const tpk_tune_record *r, tpk_ctx *ctx)
{
    const tpk_tune_task *t = &r->task;
    fprintf(f, "{\"v\":1,\"target\":\"%s\",\"template\":\"%s\",\"task\":{\"op\":\"%s\",\"dtype\":\"%s\","
               "\"m\":%zu,\"n\":%zu,\"k\":%zu,\"threads\":%d},\"knobs\":{",
            r->target_class, r->template_name, tpk_tune_op_name(t->op), tpk_tune_dtype_name(t->dtype), t->m, t->n,
            t->k, t->threads);
    for (int i = 0; i < r->nknob; i++)
        fprintf(f, "%s\"%s\":%d", i ? "," : "", r->knob_name[i], r->knob_val[i]);
    const tpk_tune_result *s = &r->result;
    fprintf(f, "},\"result\":{\"err\":%d,\"gflops\":%.3f,\"costs_s\":[", s->err, s->gflops);
    for (int i = 0; i < s->ncost; i++)
        fprintf(f, "%s%.6e", i ? "," : "", s->costs_s[i]);
    fprintf(f, "],\"compile_s\":%.3f,\"cpu_ratio\":%.3f,\"redone\":%d,\"load1\":%.2f,\"max_rel_err\":%.3e,",
            s->compile_s, s->cpu_ratio, s->redone, s->load1, s->max_rel_err);
    if (s->vendor_gflops > 0)
        fprintf(f, "\"vendor_gflops\":%.3f,", s->vendor_gflops);
    fprintf(f, "\"ts\":%.0f}}\n", r->ts);
    if (fflush(f) != 0 || ferror(f))
        return TPK_ERROR(ctx, TPK_EIO, "tune: cannot write the log: %s", strerror(errno));
    return TPK_OK;
}

/* ---- a small JSON reader: enough for the records above ------------------------------------ */

typedef struct jp {
    const char *p;
    int err;
} jp;

static void ws(jp *j)
{
    while (isspace((unsigned char)*j->p))
        j->p++;
}

static int expect(jp *j, char c)
{
    ws(j);
    if (*j->p != c) {
        j->err = 1;
        return 0;
    }
    j->p++;
    return 1;
}

static void str(jp *j, char *out, size_t cap)
{
    size_t n = 0;
    if (!expect(j, '"'))
        return;
    while (*j->p && *j->p != '"') {
        char c = *j->p++;
        if (c == '\\' && *j->p)
            c = *j->p++;
        if (out && n + 1 < cap)
            out[n++] = c;
    }
    if (out && cap)
        out[n] = '\0';
    if (!expect(j, '"'))
        return;
}

static void skip_value(jp *j);

static double num(jp *j)
{
    ws(j);
    char *end;
    double v = strtod(j->p, &end);
    if (end == j->p)
        j->err = 1;
    j->p = end;
    return v;
}

static void skip_value(jp *j)
{
    ws(j);
    char c = *j->p;
    if (c == '"')
        str(j, NULL, 0);
    else if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j->p++;
        ws(j);
        if (*j->p == close) {
            j->p++;
            return;
        }
        for (;;) {
            if (c == '{') {
                str(j, NULL, 0);
                expect(j, ':');
            }
            skip_value(j);
            ws(j);
            if (*j->p == ',') {
                j->p++;
                continue;
            }
            expect(j, close);
            return;
        }
    } else if (!strncmp(j->p, "true", 4) || !strncmp(j->p, "null", 4))
        j->p += 4;
    else if (!strncmp(j->p, "false", 5))
        j->p += 5;
    else
        num(j);
}

/* Iterate over an object's members: calls fn(key) positioned at the value; fn consumes it. */
typedef void (*member_fn)(jp *j, const char *key, void *u);
static void object(jp *j, member_fn fn, void *u)
{
    if (!expect(j, '{'))
        return;
    ws(j);
    if (*j->p == '}') {
        j->p++;
        return;
    }
    while (!j->err) {
        char key[64];
        str(j, key, sizeof key);
        expect(j, ':');
        if (j->err)
            return;
        fn(j, key, u);
        ws(j);
        if (*j->p == ',') {
            j->p++;
            continue;
        }
        expect(j, '}');
        return;
    }
}

static void task_member(jp *j, const char *key, void *u)
{
    tpk_tune_record *r = u;
    if (!strcmp(key, "dtype")) {
        char d[16];
        str(j, d, sizeof d);
        r->task.dtype = !strcmp(d, "f32") ? TPK_TUNE_F32 : TPK_TUNE_F64;
    } else if (!strcmp(key, "op")) {
        char d[16];
        str(j, d, sizeof d);
        r->task.op = !strcmp(d, "syrk") ? TPK_TUNE_SYRK : !strcmp(d, "relu_map") ? TPK_TUNE_MAP : TPK_TUNE_GEMM;
    } else if (!strcmp(key, "m"))
        r->task.m = (size_t)num(j);
    else if (!strcmp(key, "n"))
        r->task.n = (size_t)num(j);
    else if (!strcmp(key, "k"))
        r->task.k = (size_t)num(j);
    else if (!strcmp(key, "threads"))
        r->task.threads = (int)num(j);
    else
        skip_value(j);
}

static void knob_member(jp *j, const char *key, void *u)
{
    tpk_tune_record *r = u;
    if (r->nknob >= TPK_TUNE_MAX_KNOBS) {
        j->err = 1;
        return;
    }
    snprintf(r->knob_name[r->nknob], sizeof r->knob_name[0], "%s", key);
    r->knob_val[r->nknob++] = (int)num(j);
}

static void result_member(jp *j, const char *key, void *u)
{
    tpk_tune_result *s = &((tpk_tune_record *)u)->result;
    if (!strcmp(key, "err"))
        s->err = (int)num(j);
    else if (!strcmp(key, "gflops"))
        s->gflops = num(j);
    else if (!strcmp(key, "compile_s"))
        s->compile_s = num(j);
    else if (!strcmp(key, "cpu_ratio"))
        s->cpu_ratio = num(j);
    else if (!strcmp(key, "redone"))
        s->redone = (int)num(j);
    else if (!strcmp(key, "load1"))
        s->load1 = num(j);
    else if (!strcmp(key, "max_rel_err"))
        s->max_rel_err = num(j);
    else if (!strcmp(key, "vendor_gflops"))
        s->vendor_gflops = num(j);
    else if (!strcmp(key, "ts"))
        ((tpk_tune_record *)u)->ts = num(j);
    else if (!strcmp(key, "costs_s")) {
        expect(j, '[');
        ws(j);
        if (*j->p == ']') {
            j->p++;
            return;
        }
        while (!j->err) {
            double v = num(j);
            if (s->ncost < TPK_TUNE_MAX_REPEAT)
                s->costs_s[s->ncost++] = v;
            ws(j);
            if (*j->p == ',') {
                j->p++;
                continue;
            }
            expect(j, ']');
            return;
        }
    } else
        skip_value(j);
}

static void record_member(jp *j, const char *key, void *u)
{
    tpk_tune_record *r = u;
    if (!strcmp(key, "target")) {
        str(j, r->target_class, sizeof r->target_class);
        if (!strncmp(r->target_class, "cuda", 4))
            r->task.target = TPK_TUNE_CUDA;
    } else if (!strcmp(key, "template"))
        str(j, r->template_name, sizeof r->template_name);
    else if (!strcmp(key, "task"))
        object(j, task_member, r);
    else if (!strcmp(key, "knobs"))
        object(j, knob_member, r);
    else if (!strcmp(key, "result"))
        object(j, result_member, r);
    else
        skip_value(j);
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
        jp j = {line, 0};
        ws(&j);
        if (!*j.p)
            continue;
        tpk_tune_record r;
        memset(&r, 0, sizeof r);
        object(&j, record_member, &r);
        if (j.err || !r.task.m || !r.nknob) {
            st = TPK_ERROR(ctx, TPK_EFORMAT, "%s:%zu: not a tuning record", path, lineno);
            break;
        }
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
