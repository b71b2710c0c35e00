#!/usr/bin/env python3
"""Builds NVIDIA's public CUDA samples that need only libcudart, the driver API (libcuda) and
NVRTC, and runs each through gpufuse on the emulated GPU: the acceptance run of issue 9 ("the
public CUDA samples that need only libcudart should run"), extended to the driver-API and NVRTC
samples. The samples are not in this repository; point this at a checkout of
https://github.com/NVIDIA/cuda-samples.

    .deps/venv/bin/python scripts/cuda_samples.py SAMPLES_CHECKOUT [--jobs N] [-k SUBSTRING]
        [--server ADDR] [--devices SPEC] [--timeout SECONDS] [--markdown FILE]
        [--nvcc PATH --arch sm_XX] [--gpufuse PATH] [--native] [--keep]

On a GPU machine (the GPU lane), `--nvcc` uses that machine's toolkit instead of .deps,
`--devices cuda` serves its GPU, and `--native` also runs each sample directly against NVIDIA's
driver, so the two columns compare.

A sample is left out (and listed as such, with the reason) when its sources include a header of
a library or system other than the CUDA runtime, the driver API and NVRTC (OpenGL, cuBLAS,
cuFFT, nvJitLink, MPI, Vulkan, ...); an include inside `#if defined(_WIN32)` (or WIN32, _MSC_VER)
is Windows-only and does not count. Each kept sample is built with the nvcc of .deps
(-arch=sm_80, the samples' Common/ headers, -rdc=true where its CMakeLists asks for separable
compilation) from the sources its CMakeLists' add_executable names (else every source of its
directory), run with `gpufuse run`, and passes when it exits 0 without printing a failure; one
that exits 2 (the samples' EXIT_WAIVED: the device lacks a feature it needs) is "waived", counted
apart from passes and failures.

cuBLAS samples (added 2026-11-27): linked against cuBLAS 12.9 from .deps (GPUFUSE_CUBLAS12_LIB,
with an rpath; cuBLAS carries its own runtime) and run on a second server whose emulated GPU is
the future model (`--cublas-devices`, default emu:1:16GiB:sm_130), where cuBLAS takes its PTX
kernels (docs/export-tables.md).

Driver-API and NVRTC samples (added 2026-11-27):
- `-lcuda` when the sources include <cuda.h> (or the drvapi helpers) or the CMakeLists links
  CUDA::cuda_driver. It links against a libcuda that exists at build time: NVIDIA's stub
  (lib/stubs/libcuda.so) if a wheel in .deps has one, else gpufuse's own shim
  (target/release/libcuda.so, soname libcuda.so.1), through a link in the build directory. Either
  way the program records NEEDED libcuda.so.1, and at run time `gpufuse run` puts its shim
  directory (target/release/gpufuse-shim: libcuda.so.1 -> the shim) first on LD_LIBRARY_PATH,
  so the shim is what loads.
- NVRTC: when the sources include nvrtc.h or the CMakeLists links CUDA::nvrtc, the program links
  .deps' libnvrtc.so.13 (GPUFUSE_NVRTC13_LIB, with an rpath; that directory is also on the
  programs' LD_LIBRARY_PATH for libnvrtc-builtins).
- A kernel the CMakeLists compiles apart with a custom command (CUDA_FATBIN_FILE or
  CUDA_PTX_FILE from CUDA_KERNEL_SOURCE: vectorAddDrv, ptxjit, ...) is built the same way
  (nvcc -fatbin or -ptx, -arch as above, so a fatbin carries PTX for the emulated GPU) and left
  out of the executable; such a sample runs in a directory of its own (bindir/run-NAME) holding
  links to every file of the sample's directory and the generated module, since the samples
  look for their modules and data in "./" and "./data/".
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPUFUSE = ROOT / "target" / "release" / "gpufuse"

# Headers that mean "needs more than libcudart" (and why).
NEEDS = [
    (r"GL/|cuda_gl_interop|helper_gl|freeglut|glew|EGL|X11", "OpenGL/EGL/X11"),
    (r"cublas", "cuBLAS"), (r"cufft", "cuFFT"), (r"cusparse", "cuSPARSE"),
    (r"cusolver", "cuSOLVER"), (r"curand", "cuRAND"), (r"npp", "NPP"), (r"nvjpeg", "nvJPEG"),
    (r"^nvrtc", "NVRTC"), (r"^cuda\.h$|helper_cuda_drvapi|drvapi_error|cuda_drvapi_dynlink",
                           "the driver API"), (r"nvJitLink", "nvJitLink"),
    (r"mpi\.h", "MPI"), (r"vulkan|Vulkan", "Vulkan"), (r"nvsci|cudla|nvmedia", "NvSci/DLA"),
    (r"d3d|windows\.h|DirectX", "Windows"), (r"nvml\.h", "NVML"), (r"cudnn", "cuDNN"),
    (r"cuda/barrier|cuda/pipeline", None),  # header-only, fine
    (r"libnvvm|nvvm\.h", "libNVVM"), (r"cufile", "cuFile"), (r"nvtx", "NVTX"),
]
# What this script provides besides libcudart: such a sample is built and run.
SUPPORTED = {"the driver API", "NVRTC", "cuBLAS"}
WINDOWS_IF = re.compile(r"\b(_?WIN32|_WIN64|_MSC_VER)\b")
FAIL_WORDS = re.compile(r"FAILED|Test failed|Result = FAIL|FAIL\b|Error:|mismatch", re.I)
# A figure the sample reports ("Max absolute error: 1.19E-05", "L1-Error: 0"), not a failure.
# Nor is a failure the sample provokes and checks for ("Device assert failed as expected").
METRIC = re.compile(r"error\s*[:=]\s*[-+]?\d|as expected", re.I)


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


def includes(text: str) -> list[str]:
    """The headers a source includes, leaving out those of Windows-only branches: under
    `#if defined(_WIN32)` (WIN32, _WIN64, _MSC_VER), or the #else of `#ifndef _WIN32`."""
    stack: list[list] = []  # per open #if: [Windows condition, negated?, in a Windows branch?]
    out = []
    for line in text.splitlines():
        m = re.match(r"\s*#\s*(ifdef|ifndef|if|elif|else|endif)\b(.*)", line)
        if m:
            kw, cond = m.groups()
            win = bool(WINDOWS_IF.search(cond)) and "&&" not in cond
            negated = kw == "ifndef" or bool(re.search(r"!\s*defined", cond))
            if kw in ("if", "ifdef", "ifndef"):
                stack.append([win, negated, win and not negated])
            elif kw == "elif" and stack:
                stack[-1] = [win, negated, win and not negated]
            elif kw == "else" and stack:
                stack[-1][2] = stack[-1][0] and stack[-1][1]
            elif kw == "endif" and stack:
                stack.pop()
            continue
        inc = re.match(r'\s*#\s*include\s*[<"]([^>"]+)[>"]', line)
        if inc and not any(f[2] for f in stack):
            out.append(inc.group(1))
    return out


