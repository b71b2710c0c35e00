"""nvcc 13.5 programs with kernels (-arch=sm_80; static cudart, and -cudart shared)."""
import pytest

import support
from support import assert_ok, run_client

PROGRAMS = support.KERNEL_SOURCES + [f"{n}_shared" for n in support.SHARED_CUDART_KERNELS]


def _stem(name):
    return name.removesuffix("_shared")


@pytest.mark.parametrize("prog", PROGRAMS)
def test_launches_succeed_and_synchronize(programs, server, prog):
    res = run_client(programs, server.unix, [programs.kernels[prog], "--launch-only"])
    assert_ok(res, [f"PASS {_stem(prog)} (launches only)"])


@pytest.mark.kernel_results
@pytest.mark.parametrize("prog", PROGRAMS)
def test_kernel_results(programs, server, prog):
    res = run_client(programs, server.unix, [programs.kernels[prog]])
    assert_ok(res, [f"PASS {_stem(prog)} (results checked)"])


def test_launches_over_tcp(programs, server):
    res = run_client(programs, server.tcp, [programs.kernels["params"], "--launch-only"])
    assert_ok(res, ["PASS params (launches only)"])
