from specrouter.drafters.lookup import Found
from specrouter.drafters.ngram import NgramDrafter


def test_proposes_continuation_of_latest_occurrence_of_longest_suffix():
    d = NgramDrafter(max_ngram=3)
    # suffix [1, 2] occurred twice; the latest occurrence is followed by 9, 8
    assert d.propose([1, 2, 5, 1, 2, 9, 8, 7, 1, 2], 2) == [9, 8]
    # the 3-gram [7, 1, 2] beats the 2-gram
    assert d.propose([7, 1, 2, 4, 4, 1, 2, 6, 7, 1, 2], 2) == [4, 4]
    assert d.lookup([7, 1, 2, 4, 4, 1, 2, 6, 7, 1, 2], 2) == Found([4, 4], 3)  # and says how long the match was


def test_proposes_nothing_without_a_match():
    d = NgramDrafter()
    assert d.propose([1, 2, 3, 4], 3) == []
    assert d.propose([1], 3) == []
    assert d.propose([1, 1], 0) == []


def test_continuation_is_capped_by_n_and_the_context_end():
    d = NgramDrafter(max_ngram=1)
    assert d.propose([3, 4, 5, 3], 10) == [4, 5, 3]


def _reference(context, n, max_ngram, min_ngram):
    """The definition, spelled out: the longest suffix (max_ngram down to min_ngram) that
    occurred earlier with a token after it; the continuation of its latest occurrence, and
    that suffix's length."""
    for size in range(min(max_ngram, len(context) - 1), min_ngram - 1, -1):
        suffix = context[-size:]
        for start in range(len(context) - size - 1, -1, -1):
            if context[start : start + size] == suffix:
                return context[start + size : start + size + n], size
    return [], 0


def test_matches_the_definition_on_random_contexts():
    import random

    rng = random.Random(0)
    for trial in range(3000):
        vocab = rng.choice([2, 3, 5, 50])
        context = [rng.randrange(vocab) for _ in range(rng.randrange(0, 40))]
        max_ngram = rng.randrange(1, 6)
        min_ngram = rng.randrange(1, max_ngram + 1)
        n = rng.randrange(0, 10)
        expected = _reference(context, n, max_ngram, min_ngram) if n > 0 and len(context) >= 2 else ([], 0)
        drafter = NgramDrafter(max_ngram, min_ngram)
        assert drafter.lookup(context, n) == Found(*expected), (context, n, max_ngram, min_ngram)
        assert drafter.propose(context, n) == expected[0]
