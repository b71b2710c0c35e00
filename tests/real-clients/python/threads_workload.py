"""Several host threads of one CuPy program, each on its own non-blocking stream, launching and
copying without pause until told to stop, every result checked: the session moves (or swaps)
under them. Run with CUPY_COMPILE_WITH_PTX=1 against an emulated GPU.

Usage: python threads_workload.py THREADS --stop-file PATH
  Each thread owns an array of its own; each round it adds the round number to it with a raw
  kernel on its stream, copies a slice back asynchronously into pinned memory, synchronizes
  its stream and checks the slice against the sum it expects. "RUNNING" is printed once every
  thread finished a round; the threads stop when PATH exists (at most 300 s), then every
  element of every array is checked: "PASS threads_workload ROUNDS".
"""
import os
import sys
import threading
import time

import numpy as np
import cupy as cp

threads = int(sys.argv[1])
stop_file = sys.argv[sys.argv.index("--stop-file") + 1]
N = 1 << 15
SLICE = 256

SRC = r'''
extern "C" __global__ void add(unsigned int *a, unsigned int k, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { a[i] += k + (unsigned int)i; }
}
'''

add = cp.RawModule(code=SRC).get_function("add")
started = threading.Barrier(threads + 1)
errors: list[str] = []
rounds = [0] * threads
finals: list = [None] * threads


def work(t: int) -> None:
    try:
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            a = cp.zeros(N, dtype=cp.uint32)
        pinned = cp.cuda.alloc_pinned_memory(SLICE * 4)
        back = np.frombuffer(pinned, dtype=np.uint32, count=SLICE)
        want = np.zeros(N, dtype=np.uint64)
        idx = np.arange(N, dtype=np.uint64)
        k = 0
        deadline = time.monotonic() + 300
        while True:
            k += 1
            add((N // 256,), (256,), (a, np.uint32(k * (t + 1)), np.int32(N)), stream=stream)
            want += k * (t + 1) + idx
            a[:SLICE].get(stream=stream, out=back)
            stream.synchronize()
            expect = (want[:SLICE] & 0xFFFFFFFF).astype(np.uint32)
            if not np.array_equal(back, expect):
                errors.append(f"thread {t} round {k}: slice differs")
                return
            rounds[t] = k
            if k == 1:
                started.wait()
            if os.path.exists(stop_file) or time.monotonic() > deadline:
                break
        finals[t] = (a.get(), (want & 0xFFFFFFFF).astype(np.uint32))
    except Exception as e:  # reported below, with every other thread's outcome
        errors.append(f"thread {t}: {e!r}")
        try:
            started.abort()
        except threading.BrokenBarrierError:
            pass


def main() -> None:
    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    try:
        started.wait()
        print("RUNNING", flush=True)
    except threading.BrokenBarrierError:
        pass
    for w in workers:
        w.join()
    if errors:
        sys.exit("FAIL threads_workload: " + "; ".join(errors))
    for t, (got, want) in enumerate(finals):
        if not np.array_equal(got, want):
            sys.exit(f"FAIL threads_workload: thread {t}'s array differs at the end")
    print(f"PASS threads_workload {sum(rounds)}", flush=True)


main()
