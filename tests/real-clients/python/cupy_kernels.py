"""CuPy kernels through whatever libcuda.so.1 the loader finds: an elementwise op, a reduction
and a RawKernel. Usage: python cupy_kernels.py [--launch-only]
--launch-only checks that compiling, loading, launching and synchronizing all succeed, not the
results. Run with CUPY_COMPILE_WITH_PTX=1 against an emulated GPU (it executes PTX, not SASS).
"""
import sys

import numpy as np
import cupy

verify = "--launch-only" not in sys.argv[1:]
mismatches = []


def expect_result(cond, msg):
    if verify and not cond:
        mismatches.append(msg)


n = 1_000_003
x = np.arange(n, dtype=np.float32) % 1000
y = (np.arange(n, dtype=np.float32) % 7) - 3
dx = cupy.asarray(x)
dy = cupy.asarray(y)

dz = dx * 2.0 + dy
cupy.cuda.Device(0).synchronize()
print("launched elementwise")
expect_result(np.array_equal(dz.get(), x * 2.0 + y), "elementwise x*2+y")

xi = np.arange(n, dtype=np.int64) % 1000
total = cupy.asarray(xi).sum()
cupy.cuda.Device(0).synchronize()
print("launched reduction")
expect_result(int(total.get()) == int(xi.sum()), f"sum {total.get()}, want {xi.sum()}")

raw = cupy.RawKernel(r'''
extern "C" __global__ void scale_add(const float* a, float* out, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] * s + 1.0f;
}
''', "scale_add")
out = cupy.full(n, -1.0, dtype=np.float32)
raw(((n + 255) // 256,), (256,), (dx, out, np.float32(0.5), np.int32(n)))
cupy.cuda.Device(0).synchronize()
print("launched RawKernel")
expect_result(np.array_equal(out.get(), x * 0.5 + 1.0), "RawKernel scale_add")

# get() of a Fortran-ordered array makes it contiguous with an elementwise kernel first.
f_host = np.asfortranarray(np.arange(64 * 33, dtype=np.float64).reshape(64, 33))
f_back = cupy.asarray(f_host).get()
print("launched ascontiguousarray")
expect_result(np.array_equal(f_back, f_host), "Fortran-ordered round trip")

if mismatches:
    for m in mismatches[:5]:
        print(f"MISMATCH {m}", file=sys.stderr)
    print(f"FAIL cupy_kernels: {len(mismatches)} result mismatches", file=sys.stderr)
    sys.exit(1)
print("PASS cupy_kernels (results checked)" if verify else "PASS cupy_kernels (launches only)")
