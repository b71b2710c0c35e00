// Prefix sums: a block-level Hillis-Steele inclusive scan (double-buffered shared memory), and a
// multi-block exclusive scan in three launches (per-block Blelloch up-sweep/down-sweep writing
// block totals, one block scanning the totals, adding the offsets back).
#include <vector>
#include "kcheck.h"

__global__ void hillis_steele(const int* in, int* out, int n) {
  extern __shared__ int buf[];  // 2 * blockDim.x
  int t = threadIdx.x;
  int pin = 1, pout = 0;  // the input is in buffer 0 (pout) before the first step
  buf[t] = t < n ? in[t] : 0;
  __syncthreads();
  for (int off = 1; off < (int)blockDim.x; off <<= 1) {
    pout = 1 - pout;
    pin = 1 - pout;
    int v = buf[pin * blockDim.x + t];
    if (t >= off) v += buf[pin * blockDim.x + t - off];
    buf[pout * blockDim.x + t] = v;
    __syncthreads();
  }
  if (t < n) out[t] = buf[pout * blockDim.x + t];
}

constexpr int kThreads = 256, kPerBlock = 2 * kThreads;

// Exclusive Blelloch scan of kPerBlock elements per block; the block's total goes to sums.
__global__ void blelloch(const unsigned* in, unsigned* out, unsigned* sums, int n) {
  __shared__ unsigned s[kPerBlock];
  int t = threadIdx.x, base = blockIdx.x * kPerBlock;
  s[2 * t] = base + 2 * t < n ? in[base + 2 * t] : 0;
  s[2 * t + 1] = base + 2 * t + 1 < n ? in[base + 2 * t + 1] : 0;
  int off = 1;
  for (int d = kPerBlock >> 1; d > 0; d >>= 1) {
    __syncthreads();
    if (t < d) {
      int ai = off * (2 * t + 1) - 1, bi = off * (2 * t + 2) - 1;
      s[bi] += s[ai];
    }
    off <<= 1;
  }
  if (t == 0) {
    if (sums) sums[blockIdx.x] = s[kPerBlock - 1];
    s[kPerBlock - 1] = 0;
  }
  for (int d = 1; d < kPerBlock; d <<= 1) {
    off >>= 1;
    __syncthreads();
    if (t < d) {
      int ai = off * (2 * t + 1) - 1, bi = off * (2 * t + 2) - 1;
      unsigned x = s[ai];
      s[ai] = s[bi];
      s[bi] += x;
    }
  }
  __syncthreads();
  if (base + 2 * t < n) out[base + 2 * t] = s[2 * t];
  if (base + 2 * t + 1 < n) out[base + 2 * t + 1] = s[2 * t + 1];
}

__global__ void add_offsets(unsigned* out, const unsigned* offsets, int n) {
  int i = blockIdx.x * kPerBlock + threadIdx.x;
  unsigned o = offsets[blockIdx.x];
  if (i < n) out[i] += o;
  if (i + kThreads < n) out[i + kThreads] += o;
}

static void check_block_scan() {
  for (int n : {1024, 700}) {
    int threads = n == 1024 ? 1024 : 768;
    std::vector<int> h(n), got(n);
    for (int i = 0; i < n; i++) h[i] = (int)(khash(i) % 201) - 100;
    int* din = dev_copy(h.data(), n);
    int* dout = dev_alloc<int>(n);
    hillis_steele<<<1, threads, 2 * threads * sizeof(int)>>>(din, dout, n);
    CK_LAUNCH("hillis_steele");
    to_host(got.data(), dout, n);
    int acc = 0;
    for (int i = 0; i < n; i++) {
      acc += h[i];
      EXPECT_RESULT(got[i] == acc, "n=%d scan[%d] = %d, want %d", n, i, got[i], acc);
    }
    std::printf("checked Hillis-Steele inclusive scan of %d ints, %d threads, dynamic shared\n",
                n, threads);
    CK(cudaFree(din));
    CK(cudaFree(dout));
  }
}

static void check_multi_block() {
  const int n = 100000 + 17;
  const int blocks = (n + kPerBlock - 1) / kPerBlock;  // 196: one block scans the totals
  std::vector<unsigned> h(n), got(n);
  for (int i = 0; i < n; i++) h[i] = khash(i) % 1000;
  unsigned* din = dev_copy(h.data(), n);
  unsigned* dout = dev_alloc<unsigned>(n);
  unsigned* dsums = dev_alloc<unsigned>(blocks);
  unsigned* doffs = dev_alloc<unsigned>(blocks);
  blelloch<<<blocks, kThreads>>>(din, dout, dsums, n);
  CK_LAUNCH("blelloch (per block)");
  blelloch<<<1, kThreads>>>(dsums, doffs, nullptr, blocks);
  CK_LAUNCH("blelloch (block totals)");
  add_offsets<<<blocks, kThreads>>>(dout, doffs, n);
  CK_LAUNCH("add_offsets");
  to_host(got.data(), dout, n);
  unsigned acc = 0;
  for (int i = 0; i < n; i++) {
    EXPECT_RESULT(got[i] == acc, "exclusive scan[%d] = %u, want %u", i, got[i], acc);
    acc += h[i];
  }
  std::printf("checked exclusive scan of %d values over %d blocks (3 launches)\n", n, blocks);
  CK(cudaFree(din));
  CK(cudaFree(dout));
  CK(cudaFree(dsums));
  CK(cudaFree(doffs));
}

KCHECK_MAIN({"block_scan", check_block_scan}, {"multi_block", check_multi_block})
