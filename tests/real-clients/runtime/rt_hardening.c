/* Programs for the hardening tests (tests/real-clients/test_hardening.py): a session that
 * leaves data behind, one that checks a fresh allocation is zeroed, a churn loop that is killed
 * at random points, and a loop that reports how soon a lost worker becomes an error. */
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rt.h"

#define DIRTY_BYTES (256 * MiB)

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* Fills 256 MiB of device memory with 0xA5 and leaves it allocated (the program then exits). */
void leave_dirty_memory(void) {
  void *d = NULL;
  CK(cudaMalloc(&d, DIRTY_BYTES));
  CK(cudaMemset(d, 0xA5, DIRTY_BYTES));
  unsigned char probe[64];
  CK(cudaMemcpy(probe, (char *)d + DIRTY_BYTES - sizeof probe, sizeof probe,
                cudaMemcpyDeviceToHost));
  expect_all(probe, 0xA5, sizeof probe, "the pattern written");
}

/* A fresh 256 MiB allocation reads as zeros, every byte. */
void expect_zeroed_memory(void) {
  void *d = NULL;
  CK(cudaMalloc(&d, DIRTY_BYTES));
  unsigned char *h = xmalloc(DIRTY_BYTES);
  memset(h, 0x5A, DIRTY_BYTES);
  CK(cudaMemcpy(h, d, DIRTY_BYTES, cudaMemcpyDeviceToHost));
  expect_all(h, 0, DIRTY_BYTES, "a fresh allocation");
  free(h);
  CK(cudaFree(d));
}

/* Allocations of assorted sizes, copies both ways checked, memsets, streams and events, for
 * GPUFUSE_CHURN_SECONDS (default 5) seconds. Prints "READY" after the first round. */
void churn(void) {
  const char *s = getenv("GPUFUSE_CHURN_SECONDS");
  double seconds = s ? atof(s) : 5.0;
  double end = now_ms() + seconds * 1e3;
  const size_t max = 4 * MiB;
  unsigned char *src = xmalloc(max), *back = xmalloc(max);
  cudaStream_t st;
  cudaEvent_t ev;
  CK(cudaStreamCreate(&st));
  CK(cudaEventCreate(&ev));
  long rounds = 0;
  do {
    size_t n = ((size_t)(rounds * 7919) % max) + 1;
    void *a = NULL, *b = NULL;
    CK(cudaMalloc(&a, n));
    CK(cudaMalloc(&b, n));
    fill_pattern(src, n, (uint64_t)rounds);
    CK(cudaMemcpyAsync(a, src, n, cudaMemcpyHostToDevice, st));
    CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, st));
    CK(cudaEventRecord(ev, st));
    CK(cudaEventSynchronize(ev));
    CK(cudaMemcpy(back, b, n, cudaMemcpyDeviceToHost));
    expect_same(src, back, n, "a round trip through two allocations");
    CK(cudaMemset(a, 0x11, n));
    CK(cudaFree(a));
    CK(cudaFree(b));
    if (rounds++ == 0) {
      printf("READY pid=%d\n", (int)getpid());
      fflush(stdout);
    }
  } while (now_ms() < end);
  CK(cudaEventDestroy(ev));
  CK(cudaStreamDestroy(st));
  free(src);
  free(back);
  printf("rounds=%ld\n", rounds);
}

/* Synchronous calls in a loop until one fails; then prints how long after the last success
 * the failure came ("ERROR ms=<ms> err=<name>") and exits 0. */
void sync_until_error(void) {
  void *d = NULL;
  CK(cudaMalloc(&d, MiB));
  printf("READY pid=%d\n", (int)getpid());
  fflush(stdout);
  double last = now_ms();
  for (;;) {
    cudaError_t m = cudaMemset(d, 1, MiB);
    cudaError_t e = m != cudaSuccess ? m : cudaDeviceSynchronize();
    if (e != cudaSuccess) {
      printf("ERROR ms=%.1f err=%s\n", now_ms() - last, cudaGetErrorName(e));
      fflush(stdout);
      exit(0);
    }
    last = now_ms();
  }
}
