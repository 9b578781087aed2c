"""Where a benchmark's result goes, and the one way it is written: `<stem>.json` (the
measurements, with what they ran on) and `<stem>.md` (the report, also printed)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

#: The committed results (benchmarks/results/README.md indexes them).
RESULTS = Path(__file__).parent / "results"

#: What every result records of its run, under "machine" (benchmarks.machine.machine_info).
RECORDED = ("date", "cpu", "command")


def save_json(result: dict, file: Path) -> Path:
    """The result as indented JSON at `file` (its folder made if missing): the final write, or
    a checkpoint of a run still going."""
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(result, indent=1, default=str))
    return file


def write_result(result: dict, markdown: Callable[[dict], str], *, out: Path, stem: str) -> Path:
    """`out/<stem>.json`, then `out/<stem>.md` = markdown(result), which is printed too; returns
    the markdown's path. The JSON is written first, so the measurements survive a report that
    fails. A result must record its date, CPU and exact command (RECORDED, under "machine"):
    one that does not is refused (ValueError) before anything is written."""
    machine = result.get("machine") or {}
    if missing := [key for key in RECORDED if not machine.get(key)]:
        raise ValueError(f"a result must record {', '.join(RECORDED)} under 'machine': missing {', '.join(missing)}")
    save_json(result, out / f"{stem}.json")
    report = markdown(result)
    md = out / f"{stem}.md"
    md.write_text(report)
    print(report)
    return md
