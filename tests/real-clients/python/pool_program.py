"""A small CuPy program for the pool tests (test_pool.py), checked against NumPy.

Usage: python pool_program.py SEED [--hold]
  Computes y = 3 * x + SEED on 4096 int32 elements with an ElementwiseKernel and checks every
  element. With --hold it then prints "READY" and waits for a line on stdin (its session stays
  open meanwhile), then computes z = y * y - x and checks it. Prints "PASS pool_program SEED SUM"
  with the sum of the last result.
"""
import sys

import numpy as np
import cupy as cp

seed = int(sys.argv[1])
hold = "--hold" in sys.argv[2:]
N = 4096

axpb = cp.ElementwiseKernel("int32 x, int32 a, int32 b", "int32 y", "y = a * x + b", "pool_axpb")

x = np.arange(N, dtype=np.int32)
y = axpb(cp.asarray(x), np.int32(3), np.int32(seed))
want = 3 * x + seed
got = y.get()
assert np.array_equal(got, want), f"y wrong at {np.flatnonzero(got != want)[:8]}"
result = got
if hold:
    print("READY", flush=True)
    sys.stdin.readline()
    # y * y - x, as a * x + b with a = y element-wise.
    z = axpb(y, y, cp.asarray(-x))
    want = got * got - x
    result = z.get()
    assert np.array_equal(result, want), f"z wrong at {np.flatnonzero(result != want)[:8]}"
print(f"PASS pool_program {seed} {int(result.astype(np.int64).sum())}", flush=True)
