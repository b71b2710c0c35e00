"""What an operator and a new user meet with real programs: `gpufuse run` checks admission before
it starts the program, and `gpufuse kill` ends a session (memory freed, the program's next CUDA
call fails with a CUDA error)."""
import json
import subprocess

import pytest

from support import GPUFUSE, NATIVE, client_argv
from test_session_cleanup import _wait_for_ready

pytestmark = pytest.mark.skipif(NATIVE, reason="gpufuse's own commands; nothing to compare natively")


def _gpufuse(*args):
    return subprocess.run([str(GPUFUSE), *map(str, args)], capture_output=True, text=True,
                          timeout=60)


def test_run_refuses_an_oversized_slice_before_the_program_starts(programs, server):
    total = server.status()["devices"][0]["total_bytes"]
    too_big = f"{total // (1 << 20) + 1024}MiB"
    res = subprocess.run(client_argv(server.unix, [programs.rt[13], "device_props"], too_big),
                         env=programs.env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 1, res
    assert "refused the session: cannot grant" in res.stderr, res.stderr
    assert "was not started" in res.stderr, res.stderr
    # The program never ran: its first line (the runtime versions) is absent, and so is the
    # shim's "no CUDA-capable device".
    assert "runtime=" not in res.stdout, res.stdout
    assert "no CUDA-capable device" not in res.stderr, res.stderr


def test_kill_ends_a_session_frees_its_memory_and_the_program_sees_a_cuda_error(programs, server):
    base_used = server.status()["devices"][0]["used_bytes"]
    proc = subprocess.Popen(client_argv(server.unix, [programs.rt[13], "hold_until_stdin"]),
                            env=programs.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        _wait_for_ready(proc, timeout=60)
        listed = _gpufuse("sessions", "--server", server.unix, "--json")
        assert listed.returncode == 0, listed.stderr
        ours = [s for s in json.loads(listed.stdout) if s["pid"] == proc.pid]
        assert len(ours) == 1, listed.stdout
        assert ours[0]["used_bytes"] >= 1 << 30

        killed = _gpufuse("kill", "--server", server.unix, ours[0]["id"])
        assert killed.returncode == 0, killed.stderr
        assert f"session {ours[0]['id']} ended" in killed.stdout

        # `kill` returns once the session is released.
        after = server.status()
        assert not any(s["pid"] == proc.pid for s in after["sessions"]), after["sessions"]
        assert after["devices"][0]["used_bytes"] == base_used, after["devices"]

        out, err = proc.communicate(b"go\n", timeout=60)
        out, err = out.decode(errors="replace"), err.decode(errors="replace")
        assert proc.returncode == 0, (out, err)
        line = next(l for l in out.splitlines() if l.startswith("AFTER"))
        # The memset is asynchronous (queued, as on a GPU); the synchronize reports
        # CUDA_ERROR_DEVICE_UNAVAILABLE, as libcudart's cudaErrorDevicesUnavailable.
        memset, sync = (kv.split("=")[1] for kv in line.split()[1:])
        assert memset in ("cudaSuccess", "cudaErrorDevicesUnavailable"), (line, err)
        assert sync == "cudaErrorDevicesUnavailable", (line, err)
        # The shim says why, once.
        assert err.count("the session has ended") == 1, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_stopped_worker_is_a_cuda_error_not_a_hang(programs, server):
    """A libcudart program whose worker stops (SIGSTOP) used to hang in its next synchronizing
    call for ever; with GPUFUSE_CALL_TIMEOUT it gets a CUDA error once the worker has been
    silent that long, and the shim says why."""
    import os
    import signal
    env = dict(programs.env, GPUFUSE_CALL_TIMEOUT="2")
    proc = subprocess.Popen(client_argv(server.unix, [programs.rt[13], "hold_until_stdin"]),
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    worker = None
    try:
        _wait_for_ready(proc, timeout=60)
        listed = _gpufuse("sessions", "--server", server.unix, "--json")
        assert listed.returncode == 0, listed.stderr
        ours = [s for s in json.loads(listed.stdout) if s["pid"] == proc.pid]
        assert len(ours) == 1, listed.stdout
        worker = ours[0]["worker_pid"]
        os.kill(worker, signal.SIGSTOP)
        out, err = proc.communicate(b"go\n", timeout=60)
        out, err = out.decode(errors="replace"), err.decode(errors="replace")
        assert proc.returncode == 0, (out, err)
        line = next(l for l in out.splitlines() if l.startswith("AFTER"))
        sync = line.split()[2].split("=")[1]
        assert sync == "cudaErrorDevicesUnavailable", (line, err)
        assert "GPUFUSE_CALL_TIMEOUT" in err, err
    finally:
        if worker is not None:
            os.kill(worker, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # Continued, the worker finds its client gone and the session ends.
    import time
    deadline = time.monotonic() + 30
    while any(s["pid"] == proc.pid for s in server.status()["sessions"]):
        assert time.monotonic() < deadline, server.status()["sessions"]
        time.sleep(0.1)
