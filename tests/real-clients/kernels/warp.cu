// Warp-level primitives: shuffle reductions (down, xor, 32- and 64-bit, float), a warp scan with
// __shfl_up_sync, indexed shuffles with a width, votes (ballot/any/all, partial masks),
// __match_any_sync and the __reduce_*_sync (redux.sync) family.
#include <cooperative_groups.h>
#include <algorithm>
#include <cooperative_groups/reduce.h>
#include <vector>
#include "kcheck.h"

namespace cg = cooperative_groups;

constexpr unsigned kFull = 0xffffffffu;

// Block sum: __shfl_down_sync within each warp, warp partials in shared memory, then a
// __shfl_xor_sync butterfly in warp 0 (every lane ends with the total: all lanes are written).
__global__ void block_sum(const int* in, int* lanes_out, float* fsum, double* dsum, int n) {
  __shared__ int warp_sums[32];
  __shared__ float warp_fsums[32];
  __shared__ double warp_dsums[32];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  int v = i < n ? in[i] : 0;
  float f = (float)v;
  double d = (double)v * 0.25;
  for (int o = 16; o > 0; o >>= 1) {
    v += __shfl_down_sync(kFull, v, o);
    f += __shfl_down_sync(kFull, f, o);
    d += __shfl_down_sync(kFull, d, o);
  }
  if (lane == 0) {
    warp_sums[w] = v;
    warp_fsums[w] = f;
    warp_dsums[w] = d;
  }
  __syncthreads();
  if (w == 0) {
    int nw = blockDim.x >> 5;
    v = lane < nw ? warp_sums[lane] : 0;
    f = lane < nw ? warp_fsums[lane] : 0.0f;
    d = lane < nw ? warp_dsums[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) {
      v += __shfl_xor_sync(kFull, v, o);
      f += __shfl_xor_sync(kFull, f, o);
      d += __shfl_xor_sync(kFull, d, o);
    }
    lanes_out[blockIdx.x * 32 + lane] = v;
    if (lane == 0) {
      fsum[blockIdx.x] = f;
      dsum[blockIdx.x] = d;
    }
  }
}

static void check_shfl_reduce() {
  const int n = 8192 + 77, block = 256, blocks = (n + block - 1) / block;
  std::vector<int> h(n);
  for (int i = 0; i < n; i++) h[i] = (int)(khash(i) % 2001) - 1000;
  int* din = dev_copy(h.data(), n);
  int* dl = dev_alloc<int>(blocks * 32);
  float* df = dev_alloc<float>(blocks);
  double* dd = dev_alloc<double>(blocks);
  block_sum<<<blocks, block>>>(din, dl, df, dd, n);
  CK_LAUNCH("block_sum");
  std::vector<int> lanes(blocks * 32);
  std::vector<float> fs(blocks);
  std::vector<double> ds(blocks);
  to_host(lanes.data(), dl, lanes.size());
  to_host(fs.data(), df, blocks);
  to_host(ds.data(), dd, blocks);
  for (int b = 0; b < blocks; b++) {
    long want = 0;
    for (int i = b * block; i < n && i < (b + 1) * block; i++) want += h[i];
    for (int l = 0; l < 32; l++)
      EXPECT_RESULT(lanes[b * 32 + l] == want, "block %d lane %d: %d, want %ld", b, l,
                    lanes[b * 32 + l], want);
    // Small integers (and quarters of them): float and double sums are exact in any order.
    EXPECT_RESULT(fs[b] == (float)want, "block %d float sum %f, want %ld", b, fs[b], want);
    EXPECT_RESULT(ds[b] == want * 0.25, "block %d double sum %f, want %f", b, ds[b], want * 0.25);
  }
  std::printf("checked %d block sums (int, float, double shuffles; all 32 lanes of the xor butterfly)\n",
              blocks);
  CK(cudaFree(din));
  CK(cudaFree(dl));
  CK(cudaFree(df));
  CK(cudaFree(dd));
}

// Inclusive warp scan with __shfl_up_sync; the block's warps are chained through shared memory.
__global__ void block_scan(const unsigned* in, unsigned* out, int n) {
  __shared__ unsigned warp_tot[32];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  unsigned v = i < n ? in[i] : 0;
  for (int o = 1; o < 32; o <<= 1) {
    unsigned t = __shfl_up_sync(kFull, v, o);
    if (lane >= o) v += t;
  }
  if (lane == 31) warp_tot[w] = v;
  __syncthreads();
  if (w == 0) {
    unsigned t = lane < (int)(blockDim.x >> 5) ? warp_tot[lane] : 0;
    for (int o = 1; o < 32; o <<= 1) {
      unsigned u = __shfl_up_sync(kFull, t, o);
      if (lane >= o) t += u;
    }
    warp_tot[lane] = t;
  }
  __syncthreads();
  if (w > 0) v += warp_tot[w - 1];
  if (i < n) out[i] = v;
}

