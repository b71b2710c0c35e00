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
 *                  Prints "gemm outcome=computed" or "gemm outcome=error ..." */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
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

enum { N = 8 };

static void check_gemm(void) {
  float ha[N * N], hb[N * N], hc[N * N], want[N * N];
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
  CK(cudaMalloc((void **)&a, sizeof ha));
  CK(cudaMalloc((void **)&b, sizeof hb));
  CK(cudaMalloc((void **)&c, sizeof hc));
  CK(cudaMemcpy(a, ha, sizeof ha, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(b, hb, sizeof hb, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(c, hc, sizeof hc, cudaMemcpyHostToDevice));

  cublasHandle_t h = NULL;
  CB(cublasCreate(&h));
  const float alpha = 1.0f, beta = 0.0f;
  cublasStatus_t st = cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, N, N, N, &alpha, a, N, b, N,
                                  &beta, c, N);
  cudaError_t sync = cudaDeviceSynchronize();
  printf("gemm status=%d (%s) sync=%d (%s)\n", (int)st, cublasGetStatusName(st), (int)sync,
         cudaGetErrorName(sync));
  if (st == CUBLAS_STATUS_SUCCESS && sync == cudaSuccess) {
    CK(cudaMemcpy(hc, c, sizeof hc, cudaMemcpyDeviceToHost));
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
