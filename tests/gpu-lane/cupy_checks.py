"""CuPy and cuda-python checks for the GPU lane (NVRTC-compiled kernels, cuBLAS, CUB, the
driver API from Python), run natively and through gpufuse. Prints one line per check and
exits 1 if any failed."""
import sys
import time

import numpy as np

failed = []


def check(name, fn):
    t = time.perf_counter()
    try:
        ok = bool(fn())
    except Exception as e:  # reported, never hidden
        print(f"{name:28s} FAILED: {e!r}", flush=True)
        failed.append(name)
        return
    ms = (time.perf_counter() - t) * 1000
    print(f"{name:28s} {'ok' if ok else 'FAILED'} ({ms:.1f} ms)", flush=True)
    if not ok:
        failed.append(name)


import cupy as cp  # noqa: E402

rng = np.random.default_rng(0)
a = rng.standard_normal((512, 512), dtype=np.float32)
b = rng.standard_normal((512, 512), dtype=np.float32)
check("cupy elementwise", lambda: np.allclose(cp.asnumpy(cp.sin(cp.asarray(a)) * 2), np.sin(a) * 2, atol=1e-5))
check("cupy matmul (cuBLAS)", lambda: np.allclose(cp.asnumpy(cp.asarray(a) @ cp.asarray(b)), a @ b, atol=1e-2))
v = rng.standard_normal(1 << 20).astype(np.float32)
check("cupy sum (CUB)", lambda: abs(float(cp.asarray(v).sum()) - float(v.astype(np.float64).sum())) < 1e-1)
check("cupy sort", lambda: np.array_equal(cp.asnumpy(cp.sort(cp.asarray(v))), np.sort(v)))
k = cp.RawKernel(r'''
extern "C" __global__ void twice(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i];
}''', "twice")


def raw():
    x = cp.asarray(v)
    y = cp.empty_like(x)
    k(((v.size + 255) // 256,), (256,), (x, y, cp.int32(v.size)))
    return np.array_equal(cp.asnumpy(y), 2 * v)


check("cupy RawKernel (NVRTC)", raw)


def driver_api():
    from cuda.bindings import driver as cu
    (err,) = cu.cuInit(0)
    assert err == cu.CUresult.CUDA_SUCCESS, err
    err, n = cu.cuDeviceGetCount()
    err, name = cu.cuDeviceGetName(64, 0)
    print("   cuda-python sees", n, "device(s):", name.split(b"\0")[0].decode(), flush=True)
    return err == cu.CUresult.CUDA_SUCCESS and n >= 1


check("cuda-python driver API", driver_api)
# Last: a failing kernel poisons the context, and every check after it would fail too.
check("cupy fft", lambda: np.allclose(cp.asnumpy(cp.fft.fft(cp.asarray(v[:4096]))), np.fft.fft(v[:4096]), atol=1e-2))
print("cupy checks:", "all passed" if not failed else f"FAILED {failed}")
sys.exit(1 if failed else 0)
