"""Torch names and the converted-folder bookkeeping (no torch needed)."""

import json

import pytest

from specrouter.convert import MARKER, converted_dir, is_converted, split_torch_name, torch_names
from specrouter.errors import UnknownModelError
from specrouter.models import DEFAULT_POOL


def test_torch_names_parse_into_pool_model_and_dtype():
    assert split_torch_name("qwen2.5-coder-1.5b:torch-fp32") == ("qwen2.5-coder-1.5b", "float32")
    assert split_torch_name("qwen2.5-coder-0.5b:torch-bf16") == ("qwen2.5-coder-0.5b", "bfloat16")
    assert split_torch_name("qwen2.5-coder-0.5b:torch-fp16") == ("qwen2.5-coder-0.5b", "float16")
    assert split_torch_name("qwen2.5-coder-0.5b") is None
    assert split_torch_name("ngram") is None
    assert "qwen2.5-coder-1.5b:torch-fp32" in torch_names()
    with pytest.raises(UnknownModelError, match="unknown model variant 'torch-int4'"):
        split_torch_name("qwen2.5-coder-0.5b:torch-int4")
    with pytest.raises(UnknownModelError, match="unknown model 'llama'"):
        split_torch_name("llama:torch-fp32")


def test_a_folder_counts_as_converted_only_with_a_marker_for_the_pinned_gguf(tmp_path):
    name = "qwen2.5-coder-0.5b"
    folder = converted_dir(name, tmp_path)
    assert folder == tmp_path / "torch" / name
    assert not is_converted(name, tmp_path)
    folder.mkdir(parents=True)
    (folder / MARKER).write_text("{not json")
    assert not is_converted(name, tmp_path)
    (folder / MARKER).write_text(json.dumps({"source_sha256": "0" * 64}))
    assert not is_converted(name, tmp_path)  # made from another GGUF than the pool pins
    (folder / MARKER).write_text(json.dumps({"source_sha256": DEFAULT_POOL[name].sha256}))
    assert is_converted(name, tmp_path)
