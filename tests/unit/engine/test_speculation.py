"""The single validation sites: check_chain and Speculation (engine/speculation.py),
check_max_tokens and check_prompt (engine/checks.py), with their exact messages, and the
HTTP API, the server config and the CLI reaching the same functions (the same messages)."""

from __future__ import annotations

import httpx
import pytest
from click.testing import CliRunner

from specrouter.backends.synthetic import SyntheticBackend
from specrouter.cascade.chain import Chain
from specrouter.cli import main
from specrouter.engine.chain_router import FixedChain
from specrouter.engine.checks import check_max_tokens, check_prompt, check_prompt_nonempty
from specrouter.engine.speculation import Speculation, check_chain
from specrouter.errors import (EmptyPromptError, InvalidChainError, InvalidParameterError, InvalidTokenIdError,
                               PromptTooLongError)
from specrouter.server.config import load_config

from ..server_synth import LEVELS, MODEL, MODELS, build_service, running_server

SERVED = ["ngram", "small", "target"]


def message(fn, *args, **kw) -> str:
    with pytest.raises(InvalidParameterError) as info:
        fn(*args, **kw)
    return str(info.value)


# check_chain ------------------------------------------------------------------------------

@pytest.mark.parametrize("args,error,text", [
    (([],), InvalidParameterError, "a chain needs at least one model (the target)"),
    ((["small", "huge", "target"], None, SERVED), InvalidChainError,
     "chain ['small', 'huge', 'target'] must use levels of ['ngram', 'small', 'target']; unknown: ['huge']"),
    ((["small", "small", "target"],), InvalidChainError,
     "chain ['small', 'small', 'target'] must use distinct levels; repeated: ['small']"),
    ((["target", "small"], None, SERVED, "target"), InvalidParameterError,
     "chain ['target', 'small'] must end at the served model 'target'"),
    ((["small", "target"], [2, 3]), InvalidParameterError, "a chain of 2 models needs 1 draft lengths, got 2"),
    ((["small", "target"], []), InvalidParameterError, "a chain of 2 models needs 1 draft lengths, got 0"),
    ((["ngram", "small", "target"], [3, 0]), InvalidParameterError, "draft lengths must be integers >= 1, got [3, 0]"),
    ((["small", "target"], [-1]), InvalidParameterError, "draft lengths must be integers >= 1, got [-1]"),
    ((["small", "target"], [True]), InvalidParameterError, "draft lengths must be integers >= 1, got [True]"),
    ((["small", "target"], [2.0]), InvalidParameterError, "draft lengths must be integers >= 1, got [2.0]"),
])
def test_check_chain_names_each_problem(args, error, text):
    with pytest.raises(error) as info:
        check_chain(*args)
    assert type(info.value) is error and str(info.value) == text


def test_check_chain_order_and_what_it_accepts():
    check_chain(["target"], None, SERVED, "target")
    check_chain(["ngram", "small", "target"], [3, 2], SERVED, "target")
    check_chain(["/any/path.gguf", "other"])  # without levels a name is resolved when loaded
    # A wrong name is reported before the target and the draft lengths.
    assert "unknown: ['x']" in message(check_chain, ["x"], [1, 2], SERVED, "target")
    assert "must end at" in message(check_chain, ["small"], [1], SERVED, "target")


# Speculation ------------------------------------------------------------------------------

def test_speculation_is_one_checked_type():
    assert Speculation() == Speculation("auto")
    assert Speculation.fixed(["small", "target"], [3], SERVED, "target") == Speculation("chain", ("small", "target"), (3,))
    assert Speculation.fixed(["small", "target"], []) == Speculation("chain", ("small", "target"))  # [] = default
    assert Speculation.parse("off") == Speculation("off")
    assert Speculation.parse("ngram, small,target", [2, 3], SERVED, "target") == Speculation(
        "chain", ("ngram", "small", "target"), (2, 3))
    assert message(Speculation, "fast") == "speculation must be one of auto, off, chain, got 'fast'"
    assert message(Speculation, "chain") == "a chain needs at least one model (the target)"
    assert message(Speculation, "auto", (), (3,)) == "draft_lengths needs an explicit chain, not 'auto'"
    assert message(Speculation.parse, "off", [3]) == "draft_lengths needs an explicit chain, not 'off'"
    assert message(Speculation, "chain", ("small", "target"), (0,)) == "draft lengths must be integers >= 1, got [0]"
    with pytest.raises(InvalidChainError):
        Speculation.parse("small,huge,target", None, SERVED, "target")


