"""PyTorch checks for the GPU lane, run once natively and once through gpufuse on the same GPU.

Each check computes a result on the GPU and a reference (CPU, or the native run's result file),
and prints one JSON line: {"check": name, "ok": bool, "max_err": float, "ms": float}.
Usage: python torch_checks.py OUT.json [--compare NATIVE.json]
"""
import json
import sys

import torch

from lane_timing import timed

torch.manual_seed(0)
dev = torch.device("cuda")
results = {}


def record(name, gpu, ref, ms, tol):
    err = (gpu.detach().float().cpu() - ref.detach().float().cpu()).abs().max().item()
    results[name] = {"ok": err <= tol, "max_err": err, "ms": ms, "value": gpu.detach().float().cpu().flatten()[:16].tolist()}
    print(json.dumps({"check": name, "ok": err <= tol, "max_err": err, "ms": round(ms, 3)}), flush=True)


a = torch.randn(1 << 20)
out, ms = timed(lambda: (a.to(dev) * 2 + 1).sin())
record("tensor_ops", out, (a * 2 + 1).sin(), ms, 1e-5)

x, y = torch.randn(1024, 1024), torch.randn(1024, 1024)
xd, yd = x.to(dev), y.to(dev)
out, ms = timed(lambda: xd @ yd)
record("matmul_cublas", out, x @ y, ms, 5e-2)

conv = torch.nn.Conv2d(16, 32, 3, padding=1)
img = torch.randn(8, 16, 64, 64)
convd, imgd = conv.to(dev), img.to(dev)
out, ms = timed(lambda: convd(imgd))
record("conv_cudnn", out, conv.cpu()(img), ms, 5e-3)
conv.to(dev)

model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data, target = torch.randn(128, 256, device=dev), torch.randint(0, 10, (128,), device=dev)


def train_step():
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(data), target)
    loss.backward()
    opt.step()
    return loss


losses = [train_step().item() for _ in range(20)]
_, ms = timed(train_step)
results["training_step"] = {"ok": losses[-1] < losses[0], "max_err": 0.0, "ms": ms, "value": losses[:16]}
print(json.dumps({"check": "training_step", "ok": losses[-1] < losses[0], "first_loss": losses[0], "last_loss": losses[-1], "ms": round(ms, 3)}), flush=True)

layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=512, batch_first=True)
encoder = torch.nn.TransformerEncoder(layer, num_layers=2).eval()
tokens = torch.randn(4, 64, 256)
with torch.no_grad():
    ref = encoder(tokens)
    encd, tokd = encoder.to(dev), tokens.to(dev)
    out, ms = timed(lambda: encd(tokd))
record("transformer_inference", out, ref, ms, 5e-3)

try:
    f = torch.compile(lambda t: torch.nn.functional.gelu(t) * t.sigmoid())
    t = torch.randn(1 << 16, device=dev)
    out, ms = timed(lambda: f(t))
    record("torch_compile_triton", out, torch.nn.functional.gelu(t.cpu()) * t.cpu().sigmoid(), ms, 1e-4)
except Exception as e:  # reported, never hidden
    results["torch_compile_triton"] = {"ok": False, "error": repr(e)}
    print(json.dumps({"check": "torch_compile_triton", "ok": False, "error": repr(e)}), flush=True)

static_in = torch.randn(1024, device=dev)
static_out = torch.empty_like(static_in)
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    static_out.copy_(static_in * 3)
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    static_out.copy_(static_in * 3 + 1)
static_in.copy_(torch.arange(1024, dtype=torch.float32, device=dev))
out, ms = timed(lambda: (g.replay(), static_out)[1])
record("cuda_graphs", out, torch.arange(1024, dtype=torch.float32) * 3 + 1, ms, 1e-6)

# Last: a failing kernel poisons the context, and every check after it would fail too.
try:
    sig = torch.randn(64, 4096)
    sigd = sig.to(dev)
    out, ms = timed(lambda: torch.fft.rfft(sigd).abs())
    record("fft_cufft", out, torch.fft.rfft(sig).abs(), ms, 1e-2)
except Exception as e:  # reported, never hidden
    results["fft_cufft"] = {"ok": False, "error": repr(e)}
    print(json.dumps({"check": "fft_cufft", "ok": False, "error": repr(e)}), flush=True)

path = sys.argv[1]
with open(path, "w") as fh:
    json.dump(results, fh)
if "--compare" in sys.argv:
    native = json.load(open(sys.argv[sys.argv.index("--compare") + 1]))
    for name, r in results.items():
        n = native.get(name, {})
        if "ms" in r and "ms" in n and n["ms"] > 0:
            print(f"{name:24s} native {n['ms']:9.3f} ms   gpufuse {r['ms']:9.3f} ms   ratio {r['ms'] / n['ms']:6.2f}x")
failed = [k for k, r in results.items() if not r.get("ok")]
print("torch checks:", "all passed" if not failed else f"FAILED {failed}")
sys.exit(1 if failed else 0)
