"""Token texts and pieces of a transformers tokenizer, rendered as llama.cpp renders them.

`text` returns the vocabulary's stored string of a token (for a byte-level BPE such
as Qwen's, e.g. 'Ġthe'), which is what llama.cpp's `llama_vocab_get_text` returns for
the same tokenizer, so specrouter.vocab recognises a GGUF model and its torch
conversion as sharing a tokenizer. `piece` returns the bytes a token stands for, with
special (control) tokens rendering as b"" as llama.cpp renders them when asked without
special tokens; `eos_ids` are the tokens llama.cpp would treat as end of generation.
"""

from __future__ import annotations

import json
from typing import Any

#: Token texts that end generation besides the tokenizer's EOS. llama.cpp marks the
#: same tokens as end-of-generation by their text (its `llama_vocab_is_eog`; checked
#: on the Qwen2.5 GGUFs: ids 128247 '</s>', 151643, 151645, 151662-151664), so a
#: converted model stops where its GGUF original stops.
_EOG_TEXTS = (
    "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>",
    "<EOT>", "_<EOT>", "<｜end▁of▁sentence｜>", "<end_of_utterance>", "</s>",
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
)


def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: the printable stand-ins of byte-level BPE."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _is_byte_level(tokenizer: Any) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    try:
        spec = json.loads(backend.to_str())
    except Exception:  # noqa: BLE001 - any failure means: not recognisably byte-level
        return False
    return "ByteLevel" in json.dumps(spec.get("decoder")) or "ByteLevel" in json.dumps(spec.get("pre_tokenizer"))


class HFTokenTexts:
    """A tokenizer's texts and pieces (see the module docstring); the tokenizer's size must
    not exceed n_vocab, the model's logits row."""

    def __init__(self, tokenizer: Any, model: Any, n_vocab: int) -> None:
        self._tok = tokenizer
        self._n_tokens = len(tokenizer)
        self._byte_level = _is_byte_level(tokenizer)
        self._byte_dec = _byte_decoder() if self._byte_level else {}
        self._added = dict(getattr(tokenizer, "added_tokens_decoder", {}))
        self.eos_ids = self._eos_ids(model, n_vocab)

    def _eos_ids(self, model: Any, n_vocab: int) -> frozenset[int]:
        ids: set[int] = set()
        if self._tok.eos_token_id is not None:
            ids.add(int(self._tok.eos_token_id))
        gen = getattr(model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None) if gen is not None else None
        if eos is not None:
            ids.update([eos] if isinstance(eos, int) else eos)
        vocab = self._tok.get_vocab()
        ids.update(vocab[text] for text in _EOG_TEXTS if text in vocab)
        return frozenset(i for i in ids if 0 <= i < n_vocab)

    def text(self, token: int) -> bytes:
        """The vocabulary's stored text of a token (what tokenizers are compared by)."""
        text = self._tok.convert_ids_to_tokens(int(token))
        return text.encode("utf-8") if text is not None else b""

    def piece(self, token: int) -> bytes:
        """The bytes a token stands for, as llama.cpp renders it without special tokens."""
        if not 0 <= token < self._n_tokens:
            return b""
        if token in self.eos_ids:
            # llama.cpp turns every end-of-generation token into a control token (even a
            # plain-text one such as Qwen's '</s>', id 128247), and control tokens render as nothing.
            return b""
        added = self._added.get(token)
        if added is not None:
            # Control tokens render as nothing (llama.cpp without special rendering).
            return b"" if getattr(added, "special", False) else str(added).encode("utf-8")
        text = self._tok.convert_ids_to_tokens(token)
        if text is None or text == f"[PAD{token}]":
            # llama.cpp's GGUF converter pads vocabularies with unused '[PAD<id>]' entries
            # that render as nothing; a tokenizer made from such a GGUF keeps them as text.
            return b""
        if self._byte_level:
            try:
                return bytes(self._byte_dec[c] for c in text)
            except KeyError:
                return text.encode("utf-8")
        # SentencePiece-style vocabularies: '▁' is a space, <0xAB> a raw byte.
        if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            try:
                return bytes([int(text[3:5], 16)])
            except ValueError:
                pass
        return text.replace("▁", " ").encode("utf-8")
