"""PyTorch (the CUDA 13 wheel from PyPI) through gpufuse: the host-side behaviour of one check.
PyTorch's own kernels are SASS-only, so nothing here launches one of them.
Usage: python torch_checks.py CHECK [SLICE_BYTES]
Prints key=value lines and PASS CHECK; exits 1 with FAIL on a wrong result."""
import os
import sys
import time

import torch

MiB = 1 << 20


def fail(msg):
    print(f"FAIL {msg}", file=sys.stderr)
    sys.exit(1)


def expect(cond, msg):
    if not cond:
        fail(msg)


def device():
    expect(torch.cuda.is_available(), "torch.cuda.is_available() is False")
    expect(torch.cuda.device_count() == 1, f"device_count {torch.cuda.device_count()}")
    p = torch.cuda.get_device_properties(0)
    print(f"name={torch.cuda.get_device_name(0)}")
    print(f"cc={p.major}.{p.minor}")
    print(f"total_memory={p.total_memory}")
    free, total = torch.cuda.mem_get_info()
    print(f"mem_get_info_total={total}")
    print(f"mem_get_info_free={free}")
    expect(free <= total, f"free {free} > total {total}")


def copies():
    cpu = torch.arange(1 << 20, dtype=torch.float32)
    g = cpu.to("cuda")
    expect(g.is_cuda, "tensor.to('cuda') is not on the device")
    expect(torch.equal(g.cpu(), cpu), "H2D then D2H did not round-trip")
    g2 = torch.empty_like(g)
    g2.copy_(g)  # D2D
    expect(torch.equal(g2.cpu(), cpu), "D2D copy_ did not round-trip")
    back = torch.zeros_like(cpu)
    back.copy_(g2)
    expect(torch.equal(back, cpu), "copy_ to the host did not round-trip")
    m = torch.arange(64 * 64, dtype=torch.int32).reshape(64, 64)
    expect(torch.equal(m.cuda().cpu(), m), "2-D tensor did not round-trip")
    print(f"copied={cpu.numel() * 4}")


def pinned():
    cpu = torch.arange(1 << 18, dtype=torch.float64).pin_memory()
    expect(cpu.is_pinned(), "pin_memory() is not pinned")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        g = cpu.to("cuda", non_blocking=True)
        out = torch.empty(cpu.shape, dtype=cpu.dtype, pin_memory=True)
        out.copy_(g, non_blocking=True)
    s.synchronize()
    expect(torch.equal(out, cpu), "pinned async copies did not round-trip")
    print("pinned=1")


def oom(slice_bytes):
    keep = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    try:
        torch.empty(slice_bytes, dtype=torch.uint8, device="cuda")
        fail("an allocation of the whole slice beside 64 MiB succeeded")
    except torch.cuda.OutOfMemoryError as e:
        print(f"oom={str(e).splitlines()[0][:120]}")
    # The allocator still works after the failure.
    more = torch.ones(16 * MiB, dtype=torch.uint8).cuda()
    expect(int(more.cpu().sum()) == 16 * MiB, "allocation after OOM lost data")
    del keep, more


def expandable():
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    expect("expandable_segments:True" in conf, f"PYTORCH_CUDA_ALLOC_CONF={conf!r}")
    tensors = []
    for n in (1, 3, 20, 70, 5):
        cpu = torch.full((n * MiB,), n, dtype=torch.uint8)
        tensors.append((cpu, cpu.cuda()))
    for cpu, g in tensors:
        expect(torch.equal(g.cpu(), cpu), f"expandable segment of {cpu.numel()} bytes lost data")
    reserved = torch.cuda.memory_reserved()
    del tensors
    torch.cuda.empty_cache()
    print(f"reserved={reserved}")
    print(f"reserved_after_empty_cache={torch.cuda.memory_reserved()}")
    expect(torch.cuda.memory_reserved() < reserved, "empty_cache released nothing")


def graph():
    src = torch.arange(4096, dtype=torch.float32).cuda()
    dst = torch.zeros_like(src)
    host = torch.zeros(4096, dtype=torch.float32).pin_memory()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            dst.copy_(src)
            host.copy_(dst, non_blocking=True)
    torch.cuda.synchronize()
    src.copy_(torch.arange(4096, dtype=torch.float32) * 2)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    expect(torch.equal(host, torch.arange(4096, dtype=torch.float32) * 2),
           "graph replay did not copy the new source")
    print("replays=3")


def stats():
    torch.cuda.reset_peak_memory_stats()
    a = torch.empty(32 * MiB, dtype=torch.uint8, device="cuda")
    st = torch.cuda.memory_stats()
    print(f"allocated={torch.cuda.memory_allocated()}")
    print(f"peak={st['allocated_bytes.all.peak']}")
    expect(torch.cuda.memory_allocated() >= 32 * MiB, "memory_allocated misses 32 MiB")
    del a
    expect(torch.cuda.memory_allocated() < 32 * MiB, "memory_allocated after del")


def nvml():
    a = torch.empty(48 * MiB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    time.sleep(0.25)  # libnvidia-ml.so.1 refreshes the node's status at most every 100 ms
    print(f"utilization={torch.cuda.utilization()}")
    print(f"nvml_memory_usage={torch.cuda.memory_usage()}")
    procs = torch.cuda.list_gpu_processes()
    print("processes=" + procs.replace("\n", "|"))
    expect(f"process {os.getpid():>10d}" in procs, f"list_gpu_processes lacks this pid: {procs}")
    expect(torch.cuda._raw_device_count_nvml() == 1, "NVML device count")
    import pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
    free, total = torch.cuda.mem_get_info()
    print(f"nvml_total={mem.total}")
    expect(mem.total == total, f"NVML total {mem.total} != mem_get_info total {total}")
    expect(mem.used >= 48 * MiB, f"NVML used {mem.used} misses torch's 48 MiB")
    del a


CHECKS = {"device": device, "copies": copies, "pinned": pinned, "expandable": expandable,
          "graph": graph, "stats": stats, "nvml": nvml}
which = sys.argv[1]
if which == "oom":
    oom(int(sys.argv[2]))
elif which in CHECKS:
    CHECKS[which]()
else:
    fail(f"unknown check {which!r}; known: oom, {', '.join(CHECKS)}")
print(f"PASS {which}")
