"""The pool with real programs: a `gpufuse controller` and two `gpufuse node`s (emulated GPUs) on
unix sockets; nvcc-built programs and a CuPy workload (elastic_workload.py, checked byte for
byte) run through the shim, asking the controller and redirected to their node.
`gpufuse run --server CONTROLLER`, an unmodified program whose GPUFUSE_SERVER names the
controller, a preempted program that sees a CUDA error, a program whose node is lost (SIGSTOP)
and comes back (SIGCONT), and a program that runs on while the controller is killed and a new
one learns its session from the node."""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from support import GPUFUSE, HERE, NATIVE, ROOT
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
        self.start_controller()
        self.nodes = {}
        for name, label in (("a", "zone=x"), ("b", "zone=y")):
            log = open(self.dir / f"{name}.log", "w")
            n = subprocess.Popen([str(GPUFUSE), "node", "--controller", self.ctrl,
                                  "--listen", f"unix:{self.dir / (name + '.sock')}",
                                  "--devices", "emu:1:4GiB", "--name", name, "--label", label],
                                 stderr=log)
            self.procs.append(n)
            self.nodes[name] = n
            _wait_socket(self.dir / f"{name}.sock", n)
        self.wait_for(lambda s: sum(n["state"] == "ready" for n in s["nodes"]) == 2,
                      "both nodes registered")

    def start_controller(self) -> subprocess.Popen:
        """A controller on the pool's socket (again, after `kill_controller`)."""
        log = open(self.dir / "controller.log", "a")
        c = subprocess.Popen([str(GPUFUSE), "controller", "--listen", self.ctrl,
                              "--heartbeat-ms", "100", "--node-timeout-ms", "1500"],
                             stderr=log)
        self.procs.append(c)
        self.controller = c
        deadline = time.monotonic() + 30
        while True:
            assert c.poll() is None, f"the controller exited: {self.logs()}"
            if (self.dir / "c.sock").exists() and subprocess.run(
                    [str(GPUFUSE), "status", "--server", self.ctrl, "--json"],
                    capture_output=True, timeout=30).returncode == 0:
                return c
            assert time.monotonic() < deadline, "the controller did not answer"
            time.sleep(0.05)

    def kill_controller(self) -> None:
        self.controller.kill()
        self.controller.wait()

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
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
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