def cmake_text(d: Path) -> str:
    f = d / "CMakeLists.txt"
    return f.read_text(errors="replace") if f.exists() else ""


def needs(d: Path) -> tuple[str | None, set[str]]:
    """(why the sample is left out, or None; what it needs of SUPPORTED)."""
    found: list[tuple[str, str]] = []
    for f in [*sources(d), *d.glob("*.h"), *d.glob("*.cuh"), *d.glob("*.hpp")]:
        for inc in includes(f.read_text(errors="replace")):
            for pat, why in NEEDS:
                if re.search(pat, inc) and why:
                    found.append((why, inc))
    cmake = cmake_text(d)
    if "CUDA::cuda_driver" in cmake:
        found.append(("the driver API", "CUDA::cuda_driver"))
    if "CUDA::nvrtc" in cmake:
        found.append(("NVRTC", "CUDA::nvrtc"))
    other = [(w, inc) for w, inc in found if w not in SUPPORTED]
    if other:
        return f"needs {other[0][0]} ({other[0][1]})", set()
    if "main" not in "".join(f.read_text(errors="replace") for f in sources(d)):
        return "no main()", set()
    return None, {w for w, _ in found}


def excluded(d: Path) -> str | None:
    return needs(d)[0]


def generated_module(d: Path) -> tuple[str, str, Path] | None:
    """A kernel the CMakeLists compiles apart for the program to load at run time:
    ("fatbin" or "ptx", the file name the program looks for, the kernel source)."""
    cmake = cmake_text(d)
    out = re.search(r'set\(CUDA_(FATBIN|PTX)_FILE\s+"\$\{CMAKE_CURRENT_BINARY_DIR\}/([^"]+)"', cmake)
    src = re.search(r'set\(CUDA_KERNEL_SOURCE\s+"\$\{CMAKE_CURRENT_SOURCE_DIR\}/([^"]+)"', cmake)
    if not out or not src:
        return None
    return out.group(1).lower(), out.group(2), d / src.group(1)


