"""Exact mode on the real pool: block logits bitwise equal to one-token decoding, and greedy
ids of every chain of the default pool and of auto equal to the target alone's, with no
near-tie escape, and so are their logprobs, bit for bit (exact_check.py, in a process of its
own)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specrouter.backends.llamacpp import LlamaCppBackend
from specrouter.errors import BackendError

from .conftest import TARGET

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def exact_results(pool, private_cache):  # pool: the models are pulled (or the test skips / fails in CI)
    profiles = private_cache.parent / "profiles"  # shared with the later tests' servers
    done = subprocess.run([sys.executable, "-m", "tests.real.exact_check", str(profiles)], cwd=ROOT,
                          capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_blocks_of_1_to_24_tokens_equal_one_token_decoding_bitwise(exact_results):
    for block in exact_results["blocks"]:
        assert block["differ"] == [], block
        assert block["batch_same"], block


def test_every_chain_and_auto_match_the_target_alone_exactly(exact_results):
    assert len(exact_results["prompts"]) == 4  # two HumanEval, two GSM8K
    names = ["0.5b->1.5b", "ngram->1.5b", "suffix->1.5b", "ngram->0.5b->1.5b", "suffix->0.5b->1.5b", "auto"]
    assert exact_results["greedy"] == {name: [] for name in names}
    assert exact_results["logprobs"] == {name: [] for name in names}  # bit for bit, with 5 alternatives


def test_auto_through_the_batch_scheduler_matches_the_target_alone_exactly(exact_results):
    """Batched, auto's chains and batch compositions follow measured timings (no two runs
    alike); in exact mode none may move an output or a logprob by a bit."""
    batched = exact_results["batched"]
    assert batched["greedy"] == [] and batched["logprobs"] == [] and batched["max_batch"] > 1  # really batched


def test_a_next_turn_resumed_from_the_prefix_cache_matches_the_target_alone_cold_exactly(exact_results):
    """Exact mode's streams share no cells: a conversation's turn 2 takes turn 1's KV slot
    itself, cut back to what its prompt shares; its cells are where they were computed, so
    turn 2 writes what the target alone writes on the whole prompt cold, bit for bit."""
    assert exact_results["next_turns"] == {"greedy": [], "logprobs": [], "cached": []}


def test_exact_mode_after_a_forward_in_the_process_is_refused(pool):
    target = pool.model(TARGET)
    seq = target.new_sequence()
    try:
        target.decode(seq, [1, 2], 0, 1)  # a forward has run in this process
    finally:
        target.free_sequence(seq)
    with pytest.raises(BackendError, match="before any llama.cpp model runs"):
        LlamaCppBackend(pool.model(TARGET).path, exact=True)
