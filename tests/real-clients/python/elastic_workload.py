"""A CuPy workload for elastic sessions (oversubscription, scale to zero, migration), checked
byte for byte. Run with CUPY_COMPILE_WITH_PTX=1 against an emulated GPU.

Usage: python elastic_workload.py MIB STEPS PAUSE_S SEED [--wait-file PATH]
  Fills MIB MiB of device memory with a pattern: one array from CuPy's default pool, one from
  a stream-ordered pool (cudaMallocAsync), one of managed memory, and a module variable (a
  RawModule's __device__ counter). Then STEPS times: a kernel adds one to the head of each
  array and bumps the counter, an event pair times the step, "STEP i" is printed, and the
  program sleeps PAUSE_S (an idle session: it may be evicted, scaled to zero or moved meanwhile).
  With --wait-file, it waits (up to 120 s) after step 1 until PATH exists.
  At the end every byte of every array and the counter are checked: "PASS elastic_workload".
"""
import os
import sys
import time

import numpy as np
import cupy as cp

mib, steps, pause, seed = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
wait_file = sys.argv[sys.argv.index("--wait-file") + 1] if "--wait-file" in sys.argv else None
HEAD = 1 << 14  # elements each step touches

SRC = r'''
__device__ unsigned int counter;
extern "C" __global__ void bump(unsigned int *a, unsigned int *b, unsigned int *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { a[i] += 1; b[i] += 1; c[i] += 1; }
    if (i == 0) { atomicAdd(&counter, 1u); }
}
'''


def pattern(n, salt):
    i = np.arange(n, dtype=np.uint64)
    return ((i * 2654435761 + seed * 7919 + salt) & 0xFFFFFFFF).astype(np.uint32)


def main():
    n = (mib << 20) // 4 // 3
    host = [pattern(n, k) for k in range(3)]
    a = cp.asarray(host[0])
    async_pool = cp.cuda.MemoryAsyncPool()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        mem = async_pool.malloc(n * 4)
        b = cp.ndarray((n,), dtype=cp.uint32, memptr=mem)
        b.set(host[1], stream=stream)
    stream.synchronize()
    managed = cp.cuda.malloc_managed(n * 4)
    c = cp.ndarray((n,), dtype=cp.uint32, memptr=managed)
    c.set(host[2])
    module = cp.RawModule(code=SRC)
    bump = module.get_function("bump")
    counter = cp.ndarray((1,), dtype=cp.uint32, memptr=module.get_global("counter"))
    counter[...] = 0
    cp.cuda.Device().synchronize()
    print(f"FILLED {3 * n * 4} bytes", flush=True)
    first = cp.cuda.Event()
    first.record()
    for step in range(steps):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        bump(((HEAD + 255) // 256,), (256,), (a, b, c, np.int32(HEAD)))
        end.record()
        end.synchronize()
        ms = cp.cuda.get_elapsed_time(start, end)
        assert ms >= 0, ms
        print(f"STEP {step} {ms:.3f} ms", flush=True)
        if step == 1 and wait_file:
            deadline = time.monotonic() + 120
            while not os.path.exists(wait_file):
                assert time.monotonic() < deadline, "nobody created the wait file"
                time.sleep(0.05)
        time.sleep(pause)
    last = cp.cuda.Event()
    last.record()
    last.synchronize()
    assert cp.cuda.get_elapsed_time(first, last) > 0
    bad = []
    for k, (arr, want) in enumerate(zip((a, b, c), host)):
        want = want.copy()
        want[:HEAD] += steps
        got = cp.asnumpy(arr)
        if not np.array_equal(got, want):
            where = np.flatnonzero(got != want)
            bad.append(f"array {k}: {where.size} words differ, first at {where[0]}: "
                       f"{got[where[0]]:#x} != {want[where[0]]:#x}")
    if int(counter.get()[0]) != steps:
        bad.append(f"counter {int(counter.get()[0])} != {steps}")
    if bad:
        print("FAIL elastic_workload: " + "; ".join(bad), file=sys.stderr)
        sys.exit(1)
    print("PASS elastic_workload", flush=True)


main()
