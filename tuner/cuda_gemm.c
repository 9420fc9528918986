/* The cuda_gemm template: a thread-block tile BM×BN stepping through K in BK slices, staged in
 * shared memory by a STAGES-deep cp.async pipeline (cuda_pipeline.h), each thread accumulating a
 * TM×TN register tile (tuner-notes §3 "CUDA GEMM space"); optional split-K with atomics. Knob
 * table, constraints, features, the CUDA emitter, and a measuring harness (nvcc + cuBLAS). */
#include "tune_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { C_BM, C_BN, C_BK, C_TM, C_TN, C_ST, C_VEC, C_PAD, C_SPLITK, C_COUNT };

#define SM_COUNT 132          /* H100/H200 SXM */
#define SMEM_PER_SM (228 * 1024)
#define SMEM_PER_BLOCK (227 * 1024) /* opt-in maximum per block */
#define THREADS_PER_SM 2048

static void set_knob(tpk_tune_knob *k, const char *name, const int *c, int n)
{
    k->name = name;
    k->ncand = n;
    memcpy(k->cand, c, (size_t)n * sizeof *c);
    k->labels = NULL;
}

typedef struct cu_blk {
    int es, bm, bn, bk, tm, tn, st, vec, pad, splitk, threads;
    size_t smem;
} cu_blk;

static void blocking(const tpk_tune_space *s, const tpk_tune_config *c, cu_blk *b)
{
    b->es = s->task.dtype == TPK_TUNE_F32 ? 4 : 8;
    b->bm = c->v[C_BM];
    b->bn = c->v[C_BN];
    b->bk = c->v[C_BK];
    b->tm = c->v[C_TM];
    b->tn = c->v[C_TN];
    b->st = c->v[C_ST];
    b->vec = c->v[C_VEC];
    b->pad = c->v[C_PAD] ? 16 / b->es : 0; /* one 16-byte vector of padding per row */
    b->splitk = c->v[C_SPLITK];
    b->threads = (b->bm / b->tm) * (b->bn / b->tn);
    b->smem = (size_t)b->st * ((size_t)b->bm * (size_t)(b->bk + b->pad) + (size_t)b->bk * (size_t)(b->bn + b->pad)) * (size_t)b->es;
}

static int cuda_valid(const tpk_tune_space *s, const tpk_tune_config *c)
{
    cu_blk b;
    blocking(s, c, &b);
    if (b.threads < 64 || b.threads > 512 || b.threads % 32)
        return 0;
    if (b.vec * b.es > 16 || b.smem > SMEM_PER_BLOCK)
        return 0;
    /* Every thread copies whole vectors of both tiles each stage. */
    if ((b.bm * b.bk) % (b.threads * b.vec) || (b.bk * b.bn) % (b.threads * b.vec))
        return 0;
    if (b.bk % b.vec)
        return 0;
    /* Registers: the accumulator tile plus operands stays under the 255-register cap. */
    if (b.tm * b.tn * (b.es / 4) + (b.tm + b.tn) * (b.es / 4) > 200)
        return 0;
    const tpk_tune_task *t = &s->task;
    if ((size_t)b.splitk * (size_t)b.bk * 2 > t->k && b.splitk > 1)
        return 0;
    return 1;
}

