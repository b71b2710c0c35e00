"""A client SIGKILLed while holding 1 GiB of device memory, or 256 MiB of managed memory (shared
with its worker on the shared-memory transport): the server frees its memory and ends its
session."""
import os
import select
import signal
import subprocess
import time

import pytest

from support import client_argv


def _device_used(status):
    return status["devices"][0]["used_bytes"]


def _wait_for_ready(proc, timeout):
    """Reads the client's stdout (unbuffered) until its READY line; fails if it exits first."""
    fd = proc.stdout.fileno()
    seen = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        readable, _, _ = select.select([fd], [], [], 0.2)
        if readable:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            seen += chunk
            for line in seen.decode(errors="replace").splitlines():
                if line.startswith("READY"):
                    return line
        elif proc.poll() is not None:
            break
    err = proc.stderr.read().decode(errors="replace") if proc.poll() is not None else ""
    raise AssertionError(f"client never got ready (exit {proc.poll()}): stdout {seen!r}\n{err}")


@pytest.mark.parametrize("check,held", [("hold_1gib", 1 << 30), ("hold_managed", 256 << 20)])
def test_sigkilled_client_releases_memory_and_session(programs, server, check, held):
    baseline = server.status()
    base_used = _device_used(baseline)
    base_sessions = {s["id"] for s in baseline["sessions"]}

    proc = subprocess.Popen(client_argv(server.unix, [programs.rt[13], check]),
                            env=programs.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # `gpufuse run` execs the program, so proc.pid is the client itself.
        ready = _wait_for_ready(proc, timeout=60)
        assert int(ready.split("pid=")[1]) == proc.pid

        during = server.status()
        ours = [s for s in during["sessions"] if s["pid"] == proc.pid]
        assert ours, f"no session for pid {proc.pid} in {during['sessions']}"
        assert _device_used(during) >= base_used + held, (
            f"device used_bytes {_device_used(during)} while the client holds {held} B "
            f"(baseline {base_used})")
        assert ours[0]["used_bytes"] >= held, f"session used_bytes {ours[0]['used_bytes']}"

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
