// Double precision: IEEE-exact operations against the CPU (fma, add, mul, div, sqrt, reciprocal
// — all correctly rounded on the device with nvcc's defaults, so results must be bit-identical),
// subnormals (doubles are never flushed), special values, conversions with every rounding mode,
// and a double reduction (shared memory, 64-bit shuffles, atomicAdd on double).
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <vector>
#include "kcheck.h"

static uint64_t bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}
static bool same(double a, double b) { return bits(a) == bits(b) || (std::isnan(a) && std::isnan(b)); }

constexpr int kOps = 8;

__global__ void ieee_ops(const double* x, const double* y, const double* z, double* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  double a = x[i], b = y[i], c = z[i];
  double* o = out + i * kOps;
  o[0] = fma(a, b, c);
  o[1] = __dadd_rn(a, b);
  o[2] = __dmul_rn(a, b);
  o[3] = a / b;
  o[4] = sqrt(fabs(a));
  o[5] = 1.0 / b;
  o[6] = __dsub_rn(a, c);
  o[7] = fmax(a, b) - fmin(b, c);  // sub contracted into nothing: still one rounding
}

static std::vector<double> inputs(int n, unsigned seed) {
  std::vector<double> v(n);
  for (int i = 0; i < n; i++) {
    unsigned r = khash(i * 7 + seed);
    double mant = 1.0 + (double)khash(r) / 4294967296.0 + (double)r / 1.8446744073709552e19;
    int e = (int)(r % 80) - 40;
    v[i] = std::ldexp(mant, e) * ((r & 0x100) ? -1.0 : 1.0);
  }
  // Subnormals, zeros, infinities, NaN, huge and tiny values.
  const double specials[] = {0.0, -0.0, 4.9406564584124654e-324, -2.2250738585072009e-308,
                             1.0e-310, INFINITY, -INFINITY, NAN, 1.7976931348623157e308,
                             2.2250738585072014e-308, 3.0, -7.5};
  for (int s = 0; s < 12; s++) v[(s * 37 + seed) % n] = specials[s];
  return v;
}

static void check_ieee() {
  const int n = 2048;
  std::vector<double> x = inputs(n, 1), y = inputs(n, 2), z = inputs(n, 3);
  for (int i = 0; i < 64; i++) y[i] = std::ldexp(1.0 + i / 64.0, -1070);  // subnormal products
  double* dx = dev_copy(x.data(), n);
  double* dy = dev_copy(y.data(), n);
  double* dz = dev_copy(z.data(), n);
  double* dout = dev_alloc<double>(n * kOps);
  ieee_ops<<<(n + 127) / 128, 128>>>(dx, dy, dz, dout, n);
  CK_LAUNCH("ieee_ops");
  std::vector<double> got(n * kOps);
  to_host(got.data(), dout, got.size());
  const char* names[kOps] = {"fma", "add", "mul", "div", "sqrt", "rcp", "sub", "fmax-fmin"};
  for (int i = 0; i < n; i++) {
    double a = x[i], b = y[i], c = z[i];
    volatile double vb = b;  // keep the host from contracting anything
    double want[kOps] = {std::fma(a, b, c), a + vb, a * vb, a / vb, std::sqrt(std::fabs(a)),
                         1.0 / vb, a - c, std::fmax(a, b) - std::fmin(b, c)};
    for (int k = 0; k < kOps; k++)
      EXPECT_RESULT(same(got[i * kOps + k], want[k]), "%s(%a, %a, %a) = %a, want %a", names[k], a,
                    b, c, got[i * kOps + k], want[k]);
  }
  std::printf("checked fma/add/mul/div/sqrt/rcp/sub/fmax/fmin on %d double triples bit-exactly"
              " (subnormals, zeros, inf, NaN included)\n", n);
  CK(cudaFree(dx));
  CK(cudaFree(dy));
  CK(cudaFree(dz));
  CK(cudaFree(dout));
}

constexpr int kConv = 11;

__global__ void conversions(const double* x, long long* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  double a = x[i];
  long long* o = out + i * kConv;
  o[0] = __double2int_rn(a);
  o[1] = __double2int_rz(a);
  o[2] = __double2int_ru(a);
  o[3] = __double2int_rd(a);
  o[4] = __double2ll_rn(a * 1e6);
  o[5] = (long long)__double2uint_rz(a);
  float f = __double2float_rn(a);
  unsigned fb;
  memcpy(&fb, &f, 4);
  o[6] = fb;
  o[7] = __double_as_longlong(__ll2double_rn(o[4] * 3 + 1));
  o[8] = __double_as_longlong(rint(a * 0.5));
  o[9] = __double_as_longlong(floor(a) + ceil(a) * 2.0);
  o[10] = __double_as_longlong(trunc(a) - round(a));
}

