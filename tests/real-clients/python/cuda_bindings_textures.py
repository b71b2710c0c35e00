"""Texture and surface objects through the driver API (cuda-python's cuda.bindings.driver):
cuArray3DCreate and cuArray3DGetDescriptor, cuMemcpy2D into an array, cuTexObjectCreate over
an array and over linear memory, the descriptors read back (cuTexObjectGetResourceDesc,
GetTextureDesc, GetResourceViewDesc), cuSurfObjectCreate, an NVRTC kernel sampling with
tex2D<float> and writing with surf2Dwrite (results against NumPy), and the errors: unsupported
options (sRGB, mipmapped arrays, sparse arrays) are CUDA_ERROR_NOT_SUPPORTED, invalid ones
(unknown flags, linear filtering of integers, a surface of an array without SURFACE_LDST)
CUDA_ERROR_INVALID_VALUE, a destroyed object CUDA_ERROR_INVALID_HANDLE.

Usage: python cuda_bindings_textures.py
"""
import sys

import numpy as np
from cuda.bindings import driver as cu
from cuda.bindings import nvrtc

R = cu.CUresult


def fail(msg):
    print(f"FAIL {msg}", file=sys.stderr)
    sys.exit(1)


def expect(cond, msg):
    if not cond:
        fail(msg)


