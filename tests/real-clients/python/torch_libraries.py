"""NVIDIA's libraries as PyTorch drives them, one operation per run: cuBLASLt matmuls in every
precision, cuDNN convolutions forward and backward, scaled-dot-product attention, a one-rank NCCL
communicator, cuFFT plans and torch.compile.

    python torch_libraries.py CHECK|all [--strict]

Inputs are made on the host and copied, so the only kernels are the library's own. Prints
`PASS CHECK ...` when the operation computes the right result (a GPU), or
`CLEAN_ERROR CHECK <type>: <first line>` when it raises an error the application can handle (the
emulated GPU, whose kernels run from PTX, gets "no kernel image" for a library's SASS-only
kernels, as a GPU of another architecture does). Exit status 0 in both cases; a result that is
wrong is exit 1; a crash is whatever the signal makes it, which the test reports. `--strict`
(the GPU lane, where every operation must compute): an error is exit 1 too.
"""
import copy
import os
import sys

import torch

MiB = 1 << 20


def close(got, ref, tol):
    got, ref = got.detach().float().cpu(), ref.detach().float().cpu()
    err = ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
    return err <= tol, err


def host(*shape, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return torch.randn(*shape, generator=g).to(dtype)


def matmul(dtype, tf32=False):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    a, b = host(128, 256, dtype=dtype), host(256, 64, dtype=dtype)
    got = a.cuda() @ b.cuda()
    return close(got, a.float() @ b.float(), 2e-2)


def matmul_fp8():
    if torch.cuda.get_device_capability() < (8, 9):
        return "skip", "no fp8 on this compute capability"
    a = host(64, 128).to(torch.float8_e4m3fn)
    b = host(64, 128).to(torch.float8_e4m3fn)
    one = torch.ones((), dtype=torch.float32)
    got = torch._scaled_mm(a.cuda(), b.cuda().t(), scale_a=one.cuda(), scale_b=one.cuda(),
                           out_dtype=torch.bfloat16)
    return close(got, a.float() @ b.float().t(), 2e-2)


def matmul_int8():
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-8, 8, (64, 128), generator=g, dtype=torch.int8)
    b = torch.randint(-8, 8, (128, 64), generator=g, dtype=torch.int8)
    got = torch._int_mm(a.cuda(), b.cuda())
    return close(got, a.int() @ b.int(), 0)


def conv(dtype):
    conv = torch.nn.Conv2d(8, 16, 3, padding=1)
    x = host(2, 8, 16, 16)
    ref = conv(x)
    # Converted on the host and copied: the only device work is cuDNN's.
    c = copy.deepcopy(conv).to(dtype).cuda()
    xd = x.to("cuda", dtype).requires_grad_()
    y = c(xd)
    y.float().sum().backward()
    torch.cuda.synchronize()
    ok, err = close(y, ref, 5e-2)
    return ok and xd.grad is not None, err


def sdpa():
    q, k, v = (host(2, 4, 64, 32) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    qd, kd, vd = (t.to("cuda", torch.bfloat16) for t in (q, k, v))
    got = torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, is_causal=True)
    return close(got, ref, 5e-2)


def nccl():
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    # One rank needs no network: loopback, which NCCL leaves out unless named, so a machine
    # without another interface runs it too.
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    os.environ.setdefault("MASTER_PORT", str(20000 + os.getpid() % 20000))
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    try:
        t = host(1024).cuda()
        dist.all_reduce(t)
        torch.cuda.synchronize()
        return close(t, host(1024), 0)
    finally:
        dist.destroy_process_group()


def fft():
    x = host(8, 1024)
    got = torch.fft.rfft(x.cuda())
    return close(got.abs(), torch.fft.rfft(x).abs(), 1e-3)


def compile_():
    f = torch.compile(lambda t: torch.nn.functional.gelu(t) * t.sigmoid())
    x = host(4096)
    return close(f(x.cuda()), torch.nn.functional.gelu(x) * x.sigmoid(), 1e-4)


CHECKS = {
    "matmul_fp32": lambda: matmul(torch.float32),
    "matmul_tf32": lambda: matmul(torch.float32, tf32=True),
    "matmul_fp16": lambda: matmul(torch.float16),
    "matmul_bf16": lambda: matmul(torch.bfloat16),
    "matmul_fp8": matmul_fp8,
    "matmul_int8": matmul_int8,
    "conv_fp32_fwd_bwd": lambda: conv(torch.float32),
    "conv_bf16_fwd_bwd": lambda: conv(torch.bfloat16),
    "sdpa_bf16": sdpa,
    "nccl_one_rank": nccl,
    "cufft_plan": fft,
    "torch_compile": compile_,
}


STRICT = "--strict" in sys.argv


def run(name):
    try:
        ok, detail = CHECKS[name]()
        torch.cuda.synchronize()
    except Exception as e:  # the clean error path: reported, never hidden
        # One line: the error and its cause (torch.compile wraps the CUDA error it met).
        text = " | ".join(l.strip() for l in str(e).splitlines() if l.strip())[:600]
        print(f"CLEAN_ERROR {name} {type(e).__name__}: {text}", flush=True)
        return 1 if STRICT else 0
    if ok == "skip":
        print(f"SKIP {name} {detail}", flush=True)
        return 0
    print(f"{'PASS' if ok else 'WRONG'} {name} err={detail}", flush=True)
    return 0 if ok else 1


def main():
    # `all`: every check in this process, one line each (a crash ends the run: the test sees
    # the signal and the last check that printed).
    names = list(CHECKS) if sys.argv[1] == "all" else [sys.argv[1]]
    failed = 0
    for name in names:
        print(f"START {name}", flush=True)
        failed |= run(name)
    return failed


if __name__ == "__main__":
    sys.exit(main())
