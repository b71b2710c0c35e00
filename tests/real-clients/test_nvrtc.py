"""NVRTC 12.9 and 13.5: PTX compiled at run time, cuModuleLoadData, cuLaunchKernel with
kernelParams and with the `extra` packed buffer (nvrtc_launch.c); and kernels of many kinds
checked against the CPU (nvrtc_kernels.c)."""
import os
import subprocess

import pytest

from support import GPUFUSE, HERE, assert_ok, run_client

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


def test_the_dlsym_hook_keeps_rtld_next(tmp_path):
    """The NVRTC interposer defines dlsym (for programs that look NVRTC up in their own
    handle); another interposer's dlsym(RTLD_NEXT) must still skip that interposer, and a
    handle's lookups still answer, in either preload order."""
    lib, main = tmp_path / "libinter.so", tmp_path / "main"
    stubs = HERE / "stubs"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", lib, stubs / "rtld_next_interposer.c",
                    "-ldl"], check=True)
    subprocess.run(["gcc", "-o", main, stubs / "rtld_next_main.c", "-ldl", "-lm"], check=True)
    nvrtc = GPUFUSE.parent / "libgpufuse_nvrtc.so"
    assert nvrtc.exists(), nvrtc
    for preload in (f"{nvrtc} {lib}", f"{lib} {nvrtc}"):
        res = subprocess.run([main], env={**os.environ, "LD_PRELOAD": preload},
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0 and res.stdout == "[wrapped] cos ok\n", (preload, res)
