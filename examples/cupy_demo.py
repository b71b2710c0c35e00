"""CuPy through gpufuse, as installed: arrays move to the (virtual) GPU and back unchanged,
and kernels CuPy compiles at run time (NVRTC) run on it."""
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

# An elementwise kernel and a reduction, compiled by NVRTC for the device and run there.
saxpy = cp.ElementwiseKernel("float32 x, float32 y", "float32 z", "z = 2.0f * x + y", "saxpy")
z = saxpy(dev, cp.ones_like(dev))
want = 2.0 * host + 1.0
assert np.array_equal(z.get(), want)
total_sum = float(z.sum())
# float32 sums in another order: equal to a relative 1e-6.
assert abs(total_sum - float(want.astype(np.float64).sum())) <= 1e-6 * total_sum
print(f"cupy: an NVRTC-compiled saxpy over {host.size} elements and its sum ({total_sum:.6g}) "
      "match NumPy")
