"""A session through the server on the real pool: a 3-turn edit loop (session_check.py, in a
process of its own per kernel mode) whose routed greedy turns equal the target alone's, with
the near-tie escape on the default kernels (greedy_check.py) and bit for bit on exact ones."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .greedy_check import MAX_DIVERGED_FRACTION

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", params=[False, True], ids=["default", "exact"])
def session(pool, request):  # pool: the models are pulled (or the test skips / fails in CI)
    args = [sys.executable, "-m", "tests.real.session_check", *(["--exact"] if request.param else [])]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_a_routed_edit_loop_writes_the_target_alones_turns(session):
    turns = session["turns"]
    assert [t["turn"] for t in turns] == [0, 1, 2]
    assert all(t["tokens"] > 0 for t in turns)
    assert turns[0]["prompt_tokens"] < turns[1]["prompt_tokens"] < turns[2]["prompt_tokens"]  # the whole conversation
    if session["exact"]:
        assert [t["equal"] for t in turns] == [True] * 3 and all(t["diverged"] is None for t in turns)
    else:  # every divergence was checked to be a near-tie in the check's process
        assert sum(not t["equal"] for t in turns) <= MAX_DIVERGED_FRACTION * len(turns)
