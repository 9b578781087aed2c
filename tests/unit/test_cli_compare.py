"""`specrouter compare` without models: its bad input (one line, before any model loads), and
the whole command on synthetic models with a simulated clock in place of the pool's."""

import json

import pytest
from click.testing import CliRunner

from specrouter import cli_compare
from specrouter.cascade.chain import Chain
from specrouter.cli import main

from .router_synth import family, make_router, simulated_clock
from .test_compare import ALONE_SECONDS, COPY_SECONDS, copy_draft


def _invoke(args, tmp_path):
    return CliRunner().invoke(main, ["compare", "--cache-dir", str(tmp_path / "cache"), *args])


@pytest.mark.parametrize(("args", "message"), [
    ([], "give --prompt TEXT or --chat TEXT (each repeatable), or --prompts FILE"),
    (["--prompt", ""], "the prompt is empty: give at least one token of text"),
    (["--prompt", "x", "--chat", ""], "the prompt is empty: give at least one token of text"),
    (["--prompt", "x", "--max-tokens", "0"], "max_tokens must be an integer >= 1, got 0"),
    (["--prompt", "x", "--prompts", "p.jsonl"], "give --prompt/--chat or --prompts FILE, not both"),
    (["--prompt", "x"], "--chain auto needs a pulled pool model: run `specrouter pull`, or give --target"),
    (["--prompt", "x", "--target", "t", "--chain", "auto"],
     "--chain 'auto': the target alone and auto always run; --chain adds a fixed chain, LEVELS[:DRAFT_LENGTHS]"),
    (["--prompt", "x", "--target", "t", "--chain", "t"], "--chain 't' is the target alone, which always runs"),
    (["--prompt", "x", "--target", "t", "--chain", "a,,t"], "--chain must be a comma-separated list of models, "
                                                            "got 'a,,t'"),
    (["--prompt", "x", "--target", "t", "--chain", "a:x"],
     "--chain 'a:x': the draft lengths after ':' must be comma-separated integers, got 'x'"),
    (["--prompt", "x", "--target", "t", "--chain", "a,b:4"],
     "--chain 'a,b:4': a chain of 3 models needs 2 draft lengths, got 1"),
    (["--prompt", "x", "--target", "t", "--chain", "a:0"], "--chain 'a:0': draft lengths must be integers >= 1, "
                                                           "got [0]"),
    (["--prompt", "x", "--target", "t", "--chain", "a,a"], "--chain 'a,a': chain ['a', 'a', 't'] must use distinct "
                                                           "levels; repeated: ['a']"),
    (["--prompt", "x", "--target", "t", "--chain", "a", "--chain", "a,t:4"], "--chain 'a,t:4' names a:4 a second time"),
])
def test_bad_flags_are_one_clear_line(args, message, tmp_path):
    result = _invoke(args, tmp_path)
    assert result.exit_code == 2
    assert result.stderr == f"error: {message}\n"
    assert result.stdout == ""


@pytest.mark.parametrize(("lines", "message"), [
    (['{"prompt": "a"}', "", "{oops"], "line 3: not JSON (Expecting property name enclosed in double quotes at "
                                       "column 2)"),
    (['["a"]'], "line 1: a line must be a JSON object, got an array"),
    (['{"id": 1}'], 'line 1: give exactly one of "prompt", "chat" or "messages"'),
    (['{"prompt": "a", "chat": "b"}'], 'line 1: give exactly one of "prompt", "chat" or "messages"'),
    (['{"prompt": "a", "max_token": 5}'], "line 1: unknown key 'max_token' (a line may hold prompt, chat, messages, "
                                          "id, max_tokens, group)"),
    (['{"prompt": 3}'], 'line 1: "prompt" must be a string, got a number'),
    (['{"chat": ""}'], "line 1: the prompt is empty: give at least one token of text"),
    (['{"messages": []}'], 'line 1: "messages" must be a non-empty list of objects with a string "role" and a '
                           'string "content" (OpenAI format)'),
    (['{"messages": [{"role": "user"}]}'], 'line 1: "messages" must be a non-empty list of objects with a string '
                                           '"role" and a string "content" (OpenAI format)'),
    (['{"prompt": "a", "max_tokens": 0}'], "line 1: max_tokens must be an integer >= 1, got 0"),
    (['{"prompt": "a", "max_tokens": true}'], "line 1: max_tokens must be an integer >= 1, got True"),
    (['{"prompt": "a", "id": [1]}'], 'line 1: "id" must be a string or an integer, got an array'),
    (['{"prompt": "a", "id": "x"}', '{"prompt": "b", "id": "x"}'], "line 2: id 'x' is also line 1's"),
    (['{"prompt": "a"}', '{"prompt": "b", "id": 1}'], "line 2: id '1' is also line 1's"),
])
def test_a_bad_line_of_the_prompts_file_is_named_before_any_model_loads(lines, message, tmp_path):
    file = tmp_path / "p.jsonl"
    file.write_text("\n".join(lines) + "\n")
    result = _invoke(["--prompts", str(file)], tmp_path)  # nothing is pulled: the file fails first
    assert result.exit_code == 2
    assert result.stderr == f"error: {file}, {message}\n"


