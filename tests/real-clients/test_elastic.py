"""Elastic sessions with a real CUDA client (CuPy through the shim; elastic_workload.py checks
every byte): oversubscription, scale to zero and migration between the devices of a node."""
import subprocess
import time

import pytest

import support
from support import HERE, assert_ok, client_argv

PY = HERE / "python"
# The workloads' managed memory moves (GPUFUSE_SHARED_MANAGED=0): managed memory shared with the
# device over the rings cannot move with its session (test_shared_managed_memory_stays_put).
ENV = {"CUPY_COMPILE_WITH_PTX": "1", "GPUFUSE_SHARED_MANAGED": "0"}


def start(programs, server, argv, vram=None):
    e = dict(programs.env)
    e.update(ENV)
    return subprocess.Popen(client_argv(server.unix, argv, vram), env=e, cwd=HERE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc, timeout=240):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"client timed out\n{out[-3000:]}\n{err[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def wait_until(what, cond, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")



def migrating(server, session, to):
    """`gpufuse migrate` started, not waited for (the move may stop at the program's next call)."""
    return subprocess.Popen([str(support.GPUFUSE), "migrate", str(session), "--to", str(to),
                             "--server", server.unix],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def resumed_on(node):
    wait_until("the client resumed on the other node",
               lambda: "its client resumed the moved session" in node.log_path.read_text())


def frees_everything(node):
    wait_until("the first node frees everything",
               lambda: not node.status()["sessions"]
               and node.status()["devices"][0]["used_bytes"] == 0)

@pytest.fixture
def one_device_server(tmp_path):
    """One device of 256 MiB that may promise 2.1 times that: 60% in host memory, then 50% on
    disk."""
    server = support.Server(
        "emu:1:256MiB",
        extra_args=["--vram-oversubscribe", "host=60,disk=50", "--swap-dir",
                    str(tmp_path / "swap")])
    server.start()
    yield server
    server.stop()


@pytest.fixture
def elastic_server(tmp_path):
    server = support.Server(
        "emu:2:256MiB",
        extra_args=["--vram-oversubscribe", "host=50,disk=50", "--swap-dir",
                    str(tmp_path / "swap"), "--idle-ttl", "1500ms", "--idle-disk-ttl", "3s"])
    server.start()
    yield server
    server.stop()


@pytest.mark.kernel_results
def test_three_sessions_oversubscribe_a_device_and_keep_every_byte(programs, one_device_server):
    """Three sessions whose slices (170 MiB) add up to twice the device (256 MiB) each fill
    150 MiB and run kernels in turns with pauses; every byte is intact, and memory went to
    host memory and to disk meanwhile."""
    elastic_server = one_device_server
    procs = [start(programs, elastic_server,
                   [programs.python, PY / "elastic_workload.py", "150", "6", "0.4", str(k)],
                   vram="170MiB")
             for k in range(3)]
    seen_host = seen_disk = False
    while any(p.poll() is None for p in procs):
        st = elastic_server.status()
        seen_host |= any(s["swapped_host_bytes"] > 0 for s in st["sessions"])
        seen_disk |= any(s["swapped_disk_bytes"] > 0 for s in st["sessions"])
        assert all(d["used_bytes"] <= d["total_bytes"] for d in st["devices"]), st
        time.sleep(0.2)
    for p in procs:
        assert_ok(finish(p), ["FILLED", "PASS elastic_workload"])
    assert seen_host and seen_disk, "sessions were not swapped to host memory and disk"


@pytest.mark.kernel_results
def test_an_idle_session_scales_to_zero_and_warms_up(programs, elastic_server, tmp_path):
    flag = tmp_path / "go"
    proc = start(programs, elastic_server,
                 [programs.python, PY / "elastic_workload.py", "96", "4", "0.1", "9",
                  "--wait-file", flag])
    try:
        def swapped(kind):
            ss = elastic_server.status()["sessions"]
            return ss and ss[0][kind] > 0 and ss[0]["used_bytes"] == 0
        wait_until("the session's memory in host memory", lambda: swapped("swapped_host_bytes"))
        wait_until("the session's memory on disk", lambda: swapped("swapped_disk_bytes"))
        dev = elastic_server.status()["devices"]
        assert sum(d["used_bytes"] for d in dev) == 0, dev
    finally:
        flag.touch()
    assert_ok(finish(proc), ["PASS elastic_workload"])


@pytest.mark.kernel_results
def test_a_running_session_migrates_to_the_other_device(programs, elastic_server, tmp_path):
    flag = tmp_path / "go"
    proc = start(programs, elastic_server,
                 [programs.python, PY / "elastic_workload.py", "64", "8", "0.05", "5",
                  "--wait-file", flag])
    try:
        sess = wait_until("the session", lambda: elastic_server.status()["sessions"])[0]
        wait_until("the workload's first steps",
                   lambda: elastic_server.status()["sessions"][0]["device_time_us"] > 0)
        target = 1 - sess["device"]
        res = migrate(elastic_server, sess["id"], target, timeout=120)
        assert res.returncode == 0, res.stderr
        assert f"runs on device {target}" in res.stdout, res.stdout
        assert "round(s) of pre-copy" in res.stdout, res.stdout
        st = elastic_server.status()
        assert st["sessions"][0]["device"] == target
        assert st["devices"][1 - target]["used_bytes"] == 0
        # Moving to where it is already, or to no device: refused, nothing changes.
        for bad in (str(target), "7"):
            res = migrate(elastic_server, sess["id"], bad, timeout=60)
            assert res.returncode != 0 and "refused" in res.stderr, res.stderr
    finally:
        flag.touch()
    assert_ok(finish(proc), ["PASS elastic_workload"])


@pytest.mark.kernel_results
def test_a_running_session_migrates_to_another_node(programs, tmp_path):
    """A CuPy program (CuPy's default pool, a stream-ordered pool, managed memory, a module
    variable, event timings) moves from one `gpufuse serve` to another on this host while it
    runs: the memory is copied while it waits, the stop comes at its next synchronous call,
    it follows its session to the other node unaware, and every byte is intact there."""
    a = support.Server("emu:1:256MiB")
    b = support.Server("emu:1:256MiB")
    a.start()
    b.start()
    try:
        flag = tmp_path / "go"
        proc = start(programs, a,
                     [programs.python, PY / "elastic_workload.py", "64", "40", "0.05", "6",
                      "--wait-file", flag])
        try:
            sess = wait_until("the session", lambda: a.status()["sessions"])[0]
            wait_until("the workload's first steps",
                       lambda: a.status()["sessions"][0]["device_time_us"] > 0)
            mover = migrating(a, sess["id"], f"{b.unix}:0")
            # The memory is copied while the program waits; the stop comes while it is quiet
            # or at its next synchronous call, and it follows at that call.
            time.sleep(1.0)
        finally:
            flag.touch()
        out, err = mover.communicate(timeout=180)
        assert mover.returncode == 0, err
        assert "runs on node" in out and "round(s) of pre-copy" in out, out
        # The other node took the session and its client resumed it there.
        resumed_on(b)
        res = finish(proc)
        assert_ok(res, ["PASS elastic_workload"])
        frees_everything(a)
    finally:
        a.stop()
        b.stop()


# ---- graphs, VMM memory and in-flight work (elastic_graphs_vmm.py) ---------------------------

GRAPHS_VMM = PY / "elastic_graphs_vmm.py"


class Held:
    """elastic_graphs_vmm.py running with a wait file, its output in files: it holds its
    state (two instantiated graphs, VMM memory mapped and unmapped, work queued without a
    synchronization) until `release()`."""

    def __init__(self, programs, server, tmp_path, mib, seed, *extra, vram=None, name="held"):
        self.flag = tmp_path / f"{name}.go"
        self.out_path = tmp_path / f"{name}.out"
        self.err_path = tmp_path / f"{name}.err"
        e = dict(programs.env)
        e.update(ENV)
        argv = [programs.python, GRAPHS_VMM, str(mib), str(seed), "--wait-file", self.flag,
                *extra]
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(client_argv(server.unix, argv, vram), env=e, cwd=HERE,
                                         stdout=out, stderr=err, text=True)

    def output(self):
        return self.out_path.read_text()

    def wait_queued(self, timeout=180.0):
        def queued():
            if self.proc.poll() is not None:
                pytest.fail(f"the workload ended early ({self.proc.returncode})\n"
                            f"{self.output()[-3000:]}\n{self.err_path.read_text()[-3000:]}")
            return "QUEUED" in self.output()
        wait_until("the workload to queue its work and wait", queued, timeout)

    def release(self):
        self.flag.touch()

    def finish(self, timeout=240):
        self.release()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"client timed out\n{self.output()[-3000:]}\n"
                        f"{self.err_path.read_text()[-3000:]}")
        res = subprocess.CompletedProcess(self.proc.args, self.proc.returncode, self.output(),
                                          self.err_path.read_text())
        assert_ok(res, ["GRAPHS checked", "QUEUED", "TIMED", "PASS elastic_graphs_vmm"])
        return res


