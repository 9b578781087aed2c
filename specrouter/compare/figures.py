"""A comparison's figures: each run (Timed), each prompt's runs with every method's tokens
per second, ratio to the reference and identity with it (PromptRuns), and the medians over
the prompts (MethodSummary); their lines and their JSON.

The reference is the first method (the target alone). It runs first and last on every
prompt; its two runs are pooled (their tokens over their seconds), and every output is
compared with its first run's (its own second run included: greedy, they must agree).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Timed:
    """One greedy generation: what it wrote, the chain it ran (auto: the one it ran most
    cycles), and its seconds on the comparison's clock."""

    label: str
    chain: str
    token_ids: tuple[int, ...]
    text: str
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return len(self.token_ids) / self.seconds if self.seconds > 0 else 0.0

    def line(self, width: int) -> str:
        return (f"{self.label:<{width}}  {len(self.token_ids):>4} tokens in {self.seconds:6.2f} s = "
                f"{self.tokens_per_second:6.1f} tokens/s   {self.chain}")


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first token index where two outputs differ (None: identical)."""
    if tuple(a) == tuple(b):
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@dataclass(frozen=True)
class PromptRuns:
    """One prompt's runs in the order they ran; `labels`: the methods in the order given,
    the reference first."""

    id: str
    prompt_tokens: int
    max_tokens: int
    labels: tuple[str, ...]
    runs: tuple[Timed, ...]

    @property
    def reference(self) -> str:
        return self.labels[0]

    def of(self, label: str) -> tuple[Timed, ...]:
        return tuple(r for r in self.runs if r.label == label)

    def tokens_per_second(self, label: str) -> float:
        """The method's runs pooled: their tokens over their seconds (0.0 without seconds)."""
        runs = self.of(label)
        seconds = sum(r.seconds for r in runs)
        return sum(len(r.token_ids) for r in runs) / seconds if seconds > 0 else 0.0

    def ratio(self, label: str) -> float | None:
        """The method's tokens per second over the reference's (None: the reference wrote none)."""
        reference = self.tokens_per_second(self.reference)
        return self.tokens_per_second(label) / reference if reference > 0 else None

    def first_difference(self, label: str) -> int | None:
        """Where the method's output (the reference's: its last run's) parts from the
        reference's first run's (None: identical)."""
        return first_difference(self.of(self.reference)[0].token_ids, self.of(label)[-1].token_ids)

    def lines(self) -> list[str]:
        """Every run in the order run, then each other method's ratio and identity, and a
        line for the reference only where its two runs differ."""
        width = max(len(label) for label in self.labels)
        out = [r.line(width) for r in self.runs]
        for label in self.labels[1:]:
            ratio = self.ratio(label)
            speed = f"{ratio:.2f}x the tokens per second" if ratio is not None else \
                "no ratio (the target alone wrote no token)"
            diff = self.first_difference(label)
            same = "yes" if diff is None else f"no, they part at token {diff}"
            out.append(f"{label} / {self.reference}: {speed}; outputs identical: {same}")
        diff = self.first_difference(self.reference)
        if diff is not None and len(self.of(self.reference)) > 1:
            out.append(f"{self.reference}: its two runs part at token {diff}")
        return out

    def as_dict(self) -> dict[str, Any]:
        methods = {}
        for label in self.labels:
            runs = self.of(label)
            methods[label] = {
                "chain": runs[0].chain, "tokens": len(runs[0].token_ids),
                "runs": [{"position": i, "tokens": len(r.token_ids), "seconds": r.seconds}
                         for i, r in enumerate(self.runs) if r.label == label],
                "tokens_per_second": self.tokens_per_second(label), "ratio": self.ratio(label),
                "identical": self.first_difference(label) is None, "first_difference": self.first_difference(label),
                "text": runs[0].text,
            }
        return {"id": self.id, "prompt_tokens": self.prompt_tokens, "max_tokens": self.max_tokens,
                "order": [r.label for r in self.runs], "methods": methods}


@dataclass(frozen=True)
class MethodSummary:
    """One method over every prompt: the medians of its tokens per second and of its ratio
    (over the prompts that have one; None: none has), and on how many prompts its output was
    the reference's."""

    label: str
    prompts: int
    median_tokens_per_second: float
    median_ratio: float | None
    identical: int

    def as_dict(self) -> dict[str, Any]:
        return {"median_tokens_per_second": self.median_tokens_per_second, "median_ratio": self.median_ratio,
                "identical_prompts": self.identical}


def summarize(results: Sequence[PromptRuns]) -> list[MethodSummary]:
    """Each method's summary over `results` (at least one, all of the same methods)."""
    out = []
    for label in results[0].labels:
        ratios = [r for r in (p.ratio(label) for p in results) if r is not None]
        out.append(MethodSummary(label, len(results), statistics.median(p.tokens_per_second(label) for p in results),
                                 statistics.median(ratios) if ratios else None,
                                 sum(p.first_difference(label) is None for p in results)))
    return out


def summary_lines(summaries: Sequence[MethodSummary]) -> list[str]:
    """A table: each method's median tokens per second, median ratio and identical prompts."""
    n = summaries[0].prompts
    title = f"median over {n} prompts"
    width = max(len(title), *(len(s.label) for s in summaries))
    reference = summaries[0].label
    out = [f"{title:<{width}}  {'tokens/s':>8}  {'/ ' + reference:>14}  identical"]
    for s in summaries:
        ratio = f"{s.median_ratio:.2f}x" if s.median_ratio is not None else "n/a"
        out.append(f"{s.label:<{width}}  {s.median_tokens_per_second:8.1f}  {ratio:>14}  {s.identical}/{n}")
    return out


def report_dict(target: str, results: Sequence[PromptRuns]) -> dict[str, Any]:
    """The whole comparison as one JSON object (the --json output; field names are stable)."""
    summaries = summarize(results)
    return {"target": target, "methods": list(results[0].labels), "prompts": [p.as_dict() for p in results],
            "summary": {"prompts": len(results), "methods": {s.label: s.as_dict() for s in summaries}}}
