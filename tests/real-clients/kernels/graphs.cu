// CUDA graphs built by stream capture (cudaStreamBeginCapture / cudaStreamEndCapture /
// cudaGraphInstantiate / cudaGraphLaunch), each replayed several times with the results checked
// after every replay: memset, host-to-device, kernels, device-to-device and device-to-host copies
// in one stream; a fork/join capture across two streams through events; a host function node;
// capture state queries, node count, and launching on another stream; cudaMallocAsync/cudaFreeAsync
// under capture and graph allocation/free nodes.
#include <vector>
#include "kcheck.h"

__global__ void axpy_acc(const int* in, int* acc, int a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) acc[i] = acc[i] * 2 + a * in[i];
}

__global__ void sum_into(const int* x, unsigned long long* total, int n) {
  __shared__ unsigned long long s[256];
  int t = threadIdx.x;
  unsigned long long v = 0;
  for (int i = blockIdx.x * blockDim.x + t; i < n; i += gridDim.x * blockDim.x) v += (unsigned)x[i];
  s[t] = v;
  __syncthreads();
  for (int st = 128; st > 0; st >>= 1) {
    if (t < st) s[t] += s[t + st];
    __syncthreads();
  }
  if (t == 0) atomicAdd(total, s[0]);
}

__global__ void scale(int* x, int k, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= k;
}

static void check_capture_replay() {
  const int n = 5000, replays = 5;
  int *h_in, *h_out;
  CK(cudaMallocHost(&h_in, n * sizeof(int)));
  CK(cudaMallocHost(&h_out, n * sizeof(int)));
  unsigned long long* h_total;
  CK(cudaMallocHost(&h_total, sizeof *h_total));
  for (int i = 0; i < n; i++) h_in[i] = (int)(khash(i) % 100);
  int* d_in = dev_alloc<int>(n);
  int* d_acc = dev_alloc<int>(n);
  int* d_copy = dev_alloc<int>(n);
  unsigned long long* d_total = dev_alloc<unsigned long long>(1);
  CK(cudaMemset(d_acc, 0, n * sizeof(int)));
  CK(cudaMemset(d_total, 0, sizeof *d_total));

  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  cudaStreamCaptureStatus st;
  CK(cudaStreamIsCapturing(s, &st));
  EXPECT_RESULT(st == cudaStreamCaptureStatusActive, "cudaStreamIsCapturing: %d", (int)st);
  CK(cudaMemsetAsync(d_copy, 0xff, n * sizeof(int), s));
  CK(cudaMemcpyAsync(d_in, h_in, n * sizeof(int), cudaMemcpyHostToDevice, s));
  axpy_acc<<<(n + 255) / 256, 256, 0, s>>>(d_in, d_acc, 3, n);
  sum_into<<<8, 256, 0, s>>>(d_acc, d_total, n);
  CK(cudaMemcpyAsync(d_copy, d_acc, n * sizeof(int), cudaMemcpyDeviceToDevice, s));
  scale<<<(n + 255) / 256, 256, 0, s>>>(d_copy, -1, n);
  CK(cudaMemcpyAsync(h_out, d_copy, n * sizeof(int), cudaMemcpyDeviceToHost, s));
  CK(cudaMemcpyAsync(h_total, d_total, sizeof *h_total, cudaMemcpyDeviceToHost, s));
  cudaGraph_t graph;
  CK(cudaStreamEndCapture(s, &graph));
  CK(cudaStreamIsCapturing(s, &st));
  EXPECT_RESULT(st == cudaStreamCaptureStatusNone, "cudaStreamIsCapturing after the end: %d", (int)st);
  size_t nodes = 0;
  CK(cudaGraphGetNodes(graph, nullptr, &nodes));
  std::printf("captured a graph of %zu nodes\n", nodes);
  EXPECT_RESULT(nodes == 8, "cudaGraphGetNodes: %zu nodes, want 8", nodes);
  // Nothing ran during the capture.
  int probe = 0;
  CK(cudaMemcpy(&probe, d_acc, sizeof probe, cudaMemcpyDeviceToHost));
  EXPECT_RESULT(probe == 0, "capture executed work: acc[0] = %d", probe);

  cudaGraphExec_t exec;
  CK(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<long long> acc(n, 0);
  unsigned long long total = 0;
  for (int r = 1; r <= replays; r++) {
    CK(cudaGraphLaunch(exec, s));
    CK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; i++) acc[i] = acc[i] * 2 + 3 * h_in[i];
    unsigned long long sum = 0;
    for (int i = 0; i < n; i++) sum += (unsigned)acc[i];
    total += sum;
    for (int i = 0; i < n; i++)
      EXPECT_RESULT(h_out[i] == -acc[i], "replay %d: out[%d] = %d, want %lld", r, i, h_out[i], -acc[i]);
    EXPECT_RESULT(*h_total == total, "replay %d: total %llu, want %llu", r, *h_total, total);
  }
  std::printf("checked %d replays: memset, H2D, 3 kernels, D2D, 2 D2H per replay (total %llu)\n",
              replays, total);
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaStreamDestroy(s));
  CK(cudaFreeHost(h_in));
  CK(cudaFreeHost(h_out));
  CK(cudaFreeHost(h_total));
  CK(cudaFree(d_in));
  CK(cudaFree(d_acc));
  CK(cudaFree(d_copy));
  CK(cudaFree(d_total));
}