def migrate(server, session, to, timeout=180):
    return subprocess.run([str(support.GPUFUSE), "migrate", str(session), "--to", str(to),
                           "--server", server.unix],
                          capture_output=True, text=True, timeout=timeout)


def only_session(server):
    return wait_until("the session", lambda: server.status()["sessions"])[0]


@pytest.mark.kernel_results
def test_graphs_vmm_and_queued_work_survive_oversubscription(programs, one_device_server,
                                                             tmp_path):
    """A session holding instantiated graphs, mapped and unmapped VMM memory and work queued
    without a synchronization waits while two others fill the device: it is swapped out
    (to host memory and disk), then its graphs run again and every byte is right."""
    server = one_device_server
    held = Held(programs, server, tmp_path, 128, 1, vram="170MiB")
    try:
        held.wait_queued()
        mine = only_session(server)["id"]
        others = [start(programs, server,
                        [programs.python, PY / "elastic_workload.py", "150", "4", "0.4",
                         str(k)], vram="170MiB")
                  for k in (2, 3)]

        def evicted():
            s = next(s for s in server.status()["sessions"] if s["id"] == mine)
            return s["swapped_host_bytes"] + s["swapped_disk_bytes"] > 0 and s
        swapped = wait_until("the waiting session swapped out", evicted, timeout=180)
        assert swapped["used_bytes"] < 128 << 20, swapped
    finally:
        held.release()
    held.finish()
    for p in others:
        assert_ok(finish(p), ["FILLED", "PASS elastic_workload"])