static int cuda_features(const tpk_tune_space *s, const tpk_tune_config *c, float *f, int cap)
{
    cu_blk b;
    blocking(s, c, &b);
    const tpk_tune_task *t = &s->task;
    double m = (double)t->m, n = (double)t->n, k = (double)t->k;
    double blocks = ceil(m / b.bm) * ceil(n / b.bn) * b.splitk;
    double regs = b.tm * b.tn * (b.es / 4.0) + (b.tm + b.tn) * (b.es / 4.0) + 24;
    double bps = fmin(fmin(floor((double)SMEM_PER_SM / fmax((double)b.smem, 1)), floor((double)THREADS_PER_SM / b.threads)),
                      floor(65536.0 / (regs * b.threads)));
    bps = fmax(bps, 0);
    double waves = bps > 0 ? blocks / (SM_COUNT * bps) : 1e3;
    double v[TPK_TUNE_MAX_FEATURES];
    int i = 0;
    v[i++] = tpk__log2(b.bm);
    v[i++] = tpk__log2(b.bn);
    v[i++] = tpk__log2(b.bk);
    v[i++] = tpk__log2(b.tm);
    v[i++] = tpk__log2(b.tn);
    v[i++] = b.st;
    v[i++] = tpk__log2(b.vec);
    v[i++] = b.pad > 0;
    v[i++] = tpk__log2(b.splitk);
    v[i++] = tpk__log2(m);
    v[i++] = tpk__log2(n);
    v[i++] = tpk__log2(k);
    v[i++] = b.es;
    v[i++] = tpk__log2(b.threads);
    v[i++] = (double)b.smem / SMEM_PER_BLOCK;
    v[i++] = regs / 255.0;
    v[i++] = bps * b.threads / THREADS_PER_SM; /* occupancy */
    v[i++] = tpk__log2(waves + 1e-9);
    v[i++] = waves > 0 ? waves / ceil(waves) : 0; /* tail: fraction of the last wave used */
    v[i++] = 2.0 * b.tm * b.tn / (b.tm + b.tn);  /* flops per shared-memory element */
    v[i++] = 2.0 * b.bm * b.bn / (b.bm + b.bn);  /* flops per global element */
    v[i++] = m * n / (ceil(m / b.bm) * b.bm * ceil(n / b.bn) * b.bn); /* edge use */
    v[i++] = k / b.splitk / b.bk;                /* k steps per block */
    int nf = i < cap ? i : cap;
    for (int j = 0; j < nf; j++)
        f[j] = (float)v[j];
    return nf;
}

static int cuda_gemm_space(tpk_tune_space *s, const tpk_tune_task *t, tpk_ctx *ctx)
{
    (void)ctx;
    static const int bm[] = {32, 64, 128, 256}, bn[] = {32, 64, 128, 256}, bk[] = {8, 16, 32};
    static const int tm[] = {2, 4, 8}, tn[] = {2, 4, 8}, st[] = {1, 2, 3, 4}, vec[] = {1, 2, 4};
    static const int pad[] = {0, 1}, sk[] = {1, 2, 4};
    s->task = *t;
    s->task.threads = 1;
    s->template_name = "cuda_gemm";
    s->nknob = C_COUNT;
    set_knob(&s->knob[C_BM], "bm", bm, 4);
    set_knob(&s->knob[C_BN], "bn", bn, 4);
    set_knob(&s->knob[C_BK], "bk", bk, 3);
    set_knob(&s->knob[C_TM], "tm", tm, 3);
    set_knob(&s->knob[C_TN], "tn", tn, 3);
    set_knob(&s->knob[C_ST], "stages", st, 4);
    set_knob(&s->knob[C_VEC], "vec", vec, 3);
    set_knob(&s->knob[C_PAD], "pad", pad, 2);
    set_knob(&s->knob[C_SPLITK], "splitk", sk, 3);
    s->valid = cuda_valid;
    s->features = cuda_features;
    return TPK_OK;
}

static void cuda_gemm_default(const tpk_tune_space *s, tpk_tune_config *c)
{
    memset(c, 0, sizeof *c);
    int f32 = s->task.dtype == TPK_TUNE_F32;
    /* 128×128 tile, 8×8 per thread (256 threads), 3 stages: the classic SGEMM shape; dgemm halves
     * the thread tile's registers with 128×64. */
    c->v[C_BM] = 128;
    c->v[C_BN] = f32 ? 128 : 64;
    c->v[C_BK] = f32 ? 16 : 8;
    c->v[C_TM] = 8;
    c->v[C_TN] = f32 ? 8 : 4;
    c->v[C_ST] = 3;
    c->v[C_VEC] = f32 ? 4 : 2;
    c->v[C_PAD] = 1;
    c->v[C_SPLITK] = 1;
    if (!tpk_tune_space_valid(s, c)) {
        c->v[C_BK] = 8;
        c->v[C_VEC] = 1;
    }
}

/* ---- emitter ------------------------------------------------------------------------------ */

/* mu: no mutation sites in the CUDA emitter yet (the mutation suite and the exact checks need a
 * device: tuner/README.md "Exact verification"). */