static void check_conversions() {
  const int n = 512;
  std::vector<double> x(n);
  for (int i = 0; i < n; i++)
    x[i] = ((int)(khash(i) % 20001) - 10000) / 16.0 + (i % 3 == 0 ? 0.5 : 0.0) + (i % 5) * 1e-9;
  x[0] = 2.5;
  x[1] = -2.5;
  x[2] = 3.5;
  x[3] = -0.5;
  x[4] = 1.0000000596046448;  // between two floats: rz and rn differ
  double* dx = dev_copy(x.data(), n);
  long long* dout = dev_alloc<long long>(n * kConv);
  conversions<<<(n + 127) / 128, 128>>>(dx, dout, n);
  CK_LAUNCH("conversions");
  std::vector<long long> got(n * kConv);
  to_host(got.data(), dout, got.size());
  for (int i = 0; i < n; i++) {
    double a = x[i];
    std::fesetround(FE_TONEAREST);
    long long rn = std::llrint(a), rn6 = std::llrint(a * 1e6);
    float f = (float)a;
    unsigned fb;
    std::memcpy(&fb, &f, 4);
    long long want[kConv] = {rn, (long long)std::trunc(a), (long long)std::ceil(a),
                             (long long)std::floor(a), rn6,
                             a <= 0 ? 0 : (long long)(unsigned)std::trunc(a), fb,
                             (long long)bits((double)(rn6 * 3 + 1)),
                             (long long)bits(std::rint(a * 0.5)),
                             (long long)bits(std::floor(a) + std::ceil(a) * 2.0),
                             (long long)bits(std::trunc(a) - std::round(a))};
    for (int k = 0; k < kConv; k++)
      EXPECT_RESULT(got[i * kConv + k] == want[k], "conversion %d of %.17g: %lld (%#llx), want %lld (%#llx)",
                    k, a, got[i * kConv + k], got[i * kConv + k], want[k], want[k]);
  }
  std::printf("checked double->int (rn/rz/ru/rd), ->s64, ->u32, ->float, s64->double,"
              " rint/floor/ceil/trunc/round on %d values\n", n);
  CK(cudaFree(dx));
  CK(cudaFree(dout));
}

// Sum of squares in double: per-block shared-memory tree, the last warp with 64-bit shuffles,
// block results combined with atomicAdd(double*). Inputs are multiples of 1/64 below 2^10, so
// every partial sum is exact and the order does not matter.
__global__ void dot(const double* x, const double* y, double* result, int n) {
  __shared__ double s[256];
  int t = threadIdx.x;
  double acc = 0.0;
  for (int i = blockIdx.x * blockDim.x + t; i < n; i += gridDim.x * blockDim.x) acc = fma(x[i], y[i], acc);
  s[t] = acc;
  __syncthreads();
  for (int st = blockDim.x / 2; st >= 32; st >>= 1) {
    if (t < st) s[t] += s[t + st];
    __syncthreads();
  }
  if (t < 32) {
    double v = s[t];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if (t == 0) atomicAdd(result, v);
  }
}

static void check_reduction() {
  const int n = 50000;
  std::vector<double> x(n), y(n);
  double want = 0.0;
  for (int i = 0; i < n; i++) {
    x[i] = ((int)(khash(i) % 2001) - 1000) / 64.0;
    y[i] = ((int)(khash(i + n) % 65) - 32) / 8.0;
    want += x[i] * y[i];
  }
  double* dx = dev_copy(x.data(), n);
  double* dy = dev_copy(y.data(), n);
  double* dr = dev_alloc<double>(1);
  CK(cudaMemset(dr, 0, sizeof(double)));
  dot<<<20, 256>>>(dx, dy, dr, n);
  CK_LAUNCH("dot");
  double got;
  to_host(&got, dr, 1);
  EXPECT_RESULT(got == want, "dot %.17g, want %.17g", got, want);
  std::printf("checked double dot product of %d elements = %.6f (shared tree, shuffles, atomicAdd)\n",
              n, got);
  CK(cudaFree(dx));
  CK(cudaFree(dy));
  CK(cudaFree(dr));
}

// Directed rounding (round toward zero / down / up) of arithmetic and conversions, float and
// double, against the host FPU in the same rounding mode.
constexpr int kDir = 16;
static const char* kDirNames[kDir] = {
    "cvt.rz.f32.f64", "cvt.rm.f32.f64", "cvt.rp.f32.f64", "add.rz.f64", "add.rp.f64",
    "mul.rm.f64",     "div.rp.f64",     "sqrt.rm.f64",    "add.rz.f32", "mul.rp.f32",
    "div.rm.f32",     "cvt.rz.f32.s64", "cvt.rp.f64.s64", "cvt.rm.f32.u32", "sqrt.rp.f32",
    "rcp.rz.f32"};

