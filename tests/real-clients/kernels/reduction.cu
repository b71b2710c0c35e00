// Shared-memory tree reduction (static and dynamic shared memory, __syncthreads), two passes.
#include <vector>
#include "kcheck.h"

constexpr int kBlock = 256;

__global__ void reduce_static(const unsigned int* in, unsigned long long* out, int n) {
  __shared__ unsigned long long buf[kBlock];
  int tid = threadIdx.x;
  int i = blockIdx.x * blockDim.x * 2 + tid;
  unsigned long long v = 0;
  if (i < n) v += in[i];
  if (i + blockDim.x < n) v += in[i + blockDim.x];
  buf[tid] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (tid < s) buf[tid] += buf[tid + s];
    __syncthreads();
  }
  if (tid == 0) out[blockIdx.x] = buf[0];
}

__global__ void reduce_dynamic(const unsigned long long* in, unsigned long long* out, int n) {
  extern __shared__ unsigned long long dyn[];
  int tid = threadIdx.x;
  unsigned long long v = 0;
  for (int i = tid; i < n; i += blockDim.x) v += in[i];
  dyn[tid] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (tid < s) dyn[tid] += dyn[tid + s];
    __syncthreads();
  }
  if (tid == 0) *out = dyn[0];
}

int main(int argc, char** argv) {
  parse_args(argc, argv);
  const int n = (1 << 22) + 12345;
  std::vector<unsigned int> h(n);
  unsigned long long want = 0;
  for (int i = 0; i < n; i++) {
    h[i] = (unsigned int)((i * 2654435761u) >> 12);
    want += h[i];
  }
  const int blocks = (n + kBlock * 2 - 1) / (kBlock * 2);
  unsigned int* din;
  unsigned long long *dpart, *dsum;
  CK(cudaMalloc(&din, n * sizeof(unsigned int)));
  CK(cudaMalloc(&dpart, blocks * sizeof(unsigned long long)));
  CK(cudaMalloc(&dsum, sizeof(unsigned long long)));
  CK(cudaMemcpy(din, h.data(), n * sizeof(unsigned int), cudaMemcpyHostToDevice));
  CK(cudaMemset(dpart, 0xFF, blocks * sizeof(unsigned long long)));
  CK(cudaMemset(dsum, 0xFF, sizeof(unsigned long long)));

  reduce_static<<<blocks, kBlock>>>(din, dpart, n);
  CK_LAUNCH("reduce_static");
  std::vector<unsigned long long> part(blocks);
  CK(cudaMemcpy(part.data(), dpart, blocks * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
  unsigned long long host_sum = 0;
  for (int b = 0; b < blocks; b++) host_sum += part[b];
  EXPECT_RESULT(host_sum == want, "sum of block partials %llu, want %llu", host_sum, want);

  const int threads = 512;
  reduce_dynamic<<<1, threads, threads * sizeof(unsigned long long)>>>(dpart, dsum, blocks);
  CK_LAUNCH("reduce_dynamic");
  unsigned long long got = 0;
  CK(cudaMemcpy(&got, dsum, sizeof got, cudaMemcpyDeviceToHost));
  EXPECT_RESULT(got == want, "two-pass sum %llu, want %llu", got, want);

  CK(cudaFree(din));
  CK(cudaFree(dpart));
  CK(cudaFree(dsum));
  return finish("reduction");
}
