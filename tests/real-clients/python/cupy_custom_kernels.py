"""CuPy kernels against NumPy: elementwise operations and reductions of several dtypes, and
user-defined ElementwiseKernel, ReductionKernel and RawModule (templates through name
expressions), scans and sorts. Run with CUPY_COMPILE_WITH_PTX=1 against an emulated GPU (it
executes PTX); CUPY_ACCELERATORS picks CuPy's own kernels ("") or CUB's (the default). Usage: python cupy_custom_kernels.py CHECK...  (no CHECK: all); each check prints
what it verified and "PASS CHECK (results checked)", or "FAIL CHECK: ..." on stderr.
"""
import sys
import time
import traceback

import numpy as np
import cupy

mismatches = []
_t0 = [time.monotonic()]


def _took():
    """Seconds since the previous check line (compiling included)."""
    now = time.monotonic()
    dt, _t0[0] = now - _t0[0], now
    return f"{dt:.2f} s"


def expect(cond, msg):
    if not cond:
        mismatches.append(msg)


def expect_equal(got, want, what):
    got = cupy.asnumpy(got)
    ok = got.shape == np.shape(want) and np.array_equal(got, want)
    expect(ok, f"{what}: got {got.ravel()[:6]}, want {np.ravel(want)[:6]}")
    print(f"checked {what} ({_took()})")


def expect_close(got, want, what, rtol, atol=0.0):
    got = cupy.asnumpy(got)
    ok = got.shape == np.shape(want) and np.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
    expect(ok, f"{what}: max abs diff {np.max(np.abs(got - want)) if got.shape == np.shape(want) else 'shape'}")
    print(f"checked {what} (rtol {rtol:g}; {_took()})")


rng = np.random.default_rng(1234)


