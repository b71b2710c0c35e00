"""What PyTorch users run: mixed precision (bf16/fp16, autocast, AMP), attention, torch.compile,
cuDNN and CUDA graphs. Each check runs in a process of its own, so one that kills its process
(the SIGSEGV of every bf16/fp16 matmul before issue 27) is reported as such and the others go on.

    python torch_mixed.py OUT.json [--compare NATIVE.json] [--only CHECK,...]   # every check
    python torch_mixed.py --check NAME                                          # one, in-process

Each check prints one JSON line {"check", "ok", "max_err" or facts, "ms"}; the driver collects
them, records a crash (signal) or an exception as a failure with its reason, and prints the
gpufuse / native time ratios with --compare. Exit status 1 if any check failed.
"""
import copy
import json
import os
import re
import subprocess
import sys

from lane_timing import timed


def emit(name, ok, ms, **facts):
    print(json.dumps({"check": name, "ok": bool(ok), "ms": round(ms, 3), **facts}), flush=True)


def rel_err(torch, got, ref):
    got, ref = got.detach().float().cpu(), ref.detach().float().cpu()
    return ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()


def matmul(dtype_name):
    import torch
    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    a = torch.randn(256, 256)
    b = torch.randn(256, 256)
    ad, bd = a.to("cuda", dtype), b.to("cuda", dtype)
    out, ms = timed(lambda: ad @ bd)
    ref = a.to(dtype).float() @ b.to(dtype).float()
    err = rel_err(torch, out, ref)
    emit(f"{dtype_name}_matmul", err < 2e-2, ms, rel_err=err, dtype=str(out.dtype))


class TinyGPT:
    """A GPT-style decoder: token + position embeddings, causal self-attention blocks (SDPA),
    an MLP, pre-norm, weight-tied head."""

    @staticmethod
    def build(torch, vocab=256, d=128, heads=4, layers=2, seq=64):
        nn = torch.nn
        F = torch.nn.functional

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
                self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
                self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

            def forward(self, x):
                b, t, _ = x.shape
                q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, d // heads).unbind(2)
                y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                   v.transpose(1, 2), is_causal=True)
                x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
                return x + self.mlp(self.ln2(x))

        class GPT(nn.Module):
            def __init__(self):
                super().__init__()
                self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
                self.blocks = nn.ModuleList(Block() for _ in range(layers))
                self.ln = nn.LayerNorm(d)

            def forward(self, idx):
                x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
                for blk in self.blocks:
                    x = blk(x)
                return self.ln(x) @ self.tok.weight.t()

        return GPT()


def gpt_batches(torch, vocab=256, seq=64, batch=16):
    # A learnable sequence: each token is the previous one plus one (mod vocab).
    start = torch.randint(0, vocab, (batch, 1), device="cuda")
    seqs = (start + torch.arange(seq + 1, device="cuda")) % vocab
    return seqs[:, :-1], seqs[:, 1:]


def autocast_gpt_bf16():
    import torch
    torch.manual_seed(0)
    model = TinyGPT.build(torch).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x, y = gpt_batches(torch)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        return loss

    losses = [step().item() for _ in range(30)]
    _, ms = timed(step, reps=5)
    emit("autocast_gpt_bf16_train", losses[-1] < 0.5 * losses[0], ms,
         first_loss=round(losses[0], 3), last_loss=round(losses[-1], 3))


def amp_resnet_fp16():
    import torch
    nn = torch.nn
    torch.manual_seed(0)

    class Res(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c),
                                      nn.ReLU(), nn.Conv2d(c, c, 3, padding=1, bias=False),
                                      nn.BatchNorm2d(c))

        def forward(self, x):
            return torch.relu(x + self.body(x))

    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), Res(32), Res(32),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    model = model.cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")
    data = torch.randn(32, 3, 32, 32, device="cuda").to(memory_format=torch.channels_last)
    target = torch.randint(0, 10, (32,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(data), target)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    losses = [step().item() for _ in range(25)]
    _, ms = timed(step, reps=5)
    emit("amp_resnet_fp16_train", losses[-1] < losses[0], ms,
         first_loss=round(losses[0], 3), last_loss=round(losses[-1], 3))


def bf16_inference():
    """Batch-1 decoding-style inference of the GPT in bf16: one forward of 64 tokens."""
    import torch
    torch.manual_seed(0)
    model = TinyGPT.build(torch).eval()
    idx = torch.randint(0, 256, (1, 64))
    with torch.no_grad():
        ref = model(idx)
        m = model.cuda().to(torch.bfloat16)
        out, ms = timed(lambda: m(idx.cuda()), reps=20)
    err = rel_err(torch, out, ref)
    emit("bf16_inference_batch1", err < 0.1, ms, rel_err=err)


def sdpa_bf16():
    import torch
    F = torch.nn.functional
    torch.manual_seed(0)
    q, k, v = (torch.randn(4, 8, 256, 64) for _ in range(3))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    qd, kd, vd = (t.to("cuda", torch.bfloat16) for t in (q, k, v))
    out, ms = timed(lambda: F.scaled_dot_product_attention(qd, kd, vd, is_causal=True))
    err = rel_err(torch, out, ref)
    emit("sdpa_bf16", err < 5e-2, ms, rel_err=err)


def compile_bf16():
    import torch
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512))
    x = torch.randn(64, 512)
    with torch.no_grad():
        ref = mlp(x)
        m = mlp.cuda().to(torch.bfloat16)
        f = torch.compile(m)
        xd = x.to("cuda", torch.bfloat16)
        out, ms = timed(lambda: f(xd))
    err = rel_err(torch, out, ref)
    emit("compile_bf16", err < 5e-2, ms, rel_err=err)


