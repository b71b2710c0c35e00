// CUDA math functions against the host, within the maximum errors NVIDIA documents for them:
// CUDA C++ Programming Guide, appendix "Mathematical Functions":
//   - "Single-Precision Mathematical Standard Library Functions with Maximum ULP Error" and
//     "Double-Precision ..." (the error is "the absolute value of the difference in ulps between
//     the correctly rounded result and the result returned by the CUDA library function");
//   - "Single-Precision Floating-Point Intrinsic Functions" (__sinf, __expf, __logf, ...).
// The correctly rounded result is taken from the host: float functions evaluated in double and
// rounded to float, double functions evaluated in long double (x87, 64-bit significand) and
// rounded to double. Built with nvcc's defaults (-prec-div=true -prec-sqrt=true -ftz=false), so
// subnormals are kept and x/y, sqrtf are correctly rounded. Each launch evaluates one function
// over inputs chosen for its domain (plus special values); the check prints the largest error
// seen next to the documented bound.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>
#include "kcheck.h"

enum Fn {
  // single precision, standard functions
  F_SIN, F_COS, F_TAN, F_EXP, F_EXP2, F_EXP10, F_EXPM1, F_LOG, F_LOG2, F_LOG10, F_LOG1P, F_SQRT,
  F_RSQRT, F_CBRT, F_TANH, F_SINH, F_COSH, F_POW, F_ATAN, F_ATAN2, F_ASIN, F_ACOS, F_ERF,
  F_HYPOT, F_DIV,
  // single precision, intrinsics
  I_SIN, I_COS, I_EXP, I_EXP10, I_LOG, I_LOG2, I_FDIVIDE, I_FSQRT_RN, I_FRSQRT_RN, I_FRCP_RN,
  // double precision
  D_SIN, D_COS, D_TAN, D_EXP, D_EXP2, D_EXPM1, D_LOG, D_LOG2, D_LOG10, D_LOG1P, D_SQRT, D_RSQRT,
  D_CBRT, D_TANH, D_SINH, D_COSH, D_POW, D_ATAN, D_ATAN2, D_ERF,
  N_FN
};

// One kernel per function (FN is a template argument), so that each kernel holds only its own
// function's code.
template <int FN>
__global__ void eval_f(const float* x, const float* y, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float a = x[i], b = y[i], r = 0.0f;
  switch (FN) {
    case F_SIN: r = sinf(a); break;
    case F_COS: r = cosf(a); break;
    case F_TAN: r = tanf(a); break;
    case F_EXP: r = expf(a); break;
    case F_EXP2: r = exp2f(a); break;
    case F_EXP10: r = exp10f(a); break;
    case F_EXPM1: r = expm1f(a); break;
    case F_LOG: r = logf(a); break;
    case F_LOG2: r = log2f(a); break;
    case F_LOG10: r = log10f(a); break;
    case F_LOG1P: r = log1pf(a); break;
    case F_SQRT: r = sqrtf(a); break;
    case F_RSQRT: r = rsqrtf(a); break;
    case F_CBRT: r = cbrtf(a); break;
    case F_TANH: r = tanhf(a); break;
    case F_SINH: r = sinhf(a); break;
    case F_COSH: r = coshf(a); break;
    case F_POW: r = powf(a, b); break;
    case F_ATAN: r = atanf(a); break;
    case F_ATAN2: r = atan2f(a, b); break;
    case F_ASIN: r = asinf(a); break;
    case F_ACOS: r = acosf(a); break;
    case F_ERF: r = erff(a); break;
    case F_HYPOT: r = hypotf(a, b); break;
    case F_DIV: r = a / b; break;
    case I_SIN: r = __sinf(a); break;
    case I_COS: r = __cosf(a); break;
    case I_EXP: r = __expf(a); break;
    case I_EXP10: r = __exp10f(a); break;
    case I_LOG: r = __logf(a); break;
    case I_LOG2: r = __log2f(a); break;
    case I_FDIVIDE: r = __fdividef(a, b); break;
    case I_FSQRT_RN: r = __fsqrt_rn(a); break;
    case I_FRSQRT_RN: r = __frsqrt_rn(a); break;
    case I_FRCP_RN: r = __frcp_rn(a); break;
  }
  out[i] = r;
}

