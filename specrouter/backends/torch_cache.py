"""The torch backend's eager runtime (kv_runtime.py): one transformers `DynamicCache` per
sequence, cropped back exactly, and several of them fed in one batched forward.

transformers 5.x changed `DynamicCache.crop`: it takes a *negative* count of tokens to drop
(the 4.x meaning, "keep the first n", raises). Layers that cannot be cropped exactly
(sliding-window or linear-attention caches) are refused at load time (check_croppable)
rather than rolled back approximately.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from specrouter.errors import BackendError, ModelFileError


def new_cache(config: Any) -> Any:
    from transformers import DynamicCache

    return DynamicCache(config=config)


def check_croppable(config: Any, name: str) -> None:
    """ModelFileError unless every layer of the model's cache can be rolled back exactly."""
    cache = new_cache(config)
    bad = {type(layer).__name__ for layer in getattr(cache, "layers", [])
           if getattr(layer, "is_sliding", False) or not getattr(layer, "is_croppable", True)}
    if bad:
        raise ModelFileError(
            f"{name}: its KV cache layers ({', '.join(sorted(bad))}) cannot be rolled back exactly "
            "(sliding-window or recurrent attention); speculative decoding needs exact rollback"
        )


def truncate(cache: Any, length: int) -> None:
    """Crop every layer back to `length` positions (a failed forward may leave some longer)."""
    for layer in cache.layers:
        extra = layer.get_seq_length() - length
        if extra > 0:
            layer.crop(-extra)


class DynamicKV:
    """The eager runtime: a DynamicCache per sequence (kv_runtime.KVRuntime)."""

    name = "eager"
    graphs = None

    def __init__(self, model: Any, config: Any, device: torch.device, slots: int, label: str) -> None:
        self._model, self._config, self._device, self._label = model, config, device, label
        self._slots = slots
        self._caches: dict[int, Any] = {}
        self._free = list(range(slots))

    def new(self) -> int:
        if not self._free:
            raise BackendError(f"{self._label}: all {self._slots} sequence slots are in use")
        seq = self._free.pop(0)
        self._caches[seq] = new_cache(self._config)
        return seq

    def free(self, seq: int) -> None:
        self._caches.pop(seq, None)
        if seq not in self._free and 0 <= seq < self._slots:
            self._free.append(seq)

    def _cache(self, seq: int) -> Any:
        try:
            return self._caches[seq]
        except KeyError:
            raise BackendError(f"{self._label}: sequence {seq} does not exist") from None

    def length(self, seq: int) -> int:
        return int(self._cache(seq).get_seq_length())

    def crop(self, seq: int, length: int) -> None:
        cache = self._cache(seq)
        if length <= 0:
            self._caches[seq] = new_cache(self._config)
        else:
            truncate(cache, length)

    def share(self, src: int, dst: int, n: int) -> None:
        cache = copy.deepcopy(self._cache(src))  # a DynamicCache's tensors are its own
        truncate(cache, n)
        self._caches[dst] = cache

    def forward(self, runs: Sequence[tuple[int, Sequence[int], int, int]]) -> list:
        if len(runs) == 1:
            seq, tokens, pos, n_logits = runs[0]
            return [self._one(self._cache(seq), tokens, pos, n_logits)]
        rows = forward_batch(self._model, self._config, [self._cache(seq) for seq, *_ in runs],
                             [list(t) for _, t, _, _ in runs], self._device, self._label)
        return [r[len(r) - n:] if n else None for r, (*_, n) in zip(rows, runs)]

    def _one(self, cache: Any, tokens: Sequence[int], pos: int, n_logits: int) -> torch.Tensor | None:
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=self._device)
        positions = torch.arange(pos, pos + len(tokens), device=self._device).unsqueeze(0)
        try:
            with torch.inference_mode():
                out = self._model(input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=True,
                                  logits_to_keep=max(n_logits, 1))
        except torch.cuda.OutOfMemoryError:
            raise BackendError(f"{self._label}: out of GPU memory decoding {len(tokens)} tokens at {pos}") from None
        return out.logits[0, -n_logits:] if n_logits else None

    def close(self) -> None:
        self._caches.clear()


def forward_batch(model: Any, config: Any, caches: list[Any], runs: list[list[int]], device: torch.device,
                  name: str) -> list:
    """Feed runs[i] to caches[i] in ONE forward of `model`; return every run's logits
    (len(run), n_vocab) on the device.

    Layout, the usual one of batched generation with a cache: row i holds its past
    (p_i positions) left-padded to the longest past P, then its run right-padded to the
    longest run N. The 2-D attention mask is 1 exactly on the real columns
    [P - p_i, P + n_i), so padding is never attended to; the causal part compares
    column indices, which is right for every row because all runs start at column P.
    Position ids are each row's own absolute positions p_i + j (RoPE sees no padding).
    Each row's query j >= n_i is padding whose output is dropped; it still attends to
    column P (its first real token), so no row of the mask is empty (no NaN)."""
    past = [cache.get_seq_length() for cache in caches]
    lens = [len(run) for run in runs]
    b, p_max, n_max = len(runs), max(past), max(lens)
    ids = torch.zeros(b, n_max, dtype=torch.long)
    mask = torch.zeros(b, p_max + n_max, dtype=torch.long)
    for i, (run, p, n) in enumerate(zip(runs, past, lens)):
        ids[i, :n] = torch.tensor(run)
        mask[i, p_max - p : p_max + n] = 1
    positions = torch.tensor(past).unsqueeze(1) + torch.arange(n_max)
    with torch.inference_mode():
        batched = _gather(config, caches, past, p_max)
        try:
            out = model(
                input_ids=ids.to(device), attention_mask=mask.to(device),
                position_ids=positions.to(device), past_key_values=batched, use_cache=True,
                logits_to_keep=n_max,
            )
        except torch.cuda.OutOfMemoryError:
            raise BackendError(f"{name}: out of GPU memory decoding {sum(lens)} tokens of {b} sequences") from None
        logits = out.logits
        del out
        # Write back each row's real span (own past + own run, no padding) as the
        # sequence's cache, copied out so the padded tensors are freed layer by layer.
        for li, layer in enumerate(batched.layers):
            for i, (cache, p, n) in enumerate(zip(caches, past, lens)):
                keys = layer.keys[i : i + 1, :, p_max - p : p_max + n].clone()
                values = layer.values[i : i + 1, :, p_max - p : p_max + n].clone()
                own = cache.layers[li]
                if not own.is_initialized:
                    own.lazy_initialization(keys, values)
                own.keys, own.values = keys, values
            layer.keys = layer.values = None
    return [logits[i, :n] for i, n in enumerate(lens)]


def _gather(config: Any, caches: list[Any], past: list[int], p_max: int) -> Any:
    """A new DynamicCache holding every sequence's past as one row, left-padded with
    zeros to p_max (a copy: the sequences keep their own caches until the write-back)."""
    batched = new_cache(config)
    if p_max == 0:
        return batched
    for li, layer in enumerate(batched.layers):
        like = next(c.layers[li].keys for c, p in zip(caches, past) if p)
        keys = like.new_zeros(len(caches), like.shape[1], p_max, like.shape[3])
        values = keys.clone()
        for i, (cache, p) in enumerate(zip(caches, past)):
            if p:
                keys[i, :, p_max - p :] = cache.layers[li].keys[0]
                values[i, :, p_max - p :] = cache.layers[li].values[0]
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
    return batched
