"""Proposers: what drafts at level 0 of a chain (the protocol: cascade/proposer.py).

`MODEL_FREE` names the model-free drafters a chain or pool may use by name; each is
built fresh per chain (they keep no state between requests).
"""

from __future__ import annotations

from specrouter.drafters.lookup import LookupDrafter
from specrouter.drafters.ngram import NGRAM_NAME, NgramDrafter
from specrouter.drafters.suffix import SuffixDrafter

MODEL_FREE: dict[str, type[LookupDrafter]] = {NGRAM_NAME: NgramDrafter, SuffixDrafter.name: SuffixDrafter}
#: The model-free drafter `--chain auto` routes unless told otherwise: on work that copies
#: (docs/journal.md) auto with it ran 1.73x the target alone where auto with the n-gram
#: ran 1.67x, and it reads the cross-request memory.
DEFAULT_LOOKUP = SuffixDrafter.name

__all__ = ["DEFAULT_LOOKUP", "MODEL_FREE", "LookupDrafter", "NgramDrafter", "SuffixDrafter"]