static int cuda_gemm_emit(const tpk_tune_space *s, const tpk_tune_config *c, const char *fn, int standalone,
                          tpk__mutation *mu, FILE *o, tpk_ctx *ctx)
{
    (void)mu;
    (void)ctx;
    cu_blk b;
    blocking(s, c, &b);
    const char *T = b.es == 4 ? "float" : "double";
    char knobs[256];
    tpk_tune_config_str(s, c, knobs, sizeof knobs);
    if (standalone)
        fprintf(o, "// Generated by tptune (tpk tuner, cuda_gemm template) - DO NOT EDIT.\n"
                   "#include <cuda_pipeline.h>\n#include <cuda_runtime.h>\n\n");
    fprintf(o, "// ---- %s: %cgemm, %s\n", fn, b.es == 4 ? 's' : 'd', knobs);
    fprintf(o, "namespace %s {\n", fn);
    fprintf(o, "typedef %s T;\n", T);
    fprintf(o, "constexpr int BM = %d, BN = %d, BK = %d, TM = %d, TN = %d, STAGES = %d, VEC = %d, PAD = %d, SPLITK = %d;\n",
            b.bm, b.bn, b.bk, b.tm, b.tn, b.st, b.vec, b.pad, b.splitk);
    fprintf(o, "constexpr int NT = (BM / TM) * (BN / TN);       // threads per block\n"
               "constexpr int LDA_S = BK + PAD, LDB_S = BN + PAD; // shared-memory row strides\n"
               "constexpr int SMEM = STAGES * (BM * LDA_S + BK * LDB_S) * (int)sizeof(T);\n\n");
    fputs(
        "// Copy the A tile (BM×BK) and B tile (BK×BN) of k-slice k0 into stage buffers As, Bs:\n"
        "// cp.async for whole aligned in-range vectors, element copies with zero fill at the edges.\n"
        "__device__ __forceinline__ void load_tile(T *As, T *Bs, const T *__restrict__ A, int lda,\n"
        "        const T *__restrict__ B, int ldb, int M, int N, int kend, int row0, int col0, int k0,\n"
        "        bool vec_ok)\n"
        "{\n"
        "    const int tid = threadIdx.x;\n"
        "#pragma unroll\n"
        "    for (int v = tid; v < BM * BK / VEC; v += NT) {\n"
        "        const int r = v / (BK / VEC), p = (v % (BK / VEC)) * VEC;\n"
        "        const int gr = row0 + r, gk = k0 + p;\n"
        "        T *dst = As + r * LDA_S + p;\n"
        "        if (STAGES > 1 && vec_ok && gr < M && gk + VEC <= kend) {\n"
        "            __pipeline_memcpy_async(dst, A + (size_t)gr * lda + gk, VEC * sizeof(T));\n"
        "        } else {\n"
        "#pragma unroll\n"
        "            for (int e = 0; e < VEC; e++)\n"
        "                dst[e] = (gr < M && gk + e < kend) ? A[(size_t)gr * lda + gk + e] : T(0);\n"
        "        }\n"
        "    }\n"
        "#pragma unroll\n"
        "    for (int v = tid; v < BK * BN / VEC; v += NT) {\n"
        "        const int p = v / (BN / VEC), j = (v % (BN / VEC)) * VEC;\n"
        "        const int gk = k0 + p, gc = col0 + j;\n"
        "        T *dst = Bs + p * LDB_S + j;\n"
        "        if (STAGES > 1 && vec_ok && gk < kend && gc + VEC <= N) {\n"
        "            __pipeline_memcpy_async(dst, B + (size_t)gk * ldb + gc, VEC * sizeof(T));\n"
        "        } else {\n"
        "#pragma unroll\n"
        "            for (int e = 0; e < VEC; e++)\n"
        "                dst[e] = (gk < kend && gc + e < N) ? B[(size_t)gk * ldb + gc + e] : T(0);\n"
        "        }\n"
        "    }\n"
        "}\n\n"
        "// C = alpha·A·B + beta·C, row-major; blockIdx.z is the split-K slice.\n"
        "__global__ void __launch_bounds__(NT) kernel(int M, int N, int K, T alpha, const T *__restrict__ A,\n"
        "        int lda, const T *__restrict__ B, int ldb, T beta, T *__restrict__ C, int ldc, bool vec_ok)\n"
        "{\n"
        "    extern __shared__ __align__(16) unsigned char smem_raw[];\n"
        "    T *As = reinterpret_cast<T *>(smem_raw), *Bs = As + STAGES * BM * LDA_S;\n"
        "    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;\n"
        "    const int kper = ((K + SPLITK - 1) / SPLITK + BK - 1) / BK * BK;\n"
        "    const int kbeg = blockIdx.z * kper, kend = min(K, kbeg + kper);\n"
        "    const int nkt = kend > kbeg ? (kend - kbeg + BK - 1) / BK : 0;\n"
        "    const int tx = threadIdx.x % (BN / TN), ty = threadIdx.x / (BN / TN);\n"
        "    T acc[TM][TN];\n"
        "#pragma unroll\n"
        "    for (int i = 0; i < TM; i++)\n"
        "#pragma unroll\n"
        "        for (int j = 0; j < TN; j++)\n"
        "            acc[i][j] = T(0);\n"
        "    // Prologue: the first STAGES-1 slices in flight.\n"
        "    for (int s = 0; s < STAGES - 1; s++) {\n"
        "        if (s < nkt)\n"
        "            load_tile(As + s * BM * LDA_S, Bs + s * BK * LDB_S, A, lda, B, ldb, M, N, kend, row0, col0,\n"
        "                      kbeg + s * BK, vec_ok);\n"
        "        __pipeline_commit();\n"
        "    }\n"
        "    for (int kt = 0; kt < nkt; kt++) {\n"
        "        const int cur = kt % STAGES;\n"
        "        if (STAGES == 1) {\n"
        "            load_tile(As, Bs, A, lda, B, ldb, M, N, kend, row0, col0, kbeg + kt * BK, vec_ok);\n"
        "            __syncthreads();\n"
        "        } else {\n"
        "            __pipeline_wait_prior(STAGES > 1 ? STAGES - 2 : 0);\n"
        "            __syncthreads(); // slice kt landed; everyone is done with slice kt-1's buffer\n"
        "            const int nxt = kt + STAGES - 1;\n"
        "            if (nxt < nkt)\n"
        "                load_tile(As + (nxt % STAGES) * BM * LDA_S, Bs + (nxt % STAGES) * BK * LDB_S, A, lda, B,\n"
        "                          ldb, M, N, kend, row0, col0, kbeg + nxt * BK, vec_ok);\n"
        "            __pipeline_commit();\n"
        "        }\n"
        "        const T *as = As + cur * BM * LDA_S + ty * TM * LDA_S, *bs = Bs + cur * BK * LDB_S + tx * TN;\n"
        "#pragma unroll\n"
        "        for (int p = 0; p < BK; p++) {\n"
        "            T a[TM], b[TN];\n"
        "#pragma unroll\n"
        "            for (int i = 0; i < TM; i++)\n"
        "                a[i] = as[i * LDA_S + p];\n"
        "#pragma unroll\n"
        "            for (int j = 0; j < TN; j++)\n"
        "                b[j] = bs[p * LDB_S + j];\n"
        "#pragma unroll\n"
        "            for (int i = 0; i < TM; i++)\n"
        "#pragma unroll\n"
        "                for (int j = 0; j < TN; j++)\n"
        "                    acc[i][j] = fma(a[i], b[j], acc[i][j]);\n"
        "        }\n"
        "        if (STAGES == 1)\n"
        "            __syncthreads();\n"
        "    }\n"
        "#pragma unroll\n"
        "    for (int i = 0; i < TM; i++) {\n"
        "        const int r = row0 + ty * TM + i;\n"
        "#pragma unroll\n"
        "        for (int j = 0; j < TN; j++) {\n"
        "            const int cc = col0 + tx * TN + j;\n"
        "            if (r < M && cc < N) {\n"
        "                T *cp = C + (size_t)r * ldc + cc;\n"
        "                if (SPLITK > 1)\n"
        "                    atomicAdd(cp, alpha * acc[i][j]); // C was scaled by beta beforehand\n"
        "                else\n"
        "                    *cp = alpha * acc[i][j] + (beta == T(0) ? T(0) : beta * *cp);\n"
        "            }\n"
        "        }\n"
        "    }\n"
        "}\n\n"
        "__global__ void scale(int M, int N, T beta, T *C, int ldc)\n"
        "{\n"
        "    const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;\n"
        "    if (i < (size_t)M * N) {\n"
        "        T *cp = C + (i / N) * ldc + i % N;\n"
        "        *cp = beta == T(0) ? T(0) : beta * *cp;\n"
        "    }\n"
        "}\n"
        "} // namespace\n\n", o);
    fprintf(o,
        "// Host launcher: grid over C tiles (× split-K slices); returns a cudaError_t.\n"
        "extern \"C\" int %s_launch(int M, int N, int K, %s alpha, const %s *A, int lda, const %s *B, int ldb,\n"
        "        %s beta, %s *C, int ldc, cudaStream_t stream)\n"
        "{\n"
        "    using namespace %s;\n"
        "    if (M <= 0 || N <= 0)\n        return 0;\n"
        "    if (SMEM > 48 * 1024) {\n"
        "        cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);\n"
        "        if (e != cudaSuccess)\n            return (int)e;\n"
        "    }\n"
        "    const bool vec_ok = lda %% VEC == 0 && ldb %% VEC == 0 &&\n"
        "        (reinterpret_cast<size_t>(A) | reinterpret_cast<size_t>(B)) %% (VEC * sizeof(T)) == 0;\n"
        "    if (SPLITK > 1 || K == 0) {\n"
        "        const size_t n = (size_t)M * N;\n"
        "        scale<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(M, N, beta, C, ldc);\n"
        "        if (K == 0)\n            return (int)cudaGetLastError();\n"
        "    }\n"
        "    dim3 grid((N + BN - 1) / BN, (M + BM - 1) / BM, SPLITK);\n"
        "    kernel<<<grid, NT, SMEM, stream>>>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, vec_ok);\n"
        "    return (int)cudaGetLastError();\n"
        "}\n\n",
        fn, T, T, T, T, T, fn);
    return TPK_OK;
}

