"""Online acceptance estimates per ordered pair (proposer, verifier).

What is estimated is the per-position acceptance rate `a` of the predictor's i.i.d.
model, from the two distributions at every verified position the block reached, not
from the 0/1 accept decisions: the expectation has far less variance than the coin flips.
- sampling, model proposer: sum_x min(p(x), q(x)) = 1 - TV(p, q);
- sampling, deterministic proposer (a lookup, q one-hot at x): p(x);
- greedy: 1 if the proposal is the verifier's argmax, else 0.
A block is scored up to its first rejection (the accepted positions and the rejected
one), not beyond: the predictor's `a` is the chance of going on from a position that
was reached; the positions after a disagreement answer another question (how often the
draft's own continuation of a wording the verifier did not take agrees with it). Under
greedy the scores of a block are 1, ..., 1, 0: their mean over blocks is accepted /
(accepted + rejections), the maximum-likelihood rate of the i.i.d. model. Every reached
position weighs one: a bad block is short by construction, so no cap per block is needed,
and one would bias the rate low. A proposer that returned fewer tokens than asked (a
lookup finding nothing) scores one 0 at the first missing position, when all it gave was
accepted: for the block it ends exactly like a rejection there.

Per-request estimates shrink toward the global ones by count, n / (n + shrink): a new
request starts from what earlier requests saw and moves to its own data. Both are EMAs
(steps alpha_request, alpha_global) that start as plain means, so the first observations
count fully and later drift is followed; the per-request one also restarts when its recent
window clearly departs from it (Estimate).

A per-request estimate goes stale when its pair stops running: a request that left a
chain after a few bad blocks would otherwise never observe that pair again. So its weight
is discounted by the text generated since it was last observed, halving every
stale_half_life committed tokens, twice as many after each return that found the pair
still below the global estimate (the discounting of non-stationary bandits, with backoff):
the estimate drifts back to the global one, the policy tries the chain again once that
predicts a gain, or probes it earlier at the global estimate (stale_low: after `stretch`
tokens, a wait that doubles at every such return). The discount is kept when a pair that
sat out is observed again, so a probe's blocks outweigh the stretch that sent the pair out.
Pairs observed every cycle (the lookup in the shadow) never age.

How noisy an estimate is (cautious: rate() less caution_z standard errors, the guard
against the winner's curse; bold: plus as many, what a running chain must lose at before
it is left): the rate is a weighted mean of two independent estimates, so with score
variance s2 its sampling variance is
    s2 (w^2 / n_request + (1 - w)^2 / n_global),
w the request's shrinkage weight and the n the EMAs' effective sample sizes (an EMA of step
alpha averages ~(2 - alpha) / alpha scores). s2 is the global estimate's tracked score
variance, at most that of 0/1 scores (Laplace-smoothed while there are few), and the global
mean is weighed against the prior by prior_weight scores there.

Pairs never observed get a prior: the triangle inequality of TV gives
a_ik >= a_ij + a_jk - 1 through any model j observed with both (it also holds for greedy
agreement, by the union bound); it is a guaranteed lower bound, so using it is
conservative. With no such path, default_prior. Learning the pairs that priors make look
unattractive is the policy's business: bounded probes (policy/probes.py).
"""

from __future__ import annotations

import copy

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from specrouter.ops.rows import ops_of
from specrouter.router.config import DEFAULT_CONFIG, RouterConfig
from specrouter.router.estimates.learned import PairEstimate, read_estimates, save_estimates

