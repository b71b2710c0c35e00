/* cublas_handles: cuBLAS and cuBLASLt 12.9 (from PyPI) above whatever libcuda.so.1 the loader
 * finds. Host code only, built with gcc against libcudart 12.9 and libcublas 12.
 * Usage: cublas_handles [CHECK...]   (no argument: versions create_status)
 * Prints "PASS <check>" per check; exits 1 with "FAIL ..." on stderr on the first mismatch.
 *
 *   versions       library versions, no handle (no driver call beyond cudart's init)
 *   create_status  cublasCreate and cublasLtCreate; prints their statuses and destroys what was
 *                  created. Passes on success or a clean CUBLAS_STATUS_NOT_INITIALIZED
 *   handles        cublasCreate, versions, pointer mode, cublasSetStream/GetStream, cublasDestroy
 *   lt_handles     cublasLtCreate, matmul descriptor and layout, cublasLtDestroy
 *   gemm           an 8x8 SGEMM. cuBLAS ships its kernels mostly as SASS, which an emulated GPU
 *                  that runs PTX cannot execute: a correct result or a clean, named error (a
 *                  cuBLAS status or a CUDA error) passes; a crash or a wrong result fails.
 *                  Prints "gemm outcome=computed" or "gemm outcome=error ..."
 *   gemm128        the same for a 128x128 SGEMM
 * The checks below must compute, checked against a CPU reference; they need a device whose
 * architecture cuBLAS ships PTX for (compute_120: `--devices emu:1:16GiB:sm_120`):
 *   sgemm_ref      cublasSgemm over several shapes, A plain and transposed, alpha and beta
 *   dgemm_ref      cublasDgemm, the same shapes in double precision
 *   gemmex_f16     cublasGemmEx, f16 A and B, f32 C, f32 compute
 *   gemmex_bf16    cublasGemmEx, bf16 A and B, f32 C, f32 compute
 *   lt_matmul      cublasLtMatmul, f32, the heuristic's first algorithm and a workspace */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(call)                                                                        \
  do {                                                                                  \
    cudaError_t ck_err_ = (call);                                                       \
    if (ck_err_ != cudaSuccess) {                                                       \
      fprintf(stderr, "FAIL %s:%d: %s returned %d (%s)\n", __FILE__, __LINE__, #call,   \
              (int)ck_err_, cudaGetErrorName(ck_err_));                                  \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

#define CB(call)                                                                        \
  do {                                                                                  \
    cublasStatus_t cb_st_ = (call);                                                     \
    if (cb_st_ != CUBLAS_STATUS_SUCCESS) {                                              \
      fprintf(stderr, "FAIL %s:%d: %s returned %d (%s)\n", __FILE__, __LINE__, #call,   \
              (int)cb_st_, cublasGetStatusName(cb_st_));                                 \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

#define EXPECT(cond, ...)                                                               \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      fprintf(stderr, "FAIL %s:%d: expected %s: ", __FILE__, __LINE__, #cond);          \
      fprintf(stderr, __VA_ARGS__);                                                     \
      fputc('\n', stderr);                                                              \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

static void check_versions(void) {
  int major = -1, minor = -1, patch = -1;
  CB(cublasGetProperty(MAJOR_VERSION, &major));
  CB(cublasGetProperty(MINOR_VERSION, &minor));
  CB(cublasGetProperty(PATCH_LEVEL, &patch));
  printf("cublas_property=%d.%d.%d\n", major, minor, patch);
  EXPECT(major == CUBLAS_VER_MAJOR && minor == CUBLAS_VER_MINOR, "cuBLAS %d.%d for headers %d.%d",
         major, minor, CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR);
  size_t lt = cublasLtGetVersion();
  printf("cublaslt_version=%zu\n", lt);
  EXPECT(lt / 10000 == CUBLAS_VER_MAJOR, "cuBLASLt version %zu", lt);
}

static void check_create_status(void) {
  cublasHandle_t h = NULL;
  cublasStatus_t st = cublasCreate(&h);
  printf("create=%d (%s)\n", (int)st, cublasGetStatusName(st));
  EXPECT(st == CUBLAS_STATUS_SUCCESS || st == CUBLAS_STATUS_NOT_INITIALIZED,
         "cublasCreate: success or a clean NOT_INITIALIZED, got %d", (int)st);
  if (st == CUBLAS_STATUS_SUCCESS) CB(cublasDestroy(h));

  cublasLtHandle_t lt = NULL;
  st = cublasLtCreate(&lt);
  printf("lt_create=%d (%s)\n", (int)st, cublasLtGetStatusName(st));
  EXPECT(st == CUBLAS_STATUS_SUCCESS || st == CUBLAS_STATUS_NOT_INITIALIZED,
         "cublasLtCreate: success or a clean NOT_INITIALIZED, got %d", (int)st);
  if (st == CUBLAS_STATUS_SUCCESS) CB(cublasLtDestroy(lt));

  /* The runtime still works after a failed create. */
  void *p = NULL;
  CK(cudaMalloc(&p, 4096));
  CK(cudaMemset(p, 0, 4096));
  CK(cudaFree(p));
  CK(cudaDeviceSynchronize());
}

static void check_handles(void) {
  cublasHandle_t h = NULL;
  CB(cublasCreate(&h));
  EXPECT(h != NULL, "a handle from cublasCreate");

  int version = 0;
  CB(cublasGetVersion(h, &version));
  printf("cublas_version=%d\n", version);
  EXPECT(version / 10000 == CUBLAS_VER_MAJOR, "cuBLAS version %d for headers %d.%d", version,
         CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR);

  int prop = -1;
  CB(cublasGetProperty(MAJOR_VERSION, &prop));
  EXPECT(prop == CUBLAS_VER_MAJOR, "major version property %d", prop);

  cudaStream_t s = NULL, got = NULL;
  CK(cudaStreamCreate(&s));
  CB(cublasSetStream(h, s));
  CB(cublasGetStream(h, &got));
  EXPECT(got == s, "cublasGetStream %p after cublasSetStream %p", (void *)got, (void *)s);
  CB(cublasSetStream(h, NULL));
  CB(cublasGetStream(h, &got));
  EXPECT(got == NULL, "the default stream back, got %p", (void *)got);

  cublasPointerMode_t mode = CUBLAS_POINTER_MODE_DEVICE;
  CB(cublasGetPointerMode(h, &mode));
  EXPECT(mode == CUBLAS_POINTER_MODE_HOST, "pointer mode %d", (int)mode);
  CB(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));

  CB(cublasDestroy(h));
  CK(cudaStreamDestroy(s));

  /* A second handle in the same process, on a stream of its own from the start. */
  CK(cudaStreamCreate(&s));
  CB(cublasCreate(&h));
  CB(cublasSetStream(h, s));
  CB(cublasDestroy(h));
  CK(cudaStreamDestroy(s));
  CK(cudaDeviceSynchronize());
}

static void check_lt_handles(void) {
  size_t version = cublasLtGetVersion();
  size_t cudart = cublasLtGetCudartVersion();
  printf("cublaslt_version=%zu\ncublaslt_cudart=%zu\n", version, cudart);
  EXPECT(version / 10000 == CUBLAS_VER_MAJOR, "cuBLASLt version %zu", version);
  EXPECT(cudart / 1000 == CUBLAS_VER_MAJOR, "cuBLASLt cudart version %zu", cudart);

  cublasLtHandle_t lt = NULL;
  CB(cublasLtCreate(&lt));
  EXPECT(lt != NULL, "a handle from cublasLtCreate");

  cublasLtMatmulDesc_t desc = NULL;
  CB(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasLtMatrixLayout_t layout = NULL;
  CB(cublasLtMatrixLayoutCreate(&layout, CUDA_R_32F, 4, 4, 4));
  CB(cublasLtMatrixLayoutDestroy(layout));
  CB(cublasLtMatmulDescDestroy(desc));

  CB(cublasLtDestroy(lt));
  CK(cudaDeviceSynchronize());
}

static void gemm_square(int N) {
  size_t bytes = sizeof(float) * N * N;
  float *ha = malloc(bytes), *hb = malloc(bytes), *hc = malloc(bytes), *want = malloc(bytes);
  EXPECT(ha && hb && hc && want, "host memory");
  for (int i = 0; i < N * N; i++) {
    ha[i] = (float)(i % 7) - 3.0f;
    hb[i] = (float)(i % 5) * 0.5f;
    hc[i] = -1.0f;
  }
  /* Column-major C = A * B. */
  for (int col = 0; col < N; col++)
    for (int row = 0; row < N; row++) {
      float acc = 0.0f;
      for (int k = 0; k < N; k++) acc += ha[k * N + row] * hb[col * N + k];
      want[col * N + row] = acc;
    }

  float *a = NULL, *b = NULL, *c = NULL;
  CK(cudaMalloc((void **)&a, bytes));
  CK(cudaMalloc((void **)&b, bytes));
  CK(cudaMalloc((void **)&c, bytes));
  CK(cudaMemcpy(a, ha, bytes, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(b, hb, bytes, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(c, hc, bytes, cudaMemcpyHostToDevice));

  cublasHandle_t h = NULL;
  CB(cublasCreate(&h));
  const float alpha = 1.0f, beta = 0.0f;
  cublasStatus_t st = cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, N, N, N, &alpha, a, N, b, N,
                                  &beta, c, N);
  cudaError_t sync = cudaDeviceSynchronize();
  printf("gemm status=%d (%s) sync=%d (%s)\n", (int)st, cublasGetStatusName(st), (int)sync,
         cudaGetErrorName(sync));
  if (st == CUBLAS_STATUS_SUCCESS && sync == cudaSuccess) {
    CK(cudaMemcpy(hc, c, bytes, cudaMemcpyDeviceToHost));
    for (int i = 0; i < N * N; i++)
      EXPECT(fabsf(hc[i] - want[i]) < 1e-3f, "C[%d] = %g, want %g", i, hc[i], want[i]);
    printf("gemm outcome=computed\n");
  } else {
    /* A clean failure: the error is named, and the process is still alive to say so. */
    EXPECT(st != CUBLAS_STATUS_SUCCESS || sync != cudaSuccess, "an error");
    printf("gemm outcome=error cublas=%s cuda=%s\n", cublasGetStatusName(st),
           cudaGetErrorName(sync));
  }
  /* Teardown still answers (errors are tolerated after a failed launch). */
  cublasStatus_t d = cublasDestroy(h);
  printf("gemm destroy=%d\n", (int)d);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  free(ha), free(hb), free(hc), free(want);
}

static void check_gemm(void) { gemm_square(8); }
static void check_gemm128(void) { gemm_square(128); }

/* ---- GEMMs checked against a CPU reference ------------------------------------------------
 * cuBLAS picks a kernel per shape. On the emulated GPU only kernels that cuBLAS ships as PTX
 * run (for compute_120: its small-n, k = 1 and GEMV-style kernels); the shapes below are ones
 * it routes to those on an sm_120 device. Shapes whose kernel exists only as SASS fail cleanly
 * with cudaErrorNoKernelImageForDevice (the `gemm` check above). */

struct shape {
  int m, n, k;
  cublasOperation_t ta;
};

/* Values exact in f16 and bf16 (small multiples of 1/4), so every precision computes the same
 * products and only accumulation order differs. */
static float ref_value(int i, int salt) { return (float)((i * 7 + salt * 3) % 9 - 4) * 0.25f; }

static uint16_t f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  int exp = (int)((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffffu;
  if ((x & 0x7fffffffu) == 0) return (uint16_t)sign;
  if (exp <= 0 || exp >= 31) {
    fprintf(stderr, "FAIL: %g does not fit a normal f16\n", f);
    exit(1);
  }
  return (uint16_t)(sign | ((uint32_t)exp << 10) | (mant >> 13));
}

static uint16_t f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  return (uint16_t)(x >> 16); /* exact for the values above */
}

/* Column-major C (m x n, ldc = m) = alpha * op(A) * B + beta * C; A is m x k (lda = m), or
 * k x m (lda = k) when transposed; B is k x n (ldb = k). */
static void reference(struct shape s, const float *a, const float *b, float *c, float alpha,
                      float beta) {
  for (int col = 0; col < s.n; col++)
    for (int row = 0; row < s.m; row++) {
      double acc = 0.0;
      for (int k = 0; k < s.k; k++) {
        float av = s.ta == CUBLAS_OP_T ? a[row * s.k + k] : a[k * s.m + row];
        acc += (double)av * b[col * s.k + k];
      }
      c[col * s.m + row] = (float)(alpha * acc + beta * c[col * s.m + row]);
    }
}

struct operands {
  float *a, *b, *c, *want;
};

static struct operands operands(struct shape s, float alpha, float beta) {
  struct operands o = {malloc(sizeof(float) * s.m * s.k), malloc(sizeof(float) * s.k * s.n),
                       malloc(sizeof(float) * s.m * s.n), malloc(sizeof(float) * s.m * s.n)};
  EXPECT(o.a && o.b && o.c && o.want, "host memory");
  for (int i = 0; i < s.m * s.k; i++) o.a[i] = ref_value(i, 1);
  for (int i = 0; i < s.k * s.n; i++) o.b[i] = ref_value(i, 2);
  for (int i = 0; i < s.m * s.n; i++) o.c[i] = o.want[i] = ref_value(i, 3);
  reference(s, o.a, o.b, o.want, alpha, beta);
  return o;
}

static void free_operands(struct operands o) {
  free(o.a), free(o.b), free(o.c), free(o.want);
}

static void expect_close(const char *what, struct shape s, const float *got, const float *want,
                         float tol) {
  int n = s.m * s.n;
  for (int i = 0; i < n; i++)
    EXPECT(fabsf(got[i] - want[i]) <= tol * (1.0f + fabsf(want[i])),
           "%s %dx%dx%d%s C[%d] = %g, want %g", what, s.m, s.n, s.k,
           s.ta == CUBLAS_OP_T ? "T" : "N", i, got[i], want[i]);
  printf("%s %dx%dx%d%s checked=%d\n", what, s.m, s.n, s.k, s.ta == CUBLAS_OP_T ? "T" : "N", n);
}

static void *to_device(const void *host, size_t bytes) {
  void *d = NULL;
  CK(cudaMalloc(&d, bytes));
  CK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
  return d;
}

static int lda_of(struct shape s) { return s.ta == CUBLAS_OP_T ? s.k : s.m; }

/* Small-n, k = 1 and GEMV-like shapes (kernels cuBLAS ships as PTX on every model that loads
 * its compute_120 PTX), then square and odd shapes (cutlass kernels cuBLAS ships as SASS only
 * for the architectures it knows: they run on the future model, sm_130, where cuBLAS takes its
 * PTX kernels throughout). */
static const struct shape real_shapes[] = {
    {64, 4, 64, CUBLAS_OP_N},    {64, 4, 64, CUBLAS_OP_T},       {256, 8, 64, CUBLAS_OP_T},
    {16, 16, 16, CUBLAS_OP_N},   {64, 64, 1, CUBLAS_OP_N},       {32, 32, 32, CUBLAS_OP_N},
    {128, 128, 128, CUBLAS_OP_N}, {256, 256, 256, CUBLAS_OP_T},  {37, 23, 29, CUBLAS_OP_N},
    {8, 256, 64, CUBLAS_OP_N},   {4, 64, 64, CUBLAS_OP_T},
};
enum { NREAL = sizeof real_shapes / sizeof real_shapes[0] };

static void check_sgemm_ref(void) {
  cublasHandle_t h = NULL;
  CB(cublasCreate(&h));
  for (int i = 0; i < NREAL; i++) {
    struct shape s = real_shapes[i];
    const float alpha = 1.5f, beta = -0.5f;
    struct operands o = operands(s, alpha, beta);
    float *da = to_device(o.a, sizeof(float) * s.m * s.k);
    float *db = to_device(o.b, sizeof(float) * s.k * s.n);
    float *dc = to_device(o.c, sizeof(float) * s.m * s.n);
    CB(cublasSgemm(h, s.ta, CUBLAS_OP_N, s.m, s.n, s.k, &alpha, da, lda_of(s), db, s.k, &beta, dc,
                   s.m));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(o.c, dc, sizeof(float) * s.m * s.n, cudaMemcpyDeviceToHost));
    expect_close("sgemm", s, o.c, o.want, 1e-5f);
    cudaFree(da), cudaFree(db), cudaFree(dc);
    free_operands(o);
  }
  CB(cublasDestroy(h));
}

static void check_dgemm_ref(void) {
  cublasHandle_t h = NULL;
  CB(cublasCreate(&h));
  for (int i = 0; i < NREAL; i++) {
    struct shape s = real_shapes[i];
    struct operands o = operands(s, 2.0f, 0.25f);
    size_t na = (size_t)s.m * s.k, nb = (size_t)s.k * s.n, nc = (size_t)s.m * s.n;
    double *ha = malloc(8 * na), *hb = malloc(8 * nb), *hc = malloc(8 * nc);
    EXPECT(ha && hb && hc, "host memory");
    for (size_t j = 0; j < na; j++) ha[j] = o.a[j];
    for (size_t j = 0; j < nb; j++) hb[j] = o.b[j];
    for (size_t j = 0; j < nc; j++) hc[j] = o.c[j];
    double *da = to_device(ha, 8 * na), *db = to_device(hb, 8 * nb), *dc = to_device(hc, 8 * nc);
    const double alpha = 2.0, beta = 0.25;
    CB(cublasDgemm(h, s.ta, CUBLAS_OP_N, s.m, s.n, s.k, &alpha, da, lda_of(s), db, s.k, &beta, dc,
                   s.m));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(hc, dc, 8 * nc, cudaMemcpyDeviceToHost));
    for (size_t j = 0; j < nc; j++) o.c[j] = (float)hc[j];
    expect_close("dgemm", s, o.c, o.want, 1e-6f);
    cudaFree(da), cudaFree(db), cudaFree(dc);
    free(ha), free(hb), free(hc);
    free_operands(o);
  }
  CB(cublasDestroy(h));
}

/* cuBLAS's f16/bf16 GEMMs: k = 1 and single-column products, then square and odd shapes. */
static const struct shape half_shapes[] = {
    {64, 64, 1, CUBLAS_OP_N},  {64, 64, 1, CUBLAS_OP_T},      {1024, 1, 64, CUBLAS_OP_N},
    {64, 64, 64, CUBLAS_OP_N}, {128, 128, 128, CUBLAS_OP_T}, {37, 23, 29, CUBLAS_OP_N}};
enum { NHALF = sizeof half_shapes / sizeof half_shapes[0] };

static void gemmex(const char *what, cudaDataType_t type, uint16_t (*conv)(float)) {
  cublasHandle_t h = NULL;
  CB(cublasCreate(&h));
  for (int i = 0; i < NHALF; i++) {
    struct shape s = half_shapes[i];
    const float alpha = 1.0f, beta = 1.0f;
    struct operands o = operands(s, alpha, beta);
    size_t na = (size_t)s.m * s.k, nb = (size_t)s.k * s.n;
    uint16_t *ha = malloc(2 * na), *hb = malloc(2 * nb);
    EXPECT(ha && hb, "host memory");
    for (size_t j = 0; j < na; j++) ha[j] = conv(o.a[j]);
    for (size_t j = 0; j < nb; j++) hb[j] = conv(o.b[j]);
    void *da = to_device(ha, 2 * na), *db = to_device(hb, 2 * nb);
    float *dc = to_device(o.c, sizeof(float) * s.m * s.n);
    CB(cublasGemmEx(h, s.ta, CUBLAS_OP_N, s.m, s.n, s.k, &alpha, da, type, lda_of(s), db, type,
                    s.k, &beta, dc, CUDA_R_32F, s.m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(o.c, dc, sizeof(float) * s.m * s.n, cudaMemcpyDeviceToHost));
    expect_close(what, s, o.c, o.want, 1e-5f);
    cudaFree(da), cudaFree(db), cudaFree(dc);
    free(ha), free(hb);
    free_operands(o);
  }
  CB(cublasDestroy(h));
}

static void check_gemmex_f16(void) { gemmex("gemmex_f16", CUDA_R_16F, f32_to_f16); }
static void check_gemmex_bf16(void) { gemmex("gemmex_bf16", CUDA_R_16BF, f32_to_bf16); }

static void check_lt_matmul(void) {
  cublasLtHandle_t lt = NULL;
  CB(cublasLtCreate(&lt));
  size_t ws_size = 4 << 20;
  void *ws = NULL;
  CK(cudaMalloc(&ws, ws_size));
  for (int i = 0; i < NREAL; i++) {
    struct shape s = real_shapes[i];
    const float alpha = 0.5f, beta = 2.0f;
    struct operands o = operands(s, alpha, beta);
    float *da = to_device(o.a, sizeof(float) * s.m * s.k);
    float *db = to_device(o.b, sizeof(float) * s.k * s.n);
    float *dc = to_device(o.c, sizeof(float) * s.m * s.n);
    cublasLtMatmulDesc_t op = NULL;
    CB(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &s.ta, sizeof s.ta));
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    int trans = s.ta == CUBLAS_OP_T;
    CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, trans ? s.k : s.m, trans ? s.m : s.k,
                                  lda_of(s)));
    CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, s.k, s.n, s.k));
    CB(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, s.m, s.n, s.m));
    cublasLtMatmulPreference_t pref = NULL;
    CB(cublasLtMatmulPreferenceCreate(&pref));
    CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                            &ws_size, sizeof ws_size));
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    CB(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &heur, &found));
    EXPECT(found >= 1, "a heuristic algorithm, found %d", found);
    CB(cublasLtMatmul(lt, op, &alpha, da, la, db, lb, &beta, dc, lc, dc, lc, &heur.algo, ws,
                      ws_size, 0));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(o.c, dc, sizeof(float) * s.m * s.n, cudaMemcpyDeviceToHost));
    expect_close("lt_matmul", s, o.c, o.want, 1e-5f);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(op);
    cudaFree(da), cudaFree(db), cudaFree(dc);
    free_operands(o);
  }
  CB(cublasLtDestroy(lt));
  cudaFree(ws);
}

