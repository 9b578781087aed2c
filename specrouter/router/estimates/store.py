"""What a router learns that outlives the process: the global acceptance estimates, and the
corrected costs of models whose cached profile its timed forwards contradicted."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

from specrouter.backends.base import Backend
from specrouter.router.estimates.acceptance import AcceptanceEstimator
from specrouter.router.estimates.costs import OnlineCosts
from specrouter.router.estimates.profile_cache import save_refined


@dataclass
class RouterStore:
    """A profile folder: `acceptance.json` and the models' cost profiles (profiler.py)."""

    directory: Path
    #: The models whose cached profile this folder holds (not those given by a profile file).
    profiled: list[Backend] = field(default_factory=list)

    @property
    def estimates_file(self) -> Path:
        return self.directory / "acceptance.json"

    def save(self, acceptance: AcceptanceEstimator, costs: OnlineCosts) -> None:
        """The global estimates, merged into the file with what other processes saved there
        (AcceptanceEstimator.save), and the refined table of every profiled model whose timed
        forwards disagree with its profile (profiler.save_refined: the last table written
        wins), with a warning each."""
        acceptance.save(self.estimates_file)
        for name, factor in save_refined(costs, self.profiled, self.directory).items():
            warnings.warn(f"the cached profile of {name} was {1 / factor:.2g}x what its timed forwards took: "
                          "saved the corrected one", stacklevel=3)
