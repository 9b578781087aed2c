"""specrouter.compare without models: the methods run interleaved on synthetic backends with a
simulated clock, their exact figures, and the lines and JSON they make."""

import pytest

from specrouter.backends.synthetic import SyntheticBackend
from specrouter.cascade.chain import Chain
from specrouter.compare.figures import PromptRuns, Timed, report_dict, summarize, summary_lines
from specrouter.compare.methods import ALONE, AUTO, Method, parse_chain_spec
from specrouter.compare.prompts import Prompt, PromptSpec, user_message
from specrouter.compare.runs import compare, run_order
from specrouter.errors import InvalidParameterError

from .router_synth import PROMPT, family, linear, make_router, simulated_clock


def copy_draft() -> SyntheticBackend:
    """The target's own distribution (noise 0 in its family): every draft token is accepted."""
    return SyntheticBackend("copy", vocab=16, latency=linear(0.010, 0.001), params_b=0.5)


def test_the_target_alone_and_auto_write_the_same_tokens_and_auto_is_faster():
    target, mid, small = family()
    router = make_router(target, [mid, small])
    methods = [Method(ALONE, Chain([target], [])), Method(AUTO, router)]
    [result] = compare(methods, [Prompt("1", tuple(PROMPT), 64)], simulated_clock([target, mid, small]))
    assert [r.label for r in result.runs] == [ALONE, AUTO, ALONE]
    # Exactly each request is timed: the prompt's forward (5 tokens) and 63 one-token forwards,
    # not the warm-up before the first.
    alone, auto, again = result.runs
    assert alone.seconds == again.seconds == pytest.approx(0.050 + 0.004 * 5 + 63 * (0.050 + 0.004))
    assert len(alone.token_ids) == len(auto.token_ids) == 64
    assert auto.token_ids == alone.token_ids == again.token_ids
    assert result.first_difference(AUTO) is result.first_difference(ALONE) is None
    assert result.tokens_per_second(ALONE) == pytest.approx(128 / (2 * alone.seconds))
    assert result.ratio(AUTO) == pytest.approx(alone.seconds / auto.seconds)
    assert result.ratio(AUTO) > 1.5
    assert alone.chain == "target"
    assert auto.chain.endswith("chains)")


def test_the_target_alone_runs_first_and_last_and_the_others_rotate():
    assert [run_order(["T", "a", "b", "c"], turn) for turn in range(4)] == [
        ["T", "a", "b", "c", "T"], ["T", "b", "c", "a", "T"], ["T", "c", "a", "b", "T"], ["T", "a", "b", "c", "T"]]
    assert run_order(["T"], 3) == ["T", "T"]


def _methods():
    target, mid, small = family()
    copy = copy_draft()
    methods = [Method(ALONE, Chain([target], [])), Method(AUTO, make_router(target, [mid, small])),
               Method("copy:4", Chain([copy, target], [4])), Method("small:4", Chain([small, target], [4]))]
    return methods, simulated_clock([target, mid, small, copy])


PROMPTS = [Prompt("a", tuple(PROMPT), 64), Prompt("b", (3, 1, 4, 1, 5, 9, 2, 6), 40), Prompt("c", (7, 7, 7), 20)]


def test_every_method_runs_on_every_prompt_in_the_interleaved_order():
    methods, clock = _methods()
    seen = []
    results = list(compare(methods, PROMPTS, clock, on_run=lambda pid, run: seen.append((pid, run.label))))
    assert seen == [
        ("a", ALONE), ("a", AUTO), ("a", "copy:4"), ("a", "small:4"), ("a", ALONE),
        ("b", ALONE), ("b", "copy:4"), ("b", "small:4"), ("b", AUTO), ("b", ALONE),
        ("c", ALONE), ("c", "small:4"), ("c", AUTO), ("c", "copy:4"), ("c", ALONE),
    ]
    assert [[r.label for r in p.runs] for p in results] == [[label for pid, label in seen if pid == p.id]
                                                            for p in results]
    assert [(p.id, p.prompt_tokens, p.max_tokens, p.labels) for p in results] == [
        (p.id, len(p.tokens), p.max_tokens, (ALONE, AUTO, "copy:4", "small:4")) for p in PROMPTS]


