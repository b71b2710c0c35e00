/* Page-locked memory from cudaMallocHost/cudaHostAlloc: on the shared-memory transport it lies
 * in the session's host arena and the worker copies it in place (no bytes through the rings).
 * Checked byte for byte both ways, synchronous and asynchronous, large and small, and a block
 * freed while an asynchronous copy into it is queued: the copy must not land in the memory
 * the next allocation gets. */
#include <string.h>

#include "rt.h"

void check_pinned_zero_copy(void) {
  const size_t n = 64 * MiB;
  unsigned char *a = NULL, *b = NULL;
  CK(cudaMallocHost((void **)&a, n));
  CK(cudaHostAlloc((void **)&b, n, cudaHostAllocPortable));
  void *d = NULL, *e = NULL;
  CK(cudaMalloc(&d, n));
  CK(cudaMalloc(&e, n));

  /* Synchronous, both ways: the source may be reused as soon as the call returns. */
  fill_pattern(a, n, 901);
  CK(cudaMemcpy(d, a, n, cudaMemcpyHostToDevice));
  memset(a, 0, n);
  memset(b, 0, n);
  CK(cudaMemcpy(b, d, n, cudaMemcpyDeviceToHost));
  fill_pattern(a, n, 901);
  expect_same(a, b, n, "pinned synchronous round trip (64 MiB)");

  /* Asynchronous, in stream order: host to device, device to device, back to another block. */
  cudaStream_t s = NULL;
  CK(cudaStreamCreate(&s));
  fill_pattern(a, n, 902);
  memset(b, 0, n);
  CK(cudaMemcpyAsync(d, a, n, cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(e, d, n, cudaMemcpyDeviceToDevice, s));
  CK(cudaMemsetAsync(d, 0x5A, 4096, s));
  CK(cudaMemcpyAsync(b, e, n, cudaMemcpyDeviceToHost, s));
  CK(cudaMemcpyAsync(b + n - 4096, d, 4096, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  expect_same(a, b, n - 4096, "pinned asynchronous copies in stream order");
  expect_all(b + n - 4096, 0x5A, 4096, "pinned asynchronous copy after a memset");

  /* Small copies and odd offsets inside a block. */
  for (size_t off = 1; off < 64 * 1024; off = off * 7 + 3) {
    fill_pattern(a + off, 1000, (int)off);
    CK(cudaMemcpyAsync((char *)d + off, a + off, 1000, cudaMemcpyHostToDevice, s));
    CK(cudaMemcpyAsync(b + off, (char *)d + off, 1000, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    expect_same(a + off, b + off, 1000, "small pinned copy at an odd offset");
  }

  /* Freed while an asynchronous copy into it is queued: the next block (likely the same
   * pages) keeps what the application writes into it. */
  unsigned char *c = NULL, *f = NULL;
  CK(cudaMallocHost((void **)&c, 4 * MiB));
  CK(cudaMemsetAsync(e, 0x11, 4 * MiB, s));
  CK(cudaMemcpyAsync(c, e, 4 * MiB, cudaMemcpyDeviceToHost, s));
  CK(cudaFreeHost(c));
  CK(cudaMallocHost((void **)&f, 4 * MiB));
  memset(f, 0x22, 4 * MiB);
  CK(cudaStreamSynchronize(s));
  CK(cudaDeviceSynchronize());
  expect_all(f, 0x22, 4 * MiB, "a new pinned block after a freed one with a queued copy");
  CK(cudaFreeHost(f));

  /* Registered memory (on the shared-memory transport its whole pages join the host arena in
     place; the partial pages at its ends are copied through the transport). */
  unsigned char *g = (unsigned char *)xmalloc(2 * MiB);
  unsigned char *h = (unsigned char *)xmalloc(2 * MiB);
  CK(cudaHostRegister(g, 2 * MiB, cudaHostRegisterDefault));
  fill_pattern(g, 2 * MiB, 903);
  CK(cudaMemcpyAsync(d, g, 2 * MiB, cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(h, d, 2 * MiB, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  expect_same(g, h, 2 * MiB, "registered memory round trip");
  CK(cudaHostUnregister(g));
  free(g);
  free(h);

  CK(cudaStreamDestroy(s));
  CK(cudaFree(d));
  CK(cudaFree(e));
  CK(cudaFreeHost(a));
  CK(cudaFreeHost(b));
}