def ck(result, what=""):
    err, *rest = result if isinstance(result, tuple) else (result,)
    ok = (err == nvrtc.nvrtcResult.NVRTC_SUCCESS if isinstance(err, nvrtc.nvrtcResult)
          else err == R.CUDA_SUCCESS)
    if not ok:
        fail(f"{what}: {err!r}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


def status(result):
    return result[0] if isinstance(result, tuple) else result


def array(w, h, fmt, channels, flags=0):
    d = cu.CUDA_ARRAY3D_DESCRIPTOR()
    d.Width, d.Height, d.Depth = w, h, 0
    d.Format = fmt
    d.NumChannels = channels
    d.Flags = flags
    return d


def to_array(arr, host, row_bytes, rows):
    m = cu.CUDA_MEMCPY2D()
    m.srcMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_HOST
    m.srcHost = host.ctypes.data
    m.srcPitch = row_bytes
    m.dstMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_ARRAY
    m.dstArray = arr
    m.WidthInBytes = row_bytes
    m.Height = rows
    ck(cu.cuMemcpy2D(m), "cuMemcpy2D host -> array")


def from_array(arr, host, row_bytes, rows):
    m = cu.CUDA_MEMCPY2D()
    m.srcMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_ARRAY
    m.srcArray = arr
    m.dstMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_HOST
    m.dstHost = host.ctypes.data
    m.dstPitch = row_bytes
    m.WidthInBytes = row_bytes
    m.Height = rows
    ck(cu.cuMemcpy2D(m), "cuMemcpy2D array -> host")


def array_resource(arr):
    r = cu.CUDA_RESOURCE_DESC()
    r.resType = cu.CUresourcetype.CU_RESOURCE_TYPE_ARRAY
    r.res.array.hArray = arr
    return r


def tex_desc(filter_mode=0, flags=0, mode=1):
    t = cu.CUDA_TEXTURE_DESC()
    t.addressMode = [cu.CUaddress_mode(mode)] * 3
    t.filterMode = cu.CUfilter_mode(filter_mode)
    t.flags = flags
    return t


SRC = rb'''
extern "C" __global__ void sample(cudaTextureObject_t t, float* out, int w, int h) {
  int x = threadIdx.x, y = blockIdx.x;
  if (x < w) out[y * w + x] = tex2D<float>(t, x + 1.0f, y + 0.5f);
}
extern "C" __global__ void fill(cudaSurfaceObject_t s, int w) {
  int x = threadIdx.x, y = blockIdx.x;
  if (x < w) surf2Dwrite<int>(x * 1000 + y, s, x * 4, y);
}
'''


def main():
    ck(cu.cuInit(0), "cuInit")
    dev = ck(cu.cuDeviceGet(0), "cuDeviceGet")
    ctx = ck(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    A = cu.CUdevice_attribute
    for attr, want in ((A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_WIDTH, 131072),
                       (A.CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_HEIGHT, 65536),
                       (A.CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT, 512)):
        got = ck(cu.cuDeviceGetAttribute(attr, dev), f"{attr!r}")
        expect(got == want, f"{attr!r} = {got}, want {want}")

    F = cu.CUarray_format
    w, h = 13, 6
    img = (np.arange(w * h, dtype=np.float32) * 0.5 - 3.0).reshape(h, w)
    arr = ck(cu.cuArray3DCreate(array(w, h, F.CU_AD_FORMAT_FLOAT, 1)), "cuArray3DCreate")
    back = ck(cu.cuArray3DGetDescriptor(arr), "cuArray3DGetDescriptor")
    expect((back.Width, back.Height, back.Depth, back.NumChannels) == (w, h, 0, 1),
           "cuArray3DGetDescriptor")
    to_array(arr, img, w * 4, h)

    # Errors first: nothing is created by a refused call.
    res = array_resource(arr)
    e = status(cu.cuTexObjectCreate(res, tex_desc(flags=0x10), None))
    expect(e == R.CUDA_ERROR_NOT_SUPPORTED, f"sRGB: {e!r}")
    e = status(cu.cuTexObjectCreate(res, tex_desc(flags=0x100), None))
    expect(e == R.CUDA_ERROR_INVALID_VALUE, f"unknown texture flag: {e!r}")
    t = tex_desc()
    t.maxAnisotropy = 4
    e = status(cu.cuTexObjectCreate(res, t, None))
    expect(e == R.CUDA_ERROR_NOT_SUPPORTED, f"anisotropic filtering: {e!r}")
    e = status(cu.cuSurfObjectCreate(res))
    expect(e == R.CUDA_ERROR_INVALID_VALUE, f"surface of an array without SURFACE_LDST: {e!r}")
    iarr = ck(cu.cuArray3DCreate(array(4, 4, F.CU_AD_FORMAT_UNSIGNED_INT32, 1)), "int array")
    e = status(cu.cuTexObjectCreate(array_resource(iarr), tex_desc(filter_mode=1, flags=1), None))
    expect(e == R.CUDA_ERROR_INVALID_VALUE, f"linear filtering of integers: {e!r}")
    ck(cu.cuArrayDestroy(iarr), "cuArrayDestroy")
    e = status(cu.cuArray3DCreate(array(4, 4, F.CU_AD_FORMAT_FLOAT, 1, flags=0x40)))
    expect(e == R.CUDA_ERROR_NOT_SUPPORTED, f"sparse array: {e!r}")
    e = status(cu.cuArray3DCreate(array(4, 4, F.CU_AD_FORMAT_FLOAT, 1, flags=0x10000)))
    expect(e == R.CUDA_ERROR_INVALID_VALUE, f"unknown array flag: {e!r}")
    mres = cu.CUDA_RESOURCE_DESC()
    mres.resType = cu.CUresourcetype.CU_RESOURCE_TYPE_MIPMAPPED_ARRAY
    e = status(cu.cuTexObjectCreate(mres, tex_desc(), None))
    expect(e == R.CUDA_ERROR_NOT_SUPPORTED, f"mipmapped array: {e!r}")
    print("PASS errors")

    # Linear filtering, clamp; the descriptors come back as given.
    t = tex_desc(filter_mode=1)
    t.borderColor = [1.0, 2.0, 3.0, 4.0]
    tex = ck(cu.cuTexObjectCreate(res, t, None), "cuTexObjectCreate")
    rb = ck(cu.cuTexObjectGetResourceDesc(tex), "cuTexObjectGetResourceDesc")
    expect(rb.resType == cu.CUresourcetype.CU_RESOURCE_TYPE_ARRAY
           and int(rb.res.array.hArray) == int(arr), "resource descriptor read back")
    tb = ck(cu.cuTexObjectGetTextureDesc(tex), "cuTexObjectGetTextureDesc")
    expect(int(tb.filterMode) == 1 and list(tb.borderColor) == [1.0, 2.0, 3.0, 4.0],
           "texture descriptor read back")
    e = status(cu.cuTexObjectGetResourceViewDesc(tex))
    expect(e == R.CUDA_ERROR_INVALID_VALUE, f"view of an object made without one: {e!r}")

    prog = ck(nvrtc.nvrtcCreateProgram(SRC, b"tex.cu", 0, [], []), "nvrtcCreateProgram")
    opts = [b"--gpu-architecture=compute_80"]
    err, = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        size = ck(nvrtc.nvrtcGetProgramLogSize(prog), "log size")
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        fail(f"nvrtcCompileProgram: {err!r}\n{log.decode(errors='replace')}")
    size = ck(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
    ptx = b" " * size
    ck(nvrtc.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
    module = ck(cu.cuModuleLoadData(ptx), "cuModuleLoadData")
    sample = ck(cu.cuModuleGetFunction(module, b"sample"), "sample")
    fill = ck(cu.cuModuleGetFunction(module, b"fill"), "fill")

    out = ck(cu.cuMemAlloc(w * h * 4), "cuMemAlloc")
    args = [np.array([int(tex)], dtype=np.uint64), np.array([int(out)], dtype=np.uint64),
            np.array([w], dtype=np.int32), np.array([h], dtype=np.int32)]
    ptrs = np.array([a.ctypes.data for a in args], dtype=np.uint64)
    ck(cu.cuLaunchKernel(sample, h, 1, 1, 32, 1, 1, 0, 0, ptrs.ctypes.data, 0), "sample")
    ck(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    got = np.empty((h, w), dtype=np.float32)
    ck(cu.cuMemcpyDtoH(got, out, got.nbytes), "cuMemcpyDtoH")
    # x + 1.0 lies halfway between texels x and x + 1 (clamped at the right edge).
    right = np.concatenate([img[:, 1:], img[:, -1:]], axis=1)
    expect(np.allclose(got, (img + right) / 2, rtol=0, atol=1e-6),
           f"tex2D linear:\n{got}\nwant\n{(img + right) / 2}")
    ck(cu.cuTexObjectDestroy(tex), "cuTexObjectDestroy")
    e = status(cu.cuTexObjectDestroy(tex))
    expect(e == R.CUDA_ERROR_INVALID_HANDLE, f"destroying twice: {e!r}")
    print("PASS texture")

    # tex1Dfetch-style linear resource: created and read back.
    lin = ck(cu.cuMemAlloc(4096), "cuMemAlloc")
    lres = cu.CUDA_RESOURCE_DESC()
    lres.resType = cu.CUresourcetype.CU_RESOURCE_TYPE_LINEAR
    lres.res.linear.devPtr = lin
    lres.res.linear.format = F.CU_AD_FORMAT_SIGNED_INT16
    lres.res.linear.numChannels = 2
    lres.res.linear.sizeInBytes = 4096
    ltex = ck(cu.cuTexObjectCreate(lres, tex_desc(flags=1), None), "linear texture")
    lb = ck(cu.cuTexObjectGetResourceDesc(ltex), "linear resource read back")
    expect(int(lb.res.linear.devPtr) == int(lin) and lb.res.linear.numChannels == 2
           and lb.res.linear.sizeInBytes == 4096, "linear resource descriptor read back")
    ck(cu.cuTexObjectDestroy(ltex), "cuTexObjectDestroy")
    # Misaligned linear memory (texture alignment is 512).
    lres.res.linear.devPtr = cu.CUdeviceptr(int(lin) + 4)
    lres.res.linear.sizeInBytes = 1024
    e = status(cu.cuTexObjectCreate(lres, tex_desc(flags=1), None))
    expect(e == R.CUDA_ERROR_INVALID_VALUE, f"misaligned linear texture: {e!r}")

    # A surface: an int array written by a kernel.
    sarr = ck(cu.cuArray3DCreate(array(w, h, F.CU_AD_FORMAT_SIGNED_INT32, 1, flags=2)),
              "surface array")
    surf = ck(cu.cuSurfObjectCreate(array_resource(sarr)), "cuSurfObjectCreate")
    sb = ck(cu.cuSurfObjectGetResourceDesc(surf), "cuSurfObjectGetResourceDesc")
    expect(int(sb.res.array.hArray) == int(sarr), "surface resource read back")
    sargs = [np.array([int(surf)], dtype=np.uint64), np.array([w], dtype=np.int32)]
    sptrs = np.array([a.ctypes.data for a in sargs], dtype=np.uint64)
    ck(cu.cuLaunchKernel(fill, h, 1, 1, 32, 1, 1, 0, 0, sptrs.ctypes.data, 0), "fill")
    ck(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    sgot = np.empty((h, w), dtype=np.int32)
    from_array(sarr, sgot, w * 4, h)
    want = np.arange(w)[None, :] * 1000 + np.arange(h)[:, None]
    expect(np.array_equal(sgot, want), f"surf2Dwrite:\n{sgot}")
    ck(cu.cuSurfObjectDestroy(surf), "cuSurfObjectDestroy")
    print("PASS surface")

    ck(cu.cuMemFree(out), "cuMemFree")
    ck(cu.cuMemFree(lin), "cuMemFree")
    ck(cu.cuArrayDestroy(arr), "cuArrayDestroy")
    ck(cu.cuArrayDestroy(sarr), "cuArrayDestroy")
    print("PASS cuda_bindings_textures (results checked)")


if __name__ == "__main__":
    main()
