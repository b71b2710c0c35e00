/* rt_tests: CUDA runtime API checks through whatever libcuda.so.1 the loader finds.
 * Usage: rt_tests [CHECK...]   (no argument or "all": every check except hold_1gib)
 * Prints "PASS <check>" per check; exits 1 with "FAIL ..." on stderr on the first mismatch. */
#include <string.h>
#include <unistd.h>

#include "rt.h"

struct check {
  const char *name;
  void (*run)(void);
  int in_all;
};

static const struct check checks[] = {
    {"device_props", check_device_props, 1},
    {"alloc_free", check_alloc_free, 1},
    {"memcpy_all_directions", check_memcpy_all_directions, 1},
    {"memset", check_memset, 1},
    {"memcpy_2d", check_memcpy_2d, 1},
    {"pinned_host", check_pinned_host, 1},
    {"mem_info", check_mem_info, 1},
    {"pointer_attributes", check_pointer_attributes, 1},
    {"streams", check_streams, 1},
    {"events", check_events, 1},
    {"async_stream_order", check_async_stream_order, 1},
    {"error_paths", check_error_paths, 1},
    {"threads", check_threads, 1},
    {"device_reset", check_device_reset, 1},
    {"graph_nodes", check_graph_nodes, 1},
    {"pinned_zero_copy", check_pinned_zero_copy, 1},
    {"thread_exit_calls", check_thread_exit_calls, 1},
    {"vram_limit", check_vram_limit, 0},
    {"hold_1gib", hold_1gib, 0},
    {"hold_managed", hold_managed, 0},
    {"hold_until_stdin", hold_until_stdin, 0},
    {"leave_dirty_memory", leave_dirty_memory, 0},
    {"expect_zeroed_memory", expect_zeroed_memory, 0},
    {"churn", churn, 0},
    {"sync_until_error", sync_until_error, 0},
};

static void run_one(const struct check *c) {
  c->run();
  printf("PASS %s\n", c->name);
  fflush(stdout);
}

int main(int argc, char **argv) {
  int runtime = 0, driver = 0;
  CK(cudaRuntimeGetVersion(&runtime));
  CK(cudaDriverGetVersion(&driver));
  printf("runtime=%d driver=%d\n", runtime, driver);
  EXPECT(driver >= runtime, "driver version %d older than runtime %d", driver, runtime);

  size_t n = sizeof checks / sizeof checks[0];
  if (argc < 2 || strcmp(argv[1], "all") == 0) {
    for (size_t i = 0; i < n; i++)
      if (checks[i].in_all) run_one(&checks[i]);
    return 0;
  }
  for (int a = 1; a < argc; a++) {
    size_t i = 0;
    while (i < n && strcmp(checks[i].name, argv[a]) != 0) i++;
    if (i == n) {
      fprintf(stderr, "FAIL: unknown check %s\n", argv[a]);
      return 2;
    }
    run_one(&checks[i]);
  }
  return 0;
}

void check_device_props(void) {
  int count = 0, dev = -1;
  CK(cudaGetDeviceCount(&count));
  EXPECT(count >= 1, "device count %d", count);
  CK(cudaSetDevice(0));
  CK(cudaGetDevice(&dev));
  EXPECT(dev == 0, "current device %d", dev);

  struct cudaDeviceProp p;
  memset(&p, 0, sizeof p);
  CK(cudaGetDeviceProperties(&p, 0));
  printf("name=%s\n", p.name);
  printf("cc=%d.%d\n", p.major, p.minor);
  printf("totalGlobalMem=%zu\n", p.totalGlobalMem);
  EXPECT(strlen(p.name) > 0, "empty device name");
  EXPECT(p.major * 10 + p.minor >= 80, "compute capability %d.%d < 8.0", p.major, p.minor);
  EXPECT(p.warpSize == 32, "warpSize %d", p.warpSize);
  EXPECT(p.maxThreadsPerBlock >= 256 && p.maxThreadsPerBlock <= 1024, "maxThreadsPerBlock %d",
         p.maxThreadsPerBlock);
  EXPECT(p.maxThreadsDim[0] >= 256 && p.maxThreadsDim[1] >= 1 && p.maxThreadsDim[2] >= 1,
         "maxThreadsDim %d %d %d", p.maxThreadsDim[0], p.maxThreadsDim[1], p.maxThreadsDim[2]);
  EXPECT(p.maxGridSize[0] >= 65535 && p.maxGridSize[1] >= 1 && p.maxGridSize[2] >= 1,
         "maxGridSize %d %d %d", p.maxGridSize[0], p.maxGridSize[1], p.maxGridSize[2]);
  EXPECT(p.multiProcessorCount >= 1, "multiProcessorCount %d", p.multiProcessorCount);
  EXPECT(p.sharedMemPerBlock >= 16 * 1024, "sharedMemPerBlock %zu", p.sharedMemPerBlock);
  EXPECT(p.regsPerBlock > 0, "regsPerBlock %d", p.regsPerBlock);
  EXPECT(p.maxThreadsPerMultiProcessor >= p.maxThreadsPerBlock, "maxThreadsPerMultiProcessor %d",
         p.maxThreadsPerMultiProcessor);
  EXPECT(p.unifiedAddressing == 1, "unifiedAddressing %d", p.unifiedAddressing);
  EXPECT(p.totalGlobalMem > 0, "totalGlobalMem 0");

  size_t free_b = 0, total_b = 0;
  CK(cudaMemGetInfo(&free_b, &total_b));
  EXPECT(total_b == p.totalGlobalMem, "cudaMemGetInfo total %zu != totalGlobalMem %zu", total_b,
         p.totalGlobalMem);
  EXPECT(free_b <= total_b, "free %zu > total %zu", free_b, total_b);

  int attr = 0;
  CK(cudaDeviceGetAttribute(&attr, cudaDevAttrWarpSize, 0));
  EXPECT(attr == 32, "cudaDevAttrWarpSize %d", attr);
  CK(cudaDeviceGetAttribute(&attr, cudaDevAttrComputeCapabilityMajor, 0));
  EXPECT(attr == p.major, "cudaDevAttrComputeCapabilityMajor %d != %d", attr, p.major);
  CK(cudaDeviceGetAttribute(&attr, cudaDevAttrMultiProcessorCount, 0));
  EXPECT(attr == p.multiProcessorCount, "cudaDevAttrMultiProcessorCount %d != %d", attr,
         p.multiProcessorCount);

  /* A device ordinal that does not exist is refused. */
  cudaError_t e = cudaGetDeviceProperties(&p, count + 7);
  EXPECT(e == cudaErrorInvalidDevice, "cudaGetDeviceProperties(count+7) returned %d (%s)", (int)e,
         cudaGetErrorName(e));
  (void)cudaGetLastError();
}