__global__ void fill_from(int* x, const int* src, int add, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = src[i] + add;
}

__global__ void combine(int* out, const int* a, const int* b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] += a[i] * b[i];
}

static void host_tick(void* p) { ++*(int*)p; }

static void check_fork_join() {
  const int n = 3000, replays = 3;
  std::vector<int> h(n), got(n);
  for (int i = 0; i < n; i++) h[i] = (int)(khash(i) % 50) - 25;
  int* src = dev_copy(h.data(), n);
  int* a = dev_alloc<int>(n);
  int* b = dev_alloc<int>(n);
  int* out = dev_alloc<int>(n);
  CK(cudaMemset(out, 0, n * sizeof(int)));
  cudaStream_t s1, s2;
  CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  cudaEvent_t fork, join;
  CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  int ticks = 0;

  CK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
  CK(cudaEventRecord(fork, s1));
  CK(cudaStreamWaitEvent(s2, fork, 0));  // s2 joins the capture
  cudaStreamCaptureStatus st;
  CK(cudaStreamIsCapturing(s2, &st));
  EXPECT_RESULT(st == cudaStreamCaptureStatusActive, "s2 not capturing after the fork: %d", (int)st);
  fill_from<<<(n + 255) / 256, 256, 0, s1>>>(a, src, 1, n);
  fill_from<<<(n + 255) / 256, 256, 0, s2>>>(b, src, -2, n);
  CK(cudaEventRecord(join, s2));
  CK(cudaStreamWaitEvent(s1, join, 0));
  combine<<<(n + 255) / 256, 256, 0, s1>>>(out, a, b, n);
  CK(cudaLaunchHostFunc(s1, host_tick, &ticks));
  cudaGraph_t graph;
  CK(cudaStreamEndCapture(s1, &graph));
  cudaGraphExec_t exec;
  CK(cudaGraphInstantiate(&exec, graph, 0));
  EXPECT_RESULT(ticks == 0, "the host function ran during capture");

  // Replays on a third stream (not the one captured).
  cudaStream_t s3;
  CK(cudaStreamCreate(&s3));
  for (int r = 1; r <= replays; r++) {
    CK(cudaGraphLaunch(exec, s3));
    CK(cudaStreamSynchronize(s3));
    to_host(got.data(), out, n);
    for (int i = 0; i < n; i++) {
      int want = r * (h[i] + 1) * (h[i] - 2);
      EXPECT_RESULT(got[i] == want, "replay %d: out[%d] = %d, want %d", r, i, got[i], want);
    }
    EXPECT_RESULT(ticks == r, "replay %d: host function ran %d times", r, ticks);
  }
  std::printf("checked %d replays of a fork/join graph over two streams with a host node,"
              " launched on a third stream\n", replays);
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaEventDestroy(fork));
  CK(cudaEventDestroy(join));
  CK(cudaStreamDestroy(s1));
  CK(cudaStreamDestroy(s2));
  CK(cudaStreamDestroy(s3));
  CK(cudaFree(src));
  CK(cudaFree(a));
  CK(cudaFree(b));
  CK(cudaFree(out));
}

// Many small kernels in one graph, replayed many times (the launch path of a graph).
__global__ void bump(int* x, int k) { x[threadIdx.x] += k; }

