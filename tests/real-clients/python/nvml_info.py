"""NVML (nvidia-ml-py) through gpufuse's libnvidia-ml.so.1: what nvidia-smi-like tools see.
Usage: python nvml_info.py   Prints name=, total=, cc= and PASS nvml; exits 1 with FAIL on errors."""
import sys

import pynvml


def fail(msg):
    print(f"FAIL {msg}", file=sys.stderr)
    sys.exit(1)


pynvml.nvmlInit()
count = pynvml.nvmlDeviceGetCount()
if count < 1:
    fail(f"nvmlDeviceGetCount {count}")
h = pynvml.nvmlDeviceGetHandleByIndex(0)
name = pynvml.nvmlDeviceGetName(h)
name = name.decode() if isinstance(name, bytes) else name
mem = pynvml.nvmlDeviceGetMemoryInfo(h)
major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
uuid = pynvml.nvmlDeviceGetUUID(h)
uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
driver = pynvml.nvmlSystemGetDriverVersion()
cuda_driver = pynvml.nvmlSystemGetCudaDriverVersion()
print(f"name={name}")
print(f"total={mem.total}")
print(f"cc={major}.{minor}")
print(f"uuid={uuid} driver={driver} cuda_driver={cuda_driver}")
if not (mem.used <= mem.total and mem.free <= mem.total):
    fail(f"memory info used {mem.used} free {mem.free} total {mem.total}")
if not uuid.startswith("GPU-"):
    fail(f"uuid {uuid}")
pynvml.nvmlShutdown()
print("PASS nvml")
