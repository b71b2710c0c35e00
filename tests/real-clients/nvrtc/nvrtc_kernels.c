/* Kernels compiled at run time by NVRTC (12.9 or 13.5, whichever this was built against) to PTX
 * for compute_80, loaded with cuModuleLoadData and launched with cuLaunchKernel, results checked
 * against the CPU. Usage: nvrtc_kernels CHECK...  (no CHECK: all). Each check compiles its own
 * source and prints "PASS CHECK (results checked)".
 *   templates       a templated kernel instantiated for int and double through
 *                   nvrtcAddNameExpression / nvrtcGetLoweredName (C++17, a constexpr lambda)
 *   warp_reduce     block sum with __shfl_down_sync and atomicAdd (64-bit)
 *   histogram       shared-memory atomics, heavy contention, merged with global atomics
 *   dynamic_shared  extern __shared__ above 48 KiB (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
 *   constant        __constant__ memory written through cuModuleGetGlobal + cuMemcpyHtoD
 *   math            sinf/cosf/expf/logf/sqrtf/powf/tanhf and double exp/log within the CUDA C++
 *                   Programming Guide's maximum ulp errors (see kernels/math.cu)
 *   fast_math       the same source compiled with --use_fast_math: __sinf/__expf/__logf bounds */
#include <cuda.h>
#include <math.h>
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

static int g_mismatches = 0;

#define EXPECT_RESULT(cond, ...)                                                         \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      if (g_mismatches++ < 5) {                                                          \
        fprintf(stderr, "MISMATCH %s:%d: %s: ", __FILE__, __LINE__, #cond);              \
        fprintf(stderr, __VA_ARGS__);                                                    \
        fputc('\n', stderr);                                                             \
      }                                                                                  \
    }                                                                                    \
  } while (0)

