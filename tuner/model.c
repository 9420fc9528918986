/* Cost model: gradient-boosted trees through XGBoost's C API with AutoTVM's settings
 * (xgboost_cost_model.py: max_depth 3, eta 0.3, gamma 1e-4, min_child_weight 1, lambda 1;
 * rank:pairwise for "rank", squared error on y/y_max for "reg"). */
#include "tune_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xgboost/c_api.h>

#define MAX_EXTRA 8

struct tpk_tune_model {
    int kind, nfeat, rounds, seed;
    BoosterHandle bst;
    int trained;
    int nextra; /* parameters overriding AutoTVM's (tpk_tune_model_set) */
    char extra[MAX_EXTRA][2][32];
};

static int xgb_fail(tpk_ctx *ctx, const char *what)
{
    return TPK_ERROR(ctx, TPK_ENUMERIC, "tune: XGBoost %s failed: %s", what, XGBGetLastError());
}

tpk_tune_model *tpk_tune_model_alloc(int kind, int nfeat, int rounds, int seed, tpk_ctx *ctx)
{
    if (kind != TPK_TUNE_MODEL_XGB_RANK && kind != TPK_TUNE_MODEL_XGB_REG) {
        TPK_ERROR(ctx, TPK_EINVAL, "tune: unknown model kind %d", kind);
        return NULL;
    }
    if (nfeat < 1 || nfeat > TPK_TUNE_MAX_FEATURES || rounds < 1) {
        TPK_ERROR(ctx, TPK_EINVAL, "tune: model needs 1..%d features and ≥ 1 round", TPK_TUNE_MAX_FEATURES);
        return NULL;
    }
    tpk_tune_model *m = calloc(1, sizeof *m);
    if (!m) {
        TPK_ERROR(ctx, TPK_ENOMEM, "tune: out of memory");
        return NULL;
    }
    m->kind = kind;
    m->nfeat = nfeat;
    m->rounds = rounds;
    m->seed = seed;
    return m;
}

void tpk_tune_model_free(tpk_tune_model *m)
{
    if (!m)
        return;
    if (m->bst)
        XGBoosterFree(m->bst);
    free(m);
}

int tpk_tune_model_set(tpk_tune_model *m, const char *name, const char *value, tpk_ctx *ctx)
{
    if (!m || !name || !value || strlen(name) >= sizeof m->extra[0][0] || strlen(value) >= sizeof m->extra[0][1])
        return TPK_ERROR(ctx, TPK_EINVAL, "tune: bad model parameter");
    int i = 0;
    while (i < m->nextra && strcmp(m->extra[i][0], name) != 0)
        i++;
    if (i == MAX_EXTRA)
        return TPK_ERROR(ctx, TPK_EINVAL, "tune: more than %d model parameters", MAX_EXTRA);
    if (i == m->nextra)
        m->nextra++;
    snprintf(m->extra[i][0], sizeof m->extra[i][0], "%s", name);
    snprintf(m->extra[i][1], sizeof m->extra[i][1], "%s", value);
    return TPK_OK;
}

int tpk_tune_model_trained(const tpk_tune_model *m)
{
    return m && m->trained;
}

/* One thread: the tuner forks measuring children, and an OpenMP pool in the parent would make
 * that unsafe; the data sets are small anyway (≤ a few thousand rows). */
static int make_dmatrix(const tpk_tune_model *m, const float *X, size_t n, const float *bm,
                        DMatrixHandle *d, tpk_ctx *ctx)
{
    if (XGDMatrixCreateFromMat_omp(X, (bst_ulong)n, (bst_ulong)m->nfeat, NAN, d, 1) != 0)
        return xgb_fail(ctx, "DMatrix");
    if (bm && XGDMatrixSetFloatInfo(*d, "base_margin", bm, (bst_ulong)n) != 0) {
        XGDMatrixFree(*d);
        return xgb_fail(ctx, "base_margin");
    }
    return TPK_OK;
}

