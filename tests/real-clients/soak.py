"""A soak of real clients: SESSIONS concurrent slots, each running real client programs one
after another until the time is up, in a mix of NVIDIA's stacks:
- libcudart (runtime/rt_hardening.c `churn`: allocate, copy, record, synchronize, free, in a
  loop of up to 10 s per process, so sessions also come and go);
- CuPy (python/cupy_transfers.py: transfers, streams and events);
- cuda-python (python/cuda_bindings_textures.py: NVRTC-compiled kernels over texture and
  surface objects, results checked).
While they run, the node is sampled every INTERVAL seconds: its RSS, its worker processes, the
sessions it serves and the device bytes its ledger holds. The soak passes when every client
run passed, the node's RSS did not grow between the first and the last quarter of the run (nor
after it), and once the clients are gone no session, worker or ledger byte is left.

As a script (scripts/soak.sh --sessions 64 --minutes 10): builds the test programs, starts its
own `gpufuse serve`, prints the samples and the summary, exits 1 on a failure. In the suite:
test_soak.py runs a bounded one.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import support  # noqa: E402

PY = HERE / "python"
# RSS growth allowed between the first and the last quarter of the run, and from after the
# warm-up to after the soak: tables and allocator arenas settle, a leak per session does not.
RSS_SLACK_KIB = 16 * 1024
CHURN_SECONDS = 10.0
# 64 sessions on a 2-core machine oversubscribe it dozens of times over: a client's hello may
# wait longer than the default 10 s for the node to get the CPU. A soak measures errors of the
# sessions, not the scheduler's latency under that load (GPUFUSE_HELLO_TIMEOUT overrides).
HELLO_TIMEOUT_S = os.environ.get("GPUFUSE_HELLO_TIMEOUT", "120")


@dataclass
class Sample:
    t: float
    rss_kib: int
    workers: int
    sessions: int
    ledger_bytes: int


@dataclass
class Result:
    sessions: int
    seconds: float
    runs: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    error_count: int = 0
    samples: list[Sample] = field(default_factory=list)
    rss_warm_kib: int = 0
    rss_after_kib: int = 0
    idle_after: dict = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    missed_samples: list[str] = field(default_factory=list)

    def summary(self) -> str:
        rss = [s.rss_kib for s in self.samples] or [0]
        workers = [s.workers for s in self.samples] or [0]
        ledger = [s.ledger_bytes for s in self.samples] or [0]
        q = max(1, len(self.samples) // 4)
        first = statistics.median(rss[:q])
        last = statistics.median(rss[-q:])
        return (
            f"soak: {self.sessions} sessions x {self.seconds:.0f} s; client runs "
            f"{sum(self.runs.values())} ({', '.join(f'{k} {v}' for k, v in sorted(self.runs.items()))}); "
            f"errors {self.error_count}; node RSS warm {self.rss_warm_kib} KiB, first quarter "
            f"{first:.0f} KiB, last quarter {last:.0f} KiB, peak {max(rss)} KiB, after "
            f"{self.rss_after_kib} KiB; workers peak {max(workers)}, after "
            f"{self.idle_after.get('workers', '?')}; ledger peak {max(ledger)} B, after "
            f"{self.idle_after.get('ledger_bytes', '?')} B; samples {len(self.samples)} "
            f"(missed {len(self.missed_samples)})")


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def _workers_of(pid: int) -> int:
    res = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return len(res.stdout.split())


def _sample(server, t0: float) -> Sample:
    st = server.status()
    return Sample(
        t=time.monotonic() - t0,
        rss_kib=_rss_kib(server.proc.pid),
        workers=_workers_of(server.proc.pid),
        sessions=len(st["sessions"]),
        ledger_bytes=sum(d["used_bytes"] for d in st["devices"]),
    )


def mix(programs) -> list[tuple[str, list, dict, str]]:
    """(name, argv, extra environment, the line a passing run prints), in slot order."""
    return [
        ("libcudart", [programs.rt[13], "churn"], {}, "PASS churn"),
        ("cupy", [programs.python, PY / "cupy_transfers.py", "transfers", "streams_events"],
         {}, "PASS streams_events"),
        # (cuda_bindings_driver.py checks cuMemGetInfo deltas, which other sessions move.)
        ("cuda-python", [programs.python, PY / "cuda_bindings_textures.py"],
         {}, "PASS cuda_bindings_textures"),
    ]


def soak(programs, server, sessions: int, seconds: float, interval: float = 5.0,
         log=print) -> Result:
    res = Result(sessions=sessions, seconds=seconds)
    # `gpufuse status` (the samples) says hello too.
    saved_timeout = os.environ.get("GPUFUSE_HELLO_TIMEOUT")
    os.environ["GPUFUSE_HELLO_TIMEOUT"] = HELLO_TIMEOUT_S
    try:
        return _soak(res, programs, server, sessions, seconds, interval, log)
    finally:
        if saved_timeout is None:
            del os.environ["GPUFUSE_HELLO_TIMEOUT"]
        else:
            os.environ["GPUFUSE_HELLO_TIMEOUT"] = saved_timeout


def _soak(res, programs, server, sessions, seconds, interval, log) -> Result:
    kinds = mix(programs)
    lock = threading.Lock()
    # The ledger's bytes with no session, and the node warmed up by one run of each kind.
    baseline = _sample(server, 0.0)
    for name, argv, env, want in kinds:
        r = support.run_client(programs, server.unix, argv,
                               env=dict(env, GPUFUSE_CHURN_SECONDS="0.2"))
        if r.returncode != 0 or want not in r.stdout:
            res.problems.append(f"warm-up {name} failed: exit {r.returncode}: {r.stderr[-2000:]}")
            return res
    res.rss_warm_kib = _rss_kib(server.proc.pid)
    t0 = time.monotonic()
    deadline = t0 + seconds
    stop = threading.Event()

    def sampler():
        while not stop.is_set():
            try:
                s = _sample(server, t0)
            except Exception as e:  # a status the loaded node answers too late: noted, retried
                with lock:
                    res.missed_samples.append(f"{time.monotonic() - t0:.0f} s: {e}")
            else:
                with lock:
                    res.samples.append(s)
            stop.wait(interval)

    def slot(i: int):
        name, argv, env, want = kinds[i % len(kinds)]
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            e = dict(env, GPUFUSE_CHURN_SECONDS=f"{min(CHURN_SECONDS, max(left, 0.2)):.1f}",
                     GPUFUSE_HELLO_TIMEOUT=HELLO_TIMEOUT_S)
            try:
                r = support.run_client(programs, server.unix, argv, env=e)
            except BaseException as x:  # a client that hangs past its timeout (pytest.fail)
                r = subprocess.CompletedProcess(argv, -1, "", f"{type(x).__name__}: {x}")
            with lock:
                res.runs[name] = res.runs.get(name, 0) + 1
                if r.returncode != 0 or want not in r.stdout:
                    res.error_count += 1
                    if len(res.errors) < 5:
                        res.errors.append(f"{name} (slot {i}) exit {r.returncode}:\n"
                                          f"{r.stdout[-1500:]}\n{r.stderr[-2500:]}")

    sampling = threading.Thread(target=sampler, daemon=True)
    sampling.start()
    threads = [threading.Thread(target=slot, args=(i,), daemon=True) for i in range(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    sampling.join()
    log(f"clients done {time.monotonic() - t0:.0f} s after the start")

    # Everything the sessions held is given back.
    idle_deadline = time.monotonic() + 30
    while True:
        s = _sample(server, t0)
        if s.sessions == 0 and s.workers == 0 and s.ledger_bytes == baseline.ledger_bytes:
            break
        if time.monotonic() > idle_deadline:
            res.problems.append(
                f"30 s after the clients: {s.sessions} sessions, {s.workers} workers, "
                f"{s.ledger_bytes} ledger bytes (baseline {baseline.ledger_bytes})")
            break
        time.sleep(0.2)
    res.idle_after = {"sessions": s.sessions, "workers": s.workers,
                      "ledger_bytes": s.ledger_bytes}
    res.rss_after_kib = _rss_kib(server.proc.pid)
    if not server.alive():
        res.problems.append("the node died")
    if res.error_count:
        res.problems.append(f"{res.error_count} client runs failed:\n" + "\n".join(res.errors))
    if sum(res.runs.values()) < sessions:
        res.problems.append(f"only {sum(res.runs.values())} client runs for {sessions} slots")
    if len(res.missed_samples) > len(res.samples):
        res.problems.append(f"most samples missed: {res.missed_samples[:3]}")
    rss = [x.rss_kib for x in res.samples]
    if len(rss) >= 4:
        q = len(rss) // 4
        first, last = statistics.median(rss[:q]), statistics.median(rss[-q:])
        if last > first + RSS_SLACK_KIB:
            res.problems.append(f"node RSS grew over the run: first quarter {first:.0f} KiB, "
                                f"last quarter {last:.0f} KiB")
    if res.rss_after_kib > res.rss_warm_kib + RSS_SLACK_KIB:
        res.problems.append(f"node RSS after the soak {res.rss_after_kib} KiB, after the "
                            f"warm-up {res.rss_warm_kib} KiB")
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    ap.add_argument("--json", type=Path, help="write the samples and summary here")
    a = ap.parse_args()
    programs = support.build_programs()
    server = support.Server()
    server.start()
    try:
        print(f"soak: {a.sessions} sessions for {a.minutes} min against {server.unix} "
              f"(node pid {server.proc.pid}), sampling every {a.interval} s", flush=True)
        res = soak(programs, server, a.sessions, a.minutes * 60, a.interval,
                   log=lambda m: print(m, flush=True))
    finally:
        server.stop()
    print(f"{'t (s)':>7} {'RSS KiB':>9} {'workers':>7} {'sessions':>8} {'ledger B':>14}")
    for s in res.samples:
        print(f"{s.t:7.0f} {s.rss_kib:9d} {s.workers:7d} {s.sessions:8d} {s.ledger_bytes:14d}")
    print(res.summary())
    for m in res.missed_samples:
        print(f"missed sample at {m}")
    if a.json:
        a.json.write_text(json.dumps({
            "summary": res.summary(), "runs": res.runs, "errors": res.error_count,
            "problems": res.problems, "missed_samples": res.missed_samples,
            "samples": [s.__dict__ for s in res.samples]}, indent=1))
    for p in res.problems:
        print(f"FAIL {p}")
    return 1 if res.problems else 0


if __name__ == "__main__":
    sys.exit(main())