def test_a_prompts_file_without_prompts_is_refused(tmp_path):
    file = tmp_path / "p.jsonl"
    file.write_text("\n  \n")
    result = _invoke(["--prompts", str(file)], tmp_path)
    assert (result.exit_code, result.stderr) == (2, f"error: {file} holds no prompt\n")
    missing = tmp_path / "none.jsonl"
    result = _invoke(["--prompts", str(missing)], tmp_path)
    assert (result.exit_code, result.stderr) == (2, f"error: cannot read the prompts {missing}: No such file or "
                                                    f"directory\n")


@pytest.fixture
def synthetic(monkeypatch, tmp_path):
    """The command on synthetic models: a pool of target, mid, small and copy, the router
    over the first three, and the models' simulated clock as the comparison's."""
    target, mid, small = family()
    copy = copy_draft()
    router = make_router(target, [mid, small])
    by_name = {m.name: m for m in (target, mid, small, copy)}
    calls = {}

    class Pool:
        def __init__(self, **kw):
            calls["pool"] = kw

        def chain(self, specs, draft_lengths=None):
            return Chain([by_name[s] for s in specs], list(draft_lengths or [4] * (len(specs) - 1)))

        def close(self):
            calls["closed"] = True

    def auto_router(pool, target_spec, candidates, profile_dir=None, lookup=None):
        calls["router"] = (target_spec, candidates, profile_dir, lookup)
        return router

    monkeypatch.setattr(cli_compare, "Pool", Pool)
    monkeypatch.setattr(cli_compare, "auto_router", auto_router)
    monkeypatch.setattr(cli_compare, "CLOCK", simulated_clock(list(by_name.values())))
    return calls


def _prompts_file(tmp_path):
    # "bcdef" and "dbebfjcg" are the synthetic tokens of test_compare's prompts a and b.
    file = tmp_path / "p.jsonl"
    file.write_text('{"id": "a", "prompt": "bcdef", "max_tokens": 64}\n\n'
                    '{"prompt": "dbebfjcg", "max_tokens": 40, "group": "g"}\n'
                    '{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}\n')
    return file


def test_the_json_gives_every_prompts_figures_and_the_medians(synthetic, tmp_path):
    args = ["--prompts", str(_prompts_file(tmp_path)), "--target", "target", "--chain", "copy", "--max-tokens", "8",
            "--router-dir", str(tmp_path / "router"), "--json"]
    result = _invoke(args, tmp_path)
    assert result.exit_code == 0, result.output
    assert synthetic["router"] == ("target", [], tmp_path / "router", "suffix")
    assert synthetic["closed"]
    out = json.loads(result.stdout)
    assert result.stderr.startswith(f"router: profile and estimates in {tmp_path / 'router'} (--router-dir)\n")
    assert out["target"] == "target"
    assert out["methods"] == ["target alone", "auto", "copy:4"]
    assert [(p["id"], p["max_tokens"], p["order"]) for p in out["prompts"]] == [
        ("a", 64, ["target alone", "auto", "copy:4", "target alone"]),
        ("3", 40, ["target alone", "copy:4", "auto", "target alone"]),
        ("4", 8, ["target alone", "auto", "copy:4", "target alone"]),
    ]
    a, b = out["prompts"][0]["methods"], out["prompts"][1]["methods"]
    assert [r["seconds"] for r in a["target alone"]["runs"]] == pytest.approx([ALONE_SECONDS["a"]] * 2)
    assert [r["position"] for r in a["target alone"]["runs"]] == [0, 3]
    assert a["copy:4"]["runs"] == [{"position": 2, "tokens": 64, "seconds": pytest.approx(COPY_SECONDS["a"])}]
    assert a["copy:4"]["chain"] == "copy -> target [4]"
    assert a["copy:4"]["tokens_per_second"] == pytest.approx(64 / COPY_SECONDS["a"])
    assert a["copy:4"]["ratio"] == pytest.approx(ALONE_SECONDS["a"] / COPY_SECONDS["a"])
    assert b["copy:4"]["ratio"] == pytest.approx(ALONE_SECONDS["b"] / COPY_SECONDS["b"])
    assert {(p["id"], label, m["identical"], m["first_difference"], m["text"] == p["methods"]["target alone"]["text"])
            for p in out["prompts"] for label, m in p["methods"].items()} == {
        (pid, label, True, None, True) for pid in ("a", "3", "4") for label in out["methods"]}
    summary = out["summary"]
    assert summary["prompts"] == 3
    assert list(summary["methods"]) == out["methods"]
    assert summary["methods"]["copy:4"]["identical_prompts"] == 3
    assert summary["methods"]["target alone"]["median_ratio"] == 1.0
    ratios = sorted(p["methods"]["copy:4"]["ratio"] for p in out["prompts"])
    assert summary["methods"]["copy:4"]["median_ratio"] == ratios[1]


