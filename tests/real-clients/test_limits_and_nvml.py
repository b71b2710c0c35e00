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
    assert_ok(res, ["PASS nvml_queries", "fan=not supported", "power=not supported"])
    assert int(stdout_value(res, "resolved")) > 400
    assert int(stdout_value(res, "total")) == 2 * GiB
    assert int(stdout_value(res, "used")) >= 96 << 20
