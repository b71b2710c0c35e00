"""Lazy module loading and the node's image cache (docs/module-loading.md): images reach the
worker at their first use, by content hash first; a second process loading the same libraries
sends no image bytes; a corrupt cache entry is dropped and the image sent again; the errors of a
load stay at the load; CUDA_MODULE_LOADING=EAGER loads at once."""
import os
from pathlib import Path

import pytest

from support import GPUFUSE, HERE, Server, assert_ok, run_client, stdout_value

MiB = 1 << 20
PY = HERE / "python"
# The emulated GPU executes PTX: make CuPy embed PTX instead of an sm_80 cubin.
CUPY_PTX = {"CUPY_COMPILE_WITH_PTX": "1"}
COUNTS = ("received", "received_bytes", "hits", "hit_bytes", "corrupt")


@pytest.fixture
def fresh_server():
    """A server of its own, with an empty image cache."""
    s = Server()
    s.start()
    yield s
    s.stop()


def counts(server):
    c = server.status()["image_cache"]
    return {k: c[k] for k in COUNTS}


def since(before, server):
    after = counts(server)
    return {k: after[k] - before[k] for k in COUNTS}


def cupy_run(programs, server):
    res = run_client(programs, server.unix,
                     [programs.python, PY / "cupy_kernels.py", "--launch-only"], env=CUPY_PTX)
    assert_ok(res, ["PASS cupy_kernels (launches only)"])


def test_a_second_cupy_process_sends_no_image_bytes(programs, fresh_server):
    cache = fresh_server.status()["image_cache"]
    assert cache["dir"] == str(fresh_server.dir / "images")
    cupy_run(programs, fresh_server)
    first = counts(fresh_server)
    assert first["received"] > 0 and first["received_bytes"] > 0, first
    assert fresh_server.status()["image_cache"]["entries"] == first["received"]
    cupy_run(programs, fresh_server)
    second = since(first, fresh_server)
    assert second["received_bytes"] == 0, f"the second run sent image bytes: {second}"
    assert second["hits"] == first["received"], second
    assert second["hit_bytes"] == first["received_bytes"], second


def test_a_corrupt_cache_entry_is_dropped_and_the_image_sent_again(programs, fresh_server):
    cupy_run(programs, fresh_server)
    first = counts(fresh_server)
    entries = [p for p in (fresh_server.dir / "images").iterdir() if len(p.name) == 64]
    assert len(entries) == first["received"]
    for p in entries:
        data = bytearray(p.read_bytes())
        data[len(data) // 2] ^= 0xFF
        p.write_bytes(bytes(data))
    cupy_run(programs, fresh_server)
    second = since(first, fresh_server)
    assert second["corrupt"] == len(entries), second
    assert second["hits"] == 0, second
    assert second["received_bytes"] == first["received_bytes"], second
    # The images sent again replaced the corrupt entries: a third run finds them.
    third_before = counts(fresh_server)
    cupy_run(programs, fresh_server)
    third = since(third_before, fresh_server)
    assert third["received_bytes"] == 0 and third["hits"] == first["received"], third


@pytest.mark.parametrize("mode", ["lazy", "eager"])
def test_images_load_at_first_use_and_load_errors_stay_at_the_load(programs, server, mode):
    env = {"CUDA_MODULE_LOADING": "EAGER"} if mode == "eager" else {}
    env["GPUFUSE_SERVER"] = server.unix
    res = run_client(programs, server.unix, [programs.python, PY / "module_loading.py", GPUFUSE],
                     env=env)
    assert_ok(res, ["PASS module_loading"])
    assert stdout_value(res, "loading_mode") == mode
    if mode == "lazy":
        assert stdout_value(res, "loads_at_module_load") == "0"
        assert stdout_value(res, "loads_at_library_load") == "0"
    else:
        assert stdout_value(res, "loads_at_module_load") == "1"
        assert stdout_value(res, "loads_at_library_load") == "1"
    assert stdout_value(res, "loads_at_get_function") == "1"
    assert stdout_value(res, "loads_at_get_kernel") == "1"
    assert stdout_value(res, "missing_kernel") == "CUDA_ERROR_NOT_FOUND"
    assert stdout_value(res, "foreign_sass") == "CUDA_ERROR_NO_BINARY_FOR_GPU"
    assert stdout_value(res, "malformed_fatbin") == "CUDA_ERROR_INVALID_IMAGE"


def torch_python() -> Path:
    py = Path(os.environ.get("GPUFUSE_TORCH_PY") or HERE.parent.parent / ".deps/torch/bin/python")
    if not py.exists():
        pytest.fail(f"no PyTorch venv at {py}: run scripts/setup-test-deps.sh", pytrace=False)
    return py


def test_a_second_torch_start_sends_under_a_mebibyte_of_images(programs, fresh_server):
    """PyTorch registers about 330 MiB of fatbins; only the first op's image is loaded, and the
    second process finds it in the node's cache."""
    torch_py = torch_python()

    def start():
        res = run_client(programs, fresh_server.unix, [torch_py, PY / "startup_torch.py"])
        assert_ok(res, ["PASS startup_torch"])
        return res

    start()
    first = counts(fresh_server)
    assert 0 < first["received_bytes"] < 64 * MiB, first
    start()
    second = since(first, fresh_server)
    assert second["received_bytes"] < MiB, second
    assert second["hits"] >= 1, second
