"""Physical memory shared with another process through a POSIX file descriptor (cuda-python's
cuda.bindings.driver): cuMemCreate with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR requested,
cuMemExportToShareableHandle, the descriptor passed to a child process (this script again),
which imports it (cuMemImportFromShareableHandle), maps it, reads what the parent wrote and
writes its own; the parent then reads the child's bytes through its own mapping. The child's
session is not charged for the memory, a descriptor that is no export is refused, and other
handle types are CUDA_ERROR_NOT_SUPPORTED. Then the same through an exportable memory pool
(cuMemPoolCreate with POSIX file descriptors, cuMemPoolExportToShareableHandle,
cuMemPoolExportPointer; the child's cuMemPoolImportFromShareableHandle, cuMemPoolGetAccess,
cuMemPoolImportPointer, cuMemFreeAsync), as NVIDIA's streamOrderedAllocationIPC does.

Usage: python ipc_shareable.py                              (the parent)
       python ipc_shareable.py child FD POOL_FD EXPORT_HEX  (started by the parent)
"""
import ctypes
import subprocess
import sys

import numpy as np
from cuda.bindings import driver as cu

R = cu.CUresult
POSIX_FD = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
SIZE = 2 << 20
N = SIZE // 4


def fail(msg):
    print(f"FAIL {msg}", file=sys.stderr)
    sys.exit(1)


