"""A bounded soak of mixed real clients (soak.py): GPUFUSE_SOAK_MIX_SESSIONS concurrent slots
(default 16) of libcudart, CuPy and cuda-python programs for GPUFUSE_SOAK_MIX_SECONDS (default
30): no client run fails, the node's memory stays flat, and afterwards no session, worker or
ledger byte is left. The long one is `scripts/soak.sh --sessions 64 --minutes 10`.
"""
import os

import soak


def test_a_soak_of_mixed_real_clients_has_no_errors_and_flat_memory(programs, server):
    sessions = int(os.environ.get("GPUFUSE_SOAK_MIX_SESSIONS", "16"))
    seconds = float(os.environ.get("GPUFUSE_SOAK_MIX_SECONDS", "30"))
    res = soak.soak(programs, server, sessions, seconds, interval=2.0)
    print(res.summary())
    assert not res.problems, "\n".join(res.problems) + "\n" + res.summary()
    # Every kind of client ran, and the node was sampled while they did.
    assert set(res.runs) == {"libcudart", "cupy", "cuda-python"}, res.runs
    assert len(res.samples) >= 4 and max(s.sessions for s in res.samples) > 0, res.samples
