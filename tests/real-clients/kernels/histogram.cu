// Atomics: a 256-bin histogram with global atomics and with per-block shared-memory bins,
// heavy contention on single words (global and shared, 32/64-bit, float and double adds, a CAS
// loop, atomicInc wrap-around, unique tickets), and the other atomic operations on both spaces.
#include <algorithm>
#include <vector>
#include "kcheck.h"

constexpr int kBins = 256;

__global__ void hist_global(const unsigned char* in, unsigned* bins, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    atomicAdd(&bins[in[i]], 1u);
}

__global__ void hist_shared(const unsigned char* in, unsigned* bins, int n) {
  __shared__ unsigned local[kBins];
  for (int b = threadIdx.x; b < kBins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    atomicAdd(&local[in[i]], 1u);
  __syncthreads();
  for (int b = threadIdx.x; b < kBins; b += blockDim.x)
    if (local[b]) atomicAdd(&bins[b], local[b]);
}

static std::vector<unsigned char> hist_input(int n, bool skewed) {
  std::vector<unsigned char> h(n);
  for (int i = 0; i < n; i++) {
    unsigned r = khash(i * 3 + 1);
    h[i] = (unsigned char)(skewed && (r >> 24) < 200 ? 7 : r & 0xff);  // ~78% in bin 7
  }
  return h;
}

static void run_hist(bool shared) {
  const int n = 100000;
  for (int skewed = 0; skewed < 2; skewed++) {
    std::vector<unsigned char> h = hist_input(n, skewed);
    unsigned want[kBins] = {0}, got[kBins];
    for (int i = 0; i < n; i++) want[h[i]]++;
    unsigned char* din = dev_copy(h.data(), n);
    unsigned* dbins = dev_alloc<unsigned>(kBins);
    CK(cudaMemset(dbins, 0, sizeof got));
    if (shared)
      hist_shared<<<24, 256>>>(din, dbins, n);
    else
      hist_global<<<24, 256>>>(din, dbins, n);
    CK_LAUNCH(shared ? "hist_shared" : "hist_global");
    to_host(got, dbins, kBins);
    for (int b = 0; b < kBins; b++)
      EXPECT_RESULT(got[b] == want[b], "%s bin %d: %u, want %u", skewed ? "skewed" : "uniform",
                    b, got[b], want[b]);
    std::printf("checked %s histogram of %d bytes, %s (bin 7: %u)\n",
                shared ? "shared-memory" : "global-atomic", n, skewed ? "skewed" : "uniform",
                got[7]);
    CK(cudaFree(din));
    CK(cudaFree(dbins));
  }
}

static void check_global_atomics() { run_hist(false); }
static void check_shared_atomics() { run_hist(true); }

struct Contended {
  unsigned count;
  unsigned wrap;
  unsigned long long count64;
  float fsum;
  double dsum;
  int cas_max;
  unsigned shared_total;
};

// Every thread hits the same few words.
__global__ void contend(Contended* c, unsigned* tickets, int n, unsigned wrap_limit) {
  __shared__ unsigned s_count;
  __shared__ double s_dsum;
  if (threadIdx.x == 0) {
    s_count = 0;
    s_dsum = 0.0;
  }
  __syncthreads();
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    unsigned t = atomicAdd(&c->count, 1u);
    tickets[t] = i;  // each old value is returned exactly once
    atomicInc(&c->wrap, wrap_limit);
    atomicAdd(&c->count64, 1ull << 33);
    atomicAdd(&c->fsum, 0.5f);
    atomicAdd(&c->dsum, 0.125 * (i % 8));
    // A CAS loop: a maximum of a value computed per thread.
    int v = (int)(khash(i) % 1000000);
    int old = c->cas_max, assumed;
    do {
      assumed = old;
      if (assumed >= v) break;
      old = atomicCAS(&c->cas_max, assumed, v);
    } while (old != assumed);
    atomicAdd(&s_count, 1u);
    atomicAdd(&s_dsum, 1.0);
  }
  __syncthreads();
  if (threadIdx.x == 0 && s_count == (unsigned)s_dsum) atomicAdd(&c->shared_total, s_count);
}

