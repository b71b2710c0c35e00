// SAXPY in float and DAXPY in double, on a non-default stream, grid not a multiple of the block.
#include <vector>
#include "kcheck.h"

__global__ void saxpy(int n, float a, const float* x, float* y) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
    y[i] = a * x[i] + y[i];
}

__global__ void daxpy(int n, double a, const double* x, double* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

int main(int argc, char** argv) {
  parse_args(argc, argv);
  const int n = 1000003;
  std::vector<float> x(n), y(n), out(n);
  std::vector<double> xd(n), yd(n), outd(n);
  for (int i = 0; i < n; i++) {
    x[i] = (float)(i % 100);
    y[i] = (float)(i % 7);
    xd[i] = i * 0.25;
    yd[i] = -(double)i;
  }
  float *dx, *dy;
  double *dxd, *dyd;
  CK(cudaMalloc(&dx, n * sizeof(float)));
  CK(cudaMalloc(&dy, n * sizeof(float)));
  CK(cudaMalloc(&dxd, n * sizeof(double)));
  CK(cudaMalloc(&dyd, n * sizeof(double)));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaMemcpyAsync(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(dy, y.data(), n * sizeof(float), cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(dxd, xd.data(), n * sizeof(double), cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(dyd, yd.data(), n * sizeof(double), cudaMemcpyHostToDevice, s));

  saxpy<<<120, 256, 0, s>>>(n, 2.0f, dx, dy);  // grid-stride loop: fewer threads than elements
  CK(cudaStreamSynchronize(s));
  CK_LAUNCH("saxpy");
  daxpy<<<(n + 127) / 128, 128, 0, s>>>(n, 3.0, dxd, dyd);
  CK(cudaStreamSynchronize(s));
  CK_LAUNCH("daxpy");

  CK(cudaMemcpyAsync(out.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost, s));
  CK(cudaMemcpyAsync(outd.data(), dyd, n * sizeof(double), cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  for (int i = 0; i < n; i++) {
    float want = 2.0f * x[i] + y[i];
    EXPECT_RESULT(out[i] == want, "saxpy y[%d] = %f, want %f", i, out[i], want);
    double wantd = 3.0 * xd[i] + yd[i];
    EXPECT_RESULT(outd[i] == wantd, "daxpy y[%d] = %f, want %f", i, outd[i], wantd);
  }
  CK(cudaStreamDestroy(s));
  CK(cudaFree(dx));
  CK(cudaFree(dy));
  CK(cudaFree(dxd));
  CK(cudaFree(dyd));
  return finish("saxpy");
}
