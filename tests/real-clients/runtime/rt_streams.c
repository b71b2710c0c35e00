/* Streams, events, stream-ordered async copies and several host threads at once. */
#include <pthread.h>
#include <string.h>

#include "rt.h"

void check_streams(void) {
  cudaStream_t s1 = NULL, s2 = NULL, s3 = NULL;
  int least = 0, greatest = 0;
  CK(cudaStreamCreate(&s1));
  CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  CK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  EXPECT(greatest <= least, "priority range least %d greatest %d", least, greatest);
  CK(cudaStreamCreateWithPriority(&s3, cudaStreamDefault, greatest));
  EXPECT(s1 && s2 && s3 && s1 != s2 && s2 != s3, "stream handles %p %p %p", (void *)s1,
         (void *)s2, (void *)s3);

  unsigned int flags = 0xFFFF;
  CK(cudaStreamGetFlags(s2, &flags));
  EXPECT(flags == cudaStreamNonBlocking, "cudaStreamGetFlags %u", flags);
  int prio = 12345;
  CK(cudaStreamGetPriority(s3, &prio));
  EXPECT(prio == greatest, "cudaStreamGetPriority %d, want %d", prio, greatest);

  /* Work on each stream, then each stream is idle after synchronizing. */
  const size_t n = 2 * MiB;
  unsigned char *h = NULL, *r = NULL;
  CK(cudaMallocHost((void **)&h, n));
  CK(cudaMallocHost((void **)&r, n));
  void *d = NULL;
  CK(cudaMalloc(&d, n));
  cudaStream_t all[4] = {s1, s2, s3, 0};
  for (int i = 0; i < 4; i++) {
    fill_pattern(h, n, 300 + i);
    memset(r, 0, n);
    CK(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, all[i]));
    CK(cudaMemcpyAsync(r, d, n, cudaMemcpyDeviceToHost, all[i]));
    CK(cudaStreamSynchronize(all[i]));
    CK(cudaStreamQuery(all[i]));
    expect_same(h, r, n, "async round trip on a stream");
  }
  CK(cudaDeviceSynchronize());
  CK(cudaStreamDestroy(s1));
  CK(cudaStreamDestroy(s2));
  CK(cudaStreamDestroy(s3));
  CK(cudaFree(d));
  CK(cudaFreeHost(h));
  CK(cudaFreeHost(r));
}

void check_events(void) {
  cudaEvent_t start = NULL, stop = NULL, notiming = NULL;
  cudaStream_t s = NULL;
  CK(cudaStreamCreate(&s));
  CK(cudaEventCreate(&start));
  CK(cudaEventCreate(&stop));
  CK(cudaEventCreateWithFlags(&notiming, cudaEventDisableTiming));

  const size_t n = 16 * MiB;
  void *d = NULL;
  unsigned char *h = NULL;
  CK(cudaMalloc(&d, n));
  CK(cudaMallocHost((void **)&h, n));
  fill_pattern(h, n, 8);

  CK(cudaEventRecord(start, s));
  for (int i = 0; i < 4; i++) CK(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, s));
  CK(cudaEventRecord(stop, s));
  CK(cudaEventRecord(notiming, s));
  CK(cudaEventSynchronize(stop));
  CK(cudaEventQuery(stop));
  CK(cudaEventQuery(start));
  float ms = -1.0f;
  CK(cudaEventElapsedTime(&ms, start, stop));
  printf("elapsed_ms=%f\n", ms);
  EXPECT(ms >= 0.0f && ms < 60000.0f, "elapsed time %f ms", ms);
  float back = 1.0f;
  CK(cudaEventElapsedTime(&back, stop, start));
  EXPECT(back <= 0.0f, "elapsed time stop->start %f ms should not be positive", back);

  /* An event recorded on no stream yet is complete; timing needs timing events. */
  cudaEvent_t fresh = NULL;
  CK(cudaEventCreate(&fresh));
  CK(cudaEventQuery(fresh));
  CK(cudaEventSynchronize(notiming));
  float bad = 0.0f;
  cudaError_t e = cudaEventElapsedTime(&bad, start, notiming);
  EXPECT(e == cudaErrorInvalidResourceHandle,
         "cudaEventElapsedTime with a DisableTiming event returned %d (%s)", (int)e,
         cudaGetErrorName(e));
  (void)cudaGetLastError();

  /* Cross-stream ordering with cudaStreamWaitEvent. */
  cudaStream_t s2 = NULL;
  CK(cudaStreamCreate(&s2));
  void *d2 = NULL;
  unsigned char *r = NULL;
  CK(cudaMalloc(&d2, n));
  CK(cudaMallocHost((void **)&r, n));
  fill_pattern(h, n, 9);
  CK(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, s));
  CK(cudaEventRecord(notiming, s));
  CK(cudaStreamWaitEvent(s2, notiming, 0));
  CK(cudaMemcpyAsync(d2, d, n, cudaMemcpyDeviceToDevice, s2));
  CK(cudaMemcpyAsync(r, d2, n, cudaMemcpyDeviceToHost, s2));
  CK(cudaStreamSynchronize(s2));
  expect_same(h, r, n, "copy ordered after cudaStreamWaitEvent");

  CK(cudaEventDestroy(start));
  CK(cudaEventDestroy(stop));
  CK(cudaEventDestroy(notiming));
  CK(cudaEventDestroy(fresh));
  CK(cudaStreamDestroy(s));
  CK(cudaStreamDestroy(s2));
  CK(cudaFree(d));
  CK(cudaFree(d2));
  CK(cudaFreeHost(h));
  CK(cudaFreeHost(r));
}

