"""The pool with real programs: a `gpufuse controller` and two `gpufuse node`s (emulated GPUs) on
unix sockets; nvcc-built programs and a CuPy workload (elastic_workload.py, checked byte for
byte) run through the shim, asking the controller and redirected to their node.
`gpufuse run --server CONTROLLER`, an unmodified program whose GPUFUSE_SERVER names the
controller, a preempted program that sees a CUDA error, a program whose node is lost (SIGSTOP)
and comes back (SIGCONT), and a program that runs on while the controller is killed and a new
one learns its session from the node. And small CuPy programs (pool_program.py, every element
checked): placed per policy (binpack, spread, balanced) on the devices the policy picks, a quota
file refusing a program over its tenant's quota (a CUDA error at init naming the limit) while
one within it runs, and a program that fits nowhere waiting visibly as pending until another
ends, then running right."""
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

from support import GPUFUSE, HERE, NATIVE, ROOT, TRANSPORT, load_deps_env
from test_session_cleanup import _wait_for_ready

pytestmark = pytest.mark.skipif(NATIVE, reason="the pool is gpufuse's own; nothing to compare natively")


def _wait_socket(path: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        assert proc.poll() is None, f"{proc.args} exited"
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.02)


class Pool:
    """A controller (`controller_args`: --policy, --quota-file) and nodes a (zone=x) and b
    (zone=y), each with `devices`, registered one after the other."""

    def __init__(self, devices: str = "emu:1:4GiB", controller_args=()):
        self.dir = Path(tempfile.mkdtemp(prefix="gpufuse-pool-"))
        self.ctrl = f"unix:{self.dir / 'c.sock'}"
        self.procs = []
        self.controller_args = list(controller_args)
        self.start_controller()
        self.nodes = {}
        for name, label in (("a", "zone=x"), ("b", "zone=y")):
            log = open(self.dir / f"{name}.log", "w")
            n = subprocess.Popen([str(GPUFUSE), "node", "--controller", self.ctrl,
                                  "--listen", f"unix:{self.dir / (name + '.sock')}",
                                  "--devices", devices, "--name", name, "--label", label],
                                 stderr=log)
            self.procs.append(n)
            self.nodes[name] = n
            _wait_socket(self.dir / f"{name}.sock", n)
            self.wait_for(lambda s, name=name: any(x["name"] == name and x["state"] == "ready"
                                                   for x in s["nodes"]), f"node {name} registered")

    def start_controller(self) -> subprocess.Popen:
        """A controller on the pool's socket (again, after `kill_controller`)."""
        log = open(self.dir / "controller.log", "a")
        c = subprocess.Popen([str(GPUFUSE), "controller", "--listen", self.ctrl,
                              "--heartbeat-ms", "100", "--node-timeout-ms", "1500",
                              *self.controller_args],
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
        # Its managed memory moves: memory shared with the device over the rings cannot move
        # with the session (test_elastic.py, test_shared_managed_memory_stays_put).
        env["GPUFUSE_SHARED_MANAGED"] = "0"
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


# ---- placement per policy, quotas and the pending queue, with CuPy programs ------------------

PROGRAM = HERE / "python" / "pool_program.py"
N = 4096


def _expected_sum(seed: int, hold: bool) -> int:
    """What pool_program.py SEED prints as its sum, computed here in Python integers."""
    ys = [3 * x + seed for x in range(N)]
    return sum(y * y - x for x, y in zip(range(N), ys)) if hold else sum(ys)


@pytest.fixture(scope="module")
def cupy_env() -> dict:
    """The environment CuPy programs run with (as `programs.env`, without building the nvcc
    programs, which these tests do not use): NVRTC's libraries on the loader path, CuPy's
    kernel cache in build/, PTX for the emulated GPU."""
    deps = load_deps_env()
    env = dict(os.environ)
    env.pop("GPUFUSE_SERVER", None)
    old = env.get("LD_LIBRARY_PATH", "")
    env["LD_LIBRARY_PATH"] = ":".join([deps["GPUFUSE_NVRTC12_LIB"], deps["GPUFUSE_NVRTC13_LIB"]]
                                      + ([old] if old else []))
    env["CUPY_CACHE_DIR"] = str(HERE / "build" / "cupy-cache")
    env["CUPY_COMPILE_WITH_PTX"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env["GPUFUSE_TRANSPORT"] = TRANSPORT
    env["POOL_TEST_PYTHON"] = deps["GPUFUSE_PY"]
    return env


class Program:
    """pool_program.py SEED through `gpufuse run --server CONTROLLER ARGS`; with hold, it
    stops (its session open) after its first kernel until `finish`."""

    def __init__(self, pool, env, seed: int, args, hold: bool = True):
        self.seed, self.hold = seed, hold
        argv = [str(GPUFUSE), "run", "--server", pool.ctrl, *args, "--", str(env_python(env)),
                str(PROGRAM), str(seed)] + (["--hold"] if hold else [])
        self.proc = subprocess.Popen(argv, env=env, cwd=HERE, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def ready(self, timeout: float = 240) -> None:
        """Waits for its READY line (fails, with its stderr, if it exits first)."""
        _wait_for_ready(self.proc, timeout=timeout)

    def finish(self, timeout: float = 240) -> None:
        """Lets it go on and checks its result, number by number."""
        try:
            out, err = self.proc.communicate(b"go\n" if self.hold else None, timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            pytest.fail(f"pool_program {self.seed} timed out: {out!r} {err.decode()[-3000:]}")
        out, err = out.decode(), err.decode()
        assert self.proc.returncode == 0, (out, err[-3000:])
        want = f"PASS pool_program {self.seed} {_expected_sum(self.seed, self.hold)}"
        assert want in out.splitlines(), (want, out, err[-3000:])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def env_python(env: dict) -> str:
    return env["POOL_TEST_PYTHON"]


def _running(s: dict) -> list[dict]:
    return sorted((x for x in s["sessions"] if x["state"] == "running"), key=lambda x: x["id"])


@pytest.mark.kernel_results
@pytest.mark.parametrize("policy", ["binpack", "spread", "balanced"])
def test_programs_land_where_the_policy_says(cupy_env, policy):
    # Two nodes of two 4 GiB GPUs; three programs of 1 GiB, each placed after the one before
    # runs, so every decision sees the ones before it.
    pool = Pool(devices="emu:2:4GiB", controller_args=["--policy", policy])
    progs = []
    try:
        for i in range(3):
            p = Program(pool, cupy_env, 11 + i, ["--vram", "1GiB", "--tenant", f"p{i}"])
            progs.append(p)
            p.ready()
            s = pool.wait_for(lambda s, i=i: len(_running(s)) == i + 1, f"{i + 1} running")
        where = [(x["node"], x["device"]) for x in _running(s)]
        assert [x["tenant"] for x in _running(s)] == ["p0", "p1", "p2"], s
        assert all(x["vram_limit_bytes"] == 1 << 30 for x in _running(s)), s
        if policy == "binpack":
            # The fullest device that fits: all three share the first one.
            assert len(set(where)) == 1, where
        elif policy == "spread":
            # The emptiest device each time: three devices.
            assert len(set(where)) == 3, where
        else:
            # The fullest node, the emptiest device on it: one node, both its devices.
            assert len({n for n, _ in where}) == 1, where
            assert where[0][1] != where[1][1] and len({d for _, d in where}) == 2, where
        # The devices' books agree: each holds 1 GiB per program on it.
        for node in s["nodes"]:
            for d in node["devices"]:
                n = where.count((node["name"], d["index"]))
                assert (d["sessions"], d["memory_promised_bytes"]) == (n, n << 30), (node, where)
        for p in progs:
            p.finish()
    except BaseException:
        print(pool.logs())
        raise
    finally:
        for p in progs:
            p.kill()
        pool.stop()


@pytest.mark.kernel_results
def test_a_quota_file_refuses_a_program_over_its_tenants_quota(cupy_env, tmp_path):
    quota = tmp_path / "quota.toml"
    quota.write_text('[tenants.alice]\nsessions = 1\nmax_session_vram = "1GiB"\n')
    pool = Pool(controller_args=["--quota-file", str(quota)])
    within = Program(pool, cupy_env, 21, ["--tenant", "alice"])
    try:
        within.ready()
        s = pool.wait_for(lambda s: len(_running(s)) == 1, "alice's first program running")
        (first,) = _running(s)
        # No slice asked: the per-session maximum is its slice.
        assert (first["tenant"], first["vram_limit_bytes"]) == ("alice", 1 << 30), s
        # An unmodified program of alice's (GPUFUSE_SERVER names the controller, the tenant
        # rides in GPUFUSE_TOKEN): its first CUDA call fails, and stderr names the limit.
        env = dict(cupy_env)
        env["LD_LIBRARY_PATH"] = f"{ROOT / 'target' / 'release' / 'gpufuse-shim'}:" \
                                 f"{env.get('LD_LIBRARY_PATH', '')}"
        env["GPUFUSE_SERVER"] = pool.ctrl
        env["GPUFUSE_TOKEN"] = "gfp1;tenant=alice;token="
        res = subprocess.run([str(env_python(env)), str(PROGRAM), "22"], env=env, cwd=HERE,
                             capture_output=True, text=True, timeout=240)
        assert res.returncode != 0, (res.stdout, res.stderr)
        assert "PASS" not in res.stdout, res.stdout
        assert 'tenant "alice" is at its session quota (sessions = 1): 1 session(s) hold it' \
            in res.stderr, res.stderr[-3000:]
        assert "CUDARuntimeError" in res.stderr or "CUDADriverError" in res.stderr, \
            res.stderr[-3000:]
        # Through `gpufuse run`: over the per-session maximum, refused before the program
        # starts.
        res = subprocess.run([str(GPUFUSE), "run", "--server", pool.ctrl, "--tenant", "alice",
                              "--vram", "2GiB", "--", str(env_python(env)), str(PROGRAM), "23"],
                             env=cupy_env, cwd=HERE, capture_output=True, text=True, timeout=240)
        assert res.returncode != 0 and "PASS" not in res.stdout, (res.stdout, res.stderr)
        assert "max_session_vram" in res.stderr and "was not started" in res.stderr, res.stderr
        # Nothing of the refused programs is in the pool; alice's program runs on, right.
        s = pool.status()
        assert [x["tenant"] for x in s["sessions"]] == ["alice"] and s["pending"] == [], s
        within.finish()
        # Its session gone, alice may run another.
        pool.wait_for(lambda s: s["sessions"] == [], "alice's session gone")
        again = Program(pool, cupy_env, 24, ["--tenant", "alice"], hold=False)
        again.finish()
    except BaseException:
        print(pool.logs())
        raise
    finally:
        within.kill()
        pool.stop()


@pytest.mark.kernel_results
def test_a_program_that_fits_nowhere_waits_pending_then_runs(cupy_env):
    pool = Pool()
    big = Program(pool, cupy_env, 31, ["--selector", "zone=x", "--vram", "3GiB"])
    waiter = None
    try:
        big.ready()
        pool.wait_for(lambda s: len(_running(s)) == 1, "the first program running")
        # 1 GiB is left on zone=x's one device: a 2 GiB program waits (up to 120 s).
        waiter = Program(pool, cupy_env, 32,
                         ["--selector", "zone=x", "--vram", "2GiB", "--wait", "120"])
        s = pool.wait_for(lambda s: len(s["pending"]) == 1, "the second program pending")
        (p,) = s["pending"]
        assert p["reason"] == "no device has 2 GiB of VRAM free (the most free on one device " \
                              "is 1 GiB)", p
        assert p["vram_bytes"] == 2 << 30, p
        assert [x["state"] for x in s["sessions"] if x["id"] == p["id"]] == ["pending"], s
        # It stays waiting while the first runs.
        time.sleep(1)
        s = pool.status()
        assert len(s["pending"]) == 1 and s["pending"][0]["waiting_ms"] >= 1000, s
        assert waiter.proc.poll() is None
        # The first program ends: the second is placed on node a and completes, right.
        big.finish()
        waiter.ready()
        s = pool.wait_for(lambda s: s["pending"] == [] and len(_running(s)) == 1,
                          "the second program running")
        (second,) = _running(s)
        assert (second["id"], second["node"], second["vram_limit_bytes"]) == \
            (p["id"], "a", 2 << 30), s
        waiter.finish()
    except BaseException:
        print(pool.logs())
        raise
    finally:
        big.kill()
        if waiter is not None:
            waiter.kill()
        pool.stop()
