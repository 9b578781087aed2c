"""The benchmarks' one parser: the options they share, with each benchmark's defaults."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks.args import benchmark_parser, int_list, result_stem
from benchmarks.output import RESULTS

RESULT = {"machine": {"date": "2026-12-03 11:08 UTC"}}


def test_every_parser_has_out_and_stem_and_only_the_options_asked_for():
    ap = benchmark_parser("b", "doc")
    args = ap.parse_args([])
    assert vars(args) == {"out": RESULTS, "stem": None}
    with pytest.raises(SystemExit):
        ap.parse_args(["--max-tokens", "3"])


def test_the_shared_options_take_each_benchmarks_defaults():
    ap = benchmark_parser("b", "doc", per=("workload", 10), max_tokens=256, repeats=3, concurrency="1,4,8",
                          trace=Path("t.json"), sweep=True, render=True, router_dir="help")
    assert vars(ap.parse_args([])) == {
        "out": RESULTS, "stem": None, "per_group": 10, "max_tokens": 256, "repeats": 3, "concurrency": [1, 4, 8],
        "trace": Path("t.json"), "sweep_per_dataset": 1, "sweep_tokens": 48, "render": None, "router_dir": None}
    args = ap.parse_args(["--per-workload", "2", "--max-tokens", "16", "--concurrency", "2", "--render", "r.json",
                          "--router-dir", "d", "--out", "o", "--stem", "s"])
    assert (args.per_group, args.max_tokens, args.concurrency, args.render, args.router_dir, args.out, args.stem) == (
        2, 16, [2], Path("r.json"), Path("d"), Path("o"), "s")


@pytest.mark.parametrize("word", ["dataset", "workload", "set", "group"])
def test_prompts_per_group_is_one_option_under_every_word(word):
    ap = benchmark_parser("b", "doc", per=("dataset", 10))
    assert ap.parse_args([f"--per-{word}", "3"]).per_group == 3


def test_the_help_shows_the_benchmarks_own_word_only():
    help_text = benchmark_parser("copy-drafting", "The doc.", per=("workload", 10)).format_help()
    assert help_text.split()[:9] == ["usage:", "python", "-m", "benchmarks", "copy-drafting", "[-h]",
                                      "[--out", "DIR]", "[--stem"]
    assert "[--per-workload N]" in help_text
    assert "--per-dataset" not in help_text and "--per-set" not in help_text
    assert "The doc." in help_text
    assert "(default: copy-drafting-<date>)" in help_text


def test_lists_of_integers_are_checked():
    assert int_list("1,4,8") == [1, 4, 8]
    assert int_list("") == []
    with pytest.raises(argparse.ArgumentTypeError, match="expected comma-separated integers, got '1,x'"):
        int_list("1,x")


def test_the_stem_is_the_flag_else_the_rendered_files_else_prefix_and_date():
    ap = benchmark_parser("b", "doc", render=True)
    assert result_stem(ap.parse_args(["--stem", "mine", "--render", "x/old.json"]), "b", RESULT) == "mine"
    assert result_stem(ap.parse_args(["--render", "x/old.json"]), "b", RESULT) == "old"
    assert result_stem(ap.parse_args([]), "copy-ceiling", RESULT) == "copy-ceiling-2026-12-03"
