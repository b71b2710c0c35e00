// A __device__ table of function pointers: the module holds a global initialized with function
// addresses (.global .u64 table[3] = {f, g, h}), and the kernel calls through it.
#include "kcheck.h"

typedef int (*UnOp)(int);
__device__ int twice(int a) { return 2 * a; }
__device__ int negate(int a) { return -a; }
__device__ int square(int a) { return a * a; }
__device__ UnOp d_table[3] = {twice, negate, square};

__global__ void call_table(int* out) {
  int t = threadIdx.x;
  out[t] = d_table[t % 3](t);
}

static void check_table() {
  int* dout = dev_alloc<int>(96);
  call_table<<<1, 96>>>(dout);
  CK_LAUNCH("call_table");
  int got[96];
  to_host(got, dout, 96);
  for (int t = 0; t < 96; t++) {
    int want = t % 3 == 0 ? 2 * t : t % 3 == 1 ? -t : t * t;
    EXPECT_RESULT(got[t] == want, "thread %d: %d, want %d", t, got[t], want);
  }
  std::printf("checked calls through a __device__ table of 3 function pointers\n");
  CK(cudaFree(dout));
}

KCHECK_MAIN({"table", check_table})
