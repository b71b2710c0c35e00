"""Slice checks for the GPU lane, run through `gpufuse run --vram 4GiB`: PyTorch sees the
slice, allocations over it raise torch.cuda.OutOfMemoryError, and memory freed comes back."""
import sys

import torch

failed = []
free, total = torch.cuda.mem_get_info()
print(f"mem_get_info: free {free / 2**30:.2f} GiB, total {total / 2**30:.2f} GiB", flush=True)
if abs(total - 4 * 2**30) > 2**20:
    failed.append("total is not the 4 GiB slice")
x = torch.empty(3 * 2**30, dtype=torch.uint8, device="cuda")
try:
    y = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
    failed.append("an allocation over the slice succeeded")
except torch.cuda.OutOfMemoryError as e:
    print("over the slice -> OutOfMemoryError:", str(e).splitlines()[0][:120], flush=True)
del x
torch.cuda.empty_cache()
y = torch.ones(3 * 2**30, dtype=torch.uint8, device="cuda")
if int(y[::2**20].sum()) != 3 * 2**10:
    failed.append("memory after freeing")
print("slice checks:", "all passed" if not failed else f"FAILED {failed}")
sys.exit(1 if failed else 0)
