/* A driver call from a thread's exit: a pthread key's destructor frees device memory after
 * the thread's C++/Rust thread-locals are gone (glibc runs those first), as an allocator's
 * per-thread cache does. Found on an H200 (2026-11-27): PyTorch's exit made such calls, the
 * shim read a destroyed thread-local, and the call failed with CUDA_ERROR_UNKNOWN and a
 * panic message. */
#include <pthread.h>

#include "rt.h"

static pthread_key_t key;
static cudaError_t freed_at_exit = cudaErrorUnknown;

static void free_at_exit(void *p) {
  freed_at_exit = cudaFree(p);
}

static void *thread_main(void *arg) {
  (void)arg;
  void *p = NULL;
  CK(cudaSetDevice(0));
  CK(cudaMalloc(&p, 1 << 20));
  CK(cudaMemset(p, 1, 1 << 20));
  CK(cudaDeviceSynchronize());
  CK(pthread_setspecific(key, p) == 0 ? cudaSuccess : cudaErrorUnknown);
  return NULL;
}

void check_thread_exit_calls(void) {
  pthread_t t;
  EXPECT(pthread_key_create(&key, free_at_exit) == 0, "pthread_key_create");
  EXPECT(pthread_create(&t, NULL, thread_main, NULL) == 0, "pthread_create");
  EXPECT(pthread_join(t, NULL) == 0, "pthread_join");
  EXPECT(freed_at_exit == cudaSuccess, "cudaFree from a thread's exit returned %d (%s)",
         (int)freed_at_exit, cudaGetErrorString(freed_at_exit));
  pthread_key_delete(key);
}
