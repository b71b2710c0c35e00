/* Memory checks: allocation, copies in every direction, memset, 2D copies, pinned host memory,
 * memory info and pointer attributes. */
#include <string.h>

#include "rt.h"

void check_alloc_free(void) {
  static const size_t sizes[] = {1, 3, 256, 4096, 65536 + 1, 1 * MiB, 64 * MiB, 256 * MiB};
  void *ptrs[sizeof sizes / sizeof sizes[0]];
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    ptrs[i] = NULL;
    CK(cudaMalloc(&ptrs[i], sizes[i]));
    EXPECT(ptrs[i] != NULL, "cudaMalloc(%zu) gave NULL", sizes[i]);
    EXPECT(((uintptr_t)ptrs[i] % 256) == 0, "cudaMalloc(%zu) gave %p, not 256-byte aligned",
           sizes[i], ptrs[i]);
    for (size_t j = 0; j < i; j++) {
      uintptr_t a = (uintptr_t)ptrs[i], b = (uintptr_t)ptrs[j];
      EXPECT(a + sizes[i] <= b || b + sizes[j] <= a, "allocations %zu and %zu overlap", i, j);
    }
  }
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) CK(cudaFree(ptrs[i]));

  /* Many small allocations, freed in a different order. */
  void *many[200];
  for (int i = 0; i < 200; i++) CK(cudaMalloc(&many[i], 1000 + (size_t)i * 13));
  for (int i = 0; i < 200; i += 2) CK(cudaFree(many[i]));
  for (int i = 199; i > 0; i -= 2) CK(cudaFree(many[i]));

  /* A zero-byte allocation succeeds (the runtime gives NULL) and can be freed. Last, so
   * that a failure here leaves the other checks run. */
  void *z = (void *)0x1;
  CK(cudaMalloc(&z, 0));
  CK(cudaFree(z));
}

static void roundtrip(size_t n, uint64_t seed) {
  unsigned char *src = xmalloc(n), *dst = xmalloc(n), *hh = xmalloc(n), *part = xmalloc(n);
  void *d1 = NULL, *d2 = NULL;
  char what[128];
  fill_pattern(src, n, seed);
  memset(dst, 0, n);
  memset(hh, 0, n);
  CK(cudaMalloc(&d1, n));
  CK(cudaMalloc(&d2, n));

  CK(cudaMemcpy(d1, src, n, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d2, d1, n, cudaMemcpyDeviceToDevice));
  CK(cudaMemcpy(dst, d2, n, cudaMemcpyDeviceToHost));
  snprintf(what, sizeof what, "H2D+D2D+D2H of %zu bytes", n);
  expect_same(src, dst, n, what);

  /* Peer copies between a device and itself (cuMemcpyPeer, cuMemcpyPeerAsync): what NVIDIA's
   * p2pBandwidthLatencyTest measures on a one-GPU machine. */
  CK(cudaMemset(d2, 0, n));
  CK(cudaMemcpyPeer(d2, 0, d1, 0, n));
  memset(dst, 0, n);
  CK(cudaMemcpy(dst, d2, n, cudaMemcpyDeviceToHost));
  snprintf(what, sizeof what, "cudaMemcpyPeer of %zu bytes", n);
  expect_same(src, dst, n, what);
  CK(cudaMemset(d2, 0, n));
  CK(cudaMemcpyPeerAsync(d2, 0, d1, 0, n, 0));
  CK(cudaStreamSynchronize(0));
  memset(dst, 0, n);
  CK(cudaMemcpy(dst, d2, n, cudaMemcpyDeviceToHost));
  snprintf(what, sizeof what, "cudaMemcpyPeerAsync of %zu bytes", n);
  expect_same(src, dst, n, what);

  CK(cudaMemcpy(hh, src, n, cudaMemcpyHostToHost));
  snprintf(what, sizeof what, "H2H of %zu bytes", n);
  expect_same(src, hh, n, what);

  /* cudaMemcpyDefault infers the direction from the pointers (unified addressing). */
  memset(dst, 0, n);
  CK(cudaMemcpy(dst, d1, n, cudaMemcpyDefault));
  snprintf(what, sizeof what, "D2H (cudaMemcpyDefault) of %zu bytes", n);
  expect_same(src, dst, n, what);

  /* Interior pointers: copy the second half out of the middle of an allocation. */
  if (n >= 2) {
    size_t half = n / 2;
    CK(cudaMemcpy(part, (char *)d1 + half, n - half, cudaMemcpyDeviceToHost));
    snprintf(what, sizeof what, "D2H from offset %zu of %zu bytes", half, n);
    expect_same(src + half, part, n - half, what);
    /* Overwrite the first half of d2 from the tail of src and read all of d2 back. */
    CK(cudaMemcpy(d2, src + (n - half), half, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dst, d2, n, cudaMemcpyDeviceToHost));
    snprintf(what, sizeof what, "partial H2D of %zu bytes (head)", n);
    expect_same(src + (n - half), dst, half, what);
    snprintf(what, sizeof what, "partial H2D of %zu bytes (tail untouched)", n);
    expect_same(src + half, dst + half, n - half, what);
  }
  CK(cudaFree(d1));
  CK(cudaFree(d2));
  free(src);
  free(dst);
  free(hh);
  free(part);
}

