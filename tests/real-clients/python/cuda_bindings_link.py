"""The driver's JIT linker through cuda-python (cuda.bindings.driver + nvrtc): cuLinkCreate,
cuLinkAddData, cuLinkAddFile, cuLinkComplete, cuLinkDestroy over relocatable PTX from NVRTC,
a relocatable fatbin and a host object file from nvcc; the linked image loads with
cuModuleLoadData and its kernel, which calls into and reads a variable of another unit,
computes right. Link errors (a symbol defined twice, one defined nowhere, PTX that does not
parse, a cubin) fail with NVIDIA's status and an error log naming the cause.

Usage: python cuda_bindings_link.py LIB.fatbin LIB.o   (nvcc -rdc=true of rdc/rdc_lib.cu)
"""
import ctypes
import sys

import numpy as np
from cuda.bindings import driver as cu
from cuda.bindings import nvrtc

R = cu.CUresult
J = cu.CUjit_option
T = cu.CUjitInputType

MAIN = r"""
extern __device__ int scale(int x);
extern __device__ int bias;
extern "C" __global__ void apply(int *v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = scale(v[i]) + bias;
}
"""
LIB = r"""
__device__ int scale(int x) { return 3 * x + 1; }
__device__ int bias = 5;
"""


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


def compile_rdc(src, name, cubin=False):
    prog = ck(nvrtc.nvrtcCreateProgram(src.encode(), name.encode(), 0, [], []), "create")
    arch = b"-arch=sm_80" if cubin else b"-arch=compute_80"
    res = nvrtc.nvrtcCompileProgram(prog, 2, [b"--relocatable-device-code=true", arch])
    if res[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        size = ck(nvrtc.nvrtcGetProgramLogSize(prog), "log size")
        log = b" " * size
        ck(nvrtc.nvrtcGetProgramLog(prog, log), "log")
        fail(f"nvrtc {name}: {log.decode(errors='replace')}")
    if cubin:
        size = ck(nvrtc.nvrtcGetCUBINSize(prog), "cubin size")
        out = b" " * size
        ck(nvrtc.nvrtcGetCUBIN(prog, out), "cubin")
    else:
        size = ck(nvrtc.nvrtcGetPTXSize(prog), "ptx size")
        out = b" " * size
        ck(nvrtc.nvrtcGetPTX(prog, out), "ptx")
    return out


class Linker:
    """One link state with error and info logs (as numba-cuda drives cuLinkCreate)."""

    def __init__(self):
        self.err_log = bytearray(4096)
        self.info_log = bytearray(4096)
        opts = {J.CU_JIT_ERROR_LOG_BUFFER: self.err_log,
                J.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES: len(self.err_log),
                J.CU_JIT_INFO_LOG_BUFFER: self.info_log,
                J.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES: len(self.info_log),
                J.CU_JIT_LOG_VERBOSE: 1}
        self.keys, self.values = list(opts.keys()), list(opts.values())
        self.state = ck(cu.cuLinkCreate(len(self.keys), self.keys, self.values), "cuLinkCreate")

    def add(self, kind, data, name):
        return cu.cuLinkAddData(self.state, kind, data, len(data), name.encode(), 0, None, None)[0]

    def add_file(self, kind, path):
        return cu.cuLinkAddFile(self.state, kind, path.encode(), 0, None, None)[0]

    def complete(self):
        err, ptr, size = cu.cuLinkComplete(self.state)
        return err, (ctypes.string_at(ptr, size) if err == R.CUDA_SUCCESS else None)

    def error(self):
        return bytes(self.err_log).split(b"\0")[0].decode(errors="replace")

    def destroy(self):
        ck(cu.cuLinkDestroy(self.state), "cuLinkDestroy")


def run(image, what):
    """Loads a linked image, runs apply over 300 ints and checks 3i + 1 + 5."""
    mod = ck(cu.cuModuleLoadData(image), f"{what}: cuModuleLoadData")
    fn = ck(cu.cuModuleGetFunction(mod, b"apply"), f"{what}: cuModuleGetFunction")
    n = 300
    host = np.arange(n, dtype=np.int32)
    dev = ck(cu.cuMemAlloc(host.nbytes), "cuMemAlloc")
    ck(cu.cuMemcpyHtoD(dev, host.ctypes.data, host.nbytes), "HtoD")
    args = [np.array([int(dev)], dtype=np.uint64), np.array([n], dtype=np.int32)]
    ptrs = np.array([a.ctypes.data for a in args], dtype=np.uint64)
    ck(cu.cuLaunchKernel(fn, 3, 1, 1, 128, 1, 1, 0, 0, ptrs.ctypes.data, 0), f"{what}: launch")
    ck(cu.cuCtxSynchronize(), f"{what}: synchronize")
    out = np.zeros(n, dtype=np.int32)
    ck(cu.cuMemcpyDtoH(out.ctypes.data, dev, out.nbytes), "DtoH")
    expect((out == 3 * np.arange(n) + 1 + 5).all(), f"{what}: wrong results {out[:8]}")
    dptr, size = ck(cu.cuModuleGetGlobal(mod, b"bias"), f"{what}: cuModuleGetGlobal(bias)")
    expect(size == 4, f"{what}: bias is {size} bytes")
    ck(cu.cuMemFree(dev), "cuMemFree")
    ck(cu.cuModuleUnload(mod), "cuModuleUnload")
    print(f"PASS {what}")


def main():
    fatbin_path, object_path = sys.argv[1], sys.argv[2]
    ck(cu.cuInit(0), "cuInit")
    dev = ck(cu.cuDeviceGet(0), "cuDeviceGet")
    ctx = ck(cu.cuDevicePrimaryCtxRetain(dev), "retain")
    ck(cu.cuCtxSetCurrent(ctx), "set current")
    main_ptx = compile_rdc(MAIN, "main.cu")
    lib_ptx = compile_rdc(LIB, "lib.cu")

    # PTX + PTX.
    lk = Linker()
    ck(lk.add(T.CU_JIT_INPUT_PTX, main_ptx, "main.ptx"), "add main.ptx")
    ck(lk.add(T.CU_JIT_INPUT_PTX, lib_ptx, "lib.ptx"), "add lib.ptx")
    err, image = lk.complete()
    expect(err == R.CUDA_SUCCESS, f"cuLinkComplete: {err!r}: {lk.error()}")
    info = bytes(lk.info_log).split(b"\0")[0].decode()
    expect("linked 2 unit(s)" in info, f"info log {info!r}")
    lk.destroy()
    run(image, "ptx+ptx")

    # PTX + nvcc's relocatable fatbin and host object file, added from files.
    for kind, path, what in ((T.CU_JIT_INPUT_FATBINARY, fatbin_path, "ptx+fatbin"),
                             (T.CU_JIT_INPUT_OBJECT, object_path, "ptx+object")):
        lk = Linker()
        ck(lk.add(T.CU_JIT_INPUT_PTX, main_ptx, "main.ptx"), "add main.ptx")
        ck(lk.add_file(kind, path), f"cuLinkAddFile {path}")
        err, image = lk.complete()
        expect(err == R.CUDA_SUCCESS, f"{what}: cuLinkComplete: {err!r}: {lk.error()}")
        lk.destroy()
        run(image, what)

    # Declared and defined nowhere: named in the error log.
    lk = Linker()
    ck(lk.add(T.CU_JIT_INPUT_PTX, main_ptx, "main.ptx"), "add main.ptx")
    err, _ = lk.complete()
    expect(err == R.CUDA_ERROR_INVALID_IMAGE, f"unresolved: {err!r}")
    log = lk.error()
    expect("_Z5scalei" in log and "bias" in log and "main.ptx" in log, f"unresolved log {log!r}")
    lk.destroy()
    print("PASS unresolved")

    # Defined twice.
    lk = Linker()
    for name, data in (("main.ptx", main_ptx), ("lib.ptx", lib_ptx), ("lib2.ptx", lib_ptx)):
        ck(lk.add(T.CU_JIT_INPUT_PTX, data, name), f"add {name}")
    err, _ = lk.complete()
    log = lk.error()
    expect(err == R.CUDA_ERROR_INVALID_IMAGE and "multiple definitions of `_Z5scalei`" in log
           and "lib2.ptx" in log, f"duplicate: {err!r} {log!r}")
    lk.destroy()
    print("PASS duplicate")

    # PTX that does not parse, and SASS the emulated GPU cannot link.
    lk = Linker()
    bad = b".version 8.0\n.target sm_80\n.address_size 64\n.frobnicate 1;\n\0"
    err = lk.add(T.CU_JIT_INPUT_PTX, bad, "bad.ptx")
    expect(err == R.CUDA_ERROR_INVALID_PTX and "bad.ptx" in lk.error(),
           f"bad PTX: {err!r} {lk.error()!r}")
    cubin = compile_rdc(LIB, "lib.cu", cubin=True)
    err = lk.add(T.CU_JIT_INPUT_CUBIN, cubin, "lib.cubin")
    expect(err == R.CUDA_ERROR_NO_BINARY_FOR_GPU and "lib.cubin" in lk.error(),
           f"cubin: {err!r} {lk.error()!r}")
    lk.destroy()
    expect(cu.cuLinkDestroy(lk.state)[0] == R.CUDA_ERROR_INVALID_HANDLE, "double destroy")
    print("PASS errors")
    print("PASS cuda_bindings_link (results checked)")


main()
