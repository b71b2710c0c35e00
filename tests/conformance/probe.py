#!/usr/bin/env python3
"""The conformance probe's Python half: what cuda-python, PyTorch and CuPy report about the
device, one `key = value` line per fact (the format of probe.c), so that the output natively and
through gpufuse on the same GPU can be diffed with scripts/conformance-diff.py.

    python3 tests/conformance/probe.py
    gpufuse run --server unix:/tmp/g.sock -- python3 tests/conformance/probe.py

Every library is optional (`torch = absent`), every fact is wrapped: a failure prints
`error <ExceptionType>: <first line>` as its value and the probe goes on. Keys that start with
`intended.` may differ (memory totals of a slice, UUIDs, PCI location: docs/conformance.md).
"""
from __future__ import annotations

import sys
import traceback

LINES: list[str] = []


def out(key: str, value) -> None:
    if isinstance(value, bytes):
        value = value.hex()
    text = str(value).replace("\n", " ").strip()
    line = f"{key} = {text}"
    LINES.append(line)
    print(line, flush=True)


def err(e: BaseException) -> str:
    msg = str(e).splitlines()[0] if str(e) else ""
    return f"error {type(e).__name__}: {msg}"[:200]


def fact(key: str, fn) -> object:
    try:
        v = fn()
    except Exception as e:  # noqa: BLE001 - every failure is a fact
        out(key, err(e))
        return None
    out(key, v)
    return v


# Property names whose values are addresses, identifiers of this machine or sizes of a slice.
INTENDED_WORDS = ("uuid", "luid", "pci", "totalglobalmem", "total_memory", "mem_get_info")


def intended(name: str) -> bool:
    n = name.lower().replace("_", "")
    return any(w.replace("_", "") in n for w in INTENDED_WORDS)


def canon(v) -> str:
    """A stable text for a property value (bytes as hex, floats rounded)."""
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (bytes, bytearray)):
        text = bytes(v).split(b"\0")[0]
        if text and all(32 <= c < 127 for c in text):
            return text.decode()
        return bytes(v).hex()
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(canon(x) for x in v) + "]"
    return str(v)


# ---- cuda-python ---------------------------------------------------------------------------

def cuda_python() -> None:
    try:
        from cuda.bindings import driver as cu  # cuda-python 12.6+ / 13
    except Exception:
        try:
            from cuda import cuda as cu  # older cuda-python
        except Exception as e:  # noqa: BLE001
            out("cuda_python", f"absent ({type(e).__name__})")
            return
    try:
        import cuda.bindings as cb
        out("cuda_python.version", getattr(cb, "__version__", "unknown"))
    except Exception:  # noqa: BLE001
        pass

    def call(key, f, *args):
        """cuda-python returns (CUresult, values...): `error N` on failure, else the values."""
        try:
            res = f(*args)
        except Exception as e:  # noqa: BLE001
            out(key, err(e))
            return None
        if not isinstance(res, tuple):
            res = (res,)
        rc = int(res[0])
        if rc != 0:
            out(key, f"error {rc}")
            return None
        vals = res[1:]
        return vals[0] if len(vals) == 1 else vals

    if call("cuda_python.cuInit", cu.cuInit, 0) is not None:
        out("cuda_python.cuInit", "0")
    v = call("cuda_python.driver_version", cu.cuDriverGetVersion)
    if v is not None:
        out("cuda_python.driver_version", v)
    n = call("cuda_python.device_count", cu.cuDeviceGetCount)
    if n is not None:
        out("cuda_python.device_count", n)
    d = call("cuda_python.device_get_0", cu.cuDeviceGet, 0)
    if d is None:
        return
    name = call("cuda_python.name", cu.cuDeviceGetName, 256, d)
    if name is not None:
        out("cuda_python.name", bytes(name).split(b"\0")[0].decode(errors="replace"))
    total = call("intended.cuda_python.total_mem", cu.cuDeviceTotalMem, d)
    if total is not None:
        out("intended.cuda_python.total_mem", total)
    # Every attribute cuda-python's enum knows, by name.
    try:
        attrs = sorted(((int(a), a.name) for a in cu.CUdevice_attribute
                        if not a.name.endswith("_MAX")), key=lambda t: t[0])
    except Exception as e:  # noqa: BLE001
        out("cuda_python.attributes", err(e))
        attrs = []
    seen = set()
    for num, an in attrs:
        if num in seen:
            continue
        seen.add(num)
        short = an.replace("CU_DEVICE_ATTRIBUTE_", "")
        pre = "intended." if num in (33, 34, 50) else ""
        key = f"{pre}cuda_python.attr.{num:03d}.{short}"
        val = call(key, cu.cuDeviceGetAttribute, cu.CUdevice_attribute(num), d)
        if val is not None:
            out(key, val)
    ctx = call("cuda_python.primary_ctx_retain", cu.cuDevicePrimaryCtxRetain, d)
    if ctx is None:
        return
    out("cuda_python.primary_ctx_retain", "0")
    call("cuda_python.ctx_set_current", cu.cuCtxSetCurrent, ctx)
    mem = call("intended.cuda_python.mem_get_info", cu.cuMemGetInfo)
    if mem is not None:
        out("intended.cuda_python.mem_get_info", f"free={mem[0]} total={mem[1]}")
    try:
        limits = [(int(x), x.name) for x in cu.CUlimit if not x.name.endswith("_MAX")]
    except Exception:  # noqa: BLE001
        limits = []
    for num, ln in sorted(limits):
        key = f"cuda_python.limit.{num:02d}.{ln.replace('CU_LIMIT_', '')}"
        val = call(key, cu.cuCtxGetLimit, cu.CUlimit(num))
        if val is not None:
            out(key, val)
    ptr = call("cuda_python.mem_alloc", cu.cuMemAlloc, 4096)
    if ptr is not None:
        out("cuda_python.mem_alloc", "0")
        mt = call("cuda_python.ptr.memory_type", cu.cuPointerGetAttribute,
                  cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr)
        if mt is not None:
            out("cuda_python.ptr.memory_type", int(mt))
        if call("cuda_python.mem_free", cu.cuMemFree, ptr) is not None:
            out("cuda_python.mem_free", "0")
    call("cuda_python.primary_ctx_release", cu.cuDevicePrimaryCtxRelease, d)