/* The measuring / checking harness: times each listed kernel on each shape against cuBLAS and
 * prints one TPKRESULT line per (kernel, shape): err gflops cublas_gflops rel_err. */
void tpk__cuda_kernel_name(const tpk_tune_space *s, const tpk_tune_config *c, char *out, size_t cap)
{
    cu_blk b;
    blocking(s, c, &b);
    snprintf(out, cap, "tpk_cuda_%cgemm_%dx%dx%d_t%dx%d_s%d_v%d_p%d_k%d", b.es == 4 ? 's' : 'd', b.bm, b.bn, b.bk,
             b.tm, b.tn, b.st, b.vec, b.pad > 0, b.splitk);
}

void tpk__cuda_emit_harness(FILE *o, const char *const *names, const int *dtypes, int nk,
                            const size_t (*shapes)[3], int nshape, int repeat)
{
    fputs("// Generated by tptune (tpk tuner, cuda harness) - DO NOT EDIT.\n"
          "#include <cublas_v2.h>\n#include <cstdio>\n#include <cstdlib>\n#include <cmath>\n#include <vector>\n"
          "#include <algorithm>\n\n", o);
    for (int i = 0; i < nk; i++)
        fprintf(o, "extern \"C\" int %s_launch(int, int, int, %s, const %s *, int, const %s *, int, %s, %s *, int, cudaStream_t);\n",
                names[i], dtypes[i] ? "float" : "double", dtypes[i] ? "float" : "double", dtypes[i] ? "float" : "double",
                dtypes[i] ? "float" : "double", dtypes[i] ? "float" : "double");
    fputs("\ntemplate <typename T> using launch_fn = int (*)(int, int, int, T, const T *, int, const T *, int, T, T *, int, cudaStream_t);\n"
          "static double now_ms(cudaEvent_t a, cudaEvent_t b) { float ms; cudaEventElapsedTime(&ms, a, b); return ms; }\n"
          "static cublasStatus_t blas(cublasHandle_t h, int M, int N, int K, const double *A, const double *B, double *C)\n"
          "{ const double one = 1, zero = 0; // row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ\n"
          "  return cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, B, N, A, K, &zero, C, N); }\n"
          "static cublasStatus_t blas(cublasHandle_t h, int M, int N, int K, const float *A, const float *B, float *C)\n"
          "{ const float one = 1, zero = 0;\n"
          "  return cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, B, N, A, K, &zero, C, N); }\n\n"
          "template <typename T, typename F> static double time_it(int reps, cudaEvent_t e0, cudaEvent_t e1, T *C, size_t bytes,\n"
          "        void *flush, size_t flush_bytes, F &&call)\n"
          "{\n"
          "    std::vector<double> t;\n"
          "    call(); cudaDeviceSynchronize();\n"
          "    for (int r = 0; r < reps; r++) {\n"
          "        cudaMemsetAsync(flush, r, flush_bytes); // evict L2 between repeats\n"
          "        cudaEventRecord(e0); call(); cudaEventRecord(e1); cudaEventSynchronize(e1);\n"
          "        t.push_back(now_ms(e0, e1));\n"
          "    }\n"
          "    std::sort(t.begin(), t.end());\n"
          "    (void)C; (void)bytes;\n"
          "    return t[t.size() / 2];\n"
          "}\n\n"
          "template <typename T> static void run(const char *name, launch_fn<T> fn, int M, int N, int K, int reps, cublasHandle_t h,\n"
          "        void *flush, size_t flush_bytes)\n"
          "{\n"
          "    size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;\n"
          "    std::vector<T> ha(na), hb(nb);\n"
          "    unsigned long long s = 2385;\n"
          "    for (auto &x : ha) { s = s * 6364136223846793005ull + 1442695040888963407ull; x = (T)((double)(s >> 11) / 9007199254740992.0 * 2 - 1); }\n"
          "    for (auto &x : hb) { s = s * 6364136223846793005ull + 1442695040888963407ull; x = (T)((double)(s >> 11) / 9007199254740992.0 * 2 - 1); }\n"
          "    T *A, *B, *C, *R;\n"
          "    cudaMalloc(&A, na * sizeof(T)); cudaMalloc(&B, nb * sizeof(T)); cudaMalloc(&C, nc * sizeof(T)); cudaMalloc(&R, nc * sizeof(T));\n"
          "    cudaMemcpy(A, ha.data(), na * sizeof(T), cudaMemcpyHostToDevice);\n"
          "    cudaMemcpy(B, hb.data(), nb * sizeof(T), cudaMemcpyHostToDevice);\n"
          "    cudaMemset(C, 0, nc * sizeof(T));\n"
          "    int err = fn(M, N, K, (T)1, A, K, B, N, (T)0, C, N, 0);\n"
          "    if (!err) err = (int)cudaDeviceSynchronize();\n"
          "    blas(h, M, N, K, A, B, R); cudaDeviceSynchronize();\n"
          "    std::vector<T> hc(nc), hr(nc);\n"
          "    cudaMemcpy(hc.data(), C, nc * sizeof(T), cudaMemcpyDeviceToHost);\n"
          "    cudaMemcpy(hr.data(), R, nc * sizeof(T), cudaMemcpyDeviceToHost);\n"
          "    double num = 0, den = 0; // relative Frobenius error against cuBLAS\n"
          "    for (size_t i = 0; i < nc; i++) { double d = (double)hc[i] - (double)hr[i]; num += d * d; den += (double)hr[i] * hr[i]; }\n"
          "    double rel = std::sqrt(num / (den > 0 ? den : 1));\n"
          "    double tol = sizeof(T) == 8 ? 1e-12 : 1e-5;\n"
          "    if (!err && !(rel <= tol)) err = 3;\n"
          "    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);\n"
          "    double flops = 2.0 * M * N * (double)K, ours = 0, theirs = 0;\n"
          "    if (!err) ours = flops / time_it<T>(reps, e0, e1, C, nc, flush, flush_bytes, [&] { fn(M, N, K, (T)1, A, K, B, N, (T)0, C, N, 0); }) * 1e-6;\n"
          "    theirs = flops / time_it<T>(reps, e0, e1, R, nc, flush, flush_bytes, [&] { blas(h, M, N, K, A, B, R); }) * 1e-6;\n"
          "    printf(\"TPKRESULT %d %.3f %.3f %.3e %s %d %d %d\\n\", err, ours, theirs, rel, name, M, N, K);\n"
          "    fflush(stdout);\n"
          "    cudaEventDestroy(e0); cudaEventDestroy(e1);\n"
          "    cudaFree(A); cudaFree(B); cudaFree(C); cudaFree(R);\n"
          "}\n\n"
          "int main()\n{\n"
          "    int ndev = 0;\n"
          "    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) { printf(\"TPKNODEV\\n\"); return 5; }\n"
          "    cublasHandle_t h; cublasCreate(&h);\n"
          "    size_t flush_bytes = 256u << 20; void *flush; cudaMalloc(&flush, flush_bytes);\n", o);
    for (int sh = 0; sh < nshape; sh++)
        for (int i = 0; i < nk; i++)
            fprintf(o, "    run<%s>(\"%s\", %s_launch, %zu, %zu, %zu, %d, h, flush, flush_bytes);\n",
                    dtypes[i] ? "float" : "double", names[i], names[i], shapes[sh][0], shapes[sh][1], shapes[sh][2],
                    repeat);
    fputs("    cudaFree(flush); cublasDestroy(h);\n    return 0;\n}\n", o);
}

