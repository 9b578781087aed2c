"""The engine's own work per model call, priced on the simulated clock (optional).

A simulated forward costs what the device profile says; the engine around it (scheduling,
KV bookkeeping, copying the logits out, argmax or warp per row, verification) costs host
time the device profile does not hold. HostCosts prices it per call and per row the call
returns:

    host seconds of a call = per_call * sequences + per_row * rows

with rows taken as the tokens the call feeds (a verification feeds its proposals and gets
one row per token plus the bonus row; a draft feeds the one token it proposed last). A
model's catch-up over many tokens returns one row but is charged for all of them: an
overcharge where a drafter catches up, which only makes drafting look dearer.

Fitted from benchmarks/host_work.py (models that cost nothing): greedy target alone =
per_call + per_row; a model draft of k plus its verification = (k + 1) calls and 2k + 1
rows. The router's choice per cycle is not in it (those chains are fixed).
"""

from __future__ import annotations

from dataclasses import dataclass

from specrouter.errors import InvalidParameterError


@dataclass(frozen=True)
class HostCosts:
    per_call: float = 0.0  # seconds per sequence in a call
    per_row: float = 0.0  # seconds per row (token) of a call

    def __post_init__(self) -> None:
        for name in ("per_call", "per_row"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 1:
                raise InvalidParameterError(f"host {name} must be seconds in [0, 1), got {value!r}")

    def seconds(self, sequences: int, rows: float) -> float:
        return self.per_call * sequences + self.per_row * rows

    @classmethod
    def parse_ms(cls, text: str) -> HostCosts:
        """'CALL,ROW' in milliseconds (e.g. '0.075,0.015')."""
        parts = text.split(",")
        try:
            call, row = (float(p) / 1e3 for p in parts)
        except ValueError:
            raise InvalidParameterError(f"host costs must be 'CALL_MS,ROW_MS', got {text!r}") from None
        return cls(call, row)

    def label(self) -> str:
        return "not priced" if self == NO_HOST else f"{self.per_call * 1e3:g} ms per call + {self.per_row * 1e3:g} ms per row"


#: The default: the engine's own work is free (the device profile alone).
NO_HOST = HostCosts()
