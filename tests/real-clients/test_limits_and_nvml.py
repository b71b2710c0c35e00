"""A session's VRAM slice (`gpufuse run --vram`), and NVML (nvidia-ml-py) through the shim."""
import pytest

import support
from support import HERE, assert_ok, run_client, stdout_value

GiB = 1 << 30


@pytest.mark.parametrize("cuda", [12, 13], ids=["cudart12.9", "cudart13.5"])
def test_vram_limit_is_the_sessions_device_memory(programs, server, cuda):
    res = run_client(programs, server.unix, [programs.rt[cuda], "vram_limit"], vram="2GiB")
    assert_ok(res, ["PASS vram_limit"])
    assert int(stdout_value(res, "total")) == 2 * GiB


def test_nvml_sees_the_emulated_device(programs, server):
    res = run_client(programs, server.unix, [programs.python, HERE / "python" / "nvml_info.py"])
    assert_ok(res, ["PASS nvml"])
    assert stdout_value(res, "name") == "gpufuse emulated GPU"
    assert stdout_value(res, "cc") == "10.0"  # the documented device model (crates/device/src/model.rs)
    assert int(stdout_value(res, "total")) == support.DEVICE_BYTES


def test_nvml_sees_the_sessions_slice(programs, server):
    res = run_client(programs, server.unix, [programs.python, HERE / "python" / "nvml_info.py"],
                     vram="3GiB")
    assert_ok(res, ["PASS nvml"])
    assert int(stdout_value(res, "total")) == 3 * GiB


def test_nvml_exports_the_whole_header_and_answers_pytorchs_queries(programs, server):
    """Every function of nvml.h resolves (PyTorch's libraries resolve e.g.
    nvmlDeviceGetNvLinkRemoteDeviceType and assert when one is missing); handle by PCI bus id,
    "Not Supported" for power, clocks and fans, and the session in the process list with the
    memory it holds, consistent with cuMemGetInfo's slice."""
    table = HERE.parent.parent / "crates" / "nvml-shim" / "nvml_functions.tsv"
    res = run_client(programs, server.unix,
                     [programs.python, HERE / "python" / "nvml_queries.py", table], vram="2GiB")
    assert_ok(res, ["PASS nvml_queries", "fan=not supported", "power=not supported",
                    "p2p_self=ok"])
    assert int(stdout_value(res, "resolved")) > 400
    assert int(stdout_value(res, "total")) == 2 * GiB
    assert int(stdout_value(res, "used")) >= 96 << 20


@pytest.mark.skipif(support.NATIVE, reason="a native run has no slice")
def test_a_larger_device_heap_is_charged_to_the_slice(programs, server):
    """cudaDeviceSetLimit(cudaLimitMallocHeapSize, 96 MiB) charges what the heap adds beyond
    CUDA's 8 MiB default to the session: in a 100 MiB slice 12 MiB stay free; in a 50 MiB
    slice the limit is refused with cudaErrorMemoryAllocation, nothing charged."""
    prog = programs.kernels["device_io"]
    res = run_client(programs, server.unix, [prog, "heap_limit"], vram="100MiB")
    assert_ok(res, ["PASS heap_limit (results checked)"])
    assert "(free memory 100 -> 12 MiB)" in res.stdout, res.stdout
    res = run_client(programs, server.unix, [prog, "heap_limit"], vram="50MiB")
    assert res.returncode != 0, res.stdout
    assert "cudaDeviceSetLimit(cudaLimitMallocHeapSize, 96u << 20) returned 2" in res.stderr + \
        res.stdout, res.stderr
