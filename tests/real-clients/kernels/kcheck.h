// Helpers for the nvcc-built kernel programs. Usage of every program: PROG [--launch-only]
// --launch-only: check that every launch returns cudaSuccess and synchronizes cleanly, but not
// the results (for servers whose GPU does not execute kernels yet).
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

#define CK(call)                                                                        \
  do {                                                                                  \
    cudaError_t ck_err_ = (call);                                                       \
    if (ck_err_ != cudaSuccess) {                                                       \
      std::fprintf(stderr, "FAIL %s:%d: %s returned %d (%s)\n", __FILE__, __LINE__,     \
                   #call, (int)ck_err_, cudaGetErrorName(ck_err_));                     \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

// After a launch: the launch itself and the work it queued both succeed.
#define CK_LAUNCH(what)                                                                 \
  do {                                                                                  \
    CK(cudaGetLastError());                                                             \
    CK(cudaDeviceSynchronize());                                                        \
    std::printf("launched %s\n", what);                                                 \
  } while (0)

static bool g_verify = true;
static int g_mismatches = 0;

static inline void parse_args(int argc, char** argv) {
  for (int i = 1; i < argc; i++) {
    if (std::strcmp(argv[i], "--launch-only") == 0) {
      g_verify = false;
    } else {
      std::fprintf(stderr, "FAIL: unknown argument %s\n", argv[i]);
      std::exit(2);
    }
  }
}

// How many mismatches are printed: 5, or KCHECK_REPORT=N from the environment.
static inline int report_limit() {
  static int limit = -1;
  if (limit < 0) {
    const char* e = std::getenv("KCHECK_REPORT");
    limit = e ? std::atoi(e) : 5;
  }
  return limit;
}

// Records a result mismatch (reported only when verifying); prints the first few.
#define EXPECT_RESULT(cond, ...)                                                        \
  do {                                                                                  \
    if (g_verify && !(cond)) {                                                          \
      if (g_mismatches++ < report_limit()) {                                            \
        std::fprintf(stderr, "MISMATCH %s:%d: %s: ", __FILE__, __LINE__, #cond);         \
        std::fprintf(stderr, __VA_ARGS__);                                              \
        std::fputc('\n', stderr);                                                       \
      }                                                                                 \
    }                                                                                   \
  } while (0)

static inline int finish(const char* name) {
  if (g_mismatches) {
    std::fprintf(stderr, "FAIL %s: %d result mismatches\n", name, g_mismatches);
    return 1;
  }
  std::printf(g_verify ? "PASS %s (results checked)\n" : "PASS %s (launches only)\n", name);
  return 0;
}

// ---- programs made of named checks -------------------------------------------------------------
// Usage: PROG [--launch-only] [CHECK...]   (no CHECK: every check, in order)
// Each check runs its kernels and records mismatches with EXPECT_RESULT; after it, the program
// prints "PASS CHECK (results checked)" (or "(launches only)"), or "FAIL CHECK: N result
// mismatches" on stderr. A check that hits a CUDA error exits at once (CK). The test suite runs
// one check per process: a fault poisons the process's context, as on a GPU.
struct KCheck {
  const char* name;
  void (*run)();
};

static inline int run_checks(int argc, char** argv, const KCheck* checks, int n) {
  bool any_named = false;
  for (int i = 1; i < argc; i++) {
    if (std::strcmp(argv[i], "--launch-only") == 0) {
      g_verify = false;
      continue;
    }
    any_named = true;
    bool known = false;
    for (int c = 0; c < n; c++) known = known || std::strcmp(argv[i], checks[c].name) == 0;
    if (!known) {
      std::fprintf(stderr, "FAIL: unknown check %s; checks:", argv[i]);
      for (int c = 0; c < n; c++) std::fprintf(stderr, " %s", checks[c].name);
      std::fputc('\n', stderr);
      std::exit(2);
    }
  }
  int failed = 0;
  for (int c = 0; c < n; c++) {
    bool selected = !any_named;
    for (int i = 1; i < argc && !selected; i++) selected = std::strcmp(argv[i], checks[c].name) == 0;
    if (!selected) continue;
    g_mismatches = 0;
    checks[c].run();
    std::fflush(stdout);
    if (finish(checks[c].name) != 0) failed++;
    std::fflush(stdout);
  }
  return failed ? 1 : 0;
}

#define KCHECK_MAIN(...)                                                                \
  int main(int argc, char** argv) {                                                     \
    static const KCheck checks[] = {__VA_ARGS__};                                       \
    return run_checks(argc, argv, checks, (int)(sizeof checks / sizeof checks[0]));     \
  }

// Deterministic pseudo-random numbers for inputs (same sequence on every run).
__host__ __device__ static inline unsigned int khash(unsigned int x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// Device buffer helpers.
template <typename T>
static T* dev_alloc(size_t n) {
  T* p = nullptr;
  CK(cudaMalloc(&p, n * sizeof(T)));
  return p;
}
template <typename T>
static T* dev_copy(const T* h, size_t n) {
  T* p = dev_alloc<T>(n);
  CK(cudaMemcpy(p, h, n * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}
template <typename T>
static void to_host(T* h, const T* d, size_t n) {
  CK(cudaMemcpy(h, d, n * sizeof(T), cudaMemcpyDeviceToHost));
}