static unsigned khash(unsigned x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

/* Compiles src (with extra options, and name expressions whose lowered names are returned in
 * lowered[]), loads the PTX as a module. */
static CUmodule compile_load(const char *name, const char *src, const char **extra, int n_extra,
                             const char **exprs, const char **lowered, int n_exprs) {
  nvrtcProgram prog;
  NVRTC(nvrtcCreateProgram(&prog, src, name, 0, NULL, NULL));
  for (int i = 0; i < n_exprs; i++) NVRTC(nvrtcAddNameExpression(prog, exprs[i]));
  const char *opts[8] = {"--gpu-architecture=compute_80", "-default-device", "-std=c++17"};
  int n_opts = 3;
  for (int i = 0; i < n_extra; i++) opts[n_opts++] = extra[i];
  nvrtcResult cr = nvrtcCompileProgram(prog, n_opts, opts);
  if (cr != NVRTC_SUCCESS) {
    size_t log_size = 0;
    nvrtcGetProgramLogSize(prog, &log_size);
    char *log = malloc(log_size + 1);
    nvrtcGetProgramLog(prog, log);
    fprintf(stderr, "FAIL: nvrtcCompileProgram(%s): %s\n%s\n", name, nvrtcGetErrorString(cr), log);
    exit(1);
  }
  for (int i = 0; i < n_exprs; i++) {
    const char *l = NULL;
    NVRTC(nvrtcGetLoweredName(prog, exprs[i], &l));
    lowered[i] = strdup(l);
  }
  size_t ptx_size = 0;
  NVRTC(nvrtcGetPTXSize(prog, &ptx_size));
  char *ptx = malloc(ptx_size);
  NVRTC(nvrtcGetPTX(prog, ptx));
  NVRTC(nvrtcDestroyProgram(&prog));
  CUmodule mod;
  CU(cuModuleLoadData(&mod, ptx));
  free(ptx);
  return mod;
}

static CUdeviceptr dev_copy(const void *h, size_t bytes) {
  CUdeviceptr d;
  CU(cuMemAlloc(&d, bytes));
  CU(cuMemcpyHtoD(d, h, bytes));
  return d;
}

static void launch(CUfunction f, unsigned grid, unsigned block, unsigned shared, void **params) {
  CU(cuLaunchKernel(f, grid, 1, 1, block, 1, 1, shared, NULL, params, NULL));
  CU(cuCtxSynchronize());
}

/* ---- templates ------------------------------------------------------------------------------- */

static const char *kTemplates =
    "template <typename T, int K>\n"
    "__global__ void poly(const T* x, T* y, int n) {\n"
    "  auto f = [](T v) constexpr { return v * v * T(K) + T(1); };\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) y[i] = f(x[i]);\n"
    "}\n";

static void check_templates(void) {
  const char *exprs[2] = {"poly<int, 3>", "poly<double, -2>"};
  const char *lowered[2];
  CUmodule mod = compile_load("templates.cu", kTemplates, NULL, 0, exprs, lowered, 2);
  printf("lowered names: %s %s\n", lowered[0], lowered[1]);
  const int n = 1000;
  int xi[1000], yi[1000];
  double xd[1000], yd[1000];
  for (int i = 0; i < n; i++) {
    xi[i] = (int)(khash(i) % 201) - 100;
    xd[i] = xi[i] * 0.125;
  }
  CUfunction fi, fd;
  CU(cuModuleGetFunction(&fi, mod, lowered[0]));
  CU(cuModuleGetFunction(&fd, mod, lowered[1]));
  CUdeviceptr dxi = dev_copy(xi, sizeof xi), dyi, dxd = dev_copy(xd, sizeof xd), dyd;
  CU(cuMemAlloc(&dyi, sizeof yi));
  CU(cuMemAlloc(&dyd, sizeof yd));
  int nn = n;
  void *pi[] = {&dxi, &dyi, &nn}, *pd[] = {&dxd, &dyd, &nn};
  launch(fi, (n + 127) / 128, 128, 0, pi);
  launch(fd, (n + 127) / 128, 128, 0, pd);
  CU(cuMemcpyDtoH(yi, dyi, sizeof yi));
  CU(cuMemcpyDtoH(yd, dyd, sizeof yd));
  for (int i = 0; i < n; i++) {
    EXPECT_RESULT(yi[i] == xi[i] * xi[i] * 3 + 1, "poly<int,3>(%d) = %d", xi[i], yi[i]);
    EXPECT_RESULT(yd[i] == xd[i] * xd[i] * -2.0 + 1.0, "poly<double,-2>(%f) = %f", xd[i], yd[i]);
  }
  printf("checked poly<int, 3> and poly<double, -2> (lowered names, constexpr lambda) on %d inputs\n", n);
  CU(cuMemFree(dxi));
  CU(cuMemFree(dyi));
  CU(cuMemFree(dxd));
  CU(cuMemFree(dyd));
  CU(cuModuleUnload(mod));
}

/* ---- warp_reduce ------------------------------------------------------------------------------ */

static const char *kWarpReduce =
    "extern \"C\" __global__ void block_sum(const int* in, unsigned long long* total, int n) {\n"
    "  __shared__ long long warp_sums[32];\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  long long v = i < n ? in[i] : 0;\n"
    "  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);\n"
    "  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = v;\n"
    "  __syncthreads();\n"
    "  if (threadIdx.x < 32) {\n"
    "    v = threadIdx.x < blockDim.x / 32 ? warp_sums[threadIdx.x] : 0;\n"
    "    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
    "    if (threadIdx.x == 0) atomicAdd(total, (unsigned long long)v);\n"
    "  }\n"
    "}\n";

static void check_warp_reduce(void) {
  CUmodule mod = compile_load("warp_reduce.cu", kWarpReduce, NULL, 0, NULL, NULL, 0);
  CUfunction f;
  CU(cuModuleGetFunction(&f, mod, "block_sum"));
  const int n = 20000;
  int *h = malloc(n * sizeof(int));
  long long want = 0;
  for (int i = 0; i < n; i++) {
    h[i] = (int)(khash(i) % 2000001) - 1000000;
    want += h[i];
  }
  CUdeviceptr din = dev_copy(h, n * sizeof(int)), dtot;
  CU(cuMemAlloc(&dtot, 8));
  CU(cuMemsetD8(dtot, 0, 8));
  int nn = n;
  void *p[] = {&din, &dtot, &nn};
  launch(f, (n + 255) / 256, 256, 0, p);
  long long got = 0;
  CU(cuMemcpyDtoH(&got, dtot, 8));
  EXPECT_RESULT(got == want, "sum %lld, want %lld", got, want);
  printf("checked shuffle block sums of %d ints combined by atomicAdd: %lld\n", n, got);
  free(h);
  CU(cuMemFree(din));
  CU(cuMemFree(dtot));
  CU(cuModuleUnload(mod));
}

/* ---- histogram -------------------------------------------------------------------------------- */

static const char *kHistogram =
    "extern \"C\" __global__ void hist(const unsigned char* in, unsigned* bins, int n) {\n"
    "  __shared__ unsigned local[256];\n"
    "  for (int b = threadIdx.x; b < 256; b += blockDim.x) local[b] = 0;\n"
    "  __syncthreads();\n"
    "  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)\n"
    "    atomicAdd(&local[in[i]], 1u);\n"
    "  __syncthreads();\n"
    "  for (int b = threadIdx.x; b < 256; b += blockDim.x)\n"
    "    if (local[b]) atomicAdd(&bins[b], local[b]);\n"
    "}\n";

static void check_histogram(void) {
  CUmodule mod = compile_load("histogram.cu", kHistogram, NULL, 0, NULL, NULL, 0);
  CUfunction f;
  CU(cuModuleGetFunction(&f, mod, "hist"));
  const int n = 60000;
  unsigned char *h = malloc(n);
  unsigned want[256] = {0}, got[256];
  for (int i = 0; i < n; i++) {
    unsigned r = khash(i);
    h[i] = (r >> 24) < 180 ? 42 : (unsigned char)r;  /* most bytes in one bin */
    want[h[i]]++;
  }
  CUdeviceptr din = dev_copy(h, n), dbins;
  CU(cuMemAlloc(&dbins, sizeof got));
  CU(cuMemsetD32(dbins, 0, 256));
  int nn = n;
  void *p[] = {&din, &dbins, &nn};
  launch(f, 16, 256, 0, p);
  CU(cuMemcpyDtoH(got, dbins, sizeof got));
  for (int b = 0; b < 256; b++) EXPECT_RESULT(got[b] == want[b], "bin %d: %u, want %u", b, got[b], want[b]);
  printf("checked a shared-memory histogram of %d bytes (bin 42: %u)\n", n, got[42]);
  free(h);
  CU(cuMemFree(din));
  CU(cuMemFree(dbins));
  CU(cuModuleUnload(mod));
}

/* ---- dynamic_shared --------------------------------------------------------------------------- */

static const char *kDynShared =
    "extern \"C\" __global__ void reverse_blocks(const float* in, float* out, int per_block) {\n"
    "  extern __shared__ float buf[];\n"
    "  const float* src = in + (size_t)blockIdx.x * per_block;\n"
    "  for (int k = threadIdx.x; k < per_block; k += blockDim.x) buf[k] = src[k];\n"
    "  __syncthreads();\n"
    "  for (int k = threadIdx.x; k < per_block; k += blockDim.x)\n"
    "    out[(size_t)blockIdx.x * per_block + k] = buf[per_block - 1 - k] * 2.0f;\n"
    "}\n";

static void check_dynamic_shared(void) {
  CUmodule mod = compile_load("dyn_shared.cu", kDynShared, NULL, 0, NULL, NULL, 0);
  CUfunction f;
  CU(cuModuleGetFunction(&f, mod, "reverse_blocks"));
  const int per_block = 20000, blocks = 3, n = per_block * blocks; /* 80000 bytes per block */
  unsigned shared = per_block * sizeof(float);
  CU(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)shared));
  float *h = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
  for (int i = 0; i < n; i++) h[i] = (float)(i % 1000) - 0.5f;
  CUdeviceptr din = dev_copy(h, n * sizeof(float)), dout;
  CU(cuMemAlloc(&dout, n * sizeof(float)));
  int pb = per_block;
  void *p[] = {&din, &dout, &pb};
  launch(f, blocks, 256, shared, p);
  CU(cuMemcpyDtoH(got, dout, n * sizeof(float)));
  for (int b = 0; b < blocks; b++)
    for (int k = 0; k < per_block; k++) {
      float want = h[b * per_block + per_block - 1 - k] * 2.0f;
      EXPECT_RESULT(got[b * per_block + k] == want, "block %d [%d] = %f, want %f", b, k,
                    got[b * per_block + k], want);
    }
  printf("checked %u bytes of dynamic shared memory per block, %d blocks\n", shared, blocks);
  free(h);
  free(got);
  CU(cuMemFree(din));
  CU(cuMemFree(dout));
  CU(cuModuleUnload(mod));
}

