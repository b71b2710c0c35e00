// Vector add launched three ways: <<<>>>, cudaLaunchKernel (void** args) and cudaLaunchKernelEx.
#include <vector>
#include "kcheck.h"

__global__ void vadd(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

static void check(const std::vector<float>& a, const std::vector<float>& b, const float* dc,
                  int n, const char* how) {
  std::vector<float> c(n);
  CK(cudaMemcpy(c.data(), dc, n * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; i++)
    EXPECT_RESULT(c[i] == a[i] + b[i], "%s: c[%d] = %f, want %f", how, i, c[i], a[i] + b[i]);
}

int main(int argc, char** argv) {
  parse_args(argc, argv);
  const int n = (1 << 20) + 3;
  std::vector<float> a(n), b(n);
  for (int i = 0; i < n; i++) {
    a[i] = (float)(i % 1000) * 0.5f;
    b[i] = (float)(i % 77) - 10.0f;
  }
  float *da, *db, *dc;
  CK(cudaMalloc(&da, n * sizeof(float)));
  CK(cudaMalloc(&db, n * sizeof(float)));
  CK(cudaMalloc(&dc, n * sizeof(float)));
  CK(cudaMemcpy(da, a.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(db, b.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  const int block = 256, grid = (n + block - 1) / block;

  CK(cudaMemset(dc, 0xFF, n * sizeof(float)));
  vadd<<<grid, block>>>(da, db, dc, n);
  CK_LAUNCH("vadd <<<>>>");
  check(a, b, dc, n, "<<<>>>");

  CK(cudaMemset(dc, 0xFF, n * sizeof(float)));
  int nn = n;
  void* args[] = {&da, &db, &dc, &nn};
  CK(cudaLaunchKernel((const void*)vadd, dim3(grid), dim3(block), args, 0, nullptr));
  CK_LAUNCH("vadd cudaLaunchKernel");
  check(a, b, dc, n, "cudaLaunchKernel");

  CK(cudaMemset(dc, 0xFF, n * sizeof(float)));
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(block);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = s;
  cfg.attrs = nullptr;
  cfg.numAttrs = 0;
  CK(cudaLaunchKernelEx(&cfg, vadd, (const float*)da, (const float*)db, dc, n));
  CK(cudaStreamSynchronize(s));
  CK_LAUNCH("vadd cudaLaunchKernelEx");
  check(a, b, dc, n, "cudaLaunchKernelEx");

  CK(cudaStreamDestroy(s));
  CK(cudaFree(da));
  CK(cudaFree(db));
  CK(cudaFree(dc));
  return finish("vector_add");
}