# ---- PyTorch -------------------------------------------------------------------------------

def torch_facts() -> None:
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        out("torch", f"absent ({type(e).__name__})")
        return
    out("torch.version", torch.__version__)
    fact("torch.version_cuda", lambda: torch.version.cuda)
    if not fact("torch.cuda.is_available", torch.cuda.is_available):
        return
    fact("torch.cuda.device_count", torch.cuda.device_count)
    fact("torch.cuda.get_device_name", lambda: torch.cuda.get_device_name(0))
    fact("torch.cuda.get_device_capability", lambda: torch.cuda.get_device_capability(0))
    fact("torch.cuda.get_arch_list_has_sm_90",
         lambda: "sm_90" in torch.cuda.get_arch_list())
    try:
        props = torch.cuda.get_device_properties(0)
        names = sorted(n for n in dir(props) if not n.startswith("_"))
        for n in names:
            try:
                v = getattr(props, n)
            except Exception as e:  # noqa: BLE001
                out(f"torch.props.{n}", err(e))
                continue
            if callable(v):
                continue
            key = f"{'intended.' if intended(n) else ''}torch.props.{n}"
            out(key, canon(v))
    except Exception as e:  # noqa: BLE001
        out("torch.props", err(e))
    mem = fact("intended.torch.cuda.mem_get_info", lambda: torch.cuda.mem_get_info(0))
    if mem:
        out("torch.cuda.mem_get_info.free_le_total", "yes" if mem[0] <= mem[1] else "no")
    fact("torch.backends.cudnn.is_available", torch.backends.cudnn.is_available)
    fact("torch.backends.cudnn.version", torch.backends.cudnn.version)
    fact("torch.cuda.nccl_version", lambda: torch.cuda.nccl.version())
    fact("torch.cuda.is_bf16_supported", torch.cuda.is_bf16_supported)
    fact("torch.backends.cuda.matmul.allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32)
    fact("torch.backends.cuda.flash_sdp_enabled", torch.backends.cuda.flash_sdp_enabled)
    # A small computation, to know the runtime works at all (values, not timings).
    fact("torch.compute.sum_arange_1000",
         lambda: int(torch.arange(1000, device="cuda").sum().item()))
    fact("torch.compute.matmul_64",
         lambda: float(torch.ones(64, 64, device="cuda").matmul(
             torch.ones(64, 64, device="cuda")).sum().item()))
    fact("torch.cuda.memory_allocated_after", lambda: torch.cuda.memory_allocated(0) >= 0)
    fact("torch.cuda.current_stream_is_default",
         lambda: torch.cuda.current_stream() == torch.cuda.default_stream())
    fact("torch.cuda.synchronize", lambda: torch.cuda.synchronize() or "ok")


# ---- CuPy ------------------------------------------------------------------------------------

def cupy_facts() -> None:
    try:
        import cupy
    except Exception as e:  # noqa: BLE001
        out("cupy", f"absent ({type(e).__name__})")
        return
    out("cupy.version", cupy.__version__)
    rt = cupy.cuda.runtime
    fact("cupy.runtime.driverGetVersion", rt.driverGetVersion)
    fact("cupy.runtime.runtimeGetVersion", rt.runtimeGetVersion)
    fact("cupy.runtime.getDeviceCount", rt.getDeviceCount)
    try:
        props = rt.getDeviceProperties(0)
        for k in sorted(props):
            key = f"{'intended.' if intended(k) else ''}cupy.props.{k}"
            out(key, canon(props[k]))
    except Exception as e:  # noqa: BLE001
        out("cupy.props", err(e))
    mem = fact("intended.cupy.runtime.memGetInfo", rt.memGetInfo)
    if mem:
        out("cupy.runtime.memGetInfo.free_le_total", "yes" if mem[0] <= mem[1] else "no")
    fact("cupy.compute.sum_arange_1000", lambda: int(cupy.arange(1000).sum()))
    fact("cupy.runtime.deviceSynchronize", lambda: rt.deviceSynchronize() or "ok")


def main() -> int:
    out("probe_py.format", "1")
    for label, fn in (("cuda_python", cuda_python), ("torch", torch_facts), ("cupy", cupy_facts)):
        try:
            fn()
            out(f"section_py.{label}", "ok")
        except BaseException as e:  # noqa: BLE001
            out(f"section_py.{label}", err(e))
            traceback.print_exc(file=sys.stderr)
    out("probe_py.complete", "yes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
