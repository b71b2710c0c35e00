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


# NVIDIA's libraries as PyTorch drives them, on the emulated GPU of every architecture family:
# cuBLASLt matmuls in every precision (fp32, tf32, fp16, bf16, fp8, int8), cuDNN convolutions
# forward and backward, scaled-dot-product attention, a one-rank NCCL communicator, cuFFT,
# torch.compile. Issue 27: every bf16/fp16 product killed the process (cuBLASLt dereferenced a
# refused export table). Their kernels exist only as SASS, so on the emulated GPU each
# operation ends in the clean error a GPU of another architecture gives ("no kernel image");
# nothing may crash, and NCCL's one-rank all-reduce (a copy) computes.
LIBRARIES = HERE / "python" / "torch_libraries.py"


@pytest.fixture(scope="module", params=["sm_80", "sm_90", "sm_100", "sm_120"])
def model_server(request):
    # About two minutes a model on two cores (torch.compile's Triton build is most of it): the
    # second pass of the tier (GPUFUSE_TEST_TRANSPORT=socket) runs the H200-like model only.
    if os.environ.get("GPUFUSE_TEST_TRANSPORT") == "socket" and request.param != "sm_90":
        pytest.skip("one model over the socket; every model runs over the rings")
    from conftest import _model_server
    server = _model_server(request.param)
    yield server
    server.stop()


def test_nvidia_libraries_through_pytorch_never_crash(programs, model_server, torch_py):
    res = run_client(programs, model_server.unix, [torch_py, LIBRARIES, "all"], vram="4GiB",
                     env={"GPUFUSE_LOG": "debug", "NCCL_DEBUG": "WARN"}, timeout=600)
    where = f"exit {res.returncode}\n{res.stdout[-3000:]}\n--- stderr ---\n{res.stderr[-3000:]}"
    started = [l.split()[1] for l in res.stdout.splitlines() if l.startswith("START ")]
    ended = {l.split()[1]: l for l in res.stdout.splitlines()
             if l.split()[:1] in (["PASS"], ["CLEAN_ERROR"], ["SKIP"], ["WRONG"])}
    assert res.returncode >= 0, f"killed by signal {-res.returncode} in {started[-1:]}\n{where}"
    assert res.returncode == 0, f"a result was wrong\n{where}"
    missing = [c for c in started if c not in ended]
    assert not missing and len(ended) == 12, f"checks without a verdict: {missing}\n{where}"
    for name, line in ended.items():
        if line.startswith("CLEAN_ERROR"):
            assert "no kernel image" in line or "NoKernelImage" in line, (
                f"{name} failed with another error than a GPU of another architecture gives: "
                f"{line}\n{where}")
    # NCCL's one-rank all-reduce is a copy, and computes (on the 12.0 model NCCL refused to
    # start while the model counted every module-scope shared variable for every kernel).
    assert ended["nccl_one_rank"].startswith("PASS"), where
    # ... and frees what it mapped: a retained allocation handle is one more reference, which
    # NCCL's second cuMemRelease gives back (it failed with 1 before).
    assert "ncclCuMemFree" not in res.stderr and "commReclaim" not in res.stderr, where
    # On Hopper cuBLASLt's heuristic asks for the 1734dc26 table (the crash of issue 27).
    if model_server.devices.endswith("sm_90"):
        assert "export table GPU_TOPOLOGY_1734DC26 (1734dc26800d47458726c0f1e7dd8bca) " \
            "served" in res.stderr, where
    assert "unknown export table" not in res.stderr, where