static void check_contention() {
  const int n = 20000, block = 256;
  const unsigned wrap_limit = 999;  // atomicInc: old >= limit ? 0 : old + 1
  Contended* dc = dev_alloc<Contended>(1);
  unsigned* dt = dev_alloc<unsigned>(n);
  CK(cudaMemset(dc, 0, sizeof(Contended)));
  CK(cudaMemset(dt, 0xff, n * sizeof(unsigned)));
  contend<<<(n + block - 1) / block, block>>>(dc, dt, n, wrap_limit);
  CK_LAUNCH("contend");
  Contended c;
  to_host(&c, dc, 1);
  std::vector<unsigned> t(n);
  to_host(t.data(), dt, n);
  int want_max = 0;
  double want_d = 0;
  for (int i = 0; i < n; i++) {
    want_max = std::max(want_max, (int)(khash(i) % 1000000));
    want_d += 0.125 * (i % 8);
  }
  EXPECT_RESULT(c.count == (unsigned)n, "count %u, want %d", c.count, n);
  EXPECT_RESULT(c.wrap == n % (wrap_limit + 1), "atomicInc wrap %u, want %u", c.wrap,
                n % (wrap_limit + 1));
  EXPECT_RESULT(c.count64 == (unsigned long long)n << 33, "count64 %llx", c.count64);
  EXPECT_RESULT(c.fsum == n * 0.5f, "float sum %f, want %f", c.fsum, n * 0.5f);
  EXPECT_RESULT(c.dsum == want_d, "double sum %f, want %f", c.dsum, want_d);
  EXPECT_RESULT(c.cas_max == want_max, "CAS-loop max %d, want %d", c.cas_max, want_max);
  EXPECT_RESULT(c.shared_total == (unsigned)n, "shared counters total %u, want %d",
                c.shared_total, n);
  std::sort(t.begin(), t.end());
  for (int i = 0; i < n; i++)
    EXPECT_RESULT(t[i] == (unsigned)i, "tickets are not a permutation: sorted[%d] = %u", i, t[i]);
  std::printf("checked %d threads on one word each: add (u32, u64, f32, f64), atomicInc wrap,"
              " CAS-loop max, unique tickets, shared-memory u32/f64 adds\n", n);
  CK(cudaFree(dc));
  CK(cudaFree(dt));
}

struct Ops {
  int imin, imax;
  unsigned uand, uor, uxor, usub, exch;
  long long llmin, llmax;
  unsigned long long ulland, ullor, ullxor, ullcas;
};

// The other atomic operations, on global memory (g) and on each block's shared copy (s, from
// init), written back per block (s_out[blockIdx.x]).
__global__ void atomic_ops(const int* in, const Ops* init, Ops* g, Ops* s_out, unsigned* exch_old,
                           int n) {
  __shared__ Ops s;
  if (threadIdx.x == 0) s = *init;
  __syncthreads();
  for (int i = threadIdx.x + blockIdx.x * blockDim.x; i < n; i += blockDim.x * gridDim.x) {
    int x = in[i];
    unsigned u = (unsigned)x * 2654435761u;
    long long l = (long long)x * 1000003LL;
    unsigned long long ul = (unsigned long long)u << 17 | (unsigned)i;
    atomicMin(&g->imin, x);
    atomicMax(&g->imax, x);
    atomicAnd(&g->uand, u | 0x80000001u);
    atomicOr(&g->uor, u & 0x00f0f0f0u);
    atomicXor(&g->uxor, u);
    atomicSub(&g->usub, 3u);
    exch_old[i] = atomicExch(&g->exch, (unsigned)i + 1);
    atomicMin(&g->llmin, l);
    atomicMax(&g->llmax, l);
    atomicAnd(&g->ulland, ul | 0x8000000000000001ull);
    atomicOr(&g->ullor, ul & 0x0f0f0f0f0f0full);
    atomicXor(&g->ullxor, ul);
    atomicCAS(&g->ullcas, (unsigned long long)i, (unsigned long long)i + 1);  // a chain
    atomicMin(&s.imin, x);
    atomicMax(&s.imax, x);
    atomicAnd(&s.uand, u | 0x80000001u);
    atomicOr(&s.uor, u & 0x00f0f0f0u);
    atomicXor(&s.uxor, u);
    atomicSub(&s.usub, 3u);
    atomicMin(&s.llmin, l);
    atomicMax(&s.llmax, l);
    atomicAnd(&s.ulland, ul | 0x8000000000000001ull);
    atomicOr(&s.ullor, ul & 0x0f0f0f0f0f0full);
    atomicXor(&s.ullxor, ul);
  }
  __syncthreads();
  if (threadIdx.x == 0) s_out[blockIdx.x] = s;
}

