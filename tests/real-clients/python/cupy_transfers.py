"""CuPy (cupy-cuda12x, static libcudart 12.9) through whatever libcuda.so.1 the loader finds:
array transfers, cupy.cuda.runtime calls, memory info, streams and events. No kernels.

Usage: python cupy_transfers.py [CHECK...]   (default: all). Prints "PASS <check>" per check and
exits 1 with "FAIL ..." on the first mismatch.
"""
import sys

import numpy as np
import cupy
from cupy.cuda import runtime

MiB = 1 << 20


def fail(msg):
    print(f"FAIL {msg}", file=sys.stderr)
    sys.exit(1)


def expect(cond, msg):
    if not cond:
        fail(msg)


def check_device():
    count = runtime.getDeviceCount()
    expect(count >= 1, f"getDeviceCount {count}")
    props = runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    print(f"name={name}")
    cc = props["major"] * 10 + props["minor"]
    expect(cc >= 80, f"compute capability {props['major']}.{props['minor']}")
    expect(props["warpSize"] == 32, f"warpSize {props['warpSize']}")
    dev = cupy.cuda.Device(0)
    expect(dev.compute_capability == f"{props['major']}{props['minor']}",
           f"Device.compute_capability {dev.compute_capability}")
    free, total = dev.mem_info
    expect(total == props["totalGlobalMem"], f"mem_info total {total} != {props['totalGlobalMem']}")
    expect(0 < free <= total, f"mem_info free {free} total {total}")
    expect(runtime.driverGetVersion() >= runtime.runtimeGetVersion(),
           f"driver {runtime.driverGetVersion()} < runtime {runtime.runtimeGetVersion()}")
    expect(runtime.getDevice() == 0, f"getDevice {runtime.getDevice()}")


def check_transfers():
    rng = np.random.default_rng(1234)
    dtypes = [np.uint8, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64,
              np.complex64, np.complex128, np.bool_]
    counts = [1, 7, 1000, 65537, 1 << 20, (16 * MiB) // 8 + 3]
    for dt in dtypes:
        for n in counts:
            if np.dtype(dt).kind == "b":
                host = rng.integers(0, 2, n).astype(dt)
            elif np.dtype(dt).kind == "c":
                host = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dt)
            elif np.dtype(dt).kind == "f":
                host = rng.standard_normal(n).astype(dt)
            else:
                info = np.iinfo(dt)
                host = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
            dev = cupy.asarray(host)
            expect(dev.shape == host.shape and dev.dtype == host.dtype,
                   f"asarray shape/dtype {dev.shape} {dev.dtype}")
            back = dev.get()
            expect(np.array_equal(back.view(np.uint8), host.view(np.uint8)),
                   f"asarray/get round trip differs for {np.dtype(dt).name} x {n}")
            back2 = cupy.asnumpy(dev)
            expect(np.array_equal(back2.view(np.uint8), host.view(np.uint8)),
                   f"asnumpy round trip differs for {np.dtype(dt).name} x {n}")
    # 2-D and 3-D (contiguous) arrays, and set() into an existing array.
    host = rng.standard_normal((123, 45, 6)).astype(np.float32)
    dev = cupy.asarray(host)
    expect(np.array_equal(dev.get(), host), "3-D round trip")
    dev2 = cupy.empty_like(dev)
    dev2.set(host[::-1].copy())
    expect(np.array_equal(dev2.get(), host[::-1]), "set() round trip")
    # Device to device through MemoryPointer copies.
    dev3 = cupy.empty_like(dev)
    dev3.data.copy_from_device(dev.data, dev.nbytes)
    expect(np.array_equal(dev3.get(), host), "device-to-device copy_from_device")
    # (Non-contiguous arrays are left out: CuPy copies them with an elementwise kernel.)


