// Tiled matrix multiply (shared-memory tiles, __syncthreads, 2D grid and block) on sizes that are
// not multiples of the tile, float and double, against a CPU product. Inputs are small integers,
// so every partial sum is exact and the results must match exactly.
#include <vector>
#include "kcheck.h"

template <typename T, int TILE>
__global__ void matmul_tiled(const T* a, const T* b, T* c, int m, int n, int k) {
  __shared__ T as[TILE][TILE];
  __shared__ T bs[TILE][TILE];
  int row = blockIdx.y * TILE + threadIdx.y;
  int col = blockIdx.x * TILE + threadIdx.x;
  T acc = 0;
  for (int t = 0; t < k; t += TILE) {
    as[threadIdx.y][threadIdx.x] = (row < m && t + threadIdx.x < k) ? a[row * k + t + threadIdx.x] : T(0);
    bs[threadIdx.y][threadIdx.x] = (col < n && t + threadIdx.y < k) ? b[(t + threadIdx.y) * n + col] : T(0);
    __syncthreads();
#pragma unroll
    for (int j = 0; j < TILE; j++) acc += as[threadIdx.y][j] * bs[j][threadIdx.x];
    __syncthreads();
  }
  if (row < m && col < n) c[row * n + col] = acc;
}

template <typename T, int TILE>
static void run(const char* what, int m, int n, int k) {
  std::vector<T> a(m * k), b(k * n), c(m * n), want(m * n, T(0));
  for (int i = 0; i < m * k; i++) a[i] = T((int)(khash(i) % 17) - 8);
  for (int i = 0; i < k * n; i++) b[i] = T((int)(khash(i + 100000) % 13) - 6);
  for (int r = 0; r < m; r++)
    for (int j = 0; j < k; j++)
      for (int col = 0; col < n; col++) want[r * n + col] += a[r * k + j] * b[j * n + col];
  T* da = dev_copy(a.data(), a.size());
  T* db = dev_copy(b.data(), b.size());
  T* dc = dev_alloc<T>(c.size());
  CK(cudaMemset(dc, 0xff, c.size() * sizeof(T)));
  dim3 block(TILE, TILE), grid((n + TILE - 1) / TILE, (m + TILE - 1) / TILE);
  matmul_tiled<T, TILE><<<grid, block>>>(da, db, dc, m, n, k);
  CK_LAUNCH(what);
  to_host(c.data(), dc, c.size());
  for (int i = 0; i < m * n; i++)
    EXPECT_RESULT(c[i] == want[i], "%s C[%d][%d] = %f, want %f", what, i / n, i % n,
                  (double)c[i], (double)want[i]);
  std::printf("checked %s: (%dx%d) x (%dx%d), %dx%d tiles, grid %ux%u\n", what, m, k, k, n,
              TILE, TILE, grid.x, grid.y);
  CK(cudaFree(da));
  CK(cudaFree(db));
  CK(cudaFree(dc));
}

static void check_float() { run<float, 16>("matmul_tiled<float,16>", 100, 72, 90); }
static void check_double() { run<double, 8>("matmul_tiled<double,8>", 37, 53, 61); }
static void check_int() { run<int, 32>("matmul_tiled<int,32>", 64, 33, 70); }

KCHECK_MAIN({"float", check_float}, {"double", check_double}, {"int", check_int})
