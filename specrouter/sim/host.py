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
rows. Those chains are fixed: the router's choice before every cycle of a routed sequence
is priced apart, per_choice a deliberation and per_reuse a choice not deliberated (a reuse of
a recent decision, router/policy/pacing.py, or a request's first cycle, which feeds its prompt
with the target alone; benchmarks/router_work.py measures both), by PricedChoices: the
clock advances before the choice returns, so, as for real, the time is in no forward's
timing and no cycle's (the router does not learn it as a model's cost) but in the request's,
which times the choice and tells the router (on_choice: the pacing's d), and a batch's
sequences choose one after another.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from specrouter.backends.base import Backend
from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams
from specrouter.engine.chain_router import ChainRouter
from specrouter.errors import InvalidParameterError
from specrouter.metrics import SpecStats


@dataclass(frozen=True)
class HostCosts:
    per_call: float = 0.0  # seconds per sequence in a call
    per_row: float = 0.0  # seconds per row (token) of a call
    per_choice: float = 0.0  # seconds per deliberated choice of a routed sequence
    per_reuse: float = 0.0  # seconds per choice not deliberated: a reuse (router/policy/pacing.py), a prefill

    def __post_init__(self) -> None:
        for name in ("per_call", "per_row", "per_choice", "per_reuse"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 1:
                raise InvalidParameterError(f"host {name} must be seconds in [0, 1), got {value!r}")

    def seconds(self, sequences: int, rows: float) -> float:
        return self.per_call * sequences + self.per_row * rows

    @classmethod
    def parse_ms(cls, text: str) -> HostCosts:
        """'CALL,ROW', 'CALL,ROW,CHOICE' or 'CALL,ROW,CHOICE,REUSE' in milliseconds (e.g.
        '0.075,0.015,1.2' or '0.075,0.015,0.6,0.1')."""
        parts = text.split(",")
        try:
            if len(parts) not in (2, 3, 4):
                raise ValueError
            values = [float(p) / 1e3 for p in parts]
        except ValueError:
            raise InvalidParameterError(f"host costs must be 'CALL_MS,ROW_MS', 'CALL_MS,ROW_MS,CHOICE_MS' or "
                                        f"'CALL_MS,ROW_MS,CHOICE_MS,REUSE_MS', got {text!r}") from None
        return cls(*values)

    def label(self) -> str:
        if self == NO_HOST:
            return "not priced"
        text = f"{self.per_call * 1e3:g} ms per call + {self.per_row * 1e3:g} ms per row"
        text += f" + {self.per_choice * 1e3:g} ms per router choice" if self.per_choice else ""
        return text + (f" + {self.per_reuse * 1e3:g} ms per reused choice" if self.per_reuse else "")


#: The default: the engine's own work is free (the device profile alone).
NO_HOST = HostCosts()


class PricedChoices:
    """A router whose every choice advances a simulated clock before it returns (`charge`
    does it) by `seconds` where it deliberated and `reuse_seconds` where it did not (a reused
    decision, or the prompt's cycle): the host time of the router's choice (see the module docstring). Everything
    else is the router's own."""

    def __init__(self, router: ChainRouter, seconds: float, charge: Callable[[float], None],
                 reuse_seconds: float = 0.0) -> None:
        self.router, self.seconds, self.charge, self.reuse_seconds = router, seconds, charge, reuse_seconds

    @property
    def target(self) -> Backend:
        return self.router.target

    @property
    def models(self) -> Sequence[Backend]:
        return self.router.models

    @property
    def decisions(self) -> list:
        return self.router.decisions

    @property
    def deliberated(self) -> bool:
        return self.router.deliberated

    @property
    def prefill(self) -> bool:
        return self.router.prefill

    @property
    def lookup_stats(self) -> SpecStats:
        return self.router.lookup_stats

    @property
    def batch_size(self) -> int:
        return self.router.batch_size

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        self.router.batch_size = value

    def start(self, params: SamplingParams, prompt_tokens: int, max_tokens: int) -> None:
        self.router.start(params, prompt_tokens, max_tokens)

    def choose(self, position: int, room: int, cached: Mapping[str, int], context: Sequence[int],
               forced: Sequence[int] = ()) -> Chain:
        chain = self.router.choose(position, room, cached, context, forced)
        self.charge(self.seconds if self.router.deliberated else self.reuse_seconds)
        return chain

    def on_choice(self, seconds: float) -> None:
        self.router.on_choice(seconds)

    def on_forward(self, level: str, n_tokens: int, seconds: float, shared: bool = False, batch: int = 1) -> None:
        self.router.on_forward(level, n_tokens, seconds, shared, batch)

    def on_rows(self, level: str, rows: int, seconds: float) -> None:
        self.router.on_rows(level, rows, seconds)

    def on_verify(self, proposer, verifier, proposals, q, p, n_accepted, requested, match_class=None) -> None:
        self.router.on_verify(proposer, verifier, proposals, q, p, n_accepted, requested, match_class)

    def end_cycle(self, new_tokens: Sequence[int], seconds: float) -> None:
        self.router.end_cycle(new_tokens, seconds)

    def finish(self) -> None:
        self.router.finish()

    def exclude(self, name: str) -> None:
        self.router.exclude(name)