void check_error_paths(void) {
  /* An impossible allocation fails with cudaErrorMemoryAllocation and the process goes on. */
  void *p = (void *)0x1;
  size_t pib = (size_t)1 << 50;
  cudaError_t e = cudaMalloc(&p, pib);
  EXPECT(e == cudaErrorMemoryAllocation, "cudaMalloc(1 PiB) returned %d (%s)", (int)e,
         cudaGetErrorName(e));
  e = cudaGetLastError();
  EXPECT(e == cudaErrorMemoryAllocation, "cudaGetLastError after the failed malloc: %d (%s)",
         (int)e, cudaGetErrorName(e));
  EXPECT(cudaGetLastError() == cudaSuccess, "cudaGetLastError did not clear the error");

  /* Freeing something that was never allocated is an error, not a crash. */
  e = cudaFree((void *)(uintptr_t)0x7f0000001230ull);
  EXPECT(e != cudaSuccess, "cudaFree of a bogus pointer returned cudaSuccess");
  (void)cudaGetLastError();

  /* Copying to a bogus device pointer is an error. */
  char host[64] = {0};
  e = cudaMemcpy((void *)(uintptr_t)0x7f0000001230ull, host, sizeof host, cudaMemcpyHostToDevice);
  EXPECT(e != cudaSuccess, "cudaMemcpy to a bogus device pointer returned cudaSuccess");
  (void)cudaGetLastError();

  /* The context still works afterwards. */
  void *d = NULL;
  CK(cudaMalloc(&d, 1 * MiB));
  char buf[4096], back[4096];
  fill_pattern(buf, sizeof buf, 99);
  CK(cudaMemcpy(d, buf, sizeof buf, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(back, d, sizeof back, cudaMemcpyDeviceToHost));
  expect_same(buf, back, sizeof buf, "round trip after errors");
  CK(cudaFree(d));
  CK(cudaDeviceSynchronize());

  /* cudaFree(NULL) is a no-op success (the "cudaFree(0) creates the context" idiom). */
  CK(cudaFree(NULL));
}

void check_device_reset(void) {
  size_t free0 = 0, total0 = 0;
  void *d = NULL;
  CK(cudaMalloc(&d, 64 * MiB)); /* make sure the context exists before the baseline */
  CK(cudaFree(d));
  CK(cudaMemGetInfo(&free0, &total0));

  void *a = NULL, *b = NULL;
  CK(cudaMalloc(&a, 128 * MiB));
  CK(cudaMalloc(&b, 32 * MiB));
  CK(cudaDeviceReset());

  /* After a reset the runtime makes a fresh context on demand; allocations were released. */
  size_t free1 = 0, total1 = 0;
  CK(cudaMemGetInfo(&free1, &total1));
  EXPECT(total1 == total0, "total changed over reset: %zu -> %zu", total0, total1);
  EXPECT(free1 + 16 * MiB >= free0, "memory not released by cudaDeviceReset: free %zu -> %zu",
         free0, free1);

  void *c = NULL;
  CK(cudaMalloc(&c, 8 * MiB));
  unsigned char *h = xmalloc(8 * MiB), *r = xmalloc(8 * MiB);
  fill_pattern(h, 8 * MiB, 5);
  CK(cudaMemcpy(c, h, 8 * MiB, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(r, c, 8 * MiB, cudaMemcpyDeviceToHost));
  expect_same(h, r, 8 * MiB, "round trip after cudaDeviceReset");
  CK(cudaFree(c));

  /* Two resets in a row, then cudaSetDevice: NVIDIA's driver accepts it (the runtime reuses the
   * primary context's handle, which stays valid across a reset). */
  CK(cudaDeviceReset());
  CK(cudaDeviceReset());
  CK(cudaSetDevice(0));
  CK(cudaMalloc(&c, 8 * MiB));
  CK(cudaMemcpy(c, h, 8 * MiB, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(r, c, 8 * MiB, cudaMemcpyDeviceToHost));
  expect_same(h, r, 8 * MiB, "round trip after two resets and cudaSetDevice");
  CK(cudaFree(c));
  free(h);
  free(r);
}

/* Run under `gpufuse run --vram SIZE`: the session sees SIZE as the device's memory and cannot
 * allocate past it. Prints total= for the test to compare with SIZE. */
void check_vram_limit(void) {
  struct cudaDeviceProp p;
  size_t free_b = 0, total_b = 0;
  CK(cudaGetDeviceProperties(&p, 0));
  CK(cudaMemGetInfo(&free_b, &total_b));
  printf("total=%zu\n", total_b);
  printf("totalGlobalMem=%zu\n", p.totalGlobalMem);
  EXPECT(p.totalGlobalMem == total_b, "totalGlobalMem %zu != cudaMemGetInfo total %zu",
         p.totalGlobalMem, total_b);
  EXPECT(free_b <= total_b, "free %zu > total %zu", free_b, total_b);

  /* Half of it fits; then more than what is left does not, and the process goes on. */
  void *half = NULL, *more = NULL;
  CK(cudaMalloc(&half, total_b / 2));
  cudaError_t e = cudaMalloc(&more, total_b / 2 + 64 * MiB);
  EXPECT(e == cudaErrorMemoryAllocation, "allocating past the limit returned %d (%s)", (int)e,
         cudaGetErrorName(e));
  (void)cudaGetLastError();
  e = cudaMalloc(&more, total_b + 1);
  EXPECT(e == cudaErrorMemoryAllocation, "allocating more than the limit returned %d (%s)",
         (int)e, cudaGetErrorName(e));
  (void)cudaGetLastError();
  size_t free2 = 0, total2 = 0;
  CK(cudaMemGetInfo(&free2, &total2));
  EXPECT(total2 == total_b && free2 + total_b / 2 <= free_b + MiB,
         "after allocating half: free %zu total %zu (before: free %zu)", free2, total2, free_b);
  CK(cudaFree(half));
  CK(cudaMalloc(&more, total_b / 2 + 64 * MiB));
  CK(cudaFree(more));
}

/* For the crash-cleanup test: allocate 1 GiB (touched), say so, then sleep until killed. */
void hold_1gib(void) {
  void *d = NULL;
  CK(cudaMalloc(&d, 1 * GiB));
  CK(cudaMemset(d, 0x5a, 1 * MiB));
  CK(cudaDeviceSynchronize());
  printf("READY pid=%d\n", (int)getpid());
  fflush(stdout);
  for (int i = 0; i < 600; i++) sleep(1);
  fprintf(stderr, "FAIL: hold_1gib was not killed within 10 minutes\n");
  exit(1);
}

/* The same with 256 MiB of managed memory, written by the host and the device (on the
 * shared-memory transport, pages the client shares with its worker). */
void hold_managed(void) {
  unsigned char *m = NULL;
  CK(cudaMallocManaged((void **)&m, 256 * MiB, cudaMemAttachGlobal));
  memset(m, 0x11, 1 * MiB);
  CK(cudaMemset(m + MiB, 0x5a, 1 * MiB));
  CK(cudaDeviceSynchronize());
  EXPECT(m[0] == 0x11 && m[MiB] == 0x5a, "managed bytes %#x %#x", m[0], m[MiB]);
  printf("READY pid=%d\n", (int)getpid());
  fflush(stdout);
  for (int i = 0; i < 600; i++) sleep(1);
  fprintf(stderr, "FAIL: hold_managed was not killed within 10 minutes\n");
  exit(1);
}

/* For `gpufuse kill`: allocate 1 GiB (touched), say so, wait for a line on stdin, then report
 * what the next CUDA calls return ("AFTER memset=<name> sync=<name>") and exit 0. */
void hold_until_stdin(void) {
  void *d = NULL;
  char line[16];
  CK(cudaMalloc(&d, 1 * GiB));
  CK(cudaMemset(d, 0x5a, 1 * MiB));
  CK(cudaDeviceSynchronize());
  printf("READY pid=%d\n", (int)getpid());
  fflush(stdout);
  EXPECT(fgets(line, sizeof line, stdin) != NULL, "stdin closed before the go-ahead");
  cudaError_t m = cudaMemset(d, 0, 1 * MiB);
  cudaError_t s = cudaDeviceSynchronize();
  printf("AFTER memset=%s sync=%s\n", cudaGetErrorName(m), cudaGetErrorName(s));
  fflush(stdout);
  exit(0);
}
