#!/usr/bin/env python3
"""Start-up through gpufuse with lazy module loading and the node's image cache
(docs/module-loading.md): wall time of a whole process and the module-image bytes it sent, for
PyTorch (`import torch; torch.cuda.init()` and one small op, tests/real-clients/python/
startup_torch.py) and for CuPy (`import cupy` and one small op, startup_cupy.py),
each against its baseline measured in the same run (the same program's import with no CUDA),
in wall time and in the CPU time of the client's processes (steadier on a loaded machine):
  - eager, no cache: CUDA_MODULE_LOADING=EAGER against a node with --image-cache off (every
    registered image is sent at start, as before lazy loading);
  - first run: lazy, against a node with an empty image cache;
  - second run: lazy, a second process against the same node (the images come from its cache).
Each figure is the median of --runs rounds; a round measures every variant (a fresh node and
cache for each first run), after one warm-up run of the baseline.
PyTorch's kernels are SASS-only: on the emulated GPU its first launch is refused after its image
loaded, so "first kernel" is the launch's answer.

Usage: . .deps/env.sh && "$GPUFUSE_PY" scripts/bench-startup.py [--runs N] [--only torch|cupy]
Needs the release binaries (cargo build --release -p gpufuse-cli -p gpufuse-shim) and the test
dependencies (scripts/setup-test-deps.sh)."""
import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "real-clients"))
import support  # noqa: E402

MiB = 1 << 20
PY = ROOT / "tests" / "real-clients" / "python"


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(cmd, env):
    """Runs one process to its end: (wall seconds, CPU seconds of the process and its
    children: the client side only, the node's worker is not among them)."""
    cpu = cpu_seconds()
    start = time.monotonic()
    res = subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True,
                         timeout=600, cwd=PY)
    took = time.monotonic() - start
    if res.returncode != 0 or "PASS" not in res.stdout:
        sys.exit(f"bench-startup: {' '.join(map(str, cmd))} failed ({res.returncode}):\n"
                 f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return took, cpu_seconds() - cpu


def counts(server):
    c = server.status()["image_cache"]
    return c["received"], c["received_bytes"], c["hits"], c["hit_bytes"]


def through(server, argv, env):
    """One process through gpufuse: (wall s, CPU s, images sent, bytes sent, by hash, bytes by
    hash)."""
    before = counts(server)
    took = run(support.client_argv(server.unix, argv), env)
    after = counts(server)
    return (*took, *(a - b for a, b in zip(after, before)))


def median_row(rows):
    return tuple(statistics.median(col) for col in zip(*rows))


def bench(name, baseline_argv, argv, env, runs):
    eager_env = dict(env, CUDA_MODULE_LOADING="EAGER")
    run(baseline_argv, env)  # warm-up: the program's files in the page cache
    base, eager, first, second = [], [], [], []
    # Each round measures every variant, so the machine's changing load touches them alike.
    for _ in range(runs):
        base.append(run(baseline_argv, env))
        off = support.Server(extra_args=["--image-cache", "off"])
        off.start()
        try:
            eager.append(through(off, argv, eager_env))
        finally:
            off.stop()
        fresh = support.Server()
        fresh.start()
        try:
            first.append(through(fresh, argv, env))
            second.append(through(fresh, argv, env))
        finally:
            fresh.stop()
    base, base_cpu = median_row(base)
    print(f"startup {name}: baseline (import, no CUDA)  wall {base:7.3f} s            "
          f"CPU {base_cpu:7.3f} s")
    for label, rows in (("eager, no image cache    ", eager),
                        ("lazy, first run          ", first),
                        ("lazy, second run (cached)", second)):
        took, cpu, sent, sent_bytes, hits, hit_bytes = median_row(rows)
        print(f"startup {name}: {label}  wall {took:7.3f} s {took / base:5.2f}x  "
              f"CPU {cpu:7.3f} s {cpu / base_cpu:5.2f}x  "
              f"images sent {sent:4.0f} ({sent_bytes / MiB:8.2f} MiB)  "
              f"by hash {hits:4.0f} ({hit_bytes / MiB:8.2f} MiB)", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--only", choices=["torch", "cupy"])
    a = ap.parse_args()
    programs = support.build_programs()
    env = dict(programs.env)
    print(f"bench-startup: median of {a.runs} runs; the machine's other load disturbs "
          "absolute times, compare the ratios", flush=True)
    if a.only in (None, "torch"):
        torch_py = Path(os.environ.get("GPUFUSE_TORCH_PY") or ROOT / ".deps/torch/bin/python")
        script = PY / "startup_torch.py"
        bench("torch", [torch_py, script, "--no-cuda"], [torch_py, script], env, a.runs)
    if a.only in (None, "cupy"):
        cupy_env = dict(env, CUPY_COMPILE_WITH_PTX="1")
        script = PY / "startup_cupy.py"
        bench("cupy ", [programs.python, script, "--no-cuda"], [programs.python, script],
              cupy_env, a.runs)


if __name__ == "__main__":
    main()
