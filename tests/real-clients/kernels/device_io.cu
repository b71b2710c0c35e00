// Device-side printf and malloc/free (new/delete). printf: its output reaches the program's stdout at the next synchronizing call,
// in order with the program's own (buffered) printf output. test_kernels_nvcc.py checks the
// exact lines and their order.
#include "kcheck.h"

__global__ void say(int launch, const int* v) {
  int t = threadIdx.x;
  printf("device launch %d thread %d value %d hex %#x float %.2f str %s\n", launch, t, v[t],
         v[t], v[t] * 0.5, t % 2 ? "odd" : "even");
}

static void check_printf() {
  int host[4] = {10, -20, 30, 255};
  int* dv = dev_alloc<int>(4);
  CK(cudaMemcpy(dv, host, sizeof host, cudaMemcpyHostToDevice));
  std::printf("host before\n");
  say<<<1, 4>>>(0, dv);
  say<<<1, 2>>>(1, dv);
  CK(cudaDeviceSynchronize());
  std::printf("host between\n");
  say<<<1, 1>>>(2, dv);
  CK(cudaDeviceSynchronize());
  std::printf("host after\n");
  std::printf("checked device printf of 3 launches around host output\n");
  CK(cudaFree(dv));
}

struct Node {
  int value;
  Node* next;
};

// Each thread builds a linked list of `len` nodes with new, sums it and deletes it; a malloc
// beyond the heap (8 MiB by default) returns NULL.
__global__ void lists(const int* lens, long long* sums, int* nulls) {
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  Node* head = nullptr;
  for (int i = 0; i < lens[t]; i++) {
    Node* n = new Node;
    n->value = t * 100 + i;
    n->next = head;
    head = n;
  }
  long long s = 0;
  while (head) {
    Node* n = head->next;
    s += head->value;
    delete head;
    head = n;
  }
  sums[t] = s;
  if (t == 0) nulls[0] = malloc(64u << 20) == nullptr;
}

__global__ void keep(int** slot) {
  int* p = (int*)malloc(4 * sizeof(int));
  for (int i = 0; i < 4; i++) p[i] = 7 * i;
  *slot = p;
}

__global__ void take(int** slot, int* out) {
  int* p = *slot;
  for (int i = 0; i < 4; i++) out[i] = p[i];
  free(p);
}

static void check_malloc() {
  const int n = 256;
  int lens[n];
  for (int t = 0; t < n; t++) lens[t] = t % 13;
  int* dl = dev_alloc<int>(n);
  long long* ds = dev_alloc<long long>(n);
  int* dn = dev_alloc<int>(1);
  CK(cudaMemcpy(dl, lens, sizeof lens, cudaMemcpyHostToDevice));
  lists<<<4, 64>>>(dl, ds, dn);
  CK_LAUNCH("lists");
  long long sums[n];
  int nulls = 0;
  to_host(sums, ds, n);
  to_host(&nulls, dn, 1);
  for (int t = 0; t < n; t++) {
    long long want = 0;
    for (int i = 0; i < lens[t]; i++) want += t * 100 + i;
    EXPECT_RESULT(sums[t] == want, "thread %d: %lld, want %lld", t, sums[t], want);
  }
  EXPECT_RESULT(nulls == 1, "malloc of 64 MiB did not return NULL");
  int** slot = dev_alloc<int*>(1);
  int* dout = dev_alloc<int>(4);
  keep<<<1, 1>>>(slot);
  CK_LAUNCH("keep");
  take<<<1, 1>>>(slot, dout);
  CK_LAUNCH("take");
  int got[4];
  to_host(got, dout, 4);
  for (int i = 0; i < 4; i++) EXPECT_RESULT(got[i] == 7 * i, "kept block [%d]: %d", i, got[i]);
  std::printf("checked new/delete lists of 256 threads, NULL past the heap, a block across launches\n");
  CK(cudaFree(dl));
  CK(cudaFree(ds));
  CK(cudaFree(dn));
  CK(cudaFree(slot));
  CK(cudaFree(dout));
}

// cudaDeviceSetLimit(cudaLimitMallocHeapSize) before the first kernel that uses malloc sizes
// the heap: a 48 MiB block fits a 96 MiB heap (and not the default 8 MiB one); once a kernel has
// its heap the limit can no longer change (cudaErrorInvalidValue), and reads back as set. The
// heap beyond the default is charged to the session (cudaMemGetInfo's free shrinks).
__global__ void big_block(int* ok) {
  char* p = (char*)malloc(48u << 20);
  ok[0] = p != nullptr;
  if (p) {
    p[0] = 1;
    p[(48u << 20) - 1] = 2;
    ok[1] = p[0] + p[(48u << 20) - 1];
    free(p);
  }
}

static void check_heap_limit() {
  size_t free_before = 0, total = 0, free_after = 0;
  CK(cudaMemGetInfo(&free_before, &total));
  CK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, 96u << 20));
  size_t heap = 0;
  CK(cudaDeviceGetLimit(&heap, cudaLimitMallocHeapSize));
  EXPECT_RESULT(heap >= (96u << 20), "heap limit reads %zu", heap);
  CK(cudaMemGetInfo(&free_after, &total));
  int* ok = dev_alloc<int>(2);
  big_block<<<1, 1>>>(ok);
  CK_LAUNCH("big_block");
  int got[2] = {0, 0};
  to_host(got, ok, 2);
  EXPECT_RESULT(got[0] == 1 && got[1] == 3, "48 MiB malloc in a 96 MiB heap: ok %d sum %d", got[0],
                got[1]);
  cudaError_t again = cudaDeviceSetLimit(cudaLimitMallocHeapSize, 200u << 20);
  EXPECT_RESULT(again == cudaErrorInvalidValue, "heap limit after a kernel used it: %s",
                cudaGetErrorName(again));
  cudaGetLastError();
  std::printf("checked a 96 MiB heap: a 48 MiB device malloc, the limit fixed after use "
              "(free memory %zu -> %zu MiB)\n", free_before >> 20, free_after >> 20);
  CK(cudaFree(ok));
}

KCHECK_MAIN({"printf", check_printf}, {"malloc", check_malloc}, {"heap_limit", check_heap_limit})
