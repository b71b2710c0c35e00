"""cudarc (Rust, dynamic loading of libcuda.so) through the shim."""
from support import assert_ok, run_client, stdout_value


def test_cudarc_smoke(programs, server):
    res = run_client(programs, server.unix, [programs.cudarc])
    assert_ok(res, ["PASS device_info", "PASS htod_dtoh", "PASS alloc", "PASS stream",
                    "PASS cudarc_smoke"])
    assert stdout_value(res, "name") == "gpufuse emulated GPU"


def test_cudarc_smoke_over_tcp(programs, server):
    res = run_client(programs, server.tcp, [programs.cudarc])
    assert_ok(res, ["PASS cudarc_smoke"])
