"""CUDA graphs, VMM memory and in-flight asynchronous work across an elastic move (eviction,
scale to zero, migration), checked byte for byte (cuda-python's driver API and NVRTC).

Usage: python elastic_graphs_vmm.py MIB SEED [--wait-file PATH] [--device-malloc] [--ipc-export]
  Holds MIB MiB of device memory: one cuMemAlloc range (A) and a VMM range (V: cuMemCreate,
  cuMemAddressReserve, cuMemMap, cuMemSetAccess) of the same size, plus a 2 MiB VMM
  allocation (P) written while mapped, then unmapped (its handle kept: its contents live
  unmapped). Two graphs are instantiated: G1 captured from a stream (two kernels, one writing
  through the VMM pointer, and a device-to-device copy), G2 built explicitly (a memset node,
  then a kernel node on V). Both run once and are checked. Then, without synchronizing, the
  program queues on a stream: both graphs, a long kernel over V (over a second on the
  emulated GPU), a pinned host-to-device copy of 1 MiB (past the client's batch of quiet
  calls: what was queued so far goes to the worker now, the long kernel runs there while the
  program waits), an event, a device-to-device copy and a memset (these stay in the client's
  batch until the next synchronous call); prints "QUEUED" and (with --wait-file, up to 120 s)
  waits until PATH exists, making no CUDA call meanwhile. A move asked right after "QUEUED"
  finds a kernel running in the worker and work queued behind it on both sides.
  After: the stream is synchronized, both graphs launched again (instantiated before the
  wait) ten times, each synchronized, 50 ms apart; then once more and a kernel writes the whole of V through the VMM pointer, P is mapped again and a kernel
  writes it; the events time the whole and every byte of A, V and P is compared with a model
  computed on the host: "PASS elastic_graphs_vmm".
  --device-malloc: a kernel also uses device-side malloc before the wait (a session state
  that cannot be moved yet): its result is checked too.
  --ipc-export: a small allocation of its own is exported for CUDA IPC before the wait
  (memory another process may use at once, which no move can carry): "IPC EXPORTED".
"""
import os
import sys
import time

import numpy as np
from cuda.bindings import driver as cu
from cuda.bindings import nvrtc

MiB = 1 << 20
HEAD = 1 << 14  # words the graphs touch, per part
SPIN_WORDS = 1 << 18
SPIN_ITERS = 2048
# The pinned host-to-device copy: larger than the client's batch of quiet calls (256 KiB), so
# the work queued before it reaches the worker at once (the long kernel runs there while the
# program waits), and what is queued after it stays in the client's batch until the next
# synchronous call.
HBUF = 1 << 18
# Graph launches, each synchronized, after the wait.
AFTER_STEPS = 10

SRC = rb'''
extern "C" __global__ void axpb(unsigned *x, int n, unsigned a, unsigned b) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * a + b;
}
extern "C" __global__ void mix(unsigned *dst, const unsigned *src, int n, unsigned salt) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = dst[i] ^ (src[i] + salt + (unsigned)i);
}
extern "C" __global__ void spin(unsigned *x, int n, int iters) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        unsigned v = x[i];
        for (int k = 0; k < iters; k++) v = v * 1664525u + 1013904223u;
        x[i] = v;
    }
}
extern "C" __global__ void heap_use(unsigned *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        unsigned *p = (unsigned *)malloc(2 * sizeof(unsigned));
        if (p == 0) { out[i] = 0xDEADu; return; }
        p[0] = (unsigned)i * 3u; p[1] = 7u;
        out[i] = p[0] + p[1];
        free(p);
    }
}
'''


