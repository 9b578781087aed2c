"""scripts/random_gguf.py's layout is the pulled Q4_K_M files' own: the same tensors, with the
same types and dimensions (what the GPU check times in their place)."""

import os

import pytest

from specrouter.models import is_pulled, model_path

from ..unit.test_gpu_llamacpp import script
from .conftest import SMALL, TARGET


@pytest.mark.parametrize("name", [SMALL, TARGET])
def test_the_random_layout_is_the_pulled_files(name):
    gguf = pytest.importorskip("gguf")
    if not is_pulled(name):
        message = f"{name} not pulled; run `specrouter pull`"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    random_gguf = script("random_gguf")
    reader = gguf.GGUFReader(model_path(name))
    pulled = {t.name: (t.tensor_type.name, tuple(int(d) for d in t.shape)) for t in reader.tensors}
    layout = random_gguf.layout(random_gguf.Shape.of(name), len(reader.fields["tokenizer.ggml.tokens"].data))
    assert {t.name: (t.type, t.dims) for t in layout} == pulled
    assert len(layout) == len(pulled)
    shape = random_gguf.Shape.of(name)
    assert [reader.fields[f"qwen2.{key}"].contents() for key in ("block_count", "embedding_length",
                                                                  "feed_forward_length", "attention.head_count",
                                                                  "attention.head_count_kv", "context_length")] == \
        [shape.layers, shape.hidden, shape.ffn, shape.heads, shape.kv_heads, shape.context]
