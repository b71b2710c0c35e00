// Real calls in device code (PTX `call`): __noinline__ functions with scalar, double, pointer and
// struct arguments and a struct return, recursion, calls through function pointers, and a callee
// that synchronizes the block.
#include <vector>
#include "kcheck.h"

struct Acc {
  int i;
  float f;
  double d;
};

__device__ __noinline__ int mix(int a, int b) { return a * 31 + (b ^ 0x5a5a); }

__device__ __noinline__ Acc step(Acc acc, int x, float scale, double w, const int* table) {
  acc.i += mix(x, table[x & 15]);
  acc.f += scale * (float)x;
  acc.d += w * table[(x >> 4) & 15];
  return acc;
}

__global__ void noinline_calls(const int* in, const int* table, Acc* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  Acc acc = {0, 0.0f, 0.0};
  for (int k = 0; k < 4; k++) acc = step(acc, in[i] + k, 0.5f, 0.25 * k, table);
  out[i] = acc;
}

static Acc host_step(Acc acc, int x, float scale, double w, const int* table) {
  acc.i += x * 31 + (table[x & 15] ^ 0x5a5a);
  acc.f += scale * (float)x;
  acc.d += w * table[(x >> 4) & 15];
  return acc;
}

static void check_noinline() {
  const int n = 1000;
  std::vector<int> h(n), table(16);
  for (int i = 0; i < n; i++) h[i] = (int)(khash(i) % 5000);
  for (int i = 0; i < 16; i++) table[i] = i * i * 3 - 20;
  int* din = dev_copy(h.data(), n);
  int* dt = dev_copy(table.data(), 16);
  Acc* dout = dev_alloc<Acc>(n);
  noinline_calls<<<(n + 127) / 128, 128>>>(din, dt, dout, n);
  CK_LAUNCH("noinline_calls");
  std::vector<Acc> got(n);
  to_host(got.data(), dout, n);
  for (int i = 0; i < n; i++) {
    Acc want = {0, 0.0f, 0.0};
    for (int k = 0; k < 4; k++) want = host_step(want, h[i] + k, 0.5f, 0.25 * k, table.data());
    EXPECT_RESULT(got[i].i == want.i && got[i].f == want.f && got[i].d == want.d,
                  "thread %d: {%d, %f, %f}, want {%d, %f, %f}", i, got[i].i, got[i].f, got[i].d,
                  want.i, want.f, want.d);
  }
  std::printf("checked __noinline__ calls (int, float, double, pointer and struct arguments,"
              " struct return), %d threads\n", n);
  CK(cudaFree(din));
  CK(cudaFree(dt));
  CK(cudaFree(dout));
}

__device__ __noinline__ unsigned fib(unsigned k) { return k < 2 ? k : fib(k - 1) + fib(k - 2); }
__device__ __noinline__ int depth_sum(const int* a, int k) {  // a frame per level, with a local array
  int local[4] = {a[k], a[k] * 2, a[k] * 3, k};
  return k == 0 ? local[0] : local[k & 3] + depth_sum(a, k - 1);
}

__global__ void recursion(const int* a, unsigned* fibs, int* sums, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  fibs[i] = fib(i % 16);
  sums[i] = depth_sum(a, i % 24);
}

static void check_recursion() {
  const int n = 64;
  std::vector<int> a(24);
  for (int i = 0; i < 24; i++) a[i] = i * 5 - 40;
  int* da = dev_copy(a.data(), 24);
  unsigned* df = dev_alloc<unsigned>(n);
  int* ds = dev_alloc<int>(n);
  recursion<<<2, 32>>>(da, df, ds, n);
  CK_LAUNCH("recursion");
  std::vector<unsigned> f(n);
  std::vector<int> s(n);
  to_host(f.data(), df, n);
  to_host(s.data(), ds, n);
  for (int i = 0; i < n; i++) {
    unsigned x = 0, y = 1;
    for (int k = 0; k < i % 16; k++) {
      unsigned t = x + y;
      x = y;
      y = t;
    }
    int want = 0;
    for (int k = i % 24; k >= 0; k--) {
      int local[4] = {a[k], a[k] * 2, a[k] * 3, k};
      want += k == 0 ? local[0] : local[k & 3];
    }
    EXPECT_RESULT(f[i] == x, "fib(%d) = %u, want %u", i % 16, f[i], x);
    EXPECT_RESULT(s[i] == want, "depth_sum(%d) = %d, want %d", i % 24, s[i], want);
  }
  std::printf("checked recursive calls: fib(0..15), a 24-deep recursion with local arrays per frame\n");
  CK(cudaFree(da));
  CK(cudaFree(df));
  CK(cudaFree(ds));
}