/* ---- constant --------------------------------------------------------------------------------- */

static const char *kConstant =
    "__constant__ float c_coeffs[16];\n"
    "__constant__ int c_shift;\n"
    "extern \"C\" __global__ void poly_eval(const float* x, float* y, int n) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i >= n) return;\n"
    "  float acc = 0.0f;\n"
    "  for (int k = 15; k >= 0; k--) acc = __fmaf_rn(acc, x[i], c_coeffs[k]);\n"
    "  y[i] = acc + (float)c_coeffs[(i + c_shift) & 15];\n"
    "}\n";

static void check_constant(void) {
  CUmodule mod = compile_load("constant.cu", kConstant, NULL, 0, NULL, NULL, 0);
  CUfunction f;
  CU(cuModuleGetFunction(&f, mod, "poly_eval"));
  float coeffs[16];
  for (int k = 0; k < 16; k++) coeffs[k] = (float)(k % 5) - 2.0f + 0.25f * k;
  int shift = 5;
  CUdeviceptr dc, ds;
  size_t sc = 0, ss = 0;
  CU(cuModuleGetGlobal(&dc, &sc, mod, "c_coeffs"));
  CU(cuModuleGetGlobal(&ds, &ss, mod, "c_shift"));
  EXPECT_RESULT(sc == sizeof coeffs && ss == sizeof(int), "global sizes %zu %zu", sc, ss);
  CU(cuMemcpyHtoD(dc, coeffs, sizeof coeffs));
  CU(cuMemcpyHtoD(ds, &shift, sizeof shift));
  const int n = 4096;
  float x[4096], y[4096];
  for (int i = 0; i < n; i++) x[i] = ((int)(khash(i) % 2001) - 1000) / 1024.0f;
  CUdeviceptr dx = dev_copy(x, sizeof x), dy;
  CU(cuMemAlloc(&dy, sizeof y));
  int nn = n;
  void *p[] = {&dx, &dy, &nn};
  launch(f, n / 256, 256, 0, p);
  CU(cuMemcpyDtoH(y, dy, sizeof y));
  for (int i = 0; i < n; i++) {
    float acc = 0.0f;
    for (int k = 15; k >= 0; k--) acc = fmaf(acc, x[i], coeffs[k]);
    float want = acc + coeffs[(i + shift) & 15];
    EXPECT_RESULT(y[i] == want, "y[%d] = %a, want %a", i, y[i], want);
  }
  printf("checked a polynomial with __constant__ coefficients set by cuModuleGetGlobal + cuMemcpyHtoD\n");
  CU(cuMemFree(dx));
  CU(cuMemFree(dy));
  CU(cuModuleUnload(mod));
}

