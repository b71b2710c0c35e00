// A kernel with many parameter kinds: structs by value (with padding), doubles, chars, shorts,
// 64-bit integers, a float array inside a struct, pointers. Launched with <<<>>> and with
// cudaLaunchKernelEx (with a launch attribute).
#include <cstdint>
#include "kcheck.h"

struct Mixed {
  char c;
  double d;
  int i;
  float f[3];
  short s;
};

struct alignas(16) Vec4 {
  float x, y, z, w;
};

struct Out {
  double d0, d1, sd;
  long long ll;
  unsigned long long u;
  int i, si, c0, c1, s0;
  float f0, f1, f2, vsum;
};

__global__ void many_params(char c0, Mixed m, double d, short s0, char c1, long long ll,
                            Vec4 v, unsigned long long u, float f, Out* out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  out->d0 = d;
  out->d1 = d * f;
  out->sd = m.d;
  out->ll = ll;
  out->u = u;
  out->i = m.i;
  out->si = m.s;
  out->c0 = c0;
  out->c1 = c1 + m.c;
  out->s0 = s0;
  out->f0 = m.f[0];
  out->f1 = m.f[1];
  out->f2 = m.f[2];
  out->vsum = v.x + v.y + v.z + v.w;
}

static void check(const Out& o, const char* how) {
  EXPECT_RESULT(o.d0 == 3.25, "%s: d0 %f", how, o.d0);
  EXPECT_RESULT(o.d1 == 3.25 * 0.5f, "%s: d1 %f", how, o.d1);
  EXPECT_RESULT(o.sd == -1.5e100, "%s: struct double %g", how, o.sd);
  EXPECT_RESULT(o.ll == -1234567890123LL, "%s: ll %lld", how, o.ll);
  EXPECT_RESULT(o.u == 0xFEDCBA9876543210ull, "%s: u %llx", how, o.u);
  EXPECT_RESULT(o.i == 424242, "%s: struct int %d", how, o.i);
  EXPECT_RESULT(o.si == -321, "%s: struct short %d", how, o.si);
  EXPECT_RESULT(o.c0 == 'A', "%s: c0 %d", how, o.c0);
  EXPECT_RESULT(o.c1 == 'z' + 7, "%s: c1 + struct char %d", how, o.c1);
  EXPECT_RESULT(o.s0 == 12345, "%s: s0 %d", how, o.s0);
  EXPECT_RESULT(o.f0 == 1.0f && o.f1 == 2.5f && o.f2 == -4.0f, "%s: struct floats %f %f %f",
                how, o.f0, o.f1, o.f2);
  EXPECT_RESULT(o.vsum == 10.0f, "%s: Vec4 sum %f", how, o.vsum);
}

int main(int argc, char** argv) {
  parse_args(argc, argv);
  Mixed m;
  std::memset(&m, 0, sizeof m);
  m.c = 7;
  m.d = -1.5e100;
  m.i = 424242;
  m.f[0] = 1.0f;
  m.f[1] = 2.5f;
  m.f[2] = -4.0f;
  m.s = -321;
  Vec4 v = {1.0f, 2.0f, 3.0f, 4.0f};
  Out* dout;
  CK(cudaMalloc(&dout, sizeof(Out)));
  Out o;

  CK(cudaMemset(dout, 0xFF, sizeof(Out)));
  many_params<<<2, 32>>>('A', m, 3.25, (short)12345, 'z', -1234567890123LL, v,
                         0xFEDCBA9876543210ull, 0.5f, dout);
  CK_LAUNCH("many_params <<<>>>");
  CK(cudaMemcpy(&o, dout, sizeof o, cudaMemcpyDeviceToHost));
  check(o, "<<<>>>");

  CK(cudaMemset(dout, 0xFF, sizeof(Out)));
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  cudaLaunchAttribute attr[1];
  std::memset(attr, 0, sizeof attr);
  attr[0].id = cudaLaunchAttributePriority;
  attr[0].val.priority = 0;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(1);
  cfg.blockDim = dim3(64);
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  CK(cudaLaunchKernelEx(&cfg, many_params, 'A', m, 3.25, (short)12345, 'z', -1234567890123LL, v,
                        0xFEDCBA9876543210ull, 0.5f, dout));
  CK(cudaStreamSynchronize(s));
  CK_LAUNCH("many_params cudaLaunchKernelEx");
  CK(cudaMemcpy(&o, dout, sizeof o, cudaMemcpyDeviceToHost));
  check(o, "cudaLaunchKernelEx");

  CK(cudaStreamDestroy(s));
  CK(cudaFree(dout));
  return finish("params");
}
