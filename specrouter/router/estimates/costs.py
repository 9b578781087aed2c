"""The runtime cost model: seconds of one forward over n tokens, per model.

CostProfile holds what was measured (profiler.py measures it, profile_cache.py keeps it on
disk): a table per model of {n tokens: seconds}, interpolated linearly in n between the
measured sizes and extrapolated from the last two beyond them (a catch-up may run past
the sizes timed); batched calls have a table over B as well. OnlineCosts corrects it from
the timings of real cycles (see there): what the router predicts with.

The tables are timed after PROFILED_CONTEXT cached tokens. A forward after c cached tokens
costs more: each of its n tokens attends over c keys (compute, linear in n c, on a CPU),
and reads c tokens' K and V. Where a profile also holds a model's context table (the same
forwards timed after LONG_CONTEXT tokens), `seconds_after` interpolates linearly in c
between the two tables and extrapolates beyond. The router's predictions do not read it
(its OnlineCosts level follows a longer context as a whole); the simulator prices every
replayed forward with it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from specrouter.cascade.penalties import penalized
from specrouter.drafters import MODEL_FREE
from specrouter.router.config import DEFAULT_CONFIG, RouterConfig


#: Cached tokens before every timed forward of a profile's tables.
PROFILED_CONTEXT = 32
#: Cached tokens before every timed forward of a context table.
LONG_CONTEXT = 1024


def default_lookup_seconds() -> dict[str, float]:
    """Each model-free drafter's own estimate of one lookup (refined online)."""
    return {name: drafter.LOOKUP_SECONDS for name, drafter in MODEL_FREE.items()}


def interpolate(table: dict[int, float], n: float) -> float:
    """Linear in n between measured sizes; linear extrapolation beyond them."""
    ns = sorted(table)
    if not ns:
        raise ValueError("empty cost table")
    if len(ns) == 1:
        return table[ns[0]] * n / ns[0]
    if n <= ns[0]:
        lo, hi = ns[0], ns[1]
    elif n >= ns[-1]:
        lo, hi = ns[-2], ns[-1]
    else:
        hi = next(x for x in ns if x >= n)
        lo = max(x for x in ns if x <= n)
        if lo == hi:
            return table[lo]
    slope = (table[hi] - table[lo]) / (hi - lo)
    return max(table[lo] + slope * (n - lo), 1e-9)


