"""Routes that do not move: how a request with a seed is routed, so that it gets the same
output each time it is sent.

A live router session decides from state other requests move (the global acceptance
estimates, the draft stop's calibration, answer lengths, draft-length hints, the
cross-request memory), from clocks (costs corrected by timed forwards, the probes' budget,
pacing) and from the batch it runs in (a forward costed for B sequences). Any of these can
change the chain of a cycle, and with it which random numbers a sampled cycle draws and
the order of a kernel's sums: a seeded request would not repeat.

FrozenRoutes takes a router's state once (a server takes it when it starts, with the
profile and the estimates it loaded) and gives each seeded request a session built from
copies of it that:
- prices with FixedCosts (the costs as they stood: no timing moves them);
- reads no cross-request memory (its own prompt and output only);
- learns within its request from what its cycles accept (its own copies of the estimates
  and of the draft stop's calibration), never from clocks, and hands nothing back;
- runs no probes, deliberates every choice, and prices every forward as one sequence's,
  whatever runs beside it.
Its decisions are then a function of its prompt, its parameters and the frozen state.
"""

from __future__ import annotations

import copy
import math

from specrouter.drafters.ngram import NGRAM_NAME
from specrouter.router.draft_stop import ConfidenceStop
from specrouter.router.estimates.costs import FixedCosts
from specrouter.router.policy.pacing import ChoicePacing
from specrouter.router.policy.state import ProbeBudget
from specrouter.router.session import Router


class _NoProbes(ProbeBudget):
    """A probes' account with nothing to spend."""

    def left(self, expected: float) -> float:
        return -math.inf


class _Solo(Router):
    """A session that prices every forward as one sequence's, whatever batch it runs in."""

    @property
    def batch_size(self) -> int:
        return 1

    @batch_size.setter
    def batch_size(self, _: int) -> None:
        pass


class FrozenRoutes:
    """A router's state at one moment; session() routes one reproducible request from it."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.costs = FixedCosts.of(router.costs)
        self.acceptance = router.acceptance.copy()
        self.calibration = copy.deepcopy(router.draft_stop.calibration) if router.draft_stop is not None else None
        self.lengths, self.hints = router.lengths.copy(), router.hints.copy()

    def session(self) -> Router:
        r = self.router
        stop = ConfidenceStop(copy.deepcopy(self.calibration), r.config) if self.calibration is not None else None
        return _Solo(r.target, r.drafts, self.costs, self.acceptance.copy(), r.lookup_drafter is not None, r.message,
                     stop is not None, config=r.config, shared_stop=stop, lookup=r.lookup or NGRAM_NAME, memory=None,
                     lengths=self.lengths.copy(), budget=_NoProbes(0.0), hints=self.hints.copy(),
                     pacing=ChoicePacing(0.0, r.config))