def exe_sources(d: Path) -> list[Path]:
    """The sources add_executable names (relative ones resolved from the sample's directory),
    else every source of the directory; less a kernel built apart."""
    cmake = cmake_text(d)
    m = re.search(rf"add_executable\(\s*{re.escape(d.name)}\s+([^)]*)\)", cmake)
    srcs = sources(d)
    if m:
        named = [(d / t).resolve() for t in m.group(1).split()
                 if not t.startswith("$") and re.search(r"\.(cu|cpp|c|cc)$", t)]
        if named and all(p.exists() for p in named):
            srcs = named
    gen = generated_module(d)
    if gen:
        srcs = [s for s in srcs if s.resolve() != gen[2].resolve()]
    return srcs


def libcuda_for_linking(env: dict[str, str]) -> Path:
    """A libcuda.so to link -lcuda against: NVIDIA's stub from a wheel in .deps if there is
    one, else the gpufuse shim built beside the gpufuse binary (its soname is libcuda.so.1)."""
    nvidia = env.get("GPUFUSE_NVIDIA")
    if nvidia:
        for stub in sorted(Path(nvidia).glob("*/lib*/stubs/libcuda.so")):
            return stub
    return GPUFUSE.parent / "libcuda.so"


def build(d: Path, out: Path, env: dict[str, str], arch: str = "sm_80",
          link_dir: Path | None = None) -> str | None:
    cmake = cmake_text(d)
    _, uses = needs(d)
    extra = []
    if re.search(r"CUDA_SEPARABLE_COMPILATION\s+ON", cmake):
        extra += ["-rdc=true", "-lcudadevrt"]
    if "OpenMP" in cmake or "fopenmp" in cmake:
        extra += ["-Xcompiler", "-fopenmp"]
    if "the driver API" in uses:
        if link_dir is None:
            return "build failed: no libcuda.so to link against"
        extra += [f"-L{link_dir}", "-lcuda"]
    if "NVRTC" in uses:
        lib = env["GPUFUSE_NVRTC13_LIB"]
        extra += [f"-L{lib}", "-l:libnvrtc.so.13", "-Xlinker", "-rpath", "-Xlinker", lib]
    if "cuBLAS" in uses or "CUDA::cublas" in cmake:
        inc, lib = env["GPUFUSE_CUBLAS12_INCLUDE"], env["GPUFUSE_CUBLAS12_LIB"]
        extra += [f"-I{inc}", f"-L{lib}", "-l:libcublas.so.12", "-l:libcublasLt.so.12",
                  "-Xlinker", "-rpath", "-Xlinker", lib]
    if re.search(r"target_link_libraries\([^)]*\b(rt)\b", cmake):
        extra += ["-lrt"]
    if re.search(r"target_link_libraries\([^)]*\bdl\b", cmake):
        extra += ["-ldl"]
    common = d.parents[2] / "Common"
    # CCCL 13 (Thrust, CUB, libcu++) lives in include/cccl beside nvcc's headers.
    cccl = Path(env["GPUFUSE_NVCC"]).resolve().parents[1] / "include" / "cccl"
    incs = [f"-I{common}", f"-I{d}", *([f"-I{cccl}"] if cccl.is_dir() else [])]
    gen = generated_module(d)
    if gen:
        kind, name, src = gen
        res = subprocess.run([env["GPUFUSE_NVCC"], "-O2", f"-arch={arch}", "-std=c++17", *incs,
                              f"-{kind}", str(src), "-o", str(out.parent / f"{out.name}.{name}")],
                             capture_output=True, text=True, env=env, cwd=d)
        if res.returncode != 0:
            first = [l for l in res.stderr.splitlines() if "error" in l.lower()][:2]
            return f"build of {name} failed: " + " | ".join(first or res.stderr.splitlines()[-2:])
    cmd = [env["GPUFUSE_NVCC"], "-O2", f"-arch={arch}", "-std=c++17", *incs,
           *[str(s) for s in exe_sources(d)], "-o", str(out), *extra]
    if "pthread" in cmake.lower():
        cmd += ["-lpthread"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=d)
    if res.returncode != 0:
        first = [l for l in res.stderr.splitlines() if "error" in l.lower()][:2]
        return "build failed: " + " | ".join(first or res.stderr.splitlines()[-2:])
    return None


