"""Exponential averages of timings, shared by the engine's and the router's clocks."""

from __future__ import annotations


def ema(old: float | None, x: float, alpha: float) -> float:
    """An exponential average of timings: x itself first, then alpha of each new one."""
    return x if old is None else old + alpha * (x - old)