/* ---- math, fast_math -------------------------------------------------------------------------- */

static const char *kMath =
    "extern \"C\" __global__ void mathf(const float* x, float* out, int n) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i >= n) return;\n"
    "  float a = x[i];\n"
    "  float* o = out + i * 8;\n"
    "  o[0] = sinf(a); o[1] = cosf(a); o[2] = expf(a * 0.25f); o[3] = logf(fabsf(a) + 0.5f);\n"
    "  o[4] = sqrtf(fabsf(a)); o[5] = powf(fabsf(a) + 0.5f, 1.5f); o[6] = tanhf(a * 0.5f);\n"
    "  o[7] = a / 3.0f;\n"
    "}\n"
    "extern \"C\" __global__ void mathd(const double* x, double* out, int n) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i >= n) return;\n"
    "  out[2 * i] = exp(x[i] * 0.25);\n"
    "  out[2 * i + 1] = log(fabs(x[i]) + 0.5);\n"
    "}\n";

static int64_t ordered_f(float f) {
  int32_t i;
  memcpy(&i, &f, 4);
  return i < 0 ? (int64_t)INT32_MIN - i : i;
}

static double ulps_f(float got, double exact) {
  float want = (float)exact;
  if (isnan(got) || isnan(want)) return isnan(got) && isnan(want) ? 0 : 1e30;
  int64_t d = ordered_f(got) - ordered_f(want);
  return (double)(d < 0 ? -d : d);
}

