"""A session to observe: cuda-python (cuda.bindings.driver + NVRTC) allocates 64 MiB, then
launches a kernel over 1M floats and synchronizes, again and again, until a line arrives on
stdin. Prints `READY pid=N launches=K` after its first launches, `DONE launches=K` at the end.

Usage: python observe_load.py
"""
import select
import sys

import numpy as np
from cuda.bindings import driver as cu
from cuda.bindings import nvrtc


def ck(result, what):
    err, *rest = result if isinstance(result, tuple) else (result,)
    ok = err in (nvrtc.nvrtcResult.NVRTC_SUCCESS, cu.CUresult.CUDA_SUCCESS)
    if not ok:
        print(f"FAIL {what}: {err!r}", file=sys.stderr)
        sys.exit(1)
    return rest[0] if len(rest) == 1 else (rest or None)


ck(cu.cuInit(0), "cuInit")
dev = ck(cu.cuDeviceGet(0), "cuDeviceGet")
ctx = ck(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
src = rb'''
extern "C" __global__ void scale(float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = y[i] * 0.5f + 1.0f;
}
'''
prog = ck(nvrtc.nvrtcCreateProgram(src, b"scale.cu", 0, [], []), "nvrtcCreateProgram")
opts = [b"--gpu-architecture=compute_80"]
ck(nvrtc.nvrtcCompileProgram(prog, len(opts), opts), "nvrtcCompileProgram")
ptx = b" " * ck(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
ck(nvrtc.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
module = ck(cu.cuModuleLoadData(ptx), "cuModuleLoadData")
fn = ck(cu.cuModuleGetFunction(module, b"scale"), "cuModuleGetFunction")
held = ck(cu.cuMemAlloc(64 << 20), "cuMemAlloc")
count = 1 << 20
dy = ck(cu.cuMemAlloc(count * 4), "cuMemAlloc")
ck(cu.cuMemsetD8(dy, 0, count * 4), "cuMemsetD8")
args = [np.array([int(dy)], dtype=np.uint64), np.array([count], dtype=np.int32)]
arg_ptrs = np.array([a.ctypes.data for a in args], dtype=np.uint64)

launches = 0


def launch():
    global launches
    ck(cu.cuLaunchKernel(fn, count // 256, 1, 1, 256, 1, 1, 0, 0, arg_ptrs.ctypes.data, 0),
       "cuLaunchKernel")
    ck(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    launches += 1


for _ in range(3):
    launch()
print(f"READY pid={__import__('os').getpid()} launches={launches}", flush=True)
while not select.select([sys.stdin], [], [], 0)[0]:
    launch()
sys.stdin.readline()
print(f"DONE launches={launches}", flush=True)
