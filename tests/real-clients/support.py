"""Shared machinery of the real-client suite: where things are, building the test programs
(cached in tests/real-clients/build/), the gpufuse server under test, and running clients
through `gpufuse run`.
"""
from __future__ import annotations

import atexit
import concurrent.futures
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BUILD = HERE / "build"
GPUFUSE = ROOT / "target" / "release" / "gpufuse"
SHIM = ROOT / "target" / "release" / "libcuda.so"

# The emulated device the suite serves: one GPU of 16 GiB.
# The server's devices (the GPU lane sets GPUFUSE_DEVICES=cuda), and GPUFUSE_NATIVE=1 to run
# every client directly against the machine's own driver, for the lane's native comparison.
DEVICES = os.environ.get("GPUFUSE_DEVICES", "emu:1:16GiB")
# How clients reach the server over its unix socket (GPUFUSE_TEST_TRANSPORT, passed to them as
# GPUFUSE_TRANSPORT): "shm" (the default: every such session must move to the shared-memory
# rings, or fail) or "socket" (never). TCP sessions use TCP either way.
TRANSPORT = os.environ.get("GPUFUSE_TEST_TRANSPORT", "shm")
if TRANSPORT not in ("shm", "socket"):
    raise RuntimeError(f"GPUFUSE_TEST_TRANSPORT={TRANSPORT!r}: expected shm or socket")
NATIVE = os.environ.get("GPUFUSE_NATIVE") == "1"
DEVICE_BYTES = 16 << 30

# Every server's directory (socket, log, image cache: about 160 MiB each) is removed when the
# test process ends; GPUFUSE_KEEP_TEST_DIRS=1 keeps them to read the logs afterwards.
_SERVER_DIRS: list[Path] = []


@atexit.register
def _remove_server_dirs() -> None:
    if os.environ.get("GPUFUSE_KEEP_TEST_DIRS") == "1":
        return
    for d in _SERVER_DIRS:
        shutil.rmtree(d, ignore_errors=True)

CLIENT_TIMEOUT_S = 300


class BuildError(Exception):
    pass


def load_deps_env() -> dict[str, str]:
    """The variables .deps/env.sh exports (written by scripts/setup-test-deps.sh)."""
    env_sh = ROOT / ".deps" / "env.sh"
    if not env_sh.exists():
        raise BuildError(f"{env_sh} is missing: run scripts/setup-test-deps.sh first")
    out = subprocess.run(
        ["bash", "-c", f". {shlex.quote(str(env_sh))} && env -0"],
        check=True, capture_output=True,
    ).stdout
    env = {}
    for entry in out.split(b"\0"):
        if b"=" in entry:
            k, v = entry.split(b"=", 1)
            env[k.decode()] = v.decode()
    return env


# ---- building ------------------------------------------------------------------------------

def _digest(cmd: list[str], inputs: list[Path]) -> str:
    h = hashlib.sha256()
    h.update("\0".join(cmd).encode())
    for p in sorted(inputs):
        h.update(str(p).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def _build(out: Path, cmd: list[str], inputs: list[Path], env: dict[str, str]) -> Path:
    """Runs cmd to produce out unless out exists and was built from the same command and inputs."""
    key = _digest(cmd, inputs)
    stamp = out.with_name(out.name + ".key")
    if out.exists() and stamp.exists() and stamp.read_text() == key:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=HERE)
    if res.returncode != 0 or not out.exists():
        raise BuildError(
            f"building {out.name} failed ({res.returncode}):\n$ {shlex.join(cmd)}\n"
            f"{res.stdout}\n{res.stderr}"
        )
    stamp.write_text(key)
    return out


@dataclass
class Programs:
    rt: dict[int, Path] = field(default_factory=dict)          # CUDA major -> rt_tests binary
    nvrtc: dict[int, Path] = field(default_factory=dict)       # CUDA major -> nvrtc_launch
    nvrtc_kernels: dict[int, Path] = field(default_factory=dict)  # CUDA major -> nvrtc_kernels
    kernels: dict[str, Path] = field(default_factory=dict)     # name -> nvcc-built program
    cudarc: Path | None = None
    python: Path | None = None                                 # the venv's python
    env: dict[str, str] = field(default_factory=dict)          # base environment for clients