__global__ void directed(const double* x, const double* y, unsigned long long* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  double a = x[i], b = y[i];
  float fa = (float)a, fb = (float)b;
  long long l = (long long)(a * 1e12);
  unsigned u = (unsigned)(long long)(fabs(a) * 1e5);
  unsigned long long* o = out + i * kDir;
  o[0] = __float_as_uint(__double2float_rz(a));
  o[1] = __float_as_uint(__double2float_rd(a));
  o[2] = __float_as_uint(__double2float_ru(a));
  o[3] = __double_as_longlong(__dadd_rz(a, b));
  o[4] = __double_as_longlong(__dadd_ru(a, b));
  o[5] = __double_as_longlong(__dmul_rd(a, b));
  o[6] = __double_as_longlong(__ddiv_ru(a, b));
  o[7] = __double_as_longlong(__dsqrt_rd(fabs(a)));
  o[8] = __float_as_uint(__fadd_rz(fa, fb));
  o[9] = __float_as_uint(__fmul_ru(fa, fb));
  o[10] = __float_as_uint(__fdiv_rd(fa, fb));
  o[11] = __float_as_uint(__ll2float_rz(l));
  o[12] = __double_as_longlong(__ll2double_ru(l * 4099));
  o[13] = __float_as_uint(__uint2float_rd(u));
  o[14] = __float_as_uint(__fsqrt_ru(fabsf(fa)));
  o[15] = __float_as_uint(__frcp_rz(fb));
}

static unsigned long long fbits(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}

static void check_directed_rounding() {
  const int n = 512;
  std::vector<double> x(n), y(n);
  for (int i = 0; i < n; i++) {
    x[i] = ((int)(khash(i) % 200001) - 100000) / 3.0 + 1e-9 * (i % 7);
    y[i] = ((int)(khash(i + n) % 20001) - 10000) / 7.0 + 0.001;
  }
  double* dx = dev_copy(x.data(), n);
  double* dy = dev_copy(y.data(), n);
  unsigned long long* dout = dev_alloc<unsigned long long>(n * kDir);
  directed<<<(n + 127) / 128, 128>>>(dx, dy, dout, n);
  CK_LAUNCH("directed");
  std::vector<unsigned long long> got(n * kDir);
  to_host(got.data(), dout, got.size());
  int bad[kDir] = {0};
  for (int i = 0; i < n; i++) {
    volatile double a = x[i], b = y[i];
    volatile float fa = (float)x[i], fb = (float)y[i];
    long long l = (long long)(x[i] * 1e12);
    unsigned u = (unsigned)(long long)(std::fabs(x[i]) * 1e5);
    volatile long long vl = l, vl2 = l * 4099;
    volatile unsigned vu = u;
    unsigned long long want[kDir];
    std::fesetround(FE_TOWARDZERO);
    want[0] = fbits((float)a);
    want[3] = bits(a + b);
    want[8] = fbits(fa + fb);
    want[11] = fbits((float)vl);
    want[15] = fbits(1.0f / fb);
    std::fesetround(FE_DOWNWARD);
    want[1] = fbits((float)a);
    want[5] = bits(a * b);
    want[7] = bits(std::sqrt(std::fabs(a)));
    want[10] = fbits(fa / fb);
    want[13] = fbits((float)vu);
    std::fesetround(FE_UPWARD);
    want[2] = fbits((float)a);
    want[4] = bits(a + b);
    want[6] = bits(a / b);
    want[9] = fbits(fa * fb);
    want[12] = bits((double)vl2);
    want[14] = fbits(std::sqrt(std::fabs((float)fa)));
    std::fesetround(FE_TONEAREST);
    for (int k = 0; k < kDir; k++) {
      if (got[i * kDir + k] != want[k]) bad[k]++;
      EXPECT_RESULT(got[i * kDir + k] == want[k], "%s of (%.17g, %.17g): %#llx, want %#llx",
                    kDirNames[k], x[i], y[i], got[i * kDir + k], want[k]);
    }
  }
  for (int k = 0; k < kDir; k++)
    if (bad[k]) std::fprintf(stderr, "%s: %d of %d wrong\n", kDirNames[k], bad[k], n);
  std::printf("checked directed rounding (rz/rm/rp) of add/mul/div/sqrt/rcp and conversions,"
              " float and double, on %d inputs\n", n);
  CK(cudaFree(dx));
  CK(cudaFree(dy));
  CK(cudaFree(dout));
}

KCHECK_MAIN({"ieee", check_ieee}, {"conversions", check_conversions}, {"reduction", check_reduction},
            {"directed_rounding", check_directed_rounding})
