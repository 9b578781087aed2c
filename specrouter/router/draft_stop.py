"""When a drafting model should stop drafting: the router's DraftStop (cascade.chain).

A draft length k is a bet on the average position; the draft's own confidence says where
this block stands (a draft's rejections fall mostly on the tokens it was unsure of). So
after every drafted token the rule weighs drafting m more:

    gain(m) = lam * R * (a + a^2 + ... + a^m) - (m * t_d + V(n + m + 1) - V(n + 1))

R the chance that all n tokens drafted so far are accepted (the product of the
calibrated acceptance of their confidences), a the pair's acceptance rate for tokens not
drafted yet, t_d one draft forward, V(n) the verification of n tokens, lam the chain's
seconds per token (what a committed token is worth: minimising cycle cost - lam * tokens
minimises cost per token, Dinkelbach). It drafts on while some m <= cap - n gains.
Every m is weighed, not only the next one: where verifying 3 tokens costs what 17 do, stopping
at 2 saves no verification. The rule weighs every fixed continuation from where it stands (a
rollout of the fixed lengths), so it does at least about as well as the planned length.

Calibration: the chance of acceptance per confidence bin (the config's stop_edges), learnt
from every verified block of the pair (positions up to the first rejection), starting from
the bin's stop_centers value weighing stop_prior_count scores; bins are shared by all
requests, EMAs of step stop_alpha, so that a stretch where the draft was confidently wrong
does not cut its blocks for long after. A probe runs its planned length without stopping
(`stopping=False`): it is there to measure the pair, and it teaches the calibration all
the same.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

from specrouter.router.config import DEFAULT_CONFIG, RouterConfig
from specrouter.router.estimates.acceptance import Estimate



def confidence_bin(c: float, edges: Sequence[float] = DEFAULT_CONFIG.stop_edges) -> int:
    """The bin of confidence c: how many of the bins' upper edges it reaches."""
    return bisect.bisect_right(edges, c)


class ConfidenceStop:
    """The rule for one router session; `calibration` is shared by sessions (see module docstring)."""

    def __init__(self, calibration: dict | None = None, config: RouterConfig = DEFAULT_CONFIG) -> None:
        self.config = config
        self.calibration: dict[tuple[str, ...], list[Estimate]] = {} if calibration is None else calibration
        self.key: tuple[str, ...] = ()
        self.rate, self.cap, self.worth, self.draft_seconds = 0.0, 0, 0.0, 0.0
        self.stopping = True
        self.verify: list[float] = []  # verify[n]: seconds to verify n tokens, n = 0..cap + 1

    def session(self) -> ConfidenceStop:
        return ConfidenceStop(self.calibration, self.config)

    def configure(self, key: tuple[str, ...], rate: float, cap: int, worth: float, draft_seconds: float,
                  verify_seconds: Callable[[int], float], stopping: bool = True) -> None:
        """Before a cycle: the pair's (mode, draft, verifier), its acceptance rate, the draft length
        (the cap), the chain's seconds per token, a draft forward's and a verification's costs;
        without `stopping`, the draft runs to the cap (and the calibration still learns)."""
        self.key, self.rate, self.cap, self.worth = key, rate, cap, worth
        self.stopping = stopping
        self.draft_seconds = draft_seconds
        self.verify = [0.0] + [verify_seconds(n) for n in range(1, cap + 2)]

    def _bins(self) -> list[Estimate]:
        bins = self.calibration.get(self.key)
        if bins is None:
            prior = self.config.stop_prior_count
            bins = self.calibration[self.key] = [Estimate(c, prior, c * (1 - c)) for c in self.config.stop_centers]
        return bins

    def acceptance(self, c: float) -> float:
        """Calibrated chance that a drafted token of confidence c is accepted."""
        return self._bins()[confidence_bin(c, self.config.stop_edges)].mean

    def more(self, confidences: Sequence[float]) -> bool:
        n = len(confidences)
        if n >= self.cap or not self.stopping:
            return n < self.cap
        reach = 1.0
        for c in confidences:
            reach *= self.acceptance(c)
        tokens, v0 = 0.0, self.verify[n + 1]
        step = reach
        for m in range(1, self.cap - n + 1):
            step *= self.rate
            tokens += step
            if self.worth * tokens > m * self.draft_seconds + self.verify[n + m + 1] - v0:
                return True
        return False

    def learn(self, confidences: Sequence[float], n_accepted: int) -> None:
        bins, config = self._bins(), self.config
        for j, c in enumerate(confidences[: n_accepted + 1]):
            bins[confidence_bin(c, config.stop_edges)].update(1.0 if j < n_accepted else 0.0, config.stop_alpha, config)
