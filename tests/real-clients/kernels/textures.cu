// Texture and surface objects as programs use them through the runtime API: CUDA arrays filled
// with cudaMemcpy2DToArray, cudaCreateTextureObject with point and linear filtering, every
// address mode, normalized coordinates, 8-bit data read as normalized floats, tex1Dfetch on
// linear memory, tex2D on pitched memory, 3-D and layered textures, surf2Dwrite/surf2Dread,
// and a destroyed texture object. Every result is checked against a CPU reference computed
// here from CUDA's documented texture fetching rules (programming guide, "Texture Fetching":
// linear filtering with 9-bit fixed-point weights, unnormalized coordinates shifted by 0.5).
#include <cmath>
#include <vector>
#include "kcheck.h"

// ---- CPU reference -------------------------------------------------------------------------

// An address mode applied to an integer texel index (what the texture unit does after the
// coordinate is scaled; wrap and mirror only with normalized coordinates).
static int ref_index(int i, int n, cudaTextureAddressMode mode, bool* border) {
  *border = false;
  switch (mode) {
    case cudaAddressModeClamp:
      return i < 0 ? 0 : (i >= n ? n - 1 : i);
    case cudaAddressModeBorder:
      if (i < 0 || i >= n) *border = true;
      return i;
    default:
      return i;  // wrap and mirror act on the coordinate (ref_coord)
  }
}

// Wrap and mirror on a normalized coordinate, as the guide describes: x - floor(x) for wrap,
// and the reflected coordinate for mirror.
static float ref_coord(float x, cudaTextureAddressMode mode) {
  if (mode == cudaAddressModeWrap) return x - std::floor(x);
  if (mode == cudaAddressModeMirror) {
    float f = std::floor(x);
    float r = x - f;
    return ((int)f & 1) ? 1.0f - r : r;
  }
  return x;
}

// One 2-D texel of a float array (the border colour is 0 here).
static float ref_texel(const std::vector<float>& img, int w, int h, int x, int y,
                       cudaTextureAddressMode mode) {
  bool bx, by;
  x = ref_index(x, w, mode, &bx);
  y = ref_index(y, h, mode, &by);
  if (bx || by) return 0.0f;
  if (mode == cudaAddressModeWrap) {
    x = ((x % w) + w) % w;
    y = ((y % h) + h) % h;
  } else if (mode == cudaAddressModeMirror) {
    // Reflected: index -1 reads texel 0, index n reads texel n - 1.
    x = ((x % (2 * w)) + 2 * w) % (2 * w);
    y = ((y % (2 * h)) + 2 * h) % (2 * h);
    if (x >= w) x = 2 * w - 1 - x;
    if (y >= h) y = 2 * h - 1 - y;
  }
  return img[y * w + x];
}

// The 9-bit fixed-point weight the texture unit uses (8 fractional bits).
static float frac9(float f) { return std::round(f * 256.0f) / 256.0f; }

// tex2D<float>(t, x, y) with unnormalized or normalized coordinates.
static float ref_tex2d(const std::vector<float>& img, int w, int h, float x, float y,
                       cudaTextureAddressMode mode, bool linear, bool normalized) {
  if (normalized) {
    x = ref_coord(x, mode);
    y = ref_coord(y, mode);
    x *= w;
    y *= h;
  }
  if (!linear) return ref_texel(img, w, h, (int)std::floor(x), (int)std::floor(y), mode);
  float xb = x - 0.5f, yb = y - 0.5f;
  int i = (int)std::floor(xb), j = (int)std::floor(yb);
  float a = frac9(xb - std::floor(xb)), b = frac9(yb - std::floor(yb));
  return (1 - a) * (1 - b) * ref_texel(img, w, h, i, j, mode) +
         a * (1 - b) * ref_texel(img, w, h, i + 1, j, mode) +
         (1 - a) * b * ref_texel(img, w, h, i, j + 1, mode) +
         a * b * ref_texel(img, w, h, i + 1, j + 1, mode);
}

static bool close_to(float got, float want) { return std::fabs(got - want) <= 1e-5f + 1e-5f * std::fabs(want); }

// ---- kernels -------------------------------------------------------------------------------

// Samples the texture at n coordinate pairs.
__global__ void sample2d(cudaTextureObject_t t, const float2* at, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tex2D<float>(t, at[i].x, at[i].y);
}

__global__ void sample2d_uchar4(cudaTextureObject_t t, int w, int h, float4* out) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
  if (x < w) out[y * w + x] = tex2D<float4>(t, x + 0.5f, y + 0.5f);
}

__global__ void sample2d_int4(cudaTextureObject_t t, int w, int h, int4* out) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
  if (x < w) out[y * w + x] = tex2D<int4>(t, x + 0.5f, y + 0.5f);
}

__global__ void fetch1d(cudaTextureObject_t t, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tex1Dfetch<float>(t, i) * 2.0f;
}

__global__ void fetch1d_int2(cudaTextureObject_t t, int2* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tex1Dfetch<int2>(t, i);
}

__global__ void sample3d(cudaTextureObject_t t, int w, int h, int d, float* out) {
  int x = threadIdx.x, y = blockIdx.x, z = blockIdx.y;
  out[(z * h + y) * w + x] = tex3D<float>(t, x + 0.5f, y + 0.5f, z + 0.5f);
}

