#!/usr/bin/env python3
"""Builds NVIDIA's public CUDA samples that need only libcudart and runs each through gpufuse
on the emulated GPU: the acceptance run of issue 9 ("the public CUDA samples that need only
libcudart should run"). The samples are not in this repository; point this at a checkout of
https://github.com/NVIDIA/cuda-samples.

    .deps/venv/bin/python scripts/cuda_samples.py SAMPLES_CHECKOUT [--jobs N] [-k SUBSTRING]
        [--server ADDR] [--devices SPEC] [--timeout SECONDS] [--markdown FILE]
        [--nvcc PATH --arch sm_XX] [--gpufuse PATH] [--native]

On a GPU machine (the GPU lane), `--nvcc` uses that machine's toolkit instead of .deps,
`--devices cuda` serves its GPU, and `--native` also runs each sample directly against NVIDIA's
driver, so the two columns compare.

A sample is left out (and listed as such, with the reason) when its sources include a header of
a library or system other than the CUDA runtime (OpenGL, cuBLAS, cuFFT, NVRTC, the driver API,
MPI, Vulkan, ...). Each kept sample is built with the nvcc of .deps (-arch=sm_80, the samples'
Common/ headers, -rdc=true where its CMakeLists asks for separable compilation), run in its own
directory with `gpufuse run`, and passes when it exits 0 without printing a failure.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPUFUSE = ROOT / "target" / "release" / "gpufuse"

# Headers that mean "needs more than libcudart" (and why).
NEEDS = [
    (r"GL/|cuda_gl_interop|helper_gl|freeglut|glew|EGL|X11", "OpenGL/EGL/X11"),
    (r"cublas", "cuBLAS"), (r"cufft", "cuFFT"), (r"cusparse", "cuSPARSE"),
    (r"cusolver", "cuSOLVER"), (r"curand", "cuRAND"), (r"npp", "NPP"), (r"nvjpeg", "nvJPEG"),
    (r"nvrtc", "NVRTC"), (r"<cuda\.h>|helper_cuda_drvapi|drvapi_error", "the driver API"),
    (r"mpi\.h", "MPI"), (r"vulkan|Vulkan", "Vulkan"), (r"nvsci|cudla|nvmedia", "NvSci/DLA"),
    (r"d3d|windows\.h|DirectX", "Windows"), (r"nvml\.h", "NVML"), (r"cudnn", "cuDNN"),
    (r"cuda/barrier|cuda/pipeline", None),  # header-only, fine
    (r"libnvvm|nvvm\.h", "libNVVM"), (r"cufile", "cuFile"), (r"nvtx", "NVTX"),
]
FAIL_WORDS = re.compile(r"FAILED|Test failed|Result = FAIL|FAIL\b|Error:|mismatch", re.I)
# A figure the sample reports ("Max absolute error: 1.19E-05", "L1-Error: 0"), not a failure.
METRIC = re.compile(r"error\s*[:=]\s*[-+]?\d", re.I)


def failure_line(line: str) -> bool:
    return bool(FAIL_WORDS.search(line)) and not METRIC.search(line)


def load_deps() -> dict[str, str]:
    env_sh = ROOT / ".deps" / "env.sh"
    if not env_sh.exists():
        sys.exit("run scripts/setup-test-deps.sh first (.deps/env.sh is missing)")
    out = subprocess.run(["bash", "-c", f". {shlex.quote(str(env_sh))}; env -0"],
                         capture_output=True, check=True).stdout
    env = {}
    for item in out.split(b"\0"):
        if b"=" in item:
            k, v = item.split(b"=", 1)
            env[k.decode()] = v.decode()
    return env


def sources(d: Path) -> list[Path]:
    return sorted([*d.glob("*.cu"), *d.glob("*.cpp"), *d.glob("*.c")])


def excluded(d: Path) -> str | None:
    for f in [*sources(d), *d.glob("*.h"), *d.glob("*.cuh"), *d.glob("*.hpp")]:
        text = f.read_text(errors="replace")
        for inc in re.findall(r'#\s*include\s*[<"]([^>"]+)[>"]', text):
            for pat, why in NEEDS:
                if re.search(pat, inc) and why:
                    return f"needs {why} ({inc})"
    if "main" not in "".join(f.read_text(errors="replace") for f in sources(d)):
        return "no main()"
    return None


def build(d: Path, out: Path, env: dict[str, str], arch: str = "sm_80") -> str | None:
    cmake = (d / "CMakeLists.txt").read_text(errors="replace") if (d / "CMakeLists.txt").exists() else ""
    extra = []
    if re.search(r"CUDA_SEPARABLE_COMPILATION\s+ON", cmake):
        extra += ["-rdc=true", "-lcudadevrt"]
    if "OpenMP" in cmake or "fopenmp" in cmake:
        extra += ["-Xcompiler", "-fopenmp"]
    common = d.parents[2] / "Common"
    # CCCL 13 (Thrust, CUB, libcu++) lives in include/cccl beside nvcc's headers.
    cccl = Path(env["GPUFUSE_NVCC"]).resolve().parents[1] / "include" / "cccl"
    cmd = [env["GPUFUSE_NVCC"], "-O2", f"-arch={arch}", "-std=c++17", f"-I{common}", f"-I{d}",
           *([f"-I{cccl}"] if cccl.is_dir() else []),
           *[str(s) for s in sources(d)], "-o", str(out), *extra]
    if "pthread" in cmake.lower():
        cmd += ["-lpthread"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=d)
    if res.returncode != 0:
        first = [l for l in res.stderr.splitlines() if "error" in l.lower()][:2]
        return "build failed: " + " | ".join(first or res.stderr.splitlines()[-2:])
    return None


def run(d: Path, exe: Path, server: str | None, env: dict[str, str],
        timeout: float) -> tuple[bool, str]:
    """Runs a sample through gpufuse, or directly when `server` is None."""
    t = time.monotonic()
    prefix = [str(GPUFUSE), "run", "--server", server, "--"] if server else []
    try:
        res = subprocess.run([*prefix, str(exe)],
                             capture_output=True, text=True, env=env, cwd=d, timeout=timeout,
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout:.0f} s"
    took = time.monotonic() - t
    out = res.stdout + res.stderr
    lines = [l for l in out.splitlines() if l.strip()]
    bad = any(failure_line(l) for l in lines)
    if res.returncode == 0 and not bad:
        return True, f"{took:.1f} s"
    why = next((l for l in lines if failure_line(l)), lines[-1] if lines else "")
    return False, f"exit {res.returncode}: {why.strip()[:160]}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkout", type=Path)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("-k", dest="filter", default="")
    ap.add_argument("--server")
    ap.add_argument("--devices", default="emu:1:16GiB")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--nvcc", help="this nvcc instead of .deps' (a GPU machine's toolkit)")
    ap.add_argument("--arch", default="sm_80", help="nvcc -arch (default sm_80)")
    ap.add_argument("--gpufuse", type=Path, help="the gpufuse binary (default target/release)")
    ap.add_argument("--native", action="store_true",
                    help="also run each sample directly, without gpufuse")
    a = ap.parse_args()

    global GPUFUSE
    if a.gpufuse:
        GPUFUSE = a.gpufuse.resolve()
    env = dict(os.environ)
    env.update({"GPUFUSE_NVCC": a.nvcc} if a.nvcc else load_deps())
    dirs = sorted(p for p in (a.checkout / "Samples").glob("*/*") if p.is_dir() and sources(p)
                  and a.filter in p.name)
    results: dict[str, tuple[str, str]] = {}
    kept = []
    for d in dirs:
        why = excluded(d)
        if why:
            results[d.name] = ("left out", why)
        else:
            kept.append(d)
    print(f"{len(dirs)} samples, {len(kept)} need only libcudart", flush=True)

    bindir = Path(tempfile.mkdtemp(prefix="gpufuse-samples-"))
    server_proc = None
    server = a.server
    if not server:
        sock = bindir / "gpufuse.sock"
        server = f"unix:{sock}"
        server_proc = subprocess.Popen([str(GPUFUSE), "serve", "--listen", server, "--devices",
                                        a.devices], stdout=subprocess.DEVNULL,
                                       stderr=open(bindir / "server.log", "w"))
        while not sock.exists():
            time.sleep(0.05)
    try:
        def one(d: Path) -> tuple[str, tuple[str, str]]:
            exe = bindir / d.name
            err = build(d, exe, env, a.arch)
            if err:
                return d.name, ("build failed", err)
            ok, note = run(d, exe, server, env, a.timeout)
            if a.native:
                nok, nnote = run(d, exe, None, env, a.timeout)
                note = f"{note}; natively {'pass' if nok else 'FAIL'} {nnote}"
            return d.name, ("pass" if ok else "FAIL", note)

        with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
            for name, r in pool.map(one, kept):
                results[name] = r
                print(f"{r[0]:12} {name:36} {r[1]}", flush=True)
    finally:
        if server_proc:
            server_proc.terminate()
            server_proc.wait()
    ran = [r for r in results.values() if r[0] in ("pass", "FAIL")]
    passed = sum(r[0] == "pass" for r in ran)
    built_failed = sum(r[0] == "build failed" for r in results.values())
    summary = (f"{passed} of {len(ran)} samples that need only libcudart and built pass "
               f"({built_failed} did not build with this nvcc, "
               f"{sum(r[0] == 'left out' for r in results.values())} left out)")
    print(summary)
    if a.markdown:
        rows = "\n".join(f"| {n} | {r[0]} | {r[1].replace('|', '/')} |"
                         for n, r in sorted(results.items()))
        a.markdown.write_text(f"{summary}\n\n| sample | result | note |\n|---|---|---|\n{rows}\n")
    return 0 if passed == len(ran) else 1


if __name__ == "__main__":
    sys.exit(main())
