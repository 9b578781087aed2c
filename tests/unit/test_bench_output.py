"""The one write_result, and the command a result records."""

from __future__ import annotations

import json
import sys

import pytest

from benchmarks.machine import command, machine_info
from benchmarks.output import write_result

MACHINE = {"date": "2026-12-06 10:00 UTC", "cpu": "AMD EPYC", "command": "python -m benchmarks fleet"}


def test_a_result_is_its_json_and_its_printed_report(tmp_path, capsys):
    result = {"machine": MACHINE, "rows": [1, 2]}
    md = write_result(result, lambda r: f"# rows {r['rows']}\n", out=tmp_path / "new", stem="fleet-x")
    assert md == tmp_path / "new" / "fleet-x.md"
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["fleet-x.json", "fleet-x.md"]
    assert json.loads((tmp_path / "new" / "fleet-x.json").read_text()) == result
    assert md.read_text() == "# rows [1, 2]\n"
    assert capsys.readouterr().out == "# rows [1, 2]\n\n"


def test_the_json_is_written_before_a_failing_report(tmp_path):
    def broken(result):
        raise KeyError("plot")

    with pytest.raises(KeyError):
        write_result({"machine": MACHINE}, broken, out=tmp_path, stem="s")
    assert json.loads((tmp_path / "s.json").read_text()) == {"machine": MACHINE}
    assert not (tmp_path / "s.md").exists()


@pytest.mark.parametrize("machine", [{}, {**MACHINE, "command": ""}, {k: v for k, v in MACHINE.items() if k != "cpu"}])
def test_a_result_that_does_not_record_its_run_is_refused(tmp_path, machine):
    with pytest.raises(ValueError, match="a result must record date, cpu, command under 'machine': missing"):
        write_result({"machine": machine}, str, out=tmp_path, stem="s")
    assert list(tmp_path.iterdir()) == []


def test_the_command_names_the_harness_or_the_module_and_quotes_arguments():
    assert command(["/x/benchmarks/__main__.py", "copy-drafting", "--methods", "auto (suffix)"], "/v/bin/python") == \
        "python -m benchmarks copy-drafting --methods 'auto (suffix)'"
    assert command(["/x/benchmarks/chains.py", "--auto-only"], "/v/bin/python3") == \
        "python3 -m benchmarks.chains --auto-only"


def test_machine_info_records_the_command_that_runs_it_again(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/x/benchmarks/copy_drafting.py", "--methods", "auto (suffix)"])
    monkeypatch.setattr(sys, "executable", "/v/bin/python")
    assert machine_info()["command"] == "python -m benchmarks.copy_drafting --methods 'auto (suffix)'"