void check_memcpy_all_directions(void) {
  static const size_t sizes[] = {1,       2,       3,           7,           64,
                                 4095,    4096,    4097,        65537,       1 * MiB,
                                 MiB + 3, 4 * MiB, 16 * MiB + 5, 32 * MiB - 1, 64 * MiB};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) roundtrip(sizes[i], 1000 + i);
}

void check_memset(void) {
  static const size_t sizes[] = {1, 5, 4096, 1 * MiB + 7, 16 * MiB};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t n = sizes[i];
    unsigned char *h = xmalloc(n);
    void *d = NULL;
    CK(cudaMalloc(&d, n));
    CK(cudaMemset(d, 0xAB, n));
    CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
    expect_all(h, 0xAB, n, "cudaMemset 0xAB");
    if (n >= 4) {
      size_t lo = n / 4, len = n / 2;
      CK(cudaMemset((char *)d + lo, 0x00, len));
      CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
      expect_all(h, 0xAB, lo, "cudaMemset head untouched");
      expect_all(h + lo, 0x00, len, "cudaMemset middle range");
      expect_all(h + lo + len, 0xAB, n - lo - len, "cudaMemset tail untouched");
    }
    /* Only the low byte of the value is used. */
    CK(cudaMemset(d, 0x1C7, n));
    CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
    expect_all(h, 0xC7, n, "cudaMemset uses the low byte");
    CK(cudaFree(d));
    free(h);
  }
}

void check_memcpy_2d(void) {
  const size_t width = 100, height = 37, hpitch = 128;
  size_t dpitch = 0;
  void *d = NULL;
  CK(cudaMallocPitch(&d, &dpitch, width, height));
  EXPECT(dpitch >= width, "pitch %zu < width %zu", dpitch, width);

  unsigned char *src = xmalloc(hpitch * height), *dst = xmalloc(width * height);
  fill_pattern(src, hpitch * height, 77);
  memset(dst, 0, width * height);
  CK(cudaMemset2D(d, dpitch, 0xEE, dpitch, height));
  CK(cudaMemcpy2D(d, dpitch, src, hpitch, width, height, cudaMemcpyHostToDevice));
  CK(cudaMemcpy2D(dst, width, d, dpitch, width, height, cudaMemcpyDeviceToHost));
  for (size_t r = 0; r < height; r++) {
    char what[64];
    snprintf(what, sizeof what, "cudaMemcpy2D row %zu", r);
    expect_same(src + r * hpitch, dst + r * width, width, what);
  }
  /* The padding between rows keeps the memset value. */
  unsigned char *row = xmalloc(dpitch);
  CK(cudaMemcpy(row, d, dpitch, cudaMemcpyDeviceToHost));
  expect_all(row + width, 0xEE, dpitch - width, "row padding after cudaMemcpy2D");

  /* A 2D device-to-device copy of a sub-rectangle. */
  void *d2 = NULL;
  size_t dpitch2 = 0;
  CK(cudaMallocPitch(&d2, &dpitch2, 40, 10));
  CK(cudaMemcpy2D(d2, dpitch2, (char *)d + 3 * dpitch + 10, dpitch, 40, 10,
                  cudaMemcpyDeviceToDevice));
  unsigned char sub[400];
  CK(cudaMemcpy2D(sub, 40, d2, dpitch2, 40, 10, cudaMemcpyDeviceToHost));
  for (size_t r = 0; r < 10; r++)
    expect_same(src + (r + 3) * hpitch + 10, sub + r * 40, 40, "cudaMemcpy2D D2D sub-rectangle");
  CK(cudaFree(d));
  CK(cudaFree(d2));
  free(src);
  free(dst);
  free(row);
}