template <int FN>
__global__ void eval_d(const double* x, const double* y, double* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  double a = x[i], b = y[i], r = 0.0;
  switch (FN) {
    case D_SIN: r = sin(a); break;
    case D_COS: r = cos(a); break;
    case D_TAN: r = tan(a); break;
    case D_EXP: r = exp(a); break;
    case D_EXP2: r = exp2(a); break;
    case D_EXPM1: r = expm1(a); break;
    case D_LOG: r = log(a); break;
    case D_LOG2: r = log2(a); break;
    case D_LOG10: r = log10(a); break;
    case D_LOG1P: r = log1p(a); break;
    case D_SQRT: r = sqrt(a); break;
    case D_RSQRT: r = rsqrt(a); break;
    case D_CBRT: r = cbrt(a); break;
    case D_TANH: r = tanh(a); break;
    case D_SINH: r = sinh(a); break;
    case D_COSH: r = cosh(a); break;
    case D_POW: r = pow(a, b); break;
    case D_ATAN: r = atan(a); break;
    case D_ATAN2: r = atan2(a, b); break;
    case D_ERF: r = erf(a); break;
  }
  out[i] = r;
}

// ---- host side ----------------------------------------------------------------------------------

typedef long double (*Ref)(long double, long double);
enum Dom { LIN, LOGPOS };  // uniform in [lo, hi]; or 2^uniform(lo, hi) (positive)
enum Bound { ULP, ABS_OR_ULP, EXPF_ULP, EXP10F_ULP };

struct Case {
  Fn fn;
  const char* name;
  Dom dom;
  double lo, hi;      // x's domain
  double ylo, yhi;    // y's (binary functions), uniform
  double ulps;        // documented maximum ulp error
  Ref ref;
  Bound bound = ULP;
  double abs_lo = 0, abs_hi = 0, abs_err = 0;  // ABS_OR_ULP: absolute error bound inside [lo, hi]
};

#define R1(f) [](long double a, long double) -> long double { return f(a); }
#define R2(f) [](long double a, long double b) -> long double { return f(a, b); }

static long double rsqrt_l(long double a) { return 1.0L / sqrtl(a); }
static long double exp10_l(long double a) { return powl(10.0L, a); }
static long double div_l(long double a, long double b) { return a / b; }
static long double rcp_l(long double a) { return 1.0L / a; }

static const int kN = 1024;
static const int kSpecials = 12;

template <typename T>
static void make_inputs(const Case& c, std::vector<T>& x, std::vector<T>& y) {
  x.resize(kN);
  y.resize(kN);
  for (int i = 0; i < kN; i++) {
    double u = (khash(i * 2 + 1 + c.fn * 7919) + 0.5) / 4294967296.0;
    double v = (khash(i * 2 + 2 + c.fn * 7919) + 0.5) / 4294967296.0;
    double xv = c.dom == LIN ? c.lo + (c.hi - c.lo) * u : std::exp2(c.lo + (c.hi - c.lo) * u);
    x[i] = (T)xv;
    y[i] = (T)(c.ylo + (c.yhi - c.ylo) * v);
  }
  // Special values at the front: signed zeros, infinities, NaN, a subnormal, 1, -1.
  const double sp[kSpecials] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 1.0, -1.0,
                                (double)(sizeof(T) == 4 ? 1e-40f : 1e-310), 0.5, 2.0, 10.0, -3.0};
  for (int s = 0; s < kSpecials; s++) x[s] = (T)sp[s];
}

static int64_t ordered(float f) {
  int32_t i;
  std::memcpy(&i, &f, 4);
  return i < 0 ? (int64_t)INT32_MIN - i : i;
}
static int64_t ordered(double d) {
  int64_t i;
  std::memcpy(&i, &d, 8);
  return i < 0 ? INT64_MIN - i : i;
}

