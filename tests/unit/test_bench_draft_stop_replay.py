"""The draft-stop replay's accounting, on a hand-made stream."""

import pytest

from benchmarks.draft_stop_replay import replay
from specrouter.router.draft_stop import ConfidenceStop

STREAM = {"agree": [1, 1, 0, 1], "confidence": [0.999, 0.999, 0.2, 0.999]}


def verify(n):
    return 0.1 * n


def test_fixed_drafts_pay_their_forwards_and_commit_accepted_tokens_plus_one():
    # Block 1 drafts 2 (both accepted) and commits 3; block 2 drafts the 1 position left.
    assert replay(STREAM, 2, 0.01, verify, None) == pytest.approx((0.02 + 0.3 + 0.01 + 0.2) / 4)


def test_the_stop_ends_a_draft_after_its_unconfident_token():
    # Cap 4: the draft runs on through 0.999, 0.999, stops after 0.2 (3 drafted, 2 accepted,
    # 3 committed), then drafts the last position alone.
    stop = ConfidenceStop()
    expected = (3 * 0.01 + verify(4) + 0.01 + verify(2)) / 4
    assert replay(STREAM, 4, 0.01, verify, stop) == pytest.approx(expected)
