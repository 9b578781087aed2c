"""Exact mode pads every call with a catch-up head (a prompt, a drafter's catch-up) as it pads
one-token decoding: for prompts of every length mod 4, 1..3 rows of logits, from position 0
and after a cached prefix, the call's rows equal one-token decoding's bit for bit
(exact_padding_check.py, in a process of its own; no benchmark data)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_calls_with_a_catch_up_head_equal_one_token_decoding_bitwise(pool):  # pool: the models are pulled
    done = subprocess.run([sys.executable, "-m", "tests.real.exact_padding_check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["calls"] == 24 and result["differ"] == [], result["differ"]
