/* NVRTC + driver API: compile a kernel to PTX at run time (--gpu-architecture=compute_80), load it
 * with cuModuleLoadData, launch it with cuLaunchKernel using kernelParams and again using the
 * `extra` packed-buffer form, and touch a module global with cuModuleGetGlobal.
 * Built against NVRTC 12.9 and 13.5, linked to a stub libcuda.so.1 (the loader finds gpufuse's).
 * With --cubin the module is instead NVRTC's cubin for the device's own architecture
 * (--gpu-architecture=sm_XY, as NVIDIA's *_nvrtc samples compile): SASS, which the emulated GPU
 * runs through gpufuse's NVRTC interposer (crates/nvrtc-shim: the "cubin" is a fatbin of the
 * cubin and its PTX).
 * Usage: nvrtc_launch [--launch-only] [--cubin] */
#include <cuda.h>
#include <nvrtc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CU(call)                                                                         \
  do {                                                                                   \
    CUresult cu_err_ = (call);                                                           \
    if (cu_err_ != CUDA_SUCCESS) {                                                       \
      const char *cu_name_ = NULL;                                                       \
      cuGetErrorName(cu_err_, &cu_name_);                                                \
      fprintf(stderr, "FAIL %s:%d: %s returned %d (%s)\n", __FILE__, __LINE__, #call,    \
              (int)cu_err_, cu_name_ ? cu_name_ : "?");                                  \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

#define NVRTC(call)                                                                      \
  do {                                                                                   \
    nvrtcResult nv_err_ = (call);                                                        \
    if (nv_err_ != NVRTC_SUCCESS) {                                                      \
      fprintf(stderr, "FAIL %s:%d: %s returned %s\n", __FILE__, __LINE__, #call,         \
              nvrtcGetErrorString(nv_err_));                                             \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

#define EXPECT(cond, ...)                                                                \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      fprintf(stderr, "FAIL %s:%d: expected %s: ", __FILE__, __LINE__, #cond);           \
      fprintf(stderr, __VA_ARGS__);                                                      \
      fputc('\n', stderr);                                                               \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

static const char *kSource =
    "__device__ int g_table[4];\n"
    "extern \"C\" __global__ void axpbc(const float* x, float* y, float a, int n, char c,\n"
    "                                   double b) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) y[i] = a * x[i] + (float)b + (float)c + (float)g_table[i % 4];\n"
    "}\n";

static int g_mismatches = 0;

static void check_results(const float *x, const float *y, int n, float a, char c, double b,
                          const int *table, const char *how, int verify) {
  if (!verify) return;
  for (int i = 0; i < n; i++) {
    float want = a * x[i] + (float)b + (float)c + (float)table[i % 4];
    if (y[i] != want) {
      if (g_mismatches++ < 5)
        fprintf(stderr, "MISMATCH %s: y[%d] = %f, want %f\n", how, i, y[i], want);
    }
  }
}

int main(int argc, char **argv) {
  int verify = 1, cubin_mode = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--launch-only") == 0) {
      verify = 0;
    } else if (strcmp(argv[i], "--cubin") == 0) {
      cubin_mode = 1;
    } else {
      fprintf(stderr, "FAIL: unknown argument %s\n", argv[i]);
      return 2;
    }
  }

  int major = 0, minor = 0;
  NVRTC(nvrtcVersion(&major, &minor));
  printf("nvrtc=%d.%d\n", major, minor);

  /* Compile to PTX. */
  nvrtcProgram prog;
  NVRTC(nvrtcCreateProgram(&prog, kSource, "axpbc.cu", 0, NULL, NULL));
  const char *opts[] = {"--gpu-architecture=compute_80", "-default-device"};
  nvrtcResult cr = nvrtcCompileProgram(prog, 2, opts);
  if (cr != NVRTC_SUCCESS) {
    size_t log_size = 0;
    nvrtcGetProgramLogSize(prog, &log_size);
    char *log = malloc(log_size + 1);
    nvrtcGetProgramLog(prog, log);
    fprintf(stderr, "FAIL: nvrtcCompileProgram: %s\n%s\n", nvrtcGetErrorString(cr), log);
    return 1;
  }
  size_t ptx_size = 0;
  NVRTC(nvrtcGetPTXSize(prog, &ptx_size));
  char *ptx = malloc(ptx_size);
  NVRTC(nvrtcGetPTX(prog, ptx));
  NVRTC(nvrtcDestroyProgram(&prog));
  EXPECT(strstr(ptx, ".target sm_80") != NULL, "PTX does not target sm_80");
  printf("ptx_bytes=%zu\n", ptx_size);

  /* Driver: primary context of device 0. */
  CU(cuInit(0));
  int count = 0;
  CU(cuDeviceGetCount(&count));
  EXPECT(count >= 1, "cuDeviceGetCount %d", count);
  CUdevice dev;
  CU(cuDeviceGet(&dev, 0));
  char name[256];
  CU(cuDeviceGetName(name, sizeof name, dev));
  int ccmaj = 0, ccmin = 0;
  CU(cuDeviceGetAttribute(&ccmaj, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
  CU(cuDeviceGetAttribute(&ccmin, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
  printf("device=%s cc=%d.%d\n", name, ccmaj, ccmin);
  EXPECT(ccmaj * 10 + ccmin >= 80, "compute capability %d.%d", ccmaj, ccmin);
  CUcontext ctx;
  CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CU(cuCtxSetCurrent(ctx));

  const void *image = ptx;
  if (cubin_mode) {
    char arch[64];
    snprintf(arch, sizeof arch, "--gpu-architecture=sm_%d%d", ccmaj, ccmin);
    nvrtcProgram sass;
    NVRTC(nvrtcCreateProgram(&sass, kSource, "axpbc.cu", 0, NULL, NULL));
    const char *sass_opts[] = {arch, "-default-device"};
    NVRTC(nvrtcCompileProgram(sass, 2, sass_opts));
    size_t cubin_size = 0;
    NVRTC(nvrtcGetCUBINSize(sass, &cubin_size));
    char *cubin = malloc(cubin_size);
    NVRTC(nvrtcGetCUBIN(sass, cubin));
    NVRTC(nvrtcDestroyProgram(&sass));
    printf("cubin_bytes=%zu (%s)\n", cubin_size, arch);
    image = cubin;
  }
  CUmodule mod;
  CU(cuModuleLoadData(&mod, image));
  CUfunction fn;
  CU(cuModuleGetFunction(&fn, mod, "axpbc"));
  CUfunction missing;
  CUresult nf = cuModuleGetFunction(&missing, mod, "no_such_kernel");
  EXPECT(nf == CUDA_ERROR_NOT_FOUND, "cuModuleGetFunction(no_such_kernel) returned %d", (int)nf);

  /* The module global: its size, and a write/read round trip through it. */
  CUdeviceptr g_table;
  size_t g_size = 0;
  CU(cuModuleGetGlobal(&g_table, &g_size, mod, "g_table"));
  EXPECT(g_size == 4 * sizeof(int), "g_table size %zu", g_size);
  int table[4] = {1, -2, 30, 400}, table_back[4] = {0};
  CU(cuMemcpyHtoD(g_table, table, sizeof table));
  CU(cuMemcpyDtoH(table_back, g_table, sizeof table_back));
  EXPECT(memcmp(table, table_back, sizeof table) == 0, "module global round trip");

  const int n = 100003;
  float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
  for (int i = 0; i < n; i++) x[i] = (float)(i % 512) - 100.0f;
  CUdeviceptr dx, dy;
  CU(cuMemAlloc(&dx, n * sizeof(float)));
  CU(cuMemAlloc(&dy, n * sizeof(float)));
  CU(cuMemcpyHtoD(dx, x, n * sizeof(float)));
  CUstream stream;
  CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  unsigned block = 128, grid = (n + block - 1) / block;

  /* 1: kernelParams. */
  float a = 2.5f;
  int nn = n;
  char c = 3;
  double b = 0.25;
  void *params[] = {&dx, &dy, &a, &nn, &c, &b};
  CU(cuMemsetD8(dy, 0xFF, n * sizeof(float)));
  CU(cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, stream, params, NULL));
  CU(cuStreamSynchronize(stream));
  CU(cuCtxSynchronize());
  printf("launched kernelParams\n");
  CU(cuMemcpyDtoH(y, dy, n * sizeof(float)));
  check_results(x, y, n, a, c, b, table, "kernelParams", verify);

  /* 2: extra, a buffer packed at the device-side offsets: x@0 y@8 a@16 n@20 c@24 b@32. */
  unsigned char packed[40];
  memset(packed, 0, sizeof packed);
  float a2 = -1.0f;
  char c2 = -5;
  double b2 = 1000.0;
  memcpy(packed + 0, &dx, 8);
  memcpy(packed + 8, &dy, 8);
  memcpy(packed + 16, &a2, 4);
  memcpy(packed + 20, &nn, 4);
  memcpy(packed + 24, &c2, 1);
  memcpy(packed + 32, &b2, 8);
  size_t packed_size = sizeof packed;
  void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, packed, CU_LAUNCH_PARAM_BUFFER_SIZE,
                   &packed_size, CU_LAUNCH_PARAM_END};
  CU(cuMemsetD8(dy, 0xFF, n * sizeof(float)));
  CU(cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, stream, NULL, extra));
  CU(cuStreamSynchronize(stream));
  printf("launched extra\n");
  CU(cuMemcpyDtoH(y, dy, n * sizeof(float)));
  check_results(x, y, n, a2, c2, b2, table, "extra", verify);

  /* Both forms at once is invalid. */
  CUresult both = cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, stream, params, extra);
  EXPECT(both == CUDA_ERROR_INVALID_VALUE, "kernelParams and extra together returned %d",
         (int)both);
  CU(cuStreamSynchronize(stream));

  CU(cuStreamDestroy(stream));
  CU(cuMemFree(dx));
  CU(cuMemFree(dy));
  CU(cuModuleUnload(mod));
  CU(cuDevicePrimaryCtxRelease(dev));

  /* A context of our own, made and destroyed with the header's cuCtxCreate. */
  CUcontext own;
#if CUDA_VERSION >= 13000
  CU(cuCtxCreate(&own, NULL, 0, dev));
#else
  CU(cuCtxCreate(&own, 0, dev));
#endif
  CUdeviceptr tmp;
  CU(cuMemAlloc(&tmp, 4096));
  CU(cuMemsetD32(tmp, 0xCAFEu, 1024));
  unsigned int words[1024];
  CU(cuMemcpyDtoH(words, tmp, sizeof words));
  for (int i = 0; i < 1024; i++) EXPECT(words[i] == 0xCAFEu, "cuMemsetD32 word %d = %x", i, words[i]);
  CU(cuMemFree(tmp));
#if CUDA_VERSION >= 13000
  CU(cuCtxSynchronize_v2(own));
#endif
  CU(cuCtxDestroy(own));

  free(x);
  free(y);
  free(ptx);
  if (g_mismatches) {
    fprintf(stderr, "FAIL nvrtc_launch: %d result mismatches\n", g_mismatches);
    return 1;
  }
  printf(verify ? "PASS nvrtc_launch (results checked)\n" : "PASS nvrtc_launch (launches only)\n");
  return 0;
}