static void run_math(int fast) {
  const char *fast_opt[1] = {"--use_fast_math"};
  CUmodule mod = compile_load(fast ? "fast_math.cu" : "math.cu", kMath, fast_opt, fast ? 1 : 0,
                              NULL, NULL, 0);
  CUfunction ff, fd;
  CU(cuModuleGetFunction(&ff, mod, "mathf"));
  CU(cuModuleGetFunction(&fd, mod, "mathd"));
  enum { N = 1024 };
  static float x[N], out[N * 8];
  static double xd[N], outd[N * 2];
  for (int i = 0; i < N; i++) {
    /* within [-pi, pi] so the fast intrinsics have their absolute bounds */
    x[i] = (float)(((double)khash(i) / 4294967296.0 * 2.0 - 1.0) * 3.14159);
    xd[i] = ((double)khash(i + N) / 4294967296.0 * 2.0 - 1.0) * 100.0;
  }
  CUdeviceptr dx = dev_copy(x, sizeof x), dout, dxd = dev_copy(xd, sizeof xd), doutd;
  CU(cuMemAlloc(&dout, sizeof out));
  CU(cuMemAlloc(&doutd, sizeof outd));
  int n = N;
  void *pf[] = {&dx, &dout, &n}, *pd[] = {&dxd, &doutd, &n};
  launch(ff, N / 128, 128, 0, pf);
  launch(fd, N / 128, 128, 0, pd);
  CU(cuMemcpyDtoH(out, dout, sizeof out));
  CU(cuMemcpyDtoH(outd, doutd, sizeof outd));
  static const char *names[8] = {"sinf", "cosf", "expf", "logf", "sqrtf", "powf", "tanhf", "x/3"};
  /* Default: the Programming Guide's table of single-precision functions (ulps). */
  static const double ulp_bound[8] = {2, 2, 2, 1, 0, 4, 2, 0};
  double worst[8] = {0};
  for (int i = 0; i < N; i++) {
    double a = x[i];
    double exact[8] = {sin(a), cos(a), exp((double)(x[i] * 0.25f)), log((double)(fabsf(x[i]) + 0.5f)),
                       sqrt(fabs(a)), pow((double)(fabsf(x[i]) + 0.5f), 1.5), tanh((double)(x[i] * 0.5f)),
                       a / 3.0};
    for (int k = 0; k < 8; k++) {
      float got = out[i * 8 + k];
      int ok;
      double err;
      if (!fast) {
        err = ulps_f(got, exact[k]);
        ok = err <= ulp_bound[k];
      } else if (k == 0 || k == 1) {
        /* __sinf/__cosf: max absolute error 2^-21.41 for x in [-pi, pi]. */
        err = fabs(got - exact[k]);
        ok = err <= exp2(-21.41);
      } else if (k == 2) {
        /* __expf: max ulp error 2 + floor(abs(1.173 * x)). */
        err = ulps_f(got, exact[k]);
        ok = err <= 2 + floor(fabs(1.173 * (x[i] * 0.25f)));
      } else if (k == 3) {
        /* __logf: max abs error 2^-21.41 for x in [0.5, 2], 3 ulp otherwise. */
        float arg = fabsf(x[i]) + 0.5f;
        err = arg <= 2.0f ? fabs(got - exact[k]) : ulps_f(got, exact[k]);
        ok = arg <= 2.0f ? err <= exp2(-21.41) : err <= 3;
      } else if (k == 6) {
        /* tanhf becomes tanh.approx.f32: max relative error 2^-10.987 (PTX ISA). */
        err = fabs(got - exact[k]) / (fabs(exact[k]) + 1e-30);
        ok = err <= exp2(-10.98);
      } else {
        /* sqrtf, powf (__powf), division under --use_fast_math: no documented bound in ulps;
         * a loose relative check only. */
        err = fabs(got - exact[k]) / (fabs(exact[k]) + 1e-30);
        ok = err <= 1e-5;
      }
      if (err > worst[k]) worst[k] = err;
      EXPECT_RESULT(ok, "%s %s(%.9g) = %.9g, want %.9g", fast ? "fast" : "default", names[k],
                    x[i], got, exact[k]);
    }
    double dexact[2] = {exp(xd[i] * 0.25), log(fabs(xd[i]) + 0.5)};
    for (int k = 0; k < 2; k++) {
      /* exp, log in double: 1 ulp; measured against the host's double functions (themselves
       * within 1 ulp), so 2 ulps apart at most. */
      double got = outd[i * 2 + k];
      double rel = fabs(got - dexact[k]) / fabs(dexact[k]);
      EXPECT_RESULT(rel <= 2 * 2.220446049250313e-16, "%s(%.17g) = %.17g, want %.17g",
                    k ? "log" : "exp", xd[i], got, dexact[k]);
    }
  }
  for (int k = 0; k < 8; k++) printf("checked %-6s worst %.3g\n", names[k], worst[k]);
  CU(cuMemFree(dx));
  CU(cuMemFree(dout));
  CU(cuMemFree(dxd));
  CU(cuMemFree(doutd));
  CU(cuModuleUnload(mod));
}

