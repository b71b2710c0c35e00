"""cuMemHostRegister of a NumPy array through cuda-python's driver bindings: copies both ways,
synchronous and asynchronous, byte for byte. On the shared-memory transport the array's whole
pages become the session's host arena in place (crates/client/src/registered.rs): the test sees
the arena's memfd mapped at the array's own addresses in /proc/self/maps while it is
registered, not after; a forked child gets private pages (its writes never reach the parent);
overlapping registrations are refused.

Usage: python registered_memory.py shm|socket   (the transport the session is on)
"""
import os
import sys

import numpy as np
from cuda.bindings import driver as cu

PAGE = 4096
SIZE = (16 << 20) + 123
expect_arena = sys.argv[1] == "shm"


def fail(msg):
    print(f"FAIL {msg}", file=sys.stderr, flush=True)
    os._exit(1)


def expect(cond, msg):
    if not cond:
        fail(msg)


def ck(result, what):
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        fail(f"{what}: {err!r}")
    return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)


def mapping_at(addr):
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                return line.strip()
    fail(f"nothing mapped at {addr:#x}")


def pattern(seed):
    return ((np.arange(SIZE, dtype=np.uint64) * 7 + seed) % 251).astype(np.uint8)


def main():
    ck(cu.cuInit(0), "cuInit")
    dev = ck(cu.cuDeviceGet(0), "cuDeviceGet")
    ctx = ck(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    buf = pattern(1)
    ptr = buf.ctypes.data
    interior = (ptr + PAGE - 1) // PAGE * PAGE
    ck(cu.cuMemHostRegister(ptr, SIZE, 0), "cuMemHostRegister")
    in_arena = "gpufuse-pinned" in mapping_at(interior)
    expect(in_arena == expect_arena,
           f"registered pages in the arena: {in_arena}, expected {expect_arena}: "
           f"{mapping_at(interior)}")
    expect(np.array_equal(buf, pattern(1)), "registering changed the bytes")
    flags = ck(cu.cuMemHostGetFlags(ptr), "cuMemHostGetFlags")
    print(f"registered at {ptr:#x}, flags {flags}, in the arena: {in_arena}")

    err, = cu.cuMemHostRegister(ptr + 2 * PAGE, PAGE, 0)
    expect(err == cu.CUresult.CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
           f"an overlapping registration: {err!r}")

    d = ck(cu.cuMemAlloc(SIZE), "cuMemAlloc")
    ck(cu.cuMemcpyHtoD(d, ptr, SIZE), "cuMemcpyHtoD")
    buf[:] = 0
    ck(cu.cuMemcpyDtoH(ptr, d, SIZE), "cuMemcpyDtoH")
    expect(np.array_equal(buf, pattern(1)), "the synchronous round trip changed the bytes")
    # Part of the array from an unaligned offset: a partial page and whole ones.
    part = np.zeros(3 * PAGE, dtype=np.uint8)
    ck(cu.cuMemcpyDtoH(part.ctypes.data, int(d) + 100, part.size), "cuMemcpyDtoH (part)")
    expect(np.array_equal(part, pattern(1)[100:100 + part.size]), "a part of it")
    print("PASS registered_copies")

    stream = ck(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
    buf[:] = pattern(2)
    ck(cu.cuMemcpyHtoDAsync(d, ptr, SIZE, stream), "cuMemcpyHtoDAsync")
    ck(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
    buf[:] = 0
    ck(cu.cuMemcpyDtoHAsync(ptr, d, SIZE, stream), "cuMemcpyDtoHAsync")
    ck(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
    expect(np.array_equal(buf, pattern(2)), "the asynchronous round trip changed the bytes")
    print("PASS registered_async_copies")

    child = os.fork()
    if child == 0:
        # The child's pages are its own: private, and its writes stay here.
        if "gpufuse-pinned" in mapping_at(interior):
            fail(f"the child shares its parent's registered pages: {mapping_at(interior)}")
        buf[:] = 0xAB
        os._exit(0)
    _, status = os.waitpid(child, 0)
    expect(os.waitstatus_to_exitcode(status) == 0, "the forked child failed")
    expect(np.array_equal(buf, pattern(2)), "the child's writes reached the parent")
    expect(("gpufuse-pinned" in mapping_at(interior)) == expect_arena,
           "the parent's registration changed at the fork")
    ck(cu.cuMemcpyHtoD(d, ptr, SIZE), "cuMemcpyHtoD after the fork")
    back = np.zeros(SIZE, dtype=np.uint8)
    ck(cu.cuMemcpyDtoH(back.ctypes.data, d, SIZE), "cuMemcpyDtoH after the fork")
    expect(np.array_equal(back, pattern(2)), "a copy after the fork")
    print("PASS fork")

    ck(cu.cuMemHostUnregister(ptr), "cuMemHostUnregister")
    expect("gpufuse-pinned" not in mapping_at(interior), "still in the arena after unregister")
    expect(np.array_equal(buf, pattern(2)), "unregistering changed the bytes")
    buf[:] = pattern(3)
    ck(cu.cuMemcpyHtoD(d, ptr, SIZE), "cuMemcpyHtoD (pageable)")
    ck(cu.cuMemcpyDtoH(back.ctypes.data, d, SIZE), "cuMemcpyDtoH (pageable)")
    expect(np.array_equal(back, pattern(3)), "pageable copies after unregister")
    err, = cu.cuMemHostUnregister(ptr)
    expect(err == cu.CUresult.CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, f"unregistered twice: {err!r}")
    ck(cu.cuMemFree(d), "cuMemFree")
    print("PASS unregister")


if __name__ == "__main__":
    main()