int tpk_tune_model_fit(tpk_tune_model *m, const float *X, const float *y, size_t n,
                       const unsigned *group, size_t ngroup, const float *base_margin, tpk_ctx *ctx)
{
    if (n == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "tune: fitting a model on no data");
    float *lab = malloc(n * sizeof *lab);
    if (!lab)
        return TPK_ERROR(ctx, TPK_ENOMEM, "tune: out of memory");
    /* Labels: y / max(y) within each group (AutoTVM normalises by the maximum). */
    size_t off = 0;
    for (size_t g = 0; g < (group ? ngroup : 1); g++) {
        size_t len = group ? group[g] : n;
        float mx = 0;
        for (size_t i = off; i < off + len && i < n; i++)
            mx = y[i] > mx ? y[i] : mx;
        for (size_t i = off; i < off + len && i < n; i++)
            lab[i] = mx > 0 ? y[i] / mx : 0;
        off += len;
    }
    DMatrixHandle d;
    int st = make_dmatrix(m, X, n, base_margin, &d, ctx);
    if (st) {
        free(lab);
        return st;
    }
    if (XGDMatrixSetFloatInfo(d, "label", lab, (bst_ulong)n) != 0)
        st = xgb_fail(ctx, "labels");
    free(lab);
    if (!st && m->kind == TPK_TUNE_MODEL_XGB_RANK && group &&
        XGDMatrixSetUIntInfo(d, "group", group, (bst_ulong)ngroup) != 0)
        st = xgb_fail(ctx, "groups");
    if (m->bst) {
        XGBoosterFree(m->bst);
        m->bst = NULL;
        m->trained = 0;
    }
    if (!st && XGBoosterCreate(&d, 1, &m->bst) != 0)
        st = xgb_fail(ctx, "booster");
    char seed[32];
    snprintf(seed, sizeof seed, "%d", m->seed);
    const char *params[][2] = {
        {"objective", m->kind == TPK_TUNE_MODEL_XGB_RANK ? "rank:pairwise" : "reg:squarederror"},
        {"max_depth", "3"}, {"eta", "0.3"}, {"gamma", "0.0001"}, {"min_child_weight", "1"},
        {"lambda", "1"}, {"tree_method", "exact"}, {"nthread", "1"}, {"verbosity", "0"},
        {"seed", seed}};
    for (size_t i = 0; !st && i < sizeof params / sizeof params[0]; i++)
        if (XGBoosterSetParam(m->bst, params[i][0], params[i][1]) != 0)
            st = xgb_fail(ctx, "parameters");
    for (int i = 0; !st && i < m->nextra; i++)
        if (XGBoosterSetParam(m->bst, m->extra[i][0], m->extra[i][1]) != 0)
            st = xgb_fail(ctx, "parameters");
    for (int it = 0; !st && it < m->rounds; it++)
        if (XGBoosterUpdateOneIter(m->bst, it, d) != 0)
            st = xgb_fail(ctx, "training");
    XGDMatrixFree(d);
    if (!st)
        m->trained = 1;
    return st;
}

int tpk_tune_model_predict(const tpk_tune_model *m, const float *X, size_t n, const float *base_margin,
                           float *out, tpk_ctx *ctx)
{
    if (!m->trained)
        return TPK_ERROR(ctx, TPK_EINVAL, "tune: predicting with an untrained model");
    if (n == 0)
        return TPK_OK;
    DMatrixHandle d;
    int st = make_dmatrix(m, X, n, base_margin, &d, ctx);
    if (st)
        return st;
    bst_ulong len = 0;
    const float *res = NULL;
    if (XGBoosterPredict(m->bst, d, 0, 0, 0, &len, &res) != 0 || len != n)
        st = xgb_fail(ctx, "prediction");
    else
        memcpy(out, res, n * sizeof *out);
    XGDMatrixFree(d);
    return st;
}