class Workload:
    """elastic_workload.py (CuPy, every byte checked at the end) through `gpufuse run --server
    CONTROLLER`: it fills device memory, runs its first two steps, waits for `flag`, runs the
    rest. Its stdout is read as it comes."""

    def __init__(self, programs, pool, flag: Path, args, steps: int, pause: float):
        env = dict(programs.env)
        env["CUPY_COMPILE_WITH_PTX"] = "1"
        self.flag = flag
        self.proc = subprocess.Popen(
            [str(GPUFUSE), "run", "--server", pool.ctrl, *args, "--", str(programs.python),
             str(HERE / "python" / "elastic_workload.py"), "64", str(steps), str(pause), "7",
             "--wait-file", str(flag)],
            env=env, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.err = ""
        self.readers = [threading.Thread(target=f, daemon=True) for f in (self._read, self._read_err)]
        for t in self.readers:
            t.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def _read_err(self):
        self.err = self.proc.stderr.read()

    def wait_line(self, prefix: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while not any(l.startswith(prefix) for l in self.lines):
            assert self.proc.poll() is None or any(l.startswith(prefix) for l in self.lines), \
                (self.lines, self.err)
            assert time.monotonic() < deadline, f"no {prefix!r} line: {self.lines} {self.err}"
            time.sleep(0.05)

    def finish(self, timeout: float = 300) -> None:
        self.flag.touch()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"the workload timed out: {self.lines[-20:]} {self.err[-3000:]}")
        for t in self.readers:
            t.join(timeout=10)
        assert self.proc.returncode == 0, (self.lines[-20:], self.err[-3000:])
        assert "PASS elastic_workload" in self.lines, (self.lines[-20:], self.err[-3000:])

    def kill(self) -> None:
        self.flag.touch()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _ours(s: dict, tenant: str) -> list[dict]:
    return [x for x in s["sessions"] if x["tenant"] == tenant]


@pytest.mark.kernel_results
def test_a_program_runs_through_its_nodes_loss_and_return(programs, pool, tmp_path):
    w = Workload(programs, pool, tmp_path / "go",
                 ["--selector", "zone=x", "--vram", "1GiB", "--tenant", "carol"], 6, 0.05)
    node = pool.nodes["a"]
    try:
        w.wait_line("STEP 1")
        s = pool.wait_for(lambda s: [x["state"] for x in _ours(s, "carol")] == ["running"],
                          "the workload's session running")
        (before,) = _ours(s, "carol")
        assert (before["node"], before["vram_limit_bytes"]) == ("a", 1 << 30), s
        # The node stops: silent past the controller's 1.5 s node timeout, it is lost, and
        # the program's session is shown lost.
        os.kill(node.pid, signal.SIGSTOP)
        s = pool.wait_for(lambda s: any(n["name"] == "a" and n["state"] == "lost" for n in s["nodes"])
                          and [x["state"] for x in _ours(s, "carol")] == ["lost"],
                          "node a and the session lost")
        assert next(n for n in s["nodes"] if n["name"] == "b")["state"] == "ready", s
        # Nothing new is placed there meanwhile.
        res = subprocess.run([str(GPUFUSE), "run", "--server", pool.ctrl, "--selector", "zone=x",
                              "--wait", "0", "--", str(programs.kernels["vector_add"])],
                             env=programs.env, capture_output=True, text=True, timeout=120)
        assert res.returncode != 0 and "no ready node has the labels zone=x" in \
            res.stdout + res.stderr, (res.stdout, res.stderr)
        # It comes back: it reports the session, which is running again, the same one.
        os.kill(node.pid, signal.SIGCONT)
        s = pool.wait_for(lambda s: any(n["name"] == "a" and n["state"] == "ready" for n in s["nodes"])
                          and [x["state"] for x in _ours(s, "carol")] == ["running"],
                          "node a back and the session running")
        (after,) = _ours(s, "carol")
        assert (after["id"], after["node"], after["vram_limit_bytes"]) == \
            (before["id"], "a", 1 << 30), (before, after)
        # The program finishes its steps, every byte right.
        w.finish()
    except BaseException:
        print(pool.logs())
        raise
    finally:
        if node.poll() is None:
            os.kill(node.pid, signal.SIGCONT)
        w.kill()


@pytest.mark.kernel_results
def test_a_program_keeps_running_through_a_controller_restart(programs, pool, tmp_path):
    w = Workload(programs, pool, tmp_path / "go",
                 ["--selector", "zone=y", "--vram", "1GiB", "--tenant", "dave"], 40, 0.1)
    try:
        w.wait_line("STEP 1")
        s = pool.wait_for(lambda s: [x["state"] for x in _ours(s, "dave")] == ["running"],
                          "the workload's session running")
        (before,) = _ours(s, "dave")
        assert before["node"] == "b", s
        # The controller dies; the program goes on with its steps (its data path is the
        # node's).
        pool.kill_controller()
        w.flag.touch()
        w.wait_line("STEP 5")
        # A new controller knows nothing until the nodes register again and report what runs.
        pool.start_controller()
        s = pool.wait_for(lambda s: sum(n["state"] == "ready" for n in s["nodes"]) == 2
                          and [x["state"] for x in _ours(s, "dave")] == ["running"],
                          "the nodes registered again and the session running")
        (after,) = _ours(s, "dave")
        assert (after["id"], after["node"], after["device"], after["vram_limit_bytes"]) == \
            (before["id"], "b", before["device"], 1 << 30), (before, after)
        assert w.proc.poll() is None, "the program ended before the new controller saw it"
        w.finish()
        # The new controller places new programs.
        res = subprocess.run([str(GPUFUSE), "run", "--server", pool.ctrl, "--selector", "zone=x",
                              "--vram", "1GiB", "--", str(programs.kernels["vector_add"])],
                             env=programs.env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0 and "PASS vector_add" in res.stdout, (res.stdout, res.stderr)
    except BaseException:
        print(pool.logs())
        raise
    finally:
        w.kill()