# The copy chain's seconds on a prompt of n tokens and m new ones.
# Its first cycle: the copy reads the prompt (0.010 + 0.001 n) and drafts 3 more one at a time
# (3 x 0.011); the target verifies the prompt and 4 drafts (0.050 + 0.004 (n + 4)) and emits 5
# tokens. Every later cycle: the copy reads the last draft and the bonus (0.012) and drafts 3
# (0.033), the target verifies 5 (0.070): 5 tokens for 0.115 s. The last cycle of prompt a
# has room for 4 tokens: the copy reads 2 and drafts 2 more (0.034), the target verifies 4
# (0.066). The target alone: its prompt (0.050 + 0.004 n), then m - 1 forwards of 0.054.
COPY_SECONDS = {"a": 0.048 + 0.086 + 11 * 0.115 + 0.034 + 0.066, "b": 0.051 + 0.098 + 7 * 0.115,
                "c": 0.046 + 0.078 + 3 * 0.115}
ALONE_SECONDS = {"a": 0.070 + 63 * 0.054, "b": 0.082 + 39 * 0.054, "c": 0.062 + 19 * 0.054}


def test_the_figures_are_each_runs_tokens_over_its_seconds_on_the_simulated_clock():
    methods, clock = _methods()
    results = list(compare(methods, PROMPTS, clock))
    for p, prompt in zip(results, PROMPTS):
        alone, copy = p.of(ALONE), p.of("copy:4")
        assert [r.seconds for r in alone] == pytest.approx([ALONE_SECONDS[p.id]] * 2)
        assert [r.seconds for r in copy] == pytest.approx([COPY_SECONDS[p.id]])
        m = prompt.max_tokens
        assert p.tokens_per_second(ALONE) == pytest.approx(2 * m / (2 * ALONE_SECONDS[p.id]))
        assert p.tokens_per_second("copy:4") == pytest.approx(m / COPY_SECONDS[p.id])
        assert p.ratio("copy:4") == pytest.approx(ALONE_SECONDS[p.id] / COPY_SECONDS[p.id])
        for label in p.labels:  # greedy and exact: every chain writes the target alone's tokens
            assert p.first_difference(label) is None
            assert [len(r.token_ids) for r in p.of(label)] == [m] * len(p.of(label))
            assert p.ratio(label) == pytest.approx(p.tokens_per_second(label) / p.tokens_per_second(ALONE))
    summary = {s.label: s for s in summarize(results)}
    assert list(summary) == [ALONE, AUTO, "copy:4", "small:4"]
    # Per prompt a, b, c: the copy chain's 42.69, 41.93, 42.64 tokens/s; its ratios 2.316,
    # 2.294, 2.320 (medians: c's speed, a's ratio); the target alone's 18.43, 18.28, 18.38.
    assert summary["copy:4"].median_tokens_per_second == pytest.approx(20 / COPY_SECONDS["c"])
    assert summary["copy:4"].median_ratio == pytest.approx(ALONE_SECONDS["a"] / COPY_SECONDS["a"])
    assert summary[ALONE].median_tokens_per_second == pytest.approx(20 / ALONE_SECONDS["c"])
    assert summary[ALONE].median_ratio == 1.0
    assert [(s.prompts, s.identical) for s in summary.values()] == [(3, 3)] * 4


def test_a_method_that_writes_other_tokens_is_not_identical():
    target, _, _ = family()
    other = SyntheticBackend("other", vocab=16, model_seed=5, noise=2.0, latency=linear(0.050, 0.004))
    methods = [Method(ALONE, Chain([target], [])), Method("other", Chain([other], []))]
    [p] = compare(methods, [Prompt("a", tuple(PROMPT), 16)], simulated_clock([target, other]))
    alone, theirs = p.of(ALONE)[0].token_ids, p.of("other")[0].token_ids
    part = next(i for i, (x, y) in enumerate(zip(alone, theirs)) if x != y)
    assert p.first_difference("other") == part
    assert p.lines()[-1] == f"other / target alone: 1.00x the tokens per second; outputs identical: no, they part " \
                            f"at token {part}"
    assert [(s.label, s.identical) for s in summarize([p])] == [(ALONE, 1), ("other", 0)]


