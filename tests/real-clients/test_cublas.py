"""cuBLAS and cuBLASLt 12.9 (nvidia-cublas-cu12) through the shim: versions, handle creation,
streams, and a GEMM that must fail cleanly (or compute) on the emulated GPU. The program is
cublas/cublas_handles.c, built with gcc against libcudart 12.9 and libcublas from the wheels.

On the future model (`--devices emu:1:16GiB:sm_130`, compute capability 13.0, fixture
`server_future`) cuBLAS has SASS for nothing and takes its compute_120 PTX kernels: every GEMM
shape computes, checked against a CPU reference. On the 12.0 model (`sm_120`, fixture
`server_sm120`) the PTX loads too, but shapes whose kernel cuBLAS ships as SASS only for sm_120
fail cleanly with cudaErrorNoKernelImageForDevice. docs/export-tables.md has the
shapes and the export-table slots this path calls (21318c60 slots 51 and 39).

cuBLAS and cuBLASLt load about fifty fatbins with cuLibraryLoadData in cublasCreate and
cublasLtCreate. Their kernels are SASS for sm_50..sm_120 plus PTX for compute_120 only, so the
emulated GPU (compute capability 10.0, runs PTX) loads them as a GPU of its architecture would
(kernels and parameter layouts from the sm_100 cubin's .nv.info) and fails only a launch of such
a kernel, with CUDA_ERROR_NO_BINARY_FOR_GPU. docs/export-tables.md has the details.
"""
from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

import support
from support import assert_ok, run_client, stdout_value

@pytest.fixture(scope="session")
def cublas_program(programs) -> Path:
    """cublas_handles, built once (cached in build/ like the suite's other programs)."""
    deps = support.load_deps_env()
    nv = Path(deps["GPUFUSE_NVIDIA"])
    inc, lib, cccl = nv / "cublas" / "include", nv / "cublas" / "lib", nv / "cuda_cccl" / "include"
    missing = [p for p in (inc / "cublas_v2.h", lib / "libcublas.so.12", lib / "libcublasLt.so.12",
                           cccl / "nv" / "target") if not p.exists()]
    if missing:
        pytest.fail(f"missing {', '.join(map(str, missing))}: run scripts/setup-test-deps.sh",
                    pytrace=False)
    src = support.HERE / "cublas" / "cublas_handles.c"
    out = support.BUILD / "cublas_handles"
    cudart = deps["GPUFUSE_CUDART12_LIB"]
    # cublas_api.h includes cuda_fp16.h, which needs CCCL's <nv/target> (nvidia-cuda-cccl-cu12).
    cmd = ["gcc", "-O1", "-g", "-Wall", "-Wextra", "-Werror",
           *shlex.split(deps["GPUFUSE_CUDA12_CFLAGS"]), f"-I{cccl}", f"-I{inc}",
           str(src), "-o", str(out),
           f"-L{cudart}", "-l:libcudart.so.12", f"-Wl,-rpath,{cudart}",
           f"-L{lib}", "-l:libcublas.so.12", "-l:libcublasLt.so.12", f"-Wl,-rpath,{lib}", "-lm"]
    env = dict(os.environ)
    env.update(deps)
    try:
        return support._build(out, cmd, [src], env)
    except support.BuildError as e:
        pytest.fail(str(e), pytrace=False)


def test_cublas_versions(programs, server, cublas_program):
    res = run_client(programs, server.unix, [cublas_program, "versions"])
    assert_ok(res, ["PASS versions"])
    assert stdout_value(res, "cublas_property").startswith("12.9.")
    assert stdout_value(res, "cublaslt_version").startswith("1209")


def test_cublas_create_is_clean(programs, server, cublas_program):
    """Both creates succeed: every kernel image loads (SASS-only ones included)."""
    res = run_client(programs, server.unix, [cublas_program, "create_status"])
    assert_ok(res, ["PASS create_status"])
    want = "0 (CUBLAS_STATUS_SUCCESS)"
    assert stdout_value(res, "create") == want, f"cublasCreate\n{res.stdout}"
    assert stdout_value(res, "lt_create") == want, f"cublasLtCreate\n{res.stdout}"