// Indexed shuffles: rotate by 5, broadcast lane 7, and width-8 segments (xor / idx / up / down
// stay inside their segment of 8 lanes).
__global__ void shfl_patterns(int* out) {
  int lane = threadIdx.x & 31;
  int v = 100 * (threadIdx.x >> 5) + lane;
  int* o = out + (threadIdx.x) * 6;
  o[0] = __shfl_sync(kFull, v, (lane + 5) & 31);
  o[1] = __shfl_sync(kFull, v, 7);
  o[2] = __shfl_xor_sync(kFull, v, 3, 8);
  o[3] = __shfl_sync(kFull, v, 2, 8);
  o[4] = __shfl_up_sync(kFull, v, 3, 8);
  o[5] = __shfl_down_sync(kFull, v, 3, 8);
}

static void check_shfl_scan() {
  const int n = 4096 + 99, block = 512, blocks = (n + block - 1) / block;
  std::vector<unsigned> h(n), got(n);
  for (int i = 0; i < n; i++) h[i] = khash(i) & 0xffff;
  unsigned* din = dev_copy(h.data(), n);
  unsigned* dout = dev_alloc<unsigned>(n);
  block_scan<<<blocks, block>>>(din, dout, n);
  CK_LAUNCH("block_scan");
  to_host(got.data(), dout, n);
  for (int b = 0; b < blocks; b++) {
    unsigned acc = 0;
    for (int i = b * block; i < n && i < (b + 1) * block; i++) {
      acc += h[i];
      EXPECT_RESULT(got[i] == acc, "scan[%d] = %u, want %u", i, got[i], acc);
    }
  }
  std::printf("checked inclusive block scans of %d elements (__shfl_up_sync)\n", n);

  const int threads = 64;
  int* dp = dev_alloc<int>(threads * 6);
  shfl_patterns<<<1, threads>>>(dp);
  CK_LAUNCH("shfl_patterns");
  std::vector<int> p(threads * 6);
  to_host(p.data(), dp, p.size());
  for (int t = 0; t < threads; t++) {
    int lane = t & 31, base = 100 * (t >> 5);
    int seg = lane & ~7, sl = lane & 7;
    int want[6] = {base + ((lane + 5) & 31), base + 7, base + (seg | (sl ^ 3)), base + seg + 2,
                   base + (sl >= 3 ? lane - 3 : lane), base + (sl + 3 < 8 ? lane + 3 : lane)};
    for (int k = 0; k < 6; k++)
      EXPECT_RESULT(p[t * 6 + k] == want[k], "thread %d pattern %d: %d, want %d", t, k,
                    p[t * 6 + k], want[k]);
  }
  std::printf("checked rotate, broadcast and width-8 xor/idx/up/down shuffles\n");
  CK(cudaFree(din));
  CK(cudaFree(dout));
  CK(cudaFree(dp));
}

// Votes. Per warp: ballot of a data predicate, any/all, a ballot inside a branch taken by the
// lower half only (mask 0x0000ffff), popc of the ballot.
__global__ void votes(const int* in, unsigned* out) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  int lane = threadIdx.x & 31;
  int x = in[i];
  unsigned b = __ballot_sync(kFull, x > 0);
  int any = __any_sync(kFull, x == 12345);
  int all = __all_sync(kFull, x > -1000000);
  int all2 = __all_sync(kFull, x > 0);
  unsigned half = 0;
  if (lane < 16) half = __ballot_sync(0x0000ffffu, (x & 1) != 0);
  if (lane == 0) {
    int w = i >> 5;
    out[w * 6 + 0] = b;
    out[w * 6 + 1] = any;
    out[w * 6 + 2] = all;
    out[w * 6 + 3] = all2;
    out[w * 6 + 4] = half;
    out[w * 6 + 5] = __popc(b);
  }
}