def test_a_prompt_that_does_not_fit_a_method_fails_before_any_run():
    target, _, _ = family()
    short = SyntheticBackend("short", vocab=16, n_ctx=4, latency=linear(0.050, 0.004))
    methods = [Method(ALONE, Chain([target], [])), Method("short", Chain([short], []))]
    with pytest.raises(InvalidParameterError) as err:
        list(compare(methods, [Prompt("a", (1, 2), 8), Prompt("b", tuple(PROMPT), 8)], simulated_clock([target])))
    assert str(err.value) == ("prompt b: the prompt has 5 tokens but the context holds 4 (at least one position "
                              "must stay free for generation); shorten the prompt or raise --n-ctx")
    assert target.simulated_seconds == short.simulated_seconds == 0.0


def _timed(label, tokens, seconds, chain="t"):
    return Timed(label, chain, tuple(tokens), "", seconds)


def _prompt(runs, pid="1", labels=(ALONE, AUTO)):
    return PromptRuns(pid, 5, 100, labels, tuple(runs))


def test_the_lines_give_each_run_in_order_then_each_ratio_and_identity():
    p = _prompt([_timed(ALONE, range(100), 4.0, "target"), _timed(AUTO, range(100), 1.6, "suffix -> target [15]"),
                 _timed("small:4", range(100), 2.5, "small -> target [4]"), _timed(ALONE, range(100), 4.0, "target")],
                labels=(ALONE, AUTO, "small:4"))
    assert p.lines() == [
        "target alone   100 tokens in   4.00 s =   25.0 tokens/s   target",
        "auto           100 tokens in   1.60 s =   62.5 tokens/s   suffix -> target [15]",
        "small:4        100 tokens in   2.50 s =   40.0 tokens/s   small -> target [4]",
        "target alone   100 tokens in   4.00 s =   25.0 tokens/s   target",
        "auto / target alone: 2.50x the tokens per second; outputs identical: yes",
        "small:4 / target alone: 1.60x the tokens per second; outputs identical: yes",
    ]


def test_the_target_alone_is_pooled_over_its_two_runs():
    p = _prompt([_timed(ALONE, range(100), 3.0), _timed(AUTO, range(100), 2.0), _timed(ALONE, range(100), 5.0)])
    assert p.tokens_per_second(ALONE) == 200 / 8.0
    assert p.ratio(AUTO) == (100 / 2.0) / (200 / 8.0)


@pytest.mark.parametrize(("auto", "first"), [([1, 2, 9, 4], 2), ([1, 2], 2), ([1, 2, 3, 4, 5], 4)])
def test_outputs_that_part_say_where(auto, first):
    p = _prompt([_timed(ALONE, [1, 2, 3, 4], 2.0), _timed(AUTO, auto, 1.0), _timed(ALONE, [1, 2, 3, 4], 2.0)])
    assert p.first_difference(AUTO) == first
    assert p.lines()[-1].endswith(f"outputs identical: no, they part at token {first}")


def test_two_runs_of_the_target_alone_that_part_get_a_line():
    p = _prompt([_timed(ALONE, [1, 2, 3], 1.0), _timed(AUTO, [1, 2, 3], 1.0), _timed(ALONE, [1, 5, 3], 1.0)])
    assert p.lines()[-2:] == ["auto / target alone: 1.00x the tokens per second; outputs identical: yes",
                              "target alone: its two runs part at token 1"]
    assert [(s.label, s.identical) for s in summarize([p])] == [(ALONE, 0), (AUTO, 1)]


def test_no_ratio_where_the_target_alone_wrote_no_token():
    p = _prompt([_timed(ALONE, [], 0.5), _timed(AUTO, [], 0.25), _timed(ALONE, [], 0.5)])
    assert p.ratio(AUTO) is None
    assert p.lines()[-1] == "auto / target alone: no ratio (the target alone wrote no token); outputs identical: yes"
    assert summarize([p])[1].median_ratio is None