@dataclass
class Estimate:
    """EMA that starts as the plain mean (step 1/n until it reaches alpha).

    With `detect`, a change is followed at once: when the mean of the last change_window
    scores departs by more than change_z standard errors (and at least min_jump) from the
    EMA as it stood before them (not as it stands after: they already pulled it toward
    themselves), the EMA restarts from that window (its mean, and its size as its count:
    those scores are all that describe the new text). The variance is tracked slowly
    (variance_alpha), so a change does not hide itself."""

    mean: float = 0.0
    count: float = 0.0
    var: float = 0.0
    recent: deque = field(default_factory=deque)
    seen_at: float = 0.0  # the estimator's position (committed tokens) after the cycle of the last update
    returns: int = 0  # times observed again after sitting out while below the global estimate

    def weight_at(self, position: float, half_life: float = DEFAULT_CONFIG.stale_half_life) -> float:
        """The count discounted by the tokens committed since the last update; the half-life
        doubles with every return that found the pair still below the global estimate,
        like the probes' wait (stale_low), so a pair that keeps disagreeing ages ever slower."""
        half_life *= 2**self.returns
        return self.count * 0.5 ** (max(0.0, position - self.seen_at) / half_life)

    def update(self, x: float, alpha: float, config: RouterConfig = DEFAULT_CONFIG, detect: bool = False) -> None:
        before = self.mean
        self.count += 1
        step = max(1 / self.count, alpha)
        self.var += max(1 / self.count, config.variance_alpha) * ((x - self.mean) ** 2 - self.var)
        self.mean += step * (x - self.mean)
        if detect:
            size = config.change_window
            self.recent.append((x, before))
            while len(self.recent) > size:
                self.recent.popleft()
            if len(self.recent) == size:
                window = sum(score for score, _ in self.recent) / size
                reference = self.recent[0][1]  # the EMA before the window's first score
                if abs(window - reference) > max(config.min_jump, config.change_z * math.sqrt(self.var / size)):
                    self.mean, self.count = window, float(size)
                    self.recent.clear()


class Tally(NamedTuple):
    """Scores a process observed itself for one global estimate: their sum and number (an
    immutable pair, replaced whole, so another thread reads a consistent one)."""

    total: float = 0.0
    count: int = 0


def _seeded(mean: float, count: float) -> Estimate:
    """An estimate known by its mean and count only (persisted, or set by a test): its score
    variance starts at the bound mean (1 - mean), and observations refine it."""
    return Estimate(mean, count, var=mean * (1 - mean))


def _effective_count(alpha: float) -> float:
    """Scores an EMA of step alpha averages over, in the variance of its mean."""
    return (2 - alpha) / alpha


def pair_score(proposal: int, q_row, p_row, greedy: bool) -> float:
    """Expected acceptance at one position (see the module docstring)."""
    if greedy:
        return 1.0 if int(proposal) == int(p_row) else 0.0
    ops = ops_of(p_row)
    return ops.at([p_row], [proposal])[0] if q_row is None else ops.overlap([p_row], [q_row])[0]


def position_scores(proposals: Sequence[int], q, p, greedy: bool, requested: int, n_accepted: int) -> list[float]:
    """Scores of the positions a block reached: its n_accepted accepted proposals and the
    rejected one after them, if any (see the module docstring)."""
    reached = proposals[: n_accepted + 1]
    if greedy or not reached:
        scores = [pair_score(x, None, p[i], True) for i, x in enumerate(reached)]
    elif q is None:  # one pass over all positions (one transfer for rows on a device)
        scores = ops_of(p).at(p[: len(reached)], reached)
    else:
        scores = ops_of(p).overlap(p[: len(reached)], q[: len(reached)])
    if n_accepted >= len(proposals) and len(proposals) < requested:
        scores.append(0.0)  # ran out of proposals: ends the block like a rejection
    return scores


