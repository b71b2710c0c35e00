// Conditional graph nodes (CUDA 12.4+): IF with an ELSE body, WHILE whose condition a kernel
// sets with cudaGraphSetConditional, a WHILE built by stream capture into the body graph
// (cudaStreamBeginCaptureToGraph), and SWITCH. cudaGraphSetConditional is a device-runtime
// function, so this program is built with relocatable device code (-rdc=true -lcudadevrt), as
// NVIDIA's graphConditionalNodes sample is.
#include <vector>
#include "../kernels/kcheck.h"

__global__ void set_condition(const int* v, cudaGraphConditionalHandle h) {
  cudaGraphSetConditional(h, *v);
}

__global__ void add_to(int* p, int x) { atomicAdd(p, x); }

// One step of a countdown: records the value, counts down, and keeps the loop going until 0.
__global__ void count_down(int* counter, int* seen, cudaGraphConditionalHandle h) {
  int c = *counter;
  seen[c] += 1;
  if (c > 0) *counter = c - 1;
  cudaGraphSetConditional(h, c > 1);
}

static int read_int(const int* d) {
  int v = 0;
  CK(cudaMemcpy(&v, d, sizeof v, cudaMemcpyDeviceToHost));
  return v;
}

static void add_kernel(cudaGraph_t g, cudaGraphNode_t* node, const cudaGraphNode_t* dep,
                       void* func, void** args) {
  cudaGraphNodeParams k = {};
  k.type = cudaGraphNodeTypeKernel;
  k.kernel.func = func;
  k.kernel.gridDim = dim3(1);
  k.kernel.blockDim = dim3(1);
  k.kernel.kernelParams = args;
  CK(cudaGraphAddNode(node, g, dep, nullptr, dep ? 1 : 0, &k));
}

// IF/ELSE: a kernel sets the condition from device memory, then the node runs body 0 (adds 1)
// when it is nonzero and body 1 (adds 100) when it is zero.
static void check_if_else() {
  int* flag = dev_alloc<int>(1);
  int* acc = dev_alloc<int>(1);
  CK(cudaMemset(acc, 0, sizeof(int)));
  cudaGraph_t g;
  CK(cudaGraphCreate(&g, 0));
  cudaGraphConditionalHandle h;
  CK(cudaGraphConditionalHandleCreate(&h, g));
  cudaGraphNode_t set, cond, n1, n2;
  void* set_args[] = {&flag, &h};
  add_kernel(g, &set, nullptr, (void*)set_condition, set_args);
  cudaGraphNodeParams c = {};
  c.type = cudaGraphNodeTypeConditional;
  c.conditional.handle = h;
  c.conditional.type = cudaGraphCondTypeIf;
  c.conditional.size = 2;
  CK(cudaGraphAddNode(&cond, g, &set, nullptr, 1, &c));
  cudaGraph_t then_body = c.conditional.phGraph_out[0], else_body = c.conditional.phGraph_out[1];
  int one = 1, hundred = 100;
  void* then_args[] = {&acc, &one};
  void* else_args[] = {&acc, &hundred};
  add_kernel(then_body, &n1, nullptr, (void*)add_to, then_args);
  add_kernel(else_body, &n2, nullptr, (void*)add_to, else_args);
  cudaGraphExec_t e;
  CK(cudaGraphInstantiate(&e, g, 0));
  int want = 0;
  for (int v : {1, 0, 7, 0, 0}) {
    CK(cudaMemcpy(flag, &v, sizeof v, cudaMemcpyHostToDevice));
    CK(cudaGraphLaunch(e, 0));
    CK(cudaDeviceSynchronize());
    want += v ? 1 : 100;
    int got = read_int(acc);
    EXPECT_RESULT(got == want, "if/else with condition %d: %d, want %d", v, got, want);
  }
  CK(cudaGraphExecDestroy(e));
  CK(cudaGraphDestroy(g));
  CK(cudaFree(flag));
  CK(cudaFree(acc));
  std::printf("checked IF/ELSE over 5 launches\n");
}

