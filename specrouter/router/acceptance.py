"""Online acceptance estimates per ordered pair (proposer, verifier).

What is estimated is the per-position acceptance rate `a` of the predictor's i.i.d.
model, from the two distributions at every verified position the block reached, not
from the 0/1 accept decisions: the expectation has far less variance than the coin flips.
- sampling, model proposer: sum_x min(p(x), q(x)) = 1 - TV(p, q) (reference notes);
- sampling, deterministic proposer (n-gram, q one-hot at x): p(x);
- greedy: 1 if the proposal is the verifier's argmax, else 0.
A block is scored up to its first rejection (the accepted positions and the rejected
one), not beyond: the predictor's `a` is the chance of going on from a position that
was reached, and the positions after a disagreement answer another question, how
often the draft's own continuation of a wording the verifier did not take agrees
with it. They agree far less (measured: a q4 0.5B under the fp32 1.5B scored 0.71-0.84
over all positions, while its 16-token blocks kept 8.2 tokens, which an i.i.d. rate
of 0.91 gives and 0.8 halves), so scoring them made long drafts look twice as bad as
they are. Under greedy the scores of a block are 1, ..., 1, 0: their mean over blocks
is accepted / (accepted + rejections), the maximum-likelihood rate of the i.i.d. model
(the benchmark fits its predictor-error table the same way, from tokens per block).
Every reached position weighs one: a bad block is short by construction, so no cap
per block is needed, and one would bias the rate low (long accepted runs would count
less than the rejections that end short blocks). A proposer that returned fewer tokens
than asked (the n-gram finding nothing) scores one 0 at the first missing position,
when all it gave was accepted: for the block it ends exactly like a rejection there.

Per-request estimates shrink toward the global ones by count, n / (n + SHRINK): a new
request starts from what earlier requests saw and moves to its own data (code and chat
prompts accept very differently). Both are EMAs that start as plain means, so the
first observations count fully and later drift is followed; the per-request one also
restarts when its recent window clearly departs from it (Estimate).

A per-request estimate goes stale when its pair stops running: a request that left a
chain after a few bad blocks never observes that pair again, so without more a single
unlucky stretch would keep the chain out for the rest of the request (seen: a q4 draft
under an fp32 target left after 5 cycles, 100 cycles of target alone followed, though
the chain paid on that prompt). So its weight is discounted by the text generated
since it was last observed, halving every STALE_HALF_LIFE committed tokens, twice as
many after each return that found the pair still below the global estimate (the
discounting of non-stationary bandits, with backoff): the estimate drifts back to the
global one, the scheduler tries the chain again once that predicts a gain (with its
hysteresis), or probes it earlier at the global estimate (stale_low: after STRETCH tokens, with a wait
that doubles at every return that finds the pair still below it). The discount is kept
when a pair that sat out is observed again, so a probe's blocks outweigh the stretch
that sent the pair out: one bad block of an fp32 target's 16-token drafts, then good
text, is taken up again at the first probe. Pairs observed every cycle (the n-gram in
the shadow) never age.

How noisy an estimate is (cautious: the rate the scheduler's guard against the winner's
curse uses, rate() less one standard error; bold, rate() plus one, what a running chain
must lose at before it is left): the rate is a weighted mean of two
independent estimates, so with score variance s2 its sampling variance is
s2 (w^2 / n_request + (1 - w)^2 / n_global), w the request's shrinkage weight and the n
the EMAs' effective sample sizes (an EMA of step alpha averages ~(2 - alpha) / alpha
scores: a request's own estimate never counts more than ~19 positions, which is what
lets it follow the text). s2 is the global estimate's tracked score variance, at most
that of 0/1 scores (Laplace-smoothed while there are few), and the global mean is
weighed against the prior by PRIOR_WEIGHT scores there: a class of n-gram matches seen
twice, right twice, is not yet a rate of 1. Picking the argmin over noisy estimates
favours those that are high by chance; a guard at one standard error undoes most of it.

Pairs never observed get a prior: the triangle inequality of TV gives
a_ik >= a_ij + a_jk - 1 through any model j observed with both (it also holds for
greedy agreement, by the union bound); it is a guaranteed lower bound, so using it is
conservative. With no such path, DEFAULT_PRIOR, a deliberately pessimistic guess.
Learning the pairs that priors make look unattractive is the scheduler's business:
bounded probes, whose measured extra cost is capped at a fraction of generation time.
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
from specrouter.router.learned import PERSIST_CAP, PairEstimate, read_estimates, save_estimates

#: Acceptance assumed for an unobserved pair with no triangle bound: below the ~0.8 a
#: same-family draft typically reaches (reference notes: 0.81 greedy), so drafts are
#: not used on faith; probes find out when a draft could plausibly pay.
DEFAULT_PRIOR = 0.4
#: Positions of per-request data that weigh as much as the global estimate.
SHRINK = 8.0
ALPHA_REQUEST = 0.1  # per position: ~10 positions (a few cycles) of memory
ALPHA_GLOBAL = 0.01
WINDOW, VAR_ALPHA, MIN_JUMP = 6, 0.02, 0.15  # change detection of per-request estimates
#: Scores after which the tracked variance of a global estimate replaces the bound a (1 - a).
MIN_VARIANCE_COUNT = 10
#: Pseudo-scores at the prior that a global mean is weighed against in the cautious rate.
PRIOR_WEIGHT = 4.0
#: Committed tokens after which an unobserved per-request estimate weighs half as much.
STALE_HALF_LIFE = 32.0
#: Committed tokens without observations after which a pair left for a bad stretch may
#: be probed again at the global estimate (the scheduler's exploration).
STRETCH = 8


@dataclass
class Estimate:
    """EMA that starts as the plain mean (step 1/n until it reaches alpha).

    With `detect`, a change is followed at once: when the mean of the last WINDOW scores
    departs by more than 3 standard errors from the EMA as it stood before them (not as it
    stands after, which they already pulled toward themselves: a drop from 0.7 to 0 was
    never detected that way, one score a cycle), the EMA restarts from that window (its
    mean, and its count). The variance is tracked slowly, so a change does not hide
    itself. A draft that stops agreeing with its verifier (other text, another model) is
    seen in WINDOW scores."""

    mean: float = 0.0
    count: float = 0.0
    var: float = 0.0
    recent: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    seen_at: float = 0.0  # the estimator's position (committed tokens) after the cycle of the last update
    returns: int = 0  # times observed again after sitting out while below the global estimate

    def weight_at(self, position: float) -> float:
        """The count discounted by the tokens committed since the last update; the half-life
        doubles with every return that found the pair still below the global estimate,
        like the probes' wait (stale_low), so a pair that keeps disagreeing ages ever slower."""
        half_life = STALE_HALF_LIFE * 2**self.returns
        return self.count * 0.5 ** (max(0.0, position - self.seen_at) / half_life)

    def update(self, x: float, alpha: float, detect: bool = False) -> None:
        before = self.mean
        self.count += 1
        step = max(1 / self.count, alpha)
        self.var += max(1 / self.count, VAR_ALPHA) * ((x - self.mean) ** 2 - self.var)
        self.mean += step * (x - self.mean)
        if detect:
            self.recent.append((x, before))
            if len(self.recent) == WINDOW:
                window = sum(score for score, _ in self.recent) / WINDOW
                reference = self.recent[0][1]  # the EMA before the window's first score
                if abs(window - reference) > max(MIN_JUMP, 3.0 * math.sqrt(self.var / WINDOW)):
                    # Restart from the window: its WINDOW scores are all that describe the new
                    # text, so they weigh as WINDOW scores (kept at the old count, six 0/1
                    # scores outweighed the global estimate 3:1, and one unlucky pair of
                    # short blocks sent a paying fp32 chain out for the rest of the request).
                    self.mean, self.count = window, float(WINDOW)
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
    def __init__(self, default: float = DEFAULT_PRIOR, shrink: float = SHRINK) -> None:
        self.default, self.shrink = default, shrink
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
        twin = AcceptanceEstimator(self.default, self.shrink)
        twin.global_, twin.fill_ = copy.deepcopy(self.global_), copy.deepcopy(self.fill_)
        return twin

    def view(self) -> AcceptanceEstimator:
        """An estimator for one of several concurrent requests, built afresh: its own
        per-request estimates, mode and position; the same global estimates and the same fill
        table (how much of what is asked a proposer gives: a property of the pair, learned
        across requests, never reset per request), so every request teaches every other; the
        same tallies of what was learned (learned())."""
        twin = AcceptanceEstimator(self.default, self.shrink)
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
        tokens of cycles a pair sat out (counted from its last observation, a pair that ran
        in every cycle of 16-token blocks looked as if it had sat out 13 tokens every cycle,
        which aged it and set the probes' backoff, two cycles into a request)."""
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
                min(len(proposals), requested) / requested, ALPHA_REQUEST)

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
        if r.count and self.position - r.seen_at >= STRETCH:
            r.count = r.weight_at(self.position)
            r.returns += 1
        r.seen_at = self.position
        self._observed.add((proposer, verifier))
        for s in scores:
            g.update(s, ALPHA_GLOBAL)
            r.update(s, ALPHA_REQUEST, detect=True)
        if r.mean >= g.mean:
            r.returns = 0

    def set_global(self, proposer: str, verifier: str, rate: float, count: float = 100.0, mode: str | None = None) -> None:
        """Seed an estimate (tests, persisted state)."""
        self.global_[(mode or self.mode, proposer, verifier)] = _seeded(rate, count)

    # Estimates --------------------------------------------------------------------
    def count(self, proposer: str, verifier: str) -> float:
        g = self.global_.get((self.mode, proposer, verifier))
        r = self.request.get((proposer, verifier))
        return (g.count if g else 0.0) + (r.weight_at(self.position) if r else 0.0)

    def observed(self, proposer: str, verifier: str) -> bool:
        return self.count(proposer, verifier) > 0

    def rate(self, proposer: str, verifier: str, names: Sequence[str] = ()) -> float:
        """Per-request estimate shrunk toward the global one (or the prior)."""
        g = self.global_.get((self.mode, proposer, verifier))
        return self._shrunk(proposer, verifier, g.mean if g and g.count else self.prior(proposer, verifier, names))

    def _shrunk(self, proposer: str, verifier: str, base: float) -> float:
        """The per-request estimate shrunk toward `base` (rate's global mean or prior)."""
        r = self.request.get((proposer, verifier))
        n = r.weight_at(self.position) if r is not None else 0.0
        if not n:
            return base
        w = n / (n + self.shrink)
        return w * r.mean + (1 - w) * base

    def cautious(self, proposer: str, verifier: str, names: Sequence[str] = (), z: float = 1.0) -> float:
        """rate() less z times its noise (see the module docstring), with the global mean
        weighed against the prior by PRIOR_WEIGHT scores (two lucky scores are no
        evidence); 0 with no global data (a prior is a guess, not a measurement)."""
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
        n_global = min(g.count, _effective_count(ALPHA_GLOBAL)) + PRIOR_WEIGHT
        base = (g.mean * (n_global - PRIOR_WEIGHT) + prior * PRIOR_WEIGHT) / n_global
        r = self.request.get((proposer, verifier))
        n = r.weight_at(self.position) if r is not None else 0.0
        w = n / (n + self.shrink)
        a = w * r.mean + (1 - w) * base if n else base
        n_request = max(min(n, _effective_count(ALPHA_REQUEST)), 1e-9)
        # Score variance: of 0/1 scores of mean a, Laplace-smoothed (a = 1 from two scores
        # must not look certain); the tracked variance once there are enough scores.
        smoothed = (a * n_global + 1) / (n_global + 2)
        var = smoothed * (1 - smoothed)
        if g.count >= MIN_VARIANCE_COUNT:
            var = min(var, g.var)
        noise = var * (w * w / n_request + (1 - w) ** 2 / n_global)
        return min(1.0, max(0.0, a + z * math.sqrt(noise)))

    def stale_low(self, proposer: str, verifier: str) -> float | None:
        """The global estimate, when this request's own estimate sits below it and was not
        observed for STRETCH committed tokens (its pair is not running), what the pair
        would do if the stretch of text that sent it out has passed. None otherwise."""
        g = self.global_.get((self.mode, proposer, verifier))
        r = self.request.get((proposer, verifier))
        # Exponential backoff: every return that found the pair still below the global
        # estimate doubles the wait, so one that keeps disagreeing is probed ever more rarely.
        if g is None or not g.count or r is None or r.mean >= g.mean \
                or self.position - r.seen_at < STRETCH * 2**r.returns:
            return None
        return g.mean

    def prior(self, proposer: str, verifier: str, names: Sequence[str] = ()) -> float:
        """Triangle bound through any observed middle model, else DEFAULT_PRIOR."""
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
        all (a router measures every pair before every cycle; one at a time, the priors'
        loops over the names were most of its work). A middle needs both its pairs observed
        (count() > 0): the observed pairs are read off the estimates held, not counted per
        pair of names."""
        observed = {(j, i) for (mode, j, i), g in self.global_.items() if mode == self.mode and g.count}
        observed.update(pair for pair, r in self.request.items() if r.weight_at(self.position))
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
        its count capped at PERSIST_CAP (so this process's own data can still move it);
        values out of range are skipped."""
        for e in estimates:
            if 0.0 <= e.mean <= 1.0 and e.count > 0:
                self.global_[(e.mode, e.proposer, e.verifier)] = _seeded(e.mean, min(e.count, PERSIST_CAP))

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
        if save_estimates(file, self.learned(), self.snapshot()):
            self.tallies.clear()

    def load(self, file: Path) -> None:
        """Seed from the file (absent, damaged or of another format: start from the priors).
        What it held is never counted as learned here: only observe_scores() tallies."""
        self.seed(read_estimates(Path(file)) or [])


@dataclass(frozen=True)
class EstimateTable:
    """Per pair (proposer, verifier): what AcceptanceEstimator.table measured."""

    rate: dict[tuple[str, str], float]
    cautious: dict[tuple[str, str], float]
    bold: dict[tuple[str, str], float]
    count: dict[tuple[str, str], float]