@pytest.mark.kernel_results
def test_graphs_vmm_and_queued_work_survive_scale_to_zero(programs, elastic_server, tmp_path):
    held = Held(programs, elastic_server, tmp_path, 64, 2)
    try:
        held.wait_queued()

        def swapped(kind):
            ss = elastic_server.status()["sessions"]
            return ss and ss[0][kind] > 0 and ss[0]["used_bytes"] == 0
        wait_until("the session's memory in host memory", lambda: swapped("swapped_host_bytes"))
        wait_until("the session's memory on disk", lambda: swapped("swapped_disk_bytes"))
        dev = elastic_server.status()["devices"]
        assert sum(d["used_bytes"] for d in dev) == 0, dev
    finally:
        held.release()
    held.finish()


@pytest.fixture
def two_devices():
    server = support.Server("emu:2:256MiB")
    server.start()
    yield server
    server.stop()


@pytest.mark.kernel_results
def test_graphs_vmm_and_queued_work_migrate_to_the_other_device(programs, two_devices, tmp_path):
    """The move is asked right after the work was queued (a kernel of it may still run)."""
    held = Held(programs, two_devices, tmp_path, 64, 3)
    try:
        held.wait_queued()
        sess = only_session(two_devices)
        target = 1 - sess["device"]
        res = migrate(two_devices, sess["id"], target)
        assert res.returncode == 0, res.stderr
        assert f"runs on device {target}" in res.stdout, res.stdout
        st = two_devices.status()
        assert st["sessions"][0]["device"] == target
        assert st["devices"][1 - target]["used_bytes"] == 0, st
        assert st["devices"][target]["used_bytes"] >= 64 << 20, st
    finally:
        held.release()
    held.finish()


@pytest.mark.kernel_results
def test_graphs_vmm_and_queued_work_migrate_to_another_node(programs, tmp_path):
    """The stop comes at the program's first synchronization after the wait: the work it
    queued before ran on the first node, the graphs it instantiated there run on the second."""
    a = support.Server("emu:1:256MiB")
    b = support.Server("emu:1:256MiB")
    a.start()
    b.start()
    try:
        held = Held(programs, a, tmp_path, 64, 4)
        try:
            held.wait_queued()
            sess = only_session(a)
            mover = migrating(a, sess["id"], f"{b.unix}:0")
            # The worker reads the move once the long kernel is done; then the copy runs
            # while the program waits.
            wait_until("the move to begin", lambda: "a session moves in" in b.log_path.read_text())
            time.sleep(1.0)
        finally:
            held.release()
        out, err = mover.communicate(timeout=180)
        assert mover.returncode == 0, err
        assert "runs on node" in out and "round(s) of pre-copy" in out, out
        resumed_on(b)
        held.finish()
        frees_everything(a)
    finally:
        a.stop()
        b.stop()