static void check_math(void) { run_math(0); }
static void check_fast_math(void) { run_math(1); }

/* ---- main ------------------------------------------------------------------------------------ */

struct Check {
  const char *name;
  void (*run)(void);
};

static const struct Check kChecks[] = {
    {"templates", check_templates},   {"warp_reduce", check_warp_reduce},
    {"histogram", check_histogram},   {"dynamic_shared", check_dynamic_shared},
    {"constant", check_constant},     {"math", check_math},
    {"fast_math", check_fast_math},
};
#define N_CHECKS ((int)(sizeof kChecks / sizeof kChecks[0]))

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    int known = 0;
    for (int c = 0; c < N_CHECKS; c++) known |= strcmp(argv[i], kChecks[c].name) == 0;
    if (!known) {
      fprintf(stderr, "FAIL: unknown check %s\n", argv[i]);
      return 2;
    }
  }
  int major = 0, minor = 0;
  NVRTC(nvrtcVersion(&major, &minor));
  printf("nvrtc=%d.%d\n", major, minor);
  CU(cuInit(0));
  CUdevice dev;
  CU(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CU(cuCtxSetCurrent(ctx));
  int failed = 0;
  for (int c = 0; c < N_CHECKS; c++) {
    int selected = argc == 1;
    for (int i = 1; i < argc; i++) selected |= strcmp(argv[i], kChecks[c].name) == 0;
    if (!selected) continue;
    g_mismatches = 0;
    kChecks[c].run();
    if (g_mismatches) {
      fprintf(stderr, "FAIL %s: %d result mismatches\n", kChecks[c].name, g_mismatches);
      failed++;
    } else {
      printf("PASS %s (results checked)\n", kChecks[c].name);
    }
    fflush(stdout);
  }
  CU(cuDevicePrimaryCtxRelease(dev));
  return failed ? 1 : 0;
}