KERNEL_SOURCES = ["vector_add", "saxpy", "reduction", "params"]
SHARED_CUDART_KERNELS = ["vector_add", "params"]
# Programs made of named checks (kcheck.h: PROG [CHECK...]); test_kernels_nvcc.py lists the checks.
CHECK_KERNEL_SOURCES = ["warp", "histogram", "matmul", "transpose", "scan", "sort", "double",
                        "math", "memory_spaces", "calls", "fn_table", "faults", "graphs",
                        "device_io", "textures", "cooperative", "system_atomics", "wmma", "ipc"]
# Programs that include cooperative_groups, whose headers need CCCL's <nv/target>.
NEEDS_CCCL = {"cooperative", "system_atomics"}
# Each nvcc program is also built with line information: `-lineinfo` (`.file`/`.loc` lines
# between the statements of the same optimized code) and `-G` (unoptimized device code with DWARF
# `.section`s): programs[f"{name}{suffix}"].
KERNEL_BUILDS = {"": ["-O2"], "_lineinfo": ["-O2", "-lineinfo"], "_G": ["-G"]}
# The plain programs are also built with relocatable device code, as CMake builds CUDA code with
# CUDA_SEPARABLE_COMPILATION (NVIDIA's samples do): the host code registers the device-linked
# fatbin (SASS only) and the PTX is in the translation unit's own fatbin.
RDC_BUILD = ("_rdc", ["-O2", "-rdc=true"])


