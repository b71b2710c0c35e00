"""The pool with real programs: a `gpufuse controller` and two `gpufuse node`s (emulated GPUs) on
unix sockets; nvcc-built programs run through the shim, asking the controller and redirected to
their node. `gpufuse run --server CONTROLLER`, an unmodified program whose GPUFUSE_SERVER names
the controller, and a preempted program that sees a CUDA error."""
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from support import GPUFUSE, NATIVE, ROOT
from test_session_cleanup import _wait_for_ready

pytestmark = pytest.mark.skipif(NATIVE, reason="the pool is gpufuse's own; nothing to compare natively")


def _wait_socket(path: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        assert proc.poll() is None, f"{proc.args} exited"
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.02)


class Pool:
    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="gpufuse-pool-"))
        self.ctrl = f"unix:{self.dir / 'c.sock'}"
        self.procs = []
        log = open(self.dir / "controller.log", "w")
        c = subprocess.Popen([str(GPUFUSE), "controller", "--listen", self.ctrl,
                              "--heartbeat-ms", "100", "--node-timeout-ms", "1500"],
                             stderr=log)
        self.procs.append(c)
        _wait_socket(self.dir / "c.sock", c)
        for name, label in (("a", "zone=x"), ("b", "zone=y")):
            log = open(self.dir / f"{name}.log", "w")
            n = subprocess.Popen([str(GPUFUSE), "node", "--controller", self.ctrl,
                                  "--listen", f"unix:{self.dir / (name + '.sock')}",
                                  "--devices", "emu:1:4GiB", "--name", name, "--label", label],
                                 stderr=log)
            self.procs.append(n)
            _wait_socket(self.dir / f"{name}.sock", n)
        self.wait_for(lambda s: sum(n["state"] == "ready" for n in s["nodes"]) == 2,
                      "both nodes registered")

    def status(self) -> dict:
        res = subprocess.run([str(GPUFUSE), "status", "--server", self.ctrl, "--json"],
                             capture_output=True, text=True, timeout=30)
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    def wait_for(self, pred, what: str) -> dict:
        deadline = time.monotonic() + 30
        while True:
            s = self.status()
            if pred(s):
                return s
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {s}"
            time.sleep(0.05)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.read_text()[-3000:]}"
                         for p in sorted(self.dir.glob("*.log")))

    def stop(self):
        for p in reversed(self.procs):
            p.kill()
            p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def pool():
    p = Pool()
    yield p
    p.stop()


def _run(programs, pool, args, argv, **kw):
    return subprocess.Popen([str(GPUFUSE), "run", "--server", pool.ctrl, *args, "--", *map(str, argv)],
                            env=programs.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **kw)


def test_a_program_asks_the_controller_and_runs_on_the_node_it_selected(programs, pool):
    res = subprocess.run([str(GPUFUSE), "run", "--server", pool.ctrl, "--selector", "zone=y",
                          "--vram", "2GiB", "--", str(programs.kernels["vector_add"])],
                         env=programs.env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, (res.stdout, res.stderr, pool.logs())
    assert "PASS vector_add" in res.stdout, res.stdout
    # The controller learns that the first program ended from the node's next report.
    pool.wait_for(lambda s: not any(x["state"] == "running" for x in s["sessions"]),
                  "the first program's session gone")
    proc = _run(programs, pool, ["--selector", "zone=y", "--vram", "2GiB", "--tenant", "alice"],
                [programs.rt[13], "hold_until_stdin"])
    try:
        _wait_for_ready(proc, timeout=60)
        s = pool.wait_for(lambda s: any(x["state"] == "running" for x in s["sessions"]),
                          "the session running")
        ours = [x for x in s["sessions"] if x["state"] == "running"]
        assert len(ours) == 1, s
        assert (ours[0]["node"], ours[0]["tenant"], ours[0]["vram_limit_bytes"]) == \
            ("b", "alice", 2 << 30), s
        out, err = proc.communicate(b"go\n", timeout=60)
        assert proc.returncode == 0, (out, err)
        assert b"AFTER memset=cudaSuccess sync=cudaSuccess" in out, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_an_unmodified_program_whose_server_is_the_controller(programs, pool):
    # The shim directory `gpufuse run` keeps beside the binary (made by any `gpufuse run`).
    subprocess.run([str(GPUFUSE), "run", "--no-check", "--server", pool.ctrl, "--", "/bin/true"],
                   check=True, timeout=60)
    shim_dir = ROOT / "target" / "release" / "gpufuse-shim"
    env = dict(programs.env)
    env["LD_LIBRARY_PATH"] = f"{shim_dir}:{env.get('LD_LIBRARY_PATH', '')}"
    env["GPUFUSE_SERVER"] = pool.ctrl
    res = subprocess.run([str(programs.kernels["vector_add"])], env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, (res.stdout, res.stderr, pool.logs())
    assert "PASS vector_add" in res.stdout, res.stdout


def test_a_preempted_program_sees_a_cuda_error(programs, pool):
    low = _run(programs, pool, ["--selector", "zone=x", "--vram", "3GiB", "--qos", "low"],
               [programs.rt[13], "hold_until_stdin"])
    high = None
    try:
        _wait_for_ready(low, timeout=60)
        pool.wait_for(lambda s: any(x["state"] == "running" for x in s["sessions"]), "low running")
        high = _run(programs, pool, ["--selector", "zone=x", "--vram", "2GiB", "--qos", "high"],
                    [programs.rt[13], "hold_until_stdin"])
        _wait_for_ready(high, timeout=60)
        s = pool.wait_for(lambda s: [x["qos"] for x in s["sessions"] if x["state"] == "running"]
                          == ["high"], "only the high session running")
        assert all(x["node"] == "a" for x in s["sessions"]), s
        out, err = low.communicate(b"go\n", timeout=60)
        line = next(l for l in out.decode().splitlines() if l.startswith("AFTER"))
        assert "sync=cudaErrorDevicesUnavailable" in line, (line, err)
        out, err = high.communicate(b"go\n", timeout=60)
        assert high.returncode == 0, (out, err)
        assert b"AFTER memset=cudaSuccess sync=cudaSuccess" in out, out
    finally:
        for p in (low, high):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