def _three_prompts():
    # auto at 50, 62.5, 100 tokens/s against the target alone's 25, 25, 20: ratios 2, 2.5, 5.
    speeds = [(4.0, 2.0), (4.0, 1.6), (5.0, 1.0)]
    return [_prompt([_timed(ALONE, range(100), alone, "target"), _timed(AUTO, range(100), auto, "x -> target [4]"),
                     _timed(ALONE, range(100), alone, "target")], pid=str(i))
            for i, (alone, auto) in enumerate(speeds, 1)]


def test_the_summary_is_the_median_over_the_prompts():
    summary = summarize(_three_prompts())
    assert [(s.label, s.prompts, s.median_tokens_per_second, s.median_ratio, s.identical) for s in summary] == [
        (ALONE, 3, 25.0, 1.0, 3), (AUTO, 3, 62.5, 2.5, 3)]
    assert summary_lines(summary) == [
        "median over 3 prompts  tokens/s  / target alone  identical",
        "target alone               25.0           1.00x  3/3",
        "auto                       62.5           2.50x  3/3",
    ]


def test_the_json_holds_every_prompt_and_the_summary():
    results = _three_prompts()[:2]
    out = report_dict("qwen", results)
    assert list(out) == ["target", "methods", "prompts", "summary"]
    assert (out["target"], out["methods"]) == ("qwen", [ALONE, AUTO])
    assert out["prompts"][1] == {
        "id": "2", "prompt_tokens": 5, "max_tokens": 100, "order": [ALONE, AUTO, ALONE],
        "methods": {
            ALONE: {"chain": "target", "tokens": 100, "runs": [{"position": 0, "tokens": 100, "seconds": 4.0},
                                                               {"position": 2, "tokens": 100, "seconds": 4.0}],
                    "tokens_per_second": 25.0, "ratio": 1.0, "identical": True, "first_difference": None, "text": ""},
            AUTO: {"chain": "x -> target [4]", "tokens": 100, "runs": [{"position": 1, "tokens": 100, "seconds": 1.6}],
                   "tokens_per_second": 62.5, "ratio": 2.5, "identical": True, "first_difference": None, "text": ""},
        },
    }
    assert out["summary"] == {"prompts": 2, "methods": {
        ALONE: {"median_tokens_per_second": 25.0, "median_ratio": 1.0, "identical_prompts": 2},
        AUTO: {"median_tokens_per_second": 56.25, "median_ratio": 2.25, "identical_prompts": 2}}}


@pytest.mark.parametrize(("text", "drafts", "lengths", "label"), [
    ("suffix", ("suffix",), (4,), "suffix:4"),
    ("suffix,qwen-7b:16", ("suffix",), (16,), "suffix:16"),
    ("suffix,small:16,2", ("suffix", "small"), (16, 2), "suffix,small:16,2"),
    ("C:\\m\\small.gguf", ("C:\\m\\small.gguf",), (4,), "C:\\m\\small.gguf:4"),
    ("C:\\m\\small.gguf:8", ("C:\\m\\small.gguf",), (8,), "C:\\m\\small.gguf:8"),
])
def test_a_chain_spec_names_its_drafts_and_lengths_and_ends_at_the_target(text, drafts, lengths, label):
    spec = parse_chain_spec(text, "qwen-7b")
    assert (spec.drafts, spec.draft_lengths, spec.label) == (drafts, lengths, label)


def test_a_chat_the_template_refuses_is_an_error_naming_the_prompt():
    target = SyntheticBackend("t", vocab=16, chat_template="{{ raise_exception('one user message only') }}")
    spec = PromptSpec("1", "p.jsonl, line 2", messages=user_message("hi"))
    with pytest.raises(InvalidParameterError) as err:
        spec.tokens(target)
    assert str(err.value) == "p.jsonl, line 2: the chat template of t cannot render these messages: one user " \
                             "message only"
    assert PromptSpec("2", "--prompt 2", text="bcd").tokens(target) == [1, 2, 3]
