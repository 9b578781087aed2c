"""CLI bad input: one clear line on stderr, exit code 2, no traceback (no models needed)."""

import pytest
from click.testing import CliRunner

from specrouter.cli import main


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prompt", ""], "the prompt is empty"),
        (["--prompt", "x", "--temperature", "-1"], "temperature must be >= 0, got -1.0"),
        (["--prompt", "x", "--top-p", "0"], "top_p must be in (0, 1], got 0.0"),
        (["--prompt", "x", "--top-p", "1.5"], "top_p must be in (0, 1], got 1.5"),
        (["--prompt", "x", "--max-tokens", "0"], "max_tokens must be an integer >= 1, got 0"),
        (["--prompt", "x", "--chain", "no-such-model"], "unknown model 'no-such-model': known models are"),
        (["--prompt", "x", "--chain", "/nonexistent/m.gguf"], "model file not found: /nonexistent/m.gguf"),
        (["--prompt", "x", "--chain", "a,,b"], "--chain must be a comma-separated list"),
        (["--prompt", "x", "--draft-lengths", "2,x"], "--draft-lengths must be comma-separated integers"),
        (["--prompt", "x", "--chat", "y"], "give exactly one of --prompt TEXT or --chat TEXT"),
        (["--prompt", "x", "--presence-penalty", "3"], "presence_penalty must be in [-2.0, 2.0], got 3.0"),
        (["--prompt", "x", "--logprobs", "2"], "--logprobs is reported in the --json output: add --json"),
        (["--prompt", "x", "--logprobs", "21", "--json"], "logprobs must be an integer in 0..20 (alternatives per "
                                                          "token), got 21"),
        (["--prompt", "x", "--regex", "(yes"], "regex grammar: "),
        (["--prompt", "x", "--regex", "a+", "--grammar", "-"], "give at most one of --json-schema, --regex and "
                                                               "--grammar"),
    ],
)
def test_bad_input_is_one_clear_line(args, message):
    result = CliRunner().invoke(main, ["generate", *args])
    assert result.exit_code == 2
    assert f"error: {message}" in result.output
    assert "Traceback" not in result.output


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"PK\x03\x04 not a model")
    result = CliRunner().invoke(main, ["generate", "--prompt", "x", "--chain", str(bogus)])
    assert result.exit_code == 2
    assert f"error: {bogus} is not a GGUF file" in result.output
