// A program of two translation units built with relocatable device code
// (nvcc -rdc=true rdc_main.cu rdc_lib.cu): the kernel here calls a device function and reads a
// device variable defined in the other unit, so its PTX can only run once the two are linked.
// Prints the launch's error name ("LAUNCH <name>") and, when it ran, whether the result is
// right ("RESULT ok|wrong") and the variable as the host reads it ("BIAS <n>").
#include <cstdio>
#include <cuda_runtime.h>

extern __device__ int scale(int x);
extern __device__ int bias;

__global__ void apply(int *v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = scale(v[i]) + bias;
}

int main() {
  const int n = 256;
  int h[n], *d = nullptr;
  for (int i = 0; i < n; i++) h[i] = i;
  if (cudaMalloc(&d, sizeof h) != cudaSuccess) return 2;
  cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
  apply<<<(n + 127) / 128, 128>>>(d, n);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  printf("LAUNCH %s\n", cudaGetErrorName(e));
  if (e == cudaSuccess) {
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    bool ok = true;
    for (int i = 0; i < n; i++) ok = ok && h[i] == 3 * i + 1 + 5;
    printf("RESULT %s\n", ok ? "ok" : "wrong");
    int b = 0;
    cudaError_t s = cudaMemcpyFromSymbol(&b, bias, sizeof b);
    printf("BIAS %d %s\n", b, cudaGetErrorName(s));
  }
  return 0;
}
