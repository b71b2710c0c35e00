/* Link-time stand-in for libcuda.so.1 (like the toolkit's lib/stubs/libcuda.so): it gives the
 * test programs their DT_NEEDED on libcuda.so.1 and the versioned symbol names of the cuda.h it
 * is compiled against. It is never loaded at run time: the loader finds gpufuse's shim (or no
 * driver, and every call here fails with CUDA_ERROR_STUB_LIBRARY). */
#include <cuda.h>

#define STUB return CUDA_ERROR_STUB_LIBRARY

CUresult CUDAAPI cuInit(unsigned int f) { (void)f; STUB; }
CUresult CUDAAPI cuGetErrorName(CUresult e, const char **s) { (void)e; (void)s; STUB; }
CUresult CUDAAPI cuDeviceGetCount(int *c) { (void)c; STUB; }
CUresult CUDAAPI cuDeviceGet(CUdevice *d, int o) { (void)d; (void)o; STUB; }
CUresult CUDAAPI cuDeviceGetName(char *n, int l, CUdevice d) { (void)n; (void)l; (void)d; STUB; }
CUresult CUDAAPI cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) { (void)v; (void)a; (void)d; STUB; }
CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { (void)c; (void)d; STUB; }
CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice d) { (void)d; STUB; }
CUresult CUDAAPI cuCtxSetCurrent(CUcontext c) { (void)c; STUB; }
#if CUDA_VERSION >= 13000
CUresult CUDAAPI cuCtxCreate(CUcontext *c, CUctxCreateParams *p, unsigned int f, CUdevice d) { (void)c; (void)p; (void)f; (void)d; STUB; }
CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext c) { (void)c; STUB; }
#else
CUresult CUDAAPI cuCtxCreate(CUcontext *c, unsigned int f, CUdevice d) { (void)c; (void)f; (void)d; STUB; }
#endif
CUresult CUDAAPI cuCtxDestroy(CUcontext c) { (void)c; STUB; }
CUresult CUDAAPI cuCtxSynchronize(void) { STUB; }
CUresult CUDAAPI cuModuleLoadData(CUmodule *m, const void *i) { (void)m; (void)i; STUB; }
CUresult CUDAAPI cuModuleUnload(CUmodule m) { (void)m; STUB; }
CUresult CUDAAPI cuModuleGetFunction(CUfunction *f, CUmodule m, const char *n) { (void)f; (void)m; (void)n; STUB; }
CUresult CUDAAPI cuModuleGetGlobal(CUdeviceptr *p, size_t *s, CUmodule m, const char *n) { (void)p; (void)s; (void)m; (void)n; STUB; }
CUresult CUDAAPI cuMemAlloc(CUdeviceptr *p, size_t s) { (void)p; (void)s; STUB; }
CUresult CUDAAPI cuMemFree(CUdeviceptr p) { (void)p; STUB; }
CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr d, const void *h, size_t s) { (void)d; (void)h; (void)s; STUB; }
CUresult CUDAAPI cuMemcpyDtoH(void *h, CUdeviceptr d, size_t s) { (void)h; (void)d; (void)s; STUB; }
CUresult CUDAAPI cuMemsetD8(CUdeviceptr d, unsigned char v, size_t n) { (void)d; (void)v; (void)n; STUB; }
CUresult CUDAAPI cuMemsetD32(CUdeviceptr d, unsigned int v, size_t n) { (void)d; (void)v; (void)n; STUB; }
CUresult CUDAAPI cuStreamCreate(CUstream *s, unsigned int f) { (void)s; (void)f; STUB; }
CUresult CUDAAPI cuStreamDestroy(CUstream s) { (void)s; STUB; }
CUresult CUDAAPI cuStreamSynchronize(CUstream s) { (void)s; STUB; }
CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                unsigned by, unsigned bz, unsigned sh, CUstream s, void **p,
                                void **e) {
  (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)sh; (void)s; (void)p; (void)e;
  STUB;
}
CUresult CUDAAPI cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v) { (void)f; (void)a; (void)v; STUB; }
