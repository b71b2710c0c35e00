"""A CUDA client started with nothing but a CDI spec's environment (no `gpufuse run`):
cuda-python's driver API through the libcuda.so.1 that LD_LIBRARY_PATH finds. It reports the
memory it sees, allocates within its slice, then one allocation past it (which must fail),
launches nothing. Between the two it prints `ready` and waits for a line on stdin, so the test
can read the node's status while the session is open.
"""
import sys

from cuda.bindings import driver as cu

MiB = 1 << 20


def ck(result, what):
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        print(f"FAIL {what}: {err!r}", file=sys.stderr)
        sys.exit(1)
    return rest[0] if len(rest) == 1 else tuple(rest)


def main():
    ck(cu.cuInit(0), "cuInit")
    dev = ck(cu.cuDeviceGet(0), "cuDeviceGet")
    ctx = ck(cu.cuCtxCreate(None, 0, dev), "cuCtxCreate")
    free, total = ck(cu.cuMemGetInfo(), "cuMemGetInfo")
    print(f"total={total}", flush=True)
    within = ck(cu.cuMemAlloc(total // 2), "cuMemAlloc within the slice")
    print("ready", flush=True)
    sys.stdin.readline()
    err, _ = cu.cuMemAlloc(total)
    print(f"over={err.name}", flush=True)
    ck(cu.cuMemFree(within), "cuMemFree")
    ck(cu.cuCtxDestroy(ctx), "cuCtxDestroy")


main()
