"""The row operations (contract.py) on torch tensors, on the rows' own device.

Every contract is contract.py's, with the numpy implementation as the reference: warping
follows rows_numpy.warp step by step (the max shift, temperature, min-p, top-k, the
exponentials in float32 for float32 logits, normalisation in float64, top-p with HF's
rule and a stable sort), sampling is inverse-CDF with the host's uniform, and the
residual is norm(max(p - q, 0)) with the same padded-vocabulary rule. What differs is
only where the arithmetic runs and its rounding (torch's exp and cumulative sums against
numpy's; a sample can move across a CDF boundary by a few 1e-16) and the tie rule of top-k
at the k-th value (torch.topk's order against numpy's argpartition: each level applies its
own rule to its own rows, so the target's distribution stays well defined).

Each operation returns to the host only what the caller needs as a Python value (token
ids, probabilities, an overlap), in one transfer per call: a verification of k proposals
moves its k acceptance probabilities together, not one per position. `register_tensors()`
hands torch.Tensor to rows.py (the torch backend calls it when imported).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from specrouter.ops import rows as _rows
from specrouter.ops.contract import FLOAT32_MAX_INVERSE_TEMPERATURE, TOP_P_MARGIN, WarpParams


def _block(rows: Any) -> torch.Tensor:
    """rows as one 2-D tensor (a view when they are one already)."""
    if isinstance(rows, torch.Tensor):
        return rows if rows.dim() == 2 else rows.unsqueeze(0)
    return torch.stack(list(rows))


def _like(x: Any, ref: torch.Tensor) -> torch.Tensor:
    """x (a tensor or a numpy row) as a float64 tensor on ref's device."""
    return torch.as_tensor(x).to(device=ref.device, dtype=torch.float64)


def _pad(v: torch.Tensor, n: int) -> torch.Tensor:
    v = v.to(torch.float64)
    return v if v.shape[-1] == n else torch.nn.functional.pad(v, (0, n - v.shape[-1]))


class TorchOps:
    @torch.inference_mode()
    def argmax(self, rows: Any) -> list[int]:
        return _block(rows).argmax(dim=-1).tolist()

    @torch.inference_mode()
    def warp(self, rows: Any, params: WarpParams) -> list:
        x = _block(rows)
        if x.dtype in (torch.float16, torch.bfloat16):
            x = x.float()  # what the host path reads (the backend widens them exactly)
        if params.greedy:
            probs = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
            probs.scatter_(-1, x.argmax(dim=-1, keepdim=True), 1.0)
            return list(probs)
        inverse = 1.0 / params.temperature
        dtype = torch.float32 if x.dtype == torch.float32 and inverse < FLOAT32_MAX_INVERSE_TEMPERATURE else torch.float64
        scaled = x.to(dtype, copy=True)  # the caller's logits stay as they are
        scaled -= scaled.max(dim=-1, keepdim=True).values
        if inverse != 1.0:
            scaled *= inverse
        if math.isinf(inverse):  # 0 * inf at the maximum
            scaled[torch.isnan(scaled)] = 0.0
        if params.min_p > 0:
            scaled[scaled < math.log(params.min_p)] = -math.inf
        vocab = scaled.shape[-1]
        if params.top_k and params.top_k < vocab:
            keep = scaled.topk(params.top_k, dim=-1).indices
            masked = torch.full_like(scaled, -math.inf)
            scaled = masked.scatter_(-1, keep, scaled.gather(-1, keep))
        scaled.exp_()
        probs = scaled.to(torch.float64)
        probs /= probs.sum(dim=-1, keepdim=True)
        if params.top_p < 1.0:
            probs = _top_p_filter(probs, params.top_p)
        return list(probs)

    @torch.inference_mode()
    def sample(self, probs: torch.Tensor, u: float) -> int:
        cdf = probs.to(torch.float64).cumsum(dim=0)
        i = int(torch.searchsorted(cdf, cdf[-1:] * u, right=True).item())
        if i >= probs.shape[0]:  # u * total rounded up to the total: the last token with mass
            i = int(torch.nonzero(probs)[-1].item())
        return i

    @torch.inference_mode()
    def at(self, rows: Any, tokens: Sequence[int]) -> list[float]:
        rows = list(rows)
        if not rows:
            return []
        inside = [t < row.shape[0] for row, t in zip(rows, tokens)]
        picked = torch.stack([row[t if ok else 0] for row, t, ok in zip(rows, tokens, inside)])
        return [v if ok else 0.0 for v, ok in zip(picked.double().tolist(), inside)]

    @torch.inference_mode()
    def residual(self, p: torch.Tensor, q: Any | None, token: int) -> torch.Tensor:
        if q is None:
            n = p.shape[0]
            r = p.to(torch.float64, copy=True)
            if token < n:
                r[token] = 0.0
        else:
            q = _like(q, p)
            n = max(p.shape[0], q.shape[0])
            r = (_pad(p, n) - _pad(q, n)).clamp_(min=0.0)
        total = r.sum()
        # total 0 only through rounding when p == q, where rejection has probability 0 (as numpy's).
        return torch.where(total > 0, r / total, _pad(p, n))

    @torch.inference_mode()
    def overlap(self, ps: Any, qs: Any) -> list[float]:
        sums = []
        for p, q in zip(ps, qs):
            q = _like(q, p)
            n = min(p.shape[0], q.shape[0])
            sums.append(torch.minimum(p[:n].to(torch.float64), q[:n]).sum())
        return torch.stack(sums).tolist() if sums else []

    @torch.inference_mode()
    def confidence(self, row: torch.Tensor) -> float:
        return float((1.0 / torch.exp(row - row.max()).sum()).item())

    @torch.inference_mode()
    def host(self, rows: Any) -> np.ndarray:
        return (rows if isinstance(rows, torch.Tensor) else torch.stack(list(rows))).cpu().numpy()

    @torch.inference_mode()
    def one_hot(self, rows: Any, tokens: Sequence[int], values: Sequence[float]) -> torch.Tensor:
        """One transfer to the rows' device: the tokens and values together, in float64 (which
        holds every token id exactly)."""
        out = torch.zeros_like(rows)
        packed = torch.tensor([list(tokens), list(values)], dtype=torch.float64).to(rows.device)
        return out.scatter_(1, packed[0].long().unsqueeze(1), packed[1].to(rows.dtype).unsqueeze(1))


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Per row, keep the smallest set of most likely tokens whose mass reaches top_p (ties in
    index order, as rows_numpy._top_p_filter's stable sort)."""
    ranked, order = probs.sort(dim=-1, descending=True, stable=True)
    cumulative = ranked.cumsum(dim=-1)
    cut = (cumulative < top_p - TOP_P_MARGIN).sum(dim=-1, keepdim=True) + 1
    kept = torch.arange(probs.shape[-1], device=probs.device) < cut
    out = torch.zeros_like(probs).scatter_(-1, order, ranked * kept)
    return out / out.sum(dim=-1, keepdim=True)


def register_tensors() -> None:
    """From now on rows.ops_of gives TorchOps for tensors."""
    _rows.register(torch.Tensor, TorchOps())
