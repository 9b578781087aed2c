"""The router's model-free level: which drafter (ngram or suffix), its match classes, and
the long blocks it may draft (its own grid), on synthetic text that repeats itself."""

import itertools

import numpy as np
import pytest

from specrouter.backends.synthetic import SyntheticBackend
from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams
from specrouter.drafters.memory import OPTED_OUT, MemoryScope, SuffixMemory
from specrouter.errors import InvalidParameterError
from specrouter.router.config import DEFAULT_CONFIG
from specrouter.router.estimates.acceptance import AcceptanceEstimator
from specrouter.router.estimates.costs import CostProfile, OnlineCosts
from specrouter.router.learn import CycleLearner
from specrouter.router.policy.decide import decide
from specrouter.router.policy.plan import Rates, match_key
from specrouter.router.policy.predictor import ChainSpec
from specrouter.router.policy.state import CycleInputs

from ..router_synth import linear, make_router, seconds_per_token

DRAFT_GRID, LOOKUP_GRID = DEFAULT_CONFIG.draft_grid, DEFAULT_CONFIG.lookup_grid


def repeating_target():
    """An order-2 target over 6 tokens, sharp enough that its greedy text falls into a cycle
    (what copying looks like to a drafter), costing a CPU-like fixed part plus a part per token."""
    return SyntheticBackend("t", vocab=6, scale=4.0, latency=linear(0.05, 0.004), params_b=7)


def test_the_suffix_level_learns_per_match_class_and_drafts_long_blocks():
    target = repeating_target()
    router = make_router(target, [], lookup="suffix")
    assert router.lookup == "suffix" and router.lookup_grid == LOOKUP_GRID and router.grid == DRAFT_GRID
    alone, base = seconds_per_token(Chain([target], []), [target], SamplingParams(), 200)
    routed, result = seconds_per_token(router, [target], SamplingParams(), 200)
    assert result.token_ids == base.token_ids
    # the suffix chain and the target alone are one family: moving between them is no decision
    lengths = [ks[0] for names, ks in result.chains_used if names == ["suffix", "t"]]
    assert lengths and max(lengths) >= 32, result.chains_used  # the copy in long blocks
    assert routed < 0.5 * alone  # verifying 32 tokens costs ~3.4 single forwards here
    classes = {p for (_, p, _) in router.acceptance.global_ if p.startswith("suffix#")}
    assert classes and classes <= {match_key("suffix", c) for c in (1, 2, 3, 4, 8, 16, 32)}


def test_an_ngram_router_keeps_its_grid_and_classes():
    router = make_router(repeating_target(), [])
    assert router.lookup == "ngram" and router.lookup_grid == DRAFT_GRID and router.longest == max(DRAFT_GRID)
    # per match length, and the class of a grammar-forced continuation
    assert router.planner.ngram_keys == [match_key("ngram", n) for n in range(1, 5)] + [match_key("ngram", "g")]


def test_an_unknown_lookup_drafter_is_refused():
    with pytest.raises(InvalidParameterError, match="unknown model-free drafter 'nope': use one of ngram, suffix"):
        make_router(repeating_target(), [], lookup="nope")


def test_a_session_keeps_its_routers_lookup_drafter_and_owns_its_index():
    router = make_router(repeating_target(), [], lookup="suffix")
    session = router.session()
    assert session.lookup == "suffix" and session.lookup_drafter is not router.lookup_drafter
    session.lookup_drafter.lookup([1, 2, 1, 2], 2)
    assert len(router.lookup_drafter.index) == 0 and len(session.lookup_drafter.index) == 4


def test_the_greedy_output_of_a_suffix_router_matches_over_seeds():
    target = repeating_target()
    for seed in range(3):
        prompt = np.random.default_rng(seed).integers(0, 6, size=6).tolist()
        _, alone = seconds_per_token(Chain([target], []), [target], SamplingParams(), 80, prompt=prompt)
        _, routed = seconds_per_token(make_router(target, [], lookup="suffix"), [target], SamplingParams(), 80,
                                      prompt=prompt)
        assert routed.token_ids == alone.token_ids


def memory_router(memory):
    """A target whose greedy text seldom repeats itself within a request (order 2 over 64
    tokens), read through a router with a cross-request memory."""
    target = SyntheticBackend("t", vocab=64, scale=4.0, latency=linear(0.05, 0.004), params_b=7)
    return target, make_router(target, [], lookup="suffix", memory=memory)


