// Managed memory the host and a running kernel use at the same time: system-scope atomics on
// both sides are one coherence domain (atomicAdd_system, cuda::atomic_ref with
// thread_scope_system, host __atomic builtins), and a host thread spinning on a flag sees a
// running kernel set it. These need cudaDevAttrConcurrentManagedAccess = 1, which a device
// reports where the host and the device share managed memory; the "attribute" check compares
// it with KCHECK_CONCURRENT_MANAGED (the value the test expects for its transport).
#include <chrono>
#include <cuda/atomic>
#include <thread>
#include <vector>

#include "kcheck.h"

static int concurrent_managed() {
  int v = -1;
  CK(cudaDeviceGetAttribute(&v, cudaDevAttrConcurrentManagedAccess, 0));
  return v;
}

static void check_attribute() {
  const char* want = std::getenv("KCHECK_CONCURRENT_MANAGED");
  EXPECT_RESULT(want != nullptr, "KCHECK_CONCURRENT_MANAGED is not set");
  int got = concurrent_managed();
  if (want) EXPECT_RESULT(got == std::atoi(want), "concurrentManagedAccess %d, want %s", got, want);
  int pageable = -1;
  CK(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, 0));
  EXPECT_RESULT(pageable == 0, "pageableMemoryAccess %d, want 0", pageable);
  std::printf("checked concurrentManagedAccess = %d\n", got);
}

// Each thread adds 1 to counters[0] (atomicAdd_system) and 3 to wide[0] (cuda::atomic_ref,
// system scope) `iters` times.
__global__ void add_system(int* counters, unsigned long long* wide, int iters) {
  cuda::atomic_ref<unsigned long long, cuda::thread_scope_system> w(wide[0]);
  for (int i = 0; i < iters; i++) {
    atomicAdd_system(&counters[0], 1);
    w.fetch_add(3ull, cuda::memory_order_relaxed);
  }
  atomicMax_system(&counters[1], (int)(blockIdx.x * blockDim.x + threadIdx.x));
}

static void check_concurrent_atomics() {
  EXPECT_RESULT(concurrent_managed() == 1, "needs concurrentManagedAccess");
  int* counters = nullptr;
  unsigned long long* wide = nullptr;
  CK(cudaMallocManaged(&counters, 2 * sizeof(int)));
  CK(cudaMallocManaged(&wide, sizeof(unsigned long long)));
  // Plain host writes before the launch: the kernel starts from them.
  counters[0] = 1000;
  counters[1] = -1;
  *wide = 7;
  const int blocks = 16, threads = 64, iters = 40;
  const int host_threads = 3, host_adds = 20000;
  add_system<<<blocks, threads>>>(counters, wide, iters);
  CK(cudaGetLastError());
  // While the kernel runs: host threads add to the same words atomically.
  std::vector<std::thread> pool;
  for (int t = 0; t < host_threads; t++) {
    pool.emplace_back([=] {
      for (int i = 0; i < host_adds; i++) {
        __atomic_fetch_add(&counters[0], 2, __ATOMIC_SEQ_CST);
        __atomic_fetch_add(wide, 5ull, __ATOMIC_SEQ_CST);
      }
    });
  }
  for (auto& t : pool) t.join();
  CK(cudaDeviceSynchronize());
  long long dev_adds = (long long)blocks * threads * iters;
  long long want0 = 1000 + dev_adds + 2LL * host_threads * host_adds;
  unsigned long long want_wide = 7 + 3ull * dev_adds + 5ull * host_threads * host_adds;
  EXPECT_RESULT(counters[0] == want0, "counter %d, want %lld", counters[0], want0);
  EXPECT_RESULT(*wide == want_wide, "wide counter %llu, want %llu", *wide, want_wide);
  EXPECT_RESULT(counters[1] == blocks * threads - 1, "max %d, want %d", counters[1],
                blocks * threads - 1);
  std::printf("checked %lld device and %d host atomic adds on shared counters\n", dev_adds,
              2 * host_threads * host_adds);
  CK(cudaFree(counters));
  CK(cudaFree(wide));
}

// Thread 0 raises the flag to 1, then waits (at most `max_spins` polls) for the host to set 2,
// records what it saw and sets 3.
__global__ void handshake(int* flag, int* seen, long long max_spins) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  atomicExch_system(flag, 1);
  long long spins = 0;
  int v = 0;
  while ((v = atomicAdd_system(flag, 0)) != 2 && spins < max_spins) spins++;
  seen[0] = v;
  seen[1] = spins < max_spins;
  __threadfence_system();
  atomicExch_system(flag, 3);
}

static void check_flag_handshake() {
  EXPECT_RESULT(concurrent_managed() == 1, "needs concurrentManagedAccess");
  int* flag = nullptr;
  int* seen = nullptr;
  CK(cudaMallocManaged(&flag, sizeof(int)));
  CK(cudaMallocManaged(&seen, 2 * sizeof(int)));
  *flag = 0;
  seen[0] = seen[1] = -1;
  // Bounded on both sides: a kernel that never runs concurrently fails instead of hanging.
  handshake<<<1, 32>>>(flag, seen, 20000000LL);
  CK(cudaGetLastError());
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool raised = false;
  while (std::chrono::steady_clock::now() < deadline) {
    if (__atomic_load_n(flag, __ATOMIC_ACQUIRE) == 1) {
      raised = true;
      break;
    }
    std::this_thread::yield();
  }
  EXPECT_RESULT(raised, "the running kernel's flag never reached the host (flag %d)",
                __atomic_load_n(flag, __ATOMIC_ACQUIRE));
  __atomic_store_n(flag, 2, __ATOMIC_RELEASE);
  // The kernel answers while it still runs: the host sees 3 before synchronizing.
  bool answered = false;
  deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (raised && std::chrono::steady_clock::now() < deadline) {
    if (__atomic_load_n(flag, __ATOMIC_ACQUIRE) == 3) {
      answered = true;
      break;
    }
    std::this_thread::yield();
  }
  EXPECT_RESULT(answered, "the kernel did not answer the host's flag");
  CK(cudaDeviceSynchronize());
  EXPECT_RESULT(seen[0] == 2 && seen[1] == 1, "kernel saw flag %d (in time: %d)", seen[0],
                seen[1]);
  EXPECT_RESULT(*flag == 3, "flag %d after the kernel, want 3", *flag);
  std::printf("checked a host/kernel handshake on a managed flag\n");
  CK(cudaFree(flag));
  CK(cudaFree(seen));
}

