"""PyTorch (the CUDA 13 wheel from PyPI, tests/real-clients/requirements-torch.txt) through
gpufuse's libcuda.so.1 and libnvidia-ml.so.1. PyTorch's own kernels are SASS-only, so these are
its host-side paths: the device and its slice, copies, pinned memory, out-of-memory, graphs of
copies, the caching allocator's statistics and the NVML queries torch makes."""
import os
from pathlib import Path

import pytest

from support import HERE, assert_ok, run_client, stdout_value

GiB = 1 << 30
MiB = 1 << 20
CHECKS = HERE / "python" / "torch_checks.py"


@pytest.fixture(scope="module")
def torch_py():
    py = Path(os.environ.get("GPUFUSE_TORCH_PY") or HERE.parent.parent / ".deps/torch/bin/python")
    if not py.exists():
        pytest.fail(f"no PyTorch venv at {py}: run scripts/setup-test-deps.sh", pytrace=False)
    return py


def torch_run(programs, server, torch_py, *args, vram="2GiB", env=None):
    return run_client(programs, server.unix, [torch_py, CHECKS, *map(str, args)], vram=vram,
                      env=env)


def test_torch_sees_the_device_and_its_slice(programs, server, torch_py):
    res = torch_run(programs, server, torch_py, "device", vram="3GiB")
    assert_ok(res, ["PASS device"])
    assert stdout_value(res, "name") == "gpufuse emulated GPU"
    assert int(stdout_value(res, "mem_get_info_total")) == 3 * GiB
    assert int(stdout_value(res, "total_memory")) == 3 * GiB
    # Only the context's own bookkeeping is in use before the first tensor.
    assert int(stdout_value(res, "mem_get_info_free")) > 3 * GiB - 64 * MiB


def test_torch_copies_round_trip(programs, server, torch_py):
    assert_ok(torch_run(programs, server, torch_py, "copies"), ["PASS copies"])


def test_torch_pinned_memory_and_async_copies(programs, server, torch_py):
    assert_ok(torch_run(programs, server, torch_py, "pinned"), ["PASS pinned"])


def test_torch_allocation_over_the_slice_is_out_of_memory_error(programs, server, torch_py):
    res = torch_run(programs, server, torch_py, "oom", 2 * GiB)
    assert_ok(res, ["PASS oom"])
    assert "CUDA out of memory" in stdout_value(res, "oom")


def test_torch_graph_of_copies_captures_and_replays(programs, server, torch_py):
    assert_ok(torch_run(programs, server, torch_py, "graph"), ["PASS graph", "replays=3"])


def test_torch_memory_stats(programs, server, torch_py):
    res = torch_run(programs, server, torch_py, "stats")
    assert_ok(res, ["PASS stats"])
    assert int(stdout_value(res, "peak")) >= 32 * MiB


def test_torch_nvml_queries_see_the_slice_and_the_session(programs, server, torch_py):
    res = torch_run(programs, server, torch_py, "nvml", vram="2GiB")
    assert_ok(res, ["PASS nvml"])
    assert int(stdout_value(res, "nvml_total")) == 2 * GiB


def test_torch_expandable_segments(programs, server, torch_py):
    """PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: PyTorch maps physical memory into one
    growing reservation (cuMemCreate/cuMemMap) and places tensors across adjacent mappings,
    which copies and kernels then span."""
    res = torch_run(programs, server, torch_py, "expandable",
                    env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert_ok(res, ["PASS expandable"])
