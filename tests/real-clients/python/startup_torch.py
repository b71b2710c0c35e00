"""PyTorch's start-up through gpufuse: `import torch`, `torch.cuda.init()` and one small op,
whose kernel is the program's first. PyTorch's kernels are SASS-only, so on the emulated GPU the
launch is refused (CUDA_ERROR_NO_BINARY_FOR_GPU); everything up to it (initialisation, image
registration, the kernel's image loaded at its first use) is what is measured.
Usage: python startup_torch.py [--no-cuda]   (--no-cuda: `import torch` only, the baseline)
Prints key=value lines and PASS startup_torch."""
import sys
import time

import torch

if "--no-cuda" in sys.argv[1:]:
    print("PASS startup_torch (import only)")
    sys.exit(0)

torch.cuda.init()
start = time.monotonic()
try:
    x = torch.ones(16, device="cuda")
    y = x + 1
    torch.cuda.synchronize()
    print(f"first_kernel=ran sum={float(y.sum().cpu())}")
except RuntimeError as e:
    # The emulated GPU has no SASS to run PyTorch's kernels: the launch is refused.
    print(f"first_kernel=refused {str(e).splitlines()[0]}")
print(f"op_s={time.monotonic() - start:.3f}")
print("PASS startup_torch")
