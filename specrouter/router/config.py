"""RouterConfig: every number that tunes the router, in one frozen, validated value.

Each field's description is its meaning, its unit first; the reasons behind the defaults are
in docs/router.md. A config is built from keyword arguments (validated: types are strict, an
int is no float and a list no tuple), from a mapping (`from_dict`: a TOML table, unknown keys
refused by name) or from a TOML file (`load`). Components take the whole config and read the
fields of their area (the prefixes group them: pacing_*, stop_*, ...).

What is not here: what a profile file holds (the sizes timed and the contexts they are timed
after, profiler.py and costs.py: a profile's meaning, not a tuning) and the formats and locks
of the files the router writes.
"""

from __future__ import annotations

import dataclasses
import difflib
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field, ValidationError
from pydantic.dataclasses import dataclass

from specrouter.errors import InvalidParameterError

_MODEL_GRID = (*range(1, 9), 11, 15, 23)


@dataclass(frozen=True, config=ConfigDict(extra="forbid", strict=True))
class RouterConfig:
    # Choice: candidates, draft lengths, caution, hysteresis ---------------------------------
    draft_grid: tuple[int, ...] = Field(_MODEL_GRID, description="tokens: the draft lengths searched for a model "
                                        "level; the longest caps a draft that stops on its confidence")
    lookup_grid: tuple[int, ...] = Field((*_MODEL_GRID, 31, 47, 63), description="tokens: the draft lengths searched "
                                         "for the model-free level, up to its drafter's longest")
    hysteresis: float = Field(0.05, ge=0, lt=1, description="fraction of seconds per token: how much faster a chain "
                              "of another family must be to replace the current one")
    caution_z: float = Field(1.0, ge=0, description="standard errors: the cautious and bold acceptance lie this far "
                             "below and above the estimate (the guards to enter and to leave a chain)")
    max_exhaustive: int = Field(100, ge=1, description="length combinations: a chain with at most this many is "
                                "searched whole, a deeper one by coordinate descent")
    max_decisions: int = Field(200, ge=0, description="decisions: recorded per request for --explain (the first, "
                               "every switch and probe)")
    # Probes ----------------------------------------------------------------------------------
    explore_fraction: float = Field(0.03, ge=0, lt=1, description="fraction of generation time: what probes may cost "
                                    "beyond the chosen chains, over every request of the router")
    explore_bonus: float = Field(0.5, ge=0, description="acceptance: a barely observed pair's optimism, the estimate "
                                 "plus this / sqrt(observations + 1)")
    optimistic_cap: float = Field(0.98, gt=0, le=1, description="acceptance: no optimistic rate above this")
    confident: float = Field(48.0, ge=0, description="observations: a pair seen this often is no longer probed")
    # Re-planning -----------------------------------------------------------------------------
    plan_every: int = Field(4, ge=1, description="cycles: a small move of the inputs re-plans at most this often")
    big_move: float = Field(2.0, ge=1, description="tolerances: a move of the inputs this large re-plans at once")
    full_search_every: int = Field(16, ge=1, description="re-plans: between full searches of the draft lengths "
                                   "(local searches around the last optimum otherwise)")
    rate_tolerance: float = Field(0.04, gt=0, description="acceptance: a move of a pair's rate this large is one "
                                  "tolerance")
    fill_tolerance: float = Field(0.1, gt=0, description="share of the proposals asked: a move of a proposer's fill "
                                  "this large is one tolerance")
    cost_tolerance: float = Field(0.05, gt=0, description="fraction of the target's cost: a move of a model's cost "
                                  "this large is one tolerance")
    lookup_cost_tolerance: float = Field(2e-4, gt=0, description="seconds: a move of a lookup's cost this large is "
                                         "one tolerance")
    overhead_tolerance: float = Field(5e-4, gt=0, description="seconds per forward: a move of the overhead this "
                                      "large is one tolerance")
    row_tolerance: float = Field(2e-4, gt=0, description="seconds per logits row: a move of the rows' cost this large "
                                 "is one tolerance")
    # Pacing ----------------------------------------------------------------------------------
    pacing_fraction: float = Field(0.02, ge=0, lt=1, description="fraction of generation time: what the router's "
                                   "choices may take per kind of cycle (0: every choice deliberates)")
    pacing_agreed: int = Field(3, ge=0, description="doublings: the span of a kind whose deliberations keep choosing "
                               "the target alone by the margin grows up to 2^this times")
    pacing_margin: float = Field(0.1, ge=0, description="fraction: every other chain scores at least 1 + this times "
                                 "the target alone's for a choice of it to be firm")
    pacing_stale: int = Field(4, ge=1, description="spans: a decision older than this many, in the router's choices, "
                              "is made again")
    pacing_alpha: float = Field(0.1, gt=0, le=1, description="weight: of a new timing in the averages of a choice's "
                                "and a cycle's seconds")
    # Acceptance estimates --------------------------------------------------------------------
    default_prior: float = Field(0.4, ge=0, le=1, description="acceptance: of a pair never observed and with no "
                                 "triangle bound")
    shrink: float = Field(8.0, gt=0, description="positions: a request's own data weighs as much as the global "
                          "estimate after this many")
    alpha_request: float = Field(0.1, gt=0, le=1, description="weight per position: of a score in a request's own "
                                 "estimate")
    alpha_global: float = Field(0.01, gt=0, le=1, description="weight per position: of a score in the global "
                                "estimate")
    change_window: int = Field(6, ge=2, description="positions: the window whose departure restarts a request's "
                               "estimate")
    change_z: float = Field(3.0, gt=0, description="standard errors: the departure of the window that restarts it")
    min_jump: float = Field(0.15, ge=0, le=1, description="acceptance: the least departure that restarts it")
    variance_alpha: float = Field(0.02, gt=0, le=1, description="weight per score: of a score in an estimate's "
                                  "variance")
    min_variance_count: int = Field(10, ge=1, description="scores: after this many a global estimate's variance "
                                    "replaces the bound a (1 - a)")
    prior_weight: float = Field(4.0, ge=0, description="scores at the prior: what a global mean is weighed against "
                                "in the cautious and bold rates")
    stale_half_life: float = Field(32.0, gt=0, description="committed tokens: an estimate not observed for this many "
                                   "weighs half as much")
    stretch: int = Field(8, ge=1, description="committed tokens: a pair left for a bad stretch is probed again at its "
                         "global rate after this many")
    persist_cap: float = Field(200.0, gt=0, description="scores: a loaded, seeded or pooled global count is capped "
                               "here, so new data still moves it")
    # Costs -----------------------------------------------------------------------------------
    cost_alpha: float = Field(0.3, gt=0, le=1, description="weight per forward: of a timing in a model's cost level")
    shape_alpha: float = Field(0.1, gt=0, le=1, description="weight per forward: of a timing in the cost curve's "
                               "correction at its size")
    row_alpha: float = Field(0.1, gt=0, le=1, description="weight per timing: of the Python work per logits row")
    overhead_alpha: float = Field(0.2, gt=0, le=1, description="weight per cycle: of the overhead per forward")
    disagree: float = Field(2.0, gt=1, description="factor: a profile this far off after min_observed forwards is "
                            "refitted")
    min_observed: int = Field(8, ge=1, description="forwards: when disagree is checked")
    early_disagree: float = Field(4.0, gt=1, description="factor: a profile this far off after early_observed forwards "
                                  "(or one forward this much faster) is refitted")
    early_observed: int = Field(3, ge=1, description="forwards: when early_disagree is checked")
    cost_samples: int = Field(64, ge=1, description="forwards: the latest timings kept per model for a refit")
    # Draft stop ------------------------------------------------------------------------------
    stop_edges: tuple[float, ...] = Field((0.3, 0.5, 0.7, 0.9, 0.99), description="confidence: upper edges of the "
                                          "draft stop's bins (the last bin ends at 1)")
    stop_centers: tuple[float, ...] = Field((0.2, 0.4, 0.6, 0.8, 0.95, 0.995), description="acceptance: where each "
                                            "bin's calibration starts (one more than the edges)")
    stop_prior_count: float = Field(4.0, gt=0, description="scores: what a bin's starting value weighs")
    stop_alpha: float = Field(0.05, gt=0, le=1, description="weight per score: of a verified token in its bin")
    # Answer lengths --------------------------------------------------------------------------
    default_horizon: int = Field(256, ge=1, description="tokens: assumed to follow when no recent answer ran past "
                                 "the current length")
    answers_window: int = Field(64, ge=1, description="answers: finished answers whose lengths are remembered")
    # Profiling -------------------------------------------------------------------------------
    profile_repeats: int = Field(3, ge=1, description="forwards: timed per size when a model is profiled")
    non_physical_drop: float = Field(0.75, gt=0, le=1, description="fraction: a size cheaper than this share of the "
                                     "smallest size's cost makes a profile not physical")
    repeat_spread: float = Field(1.5, gt=1, description="factor: repeats of one size further apart (median over "
                                 "sizes) make a profile unsteady")
    busy_share: float = Field(0.25, ge=0, le=1, description="fraction of the cores: other processes using more "
                              "while a profile is timed make it busy")
    min_timed: float = Field(1e-3, ge=0, description="seconds: sizes timed faster say nothing about steadiness")
    min_span: float = Field(1.0, ge=0, description="seconds: a shorter profiling span gives no busy verdict")

    def __post_init__(self) -> None:
        for name in ("draft_grid", "lookup_grid"):
            grid = getattr(self, name)
            if not grid or any(k < 1 for k in grid) or list(grid) != sorted(set(grid)):
                raise ValueError(f"{name} must be increasing draft lengths >= 1, got {list(grid)}")
        edges = self.stop_edges
        if not edges or list(edges) != sorted(set(edges)) or not 0 < edges[0] or edges[-1] >= 1:
            raise ValueError(f"stop_edges must be increasing confidences in (0, 1), got {list(edges)}")
        if len(self.stop_centers) != len(edges) + 1 or any(not 0 <= c <= 1 for c in self.stop_centers):
            raise ValueError(f"stop_centers must be {len(edges) + 1} acceptances in [0, 1] (one per bin), "
                             f"got {list(self.stop_centers)}")

    # Building --------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "router config") -> RouterConfig:
        """A config of the defaults and `data`'s values (a TOML table: lists are taken as
        tuples); raises InvalidParameterError naming the key and `source` for a key that is
        not a field, a value of the wrong type or out of its range."""
        if not isinstance(data, Mapping):
            raise InvalidParameterError(f"invalid {source}: expected a table of keys, got {type(data).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        for key in data:
            if key not in names:
                close = difflib.get_close_matches(str(key), names, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise InvalidParameterError(f"invalid {source}: unknown key {key!r}{hint}; "
                                            "the keys are in docs/router.md")
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        try:
            return cls(**values)
        except ValidationError as exc:
            problems = "; ".join((f"{'.'.join(map(str, e['loc']))}: " if e["loc"] else "") + _message(e)
                                 for e in exc.errors())
            raise InvalidParameterError(f"invalid {source}: {problems}") from None

    @classmethod
    def load(cls, file: Path) -> RouterConfig:
        """A TOML file of top-level keys (from_dict's)."""
        try:
            data = tomllib.loads(Path(file).read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise InvalidParameterError(f"cannot read the router config {file}: {exc}") from None
        return cls.from_dict(data, f"router config {file}")

    def replace(self, **changes: Any) -> RouterConfig:
        """This config with `changes` (validated as any config)."""
        return dataclasses.replace(self, **changes)

    # Showing ---------------------------------------------------------------------------------
    def changed(self) -> dict[str, Any]:
        """The fields whose values differ from the defaults, in field order."""
        return {key: getattr(self, key) for key, default, _ in self.describe() if getattr(self, key) != default}

    def shown(self) -> str:
        """changed() as TOML lines would say it, in one line (--explain)."""
        changed = self.changed()
        if not changed:
            return "the defaults (docs/router.md)"
        return (", ".join(f"{key} = {_toml(value)}" for key, value in changed.items())
                + "; every other key at its default (docs/router.md)")

    @classmethod
    def describe(cls) -> list[tuple[str, Any, str]]:
        """(key, default, meaning) of every field, in order: the reference docs/router.md lists."""
        fields = cls.__pydantic_fields__  # type: ignore[attr-defined]
        return [(f.name, fields[f.name].default, fields[f.name].description) for f in dataclasses.fields(cls)]


def _toml(value: Any) -> str:
    """A value as a TOML file writes it."""
    return "[" + ", ".join(map(str, value)) + "]" if isinstance(value, tuple) else str(value)


def _message(error: dict) -> str:
    """pydantic's message, with the value it refused (a field's, not the whole config's)."""
    message = error["msg"].removeprefix("Value error, ")
    return f"{message} (got {error['input']!r})" if error["loc"] else message


#: The defaults.
DEFAULT_CONFIG = RouterConfig()
