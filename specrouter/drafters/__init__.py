"""Proposers: what drafts at level 0 of a chain (the protocol: cascade/proposer.py).

`MODEL_FREE` names the model-free drafters a chain or pool may use by name; each is
built fresh per chain (they keep no state between requests).
"""

from __future__ import annotations

from specrouter.drafters.lookup import LookupDrafter
from specrouter.drafters.ngram import NGRAM_NAME, NgramDrafter
from specrouter.drafters.suffix import SuffixDrafter

MODEL_FREE: dict[str, type[LookupDrafter]] = {NGRAM_NAME: NgramDrafter, SuffixDrafter.name: SuffixDrafter}
#: The model-free drafter `--chain auto` routes unless told otherwise: it proposes from the
#: longest earlier match, with no cap on its length, as far as its occurrences agree (the
#: n-gram: the latest match, at most 4 tokens long by default), it reads the cross-request
#: memory, and on work that copies auto gains more with it than with the n-gram
#: (docs/journal.md, 2026-12-02, "Copy drafting").
DEFAULT_LOOKUP = SuffixDrafter.name

__all__ = ["DEFAULT_LOOKUP", "MODEL_FREE", "LookupDrafter", "NgramDrafter", "SuffixDrafter"]
