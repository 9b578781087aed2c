"""The pulled pool files found where Ollama, the Hugging Face hub cache and LM Studio keep
models (fake folders of links to them), loaded by llama.cpp under their specs, and `auto`
choosing its drafts among them by tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specrouter.model_sources import OLLAMA_MODEL_LAYER
from specrouter.models import DEFAULT_POOL, model_path
from specrouter.pool import Pool
from specrouter.router import auto_router

from .conftest import SMALL, SMOL, TARGET, require_pulled

OLLAMA_SMALL = "ollama:qwen2.5-coder:0.5b"
HF_SMOL = "hf:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct.Q4_1.gguf"
LMSTUDIO_TARGET = "lmstudio:lmstudio-community/Qwen2.5-Coder-1.5B-Instruct-GGUF"


def link(path: Path, to: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(to)
    return path


@pytest.fixture
def found(tmp_path, monkeypatch) -> None:
    """The 0.5B pulled by Ollama, SmolLM2 in the hub cache, the 1.5B in LM Studio's folder."""
    require_pulled(SMALL, TARGET, SMOL)
    ollama, hub, lmstudio = tmp_path / "ollama", tmp_path / "hub", tmp_path / "lmstudio"
    digest = DEFAULT_POOL[SMALL].sha256
    link(ollama / "blobs" / f"sha256-{digest}", model_path(SMALL))
    manifest = ollama / "manifests/registry.ollama.ai/library/qwen2.5-coder/0.5b"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"layers": [{"mediaType": OLLAMA_MODEL_LAYER, "digest": f"sha256:{digest}"}]}))
    repo, commit = hub / "models--HuggingFaceTB--SmolLM2-135M-Instruct-GGUF", "a" * 40
    blob = link(repo / "blobs" / DEFAULT_POOL[SMOL].sha256, model_path(SMOL))
    link(repo / "snapshots" / commit / "SmolLM2-135M-Instruct.Q4_1.gguf", Path("../..", "blobs", blob.name))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    link(lmstudio / "lmstudio-community/Qwen2.5-Coder-1.5B-Instruct-GGUF/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf",
         model_path(TARGET))
    monkeypatch.setenv("OLLAMA_MODELS", str(ollama))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("LMSTUDIO_MODELS", str(lmstudio))


def test_a_found_model_loads_under_its_spec(found):
    pool = Pool(n_ctx=256, n_seq_max=1)
    try:
        small = pool.model(OLLAMA_SMALL)
        assert small.name == OLLAMA_SMALL and small.path.name == f"sha256-{DEFAULT_POOL[SMALL].sha256}"
        assert pool.model(SMALL) is small  # one file, one loaded model
        smol = pool.model(HF_SMOL)
        assert smol.name == HF_SMOL and smol.params_b < small.params_b
        assert small.detokenize(small.tokenize("def fib(n):", add_special=False)) == "def fib(n):"
    finally:
        pool.close()


def costs(tmp_path: Path, *names: str) -> Path:
    file = tmp_path / "profile.json"
    tables = {n: {"1": 0.01 * (i + 1), "8": 0.02 * (i + 1)} for i, n in enumerate(names)}
    file.write_text(json.dumps({"models": tables}))
    return file


def test_auto_drafts_with_the_found_models_that_share_the_targets_tokenizer(found, tmp_path):
    pool = Pool(n_ctx=256, n_seq_max=1)
    try:
        router = auto_router(pool, LMSTUDIO_TARGET, [HF_SMOL, OLLAMA_SMALL], profile_dir=tmp_path / "router",
                             progress=False, profile_file=costs(tmp_path, HF_SMOL, OLLAMA_SMALL, LMSTUDIO_TARGET))
        assert [m.name for m in router.drafts] == [OLLAMA_SMALL]
        assert router.message == f"left out of routing: {HF_SMOL} (another tokenizer)"
    finally:
        pool.close()


def test_auto_over_a_found_target_no_draft_shares_falls_back_to_it_alone(found, tmp_path):
    pool = Pool(n_ctx=256, n_seq_max=1)
    try:
        router = auto_router(pool, OLLAMA_SMALL, [HF_SMOL], profile_dir=tmp_path / "router", progress=False,
                             profile_file=costs(tmp_path, OLLAMA_SMALL))
        assert router.drafts == []
        assert router.message == (f"no draft model shares the tokenizer of {OLLAMA_SMALL} (left out: {HF_SMOL} "
                                  f"(another tokenizer)): falling back to {OLLAMA_SMALL} alone (and the n-gram "
                                  "drafter where it pays)")
    finally:
        pool.close()