// Ulps between got and the correctly rounded want; 0 when both are NaN, "infinite" when only one is.
template <typename T>
static double ulp_dist(T got, T want) {
  if (std::isnan(got) || std::isnan(want)) return std::isnan(got) && std::isnan(want) ? 0 : 1e30;
  if (std::isinf(got) || std::isinf(want)) return got == want ? 0 : 1e30;
  int64_t d = ordered(got) - ordered(want);
  return (double)(d < 0 ? -d : d);
}

// The kernel of each function: tables built from the templates (float: F_SIN..I_FRCP_RN,
// double: D_SIN..D_ERF).
typedef void (*KernelF)(const float*, const float*, float*, int);
typedef void (*KernelD)(const double*, const double*, double*, int);
template <int... FNS>
struct TableF {
  static constexpr KernelF k[] = {eval_f<FNS>...};
};
template <int... FNS>
struct TableD {
  static constexpr KernelD k[] = {eval_d<D_SIN + FNS>...};
};
template <template <int...> class Tab, int N, int... FNS>
struct Seq : Seq<Tab, N - 1, N - 1, FNS...> {};
template <template <int...> class Tab, int... FNS>
struct Seq<Tab, 0, FNS...> {
  typedef Tab<FNS...> type;
};
typedef Seq<TableF, D_SIN>::type KernelsF;
typedef Seq<TableD, N_FN - D_SIN>::type KernelsD;

