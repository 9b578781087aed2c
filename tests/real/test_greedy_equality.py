"""Greedy output of speculative chains equals the 1.5B target alone, token for token,
up to the near-tie rule (see greedy_check.py)."""

import pytest

from .conftest import REFERENCE_TOKENS, SMALL, TARGET
from .greedy_check import assert_matches_references

CHAINS = {
    "0.5b->1.5b": ([SMALL, TARGET], [4]),
    "ngram->1.5b": (["ngram", TARGET], [4]),
    "ngram->0.5b->1.5b": (["ngram", SMALL, TARGET], [3, 4]),
}


@pytest.mark.parametrize("name", list(CHAINS))
def test_chain_matches_target_alone(pool, references, name):
    specs, lengths = CHAINS[name]
    chain = pool.chain(specs, lengths)
    assert_matches_references(chain.target, references, chain, name, REFERENCE_TOKENS)
