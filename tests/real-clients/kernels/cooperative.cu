// Cooperative launches (cudaLaunchCooperativeKernel) with grid-wide sync, their size limit, the
// device attributes that announce them, and the persisting-L2 controls (accepted hints: the
// emulated GPU has no cache). Built with cooperative_groups (needs CCCL's <nv/target>).
#include <cooperative_groups.h>
#include <vector>
#include "kcheck.h"
namespace cg = cooperative_groups;

// Three phases separated by grid.sync(): per-block partial sums, one thread adding the
// partials, every thread reading the total back.
__global__ void grid_sum(const int* in, long long* partial, long long* total, long long* seen,
                         int n) {
  cg::grid_group grid = cg::this_grid();
  long long s = 0;
  for (int i = grid.thread_rank(); i < n; i += grid.size()) s += in[i];
  atomicAdd((unsigned long long*)&partial[blockIdx.x], (unsigned long long)s);
  grid.sync();
  if (grid.thread_rank() == 0) {
    long long t = 0;
    for (unsigned b = 0; b < gridDim.x; b++) t += partial[b];
    *total = t;
  }
  grid.sync();
  seen[grid.thread_rank()] = *total;
}

// Every block waits for a flag no block sets: a kernel that would hang.
__global__ void wait_forever(volatile int* flag) {
  while (*flag == 0) {
  }
}

__global__ void set_flag(int* p, int v) { *p = v; }

static int sms() {
  int n = 0;
  CK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0));
  return n;
}

static void check_grid_sync() {
  int coop = 0;
  CK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, 0));
  EXPECT_RESULT(coop == 1, "cudaDevAttrCooperativeLaunch = %d", coop);
  const int threads = 128;
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, grid_sum, threads, 0));
  int blocks = sms();  // one block per multiprocessor, within the limit
  EXPECT_RESULT(per_sm >= 1, "occupancy %d", per_sm);
  const int n = 200000;
  std::vector<int> h(n);
  long long want = 0;
  for (int i = 0; i < n; i++) {
    h[i] = (int)(khash(i) % 2001) - 1000;
    want += h[i];
  }
  int* d_in = dev_copy(h.data(), n);
  long long* partial = dev_alloc<long long>(blocks);
  long long* total = dev_alloc<long long>(1);
  long long* seen = dev_alloc<long long>(blocks * threads);
  for (int round = 0; round < 3; round++) {
    CK(cudaMemset(partial, 0, blocks * sizeof(long long)));
    CK(cudaMemset(seen, 0, blocks * threads * sizeof(long long)));
    int nn = n;
    void* args[] = {&d_in, &partial, &total, &seen, &nn};
    CK(cudaLaunchCooperativeKernel((void*)grid_sum, dim3(blocks), dim3(threads), args, 0, 0));
    CK(cudaDeviceSynchronize());
    std::vector<long long> got(blocks * threads);
    to_host(got.data(), seen, got.size());
    for (size_t i = 0; i < got.size(); i++)
      EXPECT_RESULT(got[i] == want, "round %d thread %zu saw %lld, want %lld", round, i, got[i],
                    want);
  }
  std::printf("checked 3 cooperative launches of %d blocks x %d threads (sum %lld)\n", blocks,
              threads, want);
  CK(cudaFree(d_in));
  CK(cudaFree(partial));
  CK(cudaFree(total));
  CK(cudaFree(seen));
}

static void check_too_large() {
  const int threads = 256;
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, grid_sum, threads, 0));
  int limit = per_sm * sms();
  long long* buf = dev_alloc<long long>(1);
  int* in = dev_alloc<int>(1);
  int nn = 0;
  void* args[] = {&in, &buf, &buf, &buf, &nn};
  cudaError_t e =
      cudaLaunchCooperativeKernel((void*)grid_sum, dim3(limit + 1), dim3(threads), args, 0, 0);
  EXPECT_RESULT(e == cudaErrorCooperativeLaunchTooLarge, "grid of %d (limit %d): %d (%s)",
                limit + 1, limit, (int)e, cudaGetErrorName(e));
  // The runtime keeps the launch's error as the last error once; the context stays usable.
  cudaError_t last = cudaGetLastError();
  EXPECT_RESULT(last == cudaErrorCooperativeLaunchTooLarge, "last error %s",
                cudaGetErrorName(last));
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::printf("a cooperative grid of %d blocks (limit %d) got %s\n", limit + 1, limit,
              cudaGetErrorName(e));
  CK(cudaFree(buf));
  CK(cudaFree(in));
}

static void check_hang_fails() {
  int* flag = dev_alloc<int>(1);
  CK(cudaMemset(flag, 0, sizeof(int)));
  void* args[] = {&flag};
  CK(cudaLaunchCooperativeKernel((void*)wait_forever, dim3(4), dim3(64), args, 0, 0));
  cudaError_t e = cudaDeviceSynchronize();
  EXPECT_RESULT(e == cudaErrorLaunchFailure, "synchronize after a grid that waits forever: %d (%s)",
                (int)e, cudaGetErrorName(e));
  std::printf("a cooperative grid whose blocks all wait forever failed: %s\n",
              cudaGetErrorName(e));
}

