"""CUDA sessions over `tcp+tls:`: certificates from `gpufuse certs`, a server that requires
client certificates, CuPy and cuda-python through the TLS relay, the mistakes users make (no
client certificate, the wrong CA, plain `tcp:` on a TLS port), and a client SIGKILLed over TLS
still freeing its memory and session."""
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

import support
from support import GPUFUSE, assert_ok
from test_session_cleanup import _device_used, _wait_for_ready


@pytest.fixture(scope="module")
def pki():
    d = Path(tempfile.mkdtemp(prefix="gpufuse-pki-"))
    res = subprocess.run([str(GPUFUSE), "certs", "--dir", str(d / "ours")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    other = subprocess.run([str(GPUFUSE), "certs", "--dir", str(d / "other")],
                           capture_output=True, text=True, timeout=60)
    assert other.returncode == 0, other.stderr
    # Keys are private.
    assert (os.stat(d / "ours" / "server-key.pem").st_mode & 0o077) == 0
    # Never overwritten.
    again = subprocess.run([str(GPUFUSE), "certs", "--dir", str(d / "ours")],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode != 0 and "not overwriting" in again.stderr
    return d


@pytest.fixture(scope="module")
def tls_server(pki):
    ours = pki / "ours"
    server = support.Server(tls_args=[
        "--tls-cert", str(ours / "server.pem"), "--tls-key", str(ours / "server-key.pem"),
        "--tls-client-ca", str(ours / "ca.pem")])
    server.start()
    yield server
    server.stop()


def _client_env(programs, pki, *, ca="ours", identity=True):
    env = dict(programs.env)
    env["GPUFUSE_TLS_CA"] = str(pki / ca / "ca.pem")
    if identity:
        env["GPUFUSE_TLS_CERT"] = str(pki / "ours" / "client.pem")
        env["GPUFUSE_TLS_KEY"] = str(pki / "ours" / "client-key.pem")
    else:
        env.pop("GPUFUSE_TLS_CERT", None)
        env.pop("GPUFUSE_TLS_KEY", None)
    return env


def _run(argv, env, timeout=support.CLIENT_TIMEOUT_S):
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=support.HERE)


def test_cupy_and_cuda_python_run_over_tls(programs, pki, tls_server):
    env = _client_env(programs, pki)
    py = programs.env["GPUFUSE_PY"]
    for script, expect in [("cupy_transfers.py", ["PASS transfers", "PASS streams_events"]),
                           ("cuda_bindings_driver.py", [])]:
        res = _run(support.client_argv(tls_server.tls, [py, f"python/{script}"]), env)
        assert_ok(res, expect)
    log = tls_server.log_tail()
    assert "TLS connection failed" not in log, log


def test_the_flags_work_like_the_environment(programs, pki, tls_server):
    ours = pki / "ours"
    env = dict(programs.env)
    for v in ("GPUFUSE_TLS_CA", "GPUFUSE_TLS_CERT", "GPUFUSE_TLS_KEY"):
        env.pop(v, None)
    res = _run([str(GPUFUSE), "status", "--server", tls_server.tls, "--json",
                "--tls-ca", str(ours / "ca.pem"), "--tls-cert", str(ours / "client.pem"),
                "--tls-key", str(ours / "client-key.pem")], env, timeout=30)
    assert res.returncode == 0, res.stderr
    assert '"devices"' in res.stdout


def test_without_a_client_certificate_the_program_never_starts(programs, pki, tls_server):
    env = _client_env(programs, pki, identity=False)
    res = _run(support.client_argv(tls_server.tls, ["/bin/echo", "STARTED"]), env, timeout=60)
    assert res.returncode != 0 and "STARTED" not in res.stdout, res.stdout + res.stderr
    assert "gpufuse" in res.stderr, res.stderr


def test_the_wrong_ca_is_a_clear_error(programs, pki, tls_server):
    env = _client_env(programs, pki, ca="other")
    res = _run(support.client_argv(tls_server.tls, ["/bin/echo", "STARTED"]), env, timeout=60)
    assert res.returncode != 0 and "STARTED" not in res.stdout
    assert "UnknownIssuer" in res.stderr and "--tls-ca" in res.stderr, res.stderr


def test_plain_tcp_on_the_tls_port_is_told_to_use_tls(programs, pki, tls_server):
    plain = tls_server.tls.replace("tcp+tls:", "tcp:")
    res = _run([str(GPUFUSE), "status", "--server", plain], dict(programs.env), timeout=30)
    assert res.returncode != 0
    assert "this listener speaks TLS" in res.stderr, res.stderr


def test_a_client_killed_over_tls_frees_its_memory(programs, pki, tls_server):
    env = _client_env(programs, pki)
    base_used = _device_used(tls_server.status())
    proc = subprocess.Popen(support.client_argv(tls_server.tls, [programs.rt[13], "hold_1gib"]),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for_ready(proc, timeout=60)
        assert _device_used(tls_server.status()) >= base_used + (1 << 30)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 5
        while True:
            after = tls_server.status()
            if _device_used(after) == base_used and not any(
                    s["pid"] == proc.pid for s in after["sessions"]):
                break
            assert time.monotonic() < deadline, f"5 s after SIGKILL: {after}"
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