const char *tpk_tune_nvcc(char *buf, size_t cap)
{
    const char *e = getenv("NVCC");
    if (e && *e) { /* named: that one or none, so a wrong $NVCC is not silently replaced */
        snprintf(buf, cap, "%s", e);
        return access(buf, X_OK) == 0 ? buf : NULL;
    }
    const char *path = getenv("PATH");
    while (path && *path) {
        size_t len = strcspn(path, ":");
        if (len > 0 && (size_t)snprintf(buf, cap, "%.*s/nvcc", (int)len, path) < cap && access(buf, X_OK) == 0)
            return buf;
        path += len + (path[len] == ':');
    }
    snprintf(buf, cap, "/usr/local/cuda/bin/nvcc"); /* the toolkit's default prefix, often not on PATH */
    return access(buf, X_OK) == 0 ? buf : NULL;
}

/* One configuration on one shape: emit kernel + harness, nvcc, run, parse. */
int tpk__cuda_measure(const tpk_tune_space *s, const tpk_tune_config *c, const tpk_tune_measure_opts *o,
                      tpk_tune_result *res, tpk_ctx *ctx)
{
    char nvcc[512];
    if (!tpk_tune_nvcc(nvcc, sizeof nvcc) || access("/dev/nvidiactl", F_OK) != 0) {
        res->err = TPK_TUNE_ENODEV;
        return TPK_OK;
    }
    const char *tmp = o->workdir ? o->workdir : getenv("TMPDIR");
    char dir[512], src[600], bin[600], cmd[2048];
    snprintf(dir, sizeof dir, "%s/tptune-cuda.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir))
        return TPK_ERROR(ctx, TPK_EIO, "tune: cannot create a scratch directory");
    snprintf(src, sizeof src, "%s/k.cu", dir);
    snprintf(bin, sizeof bin, "%s/k", dir);
    FILE *f = fopen(src, "w");
    if (!f)
        return TPK_ERROR(ctx, TPK_EIO, "tune: cannot write %s", src);
    int st = cuda_gemm_emit(s, c, "cand", 1, NULL, f, ctx);
    const char *name = "cand";
    int dt = s->task.dtype;
    size_t shape[1][3] = {{s->task.m, s->task.n, s->task.k}};
    tpk__cuda_emit_harness(f, &name, &dt, 1, (const size_t(*)[3])shape, 1, o->repeat > 0 ? o->repeat : 5);
    fclose(f);
    if (st)
        return st;
    double t0 = tpk_wall_seconds();
    snprintf(cmd, sizeof cmd, "'%s' -O3 -std=c++17 -arch=sm_90 -o '%s' '%s' -lcublas >/dev/null 2>&1", nvcc, bin, src);
    if (system(cmd) != 0) {
        res->err = TPK_TUNE_ECOMPILE;
        return TPK_OK;
    }
    res->compile_s = tpk_wall_seconds() - t0;
    snprintf(cmd, sizeof cmd, "timeout %d '%s'", (int)(o->timeout_s > 0 ? o->timeout_s : 60), bin);
    FILE *p = popen(cmd, "r");
    char line[512];
    res->err = TPK_TUNE_ECRASH;
    while (p && fgets(line, sizeof line, p)) {
        int err;
        double ours, theirs, rel;
        if (sscanf(line, "TPKRESULT %d %lf %lf %lf", &err, &ours, &theirs, &rel) == 4) {
            res->err = err;
            res->gflops = err ? 0 : ours;
            res->max_rel_err = rel;
            res->ncost = 1;
            res->costs_s[0] = ours > 0 ? tpk_tune_task_flops(&s->task) / (ours * 1e9) : 0;
            res->vendor_gflops = theirs;
        } else if (strstr(line, "TPKNODEV"))
            res->err = TPK_TUNE_ENODEV;
    }
    if (p)
        pclose(p);
    if (!o->keep) {
        unlink(src);
        unlink(bin);
        rmdir(dir);
    }
    return TPK_OK;
}

/* ---- the template (space.c lists it) ----------------------------------------------------- */

/* Serves GEMM on CUDA devices. */
static int cuda_gemm_applicable(const tpk_tune_task *t)
{
    return t->target == TPK_TUNE_CUDA && t->op == TPK_TUNE_GEMM;
}

const tpk__template tpk__template_cuda_gemm = {"cuda_gemm", cuda_gemm_applicable, cuda_gemm_space, cuda_gemm_default, cuda_gemm_emit};
