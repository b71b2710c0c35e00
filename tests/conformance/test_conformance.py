"""The conformance probe (probe.c, probe.py) through gpufuse on the emulated GPU.

Builds probe.c with gcc against CUDA 13's cuda.h from the pip wheels (.deps/env.sh:
GPUFUSE_CUDA13_INCLUDE), runs it through `gpufuse run` against a `gpufuse serve` of the H200-like
model `emu:1:141GiB:sm_90`, and checks that it ran every section without crashing. Where the
native output of a real H200 is committed (fixtures/h200-native.txt, made by
scripts/conformance-lane.sh on the GPU machine), the emulated output is diffed against it with
scripts/conformance-diff.py: differences other than the intended ones and the emulated model's
known ones (fixtures/emu-sm_90-known.txt, each with its reason) fail the test, listed.

Run with scripts/test-all.sh, or: `. .deps/env.sh && $GPUFUSE_PY -m pytest tests/conformance`.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests" / "real-clients"))
import support  # noqa: E402  (the real-client tier's server and build machinery)

BUILD = HERE / "build"
FIXTURE = HERE / "fixtures" / "h200-native.txt"
FIXTURE_PY = HERE / "fixtures" / "h200-native-py.txt"
KNOWN = HERE / "fixtures" / "emu-sm_90-known.txt"
DIFF = ROOT / "scripts" / "conformance-diff.py"
# The model named after the GPU the fixture comes from: the H200 (compute capability 9.0, 132
# SMs, its driver's figures) with its 141 GiB.
DEVICES = "emu:1:141GiB:sm_90"
SECTIONS = ["device", "context", "ptr_device", "ptr_host", "ptr_managed", "ptr_module", "kernel",
            "errors", "export", "procaddr"]


@pytest.fixture(scope="module")
def probe() -> Path:
    try:
        deps = support.load_deps_env()
    except support.BuildError as e:
        pytest.fail(str(e), pytrace=False)
    env = dict(os.environ)
    env.update(deps)
    src = HERE / "probe.c"
    out = BUILD / "probe"
    cmd = ["gcc", "-O1", "-g", "-Wall", "-Wextra", "-Werror", f"-I{deps['GPUFUSE_CUDA13_INCLUDE']}",
           "-o", str(out), str(src), "-ldl"]
    try:
        return support._build(out, cmd, [src, HERE / "cuda_names.h"], env)
    except support.BuildError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="module")
def server():
    missing = [p for p in (support.GPUFUSE, support.SHIM) if not p.exists()]
    if missing:
        pytest.fail(f"missing {', '.join(map(str, missing))}: run cargo build --release",
                    pytrace=False)
    s = support.Server(DEVICES)
    s.start()
    yield s
    s.stop()


def run_through_gpufuse(server, argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("GPUFUSE_SERVER", None)
    env["GPUFUSE_TRANSPORT"] = support.TRANSPORT
    cmd = [str(support.GPUFUSE), "run", "--server", server.unix, "--", *argv]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def emulated_output(probe, server, tmp_path_factory) -> Path:
    res = run_through_gpufuse(server, [str(probe)])
    path = tmp_path_factory.mktemp("conformance") / "emu-sm_90.txt"
    path.write_text(res.stdout)
    # Kept for reading after the run (and for updating the known-differences file).
    BUILD.mkdir(exist_ok=True)
    (BUILD / "emu-sm_90.txt").write_text(res.stdout)
    assert res.returncode == 0, (
        f"the probe exited with {res.returncode}\n--- stderr ---\n{res.stderr[-4000:]}\n"
        f"--- sections ---\n" + "\n".join(l for l in res.stdout.splitlines()
                                         if l.startswith(("section.", "risky_process."))))
    return path


def facts(text: str) -> dict[str, str]:
    return dict(l.split(" = ", 1) for l in text.splitlines() if " = " in l)


def test_probe_runs_every_section_without_crashing(emulated_output):
    f = facts(emulated_output.read_text())
    assert f.get("probe.complete") == "yes"
    bad = {k: v for k, v in f.items()
           if k.startswith(("section.", "risky_process.")) and v != "ok"}
    assert not bad, f"sections that did not finish: {bad}"
    for s in SECTIONS:
        assert f.get(f"section.{s}") == "ok", f"section {s} missing"
    # The basics every application relies on, on the emulated H200 model.
    assert f["driver.device_count"] == "1"
    assert f["dev0.attr.075.COMPUTE_CAPABILITY_MAJOR"] == "9"
    assert f["dev0.attr.076.COMPUTE_CAPABILITY_MINOR"] == "0"
    assert f["dev0.attr.016.MULTIPROCESSOR_COUNT"] == "132"
    assert f["intended.dev0.total_mem"] == str(141 << 30)
    assert f["launch.ok"] == "0"
    assert f["launch.ok_result_sum"] == "2464"  # sum(i + 7) for the 64 threads


def test_probe_matches_the_h200_fixture(emulated_output):
    if not FIXTURE.exists():
        pytest.skip(f"no native fixture yet: {FIXTURE.relative_to(ROOT)} is made on an H200 by "
                    "scripts/conformance-lane.sh (conformance-native.txt)")
    args = [sys.executable, str(DIFF), str(FIXTURE), str(emulated_output), "--quiet"]
    if KNOWN.exists():
        args += ["--known", str(KNOWN)]
    res = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, (
        f"the emulated {DEVICES} differs from the H200's native output beyond the intended and "
        f"known differences ({KNOWN.name}):\n{res.stdout[-12000:]}{res.stderr}")


def test_probe_py_runs(server):
    """probe.py through gpufuse: cuda-python, CuPy and PyTorch where installed; no fact may fail
    with a Python exception in cuda-python's section (the driver API is the shim's)."""
    deps = support.load_deps_env()
    res = run_through_gpufuse(server, [deps["GPUFUSE_PY"], str(HERE / "probe.py")], timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    f = facts(res.stdout)
    assert f.get("probe_py.complete") == "yes"
    assert f.get("section_py.cuda_python") == "ok"
    assert f.get("cuda_python.name") == "gpufuse emulated GPU"
    raised = [l for l in res.stdout.splitlines()
              if l.startswith("cuda_python.") and re.search(r"= error [A-Z]\w+:", l)]
    assert not raised, "\n".join(raised)