static void check_vote() {
  const int warps = 64, n = warps * 32;
  std::vector<int> h(n);
  for (int i = 0; i < n; i++) h[i] = (int)(khash(i + 7) % 1000) - 200;
  for (int i = 0; i < n; i++)
    if ((i >> 5) % 5 == 0) h[i] = 1 + (i & 7);  // some warps all positive
  h[3 * 32 + 17] = 12345;
  h[40 * 32 + 0] = 12345;
  int* din = dev_copy(h.data(), n);
  unsigned* dout = dev_alloc<unsigned>(warps * 6);
  votes<<<n / 128, 128>>>(din, dout);
  CK_LAUNCH("votes");
  std::vector<unsigned> got(warps * 6);
  to_host(got.data(), dout, got.size());
  for (int w = 0; w < warps; w++) {
    unsigned b = 0, half = 0;
    int any = 0, all = 1, all2 = 1;
    for (int l = 0; l < 32; l++) {
      int x = h[w * 32 + l];
      if (x > 0) b |= 1u << l;
      any |= x == 12345;
      all &= x > -1000000;
      all2 &= x > 0;
      if (l < 16 && (x & 1)) half |= 1u << l;
    }
    unsigned want[6] = {b, (unsigned)any, (unsigned)all, (unsigned)all2, half,
                        (unsigned)__builtin_popcount(b)};
    for (int k = 0; k < 6; k++) {
      bool ok = k >= 1 && k <= 3 ? ((got[w * 6 + k] != 0) == (want[k] != 0)) : got[w * 6 + k] == want[k];
      EXPECT_RESULT(ok, "warp %d vote %d: %#x, want %#x", w, k, got[w * 6 + k], want[k]);
    }
  }
  std::printf("checked ballot/any/all/partial-mask ballot/popc for %d warps\n", warps);
  CK(cudaFree(din));
  CK(cudaFree(dout));
}

// __match_any_sync (match.any.sync.b32), __reduce_{add,min,max,and,or,xor}_sync (redux.sync);
// __match_all_sync (match.all.sync.b32 d|p) only when with_match_all (its own check).
__global__ void match_redux(const unsigned* in, unsigned* out, bool with_match_all) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  unsigned x = in[i];
  unsigned* o = out + i * 9;
  o[0] = __match_any_sync(kFull, x);
  if (with_match_all) {
    int pred = 0;
    o[1] = __match_all_sync(kFull, x >> 8, &pred);
    o[2] = pred;
  }
  o[3] = __reduce_add_sync(kFull, x);
  o[4] = __reduce_min_sync(kFull, x);
  o[5] = __reduce_max_sync(kFull, x);
  o[6] = __reduce_and_sync(kFull, x);
  o[7] = __reduce_or_sync(kFull, x);
  o[8] = __reduce_xor_sync(kFull, x);
}

static void match_redux_check(bool with_match_all) {
  const int warps = 8, n = warps * 32;
  std::vector<unsigned> h(n);
  for (int i = 0; i < n; i++) h[i] = 0x1200 | (khash(i) % 5);  // values 0x1200..0x1204
  for (int i = 3 * 32; i < 4 * 32; i++) h[i] = 0x1200 | (khash(i) % 5) * 0x100;  // x>>8 differs
  unsigned* din = dev_copy(h.data(), n);
  unsigned* dout = dev_alloc<unsigned>(n * 9);
  CK(cudaMemset(dout, 0, n * 9 * sizeof(unsigned)));
  match_redux<<<warps / 2, 64>>>(din, dout, with_match_all);
  CK_LAUNCH("match_redux");
  std::vector<unsigned> got(n * 9);
  to_host(got.data(), dout, got.size());
  for (int w = 0; w < warps; w++) {
    unsigned add = 0, mn = ~0u, mx = 0, an = ~0u, orr = 0, xr = 0;
    bool same = true;
    for (int l = 0; l < 32; l++) {
      unsigned x = h[w * 32 + l];
      add += x;
      mn = x < mn ? x : mn;
      mx = x > mx ? x : mx;
      an &= x;
      orr |= x;
      xr ^= x;
      same = same && (x >> 8) == (h[w * 32] >> 8);
    }
    for (int l = 0; l < 32; l++) {
      int i = w * 32 + l;
      unsigned peers = 0;
      for (int m = 0; m < 32; m++)
        if (h[w * 32 + m] == h[i]) peers |= 1u << m;
      unsigned want[9] = {peers, 0, 0, add, mn, mx, an, orr, xr};
      if (with_match_all) {
        want[1] = same ? kFull : 0u;
        want[2] = same ? 1u : 0u;
      }
      for (int k = 0; k < 9; k++)
        EXPECT_RESULT(got[i * 9 + k] == want[k], "thread %d op %d: %#x, want %#x", i, k,
                      got[i * 9 + k], want[k]);
    }
  }
  std::printf("checked match_any%s and reduce add/min/max/and/or/xor for %d warps\n",
              with_match_all ? ", match_all" : "", warps);
  CK(cudaFree(din));
  CK(cudaFree(dout));
}