// WHILE with CU_GRAPH_COND_ASSIGN_DEFAULT 1: the body runs at least once (a do-while) and
// counts down until its kernel sets the condition to 0.
static void check_while_loop() {
  int* counter = dev_alloc<int>(1);
  int* seen = dev_alloc<int>(16);
  CK(cudaMemset(seen, 0, 16 * sizeof(int)));
  cudaGraph_t g;
  CK(cudaGraphCreate(&g, 0));
  cudaGraphConditionalHandle h;
  CK(cudaGraphConditionalHandleCreate(&h, g, 1, cudaGraphCondAssignDefault));
  cudaGraphNode_t cond, body_node;
  cudaGraphNodeParams c = {};
  c.type = cudaGraphNodeTypeConditional;
  c.conditional.handle = h;
  c.conditional.type = cudaGraphCondTypeWhile;
  c.conditional.size = 1;
  CK(cudaGraphAddNode(&cond, g, nullptr, nullptr, 0, &c));
  void* args[] = {&counter, &seen, &h};
  add_kernel(c.conditional.phGraph_out[0], &body_node, nullptr, (void*)count_down, args);
  cudaGraphExec_t e;
  CK(cudaGraphInstantiate(&e, g, 0));
  for (int start : {10, 3}) {
    CK(cudaMemcpy(counter, &start, sizeof start, cudaMemcpyHostToDevice));
    CK(cudaGraphLaunch(e, 0));
    CK(cudaDeviceSynchronize());
    EXPECT_RESULT(read_int(counter) == 0, "while from %d ended at %d", start, read_int(counter));
  }
  std::vector<int> got(16);
  CK(cudaMemcpy(got.data(), seen, 16 * sizeof(int), cudaMemcpyDeviceToHost));
  for (int i = 0; i < 16; i++) {
    int want = (i >= 1 && i <= 10) + (i >= 1 && i <= 3);
    EXPECT_RESULT(got[i] == want, "countdown value %d seen %d times, want %d", i, got[i], want);
  }
  CK(cudaGraphExecDestroy(e));
  CK(cudaGraphDestroy(g));
  CK(cudaFree(counter));
  CK(cudaFree(seen));
  std::printf("checked a WHILE loop of 10 and of 3 turns\n");
}