void check_async_stream_order(void) {
  const size_t n = 4 * MiB + 3;
  cudaStream_t s = NULL;
  CK(cudaStreamCreate(&s));
  unsigned char *a = NULL, *b = NULL, *c = NULL, *e = NULL;
  CK(cudaMallocHost((void **)&a, n));
  CK(cudaMallocHost((void **)&b, n));
  CK(cudaMallocHost((void **)&c, n));
  CK(cudaMallocHost((void **)&e, n));
  void *d1 = NULL, *d2 = NULL;
  CK(cudaMalloc(&d1, n));
  CK(cudaMalloc(&d2, n));
  fill_pattern(a, n, 31337);
  memset(b, 0x11, n);
  memset(c, 0x22, n);
  memset(e, 0x33, n);

  /* Each step depends on the one before; only stream order makes the results right. */
  CK(cudaMemcpyAsync(d1, a, n, cudaMemcpyHostToDevice, s));   /* d1 = a */
  CK(cudaMemcpyAsync(d2, d1, n, cudaMemcpyDeviceToDevice, s)); /* d2 = a */
  CK(cudaMemsetAsync(d1, 0x5C, n, s));                          /* d1 = 0x5C */
  CK(cudaMemcpyAsync(b, d2, n, cudaMemcpyDeviceToHost, s));     /* b = a */
  CK(cudaMemcpyAsync(c, d1, n, cudaMemcpyDeviceToHost, s));     /* c = 0x5C */
  CK(cudaMemcpyAsync(d2, d1, n / 2, cudaMemcpyDeviceToDevice, s));
  CK(cudaMemcpyAsync(e, d2, n, cudaMemcpyDeviceToHost, s)); /* e = 0x5C.. then a's tail */
  CK(cudaStreamSynchronize(s));
  expect_same(a, b, n, "H2D -> D2D -> D2H in stream order");
  expect_all(c, 0x5C, n, "memset after copy in stream order");
  expect_all(e, 0x5C, n / 2, "D2D after memset in stream order (head)");
  expect_same(a + n / 2, e + n / 2, n - n / 2, "D2D after memset in stream order (tail)");

  /* Many small async copies queued back to back, checked once at the end. */
  for (int i = 0; i < 256; i++) {
    unsigned char v = (unsigned char)i;
    CK(cudaMemsetAsync((char *)d1 + (size_t)i * 16, v, 16, s));
  }
  CK(cudaMemcpyAsync(b, d1, 4096, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  for (int i = 0; i < 256; i++) expect_all(b + i * 16, (unsigned char)i, 16, "small memsets");

  /* The legacy default stream orders against the blocking stream s. */
  fill_pattern(a, n, 4);
  CK(cudaMemcpyAsync(d1, a, n, cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(b, d1, n, cudaMemcpyDeviceToHost, 0));
  CK(cudaDeviceSynchronize());
  expect_same(a, b, n, "blocking stream then legacy default stream");

  CK(cudaStreamDestroy(s));
  CK(cudaFree(d1));
  CK(cudaFree(d2));
  CK(cudaFreeHost(a));
  CK(cudaFreeHost(b));
  CK(cudaFreeHost(c));
  CK(cudaFreeHost(e));
}

#define NTHREADS 8

static void *thread_body(void *arg) {
  int id = (int)(intptr_t)arg;
  CK(cudaSetDevice(0));
  cudaStream_t s = NULL;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int round = 0; round < 10; round++) {
    size_t n = (size_t)(id + 1) * 100000 + (size_t)round * 4099;
    unsigned char *h = xmalloc(n), *r = xmalloc(n);
    fill_pattern(h, n, (uint64_t)id * 1000 + (uint64_t)round);
    void *d1 = NULL, *d2 = NULL;
    CK(cudaMalloc(&d1, n));
    CK(cudaMalloc(&d2, n));
    CK(cudaMemcpy(d1, h, n, cudaMemcpyHostToDevice));
    CK(cudaMemcpyAsync(d2, d1, n, cudaMemcpyDeviceToDevice, s));
    CK(cudaMemcpyAsync(r, d2, n, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    expect_same(h, r, n, "per-thread round trip");
    CK(cudaFree(d1));
    CK(cudaFree(d2));
    free(h);
    free(r);
  }
  CK(cudaStreamDestroy(s));
  return NULL;
}

void check_threads(void) {
  pthread_t t[NTHREADS];
  for (int i = 0; i < NTHREADS; i++)
    EXPECT(pthread_create(&t[i], NULL, thread_body, (void *)(intptr_t)i) == 0, "pthread_create");
  for (int i = 0; i < NTHREADS; i++) EXPECT(pthread_join(t[i], NULL) == 0, "pthread_join");
  CK(cudaDeviceSynchronize());
}

static int host_node_runs;
static void CUDART_CB count_host_node(void *user) { *(int *)user += 1; }

/* A graph built node by node (no capture): memset, 1-D copies in every direction, a 2-D copy
 * to host memory, a host node and an empty node, launched twice. Host memory is read when the
 * graph runs, not when it is built. */
void check_graph_nodes(void) {
  enum { N = 64 * 1024, W = 64, H = 16, PITCH = 256 };
  unsigned char *h = xmalloc(N), *r = xmalloc(N), *rect = xmalloc(W * H);
  unsigned char *a = NULL, *b = NULL;
  CK(cudaMalloc((void **)&a, N));
  CK(cudaMalloc((void **)&b, N));
  cudaGraph_t graph = NULL;
  CK(cudaGraphCreate(&graph, 0));

  cudaGraphNode_t set = NULL, up = NULL, d2d = NULL, down = NULL, down2d = NULL, host = NULL,
                  empty = NULL;
  struct cudaMemsetParams ms = {0};
  ms.dst = b;
  ms.value = 0x07070707u;
  ms.elementSize = 4;
  ms.width = N / 4;
  ms.height = 1;
  CK(cudaGraphAddMemsetNode(&set, graph, NULL, 0, &ms));
  CK(cudaGraphAddMemcpyNode1D(&up, graph, &set, 1, a, h, N, cudaMemcpyHostToDevice));
  CK(cudaGraphAddMemcpyNode1D(&d2d, graph, &up, 1, b, a, N / 2, cudaMemcpyDeviceToDevice));
  CK(cudaGraphAddMemcpyNode1D(&down, graph, &d2d, 1, r, b, N, cudaMemcpyDeviceToHost));
  struct cudaMemcpy3DParms p3 = {0};
  p3.srcPtr = (struct cudaPitchedPtr){.ptr = b, .pitch = PITCH, .xsize = W, .ysize = H};
  p3.dstPtr = (struct cudaPitchedPtr){.ptr = rect, .pitch = W, .xsize = W, .ysize = H};
  p3.extent = (struct cudaExtent){.width = W, .height = H, .depth = 1};
  p3.kind = cudaMemcpyDeviceToHost;
  CK(cudaGraphAddMemcpyNode(&down2d, graph, &d2d, 1, &p3));
  struct cudaHostNodeParams hp = {count_host_node, &host_node_runs};
  cudaGraphNode_t after[2] = {down, down2d};
  CK(cudaGraphAddHostNode(&host, graph, after, 2, &hp));
  CK(cudaGraphAddEmptyNode(&empty, graph, &host, 1));

  size_t count = 0;
  CK(cudaGraphGetNodes(graph, NULL, &count));
  EXPECT(count >= 6, "graph has %zu nodes", count);

  cudaGraphExec_t exec = NULL;
  CK(cudaGraphInstantiate(&exec, graph, 0));
  for (int run = 0; run < 2; run++) {
    fill_pattern(h, N, 11 + run);
    memset(r, 0, N);
    memset(rect, 0, W * H);
    CK(cudaGraphLaunch(exec, 0));
    CK(cudaStreamSynchronize(0));
    expect_same(h, r, N / 2, "first half: host -> a -> b -> host");
    for (int i = N / 2; i < N; i++)
      EXPECT(r[i] == 7, "second half byte %d = %d, want the memset's 7 (run %d)", i, r[i], run);
    for (int y = 0; y < H; y++)
      expect_same(h + (size_t)y * PITCH, rect + (size_t)y * W, W, "2-D copy row");
    EXPECT(host_node_runs == run + 1, "host node ran %d times after %d launches",
           host_node_runs, run + 1);
  }
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaFree(a));
  CK(cudaFree(b));
  free(h);
  free(r);
  free(rect);
}