def staged(d: Path, rd: Path, env: dict[str, str]) -> list[tuple[Path, Path]]:
    """The files and directories the CMakeLists copies beside the program after building it
    (an NVRTC sample's kernel source, the toolkit headers it compiles against, data files), as
    (source, destination in the run directory)."""
    include = Path(env.get("GPUFUSE_CUDA13_INCLUDE")
                   or Path(env["GPUFUSE_NVCC"]).resolve().parents[1] / "include")
    subst = {"CMAKE_CURRENT_SOURCE_DIR": str(d), "CMAKE_CURRENT_BINARY_DIR": str(rd),
             "CUDA_INCLUDE_DIR": str(include)}
    out = []
    for m in re.finditer(r"-E\s+(copy_if_different|copy_directory|copy)\s+([^)]*?)\s*"
                         r"(?=\)|\bCOMMAND\b|\bCOMMENT\b|\bDEPENDS\b)", cmake_text(d)):
        args = [re.sub(r"\$\{(\w+)\}", lambda v: subst.get(v.group(1), v.group(0)), t)
                for t in m.group(2).split()]
        if len(args) < 2 or any("${" in t for t in args):
            continue
        dest = Path(args[-1])
        for src in map(Path, args[:-1]):
            to = dest if m.group(1) == "copy_directory" or dest.suffix else dest / src.name
            if src.exists() and rd in to.parents:
                out.append((src, to))
    return out


def run_dir(d: Path, exe: Path, env: dict[str, str]) -> Path:
    """Where the sample runs: its own directory; or, for a sample with a module built apart or
    files its CMakeLists copies beside the program, a directory of links to the files of its
    own directory, that module under the name the program looks for and those files."""
    rd = exe.parent / f"run-{d.name}"
    gen = generated_module(d)
    copies = staged(d, rd, env)
    if not gen and not copies:
        return d
    rd.mkdir(exist_ok=True)
    links = [(f, rd / f.name) for f in d.iterdir()] + copies
    if gen:
        links.append((exe.parent / f"{exe.name}.{gen[1]}", rd / gen[1]))
    for src, to in links:
        if not to.exists() and not to.is_symlink():
            to.parent.mkdir(parents=True, exist_ok=True)
            to.symlink_to(src)
    return rd


WAIVED = 2  # the samples' EXIT_WAIVED: the device lacks what the sample needs, it says so