def test_a_second_request_copies_the_first_ones_answer_from_the_memory():
    memory = SuffixMemory(10_000)
    target, router = memory_router(memory)
    first_time, first = seconds_per_token(router.session(), [target], SamplingParams(), 120)
    assert memory.total == len(first.token_ids) + 1  # the output (and its separator), not the prompt
    second_time, second = seconds_per_token(router.session(), [target], SamplingParams(), 120)
    assert second.token_ids == first.token_ids
    remembered = {p for (_, p, _) in router.acceptance.global_ if p.startswith("suffix#m")}
    assert remembered and remembered <= {match_key("suffix", f"m{c}") for c in (4, 8, 16, 32)}
    assert max(ks[0] for names, ks in second.chains_used if names == ["suffix", "t"]) >= 32
    assert second_time < 0.5 * first_time


def test_partitions_and_opted_out_requests_keep_their_text_to_themselves():
    memory = SuffixMemory(10_000)
    target, router = memory_router(memory)
    _, secret = seconds_per_token(router.session(MemoryScope("key-a")), [target], SamplingParams(), 60)
    held = memory.total
    for scope in (MemoryScope("key-b"), OPTED_OUT):
        session = router.session(scope)
        _, again = seconds_per_token(session, [target], SamplingParams(), 60)
        assert again.token_ids == secret.token_ids
        # nothing of key-a's text was proposed: no cycle drafted from the memory
        assert not [p for (p, _) in session.acceptance.request if p.startswith("suffix#m")]
    assert memory.total == held + len(secret.token_ids) + 1  # key-b's answer joined; the opted-out one did not
    assert memory.propose(secret.token_ids[:10], 5, MemoryScope("key-b")).tokens == secret.token_ids[10:15]


def test_a_memory_needs_a_drafter_that_reads_it():
    with pytest.raises(InvalidParameterError, match="the ngram drafter has no cross-request memory: use the suffix drafter"):
        make_router(repeating_target(), [], lookup="ngram", memory=SuffixMemory(100))


