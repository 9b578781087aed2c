"""Global acceptance estimates as they leave a process: PairEstimate, pooling by counts, and
the file (`acceptance.json` of a profile folder) that carries them to the next process.

Pooling (pool_estimates): per (mode, proposer, verifier), counts add and the mean is the
count-weighted mean, the count then capped at PERSIST_CAP. The cap is what lets the pooled
mean follow change: under it, pooling is the exact mean of every score pooled; past it, the
table on hand weighs as PERSIST_CAP scores against each new contribution, a recency weighting
like the estimates' own EMA. Without it a file's count would grow with every run, its mean
would become the mean of all history, and no run could move it.

Saving (save_estimates) merges, it never overwrites: under the file's inter-process lock
(persist.py), the table on disk NOW is pooled with what THIS process observed since it
loaded the file, its `learned` table (AcceptanceEstimator.learned: the plain mean and the
number of its own scores per pair: each score weighs one, as the counts pooled say; the
in-memory estimate's EMA weighs recent scores more, which a count cannot express), and
written back atomically. What the process loaded is
not added again: it is already on disk, and would count twice. So two processes that
loaded the same file and exit together lose nothing: whichever saves second pools its
scores onto the first one's result. Worked example: the file holds a pair at mean 0.5 over
8 scores; one process adds 4 scores of mean 1.0: (0.5 * 8 + 1.0 * 4) / 12 = 2/3 over 12;
another, which loaded the same file, adds 4 scores of mean 0.0: (2/3 * 12 + 0.0 * 4) / 16 =
0.5 over 16, the mean of all 16 scores (below the cap, in either order).

A file that holds no table this version reads (absent, damaged, another format) is replaced
by `whole`, everything the process knows (AcceptanceEstimator.snapshot(): what it loaded,
which nothing else holds now, and what it learned), its counts capped alike; never an
error: losing the estimates only costs a slower start.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from specrouter.router.config import DEFAULT_CONFIG
from specrouter.router.estimates.persist import locked, write_atomic

#: The cap of a pooled or loaded count unless one is given (RouterConfig.persist_cap).
_CAP = DEFAULT_CONFIG.persist_cap

#: Version of the saved estimates: 2 = blocks scored up to their first rejection.
ESTIMATES_FORMAT = 2


@dataclass(frozen=True)
class PairEstimate:
    """One global estimate as it leaves the process: the pair's rate under one mode
    ("greedy" or "sampled") and the scores it rests on."""

    mode: str
    proposer: str
    verifier: str
    mean: float
    count: float

    @property
    def key(self) -> str:
        return f"{self.mode}|{self.proposer}|{self.verifier}"


def pool_estimates(tables: Iterable[Iterable[PairEstimate]], cap: float = _CAP) -> list[PairEstimate]:
    """The count-weighted mean per (mode, proposer, verifier) over the tables, its count the
    sum capped at `cap` (see the module docstring; math.inf: the plain sum), in key order.
    Entries with no count are left out."""
    sums: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for table in tables:
        for e in table:
            if e.count > 0:
                acc = sums[(e.mode, e.proposer, e.verifier)]
                acc[0] += e.mean * e.count
                acc[1] += e.count
    return [PairEstimate(*key, total / count, min(count, cap)) for key, (total, count) in sorted(sums.items())]


def read_estimates(file: Path, cap: float = _CAP) -> list[PairEstimate] | None:
    """The table the file holds, its counts capped at `cap` (a file is weighed as at most
    that many scores, whoever wrote it); None when it holds none this version reads
    (absent, unreadable, damaged, another format). Entries out of range (a mean outside
    [0, 1], a count not > 0) are left out."""
    try:
        data = json.loads(Path(file).read_text())
        if not isinstance(data, dict) or data.get("format") != ESTIMATES_FORMAT:
            return None  # scored another way (1: every position of a block), or not ours
        table = [PairEstimate(*key.split("|"), float(mean), float(count))
                 for key, (mean, count) in data["estimates"].items()]
    except (OSError, ValueError, TypeError, AttributeError, KeyError):
        return None
    return [replace(e, count=min(e.count, cap)) for e in table if 0.0 <= e.mean <= 1.0 and e.count > 0]


def save_estimates(file: Path, learned: Iterable[PairEstimate], whole: Iterable[PairEstimate],
                   cap: float = _CAP) -> bool:
    """Merge `learned` into the file under its lock, or replace a file with no readable table
    by `whole` (see the module docstring), counts capped at `cap`. Returns whether the file was written (False:
    the folder cannot be written or the lock was not had in time; nothing changed)."""
    try:
        with locked(file):
            on_disk = read_estimates(file, cap)
            table = pool_estimates([whole] if on_disk is None else [on_disk, learned], cap)
            data = {"format": ESTIMATES_FORMAT, "estimates": {e.key: [e.mean, e.count] for e in table}}
            write_atomic(file, json.dumps(data, indent=1))
    except OSError:
        return False
    return True