static void check_many_nodes() {
  const int kernels = 50, replays = 20;
  int* d = dev_alloc<int>(32);
  CK(cudaMemset(d, 0, 32 * sizeof(int)));
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int k = 0; k < kernels; k++) bump<<<1, 32, 0, s>>>(d, k);
  cudaGraph_t g;
  CK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t e;
  CK(cudaGraphInstantiate(&e, g, 0));
  for (int r = 0; r < replays; r++) CK(cudaGraphLaunch(e, s));
  CK(cudaStreamSynchronize(s));
  int got[32];
  to_host(got, d, 32);
  int want = replays * (kernels * (kernels - 1) / 2);
  for (int i = 0; i < 32; i++) EXPECT_RESULT(got[i] == want, "x[%d] = %d, want %d", i, got[i], want);
  std::printf("checked %d replays of a graph of %d kernels (%d launches)\n", replays, kernels,
              replays * kernels);
  CK(cudaGraphExecDestroy(e));
  CK(cudaGraphDestroy(g));
  CK(cudaStreamDestroy(s));
  CK(cudaFree(d));
}

__global__ void fill_scaled(int* tmp, const int* in, int k, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) tmp[i] = in[i] * k;
}

__global__ void add_from(int* acc, const int* tmp, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) acc[i] += tmp[i];
}

static size_t graph_mem(cudaGraphMemAttributeType a) {
  size_t v = 0;
  CK(cudaDeviceGetGraphMemAttribute(0, a, &v));
  return v;
}

static void expect_acc(const int* d_acc, const std::vector<int>& in, int times, const char* what) {
  std::vector<int> got(in.size());
  to_host(got.data(), d_acc, in.size());
  for (size_t i = 0; i < in.size(); i++)
    EXPECT_RESULT(got[i] == times * 3 * in[i], "%s: acc[%zu] = %d, want %d", what, i, got[i],
                  times * 3 * in[i]);
}

// cudaMallocAsync/cudaFreeAsync under stream capture become graph allocation and free nodes:
// the scratch buffer is allocated each time the graph runs, at the address capture returned.
static void check_malloc_async_capture() {
  const int n = 4096, replays = 4;
  std::vector<int> in(n);
  for (int i = 0; i < n; i++) in[i] = (int)(khash(i) % 1000);
  int* d_in = dev_copy(in.data(), n);
  int* d_acc = dev_alloc<int>(n);
  CK(cudaMemset(d_acc, 0, n * sizeof(int)));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  size_t before = graph_mem(cudaGraphMemAttrReservedMemCurrent);
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  int* tmp = nullptr;
  CK(cudaMallocAsync(&tmp, n * sizeof(int), s));
  fill_scaled<<<(n + 255) / 256, 256, 0, s>>>(tmp, d_in, 3, n);
  add_from<<<(n + 255) / 256, 256, 0, s>>>(d_acc, tmp, n);
  CK(cudaFreeAsync(tmp, s));
  cudaGraph_t g;
  CK(cudaStreamEndCapture(s, &g));
  size_t nodes = 0;
  CK(cudaGraphGetNodes(g, nullptr, &nodes));
  EXPECT_RESULT(nodes == 4, "%zu nodes, want 4 (alloc, 2 kernels, free)", nodes);
  cudaGraphExec_t e;
  CK(cudaGraphInstantiate(&e, g, 0));
  size_t reserved = graph_mem(cudaGraphMemAttrReservedMemCurrent);
  EXPECT_RESULT(reserved >= before + n * sizeof(int), "graph memory reserved %zu", reserved);
  for (int r = 0; r < replays; r++) CK(cudaGraphLaunch(e, s));
  CK(cudaStreamSynchronize(s));
  expect_acc(d_acc, in, replays, "capture");
  CK(cudaGraphExecDestroy(e));
  CK(cudaGraphDestroy(g));
  size_t after = graph_mem(cudaGraphMemAttrReservedMemCurrent);
  EXPECT_RESULT(after == before, "graph memory after destroy %zu, before %zu", after, before);
  CK(cudaDeviceGraphMemTrim(0));
  std::printf("checked %d replays of a captured cudaMallocAsync/cudaFreeAsync graph\n", replays);
  CK(cudaStreamDestroy(s));
  CK(cudaFree(d_in));
  CK(cudaFree(d_acc));
}

