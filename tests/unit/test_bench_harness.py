"""`python -m benchmarks`: its listing, its dispatch, and that every benchmark is in it."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

import benchmarks
from benchmarks.__main__ import main
from benchmarks.registry import BENCHMARKS, find

MODULES = Path(benchmarks.__file__).parent
#: Runnable modules that are not benchmarks, with why.
TOOLS = {"__main__": "the harness itself", "results_index": "writes the results' index; measures nothing"}


def test_every_module_with_a_main_is_listed_once_and_nothing_else():
    runnable = {p.stem for p in MODULES.glob("*.py") if p.stem not in TOOLS and any(
        isinstance(node, ast.FunctionDef) and node.name == "main" for node in ast.parse(p.read_text()).body)}
    assert sorted(b.module for b in BENCHMARKS) == sorted(runnable)
    assert len({b.name for b in BENCHMARKS}) == len(BENCHMARKS)


def test_the_listing_is_one_line_per_benchmark(capsys):
    main([])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("usage: python -m benchmarks NAME [options]")
    width = max(len(b.name) for b in BENCHMARKS)
    assert lines[2:] == [f"  {b.name:<{width}}  {b.summary}" for b in BENCHMARKS]


@pytest.mark.parametrize("spelling", ["copy-drafting", "copy_drafting", "benchmarks.copy_drafting"])
def test_a_benchmark_is_found_by_its_name_or_its_module(spelling):
    assert find(spelling).module == "copy_drafting"


def test_an_unknown_name_is_refused_with_the_listing(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["no-such-bench"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("no benchmark 'no-such-bench'")
    assert all(f"  {b.name} " in err for b in BENCHMARKS)


@pytest.mark.parametrize("bench", BENCHMARKS, ids=lambda b: b.name)
def test_every_benchmark_has_the_shared_options_in_its_help(bench, capsys):
    with pytest.raises(SystemExit) as stopped:
        main([bench.name, "--help"])
    assert stopped.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m benchmarks {bench.name} [-h] [--out DIR] [--stem NAME]")


def test_the_harness_runs_a_benchmark_with_its_options_and_records_the_command(tmp_path, monkeypatch, capsys):
    argv = ["suffix-memory", "--budget", "65536", "--out", str(tmp_path), "--stem", "run"]
    monkeypatch.setattr(sys, "argv", [str(MODULES / "__main__.py"), *argv])
    main(argv)
    result = json.loads((tmp_path / "run.json").read_text())
    assert result["budget"] == 65536 and result["held"] == 65536
    assert result["machine"]["command"].endswith(f"-m benchmarks suffix-memory --budget 65536 --out {tmp_path} --stem run")
    assert capsys.readouterr().out == (tmp_path / "run.md").read_text() + "\n"  # the report, printed
