/* Schedule spaces through the one table of templates (FFTW's solver list, dft/conf.c): the first
 * template applicable to a task builds its space, default configuration and code. A space that
 * tpk_tune_space_init accepted always has its template. */
#include "tune_impl.h"

#include <stddef.h>
#include <string.h>

static const tpk__template *const templates[] = {
    &tpk__template_cpu_gemm,
    &tpk__template_cpu_map,
    &tpk__template_cuda_gemm,
};

static const tpk__template *template_for(const tpk_tune_task *t)
{
    for (size_t i = 0; i < sizeof templates / sizeof templates[0]; i++)
        if (templates[i]->applicable(t))
            return templates[i];
    return NULL;
}

int tpk_tune_space_init(tpk_tune_space *s, const tpk_tune_task *task, tpk_ctx *ctx)
{
    tpk_machine host;
    tpk_machine_host(&host);
    return tpk_tune_space_init_on(s, task, &host, ctx);
}

int tpk_tune_space_init_record(tpk_tune_space *s, const tpk_tune_record *r,
                               tpk_tune_class_fn find, tpk_ctx *ctx)
{
    const tpk_machine *m = find && r->target_class[0] ? find(r->target_class) : NULL;
    return m ? tpk_tune_space_init_on(s, &r->task, m, ctx) : tpk_tune_space_init(s, &r->task, ctx);
}

int tpk_tune_space_init_on(tpk_tune_space *s, const tpk_tune_task *task, const tpk_machine *m,
                           tpk_ctx *ctx)
{
    memset(s, 0, sizeof *s);
    s->machine = *m;
    if (task->m == 0 || task->n == 0 || task->k == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "tune: empty workload %zux%zux%zu", task->m, task->n,
                         task->k);
    if (task->dtype != TPK_TUNE_F64 && task->dtype != TPK_TUNE_F32)
        return TPK_ERROR(ctx, TPK_EINVAL, "tune: dtype must be f64 or f32");
    if (task->op != TPK_TUNE_GEMM && task->op != TPK_TUNE_SYRK && task->op != TPK_TUNE_MAP)
        return TPK_ERROR(ctx, TPK_EINVAL, "tune: op must be gemm, syrk or relu_map");
    if (task->op == TPK_TUNE_MAP && (task->n != task->m || task->target != TPK_TUNE_CPU))
        return TPK_ERROR(ctx, TPK_EINVAL, "tune: relu_map needs n = m and the cpu target");
    if (task->op == TPK_TUNE_SYRK && (task->n != task->m || task->target != TPK_TUNE_CPU))
        return TPK_ERROR(ctx, TPK_EINVAL, "tune: syrk needs n = m and the cpu target");
    if (task->target != TPK_TUNE_CPU && task->target != TPK_TUNE_CUDA)
        return TPK_ERROR(ctx, TPK_EINVAL, "tune: target must be cpu or cuda");
    const tpk__template *tp = template_for(task);
    if (!tp)
        return TPK_ERROR(ctx, TPK_EINVAL, "tune: no template serves %s %s on %s",
                         tpk_tune_op_name(task->op), tpk_tune_dtype_name(task->dtype),
                         tpk_tune_target_name(task->target));
    int st = tp->space(s, task, ctx);
    if (st)
        return st;
    s->size = 1;
    for (int i = 0; i < s->nknob; i++)
        s->size *= (uint64_t)s->knob[i].ncand;
    return TPK_OK;
}

void tpk_tune_space_default(const tpk_tune_space *s, tpk_tune_config *c)
{
    template_for(&s->task)->defaults(s, c);
}

int tpk__emit(const tpk_tune_space *s, const tpk_tune_config *c, const char *fname, int standalone,
              tpk__mutation *mu, FILE *out, tpk_ctx *ctx)
{
    if (!tpk_tune_space_valid(s, c))
        return TPK_ERROR(ctx, TPK_EINVAL, "tune: configuration violates the space's constraints");
    return template_for(&s->task)->emit(s, c, fname, standalone, mu, out, ctx);
}

int tpk_tune_emit(const tpk_tune_space *s, const tpk_tune_config *c, const char *fname,
                  int standalone, FILE *out, tpk_ctx *ctx)
{
    return tpk__emit(s, c, fname, standalone, NULL, out, ctx);
}
