"""Speculation counts per level and draft position: the one type the cascade counts into, a
request's result carries, and the CLI's JSON, the server's Prometheus exporter and the
fleet's read.

Shaped like vLLM v1's spec-decode statistics. Per level: the drafts it handed to the level
above (blocks of one or more tokens), the tokens in them, the tokens the level above accepted,
and per draft position j the drafts whose first j + 1 tokens were all accepted (vLLM's
num_accepted_tokens_per_pos); beside those, what the level cost: its model calls and the
seconds inside them (a model-free level makes no calls; its lookup time counts as seconds).

Counts are cumulative. `+` sums two counts of one level (two requests, two replicas),
`since` is what was counted after an earlier copy (what a scheduler step added), and the
rates are properties, derived when read. A chain of several levels is a SpecStats: the
LevelStats of each level by name, with the same sums. Exporters live where they export to
(server/metrics.py writes Prometheus families); this module imports nothing of the package.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass
class LevelStats:
    """One level's counts (cumulative)."""

    name: str
    proposed: int = 0  # tokens this level handed to the level above
    accepted: int = 0  # of those, how many the level above accepted
    forwards: int = 0  # model calls (0 for a model-free level)
    seconds: float = 0.0  # wall time inside this level's calls (a lookup's: its lookups)
    drafts: int = 0  # blocks of one or more tokens it handed up
    #: [j]: the drafts whose first j + 1 tokens were accepted (so it never increases with j,
    #: and its sum is `accepted`).
    accepted_per_position: list[int] = field(default_factory=list)

    # Observations -------------------------------------------------------------------------
    def observe_draft(self, proposed: int, accepted: int) -> None:
        """The level above accepted the first `accepted` of `proposed` tokens this level
        handed it in one block (a block of no tokens is no draft)."""
        if not 0 <= accepted <= proposed:
            raise ValueError(f"a draft of {proposed} tokens cannot have {accepted} accepted")
        self.proposed += proposed
        self.accepted += accepted
        self.drafts += proposed > 0
        _add_positions(self.accepted_per_position, [1] * accepted)

    def observe_forward(self, seconds: float) -> None:
        """One call of this level's model took `seconds`."""
        self.forwards += 1
        self.seconds += seconds

    # Rates --------------------------------------------------------------------------------
    @property
    def acceptance(self) -> float | None:
        """Accepted of proposed tokens (None: none proposed)."""
        return self.accepted / self.proposed if self.proposed else None

    @property
    def accepted_per_draft(self) -> float | None:
        """Mean accepted tokens per draft (vLLM's mean acceptance length less the one token
        the level above adds to every block); None: no draft."""
        return self.accepted / self.drafts if self.drafts else None

    @property
    def position_acceptance(self) -> list[float]:
        """[j]: the share of drafts whose first j + 1 tokens were accepted (vLLM's
        per-position acceptance rate; a draft shorter than j + 1 tokens counts as not
        accepted there)."""
        return [n / self.drafts for n in self.accepted_per_position] if self.drafts else []

    @property
    def seconds_per_forward(self) -> float | None:
        return self.seconds / self.forwards if self.forwards else None

    # Sums ---------------------------------------------------------------------------------
    def __add__(self, other: LevelStats) -> LevelStats:
        """The counts of both (of the same level)."""
        self._same_level(other)
        positions = list(self.accepted_per_position)
        _add_positions(positions, other.accepted_per_position)
        return LevelStats(self.name, self.proposed + other.proposed, self.accepted + other.accepted,
                          self.forwards + other.forwards, self.seconds + other.seconds,
                          self.drafts + other.drafts, positions)

    def since(self, before: LevelStats) -> LevelStats:
        """What was counted after `before` (an earlier copy of these counts)."""
        self._same_level(before)
        earlier = before.accepted_per_position
        positions = [n - (earlier[j] if j < len(earlier) else 0) for j, n in enumerate(self.accepted_per_position)]
        return LevelStats(self.name, self.proposed - before.proposed, self.accepted - before.accepted,
                          self.forwards - before.forwards, self.seconds - before.seconds,
                          self.drafts - before.drafts, positions)

    def copy(self) -> LevelStats:
        return LevelStats(self.name, self.proposed, self.accepted, self.forwards, self.seconds, self.drafts,
                          list(self.accepted_per_position))

    def _same_level(self, other: LevelStats) -> None:
        if other.name != self.name:
            raise ValueError(f"counts of level {other.name!r} cannot join those of {self.name!r}")

    def as_dict(self) -> dict:
        """The level's entry in a result's JSON (the CLI's --json)."""
        return {
            "name": self.name,
            "proposed": self.proposed,
            "accepted": self.accepted,
            "acceptance": self.acceptance,
            "forwards": self.forwards,
            "seconds": round(self.seconds, 6),
            "drafts": self.drafts,
            "accepted_per_position": list(self.accepted_per_position),
        }


@dataclass
class SpecStats(Mapping[str, LevelStats]):
    """LevelStats per level name (a read-only mapping), in the order the levels first
    appeared: what a request's chains did (a level counts once, over every chain it ran in),
    or a server's, or a replica's requests together."""

    levels: dict[str, LevelStats] = field(default_factory=dict)

    @classmethod
    def of(cls, levels: Iterable[LevelStats]) -> SpecStats:
        """The sum of `levels` per name."""
        out = cls()
        for stats in levels:
            out.levels[stats.name] = out.levels[stats.name] + stats if stats.name in out.levels else stats.copy()
        return out

    def level(self, name: str) -> LevelStats:
        """The counts of level `name`, made empty if it has none yet (the ones counted into)."""
        return self.levels.setdefault(name, LevelStats(name))

    def __getitem__(self, name: str) -> LevelStats:
        return self.levels[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.levels)

    def __len__(self) -> int:
        return len(self.levels)

    def __add__(self, other: SpecStats) -> SpecStats:
        return SpecStats.of([*self.values(), *other.values()])

    def since(self, before: SpecStats) -> SpecStats:
        """Per level, what was counted after `before` (a level new since then: all of it)."""
        return SpecStats({name: s.since(before[name]) if name in before else s.copy()
                          for name, s in self.levels.items()})

    def copy(self) -> SpecStats:
        return SpecStats({name: s.copy() for name, s in self.levels.items()})


def _add_positions(counts: list[int], more: Sequence[int]) -> None:
    if len(counts) < len(more):
        counts.extend([0] * (len(more) - len(counts)))
    for j, n in enumerate(more):
        counts[j] += n