// Page-locked memory under unified addressing: kernels dereference cudaMallocHost and
// cudaHostAlloc pointers as they are, with no cudaHostAllocMapped and no
// cudaHostGetDevicePointer (NVIDIA's p2pBandwidthLatencyTest spins a kernel on a pinned flag;
// UnifiedMemoryPerf latches on one). The host's writes reach a running kernel, and the kernel's
// reach the host before any synchronize.
__global__ void pinned_scale(const float* in, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 2.0f * in[i] + 1.0f;
}

__global__ void pinned_latch(volatile int* flag, int* seen, long long max_spins) {
  if (threadIdx.x != 0) return;
  flag[1] = 1;  // the kernel runs
  long long spins = 0;
  while (flag[0] == 0 && spins < max_spins) spins++;
  seen[0] = flag[0];
  seen[1] = spins < max_spins;
  atomicAdd_system(&seen[2], 5);
}

static void check_pinned_uva() {
  const int n = 1000;
  float* in = nullptr;
  float* out = nullptr;
  CK(cudaMallocHost(&in, n * sizeof(float)));
  CK(cudaHostAlloc(&out, n * sizeof(float), cudaHostAllocPortable));
  for (int i = 0; i < n; i++) {
    in[i] = (float)i;
    out[i] = -1.0f;
  }
  void* dev = nullptr;
  CK(cudaHostGetDevicePointer(&dev, in, 0));
  EXPECT_RESULT(dev == in, "device pointer %p of pinned memory %p", dev, (void*)in);
  cudaPointerAttributes attr = {};
  CK(cudaPointerGetAttributes(&attr, out));
  EXPECT_RESULT(attr.type == cudaMemoryTypeHost && attr.devicePointer == out,
                "pinned memory's attributes: type %d device pointer %p", (int)attr.type,
                attr.devicePointer);
  pinned_scale<<<(n + 127) / 128, 128>>>(in, out, n);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  for (int i = 0; i < n; i++)
    EXPECT_RESULT(out[i] == 2.0f * i + 1.0f, "out[%d] = %g, want %g", i, out[i], 2.0f * i + 1.0f);
  // Copies of the same memory still work, and see what the kernel wrote.
  float* d = nullptr;
  CK(cudaMalloc(&d, n * sizeof(float)));
  CK(cudaMemcpy(d, out, n * sizeof(float), cudaMemcpyHostToDevice));
  pinned_scale<<<(n + 127) / 128, 128>>>(d, in, n);
  CK(cudaDeviceSynchronize());
  for (int i = 0; i < n; i++)
    EXPECT_RESULT(in[i] == 4.0f * i + 3.0f, "in[%d] = %g, want %g", i, in[i], 4.0f * i + 3.0f);
  CK(cudaFree(d));

  // A kernel latched on a pinned flag until the host lets it go; bounded on both sides.
  int* flag = nullptr;
  int* seen = nullptr;
  CK(cudaMallocHost(&flag, 2 * sizeof(int)));
  CK(cudaMallocHost(&seen, 3 * sizeof(int)));
  flag[0] = flag[1] = 0;
  seen[0] = seen[1] = -1;
  seen[2] = 10;
  pinned_latch<<<1, 32>>>(flag, seen, 20000000LL);
  CK(cudaGetLastError());
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool running = false;
  while (std::chrono::steady_clock::now() < deadline) {
    if (__atomic_load_n(&flag[1], __ATOMIC_ACQUIRE) == 1) {
      running = true;
      break;
    }
    std::this_thread::yield();
  }
  EXPECT_RESULT(running, "the kernel's write to pinned memory never reached the host");
  __atomic_store_n(&flag[0], 7, __ATOMIC_RELEASE);
  __atomic_fetch_add(&seen[2], 100, __ATOMIC_SEQ_CST);
  CK(cudaDeviceSynchronize());
  EXPECT_RESULT(seen[0] == 7 && seen[1] == 1, "kernel saw flag %d (in time: %d)", seen[0],
                seen[1]);
  EXPECT_RESULT(seen[2] == 115, "host and kernel atomics on pinned memory: %d, want 115", seen[2]);
  std::printf("checked %d floats and a latch in pinned memory, read and written by kernels\n", n);
  CK(cudaFreeHost(in));
  CK(cudaFreeHost(out));
  CK(cudaFreeHost(flag));
  CK(cudaFreeHost(seen));
}

KCHECK_MAIN({"attribute", check_attribute}, {"concurrent_atomics", check_concurrent_atomics},
            {"flag_handshake", check_flag_handshake}, {"pinned_uva", check_pinned_uva})
