// Warp matrix multiply-accumulate (nvcuda::wmma, the PTX wmma.* instructions): each warp computes
// one tile of D = alpha * (A * B + C), A and B row- or column-major, stepping through K, for
// f16 (f32 and f16 accumulators), bf16, tf32, f64 and s8/u8. Inputs are small integers, so every
// product and sum is exact and the results must match the CPU product exactly.
#include <type_traits>
#include <vector>
#include <mma.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "kcheck.h"
using namespace nvcuda;

template <typename TIn, typename TFrag, typename TAcc, int M, int N, int K, typename LA,
          typename LB, bool TF32>
__global__ void wmma_gemm(const TIn* a, const TIn* b, const TAcc* c, TAcc* d, int m, int n, int k,
                          TAcc alpha) {
  int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  if (warp >= (m / M) * (n / N)) return;
  int tm = warp / (n / N) * M, tn = warp % (n / N) * N;
  bool arow = std::is_same<LA, wmma::row_major>::value;
  bool brow = std::is_same<LB, wmma::row_major>::value;
  wmma::fragment<wmma::accumulator, M, N, K, TAcc> acc;
  wmma::load_matrix_sync(acc, c + tm * n + tn, n, wmma::mem_row_major);
  for (int kk = 0; kk < k; kk += K) {
    wmma::fragment<wmma::matrix_a, M, N, K, TFrag, LA> fa;
    wmma::fragment<wmma::matrix_b, M, N, K, TFrag, LB> fb;
    wmma::load_matrix_sync(fa, arow ? a + tm * k + kk : a + kk * m + tm, arow ? k : m);
    wmma::load_matrix_sync(fb, brow ? b + kk * n + tn : b + tn * k + kk, brow ? n : k);
    if (TF32) {
      for (int i = 0; i < fa.num_elements; i++) fa.x[i] = wmma::__float_to_tf32(fa.x[i]);
      for (int i = 0; i < fb.num_elements; i++) fb.x[i] = wmma::__float_to_tf32(fb.x[i]);
    }
    wmma::mma_sync(acc, fa, fb, acc);
  }
  for (int i = 0; i < acc.num_elements; i++) acc.x[i] = alpha * acc.x[i];
  wmma::store_matrix_sync(d + tm * n + tn, acc, n, wmma::mem_row_major);
}

template <typename TIn, typename TFrag, typename TAcc, int M, int N, int K, typename LA,
          typename LB, bool TF32 = false>
static void run(const char* what, int m, int n, int k, int lo, int span) {
  bool arow = std::is_same<LA, wmma::row_major>::value;
  bool brow = std::is_same<LB, wmma::row_major>::value;
  std::vector<int> ai(m * k), bi(k * n);
  std::vector<TIn> a(m * k), b(k * n);
  std::vector<TAcc> c(m * n), d(m * n);
  // A[r][j] and B[j][col] as small integers, stored in each operand's layout.
  for (int r = 0; r < m; r++)
    for (int j = 0; j < k; j++) {
      ai[r * k + j] = (int)(khash(r * k + j) % span) + lo;
      a[arow ? r * k + j : j * m + r] = TIn(ai[r * k + j]);
    }
  for (int j = 0; j < k; j++)
    for (int col = 0; col < n; col++) {
      bi[j * n + col] = (int)(khash(100000 + j * n + col) % span) + lo;
      b[brow ? j * n + col : col * k + j] = TIn(bi[j * n + col]);
    }
  for (int i = 0; i < m * n; i++) c[i] = TAcc((int)(khash(200000 + i) % 9) - 4);
  TIn* da = dev_copy(a.data(), a.size());
  TIn* db = dev_copy(b.data(), b.size());
  TAcc* dc = dev_copy(c.data(), c.size());
  TAcc* dd = dev_alloc<TAcc>(d.size());
  CK(cudaMemset(dd, 0xff, d.size() * sizeof(TAcc)));
  int warps = (m / M) * (n / N);
  wmma_gemm<TIn, TFrag, TAcc, M, N, K, LA, LB, TF32>
      <<<(warps + 3) / 4, 128>>>(da, db, dc, dd, m, n, k, TAcc(2));
  CK_LAUNCH(what);
  to_host(d.data(), dd, d.size());
  for (int r = 0; r < m; r++)
    for (int col = 0; col < n; col++) {
      long long s = (long long)(double)c[r * n + col];
      for (int j = 0; j < k; j++) s += (long long)ai[r * k + j] * bi[j * n + col];
      double got = (double)d[r * n + col];
      EXPECT_RESULT(got == 2.0 * (double)s, "%s D[%d][%d] = %f, want %f", what, r, col, got,
                    2.0 * (double)s);
    }
  std::printf("checked %s: (%dx%d) x (%dx%d), %dx%dx%d tiles, A %s, B %s\n", what, m, k, k, n,
              M, N, K, arow ? "row-major" : "col-major", brow ? "row-major" : "col-major");
  CK(cudaFree(da));
  CK(cudaFree(db));
  CK(cudaFree(dc));
  CK(cudaFree(dd));
}

using row = wmma::row_major;
using col = wmma::col_major;

static void check_f16() {
  run<half, half, float, 16, 16, 16, row, col>("f16 m16n16k16 -> f32", 64, 48, 64, -4, 9);
  run<half, half, float, 32, 8, 16, col, row>("f16 m32n8k16 -> f32", 64, 48, 32, -4, 9);
  run<half, half, half, 8, 32, 16, row, row>("f16 m8n32k16 -> f16", 32, 64, 32, -2, 5);
}
static void check_bf16() {
  run<__nv_bfloat16, __nv_bfloat16, float, 16, 16, 16, col, col>("bf16 m16n16k16", 48, 32, 64,
                                                                 -4, 9);
  run<__nv_bfloat16, __nv_bfloat16, float, 8, 32, 16, row, col>("bf16 m8n32k16", 32, 64, 32, -4,
                                                               9);
}
static void check_tf32() {
  run<float, wmma::precision::tf32, float, 16, 16, 8, row, col, true>("tf32 m16n16k8", 64, 48,
                                                                      40, -8, 17);
  run<float, wmma::precision::tf32, float, 16, 16, 8, col, row, true>("tf32 m16n16k8", 32, 32,
                                                                      64, -8, 17);
}
static void check_f64() {
  run<double, double, double, 8, 8, 4, row, col>("f64 m8n8k4", 40, 24, 36, -8, 17);
  run<double, double, double, 8, 8, 4, col, row>("f64 m8n8k4", 16, 32, 20, -8, 17);
}
static void check_int8() {
  run<signed char, signed char, int, 16, 16, 16, row, col>("s8 m16n16k16", 64, 48, 64, -128, 256);
  // (Row-major B would put the 8-column tiles 8 bytes apart: wmma needs 16-byte alignment.)
  run<unsigned char, unsigned char, int, 32, 8, 16, col, col>("u8 m32n8k16", 64, 32, 48, 0, 256);
}

KCHECK_MAIN({"f16", check_f16}, {"bf16", check_bf16}, {"tf32", check_tf32}, {"f64", check_f64},
            {"int8", check_int8})