static void check_persisting_l2() {
  int max_persist = 0, max_window = 0, l2 = 0;
  CK(cudaDeviceGetAttribute(&max_persist, cudaDevAttrMaxPersistingL2CacheSize, 0));
  CK(cudaDeviceGetAttribute(&max_window, cudaDevAttrMaxAccessPolicyWindowSize, 0));
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  EXPECT_RESULT(max_persist > 0 && max_persist <= l2, "persisting %d of L2 %d", max_persist, l2);
  EXPECT_RESULT(max_window > 0, "window %d", max_window);
  CK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, max_persist / 2));
  size_t got = 0;
  CK(cudaDeviceGetLimit(&got, cudaLimitPersistingL2CacheSize));
  EXPECT_RESULT(got == (size_t)max_persist / 2, "limit %zu", got);
  CK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, (size_t)max_persist * 4));
  CK(cudaDeviceGetLimit(&got, cudaLimitPersistingL2CacheSize));
  EXPECT_RESULT(got == (size_t)max_persist, "limit capped at %zu, want %d", got, max_persist);

  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  int* d = dev_alloc<int>(1 << 20);
  cudaStreamAttrValue v = {};
  v.accessPolicyWindow.base_ptr = d;
  v.accessPolicyWindow.num_bytes = 4 << 20;
  v.accessPolicyWindow.hitRatio = 0.6f;
  v.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
  v.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
  CK(cudaStreamSetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &v));
  cudaStreamAttrValue back = {};
  CK(cudaStreamGetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &back));
  EXPECT_RESULT(back.accessPolicyWindow.base_ptr == d &&
                    back.accessPolicyWindow.num_bytes == (size_t)(4 << 20) &&
                    back.accessPolicyWindow.hitRatio == 0.6f &&
                    back.accessPolicyWindow.hitProp == cudaAccessPropertyPersisting,
                "window read back: %p %zu %f", back.accessPolicyWindow.base_ptr,
                back.accessPolicyWindow.num_bytes, back.accessPolicyWindow.hitRatio);
  cudaStreamAttrValue bad = v;
  bad.accessPolicyWindow.hitRatio = 1.5f;
  cudaError_t e = cudaStreamSetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &bad);
  EXPECT_RESULT(e == cudaErrorInvalidValue, "hit ratio 1.5: %s", cudaGetErrorName(e));
  cudaGetLastError();
  // A kernel on the stream runs as before.
  CK(cudaMemsetAsync(d, 0, 4, s));
  CK(cudaStreamSynchronize(s));
  // The same window on a kernel node of a graph, read back, and the graph runs.
  cudaGraph_t g;
  CK(cudaGraphCreate(&g, 0));
  cudaGraphNode_t node;
  int one = 1;
  void* args[] = {&d, &one};
  cudaKernelNodeParams kp = {};
  kp.func = (void*)set_flag;
  kp.gridDim = dim3(1);
  kp.blockDim = dim3(1);
  kp.kernelParams = args;
  CK(cudaGraphAddKernelNode(&node, g, nullptr, 0, &kp));
  cudaKernelNodeAttrValue kv = {};
  kv.accessPolicyWindow = v.accessPolicyWindow;
  CK(cudaGraphKernelNodeSetAttribute(node, cudaKernelNodeAttributeAccessPolicyWindow, &kv));
  cudaKernelNodeAttrValue kback = {};
  CK(cudaGraphKernelNodeGetAttribute(node, cudaKernelNodeAttributeAccessPolicyWindow, &kback));
  EXPECT_RESULT(kback.accessPolicyWindow.num_bytes == v.accessPolicyWindow.num_bytes &&
                    kback.accessPolicyWindow.hitRatio == 0.6f,
                "node window read back: %zu %f", kback.accessPolicyWindow.num_bytes,
                kback.accessPolicyWindow.hitRatio);
  cudaGraphExec_t ge;
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphLaunch(ge, s));
  CK(cudaStreamSynchronize(s));
  int flag = 0;
  CK(cudaMemcpy(&flag, d, sizeof flag, cudaMemcpyDeviceToHost));
  EXPECT_RESULT(flag == 1, "kernel node with a window wrote %d", flag);
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  CK(cudaCtxResetPersistingL2Cache());
  CK(cudaStreamDestroy(s));
  CK(cudaFree(d));
  std::printf("persisting L2 of %d bytes, windows up to %d bytes: accepted\n", max_persist,
              max_window);
}

KCHECK_MAIN({"grid_sync", check_grid_sync}, {"too_large", check_too_large},
            {"hang_fails", check_hang_fails}, {"persisting_l2", check_persisting_l2})