@pytest.mark.kernel_results
@pytest.mark.parametrize("flag,said,reason", [
    ("--device-malloc", "DEVICE MALLOC used", "device-side malloc"),
    ("--ipc-export", "IPC EXPORTED", "CUDA IPC memory"),
])
def test_a_session_that_cannot_move_stays_untouched(programs, tmp_path, flag, said, reason):
    """A session whose kernels used device-side malloc (the heap's allocator state cannot be
    captured yet), or that exported memory for CUDA IPC (another process may be using it):
    moving it to another device or another node fails with the reason, and it goes on where
    it was, every byte right."""
    a = support.Server("emu:2:256MiB")
    b = support.Server("emu:1:256MiB")
    a.start()
    b.start()
    try:
        held = Held(programs, a, tmp_path, 32, 5, flag)
        try:
            held.wait_queued()
            assert said in held.output()
            before = only_session(a)
            for to in (1 - before["device"], f"{b.unix}:0"):
                res = migrate(a, before["id"], to)
                assert res.returncode != 0, res.stdout
                assert reason in res.stderr, res.stderr
                st = a.status()
                now = st["sessions"][0]
                assert now["id"] == before["id"] and now["device"] == before["device"], now
                assert now["used_bytes"] == before["used_bytes"], (before, now)
                assert st["devices"][1 - before["device"]]["used_bytes"] == 0, st
                assert not b.status()["sessions"], b.status()
        finally:
            held.release()
        held.finish()
    finally:
        a.stop()
        b.stop()


@pytest.mark.kernel_results
def test_shared_managed_memory_stays_put(programs, elastic_server, tmp_path):
    """A session holding managed memory shared with its worker (the client uses those pages at
    the same time) is refused a move with the reason and goes on where it was, every byte
    right."""
    flag = tmp_path / "go"
    e = dict(programs.env)
    e["CUPY_COMPILE_WITH_PTX"] = "1"
    proc = subprocess.Popen(client_argv(elastic_server.unix,
                                        [programs.python, PY / "elastic_workload.py", "64", "8",
                                         "0.05", "5", "--wait-file", flag]),
                            env=e, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        before = wait_until("the session", lambda: elastic_server.status()["sessions"])[0]
        wait_until("the workload's first steps",
                   lambda: elastic_server.status()["sessions"][0]["device_time_us"] > 0)
        res = migrate(elastic_server, before["id"], 1 - before["device"], timeout=120)
        assert res.returncode != 0, res.stdout
        assert "shared with its client" in res.stderr, res.stderr
        st = elastic_server.status()
        assert st["sessions"][0]["device"] == before["device"], st
        assert st["devices"][1 - before["device"]]["used_bytes"] == 0, st
    finally:
        flag.touch()
    assert_ok(finish(proc), ["PASS elastic_workload"])


# Managed memory is shared with the device only over the rings: over a socket (or natively)
# this is not a test of anything, so it is not collected (nothing skipped that would pass).
if support.TRANSPORT != "shm" or support.NATIVE:
    del test_shared_managed_memory_stays_put


@pytest.mark.kernel_results
def test_a_program_whose_threads_keep_launching_migrates_to_another_node(programs, tmp_path):
    """Four host threads of a CuPy program, each on its own stream, launch, copy back into
    pinned memory and synchronize without pause (their quiet launches reach the connection
    through per-stream lanes) while the session moves to another `gpufuse serve`; every
    round's result and every element at the end are checked."""
    a = support.Server("emu:1:256MiB")
    b = support.Server("emu:1:256MiB")
    a.start()
    b.start()
    try:
        stop = tmp_path / "stop"
        proc = start(programs, a, [programs.python, PY / "threads_workload.py", "4",
                                   "--stop-file", stop])
        try:
            sess = wait_until("the session", lambda: a.status()["sessions"])[0]
            wait_until("the threads running",
                       lambda: a.status()["sessions"][0]["device_time_us"] > 0)
            res = migrate(a, sess["id"], f"{b.unix}:0")
            assert res.returncode == 0, res.stderr
            assert "runs on node" in res.stdout, res.stdout
            resumed_on(b)
            # The threads go on there for a while before they stop.
            time.sleep(1.0)
        finally:
            stop.touch()
        assert_ok(finish(proc), ["RUNNING", "PASS threads_workload"])
        frees_everything(a)
    finally:
        a.stop()
        b.stop()
