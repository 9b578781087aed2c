import pytest

from specrouter.backends.synthetic import SyntheticBackend
from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams
from specrouter.engine import generate
from specrouter.errors import TokenizerMismatchError
from specrouter.vocab import check_shared_tokenizer


class Renamed(SyntheticBackend):
    """Same ids, but token 3 spells differently: a different tokenizer."""

    def token_bytes(self, token):
        return b"X" if token == 3 else super().token_bytes(token)


def test_padded_vocabularies_are_tolerated():
    check_shared_tokenizer([SyntheticBackend("small", vocab=8), SyntheticBackend("big", vocab=10)])
    check_shared_tokenizer([SyntheticBackend("big", vocab=10), SyntheticBackend("small", vocab=8)])


def test_a_real_mismatch_names_both_models_and_the_first_differing_token():
    with pytest.raises(TokenizerMismatchError, match=r"other and target do not share a tokenizer: token 3 is b'X' in other but b'd' in target"):
        check_shared_tokenizer([Renamed("other", vocab=8), SyntheticBackend("target", vocab=8)])


def test_chain_over_padded_vocabularies_stays_exact_under_greedy():
    target = SyntheticBackend("target", vocab=10)
    draft = SyntheticBackend("draft", vocab=8, noise=0.5)  # its logits cover ids 0..7 only
    alone = generate(Chain([target], []), [1, 2], SamplingParams(), 50)
    spec = generate(Chain([draft, target], [3]), [1, 2], SamplingParams(), 50)
    assert spec.token_ids == alone.token_ids
