"""What an operator sees of a real CUDA program: cuda-python + NVRTC launching kernels through
the shim against `gpufuse serve --http`. /metrics agrees with `gpufuse status --json`, every
series the Grafana dashboard asks for has samples, `gpufuse top` shows the session on a tmux
screen and obeys its keys, and headless Chromium renders the web dashboard with the live
session and updates it (screenshots: set GPUFUSE_SAVE_SCREENSHOTS=1 to keep them in docs/).
tmux and chromium are Debian packages that scripts/setup-test-deps.sh installs."""
import json
import os
import re
import shutil
import subprocess
import time
import urllib.request

import pytest

from support import GPUFUSE, HERE, NATIVE, ROOT, Server, free_tcp_port

pytestmark = pytest.mark.skipif(NATIVE, reason="gpufuse's own observability; nothing native")

PY = HERE / "python"
DOCS = ROOT / "docs"


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def _status(server) -> dict:
    res = subprocess.run([str(GPUFUSE), "status", "--server", server.unix, "--json"],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _sample(text: str, name: str, *labels: str) -> float:
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        if re.split(r"[{ ]", line, 1)[0] == name and all(l in line for l in labels):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {name} with {labels}:\n{text}")


@pytest.fixture(scope="module")
def observed(programs):
    port = free_tcp_port()
    server = Server(extra_args=["--http", f"127.0.0.1:{port}"])
    server.start()
    server.http = f"http://127.0.0.1:{port}"
    cmd = [str(GPUFUSE), "run", "--server", server.unix, "--vram", "512MiB", "--compute", "50",
           "--qos", "high", "--", str(programs.python), str(PY / "observe_load.py")]
    proc = subprocess.Popen(cmd, env=programs.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        if not line.startswith("READY"):
            proc.kill()
            out, err = proc.communicate(timeout=30)
            pytest.fail(f"the load did not start: {line}{out}\n{err}")
        ours = [s for s in _status(server)["sessions"]]
        assert len(ours) == 1, ours
        yield server, proc, ours[0]["id"]
        proc.stdin.write("stop\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, (out, err)
        assert "DONE launches=" in out, (out, err)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.stop()


def test_metrics_agree_with_status_while_a_real_client_runs(observed):
    server, _, sid = observed
    time.sleep(1.2)
    before = _status(server)
    text = _get(server.http + "/metrics")
    after = _status(server)
    d, s = before["devices"][0], before["sessions"][0]
    ses = f'session="{sid}"'
    assert _sample(text, "gpufuse_device_memory_total_bytes", 'gpu="0"') == d["total_bytes"]
    assert _sample(text, "gpufuse_device_memory_used_bytes", 'gpu="0"') == d["used_bytes"]
    assert _sample(text, "gpufuse_device_memory_promised_bytes", 'gpu="0"') == 512 << 20
    assert _sample(text, "gpufuse_device_sessions", 'gpu="0"') == 1
    assert _sample(text, "gpufuse_device_busy_ratio", 'gpu="0"') > 0
    assert _sample(text, "gpufuse_session_memory_used_bytes", ses) == s["used_bytes"]
    assert s["used_bytes"] >= 68 << 20, s
    assert _sample(text, "gpufuse_session_memory_limit_bytes", ses, 'qos="high"',
                   'tenant="default"') == s["limit_bytes"]
    assert _sample(text, "gpufuse_session_compute_share_ratio", ses) == 0.5
    secs = _sample(text, "gpufuse_session_device_seconds_total", ses)
    lo, hi = s["device_time_us"] / 1e6, after["sessions"][0]["device_time_us"] / 1e6
    assert 0 < lo <= secs <= hi, (lo, secs, hi)
    assert _sample(text, "gpufuse_session_queue_wait_seconds_count", ses) >= 3
    assert _sample(text, "gpufuse_session_throttled_seconds_total", ses) == 0
    state = [l for l in text.splitlines() if l.startswith("gpufuse_session_state{")]
    assert len(state) == 1 and ('state="running"' in state[0] or 'state="active"' in state[0]), state

    # Every series the Grafana dashboard asks for has samples here (the elastic sessions'
    # swapped and resident memory are allowed to be only declared, for a node without them).
    dashboard = json.loads((ROOT / "deploy/grafana/gpufuse-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    names = {n for e in exprs for n in re.findall(r"gpufuse_[a-z_]+", e)}
    assert len(names) >= 15, names
    sampled = {re.split(r"[{ ]", l, 1)[0] for l in text.splitlines() if not l.startswith("#")}
    declared = {l.split()[2] for l in text.splitlines() if l.startswith("# TYPE ")}
    for n in sorted(names):
        if n in sampled:
            continue
        assert n in ("gpufuse_session_swapped_bytes", "gpufuse_session_resident_bytes"), \
            f"{n} has no samples"
        assert n in declared, n


def _tmux(*args, check=True):
    return subprocess.run(["tmux", *args], capture_output=True, text=True, timeout=30,
                          check=check)


def _screen_until(session: str, pred, timeout: float = 15.0) -> str:
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = _tmux("capture-pane", "-p", "-t", session).stdout
        if pred(screen):
            return screen
        time.sleep(0.2)
    raise AssertionError(f"the screen never showed what was expected:\n{screen}")


def test_top_shows_the_live_session_under_tmux_and_obeys_its_keys(observed, tmp_path):
    server, _, sid = observed
    assert shutil.which("tmux"), "tmux is missing: run scripts/setup-test-deps.sh"
    name = f"gpufuse-top-{os.getpid()}"
    _tmux("new-session", "-d", "-s", name, "-x", "160", "-y", "30",
          f"{GPUFUSE} top --server {server.unix}; sleep 30")
    try:
        screen = _screen_until(name, lambda s: f"#{sid}" in s and "python" in s)
        assert "gpufuse emulated GPU" in screen, screen
        assert "high" in screen and "50%" in screen, screen
        assert "512M" in screen, screen  # the memory bar's limit
        first = _screen_until(name, lambda s: re.search(rf"#{sid} .* (running|active)\b", s))
        (tmp_path / "top.txt").write_text(first)
        # It refreshes: the session's device time moves on.
        dev_time = lambda s: re.search(rf"#{sid} .*?(\d+\.\d+m?s) ", s)
        t0 = dev_time(first).group(1)
        _screen_until(name, lambda s: dev_time(s) and dev_time(s).group(1) != t0)
        for key in ("tenant", "memory (desc)", "busy (desc)"):
            _tmux("send-keys", "-t", name, "s")
            _screen_until(name, lambda s: f"sorted by {key}" in s)
        _tmux("send-keys", "-t", name, "/", "n", "o", "b", "o", "d", "y", "Enter")
        _screen_until(name, lambda s: "0 shown" in s and "filter /nobody" in s)
        _tmux("send-keys", "-t", name, "Escape")
        _screen_until(name, lambda s: "1 shown" in s)
        _tmux("send-keys", "-t", name, "q")
        # top quits and gives the terminal back (the shell's `sleep` keeps the pane).
        _screen_until(name, lambda s: "sessions:" not in s)
        if os.environ.get("GPUFUSE_SAVE_SCREENSHOTS") == "1":
            shutil.copy(tmp_path / "top.txt", DOCS / "observability-top.txt")
    finally:
        _tmux("kill-session", "-t", name, check=False)


def _chromium() -> str:
    for b in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(b):
            return b
    raise AssertionError("chromium is missing: run scripts/setup-test-deps.sh")


def _browse(url: str, *args: str, budget_ms: int = 4000) -> subprocess.CompletedProcess:
    return subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                           "--disable-dev-shm-usage", "--window-size=1400,1100",
                           f"--virtual-time-budget={budget_ms}", *args, url],
                          capture_output=True, text=True, timeout=120)


def test_dashboard_renders_the_live_session_and_updates_in_headless_chromium(observed, tmp_path):
    server, _, sid = observed
    dom = _browse(server.http + "/", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-3000:]
    html = dom.stdout
    assert 'data-ready="1"' in html, html[-3000:]
    # The page redraws itself from the API (once a second).
    renders = int(re.search(r'data-renders="(\d+)"', html).group(1))
    assert renders >= 2, renders
    row = re.search(rf'<tr data-session="{sid}">(.*?)</tr>', html, re.S)
    assert row, html[-5000:]
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)
    assert cells[0] == f"#{sid}" and "python" in cells[2] and cells[4] == "high", cells
    assert cells[5] == "50%", cells
    assert "gpufuse emulated GPU" in html
    # A second load a moment later shows the session's device time grown.
    time.sleep(1.5)
    html2 = _browse(server.http + "/", "--dump-dom").stdout
    row2 = re.search(rf'<tr data-session="{sid}">(.*?)</tr>', html2, re.S)
    cells2 = re.findall(r"<td[^>]*>(.*?)</td>", row2.group(1), re.S)
    secs = lambda c: float(re.sub(r"[^\d.]", "", c)) * (1e-3 if "ms" in c else 1e-6 if "µs" in c else 1)
    assert secs(cells2[8]) > secs(cells[8]), (cells[8], cells2[8])
    shot = tmp_path / "dashboard.png"
    res = _browse(server.http + "/", f"--screenshot={shot}")
    assert res.returncode == 0 and shot.stat().st_size > 10_000, res.stderr[-3000:]
    if os.environ.get("GPUFUSE_SAVE_SCREENSHOTS") == "1":
        shutil.copy(shot, DOCS / "observability-dashboard.png")
