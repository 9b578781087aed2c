"""Generation loop: greedy equality with the target alone, stop rules, bad input."""

import pytest

from specrouter.drafters.ngram import NgramDrafter
from specrouter.backends.synthetic import SyntheticBackend
from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams
from specrouter.engine import GenerationResult, generate, generate_stream
from specrouter.errors import EmptyPromptError, InvalidParameterError, PromptTooLongError

GREEDY = SamplingParams()


def family(vocab=8, eos_id=None, n_ctx=4096):
    target = SyntheticBackend("target", vocab=vocab, eos_id=eos_id, n_ctx=n_ctx)
    mid = SyntheticBackend("mid", vocab=vocab, model_seed=2, noise=0.6, eos_id=eos_id, n_ctx=n_ctx)
    small = SyntheticBackend("small", vocab=vocab, model_seed=3, noise=1.2, eos_id=eos_id, n_ctx=n_ctx)
    return target, mid, small


@pytest.mark.parametrize("lengths", [[1], [4], [7]])
def test_greedy_two_level_equals_target_alone(lengths):
    target, _, small = family()
    alone = generate(Chain([target], []), [1, 2, 3], GREEDY, 60)
    spec = generate(Chain([small, target], lengths), [1, 2, 3], GREEDY, 60)
    assert spec.token_ids == alone.token_ids
    assert spec.cycles < alone.cycles or lengths == [1]


@pytest.mark.parametrize("levels", ["ngram,small,mid", "small,mid", "ngram,mid", "ngram,small"])
def test_greedy_multi_level_equals_target_alone(levels):
    target, mid, small = family()
    by_name = {"ngram": NgramDrafter(), "small": small, "mid": mid}
    chain = Chain([by_name[n] for n in levels.split(",")] + [target], [3] * len(levels.split(",")))
    alone = generate(Chain([target], []), [1, 2, 3], GREEDY, 80)
    spec = generate(chain, [1, 2, 3], GREEDY, 80)
    assert spec.token_ids == alone.token_ids
    for stats in spec.levels[:-1]:
        assert 0 <= stats.accepted <= stats.proposed


def test_level_statistics_count_proposals_and_acceptances():
    target, _, small = family()
    r = generate(Chain([small, target], [4]), [1, 2, 3], GREEDY, 40)
    small_stats, target_stats = r.levels
    assert small_stats.proposed >= small_stats.accepted > 0
    # every cycle emits the accepted tokens plus one from the target
    assert small_stats.accepted + r.cycles >= len(r.token_ids)
    assert target_stats.forwards == r.cycles


def test_eos_ends_generation_and_is_not_emitted():
    target, _, small = family(eos_id=0)
    alone = generate(Chain([target], []), [1, 2, 3], GREEDY, 500)
    assert alone.finish_reason == "stop" and 0 not in alone.token_ids
    spec = generate(Chain([small, target], [4]), [1, 2, 3], GREEDY, 500)
    assert spec.token_ids == alone.token_ids and spec.finish_reason == "stop"


def test_max_tokens_caps_output_exactly():
    target, _, small = family()
    for n in (1, 2, 5, 13):
        r = generate(Chain([small, target], [6]), [1, 2, 3], GREEDY, n)
        assert len(r.token_ids) == n and r.finish_reason == "length"


def test_context_limit_ends_generation_with_length():
    target, _, small = family(n_ctx=12)
    r = generate(Chain([small, target], [4]), [1, 2, 3], GREEDY, 100)
    assert len(r.token_ids) == 12 - 3 and r.finish_reason == "length"


def test_stop_string_cuts_text_and_drops_later_tokens():
    target, _, small = family()
    full = generate(Chain([target], []), [1, 2, 3], GREEDY, 40)
    stop = full.text[10:12]
    cut = full.text.find(stop)
    r = generate(Chain([small, target], [4]), [1, 2, 3], GREEDY, 40, stop=[stop])
    assert r.text == full.text[:cut] and r.finish_reason == "stop"
    assert r.token_ids == full.token_ids[: len(r.token_ids)]
    assert len(r.token_ids) == cut  # one character per token: the stop string's tokens are dropped


def test_stream_deltas_concatenate_to_the_text_and_never_show_a_stop_string():
    target, _, small = family()
    full = generate(Chain([target], []), [1, 2, 3], GREEDY, 40)
    stop = full.text[20:23]
    items = list(generate_stream(Chain([small, target], [4]), [1, 2, 3], GREEDY, 40, stop=[stop]))
    result = items[-1]
    assert isinstance(result, GenerationResult)
    assert "".join(items[:-1]) == result.text
    assert stop not in "".join(items[:-1])


def test_sampled_generation_is_reproducible_with_a_seed():
    target, mid, small = family()
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=42)
    a = generate(Chain([small, mid, target], [3, 3]), [1, 2], params, 30)
    b = generate(Chain([small, mid, target], [3, 3]), [1, 2], params, 30)
    assert a.token_ids == b.token_ids


def test_bad_input_gives_named_errors():
    target, _, small = family(n_ctx=16)
    chain = Chain([small, target], [4])
    with pytest.raises(EmptyPromptError, match="the prompt is empty"):
        generate(chain, [], GREEDY, 5)
    with pytest.raises(PromptTooLongError, match="the prompt has 16 tokens but the context holds 16"):
        generate(chain, [1] * 16, GREEDY, 5)
    with pytest.raises(InvalidParameterError, match="max_tokens must be an integer >= 1, got 0"):
        generate(chain, [1], GREEDY, 0)
    with pytest.raises(InvalidParameterError, match="needs 1 draft lengths, got 2"):
        Chain([small, target], [4, 4])
    with pytest.raises(InvalidParameterError, match="ngram can only be the first"):
        Chain([small, NgramDrafter(), target], [2, 2])
    with pytest.raises(InvalidParameterError, match="draft lengths must be integers >= 1"):
        Chain([small, target], [0])


def test_a_backend_failure_mid_request_releases_the_sequence():
    target, _, small = family()

    def broken(seq, tokens, pos, n):
        raise RuntimeError("model crashed")

    small.decode = broken
    with pytest.raises(RuntimeError, match="model crashed"):
        generate(Chain([small, target], [4]), [1, 2, 3], GREEDY, 10)
    assert target._kv == {}  # the target's slot was freed on the way out
