"""--chain auto on the real pool: greedy output equals the target alone (up to the
near-ties of batched llama.cpp kernels, as for static chains), with chains switched
mid-sequence both by the router and by a scripted rotation; SmolLM2 (another
tokenizer) is left out of routing with a message."""

import pytest

from specrouter.cascade.sampling import SamplingParams
from specrouter.engine import generate
from specrouter.router import auto_router

from ..unit.router_synth import ScriptedRouter
from .conftest import SMALL, SMOL, TARGET
from .test_greedy_equality import NEAR_TIE, near_tie_gap, references  # noqa: F401 (fixture)

MAX_TOKENS = 48  # as test_greedy_equality's references


@pytest.fixture(scope="module")
def router(pool):
    return auto_router(pool, TARGET, [SMOL, SMALL, TARGET], progress=False)


def test_smollm_is_left_out_with_a_message(router):
    assert [m.name for m in router.drafts] == [SMALL]
    assert f"{SMOL} (another tokenizer)" in router.message


def _check_matches(pool, references, source, label):  # noqa: F811
    diverged = []
    for pid, (tokens, expected) in references.items():
        got = generate(source, tokens, SamplingParams(), MAX_TOKENS)
        if got.token_ids == expected:
            continue
        ids = got.token_ids
        i = next((j for j, (x, y) in enumerate(zip(ids, expected)) if x != y), min(len(ids), len(expected)))
        assert i < min(len(ids), len(expected)), f"{pid}: one output is a prefix of the other"
        gap, top_two = near_tie_gap(pool, tokens + expected[:i], ids[i], expected[i])
        assert top_two and gap < NEAR_TIE, f"{label} on {pid} diverged at {i} without a near-tie (gap {gap:.4f})"
        diverged.append((pid, i))
    assert len(diverged) <= len(references) // 4, f"{label}: too many near-tie divergences {diverged}"


def test_auto_matches_the_target_alone(pool, references, router):  # noqa: F811
    _check_matches(pool, references, router, "auto")


def test_chains_switched_every_cycle_match_the_target_alone(pool, references):  # noqa: F811
    target = pool.level(TARGET)
    chains = [pool.chain([TARGET]), pool.chain([SMALL, TARGET], [3]), pool.chain(["ngram", SMALL, TARGET], [2, 3]),
              pool.chain(["ngram", TARGET], [4])]
    _check_matches(pool, references, ScriptedRouter(target, chains), "scripted rotation")
