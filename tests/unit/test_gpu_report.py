"""scripts/gpu_report.py: the device check's parts gathered into one result, on files shaped as
the parts write them."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_report.py"


def load():
    spec = importlib.util.spec_from_file_location("gpu_report", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(batch: int, role: str, measured: float, predicted: float, complete: bool = True) -> dict:
    return {"batch": batch, "role": role, "method": role, "complete": complete, "ratio": round(measured / predicted, 4),
            "measured": {"ms_per_token": measured}, "predicted": {"ms_per_token": predicted}}


def test_the_parts_are_gathered_with_their_limits_cuts_and_auto_speed_ups(tmp_path):
    report = load()
    out = tmp_path / "out"
    out.mkdir()
    (out / "parts.tsv").write_text("a\t100\t61\t0\nb\t75\t75\t124\nd\t100\t88\t1\n")
    (out / "environment.json").write_text(json.dumps({"date": "2026-12-07 10:00 UTC", "gpu": "NVIDIA H100 80GB HBM3",
                                                      "torch": "2.9", "cuda": "12.8", "host_cpu": "x"}))
    (out / "forced-copy.json").write_text(json.dumps({"settings": {"trace": "t"}, "runs": [
        run(1, "target alone", 6.0, 5.0), run(1, "auto", 1.5, 1.25), run(32, "target alone", 0.5, 0.4, complete=False)]}))
    (out / "tests.xml").write_text(
        '<testsuites><testsuite tests="3" failures="1" errors="0" skipped="1">'
        '<testcase name="ok"/><testcase name="bad"><failure message="x"/></testcase>'
        '<testcase name="skip"><skipped/></testcase></testsuite></testsuites>')
    path = report.main([str(out), "--results", str(tmp_path / "results")])
    result = json.loads((tmp_path / "results" / "gpu-check-2026-12-07-nvidia-h100-80gb-hbm3.json").read_text())
    assert result["parts"] == [
        {"part": "a", "limit_s": 100, "elapsed_s": 61, "exit": 0, "cut": False},
        {"part": "b", "limit_s": 75, "elapsed_s": 75, "exit": 124, "cut": True},
        {"part": "d", "limit_s": 100, "elapsed_s": 88, "exit": 1, "cut": False}]
    assert result["forced"]["copy"]["batches"]["1"]["auto_speedup"] == 4.0
    assert "auto_speedup" not in result["forced"]["copy"]["batches"]["32"]
    assert result["tests"] == {"tests": 3, "failures": 1, "errors": 0, "skipped": 1, "failed": ["bad"]}
    assert result["static_profile"] is None and result["llamacpp"] is None and result["llamacpp_profile"] is None
    text = path.read_text()
    assert "| b: the engine, trace-forced (with c: predicted) | 75 | 75 | 124 (cut) |" in text
    assert "| 1 | 6.0 / 5.0, 1.2 |  |  | 1.5 / 1.25, 1.2 | 4.0 | 3.0x |" in text
    assert "| 32 | 0.5 / 0.4, 1.25 (cut) |  |  |  |  | 1.5x |" in text
    assert "3 tests, 1 failed, 0 errors, 1 skipped: bad" in text
    assert text == (tmp_path / "results" / path.name).read_text()


def test_llama_cpp_s_outcome_and_profile_are_reported(tmp_path):
    report = load()
    (tmp_path / "gpu_llamacpp.json").write_text(json.dumps({"result": "no-nvcc", "reason": "no nvcc on PATH"}))
    assert report.markdown(report.gather(tmp_path)).endswith("## e. llama.cpp on CUDA\n\nno-nvcc: no nvcc on PATH\n")
    (tmp_path / "gpu_llamacpp.json").write_text(json.dumps({"result": "profiled", "reason": "r"}))
    (tmp_path / "llamacpp_cuda_profile.json").write_text(json.dumps({"models": {"q": {"1": 0.002, "4": 0.0025}}}))
    assert report.markdown(report.gather(tmp_path)).endswith(
        "profiled: r\n- q (ms, every layer on the GPU): 1: 2.00, 4: 2.50\n")
