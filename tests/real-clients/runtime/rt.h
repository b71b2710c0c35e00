/* Shared helpers for the CUDA runtime API checks (host code only; built with gcc against
 * libcudart 12.9 and 13.5). Every check exits non-zero with a message on the first mismatch. */
#ifndef GPUFUSE_RT_H
#define GPUFUSE_RT_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(call)                                                                        \
  do {                                                                                  \
    cudaError_t ck_err_ = (call);                                                       \
    if (ck_err_ != cudaSuccess) {                                                       \
      fprintf(stderr, "FAIL %s:%d: %s returned %d (%s)\n", __FILE__, __LINE__, #call,   \
              (int)ck_err_, cudaGetErrorName(ck_err_));                                  \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

#define EXPECT(cond, ...)                                                               \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      fprintf(stderr, "FAIL %s:%d: expected %s: ", __FILE__, __LINE__, #cond);          \
      fprintf(stderr, __VA_ARGS__);                                                     \
      fputc('\n', stderr);                                                              \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

/* Deterministic pseudo-random bytes, different per seed. */
static inline void fill_pattern(void *buf, size_t n, uint64_t seed) {
  unsigned char *p = (unsigned char *)buf;
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x1234567ull;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = (unsigned char)(x >> 24);
  }
}

/* Exits with the first differing offset when a != b. */
static inline void expect_same(const void *a, const void *b, size_t n, const char *what) {
  const unsigned char *x = (const unsigned char *)a, *y = (const unsigned char *)b;
  for (size_t i = 0; i < n; i++) {
    if (x[i] != y[i]) {
      fprintf(stderr, "FAIL %s: byte %zu of %zu differs: got 0x%02x, want 0x%02x\n", what, i, n,
              y[i], x[i]);
      exit(1);
    }
  }
}

static inline void expect_all(const void *a, unsigned char v, size_t n, const char *what) {
  const unsigned char *x = (const unsigned char *)a;
  for (size_t i = 0; i < n; i++) {
    if (x[i] != v) {
      fprintf(stderr, "FAIL %s: byte %zu of %zu is 0x%02x, want 0x%02x\n", what, i, n, x[i], v);
      exit(1);
    }
  }
}

static inline void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) {
    fprintf(stderr, "FAIL: host malloc(%zu)\n", n);
    exit(1);
  }
  return p;
}

/* The checks, one per area (names as given on the command line). */
void check_device_props(void);
void check_alloc_free(void);
void check_memcpy_all_directions(void);
void check_memset(void);
void check_memcpy_2d(void);
void check_pinned_host(void);
void check_mem_info(void);
void check_pointer_attributes(void);
void check_streams(void);
void check_events(void);
void check_async_stream_order(void);
void check_error_paths(void);
void check_threads(void);
void check_device_reset(void);
void check_graph_nodes(void);
void check_pinned_zero_copy(void);
void check_thread_exit_calls(void);
void check_vram_limit(void);
void hold_1gib(void);
void hold_managed(void);
void hold_until_stdin(void);
void leave_dirty_memory(void);
void expect_zeroed_memory(void);
void churn(void);
void sync_until_error(void);

#endif