static void check_match_redux() { match_redux_check(false); }
static void check_match_all() { match_redux_check(true); }

// __syncwarp (bar.warp.sync) in one warp while the other warps wait at __syncthreads (bar.sync 0):
// the waiting warps must not pass their barrier before warp 0 reaches it. This is the pattern of
// CuPy's warp-synchronous scan (cupy_scan_naive: a shared-memory scan of the warp totals in warp
// 0 with __syncwarp between steps, then __syncthreads).
__global__ void syncwarp_in_branch(int* out, int syncwarps) {
  __shared__ int s;
  int w = threadIdx.x >> 5;
  if (threadIdx.x == 0) s = 1;
  __syncthreads();
  if (w == 0) {
    for (int k = 0; k < syncwarps; k++) __syncwarp();
    if (threadIdx.x == 0) s = 2;
  }
  __syncthreads();
  out[threadIdx.x] = s;
}

static void check_syncwarp_barrier() {
  const int threads = 128;
  int* d = dev_alloc<int>(threads);
  for (int syncwarps = 0; syncwarps <= 4; syncwarps++) {
    syncwarp_in_branch<<<1, threads>>>(d, syncwarps);
    CK_LAUNCH("syncwarp_in_branch");
    int got[threads];
    to_host(got, d, threads);
    for (int t = 0; t < threads; t++)
      EXPECT_RESULT(got[t] == 2, "%d __syncwarp in warp 0: thread %d (warp %d) read %d after"
                    " __syncthreads, want 2", syncwarps, t, t / 32, got[t]);
  }
  std::printf("checked __syncthreads after 0..4 __syncwarp in warp 0 only (4 warps)\n");
  CK(cudaFree(d));
}

// cg::labeled_partition and cg::reduce over it (NVIDIA's warpAggregatedAtomicsCG pattern):
// lanes of different labels run one redux/match together with different membermasks, and
// each group's maximum must be its own.
__global__ void label_max(const int* label, const int* value, int* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  cg::coalesced_group active = cg::coalesced_threads();
  auto group = cg::labeled_partition(active, label[i]);
  int m = cg::reduce(group, value[i], cg::greater<int>());
  if (group.thread_rank() == 0) atomicMax(&out[label[i]], m);
}

static void check_labeled_partition() {
  const int n = 4096, labels = 7;
  std::vector<int> lab(n), val(n), want(labels, 0), got(labels);
  for (int i = 0; i < n; i++) {
    lab[i] = (i * 37 + i / 5) % labels;
    val[i] = (i * 7919) % 100003;
    want[lab[i]] = std::max(want[lab[i]], val[i]);
  }
  int *dl, *dv, *dout;
  CK(cudaMalloc(&dl, n * sizeof(int)));
  CK(cudaMalloc(&dv, n * sizeof(int)));
  CK(cudaMalloc(&dout, labels * sizeof(int)));
  CK(cudaMemcpy(dl, lab.data(), n * sizeof(int), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dv, val.data(), n * sizeof(int), cudaMemcpyHostToDevice));
  CK(cudaMemset(dout, 0, labels * sizeof(int)));
  label_max<<<n / 256, 256>>>(dl, dv, dout, n);
  CK(cudaGetLastError());
  CK(cudaMemcpy(got.data(), dout, labels * sizeof(int), cudaMemcpyDeviceToHost));
  for (int l = 0; l < labels; l++)
    EXPECT_RESULT(got[l] == want[l], "label %d: max %d, want %d", l, got[l], want[l]);
  CK(cudaFree(dl));
  CK(cudaFree(dv));
  CK(cudaFree(dout));
  std::printf("checked cg::reduce over cg::labeled_partition (%d labels)\n", labels);
}

KCHECK_MAIN({"shfl_reduce", check_shfl_reduce}, {"shfl_scan", check_shfl_scan},
            {"vote", check_vote}, {"match_redux", check_match_redux},
            {"match_all", check_match_all}, {"syncwarp_barrier", check_syncwarp_barrier},
            {"labeled_partition", check_labeled_partition})