typedef int (*BinOp)(int, int);
__device__ int op_add(int a, int b) { return a + b; }
__device__ int op_sub(int a, int b) { return a - b; }
__device__ int op_mul(int a, int b) { return a * b; }
__device__ int op_mix(int a, int b) { return mix(a, b); }

// The function's address is taken in the kernel (mov.u64 %rd, op_add): no module-level table
// (a __device__ table of function pointers is fn_table.cu).
__global__ void indirect(const int* a, const int* b, int* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int sel = (a[i] ^ b[i]) & 3;  // divergent targets within a warp
  BinOp f = sel == 0 ? op_add : sel == 1 ? op_sub : sel == 2 ? op_mul : op_mix;
  out[i] = f(a[i], b[i]);
}

static void check_function_pointers() {
  const int n = 512;
  std::vector<int> a(n), b(n), got(n);
  for (int i = 0; i < n; i++) {
    a[i] = (int)(khash(i) % 1000) - 500;
    b[i] = (int)(khash(i + n) % 1000) - 500;
  }
  int* da = dev_copy(a.data(), n);
  int* db = dev_copy(b.data(), n);
  int* dout = dev_alloc<int>(n);
  indirect<<<n / 128, 128>>>(da, db, dout, n);
  CK_LAUNCH("indirect");
  to_host(got.data(), dout, n);
  for (int i = 0; i < n; i++) {
    int x = a[i], y = b[i], want = 0;
    switch ((x ^ y) & 3) {
      case 0: want = x + y; break;
      case 1: want = x - y; break;
      case 2: want = x * y; break;
      case 3: want = x * 31 + (y ^ 0x5a5a); break;
    }
    EXPECT_RESULT(got[i] == want, "op %d(%d, %d) = %d, want %d", (x ^ y) & 3, x, y, got[i], want);
  }
  std::printf("checked indirect calls through function pointers, divergent targets\n");
  CK(cudaFree(da));
  CK(cudaFree(db));
  CK(cudaFree(dout));
}

__device__ __noinline__ int block_sum(int* s, int v) {
  s[threadIdx.x] = v;
  __syncthreads();
  for (int st = blockDim.x / 2; st > 0; st >>= 1) {
    if ((int)threadIdx.x < st) s[threadIdx.x] += s[threadIdx.x + st];
    __syncthreads();
  }
  int r = s[0];
  __syncthreads();
  return r;
}

__global__ void barrier_callee(const int* in, int* out) {
  __shared__ int s[256];
  int t = threadIdx.x;
  int total = block_sum(s, in[blockIdx.x * blockDim.x + t]);
  int total2 = block_sum(s, t);
  if (t == 0) {
    out[blockIdx.x * 2] = total;
    out[blockIdx.x * 2 + 1] = total2;
  }
}

static void check_barrier_in_callee() {
  const int blocks = 4, n = blocks * 256;
  std::vector<int> h(n), got(blocks * 2);
  for (int i = 0; i < n; i++) h[i] = (int)(khash(i) % 100);
  int* din = dev_copy(h.data(), n);
  int* dout = dev_alloc<int>(blocks * 2);
  barrier_callee<<<blocks, 256>>>(din, dout);
  CK_LAUNCH("barrier_callee");
  to_host(got.data(), dout, got.size());
  for (int b = 0; b < blocks; b++) {
    int want = 0;
    for (int t = 0; t < 256; t++) want += h[b * 256 + t];
    EXPECT_RESULT(got[b * 2] == want, "block %d sum %d, want %d", b, got[b * 2], want);
    EXPECT_RESULT(got[b * 2 + 1] == 255 * 256 / 2, "block %d sum of tids %d", b, got[b * 2 + 1]);
  }
  std::printf("checked a __noinline__ callee with __syncthreads, called twice per block\n");
  CK(cudaFree(din));
  CK(cudaFree(dout));
}

KCHECK_MAIN({"noinline", check_noinline}, {"recursion", check_recursion},
            {"function_pointers", check_function_pointers},
            {"barrier_in_callee", check_barrier_in_callee})
