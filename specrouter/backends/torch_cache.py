"""The torch backend's KV caches: one transformers `DynamicCache` per sequence, cropped back
exactly, and several of them fed in one batched forward.

transformers 5.x changed `DynamicCache.crop`: it takes a *negative* count of tokens to drop
(the 4.x meaning, "keep the first n", raises). Layers that cannot be cropped exactly
(sliding-window or linear-attention caches) are refused at load time (check_croppable)
rather than rolled back approximately.
"""

from __future__ import annotations

from collections.abc import Callable
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


def forward_batch(model: Any, config: Any, caches: list[Any], runs: list[list[int]], device: torch.device,
                  rows: Callable[[torch.Tensor], Any], name: str) -> list:
    """Feed runs[i] to caches[i] in ONE forward of `model`; return every run's logits
    (len(run), n_vocab) as `rows` hands them out.

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
        logits = rows(out.logits)
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
