// State spaces other than plain global memory: dynamic shared memory (alone, after static shared
// arrays, and above 48 KiB with cudaFuncSetAttribute), __constant__ memory written with
// cudaMemcpyToSymbol (whole and at an offset) and read back with cudaMemcpyFromSymbol, __device__
// globals (cudaGetSymbolAddress, cudaMemcpyToSymbolAsync), and per-thread local arrays indexed
// dynamically (local memory).
#include <vector>
#include "kcheck.h"

// A static shared array followed by the dynamic one: they must not overlap.
__global__ void dyn_shared(const int* in, int* out, int per_thread) {
  __shared__ int fixed[64];
  extern __shared__ int dyn[];
  int t = threadIdx.x;
  if (t < 64) fixed[t] = 1000 * t;
  for (int k = 0; k < per_thread; k++) dyn[t * per_thread + k] = in[blockIdx.x * blockDim.x * per_thread + t * per_thread + k];
  __syncthreads();
  // Each thread reads another thread's slots (reversed) and the static array.
  int r = blockDim.x - 1 - t, acc = fixed[t % 64];
  for (int k = 0; k < per_thread; k++) acc += dyn[r * per_thread + k];
  out[blockIdx.x * blockDim.x + t] = acc;
}

static void run_dyn(int threads, int per_thread, bool big) {
  const int blocks = 3, n = blocks * threads * per_thread;
  size_t bytes = (size_t)threads * per_thread * sizeof(int);
  if (big) CK(cudaFuncSetAttribute(dyn_shared, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
  std::vector<int> h(n), got(blocks * threads);
  for (int i = 0; i < n; i++) h[i] = (int)(khash(i) % 1000);
  int* din = dev_copy(h.data(), n);
  int* dout = dev_alloc<int>(blocks * threads);
  dyn_shared<<<blocks, threads, bytes>>>(din, dout, per_thread);
  CK_LAUNCH(big ? "dyn_shared (> 48 KiB)" : "dyn_shared");
  to_host(got.data(), dout, got.size());
  for (int b = 0; b < blocks; b++)
    for (int t = 0; t < threads; t++) {
      int r = threads - 1 - t, want = 1000 * (t % 64);
      for (int k = 0; k < per_thread; k++) want += h[b * threads * per_thread + r * per_thread + k];
      EXPECT_RESULT(got[b * threads + t] == want, "block %d thread %d: %d, want %d", b, t,
                    got[b * threads + t], want);
    }
  std::printf("checked %zu bytes of dynamic shared memory after a static array, %d blocks\n",
              bytes, blocks);
  CK(cudaFree(din));
  CK(cudaFree(dout));
}

static void check_dynamic_shared() {
  run_dyn(256, 4, false);  // 4 KiB
  run_dyn(512, 40, true);  // 80 KiB: needs cudaFuncAttributeMaxDynamicSharedMemorySize
}

struct Coeffs {
  float scale;
  int offset;
  double weights[8];
};
__constant__ Coeffs c_coeffs;
__constant__ int c_table[256];

__global__ void use_constants(const int* idx, double* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  // Uniform reads (same address in the warp) and divergent ones (c_table[idx[i]]).
  double w = c_coeffs.weights[i % 8];
  out[i] = (double)(c_table[idx[i] & 255] * c_coeffs.scale + c_coeffs.offset) * w;
}

static void check_constant_memory() {
  const int n = 2000;
  Coeffs c = {1.5f, -7, {1, 2, 3, 4, 0.5, 0.25, -1, 8}};
  std::vector<int> table(256);
  for (int i = 0; i < 256; i++) table[i] = i * i - 300;
  CK(cudaMemcpyToSymbol(c_coeffs, &c, sizeof c));
  CK(cudaMemcpyToSymbol(c_table, table.data(), 128 * sizeof(int)));
  CK(cudaMemcpyToSymbol(c_table, table.data() + 128, 128 * sizeof(int), 128 * sizeof(int)));  // at an offset
  std::vector<int> idx(n);
  for (int i = 0; i < n; i++) idx[i] = khash(i) % 256;
  int* didx = dev_copy(idx.data(), n);
  double* dout = dev_alloc<double>(n);
  use_constants<<<(n + 255) / 256, 256>>>(didx, dout, n);
  CK_LAUNCH("use_constants");
  std::vector<double> got(n);
  to_host(got.data(), dout, n);
  for (int i = 0; i < n; i++) {
    double want = (double)(table[idx[i]] * c.scale + c.offset) * c.weights[i % 8];
    EXPECT_RESULT(got[i] == want, "out[%d] = %f, want %f", i, got[i], want);
  }
  Coeffs back;
  int tail[4];
  CK(cudaMemcpyFromSymbol(&back, c_coeffs, sizeof back));
  CK(cudaMemcpyFromSymbol(tail, c_table, sizeof tail, 252 * sizeof(int)));
  EXPECT_RESULT(back.offset == -7 && back.weights[7] == 8.0, "cudaMemcpyFromSymbol(c_coeffs)");
  EXPECT_RESULT(tail[3] == table[255], "cudaMemcpyFromSymbol(c_table + 252): %d", tail[3]);
  size_t sz = 0;
  CK(cudaGetSymbolSize(&sz, c_table));
  EXPECT_RESULT(sz == sizeof(int) * 256, "cudaGetSymbolSize(c_table) = %zu", sz);
  std::printf("checked __constant__ struct and table (cudaMemcpyToSymbol whole and at an offset,"
              " cudaMemcpyFromSymbol, cudaGetSymbolSize), uniform and divergent reads\n");
  CK(cudaFree(didx));
  CK(cudaFree(dout));
}

__device__ unsigned long long g_counter;
__device__ int g_values[1000];

__global__ void use_globals(int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    g_values[i] = g_values[i] * 2 + 1;
    atomicAdd(&g_counter, (unsigned long long)i);
  }
}

static void check_device_globals() {
  const int n = 1000;
  std::vector<int> h(n), got(n);
  for (int i = 0; i < n; i++) h[i] = i - 500;
  unsigned long long zero = 5;
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  CK(cudaMemcpyToSymbolAsync(g_values, h.data(), n * sizeof(int), 0, cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyToSymbolAsync(g_counter, &zero, sizeof zero, 0, cudaMemcpyHostToDevice, s));
  use_globals<<<(n + 127) / 128, 128, 0, s>>>(n);
  use_globals<<<(n + 127) / 128, 128, 0, s>>>(n);
  CK(cudaStreamSynchronize(s));
  CK_LAUNCH("use_globals x2");
  int* addr = nullptr;
  CK(cudaGetSymbolAddress((void**)&addr, g_values));
  CK(cudaMemcpy(got.data(), addr, n * sizeof(int), cudaMemcpyDeviceToHost));
  unsigned long long counter = 0;
  CK(cudaMemcpyFromSymbol(&counter, g_counter, sizeof counter));
  for (int i = 0; i < n; i++)
    EXPECT_RESULT(got[i] == (h[i] * 2 + 1) * 2 + 1, "g_values[%d] = %d", i, got[i]);
  unsigned long long want = 5 + 2ull * (n * (n - 1) / 2);
  EXPECT_RESULT(counter == want, "g_counter = %llu, want %llu", counter, want);
  std::printf("checked __device__ globals through cudaMemcpyToSymbolAsync, cudaGetSymbolAddress,"
              " two launches (counter %llu)\n", counter);
  CK(cudaStreamDestroy(s));
}

// A per-thread array indexed with run-time values lives in local memory.
__global__ void local_array(const int* in, int* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int buf[40];
  for (int k = 0; k < 40; k++) buf[k] = in[(i + k) % n];
  int acc = 0;
  for (int k = 0; k < 40; k++) acc += buf[(k * 7 + in[i]) % 40] * (k + 1);
  out[i] = acc;
}

static void check_local_memory() {
  const int n = 3000;
  std::vector<int> h(n), got(n);
  for (int i = 0; i < n; i++) h[i] = (int)(khash(i) % 100);
  int* din = dev_copy(h.data(), n);
  int* dout = dev_alloc<int>(n);
  local_array<<<(n + 255) / 256, 256>>>(din, dout, n);
  CK_LAUNCH("local_array");
  to_host(got.data(), dout, n);
  for (int i = 0; i < n; i++) {
    int buf[40], acc = 0;
    for (int k = 0; k < 40; k++) buf[k] = h[(i + k) % n];
    for (int k = 0; k < 40; k++) acc += buf[(k * 7 + h[i]) % 40] * (k + 1);
    EXPECT_RESULT(got[i] == acc, "out[%d] = %d, want %d", i, got[i], acc);
  }
  std::printf("checked a dynamically indexed per-thread array (local memory), %d threads\n", n);
  CK(cudaFree(din));
  CK(cudaFree(dout));
}

__global__ void scale_add(float* a, float k, float b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) a[i] = a[i] * k + b;
}

// Managed memory: one pointer written by the host, updated by kernels, read back by the host
// after a synchronize (twice, with host writes in between), counted in cudaMemGetInfo, seen as
// managed by cudaPointerGetAttributes; prefetch and advice accepted.
static void check_managed() {
  const int n = 100000;
  int managed = 0;
  CK(cudaDeviceGetAttribute(&managed, cudaDevAttrManagedMemory, 0));
  EXPECT_RESULT(managed == 1, "cudaDevAttrManagedMemory = %d", managed);
  size_t free0 = 0, free1 = 0, total = 0;
  CK(cudaMemGetInfo(&free0, &total));
  float* a = nullptr;
  CK(cudaMallocManaged(&a, n * sizeof(float)));
  CK(cudaMemGetInfo(&free1, &total));
  EXPECT_RESULT(free0 - free1 >= n * sizeof(float), "cudaMemGetInfo free went from %zu to %zu",
                free0, free1);
  cudaPointerAttributes attr;
  CK(cudaPointerGetAttributes(&attr, a));
  EXPECT_RESULT(attr.type == cudaMemoryTypeManaged, "pointer type %d, want managed",
                (int)attr.type);
  for (int i = 0; i < n; i++) a[i] = (float)(i % 1000);
  scale_add<<<(n + 255) / 256, 256>>>(a, 2.0f, 1.0f, n);
  CK_LAUNCH("scale_add");
  CK(cudaDeviceSynchronize());
  for (int i = 0; i < n; i++) {
    float want = (float)(i % 1000) * 2.0f + 1.0f;
    EXPECT_RESULT(a[i] == want, "after one kernel a[%d] = %g, want %g", i, a[i], want);
  }
  for (int i = 0; i < n; i += 2) a[i] = -1.0f;  // host writes between kernels
  int dev = 0;
  CK(cudaGetDevice(&dev));
  cudaMemLocation loc = {cudaMemLocationTypeDevice, dev};
  CK(cudaMemPrefetchAsync(a, n * sizeof(float), loc, 0, 0));
  CK(cudaMemAdvise(a, n * sizeof(float), cudaMemAdviseSetReadMostly, loc));
  scale_add<<<(n + 255) / 256, 256>>>(a, 3.0f, 0.0f, n);
  CK_LAUNCH("scale_add");
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  scale_add<<<(n + 255) / 256, 256, 0, s>>>(a, 1.0f, 0.5f, n);
  CK(cudaStreamSynchronize(s));
  for (int i = 0; i < n; i++) {
    float first = (float)(i % 1000) * 2.0f + 1.0f;
    float want = (i % 2 == 0 ? -1.0f : first) * 3.0f + 0.5f;
    EXPECT_RESULT(a[i] == want, "after three kernels a[%d] = %g, want %g", i, a[i], want);
  }
  CK(cudaStreamDestroy(s));
  CK(cudaFree(a));
  size_t free2 = 0;
  CK(cudaMemGetInfo(&free2, &total));
  EXPECT_RESULT(free2 >= free0 || free0 - free2 < (1 << 20), "free after cudaFree %zu, before %zu",
                free2, free0);
  std::printf("checked managed memory: host and kernels on one pointer, %d floats\n", n);
}

// CUDA arrays as storage: allocation counted in cudaMemGetInfo, 2-D copies in and out (with a
// sub-rectangle), the descriptor, and the memory back after cudaFreeArray.
static void check_arrays() {
  const int w = 300, h = 200;
  size_t free0 = 0, free1 = 0, total = 0;
  CK(cudaMemGetInfo(&free0, &total));
  cudaChannelFormatDesc fmt = cudaCreateChannelDesc<float>();
  cudaArray_t arr = nullptr;
  CK(cudaMallocArray(&arr, &fmt, w, h));
  CK(cudaMemGetInfo(&free1, &total));
  EXPECT_RESULT(free0 - free1 >= (size_t)w * h * sizeof(float),
                "cudaMemGetInfo free went from %zu to %zu", free0, free1);
  std::vector<float> src(w * h), back(w * h, -1.0f);
  for (int i = 0; i < w * h; i++) src[i] = (float)(khash(i) % 10000);
  CK(cudaMemcpy2DToArray(arr, 0, 0, src.data(), w * sizeof(float), w * sizeof(float), h,
                         cudaMemcpyHostToDevice));
  CK(cudaMemcpy2DFromArray(back.data(), w * sizeof(float), arr, 0, 0, w * sizeof(float), h,
                           cudaMemcpyDeviceToHost));
  for (int i = 0; i < w * h; i++)
    EXPECT_RESULT(back[i] == src[i], "array round trip [%d] = %g, want %g", i, back[i], src[i]);
  // A 10x5 sub-rectangle starting at column 7, row 3.
  std::vector<float> sub(10 * 5, 0.0f);
  CK(cudaMemcpy2DFromArray(sub.data(), 10 * sizeof(float), arr, 7 * sizeof(float), 3,
                           10 * sizeof(float), 5, cudaMemcpyDeviceToHost));
  for (int r = 0; r < 5; r++)
    for (int c = 0; c < 10; c++)
      EXPECT_RESULT(sub[r * 10 + c] == src[(r + 3) * w + c + 7], "sub-rectangle (%d, %d)", r, c);
  cudaChannelFormatDesc got_fmt;
  cudaExtent extent;
  unsigned int flags = 0;
  CK(cudaArrayGetInfo(&got_fmt, &extent, &flags, arr));
  EXPECT_RESULT(extent.width == (size_t)w && extent.height == (size_t)h && got_fmt.x == 32,
                "array info %zux%zu, %d bits", extent.width, extent.height, got_fmt.x);
  CK(cudaFreeArray(arr));
  size_t free2 = 0;
  CK(cudaMemGetInfo(&free2, &total));
  EXPECT_RESULT(free2 == free0, "free after cudaFreeArray %zu, before %zu", free2, free0);
  std::printf("checked a %dx%d float array: copies in and out, descriptor, memory\n", w, h);
}

// Mapped pinned memory (cudaHostAllocMapped): the device reports canMapHostMemory, kernels
// read and write it through cudaHostGetDevicePointer's pointer (the same address: unified
// addressing), and the host sees the results after a synchronize.
static void check_mapped_host() {
  const int n = 50000;
  int can_map = 0;
  CK(cudaDeviceGetAttribute(&can_map, cudaDevAttrCanMapHostMemory, 0));
  EXPECT_RESULT(can_map == 1, "cudaDevAttrCanMapHostMemory = %d", can_map);
  float* h = nullptr;
  CK(cudaHostAlloc(&h, n * sizeof(float), cudaHostAllocMapped));
  float* d = nullptr;
  CK(cudaHostGetDevicePointer(&d, h, 0));
  EXPECT_RESULT(d == h, "device pointer %p for host pointer %p", (void*)d, (void*)h);
  cudaPointerAttributes attr;
  CK(cudaPointerGetAttributes(&attr, h));
  EXPECT_RESULT(attr.type == cudaMemoryTypeHost, "pointer type %d, want host", (int)attr.type);
  for (int i = 0; i < n; i++) h[i] = (float)(i % 500);
  scale_add<<<(n + 255) / 256, 256>>>(d, 4.0f, -1.0f, n);
  CK_LAUNCH("scale_add");
  CK(cudaDeviceSynchronize());
  for (int i = 0; i < n; i++) {
    float want = (float)(i % 500) * 4.0f - 1.0f;
    EXPECT_RESULT(h[i] == want, "mapped h[%d] = %g, want %g", i, h[i], want);
  }
  // A copy from mapped memory to ordinary device memory sees the kernel's results too.
  float* other = nullptr;
  CK(cudaMalloc(&other, n * sizeof(float)));
  CK(cudaMemcpy(other, h, n * sizeof(float), cudaMemcpyHostToDevice));
  std::vector<float> back(n);
  CK(cudaMemcpy(back.data(), other, n * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; i++)
    EXPECT_RESULT(back[i] == h[i], "copied back [%d] = %g, want %g", i, back[i], h[i]);
  CK(cudaFree(other));
  CK(cudaFreeHost(h));
  std::printf("checked mapped pinned memory: %d floats written by a kernel\n", n);
}

// cudaFuncGetAttributes: libcudart 13.5 asks the driver for every function attribute up to
// CUDA 13's CU_FUNC_ATTRIBUTE_SHARED_MEMORY_MODE (17); one missing fails the call (and Thrust's
// radix sort with it: NVIDIA's radixSortThrust sample).
__global__ void attr_probe(int* x) {
  __shared__ int s[64];
  s[threadIdx.x] = threadIdx.x;
  __syncthreads();
  x[threadIdx.x] = s[63 - threadIdx.x];
}

static void check_func_attributes() {
  cudaFuncAttributes a = {};
  CK(cudaFuncGetAttributes(&a, attr_probe));
  EXPECT_RESULT(a.maxThreadsPerBlock > 0 && a.maxThreadsPerBlock <= 1024, "maxThreadsPerBlock %d",
                a.maxThreadsPerBlock);
  EXPECT_RESULT(a.sharedSizeBytes >= 64 * sizeof(int), "sharedSizeBytes %zu", a.sharedSizeBytes);
  EXPECT_RESULT(a.ptxVersion > 0 || a.binaryVersion > 0, "no ptx or binary version");
  std::printf("cudaFuncGetAttributes: %d threads, %zu shared bytes, %d registers\n",
              a.maxThreadsPerBlock, a.sharedSizeBytes, a.numRegs);
}

KCHECK_MAIN({"dynamic_shared", check_dynamic_shared}, {"constant_memory", check_constant_memory},
            {"device_globals", check_device_globals}, {"local_memory", check_local_memory},
            {"managed", check_managed}, {"arrays", check_arrays},
            {"mapped_host", check_mapped_host}, {"func_attributes", check_func_attributes})
