"""Lazy module loading through gpufuse (cuda.bindings.driver + nvrtc): a cubin the program loads
reaches the worker only when one of its kernels is first asked for; the errors a load returns
stay at the load (SASS for another GPU family, a malformed fatbin); CUDA_MODULE_LOADING=EAGER
loads at once. Between steps it reads the node's image counters with `gpufuse status --json`.
Usage: python module_loading.py GPUFUSE_BINARY
Prints key=value lines and PASS module_loading."""
import json
import os
import struct
import subprocess
import sys

from cuda.bindings import driver as cu
from cuda.bindings import nvrtc

GPUFUSE = sys.argv[1]


def fail(msg):
    print(f"FAIL {msg}", file=sys.stderr)
    sys.exit(1)


def ck(result, what):
    err, *rest = result if isinstance(result, tuple) else (result,)
    ok = err in (nvrtc.nvrtcResult.NVRTC_SUCCESS, cu.CUresult.CUDA_SUCCESS)
    if not ok:
        fail(f"{what}: {err!r}")
    return rest[0] if len(rest) == 1 else (rest or None)


def loads():
    """Images the node's workers have loaded by bytes or by hash since the node started."""
    res = subprocess.run([GPUFUSE, "status", "--json"], capture_output=True, text=True,
                         timeout=30)
    if res.returncode != 0:
        fail(f"gpufuse status: {res.stderr}")
    c = json.loads(res.stdout)["image_cache"]
    return c["received"] + c["hits"]


def cubin(name, arch):
    src = f'extern "C" __global__ void {name}(float *x) {{ x[threadIdx.x] += 1.0f; }}'.encode()
    prog = ck(nvrtc.nvrtcCreateProgram(src, name.encode() + b".cu", 0, [], []), "create")
    opts = [f"--gpu-architecture={arch}".encode()]
    ck(nvrtc.nvrtcCompileProgram(prog, len(opts), opts), f"compile {arch}")
    out = b" " * ck(nvrtc.nvrtcGetCUBINSize(prog), "cubin size")
    ck(nvrtc.nvrtcGetCUBIN(prog, out), "cubin")
    return out


ck(cu.cuInit(0), "cuInit")
dev = ck(cu.cuDeviceGet(0), "cuDeviceGet")
ctx = ck(cu.cuDevicePrimaryCtxRetain(dev), "retain")
ck(cu.cuCtxSetCurrent(ctx), "set current")
major = ck(cu.cuDeviceGetAttribute(
    cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "major")
minor = ck(cu.cuDeviceGetAttribute(
    cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "minor")
mode = ck(cu.cuModuleGetLoadingMode(), "cuModuleGetLoadingMode")
print(f"loading_mode={'lazy' if int(mode) == 2 else 'eager' if int(mode) == 1 else int(mode)}")

# A cubin for this GPU: loaded lazily, at cuModuleGetFunction.
own = cubin("lazy_module_kernel", f"sm_{major}{minor}")
before = loads()
module = ck(cu.cuModuleLoadData(own), "cuModuleLoadData")
print(f"loads_at_module_load={loads() - before}")
ck(cu.cuModuleGetFunction(module, b"lazy_module_kernel"), "cuModuleGetFunction")
print(f"loads_at_get_function={loads() - before}")
err, _ = cu.cuModuleGetFunction(module, b"no_such_kernel")
print(f"missing_kernel={err.name}")
ck(cu.cuModuleUnload(module), "cuModuleUnload")

# A library: loaded at cuLibraryGetKernel.
lib_image = cubin("lazy_library_kernel", f"sm_{major}{minor}")
before = loads()
lib = ck(cu.cuLibraryLoadData(lib_image, [], [], 0, [], [], 0), "cuLibraryLoadData")
print(f"loads_at_library_load={loads() - before}")
ck(cu.cuLibraryGetKernel(lib, b"lazy_library_kernel"), "cuLibraryGetKernel")
print(f"loads_at_get_kernel={loads() - before}")
ck(cu.cuLibraryUnload(lib), "cuLibraryUnload")

# Errors of the load stay at the load, though nothing is sent then.
foreign = cubin("foreign_kernel", "sm_80" if major != 8 else "sm_90")
err, _ = cu.cuModuleLoadData(foreign)
print(f"foreign_sass={err.name}")
# A fatbin header that claims one entry whose header runs past the image's end.
malformed = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, 64) + struct.pack("<HHI", 2, 64, 1 << 20)
malformed += b"\0" * (80 - len(malformed))
err, _ = cu.cuModuleLoadData(malformed)
print(f"malformed_fatbin={err.name}")
print("PASS module_loading")
