"""What a router session learns from its request's cycles: it reports into the shared cost
model and acceptance estimates, and never decides anything.

Per cycle (CycleRunner's observer protocol): every forward's cost (a batched call teaches the
shared costs once, not once per sequence), the Python work per logits row, and every
verification's acceptance, filed under the proposer's estimator name (the lookup's: the match
class of the lookup that drafted that block).

Free observations: every model in a cycle computes its distribution at the cycle's context
(row 0 of its first call), so every pair of the chain's models is scored there, adjacent or
not (`_shadow_pairs`); the lookup made before the choice is scored against the rows the
models compute anyway (`_shadow_ngram`), or, when the target ran alone and reported no rows,
against what it emitted: those tokens are draws from (greedy: the argmax of) the target's p,
so [emitted == lookup's] has expectation p(x), an unbiased if noisier acceptance score.

The fixed cost per forward outside the model (Python, the driver) is the cycle's time minus
its forwards and rows, per forward: an EMA pushed to the cost model (alone only: in a batch a
cycle also waits for the other sequences' calls).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from specrouter.metrics import LevelStats
from specrouter.router.config import DEFAULT_CONFIG, RouterConfig
from specrouter.router.estimates.acceptance import AcceptanceEstimator, pair_score
from specrouter.router.estimates.costs import OnlineCosts
from specrouter.router.policy.plan import match_key
from specrouter.router.policy.predictor import ChainSpec



class CycleLearner:
    """The observing half of one router session."""

    def __init__(self, acceptance: AcceptanceEstimator, costs: OnlineCosts, target: str,
                 lookup: str | None = None, config: RouterConfig = DEFAULT_CONFIG) -> None:
        """lookup: the model-free level (None: none), filed per match class (the Draft's)."""
        self.acceptance, self.costs, self.target, self.lookup = acceptance, costs, target, lookup
        self.config = config
        self.row_kind = "greedy"
        self.overhead = 0.0
        self.begin(None, None)

    def begin(self, ngram_x: list[int] | None, ngram_class: str | None) -> None:
        """A cycle starts; the lookup at its context proposed ngram_x (None: nothing)."""
        self._first_row: dict[str, object] = {}
        self._ngram_x, self._ngram_class = ngram_x, ngram_class
        self._ngram_scored: set[str] = set()  # verifiers it was scored against this cycle
        #: The cycle's model calls and the seconds inside them, all its models together, in
        #: the order reported (counted as a level's are; the lookup makes no calls).
        self._models = LevelStats("models")
        self._rows_seconds = 0.0

    # CycleRunner's observer protocol -------------------------------------------------------
    def on_forward(self, level: str, n_tokens: int, seconds: float, shared: bool = False, batch: int = 1) -> None:
        if not shared:  # a batched call teaches the shared costs once, not once per sequence
            self.costs.observe(level, n_tokens, seconds, batch)
        if level != self.lookup:
            self._models.observe_forward(seconds)

    def on_rows(self, level: str, rows: int, seconds: float) -> None:
        self.costs.observe_rows(self.row_kind, rows, seconds)
        self._rows_seconds += seconds

    def on_verify(self, proposer: str, verifier: str, proposals, q, p, n_accepted: int, requested: int,
                  match_class: str | None = None) -> None:
        key = proposer
        lookup = proposer == self.lookup
        if lookup:
            # Filed under the match class of the lookup that drafted this block (every block a
            # middle level asks of it has its own). A block it found nothing for ends like a
            # rejection: the cycle's class pays (its fill).
            key = match_key(proposer, match_class) if match_class else self._ngram_class
        if key is not None:
            self.acceptance.observe(key, verifier, proposals, q, p, requested, n_accepted)
        if not lookup and proposer not in self._first_row and q:
            self._first_row[proposer] = q[0]
        if lookup:
            self._ngram_scored.add(verifier)
        if verifier not in self._first_row and p:
            self._first_row[verifier] = p[0]
            if self._ngram_x is not None and not lookup:
                self._shadow_ngram(verifier, proposals, p)

    def end_cycle(self, new_tokens: Sequence[int], seconds: float, ran: ChainSpec | None, batch_size: int) -> None:
        """The cycle that ran chain `ran` emitted new_tokens in `seconds`."""
        self.acceptance.advance(len(new_tokens))
        if self._ngram_x is not None and self.target not in self._ngram_scored:
            self._shadow_ngram_on_output(new_tokens)
        models = self._models
        if models.forwards and batch_size == 1:
            overhead = max(0.0, (seconds - models.seconds - self._rows_seconds) / models.forwards)
            self.overhead += self.config.overhead_alpha * (overhead - self.overhead)
            self.costs.set_overhead(self.overhead)
        if ran is not None:
            self._shadow_pairs(ran.names)

    # Shadow scores ------------------------------------------------------------------------
    def _shadow_ngram(self, verifier: str, proposals, p) -> None:
        """Score the lookup's proposal against the verifier's rows while their contexts agree
        (row i follows the actual proposals[:i], valid for the lookup while those equal its own)
        and, under greedy verification, up to its first rejection, where its block would end
        (the rows after it follow a token the verifier did not commit)."""
        greedy = self.acceptance.mode == "greedy"
        x = self._ngram_x
        scores = []
        for i in range(min(len(x), len(p))):
            scores.append(pair_score(x[i], None, p[i], greedy))
            if i >= len(proposals) or proposals[i] != x[i] or greedy and not scores[-1]:
                break
        self.acceptance.observe_scores(self._ngram_class, verifier, scores or [0.0])
        self._ngram_scored.add(verifier)

    def _shadow_ngram_on_output(self, new_tokens: Sequence[int]) -> None:
        x = self._ngram_x
        scores = []
        for i in range(min(len(x), len(new_tokens))):
            scores.append(1.0 if x[i] == new_tokens[i] else 0.0)
            if not scores[-1]:
                break
        self.acceptance.observe_scores(self._ngram_class, self.target, scores or [0.0])

    def _shadow_pairs(self, names: Sequence[str]) -> None:
        greedy = self.acceptance.mode == "greedy"
        adjacent = set(zip(names, names[1:]))
        for j, i in itertools.combinations(names, 2):
            if (j, i) in adjacent or j not in self._first_row or i not in self._first_row:
                continue  # (the lookup is scored in on_verify)
            row = self._first_row[j]
            score = pair_score(row, None, self._first_row[i], True) if greedy else pair_score(0, row, self._first_row[i], False)
            self.acceptance.observe_scores(j, i, [score])