__global__ void sample_layered(cudaTextureObject_t t, int w, int h, int layers, float* out) {
  int x = threadIdx.x, y = blockIdx.x, l = blockIdx.y;
  out[(l * h + y) * w + x] = tex2DLayered<float>(t, x + 0.5f, y + 0.5f, l);
}

__global__ void gather(cudaTextureObject_t t, float2 at, float4* out) {
  out[0] = tex2Dgather<float4>(t, at.x, at.y, 0);
  out[1] = tex2Dgather<float4>(t, at.x, at.y, 1);
}

// Writes x * 3 + y into every element of a surface, then reads back its neighbour.
__global__ void surf_write(cudaSurfaceObject_t s, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
  if (x < w) surf2Dwrite<float>(x * 3.0f + y, s, x * (int)sizeof(float), y);
}

__global__ void surf_read(cudaSurfaceObject_t s, int w, int h, float* out) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
  if (x < w) {
    float v;
    surf2Dread<float>(&v, s, ((x + 1) % w) * (int)sizeof(float), y);
    out[y * w + x] = v;
  }
}

__global__ void surf_uchar4(cudaSurfaceObject_t s, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
  if (x < w) {
    uchar4 v = surf2Dread<uchar4>(s, x * 4, y);
    surf2Dwrite(make_uchar4(v.w, v.z, v.y, v.x + 1), s, x * 4, y);
  }
}

__global__ void surf1d_rw(cudaSurfaceObject_t s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) surf1Dwrite<int>(surf1Dread<int>(s, i * 4) * 5, s, i * 4);
}

__global__ void surf3d_write(cudaSurfaceObject_t s, int w, int h, int d) {
  int x = threadIdx.x, y = blockIdx.x, z = blockIdx.y;
  surf3Dwrite<short>((short)(x - y * 10 + z * 100), s, x * 2, y, z);
}

__global__ void surf_clamped(cudaSurfaceObject_t s, int w, float* out) {
  int i = threadIdx.x;
  // i - 4 runs off the left edge, i + w - 4 off the right one: zero mode reads 0 there, clamp
  // mode the edge element.
  out[i] = surf2Dread<float>(s, (i - 4) * 4, 0, cudaBoundaryModeZero);
  out[32 + i] = surf2Dread<float>(s, (i + w - 4) * 4, 0, cudaBoundaryModeClamp);
}

// ---- helpers ---------------------------------------------------------------------------------

static cudaArray_t float_array(const std::vector<float>& img, int w, int h) {
  cudaChannelFormatDesc f = cudaCreateChannelDesc<float>();
  cudaArray_t a;
  CK(cudaMallocArray(&a, &f, w, h));
  CK(cudaMemcpy2DToArray(a, 0, 0, img.data(), w * sizeof(float), w * sizeof(float), h,
                         cudaMemcpyHostToDevice));
  return a;
}

static cudaTextureObject_t array_texture(cudaArray_t a, cudaTextureAddressMode mode,
                                         cudaTextureFilterMode filter, bool normalized,
                                         cudaTextureReadMode read = cudaReadModeElementType) {
  cudaResourceDesc r = {};
  r.resType = cudaResourceTypeArray;
  r.res.array.array = a;
  cudaTextureDesc d = {};
  d.addressMode[0] = d.addressMode[1] = d.addressMode[2] = mode;
  d.filterMode = filter;
  d.readMode = read;
  d.normalizedCoords = normalized;
  cudaTextureObject_t t;
  CK(cudaCreateTextureObject(&t, &r, &d, nullptr));
  return t;
}

static std::vector<float> test_image(int w, int h) {
  std::vector<float> img(w * h);
  for (int i = 0; i < w * h; i++) img[i] = (float)(khash(i) % 1000) / 10.0f - 20.0f;
  return img;
}

// Samples at n coordinates and compares with the reference.
static void sample_and_check(const char* what, cudaTextureObject_t t, const std::vector<float>& img,
                             int w, int h, const std::vector<float2>& at,
                             cudaTextureAddressMode mode, bool linear, bool normalized) {
  int n = (int)at.size();
  float2* dat = dev_copy(at.data(), at.size());
  float* dout = dev_alloc<float>(n);
  sample2d<<<(n + 127) / 128, 128>>>(t, dat, dout, n);
  CK_LAUNCH(what);
  std::vector<float> got(n);
  to_host(got.data(), dout, n);
  for (int i = 0; i < n; i++) {
    float want = ref_tex2d(img, w, h, at[i].x, at[i].y, mode, linear, normalized);
    EXPECT_RESULT(close_to(got[i], want), "%s at (%g, %g) = %.7g, want %.7g", what, at[i].x,
                  at[i].y, got[i], want);
  }
  CK(cudaFree(dat));
  CK(cudaFree(dout));
}

// Coordinates over the whole texture and past its edges, off the texel centres.
static std::vector<float2> coords(int w, int h, bool normalized) {
  std::vector<float2> at;
  for (int j = -6; j < h + 6; j += 1)
    for (int i = -6; i < w + 6; i += 1) {
      float fx = i + (float)(khash(i * 131 + j) % 97) / 97.0f;
      float fy = j + (float)(khash(j * 71 + i + 5) % 89) / 89.0f;
      if (normalized) at.push_back(make_float2(fx / w, fy / h));
      else at.push_back(make_float2(fx, fy));
    }
  return at;
}