static void check_atomic_ops() {
  const int n = 4096;
  std::vector<int> h(n);
  for (int i = 0; i < n; i++) h[i] = (int)(khash(i + 99) % 200001) - 100000;
  Ops init = {};
  init.imin = 1 << 30;
  init.imax = -(1 << 30);
  init.uand = ~0u;
  init.usub = 1u << 31;
  init.llmin = 1LL << 60;
  init.llmax = -(1LL << 60);
  init.ulland = ~0ull;
  Ops want = init;
  for (int i = 0; i < n; i++) {
    int x = h[i];
    unsigned u = (unsigned)x * 2654435761u;
    long long l = (long long)x * 1000003LL;
    unsigned long long ul = (unsigned long long)u << 17 | (unsigned)i;
    want.imin = std::min(want.imin, x);
    want.imax = std::max(want.imax, x);
    want.uand &= u | 0x80000001u;
    want.uor |= u & 0x00f0f0f0u;
    want.uxor ^= u;
    want.usub -= 3u;
    want.llmin = std::min(want.llmin, l);
    want.llmax = std::max(want.llmax, l);
    want.ulland &= ul | 0x8000000000000001ull;
    want.ullor |= ul & 0x0f0f0f0f0f0full;
    want.ullxor ^= ul;
  }
  int* din = dev_copy(h.data(), n);
  Ops* dinit = dev_copy(&init, 1);
  Ops* dg = dev_copy(&init, 1);
  const int blocks = 4;
  Ops* ds = dev_alloc<Ops>(blocks);
  unsigned* dx = dev_alloc<unsigned>(n);
  // The CAS chain (i -> i+1) gets as far as the execution order lets it; thread 0's CAS (0 -> 1)
  // always succeeds, so only the range is checked.
  atomic_ops<<<blocks, 256>>>(din, dinit, dg, ds, dx, n);
  CK_LAUNCH("atomic_ops");
  Ops gg, per_block[blocks];
  to_host(&gg, dg, 1);
  to_host(per_block, ds, blocks);
  // Each block's shared copy saw its own elements, from init: combine them.
  Ops ss = init;
  for (const Ops& b : per_block) {
    ss.imin = std::min(ss.imin, b.imin);
    ss.imax = std::max(ss.imax, b.imax);
    ss.uand &= b.uand;
    ss.uor |= b.uor;
    ss.uxor ^= b.uxor ^ init.uxor;
    ss.usub += b.usub - init.usub;
    ss.llmin = std::min(ss.llmin, b.llmin);
    ss.llmax = std::max(ss.llmax, b.llmax);
    ss.ulland &= b.ulland;
    ss.ullor |= b.ullor;
    ss.ullxor ^= b.ullxor ^ init.ullxor;
  }
  const Ops* both[2] = {&gg, &ss};
  const char* names[2] = {"global", "shared"};
  for (int k = 0; k < 2; k++) {
    const Ops& o = *both[k];
    const char* w = names[k];
    EXPECT_RESULT(o.imin == want.imin, "%s atomicMin %d, want %d", w, o.imin, want.imin);
    EXPECT_RESULT(o.imax == want.imax, "%s atomicMax %d, want %d", w, o.imax, want.imax);
    EXPECT_RESULT(o.uand == want.uand, "%s atomicAnd %#x, want %#x", w, o.uand, want.uand);
    EXPECT_RESULT(o.uor == want.uor, "%s atomicOr %#x, want %#x", w, o.uor, want.uor);
    EXPECT_RESULT(o.uxor == want.uxor, "%s atomicXor %#x, want %#x", w, o.uxor, want.uxor);
    EXPECT_RESULT(o.usub == want.usub, "%s atomicSub %#x, want %#x", w, o.usub, want.usub);
    EXPECT_RESULT(o.llmin == want.llmin, "%s atomicMin s64 %lld, want %lld", w, o.llmin, want.llmin);
    EXPECT_RESULT(o.llmax == want.llmax, "%s atomicMax s64 %lld, want %lld", w, o.llmax, want.llmax);
    EXPECT_RESULT(o.ulland == want.ulland, "%s atomicAnd u64 %llx, want %llx", w, o.ulland, want.ulland);
    EXPECT_RESULT(o.ullor == want.ullor, "%s atomicOr u64 %llx, want %llx", w, o.ullor, want.ullor);
    EXPECT_RESULT(o.ullxor == want.ullxor, "%s atomicXor u64 %llx, want %llx", w, o.ullxor, want.ullxor);
  }
  EXPECT_RESULT(gg.ullcas >= 1 && gg.ullcas <= (unsigned long long)n, "CAS chain %llu", gg.ullcas);
  // atomicExch: the old values returned plus the final value are the initial value (0) and
  // every value written (1..n), each once.
  std::vector<unsigned> olds(n);
  to_host(olds.data(), dx, n);
  olds.push_back(gg.exch);
  std::sort(olds.begin(), olds.end());
  for (int i = 0; i <= n; i++)
    EXPECT_RESULT(olds[i] == (unsigned)i, "atomicExch values: sorted[%d] = %u", i, olds[i]);
  std::printf("checked min/max/and/or/xor/sub (32 and 64 bit) on global and shared memory,"
              " atomicExch permutation, 64-bit CAS\n");
  CK(cudaFree(din));
  CK(cudaFree(dinit));
  CK(cudaFree(dg));
  CK(cudaFree(ds));
  CK(cudaFree(dx));
}

KCHECK_MAIN({"global_atomics", check_global_atomics}, {"shared_atomics", check_shared_atomics},
            {"contention", check_contention}, {"atomic_ops", check_atomic_ops})
