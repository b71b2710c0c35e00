"""cuda-python (cuda.bindings.driver + nvrtc) through whatever libcuda.so.1 the loader finds:
cuInit, device queries, primary and created contexts, cuMemAlloc, cuMemcpyHtoD/DtoH (sync and
async), streams, events, stream-ordered allocations and the pool's accounting, virtual memory management, a PTX module from NVRTC launched with cuLaunchKernel, and SASS for
another architecture: cuModuleLoadData refuses it (CUDA_ERROR_NO_BINARY_FOR_GPU) while
cuLibraryLoadData loads it lazily and only cuLibraryGetKernel fails, as cuBLAS relies on.

Usage: python cuda_bindings_driver.py [--launch-only]
--launch-only: the kernel launch must succeed and synchronize; its result is not checked.
"""
import sys

import numpy as np
from cuda.bindings import driver as cu
from cuda.bindings import nvrtc

MiB = 1 << 20
verify = "--launch-only" not in sys.argv[1:]


def fail(msg):
    print(f"FAIL {msg}", file=sys.stderr)
    sys.exit(1)


def expect(cond, msg):
    if not cond:
        fail(msg)


def ck(result, what=""):
    """Unpacks a cuda-bindings (err, values...) tuple, failing on an error."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    if isinstance(err, nvrtc.nvrtcResult):
        ok = err == nvrtc.nvrtcResult.NVRTC_SUCCESS
    else:
        ok = err == cu.CUresult.CUDA_SUCCESS
    if not ok:
        fail(f"{what}: {err!r}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


def main():
    ck(cu.cuInit(0), "cuInit")
    version = ck(cu.cuDriverGetVersion(), "cuDriverGetVersion")
    print(f"driver={version}")
    expect(version >= 12000, f"driver version {version}")
    count = ck(cu.cuDeviceGetCount(), "cuDeviceGetCount")
    expect(count >= 1, f"device count {count}")
    dev = ck(cu.cuDeviceGet(0), "cuDeviceGet")
    name = ck(cu.cuDeviceGetName(256, dev), "cuDeviceGetName").split(b"\0")[0].decode()
    print(f"name={name}")
    total = ck(cu.cuDeviceTotalMem(dev), "cuDeviceTotalMem")
    A = cu.CUdevice_attribute
    major = ck(cu.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "cc")
    minor = ck(cu.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "cc")
    warp = ck(cu.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_WARP_SIZE, dev), "warp size")
    sms = ck(cu.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev), "SMs")
    ua = ck(cu.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, dev), "UVA")
    expect(major * 10 + minor >= 80, f"cc {major}.{minor}")
    expect(warp == 32, f"warp size {warp}")
    expect(sms >= 1, f"SM count {sms}")
    expect(ua == 1, f"unified addressing {ua}")
    uuid = ck(cu.cuDeviceGetUuid(dev), "cuDeviceGetUuid")
    expect(len(bytes(uuid.bytes)) == 16, "uuid length")
    # CUDA's 13-byte PCI bus id, and every form cuDeviceGetByPCIBusId takes back.
    bus_id = ck(cu.cuDeviceGetPCIBusId(13, dev), "cuDeviceGetPCIBusId").split(b"\0")[0].decode()
    print(f"pci_bus_id={bus_id}")
    expect(len(bus_id) == 12 and bus_id.count(":") == 2 and bus_id.endswith(".0"),
           f"bus id {bus_id!r} is not of the form 0000:40:00.0")
    for form in (bus_id, "0000" + bus_id, bus_id[5:], bus_id.upper()):
        found = ck(cu.cuDeviceGetByPCIBusId(form.encode()), f"cuDeviceGetByPCIBusId({form})")
        expect(int(found) == int(dev), f"{form} names device {int(found)}")
    # NVIDIA's texts, not names turned into sentences.
    for code, want in ((cu.CUresult.CUDA_ERROR_NOT_FOUND, "named symbol not found"),
                       (cu.CUresult.CUDA_ERROR_INVALID_VALUE, "invalid argument"),
                       (cu.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS,
                        "an illegal memory access was encountered")):
        text = ck(cu.cuGetErrorString(code), "cuGetErrorString").decode()
        expect(text == want, f"cuGetErrorString({code!r}) = {text!r}, want {want!r}")
    # Profiler control succeeds and does nothing (programs bracket regions with it).
    ck(cu.cuProfilerStart(), "cuProfilerStart")
    ck(cu.cuProfilerStop(), "cuProfilerStop")
    print("PASS device_queries", flush=True)

    # Primary context.
    ctx = ck(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    cur = ck(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
    expect(int(cur) == int(ctx), "current context is not the primary context")
    expect(int(ck(cu.cuCtxGetDevice(), "cuCtxGetDevice")) == int(dev), "cuCtxGetDevice")
    free, total2 = ck(cu.cuMemGetInfo(), "cuMemGetInfo")
    expect(total2 == total, f"cuMemGetInfo total {total2} != cuDeviceTotalMem {total}")
    expect(0 < free <= total, f"free {free} total {total}")

    # Memory and synchronous copies.
    rng = np.random.default_rng(3)
    for n in (1, 4097, 3 * MiB + 1, 64 * MiB):
        host = np.frombuffer(rng.bytes(n), dtype=np.uint8).copy()
        out = np.zeros(n, dtype=np.uint8)
        d = ck(cu.cuMemAlloc(n), "cuMemAlloc")
        ck(cu.cuMemcpyHtoD(d, host, n), "cuMemcpyHtoD")
        ck(cu.cuMemcpyDtoH(out, d, n), "cuMemcpyDtoH")
        expect(np.array_equal(host, out), f"HtoD/DtoH round trip of {n} bytes")
        d2 = ck(cu.cuMemAlloc(n), "cuMemAlloc")
        ck(cu.cuMemcpyDtoD(d2, d, n), "cuMemcpyDtoD")
        out[:] = 0
        ck(cu.cuMemcpyDtoH(out, d2, n), "cuMemcpyDtoH")
        expect(np.array_equal(host, out), f"DtoD round trip of {n} bytes")
        ck(cu.cuMemsetD8(d2, 0x42, n), "cuMemsetD8")
        ck(cu.cuMemcpyDtoH(out, d2, n), "cuMemcpyDtoH")
        expect(bool((out == 0x42).all()), f"cuMemsetD8 of {n} bytes")
        ck(cu.cuMemFree(d), "cuMemFree")
        ck(cu.cuMemFree(d2), "cuMemFree")
    err, _ = cu.cuMemAlloc(1 << 50)
    expect(err == cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY, f"cuMemAlloc(1 PiB) returned {err!r}")
    print("PASS memory", flush=True)

    # Streams, events and async copies with page-locked memory.
    n = 8 * MiB
    hbuf = ck(cu.cuMemHostAlloc(n, cu.CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc")
    hin = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * n).from_address(int(hbuf)))
    hin[:] = np.frombuffer(rng.bytes(n), dtype=np.uint8)
    hout = np.zeros(n, dtype=np.uint8)
    stream = ck(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
    start = ck(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DEFAULT), "cuEventCreate")
    stop = ck(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DEFAULT), "cuEventCreate")
    d = ck(cu.cuMemAlloc(n), "cuMemAlloc")
    ck(cu.cuEventRecord(start, stream), "cuEventRecord")
    ck(cu.cuMemcpyHtoDAsync(d, hbuf, n, stream), "cuMemcpyHtoDAsync")
    ck(cu.cuMemcpyDtoHAsync(hout, d, n, stream), "cuMemcpyDtoHAsync")
    ck(cu.cuEventRecord(stop, stream), "cuEventRecord")
    ck(cu.cuEventSynchronize(stop), "cuEventSynchronize")
    ck(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
    ck(cu.cuStreamQuery(stream), "cuStreamQuery")
    ck(cu.cuEventQuery(stop), "cuEventQuery")
    expect(np.array_equal(hin, hout), "async round trip")
    ms = ck(cu.cuEventElapsedTime(start, stop), "cuEventElapsedTime")
    expect(0.0 <= ms < 60000.0, f"elapsed {ms} ms")
    print("PASS streams_events", flush=True)

    # NVRTC -> PTX -> cuModuleLoadData -> cuLaunchKernel.
    src = rb'''
extern "C" __global__ void affine(const float* x, float* y, float a, float b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + b;
}
'''
    prog = ck(nvrtc.nvrtcCreateProgram(src, b"affine.cu", 0, [], []), "nvrtcCreateProgram")
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
    expect(b".target sm_80" in ptx, "PTX target")
    module = ck(cu.cuModuleLoadData(ptx), "cuModuleLoadData")
    fn = ck(cu.cuModuleGetFunction(module, b"affine"), "cuModuleGetFunction")

    count = 100_001
    x = (np.arange(count, dtype=np.float32) % 300) - 50
    dx = ck(cu.cuMemAlloc(x.nbytes), "cuMemAlloc")
    dy = ck(cu.cuMemAlloc(x.nbytes), "cuMemAlloc")
    ck(cu.cuMemcpyHtoD(dx, x, x.nbytes), "cuMemcpyHtoD")
    ck(cu.cuMemsetD8(dy, 0xFF, x.nbytes), "cuMemsetD8")
    args = [np.array([int(dx)], dtype=np.uint64), np.array([int(dy)], dtype=np.uint64),
            np.array([1.5], dtype=np.float32), np.array([-2.0], dtype=np.float32),
            np.array([count], dtype=np.int32)]
    arg_ptrs = np.array([a.ctypes.data for a in args], dtype=np.uint64)
    ck(cu.cuLaunchKernel(fn, (count + 255) // 256, 1, 1, 256, 1, 1, 0, stream,
                         arg_ptrs.ctypes.data, 0), "cuLaunchKernel")
    ck(cu.cuStreamSynchronize(stream), "cuStreamSynchronize after launch")
    ck(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    print("launched affine")
    y = np.zeros_like(x)
    ck(cu.cuMemcpyDtoH(y, dy, y.nbytes), "cuMemcpyDtoH")
    if verify and not np.array_equal(y, 1.5 * x - 2.0):
        bad = int(np.argmax(y != 1.5 * x - 2.0))
        print(f"MISMATCH y[{bad}] = {y[bad]}, want {1.5 * x[bad] - 2.0}", file=sys.stderr)
        fail("cuda_bindings_driver: kernel results differ")
    print("PASS nvrtc_module_launch", flush=True)

    # The same kernel as a graph kernel node (cuGraphAddKernelNode), with a memset node in
    # front of it; the kernel's parameters are read when the node is added.
    graph = ck(cu.cuGraphCreate(0), "cuGraphCreate")
    mp = cu.CUDA_MEMSET_NODE_PARAMS()
    mp.dst, mp.value, mp.elementSize, mp.width, mp.height = dy, 0, 4, count, 1
    setn = ck(cu.cuGraphAddMemsetNode(graph, None, 0, mp, ctx), "cuGraphAddMemsetNode")
    kp = cu.CUDA_KERNEL_NODE_PARAMS()
    kp.func = fn
    kp.gridDimX, kp.gridDimY, kp.gridDimZ = (count + 255) // 256, 1, 1
    kp.blockDimX, kp.blockDimY, kp.blockDimZ = 256, 1, 1
    kp.sharedMemBytes = 0
    kp.kernelParams = int(arg_ptrs.ctypes.data)
    ck(cu.cuGraphAddKernelNode(graph, [setn], 1, kp), "cuGraphAddKernelNode")
    exe = ck(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
    ck(cu.cuMemsetD8(dy, 0xFF, x.nbytes), "cuMemsetD8")
    ck(cu.cuGraphLaunch(exe, stream), "cuGraphLaunch")
    ck(cu.cuStreamSynchronize(stream), "cuStreamSynchronize after the graph")
    y = np.zeros_like(x)
    ck(cu.cuMemcpyDtoH(y, dy, y.nbytes), "cuMemcpyDtoH")
    if verify and not np.array_equal(y, 1.5 * x - 2.0):
        fail("cuda_bindings_driver: the kernel node's results differ")
    ck(cu.cuGraphExecDestroy(exe), "cuGraphExecDestroy")
    ck(cu.cuGraphDestroy(graph), "cuGraphDestroy")
    print("PASS graph_kernel_node", flush=True)

    # Stream-ordered allocations and the default pool's accounting.
    pool = ck(cu.cuDeviceGetDefaultMemPool(dev), "cuDeviceGetDefaultMemPool")
    P = cu.CUmemPool_attribute

    def pool_attr(a):
        return int(ck(cu.cuMemPoolGetAttribute(pool, a), f"cuMemPoolGetAttribute {a!r}"))

    base = pool_attr(P.CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
    a1 = ck(cu.cuMemAllocAsync(2 * MiB, stream), "cuMemAllocAsync")
    a2 = ck(cu.cuMemAllocAsync(4 * MiB, stream), "cuMemAllocAsync")
    ck(cu.cuStreamSynchronize(stream), "sync after cuMemAllocAsync")
    used = pool_attr(P.CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
    expect(used - base == 6 * MiB, f"pool used {used - base}, want {6 * MiB}")
    expect(pool_attr(P.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) >= used, "pool reserved < used")
    ck(cu.cuMemFreeAsync(a2, stream), "cuMemFreeAsync")
    ck(cu.cuStreamSynchronize(stream), "sync after cuMemFreeAsync")
    used = pool_attr(P.CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
    expect(used - base == 2 * MiB, f"pool used after a free {used - base}, want {2 * MiB}")
    expect(pool_attr(P.CU_MEMPOOL_ATTR_USED_MEM_HIGH) >= base + 6 * MiB, "pool high-water mark")
    ck(cu.cuMemPoolSetAttribute(pool, P.CU_MEMPOOL_ATTR_USED_MEM_HIGH, cu.cuuint64_t(0)),
       "reset the pool's high-water mark")
    high = pool_attr(P.CU_MEMPOOL_ATTR_USED_MEM_HIGH)
    expect(high == used, f"pool high after reset {high}, want {used}")
    ck(cu.cuMemFreeAsync(a1, stream), "cuMemFreeAsync")
    ck(cu.cuStreamSynchronize(stream), "sync")

    # A pool of its own: cuMemPoolCreate, allocations charged to it (not to the default pool),
    # its maxSize enforced, cuDeviceSetMemPool routing cuMemAllocAsync to it, then destroyed.
    props = cu.CUmemPoolProps()
    props.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    props.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    props.location.id = int(dev)
    props.maxSize = 8 * MiB
    mine = ck(cu.cuMemPoolCreate(props), "cuMemPoolCreate")
    default_before = pool_attr(P.CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
    b1 = ck(cu.cuMemAllocFromPoolAsync(3 * MiB, mine, stream), "cuMemAllocFromPoolAsync")
    mine_used = int(ck(cu.cuMemPoolGetAttribute(mine, P.CU_MEMPOOL_ATTR_USED_MEM_CURRENT), "attr"))
    expect(mine_used == 3 * MiB, f"created pool used {mine_used}, want {3 * MiB}")
    expect(pool_attr(P.CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == default_before,
           "an allocation from a created pool was charged to the default pool")
    err, _ = cu.cuMemAllocFromPoolAsync(6 * MiB, mine, stream)
    expect(err == cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY, f"past the pool's maxSize: {err!r}")
    ck(cu.cuDeviceSetMemPool(dev, mine), "cuDeviceSetMemPool")
    expect(int(ck(cu.cuDeviceGetMemPool(dev), "cuDeviceGetMemPool")) == int(mine),
           "cuDeviceGetMemPool after cuDeviceSetMemPool")
    b2 = ck(cu.cuMemAllocAsync(1 * MiB, stream), "cuMemAllocAsync from the current pool")
    mine_used = int(ck(cu.cuMemPoolGetAttribute(mine, P.CU_MEMPOOL_ATTR_USED_MEM_CURRENT), "attr"))
    expect(mine_used == 4 * MiB, f"created pool used {mine_used}, want {4 * MiB}")
    ck(cu.cuMemFreeAsync(b1, stream), "cuMemFreeAsync")
    ck(cu.cuMemFreeAsync(b2, stream), "cuMemFreeAsync")
    ck(cu.cuStreamSynchronize(stream), "sync")
    ck(cu.cuMemPoolDestroy(mine), "cuMemPoolDestroy")
    expect(int(ck(cu.cuDeviceGetMemPool(dev), "cuDeviceGetMemPool")) == int(pool),
           "the default pool is current again after the created one is destroyed")
    err, = cu.cuMemPoolDestroy(pool)
    expect(err == cu.CUresult.CUDA_ERROR_INVALID_VALUE, f"destroying the default pool: {err!r}")

    # cuStreamAttachMemAsync on managed memory (checked, nothing to move).
    m = ck(cu.cuMemAllocManaged(1 * MiB, cu.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL.value),
           "cuMemAllocManaged")
    ck(cu.cuStreamAttachMemAsync(stream, m, 0,
                                 cu.CUmemAttach_flags.CU_MEM_ATTACH_SINGLE.value),
       "cuStreamAttachMemAsync")
    ck(cu.cuStreamSynchronize(stream), "sync")
    ck(cu.cuMemFree(m), "cuMemFree managed")
    print("PASS memory_pool", flush=True)

    # Virtual memory management: two physical chunks mapped back to back in one reservation,
    # used by copies and a kernel, charged to the device's memory, kept across an unmap.
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = int(dev)
    gran = ck(cu.cuMemGetAllocationGranularity(
        prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        "cuMemGetAllocationGranularity")
    expect(gran > 0 and (2 * MiB) % gran == 0, f"granularity {gran}")
    chunk = 2 * MiB
    free_before, _ = ck(cu.cuMemGetInfo(), "cuMemGetInfo")
    h1 = ck(cu.cuMemCreate(chunk, prop, 0), "cuMemCreate")
    h2 = ck(cu.cuMemCreate(chunk, prop, 0), "cuMemCreate")
    free_after, _ = ck(cu.cuMemGetInfo(), "cuMemGetInfo")
    expect(free_before - free_after >= 2 * chunk,
           f"cuMemCreate charged {free_before - free_after} bytes, want {2 * chunk}")
    va = ck(cu.cuMemAddressReserve(2 * chunk, 0, 0, 0), "cuMemAddressReserve")
    ck(cu.cuMemMap(va, chunk, 0, h1, 0), "cuMemMap")
    ck(cu.cuMemMap(int(va) + chunk, chunk, 0, h2, 0), "cuMemMap")
    access = cu.CUmemAccessDesc()
    access.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    access.location.id = int(dev)
    access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    ck(cu.cuMemSetAccess(va, 2 * chunk, [access], 1), "cuMemSetAccess")
    vx = np.arange(chunk // 4, dtype=np.float32)
    ck(cu.cuMemcpyHtoD(va, vx, chunk), "cuMemcpyHtoD into mapped memory")
    vy = int(va) + chunk
    vn = chunk // 4
    vargs = [np.array([int(va)], dtype=np.uint64), np.array([vy], dtype=np.uint64),
             np.array([2.0], dtype=np.float32), np.array([1.0], dtype=np.float32),
             np.array([vn], dtype=np.int32)]
    vptrs = np.array([a.ctypes.data for a in vargs], dtype=np.uint64)
    vmod = ck(cu.cuModuleLoadData(ptx), "cuModuleLoadData")
    vfn = ck(cu.cuModuleGetFunction(vmod, b"affine"), "cuModuleGetFunction")
    ck(cu.cuLaunchKernel(vfn, (vn + 255) // 256, 1, 1, 256, 1, 1, 0, stream,
                         vptrs.ctypes.data, 0), "cuLaunchKernel on mapped memory")
    ck(cu.cuStreamSynchronize(stream), "sync")
    got = np.zeros_like(vx)
    ck(cu.cuMemcpyDtoH(got, vy, chunk), "cuMemcpyDtoH from mapped memory")
    if verify:
        expect(np.array_equal(got, 2.0 * vx + 1.0), "kernel on mapped memory")
    ck(cu.cuMemUnmap(va, 2 * chunk), "cuMemUnmap")
    ck(cu.cuMemMap(va, chunk, 0, h2, 0), "cuMemMap again")
    ck(cu.cuMemSetAccess(va, chunk, [access], 1), "cuMemSetAccess")
    again = np.zeros_like(vx)
    ck(cu.cuMemcpyDtoH(again, va, chunk), "cuMemcpyDtoH after remapping")
    if verify:
        expect(np.array_equal(again, got), "data kept across unmap and map")
    ck(cu.cuMemUnmap(va, chunk), "cuMemUnmap")
    ck(cu.cuMemAddressFree(va, 2 * chunk), "cuMemAddressFree")
    ck(cu.cuMemRelease(h1), "cuMemRelease")
    ck(cu.cuMemRelease(h2), "cuMemRelease")
    ck(cu.cuModuleUnload(vmod), "cuModuleUnload")
    print("PASS virtual_memory", flush=True)

    # Compressible memory (NVIDIA's cudaCompressibleMemory sample): a device that reports
    # generic compression keeps CU_MEM_ALLOCATION_COMP_GENERIC, and says so from the handle; a
    # plain allocation stays plain; the memory holds what is written to it.
    attr = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED
    comp_supported = ck(cu.cuDeviceGetAttribute(attr, dev), "cuDeviceGetAttribute compression")
    expect(comp_supported == 1, f"generic compression supported: {comp_supported}")
    GENERIC = cu.CUmemAllocationCompType.CU_MEM_ALLOCATION_COMP_GENERIC
    cprop = cu.CUmemAllocationProp()
    cprop.type = prop.type
    cprop.location.type = prop.location.type
    cprop.location.id = int(dev)
    cprop.allocFlags.compressionType = GENERIC
    hc = ck(cu.cuMemCreate(chunk, cprop, 0), "cuMemCreate compressible")
    got_prop = ck(cu.cuMemGetAllocationPropertiesFromHandle(hc), "properties of compressible")
    expect(int(got_prop.allocFlags.compressionType) == int(GENERIC),
           f"compressible allocation reports {got_prop.allocFlags.compressionType!r}")
    hp = ck(cu.cuMemCreate(chunk, prop, 0), "cuMemCreate plain")
    plain_prop = ck(cu.cuMemGetAllocationPropertiesFromHandle(hp), "properties of plain")
    expect(int(plain_prop.allocFlags.compressionType) == 0,
           f"plain allocation reports {plain_prop.allocFlags.compressionType!r}")
    ck(cu.cuMemRelease(hp), "cuMemRelease plain")
    cva = ck(cu.cuMemAddressReserve(chunk, 0, 0, 0), "cuMemAddressReserve")
    ck(cu.cuMemMap(cva, chunk, 0, hc, 0), "cuMemMap compressible")
    ck(cu.cuMemRelease(hc), "cuMemRelease compressible (mapped: kept)")
    ck(cu.cuMemSetAccess(cva, chunk, [access], 1), "cuMemSetAccess compressible")
    ck(cu.cuMemcpyHtoD(cva, vx, chunk), "cuMemcpyHtoD into compressible memory")
    cback = np.zeros_like(vx)
    ck(cu.cuMemcpyDtoH(cback, cva, chunk), "cuMemcpyDtoH from compressible memory")
    if verify:
        expect(np.array_equal(cback, vx), "compressible memory holds what was written")
    ck(cu.cuMemUnmap(cva, chunk), "cuMemUnmap compressible")
    ck(cu.cuMemAddressFree(cva, chunk), "cuMemAddressFree compressible")
    print("PASS compressible_memory", flush=True)

    # SASS for an architecture the device cannot run (another major version).
    foreign = "sm_75" if major != 7 else "sm_90"
    prog = ck(nvrtc.nvrtcCreateProgram(src, b"affine.cu", 0, [], []), "nvrtcCreateProgram")
    opts = [f"--gpu-architecture={foreign}".encode()]
    ck(nvrtc.nvrtcCompileProgram(prog, len(opts), opts), f"nvrtcCompileProgram {foreign}")
    cubin = b" " * ck(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
    ck(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
    NO_BINARY = cu.CUresult.CUDA_ERROR_NO_BINARY_FOR_GPU
    err, _ = cu.cuModuleLoadData(cubin)
    expect(err == NO_BINARY, f"cuModuleLoadData of {foreign} SASS: {err!r}")
    lib = ck(cu.cuLibraryLoadData(cubin, [], [], 0, [], [], 0), f"cuLibraryLoadData {foreign}")
    err, _ = cu.cuLibraryGetKernel(lib, b"affine")
    expect(err == NO_BINARY, f"cuLibraryGetKernel of {foreign} SASS: {err!r}")
    ck(cu.cuLibraryUnload(lib), "cuLibraryUnload")
    ck(cu.cuCtxSynchronize(), "cuCtxSynchronize after the refused SASS")
    print("PASS foreign_sass", flush=True)

    for h in (dx, dy, d):
        ck(cu.cuMemFree(h), "cuMemFree")
    ck(cu.cuMemFreeHost(hbuf), "cuMemFreeHost")
    ck(cu.cuModuleUnload(module), "cuModuleUnload")
    ck(cu.cuEventDestroy(start), "cuEventDestroy")
    ck(cu.cuEventDestroy(stop), "cuEventDestroy")
    ck(cu.cuStreamDestroy(stream), "cuStreamDestroy")
    ck(cu.cuDevicePrimaryCtxRelease(dev), "cuDevicePrimaryCtxRelease")

    # A created (non-primary) context: push, work, pop, destroy.
    own = ck(cu.cuCtxCreate(None, 0, dev), "cuCtxCreate")
    expect(int(ck(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")) == int(own), "created ctx not current")
    d = ck(cu.cuMemAlloc(MiB), "cuMemAlloc in created context")
    host = np.frombuffer(rng.bytes(MiB), dtype=np.uint8).copy()
    out = np.zeros_like(host)
    ck(cu.cuMemcpyHtoD(d, host, MiB), "cuMemcpyHtoD")
    ck(cu.cuMemcpyDtoH(out, d, MiB), "cuMemcpyDtoH")
    expect(np.array_equal(host, out), "round trip in a created context")
    ck(cu.cuMemFree(d), "cuMemFree")
    popped = ck(cu.cuCtxPopCurrent(), "cuCtxPopCurrent")
    expect(int(popped) == int(own), "popped context")
    ck(cu.cuCtxDestroy(own), "cuCtxDestroy")
    print("PASS created_context", flush=True)
    print("PASS cuda_bindings_driver (results checked)" if verify
          else "PASS cuda_bindings_driver (launches only)")


if __name__ == "__main__":
    main()
