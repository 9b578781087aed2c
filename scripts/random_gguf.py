"""A GGUF file of random weights in the tensor layout of the default pool's Q4_K_M files, for
timing llama.cpp where the real files cannot be brought (the GPU check runs without network).

A forward's cost depends on shapes and tensor types, not on values, so the file takes both
from the pulled Qwen2.5-Coder files: the published shapes (torch_profile.SHAPES, qwen2 ones)
and the type llama.cpp's Q4_K_M quantization gave each tensor there (`layout`; the real-model
test tests/real/test_random_gguf_real.py compares it with the pulled files tensor by tensor).
Every quantized block is random bytes with its scales set so weights stay within a few
hundredths; norms are 1 and biases 0. The tokenizer (every `tokenizer.*` key) is copied
from another GGUF, e.g. the vocabulary-only Qwen2 file llama.cpp's source carries
(models/ggml-vocab-qwen2.gguf, 151,936 tokens as the pool's files have); its token count is
the embedding's row count.

    python scripts/random_gguf.py --vocab VOCAB.gguf --out FILE.gguf qwen2.5-coder-1.5b
    python scripts/random_gguf.py --vocab VOCAB.gguf --out FILE.gguf --tiny qwen2.5-coder-0.5b

--tiny: torch_profile.TINY's sizes (a CPU test). Needs numpy and the gguf package (the
project's pin, or the gguf-py of llama.cpp's source on PYTHONPATH: the same version).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # torch_profile, beside this script

import gguf  # noqa: E402
from torch_profile import SHAPES, TINY  # noqa: E402

#: llama.cpp's file type number of Q4_K_M (LLAMA_FTYPE_MOSTLY_Q4_K_M).
FILE_TYPE_Q4_K_M = 15
#: Elements per K-quant block: a row whose length is not a multiple falls back (FALLBACK).
K_BLOCK = 256
#: What llama.cpp's quantization writes instead of a K-quant for such a row.
FALLBACK = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}
#: (byte offset, value) of each float16 scale in a block of the type: weights of a few
#: hundredths at most, whatever the random bytes between them.
SCALES = {"Q8_0": ((0, 2**-11),), "Q5_0": ((0, 2**-8),), "Q4_K": ((0, 2**-14), (2, 2**-14)),
          "Q6_K": ((208, 2**-16),)}


@dataclass(frozen=True)
class Shape:
    """A qwen2 model's hyperparameters, as llama.cpp reads them."""

    hidden: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    context: int
    rope_theta: float
    rms_eps: float

    @classmethod
    def of(cls, name: str, tiny: bool = False) -> Shape:
        """torch_profile's shape of `name` (a qwen2 one), cut to TINY's sizes when `tiny`."""
        family, config = SHAPES[name]
        if family != "qwen2":
            raise ValueError(f"{name} is not a qwen2 shape")
        config = {**config, **(TINY if tiny else {})}
        heads = config["num_attention_heads"]
        return cls(config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"], heads,
                   config["num_key_value_heads"], config.get("head_dim", config["hidden_size"] // heads),
                   config["max_position_embeddings"], config["rope_parameters"]["rope_theta"], config["rms_norm_eps"])


@dataclass(frozen=True)
class Tensor:
    name: str
    type: str  # a GGMLQuantizationType name
    dims: tuple[int, ...]  # GGUF's order: the row length first


def _more_bits(position: int, n: int) -> bool:
    """llama.cpp's use_more_bits: which of n tensors Q4_K_M gives Q6_K, by position."""
    return position < n // 8 or position >= 7 * n // 8 or (position - n // 8) % 3 == 2


def more_bits_layers(n: int) -> set[int]:
    """The layers whose attn_v and ffn_down Q4_K_M made Q6_K in the pool's files: llama.cpp
    counts those tensors in the order it met them, which there is the layers' names sorted
    as text (blk.0, blk.1, blk.10, ...)."""
    return {layer for position, layer in enumerate(sorted(range(n), key=str)) if _more_bits(position, n)}


def _matrix(name: str, cols: int, rows: int, kind: str) -> Tensor:
    return Tensor(name, FALLBACK[kind] if cols % K_BLOCK else kind, (cols, rows))


def layout(shape: Shape, n_vocab: int) -> list[Tensor]:
    """Every tensor of a Q4_K_M qwen2 file of this shape: name, type and dimensions."""
    e, f, kv = shape.hidden, shape.ffn, shape.kv_heads * shape.head_dim
    more = more_bits_layers(shape.layers)
    tensors = [_matrix("token_embd.weight", e, n_vocab, "Q4_K"), Tensor("output_norm.weight", "F32", (e,)),
               _matrix("output.weight", e, n_vocab, "Q6_K")]
    for i in range(shape.layers):
        p, heavy = f"blk.{i}.", "Q6_K" if i in more else "Q4_K"
        tensors += [Tensor(p + "attn_norm.weight", "F32", (e,)),
                    _matrix(p + "attn_q.weight", e, e, "Q4_K"), Tensor(p + "attn_q.bias", "F32", (e,)),
                    _matrix(p + "attn_k.weight", e, kv, "Q4_K"), Tensor(p + "attn_k.bias", "F32", (kv,)),
                    _matrix(p + "attn_v.weight", e, kv, heavy), Tensor(p + "attn_v.bias", "F32", (kv,)),
                    _matrix(p + "attn_output.weight", e, e, "Q4_K"), Tensor(p + "ffn_norm.weight", "F32", (e,)),
                    _matrix(p + "ffn_gate.weight", e, f, "Q4_K"), _matrix(p + "ffn_up.weight", e, f, "Q4_K"),
                    _matrix(p + "ffn_down.weight", f, e, heavy)]
    return tensors


def _array_shape(tensor: Tensor) -> tuple[tuple[int, ...], np.dtype]:
    """The numpy shape and dtype of the tensor's data: float32 values, or a row's block bytes."""
    if tensor.type == "F32":
        return tensor.dims[::-1], np.dtype(np.float32)
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[tensor.type]]
    cols, *rows = tensor.dims
    return (*rows[::-1], cols // block * size), np.dtype(np.uint8)


def random_data(tensor: Tensor, rng: np.random.Generator) -> np.ndarray:
    shape, dtype = _array_shape(tensor)
    if tensor.type == "F32":
        return np.full(shape, 1.0 if tensor.name.endswith("norm.weight") else 0.0, dtype)
    size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[tensor.type]][1]
    blocks = rng.integers(0, 256, (int(np.prod(shape)) // size, size), dtype=np.uint8)
    for offset, scale in SCALES[tensor.type]:
        blocks[:, offset:offset + 2] = np.frombuffer(np.float16(scale).tobytes(), np.uint8)
    return blocks.reshape(shape)


def write(path: Path, name: str, shape: Shape, vocab: gguf.GGUFReader, seed: int = 0) -> list[Tensor]:
    """Write the model (through a .part file renamed at the end); returns its layout."""
    tokens = vocab.fields["tokenizer.ggml.tokens"]
    tensors = layout(shape, len(tokens.data))
    writer = gguf.GGUFWriter(None, "qwen2")
    writer.add_name(f"random weights, {name} shape")
    writer.add_block_count(shape.layers)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.rms_eps)
    writer.add_file_type(FILE_TYPE_Q4_K_M)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, field in vocab.fields.items():
        if key.startswith("tokenizer."):
            item = field.types[-1] if len(field.types) > 1 else None  # an array's item type
            writer.add_key_value(key, field.contents(), field.types[0], item)
    for tensor in tensors:
        array_shape, dtype = _array_shape(tensor)
        raw = None if tensor.type == "F32" else gguf.GGMLQuantizationType[tensor.type]
        writer.add_tensor_info(tensor.name, array_shape, dtype, int(np.prod(array_shape)) * dtype.itemsize, raw)
    part = path.with_name(path.name + ".part")
    writer.write_header_to_file(part)
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for tensor in tensors:
        writer.write_tensor_data(random_data(tensor, rng))
    writer.close()
    part.replace(path)
    return tensors


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", choices=[n for n, (family, _) in SHAPES.items() if family == "qwen2"])
    ap.add_argument("--vocab", type=Path, required=True, help="a GGUF whose tokenizer.* keys the file takes")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tiny", action="store_true", help="torch_profile.TINY's sizes (a CPU test)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    tensors = write(args.out, args.model, Shape.of(args.model, args.tiny), gguf.GGUFReader(args.vocab), args.seed)
    print(f"{args.out}: {len(tensors)} tensors, {args.out.stat().st_size / 2**20:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
