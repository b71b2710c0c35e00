// Matrix transpose through a shared-memory tile padded to TILE+1 columns (no bank conflicts),
// blocks of 32x8 threads each moving four rows, on sizes that are not multiples of the tile;
// 4-byte and 8-byte elements, and a naive transpose for comparison.
#include <vector>
#include "kcheck.h"

constexpr int TILE = 32, ROWS = 8;

template <typename T>
__global__ void transpose_tiled(const T* in, T* out, int rows, int cols) {
  __shared__ T tile[TILE][TILE + 1];
  int x = blockIdx.x * TILE + threadIdx.x;
  int y = blockIdx.y * TILE + threadIdx.y;
  for (int j = 0; j < TILE; j += ROWS)
    if (x < cols && y + j < rows) tile[threadIdx.y + j][threadIdx.x] = in[(y + j) * cols + x];
  __syncthreads();
  x = blockIdx.y * TILE + threadIdx.x;  // transposed block
  y = blockIdx.x * TILE + threadIdx.y;
  for (int j = 0; j < TILE; j += ROWS)
    if (x < rows && y + j < cols) out[(y + j) * rows + x] = tile[threadIdx.x][threadIdx.y + j];
}

template <typename T>
__global__ void transpose_naive(const T* in, T* out, int rows, int cols) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < cols && y < rows) out[x * rows + y] = in[y * cols + x];
}

template <typename T>
static void run(const char* what, int rows, int cols, bool tiled) {
  std::vector<T> h(rows * cols), got(rows * cols);
  for (int i = 0; i < rows * cols; i++) h[i] = T(i) * T(3) + T(khash(i) & 1);
  T* din = dev_copy(h.data(), h.size());
  T* dout = dev_alloc<T>(h.size());
  CK(cudaMemset(dout, 0xff, h.size() * sizeof(T)));
  dim3 grid((cols + TILE - 1) / TILE, (rows + TILE - 1) / TILE);
  if (tiled)
    transpose_tiled<T><<<grid, dim3(TILE, ROWS)>>>(din, dout, rows, cols);
  else
    transpose_naive<T><<<dim3((cols + 15) / 16, (rows + 15) / 16), dim3(16, 16)>>>(din, dout, rows, cols);
  CK_LAUNCH(what);
  to_host(got.data(), dout, got.size());
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++)
      EXPECT_RESULT(got[c * rows + r] == h[r * cols + c], "%s out[%d][%d] = %f, want %f", what, c,
                    r, (double)got[c * rows + r], (double)h[r * cols + c]);
  std::printf("checked %s of a %dx%d matrix\n", what, rows, cols);
  CK(cudaFree(din));
  CK(cudaFree(dout));
}

static void check_tiled() {
  run<float>("transpose_tiled<float>", 200, 136, true);
  run<float>("transpose_tiled<float>", 64, 96, true);
  run<double>("transpose_tiled<double>", 45, 129, true);
}
static void check_naive() { run<unsigned>("transpose_naive<unsigned>", 77, 150, false); }

KCHECK_MAIN({"tiled", check_tiled}, {"naive", check_naive})
