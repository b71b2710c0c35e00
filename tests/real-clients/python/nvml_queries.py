"""What PyTorch and monitoring tools ask NVML (nvidia-ml-py) through gpufuse's libnvidia-ml.so.1:
every function of nvml.h resolves; handle by PCI bus id finds the device; power, clocks and fans
are "Not Supported" (not FunctionNotFound); the running processes are the sessions, this one
with the memory it holds.
Usage: python nvml_queries.py NVML_FUNCTIONS_TSV   Prints PASS nvml_queries; exits 1 with FAIL."""
import ctypes
import os
import sys
import time

import pynvml
from cuda.bindings import driver as cu


def fail(msg):
    print(f"FAIL {msg}", file=sys.stderr)
    sys.exit(1)


def check(res, what):
    err = res[0] if isinstance(res, tuple) else res
    if err != cu.CUresult.CUDA_SUCCESS:
        fail(f"{what}: {err}")
    return res[1] if isinstance(res, tuple) and len(res) == 2 else res


pynvml.nvmlInit()
lib = pynvml.nvmlLib
names = [line.split("\t")[0] for line in open(sys.argv[1]) if not line.startswith("#")]
missing = [n for n in names if not hasattr(lib, n)]
if missing:
    fail(f"{len(missing)} functions of nvml.h are missing: {missing[:10]}")
print(f"resolved={len(names)}")

h = pynvml.nvmlDeviceGetHandleByIndex(0)
pci = pynvml.nvmlDeviceGetPciInfo(h)
bus_id = pci.busId.decode() if isinstance(pci.busId, bytes) else pci.busId
h2 = pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)
if pynvml.nvmlDeviceGetIndex(h2) != 0:
    fail(f"handle by bus id {bus_id} is not device 0")
short = pci.busIdLegacy.decode() if isinstance(pci.busIdLegacy, bytes) else pci.busIdLegacy
if pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByPciBusId(short)) != 0:
    fail(f"handle by short bus id {short}")
try:
    pynvml.nvmlDeviceGetHandleByPciBusId("00ff:ff:1f.0")
    fail("an unknown bus id found a device")
except pynvml.NVMLError_NotFound:
    pass
print(f"bus_id={bus_id}")
# NCCL asks the peer-to-peer status of every pair of devices, each with itself too, and stops
# at the first error: a device with itself is OK.
# (Called through ctypes, as NCCL calls it: nvidia-ml-py's wrapper cannot pass the index.)
for index in (0, 1):  # NVML_P2P_CAPS_INDEX_READ, _WRITE
    status = ctypes.c_uint(99)
    ret = lib.nvmlDeviceGetP2PStatus(h, h, ctypes.c_uint(index), ctypes.byref(status))
    if ret != 0 or status.value != 0:  # NVML_SUCCESS, NVML_P2P_STATUS_OK
        fail(f"P2P status of device 0 with itself (index {index}): {ret}, {status.value}")
print("p2p_self=ok")

queries = {
    "power": lambda: pynvml.nvmlDeviceGetPowerUsage(h),
    "power_limit": lambda: pynvml.nvmlDeviceGetPowerManagementLimit(h),
    "energy": lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(h),
    "clock_sm": lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
    "max_clock": lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM),
    "fan": lambda: pynvml.nvmlDeviceGetFanSpeed(h),
    "nvlink_remote_type": lambda: pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, 0),
    "nvlink_remote_pci": lambda: pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h, 0),
}
for what, q in queries.items():
    try:
        q()
        fail(f"{what} answered a value the virtual GPU does not have")
    except pynvml.NVMLError_NotSupported:
        print(f"{what}=not supported")
    except pynvml.NVMLError as e:
        fail(f"{what}: {e!r} (want Not Supported)")

# A CUDA session in this process: it is one of the device's processes, with what it holds.
check(cu.cuInit(0), "cuInit")
dev = check(cu.cuDeviceGet(0), "cuDeviceGet")
ctx = check(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
size = 96 << 20
ptr = check(cu.cuMemAlloc(size), "cuMemAlloc")
err, free, total = cu.cuMemGetInfo()
if err != cu.CUresult.CUDA_SUCCESS:
    fail(f"cuMemGetInfo: {err}")
# libnvidia-ml.so.1 refreshes the node's status at most every 100 ms (crates/nvml-shim).
time.sleep(0.25)
for fn in (pynvml.nvmlDeviceGetComputeRunningProcesses,
           pynvml.nvmlDeviceGetComputeRunningProcesses_v2):
    procs = fn(h)
    mine = [p for p in procs if p.pid == os.getpid()]
    if len(mine) != 1 or mine[0].usedGpuMemory < size:
        fail(f"{fn.__name__}: {[(p.pid, p.usedGpuMemory) for p in procs]} lacks pid {os.getpid()} "
             f"with >= {size} bytes")
mem = pynvml.nvmlDeviceGetMemoryInfo(h)
if mem.total != total or mem.used < size:
    fail(f"NVML memory total {mem.total} used {mem.used}; driver total {total}, allocated {size}")
print(f"processes={len(procs)}")
print(f"used={mine[0].usedGpuMemory}")
print(f"total={mem.total}")
check(cu.cuMemFree(ptr), "cuMemFree")
pynvml.nvmlShutdown()
print("PASS nvml_queries")
