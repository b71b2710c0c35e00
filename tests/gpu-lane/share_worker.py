"""One tenant of the GPU lane's compute-share check: runs ~2 ms matrix products back to back
(each followed by a synchronize) for SECONDS and prints how many completed."""
import sys
import time

import torch

seconds = float(sys.argv[1])
label = sys.argv[2]
a = torch.randn(4096, 4096, device="cuda")
b = torch.randn(4096, 4096, device="cuda")
for _ in range(3):
    a @ b
torch.cuda.synchronize()
start_at = float(sys.argv[3]) if len(sys.argv) > 3 else time.time()
while time.time() < start_at:
    time.sleep(0.01)
n, t0 = 0, time.time()
while time.time() - t0 < seconds:
    a @ b
    torch.cuda.synchronize()
    n += 1
print(f"{label} {n}", flush=True)
