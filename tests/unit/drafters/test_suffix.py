"""The suffix index against brute force: the longest earlier occurrence of the context's
suffix, its end positions, and the voted continuation, over random token strings (small
alphabets: many repeats), after every incremental append and with tails not indexed."""

import numpy as np
import pytest

from specrouter.drafters.suffix import MAX_CANDIDATES, Lookup, SuffixIndex


def brute_ends(context: list[int], indexed: int) -> tuple[int, list[int]]:
    """Longest L such that context's last L tokens occur in context[:indexed] ending at some
    e < len(context) - 1, and all such e (latest first)."""
    size = len(context)
    best, best_ends = 0, []
    for length in range(1, size):
        suffix = context[size - length:]
        ends = [e for e in range(length - 1, min(indexed, size - 1)) if context[e - length + 1 : e + 1] == suffix]
        if not ends:
            break  # a longer suffix cannot occur where this one does not
        best, best_ends = length, sorted(ends, reverse=True)
    return best, best_ends


def brute_vote(context: list[int], ends: list[int], n: int) -> tuple[list[int], int]:
    """Majority continuation, the text read as context + what was proposed so far."""
    alive, out = ends[:MAX_CANDIDATES], []
    for j in range(n):
        text = context + out
        nexts = [text[e + 1 + j] for e in alive]
        if not nexts:
            break
        counts = {t: nexts.count(t) for t in nexts}
        top = max(counts.values())
        token = next(t for t in nexts if counts[t] == top)  # nexts is latest first
        out.append(token)
        alive = [e for e in alive if (context + out)[e + 1 + j] == token]
    return out, len(alive)


@pytest.mark.parametrize("alphabet", [2, 3, 5, 12])
def test_lookup_equals_brute_force_after_every_append(alphabet):
    rng = np.random.default_rng(alphabet)
    for _ in range(6):
        text = rng.integers(0, alphabet, size=int(rng.integers(1, 160))).tolist()
        index = SuffixIndex()
        for end in range(1, len(text) + 1):
            context = text[:end]
            index.sync(context)
            assert index.tokens == context
            for tail in ([], rng.integers(0, alphabet, size=int(rng.integers(1, 4))).tolist()):
                full = context + tail
                length, ends = brute_ends(full, len(context))
                state, got = index.match(full)
                assert got == length, (full, len(context))
                if length:
                    assert index.ends(state, len(full) - 1) == ends
                n = int(rng.integers(1, 12))
                tokens, support = brute_vote(full, ends, n) if length else ([], 0)
                assert index.propose(full, n) == Lookup(tokens, length, support, min(len(ends), MAX_CANDIDATES)) \
                    if length else index.propose(full, n) == Lookup([], 0)


def test_a_copied_stretch_is_proposed_whole_and_a_majority_wins():
    index = SuffixIndex()
    body = list(range(100, 160))  # 60 distinct tokens, then the start of a copy of them
    context = body + [7] + body[:5]
    index.sync(context)
    got = index.propose(context, 64)
    # the copy, then (overlapping) the copy of the copy
    assert got.match == 5 and got.tokens == body[5:] + [7] + body[:5] + body[5:8] and got.support == 1
    # "5 1 2" three times, continued by 3, 3, 4: the majority (3) wins over the latest (4)
    context = [5, 1, 2, 3, 5, 1, 2, 3, 5, 1, 2, 4, 5, 1, 2]
    index.sync(context)
    assert index.propose(context, 2) == Lookup([3, 5], 3, 2, 3)


def test_a_context_that_is_not_an_extension_starts_over():
    index = SuffixIndex()
    index.sync([1, 2, 3, 1, 2])
    index.sync([5, 6, 5])  # another request
    assert index.tokens == [5, 6, 5] and index.propose([5, 6, 5], 3) == Lookup([6, 5, 6], 1, 1, 1)
    with pytest.raises(ValueError, match="sync"):
        index.propose([5, 6], 1)


def test_incremental_cost_stays_linear_on_a_repeated_token():
    """The automaton of n equal tokens has n + 1 states (no clones): the index of a model
    that repeats itself stays small."""
    index = SuffixIndex()
    index.sync([4] * 3000)
    assert len(index._len) == 3001
    assert index.propose([4] * 3000, 5) == Lookup([4] * 5, 2999, 1, 1)  # its period, continued


def _repetitive_family():
    """A target of order 2 over 6 tokens (its text repeats itself) and a noisy small draft."""
    from specrouter.backends.synthetic import SyntheticBackend

    target = SyntheticBackend("target", vocab=6, scale=3.0)
    small = SyntheticBackend("small", vocab=6, model_seed=3, noise=1.0)
    return target, small


@pytest.mark.parametrize("levels", ["suffix", "suffix,small"])
def test_greedy_output_with_the_suffix_drafter_equals_the_target_alone(levels):
    from specrouter.cascade.chain import Chain
    from specrouter.cascade.sampling import SamplingParams
    from specrouter.drafters.suffix import SuffixDrafter
    from specrouter.engine import generate

    target, small = _repetitive_family()
    alone = generate(Chain([target], []), [1, 2, 3], SamplingParams(), 120)
    chain = Chain([SuffixDrafter(), *([small] if "small" in levels else []), target], [12, 3][: len(levels.split(","))])
    result = generate(chain, [1, 2, 3], SamplingParams(), 120)
    assert result.token_ids == alone.token_ids
    suffix = result.levels[0]
    assert suffix.proposed > 0 and suffix.accepted > 0.5 * suffix.proposed  # it did draft, mostly right


def test_batched_requests_each_with_a_suffix_drafter_keep_greedy_output():
    from specrouter.cascade.chain import Chain
    from specrouter.cascade.sampling import SamplingParams
    from specrouter.drafters.suffix import SuffixDrafter
    from specrouter.engine import generate
    from specrouter.engine.batch import BatchScheduler, SeqRequest

    from ..engine.test_batch import drain, finished

    target, _ = _repetitive_family()
    prompts = [[1, 2, 3], [4, 4, 1], [5, 0, 2, 5]]
    alone = [generate(Chain([target], []), p, SamplingParams(), 60).token_ids for p in prompts]
    scheduler = BatchScheduler(lambda r: Chain([SuffixDrafter(), target], [8]), max_batch=3)
    for i, p in enumerate(prompts):
        scheduler.add(str(i), SeqRequest(p, SamplingParams(), 60))
    events = drain(scheduler)
    assert [finished(events[str(i)]).token_ids for i in range(3)] == alone
