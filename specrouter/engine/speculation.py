"""A request's speculation choice, and the one check of a chain spec.

Speculation is what every front end (HTTP, server config, CLI) turns its own syntax into;
check_chain (cascade/chain.py, which Chain itself runs) is the only place a chain of level
names and its draft lengths are validated.
Both raise InvalidParameterError (InvalidChainError when a name is wrong) with a message
that names the problem. Loading the named models (pool.Pool.chain) checks what only the
loaded models can tell: files, tokenizers, ngram's place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from specrouter.cascade.chain import check_chain
from specrouter.errors import InvalidParameterError

Mode = Literal["auto", "off", "chain"]
MODES: tuple[str, ...] = ("auto", "off", "chain")


@dataclass(frozen=True)
class Speculation:
    """Per-request choice: the router (auto), the target alone (off), or a fixed chain.

    chain: level names, cheapest first, target last (mode "chain" only); draft_lengths:
    one per non-target level, or () for the default per level. Construction checks the
    chain without context (check_chain); Speculation.fixed also checks it against the
    served levels and target.
    """

    mode: Mode = "auto"
    chain: tuple[str, ...] = ()
    draft_lengths: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InvalidParameterError(f"speculation must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.mode == "chain":
            check_chain(self.chain, self.draft_lengths or None)
        elif self.draft_lengths:
            raise InvalidParameterError(f"draft_lengths needs an explicit chain, not {self.mode!r}")
        elif self.chain:
            raise InvalidParameterError(f"a chain needs mode 'chain', got {self.mode!r}")

    @classmethod
    def fixed(cls, names: Sequence[str], draft_lengths: Sequence[int] | None = None,
              levels: Sequence[str] | None = None, target: str | None = None) -> Speculation:
        """A fixed chain, checked by check_chain (an empty draft_lengths means the default)."""
        lengths = tuple(draft_lengths or ())
        check_chain(names, lengths or None, levels, target)
        return cls("chain", tuple(names), lengths)

    @classmethod
    def parse(cls, text: str, draft_lengths: Sequence[int] | None = None,
              levels: Sequence[str] | None = None, target: str | None = None) -> Speculation:
        """`auto`, `off`, or comma-separated level names (checked as in `fixed`)."""
        if text in ("auto", "off"):
            return cls(text, draft_lengths=tuple(draft_lengths or ()))
        return cls.fixed([n.strip() for n in text.split(",")], draft_lengths, levels, target)
