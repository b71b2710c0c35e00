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

// Records a result mismatch (reported only when verifying); prints the first few.
#define EXPECT_RESULT(cond, ...)                                                        \
  do {                                                                                  \
    if (g_verify && !(cond)) {                                                          \
      if (g_mismatches++ < 5) {                                                         \
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