def cudnn_conv_bf16():
    import torch
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(32, 64, 3, padding=1)
    x = torch.randn(8, 32, 32, 32)
    ref = conv(x)
    c = copy.deepcopy(conv).to(torch.bfloat16).cuda()
    xd = x.to("cuda", torch.bfloat16).requires_grad_()

    def fwd_bwd():
        y = c(xd)
        y.float().square().mean().backward()
        return y

    out, ms = timed(fwd_bwd)
    err = rel_err(torch, out, ref)
    ok = err < 5e-2 and xd.grad is not None and torch.isfinite(xd.grad).all().item()
    emit("cudnn_conv_bf16_fwd_bwd", ok, ms, rel_err=err)


def cuda_graph_bf16():
    import torch
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)])
    x = torch.randn(16, 256)
    with torch.no_grad():
        ref = mlp(x)
        m = mlp.cuda().to(torch.bfloat16)
        static_in = x.to("cuda", torch.bfloat16)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            m(static_in)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_out = m(static_in)
        out, ms = timed(lambda: (g.replay(), static_out)[1], reps=20)
    err = rel_err(torch, out, ref)
    emit("cuda_graph_bf16", err < 0.1, ms, rel_err=err)


CHECKS = {
    "bfloat16_matmul": lambda: matmul("bfloat16"),
    "float16_matmul": lambda: matmul("float16"),
    "autocast_gpt_bf16_train": autocast_gpt_bf16,
    "amp_resnet_fp16_train": amp_resnet_fp16,
    "bf16_inference_batch1": bf16_inference,
    "sdpa_bf16": sdpa_bf16,
    "compile_bf16": compile_bf16,
    "cudnn_conv_bf16_fwd_bwd": cudnn_conv_bf16,
    "cuda_graph_bf16": cuda_graph_bf16,
}


def run_one(name, timeout):
    """Runs one check in a child process; its JSON line, or a failure saying how it ended."""
    try:
        p = subprocess.run([sys.executable, __file__, "--check", name], capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"check": name, "ok": False, "error": f"timed out after {timeout} s"}
    line = next((json.loads(l) for l in p.stdout.splitlines() if l.startswith('{"check"')), None)
    if p.returncode < 0:
        return {"check": name, "ok": False, "error": f"killed by signal {-p.returncode}",
                "stderr": p.stderr[-600:]}
    if line is None:
        lines = [l for l in p.stderr.strip().splitlines() if l.strip()]
        # The exception's own line, not the advice printed after it.
        raised = re.compile(r"[\w.]*(Error|Exception)\b.*:")
        why = [l for l in lines if raised.match(l.strip())][-1:] or lines[-1:] or ["no output"]
        return {"check": name, "ok": False, "error": f"exit {p.returncode}: {why[0][-300:]}",
                "stderr": p.stderr[-1500:]}
    return line


def main():
    if sys.argv[1:2] == ["--check"]:
        CHECKS[sys.argv[2]]()
        return 0
    out = sys.argv[1]
    names = list(CHECKS)
    if "--only" in sys.argv:
        names = sys.argv[sys.argv.index("--only") + 1].split(",")
    timeout = int(os.environ.get("TORCH_MIXED_TIMEOUT", "120"))
    results = {}
    for name in names:
        r = run_one(name, timeout)
        results[name] = r
        print(json.dumps({k: v for k, v in r.items() if k != "stderr"}), flush=True)
        if not r.get("ok") and r.get("stderr"):
            print("    | " + r["stderr"].strip().replace("\n", "\n    | ")[-1500:], flush=True)
    with open(out, "w") as fh:
        json.dump(results, fh)
    if "--compare" in sys.argv:
        native = json.load(open(sys.argv[sys.argv.index("--compare") + 1]))
        for name, r in results.items():
            n = native.get(name, {})
            if r.get("ms") and n.get("ms"):
                print(f"{name:26s} native {n['ms']:9.3f} ms   gpufuse {r['ms']:9.3f} ms   "
                      f"ratio {r['ms'] / n['ms']:6.2f}x")
    failed = [k for k, r in results.items() if not r.get("ok")]
    print("mixed-precision checks:", "all passed" if not failed else f"FAILED {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
