"""CuPy (cupy-cuda12x) and cuda-python (cuda.bindings) through the shim."""
import shutil

import pytest

from support import HERE, NATIVE, TRANSPORT, assert_ok, run_client

PY = HERE / "python"
CUPY_CHECKS = ["device", "transfers", "runtime_calls", "memory_info", "streams_events"]
# The emulated GPU executes PTX: make CuPy embed PTX instead of an sm_80 cubin.
CUPY_PTX = {"CUPY_COMPILE_WITH_PTX": "1"}


@pytest.mark.parametrize("check", CUPY_CHECKS)
def test_cupy(programs, server, check):
    res = run_client(programs, server.unix, [programs.python, PY / "cupy_transfers.py", check])
    assert_ok(res, [f"PASS {check}"])


def test_cupy_transfers_over_tcp(programs, server):
    res = run_client(programs, server.tcp, [programs.python, PY / "cupy_transfers.py",
                                            "transfers", "streams_events"])
    assert_ok(res, ["PASS transfers", "PASS streams_events"])


def test_cupy_kernel_launches(programs, server):
    res = run_client(programs, server.unix,
                     [programs.python, PY / "cupy_kernels.py", "--launch-only"], env=CUPY_PTX)
    assert_ok(res, ["PASS cupy_kernels (launches only)"])


@pytest.mark.kernel_results
@pytest.mark.skipif(NATIVE, reason="the NVRTC interposer is gpufuse run's")
def test_cupy_kernels_as_installed(programs, server):
    """CuPy as a user runs it, without CUPY_COMPILE_WITH_PTX: it compiles cubins for the
    device's architecture with an NVRTC it opened itself, and the interposer's dlsym gives it
    a fatbin with the PTX (crates/nvrtc-shim); with it turned off the kernels cannot run."""
    env = {"CUPY_CACHE_DIR": str(HERE / "build" / "cupy-cache-as-installed")}
    shutil.rmtree(env["CUPY_CACHE_DIR"], ignore_errors=True)
    res = run_client(programs, server.unix, [programs.python, PY / "cupy_kernels.py"], env=env)
    assert_ok(res, ["PASS cupy_kernels (results checked)"])
    shutil.rmtree(env["CUPY_CACHE_DIR"], ignore_errors=True)
    env["GPUFUSE_NVRTC_PTX"] = "0"
    res = run_client(programs, server.unix, [programs.python, PY / "cupy_kernels.py"], env=env)
    assert res.returncode != 0 and "NoKernelImageForDevice" in res.stdout + res.stderr, (
        res.stdout[-2000:] + res.stderr[-2000:])


@pytest.mark.kernel_results
@pytest.mark.parametrize("accelerators", ["default", "none"])
def test_cupy_kernel_results(programs, server, accelerators):
    """CuPy's defaults reduce with CUB (device code from CuPy's own fatbins, loaded through
    cudart); with no accelerators every kernel is NVRTC-compiled PTX."""
    env = dict(CUPY_PTX)
    if accelerators == "none":
        env["CUPY_ACCELERATORS"] = ""
    res = run_client(programs, server.unix, [programs.python, PY / "cupy_kernels.py"], env=env)
    assert_ok(res, ["PASS cupy_kernels (results checked)"])


def test_cuda_bindings_driver(programs, server):
    res = run_client(programs, server.unix,
                     [programs.python, PY / "cuda_bindings_driver.py", "--launch-only"])
    assert_ok(res, ["PASS device_queries", "PASS memory", "PASS streams_events",
                    "PASS nvrtc_module_launch", "PASS graph_kernel_node", "PASS memory_pool",
                    "PASS virtual_memory", "PASS compressible_memory",
                    "PASS foreign_sass", "PASS created_context"])


@pytest.mark.kernel_results
@pytest.mark.kernel_results
def test_module_listing(programs, server):
    """cuModuleEnumerateFunctions and its kin, and cuFFT's walk over a module's functions
    (export table 6e163fbe slot 7), which cuFFT needs before it runs anything."""
    res = run_client(programs, server.unix, [programs.python, PY / "module_listing.py"])
    assert_ok(res, ["PASS module_listing", "module functions=3", "library kernels=3",
                    "tools-module walk=3"])


