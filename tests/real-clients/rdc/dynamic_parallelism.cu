// Dynamic parallelism (CDP2, device-side launches): a recursive sum where each grid launches
// its two halves, a parent that launches a child per block with arguments and dynamic shared
// memory, a tail launch that runs after its parent's other work, and a launch error that
// device code reads with cudaGetLastError. Built with -rdc=true -lcudadevrt, as NVIDIA's cdp
// samples are; the host checks every result.
#include <vector>
#include "../kernels/kcheck.h"

// Sums v[lo, hi) into *out: ranges above 64 elements are split between two child grids whose
// partial sums land in a scratch pair, and a tail-launched grid adds them up.
__global__ void add_pair(const long long* parts, long long* out) { *out = parts[0] + parts[1]; }

__global__ void tree_sum(const int* v, int lo, int hi, long long* out, long long* scratch,
                         int node) {
  if (threadIdx.x != 0) return;
  int n = hi - lo;
  if (n <= 64) {
    long long s = 0;
    for (int i = lo; i < hi; i++) s += v[i];
    *out = s;
    return;
  }
  int mid = lo + n / 2;
  // Grid `node` of the binary tree (children 2 * node + 1 and 2 * node + 2) keeps its halves'
  // sums in scratch[2 * node], scratch[2 * node + 1].
  long long* parts = scratch + 2 * node;
  tree_sum<<<1, 32>>>(v, lo, mid, &parts[0], scratch, 2 * node + 1);
  tree_sum<<<1, 32>>>(v, mid, hi, &parts[1], scratch, 2 * node + 2);
  add_pair<<<1, 1, 0, cudaStreamTailLaunch>>>(parts, out);
}

static void check_tree_sum() {
  const int n = 5000;
  std::vector<int> h(n);
  long long want = 0;
  for (int i = 0; i < n; i++) {
    h[i] = (i * 7919) % 1000 - 300;
    want += h[i];
  }
  int* v = dev_copy(h.data(), n);
  long long* out = dev_alloc<long long>(1);
  // Halving 5000 elements until at most 64 are left takes 7 levels below the root: node
  // numbers stay below 2^8.
  long long* scratch = dev_alloc<long long>(2 * 256);
  tree_sum<<<1, 32>>>(v, 0, n, out, scratch, 0);
  CK_LAUNCH("tree_sum");
  long long got = 0;
  CK(cudaMemcpy(&got, out, sizeof got, cudaMemcpyDeviceToHost));
  EXPECT_RESULT(got == want, "sum %lld, want %lld", got, want);
}

// Each element of the child's range gets scale * (base + i) + the block's sum of thread
// indices, computed in dynamic shared memory.
__global__ void child(int* out, int base, int n, int scale) {
  extern __shared__ int cells[];
  cells[threadIdx.x] = threadIdx.x;
  __syncthreads();
  int s = 0;
  for (int k = 0; k < blockDim.x; k++) s += cells[k];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[base + i] = scale * (base + i) + s;
}

__global__ void parent(int* out, int per_block, int* status) {
  if (threadIdx.x == 0) {
    child<<<(per_block + 63) / 64, 64, 64 * sizeof(int)>>>(out, blockIdx.x * per_block,
                                                         per_block, blockIdx.x + 2);
    status[blockIdx.x] = (int)cudaGetLastError();
  }
}

static void check_children() {
  const int blocks = 6, per_block = 100;
  int* out = dev_alloc<int>(blocks * per_block);
  int* status = dev_alloc<int>(blocks);
  CK(cudaMemset(status, 0xff, blocks * sizeof(int)));
  parent<<<blocks, 32>>>(out, per_block, status);
  CK_LAUNCH("parent");
  std::vector<int> h(blocks * per_block), st(blocks);
  CK(cudaMemcpy(h.data(), out, h.size() * sizeof(int), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(st.data(), status, st.size() * sizeof(int), cudaMemcpyDeviceToHost));
  for (int b = 0; b < blocks; b++) {
    EXPECT_RESULT(st[b] == 0, "block %d: launch status %d", b, st[b]);
    for (int i = 0; i < per_block; i++) {
      int at = b * per_block + i;
      int want = (b + 2) * at + 63 * 64 / 2;
      EXPECT_RESULT(h[at] == want, "out[%d] = %d, want %d", at, h[at], want);
    }
  }
}

__global__ void never(int* p) { *p = 1; }

// A block of 2048 threads cannot launch: cudaErrorInvalidConfiguration in device code, and
// the child never runs.
__global__ void bad_launch(int* status, int* touched) {
  never<<<1, 2048>>>(touched);
  status[0] = (int)cudaPeekAtLastError();
  status[1] = (int)cudaGetLastError();
  status[2] = (int)cudaGetLastError();
}

static void check_launch_error() {
  int* status = dev_alloc<int>(3);
  int* touched = dev_alloc<int>(1);
  CK(cudaMemset(touched, 0, sizeof(int)));
  bad_launch<<<1, 1>>>(status, touched);
  CK_LAUNCH("bad_launch");
  int st[3], t = -1;
  CK(cudaMemcpy(st, status, sizeof st, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(&t, touched, sizeof t, cudaMemcpyDeviceToHost));
  EXPECT_RESULT(st[0] == cudaErrorInvalidConfiguration && st[1] == cudaErrorInvalidConfiguration &&
                    st[2] == cudaSuccess,
                "statuses %d %d %d", st[0], st[1], st[2]);
  EXPECT_RESULT(t == 0, "the failed child ran");
}

KCHECK_MAIN({"tree_sum", check_tree_sum}, {"children", check_children},
            {"launch_error", check_launch_error})
