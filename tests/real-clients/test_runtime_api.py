"""CUDA runtime API (libcudart 12.9 and 13.5, host code built with gcc) through the shim."""
import pytest

import support
from support import assert_ok, run_client, stdout_value

CHECKS = [
    "device_props", "alloc_free", "memcpy_all_directions", "memset", "memcpy_2d",
    "pinned_host", "mem_info", "pointer_attributes", "streams", "events",
    "async_stream_order", "error_paths", "threads", "device_reset", "graph_nodes",
    "pinned_zero_copy", "thread_exit_calls",
]
VERSIONS = [12, 13]


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("cuda", VERSIONS, ids=["cudart12.9", "cudart13.5"])
def test_runtime_check(programs, server, cuda, check):
    res = run_client(programs, server.unix, [programs.rt[cuda], check])
    assert_ok(res, [f"PASS {check}"])


@pytest.mark.parametrize("cuda", VERSIONS, ids=["cudart12.9", "cudart13.5"])
def test_every_check_in_one_process(programs, server, cuda):
    res = run_client(programs, server.unix, [programs.rt[cuda], "all"])
    assert_ok(res, [f"PASS {c}" for c in CHECKS])


@pytest.mark.parametrize("cuda", VERSIONS, ids=["cudart12.9", "cudart13.5"])
def test_device_properties_match_server_status(programs, server, cuda):
    res = run_client(programs, server.unix, [programs.rt[cuda], "device_props"])
    assert_ok(res, ["PASS device_props"])
    dev = server.status()["devices"][0]
    assert stdout_value(res, "name") == dev["name"]
    assert stdout_value(res, "name") == "gpufuse emulated GPU"
    assert stdout_value(res, "cc") == "10.0"  # the documented device model (crates/device/src/model.rs)
    assert int(stdout_value(res, "totalGlobalMem")) == dev["total_bytes"] == support.DEVICE_BYTES


@pytest.mark.parametrize("check", ["memcpy_all_directions", "async_stream_order", "threads"])
@pytest.mark.parametrize("cuda", VERSIONS, ids=["cudart12.9", "cudart13.5"])
def test_runtime_check_over_tcp(programs, server, cuda, check):
    res = run_client(programs, server.tcp, [programs.rt[cuda], check])
    assert_ok(res, [f"PASS {check}"])