def run(d: Path, exe: Path, server: str | None, env: dict[str, str],
        timeout: float) -> tuple[bool | None, str]:
    """Runs a sample through gpufuse, or directly when `server` is None: passed, failed, or
    None when the sample waived itself (exit 2)."""
    t = time.monotonic()
    prefix = [str(GPUFUSE), "run", "--server", server, "--"] if server else []
    try:
        res = subprocess.run([*prefix, str(exe)],
                             capture_output=True, text=True, env=env, cwd=run_dir(d, exe, env),
                             timeout=timeout,
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout:.0f} s"
    took = time.monotonic() - t
    out = res.stdout + res.stderr
    lines = [l for l in out.splitlines() if l.strip()]
    bad = any(failure_line(l) for l in lines)
    if res.returncode == 0 and not bad:
        return True, f"{took:.1f} s"
    if res.returncode == WAIVED:
        why = next((l for l in lines if "waiv" in l.lower() or "support" in l.lower()),
                   lines[-1] if lines else "")
        return None, f"exit 2 (waived): {why.strip()[:160]}"
    why = next((l for l in lines if failure_line(l)), lines[-1] if lines else "")
    return False, f"exit {res.returncode}: {why.strip()[:160]}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkout", type=Path)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("-k", dest="filter", action="append", default=[],
                    help="only samples whose name contains this (may be given several times)")
    ap.add_argument("--server")
    ap.add_argument("--devices", default="emu:1:16GiB")
    ap.add_argument("--cublas-devices",
                    help="the devices of the server the cuBLAS samples run on (default: the "
                         "future model emu:1:16GiB:sm_130 with an emulated --devices, else "
                         "--devices)")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--nvcc", help="this nvcc instead of .deps' (a GPU machine's toolkit)")
    ap.add_argument("--arch", default="sm_80", help="nvcc -arch (default sm_80)")
    ap.add_argument("--gpufuse", type=Path, help="the gpufuse binary (default target/release)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the build directory (binaries, modules, server.log)")
    ap.add_argument("--native", action="store_true",
                    help="also run each sample directly, without gpufuse")
    a = ap.parse_args()

    global GPUFUSE
    if a.gpufuse:
        GPUFUSE = a.gpufuse.resolve()
    env = dict(os.environ)
    deps = load_deps()
    env.update(deps)
    if a.nvcc:
        env["GPUFUSE_NVCC"] = a.nvcc
    # NVRTC opens libnvrtc-builtins by name.
    nvrtc_lib = deps.get("GPUFUSE_NVRTC13_LIB", "")
    if nvrtc_lib:
        old = env.get("LD_LIBRARY_PATH", "")
        env["LD_LIBRARY_PATH"] = nvrtc_lib + (f":{old}" if old else "")
    dirs = sorted(p for p in (a.checkout / "Samples").glob("*/*") if p.is_dir() and sources(p)
                  and (not a.filter or any(k in p.name for k in a.filter)))
    results: dict[str, tuple[str, str]] = {}
    kept = []
    for d in dirs:
        why = excluded(d)
        if why:
            results[d.name] = ("left out", why)
        else:
            kept.append(d)
    print(f"{len(dirs)} samples, {len(kept)} need only libcudart, the driver API, NVRTC and "
          f"cuBLAS", flush=True)

    bindir = Path(tempfile.mkdtemp(prefix="gpufuse-samples-"))
    # -lcuda resolves here at build time; at run time `gpufuse run` puts its shim first.
    link_dir = bindir / "link"
    link_dir.mkdir()
    libcuda = libcuda_for_linking(env)
    if libcuda.exists():
        (link_dir / "libcuda.so").symlink_to(libcuda.resolve())
        print(f"-lcuda links against {libcuda}", flush=True)
    procs = []

    def serve(name: str, devices: str) -> str:
        sock = bindir / f"{name}.sock"
        procs.append(subprocess.Popen([str(GPUFUSE), "serve", "--listen", f"unix:{sock}",
                                       "--devices", devices], stdout=subprocess.DEVNULL,
                                      stderr=open(bindir / f"{name}.log", "w")))
        while not sock.exists():
            time.sleep(0.05)
        return f"unix:{sock}"

    server = a.server or serve("server", a.devices)
    # cuBLAS ships SASS for every architecture it knows and PTX for compute_120: on the future
    # model it finds no SASS and takes its PTX kernels (docs/export-tables.md).
    cublas_devices = a.cublas_devices or (
        "emu:1:16GiB:sm_130" if a.devices.startswith("emu") else a.devices)
    cublas_server = None
    cublas_lock = threading.Lock()

    def server_for(d: Path) -> str:
        nonlocal cublas_server
        if a.server or "cuBLAS" not in needs(d)[1]:
            return server
        with cublas_lock:
            if cublas_server is None:
                cublas_server = serve("cublas", cublas_devices)
        return cublas_server

    try:
        def one(d: Path) -> tuple[str, tuple[str, str]]:
            exe = bindir / d.name
            err = build(d, exe, env, a.arch, link_dir if libcuda.exists() else None)
            if err:
                return d.name, ("build failed", err)
            ok, note = run(d, exe, server_for(d), env, a.timeout)
            verdict = {True: "pass", False: "FAIL", None: "waived"}
            if a.native:
                nok, nnote = run(d, exe, None, env, a.timeout)
                note = f"{note}; natively {verdict[nok]} {nnote}"
            return d.name, (verdict[ok], note)

        with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
            for name, r in pool.map(one, kept):
                results[name] = r
                print(f"{r[0]:12} {name:36} {r[1]}", flush=True)
    finally:
        for p in procs:
            p.terminate()
            p.wait()
        if a.keep:
            print(f"kept {bindir}")
        else:
            shutil.rmtree(bindir, ignore_errors=True)
    ran = [r for r in results.values() if r[0] in ("pass", "FAIL")]
    passed = sum(r[0] == "pass" for r in ran)
    built_failed = sum(r[0] == "build failed" for r in results.values())
    summary = (f"{passed} of {len(ran)} samples that need only libcudart, the driver API, "
               f"NVRTC and cuBLAS and built pass "
               f"({sum(r[0] == 'waived' for r in results.values())} waived themselves, "
               f"{built_failed} did not build with this nvcc, "
               f"{sum(r[0] == 'left out' for r in results.values())} left out)")
    print(summary)
    if a.markdown:
        rows = "\n".join(f"| {n} | {r[0]} | {r[1].replace('|', '/')} |"
                         for n, r in sorted(results.items()))
        a.markdown.write_text(f"{summary}\n\n| sample | result | note |\n|---|---|---|\n{rows}\n")
    return 0 if passed == len(ran) else 1


if __name__ == "__main__":
    sys.exit(main())
