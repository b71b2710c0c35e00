"""CuPy's start-up through gpufuse: `import cupy` and one small elementwise op, its first
kernel (NVRTC-compiled, from CuPy's kernel cache after the first run), checked.
Usage: python startup_cupy.py [--no-cuda]   (--no-cuda: `import cupy` only, the baseline)
Run with CUPY_COMPILE_WITH_PTX=1 against an emulated GPU (it executes PTX, not SASS).
Prints PASS startup_cupy."""
import sys

import cupy

if "--no-cuda" in sys.argv[1:]:
    print("PASS startup_cupy (import only)")
    sys.exit(0)

x = cupy.arange(16, dtype=cupy.float32)
y = x * 2 + 1
cupy.cuda.Device(0).synchronize()
if y.get().tolist() != [2 * i + 1 for i in range(16)]:
    print("FAIL x*2+1", file=sys.stderr)
    sys.exit(1)
print("PASS startup_cupy")
