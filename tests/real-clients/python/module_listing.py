"""Listing a module's functions through gpufuse (cuda.bindings.driver + NVRTC):
cuModuleGetFunctionCount/cuModuleEnumerateFunctions, cuLibraryGetKernelCount/
cuLibraryEnumerateKernels, and the walk over a module's functions that cuFFT asks the driver
for through the export table 6e163fbe (slot 7). A device function is not listed; an
enumerated function launches.
Prints PASS module_listing."""
import ctypes
import struct
import sys

from cuda.bindings import driver as cu
from cuda.bindings import nvrtc


def fail(msg):
    print(f"FAIL {msg}", file=sys.stderr)
    sys.exit(1)


def ck(result, what):
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err not in (nvrtc.nvrtcResult.NVRTC_SUCCESS, cu.CUresult.CUDA_SUCCESS):
        fail(f"{what}: {err!r}")
    return rest[0] if len(rest) == 1 else (rest or None)


SRC = rb'''
__device__ float helper(float x) { return x * 3.0f; }
extern "C" __global__ void add_one(float *x) { x[threadIdx.x] += 1.0f; }
extern "C" __global__ void triple(float *x) { x[threadIdx.x] = helper(x[threadIdx.x]); }
extern "C" __global__ void zero(float *x) { x[threadIdx.x] = 0.0f; }
'''
KERNELS = ["add_one", "triple", "zero"]

ck(cu.cuInit(0), "cuInit")
dev = ck(cu.cuDeviceGet(0), "cuDeviceGet")
ctx = ck(cu.cuDevicePrimaryCtxRetain(dev), "retain")
ck(cu.cuCtxSetCurrent(ctx), "set current")
major = ck(cu.cuDeviceGetAttribute(
    cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "major")
minor = ck(cu.cuDeviceGetAttribute(
    cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "minor")
# PTX for the device's own architecture: what the emulated GPU runs and a real one JIT-compiles.
prog = ck(nvrtc.nvrtcCreateProgram(SRC, b"listing.cu", 0, [], []), "create")
opts = [f"--gpu-architecture=compute_{major}{minor}".encode()]
ck(nvrtc.nvrtcCompileProgram(prog, len(opts), opts), "compile")
ptx = b" " * ck(nvrtc.nvrtcGetPTXSize(prog), "ptx size")
ck(nvrtc.nvrtcGetPTX(prog, ptx), "ptx")


def name_of(f):
    return ck(cu.cuFuncGetName(f), "cuFuncGetName").decode()


# --- cuModuleGetFunctionCount / cuModuleEnumerateFunctions -------------------------------
mod = ck(cu.cuModuleLoadData(ptx), "cuModuleLoadData")
count = ck(cu.cuModuleGetFunctionCount(mod), "cuModuleGetFunctionCount")
if count != len(KERNELS):
    fail(f"cuModuleGetFunctionCount = {count}, expected {len(KERNELS)}")
functions = ck(cu.cuModuleEnumerateFunctions(count, mod), "cuModuleEnumerateFunctions")
names = sorted(name_of(f) for f in functions)
if names != KERNELS:
    fail(f"enumerated {names}, expected {KERNELS}")
# NVIDIA's driver (580) accepts a list shorter than the count and fills what it holds.
short = ck(cu.cuModuleEnumerateFunctions(count - 1, mod), "enumerate into a short list")
if len(short) != count - 1 or not {int(f) for f in short} <= {int(f) for f in functions}:
    fail(f"a short list got {short}")
by_name = {name_of(f): f for f in functions}
if int(by_name["triple"]) != int(ck(cu.cuModuleGetFunction(mod, b"triple"), "get triple")):
    fail("the enumerated function is not the one cuModuleGetFunction returns")
print(f"module functions={count} names={','.join(names)}")

# An enumerated function launches.
buf = ck(cu.cuMemAlloc(4 * 32), "alloc")
ck(cu.cuMemcpyHtoD(buf, struct.pack("32f", *range(32)), 4 * 32), "HtoD")
arg = ctypes.c_uint64(int(buf))
params = (ctypes.c_void_p * 1)(ctypes.addressof(arg))
ck(cu.cuLaunchKernel(by_name["triple"], 1, 1, 1, 32, 1, 1, 0, 0, ctypes.addressof(params), 0),
   "launch triple")
host = bytearray(4 * 32)
ck(cu.cuMemcpyDtoH(host, buf, 4 * 32), "DtoH")
got = struct.unpack("32f", host)
if list(got) != [3.0 * i for i in range(32)]:
    fail(f"triple computed {got[:4]}...")

# --- cuLibraryGetKernelCount / cuLibraryEnumerateKernels ---------------------------------
lib = ck(cu.cuLibraryLoadData(ptx, [], [], 0, [], [], 0), "cuLibraryLoadData")
count = ck(cu.cuLibraryGetKernelCount(lib), "cuLibraryGetKernelCount")
kernels = ck(cu.cuLibraryEnumerateKernels(count, lib), "cuLibraryEnumerateKernels")
knames = sorted(ck(cu.cuKernelGetName(k), "cuKernelGetName").decode() for k in kernels)
if knames != KERNELS:
    fail(f"library kernels {knames}, expected {KERNELS}")
print(f"library kernels={count}")

# --- export table 6e163fbe, slot 7: (ctx, module, callback(user, function, module), user) -
libcuda = ctypes.CDLL("libcuda.so.1")
table = ctypes.c_void_p()
uuid = (ctypes.c_ubyte * 16)(*bytes.fromhex("6e163fbeb958444d835ce182aff1991e"))
r = libcuda.cuGetExportTable(ctypes.byref(table), uuid)
if r != 0:
    fail(f"cuGetExportTable(6e163fbe) = {r}")
slot7 = ctypes.cast(table.value + 7 * 8, ctypes.POINTER(ctypes.c_void_p)).contents.value
EACH = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
walk = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, EACH, ctypes.c_void_p)(slot7)
seen = []
each = EACH(lambda user, f, m: seen.append((user, f, m)))
r = walk(None, int(mod), each, 0x1234)
same = sorted(f for _, f, _ in seen) == sorted(int(f) for f in functions)
print(f"tools-module module={int(mod):#x} functions={[hex(int(f)) for f in functions]} "
      f"callbacks={[(hex(u or 0), hex(f or 0), hex(m or 0)) for u, f, m in seen]}", flush=True)
print(f"tools-module slot 7 returned={r} callbacks={len(seen)} same_functions={same}",
      flush=True)
if r != len(KERNELS):
    fail(f"slot 7 returned {r}, expected the function count {len(KERNELS)}")
if sorted(f for _, f, _ in seen) != sorted(int(f) for f in functions):
    fail("slot 7 did not pass the module's functions")
if any(u != 0x1234 for u, _, _ in seen):
    fail("slot 7 did not pass the caller's pointer")
# The third argument: NVIDIA's driver (580) passed a distinct byte-aligned pointer per function,
# which gpufuse takes for the function's name.
names_seen = [ctypes.string_at(n).decode() if n else None for _, _, n in seen]
if names_seen != [name_of(cu.CUfunction(f)) for _, f, _ in seen]:
    fail(f"slot 7 passed {names_seen} for the functions' names")
print(f"tools-module walk={len(seen)}")
print("PASS module_listing")