def test_several_prompts_print_each_prompts_runs_and_the_medians(synthetic, tmp_path):
    args = ["--prompt", "bcdef", "--prompt", "dbebfjcg", "--chat", "hi", "--target", "target", "--chain", "copy:4",
            "--max-tokens", "40", "--router-dir", str(tmp_path / "router")]
    result = _invoke(args, tmp_path)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    # auto's figures are the router's (test_compare checks them against the target alone's);
    # every other figure is exact: the copy chain and the target alone as test_compare derives
    # them, the chat prompt "hi" is 52 synthetic tokens in ChatML.
    auto = [line for line in lines if line.lstrip().startswith("auto ")]
    assert [line.split()[0] for line in auto] == ["auto"] * 7  # 3 runs, 3 ratios, 1 median
    assert sum(line.endswith("outputs identical: yes") for line in auto) == 3
    assert auto[-1].endswith("  3/3")
    assert [line for line in lines if line not in auto] == [
        f"router: profile and estimates in {tmp_path / 'router'} (--router-dir)",
        "3 prompts; greedy; per prompt the target alone first and last (its two runs pooled), the others in between",
        "",
        "prompt 1: 5 tokens, at most 40 new",
        "  target alone    40 tokens in   2.18 s =   18.4 tokens/s   target",
        "  copy:4          40 tokens in   0.94 s =   42.6 tokens/s   copy -> target [4]",
        "  target alone    40 tokens in   2.18 s =   18.4 tokens/s   target",
        "  copy:4 / target alone: 2.32x the tokens per second; outputs identical: yes",
        "",
        "prompt 2: 8 tokens, at most 40 new",
        "  target alone    40 tokens in   2.19 s =   18.3 tokens/s   target",
        "  copy:4          40 tokens in   0.95 s =   41.9 tokens/s   copy -> target [4]",
        "  target alone    40 tokens in   2.19 s =   18.3 tokens/s   target",
        "  copy:4 / target alone: 2.29x the tokens per second; outputs identical: yes",
        "",
        "prompt 3: 52 tokens, at most 40 new",
        "  target alone    40 tokens in   2.36 s =   16.9 tokens/s   target",
        "  copy:4          40 tokens in   1.17 s =   34.1 tokens/s   copy -> target [4]",
        "  target alone    40 tokens in   2.36 s =   16.9 tokens/s   target",
        "  copy:4 / target alone: 2.01x the tokens per second; outputs identical: yes",
        "",
        "median over 3 prompts  tokens/s  / target alone  identical",
        "target alone               18.3           1.00x  3/3",
        "copy:4                     41.9           2.29x  3/3",
    ]
    assert result.stderr == ""


def test_one_prompt_prints_autos_output_and_its_runs_as_before(synthetic, tmp_path):
    args = ["--prompt", "bcdef", "--target", "target", "--max-tokens", "64", "--router-dir", str(tmp_path / "r")]
    result = _invoke(args, tmp_path)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[1] == "prompt: 5 tokens; greedy, at most 64 new tokens; runs: target alone, auto, target alone"
    assert lines[2:4] == ["", "auto's output:"]
    seconds = ALONE_SECONDS["a"]
    assert lines[-4] == lines[-2] == f"target alone    64 tokens in {seconds:6.2f} s =   18.4 tokens/s   target"
    assert lines[-3].startswith("auto            64 tokens in ")
    assert lines[-1].startswith("auto / target alone: ")
    assert lines[-1].endswith("x the tokens per second; outputs identical: yes")
    assert "median" not in result.stdout