def test_every_long_draft_is_verified_at_a_timed_size():
    """A target whose forwards cost by tiles of 16 tokens (a forward of 17 costs what one of
    32 does, as llama.cpp's CPU kernels do in part): the router's cost of verifying each of
    its coarse draft lengths (k + 1 tokens, the bonus row) is the timed cost, never one
    interpolated across a tile's step, and the longest drafts fill whole tiles."""
    tiles = lambda n: 0.05 + 0.064 * -(-n // 16)  # noqa: E731
    target = SyntheticBackend("t", vocab=6, scale=4.0, latency=tiles, params_b=7)
    router = make_router(target, [], lookup="suffix")
    coarse = [k for k in (*router.grid, *router.lookup_grid) if k > 8]
    assert coarse and all(router.costs.seconds("t", k + 1) == pytest.approx(tiles(k + 1)) for k in coarse)
    assert [(k + 1) % 16 for k in router.lookup_grid[-3:]] == [0, 0, 0]


@pytest.mark.parametrize("lookup", ["ngram", "suffix"])
def test_a_cycle_looks_its_context_up_once(lookup, monkeypatch):
    """The router's lookup before the cycle (its choice reads the match) is handed to the
    drafter: a cycle that drafts with the model-free level does not look up again."""
    target = repeating_target()
    router = make_router(target, [], lookup=lookup)
    drafter = router.lookup_drafter
    calls = []
    real = type(drafter).lookup

    def counted(self, context, n, committed=None):
        calls.append(len(context))
        return real(self, context, n, committed)

    monkeypatch.setattr(type(drafter), "lookup", counted)
    _, result = seconds_per_token(router, [target], SamplingParams(), 120)
    drafted = sum(result.chains_used[i][0] == [lookup, "t"] for i in result.chains_per_cycle)
    assert drafted > 10 and len(calls) == result.cycles  # one lookup per cycle, drafting or not


def test_a_handed_lookup_serves_only_the_first_draft_at_the_committed_context():
    from specrouter.drafters.lookup import Handed
    from specrouter.drafters.suffix import SuffixDrafter

    context = [1, 2, 3, 4, 1, 2, 3, 4, 5, 1, 2, 3]
    drafter = SuffixDrafter()
    found = drafter.find(context, 8)
    handed = Handed(found, len(context), 8)
    assert handed.serves(context, 8, len(context)) and handed.serves(context, 3, len(context))
    assert not handed.serves(context, 9, len(context))  # more than it was asked for
    assert not handed.serves([*context, 4], 3, len(context))  # a context a middle level extended
    assert not handed.serves(context[:-1], 3, len(context) - 1)  # another cycle's
    for n in range(1, 9):  # a lookup's first n tokens are a lookup of n
        assert handed.take(n) == drafter.find(context, n)


def test_a_lookup_chain_is_searched_whole_past_a_bump_in_the_forward_cost():
    """A forward costs more from 7 to 12 tokens (where a CPU backend changes kernels): k = 5 is
    a local optimum of the lookup chain's time per token, far from its best. From a hint at 5
    the plan still finds what a search of the whole grid finds (a local search stalls at 5)."""
    base = linear(0.05, 0.004)
    target = SyntheticBackend("t", vocab=6, scale=4.0, latency=lambda n: base(n) + 0.03 * (7 <= n <= 12), params_b=7)
    router = make_router(target, [], lookup="suffix")
    cls = match_key("suffix", 32)
    router.acceptance.set_global(cls, "t", 0.99, count=1000, mode="greedy")
    router.acceptance.start_request(True)
    router.planner.refresh(room=500, batch=1, row_kind="greedy", cycle=1)
    plan, names = router.planner.plan, ("suffix", "t")
    seconds = {k: plan.predict(ChainSpec(names, (k,)), cls=cls).seconds_per_token for k in (4, 5, 6)}
    assert seconds[5] < min(seconds[4], seconds[6]), seconds  # the bump makes 5 a local optimum
    whole = plan.best_lengths(names, Rates.ESTIMATE, None, cls)
    assert plan.best_lengths(names, Rates.ESTIMATE, (5,), cls).spec == whole.spec
    assert whole.spec.draft_lengths[0] >= 15 and whole.prediction.seconds_per_token < 0.7 * seconds[5]


def test_a_barely_observed_match_class_that_promises_a_gain_is_probed():
    """One shadow score (the target alone's token was the lookup's) puts a class at 1.0, but
    the guard's cautious rate is far below: without a probe the class would wait a cycle per
    score to become sure. On a CPU-like target (a forward of 16 tokens costs 7 of one, so no
    draft length pays at the cautious rate) its chain is probed at its planned length at once;
    a barely observed class whose estimate promises no gain is not probed."""
    target = SyntheticBackend("t", vocab=6, scale=4.0, latency=linear(0.018, 0.012), params_b=7)
    for rate, probed in ((1.0, True), (0.3, False)):
        router = make_router(target, [], lookup="suffix")
        cls = match_key("suffix", 32)
        router.acceptance.set_global(cls, "t", rate, count=1.0, mode="greedy")
        router.start(SamplingParams())
        position = 100
        inputs = CycleInputs(position, 200, {"t": position - 1}, 100, cls, "greedy", 1)
        decision = decide(inputs, router.state, router.config)
        assert decision.probing is probed, (rate, decision)
        if probed:
            assert decision.chosen.spec.names == ("suffix", "t") and decision.chosen.spec.draft_lengths[0] >= 15
        else:
            assert decision.chosen.spec.names == ("t",)


def test_a_greedy_shadow_score_of_the_lookup_ends_at_its_first_rejection():
    """A draft proposed 5 6 9 to the target where the lookup had 5 6 7. The target's argmax
    rows are 8 6 7: the lookup's block would have ended at its first token (rejected), and the
    rows after it follow the draft's 5, which the target did not commit, so its score is [0],
    not the 1s those rows happen to give. Where the target takes 5 6, the rows stay valid up
    to where the two proposals part."""
    seen = []

    class Spy(AcceptanceEstimator):
        def observe_scores(self, proposer, verifier, scores):
            seen.append((proposer, verifier, list(scores)))

    acceptance = Spy()
    acceptance.start_request(greedy=True)
    learner = CycleLearner(acceptance, OnlineCosts(CostProfile({})), "t", lookup="suffix")
    for argmax, expected in (([8, 6, 7, 1], [0.0]), ([5, 6, 8, 1], [1.0, 1.0, 0.0]), ([5, 6, 7, 1], [1.0, 1.0, 1.0])):
        seen.clear()
        learner.begin([5, 6, 7], "suffix#4")
        learner.on_verify("d", "t", [5, 6, 9], None, argmax, sum(1 for _ in itertools.takewhile(
            lambda pair: pair[0] == pair[1], zip([5, 6, 9], argmax))), 3)
        assert [s for s in seen if s[0] == "suffix#4"] == [("suffix#4", "t", expected)]