def check_elementwise():
    a = rng.integers(-1000, 1000, size=(300, 70)).astype(np.int32)
    b = rng.integers(1, 50, size=70).astype(np.int32)
    da, db = cupy.asarray(a), cupy.asarray(b)
    expect_equal(da + db, a + b, "int32 broadcast add (300x70 + 70)")
    expect_equal(da // db, a // b, "int32 floor division")
    expect_equal(da % db, a % b, "int32 modulo")

    @cupy.fuse()
    def bits(x):
        return (x << 3) ^ (x >> 2) & 0xff | ~x

    expect_equal(bits(da), (a << 3) ^ (a >> 2) & 0xff | ~a, "int32 shifts and bit ops (cupy.fuse)")
    expect_equal(cupy.where(da > 0, da, db), np.where(a > 0, a, b), "where with broadcasting")
    x = rng.standard_normal(50000)
    dx = cupy.asarray(x)
    expect_equal(dx * 2.5 - 1.0, x * 2.5 - 1.0, "float64 affine")
    expect_equal(dx.astype(np.float32), x.astype(np.float32), "float64 -> float32")
    expect_equal(cupy.sqrt(cupy.abs(dx)), np.sqrt(np.abs(x)), "sqrt(abs) float64 (correctly rounded)")
    # Transcendental functions: CUDA's are within 1-2 ulp (double), 2-4 ulp (float).
    expect_close(cupy.exp(dx), np.exp(x), "exp float64", rtol=1e-14)
    xf = x.astype(np.float32)
    dxf = cupy.asarray(xf)
    expect_close(cupy.tanh(dxf), np.tanh(xf), "tanh float32", rtol=1e-6, atol=1e-7)
    expect_close(cupy.power(dxf * dxf, 0.75), np.power(xf * xf, 0.75), "power float32", rtol=2e-6)


def check_elementwise_f64_trig():
    # sin/cos of float64 call CUDA's slow-path argument reduction (a PTX `call`).
    x = rng.standard_normal(10_000) * 10
    dx = cupy.asarray(x)
    expect_close(cupy.sin(dx), np.sin(x), "sin float64", rtol=1e-14, atol=1e-15)
    expect_close(cupy.cos(dx), np.cos(x), "cos float64", rtol=1e-14, atol=1e-15)


def check_reductions():
    a = rng.integers(-10**6, 10**6, size=(257, 129)).astype(np.int64)
    da = cupy.asarray(a)
    expect_equal(da.sum(), a.sum(), "int64 sum")
    expect_equal(da.sum(axis=0), a.sum(axis=0), "int64 sum axis 0")
    expect_equal(da.sum(axis=1), a.sum(axis=1), "int64 sum axis 1")
    expect_equal(da.min(axis=1), a.min(axis=1), "int64 min axis 1")
    expect_equal(da.argmax(), a.argmax(), "argmax")
    expect_equal(da.argmin(axis=0), a.argmin(axis=0), "argmin axis 0")
    expect_equal(cupy.count_nonzero(da % 3 == 0), np.count_nonzero(a % 3 == 0), "count_nonzero")
    expect_equal((da > 999_000).any(), (a > 999_000).any(), "any")
    x = rng.standard_normal((500, 40))
    dx = cupy.asarray(x)
    # Different summation orders: close, not equal.
    expect_close(dx.mean(axis=0), x.mean(axis=0), "float64 mean axis 0", rtol=1e-12, atol=1e-14)
    expect_close(dx.var(axis=1), x.var(axis=1), "float64 var axis 1", rtol=1e-12)
    xf = rng.integers(-100, 100, size=100_003).astype(np.float32)
    expect_equal(cupy.asarray(xf).sum(), xf.sum(dtype=np.float64).astype(np.float32),
                 "float32 sum of small integers (exact)")


def check_elementwise_kernel():
    # Type placeholder T, two outputs, a raw argument indexed with i, a preamble function.
    k = cupy.ElementwiseKernel(
        "T x, T y, raw T table, int32 m", "T lin, T tab",
        """
        lin = axpy(x, y, (T)3);
        tab = table[(i * 7) % m] + x;
        """,
        "my_axpy_table",
        preamble="template <typename U> __device__ U axpy(U x, U y, U a) { return a * x + y; }",
    )
    for dtype in (np.int32, np.float64):
        x = rng.integers(-500, 500, size=10_001).astype(dtype)
        y = rng.integers(-500, 500, size=10_001).astype(dtype)
        table = (np.arange(37) * 11 - 100).astype(dtype)
        lin, tab = k(cupy.asarray(x), cupy.asarray(y), cupy.asarray(table), np.int32(37))
        idx = (np.arange(10_001) * 7) % 37
        expect_equal(lin, 3 * x + y, f"ElementwiseKernel<{np.dtype(dtype).name}> axpy output")
        expect_equal(tab, table[idx] + x, f"ElementwiseKernel<{np.dtype(dtype).name}> raw table output")
    # Broadcasting of inputs, and an output passed in.
    add_scaled = cupy.ElementwiseKernel("float32 a, float32 b", "float32 out",
                                        "out = a * 0.5f + b", "add_scaled")
    a = rng.integers(-64, 64, size=(64, 1)).astype(np.float32)
    b = rng.integers(-64, 64, size=(1, 48)).astype(np.float32)
    out = cupy.empty((64, 48), dtype=np.float32)
    add_scaled(cupy.asarray(a), cupy.asarray(b), out)
    expect_equal(out, a * 0.5 + b, "ElementwiseKernel with broadcasting into a given output")


def check_reduction_kernel():
    l2 = cupy.ReductionKernel("T x", "T y", "x * x", "a + b", "y = sqrt(a)", "0", "l2norm")
    x = rng.integers(-20, 20, size=(123, 77)).astype(np.float64)
    dx = cupy.asarray(x)
    expect_close(l2(dx), np.sqrt((x * x).sum()), "ReductionKernel L2 norm", rtol=1e-14)
    expect_close(l2(dx, axis=1), np.sqrt((x * x).sum(axis=1)), "ReductionKernel L2 norm axis 1",
                 rtol=1e-14)
    # Integer map/reduce with an identity other than 0: maximum of |x - 7|, exact.
    maxabs = cupy.ReductionKernel("int32 x", "int32 y", "abs(x - 7)", "max(a, b)", "y = a",
                                  "-1", "max_abs_dev")
    xi = rng.integers(-10**6, 10**6, size=(40, 1001)).astype(np.int32)
    expect_equal(maxabs(cupy.asarray(xi)), np.abs(xi - 7).max(), "ReductionKernel max |x-7|")
    expect_equal(maxabs(cupy.asarray(xi), axis=0), np.abs(xi - 7).max(axis=0),
                 "ReductionKernel max |x-7| axis 0")
    count = cupy.ReductionKernel("T x, T lo", "int64 y", "x >= lo ? 1 : 0", "a + b", "y = a", "0",
                                 "count_ge")
    expect_equal(count(cupy.asarray(xi), np.int32(1000)), np.count_nonzero(xi >= 1000),
                 "ReductionKernel count with a scalar argument")


def check_reduction_kernel_l2():
    # One ReductionKernel: with the default accelerators CuPy builds it on CUB's block reduction
    # (JIT-compiled with CUB's headers), with CUPY_ACCELERATORS="" on its own reduction code.
    l2 = cupy.ReductionKernel("T x", "T y", "x * x", "a + b", "y = sqrt(a)", "0", "l2norm")
    x = rng.integers(-20, 20, size=(123, 77)).astype(np.float64)
    dx = cupy.asarray(x)
    expect_close(l2(dx), np.sqrt((x * x).sum()), "ReductionKernel L2 norm", rtol=1e-14)
    expect_close(l2(dx, axis=1), np.sqrt((x * x).sum(axis=1)), "ReductionKernel L2 norm axis 1",
                 rtol=1e-14)


RAW_MODULE = r"""
template <typename T, int BLOCK>
__global__ void block_sums(const T* in, T* out, int n) {
  __shared__ T s[BLOCK];
  int t = threadIdx.x, i = blockIdx.x * BLOCK + t;
  s[t] = i < n ? in[i] : T(0);
  __syncthreads();
  for (int st = BLOCK / 2; st > 0; st >>= 1) {
    if (t < st) s[t] += s[t + st];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = s[0];
}
extern "C" __global__ void warp_max(const int* in, int* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  int v = i < n ? in[i] : (-2147483647 - 1);
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  if ((threadIdx.x & 31) == 0) out[i / 32] = v;
}
"""


def check_raw_module():
    names = ["block_sums<int, 128>", "block_sums<double, 256>"]
    mod = cupy.RawModule(code=RAW_MODULE, options=("-std=c++17",), name_expressions=names)
    n = 10_000
    x = rng.integers(-1000, 1000, size=n).astype(np.int32)
    out = cupy.zeros((n + 127) // 128, dtype=np.int32)
    mod.get_function(names[0])(((n + 127) // 128,), (128,), (cupy.asarray(x), out, np.int32(n)))
    want = np.add.reduceat(x, np.arange(0, n, 128))
    expect_equal(out, want, "RawModule block_sums<int, 128> (name expression)")
    xd = x.astype(np.float64) * 0.5
    outd = cupy.zeros((n + 255) // 256, dtype=np.float64)
    mod.get_function(names[1])(((n + 255) // 256,), (256,), (cupy.asarray(xd), outd, np.int32(n)))
    expect_equal(outd, np.add.reduceat(xd, np.arange(0, n, 256)), "RawModule block_sums<double, 256>")
    wm = cupy.zeros(n // 32 + 1, dtype=np.int32)
    xi = cupy.asarray(x)
    mod.get_function("warp_max")(((n + 255) // 256,), (256,), (xi, wm, np.int32(n)))
    padded = np.concatenate([x, np.full(32 - n % 32, np.iinfo(np.int32).min, dtype=np.int32)])
    expect_equal(wm[: len(padded) // 32], padded.reshape(-1, 32).max(axis=1), "RawModule warp_max")


def check_scan():
    # CuPy's cumsum: CUB's device scan with the default accelerators, its own warp-synchronous
    # scan kernel (cupy_scan_naive) with CUPY_ACCELERATORS="".
    x = rng.integers(-100, 100, size=20_003).astype(np.int64)
    expect_equal(cupy.cumsum(cupy.asarray(x)), np.cumsum(x), "cumsum int64 (20003)")
    m = rng.integers(-50, 50, size=(30, 200)).astype(np.int32)
    expect_equal(cupy.cumsum(cupy.asarray(m), axis=1), np.cumsum(m, axis=1), "cumsum int32 axis 1")


def check_sort():
    x = rng.integers(-10**6, 10**6, size=50_000).astype(np.int32)
    dx = cupy.asarray(x)
    expect_equal(cupy.sort(dx), np.sort(x), "sort int32 (50000)")
    order = cupy.asnumpy(cupy.argsort(dx))
    expect(np.array_equal(x[order], np.sort(x)), "argsort does not sort")
    print("checked argsort int32")
    f = rng.standard_normal(20_000)
    expect_equal(cupy.sort(cupy.asarray(f)), np.sort(f), "sort float64 (20000)")
    u, counts = cupy.unique(cupy.asarray(x % 1000), return_counts=True)
    wu, wc = np.unique(x % 1000, return_counts=True)
    expect_equal(u, wu, "unique values")
    expect_equal(counts, wc, "unique counts")


def check_sort_nd():
    """Sorts that reach CUB's merge sort in CuPy's wheel, whose PTX waits on the previous grid
    (`griddepcontrol.wait`, `launch_dependents`): multi-dimensional sort and argsort along
    either axis, median, and unique of a 2-D array."""
    y = rng.standard_normal((24, 1500))
    dy = cupy.asarray(y)
    expect_equal(cupy.sort(dy, axis=1), np.sort(y, axis=1), "sort float64 (24, 1500) axis 1")
    expect_equal(cupy.sort(dy, axis=0), np.sort(y, axis=0), "sort float64 (24, 1500) axis 0")
    order = cupy.asnumpy(cupy.argsort(dy, axis=1))
    expect(np.array_equal(np.take_along_axis(y, order, axis=1), np.sort(y, axis=1)),
           "argsort axis 1 does not sort")
    print("checked argsort float64 (24, 1500) axis 1")
    expect_equal(cupy.median(dy, axis=1), np.median(y, axis=1), "median axis 1")
    q = (y * 10).astype(np.int64)
    expect_equal(cupy.unique(cupy.asarray(q)), np.unique(q), "unique of a 2-D int64 array")


def check_partition():
    """partition/argpartition: a 32-thread bitonic select over 512 slices of a large input
    (kth below 16 runs half the warp idle in each step), merged pairwise; checked against
    NumPy's k-th elements and the partition property, for several dtypes and kth lists."""
    for n, kth, dtype in [(1_000_000, 5, np.int32), (400_000, 300, np.float64),
                          (300_000, (3, 100, 250), np.float32), (200_003, 31, np.int64)]:
        x = rng.integers(-10**6, 10**6, size=n).astype(dtype)
        p = cupy.asnumpy(cupy.partition(cupy.asarray(x), kth))
        s = np.sort(x)
        for k in np.atleast_1d(kth):
            expect(p[k] == s[k], f"partition n={n} kth={k}: got {p[k]}, want {s[k]}")
            expect((p[:k] <= p[k]).all() and (p[k + 1:] >= p[k]).all(),
                   f"partition n={n} kth={k}: not partitioned")
        expect(np.array_equal(np.sort(p), s), f"partition n={n}: not a permutation")
        print(f"checked partition {np.dtype(dtype).name} n={n} kth={kth} ({_took()})")
    y = rng.integers(0, 1000, size=(6, 50_000)).astype(np.int32)
    p = cupy.asnumpy(cupy.partition(cupy.asarray(y), 20, axis=1))
    expect(np.array_equal(p[:, 20], np.sort(y, axis=1)[:, 20]), "partition (6, 50000) axis 1")
    print(f"checked partition int32 (6, 50000) kth=20 axis 1 ({_took()})")
    x = rng.standard_normal(300_000)
    ap = cupy.asnumpy(cupy.argpartition(cupy.asarray(x), 40))
    expect(x[ap[40]] == np.sort(x)[40], "argpartition kth=40")
    print(f"checked argpartition float64 n=300000 kth=40 ({_took()})")


def check_matmul():
    """dot/matmul/tensordot through cuBLAS (needs a model whose cuBLAS kernels run: the future
    model, sm_130): float32, float64 and float16, square, odd and batched shapes, against
    NumPy in float64."""
    for m, n, k in [(128, 128, 128), (256, 256, 256), (37, 23, 29), (512, 64, 300), (1, 300, 7)]:
        for dtype, tol in [(np.float32, 1e-4), (np.float64, 1e-10), (np.float16, 1e-2)]:
            a = rng.standard_normal((m, k)).astype(dtype)
            b = rng.standard_normal((k, n)).astype(dtype)
            got = cupy.asnumpy(cupy.asarray(a) @ cupy.asarray(b)).astype(np.float64)
            want = a.astype(np.float64) @ b.astype(np.float64)
            err = float(np.max(np.abs(got - want) / (1 + np.abs(want))))
            expect(err <= tol * np.sqrt(k), f"matmul {m}x{n}x{k} {np.dtype(dtype).name}: "
                   f"relative error {err:.3g}")
    print(f"checked matmul of 5 shapes in float32, float64, float16 ({_took()})")
    x = rng.standard_normal(10_000)
    got = float(cupy.asarray(x).dot(cupy.asarray(x)))
    expect(abs(got - float(x @ x)) <= 1e-9 * float(x @ x), f"dot {got} want {float(x @ x)}")
    a = rng.standard_normal((4, 33, 17)).astype(np.float32)
    b = rng.standard_normal((4, 17, 65)).astype(np.float32)
    got = cupy.asnumpy(cupy.matmul(cupy.asarray(a), cupy.asarray(b)))
    expect(np.allclose(got, np.matmul(a, b), rtol=1e-4, atol=1e-4), "batched matmul (4, 33, 17)")
    t = rng.standard_normal((8, 9, 10))
    u = rng.standard_normal((10, 9, 3))
    got = cupy.asnumpy(cupy.tensordot(cupy.asarray(t), cupy.asarray(u), axes=([1, 2], [1, 0])))
    expect(np.allclose(got, np.tensordot(t, u, axes=([1, 2], [1, 0]))), "tensordot")
    print(f"checked dot, batched matmul and tensordot ({_took()})")


CHECKS = {
    "elementwise": check_elementwise,
    "elementwise_f64_trig": check_elementwise_f64_trig,
    "reductions": check_reductions,
    "elementwise_kernel": check_elementwise_kernel,
    "reduction_kernel": check_reduction_kernel,
    "reduction_kernel_l2": check_reduction_kernel_l2,
    "raw_module": check_raw_module,
    "scan": check_scan,
    "sort": check_sort,
    "sort_nd": check_sort_nd,
    "partition": check_partition,
    "matmul": check_matmul,
}


def main(argv):
    names = argv or list(CHECKS)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        print(f"FAIL: unknown checks {unknown}; checks: {list(CHECKS)}", file=sys.stderr)
        return 2
    failed = 0
    for name in names:
        mismatches.clear()
        try:
            CHECKS[name]()
            cupy.cuda.Device(0).synchronize()
        except Exception:
            traceback.print_exc()
            mismatches.append("raised an exception")
        if mismatches:
            for m in mismatches[:5]:
                print(f"MISMATCH {name}: {m}", file=sys.stderr)
            print(f"FAIL {name}: {len(mismatches)} result mismatches", file=sys.stderr)
            failed += 1
        else:
            print(f"PASS {name} (results checked)")
        sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
