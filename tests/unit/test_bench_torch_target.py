"""The torch-target benchmark's bookkeeping: which prompts a resumed run skips, and the report of a run in parts."""

import json
from pathlib import Path

from benchmarks import torch_target as tt

SAVED = Path(tt.__file__).parent / "results" / "torch-target-2026-11-30.json"
METHODS = [tt.ALONE, tt.HF, *tt.CHAINS, tt.AUTO]


def _runs(prompt: str, methods) -> list[dict]:
    return [{"dataset": "gsm8k", "prompt": prompt, "method": m, "ms_per_token": 100.0} for m in methods]


def test_a_resumed_run_skips_only_prompts_with_every_method_and_oracle():
    oracles = [f"oracle k={k}" for k in tt.ORACLE_KS]
    runs = _runs("a", METHODS + oracles) + _runs("b", METHODS + oracles[:-1]) + _runs("c", METHODS[:-1] + oracles)
    assert tt.measured_prompts(runs, METHODS) == {("gsm8k", "a")}


def test_the_report_of_a_resumed_run_names_each_part(tmp_path):
    saved = json.loads(SAVED.read_text())
    first = tt._first_part(saved)
    assert first["prompts"] == len({(r["dataset"], r["prompt"]) for r in saved["runs"]})
    second = {"date": "2026-12-01T10:00:00", "command": "python -m benchmarks.torch_target --resume x.json",
              "phase_seconds": {"setup": 100.0, "main": 900.0}, "profile_ms": saved["profile_ms"], "prompts": 2}
    tt.write_report({**saved, "parts": [first, second]}, tmp_path)
    md = (tmp_path / f"{tt._stem(saved)}.md").read_text()
    assert ("Resumed 2026-12-01T10:00:00: `python -m benchmarks.torch_target --resume x.json`, "
            "for the 2 prompts not measured before.") in md
    assert md.count("Resumed") == 1
    # A result written before parts existed renders as before.
    tt.write_report(saved, tmp_path)
    assert "Resumed" not in (tmp_path / f"{tt._stem(saved)}.md").read_text()
