// Device-side printf: its output reaches the program's stdout at the next synchronizing call,
// in order with the program's own (buffered) printf output. test_kernels_nvcc.py checks the
// exact lines and their order.
#include "kcheck.h"

__global__ void say(int launch, const int* v) {
  int t = threadIdx.x;
  printf("device launch %d thread %d value %d hex %#x float %.2f str %s\n", launch, t, v[t],
         v[t], v[t] * 0.5, t % 2 ? "odd" : "even");
}

static void check_printf() {
  int host[4] = {10, -20, 30, 255};
  int* dv = dev_alloc<int>(4);
  CK(cudaMemcpy(dv, host, sizeof host, cudaMemcpyHostToDevice));
  std::printf("host before\n");
  say<<<1, 4>>>(0, dv);
  say<<<1, 2>>>(1, dv);
  CK(cudaDeviceSynchronize());
  std::printf("host between\n");
  say<<<1, 1>>>(2, dv);
  CK(cudaDeviceSynchronize());
  std::printf("host after\n");
  std::printf("checked device printf of 3 launches around host output\n");
  CK(cudaFree(dv));
}

KCHECK_MAIN({"printf", check_printf})