def check_runtime_calls():
    n = 4 * MiB + 5
    host = np.frombuffer(np.random.default_rng(5).bytes(n), dtype=np.uint8).copy()
    out = np.zeros(n, dtype=np.uint8)
    d1 = runtime.malloc(n)
    d2 = runtime.malloc(n)
    try:
        runtime.memcpy(d1, host.ctypes.data, n, runtime.memcpyHostToDevice)
        runtime.memcpy(d2, d1, n, runtime.memcpyDeviceToDevice)
        runtime.memcpy(out.ctypes.data, d2, n, runtime.memcpyDeviceToHost)
        expect(np.array_equal(host, out), "runtime.memcpy H2D/D2D/D2H")
        runtime.memset(d1, 0x7E, n)
        runtime.memcpy(out.ctypes.data, d1, n, runtime.memcpyDeviceToHost)
        expect(bool((out == 0x7E).all()), "runtime.memset")
        attrs = runtime.pointerGetAttributes(d1)
        expect(attrs.type == runtime.memoryTypeDevice, f"pointer type {attrs.type}")
        expect(attrs.devicePointer == d1, "pointer devicePointer")
        runtime.deviceSynchronize()
    finally:
        runtime.free(d1)
        runtime.free(d2)
    # An impossible allocation raises cudaErrorMemoryAllocation and CuPy carries on.
    try:
        runtime.malloc(1 << 50)
        fail("runtime.malloc(1 PiB) succeeded")
    except runtime.CUDARuntimeError as e:
        expect(e.status == 2,  # cudaErrorMemoryAllocation
                f"malloc(1 PiB) status {e.status}")
    try:
        cupy.empty(1 << 50, dtype=np.uint8)
        fail("cupy.empty(1 PiB) succeeded")
    except cupy.cuda.memory.OutOfMemoryError:
        pass
    expect(np.array_equal(cupy.asarray(host).get(), host), "round trip after an OOM")


def check_memory_info():
    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    free0, total = runtime.memGetInfo()
    a = cupy.empty(256 * MiB, dtype=np.uint8)
    free1, total1 = runtime.memGetInfo()
    expect(total1 == total, "total changed")
    expect(free0 - free1 >= 256 * MiB, f"free {free0} -> {free1} after a 256 MiB array")
    expect(pool.used_bytes() >= 256 * MiB, f"pool used_bytes {pool.used_bytes()}")
    del a
    pool.free_all_blocks()
    free2, _ = runtime.memGetInfo()
    expect(free2 >= free0 - 8 * MiB, f"free {free0} -> {free2} after free_all_blocks")


def check_streams_events():
    rng = np.random.default_rng(77)
    host = rng.standard_normal(2 * MiB).astype(np.float32)
    pinned_in = cupy.cuda.alloc_pinned_memory(host.nbytes)
    src = np.frombuffer(pinned_in, dtype=np.float32, count=host.size)
    src[...] = host
    pinned_out = cupy.cuda.alloc_pinned_memory(host.nbytes)
    dst = np.frombuffer(pinned_out, dtype=np.float32, count=host.size)
    dst[...] = 0

    s = cupy.cuda.Stream(non_blocking=True)
    start = cupy.cuda.Event()
    stop = cupy.cuda.Event()
    with s:
        start.record()
        dev = cupy.empty(host.shape, dtype=np.float32)
        dev.set(src, stream=s)
        dev2 = cupy.empty_like(dev)
        dev2.data.copy_from_device_async(dev.data, dev.nbytes, stream=s)
        dev2.get(stream=s, out=dst)
        stop.record()
    stop.synchronize()
    expect(stop.done, "event not done after synchronize")
    s.synchronize()
    expect(s.done, "stream not done after synchronize")
    expect(np.array_equal(dst, host), "async round trip on a stream")
    ms = cupy.cuda.get_elapsed_time(start, stop)
    expect(0.0 <= ms < 60000.0, f"elapsed {ms} ms")
    print(f"elapsed_ms={ms}")

    # Cross-stream ordering with an event.
    s2 = cupy.cuda.Stream(non_blocking=True)
    ev = cupy.cuda.Event(disable_timing=True)
    host2 = rng.standard_normal(MiB).astype(np.float32)
    with s:
        d = cupy.asarray(host2)
        ev.record(s)
    s2.wait_event(ev)
    with s2:
        e = cupy.empty_like(d)
        e.data.copy_from_device_async(d.data, d.nbytes, stream=s2)
        got = e.get(stream=s2)
    s2.synchronize()
    expect(np.array_equal(got, host2), "copy ordered after wait_event")
    cupy.cuda.Device(0).synchronize()


CHECKS = {
    "device": check_device,
    "transfers": check_transfers,
    "runtime_calls": check_runtime_calls,
    "memory_info": check_memory_info,
    "streams_events": check_streams_events,
}


def main(argv):
    names = argv[1:] or list(CHECKS)
    for name in names:
        if name not in CHECKS:
            fail(f"unknown check {name}")
        CHECKS[name]()
        print(f"PASS {name}", flush=True)


if __name__ == "__main__":
    main(sys.argv)
