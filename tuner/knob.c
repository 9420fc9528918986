/* Knob mechanics of schedule spaces: the mixed-radix index, validity, random points (AutoTVM
 * task/space.py: point2knob, knob2point, random_walk), names and small helpers. The templates
 * build their spaces from these; space.c dispatches to the templates. */
#include "tune_impl.h"

#include "tpk/clock.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double tpk__log2(double x)
{
    return x > 0 ? log2(x) : 0.0;
}

const char *tpk_tune_dtype_name(int dtype)
{
    return dtype == TPK_TUNE_F32 ? "f32" : "f64";
}

const char *tpk_tune_target_name(int target)
{
    return target == TPK_TUNE_CUDA ? "cuda" : "cpu";
}

const char *tpk_tune_op_name(int op)
{
    return op == TPK_TUNE_SYRK ? "syrk" : op == TPK_TUNE_MAP ? "relu_map" : "gemm";
}

const char *tpk_tune_target_class(int target)
{
    return target == TPK_TUNE_CUDA ? "cuda/sm_90" : tpk_machine_host_name();
}

double tpk_tune_task_flops(const tpk_tune_task *t)
{
    if (t->op == TPK_TUNE_MAP) /* entries of the lower triangle: the rate is entries per second */
        return (double)t->m * ((double)t->m + 1) / 2;
    if (t->op == TPK_TUNE_SYRK) /* the lower triangle, diagonal included */
        return (double)t->m * ((double)t->m + 1) * (double)t->k;
    return 2.0 * (double)t->m * (double)t->n * (double)t->k;
}

int tpk_tune_task_same(const tpk_tune_task *a, const tpk_tune_task *b)
{
    return a->target == b->target && a->op == b->op && a->dtype == b->dtype && a->m == b->m && a->n == b->n &&
           a->k == b->k && a->threads == b->threads;
}

void tpk_tune_space_point(const tpk_tune_space *s, uint64_t index, tpk_tune_config *c)
{
    memset(c, 0, sizeof *c);
    for (int i = 0; i < s->nknob; i++) {
        uint64_t r = (uint64_t)s->knob[i].ncand;
        c->v[i] = s->knob[i].cand[index % r];
        index /= r;
    }
}

static int cand_pos(const tpk_tune_knob *k, int v)
{
    for (int j = 0; j < k->ncand; j++)
        if (k->cand[j] == v)
            return j;
    return -1;
}

uint64_t tpk_tune_space_index(const tpk_tune_space *s, const tpk_tune_config *c)
{
    uint64_t idx = 0;
    for (int i = s->nknob - 1; i >= 0; i--) {
        int p = cand_pos(&s->knob[i], c->v[i]);
        idx = idx * (uint64_t)s->knob[i].ncand + (uint64_t)(p < 0 ? 0 : p);
    }
    return idx;
}

int tpk_tune_space_valid(const tpk_tune_space *s, const tpk_tune_config *c)
{
    for (int i = 0; i < s->nknob; i++)
        if (cand_pos(&s->knob[i], c->v[i]) < 0)
            return 0;
    return s->valid ? s->valid(s, c) : 1;
}

int tpk_tune_config_get(const tpk_tune_space *s, const tpk_tune_config *c, const char *name,
                        int dflt)
{
    for (int i = 0; i < s->nknob; i++)
        if (strcmp(s->knob[i].name, name) == 0)
            return c->v[i];
    return dflt;
}

int tpk_tune_config_set(const tpk_tune_space *s, tpk_tune_config *c, const char *name, int value)
{
    for (int i = 0; i < s->nknob; i++)
        if (strcmp(s->knob[i].name, name) == 0) {
            if (cand_pos(&s->knob[i], value) < 0)
                return TPK_ENOTFOUND;
            c->v[i] = value;
            return TPK_OK;
        }
    return TPK_ENOTFOUND;
}

uint64_t tpk_tune_space_random(const tpk_tune_space *s, uint64_t *rng)
{
    tpk_tune_config c;
    uint64_t idx = 0;
    for (int tries = 0; tries < 100000; tries++) {
        idx = tpk__rng_next(rng) % s->size;
        tpk_tune_space_point(s, idx, &c);
        if (!s->valid || s->valid(s, &c))
            return idx;
    }
    return idx; /* a space with almost no valid point: the caller's validity check rejects it */
}

char *tpk_tune_config_str(const tpk_tune_space *s, const tpk_tune_config *c, char *buf, size_t cap)
{
    size_t off = 0;
    buf[0] = '\0';
    for (int i = 0; i < s->nknob && off < cap; i++) {
        const tpk_tune_knob *k = &s->knob[i];
        int p = cand_pos(k, c->v[i]);
        int w;
        if (k->labels && p >= 0)
            w = snprintf(buf + off, cap - off, "%s%s=%s", i ? "," : "", k->name, k->labels[p]);
        else
            w = snprintf(buf + off, cap - off, "%s%s=%d", i ? "," : "", k->name, c->v[i]);
        if (w < 0)
            break;
        off += (size_t)w;
    }
    return buf;
}

int tpk_tune_config_parse(const tpk_tune_space *s, tpk_tune_config *c, const char *knobs, tpk_ctx *ctx)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", knobs);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        int v = 0;
        if (eq) {
            *eq = '\0';
            v = atoi(eq + 1);
            for (int i = 0; i < s->nknob; i++)
                for (int j = 0; s->knob[i].labels && j < s->knob[i].ncand; j++)
                    if (!strcmp(s->knob[i].name, tok) && !strcmp(s->knob[i].labels[j], eq + 1))
                        v = s->knob[i].cand[j];
        }
        if (!eq || tpk_tune_config_set(s, c, tok, v))
            return TPK_ERROR(ctx, TPK_EINVAL, "--knobs: '%s' is not a knob=value of the %s space", tok,
                             s->template_name);
    }
    return TPK_OK;
}