template <typename T>
static void run_case(const Case& c) {
  std::vector<T> x, y, out(kN);
  make_inputs(c, x, y);
  T* dx = dev_copy(x.data(), kN);
  T* dy = dev_copy(y.data(), kN);
  T* dout = dev_alloc<T>(kN);
  CK(cudaMemset(dout, 0xff, kN * sizeof(T)));
  if (sizeof(T) == 4)
    KernelsF::k[c.fn]<<<kN / 256, 256>>>((const float*)dx, (const float*)dy, (float*)dout, kN);
  else
    KernelsD::k[c.fn - D_SIN]<<<kN / 256, 256>>>((const double*)dx, (const double*)dy, (double*)dout, kN);
  CK(cudaGetLastError());
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    // A kernel the device cannot run (cudaErrorNotSupported from the emulated GPU) fails this
    // function only; anything else is fatal.
    EXPECT_RESULT(false, "%s: the kernel failed: %d (%s)", c.name, (int)e, cudaGetErrorName(e));
    if (e != cudaErrorNotSupported) CK(e);
    (void)cudaGetLastError();
    std::printf("FAILED %s: kernel returned %s\n", c.name, cudaGetErrorName(e));
    CK(cudaFree(dx));
    CK(cudaFree(dy));
    CK(cudaFree(dout));
    return;
  }
  to_host(out.data(), dout, kN);
  double worst = 0, worst_abs = 0;
  int worst_i = -1;
  for (int i = 0; i < kN; i++) {
    long double exact = c.ref((long double)x[i], (long double)y[i]);
    T want = (T)exact;  // correctly rounded (up to the host's own error, far below an ulp)
    double allowed = c.ulps;
    bool finite = std::isfinite((double)x[i]);
    if (c.bound == EXPF_ULP && finite) allowed = 2 + std::floor(std::fabs(1.173 * (double)x[i]));
    if (c.bound == EXP10F_ULP && finite) allowed = 2 + std::floor(std::fabs(2.97 * (double)x[i]));
    bool ok;
    if (c.bound == ABS_OR_ULP && !(x[i] >= c.abs_lo && x[i] <= c.abs_hi) && c.ulps >= 1e30) {
      continue;  // no documented bound there (__sinf, __cosf outside [-pi, pi])
    } else if (c.bound == ABS_OR_ULP && x[i] >= c.abs_lo && x[i] <= c.abs_hi) {
      double err = std::isnan((double)out[i]) ? 1e30 : std::fabs((double)out[i] - (double)exact);
      ok = err <= c.abs_err;
      worst_abs = std::fmax(worst_abs, err);
      if (!ok && worst_i < 0) worst_i = i;
    } else if (sizeof(T) == 8 && c.ulps > 0) {
      // Double: the long double value rounded to double can itself be off by one ulp (double
      // rounding), so measure the distance to the long double value: at most N + 1/2 ulps.
      double d = ulp_dist(out[i], want);
      if (d > 0 && d < 1e30) {
        long double spacing = std::fabs((long double)std::nextafter((double)want, INFINITY) - (long double)want);
        d = (double)(std::fabs((long double)out[i] - exact) / spacing) - 0.5;
      }
      ok = d <= allowed;
      if (d > worst) worst = d;
    } else {
      double d = ulp_dist(out[i], want);
      ok = d <= allowed;
      if (d > worst && c.bound != EXPF_ULP && c.bound != EXP10F_ULP) worst = d;
      if (c.bound == EXPF_ULP || c.bound == EXP10F_ULP) worst = std::fmax(worst, d - allowed + c.ulps);
    }
    EXPECT_RESULT(ok, "%s(%.9g, %.9g) = %.17g, want %.17g (allowed %g ulp)", c.name,
                  (double)x[i], (double)y[i], (double)out[i], (double)want, allowed);
  }
  if (c.bound == ABS_OR_ULP && c.ulps >= 1e30)
    std::printf("checked %-12s max abs error %.3g in [%g, %g] (bound %.3g)\n", c.name, worst_abs,
                c.abs_lo, c.abs_hi, c.abs_err);
  else if (c.bound == ABS_OR_ULP)
    std::printf("checked %-12s max abs error %.3g in [%g, %g] (bound %.3g), max %g ulp elsewhere"
                " (bound %g)\n", c.name, worst_abs, c.abs_lo, c.abs_hi, c.abs_err, worst, c.ulps);
  else if (c.bound == EXPF_ULP || c.bound == EXP10F_ULP)
    std::printf("checked %-12s within 2 + floor(|%s * x|) ulp\n", c.name,
                c.bound == EXPF_ULP ? "1.173" : "2.97");
  else if (sizeof(T) == 8 && c.ulps > 0)
    std::printf("checked %-12s max %.3g ulp (|got - exact| - 1/2 ulp; bound %g) over %d inputs\n",
                c.name, worst, c.ulps, kN);
  else
    std::printf("checked %-12s max %g ulp (bound %g) over %d inputs\n", c.name, worst, c.ulps, kN);
  CK(cudaFree(dx));
  CK(cudaFree(dy));
  CK(cudaFree(dout));
}

static const double kPi = 3.14159265358979323846;

