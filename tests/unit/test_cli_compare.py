"""`specrouter compare` without models: the comparison on synthetic backends with a simulated
clock, its lines, and its bad input."""

import pytest
from click.testing import CliRunner

from specrouter.cascade.chain import Chain
from specrouter.cli import main
from specrouter.cli_compare import Comparison, Timed, compare

from .router_synth import PROMPT, family, make_router, simulated_clock


def test_the_target_alone_and_auto_write_the_same_tokens_and_auto_is_faster():
    target, mid, small = family()
    router = make_router(target, [mid, small])
    result = compare(Chain([target], []), router, PROMPT, 64, simulated_clock([target, mid, small]))
    # Exactly the request is timed: the prompt's forward (5 tokens) and 63 one-token forwards,
    # not the warm-up before it.
    assert result.alone.seconds == pytest.approx(0.050 + 0.004 * 5 + 63 * (0.050 + 0.004))
    assert len(result.alone.token_ids) == len(result.auto.token_ids) == 64
    assert result.auto.token_ids == result.alone.token_ids
    assert result.first_difference is None
    assert result.ratio == pytest.approx(result.alone.seconds / result.auto.seconds)
    assert result.ratio > 1.5
    assert result.alone.chain == "target"
    assert result.auto.chain.endswith("chains)")


def _timed(label, tokens, seconds, chain="t"):
    return Timed(label, chain, tuple(tokens), "", seconds)


def test_the_lines_give_each_speed_the_ratio_and_identity():
    result = Comparison(_timed("target alone", range(100), 4.0, "target"),
                        _timed("auto", range(100), 1.6, "suffix -> target [15]"))
    assert result.lines() == [
        "target alone   100 tokens in   4.00 s =   25.0 tokens/s   target",
        "auto           100 tokens in   1.60 s =   62.5 tokens/s   suffix -> target [15]",
        "auto / target alone: 2.50x the tokens per second; outputs identical: yes",
    ]


@pytest.mark.parametrize(("auto", "first"), [([1, 2, 9, 4], 2), ([1, 2], 2), ([1, 2, 3, 4, 5], 4)])
def test_outputs_that_part_say_where(auto, first):
    result = Comparison(_timed("target alone", [1, 2, 3, 4], 2.0), _timed("auto", auto, 1.0))
    assert result.first_difference == first
    assert result.lines()[-1].endswith(f"outputs identical: no, they part at token {first}")


@pytest.mark.parametrize(("args", "message"), [
    ([], "give exactly one of --prompt TEXT or --chat TEXT"),
    (["--prompt", "x", "--chat", "y"], "give exactly one of --prompt TEXT or --chat TEXT"),
    (["--prompt", ""], "the prompt is empty"),
    (["--prompt", "x", "--max-tokens", "0"], "max_tokens must be an integer >= 1, got 0"),
])
def test_bad_input_is_one_clear_line(args, message):
    result = CliRunner().invoke(main, ["compare", *args])
    assert result.exit_code == 2
    assert f"error: {message}" in result.output
    assert "Traceback" not in result.output
