"""Moving programs around a pool (a `gpufuse controller` and two `gpufuse node`s, the fixture
of test_pool.py): `gpufuse node drain` moves a CuPy workload (pools, managed memory, a module
variable, event timings; every byte checked) off its node while it waits between steps, idle;
a `high` program that needs a `low` one's device moves the low one to the other node instead
of ending it, and both run on correctly."""
import subprocess

import pytest

from support import GPUFUSE, NATIVE
from test_pool import Workload, _ours, _run, pool  # noqa: F401  (pool: the fixture)
from test_session_cleanup import _wait_for_ready

pytestmark = pytest.mark.skipif(NATIVE, reason="the pool is gpufuse's own; nothing to compare natively")


def _node_of(s: dict, tenant: str) -> str:
    (mine,) = _ours(s, tenant)
    return mine["node"]


@pytest.mark.kernel_results
def test_draining_a_node_moves_an_idle_program_off_it(programs, pool, tmp_path):
    w = Workload(programs, pool, tmp_path / "go", ["--vram", "1GiB", "--tenant", "erin"], 6, 0.05)
    try:
        w.wait_line("STEP 1")
        s = pool.wait_for(lambda s: [x["state"] for x in _ours(s, "erin")] == ["running"],
                          "the workload's session running")
        source = _node_of(s, "erin")
        other = "b" if source == "a" else "a"
        # The program waits for its flag: no CUDA call while it moves.
        res = subprocess.run([str(GPUFUSE), "node", "drain", source, "--server", pool.ctrl],
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, (res.stdout, res.stderr)
        assert f"moved to node {other} device 0" in res.stdout, res.stdout
        assert "1 session(s) moved off it, 0 stay" in res.stdout, res.stdout
        s = pool.wait_for(lambda s: _node_of(s, "erin") == other, "the session on the other node")
        drained = next(n for n in s["nodes"] if n["name"] == source)
        assert drained["cordoned"] is True, s
        assert drained["devices"][0]["memory_promised_bytes"] == 0, s
        # It goes on where it is now, every byte intact.
        w.finish()
        # Nothing new lands on the cordoned node, until it is uncordoned.
        res = subprocess.run([str(GPUFUSE), "run", "--server", pool.ctrl, "--selector",
                              f"zone={'x' if source == 'a' else 'y'}", "--wait", "0", "--",
                              str(programs.kernels["vector_add"])],
                             env=programs.env, capture_output=True, text=True, timeout=120)
        assert res.returncode != 0 and "cordoned" in res.stdout + res.stderr, \
            (res.stdout, res.stderr)
        res = subprocess.run([str(GPUFUSE), "node", "uncordon", source, "--server", pool.ctrl],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        res = subprocess.run([str(GPUFUSE), "run", "--server", pool.ctrl, "--selector",
                              f"zone={'x' if source == 'a' else 'y'}", "--",
                              str(programs.kernels["vector_add"])],
                             env=programs.env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0 and "PASS vector_add" in res.stdout, (res.stdout, res.stderr)
    except BaseException:
        print(pool.logs())
        raise
    finally:
        w.kill()


def test_a_preempted_program_that_fits_elsewhere_moves_there(programs, pool):
    """A `low` program holds 3 GiB of node a's 4 GiB (it asked for no labels); a `high` one
    needs 2 GiB on node a (`--selector zone=x`). The low one moves to node b instead of
    ending, and both finish their work with every call succeeding."""
    low = _run(programs, pool, ["--vram", "3GiB", "--qos", "low", "--tenant", "frank"],
               [programs.rt[13], "hold_until_stdin"])
    high = None
    try:
        _wait_for_ready(low, timeout=60)
        s = pool.wait_for(lambda s: [x["state"] for x in _ours(s, "frank")] == ["running"],
                          "low running")
        source = _node_of(s, "frank")
        zone = "x" if source == "a" else "y"
        other = "b" if source == "a" else "a"
        high = _run(programs, pool, ["--selector", f"zone={zone}", "--vram", "2GiB", "--qos",
                                     "high", "--tenant", "grace"],
                    [programs.rt[13], "hold_until_stdin"])
        _wait_for_ready(high, timeout=120)
        s = pool.wait_for(lambda s: [x["state"] for x in s["sessions"]] == ["running", "running"],
                          "both running")
        assert _node_of(s, "grace") == source, s
        assert _node_of(s, "frank") == other, s
        out, err = low.communicate(b"go\n", timeout=120)
        assert low.returncode == 0, (out, err)
        assert b"AFTER memset=cudaSuccess sync=cudaSuccess" in out, (out, err)
        out, err = high.communicate(b"go\n", timeout=120)
        assert high.returncode == 0, (out, err)
        assert b"AFTER memset=cudaSuccess sync=cudaSuccess" in out, out
    except BaseException:
        print(pool.logs())
        raise
    finally:
        for p in (low, high):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
