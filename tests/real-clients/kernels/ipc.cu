// CUDA IPC between two processes, each its own gpufuse session: device memory and an
// interprocess event exported by this process, opened by a child it starts (this program
// again, as NVIDIA's simpleIPC starts its children), used by both.
#include "kcheck.h"

#include <spawn.h>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

__global__ void fill(int* p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = i;
}

__global__ void twice_plus_one(int* p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = 2 * p[i] + 1;
}

__global__ void count(int* counter, int times) {
  for (int k = 0; k < times; k++) atomicAdd(counter, 1);
}

static const int N = 1 << 18;

static std::string hex(const void* p, size_t n) {
  std::string s;
  char b[3];
  for (size_t i = 0; i < n; i++) {
    std::snprintf(b, sizeof b, "%02x", ((const unsigned char*)p)[i]);
    s += b;
  }
  return s;
}

static bool unhex(const char* s, void* out, size_t n) {
  if (std::strlen(s) != 2 * n) return false;
  for (size_t i = 0; i < n; i++) {
    unsigned v;
    if (std::sscanf(s + 2 * i, "%2x", &v) != 1) return false;
    ((unsigned char*)out)[i] = (unsigned char)v;
  }
  return true;
}

// Runs this program again with `args`; returns its exit status.
static int run_child(const char* mode, const std::string& a, const std::string& b) {
  const char* argv[] = {"ipc-child", mode, a.c_str(), b.c_str(), nullptr};
  pid_t pid;
  if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, (char* const*)argv, environ) != 0) {
    std::fprintf(stderr, "FAIL: cannot start the child\n");
    std::exit(1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  std::fflush(stdout);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

// The child: opens the memory and the event, waits for the event, doubles every element plus
// one, counts to 5000 atomically in the last word's neighbour, records the event.
static int child_use(const char* mem_hex, const char* ev_hex) {
  cudaIpcMemHandle_t mh;
  cudaIpcEventHandle_t eh;
  if (!unhex(mem_hex, &mh, sizeof mh) || !unhex(ev_hex, &eh, sizeof eh)) return 3;
  size_t free_before, free_after, total;
  CK(cudaMemGetInfo(&free_before, &total));
  int* p = nullptr;
  CK(cudaIpcOpenMemHandle((void**)&p, mh, cudaIpcMemLazyEnablePeerAccess));
  // A second open in the same context: the same pointer, one more close (CUDA's refcount).
  int* again = nullptr;
  CK(cudaIpcOpenMemHandle((void**)&again, mh, cudaIpcMemLazyEnablePeerAccess));
  EXPECT_RESULT(again == p, "a second open gave %p, the first %p", (void*)again, (void*)p);
  CK(cudaIpcCloseMemHandle(again));
  cudaEvent_t ev;
  CK(cudaIpcOpenEventHandle(&ev, eh));
  CK(cudaMemGetInfo(&free_after, &total));
  EXPECT_RESULT(free_after == free_before, "opening charged the child %zu bytes",
                free_before - free_after);
  EXPECT_RESULT(cudaFree(p) != cudaSuccess, "cudaFree of opened memory succeeded");
  cudaGetLastError();
  CK(cudaStreamWaitEvent(0, ev, 0));
  twice_plus_one<<<(N + 255) / 256, 256>>>(p, N);
  count<<<4, 64>>>(p + N, 5000 / 256 + 1);
  CK(cudaGetLastError());
  CK(cudaEventRecord(ev, 0));
  CK(cudaIpcCloseMemHandle(p));
  EXPECT_RESULT(cudaIpcCloseMemHandle(p) != cudaSuccess, "closed twice");
  cudaGetLastError();
  CK(cudaEventDestroy(ev));
  std::printf("child: opened, used and closed the parent's memory and event\n");
  return g_mismatches ? 1 : 0;
}

// A child given a handle whose memory was freed: opening it fails.
static int child_stale(const char* mem_hex) {
  cudaIpcMemHandle_t mh;
  if (!unhex(mem_hex, &mh, sizeof mh)) return 3;
  int* p = nullptr;
  cudaError_t e = cudaIpcOpenMemHandle((void**)&p, mh, cudaIpcMemLazyEnablePeerAccess);
  std::printf("child: a freed export opens with %d (%s)\n", (int)e, cudaGetErrorName(e));
  return e == cudaSuccess ? 1 : 0;
}

static void check_memory_and_events() {
  // One word past the N elements holds the child's atomic count.
  int* d = nullptr;
  CK(cudaMalloc(&d, (N + 1) * sizeof(int)));
  fill<<<(N + 255) / 256, 256>>>(d, N);
  CK(cudaMemset(d + N, 0, sizeof(int)));
  CK(cudaDeviceSynchronize());
  cudaIpcMemHandle_t mh;
  CK(cudaIpcGetMemHandle(&mh, d));
  cudaIpcMemHandle_t again;
  CK(cudaIpcGetMemHandle(&again, d));
  EXPECT_RESULT(std::memcmp(&mh, &again, sizeof mh) == 0, "a second export gave another handle");
  EXPECT_RESULT(cudaIpcGetMemHandle(&again, d + 1) != cudaSuccess,
                "exported a pointer that is not an allocation's base");
  cudaGetLastError();
  int* self_opened = nullptr;
  EXPECT_RESULT(cudaIpcOpenMemHandle((void**)&self_opened, mh, cudaIpcMemLazyEnablePeerAccess) !=
                    cudaSuccess,
                "a process opened its own handle");
  cudaGetLastError();

  cudaEvent_t timed, ev;
  CK(cudaEventCreate(&timed));
  cudaIpcEventHandle_t eh;
  EXPECT_RESULT(cudaIpcGetEventHandle(&eh, timed) != cudaSuccess,
                "exported an event that is not interprocess");
  cudaGetLastError();
  EXPECT_RESULT(cudaEventCreateWithFlags(&ev, cudaEventInterprocess) != cudaSuccess,
                "an interprocess event with timing");
  cudaGetLastError();
  CK(cudaEventCreateWithFlags(&ev, cudaEventInterprocess | cudaEventDisableTiming));
  CK(cudaIpcGetEventHandle(&eh, ev));
  CK(cudaEventRecord(ev, 0));

  int rc = run_child("use", hex(&mh, sizeof mh), hex(&eh, sizeof eh));
  EXPECT_RESULT(rc == 0, "the child exited with %d", rc);
  // The child's record is the event's latest: wait for it, then read what the child wrote.
  CK(cudaStreamWaitEvent(0, ev, 0));
  CK(cudaEventSynchronize(ev));
  int* h = (int*)std::malloc((N + 1) * sizeof(int));
  CK(cudaMemcpy(h, d, (N + 1) * sizeof(int), cudaMemcpyDeviceToHost));
  for (int i = 0; i < N; i++)
    EXPECT_RESULT(h[i] == 2 * i + 1, "d[%d] = %d, want %d", i, h[i], 2 * i + 1);
  int want = 4 * 64 * (5000 / 256 + 1);
  EXPECT_RESULT(h[N] == want, "the child's atomics counted %d, want %d", h[N], want);
  // This process's kernels still use the memory after the child closed it.
  twice_plus_one<<<(N + 255) / 256, 256>>>(d, N);
  CK(cudaMemcpy(h, d, 16 * sizeof(int), cudaMemcpyDeviceToHost));
  for (int i = 0; i < 16; i++)
    EXPECT_RESULT(h[i] == 4 * i + 3, "after: d[%d] = %d, want %d", i, h[i], 4 * i + 3);
  std::free(h);
  CK(cudaEventDestroy(ev));
  CK(cudaEventDestroy(timed));
  CK(cudaFree(d));
  rc = run_child("stale", hex(&mh, sizeof mh), "-");
  EXPECT_RESULT(rc == 0, "a freed export opened in another process (child exit %d)", rc);
  std::printf("checked %d ints a child process changed through IPC memory and events\n", N);
}

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "use") == 0) return child_use(argv[2], argv[3]);
  if (argc == 4 && std::strcmp(argv[1], "stale") == 0) return child_stale(argv[2]);
  static const KCheck checks[] = {{"memory_and_events", check_memory_and_events}};
  return run_checks(argc, argv, checks, 1);
}