// ---- checks ----------------------------------------------------------------------------------

static const cudaTextureAddressMode MODES[] = {cudaAddressModeWrap, cudaAddressModeClamp,
                                               cudaAddressModeMirror, cudaAddressModeBorder};
static const char* MODE_NAMES[] = {"wrap", "clamp", "mirror", "border"};

static void check_point_filter() {
  int w = 37, h = 19;
  std::vector<float> img = test_image(w, h);
  cudaArray_t a = float_array(img, w, h);
  // The deprecated 1-D array copies too: rows 3.. rewritten from byte offset (0, 3), read back.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  for (int i = 3 * w; i < w * h; i++) img[i] = -img[i];
  CK(cudaMemcpyToArray(a, 0, 3, img.data() + 3 * w, (h - 3) * w * sizeof(float),
                       cudaMemcpyHostToDevice));
  std::vector<float> back(w * h);
  CK(cudaMemcpyFromArray(back.data(), a, 0, 0, w * h * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < w * h; i++)
    EXPECT_RESULT(back[i] == img[i], "cudaMemcpyFromArray element %d = %g, want %g", i, back[i],
                  img[i]);
#pragma GCC diagnostic pop
  // Unnormalized coordinates: clamp and border only (wrap and mirror need normalized ones).
  for (int m = 1; m < 4; m += 2) {
    cudaTextureObject_t t = array_texture(a, MODES[m], cudaFilterModePoint, false);
    char what[64];
    std::snprintf(what, sizeof what, "tex2D point %s", MODE_NAMES[m]);
    sample_and_check(what, t, img, w, h, coords(w, h, false), MODES[m], false, false);
    CK(cudaDestroyTextureObject(t));
  }
  CK(cudaFreeArray(a));
}

static void check_linear_filter() {
  int w = 29, h = 23;
  std::vector<float> img = test_image(w, h);
  cudaArray_t a = float_array(img, w, h);
  for (int m = 1; m < 4; m += 2) {
    cudaTextureObject_t t = array_texture(a, MODES[m], cudaFilterModeLinear, false);
    char what[64];
    std::snprintf(what, sizeof what, "tex2D linear %s", MODE_NAMES[m]);
    sample_and_check(what, t, img, w, h, coords(w, h, false), MODES[m], true, false);
    CK(cudaDestroyTextureObject(t));
  }
  CK(cudaFreeArray(a));
}

static void check_normalized_coords() {
  int w = 16, h = 12;
  std::vector<float> img = test_image(w, h);
  cudaArray_t a = float_array(img, w, h);
  for (int m = 0; m < 4; m++)
    for (int lin = 0; lin < 2; lin++) {
      cudaTextureObject_t t = array_texture(a, MODES[m], lin ? cudaFilterModeLinear : cudaFilterModePoint, true);
      char what[64];
      std::snprintf(what, sizeof what, "tex2D normalized %s %s", lin ? "linear" : "point",
                    MODE_NAMES[m]);
      sample_and_check(what, t, img, w, h, coords(w, h, true), MODES[m], lin, true);
      CK(cudaDestroyTextureObject(t));
    }
  CK(cudaFreeArray(a));
}

static void check_normalized_float() {
  int w = 20, h = 6;
  std::vector<uchar4> img(w * h);
  for (int i = 0; i < w * h; i++) {
    unsigned k = khash(i);
    img[i] = make_uchar4(k & 255, (k >> 8) & 255, (k >> 16) & 255, k >> 24);
  }
  cudaChannelFormatDesc f = cudaCreateChannelDesc<uchar4>();
  cudaArray_t a;
  CK(cudaMallocArray(&a, &f, w, h));
  CK(cudaMemcpy2DToArray(a, 0, 0, img.data(), w * 4, w * 4, h, cudaMemcpyHostToDevice));
  cudaTextureObject_t t = array_texture(a, cudaAddressModeClamp, cudaFilterModePoint, false,
                                        cudaReadModeNormalizedFloat);
  float4* dout = dev_alloc<float4>(w * h);
  sample2d_uchar4<<<dim3(1, h), 32>>>(t, w, h, dout);
  CK_LAUNCH("tex2D<float4> of uchar4, normalized float");
  std::vector<float4> got(w * h);
  to_host(got.data(), dout, w * h);
  for (int i = 0; i < w * h; i++) {
    float4 want = make_float4(img[i].x / 255.0f, img[i].y / 255.0f, img[i].z / 255.0f, img[i].w / 255.0f);
    EXPECT_RESULT(close_to(got[i].x, want.x) && close_to(got[i].y, want.y) &&
                      close_to(got[i].z, want.z) && close_to(got[i].w, want.w),
                  "texel %d = (%g %g %g %g), want (%g %g %g %g)", i, got[i].x, got[i].y, got[i].z,
                  got[i].w, want.x, want.y, want.z, want.w);
  }
  CK(cudaDestroyTextureObject(t));
  // Signed 16-bit data as normalized floats: -32768 reads as -1.0 (the guide's rule).
  std::vector<short4> simg(w * h);
  for (int i = 0; i < w * h; i++) {
    unsigned k = khash(i + 9);
    simg[i] = make_short4((short)k, (short)(k >> 16), i == 0 ? -32768 : -(short)(k & 0x7fff), 32767);
  }
  cudaChannelFormatDesc sf = cudaCreateChannelDesc<short4>();
  cudaArray_t sa;
  CK(cudaMallocArray(&sa, &sf, w, h));
  CK(cudaMemcpy2DToArray(sa, 0, 0, simg.data(), w * 8, w * 8, h, cudaMemcpyHostToDevice));
  t = array_texture(sa, cudaAddressModeClamp, cudaFilterModePoint, false, cudaReadModeNormalizedFloat);
  sample2d_uchar4<<<dim3(1, h), 32>>>(t, w, h, dout);
  CK_LAUNCH("tex2D<float4> of short4, normalized float");
  to_host(got.data(), dout, w * h);
  auto snorm = [](short v) { return std::fmax(v / 32767.0f, -1.0f); };
  for (int i = 0; i < w * h; i++) {
    float4 want = make_float4(snorm(simg[i].x), snorm(simg[i].y), snorm(simg[i].z), snorm(simg[i].w));
    EXPECT_RESULT(close_to(got[i].x, want.x) && close_to(got[i].y, want.y) &&
                      close_to(got[i].z, want.z) && close_to(got[i].w, want.w),
                  "short texel %d = (%g %g %g %g), want (%g %g %g %g)", i, got[i].x, got[i].y,
                  got[i].z, got[i].w, want.x, want.y, want.z, want.w);
  }
  CK(cudaDestroyTextureObject(t));
  // The same signed data read as its element type.
  t = array_texture(sa, cudaAddressModeClamp, cudaFilterModePoint, false);
  int4* iout = dev_alloc<int4>(w * h);
  sample2d_int4<<<dim3(1, h), 32>>>(t, w, h, iout);
  CK_LAUNCH("tex2D<int4> of short4");
  std::vector<int4> igot(w * h);
  to_host(igot.data(), iout, w * h);
  for (int i = 0; i < w * h; i++)
    EXPECT_RESULT(igot[i].x == simg[i].x && igot[i].y == simg[i].y && igot[i].z == simg[i].z &&
                      igot[i].w == simg[i].w,
                  "short texel %d = (%d %d %d %d)", i, igot[i].x, igot[i].y, igot[i].z, igot[i].w);
  CK(cudaDestroyTextureObject(t));
  CK(cudaFree(iout));
  CK(cudaFree(dout));
  CK(cudaFreeArray(a));
  CK(cudaFreeArray(sa));
}

static void check_fetch_linear() {
  int n = 1000;
  std::vector<float> h(n);
  for (int i = 0; i < n; i++) h[i] = i * 0.25f - 7.0f;
  float* d = dev_copy(h.data(), n);
  cudaResourceDesc r = {};
  r.resType = cudaResourceTypeLinear;
  r.res.linear.devPtr = d;
  r.res.linear.desc = cudaCreateChannelDesc<float>();
  r.res.linear.sizeInBytes = n * sizeof(float);
  cudaTextureDesc td = {};
  td.readMode = cudaReadModeElementType;
  cudaTextureObject_t t;
  CK(cudaCreateTextureObject(&t, &r, &td, nullptr));
  float* dout = dev_alloc<float>(n + 24);
  fetch1d<<<(n + 24 + 127) / 128, 128>>>(t, dout, n + 24);
  CK_LAUNCH("tex1Dfetch<float>");
  std::vector<float> got(n + 24);
  to_host(got.data(), dout, n + 24);
  // Past the end a fetch of linear memory reads zero.
  for (int i = 0; i < n + 24; i++) {
    float want = i < n ? h[i] * 2.0f : 0.0f;
    EXPECT_RESULT(got[i] == want, "tex1Dfetch %d = %g, want %g", i, got[i], want);
  }
  // The descriptors come back as they were given.
  cudaResourceDesc rback;
  CK(cudaGetTextureObjectResourceDesc(&rback, t));
  EXPECT_RESULT(rback.resType == cudaResourceTypeLinear && rback.res.linear.devPtr == d &&
                    rback.res.linear.sizeInBytes == n * sizeof(float) &&
                    rback.res.linear.desc.x == 32 && rback.res.linear.desc.f == cudaChannelFormatKindFloat,
                "resource descriptor read back: type %d size %zu", (int)rback.resType,
                rback.res.linear.sizeInBytes);
  CK(cudaDestroyTextureObject(t));
  // int2 elements.
  std::vector<int2> hv(n);
  for (int i = 0; i < n; i++) hv[i] = make_int2(i, -3 * i);
  int2* dv = dev_copy(hv.data(), n);
  r.res.linear.devPtr = dv;
  r.res.linear.desc = cudaCreateChannelDesc<int2>();
  r.res.linear.sizeInBytes = n * sizeof(int2);
  CK(cudaCreateTextureObject(&t, &r, &td, nullptr));
  int2* dvo = dev_alloc<int2>(n);
  fetch1d_int2<<<(n + 127) / 128, 128>>>(t, dvo, n);
  CK_LAUNCH("tex1Dfetch<int2>");
  std::vector<int2> gv(n);
  to_host(gv.data(), dvo, n);
  for (int i = 0; i < n; i++)
    EXPECT_RESULT(gv[i].x == i && gv[i].y == -3 * i, "tex1Dfetch<int2> %d = (%d, %d)", i, gv[i].x, gv[i].y);
  CK(cudaDestroyTextureObject(t));
  CK(cudaFree(d));
  CK(cudaFree(dv));
  CK(cudaFree(dvo));
  CK(cudaFree(dout));
}

static void check_pitch2d() {
  int w = 45, h = 13;
  std::vector<float> img = test_image(w, h);
  float* d;
  size_t pitch;
  CK(cudaMallocPitch(&d, &pitch, w * sizeof(float), h));
  CK(cudaMemcpy2D(d, pitch, img.data(), w * sizeof(float), w * sizeof(float), h, cudaMemcpyHostToDevice));
  cudaResourceDesc r = {};
  r.resType = cudaResourceTypePitch2D;
  r.res.pitch2D.devPtr = d;
  r.res.pitch2D.desc = cudaCreateChannelDesc<float>();
  r.res.pitch2D.width = w;
  r.res.pitch2D.height = h;
  r.res.pitch2D.pitchInBytes = pitch;
  cudaTextureDesc td = {};
  td.addressMode[0] = td.addressMode[1] = cudaAddressModeClamp;
  td.filterMode = cudaFilterModeLinear;
  td.readMode = cudaReadModeElementType;
  cudaTextureObject_t t;
  CK(cudaCreateTextureObject(&t, &r, &td, nullptr));
  sample_and_check("tex2D linear clamp on pitched memory", t, img, w, h, coords(w, h, false),
                   cudaAddressModeClamp, true, false);
  cudaTextureDesc back;
  CK(cudaGetTextureObjectTextureDesc(&back, t));
  EXPECT_RESULT(back.filterMode == cudaFilterModeLinear && back.addressMode[0] == cudaAddressModeClamp &&
                    back.normalizedCoords == 0,
                "texture descriptor read back: filter %d", (int)back.filterMode);
  CK(cudaDestroyTextureObject(t));
  CK(cudaFree(d));
}

static void check_volume() {
  int w = 8, h = 5, dd = 4;
  std::vector<float> vol(w * h * dd);
  for (size_t i = 0; i < vol.size(); i++) vol[i] = (float)i * 1.5f;
  cudaChannelFormatDesc f = cudaCreateChannelDesc<float>();
  for (int layered = 0; layered < 2; layered++) {
    cudaArray_t a;
    CK(cudaMalloc3DArray(&a, &f, make_cudaExtent(w, h, dd), layered ? cudaArrayLayered : 0));
    cudaMemcpy3DParms p = {};
    p.srcPtr = make_cudaPitchedPtr(vol.data(), w * sizeof(float), w, h);
    p.dstArray = a;
    p.extent = make_cudaExtent(w, h, dd);
    p.kind = cudaMemcpyHostToDevice;
    CK(cudaMemcpy3D(&p));
    cudaTextureObject_t t = array_texture(a, cudaAddressModeClamp, cudaFilterModePoint, false);
    float* dout = dev_alloc<float>(vol.size());
    if (layered)
      sample_layered<<<dim3(h, dd), w>>>(t, w, h, dd, dout);
    else
      sample3d<<<dim3(h, dd), w>>>(t, w, h, dd, dout);
    CK_LAUNCH(layered ? "tex2DLayered<float>" : "tex3D<float>");
    std::vector<float> got(vol.size());
    to_host(got.data(), dout, vol.size());
    for (size_t i = 0; i < vol.size(); i++)
      EXPECT_RESULT(got[i] == vol[i], "%s texel %zu = %g, want %g", layered ? "layered" : "3-D", i,
                    got[i], vol[i]);
    CK(cudaDestroyTextureObject(t));
    CK(cudaFree(dout));
    CK(cudaFreeArray(a));
  }
}

static void check_gather() {
  int w = 6, h = 5;
  std::vector<float2> img(w * h);
  for (int i = 0; i < w * h; i++) img[i] = make_float2((float)i, (float)(100 + i));
  cudaChannelFormatDesc f = cudaCreateChannelDesc<float2>();
  cudaArray_t a;
  CK(cudaMallocArray(&a, &f, w, h));
  CK(cudaMemcpy2DToArray(a, 0, 0, img.data(), w * 8, w * 8, h, cudaMemcpyHostToDevice));
  cudaTextureObject_t t = array_texture(a, cudaAddressModeClamp, cudaFilterModePoint, false);
  float4* dout = dev_alloc<float4>(2);
  // Between texels (2,1), (3,1), (2,2), (3,2): gather returns (x0y1, x1y1, x1y0, x0y0).
  gather<<<1, 1>>>(t, make_float2(3.2f, 2.1f), dout);
  CK_LAUNCH("tex2Dgather<float4>");
  float4 got[2];
  to_host(got, dout, 2);
  for (int c = 0; c < 2; c++) {
    auto v = [&](int x, int y) { return c ? img[y * w + x].y : img[y * w + x].x; };
    float4 want = make_float4(v(2, 2), v(3, 2), v(3, 1), v(2, 1));
    EXPECT_RESULT(got[c].x == want.x && got[c].y == want.y && got[c].z == want.z && got[c].w == want.w,
                  "gather comp %d = (%g %g %g %g), want (%g %g %g %g)", c, got[c].x, got[c].y,
                  got[c].z, got[c].w, want.x, want.y, want.z, want.w);
  }
  CK(cudaDestroyTextureObject(t));
  CK(cudaFree(dout));
  CK(cudaFreeArray(a));
}

static cudaSurfaceObject_t surface(cudaArray_t a) {
  cudaResourceDesc r = {};
  r.resType = cudaResourceTypeArray;
  r.res.array.array = a;
  cudaSurfaceObject_t s;
  CK(cudaCreateSurfaceObject(&s, &r));
  return s;
}

static void check_surface() {
  int w = 50, h = 7;
  cudaChannelFormatDesc f = cudaCreateChannelDesc<float>();
  cudaArray_t a;
  CK(cudaMallocArray(&a, &f, w, h, cudaArraySurfaceLoadStore));
  cudaSurfaceObject_t s = surface(a);
  surf_write<<<dim3((w + 31) / 32, h), 32>>>(s, w, h);
  CK_LAUNCH("surf2Dwrite<float>");
  std::vector<float> got(w * h);
  CK(cudaMemcpy2DFromArray(got.data(), w * sizeof(float), a, 0, 0, w * sizeof(float), h,
                           cudaMemcpyDeviceToHost));
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++)
      EXPECT_RESULT(got[y * w + x] == x * 3.0f + y, "surface (%d, %d) = %g", x, y, got[y * w + x]);
  float* dout = dev_alloc<float>(w * h);
  surf_read<<<dim3((w + 31) / 32, h), 32>>>(s, w, h, dout);
  CK_LAUNCH("surf2Dread<float>");
  to_host(got.data(), dout, w * h);
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++)
      EXPECT_RESULT(got[y * w + x] == ((x + 1) % w) * 3.0f + y, "surf2Dread (%d, %d) = %g", x, y,
                    got[y * w + x]);
  // Boundary modes: zero and clamp.
  surf_clamped<<<1, 32>>>(s, w, dout);
  CK_LAUNCH("surf2Dread zero/clamp");
  to_host(got.data(), dout, 64);
  for (int i = 0; i < 32; i++) {
    float z = i < 4 ? 0.0f : (i - 4) * 3.0f;
    int xc = i + w - 4 < w ? i + w - 4 : w - 1;
    EXPECT_RESULT(got[i] == z, "zero-mode read %d = %g, want %g", i, got[i], z);
    EXPECT_RESULT(got[32 + i] == xc * 3.0f, "clamp-mode read %d = %g, want %g", i, got[32 + i], xc * 3.0f);
  }
  CK(cudaDestroySurfaceObject(s));
  CK(cudaFreeArray(a));
  CK(cudaFree(dout));

  // uchar4 read-modify-write.
  std::vector<uchar4> img(w * h);
  for (int i = 0; i < w * h; i++) img[i] = make_uchar4(i & 255, (i * 7) & 255, 3, 200);
  cudaChannelFormatDesc f4 = cudaCreateChannelDesc<uchar4>();
  CK(cudaMallocArray(&a, &f4, w, h, cudaArraySurfaceLoadStore));
  CK(cudaMemcpy2DToArray(a, 0, 0, img.data(), w * 4, w * 4, h, cudaMemcpyHostToDevice));
  s = surface(a);
  surf_uchar4<<<dim3((w + 31) / 32, h), 32>>>(s, w, h);
  CK_LAUNCH("surf2Dread/surf2Dwrite<uchar4>");
  std::vector<uchar4> back(w * h);
  CK(cudaMemcpy2DFromArray(back.data(), w * 4, a, 0, 0, w * 4, h, cudaMemcpyDeviceToHost));
  for (int i = 0; i < w * h; i++)
    EXPECT_RESULT(back[i].x == img[i].w && back[i].y == img[i].z && back[i].z == img[i].y &&
                      back[i].w == (unsigned char)(img[i].x + 1),
                  "uchar4 surface %d", i);
  CK(cudaDestroySurfaceObject(s));
  CK(cudaFreeArray(a));

  // 1-D int and 3-D short surfaces.
  int n = 300;
  std::vector<int> hv(n);
  for (int i = 0; i < n; i++) hv[i] = i - 100;
  cudaChannelFormatDesc fi = cudaCreateChannelDesc<int>();
  CK(cudaMallocArray(&a, &fi, n, 0, cudaArraySurfaceLoadStore));
  CK(cudaMemcpy2DToArray(a, 0, 0, hv.data(), n * 4, n * 4, 1, cudaMemcpyHostToDevice));
  s = surface(a);
  surf1d_rw<<<(n + 127) / 128, 128>>>(s, n);
  CK_LAUNCH("surf1Dread/surf1Dwrite<int>");
  std::vector<int> gv(n);
  CK(cudaMemcpy2DFromArray(gv.data(), n * 4, a, 0, 0, n * 4, 1, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; i++) EXPECT_RESULT(gv[i] == (i - 100) * 5, "surf1D %d = %d", i, gv[i]);
  CK(cudaDestroySurfaceObject(s));
  CK(cudaFreeArray(a));

  int w3 = 10, h3 = 4, d3 = 3;
  cudaChannelFormatDesc fs = cudaCreateChannelDesc<short>();
  CK(cudaMalloc3DArray(&a, &fs, make_cudaExtent(w3, h3, d3), cudaArraySurfaceLoadStore));
  s = surface(a);
  surf3d_write<<<dim3(h3, d3), w3>>>(s, w3, h3, d3);
  CK_LAUNCH("surf3Dwrite<short>");
  std::vector<short> g3(w3 * h3 * d3);
  cudaMemcpy3DParms p = {};
  p.srcArray = a;
  p.dstPtr = make_cudaPitchedPtr(g3.data(), w3 * 2, w3, h3);
  p.extent = make_cudaExtent(w3, h3, d3);
  p.kind = cudaMemcpyDeviceToHost;
  CK(cudaMemcpy3D(&p));
  for (int z = 0; z < d3; z++)
    for (int y = 0; y < h3; y++)
      for (int x = 0; x < w3; x++)
        EXPECT_RESULT(g3[(z * h3 + y) * w3 + x] == x - y * 10 + z * 100, "surf3D (%d %d %d) = %d",
                      x, y, z, g3[(z * h3 + y) * w3 + x]);
  CK(cudaDestroySurfaceObject(s));
  CK(cudaFreeArray(a));
}

