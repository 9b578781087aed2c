"""Which benchmark results stay, and how a text is found to cite one (benchmarks/results_index.py)."""

from __future__ import annotations

import json

import pytest

from benchmarks.results_index import _read, citations, expand, first_mention, group, kept


def test_plots_traces_and_data_go_with_the_run_whose_report_they_extend():
    assert group(["r-2026-12-01.md", "r-2026-12-01.json", "r-2026-12-01-auto-chains.png", "r-2026-12-01-x.md",
                  "r-2026-12-01-x.json", "s-2026-12-02-trace.json", "s-2026-12-02.json", "s-2026-12-02.md",
                  "g-2026-12-04-profile.json"]) == {
        "g-2026-12-04-profile": ["g-2026-12-04-profile.json"],
        "r-2026-12-01": ["r-2026-12-01-auto-chains.png", "r-2026-12-01.json", "r-2026-12-01.md"],
        "r-2026-12-01-x": ["r-2026-12-01-x.json", "r-2026-12-01-x.md"],
        "s-2026-12-02": ["s-2026-12-02-trace.json", "s-2026-12-02.json", "s-2026-12-02.md"]}


@pytest.mark.parametrize(("pattern", "names"), [
    ("a-{b,c}-d.md", ["a-b-d.md", "a-c-d.md"]), ("a[-no-host]", ["a", "a-no-host"]),
    ("s.{json,md}", ["s.json", "s.md"]), ("x-{1,2}[-y].md", ["x-1.md", "x-1-y.md", "x-2.md", "x-2-y.md"])])
def test_a_pattern_stands_for_each_of_its_names(pattern, names):
    assert expand(pattern) == names


def _run(tmp_path, stem, date, cpu="AMD EPYC", md="# Title (date)\n"):
    (tmp_path / f"{stem}.json").write_text(json.dumps({"machine": {"date": date, "cpu": cpu, "command": "c"}}))
    (tmp_path / f"{stem}.md").write_text(md)
    return _read(tmp_path, stem, [f"{stem}.json", f"{stem}.md"])


def test_a_text_cites_a_run_by_a_file_its_stem_or_a_pattern_never_by_a_longer_stem(tmp_path):
    run = _run(tmp_path, "serving-2026-12-05-epyc", "2026-12-05 06:40 UTC")
    assert first_mention(run, "see serving-2026-12-05-epyc.md") == 4
    assert first_mention(run, "runs: `serving-2026-12-05-epyc`, then") == 7
    assert first_mention(run, "in serving-2026-12-05-{epyc,xeon}.json") == 3
    assert first_mention(run, "serving-2026-12-05-epyc-majority.md and serving-2026-12-05-epyc2.md") == -1


def test_the_latest_run_per_machine_kind_stays_and_what_docs_or_kept_runs_cite(tmp_path):
    runs = [_run(tmp_path, "serving-2026-12-01", "2026-12-01 10:00 UTC"),
            _run(tmp_path, "serving-2026-12-02-epyc", "2026-12-02 10:00 UTC"),
            _run(tmp_path, "serving-2026-12-03-epyc", "2026-12-03 09:00 UTC", md="# T\nafter serving-2026-12-02-epyc\n"),
            _run(tmp_path, "serving-2026-12-03-epyc-b", "2026-12-03 08:00 UTC"),
            _run(tmp_path, "serving-2026-12-02-xeon", "2026-12-02 10:00 UTC", cpu="Intel(R) Xeon(R) Processor"),
            _run(tmp_path, "serving-2026-12-01-xeon", "2026-12-01 10:00 UTC", cpu="Intel(R) Xeon(R) Processor"),
            _run(tmp_path, "fleet-2026-11-30", "2026-11-30 10:00 UTC")]
    docs = citations(runs, {"docs/a.md": "# Serving\n\nas serving-2026-12-01.md shows\n"})
    assert docs == {"serving-2026-12-01": ['docs/a.md ("Serving")']}
    assert kept(runs, docs, {}, tmp_path) == {
        "serving-2026-12-01": "cited by the docs",
        "serving-2026-12-03-epyc": "the latest serving on AMD EPYC",
        "serving-2026-12-02-xeon": "the latest serving on Intel Xeon",
        "fleet-2026-11-30": "the latest fleet on AMD EPYC",
        "serving-2026-12-02-epyc": "cited by serving-2026-12-03-epyc"}