static void check_float_functions() {
  // Bounds: the single-precision table of the Programming Guide (ulps).
  const Case cases[] = {
      {F_SIN, "sinf", LIN, -100, 100, 0, 0, 2, R1(sinl)},
      {F_COS, "cosf", LIN, -100, 100, 0, 0, 2, R1(cosl)},
      {F_SIN, "sinf(big)", LOGPOS, 7, 40, 0, 0, 2, R1(sinl)},  // Payne-Hanek path, |x| > 105615
      {F_TAN, "tanf", LIN, -10, 10, 0, 0, 4, R1(tanl)},
      {F_EXP, "expf", LIN, -104, 89, 0, 0, 2, R1(expl)},        // subnormal and overflowing ends
      {F_EXP2, "exp2f", LIN, -150, 128, 0, 0, 2, R1(exp2l)},
      {F_EXP10, "exp10f", LIN, -40, 38, 0, 0, 2, R1(exp10_l)},
      {F_EXPM1, "expm1f", LIN, -10, 10, 0, 0, 1, R1(expm1l)},
      {F_LOG, "logf", LOGPOS, -149, 128, 0, 0, 1, R1(logl)},
      {F_LOG2, "log2f", LOGPOS, -149, 128, 0, 0, 1, R1(log2l)},
      {F_LOG10, "log10f", LOGPOS, -149, 128, 0, 0, 2, R1(log10l)},
      {F_LOG1P, "log1pf", LIN, -0.99, 100, 0, 0, 1, R1(log1pl)},
      {F_SQRT, "sqrtf", LOGPOS, -149, 128, 0, 0, 0, R1(sqrtl)},  // 0 with -prec-sqrt=true
      {F_RSQRT, "rsqrtf", LOGPOS, -126, 126, 0, 0, 2, R1(rsqrt_l)},
      {F_CBRT, "cbrtf", LIN, -1000, 1000, 0, 0, 1, R1(cbrtl)},
      {F_TANH, "tanhf", LIN, -10, 10, 0, 0, 2, R1(tanhl)},
      {F_SINH, "sinhf", LIN, -10, 10, 0, 0, 3, R1(sinhl)},
      {F_COSH, "coshf", LIN, -10, 10, 0, 0, 2, R1(coshl)},
      {F_POW, "powf", LIN, 0, 50, -10, 10, 4, R2(powl)},
      {F_ATAN, "atanf", LIN, -100, 100, 0, 0, 2, R1(atanl)},
      {F_ATAN2, "atan2f", LIN, -10, 10, -10, 10, 3, R2(atan2l)},
      {F_ASIN, "asinf", LIN, -1, 1, 0, 0, 2, R1(asinl)},
      {F_ACOS, "acosf", LIN, -1, 1, 0, 0, 2, R1(acosl)},
      {F_ERF, "erff", LIN, -4, 4, 0, 0, 2, R1(erfl)},
      {F_HYPOT, "hypotf", LIN, -1e3, 1e3, -1e3, 1e3, 3, R2(hypotl)},
      {F_DIV, "x/y", LIN, -1e6, 1e6, -100, 100, 0, R2(div_l)},  // 0 with -prec-div=true
  };
  for (const Case& c : cases) run_case<float>(c);
}

static void check_float_intrinsics() {
  // Bounds: the Programming Guide's table of single-precision intrinsics.
  const double abs_21_41 = std::exp2(-21.41);
  Case s = {I_SIN, "__sinf", LIN, -kPi, kPi, 0, 0, 1e30, R1(sinl), ABS_OR_ULP, -kPi, kPi, abs_21_41};
  Case c = {I_COS, "__cosf", LIN, -kPi, kPi, 0, 0, 1e30, R1(cosl), ABS_OR_ULP, -kPi, kPi, abs_21_41};
  // __logf: max abs error 2^-21.41 for x in [0.5, 2], otherwise 3 ulp.
  Case l = {I_LOG, "__logf", LOGPOS, -60, 60, 0, 0, 3, R1(logl), ABS_OR_ULP, 0.5, 2.0, abs_21_41};
  // __log2f: max abs error 2^-22 for x in [0.5, 2], otherwise 2 ulp.
  Case l2 = {I_LOG2, "__log2f", LOGPOS, -60, 60, 0, 0, 2, R1(log2l), ABS_OR_ULP, 0.5, 2.0,
             std::exp2(-22.0)};
  Case l_near = l, l2_near = l2;
  l_near.dom = l2_near.dom = LIN;
  l_near.lo = l2_near.lo = 0.5;
  l_near.hi = l2_near.hi = 2.0;
  l_near.name = "__logf(~1)";
  l2_near.name = "__log2f(~1)";
  const Case cases[] = {
      s, c, l, l_near, l2, l2_near,
      {I_EXP, "__expf", LIN, -80, 80, 0, 0, 2, R1(expl), EXPF_ULP},       // 2 + floor(|1.173 x|)
      {I_EXP10, "__exp10f", LIN, -30, 30, 0, 0, 2, R1(exp10_l), EXP10F_ULP},  // 2 + floor(|2.97 x|)
      // __fdividef: 2 ulp for 2^-126 <= |y| <= 2^126.
      {I_FDIVIDE, "__fdividef", LIN, -1e6, 1e6, 1, 1000, 2, R2(div_l)},
      {I_FSQRT_RN, "__fsqrt_rn", LOGPOS, -149, 128, 0, 0, 0, R1(sqrtl)},    // IEEE round-to-nearest
      {I_FRSQRT_RN, "__frsqrt_rn", LOGPOS, -126, 126, 0, 0, 0, R1(rsqrt_l)},  // IEEE round-to-nearest
      {I_FRCP_RN, "__frcp_rn", LIN, -1e4, 1e4, 0, 0, 0, R1(rcp_l)},         // IEEE round-to-nearest
  };
  for (const Case& k : cases) run_case<float>(k);
}

