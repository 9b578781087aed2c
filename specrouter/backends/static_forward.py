"""One forward of a Llama-family decoder over a preallocated KV cache: the static runtime's
compute (torch_static.py holds the slots and buckets, torch_graphs.py replays it as CUDA graphs).

The transformers model supplies the weights and its modules (embedding, rotary embedding,
norms, projections, MLP, head); the attention and the cache are this module's, so that every
input is a tensor of fixed shape: a forward's shapes depend only on its bucket (rows B, tokens
N, context C, logit columns L), never on the sequences' lengths, and a bucket's forward can be
captured once and replayed (no host value decides a kernel's launch).

The cache of one layer is a tensor (slots + 1, n_ctx, kv_heads, head_dim); the last slot is
scratch, where padding writes. Row b of a forward writes its token j's keys and values at
(write_slot[b, j], write_pos[b, j]) and attends to the first C cells of slot read_slot[b],
key cell c visible to query j exactly when c <= positions[b, j]. A real row's cells at and
after its length hold stale values that this mask never shows: a query at position p sees
cells 0..p, all written by this sequence (cells < its own run by earlier calls, the others by
this call before the attention reads them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specrouter.errors import ModelFileError

#: transformers model types whose decoder layer this forward computes exactly (pre-norm,
#: rotary q/k, grouped-query attention, gated MLP; Qwen2's q/k/v biases live in the modules).
SUPPORTED = ("llama", "qwen2")


@dataclass
class Inputs:
    """One forward's inputs, every tensor on the model's device (a captured graph's static
    buffers have this shape)."""

    ids: torch.Tensor  # (B, N) int64 token ids; padding: any valid id
    positions: torch.Tensor  # (B, N) int64 absolute positions (RoPE and the mask)
    write_slot: torch.Tensor  # (B, N) int64 the slot each token's K/V goes to; padding: scratch
    write_pos: torch.Tensor  # (B, N) int64 the cell it goes to
    read_slot: torch.Tensor  # (B,) int64 the slot each row attends over
    logit_cols: torch.Tensor  # (B, L) int64 the columns whose logits are returned
    context: int  # C: cells attended per row (a bucket of the rows' longest context)


def check_supported(config: Any, name: str) -> None:
    """ModelFileError unless the static runtime computes this model's forward exactly."""
    kind = getattr(config, "model_type", None)
    if kind not in SUPPORTED:
        raise ModelFileError(f"{name}: the static torch runtime computes {', '.join(SUPPORTED)} models, not "
                             f"{kind!r}; use --torch-runtime eager")
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        raise ModelFileError(f"{name}: sliding-window attention is not in the static torch runtime; "
                             "use --torch-runtime eager")


def kv_shape(config: Any, slots: int, n_ctx: int) -> tuple[int, int, int, int]:
    """One layer's key (or value) cache: every slot plus the scratch one."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return (slots + 1, n_ctx, config.num_key_value_heads, head_dim)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + turned * sin


def _attention(layer: Any, h: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor, inp: Inputs, mask: torch.Tensor) -> torch.Tensor:
    attn = layer.self_attn
    b, n, _ = h.shape
    head_dim = keys.shape[-1]
    q = attn.q_proj(h).view(b, n, -1, head_dim)
    k = attn.k_proj(h).view(b, n, -1, head_dim)
    v = attn.v_proj(h).view(b, n, -1, head_dim)
    q = _rotate(q, cos, sin)
    k = _rotate(k, cos, sin)
    keys.index_put_((inp.write_slot, inp.write_pos), k)
    values.index_put_((inp.write_slot, inp.write_pos), v)
    ctx = inp.context
    past_k = keys[:, :ctx].index_select(0, inp.read_slot).transpose(1, 2)  # (B, kv_heads, C, D)
    past_v = values[:, :ctx].index_select(0, inp.read_slot).transpose(1, 2)
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), past_k, past_v, attn_mask=mask, scale=attn.scaling, enable_gqa=True)
    return attn.o_proj(out.transpose(1, 2).reshape(b, n, -1))


def forward(model: Any, keys: list[torch.Tensor], values: list[torch.Tensor], inp: Inputs) -> torch.Tensor:
    """Logits (B, L, vocab) in the model's dtype of the columns inp.logit_cols, each row's K/V
    written to its slot on the way (see the module docstring for the layout and the mask)."""
    body = model.model
    h = body.embed_tokens(inp.ids)
    cos, sin = body.rotary_emb(h, inp.positions)
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)  # (B, N, 1, D): broadcast over heads
    cells = torch.arange(inp.context, device=h.device)
    mask = (cells.view(1, 1, -1) <= inp.positions.unsqueeze(-1)).unsqueeze(1)  # (B, 1, N, C)
    for i, layer in enumerate(body.layers):
        h = h + _attention(layer, layer.input_layernorm(h), keys[i], values[i], cos, sin, inp, mask)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    picked = h.gather(1, inp.logit_cols.unsqueeze(-1).expand(-1, -1, h.shape[-1]))
    return model.lm_head(body.norm(picked))
