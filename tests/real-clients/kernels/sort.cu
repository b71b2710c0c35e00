// Bitonic sort of (key, value) pairs: 1024-element chunks sorted in shared memory (one block
// each, __syncthreads between steps), then the global merge across launches — a global
// compare-exchange launch per stride >= 1024 and a shared-memory launch for the strides below.
// Keys have duplicates; the values (original indices) must come out a permutation that keeps
// every pair together.
#include <algorithm>
#include <vector>
#include "kcheck.h"

constexpr int kChunk = 1024;

template <typename K>
__device__ __forceinline__ void cmp_swap(K* k, unsigned* v, int a, int b, bool asc) {
  K ka = k[a], kb = k[b];
  if ((ka > kb) == asc) {
    k[a] = kb;
    k[b] = ka;
    unsigned t = v[a];
    v[a] = v[b];
    v[b] = t;
  }
}

// Sorts each chunk (kmax == kChunk) or finishes merge step k (strides 512..1) within each chunk.
// The direction of element i's sequence is ((dir_base + i) & k) == 0.
template <typename K>
__global__ void bitonic_chunk(K* keys, unsigned* vals, int kmin, int kmax, unsigned dir_mask) {
  __shared__ K sk[kChunk];
  __shared__ unsigned sv[kChunk];
  int t = threadIdx.x;
  unsigned base = blockIdx.x * kChunk;
  sk[t] = keys[base + t];
  sv[t] = vals[base + t];
  for (int k = kmin; k <= kmax; k <<= 1) {
    for (int j = (k >> 1) < kChunk / 2 ? (k >> 1) : kChunk / 2; j > 0; j >>= 1) {
      __syncthreads();
      int p = t ^ j;
      if (p > t) cmp_swap(sk, sv, t, p, (((base & dir_mask) + t) & k) == 0);
    }
  }
  __syncthreads();
  keys[base + t] = sk[t];
  vals[base + t] = sv[t];
}

template <typename K>
__global__ void bitonic_global_step(K* keys, unsigned* vals, int k, int j) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  unsigned p = i ^ j;
  if (p > i) cmp_swap(keys, vals, i, p, (i & k) == 0);
}

template <typename K>
static void check_pairs(const char* what, const std::vector<K>& orig, const std::vector<K>& k,
                        const std::vector<unsigned>& v, int lo, int hi) {
  std::vector<K> want(orig.begin() + lo, orig.begin() + hi);
  std::sort(want.begin(), want.end());
  std::vector<char> seen(orig.size(), 0);
  for (int i = lo; i < hi; i++) {
    EXPECT_RESULT(k[i] == want[i - lo], "%s key[%d] = %f, want %f", what, i, (double)k[i],
                  (double)want[i - lo]);
    bool ok = v[i] >= (unsigned)lo && v[i] < (unsigned)hi && !seen[v[i]] && orig[v[i]] == k[i];
    EXPECT_RESULT(ok, "%s pair %d: value %u does not belong to key %f", what, i, v[i], (double)k[i]);
    if (v[i] < orig.size()) seen[v[i]] = 1;
  }
}

static void check_bitonic_shared() {
  const int chunks = 8, n = chunks * kChunk;
  std::vector<unsigned> h(n), k(n), v(n);
  for (int i = 0; i < n; i++) {
    h[i] = khash(i) % 3000;
    v[i] = i;
  }
  unsigned* dk = dev_copy(h.data(), n);
  unsigned* dv = dev_copy(v.data(), n);
  bitonic_chunk<unsigned><<<chunks, kChunk>>>(dk, dv, 2, kChunk, 0);
  CK_LAUNCH("bitonic_chunk");
  to_host(k.data(), dk, n);
  to_host(v.data(), dv, n);
  for (int c = 0; c < chunks; c++)
    check_pairs("chunk", h, k, v, c * kChunk, (c + 1) * kChunk);
  std::printf("checked %d chunks of %d (key, value) pairs sorted in shared memory\n", chunks, kChunk);
  CK(cudaFree(dk));
  CK(cudaFree(dv));
}

static void check_bitonic_global() {
  const int n = 1 << 14;
  std::vector<float> h(n), k(n);
  std::vector<unsigned> v(n);
  for (int i = 0; i < n; i++) {
    h[i] = (float)((int)(khash(i + 5) % 20001) - 10000) * 0.25f;
    v[i] = i;
  }
  float* dk = dev_copy(h.data(), n);
  unsigned* dv = dev_copy(v.data(), n);
  int launches = 1;
  bitonic_chunk<float><<<n / kChunk, kChunk>>>(dk, dv, 2, kChunk, ~0u);  // alternate directions
  CK(cudaGetLastError());
  for (int size = 2 * kChunk; size <= n; size <<= 1) {
    for (int j = size >> 1; j >= kChunk; j >>= 1) {
      bitonic_global_step<float><<<n / 256, 256>>>(dk, dv, size, j);
      CK(cudaGetLastError());
      launches++;
    }
    bitonic_chunk<float><<<n / kChunk, kChunk>>>(dk, dv, size, size, ~0u);
    CK(cudaGetLastError());
    launches++;
  }
  CK_LAUNCH("bitonic sort");
  to_host(k.data(), dk, n);
  to_host(v.data(), dv, n);
  check_pairs("global", h, k, v, 0, n);
  std::printf("checked bitonic sort of %d (float key, value) pairs in %d launches\n", n, launches);
  CK(cudaFree(dk));
  CK(cudaFree(dv));
}

KCHECK_MAIN({"bitonic_shared", check_bitonic_shared}, {"bitonic_global", check_bitonic_global})