// A WHILE node added to a graph under stream capture, its body filled by capturing into it.
static void check_captured_while() {
  int* counter = dev_alloc<int>(1);
  int* seen = dev_alloc<int>(16);
  int* after = dev_alloc<int>(1);
  CK(cudaMemset(seen, 0, 16 * sizeof(int)));
  CK(cudaMemset(after, 0, sizeof(int)));
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  cudaStreamCaptureStatus status;
  cudaGraph_t g = nullptr;
  const cudaGraphNode_t* deps = nullptr;
  size_t ndeps = 0;
  CK(cudaStreamGetCaptureInfo(s, &status, nullptr, &g, &deps, nullptr, &ndeps));
  EXPECT_RESULT(g != nullptr, "no graph from cudaStreamGetCaptureInfo");
  cudaGraphConditionalHandle h;
  CK(cudaGraphConditionalHandleCreate(&h, g, 1, cudaGraphCondAssignDefault));
  CK(cudaStreamGetCaptureInfo(s, &status, nullptr, &g, &deps, nullptr, &ndeps));
  cudaGraphNode_t cond;
  cudaGraphNodeParams c = {};
  c.type = cudaGraphNodeTypeConditional;
  c.conditional.handle = h;
  c.conditional.type = cudaGraphCondTypeWhile;
  c.conditional.size = 1;
  CK(cudaGraphAddNode(&cond, g, deps, nullptr, ndeps, &c));
  cudaGraph_t body = c.conditional.phGraph_out[0];
  CK(cudaStreamUpdateCaptureDependencies(s, &cond, nullptr, 1, cudaStreamSetCaptureDependencies));
  add_to<<<1, 1, 0, s>>>(after, 1);
  cudaGraph_t captured;
  CK(cudaStreamEndCapture(s, &captured));
  EXPECT_RESULT(captured == g, "the capture ended with another graph");
  cudaStream_t bs;
  CK(cudaStreamCreate(&bs));
  CK(cudaStreamBeginCaptureToGraph(bs, body, nullptr, nullptr, 0, cudaStreamCaptureModeGlobal));
  count_down<<<1, 1, 0, bs>>>(counter, seen, h);
  CK(cudaStreamEndCapture(bs, nullptr));
  cudaGraphExec_t e;
  CK(cudaGraphInstantiate(&e, captured, 0));
  int start = 5;
  CK(cudaMemcpy(counter, &start, sizeof start, cudaMemcpyHostToDevice));
  CK(cudaGraphLaunch(e, s));
  CK(cudaStreamSynchronize(s));
  std::vector<int> got(16);
  CK(cudaMemcpy(got.data(), seen, 16 * sizeof(int), cudaMemcpyDeviceToHost));
  for (int i = 0; i < 16; i++)
    EXPECT_RESULT(got[i] == (i >= 1 && i <= 5), "value %d seen %d times", i, got[i]);
  EXPECT_RESULT(read_int(after) == 1, "the kernel after the loop ran %d times", read_int(after));
  CK(cudaGraphExecDestroy(e));
  CK(cudaGraphDestroy(captured));
  CK(cudaStreamDestroy(s));
  CK(cudaStreamDestroy(bs));
  CK(cudaFree(counter));
  CK(cudaFree(seen));
  CK(cudaFree(after));
  std::printf("checked a captured WHILE loop of 5 turns\n");
}

// SWITCH of 3 bodies: body n adds 10^n; a value of 3 or more runs none.
static void check_switch() {
  int* value = dev_alloc<int>(1);
  int* acc = dev_alloc<int>(1);
  CK(cudaMemset(acc, 0, sizeof(int)));
  cudaGraph_t g;
  CK(cudaGraphCreate(&g, 0));
  cudaGraphConditionalHandle h;
  CK(cudaGraphConditionalHandleCreate(&h, g));
  cudaGraphNode_t set, cond, nodes[3];
  void* set_args[] = {&value, &h};
  add_kernel(g, &set, nullptr, (void*)set_condition, set_args);
  cudaGraphNodeParams c = {};
  c.type = cudaGraphNodeTypeConditional;
  c.conditional.handle = h;
  c.conditional.type = cudaGraphCondTypeSwitch;
  c.conditional.size = 3;
  CK(cudaGraphAddNode(&cond, g, &set, nullptr, 1, &c));
  int adds[3] = {1, 10, 100};
  void* args[3][2];
  for (int i = 0; i < 3; i++) {
    args[i][0] = &acc;
    args[i][1] = &adds[i];
    add_kernel(c.conditional.phGraph_out[i], &nodes[i], nullptr, (void*)add_to, args[i]);
  }
  cudaGraphExec_t e;
  CK(cudaGraphInstantiate(&e, g, 0));
  int want = 0;
  for (int v : {2, 0, 5, 1, 1}) {
    CK(cudaMemcpy(value, &v, sizeof v, cudaMemcpyHostToDevice));
    CK(cudaGraphLaunch(e, 0));
    CK(cudaDeviceSynchronize());
    want += v < 3 ? adds[v] : 0;
    int got = read_int(acc);
    EXPECT_RESULT(got == want, "switch on %d: %d, want %d", v, got, want);
  }
  CK(cudaGraphExecDestroy(e));
  CK(cudaGraphDestroy(g));
  CK(cudaFree(value));
  CK(cudaFree(acc));
  std::printf("checked SWITCH over 5 launches\n");
}

KCHECK_MAIN({"if_else", check_if_else}, {"while_loop", check_while_loop},
            {"captured_while", check_captured_while}, {"switch", check_switch})
