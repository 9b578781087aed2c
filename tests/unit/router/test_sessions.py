"""Router sessions: each request of a batch routes on its own state, and learns under its own
evidence, while the global estimates and costs are shared."""

from __future__ import annotations

from collections import Counter

from specrouter.drafters.ngram import NGRAM_NAME, NgramDrafter
from specrouter.backends.synthetic import SyntheticBackend
from specrouter.cascade.sampling import SamplingParams
from specrouter.engine.batch import BatchScheduler, SeqRequest
from specrouter.router.policy.plan import match_key

from ..router_synth import family, linear, make_router
from ..engine.test_batch import drain, finished


def test_each_request_files_ngram_acceptance_under_its_own_match_class():
    """Two requests in one batch draft with the n-gram in the same steps, with different suffix
    matches (one prompt already repeats, the other does not yet): every block the target
    verifies is filed under the match class of the lookup that drafted it, in that request's
    own context, not under whatever another request looked up last."""
    # An order-1 target: its greedy text cycles through a few tokens, so n-gram drafts pay, and
    # a flat verification cost (GPU-like) makes the router use them.
    target = SyntheticBackend("target", vocab=12, order=1, latency=linear(0.05, 0.0005), params_b=1.0)
    router = make_router(target, [])
    lookup = NgramDrafter(max_ngram=router.lookup_drafter.max_ngram)
    filed: dict[str, list[tuple[str, str]]] = {"a": [], "b": []}  # (filed key, expected key)
    sessions = {}

    def plan(request: SeqRequest):
        rid = "a" if request.max_tokens == 60 else "b"
        session = sessions[rid] = router.session()
        contexts: list = []
        choose, observe = session.choose, session.acceptance.observe

        def spy_choose(position, room, cached=None, context=None, forced=()):
            contexts.append(list(context))
            return choose(position, room, cached, context, forced)

        def spy_observe(proposer, verifier, proposals, q, p, requested, n_accepted):
            if proposer.startswith(NGRAM_NAME):
                filed[rid].append((proposer, match_key("ngram", lookup.lookup(contexts[-1], 1).match)))
            observe(proposer, verifier, proposals, q, p, requested, n_accepted)

        session.choose, session.acceptance.observe = spy_choose, spy_observe
        return session

    scheduler = BatchScheduler(plan, max_batch=2)
    repeating = [3, 7, 1, 9, 4] * 4
    scheduler.add("a", SeqRequest(repeating, SamplingParams(), 60))
    scheduler.add("b", SeqRequest([5, 2], SamplingParams(), 61))
    events = drain(scheduler)
    assert finished(events["a"]).token_ids and finished(events["b"]).token_ids
    both = filed["a"] + filed["b"]
    assert len(both) >= 10, "the n-gram drafted too rarely for the test to mean anything"
    assert Counter(e for _, e in filed["a"]) != Counter(e for _, e in filed["b"]), \
        "the requests' match histories did not differ"
    wrong = [(k, e) for k, e in both if k != e]
    assert not wrong, f"{len(wrong)} of {len(both)} blocks filed under another request's match class: {wrong[:3]}"


def test_a_request_plans_from_the_draft_lengths_earlier_requests_found():
    """A session's first plan of a chain of several draft levels is a local search from the
    lengths the router's sessions found last (plan.LengthHints, shared), not a search of the
    whole grid: with the same inputs it finds the same plans, from under a third of those
    chains' predictions; a router of its own (no shared hints) searches the whole grid again.
    A chain of one draft level is searched whole either way (Plan.best_lengths)."""
    target, mid, small = family()
    router = make_router(target, [mid, small], use_ngram=False)
    first, second = router.session(), router.session()
    alone = make_router(target, [mid, small], use_ngram=False)
    for session in (first, second, alone):
        session.planner.refresh(room=200, batch=1, row_kind="greedy", cycle=1)
    counts = {name: sum(len(spec.names) > 2 for _, _, spec, _ in s.planner.plan.predictions)
              for name, s in (("first", first), ("second", second), ("alone", alone))}
    single = {name: sum(len(spec.names) == 2 for _, _, spec, _ in s.planner.plan.predictions)
              for name, s in (("first", first), ("second", second))}
    assert first.planner.plans(None) == second.planner.plans(None)
    # The other router profiled the models anew (the same costs, to rounding): the same lengths.
    assert [{n: s.spec for n, s in plans.items()} for plans in first.planner.plans(None)] == \
        [{n: s.spec for n, s in plans.items()} for plans in alone.planner.plans(None)]
    assert any(len(names) == 3 for names in first.planner.plans(None)[0]), "no 3-level chain was planned"
    assert counts["first"] == counts["alone"] and counts["second"] < counts["first"] / 3, counts
    assert single["second"] == single["first"] > 0, single
    assert router.hints is second.hints and alone.hints is not router.hints
