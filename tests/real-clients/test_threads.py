"""Several host threads of one libcudart program, each driving its own stream (issue 11: threads
do not serialize in the client; their launches go through per-stream lanes, crates/client/src/
lanes.rs). kernels/threads.cu, built plain and with --default-stream per-thread; each check
verifies every element of every thread's results."""
from pathlib import Path

import pytest

from support import assert_ok, run_client

PY = Path(__file__).parent / "python"

CHECKS = {
    "own_streams": "checked 4 threads on their own streams",
    "per_thread_stream": "checked 4 threads on cudaStreamPerThread",
    "null_stream": "checked 4 threads on the NULL stream",
    "legacy_stream": "checked the legacy default stream between blocking-stream work",
    "cross_thread_event": "checked an event recorded on one thread and waited on by another",
}


@pytest.mark.parametrize("prog", ["threads", "threads_ptds"])
@pytest.mark.parametrize("check", list(CHECKS))
def test_threads_on_their_own_streams(programs, server, prog, check):
    res = run_client(programs, server.unix, [programs.kernels[prog], check])
    assert_ok(res, [CHECKS[check], f"PASS {check} (results checked)"])


def test_a_forked_child_gets_its_own_session(programs, server):
    res = run_client(programs, server.unix, [programs.python, PY / "fork_child.py"])
    assert_ok(res, ["child ok", "PASS fork_child (results checked)"])