// Options the emulated GPU does not have are refused with an error, never ignored; a kernel
// given a texture object that was destroyed fails; it does not read garbage.
static void check_destroyed() {
  int w = 8, h = 8;
  std::vector<float> img = test_image(w, h);
  cudaArray_t a = float_array(img, w, h);
  cudaResourceDesc r = {};
  r.resType = cudaResourceTypeArray;
  r.res.array.array = a;
  cudaTextureDesc td = {};
  td.sRGB = 1;
  cudaTextureObject_t t = 0;
  cudaError_t e = cudaCreateTextureObject(&t, &r, &td, nullptr);
  EXPECT_RESULT(e != cudaSuccess, "an sRGB texture object was created");
  std::printf("sRGB texture object: %s\n", cudaGetErrorName(e));
  // Linear filtering of integers read as integers is invalid (libcudart refuses it before the
  // driver sees it: cudaErrorInvalidFilterSetting).
  std::vector<int> ints(64, 3);
  cudaChannelFormatDesc fi = cudaCreateChannelDesc<int>();
  cudaArray_t ia;
  CK(cudaMallocArray(&ia, &fi, 8, 8));
  r.res.array.array = ia;
  td = {};
  td.filterMode = cudaFilterModeLinear;
  td.readMode = cudaReadModeElementType;
  e = cudaCreateTextureObject(&t, &r, &td, nullptr);
  EXPECT_RESULT(e != cudaSuccess, "linear filtering of int texels was accepted");
  std::printf("linear filtering of int texels: %s\n", cudaGetErrorName(e));
  (void)cudaGetLastError();
  // A surface needs an array made for surface load/store.
  cudaSurfaceObject_t s = 0;
  e = cudaCreateSurfaceObject(&s, &r);
  EXPECT_RESULT(e != cudaSuccess, "a surface of an array without cudaArraySurfaceLoadStore");
  (void)cudaGetLastError();
  CK(cudaFreeArray(ia));

  t = array_texture(a, cudaAddressModeClamp, cudaFilterModePoint, false);
  CK(cudaDestroyTextureObject(t));
  std::vector<float2> at = {make_float2(1.5f, 1.5f)};
  float2* dat = dev_copy(at.data(), 1);
  float* dout = dev_alloc<float>(1);
  sample2d<<<1, 1>>>(t, dat, dout, 1);
  e = cudaDeviceSynchronize();
  EXPECT_RESULT(e != cudaSuccess, "a launch sampling a destroyed texture object succeeded");
  std::printf("destroyed texture object: %s\n", cudaGetErrorName(e));
}

