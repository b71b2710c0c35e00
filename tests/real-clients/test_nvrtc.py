"""NVRTC 12.9 and 13.5: PTX compiled at run time, cuModuleLoadData, cuLaunchKernel with
kernelParams and with the `extra` packed buffer (nvrtc_launch.c); and kernels of many kinds
checked against the CPU (nvrtc_kernels.c)."""
import pytest

from support import assert_ok, run_client

VERSIONS = [12, 13]
IDS = ["nvrtc12.9", "nvrtc13.5"]


@pytest.mark.parametrize("cuda", VERSIONS, ids=IDS)
def test_nvrtc_module_launches(programs, server, cuda):
    res = run_client(programs, server.unix, [programs.nvrtc[cuda], "--launch-only"])
    assert_ok(res, ["launched kernelParams", "launched extra", "PASS nvrtc_launch (launches only)"])


@pytest.mark.kernel_results
@pytest.mark.parametrize("cuda", VERSIONS, ids=IDS)
def test_nvrtc_cubin_for_the_device(programs, server, cuda):
    """NVRTC's cubin for the device's own architecture (sm_100 on the emulated GPU), as NVIDIA's
    *_nvrtc samples load it: SASS only, which the emulated GPU ran nothing of
    (CUDA_ERROR_NO_BINARY_FOR_GPU at the launch) until gpufuse run preloaded its NVRTC
    interposer, whose nvrtcGetCUBIN gives a fatbin of the cubin and its PTX."""
    res = run_client(programs, server.unix, [programs.nvrtc[cuda], "--cubin"])
    assert_ok(res, ["cubin_bytes=", "PASS nvrtc_launch (results checked)"])


@pytest.mark.kernel_results
@pytest.mark.parametrize("cuda", VERSIONS, ids=IDS)
def test_nvrtc_kernel_results(programs, server, cuda):
    res = run_client(programs, server.unix, [programs.nvrtc[cuda]])
    assert_ok(res, ["PASS nvrtc_launch (results checked)"])


NVRTC_CHECKS = ["templates", "warp_reduce", "histogram", "dynamic_shared", "constant", "math",
                "fast_math"]


@pytest.mark.kernel_results
@pytest.mark.parametrize("check", NVRTC_CHECKS)
@pytest.mark.parametrize("cuda", VERSIONS, ids=IDS)
def test_nvrtc_kernel_check(programs, server, cuda, check):
    """nvrtc_kernels.c: kernels compiled by NVRTC at run time, results against the CPU."""
    res = run_client(programs, server.unix, [programs.nvrtc_kernels[cuda], check])
    assert_ok(res, [f"nvrtc={cuda}.", "checked", f"PASS {check} (results checked)"])
