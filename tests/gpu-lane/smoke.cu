// GPU-lane smoke test: the runtime API paths every CUDA program takes, with results checked on
// the host. Run natively and through gpufuse on the same GPU; prints one line per check and
// "smoke: N passed, M failed". Exit status 1 if any check failed.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>

static int passed = 0, failed = 0;
#define CHECK(name, cond)                                                          \
  do {                                                                             \
    bool ok_ = (cond);                                                             \
    printf("%-28s %s\n", name, ok_ ? "ok" : "FAILED");                             \
    ok_ ? ++passed : ++failed;                                                     \
  } while (0)
#define CU(call)                                                                   \
  do {                                                                             \
    cudaError_t e_ = (call);                                                       \
    if (e_ != cudaSuccess) {                                                       \
      printf("%s:%d %s -> %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      ++failed;                                                                    \
    }                                                                              \
  } while (0)

__global__ void saxpy(int n, float a, const float* x, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

__global__ void block_sum(const int* in, int n, unsigned long long* out) {
  __shared__ int s[256];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  s[threadIdx.x] = i < n ? in[i] : 0;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) s[threadIdx.x] += s[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(out, (unsigned long long)s[0]);
}

__global__ void spin(long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
}

int main() {
  int count = 0;
  CU(cudaGetDeviceCount(&count));
  CHECK("device count >= 1", count >= 1);
  cudaDeviceProp p;
  CU(cudaGetDeviceProperties(&p, 0));
  printf("device: %s cc %d.%d, %d SMs, %.1f GiB\n", p.name, p.major, p.minor,
         p.multiProcessorCount, p.totalGlobalMem / 1073741824.0);
  size_t free_b = 0, total_b = 0;
  CU(cudaMemGetInfo(&free_b, &total_b));
  printf("mem_get_info: free %.2f GiB of %.2f GiB\n", free_b / 1073741824.0, total_b / 1073741824.0);
  CHECK("mem info sane", total_b > 0 && free_b <= total_b);

  const int n = 1 << 22;
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) { x[i] = i % 1000 * 0.5f; y[i] = 1.0f; }
  float *dx, *dy;
  CU(cudaMalloc(&dx, n * sizeof(float)));
  CU(cudaMalloc(&dy, n * sizeof(float)));
  CU(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CU(cudaMemcpy(dy, y.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  saxpy<<<(n + 255) / 256, 256>>>(n, 2.0f, dx, dy);
  CU(cudaGetLastError());
  CU(cudaMemcpy(y.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost));
  bool ok = true;
  for (int i = 0; i < n; ++i) ok &= y[i] == 2.0f * (i % 1000 * 0.5f) + 1.0f;
  CHECK("saxpy", ok);

  // Fresh memory reads as zeros (no data from an earlier tenant).
  unsigned char* fresh;
  const size_t fresh_n = 64 << 20;
  CU(cudaMalloc(&fresh, fresh_n));
  std::vector<unsigned char> hb(fresh_n, 0xff);
  CU(cudaMemcpy(hb.data(), fresh, fresh_n, cudaMemcpyDeviceToHost));
  ok = true;
  for (size_t i = 0; i < fresh_n; ++i) ok &= hb[i] == 0;
  CHECK("fresh memory is zero", ok);
  CU(cudaMemset(fresh, 7, fresh_n));
  CU(cudaMemcpy(hb.data(), fresh, fresh_n, cudaMemcpyDeviceToHost));
  ok = true;
  for (size_t i = 0; i < fresh_n; ++i) ok &= hb[i] == 7;
  CHECK("memset", ok);
  CU(cudaFree(fresh));

  // Reduction with shared memory and atomics.
  std::vector<int> v(n);
  unsigned long long want = 0;
  for (int i = 0; i < n; ++i) { v[i] = i % 97; want += v[i]; }
  int* dv;
  unsigned long long* dsum;
  CU(cudaMalloc(&dv, n * sizeof(int)));
  CU(cudaMalloc(&dsum, sizeof(unsigned long long)));
  CU(cudaMemcpy(dv, v.data(), n * sizeof(int), cudaMemcpyHostToDevice));
  CU(cudaMemset(dsum, 0, sizeof(unsigned long long)));
  block_sum<<<(n + 255) / 256, 256>>>(dv, n, dsum);
  unsigned long long got = 0;
  CU(cudaMemcpy(&got, dsum, sizeof got, cudaMemcpyDeviceToHost));
  CHECK("reduction + atomics", got == want);

  // Streams, pinned memory, async copies, events.
  cudaStream_t s;
  CU(cudaStreamCreate(&s));
  float* pinned;
  CU(cudaMallocHost(&pinned, n * sizeof(float)));
  for (int i = 0; i < n; ++i) pinned[i] = 3.0f;
  cudaEvent_t e0, e1;
  CU(cudaEventCreate(&e0));
  CU(cudaEventCreate(&e1));
  CU(cudaEventRecord(e0, s));
  CU(cudaMemcpyAsync(dx, pinned, n * sizeof(float), cudaMemcpyHostToDevice, s));
  CU(cudaMemsetAsync(dy, 0, n * sizeof(float), s));
  saxpy<<<(n + 255) / 256, 256, 0, s>>>(n, 1.5f, dx, dy);
  CU(cudaMemcpyAsync(pinned, dy, n * sizeof(float), cudaMemcpyDeviceToHost, s));
  CU(cudaEventRecord(e1, s));
  CU(cudaStreamSynchronize(s));
  ok = true;
  for (int i = 0; i < n; ++i) ok &= pinned[i] == 4.5f;
  CHECK("stream + pinned + async", ok);
  float ms = 0;
  CU(cudaEventElapsedTime(&ms, e0, e1));
  printf("stream pipeline: %.3f ms (event)\n", ms);

  // A CUDA graph captured from a stream.
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CU(cudaMemsetAsync(dy, 0, n * sizeof(float), s));
  saxpy<<<(n + 255) / 256, 256, 0, s>>>(n, 2.0f, dx, dy);
  CU(cudaStreamEndCapture(s, &g));
  CU(cudaGraphInstantiate(&ge, g, 0));
  CU(cudaGraphLaunch(ge, s));
  CU(cudaStreamSynchronize(s));
  CU(cudaMemcpy(y.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost));
  ok = true;
  for (int i = 0; i < n; ++i) ok &= y[i] == 6.0f;
  CHECK("graph capture + launch", ok);

  // Launch rate: 2000 empty-ish launches, then a synchronize.
  cudaEvent_t t0, t1;
  CU(cudaEventCreate(&t0));
  CU(cudaEventCreate(&t1));
  CU(cudaEventRecord(t0, 0));
  for (int i = 0; i < 2000; ++i) spin<<<1, 32>>>(0);
  CU(cudaEventRecord(t1, 0));
  CU(cudaDeviceSynchronize());
  CU(cudaEventElapsedTime(&ms, t0, t1));
  printf("2000 launches: %.3f ms by events (%.2f us each)\n", ms, ms * 1000 / 2000);

  // Copy bandwidth: 64 MiB each way, pageable and pinned, best of 5 (wall clock).
  {
    const size_t bytes = 64 << 20;
    void *dbuf, *pin;
    std::vector<char> pageable(bytes, 1);
    CU(cudaMalloc(&dbuf, bytes));
    CU(cudaMallocHost(&pin, bytes));
    memset(pin, 1, bytes);
    struct Case { const char* name; void* dst; const void* src; cudaMemcpyKind kind; };
    Case cases[] = {
        {"HtoD pageable", dbuf, pageable.data(), cudaMemcpyHostToDevice},
        {"HtoD pinned", dbuf, pin, cudaMemcpyHostToDevice},
        {"DtoH pageable", pageable.data(), dbuf, cudaMemcpyDeviceToHost},
        {"DtoH pinned", pin, dbuf, cudaMemcpyDeviceToHost},
    };
    for (const Case& c : cases) {
      double best = 1e30;
      for (int rep = 0; rep < 5; ++rep) {
        auto t0 = std::chrono::steady_clock::now();
        CU(cudaMemcpy(c.dst, c.src, bytes, c.kind));
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best = s < best ? s : best;
      }
      printf("bandwidth %-14s %7.2f GB/s (64 MiB in %.3f ms)\n", c.name, bytes / best / 1e9, best * 1e3);
    }
    CU(cudaFree(dbuf));
    CU(cudaFreeHost(pin));
  }

  // A bogus pointer is an error, not a crash.
  cudaError_t bad = cudaMemcpy(y.data(), (void*)0x10, 16, cudaMemcpyDeviceToHost);
  printf("memcpy from bogus pointer -> %s\n", cudaGetErrorName(bad));
  CHECK("bogus pointer is an error", bad != cudaSuccess);
  cudaGetLastError();

  CU(cudaFree(dx));
  CU(cudaFree(dy));
  CU(cudaFree(dv));
  CU(cudaFree(dsum));
  CU(cudaFreeHost(pinned));
  printf("smoke: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