def ck(result, what=""):
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != R.CUDA_SUCCESS:
        fail(f"{what}: {err!r}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


def status(result):
    return result[0] if isinstance(result, tuple) else result


def context():
    ck(cu.cuInit(0), "cuInit")
    dev = ck(cu.cuDeviceGet(0), "cuDeviceGet")
    ctx = ck(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return dev


def map_at(handle):
    """Reserves an address range, maps `handle` there read-write; the address."""
    va = ck(cu.cuMemAddressReserve(SIZE, 0, 0, 0), "cuMemAddressReserve")
    ck(cu.cuMemMap(va, SIZE, 0, handle, 0), "cuMemMap")
    access = cu.CUmemAccessDesc()
    access.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    access.location.id = 0
    access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    ck(cu.cuMemSetAccess(va, SIZE, [access], 1), "cuMemSetAccess")
    return va


def unmap(va):
    ck(cu.cuMemUnmap(va, SIZE), "cuMemUnmap")
    ck(cu.cuMemAddressFree(va, SIZE), "cuMemAddressFree")


def read(va):
    out = np.zeros(N, dtype=np.uint32)
    ck(cu.cuMemcpyDtoH(out.ctypes.data, va, SIZE), "cuMemcpyDtoH")
    return out


def write(va, values):
    ck(cu.cuMemcpyHtoD(va, values.ctypes.data, SIZE), "cuMemcpyHtoD")


def export_bytes(data):
    """The 64 bytes of a CUmemPoolPtrExportData (cuda-python exposes only its address)."""
    return (ctypes.c_ubyte * 64).from_address(data.getPtr())


def child_pool(pool_fd, export_hex):
    pool = ck(cu.cuMemPoolImportFromShareableHandle(pool_fd, POSIX_FD, 0),
              "cuMemPoolImportFromShareableHandle")
    loc = cu.CUmemLocation()
    loc.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    loc.id = 0
    flags = ck(cu.cuMemPoolGetAccess(pool, loc), "cuMemPoolGetAccess")
    if flags != cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE:
        fail(f"the imported pool's access: {flags!r}")
    stream = ck(cu.cuStreamCreate(0), "cuStreamCreate")
    if status(cu.cuMemAllocFromPoolAsync(4096, pool, stream)) == R.CUDA_SUCCESS:
        fail("an imported pool allocated memory of its own")
    data = cu.CUmemPoolPtrExportData()
    raw = bytes.fromhex(export_hex)
    wrong = bytearray(raw)
    wrong[45] ^= 1  # the pool's secret
    export_bytes(data)[:] = wrong
    if status(cu.cuMemPoolImportPointer(pool, data)) == R.CUDA_SUCCESS:
        fail("another pool's pointer was imported")
    export_bytes(data)[:] = raw
    ptr = ck(cu.cuMemPoolImportPointer(pool, data), "cuMemPoolImportPointer")
    got = read(ptr)
    if not np.array_equal(got, np.arange(N, dtype=np.uint32) + 7):
        fail(f"the child read {got[:4]}... from the pool's pointer")
    write(ptr, np.arange(N, dtype=np.uint32) * 5)
    ck(cu.cuMemFreeAsync(ptr, stream), "cuMemFreeAsync (the imported pointer)")
    ck(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
    print("child: imported the pool and its pointer, read, wrote, freed", flush=True)


def child(fd):
    context()
    free_before = ck(cu.cuMemGetInfo(), "cuMemGetInfo")[0]
    handle = ck(cu.cuMemImportFromShareableHandle(fd, POSIX_FD), "cuMemImportFromShareableHandle")
    va = map_at(handle)
    ck(cu.cuMemRelease(handle), "cuMemRelease (stays mapped)")
    free_after = ck(cu.cuMemGetInfo(), "cuMemGetInfo")[0]
    if free_after != free_before:
        fail(f"the import charged the child {free_before - free_after} bytes")
    got = read(va)
    want = np.arange(N, dtype=np.uint32) * 3 + 1
    if not np.array_equal(got, want):
        fail(f"the child read {got[:4]}..., want {want[:4]}...")
    write(va, np.arange(N, dtype=np.uint32) ^ 0x5A5A5A5A)
    unmap(va)
    with open("/dev/null") as f:
        err = status(cu.cuMemImportFromShareableHandle(f.fileno(), POSIX_FD))
    if err == R.CUDA_SUCCESS:
        fail("a descriptor that is no export was imported")
    print(f"child: imported, read, wrote; /dev/null refused with {err!r}", flush=True)


def parent_pool():
    """An exportable pool's allocation, its descriptor and export data; the stream."""
    props = cu.CUmemPoolProps()
    props.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    props.handleTypes = POSIX_FD
    props.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    props.location.id = 0
    pool = ck(cu.cuMemPoolCreate(props), "cuMemPoolCreate (POSIX fd)")
    stream = ck(cu.cuStreamCreate(0), "cuStreamCreate")
    ptr = ck(cu.cuMemAllocFromPoolAsync(SIZE, pool, stream), "cuMemAllocFromPoolAsync")
    ck(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
    write(ptr, np.arange(N, dtype=np.uint32) + 7)
    pool_fd = ck(cu.cuMemPoolExportToShareableHandle(pool, POSIX_FD, 0),
                 "cuMemPoolExportToShareableHandle")
    data = ck(cu.cuMemPoolExportPointer(ptr), "cuMemPoolExportPointer")
    return pool, ptr, int(pool_fd), bytes(export_bytes(data)).hex(), stream


def parent():
    dev = context()
    if ck(cu.cuDeviceGetAttribute(
            cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
            dev), "attribute 103") != 1:
        fail("POSIX file descriptor handles not reported")
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = 0
    prop.requestedHandleTypes = POSIX_FD
    handle = ck(cu.cuMemCreate(SIZE, prop, 0), "cuMemCreate")
    va = map_at(handle)
    write(va, np.arange(N, dtype=np.uint32) * 3 + 1)
    fd = ck(cu.cuMemExportToShareableHandle(handle, POSIX_FD, 0), "cuMemExportToShareableHandle")
    fabric = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_FABRIC
    err = status(cu.cuMemExportToShareableHandle(handle, fabric, 0))
    if err != R.CUDA_ERROR_NOT_SUPPORTED:
        fail(f"a fabric handle: {err!r}, want CUDA_ERROR_NOT_SUPPORTED")
    # The exported memory keeps its contents and its mapping here.
    if not np.array_equal(read(va)[:8], np.arange(8, dtype=np.uint32) * 3 + 1):
        fail("the export changed the contents")
    pool, pool_ptr, pool_fd, export_hex, stream = parent_pool()
    res = subprocess.run([sys.executable, __file__, "child", str(int(fd)), str(pool_fd),
                          export_hex], pass_fds=(int(fd), pool_fd),
                         capture_output=True, text=True, timeout=120)
    sys.stdout.write(res.stdout)
    sys.stderr.write(res.stderr)
    if res.returncode != 0:
        fail(f"the child exited with {res.returncode}")
    got = read(va)
    want = np.arange(N, dtype=np.uint32) ^ 0x5A5A5A5A
    if not np.array_equal(got, want):
        fail(f"the parent read {got[:4]}..., want the child's {want[:4]}...")
    unmap(va)
    ck(cu.cuMemRelease(handle), "cuMemRelease")
    got = read(pool_ptr)
    if not np.array_equal(got, np.arange(N, dtype=np.uint32) * 5):
        fail(f"the parent read {got[:4]}... from its pool, want the child's")
    ck(cu.cuMemFreeAsync(pool_ptr, stream), "cuMemFreeAsync")
    ck(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
    ck(cu.cuMemPoolDestroy(pool), "cuMemPoolDestroy")
    print("PASS ipc_shareable (results checked)")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "child":
        child(int(sys.argv[2]))
        child_pool(int(sys.argv[3]), sys.argv[4])
    else:
        parent()
