// Kernels that fault, one per process (a fault poisons the context): the error each one must
// produce at the next synchronization, and that it is sticky (later calls return it too);
// and that cudaDeviceReset gives a working device back.
//   trap            __trap() (PTX `trap`)            -> cudaErrorLaunchFailure (719)
//   illegal_address a store through a null pointer   -> cudaErrorIllegalAddress (700)
//   misaligned      a 4-byte load from an odd address -> cudaErrorMisalignedAddress (716)
//   assert          a failing device assert()        -> cudaErrorAssert (710)
#include <cassert>
#include <vector>
#include "kcheck.h"

__global__ void do_trap(int* out, int when) {
  if (threadIdx.x == when) __trap();
  out[threadIdx.x] = 1;
}

__global__ void store_to(int* p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = i;
}

__global__ void load_from(const char* p, int* out) { out[threadIdx.x] = *(const int*)(p + 1 + 4 * threadIdx.x); }

__global__ void do_assert(const int* in, int* out) {
  int v = in[threadIdx.x];
  assert(v >= 0);
  out[threadIdx.x] = v;
}

__global__ void add_one(int* p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] += 1;
}

// Launches add_one over a fresh allocation and checks it.
static void launch_and_check(const char* what) {
  const int n = 1000;
  std::vector<int> h(n), got(n);
  for (int i = 0; i < n; i++) h[i] = i * 3;
  int* d = dev_copy(h.data(), n);
  add_one<<<(n + 255) / 256, 256>>>(d, n);
  CK_LAUNCH(what);
  to_host(got.data(), d, n);
  for (int i = 0; i < n; i++) EXPECT_RESULT(got[i] == i * 3 + 1, "%s: %d, want %d", what, got[i], i * 3 + 1);
  CK(cudaFree(d));
}

// The error after a faulting kernel, and that it is sticky: every later call that touches the
// device returns it too. cudaGetLastError's values are printed, not checked beyond the first.
static void expect_fault(const char* what, cudaError_t want, int* spare) {
  cudaError_t e = cudaDeviceSynchronize();
  std::printf("%s: cudaDeviceSynchronize returned %d (%s)\n", what, (int)e, cudaGetErrorName(e));
  EXPECT_RESULT(e == want, "%s: cudaDeviceSynchronize returned %s, want %s", what,
                cudaGetErrorName(e), cudaGetErrorName(want));
  if (e == cudaSuccess) return;
  cudaError_t last1 = cudaGetLastError();
  cudaError_t last2 = cudaGetLastError();
  cudaError_t again = cudaDeviceSynchronize();
  void* p = nullptr;
  cudaError_t m = cudaMalloc(&p, 256);
  int host[4];
  cudaError_t c = cudaMemcpy(host, spare, sizeof host, cudaMemcpyDeviceToHost);
  add_one<<<1, 32>>>(spare, 4);
  cudaError_t l = cudaDeviceSynchronize();
  EXPECT_RESULT(last1 == want, "%s: cudaGetLastError returned %s", what, cudaGetErrorName(last1));
  EXPECT_RESULT(again == want, "%s: second cudaDeviceSynchronize returned %s", what, cudaGetErrorName(again));
  EXPECT_RESULT(m == want, "%s: cudaMalloc after the fault returned %s", what, cudaGetErrorName(m));
  EXPECT_RESULT(c == want, "%s: cudaMemcpy after the fault returned %s", what, cudaGetErrorName(c));
  EXPECT_RESULT(l == want, "%s: a launch after the fault synchronized with %s", what, cudaGetErrorName(l));
  std::printf("%s: sticky: cudaDeviceSynchronize %d, cudaMalloc %d, cudaMemcpy %d, launch %d"
              " (cudaGetLastError %d then %d)\n", what, (int)again, (int)m, (int)c, (int)l,
              (int)last1, (int)last2);
}

static void check_trap() {
  int* d = dev_alloc<int>(64);
  launch_and_check("add_one before the fault");
  do_trap<<<1, 64>>>(d, 17);
  expect_fault("trap", cudaErrorLaunchFailure, d);
}

static void check_illegal_address() {
  int* spare = dev_alloc<int>(64);
  launch_and_check("add_one before the fault");
  int* bad = nullptr;
  store_to<<<4, 64>>>(bad + 16, 256);
  expect_fault("illegal_address", cudaErrorIllegalAddress, spare);
}

static void check_misaligned() {
  char* d = dev_alloc<char>(1024);
  int* out = dev_alloc<int>(32);
  load_from<<<1, 32>>>(d, out);
  expect_fault("misaligned", cudaErrorMisalignedAddress, out);
}

static void check_assert() {
  int h[64];
  for (int i = 0; i < 64; i++) h[i] = i == 40 ? -1 : i;
  int* din = dev_copy(h, 64);
  int* dout = dev_alloc<int>(64);
  do_assert<<<1, 64>>>(din, dout);
  expect_fault("assert", cudaErrorAssert, dout);
}

// After a fault, cudaDeviceReset gives back a working device: allocations and launches of kernels
// launched before the fault and of kernels never launched before.
static void check_reset_after_fault() {
  int* spare = dev_alloc<int>(64);
  launch_and_check("add_one before the fault");
  store_to<<<1, 32>>>(nullptr, 32);
  cudaError_t e = cudaDeviceSynchronize();
  EXPECT_RESULT(e == cudaErrorIllegalAddress, "the fault returned %s", cudaGetErrorName(e));
  (void)spare;
  CK(cudaDeviceReset());
  (void)cudaGetLastError();
  int* d = dev_alloc<int>(64);
  store_to<<<1, 64>>>(d, 64);  // never launched successfully before
  CK_LAUNCH("store_to after cudaDeviceReset");
  int got[64];
  to_host(got, d, 64);
  for (int i = 0; i < 64; i++) EXPECT_RESULT(got[i] == i, "store_to after reset: %d", got[i]);
  launch_and_check("add_one after cudaDeviceReset");
  std::printf("after an illegal address and cudaDeviceReset, new allocations and launches work\n");
}

// cudaDeviceReset with no fault: kernels launched before it launch again after it.
static void check_reset_relaunch() {
  launch_and_check("add_one before cudaDeviceReset");
  CK(cudaDeviceReset());
  int* d = dev_alloc<int>(64);
  store_to<<<1, 64>>>(d, 64);  // first launch of this kernel
  CK_LAUNCH("store_to after cudaDeviceReset");
  launch_and_check("add_one after cudaDeviceReset");
  std::printf("a kernel launched before cudaDeviceReset launches again after it\n");
}

KCHECK_MAIN({"trap", check_trap}, {"illegal_address", check_illegal_address},
            {"misaligned", check_misaligned}, {"assert", check_assert},
            {"reset_after_fault", check_reset_after_fault}, {"reset_relaunch", check_reset_relaunch})
