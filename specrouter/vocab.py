"""Models in one chain must share a tokenizer: token ids pass between them unchanged.

Same-family models may pad their vocabularies (e.g. Qwen2.5 0.5B/1.5B have 151,936
logits, the 7B 152,064): the shared id range must agree token by token, the extra
tail of the longer one is tolerated. Anything else is a real mismatch and refused.
"""

from __future__ import annotations

from collections.abc import Sequence

from specrouter.backends.base import Backend
from specrouter.errors import TokenizerMismatchError


def check_shared_tokenizer(models: Sequence[Backend]) -> None:
    """Raise TokenizerMismatchError naming both models and the first differing token."""
    if len(models) < 2:
        return
    ref = models[-1]
    ref_texts = ref.vocab_texts()
    for other in models[:-1]:
        texts = other.vocab_texts()
        shared = min(len(texts), len(ref_texts))
        for token in range(shared):
            if texts[token] != ref_texts[token]:
                raise TokenizerMismatchError(
                    f"{other.name} and {ref.name} do not share a tokenizer: token {token} is "
                    f"{texts[token]!r} in {other.name} but {ref_texts[token]!r} in {ref.name}"
                )
