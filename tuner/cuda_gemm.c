/* The cuda_gemm template (placeholder until the CUDA emitter lands). */
#include "tune_impl.h"

int tpk__cuda_gemm_space(tpk_tune_space *s, const tpk_tune_task *t, tpk_ctx *ctx)
{
    (void)s;
    (void)t;
    return TPK_ERROR(ctx, TPK_EUNSUPPORTED, "tune: cuda template not built");
}
int tpk__cuda_gemm_emit(const tpk_tune_space *s, const tpk_tune_config *c, const char *fname,
                        int standalone, FILE *out, tpk_ctx *ctx)
{
    (void)s; (void)c; (void)fname; (void)standalone; (void)out;
    return TPK_ERROR(ctx, TPK_EUNSUPPORTED, "tune: cuda template not built");
}
void tpk__cuda_gemm_default(const tpk_tune_space *s, tpk_tune_config *c)
{
    (void)s;
    (void)c;
}
int tpk__cuda_measure(const tpk_tune_space *s, const tpk_tune_config *c,
                      const tpk_tune_measure_opts *o, tpk_tune_result *res, tpk_ctx *ctx)
{
    (void)s; (void)c; (void)o; (void)ctx;
    res->err = TPK_TUNE_ENODEV;
    return TPK_OK;
}
