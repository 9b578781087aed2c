from specrouter.backends.ngram import NgramDrafter


def test_proposes_continuation_of_latest_occurrence_of_longest_suffix():
    d = NgramDrafter(max_ngram=3)
    # suffix [1, 2] occurred twice; the latest occurrence is followed by 9, 8
    assert d.propose([1, 2, 5, 1, 2, 9, 8, 7, 1, 2], 2) == [9, 8]
    # the 3-gram [7, 1, 2] beats the 2-gram
    assert d.propose([7, 1, 2, 4, 4, 1, 2, 6, 7, 1, 2], 2) == [4, 4]


def test_proposes_nothing_without_a_match():
    d = NgramDrafter()
    assert d.propose([1, 2, 3, 4], 3) == []
    assert d.propose([1], 3) == []
    assert d.propose([1, 1], 0) == []


def test_continuation_is_capped_by_n_and_the_context_end():
    d = NgramDrafter(max_ngram=1)
    assert d.propose([3, 4, 5, 3], 10) == [4, 5, 3]