// The same built node by node; then a graph whose allocation is freed outside it: relaunching
// before that free is refused, after it works.
static void check_mem_nodes() {
  const int n = 3000;
  std::vector<int> in(n);
  for (int i = 0; i < n; i++) in[i] = (int)(khash(i + 7) % 500);
  int* d_in = dev_copy(in.data(), n);
  int* d_acc = dev_alloc<int>(n);
  CK(cudaMemset(d_acc, 0, n * sizeof(int)));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int with_free = 1; with_free >= 0; with_free--) {
    cudaGraph_t g;
    CK(cudaGraphCreate(&g, 0));
    cudaMemAllocNodeParams p = {};
    p.poolProps.allocType = cudaMemAllocationTypePinned;
    p.poolProps.location.type = cudaMemLocationTypeDevice;
    p.poolProps.location.id = 0;
    p.bytesize = n * sizeof(int);
    cudaGraphNode_t a, k1, k2, f;
    CK(cudaGraphAddMemAllocNode(&a, g, nullptr, 0, &p));
    EXPECT_RESULT(p.dptr != nullptr, "alloc node gave no address");
    cudaMemAllocNodeParams back = {};
    CK(cudaGraphMemAllocNodeGetParams(a, &back));
    EXPECT_RESULT(back.dptr == p.dptr && back.bytesize == p.bytesize, "params %p %zu", back.dptr,
                  back.bytesize);
    int* tmp = (int*)p.dptr;
    int k = 3, nn = n;
    void* args1[] = {&tmp, &d_in, &k, &nn};
    cudaKernelNodeParams kp = {};
    kp.func = (void*)fill_scaled;
    kp.gridDim = dim3((n + 255) / 256);
    kp.blockDim = dim3(256);
    kp.kernelParams = args1;
    CK(cudaGraphAddKernelNode(&k1, g, &a, 1, &kp));
    void* args2[] = {&d_acc, &tmp, &nn};
    kp.func = (void*)add_from;
    kp.kernelParams = args2;
    CK(cudaGraphAddKernelNode(&k2, g, &k1, 1, &kp));
    if (with_free) {
      CK(cudaGraphAddMemFreeNode(&f, g, &k2, 1, p.dptr));
      void* freed = nullptr;
      CK(cudaGraphMemFreeNodeGetParams(f, &freed));
      EXPECT_RESULT(freed == p.dptr, "free node of %p, want %p", freed, p.dptr);
    }
    cudaGraphExec_t e;
    CK(cudaGraphInstantiate(&e, g, 0));
    CK(cudaGraphLaunch(e, s));
    if (with_free) {
      CK(cudaGraphLaunch(e, s));
    } else {
      cudaError_t again = cudaGraphLaunch(e, s);
      EXPECT_RESULT(again == cudaErrorInvalidValue, "relaunch with a live allocation: %s",
                    cudaGetErrorName(again));
      cudaGetLastError();
      CK(cudaFreeAsync(tmp, s));
      CK(cudaGraphLaunch(e, s));
      CK(cudaFreeAsync(tmp, s));
    }
    CK(cudaStreamSynchronize(s));
    CK(cudaGraphExecDestroy(e));
    CK(cudaGraphDestroy(g));
  }
  expect_acc(d_acc, in, 4, "nodes");
  std::printf("checked graph allocation and free nodes built node by node\n");
  CK(cudaStreamDestroy(s));
  CK(cudaFree(d_in));
  CK(cudaFree(d_acc));
}