def fail(msg):
    print(f"FAIL elastic_graphs_vmm: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def ck(result, what):
    err, *rest = result if isinstance(result, tuple) else (result,)
    ok = (err == nvrtc.nvrtcResult.NVRTC_SUCCESS if isinstance(err, nvrtc.nvrtcResult)
          else err == cu.CUresult.CUDA_SUCCESS)
    if not ok:
        fail(f"{what}: {err!r}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


def pattern(n, seed, salt):
    i = np.arange(n, dtype=np.uint64)
    return ((i * 2654435761 + seed * 7919 + salt * 104729) & 0xFFFFFFFF).astype(np.uint32)


def compile_ptx():
    prog = ck(nvrtc.nvrtcCreateProgram(SRC, b"elastic.cu", 0, [], []), "nvrtcCreateProgram")
    opts = [b"--gpu-architecture=compute_80"]
    err, = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        size = ck(nvrtc.nvrtcGetProgramLogSize(prog), "log size")
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        fail(f"nvrtcCompileProgram: {err!r}\n{log.decode(errors='replace')}")
    size = ck(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
    ptx = b" " * size
    ck(nvrtc.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
    return ptx


class Args:
    """Kernel parameters kept alive (their host buffers) for as long as a graph may read them."""

    def __init__(self, *vals):
        self.vals = []
        for v, t in vals:
            self.vals.append(np.array([v], dtype=t))
        self.ptrs = np.array([a.ctypes.data for a in self.vals], dtype=np.uint64)

    @property
    def addr(self):
        return int(self.ptrs.ctypes.data)


def blocks(n):
    return (n + 255) // 256


def launch(fn, n, args, stream, what):
    ck(cu.cuLaunchKernel(fn, blocks(n), 1, 1, 256, 1, 1, 0, stream, args.addr, 0), what)


def u32(x):
    return np.uint32(x & 0xFFFFFFFF)


def main():
    argv = sys.argv[1:]
    wait_file = argv[argv.index("--wait-file") + 1] if "--wait-file" in argv else None
    device_malloc = "--device-malloc" in argv
    ipc_export = "--ipc-export" in argv
    mib, seed = int(argv[0]), int(argv[1])
    n = mib * MiB // 4 // 2
    if n < max(3 * HEAD + SPIN_WORDS, 4 * HEAD + HBUF, 9 * HEAD):
        fail(f"{mib} MiB is too little")

    ck(cu.cuInit(0), "cuInit")
    dev = ck(cu.cuDeviceGet(0), "cuDeviceGet")
    ctx = ck(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    module = ck(cu.cuModuleLoadData(compile_ptx()), "cuModuleLoadData")
    fn = {name: ck(cu.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction {name}")
          for name in ("axpb", "mix", "spin", "heap_use")}

    # Memory: A (cuMemAlloc), V (VMM, mapped), P (VMM, unmapped while the session moves).
    host_a = pattern(n, seed, 0)
    a = int(ck(cu.cuMemAlloc(n * 4), "cuMemAlloc A"))
    ck(cu.cuMemcpyHtoD(a, host_a, n * 4), "cuMemcpyHtoD A")
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = int(dev)
    gran = int(ck(cu.cuMemGetAllocationGranularity(
        prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        "cuMemGetAllocationGranularity"))
    vsize = (n * 4 + gran - 1) // gran * gran
    psize = max(gran, 2 * MiB)
    nv, np_ = vsize // 4, psize // 4
    hv = ck(cu.cuMemCreate(vsize, prop, 0), "cuMemCreate V")
    hp = ck(cu.cuMemCreate(psize, prop, 0), "cuMemCreate P")
    va = int(ck(cu.cuMemAddressReserve(vsize + psize, 0, 0, 0), "cuMemAddressReserve"))
    pa = va + vsize
    access = cu.CUmemAccessDesc()
    access.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    access.location.id = int(dev)
    access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    ck(cu.cuMemMap(va, vsize, 0, hv, 0), "cuMemMap V")
    ck(cu.cuMemSetAccess(va, vsize, [access], 1), "cuMemSetAccess V")
    ck(cu.cuMemMap(pa, psize, 0, hp, 0), "cuMemMap P")
    ck(cu.cuMemSetAccess(pa, psize, [access], 1), "cuMemSetAccess P")
    host_v = pattern(nv, seed, 1)
    host_p = pattern(np_, seed, 2)
    ck(cu.cuMemcpyHtoD(va, host_v, vsize), "cuMemcpyHtoD V")
    ck(cu.cuMemcpyHtoD(pa, host_p, psize), "cuMemcpyHtoD P")
    ck(cu.cuMemUnmap(pa, psize), "cuMemUnmap P")
    # Pinned host memory for an asynchronous copy.
    pinned = ck(cu.cuMemHostAlloc(HBUF * 4, cu.CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc")
    hbuf = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint32 * HBUF).from_address(int(pinned)))
    hbuf[:] = pattern(HBUF, seed, 3)
    m_a, m_v, m_p = host_a.copy(), host_v.copy(), host_p.copy()

    stream = ck(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING.value), "cuStreamCreate")

    # G1, captured: A[:HEAD] = A*3+1; V[:HEAD] ^= A[:HEAD] + 7 + i; V[HEAD:2HEAD] = A[:HEAD].
    g1_axpb = Args((a, np.uint64), (HEAD, np.int32), (3, np.uint32), (1, np.uint32))
    g1_mix = Args((va, np.uint64), (a, np.uint64), (HEAD, np.int32), (7, np.uint32))
    ck(cu.cuStreamBeginCapture(
        stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL), "cuStreamBeginCapture")
    launch(fn["axpb"], HEAD, g1_axpb, stream, "axpb in capture")
    launch(fn["mix"], HEAD, g1_mix, stream, "mix in capture")
    ck(cu.cuMemcpyDtoDAsync(va + HEAD * 4, a, HEAD * 4, stream), "cuMemcpyDtoDAsync in capture")
    g1 = ck(cu.cuStreamEndCapture(stream), "cuStreamEndCapture")
    e1 = ck(cu.cuGraphInstantiate(g1, 0), "cuGraphInstantiate G1")

    def model_g1():
        m_a[:HEAD] = m_a[:HEAD] * np.uint32(3) + np.uint32(1)
        i = np.arange(HEAD, dtype=np.uint32)
        m_v[:HEAD] ^= m_a[:HEAD] + np.uint32(7) + i
        m_v[HEAD:2 * HEAD] = m_a[:HEAD]

    # G2, built: V[2HEAD:3HEAD] = 0xA5A5A5A5, then that part = x*5+11.
    g2 = ck(cu.cuGraphCreate(0), "cuGraphCreate")
    mp = cu.CUDA_MEMSET_NODE_PARAMS()
    mp.dst, mp.value, mp.elementSize, mp.width, mp.height = va + 2 * HEAD * 4, 0xA5A5A5A5, 4, HEAD, 1
    setn = ck(cu.cuGraphAddMemsetNode(g2, None, 0, mp, ctx), "cuGraphAddMemsetNode")
    g2_axpb = Args((va + 2 * HEAD * 4, np.uint64), (HEAD, np.int32), (5, np.uint32),
                   (11, np.uint32))
    kp = cu.CUDA_KERNEL_NODE_PARAMS()
    kp.func = fn["axpb"]
    kp.gridDimX, kp.gridDimY, kp.gridDimZ = blocks(HEAD), 1, 1
    kp.blockDimX, kp.blockDimY, kp.blockDimZ = 256, 1, 1
    kp.sharedMemBytes = 0
    kp.kernelParams = g2_axpb.addr
    ck(cu.cuGraphAddKernelNode(g2, [setn], 1, kp), "cuGraphAddKernelNode")
    e2 = ck(cu.cuGraphInstantiate(g2, 0), "cuGraphInstantiate G2")

    def model_g2():
        m_v[2 * HEAD:3 * HEAD] = np.uint32(0xA5A5A5A5) * np.uint32(5) + np.uint32(11)

    def check(what):
        got_a = np.empty(n, dtype=np.uint32)
        got_v = np.empty(nv, dtype=np.uint32)
        ck(cu.cuMemcpyDtoH(got_a, a, n * 4), "cuMemcpyDtoH A")
        ck(cu.cuMemcpyDtoH(got_v, va, vsize), "cuMemcpyDtoH V")
        bad = []
        for name, got, want in (("A", got_a, m_a), ("V", got_v, m_v)):
            if not np.array_equal(got, want):
                where = np.flatnonzero(got != want)
                bad.append(f"{name}: {where.size} words differ, first at {where[0]}: "
                           f"{got[where[0]]:#x} != {want[where[0]]:#x}")
        if bad:
            fail(f"{what}: " + "; ".join(bad))

    with np.errstate(over="ignore"):
        ck(cu.cuGraphLaunch(e1, stream), "cuGraphLaunch G1")
        ck(cu.cuGraphLaunch(e2, stream), "cuGraphLaunch G2")
        ck(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
        model_g1()
        model_g2()
        check("the graphs' first launch")
        print("GRAPHS checked", flush=True)

        heap_out = None
        if device_malloc:
            heap_out = int(ck(cu.cuMemAlloc(256 * 4), "cuMemAlloc heap_out"))
            launch(fn["heap_use"], 256, Args((heap_out, np.uint64), (256, np.int32)), stream,
                   "heap_use")
            ck(cu.cuStreamSynchronize(stream), "cuStreamSynchronize heap_use")
            print("DEVICE MALLOC used", flush=True)

        if ipc_export:
            exported = int(ck(cu.cuMemAlloc(4096), "cuMemAlloc exported"))
            ck(cu.cuIpcGetMemHandle(exported), "cuIpcGetMemHandle")
            print("IPC EXPORTED", flush=True)

        events = [ck(cu.cuEventCreate(0), "cuEventCreate") for _ in range(3)]
        ck(cu.cuEventRecord(events[0], stream), "cuEventRecord 0")
        # In flight: queued without a synchronization, just before the wait.
        spin_args = Args((va + 3 * HEAD * 4, np.uint64), (SPIN_WORDS, np.int32),
                         (SPIN_ITERS, np.int32))
        ck(cu.cuGraphLaunch(e1, stream), "cuGraphLaunch G1 (queued)")
        ck(cu.cuGraphLaunch(e2, stream), "cuGraphLaunch G2 (queued)")
        launch(fn["spin"], SPIN_WORDS, spin_args, stream, "spin (queued)")
        ck(cu.cuMemcpyHtoDAsync(a + 4 * HEAD * 4, pinned, HBUF * 4, stream),
           "cuMemcpyHtoDAsync (queued)")
        ck(cu.cuEventRecord(events[1], stream), "cuEventRecord 1")
        ck(cu.cuMemcpyDtoDAsync(va + 8 * HEAD * 4, a + 4 * HEAD * 4, HEAD * 4, stream),
           "cuMemcpyDtoDAsync (queued)")
        ck(cu.cuMemsetD32Async(a + 6 * HEAD * 4, 0x5EED0000 + seed, HEAD, stream),
           "cuMemsetD32Async (queued)")
        model_g1()
        model_g2()
        s = m_v[3 * HEAD:3 * HEAD + SPIN_WORDS]
        for _ in range(SPIN_ITERS):
            s = s * np.uint32(1664525) + np.uint32(1013904223)
        m_v[3 * HEAD:3 * HEAD + SPIN_WORDS] = s
        m_a[4 * HEAD:4 * HEAD + HBUF] = hbuf
        m_v[8 * HEAD:9 * HEAD] = hbuf[:HEAD]
        m_a[6 * HEAD:7 * HEAD] = np.uint32(0x5EED0000 + seed)
        print("QUEUED", flush=True)

        if wait_file:
            deadline = time.monotonic() + 120
            while not os.path.exists(wait_file):
                if time.monotonic() > deadline:
                    fail("nobody created the wait file")
                time.sleep(0.05)

        ck(cu.cuStreamSynchronize(stream), "cuStreamSynchronize after the wait")
        # The graphs again, a few times with pauses: synchronous calls where a move between
        # nodes can stop (it waits for one once its copy is done).
        for _ in range(AFTER_STEPS):
            ck(cu.cuGraphLaunch(e1, stream), "cuGraphLaunch G1 (after, step)")
            ck(cu.cuGraphLaunch(e2, stream), "cuGraphLaunch G2 (after, step)")
            ck(cu.cuStreamSynchronize(stream), "cuStreamSynchronize (after, step)")
            model_g1()
            model_g2()
            time.sleep(0.05)
        # The graphs instantiated before, launched again; a kernel through the VMM pointer.
        ck(cu.cuGraphLaunch(e1, stream), "cuGraphLaunch G1 (after)")
        ck(cu.cuGraphLaunch(e2, stream), "cuGraphLaunch G2 (after)")
        mix_all = Args((va, np.uint64), (a, np.uint64), (min(n, nv), np.int32),
                       (0x1234 + seed, np.uint32))
        launch(fn["mix"], min(n, nv), mix_all, stream, "mix over V (after)")
        ck(cu.cuEventRecord(events[2], stream), "cuEventRecord 2")
        model_g1()
        model_g2()
        k = min(n, nv)
        m_v[:k] ^= m_a[:k] + np.uint32(0x1234 + seed) + np.arange(k, dtype=np.uint32)
        # P, unmapped across the wait: mapped again, its bytes intact, a kernel writes it.
        ck(cu.cuMemMap(pa, psize, 0, hp, 0), "cuMemMap P again")
        ck(cu.cuMemSetAccess(pa, psize, [access], 1), "cuMemSetAccess P again")
        got_p = np.empty(np_, dtype=np.uint32)
        ck(cu.cuMemcpyDtoH(got_p, pa, psize), "cuMemcpyDtoH P")
        if not np.array_equal(got_p, m_p):
            where = np.flatnonzero(got_p != m_p)
            fail(f"P (unmapped VMM memory): {where.size} words differ, first at {where[0]}")
        launch(fn["axpb"], np_, Args((pa, np.uint64), (np_, np.int32), (9, np.uint32),
                                     (seed, np.uint32)), stream, "axpb over P")
        m_p = m_p * np.uint32(9) + np.uint32(seed)
        ck(cu.cuStreamSynchronize(stream), "cuStreamSynchronize (after)")
        check("after the wait")
        ck(cu.cuMemcpyDtoH(got_p, pa, psize), "cuMemcpyDtoH P")
        if not np.array_equal(got_p, m_p):
            fail("P after the kernel differs")
        if heap_out is not None:
            got = np.empty(256, dtype=np.uint32)
            ck(cu.cuMemcpyDtoH(got, heap_out, 256 * 4), "cuMemcpyDtoH heap_out")
            want = np.arange(256, dtype=np.uint32) * np.uint32(3) + np.uint32(7)
            if not np.array_equal(got, want):
                fail(f"device malloc results differ: {got[:4]} != {want[:4]}")
    first = ck(cu.cuEventElapsedTime(events[0], events[1]), "cuEventElapsedTime 0-1")
    total = ck(cu.cuEventElapsedTime(events[0], events[2]), "cuEventElapsedTime 0-2")
    if not (0 <= first <= total and total > 0):
        fail(f"event times: {first} ms, then {total} ms")
    print(f"TIMED {first:.3f} ms queued, {total:.3f} ms in all", flush=True)
    ck(cu.cuMemUnmap(pa, psize), "cuMemUnmap P")
    ck(cu.cuMemUnmap(va, vsize), "cuMemUnmap V")
    ck(cu.cuMemAddressFree(va, vsize + psize), "cuMemAddressFree")
    ck(cu.cuMemRelease(hv), "cuMemRelease V")
    ck(cu.cuMemRelease(hp), "cuMemRelease P")
    print("PASS elastic_graphs_vmm", flush=True)


main()