void check_pinned_host(void) {
  const size_t n = 8 * MiB + 11;
  unsigned char *a = NULL, *b = NULL;
  CK(cudaMallocHost((void **)&a, n));
  CK(cudaHostAlloc((void **)&b, n, cudaHostAllocPortable));
  EXPECT(a && b, "pinned allocations returned NULL");
  /* Pinned memory is usable host memory at once. */
  fill_pattern(a, n, 4242);
  memset(b, 0, n);
  void *d = NULL;
  CK(cudaMalloc(&d, n));
  CK(cudaMemcpy(d, a, n, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(b, d, n, cudaMemcpyDeviceToHost));
  expect_same(a, b, n, "pinned H2D/D2H round trip");

  unsigned int flags = 0xFFFFFFFFu;
  CK(cudaHostGetFlags(&flags, b));
  EXPECT((flags & cudaHostAllocPortable) != 0, "cudaHostGetFlags 0x%x lacks Portable", flags);

  /* cudaHostAllocDefault through the other entry point. */
  unsigned char *c = NULL;
  CK(cudaHostAlloc((void **)&c, 4096, cudaHostAllocDefault));
  memset(c, 0x3C, 4096);
  CK(cudaMemcpy(d, c, 4096, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(b, d, 4096, cudaMemcpyDeviceToHost));
  expect_all(b, 0x3C, 4096, "cudaHostAlloc default round trip");

  CK(cudaFree(d));
  CK(cudaFreeHost(a));
  CK(cudaFreeHost(b));
  CK(cudaFreeHost(c));
}

void check_mem_info(void) {
  size_t free0 = 0, total0 = 0, free1 = 0, total1 = 0, free2 = 0, total2 = 0;
  void *warm = NULL;
  CK(cudaMalloc(&warm, 1)); /* creates the context first */
  CK(cudaMemGetInfo(&free0, &total0));
  EXPECT(total0 > 0 && free0 <= total0, "free %zu total %zu", free0, total0);
  printf("mem_info free=%zu total=%zu\n", free0, total0);

  void *d = NULL;
  CK(cudaMalloc(&d, 256 * MiB));
  CK(cudaMemGetInfo(&free1, &total1));
  EXPECT(total1 == total0, "total changed: %zu -> %zu", total0, total1);
  EXPECT(free0 - free1 >= 256 * MiB && free0 - free1 <= 256 * MiB + 32 * MiB,
         "free went %zu -> %zu after allocating 256 MiB", free0, free1);

  CK(cudaFree(d));
  CK(cudaMemGetInfo(&free2, &total2));
  EXPECT(free2 == free0, "free went %zu -> %zu after freeing the 256 MiB", free0, free2);
  CK(cudaFree(warm));
}

void check_pointer_attributes(void) {
  void *d = NULL;
  void *pinned = NULL;
  CK(cudaMalloc(&d, 1 * MiB));
  CK(cudaMallocHost(&pinned, 4096));
  struct cudaPointerAttributes at;

  memset(&at, 0xFF, sizeof at);
  CK(cudaPointerGetAttributes(&at, d));
  EXPECT(at.type == cudaMemoryTypeDevice, "device pointer type %d", (int)at.type);
  EXPECT(at.device == 0, "device pointer device %d", at.device);
  EXPECT(at.devicePointer == d, "devicePointer %p != %p", at.devicePointer, d);

  memset(&at, 0xFF, sizeof at);
  CK(cudaPointerGetAttributes(&at, (char *)d + 1000));
  EXPECT(at.type == cudaMemoryTypeDevice, "interior device pointer type %d", (int)at.type);
  EXPECT(at.devicePointer == (char *)d + 1000, "interior devicePointer %p", at.devicePointer);

  memset(&at, 0xFF, sizeof at);
  CK(cudaPointerGetAttributes(&at, pinned));
  EXPECT(at.type == cudaMemoryTypeHost, "pinned pointer type %d", (int)at.type);
  EXPECT(at.hostPointer == pinned, "pinned hostPointer %p != %p", at.hostPointer, pinned);

  /* Plain malloc memory: success, type unregistered. */
  void *plain = xmalloc(4096);
  memset(&at, 0xFF, sizeof at);
  CK(cudaPointerGetAttributes(&at, plain));
  EXPECT(at.type == cudaMemoryTypeUnregistered, "malloc pointer type %d", (int)at.type);
  free(plain);

  CK(cudaFree(d));
  CK(cudaFreeHost(pinned));
}