// The generic form, cudaGraphAddNode: allocation, two kernels and a free, chained.
static void check_generic_nodes() {
  const int n = 2000;
  std::vector<int> in(n);
  for (int i = 0; i < n; i++) in[i] = (int)(khash(i + 11) % 300);
  int* d_in = dev_copy(in.data(), n);
  int* d_acc = dev_alloc<int>(n);
  CK(cudaMemset(d_acc, 0, n * sizeof(int)));
  cudaGraph_t g;
  CK(cudaGraphCreate(&g, 0));
  cudaGraphNodeParams a = {};
  a.type = cudaGraphNodeTypeMemAlloc;
  a.alloc.poolProps.allocType = cudaMemAllocationTypePinned;
  a.alloc.poolProps.location.type = cudaMemLocationTypeDevice;
  a.alloc.bytesize = n * sizeof(int);
  cudaGraphNode_t na, n1, n2, nf;
  CK(cudaGraphAddNode(&na, g, nullptr, nullptr, 0, &a));
  int* tmp = (int*)a.alloc.dptr;
  EXPECT_RESULT(tmp != nullptr, "generic alloc node gave no address");
  int k = 3, nn = n;
  void* args1[] = {&tmp, &d_in, &k, &nn};
  cudaGraphNodeParams kn = {};
  kn.type = cudaGraphNodeTypeKernel;
  kn.kernel.func = (void*)fill_scaled;
  kn.kernel.gridDim = dim3((n + 127) / 128);
  kn.kernel.blockDim = dim3(128);
  kn.kernel.kernelParams = args1;
  CK(cudaGraphAddNode(&n1, g, &na, nullptr, 1, &kn));
  void* args2[] = {&d_acc, &tmp, &nn};
  kn.kernel.func = (void*)add_from;
  kn.kernel.kernelParams = args2;
  CK(cudaGraphAddNode(&n2, g, &n1, nullptr, 1, &kn));
  cudaGraphNodeParams f = {};
  f.type = cudaGraphNodeTypeMemFree;
  f.free.dptr = tmp;
  CK(cudaGraphAddNode(&nf, g, &n2, nullptr, 1, &f));
  cudaGraphExec_t e;
  CK(cudaGraphInstantiate(&e, g, 0));
  for (int r = 0; r < 2; r++) CK(cudaGraphLaunch(e, 0));
  CK(cudaDeviceSynchronize());
  expect_acc(d_acc, in, 2, "generic");
  CK(cudaGraphExecDestroy(e));
  CK(cudaGraphDestroy(g));

  // Memset and memcpy nodes in the generic form: fill d_acc with 7, then copy it to pinned
  // host memory (the parameters sit at their offsets in the union of cudaGraphNodeParams).
  int* host = nullptr;
  CK(cudaMallocHost(&host, n * sizeof(int)));
  std::memset(host, 0, n * sizeof(int));
  CK(cudaGraphCreate(&g, 0));
  cudaGraphNodeParams ms = {};
  ms.type = cudaGraphNodeTypeMemset;
  ms.memset.dst = d_acc;
  ms.memset.value = 7;
  ms.memset.elementSize = sizeof(int);
  ms.memset.width = n;
  ms.memset.height = 1;
  cudaGraphNode_t nms, ncp;
  CK(cudaGraphAddNode(&nms, g, nullptr, nullptr, 0, &ms));
  cudaGraphNodeParams cp = {};
  cp.type = cudaGraphNodeTypeMemcpy;
  cp.memcpy.copyParams.srcPtr = make_cudaPitchedPtr(d_acc, n * sizeof(int), n, 1);
  cp.memcpy.copyParams.dstPtr = make_cudaPitchedPtr(host, n * sizeof(int), n, 1);
  cp.memcpy.copyParams.extent = make_cudaExtent(n * sizeof(int), 1, 1);
  cp.memcpy.copyParams.kind = cudaMemcpyDeviceToHost;
  CK(cudaGraphAddNode(&ncp, g, &nms, nullptr, 1, &cp));
  CK(cudaGraphInstantiate(&e, g, 0));
  CK(cudaGraphLaunch(e, 0));
  CK(cudaDeviceSynchronize());
  for (int i = 0; i < n; i++) {
    EXPECT_RESULT(host[i] == 7, "generic memset/memcpy nodes: wrong value");
  }
  CK(cudaGraphExecDestroy(e));
  CK(cudaGraphDestroy(g));
  CK(cudaFreeHost(host));
  std::printf("checked a graph built with cudaGraphAddNode\n");
  CK(cudaFree(d_in));
  CK(cudaFree(d_acc));
}

// Reading a kernel node's parameters (cudaGraphKernelNodeGetParams) and changing what an
// executable runs: a kernel node's arguments set in the executable
// (cudaGraphExecKernelNodeSetParams, as NVIDIA's jacobiCudaGraphs sample does), set in the
// graph and taken over by cudaGraphExecUpdate, and an update the executable cannot take.
__global__ void set_all(int* x, int v) { x[threadIdx.x] = v; }

