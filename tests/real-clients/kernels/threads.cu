// Several host threads driving their own streams through one process's context (issue 11:
// threads do not serialize in the client). Built twice: plain, and with
// --default-stream per-thread (launches without a stream then go to each thread's per-thread
// default stream, through the driver's _ptsz entry points). Every check verifies each element.
#include <thread>
#include <vector>
#include <mutex>
#include <condition_variable>

#include "kcheck.h"

__global__ void fill(unsigned int* out, unsigned int base, unsigned int n) {
  unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = base + i;
}

__global__ void inc(unsigned int* dst, const unsigned int* src, unsigned int n) {
  unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i] + 1;
}

static const unsigned int N = 1024;
static const unsigned int ROUNDS = 300;  // enough launches that each stream's batches fill
static const int THREADS = 4;

// fill(a, base), then ROUNDS increments bouncing between a and b, each reading what the one
// before wrote (any reordering within the stream changes the result), ending in a.
static void chain(unsigned int* a, unsigned int* b, unsigned int base, cudaStream_t s) {
  fill<<<N / 256, 256, 0, s>>>(a, base, N);
  CK(cudaGetLastError());
  for (unsigned int r = 0; r < ROUNDS; r++) {
    if (r % 2 == 0) {
      inc<<<N / 256, 256, 0, s>>>(b, a, N);
    } else {
      inc<<<N / 256, 256, 0, s>>>(a, b, N);
    }
    CK(cudaGetLastError());
  }
}

static std::mutex g_report;

static void expect_chain(const unsigned int* d, unsigned int base, unsigned int plus, int who) {
  std::vector<unsigned int> h(N);
  to_host(h.data(), d, N);
  std::lock_guard<std::mutex> l(g_report);
  for (unsigned int i = 0; i < N; i++) {
    EXPECT_RESULT(h[i] == base + i + plus, "thread %d element %u: %u, want %u", who, i, h[i],
                  base + i + plus);
  }
}

// Each thread runs its chains on `stream_of(thread)` (0: a stream of its own) while the main
// thread synchronizes the whole device again and again.
template <typename Stream>
static void on_threads(Stream stream_of) {
  std::vector<std::thread> ts;
  for (int t = 0; t < THREADS; t++) {
    ts.emplace_back([t, stream_of] {
      unsigned int* a = dev_alloc<unsigned int>(N);
      unsigned int* b = dev_alloc<unsigned int>(N);
      cudaStream_t s = stream_of(t);
      for (unsigned int k = 0; k < 3; k++) {
        unsigned int base = 100000u * (10u * t + k);
        chain(a, b, base, s);
        CK(cudaStreamSynchronize(s));
        expect_chain(a, base, ROUNDS, t);
      }
      CK(cudaFree(a));
      CK(cudaFree(b));
    });
  }
  for (int i = 0; i < 20; i++) CK(cudaDeviceSynchronize());
  for (auto& t : ts) t.join();
  CK(cudaDeviceSynchronize());
}

static void own_streams() {
  std::vector<cudaStream_t> streams(THREADS);
  for (auto& s : streams) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  on_threads([&streams](int t) { return streams[t]; });
  for (auto& s : streams) CK(cudaStreamDestroy(s));
  std::printf("checked %d threads on their own streams\n", THREADS);
}

static void per_thread_stream() {
  on_threads([](int) { return cudaStreamPerThread; });
  std::printf("checked %d threads on cudaStreamPerThread\n", THREADS);
}

// Stream 0: each thread's per-thread default stream when built with --default-stream
// per-thread, the legacy default stream otherwise.
static void null_stream() {
  on_threads([](int) { return (cudaStream_t)0; });
  std::printf("checked %d threads on the NULL stream\n", THREADS);
}

// Work on a blocking stream, then on the legacy default stream, then on the blocking stream
// again: the legacy stream waits for the first and the last waits for it.
static void legacy_stream() {
  unsigned int* a = dev_alloc<unsigned int>(N);
  unsigned int* b = dev_alloc<unsigned int>(N);
  unsigned int* y = dev_alloc<unsigned int>(N);
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  for (unsigned int k = 0; k < 3; k++) {
    chain(a, b, 1000u * k, s);
    inc<<<N / 256, 256, 0, cudaStreamLegacy>>>(y, a, N);
    CK(cudaGetLastError());
    inc<<<N / 256, 256, 0, s>>>(b, y, N);
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(s));
    expect_chain(b, 1000u * k, ROUNDS + 2, 0);
  }
  CK(cudaStreamDestroy(s));
  CK(cudaFree(a));
  CK(cudaFree(b));
  CK(cudaFree(y));
  std::printf("checked the legacy default stream between blocking-stream work\n");
}

// An event recorded on one thread's stream orders another thread's stream.
static void cross_thread_event() {
  unsigned int* x = dev_alloc<unsigned int>(N);
  unsigned int* scratch = dev_alloc<unsigned int>(N);
  unsigned int* y = dev_alloc<unsigned int>(N);
  std::mutex m;
  std::condition_variable cv;
  std::vector<cudaEvent_t> recorded;
  bool consumed = true;
  std::thread producer([&] {
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (unsigned int round = 0; round < 5; round++) {
      std::unique_lock<std::mutex> l(m);
      cv.wait(l, [&] { return consumed; });
      l.unlock();
      cudaEvent_t ev;
      CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
      chain(x, scratch, 100000u * round, s);
      CK(cudaEventRecord(ev, s));
      l.lock();
      recorded.push_back(ev);
      consumed = false;
      cv.notify_all();
    }
    CK(cudaStreamSynchronize(s));
    CK(cudaStreamDestroy(s));
  });
  std::thread consumer([&] {
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (unsigned int round = 0; round < 5; round++) {
      std::unique_lock<std::mutex> l(m);
      cv.wait(l, [&] { return recorded.size() > round; });
      cudaEvent_t ev = recorded[round];
      l.unlock();
      CK(cudaStreamWaitEvent(s, ev, 0));
      inc<<<N / 256, 256, 0, s>>>(y, x, N);
      CK(cudaGetLastError());
      CK(cudaStreamSynchronize(s));
      expect_chain(y, 100000u * round, ROUNDS + 1, 1);
      CK(cudaEventDestroy(ev));
      l.lock();
      consumed = true;
      cv.notify_all();
    }
    CK(cudaStreamDestroy(s));
  });
  producer.join();
  consumer.join();
  CK(cudaFree(x));
  CK(cudaFree(scratch));
  CK(cudaFree(y));
  std::printf("checked an event recorded on one thread and waited on by another\n");
}

KCHECK_MAIN({"own_streams", own_streams}, {"per_thread_stream", per_thread_stream},
            {"null_stream", null_stream}, {"legacy_stream", legacy_stream},
            {"cross_thread_event", cross_thread_event})