# max_tokens and the prompt --------------------------------------------------------------

@pytest.mark.parametrize("value,shown", [(0, "0"), (-3, "-3"), (True, "True"), (False, "False"), (2.0, "2.0"),
                                         ("8", "'8'"), (None, "None")])
def test_max_tokens_must_be_a_positive_int(value, shown):
    assert message(check_max_tokens, value) == f"max_tokens must be an integer >= 1, got {shown}"


def test_max_tokens_accepts_positive_ints():
    check_max_tokens(1)
    check_max_tokens(10_000)


def router(vocab: int = 16, n_ctx: int = 8) -> FixedChain:
    return FixedChain(Chain([SyntheticBackend("t", vocab=vocab, n_ctx=n_ctx)], []))


def test_prompt_checks_in_order():
    empty = "the prompt is empty: give at least one token of text"
    for prompt in ("", [], ()):
        with pytest.raises(EmptyPromptError, match=f"^{empty}$"):
            check_prompt_nonempty(prompt)
    with pytest.raises(EmptyPromptError, match=f"^{empty}$"):
        check_prompt(router(), [])
    for bad in (16, 99, -1):
        with pytest.raises(InvalidTokenIdError) as info:
            check_prompt(router(), [1, bad, 2])
        assert str(info.value) == f"prompt token id {bad} is outside the vocabulary (0..15)"
    with pytest.raises(InvalidTokenIdError):  # a bad id is reported before the length
        check_prompt(router(), [99] * 20)
    with pytest.raises(PromptTooLongError, match="the prompt has 8 tokens but the context holds 8"):
        check_prompt(router(), [1] * 8)
    check_prompt(router(), [0, 15] * 3 + [1])


# The front ends reach the same functions ------------------------------------------------

@pytest.fixture(scope="module")
def url():
    service, _ = build_service(routed=False)
    with running_server(service) as (base, _server):
        yield base


def http_error(url: str, **body) -> dict:
    r = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "a", **body})
    assert r.status_code == 400, r.text
    return r.json()["error"]


def cli_error(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    return result.output


@pytest.mark.parametrize("names,lengths", [
    (["small", "small", MODEL], None),  # repeated
    (["small", MODEL], [1, 2]),  # count
])
def test_a_bad_chain_gets_the_same_message_everywhere(url, names, lengths):
    expected = message(check_chain, names, lengths)
    speculation = {"chain": names, **({"draft_lengths": lengths} if lengths else {})}
    err = http_error(url, speculation=speculation)
    assert err["message"] == expected and err["type"] == "invalid_request_error"
    flags = ["--chain", ",".join(names)] + (["--draft-lengths", ",".join(map(str, lengths))] if lengths else [])
    assert f"error: {expected}\n" in cli_error("generate", "--prompt", "x", *flags)
    config = message(load_config, models=MODELS, chain=",".join(names), draft_lengths=lengths)
    assert config.endswith(f"Value error, {expected}")


def test_an_unknown_level_gets_the_same_message_from_http_and_config(url):
    names = ["/etc/passwd", MODEL]
    expected = message(check_chain, names, None, LEVELS, MODEL)
    err = http_error(url, speculation={"chain": names})
    assert (err["message"], err["param"], err["code"]) == (expected, "speculation.chain", "invalid_chain")
    assert message(load_config, models=MODELS, chain=",".join(names)).endswith(f"Value error, {expected}")


def test_max_tokens_gets_the_same_message_from_the_cli_and_the_server_config():
    expected = message(check_max_tokens, 0)
    assert f"error: {expected}\n" in cli_error("generate", "--prompt", "x", "--max-tokens", "0")
    assert f"max_tokens: Value error, {expected}" in cli_error("serve", "--max-tokens", "0")


def test_the_prompt_gets_the_same_message_from_http_and_the_cli(url):
    with pytest.raises(EmptyPromptError) as info:
        check_prompt_nonempty("")
    assert http_error(url, prompt="")["message"] == str(info.value)
    assert f"error: {info.value}\n" in cli_error("generate", "--prompt", "")
    err = http_error(url, prompt=[3, 99])
    assert (err["message"], err["param"], err["code"]) == (
        "prompt token id 99 is outside the vocabulary (0..15)", "prompt", "invalid_token_id")