def test_cublas_handle_and_stream(programs, server, cublas_program):
    res = run_client(programs, server.unix, [cublas_program, "handles"])
    assert_ok(res, ["PASS handles"])
    assert stdout_value(res, "cublas_version").startswith("1209")


def test_cublaslt_handle(programs, server, cublas_program):
    res = run_client(programs, server.unix, [cublas_program, "lt_handles"])
    assert_ok(res, ["PASS lt_handles"])


def test_cublas_gemm_computes_or_fails_cleanly(programs, server, cublas_program):
    """cuBLASLt asks the driver for the current context (TOOLS_TLS slot 2) and its id
    (21318c60 slot 4) before a matmul; both must be implemented, not fallbacks."""
    res = run_client(programs, server.unix, [cublas_program, "gemm"], env={"GPUFUSE_LOG": "1"})
    assert_ok(res, ["PASS gemm", "gemm outcome="])
    unimplemented = [line for line in res.stderr.splitlines() if "is not implemented" in line
                     and ("42d85a81" in line or "21318c60" in line)]
    assert not unimplemented, "\n".join(unimplemented)
    outcome = stdout_value(res, "gemm outcome")
    if outcome != "computed":
        assert "cuda=cudaError" in outcome or "cublas=CUBLAS_STATUS_" in outcome, outcome


@pytest.mark.kernel_results
def test_cublas_gemms_compute_on_the_future_model(programs, server_future, cublas_program):
    """cublasSgemm, cublasDgemm, cublasGemmEx (f16 and bf16 in, f32 compute) and
    cublasLtMatmul of every shape, square ones included, run cuBLAS's compute_120 PTX on the
    future model and match a CPU reference (one process: loading cuBLAS's images takes most of
    the time)."""
    checks = ["sgemm_ref", "dgemm_ref", "gemmex_f16", "gemmex_bf16", "lt_matmul", "gemm",
              "gemm128"]
    res = run_client(programs, server_future.unix, [cublas_program, *checks],
                     env={"GPUFUSE_LOG": "1"})
    assert_ok(res, [f"PASS {c}" for c in checks])
    checked = [line for line in res.stdout.splitlines() if " checked=" in line]
    assert len(checked) == 3 * 11 + 2 * 6, res.stdout
    for square in ("sgemm 128x128x128N", "dgemm 256x256x256T", "gemmex_f16 128x128x128T",
                   "gemmex_bf16 64x64x64N", "lt_matmul 37x23x29N"):
        assert any(line.startswith(square + " ") for line in checked), (square, res.stdout)
    outcomes = [line for line in res.stdout.splitlines() if line.startswith("gemm outcome=")]
    assert outcomes == ["gemm outcome=computed"] * 2, res.stdout
    unimplemented = [line for line in res.stderr.splitlines() if "is not implemented" in line
                     and "21318c60" in line]
    assert not unimplemented, "\n".join(unimplemented)


@pytest.mark.kernel_results
def test_cublas_sass_only_gemm_fails_cleanly_on_the_sm120_model(programs, server_sm120,
                                                               cublas_program):
    """On the 12.0 model an 8x8 SGEMM computes; a 128x128 one makes cuBLAS pick a kernel it
    ships as SASS only for sm_120: a clean, named error, never a wrong result or a crash."""
    res = run_client(programs, server_sm120.unix, [cublas_program, "gemm", "gemm128"])
    assert_ok(res, ["PASS gemm", "PASS gemm128"])
    outcomes = [line for line in res.stdout.splitlines() if line.startswith("gemm outcome=")]
    assert outcomes[0] == "gemm outcome=computed", res.stdout
    if support.DEVICES != "cuda":
        assert outcomes[1] == ("gemm outcome=error cublas=CUBLAS_STATUS_SUCCESS "
                               "cuda=cudaErrorNoKernelImageForDevice"), res.stdout