def build_programs() -> Programs:
    deps = load_deps_env()
    env = dict(os.environ)
    env.update(deps)
    p = Programs(python=Path(deps["GPUFUSE_PY"]))
    rt_dir = HERE / "runtime"
    rt_inputs = sorted(rt_dir.glob("*.c")) + sorted(rt_dir.glob("*.h"))
    stub_src = HERE / "stubs" / "libcuda_stub.c"
    nvrtc_src = HERE / "nvrtc" / "nvrtc_launch.c"
    nvrtc_kernels_src = HERE / "nvrtc" / "nvrtc_kernels.c"

    for major in (12, 13):
        cflags = shlex.split(deps[f"GPUFUSE_CUDA{major}_CFLAGS"])
        cudart = deps[f"GPUFUSE_CUDART{major}_LIB"]
        out = BUILD / f"rt_tests_{major}"
        cmd = ["gcc", "-O1", "-g", "-Wall", "-Wextra", "-Werror", *cflags,
               *[str(s) for s in rt_dir.glob("*.c")], "-o", str(out),
               f"-L{cudart}", f"-l:libcudart.so.{major}", f"-Wl,-rpath,{cudart}", "-lpthread"]
        p.rt[major] = _build(out, cmd, rt_inputs, env)

        # Link-time stand-in for libcuda.so.1 (never on the run-time path).
        stub = BUILD / f"stub-cuda{major}" / "libcuda.so"
        _build(stub, ["gcc", "-shared", "-fPIC", "-O1", *cflags, "-Wl,-soname,libcuda.so.1",
                      "-o", str(stub), str(stub_src)], [stub_src], env)
        nvrtc_lib = deps[f"GPUFUSE_NVRTC{major}_LIB"]
        nvrtc_inc = [f"-I{deps['GPUFUSE_NVRTC12_INCLUDE']}"] if major == 12 else []
        out = BUILD / f"nvrtc_launch_{major}"
        cmd = ["gcc", "-O1", "-g", "-Wall", "-Wextra", "-Werror", *cflags, *nvrtc_inc,
               str(nvrtc_src), "-o", str(out), f"-L{stub.parent}", "-lcuda",
               f"-L{nvrtc_lib}", f"-l:libnvrtc.so.{major}", f"-Wl,-rpath,{nvrtc_lib}"]
        p.nvrtc[major] = _build(out, cmd, [nvrtc_src, stub_src], env)
        out = BUILD / f"nvrtc_kernels_{major}"
        cmd = ["gcc", "-O1", "-g", "-Wall", "-Wextra", "-Werror", *cflags, *nvrtc_inc,
               str(nvrtc_kernels_src), "-o", str(out), f"-L{stub.parent}", "-lcuda",
               f"-L{nvrtc_lib}", f"-l:libnvrtc.so.{major}", f"-Wl,-rpath,{nvrtc_lib}", "-lm"]
        p.nvrtc_kernels[major] = _build(out, cmd, [nvrtc_kernels_src, stub_src], env)

    # nvcc 13.5 programs: static cudart (nvcc's default) and a -cudart shared variant.
    nvcc = deps["GPUFUSE_NVCC"]
    cudart13 = deps["GPUFUSE_CUDART13_LIB"]
    link_dir = BUILD / "link-cudart13"
    link_dir.mkdir(parents=True, exist_ok=True)
    link = link_dir / "libcudart.so"  # nvcc -cudart shared links -lcudart; the wheel has .so.13 only
    if not link.exists():
        link.symlink_to(Path(cudart13) / "libcudart.so.13")
    kdir = HERE / "kernels"
    jobs: list[tuple[str, Path, list[str], list[Path]]] = []
    for name in KERNEL_SOURCES + CHECK_KERNEL_SOURCES:
        src = kdir / f"{name}.cu"
        inputs = [src, kdir / "kcheck.h"]
        extra = [f"-I{deps['GPUFUSE_CCCL12_INCLUDE']}"] if name in NEEDS_CCCL else []
        for suffix, flags in KERNEL_BUILDS.items():
            out = BUILD / f"{name}{suffix}"
            jobs.append((f"{name}{suffix}", out,
                         [nvcc, *flags, *extra, "-arch=sm_80", "-o", str(out), str(src)],
                         inputs))
        if name in KERNEL_SOURCES:
            suffix, flags = RDC_BUILD
            out = BUILD / f"{name}{suffix}"
            jobs.append((f"{name}{suffix}", out,
                         [nvcc, *flags, "-arch=sm_80", "-o", str(out), str(src)], inputs))
        if name in SHARED_CUDART_KERNELS:
            out = BUILD / f"{name}_shared"
            jobs.append((f"{name}_shared", out,
                         [nvcc, "-O2", "-arch=sm_80", "-cudart", "shared", f"-L{link_dir}",
                          "-Xlinker", "-rpath", "-Xlinker", cudart13, "-o", str(out), str(src)],
                         inputs))
    # Host threads on their own streams (test_threads.py): plain, and with the per-thread
    # default stream (launches without a stream go through the driver's _ptsz entry points).
    src = kdir / "threads.cu"
    for name, flags in (("threads", []), ("threads_ptds", ["--default-stream", "per-thread"])):
        out = BUILD / name
        jobs.append((name, out, [nvcc, "-O2", *flags, "-arch=sm_80", "-o", str(out), str(src)],
                     [src, kdir / "kcheck.h"]))
    # Two translation units with relocatable device code, one calling into the other.
    rdc = [HERE / "rdc" / "rdc_main.cu", HERE / "rdc" / "rdc_lib.cu"]
    out = BUILD / "rdc_two_units"
    jobs.append(("rdc_two_units", out,
                 [nvcc, "-O2", "-rdc=true", "-arch=sm_80", "-o", str(out), *map(str, rdc)], rdc))
    # Conditional graph nodes: cudaGraphSetConditional is a device-runtime function.
    cond = HERE / "rdc" / "graph_conditional.cu"
    out = BUILD / "graph_conditional"
    jobs.append(("graph_conditional", out,
                 [nvcc, "-O2", "-rdc=true", "-arch=sm_80", "-o", str(out), str(cond),
                  "-lcudadevrt"], [cond, HERE / "kernels" / "kcheck.h"]))
    # Dynamic parallelism: kernels that launch kernels (the device runtime, libcudadevrt).
    cdp = HERE / "rdc" / "dynamic_parallelism.cu"
    out = BUILD / "dynamic_parallelism"
    jobs.append(("dynamic_parallelism", out,
                 [nvcc, "-O2", "-rdc=true", "-arch=sm_80", "-o", str(out), str(cdp),
                  "-lcudadevrt"], [cdp, HERE / "kernels" / "kcheck.h"]))
    # rdc_lib.cu as inputs of the driver's JIT linker (cuLinkAddFile): a relocatable fatbin
    # (PTX and SASS) and a host object file whose .nv_fatbin section holds it.
    for name, flags in (("rdc_lib_fatbin", ["-fatbin"]), ("rdc_lib_object", ["-c"])):
        out = BUILD / name
        jobs.append((name, out, [nvcc, "-O2", "-rdc=true", "-arch=sm_80", *flags, "-o", str(out),
                                 str(rdc[1])], [rdc[1]]))
    # nvcc runs single-threaded: one per core.
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        futures = {name: pool.submit(_build, out, cmd, inputs, env)
                   for name, out, cmd, inputs in jobs}
        for name, fut in futures.items():
            p.kernels[name] = fut.result()

    # cudarc: a standalone cargo project (cargo does its own caching).
    manifest = HERE / "cudarc-smoke" / "Cargo.toml"
    res = subprocess.run(["cargo", "build", "--release", "--quiet", "--manifest-path",
                          str(manifest)], env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise BuildError(f"building cudarc-smoke failed:\n{res.stdout}\n{res.stderr}")
    p.cudarc = HERE / "cudarc-smoke" / "target" / "release" / "cudarc-smoke"

    # What every client runs with: NVRTC's lib dirs on the loader path (NVRTC 12.9 opens
    # libnvrtc-builtins.so.12.9 by bare name), CuPy's kernel cache inside build/.
    client_env = dict(os.environ)
    client_env.pop("GPUFUSE_SERVER", None)
    extra = [deps["GPUFUSE_NVRTC12_LIB"], deps["GPUFUSE_NVRTC13_LIB"]]
    old = client_env.get("LD_LIBRARY_PATH", "")
    client_env["LD_LIBRARY_PATH"] = ":".join(extra + ([old] if old else []))
    client_env["CUPY_CACHE_DIR"] = str(BUILD / "cupy-cache")
    client_env["PYTHONUNBUFFERED"] = "1"
    client_env["RUST_BACKTRACE"] = "1"
    client_env["GPUFUSE_TRANSPORT"] = TRANSPORT
    p.env = client_env
    return p


# ---- the server under test -------------------------------------------------------------------

def free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`gpufuse serve` on a fresh unix socket and a TCP port; logs to a file."""

    def __init__(self, devices: str | None = None, tls_args: list[str] | None = None,
                 extra_args: list[str] | None = None) -> None:
        """tls_args: also listen on a tcp+tls: port (`self.tls`) with these serve options
        (--tls-cert, --tls-key, --tls-client-ca). extra_args: more `gpufuse serve` options."""
        self.devices = devices or DEVICES
        self.extra_args = extra_args or []
        self.tls_args = tls_args
        self.extra_args = extra_args or []
        self.tls = ""
        self.dir = Path(tempfile.mkdtemp(prefix="gpufuse-real-clients-"))
        _SERVER_DIRS.append(self.dir)
        self.log_path = self.dir / "server.log"
        self.proc: subprocess.Popen | None = None
        self.unix = f"unix:{self.dir / 'gpufuse.sock'}"
        self.tcp = ""
        self.restarts = 0

    def start(self) -> None:
        port = free_tcp_port()
        self.tcp = f"tcp:127.0.0.1:{port}"
        sock = self.dir / "gpufuse.sock"
        if sock.exists():
            sock.unlink()
        log = open(self.log_path, "ab")
        log.write(f"==== gpufuse serve started at {time.strftime('%H:%M:%S')} ====\n".encode())
        log.flush()
        env = dict(os.environ)
        # More detail in the server log: GPUFUSE_TEST_SERVER_LOG=debug.
        env["GPUFUSE_LOG"] = os.environ.get("GPUFUSE_TEST_SERVER_LOG", "info")
        argv = [str(GPUFUSE), "serve", "--listen", self.unix, "--listen", self.tcp,
                "--devices", self.devices]
        if self.tls_args is not None:
            self.tls = f"tcp+tls:127.0.0.1:{free_tcp_port()}"
            argv += ["--listen", self.tls, *self.tls_args]
        if "--image-cache" not in self.extra_args:
            # Each server its own image cache: nothing from an earlier run, nothing in ~/.cache.
            argv += ["--image-cache", str(self.dir / "images")]
        argv += self.extra_args
        self.proc = subprocess.Popen(
            argv,
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=env,
        )
        log.close()
        deadline = time.monotonic() + 30
        last = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"gpufuse serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            res = subprocess.run([str(GPUFUSE), "status", "--server", self.unix, "--json"],
                                 capture_output=True, text=True, timeout=10)
            if res.returncode == 0:
                return
            last = res.stderr
            time.sleep(0.1)
        raise RuntimeError(f"gpufuse serve not ready in 30 s: {last}\n{self.log_tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ensure_alive(self) -> bool:
        """Restarts a dead server; returns False when it had died."""
        if self.alive():
            return True
        self.restarts += 1
        self.start()
        return False

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.proc = None

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def log_since(self, offset: int, limit: int = 20000) -> str:
        if not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            data = f.read()
        text = re.sub(r"\x1b\[[0-9;]*m", "", data.decode(errors="replace"))
        if len(text) > limit:
            text = f"... ({len(text) - limit} characters left out)\n" + text[-limit:]
        return text

    def log_tail(self, limit: int = 8000) -> str:
        return self.log_since(max(0, self.log_size() - limit), limit)

    def status(self, addr: str | None = None) -> dict:
        res = subprocess.run([str(GPUFUSE), "status", "--server", addr or self.unix, "--json"],
                             capture_output=True, text=True, timeout=30)
        assert res.returncode == 0, f"gpufuse status failed: {res.stderr}"
        return json.loads(res.stdout)


# ---- running clients -------------------------------------------------------------------------

def client_argv(addr: str, argv: list[str], vram: str | None = None) -> list[str]:
    if NATIVE:
        return [str(a) for a in argv]
    cmd = [str(GPUFUSE), "run", "--server", addr]
    if vram:
        cmd += ["--vram", vram]
    return cmd + ["--", *[str(a) for a in argv]]


def run_client(programs: Programs, addr: str, argv: list[str], *, env: dict | None = None,
               timeout: float = CLIENT_TIMEOUT_S, vram: str | None = None
               ) -> subprocess.CompletedProcess:
    e = dict(programs.env)
    if env:
        e.update(env)
    cmd = client_argv(addr, argv, vram)
    try:
        return subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout,
                              cwd=HERE)
    except subprocess.TimeoutExpired as t:
        out = t.stdout.decode(errors="replace") if isinstance(t.stdout, bytes) else (t.stdout or "")
        err = t.stderr.decode(errors="replace") if isinstance(t.stderr, bytes) else (t.stderr or "")
        pytest.fail(f"client timed out after {timeout} s: {shlex.join(cmd)}\n"
                    f"--- stdout ---\n{out[-4000:]}\n--- stderr ---\n{err[-4000:]}")


def _tail(s: str, n: int = 6000) -> str:
    return s if len(s) <= n else f"... ({len(s) - n} characters left out)\n" + s[-n:]


def assert_ok(res: subprocess.CompletedProcess, expect: list[str] = ()) -> None:
    """Exit status 0 and every expected line present in stdout."""
    where = (f"$ {shlex.join(res.args)}\nexit status {res.returncode}\n"
             f"--- stdout ---\n{_tail(res.stdout)}\n--- stderr ---\n{_tail(res.stderr)}")
    assert res.returncode == 0, f"client failed\n{where}"
    lines = res.stdout.splitlines()
    for want in expect:
        assert any(line.startswith(want) for line in lines), f"missing '{want}' in output\n{where}"


def stdout_value(res: subprocess.CompletedProcess, key: str) -> str:
    for line in res.stdout.splitlines():
        if line.startswith(key + "="):
            return line[len(key) + 1:]
    raise AssertionError(f"no {key}= line in output:\n{res.stdout}")