static void check_exec_update() {
  const int n = 64;
  int *d = nullptr, host[n];
  CK(cudaMalloc(&d, n * sizeof(int)));
  int v = 1;
  void* args[] = {&d, &v};
  cudaKernelNodeParams kp = {};
  kp.func = (void*)set_all;
  kp.gridDim = dim3(1);
  kp.blockDim = dim3(n);
  kp.kernelParams = args;
  cudaGraph_t g;
  cudaGraphExec_t e;
  cudaGraphNode_t k;
  CK(cudaGraphCreate(&g, 0));
  CK(cudaGraphAddKernelNode(&k, g, nullptr, 0, &kp));
  CK(cudaGraphInstantiate(&e, g, 0));
  auto run_and_expect = [&](int want, const char* what) {
    CK(cudaGraphLaunch(e, 0));
    CK(cudaMemcpy(host, d, sizeof host, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) EXPECT_RESULT(host[i] == want, what);
  };
  run_and_expect(1, "exec update: the first launch");
  cudaKernelNodeParams got = {};
  CK(cudaGraphKernelNodeGetParams(k, &got));
  EXPECT_RESULT(got.gridDim.x == 1 && got.blockDim.x == (unsigned)n && got.sharedMemBytes == 0,
                "cudaGraphKernelNodeGetParams: dimensions");
  EXPECT_RESULT(*(int**)got.kernelParams[0] == d && *(int*)got.kernelParams[1] == 1,
                "cudaGraphKernelNodeGetParams: arguments");
  v = 2;  // the node copied its arguments: this changes nothing until they are set again
  run_and_expect(1, "exec update: arguments are copied when the node is made");
  CK(cudaGraphExecKernelNodeSetParams(e, k, &kp));
  run_and_expect(2, "exec update: cudaGraphExecKernelNodeSetParams");
  v = 3;
  CK(cudaGraphKernelNodeSetParams(k, &kp));
  run_and_expect(2, "exec update: the graph's node changed, the executable not yet");
  cudaGraphExecUpdateResultInfo info = {};
  CK(cudaGraphExecUpdate(e, g, &info));
  EXPECT_RESULT(info.result == cudaGraphExecUpdateSuccess, "exec update: result");
  run_and_expect(3, "exec update: cudaGraphExecUpdate");
  // Another node: the topology changed, the update is refused and the executable unchanged.
  cudaGraphNode_t k2;
  CK(cudaGraphAddKernelNode(&k2, g, &k, 1, &kp));
  cudaError_t r = cudaGraphExecUpdate(e, g, &info);
  EXPECT_RESULT(r == cudaErrorGraphExecUpdateFailure, "exec update: a new node is refused");
  EXPECT_RESULT(info.result == cudaGraphExecUpdateErrorTopologyChanged,
                "exec update: refused as a topology change");
  cudaGetLastError();
  run_and_expect(3, "exec update: a refused update leaves the executable as it was");
  CK(cudaGraphExecDestroy(e));
  CK(cudaGraphDestroy(g));
  CK(cudaFree(d));
  std::printf("checked cudaGraphExecKernelNodeSetParams and cudaGraphExecUpdate\n");
}

// A graph allocation that leaves the graph live (no free node) is freed by the application
// with cudaFree after the launch, as NVIDIA's graphMemoryNodes sample does; the next launch
// allocates it again.
static void check_mem_node_freed_outside() {
  const int n = 256;
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  int* out = nullptr;
  cudaGraph_t g;
  cudaGraphExec_t e;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CK(cudaMallocAsync((void**)&out, n * sizeof(int), s));
  set_all<<<1, n, 0, s>>>(out, 9);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&e, g, 0));
  int host[n];
  for (int round = 0; round < 2; round++) {
    CK(cudaGraphLaunch(e, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(host, out, sizeof host, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) EXPECT_RESULT(host[i] == 9, "graph allocation: wrong value");
    CK(cudaFree(out));
  }
  CK(cudaGraphExecDestroy(e));
  CK(cudaGraphDestroy(g));
  CK(cudaStreamDestroy(s));
  std::printf("freed a graph allocation with cudaFree after each launch\n");
}

KCHECK_MAIN({"capture_replay", check_capture_replay}, {"fork_join", check_fork_join},
            {"many_nodes", check_many_nodes}, {"malloc_async_capture", check_malloc_async_capture},
            {"mem_nodes", check_mem_nodes},
            {"generic_nodes", check_generic_nodes}, {"exec_update", check_exec_update},
            {"mem_node_freed_outside", check_mem_node_freed_outside})
