"""--chain auto on the real pool: greedy output equals the target alone (up to the
near-ties of batched llama.cpp kernels, as for static chains), with chains switched
mid-sequence both by the router and by a scripted rotation; SmolLM2 (another
tokenizer) is left out of routing with a message."""

import pytest

from specrouter.router import auto_router

from ..unit.router_synth import ScriptedRouter
from .conftest import REFERENCE_TOKENS, SMALL, SMOL, TARGET
from .greedy_check import assert_matches_references


@pytest.fixture(scope="module")
def router(pool):
    return auto_router(pool, TARGET, [SMOL, SMALL, TARGET], progress=False)


def test_smollm_is_left_out_with_a_message(router):
    assert [m.name for m in router.drafts] == [SMALL]
    assert f"{SMOL} (another tokenizer)" in router.message


def test_auto_matches_the_target_alone(pool, references, router):
    assert_matches_references(pool.level(TARGET), references, router, "auto", REFERENCE_TOKENS)


def test_chains_switched_every_cycle_match_the_target_alone(pool, references):
    target = pool.level(TARGET)
    chains = [pool.chain([TARGET]), pool.chain([SMALL, TARGET], [3]), pool.chain(["ngram", SMALL, TARGET], [2, 3]),
              pool.chain(["ngram", TARGET], [4])]
    assert_matches_references(target, references, ScriptedRouter(target, chains), "scripted rotation", REFERENCE_TOKENS)
