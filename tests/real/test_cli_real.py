"""The installed `specrouter` command on the real models: JSON output and bad input
(one clear line, exit code 2, no traceback)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path


from specrouter.models import DEFAULT_POOL, model_path

from .conftest import SMALL, SMOL, TARGET

CLI = str(Path(sys.executable).with_name("specrouter"))


def run(*args, env=None):
    return subprocess.run([CLI, *args], capture_output=True, text=True, env=env, timeout=600)


def test_json_output_has_the_documented_fields(pool):
    proc = run("generate", "--prompt", "def add(a, b):", "--chain", f"ngram,{SMALL},{TARGET}",
               "--draft-lengths", "3,4", "--max-tokens", "24", "--json", "--logprobs", "2")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for key in ("text", "token_ids", "chain", "levels", "cycles", "wall_seconds", "tokens_per_second"):
        assert key in out
    assert out["chain"] == ["ngram", SMALL, TARGET]
    assert len(out["token_ids"]) == 24 or out["finish_reason"] == "stop"
    assert [lv["name"] for lv in out["levels"]] == out["chain"]
    assert all(0 <= lv["accepted"] <= lv["proposed"] for lv in out["levels"][:-1])
    assert [e["token"] for e in out["logprobs"]] == out["token_ids"]
    assert all(len(e["top"]) == 2 and e["top"][0][1] >= e["top"][1][1] >= -9999.0 and e["logprob"] <= 0
               for e in out["logprobs"])


def test_streaming_prints_text_then_statistics(pool):
    proc = run("generate", "--chat", "Say hello.", "--chain", f"{SMALL},{TARGET}", "--max-tokens", "12")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    assert "tok/s" in proc.stderr and f"chain: {SMALL} -> {TARGET}" in proc.stderr


def test_a_json_schema_holds_the_answer(pool, tmp_path):
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
              "additionalProperties": False}
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    proc = run("generate", "--chat", "What is 6 times 7? Answer in JSON.", "--chain", f"ngram,{TARGET}",
               "--json-schema", str(tmp_path / "schema.json"), "--max-tokens", "40", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert json.loads(out["text"]) == {"answer": 42} and out["finish_reason"] == "stop"


def expect_error(proc, message):
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert f"error: {message}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_prompt_longer_than_context(pool):
    proc = run("generate", "--prompt", "word " * 200, "--chain", TARGET, "--n-ctx", "64")
    expect_error(proc, "the prompt has ")
    assert "tokens but the context holds 64" in proc.stderr


def test_tokenizer_mismatch_in_a_chain(pool):
    expect_error(run("generate", "--prompt", "hi", "--chain", f"{SMOL},{TARGET}"),
                 f"{SMOL} and {TARGET} do not share a tokenizer: token ")


def test_corrupt_pool_model_fails_its_checksum(pool, tmp_path):
    """A pulled file changed after it was verified is re-hashed and refused."""
    cache = tmp_path / "models"
    cache.mkdir()
    good = model_path(SMOL)
    bad = cache / good.name
    shutil.copyfile(good, bad)
    shutil.copyfile(Path(str(good) + ".sha256"), Path(str(bad) + ".sha256"))
    with open(bad, "r+b") as f:
        f.seek(1_000_000)
        f.write(b"\x00" * 16)
    os.utime(bad, None)
    os.utime(Path(str(bad) + ".sha256"), (0, 0))  # the stamp predates the damage
    proc = run("generate", "--prompt", "hi", "--chain", SMOL, "--cache-dir", str(cache))
    expect_error(proc, f"{SMOL}: sha256 mismatch for {bad}: expected {DEFAULT_POOL[SMOL].sha256}")
    assert "specrouter pull smollm2-135m" in proc.stderr


def test_pool_model_not_pulled(tmp_path):
    expect_error(run("generate", "--prompt", "hi", "--chain", TARGET, "--cache-dir", str(tmp_path)),
                 f"model '{TARGET}' is not pulled yet: run `specrouter pull {TARGET}`")