static void check_double_functions() {
  // Bounds: the double-precision table of the Programming Guide (ulps).
  const Case cases[] = {
      {D_EXP, "exp", LIN, -745, 709, 0, 0, 1, R1(expl)},
      {D_EXP2, "exp2", LIN, -1074, 1023, 0, 0, 1, R1(exp2l)},
      {D_EXPM1, "expm1", LIN, -10, 10, 0, 0, 1, R1(expm1l)},
      {D_LOG, "log", LOGPOS, -1074, 1023, 0, 0, 1, R1(logl)},
      {D_LOG2, "log2", LOGPOS, -1074, 1023, 0, 0, 1, R1(log2l)},
      {D_LOG10, "log10", LOGPOS, -1074, 1023, 0, 0, 1, R1(log10l)},
      {D_LOG1P, "log1p", LIN, -0.99, 100, 0, 0, 1, R1(log1pl)},
      // IEEE round-to-nearest; the host's sqrt is too, so it is the reference as it stands.
      {D_SQRT, "sqrt", LOGPOS, -1074, 1023, 0, 0, 0,
       [](long double a, long double) -> long double { return std::sqrt((double)a); }},
      {D_RSQRT, "rsqrt", LOGPOS, -1022, 1022, 0, 0, 1, R1(rsqrt_l)},
      {D_CBRT, "cbrt", LIN, -1e4, 1e4, 0, 0, 1, R1(cbrtl)},
      {D_TANH, "tanh", LIN, -20, 20, 0, 0, 1, R1(tanhl)},
      {D_SINH, "sinh", LIN, -20, 20, 0, 0, 2, R1(sinhl)},
      {D_COSH, "cosh", LIN, -20, 20, 0, 0, 1, R1(coshl)},
      {D_ATAN, "atan", LIN, -100, 100, 0, 0, 2, R1(atanl)},
      {D_ATAN2, "atan2", LIN, -10, 10, -10, 10, 2, R2(atan2l)},
      {D_ERF, "erf", LIN, -6, 6, 0, 0, 2, R1(erfl)},
  };
  for (const Case& c : cases) run_case<double>(c);
}

// sin, cos, tan and pow in double call an internal function (the slow-path argument reduction,
// the accurate pow core): their kernels hold a `call`.
static void check_double_trig_pow() {
  const Case cases[] = {
      {D_SIN, "sin", LIN, -100, 100, 0, 0, 2, R1(sinl)},
      {D_COS, "cos", LIN, -100, 100, 0, 0, 2, R1(cosl)},
      {D_SIN, "sin(big)", LOGPOS, 20, 60, 0, 0, 2, R1(sinl)},
      {D_TAN, "tan", LIN, -10, 10, 0, 0, 2, R1(tanl)},
      {D_POW, "pow", LIN, 0, 50, -20, 20, 2, R2(powl)},
  };
  for (const Case& c : cases) run_case<double>(c);
}

KCHECK_MAIN({"float_functions", check_float_functions},
            {"float_intrinsics", check_float_intrinsics},
            {"double_functions", check_double_functions},
            {"double_trig_pow", check_double_trig_pow})
