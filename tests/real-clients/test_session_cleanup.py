"""A client SIGKILLed while holding 1 GiB: the server frees its memory and ends its session."""
import os
import select
import signal
import subprocess
import time

from support import client_argv


def _device_used(status):
    return status["devices"][0]["used_bytes"]


def test_sigkilled_client_releases_memory_and_session(programs, server):
    baseline = server.status()
    base_used = _device_used(baseline)
    base_sessions = {s["id"] for s in baseline["sessions"]}

    proc = subprocess.Popen(client_argv(server.unix, [programs.rt[13], "hold_1gib"]),
                            env=programs.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        # `gpufuse run` execs the program, so proc.pid is the client itself.
        deadline = time.monotonic() + 60
        line = ""
        while time.monotonic() < deadline and proc.poll() is None:
            ready, _, _ = select.select([proc.stdout], [], [], 0.5)
            if ready:
                line = proc.stdout.readline()
                if line.startswith("READY"):
                    break
        assert line.startswith("READY"), (
            f"client never got ready (exit {proc.poll()}): {line!r}\n{proc.stderr.read() if proc.poll() is not None else ''}")
        assert int(line.split("pid=")[1]) == proc.pid

        during = server.status()
        ours = [s for s in during["sessions"] if s["pid"] == proc.pid]
        assert ours, f"no session for pid {proc.pid} in {during['sessions']}"
        assert _device_used(during) >= base_used + (1 << 30), (
            f"device used_bytes {_device_used(during)} while the client holds 1 GiB "
            f"(baseline {base_used})")
        assert ours[0]["used_bytes"] >= 1 << 30, f"session used_bytes {ours[0]['used_bytes']}"

        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert proc.returncode == -signal.SIGKILL

        deadline = time.monotonic() + 5
        while True:
            after = server.status()
            sessions = {s["id"] for s in after["sessions"]}
            gone = not any(s["pid"] == proc.pid for s in after["sessions"])
            if _device_used(after) == base_used and gone and sessions <= base_sessions:
                break
            assert time.monotonic() < deadline, (
                f"5 s after SIGKILL: device used_bytes {_device_used(after)} "
                f"(baseline {base_used}), sessions {after['sessions']}")
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
