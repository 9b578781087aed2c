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


def test_auto_against_the_best_static_chain_is_judged_per_prompt():
    # Prompt a: auto 10% faster than the best static chain; b and c: 5% slower. Its median
    # ms/token over prompts is the lowest (the prompts differ in speed), yet paired per prompt
    # it loses: the verdict follows the pairs.
    ms = {"a": {tt.AUTO: 90.0, "0.5B q4 -> 1.5B fp32": 100.0},
          "b": {tt.AUTO: 210.0, "0.5B q4 -> 1.5B fp32": 200.0},
          "c": {tt.AUTO: 84.0, "0.5B q4 -> 1.5B fp32": 80.0}}
    runs = []
    for prompt, by_method in ms.items():
        base = by_method["0.5B q4 -> 1.5B fp32"]
        for method in METHODS:
            runs.append({"dataset": "gsm8k", "prompt": prompt, "method": method, "identical": True,
                         "ms_per_token": by_method.get(method, base * 1.5)})
        runs += [{"dataset": "gsm8k", "prompt": prompt, "method": f"oracle k={k}", "ms_per_token": 50.0}
                 for k in tt.ORACLE_KS]
    v = tt.verdicts(tt.summarise(runs), runs)
    assert v["best_static_chain"] == "0.5B q4 -> 1.5B fp32"
    assert v["auto_vs_best_static_ms"] == [90.0, 100.0]
    assert v["auto_vs_best_static_speedup_median"] == round(80 / 84, 3)
    assert v["auto_beats_best_static"] is False


def test_a_resumed_run_is_extended_to_more_prompts_never_fewer():
    saved = {"settings": {"per_dataset": 3, "max_tokens": 128}, "runs": []}
    assert tt.extended(saved, 5)["settings"] == {"per_dataset": 5, "max_tokens": 128}
    assert tt.extended(saved, 2)["settings"]["per_dataset"] == 3
    assert tt.extended(saved, None) == saved and saved["settings"]["per_dataset"] == 3  # the saved one is untouched