struct check {
  const char *name;
  void (*run)(void);
};

static const struct check checks[] = {
    {"versions", check_versions},
    {"create_status", check_create_status},
    {"handles", check_handles},
    {"lt_handles", check_lt_handles},
    {"gemm", check_gemm},
    {"gemm128", check_gemm128},
    {"sgemm_ref", check_sgemm_ref},
    {"dgemm_ref", check_dgemm_ref},
    {"gemmex_f16", check_gemmex_f16},
    {"gemmex_bf16", check_gemmex_bf16},
    {"lt_matmul", check_lt_matmul},
};

static const char *const default_checks[] = {"versions", "create_status"};

int main(int argc, char **argv) {
  size_t n = sizeof checks / sizeof checks[0];
  int count = 0;
  CK(cudaGetDeviceCount(&count));
  EXPECT(count >= 1, "device count %d", count);
  int wanted = argc < 2 ? 2 : argc - 1;
  for (int a = 0; a < wanted; a++) {
    const char *want = argc < 2 ? default_checks[a] : argv[a + 1];
    size_t i = 0;
    while (i < n && strcmp(checks[i].name, want) != 0) i++;
    if (i == n) {
      fprintf(stderr, "FAIL: unknown check %s\n", want);
      return 2;
    }
    checks[i].run();
    printf("PASS %s\n", checks[i].name);
    fflush(stdout);
  }
  return 0;
}