class AcceptanceEstimator:
    def __init__(self, default: float | None = None, shrink: float | None = None,
                 config: RouterConfig = DEFAULT_CONFIG) -> None:
        """default, shrink: the config's default_prior and shrink, unless given."""
        self.config = config
        self.default = config.default_prior if default is None else default
        self.shrink = config.shrink if shrink is None else shrink
        self.mode = "sampled"
        self.global_: dict[tuple[str, str, str], Estimate] = {}
        self.request: dict[tuple[str, str], Estimate] = {}
        self.fill_: dict[tuple[str, str], Estimate] = {}  # proposals given / asked, per pair
        #: Per global key, the scores observed here since the estimator was built or last saved.
        self.tallies: dict[tuple[str, str, str], Tally] = {}
        self.position = 0.0  # tokens committed in this request: the clock of staleness
        self._observed: set[tuple[str, str]] = set()  # request pairs observed since the last advance

    def copy(self) -> AcceptanceEstimator:
        """An estimator that starts from this one's global estimates and fill table and
        shares nothing with it: what it learns stays its own (no tallies to save)."""
        twin = AcceptanceEstimator(self.default, self.shrink, self.config)
        twin.global_, twin.fill_ = copy.deepcopy(self.global_), copy.deepcopy(self.fill_)
        return twin

    def view(self) -> AcceptanceEstimator:
        """An estimator for one of several concurrent requests, built afresh: its own
        per-request estimates, mode and position; the same global estimates and the same fill
        table (how much of what is asked a proposer gives: a property of the pair, learned
        across requests, never reset per request), so every request teaches every other; the
        same tallies of what was learned (learned())."""
        twin = AcceptanceEstimator(self.default, self.shrink, self.config)
        twin.global_, twin.fill_, twin.tallies = self.global_, self.fill_, self.tallies
        return twin

    def start_request(self, greedy: bool) -> None:
        self.mode = "greedy" if greedy else "sampled"
        self.request.clear()
        self.position = 0.0
        self._observed.clear()

    def advance(self, committed: int) -> None:
        """The request committed this many tokens (ages the per-request estimates). The pairs
        observed in the cycle that committed them are as fresh as its end: staleness counts the
        tokens of cycles a pair sat out, not the tokens of the cycle that observed it."""
        self.position += committed
        for key in self._observed:
            if key in self.request:
                self.request[key].seen_at = self.position
        self._observed.clear()

    # Observations ----------------------------------------------------------------
    def observe(self, proposer: str, verifier: str, proposals, q, p, requested: int, n_accepted: int) -> None:
        """One block: `proposals` (of `requested`) checked against the verifier's rows p, of
        which the first n_accepted were accepted."""
        greedy = self.mode == "greedy"
        self.observe_scores(proposer, verifier, position_scores(proposals, q, p, greedy, requested, n_accepted))
        if requested > 0:
            self.fill_.setdefault((proposer, verifier), Estimate()).update(
                min(len(proposals), requested) / requested, self.config.alpha_request, self.config)

    def observe_scores(self, proposer: str, verifier: str, scores: Sequence[float]) -> None:
        key = (self.mode, proposer, verifier)
        g = self.global_.setdefault(key, Estimate())
        if len(scores):
            t = self.tallies.get(key, Tally())
            self.tallies[key] = Tally(t.total + float(sum(scores)), t.count + len(scores))
        r = self.request.setdefault((proposer, verifier), Estimate())
        # Observed again after sitting out: what aged stays aged (its count is the discounted
        # one from now on), so the new data outweighs the stretch that sent the pair out,
        # and the return counts for the probes' backoff (stale_low).
        c = self.config
        if r.count and self.position - r.seen_at >= c.stretch:
            r.count = self._weight(r)
            r.returns += 1
        r.seen_at = self.position
        self._observed.add((proposer, verifier))
        for s in scores:
            g.update(s, c.alpha_global, c)
            r.update(s, c.alpha_request, c, detect=True)
        if r.mean >= g.mean:
            r.returns = 0

    def set_global(self, proposer: str, verifier: str, rate: float, count: float = 100.0, mode: str | None = None) -> None:
        """Seed an estimate (tests, persisted state)."""
        self.global_[(mode or self.mode, proposer, verifier)] = _seeded(rate, count)

    # Estimates --------------------------------------------------------------------
    def count(self, proposer: str, verifier: str) -> float:
        g = self.global_.get((self.mode, proposer, verifier))
        r = self.request.get((proposer, verifier))
        return (g.count if g else 0.0) + (self._weight(r) if r else 0.0)

    def _weight(self, r: Estimate) -> float:
        """A per-request estimate's count, discounted by the tokens since it was observed."""
        return r.weight_at(self.position, self.config.stale_half_life)

    def observed(self, proposer: str, verifier: str) -> bool:
        return self.count(proposer, verifier) > 0

    def rate(self, proposer: str, verifier: str, names: Sequence[str] = ()) -> float:
        """Per-request estimate shrunk toward the global one (or the prior)."""
        g = self.global_.get((self.mode, proposer, verifier))
        return self._shrunk(proposer, verifier, g.mean if g and g.count else self.prior(proposer, verifier, names))

    def _shrunk(self, proposer: str, verifier: str, base: float) -> float:
        """The per-request estimate shrunk toward `base` (rate's global mean or prior)."""
        r = self.request.get((proposer, verifier))
        n = self._weight(r) if r is not None else 0.0
        if not n:
            return base
        w = n / (n + self.shrink)
        return w * r.mean + (1 - w) * base

    def cautious(self, proposer: str, verifier: str, names: Sequence[str] = (), z: float = 1.0) -> float:
        """rate() less z times its noise (see the module docstring), with the global mean
        weighed against the prior by prior_weight scores; 0 with no global data (a prior is
        a guess, not a measurement)."""
        shifted = self._shifted(proposer, verifier, self.prior(proposer, verifier, names), -z)
        return 0.0 if shifted is None else shifted

    def bold(self, proposer: str, verifier: str, names: Sequence[str] = (), z: float = 1.0) -> float:
        """rate() plus z times its noise: the mirror of cautious(), what the scheduler's guard
        needs before it leaves a chain (it must lose even at this rate); rate() with no data."""
        prior = self.prior(proposer, verifier, names)
        shifted = self._shifted(proposer, verifier, prior, z)
        # No global data: rate() is the request's estimate shrunk toward this same prior.
        return self._shrunk(proposer, verifier, prior) if shifted is None else shifted

    def _shifted(self, proposer: str, verifier: str, prior: float, z: float) -> float | None:
        """rate() moved by z standard errors, its global mean weighed against `prior` (the
        pair's prior()); None without global data."""
        g = self.global_.get((self.mode, proposer, verifier))
        if g is None or not g.count:
            return None
        c = self.config
        n_global = min(g.count, _effective_count(c.alpha_global)) + c.prior_weight
        base = (g.mean * (n_global - c.prior_weight) + prior * c.prior_weight) / n_global
        r = self.request.get((proposer, verifier))
        n = self._weight(r) if r is not None else 0.0
        w = n / (n + self.shrink)
        a = w * r.mean + (1 - w) * base if n else base
        n_request = max(min(n, _effective_count(c.alpha_request)), 1e-9)
        # Score variance: of 0/1 scores of mean a, Laplace-smoothed (a = 1 from two scores
        # must not look certain); the tracked variance once there are enough scores.
        smoothed = (a * n_global + 1) / (n_global + 2)
        var = smoothed * (1 - smoothed)
        if g.count >= c.min_variance_count:
            var = min(var, g.var)
        noise = var * (w * w / n_request + (1 - w) ** 2 / n_global)
        return min(1.0, max(0.0, a + z * math.sqrt(noise)))

    def stale_low(self, proposer: str, verifier: str) -> float | None:
        """The global estimate, when this request's own estimate sits below it and was not
        observed for `stretch` committed tokens (its pair is not running), what the pair
        would do if the stretch of text that sent it out has passed. None otherwise."""
        g = self.global_.get((self.mode, proposer, verifier))
        r = self.request.get((proposer, verifier))
        # Exponential backoff: every return that found the pair still below the global
        # estimate doubles the wait, so one that keeps disagreeing is probed ever more rarely.
        if g is None or not g.count or r is None or r.mean >= g.mean \
                or self.position - r.seen_at < self.config.stretch * 2**r.returns:
            return None
        return g.mean

    def prior(self, proposer: str, verifier: str, names: Sequence[str] = ()) -> float:
        """Triangle bound through any observed middle model, else the default prior."""
        middles = [m for m in names
                   if m not in (proposer, verifier) and self.observed(proposer, m) and self.observed(m, verifier)]
        return self._prior_through(proposer, verifier, middles, self.rate)

    def _prior_through(self, proposer: str, verifier: str, middles: Sequence[str],
                       rate: Callable[[str, str], float]) -> float:
        """The prior given the middle models both of whose pairs are observed, and the pairs'
        rate() without names."""
        bounds = [rate(proposer, m) + rate(m, verifier) - 1.0 for m in middles]
        return max(0.0, max(bounds)) if bounds else self.default

    def table(self, pairs: Iterable[tuple[str, str]], names: Sequence[str], z: float) -> EstimateTable:
        """rate(), cautious(), bold() (all with `names`, at z) and count() of every pair of
        `names`, as those calls give them one at a time, in one pass: each pair's prior is
        computed once, and the counts and rates of the middle pairs the priors read once for
        all (a router measures every pair before a re-plan). A middle needs both its pairs observed
        (count() > 0): the observed pairs are read off the estimates held, not counted per
        pair of names."""
        observed = {(j, i) for (mode, j, i), g in self.global_.items() if mode == self.mode and g.count}
        observed.update(pair for pair, r in self.request.items() if self._weight(r))
        plain: dict[tuple[str, str], float] = {}

        def rate(j: str, i: str) -> float:  # rate(j, i) without names: its prior is the default
            r = plain.get((j, i))
            if r is None:
                r = plain[(j, i)] = self.rate(j, i)
            return r

        out = EstimateTable({}, {}, {}, {})
        for j, i in pairs:
            middles = [m for m in names if m not in (j, i) and (j, m) in observed and (m, i) in observed]
            prior = self._prior_through(j, i, middles, rate)
            g = self.global_.get((self.mode, j, i))
            rate_ji = out.rate[(j, i)] = self._shrunk(j, i, g.mean if g and g.count else prior)
            low, high = self._shifted(j, i, prior, -z), self._shifted(j, i, prior, z)
            out.cautious[(j, i)] = 0.0 if low is None else low
            out.bold[(j, i)] = rate_ji if high is None else high
            out.count[(j, i)] = self.count(j, i)
        return out

    def fill(self, proposer: str, verifier: str) -> float:
        f = self.fill_.get((proposer, verifier))
        return f.mean if f and f.count else 1.0

    # Persistence: global estimates survive the process (a file), or are shared by the
    # replicas of a fleet (specrouter.fleet): both carry snapshot() and take it back with seed();
    # what is merged into the file (learned.py) is learned(), this process's own scores.
    def snapshot(self) -> list[PairEstimate]:
        """The global estimates with data. Safe to call from another thread than the one
        observing (the fleet's sync thread): the table is copied in one step."""
        return [PairEstimate(*k, e.mean, e.count) for k, e in list(self.global_.items()) if e.count]

    def seed(self, estimates: Iterable[PairEstimate]) -> None:
        """Start the global estimates from what another process learned: each rate as given,
        its count capped at the config's persist_cap (so this process's own data can still move
        it); values out of range are skipped."""
        for e in estimates:
            if 0.0 <= e.mean <= 1.0 and e.count > 0:
                self.global_[(e.mode, e.proposer, e.verifier)] = _seeded(e.mean, min(e.count, self.config.persist_cap))

    def learned(self) -> list[PairEstimate]:
        """What this process observed itself since it started or last saved, per global estimate:
        the plain mean and the number of its scores (neither what it loaded nor what it was
        seeded with). What save() merges into the file (learned.py); a fleet's replicas
        report it for the fleet's save. Safe from another thread, as snapshot()."""
        return [PairEstimate(*k, t.total / t.count, float(t.count)) for k, t in list(self.tallies.items()) if t.count]

    def save(self, file: Path) -> None:
        """Merge learned() into the file (learned.save_estimates: under its lock, pooled with
        what is on disk now, atomically; a file with no readable table is replaced by
        snapshot()). Once written, the tallies restart: what they held is on disk, and a later
        save must not add it again. Call it when no observation runs (at exit)."""
        if save_estimates(file, self.learned(), self.snapshot(), self.config.persist_cap):
            self.tallies.clear()

    def load(self, file: Path) -> None:
        """Seed from the file (absent, damaged or of another format: start from the priors).
        What it held is never counted as learned here: only observe_scores() tallies."""
        self.seed(read_estimates(Path(file), self.config.persist_cap) or [])


@dataclass(frozen=True)
class EstimateTable:
    """Per pair (proposer, verifier): what AcceptanceEstimator.table measured."""

    rate: dict[tuple[str, str], float]
    cautious: dict[tuple[str, str], float]
    bold: dict[tuple[str, str], float]
    count: dict[tuple[str, str], float]