def nondecreasing(table: dict[int, float]) -> dict[int, float]:
    """The least-squares fit of a cost table that does not decrease with n (isotonic
    regression, pool adjacent violators): a forward of more tokens never costs less, so
    where a measured median dips below a smaller size's (timing noise) both are replaced by
    their mean, pooled
    until the whole table is non-decreasing. A table that already is comes back unchanged."""
    blocks: list[list[float]] = []  # [sum, count] of each pooled run of sizes, in order of n
    for n in sorted(table):
        blocks.append([table[n], 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    values = [total / count for total, count in blocks for _ in range(count)]
    return dict(zip(sorted(table), values))


@dataclass
class CostProfile:
    """Seconds per forward, model name -> {n tokens: seconds}; seconds per lookup of each
    model-free drafter (whatever n); and per model, batched calls: {B sequences: {n tokens
    each: seconds of the call}}; per model, optionally, its context table: {n tokens:
    seconds} after LONG_CONTEXT cached tokens (the module docstring)."""

    tables: dict[str, dict[int, float]] = field(default_factory=dict)
    lookup_seconds: dict[str, float] = field(default_factory=default_lookup_seconds)
    batch_tables: dict[str, dict[int, dict[int, float]]] = field(default_factory=dict)
    #: Models whose batched call is a loop over the sequences: it costs B single calls.
    looped: set[str] = field(default_factory=set)
    context_tables: dict[str, dict[int, float]] = field(default_factory=dict)

    def seconds(self, name: str, n: float, batch: float = 1) -> float:
        """One call of `batch` sequences with n tokens each (n tokens of one sequence at batch 1)."""
        if name in self.lookup_seconds:
            return self.lookup_seconds[name]
        if batch == 1:
            return interpolate(self.tables[name], n)
        if name in self.looped:
            return batch * interpolate(self.tables[name], n)
        batched = self.batch_tables.get(name)
        if not batched:  # not profiled in batches: a call costs about what its tokens cost together
            return interpolate(self.tables[name], n * batch)
        per_batch = {1: interpolate(self.tables[name], n)}
        per_batch.update({b: interpolate(t, n) for b, t in batched.items()})
        return interpolate(per_batch, batch)

    def context_seconds(self, name: str, n: float, context: float) -> float:
        """What a forward of n tokens after `context` cached tokens costs beyond the same
        forward after PROFILED_CONTEXT: linear in the context between the model's table
        and its context table, never below 0; 0 for a model without a context table (and
        for a lookup)."""
        long = self.context_tables.get(name)
        if long is None or name in self.lookup_seconds:
            return 0.0
        extra = interpolate(long, n) - interpolate(self.tables[name], n)
        return max(0.0, extra * (context - PROFILED_CONTEXT) / (LONG_CONTEXT - PROFILED_CONTEXT))

    def seconds_after(self, name: str, n: float, context: float) -> float:
        """One forward of n tokens of one sequence after `context` cached tokens."""
        return self.seconds(name, n) + self.context_seconds(name, n, context)

    def as_dict(self) -> dict:
        out = {"lookup_seconds": dict(self.lookup_seconds),
               "models": {m: {str(n): s for n, s in sorted(t.items())} for m, t in self.tables.items()},
               "batched": {m: {str(b): {str(n): s for n, s in sorted(t.items())} for b, t in sorted(bt.items())}
                           for m, bt in self.batch_tables.items()}}
        if self.context_tables:
            out["context"] = {"tokens": LONG_CONTEXT, "models": {m: {str(n): s for n, s in sorted(t.items())}
                                                                 for m, t in self.context_tables.items()}}
        return out

    def copy(self) -> CostProfile:
        """An independent copy (no table shared)."""
        return CostProfile({m: dict(t) for m, t in self.tables.items()}, dict(self.lookup_seconds),
                           {m: {b: dict(t) for b, t in bt.items()} for m, bt in self.batch_tables.items()},
                           set(self.looped), {m: dict(t) for m, t in self.context_tables.items()})

    def nondecreasing(self) -> CostProfile:
        """A copy with every model's table, and every batched and context table over n,
        fitted non-decreasing in n (`nondecreasing`); lookups as they are."""
        return CostProfile({m: nondecreasing(t) for m, t in self.tables.items()}, dict(self.lookup_seconds),
                           {m: {b: nondecreasing(t) for b, t in bt.items()} for m, bt in self.batch_tables.items()},
                           set(self.looped), {m: nondecreasing(t) for m, t in self.context_tables.items()})

    @classmethod
    def from_dict(cls, data: dict) -> CostProfile:
        tables = {m: {int(n): float(s) for n, s in t.items()} for m, t in data["models"].items()}
        batched = {m: {int(b): {int(n): float(s) for n, s in t.items()} for b, t in bt.items()}
                   for m, bt in data.get("batched", {}).items()}
        lookups = default_lookup_seconds()
        if "ngram_seconds" in data:  # files written before lookups were named per drafter
            lookups["ngram"] = float(data["ngram_seconds"])
        lookups.update({k: float(v) for k, v in data.get("lookup_seconds", {}).items()})
        context = data.get("context")
        if context is not None and int(context["tokens"]) != LONG_CONTEXT:
            raise ValueError(f"its context tables were timed after {context['tokens']} tokens, not {LONG_CONTEXT}")
        contexts = {m: {int(n): float(s) for n, s in t.items()} for m, t in (context or {}).get("models", {}).items()}
        return cls(tables, lookups, batched, set(), contexts)


class OnlineCosts:
    """The profile, corrected by observed forwards: seconds(m, n) = profile_m(n) * level_m * shape_m(n).

    level_m, an EMA (cost_alpha) of observed/profiled time over every forward of m, follows
    a model that slows down or speeds up as a whole (another process on the cores, a longer
    context) at every n after a few forwards at any n; shape_m(n), a slower EMA (shape_alpha)
    per (model, n), corrects the profile's curve where cycles show it is off.

    A profile that disagrees with this machine (measured while other work ran, or on
    another one) is replaced by a table fitted to the timed forwards (refit): at once when
    one forward is more than early_disagree times faster than the profile allows (nothing
    makes a forward faster than the machine runs it); when the median of the first
    early_observed forwards is off by more than early_disagree either way; when the level
    after min_observed forwards is off by more than `disagree`. A refitted table is fitted
    again whenever a size it was not fitted to is timed (refined_table bounds the sizes not
    timed). Other moves are the level's to follow.

    It works on its own copy of the profile: a refit replaces the copy's table, never the
    caller's (a simulator prices its machine with that profile; other routers may share it).
    """

    def __init__(self, profile: CostProfile, overhead_per_forward: float = 0.0,
                 config: RouterConfig = DEFAULT_CONFIG) -> None:
        self.config = config
        self.profile = profile.copy()
        self._level: dict[str, float] = {}
        self._shape: dict[tuple[str, int], float] = {}
        #: The latest single-sequence forwards, (n tokens, seconds), per model: refined_table's data.
        self._samples: dict[str, deque[tuple[int, float]]] = {}
        #: Models whose profile was replaced by a refit in this process, with the factor the
        #: profile was off by (timed / profiled): what a RouterStore saves for the next one.
        self.refitted: dict[str, float] = {}
        #: Tables replaced so far (every refit, the first and each new size taken up): a plan
        #: made before the latest is priced by a table that no longer exists (Planner._move).
        self.refits = 0
        #: Per refitted model, the sizes its table was last fitted to (a new one refits it;
        #: none where the table is the profile scaled).
        self._fitted: dict[str, set[int]] = {}
        self.overhead_per_forward = overhead_per_forward  # Python work around each forward (feeding, bookkeeping)
        #: Python work per logits row (warp, sample, verify), per kind of sampling (row_kind).
        self._row: dict[str, float] = {}

    def _shape_at(self, name: str, n: float) -> float:
        lo = int(n)
        frac = n - lo
        s_lo = self._shape.get((name, lo), 1.0)
        return s_lo if frac < 1e-9 else (1 - frac) * s_lo + frac * self._shape.get((name, lo + 1), 1.0)

    def seconds(self, name: str, n: float, batch: float = 1) -> float:
        """One call of `batch` sequences with n tokens each (see CostProfile.seconds)."""
        if name in self.profile.lookup_seconds:
            return self.profile.lookup_seconds[name] * self._level.get(name, 1.0)
        base = self.profile.seconds(name, n, batch)
        return base * self._level.get(name, 1.0) * self._shape_at(name, n) + self.overhead_per_forward

    def observe(self, name: str, n: int, seconds: float, batch: int = 1) -> None:
        """A call of `batch` sequences feeding n tokens in all took `seconds`."""
        lookup = name in self.profile.lookup_seconds
        if name not in self.profile.tables and not lookup:
            return
        c = self.config
        if batch > 1:  # the level follows every call; shapes stay a single-sequence correction
            base = self.profile.seconds(name, max(n / batch, 1), batch)
            level = self._level.get(name, 1.0)
            self._level[name] = level + c.cost_alpha * (seconds / base - level)
            return
        base = self.profile.seconds(name, max(n, 1))
        r = seconds / base if base > 0 else 1.0
        if not lookup:
            self._samples.setdefault(name, deque(maxlen=c.cost_samples)).append((max(n, 1), seconds))
        shape = 1.0 if lookup else self._shape.get((name, n), 1.0)
        level = self._level.get(name, 1.0)
        self._level[name] = level = level + c.cost_alpha * (r / shape - level)
        if not lookup:
            self._shape[(name, n)] = shape + c.shape_alpha * (r / level - shape)
            # Shapes average 1 over the sizes seen: a common factor belongs to the level
            # (it then applies at every n), only the relative curve stays in the shapes.
            keys = [k for k in self._shape if k[0] == name]
            mean = sum(self._shape[k] for k in keys) / len(keys)
            for k in keys:
                self._shape[k] /= mean
            self._level[name] *= mean
            level = self._level[name]
            seen = len(self._samples[name])  # its first single-sequence forwards
            if name in self.refitted:
                # A table that bounds the sizes not timed takes up each new one (refined_table).
                if name in self._fitted and max(n, 1) not in self._fitted[name]:
                    self._refit(name, self.refitted[name])
            elif (fast := seconds / self._least(name, n)) < 1 / c.early_disagree:
                self._refit(name, fast)  # faster than it can be: the profile was timed busy
            elif seen == c.early_observed:
                early = float(np.median([t / self.profile.seconds(name, k) for k, t in self._samples[name]]))
                if not 1 / c.early_disagree <= early <= c.early_disagree:
                    self._refit(name, early)
            elif seen == c.min_observed and not 1 / c.disagree <= level <= c.disagree:
                self._refit(name, level)

    def _least(self, name: str, n: int) -> float:
        """The least a forward of n tokens can cost by the profile: its time at n within the
        sizes profiled; beyond them, at the largest (a forward of more tokens never costs
        less, while the profile's line extended past its sizes may overstate a long prefill)."""
        return self.profile.seconds(name, min(max(n, 1), max(self.profile.tables[name])))

    def _refit(self, name: str, level: float) -> None:
        """Replace the model's profile by refined_table: its level and shapes start over, and
        its batched and context tables (timed as wrongly) are dropped (a call then costs its
        tokens together, whatever its context)."""
        sizes = {n for n, _ in self._samples.get(name, ())}
        # A profile too fast (timed on a quiet machine that is busy now: its curve the
        # machine's own) with one size timed keeps its curve, scaled; the level and shapes follow.
        scaled = level > 1 and len(sizes) == 1
        self.profile.tables[name] = self.refined_table(name, scaled)
        if scaled:
            self._fitted.pop(name, None)
        else:
            self._fitted[name] = sizes
        self.profile.batch_tables.pop(name, None)
        self.profile.context_tables.pop(name, None)
        self._level.pop(name, None)
        for key in [k for k in self._shape if k[0] == name]:
            del self._shape[key]
        self.refitted[name] = level
        self.refits += 1

    def refined_table(self, name: str, scaled: bool = False) -> dict[int, float]:
        """The model's profiled sizes at what its latest timed forwards say, the profile's curve
        dropped (one that disagrees has the wrong shape too: a busy machine's is nearly flat):
        per size timed, the median, fitted non-decreasing in n; between sizes timed, linear;
        beyond them, bounds that err on the side of running the target alone. `scaled`: the
        profile scaled by their median ratio to it instead (_refit says when).

        A forward reads its weights once for all its tokens, so its cost per token t(n) / n
        does not grow with n, and its curve is about concave (affine at worst). Below the
        smallest size timed, m, that gives t(n) >= t(m) n / m, the bound used: the line
        through the larger sizes extended down would overstate a single forward, make
        drafting look worth it, and keep the target's single forwards (which would show it)
        from ever running. Priced at the bound, a single forward is cheap: the target runs
        alone, its single forwards are timed, and the table is refitted with them (observe:
        every new size timed refits such a table). Above the
        largest, the line through the two largest sizes extended (an upper bound of a concave
        curve: long drafts priced dear), or t(m) n / m with one size timed."""
        samples = self._samples.get(name, ())
        ns = sorted(self.profile.tables[name])
        if not samples:
            return {n: self.profile.seconds(name, n) * self._level.get(name, 1.0) for n in ns}
        timed: dict[int, list[float]] = {}
        for n, seconds in samples:
            timed.setdefault(n, []).append(seconds)
        if scaled:
            ratio = float(np.median([seconds / self.profile.seconds(name, n) for n, seconds in samples]))
            return {n: self.profile.seconds(name, n) * ratio for n in ns}
        curve = nondecreasing({n: float(np.median(t)) for n, t in timed.items()})
        smallest = min(curve)

        def at(n: int) -> float:
            if n <= smallest or len(curve) == 1:
                return curve[smallest] * n / smallest
            return interpolate(curve, n)

        return {n: at(n) for n in ns}

    def snapshot(self) -> dict:
        """The numbers predictions depend on; the router re-plans when they move enough."""
        return {**self._level, **{f"{m}@{n}": v for (m, n), v in self._shape.items()},
                "overhead": self.overhead_per_forward}

    def set_overhead(self, seconds: float) -> None:
        self.overhead_per_forward = seconds

    def row_seconds(self, kind: str) -> float:
        return self._row.get(kind, 0.0)

    def observe_rows(self, kind: str, rows: int, seconds: float) -> None:
        """The Python work on `rows` logits rows took `seconds` (an EMA per row, from the first)."""
        if rows > 0:
            per_row = seconds / rows
            old = self._row.get(kind)
            self._row[kind] = per_row if old is None else old + self.config.row_alpha * (per_row - old)



class FixedCosts(OnlineCosts):
    """OnlineCosts that observations do not move: the costs as they stood when copied (the
    profile and every correction: level, shape, rows, overhead); observe, observe_rows and
    set_overhead change nothing. A router pricing with these decides from tokens alone, never
    from clocks (router/frozen.py)."""

    @classmethod
    def of(cls, costs: OnlineCosts) -> FixedCosts:
        fixed = cls(costs.profile, costs.overhead_per_forward, costs.config)
        fixed._level, fixed._shape, fixed._row = dict(costs._level), dict(costs._shape), dict(costs._row)
        return fixed

    def observe(self, name: str, n: int, seconds: float, batch: int = 1) -> None:
        pass

    def observe_rows(self, kind: str, rows: int, seconds: float) -> None:
        pass

    def set_overhead(self, seconds: float) -> None:
        pass

def row_kind(params) -> str:
    """What a logits row's Python work depends on: greedy (an argmax), or the warp's filters;
    penalties and a grammar's mask add to either."""
    extra = "+penalties" * penalized(params) + "+grammar" * (params.grammar is not None)
    if params.greedy:
        return "greedy" + extra
    return "sampled" + "+top_k" * bool(params.top_k) + "+top_p" * (params.top_p < 1.0) + "+min_p" * (params.min_p > 0) \
        + extra