def test_cuda_bindings_textures(programs, server):
    """Texture and surface objects through the driver API: descriptors, errors, kernels."""
    res = run_client(programs, server.unix, [programs.python, PY / "cuda_bindings_textures.py"])
    assert_ok(res, ["PASS errors", "PASS texture", "PASS surface",
                    "PASS cuda_bindings_textures (results checked)"])


@pytest.mark.kernel_results
def test_cuda_bindings_jit_linker(programs, server):
    """cuLink* over NVRTC's relocatable PTX, nvcc's relocatable fatbin and object file; link
    errors name their symbols."""
    res = run_client(programs, server.unix,
                     [programs.python, PY / "cuda_bindings_link.py",
                      programs.kernels["rdc_lib_fatbin"], programs.kernels["rdc_lib_object"]])
    assert_ok(res, ["PASS ptx+ptx", "PASS ptx+fatbin", "PASS ptx+object", "PASS unresolved",
                    "PASS duplicate", "PASS errors", "PASS cuda_bindings_link (results checked)"])


def test_cuda_bindings_posix_fd_ipc(programs, server):
    """Physical memory exported as a POSIX file descriptor and imported by a child process
    (another session): each side reads what the other wrote; the importer is not charged.
    Then an exportable memory pool and one of its pointers, imported the same way."""
    res = run_client(programs, server.unix, [programs.python, PY / "ipc_shareable.py"])
    assert_ok(res, ["child: imported, read, wrote",
                    "child: imported the pool and its pointer, read, wrote, freed",
                    "PASS ipc_shareable (results checked)"])


def test_cuda_bindings_registered_memory(programs, server):
    """cuMemHostRegister'ed NumPy memory copied both ways; on the shared-memory transport its
    whole pages are the host arena's, mapped at the array's own addresses, until unregistered;
    a forked child's pages are its own."""
    transport = "native" if NATIVE else TRANSPORT
    res = run_client(programs, server.unix,
                     [programs.python, PY / "registered_memory.py", transport])
    assert_ok(res, ["PASS registered_copies", "PASS registered_async_copies", "PASS fork",
                    "PASS unregister"])


def test_cuda_bindings_kernel_results(programs, server):
    res = run_client(programs, server.unix, [programs.python, PY / "cuda_bindings_driver.py"])
    assert_ok(res, ["PASS cuda_bindings_driver (results checked)"])


# ---- cupy_custom_kernels.py: one check per process, results against NumPy ------------------------
# CUPY_ACCELERATORS="" (CuPy's own kernels, every one NVRTC-compiled PTX) keeps the cold-cache
# cost low; two checks run with the default accelerators (CUB), whose JIT-compiled block
# reduction takes seconds to build. A check the emulated GPU or the shim gets wrong would be a
# strict xfail with the reason (none today).
CUPY_CUSTOM = [
    ("elementwise", "none", None),
    ("elementwise_f64_trig", "none", None),
    ("reductions", "none", None),
    ("elementwise_kernel", "none", None),
    ("reduction_kernel", "none", None),
    ("reduction_kernel_l2", "default", None),
    ("raw_module", "none", None),
    ("scan", "none", None),
    ("scan", "default", None),
    ("sort", "none", None),
    ("sort_nd", "default", None),
    ("partition", "none", None),
]


def _cupy_custom_params():
    for check, accel, reason in CUPY_CUSTOM:
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        yield pytest.param(check, accel, id=f"{check}-{accel}", marks=marks)


@pytest.mark.kernel_results
def test_cupy_matmul_on_the_future_model(programs, server_future):
    """CuPy's dot, matmul and tensordot go through cuBLAS, whose kernels run on the future
    model (sm_130): results against NumPy, square shapes included."""
    env = dict(CUPY_PTX)
    env["CUPY_ACCELERATORS"] = ""
    res = run_client(programs, server_future.unix,
                     [programs.python, PY / "cupy_custom_kernels.py", "matmul"], env=env)
    assert_ok(res, ["checked matmul", "checked dot", "PASS matmul (results checked)"])


@pytest.mark.kernel_results
@pytest.mark.parametrize("check,accelerators", list(_cupy_custom_params()))
def test_cupy_custom_kernels(programs, server, check, accelerators):
    env = dict(CUPY_PTX)
    if accelerators == "none":
        env["CUPY_ACCELERATORS"] = ""
    res = run_client(programs, server.unix,
                     [programs.python, PY / "cupy_custom_kernels.py", check], env=env)
    assert_ok(res, ["checked", f"PASS {check} (results checked)"])
