"""CuPy through gpufuse: arrays move to the (virtual) GPU and back, unchanged."""
import numpy as np
import cupy as cp

host = np.arange(1 << 20, dtype=np.float32)
dev = cp.asarray(host)
back = dev.get()
free, total = cp.cuda.runtime.memGetInfo()
name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
assert np.array_equal(back, host)
print(f"cupy: {host.nbytes >> 20} MiB round trip to '{name}' and back, identical; "
      f"device memory {free >> 20} MiB free of {total >> 20} MiB")