// The direction through face `face`'s point (u, v) in [-1, 1]^2, by the guide's face table.
__device__ float3 cube_dir(int face, float u, float v) {
  switch (face) {
    case 0: return make_float3(1, -v, -u);
    case 1: return make_float3(-1, -v, u);
    case 2: return make_float3(u, 1, v);
    case 3: return make_float3(u, -1, -v);
    case 4: return make_float3(u, -v, 1);
    default: return make_float3(-u, -v, -1);
  }
}

// A cubemap (cudaArrayCubemap: six square faces, texCubemap with a direction): each face's
// texel centers, reached from the direction through them, read back that face's texels, by
// the guide's face table (NVIDIA's simpleCubemapTexture sample does the same).
__global__ void sample_cube(cudaTextureObject_t t, float* out, int w) {
  int x = threadIdx.x, y = threadIdx.y, face = blockIdx.x;
  float u = ((x + 0.5f) / w) * 2.f - 1.f, v = ((y + 0.5f) / w) * 2.f - 1.f;
  float3 d = cube_dir(face, u, v);
  out[(face * w + y) * w + x] = texCubemap<float>(t, d.x, d.y, d.z);
}

static void check_cubemap() {
  const int w = 8, n = 6 * w * w;
  std::vector<float> host(n);
  for (int i = 0; i < n; i++) host[i] = (float)i;
  cudaChannelFormatDesc fd = cudaCreateChannelDesc<float>();
  cudaArray_t a;
  CK(cudaMalloc3DArray(&a, &fd, make_cudaExtent(w, w, 6), cudaArrayCubemap));
  cudaMemcpy3DParms p = {};
  p.srcPtr = make_cudaPitchedPtr(host.data(), w * sizeof(float), w, w);
  p.dstArray = a;
  p.extent = make_cudaExtent(w, w, 6);
  p.kind = cudaMemcpyHostToDevice;
  CK(cudaMemcpy3D(&p));
  cudaResourceDesc r = {};
  r.resType = cudaResourceTypeArray;
  r.res.array.array = a;
  for (int linear = 0; linear < 2; linear++) {
    cudaTextureDesc td = {};
    td.normalizedCoords = true;
    td.filterMode = linear ? cudaFilterModeLinear : cudaFilterModePoint;
    td.addressMode[0] = td.addressMode[1] = td.addressMode[2] = cudaAddressModeWrap;
    td.readMode = cudaReadModeElementType;
    cudaTextureObject_t t;
    CK(cudaCreateTextureObject(&t, &r, &td, nullptr));
    float* dout = dev_alloc<float>(n);
    sample_cube<<<6, dim3(w, w)>>>(t, dout, w);
    CK(cudaGetLastError());
    std::vector<float> got(n);
    CK(cudaMemcpy(got.data(), dout, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
      EXPECT_RESULT(got[i] == host[i], "cubemap (%s) texel %d: %g, want %g",
                    linear ? "linear" : "point", i, got[i], host[i]);
    CK(cudaDestroyTextureObject(t));
    CK(cudaFree(dout));
  }
  CK(cudaFreeArray(a));
  std::printf("checked a cubemap: six faces of %dx%d texels, point and linear\n", w, w);
}

// A layered cubemap (cudaArrayCubemap | cudaArrayLayered, 6 x layers faces): texCubemapLayered
// reads cubemap `layer`'s faces, layer after layer; a cubemap whose depth is not six (or a
// multiple of six when layered) is refused when the array is made.
__global__ void sample_cube_layered(cudaTextureObject_t t, float* out, int w) {
  int x = threadIdx.x, y = threadIdx.y, face = blockIdx.x % 6, layer = blockIdx.x / 6;
  float u = ((x + 0.5f) / w) * 2.f - 1.f, v = ((y + 0.5f) / w) * 2.f - 1.f;
  float3 d = cube_dir(face, u, v);
  out[(blockIdx.x * w + y) * w + x] = texCubemapLayered<float>(t, d.x, d.y, d.z, layer);
}

static void check_cubemap_layered() {
  const int w = 4, layers = 3, n = 6 * layers * w * w;
  cudaChannelFormatDesc fd = cudaCreateChannelDesc<float>();
  cudaArray_t bad;
  EXPECT_RESULT(cudaMalloc3DArray(&bad, &fd, make_cudaExtent(w, w, 5), cudaArrayCubemap) ==
                    cudaErrorInvalidValue,
                "a cubemap of five faces was made");
  cudaGetLastError();
  EXPECT_RESULT(cudaMalloc3DArray(&bad, &fd, make_cudaExtent(w, w, 9),
                                  cudaArrayCubemap | cudaArrayLayered) == cudaErrorInvalidValue,
                "a layered cubemap of nine faces was made");
  cudaGetLastError();
  std::vector<float> host(n);
  for (int i = 0; i < n; i++) host[i] = (float)(i * 3 + 1);
  cudaArray_t a;
  CK(cudaMalloc3DArray(&a, &fd, make_cudaExtent(w, w, 6 * layers),
                       cudaArrayCubemap | cudaArrayLayered));
  cudaMemcpy3DParms p = {};
  p.srcPtr = make_cudaPitchedPtr(host.data(), w * sizeof(float), w, w);
  p.dstArray = a;
  p.extent = make_cudaExtent(w, w, 6 * layers);
  p.kind = cudaMemcpyHostToDevice;
  CK(cudaMemcpy3D(&p));
  cudaResourceDesc r = {};
  r.resType = cudaResourceTypeArray;
  r.res.array.array = a;
  cudaTextureDesc td = {};
  td.normalizedCoords = true;
  td.filterMode = cudaFilterModePoint;
  td.addressMode[0] = td.addressMode[1] = td.addressMode[2] = cudaAddressModeWrap;
  td.readMode = cudaReadModeElementType;
  cudaTextureObject_t t;
  CK(cudaCreateTextureObject(&t, &r, &td, nullptr));
  float* dout = dev_alloc<float>(n);
  sample_cube_layered<<<6 * layers, dim3(w, w)>>>(t, dout, w);
  CK(cudaGetLastError());
  std::vector<float> got(n);
  CK(cudaMemcpy(got.data(), dout, n * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; i++)
    EXPECT_RESULT(got[i] == host[i], "layered cubemap texel %d (layer %d): %g, want %g", i,
                  i / (6 * w * w), got[i], host[i]);
  CK(cudaDestroyTextureObject(t));
  CK(cudaFree(dout));
  CK(cudaFreeArray(a));
  std::printf("checked a layered cubemap: %d cubemaps of six %dx%d faces\n", layers, w, w);
}

KCHECK_MAIN({"point_filter", check_point_filter}, {"linear_filter", check_linear_filter},
            {"normalized_coords", check_normalized_coords},
            {"normalized_float", check_normalized_float}, {"fetch_linear", check_fetch_linear},
            {"pitch2d", check_pitch2d}, {"volume", check_volume}, {"gather", check_gather},
            {"surface", check_surface}, {"destroyed", check_destroyed},
            {"cubemap", check_cubemap}, {"cubemap_layered", check_cubemap_layered})
